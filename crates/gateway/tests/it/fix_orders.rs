//! FIX order entry through the gateway, end to end with an in-process engine.

use crate::common;

use bourse_client::{FixClient, FixClientConfig, FixMessage};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn login(gw: &common::TestGateway, comp_id: &str) -> FixClient {
    let cfg = FixClientConfig::new(gw.handle.fix_addr().unwrap(), comp_id, "BOURSE");
    FixClient::connect(&cfg).unwrap()
}

fn f(m: &FixMessage, tag: u32) -> &str {
    FixClient::field(m, tag as _).unwrap_or("")
}

fn exec(c: &mut FixClient) -> FixMessage {
    c.recv_type("8", WAIT)
        .unwrap()
        .expect("an execution report")
}

#[test]
fn two_sessions_trade_and_each_gets_its_fill() {
    let gw = common::start();
    let mut alpha = login(&gw, "ALPHA");
    let mut beta = login(&gw, "BETA");
    alpha
        .new_order("a1", None, "SBER", false, 100, Some("100.50"), '0')
        .unwrap();
    let new = exec(&mut alpha);
    assert_eq!((f(&new, 150), f(&new, 39), f(&new, 11)), ("0", "0", "a1"));
    assert_eq!(
        (f(&new, 44), f(&new, 38), f(&new, 151)),
        ("100.50", "100", "100")
    );

    beta.new_order("b1", Some(201), "SBER", true, 30, Some("101"), '0')
        .unwrap();
    assert_eq!(f(&exec(&mut beta), 150), "0");
    let fill_b = exec(&mut beta);
    assert_eq!((f(&fill_b, 150), f(&fill_b, 39)), ("F", "2"));
    assert_eq!(
        (f(&fill_b, 31), f(&fill_b, 32), f(&fill_b, 14)),
        ("100.50", "30", "30")
    );
    assert_eq!(f(&fill_b, 6), "100.500000");

    let fill_a = exec(&mut alpha);
    assert_eq!(
        (f(&fill_a, 150), f(&fill_a, 39), f(&fill_a, 11)),
        ("F", "1", "a1")
    );
    assert_eq!((f(&fill_a, 151), f(&fill_a, 14)), ("70", "30"));
}

#[test]
fn cancel_replace_and_mass_cancel_answer_with_their_reports() {
    let gw = common::start();
    let mut alpha = login(&gw, "ALPHA");
    alpha
        .new_order("o1", None, "SBER", true, 50, Some("99"), '0')
        .unwrap();
    let new = exec(&mut alpha);
    let order_id = f(&new, 37).to_string();

    alpha
        .replace("o2", "o1", "SBER", true, 80, "98.50")
        .unwrap();
    let rep = exec(&mut alpha);
    assert_eq!((f(&rep, 150), f(&rep, 11), f(&rep, 41)), ("5", "o2", "o1"));
    assert_eq!(
        (f(&rep, 44), f(&rep, 38), f(&rep, 37)),
        ("98.50", "80", order_id.as_str())
    );

    // The old id is gone: cancelling it is refused with OrderCancelReject.
    alpha.cancel("c0", "o1", "SBER", true).unwrap();
    let rej = alpha.recv_type("9", WAIT).unwrap().unwrap();
    assert_eq!((f(&rej, 434), f(&rej, 102), f(&rej, 11)), ("1", "1", "c0"));

    alpha.cancel("c1", "o2", "SBER", true).unwrap();
    let can = exec(&mut alpha);
    assert_eq!(
        (f(&can, 150), f(&can, 39), f(&can, 11), f(&can, 41)),
        ("4", "4", "c1", "o2")
    );

    for i in 0..3 {
        alpha
            .new_order(&format!("m{i}"), None, "SBER", false, 10, Some("105"), '0')
            .unwrap();
        exec(&mut alpha);
    }
    alpha.mass_cancel("mc1", Some("SBER")).unwrap();
    let report = alpha.recv_type("r", WAIT).unwrap().unwrap();
    assert_eq!(
        (f(&report, 531), f(&report, 533), f(&report, 11)),
        ("1", "3", "mc1")
    );
    for _ in 0..3 {
        assert_eq!(f(&exec(&mut alpha), 150), "4");
    }
    // Nothing is left behind in the gateway's tables (the stats are refreshed by its timer,
    // so wait for the snapshot that has counted all 8 requests).
    let stats = gw.handle.stats();
    use std::sync::atomic::Ordering::Relaxed;
    let clean = common::eventually(WAIT, || {
        stats.requests_in.load(Relaxed) == 8
            && stats.orders_tracked.load(Relaxed) == 0
            && stats.requests_pending.load(Relaxed) == 0
    });
    assert!(
        clean,
        "requests {}, orders tracked {}, requests pending {}",
        stats.requests_in.load(Relaxed),
        stats.orders_tracked.load(Relaxed),
        stats.requests_pending.load(Relaxed)
    );
}

#[test]
fn a_reject_names_the_core_reason() {
    let gw = common::start();
    let mut poor = login(&gw, "POOR");
    poor.new_order("p1", None, "SBER", true, 1000, Some("100"), '0')
        .unwrap();
    let rej = exec(&mut poor);
    assert_eq!((f(&rej, 150), f(&rej, 39), f(&rej, 103)), ("8", "8", "3"));
    assert_eq!(f(&rej, 58), "InsufficientCollateral");

    // Not a multiple of the lot (10): refused by the gateway itself.
    poor.new_order("p2", None, "SBER", true, 15, Some("100"), '0')
        .unwrap();
    let rej = exec(&mut poor);
    assert_eq!(f(&rej, 39), "8");
    assert!(f(&rej, 58).contains("lot"), "{rej:?}");

    // An account the session may not trade.
    poor.new_order("p3", Some(101), "SBER", true, 10, Some("100"), '0')
        .unwrap();
    let rej = exec(&mut poor);
    assert!(f(&rej, 58).contains("not authorized"), "{rej:?}");
}

#[test]
fn an_excess_message_is_throttled_and_the_session_stays_up() {
    let gw = common::start();
    let mut slow = login(&gw, "SLOW");
    for i in 0..5 {
        slow.new_order(&format!("s{i}"), None, "SBER", true, 10, Some("90"), '0')
            .unwrap();
    }
    let reject = slow
        .recv_type("j", WAIT)
        .unwrap()
        .expect("a business reject");
    assert!(f(&reject, 58).contains("throttle"), "{reject:?}");
    assert_eq!(f(&reject, 372), "D");
    std::thread::sleep(Duration::from_millis(1100));
    slow.new_order("later", None, "SBER", true, 10, Some("90"), '0')
        .unwrap();
    let mut saw_later = false;
    for _ in 0..6 {
        match slow.recv_type("8", WAIT).unwrap() {
            Some(m) if f(&m, 11) == "later" => {
                saw_later = true;
                break;
            }
            Some(_) => {}
            None => break,
        }
    }
    assert!(saw_later);
    assert!(slow.is_logged_on());
}

#[test]
fn a_drop_copy_session_receives_every_execution_report_of_its_firm() {
    let gw = common::start();
    let mut dc = login(&gw, "ALPHA-DC");
    let mut alpha = login(&gw, "ALPHA");
    let mut beta = login(&gw, "BETA");
    alpha
        .new_order("x1", None, "SBER", false, 20, Some("100"), '0')
        .unwrap();
    beta.new_order("y1", None, "SBER", true, 20, Some("100"), '0')
        .unwrap();
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let m = exec(&mut dc);
        assert_eq!(f(&m, 1), "101");
        kinds.push(f(&m, 150).to_string());
    }
    assert_eq!(kinds, ["0", "F"]);
    // Beta's reports (firm 2) never reach firm 1's drop copy.
    assert!(dc
        .recv_type("8", Duration::from_millis(300))
        .unwrap()
        .is_none());
    // A drop-copy session may not trade.
    dc.new_order("z", None, "SBER", true, 10, Some("100"), '0')
        .unwrap();
    let rej = exec(&mut dc);
    assert_eq!(f(&rej, 39), "8");
}

#[test]
fn fills_while_logged_off_arrive_after_the_next_logon() {
    let gw = common::start();
    let store = tempfile::tempdir().unwrap();
    let mut cfg = FixClientConfig::new(gw.handle.fix_addr().unwrap(), "ALPHA", "BOURSE");
    cfg.store_dir = Some(store.path().to_path_buf());
    let mut alpha = FixClient::connect(&cfg).unwrap();
    alpha
        .new_order("r1", None, "SBER", false, 10, Some("100"), '0')
        .unwrap();
    exec(&mut alpha);
    alpha.logout(WAIT).unwrap();
    drop(alpha);
    let mut beta = login(&gw, "BETA");
    beta.new_order("q1", None, "SBER", true, 10, Some("100"), '0')
        .unwrap();
    exec(&mut beta);
    exec(&mut beta);
    let mut alpha = FixClient::connect(&cfg).unwrap();
    let fill = exec(&mut alpha);
    assert_eq!((f(&fill, 150), f(&fill, 11)), ("F", "r1"));
    assert!(alpha
        .recv_type("8", Duration::from_millis(300))
        .unwrap()
        .is_none());
}

/// A NewOrderSingle with its fields exactly as given (no checks on the client's side).
fn raw_order(c: &mut FixClient, id: &str, symbol: &str, side: &str, qty: &str, price: &str) {
    let mut m = bourse_fix::OutMessage::new("D");
    m.push(11, id);
    m.push(55, symbol);
    m.push(54, side);
    m.push(60, "20260101-00:00:00.000");
    m.push(38, qty);
    m.push(40, "2");
    m.push(44, price);
    c.send(m).unwrap();
}

#[test]
fn a_rejected_order_is_reported_with_its_fields_as_sent() {
    let gw = common::start();
    let mut alpha = login(&gw, "ALPHA");
    // Unknown symbol, price off the 0.01 tick, quantity off the 10 lot, an unsupported Side.
    let cases = [
        ("e1", "NOPE", "1", "15", "99.995", "unknown symbol"),
        ("e2", "SBER", "1", "10", "99.995", "invalid price"),
        ("e3", "SBER", "2", "15", "100", "quantity"),
        ("e4", "SBER", "9", "10", "100", "unsupported"),
    ];
    for (id, symbol, side, qty, price, why) in cases {
        raw_order(&mut alpha, id, symbol, side, qty, price);
        let r = exec(&mut alpha);
        assert_eq!((f(&r, 11), f(&r, 150), f(&r, 39)), (id, "8", "8"), "{id}");
        assert!(f(&r, 58).contains(why), "{id}: {}", f(&r, 58));
        assert_eq!(
            (f(&r, 55), f(&r, 54), f(&r, 38), f(&r, 44)),
            (symbol, side, qty, price),
            "{id}: the request's fields as sent"
        );
    }
    alpha.logout(WAIT).unwrap();
}

#[test]
fn avg_px_is_rounded_to_six_decimals() {
    let gw = common::start();
    let mut alpha = login(&gw, "ALPHA");
    let mut beta = login(&gw, "BETA");
    // Three fills of 10 at 100.01, 100.01 and 100.02: average 100.013333...
    for (id, px) in [("s1", "100.01"), ("s2", "100.01"), ("s3", "100.02")] {
        alpha
            .new_order(id, None, "SBER", false, 10, Some(px), '0')
            .unwrap();
        exec(&mut alpha);
    }
    beta.new_order("b", None, "SBER", true, 30, Some("100.02"), '0')
        .unwrap();
    let mut last = None;
    while let Some(r) = beta.recv_type("8", WAIT).unwrap() {
        if f(&r, 39) == "2" {
            last = Some(r);
            break;
        }
    }
    let r = last.expect("filled");
    assert_eq!(f(&r, 6), "100.013333");
    // With two thirds: 100.016667, rounded up, not truncated.
    alpha
        .new_order("s4", None, "SBER", false, 10, Some("100.01"), '0')
        .unwrap();
    alpha
        .new_order("s5", None, "SBER", false, 10, Some("100.02"), '0')
        .unwrap();
    alpha
        .new_order("s6", None, "SBER", false, 10, Some("100.02"), '0')
        .unwrap();
    beta.new_order("b2", None, "SBER", true, 30, Some("100.02"), '0')
        .unwrap();
    let mut last = None;
    while let Some(r) = beta.recv_type("8", WAIT).unwrap() {
        if f(&r, 11) == "b2" && f(&r, 39) == "2" {
            last = Some(r);
            break;
        }
    }
    assert_eq!(f(&last.expect("filled"), 6), "100.016667");
    alpha.logout(WAIT).unwrap();
    beta.logout(WAIT).unwrap();
}

#[test]
fn a_mass_cancel_reaches_the_sessions_own_orders_unless_it_asks_for_the_account() {
    let gw = common::start();
    // BETA and SLOW trade the same account (201).
    let mut beta = login(&gw, "BETA");
    let mut slow = login(&gw, "SLOW");
    for id in ["m1", "m2"] {
        beta.new_order(id, None, "SBER", true, 10, Some("90"), '0')
            .unwrap();
        exec(&mut beta);
    }
    slow.new_order("s1", None, "SBER", true, 10, Some("90"), '0')
        .unwrap();
    exec(&mut slow);

    // By default, the session's own orders: two reports, and 533 says two.
    beta.mass_cancel("mc1", None).unwrap();
    let report = beta.recv_type("r", WAIT).unwrap().unwrap();
    assert_eq!((f(&report, 531), f(&report, 533)), ("7", "2"));
    for _ in 0..2 {
        let r = exec(&mut beta);
        assert_eq!((f(&r, 150), f(&r, 11)), ("4", "mc1"));
    }
    // SLOW's order is still live.
    slow.order_status("s1", Some("SBER"), Some(true), None)
        .unwrap();
    assert_eq!(f(&exec(&mut slow), 39), "0");

    // 530=8 with Account: every order of the account, whichever session entered it.
    let mut m = bourse_fix::OutMessage::new("q");
    m.push(11, "mc2");
    m.push(530, "8");
    m.push(1, "201");
    m.push(60, "20260101-00:00:00.000");
    beta.send(m).unwrap();
    let report = beta.recv_type("r", WAIT).unwrap().unwrap();
    assert_eq!((f(&report, 531), f(&report, 533)), ("8", "1"));
    let r = exec(&mut slow);
    assert_eq!((f(&r, 150), f(&r, 11)), ("4", "s1"), "the owner is told");
    beta.logout(WAIT).unwrap();
    slow.logout(WAIT).unwrap();
}

#[test]
fn a_client_that_reads_on_a_second_handle_gets_its_reports_through_feed() {
    use std::io::Read;
    let gw = common::start();
    let mut alpha = login(&gw, "ALPHA");
    // A driver that sends on one thread and reads on another: the reads happen on a clone of
    // the socket and the bytes are fed to the session.
    let mut socket = alpha.try_clone_socket().unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    alpha
        .new_order("f1", None, "SBER", false, 10, Some("100.50"), '0')
        .unwrap();
    alpha.cancel("f2", "f1", "SBER", false).unwrap();
    let mut ids = Vec::new();
    let mut buf = [0u8; 4096];
    while ids.len() < 2 {
        let n = socket.read(&mut buf).expect("the reports within the wait");
        assert!(n > 0, "the gateway closed the connection");
        alpha.feed(&buf[..n]).unwrap();
        while let Some(m) = alpha.recv(Duration::ZERO).unwrap() {
            ids.push((f(&m, 11).to_string(), f(&m, 150).to_string()));
        }
    }
    assert_eq!(
        ids,
        vec![("f1".into(), "0".into()), ("f2".into(), "4".into())]
    );
    // The session's numbers followed what was fed: it goes on as usual.
    alpha
        .new_order("f3", None, "SBER", false, 10, Some("100.50"), '0')
        .unwrap();
    assert_eq!(f(&exec(&mut alpha), 11), "f3");
    // Feeding the end of the connection closes the client.
    alpha.feed(&[]).unwrap();
    assert!(!alpha.is_logged_on());
}
