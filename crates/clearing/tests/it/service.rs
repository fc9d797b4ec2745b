//! The clearing service (`ClearingNode`) against a replicated core (three nodes over TCP):
//! it follows the stream, answers clearing data over HTTP, runs on an operator's request
//! (and only an operator's), closes the day (Day orders expire once), writes per-firm
//! reports; restarted from its snapshot it reaches the same state as a fresh node that read
//! the streams from index 0; a standby takes over a run stopped half way and applies nothing
//! twice.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bourse_admin::AdminClient;
use bourse_auth::{hash_password_with, CredentialEntry, HashCost};
use std::collections::BTreeMap;

use bourse_clearing::fix::{self, business_date, field, group, FixSection, PositionsClient};
use bourse_clearing::node::Limits;
use bourse_clearing::{
    run_client_id, stream_end, ClearingConfig, ClearingNode, ExecuteOptions, FeeRate, FeeSchedule,
    RunKind, RunRequest, SettlementRule,
};
use bourse_cluster::{Client, ClusterConfig, Node, NodeId, StreamConsumer};
use bourse_core::*;
use bourse_engine::fixtures::{equity, future, fx};
use bourse_fix::{OutMessage, OwnedMessage};
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(30);
const FUT: u32 = 1;
const CASH_START: i128 = 1_000_000_0000;

struct Core {
    runtime: tokio::runtime::Runtime,
    nodes: Vec<Node>,
    group: Vec<(NodeId, SocketAddr)>,
    _dir: tempfile::TempDir,
}

impl Core {
    fn addrs(&self) -> Vec<SocketAddr> {
        self.group.iter().map(|n| n.1).collect()
    }

    fn end(&self) -> u64 {
        self.runtime.block_on(stream_end(&self.addrs())).unwrap()
    }

    fn submit(&self, client: &mut Client, body: CommandBody) -> Vec<Event> {
        self.runtime.block_on(async {
            client
                .submit_for_events(&Command::new(1_000, body), DEADLINE)
                .await
                .expect("applied")
                .1
        })
    }

    /// The account's cash as the core has it: a deposit of one unit answers with it.
    fn cash(&self, client: &mut Client, account: u32) -> i128 {
        let body = CommandBody::Deposit {
            account: AccountId(account),
            amount: Cash(1),
        };
        match self.submit(client, body)[..] {
            [Event::CashChanged { cash, .. }] => cash.0 - 1,
            ref other => panic!("a deposit answers with the balance: {other:?}"),
        }
    }

    /// How often each seq of `client_id` was applied on the whole stream.
    fn applied(&self, client_id: u64) -> Vec<(u64, u32)> {
        let nodes = self.addrs();
        let end = self.end();
        self.runtime.block_on(async {
            let mut consumer = StreamConsumer::remote(nodes, 0);
            let mut seen = std::collections::BTreeMap::new();
            while consumer.position() < end {
                let entry = consumer.next().await.unwrap();
                for r in entry.requests() {
                    if r.key().0 == client_id && r.applied_here() {
                        *seen.entry(r.key().1).or_insert(0) += 1;
                    }
                }
            }
            seen.into_iter().collect()
        })
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        let nodes = std::mem::take(&mut self.nodes);
        self.runtime.block_on(async {
            for n in nodes {
                n.shutdown().await;
            }
        });
    }
}

fn order(account: u32, id: u64, side: Side, price: i64, qty: i64) -> CommandBody {
    order_in(FUT, account, id, side, price, qty)
}

fn order_in(
    instrument: u32,
    account: u32,
    id: u64,
    side: Side,
    price: i64,
    qty: i64,
) -> CommandBody {
    CommandBody::NewOrder(NewOrder {
        firm: None,
        account: AccountId(account),
        cl_ord_id: ClOrdId(id),
        instrument: InstrumentId(instrument),
        side,
        ord_type: OrdType::Limit,
        price: Price(price),
        qty: Qty(qty),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(0),
    })
}

/// A three-node core where accounts 1, 2 (firm 1) and 3, 4 (firm 2) trade a future four
/// times: 1 buys 5 at 99,000 and 2 at 100,500; 2 buys 3 at 101,000 and 4 at 100,020.
fn core_with_trades() -> (Core, Client) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        ClusterConfig::local(17, dir.path().to_path_buf(), bourse_testkit::free_ports());
    config.fsync = bourse_cluster::FsyncSetting::Never;
    config.orders_max = 1024;
    config.accounts_max = 64;
    let nodes = runtime.block_on(async {
        let mut nodes = Vec::new();
        for n in &config.nodes {
            nodes.push(Node::start(&config, n.id).await.unwrap());
        }
        nodes
    });
    let group = config
        .nodes
        .iter()
        .map(|n| (n.id, n.addr.parse().unwrap()))
        .collect();
    let core = Core {
        runtime,
        nodes,
        group,
        _dir: dir,
    };
    let mut trader = Client::new(core.group.clone(), 7, 1);
    core.submit(
        &mut trader,
        CommandBody::AddInstrument(future(FUT, "FUT", 100_000)),
    );
    for a in 1..=4 {
        let spec = AccountSpec {
            account: AccountId(a),
            firm: FirmId(if a <= 2 { 1 } else { 2 }),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        };
        core.submit(&mut trader, CommandBody::AddAccount(spec));
        let deposit = CommandBody::Deposit {
            account: AccountId(a),
            amount: Cash(CASH_START),
        };
        core.submit(&mut trader, deposit);
    }
    let mut id = 0;
    for (buyer, seller, price, qty) in [
        (1, 3, 99_000, 5),
        (2, 4, 101_000, 3),
        (1, 4, 100_500, 2),
        (2, 3, 100_020, 4),
    ] {
        id += 2;
        core.submit(&mut trader, order(seller, id, Side::Sell, price, qty));
        let events = core.submit(&mut trader, order(buyer, id + 1, Side::Buy, price, qty));
        assert!(events.iter().any(|e| matches!(e, Event::Trade { .. })));
    }
    (core, trader)
}

fn config(core: &Core, state_dir: &Path, standby_of: Option<String>) -> ClearingConfig {
    let instruments = state_dir.join("instruments.json");
    std::fs::create_dir_all(state_dir).unwrap();
    std::fs::write(
        &instruments,
        serde_json::to_string(&[future(FUT, "FUT", 100_000)]).unwrap(),
    )
    .unwrap();
    let operators = [
        ("alice", "operator"),
        ("victor", "viewer"),
        ("fiona", "firm:1"),
        ("tom", "trader"),
    ]
    .map(|(name, role)| CredentialEntry {
        name: name.into(),
        password_hash: hash_password_with(&format!("{name}-pw"), HashCost::TEST_ONLY).unwrap(),
        roles: vec![role.into()],
    })
    .to_vec();
    ClearingConfig {
        name: "test".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        cores: vec![core.addrs()],
        tls: None,
        instruments,
        state_dir: state_dir.to_path_buf(),
        snapshot_interval_ms: 0,
        settlement: SettlementRule {
            last_trades: 2,
            window_ns: None,
        },
        standby_login: standby_of.as_ref().map(|_| bourse_clearing::StandbyLogin {
            name: "victor".into(),
            password: "victor-pw".into(),
        }),
        standby_of,
        operators,
        limits: Limits {
            status_interval_ms: 50,
            standby_poll_ms: 20,
            ..Limits::default()
        },
        schedule: None,
        fix: None,
        fees: None,
        settlement_cycle: Default::default(),
    }
}

fn start(config: ClearingConfig) -> ClearingNode {
    let defs = bourse_clearing::load_instruments(&config.instruments).unwrap();
    ClearingNode::start(config, defs).unwrap()
}

fn client(node: &ClearingNode, who: Option<&str>) -> AdminClient {
    let c = AdminClient::new(&node.url()).unwrap();
    match who {
        Some(name) => c.with_credentials(name, &format!("{name}-pw")),
        None => c,
    }
}

fn post_run(node: &ClearingNode, who: Option<&str>, body: Value) -> (u16, Value) {
    let reply = client(node, who)
        .post_json("/v1/runs", None, &body)
        .unwrap();
    (reply.status, reply.body)
}

fn cash(v: i128) -> String {
    format_scaled(v, CASH_SCALE)
}

/// Variation margin of each account at the settlement price 100,180 (the VWAP of the last two
/// trades): Σ side × lots × (S − p), one cash unit 1.0000 per point.
fn vm_of(account: u32) -> i128 {
    let points = match account {
        1 => 1_180 * 5 - 320 * 2,
        2 => -820 * 3 + 160 * 4,
        3 => -1_180 * 5 - 160 * 4,
        _ => 820 * 3 + 320 * 2,
    };
    points * 1_0000
}

#[test]
fn the_service_answers_clearing_data_and_runs_on_an_operators_request() {
    let (core, mut trader) = core_with_trades();
    let dir = tempfile::tempdir().unwrap();
    let node = start(config(&core, dir.path(), None));
    assert!(node.wait_for_cut(&[core.end()], WAIT), "the feed follows");

    // Clearing data: account 1's position, and its open margin at the last trade (100,020).
    let account = client(&node, Some("victor")).get("/v1/accounts/1").unwrap();
    assert_eq!(account.status, 200, "{:?}", account.body);
    let b = &account.body;
    assert_eq!(b["firm"], 1);
    assert_eq!(b["positions"][0]["qty"], 7);
    let open_points = 1_020 * 5 - 480 * 2;
    assert_eq!(b["variation_margin_open"], cash(open_points * 1_0000));
    assert_eq!(b["cash"][0]["cash"], cash(CASH_START));
    let missing = client(&node, Some("victor"))
        .get("/v1/accounts/99")
        .unwrap();
    assert_eq!(missing.status, 404);
    // Firm 2 a page of one account at a time.
    let page = client(&node, Some("victor"))
        .get("/v1/firms/2?limit=1")
        .unwrap();
    assert_eq!(page.status, 200, "{:?}", page.body);
    assert_eq!(page.body["accounts"][0]["account"], 3);
    assert_eq!(page.body["next_after"], 3);
    let page = client(&node, Some("victor"))
        .get("/v1/firms/2?after=3")
        .unwrap();
    assert_eq!(page.body["accounts"][0]["account"], 4);
    assert_eq!(page.body["next_after"], Value::Null);
    let bad = client(&node, Some("victor"))
        .get("/v1/firms/2?limit=0")
        .unwrap();
    assert_eq!(bad.status, 400);
    let bad = client(&node, Some("victor"))
        .get("/v1/firms/2?colour=red")
        .unwrap();
    assert_eq!(bad.status, 400);

    // A firm's credentials read its own accounts alone; operators and viewers read all;
    // no credentials, or none that read clearing data, are refused.
    let get = |who: Option<&str>, path: &str| client(&node, who).get(path).unwrap().status;
    assert_eq!(get(None, "/v1/accounts/1"), 401);
    assert_eq!(get(Some("tom"), "/v1/accounts/1"), 403);
    assert_eq!(get(Some("fiona"), "/v1/accounts/1"), 200);
    assert_eq!(get(Some("fiona"), "/v1/accounts/3"), 403);
    assert_eq!(
        get(Some("fiona"), "/v1/accounts/99"),
        403,
        "not even whether it exists"
    );
    assert_eq!(get(Some("fiona"), "/v1/firms/2"), 403);
    assert_eq!(get(Some("alice"), "/v1/accounts/3"), 200);
    let own = client(&node, Some("fiona")).get("/v1/firms/1").unwrap();
    assert_eq!(own.status, 200, "{:?}", own.body);
    let listed: Vec<u64> = own.body["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["account"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, vec![1, 2]);

    // Only an operator runs a clearing.
    let ask = json!({ "kind": "intermediate" });
    assert_eq!(post_run(&node, None, ask.clone()).0, 401);
    assert_eq!(post_run(&node, Some("victor"), ask.clone()).0, 403);
    let (status, report) = post_run(&node, Some("alice"), ask);
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["run_id"], 1);
    // A run's report and plan list every firm's accounts: a firm may not read them.
    for path in ["/v1/runs/1", "/v1/runs/1/plan"] {
        assert_eq!(get(None, path), 401, "{path}");
        assert_eq!(get(Some("fiona"), path), 403, "{path}");
        assert_eq!(get(Some("alice"), path), 200, "{path}");
    }
    assert_eq!(report["settlement_prices"]["1"], 100_180);
    assert_eq!(report["movements"], 4);
    assert_eq!(report["pending"], 0);
    // The report says where the run's time went, step by step (how long each took is the
    // machine's; that each step is reported is the behaviour).
    for step in ["wait_ms", "compute_ms", "execute_ms"] {
        assert!(report["timing"][step].is_u64(), "{step} in {report}");
    }
    for line in report["accounts"].as_array().unwrap() {
        let a = line["account"].as_u64().unwrap() as u32;
        assert_eq!(line["variation_margin"], cash(vm_of(a)), "account {a}");
        assert!(line["result"].as_str().unwrap().starts_with("applied@"));
    }
    for a in 1..=4 {
        assert_eq!(
            core.cash(&mut trader, a),
            CASH_START + vm_of(a),
            "account {a}"
        );
    }
    // Per-firm reports: firm 1's files hold accounts 1 and 2 only.
    let run_dir = dir.path().join("reports/run-000001");
    let firm1 = std::fs::read_to_string(run_dir.join("firm-1.csv")).unwrap();
    let accounts: Vec<&str> = firm1
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(accounts, ["1", "2"]);
    let firm2: Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("firm-2.json")).unwrap()).unwrap();
    assert_eq!(firm2["accounts"].as_array().unwrap().len(), 2);

    // The same run again resumes: nothing is submitted twice.
    let (status, again) = post_run(&node, Some("alice"), json!({ "run_id": 1 }));
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["accounts"], report["accounts"]);
    assert_eq!(
        again["timing"]["compute_ms"], 0,
        "a resumed run computes nothing"
    );
    assert_eq!(
        core.applied(run_client_id(1, 0)),
        vec![(1, 1), (2, 1), (3, 1), (4, 1)]
    );

    // End of day: a resting Day order expires, through the run's own keyed command, once.
    let rests = core.submit(&mut trader, order(1, 100, Side::Sell, 100_900, 1));
    assert!(
        rests
            .iter()
            .any(|e| matches!(e, Event::OrderAccepted { .. })),
        "{rests:?}"
    );
    assert!(node.wait_for_cut(&[core.end()], WAIT));
    let (status, eod) = post_run(&node, Some("alice"), json!({ "kind": "end_of_day" }));
    assert_eq!(status, 200, "{eod}");
    assert_eq!(eod["run_id"], 2);
    assert_eq!(eod["movements"], 0, "no trade since run 1: no margin");
    assert_eq!(eod["orders_expired"], 1);
    let (_, again) = post_run(&node, Some("alice"), json!({ "run_id": 2 }));
    assert_eq!(again["orders_expired"], 1);
    assert_eq!(core.applied(run_client_id(2, 0)), vec![(1, 1)]);

    // The lag and the runs are on /metrics; the runs are listed.
    let end = core.end();
    assert!(node.wait_until(WAIT, |i| i.state.cut()[0] >= end));
    let metrics = client(&node, None).get("/metrics").unwrap();
    let text = metrics.body.as_str().unwrap().to_string();
    assert!(
        text.contains("bourse_clearing_lag_entries{core=\"0\"}"),
        "{text}"
    );
    assert!(
        text.contains("bourse_clearing_runs_total{outcome=\"done\"} 4"),
        "{text}"
    );
    let runs = client(&node, None).get("/v1/runs").unwrap();
    assert_eq!(runs.body["runs"].as_array().unwrap().len(), 2);
    node.stop().unwrap();
}

#[test]
fn a_service_without_operators_on_loopback_runs_a_clearing_asked_without_credentials() {
    let (core, mut trader) = core_with_trades();
    let dir = tempfile::tempdir().unwrap();
    let mut open = config(&core, dir.path(), None);
    open.operators.clear();
    assert!(open.listen.ip().is_loopback());
    let node = start(open);
    assert!(node.wait_for_cut(&[core.end()], WAIT), "the feed follows");

    let (status, report) = post_run(&node, None, json!({ "kind": "intermediate" }));
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["run_id"], 1);
    assert_eq!(report["movements"], 4);
    assert_eq!(report["pending"], 0);
    for a in 1..=4 {
        assert_eq!(
            core.cash(&mut trader, a),
            CASH_START + vm_of(a),
            "account {a} was paid or debited its variation margin"
        );
    }
    // The run's report and the accounts are read without credentials too.
    let get = |path: &str| client(&node, None).get(path).unwrap().status;
    assert_eq!(get("/v1/runs/1"), 200);
    assert_eq!(get("/v1/runs/1/plan"), 200);
    assert_eq!(get("/v1/accounts/3"), 200);
    node.stop().unwrap();
}

#[test]
fn a_restarted_service_reaches_the_state_a_fresh_one_rebuilds_from_the_streams() {
    let (core, mut trader) = core_with_trades();
    let dir = tempfile::tempdir().unwrap();
    let node = start(config(&core, dir.path(), None));
    assert!(node.wait_for_cut(&[core.end()], WAIT));
    // An end of day, so that the roll to the next business day is part of what is rebuilt.
    let (status, report) = post_run(&node, Some("alice"), json!({ "kind": "end_of_day" }));
    assert_eq!(status, 200, "{report}");
    assert!(node.wait_until(WAIT, |i| i.state.business_date() == Some(19700102)));
    // Trading goes on after the run, on the next business day.
    core.submit(&mut trader, order(3, 200, Side::Sell, 100_300, 2));
    core.submit(&mut trader, order(2, 201, Side::Buy, 100_300, 2));
    let end = core.end();
    assert!(node.wait_for_cut(&[end], WAIT));
    let (cut, hash) = node.cut_and_hash();
    node.stop().unwrap();
    assert!(
        std::fs::read_dir(dir.path().join("snapshots"))
            .unwrap()
            .any(|f| f.unwrap().file_name().to_string_lossy().ends_with(".snap")),
        "stopping writes a snapshot"
    );

    // Restarted from its snapshot: the same cut and hash at once.
    let restarted = start(config(&core, dir.path(), None));
    assert_eq!(restarted.cut_and_hash(), (cut.clone(), hash));

    // A fresh node with the saved runs only reads the stream from index 0, settles run 1 at
    // its cut (checking the hash there), and reaches the same state as the restarted one.
    let fresh_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(fresh_dir.path().join("runs")).unwrap();
    std::fs::copy(
        dir.path().join("runs/run-000001.json"),
        fresh_dir.path().join("runs/run-000001.json"),
    )
    .unwrap();
    let fresh = start(config(&core, fresh_dir.path(), None));
    // Both keep following the stream, which may have grown since the first node stopped by
    // entries without requests (a new leader's blank entry under load, a hash check): they
    // are compared where both stand at one cut.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let end = [core.end()];
        assert!(restarted.wait_for_cut(&end, WAIT) && fresh.wait_for_cut(&end, WAIT));
        let (a, b) = (restarted.cut_and_hash(), fresh.cut_and_hash());
        if a.0 == b.0 {
            assert!(a.0[0] >= cut[0]);
            assert_eq!(
                a, b,
                "at one cut, the restarted and the fresh node hash alike"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the two nodes never stood at one cut: {a:?} {b:?}"
        );
    }
    restarted.stop().unwrap();
    drop(fresh);

    // A node that knows no run refuses to compute one while run 1's commands are on the
    // stream: it would pay the margin twice.
    let blind_dir = tempfile::tempdir().unwrap();
    let blind = start(config(&core, blind_dir.path(), None));
    let (status, body) = post_run(&blind, Some("alice"), json!({ "kind": "intermediate" }));
    assert_eq!(status, 409, "{body}");
    assert!(body
        .to_string()
        .contains("run 1's commands are on the streams"));
}

#[test]
fn a_standby_takes_over_a_run_stopped_half_way_and_applies_nothing_twice() {
    let (core, mut trader) = core_with_trades();
    let primary_dir = tempfile::tempdir().unwrap();
    let standby_dir = tempfile::tempdir().unwrap();
    let primary = start(config(&core, primary_dir.path(), None));
    let standby = start(config(&core, standby_dir.path(), Some(primary.url())));
    assert!(primary.wait_for_cut(&[core.end()], WAIT));

    // A standby computes no run of its own.
    let (status, _) = post_run(&standby, Some("alice"), json!({ "kind": "intermediate" }));
    assert_eq!(status, 409);

    // The primary dies after the first of its four movements.
    let partial = primary
        .block_on(primary.shared().run_with(
            RunRequest {
                kind: Some(RunKind::Intermediate),
                ..RunRequest::default()
            },
            ExecuteOptions {
                stop_after: Some(1),
            },
        ))
        .unwrap();
    assert_eq!(partial.pending, 3);
    assert!(
        standby.wait_until(WAIT, |i| i.state.last_settled_run() == 1),
        "the standby reads and settles the primary's run"
    );
    primary.kill();

    // The standby resumes it: the other three movements, each once.
    let (status, report) = post_run(&standby, Some("alice"), json!({ "run_id": 1 }));
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["pending"], 0);
    assert_eq!(
        core.applied(run_client_id(1, 0)),
        vec![(1, 1), (2, 1), (3, 1), (4, 1)]
    );
    for a in 1..=4 {
        assert_eq!(
            core.cash(&mut trader, a),
            CASH_START + vm_of(a),
            "account {a}"
        );
    }

    // Taken over, it runs the next clearing itself; with no trade since, nothing is owed.
    let takeover = client(&standby, Some("alice"))
        .post_json("/v1/takeover", None, &json!({}))
        .unwrap();
    assert_eq!(takeover.status, 200);
    let (status, next) = post_run(&standby, Some("alice"), json!({ "kind": "intermediate" }));
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["run_id"], 2);
    assert_eq!(next["movements"], 0);
}

/// A venue config's `[schedule]`: MOEX's derivatives day for the market `futures`.
const VENUE_DAY: &str = r#"
[schedule]
utc_offset_minutes = 180
business_days = ["mon", "tue", "wed", "thu", "fri"]

[[schedule.markets]]
market = "futures"
sessions = [{ from = "10:00", to = "14:00" }, { from = "14:05", to = "18:45" }, { from = "19:05", to = "23:50" }]
end_of_day = "18:50"
"#;

/// Unix ns of Moscow (UTC+3) local time, `day` days after Monday 2026-11-23.
fn msk(day: u64, hh: u64, mm: u64) -> u64 {
    ((20_780 + day) * 1_440 + hh * 60 + mm - 180) * 60_000_000_000
}

#[test]
fn the_service_runs_clearings_on_the_venues_schedule_once_each_over_a_simulated_day() {
    use bourse_clearing::node::ScheduledOutcome;
    use bourse_clearing::ManualClock;
    use std::sync::Arc;

    let (core, _trader) = core_with_trades();
    let dir = tempfile::tempdir().unwrap();
    let venue = dir.path().join("venue.toml");
    std::fs::write(&venue, VENUE_DAY).unwrap();
    let mut c = config(&core, &dir.path().join("clearing"), None);
    c.schedule = Some(
        toml::from_str(&format!(
            "file = {:?}\nmarkets = [\"futures\"]\npoll_ms = 3600000\n",
            venue.display().to_string()
        ))
        .unwrap(),
    );
    // The node's own poller waits an hour of real time before its first look: every step
    // below is the test's, at the simulated times it sets.
    let clock = Arc::new(ManualClock::new(msk(0, 13, 0)));
    let node =
        ClearingNode::start_with_clock(c.clone(), vec![future(FUT, "FUT", 100_000)], clock.clone())
            .unwrap();
    let step = |node: &ClearingNode| node.block_on(node.shared().step_schedule());
    let runs = |node: &ClearingNode| {
        let inner = node.shared().inner.read().unwrap();
        inner
            .runs
            .values()
            .map(|r| (r.plan.run_id, r.plan.kind, r.plan.scheduled_ns))
            .collect::<Vec<_>>()
    };

    // Before the pause nothing runs; at its start the intermediate run does, once.
    clock.set(msk(0, 13, 59));
    assert!(step(&node).is_empty());
    assert!(runs(&node).is_empty());
    clock.set(msk(0, 14, 0));
    let did = step(&node);
    assert_eq!(did.len(), 1, "{did:?}");
    assert_eq!(did[0].0.kind, RunKind::Intermediate);
    assert_eq!(did[0].0.local, "2026-11-23 14:00");
    assert_eq!(did[0].1, ScheduledOutcome::Done { run_id: 1 });
    assert!(
        step(&node).is_empty(),
        "a second step at the same time runs nothing"
    );
    assert_eq!(
        runs(&node),
        vec![(1, RunKind::Intermediate, Some(msk(0, 14, 0)))]
    );
    // The margin was paid as an operator's run pays it (the hand-worked figures of the
    // first test: 1 and 2 receive, 3 and 4 pay, at the VWAP of the last two trades).
    let report = node.shared().inner.read().unwrap().runs[&1]
        .report
        .clone()
        .unwrap();
    assert_eq!((report.pending, report.refused), (0, 0));
    assert_eq!(report.movements, 4);

    // The evening pause (18:45) is the end of day's: one end-of-day run at 18:50, no
    // intermediate one at 18:45.
    clock.set(msk(0, 18, 52));
    let did = step(&node);
    let kinds: Vec<(String, RunKind)> = did
        .iter()
        .map(|(d, _)| (d.local[11..].to_string(), d.kind))
        .collect();
    assert_eq!(kinds, vec![("18:50".to_string(), RunKind::EndOfDay)]);
    assert_eq!(did[0].1, ScheduledOutcome::Done { run_id: 2 });

    // A restarted node does not run the day's slots again; the next day's 14:00 runs.
    node.stop().unwrap();
    let node =
        ClearingNode::start_with_clock(c.clone(), vec![future(FUT, "FUT", 100_000)], clock.clone())
            .unwrap();
    assert!(step(&node).is_empty());
    clock.set(msk(1, 14, 1));
    let did = step(&node);
    assert_eq!(did.len(), 1, "{did:?}");
    assert_eq!(did[0].0.local, "2026-11-24 14:00");
    assert_eq!(did[0].1, ScheduledOutcome::Done { run_id: 3 });
    // A slot missed by more than the catch-up limit is skipped, not run late.
    clock.set(msk(2, 14, 30));
    let did = step(&node);
    let locals: Vec<&str> = did.iter().map(|(d, _)| d.local.as_str()).collect();
    assert_eq!(locals, vec!["2026-11-24 18:50", "2026-11-25 14:00"]);
    assert!(
        did.iter().all(|(_, o)| *o == ScheduledOutcome::Missed),
        "{did:?}"
    );
    assert_eq!(runs(&node).len(), 3);
    // Each run's movements were applied once on the core's stream.
    for run in 1..=2 {
        let applied = core.applied(run_client_id(run, 0));
        assert!(
            applied.iter().all(|(_, n)| *n == 1),
            "run {run}: {applied:?}"
        );
    }
    node.stop().unwrap();
}

/// Connects to the node's FIX acceptor as `who` (password `who-pw`).
#[test]
fn obligations_settle_t0_or_t1_on_the_venues_calendar_and_are_served_by_settlement_date() {
    use bourse_clearing::ManualClock;
    use std::sync::Arc;
    const EQ: u32 = 2;
    const FX: u32 = 3;

    let (core, mut trader) = core_with_trades();
    // Beside the future, 1 buys 3 lots (30 shares) of an equity from 3 at 10.00, and 2 buys
    // 2 lots (2,000 units) of an FX pair from 4 at 1.00000.
    core.submit(
        &mut trader,
        CommandBody::AddInstrument(equity(EQ, "EQ", 1_000)),
    );
    core.submit(
        &mut trader,
        CommandBody::AddInstrument(fx(FX, "FXP", 100_000)),
    );
    for (instrument, seller, buyer, price, qty, id) in
        [(EQ, 3, 1, 1_000, 3, 300), (FX, 4, 2, 100_000, 2, 302)]
    {
        core.submit(
            &mut trader,
            order_in(instrument, seller, id, Side::Sell, price, qty),
        );
        let events = core.submit(
            &mut trader,
            order_in(instrument, buyer, id + 1, Side::Buy, price, qty),
        );
        assert!(events.iter().any(|e| matches!(e, Event::Trade { .. })));
    }
    // The venue's calendar: Monday to Friday, and Monday 2026-11-30 a holiday.
    let dir = tempfile::tempdir().unwrap();
    let venue = dir.path().join("venue.toml");
    let day = VENUE_DAY.replace(
        "business_days = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\"]\n",
        "business_days = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\"]\nholidays = [\"2026-11-30\"]\n",
    );
    assert!(day.contains("2026-11-30"));
    std::fs::write(&venue, day).unwrap();
    let mut c = config(&core, &dir.path().join("clearing"), None);
    c.schedule = Some(
        toml::from_str(&format!(
            "file = {:?}\nmarkets = [\"futures\"]\npoll_ms = 3600000\n",
            venue.display().to_string()
        ))
        .unwrap(),
    );
    // The defaults: equities T+1, FX T+0.
    c.settlement_cycle = toml::from_str("").unwrap();
    c.fix = Some(FixSection {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..FixSection::default()
    });
    let defs = vec![future(FUT, "FUT", 100_000)];
    // Friday 2026-11-27, Moscow time: the 14:00 intermediate run.
    let clock = Arc::new(ManualClock::new(msk(4, 13, 0)));
    let node = ClearingNode::start_with_clock(c.clone(), defs.clone(), clock.clone()).unwrap();
    assert!(node.wait_for_cut(&[core.end()], WAIT), "the feed follows");
    clock.set(msk(4, 14, 0));
    let did = node.block_on(node.shared().step_schedule());
    assert_eq!(did.len(), 1, "{did:?}");
    let plan = node.shared().inner.read().unwrap().runs[&1].plan.clone();
    assert_eq!(plan.trade_date.as_deref(), Some("2026-11-27"));
    let mut dates: Vec<(u32, u32, &str)> = plan
        .obligations
        .iter()
        .map(|o| {
            let date = o.settlement_date.as_deref().unwrap();
            (o.account.0, o.instrument.0, date)
        })
        .collect();
    dates.sort_unstable();
    // The equity settles on Tuesday (past the weekend and the holiday), FX the same day.
    assert_eq!(
        dates,
        vec![
            (1, EQ, "2026-12-01"),
            (2, FX, "2026-11-27"),
            (3, EQ, "2026-12-01"),
            (4, FX, "2026-11-27")
        ]
    );

    let settlements = |node: &ClearingNode, who: &str, path: &str| {
        let reply = client(node, Some(who)).get(path).unwrap();
        (reply.status, reply.body)
    };
    let line = |account: u32, instrument: u32, securities: i64, cash_due: i128| {
        json!({
            "account": account,
            "firm": if account <= 2 { 1 } else { 2 },
            "instrument": instrument,
            "symbol": if instrument == EQ { "EQ" } else { "FXP" },
            "securities": securities,
            "cash": cash(cash_due),
            "runs": [1],
        })
    };
    let (status, tuesday) = settlements(&node, "victor", "/v1/settlements/2026-12-01");
    assert_eq!(status, 200, "{tuesday}");
    assert_eq!(
        tuesday["lines"],
        json!([line(1, EQ, 30, -300_0000), line(3, EQ, -30, 300_0000)])
    );
    let (_, friday) = settlements(&node, "victor", "/v1/settlements/2026-11-27");
    assert_eq!(
        friday["lines"],
        json!([
            line(2, FX, 2_000, -2_000_0000),
            line(4, FX, -2_000, 2_000_0000)
        ])
    );
    let (_, holiday) = settlements(&node, "victor", "/v1/settlements/2026-11-30");
    assert_eq!(holiday["lines"], json!([]));
    // A firm reads its own accounts' lines only, and may not ask for another firm's.
    let (_, own) = settlements(&node, "fiona", "/v1/settlements/2026-12-01");
    assert_eq!(own["lines"], json!([line(1, EQ, 30, -300_0000)]));
    let (status, _) = settlements(&node, "fiona", "/v1/settlements/2026-12-01?firm=2");
    assert_eq!(status, 403);
    let (status, body) = settlements(&node, "victor", "/v1/settlements/2026-13-01");
    assert_eq!(status, 400);
    assert!(body.to_string().contains("2026-13-01"), "{body}");

    // Restarted, the node serves the dates its saved plan was given (the date index is
    // rebuilt from the saved plans); with one line per answer, a day of two lines is
    // refused with what to ask instead, and one firm's line is served.
    node.stop().unwrap();
    let mut one_line = c.clone();
    one_line.limits.accounts_per_answer_max = 1;
    let node = ClearingNode::start_with_clock(one_line, defs.clone(), clock.clone()).unwrap();
    let (status, body) = settlements(&node, "victor", "/v1/settlements/2026-12-01");
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "too_many", "{body}");
    assert!(body.to_string().contains("?firm=N"), "{body}");
    let (status, firm1) = settlements(&node, "victor", "/v1/settlements/2026-12-01?firm=1");
    assert_eq!(status, 200, "{firm1}");
    assert_eq!(firm1["lines"], json!([line(1, EQ, 30, -300_0000)]));
    node.stop().unwrap();
    let node = ClearingNode::start_with_clock(c, defs, clock.clone()).unwrap();
    let (_, again) = settlements(&node, "victor", "/v1/settlements/2026-12-01");
    assert_eq!(again["lines"], tuesday["lines"]);

    // After more trades, the 18:50 end of day settles them on the same dates, and its FIX
    // PositionReports say when: SettlDate on the equity and FX lines, none on the future's.
    for (instrument, seller, buyer, price, qty, id) in
        [(EQ, 3, 1, 1_000, 1, 310), (FX, 4, 2, 100_000, 1, 312)]
    {
        core.submit(
            &mut trader,
            order_in(instrument, seller, id, Side::Sell, price, qty),
        );
        let events = core.submit(
            &mut trader,
            order_in(instrument, buyer, id + 1, Side::Buy, price, qty),
        );
        assert!(events.iter().any(|e| matches!(e, Event::Trade { .. })));
    }
    assert!(node.wait_for_cut(&[core.end()], WAIT), "the feed follows");
    clock.set(msk(4, 18, 50));
    let did = node.block_on(node.shared().step_schedule());
    assert_eq!(did.len(), 1, "{did:?}");
    assert_eq!(did[0].0.kind, RunKind::EndOfDay);
    let mut fiona = fix_client(&node, "fiona").unwrap();
    let settl_dates = |fiona: &mut PositionsClient, account: u32| {
        let answer = fiona
            .positions(account, "20261127", "EOD", None, WAIT)
            .unwrap();
        assert_eq!(answer.result(), Some(0), "{:?}", answer.ack);
        answer
            .reports
            .iter()
            .map(|ap| {
                let text = |t| field(ap, t).map(str::to_owned);
                (text(fix::tag::SYMBOL).unwrap(), text(fix::tag::SETTL_DATE))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        settl_dates(&mut fiona, 1),
        vec![
            ("FUT".to_owned(), None),
            ("EQ".to_owned(), Some("20261201".to_owned()))
        ]
    );
    assert_eq!(
        settl_dates(&mut fiona, 2),
        vec![
            ("FUT".to_owned(), None),
            ("FXP".to_owned(), Some("20261127".to_owned()))
        ]
    );
    fiona.logout(WAIT).unwrap();
    node.stop().unwrap();
}

fn fix_client(node: &ClearingNode, who: &str) -> std::io::Result<PositionsClient> {
    PositionsClient::connect(
        node.fix_addr().expect("a FIX acceptor"),
        who,
        "BOURSE-CLEARING",
        Some(&format!("{who}-pw")),
        WAIT,
    )
}

/// One PositionReport's groups: PosType → (LongQty, ShortQty), PosAmtType → PosAmt.
fn report_groups(m: &OwnedMessage) -> (BTreeMap<String, (i64, i64)>, BTreeMap<String, String>) {
    let qty = |e: &[(bourse_fix::Tag, String)], t: bourse_fix::Tag| {
        e.iter()
            .find(|(tag, _)| *tag == t)
            .map_or(0, |(_, v)| v.parse::<i64>().unwrap())
    };
    let positions = group(m, fix::tag::NO_POSITIONS, &[703, 704, 705])
        .iter()
        .map(|e| (e[0].1.clone(), (qty(e, 704), qty(e, 705))))
        .collect();
    let amounts = group(m, fix::tag::NO_POS_AMT, &[707, 708])
        .iter()
        .map(|e| (e[0].1.clone(), e[1].1.clone()))
        .collect();
    (positions, amounts)
}

#[test]
fn clearing_data_over_fix_answers_a_firm_its_own_positions_intraday_and_at_end_of_day() {
    let (core, _trader) = core_with_trades();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&core, dir.path(), None);
    cfg.fix = Some(FixSection {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..FixSection::default()
    });
    // Fees per lot: the aggressor (every buyer here) 1.00, the resting side 0.50; account 4
    // is the venue's.
    cfg.fees = Some(FeeSchedule {
        venue_account: 4,
        rates: vec![FeeRate {
            maker_per_lot: "0.50".into(),
            taker_per_lot: "1".into(),
            ..FeeRate::default()
        }],
    });
    let node = start(cfg);
    assert!(node.wait_for_cut(&[core.end()], WAIT), "the feed follows");
    // The trades are stamped 1,000 ns after the epoch: their business date.
    let today = business_date(1_000, 0);
    assert_eq!(today, "19700101");

    // Wrong passwords and role-less names are refused at Logon, saying why.
    let bad = PositionsClient::connect(
        node.fix_addr().unwrap(),
        "fiona",
        "BOURSE-CLEARING",
        Some("guess"),
        WAIT,
    );
    let why = bad.err().expect("a wrong password is refused").to_string();
    assert!(why.contains("invalid credentials"), "{why}");
    let why = fix_client(&node, "tom").err().expect("refused").to_string();
    assert!(why.contains("no role that reads clearing data"), "{why}");

    // Firm 1 reads account 1 intraday: the figures the HTTP side gives.
    let mut fiona = fix_client(&node, "fiona").expect("firm 1 logs on");
    let second = fix_client(&node, "fiona");
    assert!(second
        .err()
        .expect("one connection per CompID")
        .to_string()
        .contains("already logged on"));
    let answer = fiona.positions(1, &today, "ITD", None, WAIT).unwrap();
    assert_eq!(answer.result(), Some(0), "{:?}", answer.ack);
    assert_eq!(answer.reports.len(), 1);
    let ap = &answer.reports[0];
    assert_eq!(ap.msg_type, "AP");
    assert_eq!(
        field(ap, fix::tag::CLEARING_BUSINESS_DATE),
        Some("19700101")
    );
    assert_eq!(field(ap, fix::tag::SETTL_SESS_ID), Some("ITD"));
    assert_eq!(field(ap, fix::tag::SYMBOL), Some("FUT"));
    assert_eq!(field(ap, fix::tag::PARTY_ID), Some("1"));
    assert_eq!(field(ap, fix::tag::SETTL_PRICE), Some("100020"));
    assert_eq!(field(ap, fix::tag::SETTL_PRICE_TYPE), Some("2"));
    let (qty, amounts) = report_groups(ap);
    assert_eq!(qty["TQ"], (7, 0));
    assert_eq!(qty["TOT"], (7, 0));
    let http = client(&node, Some("fiona")).get("/v1/accounts/1").unwrap();
    assert_eq!(amounts["FMTM"], http.body["variation_margin_open"]);
    assert_eq!(amounts["IMTM"], http.body["variation_margin_open"]);
    assert_eq!(amounts["FMTM"], cash((1_020 * 5 - 480 * 2) * 1_0000));
    // Initial margin: 7 lots × the future's margin per lot, the same over HTTP; no call.
    let im = cash(7 * future(FUT, "FUT", 100_000).initial_margin.0);
    assert_eq!(amounts["IMR"], im);
    assert_eq!(amounts["MCAL"], "0.0000");
    assert_eq!(http.body["initial_margin"], im.as_str());
    assert_eq!(http.body["positions"][0]["initial_margin"], im.as_str());
    assert_eq!(http.body["cash"][0]["initial_margin"], im.as_str());
    assert_eq!(http.body["margin_called"], "0.0000");
    // No debit of a run was refused: no debt.
    assert_eq!(amounts["DEBT"], "0.0000");
    assert_eq!(http.body["debt"], "0.0000");
    assert_eq!(http.body["cash"][0]["debt"], "0.0000");
    // Account 1 took 7 lots: 7.00 of fees due at the next run, on both sides.
    assert_eq!(amounts["FEES"], "7.0000");
    assert_eq!(http.body["fees_due"], "7.0000");
    assert_eq!(http.body["fees_paid"], "0.0000");
    // Account 2 bought 3 and 4 lots; asked by Symbol.
    let two = fiona
        .positions(2, &today, "ITD", Some("FUT"), WAIT)
        .unwrap();
    let (qty2, _) = report_groups(&two.reports[0]);
    assert_eq!(qty2["TQ"], (7, 0));

    // Another firm's account, or one that does not exist, is not authorised (3), alike.
    for account in [3, 99] {
        let refused = fiona.positions(account, &today, "ITD", None, WAIT).unwrap();
        assert_eq!(refused.result(), Some(3), "account {account}");
        assert!(refused.reports.is_empty());
        assert_eq!(field(&refused.ack, fix::tag::POS_REQ_STATUS), Some("2"));
    }
    // Bad requests are answered, named: a date, another day intraday, a symbol, a type.
    let bad_date = fiona.positions(1, "19701301", "ITD", None, WAIT).unwrap();
    assert_eq!(bad_date.result(), Some(1));
    assert!(field(&bad_date.ack, 58)
        .unwrap()
        .contains("ClearingBusinessDate"));
    let other_day = fiona.positions(1, "19691231", "ITD", None, WAIT).unwrap();
    assert_eq!(other_day.result(), Some(2));
    let no_symbol = fiona
        .positions(1, &today, "ITD", Some("XYZ"), WAIT)
        .unwrap();
    assert_eq!(no_symbol.result(), Some(2));
    let mut trades = OutMessage::new("AN");
    trades.push(fix::tag::POS_REQ_ID, "trades-1");
    trades.push(fix::tag::POS_REQ_TYPE, "1");
    trades.push(fix::tag::ACCOUNT, "1");
    trades.push(fix::tag::CLEARING_BUSINESS_DATE, today.as_str());
    fiona.send(trades).unwrap();
    let ack = fiona.recv(WAIT).unwrap();
    assert_eq!(ack.msg_type, "AO");
    assert_eq!(field(&ack, fix::tag::POS_REQ_RESULT), Some("4"));
    // No end-of-day run yet.
    let none = fiona.positions(1, &today, "EOD", None, WAIT).unwrap();
    assert_eq!(none.result(), Some(2));
    assert!(field(&none.ack, 58).unwrap().contains("no end-of-day run"));

    // After the end of day, EOD gives the run's figures: the position at the cut, the
    // final settlement price, the margin paid; it sums to zero over every account.
    let (status, eod) = post_run(&node, Some("alice"), json!({ "kind": "end_of_day" }));
    assert_eq!(status, 200, "{eod}");
    let day_end = fiona.positions(1, &today, "EOD", None, WAIT).unwrap();
    assert_eq!(day_end.result(), Some(0), "{:?}", day_end.ack);
    let ap = &day_end.reports[0];
    assert_eq!(field(ap, fix::tag::SETTL_PRICE), Some("100180"));
    assert_eq!(field(ap, fix::tag::SETTL_PRICE_TYPE), Some("1"));
    let (qty, amounts) = report_groups(ap);
    assert_eq!(qty["FIN"], (7, 0));
    assert_eq!(amounts["IMTM"], cash(vm_of(1)));
    assert_eq!(amounts["FEES"], "7.0000", "the run charged the fees");
    assert_eq!(amounts["IMR"], im, "the initial margin at the cut");
    let line_1 = eod["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["account"] == 1)
        .unwrap()
        .clone();
    assert_eq!(line_1["initial_margin"], im.as_str(), "{line_1}");
    assert_eq!(line_1["margin_call"], "0.0000", "{line_1}");
    assert_eq!(eod["margin_calls"], 0);
    let http = client(&node, Some("fiona")).get("/v1/accounts/1").unwrap();
    assert_eq!(http.body["fees_paid"], "7.0000");
    assert_eq!(http.body["fees_due"], "0.0000");
    // The venue's account received every side's fees: 7 + 7 taken, 4.50 + 2.50 made.
    let venue_line = eod["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["account"] == 4)
        .unwrap()
        .clone();
    assert_eq!(venue_line["fees"], "-18.5000", "{venue_line}");
    // Intraday after the run: what is open is the whole less what the run paid.
    // The end of day rolled the live state to the next business day (Friday 2 January
    // 1970): intraday is for that date, the closed day is EOD's.
    let closed = fiona.positions(1, &today, "ITD", None, WAIT).unwrap();
    assert_eq!(closed.result(), Some(2));
    assert!(field(&closed.ack, 58).unwrap().contains("19700102"));
    let next_day = "19700102";
    let itd = fiona.positions(1, next_day, "ITD", None, WAIT).unwrap();
    assert_eq!(itd.result(), Some(0), "{:?}", itd.ack);
    assert_eq!(
        field(&itd.reports[0], fix::tag::CLEARING_BUSINESS_DATE),
        Some(next_day)
    );
    let (qty, amounts) = report_groups(&itd.reports[0]);
    assert!(!amounts.contains_key("FEES"), "charged: none due");
    let parse = |s: &str| -> i128 { s.replace('.', "").parse().unwrap() };
    assert_eq!(parse(&amounts["FMTM"]) - parse(&amounts["IMTM"]), vm_of(1));
    assert_eq!(
        field(&itd.reports[0], fix::tag::PRIOR_SETTL_PRICE),
        Some("100180")
    );
    // The day opens with the closing position and nothing traded; what is open is the
    // opening position marked from the settlement price to the last trade (SMTM), no
    // trade variation (TVAR); the collateral (CASH) is the account's cash carried over.
    assert_eq!(qty["SOD"], (7, 0));
    assert_eq!(qty["TQ"], (0, 0));
    assert_eq!(qty["TOT"], (7, 0));
    assert_eq!(amounts["SMTM"], cash(7 * (100_020 - 100_180) * 1_0000));
    assert_eq!(amounts["SMTM"], amounts["IMTM"]);
    assert_eq!(amounts["TVAR"], "0.0000");
    let http = client(&node, Some("fiona")).get("/v1/accounts/1").unwrap();
    assert_eq!(http.body["business_date"], 19700102);
    assert_eq!(amounts["CASH"], http.body["cash"][0]["cash"]);
    let position = &http.body["positions"][0];
    assert_eq!(position["sod_qty"], 7);
    assert_eq!(position["day_lots_bought"], 0);
    assert_eq!(position["start_of_day_mtm"], amounts["SMTM"].as_str());
    assert_eq!(position["trade_variation"], "0.0000");
    assert_eq!(position["day_variation_margin_paid"], "0.0000");
    fiona.logout(WAIT).unwrap();

    // An operator's session reads every account; the day's margin sums to zero.
    let mut alice = fix_client(&node, "alice").unwrap();
    let mut sum = 0;
    for account in 1..=4 {
        let a = alice.positions(account, &today, "EOD", None, WAIT).unwrap();
        let (qty, amounts) = report_groups(&a.reports[0]);
        let fin = qty["FIN"];
        assert!(fin.0 == 0 || fin.1 == 0, "long or short, not both");
        let vm = parse(&amounts["IMTM"]);
        assert_eq!(vm, vm_of(account), "account {account}");
        sum += vm;
    }
    assert_eq!(sum, 0, "variation margin sums to zero");
    alice.logout(WAIT).unwrap();
    node.stop().unwrap();
}
