//! bourse-journal: the durable log under a replicated trading core, and its snapshots.
//!
//! Principal types:
//!
//! - [`Journal`]: an append-only log of [`Entry`] (raft index, term, opaque payload) in a
//!   directory of segment files. Every record is framed with its length and a CRC32C and
//!   carries a chain hash over its predecessor's, so damage and mixed-up files are found on
//!   open. Appends are group-committed under an [`Fsync`] mode. It offers what openraft's
//!   `RaftLogStorage` needs: `append`, `flush`, `read`/`entries`, `last_position`,
//!   `last_purged`, `truncate_after`, `purge_upto`, `reset`, the vote file (`save_meta`) and
//!   the commit point file (`save_committed`, written in place, never ahead of the durable
//!   prefix).
//! - [`RecoveryReport`]: what `Journal::open` found and repaired. Only a torn write at the
//!   very end of the last segment is ever repaired; any other damage is a [`JournalError`]
//!   naming the file and byte offset, including a log that ends before the recorded commit
//!   point (a segment cut at a record boundary, a missing last segment), which under
//!   `Fsync::Never` is reported as `committed_lost` instead.
//! - [`SnapshotStore`] and [`Snapshot`]: atomically written, CRC-protected snapshots; the
//!   newest valid one wins and damaged newer ones are reported.
//! - [`Storage`] and [`SegmentFile`]: the file-system seam. [`RealStorage`] is the disk;
//!   [`FaultyStorage`] injects full-disk and I/O errors for tests. Any write or fsync error
//!   poisons a journal: it never reports success again until reopened.
//! - [`verify`], [`inspect`], [`replay`] and [`Records`]: read-only operator functions for
//!   `bourse journal`.
//! - [`bench_append`]: the append benchmark behind `bourse bench journal`.
//! - [`stats`]: cheap counters for monitoring ([`JournalStats`]: bytes and records appended,
//!   fsyncs and their latency; [`SnapshotStats`]: snapshots written, size, write time),
//!   reachable from the owner (`Journal::stats`, `SnapshotStore::stats`) or by directory.
//!
//! The on-disk formats are described in the `format`, `meta` and `snapshot` modules.
//!
//! # Serving openraft 0.10 (`RaftLogStorage`)
//!
//! The cluster crate is expected to wrap a `Journal` (it is `Send + Sync`; put it behind a
//! mutex shared with the log reader) and map the trait onto it:
//!
//! | openraft | journal |
//! |---|---|
//! | `get_log_state` | `last_purged()`, `last_position()` (falls back to the purge point) |
//! | `try_get_log_entries(range)` | `read(range)` / `entries(range)` |
//! | `save_vote` / `read_vote` | `save_meta(Meta { term, voted_for, vote_committed, .. })` / `meta()` |
//! | `save_committed` / `read_committed` | `save_committed(position)` / `committed()` (the commit point file, written in place; see `commit`) |
//! | `append(entries, IOFlushed)` | `append(&[Entry])`; `io_completed` once `durable_next_index()` passes them (at once under `Fsync::Always`; after `flush()` otherwise) |
//! | `truncate_after(last_log_id)` | `truncate_after(last_log_id.index)` |
//! | `purge(log_id)` | `purge_upto(log_id.index)`; `reset(ChainPoint)` when a snapshot lies beyond the log |
//!
//! Under `Fsync::Batch` nothing fsyncs while no appends arrive, so the caller should `flush()`
//! on its own timer or when its queue runs dry, or run a flusher: `set_batch_flusher(true)`,
//! then `prepare_sync()` under the lock, `PreparedSync::run()` (the fdatasync) without it, and
//! `finish_sync()` under it again, which marks durable only what the sync captured. The
//! cluster's `LogStore` does that on its own thread as soon as an append's callback waits.

#![forbid(unsafe_code)]

mod bench;
mod commit;
mod error;
mod format;
mod journal;
mod meta;
mod ops;
mod recovery;
mod snapshot;
pub mod stats;
mod storage;

pub use bench::{bench_append, BenchReport};
pub use commit::COMMIT_FILE_NAME;
pub use error::{JournalError, Result};
pub use format::{
    chain_hash, genesis_hash, segment_file_name, PAYLOAD_SIZE_BYTES_LIMIT,
    RECORD_HEADER_SIZE_BYTES, SEGMENT_HEADER_SIZE_BYTES, SEGMENT_SIZE_BYTES_LIMIT,
    SEGMENT_SIZE_BYTES_MIN,
};
pub use journal::{
    Config, Entries, Entry, Fsync, Journal, PreparedSync, RecoveryReport, SyncOutcome, TornTail,
    ENTRIES_PER_APPEND_LIMIT, FSYNC_INTERVAL_MS_LIMIT, READ_AHEAD_BYTES,
};
pub use meta::{ChainPoint, LogPosition, Meta, META_FILE_NAME};
pub use ops::{
    inspect, replay, verify, verify_with_storage, Problem, Record, RecordInfo, Records,
    SegmentSummary, VerifyReport,
};
pub use recovery::SNAPSHOT_DIR_NAME;
pub use snapshot::{
    LatestSnapshot, SkippedSnapshot, Snapshot, SnapshotMeta, SnapshotStore, SNAPSHOTS_KEPT_LIMIT,
    SNAPSHOT_SIZE_BYTES_LIMIT,
};
pub use stats::{
    journal_stats_for, snapshot_stats_for, JournalStats, JournalStatsSnapshot, SnapshotStats,
    SnapshotStatsSnapshot, FSYNC_BUCKETS_NS,
};
pub use storage::{
    DirEntry, Faults, FaultyStorage, OpenMode, RealStorage, SegmentFile, Storage, SyncHandle, EIO,
    ENOSPC,
};
