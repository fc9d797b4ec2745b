//! The wire: length-prefixed bincode frames over a node connection (plain TCP on the
//! loopback, mutual TLS anywhere: `transport`), one [`Request`] → one [`Response`] per frame
//! pair, and openraft's `RaftNetworkV2` on top of it.
//!
//! ```text
//! frame := len u32 (little-endian, ≤ FRAME_SIZE_BYTES_MAX), bincode (varint) of the message
//! ```
//!
//! Node-to-node RPCs and the client protocol share one port per node. Every request carries a
//! `tag` that its response echoes, so a client may keep many requests in flight on one
//! connection and match the answers as they come.
//!
//! Frames are read as if from a hostile peer: the length is checked against
//! [`FRAME_SIZE_BYTES_MAX`] before anything is read, the buffer grows only as bytes arrive (a
//! peer announcing a large frame and sending nothing holds no memory for it), and decoding is
//! bounded by the same limit; a frame that does not decode closes the connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bincode::Options;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkV2};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_rustls::rustls::ClientConfig;

use crate::stages::Stages;
use crate::state::Outcome;
use crate::stream::StreamError;
use crate::transport::NodeStream;
use crate::{NodeId, Snapshot, SnapshotMeta, TypeConfig, Vote};

/// The largest frame either side accepts: a snapshot travels whole in one frame, so this is
/// also the largest state a lagging follower can be brought up to date with.
pub const FRAME_SIZE_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// How long a node-to-node connect may take before the peer counts as unreachable.
pub const CONNECT_TIMEOUT_MS: u64 = 500;
/// How long the leader's replication to a follower waits before it tries again once the
/// follower was unreachable. openraft's default, 200 ms, is waited before every new stream
/// until one succeeds, and a follower that returns takes several (probes of where the logs
/// match): a restarted follower made the quorum only ~600 ms after it returned, and the bed
/// saw acknowledgements stop for seconds when the other follower was lost meanwhile
/// (append_stream.rs, a_follower_that_returns...). A retry costs a connect, which the connect
/// and handshake timeouts bound, so a short wait does not spin on a peer that is down.
pub const REPLICATION_BACKOFF_MS: u64 = 20;
/// The read buffer of a connection: frames that arrived together are taken in one call.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Everything a node can be asked.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    /// A leader's whole snapshot, in one frame (at most [`FRAME_SIZE_BYTES_MAX`]).
    InstallSnapshot {
        vote: Vote,
        meta: SnapshotMeta,
        #[serde(with = "bytes_field")]
        data: Vec<u8>,
    },
    /// A client request: applied once per `(client_id, request_seq)`; answered after commit.
    Submit {
        client_id: u64,
        request_seq: u64,
        /// The encoded `Command` (see `bourse_core::codec::encode_command`). Carried as one byte string
        /// (`bytes_field`): the same bytes on the wire as a sequence of u8, without a serde
        /// call per byte.
        #[serde(with = "bytes_field")]
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
    /// As `Status` without hashing the state now (cheap enough for a dashboard to poll
    /// often): `state_hash` is 0 and `checkpoint` carries the newest hash checkpoint.
    StatusBrief,
    /// The core's instruments with their definitions, from the node's applied state
    /// (`crate::query::InstrumentsAnswer`).
    Instruments,
    /// As `Submit`, with who asked (an admin action): the audit trailer goes into the log
    /// entry beside the command (`crate::batch::Audit`). Last among the variants, so that
    /// peers that predate it read every other request as before.
    SubmitAudited {
        client_id: u64,
        request_seq: u64,
        #[serde(with = "bytes_field")]
        command: Vec<u8>,
        audit: crate::batch::Audit,
    },
    /// A read of the node's applied state for an admin service in another process
    /// (`crate::query::Query`), answered with `Response::Query`. After `SubmitAudited`, so
    /// every earlier request encodes as before.
    Query(crate::query::Query),
    /// A pre-vote (openraft's `pre_vote`): would the node vote for this candidate? Answered
    /// with `Response::Vote`; it changes no state, so a node cut off for a while asks before
    /// it raises its term and deposes a leader the others still follow. Last among the
    /// variants, so peers that predate it read every other request as before.
    PreVote(VoteRequest<TypeConfig>),
    /// An AppendEntries on a pipelined replication stream (`crate::append_stream`): the
    /// follower appends a connection's requests in arrival order without waiting for each
    /// flush and answers them in that order. Last among the variants, so peers that predate
    /// it read every other request as before.
    AppendStream(AppendEntriesRequest<TypeConfig>),
}

/// A `Vec<u8>` field as one serde byte string. Under bincode this is exactly the encoding of
/// a sequence of u8 (a varint length, then the bytes), so old and new peers agree; serde's
/// default walks the vector one element at a time, which was a visible share of a node's CPU.
pub mod bytes_field {
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Vec<u8>, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element()? {
                    v.push(b);
                }
                Ok(v)
            }
        }
        d.deserialize_byte_buf(V)
    }
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
    /// This node leads but no quorum has acknowledged it for longer than the election timeout
    /// (the followers are gone, paused or cut off): the request was not proposed now. An
    /// earlier attempt under the same key may still be pending; retry later with the same key.
    NoQuorum { quorum_ack_ms_ago: u64 },
    /// This node was elected and no quorum has acknowledged it as leader yet (openraft accepts
    /// writes only under a quorum's lease): the request was not proposed. Unlike `NotLeader`
    /// it names no other node to try; the client retries this node after a short pause.
    LeaderUnconfirmed,
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
    /// The newest state-hash checkpoint: (log index, state hash), taken when that index was
    /// applied, at the same indexes on every replica (so replicas compare at one index).
    pub checkpoint: Option<(u64, u64)>,
    /// The commit index this node knows: on the leader the index a majority matched, on a
    /// follower the leader's commit index from its latest AppendEntries (at most its log).
    pub commit_index: Option<u64>,
    /// On a leader that no quorum has acknowledged for longer than the election timeout: how
    /// long ago one last did (it refuses new commands meanwhile). `None` otherwise.
    pub quorum_lost_ms: Option<u64>,
    /// Client commands this node refused for want of a quorum since it started.
    pub no_quorum_refusals: u64,
    /// Client commands this node refused as a leader no quorum had acknowledged yet (just
    /// elected) since it started: the clients retried them here a moment later.
    pub unconfirmed_refusals: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    AppendEntries(Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>),
    /// The answer to a `Vote` or a `PreVote`.
    Vote(Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>>),
    InstallSnapshot(Result<SnapshotResponse<TypeConfig>, RaftError<TypeConfig>>),
    Submitted(Result<Outcome, SubmitError>),
    Status(NodeStatus),
    Snapshot(Result<(), String>),
    /// One entry of a subscription.
    /// One entry of a subscription, in its one binary form (`CommittedEntry::encode`).
    Committed {
        index: u64,
        #[serde(with = "bytes_field")]
        entry: Vec<u8>,
    },
    /// A subscription could not start, or ended (the subscriber lagged, a snapshot gap).
    StreamEnded(StreamError),
    LastSeq(u64),
    /// The encoded `crate::query::InstrumentsAnswer`.
    Instruments {
        #[serde(with = "bytes_field")]
        answer: Vec<u8>,
    },
    /// The answer to `Request::Query`; check it (`QueryAnswer::check`) before use.
    Query(crate::query::QueryAnswer),
}

type AppendStreamItem = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

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

/// Appends a message's frame (length prefix included) to `buf`: many frames, one buffer, no
/// allocation per frame (what a pipelining writer wants).
pub fn encode_frame_into<T: Serialize>(buf: &mut Vec<u8>, message: &T) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; 4]);
    options()
        .serialize_into(&mut *buf, message)
        .expect("in-memory messages encode");
    let len = u32::try_from(buf.len() - start - 4).expect("frame under 4 GiB");
    assert!(
        len <= FRAME_SIZE_BYTES_MAX,
        "frame of {len} bytes over the limit"
    );
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
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
    let mut body = Vec::new();
    Ok(read_frame_into(reader, &mut body).await?.then_some(body))
}

/// A frame buffer larger than this is given up when the next frame needs less than half of
/// it (a snapshot chunk must not pin its memory for the connection's life).
pub const FRAME_BUFFER_KEPT_BYTES_MAX: usize = 1 << 20;

/// Gives up `buf`'s allocation if it is over [`FRAME_BUFFER_KEPT_BYTES_MAX`] and more than
/// twice what the next frame needs.
pub(crate) fn shrink_frame_buffer(buf: &mut Vec<u8>, needed_bytes: usize) {
    if buf.capacity() > FRAME_BUFFER_KEPT_BYTES_MAX && needed_bytes < buf.capacity() / 2 {
        *buf = Vec::new();
    }
}

/// Reads one frame's body into `body` (replacing its contents, reusing its allocation, so a
/// connection reading many small frames allocates nothing per frame); false at a clean end
/// of stream.
pub async fn read_frame_into<R: AsyncReadExt + Unpin>(
    reader: &mut R,
    body: &mut Vec<u8>,
) -> std::io::Result<bool> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len);
    if len > FRAME_SIZE_BYTES_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {FRAME_SIZE_BYTES_MAX}"),
        ));
    }
    shrink_frame_buffer(body, len as usize);
    body.clear();
    // Grown as the bytes arrive, not to the announced length at once.
    let read = reader.take(u64::from(len)).read_to_end(body).await?;
    if read != len as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("frame of {len} bytes cut after {read}"),
        ));
    }
    Ok(true)
}

/// One request/response connection to a peer, reconnected on the next call after a failure.
pub struct PeerConnection {
    addr: SocketAddr,
    /// Buffered for reading (one system call per burst of frames, not two per frame);
    /// writes go straight through.
    stream: Option<BufReader<NodeStream>>,
    /// TLS to the node, or plain TCP (loopback only).
    tls: Option<Arc<ClientConfig>>,
    next_tag: u64,
    /// Set while a call is under way: if the caller drops the call's future half way (openraft
    /// wraps RPCs in its own timeout), the stream may hold a late answer, so the next call
    /// starts on a fresh connection.
    busy: bool,
    /// The request and response frames, reused from call to call (no allocation per RPC).
    out: Vec<u8>,
    frame: Vec<u8>,
}

impl PeerConnection {
    /// A connection as this process reaches `addr` (`transport::use_tls_for`).
    pub fn new(addr: SocketAddr) -> PeerConnection {
        PeerConnection::with_tls(addr, crate::transport::tls_for(addr))
    }

    /// A connection over TLS with `tls`, or plain TCP (`None`, loopback only).
    pub fn with_tls(addr: SocketAddr, tls: Option<Arc<ClientConfig>>) -> PeerConnection {
        PeerConnection {
            addr,
            tls,
            stream: None,
            next_tag: 1,
            busy: false,
            out: Vec::new(),
            frame: Vec::new(),
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
            let stream = crate::transport::dial_with(self.addr, self.tls.clone()).await?;
            self.stream = Some(BufReader::with_capacity(READ_BUFFER_BYTES, stream));
        }
        let stream = self.stream.as_mut().expect("connected above");
        let tag = self.next_tag;
        self.next_tag += 1;
        self.out.clear();
        encode_frame_into(&mut self.out, &Tagged { tag, body });
        stream.get_mut().write_all(&self.out).await?;
        stream.get_mut().flush().await?;
        shrink_frame_buffer(&mut self.out, 0);
        if !read_frame_into(stream, &mut self.frame).await? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "peer closed the connection",
            ));
        }
        let response: Tagged<Response> = decode_message(&self.frame)?;
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
#[derive(Clone)]
pub struct Network {
    /// Where the AppendEntries round trips and acknowledgements are recorded.
    stages: Option<Arc<Stages>>,
    /// The node's own TLS identity towards its peers (none: plain TCP, loopback only).
    tls: Option<Arc<ClientConfig>>,
    /// AppendEntries in flight per follower: 1 is openraft's one at a time; more pipelines
    /// them on a stream of their own (`crate::append_stream`).
    append_in_flight_max: usize,
}

impl Default for Network {
    fn default() -> Network {
        Network {
            stages: None,
            tls: None,
            append_in_flight_max: 1,
        }
    }
}

impl Network {
    /// A network that records AppendEntries timings in `stages`.
    pub fn with_stages(stages: Arc<Stages>) -> Network {
        Network {
            stages: Some(stages),
            ..Network::default()
        }
    }

    /// The same network, keeping up to `in_flight_max` AppendEntries unanswered per follower
    /// (1: one at a time). Panics on 0 or above
    /// [`crate::append_stream::APPEND_STREAM_IN_FLIGHT_MAX`]; configs are checked before.
    pub fn with_append_in_flight_max(mut self, in_flight_max: usize) -> Network {
        assert!(
            (1..=crate::append_stream::APPEND_STREAM_IN_FLIGHT_MAX).contains(&in_flight_max),
            "append_in_flight_max {in_flight_max} out of range"
        );
        self.append_in_flight_max = in_flight_max;
        self
    }

    /// The same network, reaching peers over TLS with `tls`.
    pub fn with_tls(mut self, tls: Option<Arc<ClientConfig>>) -> Network {
        self.tls = tls;
        self
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let addr: Option<SocketAddr> = node.addr.parse().ok();
        PeerClient {
            target,
            addr,
            conn: addr.map(|a| PeerConnection::with_tls(a, self.tls.clone())),
            tls: self.tls.clone(),
            stages: self.stages.clone(),
            append_in_flight_max: self.append_in_flight_max,
        }
    }
}

/// openraft's client for one peer.
pub struct PeerClient {
    target: NodeId,
    /// None when the peer's address in the membership does not parse.
    addr: Option<SocketAddr>,
    conn: Option<PeerConnection>,
    tls: Option<Arc<ClientConfig>>,
    stages: Option<Arc<Stages>>,
    append_in_flight_max: usize,
}

/// Whether to print failed RPCs (`BOURSE_NET_DEBUG` set), read once.
pub(crate) fn net_debug() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("BOURSE_NET_DEBUG").is_some())
}

/// Prints one debugging line to standard error when `BOURSE_NET_DEBUG` is set, stamped with
/// the wall clock (UTC, to the microsecond): the lines of several nodes, gateways and a test's
/// own account of its faults can then be read against each other.
pub fn debug_line(line: std::fmt::Arguments<'_>) {
    if net_debug() {
        eprintln!("{} {line}", utc_stamp(std::time::SystemTime::now()));
    }
}

/// `HH:MM:SS.ffffff` of `t` in UTC: short enough for a log line, exact enough to order the
/// lines of processes on one machine.
fn utc_stamp(t: std::time::SystemTime) -> String {
    let us = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let day_us = us % 86_400_000_000;
    let s = day_us / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        s / 3_600,
        s / 60 % 60,
        s % 60,
        day_us % 1_000_000
    )
}

impl PeerClient {
    async fn call(
        &mut self,
        body: Request,
        option: &RPCOption,
    ) -> Result<Response, RPCError<TypeConfig>> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::other(format!("node {} has no valid address", self.target)),
            )));
        };
        // Only when debugging: formatting a request with its entries costs more than sending it.
        let what = net_debug().then(|| format!("{body:?}").chars().take(60).collect::<String>());
        let r = conn.call(body, option.hard_ttl()).await;
        if let (Err(e), Some(what)) = (&r, what) {
            debug_line(format_args!("rpc to {}: {e} ({what})", self.target));
        }
        r.map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }

    /// A remote node's fatal error (it is shutting down) as this side sees it: that peer
    /// cannot be reached for now.
    fn remote_fatal(&self, e: RaftError<TypeConfig>) -> RPCError<TypeConfig> {
        RPCError::Unreachable(Unreachable::new(&std::io::Error::other(format!(
            "node {}: {e}",
            self.target
        ))))
    }

    async fn vote_or_pre_vote(
        &mut self,
        body: Request,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        match self.call(body, &option).await? {
            Response::Vote(r) => r.map_err(|e| self.remote_fatal(e)),
            _ => Err(unexpected("vote")),
        }
    }
}

fn unexpected(what: &str) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(&std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("unexpected response to {what}"),
    )))
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    fn backoff(&self) -> Option<openraft::network::Backoff> {
        Some(openraft::network::Backoff::new(std::iter::repeat(
            Duration::from_millis(REPLICATION_BACKOFF_MS),
        )))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let timed = match (&self.stages, rpc.entries.first(), rpc.entries.last()) {
            (Some(stages), Some(first), Some(last)) => Some((
                stages.clone(),
                first.log_id.index,
                last.log_id.index,
                stages.now_ns(),
            )),
            _ => None,
        };
        match self.call(Request::AppendEntries(rpc), &option).await? {
            Response::AppendEntries(r) => {
                if let (Ok(AppendEntriesResponse::Success), Some((stages, first, last, sent))) =
                    (&r, timed)
                {
                    stages.on_append_acknowledged(first, last, sent);
                }
                r.map_err(|e| self.remote_fatal(e))
            }
            _ => Err(unexpected("append_entries")),
        }
    }

    /// One AppendEntries at a time (openraft's default) with `append_in_flight_max` 1;
    /// otherwise a pipelined stream on a connection of its own (`crate::append_stream`).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, AppendStreamItem>, RPCError<TypeConfig>>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        // openraft's heartbeat worker sends each heartbeat as a stream of exactly one request
        // (its size hint says so): a connection of its own per heartbeat would cost a dial (a
        // TLS handshake between hosts) every heartbeat interval per follower, so heartbeats
        // take the shared connection, one at a time, as with `append_in_flight_max` 1.
        let one_request = input.size_hint().1.is_some_and(|n| n <= 1);
        if self.append_in_flight_max <= 1 || one_request {
            return openraft::network::stream_append_sequential(self, input, option);
        }
        let to = crate::append_stream::StreamTarget {
            target: self.target,
            addr: self.addr,
            tls: self.tls.clone(),
            in_flight_max: self.append_in_flight_max,
            stages: self.stages.clone(),
        };
        Box::pin(async move { crate::append_stream::open(to, input, option).await })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.vote_or_pre_vote(Request::Vote(rpc), option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.vote_or_pre_vote(Request::PreVote(rpc), option).await
    }

    /// Sends the snapshot whole, in one frame; `cancel` (the replication stopped) ends the
    /// wait early.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let request = Request::InstallSnapshot {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        let answer = tokio::select! {
            biased;
            closed = cancel => return Err(StreamingError::Closed(closed)),
            answer = self.call(request, &option) => answer,
        };
        match answer.map_err(StreamingError::from)? {
            Response::InstallSnapshot(r) => r.map_err(|e| match self.remote_fatal(e) {
                RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                other => StreamingError::from(other),
            }),
            _ => Err(StreamingError::from(unexpected("install_snapshot"))),
        }
    }
}
