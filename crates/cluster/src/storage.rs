//! openraft's storage over bourse's journal and snapshot store.
//!
//! - [`LogStore`] implements `RaftLogStorage` on a [`Journal`] (the mapping table is in
//!   `bourse_journal`'s lib.rs). A journal record's payload is the bincode of openraft's whole
//!   `Entry` (log id, and a blank, membership or [`LogCommand`] payload, the latter one byte
//!   string in its binary form, see `batch`: the journal keeps a batch's commands exactly as
//!   the clients encoded them). openraft's append
//!   callback fires only when the journal says the entries are durable under its fsync mode:
//!   at once under `always` (append fsyncs) and `never` (the operator chose to count written
//!   as appended), and under `batch` when the flusher thread's fsync has covered them. The
//!   flusher is group commit: it starts an fsync as soon as a callback waits and none is
//!   running, runs it outside the log lock (so appends go on meanwhile), and the appends that
//!   arrived during it are covered by the next one.
//! - The log store keeps the newest appended entries in memory (its tail, bounded by count
//!   and by bytes), shared by its readers: openraft reads every entry back at least three
//!   times on a leader (once per follower to replicate it, once to apply it) and once on a
//!   follower (to apply it), and each read from the journal costs a `pread`, a CRC check, a
//!   copy of the batch and a check of its framing. Reads inside the tail clone the entries
//!   instead (a batch's bytes are shared, not copied); a reader further behind (a lagging
//!   follower) reads the journal as before.
//! - [`StateMachineStore`] implements `RaftStateMachine` on a [`ReplicatedState`], with
//!   snapshots in a [`SnapshotStore`]. Snapshot data = `membership_len u32, bincode of the
//!   StoredMembership, state snapshot bytes`.
//!
//! Journal calls are blocking file I/O made from async functions; they are short (an fsync at
//! most, under `always`) and we accept the stall rather than pay a thread hop per append (on a
//! slow disk `batch` moves the fsync to the flusher thread). A snapshot's write (three fsyncs)
//! is made outside the state's lock and with the runtime told it blocks, so that entries go
//! on being applied while it lasts.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use bourse_engine::EngineConfig;
use bourse_journal::stats::{HistogramReading, LatencyBuckets};
use bourse_journal::{
    ChainPoint, Entry as JournalEntry, Fsync, Journal, LogPosition, Meta,
    SnapshotMeta as JournalSnapshotMeta, SnapshotStore,
};
use openraft::storage::{EntryResponder, IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{EntryPayload, LogState, RaftLogReader, RaftSnapshotBuilder};

use crate::batch::LogCommand;
use crate::state::{Outcome, ReplicatedState};
use crate::stream::{CommittedEntry, CommittedStream, STREAM_ENTRIES_KEPT_DEFAULT};
use crate::{Entry, LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig, Vote};

/// Largest membership record inside a snapshot.
const MEMBERSHIP_SIZE_BYTES_MAX: usize = 1 << 20;

/// A storage failure for openraft, saying what was being done.
fn io_err(doing: &str, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{doing}: {e}"))
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new_term_index(term, index)
}

/// The most entries the log tail keeps (a follower this far behind reads the journal).
pub const LOG_TAIL_ENTRIES_MAX: usize = 1024;
/// The most bytes the log tail keeps, as estimated by [`entry_size_bytes`]: under the default
/// batch limit that is still some forty full batches.
pub const LOG_TAIL_BYTES_MAX: usize = 16 * 1024 * 1024;

/// An entry's estimated size in memory: the entry itself and, for a batch, its bytes.
fn entry_size_bytes(entry: &Entry) -> usize {
    let batch_bytes = match &entry.payload {
        EntryPayload::Normal(LogCommand::Batch(batch)) => batch.bytes().len(),
        _ => 0,
    };
    std::mem::size_of::<Entry>() + batch_bytes
}

/// The newest entries of the log, decoded, in index order with no gap: always a suffix of
/// the journal (`first_index()..journal.next_index()`), so a read inside it returns exactly
/// what the journal would. Every change of the journal's end (append, truncate, purge,
/// reset) updates it under the same lock.
struct LogTail {
    entries: VecDeque<(Arc<Entry>, usize)>,
    bytes: usize,
    /// The bounds: whichever is met first drops the oldest entries.
    entries_max: usize,
    bytes_max: usize,
}

impl LogTail {
    fn new(entries_max: usize, bytes_max: usize) -> LogTail {
        LogTail {
            entries: VecDeque::new(),
            bytes: 0,
            entries_max: entries_max.max(1),
            bytes_max,
        }
    }

    /// The index of the oldest entry kept (None when empty).
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id.index)
    }

    fn next_index(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.log_id.index + 1)
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Adds entries the journal has just appended (contiguous, following the journal's
    /// previous end), then drops the oldest beyond the bounds.
    fn extend(&mut self, appended: Vec<Arc<Entry>>) {
        let Some(first) = appended.first().map(|e| e.log_id.index) else {
            return;
        };
        if self.next_index().is_some_and(|next| next != first) {
            // Cannot happen while the journal appends only at its end; a gap would make the
            // tail lie, so start it anew rather than trust it.
            self.clear();
        }
        for entry in appended {
            let size = entry_size_bytes(&entry);
            self.bytes += size;
            self.entries.push_back((entry, size));
        }
        while self.entries.len() > self.entries_max
            || (self.bytes > self.bytes_max && self.entries.len() > 1)
        {
            let (_, size) = self.entries.pop_front().expect("not empty");
            self.bytes -= size;
        }
    }

    /// Drops every entry after `index` (the journal was truncated there).
    fn truncate_after(&mut self, index: u64) {
        while self
            .entries
            .back()
            .is_some_and(|(e, _)| e.log_id.index > index)
        {
            let (_, size) = self.entries.pop_back().expect("not empty");
            self.bytes -= size;
        }
    }

    /// Drops every entry up to and including `index` (the journal was purged there).
    fn purge_upto(&mut self, index: u64) {
        while self
            .entries
            .front()
            .is_some_and(|(e, _)| e.log_id.index <= index)
        {
            let (_, size) = self.entries.pop_front().expect("not empty");
            self.bytes -= size;
        }
    }

    /// The kept entries of `start..end` (the caller checked that `start` is kept).
    fn range(&self, start: u64, end: u64) -> Vec<Arc<Entry>> {
        let Some(first) = self.first_index() else {
            return Vec::new();
        };
        let skip = start.saturating_sub(first) as usize;
        let take = end.saturating_sub(start.max(first)) as usize;
        self.entries
            .iter()
            .skip(skip)
            .take(take)
            .map(|(e, _)| e.clone())
            .collect()
    }
}

/// Everything the flusher and appenders share.
struct LogInner {
    journal: Journal,
    /// The newest entries, decoded (see [`LogTail`]).
    tail: LogTail,
    /// Callbacks waiting for an fsync (only under `Fsync::Batch`): the last index each covers.
    waiting: VecDeque<(u64, IOFlushed<TypeConfig>)>,
    /// The flusher's wake-up (only under `Fsync::Batch`).
    flush_signal: Option<Arc<FlushSignal>>,
}

impl LogInner {
    /// Fires every waiting callback the journal's durable point has passed.
    fn release_durable(&mut self) {
        let durable = self.journal.durable_next_index();
        while self
            .waiting
            .front()
            .is_some_and(|(last, _)| *last < durable)
        {
            let (_, callback) = self.waiting.pop_front().expect("front exists");
            callback.io_completed(Ok(()));
        }
    }

    fn fail_waiting(&mut self, why: &str) {
        for (_, callback) in self.waiting.drain(..) {
            callback.io_completed(Err(std::io::Error::other(why.to_string())));
        }
    }
}

impl Drop for LogInner {
    fn drop(&mut self) {
        // The last handle on the log is gone: let the flusher thread end now.
        if let Some(signal) = &self.flush_signal {
            signal.close();
        }
    }
}

/// Wakes the flusher thread: `requested` when a callback waits, `closed` when the log is
/// dropped.
#[derive(Default)]
struct FlushSignal {
    state: Mutex<(bool, bool)>,
    wake: Condvar,
}

/// How long the flusher sleeps without a request before it looks again anyway (a safety net
/// only: every append that leaves a callback waiting wakes it at once).
const FLUSHER_IDLE_WAIT_MS: u64 = 100;

impl FlushSignal {
    fn request(&self) {
        self.state.lock().expect("flush signal lock").0 = true;
        self.wake.notify_one();
    }

    fn close(&self) {
        self.state.lock().expect("flush signal lock").1 = true;
        self.wake.notify_one();
    }

    /// Waits for a request (or the idle timeout); false once the log is closed.
    fn wait(&self) -> bool {
        let mut state = self.state.lock().expect("flush signal lock");
        if !state.0 && !state.1 {
            state = self
                .wake
                .wait_timeout(state, Duration::from_millis(FLUSHER_IDLE_WAIT_MS))
                .expect("flush signal lock")
                .0;
        }
        state.0 = false;
        !state.1
    }
}

/// The `batch` flusher: one group-commit fsync at a time, each started as soon as a callback
/// waits. The fsync runs on a dup'ed descriptor without the log lock; a failure poisons the
/// journal (fail-stop) and fails every waiting callback.
fn run_flusher(log: Weak<Mutex<LogInner>>, signal: Arc<FlushSignal>) {
    while signal.wait() {
        let Some(log) = log.upgrade() else { return };
        let prepared = {
            let mut inner = log.lock().expect("log lock");
            if inner.waiting.is_empty() {
                continue;
            }
            match inner.journal.prepare_sync() {
                Ok(Some(prepared)) => prepared,
                Ok(None) => {
                    // Nothing left to sync, or it was synced in place.
                    inner.release_durable();
                    continue;
                }
                Err(e) => {
                    flush_failed(&mut inner, &e);
                    continue;
                }
            }
        };
        let outcome = prepared.run();
        let mut inner = log.lock().expect("log lock");
        match inner.journal.finish_sync(outcome) {
            Ok(()) => {
                inner.release_durable();
                if !inner.waiting.is_empty() {
                    // Appends arrived during the fsync: the next one covers them, at once.
                    signal.request();
                }
            }
            Err(e) => flush_failed(&mut inner, &e),
        }
    }
}

fn flush_failed(inner: &mut LogInner, error: &bourse_journal::JournalError) {
    eprintln!("bourse-cluster: journal fsync failed, this node stops (fail-stop): {error}");
    inner.fail_waiting(&error.to_string());
}

/// openraft's log storage on a journal. Clones share the journal (the reader is a clone).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl LogStore {
    /// A log store whose tail keeps the default bounds ([`LOG_TAIL_ENTRIES_MAX`],
    /// [`LOG_TAIL_BYTES_MAX`]).
    pub fn new(journal: Journal) -> LogStore {
        LogStore::with_tail_bounds(journal, LOG_TAIL_ENTRIES_MAX, LOG_TAIL_BYTES_MAX)
    }

    /// A log store whose tail keeps at most `tail_entries_max` entries and
    /// `tail_bytes_max` bytes of them (at least one entry).
    pub fn with_tail_bounds(
        mut journal: Journal,
        tail_entries_max: usize,
        tail_bytes_max: usize,
    ) -> LogStore {
        let batch = matches!(journal.config().fsync, Fsync::Batch { .. });
        let flush_signal = batch.then(|| Arc::new(FlushSignal::default()));
        if batch {
            // Under `batch` nothing fsyncs while no appends arrive, so a flusher must, or the
            // last appends would never be acknowledged; it also takes the interval's place.
            journal.set_batch_flusher(true);
        }
        let store = LogStore {
            inner: Arc::new(Mutex::new(LogInner {
                journal,
                tail: LogTail::new(tail_entries_max, tail_bytes_max),
                waiting: VecDeque::new(),
                flush_signal: flush_signal.clone(),
            })),
        };
        if let Some(signal) = flush_signal {
            let log = Arc::downgrade(&store.inner);
            std::thread::Builder::new()
                .name("bourse-log-flush".to_string())
                .spawn(move || run_flusher(log, signal))
                .expect("spawn the journal flusher thread");
        }
        store
    }

    /// The last log index and term in the journal, for status reports.
    pub fn last_position(&self) -> Option<(u64, u64)> {
        let inner = self.inner.lock().expect("log lock");
        inner.journal.last_position().map(|p| (p.index, p.term))
    }

    /// The first index and the number of entries the in-memory tail holds (for tests and
    /// status: `(None, 0)` when it is empty).
    pub fn tail_extent(&self) -> (Option<u64>, usize) {
        let inner = self.inner.lock().expect("log lock");
        (inner.tail.first_index(), inner.tail.len())
    }

    /// Entries `start..end` that the log holds: the part inside the in-memory tail cloned
    /// from it, the part before it read from the journal.
    fn read_entries(&self, start: u64, end: u64) -> Result<Vec<Entry>, std::io::Error> {
        let (mut entries, from_tail) = {
            let inner = self.inner.lock().expect("log lock");
            let first = inner
                .journal
                .first_index()
                .unwrap_or(inner.journal.next_index());
            let start = start.max(first);
            let end = end.min(inner.journal.next_index());
            if start >= end {
                return Ok(Vec::new());
            }
            // The tail is a suffix of the journal: everything from its first index on is in
            // it, everything before is read from the journal.
            let tail_first = inner.tail.first_index().unwrap_or(end).max(start);
            let from_journal = if start < tail_first.min(end) {
                Self::read_journal(&inner.journal, start, tail_first.min(end))?
            } else {
                Vec::new()
            };
            let from_tail = if tail_first < end {
                inner.tail.range(tail_first, end)
            } else {
                Vec::new()
            };
            (from_journal, from_tail)
        };
        // Cloned outside the lock, so that appends and other readers need not wait for it.
        entries.extend(from_tail.iter().map(|e| Entry::clone(e)));
        Ok(entries)
    }

    fn read_journal(journal: &Journal, start: u64, end: u64) -> Result<Vec<Entry>, std::io::Error> {
        let mut entries = Vec::with_capacity((end - start) as usize);
        let iter = journal
            .entries(start..end)
            .map_err(|e| io_err("reading the log", e))?;
        for record in iter {
            let record = record.map_err(|e| io_err("reading the log", e))?;
            let entry: Entry = bincode::deserialize(&record.payload)
                .map_err(|e| io_err(&format!("decoding log entry {}", record.index), e))?;
            if entry.log_id.index != record.index || entry.log_id.leader_id.term != record.term {
                return Err(io_err(
                    &format!("reading log entry {}", record.index),
                    "journal record and entry disagree on the log id",
                ));
            }
            entries.push(entry);
        }
        Ok(entries)
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
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
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, std::io::Error> {
        let (start, end) = bounds(&range);
        self.read_entries(start, end)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, std::io::Error> {
        let inner = self.inner.lock().expect("log lock");
        let meta = inner.journal.meta();
        if meta.term == 0 && meta.voted_for.is_none() && !meta.vote_committed {
            return Ok(None);
        }
        // openraft restarts a node whose saved vote is its own committed one as the
        // leader of that term at once, without an election, and goes on numbering entries in
        // that term after its last local one. That is only sound if the local log still holds
        // every entry it created in the term, and it need not: under `fsync = batch` or
        // `never` a leader's entry can reach the followers, be committed by them and be lost
        // from the leader's own tail in a crash. The restarted leader then wrote a different
        // entry under the same log id, which the followers took for the one they had: the
        // replicas diverged and an acknowledged command was lost (the node_faults torn-tail
        // flake). Reading our own vote back as not committed makes the node restart as a
        // follower that must win a new election in a higher term, where the followers' longer
        // logs outvote it, as in the Raft paper's restart rule.
        let own_id = inner.journal.config().node_id;
        let own = meta.voted_for == Some(own_id);
        // openraft 0.10's vote always names a node. A term saved without one (never written
        // by this crate) reads back as a vote for ourselves: we then grant no one else's
        // vote in that term, which is the safe side.
        let voted_for = meta.voted_for.unwrap_or(own_id);
        let mut vote = Vote::new(meta.term, voted_for);
        vote.committed = meta.vote_committed && !own;
        Ok(Some(vote))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, std::io::Error> {
        let inner = self.inner.lock().expect("log lock");
        Ok(LogState {
            last_purged_log_id: inner.journal.last_purged().map(|p| log_id(p.term, p.index)),
            last_log_id: inner
                .journal
                .last_position()
                .map(|p| log_id(p.term, p.index)),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), std::io::Error> {
        let mut inner = self.inner.lock().expect("log lock");
        let meta = Meta {
            term: vote.leader_id.term,
            voted_for: Some(vote.leader_id.voted_for),
            vote_committed: vote.committed,
            committed: inner.journal.meta().committed,
        };
        inner
            .journal
            .save_meta(meta)
            .map_err(|e| io_err("saving the vote", e))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), std::io::Error> {
        let Some(committed) = committed else {
            return Ok(());
        };
        let mut inner = self.inner.lock().expect("log lock");
        inner
            .journal
            .save_committed(LogPosition {
                index: committed.index,
                term: committed.leader_id.term,
            })
            .map_err(|e| io_err("saving the commit point", e))
    }

    /// The journal's commit point: committed entries openraft re-applies from the local log
    /// at start-up. It never lies past the log (recovery refuses a log that ends before it,
    /// or under `fsync = never` stops vouching for what it lost).
    async fn read_committed(&mut self) -> Result<Option<LogId>, std::io::Error> {
        let inner = self.inner.lock().expect("log lock");
        let committed = inner.journal.committed().filter(|c| {
            let first = inner.journal.last_purged().map_or(0, |p| p.index + 1);
            c.index >= first && Some(c.index) <= inner.journal.last_index()
        });
        Ok(committed.map(|c| log_id(c.term, c.index)))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), std::io::Error>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut records = Vec::new();
        let mut decoded = Vec::new();
        for entry in entries {
            let payload = bincode::serialize(&entry)
                .map_err(|e| io_err(&format!("encoding log entry {}", entry.log_id), e))?;
            records.push(JournalEntry {
                index: entry.log_id.index,
                term: entry.log_id.leader_id.term,
                payload,
            });
            // Kept for the tail: openraft hands the entries over, so this costs no copy.
            decoded.push(Arc::new(entry));
        }
        let mut inner = self.inner.lock().expect("log lock");
        let Some(last) = records.last().map(|r| r.index) else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        if let Err(e) = inner.journal.append(&records) {
            // What the journal holds past its old end is unknown now: read only the journal.
            inner.tail.clear();
            // The journal is poisoned now (fail-stop): it refuses every later write, so this
            // node stops acknowledging; openraft shuts the node down on this error. Say so
            // where the operator looks, naming the file and the operating system's error.
            eprintln!("bourse-cluster: journal append failed, this node stops (fail-stop): {e}");
            callback.io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(io_err("appending to the log", e));
        }
        // Readable from the tail once the journal has them (a read of them from the journal
        // would equally return them before they are durable under `batch`).
        inner.tail.extend(decoded);
        match inner.journal.config().fsync {
            Fsync::Always | Fsync::Never => callback.io_completed(Ok(())),
            Fsync::Batch { .. } => {
                inner.waiting.push_back((last, callback));
                inner.release_durable();
                if !inner.waiting.is_empty() {
                    if let Some(signal) = &inner.flush_signal {
                        signal.request();
                    }
                }
            }
        }
        Ok(())
    }

    /// Keeps the log up to `last_log_id` and drops what follows (a conflicting suffix).
    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), std::io::Error> {
        let mut inner = self.inner.lock().expect("log lock");
        let Some(keep_last) = last_log_id.map(|l| l.index) else {
            return Err(io_err(
                "truncating the log",
                "refusing to truncate the whole log (a conflict at index 0)",
            ));
        };
        let result = inner.journal.truncate_after(keep_last);
        match result {
            Ok(()) => inner.tail.truncate_after(keep_last),
            // The journal's end is unknown after a failed cut: read only the journal.
            Err(_) => inner.tail.clear(),
        }
        result.map_err(|e| io_err("truncating the log", e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), std::io::Error> {
        let mut inner = self.inner.lock().expect("log lock");
        let result = if log_id.index < inner.journal.next_index() {
            let purged = inner.journal.purge_upto(log_id.index).map(|_| ());
            // The tail drops what the journal no longer serves (reads start at its first
            // index, whatever segment files remain).
            inner.tail.purge_upto(log_id.index);
            purged
        } else {
            // An installed snapshot lies beyond this log: restart the log after it. Chain
            // hashes are this node's own file chain, so a fresh point starts it anew.
            inner.tail.clear();
            inner.journal.reset(ChainPoint {
                index: log_id.index,
                term: log_id.leader_id.term,
                hash: 0,
            })
        };
        if result.is_err() {
            inner.tail.clear();
        }
        result.map_err(|e| io_err("purging the log", e))
    }
}

/// Divergence alarms raised by hash checks; shared with the node for status reports.
pub type Alarm = Arc<Mutex<Option<String>>>;

struct SmInner {
    state: ReplicatedState,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// Its own lock: a snapshot is written (three fsyncs) outside the state's lock, so that
    /// applying goes on meanwhile.
    snapshots: Arc<Mutex<SnapshotStore>>,
    cluster_id: u128,
    checkpoint_every_entries: u64,
    alarm: Alarm,
    /// Every applied entry is published here, in log order.
    stream: CommittedStream,
    /// Time to build a snapshot's bytes (state encoding, hash, framing); shared with the store.
    snapshot_build: Arc<LatencyBuckets>,
}

/// openraft's state machine: the replicated state and its snapshots.
#[derive(Clone)]
pub struct StateMachineStore {
    inner: Arc<tokio::sync::Mutex<SmInner>>,
    /// The same stream as `inner.stream`, reachable without the state's lock.
    stream: CommittedStream,
    /// The same figures as `inner.snapshot_build`, readable without the state's lock.
    snapshot_build: Arc<LatencyBuckets>,
}

/// What a state-machine store reports to the node's status.
#[derive(Clone, Copy, Debug, Default)]
pub struct AppliedStatus {
    pub last_applied_index: Option<u64>,
    pub state_hash: u64,
    pub commands_applied: u64,
    /// The engine's own count of applied commands: part of the replicated state, so it
    /// survives restarts and tells whether each acknowledged command was applied exactly once.
    pub engine_commands: u64,
    pub hash_checks_passed: u64,
    /// The newest hash checkpoint (log index, state hash).
    pub checkpoint: Option<(u64, u64)>,
}

fn encode_snapshot_data(membership: &StoredMembership, state: &[u8]) -> Vec<u8> {
    let m = bincode::serialize(membership).expect("membership encodes");
    let mut data = Vec::with_capacity(4 + m.len() + state.len());
    data.extend_from_slice(&(m.len() as u32).to_le_bytes());
    data.extend_from_slice(&m);
    data.extend_from_slice(state);
    data
}

fn decode_snapshot_data(data: &[u8]) -> Result<(StoredMembership, &[u8]), String> {
    let len = data
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("snapshot shorter than its header")?;
    if len > MEMBERSHIP_SIZE_BYTES_MAX || data.len() < 4 + len {
        return Err("snapshot membership length out of range".to_string());
    }
    let membership =
        bincode::deserialize(&data[4..4 + len]).map_err(|e| format!("snapshot membership: {e}"))?;
    Ok((membership, &data[4 + len..]))
}

impl StateMachineStore {
    /// Opens the state machine, restoring the newest valid snapshot in `snapshots` if any.
    pub fn open(
        snapshots: SnapshotStore,
        cluster_id: u128,
        engine: EngineConfig,
        checkpoint_every_entries: u64,
        alarm: Alarm,
    ) -> Result<StateMachineStore, String> {
        let latest = snapshots.latest().map_err(|e| e.to_string())?;
        for skipped in &latest.skipped {
            eprintln!(
                "bourse-cluster: skipped damaged snapshot {}: {}",
                skipped.file.display(),
                skipped.reason
            );
        }
        let (state, last_applied, membership) = match latest.snapshot {
            Some(snap) => {
                let (membership, state_bytes) = decode_snapshot_data(&snap.data)?;
                let state = ReplicatedState::restore(state_bytes, checkpoint_every_entries)
                    .map_err(|e| format!("snapshot {}: {e}", snap.file.display()))?;
                let hash = state.state_hash();
                if hash != snap.meta.state_hash {
                    return Err(format!(
                        "snapshot {}: state hash {hash:016x} differs from the recorded {:016x}",
                        snap.file.display(),
                        snap.meta.state_hash
                    ));
                }
                (
                    state,
                    Some(log_id(snap.meta.last_term, snap.meta.last_index)),
                    membership,
                )
            }
            None => (
                ReplicatedState::new(engine, checkpoint_every_entries),
                None,
                StoredMembership::default(),
            ),
        };
        let stream = CommittedStream::new(
            STREAM_ENTRIES_KEPT_DEFAULT,
            last_applied.map_or(0, |l| l.index + 1),
        );
        let snapshot_build = Arc::new(LatencyBuckets::default());
        Ok(StateMachineStore {
            stream: stream.clone(),
            snapshot_build: snapshot_build.clone(),
            inner: Arc::new(tokio::sync::Mutex::new(SmInner {
                stream,
                snapshot_build,
                state,
                last_applied,
                membership,
                snapshots: Arc::new(Mutex::new(snapshots)),
                cluster_id,
                checkpoint_every_entries,
                alarm,
            })),
        })
    }

    pub async fn status(&self) -> AppliedStatus {
        let inner = self.inner.lock().await;
        AppliedStatus {
            state_hash: inner.state.state_hash(),
            ..inner.brief_status()
        }
    }

    /// As [`StateMachineStore::status`] without hashing the state (`state_hash` is 0): a few
    /// reads under the lock, cheap enough to poll often; `checkpoint` has the newest hash.
    pub async fn status_brief(&self) -> AppliedStatus {
        self.inner.lock().await.brief_status()
    }

    /// Times to build a snapshot's bytes, over `bourse_journal::FSYNC_BUCKETS_NS`.
    pub fn snapshot_build_times(&self) -> HistogramReading {
        self.snapshot_build.read()
    }

    /// The stream of applied entries (see `stream`).
    pub fn stream(&self) -> &CommittedStream {
        &self.stream
    }

    /// The last applied request sequence number of `client_id` (0 if it has none).
    pub async fn last_seq(&self, client_id: u64) -> u64 {
        self.inner
            .lock()
            .await
            .state
            .last_seq(client_id)
            .unwrap_or(0)
    }

    /// The newest hash checkpoint, for the leader to put in a hash entry.
    pub async fn last_checkpoint(&self) -> Option<(u64, u64)> {
        self.inner.lock().await.state.last_checkpoint()
    }

    /// The core's instruments as of the last applied entry (`crate::query`).
    pub async fn instruments_answer(&self) -> crate::query::InstrumentsAnswer {
        let inner = self.inner.lock().await;
        let next_index = inner.last_applied.map_or(0, |l| l.index + 1);
        crate::query::InstrumentsAnswer::of_state(&inner.state, next_index)
    }

    /// The answer to an admin service's query, as of the last applied entry
    /// (`crate::query::Query`).
    pub async fn query_answer(&self, query: crate::query::Query) -> crate::query::QueryAnswer {
        let inner = self.inner.lock().await;
        let next_index = inner.last_applied.map_or(0, |l| l.index + 1);
        query.answer(inner.state.engine(), next_index)
    }

    /// Runs `f` on the state (tests and tools).
    pub async fn with_state<R>(&self, f: impl FnOnce(&ReplicatedState) -> R) -> R {
        f(&self.inner.lock().await.state)
    }

    /// Keeps the market data numbering in a fresh state (see
    /// `ReplicatedState::enable_marketdata`); call before openraft applies anything.
    pub async fn enable_marketdata(&self, config: &bourse_marketdata::PublisherConfig) {
        self.inner.lock().await.state.enable_marketdata(config);
    }

    /// Hands every market data packet the state numbers from now on to `handoff` (the
    /// node's market data thread); false if the state keeps no numbering. A snapshot
    /// installed later keeps the hand-off (`crate::marketdata::carry_handoff`).
    pub async fn attach_marketdata(&self, handoff: crate::marketdata::PacketHandoff) -> bool {
        match self.inner.lock().await.state.marketdata_mut() {
            Some(md) => {
                md.attach(handoff);
                true
            }
            None => false,
        }
    }
}

impl SmInner {
    fn brief_status(&self) -> AppliedStatus {
        AppliedStatus {
            last_applied_index: self.last_applied.map(|l| l.index),
            state_hash: 0,
            commands_applied: self.state.commands_applied(),
            engine_commands: self.state.engine().counters().commands,
            hash_checks_passed: self.state.hash_checks_passed(),
            checkpoint: self.state.last_checkpoint(),
        }
    }

    /// The snapshot of the state as applied now, and what to write to the store (nothing
    /// before the first entry is applied). Cheap: the state's bytes, made in memory.
    fn prepare_snapshot(&mut self) -> (Snapshot, Option<JournalSnapshotMeta>) {
        let build_started = std::time::Instant::now();
        let state = self.state.snapshot();
        let state_hash = xxhash_rust::xxh3::xxh3_64(&state);
        let data = encode_snapshot_data(&self.membership, &state);
        self.snapshot_build
            .observe_ns((build_started.elapsed().as_nanos() as u64).max(1));
        let to_write = self.last_applied.map(|l| JournalSnapshotMeta {
            cluster_id: self.cluster_id,
            last_index: l.index,
            last_term: l.leader_id.term,
            state_hash,
            chain_hash: 0,
        });
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
        };
        let snapshot = Snapshot {
            meta,
            snapshot: data,
        };
        (snapshot, to_write)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = Vec<u8>;

    /// Takes the state's bytes under the state's lock, then writes them (a file, its fsync,
    /// a rename and the directory's fsync) without it: on a slow disk the
    /// write takes hundreds of milliseconds, during which entries go on being applied and
    /// answered (they stopped for ~0.6 s each snapshot under a leader's slow disk when the write
    /// held the lock). Returns once the snapshot is durable, before openraft may purge the log
    /// below it.
    async fn build_snapshot(&mut self) -> Result<Snapshot, std::io::Error> {
        let (snapshot, to_write, store) = {
            let mut inner = self.inner.lock().await;
            let (snapshot, to_write) = inner.prepare_snapshot();
            (snapshot, to_write, Arc::clone(&inner.snapshots))
        };
        let Some(meta) = to_write else {
            return Ok(snapshot);
        };
        let write = || {
            store
                .lock()
                .expect("snapshot store lock")
                .write(meta, &snapshot.snapshot)
                .map_err(|e| io_err("writing a snapshot", e))
        };
        // On a multi-thread runtime (a running node) the worker's other tasks move to another
        // thread meanwhile; the simulation's current-thread runtime writes in place, which
        // keeps its runs a function of their seed.
        match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(write),
            _ => write(),
        }?;
        Ok(snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), std::io::Error> {
        let inner = self.inner.lock().await;
        Ok((inner.last_applied, inner.membership.clone()))
    }

    /// Applies committed entries in log order and answers each one's responder (the leader's
    /// client write) with its outcomes once the entry is applied and published.
    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), std::io::Error>
    where
        Strm: futures_util::Stream<Item = Result<EntryResponder<TypeConfig>, std::io::Error>>
            + Unpin
            + Send,
    {
        use futures_util::StreamExt;
        let mut inner = self.inner.lock().await;
        let inner = &mut *inner;
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            assert!(
                inner
                    .last_applied
                    .is_none_or(|l| l.index < entry.log_id.index),
                "entries are applied in log order, once"
            );
            inner.last_applied = Some(entry.log_id);
            // Per entry: the answers (no events) go to the response, the requests with their
            // events move into the stream.
            let mut outcomes = Vec::new();
            let mut committed = Vec::new();
            let mut flush_ns = None;
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m);
                }
                EntryPayload::Normal(LogCommand::Batch(batch)) => {
                    // The events go to the stream only; the answers name the entry.
                    inner
                        .state
                        .apply_batch(&batch, entry.log_id.index, &mut committed);
                    outcomes = committed.iter().map(Outcome::from).collect();
                }
                EntryPayload::Normal(LogCommand::MarketDataFlush { now_ns }) => {
                    inner.state.marketdata_flush(now_ns);
                    flush_ns = Some(now_ns);
                }
                EntryPayload::Normal(LogCommand::HashCheck { index, state_hash }) => {
                    if let Err(divergence) = inner.state.check_hash(index, state_hash) {
                        let text = format!("ALARM: {divergence}; taking this node out");
                        eprintln!("bourse-cluster: {text}");
                        *inner.alarm.lock().expect("alarm lock") = Some(text.clone());
                        // A storage error is fatal to openraft: the node stops serving.
                        return Err(io_err(&format!("applying entry {}", entry.log_id), text));
                    }
                }
            }
            inner.state.entry_applied(entry.log_id.index);
            inner.stream.publish(CommittedEntry {
                index: entry.log_id.index,
                requests: committed,
                market_data_flush_ns: flush_ns,
            });
            if let Some(responder) = responder {
                responder.send(outcomes);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> StateMachineStore {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Vec<u8>,
    ) -> Result<(), std::io::Error> {
        let mut inner = self.inner.lock().await;
        let data = snapshot;
        let bad = |why: String| {
            let upto = meta
                .last_log_id
                .map_or("nothing".to_string(), |l| l.to_string());
            io_err(&format!("installing the snapshot up to {upto}"), why)
        };
        let (membership, state_bytes) = decode_snapshot_data(&data).map_err(bad)?;
        let mut state = ReplicatedState::restore(state_bytes, inner.checkpoint_every_entries)
            .map_err(|e| bad(e.to_string()))?;
        crate::marketdata::carry_handoff(&mut inner.state, &mut state);
        inner.state = state;
        inner.membership = membership;
        inner.last_applied = meta.last_log_id;
        inner
            .stream
            .reset(meta.last_log_id.map_or(0, |l| l.index + 1));
        if let Some(last) = meta.last_log_id {
            let state_hash = xxhash_rust::xxh3::xxh3_64(state_bytes);
            let cluster_id = inner.cluster_id;
            inner
                .snapshots
                .lock()
                .expect("snapshot store lock")
                .write(
                    JournalSnapshotMeta {
                        cluster_id,
                        last_index: last.index,
                        last_term: last.leader_id.term,
                        state_hash,
                        chain_hash: 0,
                    },
                    &data,
                )
                .map_err(|e| io_err("writing the installed snapshot", e))?;
        }
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, std::io::Error> {
        let inner = self.inner.lock().await;
        let latest = inner
            .snapshots
            .lock()
            .expect("snapshot store lock")
            .latest()
            .map_err(|e| io_err("reading the newest snapshot", e))?;
        let Some(snap) = latest.snapshot else {
            return Ok(None);
        };
        let (membership, _) = decode_snapshot_data(&snap.data)
            .map_err(|why| io_err("reading the newest snapshot", why))?;
        Ok(Some(Snapshot {
            meta: SnapshotMeta {
                last_log_id: Some(log_id(snap.meta.last_term, snap.meta.last_index)),
                last_membership: membership,
            },
            snapshot: snap.data,
        }))
    }
}

/// The journal record payload of a normal entry at `(term, index)` carrying `command`, exactly
/// as [`LogStore`] writes it (for tools and benchmarks that build a journal without a group).
pub fn entry_payload(term: u64, index: u64, command: LogCommand) -> Vec<u8> {
    let entry: Entry = Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(command),
    };
    bincode::serialize(&entry).expect("an entry encodes")
}

/// The application command in a journal record's payload (None for blank and membership
/// entries): what replay and operator tools need without openraft's types.
pub fn entry_command(payload: &[u8]) -> Result<Option<LogCommand>, String> {
    let entry: Entry = bincode::deserialize(payload).map_err(|e| e.to_string())?;
    Ok(match entry.payload {
        EntryPayload::Normal(command) => Some(command),
        _ => None,
    })
}
