//! Order status (FIX 35=H and 35=AF) and a gateway in front of two cores, end to end over FIX
//! with in-process engines.

use crate::common;

use bourse_client::{FixClient, FixClientConfig, FixMessage};
use bourse_engine::ORDER_ID_CORE_SHIFT;
use bourse_gateway::GatewayConfig;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn login(addr: std::net::SocketAddr, comp_id: &str) -> FixClient {
    FixClient::connect(&FixClientConfig::new(addr, comp_id, "BOURSE")).unwrap()
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
fn order_status_reports_fills_leaves_and_average_price() {
    let gw = common::start();
    let addr = gw.handle.fix_addr().unwrap();
    let mut alpha = login(addr, "ALPHA");
    let mut beta = login(addr, "BETA");
    let mut dc = login(addr, "ALPHA-DC");
    alpha
        .new_order("a1", None, "SBER", false, 100, Some("100.50"), '0')
        .unwrap();
    assert_eq!(f(&exec(&mut alpha), 150), "0");
    beta.new_order("b1", None, "SBER", true, 30, Some("101"), '3')
        .unwrap();
    assert_eq!(f(&exec(&mut beta), 150), "0");
    assert_eq!(f(&exec(&mut beta), 39), "2");
    assert_eq!(f(&exec(&mut alpha), 150), "F");
    let order_id = {
        alpha
            .order_status("a1", Some("SBER"), Some(false), Some("st1"))
            .unwrap();
        let st = exec(&mut alpha);
        assert_eq!((f(&st, 150), f(&st, 39), f(&st, 11)), ("I", "1", "a1"));
        assert_eq!((f(&st, 14), f(&st, 151), f(&st, 38)), ("30", "70", "100"));
        assert_eq!(
            (f(&st, 6), f(&st, 790), f(&st, 55)),
            ("100.500000", "st1", "SBER")
        );
        f(&st, 37).to_string()
    };
    // By OrderID alone (the ClOrdID names nothing live), the same order.
    let mut m = bourse_fix::OutMessage::new("H");
    m.push(11, "no-such-id");
    m.push(37, order_id.as_str());
    alpha.send(m).unwrap();
    let st = exec(&mut alpha);
    assert_eq!(
        (f(&st, 150), f(&st, 39), f(&st, 37)),
        ("I", "1", order_id.as_str())
    );

    // Unknown order: ExecType=I, OrdStatus=8, OrdRejReason=5 (unknown order).
    alpha
        .order_status("nope", Some("SBER"), Some(true), None)
        .unwrap();
    let st = exec(&mut alpha);
    assert_eq!((f(&st, 150), f(&st, 39), f(&st, 103)), ("I", "8", "5"));
    assert_eq!((f(&st, 11), f(&st, 37), f(&st, 54)), ("nope", "NONE", "1"));
    assert!(f(&st, 58).contains("unknown order"), "{st:?}");
    // Another session cannot see alpha's order, by either id.
    beta.order_status("a1", None, None, None).unwrap();
    let st = exec(&mut beta);
    assert_eq!((f(&st, 39), f(&st, 103)), ("8", "5"));

    // Mass status: every live order, the last flagged; beta has none live (its IOC is done).
    alpha
        .new_order("a2", None, "SBER", true, 10, Some("99"), '0')
        .unwrap();
    assert_eq!(f(&exec(&mut alpha), 150), "0");
    let live = alpha.live_orders("ms1", None, WAIT).unwrap();
    let ids: Vec<(&str, &str, &str)> = live
        .iter()
        .map(|m| (f(m, 11), f(m, 911), f(m, 39)))
        .collect();
    assert_eq!(ids, vec![("a1", "2", "1"), ("a2", "2", "0")]);
    assert_eq!(f(&live[1], 912), "Y");
    assert_eq!(f(&live[0], 912), "N");
    assert!(beta.live_orders("ms2", None, WAIT).unwrap().is_empty());

    // Status answers are the asking session's alone: the drop copy saw the order's reports
    // (new, fill, new of a2) and no status report.
    let mut copied = Vec::new();
    while let Some(m) = dc.recv(Duration::from_millis(300)).unwrap() {
        copied.push(f(&m, 150).to_string());
    }
    assert_eq!(copied, vec!["0", "F", "0"]);
}

const TWO_CORES: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"
throttle_msgs_per_s = 1000

[core]
bootstrap = true

[[cores]]
name = "equities"
instruments = [1]
in_process = true

[[cores]]
name = "fx"
instruments = [2]
in_process = true

[[instruments]]
instrument = 1
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 10
band_bps = 2000
reference_price = 10000

[[instruments]]
instrument = 2
symbol = "EURUSD"
market = "fx"
price_scale = 5
tick = 1
lot_size = 1000
band_bps = 500
reference_price = 108000

[[accounts]]
account = 101
firm = 1
cash = 100000000000
may_short = true

[[accounts]]
account = 201
firm = 2
cash = 100000000000
may_short = true

[[fix_sessions]]
client_comp_id = "ALPHA"
firm = 1
accounts = [101]

[[fix_sessions]]
client_comp_id = "BETA"
firm = 2
accounts = [201]
"#;

#[test]
fn two_cores_trade_apart_and_a_mass_cancel_spans_both() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::from_toml(TWO_CORES).unwrap();
    config.gateway.store_dir = dir.path().to_path_buf();
    let links = bourse_engine::in_process::engine_links(
        config.core_plan().len(),
        common::engine_config(),
        config.gateway.core_queue_depth,
    );
    let handle = bourse_gateway::spawn_cores(config, links, None).unwrap();
    let addr = handle.fix_addr().unwrap();
    let mut alpha = login(addr, "ALPHA");
    let mut beta = login(addr, "BETA");
    alpha
        .new_order("e1", None, "SBER", false, 50, Some("100"), '0')
        .unwrap();
    alpha
        .new_order("x1", None, "EURUSD", false, 5000, Some("1.08"), '0')
        .unwrap();
    // The two orders go to different cores, so their acks may come back in either order.
    let mut acks = [exec(&mut alpha), exec(&mut alpha)];
    acks.sort_by(|a, b| f(a, 11).cmp(f(b, 11)));
    let [e1, x1] = acks;
    let id = |m: &FixMessage| f(m, 37).parse::<u64>().unwrap();
    assert_eq!((f(&e1, 11), id(&e1) >> ORDER_ID_CORE_SHIFT), ("e1", 0));
    assert_eq!((f(&x1, 11), id(&x1) >> ORDER_ID_CORE_SHIFT), ("x1", 1));
    // A trade on the FX core: the resting side (alpha) hears of it, routed by order id.
    beta.new_order("bx", None, "EURUSD", true, 2000, Some("1.08"), '0')
        .unwrap();
    assert_eq!(f(&exec(&mut beta), 150), "0");
    let fill = exec(&mut beta);
    assert_eq!(
        (f(&fill, 150), f(&fill, 39), f(&fill, 32)),
        ("F", "2", "2000")
    );
    let rest = exec(&mut alpha);
    assert_eq!(
        (f(&rest, 11), f(&rest, 150), f(&rest, 151)),
        ("x1", "F", "3000")
    );
    // One mass cancel for all of alpha's orders: one cancel per order, from both cores, and
    // one OrderMassCancelReport that adds them up.
    alpha.mass_cancel("m1", None).unwrap();
    let mut cancelled = vec![f(&exec(&mut alpha), 41).to_string()];
    cancelled.push(f(&exec(&mut alpha), 41).to_string());
    cancelled.sort();
    assert_eq!(cancelled, vec!["e1", "x1"]);
    let report = alpha
        .recv_type("r", WAIT)
        .unwrap()
        .expect("a mass cancel report");
    assert_eq!(
        (f(&report, 11), f(&report, 533), f(&report, 531)),
        ("m1", "2", "7")
    );
    assert!(alpha
        .recv_type("r", Duration::from_millis(200))
        .unwrap()
        .is_none());
    assert!(alpha.live_orders("ms", None, WAIT).unwrap().is_empty());
    handle.shutdown();
}
