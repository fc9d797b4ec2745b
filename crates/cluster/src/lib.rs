//! bourse-cluster: a trading core replicated on openraft 0.10 across three nodes.
//!
//! Start at [`Node`] (`node`: configuration, start-up, the smart batcher, the server) and
//! [`ReplicatedState`] (`state`: the engine plus the idempotency table, applied only from
//! committed entries). A log entry is a [`batch::Batch`] of requests in the core's binary form
//! ([`LogCommand`]); [`LogStore`] and [`StateMachineStore`] (`storage`) put openraft on
//! `bourse_journal`; [`net`], [`append_stream`] and [`transport`] carry entries between nodes.
//! Services read the committed stream through [`StreamConsumer`]; gateways reach a group
//! through [`link::ClusterLink`]; [`Client`] and [`client::PipelinedClient`] submit;
//! [`marketdata::MarketDataService`] is the node's feed; [`sim`] is the deterministic simulator.
//!
//! Design, invariants and the acknowledgement rule: ARCHITECTURE.md, `crates/cluster`.

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
