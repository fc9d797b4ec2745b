//! # bourse-loadgen: load testing as the seeds do it
//!
//! A [`Profile`] (TOML, parsed strictly) runs on an open-loop generator against a
//! [`Deployment`] and ends as [`Results`] (`results.json`), rendered by [`report`] as Markdown
//! and HTML in the shape of the MOEX reports (seeds 000, 001) and LTP's table (seed 002).
//! Start at [`run`] and [`run_on`]. A [`generator::Worker`] sends on schedule whatever the
//! answers (latency from the scheduled time); a [`Target`] is what it drives ([`InProcess`] or
//! [`gateway::GatewayTarget`]) and never blocks ([`SubmitError::Full`]); [`CoreTotals`] are the
//! cores' own counts the cross-checks compare with. Workers are threads or `bourse
//! loadgen-worker` processes ([`Connection`]).
//!
//! Design: ARCHITECTURE.md, `crates/loadgen`.

#![forbid(unsafe_code)]

pub mod charts;
pub mod flow;
pub mod gateway;
pub mod generator;
pub mod profile;
pub mod report;
pub mod results;
pub mod target;

pub use generator::Record;
pub use profile::{Profile, ProfileError};
pub use results::Results;
pub use target::{
    Answer, AppliedBySource, CoreTotals, InProcess, StageFigure, Stages, SubmitError, Target,
};

use generator::{Live, Worker};
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a run is shown and labelled.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Show a progress bar (only when standard error is a terminal).
    pub progress: bool,
    /// The software version written into the report.
    pub version: String,
    /// Print one line per second (sent, successful, trades) to standard output.
    pub ticker: bool,
    /// Set it to end the run early (every worker stops sending and drains).
    pub stop: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The run's live counters, when the caller wants to read them as it goes (a benchmark
    /// that samples its own window); `None`: the run keeps its own.
    pub live: Option<Arc<Live>>,
}

/// Orders each core's pool can hold: the resting orders the flows keep, with room for the
/// swings of a peak and the orders of a burst in flight.
fn orders_max_for(live_orders_target: u32) -> u32 {
    (live_orders_target.saturating_mul(8)).clamp(1 << 16, 1 << 22)
}

/// How one generator worker reaches a deployment.
pub enum Connection {
    /// A target this process drives from a generator thread of its own.
    Local(Box<dyn Target>),
    /// A worker that runs elsewhere (a `bourse loadgen-worker` process): called on its own
    /// thread with the run's start (nanoseconds since the Unix epoch), it returns the
    /// worker's record when the worker is done. It must be bounded in time itself.
    Remote(Box<dyn FnOnce(u64) -> Result<Record, String> + Send>),
}

/// A deployment a profile runs against, started and set up (instruments, funded accounts)
/// by its owner before [`run_on`]: the in-process cores here, gateways in front of
/// in-process or replicated cores in the `bourse` binary.
pub trait Deployment {
    /// One line for the report: what is between the generator and the cores.
    fn note(&self) -> String;
    /// Client sessions the deployment opened for the generator, all workers together.
    fn sessions(&self) -> u32;
    /// The connection of generator worker `worker` (each is taken once).
    fn connect(&mut self, worker: usize) -> Result<Connection, String>;
    /// Called once every worker is done: the cores' own counts over the measured run.
    fn finish(&mut self) -> Result<Vec<target::CoreTotals>, String>;
    /// Called before the workers start with the moment (ns since the Unix epoch) their
    /// second 0 begins, so figures the deployment times itself per second (the market data
    /// publication delay) line up with the generator's seconds, and with how many seconds of
    /// such series to keep (the profile's `generator.series_seconds_max`; later seconds count
    /// in the deployment's totals only). Default: nothing to line up.
    fn run_starts_at(&mut self, _start_unix_ns: u64, _series_seconds_max: u32) {}
    /// Called after [`Deployment::finish`]: the accounts the deployment added through its
    /// admin API during the run (a profile's `[accounts_under_load]`). Default: none.
    fn accounts_added(&mut self) -> Option<results::AccountsAdded> {
        None
    }
    /// Called after [`Deployment::finish`]: the clearing runs the deployment asked of its
    /// clearing service during the run (a profile's `[[clearing_runs]]`), in time order.
    /// Default: none.
    fn clearing_runs(&mut self) -> Vec<results::ClearingRunDone> {
        Vec::new()
    }
}

/// The flows of every worker on every market, in the order [`run_on`] gives them out:
/// `flows[worker][market]`. A worker process builds its own from the same profile.
pub fn flows_of(profile: &Profile) -> Vec<Vec<flow::MarketFlow>> {
    let workers = profile.generator.workers;
    (0..workers).map(|w| worker_flows(profile, w)).collect()
}

/// The flows of worker `worker` on every market (deterministic: the profile's seed).
pub fn worker_flows(profile: &Profile, worker: u32) -> Vec<flow::MarketFlow> {
    let workers = profile.generator.workers;
    profile
        .markets
        .iter()
        .enumerate()
        .map(|(m, spec)| {
            let mut f = flow::MarketFlow::new(
                spec,
                m,
                &profile.mix,
                worker,
                workers,
                profile.seed ^ ((m as u64) << 40),
            );
            let (first, count) = flow::worker_late_accounts(profile, m, worker);
            f.set_late_accounts(first, count);
            f
        })
        .collect()
}

/// The commands that create market `market`'s instruments (worker 0 only) and worker
/// `worker`'s funded accounts.
pub fn setup_commands(
    profile: &Profile,
    market: usize,
    worker: u32,
) -> Vec<bourse_core::CommandBody> {
    let f = flow::MarketFlow::new(
        &profile.markets[market],
        market,
        &profile.mix,
        worker,
        profile.generator.workers,
        profile.seed ^ ((market as u64) << 40),
    );
    f.setup(worker == 0)
}

/// Nanoseconds since the Unix epoch now.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The [`Instant`] that corresponds to `unix_ns` on this machine's clock.
pub fn instant_of_unix_ns(unix_ns_at: u64) -> Instant {
    let now_unix = unix_ns();
    let now = Instant::now();
    if unix_ns_at >= now_unix {
        now + Duration::from_nanos(unix_ns_at - now_unix)
    } else {
        now.checked_sub(Duration::from_nanos(now_unix - unix_ns_at))
            .unwrap_or(now)
    }
}

/// The in-process deployment as a [`Deployment`]: one engine per market on its own thread.
struct InProcessDeployment {
    inner: Option<InProcess>,
    sessions: u32,
}

impl Deployment for InProcessDeployment {
    fn note(&self) -> String {
        "one engine per market on its own thread behind bounded queues; no network, no \
         gateway, no replication, no market data"
            .into()
    }
    fn sessions(&self) -> u32 {
        self.sessions
    }
    fn connect(&mut self, worker: usize) -> Result<Connection, String> {
        let d = self.inner.as_mut().ok_or("the cores have stopped")?;
        let t = d
            .connect(worker)
            .ok_or_else(|| format!("no connection for worker {worker}"))?;
        Ok(Connection::Local(Box::new(t)))
    }
    fn finish(&mut self) -> Result<Vec<target::CoreTotals>, String> {
        Ok(self.inner.take().map(InProcess::finish).unwrap_or_default())
    }
}

/// Runs a profile against the in-process deployment and returns every figure.
pub fn run(profile: &Profile, options: &RunOptions) -> Result<Results, String> {
    if profile.target.kind != profile::TargetKind::InProcess {
        return Err(format!(
            "target.kind = \"{}\" needs gateways (and, for \"cluster\", replicated cores): the \
             bourse binary starts them (`bourse loadtest`); this function runs in-process only",
            profile.target.kind.name()
        ));
    }
    let workers = profile.generator.workers as usize;
    let names: Vec<String> = profile.markets.iter().map(|m| m.name.clone()).collect();
    let orders_max = profile
        .markets
        .iter()
        .map(|m| orders_max_for(m.live_orders_target))
        .max()
        .unwrap_or(1 << 16);
    let accounts_max = profile
        .markets
        .iter()
        .map(|m| m.accounts)
        .max()
        .unwrap_or(1);
    let deployment = InProcess::start(
        &names,
        workers,
        profile.target.queue_capacity as usize,
        orders_max,
        accounts_max,
    )
    .map_err(|e| format!("cannot start the cores: {e}"))?;
    // Instruments and funded accounts first, outside the measured run.
    for (m, spec) in profile.markets.iter().enumerate() {
        for w in 0..workers {
            let (_, rejected) = deployment.setup(m, w, setup_commands(profile, m, w as u32))?;
            if rejected > 0 {
                return Err(format!(
                    "market {}: {rejected} setup commands were rejected",
                    spec.name
                ));
            }
        }
    }
    let mut d = InProcessDeployment {
        inner: Some(deployment),
        sessions: workers as u32,
    };
    run_on(profile, options, &mut d)
}

/// Orders each core's pool should hold for `profile`'s flows.
pub fn orders_max_of(profile: &Profile) -> u32 {
    profile
        .markets
        .iter()
        .map(|m| orders_max_for(m.live_orders_target))
        .max()
        .unwrap_or(1 << 16)
}

/// Runs a profile against a started and set-up deployment and returns every figure.
pub fn run_on(
    profile: &Profile,
    options: &RunOptions,
    deployment: &mut dyn Deployment,
) -> Result<Results, String> {
    let mut machine = results::Machine::this();
    let started_unix_s = unix_ns() / 1_000_000_000;
    let workers = profile.generator.workers as usize;
    let profile_arc = Arc::new(profile.clone());
    let live = options.live.clone().unwrap_or_default();
    let mut connections = Vec::new();
    for w in 0..workers {
        match deployment.connect(w) {
            Ok(c) => connections.push(c),
            Err(e) => {
                drop(connections);
                let _ = deployment.finish();
                return Err(format!("worker {w} cannot connect: {e}"));
            }
        }
    }
    // Remote workers need time to start their process and connect.
    let any_remote = connections
        .iter()
        .any(|c| matches!(c, Connection::Remote(_)));
    let lead_ms = if any_remote { 3_000 } else { 20 };
    let start_unix_ns = unix_ns() + lead_ms * 1_000_000;
    let start = instant_of_unix_ns(start_unix_ns);
    deployment.run_starts_at(start_unix_ns, profile.generator.series_seconds_max);
    let mut handles = Vec::new();
    for (w, connection) in connections.into_iter().enumerate() {
        let spawned = match connection {
            Connection::Local(mut target) => {
                let worker = Worker {
                    index: w as u32,
                    workers: workers as u32,
                    profile: profile_arc.clone(),
                    flows: worker_flows(profile, w as u32),
                    live: live.clone(),
                };
                std::thread::Builder::new()
                    .name(format!("loadgen-{w}"))
                    .spawn(move || worker.run(target.as_mut(), start))
            }
            Connection::Remote(f) => std::thread::Builder::new()
                .name(format!("loadgen-remote-{w}"))
                .spawn(move || f(start_unix_ns)),
        };
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => return Err(format!("cannot start a generator thread: {e}")),
        }
    }

    let bar = progress_bar(profile, options);
    let mut last = (Instant::now(), 0u64, 0u64);
    let mut tick = (start + Duration::from_secs(1), 0u64, 0u64, 0u64, 0u64);
    if options.ticker {
        println!(
            "  {:>4}  {:>12}  {:>12}  {:>10}",
            "sec", "commands/s", "successful/s", "trades/s"
        );
    }
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if let Some(stop) = &options.stop {
            if stop.load(Ordering::Relaxed) {
                live.stop.store(true, Ordering::Relaxed);
            }
        }
        if options.ticker && Instant::now() >= tick.0 {
            let sent = live.sent.load(Ordering::Relaxed);
            let tx = live.transactions.load(Ordering::Relaxed);
            let trades = live.trades.load(Ordering::Relaxed);
            tick.1 += 1;
            println!(
                "  {:>4}  {:>12}  {:>12}  {:>10}",
                tick.1,
                report::count(sent - tick.2),
                report::count(tx - tick.3),
                report::count(trades - tick.4)
            );
            tick = (tick.0 + Duration::from_secs(1), tick.1, sent, tx, trades);
        }
        if let Some(bar) = &bar {
            let now = Instant::now();
            let sent = live.sent.load(Ordering::Relaxed);
            let tx = live.transactions.load(Ordering::Relaxed);
            let dt = now.duration_since(last.0).as_secs_f64().max(1e-3);
            let elapsed_ms = now.saturating_duration_since(start).as_millis() as u64;
            bar.set_position(elapsed_ms.min(bar.length().unwrap_or(u64::MAX)));
            bar.set_message(format!(
                "{} cmd/s sent, {} tx/s, {} trades",
                report::count(((sent - last.1) as f64 / dt) as u64),
                report::count(((tx - last.2) as f64 / dt) as u64),
                report::count(live.trades.load(Ordering::Relaxed)),
            ));
            last = (now, sent, tx);
        }
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let mut merged: Option<Record> = None;
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok(rec)) => match merged.as_mut() {
                Some(m) => m.merge(rec),
                None => merged = Some(rec),
            },
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some("a generator thread panicked".into()),
        }
    }
    let cores = deployment.finish();
    if let Some(e) = failure {
        return Err(e);
    }
    let cores = cores?;
    let rec = merged.ok_or("no generator worker ran")?;
    machine.finish();
    let mut results = Results::build(
        profile,
        &rec,
        cores,
        machine,
        options.version.clone(),
        started_unix_s,
    );
    if let Some(added) = deployment.accounts_added() {
        results.accounts_under_load = Some(results::AccountsUnderLoadFigures::of(
            &rec,
            added,
            start_unix_ns,
        ));
    }
    let clearing = deployment.clearing_runs();
    if !clearing.is_empty() {
        results.clearing_runs = results::ClearingRunFigures::of_all(&rec, clearing, start_unix_ns);
    }
    results.target.note = deployment.note();
    results.target.sessions = deployment.sessions();
    Ok(results)
}

fn progress_bar(profile: &Profile, options: &RunOptions) -> Option<indicatif::ProgressBar> {
    if !options.progress || !std::io::stderr().is_terminal() {
        return None;
    }
    let total_ms = (profile.duration_s() * 1e3) as u64;
    let bar = indicatif::ProgressBar::new(total_ms);
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:30} {percent:>3}%  {msg}",
    )
    .ok()?;
    bar.set_style(style);
    Some(bar)
}
