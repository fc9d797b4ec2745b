//! The access server: one event-loop thread (mio) owns every socket, every FIX and binary
//! session and the [`Router`]; the core runs behind a [`CoreLink`]. The loop reads the clock
//! once per cycle, reads sockets, drains the core's outputs, delivers reports, and flushes
//! what it wrote, so a burst of requests costs one write per connection (smart batching).
//!
//! Monitoring: the loop counts in plain integers ([`LoopCounters`], [`RouterCounters`]) and
//! publishes them to the monitor's counters on its 20 ms timer, so a message costs an add and
//! no atomic operation; sampled requests carry a [`bourse_monitor::Trace`] stamped at t0
//! (socket read), t1 (decoded), t2 (handed to the core), t5 (core's answer received), t6
//! (report encoded) and t7 (written), recorded by the loop's own lock-free
//! [`bourse_monitor::StageRecorder`].

use crate::binary_front;
use crate::config::GatewayConfig;
use crate::fix_front::{self, FixApp};
use crate::recovery;
use crate::router::{
    ClientId, ExecKind, GatewayReject, NewOrderRequest, Proto, RejectCause, Report, Router,
    RouterCounters, SessionRef,
};
use crate::store::GatewayStore;
use bourse_core::link::CoreLink;
use bourse_core::*;
use bourse_fix::codec::FrameBuffer;
use bourse_fix::session::{Action, Role, Session, SessionConfig};
use bourse_fix::{Dictionary, OutMessage};
use bourse_monitor::{Counter, DashboardServer, Gauge, Monitor, MonitorConfig, Stage, Trace};
use bourse_wire::frame::encode_frame;
use bourse_wire::order_entry::codec::{
    establishment_ack_codec::EstablishmentAckEncoder,
    establishment_reject_code::EstablishmentRejectCode,
    establishment_reject_codec::EstablishmentRejectEncoder, ord_type::OrdType as BinOrdType,
    retransmission_codec::RetransmissionEncoder, sequence_codec::SequenceEncoder,
    side::Side as BinSide, terminate_codec::TerminateEncoder, termination_code::TerminationCode,
    time_in_force::TimeInForce as BinTif,
};
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
const FIRST_CONN: usize = 3;

/// Bytes read from one connection per readiness event before others get their turn.
const READ_BYTES_PER_EVENT_MAX: usize = 1 << 20;
/// Core outputs handled per loop cycle before sockets get their turn.
const CORE_OUTPUTS_PER_CYCLE_MAX: usize = 65_536;
/// How often session timers run.
const TICK_INTERVAL_MS: u64 = 20;
/// Connections accepted per readiness event of a listener.
const ACCEPTS_PER_EVENT_MAX: usize = 1_024;

/// Why the gateway closed a connection (the `reason` label of the disconnect counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DisconnectReason {
    /// The client closed its end.
    PeerClosed,
    /// A read or write failed.
    IoError,
    /// Its unsent output passed `outbound_buffer_max_bytes`.
    SlowConsumer,
    /// It did not log on (establish) within `logon_timeout_ms`.
    LogonTimeout,
    /// Its first message was not a valid Logon (Establish) for a configured session.
    LogonRefused,
    /// The FIX session ended it (Logout, or a session-level fault such as a bad sequence).
    FixSession,
    /// The binary session was terminated (by the client or by the gateway, with a code).
    BinaryTerminate,
    /// Accepted past `connections_max` and closed at once.
    ConnectionsMax,
    /// The gateway is stopping.
    Shutdown,
}

impl DisconnectReason {
    pub const ALL: [DisconnectReason; 9] = [
        DisconnectReason::PeerClosed,
        DisconnectReason::IoError,
        DisconnectReason::SlowConsumer,
        DisconnectReason::LogonTimeout,
        DisconnectReason::LogonRefused,
        DisconnectReason::FixSession,
        DisconnectReason::BinaryTerminate,
        DisconnectReason::ConnectionsMax,
        DisconnectReason::Shutdown,
    ];
    pub fn name(self) -> &'static str {
        match self {
            DisconnectReason::PeerClosed => "peer_closed",
            DisconnectReason::IoError => "io_error",
            DisconnectReason::SlowConsumer => "slow_consumer",
            DisconnectReason::LogonTimeout => "logon_timeout",
            DisconnectReason::LogonRefused => "logon_refused",
            DisconnectReason::FixSession => "fix_session",
            DisconnectReason::BinaryTerminate => "binary_terminate",
            DisconnectReason::ConnectionsMax => "connections_max",
            DisconnectReason::Shutdown => "shutdown",
        }
    }
}

/// What the event loop counts itself, in plain integers (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopCounters {
    /// Messages written, by protocol (FIX includes session-level messages).
    pub fix_msgs_out: u64,
    pub binary_msgs_out: u64,
    /// Binary application messages received (requests, throttled ones included; the FIX
    /// count is the router's, see [`RouterCounters::fix_requests_in`]).
    pub binary_msgs_in: u64,
    /// Execution reports sent (drop copies included) and status reports among them.
    pub exec_reports: u64,
    /// FIX session-level Rejects (35=3) sent.
    pub session_rejects: u64,
    pub disconnects: [u64; DisconnectReason::ALL.len()],
}

/// Metric names of the gateway (the monitor's [`bourse_monitor::names`] has the shared ones).
pub mod metric_names {
    pub const MESSAGES_TOTAL: &str = "bourse_gateway_messages_total";
    pub const REQUESTS_TOTAL: &str = "bourse_gateway_requests_total";
    pub const EXEC_REPORTS_TOTAL: &str = "bourse_gateway_execution_reports_total";
    pub const REJECTS_TOTAL: &str = "bourse_gateway_rejects_total";
    pub const DISCONNECTS_TOTAL: &str = "bourse_gateway_disconnects_total";
    pub const CONNECTIONS: &str = "bourse_gateway_connections";
    pub const ORDERS_TRACKED: &str = "bourse_gateway_orders_tracked";
}

/// The monitor's handles for everything the loop publishes, and what was published last.
struct GatewayMetrics {
    fix_in: Counter,
    fix_out: Counter,
    binary_in: Counter,
    binary_out: Counter,
    new_orders: Counter,
    cancels: Counter,
    replaces: Counter,
    mass_cancels: Counter,
    status_requests: Counter,
    exec_reports: Counter,
    busy_rejects: Counter,
    gateway_rejects: Counter,
    core_rejects: Counter,
    session_rejects: Counter,
    fix_throttle: Counter,
    binary_throttle: Counter,
    disconnects: Vec<Counter>,
    fix_sessions: Gauge,
    binary_sessions: Gauge,
    connections: Gauge,
    orders_tracked: Gauge,
    core_queues: Vec<Gauge>,
    last_loop: LoopCounters,
    last_router: RouterCounters,
}

impl GatewayMetrics {
    fn new(monitor: &Monitor, core_names: &[String]) -> GatewayMetrics {
        use metric_names::*;
        let r = monitor.registry();
        let msgs = |proto: &str, dir: &str| {
            r.counter(
                MESSAGES_TOTAL,
                "Messages through the gateway by protocol and direction (in: application requests; out: every message written).",
                &[("protocol", proto), ("direction", dir)],
            )
        };
        let req = |kind: &str| {
            r.counter(
                REQUESTS_TOTAL,
                "Requests by kind, whatever their outcome.",
                &[("kind", kind)],
            )
        };
        let rej = |cause: &str| {
            r.counter(
                REJECTS_TOTAL,
                "Requests refused, by cause (busy: a core queue or the order table was full).",
                &[("cause", cause)],
            )
        };
        let fix = monitor.sessions("fix");
        let sbe = monitor.sessions("sbe");
        GatewayMetrics {
            fix_in: msgs("fix", "in"),
            fix_out: msgs("fix", "out"),
            binary_in: msgs("sbe", "in"),
            binary_out: msgs("sbe", "out"),
            new_orders: req("new_order"),
            cancels: req("cancel"),
            replaces: req("replace"),
            mass_cancels: req("mass_cancel"),
            status_requests: req("status"),
            exec_reports: r.counter(
                EXEC_REPORTS_TOTAL,
                "Execution reports sent, drop copies included.",
                &[],
            ),
            busy_rejects: rej("busy"),
            gateway_rejects: rej("gateway"),
            core_rejects: rej("core"),
            session_rejects: rej("fix_session_reject"),
            fix_throttle: fix.throttle_rejects,
            binary_throttle: sbe.throttle_rejects,
            disconnects: DisconnectReason::ALL
                .iter()
                .map(|d| {
                    r.counter(
                        DISCONNECTS_TOTAL,
                        "Connections the gateway closed, by reason.",
                        &[("reason", d.name())],
                    )
                })
                .collect(),
            fix_sessions: fix.active,
            binary_sessions: sbe.active,
            connections: r.gauge(CONNECTIONS, "Open TCP connections, both protocols.", &[]),
            orders_tracked: r.gauge(
                ORDERS_TRACKED,
                "Live orders the gateway tracks for its sessions.",
                &[],
            ),
            core_queues: core_names
                .iter()
                .map(|n| monitor.queue_depth(&format!("gateway_to_core_{n}")))
                .collect(),
            last_loop: LoopCounters::default(),
            last_router: RouterCounters::default(),
        }
    }

    /// Adds what was counted since the last call.
    fn publish(&mut self, l: &LoopCounters, rc: &RouterCounters) {
        let d = |now: u64, last: u64| now.saturating_sub(last);
        let (pl, pr) = (self.last_loop, self.last_router);
        self.fix_in.add(d(rc.fix_requests_in, pr.fix_requests_in));
        self.fix_out.add(d(l.fix_msgs_out, pl.fix_msgs_out));
        self.binary_in.add(d(l.binary_msgs_in, pl.binary_msgs_in));
        self.binary_out
            .add(d(l.binary_msgs_out, pl.binary_msgs_out));
        self.exec_reports.add(d(l.exec_reports, pl.exec_reports));
        self.session_rejects
            .add(d(l.session_rejects, pl.session_rejects));
        for (i, c) in self.disconnects.iter().enumerate() {
            c.add(d(l.disconnects[i], pl.disconnects[i]));
        }
        self.new_orders.add(d(rc.new_orders, pr.new_orders));
        self.cancels.add(d(rc.cancels, pr.cancels));
        self.replaces.add(d(rc.replaces, pr.replaces));
        self.mass_cancels.add(d(rc.mass_cancels, pr.mass_cancels));
        self.status_requests
            .add(d(rc.status_requests, pr.status_requests));
        self.busy_rejects.add(d(rc.busy_rejects, pr.busy_rejects));
        self.gateway_rejects
            .add(d(rc.gateway_rejects, pr.gateway_rejects));
        self.core_rejects.add(d(rc.core_rejects, pr.core_rejects));
        self.fix_throttle
            .add(d(rc.fix_throttle_rejects, pr.fix_throttle_rejects));
        self.binary_throttle
            .add(d(rc.binary_throttle_rejects, pr.binary_throttle_rejects));
        self.last_loop = *l;
        self.last_router = *rc;
    }
}

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
    pub requests_pending: AtomicUsize,
}

/// A running gateway (see [`spawn`]).
pub struct GatewayHandle {
    fix_addr: Option<SocketAddr>,
    binary_addr: Option<SocketAddr>,
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

fn now_ns() -> u64 {
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
        let store = GatewayStore::open(
            &dir,
            config.gateway.stored_messages_max,
            config.gateway.store_sync,
        )
        .map_err(|e| format!("FIX store {}: {e}", dir.display()))?;
        fix.push(FixSlot {
            session: Session::new(sc, Arc::clone(&dictionary), Box::new(store)),
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
        .map(|(j, s)| BinSlot {
            sref: SessionRef((fix_count + j) as u32),
            credentials: s.credentials.clone(),
            conn: None,
            next_seq: 1,
            sent: VecDeque::new(),
            first_kept_seq: 1,
            keepalive_ms: 1_000,
            last_recv_ms: 0,
            last_sent_ms: 0,
        })
        .collect();
    let mut router = Router::new(&config, links);
    // Before bootstrap: its polling may already hand over outputs the restored orders own.
    restore_order_state(&mut router, &config.gateway.store_dir)?;
    bootstrap(&mut router, &config)?;
    let metrics = monitor.as_ref().map(|m| {
        let names: Vec<String> = plan.iter().map(|c| c.name.clone()).collect();
        GatewayMetrics::new(m, &names)
    });
    if let Some(m) = &monitor {
        if m.probes().sample_every() > 0 {
            router.probes.recorder = m.probes().recorder();
            router.probes_on = true;
        }
    }
    let stats = Arc::new(GatewayStats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut server = Server {
        poll,
        fix_listener,
        binary_listener,
        conns: HashMap::new(),
        next_token: FIRST_CONN,
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
        dictionary,
        counters: LoopCounters::default(),
        metrics,
        awaiting_write: Vec::new(),
    };
    let stop_loop = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("bourse-gateway".into())
        .spawn(move || server.run(&stop_loop))
        .map_err(|e| e.to_string())?;
    Ok(GatewayHandle {
        fix_addr,
        binary_addr,
        stats,
        stop,
        waker,
        thread: Some(thread),
        monitor,
        dashboard,
    })
}

/// Loads the order state a previous run saved (`crate::recovery`) if every link resumes its
/// core's stream exactly where the state is exact; a state that does not match the links
/// (cores in process, or links started elsewhere) is set aside with a warning, since events
/// it has not seen are gone for it.
fn restore_order_state(router: &mut Router, dir: &std::path::Path) -> Result<(), String> {
    let Some(mut state) = recovery::read_state(dir)? else {
        return Ok(());
    };
    let positions: Vec<Option<u64>> = router
        .links_mut()
        .iter()
        .map(|l| l.stream_position())
        .collect();
    let matches = positions.iter().all(Option::is_some) && positions == state.positions;
    recovery::consume_state(dir).map_err(|e| format!("order state in {}: {e}", dir.display()))?;
    if !matches {
        eprintln!(
            "gateway: the saved order state (stream positions {:?}) does not match the links \
             ({positions:?}); starting without it",
            state.positions
        );
        return Ok(());
    }
    let (live, finished) = (state.live.len(), state.finished.len());
    state.positions.clear();
    let dropped = router.import_state(state);
    eprintln!(
        "gateway: restored {live} live and {finished} finished orders from {}{}",
        dir.display(),
        if dropped > 0 {
            format!(" ({dropped} of sessions no longer configured dropped)")
        } else {
            String::new()
        }
    );
    Ok(())
}

/// How long a stopping gateway waits for its requests in flight to be answered before it
/// saves its order state.
const STOP_DRAIN_MS: u64 = 5_000;

/// How long bootstrap waits for a core's answers (a replicated core may be electing a leader).
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(30);

/// Submits `commands` (core, command) and waits for every answer; returns them in order, with
/// whether each command's events included an AccountAdded.
fn admin_round(
    router: &mut Router,
    commands: Vec<(usize, Command)>,
) -> Result<Vec<(Option<RejectReason>, bool)>, String> {
    let deadline = std::time::Instant::now() + BOOTSTRAP_TIMEOUT;
    router.admin_done.clear();
    router.admin_accounts_added.clear();
    let mut keys = Vec::with_capacity(commands.len());
    for (core, cmd) in commands {
        loop {
            match router.submit_admin(core, cmd.clone()) {
                Ok(key) => {
                    keys.push(key);
                    break;
                }
                Err(bourse_core::link::SubmitError::Closed) => {
                    return Err(format!("core {core} closed during bootstrap"))
                }
                Err(bourse_core::link::SubmitError::Full) => {
                    router.poll_core(usize::MAX);
                    if std::time::Instant::now() > deadline {
                        return Err(format!("core {core} did not take the bootstrap commands"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    while router.admin_done.len() < keys.len() {
        if router.poll_core(usize::MAX) == 0 {
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "the cores answered {} of {} bootstrap commands within {} s",
                    router.admin_done.len(),
                    keys.len(),
                    BOOTSTRAP_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let done: HashMap<_, _> = router.admin_done.drain(..).collect();
    let added: std::collections::HashSet<_> = router.admin_accounts_added.drain(..).collect();
    Ok(keys
        .iter()
        .map(|k| (done.get(k).copied().flatten(), added.contains(k)))
        .collect())
}

/// Creates the config's instruments in the cores that own them and every account in every
/// core that bootstraps, then deposits each account's cash where the account was new.
/// Idempotent: an instrument or account the core already has (a replicated core after a
/// gateway restart) is fine and its cash is not deposited again.
pub fn bootstrap(router: &mut Router, config: &GatewayConfig) -> Result<(), String> {
    let plan = config.core_plan();
    let ts = now_ns();
    let mut round = Vec::new();
    let mut what = Vec::new();
    for (core, entry) in plan.iter().enumerate() {
        if !entry.bootstraps(config.core.bootstrap) {
            continue;
        }
        for i in config
            .instruments
            .iter()
            .filter(|i| entry.instruments.contains(&i.instrument))
        {
            round.push((
                core,
                Command::new(ts, CommandBody::AddInstrument(i.clone())),
            ));
            what.push((core, format!("instrument {}", i.symbol), None));
        }
        for a in &config.accounts {
            round.push((
                core,
                Command::new(
                    ts,
                    CommandBody::AddAccount(AccountSpec {
                        account: a.account,
                        firm: a.firm,
                        may_short: a.may_short,
                        stp: StpMode::None,
                        stp_scope: StpScope::Account,
                    }),
                ),
            ));
            what.push((core, format!("account {}", a.account.0), Some(a)));
        }
    }
    if round.is_empty() {
        return Ok(());
    }
    let answers = admin_round(router, round)?;
    let mut deposits = Vec::new();
    for ((core, name, account), (reject, added)) in what.into_iter().zip(answers) {
        let core_name = &plan[core].name;
        match reject {
            None
            | Some(RejectReason::DuplicateInstrument)
            | Some(RejectReason::DuplicateAccount) => {}
            Some(r) => {
                return Err(format!(
                    "bootstrap of core {core_name}: {name} refused: {r:?}"
                ))
            }
        }
        if let Some(a) = account {
            if added && a.cash > 0 {
                deposits.push((
                    core,
                    Command::new(
                        ts,
                        CommandBody::Deposit {
                            account: a.account,
                            amount: Cash(i128::from(a.cash)),
                        },
                    ),
                ));
            }
        }
    }
    if deposits.is_empty() {
        return Ok(());
    }
    let n = deposits.len();
    let answers = admin_round(router, deposits)?;
    if let Some(r) = answers.iter().find_map(|(r, _)| *r) {
        return Err(format!(
            "bootstrap: a deposit was refused: {r:?} ({n} deposits)"
        ));
    }
    Ok(())
}

struct FixSlot {
    session: Session,
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
    stream: TcpStream,
    kind: Kind,
    out: Vec<u8>,
    out_pos: usize,
    opened_ms: u64,
    /// The FIX or binary slot this connection logged on to.
    attached: Option<usize>,
    /// FIX: frames before logon; binary: bytes of an incomplete frame.
    prelogon: Option<FrameBuffer>,
    inbuf: Vec<u8>,
    closing: bool,
    /// Why it is closing (counted when it is closed).
    close_reason: DisconnectReason,
}

struct Server {
    poll: Poll,
    fix_listener: Option<TcpListener>,
    binary_listener: Option<TcpListener>,
    conns: HashMap<Token, Conn>,
    next_token: usize,
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
    #[allow(dead_code)]
    dictionary: Arc<Dictionary>,
    counters: LoopCounters,
    metrics: Option<GatewayMetrics>,
    /// Sampled traces whose report is in a connection's output, waiting for the write (t7).
    awaiting_write: Vec<(Token, Trace)>,
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

impl Server {
    fn run(&mut self, stop: &AtomicBool) {
        let mut events = Events::with_capacity(1024);
        let mut last_tick_ms = 0u64;
        let mut again: Vec<Token> = Vec::new();
        let mut scratch = vec![0u8; 64 * 1024];
        while !stop.load(Ordering::SeqCst) {
            let timeout = if again.is_empty() {
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
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    FIX_LISTENER => self.accept(Kind::Fix),
                    BINARY_LISTENER => self.accept(Kind::Binary),
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
        self.router.probes.recorder.flush();
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

    fn accept(&mut self, kind: Kind) {
        for _ in 0..ACCEPTS_PER_EVENT_MAX {
            let listener = match kind {
                Kind::Fix => self.fix_listener.as_ref(),
                Kind::Binary => self.binary_listener.as_ref(),
            };
            let Some(listener) = listener else { return };
            match listener.accept() {
                Ok((mut stream, _peer)) => {
                    self.stats
                        .connections_accepted
                        .fetch_add(1, Ordering::Relaxed);
                    if self.conns.len() >= self.config.gateway.connections_max {
                        self.counters.disconnects[DisconnectReason::ConnectionsMax as usize] += 1;
                        self.stats
                            .connections_refused
                            .fetch_add(1, Ordering::Relaxed);
                        drop(stream);
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let token = Token(self.next_token);
                    self.next_token += 1;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
                        .is_err()
                    {
                        continue;
                    }
                    let prelogon = match kind {
                        Kind::Fix => Some(FrameBuffer::new(
                            self.config.gateway.fix_message_size_max_bytes,
                        )),
                        Kind::Binary => None,
                    };
                    self.conns.insert(
                        token,
                        Conn {
                            stream,
                            kind,
                            out: Vec::new(),
                            out_pos: 0,
                            opened_ms: self.now_ms,
                            attached: None,
                            prelogon,
                            inbuf: Vec::new(),
                            closing: false,
                            close_reason: DisconnectReason::PeerClosed,
                        },
                    );
                    self.stats
                        .connections_open
                        .store(self.conns.len(), Ordering::Relaxed);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => return,
            }
        }
    }

    /// Reads what the socket has (bounded). Returns true if more may be waiting.
    fn read(&mut self, token: Token, scratch: &mut [u8]) -> bool {
        let mut total = 0usize;
        loop {
            let Some(conn) = self.conns.get_mut(&token) else {
                return false;
            };
            if conn.closing {
                return false;
            }
            let n = match conn.stream.read(scratch) {
                Ok(0) => {
                    self.close(token, DisconnectReason::PeerClosed);
                    return false;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.close(token, DisconnectReason::IoError);
                    return false;
                }
            };
            if self.router.probes_on {
                self.router.probes.read_t_ns = bourse_monitor::clock::now_ns();
            }
            let kind = conn.kind;
            match kind {
                Kind::Fix => self.on_fix_bytes(token, &scratch[..n]),
                Kind::Binary => self.on_binary_bytes(token, &scratch[..n]),
            }
            total += n;
            if total >= READ_BYTES_PER_EVENT_MAX {
                return true;
            }
        }
    }

    // ----- FIX -----

    fn on_fix_bytes(&mut self, token: Token, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(slot) = conn.attached {
            self.fix_feed(slot, bytes);
            return;
        }
        let Some(frames) = conn.prelogon.as_mut() else {
            return;
        };
        frames.push(bytes);
        let frame = match frames.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(_) => return self.close(token, DisconnectReason::LogonRefused),
        };
        let rest = frames.take_bytes();
        // The first message must be a Logon for a configured session with our BeginString;
        // anything else is closed without a word, as a FIX acceptor does.
        let Ok(raw) =
            bourse_fix::decode(&frame, None, self.config.gateway.fix_message_size_max_bytes)
        else {
            return self.close(token, DisconnectReason::LogonRefused);
        };
        if raw.begin_string() != b"FIX.4.4" || raw.msg_type() != b"A" {
            return self.close(token, DisconnectReason::LogonRefused);
        }
        let (Some(sender), Some(target)) = (raw.get_str(49), raw.get_str(56)) else {
            return self.close(token, DisconnectReason::LogonRefused);
        };
        let Some(slot) = self
            .fix
            .iter()
            .position(|s| s.client_comp_id == sender && s.gateway_comp_id == target)
        else {
            return self.close(token, DisconnectReason::LogonRefused);
        };
        if self.fix[slot].conn.is_some() {
            return self.close(token, DisconnectReason::LogonRefused);
        }
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.attached = Some(slot);
            conn.prelogon = None;
        }
        self.fix[slot].conn = Some(token);
        self.fix[slot].session.on_connect(self.now_ms as i64);
        let mut all = frame;
        all.extend_from_slice(&rest);
        self.fix_feed(slot, &all);
    }

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
                Action::Disconnect { .. } => {
                    if let Some(t) = token {
                        if let Some(conn) = self.conns.get_mut(&t) {
                            conn.closing = true;
                            conn.close_reason = DisconnectReason::FixSession;
                            conn.attached = None;
                            self.dirty.push(t);
                        }
                    }
                    self.fix[slot].conn = None;
                }
            }
        }
    }

    fn fix_send(&mut self, slot: usize, m: OutMessage) {
        let s = &mut self.fix[slot];
        if s.session.is_logged_on() && s.offline.is_empty() {
            if s.session.send_app(self.now_ms as i64, m).is_ok() {
                self.stats.reports_out.fetch_add(1, Ordering::Relaxed);
            }
            self.fix_after(slot);
        } else if s.offline.len() < self.config.gateway.offline_messages_max {
            s.offline.push_back(m);
        }
    }

    // ----- binary -----

    fn on_binary_bytes(&mut self, token: Token, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.inbuf.extend_from_slice(bytes);
        let decoder = FrameDecoder::default();
        let mut pos = 0usize;
        let buf = std::mem::take(&mut conn.inbuf);
        loop {
            match decoder.decode(&buf[pos..]) {
                Ok(Some(d)) => {
                    pos += d.frame_bytes;
                    self.on_binary_message(token, d.message);
                    match self.conns.get(&token) {
                        Some(c) if !c.closing => {}
                        _ => return,
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    self.binary_terminate(token, TerminationCode::InvalidFrame);
                    return;
                }
            }
        }
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.inbuf = buf;
            conn.inbuf.drain(..pos);
        }
    }

    /// Queues a binary frame for a connection.
    fn write_to(&mut self, token: Token, frame: &[u8]) {
        if let Some(conn) = self.conns.get_mut(&token) {
            self.counters.binary_msgs_out += 1;
            conn.out.extend_from_slice(frame);
            self.dirty.push(token);
        }
    }

    fn binary_terminate(&mut self, token: Token, code: TerminationCode) {
        let mut buf = [0u8; FRAME_BYTES_MAX];
        if let Ok(n) = encode_frame(&mut buf, |mut e: TerminateEncoder| {
            e.reason(code);
            e
        }) {
            self.write_to(token, &buf[..n]);
        }
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.closing = true;
            conn.close_reason = DisconnectReason::BinaryTerminate;
            if let Some(j) = conn.attached.take() {
                self.bin[j].conn = None;
            }
        }
    }

    fn binary_establish(
        &mut self,
        token: Token,
        ts: u64,
        keepalive_ms: u32,
        credentials: [u8; 32],
    ) {
        let mut buf = [0u8; FRAME_BYTES_MAX];
        let creds = bourse_wire::ascii_field(&credentials).unwrap_or("");
        let slot = self.bin.iter().position(|s| s.credentials == creds);
        let code = match slot {
            None => Some(EstablishmentRejectCode::BadCredentials),
            Some(j) if self.bin[j].conn.is_some() => {
                Some(EstablishmentRejectCode::AlreadyEstablished)
            }
            _ if !(oe::KEEPALIVE_INTERVAL_MS_MIN..=oe::KEEPALIVE_INTERVAL_MS_MAX)
                .contains(&keepalive_ms) =>
            {
                Some(EstablishmentRejectCode::KeepaliveOutOfRange)
            }
            _ => None,
        };
        if let Some(code) = code {
            if let Ok(n) = encode_frame(&mut buf, |mut e: EstablishmentRejectEncoder| {
                e.request_timestamp_ns(ts).reason(code);
                e
            }) {
                self.write_to(token, &buf[..n]);
            }
            if let Some(c) = self.conns.get_mut(&token) {
                c.closing = true;
                c.close_reason = DisconnectReason::LogonRefused;
            }
            return;
        }
        let Some(j) = slot else { return };
        let s = &mut self.bin[j];
        s.conn = Some(token);
        s.keepalive_ms = keepalive_ms;
        s.last_recv_ms = self.now_ms;
        s.last_sent_ms = self.now_ms;
        let next = s.next_seq;
        if let Some(c) = self.conns.get_mut(&token) {
            c.attached = Some(j);
        }
        if let Ok(n) = encode_frame(&mut buf, |mut e: EstablishmentAckEncoder| {
            e.request_timestamp_ns(ts)
                .next_seq_no(next)
                .keepalive_interval_ms(keepalive_ms);
            e
        }) {
            self.write_to(token, &buf[..n]);
        }
    }

    fn on_binary_message(&mut self, token: Token, message: Message<'_>) {
        let attached = self.conns.get(&token).and_then(|c| c.attached);
        let Some(j) = attached else {
            match message {
                Message::Establish(m) => self.binary_establish(
                    token,
                    m.timestamp_ns(),
                    m.keepalive_interval_ms(),
                    m.credentials(),
                ),
                _ => self.binary_terminate(token, TerminationCode::NotEstablished),
            }
            return;
        };
        self.bin[j].last_recv_ms = self.now_ms;
        let sref = self.bin[j].sref;
        let template = message.template_id() as u16;
        if message.template_id().is_client_request() {
            self.router.requests_in += 1;
            self.counters.binary_msgs_in += 1;
            if self.router.probes_on {
                let kind = match message {
                    Message::NewOrder(_) => Some(CommandKind::NewOrder),
                    Message::CancelOrder(_) => Some(CommandKind::Cancel),
                    Message::ReplaceOrder(_) => Some(CommandKind::Replace),
                    Message::MassCancel(_) => Some(CommandKind::MassCancel),
                    _ => None,
                };
                if let Some(kind) = kind {
                    self.router.probes.begin(kind);
                }
            }
            let meta = &mut self.router.sessions[sref.0 as usize];
            if let Err(retry_ms) = meta.throttle.take(self.now_ms) {
                let ref_id = match message {
                    Message::NewOrder(m) => Some(m.cl_ord_id()),
                    Message::CancelOrder(m) => Some(m.cl_ord_id()),
                    Message::ReplaceOrder(m) => Some(m.cl_ord_id()),
                    Message::MassCancel(m) => Some(m.cl_ord_id()),
                    _ => None,
                };
                let report = Report::BusinessReject {
                    ref_msg_type: String::new(),
                    ref_seq_num: 0,
                    ref_id: ref_id.map(ClientId::Num),
                    ref_template_id: template,
                    throttled_retry_ms: Some(retry_ms),
                    text: format!(
                        "throttle: more than {} messages/s",
                        meta.throttle.msgs_per_s()
                    ),
                    ts_ns: self.now_ns,
                };
                self.router.business_reject(sref, report);
                return;
            }
        }
        let ts = self.now_ns;
        match message {
            Message::Sequence(_) => {}
            Message::Terminate(_) => self.binary_terminate(token, TerminationCode::Finished),
            Message::RetransmitRequest(m) => {
                self.binary_retransmit(token, j, m.timestamp_ns(), m.from_seq_no(), m.count())
            }
            Message::Establish(_) => self.binary_terminate(token, TerminationCode::Unspecified),
            Message::NewOrder(m) => {
                let instrument = InstrumentId(m.instrument_id());
                let info = self.router.instrument(instrument).cloned();
                let side = match m.side() {
                    BinSide::Buy => Some(Side::Buy),
                    BinSide::Sell => Some(Side::Sell),
                    _ => None,
                };
                let ord_type = match m.ord_type() {
                    BinOrdType::Limit => Some(OrdType::Limit),
                    BinOrdType::Market => Some(OrdType::Market),
                    _ => None,
                };
                let tif = match m.time_in_force() {
                    BinTif::Day => Some(TimeInForce::Day),
                    BinTif::GoodTillCancel => Some(TimeInForce::Gtc),
                    BinTif::ImmediateOrCancel => Some(TimeInForce::Ioc),
                    BinTif::FillOrKill => Some(TimeInForce::Fok),
                    BinTif::GoodTillDate => Some(TimeInForce::Gtd),
                    _ => None,
                };
                let mut req = NewOrderRequest {
                    client: ClientId::Num(m.cl_ord_id()),
                    account: Some(AccountId(m.account())),
                    instrument,
                    side: side.unwrap_or(Side::Buy),
                    ord_type: ord_type.unwrap_or(OrdType::Limit),
                    price: Price(m.price().unwrap_or(0)),
                    qty_lots: 0,
                    tif: tif.unwrap_or(TimeInForce::Day),
                    expire_ts_ns: m.expire_time_ns().unwrap_or(0),
                    display_lots: 0,
                };
                let cause = if info.is_none() {
                    Some(GatewayReject::UnknownSymbol)
                } else if side.is_none() || ord_type.is_none() || tif.is_none() {
                    Some(GatewayReject::UnsupportedValue)
                } else {
                    None
                };
                if let Some(info) = &info {
                    req.qty_lots = info.lots(m.qty()).unwrap_or(0);
                    if let Some(d) = m.display_qty() {
                        req.display_lots = info.lots(d).unwrap_or(-1);
                    }
                }
                let cause = cause.or(if req.qty_lots <= 0 || req.display_lots < 0 {
                    Some(GatewayReject::InvalidQty)
                } else if req.ord_type == OrdType::Limit && m.price().is_none() {
                    Some(GatewayReject::InvalidPrice)
                } else {
                    None
                });
                match cause {
                    Some(g) => self
                        .router
                        .reject_new(sref, &req, RejectCause::Gateway(g), ts),
                    None => self.router.new_order(sref, req, ts),
                }
            }
            Message::CancelOrder(m) => {
                let orig = ClientId::Num(m.orig_cl_ord_id().unwrap_or(u64::MAX));
                self.router.cancel(
                    sref,
                    ClientId::Num(m.cl_ord_id()),
                    orig,
                    m.order_id().map(OrderId),
                    ts,
                );
            }
            Message::ReplaceOrder(m) => {
                let orig = ClientId::Num(m.orig_cl_ord_id().unwrap_or(u64::MAX));
                let lots = self
                    .router
                    .instrument(InstrumentId(m.instrument_id()))
                    .and_then(|i| i.lots(m.qty()));
                let client = ClientId::Num(m.cl_ord_id());
                match lots {
                    Some(lots) => self.router.replace(
                        sref,
                        client,
                        orig,
                        m.order_id().map(OrderId),
                        Some(Price(m.price())),
                        Some(lots),
                        ts,
                    ),
                    None => self.router.outbox.push((
                        sref,
                        Report::CancelReject {
                            client,
                            orig,
                            order_id: m.order_id().map(OrderId),
                            to: CancelRejectTo::Replace,
                            cause: RejectCause::Gateway(GatewayReject::InvalidQty),
                            ts_ns: ts,
                        },
                    )),
                }
            }
            Message::MassCancel(m) => {
                let side = match m.side() {
                    BinSide::Buy => Some(Side::Buy),
                    BinSide::Sell => Some(Side::Sell),
                    _ => None,
                };
                self.router.mass_cancel(
                    sref,
                    ClientId::Num(m.cl_ord_id()),
                    b'7',
                    m.account().map(AccountId),
                    m.instrument_id().map(InstrumentId),
                    side,
                    ts,
                );
            }
            _ => {
                let report = Report::BusinessReject {
                    ref_msg_type: String::new(),
                    ref_seq_num: 0,
                    ref_id: None,
                    ref_template_id: template,
                    throttled_retry_ms: None,
                    text: "unsupported message from a client".into(),
                    ts_ns: ts,
                };
                self.router.business_reject(sref, report);
            }
        }
    }

    fn binary_retransmit(&mut self, token: Token, j: usize, ts: u64, from: u64, count: u32) {
        let s = &self.bin[j];
        if count == 0 || count > oe::RETRANSMIT_COUNT_MAX || from < s.first_kept_seq || from == 0 {
            return self.binary_terminate(token, TerminationCode::RetransmitLimitExceeded);
        }
        let end = from.saturating_add(u64::from(count)).min(s.next_seq);
        let n = end.saturating_sub(from);
        let mut buf = [0u8; FRAME_BYTES_MAX];
        if let Ok(len) = encode_frame(&mut buf, |mut e: RetransmissionEncoder| {
            e.request_timestamp_ns(ts).next_seq_no(from).count(n as u32);
            e
        }) {
            self.write_to(token, &buf[..len]);
        }
        for seq in from..end {
            let idx = (seq - self.bin[j].first_kept_seq) as usize;
            if let Some(frame) = self.bin[j].sent.get(idx).cloned() {
                self.write_to(token, &frame);
            }
        }
    }

    fn binary_send(&mut self, j: usize, frame: &[u8]) {
        let s = &mut self.bin[j];
        s.next_seq += 1;
        s.sent.push_back(frame.into());
        if s.sent.len() > self.config.gateway.stored_messages_max {
            s.sent.pop_front();
            s.first_kept_seq += 1;
        }
        s.last_sent_ms = self.now_ms;
        if let Some(t) = s.conn {
            self.write_to(t, frame);
            self.stats.reports_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    // ----- delivery -----

    fn deliver(&mut self) {
        if self.router.outbox.is_empty() {
            return;
        }
        let outbox = std::mem::take(&mut self.router.outbox);
        let answered = std::mem::take(&mut self.router.probes.answered);
        let mut traced = answered.into_iter().peekable();
        let mut buf = [0u8; FRAME_BYTES_MAX];
        for (index, (sref, report)) in outbox.iter().enumerate() {
            let Some(meta) = self.router.sessions.get(sref.0 as usize) else {
                continue;
            };
            let (proto, firm) = (meta.proto, meta.firm);
            let is_exec = matches!(report, Report::Exec(_) | Report::StatusUnknown { .. });
            let exec_id = if is_exec {
                self.exec_ids += 1;
                self.counters.exec_reports += 1;
                format!("{}-{}", self.exec_id_prefix, self.exec_ids)
            } else {
                String::new()
            };
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
                    self.router.probes.recorder.record(&t);
                }
            }
            let token = match proto {
                Proto::Fix(i) => {
                    let m = fix_front::render(&self.router, report, &exec_id);
                    if let Some(t) = trace.as_mut() {
                        t.stamp(Stage::Encoded);
                    }
                    self.fix_send(i, m);
                    self.fix[i].conn
                }
                Proto::Binary(j) => {
                    let n = binary_front::render(&self.router, report, &mut buf);
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
                    _ => self.router.probes.recorder.record(&t),
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
                    if let Some(Proto::Fix(i)) =
                        self.router.sessions.get(dc.0 as usize).map(|m| m.proto)
                    {
                        let m = fix_front::render(&self.router, report, &exec_id);
                        self.counters.exec_reports += 1;
                        self.fix_send(i, m);
                    }
                }
            }
        }
        for (_, t) in traced {
            self.router.probes.recorder.record(&t);
        }
        // Keep the allocation for the next cycle.
        let mut outbox = outbox;
        outbox.clear();
        if self.router.outbox.is_empty() {
            self.router.outbox = outbox;
        }
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
        let mut buf = [0u8; FRAME_BYTES_MAX];
        for j in 0..self.bin.len() {
            let Some(token) = self.bin[j].conn else {
                continue;
            };
            let s = &self.bin[j];
            let keepalive = u64::from(s.keepalive_ms);
            if now.saturating_sub(s.last_recv_ms)
                > keepalive * u64::from(oe::KEEPALIVE_MISSED_INTERVALS_MAX)
            {
                self.binary_terminate(token, TerminationCode::KeepaliveTimeout);
                continue;
            }
            if now.saturating_sub(s.last_sent_ms) >= keepalive {
                let next = s.next_seq;
                if let Ok(n) = encode_frame(&mut buf, |mut e: SequenceEncoder| {
                    e.next_seq_no(next);
                    e
                }) {
                    self.bin[j].last_sent_ms = now;
                    self.write_to(token, &buf[..n]);
                }
            }
        }
        let logon_timeout = self.config.gateway.logon_timeout_ms;
        let stale: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.attached.is_none()
                    && !c.closing
                    && now.saturating_sub(c.opened_ms) >= logon_timeout
            })
            .map(|(t, _)| *t)
            .collect();
        for t in stale {
            self.close(t, DisconnectReason::LogonTimeout);
        }
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
        self.stats
            .requests_in
            .store(self.router.requests_in, Ordering::Relaxed);
        self.stats
            .requests_pending
            .store(self.router.pending_requests(), Ordering::Relaxed);
        self.stats
            .connections_open
            .store(self.conns.len(), Ordering::Relaxed);
        self.publish();
        self.router
            .probes
            .recorder
            .maybe_flush(bourse_monitor::clock::now_ns());
    }

    /// Hands what the loop counted to the monitor (every tick; nothing without a monitor).
    fn publish(&mut self) {
        let Some(m) = self.metrics.as_mut() else {
            return;
        };
        m.publish(&self.counters, &self.router.counters);
        let logged_on = self.fix.iter().filter(|s| s.session.is_logged_on()).count();
        let established = self.bin.iter().filter(|s| s.conn.is_some()).count();
        m.fix_sessions.set(logged_on as i64);
        m.binary_sessions.set(established as i64);
        m.connections.set(self.conns.len() as i64);
        m.orders_tracked.set(self.router.tracked_orders() as i64);
        for (core, g) in m.core_queues.iter().enumerate() {
            g.set(self.router.core_in_flight(core) as i64);
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
            let mut failed = false;
            while conn.out_pos < conn.out.len() {
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
                self.router.probes.recorder.record(&trace);
            } else {
                i += 1;
            }
        }
    }

    fn close(&mut self, token: Token, reason: DisconnectReason) {
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        if let Some(i) = DisconnectReason::ALL.iter().position(|r| *r == reason) {
            self.counters.disconnects[i] += 1;
        }
        self.awaiting_write.retain(|(t, _)| *t != token);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
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
