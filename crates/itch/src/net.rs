//! The feed and its consumer over UDP: [`UdpFeed`] sends packets to one destination and runs
//! the retransmission request server on a thread of its own; [`run_consumer`] follows a feed
//! and requests what it missed.

use crate::consumer::Consumer;
use crate::feed::{answer_request, Feed, FeedLimits, RateLimit, RequestStats, SharedWindow};
use crate::mold::Session;
use crate::project::ProjectionStats;
use bourse_core::{Event, Instrument};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Copies of the end-of-session packet sent at the end.
const END_OF_SESSION_COPIES: usize = 3;
/// How often the request server looks at its stop flag while idle.
const REQUEST_POLL_MS: u64 = 50;

/// Where and how a feed is served.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub session: Session,
    /// Where packets go (a unicast host or a multicast group).
    pub dest: SocketAddr,
    /// Where retransmission requests are answered.
    pub request_listen: SocketAddr,
    pub limits: FeedLimits,
    /// A heartbeat goes out after this long without a packet.
    pub heartbeat_ms: u64,
    /// Price scale assumed for instruments published without a definition.
    pub default_price_scale: u8,
}

/// What a feed has done so far.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct FeedReport {
    pub packets_sent: u64,
    pub next_sequence: u64,
    pub send_errors: u64,
    pub projection: ProjectionStats,
    pub requests: RequestStats,
}

/// A feed over UDP with its retransmission server. See the module documentation.
pub struct UdpFeed {
    feed: Feed,
    socket: UdpSocket,
    dest: SocketAddr,
    heartbeat: Duration,
    coalesce_us: u64,
    last_send: Instant,
    send_errors: u64,
    request_addr: SocketAddr,
    request_stats: Arc<Mutex<RequestStats>>,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl UdpFeed {
    /// Binds both sockets, starts the request server and sends Start of Messages.
    pub fn start(config: &ServeConfig) -> io::Result<UdpFeed> {
        let feed = Feed::new(config.session, config.limits, config.default_price_scale)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let bind: SocketAddr = if config.dest.is_ipv4() {
            "0.0.0.0:0".parse().expect("address")
        } else {
            "[::]:0".parse().expect("address")
        };
        let socket = UdpSocket::bind(bind)?;
        let requests = UdpSocket::bind(config.request_listen)?;
        requests.set_read_timeout(Some(Duration::from_millis(REQUEST_POLL_MS)))?;
        let request_addr = requests.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let request_stats = Arc::new(Mutex::new(RequestStats::default()));
        let server = {
            let (window, stop, stats) = (feed.window(), stop.clone(), request_stats.clone());
            let (session, limits) = (config.session, config.limits);
            std::thread::Builder::new()
                .name("itch-requests".into())
                .spawn(move || serve_requests(requests, session, limits, window, stats, &stop))?
        };
        let mut f = UdpFeed {
            feed,
            socket,
            dest: config.dest,
            heartbeat: Duration::from_millis(config.heartbeat_ms.max(1)),
            coalesce_us: config.limits.coalesce_us_max,
            last_send: Instant::now(),
            send_errors: 0,
            request_addr,
            request_stats,
            stop,
            server: Some(server),
        };
        let ts = now_ns();
        f.with_sender(|feed, send| feed.start(ts, send));
        Ok(f)
    }

    fn with_sender(&mut self, act: impl FnOnce(&mut Feed, &mut dyn FnMut(&[u8]))) {
        let (socket, dest, errors) = (&self.socket, self.dest, &mut self.send_errors);
        let mut sent = false;
        let mut send = |p: &[u8]| {
            sent = true;
            if socket.send_to(p, dest).is_err() {
                *errors += 1;
            }
        };
        act(&mut self.feed, &mut send);
        if sent {
            self.last_send = Instant::now();
        }
    }

    /// The address the request server answers on.
    pub fn request_addr(&self) -> SocketAddr {
        self.request_addr
    }

    pub fn define(&mut self, def: &Instrument) {
        let ts = now_ns();
        self.with_sender(|f, send| f.define(def, ts, send));
    }

    /// One committed entry's events (coalesced into an open packet when the limits ask for
    /// it; see [`Feed::publish_at`]).
    pub fn publish(&mut self, events: &[Event]) {
        let now = now_ns();
        self.with_sender(|f, send| f.publish_at(events, now, send));
    }

    /// How often [`UdpFeed::tick`] must run: the coalescing delay, if any.
    pub fn tick_every(&self) -> Option<Duration> {
        self.feed
            .coalescing()
            .then(|| Duration::from_micros(self.coalesce_us.max(1)))
    }

    /// Sends an open packet that has waited long enough, and a heartbeat if nothing left for
    /// the heartbeat interval.
    pub fn tick(&mut self) {
        let now = now_ns();
        self.with_sender(|f, send| f.flush_due(now, send));
        if self.last_send.elapsed() >= self.heartbeat {
            self.with_sender(|f, send| f.heartbeat(send));
        }
    }

    pub fn report(&self) -> FeedReport {
        FeedReport {
            packets_sent: self.feed.packets_sent(),
            next_sequence: self.feed.next_sequence(),
            send_errors: self.send_errors,
            projection: self.feed.stats(),
            requests: *self.request_stats.lock().expect("stats lock"),
        }
    }

    /// Ends the session (End of Messages, end-of-session packet); the request server keeps
    /// answering until [`UdpFeed::stop`].
    pub fn end(&mut self) {
        let ts = now_ns();
        self.with_sender(|f, send| f.end(ts, send));
        // Nothing retransmits the end-of-session packet, so it goes out more than once: a
        // consumer that lost one copy still learns that the session ended.
        for _ in 1..END_OF_SESSION_COPIES {
            self.repeat_end_of_session();
        }
    }

    /// Sends the end-of-session packet again (a consumer that lost it learns the session
    /// ended; MoldUDP64 servers repeat it).
    pub fn repeat_end_of_session(&mut self) {
        self.with_sender(|f, send| f.end_of_session(send));
    }

    /// Stops the request server.
    pub fn stop(mut self) -> FeedReport {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
        self.report()
    }
}

fn serve_requests(
    socket: UdpSocket,
    session: Session,
    limits: FeedLimits,
    window: SharedWindow,
    stats: Arc<Mutex<RequestStats>>,
    stop: &AtomicBool,
) {
    let mut buf = [0u8; 64];
    let mut out = Vec::with_capacity(limits.packet_bytes_max);
    let mut rate = RateLimit::new(limits.requests_per_s_max);
    let started = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let answer = if rate.allow(started.elapsed().as_nanos() as u64) {
            let w = window.lock().expect("window lock");
            answer_request(&buf[..n], session, &w, limits.packet_bytes_max, &mut out)
        } else {
            Err(crate::feed::RequestError::RateLimited)
        };
        let mut s = stats.lock().expect("stats lock");
        match answer {
            Ok(given) => {
                s.answered += 1;
                s.messages_resent += u64::from(given);
                drop(s);
                let _ = socket.send_to(&out, from);
            }
            Err(e) => s.count(e),
        }
    }
}

/// Bounds of a consumer run.
#[derive(Clone, Copy, Debug)]
pub struct ConsumerLimits {
    /// Messages held past a gap.
    pub held_max: usize,
    /// Messages asked for per request.
    pub request_count_max: u16,
    /// A request for the same gap is repeated after this long.
    pub retry_ms: u64,
    /// The run ends after this long whatever happened.
    pub deadline_ms: u64,
}

impl Default for ConsumerLimits {
    fn default() -> ConsumerLimits {
        ConsumerLimits {
            held_max: 1 << 20,
            request_count_max: 1_000,
            retry_ms: 20,
            deadline_ms: 60_000,
        }
    }
}

/// Follows the feed arriving on `socket`, requesting gaps from `request_server` (through the
/// same socket, so answers arrive with the feed), until the session ended and nothing is
/// missing, or the deadline. Every datagram is shown to `keep` first, with its number if it is
/// live (retransmissions are told apart by coming from the request server); what it returns
/// false for is not applied (tests inject loss so; a recorder writes them down).
pub fn run_consumer(
    socket: &UdpSocket,
    request_server: SocketAddr,
    limits: ConsumerLimits,
    mut keep: impl FnMut(Option<u64>, &[u8]) -> bool,
) -> io::Result<(Consumer, u64)> {
    socket.set_read_timeout(Some(Duration::from_millis(limits.retry_ms.max(1))))?;
    let mut consumer = Consumer::new(limits.held_max);
    let mut buf = vec![0u8; crate::mold::PACKET_BYTES_MAX];
    let mut request = Vec::with_capacity(crate::mold::HEADER_BYTES);
    let deadline = Instant::now() + Duration::from_millis(limits.deadline_ms);
    let mut last_request: Option<(u64, Instant)> = None;
    let (mut live, mut requests) = (0u64, 0u64);
    while Instant::now() < deadline {
        if consumer.stats().end_of_session && consumer.complete() {
            break;
        }
        if let Ok((n, from)) = socket.recv_from(&mut buf) {
            let number = (from != request_server).then(|| {
                live += 1;
                live
            });
            if keep(number, &buf[..n]) {
                consumer.on_datagram(&buf[..n]);
            }
        }
        if let (Some(gap), Some(session)) =
            (consumer.gap(limits.request_count_max), consumer.session())
        {
            // A new gap is asked for at once; the same one again only after `retry_ms`.
            let due = match last_request {
                Some((seq, t)) if seq == gap.sequence => {
                    t.elapsed() >= Duration::from_millis(limits.retry_ms)
                }
                _ => true,
            };
            if due {
                gap.encode(session, &mut request);
                socket.send_to(&request, request_server)?;
                requests += 1;
                last_request = Some((gap.sequence, Instant::now()));
            }
        }
    }
    Ok((consumer, requests))
}
