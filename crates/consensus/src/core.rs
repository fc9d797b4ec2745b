//! The Raft state machine itself: no clock, no I/O, no threads. The node's loop drives it:
//!
//! 1. `tick()` once per tick of the node's clock, `step(message)` for each message received,
//!    `propose(payload)` for each request (the leader only), `persisted(log_id)` when the
//!    log became durable through `log_id`;
//! 2. `ready(&mut ready)`, then, in this order: persist `ready.hard_state` durably; install
//!    `ready.snapshot_install` durably; send `ready.messages` (the leader's AppendEntries may
//!    leave before its own entries are durable, since it counts itself only once they are);
//!    start syncing the log through `ready.sync_to` and call `persisted` when done; apply
//!    `ready.committed` in order; answer `ready.snapshot_wanted` with `send_snapshot`.

use bytes::Bytes;

use crate::config::Config;
use crate::message::{AppendResult, Body, Message};
use crate::progress::{Progress, ProgressState};
use crate::rng::Rng;
use crate::store::LogStore;
use crate::types::{Entry, HardState, Index, LogId, NodeId, Role, SoftState, Term};

/// Why `propose` refused a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProposeError {
    /// Only the leader takes proposals; `leader` is the one this node follows, if any.
    NotLeader {
        leader: Option<NodeId>,
    },
    TooLarge {
        len: usize,
        max: usize,
    },
    /// `uncommitted_entries_max` entries wait for a quorum already.
    Busy {
        uncommitted: u64,
    },
}

/// Why `step` refused a message (it changes nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepError {
    NotForMe { to: NodeId },
    FromSelf,
    UnknownSender { from: NodeId },
}

/// What the node must do after a round of inputs; see the module documentation for the order.
/// The node keeps one and passes it to every `ready` call, so its vectors are reused.
#[derive(Debug)]
pub struct Ready {
    pub soft: SoftState,
    pub hard_state: Option<HardState>,
    pub snapshot_install: Option<(LogId, Bytes)>,
    pub messages: Vec<Message>,
    pub sync_to: Option<LogId>,
    pub committed: Vec<Entry>,
    pub snapshot_wanted: Vec<NodeId>,
}

impl Default for Ready {
    fn default() -> Self {
        Ready {
            soft: SoftState {
                role: Role::Follower,
                leader: None,
                term: 0,
            },
            hard_state: None,
            snapshot_install: None,
            messages: Vec::new(),
            sync_to: None,
            committed: Vec::new(),
            snapshot_wanted: Vec::new(),
        }
    }
}

impl Ready {
    /// Nothing to persist, send or apply.
    pub fn is_empty(&self) -> bool {
        self.hard_state.is_none()
            && self.snapshot_install.is_none()
            && self.messages.is_empty()
            && self.sync_to.is_none()
            && self.committed.is_empty()
            && self.snapshot_wanted.is_empty()
    }

    fn clear(&mut self) {
        self.hard_state = None;
        self.snapshot_install = None;
        self.messages.clear();
        self.sync_to = None;
        self.committed.clear();
        self.snapshot_wanted.clear();
    }
}

pub struct Core<S: LogStore> {
    config: Config,
    store: S,
    rng: Rng,

    term: Term,
    vote: Option<NodeId>,
    hard_state_dirty: bool,
    role: Role,
    leader: Option<NodeId>,

    /// Highest index known committed; never falls.
    commit: Index,
    /// Highest index handed to the application in a `Ready` (or covered by a snapshot).
    applied: Index,
    /// The log is durable through here (reported by `persisted`, lowered by truncation).
    durable: Index,
    /// The last entry appended since the previous `Ready`, for `Ready::sync_to`.
    sync_pending: Option<LogId>,
    /// As follower: this node's log equals the current term's leader's through here (set by
    /// the AppendEntries it accepted in this term). Acknowledgements and the commit index a
    /// follower adopts never pass it, because entries after it may be another leader's.
    matched_upto: Index,
    /// As follower: the newest seq accepted from the current leader, echoed by deferred acks.
    leader_seq: u64,
    /// As follower: an acknowledgement waits for the log to become durable.
    ack_owed: bool,
    /// The application's newest snapshot (taken or installed).
    snapshot: LogId,

    now_tick: u64,
    election_elapsed_ticks: u64,
    election_timeout_ticks: u64,
    heartbeat_elapsed_ticks: u64,
    leader_heard_at_tick: u64,
    /// Tallies of the current (pre-)election: bit `position(voter)`.
    granted: u32,
    refused: u32,

    /// One per voter in `config.voters` order; this node's own entry is unused.
    progress: Vec<Progress>,
    commit_to_broadcast: bool,
    messages: Vec<Message>,
    snapshot_wanted: Vec<NodeId>,
    install: Option<(LogId, Bytes)>,
    scratch_match: Vec<Index>,
}

impl<S: LogStore> Core<S> {
    /// A node starting (or restarting) from what it persisted: its hard state, its log and
    /// its newest snapshot's id (`LogId::default()` if none). `seed` seeds the election
    /// timeouts. A log that does not hold the snapshot's last entry is restarted after it.
    pub fn new(
        config: Config,
        hard_state: HardState,
        mut store: S,
        snapshot: LogId,
        seed: u64,
    ) -> Self {
        if let Err(e) = config.validate() {
            panic!("consensus config refused: {e:?}");
        }
        // Entries are compacted only below a durable snapshot, so a log compacted past the
        // snapshot it is given was paired with the wrong one.
        assert!(
            store.base().index <= snapshot.index,
            "the log was compacted past the snapshot"
        );
        if store.term(snapshot.index) != Some(snapshot.term) {
            // The log ends before the snapshot or disagrees with it there: its entries up to the
            // snapshot are committed and covered by it, and any after it are not yet known to
            // follow from it, so the log restarts after the snapshot.
            store.reset(snapshot);
        }
        assert!(
            hard_state.term >= store.last_log_id().term,
            "a log holds an entry of a term above the node's own"
        );
        let last = store.last_log_id().index;
        let in_flight_max = config.append_in_flight_max;
        let progress = config
            .voters
            .iter()
            .map(|&id| Progress::new(id, last + 1, in_flight_max, 0))
            .collect();
        let voters = config.voters.len();
        let mut core = Core {
            rng: Rng::new(seed),
            store,
            term: hard_state.term,
            vote: hard_state.vote,
            hard_state_dirty: false,
            role: Role::Follower,
            leader: None,
            commit: snapshot.index,
            applied: snapshot.index,
            durable: last,
            sync_pending: None,
            matched_upto: snapshot.index,
            leader_seq: 0,
            ack_owed: false,
            snapshot,
            now_tick: 0,
            election_elapsed_ticks: 0,
            election_timeout_ticks: 0,
            heartbeat_elapsed_ticks: 0,
            leader_heard_at_tick: 0,
            granted: 0,
            refused: 0,
            progress,
            commit_to_broadcast: false,
            messages: Vec::with_capacity(4 * voters),
            snapshot_wanted: Vec::with_capacity(voters),
            install: None,
            scratch_match: Vec::with_capacity(voters),
            config,
        };
        core.reset_election_timer();
        core
    }

    // ----- accessors -----

    pub fn id(&self) -> NodeId {
        self.config.id
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn soft_state(&self) -> SoftState {
        SoftState {
            role: self.role,
            leader: self.leader,
            term: self.term,
        }
    }

    pub fn hard_state(&self) -> HardState {
        HardState {
            term: self.term,
            vote: self.vote,
        }
    }

    pub fn commit_index(&self) -> Index {
        self.commit
    }

    pub fn applied_index(&self) -> Index {
        self.applied
    }

    pub fn durable_index(&self) -> Index {
        self.durable
    }

    pub fn last_log_id(&self) -> LogId {
        self.store.last_log_id()
    }

    pub fn snapshot_id(&self) -> LogId {
        self.snapshot
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Ticks counted since start.
    pub fn now_tick(&self) -> u64 {
        self.now_tick
    }

    /// The leader's view of a follower (`None` for this node or when not leading).
    pub fn progress(&self, id: NodeId) -> Option<&Progress> {
        if self.role != Role::Leader || id == self.config.id {
            return None;
        }
        self.config.position(id).map(|p| &self.progress[p])
    }

    // ----- inputs -----

    /// One tick of the node's clock.
    pub fn tick(&mut self) {
        self.now_tick += 1;
        if self.role == Role::Leader {
            self.heartbeat_elapsed_ticks += 1;
            if self.heartbeat_elapsed_ticks >= self.config.heartbeat_ticks {
                self.heartbeat_elapsed_ticks = 0;
                self.broadcast_heartbeat();
            }
            if !self.quorum_heard() {
                // Check quorum: a leader cut off from a quorum stops claiming leadership
                // within its lease, so that clients go elsewhere and its soft state says so.
                self.become_follower(self.term, None);
                return;
            }
            let retry_ticks = self.config.snapshot_retry_ticks;
            for pr in self.progress.iter_mut() {
                if pr.id != self.config.id
                    && pr.state == ProgressState::Snapshot
                    && self.now_tick - pr.snapshot_asked_at_tick >= retry_ticks
                {
                    pr.snapshot_asked_at_tick = self.now_tick;
                    self.snapshot_wanted.push(pr.id);
                }
            }
        } else {
            self.election_elapsed_ticks += 1;
            if self.election_elapsed_ticks >= self.election_timeout_ticks {
                self.start_pre_vote();
            }
        }
    }

    /// Appends a payload to the leader's log; it is sent at the next `ready`, so that what
    /// is proposed between two calls goes out together.
    pub fn propose(&mut self, payload: Bytes) -> Result<Index, ProposeError> {
        if self.role != Role::Leader {
            return Err(ProposeError::NotLeader {
                leader: self.leader,
            });
        }
        if payload.len() > self.config.entry_bytes_max {
            return Err(ProposeError::TooLarge {
                len: payload.len(),
                max: self.config.entry_bytes_max,
            });
        }
        let last = self.store.last_log_id();
        let uncommitted = last.index - self.commit;
        if uncommitted >= self.config.uncommitted_entries_max {
            return Err(ProposeError::Busy { uncommitted });
        }
        let log_id = LogId::new(self.term, last.index + 1);
        self.store.append(Entry::normal(log_id, payload));
        self.sync_pending = Some(log_id);
        Ok(log_id.index)
    }

    /// The log is durable through `log_id` (the node synced what an earlier `Ready::sync_to`
    /// named). A log id the log no longer holds (truncated since) is ignored.
    pub fn persisted(&mut self, log_id: LogId) {
        assert!(
            log_id.term <= self.term,
            "persisted an entry of a future term"
        );
        if log_id.index <= self.durable || self.store.term(log_id.index) != Some(log_id.term) {
            return;
        }
        self.durable = log_id.index;
        match self.role {
            Role::Leader => self.maybe_commit(),
            _ => {
                if self.ack_owed {
                    if let Some(leader) = self.leader {
                        self.send_ack(leader, self.leader_seq);
                    }
                }
            }
        }
    }

    /// The application took a snapshot of its state through `index` (durably): entries up to
    /// `index - log_kept_below_snapshot_entries` are dropped from the log.
    pub fn snapshot_taken(&mut self, index: Index) {
        assert!(
            index <= self.applied,
            "a snapshot covers applied entries only: {index} > {}",
            self.applied
        );
        if index <= self.snapshot.index {
            return;
        }
        let term = self
            .store
            .term(index)
            .expect("an applied entry above the last snapshot is in the log");
        self.snapshot = LogId::new(term, index);
        let compact_to = index.saturating_sub(self.config.log_kept_below_snapshot_entries);
        if compact_to > self.store.base().index {
            self.store.compact_to(compact_to);
        }
        self.durable = self.durable.max(self.store.base().index);
    }

    /// Sends `data`, the application's snapshot through `snapshot`, to a follower that
    /// `Ready::snapshot_wanted` named. Returns false (sending nothing) if this node no longer
    /// leads, the follower no longer needs it, or the snapshot is not one the log continues.
    pub fn send_snapshot(&mut self, to: NodeId, snapshot: LogId, data: Bytes) -> bool {
        assert!(to != self.config.id, "a leader sends no snapshot to itself");
        if self.role != Role::Leader
            || snapshot.index < self.store.base().index
            || snapshot.index > self.applied
        {
            return false;
        }
        if self
            .store
            .term(snapshot.index)
            .is_some_and(|t| t != snapshot.term)
        {
            return false;
        }
        let Some(position) = self.config.position(to) else {
            return false;
        };
        let pr = &mut self.progress[position];
        if pr.state != ProgressState::Snapshot {
            return false;
        }
        pr.snapshot_asked_at_tick = self.now_tick;
        let seq = pr.take_seq();
        self.messages.push(Message {
            from: self.config.id,
            to,
            term: self.term,
            body: Body::Snapshot {
                seq,
                snapshot,
                data,
            },
        });
        true
    }

    /// One message from a peer.
    pub fn step(&mut self, message: Message) -> Result<(), StepError> {
        if message.to != self.config.id {
            return Err(StepError::NotForMe { to: message.to });
        }
        if message.from == self.config.id {
            return Err(StepError::FromSelf);
        }
        if self.config.position(message.from).is_none() {
            return Err(StepError::UnknownSender { from: message.from });
        }
        let Message {
            from, term, body, ..
        } = message;
        match body {
            Body::PreVote { last_log_id } => self.on_pre_vote(from, term, last_log_id),
            Body::PreVoteReply { granted } => self.on_pre_vote_reply(from, term, granted),
            Body::Vote { last_log_id } => self.on_vote(from, term, last_log_id),
            Body::VoteReply { granted } => self.on_vote_reply(from, term, granted),
            Body::Append {
                seq,
                prev,
                commit,
                entries,
            } => self.on_append(from, term, seq, prev, commit, entries),
            Body::AppendReply { seq, result } => self.on_append_reply(from, term, seq, result),
            Body::Heartbeat { commit } => self.on_heartbeat(from, term, commit),
            Body::HeartbeatReply => self.on_heartbeat_reply(from, term),
            Body::Commit { commit } => {
                self.on_commit(from, term, commit);
            }
            Body::Snapshot {
                seq,
                snapshot,
                data,
            } => self.on_snapshot(from, term, seq, snapshot, data),
        }
        Ok(())
    }

    /// Collects what the node must do (see the module documentation). `ready` is cleared
    /// first; its vectors keep their capacity from call to call.
    pub fn ready(&mut self, ready: &mut Ready) {
        ready.clear();
        if self.role == Role::Leader {
            for position in 0..self.progress.len() {
                if self.progress[position].id == self.config.id {
                    continue;
                }
                let sent = self.send_appends(position);
                if !sent && self.commit_to_broadcast {
                    // A commit index that advanced reaches a follower with no entries to
                    // send at once, rather than at the next heartbeat.
                    let to = self.progress[position].id;
                    self.push(
                        to,
                        Body::Commit {
                            commit: self.commit,
                        },
                    );
                }
            }
            self.commit_to_broadcast = false;
        }
        ready.soft = self.soft_state();
        if self.hard_state_dirty {
            self.hard_state_dirty = false;
            ready.hard_state = Some(self.hard_state());
        }
        ready.snapshot_install = self.install.take();
        ready.messages.append(&mut self.messages);
        ready.sync_to = self.sync_pending.take();
        ready.snapshot_wanted.append(&mut self.snapshot_wanted);
        if self.commit > self.applied {
            let hi = self
                .commit
                .min(self.applied + self.config.apply_entries_max as u64);
            self.store
                .entries(self.applied + 1, hi, usize::MAX, &mut ready.committed);
            assert_eq!(
                ready.committed.len() as u64,
                hi - self.applied,
                "committed entries are read whole"
            );
            self.applied = hi;
        }
    }

    // ----- roles -----

    fn reset_election_timer(&mut self) {
        self.election_elapsed_ticks = 0;
        let width = self.config.election_ticks_max - self.config.election_ticks_min;
        self.election_timeout_ticks = self.config.election_ticks_min + self.rng.below(width);
    }

    fn become_follower(&mut self, term: Term, leader: Option<NodeId>) {
        assert!(term >= self.term, "terms never fall");
        if term > self.term {
            self.term = term;
            self.vote = None;
            self.hard_state_dirty = true;
            self.matched_upto = self.commit;
            self.leader_seq = 0;
            self.ack_owed = false;
        }
        self.role = Role::Follower;
        self.leader = leader;
        if leader.is_some() {
            self.leader_heard_at_tick = self.now_tick;
        }
        self.reset_election_timer();
    }

    fn bit(&self, id: NodeId) -> u32 {
        1 << self.config.position(id).expect("a voter")
    }

    fn start_pre_vote(&mut self) {
        self.role = Role::PreCandidate;
        self.leader = None;
        self.reset_election_timer();
        self.granted = self.bit(self.config.id);
        self.refused = 0;
        if self.granted.count_ones() as usize >= self.config.quorum() {
            self.start_vote();
            return;
        }
        let last_log_id = self.store.last_log_id();
        for position in 0..self.config.voters.len() {
            let to = self.config.voters[position];
            if to != self.config.id {
                self.messages.push(Message {
                    from: self.config.id,
                    to,
                    term: self.term + 1,
                    body: Body::PreVote { last_log_id },
                });
            }
        }
    }

    fn start_vote(&mut self) {
        self.term += 1;
        self.vote = Some(self.config.id);
        self.hard_state_dirty = true;
        self.matched_upto = self.commit;
        self.leader_seq = 0;
        self.ack_owed = false;
        self.role = Role::Candidate;
        self.leader = None;
        self.reset_election_timer();
        self.granted = self.bit(self.config.id);
        self.refused = 0;
        if self.granted.count_ones() as usize >= self.config.quorum() {
            self.become_leader();
            return;
        }
        let last_log_id = self.store.last_log_id();
        for position in 0..self.config.voters.len() {
            let to = self.config.voters[position];
            if to != self.config.id {
                self.push(to, Body::Vote { last_log_id });
            }
        }
    }

    fn become_leader(&mut self) {
        assert_eq!(self.vote, Some(self.config.id), "a leader voted for itself");
        self.role = Role::Leader;
        self.leader = Some(self.config.id);
        self.heartbeat_elapsed_ticks = 0;
        let last = self.store.last_log_id();
        for pr in self.progress.iter_mut() {
            pr.state = ProgressState::Probe;
            pr.match_index = 0;
            pr.next = last.index + 1;
            pr.probe_sent = false;
            pr.in_flight.clear();
            pr.seq_accepted = 0;
            pr.seq_floor = pr.seq_next;
            // A new leader gets a whole lease before check quorum can depose it.
            pr.heard_at_tick = self.now_tick;
        }
        // The new term's first entry: entries of earlier terms commit only under an entry
        // of the leader's own term, so this one commits them as soon as a quorum holds it.
        let blank = LogId::new(self.term, last.index + 1);
        self.store.append(Entry::blank(blank));
        self.sync_pending = Some(blank);
    }

    /// A leader has heard from a quorum (itself included) within its lease; a follower has
    /// heard its leader within its own shortest election timeout. Either refuses to help
    /// depose the leader it knows.
    fn in_lease(&self) -> bool {
        match self.role {
            Role::Leader => self.quorum_heard(),
            Role::Follower => {
                self.leader.is_some()
                    && self.now_tick - self.leader_heard_at_tick < self.config.election_ticks_min
            }
            Role::PreCandidate | Role::Candidate => false,
        }
    }

    fn quorum_heard(&self) -> bool {
        let heard = self
            .progress
            .iter()
            .filter(|pr| {
                pr.id == self.config.id
                    || self.now_tick - pr.heard_at_tick < self.config.lease_ticks
            })
            .count();
        heard >= self.config.quorum()
    }

    fn push(&mut self, to: NodeId, body: Body) {
        self.messages.push(Message {
            from: self.config.id,
            to,
            term: self.term,
            body,
        });
    }

    // ----- elections -----

    fn on_pre_vote(&mut self, from: NodeId, term: Term, last_log_id: LogId) {
        let mine = self.store.last_log_id();
        let in_lease = self.in_lease();
        let grant = term > self.term && last_log_id >= mine && !in_lease;
        let answer_term = if grant { term } else { self.term };
        self.messages.push(Message {
            from: self.config.id,
            to: from,
            term: answer_term,
            body: Body::PreVoteReply { granted: grant },
        });
        if !grant && self.role == Role::Follower && !in_lease && mine > last_log_id {
            // This node would win where the asker cannot, and no leader is heard: rather than
            // wait out its own slot, it asks at once (node.rs's `answer_pre_vote` trigger).
            self.start_pre_vote();
        }
    }

    fn on_pre_vote_reply(&mut self, from: NodeId, term: Term, granted: bool) {
        if !granted && term > self.term {
            self.become_follower(term, None);
            return;
        }
        if self.role != Role::PreCandidate {
            return;
        }
        if granted {
            if term != self.term + 1 {
                return;
            }
            self.granted |= self.bit(from);
        } else {
            self.refused |= self.bit(from);
        }
        self.tally(Role::PreCandidate);
    }

    fn on_vote(&mut self, from: NodeId, term: Term, last_log_id: LogId) {
        if term > self.term {
            if self.in_lease() {
                // Check quorum's other half: a node that hears a live leader does not let a
                // candidate raise its term (the candidate's answer carries the lower term).
                self.push(from, Body::VoteReply { granted: false });
                return;
            }
            self.become_follower(term, None);
        }
        if term < self.term {
            self.push(from, Body::VoteReply { granted: false });
            return;
        }
        let can_vote = self.vote == Some(from) || (self.vote.is_none() && self.leader.is_none());
        let grant = can_vote && last_log_id >= self.store.last_log_id();
        if grant {
            if self.vote != Some(from) {
                self.vote = Some(from);
                self.hard_state_dirty = true;
            }
            self.reset_election_timer();
        }
        self.push(from, Body::VoteReply { granted: grant });
    }

    fn on_vote_reply(&mut self, from: NodeId, term: Term, granted: bool) {
        if !self.reply_term_current(term) || self.role != Role::Candidate {
            return;
        }
        if granted {
            self.granted |= self.bit(from);
        } else {
            self.refused |= self.bit(from);
        }
        self.tally(Role::Candidate);
    }

    fn tally(&mut self, role: Role) {
        let quorum = self.config.quorum();
        if self.granted.count_ones() as usize >= quorum {
            match role {
                Role::PreCandidate => self.start_vote(),
                _ => self.become_leader(),
            }
        } else if self.refused.count_ones() as usize > self.config.voters.len() - quorum {
            self.become_follower(self.term, None);
        }
    }

    /// For answers: a higher term deposes this node; a lower one is stale.
    fn reply_term_current(&mut self, term: Term) -> bool {
        if term > self.term {
            self.become_follower(term, None);
            return false;
        }
        term == self.term
    }

    // ----- replication, follower side -----

    /// For a leader's messages: follow `from` if its term is current, or tell it it is stale.
    fn accept_leader(&mut self, from: NodeId, term: Term) -> bool {
        if term < self.term {
            self.push(from, Body::HeartbeatReply);
            return false;
        }
        if term == self.term && self.role == Role::Leader {
            // Two leaders in one term cannot happen (each needed a quorum of votes, and a vote
            // is given once per term); a message claiming it is refused.
            return false;
        }
        if term > self.term || self.role != Role::Follower || self.leader != Some(from) {
            self.become_follower(term, Some(from));
        }
        self.leader_heard_at_tick = self.now_tick;
        self.election_elapsed_ticks = 0;
        true
    }

    fn on_append(
        &mut self,
        from: NodeId,
        term: Term,
        seq: u64,
        prev: LogId,
        commit: Index,
        entries: Vec<Entry>,
    ) {
        if !self.accept_leader(from, term) {
            return;
        }
        let last = self.store.last_log_id().index;
        let prev_held = prev.index <= self.commit || self.store.term(prev.index) == Some(prev.term);
        if prev.index > last || !prev_held {
            let hint_index = if prev.index > last {
                last
            } else {
                self.conflict_hint(prev.index)
            };
            self.push(
                from,
                Body::AppendReply {
                    seq,
                    result: AppendResult::Rejected {
                        prev_index: prev.index,
                        hint_index,
                    },
                },
            );
            return;
        }
        let end = prev.index + entries.len() as u64;
        let mut appended = false;
        for entry in entries {
            let index = entry.log_id.index;
            if appended {
                // Past the first new entry every one is new: no lookups.
                self.store.append(entry);
                continue;
            }
            if index <= self.commit {
                // Committed entries are the same in every log.
                continue;
            }
            match self.store.term(index) {
                Some(t) if t == entry.log_id.term => continue,
                Some(_) => {
                    assert!(index > self.commit, "a committed entry is never truncated");
                    self.store.truncate_from(index);
                    self.durable = self.durable.min(index - 1);
                    self.store.append(entry);
                    appended = true;
                }
                None => {
                    self.store.append(entry);
                    appended = true;
                }
            }
        }
        if appended {
            self.sync_pending = Some(self.store.last_log_id());
        }
        self.leader_seq = self.leader_seq.max(seq);
        self.matched_upto = self.matched_upto.max(end);
        let commit_now = commit.min(self.matched_upto);
        if commit_now > self.commit {
            self.commit = commit_now;
        }
        if self.durable.min(self.matched_upto) >= end {
            self.send_ack(from, seq);
        } else {
            // The follower acknowledges only what is durable: the answer goes out from
            // `persisted` once the sync covers it.
            self.ack_owed = true;
        }
    }

    /// The index before the first entry of the term this log holds at `index` (which
    /// conflicts with the leader's), never below the commit index.
    fn conflict_hint(&self, index: Index) -> Index {
        let term = self.store.term(index);
        let mut first = index;
        while first - 1 > self.commit && self.store.term(first - 1) == term {
            first -= 1;
        }
        first - 1
    }

    fn send_ack(&mut self, to: NodeId, seq: u64) {
        let match_index = self.durable.min(self.matched_upto);
        self.ack_owed = match_index < self.matched_upto;
        self.push(
            to,
            Body::AppendReply {
                seq,
                result: AppendResult::Accepted { match_index },
            },
        );
    }

    fn on_heartbeat(&mut self, from: NodeId, term: Term, commit: Index) {
        if self.on_commit(from, term, commit) {
            self.push(from, Body::HeartbeatReply);
        }
    }

    /// Follows the leader's commit index as far as this log is known to match the leader's;
    /// false if the message was stale.
    fn on_commit(&mut self, from: NodeId, term: Term, commit: Index) -> bool {
        if !self.accept_leader(from, term) {
            return false;
        }
        let commit_now = commit.min(self.matched_upto);
        if commit_now > self.commit {
            self.commit = commit_now;
        }
        true
    }

    fn on_snapshot(&mut self, from: NodeId, term: Term, seq: u64, snapshot: LogId, data: Bytes) {
        if !self.accept_leader(from, term) {
            return;
        }
        self.leader_seq = self.leader_seq.max(seq);
        if snapshot.index > self.commit {
            if self.store.term(snapshot.index) == Some(snapshot.term) {
                // The log continues the snapshot: keep the entries after it.
                self.store.compact_to(snapshot.index);
                self.durable = self.durable.max(snapshot.index);
            } else {
                self.store.reset(snapshot);
                self.durable = snapshot.index;
            }
            self.commit = snapshot.index;
            self.applied = snapshot.index;
            self.snapshot = snapshot;
            self.matched_upto = self.matched_upto.max(snapshot.index);
            self.install = Some((snapshot, data));
        }
        self.send_ack(from, seq);
    }

    // ----- replication, leader side -----

    fn on_append_reply(&mut self, from: NodeId, term: Term, seq: u64, result: AppendResult) {
        if !self.reply_term_current(term) || self.role != Role::Leader {
            return;
        }
        let last = self.store.last_log_id().index;
        let position = self.config.position(from).expect("a voter");
        let pr = &mut self.progress[position];
        pr.heard_at_tick = self.now_tick;
        if seq < pr.seq_floor {
            // An answer to a message sent before the follower's log was found shorter than
            // it had reported (log reversion): what it says may no longer hold.
            return;
        }
        match result {
            AppendResult::Accepted { match_index } => {
                if match_index > last {
                    return;
                }
                pr.seq_accepted = pr.seq_accepted.max(seq);
                pr.match_index = pr.match_index.max(match_index);
                match pr.state {
                    ProgressState::Probe | ProgressState::Snapshot => pr.become_replicate(),
                    ProgressState::Replicate => {
                        pr.free_through(match_index);
                        pr.next = pr.next.max(pr.match_index + 1);
                    }
                }
                self.maybe_commit();
            }
            AppendResult::Rejected {
                prev_index,
                hint_index,
            } => {
                if seq < pr.seq_accepted || pr.state == ProgressState::Snapshot {
                    return;
                }
                if hint_index < pr.match_index {
                    // The follower restarted with less than it acknowledged (possible when
                    // entries are not synced before acknowledging): find the match again,
                    // and ignore every answer to what was sent before now.
                    pr.match_index = hint_index;
                    pr.seq_floor = pr.seq_next;
                }
                let next = prev_index.min(hint_index + 1).max(pr.match_index + 1);
                pr.become_probe(next);
            }
        }
    }

    fn on_heartbeat_reply(&mut self, from: NodeId, term: Term) {
        if !self.reply_term_current(term) || self.role != Role::Leader {
            return;
        }
        let last = self.store.last_log_id();
        let in_flight_max = self.config.append_in_flight_max;
        let position = self.config.position(from).expect("a voter");
        let pr = &mut self.progress[position];
        pr.heard_at_tick = self.now_tick;
        match pr.state {
            // A lost probe or its lost answer is retried once a heartbeat round went by.
            ProgressState::Probe => pr.probe_sent = false,
            ProgressState::Replicate if pr.match_index < last.index => {
                // The follower is alive but behind: some AppendEntries or their answers may be
                // lost. Free a slot if the window is full, and if everything is out already,
                // send an empty AppendEntries at the window's end: the follower rejects it if
                // it misses entries, which turns this follower back to probing.
                if pr.in_flight.len() >= in_flight_max {
                    pr.in_flight.pop_front();
                }
                if pr.next > last.index {
                    let prev_index = pr.next - 1;
                    if let Some(prev_term) = self.store.term(prev_index) {
                        let seq = pr.take_seq();
                        let body = Body::Append {
                            seq,
                            prev: LogId::new(prev_term, prev_index),
                            commit: self.commit,
                            entries: Vec::new(),
                        };
                        self.push(from, body);
                    }
                }
            }
            ProgressState::Replicate | ProgressState::Snapshot => {}
        }
    }

    fn broadcast_heartbeat(&mut self) {
        for position in 0..self.config.voters.len() {
            let to = self.config.voters[position];
            if to != self.config.id {
                self.push(
                    to,
                    Body::Heartbeat {
                        commit: self.commit,
                    },
                );
            }
        }
    }

    /// Sends what the follower at `position` may take now; true if anything went.
    fn send_appends(&mut self, position: usize) -> bool {
        let last = self.store.last_log_id().index;
        let in_flight_max = self.config.append_in_flight_max;
        match self.progress[position].state {
            ProgressState::Snapshot => false,
            ProgressState::Probe => {
                if self.progress[position].probe_sent {
                    return false;
                }
                let next = self.progress[position].next;
                match self.send_one(position, next, last) {
                    Some(_) => {
                        self.progress[position].probe_sent = true;
                        true
                    }
                    None => false,
                }
            }
            ProgressState::Replicate => {
                let mut sent = false;
                while self.progress[position].in_flight.len() < in_flight_max
                    && self.progress[position].next <= last
                {
                    let next = self.progress[position].next;
                    let Some((seq, end)) = self.send_one(position, next, last) else {
                        break;
                    };
                    let pr = &mut self.progress[position];
                    pr.in_flight.push_back((seq, end));
                    pr.next = end + 1;
                    sent = true;
                }
                sent
            }
        }
    }

    /// One AppendEntries from `next` (as many entries as the limits allow), or a request
    /// for a snapshot if the entry before `next` was compacted. Returns (seq, last index sent).
    fn send_one(&mut self, position: usize, next: Index, last: Index) -> Option<(u64, Index)> {
        assert!(
            next >= 1 && next <= last + 1,
            "next {next} outside the log ending at {last}"
        );
        let prev_index = next - 1;
        let Some(prev_term) = self
            .store
            .term(prev_index)
            .filter(|_| prev_index >= self.store.base().index)
        else {
            let pr = &mut self.progress[position];
            pr.become_snapshot(self.now_tick);
            self.snapshot_wanted.push(pr.id);
            return None;
        };
        let mut entries = Vec::new();
        if next <= last {
            let hi = last.min(next + self.config.append_entries_max as u64 - 1);
            entries.reserve((hi - next + 1) as usize);
            self.store
                .entries(next, hi, self.config.append_bytes_max, &mut entries);
        }
        let end = prev_index + entries.len() as u64;
        let pr = &mut self.progress[position];
        let seq = pr.take_seq();
        let to = pr.id;
        self.push(
            to,
            Body::Append {
                seq,
                prev: LogId::new(prev_term, prev_index),
                commit: self.commit,
                entries,
            },
        );
        Some((seq, end))
    }

    /// Commits the highest index a quorum holds durably, if it is of this leader's term:
    /// an entry of an earlier term is committed only by an entry of this term after it.
    fn maybe_commit(&mut self) {
        self.scratch_match.clear();
        for pr in &self.progress {
            self.scratch_match.push(if pr.id == self.config.id {
                self.durable
            } else {
                pr.match_index
            });
        }
        self.scratch_match.sort_unstable_by(|a, b| b.cmp(a));
        let candidate = self.scratch_match[self.config.quorum() - 1];
        if candidate > self.commit && self.store.term(candidate) == Some(self.term) {
            self.commit = candidate;
            self.commit_to_broadcast = true;
        }
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
