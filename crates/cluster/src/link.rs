//! [`ClusterLink`]: a replicated core (a `bourse node` replica group) behind the gateway's
//! [`CoreLink`] seam (`bourse_core::link`).
//!
//! The link owns a thread with a small tokio runtime. Commands go to the group through a
//! pipelined cluster client under the link's own client id, numbered 1, 2, 3, ... across
//! restarts (at start the link asks the leader for the last seq it applied for that id and
//! continues from there); the gateway's [`RequestKey`] of each is remembered by that seq.
//!
//! Every output comes from the group's committed stream, not from the answers to the
//! submissions: for each committed request, its events (`Event::OrderLog` left out) under the
//! gateway's key and then `Done` if it is one of this link's requests, or under
//! [`FOREIGN_KEY`] (no `Done`) if another client sent it (the resting side of a trade against
//! another gateway's order, someone else's mass cancel), for the router to route by order id;
//! another client's account additions and cash movements concern no order and are left out.
//! The link remembers the last index it handled; when the stream's node fails it resubscribes
//! on another node from the next index, so no report is lost or repeated. A command is
//! reported once, when its first application is streamed: a resubmission after a failover is
//! answered `Duplicate` and reported no more.
//!
//! At start the link also asks the leader for the group's instruments with their definitions
//! (`crate::query::InstrumentsAnswer`, from its applied state, as of an index at or past the
//! stream's start) and queues them for the gateway as `InstrumentAdded` events under
//! [`FOREIGN_KEY`], before the stream's first entry: a gateway that crashed, whose stream
//! starts after an operator added an instrument, still learns it (an instrument added later
//! comes on the stream). A resubscription continues the stream from the next index, so it
//! misses nothing and asks again for nothing; a link started again (a restarted gateway) asks
//! again.
//!
//! `submit` never blocks: a full queue is [`SubmitError::Full`]. Outputs wait in a bounded
//! queue; while the gateway does not drain it the link stops reading the stream, and a node
//! cuts a subscriber that lags too far, after which the link resubscribes from where it was.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::{
    node_instruments, node_last_seq, node_status, PipelineHealth, PipelinedClient, StreamClient,
};
use crate::{CommittedEntry, OutcomeKind, StreamError};
use bourse_core::codec::decode_events;
use bourse_core::link::{CoreLink, CoreOutput, LinkCounters, RequestKey, SubmitError};
use bourse_core::{Command, Event};
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use tokio::sync::{mpsc, watch};

/// The key under which events caused by other clients of the core arrive (the router routes
/// them by order id and ignores orders it does not own). Session `u32::MAX` is never a real
/// session, and session 0 (the gateway's administration) must not get them.
pub const FOREIGN_KEY: RequestKey = RequestKey {
    session: u32::MAX,
    seq: 0,
};

/// How long a status, last-seq or connect call to one node may take.
const CALL_TIMEOUT_MS: u64 = 500;
/// Pause between rounds over the nodes when none answers.
const RETRY_PAUSE_MS: u64 = 50;
/// If the group has answered one of this link's requests that the stream has not shown, and
/// the stream has not moved for this long, the stream's node is behind or cut off:
/// resubscribe elsewhere. The link
/// reads the leader's stream, which holds an entry before its answer leaves, so a stream this
/// far behind the answers is a paused or cut-off node (the failover goal is 1 s); a
/// resubscription costs a status round and a connection, never a report.
const STREAM_BEHIND_MS: u64 = 600;
/// As [`STREAM_BEHIND_MS`] when the answers come from another node than the stream's and the
/// move to the answering node on its answer (see `Worker::run_inner`) did not take: this much
/// behind the answering node means a silent stream node.
const STREAM_BEHIND_ANSWERING_NODE_MS: u64 = 150;
/// How often the link compares the stream with the answers.
const STREAM_BEHIND_CHECK_MS: u64 = 50;
/// Outputs the gateway may leave undrained, per queued command, up to
/// [`OUTPUTS_QUEUED_MAX`].
const OUTPUTS_PER_COMMAND: usize = 16;
/// The most outputs waiting for the gateway. The queue is an array allocated and written in
/// full when the link starts (about 160 bytes a slot): 16 per command of a 65,536-deep
/// command queue held 170 MB per link before the first order. Past this bound the link
/// simply stops reading the stream until the gateway drains some.
const OUTPUTS_QUEUED_MAX: usize = 65_536;

/// What a [`ClusterLink`] connects to and how much it queues.
#[derive(Clone, Debug)]
pub struct ClusterLinkConfig {
    /// The client addresses of the replica group's nodes.
    pub nodes: Vec<SocketAddr>,
    /// The link's client id at the core: its idempotency namespace. Two gateways in front of
    /// one core need different ids; a restarted gateway keeps its id and continues its
    /// numbering.
    pub client_id: u64,
    /// Commands queued in the link before `submit` answers `Full`.
    pub queue_depth: usize,
    /// Commands in flight to the group at once.
    pub window: usize,
    /// How long `start` may take to find the group.
    pub start_timeout_ms: u64,
    /// Where the committed stream starts: the index after the last one a previous run of the
    /// gateway handled (its saved order state, `bourse_gateway::recovery`), so that what the core did
    /// while the gateway was away is reported; none: after the leader's last applied index.
    pub from_index: Option<u64>,
}

impl ClusterLinkConfig {
    pub fn new(nodes: Vec<SocketAddr>, client_id: u64, queue_depth: usize) -> ClusterLinkConfig {
        ClusterLinkConfig {
            nodes,
            client_id,
            queue_depth,
            window: crate::client::PIPELINE_WINDOW_DEFAULT,
            start_timeout_ms: 10_000,
            from_index: None,
        }
    }
}

/// What the link's thread reports to whoever watches it (tests, metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterLinkStatus {
    /// The last log index whose outputs were handed to the gateway.
    pub last_index: Option<u64>,
    /// The node the stream comes from.
    pub stream_node: Option<SocketAddr>,
    /// Resubscriptions after a stream failure.
    pub resubscriptions: u64,
    /// Why the link stopped, if it did (the gateway then gets `Closed`).
    pub stopped: Option<String>,
    /// The legs of this link's own requests (see [`LinkLegs`]).
    pub legs: LinkLegs,
}

/// Where this link's own requests spend their time, each leg over
/// `bourse_monitor::metrics::LATENCY_BUCKETS_NS`, timed on the link's thread:
///
/// - `answered`: from the link taking the command off the gateway's queue to the group's
///   answer (the client connection to the leader, its batcher, the journal appends and
///   fsyncs, the quorum, the apply, the answer back);
/// - `streamed_after_answer`: from that answer to the request's entry arriving on the
///   committed stream the outputs come from (what reporting from the stream costs beyond the
///   answer);
/// - `round_trip`: from taking the command to handing its outputs to the gateway.
///
/// A request streamed before its answer arrived counts 0 in `streamed_after_answer`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkLegs {
    pub answered: LegTimes,
    pub streamed_after_answer: LegTimes,
    pub round_trip: LegTimes,
}

/// One leg's observations: count, sum and maximum, and counts per bucket of
/// `bourse_monitor::metrics::LATENCY_BUCKETS_NS` (then one for the ones above the last bound).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LegTimes {
    pub count: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
    pub buckets: Vec<u64>,
}

impl LegTimes {
    pub fn observe(&mut self, ns: u64) {
        let bounds = bourse_monitor::metrics::LATENCY_BUCKETS_NS;
        if self.buckets.len() != bounds.len() + 1 {
            self.buckets = vec![0; bounds.len() + 1];
        }
        let i = bounds.partition_point(|&b| b < ns);
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds another link's observations (the legs of several links into one figure).
    pub fn add(&mut self, other: &LegTimes) {
        if other.count == 0 {
            return;
        }
        if self.buckets.len() != other.buckets.len() {
            self.buckets = vec![0; other.buckets.len()];
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Mean (exact) and percentiles (interpolated inside a bucket), `None` when empty.
    pub fn percentiles(&self) -> Option<bourse_monitor::probe::Percentiles> {
        let bounds = bourse_monitor::metrics::LATENCY_BUCKETS_NS;
        if self.count == 0 || self.buckets.len() != bounds.len() + 1 {
            return None;
        }
        let mut all: Vec<u64> = bounds.to_vec();
        all.push(self.max_ns.max(bounds[bounds.len() - 1]));
        let cumulative: Vec<u64> = self
            .buckets
            .iter()
            .scan(0u64, |acc, c| {
                *acc += c;
                Some(*acc)
            })
            .collect();
        let mut p = bourse_monitor::ltp::percentiles_from_buckets(
            &all,
            &cumulative,
            self.sum_ns,
            self.count,
        )?;
        // Interpolation inside the top bucket may pass the largest value seen.
        p.max = self.max_ns;
        for q in [&mut p.p50, &mut p.p90, &mut p.p99, &mut p.p999] {
            *q = (*q).min(self.max_ns);
        }
        Some(p)
    }
}

type Notify = Arc<Mutex<Option<Arc<dyn Fn() + Send + Sync>>>>;

/// What the worker queues for the gateway: outputs, and after the outputs of each log entry a
/// marker with its index, so that the link knows exactly which entries the gateway has taken
/// whole (the position a restarted gateway resumes the stream from).
enum Item {
    Output(CoreOutput),
    Handled(u64),
}

/// A replicated core behind the gateway. See the module documentation.
pub struct ClusterLink {
    commands: Option<mpsc::Sender<(RequestKey, Command)>>,
    /// The pipelined client's view of the group: while it holds its requests for want of a
    /// quorum, new commands are refused ([`SubmitError::NoQuorum`]) rather than queued.
    health: Arc<PipelineHealth>,
    outputs: Receiver<Item>,
    /// The last log index whose outputs the gateway has taken, all of them (see [`Item`]).
    taken_index: Option<u64>,
    notify: Notify,
    status: Arc<Mutex<ClusterLinkStatus>>,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

/// Where the link starts: the next seq of its client id and the stream's first index.
struct Start {
    first_seq: u64,
    from_index: u64,
    /// The group's instruments as of an index at or past `from_index - 1`, handed to the
    /// gateway as `InstrumentAdded` events before the stream's first entry.
    instruments: Vec<Event>,
}

async fn find_start(config: &ClusterLinkConfig) -> Result<Start, String> {
    let deadline = Instant::now() + Duration::from_millis(config.start_timeout_ms);
    let timeout = Duration::from_millis(CALL_TIMEOUT_MS);
    let mut last_error = String::from("no node answered");
    while Instant::now() < deadline {
        for &addr in &config.nodes {
            let status = match node_status(addr, timeout).await {
                Ok(s) => s,
                Err(e) => {
                    last_error = format!("{addr}: {e}");
                    continue;
                }
            };
            // Only the leader knows every request committed so far.
            if status.leader != Some(status.id) {
                continue;
            }
            let last_seq = match node_last_seq(addr, config.client_id, timeout).await {
                Ok(s) => s,
                Err(e) => {
                    last_error = format!("{addr}: {e}");
                    continue;
                }
            };
            let from_index = config
                .from_index
                .unwrap_or_else(|| status.last_applied_index.map_or(0, |i| i + 1));
            // The instruments added before the stream starts (an operator's, at run time)
            // are behind it: the node's applied state names them all.
            let answer = match node_instruments(addr, timeout).await {
                Ok(a) => a,
                Err(e) => {
                    last_error = format!("{addr}: instruments: {e}");
                    continue;
                }
            };
            answer.complete().map_err(|e| format!("{addr}: {e}"))?;
            if answer.next_index < from_index {
                // A node that lost the lead since and lags: its state may miss an addition.
                last_error = format!(
                    "{addr}: instruments as of index {} where the stream starts at {from_index}",
                    answer.next_index
                );
                continue;
            }
            return Ok(Start {
                first_seq: last_seq + 1,
                from_index,
                instruments: answer.events(),
            });
        }
        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
    }
    Err(format!(
        "no leader found among {:?} within {} ms: {last_error}",
        config.nodes, config.start_timeout_ms
    ))
}

impl ClusterLink {
    /// Finds the group's leader, continues the client id's numbering, subscribes to the
    /// committed stream and starts the link's thread.
    pub fn start(config: ClusterLinkConfig) -> Result<ClusterLink, String> {
        if config.nodes.is_empty() {
            return Err("a cluster link needs at least one node".into());
        }
        if config.queue_depth == 0 {
            return Err("queue_depth must be > 0".into());
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cluster link runtime: {e}"))?;
        let start = runtime.block_on(find_start(&config))?;
        let (command_tx, command_rx) = mpsc::channel(config.queue_depth);
        let outputs_max = config
            .queue_depth
            .saturating_mul(OUTPUTS_PER_COMMAND)
            .min(OUTPUTS_QUEUED_MAX)
            .max(start.instruments.len() + 1);
        let (output_tx, outputs) = bounded(outputs_max);
        // Queued before the link returns, so a gateway that polls its links once before it
        // serves routes every instrument from its first message (learning one it already
        // knows, from its configuration or its saved state, changes nothing).
        for event in &start.instruments {
            output_tx
                .try_send(Item::Output(CoreOutput::Event {
                    key: FOREIGN_KEY,
                    event: *event,
                }))
                .map_err(|_| "the output queue is sized for the instruments".to_string())?;
        }
        let notify: Notify = Arc::new(Mutex::new(None));
        let status = Arc::new(Mutex::new(ClusterLinkStatus {
            last_index: start.from_index.checked_sub(1),
            ..ClusterLinkStatus::default()
        }));
        let (stop, stop_rx) = watch::channel(false);
        let health = Arc::new(PipelineHealth::default());
        let worker = Worker {
            health: health.clone(),
            nodes: config.nodes.clone(),
            client_id: config.client_id,
            keys: BTreeMap::new(),
            times: BTreeMap::new(),
            legs: LinkLegs::default(),
            outputs: output_tx,
            notify: notify.clone(),
            status: status.clone(),
            next_index: start.from_index,
            stop: stop_rx,
        };
        let window = config.window;
        let thread = std::thread::Builder::new()
            .name(format!("bourse-cluster-link-{}", config.client_id))
            .spawn(move || {
                runtime.block_on(worker.run(command_rx, start.first_seq, window));
            })
            .map_err(|e| format!("cluster link thread: {e}"))?;
        Ok(ClusterLink {
            commands: Some(command_tx),
            health,
            outputs,
            taken_index: start.from_index.checked_sub(1),
            notify,
            status,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether the group lacks a quorum, and what the link re-sent (see [`PipelineHealth`]).
    pub fn health(&self) -> Arc<PipelineHealth> {
        self.health.clone()
    }

    /// The link's progress and state.
    pub fn status(&self) -> ClusterLinkStatus {
        self.status.lock().expect("status lock").clone()
    }

    /// A handle that reads the link's status after the link was handed to a gateway.
    pub fn watch(&self) -> ClusterLinkWatch {
        ClusterLinkWatch(self.status.clone())
    }
}

/// Reads a [`ClusterLink`]'s status from elsewhere (see [`ClusterLink::watch`]).
#[derive(Clone)]
pub struct ClusterLinkWatch(Arc<Mutex<ClusterLinkStatus>>);

impl ClusterLinkWatch {
    pub fn status(&self) -> ClusterLinkStatus {
        self.0.lock().expect("status lock").clone()
    }
}

impl CoreLink for ClusterLink {
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError> {
        let Some(tx) = &self.commands else {
            return Err(SubmitError::Closed);
        };
        if self.health.no_quorum() {
            return Err(SubmitError::NoQuorum);
        }
        match tx.try_send((key, command)) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => Err(SubmitError::Full),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(SubmitError::Closed),
        }
    }

    fn try_recv(&mut self) -> Option<CoreOutput> {
        loop {
            match self.outputs.try_recv().ok()? {
                Item::Output(out) => return Some(out),
                Item::Handled(index) => self.taken_index = Some(index),
            }
        }
    }

    fn stream_position(&self) -> Option<u64> {
        self.taken_index
    }

    fn link_counters(&self) -> Option<LinkCounters> {
        let h = &self.health;
        Some(LinkCounters {
            requests_resent: h.resent(),
            probes: h.probes(),
            node_switches: h.node_switches(),
            leader_probe_switches: h.leader_probe_switches(),
            stream_resubscriptions: self.status.lock().expect("status lock").resubscriptions,
            requests_pending: h.unanswered(),
            no_quorum: h.no_quorum(),
        })
    }

    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>) {
        if let Ok(mut g) = self.notify.lock() {
            *g = Some(notify);
        }
    }
}

impl Drop for ClusterLink {
    fn drop(&mut self) {
        self.commands = None;
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            // The worker never blocks on the output queue (it polls it), so it sees the stop.
            let _ = thread.join();
        }
    }
}

/// The times of one of this link's requests (see [`LinkLegs`]).
struct RequestTimes {
    taken: Instant,
    answered: Option<Instant>,
    streamed: Option<Instant>,
}

/// Requests whose times are kept at most: one answered and never streamed (a stream that
/// failed over past it) must not be remembered for ever.
const REQUEST_TIMES_MAX: usize = 1 << 20;

struct Worker {
    health: Arc<PipelineHealth>,
    nodes: Vec<SocketAddr>,
    client_id: u64,
    /// The gateway's key of each of this link's requests not yet seen in the stream.
    keys: BTreeMap<u64, RequestKey>,
    /// When each of this link's requests was taken, answered and streamed, until it has been
    /// both answered and streamed (or, for one never answered, streamed).
    times: BTreeMap<u64, RequestTimes>,
    /// The legs measured since the last entry, published to the status once per entry.
    legs: LinkLegs,
    outputs: Sender<Item>,
    notify: Notify,
    status: Arc<Mutex<ClusterLinkStatus>>,
    /// The first log index not yet handled.
    next_index: u64,
    stop: watch::Receiver<bool>,
}

/// A subscription read by a task of its own, so that waiting for the next entry can be
/// abandoned (by `select!`) without cutting a frame in half.
struct Feed {
    entries: mpsc::Receiver<std::io::Result<Result<CommittedEntry, StreamError>>>,
    node: SocketAddr,
    reader: tokio::task::JoinHandle<()>,
}

/// Entries read ahead of the worker.
const FEED_ENTRIES_AHEAD: usize = 1024;

impl Feed {
    fn start(mut stream: StreamClient) -> Feed {
        let node = stream.node;
        let (tx, entries) = mpsc::channel(FEED_ENTRIES_AHEAD);
        let reader = tokio::spawn(async move {
            loop {
                let r = stream.recv().await;
                let end = !matches!(r, Ok(Ok(_)));
                if tx.send(r).await.is_err() || end {
                    return;
                }
            }
        });
        Feed {
            entries,
            node,
            reader,
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Whether another client's event is one the gateway has no use for: it routes other
/// clients' events by order id (and learns instruments from `InstrumentAdded`), so an account
/// added or cash moved by someone else would only cost its event loop time. An operator's
/// bulk addition makes two such events per account, on the thread that also routes trading.
fn concerns_no_order(event: &Event) -> bool {
    matches!(
        event,
        Event::AccountAdded { .. } | Event::CashChanged { .. }
    )
}

/// Why the worker ended.
enum End {
    Stopped,
    Failed(String),
}

impl Worker {
    fn ns(d: Duration) -> u64 {
        d.as_nanos() as u64
    }

    fn on_taken(&mut self, seq: u64) {
        if self.times.len() >= REQUEST_TIMES_MAX {
            self.times.pop_first();
        }
        self.times.insert(
            seq,
            RequestTimes {
                taken: Instant::now(),
                answered: None,
                streamed: None,
            },
        );
    }

    /// Adds the legs measured since the last call to the status.
    fn publish_legs(&mut self) {
        if self.legs.round_trip.count + self.legs.answered.count == 0 {
            return;
        }
        let legs = std::mem::take(&mut self.legs);
        let mut status = self.status.lock().expect("status lock");
        status.legs.answered.add(&legs.answered);
        status
            .legs
            .streamed_after_answer
            .add(&legs.streamed_after_answer);
        status.legs.round_trip.add(&legs.round_trip);
    }

    fn on_answered(&mut self, seq: u64) {
        let now = Instant::now();
        let Some(t) = self.times.get_mut(&seq) else {
            return;
        };
        // A request re-sent after a leader change can be answered twice: timed once.
        if t.answered.is_some() {
            return;
        }
        self.legs
            .answered
            .observe(Self::ns(now.saturating_duration_since(t.taken)));
        match t.streamed {
            // Streamed first: the stream cost nothing beyond the answer.
            Some(_) => {
                self.legs.streamed_after_answer.observe(0);
                self.times.remove(&seq);
            }
            None => t.answered = Some(now),
        }
    }

    fn on_streamed(&mut self, seq: u64) {
        let now = Instant::now();
        let Some(t) = self.times.get_mut(&seq) else {
            return;
        };
        // A request re-sent after a leader change is on the stream twice (applied, then a
        // duplicate): its round trip ended at the first.
        if t.streamed.is_some() {
            return;
        }
        self.legs
            .round_trip
            .observe(Self::ns(now.saturating_duration_since(t.taken)));
        match t.answered {
            Some(a) => {
                self.legs
                    .streamed_after_answer
                    .observe(Self::ns(now.saturating_duration_since(a)));
                self.times.remove(&seq);
            }
            None => t.streamed = Some(now),
        }
    }

    fn wake(&self) {
        let f = self.notify.lock().ok().and_then(|g| g.clone());
        if let Some(f) = f {
            f();
        }
    }

    /// Hands one output to the gateway, waiting (without blocking the runtime) while its
    /// queue is full.
    async fn emit(&mut self, out: CoreOutput) -> Result<(), End> {
        self.emit_item(Item::Output(out)).await
    }

    async fn emit_item(&mut self, mut out: Item) -> Result<(), End> {
        loop {
            match self.outputs.try_send(out) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(_)) => return Err(End::Stopped),
                Err(TrySendError::Full(back)) => {
                    out = back;
                    self.wake();
                    if *self.stop.borrow() {
                        return Err(End::Stopped);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }

    async fn handle_entry(&mut self, entry: CommittedEntry) -> Result<(), End> {
        debug_assert_eq!(entry.index, self.next_index);
        for r in &entry.requests {
            let own = r.client_id == self.client_id;
            if own {
                self.on_streamed(r.request_seq);
            }
            let key = match r.kind {
                OutcomeKind::Applied if own => self.keys.remove(&r.request_seq),
                OutcomeKind::Applied => Some(FOREIGN_KEY),
                // Never applied (the session table is full): the gateway must still hear
                // that the command is done.
                OutcomeKind::Refused if own => {
                    if let Some(key) = self.keys.remove(&r.request_seq) {
                        self.emit(CoreOutput::Done { key }).await?;
                    }
                    continue;
                }
                // Duplicates were reported at their first application; gaps and refusals
                // of others applied nothing.
                _ => continue,
            };
            // An own request without a key was sent by an earlier run of this gateway: its
            // events concern orders this run does not know, like another client's.
            let (key, done) = match key {
                Some(k) if k != FOREIGN_KEY => (k, true),
                _ => (FOREIGN_KEY, false),
            };
            let events = decode_events(&r.events).map_err(|e| {
                End::Failed(format!(
                    "index {}: events of request {}/{} do not decode: {e}",
                    entry.index, r.client_id, r.request_seq
                ))
            })?;
            for event in events {
                if matches!(event, Event::OrderLog(_)) || (!done && concerns_no_order(&event)) {
                    continue;
                }
                self.emit(CoreOutput::Event { key, event }).await?;
            }
            if done {
                self.emit(CoreOutput::Done { key }).await?;
            }
        }
        self.emit_item(Item::Handled(entry.index)).await?;
        self.next_index = entry.index + 1;
        self.status.lock().expect("status lock").last_index = Some(entry.index);
        self.publish_legs();
        Ok(())
    }

    /// Subscribes from `next_index` on `prefer` if it takes the subscription, else on a
    /// node, the leader first, other than `avoid` if another answers.
    async fn subscribe(
        &mut self,
        avoid: Option<SocketAddr>,
        prefer: Option<SocketAddr>,
    ) -> Result<Feed, End> {
        let timeout = Duration::from_millis(CALL_TIMEOUT_MS);
        if let Some(addr) = prefer.filter(|&p| Some(p) != avoid) {
            if let Ok(Ok(stream)) =
                tokio::time::timeout(timeout, StreamClient::connect(addr, self.next_index)).await
            {
                self.status.lock().expect("status lock").stream_node = Some(addr);
                return Ok(Feed::start(stream));
            }
        }
        loop {
            if *self.stop.borrow() {
                return Err(End::Stopped);
            }
            let mut candidates = Vec::new();
            for &addr in &self.nodes {
                if Some(addr) == avoid {
                    // It just failed this link (a paused node would make the status call
                    // wait its whole timeout): tried last, unasked.
                    candidates.push((true, true, addr));
                    continue;
                }
                if let Ok(s) = node_status(addr, timeout).await {
                    let leads = s.leader == Some(s.id);
                    candidates.push((Some(addr) == avoid, !leads, addr));
                }
            }
            candidates.sort();
            for (_, _, addr) in candidates {
                let Ok(Ok(stream)) =
                    tokio::time::timeout(timeout, StreamClient::connect(addr, self.next_index))
                        .await
                else {
                    continue;
                };
                self.status.lock().expect("status lock").stream_node = Some(addr);
                return Ok(Feed::start(stream));
            }
            tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
        }
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<(RequestKey, Command)>,
        first_seq: u64,
        window: usize,
    ) {
        let end = self.run_inner(&mut commands, first_seq, window).await;
        if let End::Failed(why) = end {
            eprintln!("bourse cluster link {}: stopped: {why}", self.client_id);
            self.status.lock().expect("status lock").stopped = Some(why);
        }
        commands.close();
        self.wake();
    }

    async fn run_inner(
        &mut self,
        commands: &mut mpsc::Receiver<(RequestKey, Command)>,
        first_seq: u64,
        window: usize,
    ) -> End {
        let ids: Vec<(u64, SocketAddr)> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, *a))
            .collect();
        let mut client = PipelinedClient::start_with_health(
            ids.clone(),
            self.client_id,
            first_seq,
            window,
            self.health.clone(),
        );
        let mut stream = match self.subscribe(None, None).await {
            Ok(s) => s,
            Err(e) => return e,
        };
        // A command the pipeline had no room for, retried after the next answer.
        let mut held: Option<(RequestKey, Command)> = None;
        let mut answered_max = first_seq - 1;
        let mut behind_since: Option<Instant> = None;
        // The node that gave the latest answer (the leader, as far as the pipeline knows).
        let mut answered_by: Option<SocketAddr> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(STREAM_BEHIND_CHECK_MS));
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                _ = stop.changed() => return End::Stopped,
                next = commands.recv(), if held.is_none() => {
                    let Some((key, command)) = next else { return End::Stopped };
                    let seq = client.next_seq();
                    match client.try_submit(&command) {
                        Ok(_) => {
                            self.keys.insert(seq, key);
                            self.on_taken(seq);
                        }
                        Err(crate::client::PipelineError::Full) => held = Some((key, command)),
                        Err(e) => return End::Failed(e.to_string()),
                    }
                }
                answer = client.next_answer() => {
                    match answer {
                        Ok(a) => {
                            answered_max = answered_max.max(a.request_seq);
                            answered_by = ids.iter().find(|(id, _)| *id == a.node).map(|(_, addr)| *addr);
                            self.on_answered(a.request_seq);
                            // An answer that follows its entry's report is the last word.
                            self.publish_legs();
                        }
                        Err(e) => return End::Failed(e.to_string()),
                    }
                    if let Some((key, command)) = held.take() {
                        let seq = client.next_seq();
                        match client.try_submit(&command) {
                            Ok(_) => {
                            self.keys.insert(seq, key);
                            self.on_taken(seq);
                        }
                            Err(crate::client::PipelineError::Full) => held = Some((key, command)),
                            Err(e) => return End::Failed(e.to_string()),
                        }
                    }
                    // An answer from another node than the stream's, for a request the stream
                    // has not shown: after a failover the answers come from the new leader
                    // while the stream may still be read from the old one, paused or cut off,
                    // which sends nothing and closes nothing, and the gateway's client hears
                    // of its order only from the stream. The answering node applied the entry
                    // before it answered: the stream moves there now, not after a wait
                    // (150 ms and a check period were a quarter of a paused leader's failover
                    // as a gateway's client saw it). A healthy stream node loses nothing by
                    // the move: the stream goes on from the next index, and the answers come
                    // from one node until the next leader change.
                    let behind = self.keys.keys().next().is_some_and(|&s| s <= answered_max);
                    if behind && answered_by.is_some_and(|a| a != stream.node) {
                        let avoid = stream.node;
                        crate::net::debug_line(format_args!(
                            "cluster link {}: answers from {answered_by:?}, stream from {avoid} behind them; resubscribing",
                            self.client_id
                        ));
                        stream = match self.subscribe(Some(avoid), answered_by).await {
                            Ok(s) => s,
                            Err(e) => return e,
                        };
                        self.status.lock().expect("status lock").resubscriptions += 1;
                        behind_since = None;
                    }
                }
                entry = stream.entries.recv() => {
                    let failed = match entry {
                        Some(Ok(Ok(entry))) if entry.index == self.next_index => {
                            if let Err(e) = self.handle_entry(entry).await {
                                return e;
                            }
                            // One wake-up per entry: an entry is a whole batch of requests.
                            self.wake();
                            // The stream moves: behind counts from its last step, so a
                            // gateway slow to drain (the link waits for room) is not taken
                            // for a stalled node.
                            if behind_since.is_some() {
                                behind_since = Some(Instant::now());
                            }
                            None
                        }
                        Some(Ok(Ok(entry))) => Some(format!("entry {} where {} was due", entry.index, self.next_index)),
                        Some(Ok(Err(StreamError::TooOld { oldest_kept, .. }))) => {
                            return End::Failed(format!(
                                "node {} no longer keeps index {} (oldest kept {oldest_kept}): \
                                 execution reports were lost",
                                stream.node, self.next_index
                            ));
                        }
                        Some(Ok(Err(e))) => Some(e.to_string()),
                        Some(Err(e)) => Some(e.to_string()),
                        None => Some("stream reader ended".into()),
                    };
                    if let Some(why) = failed {
                        let avoid = stream.node;
                        crate::net::debug_line(format_args!(
                            "cluster link {}: stream from {avoid}: {why}; resubscribing",
                            self.client_id
                        ));
                        stream = match self.subscribe(Some(avoid), answered_by).await {
                            Ok(s) => s,
                            Err(e) => return e,
                        };
                        self.status.lock().expect("status lock").resubscriptions += 1;
                        behind_since = None;
                    }
                }
                _ = tick.tick() => {
                    // The group answered a request the stream has not shown yet.
                    let behind = self.keys.keys().next().is_some_and(|&s| s <= answered_max);
                    match (behind, behind_since) {
                        (false, _) => behind_since = None,
                        (true, None) => behind_since = Some(Instant::now()),
                        (true, Some(t)) if t.elapsed() > Duration::from_millis(
                            if answered_by.is_some_and(|a| a != stream.node) {
                                STREAM_BEHIND_ANSWERING_NODE_MS
                            } else {
                                STREAM_BEHIND_MS
                            },
                        ) => {
                            let avoid = stream.node;
                            stream = match self.subscribe(Some(avoid), answered_by).await {
                                Ok(s) => s,
                                Err(e) => return e,
                            };
                            self.status.lock().expect("status lock").resubscriptions += 1;
                            behind_since = None;
                        }
                        (true, Some(_)) => {}
                    }
                }
            }
        }
    }
}
