//! bourse-journal: the durable log under a replicated trading core, and its snapshots.
//!
//! Start at [`Journal`]: an append-only log of [`Entry`] (raft index, term, opaque payload) in
//! segment files, each record framed with its length and a CRC32C and chained by hash,
//! group-committed under an [`Fsync`] mode. Opening repairs only a torn tail ([`RecoveryReport`])
//! and refuses other damage with a [`JournalError`] naming file and offset. [`SnapshotStore`]
//! writes snapshots atomically; [`Storage`] is the file-system seam ([`FaultyStorage`] injects
//! faults); [`verify`], [`inspect`] and [`replay`] serve `bourse journal`.
//!
//! How openraft's `RaftLogStorage` maps onto it, and the batch flusher: ARCHITECTURE.md,
//! `crates/journal`. The on-disk formats: the `format`, `meta` and `snapshot` modules.

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
