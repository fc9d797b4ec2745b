//! An append benchmark for `bourse bench journal`: appends N records of S bytes under one
//! fsync mode and reports throughput and the fsync latency distribution.

use std::path::Path;
use std::time::Instant;

use hdrhistogram::Histogram;

use bourse_latency::Latency;

use crate::error::{JournalError, Result};
use crate::journal::{Config, Entry, Fsync, Journal};

/// What one benchmark run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BenchReport {
    pub fsync: Fsync,
    pub records: u64,
    pub record_size_bytes: u32,
    pub entries_per_append: u32,
    /// Time spent in `append` calls only; the final flush is not included.
    pub elapsed_ns: u64,
    pub records_per_s: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    pub fsync_latency_ns: Latency,
    pub append_latency_ns: Latency,
}

/// Appends `records` records of `record_size_bytes` each, `entries_per_append` at a time, to a
/// new journal in `dir` (which must not hold one) and measures it.
pub fn bench_append(
    dir: &Path,
    fsync: Fsync,
    records: u64,
    record_size_bytes: u32,
    entries_per_append: u32,
) -> Result<BenchReport> {
    assert!(records > 0);
    assert!(entries_per_append > 0);
    let mut config = Config::new(0xB0_0125E, 1);
    config.fsync = fsync;
    config.payload_size_bytes_max = config.payload_size_bytes_max.max(record_size_bytes);
    config.entries_per_append_max = config.entries_per_append_max.max(entries_per_append);
    let (mut journal, report) = Journal::open(dir, config)?;
    if !report.created {
        return Err(JournalError::Invalid(format!(
            "benchmark directory {} already holds a journal",
            dir.display()
        )));
    }
    let histogram = || {
        Histogram::<u64>::new_with_bounds(1, crate::journal::LATENCY_NS_MAX, 3)
            .map_err(|e| JournalError::Config(e.to_string()))
    };
    let mut append_latency_ns = histogram()?;
    let payload: Vec<u8> = (0..record_size_bytes).map(|i| (i % 251) as u8).collect();
    let mut batch: Vec<Entry> = Vec::with_capacity(entries_per_append as usize);
    let mut index = 0u64;
    let start = Instant::now();
    while index < records {
        batch.clear();
        let count = u64::from(entries_per_append).min(records - index);
        for i in 0..count {
            batch.push(Entry {
                index: index + i,
                term: 1,
                payload: payload.clone(),
            });
        }
        let append_start = Instant::now();
        journal.append(&batch)?;
        append_latency_ns.saturating_record(append_start.elapsed().as_nanos() as u64);
        index += count;
    }
    let elapsed_ns = start.elapsed().as_nanos().max(1) as u64;
    journal.flush()?;
    let seconds = elapsed_ns as f64 / 1e9;
    Ok(BenchReport {
        fsync,
        records,
        record_size_bytes,
        entries_per_append,
        elapsed_ns,
        records_per_s: records as f64 / seconds,
        mb_per_s: (records * u64::from(record_size_bytes)) as f64 / 1e6 / seconds,
        fsync_latency_ns: Latency::of(journal.fsync_latency_ns()),
        append_latency_ns: Latency::of(&append_latency_ns),
    })
}
