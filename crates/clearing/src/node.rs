//! [`ClearingNode`]: the clearing service (`bourse clearing serve`). It follows every core's
//! committed stream continuously into one [`ClearingState`], serves it over HTTP/JSON
//! (`server`), runs clearings when an operator asks, snapshots its state, and can stand by
//! for another clearing node.
//!
//! One feed task per core applies entries under the state's write lock. Runs are the
//! pure `compute_run` at the state's own cut (taken under the lock once the state has caught
//! up with every core's end, so a run clears everything the cores had applied when it was
//! asked), saved durably, settled into the state at once, then executed through the sequenced
//! path (`execute`, resumable under the run's id).
//!
//! Saved runs the state has not settled yet (after a restart from an older snapshot, or runs
//! a standby read from its primary) are *pending*: a feed stops in front of the first pending
//! run's cut on its core until every core stands at the cut, where the state's hash is checked
//! against the run's and the run is settled, so a restarted node reaches bit for bit the
//! state it had. A standby whose feeds are already past a run's cut settles it as soon as it
//! learns of it: settling only adds to fields trades never read, so the order does not change
//! the result.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bourse_auth::{CredentialEntry, CredentialStore};
use bourse_cluster::{StreamConsumer, StreamError};
use bourse_core::Instrument;
use bourse_journal::{SnapshotMeta, SnapshotStore};
use bourse_monitor::metrics::{Counter, Gauge, Histogram, Registry};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::fees::FeeSchedule;
use crate::fix::{FixSection, FixServer};
use crate::report::{save_plan, saved_runs, Report, RunTiming};
use crate::run::{compute_run_with_fees, ObligationLine, RunKind, RunPlan, SettlementRule};
use crate::schedule::{ClearingSchedule, Clock, ScheduleSection, ScheduledRun, SystemClock};
use crate::service::{execute, stream_end, with_ids, ExecuteOptions};
use crate::settlement::{date_obligations, default_calendar, SettlementCycle};
use crate::state::ClearingState;

/// Every explicit limit of a clearing node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Open HTTP connections; a newcomer past it displaces the connection that has waited
    /// longest for its request, or is closed if every one is busy.
    pub connections_max: usize,
    /// HTTP connections from one address waiting for their request at once; a newcomer past
    /// it displaces its own address's longest-waiting one.
    pub waiting_per_address_max: usize,
    /// A request head must arrive within this time.
    pub header_read_timeout_ms: u64,
    /// Accounts listed in one firm answer at most (page with `after`).
    pub accounts_per_answer_max: usize,
    /// How often each core's end is asked for the lag figures.
    pub status_interval_ms: u64,
    /// How long a run waits for the state to catch up with the cores' ends (and a resumed
    /// run for its pending plan to settle) before it is refused.
    pub run_wait_ms: u64,
    /// How often a standby asks its primary for new runs.
    pub standby_poll_ms: u64,
}

impl Limits {
    /// The HTTP listener's admission limits: a connection proves itself with each request
    /// head, which must come within `header_read_timeout_ms`.
    pub fn admission(&self) -> bourse_admission::Limits {
        bourse_admission::Limits::new(
            self.connections_max,
            self.waiting_per_address_max,
            self.header_read_timeout_ms,
        )
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections_max: 256,
            waiting_per_address_max: 32,
            header_read_timeout_ms: 5_000,
            accounts_per_answer_max: 10_000,
            status_interval_ms: 500,
            run_wait_ms: 30_000,
            standby_poll_ms: 200,
        }
    }
}

/// What a clearing node is (the `bourse clearing serve` TOML file has this shape).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearingConfig {
    /// The deployment's name: snapshots carry its hash and another deployment's are refused.
    pub name: String,
    /// The HTTP/JSON API's address (default 127.0.0.1:9460).
    #[serde(default = "listen_default")]
    pub listen: SocketAddr,
    /// The nodes of each core, in the venue's core order.
    pub cores: Vec<Vec<SocketAddr>>,
    /// Mutual TLS to every core's nodes (`tls = { ca_path, cert_path, key_path }`, this
    /// service's own certificate); without it, plain TCP, which only loopback nodes allow.
    #[serde(default)]
    pub tls: Option<bourse_cluster::TlsFiles>,
    /// The instruments the cores trade: a JSON array of `AddInstrument` definitions.
    pub instruments: PathBuf,
    /// Runs (`runs/`), reports (`reports/run-<id>/`) and snapshots (`snapshots/`).
    pub state_dir: PathBuf,
    /// How often the state is snapshotted (also at stop); 0: only at stop.
    #[serde(default = "snapshot_interval_ms_default")]
    pub snapshot_interval_ms: u64,
    /// The settlement rule of runs that name none.
    #[serde(default)]
    pub settlement: SettlementRule,
    /// Stand by for the clearing node at this address (`http://host:port`): follow the same
    /// streams, read its runs, and compute none until `POST /v1/takeover`.
    #[serde(default)]
    pub standby_of: Option<String>,
    /// The standby's credentials at its primary (a `viewer` or `operator` there): a run's
    /// plan lists every firm's accounts, so a primary with credentials shows it to them
    /// alone.
    #[serde(default)]
    pub standby_login: Option<StandbyLogin>,
    /// Operators who may run clearings (role `operator`).
    #[serde(default)]
    pub operators: Vec<CredentialEntry>,
    #[serde(default)]
    pub limits: Limits,
    /// Runs on the venue's schedule (`[schedule]`: its file, the markets whose pauses drive
    /// the runs); absent: runs only when asked.
    #[serde(default)]
    pub schedule: Option<ScheduleSection>,
    /// Clearing data over FIX (`[fix]`: RequestForPositions answered with PositionReports on
    /// a port of its own); absent: HTTP only.
    #[serde(default)]
    pub fix: Option<FixSection>,
    /// Trading fees charged by each new run (`[fees]`: the venue's account and the rates);
    /// absent: none. A run records the schedule it charged with in its plan.
    #[serde(default)]
    pub fees: Option<FeeSchedule>,
    /// Business days from trade date to settlement of equity and FX obligations
    /// (`[settlement_cycle]`: `equity_days`, `fx_days`, per-symbol `instruments`); absent:
    /// equities T+1, FX T+0, on the `[schedule]` file's calendar.
    #[serde(default)]
    pub settlement_cycle: SettlementCycle,
}

fn listen_default() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9460))
}

fn snapshot_interval_ms_default() -> u64 {
    10_000
}

impl ClearingConfig {
    /// Reads a TOML file of this shape (unknown keys are refused) and validates it; a
    /// relative `instruments` or `state_dir` is taken from the file's directory.
    pub fn load(path: &Path) -> Result<ClearingConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut config: ClearingConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.instruments = base.join(&config.instruments);
        config.state_dir = base.join(&config.state_dir);
        if let Some(section) = config.schedule.as_mut() {
            crate::schedule::resolve(section, base);
        }
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.cores.is_empty() {
            return Err("a clearing node needs at least one core".into());
        }
        if let Some(i) = self.cores.iter().position(|c| c.is_empty()) {
            return Err(format!("core {i} lists no node"));
        }
        self.check_open_only_on_loopback()?;
        if let Some(fees) = &self.fees {
            fees.check()?;
        }
        if let Some(fix) = &self.fix {
            fix.validate()?;
            if !fix.listen.ip().is_loopback() && self.operators.is_empty() {
                return Err(
                    "fix.listen: FIX off the loopback needs credentials ([[operators]]): \
                     sessions log on with them"
                        .into(),
                );
            }
        }
        self.settlement
            .check()
            .map_err(|e| format!("settlement: {e}"))?;
        let l = &self.limits;
        if l.connections_max == 0 || l.accounts_per_answer_max == 0 {
            return Err("limits: connections_max and accounts_per_answer_max must be > 0".into());
        }
        l.admission().validate("limits")?;
        if l.status_interval_ms == 0 || l.standby_poll_ms == 0 {
            return Err("limits: status_interval_ms and standby_poll_ms must be > 0".into());
        }
        if self.schedule.as_ref().is_some_and(|s| s.poll_ms == 0) {
            return Err("schedule.poll_ms must be > 0".into());
        }
        Ok(())
    }

    /// Without `[[operators]]` the node has no credentials to check, so it answers everyone
    /// who reaches it, clearing runs and takeovers included: that is safe only where the
    /// only ones who can reach it are this host's own programs, on a loopback address.
    fn check_open_only_on_loopback(&self) -> Result<(), String> {
        if !self.operators.is_empty() || self.listen.ip().is_loopback() {
            return Ok(());
        }
        Err(format!(
            "listen = \"{}\" is not a loopback address, and without [[operators]] a clearing \
             node answers everyone who reaches it, clearing runs included: listen on \
             127.0.0.1 or [::1], or add [[operators]] (hashes from `bourse auth hash-password`)",
            self.listen
        ))
    }

    fn runs_dir(&self) -> PathBuf {
        self.state_dir.join("runs")
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.state_dir.join("snapshots")
    }

    pub fn report_dir(&self, run_id: u32) -> PathBuf {
        self.state_dir
            .join("reports")
            .join(format!("run-{run_id:06}"))
    }

    fn cluster_id(&self) -> u128 {
        u128::from(xxhash_rust::xxh3::xxh3_64(self.name.as_bytes()))
    }
}

/// Reads a JSON array of instrument definitions, each validated.
pub fn load_instruments(path: &Path) -> Result<Vec<Instrument>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let defs: Vec<Instrument> = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a JSON array of instruments: {e}", path.display()))?;
    for d in &defs {
        d.validate()
            .map_err(|e| format!("{}: instrument {}: {e}", path.display(), d.instrument))?;
    }
    Ok(defs)
}

/// The node's figures, exported at `GET /metrics`.
pub struct Metrics {
    pub registry: Registry,
    /// Per core: committed entries applied.
    pub entries_applied: Vec<Counter>,
    /// Per core: entries the core has applied that the state has not (at the last status).
    pub lag_entries: Vec<Gauge>,
    /// Per core: how old the newest applied event is while entries are owed, in ns (0 when
    /// caught up).
    pub lag_ns: Vec<Gauge>,
    /// Per entry with events: its application time less its newest event's time stamp.
    pub apply_lag: Histogram,
    pub runs_done: Counter,
    pub runs_failed: Counter,
    pub run_time: Histogram,
    pub snapshots: Counter,
    pub positions: Gauge,
    pub connections: Gauge,
}

impl Metrics {
    fn new(cores: usize) -> Metrics {
        let r = Registry::new();
        let per_core = |f: &dyn Fn(&str) -> Gauge| -> Vec<Gauge> {
            (0..cores).map(|c| f(&c.to_string())).collect()
        };
        let runs = |outcome: &str| {
            r.counter(
                "bourse_clearing_runs_total",
                "Clearing runs by outcome",
                &[("outcome", outcome)],
            )
        };
        Metrics {
            entries_applied: (0..cores)
                .map(|c| {
                    r.counter(
                        "bourse_clearing_entries_applied_total",
                        "Committed entries applied to the clearing state",
                        &[("core", &c.to_string())],
                    )
                })
                .collect(),
            lag_entries: per_core(&|c| {
                r.gauge(
                    "bourse_clearing_lag_entries",
                    "Entries the core applied that clearing has not",
                    &[("core", c)],
                )
            }),
            lag_ns: per_core(&|c| {
                r.gauge(
                    "bourse_clearing_lag_ns",
                    "Age of clearing's newest event while it owes entries (0 when caught up)",
                    &[("core", c)],
                )
            }),
            apply_lag: r.histogram(
                "bourse_clearing_apply_lag_seconds",
                "Per entry: applied by clearing less its newest event's time stamp",
                &[],
            ),
            runs_done: runs("done"),
            runs_failed: runs("failed"),
            run_time: r.histogram(
                "bourse_clearing_run_seconds",
                "A run from its request to its last command applied",
                &[],
            ),
            snapshots: r.counter(
                "bourse_clearing_snapshots_total",
                "Snapshots of the clearing state written",
                &[],
            ),
            positions: r.gauge(
                "bourse_clearing_positions",
                "Positions (account, instrument) in the clearing state",
                &[],
            ),
            connections: r.gauge(
                bourse_monitor::names::LISTENER_CONNECTIONS_OPEN,
                "Connections open at a listener.",
                &[("listener", "clearing_http")],
            ),
            registry: r,
        }
    }
}

/// A run the node knows: its plan, and its report once it has one.
#[derive(Clone, Debug)]
pub struct RunRecord {
    pub plan: Arc<RunPlan>,
    pub report: Option<Report>,
}

/// The state and the runs, under one lock.
pub struct Inner {
    pub state: ClearingState,
    /// Saved runs not yet settled into the state, in run order.
    pending: VecDeque<Arc<RunPlan>>,
    /// Every run known here, by id. Added to only through `add_run`, which keeps
    /// `settlement_dates` in step.
    pub runs: BTreeMap<u32, RunRecord>,
    /// Per settlement date (`YYYY-MM-DD`), the obligations dated there: (run id, index in
    /// the run's `obligations`), in run order. `GET /v1/settlements/{date}` reads one day's
    /// list instead of every run's obligations.
    settlement_dates: BTreeMap<String, Vec<(u32, usize)>>,
}

impl Inner {
    /// Records a run (computed here, read from disk, or learned from a primary) and indexes
    /// its obligations by settlement date.
    fn add_run(&mut self, plan: Arc<RunPlan>, report: Option<Report>) {
        for (i, o) in plan.obligations.iter().enumerate() {
            if let Some(date) = &o.settlement_date {
                self.settlement_dates
                    .entry(date.clone())
                    .or_default()
                    .push((plan.run_id, i));
            }
        }
        self.runs.insert(plan.run_id, RunRecord { plan, report });
    }

    /// The obligations that settle on `date` (`YYYY-MM-DD`), with their run's id, in run
    /// order.
    pub fn obligations_on<'a>(
        &'a self,
        date: &str,
    ) -> impl Iterator<Item = (u32, &'a ObligationLine)> + 'a {
        self.settlement_dates
            .get(date)
            .into_iter()
            .flatten()
            .filter_map(|&(run, i)| Some((run, self.runs.get(&run)?.plan.obligations.get(i)?)))
    }

    /// Whether the feed of `core` must wait before applying entry `index`: the first pending
    /// run's cut on that core is reached.
    fn gated(&self, core: usize, index: u64) -> bool {
        self.pending.front().is_some_and(|r| r.cut[core] <= index)
    }

    /// Settles every pending run whose cut the state has reached on every core, checking the
    /// hash when the state stands exactly at the cut.
    fn settle_reached(&mut self) -> Result<(), String> {
        while let Some(run) = self.pending.front() {
            let cut = self.state.cut();
            if run.cut.iter().zip(cut).any(|(r, s)| s < r) {
                return Ok(());
            }
            if run.cut.as_slice() == cut && self.state.state_hash() != run.state_hash {
                return Err(format!(
                    "the state at run {}'s cut {:?} hashes {:016x}, the run saw {:016x}",
                    run.run_id,
                    run.cut,
                    self.state.state_hash(),
                    run.state_hash
                ));
            }
            self.state.settle(run);
            self.pending.pop_front();
        }
        Ok(())
    }

    fn known_max(&self) -> u32 {
        self.runs.keys().next_back().copied().unwrap_or(0)
    }
}

/// What a run request asks (the body of `POST /v1/runs`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// `intermediate` or `end_of_day`; needed for a new run, ignored when resuming.
    #[serde(default)]
    pub kind: Option<RunKind>,
    /// A known run's id resumes it; none: the next id.
    #[serde(default)]
    pub run_id: Option<u32>,
    #[serde(default)]
    pub last_trades: Option<usize>,
    #[serde(default)]
    pub window_ms: Option<u64>,
    /// Set by the scheduler alone (never read from a request): the schedule's time the run
    /// was due at.
    #[serde(skip)]
    pub scheduled_ns: Option<u64>,
}

/// Why a run was not done: an HTTP status and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunError {
    pub status: u16,
    pub message: String,
}

/// `d` in whole milliseconds (a run's timing).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn run_error(status: u16, message: impl Into<String>) -> RunError {
    RunError {
        status,
        message: message.into(),
    }
}

/// What the feeds, the server, the run API and the snapshotter share.
pub struct Shared {
    pub inner: RwLock<Inner>,
    /// Bumped after every change of the state (an entry, a settled run).
    pub progress: watch::Sender<u64>,
    pub config: ClearingConfig,
    pub credentials: Arc<CredentialStore>,
    pub metrics: Metrics,
    /// One run at a time.
    run_lock: tokio::sync::Mutex<()>,
    /// Per core, why its feed is not running (or is retrying).
    pub feed_errors: Mutex<Vec<Option<String>>>,
    /// Per core, its end at the last status (the next index past its newest applied entry).
    pub stream_ends: Mutex<Vec<u64>>,
    /// A standby until `takeover`.
    pub standby: std::sync::atomic::AtomicBool,
    /// The venue's schedule and how far it has been followed (none: runs only when asked).
    scheduler: tokio::sync::Mutex<Option<Scheduler>>,
    /// What the scheduler reads the time from.
    pub clock: Arc<dyn Clock>,
    /// The venue's local time less UTC, in minutes (from the schedule; 0 without one):
    /// business dates are local dates.
    pub business_day_offset_min: i64,
    /// The venue's business calendar (the schedule file's; without one, Monday to Friday in
    /// UTC): obligations' settlement dates are counted on it.
    pub calendar: bourse_admin::schedule::Schedule,
}

/// The schedule and the time up to which its runs were asked.
struct Scheduler {
    schedule: ClearingSchedule,
    after_ns: u64,
    catch_up_ns: u64,
}

/// What the scheduler did with one run the schedule asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduledOutcome {
    /// Run (or resumed) as run `run_id`.
    Done { run_id: u32 },
    /// Already done by an earlier step or an earlier process: not run again.
    AlreadyDone { run_id: u32 },
    /// Due longer ago than the catch-up limit: skipped.
    Missed,
    /// The run failed; the next step tries the same slot again (resuming its run if it has
    /// one) while it is within the catch-up limit.
    Failed(String),
}

impl Shared {
    fn set_feed_error(&self, core: usize, why: Option<String>) {
        self.feed_errors.lock().expect("feed errors")[core] = why;
    }

    fn bump(&self) {
        self.progress.send_modify(|v| *v += 1);
    }

    pub fn is_standby(&self) -> bool {
        self.standby.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Makes a standby a primary: it stops reading its primary's runs and computes its own.
    pub fn takeover(&self) {
        self.standby
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until `done` holds of the state, or `timeout` passes (then `false`).
    async fn wait_for(&self, timeout: Duration, done: impl Fn(&Inner) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.progress.subscribe();
        loop {
            if done(&self.inner.read().expect("state")) {
                return true;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// Asks for every run the schedule has due up to the clock's time, in order; see
    /// `schedule`. A standby asks for nothing (the primary runs them). A slot a known run
    /// was made for is not run again (a finished run) or is resumed (an unfinished one).
    pub async fn step_schedule(&self) -> Vec<(ScheduledRun, ScheduledOutcome)> {
        let mut guard = self.scheduler.lock().await;
        let Some(scheduler) = guard.as_mut() else {
            return Vec::new();
        };
        if self.is_standby() {
            return Vec::new();
        }
        let now = self.clock.now_ns();
        let mut out = Vec::new();
        for due in scheduler.schedule.due(scheduler.after_ns, now) {
            let known = {
                let inner = self.inner.read().expect("state");
                inner
                    .runs
                    .values()
                    .find(|r| r.plan.scheduled_ns == Some(due.at_ns))
                    .map(|r| {
                        (
                            r.plan.run_id,
                            r.report.as_ref().is_some_and(|r| r.pending == 0),
                        )
                    })
            };
            let outcome = match known {
                Some((run_id, true)) => ScheduledOutcome::AlreadyDone { run_id },
                _ if now.saturating_sub(due.at_ns) > scheduler.catch_up_ns => {
                    ScheduledOutcome::Missed
                }
                known => {
                    let request = RunRequest {
                        kind: Some(due.kind),
                        run_id: known.map(|k| k.0),
                        scheduled_ns: Some(due.at_ns),
                        ..RunRequest::default()
                    };
                    match self.run(request).await {
                        Ok(report) => ScheduledOutcome::Done {
                            run_id: report.run_id,
                        },
                        Err(e) => ScheduledOutcome::Failed(format!("{} {}", e.status, e.message)),
                    }
                }
            };
            let failed = matches!(outcome, ScheduledOutcome::Failed(_));
            out.push((due.clone(), outcome));
            if failed {
                return out;
            }
            scheduler.after_ns = due.at_ns;
        }
        scheduler.after_ns = scheduler.after_ns.max(now);
        out
    }

    /// Returns once no run is in progress (one runs at a time; a run waits at most
    /// `limits.run_wait_ms` for the state, then executes its movements): a caller that
    /// counts the cores' commands waits here so that a run the schedule started is counted
    /// whole.
    pub async fn wait_idle(&self) {
        let _one = self.run_lock.lock().await;
    }

    /// Runs (or resumes) a clearing: see the module documentation.
    pub async fn run(&self, request: RunRequest) -> Result<Report, RunError> {
        self.run_with(request, ExecuteOptions::default()).await
    }

    /// [`Shared::run`] with execution options (tests stop a run half way).
    pub async fn run_with(
        &self,
        request: RunRequest,
        options: ExecuteOptions,
    ) -> Result<Report, RunError> {
        let started = Instant::now();
        let asked_unix_ns = unix_now_ns();
        let _one = self.run_lock.lock().await;
        let mut timing = RunTiming {
            asked_unix_ns,
            ..RunTiming::default()
        };
        let wait = Duration::from_millis(self.config.limits.run_wait_ms);
        let known = request
            .run_id
            .and_then(|id| self.inner.read().expect("state").runs.get(&id).cloned());
        let (plan, report) = match known {
            Some(record) => {
                let id = record.plan.run_id;
                let waiting = Instant::now();
                let settled = self
                    .wait_for(wait, |i| i.state.last_settled_run() >= id)
                    .await;
                timing.wait_ms = millis(waiting.elapsed());
                if !settled {
                    return Err(run_error(
                        503,
                        format!("run {id} is not settled yet: the state has not reached its cut"),
                    ));
                }
                let report = match record.report {
                    Some(r) => r,
                    None => {
                        let inner = self.inner.read().expect("state");
                        Report::new(&inner.state, &record.plan, &BTreeMap::new())
                    }
                };
                (record.plan, report)
            }
            None => self.new_run(&request, wait, &mut timing).await?,
        };
        let result = self.finish(&plan, report, options, timing).await;
        match &result {
            Ok(_) => {
                self.metrics.runs_done.inc();
                self.metrics.run_time.observe(started.elapsed());
            }
            Err(_) => self.metrics.runs_failed.inc(),
        }
        result
    }

    /// Computes, saves and settles a new run at the state's cut once it has caught up with
    /// every core's end; the time it waited for that and the time it computed go to `timing`.
    async fn new_run(
        &self,
        request: &RunRequest,
        wait: Duration,
        timing: &mut RunTiming,
    ) -> Result<(Arc<RunPlan>, Report), RunError> {
        if self.is_standby() {
            return Err(run_error(
                409,
                "a standby computes no run: resume a known run by its id, or take over first",
            ));
        }
        let kind = request
            .kind
            .ok_or_else(|| run_error(400, "kind: intermediate or end_of_day"))?;
        let rule = SettlementRule {
            last_trades: request
                .last_trades
                .unwrap_or(self.config.settlement.last_trades),
            window_ns: request
                .window_ms
                .map(|ms| ms.saturating_mul(1_000_000))
                .or(self.config.settlement.window_ns),
        };
        rule.check().map_err(|e| run_error(400, e))?;
        let waiting = Instant::now();
        let mut ends = Vec::new();
        for nodes in &self.config.cores {
            ends.push(stream_end(nodes).await.map_err(|e| run_error(503, e))?);
        }
        let caught_up = self
            .wait_for(wait, |i| {
                i.pending.is_empty() && i.state.cut().iter().zip(&ends).all(|(s, e)| s >= e)
            })
            .await;
        if !caught_up {
            return Err(run_error(
                503,
                format!("the clearing state has not caught up with the cores' ends {ends:?}"),
            ));
        }
        timing.wait_ms = millis(waiting.elapsed());
        let computing = Instant::now();
        let mut inner = self.inner.write().expect("state");
        let known_max = inner.known_max();
        let on_stream = inner.state.runs_on_stream_max();
        if on_stream > known_max {
            return Err(run_error(
                409,
                format!(
                    "run {on_stream}'s commands are on the streams but its plan is unknown here \
                     (known up to run {known_max}): copy its plan into {} first",
                    self.config.runs_dir().display()
                ),
            ));
        }
        let run_id = request.run_id.unwrap_or(known_max + 1);
        if run_id <= known_max {
            return Err(run_error(
                409,
                format!(
                    "run id {run_id}: runs up to {known_max} exist; a new run takes a higher id"
                ),
            ));
        }
        let mut plan =
            compute_run_with_fees(&inner.state, run_id, kind, &rule, self.config.fees.as_ref());
        plan.scheduled_ns = request.scheduled_ns;
        date_obligations(
            &mut plan,
            &self.calendar,
            &self.config.settlement_cycle,
            &inner.state,
        );
        let plan = Arc::new(plan);
        save_plan(&self.config.runs_dir(), &plan).map_err(|e| run_error(500, e))?;
        let report = Report::new(&inner.state, &plan, &BTreeMap::new());
        inner.state.settle(&plan);
        inner.add_run(plan.clone(), Some(report.clone()));
        drop(inner);
        timing.compute_ms = millis(computing.elapsed());
        self.bump();
        Ok((plan, report))
    }

    /// Executes the plan's commands (those not applied yet) and writes the reports, with
    /// `timing` and the time executing took in them.
    async fn finish(
        &self,
        plan: &Arc<RunPlan>,
        mut report: Report,
        options: ExecuteOptions,
        mut timing: RunTiming,
    ) -> Result<Report, RunError> {
        let executing = Instant::now();
        let mut groups = Vec::new();
        for nodes in &self.config.cores {
            groups.push(with_ids(nodes).await.map_err(|e| run_error(503, e))?);
        }
        let results = execute(plan, &groups, options)
            .await
            .map_err(|e| run_error(503, format!("run {}: {e}", plan.run_id)))?;
        report.set_results(plan, &results);
        timing.execute_ms = millis(executing.elapsed());
        timing.done_unix_ns = unix_now_ns();
        report.timing = Some(timing);
        report
            .write(&self.config.report_dir(plan.run_id))
            .map_err(|e| run_error(500, e))?;
        if let Some(r) = self
            .inner
            .write()
            .expect("state")
            .runs
            .get_mut(&plan.run_id)
        {
            r.report = Some(report.clone());
        }
        Ok(report)
    }

    /// Adds runs read from elsewhere (a primary): saved here, then settled when reached.
    pub fn learn_runs(&self, plans: Vec<RunPlan>) -> Result<(), String> {
        let mut inner = self.inner.write().expect("state");
        for plan in plans {
            if inner.runs.contains_key(&plan.run_id) {
                continue;
            }
            if plan.run_id <= inner.known_max() || plan.cut.len() != self.config.cores.len() {
                return Err(format!(
                    "run {} does not follow run {} of {} cores",
                    plan.run_id,
                    inner.known_max(),
                    self.config.cores.len()
                ));
            }
            save_plan(&self.config.runs_dir(), &plan)?;
            let plan = Arc::new(plan);
            inner.pending.push_back(plan.clone());
            inner.add_run(plan, None);
        }
        inner.settle_reached()?;
        drop(inner);
        self.bump();
        Ok(())
    }

    /// Writes the state to a snapshot if it moved since `last_cut`; returns its cut.
    fn snapshot(&self, store: &Mutex<SnapshotStore>, last_cut: &[u64]) -> Result<Vec<u64>, String> {
        let (bytes, cut) = {
            let inner = self.inner.read().expect("state");
            if inner.state.cut() == last_cut {
                return Ok(last_cut.to_vec());
            }
            (inner.state.encode(), inner.state.cut().to_vec())
        };
        let meta = SnapshotMeta {
            cluster_id: self.config.cluster_id(),
            last_index: cut.iter().sum(),
            last_term: 0,
            state_hash: xxhash_rust::xxh3::xxh3_64(&bytes),
            chain_hash: 0,
        };
        store
            .lock()
            .expect("snapshot store")
            .write(meta, &bytes)
            .map_err(|e| format!("snapshot: {e}"))?;
        self.metrics.snapshots.inc();
        Ok(cut)
    }
}

/// A running clearing node; [`ClearingNode::stop`] (or dropping it) snapshots the state and
/// stops everything.
pub struct ClearingNode {
    shared: Arc<Shared>,
    addr: SocketAddr,
    snapshots: Arc<Mutex<SnapshotStore>>,
    stop: watch::Sender<bool>,
    runtime: Option<tokio::runtime::Runtime>,
    fix: Option<FixServer>,
}

impl ClearingNode {
    /// Loads the newest snapshot and the saved runs, binds the listener, and starts the
    /// feeds, the status poller, the snapshotter, the standby reader and the server on a
    /// runtime of its own.
    pub fn start(
        config: ClearingConfig,
        definitions: Vec<Instrument>,
    ) -> Result<ClearingNode, String> {
        Self::start_with_clock(config, definitions, Arc::new(SystemClock))
    }

    /// [`ClearingNode::start`] with the clock the schedule is read from (tests simulate the
    /// day with a `ManualClock`).
    pub fn start_with_clock(
        config: ClearingConfig,
        definitions: Vec<Instrument>,
        clock: Arc<dyn Clock>,
    ) -> Result<ClearingNode, String> {
        config.validate()?;
        let schedule = config
            .schedule
            .as_ref()
            .map(ClearingSchedule::load)
            .transpose()?;
        let business_day_offset_min = schedule.as_ref().map_or(0, |s| s.utc_offset_minutes());
        let calendar = schedule
            .as_ref()
            .map_or_else(default_calendar, |s| s.calendar().clone());
        config.settlement_cycle.check(&definitions)?;
        for nodes in &config.cores {
            bourse_cluster::transport::configure_client(nodes, config.tls.as_ref())
                .map_err(|e| format!("cores: {e}"))?;
        }
        let credentials = CredentialStore::from_entries(&config.operators)
            .map_err(|e| format!("operators: {e}"))?;
        std::fs::create_dir_all(config.snapshots_dir())
            .map_err(|e| format!("{}: {e}", config.snapshots_dir().display()))?;
        let (store, _removed) = SnapshotStore::open(config.snapshots_dir(), config.cluster_id(), 2)
            .map_err(|e| format!("snapshots: {e}"))?;
        let latest = store.latest().map_err(|e| format!("snapshots: {e}"))?;
        let cores = config.cores.len();
        let state = match latest.snapshot {
            Some(s) => ClearingState::decode(cores, definitions.clone(), &s.data)
                .map_err(|e| format!("{}: {e}", s.file.display()))?,
            None => ClearingState::new(cores, definitions.clone()),
        };
        let mut inner = Inner {
            state,
            pending: VecDeque::new(),
            runs: BTreeMap::new(),
            settlement_dates: BTreeMap::new(),
        };
        for plan in saved_runs(&config.runs_dir())? {
            let report = std::fs::read(config.report_dir(plan.run_id).join("report.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let plan = Arc::new(plan);
            if plan.run_id > inner.state.last_settled_run() {
                inner.pending.push_back(plan.clone());
            }
            inner.add_run(plan, report);
        }
        inner.settle_reached()?;
        // The schedule is followed from the newest slot a known run was made for, or from
        // the catch-up limit before now, whichever is later.
        let scheduler = schedule.map(|schedule| {
            let section = config.schedule.as_ref().expect("a schedule section");
            let catch_up_ns = section.catch_up_ms.saturating_mul(1_000_000);
            let newest = inner
                .runs
                .values()
                .filter_map(|r| r.plan.scheduled_ns)
                .max();
            let from = clock.now_ns().saturating_sub(catch_up_ns);
            Scheduler {
                schedule,
                after_ns: newest.map_or(from, |n| n.max(from)),
                catch_up_ns,
            }
        });
        let listener = std::net::TcpListener::bind(config.listen)
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("listener: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("listener: {e}"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bourse-clearing")
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        let metrics = Metrics::new(cores);
        metrics.positions.set(inner.state.positions().len() as i64);
        let shared = Arc::new(Shared {
            inner: RwLock::new(inner),
            progress: watch::channel(0).0,
            standby: std::sync::atomic::AtomicBool::new(config.standby_of.is_some()),
            credentials: Arc::new(credentials),
            metrics,
            run_lock: tokio::sync::Mutex::new(()),
            feed_errors: Mutex::new(vec![None; cores]),
            stream_ends: Mutex::new(vec![0; cores]),
            scheduler: tokio::sync::Mutex::new(scheduler),
            clock,
            business_day_offset_min,
            calendar,
            config,
        });
        let fix = match &shared.config.fix {
            Some(section) => Some(crate::fix::start(shared.clone(), section)?),
            None => None,
        };
        let snapshots = Arc::new(Mutex::new(store));
        let (stop, stopped) = watch::channel(false);
        {
            let _guard = runtime.enter();
            for (core, nodes) in shared.config.cores.iter().enumerate() {
                tokio::spawn(feed(shared.clone(), core, nodes.clone(), stopped.clone()));
            }
            tokio::spawn(status_every(shared.clone(), stopped.clone()));
            if shared.config.snapshot_interval_ms > 0 {
                tokio::spawn(snapshot_every(
                    shared.clone(),
                    snapshots.clone(),
                    stopped.clone(),
                ));
            }
            if let Some(section) = &shared.config.schedule {
                tokio::spawn(schedule_every(
                    shared.clone(),
                    section.poll_ms,
                    stopped.clone(),
                ));
            }
            if let Some(primary) = shared.config.standby_of.clone() {
                tokio::spawn(follow_primary(shared.clone(), primary, stopped.clone()));
            }
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|e| format!("{e}"))?;
            tokio::spawn(crate::server::serve(listener, shared.clone(), stopped));
        }
        Ok(ClearingNode {
            shared,
            addr,
            snapshots,
            stop,
            runtime: Some(runtime),
            fix,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The FIX acceptor's address, when the config has `[fix]`.
    pub fn fix_addr(&self) -> Option<SocketAddr> {
        self.fix.as_ref().map(FixServer::addr)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Runs `f` on the node's runtime (tests drive runs with it).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.as_ref().expect("running").block_on(f)
    }

    /// The state's cut and hash now.
    pub fn cut_and_hash(&self) -> (Vec<u64>, u64) {
        let inner = self.shared.inner.read().expect("state");
        (inner.state.cut().to_vec(), inner.state.state_hash())
    }

    /// Waits until `done` holds of the state and runs (`false` after `timeout`).
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&Inner) -> bool) -> bool {
        self.block_on(self.shared.wait_for(timeout, done))
    }

    /// Waits until the state's cut reaches `cut` on every core (`false` after `timeout`).
    pub fn wait_for_cut(&self, cut: &[u64], timeout: Duration) -> bool {
        let cut = cut.to_vec();
        self.block_on(self.shared.wait_for(timeout, move |i| {
            i.pending.is_empty() && i.state.cut().iter().zip(&cut).all(|(s, c)| s >= c)
        }))
    }

    /// Stops the feeds and the server and snapshots the state.
    pub fn stop(mut self) -> Result<(), String> {
        self.shutdown(true)
    }

    /// Stops without the final snapshot, as a crash would (the next start resumes from the
    /// last periodic snapshot).
    pub fn kill(mut self) {
        let _ = self.shutdown(false);
    }

    fn shutdown(&mut self, snapshot: bool) -> Result<(), String> {
        let Some(runtime) = self.runtime.take() else {
            return Ok(());
        };
        let _ = self.stop.send(true);
        if let Some(mut fix) = self.fix.take() {
            fix.stop();
        }
        runtime.shutdown_timeout(Duration::from_secs(5));
        if snapshot {
            self.shared.snapshot(&self.snapshots, &[]).map(|_| ())
        } else {
            Ok(())
        }
    }
}

impl Drop for ClearingNode {
    fn drop(&mut self) {
        let _ = self.shutdown(true);
    }
}

/// The pause before a feed that found no node of its core tries again.
const FEED_RETRY_MS: u64 = 200;

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Reads one core's committed stream into the state, from the state's position on it.
async fn feed(
    shared: Arc<Shared>,
    core: usize,
    nodes: Vec<SocketAddr>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let position = shared.inner.read().expect("state").state.cut()[core];
        let mut consumer = StreamConsumer::remote(nodes.clone(), position);
        loop {
            let got = tokio::select! {
                _ = stopped.changed() => return,
                got = consumer.next() => got,
            };
            let entry = match got {
                Ok(entry) => entry,
                Err(StreamError::Unreachable(why)) => {
                    shared.set_feed_error(core, Some(format!("retrying: {why}")));
                    tokio::select! {
                        _ = stopped.changed() => return,
                        _ = tokio::time::sleep(Duration::from_millis(FEED_RETRY_MS)) => {}
                    }
                    break;
                }
                Err(e) => {
                    shared.set_feed_error(
                        core,
                        Some(format!(
                            "stopped at log index {}: {e}; the core no longer keeps the \
                             entries clearing needs: start from a newer snapshot",
                            consumer.position()
                        )),
                    );
                    return;
                }
            };
            // In front of a pending run's cut, wait until every core stands there and the
            // run is settled.
            loop {
                let mut rx = shared.progress.subscribe();
                if !shared
                    .inner
                    .read()
                    .expect("state")
                    .gated(core, entry.index())
                {
                    break;
                }
                tokio::select! {
                    _ = stopped.changed() => return,
                    _ = rx.changed() => {}
                }
            }
            let applied = {
                let mut inner = shared.inner.write().expect("state");
                let before = inner.state.last_ts_ns();
                let r = inner
                    .state
                    .apply_entry(core, &entry)
                    .map_err(|e| e.to_string())
                    .and_then(|_| inner.settle_reached());
                let newest = inner.state.last_ts_ns();
                shared
                    .metrics
                    .positions
                    .set(inner.state.positions().len() as i64);
                r.map(|_| (newest > before).then_some(newest))
            };
            match applied {
                Ok(newest) => {
                    if let Some(ts) = newest {
                        shared
                            .metrics
                            .apply_lag
                            .observe_ns(unix_ns().saturating_sub(ts));
                    }
                    shared.metrics.entries_applied[core].inc();
                    shared.bump();
                }
                Err(e) => {
                    shared.set_feed_error(
                        core,
                        Some(format!("stopped at entry {}: {e}", entry.index())),
                    );
                    return;
                }
            }
            if shared.feed_errors.lock().expect("feed errors")[core].is_some() {
                shared.set_feed_error(core, None);
            }
        }
    }
}

/// Asks every core where its stream ends and sets the lag gauges.
async fn status_every(shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(Duration::from_millis(
        shared.config.limits.status_interval_ms,
    ));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = every.tick() => {}
        }
        for (core, nodes) in shared.config.cores.iter().enumerate() {
            let Ok(end) = stream_end(nodes).await else {
                continue;
            };
            shared.stream_ends.lock().expect("ends")[core] = end;
            let (cut, ts) = {
                let inner = shared.inner.read().expect("state");
                (inner.state.cut()[core], inner.state.last_ts_ns())
            };
            let behind = end.saturating_sub(cut);
            shared.metrics.lag_entries[core].set(behind as i64);
            let age = if behind > 0 {
                unix_ns().saturating_sub(ts)
            } else {
                0
            };
            shared.metrics.lag_ns[core].set(age.min(i64::MAX as u64) as i64);
        }
    }
}

async fn snapshot_every(
    shared: Arc<Shared>,
    store: Arc<Mutex<SnapshotStore>>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut every =
        tokio::time::interval(Duration::from_millis(shared.config.snapshot_interval_ms));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Vec::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = every.tick() => {}
        }
        let (s, st, l) = (shared.clone(), store.clone(), last.clone());
        match tokio::task::spawn_blocking(move || s.snapshot(&st, &l)).await {
            Ok(Ok(cut)) => last = cut,
            Ok(Err(e)) => eprintln!("bourse clearing: {e}"),
            Err(_) => {}
        }
    }
}

/// The system's time in nanoseconds since the Unix epoch, for the run's timing.
fn unix_now_ns() -> u64 {
    SystemClock.now_ns()
}

/// Reads the clock every `poll_ms` and asks for the runs the schedule has due.
async fn schedule_every(shared: Arc<Shared>, poll_ms: u64, mut stopped: watch::Receiver<bool>) {
    let period = Duration::from_millis(poll_ms);
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = every.tick() => {}
        }
        for (due, outcome) in shared.step_schedule().await {
            eprintln!(
                "bourse clearing: schedule {} {:?}: {outcome:?}",
                due.local, due.kind
            );
        }
    }
}

/// A standby's name and password at its primary (`standby_login = { name, password }`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandbyLogin {
    pub name: String,
    pub password: String,
}

/// A standby's reader of its primary's runs (`GET /v1/runs`, then each new plan).
async fn follow_primary(shared: Arc<Shared>, primary: String, mut stopped: watch::Receiver<bool>) {
    let Ok(client) = bourse_admin::AdminClient::new(&primary) else {
        eprintln!("bourse clearing: standby_of {primary:?} is not an address");
        return;
    };
    let client = match &shared.config.standby_login {
        Some(l) => client.with_credentials(&l.name, &l.password),
        None => client,
    };
    let client = client.with_timeout(Duration::from_secs(5));
    let mut every =
        tokio::time::interval(Duration::from_millis(shared.config.limits.standby_poll_ms));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = every.tick() => {}
        }
        if !shared.is_standby() {
            return;
        }
        let known = shared.inner.read().expect("state").known_max();
        let c = client.clone();
        let fetched = tokio::task::spawn_blocking(move || new_plans(&c, known)).await;
        match fetched {
            Ok(Ok(plans)) if !plans.is_empty() => {
                if let Err(e) = shared.learn_runs(plans) {
                    eprintln!("bourse clearing: standby: {e}");
                }
            }
            Ok(Err(e)) => eprintln!("bourse clearing: standby: primary {primary}: {e}"),
            _ => {}
        }
    }
}

/// The plans of the primary's runs after `known`, in run order.
fn new_plans(client: &bourse_admin::AdminClient, known: u32) -> Result<Vec<RunPlan>, String> {
    let list = client.get("/v1/runs")?;
    let ids: Vec<u32> = list.body["runs"]
        .as_array()
        .ok_or("GET /v1/runs: no runs list")?
        .iter()
        .filter_map(|r| r["run_id"].as_u64())
        .map(|id| id as u32)
        .filter(|&id| id > known)
        .collect();
    let mut plans = Vec::new();
    for id in ids {
        let reply = client.get(&format!("/v1/runs/{id}/plan"))?;
        if reply.status != 200 {
            return Err(format!("GET /v1/runs/{id}/plan: {}", reply.status));
        }
        plans
            .push(serde_json::from_value(reply.body).map_err(|e| format!("run {id}'s plan: {e}"))?);
    }
    plans.sort_by_key(|p: &RunPlan| p.run_id);
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_configuration_and_instruments_load() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/clearing.toml");
        let c = ClearingConfig::load(Path::new(path)).unwrap();
        assert_eq!(c.cores.len(), 1);
        assert_eq!(c.limits, Limits::default());
        assert!(c.listen.ip().is_loopback());
        assert_eq!(load_instruments(&c.instruments).unwrap().len(), 1);
    }

    #[test]
    fn the_example_venue_schedule_loads_as_a_clearing_schedule() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
        let section: ScheduleSection =
            toml::from_str("file = \"venue-schedule.toml\"\nmarkets = [\"futures\"]\n").unwrap();
        let mut section = section;
        crate::schedule::resolve(&mut section, Path::new(dir));
        let schedule = ClearingSchedule::load(&section).unwrap();
        // Monday 2026-11-23 in Moscow: the intermediate run, then the end of day's.
        let day_ns = 86_400_000_000_000u64;
        let monday = 20_780 * day_ns;
        let runs = schedule.due(monday, monday + day_ns);
        let kinds: Vec<RunKind> = runs.iter().map(|r| r.kind).collect();
        assert_eq!(kinds, vec![RunKind::Intermediate, RunKind::EndOfDay]);
        let bad: Result<ScheduleSection, _> = toml::from_str("file = \"x\"\nmarket = []\n");
        assert!(bad.unwrap_err().to_string().contains("market"));
    }

    fn example() -> ClearingConfig {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/clearing.toml");
        ClearingConfig::load(Path::new(path)).unwrap()
    }

    #[test]
    fn without_operators_a_listen_address_off_the_loopback_is_refused_and_the_reason_named() {
        for listen in ["0.0.0.0:9460", "[::]:9460", "192.0.2.7:9460"] {
            let mut c = example();
            c.listen = listen.parse().unwrap();
            let why = c.validate().unwrap_err();
            assert!(why.contains("is not a loopback address"), "{listen}: {why}");
            assert!(why.contains("without [[operators]]"), "{listen}: {why}");
            assert!(why.contains("answers everyone"), "{listen}: {why}");
        }
    }

    #[test]
    fn a_node_without_operators_off_the_loopback_refuses_to_start_before_binding_or_writing() {
        let mut c = example();
        // Port 0 would bind if the check came too late; the state directory would be created.
        c.listen = "0.0.0.0:0".parse().unwrap();
        let dir = tempfile::tempdir().unwrap();
        c.state_dir = dir.path().join("state");
        let why = match ClearingNode::start(c, Vec::new()) {
            Ok(_) => panic!("a node open to everyone off the loopback started"),
            Err(why) => why,
        };
        assert!(why.contains("without [[operators]]"), "{why}");
        assert!(!dir.path().join("state").exists(), "nothing was written");
    }

    #[test]
    fn a_loopback_listen_address_needs_no_operators_and_any_address_is_open_to_operators() {
        for listen in ["127.0.0.1:9460", "[::1]:9460"] {
            let mut c = example();
            c.listen = listen.parse().unwrap();
            assert_eq!(c.validate(), Ok(()), "{listen}");
        }
        let mut c = example();
        c.listen = "0.0.0.0:9460".parse().unwrap();
        c.operators.push(CredentialEntry {
            name: "admin".into(),
            password_hash: bourse_auth::hash_password_with("pw", bourse_auth::HashCost::TEST_ONLY)
                .unwrap(),
            roles: vec!["operator".into()],
        });
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn a_configuration_with_an_empty_core_or_an_unknown_key_is_refused() {
        let mut c = example();
        c.cores.push(Vec::new());
        assert!(c.validate().unwrap_err().contains("core 1 lists no node"));
        let unknown =
            "name = \"x\"\ncores = []\ninstruments = \"i\"\nstate_dir = \"s\"\ncolour = 1\n";
        assert!(toml::from_str::<ClearingConfig>(unknown)
            .unwrap_err()
            .to_string()
            .contains("colour"));
    }
}
