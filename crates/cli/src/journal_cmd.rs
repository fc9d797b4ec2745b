//! `bourse journal verify | inspect | requests`: operator views of a journal directory. They
//! only read (none of them repairs). `requests` decodes a replica's log entries and lists their
//! client requests with who asked (the audit trailer an admin action carries).

use crate::report;
use anyhow::{bail, Result};
use bourse_journal::{inspect, verify};
use clap::Subcommand;
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
    /// List the client requests in a replica group node's journal: index, client id, request
    /// seq, who asked (operator and request id: admin actions carry them, trading requests
    /// show `-`) and the command as JSON.
    Requests {
        dir: PathBuf,
        /// First index to read.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Requests to list at most.
        #[arg(long, default_value_t = 1000)]
        count: u64,
        /// Only requests that say who asked (admin actions).
        #[arg(long)]
        audited: bool,
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
        JournalCommand::Requests {
            dir,
            from,
            count,
            audited,
        } => {
            println!(
                "{:>12} {:>20} {:>10} {:<16} {:<24} command",
                "index", "client", "seq", "operator", "request id"
            );
            let mut listed = 0u64;
            for entry in bourse_journal::replay(&dir, from..)? {
                let entry = entry?;
                let command = bourse_cluster::storage::entry_command(&entry.payload)
                    .map_err(|e| anyhow::anyhow!("entry {}: {e}", entry.index))?;
                let Some(bourse_cluster::LogCommand::Batch(batch)) = command else {
                    continue;
                };
                for r in batch.requests() {
                    if listed == count {
                        return Ok(());
                    }
                    if audited && r.audit.is_none() {
                        continue;
                    }
                    let body = match r.decode() {
                        Ok(c) => serde_json::to_string(&c.command.body)?,
                        Err(e) => format!("(does not decode: {e})"),
                    };
                    let (operator, request_id) =
                        r.audit.map_or(("-", "-"), |a| (a.operator, a.request_id));
                    println!(
                        "{:>12} {:>20} {:>10} {:<16} {:<24} {body}",
                        entry.index, r.client_id, r.request_seq, operator, request_id
                    );
                    listed += 1;
                }
            }
            Ok(())
        }
    }
}
