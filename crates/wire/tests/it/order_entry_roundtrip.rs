//! Encode then decode every order entry message and check every field survives, and that the
//! frame sizes match the offsets the protocol document gives.

use bourse_wire::frame::{encode_frame, FRAME_HEADER_BYTES};
use bourse_wire::order_entry::codec::{
    aggressor_flag::AggressorFlag, business_reject_codec::*, business_reject_reason::*,
    cancel_ack_codec::*, cancel_order_codec::*, cancel_reason::*, cancel_reject_codec::*,
    cancel_reject_reason::*, establish_codec::*, establishment_ack_codec::*,
    establishment_reject_code::*, establishment_reject_codec::*, execution_report_codec::*,
    mass_cancel_ack_codec::*, mass_cancel_codec::*, mass_cancel_result::*, mass_cancel_scope::*,
    new_order_ack_codec::*, new_order_codec::*, ord_type::OrdType, order_reject_codec::*,
    order_reject_reason::*, replace_ack_codec::*, replace_order_codec::*, replace_reject_codec::*,
    retransmission_codec::*, retransmit_request_codec::*, sequence_codec::*, side::Side,
    terminate_codec::*, termination_code::*, time_in_force::TimeInForce,
};
use bourse_wire::order_entry::{FrameDecoder, Message, TemplateId, FRAME_BYTES_MAX};
use bourse_wire::sbe::MESSAGE_HEADER_BYTES;

/// Encodes one message of encoder type `$enc` into a fresh frame.
macro_rules! encode {
    ($enc:ident, |$e:ident| $body:block) => {{
        let mut buf = vec![0u8; FRAME_BYTES_MAX];
        let frame_bytes = encode_frame(&mut buf, |mut $e: $enc| {
            $body;
            $e
        })
        .expect("encode");
        buf.truncate(frame_bytes);
        buf
    }};
}

fn decode(buf: &[u8]) -> Message<'_> {
    let decoded = FrameDecoder::default()
        .decode(buf)
        .expect("valid frame")
        .expect("whole frame");
    assert_eq!(decoded.frame_bytes, buf.len());
    decoded.message
}

fn assert_frame_size(buf: &[u8], template: TemplateId) {
    let expected = FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES + usize::from(template.block_length());
    assert_eq!(buf.len(), expected, "{template:?}");
}

const T0: u64 = 1_763_700_000_123_456_789;

#[test]
fn establish() {
    let buf = encode!(EstablishEncoder, |e| {
        e.timestamp_ns(T0).keepalive_interval_ms(1_000);
        e.credentials_zero_padded(b"firm-7:secret");
    });
    assert_frame_size(&buf, TemplateId::Establish);
    let Message::Establish(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.timestamp_ns(), T0);
    assert_eq!(d.keepalive_interval_ms(), 1_000);
    assert_eq!(
        bourse_wire::ascii_field(&d.credentials()),
        Some("firm-7:secret")
    );
    assert_eq!(bourse_wire::ascii_field(&d.password()), Some(""));
}

#[test]
fn establish_carries_a_password_since_version_2() {
    let buf = encode!(EstablishEncoder, |e| {
        e.timestamp_ns(T0).keepalive_interval_ms(1_000);
        e.credentials_zero_padded(b"firm-7");
        e.password_zero_padded(b"s3cret");
    });
    let Message::Establish(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(bourse_wire::ascii_field(&d.password()), Some("s3cret"));
}

/// A version 1 client's Establish is 44 bytes long: read by its own blockLength, with no
/// password; a version 1 block claiming version 2 is refused as too short.
#[test]
fn a_version_1_establish_is_read_by_its_own_block_length() {
    let full = encode!(EstablishEncoder, |e| {
        e.timestamp_ns(T0).keepalive_interval_ms(1_000);
        e.credentials_zero_padded(b"firm-7");
        e.password_zero_padded(b"ignored");
    });
    let v1_len = FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES + 44;
    let mut v1 = full[..v1_len].to_vec();
    v1[0..2].copy_from_slice(&(v1_len as u16).to_le_bytes());
    v1[4..6].copy_from_slice(&44u16.to_le_bytes());
    v1[10..12].copy_from_slice(&1u16.to_le_bytes());
    let Message::Establish(d) = decode(&v1) else {
        panic!()
    };
    assert_eq!(bourse_wire::ascii_field(&d.credentials()), Some("firm-7"));
    assert_eq!(d.password(), [0u8; 32]);
    let mut claims_v2 = v1.clone();
    claims_v2[10..12].copy_from_slice(&2u16.to_le_bytes());
    assert!(matches!(
        FrameDecoder::default().decode(&claims_v2),
        Err(bourse_wire::Error::BlockLengthTooShort { .. })
    ));
}

#[test]
fn a_server_frame_can_be_rewritten_for_a_version_1_peer() {
    let mut buf = encode!(EstablishmentAckEncoder, |e| {
        e.request_timestamp_ns(T0)
            .next_seq_no(1)
            .keepalive_interval_ms(500);
    });
    bourse_wire::order_entry::set_frame_version(&mut buf, 1);
    assert_eq!(u16::from_le_bytes([buf[10], buf[11]]), 1);
    let Message::EstablishmentAck(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.next_seq_no(), 1);
}

#[test]
fn establishment_ack_and_reject() {
    let buf = encode!(EstablishmentAckEncoder, |e| {
        e.request_timestamp_ns(T0)
            .next_seq_no(17)
            .keepalive_interval_ms(500);
    });
    assert_frame_size(&buf, TemplateId::EstablishmentAck);
    let Message::EstablishmentAck(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (
            d.request_timestamp_ns(),
            d.next_seq_no(),
            d.keepalive_interval_ms()
        ),
        (T0, 17, 500)
    );

    let buf = encode!(EstablishmentRejectEncoder, |e| {
        e.request_timestamp_ns(T0)
            .reason(EstablishmentRejectCode::BadCredentials);
    });
    assert_frame_size(&buf, TemplateId::EstablishmentReject);
    let Message::EstablishmentReject(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.request_timestamp_ns(), T0);
    assert_eq!(d.reason(), EstablishmentRejectCode::BadCredentials);
}

#[test]
fn terminate_sequence_retransmit() {
    let buf = encode!(TerminateEncoder, |e| {
        e.reason(TerminationCode::KeepaliveTimeout);
    });
    assert_frame_size(&buf, TemplateId::Terminate);
    let Message::Terminate(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.reason(), TerminationCode::KeepaliveTimeout);

    let buf = encode!(SequenceEncoder, |e| {
        e.next_seq_no_opt(Some(99));
    });
    assert_frame_size(&buf, TemplateId::Sequence);
    let Message::Sequence(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.next_seq_no(), Some(99));
    let buf = encode!(SequenceEncoder, |e| {
        e.next_seq_no_opt(None);
    });
    let Message::Sequence(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.next_seq_no(), None);

    let buf = encode!(RetransmitRequestEncoder, |e| {
        e.timestamp_ns(T0).from_seq_no(5).count(1_000);
    });
    assert_frame_size(&buf, TemplateId::RetransmitRequest);
    let Message::RetransmitRequest(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.timestamp_ns(), d.from_seq_no(), d.count()),
        (T0, 5, 1_000)
    );

    let buf = encode!(RetransmissionEncoder, |e| {
        e.request_timestamp_ns(T0).next_seq_no(5).count(3);
    });
    assert_frame_size(&buf, TemplateId::Retransmission);
    let Message::Retransmission(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.request_timestamp_ns(), d.next_seq_no(), d.count()),
        (T0, 5, 3)
    );
}

#[test]
fn new_order_limit_and_market() {
    let buf = encode!(NewOrderEncoder, |e| {
        e.cl_ord_id(u64::MAX - 1).price_opt(Some(-250)).qty(1_000);
        e.display_qty_opt(Some(100)).expire_time_ns_opt(Some(T0));
        e.account(u32::MAX - 1).instrument_id(42).side(Side::Sell);
        e.ord_type(OrdType::Limit)
            .time_in_force(TimeInForce::GoodTillDate);
    });
    assert_frame_size(&buf, TemplateId::NewOrder);
    let Message::NewOrder(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.cl_ord_id(), u64::MAX - 1);
    assert_eq!(d.price(), Some(-250));
    assert_eq!(d.qty(), 1_000);
    assert_eq!(d.display_qty(), Some(100));
    assert_eq!(d.expire_time_ns(), Some(T0));
    assert_eq!(d.account(), u32::MAX - 1);
    assert_eq!(d.instrument_id(), 42);
    assert_eq!(d.side(), Side::Sell);
    assert_eq!(d.ord_type(), OrdType::Limit);
    assert_eq!(d.time_in_force(), TimeInForce::GoodTillDate);

    let buf = encode!(NewOrderEncoder, |e| {
        e.cl_ord_id(1).price_opt(None).qty(5).display_qty_opt(None);
        e.expire_time_ns_opt(None)
            .account(1)
            .instrument_id(2)
            .side(Side::Buy);
        e.ord_type(OrdType::Market)
            .time_in_force(TimeInForce::ImmediateOrCancel);
    });
    let Message::NewOrder(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.price(), d.display_qty(), d.expire_time_ns()),
        (None, None, None)
    );
    assert_eq!(d.ord_type(), OrdType::Market);
    assert_eq!(d.time_in_force(), TimeInForce::ImmediateOrCancel);
}

#[test]
fn cancel_replace_mass_cancel() {
    let buf = encode!(CancelOrderEncoder, |e| {
        e.cl_ord_id(10)
            .order_id_opt(None)
            .orig_cl_ord_id_opt(Some(9));
        e.account(3).instrument_id(4);
    });
    assert_frame_size(&buf, TemplateId::CancelOrder);
    let Message::CancelOrder(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.order_id(), d.orig_cl_ord_id()),
        (10, None, Some(9))
    );
    assert_eq!((d.account(), d.instrument_id()), (3, 4));

    let buf = encode!(ReplaceOrderEncoder, |e| {
        e.cl_ord_id(11)
            .order_id_opt(Some(77))
            .orig_cl_ord_id_opt(None);
        e.price(101)
            .qty(20)
            .display_qty_opt(Some(5))
            .account(3)
            .instrument_id(4);
    });
    assert_frame_size(&buf, TemplateId::ReplaceOrder);
    let Message::ReplaceOrder(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.order_id(), d.orig_cl_ord_id()),
        (11, Some(77), None)
    );
    assert_eq!((d.price(), d.qty(), d.display_qty()), (101, 20, Some(5)));
    assert_eq!((d.account(), d.instrument_id()), (3, 4));

    let buf = encode!(MassCancelEncoder, |e| {
        e.cl_ord_id(12).account_opt(Some(3)).instrument_id_opt(None);
        e.side_opt(None).scope(MassCancelScope::Firm);
    });
    assert_frame_size(&buf, TemplateId::MassCancel);
    let Message::MassCancel(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.account(), d.instrument_id()),
        (12, Some(3), None)
    );
    assert_eq!(d.side(), Side::NullVal);
    assert_eq!(d.scope(), MassCancelScope::Firm);
}

/// A version 1 or 2 MassCancel is 17 bytes long: read by its own blockLength, with no scope
/// (the decoder's null, which the gateway reads as the session's own orders); a 17-byte block
/// claiming version 3 is refused as too short.
#[test]
fn a_version_2_mass_cancel_is_read_by_its_own_block_length() {
    let full = encode!(MassCancelEncoder, |e| {
        e.cl_ord_id(12).account_opt(Some(3)).instrument_id_opt(None);
        e.side_opt(None).scope(MassCancelScope::Account);
    });
    let v2_len = FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES + 17;
    let mut v2 = full[..v2_len].to_vec();
    v2[0..2].copy_from_slice(&(v2_len as u16).to_le_bytes());
    v2[4..6].copy_from_slice(&17u16.to_le_bytes());
    v2[10..12].copy_from_slice(&2u16.to_le_bytes());
    let Message::MassCancel(d) = decode(&v2) else {
        panic!()
    };
    assert_eq!((d.cl_ord_id(), d.account()), (12, Some(3)));
    assert_eq!((d.acting_version, d.scope()), (2, MassCancelScope::NullVal));
    let mut claims_v3 = v2.clone();
    claims_v3[10..12].copy_from_slice(&3u16.to_le_bytes());
    assert!(matches!(
        FrameDecoder::default().decode(&claims_v3),
        Err(bourse_wire::Error::BlockLengthTooShort { .. })
    ));
}

#[test]
fn acks_and_rejects() {
    let buf = encode!(NewOrderAckEncoder, |e| {
        e.cl_ord_id(1)
            .order_id(1_000_001)
            .transact_time_ns(T0)
            .leaves_qty(10);
        e.account(3).instrument_id(4);
    });
    assert_frame_size(&buf, TemplateId::NewOrderAck);
    let Message::NewOrderAck(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.order_id(), d.transact_time_ns()),
        (1, 1_000_001, T0)
    );
    assert_eq!((d.leaves_qty(), d.account(), d.instrument_id()), (10, 3, 4));

    let buf = encode!(OrderRejectEncoder, |e| {
        e.cl_ord_id(2).transact_time_ns(T0);
        e.reason(OrderRejectReason::InsufficientCollateral);
    });
    assert_frame_size(&buf, TemplateId::OrderReject);
    let Message::OrderReject(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!((d.cl_ord_id(), d.transact_time_ns()), (2, T0));
    assert_eq!(d.reason(), OrderRejectReason::InsufficientCollateral);

    let buf = encode!(CancelAckEncoder, |e| {
        e.cl_ord_id_opt(None)
            .orig_cl_ord_id(5)
            .order_id(6)
            .transact_time_ns(T0);
        e.canceled_qty(7).account(8).instrument_id(9);
        e.reason(CancelReason::ImmediateOrCancelRemainder);
    });
    assert_frame_size(&buf, TemplateId::CancelAck);
    let Message::CancelAck(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.orig_cl_ord_id(), d.order_id()),
        (None, 5, 6)
    );
    assert_eq!((d.transact_time_ns(), d.canceled_qty()), (T0, 7));
    assert_eq!((d.account(), d.instrument_id()), (8, 9));
    assert_eq!(d.reason(), CancelReason::ImmediateOrCancelRemainder);

    let buf = encode!(CancelRejectEncoder, |e| {
        e.cl_ord_id(3).order_id_opt(Some(4)).transact_time_ns(T0);
        e.reason(CancelRejectReason::TooLateToCancel);
    });
    assert_frame_size(&buf, TemplateId::CancelReject);
    let Message::CancelReject(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.order_id(), d.transact_time_ns()),
        (3, Some(4), T0)
    );
    assert_eq!(d.reason(), CancelRejectReason::TooLateToCancel);

    let buf = encode!(ReplaceAckEncoder, |e| {
        e.cl_ord_id(11)
            .orig_cl_ord_id(10)
            .order_id(77)
            .transact_time_ns(T0);
        e.price(101)
            .qty(20)
            .leaves_qty(15)
            .account(3)
            .instrument_id(4);
    });
    assert_frame_size(&buf, TemplateId::ReplaceAck);
    let Message::ReplaceAck(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.orig_cl_ord_id(), d.order_id()),
        (11, 10, 77)
    );
    assert_eq!(
        (d.transact_time_ns(), d.price(), d.qty(), d.leaves_qty()),
        (T0, 101, 20, 15)
    );
    assert_eq!((d.account(), d.instrument_id()), (3, 4));

    let buf = encode!(ReplaceRejectEncoder, |e| {
        e.cl_ord_id(11).order_id_opt(None).transact_time_ns(T0);
        e.reason(OrderRejectReason::PriceNotOnTick);
    });
    assert_frame_size(&buf, TemplateId::ReplaceReject);
    let Message::ReplaceReject(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.order_id(), d.transact_time_ns()),
        (11, None, T0)
    );
    assert_eq!(d.reason(), OrderRejectReason::PriceNotOnTick);

    let buf = encode!(MassCancelAckEncoder, |e| {
        e.cl_ord_id(12).transact_time_ns(T0).canceled_count(250);
        e.result(MassCancelResult::Done);
    });
    assert_frame_size(&buf, TemplateId::MassCancelAck);
    let Message::MassCancelAck(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.cl_ord_id(), d.transact_time_ns(), d.canceled_count()),
        (12, T0, 250)
    );
    assert_eq!(d.result(), MassCancelResult::Done);

    let buf = encode!(BusinessRejectEncoder, |e| {
        e.ref_cl_ord_id_opt(Some(13))
            .transact_time_ns(T0)
            .retry_after_ms(250);
        e.ref_template_id(TemplateId::NewOrder as u16);
        e.reason(BusinessRejectReason::Throttled);
    });
    assert_frame_size(&buf, TemplateId::BusinessReject);
    let Message::BusinessReject(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (d.ref_cl_ord_id(), d.transact_time_ns(), d.retry_after_ms()),
        (Some(13), T0, 250)
    );
    assert_eq!(d.ref_template_id(), 100);
    assert_eq!(d.reason(), BusinessRejectReason::Throttled);
}

/// Version 4's reason for a core without a quorum has wire value 7; a value the decoder does
/// not know (as 7 is to a decoder of version 3) decodes as NullVal rather than failing.
#[test]
fn core_no_quorum_is_reason_7_and_an_unknown_reason_decodes_as_null() {
    assert_eq!(u8::from(BusinessRejectReason::CoreNoQuorum), 7);
    let mut buf = encode!(BusinessRejectEncoder, |e| {
        e.ref_cl_ord_id_opt(Some(13))
            .transact_time_ns(T0)
            .retry_after_ms(0);
        e.ref_template_id(TemplateId::NewOrder as u16);
        e.reason(BusinessRejectReason::CoreNoQuorum);
    });
    let Message::BusinessReject(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.reason(), BusinessRejectReason::CoreNoQuorum);
    // The reason is the body's last byte; a value no version defines.
    let last = buf.len() - 1;
    assert_eq!(buf[last], 7);
    buf[last] = 200;
    let Message::BusinessReject(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(d.reason(), BusinessRejectReason::NullVal);
}

#[test]
fn execution_report() {
    let buf = encode!(ExecutionReportEncoder, |e| {
        e.cl_ord_id(1).order_id(2).trade_id(3).transact_time_ns(T0);
        e.last_px(10_050).last_qty(4).leaves_qty(6).cum_qty(4);
        e.account(7)
            .instrument_id(8)
            .side(Side::Buy)
            .aggressor(AggressorFlag::Aggressor);
    });
    assert_frame_size(&buf, TemplateId::ExecutionReport);
    let Message::ExecutionReport(d) = decode(&buf) else {
        panic!()
    };
    assert_eq!(
        (
            d.cl_ord_id(),
            d.order_id(),
            d.trade_id(),
            d.transact_time_ns()
        ),
        (1, 2, 3, T0)
    );
    assert_eq!(
        (d.last_px(), d.last_qty(), d.leaves_qty(), d.cum_qty()),
        (10_050, 4, 6, 4)
    );
    assert_eq!((d.account(), d.instrument_id()), (7, 8));
    assert_eq!(
        (d.side(), d.aggressor()),
        (Side::Buy, AggressorFlag::Aggressor)
    );
}

#[test]
fn every_template_is_classified_once() {
    for &t in TemplateId::ALL {
        let classes = [
            t.is_session(),
            t.is_client_request(),
            t.is_server_response(),
        ];
        assert_eq!(classes.iter().filter(|&&c| c).count(), 1, "{t:?}");
        assert_eq!(TemplateId::from_u16(t as u16), Some(t));
    }
    assert_eq!(TemplateId::ALL.len(), 20);
}

#[test]
fn stream_of_frames_decodes_one_at_a_time() {
    let a = encode!(TerminateEncoder, |e| {
        e.reason(TerminationCode::Finished);
    });
    let b = encode!(SequenceEncoder, |e| {
        e.next_seq_no_opt(Some(1));
    });
    let stream: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
    let decoder = FrameDecoder::default();
    // Every prefix shorter than the first frame asks for more bytes.
    for cut in 0..a.len() {
        assert!(
            decoder.decode(&stream[..cut]).unwrap().is_none(),
            "cut {cut}"
        );
    }
    let first = decoder.decode(&stream).unwrap().unwrap();
    assert_eq!(first.frame_bytes, a.len());
    assert!(matches!(first.message, Message::Terminate(_)));
    let second = decoder
        .decode(&stream[first.frame_bytes..])
        .unwrap()
        .unwrap();
    assert!(matches!(second.message, Message::Sequence(_)));
}

/// The worked example in docs/protocol-binary-order-entry.md; if this test changes, the
/// document must change with it.
#[test]
fn new_order_golden_bytes() {
    let buf = encode!(NewOrderEncoder, |e| {
        e.cl_ord_id(42)
            .price_opt(Some(10_050))
            .qty(10)
            .display_qty_opt(None);
        e.expire_time_ns_opt(None).account(7).instrument_id(1001);
        e.side(Side::Buy)
            .ord_type(OrdType::Limit)
            .time_in_force(TimeInForce::Day);
    });
    let hex: Vec<String> = buf.iter().map(|b| format!("{b:02x}")).collect();
    let expected = "3f 00 50 eb \
                    33 00 64 00 01 00 06 00 \
                    2a 00 00 00 00 00 00 00 \
                    42 27 00 00 00 00 00 00 \
                    0a 00 00 00 00 00 00 00 \
                    00 00 00 00 00 00 00 80 \
                    ff ff ff ff ff ff ff ff \
                    07 00 00 00 \
                    e9 03 00 00 \
                    01 01 00";
    assert_eq!(
        hex.join(" "),
        expected.split_whitespace().collect::<Vec<_>>().join(" ")
    );
}
