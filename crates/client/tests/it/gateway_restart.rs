//! A gateway in front of a replicated core restarts in the middle of trading: orders another
//! session sent just before the stop are all answered, what another gateway traded against
//! this gateway's resting orders while it was away is reported to their owner once, status
//! requests answer the true state of open and finished orders, the FIX sessions resume their
//! sequence numbers, and trading continues on the restored orders.

use crate::cluster;

use bourse_client::{FixClient, FixClientConfig, FixMessage};
use cluster::{gateway_config, start_gateway, Group};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

const SESSIONS: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"
connections_max = 64
throttle_msgs_per_s = 10000
logon_timeout_ms = 2000

[core]
bootstrap = true

[[instruments]]
instrument = 1
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 10
band_bps = 2000
reference_price = 10000

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

[[accounts]]
account = 301
firm = 3
cash = 100000000000
may_short = true
"#;

const G1_SESSIONS: &str = r#"
[[fix_sessions]]
client_comp_id = "ALPHA"
firm = 1
accounts = [101]

[[fix_sessions]]
client_comp_id = "BETA"
firm = 2
accounts = [201]
"#;

const G2_SESSIONS: &str = r#"
[[fix_sessions]]
client_comp_id = "GAMMA"
firm = 3
accounts = [301]
"#;

fn f(m: &FixMessage, tag: u32) -> &str {
    FixClient::field(m, tag as _).unwrap_or("")
}

fn login(addr: std::net::SocketAddr, comp_id: &str, store: &Path) -> FixClient {
    let mut c = FixClientConfig::new(addr, comp_id, "BOURSE");
    c.store_dir = Some(store.join(comp_id));
    FixClient::connect(&c).unwrap()
}

/// Every execution report a session received, in order.
#[derive(Default)]
struct Seen {
    reports: Vec<FixMessage>,
}

impl Seen {
    /// Reads reports until one matches `want` (keeping all), at most WAIT.
    fn until(&mut self, c: &mut FixClient, what: &str, want: impl Fn(&FixMessage) -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no report: {what}");
            if let Some(m) = c.recv_type("8", left).unwrap() {
                let hit = want(&m);
                self.reports.push(m);
                if hit {
                    return;
                }
            }
        }
    }

    /// Reads whatever arrives within `quiet` of silence.
    fn drain(&mut self, c: &mut FixClient, quiet: Duration) {
        while let Some(m) = c.recv_type("8", quiet).unwrap() {
            self.reports.push(m);
        }
    }

    /// Trade reports (ExecType F) of one client order id: (LastQty, CumQty).
    fn fills(&self, cl_ord_id: &str) -> Vec<(String, String)> {
        self.reports
            .iter()
            .filter(|m| f(m, 150) == "F" && f(m, 11) == cl_ord_id)
            .map(|m| (f(m, 32).to_string(), f(m, 14).to_string()))
            .collect()
    }
}

fn status(c: &mut FixClient, cl_ord_id: &str) -> FixMessage {
    let req = format!("st-{cl_ord_id}");
    c.order_status(cl_ord_id, Some("SBER"), None, Some(&req))
        .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = c
            .recv_type("8", left)
            .unwrap()
            .unwrap_or_else(|| panic!("no status answer for {cl_ord_id}"));
        if f(&m, 790) == req {
            return m;
        }
    }
}

#[test]
fn a_gateway_restarted_mid_trading_keeps_its_orders_and_loses_or_doubles_no_report() {
    let started = Instant::now();
    let group = Group::start();
    let dir1 = tempfile::tempdir().unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let clients = tempfile::tempdir().unwrap();
    let config1 = || gateway_config(&format!("{SESSIONS}{G1_SESSIONS}"), &group, 1, dir1.path());
    let g1 = start_gateway(config1());
    let addr1 = g1.fix_addr().unwrap();
    let mut alpha = login(addr1, "ALPHA", clients.path());
    let mut beta = login(addr1, "BETA", clients.path());
    let mut a = Seen::default();
    let mut b = Seen::default();
    fn new(s: &str) -> impl Fn(&FixMessage) -> bool + '_ {
        move |m| f(m, 11) == s && f(m, 150) == "0"
    }

    // Alpha rests five orders; a3 is cancelled.
    for (id, buy, qty, px) in [
        ("a1", false, 100, "100"),
        ("a2", false, 50, "101"),
        ("a3", false, 10, "102"),
        ("a4", true, 10, "90"),
        ("a5", false, 10, "105"),
    ] {
        alpha
            .new_order(id, None, "SBER", buy, qty, Some(px), '1')
            .unwrap();
        a.until(&mut alpha, id, new(id));
    }
    alpha.cancel("a3-x", "a3", "SBER", false).unwrap();
    a.until(&mut alpha, "a3 cancelled", |m| f(m, 150) == "4");
    // Beta trades: a1 filled (30 + 70), a2 partly (20 of 50).
    beta.new_order("b1", None, "SBER", true, 30, Some("100"), '1')
        .unwrap();
    b.until(&mut beta, "b1 filled", |m| {
        f(m, 11) == "b1" && f(m, 39) == "2"
    });
    beta.new_order("b2", None, "SBER", true, 90, Some("101"), '1')
        .unwrap();
    b.until(&mut beta, "b2 filled", |m| {
        f(m, 11) == "b2" && f(m, 39) == "2"
    });
    a.until(&mut alpha, "a2 partly filled", |m| {
        f(m, 11) == "a2" && f(m, 150) == "F"
    });
    // Beta fires 20 resting orders and the gateway stops at once, some of them in flight.
    for n in 0..20 {
        beta.new_order(&format!("r{n}"), None, "SBER", true, 10, Some("85"), '1')
            .unwrap();
    }
    g1.shutdown();
    a.drain(&mut alpha, Duration::from_millis(200));
    b.drain(&mut beta, Duration::from_millis(200));
    drop((alpha, beta));
    let saved = std::fs::read_dir(dir1.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name() == "orders.state");
    assert!(saved, "the stopped gateway saved its order state");

    // While gateway 1 is down, another gateway's client fills 20 more of a2 and all of a4.
    let g2 = start_gateway(gateway_config(
        &format!("{SESSIONS}{G2_SESSIONS}"),
        &group,
        2,
        dir2.path(),
    ));
    let mut gamma = login(g2.fix_addr().unwrap(), "GAMMA", clients.path());
    let mut g = Seen::default();
    gamma
        .new_order("g1", None, "SBER", true, 20, Some("101"), '3')
        .unwrap();
    g.until(&mut gamma, "g1 filled", |m| {
        f(m, 11) == "g1" && f(m, 39) == "2"
    });
    gamma
        .new_order("g2", None, "SBER", false, 10, Some("90"), '3')
        .unwrap();
    g.until(&mut gamma, "g2 filled", |m| {
        f(m, 11) == "g2" && f(m, 39) == "2"
    });

    // Gateway 1 comes back on the same store.
    let g1 = start_gateway(config1());
    let addr1 = g1.fix_addr().unwrap();
    let mut alpha = login(addr1, "ALPHA", clients.path());
    let mut beta = login(addr1, "BETA", clients.path());
    assert!(alpha.next_sender_seq_num() > 8, "ALPHA's session resumed");
    // What happened while it was away reaches alpha, once.
    a.until(&mut alpha, "a4 filled while away", |m| {
        f(m, 11) == "a4" && f(m, 39) == "2"
    });
    a.drain(&mut alpha, Duration::from_millis(300));
    assert_eq!(
        a.fills("a2"),
        vec![("20".into(), "20".into()), ("20".into(), "40".into())]
    );
    assert_eq!(a.fills("a4"), vec![("10".into(), "10".into())]);
    assert_eq!(
        a.fills("a1"),
        vec![("30".into(), "30".into()), ("70".into(), "100".into())]
    );

    // Status: the true state of open and finished orders.
    let expect = [
        ("a1", "2", "100", "0"),
        ("a2", "1", "40", "10"),
        ("a3", "4", "0", "0"),
        ("a4", "2", "10", "0"),
        ("a5", "0", "0", "10"),
    ];
    for (id, ord_status, cum, leaves) in expect {
        let st = status(&mut alpha, id);
        assert_eq!(
            (f(&st, 150), f(&st, 39), f(&st, 14), f(&st, 151)),
            ("I", ord_status, cum, leaves),
            "status of {id}: {st:?}"
        );
    }
    // Beta's 20 orders sent before the stop: each accepted exactly once (answered before
    // the stop, or resent by the client after it and answered now), all live.
    b.drain(&mut beta, Duration::from_millis(300));
    let live = beta.live_orders("all", None, WAIT).unwrap();
    let live_ids: HashSet<&str> = live.iter().map(|m| f(m, 11)).collect();
    let want: HashSet<String> = (0..20).map(|n| format!("r{n}")).collect();
    assert_eq!(
        live_ids,
        want.iter().map(String::as_str).collect::<HashSet<_>>()
    );
    let mut news: BTreeMap<&str, usize> = BTreeMap::new();
    for m in b.reports.iter().filter(|m| f(m, 150) == "0") {
        *news.entry(f(m, 11)).or_default() += 1;
    }
    assert!(
        news.values().all(|&n| n == 1),
        "an order acknowledged twice: {news:?}"
    );

    // Trading continues on the restored orders: a5 is cancelled, a2 is filled.
    alpha.cancel("a5-x", "a5", "SBER", false).unwrap();
    a.until(&mut alpha, "a5 cancelled", |m| {
        f(m, 150) == "4" && f(m, 41) == "a5"
    });
    beta.new_order("b3", None, "SBER", true, 10, Some("101"), '3')
        .unwrap();
    a.until(&mut alpha, "a2 filled", |m| {
        f(m, 11) == "a2" && f(m, 39) == "2"
    });
    assert_eq!(a.fills("a2").last().unwrap().1, "50");
    // No report twice: every ExecID once.
    let mut ids = HashSet::new();
    for m in &a.reports {
        assert!(ids.insert(f(m, 17).to_string()), "ExecID twice: {m:?}");
    }
    drop((alpha, beta, gamma));
    g1.shutdown();
    g2.shutdown();
    group.shutdown();
    eprintln!("restart test took {:?}", started.elapsed());
}

/// Submits `n` new orders (cl_ord_id `first + i`, key seq `i + 1`) through a link.
fn submit_orders(link: &mut bourse_cluster::link::ClusterLink, first: u64, n: u64) {
    use bourse_core::*;
    use bourse_gateway::{CoreLink, RequestKey, SubmitError};
    for i in 0..n {
        let cmd = Command::new(
            1,
            CommandBody::NewOrder(NewOrder {
                firm: None,
                account: AccountId(101),
                cl_ord_id: ClOrdId(first + i),
                instrument: InstrumentId(1),
                side: Side::Buy,
                ord_type: OrdType::Limit,
                price: Price(9_000),
                qty: Qty(1),
                tif: TimeInForce::Day,
                expire_ts_ns: 0,
                display_qty: Qty(0),
            }),
        );
        let key = RequestKey {
            session: 1,
            seq: i + 1,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            match link.submit(key, cmd.clone()) {
                Ok(()) => break,
                Err(SubmitError::Full | SubmitError::NoQuorum) => {
                    assert!(Instant::now() < deadline, "link stayed full");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(SubmitError::Closed) => panic!("link closed"),
            }
        }
    }
}

#[test]
fn a_restarted_gateway_never_reuses_the_request_keys_of_its_previous_run() {
    use bourse_cluster::link::{ClusterLink, ClusterLinkConfig};
    use bourse_core::Event;
    use bourse_gateway::recovery::Recovery;
    use bourse_gateway::{CoreLink, CoreOutput};
    let group = Group::start();
    let link_config = |r: &Recovery| ClusterLinkConfig {
        from_index: r.resume_index(0),
        ..ClusterLinkConfig::new(group.addrs(), r.link_client_id(5), 1024)
    };
    let dir = tempfile::tempdir().unwrap();
    let config = gateway_config(&format!("{SESSIONS}{G1_SESSIONS}"), &group, 5, dir.path());
    // A first run bootstraps the core (instrument, accounts).
    start_gateway(config.clone()).shutdown();
    // A run that dies with 300 requests in flight: its link goes away without waiting.
    let r1 = Recovery::open(&config).unwrap();
    let mut link1 = ClusterLink::start(link_config(&r1)).unwrap();
    submit_orders(&mut link1, 1_000, 300);
    drop(link1);
    // The next run starts at once: each of its requests must be answered with its own
    // command's events (cl_ord_id 100_000 + i under key seq i + 1), never with an event of
    // the previous run's request that had the same number.
    let r2 = Recovery::open(&config).unwrap();
    assert_eq!(r2.epoch, r1.epoch + 1);
    let mut link2 = ClusterLink::start(link_config(&r2)).unwrap();
    submit_orders(&mut link2, 100_000, 100);
    let mut answered: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut done = 0;
    let deadline = Instant::now() + WAIT;
    while done < 100 {
        assert!(Instant::now() < deadline, "{done} of 100 requests answered");
        match link2.try_recv() {
            Some(CoreOutput::Done { .. }) => done += 1,
            Some(CoreOutput::Event {
                key,
                event:
                    Event::OrderAccepted { cl_ord_id, .. } | Event::OrderRejected { cl_ord_id, .. },
            }) if key.session == 1 => answered.entry(key.seq).or_default().push(cl_ord_id.0),
            Some(_) => {}
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    for seq in 1..=100u64 {
        assert_eq!(
            answered.get(&seq),
            Some(&vec![100_000 + seq - 1]),
            "request {seq} answered with another request's events"
        );
    }
    drop(link2);
    group.shutdown();
}

/// Submits one command through `link` under `key` and waits for its answer (its events).
fn submit_and_wait(
    link: &mut bourse_cluster::link::ClusterLink,
    key: bourse_gateway::RequestKey,
    command: bourse_core::Command,
) -> Vec<bourse_core::Event> {
    use bourse_gateway::{CoreLink, CoreOutput, SubmitError};
    let deadline = Instant::now() + WAIT;
    loop {
        match link.submit(key, command.clone()) {
            Ok(()) => break,
            Err(SubmitError::Full | SubmitError::NoQuorum) => {
                assert!(Instant::now() < deadline, "the link never took the command");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(SubmitError::Closed) => panic!("link closed"),
        }
    }
    let mut events = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "no answer to the command");
        match link.try_recv() {
            Some(CoreOutput::Done { key: k }) if k == key => return events,
            Some(CoreOutput::Event { key: k, event }) if k == key => events.push(event),
            Some(_) => {}
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

#[test]
fn a_gateway_restarted_on_its_saved_state_still_routes_an_instrument_added_at_run_time() {
    use bourse_client::{BinaryClient, Received, Response};
    use bourse_cluster::link::{ClusterLink, ClusterLinkConfig};
    use bourse_core::*;
    use bourse_wire::order_entry::codec::time_in_force::TimeInForce as BinTif;
    const RTS: u32 = 3;
    let group = Group::start();
    let dir = tempfile::tempdir().unwrap();
    let clients = tempfile::tempdir().unwrap();
    let text = format!(
        "{}{G1_SESSIONS}\n[[binary_sessions]]\ncredentials = \"BIN\"\nfirm = 2\naccounts = [201]\n",
        SESSIONS.replace(
            "fix_listen = \"127.0.0.1:0\"",
            "fix_listen = \"127.0.0.1:0\"\nbinary_listen = \"127.0.0.1:0\""
        )
    );
    let config = || gateway_config(&text, &group, 1, dir.path());
    let g1 = start_gateway(config());

    // An operator adds RTS (futures, instrument 3) at run time, through a link of its own.
    let mut ops = ClusterLink::start(ClusterLinkConfig::new(group.addrs(), 77, 64)).unwrap();
    let rts = Instrument {
        instrument: InstrumentId(RTS),
        symbol: "RTS".into(),
        market: Market::Futures,
        price_scale: 0,
        tick: Price(10),
        lot_size: 1,
        multiplier: 1,
        initial_margin: Cash(5_000),
        band_bps: 1_000,
        reference_price: Price(110_000),
        volatility: Default::default(),
    };
    let key = bourse_gateway::RequestKey { session: 1, seq: 1 };
    let events = submit_and_wait(
        &mut ops,
        key,
        Command::new(1, CommandBody::AddInstrument(rts)),
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::InstrumentAdded { instrument, .. } if instrument.0 == RTS)),
        "{events:?}"
    );
    drop(ops);

    // The running gateway learns it from its stream (retried until it has read the event):
    // alpha rests a sell at 120,000 by symbol.
    let mut alpha = login(g1.fix_addr().unwrap(), "ALPHA", clients.path());
    let mut a = Seen::default();
    let deadline = Instant::now() + WAIT;
    let mut attempt = 0;
    let resting = loop {
        attempt += 1;
        let cl = format!("s1-{attempt}");
        alpha
            .new_order(&cl, None, "RTS", false, 1, Some("120000"), '0')
            .unwrap();
        a.until(&mut alpha, &cl, |m| {
            f(m, 11) == cl && (f(m, 150) == "0" || f(m, 150) == "8")
        });
        if a.reports.last().is_some_and(|m| f(m, 150) == "0") {
            break cl;
        }
        assert!(Instant::now() < deadline, "RTS never routable over FIX");
        std::thread::sleep(Duration::from_millis(20));
    };
    g1.shutdown();
    drop(alpha);
    // The saved state keeps RTS: the restarted gateway's link resumes after its addition.
    let state = bourse_gateway::recovery::read_state(dir.path())
        .unwrap()
        .expect("a saved state");
    let learned: Vec<(u32, u32, &str)> = state
        .instruments
        .iter()
        .map(|i| (i.core, i.instrument.0, i.definition.symbol.as_str()))
        .collect();
    assert_eq!(learned, vec![(0, RTS, "RTS")]);

    // Restarted on that state: RTS is routed at once, over FIX by symbol and binary by id.
    let g1 = start_gateway(config());
    let mut alpha = login(g1.fix_addr().unwrap(), "ALPHA", clients.path());
    alpha
        .new_order("s2", None, "RTS", false, 1, Some("110000"), '0')
        .unwrap();
    a.until(&mut alpha, "s2 answered", |m| f(m, 11) == "s2");
    assert_eq!(f(a.reports.last().unwrap(), 150), "0", "s2 accepted");
    let mut bin = BinaryClient::connect(g1.binary_addr().unwrap(), "BIN", 30_000, 1).unwrap();
    bin.new_order(1, 201, RTS, true, 2, Some(120_000), BinTif::Day)
        .unwrap();
    // The buy takes s2 at 110,000, then the restored resting order at 120,000.
    let mut fills = Vec::new();
    let deadline = Instant::now() + WAIT;
    while fills.len() < 2 {
        assert!(Instant::now() < deadline, "binary fills so far: {fills:?}");
        if let Some(Received { response, .. }) = bin.recv(Duration::from_millis(100)).unwrap() {
            match response {
                Response::Execution {
                    cl_ord_id: 1,
                    last_px,
                    last_qty,
                    ..
                } => fills.push((last_px, last_qty)),
                Response::OrderReject {
                    cl_ord_id: 1,
                    reason,
                } => {
                    panic!("binary order in RTS refused: reason {reason}")
                }
                _ => {}
            }
        }
    }
    assert_eq!(fills, vec![(110_000, 1), (120_000, 1)]);
    a.until(&mut alpha, "s2 filled", |m| {
        f(m, 11) == "s2" && f(m, 150) == "F"
    });
    a.until(&mut alpha, "the restored order filled", |m| {
        f(m, 11) == resting && f(m, 150) == "F"
    });
    drop((alpha, bin));
    g1.shutdown();
    group.shutdown();
}
