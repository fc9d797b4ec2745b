//! What the benchmarks share: the latency summary and its histogram, the machine's
//! description, the table rows that print a summary, the loopback TCP echo every network
//! figure is compared with, the median of repeated runs, free ports for benchmark nodes and a
//! scratch directory removed afterwards.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use hdrhistogram::Histogram;

pub use crate::report::{count, ns, peak_rss_bytes, rss_bytes, version, Machine};
pub use bourse_latency::{histogram, record, Latency};

/// Round trips of the loopback echo baseline.
pub const ECHO_ROUND_TRIPS: u32 = 20_000;

/// A plain TCP echo of 64-byte messages on loopback, one at a time: the floor every
/// door-to-door figure is compared with.
pub fn echo_baseline() -> Result<Histogram<u64>> {
    echo_baseline_via(None)
}

/// As [`echo_baseline`], through a delay line of `one_way` each way when given: the floor of
/// anything that needs one round trip over that distance.
pub fn echo_baseline_via(one_way: Option<Duration>) -> Result<Histogram<u64>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let server_addr = listener.local_addr()?;
    let line = match one_way {
        Some(d) => Some(super::delay::DelayLine::start(
            "127.0.0.1:0".parse()?,
            server_addr,
            d,
        )?),
        None => None,
    };
    let addr = line.as_ref().map_or(server_addr, |l| l.addr());
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            s.write_all(&buf[..n])?;
        }
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let msg = [7u8; 64];
    let mut back = [0u8; 64];
    let mut h = histogram();
    // Through a line, about two seconds' worth (at least 200): 20,000 round trips of 2 ms
    // would take 40 s.
    let round_trips = one_way.map_or(ECHO_ROUND_TRIPS, |d| {
        (1_000_000 / (d.as_micros() as u32).max(1)).clamp(200, ECHO_ROUND_TRIPS)
    });
    for _ in 0..round_trips {
        let t = Instant::now();
        c.write_all(&msg)?;
        c.read_exact(&mut back)?;
        record(&mut h, t.elapsed().as_nanos() as u64);
    }
    drop(c);
    drop(line);
    server
        .join()
        .map_err(|_| anyhow!("echo server panicked"))??;
    Ok(h)
}

/// The median of some measurements (the mean of the middle two of an even count; 0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Three consecutive free ports on 127.0.0.1 for a benchmark's replica group (below the
/// ephemeral range, see `bourse_testkit`).
pub fn free_ports() -> Result<[u16; 3]> {
    let base = bourse_testkit::try_free_port_block(3)?;
    Ok([base, base + 1, base + 2])
}

/// A scratch directory under the system's temporary directory, removed when dropped.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    /// `bourse-<name>-<pid>-<ns>` in the system's temporary directory.
    pub fn new(name: &str) -> Result<ScratchDir> {
        ScratchDir::under(&std::env::temp_dir(), name)
    }

    /// `bourse-<name>-<pid>-<ns>` in `base`: unique per run, so that runs side by side do not
    /// collide.
    pub fn under(base: &std::path::Path, name: &str) -> Result<ScratchDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = base.join(format!("bourse-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(ScratchDir(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One row of a latency table: name, count, p50 … max.
pub fn latency_row(name: &str, l: &Latency) -> String {
    format!(
        "  {:<12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        name,
        count(l.count),
        ns(l.p50),
        ns(l.p90),
        ns(l.p99),
        ns(l.p999),
        ns(l.p9999),
        ns(l.max)
    )
}

/// The header over [`latency_row`]s.
pub fn latency_header() -> String {
    format!(
        "  {:<12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "command", "count", "p50", "p90", "p99", "p99.9", "p99.99", "max"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }

    #[test]
    fn the_echo_baseline_times_every_round_trip() {
        let h = echo_baseline().unwrap();
        assert_eq!(h.len(), ECHO_ROUND_TRIPS as u64);
    }

    #[test]
    fn a_scratch_dir_is_removed_when_dropped() {
        let d = ScratchDir::new("common-test").unwrap();
        let path = d.0.clone();
        assert!(path.is_dir());
        drop(d);
        assert!(!path.exists());
    }
}

/// One thread's scheduler figures (from `/proc/self/task/<tid>/{schedstat,status}`): time on a
/// CPU, time waiting in the run queue for one, voluntary context switches (each a sleep and a
/// wake-up) and involuntary ones (preemptions). CPU time per command barely moves with the
/// machine's load, unlike latency.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadCpu {
    pub cpu_ns: u64,
    pub wait_ns: u64,
    pub switches: u64,
    pub preempted: u64,
}

impl ThreadCpu {
    /// What this thread did since `was` (counters only grow; a reused id reads as new).
    pub fn since(&self, was: &ThreadCpu) -> ThreadCpu {
        ThreadCpu {
            cpu_ns: self.cpu_ns.saturating_sub(was.cpu_ns),
            wait_ns: self.wait_ns.saturating_sub(was.wait_ns),
            switches: self.switches.saturating_sub(was.switches),
            preempted: self.preempted.saturating_sub(was.preempted),
        }
    }

    pub fn add(&mut self, other: &ThreadCpu) {
        self.cpu_ns += other.cpu_ns;
        self.wait_ns += other.wait_ns;
        self.switches += other.switches;
        self.preempted += other.preempted;
    }
}

/// Every thread of this process by id: its name and its figures (threads the kernel will not
/// describe, e.g. ended ones, are left out).
pub fn thread_cpu() -> std::collections::BTreeMap<u64, (String, ThreadCpu)> {
    threads_of("/proc/self/task")
}

/// The figures of process `pid`, summed over its threads; `None` once it is gone.
pub fn process_cpu(pid: u32) -> Option<ThreadCpu> {
    let threads = threads_of(&format!("/proc/{pid}/task"));
    if threads.is_empty() {
        return None;
    }
    let mut all = ThreadCpu::default();
    for (_, t) in threads.values() {
        all.add(t);
    }
    Some(all)
}

/// Every thread under `dir` (a `/proc/<pid>/task`) by id, with its name and figures.
fn threads_of(dir: &str) -> std::collections::BTreeMap<u64, (String, ThreadCpu)> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(dir) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u64>().ok())
        else {
            continue;
        };
        let path = task.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).ok();
        let (Some(comm), Some(schedstat), Some(status)) =
            (read("comm"), read("schedstat"), read("status"))
        else {
            continue;
        };
        let mut sched = schedstat
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        out.insert(
            tid,
            (
                comm.trim().to_string(),
                ThreadCpu {
                    cpu_ns: sched.next().unwrap_or(0),
                    wait_ns: sched.next().unwrap_or(0),
                    switches: field("voluntary_ctxt_switches:"),
                    preempted: field("nonvoluntary_ctxt_switches:"),
                },
            ),
        );
    }
    out
}
