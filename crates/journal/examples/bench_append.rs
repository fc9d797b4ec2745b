//! Appends N records of S bytes under each fsync mode and prints throughput and fsync latency.
//!
//! cargo run --release -p bourse-journal --example bench_append -- [records] [record_bytes]
//!     [entries_per_append] [dir]
//!
//! The directory defaults to a fresh one under the system temp dir, which is removed after.

use std::path::PathBuf;

use bourse_journal::{bench_append, Fsync};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: u64| -> u64 {
        args.get(i)
            .map(|a| a.parse().expect("numeric argument"))
            .unwrap_or(default)
    };
    let records = arg(1, 20_000);
    let record_bytes = arg(2, 256) as u32;
    let per_append = arg(3, 1) as u32;
    let root = args.get(4).map(PathBuf::from).unwrap_or_else(|| {
        std::env::temp_dir().join(format!("bourse-journal-bench-{}", std::process::id()))
    });
    let modes = [
        ("always", Fsync::Always),
        (
            "batch(2ms,1MiB)",
            Fsync::Batch {
                interval_ms: 2,
                bytes_max: 1024 * 1024,
            },
        ),
        ("never", Fsync::Never),
    ];
    println!(
        "{records} records x {record_bytes} B, {per_append} per append, in {}",
        root.display()
    );
    println!(
        "{:<16} {:>12} {:>9} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "fsync", "records/s", "MB/s", "fsyncs", "p50 us", "p99 us", "p99.9 us", "max us"
    );
    for (name, fsync) in modes {
        let dir = root.join(name.split('(').next().unwrap_or(name));
        let report =
            bench_append(&dir, fsync, records, record_bytes, per_append).expect("benchmark run");
        let f = report.fsync_latency_ns;
        println!(
            "{:<16} {:>12.0} {:>9.1} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            name,
            report.records_per_s,
            report.mb_per_s,
            f.count,
            f.p50 as f64 / 1e3,
            f.p99 as f64 / 1e3,
            f.p999 as f64 / 1e3,
            f.max as f64 / 1e3
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir(&root);
}
