//! The access server: one event-loop thread (mio) owns every socket, every FIX and binary
//! session and the [`Router`]; the core runs behind a [`CoreLink`]. The loop reads the clock
//! once per cycle, reads sockets, drains the core's outputs, delivers reports, and flushes
//! what it wrote, so a burst of requests costs one write per connection (smart batching).

use crate::binary_front;
use crate::config::GatewayConfig;
use crate::core_link::CoreLink;
use crate::fix_front::{self, FixApp};
use crate::router::{
    ClientId, GatewayReject, NewOrderRequest, Proto, RejectCause, Report, Router, SessionRef,
};
use crate::store::GatewayStore;
use bourse_core::*;
use bourse_fix::codec::FrameBuffer;
use bourse_fix::session::{Action, Role, Session, SessionConfig};
use bourse_fix::{Dictionary, OutMessage};
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
}

impl GatewayHandle {
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

/// Starts the access servers of `config` in front of `link`. With `core.bootstrap` the
/// instruments and accounts of the config are created in the core first.
pub fn spawn(config: GatewayConfig, mut link: Box<dyn CoreLink>) -> Result<GatewayHandle, String> {
    config.validate()?;
    let poll = Poll::new().map_err(|e| e.to_string())?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(|e| e.to_string())?);
    let waker_core = Arc::clone(&waker);
    link.set_notify(Arc::new(move || {
        let _ = waker_core.wake();
    }));
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
    let mut router = Router::new(&config, link);
    if config.core.bootstrap {
        bootstrap(&mut router, &config)?;
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
    })
}

/// Creates the config's instruments and accounts in the core and waits for the answers.
fn bootstrap(router: &mut Router, config: &GatewayConfig) -> Result<(), String> {
    let ts = now_ns();
    let mut commands = Vec::new();
    for i in &config.instruments {
        commands.push(Command::new(ts, CommandBody::AddInstrument(i.clone())));
    }
    for a in &config.accounts {
        commands.push(Command::new(
            ts,
            CommandBody::AddAccount(AccountSpec {
                account: a.account,
                firm: a.firm,
                may_short: a.may_short,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            }),
        ));
        if a.cash > 0 {
            commands.push(Command::new(
                ts,
                CommandBody::Deposit {
                    account: a.account,
                    amount: Cash(i128::from(a.cash)),
                },
            ));
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for cmd in commands {
        loop {
            match router.submit_admin(cmd.clone()) {
                Ok(()) => break,
                Err(crate::core_link::SubmitError::Closed) => return Err("core closed".into()),
                Err(crate::core_link::SubmitError::Full) => {
                    router.poll_core(usize::MAX);
                    if std::time::Instant::now() > deadline {
                        return Err("core did not take the bootstrap commands".into());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
    router.poll_core(usize::MAX);
    if let Some(r) = router.admin_rejects.first() {
        return Err(format!("bootstrap refused by the core: {r:?}"));
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
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        for t in tokens {
            self.close(t);
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
                    self.close(token);
                    return false;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.close(token);
                    return false;
                }
            };
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
            Err(_) => return self.close(token),
        };
        let rest = frames.take_bytes();
        // The first message must be a Logon for a configured session with our BeginString;
        // anything else is closed without a word, as a FIX acceptor does.
        let Ok(raw) =
            bourse_fix::decode(&frame, None, self.config.gateway.fix_message_size_max_bytes)
        else {
            return self.close(token);
        };
        if raw.begin_string() != b"FIX.4.4" || raw.msg_type() != b"A" {
            return self.close(token);
        }
        let (Some(sender), Some(target)) = (raw.get_str(49), raw.get_str(56)) else {
            return self.close(token);
        };
        let Some(slot) = self
            .fix
            .iter()
            .position(|s| s.client_comp_id == sender && s.gateway_comp_id == target)
        else {
            return self.close(token);
        };
        if self.fix[slot].conn.is_some() {
            return self.close(token);
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
                        conn.out.extend_from_slice(&bytes);
                        self.dirty.push(token.unwrap_or(WAKER));
                    }
                }
                Action::Disconnect { .. } => {
                    if let Some(t) = token {
                        if let Some(conn) = self.conns.get_mut(&t) {
                            conn.closing = true;
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

    fn write_to(&mut self, token: Token, frame: &[u8]) {
        if let Some(conn) = self.conns.get_mut(&token) {
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
        let mut buf = [0u8; FRAME_BYTES_MAX];
        for (sref, report) in &outbox {
            let Some(meta) = self.router.sessions.get(sref.0 as usize) else {
                continue;
            };
            let (proto, firm) = (meta.proto, meta.firm);
            let exec_id = if matches!(report, Report::Exec(_)) {
                self.exec_ids += 1;
                format!("{}-{}", self.exec_id_prefix, self.exec_ids)
            } else {
                String::new()
            };
            match proto {
                Proto::Fix(i) => {
                    let m = fix_front::render(&self.router, report, &exec_id);
                    self.fix_send(i, m);
                }
                Proto::Binary(j) => {
                    let n = binary_front::render(&self.router, report, &mut buf);
                    if n > 0 {
                        self.binary_send(j, &buf[..n]);
                    }
                }
            }
            if matches!(report, Report::Exec(_)) {
                let copies: Vec<SessionRef> = self.router.drop_copies_of(firm).to_vec();
                for dc in copies {
                    if dc == *sref {
                        continue;
                    }
                    if let Some(Proto::Fix(i)) =
                        self.router.sessions.get(dc.0 as usize).map(|m| m.proto)
                    {
                        let m = fix_front::render(&self.router, report, &exec_id);
                        self.fix_send(i, m);
                    }
                }
            }
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
            self.close(t);
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
            if failed || conn.closing {
                self.close(token);
            }
        }
        self.dirty = dirty;
    }

    fn close(&mut self, token: Token) {
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
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
