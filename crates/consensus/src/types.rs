//! The vocabulary shared by the core, its log store and its messages.

use bytes::Bytes;

/// A member of the replica group. Ids are configured, never assigned at run time.
pub type NodeId = u64;
/// A Raft term: raised by every election, never lowered.
pub type Term = u64;
/// A log position, counted from 1; 0 means "before the first entry".
pub type Index = u64;

/// An entry's identity. Ordered by term first and index second, which is exactly Raft's
/// "at least as up to date" comparison of two logs' last entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogId {
    pub term: Term,
    pub index: Index,
}

impl LogId {
    pub const fn new(term: Term, index: Index) -> Self {
        LogId { term, index }
    }
}

/// What must be durable before any message that depends on it leaves the node: the current
/// term and the vote given in it. Losing either could let a node vote twice in one term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardState {
    pub term: Term,
    pub vote: Option<NodeId>,
}

/// Whether an entry carries the application's payload or is the empty entry a new leader
/// appends to commit the entries of earlier terms (it commits only entries of its own term).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Blank,
    Normal,
}

/// One log entry. The payload is opaque to the core and reference counted, so handing an
/// entry to the store, to several followers' messages and to the application copies no bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub log_id: LogId,
    pub kind: EntryKind,
    pub payload: Bytes,
}

/// Bytes an entry costs in a message besides its payload (term, kind, length), used when
/// batching against `append_bytes_max` so that the codec's sum and the core's agree.
pub const ENTRY_OVERHEAD_BYTES: usize = 8 + 1 + 4;

impl Entry {
    pub fn blank(log_id: LogId) -> Self {
        Entry {
            log_id,
            kind: EntryKind::Blank,
            payload: Bytes::new(),
        }
    }

    pub fn normal(log_id: LogId, payload: Bytes) -> Self {
        Entry {
            log_id,
            kind: EntryKind::Normal,
            payload,
        }
    }

    /// The entry's size in an AppendEntries message.
    pub fn size_bytes(&self) -> usize {
        ENTRY_OVERHEAD_BYTES + self.payload.len()
    }
}

/// A node's part in its group, as the application sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Follower,
    /// Asking whether a quorum would elect it, without raising its term.
    PreCandidate,
    Candidate,
    Leader,
}

/// What the application may show or act on; never persisted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftState {
    pub role: Role,
    pub leader: Option<NodeId>,
    pub term: Term,
}
