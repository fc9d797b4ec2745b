//! The router in front of two in-process cores: each order goes to the core that owns its
//! instrument, order ids come apart by core, a cancel follows its order, and a mass cancel
//! without an instrument reaches both cores and is answered by one report that adds them up.

use bourse_core::*;
use bourse_engine::{EngineConfig, ORDER_ID_CORE_SHIFT};
use bourse_gateway::router::{
    ClientId, ExecKind, MassCancelScope, NewOrderRequest, Report, Request, Router, SessionRef,
};
use bourse_gateway::GatewayConfig;
use std::time::{Duration, Instant};

const CONFIG: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"

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
reference_price = 25000

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

[[fix_sessions]]
client_comp_id = "ALPHA"
firm = 1
accounts = [101]
"#;

/// A router over two cores whose engines number orders from their core's base.
fn two_cores() -> (Router, GatewayConfig) {
    let config = GatewayConfig::from_toml(CONFIG).unwrap();
    let links = bourse_engine::in_process::engine_links(
        config.core_plan().len(),
        EngineConfig {
            orders_max: 1_000,
            instruments_max: 8,
            accounts_max: 16,
            levels_per_side_hint: 8,
            first_order_id: 0,
        },
        config.gateway.core_queue_depth,
    );
    let mut router = Router::new(&config, links);
    bourse_gateway::bootstrap::bootstrap(&mut router, &config).unwrap();
    (router, config)
}

/// Polls the cores until `n` reports are waiting (bounded in time), and takes them.
fn reports(router: &mut Router, n: usize) -> Vec<Report> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "only {got:?}");
        if router.poll_core(1024) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        got.extend(router.take_outbox().into_iter().map(|(_, r)| r));
    }
    // Anything more that is already there would be a report too many.
    std::thread::sleep(Duration::from_millis(20));
    router.poll_core(1024);
    got.extend(router.take_outbox().into_iter().map(|(_, r)| r));
    got
}

fn order(client: &str, instrument: u32, price: i64, qty_lots: i64) -> NewOrderRequest {
    NewOrderRequest {
        client: ClientId::Text(client.into()),
        account: None,
        instrument: InstrumentId(instrument),
        side: Side::Buy,
        ord_type: OrdType::Limit,
        price: Price(price),
        qty_lots,
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_lots: 0,
    }
}

fn accepted_id(r: &Report) -> OrderId {
    match r {
        Report::Exec(e) if e.kind == ExecKind::New => e.order_id.unwrap(),
        other => panic!("expected a New report, got {other:?}"),
    }
}

#[test]
fn each_order_goes_to_the_core_of_its_instrument() {
    let (mut router, _) = two_cores();
    let alpha = SessionRef(0);
    router.handle(alpha, Request::New(order("eq1", 1, 24_000, 1)), 1);
    router.handle(alpha, Request::New(order("fx1", 2, 107_000, 1)), 1);
    let got = reports(&mut router, 2);
    assert_eq!(got.len(), 2, "{got:?}");
    let mut ids: Vec<(ClientId, OrderId)> = got
        .iter()
        .map(|r| match r {
            Report::Exec(e) => (e.client.clone(), accepted_id(r)),
            _ => unreachable!(),
        })
        .collect();
    ids.sort_by_key(|(_, id)| *id);
    // Core 0 numbers from 1, core 1 from 1 << ORDER_ID_CORE_SHIFT: the id tells the core.
    assert_eq!(ids[0].0, ClientId::Text("eq1".into()));
    assert!(ids[0].1 .0 < 1 << ORDER_ID_CORE_SHIFT);
    assert_eq!(ids[1].0, ClientId::Text("fx1".into()));
    assert_eq!(ids[1].1 .0 >> ORDER_ID_CORE_SHIFT, 1);
    assert_eq!(router.core_in_flight(0), 0);
    assert_eq!(router.core_in_flight(1), 0);

    // A cancel goes where its order lives (core 1 knows nothing of core 0's orders, so a
    // cancel sent to the wrong core would come back as a reject).
    let cancel = Request::Cancel {
        client: ClientId::Text("c1".into()),
        orig: ClientId::Text("fx1".into()),
        order_id: None,
    };
    router.handle(alpha, cancel, 2);
    let got = reports(&mut router, 1);
    match &got[..] {
        [Report::Exec(e)] => {
            assert!(matches!(e.kind, ExecKind::Canceled { .. }), "{e:?}");
            assert_eq!(e.order_id, Some(ids[1].1));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(router.tracked_orders(), 1);
}

#[test]
fn a_mass_cancel_without_instrument_reaches_every_core_and_reports_once() {
    let (mut router, _) = two_cores();
    let alpha = SessionRef(0);
    router.handle(alpha, Request::New(order("eq1", 1, 24_000, 1)), 1);
    router.handle(alpha, Request::New(order("eq2", 1, 24_100, 2)), 1);
    router.handle(alpha, Request::New(order("fx1", 2, 107_000, 1)), 1);
    let got = reports(&mut router, 3);
    assert_eq!(got.len(), 3, "{got:?}");
    let mass_cancel = Request::MassCancel {
        client: ClientId::Text("m1".into()),
        request_type: b'7',
        scope: MassCancelScope::Session,
        account: None,
        instrument: None,
        side: None,
    };
    router.handle(alpha, mass_cancel, 2);
    let got = reports(&mut router, 4);
    let cancels = got
        .iter()
        .filter(|r| {
            matches!(r, Report::Exec(e) if matches!(&e.kind,
                ExecKind::Canceled { by: Some(ClientId::Text(t)), .. } if &**t == "m1"))
        })
        .count();
    let mass: Vec<&Report> = got
        .iter()
        .filter(|r| matches!(r, Report::MassCancel { .. }))
        .collect();
    assert_eq!(cancels, 3, "{got:?}");
    assert_eq!(mass.len(), 1, "one report for both cores: {got:?}");
    match mass[0] {
        Report::MassCancel {
            client,
            total,
            reject,
            ..
        } => {
            assert_eq!(client, &ClientId::Text("m1".into()));
            assert_eq!(*total, 3);
            assert!(reject.is_none());
        }
        _ => unreachable!(),
    }
    // The cancels were the last report before the aggregate.
    assert!(matches!(got.last(), Some(Report::MassCancel { .. })));
    assert_eq!(router.tracked_orders(), 0);

    // By instrument, only the owning core is asked: nothing left there, total 0.
    let mass_cancel = Request::MassCancel {
        client: ClientId::Text("m2".into()),
        request_type: b'1',
        scope: MassCancelScope::Session,
        account: None,
        instrument: Some(InstrumentId(2)),
        side: None,
    };
    router.handle(alpha, mass_cancel, 3);
    let got = reports(&mut router, 1);
    assert!(
        matches!(
            &got[..],
            [Report::MassCancel {
                total: 0,
                reject: None,
                ..
            }]
        ),
        "{got:?}"
    );
}

#[test]
fn bootstrap_twice_adds_nothing_twice() {
    let (mut router, config) = two_cores();
    // A second bootstrap against the same cores (a gateway restarted in front of replicated
    // cores): every instrument and account is already there, so it succeeds and deposits
    // nothing again.
    bourse_gateway::bootstrap::bootstrap(&mut router, &config).unwrap();
    // Cash was deposited once: an order that needs more than half of it still fits, and a
    // second one of the same size does not.
    // The account has 10^7 of currency (10^11 cash units of 10^-4); an order of 3,000 lots of
    // 10 units at 250.00 reserves 7.5 × 10^6: the first fits, the second does not.
    let big = |id: &str| order(id, 1, 25_000, 3_000);
    router.handle(SessionRef(0), Request::New(big("b1")), 1);
    router.handle(SessionRef(0), Request::New(big("b2")), 1);
    let got = reports(&mut router, 2);
    let kinds: Vec<bool> = got
        .iter()
        .map(|r| matches!(r, Report::Exec(e) if e.kind == ExecKind::New))
        .collect();
    assert_eq!(kinds, vec![true, false], "{got:?}");
}
