//! The wire: length-prefixed bincode frames over TCP on 127.0.0.1, one [`Request`] →
//! one [`Response`] per frame pair, and openraft's `RaftNetwork` on top of it.
//!
//! ```text
//! frame := len u32 (little-endian, ≤ FRAME_SIZE_BYTES_MAX), bincode (varint) of the message
//! ```
//!
//! Node-to-node RPCs and the client protocol share one port per node. Every request carries a
//! `tag` that its response echoes, so a client may keep many requests in flight on one
//! connection and match the answers as they come.

use std::net::SocketAddr;
use std::time::Duration;

use bincode::Options;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::state::Outcome;
use crate::stream::{CommittedEntry, StreamError};
use crate::{NodeId, TypeConfig};

/// The largest frame either side accepts (snapshot chunks are a few MiB).
pub const FRAME_SIZE_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// How long a node-to-node connect may take before the peer counts as unreachable.
pub const CONNECT_TIMEOUT_MS: u64 = 500;

/// Everything a node can be asked.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A client request: applied once per `(client_id, request_seq)`; answered after commit.
    Submit {
        client_id: u64,
        request_seq: u64,
        /// MessagePack of a `Command` (see `batch::encode_command`).
        command: Vec<u8>,
    },
    /// Leader, term, log and apply positions, replication lag.
    Status,
    /// Take a snapshot now.
    Snapshot,
    /// Stream the committed entries from `from_index` on: the node answers with one
    /// `Response::Committed` per applied entry (all under this request's tag) until the
    /// connection closes, or one `Response::StreamEnded` with the reason it stopped. Use a
    /// connection of its own: the stream shares the connection's bounded output queue.
    Subscribe {
        from_index: u64,
    },
    /// The last request sequence number this node applied for `client_id` (0 if none).
    LastSeq {
        client_id: u64,
    },
}

/// Why a client request was not answered with an outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubmitError {
    /// This node is not the leader; try `leader` (its id and address) if known.
    NotLeader { leader: Option<(NodeId, String)> },
    /// The command did not decode, or another problem with the request itself.
    Invalid(String),
    /// The node could not get the request committed (shutting down, lost leadership while it
    /// was in flight): the request may or may not have been applied; retry it with the same key.
    Unavailable(String),
}

/// A node's view of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: NodeId,
    pub state: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    pub state_hash: u64,
    pub commands_applied: u64,
    /// Commands in the replicated state's history (the engine's counter; survives restarts).
    pub engine_commands: u64,
    /// Leader hash entries this node compared with its own state hash and found equal.
    pub hash_checks_passed: u64,
    /// For a leader: the matched log index of each node.
    pub matched: Vec<(NodeId, Option<u64>)>,
    pub alarm: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    Submitted(Result<Outcome, SubmitError>),
    Status(NodeStatus),
    Snapshot(Result<(), String>),
    /// One entry of a subscription.
    Committed(CommittedEntry),
    /// A subscription could not start, or ended (the subscriber lagged, a snapshot gap).
    StreamEnded(StreamError),
    LastSeq(u64),
}

/// A request and the tag its response echoes.
#[derive(Debug, Serialize, Deserialize)]
pub struct Tagged<T> {
    pub tag: u64,
    pub body: T,
}

fn options() -> impl Options {
    bincode::DefaultOptions::new().with_limit(u64::from(FRAME_SIZE_BYTES_MAX))
}

/// Encodes a message into a frame (length prefix included).
pub fn encode_frame<T: Serialize>(message: &T) -> Vec<u8> {
    let mut buf = vec![0u8; 4];
    options()
        .serialize_into(&mut buf, message)
        .expect("in-memory messages encode");
    let len = u32::try_from(buf.len() - 4).expect("frame under 4 GiB");
    assert!(
        len <= FRAME_SIZE_BYTES_MAX,
        "frame of {len} bytes over the limit"
    );
    buf[..4].copy_from_slice(&len.to_le_bytes());
    buf
}

pub fn decode_message<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> std::io::Result<T> {
    options()
        .deserialize(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Reads one frame's body; `Ok(None)` at a clean end of stream.
pub async fn read_frame<R: AsyncReadExt + Unpin>(
    reader: &mut R,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len);
    if len > FRAME_SIZE_BYTES_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {FRAME_SIZE_BYTES_MAX}"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    reader.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// One request/response connection to a peer, reconnected on the next call after a failure.
pub struct PeerConnection {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    next_tag: u64,
    /// Set while a call is under way: if the caller drops the call's future half way (openraft
    /// wraps RPCs in its own timeout), the stream may hold a late answer, so the next call
    /// starts on a fresh connection.
    busy: bool,
}

impl PeerConnection {
    pub fn new(addr: SocketAddr) -> PeerConnection {
        PeerConnection {
            addr,
            stream: None,
            next_tag: 1,
            busy: false,
        }
    }

    /// Sends one request and waits for its response, within `timeout`.
    pub async fn call(&mut self, body: Request, timeout: Duration) -> std::io::Result<Response> {
        let result = tokio::time::timeout(timeout, self.call_inner(body)).await;
        match result {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => {
                self.stream = None;
                Err(e)
            }
            Err(_) => {
                // A late answer would be read as the next call's: drop the connection.
                self.stream = None;
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "rpc timed out",
                ))
            }
        }
    }

    async fn call_inner(&mut self, body: Request) -> std::io::Result<Response> {
        if self.busy {
            self.stream = None;
        }
        self.busy = true;
        let response = self.exchange(body).await;
        self.busy = false;
        response
    }

    async fn exchange(&mut self, body: Request) -> std::io::Result<Response> {
        if self.stream.is_none() {
            let stream = tokio::time::timeout(
                Duration::from_millis(CONNECT_TIMEOUT_MS),
                TcpStream::connect(self.addr),
            )
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
            stream.set_nodelay(true)?;
            self.stream = Some(stream);
        }
        let stream = self.stream.as_mut().expect("connected above");
        let tag = self.next_tag;
        self.next_tag += 1;
        stream
            .write_all(&encode_frame(&Tagged { tag, body }))
            .await?;
        let frame = read_frame(stream).await?.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "peer closed the connection",
            )
        })?;
        let response: Tagged<Response> = decode_message(&frame)?;
        if response.tag != tag {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("response tag {} for request {tag}", response.tag),
            ));
        }
        Ok(response.body)
    }
}

/// Makes openraft's per-peer clients.
#[derive(Clone, Default)]
pub struct Network;

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            target,
            conn: node.addr.parse().ok().map(PeerConnection::new),
        }
    }
}

/// openraft's client for one peer.
pub struct PeerClient {
    target: NodeId,
    /// None when the peer's address in the membership does not parse.
    conn: Option<PeerConnection>,
}

impl PeerClient {
    async fn call<E: std::error::Error>(
        &mut self,
        body: Request,
        option: &RPCOption,
    ) -> Result<Response, RPCError<NodeId, BasicNode, E>> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::other(format!("node {} has no valid address", self.target)),
            )));
        };
        let what = format!("{body:?}").chars().take(60).collect::<String>();
        let r = conn.call(body, option.hard_ttl()).await;
        if let Err(e) = &r {
            if std::env::var("BOURSE_NET_DEBUG").is_ok() {
                eprintln!("rpc to {}: {e} ({what})", self.target);
            }
        }
        r.map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

fn unexpected<E: std::error::Error>(what: &str) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("unexpected response to {what}"),
    )))
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(Request::AppendEntries(rpc), &option).await? {
            Response::AppendEntries(r) => r.map_err(|e| {
                RPCError::RemoteError(openraft::error::RemoteError::new(self.target, e))
            }),
            _ => Err(unexpected("append_entries")),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self.call(Request::InstallSnapshot(rpc), &option).await? {
            Response::InstallSnapshot(r) => r.map_err(|e| {
                RPCError::RemoteError(openraft::error::RemoteError::new(self.target, e))
            }),
            _ => Err(unexpected("install_snapshot")),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(Request::Vote(rpc), &option).await? {
            Response::Vote(r) => r.map_err(|e| {
                RPCError::RemoteError(openraft::error::RemoteError::new(self.target, e))
            }),
            _ => Err(unexpected("vote")),
        }
    }
}
