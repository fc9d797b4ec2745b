//! The access server: one event-loop thread (mio) owns every socket, every FIX and binary
//! session and the [`Router`]; the core runs behind a [`CoreLink`]. The loop reads the clock
//! once per cycle, reads sockets (at most `READ_BYTES_PER_TURN` per connection: its duty
//! cycle), drains the core's outputs, delivers reports, and flushes what it wrote, so a burst
//! of requests costs one write per connection per turn (smart batching) and its first reports
//! leave while the rest of it is still being read.
//!
//! Monitoring: the loop counts in plain integers (`crate::metrics`) and publishes them to the
//! monitor's counters on its 20 ms timer, so a message costs an add and no atomic operation;
//! sampled requests carry a [`bourse_monitor::Trace`] stamped at t0
//! (socket read), t1 (decoded), t2 (handed to the core), t5 (core's answer received), t6
//! (report encoded) and t7 (written), recorded by the loop's own lock-free
//! [`bourse_monitor::StageRecorder`].
//!
//! The loop's parts: this module (start, sockets, FIX sessions, delivery of reports, timers),
//! `binary_session` (binary sessions), `crate::bootstrap` (before the loop starts) and
//! `crate::metrics` (what it counts).

mod admission;
mod binary_session;
mod credentials;

pub use crate::disconnect::DisconnectReason;

use crate::binary_front;
use crate::bootstrap::{bootstrap, restore_order_state};
use crate::config::{allowed_networks, GatewayConfig};
use crate::fix_front::{self, FixApp};
use crate::metrics::{GatewayMetrics, LoopCounters};
use crate::recovery;
use crate::router::{ExecKind, Proto, RejectCause, Report, Router, SessionRef};
use crate::tls::Transport;
use bourse_core::link::CoreLink;
use bourse_core::*;
use bourse_fix::session::{Action, Role, Session, SessionConfig};
use bourse_fix::FileStore;
use bourse_fix::{Dictionary, OutMessage, RawMessage};
use bourse_monitor::{DashboardServer, Monitor, MonitorConfig, Stage, Trace};
use bourse_wire::frame::encode_frame;
use bourse_wire::order_entry::{self as oe, FrameDecoder, Message, FRAME_BYTES_MAX};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const WAKER: Token = Token(0);
const FIX_LISTENER: Token = Token(1);
const BINARY_LISTENER: Token = Token(2);
const FIX_TLS_LISTENER: Token = Token(3);
const BINARY_TLS_LISTENER: Token = Token(4);
const FIRST_CONN: usize = 5;

/// Bytes read from one connection per loop turn: the loop's duty cycle. A client that sends
/// faster than the gateway processes would otherwise be read until it pauses, and every
/// report would wait for the end of its burst; with the budget, each turn reads at most this
/// much per connection, then hands over the core's answers and writes the reports before it
/// reads on (about 80 FIX orders, 250 binary ones).
pub const READ_BYTES_PER_TURN: usize = 16 * 1024;
/// Core outputs handled per loop cycle before sockets get their turn.
const CORE_OUTPUTS_PER_CYCLE_MAX: usize = 65_536;
/// How often session timers run.
const TICK_INTERVAL_MS: u64 = 20;
/// Connections accepted per readiness event of a listener.
const ACCEPTS_PER_EVENT_MAX: usize = 1_024;

/// Counters anyone may read while the gateway runs (tests check them for leaks).
#[derive(Debug, Default)]
pub struct GatewayStats {
    pub connections_open: AtomicUsize,
    pub connections_accepted: AtomicU64,
    /// Accepted and closed at once because `connections_max` was reached.
    pub connections_refused: AtomicU64,
    pub fix_sessions_logged_on: AtomicUsize,
    pub binary_sessions_established: AtomicUsize,
    /// Connections closed because their unsent output passed the limit.
    pub slow_consumers_closed: AtomicU64,
    pub requests_in: AtomicU64,
    pub reports_out: AtomicU64,
    pub orders_tracked: AtomicUsize,
    /// Bytes of the frames the binary sessions keep for retransmission (at most
    /// `stored_messages_max` frames per session): the resend stores' memory.
    pub binary_resend_bytes: AtomicUsize,
    /// Bytes of the outbound messages the FIX sessions' stores keep for resending (at most
    /// `stored_messages_max` per session), updated every tick.
    pub fix_stored_bytes: AtomicUsize,
    /// About the memory of the finished orders the router keeps for status requests (at
    /// most `finished_orders_kept`; see `Router::finished_orders_bytes`), updated every tick.
    pub finished_orders_bytes: AtomicUsize,
    pub requests_pending: AtomicUsize,
    /// Loop turns that stopped reading a connection at [`READ_BYTES_PER_TURN`] with bytes
    /// still waiting, to let reports out first.
    pub read_yields: AtomicU64,
}

/// A running gateway (see [`spawn`]).
pub struct GatewayHandle {
    fix_addr: Option<SocketAddr>,
    binary_addr: Option<SocketAddr>,
    fix_tls_addr: Option<SocketAddr>,
    binary_tls_addr: Option<SocketAddr>,
    stats: Arc<GatewayStats>,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
    monitor: Option<Arc<Monitor>>,
    dashboard: Option<DashboardServer>,
}

impl GatewayHandle {
    /// The monitor the gateway reports into, if monitoring is on.
    pub fn monitor(&self) -> Option<&Arc<Monitor>> {
        self.monitor.as_ref()
    }
    /// Where `/metrics` and the dashboard are served (`monitor_listen`), if they are.
    pub fn monitor_addr(&self) -> Option<SocketAddr> {
        self.dashboard.as_ref().map(|d| d.addr())
    }
    pub fn fix_addr(&self) -> Option<SocketAddr> {
        self.fix_addr
    }
    pub fn binary_addr(&self) -> Option<SocketAddr> {
        self.binary_addr
    }
    /// Where FIX clients connect over TLS (`fix_tls_listen`), if they can.
    pub fn fix_tls_addr(&self) -> Option<SocketAddr> {
        self.fix_tls_addr
    }
    /// Where binary clients connect over TLS (`binary_tls_listen`), if they can.
    pub fn binary_tls_addr(&self) -> Option<SocketAddr> {
        self.binary_tls_addr
    }
    pub fn stats(&self) -> &Arc<GatewayStats> {
        &self.stats
    }
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
    /// Stops the loop, closes every connection and waits for the thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }
    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.dashboard = None;
    }
}

impl Drop for GatewayHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    let std_listener =
        std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| format!("{addr}: {e}"))?;
    Ok(TcpListener::from_std(std_listener))
}

pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Starts the access servers of `config` in front of one core, `link` (a configuration
/// with one core, or none listed). See [`spawn_cores`].
pub fn spawn(config: GatewayConfig, link: Box<dyn CoreLink>) -> Result<GatewayHandle, String> {
    spawn_cores(config, vec![link], None)
}

/// Starts the access servers of `config` in front of `links`, one per core of
/// [`GatewayConfig::core_plan`] in that order. Cores that bootstrap (`[core] bootstrap` or the
/// core's own `bootstrap`) get the config's instruments they own and every account first,
/// idempotently. `monitor`: report into this monitor (its owner serves it); none, and
/// `monitor_listen` is set: the gateway makes its own and serves `/metrics` and the dashboard
/// there.
pub fn spawn_cores(
    config: GatewayConfig,
    mut links: Vec<Box<dyn CoreLink>>,
    monitor: Option<Arc<Monitor>>,
) -> Result<GatewayHandle, String> {
    let mut config = config;
    // Passwords the clients changed replace the configured ones before anything reads them.
    let password_store = match &config.gateway.password_store_path {
        Some(path) => {
            let store = crate::password_store::PasswordStore::open(path)?;
            store.apply(&mut config)?;
            Some(store)
        }
        None => None,
    };
    config.validate()?;
    let plan = config.core_plan();
    if links.len() != plan.len() {
        return Err(format!(
            "{} core links for the {} cores of the configuration",
            links.len(),
            plan.len()
        ));
    }
    let poll = Poll::new().map_err(|e| e.to_string())?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(|e| e.to_string())?);
    for link in &mut links {
        let waker_core = Arc::clone(&waker);
        link.set_notify(Arc::new(move || {
            let _ = waker_core.wake();
        }));
    }
    let mut dashboard = None;
    let monitor = match (monitor, config.gateway.monitor_listen) {
        (Some(m), _) => Some(m),
        (None, Some(addr)) => {
            let m = Monitor::new(
                MonitorConfig {
                    sample_every: config.gateway.monitor_sample_every,
                    node_name: "gateway".into(),
                    ..MonitorConfig::default()
                }
                .validated()?,
            );
            dashboard = Some(
                DashboardServer::start(Arc::clone(&m), addr)
                    .map_err(|e| format!("monitor_listen {addr}: {e}"))?,
            );
            Some(m)
        }
        (None, None) => None,
    };
    let mut fix_listener = config.gateway.fix_listen.map(bind).transpose()?;
    let mut binary_listener = config.gateway.binary_listen.map(bind).transpose()?;
    let fix_addr = fix_listener.as_ref().and_then(|l| l.local_addr().ok());
    let binary_addr = binary_listener.as_ref().and_then(|l| l.local_addr().ok());
    let tls = match (&config.gateway.tls_cert_path, &config.gateway.tls_key_path) {
        (Some(cert), Some(key)) => Some(crate::tls::server_config(cert, key)?),
        _ => None,
    };
    let mut fix_tls_listener = config.gateway.fix_tls_listen.map(bind).transpose()?;
    let mut binary_tls_listener = config.gateway.binary_tls_listen.map(bind).transpose()?;
    let fix_tls_addr = fix_tls_listener.as_ref().and_then(|l| l.local_addr().ok());
    let binary_tls_addr = binary_tls_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok());
    for (l, token) in [
        (fix_tls_listener.as_mut(), FIX_TLS_LISTENER),
        (binary_tls_listener.as_mut(), BINARY_TLS_LISTENER),
    ] {
        if let Some(l) = l {
            poll.registry()
                .register(l, token, Interest::READABLE)
                .map_err(|e| e.to_string())?;
        }
    }
    if let Some(l) = fix_listener.as_mut() {
        poll.registry()
            .register(l, FIX_LISTENER, Interest::READABLE)
            .map_err(|e| e.to_string())?;
    }
    if let Some(l) = binary_listener.as_mut() {
        poll.registry()
            .register(l, BINARY_LISTENER, Interest::READABLE)
            .map_err(|e| e.to_string())?;
    }
    let dictionary = Arc::new(fix_front::dictionary());
    let mut fix = Vec::new();
    for (i, s) in config.fix_sessions.iter().enumerate() {
        let mut sc = SessionConfig::new(
            "FIX.4.4",
            &s.gateway_comp_id,
            &s.client_comp_id,
            Role::Acceptor,
        );
        sc.latency_max_ms = config.gateway.sending_time_tolerance_ms;
        sc.message_size_max_bytes = config.gateway.fix_message_size_max_bytes;
        sc.logon_timeout_ms = config.gateway.logon_timeout_ms as i64;
        let dir = config.gateway.store_dir.join(format!(
            "FIX.4.4-{}-{}",
            s.gateway_comp_id, s.client_comp_id
        ));
        let store = FileStore::open(
            &dir,
            config.gateway.stored_messages_max,
            config.gateway.store_sync,
        )
        .map_err(|e| format!("FIX store {}: {e}", dir.display()))?;
        fix.push(FixSlot {
            session: Session::new(sc, Arc::clone(&dictionary), Box::new(store)),
            allowed_addresses: allowed_networks(&s.allowed_addresses, &s.allowed_sources)?,
            sref: SessionRef(i as u32),
            client_comp_id: s.client_comp_id.clone(),
            gateway_comp_id: s.gateway_comp_id.clone(),
            conn: None,
            offline: VecDeque::new(),
        });
    }
    let fix_count = fix.len();
    let bin = config
        .binary_sessions
        .iter()
        .enumerate()
        .map(|(j, s)| {
            Ok(BinSlot {
                sref: SessionRef((fix_count + j) as u32),
                credentials: s.credentials.clone(),
                allowed_addresses: allowed_networks(&s.allowed_addresses, &s.allowed_sources)?,
                conn: None,
                next_seq: 1,
                sent: VecDeque::new(),
                first_kept_seq: 1,
                keepalive_ms: 1_000,
                last_recv_ms: 0,
                last_sent_ms: 0,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut router = Router::new(&config, links);
    // Before bootstrap: its polling may already hand over outputs the restored orders own.
    restore_order_state(&mut router, &config.gateway.store_dir)?;
    bootstrap(&mut router, &config)?;
    // A replicated core's link queues the core's instruments (those an operator added at run
    // time too) ahead of its stream: learned here, before the first session is served.
    let cores = router.links_mut().len().max(1);
    router.poll_core(CORE_OUTPUTS_PER_CYCLE_MAX.saturating_mul(cores));
    let metrics = monitor.as_ref().map(|m| {
        let names: Vec<String> = plan.iter().map(|c| c.name.clone()).collect();
        let linked: Vec<bool> = router
            .links_mut()
            .iter()
            .map(|l| l.link_counters().is_some())
            .collect();
        GatewayMetrics::new(m, &names, &linked)
    });
    if let Some(m) = &monitor {
        if m.probes().sample_every() > 0 {
            router.enable_probes(m.probes().recorder());
        }
    }
    let stats = Arc::new(GatewayStats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let checks = credentials::Checks::start(&config, Arc::clone(&waker), password_store)?;
    let prelogon = bourse_admission::Admission::new(config.admission());
    let mut server = Server {
        poll,
        fix_listener,
        binary_listener,
        fix_tls_listener,
        binary_tls_listener,
        tls,
        conns: HashMap::new(),
        fix,
        bin,
        router,
        config,
        stats: Arc::clone(&stats),
        dirty: Vec::new(),
        now_ms: 0,
        now_ns: 0,
        exec_id_prefix: format!("{:x}", now_ns() / 1_000_000),
        exec_ids: 0,
        exec_id: String::new(),
        fix_out: OutMessage::new("8"),
        dictionary,
        counters: LoopCounters::default(),
        metrics,
        awaiting_write: Vec::new(),
        prelogon,
        close_log: admission::CloseLog::default(),
        checks,
    };
    let stop_loop = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("bourse-gateway".into())
        .spawn(move || server.run(&stop_loop))
        .map_err(|e| e.to_string())?;
    Ok(GatewayHandle {
        fix_addr,
        binary_addr,
        fix_tls_addr,
        binary_tls_addr,
        stats,
        stop,
        waker,
        thread: Some(thread),
        monitor,
        dashboard,
    })
}

/// How long a stopping gateway waits for its requests in flight to be answered before it
/// saves its order state.
const STOP_DRAIN_MS: u64 = 5_000;

struct FixSlot {
    session: Session,
    /// Where the session may log on from (its registered networks); empty: anywhere.
    allowed_addresses: Vec<bourse_admission::Cidr>,
    sref: SessionRef,
    client_comp_id: String,
    gateway_comp_id: String,
    conn: Option<Token>,
    /// Messages for the session while it is logged off, sent at its next logon.
    offline: VecDeque<OutMessage>,
}

struct BinSlot {
    sref: SessionRef,
    credentials: String,
    /// Where the session may establish from (its registered networks); empty: anywhere.
    allowed_addresses: Vec<bourse_admission::Cidr>,
    conn: Option<Token>,
    next_seq: u64,
    /// Sent responses kept for retransmission; the first has `first_kept_seq`.
    sent: VecDeque<Box<[u8]>>,
    first_kept_seq: u64,
    keepalive_ms: u32,
    last_recv_ms: u64,
    last_sent_ms: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fix,
    Binary,
}

struct Conn {
    /// Plain TCP, or TLS over it (a connection accepted on a TLS listener).
    stream: Transport,
    kind: Kind,
    out: Vec<u8>,
    out_pos: usize,
    /// The FIX or binary slot this connection logged on to.
    attached: Option<usize>,
    /// FIX: the bytes before logon (at most one message); binary: bytes of an incomplete
    /// frame.
    inbuf: Vec<u8>,
    closing: bool,
    /// Why it is closing (counted when it is closed).
    close_reason: DisconnectReason,
    /// What the log line of its close adds to the reason (a session's own words).
    close_detail: Option<String>,
    peer: SocketAddr,
    /// Binary: the schema version the client established with; the gateway's frames to it
    /// carry that version (`bourse_wire::order_entry::set_frame_version`).
    wire_version: u16,
}

struct Server {
    poll: Poll,
    fix_listener: Option<TcpListener>,
    binary_listener: Option<TcpListener>,
    fix_tls_listener: Option<TcpListener>,
    binary_tls_listener: Option<TcpListener>,
    /// The TLS listeners' certificate and key.
    tls: Option<Arc<rustls::ServerConfig>>,
    conns: HashMap<Token, Conn>,
    fix: Vec<FixSlot>,
    bin: Vec<BinSlot>,
    router: Router,
    config: GatewayConfig,
    stats: Arc<GatewayStats>,
    dirty: Vec<Token>,
    now_ms: u64,
    now_ns: u64,
    exec_id_prefix: String,
    exec_ids: u64,
    /// The ExecID being sent, its allocation kept from one report to the next.
    exec_id: String,
    /// The FIX message every report is rendered into, kept so that its buffers are reused.
    fix_out: OutMessage,
    #[allow(dead_code)]
    dictionary: Arc<Dictionary>,
    counters: LoopCounters,
    metrics: Option<GatewayMetrics>,
    /// Sampled traces whose report is in a connection's output, waiting for the write (t7).
    awaiting_write: Vec<(Token, Trace)>,
    /// Connections not logged on yet, and how many of them each source address holds.
    /// The ports' admission table: every open connection, strangers first in line to go.
    prelogon: bourse_admission::Admission,
    /// Log lines of closes this second, to keep a flood of hostile connections from
    /// flooding the log too (they are all counted on `/metrics`).
    close_log: admission::CloseLog,
    /// Password checks off the loop and the connections waiting for them.
    checks: credentials::Checks,
}

/// Sampled traces waiting for their write at most (a connection that does not drain must not
/// grow the list).
const TRACES_AWAITING_WRITE_MAX: usize = 4_096;

/// Whether a FIX message (its first bytes) is a session-level Reject (35=3).
fn is_session_reject(bytes: &[u8]) -> bool {
    // "8=FIX.4.4|9=NNN|35=3|": MsgType is the third field, within the first 32 bytes.
    let head = &bytes[..bytes.len().min(32)];
    head.windows(6).any(|w| w == b"\x0135=3\x01")
}

/// Whether `token` is one of the four listeners'.
fn is_listener(token: Token) -> bool {
    [
        FIX_LISTENER,
        BINARY_LISTENER,
        FIX_TLS_LISTENER,
        BINARY_TLS_LISTENER,
    ]
    .contains(&token)
}

impl Server {
    fn run(&mut self, stop: &AtomicBool) {
        let mut events = Events::with_capacity(1024);
        let mut last_tick_ms = 0u64;
        let mut again: Vec<Token> = Vec::new();
        // Listeners that stopped at their turn's accepts with more connections waiting.
        let mut accept_again: Vec<Token> = Vec::new();
        let mut scratch = vec![0u8; 64 * 1024];
        while !stop.load(Ordering::SeqCst) {
            let timeout = if again.is_empty() && accept_again.is_empty() {
                Duration::from_millis(TICK_INTERVAL_MS)
            } else {
                Duration::ZERO
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != ErrorKind::Interrupted {
                    eprintln!("gateway: poll failed: {e}");
                    break;
                }
            }
            self.now_ns = now_ns();
            self.now_ms = self.now_ns / 1_000_000;
            let mut readable: Vec<Token> = std::mem::take(&mut again);
            let listeners = std::mem::take(&mut accept_again);
            let ready = events.iter().map(|e| e.token());
            for token in listeners
                .into_iter()
                .chain(ready.filter(|t| is_listener(*t)))
            {
                if accept_again.contains(&token) {
                    continue;
                }
                let more = match token {
                    FIX_LISTENER => self.accept(Kind::Fix, false),
                    BINARY_LISTENER => self.accept(Kind::Binary, false),
                    FIX_TLS_LISTENER => self.accept(Kind::Fix, true),
                    _ => self.accept(Kind::Binary, true),
                };
                if more {
                    accept_again.push(token);
                }
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    token if is_listener(token) => {}
                    token => {
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            readable.push(token);
                        }
                        if event.is_writable() {
                            self.dirty.push(token);
                        }
                    }
                }
            }
            readable.sort_unstable();
            readable.dedup();
            for token in readable {
                if self.read(token, &mut scratch) {
                    again.push(token);
                }
            }
            self.finish_checks();
            self.router.poll_core(CORE_OUTPUTS_PER_CYCLE_MAX);
            self.deliver();
            if self.now_ms >= last_tick_ms + TICK_INTERVAL_MS {
                last_tick_ms = self.now_ms;
                self.tick();
            }
            self.flush();
        }
        self.drain_and_save();
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        for t in tokens {
            self.close(t, DisconnectReason::Shutdown);
        }
        self.publish();
        self.router.probes_mut().recorder.flush();
    }

    /// At stop, with cores that outlive the gateway: reads no more requests, waits (at most
    /// [`STOP_DRAIN_MS`]) until every request in flight is answered and delivered, then saves
    /// the order state with the exact stream positions it reflects, for the next run.
    fn drain_and_save(&mut self) {
        let all_resumable = self
            .router
            .links_mut()
            .iter()
            .all(|l| l.stream_position().is_some());
        if !all_resumable {
            return;
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(STOP_DRAIN_MS);
        loop {
            self.now_ns = now_ns();
            self.now_ms = self.now_ns / 1_000_000;
            // Without a bound, polling returns only once every link had nothing more: the
            // router has then taken each log entry's outputs whole, so the positions saved
            // below are exact (an entry taken in part would be replayed in full).
            self.router.poll_core(usize::MAX);
            self.deliver();
            self.flush();
            if self.router.pending_requests() == 0 {
                break;
            }
            if std::time::Instant::now() > deadline {
                eprintln!(
                    "gateway: {} requests still unanswered after {STOP_DRAIN_MS} ms; \
                     their orders are not in the saved state",
                    self.router.pending_requests()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut state = self.router.export_state();
        state.positions = self
            .router
            .links_mut()
            .iter()
            .map(|l| l.stream_position())
            .collect();
        let dir = &self.config.gateway.store_dir;
        match recovery::save_state(dir, &state) {
            Ok(()) => eprintln!(
                "gateway: saved {} live and {} finished orders to {} at stream positions {:?}",
                state.live.len(),
                state.finished.len(),
                dir.display(),
                state.positions
            ),
            Err(e) => eprintln!(
                "gateway: cannot save the order state in {}: {e}",
                dir.display()
            ),
        }
    }

    /// Reads what the socket has, at most [`READ_BYTES_PER_TURN`]. Returns true if more may
    /// be waiting (the connection is read again next turn, after the reports are out).
    fn read(&mut self, token: Token, scratch: &mut [u8]) -> bool {
        let mut total = 0usize;
        loop {
            if total >= READ_BYTES_PER_TURN {
                self.stats.read_yields.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            let budget = scratch.len().min(READ_BYTES_PER_TURN - total);
            let scratch = &mut scratch[..budget];
            let Some(conn) = self.conns.get_mut(&token) else {
                return false;
            };
            if conn.closing {
                return false;
            }
            if conn.stream.is_tls() {
                // A read may finish the handshake or need the socket for its answers: let the
                // flush look at it (output held back during the handshake leaves then).
                self.dirty.push(token);
            }
            let n = match conn.stream.read(scratch) {
                Ok(0) => {
                    self.close(token, DisconnectReason::PeerClosed);
                    return false;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    let reason = if e.kind() == ErrorKind::InvalidData {
                        DisconnectReason::TlsError
                    } else {
                        DisconnectReason::IoError
                    };
                    self.close_because(token, reason, e.to_string());
                    return false;
                }
            };
            if self.router.probes_on() {
                self.router.probes_mut().read_t_ns = bourse_monitor::clock::now_ns();
            }
            let kind = conn.kind;
            match kind {
                Kind::Fix => self.on_fix_bytes(token, &scratch[..n]),
                Kind::Binary => self.on_binary_bytes(token, &scratch[..n]),
            }
            total += n;
        }
    }

    // ----- FIX -----

    fn fix_feed(&mut self, slot: usize, bytes: &[u8]) {
        let FixSlot { session, sref, .. } = &mut self.fix[slot];
        let mut app = FixApp {
            router: &mut self.router,
            sref: *sref,
            now_ms: self.now_ms,
            now_ns: self.now_ns,
        };
        session.on_bytes(self.now_ms as i64, bytes, &mut app);
        self.fix_after(slot);
    }

    /// Moves the session's actions to its connection; sends what waited while logged off.
    fn fix_after(&mut self, slot: usize) {
        if self.fix[slot].session.is_logged_on() && !self.fix[slot].offline.is_empty() {
            while let Some(m) = self.fix[slot].offline.pop_front() {
                if self.fix[slot]
                    .session
                    .send_app(self.now_ms as i64, m)
                    .is_err()
                {
                    break;
                }
            }
        }
        while self.fix[slot].session.poll_event().is_some() {}
        while let Some(action) = self.fix[slot].session.poll_action() {
            let token = self.fix[slot].conn;
            match action {
                Action::Send(bytes) => {
                    if let Some(conn) = token.and_then(|t| self.conns.get_mut(&t)) {
                        self.counters.fix_msgs_out += 1;
                        if is_session_reject(&bytes) {
                            self.counters.session_rejects += 1;
                        }
                        conn.out.extend_from_slice(&bytes);
                        self.dirty.push(token.unwrap_or(WAKER));
                    }
                }
                Action::Disconnect { reason } => {
                    if let Some(t) = token {
                        if let Some(conn) = self.conns.get_mut(&t) {
                            conn.closing = true;
                            conn.close_reason = DisconnectReason::of_fix_session_text(&reason);
                            conn.close_detail = Some(reason);
                            self.dirty.push(t);
                        }
                    }
                    self.fix[slot].conn = None;
                }
            }
        }
    }

    /// Sends a rendered report, or keeps a copy of it until the session is logged on.
    fn fix_send(&mut self, slot: usize, m: &OutMessage) {
        let s = &mut self.fix[slot];
        if s.session.is_logged_on() && s.offline.is_empty() {
            if s.session.send_app_ref(self.now_ms as i64, m).is_ok() {
                self.stats.reports_out.fetch_add(1, Ordering::Relaxed);
            }
            self.fix_after(slot);
        } else if s.offline.len() < self.config.gateway.offline_messages_max {
            s.offline.push_back(m.clone());
        }
    }
    // ----- delivery -----

    fn deliver(&mut self) {
        if !self.router.has_reports() {
            return;
        }
        let outbox = self.router.take_outbox();
        let answered = std::mem::take(&mut self.router.probes_mut().answered);
        let mut traced = answered.into_iter().peekable();
        let mut buf = [0u8; FRAME_BYTES_MAX];
        for (index, (sref, report)) in outbox.iter().enumerate() {
            let Some(meta) = self.router.session(*sref) else {
                continue;
            };
            let (proto, firm) = (meta.proto, meta.firm);
            let is_exec = matches!(report, Report::Exec(_) | Report::StatusUnknown { .. });
            let mut exec_id = std::mem::take(&mut self.exec_id);
            if is_exec {
                self.exec_ids += 1;
                self.counters.exec_reports += 1;
                fix_front::exec_id_into(&mut exec_id, &self.exec_id_prefix, self.exec_ids);
            } else {
                exec_id.clear();
            }
            // Traces of requests whose core answer produced nothing for the session (index
            // past the outbox) are recorded as they are; the one answered here follows it.
            let mut trace = None;
            while let Some((i, _)) = traced.peek() {
                if *i > index {
                    break;
                }
                let (i, t) = traced
                    .next()
                    .unwrap_or((index, Trace::new(CommandKind::Admin)));
                if i == index {
                    trace = Some(t);
                } else {
                    self.router.probes_mut().recorder.record(&t);
                }
            }
            let token = match proto {
                Proto::Fix(i) => {
                    let mut m = std::mem::take(&mut self.fix_out);
                    fix_front::render_into(&self.router, report, &exec_id, &mut m);
                    if let Some(t) = trace.as_mut() {
                        t.stamp(Stage::Encoded);
                    }
                    self.fix_send(i, &m);
                    self.fix_out = m;
                    self.fix[i].conn
                }
                Proto::Binary(j) => {
                    // Some reasons depend on the schema version the session established with.
                    let version = self.bin[j]
                        .conn
                        .and_then(|t| self.conns.get(&t))
                        .map_or(oe::SCHEMA_VERSION, |c| c.wire_version);
                    let n = binary_front::render(&self.router, report, version, &mut buf);
                    if let Some(t) = trace.as_mut() {
                        t.stamp(Stage::Encoded);
                    }
                    if n > 0 {
                        self.binary_send(j, &buf[..n]);
                    }
                    self.bin[j].conn
                }
            };
            if let Some(t) = trace {
                match token {
                    Some(token) if self.awaiting_write.len() < TRACES_AWAITING_WRITE_MAX => {
                        self.awaiting_write.push((token, t))
                    }
                    _ => self.router.probes_mut().recorder.record(&t),
                }
            }
            // Status answers concern the asking session alone: no drop copy.
            let copied =
                matches!(report, Report::Exec(r) if !matches!(r.kind, ExecKind::Status(_)));
            if copied {
                let copies: Vec<SessionRef> = self.router.drop_copies_of(firm).to_vec();
                for dc in copies {
                    if dc == *sref {
                        continue;
                    }
                    if let Some(Proto::Fix(i)) = self.router.session(dc).map(|m| m.proto) {
                        let mut m = std::mem::take(&mut self.fix_out);
                        fix_front::render_into(&self.router, report, &exec_id, &mut m);
                        self.counters.exec_reports += 1;
                        self.fix_send(i, &m);
                        self.fix_out = m;
                    }
                }
            }
            self.exec_id = exec_id;
        }
        for (_, t) in traced {
            self.router.probes_mut().recorder.record(&t);
        }
        // Keep the allocation for the next cycle.
        self.router.recycle_outbox(outbox);
    }

    // ----- timers -----

    fn tick(&mut self) {
        let now = self.now_ms;
        for slot in 0..self.fix.len() {
            if self.fix[slot].conn.is_some() {
                let FixSlot { session, sref, .. } = &mut self.fix[slot];
                let mut app = FixApp {
                    router: &mut self.router,
                    sref: *sref,
                    now_ms: now,
                    now_ns: self.now_ns,
                };
                session.on_tick(now as i64, &mut app);
                self.fix_after(slot);
            }
        }
        self.binary_tick(now);
        self.close_stale_prelogon(now);
        let logged_on = self.fix.iter().filter(|s| s.session.is_logged_on()).count();
        let established = self.bin.iter().filter(|s| s.conn.is_some()).count();
        self.stats
            .fix_sessions_logged_on
            .store(logged_on, Ordering::Relaxed);
        self.stats
            .binary_sessions_established
            .store(established, Ordering::Relaxed);
        self.stats
            .orders_tracked
            .store(self.router.tracked_orders(), Ordering::Relaxed);
        let fix_stored: usize = self.fix.iter().map(|s| s.session.stored_bytes()).sum();
        self.stats
            .fix_stored_bytes
            .store(fix_stored, Ordering::Relaxed);
        self.stats
            .finished_orders_bytes
            .store(self.router.finished_orders_bytes(), Ordering::Relaxed);
        self.stats
            .requests_in
            .store(self.router.requests_in(), Ordering::Relaxed);
        self.stats
            .requests_pending
            .store(self.router.pending_requests(), Ordering::Relaxed);
        self.stats
            .connections_open
            .store(self.conns.len(), Ordering::Relaxed);
        self.publish();
        self.router
            .probes_mut()
            .recorder
            .maybe_flush(bourse_monitor::clock::now_ns());
    }

    /// Hands what the loop counted to the monitor (every tick; nothing without a monitor).
    fn publish(&mut self) {
        let Some(m) = self.metrics.as_mut() else {
            return;
        };
        m.publish(&self.counters, self.router.counters());
        let logged_on = self.fix.iter().filter(|s| s.session.is_logged_on()).count();
        let established = self.bin.iter().filter(|s| s.conn.is_some()).count();
        m.fix_sessions.set(logged_on as i64);
        m.binary_sessions.set(established as i64);
        m.connections.set(self.conns.len() as i64);
        m.orders_tracked.set(self.router.tracked_orders() as i64);
        for (core, g) in m.core_queues.iter().enumerate() {
            g.set(self.router.core_in_flight(core) as i64);
        }
        for (link, lm) in self.router.links_mut().iter().zip(&mut m.core_links) {
            if let (Some(lm), Some(now)) = (lm.as_mut(), link.link_counters()) {
                lm.publish(&now);
            }
        }
    }

    // ----- writing and closing -----

    fn flush(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let limit = self.config.gateway.outbound_buffer_max_bytes;
        for token in dirty.drain(..) {
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            let mut failed = conn.stream.flush_tls().is_err();
            while !failed && conn.out_pos < conn.out.len() {
                match conn.stream.write(&conn.out[conn.out_pos..]) {
                    Ok(0) => {
                        failed = true;
                        break;
                    }
                    Ok(n) => conn.out_pos += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            if conn.out_pos == conn.out.len() {
                conn.out.clear();
                conn.out_pos = 0;
            } else if conn.out_pos > conn.out.len() / 2 {
                conn.out.drain(..conn.out_pos);
                conn.out_pos = 0;
            }
            let backlog = conn.out.len() - conn.out_pos;
            if backlog > limit {
                self.stats
                    .slow_consumers_closed
                    .fetch_add(1, Ordering::Relaxed);
                failed = true;
            }
            // A closing connection gets one flush attempt for its last words.
            let reason = if backlog > limit {
                DisconnectReason::SlowConsumer
            } else if failed {
                DisconnectReason::IoError
            } else {
                conn.close_reason
            };
            let drained = backlog == 0;
            if failed || conn.closing {
                self.close(token, reason);
            } else if drained && !self.awaiting_write.is_empty() {
                self.written(token);
            }
        }
        self.dirty = dirty;
    }

    /// Records the traces whose reports were in `token`'s output, now written (t7).
    fn written(&mut self, token: Token) {
        let now = bourse_monitor::clock::now_ns();
        let mut i = 0;
        while i < self.awaiting_write.len() {
            if self.awaiting_write[i].0 == token {
                let (_, mut trace) = self.awaiting_write.swap_remove(i);
                trace.stamp_at(Stage::Written, now);
                self.router.probes_mut().recorder.record(&trace);
            } else {
                i += 1;
            }
        }
    }

    fn close(&mut self, token: Token, reason: DisconnectReason) {
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        self.checks.parked.remove(&token);
        self.counters.disconnects[reason.index()] += 1;
        self.prelogon.remove(admission::id_of(token));
        self.log_close(&conn, token, reason);
        self.awaiting_write.retain(|(t, _)| *t != token);
        if let Transport::Tls(_, tls) = &mut conn.stream {
            tls.send_close_notify();
            let _ = conn.stream.flush_tls();
        }
        let _ = self.poll.registry().deregister(conn.stream.tcp());
        let _ = conn.stream.tcp().shutdown(std::net::Shutdown::Both);
        if let Some(slot) = conn.attached {
            match conn.kind {
                Kind::Fix => {
                    if self.fix[slot].conn == Some(token) {
                        self.fix[slot].conn = None;
                        let FixSlot { session, sref, .. } = &mut self.fix[slot];
                        let mut app = FixApp {
                            router: &mut self.router,
                            sref: *sref,
                            now_ms: self.now_ms,
                            now_ns: self.now_ns,
                        };
                        session.on_disconnect(self.now_ms as i64, &mut app);
                        while session.poll_action().is_some() {}
                    }
                }
                Kind::Binary => {
                    if self.bin[slot].conn == Some(token) {
                        self.bin[slot].conn = None;
                    }
                }
            }
        }
        self.stats
            .connections_open
            .store(self.conns.len(), Ordering::Relaxed);
    }
}
