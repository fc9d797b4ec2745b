//! Property tests: no input makes a decoder panic. Arbitrary bytes and mutated valid frames and
//! packets go through every decoder; each must return a typed result, and every accessor of a
//! message that decodes successfully must be readable.

use bourse_wire::frame::{Encoding, FrameReader, FRAME_HEADER_BYTES};
use bourse_wire::market_data::{self, PacketParser, ReplayFrame, ReplayFrameDecoder};
use bourse_wire::order_entry::{self, FrameDecoder};
use bourse_wire::Error;
use proptest::prelude::*;

/// One SBE message with a zeroed root block and the given (block length, count) groups,
/// every group entry zeroed too.
fn raw_message(
    schema_id: u16,
    template_id: u16,
    block_length: u16,
    groups: &[(u16, u8)],
) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [block_length, template_id, schema_id, 1] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.resize(out.len() + usize::from(block_length), 0);
    for &(group_block_length, count) in groups {
        out.extend_from_slice(&group_block_length.to_le_bytes());
        out.push(count);
        out.resize(
            out.len() + usize::from(group_block_length) * usize::from(count),
            0,
        );
    }
    out
}

fn frame(encoding: Encoding, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&((FRAME_HEADER_BYTES + payload.len()) as u16).to_le_bytes());
    out.extend_from_slice(&(encoding as u16).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A valid frame for every order entry template.
fn order_entry_corpus() -> Vec<Vec<u8>> {
    order_entry::TemplateId::ALL
        .iter()
        .map(|&t| {
            frame(
                Encoding::SbeMessage,
                &raw_message(1, t as u16, t.block_length(), &[]),
            )
        })
        .collect()
}

/// Group shapes of the market data templates that have one (block length, a count).
fn md_groups(t: market_data::TemplateId) -> Vec<(u16, u8)> {
    use market_data::TemplateId::*;
    match t {
        BestPrices => vec![(36, 3)],
        OrderBookSnapshot => vec![(33, 4)],
        AggregatedBook => vec![(22, 5)],
        _ => vec![],
    }
}

/// Valid packets: one incremental packet and one snapshot packet holding every template.
fn market_data_corpus() -> Vec<Vec<u8>> {
    let mut body = Vec::new();
    for &t in market_data::TemplateId::ALL {
        body.extend(raw_message(2, t as u16, t.block_length(), &md_groups(t)));
    }
    let mut packets = Vec::new();
    for incremental in [false, true] {
        let mut p = vec![0u8; 16];
        p[0..4].copy_from_slice(&5u32.to_le_bytes());
        let flags: u16 = if incremental { 0b1001 } else { 0b0111 };
        p[6..8].copy_from_slice(&flags.to_le_bytes());
        if incremental {
            p.extend_from_slice(&[0u8; 12]);
        }
        p.extend_from_slice(&body);
        let size = p.len() as u16;
        p[4..6].copy_from_slice(&size.to_le_bytes());
        packets.push(p);
    }
    packets
}

/// Reads every field of an order entry message; the point is that none of it panics.
fn touch_order_entry(m: &order_entry::Message<'_>) -> u64 {
    use order_entry::Message::*;
    match m {
        Establish(d) => {
            d.timestamp_ns() ^ u64::from(d.keepalive_interval_ms()) ^ u64::from(d.credentials()[31])
        }
        EstablishmentAck(d) => {
            d.request_timestamp_ns() ^ d.next_seq_no() ^ u64::from(d.keepalive_interval_ms())
        }
        EstablishmentReject(d) => d.request_timestamp_ns() ^ u64::from(u8::from(d.reason())),
        Terminate(d) => u64::from(u8::from(d.reason())),
        RetransmitRequest(d) => d.timestamp_ns() ^ d.from_seq_no() ^ u64::from(d.count()),
        Retransmission(d) => d.request_timestamp_ns() ^ d.next_seq_no() ^ u64::from(d.count()),
        Sequence(d) => d.next_seq_no().unwrap_or(0),
        NewOrder(d) => {
            d.cl_ord_id()
                ^ d.price().unwrap_or(0) as u64
                ^ d.qty() as u64
                ^ d.display_qty().unwrap_or(0) as u64
                ^ d.expire_time_ns().unwrap_or(0)
                ^ u64::from(d.account())
                ^ u64::from(d.instrument_id())
                ^ u64::from(u8::from(d.side()))
                ^ u64::from(u8::from(d.ord_type()))
                ^ u64::from(u8::from(d.time_in_force()))
        }
        CancelOrder(d) => {
            d.cl_ord_id()
                ^ d.order_id().unwrap_or(0)
                ^ d.orig_cl_ord_id().unwrap_or(0)
                ^ u64::from(d.account())
                ^ u64::from(d.instrument_id())
        }
        ReplaceOrder(d) => {
            d.cl_ord_id()
                ^ d.order_id().unwrap_or(0)
                ^ d.orig_cl_ord_id().unwrap_or(0)
                ^ d.price() as u64
                ^ d.qty() as u64
                ^ d.display_qty().unwrap_or(0) as u64
                ^ u64::from(d.account())
                ^ u64::from(d.instrument_id())
        }
        MassCancel(d) => {
            d.cl_ord_id()
                ^ u64::from(d.account().unwrap_or(0))
                ^ u64::from(d.instrument_id().unwrap_or(0))
                ^ u64::from(u8::from(d.side()))
        }
        NewOrderAck(d) => {
            d.cl_ord_id()
                ^ d.order_id()
                ^ d.transact_time_ns()
                ^ d.leaves_qty() as u64
                ^ u64::from(d.account())
                ^ u64::from(d.instrument_id())
        }
        OrderReject(d) => d.cl_ord_id() ^ d.transact_time_ns() ^ u64::from(u16::from(d.reason())),
        ExecutionReport(d) => {
            d.cl_ord_id()
                ^ d.order_id()
                ^ d.trade_id()
                ^ d.transact_time_ns()
                ^ d.last_px() as u64
                ^ d.last_qty() as u64
                ^ d.leaves_qty() as u64
                ^ d.cum_qty() as u64
                ^ u64::from(d.account())
                ^ u64::from(d.instrument_id())
                ^ u64::from(u8::from(d.side()))
                ^ u64::from(u8::from(d.aggressor()))
        }
        CancelAck(d) => {
            d.cl_ord_id().unwrap_or(0)
                ^ d.orig_cl_ord_id()
                ^ d.order_id()
                ^ d.transact_time_ns()
                ^ d.canceled_qty() as u64
                ^ u64::from(d.account())
                ^ u64::from(d.instrument_id())
                ^ u64::from(u8::from(d.reason()))
        }
        CancelReject(d) => {
            d.cl_ord_id()
                ^ d.order_id().unwrap_or(0)
                ^ d.transact_time_ns()
                ^ u64::from(u8::from(d.reason()))
        }
        ReplaceAck(d) => {
            d.cl_ord_id()
                ^ d.orig_cl_ord_id()
                ^ d.order_id()
                ^ d.transact_time_ns()
                ^ d.price() as u64
                ^ d.qty() as u64
                ^ d.leaves_qty() as u64
                ^ u64::from(d.account())
                ^ u64::from(d.instrument_id())
        }
        ReplaceReject(d) => {
            d.cl_ord_id()
                ^ d.order_id().unwrap_or(0)
                ^ d.transact_time_ns()
                ^ u64::from(u16::from(d.reason()))
        }
        MassCancelAck(d) => {
            d.cl_ord_id()
                ^ d.transact_time_ns()
                ^ u64::from(d.canceled_count())
                ^ u64::from(u8::from(d.result()))
        }
        BusinessReject(d) => {
            d.ref_cl_ord_id().unwrap_or(0)
                ^ d.transact_time_ns()
                ^ u64::from(d.retry_after_ms())
                ^ u64::from(d.ref_template_id())
                ^ u64::from(u8::from(d.reason()))
        }
    }
}

/// Reads every field of a market data message, every group entry included.
fn touch_market_data(m: &market_data::Message<'_>) -> u64 {
    use market_data::Message::*;
    let mut acc = 0u64;
    match *m {
        Heartbeat(d) => acc ^= u64::from(d.last_msg_seq_num()),
        SequenceReset(d) => acc ^= u64::from(d.new_seq_no()),
        BestPrices(d) => {
            let mut g = d.entries_decoder();
            while let Ok(Some(_)) = g.advance() {
                acc ^= g.bid_px().unwrap_or(0) as u64
                    ^ g.bid_qty().unwrap_or(0) as u64
                    ^ g.ask_px().unwrap_or(0) as u64
                    ^ g.ask_qty().unwrap_or(0) as u64
                    ^ u64::from(g.security_id());
            }
        }
        EmptyBook(d) => acc ^= u64::from(d.security_id().unwrap_or(0)) ^ u64::from(d.rpt_seq()),
        OrderUpdate(d) => {
            acc ^= d.md_entry_id()
                ^ d.md_entry_px() as u64
                ^ d.md_entry_size() as u64
                ^ u64::from(d.security_id())
                ^ u64::from(d.rpt_seq())
                ^ u64::from(u8::from(d.md_update_action()))
                ^ u64::from(u8::from(d.side()))
        }
        OrderExecution(d) => {
            acc ^= d.md_entry_id()
                ^ d.trade_id()
                ^ d.md_entry_px() as u64
                ^ d.md_entry_size() as u64
                ^ d.last_px() as u64
                ^ d.last_qty() as u64
                ^ u64::from(d.security_id())
                ^ u64::from(d.rpt_seq())
                ^ u64::from(u8::from(d.md_update_action()))
                ^ u64::from(u8::from(d.side()))
        }
        OrderBookSnapshot(d) => {
            acc ^= u64::from(d.security_id())
                ^ u64::from(d.last_msg_seq_num_processed())
                ^ u64::from(d.rpt_seq())
                ^ u64::from(d.exchange_trading_session_id())
                ^ u64::from(d.tot_num_reports());
            let mut g = d.entries_decoder();
            while let Ok(Some(_)) = g.advance() {
                acc ^= g.md_entry_id()
                    ^ g.transact_time_ns()
                    ^ g.md_entry_px() as u64
                    ^ g.md_entry_size() as u64
                    ^ u64::from(u8::from(g.side()));
            }
        }
        SecurityDefinition(d) => {
            acc ^= u64::from(d.security_id())
                ^ d.tick_size() as u64
                ^ d.lot_size() as u64
                ^ d.contract_multiplier() as u64
                ^ d.low_limit_px().unwrap_or(0) as u64
                ^ d.high_limit_px().unwrap_or(0) as u64
                ^ u64::from(d.tot_num_reports())
                ^ u64::from(d.maturity_date().unwrap_or(0))
                ^ u64::from(d.symbol()[23])
                ^ u64::from(d.currency()[2])
                ^ u64::from(u8::from(d.market()))
                ^ u64::from(d.price_scale());
            acc ^= bourse_wire::ascii_field(&d.symbol()).map_or(0, |s| s.len() as u64);
        }
        SecurityStatus(d) => {
            acc ^= u64::from(d.security_id())
                ^ d.low_limit_px().unwrap_or(0) as u64
                ^ d.high_limit_px().unwrap_or(0) as u64
                ^ u64::from(u8::from(d.trading_status()))
        }
        TradingSessionStatus(d) => {
            acc ^= u64::from(d.exchange_trading_session_id())
                ^ u64::from(u8::from(d.market()))
                ^ u64::from(u8::from(d.state()))
        }
        AggregatedBook(d) => {
            acc ^= u64::from(d.security_id()) ^ u64::from(d.rpt_seq());
            let mut g = d.levels_decoder();
            while let Ok(Some(_)) = g.advance() {
                acc ^= g.price() as u64
                    ^ g.qty() as u64
                    ^ u64::from(g.order_count())
                    ^ u64::from(u8::from(g.side()))
                    ^ u64::from(g.level());
            }
        }
        Statistics(d) => {
            for v in [
                d.last_px(),
                d.last_qty(),
                d.open_px(),
                d.high_px(),
                d.low_px(),
                d.vwap_px(),
                d.best_bid_px(),
                d.best_bid_qty(),
                d.best_ask_px(),
                d.best_ask_qty(),
            ] {
                acc ^= v.unwrap_or(0) as u64;
            }
            acc ^= d.volume() as u64
                ^ d.turnover() as u64
                ^ u64::from(d.security_id())
                ^ u64::from(d.number_of_trades());
        }
        Trade(d) => {
            acc ^= d.trade_id()
                ^ d.price() as u64
                ^ d.qty() as u64
                ^ u64::from(d.security_id())
                ^ u64::from(u8::from(d.aggressor_side()))
                ^ u64::from(u8::from(d.trade_type()))
        }
        AuctionIndicative(d) => {
            acc ^= u64::from(d.security_id())
                ^ d.price().unwrap_or(0) as u64
                ^ d.qty() as u64
                ^ d.surplus() as u64
                ^ u64::from(u8::from(d.surplus_side()))
        }
        ReplayRequest(d) => acc ^= u64::from(d.from_msg_seq_num()) ^ u64::from(d.count()),
        ReplayResponse(d) => {
            acc ^= u64::from(d.from_msg_seq_num())
                ^ u64::from(d.count())
                ^ u64::from(u8::from(d.status()))
        }
    }
    acc
}

/// Runs bytes through every decoder and touches whatever decodes.
fn exercise(bytes: &[u8]) {
    let oe = FrameDecoder::default();
    if let Ok(Some(decoded)) = oe.decode(bytes) {
        assert!(decoded.frame_bytes <= bytes.len());
        touch_order_entry(&decoded.message);
    }
    if let Ok(m) = oe.decode_exact(bytes) {
        touch_order_entry(&m);
    }
    if let Ok((m, n)) = order_entry::decode_message(bytes) {
        assert!(n <= bytes.len());
        touch_order_entry(&m);
    }
    if let Ok((m, n)) = market_data::decode_message(bytes) {
        assert!(n <= bytes.len());
        touch_market_data(&m);
    }
    if let Ok(packet) = market_data::parse_packet(bytes) {
        assert!(packet.message_count() >= 1);
        assert_eq!(packet.messages().count(), packet.message_count());
        packet.messages().for_each(|m| {
            touch_market_data(&m);
        });
    }
    if let Ok(packet) = PacketParser::new(usize::MAX, usize::MAX).parse(bytes) {
        packet.messages().for_each(|m| {
            touch_market_data(&m);
        });
    }
    if let Ok(Some(d)) = ReplayFrameDecoder::default().decode(bytes) {
        match d.frame {
            ReplayFrame::Message(m) => {
                touch_market_data(&m);
            }
            ReplayFrame::Packet(p) => p.messages().for_each(|m| {
                touch_market_data(&m);
            }),
        }
    }
    let _ = FrameReader::new(usize::MAX).exact_frame(bytes);
    let _ = bourse_wire::ascii_field(bytes);
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Truncate(usize),
    Extend(Vec<u8>),
    SetU16(usize, u16),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Mutation::Extend),
        // Length, block length, count and id fields are u16s; interesting values go here.
        2 => (any::<usize>(), prop_oneof![Just(0u16), Just(1), Just(2), Just(255), Just(u16::MAX), any::<u16>()])
            .prop_map(|(i, v)| Mutation::SetU16(i, v)),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        match m {
            Mutation::Set(i, b) if !bytes.is_empty() => {
                let n = bytes.len();
                bytes[i % n] = *b;
            }
            Mutation::SetU16(i, v) if bytes.len() >= 2 => {
                let at = i % (bytes.len() - 1);
                bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
            Mutation::Truncate(n) => {
                let len = bytes.len();
                bytes.truncate(n % (len + 1));
            }
            Mutation::Extend(tail) => bytes.extend_from_slice(tail),
            _ => {}
        }
    }
    bytes
}

#[test]
fn corpus_is_valid() {
    let decoder = FrameDecoder::default();
    for f in order_entry_corpus() {
        decoder.decode_exact(&f).unwrap();
    }
    for p in market_data_corpus() {
        let packet = market_data::parse_packet(&p).unwrap();
        assert_eq!(packet.message_count(), market_data::TemplateId::ALL.len());
        packet.messages().for_each(|m| {
            touch_market_data(&m);
        });
    }
}

#[test]
fn every_truncation_of_a_frame_is_incomplete_or_truncated() {
    let decoder = FrameDecoder::default();
    for f in order_entry_corpus() {
        for cut in 0..f.len() {
            assert!(decoder.decode(&f[..cut]).unwrap().is_none());
            assert!(matches!(
                decoder.decode_exact(&f[..cut]),
                Err(Error::Truncated { .. })
            ));
        }
    }
}

#[test]
fn every_truncation_of_a_packet_is_an_error() {
    for p in market_data_corpus() {
        for cut in 0..p.len() {
            assert!(market_data::parse_packet(&p[..cut]).is_err());
        }
    }
}

#[test]
fn frame_header_errors_come_before_the_body() {
    let decoder = FrameDecoder::default();
    // Too large is reported from the 4 header bytes alone.
    let mut header = Vec::new();
    header.extend_from_slice(&600u16.to_le_bytes());
    header.extend_from_slice(&0xEB50u16.to_le_bytes());
    assert_eq!(
        decoder.decode(&header).unwrap_err(),
        Error::FrameTooLarge {
            frame_bytes: 600,
            frame_bytes_max: order_entry::FRAME_BYTES_MAX
        }
    );
    header[0..2].copy_from_slice(&5u16.to_le_bytes());
    assert!(matches!(
        decoder.decode(&header),
        Err(Error::FrameTooSmall { .. })
    ));
    header[0..2].copy_from_slice(&20u16.to_le_bytes());
    header[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
    assert_eq!(
        decoder.decode(&header).unwrap_err(),
        Error::UnknownEncoding { encoding: 0x1234 }
    );

    let mut f = order_entry_corpus().remove(0);
    f[2..4].copy_from_slice(&(Encoding::MarketDataPacket as u16).to_le_bytes());
    assert!(matches!(
        decoder.decode(&f),
        Err(Error::UnexpectedEncoding { .. })
    ));

    // Template, schema and version errors.
    let mut f = order_entry_corpus().remove(0);
    f[6..8].copy_from_slice(&999u16.to_le_bytes());
    assert_eq!(
        decoder.decode(&f).unwrap_err(),
        Error::UnknownTemplate { template_id: 999 }
    );
    let mut f = order_entry_corpus().remove(0);
    f[8..10].copy_from_slice(&2u16.to_le_bytes());
    assert_eq!(
        decoder.decode(&f).unwrap_err(),
        Error::WrongSchemaId {
            schema_id: 2,
            expected: 1
        }
    );
    let mut f = order_entry_corpus().remove(0);
    f[10..12].copy_from_slice(&7u16.to_le_bytes());
    assert_eq!(
        decoder.decode(&f).unwrap_err(),
        Error::VersionFromFuture {
            version: 7,
            supported: bourse_wire::order_entry::SCHEMA_VERSION
        }
    );
    // A block length that disagrees with the frame.
    let mut f = order_entry_corpus().remove(0);
    f[4..6].copy_from_slice(&1u16.to_le_bytes());
    assert!(matches!(
        decoder.decode(&f),
        Err(Error::BlockLengthTooShort { .. })
    ));
    let mut f = order_entry_corpus().remove(0);
    f.push(0);
    let len = f.len() as u16;
    f[0..2].copy_from_slice(&len.to_le_bytes());
    assert_eq!(
        decoder.decode(&f).unwrap_err(),
        Error::TrailingBytes { trailing_bytes: 1 }
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1_600)) {
        exercise(&bytes);
    }

    #[test]
    fn arbitrary_bytes_behind_a_plausible_header_never_panic(
        template in 0u16..300,
        schema in 0u16..4,
        version in 0u16..3,
        block_length in 0u16..128,
        tail in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut message = Vec::new();
        for v in [block_length, template, schema, version] {
            message.extend_from_slice(&v.to_le_bytes());
        }
        message.extend_from_slice(&tail);
        exercise(&message);
        exercise(&frame(Encoding::SbeMessage, &message));
        let mut packet = vec![0u8; 16];
        packet.extend_from_slice(&message);
        let size = packet.len() as u16;
        packet[4..6].copy_from_slice(&size.to_le_bytes());
        exercise(&packet);
    }

    #[test]
    fn mutated_order_entry_frames_never_panic(
        which in any::<prop::sample::Index>(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let corpus = order_entry_corpus();
        let bytes = mutate(corpus[which.index(corpus.len())].clone(), &mutations);
        exercise(&bytes);
    }

    #[test]
    fn mutated_market_data_packets_never_panic(
        which in any::<prop::sample::Index>(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let corpus = market_data_corpus();
        let bytes = mutate(corpus[which.index(corpus.len())].clone(), &mutations);
        exercise(&bytes);
        exercise(&frame(Encoding::MarketDataPacket, &bytes));
    }
}
