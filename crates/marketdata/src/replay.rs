//! The TCP replay service of the incremental channels, and its client.
//!
//! Each incremental channel (order log, trades, top-20 book, statistics) has its own TCP port
//! and its own history of recent packets; one [`ReplayServer`] thread serves them all. One
//! request per connection (`docs/protocol-market-data.md` section 8): the client sends a
//! ReplayRequest(fromMsgSeqNum, count) frame; the server answers with each kept packet of
//! the range in a packet frame (PossDupFlag set) and a final ReplayResponse, then closes.
//! Requests are bounded: `count` must be in `1..=REPLAY_COUNT_MAX` (else TooManyRequested or
//! InvalidRequest) and the whole range must still be kept (else OutOfRange, with no packets).
//! The server serves one connection at a time, gives every connection at most
//! `CONNECTION_TIMEOUT_MS`, and answers a client address past
//! `REQUESTS_PER_CLIENT_PER_S_MAX` requests per second with Throttled.

use crate::history::History;
use crate::{Channel, Publisher};
use bourse_wire::frame::{encode_frame, write_frame_header, Encoding, FRAME_HEADER_BYTES};
use bourse_wire::market_data::codec::{
    replay_request_codec::ReplayRequestEncoder, replay_response_codec::ReplayResponseEncoder,
    replay_status::ReplayStatus,
};
use bourse_wire::market_data::{
    Message, MsgFlags, ReplayFrame, ReplayFrameDecoder, REPLAY_COUNT_MAX, REPLAY_FRAME_BYTES_MAX,
};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
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
/// The longest pause between two polls of the listeners while no request comes (the most a
/// first request after a quiet spell waits to be accepted).
const IDLE_POLL_MS_MAX: u64 = 16;

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
}

/// A replay server on its own thread: one listening port per channel served.
pub struct ReplayServer {
    local_addrs: Vec<(Channel, SocketAddr)>,
    stop: Arc<AtomicBool>,
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
        let mut listeners = Vec::with_capacity(services.len());
        let mut local_addrs = Vec::with_capacity(services.len());
        for (channel, addr, history) in services {
            let listener = TcpListener::bind(addr).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("replay service of {} on {addr}: {e}", channel.name()),
                )
            })?;
            listener.set_nonblocking(true)?;
            local_addrs.push((channel, listener.local_addr()?));
            listeners.push((listener, history));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ReplayServerStats::default());
        let (stop2, stats2) = (Arc::clone(&stop), Arc::clone(&stats));
        let thread = std::thread::Builder::new()
            .name("md-replay".into())
            .spawn(move || {
                // Per client address: (start of the current one-second window, requests in it).
                let mut clients: std::collections::HashMap<std::net::IpAddr, (Instant, u32)> =
                    std::collections::HashMap::new();
                // Polls every millisecond while requests come, backing off to
                // IDLE_POLL_MS_MAX when none do, so that an idle service costs next to nothing.
                let mut pause_ms = 1u64;
                while !stop2.load(Ordering::Relaxed) {
                    let mut idle = true;
                    for (listener, history) in &listeners {
                        match listener.accept() {
                            Ok((stream, peer)) => {
                                idle = false;
                                if clients.len() >= THROTTLE_CLIENTS_MAX {
                                    clients.clear();
                                }
                                let now = Instant::now();
                                let entry = clients.entry(peer.ip()).or_insert((now, 0));
                                if now.duration_since(entry.0) >= Duration::from_secs(1) {
                                    *entry = (now, 0);
                                }
                                entry.1 += 1;
                                let throttled = entry.1 > REQUESTS_PER_CLIENT_PER_S_MAX;
                                let _ = serve(stream, history, &stats2, throttled);
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            Err(_) => std::thread::sleep(Duration::from_millis(10)),
                        }
                    }
                    if idle {
                        std::thread::sleep(Duration::from_millis(pause_ms));
                        pause_ms = (pause_ms * 2).min(IDLE_POLL_MS_MAX);
                    } else {
                        pause_ms = 1;
                    }
                }
            })?;
        Ok(ReplayServer {
            local_addrs,
            stop,
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
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    mut stream: TcpStream,
    history: &Mutex<History>,
    stats: &ReplayServerStats,
    throttled: bool,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(CONNECTION_TIMEOUT_MS)))?;
    stream.set_write_timeout(Some(Duration::from_millis(CONNECTION_TIMEOUT_MS)))?;
    stream.set_nodelay(true)?;
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let mut buf = [0u8; 64];
    let mut len = 0;
    let decoder = ReplayFrameDecoder::default();
    let request = loop {
        match decoder.decode(&buf[..len]) {
            Ok(Some(f)) => match f.frame {
                ReplayFrame::Message(Message::ReplayRequest(r)) => {
                    break Some((r.from_msg_seq_num(), r.count()))
                }
                _ => break None,
            },
            Ok(None) => {}
            Err(_) => break None,
        }
        if len == buf.len() {
            break None;
        }
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(());
        }
        len += n;
    };
    let (from, result) = match request {
        Some((from, _)) if throttled => (from, Err(ReplayStatus::Throttled)),
        Some((from, count)) => (from, collect(history, from, count)),
        None => (0, Err(ReplayStatus::InvalidRequest)),
    };
    let mut frame = vec![0u8; REPLAY_FRAME_BYTES_MAX];
    let (sent, status) = match result {
        Ok(packets) => {
            let mut out = Vec::with_capacity(packets.len() * 256);
            for p in &packets {
                let Ok(n) = write_frame_header(&mut frame, Encoding::MarketDataPacket, p.len())
                else {
                    continue;
                };
                out.extend_from_slice(&frame[..FRAME_HEADER_BYTES]);
                out.extend_from_slice(p);
                debug_assert_eq!(n, FRAME_HEADER_BYTES + p.len());
            }
            stream.write_all(&out)?;
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
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    stream.write_all(&frame[..n])?;
    stream.flush()
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
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
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
