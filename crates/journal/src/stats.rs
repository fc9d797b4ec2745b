//! Cheap counters for monitoring: what a journal appended and how long its fsyncs took, and
//! what a snapshot store wrote.
//!
//! Every [`Journal`](crate::Journal) and [`SnapshotStore`](crate::SnapshotStore) owns an
//! `Arc` of its stats and updates them with relaxed atomic additions on paths that already do
//! a system call, so the cost is a few nanoseconds per append. Readers (a monitoring thread)
//! take a [`JournalStatsSnapshot`] at any time without a lock.
//!
//! The journal sits inside the cluster crate's log storage, out of the monitor's reach, so
//! each journal and snapshot store also registers its stats in a process-wide table keyed by
//! its directory: [`journal_stats_for`] and [`snapshot_stats_for`] find them. The table holds
//! weak references, so a dropped journal's stats disappear with it.
//!
//! The fsync histogram has fixed bucket bounds ([`FSYNC_BUCKETS_NS`]: 1 µs to 10 s in
//! 1-2.5-5 steps, the bounds the monitor exports latency histograms with), so it can be
//! exported as a Prometheus histogram as it is.
//!
//! [`JournalStats::append_times`] keeps the completion time of the last appends (a small ring
//! of index ranges), so a monitor can tell when a given log index was appended locally.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Bucket upper bounds of the fsync and snapshot-write histograms, in nanoseconds.
pub const FSYNC_BUCKETS_NS: &[u64] = &[
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Appends whose completion time is remembered (per journal).
pub const APPEND_RING_SLOTS: usize = 1_024;

/// Journals and snapshot stores the process-wide table tracks at most; registrations past it
/// are not findable (their own stats still work).
pub const REGISTERED_MAX: usize = 256;

/// The zero of the nanosecond stamps in the append ring (first use in this process).
fn anchor() -> Instant {
    static ANCHOR: OnceLock<Instant> = OnceLock::new();
    *ANCHOR.get_or_init(Instant::now)
}

/// A latency histogram with the fixed bounds of [`FSYNC_BUCKETS_NS`] (last cell: +Inf).
#[derive(Debug)]
pub struct LatencyBuckets {
    buckets: [AtomicU64; FSYNC_BUCKETS_NS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Default for LatencyBuckets {
    fn default() -> Self {
        LatencyBuckets {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl LatencyBuckets {
    pub fn observe_ns(&self, ns: u64) {
        let i = FSYNC_BUCKETS_NS.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts per bucket (not cumulative; the last is above the largest bound), sum, count.
    pub fn read(&self) -> HistogramReading {
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        // Read the count after the buckets and never report less than their sum, so the
        // reading is self-consistent while appends go on.
        let count = self.count.load(Ordering::Relaxed).max(buckets.iter().sum());
        HistogramReading {
            buckets,
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            count,
        }
    }
}

/// A reading of a [`LatencyBuckets`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramReading {
    /// Observations per bucket of [`FSYNC_BUCKETS_NS`], then the ones above the last bound.
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
    pub count: u64,
}

/// One remembered append: log indexes `first..=last`, completed at `at_ns` (ring anchor).
#[derive(Debug, Default)]
struct AppendSlot {
    first: AtomicU64,
    last: AtomicU64,
    at_ns: AtomicU64,
}

/// What one journal did since it was opened.
#[derive(Debug)]
pub struct JournalStats {
    dir: PathBuf,
    bytes: AtomicU64,
    records: AtomicU64,
    appends: AtomicU64,
    fsync: LatencyBuckets,
    ring: Box<[AppendSlot]>,
    ring_next: AtomicU64,
}

/// A consistent-enough copy of a journal's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JournalStatsSnapshot {
    /// Bytes written as records (headers included) since the journal was opened.
    pub bytes_appended: u64,
    /// Records appended since the journal was opened.
    pub records_appended: u64,
    /// Append calls since the journal was opened.
    pub appends: u64,
    /// Every fsync of a segment the journal made (count, sum and buckets).
    pub fsync: HistogramReading,
}

impl JournalStats {
    pub(crate) fn new(dir: &Path) -> Arc<JournalStats> {
        let stats = Arc::new(JournalStats {
            dir: dir.to_path_buf(),
            bytes: AtomicU64::new(0),
            records: AtomicU64::new(0),
            appends: AtomicU64::new(0),
            fsync: LatencyBuckets::default(),
            ring: (0..APPEND_RING_SLOTS)
                .map(|_| AppendSlot::default())
                .collect(),
            ring_next: AtomicU64::new(0),
        });
        register(&JOURNALS, dir, &stats);
        stats
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn on_append(&self, first: u64, last: u64, records: u64, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
        self.appends.fetch_add(1, Ordering::Relaxed);
        let at_ns = anchor().elapsed().as_nanos() as u64 + 1;
        // One writer (the journal is behind `&mut self`): claim the slot, invalidate it, fill
        // it, publish it with `last` so a reader that sees `last` sees the rest.
        let n = self.ring_next.fetch_add(1, Ordering::Relaxed);
        let slot = &self.ring[(n % APPEND_RING_SLOTS as u64) as usize];
        slot.last.store(0, Ordering::Release);
        slot.first.store(first, Ordering::Relaxed);
        slot.at_ns.store(at_ns, Ordering::Relaxed);
        slot.last.store(last, Ordering::Release);
    }

    pub(crate) fn on_fsync(&self, took: Duration) {
        self.fsync
            .observe_ns((took.as_nanos().min(u128::from(u64::MAX)) as u64).max(1));
    }

    pub fn snapshot(&self) -> JournalStatsSnapshot {
        JournalStatsSnapshot {
            bytes_appended: self.bytes.load(Ordering::Relaxed),
            records_appended: self.records.load(Ordering::Relaxed),
            appends: self.appends.load(Ordering::Relaxed),
            fsync: self.fsync.read(),
        }
    }

    /// The remembered appends, oldest first, as (first index, last index, completed at).
    /// An append completes when its bytes are written and, under `Fsync::Always`, fsynced.
    pub fn append_times(&self) -> Vec<(u64, u64, Instant)> {
        self.append_times_after(None)
    }

    /// As [`JournalStats::append_times`], only the appends whose last index is above
    /// `after` (read newest first, so a caller that keeps up reads only a few slots).
    pub fn append_times_after(&self, after: Option<u64>) -> Vec<(u64, u64, Instant)> {
        let next = self.ring_next.load(Ordering::Acquire);
        let slots = next.min(APPEND_RING_SLOTS as u64);
        let mut out = Vec::new();
        for n in (next - slots..next).rev() {
            let slot = &self.ring[(n % APPEND_RING_SLOTS as u64) as usize];
            let last = slot.last.load(Ordering::Acquire);
            let first = slot.first.load(Ordering::Relaxed);
            let at_ns = slot.at_ns.load(Ordering::Relaxed);
            // A slot being rewritten right now reads `last == 0` or changes under us: skip it.
            if last == 0 || slot.last.load(Ordering::Acquire) != last || first > last {
                continue;
            }
            if after.is_some_and(|a| last <= a) {
                break;
            }
            out.push((first, last, anchor() + Duration::from_nanos(at_ns - 1)));
        }
        out.reverse();
        out
    }
}

/// What one snapshot store wrote since it was opened.
#[derive(Debug)]
pub struct SnapshotStats {
    dir: PathBuf,
    written: AtomicU64,
    bytes_total: AtomicU64,
    bytes_last: AtomicU64,
    index_last: AtomicU64,
    write: LatencyBuckets,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotStatsSnapshot {
    pub written: u64,
    pub bytes_total: u64,
    /// Size of the newest snapshot written (payload), in bytes; 0 before the first.
    pub bytes_last: u64,
    /// Last log index the newest snapshot covers; 0 before the first.
    pub index_last: u64,
    /// Time to write, fsync and rename one snapshot file (not the time to build its bytes).
    pub write: HistogramReading,
}

impl SnapshotStats {
    pub(crate) fn new(dir: &Path) -> Arc<SnapshotStats> {
        let stats = Arc::new(SnapshotStats {
            dir: dir.to_path_buf(),
            written: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            bytes_last: AtomicU64::new(0),
            index_last: AtomicU64::new(0),
            write: LatencyBuckets::default(),
        });
        register(&SNAPSHOTS, dir, &stats);
        stats
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn on_write(&self, last_index: u64, bytes: u64, took: Duration) {
        self.written.fetch_add(1, Ordering::Relaxed);
        self.bytes_total.fetch_add(bytes, Ordering::Relaxed);
        self.bytes_last.store(bytes, Ordering::Relaxed);
        self.index_last.store(last_index, Ordering::Relaxed);
        self.write
            .observe_ns((took.as_nanos().min(u128::from(u64::MAX)) as u64).max(1));
    }

    pub fn snapshot(&self) -> SnapshotStatsSnapshot {
        SnapshotStatsSnapshot {
            written: self.written.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
            bytes_last: self.bytes_last.load(Ordering::Relaxed),
            index_last: self.index_last.load(Ordering::Relaxed),
            write: self.write.read(),
        }
    }
}

type Table<T> = Mutex<Vec<(PathBuf, Weak<T>)>>;

static JOURNALS: Table<JournalStats> = Mutex::new(Vec::new());
static SNAPSHOTS: Table<SnapshotStats> = Mutex::new(Vec::new());

fn register<T>(table: &Table<T>, dir: &Path, stats: &Arc<T>) {
    let Ok(mut t) = table.lock() else { return };
    t.retain(|(d, w)| w.strong_count() > 0 && d != dir);
    if t.len() < REGISTERED_MAX {
        t.push((dir.to_path_buf(), Arc::downgrade(stats)));
    }
}

fn find<T>(table: &Table<T>, dir: &Path) -> Option<Arc<T>> {
    let t = table.lock().ok()?;
    let canonical = std::fs::canonicalize(dir).ok();
    t.iter()
        .rev()
        .filter(|(d, _)| {
            d == dir || (canonical.is_some() && std::fs::canonicalize(d).ok() == canonical)
        })
        .find_map(|(_, w)| w.upgrade())
}

/// The stats of the journal open in this process on `dir`, if any.
pub fn journal_stats_for(dir: &Path) -> Option<Arc<JournalStats>> {
    find(&JOURNALS, dir)
}

/// The stats of the snapshot store open in this process on `dir`, if any.
pub fn snapshot_stats_for(dir: &Path) -> Option<Arc<SnapshotStats>> {
    find(&SNAPSHOTS, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_where_the_bounds_say() {
        let b = LatencyBuckets::default();
        b.observe_ns(1_000);
        b.observe_ns(1_001);
        b.observe_ns(20_000_000_000);
        let r = b.read();
        assert_eq!(r.buckets[0], 1, "<= 1 µs");
        assert_eq!(r.buckets[1], 1, "<= 2.5 µs");
        assert_eq!(r.buckets[FSYNC_BUCKETS_NS.len()], 1, "+Inf");
        assert_eq!(r.count, 3);
        assert_eq!(r.sum_ns, 20_000_002_001);
    }

    #[test]
    fn the_append_ring_keeps_the_newest_appends_in_order() {
        let dir = Path::new("/nonexistent/ring-test");
        let s = JournalStats::new(dir);
        for i in 0..(APPEND_RING_SLOTS as u64 + 10) {
            s.on_append(i * 2 + 1, i * 2 + 2, 2, 100);
        }
        let times = s.append_times();
        assert_eq!(times.len(), APPEND_RING_SLOTS);
        assert_eq!(times[0].0, 21);
        assert_eq!(
            times.last().unwrap().1,
            (APPEND_RING_SLOTS as u64 + 9) * 2 + 2
        );
        assert!(times.windows(2).all(|w| w[0].2 <= w[1].2));
        let newest = s.append_times_after(Some(times[times.len() - 3].1));
        assert_eq!(newest.len(), 2);
        assert_eq!(newest[1], times[times.len() - 1]);
        let snap = s.snapshot();
        assert_eq!(snap.records_appended, 2 * (APPEND_RING_SLOTS as u64 + 10));
        assert_eq!(snap.bytes_appended, 100 * (APPEND_RING_SLOTS as u64 + 10));
        assert!(Arc::ptr_eq(&journal_stats_for(dir).unwrap(), &s));
        drop(s);
        assert!(
            journal_stats_for(dir).is_none(),
            "a dropped journal's stats go away"
        );
    }

    #[test]
    fn a_real_journal_and_snapshot_store_count_what_they_write() {
        use crate::{Config, Entry, Journal, SnapshotMeta, SnapshotStore};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let (mut j, _) = Journal::open(&dir, Config::new(7, 1)).unwrap();
        let before = j.stats().snapshot();
        let entries: Vec<Entry> = (0..3)
            .map(|i| Entry {
                index: i,
                term: 1,
                payload: vec![i as u8; 10],
            })
            .collect();
        j.append(&entries).unwrap();
        let s = journal_stats_for(&dir)
            .expect("registered by directory")
            .snapshot();
        assert_eq!(s.records_appended, 3);
        assert_eq!(
            s.bytes_appended,
            3 * (crate::RECORD_HEADER_SIZE_BYTES + 10),
            "headers and payloads"
        );
        assert_eq!(s.appends, 1);
        assert!(
            s.fsync.count > before.fsync.count,
            "Fsync::Always fsyncs every append"
        );
        assert_eq!(s.fsync.buckets.iter().sum::<u64>(), s.fsync.count);
        let times = j.stats().append_times();
        assert_eq!((times[0].0, times[0].1), (0, 2));

        let sdir = tmp.path().join("snapshots");
        let (mut store, _) = SnapshotStore::open(&sdir, 7, 2).unwrap();
        store
            .write(
                SnapshotMeta {
                    cluster_id: 7,
                    last_index: 3,
                    last_term: 1,
                    state_hash: 0,
                    chain_hash: 0,
                },
                &[1u8; 1000],
            )
            .unwrap();
        let s = snapshot_stats_for(&sdir).unwrap().snapshot();
        assert_eq!((s.written, s.bytes_last, s.index_last), (1, 1000, 3));
        assert_eq!(s.write.count, 1);
    }
}
