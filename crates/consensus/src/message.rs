//! The messages nodes exchange, as plain enums. Their binary form is in `codec`.

use bytes::Bytes;

use crate::types::{Entry, Index, LogId, NodeId, Term};

/// One message between two members of a group. `term` is the sender's current term, except
/// for a pre-vote (the term the sender would campaign at) and a granted pre-vote's answer
/// (that same term, echoed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub from: NodeId,
    pub to: NodeId,
    pub term: Term,
    pub body: Body,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Would you vote for me at `term` given my last entry? Changes nothing at the receiver.
    PreVote {
        last_log_id: LogId,
    },
    PreVoteReply {
        granted: bool,
    },
    Vote {
        last_log_id: LogId,
    },
    VoteReply {
        granted: bool,
    },
    /// Entries `prev.index + 1 ..` (consecutive, so only the first index is implied by
    /// `prev`). `seq` numbers the leader's messages to this follower, so that an answer can
    /// be told from a stale one.
    Append {
        seq: u64,
        prev: LogId,
        commit: Index,
        entries: Vec<Entry>,
    },
    AppendReply {
        seq: u64,
        result: AppendResult,
    },
    /// The leader's liveness and commit index; carries no entries and is not counted in flight.
    Heartbeat {
        commit: Index,
    },
    HeartbeatReply,
    /// A commit index that advanced, sent to a follower that had no entries to receive: a
    /// heartbeat without an answer (the follower's next acknowledgement or heartbeat answer
    /// keeps the leader's lease), so a round costs two messages fewer.
    Commit {
        commit: Index,
    },
    /// The application's snapshot as of `snapshot` (answered with an `AppendReply`).
    Snapshot {
        seq: u64,
        snapshot: LogId,
        data: Bytes,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendResult {
    /// The follower's log matches the leader's through `match_index`, durably.
    Accepted { match_index: Index },
    /// The follower does not hold the entry `prev_index` named (or holds another term
    /// there). `hint_index` is where the leader looks for the match again: the follower's
    /// log's end if it is shorter, else the index before the conflicting term's first entry
    /// in its log (so a divergent tail costs a round trip per term, not per entry). A hint
    /// below what the leader recorded as matching means the follower lost acknowledged
    /// entries (log reversion).
    Rejected {
        prev_index: Index,
        hint_index: Index,
    },
}

impl Message {
    /// Bytes of entries carried (for limits and the benchmark's accounting).
    pub fn entries_bytes(&self) -> usize {
        match &self.body {
            Body::Append { entries, .. } => entries.iter().map(Entry::size_bytes).sum(),
            Body::Snapshot { data, .. } => data.len(),
            _ => 0,
        }
    }
}
