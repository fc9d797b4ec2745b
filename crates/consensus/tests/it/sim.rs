//! A deterministic simulation of one replica group: seeded cores, a network that loses,
//! duplicates, delays and reorders messages and can be partitioned, nodes that pause, crash
//! and restart losing what was not durable, and snapshots taken at random. Every message
//! goes through the codec. The safety properties are checked after every step.

use std::collections::HashMap;

use bourse_consensus::codec::{self, DecodeLimits};
use bourse_consensus::{
    election_window_ticks, Config, Core, Entry, HardState, Index, LogId, LogStore, MemStore,
    NodeId, Ready, Rng, Role, Term,
};
use bytes::Bytes;

/// When the entries a node writes become durable (its hard state always is at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// A node reports entries persisted only once synced: a crash loses nothing acknowledged.
    Always,
    /// Reported persisted when written; synced every few steps.
    Batch,
    /// Reported persisted when written; synced rarely (the operating system's write-back).
    Never,
}

#[derive(Clone, Debug)]
pub struct Faults {
    /// Out of 1,000 per message.
    pub loss_per_mille: u64,
    pub duplicate_per_mille: u64,
    /// A message takes 1..=delay_ticks_max ticks.
    pub delay_ticks_max: u64,
    /// Out of 1,000 per step.
    pub partition_per_mille: u64,
    pub crash_per_mille: u64,
    pub restart_per_mille: u64,
    pub pause_per_mille: u64,
    pub propose_per_mille: u64,
    pub snapshot_per_mille: u64,
    pub fsync: Fsync,
}

impl Faults {
    pub fn none() -> Self {
        Faults {
            loss_per_mille: 0,
            duplicate_per_mille: 0,
            delay_ticks_max: 2,
            partition_per_mille: 0,
            crash_per_mille: 0,
            restart_per_mille: 0,
            pause_per_mille: 0,
            propose_per_mille: 300,
            // Snapshots keep the logs (and the checks' walk over them) short.
            snapshot_per_mille: 20,
            fsync: Fsync::Always,
        }
    }

    pub fn harsh(fsync: Fsync) -> Self {
        Faults {
            loss_per_mille: 50,
            duplicate_per_mille: 30,
            delay_ticks_max: 4,
            partition_per_mille: 8,
            crash_per_mille: 4,
            restart_per_mille: 40,
            pause_per_mille: 3,
            propose_per_mille: 400,
            snapshot_per_mille: 20,
            fsync,
        }
    }
}

/// The replicated application: a hash chain over the applied entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct App {
    pub applied: Index,
    pub hash: u64,
}

impl App {
    fn encode(&self) -> Bytes {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&self.applied.to_le_bytes());
        v.extend_from_slice(&self.hash.to_le_bytes());
        Bytes::from(v)
    }

    fn decode(b: &[u8]) -> App {
        assert_eq!(b.len(), 16, "a snapshot of the test application");
        App {
            applied: u64::from_le_bytes(b[..8].try_into().unwrap()),
            hash: u64::from_le_bytes(b[8..].try_into().unwrap()),
        }
    }
}

fn mix(hash: u64, x: u64) -> u64 {
    (hash ^ x).wrapping_mul(0x100_0000_01B3).rotate_left(17) ^ 0x9E37_79B9
}

fn payload_hash(entry: &Entry) -> u64 {
    entry
        .payload
        .iter()
        .fold(entry.payload.len() as u64 + 1, |h, &b| mix(h, b as u64))
}

pub struct Node {
    pub id: NodeId,
    pub config: Config,
    pub core: Option<Core<MemStore>>,
    pub paused: bool,
    /// What survives a crash.
    pub hard: HardState,
    pub durable_log: MemStore,
    pub snapshot: (LogId, App),
    /// Volatile.
    pub app: App,
    /// Syncs under way (`Always`): (due step, log id).
    pub syncs: Vec<(u64, LogId)>,
    pub restarts: u64,
    pub was_leader_in: Option<Term>,
    ready: Ready,
}

struct InFlight {
    due: u64,
    from: NodeId,
    to: NodeId,
    bytes: Bytes,
}

pub struct Sim {
    pub seed: u64,
    pub rng: Rng,
    pub nodes: Vec<Node>,
    pub step: u64,
    pub faults: Faults,
    net: Vec<InFlight>,
    /// blocked[from][to]: messages on this link are dropped.
    blocked: Vec<Vec<bool>>,
    limits: DecodeLimits,
    encode_buf: Vec<u8>,
    // What the checks remember.
    pub leaders: HashMap<Term, NodeId>,
    /// (term, payload hash) of every committed index, as first seen.
    committed: Vec<(Term, u64)>,
    /// The term each index was committed in (index 0 unused).
    commit_terms: Vec<Term>,
    /// The application's hash after each applied index, as first seen.
    chain: Vec<u64>,
    /// (index, term) -> (payload hash, term of the entry before): log matching.
    entries_seen: HashMap<(Index, Term), (u64, Term)>,
    pub proposed: u64,
    pub stats: Stats,
    /// Under `Fsync::Never`, how often the operating system writes a node's log back.
    pub never_sync_every_ticks: u64,
    trace: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub delivered: u64,
    pub crashes: u64,
    pub lossy_crashes: u64,
    pub snapshots_installed: u64,
    pub elections: u64,
    pub committed: Index,
}

pub fn config(voters: &[NodeId], id: NodeId) -> Config {
    let mut c = Config::with_defaults(id, voters.to_vec());
    // One tick a step; a message takes 1-4 ticks, so a heartbeat every 3 and elections
    // drawn from slots of 20-60 keep the group stable when the network is.
    c.heartbeat_ticks = 3;
    let (min, max) = election_window_ticks(voters, id, 20, 60);
    c.election_ticks_min = min;
    c.election_ticks_max = max;
    c.lease_ticks = max;
    c.append_in_flight_max = 4;
    c.append_entries_max = 8;
    c.append_bytes_max = 256;
    c.entry_bytes_max = 64;
    c.uncommitted_entries_max = 64;
    c.apply_entries_max = 16;
    c.log_kept_below_snapshot_entries = 6;
    c.snapshot_retry_ticks = 30;
    c
}

impl Sim {
    pub fn new(seed: u64, voters_count: usize, faults: Faults) -> Sim {
        let voters: Vec<NodeId> = (1..=voters_count as u64).collect();
        let nodes = voters
            .iter()
            .map(|&id| {
                let config = config(&voters, id);
                let core = Core::new(
                    config.clone(),
                    HardState::default(),
                    MemStore::new(),
                    LogId::default(),
                    seed * 1000 + id,
                );
                Node {
                    id,
                    config,
                    core: Some(core),
                    paused: false,
                    hard: HardState::default(),
                    durable_log: MemStore::new(),
                    snapshot: (LogId::default(), App::default()),
                    app: App::default(),
                    syncs: Vec::new(),
                    restarts: 0,
                    was_leader_in: None,
                    ready: Ready::default(),
                }
            })
            .collect();
        let limits = DecodeLimits::for_config(&config(&voters, 1), 64);
        Sim {
            seed,
            rng: Rng::new(seed ^ 0x5EED),
            nodes,
            step: 0,
            faults,
            net: Vec::new(),
            blocked: vec![vec![false; voters_count]; voters_count],
            limits,
            encode_buf: Vec::new(),
            leaders: HashMap::new(),
            committed: vec![(0, 0)],
            commit_terms: vec![0],
            chain: vec![0],
            entries_seen: HashMap::new(),
            proposed: 0,
            stats: Stats::default(),
            never_sync_every_ticks: 40,
            trace: std::env::var_os("BOURSE_CONSENSUS_TRACE").is_some(),
        }
    }

    fn ix(&self, id: NodeId) -> usize {
        (id - 1) as usize
    }

    pub fn leader(&self) -> Option<NodeId> {
        // The live leader of the highest term, if any.
        self.nodes
            .iter()
            .filter_map(|n| n.core.as_ref().filter(|_| !n.paused))
            .filter(|c| c.soft_state().role == Role::Leader)
            .max_by_key(|c| c.soft_state().term)
            .map(|c| c.id())
    }

    pub fn core(&self, id: NodeId) -> &Core<MemStore> {
        self.nodes[self.ix(id)].core.as_ref().expect("a live node")
    }

    pub fn max_commit(&self) -> Index {
        (self.committed.len() - 1) as Index
    }

    // ----- faults -----

    pub fn isolate(&mut self, id: NodeId) {
        let i = self.ix(id);
        for j in 0..self.nodes.len() {
            if j != i {
                self.blocked[i][j] = true;
                self.blocked[j][i] = true;
            }
        }
    }

    pub fn heal(&mut self) {
        for row in self.blocked.iter_mut() {
            row.iter_mut().for_each(|b| *b = false);
        }
    }

    /// Splits the group in two at random.
    fn random_partition(&mut self) {
        self.heal();
        let n = self.nodes.len();
        let side: Vec<bool> = (0..n).map(|_| self.rng.chance(1, 2)).collect();
        for i in 0..n {
            for j in 0..n {
                if side[i] != side[j] {
                    self.blocked[i][j] = true;
                }
            }
        }
    }

    pub fn crash(&mut self, id: NodeId) {
        let lossy = match self.faults.fsync {
            Fsync::Always => true,
            Fsync::Batch | Fsync::Never => {
                self.nodes[self.ix(id)].core.is_some() && self.may_lose_unsynced(self.ix(id))
            }
        };
        self.crash_as(id, lossy);
    }

    /// Syncs node `id`'s log now (as its periodic sync would).
    pub fn sync(&mut self, id: NodeId) {
        let i = self.ix(id);
        let node = &mut self.nodes[i];
        if let Some(core) = &node.core {
            node.durable_log = core.store().clone();
        }
    }

    /// Crashes node `id` losing its unsynced tail, which the caller knows to be safe (checked).
    pub fn crash_losing(&mut self, id: NodeId) {
        assert!(
            self.may_lose_unsynced(self.ix(id)),
            "the others hold what node {id} acknowledged"
        );
        self.crash_as(id, true);
    }

    fn crash_as(&mut self, id: NodeId, lossy: bool) {
        let i = self.ix(id);
        if self.nodes[i].core.is_none() {
            return;
        }
        self.stats.crashes += 1;
        let node = &mut self.nodes[i];
        if lossy {
            self.stats.lossy_crashes += 1;
        } else {
            // A process crash: what was written survives in the operating system's cache.
            node.durable_log = node.core.as_ref().unwrap().store().clone();
        }
        node.core = None;
        node.paused = false;
        node.syncs.clear();
    }

    /// Whether node `i` may lose its unsynced tail without losing an entry the group
    /// committed or could commit counting its acknowledgements: a lost acknowledgement is
    /// only harmless if everything it covered is durable on a quorum of the other nodes.
    fn may_lose_unsynced(&self, i: usize) -> bool {
        let id = self.nodes[i].id;
        let mut acked = self.max_commit();
        for n in &self.nodes {
            if let Some(c) = &n.core {
                acked = acked.max(c.commit_index());
                if let Some(pr) = c.progress(id) {
                    acked = acked.max(pr.match_index);
                }
            }
        }
        for m in &self.net {
            if m.from == id {
                if let Ok(msg) = codec::decode(&m.bytes, &self.limits) {
                    if let bourse_consensus::Body::AppendReply {
                        result: bourse_consensus::AppendResult::Accepted { match_index },
                        ..
                    } = msg.body
                    {
                        acked = acked.max(match_index);
                    }
                }
            }
        }
        if acked == 0 {
            return true;
        }
        let own = self.nodes[i].core.as_ref().unwrap();
        let term = own
            .store()
            .term(acked)
            .or_else(|| self.committed.get(acked as usize).map(|c| c.0));
        let Some(term) = term else { return false };
        let quorum = self.nodes[i].config.quorum();
        let holders = self
            .nodes
            .iter()
            .enumerate()
            .filter(|&(j, n)| {
                j != i && (n.durable_log.term(acked) == Some(term) || n.snapshot.0.index >= acked)
            })
            .count();
        holders >= quorum
    }

    pub fn restart(&mut self, id: NodeId) {
        let i = self.ix(id);
        let seed = self.seed;
        let node = &mut self.nodes[i];
        if node.core.is_some() {
            return;
        }
        node.restarts += 1;
        let core = Core::new(
            node.config.clone(),
            node.hard,
            node.durable_log.clone(),
            node.snapshot.0,
            seed * 1000 + id + node.restarts * 100,
        );
        node.app = node.snapshot.1;
        node.core = Some(core);
        node.was_leader_in = None;
    }

    // ----- one step -----

    /// One tick of the whole group: faults at random, a tick for every running node, the
    /// messages due delivered, syncs completed, every node's `Ready` handled, then the checks.
    pub fn step(&mut self) {
        self.step += 1;
        self.random_faults();
        for node in self.nodes.iter_mut() {
            if node.paused {
                continue;
            }
            if let Some(core) = node.core.as_mut() {
                core.tick();
            }
        }
        self.deliver();
        self.complete_syncs();
        for i in 0..self.nodes.len() {
            self.handle_ready(i);
        }
        if self.trace {
            self.print_state();
        }
        self.check();
    }

    /// One line per step (`BOURSE_CONSENSUS_TRACE=1`), to follow a failing seed.
    fn print_state(&self) {
        let mut line = format!("step {:>5}:", self.step);
        for n in &self.nodes {
            match &n.core {
                None => line.push_str(&format!(" | {} down", n.id)),
                Some(c) => {
                    let s = c.soft_state();
                    line.push_str(&format!(
                        " | {}{} {:?} t{} l{:?} c{} last{:?} dur{}",
                        n.id,
                        if n.paused { "(p)" } else { "" },
                        s.role,
                        s.term,
                        s.leader,
                        c.commit_index(),
                        c.last_log_id(),
                        n.durable_log.last_log_id().index
                    ))
                }
            }
        }
        eprintln!("{line} | committed {}", self.max_commit());
    }

    fn random_faults(&mut self) {
        let f = self.faults.clone();
        if self.rng.chance(f.partition_per_mille, 1000) {
            match self.rng.below(4) {
                0 => self.heal(),
                1 => {
                    if let Some(l) = self.leader() {
                        self.heal();
                        self.isolate(l);
                    }
                }
                2 => {
                    self.heal();
                    let id = 1 + self.rng.below(self.nodes.len() as u64);
                    self.isolate(id);
                }
                _ => self.random_partition(),
            }
        }
        let n = self.nodes.len() as u64;
        if self.rng.chance(f.crash_per_mille, 1000) {
            let id = 1 + self.rng.below(n);
            self.crash(id);
        }
        if self.rng.chance(f.restart_per_mille, 1000) {
            let id = 1 + self.rng.below(n);
            self.restart(id);
        }
        if self.rng.chance(f.pause_per_mille, 1000) {
            let id = 1 + self.rng.below(n);
            let i = self.ix(id);
            if self.nodes[i].core.is_some() {
                self.nodes[i].paused = !self.nodes[i].paused;
            }
        }
        if self.rng.chance(f.propose_per_mille, 1000) {
            self.propose();
        }
        if self.rng.chance(f.snapshot_per_mille, 1000) {
            let id = 1 + self.rng.below(n);
            self.take_snapshot(id);
        }
    }

    /// Proposes a fresh payload at the current leader, if any; returns its index.
    pub fn propose(&mut self) -> Option<Index> {
        let leader = self.leader()?;
        let i = self.ix(leader);
        self.proposed += 1;
        let len = 1 + self.rng.below(24) as usize;
        let mut payload = self.proposed.to_le_bytes().to_vec();
        payload.resize(8 + len, (self.proposed % 251) as u8);
        let result = self.nodes[i]
            .core
            .as_mut()
            .unwrap()
            .propose(Bytes::from(payload));
        result.ok()
    }

    pub fn take_snapshot(&mut self, id: NodeId) {
        let i = self.ix(id);
        let node = &mut self.nodes[i];
        let Some(core) = node.core.as_mut() else {
            return;
        };
        let applied = core.applied_index();
        if applied <= node.snapshot.0.index || applied - node.snapshot.0.index < 4 {
            return;
        }
        assert_eq!(
            node.app.applied, applied,
            "the application applied what the core handed out"
        );
        let term = core
            .store()
            .term(applied)
            .expect("the applied entry is still in the log");
        // The snapshot is durable before the core is told (its contract).
        node.snapshot = (LogId::new(term, applied), node.app);
        core.snapshot_taken(applied);
    }

    fn send(&mut self, from: NodeId, to: NodeId, bytes: Bytes) {
        let f = &self.faults;
        if self.rng.chance(f.loss_per_mille, 1000) {
            return;
        }
        let copies = if self.rng.chance(f.duplicate_per_mille, 1000) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let due = self.step + 1 + self.rng.below(self.faults.delay_ticks_max);
            self.net.push(InFlight {
                due,
                from,
                to,
                bytes: bytes.clone(),
            });
        }
    }

    fn deliver(&mut self) {
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.net.len() {
            let m = &self.net[i];
            let to = self.ix(m.to);
            let waiting = self.nodes[to].paused && self.nodes[to].core.is_some();
            if m.due <= self.step && !waiting {
                due.push(self.net.remove(i));
            } else {
                i += 1;
            }
        }
        for m in due {
            let (from, to) = (self.ix(m.from), self.ix(m.to));
            if self.blocked[from][to] {
                continue;
            }
            let Some(core) = self.nodes[to].core.as_mut() else {
                continue;
            };
            let message =
                codec::decode(&m.bytes, &self.limits).expect("a message the codec wrote decodes");
            core.step(message)
                .expect("a message between members is taken");
            self.stats.delivered += 1;
        }
    }

    fn complete_syncs(&mut self) {
        let step = self.step;
        let periodic = match self.faults.fsync {
            Fsync::Always => None,
            Fsync::Batch => Some(5),
            Fsync::Never => Some(self.never_sync_every_ticks),
        };
        for node in self.nodes.iter_mut() {
            let Some(core) = node.core.as_mut() else {
                continue;
            };
            if node.paused {
                continue;
            }
            if let Some(every) = periodic {
                if (step + node.id).is_multiple_of(every) {
                    node.durable_log = core.store().clone();
                }
                continue;
            }
            let mut k = 0;
            while k < node.syncs.len() {
                if node.syncs[k].0 <= step {
                    let (_, log_id) = node.syncs.remove(k);
                    // The disk writes in order: what was appended before is durable too.
                    node.durable_log = core.store().clone();
                    core.persisted(log_id);
                } else {
                    k += 1;
                }
            }
        }
    }

    fn handle_ready(&mut self, i: usize) {
        if self.nodes[i].paused {
            return;
        }
        let Some(mut core) = self.nodes[i].core.take() else {
            return;
        };
        let mut ready = std::mem::take(&mut self.nodes[i].ready);
        core.ready(&mut ready);
        let id = self.nodes[i].id;
        if let Some(hs) = ready.hard_state {
            self.nodes[i].hard = hs;
        }
        if let Some((snapshot, data)) = ready.snapshot_install.take() {
            let app = App::decode(&data);
            assert_eq!(
                app.applied, snapshot.index,
                "seed {}: a snapshot's data is of its index",
                self.seed
            );
            assert_eq!(
                self.chain.get(app.applied as usize),
                Some(&app.hash),
                "seed {}: an installed snapshot equals the applied state",
                self.seed
            );
            let node = &mut self.nodes[i];
            node.snapshot = (snapshot, app);
            node.app = app;
            // The install is durable, with the log it leaves.
            node.durable_log = core.store().clone();
            self.stats.snapshots_installed += 1;
        }
        for message in ready.messages.drain(..) {
            assert_eq!(message.from, id);
            self.encode_buf.clear();
            codec::encode(&message, &mut self.encode_buf);
            let bytes = Bytes::copy_from_slice(&self.encode_buf);
            self.send(message.from, message.to, bytes);
        }
        if let Some(log_id) = ready.sync_to {
            match self.faults.fsync {
                Fsync::Always => {
                    // A sync takes 0-5 ticks, long enough that entries are often sent,
                    // acknowledged by others and even committed before the leader's own is
                    // done; one in ten takes 20-40 (a slow disk), which leaves a crash a
                    // wide window to take what was written but not synced.
                    let due = if self.rng.chance(1, 10) {
                        self.step + 20 + self.rng.below(21)
                    } else {
                        self.step + self.rng.below(6)
                    };
                    self.nodes[i].syncs.push((due, log_id));
                }
                Fsync::Batch | Fsync::Never => core.persisted(log_id),
            }
        }
        for entry in ready.committed.drain(..) {
            self.apply(i, &entry);
        }
        for to in ready.snapshot_wanted.drain(..) {
            let (id, app) = self.nodes[i].snapshot;
            core.send_snapshot(to, id, app.encode());
        }
        // Acknowledgements from `persisted` and snapshot sends go out at the next ready.
        self.nodes[i].ready = ready;
        self.nodes[i].core = Some(core);
    }

    fn apply(&mut self, i: usize, entry: &Entry) {
        let seed = self.seed;
        let node = &mut self.nodes[i];
        let index = entry.log_id.index;
        assert_eq!(
            index,
            node.app.applied + 1,
            "seed {seed}: node {} applies in order",
            node.id
        );
        let ph = payload_hash(entry);
        node.app.applied = index;
        node.app.hash = mix(mix(node.app.hash, index), ph);
        if (index as usize) < self.committed.len() {
            assert_eq!(
                self.committed[index as usize],
                (entry.log_id.term, ph),
                "seed {seed}: node {} applied another entry at {index}",
                node.id
            );
        } else {
            assert_eq!(
                index as usize,
                self.committed.len(),
                "seed {seed}: applied beyond what is known committed"
            );
            self.committed.push((entry.log_id.term, ph));
        }
        if (index as usize) < self.chain.len() {
            assert_eq!(
                self.chain[index as usize], node.app.hash,
                "seed {seed}: node {} state differs after {index}",
                node.id
            );
        } else {
            self.chain.push(node.app.hash);
        }
    }

    // ----- checks -----

    fn check(&mut self) {
        let seed = self.seed;
        // Record what commit indexes say is committed, from the log of the node that says so,
        // leaders first: the term of the leader that first shows an index committed is the
        // term it was committed in (a follower learns it a message later).
        let leaders_first = self.nodes.iter().filter(|n| {
            n.core
                .as_ref()
                .is_some_and(|c| c.soft_state().role == Role::Leader)
        });
        let others = self.nodes.iter().filter(|n| {
            n.core
                .as_ref()
                .is_some_and(|c| c.soft_state().role != Role::Leader)
        });
        for n in leaders_first.chain(others) {
            let Some(core) = &n.core else { continue };
            let commit = core.commit_index();
            while (self.committed.len() as Index) <= commit {
                let index = self.committed.len() as Index;
                let store = core.store();
                let entry = store.iter().find(|e| e.log_id.index == index);
                let Some(entry) = entry else {
                    panic!(
                        "seed {seed}: node {} committed {commit} but does not hold {index}",
                        n.id
                    );
                };
                self.committed
                    .push((entry.log_id.term, payload_hash(entry)));
                self.commit_terms.push(core.soft_state().term);
            }
        }
        self.stats.committed = self.max_commit();
        if self.faults.fsync == Fsync::Always && self.max_commit() > 0 {
            // With every acknowledgement durable, whatever is committed is durable on a
            // quorum: a crash of any minority, at any moment, loses none of it.
            let index = self.max_commit();
            let term = self.committed[index as usize].0;
            let holders = self
                .nodes
                .iter()
                .filter(|n| n.durable_log.term(index) == Some(term) || n.snapshot.0.index >= index)
                .count();
            assert!(
                holders >= self.nodes[0].config.quorum(),
                "seed {seed}: committed {index} is durable on {holders} nodes only"
            );
        }
        for n in self.nodes.iter_mut() {
            let Some(core) = &n.core else { continue };
            let soft = core.soft_state();
            // At most one leader per term.
            if soft.role == Role::Leader {
                let first = *self.leaders.entry(soft.term).or_insert(n.id);
                assert_eq!(
                    first, n.id,
                    "seed {seed}: two leaders in term {}",
                    soft.term
                );
                if n.was_leader_in != Some(soft.term) {
                    n.was_leader_in = Some(soft.term);
                    self.stats.elections += 1;
                    // Leader completeness: a new leader holds every entry committed in an earlier
                    // term. (A leader of an old term can still appear late: a candidate paused
                    // with its votes in flight wins its old term when it resumes.)
                    let store = core.store();
                    let last = store.last_log_id().index;
                    let committed_len = self
                        .commit_terms
                        .iter()
                        .rposition(|&t| t < soft.term)
                        .map_or(1, |i| i + 1) as Index;
                    assert!(
                        last >= committed_len - 1,
                        "seed {seed}: leader {} of term {} lacks committed entries (last {}, committed through {}, step {})",
                        n.id,
                        soft.term,
                        last,
                        committed_len - 1,
                        self.step
                    );
                    for index in store.first_index()..committed_len {
                        assert_eq!(
                            store.term(index),
                            Some(self.committed[index as usize].0),
                            "seed {seed}: leader {} lost committed {index}",
                            n.id
                        );
                    }
                }
            }
            let store = core.store();
            let commit = core.commit_index();
            let mut prev_term = store.base().term;
            for entry in store.iter() {
                let index = entry.log_id.index;
                let ph = payload_hash(entry);
                // Log matching: one entry per (index, term), after one and the same entry.
                let seen = *self
                    .entries_seen
                    .entry((index, entry.log_id.term))
                    .or_insert((ph, prev_term));
                assert_eq!(
                    seen,
                    (ph, prev_term),
                    "seed {seed}: node {} holds another entry at ({}, {index})",
                    n.id,
                    entry.log_id.term
                );
                // A committed prefix never changes.
                if index <= commit {
                    assert_eq!(
                        self.committed[index as usize],
                        (entry.log_id.term, ph),
                        "seed {seed}: node {} committed prefix changed at {index}",
                        n.id
                    );
                }
                prev_term = entry.log_id.term;
            }
        }
    }

    // ----- whole runs -----

    /// Everything back: nodes restarted and resumed, the network whole and reliable.
    pub fn heal_all(&mut self) {
        self.heal();
        self.faults.loss_per_mille = 0;
        self.faults.duplicate_per_mille = 0;
        self.faults.partition_per_mille = 0;
        self.faults.crash_per_mille = 0;
        self.faults.pause_per_mille = 0;
        self.faults.restart_per_mille = 0;
        for i in 0..self.nodes.len() {
            self.nodes[i].paused = false;
            let id = self.nodes[i].id;
            self.restart(id);
        }
    }

    /// After `heal_all`: the ticks until a leader is followed by every node and a proposal
    /// made then is applied everywhere; panics past `ticks_max`.
    pub fn ticks_to_recover(&mut self, ticks_max: u64) -> u64 {
        let start = self.step;
        let mut target: Option<Index> = None;
        while self.step - start < ticks_max {
            self.step();
            if target.is_none() {
                if let Some(l) = self.leader() {
                    let term = self.core(l).soft_state().term;
                    let all_follow = self.nodes.iter().all(|n| {
                        let s = n.core.as_ref().unwrap().soft_state();
                        s.term == term && s.leader == Some(l)
                    });
                    if all_follow {
                        target = self.propose();
                    }
                }
            }
            if let Some(t) = target {
                if self.nodes.iter().all(|n| n.app.applied >= t) {
                    return self.step - start;
                }
            }
        }
        panic!(
            "seed {}: no recovery within {ticks_max} ticks (leader {:?}, target {target:?}, applied {:?})",
            self.seed,
            self.leader(),
            self.nodes.iter().map(|n| n.app.applied).collect::<Vec<_>>()
        );
    }

    /// Every node applied the same sequence (compared through the chain at each one's index).
    pub fn check_converged(&self) {
        for n in &self.nodes {
            assert_eq!(
                self.chain.get(n.app.applied as usize),
                Some(&n.app.hash),
                "seed {}: node {} diverged",
                self.seed,
                n.id
            );
        }
    }
}
