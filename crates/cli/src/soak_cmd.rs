//! `bourse soak`: the demo's participants for a long time (an hour at 2,000 commands/s by
//! default), with the memory of the venue sampled as it runs.
//!
//! The venue is the demo's (three replicated cores with their market data, one gateway, in
//! this process), without the dashboard, delivery, admin and ITCH services. Every
//! `--sample-s` seconds one row goes to standard output and to `--out` (tab-separated): the
//! seconds since the load started, the commands the gateway has received, the process's
//! resident anonymous memory (`RssAnon`) and resident set (`VmRSS`) from `/proc/self/status`,
//! and what the bounded structures hold per role where they count it themselves: the nodes'
//! committed stream rings (the sum over the replicas and the largest one) and the orders the
//! gateway tracks. The roles share the process, so RSS is the venue's, not a role's.
//!
//! `--small-bounds` sizes the bounded structures small (`bourse_venue::MemoryBounds::SMALL`),
//! so the plateau comes within minutes instead of the defaults' quarter of an hour.
//!
//! Per role, each row has what the structures count themselves: the nodes' stream rings, the
//! feeds' replay history (the resident part of each channel's ring, summed over the feeds),
//! the gateway's binary resend stores, its FIX sessions' stored messages, its finished orders
//! (kept for status requests) and the orders it tracks. The roles are threads and tasks of
//! this one process (the nine nodes share one runtime), so there is no RSS per role: these
//! counters are the per-role account. `--processes` runs the roles as processes instead and
//! samples each one's RSS (`soak_processes`). The harness keeps no per-second series (the profile's
//! `generator.series_seconds_max` is 0), so its own memory does not grow with the run's
//! length. A binary built with the `count-alloc` feature adds the heap's live bytes
//! (`bourse_venue::heap`): when RSS grows and they do not, the growth is the allocator keeping
//! freed memory, not the venue holding more. Each row also carries the machine's one-minute
//! load average.

use anyhow::{anyhow, bail, Context, Result};
use bourse_loadgen::RunOptions;
use bourse_venue::{LocalDeployment, MemoryBounds};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct SoakArgs {
    /// How long the participants trade (fractions allowed: 0.5 is 30 s).
    #[arg(long, default_value_t = 60.0)]
    minutes: f64,
    /// Commands per second the participants send, all markets together.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
    /// Seconds between two samples.
    #[arg(long, default_value_t = 30)]
    sample_s: u64,
    /// Size the bounded structures small (stream rings, replay history, resend stores,
    /// snapshots), so they fill within minutes.
    #[arg(long)]
    small_bounds: bool,
    /// The samples as tab-separated values (default: bourse-soak-<unix time>.tsv).
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run the venue as an operator deploys it, one process per role (three `bourse node`s
    /// per market, one `bourse gateway`, one `bourse loadgen-worker`), and sample each
    /// process's RSS: a column per process, a slope per role (`soak_processes`).
    #[arg(long)]
    processes: bool,
    /// With --processes: the generated configs, the journals, the gateway's store and every
    /// process's log go here (default: a directory under the system's temporary directory).
    #[arg(long, requires = "processes")]
    state_dir: Option<PathBuf>,
    /// With --processes: keep the state directory at the end (it is removed otherwise).
    #[arg(long, requires = "processes")]
    keep_state: bool,
    /// With --processes: a role's RssAnon slope over the second half, in bytes per command,
    /// above which its verdict is ABOVE (printed; the exit status does not depend on it).
    #[arg(long, requires = "processes", default_value_t = 64.0)]
    bound_bytes_per_command: f64,
}

/// Participant accounts per market, as the demo's default.
const ACCOUNTS: u32 = 2_000;

/// The heap's live bytes are counted (the binary was built with `count-alloc`).
const HEAP_COUNTED: bool = cfg!(feature = "count-alloc");

/// The allocator this binary was built with.
const ALLOCATOR: &str = if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "glibc malloc"
};

/// One sample of the process and its bounded structures.
struct Sample {
    t_s: f64,
    load_1m: f64,
    commands: u64,
    rss_anon_kib: u64,
    vm_rss_kib: u64,
    /// `None` unless the binary counts its heap.
    live_heap_bytes: Option<i64>,
    rings_bytes: usize,
    ring_bytes_max: usize,
    replay_history_bytes: u64,
    resend_bytes: usize,
    fix_stored_bytes: usize,
    finished_orders_bytes: usize,
    orders_tracked: usize,
}

const HEADER: &str = "t_s\tload_1m\tcommands\trss_anon_mib\tvm_rss_mib\tlive_heap_mib\tstream_rings_mib\tstream_ring_max_mib\treplay_history_mib\tgateway_resend_mib\tgateway_fix_stored_mib\tgateway_finished_orders_mib\tgateway_orders_tracked";

fn mib(bytes: f64) -> f64 {
    bytes / (1u64 << 20) as f64
}

impl Sample {
    fn row(&self) -> String {
        let live = match self.live_heap_bytes {
            Some(b) => format!("{:.1}", mib(b as f64)),
            None => "-".into(),
        };
        format!(
            "{:.0}\t{:.2}\t{}\t{:.1}\t{:.1}\t{live}\t{:.1}\t{:.2}\t{:.1}\t{:.1}\t{:.1}\t{:.1}\t{}",
            self.t_s,
            self.load_1m,
            self.commands,
            self.rss_anon_kib as f64 / 1024.0,
            self.vm_rss_kib as f64 / 1024.0,
            mib(self.rings_bytes as f64),
            mib(self.ring_bytes_max as f64),
            mib(self.replay_history_bytes as f64),
            mib(self.resend_bytes as f64),
            mib(self.fix_stored_bytes as f64),
            mib(self.finished_orders_bytes as f64),
            self.orders_tracked
        )
    }
}

/// The one-minute load average from `/proc/loadavg` (0 where there is none).
pub(crate) fn load_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// A field of `/proc/self/status` in KiB ("RssAnon", "VmRSS"); 0 where there is none.
pub(crate) fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

pub fn run(args: SoakArgs) -> Result<()> {
    // `is_finite` also refuses NaN, which compares false with everything.
    if !args.minutes.is_finite() || args.minutes <= 0.0 || args.rate == 0 || args.sample_s == 0 {
        bail!("--minutes, --rate and --sample-s must be positive");
    }
    let seconds = args.minutes * 60.0;
    let mut profile =
        crate::demo::participants_profile(seconds, args.rate, ACCOUNTS, args.seed, false)?;
    // The soak reports totals and its own samples, never the per-second series: keeping
    // none holds the harness's memory flat (they cost ~130 KB per second of the run here:
    // the generator's second and windows, one delay histogram per core), so what grows is
    // the venue's.
    profile.generator.series_seconds_max = 0;
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "bourse-soak-{}.tsv",
            bourse_loadgen::unix_ns() / 1_000_000_000
        ))
    });
    if args.processes {
        let interrupted = Arc::new(AtomicBool::new(false));
        {
            let interrupted = Arc::clone(&interrupted);
            // Ctrl-C ends the run; the children are stopped and the samples so far kept.
            let _ = ctrlc::set_handler(move || interrupted.store(true, Ordering::SeqCst));
        }
        if !args.bound_bytes_per_command.is_finite() || args.bound_bytes_per_command < 0.0 {
            bail!("--bound-bytes-per-command must be a number of bytes, 0 or more");
        }
        return crate::soak_processes::run(crate::soak_processes::ProcessesRun {
            profile: &profile,
            sample_s: args.sample_s,
            small_bounds: args.small_bounds,
            out: &out,
            state_dir: args.state_dir.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("bourse-soak-processes-{}", std::process::id()))
            }),
            keep_state: args.keep_state,
            bound_bytes_per_command: args.bound_bytes_per_command,
            interrupted,
        });
    }
    let mut file =
        std::fs::File::create(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let data_dir = std::env::temp_dir().join(format!("bourse-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let mut spec = crate::loadtest_cmd::deployment_spec(&profile, data_dir.clone(), false);
    if args.small_bounds {
        spec.bounds = Some(MemoryBounds::SMALL);
    }
    let mut deployment = LocalDeployment::start(spec).context("starting the venue")?;
    println!(
        "bourse soak: the demo's participants at {} commands/s for {} min, a sample every {} s \
         into {}{}; {ALLOCATOR}, {}",
        args.rate,
        args.minutes,
        args.sample_s,
        out.display(),
        if args.small_bounds {
            " (small bounds)"
        } else {
            ""
        },
        if HEAP_COUNTED {
            "live heap bytes counted"
        } else {
            "live heap not counted (build with --features count-alloc)"
        }
    );
    println!("{HEADER}");
    writeln!(file, "{HEADER}")?;
    let rings = deployment.stream_rings();
    let feeds = deployment.feed_statuses();
    let stats: Vec<_> = deployment
        .gateways()
        .iter()
        .map(|g| Arc::clone(g.stats()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&stop);
        let every = Duration::from_secs(args.sample_s);
        std::thread::Builder::new()
            .name("bourse-soak-sampler".into())
            .spawn(move || -> std::io::Result<Vec<Sample>> {
                let t0 = Instant::now();
                let mut samples = Vec::new();
                let mut next = t0;
                while !stop.load(Ordering::Relaxed) {
                    if Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    next += every;
                    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
                    let kept: Vec<usize> = rings.iter().map(|(_, r)| r.kept().1).collect();
                    let s = Sample {
                        t_s: t0.elapsed().as_secs_f64(),
                        load_1m: load_1m(),
                        live_heap_bytes: HEAP_COUNTED.then(bourse_venue::heap::live_bytes),
                        replay_history_bytes: feeds
                            .iter()
                            .map(|(_, f)| f.read().replay_history_bytes.iter().sum::<u64>())
                            .sum(),
                        resend_bytes: stats
                            .iter()
                            .map(|g| g.binary_resend_bytes.load(Ordering::Relaxed))
                            .sum(),
                        fix_stored_bytes: stats
                            .iter()
                            .map(|g| g.fix_stored_bytes.load(Ordering::Relaxed))
                            .sum(),
                        finished_orders_bytes: stats
                            .iter()
                            .map(|g| g.finished_orders_bytes.load(Ordering::Relaxed))
                            .sum(),
                        commands: stats
                            .iter()
                            .map(|g| g.requests_in.load(Ordering::Relaxed))
                            .sum(),
                        rss_anon_kib: status_kib(&status, "RssAnon"),
                        vm_rss_kib: status_kib(&status, "VmRSS"),
                        rings_bytes: kept.iter().sum(),
                        ring_bytes_max: kept.iter().copied().max().unwrap_or(0),
                        orders_tracked: stats
                            .iter()
                            .map(|g| g.orders_tracked.load(Ordering::Relaxed))
                            .sum(),
                    };
                    println!("{}", s.row());
                    writeln!(file, "{}", s.row())?;
                    samples.push(s);
                }
                Ok(samples)
            })?
    };
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let interrupted = Arc::clone(&interrupted);
        // Ctrl-C ends the load early; the samples so far are kept and summed up.
        let _ = ctrlc::set_handler(move || interrupted.store(true, Ordering::SeqCst));
    }
    let options = RunOptions {
        progress: false,
        version: crate::report::version().to_string(),
        ticker: false,
        stop: Some(interrupted),
        live: None,
    };
    let result = bourse_loadgen::run_on(&profile, &options, &mut deployment);
    stop.store(true, Ordering::SeqCst);
    let samples = sampler
        .join()
        .map_err(|_| anyhow!("the sampler panicked"))?
        .context("writing the samples")?;
    deployment.stop();
    let _ = std::fs::remove_dir_all(&data_dir);
    let results = result.map_err(|e| anyhow!(e))?;
    summarize(&samples);
    println!(
        "  {} transactions, {} trades; samples in {}",
        results.totals.transactions,
        results.totals.trades,
        out.display()
    );
    Ok(())
}

/// The growth of RssAnon (and of the live heap, when counted) over the second half of the
/// run, in all and per command.
fn summarize(samples: &[Sample]) {
    let (Some(mid), Some(last)) = (samples.get(samples.len() / 2), samples.last()) else {
        return;
    };
    let commands = last.commands.saturating_sub(mid.commands).max(1) as f64;
    let grown = |from: f64, to: f64, what: &str| {
        println!(
            "  {what} {:.1} → {:.1} MiB, {:+.1} MiB, {:+.1} bytes per command",
            mib(from),
            mib(to),
            mib(to - from),
            (to - from) / commands
        );
    };
    println!("\nsecond half ({:.0} s → {:.0} s):", mid.t_s, last.t_s);
    grown(
        mid.rss_anon_kib as f64 * 1024.0,
        last.rss_anon_kib as f64 * 1024.0,
        "RssAnon",
    );
    if let (Some(a), Some(b)) = (mid.live_heap_bytes, last.live_heap_bytes) {
        grown(a as f64, b as f64, "live heap");
    }
    grown(
        mid.rings_bytes as f64,
        last.rings_bytes as f64,
        "nodes: stream rings",
    );
    grown(
        mid.replay_history_bytes as f64,
        last.replay_history_bytes as f64,
        "market data: replay history",
    );
    let gateway =
        |s: &Sample| (s.resend_bytes + s.fix_stored_bytes + s.finished_orders_bytes) as f64;
    grown(
        gateway(mid),
        gateway(last),
        "gateway: resend stores, FIX stored messages, finished orders",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kib_and_absent_ones_are_zero() {
        let status = "Name:\tbourse\nVmRSS:\t  123456 kB\nRssAnon:\t  100000 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), 123_456);
        assert_eq!(status_kib(status, "RssAnon"), 100_000);
        assert_eq!(status_kib(status, "RssFile"), 0);
    }
}
