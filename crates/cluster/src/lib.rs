//! bourse-cluster: a trading core replicated on openraft 0.10 across three nodes.
//!
//! Principal types:
//!
//! - [`LogCommand`] and [`batch::Batch`] (`batch`): a log entry is a batch of client
//!   requests, each with its idempotency key `(client_id, request_seq)` and its command in
//!   the core's binary form (`bourse_core::codec`), a hash check, or a market data idle
//!   flush. A batch stays in that
//!   form from the leader's batcher to each replica's state machine, which decodes each
//!   command once; [`ClientRequest`] is a request decoded, for tools and tests.
//! - [`ReplicatedState`] (`state`): the engine plus the idempotency table, applied only from
//!   committed entries; snapshot and state hash cover both; hash checkpoints that replicas
//!   compare with the leader's hash entries. A request that skips its client's next seq is
//!   refused ([`OutcomeKind::Gap`]), so each client's commands apply gaplessly, in order.
//! - [`stream`]: the committed stream, every applied entry (index; per request: key, outcome
//!   kind, events with `Event::OrderLog`) kept in a bounded ring and broadcast live.
//!   [`StreamConsumer`] (`consumer`) is how every downstream service reads it, in process
//!   ([`Node::consumer`]) or over TCP (`Request::Subscribe`, any node serves it): from a
//!   position, each entry once and in order, events decoded on demand, resuming after a
//!   failover or a restart, catching up by itself when cut off; [`archive`] keeps each
//!   node's copy of the stream on disk for consumers older than the ring.
//! - [`LogStore`] and [`StateMachineStore`] (`storage`): openraft's `RaftLogStorage` over a
//!   `bourse_journal::Journal` and `RaftStateMachine` with snapshots in a `SnapshotStore`.
//! - [`net`]: length-prefixed bincode frames, the node-to-node RPCs (openraft's
//!   `RaftNetworkV2`: AppendEntries, vote, pre-vote, a whole snapshot in one frame) and the
//!   client protocol on the same port; [`append_stream`] pipelines AppendEntries per follower
//!   (`append_in_flight_max`).
//! - [`transport`]: the connections under them: plain TCP on the loopback, mutual TLS
//!   (rustls) with the venue's authority anywhere; [`transport::dial`] for every client,
//!   [`transport::Acceptor`] for the node, refusals counted by reason.
//! - [`ClusterConfig`], [`Node`] (`node`): a node's configuration (TOML), its start-up, its
//!   smart batcher (requests that arrive while earlier batches are in flight form the next
//!   batch), its hash-check proposer, and its server.
//! - [`admission`]: the batcher's two lanes: trading requests are batched first; the bulk
//!   lane (the admin's clients, [`admission::BULK_CLIENT_ID_MIN`] on) gets at most a share of
//!   the batches in flight and smaller batches, so trading never queues behind bulk additions.
//! - [`stages::Stages`] (`stages`): where a request's time goes inside a node (queue,
//!   propose, replicate, commit and apply, reply; AppendEntries round trips and the
//!   follower's append; market data publication delay) in HDR histograms, per batch, RPC and
//!   published entry, since start and per interval for the node's `/metrics`.
//! - [`sim`]: deterministic simulation support: [`sim::SeededRuntime`] (openraft's runtime:
//!   tokio, with a random generator the simulation can seed and a watch channel that wakes its
//!   waiters in a fixed order, [`sim::watch::FifoWatch`]) and an in-memory network with
//!   seeded partitions, loss, delay, duplication and reordering.
//! - [`marketdata::MarketDataService`] (`marketdata`): the node's market data thread. The
//!   node's one publisher ([`marketdata::FeedNumbering`]) runs inside the replicated state's
//!   apply and hands the packets it closes through a bounded [`marketdata::PacketHandoff`];
//!   the thread ([`marketdata::NodeFeed`], sans-I/O) keeps the replay history, sends only
//!   while the node leads, and runs the loops and heartbeats (idle flushes are entries the
//!   leader proposes).
//! - [`Client`] (`client`): submits requests to the leader, follows redirects, retries with
//!   the same idempotency key across failover. [`client::PipelinedClient`]: many requests in
//!   flight on one connection, resubmitting every unanswered one in seq order after a
//!   failover or a gap; [`client::StreamClient`]: one TCP subscription (the transport of a
//!   remote [`StreamConsumer`]).
//! - [`link::ClusterLink`] (`link`): a replica group behind a gateway's
//!   `bourse_core::link::CoreLink`: commands through a pipelined client under the link's own
//!   client id, every output taken from the committed stream, resubscribing on another node
//!   from the next index when its node fails.
//! - [`query::InstrumentsAnswer`] (`query`): what a node answers from its applied state to
//!   `Request::Instruments` (every instrument with its definition, as of an applied index),
//!   so that a gateway's link learns the instruments added before its stream starts.
//! - [`hooks::NodeHooks`] (`hooks`): the few cheap observation points inside a node for its
//!   monitor (sampled t2 stamps, the follower's commit index).
//!
//! Acknowledgement rule: a node answers a request only with the outcome openraft returns
//! after the entry holding it was committed on a quorum (each member's journal append counted
//! under its fsync mode) and applied by the leader's state machine.

// openraft's storage traits return its `StorageError`, a large type; boxing it at every call
// would only move the allocation onto the error path of each caller.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod append_stream;
pub mod archive;
pub mod batch;
pub mod client;
pub mod consumer;
pub mod hooks;
pub mod link;
pub mod machine;
pub mod marketdata;
pub mod net;
pub mod node;
pub mod query;
pub mod sim;
pub mod stages;
pub mod state;
pub mod storage;
pub mod stream;
pub mod transport;

pub use batch::{Audit, Batch, ClientRequest, LogCommand};
pub use client::{Acknowledged, Client, ClientError};
pub use consumer::{EntryView, RequestView, StreamConsumer};
pub use node::{ClusterConfig, FsyncSetting, Node, NodeAddr};
pub use state::{Outcome, OutcomeKind, ReplicatedState};
pub use storage::{LogStore, StateMachineStore};
pub use stream::{CommittedEntry, CommittedRequest, StreamError, Subscription};
pub use transport::TlsFiles;

pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The cluster's openraft types: log entries carry [`LogCommand`]s and answer with one
    /// [`Outcome`] per request. One leader per term (`leader_id_std`), as openraft 0.9's
    /// `single-term-leader` was: a log id is (term, index), which is what the journal keeps.
    pub TypeConfig:
        D = LogCommand,
        R = Vec<Outcome>,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, NodeId>,
        AsyncRuntime = sim::SeededRuntime,
);

/// A node's openraft handle (its state machine is a [`StateMachineStore`]).
pub type Raft = openraft::Raft<TypeConfig, StateMachineStore>;
/// A log entry's id: (term, index).
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
/// A vote: (term, node voted for, committed).
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// A log entry as openraft hands it to storage.
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// The group's membership with the log id that set it.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
/// A snapshot's metadata.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// A snapshot: its metadata and its bytes, whole (sent in one frame).
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>;
/// A receiver of a node's openraft metrics (`Raft::metrics`).
pub type RaftMetricsWatch =
    openraft::alias::WatchReceiverOf<TypeConfig, openraft::RaftMetrics<TypeConfig>>;

/// The runtime the nodes run on, for callers that embed them (the CLI).
pub use tokio;
