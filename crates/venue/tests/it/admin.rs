//! The admin API on a running replicated venue (two markets, each a three-node core), driven
//! over HTTP as an operator would, with orders over FIX and binary sessions of its gateway:
//! credentials refused and counted; a retried request applied once; a halted instrument
//! refusing orders over both protocols with the halt's reason, then trading after resume; a
//! firm's kill switch cancelling its orders in both cores and refusing new ones until
//! released; bulk account additions; every replica of each core with the same state hash.

use bourse_admin::AdminClient;
use bourse_auth::{hash_password_with, CredentialEntry, CredentialStore, HashCost};
use bourse_client::binary::{BinaryClient, Received, Response};
use bourse_client::fix::{FixClient, FixClientConfig};
use bourse_core::*;
use bourse_engine::fixtures::{equity, future};
use bourse_loadgen::gateway::SessionProtocol;
use bourse_venue::{Backend, DeploymentSpec, LocalDeployment, MarketSpec};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SBER: u32 = 1;
const SI: u32 = 2;
/// Firm 7 owns account 1, firm 8 account 2.
const FIRM_A: u32 = 7;
const CASH: i128 = 100_000_000_0000;
const WAIT: Duration = Duration::from_secs(10);

fn market(name: &str, instrument: Instrument) -> MarketSpec {
    let mut setup = vec![CommandBody::AddInstrument(instrument.clone())];
    for (account, firm) in [(1, FIRM_A), (2, 8)] {
        setup.push(CommandBody::AddAccount(AccountSpec {
            account: AccountId(account),
            firm: FirmId(firm),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        }));
        setup.push(CommandBody::Deposit {
            account: AccountId(account),
            amount: Cash(CASH),
        });
    }
    MarketSpec {
        name: name.into(),
        instruments: vec![instrument],
        setup,
    }
}

struct Venue {
    deployment: LocalDeployment,
    monitor: Arc<bourse_monitor::Monitor>,
    admin: bourse_admin::AdminServer,
    _dir: tempfile::TempDir,
    audit: std::path::PathBuf,
}

fn start() -> Venue {
    let dir = tempfile::tempdir().unwrap();
    let monitor = bourse_monitor::Monitor::new(bourse_monitor::MonitorConfig::default());
    let spec = DeploymentSpec {
        markets: vec![
            market("equities", equity(SBER, "SBER", 10_000)),
            market("futures", future(SI, "SI", 100_000)),
        ],
        backend: Backend::Cluster,
        protocol: SessionProtocol::Binary,
        gateways: 1,
        worker_sessions: vec![vec![vec![1, 2]]],
        data_dir: dir.path().join("venue"),
        orders_max: 10_000,
        accounts_max: 10_000,
        fsync: bourse_cluster::FsyncSetting::Never,
        market_data: false,
        monitor: None,
        extra_fix_sessions: vec![("OPS".into(), vec![1, 2])],
        verbose: false,
        core_in_flight_max: None,
        bounds: None,
    };
    let deployment = LocalDeployment::start(spec).expect("venue starts");
    let entries =
        [("alice", "operator"), ("victor", "viewer")].map(|(name, role)| CredentialEntry {
            name: name.into(),
            password_hash: hash_password_with(&format!("{name}-pw"), HashCost::TEST_ONLY).unwrap(),
            roles: vec![role.into()],
        });
    let store = Arc::new(CredentialStore::from_entries(&entries).unwrap());
    let audit = dir.path().join("audit.jsonl");
    let (_, admin) = deployment
        .start_admin(
            store,
            &audit,
            "127.0.0.1:0".parse().unwrap(),
            Some(Arc::clone(&monitor)),
        )
        .expect("admin starts");
    Venue {
        deployment,
        monitor,
        admin,
        _dir: dir,
        audit,
    }
}

impl Venue {
    fn client(&self, who: &str) -> AdminClient {
        AdminClient::new(&self.admin.url())
            .unwrap()
            .with_credentials(who, &format!("{who}-pw"))
    }

    fn fix(&self) -> FixClient {
        let addr = self.deployment.gateways()[0].fix_addr().unwrap();
        FixClient::connect(&FixClientConfig::new(addr, "OPS", "BOURSE")).expect("FIX logon")
    }

    fn binary(&self) -> BinaryClient {
        let addr: SocketAddr = self.deployment.gateways()[0].binary_addr().unwrap();
        BinaryClient::connect(addr, "W0S0", 30_000, 1).expect("binary establish")
    }

    /// Every replica of every core at the same applied index has the same state hash.
    fn replicas_agree(&self) {
        let rt = self.deployment.runtime_handle().unwrap();
        for (name, addrs) in self.deployment.node_addrs() {
            let deadline = Instant::now() + WAIT;
            loop {
                let statuses: Vec<_> = addrs
                    .iter()
                    .map(|a| {
                        rt.block_on(bourse_cluster::client::node_status(*a, WAIT))
                            .unwrap()
                    })
                    .collect();
                let same_index = statuses
                    .windows(2)
                    .all(|w| w[0].last_applied_index == w[1].last_applied_index);
                if same_index {
                    let hashes: Vec<u64> = statuses.iter().map(|s| s.state_hash).collect();
                    assert!(
                        hashes.windows(2).all(|w| w[0] == w[1]),
                        "{name}: replicas differ: {hashes:x?}"
                    );
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{name}: replicas never converged"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn act(c: &AdminClient, id: &str, action: Value) -> (u16, Value) {
    let r = c.action(id, &action).expect("admin API answers");
    (r.status, r.body)
}

/// The market's state from an account query.
fn account_in<'a>(body: &'a Value, market: &str) -> &'a Value {
    body["markets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["market"] == market)
        .map(|m| &m["state"])
        .unwrap_or_else(|| panic!("no market {market} in {body}"))
}

/// The next binary answer that `pick` takes (other answers are skipped).
fn binary_wait<T>(b: &mut BinaryClient, mut pick: impl FnMut(&Response) -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Some(Received { response, .. }) = b.recv(Duration::from_millis(100)).unwrap() {
            if let Some(v) = pick(&response) {
                return v;
            }
        }
    }
    panic!("no such binary answer in time");
}

/// The next execution report for `cl_ord_id` over FIX: (ExecType, Text).
fn fix_report(f: &mut FixClient, cl_ord_id: &str) -> (String, String) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let Some(m) = f.recv_type("8", Duration::from_millis(200)).unwrap() else {
            continue;
        };
        if FixClient::field(&m, 11) == Some(cl_ord_id) {
            return (
                FixClient::field(&m, 150).unwrap_or("").to_string(),
                FixClient::field(&m, 58).unwrap_or("").to_string(),
            );
        }
    }
    panic!("no execution report for {cl_ord_id}");
}

fn binary_order(
    b: &mut BinaryClient,
    cl: u64,
    account: u32,
    instrument: u32,
    price: i64,
    qty: i64,
) -> Result<u64, u16> {
    b.new_order(
        cl,
        account,
        instrument,
        true,
        qty,
        Some(price),
        bourse_wire::order_entry::codec::time_in_force::TimeInForce::Day,
    )
    .unwrap();
    binary_wait(b, |r| match *r {
        Response::NewOrderAck {
            cl_ord_id,
            order_id,
            ..
        } if cl_ord_id == cl => Some(Ok(order_id)),
        Response::OrderReject { cl_ord_id, reason } if cl_ord_id == cl => Some(Err(reason)),
        _ => None,
    })
}

#[test]
fn the_admin_api_operates_a_running_replicated_venue() {
    let v = start();
    let ops = v.client("alice");

    // Credentials: none, wrong, and a viewer acting are refused and counted.
    let anonymous = AdminClient::new(&v.admin.url()).unwrap();
    assert_eq!(anonymous.get("/v1/instruments").unwrap().status, 401);
    let wrong = AdminClient::new(&v.admin.url())
        .unwrap()
        .with_credentials("alice", "guess");
    assert_eq!(act(&wrong, "w1", json!({"action": "end_of_day"})).0, 401);
    let viewer = v.client("victor");
    assert_eq!(viewer.get("/v1/instruments").unwrap().status, 200);
    assert_eq!(act(&viewer, "v1", json!({"action": "end_of_day"})).0, 403);
    let refused = v
        .monitor
        .registry()
        .counter_sum("bourse_admin_auth_refused_total");
    assert_eq!(refused, Some(3));

    // A deposit retried under its request id applies once; the id reused for another
    // request is refused.
    let deposit =
        json!({"action": "deposit", "market": "equities", "account": 1, "amount": 5_0000});
    let (status, first) = act(&ops, "dep-1", deposit.clone());
    assert_eq!(status, 200, "{first}");
    let (status, again) = act(&ops, "dep-1", deposit);
    assert_eq!(status, 200);
    assert_eq!(again["retried"], true);
    assert_eq!(again["markets"], first["markets"]);
    let other = json!({"action": "deposit", "market": "equities", "account": 1, "amount": 6_0000});
    assert_eq!(act(&ops, "dep-1", other).0, 409);
    let body = ops.get("/v1/accounts/1").unwrap().body;
    assert_eq!(account_in(&body, "equities")["cash"], json!(CASH + 5_0000));
    assert_eq!(account_in(&body, "futures")["cash"], json!(CASH));

    // Bad input is refused naming what is wrong, and nothing reaches a core.
    let (status, body) = act(
        &ops,
        "bad-1",
        json!({"action": "deposit", "market": "equities", "account": 1, "amount": 0}),
    );
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("amount"), "{body}");
    let (status, body) = act(
        &ops,
        "bad-2",
        json!({"action": "deposit", "market": "bonds", "account": 1, "amount": 1}),
    );
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("bonds"), "{body}");

    let mut fix = v.fix();
    let mut bin = v.binary();

    // A halted instrument refuses new orders with the halt's reason over both protocols...
    let (status, body) = act(
        &ops,
        "halt-1",
        json!({"action": "set_phase", "instrument": SBER, "phase": "halted"}),
    );
    assert_eq!(status, 200, "{body}");
    fix.new_order("F1", Some(1), "SBER", true, 10, Some("99.00"), '0')
        .unwrap();
    let (exec_type, text) = fix_report(&mut fix, "F1");
    assert_eq!(
        (exec_type.as_str(), text.as_str()),
        ("8", "InstrumentHalted")
    );
    let halted =
        bourse_wire::order_entry::codec::order_reject_reason::OrderRejectReason::InstrumentHalted
            as u16;
    assert_eq!(binary_order(&mut bin, 1, 1, SBER, 9_900, 10), Err(halted));
    // ... the other market trades on, and after resume both protocols are accepted.
    assert!(binary_order(&mut bin, 2, 1, SI, 99_000, 1).is_ok());
    let (status, _) = act(
        &ops,
        "resume-1",
        json!({"action": "set_phase", "instrument": SBER, "phase": "open"}),
    );
    assert_eq!(status, 200);
    fix.new_order("F2", Some(1), "SBER", true, 10, Some("99.00"), '0')
        .unwrap();
    assert_eq!(fix_report(&mut fix, "F2").0, "0");
    let sber_order = binary_order(&mut bin, 3, 1, SBER, 9_800, 10).expect("accepted after resume");

    // The kill switch of firm 7 cancels its orders in both cores (one in each here, plus the
    // FIX one) and refuses its new orders until released; firm 8 trades on.
    let (status, body) = act(
        &ops,
        "kill-1",
        json!({"action": "kill_switch", "firm": FIRM_A, "engaged": true}),
    );
    assert_eq!(status, 200, "{body}");
    let cancelled: u64 = body["markets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["events"].as_array().unwrap().iter())
        .filter(|e| e["event"] == "kill_switch_set")
        .map(|e| e["orders_cancelled"].as_u64().unwrap())
        .sum();
    assert_eq!(cancelled, 3, "{body}");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(binary_wait(&mut bin, |r| match *r {
            Response::CancelAck { order_id, .. } => Some(order_id),
            _ => None,
        }));
    }
    assert!(seen.contains(&sber_order), "{seen:?}");
    let body = ops.get("/v1/accounts/1").unwrap().body;
    for m in ["equities", "futures"] {
        assert_eq!(account_in(&body, m)["orders"], json!([]), "{m}");
        assert_eq!(account_in(&body, m)["kill_switch_engaged"], true);
    }
    let suspended =
        bourse_wire::order_entry::codec::order_reject_reason::OrderRejectReason::TradingSuspended
            as u16;
    assert_eq!(binary_order(&mut bin, 4, 1, SI, 99_000, 1), Err(suspended));
    fix.new_order("F3", Some(1), "SBER", true, 10, Some("99.00"), '0')
        .unwrap();
    assert_eq!(
        fix_report(&mut fix, "F3"),
        ("8".into(), "TradingSuspended".into())
    );
    assert!(
        binary_order(&mut bin, 5, 2, SI, 99_000, 1).is_ok(),
        "firm 8 trades on"
    );
    let (status, _) = act(
        &ops,
        "release-1",
        json!({"action": "kill_switch", "firm": FIRM_A, "engaged": false}),
    );
    assert_eq!(status, 200);
    assert!(binary_order(&mut bin, 6, 1, SI, 99_000, 1).is_ok());

    // Accounts in bulk: added in both markets and funded once; the same lines again under a
    // new id find them all and deposit nothing.
    let lines: String = (1_000..1_500)
        .map(|a| format!("{{\"account\":{a},\"firm\":9,\"cash\":1000000}}\n"))
        .collect();
    let bulk = |id: &str| {
        ops.bulk_accounts(id, &mut lines.as_bytes(), lines.len() as u64)
            .unwrap()
    };
    let r = bulk("bulk-1");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["accounts_added"], 1_000);
    assert_eq!(r.body["deposits"], 1_000);
    assert_eq!(bulk("bulk-1").body["retried"], true);
    let r = bulk("bulk-2");
    assert_eq!(r.body["accounts_existing"], 1_000, "{}", r.body);
    assert_eq!(r.body["deposits"], 0);
    let body = ops.get("/v1/accounts/1499").unwrap().body;
    assert_eq!(account_in(&body, "futures")["cash"], json!(1_000_000));
    // A broken line stops the stream there, naming it.
    let broken = "{\"account\":2000,\"firm\":9}\n{\"account\":2001,\"frim\":9}\n";
    let r = ops
        .bulk_accounts("bulk-3", &mut broken.as_bytes(), broken.len() as u64)
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(
        r.body["error"].as_str().unwrap().contains("line 2"),
        "{}",
        r.body
    );

    // A core's refusal: a deposit to an account the market does not have.
    let (status, body) = act(
        &ops,
        "dep-unknown",
        json!({"action": "deposit", "market": "equities", "account": 999, "amount": 1}),
    );
    assert_eq!(status, 422, "{body}");

    // The dashboard's admin panel: actions by kind, refusals by reason, the last requests.
    let frame: Value = serde_json::from_str(&bourse_monitor::dashboard::tick(&v.monitor)).unwrap();
    let admin = &frame["admin"];
    let total = |list: &str, name: &str| -> u64 {
        admin[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map_or(0, |r| r["total"].as_u64().unwrap())
    };
    // Deposits: dep-1 ran (its retry was answered from that run, uncounted), its id reused
    // for another deposit (409), bad-1 and bad-2 refused as invalid, and dep-unknown.
    assert_eq!(total("actions", "deposit"), 5, "{admin}");
    assert_eq!(total("actions", "kill_switch"), 2, "{admin}");
    assert_eq!(total("actions", "add_accounts_bulk"), 3, "{admin}");
    assert_eq!(total("refusals", "unauthenticated"), 2, "{admin}");
    assert_eq!(total("refusals", "unauthorised"), 1, "{admin}");
    assert_eq!(total("refusals", "conflict"), 1, "{admin}");
    assert_eq!(total("refusals", "invalid"), 3, "{admin}");
    assert_eq!(total("refusals", "unknown_account"), 1, "{admin}");
    let newest = &admin["recent"][0];
    assert_eq!(
        (
            &newest["operator"],
            &newest["request_id"],
            &newest["action"]
        ),
        (&json!("alice"), &json!("dep-unknown"), &json!("deposit")),
        "{admin}"
    );
    assert_eq!(newest["outcome"], "rejected");

    // End of day through the same path; then every replica agrees.
    let (status, body) = act(&ops, "eod-1", json!({"action": "end_of_day"}));
    assert_eq!(status, 200, "{body}");
    v.replicas_agree();

    // The audit log names who did what, and how it ended.
    let audit = std::fs::read_to_string(&v.audit).unwrap();
    let records: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kill = records
        .iter()
        .find(|r| r["request_id"] == "kill-1")
        .unwrap();
    assert_eq!(kill["operator"], "alice");
    assert_eq!(kill["action"], "kill_switch");
    assert_eq!(kill["outcome"], "applied");
    assert!(records
        .iter()
        .any(|r| r["outcome"] == "refused" && r["operator"] == "victor"));
    let mut v = v;
    v.deployment.stop();
}
