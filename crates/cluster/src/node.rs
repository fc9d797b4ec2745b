//! One node of a replica group: configuration, start-up, the smart batcher, the hash-check
//! proposer and the TCP server.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bourse_engine::EngineConfig;
use bourse_journal::{Config as JournalConfig, Fsync, Journal, SnapshotStore};
use openraft::error::ClientWriteError;
use openraft::{BasicNode, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::batch::{decode_command, ClientRequest, LogCommand, REQUESTS_PER_BATCH_MAX};
use crate::net::{
    decode_message, encode_frame, read_frame, NodeStatus, Request, Response, SubmitError, Tagged,
};
use crate::state::Outcome;
use crate::storage::{Alarm, LogStore, StateMachineStore};
use crate::{NodeId, Raft};

/// Client requests a node queues for the batcher before it pushes back on connections.
pub const PENDING_REQUESTS_MAX: usize = 65_536;
/// Batches proposed to openraft and not yet answered. More arriving requests wait and form the
/// next, larger batch (smart batching).
pub const BATCHES_IN_FLIGHT_MAX: usize = 4;
/// Frames queued for one connection's writer.
pub const CONNECTION_QUEUE_FRAMES_MAX: usize = 4096;
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

/// A member's id and address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    pub id: NodeId,
    pub addr: String,
}

fn d_heartbeat_ms() -> u64 {
    50
}
fn d_election_ms_min() -> u64 {
    300
}
fn d_election_ms_max() -> u64 {
    600
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
fn d_orders_max() -> u32 {
    1 << 16
}
fn d_accounts_max() -> u32 {
    100_000
}
fn d_instruments_max() -> u32 {
    1_024
}

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
    /// Under `fsync = "batch"`: the longest an append waits for its fsync.
    #[serde(default = "d_fsync_interval_ms")]
    pub fsync_interval_ms: u32,
    #[serde(default = "d_heartbeat_ms")]
    pub heartbeat_ms: u64,
    #[serde(default = "d_election_ms_min")]
    pub election_timeout_ms_min: u64,
    #[serde(default = "d_election_ms_max")]
    pub election_timeout_ms_max: u64,
    /// A snapshot is taken every this many log entries (and on demand).
    #[serde(default = "d_snapshot_every")]
    pub snapshot_every_entries: u64,
    /// Every replica takes a state-hash checkpoint at log indexes that are multiples of this.
    #[serde(default = "d_hash_every")]
    pub hash_checkpoint_every_entries: u64,
    /// How often the leader proposes its newest checkpoint as a hash entry.
    #[serde(default = "d_hash_check_ms")]
    pub hash_check_interval_ms: u64,
    #[serde(default = "d_orders_max")]
    pub orders_max: u32,
    #[serde(default = "d_accounts_max")]
    pub accounts_max: u32,
    #[serde(default = "d_instruments_max")]
    pub instruments_max: u32,
    pub nodes: Vec<NodeAddr>,
}

impl ClusterConfig {
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
            snapshot_every_entries: d_snapshot_every(),
            hash_checkpoint_every_entries: d_hash_every(),
            hash_check_interval_ms: d_hash_check_ms(),
            orders_max: d_orders_max(),
            accounts_max: d_accounts_max(),
            instruments_max: d_instruments_max(),
            nodes: (0..3)
                .map(|i| NodeAddr {
                    id: i as u64 + 1,
                    addr: format!("127.0.0.1:{}", ports[i]),
                })
                .collect(),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.nodes.is_empty() || self.nodes.len() > NODES_MAX {
            return Err(format!("a cluster has 1..={NODES_MAX} nodes"));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let addr: SocketAddr = n
                .addr
                .parse()
                .map_err(|e| format!("node {}: address {:?}: {e}", n.id, n.addr))?;
            // Network safety: replication traffic stays on this machine.
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "node {}: {} is not a loopback address",
                    n.id, n.addr
                ));
            }
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
        if self.snapshot_every_entries == 0 || self.hash_checkpoint_every_entries == 0 {
            return Err(
                "snapshot_every_entries and hash_checkpoint_every_entries must be > 0".into(),
            );
        }
        if self.fsync_interval_ms == 0
            || self.fsync_interval_ms > bourse_journal::FSYNC_INTERVAL_MS_LIMIT
        {
            return Err("fsync_interval_ms out of range".into());
        }
        Ok(())
    }

    pub fn addr_of(&self, id: NodeId) -> Option<SocketAddr> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .and_then(|n| n.addr.parse().ok())
    }

    pub fn node_dir(&self, id: NodeId) -> PathBuf {
        self.data_dir.join(format!("node-{id}"))
    }

    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            orders_max: self.orders_max,
            instruments_max: self.instruments_max,
            accounts_max: self.accounts_max,
            levels_per_side_hint: 64,
            first_order_id: 1,
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

struct Pending {
    request: ClientRequest,
    reply: oneshot::Sender<Result<Outcome, SubmitError>>,
}

/// What the server tasks share.
struct Shared {
    id: NodeId,
    config: ClusterConfig,
    raft: Raft,
    sm: StateMachineStore,
    alarm: Alarm,
    submit: mpsc::Sender<Pending>,
}

/// A running node. Dropping it does not stop it; call [`Node::shutdown`].
pub struct Node {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    /// Tells every connection task to close (a stopped node must not keep answering on
    /// connections it accepted before, or its peers would talk to a dead raft forever).
    closing: tokio::sync::watch::Sender<bool>,
    pub addr: SocketAddr,
}

impl Node {
    /// Opens the node's journal and snapshots, starts openraft, initialises a pristine group
    /// with the configured members, and serves on the node's address.
    pub async fn start(config: &ClusterConfig, id: NodeId) -> Result<Node, String> {
        Node::start_with_network(config, id, crate::net::Network).await
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
    {
        config.validate()?;
        let addr = config
            .addr_of(id)
            .ok_or_else(|| format!("node {id} is not in the configuration"))?;
        let dir = config.node_dir(id);
        let mut jconfig = JournalConfig::new(u128::from(config.cluster_id), id);
        jconfig.fsync = config.journal_fsync();
        let (journal, report) = Journal::open(dir.join("journal"), jconfig)
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
        let (snapshots, _) =
            SnapshotStore::open(dir.join("snapshots"), u128::from(config.cluster_id), 3)
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
        let log = LogStore::new(journal);

        let raft_config = openraft::Config {
            cluster_name: format!("bourse-{}", config.cluster_id),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: config.election_timeout_ms_min,
            election_timeout_max: config.election_timeout_ms_max,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
            max_in_snapshot_log_to_keep: 1_000,
            max_payload_entries: 256,
            ..Default::default()
        }
        .validate()
        .map_err(|e| format!("raft config: {e}"))?;
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
        let (submit, submit_rx) = mpsc::channel(PENDING_REQUESTS_MAX);
        let shared = Arc::new(Shared {
            id,
            config: config.clone(),
            raft,
            sm,
            alarm,
            submit,
        });
        let (closing, closing_rx) = tokio::sync::watch::channel(false);
        let tasks = vec![
            tokio::spawn(accept_loop(listener, shared.clone(), closing_rx)),
            tokio::spawn(batcher(
                shared.raft.clone(),
                shared.config.clone(),
                submit_rx,
            )),
            tokio::spawn(hash_check_proposer(shared.clone())),
        ];
        Ok(Node {
            shared,
            tasks,
            closing,
            addr,
        })
    }

    pub fn id(&self) -> NodeId {
        self.shared.id
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

    pub async fn status(&self) -> NodeStatus {
        status(&self.shared).await
    }

    /// Stops serving and shuts openraft down (files stay as they are).
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.closing.send(true);
        let _ = self.shared.raft.shutdown().await;
    }
}

async fn status(shared: &Shared) -> NodeStatus {
    let metrics = shared.raft.metrics().borrow().clone();
    let applied = shared.sm.status().await;
    NodeStatus {
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
        matched: metrics
            .replication
            .map(|r| r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect())
            .unwrap_or_default(),
        alarm: shared.alarm.lock().expect("alarm lock").clone(),
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    closing: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_connection(stream, shared.clone(), closing.clone()));
            }
            Err(e) => {
                eprintln!("bourse node {}: accept: {e}", shared.id);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    mut closing: tokio::sync::watch::Receiver<bool>,
) {
    let (mut reader, mut writer) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(CONNECTION_QUEUE_FRAMES_MAX);
    let writer_task = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Some(frame) = rx.recv().await {
            if writer.write_all(&frame).await.is_err() {
                return;
            }
        }
    });
    loop {
        let frame = tokio::select! {
            frame = read_frame(&mut reader) => match frame {
                Ok(Some(frame)) => frame,
                Ok(None) | Err(_) => break,
            },
            _ = closing.changed() => break,
        };
        let Ok(request) = decode_message::<Tagged<Request>>(&frame) else {
            // A peer that sends garbage gets the connection closed, nothing else.
            break;
        };
        let tag = request.tag;
        let reply = move |body: Response| encode_frame(&Tagged { tag, body });
        match request.body {
            Request::Submit {
                client_id,
                request_seq,
                command,
            } => {
                // Queue in arrival order (so one client's pipelined requests keep their
                // order into the log); only the wait for the commit runs on its own task.
                let queued = enqueue(&shared, client_id, request_seq, &command).await;
                let tx = tx.clone();
                tokio::spawn(async move {
                    let result = match queued {
                        Ok(rx) => rx.await.unwrap_or_else(|_| {
                            Err(SubmitError::Unavailable("request dropped".into()))
                        }),
                        Err(e) => Err(e),
                    };
                    let _ = tx.send(reply(Response::Submitted(result))).await;
                });
            }
            Request::AppendEntries(rpc) => {
                let r = shared.raft.append_entries(rpc).await;
                let _ = tx.send(reply(Response::AppendEntries(r))).await;
            }
            Request::Vote(rpc) => {
                let r = shared.raft.vote(rpc).await;
                let _ = tx.send(reply(Response::Vote(r))).await;
            }
            Request::InstallSnapshot(rpc) => {
                let r = shared.raft.install_snapshot(rpc).await;
                let _ = tx.send(reply(Response::InstallSnapshot(r))).await;
            }
            Request::Status => {
                let s = status(&shared).await;
                let _ = tx.send(reply(Response::Status(s))).await;
            }
            Request::Snapshot => {
                let r = shared
                    .raft
                    .trigger()
                    .snapshot()
                    .await
                    .map_err(|e| e.to_string());
                let _ = tx.send(reply(Response::Snapshot(r))).await;
            }
        }
    }
    drop(tx);
    if *closing.borrow() {
        writer_task.abort();
    } else {
        let _ = writer_task.await;
    }
}

async fn enqueue(
    shared: &Shared,
    client_id: u64,
    request_seq: u64,
    command: &[u8],
) -> Result<oneshot::Receiver<Result<Outcome, SubmitError>>, SubmitError> {
    if shared.alarm.lock().expect("alarm lock").is_some() {
        return Err(SubmitError::Unavailable(
            "node is out: state hash alarm".into(),
        ));
    }
    let command = decode_command(command).map_err(|e| SubmitError::Invalid(e.to_string()))?;
    let (reply, rx) = oneshot::channel();
    let pending = Pending {
        request: ClientRequest {
            client_id,
            request_seq,
            command,
        },
        reply,
    };
    shared
        .submit
        .send(pending)
        .await
        .map_err(|_| SubmitError::Unavailable("node is stopping".into()))?;
    Ok(rx)
}

/// Smart batching: takes whatever requests are queued (up to the batch limit) as one entry;
/// while `BATCHES_IN_FLIGHT_MAX` batches await commit, new requests queue and form the next.
async fn batcher(raft: Raft, config: ClusterConfig, mut rx: mpsc::Receiver<Pending>) {
    let permits = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT_MAX));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else { return };
        let mut batch = vec![first];
        while batch.len() < REQUESTS_PER_BATCH_MAX as usize {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let (requests, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.request, p.reply)).unzip();
        let receiver = match raft.client_write_ff(LogCommand::Batch(requests)).await {
            Ok(receiver) => receiver,
            Err(fatal) => {
                for reply in replies {
                    let _ = reply.send(Err(SubmitError::Unavailable(fatal.to_string())));
                }
                continue;
            }
        };
        let config = config.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let answer: Result<Vec<Outcome>, SubmitError> = match receiver.await {
                Ok(Ok(response)) => Ok(response.data),
                Ok(Err(ClientWriteError::ForwardToLeader(f))) => Err(SubmitError::NotLeader {
                    leader: f.leader_id.and_then(|id| {
                        config
                            .nodes
                            .iter()
                            .find(|n| n.id == id)
                            .map(|n| (id, n.addr.clone()))
                    }),
                }),
                Ok(Err(e)) => Err(SubmitError::Unavailable(e.to_string())),
                Err(_) => Err(SubmitError::Unavailable(
                    "leadership or node lost while the batch was in flight".into(),
                )),
            };
            match answer {
                Ok(outcomes) => {
                    assert_eq!(outcomes.len(), replies.len(), "one outcome per request");
                    for (reply, outcome) in replies.into_iter().zip(outcomes) {
                        let _ = reply.send(Ok(outcome));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
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
            .client_write_ff(LogCommand::HashCheck { index, state_hash })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_loads_and_validates() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.toml");
        let config = ClusterConfig::load(&path).expect("examples/cluster.toml is valid");
        assert_eq!(config.nodes.len(), 3);
        assert_eq!(config.fsync, FsyncSetting::Always);
    }

    #[test]
    fn a_non_loopback_address_or_a_repeated_node_is_refused() {
        let mut config = ClusterConfig::local(1, PathBuf::from("x"), [7001, 7002, 7003]);
        assert!(config.validate().is_ok());
        config.nodes[1].addr = "10.0.0.2:7002".into();
        assert!(config
            .validate()
            .unwrap_err()
            .contains("not a loopback address"));
        config.nodes[1].addr = "127.0.0.1:7001".into();
        assert!(config.validate().unwrap_err().contains("repeats"));
    }
}
