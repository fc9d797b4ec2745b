//! The TCP replay service of the incremental channels, and its client.
//!
//! Each incremental channel (order log, trades, top-20 book, statistics) has its own TCP port
//! and its own history of recent packets; one [`ReplayServer`] thread serves them all. One
//! request per connection (`docs/protocol-market-data.md` section 8): the client sends a
//! ReplayRequest(fromMsgSeqNum, count) frame; the server answers with each kept packet of
//! the range in a packet frame (PossDupFlag set) and a final ReplayResponse, then closes.
//! Requests are bounded: `count` must be in `1..=REPLAY_COUNT_MAX` (else TooManyRequested or
//! InvalidRequest) and the whole range must still be kept (else OutOfRange, with no packets).
//! The server's one thread serves up to `CONNECTIONS_MAX` connections at once, each as its
//! bytes arrive (mio), gives every connection at most `CONNECTION_TIMEOUT_MS`, lets one
//! address hold at most `CONNECTIONS_PER_ADDRESS_MAX`, and makes room for a new connection by
//! closing the one that has waited longest for its request (the venue's admission policy,
//! `bourse_admission`), so idle sockets cannot keep a subscriber that lost packets from its
//! replay. A client address past
//! `REQUESTS_PER_CLIENT_PER_S_MAX` requests per second is answered Throttled.

use crate::history::History;
use crate::{Channel, Publisher};
use bourse_admission::{Admission, Limits};
use bourse_wire::frame::{encode_frame, write_frame_header, Encoding, FRAME_HEADER_BYTES};
use bourse_wire::market_data::codec::{
    replay_request_codec::ReplayRequestEncoder, replay_response_codec::ReplayResponseEncoder,
    replay_status::ReplayStatus,
};
use bourse_wire::market_data::{
    Message, MsgFlags, ReplayFrame, ReplayFrameDecoder, REPLAY_COUNT_MAX, REPLAY_FRAME_BYTES_MAX,
};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A connection that has not finished its request in this long is closed.
pub const CONNECTION_TIMEOUT_MS: u64 = 2_000;
/// Requests one client address may make per second; more are answered `Throttled`.
pub const REQUESTS_PER_CLIENT_PER_S_MAX: u32 = 200;
/// Client addresses remembered for throttling; the table is cleared when it fills.
const THROTTLE_CLIENTS_MAX: usize = 4_096;
/// Connections served at once, over all channels.
pub const CONNECTIONS_MAX: usize = 256;
/// Connections one client address may hold at once.
pub const CONNECTIONS_PER_ADDRESS_MAX: usize = 16;
/// The service's admission limits: `CONNECTIONS_MAX` in all, `CONNECTIONS_PER_ADDRESS_MAX`
/// per address, `CONNECTION_TIMEOUT_MS` to send a whole request.
fn admission_limits() -> Limits {
    Limits {
        connections_per_address_max: CONNECTIONS_PER_ADDRESS_MAX,
        ..Limits::new(
            CONNECTIONS_MAX,
            CONNECTIONS_PER_ADDRESS_MAX,
            CONNECTION_TIMEOUT_MS,
        )
    }
}

/// The largest request read (a ReplayRequest frame is far smaller).
const REQUEST_BYTES_MAX: usize = 64;

/// The packets `from .. from+count` with PossDupFlag set, or why not.
pub fn collect(
    history: &Mutex<History>,
    from: u32,
    count: u32,
) -> Result<Vec<Vec<u8>>, ReplayStatus> {
    if count == 0 || from == 0 {
        return Err(ReplayStatus::InvalidRequest);
    }
    if count > REPLAY_COUNT_MAX {
        return Err(ReplayStatus::TooManyRequested);
    }
    let h = history.lock().map_err(|_| ReplayStatus::Unavailable)?;
    let (first, last) = h.range().ok_or(ReplayStatus::OutOfRange)?;
    let end = from
        .checked_add(count - 1)
        .ok_or(ReplayStatus::OutOfRange)?;
    if from < first || end > last {
        return Err(ReplayStatus::OutOfRange);
    }
    let mut out = Vec::with_capacity(count as usize);
    for seq in from..=end {
        let Some(p) = h.get(seq) else {
            return Err(ReplayStatus::OutOfRange);
        };
        let mut p = p.to_vec();
        if p.len() >= 8 {
            let flags = u16::from_le_bytes([p[6], p[7]]) | MsgFlags::POSS_DUP;
            p[6..8].copy_from_slice(&flags.to_le_bytes());
        }
        out.push(p);
    }
    Ok(out)
}

/// Counters of a replay server.
#[derive(Debug, Default)]
pub struct ReplayServerStats {
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
    pub packets_sent: AtomicU64,
    /// Connections closed unanswered to make room for a newer one.
    pub displaced: AtomicU64,
    /// Connections closed because their time (`CONNECTION_TIMEOUT_MS`) ran out.
    pub timed_out: AtomicU64,
    /// Connections closed at once: no room could be made (every slot was being answered).
    pub refused: AtomicU64,
}

/// A replay server on its own thread: one listening port per channel served.
pub struct ReplayServer {
    local_addrs: Vec<(Channel, SocketAddr)>,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    stats: Arc<ReplayServerStats>,
    thread: Option<JoinHandle<()>>,
}

impl ReplayServer {
    /// Listens on `addr` (use port 0 for any free port) and serves `history` (the order log's).
    pub fn spawn(addr: SocketAddr, history: Arc<Mutex<History>>) -> io::Result<ReplayServer> {
        ReplayServer::spawn_channels(vec![(Channel::Orders, addr, history)])
    }

    /// Serves every incremental channel of `publisher`: the order log on `orders_addr`,
    /// channel `i` on its port + `i` (see [`crate::udp::replay_addr_of`]); port 0 takes any
    /// free ports (then ask [`ReplayServer::local_addr_of`]).
    pub fn spawn_for(orders_addr: SocketAddr, publisher: &Publisher) -> io::Result<ReplayServer> {
        ReplayServer::spawn_histories(orders_addr, |c| publisher.history_of(c))
    }

    /// As [`ReplayServer::spawn_for`], serving the history `history_of` gives for each
    /// channel (none for the loops), such as a [`crate::FeedSender`]'s.
    pub fn spawn_histories(
        orders_addr: SocketAddr,
        history_of: impl Fn(Channel) -> Option<Arc<Mutex<History>>>,
    ) -> io::Result<ReplayServer> {
        let mut services = Vec::new();
        for c in Channel::ALL {
            let Some(history) = history_of(c) else {
                continue;
            };
            let addr = if orders_addr.port() == 0 {
                Some(orders_addr)
            } else {
                crate::udp::replay_addr_of(orders_addr, c)
            };
            let addr = addr.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("no replay port for {} after {orders_addr}", c.name()),
                )
            })?;
            services.push((c, addr, history));
        }
        ReplayServer::spawn_channels(services)
    }

    /// Serves each channel's history on its own address (port 0: any free port).
    pub fn spawn_channels(
        services: Vec<(Channel, SocketAddr, Arc<Mutex<History>>)>,
    ) -> io::Result<ReplayServer> {
        if services.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a replay server needs at least one channel to serve",
            ));
        }
        assert!(
            services.len() <= CONN_FIRST - LISTENER_FIRST,
            "a listener per channel"
        );
        let poll = Poll::new()?;
        let mut listeners = Vec::with_capacity(services.len());
        let mut local_addrs = Vec::with_capacity(services.len());
        for (i, (channel, addr, history)) in services.into_iter().enumerate() {
            let mut listener = TcpListener::bind(addr).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("replay service of {} on {addr}: {e}", channel.name()),
                )
            })?;
            poll.registry().register(
                &mut listener,
                Token(LISTENER_FIRST + i),
                Interest::READABLE,
            )?;
            local_addrs.push((channel, listener.local_addr()?));
            listeners.push((listener, history));
        }
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ReplayServerStats::default());
        let mut server = Server {
            poll,
            listeners,
            admission: Admission::new(admission_limits()),
            started: Instant::now(),
            conns: HashMap::new(),
            clients: HashMap::new(),
            stats: Arc::clone(&stats),
        };
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("md-replay".into())
            .spawn(move || server.run(&stop2))?;
        Ok(ReplayServer {
            local_addrs,
            stop,
            waker,
            stats,
            thread: Some(thread),
        })
    }

    /// The address of the first channel served (the order log's, with [`ReplayServer::spawn`]).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addrs[0].1
    }

    /// The address serving `channel`, if this server serves it.
    pub fn local_addr_of(&self, channel: Channel) -> Option<SocketAddr> {
        self.local_addrs
            .iter()
            .find(|(c, _)| *c == channel)
            .map(|(_, a)| *a)
    }

    pub fn stats(&self) -> &ReplayServerStats {
        &self.stats
    }
}

impl Drop for ReplayServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const WAKER: Token = Token(0);
/// Listener tokens from here (one per channel served, at most `Channel::ALL.len()`).
const LISTENER_FIRST: usize = 1;
/// Connection tokens from here: slot `i` is `Token(CONN_FIRST + i)`.
const CONN_FIRST: usize = 64;

/// One replay connection: its request as it arrives, then its answer as it leaves.
struct ReplayConn {
    stream: TcpStream,
    peer: IpAddr,
    /// The listener (channel) it came through.
    listener: usize,
    opened: Instant,
    request: [u8; REQUEST_BYTES_MAX],
    request_len: usize,
    /// The answer, once the request is complete; the connection closes when it is written.
    answer: Option<(Vec<u8>, usize)>,
}

/// The replay server's loop: every connection served as its bytes arrive, none waiting for
/// another's.
struct Server {
    poll: Poll,
    listeners: Vec<(TcpListener, Arc<Mutex<History>>)>,
    /// Who holds a connection, and who goes to make room (by admission id).
    admission: Admission,
    /// The admission table's clock starts here.
    started: Instant,
    /// The connections by admission id (their token is `CONN_FIRST` past it).
    conns: HashMap<u64, ReplayConn>,
    /// Per client address: (start of the current one-second window, requests in it).
    clients: HashMap<IpAddr, (Instant, u32)>,
    stats: Arc<ReplayServerStats>,
}

impl Server {
    fn run(&mut self, stop: &AtomicBool) {
        let mut events = Events::with_capacity(256);
        while !stop.load(Ordering::Relaxed) {
            let timeout = self
                .next_deadline()
                .map(|d| d.saturating_duration_since(Instant::now()));
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return;
                }
            }
            for event in events.iter() {
                match event.token() {
                    WAKER => {}
                    Token(t) if t < CONN_FIRST => self.accept(t - LISTENER_FIRST),
                    Token(t) => self.on_ready((t - CONN_FIRST) as u64),
                }
            }
            self.close_expired();
        }
    }

    /// When the oldest connection's time runs out.
    fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .values()
            .map(|c| c.opened + Duration::from_millis(CONNECTION_TIMEOUT_MS))
            .min()
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Closes the connections whose time ran out: still waiting for their request (the
    /// admission table's deadline), or being answered for as long.
    fn close_expired(&mut self) {
        let late = self.admission.expire(self.now_ms());
        let now = Instant::now();
        let slow = self.conns.iter().filter(|(_, c)| {
            now.duration_since(c.opened) >= Duration::from_millis(CONNECTION_TIMEOUT_MS)
        });
        let slow: Vec<u64> = slow.map(|(id, _)| *id).collect();
        for id in late.into_iter().chain(slow) {
            if self.conns.contains_key(&id) {
                self.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                self.close(id);
            }
        }
    }

    fn accept(&mut self, listener: usize) {
        loop {
            let (stream, peer) = match self.listeners[listener].0.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors or a connection reset before accept: the next event
                // tries again.
                Err(_) => return,
            };
            // A connection waiting for its request is the only kind displaced (one being
            // answered finishes), so idle sockets cannot hold a request out: a client sends
            // its request as it connects, and is served before it could be displaced.
            let admit = match self.admission.admit(peer.ip(), self.now_ms()) {
                Ok(admit) => admit,
                Err(_) => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            if let Some((victim, _)) = admit.displaced {
                self.stats.displaced.fetch_add(1, Ordering::Relaxed);
                self.close(victim);
            }
            let mut conn = ReplayConn {
                stream,
                peer: peer.ip(),
                listener,
                opened: Instant::now(),
                request: [0; REQUEST_BYTES_MAX],
                request_len: 0,
                answer: None,
            };
            let _ = conn.stream.set_nodelay(true);
            let token = Token(CONN_FIRST + admit.id as usize);
            if self
                .poll
                .registry()
                .register(&mut conn.stream, token, Interest::READABLE)
                .is_ok()
            {
                self.conns.insert(admit.id, conn);
            } else {
                self.admission.remove(admit.id);
            }
        }
    }

    fn close(&mut self, id: u64) {
        self.admission.remove(id);
        if let Some(mut conn) = self.conns.remove(&id) {
            let _ = self.poll.registry().deregister(&mut conn.stream);
        }
    }

    fn on_ready(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let done = if conn.answer.is_none() {
            match read_request(conn) {
                Ok(Some(request)) => {
                    self.admission.proven(id);
                    let throttled = throttle(&mut self.clients, conn.peer);
                    let history = &self.listeners[conn.listener].1;
                    conn.answer = Some((answer(request, history, &self.stats, throttled), 0));
                    let token = Token(CONN_FIRST + id as usize);
                    let _ = self.poll.registry().reregister(
                        &mut conn.stream,
                        token,
                        Interest::READABLE | Interest::WRITABLE,
                    );
                    write_answer(conn)
                }
                Ok(None) => false,
                Err(_) => true,
            }
        } else {
            write_answer(conn)
        };
        if done {
            self.close(id);
        }
    }
}

/// Counts a request against its address's one-second window; true past the bound.
fn throttle(clients: &mut HashMap<IpAddr, (Instant, u32)>, peer: IpAddr) -> bool {
    if clients.len() >= THROTTLE_CLIENTS_MAX {
        clients.clear();
    }
    let now = Instant::now();
    let entry = clients.entry(peer).or_insert((now, 0));
    if now.duration_since(entry.0) >= Duration::from_secs(1) {
        *entry = (now, 0);
    }
    entry.1 += 1;
    entry.1 > REQUESTS_PER_CLIENT_PER_S_MAX
}

/// Reads what the connection holds: `Some(request)` once it is complete (`None` inside for a
/// frame that is not a valid ReplayRequest), `Ok(None)` while it is not, an error when the
/// peer closed or broke the connection before.
fn read_request(conn: &mut ReplayConn) -> io::Result<Option<Option<(u32, u32)>>> {
    let decoder = ReplayFrameDecoder::default();
    loop {
        match decoder.decode(&conn.request[..conn.request_len]) {
            Ok(Some(f)) => {
                return Ok(Some(match f.frame {
                    ReplayFrame::Message(Message::ReplayRequest(r)) => {
                        Some((r.from_msg_seq_num(), r.count()))
                    }
                    _ => None,
                }))
            }
            Ok(None) if conn.request_len == REQUEST_BYTES_MAX => return Ok(Some(None)),
            Ok(None) => {}
            Err(_) => return Ok(Some(None)),
        }
        match conn.stream.read(&mut conn.request[conn.request_len..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => conn.request_len += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes what the socket takes of the answer; true once all of it is written (or the
/// connection failed), when the connection is to be closed.
fn write_answer(conn: &mut ReplayConn) -> bool {
    let Some((bytes, written)) = conn.answer.as_mut() else {
        return false;
    };
    while *written < bytes.len() {
        match conn.stream.write(&bytes[*written..]) {
            Ok(0) => return true,
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
    true
}

/// The whole answer to one request: each packet of the range in a packet frame, then the
/// ReplayResponse.
fn answer(
    request: Option<(u32, u32)>,
    history: &Mutex<History>,
    stats: &ReplayServerStats,
    throttled: bool,
) -> Vec<u8> {
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let (from, result) = match request {
        Some((from, _)) if throttled => (from, Err(ReplayStatus::Throttled)),
        Some((from, count)) => (from, collect(history, from, count)),
        None => (0, Err(ReplayStatus::InvalidRequest)),
    };
    let mut frame = vec![0u8; REPLAY_FRAME_BYTES_MAX];
    let mut out = Vec::new();
    let (sent, status) = match result {
        Ok(packets) => {
            out.reserve(packets.len() * 256);
            for p in &packets {
                let Ok(n) = write_frame_header(&mut frame, Encoding::MarketDataPacket, p.len())
                else {
                    continue;
                };
                out.extend_from_slice(&frame[..FRAME_HEADER_BYTES]);
                out.extend_from_slice(p);
                debug_assert_eq!(n, FRAME_HEADER_BYTES + p.len());
            }
            stats
                .packets_sent
                .fetch_add(packets.len() as u64, Ordering::Relaxed);
            (packets.len() as u32, ReplayStatus::Complete)
        }
        Err(status) => {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            (0, status)
        }
    };
    let n = encode_frame(&mut frame, |mut e: ReplayResponseEncoder| {
        e.from_msg_seq_num(from).count(sent).status(status);
        e
    })
    .expect("a ReplayResponse fits its frame");
    out.extend_from_slice(&frame[..n]);
    out
}

/// What a replay request returned.
#[derive(Debug)]
pub struct ReplayReply {
    /// Packets as received (PossDupFlag set).
    pub packets: Vec<Vec<u8>>,
    pub status: ReplayStatus,
}

/// Asks the replay service at `addr` for `count` packets from `from`; bounded by `timeout`.
pub fn request(
    addr: SocketAddr,
    from: u32,
    count: u32,
    timeout: Duration,
) -> io::Result<ReplayReply> {
    let deadline = Instant::now() + timeout;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    let mut frame = [0u8; 64];
    let n = encode_frame(&mut frame, |mut e: ReplayRequestEncoder| {
        e.from_msg_seq_num(from).count(count);
        e
    })
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    stream.write_all(&frame[..n])?;
    let decoder = ReplayFrameDecoder::default();
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut packets = Vec::new();
    loop {
        // Take every whole frame in the buffer.
        let mut at = 0;
        loop {
            match decoder.decode(&buf[at..]) {
                Ok(Some(f)) => {
                    match f.frame {
                        ReplayFrame::Packet(_) => {
                            packets.push(buf[at + FRAME_HEADER_BYTES..at + f.frame_bytes].to_vec())
                        }
                        ReplayFrame::Message(Message::ReplayResponse(r)) => {
                            return Ok(ReplayReply {
                                packets,
                                status: r.status(),
                            })
                        }
                        ReplayFrame::Message(_) => {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "unexpected message on a replay connection",
                            ))
                        }
                    }
                    at += f.frame_bytes;
                }
                Ok(None) => break,
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
            }
        }
        buf.drain(..at);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "replay timed out"));
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "replay closed before its response",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
