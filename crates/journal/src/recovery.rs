//! Reading a journal directory back: list the files, check every segment against its name,
//! the node's identity, the hash chain and the vote file's purge point, and decide what, if
//! anything, recovery may repair.
//!
//! The same analysis serves [`crate::Journal::open`] (which then repairs: removes temporary
//! files, cuts a torn tail, deletes segments a purge had already given up) and
//! [`crate::verify`] (which only reports). Keeping one analysis means the operator's `verify`
//! sees exactly what `open` would do.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::commit::{read_commit, COMMIT_FILE_NAME};
use crate::error::{JournalError, Result};
use crate::format::{
    genesis_hash, parse_segment_file_name, scan_records, Identity, RecordMeta, ScanEnd,
    SegmentHeader, SEGMENT_HEADER_SIZE_BYTES, SEGMENT_SIZE_BYTES_LIMIT,
};
use crate::meta::{read_meta, ChainPoint, LogPosition, MetaRecord, META_FILE_NAME};
use crate::storage::{OpenMode, Storage};

/// The subdirectory the snapshot store uses by convention; not a foreign file.
pub const SNAPSHOT_DIR_NAME: &str = "snapshots";

/// What a journal directory holds, by name.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Segments sorted by the base index in their names.
    pub segments: Vec<(u64, PathBuf)>,
    /// Temporary files left by an interrupted atomic write.
    pub temp_files: Vec<PathBuf>,
    /// Files that are none of ours.
    pub foreign_files: Vec<PathBuf>,
    pub has_meta: bool,
    pub has_commit: bool,
}

pub(crate) fn list_dir(storage: &dyn Storage, dir: &Path) -> Result<Listing> {
    let entries = storage
        .list_dir(dir)
        .map_err(|error| JournalError::io("list directory", dir, error))?;
    let mut listing = Listing::default();
    for entry in entries {
        let path = dir.join(&entry.name);
        if entry.is_dir {
            if entry.name != SNAPSHOT_DIR_NAME {
                listing.foreign_files.push(path);
            }
        } else if let Some(base) = parse_segment_file_name(&entry.name) {
            listing.segments.push((base, path));
        } else if entry.name.ends_with(".tmp") {
            listing.temp_files.push(path);
        } else if entry.name == META_FILE_NAME {
            listing.has_meta = true;
        } else if entry.name == COMMIT_FILE_NAME {
            listing.has_commit = true;
        } else {
            listing.foreign_files.push(path);
        }
    }
    listing.segments.sort_by_key(|(base, _)| *base);
    Ok(listing)
}

/// One segment as recovery found it.
#[derive(Debug, Clone)]
pub(crate) struct ScannedSegment {
    pub path: PathBuf,
    pub header: SegmentHeader,
    pub records: Vec<RecordMeta>,
    pub file_len_bytes: u64,
    pub valid_len_bytes: u64,
    /// Set only on the last segment: where a torn write begins and why it is one.
    pub torn_tail: Option<(u64, String)>,
}

impl ScannedSegment {
    /// The index after this segment's last record.
    pub fn next_index(&self) -> u64 {
        self.header.base_index + self.records.len() as u64
    }

    /// The chain point of this segment's last record, or of its predecessor if it is empty.
    pub fn tip(&self) -> ChainPoint {
        match self.records.last() {
            Some(last) => ChainPoint {
                index: last.index,
                term: last.term,
                hash: last.hash,
            },
            None => ChainPoint {
                index: self.header.base_index.wrapping_sub(1),
                term: self.header.prev_term,
                hash: self.header.prev_hash,
            },
        }
    }
}

/// Walks the segments of a directory in order, checking each and the links between them, and
/// yields each with its bytes. It stops after the first error.
pub(crate) struct SegmentWalker {
    storage: Arc<dyn Storage>,
    segments: Vec<(u64, PathBuf)>,
    position: usize,
    identity: Option<Identity>,
    previous: Option<ChainPoint>,
    failed: bool,
    /// The last segment file, if it holds nothing but zeros (or nothing at all): a segment
    /// whose creation never reached the disk, with its size.
    pub torn_last_segment: Option<(PathBuf, u64)>,
}

impl SegmentWalker {
    pub fn new(
        storage: Arc<dyn Storage>,
        segments: Vec<(u64, PathBuf)>,
        identity: Option<Identity>,
    ) -> Self {
        SegmentWalker {
            storage,
            segments,
            position: 0,
            identity,
            previous: None,
            failed: false,
            torn_last_segment: None,
        }
    }

    /// The identity the walk checks against (learned from the first segment if not given).
    pub fn identity(&self) -> Option<Identity> {
        self.identity
    }

    fn scan_next(&mut self, base: u64, path: &Path) -> Result<(ScannedSegment, Vec<u8>)> {
        let is_last = self.position == self.segments.len();
        let file = self
            .storage
            .open_file(path, OpenMode::Read)
            .map_err(|error| JournalError::io("open", path, error))?;
        let bytes = file
            .read_all(SEGMENT_SIZE_BYTES_LIMIT + SEGMENT_HEADER_SIZE_BYTES)
            .map_err(|error| JournalError::io("read", path, error))?;
        if is_last && bytes.iter().all(|&b| b == 0) {
            // Without fsync (`Fsync::Never`) a crash can leave a freshly renamed segment with
            // no data at all. Nothing in it was ever valid, so nothing is lost by dropping it.
            self.torn_last_segment = Some((path.to_path_buf(), bytes.len() as u64));
            return Err(JournalError::NotASegment {
                file: path.to_path_buf(),
                reason: "empty segment left by an interrupted creation".to_string(),
            });
        }
        let header = SegmentHeader::decode(&bytes).map_err(|reason| JournalError::NotASegment {
            file: path.to_path_buf(),
            reason,
        })?;
        if header.base_index != base {
            return Err(JournalError::NotASegment {
                file: path.to_path_buf(),
                reason: format!(
                    "its name says it starts at index {base} but its header says {}",
                    header.base_index
                ),
            });
        }
        let identity = *self.identity.get_or_insert(header.identity);
        if header.identity.cluster_id != identity.cluster_id {
            return Err(JournalError::WrongCluster {
                file: path.to_path_buf(),
                expected: identity.cluster_id,
                found: header.identity.cluster_id,
            });
        }
        if header.identity.node_id != identity.node_id {
            return Err(JournalError::WrongNode {
                file: path.to_path_buf(),
                expected: identity.node_id,
                found: header.identity.node_id,
            });
        }
        if let Some(previous) = self.previous {
            let expected = previous.index.wrapping_add(1);
            if header.base_index != expected {
                return Err(JournalError::IndexGap {
                    file: path.to_path_buf(),
                    expected,
                    found: header.base_index,
                });
            }
            if header.prev_hash != previous.hash || header.prev_term != previous.term {
                return Err(JournalError::ChainBroken {
                    file: path.to_path_buf(),
                    offset: 0,
                    expected: previous.hash,
                    found: header.prev_hash,
                });
            }
        }
        let scan = scan_records(&bytes, &header);
        let torn_tail = match scan.end {
            ScanEnd::Clean => None,
            ScanEnd::TornTail { offset, reason } if is_last => Some((offset, reason)),
            ScanEnd::TornTail { offset, reason } => {
                return Err(JournalError::Corrupt {
                    file: path.to_path_buf(),
                    offset,
                    reason: format!(
                        "{reason}, in a segment that is not the last one (a later segment \
                         exists, so this segment was complete once)"
                    ),
                })
            }
            ScanEnd::Corrupt { offset, reason } => {
                return Err(JournalError::Corrupt {
                    file: path.to_path_buf(),
                    offset,
                    reason,
                })
            }
        };
        let segment = ScannedSegment {
            path: path.to_path_buf(),
            header,
            records: scan.records,
            file_len_bytes: bytes.len() as u64,
            valid_len_bytes: scan.valid_len,
            torn_tail,
        };
        self.previous = Some(segment.tip());
        Ok((segment, bytes))
    }
}

impl Iterator for SegmentWalker {
    type Item = Result<(ScannedSegment, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.position >= self.segments.len() {
            return None;
        }
        let (base, path) = self.segments[self.position].clone();
        self.position += 1;
        let result = self.scan_next(base, &path);
        if result.is_err() {
            self.failed = true;
            if self.torn_last_segment.is_some() {
                return None;
            }
        }
        Some(result)
    }
}

/// The outcome of reading a directory, with the repairs recovery would make.
#[derive(Debug, Default)]
pub(crate) struct Analysis {
    pub listing: Listing,
    pub identity: Option<Identity>,
    pub meta: Option<MetaRecord>,
    /// The commit point file's position (see `commit`), if there is one.
    pub commit: Option<LogPosition>,
    /// Segments to keep, in order.
    pub segments: Vec<ScannedSegment>,
    /// A last segment file with no header (an interrupted creation), and its size.
    pub torn_last_segment: Option<(PathBuf, u64)>,
    /// Segments whose every record is at or below the purge point (a purge or reset was
    /// interrupted after the vote file recorded it).
    pub stale_segments: Vec<PathBuf>,
    /// The first problem found; when set, the other fields describe what was read before it.
    pub problem: Option<JournalError>,
}

impl Analysis {
    pub fn last_index(&self) -> Option<u64> {
        let next = self
            .segments
            .last()
            .map(ScannedSegment::next_index)
            .or_else(|| {
                self.meta
                    .and_then(|m| m.purged)
                    .map(|p| p.index.wrapping_add(1))
            })?;
        next.checked_sub(1)
    }
}

/// Reads and checks a directory. `identity` is the node's own; `None` (for `verify`) takes
/// it from the first segment.
pub(crate) fn analyze(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    identity: Option<Identity>,
) -> Result<Analysis> {
    let listing = list_dir(storage.as_ref(), dir)?;
    let mut analysis = Analysis {
        identity,
        ..Analysis::default()
    };
    let mut walker = SegmentWalker::new(storage.clone(), listing.segments.clone(), identity);
    for item in walker.by_ref() {
        match item {
            Ok((segment, _bytes)) => analysis.segments.push(segment),
            Err(error) => {
                analysis.problem = Some(error);
                break;
            }
        }
    }
    analysis.identity = walker.identity();
    analysis.torn_last_segment = walker.torn_last_segment.clone();
    analysis.listing = listing;
    if analysis.problem.is_some() {
        return Ok(analysis);
    }
    if let Some(identity) = analysis.identity {
        if analysis.listing.has_meta {
            match read_meta(storage.as_ref(), dir, identity) {
                Ok(meta) => analysis.meta = meta,
                Err(error) => {
                    analysis.problem = Some(error);
                    return Ok(analysis);
                }
            }
            if analysis.listing.has_commit {
                match read_commit(storage.as_ref(), dir, identity) {
                    Ok(commit) => analysis.commit = commit,
                    Err(error) => {
                        analysis.problem = Some(error);
                        return Ok(analysis);
                    }
                }
            }
        } else if !analysis.segments.is_empty() {
            analysis.problem = Some(JournalError::BadMeta {
                file: dir.join(META_FILE_NAME),
                reason: "the vote file is missing although segments exist (without it the \
                         node could vote twice in a term)"
                    .to_string(),
            });
            return Ok(analysis);
        }
    }
    if let Err(error) = check_start(&mut analysis, dir) {
        analysis.problem = Some(error);
    }
    Ok(analysis)
}

/// Checks that the log starts where the vote file's purge point (or genesis) says it must,
/// and moves segments wholly below the purge point to `stale_segments`.
fn check_start(analysis: &mut Analysis, dir: &Path) -> Result<()> {
    let Some(identity) = analysis.identity else {
        return Ok(());
    };
    let purged = analysis.meta.and_then(|m| m.purged);
    match purged {
        None => {
            if let Some(first) = analysis.segments.first() {
                let genesis = genesis_hash(identity.cluster_id);
                if first.header.base_index != 0 {
                    return Err(JournalError::IndexGap {
                        file: first.path.clone(),
                        expected: 0,
                        found: first.header.base_index,
                    });
                }
                if first.header.prev_hash != genesis {
                    return Err(JournalError::ChainBroken {
                        file: first.path.clone(),
                        offset: 0,
                        expected: genesis,
                        found: first.header.prev_hash,
                    });
                }
            }
        }
        Some(purged) => {
            // Does the chain on disk pass through the purge point? If it does not, a reset to
            // a snapshot was interrupted after it recorded the new start: everything on disk
            // is from the history the snapshot replaced.
            let on_chain = analysis.segments.iter().any(|segment| {
                if segment.header.base_index == purged.index.wrapping_add(1) {
                    return segment.header.prev_hash == purged.hash
                        && segment.header.prev_term == purged.term;
                }
                segment.records.iter().any(|r| {
                    r.index == purged.index && r.hash == purged.hash && r.term == purged.term
                })
            });
            let reaches = analysis
                .segments
                .last()
                .is_some_and(|s| s.next_index() > purged.index);
            if !on_chain && reaches {
                let stale: Vec<PathBuf> = analysis.segments.drain(..).map(|s| s.path).collect();
                analysis.stale_segments.extend(stale);
                return Ok(());
            }
            while !analysis.segments.is_empty() {
                let first = &analysis.segments[0];
                if first.next_index() <= purged.index.wrapping_add(1)
                    && first.header.base_index <= purged.index
                {
                    let stale = analysis.segments.remove(0);
                    analysis.stale_segments.push(stale.path);
                } else {
                    break;
                }
            }
            if let Some(first) = analysis.segments.first() {
                let start = purged.index.wrapping_add(1);
                if first.header.base_index > start {
                    return Err(JournalError::IndexGap {
                        file: first.path.clone(),
                        expected: start,
                        found: first.header.base_index,
                    });
                }
            }
        }
    }
    // The newer of the two records of the commit point: the vote file's (written with the
    // vote) and the commit point file's (written in place as commits advance).
    let from_meta = analysis
        .meta
        .and_then(|m| m.meta.committed)
        .map(|c| (c, dir.join(META_FILE_NAME)));
    let from_commit = analysis.commit.map(|c| (c, dir.join(COMMIT_FILE_NAME)));
    let committed = match (from_meta, from_commit) {
        (Some(a), Some(b)) => Some(if b.0.index >= a.0.index { b } else { a }),
        (a, b) => a.or(b),
    };
    if let Some((committed, file)) = committed {
        let last = analysis.last_index();
        if last.is_none_or(|last| last < committed.index) {
            let end = analysis
                .segments
                .last()
                .map(|s| (s.path.clone(), s.valid_len_bytes));
            let mut text = match last {
                Some(last) => format!("index {last}"),
                None => "before any entry".to_string(),
            };
            match &end {
                Some((path, offset)) => text.push_str(&format!(
                    " (segment {} ends at byte offset {offset})",
                    path.display()
                )),
                None => text.push_str(" (no segment file is left)"),
            }
            return Err(JournalError::CommittedMissing {
                dir: dir.to_path_buf(),
                file,
                committed: committed.index,
                last: text,
                end,
            });
        }
    }
    Ok(())
}
