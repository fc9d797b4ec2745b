//! A load test whose profile adds accounts through the admin path while the load runs
//! (`[accounts_under_load]`): every account is added and funded in its market, on every
//! replica alike, the load's cross-checks hold, the generator opens positions on the added
//! accounts it trades, and the results carry the section.

use bourse_loadgen::gateway::SessionProtocol;
use bourse_loadgen::{Profile, RunOptions};
use bourse_venue::{
    Backend, DeploymentSpec, LocalDeployment, MarketSpec, ACCOUNTS_UNDER_LOAD_ID_BASE,
};

const ADDED: u64 = 3_000;
/// Of them, the generator trades the first this many (as many as its own in that market).
const TRADED: u32 = 8;

fn profile() -> Profile {
    let text = format!(
        r#"
name = "under-load"
seed = 7

[target]
kind = "cluster"
protocol = "binary"
sessions = 1
queue_capacity = 4096
fsync = "never"
market_data = false

[generator]
workers = 1
pacing = "uniform"
inflight_max = 4096
drain_timeout_s = 10

[[markets]]
name = "spot"
kind = "equity"
instruments = 2
accounts = 8
share = 0.5
live_orders_target = 50

[[markets]]
name = "derivatives"
kind = "futures"
instruments = 2
accounts = 8
share = 0.5
live_orders_target = 50

[mix]
limit = 56
market = 1
ioc = 2
fok = 1
cancel = 40
replace = 0
mass_cancel = 0
crossing_share = 0.3

[[phases]]
name = "warm-up"
duration_s = 1
warmup = true
[phases.rate]
shape = "constant"
per_s = 200

[[phases]]
name = "measured"
duration_s = 2
[phases.rate]
shape = "constant"
per_s = 200

[accounts_under_load]
market = "derivatives"
count = {ADDED}
start_s = 0.2
cash = 10000000000000000
traded = {TRADED}
"#
    );
    let profile = Profile::parse(&text).expect("the profile parses");
    profile.check_runnable().expect("the profile runs");
    profile
}

/// Every account the generator trades, on any market (as `bourse loadtest` plans them).
fn session_accounts(profile: &Profile) -> Vec<u32> {
    let mut accounts: Vec<u32> = Vec::new();
    for (i, m) in profile.markets.iter().enumerate() {
        let (first, count) = bourse_loadgen::flow::worker_accounts(m.accounts, 0, 1);
        accounts.extend(first..first + count);
        let (first, count) = bourse_loadgen::flow::worker_late_accounts(profile, i, 0);
        accounts.extend(first..first + count);
    }
    accounts.sort_unstable();
    accounts.dedup();
    accounts
}

#[test]
fn accounts_added_under_load_are_in_their_market_on_every_replica_and_reported() {
    let profile = profile();
    let dir = tempfile::tempdir().unwrap();
    let markets = profile
        .markets
        .iter()
        .enumerate()
        .map(|(m, spec)| MarketSpec {
            name: spec.name.clone(),
            instruments: bourse_loadgen::flow::instruments(spec, m),
            setup: bourse_loadgen::setup_commands(&profile, m, 0),
        })
        .collect();
    let spec = DeploymentSpec {
        markets,
        backend: Backend::Cluster,
        protocol: SessionProtocol::Binary,
        gateways: 1,
        worker_sessions: vec![vec![session_accounts(&profile)]],
        data_dir: dir.path().join("venue"),
        orders_max: bourse_loadgen::orders_max_of(&profile),
        accounts_max: 64 + ADDED as u32,
        fsync: bourse_cluster::FsyncSetting::Never,
        market_data: false,
        monitor: None,
        extra_fix_sessions: Vec::new(),
        verbose: false,
        core_in_flight_max: None,
        bounds: None,
    };
    let mut deployment = LocalDeployment::start(spec).expect("venue starts");
    deployment.add_accounts_under_load(
        profile.accounts_under_load.clone().unwrap(),
        dir.path().join("audit.jsonl"),
    );
    let options = RunOptions {
        progress: false,
        version: "test".into(),
        ticker: false,
        stop: None,
        live: None,
    };
    let results = bourse_loadgen::run_on(&profile, &options, &mut deployment).expect("the run");
    let section = results
        .accounts_under_load
        .as_ref()
        .expect("the results have the section");
    assert_eq!(
        section.added.outcome, "applied",
        "{:?}",
        section.added.error
    );
    assert_eq!(section.added.accounts, ADDED);
    assert_eq!(section.added.commands, ADDED, "one command per account");
    assert_eq!(section.added.market, "derivatives");
    let failed: Vec<_> = results.checks.iter().filter(|c| !c.ok).collect();
    assert!(failed.is_empty(), "cross-checks failed: {failed:?}");
    // The additions went through the admin path to the derivatives core alone, and its
    // table counts each once as the admin's.
    let admin_by_core: Vec<u64> = results
        .cores
        .iter()
        .map(|c| c.applied_by_source.expect("replicated cores").admin)
        .collect();
    assert_eq!(admin_by_core, [0, ADDED]);

    // The last account is funded in derivatives (core 1) and absent from spot (core 0).
    let admin = deployment.admin_venue().unwrap();
    let rt = deployment.runtime_handle().unwrap();
    let last = ACCOUNTS_UNDER_LOAD_ID_BASE + ADDED as u32 - 1;
    let read = |core: usize| {
        rt.block_on(admin.read(
            core,
            Box::new(move |e: &bourse_engine::Engine| {
                serde_json::json!(e.account(bourse_core::AccountId(last)).map(|a| a.cash.0))
            }),
        ))
        .unwrap()
    };
    assert_eq!(read(1), serde_json::json!(10_000_000_000_000_000i64));
    assert_eq!(read(0), serde_json::Value::Null);

    // The generator traded the first added accounts: the report's count of their positions
    // is the core's, and trading opened some (a third of the orders cross, half of the
    // derivatives orders are theirs, and they are added in the first fifth of the run).
    assert_eq!(section.added.traded_accounts, u64::from(TRADED));
    let held = rt
        .block_on(admin.read(
            1,
            Box::new(|e: &bourse_engine::Engine| {
                let n: usize = (0..TRADED)
                    .map(|k| {
                        e.account_positions(bourse_core::AccountId(ACCOUNTS_UNDER_LOAD_ID_BASE + k))
                            .iter()
                            .filter(|p| p.1 .0 != 0)
                            .count()
                    })
                    .sum();
                serde_json::json!(n)
            }),
        ))
        .unwrap();
    assert_eq!(serde_json::json!(section.added.positions_held), held);
    assert!(section.added.positions_held > 0, "{section:?}");
    deployment.stop();

    let md = bourse_loadgen::report::markdown(&results, None);
    assert!(md.contains("Accounts added under load"), "{md}");
}
