//! # bourse-loadgen: load testing as the seeds do it
//!
//! A load test is a [`Profile`] (TOML: markets, command mix, phases with rate shapes), run by
//! an open-loop generator against a [`Target`], summarised as [`Results`] (every figure, as
//! `results.json`) and rendered by [`report`] as Markdown and HTML with inline SVG charts, in
//! the shape of the Moscow Exchange load-test reports (seeds 000 and 001) and LTP's latency
//! table (seed 002).
//!
//! Principal types:
//!
//! - [`Profile`] ([`profile`]): parsed strictly; unknown keys, impossible rates and negative
//!   counts fail before anything starts, with the line and the reason.
//! - [`Target`] ([`target`]): what the generator drives. Two calls: `submit(tag, market,
//!   command)` never blocks (a full queue says [`SubmitError::Full`] and the generator holds
//!   the command, its wait counting in its latency), and `poll(out, wait)` hands back
//!   [`Answer`]s: the tag, the core's [`bourse_core::Event`]s, the instant the answer reached
//!   the client and, where the target can see them, the [`Stages`] (queue in, matching,
//!   queue out). Today [`InProcess`] implements it: one `bourse_engine::Engine` per market on
//!   its own thread behind bounded crossbeam queues. The gateway target (FIX or binary
//!   sessions over loopback) and the cluster target (gateways in front of replicated cores)
//!   are meant to implement the same trait by turning execution reports back into events;
//!   until they exist a profile that asks for them fails with a clear message.
//! - [`generator::Worker`]: one generator thread. Commands leave on schedule whatever the
//!   answers; latency counts from the *scheduled* time (no coordinated omission). Several
//!   workers share a run (each with its own connection, a slice of the accounts and of the
//!   rate); several processes can each run a worker against their own target, and their
//!   records merge the same way.
//! - [`Results`] ([`results`]): totals, maximum per second, rates over time, latency per
//!   command type and per load range, stage table, recovery after peaks, the search for the
//!   peak rate, the cores' own counts and the cross-checks between the two.
//!
//! Nothing here opens a socket: the in-process target keeps every command inside the
//! process. Every run is bounded by its phases plus a drain timeout.

pub mod charts;
pub mod flow;
pub mod generator;
pub mod profile;
pub mod report;
pub mod results;
pub mod target;

pub use profile::{Profile, ProfileError};
pub use results::Results;
pub use target::{Answer, InProcess, Stages, SubmitError, Target};

use generator::{Live, Record, Worker};
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
}

/// Orders each core's pool can hold: the resting orders the flows keep, with room for the
/// swings of a peak and the orders of a burst in flight.
fn orders_max_for(live_orders_target: u32) -> u32 {
    (live_orders_target.saturating_mul(8)).clamp(1 << 16, 1 << 22)
}

/// Runs a profile against the in-process deployment and returns every figure.
pub fn run(profile: &Profile, options: &RunOptions) -> Result<Results, String> {
    profile.check_runnable()?;
    let mut machine = results::Machine::this();
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
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
    let mut deployment = InProcess::start(
        &names,
        workers,
        profile.target.queue_capacity as usize,
        orders_max,
        accounts_max,
    )
    .map_err(|e| format!("cannot start the cores: {e}"))?;

    // Instruments and funded accounts first, outside the measured run.
    let mut flows: Vec<Vec<flow::MarketFlow>> = (0..workers).map(|_| Vec::new()).collect();
    for (m, spec) in profile.markets.iter().enumerate() {
        for (w, worker_flows) in flows.iter_mut().enumerate() {
            let f = flow::MarketFlow::new(
                spec,
                &profile.mix,
                w as u32,
                workers as u32,
                profile.seed ^ ((m as u64) << 40),
            );
            let (_, rejected) = deployment.setup(m, w, f.setup(w == 0))?;
            if rejected > 0 {
                return Err(format!(
                    "market {}: {rejected} setup commands were rejected",
                    spec.name
                ));
            }
            worker_flows.push(f);
        }
    }

    let profile_arc = Arc::new(profile.clone());
    let live = Arc::new(Live::default());
    let start = Instant::now() + Duration::from_millis(20);
    let mut handles = Vec::new();
    for (w, worker_flows) in flows.into_iter().enumerate() {
        let mut target = deployment
            .connect(w)
            .ok_or_else(|| format!("no connection for worker {w}"))?;
        let worker = Worker {
            index: w as u32,
            workers: workers as u32,
            profile: profile_arc.clone(),
            flows: worker_flows,
            live: live.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("loadgen-{w}"))
            .spawn(move || worker.run(&mut target, start))
            .map_err(|e| format!("cannot start a generator thread: {e}"))?;
        handles.push(handle);
    }

    let bar = progress_bar(profile, options);
    let mut last = (Instant::now(), 0u64, 0u64);
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(200));
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
    let rec = merged.ok_or("no generator worker ran")?;
    machine.finish();
    Ok(Results::build(
        profile,
        &rec,
        cores,
        machine,
        options.version.clone(),
        started_unix_s,
    ))
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
