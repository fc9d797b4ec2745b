//! `bourse bench journal`: journal appends per fsync mode, records/s, MB/s and fsync latency.

use super::common;
use anyhow::{bail, Result};
use bourse_journal::{bench_append, Fsync};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;

#[derive(Args)]
pub struct JournalBenchArgs {
    /// Records to append per fsync mode.
    #[arg(long, default_value_t = 20_000)]
    records: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 256)]
    record_bytes: u32,
    /// Records per append call (a replicated batch).
    #[arg(long, default_value_t = 64)]
    per_append: u32,
    /// Directory to write in (a fresh temporary directory by default).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn bench(args: JournalBenchArgs) -> Result<()> {
    if args.records == 0 || args.per_append == 0 || args.record_bytes == 0 {
        bail!("--records, --record-bytes and --per-append must be positive");
    }
    let base = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("bourse-bench-journal-{}", std::process::id())),
    };
    if !args.json {
        println!(
            "bourse bench journal — {} records of {} bytes, {} per append, in {}",
            common::count(args.records),
            args.record_bytes,
            args.per_append,
            base.display()
        );
        println!("  includes: framing, CRC32C, hash chain, write(2), fsync per mode; excludes the final flush");
        println!(
            "  {:<8} {:>12} {:>9} {:>8} {:>10} {:>10} {:>10} {:>10}",
            "fsync", "records/s", "MB/s", "fsyncs", "p50", "p99", "p99.9", "max"
        );
    }
    for (name, fsync) in [
        ("always", Fsync::Always),
        (
            "batch",
            Fsync::Batch {
                interval_ms: 2,
                bytes_max: 1 << 20,
            },
        ),
        ("never", Fsync::Never),
    ] {
        let dir = base.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let r = bench_append(
            &dir,
            fsync,
            args.records,
            args.record_bytes,
            args.per_append,
        )?;
        let f = r.fsync_latency_ns;
        if args.json {
            println!(
                "{}",
                json!({
                    "bench": "journal", "scenario": name, "records": r.records,
                    "record_size_bytes": r.record_size_bytes, "entries_per_append": r.entries_per_append,
                    "throughput_per_s": r.records_per_s.round() as u64, "mb_per_s": r.mb_per_s,
                    "fsync_latency_ns": {"count": f.count, "p50": f.p50, "p99": f.p99, "p999": f.p999, "max": f.max},
                    "machine": common::Machine::this(), "version": common::version(),
                })
            );
        } else {
            println!(
                "  {:<8} {:>12} {:>9.1} {:>8} {:>10} {:>10} {:>10} {:>10}",
                name,
                common::count(r.records_per_s as u64),
                r.mb_per_s,
                f.count,
                common::ns(f.p50),
                common::ns(f.p99),
                common::ns(f.p999),
                common::ns(f.max)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}
