//! `bourse bench venue`: what the whole venue costs per transaction. The demo's venue (three
//! markets, each a replica group of three nodes, one gateway, market data, delivery, admin
//! and the dashboard's monitor, all in this process) is driven by the demo's participants at
//! fixed rates; over a window after a warm-up, every thread's CPU time and context switches
//! are read from `/proc/self/task` and divided by the commands sent in that window, per
//! thread group (a thread's name without its number) and for the venue as a whole (every
//! thread but the generator's and this benchmark's). Latency is the generator's round trip
//! through the gateway from the scheduled send, warm-up excluded.
//!
//! Per-transaction figures hold from one machine to the next far better than rates: they are
//! what BENCHMARKS.md's venue table quotes.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use bourse_loadgen::generator::Live;
use bourse_loadgen::RunOptions;
use clap::Args;
use serde_json::json;

use super::common::{self, thread_cpu, Latency, ThreadCpu};

/// Rates the benchmark may offer, commands per second (the generator's own bound).
const RATE_MAX: u64 = 1_000_000;
/// Longest measured window and warm-up, seconds.
const SECONDS_MAX: u64 = 600;
/// A rate is kept when the window's successful answers reach this share of its sends.
const KEPT_SHARE: f64 = 0.97;
/// Steps of the peak search above the last listed rate, at most.
const PEAK_STEPS_MAX: usize = 12;

#[derive(Args)]
pub struct VenueBenchArgs {
    /// Offered rates, commands per second (all markets together), one fresh venue each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1_000u64, 5_000, 20_000])]
    rates: Vec<u64>,
    /// Seconds measured per rate.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Seconds of warm-up before the window, at the same rate, left out of every figure.
    #[arg(long, default_value_t = 3)]
    warmup_seconds: u64,
    /// After the listed rates, raise the rate by a quarter each step until the venue no longer
    /// keeps it (successful answers below 97% of the sends in the window): the highest it keeps.
    #[arg(long)]
    peak: bool,
    /// Thread groups in the table: the most expensive N (the rest are summed in one row).
    #[arg(long, default_value_t = 14)]
    groups: usize,
    /// Print one JSON object per rate instead of tables.
    #[arg(long)]
    json: bool,
}

/// One rate's figures.
struct RateFigures {
    offered_per_s: u64,
    window_s: f64,
    sent: u64,
    answered: u64,
    successful: u64,
    /// Log entries the cores applied (every core's replica furthest on), blank and hash-check
    /// entries included: a transaction per entry means a consensus round per transaction.
    entries: u64,
    /// Thread group name → (threads, summed figures), venue threads only.
    groups: BTreeMap<String, (usize, ThreadCpu)>,
    generator: ThreadCpu,
    latency: Latency,
}

impl RateFigures {
    fn venue(&self) -> ThreadCpu {
        let mut all = ThreadCpu::default();
        for (_, t) in self.groups.values() {
            all.add(t);
        }
        all
    }

    /// Whether the venue kept the rate: its answers were successes (a busy refusal at the
    /// door is an answer, not a transaction kept) and the generator sent what was offered.
    fn kept(&self) -> bool {
        self.successful as f64 >= KEPT_SHARE * self.sent as f64
            && self.sent as f64 >= KEPT_SHARE * self.offered_per_s as f64 * self.window_s
    }
}

pub fn bench(args: VenueBenchArgs) -> Result<()> {
    if args.rates.is_empty() || args.rates.iter().any(|r| *r == 0 || *r > RATE_MAX) {
        bail!("--rates must list rates between 1 and {RATE_MAX} commands per second");
    }
    if args.seconds == 0 || args.seconds > SECONDS_MAX || args.warmup_seconds > SECONDS_MAX {
        bail!("--seconds must be 1..={SECONDS_MAX} and --warmup-seconds at most {SECONDS_MAX}");
    }
    if !args.json {
        println!(
            "bench venue: the demo's venue in this process (3 markets x 3 replicas, gateway, \
             market data, delivery, admin, monitor), fsync batch; {} s measured after {} s \
             warm-up per rate; per transaction = per command sent in the window",
            args.seconds, args.warmup_seconds
        );
        let m = common::Machine::this();
        println!(
            "  machine: {}, {} CPUs, kernel {}, load average {:.2}",
            m.model, m.cpus, m.kernel, m.load_average_start
        );
    }
    let mut rates = args.rates.clone();
    rates.sort_unstable();
    let mut step = 0;
    let mut i = 0;
    while i < rates.len() {
        let rate = rates[i];
        let figures = run_rate(rate, &args)?;
        report(&figures, &args);
        let last_listed = i + 1 == rates.len();
        if args.peak && last_listed && figures.kept() && step < PEAK_STEPS_MAX {
            rates.push((rate + rate / 4).min(RATE_MAX));
            step += 1;
        } else if args.peak && last_listed && !args.json {
            println!("  peak search: {rate}/s not kept (or {PEAK_STEPS_MAX} steps taken)");
        }
        i += 1;
    }
    Ok(())
}

/// Starts a fresh demo venue, offers `rate` through warm-up and window, samples every thread
/// at the window's ends, stops the venue.
fn run_rate(rate: u64, args: &VenueBenchArgs) -> Result<RateFigures> {
    let mut profile =
        crate::demo::participants_profile(args.seconds as f64, rate, 2_000, 1, false)?;
    if args.warmup_seconds > 0 {
        let mut warmup = profile.phases[0].clone();
        warmup.name = "warm-up".into();
        warmup.duration_s = args.warmup_seconds as f64;
        warmup.warmup = true;
        profile.phases.insert(0, warmup);
    }
    let scratch = common::ScratchDir::new("bench-venue")?;
    let out = scratch.0.join("out");
    std::fs::create_dir_all(&out)?;
    let demo_args = crate::demo::DemoArgs::quiet(rate);
    let mut venue =
        crate::demo::DemoVenue::start(&demo_args, &profile, &out, &scratch.0.join("data"), false)?;
    let live = Arc::new(Live::default());
    let rings = venue.deployment.stream_rings();
    let sampler = {
        let live = Arc::clone(&live);
        let (warmup, window) = (
            Duration::from_secs(args.warmup_seconds),
            Duration::from_secs(args.seconds),
        );
        std::thread::Builder::new()
            .name("bench-sampler".into())
            .spawn(move || sample_window(&live, &rings, warmup, window))?
    };
    let options = RunOptions {
        progress: false,
        version: common::version().to_string(),
        ticker: false,
        stop: None,
        live: Some(Arc::clone(&live)),
    };
    let result = bourse_loadgen::run_on(&profile, &options, &mut venue.deployment);
    let _ = venue.stop()?;
    let results = result.map_err(|e| anyhow!(e))?;
    let (start, end) = sampler
        .join()
        .map_err(|_| anyhow!("the sampler panicked"))??;
    if !results.checks_pass() {
        let failed = results.failed_checks();
        bail!("at {rate}/s a cross-check failed: {}", failed.join("; "));
    }
    let mut groups: BTreeMap<String, (usize, ThreadCpu)> = BTreeMap::new();
    let mut generator = ThreadCpu::default();
    let own = u64::from(std::process::id());
    for (tid, (name, now)) in &end.threads {
        let was = start.threads.get(tid).map(|(_, c)| *c).unwrap_or_default();
        let delta = now.since(&was);
        if name.starts_with("loadgen") || name == "bench-sampler" || *tid == own {
            // The generator's threads, the sampler and the main thread (which only waits).
            generator.add(&delta);
            continue;
        }
        let entry = groups.entry(group_of(name)).or_default();
        entry.0 += 1;
        entry.1.add(&delta);
    }
    Ok(RateFigures {
        offered_per_s: rate,
        window_s: end.at.duration_since(start.at).as_secs_f64(),
        sent: end.sent - start.sent,
        answered: end.answered - start.answered,
        successful: end.successful - start.successful,
        entries: end.entries - start.entries,
        groups,
        generator,
        latency: results.latency_all,
    })
}

/// What the sampler reads at one end of the window.
struct Sample {
    at: Instant,
    threads: BTreeMap<u64, (String, ThreadCpu)>,
    sent: u64,
    answered: u64,
    successful: u64,
    entries: u64,
}

/// Waits for the run's first send, then for the warm-up, and samples at both ends of the
/// window. The sampler sleeps between its reads, so it adds nothing inside the window but
/// its own two reads.
fn sample_window(
    live: &Live,
    rings: &[(String, bourse_cluster::stream::CommittedStream)],
    warmup: Duration,
    window: Duration,
) -> Result<(Sample, Sample)> {
    let waited = Instant::now();
    while live.sent.load(Ordering::Relaxed) == 0 {
        if waited.elapsed() > Duration::from_secs(60) {
            bail!("the generator sent nothing in 60 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let first = Instant::now();
    let read = || Sample {
        at: Instant::now(),
        threads: thread_cpu(),
        sent: live.sent.load(Ordering::Relaxed),
        answered: live.answered.load(Ordering::Relaxed),
        successful: live.transactions.load(Ordering::Relaxed),
        entries: entries_applied(rings),
    };
    std::thread::sleep((first + warmup).saturating_duration_since(Instant::now()));
    let start = read();
    std::thread::sleep((start.at + window).saturating_duration_since(Instant::now()));
    Ok((start, read()))
}

/// Entries applied by every core, each counted at its replica furthest on (rings are named
/// "core/node").
fn entries_applied(rings: &[(String, bourse_cluster::stream::CommittedStream)]) -> u64 {
    let mut by_core: BTreeMap<&str, u64> = BTreeMap::new();
    for (name, ring) in rings {
        let core = name.split('/').next().unwrap_or(name);
        let e = by_core.entry(core).or_default();
        *e = (*e).max(ring.next_index());
    }
    by_core.values().sum()
}

/// A thread's group: its name without a trailing number (`md-node-4` → `md-node`,
/// `bourse-deploy` stays), so replicas of one role sum together.
fn group_of(name: &str) -> String {
    let trimmed = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let trimmed = trimmed.trim_end_matches(['-', '_', '#']);
    if trimmed.is_empty() {
        name.to_string()
    } else {
        trimmed.to_string()
    }
}

fn report(f: &RateFigures, args: &VenueBenchArgs) {
    let tx = f.sent.max(1) as f64;
    let venue = f.venue();
    let us = |t: &ThreadCpu| t.cpu_ns as f64 / 1e3 / tx;
    let cs = |t: &ThreadCpu| (t.switches + t.preempted) as f64 / tx;
    let cores = |t: &ThreadCpu| t.cpu_ns as f64 / 1e9 / f.window_s;
    let l = &f.latency;
    if args.json {
        let groups: serde_json::Map<String, serde_json::Value> = f
            .groups
            .iter()
            .map(|(name, (n, t))| {
                (
                    name.clone(),
                    json!({
                        "threads": n,
                        "cpu_us_per_tx": round2(us(t)),
                        "switches_per_tx": round2(cs(t)),
                        "voluntary_switches_per_tx": round2(t.switches as f64 / tx),
                        "cores": round2(cores(t)),
                    }),
                )
            })
            .collect();
        println!(
            "{}",
            json!({
                "bench": "venue",
                "offered_per_s": f.offered_per_s,
                "window_s": round2(f.window_s),
                "sent_per_s": round2(f.sent as f64 / f.window_s),
                "answered_per_s": round2(f.answered as f64 / f.window_s),
                "successful_per_s": round2(f.successful as f64 / f.window_s),
                "kept": f.kept(),
                "transactions_per_log_entry": round2(f.sent as f64 / f.entries.max(1) as f64),
                "venue_cpu_us_per_tx": round2(us(&venue)),
                "venue_switches_per_tx": round2(cs(&venue)),
                "venue_voluntary_switches_per_tx": round2(venue.switches as f64 / tx),
                "venue_cores": round2(cores(&venue)),
                "venue_run_queue_wait_us_per_tx": round2(venue.wait_ns as f64 / 1e3 / tx),
                "generator_cpu_us_per_tx": round2(us(&f.generator)),
                "latency_ns": l,
                "groups": groups,
            })
        );
        return;
    }
    println!(
        "\n  offered {}/s: sent {}/s, answered {}/s, successful {}/s{}",
        common::count(f.offered_per_s),
        common::count((f.sent as f64 / f.window_s) as u64),
        common::count((f.answered as f64 / f.window_s) as u64),
        common::count((f.successful as f64 / f.window_s) as u64),
        if f.kept() { "" } else { "  (NOT kept)" }
    );
    println!(
        "  log entries: {}/s over the cores, {:.2} transactions per entry",
        common::count((f.entries as f64 / f.window_s) as u64),
        f.sent as f64 / f.entries.max(1) as f64
    );
    println!(
        "  round trip through the gateway (HDR, from the scheduled send): p50 {}, p99 {}, \
         p99.9 {}, max {} ({} answers)",
        common::ns(l.p50),
        common::ns(l.p99),
        common::ns(l.p999),
        common::ns(l.max),
        common::count(l.count)
    );
    println!(
        "  {:<24} {:>7} {:>10} {:>10} {:>10} {:>7}",
        "thread group", "threads", "CPU us/tx", "switch/tx", "wake-ups/tx", "cores"
    );
    let mut rows: Vec<(&String, &(usize, ThreadCpu))> = f.groups.iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1 .1.cpu_ns));
    let row = |name: &str, n: usize, t: &ThreadCpu| {
        println!(
            "  {:<24} {:>7} {:>10.1} {:>10.2} {:>10.2} {:>7.2}",
            name,
            n,
            us(t),
            cs(t),
            t.switches as f64 / tx,
            cores(t)
        )
    };
    let mut rest = (0usize, ThreadCpu::default());
    for (i, (name, (n, t))) in rows.iter().enumerate() {
        if i < args.groups {
            row(name, *n, t);
        } else {
            rest.0 += n;
            rest.1.add(t);
        }
    }
    if rest.0 > 0 {
        row("(the rest)", rest.0, &rest.1);
    }
    let threads: usize = f.groups.values().map(|(n, _)| n).sum();
    row("venue, in all", threads, &venue);
    row("generator (excluded)", 0, &f.generator);
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_group_is_its_name_without_the_number() {
        assert_eq!(group_of("md-node-4"), "md-node");
        assert_eq!(group_of("bourse-cluster-link-12"), "bourse-cluster-link");
        assert_eq!(group_of("bourse-deploy"), "bourse-deploy");
        assert_eq!(group_of("loadgen-0"), "loadgen");
        assert_eq!(group_of("42"), "42");
    }
}
