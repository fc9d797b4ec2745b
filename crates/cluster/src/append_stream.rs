//! Pipelined replication: openraft 0.10's `stream_append` over a connection of its own per
//! follower, several AppendEntries in flight instead of one.
//!
//! openraft's default `stream_append` sends one AppendEntries, waits for its answer, then
//! builds the next, so a batch proposed while one is out waits a whole round trip (and the
//! follower's append) before it leaves: at distance a commit costs two to three round trips.
//! Here a writer task sends each request as openraft yields it (up to
//! [`APPEND_STREAM_IN_FLIGHT_MAX`] unanswered) and the returned stream reads the answers in
//! order. The follower feeds the requests of such a connection, in arrival order, to its own
//! `Raft::stream_append` ([`FollowerPipe`]), which appends them one after another without
//! waiting for the previous flush, and answers each in order when it is durable. The safety
//! argument is openraft's: a response acknowledges a prefix only once the follower's log holds
//! it, and the leader treats every answer as before.
//!
//! Requests travel as `Request::AppendStream` (not `AppendEntries`), so a connection is either
//! a pipelined stream or the old strict request/response, never a mix.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use openraft::error::{NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::ClientConfig;

use crate::net::{
    decode_message, encode_frame, encode_frame_into, read_frame_into, Request, Response, Tagged,
    CONNECT_TIMEOUT_MS, READ_BUFFER_BYTES,
};
use crate::stages::Stages;
use crate::transport::{NodeReadHalf, NodeWriteHalf};
use crate::{LogId, NodeId, Raft, TypeConfig};

/// AppendEntries sent on one stream and not yet answered, at most. openraft's follower side
/// queues 64 of them towards its core; more would only wait in the socket.
pub const APPEND_STREAM_IN_FLIGHT_MAX: usize = 64;

/// What the reader needs to know of a request it has not seen answered.
struct Sent {
    tag: u64,
    prev: Option<LogId>,
    last: Option<LogId>,
    /// First and last index of the entries and when they left, for the stage timers; `None`
    /// for a request without entries or a network without stages.
    timed: Option<(u64, u64, u64)>,
    /// When it left (queued for the socket).
    sent_at: tokio::time::Instant,
}

/// Where one stream goes, and how.
pub(crate) struct StreamTarget {
    pub target: NodeId,
    pub addr: Option<SocketAddr>,
    pub tls: Option<Arc<ClientConfig>>,
    pub in_flight_max: usize,
    pub stages: Option<Arc<Stages>>,
}

type AppendStreamItem = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

fn network_error(e: std::io::Error) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(&e))
}

/// Opens a pipelined stream to `to.target`: dials a connection of its own, starts the writer
/// task, and returns the answers in request order.
pub(crate) async fn open<S>(
    to: StreamTarget,
    input: S,
    option: RPCOption,
) -> Result<BoxStream<'static, AppendStreamItem>, RPCError<TypeConfig>>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    assert!(
        (2..=APPEND_STREAM_IN_FLIGHT_MAX).contains(&to.in_flight_max),
        "a pipelined stream keeps 2..={APPEND_STREAM_IN_FLIGHT_MAX} requests in flight, not {}",
        to.in_flight_max
    );
    let Some(addr) = to.addr else {
        return Err(RPCError::Unreachable(Unreachable::new(
            &std::io::Error::other(format!("node {} has no valid address", to.target)),
        )));
    };
    let dial = crate::transport::dial_with(addr, to.tls.clone());
    let stream = match tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), dial).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(RPCError::Unreachable(Unreachable::new(&e))),
        Err(_) => {
            return Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            )))
        }
    };
    let (reader, writer) = stream.into_split();
    // The reader holds the oldest unanswered request while it waits for its answer, so the
    // queue holds one fewer: never more than `in_flight_max` unanswered, the follower's bound.
    let (sent_tx, sent_rx) = mpsc::channel(to.in_flight_max - 1);
    let writer_task = tokio::spawn(write_requests(input, writer, sent_tx, to.stages.clone()));
    let state = ReadState {
        answer_within: option.hard_ttl(),
        last_answer_at: tokio::time::Instant::now(),
        reader: BufReader::with_capacity(READ_BUFFER_BYTES, reader),
        sent_rx,
        frame: Vec::new(),
        _writer: AbortOnDrop(writer_task),
        stages: to.stages,
        target: to.target,
    };
    Ok(futures_util::stream::unfold(Some(state), read_answer).boxed())
}

/// Sends every request openraft yields, recording each before it leaves so the reader never
/// meets an answer it cannot match. Ends when openraft's input ends (the reader then drains
/// what is left and ends the stream), when the reader is gone, or when a write fails (the
/// reader then fails on the connection or on a deadline).
async fn write_requests<S>(
    mut input: S,
    mut writer: NodeWriteHalf,
    sent_tx: mpsc::Sender<Sent>,
    stages: Option<Arc<Stages>>,
) where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let mut out = Vec::new();
    let mut tag = 0u64;
    while let Some(request) = input.next().await {
        tag += 1;
        let last = request
            .entries
            .last()
            .map(|e| e.log_id)
            .or(request.prev_log_id);
        let timed = match (&stages, request.entries.first(), request.entries.last()) {
            (Some(stages), Some(first), Some(last)) => {
                Some((first.log_id.index, last.log_id.index, stages.now_ns()))
            }
            _ => None,
        };
        let sent = Sent {
            tag,
            prev: request.prev_log_id,
            last,
            timed,
            sent_at: tokio::time::Instant::now(),
        };
        // Waits here while the window is full: this is the stream's bound.
        if sent_tx.send(sent).await.is_err() {
            return;
        }
        out.clear();
        encode_frame_into(
            &mut out,
            &Tagged {
                tag,
                body: Request::AppendStream(request),
            },
        );
        if writer.write_all(&out).await.is_err() || writer.flush().await.is_err() {
            return;
        }
        crate::net::shrink_frame_buffer(&mut out, 0);
    }
}

/// Aborts the writer task when the stream is dropped (openraft ended the session).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct ReadState {
    /// openraft's time for one AppendEntries (its heartbeat interval).
    answer_within: Duration,
    /// When the previous answer arrived (the stream's start before the first).
    last_answer_at: tokio::time::Instant,
    reader: BufReader<NodeReadHalf>,
    sent_rx: mpsc::Receiver<Sent>,
    frame: Vec<u8>,
    _writer: AbortOnDrop,
    stages: Option<Arc<Stages>>,
    target: NodeId,
}

/// The next answer, in request order; the stream ends after the first error, a conflict, a
/// higher vote or a partial success (openraft starts a new session from what was matched).
async fn read_answer(state: Option<ReadState>) -> Option<(AppendStreamItem, Option<ReadState>)> {
    let target = state.as_ref().map(|s| s.target);
    let r = read_answer_inner(state).await;
    if crate::net::net_debug() {
        let line = crate::net::debug_line;
        match &r {
            Some((Err(e), _)) => line(format_args!("append stream to {target:?}: {e}")),
            Some((Ok(res), None)) => {
                line(format_args!("append stream to {target:?} ends: {res:?}"))
            }
            None => line(format_args!("append stream to {target:?}: input ended")),
            _ => {}
        }
    }
    r
}

async fn read_answer_inner(
    state: Option<ReadState>,
) -> Option<(AppendStreamItem, Option<ReadState>)> {
    let mut state = state?;
    let sent = state.sent_rx.recv().await?;
    // A deadline on progress, not on each request's send: a follower answers in order, so the
    // later requests of a full window wait for the earlier ones, and timing each from its send
    // would end healthy streams under load (each end costs a new stream). The oldest request
    // must be answered within openraft's time from its send or from the previous answer,
    // whichever is later: one request at a time gets exactly openraft's deadline.
    let deadline = sent.sent_at.max(state.last_answer_at) + state.answer_within;
    let read = read_frame_into(&mut state.reader, &mut state.frame);
    let answer = match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(true)) => match decode_message::<Tagged<Response>>(&state.frame) {
            Ok(answer) => answer,
            Err(e) => return Some((Err(network_error(e)), None)),
        },
        Ok(Ok(false)) => {
            let e = std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "peer closed the replication stream",
            );
            return Some((Err(network_error(e)), None));
        }
        Ok(Err(e)) => return Some((Err(network_error(e)), None)),
        Err(_) => {
            let e = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer on the replication stream in time",
            );
            return Some((Err(network_error(e)), None));
        }
    };
    state.last_answer_at = tokio::time::Instant::now();
    if answer.tag != sent.tag {
        let e = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("answer tag {} for request {}", answer.tag, sent.tag),
        );
        return Some((Err(network_error(e)), None));
    }
    let response = match answer.body {
        Response::AppendEntries(Ok(response)) => response,
        Response::AppendEntries(Err(e)) => {
            let e = std::io::Error::other(format!("node {}: {e}", state.target));
            return Some((Err(RPCError::Unreachable(Unreachable::new(&e))), None));
        }
        _ => {
            let e = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "unexpected answer on a replication stream",
            );
            return Some((Err(network_error(e)), None));
        }
    };
    if let (AppendEntriesResponse::Success, Some(stages), Some((first, last, sent_ns))) =
        (&response, &state.stages, sent.timed)
    {
        stages.on_append_acknowledged(first, last, sent_ns);
    }
    let whole = matches!(response, AppendEntriesResponse::Success);
    let result = response.into_stream_result(sent.prev, sent.last);
    let go_on = whole && result.is_ok();
    Some((Ok(result), go_on.then_some(state)))
}

/// The follower's side of one pipelined connection: the requests go, in arrival order, to
/// `Raft::stream_append`; a task writes each answer, in order, under its request's tag.
///
/// Nothing here waits on the connection's task: a leader keeps at most
/// [`APPEND_STREAM_IN_FLIGHT_MAX`] requests unanswered, and every request the pipe holds is
/// one of those, so both queues have room for any request a leader may send; a request that
/// finds a queue full breaks that promise, and the connection is closed. The connection's task
/// therefore always goes back to reading, sees its peer close, and ends, dropping the pipe
/// (which ends openraft's side of the stream).
pub(crate) struct FollowerPipe {
    /// `None` once the connection's input ended ([`FollowerPipe::finish`]).
    input: Option<PipeInput>,
    /// Requests taken and not yet answered.
    unanswered: Arc<AtomicU64>,
    stages: Arc<Stages>,
    task: JoinHandle<()>,
}

/// The pipe's two queues: the requests for openraft, the tags for their answers.
struct PipeInput {
    requests: mpsc::Sender<AppendEntriesRequest<TypeConfig>>,
    tags: mpsc::Sender<(u64, Option<u64>)>,
}

/// How long a pipe whose connection's input ended may take to answer what it took.
pub(crate) const APPEND_STREAM_FINISH_TIMEOUT_MS: u64 = 10_000;

impl FollowerPipe {
    /// Starts the pipe; answers go to `answers` (the connection's writer queue).
    pub(crate) fn start(raft: Raft, stages: Arc<Stages>, answers: mpsc::Sender<Vec<u8>>) -> Self {
        let (requests, requests_rx) = mpsc::channel(APPEND_STREAM_IN_FLIGHT_MAX);
        let (tags, tags_rx) = mpsc::channel(APPEND_STREAM_IN_FLIGHT_MAX);
        stages.on_append_stream_served();
        let input = futures_util::stream::unfold(requests_rx, |mut rx| async move {
            rx.recv().await.map(|r| (r, rx))
        });
        let unanswered = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(answer_in_order(
            raft,
            input,
            tags_rx,
            stages.clone(),
            answers,
            unanswered.clone(),
        ));
        FollowerPipe {
            input: Some(PipeInput { requests, tags }),
            unanswered,
            stages,
            task,
        }
    }

    /// Hands one request to the pipe without waiting; false when the pipe has ended (a
    /// conflict, a higher vote: the leader starts a new stream) or the peer sent more than a
    /// leader may leave unanswered. Either way the connection should close.
    pub(crate) fn push(
        &self,
        tag: u64,
        received_ns: Option<u64>,
        request: AppendEntriesRequest<TypeConfig>,
    ) -> bool {
        // The tag first: the request cannot be answered before the answer task knows it.
        let Some(input) = &self.input else {
            return false;
        };
        let unanswered = self.unanswered.fetch_add(1, Ordering::Relaxed) + 1;
        self.stages.on_append_stream_request(unanswered);
        input.tags.try_send((tag, received_ns)).is_ok() && input.requests.try_send(request).is_ok()
    }

    /// The leader sent its last request (its side of the connection ended): openraft's side
    /// sees its input end, answers every request it took, in order, and the pipe ends. A
    /// leader ends a stream this way after each probe of where the follower's log matches, so
    /// those answers must still be written; waits at most `within`, then gives up on them.
    pub(crate) async fn finish(mut self, within: Duration) {
        self.input = None;
        let _ = tokio::time::timeout(within, &mut self.task).await;
    }
}

impl Drop for FollowerPipe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer_in_order(
    raft: Raft,
    input: impl Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + 'static,
    mut tags: mpsc::Receiver<(u64, Option<u64>)>,
    stages: Arc<Stages>,
    answers: mpsc::Sender<Vec<u8>>,
    unanswered: Arc<AtomicU64>,
) {
    let mut results = std::pin::pin!(raft.stream_append(input));
    while let Some(result) = results.next().await {
        let Some((tag, received_ns)) = tags.recv().await else {
            return;
        };
        unanswered.fetch_sub(1, Ordering::Relaxed);
        if let Some(t) = received_ns {
            stages.on_follower_append(stages.now_ns().saturating_sub(t));
        }
        let body = match result {
            Ok(r) => Response::AppendEntries(Ok(AppendEntriesResponse::from(r))),
            Err(fatal) => Response::AppendEntries(Err(RaftError::Fatal(fatal))),
        };
        if answers
            .send(encode_frame(&Tagged { tag, body }))
            .await
            .is_err()
        {
            return;
        }
    }
}
