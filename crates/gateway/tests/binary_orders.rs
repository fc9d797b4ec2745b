//! Binary (SBE) order entry through the gateway, end to end with an in-process engine.

mod common;

use bourse_client::binary::BinTif;
use bourse_client::{BinaryClient, Received, Response};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn next(c: &mut BinaryClient) -> Received {
    loop {
        let r = c.recv(WAIT).unwrap().expect("a response");
        if !matches!(r.response, Response::Sequence { .. }) {
            return r;
        }
    }
}

#[test]
fn orders_trade_and_each_side_gets_acks_and_fills() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let mut a = BinaryClient::connect(addr, "alpha-bin", 1000, 1).unwrap();
    let mut b = BinaryClient::connect(addr, "beta-bin", 1000, 1).unwrap();
    assert_eq!(a.server_next_seq_at_establish, 1);
    a.new_order(1, 101, 1, false, 100, Some(10_050), BinTif::Day)
        .unwrap();
    let ack = next(&mut a);
    assert_eq!(ack.seq, Some(1));
    let Response::NewOrderAck {
        cl_ord_id: 1,
        order_id,
        leaves_qty: 100,
    } = ack.response
    else {
        panic!("{ack:?}")
    };
    b.new_order(7, 201, 1, true, 30, Some(10_100), BinTif::Day)
        .unwrap();
    assert!(matches!(
        next(&mut b).response,
        Response::NewOrderAck { cl_ord_id: 7, .. }
    ));
    let fill = next(&mut b);
    assert_eq!(
        fill.response,
        Response::Execution {
            cl_ord_id: 7,
            order_id: order_id + 1,
            trade_id: 1,
            last_px: 10_050,
            last_qty: 30,
            leaves_qty: 0,
            cum_qty: 30,
            aggressor: true
        }
    );
    let passive = next(&mut a);
    assert!(matches!(
        passive.response,
        Response::Execution {
            cl_ord_id: 1,
            leaves_qty: 70,
            aggressor: false,
            ..
        }
    ));

    a.replace(2, 1, 101, 1, 10_200, 80).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::ReplaceAck {
            cl_ord_id: 2,
            orig_cl_ord_id: 1,
            leaves_qty: 50,
            ..
        }
    ));
    a.cancel(3, 2, 101, 1).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::CancelAck {
            cl_ord_id: Some(3),
            orig_cl_ord_id: 2,
            canceled_qty: 50,
            ..
        }
    ));
    a.cancel(4, 2, 101, 1).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::CancelReject {
            cl_ord_id: 4,
            reason: 1
        }
    ));

    for id in 10..13 {
        a.new_order(id, 101, 1, true, 10, Some(9_900), BinTif::Day)
            .unwrap();
        next(&mut a);
    }
    a.mass_cancel(20, None, None).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            next(&mut a).response,
            Response::CancelAck { reason: 1, .. }
        ));
    }
    assert!(matches!(
        next(&mut a).response,
        Response::MassCancelAck {
            cl_ord_id: 20,
            canceled_count: 3,
            result: 0
        }
    ));
}

#[test]
fn a_reconnecting_client_recovers_missed_responses_by_retransmission() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let mut a = BinaryClient::connect(addr, "alpha-bin", 1000, 1).unwrap();
    a.new_order(1, 101, 1, false, 10, Some(10_000), BinTif::Day)
        .unwrap();
    assert_eq!(next(&mut a).seq, Some(1));
    a.terminate().unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::Terminate { reason: 0 }
    ));
    drop(a);
    // While alpha is away its order trades: the fill is sequenced and kept.
    let mut b = BinaryClient::connect(addr, "beta-bin", 1000, 1).unwrap();
    b.new_order(1, 201, 1, true, 10, Some(10_000), BinTif::Day)
        .unwrap();
    next(&mut b);
    next(&mut b);
    let mut a = BinaryClient::connect(addr, "alpha-bin", 1000, 2).unwrap();
    assert_eq!(
        a.server_next_seq_at_establish, 3,
        "one response (the fill) was missed"
    );
    a.retransmit(2, 10).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::Retransmission {
            next_seq_no: 2,
            count: 1
        }
    ));
    let fill = next(&mut a);
    assert_eq!(fill.seq, Some(2));
    assert!(matches!(
        fill.response,
        Response::Execution {
            cl_ord_id: 1,
            leaves_qty: 0,
            ..
        }
    ));
}

#[test]
fn bad_credentials_and_a_second_connection_are_refused() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let err = BinaryClient::connect(addr, "nobody", 1000, 1)
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("EstablishmentReject { reason: 1 }"),
        "{err}"
    );
    let _a = BinaryClient::connect(addr, "alpha-bin", 1000, 1).unwrap();
    let err = BinaryClient::connect(addr, "alpha-bin", 1000, 1)
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("EstablishmentReject { reason: 2 }"),
        "{err}"
    );
    let err = BinaryClient::connect(addr, "beta-bin", 5, 1).err().unwrap();
    assert!(
        err.to_string()
            .contains("EstablishmentReject { reason: 3 }"),
        "{err}"
    );
}

#[test]
fn garbage_on_an_established_session_is_terminated_as_an_invalid_frame() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let mut a = BinaryClient::connect(addr, "alpha-bin", 1000, 1).unwrap();
    // Bytes that are not a frame: the gateway terminates with InvalidFrame (3).
    a.write_raw(&[0xff; 16]).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::Terminate { reason: 3 }
    ));
}

/// Rests a buy of 10 at `price` for account 201 and returns once it is acknowledged.
fn rest(c: &mut BinaryClient, id: u64, price: i64) {
    c.new_order(id, 201, 1, true, 10, Some(price), BinTif::Day)
        .unwrap();
    assert!(matches!(
        next(c).response,
        Response::NewOrderAck { cl_ord_id, .. } if cl_ord_id == id
    ));
}

/// The CancelAcks a session receives before its MassCancelAck, and that ack's count and result.
fn mass_cancel_answer(c: &mut BinaryClient, id: u64) -> (usize, u32, u8) {
    let mut cancels = 0;
    loop {
        match next(c).response {
            Response::CancelAck { reason: 1, .. } => cancels += 1,
            Response::MassCancelAck {
                cl_ord_id,
                canceled_count,
                result,
            } if cl_ord_id == id => return (cancels, canceled_count, result),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_binary_mass_cancel_reaches_the_account_or_the_firm_when_it_asks() {
    use bourse_client::binary::MassCancelScope;
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    // Two sessions of firm 2 share account 201.
    let mut beta = BinaryClient::connect(addr, "beta-bin", 1000, 1).unwrap();
    let mut other = BinaryClient::connect(addr, "flood", 1000, 1).unwrap();

    rest(&mut beta, 1, 9_000);
    rest(&mut other, 1, 9_001);
    rest(&mut other, 2, 9_002);
    // Session scope (the default): beta's own order only.
    beta.mass_cancel(2, Some(201), None).unwrap();
    assert_eq!(mass_cancel_answer(&mut beta, 2), (1, 1, 0));

    // Account scope: every order of 201, whoever entered it; beta hears of its own only.
    rest(&mut beta, 3, 9_003);
    beta.mass_cancel_scoped(4, MassCancelScope::Account, Some(201), None)
        .unwrap();
    assert_eq!(mass_cancel_answer(&mut beta, 4), (1, 3, 0));
    for _ in 0..2 {
        assert!(matches!(
            next(&mut other).response,
            Response::CancelAck { reason: 1, .. }
        ));
    }

    // Firm scope: the firm's orders.
    rest(&mut other, 3, 9_004);
    beta.mass_cancel_scoped(5, MassCancelScope::Firm, None, None)
        .unwrap();
    assert_eq!(mass_cancel_answer(&mut beta, 5), (0, 1, 0));
    assert!(matches!(
        next(&mut other).response,
        Response::CancelAck { reason: 1, .. }
    ));

    // A scope outside the enum is refused by name.
    beta.mass_cancel_scoped(6, MassCancelScope::NullVal, None, None)
        .unwrap();
    assert_eq!(mass_cancel_answer(&mut beta, 6), (0, 0, 5));
}
