//! The reference reacting client: market data over UDP in, FIX NewOrderSingle over TCP out.
//!
//! Start-up (cold): bind the feed's UDP port, connect to the FIX acceptor, log on, allocate
//! the [`Reactor`]. The hot path is then `recv` → [`Reactor::on_datagram`] → `write` of the
//! patched orders: two system calls, no allocation, no lock. The clock is read through
//! `Instant` (the vDSO, not a system call) when `recv` returns and when the send is called;
//! with `stages` also between decode, book update and decision, and after the send returns.
//!
//! Between packets (a receive timeout, or every few thousand empty polls when busy-polling)
//! the client reads its FIX connection without blocking: a Logout or the peer closing ends
//! the run, a TestRequest is answered, and a Heartbeat goes out when nothing else did for the
//! heartbeat interval. Busy-polling is off by default: on a 2-core machine the driver and the
//! client would each take a core.

use crate::reactor::{Reactor, ReactorConfig, ReactorStats};
use crate::stats::{BySize, SizeRow, Summary};
use bourse_fix::codec::{decode, FrameBuffer, OutMessage};
use bourse_fix::time::UtcTimestamp;
use bourse_latency::{histogram, record};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Largest FIX message either side accepts.
pub const FIX_MESSAGE_BYTES_MAX: usize = 8 * 1024;
/// Largest datagram the client receives (the most UDP carries).
pub const DATAGRAM_BYTES_MAX: usize = 65_536;
/// Empty polls between two looks at the FIX connection when busy-polling.
const BUSY_POLLS_PER_IDLE_CHECK: u32 = 4_096;
/// Socket receive buffer asked for the feed (the kernel may give less).
const UDP_RCVBUF_BYTES: usize = 4 << 20;

/// Settings of the client.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub fix_addr: SocketAddr,
    pub reactor: ReactorConfig,
    pub busy_poll: bool,
    /// Stop after this many datagrams.
    pub packets_max: Option<u64>,
    /// How long to keep trying to connect and log on.
    pub connect_timeout_ms: u64,
    /// Receive timeout between looks at the FIX connection (blocking mode).
    pub idle_poll_ms: u64,
    pub heartbeat_interval_s: u32,
    /// Pin the client's thread to this CPU.
    pub cpu: Option<usize>,
    /// At the end of the run, wait up to this long for the exchange's first answer to every
    /// order sent (an exchange acknowledges or rejects each; the t2t driver answers none).
    pub await_answers_ms: Option<u64>,
}

impl ClientConfig {
    pub fn new(fix_addr: SocketAddr) -> ClientConfig {
        ClientConfig {
            fix_addr,
            reactor: ReactorConfig::default(),
            busy_poll: false,
            packets_max: None,
            connect_timeout_ms: 30_000,
            idle_poll_ms: 20,
            heartbeat_interval_s: 30,
            cpu: None,
            await_answers_ms: None,
        }
    }
}

/// Durations of the stages of reactions that sent orders, in ns.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Stages {
    /// The successful `recv` call (busy-polling only: a blocking one includes the wait).
    pub receive: Option<Summary>,
    pub decode: Summary,
    pub book_update: Summary,
    pub decision: Summary,
    pub encode: Summary,
    pub send: Summary,
}

/// What the exchange answered to the client's orders, read between packets (never on the hot
/// path) and at the end of the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Answers {
    /// ExecutionReports by ExecType: New (the order was accepted), Trade, Canceled or Expired
    /// (an IOC's rest), Rejected.
    pub accepted: u64,
    pub trades: u64,
    pub canceled_or_expired: u64,
    pub rejected: u64,
    /// BusinessMessageReject and session-level Reject messages.
    pub business_rejects: u64,
    pub session_rejects: u64,
    /// The text of the first rejection, if any (to say why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_reject_text: Option<String>,
}

impl Answers {
    /// Orders that got their first answer: accepted or refused one way or another.
    pub fn orders_answered(&self) -> u64 {
        self.accepted + self.rejected + self.business_rejects + self.session_rejects
    }

    fn note(&mut self, m: &bourse_fix::codec::RawMessage<'_>) {
        let rejected = match m.msg_type() {
            b"8" => match m.get(150) {
                Some(b"0") => {
                    self.accepted += 1;
                    false
                }
                Some(b"F") => {
                    self.trades += 1;
                    false
                }
                Some(b"4" | b"C") => {
                    self.canceled_or_expired += 1;
                    false
                }
                Some(b"8") => {
                    self.rejected += 1;
                    true
                }
                _ => false,
            },
            b"j" => {
                self.business_rejects += 1;
                true
            }
            b"3" => {
                self.session_rejects += 1;
                true
            }
            _ => false,
        };
        if rejected && self.first_reject_text.is_none() {
            self.first_reject_text = Some(m.get_str(58).unwrap_or("no text").to_string());
        }
    }
}

/// What a run of the client did and how long its reactions took.
#[derive(Clone, Debug, Serialize)]
pub struct ClientReport {
    pub stats: ReactorStats,
    /// The exchange's answers to the orders.
    pub answers: Answers,
    /// Datagrams that caused at least one order.
    pub reactions: u64,
    /// `recv` returned → `write` called, for packets that caused orders.
    pub processing_ns: Summary,
    /// The same by packet size.
    pub processing_by_size: Vec<SizeRow>,
    /// `recv` returned → the decision not to send, for packets that caused no order.
    pub no_order_ns: Summary,
    pub stages: Option<Stages>,
    pub exit: String,
}

struct StageHists {
    receive: Histogram<u64>,
    decode: Histogram<u64>,
    book: Histogram<u64>,
    decision: Histogram<u64>,
    encode: Histogram<u64>,
    send: Histogram<u64>,
}

impl StageHists {
    fn new() -> StageHists {
        StageHists {
            receive: histogram(),
            decode: histogram(),
            book: histogram(),
            decision: histogram(),
            encode: histogram(),
            send: histogram(),
        }
    }
}

fn ns_between(a: Instant, b: Instant) -> u64 {
    b.saturating_duration_since(a).as_nanos() as u64
}

/// Binds the feed's UDP socket (before the driver starts sending, so nothing is lost).
pub fn bind_feed(addr: SocketAddrV4) -> std::io::Result<UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    let _ = socket.set_recv_buffer_size(UDP_RCVBUF_BYTES);
    socket.bind(&SocketAddr::V4(addr).into())?;
    Ok(socket.into())
}

/// A FIX session message (Logon, Heartbeat, Logout) from `sender` to `target`.
pub fn session_message(
    msg_type: &str,
    seq: u64,
    sender: &str,
    target: &str,
    body: &[(i32, String)],
) -> Vec<u8> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut m = OutMessage::new(msg_type);
    m.set_header_display(34, &seq)
        .set_header(49, sender)
        .set_header_display(52, &UtcTimestamp(now_ms))
        .set_header(56, target);
    for (tag, value) in body {
        m.push(*tag, value);
    }
    m.encode("FIX.4.4")
}

/// Reads until one whole FIX frame is buffered or `deadline` passes.
pub fn read_frame(
    stream: &mut TcpStream,
    frames: &mut FrameBuffer,
    deadline: Instant,
) -> Result<Vec<u8>, String> {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(frame) = frames
            .next_frame()
            .map_err(|e| format!("FIX framing: {e:?}"))?
        {
            return Ok(frame);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out waiting for a FIX message".into());
        }
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| e.to_string())?;
        match stream.read(&mut buf) {
            Ok(0) => return Err("the FIX peer closed the connection".into()),
            Ok(n) => frames.push(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(format!("reading the FIX connection: {e}")),
        }
    }
}

/// Connects and logs on; returns the stream ready for orders.
pub(crate) fn connect_and_log_on(cfg: &ClientConfig) -> Result<TcpStream, String> {
    let deadline = Instant::now() + Duration::from_millis(cfg.connect_timeout_ms);
    let mut stream = loop {
        match TcpStream::connect_timeout(&cfg.fix_addr, Duration::from_millis(500)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("connecting to FIX {}: {e}", cfg.fix_addr)),
        }
    };
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let spec = &cfg.reactor.order;
    let logon = session_message(
        "A",
        1,
        &spec.sender_comp_id,
        &spec.target_comp_id,
        &[
            (98, "0".into()),
            (108, cfg.heartbeat_interval_s.to_string()),
        ],
    );
    stream
        .write_all(&logon)
        .map_err(|e| format!("sending Logon: {e}"))?;
    let mut frames = FrameBuffer::new(FIX_MESSAGE_BYTES_MAX);
    let frame = read_frame(&mut stream, &mut frames, deadline)?;
    let m = decode(&frame, None, FIX_MESSAGE_BYTES_MAX)
        .map_err(|e| format!("the Logon answer does not decode: {e:?}"))?;
    if m.msg_type() != b"A" {
        return Err(format!(
            "the FIX peer answered the Logon with MsgType {} ({})",
            String::from_utf8_lossy(m.msg_type()),
            m.get_str(58).unwrap_or("no text")
        ));
    }
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// The FIX connection between packets.
struct Session {
    stream: TcpStream,
    frames: FrameBuffer,
    last_sent: Instant,
    heartbeat: Duration,
    answers: Answers,
}

impl Session {
    /// Reads whatever the peer sent, without blocking (or waiting up to `wait` for it).
    /// `Some(reason)` ends the run.
    fn poll(
        &mut self,
        reactor: &mut Reactor,
        sender: &str,
        target: &str,
        wait: Option<Duration>,
    ) -> Option<String> {
        let mut buf = [0u8; 4096];
        let mode = match wait {
            None => self.stream.set_nonblocking(true),
            Some(w) => self
                .stream
                .set_read_timeout(Some(w.max(Duration::from_millis(1)))),
        };
        if let Err(e) = mode {
            return Some(format!("FIX socket: {e}"));
        }
        let read = self.stream.read(&mut buf);
        let _ = self.stream.set_nonblocking(false);
        let _ = self.stream.set_read_timeout(None);
        match read {
            Ok(0) => return Some("the FIX peer closed the connection".into()),
            Ok(n) => self.frames.push(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Some(format!("reading the FIX connection: {e}")),
        }
        while let Ok(Some(frame)) = self.frames.next_frame() {
            let Ok(m) = decode(&frame, None, FIX_MESSAGE_BYTES_MAX) else {
                continue;
            };
            self.answers.note(&m);
            match m.msg_type() {
                b"5" => return Some("the FIX peer logged out".into()),
                b"1" => {
                    let id = m.get_str(112).unwrap_or("").to_string();
                    let hb = session_message("0", reactor.take_seq(), sender, target, &[(112, id)]);
                    if let Err(e) = self.stream.write_all(&hb) {
                        return Some(format!("sending Heartbeat: {e}"));
                    }
                    self.last_sent = Instant::now();
                }
                _ => {}
            }
        }
        if self.last_sent.elapsed() >= self.heartbeat {
            let hb = session_message("0", reactor.take_seq(), sender, target, &[]);
            if let Err(e) = self.stream.write_all(&hb) {
                return Some(format!("sending Heartbeat: {e}"));
            }
            self.last_sent = Instant::now();
        }
        None
    }
}

/// Runs the client on `feed` until the FIX peer goes, `stop` is set, or `packets_max`
/// datagrams were handled.
pub fn run_client(
    cfg: &ClientConfig,
    feed: UdpSocket,
    stop: &AtomicBool,
) -> Result<ClientReport, String> {
    if let Some(cpu) = cfg.cpu {
        crate::pin_to_cpu(cpu)?;
    }
    let mut reactor = Reactor::new(cfg.reactor.clone())?;
    let stream = connect_and_log_on(cfg)?;
    let mut session = Session {
        stream,
        frames: FrameBuffer::new(FIX_MESSAGE_BYTES_MAX),
        last_sent: Instant::now(),
        heartbeat: Duration::from_secs(u64::from(cfg.heartbeat_interval_s.max(1))),
        answers: Answers::default(),
    };
    if cfg.busy_poll {
        feed.set_nonblocking(true).map_err(|e| e.to_string())?;
    } else {
        feed.set_read_timeout(Some(Duration::from_millis(cfg.idle_poll_ms.max(1))))
            .map_err(|e| e.to_string())?;
    }
    // Wall time from the monotonic clock: one reading of each at start, then SendingTime
    // comes from the `Instant` already taken when `recv` returned.
    let instant_base = Instant::now();
    let wall_base_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let stages_on = cfg.reactor.stages;
    let mut processing = BySize::default();
    let mut no_order = histogram();
    let mut stages = StageHists::new();
    let mut reactions = 0u64;
    let mut buf = [0u8; DATAGRAM_BYTES_MAX];
    let mut empty_polls = 0u32;
    let (sender, target) = (
        cfg.reactor.order.sender_comp_id.clone(),
        cfg.reactor.order.target_comp_id.clone(),
    );
    let limit = cfg.packets_max.unwrap_or(u64::MAX);
    let exit = loop {
        if reactor.stats().packets >= limit {
            break "packet limit reached".to_string();
        }
        let before_recv = (stages_on && cfg.busy_poll).then(Instant::now);
        let n = match feed.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                empty_polls += 1;
                if !cfg.busy_poll || empty_polls >= BUSY_POLLS_PER_IDLE_CHECK {
                    empty_polls = 0;
                    if stop.load(Ordering::Relaxed) {
                        break "stopped".to_string();
                    }
                    if let Some(reason) = session.poll(&mut reactor, &sender, &target, None) {
                        break reason;
                    }
                }
                continue;
            }
            Err(e) => break format!("receiving the feed: {e}"),
        };
        let received = Instant::now();
        let wall_ns = wall_base_ns + ns_between(instant_base, received);
        let reaction = reactor.on_datagram(&buf[..n], wall_ns);
        if reaction.orders == 0 {
            record(&mut no_order, ns_between(received, Instant::now()));
            continue;
        }
        let send_called = Instant::now();
        if let Err(e) = session.stream.write_all(reactor.out()) {
            break format!("sending orders: {e}");
        }
        let sent = stages_on.then(Instant::now);
        session.last_sent = send_called;
        reactions += 1;
        processing.record(reaction.updates, ns_between(received, send_called));
        if let (Some(s), Some(sent)) = (reactor.stamps(), sent) {
            if let Some(before) = before_recv {
                record(&mut stages.receive, ns_between(before, received));
            }
            record(&mut stages.decode, ns_between(received, s.decoded));
            record(&mut stages.book, ns_between(s.decoded, s.booked));
            record(&mut stages.decision, ns_between(s.booked, s.decided));
            record(&mut stages.encode, ns_between(s.decided, send_called));
            record(&mut stages.send, ns_between(send_called, sent));
        }
    };
    if let Some(ms) = cfg.await_answers_ms {
        let deadline = Instant::now() + Duration::from_millis(ms);
        while session.answers.orders_answered() < reactor.stats().orders {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let wait = left.min(Duration::from_millis(50));
            if session
                .poll(&mut reactor, &sender, &target, Some(wait))
                .is_some()
            {
                break;
            }
        }
    }
    Ok(ClientReport {
        stats: *reactor.stats(),
        answers: session.answers.clone(),
        reactions,
        processing_ns: Summary::of(&processing.all),
        processing_by_size: processing.rows(),
        no_order_ns: Summary::of(&no_order),
        stages: stages_on.then(|| Stages {
            receive: cfg.busy_poll.then(|| Summary::of(&stages.receive)),
            decode: Summary::of(&stages.decode),
            book_update: Summary::of(&stages.book),
            decision: Summary::of(&stages.decision),
            encode: Summary::of(&stages.encode),
            send: Summary::of(&stages.send),
        }),
        exit,
    })
}

/// The report as text.
pub fn report_text(r: &ClientReport) -> String {
    let s = &r.stats;
    let mut out = format!(
        "client: {} packets, {} reactions, {} orders, {} updates applied, {} refused; skipped {} (malformed {}, truncated {}, unknown template {}, future version {}, wrong schema {}), duplicates {}; exit: {}\n",
        s.packets, r.reactions, s.orders, s.updates_applied, s.updates_refused, s.skipped(),
        s.malformed, s.truncated, s.unknown_template, s.future_version, s.wrong_schema, s.duplicates, r.exit
    );
    if s.malformed_messages + s.other_session + s.heartbeats + s.gaps > 0 {
        out.push_str(&format!(
            "ITCH: {} malformed messages skipped, {} packets of another session, {} heartbeats, {} gaps followed\n",
            s.malformed_messages, s.other_session, s.heartbeats, s.gaps
        ));
    }
    let a = &r.answers;
    if a.orders_answered() + a.trades > 0 {
        out.push_str(&format!(
            "answers: {} accepted, {} trades, {} canceled or expired, {} rejected, {} business rejects, {} session rejects{}\n",
            a.accepted, a.trades, a.canceled_or_expired, a.rejected, a.business_rejects, a.session_rejects,
            a.first_reject_text.as_ref().map(|t| format!(" (first: {t})")).unwrap_or_default()
        ));
    }
    let p = &r.processing_ns;
    out.push_str(&format!(
        "processing (recv returned -> send called), reacting packets: p50 {} p99 {} p99.9 {} max {} mean {} ns (n={}); packets without order: p50 {} p99 {} ns\n",
        p.p50, p.p99, p.p999, p.max, p.mean, p.count, r.no_order_ns.p50, r.no_order_ns.p99
    ));
    out.push_str(&crate::stats::size_table(
        "reactions",
        &r.processing_by_size,
    ));
    if let Some(st) = &r.stages {
        out.push_str("stages of reacting packets (p50 / p99 ns):");
        if let Some(rx) = &st.receive {
            out.push_str(&format!(" receive {}/{}", rx.p50, rx.p99));
        }
        out.push_str(&format!(
            " decode {}/{} book {}/{} decision {}/{} encode {}/{} send {}/{}\n",
            st.decode.p50,
            st.decode.p99,
            st.book_update.p50,
            st.book_update.p99,
            st.decision.p50,
            st.decision.p99,
            st.encode.p50,
            st.encode.p99,
            st.send.p50,
            st.send.p99
        ));
    }
    out
}
