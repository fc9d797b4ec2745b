//! `bourse journal verify | inspect` and `bourse bench journal`: operator views of a journal
//! directory and the append benchmark. They only read (verify and inspect never repair).

use crate::report;
use anyhow::{bail, Result};
use bourse_journal::{bench_append, inspect, verify, Fsync};
use clap::{Args, Subcommand};
use serde_json::json;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum JournalCommand {
    /// Check every segment, record, CRC and hash-chain link; exit 1 at the first problem,
    /// naming the file and byte offset.
    Verify {
        /// The journal directory.
        dir: PathBuf,
    },
    /// List records: index, term, payload length, chain hash, file and offset.
    Inspect {
        dir: PathBuf,
        /// First index to list.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Records to list at most.
        #[arg(long, default_value_t = 100)]
        count: u64,
    },
}

pub fn run(command: JournalCommand) -> Result<()> {
    match command {
        JournalCommand::Verify { dir } => {
            let r = verify(&dir)?;
            println!("journal {}", r.dir.display());
            if let (Some(c), Some(n)) = (r.cluster_id, r.node_id) {
                println!("  cluster {c:032x}, node {n}");
            }
            println!(
                "  {} segments, {} records, indexes {} to {}",
                r.segments.len(),
                report::count(r.records),
                r.first_index.map_or("-".into(), |i| i.to_string()),
                r.last.map_or("-".into(), |p| p.index.to_string())
            );
            if let Some(h) = r.last_hash {
                println!("  last chain hash {h:016x}");
            }
            if let Some(m) = &r.meta {
                println!("  vote file: {m:?}");
            }
            if let Some(t) = &r.torn_tail {
                println!(
                    "  torn tail at {} offset {} ({} bytes): opening will cut it ({})",
                    t.file.display(),
                    t.offset,
                    t.bytes_dropped,
                    t.reason
                );
            }
            for f in &r.foreign_files {
                println!("  foreign file left alone: {}", f.display());
            }
            match &r.problem {
                None => {
                    println!("  ok");
                    Ok(())
                }
                Some(p) => {
                    let at = match (&p.file, p.offset) {
                        (Some(f), Some(o)) => format!(" in {} at byte {o}", f.display()),
                        (Some(f), None) => format!(" in {}", f.display()),
                        _ => String::new(),
                    };
                    bail!("damaged{at}: {}", p.message)
                }
            }
        }
        JournalCommand::Inspect { dir, from, count } => {
            println!(
                "{:>12} {:>8} {:>10} {:>18}  file:offset",
                "index", "term", "bytes", "chain hash"
            );
            for record in inspect(&dir, from..)?.take(count as usize) {
                let r = record?;
                println!(
                    "{:>12} {:>8} {:>10} {:>18x}  {}:{}",
                    r.index,
                    r.term,
                    r.payload_len,
                    r.hash,
                    r.file
                        .file_name()
                        .map_or("?".into(), |n| n.to_string_lossy()),
                    r.offset
                );
            }
            Ok(())
        }
    }
}

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
            report::count(args.records),
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
                    "machine": report::Machine::this(), "version": report::version(),
                })
            );
        } else {
            println!(
                "  {:<8} {:>12} {:>9.1} {:>8} {:>10} {:>10} {:>10} {:>10}",
                name,
                report::count(r.records_per_s as u64),
                r.mb_per_s,
                f.count,
                report::ns(f.p50),
                report::ns(f.p99),
                report::ns(f.p999),
                report::ns(f.max)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}
