//! Deterministic simulation of a three-node replica group (see `bourse_cluster::sim` for how a
//! run is made a function of its seed and what is left to chance).
//!
//! Per seed: three real nodes (openraft, journals and snapshots on temporary directories, the
//! replicated state machine) and three clients run in one current-thread tokio runtime with a
//! paused clock; the nodes talk through the in-memory `SimNetwork` with seeded delay, loss
//! (of requests and of responses), duplication and reordering; a scenario drawn from the seed
//! partitions nodes away, raises the fault rates, crashes nodes (some with a torn write at the
//! end of the journal) and restarts them. Each client opens an account, funds it, and then
//! trades: limit orders on both sides around one price (so they cross each other's and
//! trade), and cancels of its own earlier orders; one request at a time under its idempotency
//! key, retrying until it is acknowledged. Every other seed takes a snapshot every few entries
//! and keeps almost no log below it, so a node that crashed or was cut off catches up by
//! installing a snapshot rather than by replaying the log.
//!
//! Checks after each run: every acknowledged request is applied exactly once in the committed
//! history (which every node's committed stream reports, and which must agree index by index
//! across nodes), at the index its acknowledgement names (the client reads its events there:
//! answers carry none); the deposit reports the deposited balance; all replicas end with the same state hash
//! and each client's last applied request is its last acknowledged one; a node cut off from
//! the majority acknowledges nothing while it is cut off (and a probe submitted to it there
//! gets no acknowledgement); across the default seeds, snapshots were installed.
//!
//! Environment: `BOURSE_SIM_SEED=<seed>` runs one seed (a failure prints the command that
//! replays it); `BOURSE_SIM_SEEDS=<n>` runs seeds 1..=n (default 100);
//! `BOURSE_SIM_TRACE=<filter>` turns on tracing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bourse_cluster::sim::{seed_thread_rng, Rates, Sim};
use bourse_cluster::stream::CommittedStream;
use bourse_cluster::{
    ClientRequest, ClusterConfig, CommittedEntry, FsyncSetting, LogCommand, Node, NodeId,
    OutcomeKind, Raft, StreamError, Subscription,
};
use bourse_core::codec::decode_events;
use bourse_core::{
    AccountId, AccountSpec, Cancel, Cash, ClOrdId, Command, CommandBody, Event, FirmId,
    InstrumentId, NewOrder, OrdType, OrderId, OrderRef, Price, Qty, Side, StpMode, StpScope,
    TimeInForce,
};
use openraft::error::ClientWriteError;

const MEMBERS: [NodeId; 3] = [1, 2, 3];
const CLIENTS: u64 = 3;
const STEPS: u32 = 12;
const STEP_MS: u64 = 600;
/// How long a client waits for one attempt before it retries elsewhere (virtual time).
const ATTEMPT_MS: u64 = 1_500;
/// Acknowledgements each client must still get once the group is healed.
const ACKS_AFTER_HEAL: u64 = 3;
/// Virtual time allowed for the healed group to make progress and converge.
const SETTLE_MS: u64 = 60_000;
/// Real time one seed may take before it is declared hung.
const SEED_REAL_SECONDS_MAX: u64 = 120;
const DEFAULT_SEEDS: u64 = 100;
/// The one instrument the clients trade (client 1 adds it) and the price they trade around.
const INSTRUMENT: u32 = 1;
const MID_PRICE: i64 = 10_000;
/// What each client deposits before it trades (far more than its orders can reserve).
const FUNDING: i128 = 1_000_000_000_000_000;
/// Open orders a client remembers as candidates for a cancel.
const OPEN_ORDERS_KEPT: usize = 16;

fn account_of(client_id: u64) -> AccountId {
    AccountId(100 + client_id as u32)
}

/// An acknowledgement: which request, who answered, when, and the events it carried.
#[derive(Clone, Debug)]
struct Ack {
    client_id: u64,
    request_seq: u64,
    node: NodeId,
    at: Duration,
    applied_index: u64,
}

/// An interval during which `node` was cut off from both others.
#[derive(Clone, Debug)]
struct Isolation {
    node: NodeId,
    from: Duration,
    until: Duration,
}

#[derive(Default)]
struct Record {
    acks: Vec<Ack>,
    /// The committed history as the nodes' streams reported it, by log index.
    history: BTreeMap<u64, Arc<CommittedEntry>>,
    /// Jumps of a node's applied index: snapshots installed.
    snapshot_installs: u64,
}

/// What one seed produced.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    trace_digest: u64,
    trace_events: u64,
    acks: u64,
    snapshot_installs: u64,
    /// Trades in the committed history (the order flow crossed).
    trades: u64,
}

/// Each running node's committed stream and the subscription the observer reads.
type Subs = BTreeMap<NodeId, (CommittedStream, Subscription)>;

struct Cluster {
    config: ClusterConfig,
    sim: Sim,
    nodes: BTreeMap<NodeId, Node>,
    subs: Arc<Mutex<Subs>>,
    record: Arc<Mutex<Record>>,
    seed: u64,
}

impl Cluster {
    async fn start(&mut self, id: NodeId) {
        // Real nodes start at unrelated instants, so their openraft ticks (every 1.5
        // heartbeats) are out of phase; in virtual time nodes started together tick at the
        // very same instants, and two or three of them whose election timeouts fall between
        // the same two ticks then split every vote forever (seeds 336 and 393 did).
        let offset_ms = 1 + self.sim.draw_below(self.config.heartbeat_ms * 3 / 2);
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        let node = Node::start_with_network(&self.config, id, self.sim.network(id))
            .await
            .unwrap_or_else(|e| panic!("seed {}: node {id} starts: {e}", self.seed));
        let stream = node.state_machine().stream().clone();
        let sub = stream
            .subscribe(stream.oldest_kept())
            .expect("the oldest kept entry can be subscribed to");
        self.subs.lock().unwrap().insert(id, (stream, sub));
        self.sim.node_up(id, node.raft().clone());
        self.nodes.insert(id, node);
    }

    /// Stops the node as a crash would (files as they are; with fsync "never" everything the
    /// node wrote is in the operating system, which a process crash does not lose); with
    /// `torn`, the crash also interrupted a journal append, leaving a partial record.
    async fn crash(&mut self, id: NodeId, torn: Option<usize>) {
        let Some(node) = self.nodes.remove(&id) else {
            return;
        };
        self.sim.node_down(id);
        drain(&self.subs, &self.record, &self.sim, self.seed);
        self.subs.lock().unwrap().remove(&id);
        node.shutdown().await;
        if let Some(len) = torn {
            let garbage: Vec<u8> = (0..len).map(|_| self.sim.draw_below(256) as u8).collect();
            tear(&self.config.node_dir(id).join("journal"), &garbage);
        }
        self.sim.record("crash", &(id, torn));
    }
}

/// Appends a partial record to the newest journal segment, as an append cut short by a crash
/// leaves it (recovery must cut it away and keep everything before it).
fn tear(dir: &Path, garbage: &[u8]) {
    use std::io::Write;
    let newest = std::fs::read_dir(dir)
        .expect("journal dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .max();
    if let Some(path) = newest {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open segment");
        f.write_all(garbage).expect("tear segment");
    }
}

/// Moves every entry the nodes' streams have published into the history; an index reported
/// twice (by two nodes, or by one node before and after a restart) must be the same entry.
fn drain(subs: &Mutex<Subs>, record: &Mutex<Record>, sim: &Sim, seed: u64) {
    let mut subs = subs.lock().unwrap();
    let mut record = record.lock().unwrap();
    for (id, (stream, sub)) in subs.iter_mut() {
        loop {
            match sub.try_recv() {
                Ok(Some(entry)) => {
                    sim.record("applied", &(*id, entry.index, &entry.requests));
                    match record.history.get(&entry.index) {
                        Some(seen) => assert_eq!(
                            **seen, *entry,
                            "seed {seed}: node {id} applied another entry at index {}",
                            entry.index
                        ),
                        None => {
                            record.history.insert(entry.index, entry);
                        }
                    }
                }
                Ok(None) => break,
                // A snapshot install jumps the node's applied index: the entries it skipped
                // were applied (and reported) by the node the snapshot came from.
                Err(StreamError::Gap { next, .. }) => {
                    sim.record("stream-gap", &(*id, next));
                    record.snapshot_installs += 1;
                    *sub = stream.subscribe(next).unwrap_or_else(|e| {
                        panic!("seed {seed}: node {id}: resubscribe at {next}: {e}")
                    });
                }
                Err(e) => panic!("seed {seed}: node {id}: committed stream: {e}"),
            }
        }
    }
}

async fn submit(
    raft: &Raft,
    client_id: u64,
    request_seq: u64,
    command: Command,
) -> Result<bourse_cluster::Outcome, Option<NodeId>> {
    let request = ClientRequest {
        client_id,
        request_seq,
        command,
    };
    let (responder, receiver) = openraft::impls::ProgressResponder::complete_only();
    let written = raft
        .client_write_ff(LogCommand::batch(&[request]), Some(responder))
        .await;
    if written.is_err() {
        return Err(None);
    }
    match receiver.await {
        Ok(Ok(response)) => Ok(response.data.into_iter().next().expect("one outcome")),
        Ok(Err(ClientWriteError::ForwardToLeader(f))) => Err(f.leader_id),
        _ => Err(None),
    }
}

/// The command of a client's request `seq`: open and fund its account (client 1 also adds the
/// instrument), then order flow drawn from the simulation's generator: limit orders of either
/// side within two ticks of one price, so that they cross and trade, and now and then a
/// cancel of one of its orders still believed open.
fn next_command(sim: &Sim, client_id: u64, seq: u64, open: &mut Vec<OrderId>) -> CommandBody {
    let account = account_of(client_id);
    match seq {
        1 => CommandBody::AddAccount(AccountSpec {
            account,
            firm: FirmId(1),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        }),
        2 => CommandBody::Deposit {
            account,
            amount: Cash(FUNDING),
        },
        3 if client_id == 1 => CommandBody::AddInstrument(bourse_engine::fixtures::equity(
            INSTRUMENT, "SIM", MID_PRICE,
        )),
        _ if !open.is_empty() && sim.draw_per_mille(250) => {
            let order_id = open.remove(sim.draw_below(open.len() as u64) as usize);
            CommandBody::Cancel(Cancel {
                account,
                cl_ord_id: ClOrdId(seq),
                target: OrderRef {
                    order_id: Some(order_id),
                    orig_cl_ord_id: None,
                },
            })
        }
        _ => CommandBody::NewOrder(NewOrder {
            firm: None,
            account,
            cl_ord_id: ClOrdId(seq),
            instrument: InstrumentId(INSTRUMENT),
            side: if sim.draw_per_mille(500) {
                Side::Buy
            } else {
                Side::Sell
            },
            ord_type: OrdType::Limit,
            price: Price(MID_PRICE - 2 + sim.draw_below(5) as i64),
            qty: Qty(1 + sim.draw_below(3) as i64),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        }),
    }
}

/// One client: its requests (see `next_command`), each retried under its key until it is
/// answered; checks that it is answered as applied (or as the duplicate of its application)
/// and that the deposit reports the deposited balance.
async fn client(
    sim: Sim,
    client_id: u64,
    subs: Arc<Mutex<Subs>>,
    record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    let account = account_of(client_id);
    let mut seq = 0u64;
    let mut open: Vec<OrderId> = Vec::new();
    let mut target = MEMBERS[sim.draw_below(3) as usize];
    while !stop.load(Ordering::SeqCst) {
        seq += 1;
        let body = next_command(&sim, client_id, seq, &mut open);
        let command = Command::new(seq, body);
        let outcome = loop {
            let attempt = match sim.raft_of(target) {
                Some(raft) => tokio::time::timeout(
                    Duration::from_millis(ATTEMPT_MS),
                    submit(&raft, client_id, seq, command.clone()),
                )
                .await
                .unwrap_or(Err(None)),
                None => Err(None),
            };
            match attempt {
                Ok(o) => break o,
                Err(Some(leader)) if leader != target => target = leader,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    target = MEMBERS[sim.draw_below(3) as usize];
                }
            }
        };
        let at = sim.elapsed();
        sim.record("ack", &(client_id, seq, target, &outcome));
        assert!(
            matches!(outcome.kind, OutcomeKind::Applied | OutcomeKind::Duplicate),
            "seed {seed}: client {client_id} request {seq} answered {:?}",
            outcome.kind
        );
        let events = events_at(&subs, &record, &sim, seed, &outcome).await;
        if seq == 2 {
            let reported = events.iter().find_map(|e| match e {
                Event::CashChanged {
                    account: a, cash, ..
                } if *a == account => Some(cash.0),
                _ => None,
            });
            assert_eq!(
                reported,
                Some(FUNDING),
                "seed {seed}: client {client_id}'s deposit reports another balance: {events:?}"
            );
        }
        for e in &events {
            if let Event::OrderAccepted { order_id, .. } = e {
                if open.len() == OPEN_ORDERS_KEPT {
                    open.remove(0);
                }
                open.push(*order_id);
            }
        }
        record.lock().unwrap().acks.push(Ack {
            client_id,
            request_seq: seq,
            node: target,
            at,
            applied_index: outcome.applied_index,
        });
    }
}

/// The events of an acknowledged request, from the history at the index its answer names
/// (the answer carries none): drains the streams until some node has reported that entry.
async fn events_at(
    subs: &Mutex<Subs>,
    record: &Mutex<Record>,
    sim: &Sim,
    seed: u64,
    outcome: &bourse_cluster::Outcome,
) -> Vec<Event> {
    let key = (outcome.client_id, outcome.request_seq);
    // The answering node published the entry before it answered; another node reports it
    // once it applies it, should that one crash first. The bound is a hang guard.
    for _ in 0..10_000 {
        drain(subs, record, sim, seed);
        if let Some(entry) = record.lock().unwrap().history.get(&outcome.applied_index) {
            let r = entry
                .requests
                .iter()
                .find(|r| (r.client_id, r.request_seq) == key && r.kind == OutcomeKind::Applied)
                .unwrap_or_else(|| {
                    panic!(
                        "seed {seed}: {outcome:?} names entry {} which did not apply it",
                        outcome.applied_index
                    )
                });
            return decode_events(&r.events)
                .unwrap_or_else(|e| panic!("seed {seed}: {outcome:?}: {e:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "seed {seed}: no node reported entry {} of {outcome:?}",
        outcome.applied_index
    )
}

/// Reads the streams every few virtual milliseconds, so the history has every applied entry
/// even of a node that later crashes.
async fn observer(
    subs: Arc<Mutex<Subs>>,
    record: Arc<Mutex<Record>>,
    sim: Sim,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    while !stop.load(Ordering::SeqCst) {
        drain(&subs, &record, &sim, seed);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn config(dir: &Path, seed: u64) -> ClusterConfig {
    let mut config = ClusterConfig::local(7, dir.to_path_buf(), [0, 0, 0]);
    // The client port is bound but never used in the simulation: each node listens on port
    // 0 of its own loopback address, reserving no real port, and advertises an address no one
    // dials (peers talk through the simulated network).
    for (i, n) in config.nodes.iter_mut().enumerate() {
        n.addr = format!("127.0.0.{}:9", i + 1);
        n.listen = Some(format!("127.0.0.{}:0", i + 1));
    }
    config.fsync = FsyncSetting::Never;
    config.snapshot_every_entries = 60;
    if seed.is_multiple_of(2) {
        // Snapshots every few entries and almost no log kept below them: a node that missed
        // more than that must install the leader's snapshot.
        config.snapshot_every_entries = 10;
        config.log_kept_below_snapshot_entries = 2;
    }
    config.hash_checkpoint_every_entries = 16;
    config.hash_check_interval_ms = 100;
    config.orders_max = 1024;
    config.accounts_max = 1024;
    config
}

const CALM: Rates = Rates {
    loss_per_mille: 20,
    duplicate_per_mille: 30,
    delay_ms_max: 10,
};
const SETTLE: Rates = Rates {
    loss_per_mille: 0,
    duplicate_per_mille: 0,
    delay_ms_max: 10,
};
const STORM: Rates = Rates {
    loss_per_mille: 200,
    duplicate_per_mille: 200,
    delay_ms_max: 80,
};

/// One simulated run; panics (with the seed) if a check fails.
// The simulation runs on one current-thread runtime and nothing else takes the record's lock while
// the final checks await the replicas, so holding it across those awaits cannot deadlock.
#[allow(clippy::await_holding_lock)]
async fn simulate(seed: u64, verbose: bool) -> Outcome {
    let real_start = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(seed);
    let mut cluster = Cluster {
        config: config(dir.path(), seed),
        sim: sim.clone(),
        nodes: BTreeMap::new(),
        subs: Arc::new(Mutex::new(BTreeMap::new())),
        record: Arc::new(Mutex::new(Record::default())),
        seed,
    };
    for id in MEMBERS {
        cluster.start(id).await;
    }
    sim.set_rates(CALM);
    let stop_clients = Arc::new(AtomicBool::new(false));
    let stop_observer = Arc::new(AtomicBool::new(false));
    let observer = tokio::spawn(observer(
        cluster.subs.clone(),
        cluster.record.clone(),
        sim.clone(),
        stop_observer.clone(),
        seed,
    ));
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|c| {
            tokio::spawn(client(
                sim.clone(),
                c,
                cluster.subs.clone(),
                cluster.record.clone(),
                stop_clients.clone(),
                seed,
            ))
        })
        .collect();

    let mut isolations = Vec::new();
    let mut probes = 0u64;
    for step in 0..STEPS {
        let log = |what: String| {
            if verbose {
                println!("  {:>8?} step {step}: {what}", sim.elapsed());
            }
        };
        match sim.draw_below(5) {
            choice @ (0 | 1) => {
                // Cut one node off (half the time whichever node leads, the interesting case).
                let leader = cluster
                    .nodes
                    .values()
                    .find_map(|n| n.raft().metrics().borrow().current_leader);
                let lonely = match (choice, leader) {
                    (0, Some(l)) => l,
                    _ => MEMBERS[sim.draw_below(3) as usize],
                };
                log(format!("partition node {lonely} away (leader {leader:?})"));
                sim.partition(&[lonely], &MEMBERS);
                let from = sim.elapsed();
                let until = from + Duration::from_millis(STEP_MS);
                if sim.raft_of(lonely).is_some() {
                    probes += 1;
                }
                // A client that can reach only the lonely node keeps retrying one request
                // there for the whole partition; it must get no acknowledgement.
                while let (Some(raft), true) = (sim.raft_of(lonely), sim.elapsed() < until) {
                    let probe = Command::new(
                        0,
                        CommandBody::Deposit {
                            account: AccountId(999),
                            amount: Cash(1),
                        },
                    );
                    let r = tokio::time::timeout(
                        until - sim.elapsed(),
                        submit(&raft, 1_000 + u64::from(step), 1, probe),
                    )
                    .await;
                    assert!(
                        !matches!(r, Ok(Ok(_))),
                        "seed {seed}: node {lonely}, cut off, acknowledged {r:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let now = sim.elapsed();
                if now < until {
                    tokio::time::sleep(until - now).await;
                }
                isolations.push(Isolation {
                    node: lonely,
                    from,
                    until: sim.elapsed(),
                });
                sim.heal();
            }
            2 => {
                let victim = MEMBERS[sim.draw_below(3) as usize];
                let torn = sim
                    .draw_per_mille(500)
                    .then(|| 1 + sim.draw_below(200) as usize);
                log(format!("crash node {victim} (torn write: {torn:?} bytes)"));
                cluster.crash(victim, torn).await;
                tokio::time::sleep(Duration::from_millis(STEP_MS)).await;
            }
            3 => {
                log("storm: heavy loss, duplication and delay".into());
                sim.set_rates(STORM);
                tokio::time::sleep(Duration::from_millis(STEP_MS)).await;
                sim.set_rates(CALM);
            }
            _ => {
                log("restart crashed nodes".into());
                for id in MEMBERS {
                    if !cluster.nodes.contains_key(&id) {
                        cluster.start(id).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(STEP_MS)).await;
            }
        }
        // Never more than one node down at the end of a step, so the group can go on.
        let down: Vec<NodeId> = MEMBERS
            .into_iter()
            .filter(|id| !cluster.nodes.contains_key(id))
            .collect();
        if down.len() > 1 {
            for id in down {
                cluster.start(id).await;
            }
        }
    }

    // Heal everything; every client must still make progress, then stops between requests.
    sim.heal();
    // No loss, and the small delay jitter of a real network.
    sim.set_rates(SETTLE);
    for id in MEMBERS {
        if !cluster.nodes.contains_key(&id) {
            cluster.start(id).await;
        }
    }
    let acks_at = |r: &Record, c: u64| r.acks.iter().filter(|a| a.client_id == c).count() as u64;
    let before: Vec<u64> = {
        let r = cluster.record.lock().unwrap();
        (1..=CLIENTS).map(|c| acks_at(&r, c)).collect()
    };
    let healed_at = sim.elapsed();
    loop {
        let progressed = {
            let r = cluster.record.lock().unwrap();
            (1..=CLIENTS).all(|c| acks_at(&r, c) >= before[c as usize - 1] + ACKS_AFTER_HEAL)
        };
        if progressed {
            break;
        }
        assert!(
            sim.elapsed() - healed_at < Duration::from_millis(SETTLE_MS),
            "seed {seed}: clients made no progress after healing: {:#?}",
            statuses(&cluster).await
        );
        assert!(
            real_start.elapsed().as_secs() < SEED_REAL_SECONDS_MAX,
            "seed {seed}: hung"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_clients.store(true, Ordering::SeqCst);
    for c in clients {
        c.await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    }

    // Converge: every node applied its whole log, the same last index and the same hash.
    let converged_by = sim.elapsed() + Duration::from_millis(SETTLE_MS);
    let finals = loop {
        let s = statuses(&cluster).await;
        let leader_known = s.iter().any(|s| s.leader == Some(s.id));
        let done = s.iter().all(|x| {
            x.last_applied_index.is_some()
                && x.last_applied_index == x.last_log_index
                && x.last_applied_index == s[0].last_applied_index
        });
        if leader_known && done {
            break s;
        }
        assert!(
            sim.elapsed() < converged_by,
            "seed {seed}: no convergence: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    stop_observer.store(true, Ordering::SeqCst);
    observer
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    drain(&cluster.subs, &cluster.record, &sim, seed);
    for s in &finals {
        assert_eq!(
            s.state_hash, finals[0].state_hash,
            "seed {seed}: replicas differ: {finals:#?}"
        );
        assert!(s.alarm.is_none(), "seed {seed}: {:?}", s.alarm);
        sim.record("final", &(s.id, s.last_applied_index, s.state_hash));
    }

    let record = cluster.record.lock().unwrap();
    // The history is complete: every index from the first to the last applied one.
    let first = *record.history.keys().next().expect("a history");
    let last = *record.history.keys().last().unwrap();
    assert_eq!(first, 0, "seed {seed}: the history starts at index 0");
    assert_eq!(
        Some(last),
        finals[0].last_applied_index,
        "seed {seed}: the history ends where the replicas do"
    );
    assert_eq!(
        record.history.len() as u64,
        last + 1,
        "seed {seed}: the history has holes"
    );
    // Exactly once: no key applied twice; every acknowledged key applied once.
    let mut applied: BTreeMap<(u64, u64), (u32, u64, &[u8])> = BTreeMap::new();
    for entry in record.history.values() {
        for r in &entry.requests {
            if r.kind == OutcomeKind::Applied {
                let slot = applied.entry((r.client_id, r.request_seq)).or_insert((
                    0,
                    entry.index,
                    &r.events,
                ));
                slot.0 += 1;
            }
        }
    }
    for ((client, seq), (n, _, _)) in &applied {
        assert_eq!(
            *n, 1,
            "seed {seed}: client {client} request {seq} applied {n} times"
        );
    }
    for ack in &record.acks {
        let Some((_, index, _)) = applied.get(&(ack.client_id, ack.request_seq)) else {
            panic!("seed {seed}: acknowledged {ack:?} is not in the history");
        };
        assert_eq!(
            *index, ack.applied_index,
            "seed {seed}: the answer to {ack:?} names another entry than the one that applied it"
        );
        // A minority acknowledges nothing.
        for iso in isolations.iter().filter(|i| i.node == ack.node) {
            assert!(
                !(iso.from < ack.at && ack.at < iso.until),
                "seed {seed}: node {} acknowledged {ack:?} while cut off ({iso:?})",
                ack.node
            );
        }
    }
    let acked: Vec<u64> = (1..=CLIENTS).map(|c| acks_at(&record, c)).collect();
    let acks = record.acks.len() as u64;
    let snapshot_installs = record.snapshot_installs;
    let trades = applied
        .values()
        .map(|(_, _, events)| {
            decode_events(events)
                .expect("applied events decode")
                .iter()
                .filter(|e| matches!(e, Event::Trade { .. }))
                .count() as u64
        })
        .sum();
    drop(record);
    // Each replica's last applied request of each client is its last acknowledged one.
    for (id, node) in &cluster.nodes {
        for c in 1..=CLIENTS {
            let last_seq = node.state_machine().with_state(|s| s.last_seq(c)).await;
            assert_eq!(
                last_seq,
                Some(acked[c as usize - 1]),
                "seed {seed}: node {id} client {c}"
            );
        }
    }
    let stats = sim.stats();
    let (trace_digest, trace_events) = sim.trace_digest();
    if verbose {
        println!(
            "  seed {seed}: {acks} acknowledged, {probes} minority probes refused, {} isolations; \
             net {stats:?}; {:?} virtual in {:?} real; trace {trace_digest:016x} ({trace_events} events)",
            isolations.len(),
            sim.elapsed(),
            real_start.elapsed()
        );
    }
    for (_, node) in std::mem::take(&mut cluster.nodes) {
        node.shutdown().await;
    }
    Outcome {
        trace_digest,
        trace_events,
        acks,
        snapshot_installs,
        trades,
    }
}

async fn statuses(cluster: &Cluster) -> Vec<bourse_cluster::net::NodeStatus> {
    let mut out = Vec::new();
    for node in cluster.nodes.values() {
        out.push(node.status().await);
    }
    out
}

/// Runs one seed in a fresh current-thread runtime with a paused clock, on this thread; a
/// failure prints the command that replays it.
fn run_seed(seed: u64, verbose: bool) -> Outcome {
    let result = std::panic::catch_unwind(|| {
        seed_thread_rng(seed);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(simulate(seed, verbose))
    });
    match result {
        Ok(outcome) => outcome,
        Err(panic) => {
            eprintln!(
                "simulation seed {seed} failed; replay it with:\n  \
                 BOURSE_SIM_SEED={seed} cargo test --release -p bourse-cluster --test it simulation::"
            );
            std::panic::resume_unwind(panic)
        }
    }
}

fn init_tracing() {
    if let Ok(filter) = std::env::var("BOURSE_SIM_TRACE") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .try_init();
    }
}

#[test]
fn partitions_loss_delay_duplicates_and_crashes_lose_nothing_acknowledged() {
    init_tracing();
    let seeds: Vec<u64> = match std::env::var("BOURSE_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("BOURSE_SIM_SEED is a number")],
        Err(_) => {
            let n = std::env::var("BOURSE_SIM_SEEDS")
                .map(|s| s.parse().expect("BOURSE_SIM_SEEDS is a number"))
                .unwrap_or(DEFAULT_SEEDS);
            (1..=n).collect()
        }
    };
    let started = std::time::Instant::now();
    let verbose = seeds.len() == 1;
    let mut acks = 0;
    let mut installs = 0;
    let mut trades = 0;
    for seed in &seeds {
        let outcome = run_seed(*seed, verbose);
        acks += outcome.acks;
        installs += outcome.snapshot_installs;
        trades += outcome.trades;
        if !verbose {
            println!("seed {seed}: {outcome:?}");
        }
    }
    println!(
        "{} seeds, {acks} acknowledgements checked, {trades} trades, {installs} snapshots \
         installed, in {:?}",
        seeds.len(),
        started.elapsed()
    );
    assert!(trades > 0, "the order flow never traded");
    if seeds.len() >= 20 {
        assert!(
            installs > 0,
            "no node caught up by snapshot in {} seeds",
            seeds.len()
        );
    }
}

/// The exactness proof: a seed run twice gives the same trace digest (every delivered, lost
/// and duplicated message, every applied entry and every acknowledgement, with its virtual
/// time), and different seeds give different traces. `BOURSE_SIM_REPLAY_SEEDS=<n>` checks
/// seeds 1..=n instead of three, and reports how many diverged before failing.
#[test]
fn a_seed_replays_exactly_and_different_seeds_differ() {
    init_tracing();
    let seeds: Vec<u64> = match std::env::var("BOURSE_SIM_REPLAY_SEEDS") {
        Ok(n) => (1..=n
            .parse::<u64>()
            .expect("BOURSE_SIM_REPLAY_SEEDS is a number"))
            .collect(),
        Err(_) => vec![101, 202, 303],
    };
    let started = std::time::Instant::now();
    let mut digests = BTreeMap::new();
    let mut diverged = Vec::new();
    for seed in &seeds {
        let a = run_seed(*seed, false);
        let b = run_seed(*seed, false);
        assert!(
            a.trace_events > 100,
            "seed {seed}: a trace of {} events",
            a.trace_events
        );
        if a != b {
            eprintln!("seed {seed} diverged: {a:?} then {b:?}");
            diverged.push(*seed);
        }
        if let Some(other) = digests.insert(a.trace_digest, *seed) {
            panic!(
                "seeds {other} and {seed} gave the same trace {:016x}",
                a.trace_digest
            );
        }
    }
    println!(
        "{} seeds run twice in {:?}: {} diverged {diverged:?}",
        seeds.len(),
        started.elapsed(),
        diverged.len()
    );
    assert!(
        diverged.is_empty(),
        "seeds that did not replay exactly: {diverged:?}"
    );
}
