//! The journal's error type.
//!
//! Every variant that concerns data on disk names the file and, where it makes sense, the byte
//! offset, because the reader of these messages is an operator deciding whether a node's disk
//! can be trusted, and "somewhere in the journal" is not an answer they can act on.

use std::io;
use std::path::{Path, PathBuf};

/// Why a journal or snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// An operating-system call failed. On a write path this also poisons the journal.
    #[error("I/O error during {op} on {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// An earlier write or fsync failed, so the state of the files is unknown and the journal
    /// refuses every further write until the process restarts and recovers from disk.
    #[error(
        "journal is stopped after an earlier write failure ({cause}); restart the node so that \
         recovery re-reads what actually reached the disk"
    )]
    Poisoned { cause: String },

    /// A record inside the committed prefix of the log is damaged. The journal never truncates
    /// such data: valid records follow it, so it cannot be a torn write at the tail.
    #[error(
        "journal file {} is damaged at byte offset {offset}: {reason}; refusing to open \
         (this is not a torn tail, data after it would be lost)",
        file.display()
    )]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },

    /// A file in the journal directory is named like a segment but is not one of ours.
    #[error("{} is not a bourse journal segment: {reason}", file.display())]
    NotASegment { file: PathBuf, reason: String },

    /// The segment or vote file belongs to a different cluster.
    #[error(
        "{} belongs to cluster {found:032x}, but this node is configured for cluster \
         {expected:032x}; refusing to use another cluster's journal",
        file.display()
    )]
    WrongCluster {
        file: PathBuf,
        expected: u128,
        found: u128,
    },

    /// The segment or vote file was written by a different node of the cluster.
    #[error(
        "{} was written by node {found}, but this is node {expected}; refusing to use another \
         node's journal",
        file.display()
    )]
    WrongNode {
        file: PathBuf,
        expected: u64,
        found: u64,
    },

    /// Indexes are missing between two segments, or before the first one: a segment was lost
    /// or cut short.
    #[error(
        "journal has a gap before {}: expected index {expected} next, but the file starts at \
         index {found} (a segment is missing or was truncated)",
        file.display()
    )]
    IndexGap {
        file: PathBuf,
        expected: u64,
        found: u64,
    },

    /// The hash chain does not link a segment to its predecessor or to the purge point.
    #[error(
        "hash chain broken at {} byte offset {offset}: expected previous hash {expected:016x}, \
         found {found:016x} (files from different histories were mixed)",
        file.display()
    )]
    ChainBroken {
        file: PathBuf,
        offset: u64,
        expected: u64,
        found: u64,
    },

    /// The vote file is missing, damaged or not ours.
    #[error("vote file {} is unusable: {reason}", file.display())]
    BadMeta { file: PathBuf, reason: String },

    /// The commit point (or the vote file) says entries up to `committed` were committed and
    /// durable here, but the log ends earlier: records of the committed prefix are missing (a
    /// segment cut at a record boundary, a deleted last segment), which no torn write explains.
    #[error(
        "{} records index {committed} as committed, but the log in {} ends at {last}; \
         committed entries are missing (wipe this node's directory to rebuild it from its \
         peers)",
        file.display(),
        dir.display()
    )]
    CommittedMissing {
        dir: PathBuf,
        /// The file that recorded the commit point.
        file: PathBuf,
        committed: u64,
        /// Where the log ends: the last index, the segment file and its byte offset.
        last: String,
        /// The last segment and the byte offset where its valid records end, if any.
        end: Option<(PathBuf, u64)>,
    },

    /// A snapshot file is damaged or not ours.
    #[error("snapshot {} is unusable: {reason}", file.display())]
    BadSnapshot { file: PathBuf, reason: String },

    /// The configuration is outside the journal's limits.
    #[error("invalid journal configuration: {0}")]
    Config(String),

    /// The caller asked for something the log cannot do (wrong index, too large, ...).
    #[error("invalid journal request: {0}")]
    Invalid(String),

    /// The requested index is not in the log.
    #[error("index {index} is outside the journal's range {range}")]
    OutOfRange { index: u64, range: String },
}

impl JournalError {
    pub(crate) fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        JournalError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The file this error concerns, if any.
    pub fn file(&self) -> Option<&Path> {
        match self {
            JournalError::Io { path, .. } => Some(path),
            JournalError::Corrupt { file, .. }
            | JournalError::NotASegment { file, .. }
            | JournalError::WrongCluster { file, .. }
            | JournalError::WrongNode { file, .. }
            | JournalError::IndexGap { file, .. }
            | JournalError::ChainBroken { file, .. }
            | JournalError::BadMeta { file, .. }
            | JournalError::BadSnapshot { file, .. } => Some(file),
            JournalError::CommittedMissing { end, dir, .. } => Some(
                end.as_ref()
                    .map_or(dir.as_path(), |(file, _)| file.as_path()),
            ),
            _ => None,
        }
    }

    /// The byte offset inside [`JournalError::file`] this error concerns, if any.
    pub fn offset(&self) -> Option<u64> {
        match self {
            JournalError::Corrupt { offset, .. } | JournalError::ChainBroken { offset, .. } => {
                Some(*offset)
            }
            JournalError::NotASegment { .. }
            | JournalError::WrongCluster { .. }
            | JournalError::WrongNode { .. }
            | JournalError::IndexGap { .. } => Some(0),
            JournalError::CommittedMissing { end, .. } => end.as_ref().map(|(_, offset)| *offset),
            _ => None,
        }
    }
}

pub type Result<T, E = JournalError> = std::result::Result<T, E>;
