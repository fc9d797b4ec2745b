//! One node of a replica group: configuration, start-up, the smart batcher, the hash-check
//! proposer and the TCP server.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bourse_engine::capacity::Preallocation;
use bourse_engine::EngineConfig;
use bourse_journal::{
    Config as JournalConfig, Fsync, Journal, RealStorage, SnapshotStore, Storage,
};
use openraft::error::{ClientWriteError, ForwardReason, ForwardToLeader};
use openraft::{BasicNode, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::admission::{admission, Admission, AdmissionSender};
use crate::append_stream::FollowerPipe;
use crate::archive::{ArchiveWriter, StreamArchive};
use crate::batch::{Audit, BatchBuilder, LogCommand};
use crate::consumer::StreamConsumer;
use crate::hooks::NodeHooks;
use crate::net::{
    decode_message, encode_frame, encode_frame_into, read_frame_into, NodeStatus, Request,
    Response, SubmitError, Tagged,
};
use crate::stages::{BatchStamps, ReplyStamp, Stages};
use crate::state::Outcome;
use crate::storage::{Alarm, LogStore, StateMachineStore};
use crate::stream::{StreamError, Subscription};
use crate::transport::{
    Acceptor, NodeStream, NodeWriteHalf, PeerRole, Refusal, Refusals, TlsFiles,
};
use crate::{NodeId, Raft, TypeConfig};
use bourse_core::codec::check_command_form;

// The batcher's queues (a trading lane and a bulk lane) and permits live in `admission`.
pub use crate::admission::{BATCHES_IN_FLIGHT_MAX, PENDING_REQUESTS_MAX};
/// Frames queued for one connection's writer.
pub const CONNECTION_QUEUE_FRAMES_MAX: usize = 4096;
/// How long a subscription waits for room in its connection's queue before it gives the
/// subscriber up (a reader that stopped reading).
pub const SUBSCRIBER_STALL_MS: u64 = 10_000;
/// Subscriptions one connection may hold at once.
pub const SUBSCRIPTIONS_PER_CONNECTION_MAX: usize = 4;
/// Nodes in a replica group.
pub const NODES_MAX: usize = 7;

/// Durability of journal appends, as written in the config file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncSetting {
    #[default]
    Always,
    Batch,
    Never,
}

/// A member's id and addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeAddr {
    pub id: NodeId,
    /// The advertised address: where peers, gateways and tools reach this node. It must name
    /// one host (not 0.0.0.0) and a port, since others dial it.
    pub addr: String,
    /// Where the node binds its listener when that differs from `addr` (say `0.0.0.0:7001`
    /// behind an address translation, or one interface of several); `addr` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

fn d_heartbeat_ms() -> u64 {
    50
}
fn d_election_ms_min() -> u64 {
    150
}
fn d_election_ms_max() -> u64 {
    300
}
fn d_connections_max() -> usize {
    1_024
}
fn d_first_frame_timeout_ms() -> u64 {
    10_000
}
fn d_waiting_per_address_max() -> usize {
    256
}
/// Bounds on `connections_max`: a group's peers, gateways, services and tools fit in the
/// lowest; the highest stays far under a process's usual descriptor limit of 65,536.
const CONNECTIONS_MAX_RANGE: std::ops::RangeInclusive<usize> = 16..=16_384;
fn d_append_in_flight_max() -> usize {
    // Pipelined: a commit at distance costs one round trip instead of two to three
    // (BENCHMARKS.md, "Pipelined replication"). 16 keeps a follower's queue short under load.
    16
}
fn d_log_kept_below_snapshot() -> u64 {
    1_000
}
fn d_snapshot_every() -> u64 {
    20_000
}
fn d_hash_every() -> u64 {
    1_000
}
fn d_hash_check_ms() -> u64 {
    500
}
fn d_fsync_interval_ms() -> u32 {
    2
}
fn d_stream_entries_kept() -> usize {
    crate::stream::STREAM_ENTRIES_KEPT_DEFAULT
}
fn d_log_tail_entries_kept() -> usize {
    crate::storage::LOG_TAIL_ENTRIES_MAX
}
fn d_log_tail_bytes_kept() -> usize {
    crate::storage::LOG_TAIL_BYTES_MAX
}
fn d_stream_bytes_kept() -> usize {
    crate::stream::STREAM_BYTES_KEPT_DEFAULT
}
fn d_stream_archive_entries() -> u64 {
    STREAM_ARCHIVE_ENTRIES_DEFAULT
}
fn d_orders_max() -> u32 {
    1 << 16
}
fn d_accounts_max() -> u32 {
    100_000
}
fn d_first_order_id() -> u64 {
    1
}
fn d_instruments_max() -> u32 {
    1_024
}

/// Entries a node keeps in its stream archive unless configured otherwise.
pub const STREAM_ARCHIVE_ENTRIES_DEFAULT: u64 = 1 << 20;
/// The most entries `stream_archive_entries` may ask for.
pub const STREAM_ARCHIVE_ENTRIES_LIMIT: u64 = 1 << 32;

/// A replica group's configuration (`cluster.toml`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Written into every journal and snapshot; a node refuses another cluster's files.
    pub cluster_id: u64,
    /// Each node keeps `data_dir/node-<id>/{journal,snapshots}`.
    pub data_dir: PathBuf,
    #[serde(default)]
    pub fsync: FsyncSetting,
    /// Under `fsync = "batch"`, the journal's own interval rule. A node's log store runs a
    /// group-commit flusher that starts an fsync as soon as an append waits for one, so no
    /// append waits on this timer; the key is still validated and kept for the journal API.
    #[serde(default = "d_fsync_interval_ms")]
    pub fsync_interval_ms: u32,
    /// How often the leader sends each follower a heartbeat (50 ms unless set).
    #[serde(default = "d_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// A follower that hears no heartbeat starts an election (a pre-vote round first) after
    /// its leader lease plus a timeout, both taken from its own slot of the range
    /// `election_timeout_ms_min..election_timeout_ms_max` (`ClusterConfig::election_window_ms`):
    /// with the defaults (150 and 300) and three nodes, 330-360, 430-460 and 530-560 ms of
    /// silence, six heartbeats or more. The whole range drawn by every node (450-600 ms)
    /// split a vote in a few leader losses in a hundred; the defaults were once 300 and 600
    /// (900-1,200 ms), which alone exceeded issue 21's failover goal of 1 s.
    #[serde(default = "d_election_ms_min")]
    pub election_timeout_ms_min: u64,
    /// See `election_timeout_ms_min`. The top of a node's slot is also how long it goes,
    /// leading, without a quorum's acknowledgement before it refuses new requests
    /// (`SubmitError::NoQuorum`): 180, 230 or 280 ms with the defaults.
    #[serde(default = "d_election_ms_max")]
    pub election_timeout_ms_max: u64,
    /// AppendEntries a leader keeps unanswered per follower: 1 sends the next only after the
    /// previous is answered (openraft's default); more pipelines them on a replication
    /// stream of their own (`crate::append_stream`), at most
    /// [`crate::append_stream::APPEND_STREAM_IN_FLIGHT_MAX`].
    #[serde(default = "d_append_in_flight_max")]
    pub append_in_flight_max: usize,
    /// Connections the node's port holds at once (peers, gateways' links, services, tools).
    /// A connection arriving when all are taken displaces the oldest one that has not yet
    /// sent a whole frame; if every one has, the newcomer is closed (`transport::Refusal`).
    #[serde(default = "d_connections_max")]
    pub connections_max: usize,
    /// A connection that sends no whole frame (after its TLS handshake) this long after it
    /// opened is closed: a real peer speaks at once.
    #[serde(default = "d_first_frame_timeout_ms")]
    pub first_frame_timeout_ms: u64,
    /// Connections from one address that have not yet sent a whole frame, at once; a newcomer
    /// past it displaces its own address's longest-waiting one.
    #[serde(default = "d_waiting_per_address_max")]
    pub waiting_per_address_max: usize,
    /// A snapshot is taken every this many log entries (and on demand).
    #[serde(default = "d_snapshot_every")]
    pub snapshot_every_entries: u64,
    /// Log entries kept below a snapshot before they are purged (openraft's
    /// `max_in_snapshot_log_to_keep`): a follower lagging by more catches up by snapshot.
    #[serde(default = "d_log_kept_below_snapshot")]
    pub log_kept_below_snapshot_entries: u64,
    /// Every replica takes a state-hash checkpoint at log indexes that are multiples of this.
    #[serde(default = "d_hash_every")]
    pub hash_checkpoint_every_entries: u64,
    /// How often the leader proposes its newest checkpoint as a hash entry.
    #[serde(default = "d_hash_check_ms")]
    pub hash_check_interval_ms: u64,
    /// Applied entries each node keeps for subscribers of its committed stream (a subscriber
    /// may resume from any of them); at most `stream::STREAM_ENTRIES_KEPT_LIMIT`.
    #[serde(default = "d_stream_entries_kept")]
    pub stream_entries_kept: usize,
    /// Bytes of applied entries each node keeps in that ring (whichever bound is met first
    /// drops the oldest); at most `stream::STREAM_BYTES_KEPT_LIMIT`.
    #[serde(default = "d_stream_bytes_kept")]
    pub stream_bytes_kept: usize,
    /// Newest log entries each node keeps decoded in memory (older ones are read from the
    /// journal), and their bytes: whichever bound is met first drops the oldest.
    #[serde(default = "d_log_tail_entries_kept")]
    pub log_tail_entries_kept: usize,
    #[serde(default = "d_log_tail_bytes_kept")]
    pub log_tail_bytes_kept: usize,
    /// Applied entries each node keeps on disk in its stream archive
    /// (`node-<id>/stream-v2`, see `crate::archive`), from which a consumer older than the
    /// ring catches up; 0 keeps no archive. At most [`STREAM_ARCHIVE_ENTRIES_LIMIT`].
    #[serde(default = "d_stream_archive_entries")]
    pub stream_archive_entries: u64,
    #[serde(default = "d_orders_max")]
    pub orders_max: u32,
    #[serde(default = "d_accounts_max")]
    pub accounts_max: u32,
    #[serde(default = "d_instruments_max")]
    pub instruments_max: u32,
    /// The id this core gives its first order. The cores of one venue start at different
    /// bases (`core_index << bourse_engine::ORDER_ID_CORE_SHIFT`, at least 1) so that an
    /// order id names one order across the venue; a lone core starts at 1.
    #[serde(default = "d_first_order_id")]
    pub first_order_id: u64,
    pub nodes: Vec<NodeAddr>,
    /// The core's market data feeds, published by each node while it leads (`[marketdata]`;
    /// none when absent). See `crate::marketdata`.
    #[serde(default)]
    pub marketdata: Option<crate::marketdata::MarketDataSection>,
    /// Mutual TLS for every link to and between the nodes (`[tls]`: the venue's authority,
    /// each node's certificate and key, `{id}` standing for the node's id). Without it the
    /// nodes speak plain TCP, which only loopback addresses may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
}

impl ClusterConfig {
    /// The node port's admission limits: a connection proves itself with its first whole
    /// frame, within `first_frame_timeout_ms`.
    pub fn admission(&self) -> bourse_admission::Limits {
        bourse_admission::Limits::new(
            self.connections_max,
            self.waiting_per_address_max,
            self.first_frame_timeout_ms,
        )
    }

    pub fn load(path: &Path) -> Result<ClusterConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config: ClusterConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        config.validate()?;
        Ok(config)
    }

    /// A local three-node configuration on the given ports (tests, benchmarks).
    pub fn local(cluster_id: u64, data_dir: PathBuf, ports: [u16; 3]) -> ClusterConfig {
        ClusterConfig {
            cluster_id,
            data_dir,
            fsync: FsyncSetting::Always,
            fsync_interval_ms: d_fsync_interval_ms(),
            heartbeat_ms: d_heartbeat_ms(),
            election_timeout_ms_min: d_election_ms_min(),
            election_timeout_ms_max: d_election_ms_max(),
            append_in_flight_max: d_append_in_flight_max(),
            connections_max: d_connections_max(),
            first_frame_timeout_ms: d_first_frame_timeout_ms(),
            waiting_per_address_max: d_waiting_per_address_max(),
            snapshot_every_entries: d_snapshot_every(),
            log_kept_below_snapshot_entries: d_log_kept_below_snapshot(),
            hash_checkpoint_every_entries: d_hash_every(),
            hash_check_interval_ms: d_hash_check_ms(),
            stream_entries_kept: d_stream_entries_kept(),
            stream_bytes_kept: d_stream_bytes_kept(),
            log_tail_entries_kept: d_log_tail_entries_kept(),
            log_tail_bytes_kept: d_log_tail_bytes_kept(),
            stream_archive_entries: d_stream_archive_entries(),
            orders_max: d_orders_max(),
            accounts_max: d_accounts_max(),
            instruments_max: d_instruments_max(),
            first_order_id: d_first_order_id(),
            nodes: (0..3)
                .map(|i| NodeAddr {
                    id: i as u64 + 1,
                    addr: format!("127.0.0.1:{}", ports[i]),
                    listen: None,
                })
                .collect(),
            marketdata: None,
            tls: None,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.nodes.is_empty() || self.nodes.len() > NODES_MAX {
            return Err(format!("a cluster has 1..={NODES_MAX} nodes"));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            n.check()?;
            if self.nodes[..i]
                .iter()
                .any(|m| m.id == n.id || m.addr == n.addr)
            {
                return Err(format!("node {} repeats an id or an address", n.id));
            }
        }
        if self.heartbeat_ms == 0 || self.election_timeout_ms_min <= self.heartbeat_ms {
            return Err("election_timeout_ms_min must exceed heartbeat_ms > 0".into());
        }
        if self.election_timeout_ms_max <= self.election_timeout_ms_min {
            return Err("election_timeout_ms_max must exceed election_timeout_ms_min".into());
        }
        if self.election_slot_ms() < 5 {
            return Err(format!(
                "election_timeout_ms_max - election_timeout_ms_min must be at least 5 ms per node \
                 (each node draws its timeout from a slot of its own), not {} ms for {} nodes",
                self.election_timeout_ms_max - self.election_timeout_ms_min,
                self.nodes.len()
            ));
        }
        if !CONNECTIONS_MAX_RANGE.contains(&self.connections_max) {
            return Err(format!(
                "connections_max must be {} to {}, not {}",
                CONNECTIONS_MAX_RANGE.start(),
                CONNECTIONS_MAX_RANGE.end(),
                self.connections_max
            ));
        }
        if !(100..=600_000).contains(&self.first_frame_timeout_ms) {
            return Err(format!(
                "first_frame_timeout_ms must be 100 to 600000, not {}",
                self.first_frame_timeout_ms
            ));
        }
        self.admission().validate("cluster")?;
        let in_flight_max = crate::append_stream::APPEND_STREAM_IN_FLIGHT_MAX;
        if !(1..=in_flight_max).contains(&self.append_in_flight_max) {
            return Err(format!(
                "append_in_flight_max must be 1 to {in_flight_max} (1: one AppendEntries at a time), not {}",
                self.append_in_flight_max
            ));
        }
        self.engine_config().check()?;
        if self.snapshot_every_entries == 0 || self.hash_checkpoint_every_entries == 0 {
            return Err(
                "snapshot_every_entries and hash_checkpoint_every_entries must be > 0".into(),
            );
        }
        if self.stream_entries_kept == 0
            || self.stream_entries_kept > crate::stream::STREAM_ENTRIES_KEPT_LIMIT
        {
            return Err(format!(
                "stream_entries_kept must be in 1..={}",
                crate::stream::STREAM_ENTRIES_KEPT_LIMIT
            ));
        }
        if self.stream_bytes_kept == 0
            || self.stream_bytes_kept > crate::stream::STREAM_BYTES_KEPT_LIMIT
        {
            return Err(format!(
                "stream_bytes_kept must be in 1..={}",
                crate::stream::STREAM_BYTES_KEPT_LIMIT
            ));
        }
        if self.log_tail_entries_kept == 0 || self.log_tail_bytes_kept == 0 {
            return Err("log_tail_entries_kept and log_tail_bytes_kept must be positive".into());
        }
        if self.stream_archive_entries > STREAM_ARCHIVE_ENTRIES_LIMIT {
            return Err(format!(
                "stream_archive_entries must be at most {STREAM_ARCHIVE_ENTRIES_LIMIT}"
            ));
        }
        if self.first_order_id == 0 {
            return Err("first_order_id must be at least 1 (order id 0 means no order)".into());
        }
        if self.fsync_interval_ms == 0
            || self.fsync_interval_ms > bourse_journal::FSYNC_INTERVAL_MS_LIMIT
        {
            return Err("fsync_interval_ms out of range".into());
        }
        if let Some(md) = &self.marketdata {
            let ids: Vec<NodeId> = self.nodes.iter().map(|n| n.id).collect();
            md.validate_for(&ids)?;
        }
        if self.tls.is_none() {
            self.check_loopback_only()?;
        }
        Ok(())
    }

    /// Without `[tls]`, every address a node binds or is dialled at must be on the loopback:
    /// plain TCP never leaves the host.
    fn check_loopback_only(&self) -> Result<(), String> {
        for n in &self.nodes {
            let addrs = [Some(&n.addr), n.listen.as_ref()];
            for a in addrs.into_iter().flatten() {
                let ip = a.parse::<SocketAddr>().map(|a| a.ip());
                if ip.is_ok_and(|ip| !ip.is_loopback()) {
                    return Err(format!(
                        "node {}: {a} is not a loopback address, and links off the loopback \
                         need TLS: add [tls] with ca_path, cert_path and key_path \
                         (docs/deploy.md)",
                        n.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// This process reaches every node of the group as node `id` does (its certificate from
    /// `[tls]`): what `bourse node` and the operator's tools on a node's host do. Without
    /// `[tls]`, nothing changes (plain TCP on the loopback).
    pub fn use_tls_as(&self, id: NodeId) -> Result<(), String> {
        if let Some(tls) = self.peer_tls(id)? {
            let addrs: Vec<SocketAddr> = self
                .nodes
                .iter()
                .filter_map(|n| self.addr_of(n.id))
                .collect();
            crate::transport::use_tls_for(&addrs, tls);
        }
        Ok(())
    }

    /// Node `id`'s TLS identity towards its peers (none without `[tls]`).
    pub fn peer_tls(
        &self,
        id: NodeId,
    ) -> Result<Option<Arc<tokio_rustls::rustls::ClientConfig>>, String> {
        match &self.tls {
            Some(files) => files
                .for_node(id)
                .client_config()
                .map(Some)
                .map_err(|e| format!("node {id}: [tls] {e}")),
            None => Ok(None),
        }
    }

    /// Node `id`'s own election timeout window, `(min, max)` in ms: the group's range
    /// (`election_timeout_ms_min..election_timeout_ms_max`) cut into one slot per node in
    /// the order of their ids, each node drawing from the first three fifths of its slot
    /// (150-180, 200-230 and 250-280 ms for three nodes with the defaults). Drawn from the
    /// whole range, the two survivors of a leader's loss started their pre-votes within a
    /// round trip of each other in a few elections in a hundred, both became candidates of
    /// the same term and split the vote, which cost another timeout (~0.3 s). With disjoint
    /// slots the gap between two nodes' timers is at least two fifths of a slot (20 ms with
    /// the defaults: twice openraft's 10 ms tick), so the lower-ranked survivor asks first
    /// and is granted before the other's timer fires. Raft's safety does not rest on these
    /// values, only how soon and how cleanly a successor is elected. openraft takes a node's
    /// `max` as its leader lease too, so it is also how long this node, leading, goes
    /// without a quorum's acknowledgement before it refuses new requests.
    pub fn election_window_ms(&self, id: NodeId) -> (u64, u64) {
        let rank = self.nodes.iter().filter(|n| n.id < id).count() as u64;
        let slot_ms = self.election_slot_ms();
        let width_ms = (slot_ms * 3 / 5).max(1);
        let min_ms = self.election_timeout_ms_min + rank * slot_ms;
        (min_ms, min_ms + width_ms)
    }

    /// One node's share of the election timeout range (`election_window_ms`).
    fn election_slot_ms(&self) -> u64 {
        let slots = (self.nodes.len() as u64).max(1);
        (self.election_timeout_ms_max - self.election_timeout_ms_min) / slots
    }

    /// Where node `id` binds its listener: its `listen` address, or its advertised one.
    pub fn listen_of(&self, id: NodeId) -> Option<SocketAddr> {
        let n = self.nodes.iter().find(|n| n.id == id)?;
        n.listen.as_deref().unwrap_or(&n.addr).parse().ok()
    }

    /// The hosts of every node's advertised address (an IP address as text, or a name): a
    /// certificate naming one of them is a node's (`transport::PeerRole`).
    pub fn node_hosts(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| match n.addr.parse::<SocketAddr>() {
                Ok(a) => a.ip().to_string(),
                Err(_) => n
                    .addr
                    .rsplit_once(':')
                    .map_or(n.addr.as_str(), |(host, _)| host)
                    .to_string(),
            })
            .collect()
    }

    /// Node `id`'s advertised address (where peers, gateways and tools dial it).
    pub fn addr_of(&self, id: NodeId) -> Option<SocketAddr> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .and_then(|n| n.addr.parse().ok())
    }

    pub fn node_dir(&self, id: NodeId) -> PathBuf {
        self.data_dir.join(format!("node-{id}"))
    }

    /// The memory one node of this group sets aside or fills up to, by the key that sizes
    /// it: the engine's tables ([`EngineConfig::preallocations`]), the committed stream's
    /// ring and the log's in-memory tail at their byte bounds (their entry bounds cap only
    /// the count, the bytes cap the memory), and the stream archive's index, which keeps a
    /// u32 record offset per archived entry in memory.
    pub fn preallocations(&self) -> Vec<Preallocation> {
        let mut list = self.engine_config().preallocations();
        list.extend([
            Preallocation::new(
                "stream_bytes_kept",
                self.stream_bytes_kept as u64,
                1,
                "the committed stream's ring",
            ),
            Preallocation::new(
                "log_tail_bytes_kept",
                self.log_tail_bytes_kept as u64,
                1,
                "the log's in-memory tail",
            ),
            Preallocation::new(
                "stream_archive_entries",
                self.stream_archive_entries,
                std::mem::size_of::<u32>() as u64,
                "the stream archive's index",
            ),
        ]);
        list
    }

    /// Refuses a configuration whose [`preallocations`](Self::preallocations) exceed
    /// `available_bytes`, naming the key to lower and the largest value that fits.
    pub fn check_fits(&self, available_bytes: u64) -> Result<(), String> {
        bourse_engine::capacity::check_fits(&self.preallocations(), available_bytes)
    }

    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            orders_max: self.orders_max,
            instruments_max: self.instruments_max,
            accounts_max: self.accounts_max,
            levels_per_side_hint: 64,
            first_order_id: self.first_order_id,
        }
    }

    fn journal_fsync(&self) -> Fsync {
        match self.fsync {
            FsyncSetting::Always => Fsync::Always,
            FsyncSetting::Never => Fsync::Never,
            FsyncSetting::Batch => Fsync::Batch {
                interval_ms: self.fsync_interval_ms,
                bytes_max: 1 << 20,
            },
        }
    }
}

impl NodeAddr {
    /// The advertised address names one host and a port; the listen address parses. Any
    /// address is accepted: the operator's configuration says where a venue runs (tests keep
    /// to 127.0.0.0/8 or namespaces they create).
    fn check(&self) -> Result<(), String> {
        let addr: SocketAddr = self.addr.parse().map_err(|e| {
            format!(
                "node {}: addr {:?}: {e} (an IP address and a port, such as \"10.0.0.1:7001\")",
                self.id, self.addr
            )
        })?;
        if addr.ip().is_unspecified() || addr.ip().is_multicast() || addr.port() == 0 {
            return Err(format!(
                "node {}: addr {} is dialled by peers and gateways, so it must name one host \
                 and a port (put a wildcard such as 0.0.0.0 in `listen`)",
                self.id, self.addr
            ));
        }
        if let Some(listen) = &self.listen {
            let l: SocketAddr = listen.parse().map_err(|e| {
                format!(
                    "node {}: listen {listen:?}: {e} (an IP address and a port)",
                    self.id
                )
            })?;
            // Port 0 (any free port) is allowed here: what peers dial is `addr`; a test that
            // never lets anyone dial the node (the simulator) listens so.
            if l.ip().is_multicast() {
                return Err(format!(
                    "node {}: listen {listen} must be a unicast or wildcard address",
                    self.id
                ));
            }
        }
        Ok(())
    }
}

struct Pending {
    client_id: u64,
    request_seq: u64,
    /// The command as the client encoded it (form and length checked); the batcher copies
    /// it into the batch without decoding it.
    command: Vec<u8>,
    /// Who asked, for an audited request (admin actions); `None`, and no allocation, for
    /// trading requests.
    audit: Option<Audit>,
    reply: ReplyTo,
    /// When the request was read off its connection (ns since the node's stage epoch).
    received_ns: u64,
    /// t2 of a request the monitor samples (see `hooks`); `None` for all others.
    queued_at: Option<std::time::Instant>,
}

/// What the server tasks share.
struct Shared {
    /// How connections are accepted (plain, or TLS with the venue's authority) and the
    /// refusals counted.
    acceptor: Acceptor,
    id: NodeId,
    config: ClusterConfig,
    raft: Raft,
    sm: StateMachineStore,
    alarm: Alarm,
    submit: AdmissionSender<Pending>,
    hooks: Arc<NodeHooks>,
    stages: Arc<Stages>,
    archive: Option<StreamArchive>,
    /// Client commands refused because this leader had no quorum (for the node's monitor).
    no_quorum_refusals: AtomicU64,
    /// Client commands refused because no quorum had acknowledged this new leader yet.
    unconfirmed_refusals: Arc<AtomicU64>,
}

/// A running node. Dropping it does not stop it; call [`Node::shutdown`].
pub struct Node {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    /// Tells every connection task to close (a stopped node must not keep answering on
    /// connections it accepted before, or its peers would talk to a dead raft forever).
    closing: tokio::sync::watch::Sender<bool>,
    /// Copies the committed stream into `Shared::archive` (none without an archive).
    archive_writer: Option<ArchiveWriter>,
    pub addr: SocketAddr,
}

impl Node {
    /// Opens the node's journal and snapshots, starts openraft, initialises a pristine group
    /// with the configured members, and serves on the node's address.
    pub async fn start(config: &ClusterConfig, id: NodeId) -> Result<Node, String> {
        let stages = Arc::new(Stages::new());
        let network = crate::net::Network::with_stages(stages.clone())
            .with_tls(config.peer_tls(id)?)
            .with_append_in_flight_max(config.append_in_flight_max);
        Node::start_with(config, id, network, Arc::new(RealStorage), stages).await
    }

    /// As [`Node::start`], with another network between the nodes (the fault-injecting one
    /// of `sim`, for tests).
    pub async fn start_with_network<N>(
        config: &ClusterConfig,
        id: NodeId,
        network: N,
    ) -> Result<Node, String>
    where
        N: openraft::network::RaftNetworkFactory<crate::TypeConfig>,
        N::Network: openraft::network::NetSnapshot<crate::TypeConfig, SnapshotData = Vec<u8>>,
    {
        let stages = Arc::new(Stages::new());
        Node::start_with(config, id, network, Arc::new(RealStorage), stages).await
    }

    /// As [`Node::start`], with the journal and the snapshots on `storage` (a
    /// `bourse_journal::FaultyStorage` in tests, to fail writes and fsyncs like a full or
    /// dying disk).
    pub async fn start_with_storage(
        config: &ClusterConfig,
        id: NodeId,
        storage: Arc<dyn Storage>,
    ) -> Result<Node, String> {
        let stages = Arc::new(Stages::new());
        let network = crate::net::Network::with_stages(stages.clone())
            .with_tls(config.peer_tls(id)?)
            .with_append_in_flight_max(config.append_in_flight_max);
        Node::start_with(config, id, network, storage, stages).await
    }

    async fn start_with<N>(
        config: &ClusterConfig,
        id: NodeId,
        network: N,
        storage: Arc<dyn Storage>,
        stages: Arc<Stages>,
    ) -> Result<Node, String>
    where
        N: openraft::network::RaftNetworkFactory<crate::TypeConfig>,
        N::Network: openraft::network::NetSnapshot<crate::TypeConfig, SnapshotData = Vec<u8>>,
    {
        config.validate()?;
        // Before the journal and the engine allocate: a capacity the machine cannot hold
        // would abort the process rather than fail.
        crate::machine::check_fits_machine(&config.preallocations())
            .map_err(|why| format!("node {id}: {why}"))?;
        let addr = config
            .listen_of(id)
            .ok_or_else(|| format!("node {id} is not in the configuration"))?;
        let dir = config.node_dir(id);
        let mut jconfig = JournalConfig::new(u128::from(config.cluster_id), id);
        jconfig.fsync = config.journal_fsync();
        let (journal, report) =
            Journal::open_with_storage(storage.clone(), dir.join("journal"), jconfig)
                .map_err(|e| format!("node {id}: journal: {e}"))?;
        if let Some(torn) = &report.torn_tail {
            eprintln!(
                "bourse node {id}: cut a torn tail of {} bytes at {}:{} ({})",
                torn.bytes_dropped,
                torn.file.display(),
                torn.offset,
                torn.reason
            );
        }
        if let Some(lost) = &report.committed_lost {
            eprintln!("bourse node {id}: committed entries lost, catching up from peers: {lost}");
        }
        let (snapshots, _) = SnapshotStore::open_with_storage(
            storage,
            dir.join("snapshots"),
            u128::from(config.cluster_id),
            3,
        )
        .map_err(|e| format!("node {id}: snapshots: {e}"))?;
        let alarm: Alarm = Arc::new(Mutex::new(None));
        let sm = StateMachineStore::open(
            snapshots,
            u128::from(config.cluster_id),
            config.engine_config(),
            config.hash_checkpoint_every_entries,
            alarm.clone(),
        )
        .map_err(|e| format!("node {id}: {e}"))?;
        sm.stream()
            .set_kept(config.stream_entries_kept, config.stream_bytes_kept);
        // The market data numbering is part of the replicated state (crate::marketdata).
        if let Some(md) = &config.marketdata {
            sm.enable_marketdata(&md.publisher_config()).await;
        }
        let archive = if config.stream_archive_entries == 0 {
            None
        } else {
            Some(
                StreamArchive::open(
                    &dir.join(crate::archive::ARCHIVE_DIR),
                    u128::from(config.cluster_id),
                    id,
                    config.stream_archive_entries,
                )
                .map_err(|e| format!("node {id}: {e}"))?,
            )
        };
        let log = LogStore::with_tail_bounds(
            journal,
            config.log_tail_entries_kept,
            config.log_tail_bytes_kept,
        );

        let (election_ms_min, election_ms_max) = config.election_window_ms(id);
        let raft_config = openraft::Config {
            cluster_name: format!("bourse-{}", config.cluster_id),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: election_ms_min,
            election_timeout_max: election_ms_max,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
            max_in_snapshot_log_to_keep: config.log_kept_below_snapshot_entries,
            max_payload_entries: 256,
            // A node that was cut off or paused asks the others first (a pre-vote) and raises
            // its term only if a quorum would elect it: it does not depose a leader the rest
            // of the group still follows when it comes back.
            enable_pre_vote: Some(true),
            // Under `fsync = never` or `batch` a crash may take a follower's acknowledged
            // tail (a torn last record is cut on restart), so its log legitimately ends below
            // the index the leader recorded as matching. openraft 0.10 refuses such a reversal
            // unless told it may happen, and the leader would then never send the follower the
            // entries it lost; allowing it makes the leader search for the follower's match
            // again. A value a quorum accepted is never withdrawn: the other members still hold it.
            allow_log_reversion: Some(true),
            ..Default::default()
        }
        .validate()
        .map_err(|e| format!("raft config: {e}"))?;
        let server_tls = match &config.tls {
            Some(files) => Some(
                files
                    .for_node(id)
                    .server_config()
                    .map_err(|e| format!("node {id}: [tls] {e}"))?,
            ),
            None => None,
        };
        let acceptor = Acceptor::new(id, server_tls, config.node_hosts(), config.admission());
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("node {id}: bind {addr}: {e}"))?;
        let raft = Raft::new(id, Arc::new(raft_config), network, log, sm.clone())
            .await
            .map_err(|e| format!("node {id}: raft: {e}"))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| format!("node {id}: {e}"))?;
        if !initialized {
            // Every pristine member initialises with the same membership; openraft allows it.
            let members: BTreeMap<NodeId, BasicNode> = config
                .nodes
                .iter()
                .map(|n| (n.id, BasicNode::new(n.addr.clone())))
                .collect();
            if let Err(e) = raft.initialize(members).await {
                eprintln!("bourse node {id}: initialize: {e} (another member did it first)");
            }
        }
        let (submit, submit_rx) = admission();
        let hooks = Arc::new(NodeHooks::default());
        let shared = Arc::new(Shared {
            acceptor,
            id,
            config: config.clone(),
            raft,
            sm,
            alarm,
            submit,
            hooks: hooks.clone(),
            stages: stages.clone(),
            archive: archive.clone(),
            no_quorum_refusals: AtomicU64::new(0),
            unconfirmed_refusals: Arc::new(AtomicU64::new(0)),
        });
        let archive_writer = match archive {
            Some(a) => Some(ArchiveWriter::start(
                format!("stream-archive-{id}"),
                a,
                shared.sm.stream().clone(),
            )?),
            None => None,
        };
        let (closing, closing_rx) = tokio::sync::watch::channel(false);
        let mut tasks = vec![
            tokio::spawn(accept_loop(listener, shared.clone(), closing_rx)),
            tokio::spawn(batcher(
                shared.raft.clone(),
                shared.id,
                shared.config.clone(),
                Arc::clone(&shared.unconfirmed_refusals),
                submit_rx,
                hooks,
                stages,
            )),
            tokio::spawn(hash_check_proposer(shared.clone())),
        ];
        if crate::net::net_debug() {
            tasks.push(tokio::spawn(log_role_changes(shared.clone())));
            tasks.push(tokio::spawn(log_quorum_lapses(shared.clone())));
        }
        Ok(Node {
            shared,
            tasks,
            closing,
            archive_writer,
            addr,
        })
    }

    pub fn id(&self) -> NodeId {
        self.shared.id
    }

    /// The connections this node refused before reading a frame (TLS handshakes without a
    /// certificate of the venue's authority, plain bytes, timeouts), by reason.
    pub fn refusals(&self) -> &Arc<Refusals> {
        self.shared.acceptor.refusals()
    }

    pub fn raft(&self) -> &Raft {
        &self.shared.raft
    }

    pub fn state_machine(&self) -> &StateMachineStore {
        &self.shared.sm
    }

    /// The divergence alarm, if a hash check raised one (cheap; status computes the hash).
    pub fn alarm(&self) -> Option<String> {
        self.shared.alarm.lock().expect("alarm lock").clone()
    }

    /// Why this node would refuse a client request now, before proposing it: a state hash
    /// alarm, a leader without a quorum for longer than the election timeout, or a leader just
    /// elected that no quorum has acknowledged yet. `None` when it would take one.
    pub fn refusal(&self) -> Option<SubmitError> {
        refusal_now(&self.shared)
    }

    pub async fn status(&self) -> NodeStatus {
        status(&self.shared, true).await
    }

    /// As [`Node::status`] without hashing the state (`state_hash` 0; `checkpoint` has the
    /// newest hash): cheap enough for a monitor to poll often.
    pub async fn status_brief(&self) -> NodeStatus {
        status(&self.shared, false).await
    }

    /// The node's observation points for its monitor.
    pub fn hooks(&self) -> &NodeHooks {
        &self.shared.hooks
    }

    /// Where requests' time goes inside this node, stage by stage (see [`Stages`]).
    pub fn stages(&self) -> &Stages {
        &self.shared.stages
    }

    /// Client requests queued for the batcher now.
    pub fn batcher_queue_depth(&self) -> usize {
        self.shared.submit.depth()
    }

    /// The committed stream from `from_index` on: every entry this node applies (a follower
    /// applies only committed entries), with each request's key, outcome and events. Fails
    /// with `StreamError::TooOld` when the node no longer keeps `from_index`.
    pub fn subscribe(&self, from_index: u64) -> Result<Subscription, StreamError> {
        self.shared.sm.stream().subscribe(from_index)
    }

    /// A consumer of this node's committed stream from `position` on, which catches up from
    /// the ring or the stream archive when cut off (see `crate::consumer`).
    pub fn consumer(&self, position: u64) -> StreamConsumer {
        StreamConsumer::local(
            self.shared.sm.stream().clone(),
            self.shared.archive.clone(),
            position,
        )
    }

    /// The node's stream archive (none when `stream_archive_entries` is 0).
    pub fn archive(&self) -> Option<&StreamArchive> {
        self.shared.archive.as_ref()
    }

    /// The last request of `client_id` this node applied (0 if none): where a restarted
    /// client continues its numbering.
    pub async fn last_seq(&self, client_id: u64) -> u64 {
        self.shared.sm.last_seq(client_id).await
    }

    /// Stops serving and shuts openraft down (files stay as they are).
    pub async fn shutdown(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.closing.send(true);
        let _ = self.shared.raft.shutdown().await;
        if let Some(w) = self.archive_writer.take() {
            w.stop();
        }
        // Wait until the aborted tasks are gone: the listener is dropped with the accept
        // task, so a node restarted at once on the same address can bind it.
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// The node's status; `hash`: hash the whole state now (else `state_hash` is 0).
async fn status(shared: &Shared, hash: bool) -> NodeStatus {
    let metrics = shared.raft.metrics().borrow().clone();
    let applied = if hash {
        shared.sm.status().await
    } else {
        shared.sm.status_brief().await
    };
    let matched: Vec<(NodeId, Option<u64>)> = metrics
        .replication
        .as_ref()
        .map(|r| r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect())
        .unwrap_or_default();
    let commit_index = if metrics.current_leader == Some(shared.id) {
        crate::hooks::quorum_index(shared.config.nodes.len(), &matched)
    } else {
        shared
            .hooks
            .leader_commit()
            .map(|c| c.min(metrics.last_log_index.unwrap_or(0)))
    };
    NodeStatus {
        checkpoint: applied.checkpoint,
        commit_index,
        id: shared.id,
        state: format!("{:?}", metrics.state),
        term: metrics.current_term,
        leader: metrics.current_leader,
        last_log_index: metrics.last_log_index,
        last_applied_index: applied.last_applied_index,
        snapshot_index: metrics.snapshot.map(|l| l.index),
        state_hash: applied.state_hash,
        commands_applied: applied.commands_applied,
        engine_commands: applied.engine_commands,
        hash_checks_passed: applied.hash_checks_passed,
        matched,
        quorum_lost_ms: quorum_lost_ms(shared),
        no_quorum_refusals: shared.no_quorum_refusals.load(Ordering::Relaxed),
        unconfirmed_refusals: shared.unconfirmed_refusals.load(Ordering::Relaxed),
        // A hash alarm, else the fatal error that stopped openraft (a journal write or fsync
        // failure: fail-stop), so that status says why the node no longer acknowledges.
        alarm: shared
            .alarm
            .lock()
            .expect("alarm lock")
            .clone()
            .or_else(|| {
                metrics
                    .running_state
                    .as_ref()
                    .err()
                    .map(|fatal| format!("stopped: {fatal}"))
            }),
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    closing: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        match listener.accept().await {
            Ok((tcp, from)) => {
                // A place first (`connections_max`, the oldest silent connection displaced
                // when all are taken), then the handshake on the connection's own task,
                // bounded in time and in number, so a slow or hostile peer holds up no one.
                let Some(slot) = shared.acceptor.admit(from) else {
                    continue;
                };
                let shared = shared.clone();
                let closing = closing.clone();
                tokio::spawn(async move {
                    let accepted = tokio::select! {
                        accepted = shared.acceptor.accept(tcp, from) => accepted,
                        _ = slot.closed() => None,
                    };
                    if let Some((stream, role)) = accepted {
                        let door = Door { slot };
                        serve_connection(stream, role, from, door, shared, closing).await;
                    }
                });
            }
            Err(e) => {
                eprintln!("bourse node {}: accept: {e}", shared.id);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The largest run of queued frames a connection's writer joins into one socket write.
const COALESCE_BYTES_MAX: usize = 256 * 1024;

/// Writes a connection's frames; frames queued while a write is in flight go out together in
/// the next one (one system call for many answers under load, no delay when idle).
///
/// The writer holds its connection's output queue only weakly: the queue owns a sender to this
/// writer's own channel, so a strong hold would keep the channel open, and the writer, its
/// socket and task, alive forever after the peer closed (a connection in CLOSE-WAIT per
/// connection ever queued). It ends once every sender is gone and the channel is drained.
async fn connection_writer(
    mut writer: NodeWriteHalf,
    mut rx: mpsc::Receiver<Vec<u8>>,
    out: std::sync::Weak<ConnectionOut>,
) {
    use tokio::io::AsyncWriteExt;
    let mut buf = Vec::with_capacity(64 * 1024);
    while let Some(frame) = rx.recv().await {
        buf.clear();
        buf.extend_from_slice(&frame);
        while buf.len() < COALESCE_BYTES_MAX {
            match rx.try_recv() {
                Ok(frame) => buf.extend_from_slice(&frame),
                Err(_) => break,
            }
        }
        // Flushed: under TLS a write may leave ciphertext in rustls until flushed.
        if writer.write_all(&buf).await.is_err() || writer.flush().await.is_err() {
            return;
        }
        if let Some(out) = out.upgrade() {
            if let Some(queued_ns) = out.stamp.take() {
                out.stages.on_reply_written(queued_ns);
            }
        }
    }
}

/// A connection's output queue, shared by the answers to its requests.
struct ConnectionOut {
    to: mpsc::Sender<Vec<u8>>,
    /// The oldest answer queued and not yet written, for the `reply` stage.
    stamp: ReplyStamp,
    stages: Arc<Stages>,
}

/// Where the answer to one submitted request goes: the tag to echo and the connection's
/// output queue. The batcher sends answers straight there, without a task or a channel per
/// request.
struct ReplyTo {
    tag: u64,
    out: Arc<ConnectionOut>,
}

impl ReplyTo {
    fn send(self, result: Result<Outcome, SubmitError>) {
        let frame = encode_frame(&Tagged {
            tag: self.tag,
            body: Response::Submitted(result),
        });
        self.out.queue(frame);
    }
}

impl ConnectionOut {
    /// Queues frames (one or many, whole) for the connection's writer.
    fn queue(&self, frames: Vec<u8>) {
        match self.to.try_send(frames) {
            Ok(()) => self.stamp.mark(self.stages.now_ns()),
            // A connection whose queue is full is read slowly: wait for it on a task of its
            // own rather than in the batcher.
            Err(mpsc::error::TrySendError::Full(frames)) => {
                let to = self.to.clone();
                tokio::spawn(async move {
                    let _ = to.send(frames).await;
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

/// Answers a batch: the answers to one connection's consecutive requests are encoded into
/// one buffer and queued once (still one frame per request on the wire), so a batch of
/// thousands costs its writer one queue message per connection instead of one per request.
fn answer_batch(
    replies: Vec<ReplyTo>,
    results: impl Iterator<Item = Result<Outcome, SubmitError>>,
) {
    let mut buf = Vec::new();
    let mut current: Option<Arc<ConnectionOut>> = None;
    for (reply, result) in replies.into_iter().zip(results) {
        if current
            .as_ref()
            .is_some_and(|c| !Arc::ptr_eq(c, &reply.out))
        {
            if let Some(out) = current.take() {
                out.queue(std::mem::take(&mut buf));
            }
        }
        encode_frame_into(
            &mut buf,
            &Tagged {
                tag: reply.tag,
                body: Response::Submitted(result),
            },
        );
        current.get_or_insert(reply.out);
    }
    if let Some(out) = current {
        out.queue(buf);
    }
}

/// Sends a subscription's entries to a connection until it ends.
async fn serve_subscription(
    tag: u64,
    from_index: u64,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Vec<u8>>,
) {
    let reply = move |body: Response| encode_frame(&Tagged { tag, body });
    // The node's own consumer: a subscriber behind the ring is served from the archive.
    let mut consumer = StreamConsumer::local(
        shared.sm.stream().clone(),
        shared.archive.clone(),
        from_index,
    );
    loop {
        match consumer.next().await {
            Ok(entry) => {
                // Awaiting a full queue is what makes a slow reader lag, and the lag bound
                // then cuts it off; a reader that stops reading altogether is dropped after
                // a while.
                let frame = reply(Response::Committed {
                    index: entry.index(),
                    entry: entry.entry().encode(),
                });
                match tokio::time::timeout(
                    Duration::from_millis(SUBSCRIBER_STALL_MS),
                    tx.send(frame),
                )
                .await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        let _ = tx.try_send(reply(Response::StreamEnded(StreamError::Lagged {
                            lag_max: crate::stream::STREAM_SUBSCRIBER_LAG_ENTRIES as u64,
                        })));
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(reply(Response::StreamEnded(e))).await;
                return;
            }
        }
    }
}

/// Where a connection's answers go. Node-to-node traffic (AppendEntries, votes) and status
/// queries are strict request/response, so their answers are written by the connection's own
/// task: no hand-off to another task and no wake-up per RPC. The first submit or subscription
/// makes the connection pipelined (answers then come from the batcher's tasks and from
/// subscriptions, in any order), and from then on every answer goes through a writer task's
/// bounded queue, so answers never interleave within a frame.
enum Answers {
    Direct(NodeWriteHalf),
    Queued {
        tx: mpsc::Sender<Vec<u8>>,
        out: Arc<ConnectionOut>,
        writer_task: JoinHandle<()>,
    },
    /// The write half failed or was handed over; the connection is ending.
    Gone,
}

impl Answers {
    /// The queue of a pipelined connection, starting its writer task on first use.
    fn queued(
        &mut self,
        stages: &Arc<Stages>,
    ) -> Option<(mpsc::Sender<Vec<u8>>, Arc<ConnectionOut>)> {
        if let Answers::Direct(_) = self {
            let Answers::Direct(writer) = std::mem::replace(self, Answers::Gone) else {
                unreachable!("matched above")
            };
            let (tx, rx) = mpsc::channel::<Vec<u8>>(CONNECTION_QUEUE_FRAMES_MAX);
            let out = Arc::new(ConnectionOut {
                to: tx.clone(),
                stamp: ReplyStamp::default(),
                stages: stages.clone(),
            });
            let writer_task = tokio::spawn(connection_writer(writer, rx, Arc::downgrade(&out)));
            *self = Answers::Queued {
                tx,
                out,
                writer_task,
            };
        }
        match self {
            Answers::Queued { tx, out, .. } => Some((tx.clone(), out.clone())),
            _ => None,
        }
    }

    /// Sends one answer frame; false when the connection can no longer be written.
    async fn send(&mut self, frame: Vec<u8>) -> bool {
        use tokio::io::AsyncWriteExt;
        match self {
            Answers::Direct(writer) => {
                if writer.write_all(&frame).await.is_err() || writer.flush().await.is_err() {
                    *self = Answers::Gone;
                    return false;
                }
                true
            }
            Answers::Queued { tx, .. } => tx.send(frame).await.is_ok(),
            Answers::Gone => false,
        }
    }
}

/// Whether a request is one only a replica of the group may send.
fn is_raft(request: &Request) -> bool {
    matches!(
        request,
        Request::AppendEntries(_)
            | Request::AppendStream(_)
            | Request::Vote(_)
            | Request::PreVote(_)
            | Request::InstallSnapshot { .. }
    )
}

/// A connection's place at the node's port: until its first whole frame it may be
/// displaced, and it must send one within `first_frame_timeout_ms` (both reported by
/// [`crate::transport::Pass::closed`]).
struct Door {
    slot: crate::transport::Pass,
}

async fn serve_connection(
    stream: NodeStream,
    role: PeerRole,
    from: SocketAddr,
    door: Door,
    shared: Arc<Shared>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    let mut spoke = false;
    let _open = shared.stages.connection_opened();
    let (reader, writer) = stream.into_split();
    // Buffered: a burst of pipelined requests is read in one system call, not two per frame.
    let mut reader = tokio::io::BufReader::with_capacity(crate::net::READ_BUFFER_BYTES, reader);
    let mut answers = Answers::Direct(writer);
    let mut subscriptions: Vec<JoinHandle<()>> = Vec::new();
    // The follower's side of a pipelined replication stream, started by its first request.
    let mut append_pipe: Option<FollowerPipe> = None;
    // One buffer for every frame the connection reads.
    let mut frame = Vec::new();
    loop {
        tokio::select! {
            more = read_frame_into(&mut reader, &mut frame) => match more {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    crate::net::debug_line(format_args!(
                        "node {}: connection from {from}: {e}",
                        shared.id
                    ));
                    break;
                }
            },
            _ = closing.changed() => break,
            _ = door.slot.closed(), if !spoke => break,
        }
        if !spoke {
            door.slot.proven();
            spoke = true;
        }
        let request = match decode_message::<Tagged<Request>>(&frame) {
            Ok(request) => request,
            Err(e) => {
                // A peer that sends garbage gets the connection closed, nothing else.
                crate::net::debug_line(format_args!(
                    "node {}: connection from {from}: {e}",
                    shared.id
                ));
                break;
            }
        };
        let tag = request.tag;
        if role == PeerRole::Client && is_raft(&request.body) {
            // A client's certificate cannot act as a replica: the connection is closed and
            // the refusal counted, and nothing reaches raft.
            shared.acceptor.refusals().count(
                shared.id,
                Refusal::NotANode,
                from,
                "a raft request from a certificate that names no node of the group",
            );
            break;
        }
        let reply = move |body: Response| encode_frame(&Tagged { tag, body });
        let answer = match request.body {
            Request::Submit {
                client_id,
                request_seq,
                command,
            } => {
                let audit = None;
                let Some((_, out)) = answers.queued(&shared.stages) else {
                    break;
                };
                // Queued in arrival order (so one client's pipelined requests keep their
                // order into the log); the batcher answers on this connection's queue.
                let reply_to = ReplyTo { tag, out };
                let received_ns = shared.stages.now_ns();
                if let Err((e, reply_to)) = enqueue(
                    &shared,
                    client_id,
                    request_seq,
                    command,
                    audit,
                    reply_to,
                    received_ns,
                )
                .await
                {
                    reply_to.send(Err(e));
                }
                continue;
            }
            Request::SubmitAudited {
                client_id,
                request_seq,
                command,
                audit,
            } => {
                let Some((_, out)) = answers.queued(&shared.stages) else {
                    break;
                };
                let reply_to = ReplyTo { tag, out };
                let received_ns = shared.stages.now_ns();
                if let Err((e, reply_to)) = enqueue(
                    &shared,
                    client_id,
                    request_seq,
                    command,
                    Some(audit),
                    reply_to,
                    received_ns,
                )
                .await
                {
                    reply_to.send(Err(e));
                }
                continue;
            }
            Request::AppendEntries(rpc) => {
                shared
                    .hooks
                    .on_leader_commit(rpc.leader_commit.map(|l| l.index));
                let timed = (!rpc.entries.is_empty()).then(|| shared.stages.now_ns());
                let r = shared.raft.append_entries(rpc).await;
                if let Some(t) = timed {
                    shared
                        .stages
                        .on_follower_append(shared.stages.now_ns().saturating_sub(t));
                }
                reply(Response::AppendEntries(r))
            }
            Request::AppendStream(rpc) => {
                shared
                    .hooks
                    .on_leader_commit(rpc.leader_commit.map(|l| l.index));
                if append_pipe.is_none() {
                    let Some((tx, _)) = answers.queued(&shared.stages) else {
                        break;
                    };
                    append_pipe = Some(FollowerPipe::start(
                        shared.raft.clone(),
                        shared.stages.clone(),
                        tx,
                    ));
                }
                let pipe = append_pipe.as_ref().expect("started above");
                let received_ns = (!rpc.entries.is_empty()).then(|| shared.stages.now_ns());
                // A pipe that ended (a conflict, a higher vote) takes no more: the leader
                // starts a new stream on a new connection. Never waits (see `FollowerPipe`).
                if !pipe.push(tag, received_ns, rpc) {
                    crate::net::debug_line(format_args!(
                        "node {}: append stream from {from} closed",
                        shared.id
                    ));
                    break;
                }
                continue;
            }
            Request::Vote(rpc) => reply(Response::Vote(shared.raft.vote(rpc).await)),
            Request::PreVote(rpc) => {
                reply(Response::Vote(answer_pre_vote(&shared.raft, rpc).await))
            }
            Request::InstallSnapshot { vote, meta, data } => {
                let snapshot = crate::Snapshot {
                    meta,
                    snapshot: data,
                };
                reply(Response::InstallSnapshot(
                    shared
                        .raft
                        .install_full_snapshot(vote, snapshot)
                        .await
                        .map_err(openraft::error::RaftError::Fatal),
                ))
            }
            Request::Status => reply(Response::Status(status(&shared, true).await)),
            Request::StatusBrief => reply(Response::Status(status(&shared, false).await)),
            Request::Snapshot => {
                let r = shared
                    .raft
                    .trigger()
                    .snapshot()
                    .await
                    .map_err(|e| e.to_string());
                reply(Response::Snapshot(r))
            }
            Request::Subscribe { from_index } => {
                let Some((tx, _)) = answers.queued(&shared.stages) else {
                    break;
                };
                subscriptions.retain(|t| !t.is_finished());
                if subscriptions.len() >= SUBSCRIPTIONS_PER_CONNECTION_MAX {
                    reply(Response::StreamEnded(StreamError::Refused(format!(
                        "at most {SUBSCRIPTIONS_PER_CONNECTION_MAX} subscriptions per connection"
                    ))))
                } else {
                    subscriptions.push(tokio::spawn(serve_subscription(
                        tag,
                        from_index,
                        shared.clone(),
                        tx,
                    )));
                    continue;
                }
            }
            Request::LastSeq { client_id } => {
                reply(Response::LastSeq(shared.sm.last_seq(client_id).await))
            }
            Request::Instruments => reply(Response::Instruments {
                answer: shared.sm.instruments_answer().await.encode(),
            }),
            Request::Query(query) => reply(Response::Query(shared.sm.query_answer(query).await)),
        };
        // A peer that stops reading must not keep a stopping node's task alive.
        let sent = tokio::select! {
            sent = answers.send(answer) => sent,
            _ = closing.changed() => false,
        };
        if !sent {
            break;
        }
    }
    for s in &subscriptions {
        s.abort();
    }
    // Every sender to the writer's queue held here goes before the writer is awaited (the
    // pipe's answer task, the queue itself): the writer then drains what is queued and ends.
    // A pipe first answers what it took, unless the node is stopping.
    if let Some(pipe) = append_pipe.take() {
        if !*closing.borrow() {
            let within =
                Duration::from_millis(crate::append_stream::APPEND_STREAM_FINISH_TIMEOUT_MS);
            pipe.finish(within).await;
        }
    }
    if let Answers::Queued {
        tx,
        out,
        writer_task,
    } = answers
    {
        drop(tx);
        drop(out);
        if *closing.borrow() {
            writer_task.abort();
        } else {
            let _ = writer_task.await;
        }
    }
}

async fn enqueue(
    shared: &Shared,
    client_id: u64,
    request_seq: u64,
    command: Vec<u8>,
    audit: Option<Audit>,
    reply: ReplyTo,
    received_ns: u64,
) -> Result<(), (SubmitError, ReplyTo)> {
    if let Err(e) = check_command_form(&command) {
        return Err((SubmitError::Invalid(e.to_string()), reply));
    }
    // A trailer out of its limits would make the entry unreadable: refused here, named.
    if let Some(Err(e)) = audit.as_ref().map(Audit::check) {
        return Err((SubmitError::Invalid(e), reply));
    }
    if let Some(refusal) = refusal_now(shared) {
        let counter = match refusal {
            SubmitError::NoQuorum { .. } => Some(&shared.no_quorum_refusals),
            SubmitError::LeaderUnconfirmed => Some(&*shared.unconfirmed_refusals),
            _ => None,
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        return Err((refusal, reply));
    }
    let pending = Pending {
        client_id,
        request_seq,
        command,
        audit,
        reply,
        received_ns,
        queued_at: shared.hooks.sample_t2(),
    };
    shared
        .submit
        .send(client_id, pending)
        .await
        .map_err(|p| (SubmitError::Unavailable("node is stopping".into()), p.reply))
}

/// Why this node refuses a client request now, before proposing it; `None` when it takes it
/// (a follower takes it too: openraft then answers where the leader is). Refused at once
/// rather than proposed into a log that cannot commit, or that openraft would refuse, so that
/// the client hears why instead of waiting out its attempt.
fn refusal_now(shared: &Shared) -> Option<SubmitError> {
    if shared.alarm.lock().expect("alarm lock").is_some() {
        return Some(SubmitError::Unavailable(
            "node is out: state hash alarm".into(),
        ));
    }
    match quorum_state(&shared.raft, shared.id, lease_ms(&shared.config, shared.id)) {
        QuorumState::Held => None,
        QuorumState::Lost { quorum_ack_ms_ago } => {
            Some(SubmitError::NoQuorum { quorum_ack_ms_ago })
        }
        QuorumState::NotYet => Some(SubmitError::LeaderUnconfirmed),
    }
}

/// Whether a quorum stands behind this node as leader, as far as taking a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QuorumState {
    /// It leads with a quorum's recent acknowledgement, or does not lead (then openraft
    /// answers with the leader it knows).
    Held,
    /// No quorum has acknowledged it for longer than its lease (or since it was elected,
    /// longer ago than that): its followers would soon elect another leader if they could
    /// hear each other.
    Lost { quorum_ack_ms_ago: u64 },
    /// Elected less than its lease ago, and no quorum has acknowledged it yet:
    /// openraft accepts no write before one does (its leader lease), and answers
    /// `ForwardToLeader` without a leader, which a client would take as "try another node".
    NotYet,
}

/// Answers a peer's pre-vote. A refusal because the asker's log is shorter, from a node that
/// does not lead, means the asker has heard no leader for its lease and timeout and that this
/// node holds entries it lacks; Raft can elect only a node whose log is as long as a quorum's,
/// so rather than wait out its own timer (a slot or two later, `ClusterConfig::election_window_ms`)
/// this node runs its own pre-vote round now. openraft refuses that round locally while this
/// node's own lease is valid, so a node that still hears its leader changes nothing; a leader
/// ignores the trigger.
pub(crate) async fn answer_pre_vote(
    raft: &Raft,
    rpc: openraft::raft::VoteRequest<TypeConfig>,
) -> Result<openraft::raft::VoteResponse<TypeConfig>, openraft::error::RaftError<TypeConfig>> {
    let asker_last_log = rpc.last_log_id;
    let answer = raft.pre_vote(rpc).await?;
    if !answer.vote_granted && answer.last_log_id > asker_last_log {
        // Sends the trigger to the core and returns; an error means the core stopped, which
        // the node's own checks report.
        let _ = raft.trigger().elect(true).await;
    }
    Ok(answer)
}

/// Node `id`'s leader lease in ms: the top of its own election window, which openraft takes
/// as the lease (`ClusterConfig::election_window_ms`).
fn lease_ms(config: &ClusterConfig, id: NodeId) -> u64 {
    config.election_window_ms(id).1
}

fn quorum_state(raft: &Raft, id: NodeId, lease_ms: u64) -> QuorumState {
    let metrics = raft.metrics();
    let m = metrics.borrow();
    // A node whose raft core stopped (a journal write or fsync failed: fail-stop) keeps
    // naming itself leader in its last metrics; it is not waiting for a quorum but gone, and
    // its proposal is answered `Unavailable`, which sends the client on to the other nodes.
    if m.current_leader != Some(id) || m.running_state.is_err() {
        return QuorumState::Held;
    }
    // Not 0.10's `last_quorum_acked`: a leader that is a quorum by itself (a one-node group)
    // keeps the instant of its last acknowledgement there, which ages, while
    // `millis_since_quorum_ack` reports 0 for it (as 0.9 did).
    #[allow(deprecated)]
    if let Some(quorum_ack_ms_ago) = m.millis_since_quorum_ack {
        return if quorum_ack_ms_ago > lease_ms {
            QuorumState::Lost { quorum_ack_ms_ago }
        } else {
            QuorumState::Held
        };
    }
    // No quorum has acknowledged this leader yet. Its own entry in the heartbeat metrics
    // holds when it took office (or sent the newest RPC one follower answered): unconfirmed
    // for longer than its lease, it is as good as lost (elected, then cut off before its
    // first quorum).
    let in_office = m
        .heartbeat
        .as_ref()
        .and_then(|h| h.get(&id).copied().flatten());
    match in_office.map(|since| openraft::Instant::elapsed(&*since).as_millis() as u64) {
        Some(ms) if ms > lease_ms => QuorumState::Lost {
            quorum_ack_ms_ago: ms,
        },
        _ => QuorumState::NotYet,
    }
}

/// For the node's status: how long ago a quorum last acknowledged this leader, when that is
/// longer than its lease (it refuses new requests meanwhile).
fn quorum_lost_ms(shared: &Shared) -> Option<u64> {
    match quorum_state(&shared.raft, shared.id, lease_ms(&shared.config, shared.id)) {
        QuorumState::Lost { quorum_ack_ms_ago } => Some(quorum_ack_ms_ago),
        QuorumState::Held | QuorumState::NotYet => None,
    }
}

/// Smart batching: takes whatever requests are queued (up to the batch limit) as one entry;
/// while `BATCHES_IN_FLIGHT_MAX` batches await commit, new requests queue and form the next.
/// Trading requests are taken before bulk ones (see `admission`).
async fn batcher(
    raft: Raft,
    id: NodeId,
    config: ClusterConfig,
    unconfirmed_refusals: Arc<AtomicU64>,
    mut rx: Admission<Pending>,
    hooks: Arc<NodeHooks>,
    stages: Arc<Stages>,
) {
    // Shared by the batches' tasks (a clone per batch would copy every member's address).
    let config = Arc::new(config);
    loop {
        let Some((batch, permit)) = rx.next_batch().await else {
            return;
        };
        // The batch's t2 for the monitor: its first sampled request's (rarely any).
        let queued_at = batch.iter().find_map(|p| p.queued_at);
        let mut stamps = BatchStamps {
            received_ns: batch[0].received_ns,
            taken_ns: stages.now_ns(),
            proposed_ns: 0,
            requests: batch.len() as u64,
        };
        let mut requests = BatchBuilder::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        for p in batch {
            // `enqueue` checked the form already; the check is two comparisons.
            let audit = p.audit.as_ref().map(Audit::borrowed);
            match requests.push_encoded_audited(p.client_id, p.request_seq, &p.command, audit) {
                Ok(()) => replies.push(p.reply),
                Err(e) => p.reply.send(Err(SubmitError::Invalid(e.to_string()))),
            }
        }
        let (responder, receiver) = openraft::impls::ProgressResponder::complete_only();
        match raft
            .client_write_ff(LogCommand::Batch(requests.finish()), Some(responder))
            .await
        {
            Ok(()) => {}
            Err(fatal) => {
                for reply in replies {
                    reply.send(Err(SubmitError::Unavailable(fatal.to_string())));
                }
                continue;
            }
        };
        stamps.proposed_ns = stages.now_ns();
        let config = config.clone();
        let hooks = hooks.clone();
        let stages = stages.clone();
        let raft = raft.clone();
        let unconfirmed_refusals = Arc::clone(&unconfirmed_refusals);
        tokio::spawn(async move {
            let _permit = permit;
            let answer: Result<Vec<Outcome>, SubmitError> = match receiver.await {
                Ok(Ok(response)) => {
                    if let Some(t2) = queued_at {
                        hooks.on_answered(response.log_id.index, t2);
                    }
                    stages.on_batch_answered(response.log_id.index, &stamps);
                    Ok(response.data)
                }
                Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
                    let refusal = forward_refusal(&f, &raft, id, &config);
                    if refusal == SubmitError::LeaderUnconfirmed {
                        unconfirmed_refusals.fetch_add(replies.len() as u64, Ordering::Relaxed);
                    }
                    Err(refusal)
                }
                Ok(Err(e)) => Err(SubmitError::Unavailable(e.to_string())),
                Err(_) => Err(SubmitError::Unavailable(
                    "leadership or node lost while the batch was in flight".into(),
                )),
            };
            match answer {
                Ok(outcomes) => {
                    assert_eq!(outcomes.len(), replies.len(), "one outcome per request");
                    answer_batch(replies, outcomes.into_iter().map(Ok));
                }
                Err(e) => {
                    let n = replies.len();
                    answer_batch(replies, std::iter::repeat_n(Err(e), n));
                }
            }
        });
    }
}

/// What a client hears when openraft would not take a batch and named where to go instead.
/// A leader whose lease is not (or no longer) held gets no hint from openraft; this node tells
/// the client why, so that it waits here for a just-elected leader's first quorum, or holds
/// for a lost one, rather than moving on to a follower that knows no leader either.
fn forward_refusal(
    f: &ForwardToLeader<TypeConfig>,
    raft: &Raft,
    id: NodeId,
    config: &ClusterConfig,
) -> SubmitError {
    if f.reason == ForwardReason::LeaseExpired {
        match quorum_state(raft, id, lease_ms(config, id)) {
            QuorumState::NotYet => return SubmitError::LeaderUnconfirmed,
            QuorumState::Lost { quorum_ack_ms_ago } => {
                return SubmitError::NoQuorum { quorum_ack_ms_ago }
            }
            // The lease lapsed a moment before the metrics say so, or the node no longer
            // leads: the leader it knows, if any, is the answer.
            QuorumState::Held => {}
        }
    }
    SubmitError::NotLeader {
        leader: f.leader_id.and_then(|leader| {
            config
                .nodes
                .iter()
                .find(|n| n.id == leader)
                .map(|n| (leader, n.addr.clone()))
        }),
    }
}

/// With `BOURSE_NET_DEBUG`: a line each time this node's term, leader or role changes, so that
/// its RPC failures can be read against its elections.
async fn log_role_changes(shared: Arc<Shared>) {
    let mut metrics = shared.raft.metrics();
    let mut last = None;
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            (m.current_term, m.current_leader, m.state)
        };
        if last != Some(now) {
            let (term, leader, role) = now;
            crate::net::debug_line(format_args!(
                "node {}: term {term}, leader {leader:?}, {role:?}",
                shared.id
            ));
            last = Some(now);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// How often the quorum-lapse logger looks at the leader's metrics.
const QUORUM_WATCH_MS: u64 = 25;
/// While a lapse lasts, its line is repeated at most this often.
const QUORUM_LAPSE_REPEAT_MS: u64 = 200;

/// With `BOURSE_NET_DEBUG`, on a leader: a line when no quorum has acknowledged it for more
/// than two heartbeats, repeated while that lasts and closed when a quorum answers again.
/// Each names, per follower, the last entry it matched and how long ago it last answered, so
/// that a lapse can be told apart as a follower gone silent or one answering but behind (a
/// leader's quorum time is the send time of the requests a quorum has answered, so a
/// follower that answers a deep backlog still leaves it without a recent quorum).
async fn log_quorum_lapses(shared: Arc<Shared>) {
    let metrics = shared.raft.metrics();
    let lapse_ms_min = 2 * shared.config.heartbeat_ms;
    let mut lapse_since: Option<std::time::Instant> = None;
    let mut last_line: Option<std::time::Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(QUORUM_WATCH_MS)).await;
        let line = {
            let m = metrics.borrow();
            #[allow(deprecated)]
            let ago_ms = m.millis_since_quorum_ack;
            let leading = m.current_leader == Some(shared.id) && m.running_state.is_ok();
            ago_ms
                .filter(|&ms| leading && ms > lapse_ms_min)
                .map(|ms| quorum_lapse_line(&m, ms))
        };
        match (line, lapse_since) {
            (Some(line), _) => {
                let due = last_line
                    .is_none_or(|t| t.elapsed() >= Duration::from_millis(QUORUM_LAPSE_REPEAT_MS));
                if due {
                    crate::net::debug_line(format_args!("node {}: {line}", shared.id));
                    last_line = Some(std::time::Instant::now());
                }
                lapse_since.get_or_insert_with(std::time::Instant::now);
            }
            (None, Some(since)) => {
                crate::net::debug_line(format_args!(
                    "node {}: a quorum acknowledges again ({} ms after the lapse was seen)",
                    shared.id,
                    since.elapsed().as_millis()
                ));
                lapse_since = None;
                last_line = None;
            }
            (None, None) => {}
        }
    }
}

/// One quorum-lapse line: the leader's log and each follower's match and last answer.
fn quorum_lapse_line(m: &openraft::RaftMetrics<crate::TypeConfig>, ago_ms: u64) -> String {
    use openraft::Instant as _;
    use std::fmt::Write as _;
    #[allow(deprecated)]
    let committed = m.committed.map(|l| l.index);
    let mut line = format!(
        "leader without a quorum acknowledgement for {ago_ms} ms: last log {:?}, committed \
         {committed:?}",
        m.last_log_index
    );
    let matched = m.replication.as_ref();
    for (id, acked) in m.heartbeat.iter().flatten().filter(|(id, _)| **id != m.id) {
        let matched = matched
            .and_then(|r| r.get(id))
            .and_then(|l| l.map(|l| l.index));
        let acked_ms = acked.map(|t| t.elapsed().as_millis());
        let _ = write!(
            line,
            "; node {id}: matched {matched:?}, answered {acked_ms:?} ms ago"
        );
    }
    line
}

/// The leader periodically puts its newest hash checkpoint in the log; every replica that
/// has a checkpoint at the same index compares and stops on a mismatch.
async fn hash_check_proposer(shared: Arc<Shared>) {
    let mut last_proposed: Option<u64> = None;
    let period = Duration::from_millis(shared.config.hash_check_interval_ms.max(10));
    loop {
        tokio::time::sleep(period).await;
        let is_leader = shared.raft.metrics().borrow().current_leader == Some(shared.id);
        if !is_leader {
            continue;
        }
        let Some((index, state_hash)) = shared.sm.last_checkpoint().await else {
            continue;
        };
        if last_proposed == Some(index) {
            continue;
        }
        last_proposed = Some(index);
        // Fire and forget: if leadership is lost, the next leader proposes its own.
        let _ = shared
            .raft
            .client_write_ff(LogCommand::HashCheck { index, state_hash }, None)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_default_node_fits_in_a_hundred_mebibytes() {
        let config = ClusterConfig::local(1, PathBuf::from("/tmp/unused"), [7001, 7002, 7003]);
        let total_bytes: u64 = config.preallocations().iter().map(|p| p.bytes()).sum();
        assert!(total_bytes < 100 << 20, "{total_bytes}");
        assert_eq!(config.check_fits(GIB), Ok(()));
    }

    #[test]
    fn an_orders_max_beyond_the_memory_is_refused_by_its_key() {
        let mut config = ClusterConfig::local(1, PathBuf::from("/tmp/unused"), [7001, 7002, 7003]);
        config.orders_max = 4_294_967_294;
        assert_eq!(config.validate(), Ok(()));
        let text = config.check_fits(23 * GIB).unwrap_err();
        assert!(text.starts_with("orders_max 4294967294 needs "), "{text}");
        assert!(text.contains("23.0 GiB available; at most "), "{text}");
    }

    #[test]
    fn a_log_tail_byte_bound_beyond_the_memory_is_refused_by_its_key() {
        let mut config = ClusterConfig::local(1, PathBuf::from("/tmp/unused"), [7001, 7002, 7003]);
        config.log_tail_bytes_kept = 1 << 40;
        let text = config.check_fits(23 * GIB).unwrap_err();
        assert!(
            text.starts_with("log_tail_bytes_kept 1099511627776 needs 1.0 TiB"),
            "{text}"
        );
    }

    #[test]
    fn the_archive_index_is_charged_a_u32_per_entry() {
        let mut config = ClusterConfig::local(1, PathBuf::from("/tmp/unused"), [7001, 7002, 7003]);
        config.stream_archive_entries = STREAM_ARCHIVE_ENTRIES_LIMIT;
        let archive = config.preallocations().pop().unwrap();
        assert_eq!(archive.setting, "stream_archive_entries");
        assert_eq!(archive.bytes(), 16 * GIB);
        assert!(config
            .check_fits(8 * GIB)
            .unwrap_err()
            .starts_with("stream_archive_entries"));
    }

    #[test]
    fn election_windows_are_disjoint_slots_in_the_order_of_node_ids() {
        let mut config = ClusterConfig::local(1, PathBuf::from("/tmp/unused"), [7001, 7002, 7003]);
        config.nodes.reverse();
        let windows: Vec<(u64, u64)> = [1, 2, 3]
            .iter()
            .map(|&id| config.election_window_ms(id))
            .collect();
        assert_eq!(windows, vec![(150, 180), (200, 230), (250, 280)]);
        config.election_timeout_ms_max = config.election_timeout_ms_min + 14;
        let refused = config.validate().expect_err("5 ms per node at least");
        assert!(refused.contains("at least 5 ms per node"), "{refused}");
    }

    #[test]
    fn the_example_config_loads_and_validates() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.toml");
        let config = ClusterConfig::load(&path).expect("examples/cluster.toml is valid");
        assert_eq!(config.nodes.len(), 3);
        assert_eq!(config.fsync, FsyncSetting::Always);
    }

    #[test]
    fn a_misspelled_key_in_any_table_is_refused_naming_its_line_and_field() {
        let example = include_str!("../../../examples/cluster.toml");
        let lines =
            |text: &str, key: &str| text.lines().position(|l| l.starts_with(key)).map(|i| i + 1);
        for (good, bad) in [
            ("heartbeat_ms =", "heartbeat_mss ="),
            ("addr = \"127.0.0.1:7102\"", "adr = \"127.0.0.1:7102\""),
        ] {
            let text = example.replacen(good, bad, 1);
            let field = bad.split(' ').next().unwrap();
            let line = lines(&text, field).unwrap();
            let e = toml::from_str::<ClusterConfig>(&text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("unknown field `{field}`")), "{e}");
            assert!(e.contains(&format!("line {line}")), "{e}");
        }
        let text = format!("{example}\n[marketdata]\nbase_prot = 32000\n");
        let e = toml::from_str::<ClusterConfig>(&text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `base_prot`"), "{e}");
    }

    #[test]
    fn a_node_on_any_host_is_accepted_and_a_wildcard_or_repeated_address_is_refused() {
        let mut config = ClusterConfig::local(1, PathBuf::from("x"), [7001, 7002, 7003]);
        assert!(config.validate().is_ok());
        config.nodes[1].addr = "10.0.0.2:7002".into();
        config.nodes[1].listen = Some("0.0.0.0:7002".into());
        // Off the loopback only with TLS.
        let e = config.validate().unwrap_err();
        assert!(
            e.contains("node 2: 10.0.0.2:7002 is not a loopback address") && e.contains("[tls]"),
            "{e}"
        );
        config.nodes[1].addr = "127.0.0.2:7002".into();
        let e = config.validate().unwrap_err();
        assert!(e.contains("node 2: 0.0.0.0:7002 is not a loopback"), "{e}");
        config.nodes[1].addr = "10.0.0.2:7002".into();
        config.tls = Some(TlsFiles {
            ca_path: "ca.crt".into(),
            cert_path: "node-{id}.crt".into(),
            key_path: "node-{id}.key".into(),
        });
        assert!(config.validate().is_ok());
        assert_eq!(
            config.tls.as_ref().unwrap().for_node(2).cert_path,
            PathBuf::from("node-2.crt")
        );
        assert_eq!(config.addr_of(2), Some("10.0.0.2:7002".parse().unwrap()));
        assert_eq!(config.listen_of(2), Some("0.0.0.0:7002".parse().unwrap()));
        assert_eq!(config.listen_of(1), config.addr_of(1));
        for (addr, listen, says) in [
            ("0.0.0.0:7002", None, "must name one host"),
            ("10.0.0.2:0", None, "must name one host"),
            ("node-2:7002", None, "an IP address and a port"),
            (
                "10.0.0.2:7002",
                Some("239.1.1.1:7002"),
                "unicast or wildcard",
            ),
            ("10.0.0.2:7002", Some("nowhere"), "listen \"nowhere\""),
        ] {
            config.nodes[1].addr = addr.into();
            config.nodes[1].listen = listen.map(String::from);
            let e = config.validate().unwrap_err();
            assert!(
                e.contains("node 2") && e.contains(says),
                "{addr} {listen:?}: {e}"
            );
        }
        config.nodes[1].listen = None;
        config.nodes[1].addr = "127.0.0.1:7001".into();
        assert!(config.validate().unwrap_err().contains("repeats"));
    }
}
