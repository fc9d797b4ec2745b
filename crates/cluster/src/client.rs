//! A client of a replica group: finds the leader, submits requests, and retries each request
//! with the same idempotency key until the group answers it (or a deadline passes).
//!
//! An answer says how a request was answered and which log entry applied it, not what it did:
//! a command's events travel once, on the committed stream. A client that wants them
//! ([`Client::submit_for_events`]) reads them there, at the entry the answer names.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bourse_core::{Command, Event};
use tokio::sync::mpsc;

use crate::batch::Audit;
use crate::consumer::StreamConsumer;
use crate::net::{
    decode_message, encode_frame, read_frame, NodeStatus, PeerConnection, Request, Response,
    SubmitError, Tagged,
};
use crate::state::OutcomeKind;
use crate::stream::{CommittedEntry, StreamError};
use crate::transport::{NodeReadHalf, NodeWriteHalf};
use crate::NodeId;
use bourse_core::codec::{decode_events, encode_command};

/// How long one attempt at one node may take.
pub const ATTEMPT_TIMEOUT_MS: u64 = 2_000;
/// The pause before trying again when no node knows a leader (an election is under way).
pub const RETRY_PAUSE_MS: u64 = 20;
/// How long a [`PipelinedClient`] waits for the answer to its oldest request before it gives
/// the node up and re-sends elsewhere. Shorter than [`ATTEMPT_TIMEOUT_MS`]: a leader that
/// lost its quorum says so at once (`SubmitError::NoQuorum`), so silence this long means a
/// paused or cut-off node, and a re-send is always safe (answered from the idempotency table
/// if it was applied).
pub const PIPELINE_ATTEMPT_TIMEOUT_MS: u64 = 1_000;
/// While the leader answers that it has no quorum, one request (the oldest unanswered) is
/// sent again this often to learn when the quorum is back; the others wait unsent.
pub const NO_QUORUM_PROBE_MS: u64 = 100;
/// How long a request may go unanswered (or the leader keep answering that it has no quorum)
/// before the client asks every node who leads now, and again this often while it waits. A
/// leader that is paused or cut off keeps its connections open and answers nothing, so
/// without asking, a client would learn of its successor only when its attempt timed out;
/// asking, it moves on as soon as the group has elected one (issue 21's failover goal:
/// acknowledgements resume within 1 s). A slow but healthy leader costs each node one brief
/// status call per period, and the client stays (no node names a newer leader).
pub const LEADER_PROBE_AFTER_MS: u64 = 200;
/// How long one node may take to answer a leader probe.
pub const LEADER_PROBE_TIMEOUT_MS: u64 = 150;
/// After the first leader probe, how often the client asks again while it still waits. An
/// election takes at least a follower's leader lease plus a drawn timeout (330 ms or more
/// with the defaults, `ClusterConfig::election_window_ms`) after the last heartbeat, so the
/// first probe usually finds no newer leader; asking again at this shorter period finds the
/// new one within about half of it after it is elected (each round costs every node one
/// brief status call).
pub const LEADER_PROBE_EVERY_MS: u64 = 100;

/// A request the group committed and applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acknowledged {
    pub request_seq: u64,
    /// True if an earlier attempt had applied it and this answer came from the table.
    pub duplicate: bool,
    /// The log index of the entry that applied it: its events are on the committed stream
    /// there.
    pub applied_index: u64,
    /// The node that answered.
    pub leader: NodeId,
}

#[derive(Debug)]
pub enum ClientError {
    /// No node answered the request before the deadline; it may or may not be applied.
    Timeout {
        request_seq: u64,
        last_error: String,
    },
    /// The group refused the request itself (bad command, full session table, stale key).
    Rejected(String),
    /// The request applied, but its events could not be read from the committed stream.
    Events(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Timeout {
                request_seq,
                last_error,
            } => write!(
                f,
                "request {request_seq} not answered in time: {last_error}"
            ),
            ClientError::Rejected(why) => write!(f, "request rejected: {why}"),
            ClientError::Events(why) => write!(f, "applied, but its events are missing: {why}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// A sequential client (one request in flight).
pub struct Client {
    nodes: Vec<(NodeId, SocketAddr)>,
    client_id: u64,
    next_seq: u64,
    /// Index into `nodes` of the node believed to lead.
    current: usize,
    conn: Option<PeerConnection>,
    /// This client's events from the committed stream, once it asked for events.
    own_events: Option<OwnEvents>,
    /// How long one attempt at one node may take ([`ATTEMPT_TIMEOUT_MS`] unless set).
    attempt_timeout_ms: u64,
    /// Times a leader probe found a newer leader and the client moved to it.
    leader_probe_switches: u64,
}

impl Client {
    /// A client with its own id; `first_seq` lets a restarted client continue its numbering.
    pub fn new(nodes: Vec<(NodeId, SocketAddr)>, client_id: u64, first_seq: u64) -> Client {
        assert!(!nodes.is_empty());
        assert!(first_seq > 0);
        Client {
            nodes,
            client_id,
            next_seq: first_seq,
            current: 0,
            conn: None,
            own_events: None,
            attempt_timeout_ms: ATTEMPT_TIMEOUT_MS,
            leader_probe_switches: 0,
        }
    }

    /// How long one attempt at one node may take before the client tries the next node
    /// ([`ATTEMPT_TIMEOUT_MS`] by default). Leader probes run whatever it is.
    pub fn set_attempt_timeout_ms(&mut self, timeout_ms: u64) {
        assert!(timeout_ms > 0, "an attempt needs some time");
        self.attempt_timeout_ms = timeout_ms;
    }

    /// Times a leader probe ([`LEADER_PROBE_AFTER_MS`]) found a newer leader while a request
    /// waited, and the client re-sent the request there.
    pub fn leader_probe_switches(&self) -> u64 {
        self.leader_probe_switches
    }

    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// As [`Client::submit`], and then reads the request's events from the committed stream
    /// (from any node), at the entry that applied it. The first call starts a stream consumer
    /// there; later calls continue it, so each entry crosses the wire once per client.
    pub async fn submit_for_events(
        &mut self,
        command: &Command,
        deadline: Duration,
    ) -> Result<(Acknowledged, Vec<Event>), ClientError> {
        self.submit_audited_for_events(command, None, deadline)
            .await
    }

    /// As [`Client::submit_for_events`], the request carrying `audit` (who asked) into the
    /// log entry when there is one.
    pub async fn submit_audited_for_events(
        &mut self,
        command: &Command,
        audit: Option<&Audit>,
        deadline: Duration,
    ) -> Result<(Acknowledged, Vec<Event>), ClientError> {
        let started = Instant::now();
        let ack = self.submit_audited(command, audit, deadline).await?;
        // The node that answered first: it applied the entry before it answered.
        let answered = self.current;
        let nodes = || {
            let n = self.nodes.len();
            (0..n).map(|k| self.nodes[(answered + k) % n].1).collect()
        };
        let answering = self.nodes[answered].1;
        let own = self
            .own_events
            .get_or_insert_with(|| OwnEvents::new(nodes(), self.client_id, ack.applied_index));
        if own.consumer.position() <= ack.applied_index {
            // After a failover the stream may still be read from the old leader, paused or
            // cut off (silent, not closed): the node that answered holds the entry.
            own.consumer.read_from(answering);
        }
        let left = deadline.saturating_sub(started.elapsed());
        let events = own.take(ack.request_seq, ack.applied_index, left).await?;
        Ok((ack, events))
    }

    /// The sequence number the next request will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The node this client currently sends to.
    pub fn current_node(&self) -> NodeId {
        self.nodes[self.current].0
    }

    fn switch_to(&mut self, index: usize) {
        if index != self.current || self.conn.is_none() {
            self.current = index;
            self.conn = Some(PeerConnection::new(self.nodes[index].1));
        }
    }

    /// Submits `command` under the next sequence number and waits until the group commits and
    /// applies it, following redirects and retrying across failover, for at most `deadline`.
    pub async fn submit(
        &mut self,
        command: &Command,
        deadline: Duration,
    ) -> Result<Acknowledged, ClientError> {
        self.submit_audited(command, None, deadline).await
    }

    /// As [`Client::submit`], the request carrying `audit` (who asked: an operator and a
    /// request id) into the log entry when there is one. A trailer out of its limits is
    /// refused by the node (`ClientError::Rejected`, naming the field).
    pub async fn submit_audited(
        &mut self,
        command: &Command,
        audit: Option<&Audit>,
        deadline: Duration,
    ) -> Result<Acknowledged, ClientError> {
        let request_seq = self.next_seq;
        let encoded = encode_command(command);
        let started = Instant::now();
        let mut last_error = String::from("no attempt made");
        if self.conn.is_none() {
            self.switch_to(self.current);
        }
        let mut attempts = 0u64;
        while started.elapsed() < deadline {
            if attempts > 0 {
                crate::net::debug_line(format_args!(
                    "client {}: request {request_seq}: attempt {} to node {} after {} ms: {last_error}",
                    self.client_id,
                    attempts + 1,
                    self.nodes[self.current].0,
                    started.elapsed().as_millis()
                ));
            }
            attempts += 1;
            let conn = self.conn.as_mut().expect("connection chosen");
            let request = match audit {
                None => Request::Submit {
                    client_id: self.client_id,
                    request_seq,
                    command: encoded.clone(),
                },
                Some(audit) => Request::SubmitAudited {
                    client_id: self.client_id,
                    request_seq,
                    command: encoded.clone(),
                    audit: audit.clone(),
                },
            };
            let attempt = {
                let call = conn.call(request, Duration::from_millis(self.attempt_timeout_ms));
                tokio::select! {
                    answer = call => answer,
                    newer = probe_until_newer_leader(&self.nodes, self.current) => {
                        last_error = format!(
                            "node {} fell silent; node {} leads a newer term",
                            self.nodes[self.current].0, self.nodes[newer].0
                        );
                        self.leader_probe_switches += 1;
                        self.switch_to(newer);
                        continue;
                    }
                }
            };
            match attempt {
                Ok(Response::Submitted(Ok(outcome))) => match outcome.kind {
                    OutcomeKind::Applied | OutcomeKind::Duplicate => {
                        self.next_seq += 1;
                        return Ok(Acknowledged {
                            request_seq,
                            duplicate: outcome.kind == OutcomeKind::Duplicate,
                            applied_index: outcome.applied_index,
                            leader: self.nodes[self.current].0,
                        });
                    }
                    OutcomeKind::Stale => {
                        return Err(ClientError::Rejected(format!(
                            "request {request_seq} is older than the last applied one"
                        )))
                    }
                    OutcomeKind::Refused => {
                        return Err(ClientError::Rejected("session table full".into()))
                    }
                    OutcomeKind::Invalid => {
                        return Err(ClientError::Rejected(format!(
                            "request {request_seq}: the group could not decode the command"
                        )))
                    }
                    OutcomeKind::Gap { expected } => {
                        return Err(ClientError::Rejected(format!(
                            "request {request_seq} skips ahead: the group expects {expected}"
                        )))
                    }
                },
                Ok(Response::Submitted(Err(SubmitError::NotLeader { leader }))) => {
                    last_error = format!("node {} is not the leader", self.nodes[self.current].0);
                    let hinted =
                        leader.and_then(|(id, _)| self.nodes.iter().position(|n| n.0 == id));
                    match hinted {
                        Some(i) if i != self.current => self.switch_to(i),
                        _ => {
                            tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                            self.switch_to((self.current + 1) % self.nodes.len());
                        }
                    }
                }
                Ok(Response::Submitted(Err(SubmitError::Invalid(why)))) => {
                    return Err(ClientError::Rejected(why))
                }
                Ok(Response::Submitted(Err(SubmitError::NoQuorum { quorum_ack_ms_ago }))) => {
                    last_error = format!(
                        "node {} leads without a quorum (last acknowledged {quorum_ack_ms_ago} ms ago)",
                        self.nodes[self.current].0
                    );
                    tokio::time::sleep(Duration::from_millis(NO_QUORUM_PROBE_MS)).await;
                    // A leader cut off from its peers says so; the others may have elected
                    // another meanwhile, which this client can reach.
                    if let Some(newer) = newer_leader(self.nodes.clone(), self.current).await {
                        self.leader_probe_switches += 1;
                        self.switch_to(newer);
                    }
                }
                Ok(Response::Submitted(Err(SubmitError::LeaderUnconfirmed))) => {
                    // Elected, awaiting its first quorum: the leader to wait for is here.
                    last_error = format!(
                        "node {} leads but no quorum has acknowledged it yet",
                        self.nodes[self.current].0
                    );
                    tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                }
                Ok(Response::Submitted(Err(SubmitError::Unavailable(why)))) => {
                    last_error = why;
                    tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                    self.switch_to((self.current + 1) % self.nodes.len());
                }
                Ok(_) => {
                    last_error = "unexpected response".into();
                    self.switch_to((self.current + 1) % self.nodes.len());
                }
                Err(e) => {
                    last_error = format!("node {}: {e}", self.nodes[self.current].0);
                    tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                    self.switch_to((self.current + 1) % self.nodes.len());
                }
            }
        }
        Err(ClientError::Timeout {
            request_seq,
            last_error,
        })
    }
}

/// How long [`Client::submit_for_events`] waits for a silent stream node before it reads
/// from the next one.
const OWN_EVENTS_STALL_MS: u64 = 500;

/// One client's events, read from the committed stream: each entry from the first the client
/// asked about on, once, keeping the events of the client's own applied requests until they
/// are taken.
struct OwnEvents {
    consumer: StreamConsumer,
    client_id: u64,
    /// Events read and not yet taken, by request seq (a request submitted without asking
    /// for its events leaves them here until a later request's are taken).
    found: BTreeMap<u64, Vec<u8>>,
}

impl OwnEvents {
    fn new(nodes: Vec<SocketAddr>, client_id: u64, from_index: u64) -> OwnEvents {
        let mut consumer = StreamConsumer::remote(nodes, from_index);
        // The entries it waits for are committed: a node silent this long is stopped or cut
        // off, and another one has them.
        consumer.set_stall_timeout_ms(OWN_EVENTS_STALL_MS);
        OwnEvents {
            consumer,
            client_id,
            found: BTreeMap::new(),
        }
    }

    /// The events of request `request_seq`, applied at `applied_index`: reads the stream up
    /// to that entry, if it is not there yet.
    async fn take(
        &mut self,
        request_seq: u64,
        applied_index: u64,
        deadline: Duration,
    ) -> Result<Vec<Event>, ClientError> {
        let deadline_ms = deadline.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        self.consumer.set_reconnect_timeout_ms(deadline_ms);
        while self.consumer.position() <= applied_index {
            let entry = self
                .consumer
                .next()
                .await
                .map_err(|e| ClientError::Events(format!("request {request_seq}: {e}")))?;
            for r in entry.requests() {
                let (client_id, seq) = r.key();
                if client_id == self.client_id && r.applied_here() {
                    self.found.insert(seq, r.event_bytes().to_vec());
                }
            }
        }
        // Older requests' events will never be asked for (seqs only grow).
        let mut rest = self.found.split_off(&request_seq);
        self.found = rest.split_off(&(request_seq + 1));
        let bytes = rest.remove(&request_seq).ok_or_else(|| {
            ClientError::Events(format!(
                "request {request_seq} is not at entry {applied_index} of the stream"
            ))
        })?;
        decode_events(&bytes).map_err(|e| ClientError::Events(format!("bad events: {e}")))
    }
}

/// Asks every node at once who leads, and returns the index in `nodes` of the leader of the
/// highest term any node reports, when that is another node than `current`. `None` when no
/// node answers, when the highest term has no leader yet (an election is under way), or when
/// `current` leads it. Raft elects at most one leader per term, so a follower's word for its
/// term's leader is as good as the leader's own.
pub async fn newer_leader(nodes: Vec<(NodeId, SocketAddr)>, current: usize) -> Option<usize> {
    let timeout = Duration::from_millis(LEADER_PROBE_TIMEOUT_MS);
    let mut asked = tokio::task::JoinSet::new();
    for &(_, addr) in &nodes {
        asked.spawn(node_status_brief(addr, timeout));
    }
    // (term, its leader if known)
    let mut newest: Option<(u64, Option<NodeId>)> = None;
    let mut answered = 0;
    while let Some(answer) = asked.join_next().await {
        let Ok(Ok(status)) = answer else { continue };
        answered += 1;
        newest = match newest {
            Some((term, leader)) if term > status.term => Some((term, leader)),
            Some((term, leader)) if term == status.term => Some((term, leader.or(status.leader))),
            _ => Some((status.term, status.leader)),
        };
        // Once a majority answered, no node leads a term above the highest they report (a
        // leader needs a majority at its term, and two majorities share a member): the
        // nodes still silent (paused, cut off) are not waited for to their timeout.
        if 2 * answered > nodes.len() {
            break;
        }
    }
    let leader = newest?.1?;
    let index = nodes.iter().position(|n| n.0 == leader)?;
    (index != current).then_some(index)
}

/// Waits [`LEADER_PROBE_AFTER_MS`], then probes ([`newer_leader`]) every
/// [`LEADER_PROBE_EVERY_MS`] until a newer leader than `current` is found; returns its index.
async fn probe_until_newer_leader(nodes: &[(NodeId, SocketAddr)], current: usize) -> usize {
    tokio::time::sleep(Duration::from_millis(LEADER_PROBE_AFTER_MS)).await;
    loop {
        if let Some(index) = newer_leader(nodes.to_vec(), current).await {
            return index;
        }
        tokio::time::sleep(Duration::from_millis(LEADER_PROBE_EVERY_MS)).await;
    }
}

/// Asks one node for its status.
pub async fn node_status(addr: SocketAddr, timeout: Duration) -> std::io::Result<NodeStatus> {
    let mut conn = PeerConnection::new(addr);
    match conn.call(Request::Status, timeout).await? {
        Response::Status(s) => Ok(s),
        _ => Err(std::io::Error::other("unexpected response to status")),
    }
}

/// As [`node_status`] without making the node hash its state (`state_hash` is 0; the
/// newest hash checkpoint is in `checkpoint`): what a dashboard polls.
pub async fn node_status_brief(addr: SocketAddr, timeout: Duration) -> std::io::Result<NodeStatus> {
    let mut conn = PeerConnection::new(addr);
    match conn.call(Request::StatusBrief, timeout).await? {
        Response::Status(s) => Ok(s),
        _ => Err(std::io::Error::other("unexpected response to status")),
    }
}

/// Asks one node to take a snapshot now.
pub async fn node_snapshot(addr: SocketAddr, timeout: Duration) -> std::io::Result<()> {
    let mut conn = PeerConnection::new(addr);
    match conn.call(Request::Snapshot, timeout).await? {
        Response::Snapshot(r) => r.map_err(std::io::Error::other),
        _ => Err(std::io::Error::other("unexpected response to snapshot")),
    }
}

/// Requests a [`PipelinedClient`] keeps in flight unless told otherwise.
pub const PIPELINE_WINDOW_DEFAULT: usize = 4096;
/// The largest window a pipelined client accepts (below the node's queue per connection).
pub const PIPELINE_WINDOW_MAX: usize = 16_384;
/// Tags carry the send generation above this many bits of request seq, so that an error
/// answer to a send made before the last rewind is recognised as old news.
const TAG_SEQ_BITS: u32 = 40;

/// The answer to one request of a [`PipelinedClient`], in the order answers arrive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub request_seq: u64,
    /// How the group answered: `Applied`, `Duplicate` (applied by an earlier attempt) or
    /// `Stale` (applied earlier, its answer no longer kept); a `Refused` request is final
    /// too. Gaps and errors are not answers: the client resubmits.
    pub kind: OutcomeKind,
    /// The log index of the entry that applied it (its events are on the committed stream
    /// there); 0 for `Stale` and `Refused`.
    pub applied_index: u64,
    /// The node that answered.
    pub node: NodeId,
}

/// Why a pipelined request could not be queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PipelineError {
    /// The window and the queue are full; try again after answers arrive.
    Full,
    /// The command encodes larger than a request may be.
    TooLarge(usize),
    /// The client stopped: the group refused a request as invalid (its sequence can never
    /// be completed), or the client was dropped.
    Stopped(String),
}

impl std::fmt::Display for PipelineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipelineError::Full => write!(f, "pipeline full"),
            PipelineError::TooLarge(n) => write!(f, "command of {n} bytes is too large"),
            PipelineError::Stopped(why) => write!(f, "client stopped: {why}"),
        }
    }
}

impl std::error::Error for PipelineError {}

/// What the driver reports besides answers.
enum Note {
    Answer(Answer),
    Stopped(String),
}

/// A client with many requests in flight on one connection to the leader.
///
/// Requests get consecutive sequence numbers as they are queued. A driver task sends them
/// (frames written while a write is under way go out together), matches answers by tag,
/// follows `NotLeader` hints, and whenever a request is not answered (an error, a `Gap`, a
/// lost connection, no answer within [`PIPELINE_ATTEMPT_TIMEOUT_MS`]) it resubmits every unanswered
/// request in sequence order under the same keys, on the leader it finds. Because the state
/// machine refuses a request whose predecessor is missing, each client's commands are
/// applied gaplessly and in order, exactly once.
pub struct PipelinedClient {
    health: Arc<PipelineHealth>,
    queue: mpsc::Sender<Queued>,
    notes: mpsc::UnboundedReceiver<Note>,
    /// The audit trailer the requests queued from now on carry ([`PipelinedClient::set_audit`]).
    audit: Option<Arc<Audit>>,
    next_seq: u64,
    client_id: u64,
    stopped: Option<String>,
    driver: tokio::task::JoinHandle<()>,
}

impl PipelinedClient {
    /// Starts the driver on the current tokio runtime. `first_seq` continues a restarted
    /// client's numbering (the group's last applied seq for `client_id`, plus one).
    pub fn start(
        nodes: Vec<(NodeId, SocketAddr)>,
        client_id: u64,
        first_seq: u64,
        window: usize,
    ) -> PipelinedClient {
        let health = Arc::new(PipelineHealth::default());
        PipelinedClient::start_with_health(nodes, client_id, first_seq, window, health)
    }

    /// As [`PipelinedClient::start`], reporting into `health` (which its owner reads).
    pub fn start_with_health(
        nodes: Vec<(NodeId, SocketAddr)>,
        client_id: u64,
        first_seq: u64,
        window: usize,
        health: Arc<PipelineHealth>,
    ) -> PipelinedClient {
        assert!(!nodes.is_empty());
        assert!(first_seq > 0);
        let window = window.clamp(1, PIPELINE_WINDOW_MAX);
        let (queue, queue_rx) = mpsc::channel(window);
        // Unbounded in type only: the driver emits at most one note per request it took
        // from the bounded queue, and holds at most `window` of them.
        let (notes_tx, notes) = mpsc::unbounded_channel();
        let driver = Driver {
            health: health.clone(),
            held: false,
            probing: false,
            nodes,
            current: 0,
            client_id,
            window,
            unanswered: BTreeMap::new(),
            unsent_from: 0,
            generation: 0,
            notes: notes_tx,
            held_since: None,
            probe: None,
            probe_not_before: Instant::now(),
        };
        PipelinedClient {
            health,
            queue,
            notes,
            next_seq: first_seq,
            client_id,
            stopped: None,
            audit: None,
            driver: tokio::spawn(driver.run(queue_rx)),
        }
    }

    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// Whether the group lacks a quorum, and what was re-sent: shared with the driver, read
    /// from any thread.
    pub fn health(&self) -> &Arc<PipelineHealth> {
        &self.health
    }

    /// The sequence number the next queued request will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn encode(&self, command: &Command) -> Result<Vec<u8>, PipelineError> {
        if let Some(why) = &self.stopped {
            return Err(PipelineError::Stopped(why.clone()));
        }
        let encoded = encode_command(command);
        if encoded.len() > bourse_core::codec::COMMAND_SIZE_BYTES_MAX as usize {
            return Err(PipelineError::TooLarge(encoded.len()));
        }
        Ok(encoded)
    }

    /// Who asks for the requests queued from now on (an admin action's operator and request
    /// id, carried into the log beside each command), or nobody (`None`, the default).
    pub fn set_audit(&mut self, audit: Option<Audit>) {
        self.audit = audit.map(Arc::new);
    }

    /// Queues a request without waiting; returns its sequence number.
    pub fn try_submit(&mut self, command: &Command) -> Result<u64, PipelineError> {
        let encoded = self.encode(command)?;
        let seq = self.next_seq;
        match self.queue.try_send((seq, encoded, self.audit.clone())) {
            Ok(()) => {
                self.next_seq += 1;
                Ok(seq)
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(PipelineError::Full),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(PipelineError::Stopped("driver ended".into()))
            }
        }
    }

    /// Queues a request, waiting for room; returns its sequence number.
    pub async fn submit(&mut self, command: &Command) -> Result<u64, PipelineError> {
        let encoded = self.encode(command)?;
        let seq = self.next_seq;
        self.queue
            .send((seq, encoded, self.audit.clone()))
            .await
            .map_err(|_| PipelineError::Stopped("driver ended".into()))?;
        self.next_seq += 1;
        Ok(seq)
    }

    /// The next answer; `Err` once the client stopped.
    pub async fn next_answer(&mut self) -> Result<Answer, PipelineError> {
        if let Some(why) = &self.stopped {
            return Err(PipelineError::Stopped(why.clone()));
        }
        match self.notes.recv().await {
            Some(Note::Answer(a)) => Ok(a),
            Some(Note::Stopped(why)) => {
                self.stopped = Some(why.clone());
                Err(PipelineError::Stopped(why))
            }
            None => {
                self.stopped = Some("driver ended".into());
                Err(PipelineError::Stopped("driver ended".into()))
            }
        }
    }

    /// An answer if one is ready.
    pub fn try_answer(&mut self) -> Result<Option<Answer>, PipelineError> {
        if let Some(why) = &self.stopped {
            return Err(PipelineError::Stopped(why.clone()));
        }
        match self.notes.try_recv() {
            Ok(Note::Answer(a)) => Ok(Some(a)),
            Ok(Note::Stopped(why)) => {
                self.stopped = Some(why.clone());
                Err(PipelineError::Stopped(why))
            }
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => {
                self.stopped = Some("driver ended".into());
                Err(PipelineError::Stopped("driver ended".into()))
            }
        }
    }
}

impl Drop for PipelinedClient {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A queued request: its seq, its command's bytes and who asked.
type Queued = (u64, Vec<u8>, Option<Arc<Audit>>);

struct Unanswered {
    command: Vec<u8>,
    /// Who asked, shared by every request of one admin action.
    audit: Option<Arc<Audit>>,
    /// When it was last sent (None: not yet sent on the current connection).
    sent_at: Option<Instant>,
    /// Sent at least once before (a send now is a re-send).
    sent_before: bool,
}

/// What a [`PipelinedClient`]'s driver tells its owner besides answers, as it happens.
#[derive(Debug, Default)]
pub struct PipelineHealth {
    /// The leader answered that it has no quorum, and nothing was acknowledged since: the
    /// client holds its requests (probing with one) instead of re-sending them.
    no_quorum: AtomicBool,
    /// Requests sent again after a first send (failover, gap, timeout, probe).
    resent: AtomicU64,
    /// Probes sent while the quorum was lost.
    probes: AtomicU64,
    /// Times a leader probe found a newer leader while requests waited, and the client moved
    /// its requests there.
    leader_probe_switches: AtomicU64,
    /// Times the client moved its requests to another node, for any reason.
    node_switches: AtomicU64,
    /// Requests taken from the queue and not yet answered, as of the driver's last turn.
    unanswered: AtomicU64,
}

impl PipelineHealth {
    pub fn no_quorum(&self) -> bool {
        self.no_quorum.load(Ordering::Acquire)
    }

    pub fn resent(&self) -> u64 {
        self.resent.load(Ordering::Acquire)
    }

    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Acquire)
    }

    pub fn leader_probe_switches(&self) -> u64 {
        self.leader_probe_switches.load(Ordering::Acquire)
    }

    pub fn node_switches(&self) -> u64 {
        self.node_switches.load(Ordering::Acquire)
    }

    pub fn unanswered(&self) -> u64 {
        self.unanswered.load(Ordering::Acquire)
    }
}

struct Driver {
    health: Arc<PipelineHealth>,
    /// The leader said it has no quorum: send only the oldest unanswered request (a probe),
    /// take nothing more from the queue, until an answer comes.
    held: bool,
    /// Moved to another node after an error or a "not the leader" that named none: send only
    /// the oldest unanswered request until one is answered there. During an election every
    /// node says it does not lead; sending the whole window to each in turn would re-send it
    /// every retry pause until a leader is elected.
    probing: bool,
    nodes: Vec<(NodeId, SocketAddr)>,
    current: usize,
    client_id: u64,
    window: usize,
    unanswered: BTreeMap<u64, Unanswered>,
    /// Every unanswered request below this seq was sent on the current connection in this
    /// generation: `send_unsent` looks only from here, so each answer costs the driver the
    /// requests new since the last send, not a walk over the whole window (a walk per answer
    /// was a fifth of the CPU of a bulk account addition at a 4,096 window).
    unsent_from: u64,
    /// Bumped on every rewind; tags carry it.
    generation: u64,
    notes: mpsc::UnboundedSender<Note>,
    /// Since when the leader has answered only that it has no quorum.
    held_since: Option<Instant>,
    /// A leader probe under way ([`newer_leader`] on its own task, so that requests queued
    /// meanwhile do not cancel it).
    probe: Option<tokio::task::JoinHandle<Option<usize>>>,
    /// No probe starts before this (one per [`LEADER_PROBE_EVERY_MS`]).
    probe_not_before: Instant,
}

/// One connection of the driver: its write half and the task that reads answers.
struct Link {
    writer: NodeWriteHalf,
    answers: mpsc::Receiver<std::io::Result<Tagged<Response>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// What made the driver give up its connection.
enum Rewind {
    /// Switch to this node (a hint) at once.
    To(usize),
    /// Pause, then try the next node.
    Next(String),
    /// The leader has no quorum: stay, hold every request, probe with the oldest after a
    /// pause.
    Hold,
    /// The node was just elected and awaits its first quorum: stay, and after a short pause
    /// send the oldest request alone; the rest of the window follows once one is applied.
    Stay,
}

impl Driver {
    async fn connect(&self) -> std::io::Result<Link> {
        let stream = crate::transport::dial(self.nodes[self.current].1).await?;
        let (read, writer) = stream.into_split();
        // Buffered: the answers to a batch arrive together and are read in one call.
        let mut read = tokio::io::BufReader::with_capacity(crate::net::READ_BUFFER_BYTES, read);
        let (tx, answers) = mpsc::channel(PIPELINE_WINDOW_MAX);
        let reader = tokio::spawn(async move {
            loop {
                let r = match read_frame(&mut read).await {
                    Ok(Some(frame)) => decode_message::<Tagged<Response>>(&frame),
                    Ok(None) => Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "node closed the connection",
                    )),
                    Err(e) => Err(e),
                };
                let end = r.is_err();
                if tx.send(r).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(Link {
            writer,
            answers,
            reader,
        })
    }

    /// Writes every unanswered request not yet sent on this connection, in seq order, in
    /// one write.
    async fn send_unsent(&mut self, link: &mut Link, buf: &mut Vec<u8>) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        buf.clear();
        let now = Instant::now();
        let generation = self.generation;
        // Held or probing, only the oldest unanswered request is sent, wherever it is.
        let one = self.held || self.probing;
        let from = if one { 0 } else { self.unsent_from };
        for (&seq, u) in self.unanswered.range_mut(from..) {
            if u.sent_at.is_some() {
                if one {
                    break;
                }
                continue;
            }
            u.sent_at = Some(now);
            if std::mem::replace(&mut u.sent_before, true) {
                self.health.resent.fetch_add(1, Ordering::AcqRel);
            }
            if one {
                self.health.probes.fetch_add(1, Ordering::AcqRel);
            }
            let tag = (generation << TAG_SEQ_BITS) | (seq & ((1 << TAG_SEQ_BITS) - 1));
            let body = match &u.audit {
                None => Request::Submit {
                    client_id: self.client_id,
                    request_seq: seq,
                    command: u.command.clone(),
                },
                Some(audit) => Request::SubmitAudited {
                    client_id: self.client_id,
                    request_seq: seq,
                    command: u.command.clone(),
                    audit: Audit::clone(audit),
                },
            };
            let frame = encode_frame(&Tagged { tag, body });
            buf.extend_from_slice(&frame);
            if one {
                // One probe at a time.
                break;
            }
            self.unsent_from = seq + 1;
        }
        if !buf.is_empty() {
            link.writer.write_all(buf).await?;
            link.writer.flush().await?;
        }
        Ok(())
    }

    /// Handles one answer; `Some` when the connection must be given up.
    fn on_answer(&mut self, tag: u64, response: Response) -> Result<Option<Rewind>, String> {
        let generation = tag >> TAG_SEQ_BITS;
        let Response::Submitted(result) = response else {
            return Ok(Some(Rewind::Next("unexpected response".into())));
        };
        match result {
            Ok(outcome) => {
                let seq = outcome.request_seq;
                match outcome.kind {
                    OutcomeKind::Gap { .. } => {
                        // An earlier request was lost on the way: resend from the first
                        // unanswered one (once per generation).
                        if generation == self.generation && self.unanswered.contains_key(&seq) {
                            return Ok(Some(Rewind::To(self.current)));
                        }
                    }
                    // Not applied and never will be: the requests after it cannot apply
                    // either (they would skip its sequence number).
                    OutcomeKind::Invalid => {
                        return Err(format!("request {seq}: the group could not decode it"))
                    }
                    kind => {
                        // This node applies requests: the rest of the window follows.
                        self.probing = false;
                        if self.held {
                            // Something was acknowledged: the quorum is back.
                            self.held = false;
                            self.held_since = None;
                            self.health.no_quorum.store(false, Ordering::Release);
                        }
                        if self.unanswered.remove(&seq).is_some() {
                            let _ = self.notes.send(Note::Answer(Answer {
                                request_seq: seq,
                                kind,
                                applied_index: outcome.applied_index,
                                node: self.nodes[self.current].0,
                            }));
                        }
                    }
                }
                Ok(None)
            }
            Err(SubmitError::Invalid(why)) => Err(format!("request refused as invalid: {why}")),
            Err(_) if generation != self.generation => Ok(None),
            Err(SubmitError::NotLeader { leader }) => {
                // By id, or by address for callers that know only the addresses.
                let hinted = leader.and_then(|(id, addr)| {
                    self.nodes
                        .iter()
                        .position(|n| n.0 == id || n.1.to_string() == addr)
                });
                Ok(Some(match hinted {
                    Some(i) if i != self.current => Rewind::To(i),
                    _ => Rewind::Next(format!(
                        "node {} is not the leader",
                        self.nodes[self.current].0
                    )),
                }))
            }
            Err(SubmitError::Unavailable(why)) => Ok(Some(Rewind::Next(why))),
            Err(SubmitError::NoQuorum { .. }) => Ok(Some(Rewind::Hold)),
            Err(SubmitError::LeaderUnconfirmed) => Ok(Some(Rewind::Stay)),
        }
    }

    async fn run(mut self, mut queue: mpsc::Receiver<Queued>) {
        let mut link: Option<Link> = None;
        let mut buf = Vec::with_capacity(64 * 1024);
        let mut queue_open = true;
        loop {
            if link.is_none() {
                match self.connect().await {
                    Ok(l) => link = Some(l),
                    Err(_) => {
                        // A node that cannot be reached (often the lost leader others still
                        // name while they elect): the next one gets one request first.
                        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                        self.current = (self.current + 1) % self.nodes.len();
                        self.health.node_switches.fetch_add(1, Ordering::AcqRel);
                        self.probing = true;
                        continue;
                    }
                }
            }
            let l = link.as_mut().expect("connected above");
            // Take what is queued, up to the window, then send it all at once.
            while queue_open && !self.held && self.unanswered.len() < self.window {
                match queue.try_recv() {
                    Ok((seq, command, audit)) => {
                        self.unanswered.insert(
                            seq,
                            Unanswered {
                                command,
                                audit,
                                sent_at: None,
                                sent_before: false,
                            },
                        );
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => queue_open = false,
                }
            }
            if !queue_open && self.unanswered.is_empty() {
                return;
            }
            // Every turn ends here after what it took or answered: the gauge follows both.
            self.health
                .unanswered
                .store(self.unanswered.len() as u64, Ordering::Release);
            let mut rewind = None;
            if let Err(e) = self.send_unsent(l, &mut buf).await {
                rewind = Some(Rewind::Next(e.to_string()));
            }
            if rewind.is_none() {
                let oldest = self
                    .unanswered
                    .values()
                    .next()
                    .and_then(|u| u.sent_at)
                    .map(|t| t + Duration::from_millis(PIPELINE_ATTEMPT_TIMEOUT_MS));
                let room = queue_open && !self.held && self.unanswered.len() < self.window;
                let probe_at = self.probe_at();
                tokio::select! {
                    answer = l.answers.recv() => match answer {
                        Some(Ok(tagged)) => match self.on_answer(tagged.tag, tagged.body) {
                            Ok(r) => rewind = r,
                            Err(why) => {
                                let _ = self.notes.send(Note::Stopped(why));
                                return;
                            }
                        },
                        Some(Err(e)) => rewind = Some(Rewind::Next(e.to_string())),
                        None => rewind = Some(Rewind::Next("reader ended".into())),
                    },
                    next = queue.recv(), if room => match next {
                        Some((seq, command, audit)) => {
                            self.unanswered.insert(seq, Unanswered { command, audit, sent_at: None, sent_before: false });
                        }
                        None => queue_open = false,
                    },
                    _ = sleep_until(oldest) => {
                        rewind = Some(Rewind::Next("no answer in time".into()));
                    }
                    _ = sleep_until(probe_at), if self.probe.is_none() => {
                        self.probe = Some(tokio::spawn(newer_leader(self.nodes.clone(), self.current)));
                    }
                    found = join_probe(&mut self.probe), if self.probe.is_some() => {
                        self.probe = None;
                        self.probe_not_before = Instant::now() + Duration::from_millis(LEADER_PROBE_EVERY_MS);
                        if let Ok(Some(newer)) = found {
                            self.health.leader_probe_switches.fetch_add(1, Ordering::AcqRel);
                            rewind = Some(Rewind::To(newer));
                        }
                    }
                }
            }
            if let Some(r) = rewind {
                // A probe under way asks about the node being left.
                if let Some(probe) = self.probe.take() {
                    probe.abort();
                }
                // Resend everything unanswered, in seq order, under a new generation.
                self.generation += 1;
                for u in self.unanswered.values_mut() {
                    u.sent_at = None;
                }
                self.unsent_from = 0;
                match r {
                    Rewind::Hold => {
                        self.held_since.get_or_insert_with(Instant::now);
                        self.held = true;
                        self.health.no_quorum.store(true, Ordering::Release);
                        tokio::time::sleep(Duration::from_millis(NO_QUORUM_PROBE_MS)).await;
                    }
                    Rewind::Stay => {
                        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                        self.probing = true;
                    }
                    Rewind::To(i) if i == self.current => {}
                    Rewind::To(i) => {
                        // Named as the leader (a hint, a probe): the whole window goes.
                        self.current = i;
                        self.health.node_switches.fetch_add(1, Ordering::AcqRel);
                        self.held_since = None;
                        self.held = false;
                        self.probing = false;
                        self.health.no_quorum.store(false, Ordering::Release);
                        link = None;
                    }
                    Rewind::Next(why) => {
                        crate::net::debug_line(format_args!(
                            "pipelined client {}: node {}: {why}; resending {} requests",
                            self.client_id,
                            self.nodes[self.current].0,
                            self.unanswered.len()
                        ));
                        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                        self.current = (self.current + 1) % self.nodes.len();
                        self.health.node_switches.fetch_add(1, Ordering::AcqRel);
                        self.held_since = None;
                        self.probing = true;
                        link = None;
                    }
                }
            }
        }
    }

    /// When the next leader probe is due: [`LEADER_PROBE_AFTER_MS`] after the oldest
    /// unanswered request was sent, or after the leader first said it had no quorum, and
    /// no sooner than [`LEADER_PROBE_EVERY_MS`] after the last probe. `None` while nothing waits.
    fn probe_at(&self) -> Option<Instant> {
        let waiting_since = if self.held {
            self.held_since
        } else {
            self.unanswered.values().next().and_then(|u| u.sent_at)
        }?;
        Some(
            (waiting_since + Duration::from_millis(LEADER_PROBE_AFTER_MS))
                .max(self.probe_not_before),
        )
    }
}

/// The outcome of the leader probe under way (never called without one).
async fn join_probe(
    probe: &mut Option<tokio::task::JoinHandle<Option<usize>>>,
) -> Result<Option<usize>, tokio::task::JoinError> {
    probe.as_mut().expect("a probe under way").await
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// A subscription to one node's committed stream over TCP.
pub struct StreamClient {
    reader: tokio::io::BufReader<NodeReadHalf>,
    /// Kept so the connection stays open.
    _writer: NodeWriteHalf,
    pub node: SocketAddr,
}

impl StreamClient {
    /// Connects and subscribes from `from_index`.
    pub async fn connect(addr: SocketAddr, from_index: u64) -> std::io::Result<StreamClient> {
        use tokio::io::AsyncWriteExt;
        let stream = crate::transport::dial(addr).await?;
        let (reader, mut writer) = stream.into_split();
        writer
            .write_all(&encode_frame(&Tagged {
                tag: 1,
                body: Request::Subscribe { from_index },
            }))
            .await?;
        writer.flush().await?;
        Ok(StreamClient {
            reader: tokio::io::BufReader::with_capacity(crate::net::READ_BUFFER_BYTES, reader),
            _writer: writer,
            node: addr,
        })
    }

    /// The next committed entry. A stream error (too old, lagged, gap) comes as
    /// `Ok(Err(..))`; connection failures as `Err`.
    pub async fn recv(&mut self) -> std::io::Result<Result<CommittedEntry, StreamError>> {
        let frame = read_frame(&mut self.reader).await?.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "node closed the stream")
        })?;
        match decode_message::<Tagged<Response>>(&frame)?.body {
            Response::Committed { index, entry } => {
                CommittedEntry::decode(index, &entry).map(Ok).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("stream entry {index}: {e}"),
                    )
                })
            }
            Response::StreamEnded(e) => Ok(Err(e)),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "unexpected response on a stream",
            )),
        }
    }
}

/// Asks one node for the last request seq it applied for `client_id` (0 if none).
pub async fn node_last_seq(
    addr: SocketAddr,
    client_id: u64,
    timeout: Duration,
) -> std::io::Result<u64> {
    let mut conn = PeerConnection::new(addr);
    match conn.call(Request::LastSeq { client_id }, timeout).await? {
        Response::LastSeq(s) => Ok(s),
        _ => Err(std::io::Error::other("unexpected response to last seq")),
    }
}

/// Asks one node for the core's instruments as of its last applied entry
/// ([`crate::query::InstrumentsAnswer`]); an answer that does not decode is an error naming why.
pub async fn node_instruments(
    addr: SocketAddr,
    timeout: Duration,
) -> std::io::Result<crate::query::InstrumentsAnswer> {
    let mut conn = PeerConnection::new(addr);
    match conn.call(Request::Instruments, timeout).await? {
        Response::Instruments { answer } => crate::query::InstrumentsAnswer::decode(&answer)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        _ => Err(std::io::Error::other("unexpected response to instruments")),
    }
}

/// Asks one node a query of its applied state ([`crate::query::Query`]); an answer that breaks
/// its bounds, or the node's refusal, is an error naming why.
pub async fn node_query(
    addr: SocketAddr,
    query: crate::query::Query,
    timeout: Duration,
) -> std::io::Result<crate::query::QueryAnswer> {
    let mut conn = PeerConnection::new(addr);
    match conn.call(Request::Query(query), timeout).await? {
        Response::Query(answer) => {
            answer
                .check()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            Ok(answer)
        }
        _ => Err(std::io::Error::other("unexpected response to a query")),
    }
}
