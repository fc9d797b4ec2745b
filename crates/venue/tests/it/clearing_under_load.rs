//! A load test whose profile asks for an intermediate clearing while the load runs
//! (`[[clearing_runs]]`): the run happens once, each of its movements is applied once on its
//! core's committed stream, variation margin sums to zero per instrument and the cash moved
//! is what the margin says, the load's cross-checks hold, and the report has the section.

use bourse_clearing::{run_client_id, stream_end};
use bourse_cluster::StreamConsumer;
use bourse_loadgen::gateway::SessionProtocol;
use bourse_loadgen::{Profile, RunOptions};
use bourse_venue::{Backend, DeploymentSpec, LocalDeployment, MarketSpec};
use std::collections::BTreeMap;

const PROFILE: &str = r#"
name = "clearing-under-load"
seed = 11

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
share = 0.4
live_orders_target = 50

[[markets]]
name = "derivatives"
kind = "futures"
instruments = 2
accounts = 8
share = 0.6
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

[[clearing_runs]]
at_s = 1.5
kind = "intermediate"
"#;

/// Every account the generator trades, on any market (as `bourse loadtest` plans them).
fn session_accounts(profile: &Profile) -> Vec<u32> {
    let mut accounts: Vec<u32> = Vec::new();
    for m in &profile.markets {
        let (first, count) = bourse_loadgen::flow::worker_accounts(m.accounts, 0, 1);
        accounts.extend(first..first + count);
    }
    accounts.sort_unstable();
    accounts.dedup();
    accounts
}

#[test]
fn an_intermediate_clearing_under_load_runs_once_pays_once_conserves_cash_and_is_reported() {
    let profile = Profile::parse(PROFILE).expect("the profile parses");
    profile.check_runnable().expect("the profile runs");
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
        accounts_max: 64,
        fsync: bourse_cluster::FsyncSetting::Never,
        market_data: false,
        monitor: None,
        extra_fix_sessions: Vec::new(),
        verbose: false,
        core_in_flight_max: None,
        bounds: None,
    };
    let mut deployment = LocalDeployment::start(spec).expect("venue starts");
    deployment
        .clear_under_load(profile.clearing_runs.clone(), dir.path().join("clearing"))
        .expect("the clearing service starts");
    let options = RunOptions {
        progress: false,
        version: "test".into(),
        ticker: false,
        stop: None,
        live: None,
    };
    let results = bourse_loadgen::run_on(&profile, &options, &mut deployment).expect("the run");

    // The run happened once, completely.
    assert_eq!(
        results.clearing_runs.len(),
        1,
        "{:?}",
        results.clearing_runs
    );
    let figures = &results.clearing_runs[0];
    let done = &figures.run;
    assert_eq!(done.outcome, "done", "{:?}", done.error);
    assert_eq!(
        (done.run_id, done.pending, done.kind.as_str()),
        (1, 0, "intermediate")
    );
    assert!(done.positions > 0, "the run cleared positions: {done:?}");
    assert!(done.unbalanced_instruments.is_empty(), "{done:?}");
    assert!(figures.end_s > figures.first_s);
    let node = deployment.clearing_node().expect("the clearing service");
    let plan = {
        let inner = node.shared().inner.read().unwrap();
        assert_eq!(inner.runs.keys().copied().collect::<Vec<_>>(), vec![1]);
        inner.runs[&1].plan.clone()
    };
    assert_eq!(plan.cut, done.cut);
    assert!(!plan.margin.is_empty(), "futures positions were margined");

    // Conservation: per instrument, the margin lines and the rounding kept sum to zero; the
    // cash moved is the margin paid less what rounding kept, account by account.
    let mut per_instrument: BTreeMap<u32, i128> = BTreeMap::new();
    let mut per_account: BTreeMap<u32, i128> = BTreeMap::new();
    for l in &plan.margin {
        *per_instrument.entry(l.instrument.0).or_default() += l.vm.0;
        *per_account.entry(l.account.0).or_default() += l.vm.0;
    }
    for (i, r) in &plan.rounding {
        *per_instrument.entry(i.0).or_default() += r.0;
    }
    assert!(
        per_instrument.values().all(|s| *s == 0),
        "{per_instrument:?}"
    );
    let mut moved: BTreeMap<u32, i128> = BTreeMap::new();
    for m in &plan.movements {
        *moved.entry(m.account.0).or_default() += m.amount.0;
    }
    per_account.retain(|_, v| *v != 0);
    assert_eq!(moved, per_account, "movements are the accounts' net margin");

    // Each movement was applied once on its core's committed stream, under the run's keys.
    let cores = deployment.node_addrs();
    let rt = deployment.runtime_handle().unwrap();
    for (core, (name, nodes)) in cores.iter().enumerate() {
        let expected: Vec<(u64, u32)> = plan
            .commands(core)
            .iter()
            .map(|(seq, _)| (*seq, 1))
            .collect();
        let seen = rt.block_on(async {
            let end = stream_end(nodes).await.unwrap();
            let mut consumer = StreamConsumer::remote(nodes.clone(), 0);
            let mut seen = BTreeMap::new();
            while consumer.position() < end {
                let entry = consumer.next().await.unwrap();
                for r in entry.requests() {
                    if r.key().0 == run_client_id(1, core) && r.applied_here() {
                        *seen.entry(r.key().1).or_insert(0u32) += 1;
                    }
                }
            }
            seen.into_iter().collect::<Vec<_>>()
        });
        assert_eq!(seen, expected, "core {name}");
    }

    // The load's own cross-checks hold with clearing's commands counted apart: each core
    // says it applied the run's movements there as clearing's, and nothing it cannot place.
    let failed: Vec<_> = results.checks.iter().filter(|c| !c.ok).collect();
    assert!(failed.is_empty(), "cross-checks failed: {failed:?}");
    for (core, totals) in results.cores.iter().enumerate() {
        let sources = totals
            .applied_by_source
            .expect("replicated cores tell sources apart");
        assert_eq!(
            (sources.clearing, sources.unknown),
            (plan.commands(core).len() as u64, 0),
            "core {}: {sources:?}",
            totals.market
        );
        assert_eq!(sources.gateways, totals.commands);
    }
    deployment.stop();

    let md = bourse_loadgen::report::markdown(&results, None);
    assert!(md.contains("Clearing under load"), "{md}");
    assert!(md.contains("Commands applied by source"), "{md}");
    assert!(md.contains("intermediate (run 1)"), "{md}");
    // The run's time is split into its steps, as the clearing service measured them.
    assert!(
        md.contains("| waiting s | computing s | executing s |"),
        "{md}"
    );
}
