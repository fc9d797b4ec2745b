//! A seeded, fault-injecting network between in-process nodes: partitions, message loss,
//! delays and duplicated messages, drawn from one seed.
//!
//! It wraps the real TCP transport ([`crate::net::PeerClient`]): every node-to-node RPC asks
//! the shared [`Faults`] whether its link is cut, whether to lose it (as a request or as a
//! response, so the sender cannot tell whether it arrived), how long to delay it, and whether
//! to deliver it twice. The fault schedule is a pure function of the seed; the interleaving
//! of tasks and openraft's own election timeouts are not (openraft 0.9 draws them from the
//! thread's random generator), so a seed replays the same faults, not the same trace.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;

use crate::net::{Network, PeerClient};
use crate::{NodeId, TypeConfig};

/// The longest delay the simulator adds to one message.
pub const DELAY_MS_LIMIT: u64 = 1_000;

/// splitmix64: small, seedable, and the same everywhere.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }
    pub fn per_mille(&mut self, p: u32) -> bool {
        self.below(1000) < u64::from(p)
    }
}

/// Fault rates and the current partition.
#[derive(Debug)]
pub struct FaultState {
    pub rng: SimRng,
    /// Directed links (from, to) that deliver nothing.
    pub cut: BTreeSet<(NodeId, NodeId)>,
    pub loss_per_mille: u32,
    pub duplicate_per_mille: u32,
    pub delay_ms_max: u64,
    /// RPCs delivered, lost and duplicated so far.
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
}

/// The faults every link consults; cloned into each node's network factory.
#[derive(Clone, Debug)]
pub struct Faults(pub Arc<Mutex<FaultState>>);

enum Fate {
    Cut,
    LoseRequest,
    LoseResponse(Duration),
    Deliver { delay: Duration, twice: bool },
}

impl Faults {
    pub fn new(seed: u64) -> Faults {
        Faults(Arc::new(Mutex::new(FaultState {
            rng: SimRng::new(seed),
            cut: BTreeSet::new(),
            loss_per_mille: 0,
            duplicate_per_mille: 0,
            delay_ms_max: 0,
            delivered: 0,
            lost: 0,
            duplicated: 0,
        })))
    }

    pub fn set_rates(&self, loss_per_mille: u32, duplicate_per_mille: u32, delay_ms_max: u64) {
        assert!(loss_per_mille <= 1000 && duplicate_per_mille <= 1000);
        assert!(delay_ms_max <= DELAY_MS_LIMIT);
        let mut s = self.0.lock().expect("faults lock");
        s.loss_per_mille = loss_per_mille;
        s.duplicate_per_mille = duplicate_per_mille;
        s.delay_ms_max = delay_ms_max;
    }

    /// Cuts every link between `side` and the other `members`, both ways.
    pub fn partition(&self, side: &[NodeId], members: &[NodeId]) {
        let mut s = self.0.lock().expect("faults lock");
        for a in side {
            for b in members.iter().filter(|m| !side.contains(m)) {
                s.cut.insert((*a, *b));
                s.cut.insert((*b, *a));
            }
        }
    }

    pub fn heal(&self) {
        self.0.lock().expect("faults lock").cut.clear();
    }

    fn fate(&self, from: NodeId, to: NodeId) -> Fate {
        let mut s = self.0.lock().expect("faults lock");
        if s.cut.contains(&(from, to)) {
            s.lost += 1;
            return Fate::Cut;
        }
        let (loss, dup, delay_max) = (s.loss_per_mille, s.duplicate_per_mille, s.delay_ms_max);
        let delay = Duration::from_millis(if delay_max > 0 {
            s.rng.below(delay_max + 1)
        } else {
            0
        });
        if s.rng.per_mille(loss) {
            s.lost += 1;
            return if s.rng.per_mille(500) {
                Fate::LoseRequest
            } else {
                Fate::LoseResponse(delay)
            };
        }
        let twice = s.rng.per_mille(dup);
        s.delivered += 1;
        s.duplicated += twice as u64;
        Fate::Deliver { delay, twice }
    }
}

/// A node's network factory under [`Faults`].
#[derive(Clone)]
pub struct FaultyNetwork {
    pub from: NodeId,
    pub faults: Faults,
}

impl RaftNetworkFactory<TypeConfig> for FaultyNetwork {
    type Network = FaultyPeer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> FaultyPeer {
        FaultyPeer {
            from: self.from,
            to: target,
            faults: self.faults.clone(),
            inner: Network.new_client(target, node).await,
        }
    }
}

pub struct FaultyPeer {
    from: NodeId,
    to: NodeId,
    faults: Faults,
    inner: PeerClient,
}

fn lost<E: std::error::Error>(what: &str) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("simulated loss of {what}"),
    )))
}

fn cut<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(
        "simulated partition",
    )))
}

/// Runs one RPC under the link's fate; `call` may run twice (a duplicated message).
macro_rules! faulty {
    ($self:ident, $what:expr, $rpc:ident, $option:ident, $method:ident) => {{
        match $self.faults.fate($self.from, $self.to) {
            Fate::Cut => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Err(cut())
            }
            Fate::LoseRequest => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Err(lost($what))
            }
            Fate::LoseResponse(delay) => {
                tokio::time::sleep(delay).await;
                let _ = $self.inner.$method($rpc, $option).await;
                Err(lost($what))
            }
            Fate::Deliver { delay, twice } => {
                tokio::time::sleep(delay).await;
                if twice {
                    let _ = $self.inner.$method($rpc.clone(), $option.clone()).await;
                }
                $self.inner.$method($rpc, $option).await
            }
        }
    }};
}

impl RaftNetwork<TypeConfig> for FaultyPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        faulty!(self, "append_entries", rpc, option, append_entries)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        faulty!(self, "install_snapshot", rpc, option, install_snapshot)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        faulty!(self, "vote", rpc, option, vote)
    }
}
