//! Clearing under load: a profile's `[[clearing_runs]]`. A clearing service
//! (`bourse_clearing::ClearingNode`, as `bourse clearing serve` runs it) is started in this
//! process on the deployment's replicated cores before the load, so it has followed their
//! committed streams from the first entry; a thread of its own asks it for each run at the
//! profile's time and records what the run did, for the load test's report.

use bourse_clearing::node::Limits;
use bourse_clearing::schedule::ScheduleSection;
use bourse_clearing::{
    ClearingConfig, ClearingNode, Clock, Report, RunKind, RunRequest, SystemClock,
};
use bourse_core::Instrument;
use bourse_loadgen::profile::{ClearingRunKind, ClearingRunSpec};
use bourse_loadgen::results::ClearingRunDone;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long a run may wait for the clearing state to catch up with the cores under load.
const RUN_WAIT_MS: u64 = 60_000;

/// The clearing service and the runs the profile asks of it.
pub(crate) struct ClearingUnderLoad {
    pub node: Arc<ClearingNode>,
    pub runs: Vec<ClearingRunSpec>,
    pub running: Option<std::thread::JoinHandle<Vec<ClearingRunDone>>>,
}

/// How a deployment's clearing service is reached and when it runs by itself.
pub struct ClearingOptions {
    /// Its runs, reports and snapshots.
    pub state_dir: PathBuf,
    /// Its HTTP listener (port 0: any free port).
    pub listen: SocketAddr,
    /// Who may ask for runs (none: anyone on the loopback, docs/clearing.md).
    pub operators: Vec<bourse_auth::CredentialEntry>,
    /// A venue config file whose `[schedule]` gives the trading day, and the clock the
    /// service reads it by: it then runs an intermediate clearing at each pause between
    /// sessions and the end of day's at the end of day, as `bourse clearing serve` does.
    pub schedule: Option<(PathBuf, Arc<dyn Clock>)>,
}

impl ClearingOptions {
    /// A service on any free loopback port that runs only when asked (a load test's).
    pub fn asked_only(state_dir: PathBuf) -> ClearingOptions {
        ClearingOptions {
            state_dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            operators: Vec::new(),
            schedule: None,
        }
    }
}

/// How often a scheduled service reads its clock. A demo's day runs up to an hour a second,
/// so a pause of five minutes lasts about 80 ms of real time.
const SCHEDULE_POLL_MS: u64 = 20;

/// Starts a clearing service on `cores` (their nodes, in the venue's core order).
pub(crate) fn start_node(
    cores: Vec<Vec<SocketAddr>>,
    instruments: Vec<Instrument>,
    options: ClearingOptions,
) -> Result<ClearingNode, String> {
    let state_dir = options.state_dir;
    std::fs::create_dir_all(&state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
    // The definitions the service clears with, beside its state, as `bourse clearing serve`
    // would read them.
    let instruments_path = state_dir.join("instruments.json");
    let json = serde_json::to_vec_pretty(&instruments).map_err(|e| e.to_string())?;
    std::fs::write(&instruments_path, json)
        .map_err(|e| format!("{}: {e}", instruments_path.display()))?;
    let (schedule, clock) = match options.schedule {
        Some((file, clock)) => (
            Some(ScheduleSection {
                file,
                markets: Vec::new(),
                // The clock may run thousands of times faster than the wall clock: a run
                // found due a whole day ago is still run, never skipped as missed.
                catch_up_ms: 24 * 3_600 * 1_000,
                poll_ms: SCHEDULE_POLL_MS,
            }),
            clock,
        ),
        None => (None, Arc::new(SystemClock) as Arc<dyn Clock>),
    };
    let config = ClearingConfig {
        name: "venue-clearing".into(),
        listen: options.listen,
        cores,
        tls: None,
        instruments: instruments_path,
        state_dir,
        // Snapshots only at stop: the run is minutes long and the state is rebuilt from
        // the streams if it must be.
        snapshot_interval_ms: 0,
        settlement: Default::default(),
        standby_of: None,
        standby_login: None,
        operators: options.operators,
        limits: Limits {
            run_wait_ms: RUN_WAIT_MS,
            ..Limits::default()
        },
        schedule,
        fix: None,
        fees: None,
        settlement_cycle: Default::default(),
    };
    ClearingNode::start_with_clock(config, instruments, clock)
}

fn kind_of(k: ClearingRunKind) -> RunKind {
    match k {
        ClearingRunKind::Intermediate => RunKind::Intermediate,
        ClearingRunKind::EndOfDay => RunKind::EndOfDay,
    }
}

/// Starts the thread: for each run, it waits until its time after the run's start, asks the
/// service for it, and records what it did.
pub(crate) fn start(
    node: Arc<ClearingNode>,
    runs: Vec<ClearingRunSpec>,
    run_start_unix_ns: u64,
) -> std::io::Result<std::thread::JoinHandle<Vec<ClearingRunDone>>> {
    std::thread::Builder::new()
        .name("clearing-under-load".into())
        .spawn(move || {
            runs.iter()
                .map(|spec| {
                    let due = run_start_unix_ns + (spec.at_s * 1e9) as u64;
                    let now = bourse_loadgen::unix_ns();
                    if due > now {
                        std::thread::sleep(Duration::from_nanos(due - now));
                    }
                    run_one(&node, spec)
                })
                .collect()
        })
}

/// A run that could not be asked: why.
pub(crate) fn not_run(spec: &ClearingRunSpec, at_unix_ns: u64, why: String) -> ClearingRunDone {
    ClearingRunDone {
        at_s: spec.at_s,
        kind: spec.kind.name().to_string(),
        run_id: 0,
        start_unix_ns: at_unix_ns,
        end_unix_ns: at_unix_ns,
        outcome: "failed".into(),
        error: Some(why),
        positions: 0,
        accounts: 0,
        movements: 0,
        refused: 0,
        pending: 0,
        cut: Vec::new(),
        margin_paid: 0,
        unbalanced_instruments: Vec::new(),
        wait_ms: 0,
        compute_ms: 0,
        execute_ms: 0,
    }
}

/// Asks the service for one run and describes it.
fn run_one(node: &ClearingNode, spec: &ClearingRunSpec) -> ClearingRunDone {
    let request = RunRequest {
        kind: Some(kind_of(spec.kind)),
        ..RunRequest::default()
    };
    let start_unix_ns = bourse_loadgen::unix_ns();
    let answer = node.block_on(node.shared().run(request));
    let end_unix_ns = bourse_loadgen::unix_ns();
    let mut done = not_run(spec, start_unix_ns, String::new());
    done.end_unix_ns = end_unix_ns;
    let report = match answer {
        Ok(report) => report,
        Err(e) => {
            done.error = Some(format!("{} {}", e.status, e.message));
            return done;
        }
    };
    describe(node, &report, done)
}

/// What `report`'s run did, into `done` (which says when it was asked and of what kind).
fn describe(node: &ClearingNode, report: &Report, mut done: ClearingRunDone) -> ClearingRunDone {
    done.outcome = "done".into();
    done.error = None;
    let plan = node
        .shared()
        .inner
        .read()
        .expect("clearing state")
        .runs
        .get(&report.run_id)
        .map(|r| Arc::clone(&r.plan));
    let Some(plan) = plan else {
        done.outcome = "failed".into();
        done.error = Some(format!("run {}'s plan is unknown", report.run_id));
        return done;
    };
    // Margin lines and the rounding kept sum to zero per instrument (the clearing house
    // neither gains nor loses); an instrument where they do not is named.
    let mut sums: BTreeMap<u32, i128> = BTreeMap::new();
    for l in &plan.margin {
        *sums.entry(l.instrument.0).or_default() += l.vm.0;
    }
    for (i, r) in &plan.rounding {
        *sums.entry(i.0).or_default() += r.0;
    }
    done.run_id = report.run_id;
    done.positions = (plan.margin.len() + plan.obligations.len()) as u64;
    done.accounts = report.accounts.len() as u64;
    done.movements = report.movements as u64;
    done.refused = report.refused as u64;
    done.pending = report.pending as u64;
    done.cut = plan.cut.clone();
    if let Some(t) = report.timing {
        done.wait_ms = t.wait_ms;
        done.compute_ms = t.compute_ms;
        done.execute_ms = t.execute_ms;
    }
    done.margin_paid = plan
        .margin
        .iter()
        .filter(|l| l.vm.0 > 0)
        .map(|l| l.vm.0)
        .sum();
    done.unbalanced_instruments = sums
        .into_iter()
        .filter(|(_, s)| *s != 0)
        .map(|(i, _)| i)
        .collect();
    if report.pending > 0 {
        done.outcome = "incomplete".into();
    }
    done
}

/// The runs the service made on its schedule by itself, in order, described as a load test's
/// asked runs are (`at_s` counted from `run_start_unix_ns`); a run the schedule started that
/// has no report yet is `incomplete`.
pub(crate) fn scheduled_runs(node: &ClearingNode, run_start_unix_ns: u64) -> Vec<ClearingRunDone> {
    let records: Vec<_> = {
        let inner = node.shared().inner.read().expect("clearing state");
        inner
            .runs
            .values()
            .filter(|r| r.plan.scheduled_ns.is_some())
            .map(|r| (r.plan.kind, r.report.clone()))
            .collect()
    };
    records
        .into_iter()
        .map(|(kind, report)| {
            let kind = match kind {
                RunKind::Intermediate => ClearingRunKind::Intermediate,
                RunKind::EndOfDay => ClearingRunKind::EndOfDay,
            };
            let timing = report.as_ref().and_then(|r| r.timing).unwrap_or_default();
            let asked = timing.asked_unix_ns.max(run_start_unix_ns);
            let spec = ClearingRunSpec {
                at_s: (asked - run_start_unix_ns) as f64 / 1e9,
                kind,
            };
            let mut done = not_run(&spec, asked, "started by the schedule, not finished".into());
            done.end_unix_ns = timing.done_unix_ns.max(asked);
            match report {
                Some(r) => describe(node, &r, done),
                None => {
                    done.outcome = "incomplete".into();
                    done
                }
            }
        })
        .collect()
}
