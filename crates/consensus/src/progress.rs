//! What a leader knows of one follower's log and what it has sent it.

use std::collections::VecDeque;

use crate::types::{Index, NodeId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressState {
    /// Where the logs match is unknown: one AppendEntries at a time until one is accepted.
    Probe,
    /// The logs match through `match_index`: up to `append_in_flight_max` AppendEntries go
    /// out without waiting, `next` running ahead of the answers.
    Replicate,
    /// The follower needs entries the leader compacted: it waits for the application's
    /// snapshot (asked for through `Ready::snapshot_wanted`) and its answer.
    Snapshot,
}

#[derive(Clone, Debug)]
pub struct Progress {
    pub id: NodeId,
    pub state: ProgressState,
    /// The follower's log matches the leader's, durably, through here (as last reported; a
    /// follower that restarted with a shorter log lowers it through a rejection).
    pub match_index: Index,
    /// The next index to send.
    pub next: Index,
    /// In the probe state: a probe is out and unanswered.
    pub probe_sent: bool,
    /// In the replicate state: (seq, last index) of each AppendEntries out, oldest first.
    pub in_flight: VecDeque<(u64, Index)>,
    /// The seq the next message to this follower carries.
    pub seq_next: u64,
    /// The highest seq the follower accepted: a rejection older than it is stale.
    pub seq_accepted: u64,
    /// Answers to messages with a lower seq are ignored: they were sent before this leader
    /// took office or before the follower was found to have lost acknowledged entries.
    pub seq_floor: u64,
    /// The tick of the last answer from this follower (check quorum).
    pub heard_at_tick: u64,
    /// In the snapshot state: the tick the snapshot was asked for.
    pub snapshot_asked_at_tick: u64,
}

impl Progress {
    pub fn new(id: NodeId, next: Index, in_flight_max: usize, now_tick: u64) -> Self {
        Progress {
            id,
            state: ProgressState::Probe,
            match_index: 0,
            next,
            probe_sent: false,
            in_flight: VecDeque::with_capacity(in_flight_max),
            seq_next: 1,
            seq_accepted: 0,
            seq_floor: 0,
            heard_at_tick: now_tick,
            snapshot_asked_at_tick: 0,
        }
    }

    /// Back to probing from `next` (after a rejection or a lost pipeline).
    pub fn become_probe(&mut self, next: Index) {
        assert!(next > self.match_index, "a probe starts after the match");
        self.state = ProgressState::Probe;
        self.next = next;
        self.probe_sent = false;
        self.in_flight.clear();
    }

    /// A probe or snapshot was accepted: stream from just after the match.
    pub fn become_replicate(&mut self) {
        self.state = ProgressState::Replicate;
        self.next = self.match_index + 1;
        self.probe_sent = false;
        self.in_flight.clear();
    }

    pub fn become_snapshot(&mut self, now_tick: u64) {
        self.state = ProgressState::Snapshot;
        self.probe_sent = false;
        self.in_flight.clear();
        self.snapshot_asked_at_tick = now_tick;
    }

    /// The follower holds everything through `index`: every message ending there is done.
    pub fn free_through(&mut self, index: Index) {
        while self
            .in_flight
            .front()
            .is_some_and(|&(_, last)| last <= index)
        {
            self.in_flight.pop_front();
        }
    }

    pub fn take_seq(&mut self) -> u64 {
        let seq = self.seq_next;
        self.seq_next += 1;
        seq
    }
}
