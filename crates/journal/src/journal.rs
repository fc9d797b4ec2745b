//! The log: [`Journal`] appends entries to segment files, reads them back, truncates
//! conflicting suffixes, purges what a snapshot covers, and keeps raft's vote file.

use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::commit::{create_commit, encode as encode_commit, COMMIT_FILE_NAME};
use crate::error::{JournalError, Result};
use crate::format::{
    chain_hash, decode_frame, encode_record, frame_payload, genesis_hash, segment_file_name, Frame,
    Identity, SegmentHeader, PAYLOAD_SIZE_BYTES_LIMIT, RECORD_HEADER_SIZE_BYTES,
    SEGMENT_HEADER_SIZE_BYTES, SEGMENT_SIZE_BYTES_LIMIT, SEGMENT_SIZE_BYTES_MIN,
};
use crate::meta::{write_meta, ChainPoint, LogPosition, Meta, MetaRecord};
use crate::recovery::{analyze, ScannedSegment};
use crate::stats::JournalStats;
use crate::storage::{OpenMode, RealStorage, SegmentFile, Storage, SyncHandle};

/// The most entries one `append` call may carry.
pub const ENTRIES_PER_APPEND_LIMIT: u32 = 1 << 20;
/// The largest latency the fsync histogram tracks (an hour); longer ones are clamped.
pub const LATENCY_NS_MAX: u64 = 3_600_000_000_000;
/// The longest a `Batch` fsync interval may be: longer would make "batch" mean "never".
pub const FSYNC_INTERVAL_MS_LIMIT: u32 = 10_000;
/// How often, at most, the commit point file is fsynced (it is written in place on every
/// advance and fsynced piggyback on the log's own fsyncs, no more often than this: a lost
/// write only makes recovery's check weaker, see `commit`).
pub const COMMIT_SYNC_INTERVAL_MS: u64 = 1_000;

/// When appended data is made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// `append` returns Ok only after the data is fdatasync'ed: an appended entry survives
    /// power loss.
    Always,
    /// Group commit. Without a flusher, `append` fsyncs when `interval_ms` passed since the
    /// last fsync or `bytes_max` bytes are waiting, whichever comes first; `flush` forces it.
    /// With one (`set_batch_flusher`), the flusher drives the fsyncs through `prepare_sync`,
    /// outside the lock, as soon as someone waits; `append` fsyncs only past `bytes_max`. A
    /// crash can lose what no fsync covered yet, which nobody was told was durable.
    Batch { interval_ms: u32, bytes_max: u64 },
    /// `append` never fsyncs; the operating system writes back when it likes. `flush` still
    /// fsyncs, because the caller asked for it by name.
    Never,
}

/// How a journal is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub cluster_id: u128,
    pub node_id: u64,
    pub fsync: Fsync,
    /// A segment is sealed and a new one started before it would grow past this size.
    pub segment_size_bytes_max: u64,
    pub payload_size_bytes_max: u32,
    pub entries_per_append_max: u32,
}

impl Config {
    /// A configuration with the defaults: fsync always, 64 MiB segments, 1 MiB payloads.
    pub fn new(cluster_id: u128, node_id: u64) -> Config {
        Config {
            cluster_id,
            node_id,
            fsync: Fsync::Always,
            segment_size_bytes_max: 64 * 1024 * 1024,
            payload_size_bytes_max: 1024 * 1024,
            entries_per_append_max: 64 * 1024,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let fail = |m: String| Err(JournalError::Config(m));
        if !(SEGMENT_SIZE_BYTES_MIN..=SEGMENT_SIZE_BYTES_LIMIT)
            .contains(&self.segment_size_bytes_max)
        {
            return fail(format!(
                "segment_size_bytes_max {} is outside {SEGMENT_SIZE_BYTES_MIN}..={SEGMENT_SIZE_BYTES_LIMIT}",
                self.segment_size_bytes_max
            ));
        }
        if self.payload_size_bytes_max > PAYLOAD_SIZE_BYTES_LIMIT {
            return fail(format!(
                "payload_size_bytes_max {} exceeds the limit {PAYLOAD_SIZE_BYTES_LIMIT}",
                self.payload_size_bytes_max
            ));
        }
        let record_size_bytes_max =
            RECORD_HEADER_SIZE_BYTES + u64::from(self.payload_size_bytes_max);
        if SEGMENT_HEADER_SIZE_BYTES + record_size_bytes_max > self.segment_size_bytes_max {
            return fail(format!(
                "a record of payload_size_bytes_max {} does not fit a segment of {} bytes",
                self.payload_size_bytes_max, self.segment_size_bytes_max
            ));
        }
        if self.entries_per_append_max == 0
            || self.entries_per_append_max > ENTRIES_PER_APPEND_LIMIT
        {
            return fail(format!(
                "entries_per_append_max {} is outside 1..={ENTRIES_PER_APPEND_LIMIT}",
                self.entries_per_append_max
            ));
        }
        if let Fsync::Batch {
            interval_ms,
            bytes_max,
        } = self.fsync
        {
            if interval_ms > FSYNC_INTERVAL_MS_LIMIT || bytes_max == 0 {
                return fail(format!(
                    "Fsync::Batch needs interval_ms <= {FSYNC_INTERVAL_MS_LIMIT} and bytes_max > 0"
                ));
            }
        }
        Ok(())
    }

    fn identity(&self) -> Identity {
        Identity {
            cluster_id: self.cluster_id,
            node_id: self.node_id,
        }
    }
}

/// One log entry: a raft log id and an opaque payload (a batch of commands).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    pub term: u64,
    pub payload: Vec<u8>,
}

/// A torn write recovery cut away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    pub file: PathBuf,
    pub offset: u64,
    pub bytes_dropped: u64,
    pub reason: String,
}

/// What `open` found and repaired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// True if the directory held no journal and a new one was created.
    pub created: bool,
    pub segments: usize,
    pub records: u64,
    pub first_index: Option<u64>,
    pub last: Option<LogPosition>,
    pub torn_tail: Option<TornTail>,
    pub removed_temp_files: Vec<PathBuf>,
    /// Segments wholly below the purge point, left by an interrupted purge or reset.
    pub removed_stale_segments: Vec<PathBuf>,
    /// Files in the directory that are not the journal's; they are left alone.
    pub foreign_files: Vec<PathBuf>,
    /// Set when the recorded commit point is beyond the log's end and the fsync mode allowed
    /// that loss (`Never`: written counts as appended, so a machine crash can take committed
    /// entries with it); under `Always` and `Batch` the commit point is only ever recorded
    /// once durable, so this is an error instead.
    pub committed_lost: Option<String>,
}

/// A segment file as the journal holds it open.
#[derive(Debug)]
struct Segment {
    path: PathBuf,
    base_index: u64,
    prev_term: u64,
    prev_hash: u64,
    file: Box<dyn SegmentFile>,
    /// Byte offset of each record, by `index - base_index`.
    offsets: Vec<u32>,
    len_bytes: u64,
    /// The group commit's handle on this file and its path for errors, taken at the first
    /// [`Journal::prepare_sync`] and kept: a new descriptor per fsync cost two system calls
    /// (dup and close) on every consensus round of every replica.
    sync: Option<SegmentSync>,
}

/// A segment's fsync handle, shared with the [`PreparedSync`]s in flight.
#[derive(Clone, Debug)]
struct SegmentSync {
    path: Arc<Path>,
    handle: Arc<dyn SyncHandle>,
}

impl Segment {
    /// The segment's cached fsync handle, taken from its file the first time; None when the
    /// file cannot hand one out (the journal then fsyncs in place).
    fn sync_handle(&mut self) -> Option<SegmentSync> {
        if self.sync.is_none() {
            let handle = self.file.sync_handle().ok()??;
            self.sync = Some(SegmentSync {
                path: Arc::from(self.path.as_path()),
                handle: Arc::from(handle),
            });
        }
        self.sync.clone()
    }

    fn next_index(&self) -> u64 {
        self.base_index + self.offsets.len() as u64
    }

    fn record_range(&self, index: u64) -> (u64, u64) {
        let i = (index - self.base_index) as usize;
        let start = u64::from(self.offsets[i]);
        let end = self
            .offsets
            .get(i + 1)
            .map_or(self.len_bytes, |&o| u64::from(o));
        (start, end)
    }
}

/// Enough of the journal's state to undo an append that failed half way.
struct Rollback {
    segments: usize,
    offsets: usize,
    len_bytes: u64,
    next_index: u64,
    tip_term: u64,
    tip_hash: u64,
}

/// An append-only, hash-chained, CRC-framed log in a directory of segment files.
///
/// Invariants: segments are contiguous (each starts where its predecessor ends and links to
/// its last chain hash); only the last segment is written; `next_index`, `tip_term` and
/// `tip_hash` describe the last record (or the chain point before the first segment).
#[derive(Debug)]
pub struct Journal {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    config: Config,
    segments: Vec<Segment>,
    next_index: u64,
    tip_term: u64,
    tip_hash: u64,
    meta: MetaRecord,
    poisoned: Option<String>,
    /// Index of the first segment holding data not yet fsynced, if any.
    unsynced_segment: Option<usize>,
    unsynced_bytes: u64,
    last_sync: Instant,
    durable_next_index: u64,
    encode_buffer: Vec<u8>,
    fsync_latency_ns: Histogram<u64>,
    /// Counters for monitoring, shared with whoever asked for them.
    stats: Arc<JournalStats>,
    /// The commit point file, once it exists (see `commit`).
    commit_file: Option<Box<dyn SegmentFile>>,
    /// The newest commit point written to it (or found there on open).
    commit: Option<LogPosition>,
    /// A newer commit point not yet durable in the segments, written once an fsync covers it.
    commit_pending: Option<LogPosition>,
    /// The commit point file holds a write not yet fsynced.
    commit_unsynced: bool,
    commit_synced_at: Instant,
    /// Under `Fsync::Batch`, a flusher drives the fsyncs through `prepare_sync` (see
    /// `set_batch_flusher`), so `append` does not fsync on the interval itself.
    batch_flusher: bool,
    /// Bumped whenever entries are dropped (truncate, reset, a rolled-back append): a sync
    /// prepared before then no longer describes the log and must not advance the durable point.
    sync_epoch: u64,
    /// Bumped by every write to a segment, so a finished sync knows whether more came since.
    write_seq: u64,
    /// Bumped by every fsync made under `&mut self` (`sync`), for the same reason.
    sync_seq: u64,
}

/// An fsync prepared by [`Journal::prepare_sync`] under the journal's lock and run with
/// [`PreparedSync::run`] outside it, while appends go on; [`Journal::finish_sync`] then marks
/// durable what it covered: the entries below the `next_index` captured when it was prepared.
#[derive(Debug)]
pub struct PreparedSync {
    files: Vec<SegmentSync>,
    target_next_index: u64,
    bytes: u64,
    epoch: u64,
    write_seq: u64,
    sync_seq: u64,
    stats: Arc<JournalStats>,
}

/// What [`PreparedSync::run`] did, for [`Journal::finish_sync`].
#[derive(Debug)]
pub struct SyncOutcome {
    prepared: PreparedSync,
    result: Result<Vec<u64>>,
}

impl PreparedSync {
    /// The `next_index` this sync covers when it succeeds (entries below it become durable).
    pub fn target_next_index(&self) -> u64 {
        self.target_next_index
    }

    /// fdatasyncs every segment that held unsynced data when the sync was prepared. Takes no
    /// lock; a failure is reported by `finish_sync`, which poisons the journal (fail-stop).
    pub fn run(self) -> SyncOutcome {
        let mut latencies_ns = Vec::with_capacity(self.files.len());
        let mut result = Ok(());
        for SegmentSync { path, handle } in &self.files {
            let start = Instant::now();
            if let Err(error) = handle.sync_data() {
                result = Err(JournalError::io("fsync", path, error));
                break;
            }
            let took = start.elapsed();
            latencies_ns.push((took.as_nanos().min(u128::from(u64::MAX)) as u64).max(1));
            self.stats.on_fsync(took);
        }
        SyncOutcome {
            result: result.map(|()| latencies_ns),
            prepared: self,
        }
    }
}

impl Journal {
    /// Opens (or creates) the journal in `dir` on the real file system.
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<(Journal, RecoveryReport)> {
        Journal::open_with_storage(Arc::new(RealStorage), dir, config)
    }

    /// Opens (or creates) the journal in `dir` through `storage`.
    ///
    /// Recovery reads and checks every segment. A torn record at the very end of the last
    /// segment is cut away and reported; any other damage fails the open with an error naming
    /// the file and byte offset.
    pub fn open_with_storage(
        storage: Arc<dyn Storage>,
        dir: impl AsRef<Path>,
        config: Config,
    ) -> Result<(Journal, RecoveryReport)> {
        config.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let identity = config.identity();
        storage
            .create_dir_all(&dir)
            .map_err(|error| JournalError::io("create directory", &dir, error))?;
        let mut analysis = analyze(&storage, &dir, Some(identity))?;
        let mut report = RecoveryReport::default();
        match analysis.problem.take() {
            None => {}
            Some(JournalError::CommittedMissing {
                committed,
                last,
                file,
                ..
            }) if config.fsync == Fsync::Never => {
                report.committed_lost = Some(format!(
                    "{} records index {committed} as committed but the log ends at {last}; \
                     with fsync Never the tail was never made durable",
                    file.display()
                ));
            }
            Some(problem) => return Err(problem),
        }
        report.foreign_files = analysis.listing.foreign_files.clone();

        // Repairs, each one safe to repeat if we crash in the middle of it.
        for temp in &analysis.listing.temp_files {
            storage
                .remove_file(temp)
                .map_err(|error| JournalError::io("remove", temp, error))?;
            report.removed_temp_files.push(temp.clone());
        }
        for stale in &analysis.stale_segments {
            storage
                .remove_file(stale)
                .map_err(|error| JournalError::io("remove", stale, error))?;
            report.removed_stale_segments.push(stale.clone());
        }
        if let Some((path, len_bytes)) = &analysis.torn_last_segment {
            storage
                .remove_file(path)
                .map_err(|error| JournalError::io("remove", path, error))?;
            report.torn_tail = Some(TornTail {
                file: path.clone(),
                offset: 0,
                bytes_dropped: *len_bytes,
                reason: "segment file without a header (interrupted creation)".to_string(),
            });
        }
        let mut segments = Vec::with_capacity(analysis.segments.len());
        for scanned in &analysis.segments {
            let mut file = storage
                .open_file(&scanned.path, OpenMode::ReadWrite)
                .map_err(|error| JournalError::io("open", &scanned.path, error))?;
            if let Some((offset, reason)) = &scanned.torn_tail {
                assert_eq!(*offset, scanned.valid_len_bytes);
                file.set_len(scanned.valid_len_bytes)
                    .map_err(|error| JournalError::io("truncate", &scanned.path, error))?;
                file.sync_data()
                    .map_err(|error| JournalError::io("fsync", &scanned.path, error))?;
                assert!(report.torn_tail.is_none(), "one torn tail at most");
                report.torn_tail = Some(TornTail {
                    file: scanned.path.clone(),
                    offset: *offset,
                    bytes_dropped: scanned.file_len_bytes - scanned.valid_len_bytes,
                    reason: reason.clone(),
                });
            }
            if config.fsync != Fsync::Never {
                // A previous process may have died with this data still in the page cache;
                // it is reported durable from now on, so make it so.
                file.sync_data()
                    .map_err(|error| JournalError::io("fsync", &scanned.path, error))?;
            }
            segments.push(open_segment(scanned, file)?);
        }
        let dir_changed = !report.removed_temp_files.is_empty()
            || !report.removed_stale_segments.is_empty()
            || analysis.torn_last_segment.is_some();

        let mut journal = Journal {
            storage: storage.clone(),
            dir: dir.clone(),
            config,
            segments,
            next_index: 0,
            tip_term: 0,
            tip_hash: genesis_hash(config.cluster_id),
            meta: analysis.meta.unwrap_or_default(),
            poisoned: None,
            unsynced_segment: None,
            unsynced_bytes: 0,
            last_sync: Instant::now(),
            durable_next_index: 0,
            encode_buffer: Vec::new(),
            fsync_latency_ns: Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3)
                .map_err(|e| JournalError::Config(e.to_string()))?,
            stats: JournalStats::new(&dir),
            commit_file: None,
            commit: analysis.commit,
            commit_pending: None,
            commit_unsynced: false,
            commit_synced_at: Instant::now(),
            batch_flusher: false,
            sync_epoch: 0,
            write_seq: 0,
            sync_seq: 0,
        };
        if analysis.listing.has_commit {
            let path = dir.join(COMMIT_FILE_NAME);
            journal.commit_file = Some(
                storage
                    .open_file(&path, OpenMode::ReadWrite)
                    .map_err(|error| JournalError::io("open", &path, error))?,
            );
        }
        if analysis.meta.is_none() {
            report.created = true;
            journal.write_meta_record(MetaRecord::default())?;
        }
        if let Some(scanned) = analysis.segments.last() {
            let tip = scanned.tip();
            journal.next_index = scanned.next_index();
            journal.tip_term = tip.term;
            journal.tip_hash = tip.hash;
        } else {
            // No segments: start one at the purge point, or at genesis.
            if let Some(purged) = journal.meta.purged {
                journal.next_index = purged.index + 1;
                journal.tip_term = purged.term;
                journal.tip_hash = purged.hash;
            }
            journal.create_segment()?;
        }
        if dir_changed {
            storage
                .sync_dir(&dir)
                .map_err(|error| JournalError::io("fsync directory", &dir, error))?;
        }
        journal.durable_next_index = journal.next_index;
        if report.committed_lost.is_some() {
            // The entries past the log's end are gone from this node: it no longer vouches
            // for them (the next commit advance rewrites the file).
            let last = journal.last_position();
            journal.commit = journal.commit.min(last);
            journal.meta.meta.committed = journal.meta.meta.committed.min(last);
        }
        journal.assert_invariants();
        report.segments = journal.segments.len();
        report.first_index = journal.first_index();
        report.last = journal.last_position();
        report.records = match (report.first_index, report.last) {
            (Some(first), Some(last)) => last.index + 1 - first,
            _ => 0,
        };
        Ok((journal, report))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The reason the journal stopped accepting writes, if it did.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// The index the next appended entry must carry.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Bytes of memory the journal keeps per record: each segment's offset table (4 bytes a
    /// record, counted by capacity). It follows the segments on disk, not the records ever
    /// appended: a purge that deletes a segment frees its table (docs/results/memory.md).
    pub fn record_offsets_bytes(&self) -> usize {
        self.segments
            .iter()
            .map(|s| s.offsets.capacity() * std::mem::size_of::<u32>())
            .sum()
    }

    /// The first entry still readable, if the log holds any.
    pub fn first_index(&self) -> Option<u64> {
        let first = self.logical_first_index();
        (first < self.next_index).then_some(first)
    }

    /// The last entry's log id, or the purge point if every entry was purged (what openraft's
    /// `LogState::last_log_id` wants), or None for an empty new log.
    pub fn last_position(&self) -> Option<LogPosition> {
        let index = self.next_index.checked_sub(1)?;
        Some(LogPosition {
            index,
            term: self.tip_term,
        })
    }

    pub fn last_index(&self) -> Option<u64> {
        self.last_position().map(|p| p.index)
    }

    pub fn last_term(&self) -> Option<u64> {
        self.last_position().map(|p| p.term)
    }

    /// The chain hash of the last entry (or of the chain point before the log).
    pub fn last_hash(&self) -> u64 {
        self.tip_hash
    }

    /// The last purged entry's log id (openraft's `LogState::last_purged_log_id`).
    pub fn last_purged(&self) -> Option<LogPosition> {
        self.meta.purged.map(|p| p.position())
    }

    /// Entries below this index are known durable.
    pub fn durable_next_index(&self) -> u64 {
        self.durable_next_index
    }

    /// The raft hard state last saved.
    pub fn meta(&self) -> Meta {
        self.meta.meta
    }

    /// The newest commit point recorded (by [`Journal::save_committed`] or in the vote file):
    /// every entry up to it is committed and was durable in this log when it was recorded.
    pub fn committed(&self) -> Option<LogPosition> {
        let from_meta = self.meta.meta.committed;
        match (from_meta, self.commit) {
            (Some(a), Some(b)) => Some(if b.index >= a.index { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Records that every entry up to `position` is committed (raft's `save_committed`).
    ///
    /// Recovery refuses a log that ends before the recorded point, so the point must never
    /// run ahead of what is durable here: a position past the durable prefix (under
    /// `Fsync::Batch`, before the flusher's fsync) is held back and written by the fsync that
    /// covers it. The write is in place and cheap (one positional write; the file is fsynced
    /// piggyback on the log's fsyncs at most every `COMMIT_SYNC_INTERVAL_MS`). A point at or
    /// below the recorded one is ignored: the commit point never goes back.
    pub fn save_committed(&mut self, position: LogPosition) -> Result<()> {
        self.check_writable()?;
        if self.committed().is_some_and(|c| c.index >= position.index) {
            return Ok(());
        }
        let durable_next = match self.config.fsync {
            // Under Never, written counts as appended; nothing is more durable than that.
            Fsync::Never => self.next_index,
            Fsync::Always | Fsync::Batch { .. } => self.durable_next_index,
        };
        if position.index >= durable_next {
            self.commit_pending = Some(position);
            return Ok(());
        }
        self.write_commit(position)
            .map_err(|error| self.poison(error))
    }

    fn write_commit(&mut self, position: LogPosition) -> Result<()> {
        let identity = self.config.identity();
        match &mut self.commit_file {
            Some(file) => {
                let path = self.dir.join(COMMIT_FILE_NAME);
                file.write_all_at(&encode_commit(identity, position), 0)
                    .map_err(|error| JournalError::io("write", &path, error))?;
                self.commit_unsynced = true;
            }
            None => {
                let durable = self.config.fsync != Fsync::Never;
                self.commit_file = Some(create_commit(
                    self.storage.as_ref(),
                    &self.dir,
                    identity,
                    position,
                    durable,
                )?);
                self.commit_synced_at = Instant::now();
            }
        }
        self.commit = Some(position);
        if self
            .commit_pending
            .is_some_and(|p| p.index <= position.index)
        {
            self.commit_pending = None;
        }
        Ok(())
    }

    /// After an fsync of the segments: writes a held-back commit point it covers, and fsyncs
    /// the commit point file if it has waited long enough.
    fn after_sync(&mut self) -> Result<()> {
        if let Some(pending) = self.commit_pending {
            if pending.index < self.durable_next_index {
                self.write_commit(pending)?;
            }
        }
        if self.commit_unsynced
            && self.commit_synced_at.elapsed() >= Duration::from_millis(COMMIT_SYNC_INTERVAL_MS)
        {
            if let Some(file) = &mut self.commit_file {
                let path = self.dir.join(COMMIT_FILE_NAME);
                file.sync_data()
                    .map_err(|error| JournalError::io("fsync", &path, error))?;
            }
            self.commit_unsynced = false;
            self.commit_synced_at = Instant::now();
        }
        Ok(())
    }

    /// fsync latencies of this journal's appends, in nanoseconds.
    pub fn fsync_latency_ns(&self) -> &Histogram<u64> {
        &self.fsync_latency_ns
    }

    /// Counters for monitoring (bytes and records appended, fsyncs and their latency, when
    /// recent appends completed); cheap to read from any thread.
    pub fn stats(&self) -> Arc<JournalStats> {
        self.stats.clone()
    }

    fn logical_first_index(&self) -> u64 {
        let physical = self
            .segments
            .first()
            .map_or(self.next_index, |s| s.base_index);
        match self.meta.purged {
            Some(purged) => physical.max(purged.index + 1),
            None => physical,
        }
    }

    fn range_text(&self) -> String {
        match self.first_index() {
            Some(first) => format!("{first}..={}", self.next_index - 1),
            None => format!("(empty, next index {})", self.next_index),
        }
    }

    fn check_writable(&self) -> Result<()> {
        match &self.poisoned {
            Some(cause) => Err(JournalError::Poisoned {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Records a write-path failure: from now on every write is refused.
    fn poison(&mut self, error: JournalError) -> JournalError {
        if self.poisoned.is_none() {
            self.poisoned = Some(error.to_string());
        }
        error
    }

    /// Appends entries. Their indexes must continue the log without a gap and their terms
    /// must not decrease. Under `Fsync::Always` they are durable when this returns Ok.
    pub fn append(&mut self, entries: &[Entry]) -> Result<()> {
        self.check_writable()?;
        if entries.is_empty() {
            return Ok(());
        }
        if entries.len() > self.config.entries_per_append_max as usize {
            return Err(JournalError::Invalid(format!(
                "{} entries in one append, the limit is {}",
                entries.len(),
                self.config.entries_per_append_max
            )));
        }
        let mut term = self.tip_term;
        for (i, entry) in entries.iter().enumerate() {
            let expected = self.next_index + i as u64;
            if entry.index != expected {
                return Err(JournalError::Invalid(format!(
                    "entry index {} does not continue the log, expected {expected}",
                    entry.index
                )));
            }
            if entry.term < term {
                return Err(JournalError::Invalid(format!(
                    "entry {} has term {} below the previous entry's term {term}",
                    entry.index, entry.term
                )));
            }
            if entry.payload.len() > self.config.payload_size_bytes_max as usize {
                return Err(JournalError::Invalid(format!(
                    "entry {} payload is {} bytes, the limit is {}",
                    entry.index,
                    entry.payload.len(),
                    self.config.payload_size_bytes_max
                )));
            }
            term = entry.term;
        }

        let rollback = self.rollback_point();
        match self.append_checked(entries) {
            Ok(()) => {
                self.assert_invariants();
                let bytes = entries
                    .iter()
                    .map(|e| RECORD_HEADER_SIZE_BYTES + e.payload.len() as u64)
                    .sum();
                self.stats.on_append(
                    entries[0].index,
                    entries[entries.len() - 1].index,
                    entries.len() as u64,
                    bytes,
                );
                Ok(())
            }
            Err(error) => {
                self.roll_back(rollback);
                Err(self.poison(error))
            }
        }
    }

    fn rollback_point(&self) -> Rollback {
        let last = self.segments.last();
        Rollback {
            segments: self.segments.len(),
            offsets: last.map_or(0, |s| s.offsets.len()),
            len_bytes: last.map_or(0, |s| s.len_bytes),
            next_index: self.next_index,
            tip_term: self.tip_term,
            tip_hash: self.tip_hash,
        }
    }

    fn roll_back(&mut self, rollback: Rollback) {
        // The files may hold some of the failed bytes; recovery on the next open decides what
        // of them is valid. In memory we forget them so no reader sees an unacknowledged entry.
        self.segments.truncate(rollback.segments);
        if let Some(last) = self.segments.last_mut() {
            last.offsets.truncate(rollback.offsets);
            last.len_bytes = rollback.len_bytes;
        }
        self.next_index = rollback.next_index;
        self.tip_term = rollback.tip_term;
        self.tip_hash = rollback.tip_hash;
        self.sync_epoch += 1;
        self.durable_next_index = self.durable_next_index.min(self.next_index);
        let last = self.segments.len().saturating_sub(1);
        self.unsynced_segment = self.unsynced_segment.map(|s| s.min(last));
    }

    fn append_checked(&mut self, entries: &[Entry]) -> Result<()> {
        let mut buffer = std::mem::take(&mut self.encode_buffer);
        buffer.clear();
        let mut pending_offsets: Vec<u32> = Vec::with_capacity(entries.len());
        let mut result = Ok(());
        for entry in entries {
            let record_size = RECORD_HEADER_SIZE_BYTES + entry.payload.len() as u64;
            let segment = self.segments.last().expect("journal always has a segment");
            let segment_len = segment.len_bytes + buffer.len() as u64;
            let has_records = !segment.offsets.is_empty() || !pending_offsets.is_empty();
            if has_records && segment_len + record_size > self.config.segment_size_bytes_max {
                if let Err(error) = self.write_pending(&mut buffer, &mut pending_offsets) {
                    result = Err(error);
                    break;
                }
                if let Err(error) = self.roll_over() {
                    result = Err(error);
                    break;
                }
            }
            let segment = self.segments.last().expect("journal always has a segment");
            let offset = segment.len_bytes + buffer.len() as u64;
            assert!(offset + record_size <= SEGMENT_SIZE_BYTES_LIMIT);
            let hash = chain_hash(self.tip_hash, entry.index, entry.term, &entry.payload);
            encode_record(&mut buffer, entry.index, entry.term, hash, &entry.payload);
            pending_offsets.push(offset as u32);
            self.tip_hash = hash;
            self.tip_term = entry.term;
        }
        if result.is_ok() {
            result = self.write_pending(&mut buffer, &mut pending_offsets);
        }
        self.encode_buffer = buffer;
        result?;
        debug_assert_eq!(self.next_index, entries[entries.len() - 1].index + 1);
        match self.config.fsync {
            Fsync::Always => self.sync(),
            Fsync::Batch {
                interval_ms,
                bytes_max,
            } => {
                // With a flusher, the interval is its business: it fsyncs as soon as a
                // caller waits and none is running, so an append here must not block
                // every other append behind an fsync. bytes_max still bounds what may wait.
                let interval_due = !self.batch_flusher
                    && self.last_sync.elapsed() >= Duration::from_millis(u64::from(interval_ms));
                if self.unsynced_bytes >= bytes_max || interval_due {
                    self.sync()
                } else {
                    Ok(())
                }
            }
            Fsync::Never => Ok(()),
        }
    }

    /// Writes the encoded records to the last segment with one write call.
    fn write_pending(&mut self, buffer: &mut Vec<u8>, offsets: &mut Vec<u32>) -> Result<()> {
        if buffer.is_empty() {
            return Ok(());
        }
        let segment_index = self.segments.len() - 1;
        let segment = &mut self.segments[segment_index];
        segment
            .file
            .write_all_at(buffer, segment.len_bytes)
            .map_err(|error| JournalError::io("write", &segment.path, error))?;
        segment.len_bytes += buffer.len() as u64;
        segment.offsets.extend_from_slice(offsets);
        self.next_index += offsets.len() as u64;
        self.unsynced_bytes += buffer.len() as u64;
        self.unsynced_segment.get_or_insert(segment_index);
        self.write_seq += 1;
        buffer.clear();
        offsets.clear();
        Ok(())
    }

    /// fsyncs every segment holding unsynced data.
    fn sync(&mut self) -> Result<()> {
        if let Some(first) = self.unsynced_segment {
            for segment in &mut self.segments[first..] {
                let start = Instant::now();
                segment
                    .file
                    .sync_data()
                    .map_err(|error| JournalError::io("fsync", &segment.path, error))?;
                let took = start.elapsed();
                let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
                self.fsync_latency_ns.saturating_record(ns.max(1));
                self.stats.on_fsync(took);
            }
        }
        self.unsynced_segment = None;
        self.unsynced_bytes = 0;
        self.last_sync = Instant::now();
        self.durable_next_index = self.next_index;
        self.sync_seq += 1;
        self.after_sync()
    }

    /// Says that a flusher drives this journal's fsyncs under `Fsync::Batch` through
    /// [`Journal::prepare_sync`]: `append` then fsyncs only when `bytes_max` bytes wait, never
    /// because the interval passed (the flusher bounds the wait instead).
    pub fn set_batch_flusher(&mut self, on: bool) {
        self.batch_flusher = on;
    }

    /// Group commit, step one (under the lock appends take): captures what is written but not
    /// yet durable and returns a [`PreparedSync`] to run outside the lock, or None if there is
    /// nothing to sync. A segment file that cannot hand out a [`SyncHandle`] is fsynced here,
    /// in place, instead (and None is returned).
    pub fn prepare_sync(&mut self) -> Result<Option<PreparedSync>> {
        self.check_writable()?;
        let Some(first) = self.unsynced_segment else {
            return Ok(None);
        };
        let mut files = Vec::with_capacity(self.segments.len() - first);
        for segment in &mut self.segments[first..] {
            match segment.sync_handle() {
                Some(sync) => files.push(sync),
                // No separate handle (or no descriptor to spare): fsync in place instead.
                None => {
                    self.sync().map_err(|error| self.poison(error))?;
                    return Ok(None);
                }
            }
        }
        Ok(Some(PreparedSync {
            files,
            target_next_index: self.next_index,
            bytes: self.unsynced_bytes,
            epoch: self.sync_epoch,
            write_seq: self.write_seq,
            sync_seq: self.sync_seq,
            stats: self.stats.clone(),
        }))
    }

    /// Group commit, step three (under the lock again): on success, entries below the
    /// prepared `next_index` are durable (unless the log was cut since, in which case nothing
    /// is claimed and a later sync covers what remains); on failure the journal is poisoned
    /// (fail-stop) and the error returned.
    pub fn finish_sync(&mut self, outcome: SyncOutcome) -> Result<()> {
        let SyncOutcome { prepared, result } = outcome;
        let latencies_ns = match result {
            Ok(latencies_ns) => latencies_ns,
            Err(error) => return Err(self.poison(error)),
        };
        for ns in latencies_ns {
            self.fsync_latency_ns.saturating_record(ns);
        }
        self.check_writable()?;
        if prepared.epoch != self.sync_epoch {
            return Ok(());
        }
        self.last_sync = Instant::now();
        let covered = prepared.target_next_index.min(self.next_index);
        self.durable_next_index = self.durable_next_index.max(covered);
        if prepared.sync_seq == self.sync_seq {
            // No in-place sync reset the bookkeeping meanwhile: what this sync covered is
            // no longer waiting; writes made since (all in the last segment, as a rollover
            // syncs in place) still are.
            self.unsynced_bytes = self.unsynced_bytes.saturating_sub(prepared.bytes);
            self.unsynced_segment = if prepared.write_seq == self.write_seq {
                None
            } else {
                Some(self.segments.len() - 1)
            };
        }
        self.after_sync().map_err(|error| self.poison(error))
    }

    /// Makes everything appended so far durable, in every fsync mode.
    pub fn flush(&mut self) -> Result<()> {
        self.check_writable()?;
        self.sync().map_err(|error| self.poison(error))
    }

    /// Seals the last segment and starts a new one at `next_index`.
    fn roll_over(&mut self) -> Result<()> {
        if self.config.fsync != Fsync::Never {
            // A sealed segment must be durable before its successor exists, or a crash could
            // leave a hole in the middle of the log that recovery must call corruption.
            self.sync()?;
        }
        self.create_segment()
    }

    /// Creates a segment starting at `next_index` atomically: header into a temporary file,
    /// fsync, rename into place, fsync the directory. A crash leaves either no segment or a
    /// complete header, never a half-written one.
    fn create_segment(&mut self) -> Result<()> {
        let name = segment_file_name(self.next_index);
        let path = self.dir.join(&name);
        let temp = self.dir.join(format!("{name}.tmp"));
        let header = SegmentHeader {
            identity: self.config.identity(),
            base_index: self.next_index,
            prev_term: self.tip_term,
            prev_hash: self.tip_hash,
        };
        let durable = self.config.fsync != Fsync::Never;
        let storage = self.storage.clone();
        match storage.remove_file(&temp) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(JournalError::io("remove", &temp, error)),
        }
        let mut file = storage
            .open_file(&temp, OpenMode::CreateNew)
            .map_err(|error| JournalError::io("create", &temp, error))?;
        file.write_all_at(&header.encode(), 0)
            .map_err(|error| JournalError::io("write", &temp, error))?;
        if durable {
            file.sync_data()
                .map_err(|error| JournalError::io("fsync", &temp, error))?;
        }
        storage
            .rename(&temp, &path)
            .map_err(|error| JournalError::io("rename", &temp, error))?;
        if durable {
            storage
                .sync_dir(&self.dir)
                .map_err(|error| JournalError::io("fsync directory", &self.dir, error))?;
        }
        self.segments.push(Segment {
            path,
            base_index: header.base_index,
            prev_term: header.prev_term,
            prev_hash: header.prev_hash,
            file,
            offsets: Vec::new(),
            len_bytes: SEGMENT_HEADER_SIZE_BYTES,
            sync: None,
        });
        Ok(())
    }

    fn segment_of(&self, index: u64) -> Option<usize> {
        if index < self.logical_first_index() || index >= self.next_index {
            return None;
        }
        let position = self.segments.partition_point(|s| s.base_index <= index);
        let candidate = position.checked_sub(1)?;
        (index < self.segments[candidate].next_index()).then_some(candidate)
    }

    /// Reads one record from disk and checks it again: bit rot after open is still caught.
    fn read_frame(&self, index: u64) -> Result<(Frame, Vec<u8>)> {
        let Some(s) = self.segment_of(index) else {
            return Err(JournalError::OutOfRange {
                index,
                range: self.range_text(),
            });
        };
        let segment = &self.segments[s];
        let (start, end) = segment.record_range(index);
        let mut buf = vec![0u8; (end - start) as usize];
        segment
            .file
            .read_exact_at(&mut buf, start)
            .map_err(|error| JournalError::io("read", &segment.path, error))?;
        let frame = check_record(segment, index, start, &buf)?;
        Ok((frame, buf))
    }

    fn read_record(&self, index: u64) -> Result<Entry> {
        let (frame, buf) = self.read_frame(index)?;
        Ok(Entry {
            index,
            term: frame.term,
            payload: frame_payload(&buf, 0, &frame).to_vec(),
        })
    }

    /// The chain point of entry `index`; the point before the log if `index` is just below it.
    fn chain_point(&self, index: u64) -> Result<ChainPoint> {
        if index.checked_add(1) == Some(self.next_index) {
            return Ok(ChainPoint {
                index,
                term: self.tip_term,
                hash: self.tip_hash,
            });
        }
        if let Some(purged) = self.meta.purged {
            if purged.index == index {
                return Ok(purged);
            }
        }
        if let Some(segment) = self
            .segments
            .iter()
            .find(|s| Some(s.base_index) == index.checked_add(1))
        {
            return Ok(ChainPoint {
                index,
                term: segment.prev_term,
                hash: segment.prev_hash,
            });
        }
        let (frame, _) = self.read_frame(index)?;
        Ok(ChainPoint {
            index,
            term: frame.term,
            hash: frame.hash,
        })
    }

    /// The chain hash after entry `index` (for a snapshot to record, so a follower that
    /// installs it can continue the same chain).
    pub fn hash_at(&self, index: u64) -> Result<u64> {
        self.chain_point(index).map(|p| p.hash)
    }

    pub fn term_at(&self, index: u64) -> Result<u64> {
        self.chain_point(index).map(|p| p.term)
    }

    pub fn entry(&self, index: u64) -> Result<Entry> {
        self.read_record(index)
    }

    /// Reads the entries in `range`, which must lie inside the log.
    pub fn read(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>> {
        self.entries(range)?.collect()
    }

    /// Iterates over the entries in `range`, reading each from disk as it goes.
    pub fn entries(&self, range: impl RangeBounds<u64>) -> Result<Entries<'_>> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => self.logical_first_index(),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.next_index,
        };
        if start < end && (start < self.logical_first_index() || end > self.next_index) {
            let index = if start < self.logical_first_index() {
                start
            } else {
                end - 1
            };
            return Err(JournalError::OutOfRange {
                index,
                range: self.range_text(),
            });
        }
        Ok(Entries {
            journal: self,
            next: start,
            end,
            chunk: Vec::new(),
            chunk_segment: usize::MAX,
            chunk_start: 0,
        })
    }

    /// Drops every entry after `index` (raft: a conflicting suffix from an old leader) and
    /// makes the cut durable before returning, so the dropped entries cannot reappear.
    pub fn truncate_after(&mut self, index: u64) -> Result<()> {
        self.check_writable()?;
        let keep_next = index.saturating_add(1);
        if keep_next >= self.next_index {
            return Ok(());
        }
        let first = self.logical_first_index();
        if keep_next < first {
            return Err(JournalError::Invalid(format!(
                "cannot truncate after {index}: entries up to {} were purged",
                first - 1
            )));
        }
        if let Some(committed) = self.committed() {
            if committed.index > index {
                return Err(JournalError::Invalid(format!(
                    "cannot truncate after {index}: index {} is committed",
                    committed.index
                )));
            }
        }
        let tip = self.chain_point(index)?;
        self.truncate_checked(keep_next, tip)
            .map_err(|error| self.poison(error))?;
        self.assert_invariants();
        Ok(())
    }

    fn truncate_checked(&mut self, keep_next: u64, tip: ChainPoint) -> Result<()> {
        let durable = self.config.fsync != Fsync::Never;
        let mut removed = false;
        // Newest first, so a crash leaves a contiguous prefix.
        while self.segments.len() > 1 {
            let last = self.segments.last().expect("more than one segment");
            if last.base_index < keep_next {
                break;
            }
            let path = last.path.clone();
            self.storage
                .remove_file(&path)
                .map_err(|error| JournalError::io("remove", &path, error))?;
            self.segments.pop();
            removed = true;
        }
        if removed && durable {
            self.storage
                .sync_dir(&self.dir)
                .map_err(|error| JournalError::io("fsync directory", &self.dir, error))?;
        }
        let segment = self
            .segments
            .last_mut()
            .expect("journal always has a segment");
        if keep_next < segment.next_index() {
            let keep = (keep_next - segment.base_index) as usize;
            let len_bytes = segment
                .offsets
                .get(keep)
                .map_or(segment.len_bytes, |&o| u64::from(o));
            segment
                .file
                .set_len(len_bytes)
                .map_err(|error| JournalError::io("truncate", &segment.path, error))?;
            if durable {
                segment
                    .file
                    .sync_data()
                    .map_err(|error| JournalError::io("fsync", &segment.path, error))?;
            }
            segment.offsets.truncate(keep);
            segment.len_bytes = len_bytes;
        }
        self.next_index = keep_next;
        self.tip_term = tip.term;
        self.tip_hash = tip.hash;
        self.sync_epoch += 1;
        self.durable_next_index = self.durable_next_index.min(keep_next);
        self.unsynced_segment = self
            .unsynced_segment
            .map(|s| s.min(self.segments.len() - 1));
        Ok(())
    }

    /// Forgets every entry up to and including `index` (covered by a snapshot) and deletes the
    /// segments that hold nothing else. Returns how many segment files were deleted.
    pub fn purge_upto(&mut self, index: u64) -> Result<usize> {
        self.check_writable()?;
        if index < self.logical_first_index() {
            return Ok(0);
        }
        if index >= self.next_index {
            return Err(JournalError::Invalid(format!(
                "cannot purge up to {index}: the log ends at {}; install the snapshot with \
                 reset() instead",
                self.range_text()
            )));
        }
        let point = self.chain_point(index)?;
        self.purge_checked(point)
            .map_err(|error| self.poison(error))
    }

    fn purge_checked(&mut self, point: ChainPoint) -> Result<usize> {
        // The vote file records the new start first: if we crash while deleting, recovery
        // knows the remaining old segments are below it.
        let mut record = self.meta;
        record.purged = Some(point);
        self.write_meta_record(record)?;
        if point.index + 1 == self.next_index
            && !self.segments.last().is_some_and(|s| s.offsets.is_empty())
        {
            // Everything is purged: start an empty segment so the old ones can all go.
            if self.config.fsync != Fsync::Never {
                self.sync()?;
            }
            self.create_segment()?;
        }
        let mut removed = 0;
        while self.segments.len() > 1 && self.segments[0].next_index() <= point.index + 1 {
            let path = self.segments[0].path.clone();
            self.storage
                .remove_file(&path)
                .map_err(|error| JournalError::io("remove", &path, error))?;
            self.segments.remove(0);
            self.unsynced_segment = self.unsynced_segment.map(|s| s.saturating_sub(1));
            removed += 1;
        }
        if removed > 0 {
            self.storage
                .sync_dir(&self.dir)
                .map_err(|error| JournalError::io("fsync directory", &self.dir, error))?;
        }
        Ok(removed)
    }

    /// Discards the whole log and restarts it after `point`, the last entry covered by an
    /// installed snapshot (its index, term and chain hash). Used when a follower receives a
    /// snapshot beyond its log.
    pub fn reset(&mut self, point: ChainPoint) -> Result<()> {
        self.check_writable()?;
        if point.index == u64::MAX {
            return Err(JournalError::Invalid("reset to index u64::MAX".to_string()));
        }
        self.reset_checked(point)
            .map_err(|error| self.poison(error))
    }

    fn reset_checked(&mut self, point: ChainPoint) -> Result<()> {
        let mut record = self.meta;
        record.purged = Some(point);
        self.write_meta_record(record)?;
        while let Some(segment) = self.segments.pop() {
            self.storage
                .remove_file(&segment.path)
                .map_err(|error| JournalError::io("remove", &segment.path, error))?;
        }
        self.unsynced_segment = None;
        self.unsynced_bytes = 0;
        // A held-back commit point inside the discarded log is covered by the snapshot now;
        // openraft records the next one.
        self.commit_pending = None;
        self.next_index = point.index + 1;
        self.tip_term = point.term;
        self.tip_hash = point.hash;
        self.sync_epoch += 1;
        self.durable_next_index = self.next_index;
        // create_segment fsyncs the directory unless fsync is Never; do it here regardless,
        // since the deletions must not come back.
        self.create_segment()?;
        self.storage
            .sync_dir(&self.dir)
            .map_err(|error| JournalError::io("fsync directory", &self.dir, error))
    }

    /// Saves raft's hard state atomically and durably (in every fsync mode: a forgotten vote
    /// could let this node vote twice in one term).
    pub fn save_meta(&mut self, meta: Meta) -> Result<()> {
        self.check_writable()?;
        let mut record = self.meta;
        record.meta = meta;
        self.write_meta_record(record)
            .map_err(|error| self.poison(error))
    }

    fn write_meta_record(&mut self, record: MetaRecord) -> Result<()> {
        write_meta(
            self.storage.as_ref(),
            &self.dir,
            self.config.identity(),
            &record,
        )?;
        self.meta = record;
        Ok(())
    }
}

impl Journal {
    /// Checks the in-memory invariants; cheap enough to run after every mutation in debug
    /// builds, where a broken invariant should stop the test that caused it.
    fn assert_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(!self.segments.is_empty(), "journal always has a segment");
        for pair in self.segments.windows(2) {
            assert_eq!(
                pair[0].next_index(),
                pair[1].base_index,
                "segments contiguous"
            );
        }
        for segment in &self.segments {
            // A segment may exceed today's configured size if an older configuration
            // allowed more, but never the format's limit.
            assert!(segment.len_bytes <= SEGMENT_SIZE_BYTES_LIMIT);
            assert!(segment.offsets.windows(2).all(|w| w[0] < w[1]));
            assert!(segment
                .offsets
                .first()
                .is_none_or(|&o| u64::from(o) == SEGMENT_HEADER_SIZE_BYTES));
        }
        let last = self.segments.last().expect("journal always has a segment");
        assert_eq!(last.next_index(), self.next_index);
        assert!(self.durable_next_index <= self.next_index);
        if let Some(purged) = self.meta.purged {
            assert!(purged.index < self.next_index);
        }
    }
}

fn open_segment(scanned: &ScannedSegment, file: Box<dyn SegmentFile>) -> Result<Segment> {
    let offsets = scanned
        .records
        .iter()
        .map(|r| u32::try_from(r.offset))
        .collect::<std::result::Result<Vec<u32>, _>>()
        .map_err(|_| JournalError::Corrupt {
            file: scanned.path.clone(),
            offset: SEGMENT_SIZE_BYTES_LIMIT,
            reason: "segment larger than the segment size limit".to_string(),
        })?;
    Ok(Segment {
        path: scanned.path.clone(),
        base_index: scanned.header.base_index,
        prev_term: scanned.header.prev_term,
        prev_hash: scanned.header.prev_hash,
        file,
        offsets,
        len_bytes: scanned.valid_len_bytes,
        sync: None,
    })
}

/// Entries of a [`Journal`], read lazily.
#[derive(Debug)]
pub struct Entries<'a> {
    journal: &'a Journal,
    next: u64,
    end: u64,
    /// Read-ahead: bytes `chunk_start..chunk_start + chunk.len()` of segment `chunk_segment`.
    /// A long range is read in chunks of up to [`READ_AHEAD_BYTES`], not with one read call
    /// per record (a replay reads every record); a chunk never extends past the last record
    /// the range asks for, so a short range reads no more than before.
    chunk: Vec<u8>,
    chunk_segment: usize,
    chunk_start: u64,
}

/// The most bytes [`Entries`] reads ahead in one call (one record larger than this is read
/// whole).
pub const READ_AHEAD_BYTES: u64 = 1 << 20;

/// Checks one record's bytes (exactly the record, read from `start` in `segment`) again: its
/// CRC, its index and its length, so bit rot after open is still caught.
fn check_record(segment: &Segment, index: u64, start: u64, bytes: &[u8]) -> Result<Frame> {
    let corrupt = |reason: String| JournalError::Corrupt {
        file: segment.path.clone(),
        offset: start,
        reason,
    };
    let frame = decode_frame(bytes, 0).map_err(|e| corrupt(e.message().to_string()))?;
    if frame.index != index || frame.size_bytes() != bytes.len() as u64 {
        return Err(corrupt(format!(
            "record read for index {index} has index {} and {} bytes",
            frame.index,
            frame.size_bytes()
        )));
    }
    Ok(frame)
}

impl Entries<'_> {
    fn read_next(&mut self) -> Result<Entry> {
        let index = self.next;
        let journal = self.journal;
        let Some(s) = journal.segment_of(index) else {
            return Err(JournalError::OutOfRange {
                index,
                range: journal.range_text(),
            });
        };
        let segment = &journal.segments[s];
        let (start, end) = segment.record_range(index);
        let cached = s == self.chunk_segment
            && start >= self.chunk_start
            && end <= self.chunk_start + self.chunk.len() as u64;
        if !cached {
            // Whole records only, up to the last one of the range inside this segment that
            // ends within the read-ahead (at least this record), so none is read twice.
            let limit = start + READ_AHEAD_BYTES.max(end - start);
            let first = (index - segment.base_index) as usize;
            let last = ((self.end - 1).min(segment.next_index() - 1) - segment.base_index) as usize;
            let (_, range_end) = segment.record_range(segment.base_index + last as u64);
            let chunk_end = if range_end <= limit {
                range_end
            } else {
                // The ends of records first..last are the starts of records first+1..=last.
                let ends = &segment.offsets[first + 1..=last];
                let fit = ends.partition_point(|&o| u64::from(o) <= limit);
                if fit == 0 {
                    end
                } else {
                    u64::from(ends[fit - 1])
                }
            };
            let len = chunk_end - start;
            self.chunk_segment = s;
            self.chunk_start = start;
            // Resized, not cleared: bytes kept from the last chunk are overwritten by the read,
            // so only growth is zero-filled (zeroing every chunk cost as much as the CRC).
            self.chunk.resize(len as usize, 0);
            if segment.file.read_exact_at(&mut self.chunk, start).is_err() {
                // A read error further on must not fail this record: read it alone, as
                // without read-ahead, and report the error only if that read fails too.
                self.chunk.clear();
                self.chunk.resize((end - start) as usize, 0);
                if let Err(error) = segment.file.read_exact_at(&mut self.chunk, start) {
                    self.chunk.clear();
                    return Err(JournalError::io("read", &segment.path, error));
                }
            }
        }
        let at = (start - self.chunk_start) as usize;
        let bytes = &self.chunk[at..at + (end - start) as usize];
        let frame = check_record(segment, index, start, bytes)?;
        Ok(Entry {
            index,
            term: frame.term,
            payload: frame_payload(bytes, 0, &frame).to_vec(),
        })
    }
}

impl Iterator for Entries<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let result = self.read_next();
        self.next = if result.is_ok() {
            self.next + 1
        } else {
            self.end
        };
        Some(result)
    }
}
