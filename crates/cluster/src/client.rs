//! A client of a replica group: finds the leader, submits requests, and retries each request
//! with the same idempotency key until the group answers it (or a deadline passes).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bourse_core::{Command, Event};

use crate::batch::{decode_events, encode_command};
use crate::net::{NodeStatus, PeerConnection, Request, Response, SubmitError};
use crate::state::OutcomeKind;
use crate::NodeId;

/// How long one attempt at one node may take.
pub const ATTEMPT_TIMEOUT_MS: u64 = 2_000;
/// The pause before trying again when no node knows a leader (an election is under way).
pub const RETRY_PAUSE_MS: u64 = 20;

/// A request the group committed and applied, with its events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acknowledged {
    pub request_seq: u64,
    /// True if an earlier attempt had applied it and this answer came from the table.
    pub duplicate: bool,
    pub events: Vec<Event>,
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
        }
    }

    pub fn client_id(&self) -> u64 {
        self.client_id
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
        let request_seq = self.next_seq;
        let encoded = encode_command(command);
        let started = Instant::now();
        let mut last_error = String::from("no attempt made");
        if self.conn.is_none() {
            self.switch_to(self.current);
        }
        while started.elapsed() < deadline {
            let conn = self.conn.as_mut().expect("connection chosen");
            let request = Request::Submit {
                client_id: self.client_id,
                request_seq,
                command: encoded.clone(),
            };
            let attempt = conn
                .call(request, Duration::from_millis(ATTEMPT_TIMEOUT_MS))
                .await;
            match attempt {
                Ok(Response::Submitted(Ok(outcome))) => {
                    let events = decode_events(&outcome.events)
                        .map_err(|e| ClientError::Rejected(format!("bad events: {e}")))?;
                    match outcome.kind {
                        OutcomeKind::Applied | OutcomeKind::Duplicate => {
                            self.next_seq += 1;
                            return Ok(Acknowledged {
                                request_seq,
                                duplicate: outcome.kind == OutcomeKind::Duplicate,
                                events,
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
                    }
                }
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

/// Asks one node for its status.
pub async fn node_status(addr: SocketAddr, timeout: Duration) -> std::io::Result<NodeStatus> {
    let mut conn = PeerConnection::new(addr);
    match conn.call(Request::Status, timeout).await? {
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
