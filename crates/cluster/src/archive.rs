//! The stream archive: a node's copy on disk of its committed stream (every applied entry
//! with its requests' keys, outcome kinds and encoded events), so that a consumer further
//! behind than the in-memory ring catches up from disk instead of failing.
//!
//! The raft journal holds commands, not their events; the events exist only once a replica
//! applied them. The archive keeps them in `bourse_journal` segments of its own
//! (`node-<id>/stream`), one record per log index, written by a thread that follows the
//! node's committed stream ([`ArchiveWriter`]). It is never fsynced: everything in it can
//! be derived again from the log, and a torn tail is cut by the journal's recovery like any
//! other.
//!
//! Consistency with the applied index after a restart: the archive is a contiguous run
//! `first..next` of applied entries. A restarted node applies again from its snapshot's
//! index; applying a committed entry is deterministic (the replicas' state hashes prove
//! it), so an archived entry at or above that index is byte for byte what the node is
//! about to apply, and the writer simply resumes at the archive's `next` (a subscription to
//! a future index waits for it). When the archive ends before the oldest entry the stream
//! can still give (it fell behind a burst, or the node installed a snapshot from the
//! leader), it restarts empty at that entry rather than keep a hole: the archive never holds
//! a gap, so a read from it is always a gapless run.
//!
//! Retention: at most about `retention_entries` entries are kept; older segments are
//! deleted whole (a segment is [`ARCHIVE_SEGMENT_BYTES`] at most).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bourse_journal::{ChainPoint, Config as JournalConfig, Entry, Fsync, Journal};

use crate::stream::{CommittedEntry, CommittedStream, StreamError};

/// The archive's directory under the node's: named for the entry encoding's version, so that
/// a node never reads entries another version wrote (the archive is a cache of the log's
/// applied entries: a new one simply starts empty). Version 2 added `applied_index`.
pub const ARCHIVE_DIR: &str = "stream-v2";
/// Size of one archive segment file.
pub const ARCHIVE_SEGMENT_BYTES: u64 = 32 * 1024 * 1024;
/// The largest archived entry (an entry whose encoding is larger restarts the archive after
/// it, so it is never a hole in a run).
pub const ARCHIVE_ENTRY_BYTES_MAX: u32 = crate::stream::ENTRY_BYTES_MAX as u32;
/// Entries the writer appends in one journal call at most.
const APPEND_ENTRIES_MAX: usize = 1_024;
/// How long the writer rests after an append that did not fill a batch: what commits
/// meanwhile waits in the stream's subscription (up to its lag bound, 16,384 entries, which
/// this is far from at any rate a core applies) and forms the next batch. Woken at every entry
/// instead, the nine archive threads of a three-core venue cost more CPU per transaction than
/// their writes; a consumer behind the ring waits at most this much longer for the archive.
const WRITE_PAUSE_MS: u64 = 20;
/// The most entries one read hands out.
pub const READ_ENTRIES_MAX: usize = 4_096;

struct Inner {
    journal: Journal,
    retention_entries: u64,
    /// Times the archive restarted empty (it fell behind the stream, or an entry was too
    /// large, or the node installed a snapshot).
    restarts: u64,
}

/// What the archive holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchiveStatus {
    /// The oldest entry kept (equal to `next` when empty).
    pub first: u64,
    /// The index the next archived entry will have.
    pub next: u64,
    pub restarts: u64,
}

/// A node's stream archive (cheap to clone: clones share it).
#[derive(Clone)]
pub struct StreamArchive {
    inner: Arc<Mutex<Inner>>,
}

impl StreamArchive {
    /// Opens (or creates) the archive in `dir`, keeping about `retention_entries` entries.
    pub fn open(
        dir: &Path,
        cluster_id: u128,
        node_id: u64,
        retention_entries: u64,
    ) -> Result<StreamArchive, String> {
        let mut config = JournalConfig::new(cluster_id, node_id);
        config.fsync = Fsync::Never;
        config.segment_size_bytes_max = ARCHIVE_SEGMENT_BYTES;
        config.payload_size_bytes_max = ARCHIVE_ENTRY_BYTES_MAX;
        config.entries_per_append_max = APPEND_ENTRIES_MAX as u32;
        let (journal, _) = Journal::open(dir, config)
            .map_err(|e| format!("stream archive {}: {e}", dir.display()))?;
        Ok(StreamArchive {
            inner: Arc::new(Mutex::new(Inner {
                journal,
                retention_entries: retention_entries.max(1),
                restarts: 0,
            })),
        })
    }

    pub fn status(&self) -> ArchiveStatus {
        let inner = self.inner.lock().expect("archive lock");
        let next = inner.journal.next_index();
        ArchiveStatus {
            first: inner.journal.first_index().unwrap_or(next),
            next,
            restarts: inner.restarts,
        }
    }

    /// Appends applied entries in log order. Entries below the archive's end are already
    /// there (see the module documentation) and are skipped; an entry beyond it restarts the
    /// archive at that entry.
    pub fn append(&self, entries: &[Arc<CommittedEntry>]) -> Result<(), String> {
        let mut inner = self.inner.lock().expect("archive lock");
        let mut records = Vec::with_capacity(entries.len());
        for e in entries {
            let next = inner.journal.next_index() + records.len() as u64;
            if e.index < next {
                continue;
            }
            let payload = e.encode();
            let too_large = payload.len() > ARCHIVE_ENTRY_BYTES_MAX as usize;
            if e.index > next || too_large {
                inner.flush_records(&mut records)?;
                inner.restart_at(if too_large { e.index + 1 } else { e.index })?;
                if too_large {
                    continue;
                }
            }
            records.push(Entry {
                index: e.index,
                term: 0,
                payload,
            });
            if records.len() == APPEND_ENTRIES_MAX {
                inner.flush_records(&mut records)?;
            }
        }
        inner.flush_records(&mut records)?;
        inner.apply_retention()
    }

    /// Restarts the archive empty so that its next entry is `index` (when it cannot continue
    /// to there without a hole).
    pub fn restart_at(&self, index: u64) -> Result<(), String> {
        self.inner.lock().expect("archive lock").restart_at(index)
    }

    /// Up to `entries_max` (at most [`READ_ENTRIES_MAX`]) archived entries from `from`, in
    /// order and gapless; empty when `from` is at or past the archive's end. `from` older
    /// than the oldest kept is [`StreamError::TooOld`].
    pub fn read(
        &self,
        from: u64,
        entries_max: usize,
    ) -> Result<Vec<Arc<CommittedEntry>>, StreamError> {
        let inner = self.inner.lock().expect("archive lock");
        let next = inner.journal.next_index();
        let first = inner.journal.first_index().unwrap_or(next);
        if from < first {
            return Err(StreamError::TooOld {
                from_index: from,
                oldest_kept: first,
            });
        }
        let end = next.min(from.saturating_add(entries_max.min(READ_ENTRIES_MAX) as u64));
        if from >= end {
            return Ok(Vec::new());
        }
        let records = inner
            .journal
            .read(from..end)
            .map_err(|e| StreamError::Refused(format!("stream archive read: {e}")))?;
        records
            .into_iter()
            .map(|r| {
                CommittedEntry::decode(r.index, &r.payload)
                    .map(Arc::new)
                    .map_err(|e| {
                        StreamError::Refused(format!("stream archive entry {}: {e}", r.index))
                    })
            })
            .collect()
    }
}

impl Inner {
    fn flush_records(&mut self, records: &mut Vec<Entry>) -> Result<(), String> {
        if records.is_empty() {
            return Ok(());
        }
        let r = self.journal.append(records);
        records.clear();
        r.map_err(|e| format!("stream archive append: {e}"))
    }

    fn restart_at(&mut self, index: u64) -> Result<(), String> {
        let next = self.journal.next_index();
        if index == next {
            return Ok(());
        }
        let Some(last) = index.checked_sub(1) else {
            return Err("stream archive: cannot restart before index 0".into());
        };
        self.restarts += 1;
        self.journal
            .reset(ChainPoint {
                index: last,
                term: 0,
                hash: 0,
            })
            .map_err(|e| format!("stream archive restart at {index}: {e}"))
    }

    /// Deletes the oldest segments once the archive holds an eighth more than its retention
    /// (so the purge, which writes the journal's meta file, runs rarely).
    fn apply_retention(&mut self) -> Result<(), String> {
        let next = self.journal.next_index();
        let Some(first) = self.journal.first_index() else {
            return Ok(());
        };
        let keep = self.retention_entries;
        if next - first <= keep + keep / 8 {
            return Ok(());
        }
        self.journal
            .purge_upto(next - 1 - keep)
            .map(|_| ())
            .map_err(|e| format!("stream archive purge: {e}"))
    }
}

/// The thread that copies a node's committed stream into its archive. Dropping it (or
/// [`ArchiveWriter::stop`]) stops it.
pub struct ArchiveWriter {
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ArchiveWriter {
    pub fn start(
        name: String,
        archive: StreamArchive,
        stream: CommittedStream,
    ) -> Result<ArchiveWriter, String> {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        eprintln!("{name}: runtime: {e}");
                        return;
                    }
                };
                rt.block_on(write_loop(&name, archive, stream, stop_rx));
            })
            .map_err(|e| format!("stream archive thread: {e}"))?;
        Ok(ArchiveWriter {
            stop,
            thread: Some(thread),
        })
    }

    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ArchiveWriter {
    fn drop(&mut self) {
        self.halt();
    }
}

async fn write_loop(
    name: &str,
    archive: StreamArchive,
    stream: CommittedStream,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut sub = None;
    let mut batch: VecDeque<Arc<CommittedEntry>> = VecDeque::new();
    let mut failed = false;
    while !*stop.borrow() {
        let Some(live) = sub.as_mut() else {
            let next = archive.status().next;
            match stream.subscribe(next) {
                Ok(s) => sub = Some(s),
                Err(StreamError::TooOld { oldest_kept, .. }) => {
                    if let Err(e) = archive.restart_at(oldest_kept) {
                        eprintln!("{name}: {e}; the archive stops");
                        return;
                    }
                }
                Err(e) => {
                    eprintln!("{name}: {e}; the archive stops");
                    return;
                }
            }
            continue;
        };
        let first = tokio::select! {
            r = live.recv() => r,
            _ = stop.changed() => break,
        };
        match first {
            Ok(e) => batch.push_back(e),
            Err(StreamError::Closed) => break,
            Err(_) => {
                // Cut off (lagged, or a snapshot jump): follow again from the archive's end.
                sub = None;
                continue;
            }
        }
        while batch.len() < APPEND_ENTRIES_MAX {
            match live.try_recv() {
                Ok(Some(e)) => batch.push_back(e),
                Ok(None) => break,
                Err(_) => {
                    sub = None;
                    break;
                }
            }
        }
        let entries: Vec<_> = batch.drain(..).collect();
        match archive.append(&entries) {
            Ok(()) => failed = false,
            Err(e) => {
                // Say it once per failing run; the consumers fall back on the ring.
                if !failed {
                    eprintln!("{name}: {e}");
                }
                failed = true;
            }
        }
        if entries.len() < APPEND_ENTRIES_MAX {
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(WRITE_PAUSE_MS)) => {}
                _ = stop.changed() => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::OutcomeKind;
    use crate::stream::CommittedRequest;
    use proptest::prelude::*;

    fn entry(index: u64, requests: usize) -> CommittedEntry {
        CommittedEntry {
            index,
            requests: (0..requests as u64)
                .map(|k| CommittedRequest {
                    client_id: 7,
                    request_seq: index * 10 + k,
                    kind: if k == 1 {
                        OutcomeKind::Duplicate
                    } else {
                        OutcomeKind::Applied
                    },
                    applied_index: if k == 1 {
                        index.saturating_sub(1)
                    } else {
                        index
                    },
                    events: vec![index as u8; k as usize * 3],
                    audit: None,
                })
                .collect(),
            market_data_flush_ns: index.is_multiple_of(4).then_some(index * 1_000),
        }
    }

    fn kind() -> impl Strategy<Value = OutcomeKind> {
        prop_oneof![
            Just(OutcomeKind::Applied),
            Just(OutcomeKind::Duplicate),
            Just(OutcomeKind::Stale),
            Just(OutcomeKind::Refused),
            any::<u64>().prop_map(|expected| OutcomeKind::Gap { expected }),
            Just(OutcomeKind::Invalid),
        ]
    }

    proptest! {
        #[test]
        fn an_entry_round_trips(
            index in any::<u64>(),
            market_data_flush_ns in proptest::option::of(any::<u64>()),
            requests in proptest::collection::vec(
                (
                    (any::<u64>(), any::<u64>(), kind(), any::<u64>()),
                    proptest::collection::vec(any::<u8>(), 0..40),
                    proptest::option::of(crate::batch::arb_audit()),
                ),
                0..8,
            ),
        ) {
            let e = CommittedEntry {
                index,
                requests: requests
                    .into_iter()
                    .map(|((client_id, request_seq, kind, applied_index), events, audit)| {
                        CommittedRequest { client_id, request_seq, kind, applied_index, events, audit }
                    })
                    .collect(),
                market_data_flush_ns,
            };
            prop_assert_eq!(CommittedEntry::decode(index, &CommittedEntry::encode(&e)).unwrap(), e);
        }

        #[test]
        fn garbage_is_refused_or_decoded_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            if let Ok(e) = CommittedEntry::decode(3, &bytes) {
                prop_assert_eq!(CommittedEntry::encode(&e), bytes);
            }
        }
    }

    #[test]
    fn a_cut_short_entry_is_refused() {
        let bytes = CommittedEntry::encode(&entry(4, 3));
        for cut in 0..bytes.len() {
            assert!(
                CommittedEntry::decode(4, &bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn the_archive_is_a_gapless_run_that_survives_a_reopen_and_restarts_on_a_jump() {
        let dir = tempfile::tempdir().unwrap();
        let a = StreamArchive::open(dir.path(), 9, 1, 1_000).unwrap();
        let first: Vec<_> = (0..50).map(|i| Arc::new(entry(i, 3))).collect();
        a.append(&first).unwrap();
        // Entries already there (a restarted node applying again) are skipped.
        a.append(&first[40..]).unwrap();
        assert_eq!(a.status().next, 50);
        let got = a.read(10, 5).unwrap();
        assert_eq!(
            got.iter().map(|e| (**e).clone()).collect::<Vec<_>>(),
            (10..15).map(|i| entry(i, 3)).collect::<Vec<_>>()
        );
        assert!(a.read(50, 5).unwrap().is_empty());
        drop(a);
        let a = StreamArchive::open(dir.path(), 9, 1, 1_000).unwrap();
        assert_eq!(a.status().first, 0);
        assert_eq!(a.status().next, 50);
        assert_eq!(*a.read(49, 1).unwrap()[0], entry(49, 3));
        // A jump (a snapshot install) restarts the archive: no hole is ever kept.
        a.append(&[Arc::new(entry(70, 1))]).unwrap();
        let s = a.status();
        assert_eq!((s.first, s.next, s.restarts), (70, 71, 1));
        assert_eq!(
            a.read(60, 5).err(),
            Some(StreamError::TooOld {
                from_index: 60,
                oldest_kept: 70
            })
        );
    }
}
