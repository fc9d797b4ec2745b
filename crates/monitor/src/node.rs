//! [`NodeMetrics`]: what a replica node of a trading core exports, fed from what the node can
//! observe of itself (its status, openraft's progress, its journal's and snapshot store's
//! counters) by the glue in the `bourse node` command.
//!
//! The monitor does not depend on the cluster crate, so the node's figures arrive as plain
//! values: a [`NodeSample`] per status poll, a [`Progress`] each time openraft's metrics
//! change, and journal and snapshot readings. From them it keeps:
//!
//! - counters (`_total`) for commands and log entries applied and hash checks passed, made
//!   from the node's own totals as deltas (a total that goes down, after a snapshot install,
//!   starts a new base instead of lowering the counter);
//! - gauges for commit index, last applied, last log index, term, leader, divergence alarm,
//!   and (on the leader) each peer's replication lag;
//! - the journal's bytes, records and fsync latency histogram and the snapshot counters,
//!   mirrored as they are;
//! - the batcher's queue depth (`bourse_queue_depth{queue="batcher"}`) and the time to build
//!   a snapshot's bytes (`bourse_snapshot_build_seconds`), read from the node;
//! - the node's own stages (`bourse_node_stage_seconds{node,stage}`: queue, propose,
//!   replicate, commit_apply, reply, md_published, ae_round_trip, follower_append), every
//!   value the node recorded, taken interval by interval from its stage histograms, and
//!   shown in the dashboard's "node path" table;
//! - the t2→t3 leg (kind `entry`, stage `appended`): sampled requests' hand-off to the
//!   batcher (t2, from the node's hooks) to the journal append holding their batch (t3);
//! - entry stage timings (kind `entry` in the stage histograms): for one appended entry in
//!   `sample_every`, the time from its local append (t3, from the journal's append ring) to
//!   the moment this node saw it committed (t4, leader only: the quorum's matched index) and
//!   applied (t5). "Saw" is when openraft's metrics watch woke the glue, so these legs carry
//!   that wake-up delay (tens of microseconds on an idle machine).

use crate::cluster::{NodeStatus, Role};
use crate::core_probe::Tally;
use crate::metrics::{Counter, Gauge, Histogram};
use crate::probe::{Stage, StageRecorder};
use crate::{clock, names, Monitor};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Sampled entries waiting to be seen committed and applied, at most.
pub const PENDING_ENTRIES_MAX: usize = 1_024;

/// A node's status as the node reports it (the cluster crate's `NodeStatus`, in plain form).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSample {
    pub id: u64,
    pub role: Option<Role>,
    pub term: u64,
    pub leader: Option<u64>,
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    pub state_hash: u64,
    /// Commands the state machine applied since the process started (or the last restore).
    pub commands_applied: u64,
    /// Leader hash entries this node compared and found equal (since start or restore).
    pub hash_checks_passed: u64,
    /// On a leader: the matched log index of every member (itself included).
    pub matched: Vec<(u64, Option<u64>)>,
    pub alarm: Option<String>,
    /// The newest hash checkpoint (log index, state hash); taken at the same indexes on
    /// every replica, so it compares replicas without hashing on demand.
    pub checkpoint: Option<(u64, u64)>,
    /// The commit index the node knows (leader: majority matched; follower: the leader's
    /// commit index from its latest AppendEntries), when it reports one.
    pub commit_index: Option<u64>,
    /// On a leader refusing commands for want of a quorum: ms since one last acknowledged it.
    pub quorum_lost_ms: Option<u64>,
    /// Client commands the node refused for want of a quorum since it started.
    pub no_quorum_refusals: u64,
    /// Client commands the node refused as a just-elected leader no quorum had acknowledged
    /// yet (retried there a moment later) since it started.
    pub unconfirmed_refusals: u64,
}

/// openraft's role names (`Leader`, `Follower`, …) as a [`Role`].
pub fn role_of(state: &str) -> Role {
    match state {
        "Leader" => Role::Leader,
        "Follower" => Role::Follower,
        "Candidate" => Role::Candidate,
        "Learner" => Role::Learner,
        _ => Role::Unknown,
    }
}

/// The highest log index a majority of `members` has matched, or `None` if no majority has
/// matched anything. `matched` may omit members (they count as nothing matched).
pub fn quorum_index(members: usize, matched: &[(u64, Option<u64>)]) -> Option<u64> {
    if members == 0 {
        return None;
    }
    let mut m: Vec<u64> = matched.iter().filter_map(|(_, i)| *i).collect();
    m.sort_unstable_by(|a, b| b.cmp(a));
    let majority = members / 2 + 1;
    m.get(majority - 1).copied()
}

impl NodeSample {
    /// The commit index this node can vouch for: what it reports (the leader's majority
    /// match, a follower's commit index from the leader), else on the leader the index a
    /// majority matched and elsewhere the applied index (a replica applies only committed
    /// entries).
    pub fn commit_index(&self, members: usize) -> u64 {
        if let Some(c) = self.commit_index {
            return c;
        }
        if self.role == Some(Role::Leader) {
            if let Some(q) = quorum_index(members, &self.matched) {
                return q;
            }
        }
        self.last_applied_index.unwrap_or(0)
    }

    /// The form the cluster view takes. The hash compared across replicas is the newest
    /// checkpoint's; a status without one but with a hash taken on demand (`state_hash` not
    /// 0) gives the hash at the applied index.
    pub fn view_status(&self, members: usize) -> NodeStatus {
        let (state_hash, hash_index) = match (self.checkpoint, self.last_applied_index) {
            (Some((index, hash)), _) => (Some(hash), Some(index)),
            (None, Some(_)) if self.state_hash != 0 => (Some(self.state_hash), None),
            _ => (None, None),
        };
        NodeStatus {
            id: self.id,
            role: self.role.unwrap_or(Role::Unknown),
            term: self.term,
            commit_index: self.commit_index(members),
            applied_index: self.last_applied_index.unwrap_or(0),
            state_hash,
            hash_index,
        }
    }
}

/// openraft's progress at one moment, read from its metrics watch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Leader only: the index a majority matched ([`quorum_index`]).
    pub committed: Option<u64>,
    pub applied: Option<u64>,
}

/// A histogram reading kept elsewhere over [`crate::metrics::LATENCY_BUCKETS_NS`]: counts per
/// bound (not cumulative) then the `+Inf` cell.
#[derive(Clone, Copy, Debug)]
pub struct BucketReading<'a> {
    pub buckets: &'a [u64],
    pub sum_ns: u64,
    pub count: u64,
}

/// A journal's counters since it was opened.
#[derive(Clone, Copy, Debug)]
pub struct JournalReading<'a> {
    pub bytes_appended: u64,
    pub records_appended: u64,
    pub fsync: BucketReading<'a>,
}

/// A snapshot store's counters since it was opened.
#[derive(Clone, Copy, Debug)]
pub struct SnapshotReading<'a> {
    pub written: u64,
    pub bytes_total: u64,
    pub bytes_last: u64,
    pub write: BucketReading<'a>,
}

/// A counter fed from a total kept elsewhere that may restart from a lower value.
#[derive(Debug)]
struct Rebased {
    counter: Counter,
    last: Option<u64>,
}

impl Rebased {
    fn new(counter: Counter) -> Rebased {
        Rebased {
            counter,
            last: None,
        }
    }
    /// A counter of totals kept since the process started: the first reading counts from
    /// zero (what happened before the monitor began happened too).
    fn from_zero(counter: Counter) -> Rebased {
        Rebased {
            counter,
            last: Some(0),
        }
    }

    fn update(&mut self, total: u64) {
        if let Some(last) = self.last {
            if total >= last {
                self.counter.add(total - last);
            }
        }
        self.last = Some(total);
    }
}

struct PendingEntry {
    index: u64,
    appended_ns: u64,
    committed_ns: Option<u64>,
}

/// Journal appends remembered to time t2→t3 legs, at most (the journal's own ring is as long).
pub const APPENDS_KEPT_MAX: usize = 1_024;

/// One node's exported figures. Owned by the task that polls the node.
pub struct NodeMetrics {
    monitor: Arc<Monitor>,
    id: u64,
    members: Vec<u64>,
    commands: Rebased,
    entries: Rebased,
    hash_checks: Rebased,
    last_applied: Gauge,
    last_log: Gauge,
    snapshot_index: Gauge,
    is_leader: Gauge,
    leader_id: Gauge,
    alarm: Gauge,
    quorum_lost_ms: Gauge,
    no_quorum_refusals: Rebased,
    unconfirmed_refusals: Rebased,
    peer_lag: Vec<(u64, Gauge)>,
    journal_bytes: Counter,
    journal_records: Counter,
    journal_fsync: Histogram,
    snapshots: Counter,
    snapshot_bytes_total: Counter,
    snapshot_bytes: Gauge,
    snapshot_write: Histogram,
    snapshot_build: Histogram,
    /// Snapshot builds seen so far and their summed time, for the dashboard's "last build".
    snapshot_builds_seen: (u64, u64),
    batcher_queue: Gauge,
    /// Recent journal appends (first index, last index, completed at), oldest first.
    appends: VecDeque<(u64, u64, Instant)>,
    recorder: StageRecorder,
    pending: VecDeque<PendingEntry>,
    appends_seen_to: u64,
    appends_counted: u64,
    sample_every: u64,
    events: Tally,
    events_published: Tally,
    event_counters: [Counter; 5],
    /// `bourse_node_stage_seconds` by stage, registered as stages first report.
    node_stages: Vec<(String, Histogram)>,
    /// `bourse_node_connections_refused_total` by reason, registered as reasons first report.
    refusals: Vec<(&'static str, Rebased)>,
}

impl NodeMetrics {
    /// Metrics of node `id` of a group whose members are `members` (ids, this node included);
    /// `core` names the trading core in the `core` label of the trading counters. The view is
    /// told to expect every member, so one that never answers shows as down.
    pub fn new(monitor: Arc<Monitor>, id: u64, members: &[u64], core: &str) -> NodeMetrics {
        let r = monitor.registry();
        let lc = [("core", core)];
        let event_counters = [
            r.counter(
                names::TRANSACTIONS_TOTAL,
                "Successful transactions (orders registered, cancels and replaces done).",
                &lc,
            ),
            r.counter(names::ORDERS_TOTAL, "Orders registered.", &lc),
            r.counter(names::TRADES_TOTAL, "Trades.", &lc),
            r.counter(names::CANCELS_TOTAL, "Orders cancelled on request.", &lc),
            r.counter(
                names::REJECTS_TOTAL,
                "Orders and cancels rejected by the core.",
                &lc,
            ),
        ];
        let node = id.to_string();
        let l = [("node", node.as_str())];
        let peer_lag = members
            .iter()
            .filter(|&&m| m != id)
            .map(|&m| {
                let peer = m.to_string();
                (
                    m,
                    r.gauge(
                        names::RAFT_PEER_LAG_ENTRIES,
                        "Leader only: its last log index minus the index the peer matched \
                         (0 on followers).",
                        &[("node", node.as_str()), ("peer", peer.as_str())],
                    ),
                )
            })
            .collect();
        monitor.cluster().expect(members);
        let journal = monitor.journal(&node);
        let m = NodeMetrics {
            id,
            members: members.to_vec(),
            commands: Rebased::new(r.counter(
                names::NODE_COMMANDS_APPLIED_TOTAL,
                "Commands the node's state machine applied.",
                &l,
            )),
            entries: Rebased::new(r.counter(
                names::NODE_ENTRIES_APPLIED_TOTAL,
                "Log entries (batches, hash checks, membership) the node applied.",
                &l,
            )),
            hash_checks: Rebased::new(r.counter(
                names::HASH_CHECKS_PASSED_TOTAL,
                "Leader state hash entries this node compared with its own hash and found equal.",
                &l,
            )),
            last_applied: r.gauge(
                names::RAFT_LAST_APPLIED_INDEX,
                "Last log index the node applied.",
                &l,
            ),
            last_log: r.gauge(
                names::RAFT_LAST_LOG_INDEX,
                "Last log index in the node's journal.",
                &l,
            ),
            snapshot_index: r.gauge(
                names::RAFT_SNAPSHOT_INDEX,
                "Last log index the node's newest snapshot covers.",
                &l,
            ),
            is_leader: r.gauge(
                names::RAFT_IS_LEADER,
                "1 while this node is the leader of its group.",
                &l,
            ),
            leader_id: r.gauge(
                names::RAFT_LEADER_ID,
                "The leader's node id as this node knows it (0: none).",
                &l,
            ),
            alarm: r.gauge(
                names::DIVERGENCE_ALARM,
                "1 once the node stopped on a state hash mismatch (divergence alarm).",
                &l,
            ),
            quorum_lost_ms: r.gauge(
                names::NODE_QUORUM_LOST_MS,
                "On a leader refusing commands for want of a quorum: ms since a quorum last \
                 acknowledged it (0: it has one, or does not lead).",
                &l,
            ),
            no_quorum_refusals: Rebased::from_zero(r.counter(
                names::NODE_NO_QUORUM_REFUSALS_TOTAL,
                "Client commands the node refused because it led without a quorum.",
                &l,
            )),
            unconfirmed_refusals: Rebased::from_zero(r.counter(
                names::NODE_UNCONFIRMED_REFUSALS_TOTAL,
                "Client commands the node refused as a just-elected leader that no quorum had \
                 acknowledged yet (the clients retry them there).",
                &l,
            )),
            peer_lag,
            journal_bytes: journal.bytes,
            journal_records: journal.records,
            journal_fsync: journal.fsync,
            snapshots: r.counter(names::SNAPSHOTS_TOTAL, "Snapshots the node wrote.", &l),
            snapshot_bytes_total: r.counter(
                names::SNAPSHOT_BYTES_TOTAL,
                "Bytes of snapshots the node wrote.",
                &l,
            ),
            snapshot_bytes: r.gauge(
                names::SNAPSHOT_SIZE_BYTES,
                "Size of the newest snapshot the node wrote.",
                &l,
            ),
            snapshot_write: r.histogram(
                names::SNAPSHOT_WRITE_SECONDS,
                "Time to write, fsync and rename one snapshot file.",
                &l,
            ),
            snapshot_build: r.histogram(
                names::SNAPSHOT_BUILD_SECONDS,
                "Time to build one snapshot's bytes (state encoding, hash, framing), before \
                 it is written.",
                &l,
            ),
            snapshot_builds_seen: (0, 0),
            batcher_queue: r.gauge(
                names::QUEUE_DEPTH,
                "Entries waiting in a queue between threads.",
                &[("queue", "batcher")],
            ),
            appends: VecDeque::with_capacity(APPENDS_KEPT_MAX),
            recorder: monitor.probes().recorder(),
            pending: VecDeque::with_capacity(PENDING_ENTRIES_MAX),
            appends_seen_to: 0,
            appends_counted: 0,
            sample_every: u64::from(monitor.config().sample_every),
            events: Tally::default(),
            events_published: Tally::default(),
            event_counters,
            node_stages: Vec::new(),
            refusals: Vec::new(),
            monitor,
        };
        m
    }

    /// Takes one interval of the node's own stage histograms (`bourse_cluster::stages`:
    /// name, values in ns, their exact sum): adds them to `bourse_node_stage_seconds{node,
    /// stage}` and to the dashboard's node stage table. At most
    /// [`crate::dashboard::NODE_STAGES_MAX`] stage names are kept.
    pub fn observe_node_stages<'s, 'h>(
        &mut self,
        stages: impl Iterator<Item = (&'s str, &'h hdrhistogram::Histogram<u64>, u64)>,
    ) {
        for (stage, h, sum_ns) in stages {
            let i = match self.node_stages.iter().position(|(n, _)| n == stage) {
                Some(i) => i,
                None if self.node_stages.len() < crate::dashboard::NODE_STAGES_MAX => {
                    let node = self.id.to_string();
                    let hist = self.monitor.registry().histogram(
                        names::NODE_STAGE_SECONDS,
                        "A replica node's own path: on the leader per batch (queue, propose, \
                         replicate, commit_apply), per write (reply), per AppendEntries \
                         (ae_round_trip), per entry its market data feed sent (md_published, \
                         from the entry's first follower acknowledgement); on a follower per \
                         AppendEntries (follower_append).",
                        &[("node", node.as_str()), ("stage", stage)],
                    );
                    self.node_stages.push((stage.to_string(), hist));
                    self.node_stages.len() - 1
                }
                None => continue,
            };
            self.node_stages[i].1.add_hdr(h, sum_ns);
            self.monitor.dashboard().add_node_stage(stage, h);
        }
    }

    /// Counts the events of one applied request (from the node's committed stream).
    #[inline]
    pub fn on_applied_events(&mut self, events: &[bourse_core::Event]) {
        self.events.add_events(events);
    }

    /// Publishes the event counts tallied since the last call.
    pub fn publish_events(&mut self) {
        let (l, p) = (&self.events, &self.events_published);
        let deltas = [
            l.transactions - p.transactions,
            l.orders - p.orders,
            l.trades - p.trades,
            l.cancels - p.cancels,
            l.rejects - p.rejects,
        ];
        for (c, d) in self.event_counters.iter().zip(deltas) {
            if d > 0 {
                c.add(d);
            }
        }
        self.events_published = self.events;
    }

    /// Takes this node's own status.
    pub fn observe(&mut self, s: &NodeSample) {
        let clamp = |v: u64| v.min(i64::MAX as u64) as i64;
        self.commands.update(s.commands_applied);
        if let Some(a) = s.last_applied_index {
            self.entries.update(a);
        }
        self.hash_checks.update(s.hash_checks_passed);
        self.last_applied
            .set(clamp(s.last_applied_index.unwrap_or(0)));
        self.last_log.set(clamp(s.last_log_index.unwrap_or(0)));
        self.snapshot_index
            .set(clamp(s.snapshot_index.unwrap_or(0)));
        let leading = s.role == Some(Role::Leader);
        self.is_leader.set(leading as i64);
        self.leader_id.set(clamp(s.leader.unwrap_or(0)));
        self.alarm.set(s.alarm.is_some() as i64);
        self.quorum_lost_ms
            .set(clamp(s.quorum_lost_ms.unwrap_or(0)));
        self.no_quorum_refusals.update(s.no_quorum_refusals);
        self.unconfirmed_refusals.update(s.unconfirmed_refusals);
        let last = s.last_log_index.unwrap_or(0);
        for (peer, gauge) in &self.peer_lag {
            let lag = if leading {
                let matched = s
                    .matched
                    .iter()
                    .find(|(id, _)| id == peer)
                    .and_then(|(_, m)| *m)
                    .unwrap_or(0);
                last.saturating_sub(matched)
            } else {
                0
            };
            gauge.set(clamp(lag));
        }
        self.report(s);
    }

    /// Takes a peer's status (polled over the client protocol).
    pub fn observe_peer(&self, s: &NodeSample) {
        self.report(s);
    }

    fn report(&self, s: &NodeSample) {
        let view = self.monitor.cluster();
        view.report(s.view_status(self.members.len()));
        view.set_alarm(s.id, s.alarm.clone());
        view.set_quorum_lost(s.id, s.quorum_lost_ms);
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The last log index whose append [`NodeMetrics::on_progress`] has seen (`None`: none),
    /// so the caller can hand over only newer appends.
    pub fn appends_seen_to(&self) -> Option<u64> {
        (self.appends_seen_to > 0).then_some(self.appends_seen_to)
    }

    /// Whether entry legs are sampled at all (sampling off: skip reading the journal ring).
    pub fn samples_entries(&self) -> bool {
        self.sample_every > 0
    }

    /// Mirrors the journal's counters.
    pub fn observe_journal(&self, j: &JournalReading) {
        self.journal_bytes.raise_to(j.bytes_appended);
        self.journal_records.raise_to(j.records_appended);
        self.journal_fsync
            .mirror(j.fsync.buckets, j.fsync.sum_ns, j.fsync.count);
    }

    /// Mirrors the snapshot store's counters.
    pub fn observe_snapshots(&self, s: &SnapshotReading) {
        self.snapshots.raise_to(s.written);
        self.snapshot_bytes_total.raise_to(s.bytes_total);
        self.snapshot_bytes
            .set(s.bytes_last.min(i64::MAX as u64) as i64);
        self.snapshot_write
            .mirror(s.write.buckets, s.write.sum_ns, s.write.count);
    }

    /// Client requests waiting for the node's batcher now.
    /// The node's refused connections so far, by reason (totals kept by the node's acceptor;
    /// a reason is exported from its first report on, zero included).
    pub fn observe_refusals(&mut self, totals: &[(&'static str, u64)]) {
        for &(reason, total) in totals {
            let at = match self.refusals.iter().position(|(r, _)| *r == reason) {
                Some(at) => at,
                None => {
                    let node = self.id.to_string();
                    let counter = self.monitor.registry().counter(
                        names::NODE_CONNECTIONS_REFUSED_TOTAL,
                        "Connections the node refused before reading a frame, by reason.",
                        &[("node", node.as_str()), ("reason", reason)],
                    );
                    self.refusals.push((reason, Rebased::from_zero(counter)));
                    self.refusals.len() - 1
                }
            };
            self.refusals[at].1.update(total);
        }
    }

    pub fn observe_batcher_queue(&self, depth: u64) {
        self.batcher_queue.set(depth.min(i64::MAX as u64) as i64);
    }

    /// Mirrors the state machine's snapshot build times (time to make the bytes, not to
    /// write them) and shows the newest builds on the dashboard.
    pub fn observe_snapshot_builds(&mut self, r: &BucketReading) {
        self.snapshot_build.mirror(r.buckets, r.sum_ns, r.count);
        let (count, sum) = self.snapshot_builds_seen;
        if r.count > count {
            let last_ns = r.sum_ns.saturating_sub(sum) / (r.count - count);
            let mean_ns = r.sum_ns / r.count;
            self.monitor.set_figure(
                "snapshot build",
                format!(
                    "last {:.1} ms, mean {:.1} ms over {} builds",
                    last_ns as f64 / 1e6,
                    mean_ns as f64 / 1e6,
                    r.count
                ),
            );
            self.snapshot_builds_seen = (r.count, r.sum_ns);
        }
    }

    /// Records the t2→t3 leg (kind `entry`, stage `appended`) of sampled requests: each is
    /// (log index of its batch, when it was handed to the batcher); t3 is the journal append
    /// that holds the index, from the appends [`NodeMetrics::on_progress`] has seen. A
    /// request whose append is no longer remembered is skipped.
    pub fn on_handoffs(&mut self, handoffs: &[(u64, Instant)]) {
        for &(index, queued_at) in handoffs {
            let Some(&(_, _, at)) = self
                .appends
                .iter()
                .rev()
                .find(|(first, last, _)| (*first..=*last).contains(&index))
            else {
                continue;
            };
            let ns = clock::ns_of(at).saturating_sub(clock::ns_of(queued_at));
            self.recorder.record_entry_leg(Stage::Appended, ns);
        }
    }

    /// Takes openraft's progress, seen at `now`, with the journal's recent appends (first
    /// index, last index, completed at; oldest first). Samples one append in `sample_every`
    /// and records its entry's legs once it is seen committed and applied.
    pub fn on_progress(&mut self, now: Instant, p: Progress, appends: &[(u64, u64, Instant)]) {
        if self.sample_every == 0 {
            return;
        }
        for &(first, last, at) in appends {
            if last <= self.appends_seen_to {
                continue;
            }
            self.appends_seen_to = last;
            if self.appends.len() >= APPENDS_KEPT_MAX {
                self.appends.pop_front();
            }
            self.appends.push_back((first, last, at));
            self.appends_counted += 1;
            if !self.appends_counted.is_multiple_of(self.sample_every) {
                continue;
            }
            if self.pending.len() >= PENDING_ENTRIES_MAX {
                self.pending.pop_front();
            }
            self.pending.push_back(PendingEntry {
                index: last,
                appended_ns: clock::ns_of(at),
                committed_ns: None,
            });
        }
        let now_ns = clock::ns_of(now);
        while let Some(e) = self.pending.front_mut() {
            if e.committed_ns.is_none() && p.committed.is_some_and(|c| c >= e.index) {
                e.committed_ns = Some(now_ns);
                self.recorder
                    .record_entry_leg(Stage::Committed, now_ns.saturating_sub(e.appended_ns));
            }
            if p.applied.is_none_or(|a| a < e.index) {
                break;
            }
            // Applied: the leg runs from the commit this node saw, or (a follower, which does
            // not see the quorum) from the append.
            let from = e.committed_ns.unwrap_or(e.appended_ns);
            self.recorder
                .record_entry_leg(Stage::Processed, now_ns.saturating_sub(from));
            self.pending.pop_front();
        }
        self.recorder.maybe_flush(now_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MonitorConfig;
    use std::time::Duration;

    #[test]
    fn quorum_index_is_the_majority_th_highest_match() {
        let m = [(1, Some(10)), (2, Some(7)), (3, None)];
        assert_eq!(quorum_index(3, &m), Some(7));
        assert_eq!(quorum_index(3, &[(1, Some(10))]), None);
        assert_eq!(
            quorum_index(5, &[(1, Some(9)), (2, Some(8)), (3, Some(3))]),
            Some(3)
        );
        assert_eq!(quorum_index(1, &[(1, Some(4))]), Some(4));
    }

    fn sample(id: u64, role: Role, applied: u64, commands: u64) -> NodeSample {
        NodeSample {
            id,
            role: Some(role),
            term: 2,
            leader: Some(1),
            last_log_index: Some(applied + 5),
            last_applied_index: Some(applied),
            snapshot_index: None,
            state_hash: 0xabc,
            commands_applied: commands,
            hash_checks_passed: 1,
            matched: vec![
                (1, Some(applied + 5)),
                (2, Some(applied + 2)),
                (3, Some(applied)),
            ],
            alarm: None,
            checkpoint: None,
            commit_index: None,
            quorum_lost_ms: None,
            no_quorum_refusals: 0,
            unconfirmed_refusals: 0,
        }
    }

    #[test]
    fn a_leader_without_a_quorum_is_on_metrics_and_raises_an_alert_until_it_has_one_again() {
        let m = Monitor::new(MonitorConfig::default());
        let mut n = NodeMetrics::new(m.clone(), 1, &[1, 2, 3], "equities");
        n.observe(&NodeSample {
            quorum_lost_ms: Some(1_700),
            no_quorum_refusals: 12,
            unconfirmed_refusals: 3,
            ..sample(1, Role::Leader, 100, 10)
        });
        let mut text = String::new();
        m.registry().render(&mut text);
        for line in [
            "bourse_node_quorum_lost_ms{node=\"1\"} 1700",
            "bourse_node_no_quorum_refusals_total{node=\"1\"} 12",
            "bourse_node_unconfirmed_refusals_total{node=\"1\"} 3",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        let snap = m.cluster().snapshot(3_000, m.registry());
        let v = snap.nodes.iter().find(|v| v.status.id == 1).unwrap();
        assert_eq!(v.quorum_lost_ms, Some(1_700));
        let alerts = crate::cluster::evaluate(&Default::default(), None, None, &snap);
        assert!(alerts.iter().any(|a| a.name == "no_quorum"), "{alerts:?}");

        // The quorum is back: the gauge returns to 0, the counter keeps its total, no alert.
        n.observe(&NodeSample {
            no_quorum_refusals: 12,
            ..sample(1, Role::Leader, 110, 12)
        });
        let mut text = String::new();
        m.registry().render(&mut text);
        assert!(
            text.contains("bourse_node_quorum_lost_ms{node=\"1\"} 0"),
            "{text}"
        );
        assert!(text.contains("bourse_node_no_quorum_refusals_total{node=\"1\"} 12"));
        let snap = m.cluster().snapshot(3_000, m.registry());
        let alerts = crate::cluster::evaluate(&Default::default(), None, None, &snap);
        assert!(!alerts.iter().any(|a| a.name == "no_quorum"), "{alerts:?}");
    }

    #[test]
    fn refused_connections_are_exported_by_reason_counting_those_before_the_first_reading() {
        let m = Monitor::new(MonitorConfig::default());
        let mut n = NodeMetrics::new(m.clone(), 2, &[1, 2, 3], "equities");
        n.observe_refusals(&[("not_tls", 3), ("busy", 0)]);
        n.observe_refusals(&[("not_tls", 5), ("busy", 0), ("no_certificate", 1)]);
        let mut text = String::new();
        m.registry().render(&mut text);
        for line in [
            "bourse_node_connections_refused_total{node=\"2\",reason=\"not_tls\"} 5",
            "bourse_node_connections_refused_total{node=\"2\",reason=\"busy\"} 0",
            "bourse_node_connections_refused_total{node=\"2\",reason=\"no_certificate\"} 1",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn a_followers_reported_commit_index_and_checkpoint_reach_the_view() {
        let m = Monitor::new(MonitorConfig::default());
        let n = NodeMetrics::new(m.clone(), 1, &[1, 2, 3], "equities");
        n.observe_peer(&NodeSample {
            commit_index: Some(180),
            checkpoint: Some((100, 0xfeed)),
            state_hash: 0,
            ..sample(2, Role::Follower, 150, 10)
        });
        let snap = m.cluster().snapshot(3_000, m.registry());
        let v = snap.nodes.iter().find(|v| v.status.id == 2).unwrap();
        assert_eq!(v.status.commit_index, 180);
        assert_eq!(
            v.lag_entries, 30,
            "lag from the follower's own commit index"
        );
        assert_eq!(v.status.hash_index, Some(100));
        assert_eq!(v.status.state_hash, Some(0xfeed));
        // A brief status with no checkpoint yet offers no hash to compare.
        let bare = NodeSample {
            state_hash: 0,
            ..sample(3, Role::Follower, 150, 10)
        };
        assert_eq!(bare.view_status(3).state_hash, None);
    }

    #[test]
    fn t2_to_t3_legs_come_from_handoffs_matched_with_appends() {
        let m = Monitor::new(MonitorConfig {
            sample_every: 1,
            ..MonitorConfig::default()
        });
        let mut n = NodeMetrics::new(m.clone(), 1, &[1, 2, 3], "equities");
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let appends = [(1, 4, t0 + ms(2)), (5, 9, t0 + ms(5))];
        n.on_progress(t0 + ms(6), Progress::default(), &appends);
        // Batch 7 was queued at t0 + 1 ms, batch 3 at t0; index 50 was never seen appended.
        n.on_handoffs(&[(7, t0 + ms(1)), (3, t0), (50, t0)]);
        n.recorder.flush();
        let stats = m.probes().take_interval();
        let leg = stats.by_kind_leg
            [crate::probe::KIND_ENTRY * crate::probe::LEGS + Stage::Appended as usize]
            .expect("t2->t3 legs");
        assert_eq!(leg.count, 2);
        assert!((1_980_000..=2_020_000).contains(&leg.p50), "{leg:?}");
        assert!((3_960_000..=4_040_000).contains(&leg.max), "{leg:?}");
    }

    #[test]
    fn snapshot_build_times_are_mirrored_and_shown() {
        let m = Monitor::new(MonitorConfig::default());
        let mut n = NodeMetrics::new(m.clone(), 3, &[1, 2, 3], "equities");
        let mut buckets = vec![0u64; crate::metrics::LATENCY_BUCKETS_NS.len() + 1];
        buckets[10] = 2;
        n.observe_snapshot_builds(&BucketReading {
            buckets: &buckets,
            sum_ns: 6_000_000,
            count: 2,
        });
        n.observe_batcher_queue(17);
        let text = m.render_metrics();
        assert!(
            text.contains("bourse_snapshot_build_seconds_count{node=\"3\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("bourse_queue_depth{queue=\"batcher\"} 17\n"),
            "{text}"
        );
        let figures = m.figures();
        assert_eq!(figures[0].0, "snapshot build");
        assert!(figures[0].1.contains("last 3.0 ms"), "{figures:?}");
    }

    #[test]
    fn counters_follow_totals_and_survive_a_restart_of_the_total() {
        let m = Monitor::new(MonitorConfig::default());
        let mut n = NodeMetrics::new(m.clone(), 1, &[1, 2, 3], "equities");
        n.observe(&sample(1, Role::Leader, 100, 1_000));
        n.observe(&sample(1, Role::Leader, 150, 1_600));
        // A snapshot install restarts the node's own total at a lower value.
        n.observe(&sample(1, Role::Leader, 160, 50));
        n.observe(&sample(1, Role::Leader, 170, 80));
        let r = m.registry();
        assert_eq!(r.counter_sum(names::NODE_COMMANDS_APPLIED_TOTAL), Some(630));
        assert_eq!(r.counter_sum(names::NODE_ENTRIES_APPLIED_TOTAL), Some(70));
        let lag: Vec<_> = r.gauge_series(names::RAFT_PEER_LAG_ENTRIES);
        assert_eq!(lag.len(), 2);
        assert!(lag
            .iter()
            .any(|(l, v)| l.contains(&("peer".into(), "3".into())) && *v == 5));
        let text = m.render_metrics();
        assert!(
            text.contains("bourse_raft_is_leader{node=\"1\"} 1\n"),
            "{text}"
        );
        // The view got the node with its quorum commit index: matched 175, 172, 170 → 172.
        let snap = m.cluster().snapshot(3_000, r);
        let me = snap.nodes.iter().find(|v| v.status.id == 1).unwrap();
        assert_eq!(me.status.commit_index, 172);
        assert_eq!(snap.nodes.len(), 3, "members 2 and 3 expected");
    }

    #[test]
    fn node_stages_export_as_seconds_by_stage_and_fill_the_dashboard_table() {
        let m = Monitor::new(MonitorConfig::default());
        let mut n = NodeMetrics::new(m.clone(), 2, &[1, 2, 3], "equities");
        let new = || hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 2);
        let mut replicate = new().unwrap();
        replicate.record(120_000).unwrap();
        replicate.record(130_000).unwrap();
        let mut md = new().unwrap();
        md.record(30_000).unwrap();
        let empty = new().unwrap();
        let interval = [
            ("replicate", &replicate, 250_000),
            ("md_published", &md, 30_000),
            ("reply", &empty, 0),
        ];
        n.observe_node_stages(interval.iter().map(|(a, b, c)| (*a, *b, *c)));
        n.observe_node_stages(interval[..1].iter().map(|(a, b, c)| (*a, *b, *c)));
        let text = m.render_metrics();
        assert!(
            text.contains("bourse_node_stage_seconds_count{node=\"2\",stage=\"replicate\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("bourse_node_stage_seconds_sum{node=\"2\",stage=\"replicate\"} 0.0005\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "bourse_node_stage_seconds_bucket{node=\"2\",stage=\"md_published\",le=\"0.00005\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("bourse_node_stage_seconds_count{node=\"2\",stage=\"reply\"} 0\n"),
            "{text}"
        );
        let frame: serde_json::Value = serde_json::from_str(&crate::dashboard::tick(&m)).unwrap();
        let rows = frame["node_stages"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "{rows:?}");
        assert_eq!(rows[0]["stage"], "replicate");
        assert_eq!(rows[0]["latency"]["count"], 4);
        assert!(rows[2]["latency"].is_null(), "an empty stage is n/a");
        // The node's publication delay is the frame's market data delay.
        assert_eq!(frame["md_delay"]["count"], 1);
        // The next frame covers a new interval.
        let frame: serde_json::Value = serde_json::from_str(&crate::dashboard::tick(&m)).unwrap();
        assert!(frame["node_stages"][0]["latency"].is_null());
    }

    #[test]
    fn mirrored_journal_histogram_exports_as_it_is() {
        let m = Monitor::new(MonitorConfig::default());
        let n = NodeMetrics::new(m.clone(), 2, &[1, 2, 3], "equities");
        let mut buckets = vec![0u64; crate::metrics::LATENCY_BUCKETS_NS.len() + 1];
        buckets[3] = 4; // 4 fsyncs of at most 10 µs
        n.observe_journal(&JournalReading {
            bytes_appended: 4096,
            records_appended: 8,
            fsync: BucketReading {
                buckets: &buckets,
                sum_ns: 32_000,
                count: 4,
            },
        });
        let text = m.render_metrics();
        assert!(
            text.contains("bourse_journal_bytes_total{node=\"2\"} 4096\n"),
            "{text}"
        );
        assert!(
            text.contains("bourse_journal_fsync_seconds_bucket{node=\"2\",le=\"0.00001\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("bourse_journal_fsync_seconds_count{node=\"2\"} 4\n"),
            "{text}"
        );
    }

    #[test]
    fn a_sampled_entry_gets_commit_and_apply_legs() {
        let m = Monitor::new(MonitorConfig {
            sample_every: 1,
            flush_interval_ms: 1,
            ..MonitorConfig::default()
        });
        let mut n = NodeMetrics::new(m.clone(), 1, &[1, 2, 3], "equities");
        let t0 = Instant::now();
        let appends = [(1, 4, t0)];
        let ms = Duration::from_millis;
        n.on_progress(
            t0 + ms(1),
            Progress {
                committed: Some(2),
                applied: Some(2),
            },
            &appends,
        );
        n.on_progress(
            t0 + ms(3),
            Progress {
                committed: Some(4),
                applied: Some(2),
            },
            &appends,
        );
        n.on_progress(
            t0 + ms(4),
            Progress {
                committed: Some(4),
                applied: Some(4),
            },
            &appends,
        );
        n.recorder.flush();
        let stats = m.probes().take_interval();
        let slot = |leg: Stage| {
            stats.by_kind_leg[crate::probe::KIND_ENTRY * crate::probe::LEGS + leg as usize]
        };
        let commit = slot(Stage::Committed).expect("commit leg");
        let apply = slot(Stage::Processed).expect("apply leg");
        assert_eq!(commit.count, 1);
        assert!((2_900_000..=3_100_000).contains(&commit.p50), "{commit:?}");
        assert!((990_000..=1_010_000).contains(&apply.p50), "{apply:?}");
        assert!(n.pending.is_empty());
    }
}
