//! Deterministic simulation support: openraft's runtime with a seedable random generator, and
//! an in-memory network between the nodes of one process with partitions, message loss,
//! delays, duplicated and reordered messages drawn from one seed.
//!
//! # How a run becomes a function of its seed
//!
//! The simulation test (`tests/it/simulation.rs`) runs three real nodes (openraft, the journal
//! on temporary directories, the replicated state machine, the node's batcher) and their
//! clients in ONE current-thread tokio runtime whose clock is paused: time only moves when
//! every task waits, and then jumps to the next timer, so "time" is a pure function of what
//! the tasks did. The nodes talk through [`SimNetwork`], which delivers an RPC by calling the
//! target node's [`Raft`] directly after a delay drawn from the seed; no socket is involved.
//! The remaining sources of chance, and what is done about each:
//!
//! - openraft draws every election timeout from `AsyncRuntime::thread_rng()`. The
//!   cluster's [`TypeConfig`](crate::TypeConfig) runs on [`SeededRuntime`], which is tokio in
//!   every respect except that generator (a per-thread splitmix64 that production seeds from
//!   the operating system's entropy and the simulation seeds with [`seed_thread_rng`]) and its
//!   watch channel.
//! - openraft 0.10 wakes its per-follower replication tasks, and its waiters on I/O progress
//!   and metrics, through shared watch channels. tokio's `watch` files each waiter under one
//!   of eight slots drawn from tokio's own per-thread generator (seeded from entropy unless
//!   tokio is built with `--cfg tokio_unstable`, which this workspace does not do) and wakes
//!   slot by slot, so two replication tasks woken by one send ran in an order that changed
//!   from run to run, and with it the order in which their AppendEntries drew delays and
//!   losses here. [`watch::FifoWatch`] wakes its waiters in the order they began to wait.
//! - Otherwise tokio's generator is consulted by `select!` without `biased;` (openraft 0.10
//!   selects through the runtime's `select2`..`select4`, which are biased; the node's TCP
//!   connection loop is not used in the simulation) and by the blocking pool's shard choice,
//!   which nothing here uses. The determinism test measures rather than assumes: it runs
//!   seeds twice and compares the trace digests.
//! - Real sockets, real time and multi-thread scheduling are absent by construction; the
//!   node's client port is bound on `127.0.0.x:0` and never connected to.
//!
//! Exactness has a price worth knowing: openraft 0.9 drew a node's election timeout once,
//! when its `Raft` was made, and checked it on a tick every 1.5 heartbeats; nodes started at
//! the same virtual instant ticked at the same instants forever, and when two or three of them
//! had timeouts between the same two ticks they split every vote (seeds 336 and 393 stayed
//! leaderless for 60 virtual seconds). openraft 0.10 draws a new timeout for each campaign and
//! a random phase for each node's first tick (both from the seeded generator), and the
//! simulation still starts each node after a seeded offset within one tick period, as real
//! nodes start at unrelated instants.

//! # The network's faults
//!
//! Each RPC draws, in this order: whether its link is cut (checked again on arrival and for
//! the response, so nothing crosses a partition, not even a message already in flight), a
//! delay on the way there, loss (of the request, or of the response after the target handled
//! it, so the sender cannot tell which), a delay on the way back, and duplication (a second
//! copy delivered after a further delay, usually after newer messages: a reordering). Every
//! delivery is folded into the trace digest with its virtual time.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{AsyncRuntime, BasicNode, OptionalSend, RaftNetworkV2, TokioRuntime};
use serde::Serialize;
use xxhash_rust::xxh3::Xxh3;

use crate::{NodeId, Raft, Snapshot, SnapshotMeta, TypeConfig, Vote};

pub mod watch;

/// The longest delay the simulator adds to one message, one way.
pub const DELAY_MS_LIMIT: u64 = 1_000;

/// splitmix64: small, seedable, and the same on every platform.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix_finish(self.0)
    }
    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }
    /// True with probability `p / 1000`.
    pub fn per_mille(&mut self, p: u32) -> bool {
        self.below(1000) < u64::from(p)
    }
}

fn splitmix_finish(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

thread_local! {
    /// The state of this thread's generator for openraft; `None` until first used or seeded.
    static THREAD_RNG_STATE: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Seeds the generator openraft draws its election timeouts from, on this thread only. The
/// simulation calls it before it builds its current-thread runtime, on the same thread.
pub fn seed_thread_rng(seed: u64) {
    THREAD_RNG_STATE.with(|s| s.set(Some(seed)));
}

/// A handle to this thread's generator (see [`seed_thread_rng`]); unseeded, it starts from
/// the operating system's entropy, so production nodes draw independent timeouts.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadRng;

impl rand::TryRng for ThreadRng {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.next() >> 32) as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.next())
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

impl ThreadRng {
    fn next(&mut self) -> u64 {
        THREAD_RNG_STATE.with(|s| {
            let state = s
                .get()
                .unwrap_or_else(entropy_seed)
                .wrapping_add(0x9e37_79b9_7f4a_7c15);
            s.set(Some(state));
            splitmix_finish(state)
        })
    }
}

/// A seed from the operating system's entropy (std's hasher keys are drawn from it).
fn entropy_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// openraft's runtime for this crate: tokio, with [`ThreadRng`] as its random generator and
/// [`watch::FifoWatch`] as its watch channel (see the module documentation).
#[derive(Debug)]
pub struct SeededRuntime(TokioRuntime);

impl AsyncRuntime for SeededRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = ThreadRng;
    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = watch::FifoWatch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }
    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }
    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }
    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }
    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }
    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }
    fn thread_rng() -> Self::ThreadLocalRng {
        ThreadRng
    }
    fn new(threads: usize) -> Self {
        SeededRuntime(TokioRuntime::new(threads))
    }
    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }
}

/// Fault rates; all zero means a perfect network with a 1 ms latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    pub loss_per_mille: u32,
    pub duplicate_per_mille: u32,
    /// Each way, on top of 1 ms.
    pub delay_ms_max: u64,
}

/// Counters of what the network did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub delivered: u64,
    pub lost_requests: u64,
    pub lost_responses: u64,
    pub duplicated: u64,
    /// RPCs that met a cut link or a node that was down.
    pub refused: u64,
}

/// Everything the simulated network and the scenario share: the seeded generator, the links
/// that are cut, the nodes that are up, the counters and the trace.
pub struct World {
    rng: SimRng,
    rates: Rates,
    cut: BTreeSet<(NodeId, NodeId)>,
    up: BTreeMap<NodeId, Raft>,
    stats: NetStats,
    trace: Xxh3,
    trace_events: u64,
    start: tokio::time::Instant,
}

/// A handle on the [`World`] (cheap to clone).
#[derive(Clone)]
pub struct Sim(Arc<Mutex<World>>);

impl Sim {
    /// A world whose faults are drawn from `seed`; virtual time starts now.
    pub fn new(seed: u64) -> Sim {
        Sim(Arc::new(Mutex::new(World {
            rng: SimRng::new(seed),
            rates: Rates::default(),
            cut: BTreeSet::new(),
            up: BTreeMap::new(),
            stats: NetStats::default(),
            trace: Xxh3::new(),
            trace_events: 0,
            start: tokio::time::Instant::now(),
        })))
    }

    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.0.lock().expect("sim world lock")
    }

    /// The network factory for node `from`.
    pub fn network(&self, from: NodeId) -> SimNetwork {
        SimNetwork {
            from,
            sim: self.clone(),
        }
    }

    /// Draws from the world's generator (the scenario draws its choices here too, so one seed
    /// fixes everything).
    pub fn draw_below(&self, n: u64) -> u64 {
        self.world().rng.below(n)
    }

    pub fn draw_per_mille(&self, p: u32) -> bool {
        self.world().rng.per_mille(p)
    }

    pub fn set_rates(&self, rates: Rates) {
        assert!(rates.loss_per_mille <= 1000 && rates.duplicate_per_mille <= 1000);
        assert!(rates.delay_ms_max <= DELAY_MS_LIMIT);
        self.world().rates = rates;
        self.record("rates", &(rates.loss_per_mille, rates.duplicate_per_mille));
    }

    /// Cuts every link between `side` and the other `members`, both ways.
    pub fn partition(&self, side: &[NodeId], members: &[NodeId]) {
        let mut w = self.world();
        for a in side {
            for b in members.iter().filter(|m| !side.contains(m)) {
                w.cut.insert((*a, *b));
                w.cut.insert((*b, *a));
            }
        }
        drop(w);
        self.record("partition", &side);
    }

    pub fn heal(&self) {
        self.world().cut.clear();
        self.record("heal", &());
    }

    /// Node `id` is up and answers RPCs through `raft`.
    pub fn node_up(&self, id: NodeId, raft: Raft) {
        self.world().up.insert(id, raft);
        self.record("up", &id);
    }

    /// Node `id` is down: RPCs to it fail from now on (ones already inside it finish or fail
    /// as its openraft shuts down).
    pub fn node_down(&self, id: NodeId) {
        self.world().up.remove(&id);
        self.record("down", &id);
    }

    /// The raft of node `id` if it is up (clients of the simulation submit through it).
    pub fn raft_of(&self, id: NodeId) -> Option<Raft> {
        self.world().up.get(&id).cloned()
    }

    pub fn stats(&self) -> NetStats {
        self.world().stats
    }

    /// Virtual time since the world was made.
    pub fn elapsed(&self) -> Duration {
        tokio::time::Instant::now() - self.world().start
    }

    /// Folds an event into the trace digest, with the virtual time it happened at.
    pub fn record<T: Serialize + ?Sized>(&self, what: &str, value: &T) {
        let bytes = bincode::serialize(value).expect("trace values serialize");
        let mut w = self.world();
        let t_ns = (tokio::time::Instant::now() - w.start).as_nanos() as u64;
        w.trace.update(&t_ns.to_le_bytes());
        w.trace.update(what.as_bytes());
        w.trace.update(&(bytes.len() as u64).to_le_bytes());
        w.trace.update(&bytes);
        w.trace_events += 1;
    }

    /// The digest of everything recorded so far, and how many events went into it.
    pub fn trace_digest(&self) -> (u64, u64) {
        let w = self.world();
        (w.trace.digest(), w.trace_events)
    }

    fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.world().cut.contains(&(from, to))
    }

    /// The target's raft if the link is whole and the target up.
    fn reach(&self, from: NodeId, to: NodeId) -> Option<Raft> {
        let w = self.world();
        if w.cut.contains(&(from, to)) {
            return None;
        }
        w.up.get(&to).cloned()
    }

    fn fate(&self) -> Fate {
        let mut w = self.world();
        let rates = w.rates;
        let mut delay = || Duration::from_millis(1 + w.rng.below(rates.delay_ms_max + 1));
        let there = delay();
        let back = delay();
        let again = delay() + there;
        let lose = w.rng.per_mille(rates.loss_per_mille);
        let lose_request = w.rng.per_mille(500);
        let twice = w.rng.per_mille(rates.duplicate_per_mille);
        Fate {
            there,
            back,
            again: twice.then_some(again),
            lose_request: lose && lose_request,
            lose_response: lose && !lose_request,
        }
    }

    fn count(&self, f: impl FnOnce(&mut NetStats)) {
        f(&mut self.world().stats)
    }
}

/// What happens to one RPC.
struct Fate {
    there: Duration,
    back: Duration,
    /// A second copy arrives after this long, if duplicated.
    again: Option<Duration>,
    lose_request: bool,
    lose_response: bool,
}

/// A node's network factory in the simulated world.
#[derive(Clone)]
pub struct SimNetwork {
    from: NodeId,
    sim: Sim,
}

impl RaftNetworkFactory<TypeConfig> for SimNetwork {
    type Network = SimPeer;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> SimPeer {
        SimPeer {
            from: self.from,
            to: target,
            sim: self.sim.clone(),
        }
    }
}

/// openraft's client for one peer in the simulated world.
pub struct SimPeer {
    from: NodeId,
    to: NodeId,
    sim: Sim,
}

fn failed(why: String) -> RPCError<TypeConfig> {
    // Always a network error, never `Unreachable`: that one sends openraft's replication into
    // a backoff, whose timing is not a function of the seed alone.
    RPCError::Network(NetworkError::new(&std::io::Error::other(why)))
}

/// One RPC kind: how to hand it to the target's raft.
trait Rpc: Clone + Serialize + Send + 'static {
    type Resp: Serialize + Send;
    const NAME: &'static str;
    fn call(
        self,
        raft: Raft,
    ) -> impl Future<Output = Result<Self::Resp, RaftError<TypeConfig>>> + Send;
}

impl Rpc for AppendEntriesRequest<TypeConfig> {
    type Resp = AppendEntriesResponse<TypeConfig>;
    const NAME: &'static str = "append_entries";
    async fn call(self, raft: Raft) -> Result<Self::Resp, RaftError<TypeConfig>> {
        raft.append_entries(self).await
    }
}

impl Rpc for VoteRequest<TypeConfig> {
    type Resp = VoteResponse<TypeConfig>;
    const NAME: &'static str = "vote";
    async fn call(self, raft: Raft) -> Result<Self::Resp, RaftError<TypeConfig>> {
        raft.vote(self).await
    }
}

/// A pre-vote: the same request as a vote, answered without changing the target's state.
#[derive(Clone, Serialize)]
struct PreVote(VoteRequest<TypeConfig>);

impl Rpc for PreVote {
    type Resp = VoteResponse<TypeConfig>;
    const NAME: &'static str = "pre_vote";
    async fn call(self, raft: Raft) -> Result<Self::Resp, RaftError<TypeConfig>> {
        crate::node::answer_pre_vote(&raft, self.0).await
    }
}

/// A whole snapshot, as the node's wire carries it (`net::Request::InstallSnapshot`).
#[derive(Clone, Serialize)]
struct InstallSnapshot {
    vote: Vote,
    meta: SnapshotMeta,
    data: Vec<u8>,
}

impl Rpc for InstallSnapshot {
    type Resp = SnapshotResponse<TypeConfig>;
    const NAME: &'static str = "install_snapshot";
    async fn call(self, raft: Raft) -> Result<Self::Resp, RaftError<TypeConfig>> {
        let snapshot = Snapshot {
            meta: self.meta,
            snapshot: self.data,
        };
        raft.install_full_snapshot(self.vote, snapshot)
            .await
            .map_err(RaftError::Fatal)
    }
}

impl SimPeer {
    async fn send<R: Rpc>(&mut self, rpc: R) -> Result<R::Resp, RPCError<TypeConfig>> {
        let (from, to, sim) = (self.from, self.to, self.sim.clone());
        let fate = sim.fate();
        if let Some(after) = fate.again {
            // The duplicate travels on its own and its answer is dropped, as a late copy of a
            // retransmitted packet would be.
            let (copy, sim) = (rpc.clone(), sim.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                if let Some(raft) = sim.reach(from, to) {
                    sim.count(|s| s.duplicated += 1);
                    sim.record("dup", &(R::NAME, from, to, &copy));
                    let response = copy.call(raft).await;
                    sim.record("dup-resp", &(R::NAME, from, to, response.is_ok()));
                }
            });
        }
        tokio::time::sleep(fate.there).await;
        if fate.lose_request {
            sim.count(|s| s.lost_requests += 1);
            sim.record("lost", &(R::NAME, from, to));
            return Err(failed(format!(
                "simulated loss of {} {from}->{to}",
                R::NAME
            )));
        }
        let Some(raft) = sim.reach(from, to) else {
            sim.count(|s| s.refused += 1);
            sim.record("refused", &(R::NAME, from, to));
            return Err(failed(format!("{} {from}->{to}: cut or down", R::NAME)));
        };
        sim.record("deliver", &(R::NAME, from, to, &rpc));
        let response = rpc.call(raft).await;
        tokio::time::sleep(fate.back).await;
        if fate.lose_response || sim.is_cut(to, from) {
            sim.count(|s| s.lost_responses += 1);
            sim.record("lost-resp", &(R::NAME, from, to));
            return Err(failed(format!(
                "simulated loss of the response to {} {from}->{to}",
                R::NAME
            )));
        }
        sim.count(|s| s.delivered += 1);
        match response {
            Ok(r) => {
                sim.record("resp", &(R::NAME, from, to, &r));
                Ok(r)
            }
            Err(e) => {
                // The target is shutting down (its only error): to the sender, a failed call.
                sim.record("resp-err", &(R::NAME, from, to, &e));
                Err(failed(format!("{} {from}->{to}: {e}", R::NAME)))
            }
        }
    }
}

impl RaftNetworkV2<TypeConfig> for SimPeer {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.send(rpc).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.send(rpc).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.send(PreVote(rpc)).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let rpc = InstallSnapshot {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        tokio::select! {
            biased;
            closed = cancel => Err(StreamingError::Closed(closed)),
            answer = self.send(rpc) => answer.map_err(StreamingError::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    #[test]
    fn a_seeded_thread_rng_repeats_and_different_seeds_differ() {
        let draw = |seed| {
            seed_thread_rng(seed);
            (0..16)
                .map(|_| SeededRuntime::thread_rng().random_range(300..600u64))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(draw(9).iter().all(|t| (300..600).contains(t)));
    }
}
