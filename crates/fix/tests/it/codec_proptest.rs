//! Property tests for the decoder and the session's inbound path: arbitrary
//! and mutated input never panics, and encoding then decoding gives back the
//! fields that were encoded.

use std::sync::Arc;

use bourse_fix::codec::{
    decode, decode_reusing, recycle_fields, FrameBuffer, OutMessage, RawMessage,
    MESSAGE_SIZE_MAX_BYTES_DEFAULT,
};
use bourse_fix::session::{Application, Inbound, Role, Session, SessionConfig};
use bourse_fix::store::MemoryStore;
use bourse_fix::tags::{self, BusinessRejectReason, Tag};
use bourse_fix::testing::small_dictionary;
use bourse_fix::time::format_utc_timestamp_ms;
use bourse_fix::Dictionary;
use bourse_fix::Structure;
use proptest::prelude::*;

const NOW_MS: i64 = 1_700_000_000_000;

struct Sink;

impl Application for Sink {
    fn on_app_message(
        &mut self,
        _m: &Inbound<'_>,
        _r: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason> {
        Ok(())
    }
}

/// Decodes, structures and validates whatever frames `bytes` holds; decoding and structuring
/// into the previous frame's field table and structure, as the session does, must give what
/// fresh ones give.
fn exercise_decoder(dictionary: &Dictionary, bytes: &[u8], chunk: usize) {
    let _ = decode(bytes, Some(dictionary), MESSAGE_SIZE_MAX_BYTES_DEFAULT);
    let _ = decode(bytes, None, MESSAGE_SIZE_MAX_BYTES_DEFAULT);
    let mut frames = FrameBuffer::new(4096);
    let mut spare_fields = Vec::new();
    let mut spare_structure = Structure::default();
    for piece in bytes.chunks(chunk.max(1)) {
        frames.push(piece);
        loop {
            match frames.next_frame() {
                Ok(Some(frame)) => {
                    let fresh = decode(&frame, Some(dictionary), 4096);
                    let reused = decode_reusing(
                        &frame,
                        Some(dictionary),
                        4096,
                        recycle_fields(std::mem::take(&mut spare_fields)),
                    );
                    assert_eq!(
                        fresh.as_ref().map(|r| &r.fields),
                        reused.as_ref().map(|r| &r.fields)
                    );
                    if let Ok(raw) = fresh {
                        let structure = dictionary.structure(&raw);
                        let structured = dictionary.structure_into(&raw, &mut spare_structure);
                        assert_eq!(
                            structure.as_ref().map(|_| ()).map_err(Clone::clone),
                            structured
                        );
                        if let Ok(structure) = structure {
                            assert_eq!(structure, spare_structure);
                            assert_validations_agree(dictionary, &raw, &structure);
                        }
                    }
                    if let Ok(raw) = reused {
                        spare_fields = recycle_fields(raw.fields);
                    }
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
    }
}

/// The validator with its one-pass plan gives what the generic validator gives, reject reason
/// and RefTagID included, and the plan accepts only what the generic validator accepts.
fn assert_validations_agree(dictionary: &Dictionary, raw: &RawMessage<'_>, structure: &Structure) {
    let generic = dictionary.validate_generic(raw, structure);
    assert_eq!(dictionary.validate(raw, structure), generic);
    if dictionary.plan_accepts(raw, structure) {
        assert_eq!(
            generic,
            Ok(()),
            "the plan accepted what the generic validator rejects"
        );
    }
}

/// Decodes and structures one frame; validates it both ways; returns whether the plan took it.
fn validate_both_ways(dictionary: &Dictionary, frame: &[u8]) -> bool {
    let Ok(raw) = decode(frame, Some(dictionary), MESSAGE_SIZE_MAX_BYTES_DEFAULT) else {
        return false;
    };
    let Ok(structure) = dictionary.structure(&raw) else {
        return false;
    };
    assert_validations_agree(dictionary, &raw, &structure);
    dictionary.plan_accepts(&raw, &structure)
}

/// A NewOrderSingle without the Parties group (so the plan applies), with `fields` after
/// the required ones.
fn flat_order_bytes(seq: u64, fields: &[(Tag, Vec<u8>)]) -> Vec<u8> {
    let mut order = OutMessage::new("D");
    order
        .set_header(tags::SENDER_COMP_ID, "TW")
        .set_header(tags::TARGET_COMP_ID, "ISLD");
    order.set_header(tags::MSG_SEQ_NUM, seq.to_string());
    order.set_header(tags::SENDING_TIME, format_utc_timestamp_ms(NOW_MS));
    order.push(11, "id").push(54, "1").push(55, "ABC");
    for (tag, value) in fields {
        order.push(*tag, value);
    }
    order.encode("FIX.4.4")
}

/// Tags the small dictionary knows, with the header's and trailer's, the group's and a few it
/// does not know: a random pick of them makes messages the plan accepts and messages it must
/// leave to the generic validator in about equal measure.
fn near_tag() -> impl Strategy<Value = Tag> {
    prop_oneof![
        Just(38),
        Just(43),
        Just(97),
        Just(122),
        Just(58),
        Just(54),
        Just(55),
        Just(11),
        Just(448),
        Just(452),
        Just(453),
        Just(108),
        Just(34),
        Just(52),
        Just(6000),
        Just(1500),
    ]
}

/// Values that are well formed for some of those tags and not for others.
fn near_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"1".to_vec()),
        Just(b"2".to_vec()),
        Just(b"Y".to_vec()),
        Just(b"10.5".to_vec()),
        Just(b"20231114-22:13:20.000".to_vec()),
        Just(b"x".to_vec()),
        plain_value(),
    ]
}

fn logon_bytes() -> Vec<u8> {
    let mut logon = OutMessage::new("A");
    logon.push(98, "0").push(108, "30");
    logon
        .set_header(tags::SENDER_COMP_ID, "TW")
        .set_header(tags::TARGET_COMP_ID, "ISLD");
    logon.set_header(tags::MSG_SEQ_NUM, "1");
    logon.set_header(tags::SENDING_TIME, format_utc_timestamp_ms(NOW_MS));
    logon.encode("FIX.4.4")
}

fn order_bytes(seq: u64, fields: &[(Tag, Vec<u8>)]) -> Vec<u8> {
    let mut order = OutMessage::new("D");
    order
        .set_header(tags::SENDER_COMP_ID, "TW")
        .set_header(tags::TARGET_COMP_ID, "ISLD");
    order.set_header(tags::MSG_SEQ_NUM, seq.to_string());
    order.set_header(tags::SENDING_TIME, format_utc_timestamp_ms(NOW_MS));
    order
        .push(11, "id")
        .push(453, "1")
        .push(448, "p")
        .push(54, "1")
        .push(55, "ABC");
    for (tag, value) in fields {
        order.push(*tag, value);
    }
    order.encode("FIX.4.4")
}

/// Tags for generated fields: anything but the envelope and the fields the
/// decoder treats as length-prefixed data, whose values must be numeric.
fn plain_tag() -> impl Strategy<Value = Tag> {
    (1..10_000i32).prop_filter("not envelope or data-length tags", |t| {
        ![
            8, 9, 10, 35, 89, 90, 91, 93, 95, 96, 212, 213, 348, 349, 350, 351, 352, 353, 354, 355,
            356, 357, 358, 359, 360, 361, 362, 363, 364, 365, 445, 446, 618, 619, 621, 622,
        ]
        .contains(t)
    })
}

fn plain_value() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0x20u8..0x7f, 1..24)
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (
            any::<usize>(),
            prop_oneof![Just(1u8), Just(b'='), any::<u8>()]
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutations: &[Mutation]) {
    for m in mutations {
        if bytes.is_empty() {
            return;
        }
        match *m {
            Mutation::Flip(i, b) => {
                let n = bytes.len();
                bytes[i % n] ^= b | 1;
            }
            Mutation::Insert(i, b) => {
                let n = bytes.len();
                bytes.insert(i % (n + 1), b);
            }
            Mutation::Delete(i) => {
                let n = bytes.len();
                bytes.remove(i % n);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048), chunk in 1usize..64) {
        let dictionary = small_dictionary();
        exercise_decoder(&dictionary, &bytes, chunk);
        let mut prefixed = b"8=FIX.4.4\x019=".to_vec();
        prefixed.extend_from_slice(&bytes);
        exercise_decoder(&dictionary, &prefixed, chunk);
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        extra in proptest::collection::vec((plain_tag(), plain_value()), 0..8),
        mutations in proptest::collection::vec(mutation(), 1..6),
        chunk in 1usize..128,
    ) {
        let dictionary = small_dictionary();
        let mut bytes = order_bytes(2, &extra);
        apply(&mut bytes, &mutations);
        exercise_decoder(&dictionary, &bytes, chunk);

        // The whole inbound path of a logged-on acceptor.
        let config = SessionConfig::new("FIX.4.4", "ISLD", "TW", Role::Acceptor);
        let mut session = Session::new(config, Arc::new(dictionary), Box::new(MemoryStore::default()));
        let mut app = Sink;
        session.on_connect(NOW_MS);
        session.on_bytes(NOW_MS, &logon_bytes(), &mut app);
        prop_assert!(session.is_logged_on());
        for piece in bytes.chunks(chunk) {
            session.on_bytes(NOW_MS, piece, &mut app);
        }
        session.on_tick(NOW_MS + 1000, &mut app);
        prop_assert!(session.next_target_seq_num() >= 2);
        while session.poll_action().is_some() {}
    }

    #[test]
    fn encode_then_decode_round_trips(
        header in proptest::collection::btree_map(
            prop_oneof![Just(34), Just(49), Just(50), Just(52), Just(56), Just(57), Just(115), Just(128)],
            plain_value(), 0..6),
        body in proptest::collection::vec((plain_tag(), plain_value()), 0..16),
        msg_type in "[0-9A-Za-z]{1,2}",
    ) {
        let mut m = OutMessage::new(&msg_type);
        for (tag, value) in &header {
            m.set_header(*tag, value);
        }
        for (tag, value) in &body {
            m.push(*tag, value);
        }
        let bytes = m.encode("FIX.4.4");
        let raw = decode(&bytes, None, usize::MAX).expect("what we encode decodes");
        let mut expected: Vec<(Tag, Vec<u8>)> = vec![(8, b"FIX.4.4".to_vec())];
        expected.push((9, raw.fields[1].value.to_vec()));
        expected.push((35, msg_type.as_bytes().to_vec()));
        expected.extend(header.iter().map(|(t, v)| (*t, v.clone())));
        expected.extend(body.iter().cloned());
        let decoded: Vec<(Tag, Vec<u8>)> = raw.fields.iter().map(|f| (f.tag, f.value.to_vec())).collect();
        prop_assert_eq!(&decoded[..decoded.len() - 1], &expected[..]);
        prop_assert_eq!(decoded.last().map(|f| f.0), Some(10));
        // Framing the same bytes, split anywhere, yields the same frame.
        let mut frames = FrameBuffer::new(MESSAGE_SIZE_MAX_BYTES_DEFAULT);
        let cut = bytes.len() / 2;
        frames.push(&bytes[..cut]);
        prop_assert_eq!(frames.next_frame().expect("within limit"), None);
        frames.push(&bytes[cut..]);
        prop_assert_eq!(frames.next_frame().expect("within limit"), Some(bytes.clone()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Near-valid orders, some mutated byte by byte: the one-pass plan rejects exactly what the
    /// generic validator rejects, with the same reason and RefTagID.
    #[test]
    fn the_validation_plan_rejects_what_the_generic_validator_rejects(
        extra in proptest::collection::vec((near_tag(), near_value()), 0..5),
        mutations in proptest::collection::vec(mutation(), 0..3),
        options in (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
    ) {
        let mut dictionary = small_dictionary();
        (
            dictionary.options.check_fields_out_of_order,
            dictionary.options.check_fields_have_values,
            dictionary.options.check_user_defined_fields,
            dictionary.options.allow_unknown_message_fields,
        ) = options;
        let mut bytes = flat_order_bytes(2, &extra);
        apply(&mut bytes, &mutations);
        validate_both_ways(&dictionary, &bytes);
    }
}

#[test]
fn the_validation_plan_accepts_a_plain_order_and_leaves_groups_to_the_generic_validator() {
    let dictionary = small_dictionary();
    assert!(validate_both_ways(
        &dictionary,
        &flat_order_bytes(2, &[(38, b"10".to_vec())])
    ));
    assert!(!validate_both_ways(&dictionary, &order_bytes(2, &[])));
    // A missing required field, a repeat, an empty value: each left to the generic validator.
    let mut no_symbol = OutMessage::new("D");
    no_symbol
        .set_header(tags::SENDER_COMP_ID, "TW")
        .set_header(tags::TARGET_COMP_ID, "ISLD");
    no_symbol.set_header(tags::MSG_SEQ_NUM, "2");
    no_symbol.set_header(tags::SENDING_TIME, format_utc_timestamp_ms(NOW_MS));
    no_symbol.push(11, "id").push(54, "1");
    assert!(!validate_both_ways(
        &dictionary,
        &no_symbol.encode("FIX.4.4")
    ));
    assert!(!validate_both_ways(
        &dictionary,
        &flat_order_bytes(2, &[(54, b"2".to_vec())])
    ));
    assert!(!validate_both_ways(
        &dictionary,
        &flat_order_bytes(2, &[(38, Vec::new())])
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Many messages pushed in arbitrary pieces, with garbage between some,
    /// come out as the same frames in the same order.
    #[test]
    fn stream_of_messages_frames_back(
        bodies in proptest::collection::vec(proptest::collection::vec((plain_tag(), plain_value()), 0..6), 1..40),
        garbage in proptest::collection::vec(proptest::collection::vec(0x20u8..0x7f, 0..8), 40),
        chunk in 1usize..300,
    ) {
        let mut stream = Vec::new();
        let mut expected = Vec::new();
        for (i, body) in bodies.iter().enumerate() {
            let mut m = OutMessage::new("0");
            for (tag, value) in body {
                m.push(*tag, value);
            }
            let bytes = m.encode("FIX.4.4");
            // Garbage without "8=" cannot be mistaken for a message start.
            let junk: Vec<u8> = garbage[i].iter().copied().filter(|&b| b != b'8').collect();
            stream.extend_from_slice(&junk);
            stream.extend_from_slice(&bytes);
            expected.push(bytes);
        }
        let mut frames = FrameBuffer::new(MESSAGE_SIZE_MAX_BYTES_DEFAULT);
        let mut got = Vec::new();
        for piece in stream.chunks(chunk) {
            frames.push(piece);
            while let Some(frame) = frames.next_frame().expect("within limit") {
                got.push(frame);
            }
        }
        prop_assert_eq!(got, expected);
        prop_assert_eq!(frames.buffered_bytes(), 0);
    }
}
