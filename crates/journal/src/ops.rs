//! Operator functions behind `bourse journal verify | inspect | replay`. They read a journal
//! directory without a configuration (the identity comes from the first segment), never
//! modify it, and return data for the CLI to print.

use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{JournalError, Result};
use crate::format::frame_payload;
use crate::journal::{Entry, TornTail};
use crate::meta::{LogPosition, Meta};
use crate::recovery::{analyze, list_dir, ScannedSegment, SegmentWalker};
use crate::storage::{RealStorage, Storage};

/// One segment as `verify` saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSummary {
    pub file: PathBuf,
    pub base_index: u64,
    pub records: u64,
    pub size_bytes: u64,
}

/// The first thing wrong with a journal, located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub file: Option<PathBuf>,
    pub offset: Option<u64>,
    pub message: String,
}

impl From<&JournalError> for Problem {
    fn from(error: &JournalError) -> Self {
        Problem {
            file: error.file().map(Path::to_path_buf),
            offset: error.offset(),
            message: error.to_string(),
        }
    }
}

/// Everything `verify` found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub dir: PathBuf,
    pub cluster_id: Option<u128>,
    pub node_id: Option<u64>,
    /// Segments checked before the first problem (all of them if there is none).
    pub segments: Vec<SegmentSummary>,
    pub records: u64,
    pub first_index: Option<u64>,
    pub last: Option<LogPosition>,
    pub last_hash: Option<u64>,
    pub meta: Option<Meta>,
    pub purged: Option<LogPosition>,
    /// A torn write at the end that `open` would cut away.
    pub torn_tail: Option<TornTail>,
    /// Segments below the purge point that `open` would delete.
    pub stale_segments: Vec<PathBuf>,
    pub temp_files: Vec<PathBuf>,
    pub foreign_files: Vec<PathBuf>,
    pub problem: Option<Problem>,
}

impl VerifyReport {
    /// True if `open` would accept the journal (possibly after cutting a torn tail).
    pub fn is_ok(&self) -> bool {
        self.problem.is_none()
    }
}

/// Checks every segment, record, CRC and chain link of the journal in `dir`.
pub fn verify(dir: impl AsRef<Path>) -> Result<VerifyReport> {
    verify_with_storage(Arc::new(RealStorage), dir)
}

pub fn verify_with_storage(
    storage: Arc<dyn Storage>,
    dir: impl AsRef<Path>,
) -> Result<VerifyReport> {
    let dir = dir.as_ref();
    let analysis = analyze(&storage, dir, None)?;
    let mut report = VerifyReport {
        dir: dir.to_path_buf(),
        cluster_id: analysis.identity.map(|i| i.cluster_id),
        node_id: analysis.identity.map(|i| i.node_id),
        meta: analysis.meta.map(|m| m.meta),
        purged: analysis.meta.and_then(|m| m.purged).map(|p| p.position()),
        stale_segments: analysis.stale_segments.clone(),
        temp_files: analysis.listing.temp_files.clone(),
        foreign_files: analysis.listing.foreign_files.clone(),
        problem: analysis.problem.as_ref().map(Problem::from),
        ..VerifyReport::default()
    };
    for segment in &analysis.segments {
        report.segments.push(SegmentSummary {
            file: segment.path.clone(),
            base_index: segment.header.base_index,
            records: segment.records.len() as u64,
            size_bytes: segment.file_len_bytes,
        });
        report.records += segment.records.len() as u64;
        if let Some((offset, reason)) = &segment.torn_tail {
            report.torn_tail = Some(TornTail {
                file: segment.path.clone(),
                offset: *offset,
                bytes_dropped: segment.file_len_bytes - segment.valid_len_bytes,
                reason: reason.clone(),
            });
        }
    }
    if let Some((path, len_bytes)) = &analysis.torn_last_segment {
        report.torn_tail = Some(TornTail {
            file: path.clone(),
            offset: 0,
            bytes_dropped: *len_bytes,
            reason: "segment file without a header (interrupted creation)".to_string(),
        });
    }
    report.first_index = analysis
        .segments
        .iter()
        .find_map(|s| s.records.first().map(|r| r.index));
    if let Some(last) = analysis
        .segments
        .iter()
        .rev()
        .find_map(|s| s.records.last())
    {
        report.last = Some(LogPosition {
            index: last.index,
            term: last.term,
        });
        report.last_hash = Some(last.hash);
    }
    Ok(report)
}

/// Where a record lives and what it holds, without its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordInfo {
    pub index: u64,
    pub term: u64,
    pub payload_len: u32,
    pub hash: u64,
    pub offset: u64,
    pub file: PathBuf,
}

/// A record read by [`Records`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub info: RecordInfo,
    pub payload: Vec<u8>,
}

/// Every record of a journal directory in index order, checked as it is read. A torn tail
/// ends the iteration quietly (recovery would cut it); any other damage is yielded as an error
/// and ends it.
pub struct Records {
    walker: SegmentWalker,
    current: Option<(ScannedSegment, Vec<u8>)>,
    position: usize,
    start: u64,
    end: u64,
    done: bool,
}

impl Records {
    /// Reads the records of `dir` whose index falls in `range`.
    pub fn open(dir: impl AsRef<Path>, range: impl RangeBounds<u64>) -> Result<Records> {
        Records::open_with_storage(Arc::new(RealStorage), dir, range)
    }

    pub fn open_with_storage(
        storage: Arc<dyn Storage>,
        dir: impl AsRef<Path>,
        range: impl RangeBounds<u64>,
    ) -> Result<Records> {
        let listing = list_dir(storage.as_ref(), dir.as_ref())?;
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        Ok(Records {
            walker: SegmentWalker::new(storage, listing.segments, None),
            current: None,
            position: 0,
            start,
            end,
            done: false,
        })
    }
}

impl Iterator for Records {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            if let Some((segment, bytes)) = &self.current {
                if let Some(meta) = segment.records.get(self.position) {
                    self.position += 1;
                    if meta.index >= self.end {
                        self.done = true;
                        return None;
                    }
                    if meta.index < self.start {
                        continue;
                    }
                    let frame = crate::format::Frame {
                        index: meta.index,
                        term: meta.term,
                        hash: meta.hash,
                        payload_len: meta.payload_len,
                    };
                    return Some(Ok(Record {
                        info: RecordInfo {
                            index: meta.index,
                            term: meta.term,
                            payload_len: meta.payload_len,
                            hash: meta.hash,
                            offset: meta.offset,
                            file: segment.path.clone(),
                        },
                        payload: frame_payload(bytes, meta.offset, &frame).to_vec(),
                    }));
                }
            }
            match self.walker.next() {
                None => {
                    self.done = true;
                    return None;
                }
                Some(Err(error)) => {
                    self.done = true;
                    return Some(Err(error));
                }
                Some(Ok(next)) => {
                    self.current = Some(next);
                    self.position = 0;
                }
            }
        }
    }
}

/// Records of `dir` in `range`, without payloads: for `bourse journal inspect`.
pub fn inspect(
    dir: impl AsRef<Path>,
    range: impl RangeBounds<u64>,
) -> Result<impl Iterator<Item = Result<RecordInfo>>> {
    Ok(Records::open(dir, range)?.map(|r| r.map(|r| r.info)))
}

/// Entries of `dir` in `range`, with payloads: for `bourse journal replay`.
pub fn replay(
    dir: impl AsRef<Path>,
    range: impl RangeBounds<u64>,
) -> Result<impl Iterator<Item = Result<Entry>>> {
    Ok(Records::open(dir, range)?.map(|r| {
        r.map(|r| Entry {
            index: r.info.index,
            term: r.info.term,
            payload: r.payload,
        })
    }))
}
