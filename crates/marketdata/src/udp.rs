//! UDP feeds A and B: destinations, the sending side, and a subscriber on real sockets.
//!
//! Network safety: a [`UdpSink`] sends only to 127.0.0.0/8, or to multicast groups when the
//! caller explicitly allows it (tests do so only inside a network namespace they created).

use crate::publisher::PacketSink;
use crate::replay;
use crate::subscriber::{Subscriber, SubscriberConfig};
use crate::{now_ns, Channel, Feed, CHANNEL_COUNT};
use nix::sys::socket::{sendmmsg, MsgFlags as SendFlags, MultiHeaders, SockaddrIn};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::io::IoSlice;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Default first UDP port: channel `i` uses `BASE_PORT_DEFAULT + 2i` (feed A) and `+ 2i + 1`
/// (feed B); the replay service of incremental channel `i` listens on TCP
/// `BASE_PORT_DEFAULT + REPLAY_PORT_OFFSET + i`.
pub const BASE_PORT_DEFAULT: u16 = 31_400;
pub const REPLAY_PORT_OFFSET: u16 = 20;
/// Socket buffers asked for on both sides, so bursts at 500k events/s fit.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// Largest datagram read.
const DATAGRAM_BYTES_MAX: usize = 2_048;
/// How long a replay request may take.
pub const REPLAY_TIMEOUT_MS: u64 = 1_000;

/// Feed A and B destinations of one channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelAddrs {
    pub a: SocketAddrV4,
    pub b: SocketAddrV4,
}

/// Where every channel is published, and the replay services.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeedAddrs {
    pub channels: [ChannelAddrs; CHANNEL_COUNT],
    /// The order log's replay service; incremental channel `i` is served on this port + `i`.
    pub replay: SocketAddrV4,
}

/// The replay address of `channel` given the order log's (`None` for the loops, or when the
/// port would overflow).
pub fn replay_addr_of(orders: SocketAddr, channel: Channel) -> Option<SocketAddr> {
    if !channel.is_incremental() {
        return None;
    }
    let port = orders.port().checked_add(channel.index() as u16)?;
    Some(SocketAddr::new(orders.ip(), port))
}

impl FeedAddrs {
    /// The default configuration: ports from `base_port` on 127.0.0.1.
    pub fn localhost(base_port: u16) -> FeedAddrs {
        FeedAddrs::on(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, base_port)
    }

    /// Feed A to `host_a`, feed B to `host_b` (two multicast groups, or loopback).
    pub fn on(host_a: Ipv4Addr, host_b: Ipv4Addr, base_port: u16) -> FeedAddrs {
        let mut channels = [ChannelAddrs {
            a: SocketAddrV4::new(host_a, base_port),
            b: SocketAddrV4::new(host_b, base_port + 1),
        }; CHANNEL_COUNT];
        // Port 0 stays 0 for every destination (ephemeral); otherwise ports wrap rather than
        // overflow, and binding a wrapped port fails with a clear error.
        let port_at = |offset: u16| {
            if base_port == 0 {
                0
            } else {
                base_port.wrapping_add(offset)
            }
        };
        for (i, c) in channels.iter_mut().enumerate() {
            let offset = 2 * i as u16;
            c.a = SocketAddrV4::new(host_a, port_at(offset));
            c.b = SocketAddrV4::new(host_b, port_at(offset + 1));
        }
        FeedAddrs {
            channels,
            replay: SocketAddrV4::new(Ipv4Addr::LOCALHOST, port_at(REPLAY_PORT_OFFSET)),
        }
    }

    /// The replay service of `channel` (`None` for the loops).
    pub fn replay_addr(&self, channel: Channel) -> Option<SocketAddrV4> {
        match replay_addr_of(SocketAddr::V4(self.replay), channel)? {
            SocketAddr::V4(a) => Some(a),
            SocketAddr::V6(_) => None,
        }
    }

    fn is_multicast(&self) -> bool {
        self.channels
            .iter()
            .any(|c| c.a.ip().is_multicast() || c.b.ip().is_multicast())
    }

    fn check(&self, allow_multicast: bool) -> io::Result<()> {
        for c in &self.channels {
            for a in [c.a, c.b] {
                let ok = a.ip().is_loopback() || (allow_multicast && a.ip().is_multicast());
                if !ok {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("refusing to publish to {a}: only 127.0.0.0/8 (or multicast inside a test's own network namespace)"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Packets handed to one `sendmmsg` call (each goes to feed A and feed B, so twice as many
/// datagrams).
pub const SEND_BATCH_PACKETS: usize = 32;
const SEND_BATCH_DATAGRAMS: usize = 2 * SEND_BATCH_PACKETS;

thread_local! {
    /// The `sendmmsg` headers of the sending thread, allocated on its first send. They hold
    /// raw pointers, so they cannot move between threads with a sink; one set per thread
    /// keeps sinks `Send` and sending free of allocation.
    static SEND_HEADERS: std::cell::RefCell<Option<MultiHeaders<SockaddrIn>>> =
        const { std::cell::RefCell::new(None) };
}

/// Sends every packet to feed A and feed B: both copies, and every packet of one flush (up to
/// [`SEND_BATCH_PACKETS`]), in one `sendmmsg` system call, through headers allocated once per
/// sending thread.
pub struct UdpSink {
    socket: UdpSocket,
    addrs: FeedAddrs,
    /// Feed A and B destinations per channel, in the form `sendmmsg` takes.
    dests: [[SockaddrIn; 2]; CHANNEL_COUNT],
    /// Send calls that failed (each loses the datagrams it carried).
    pub send_errors: u64,
    /// System calls made, for measuring syscalls per packet.
    pub send_calls: u64,
}

impl UdpSink {
    /// A sink to loopback destinations.
    pub fn new(addrs: FeedAddrs) -> io::Result<UdpSink> {
        UdpSink::with_multicast(addrs, false)
    }

    /// A sink that may also send to multicast groups. Only for a network namespace the caller
    /// created (see DESIGN.md's multicast safety rule).
    pub fn with_multicast(addrs: FeedAddrs, allow_multicast: bool) -> io::Result<UdpSink> {
        addrs.check(allow_multicast)?;
        let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
        if addrs.is_multicast() {
            socket.set_multicast_loop_v4(true)?;
            socket.set_multicast_ttl_v4(0)?; // never leaves the host
            let _ = socket.set_multicast_if_v4(&Ipv4Addr::LOCALHOST);
            socket.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
        } else {
            socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
        }
        let mut dests =
            [[SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)); 2]; CHANNEL_COUNT];
        for (d, c) in dests.iter_mut().zip(addrs.channels.iter()) {
            *d = [SockaddrIn::from(c.a), SockaddrIn::from(c.b)];
        }
        Ok(UdpSink {
            socket: socket.into(),
            addrs,
            dests,
            send_errors: 0,
            send_calls: 0,
        })
    }

    /// The destinations of every channel.
    pub fn addrs(&self) -> &FeedAddrs {
        &self.addrs
    }

    /// Sends up to [`SEND_BATCH_PACKETS`] packets to both feeds in one system call.
    fn send_batch<P: AsRef<[u8]>>(&mut self, channel: Channel, packets: &[P]) {
        debug_assert!(packets.len() <= SEND_BATCH_PACKETS);
        let [a, b] = self.dests[channel.index()];
        let mut slices = [[IoSlice::new(&[])]; SEND_BATCH_DATAGRAMS];
        let mut to = [None; SEND_BATCH_DATAGRAMS];
        // Feed A's copy of each packet, then feed B's: A leads B by the same few
        // microseconds for every packet, as with one send per feed.
        for (k, p) in packets.iter().enumerate() {
            slices[2 * k] = [IoSlice::new(p.as_ref())];
            slices[2 * k + 1] = [IoSlice::new(p.as_ref())];
            to[2 * k] = Some(a);
            to[2 * k + 1] = Some(b);
        }
        let n = 2 * packets.len();
        self.send_calls += 1;
        // A failed call loses its datagrams; a call the kernel ends early after an error
        // (it returns how many it sent, which nix's wrapper does not pass on) loses the rest.
        // On a blocking socket to loopback neither happens short of a system fault, and
        // subscribers recover either like any other loss.
        let fd = self.socket.as_raw_fd();
        let sent = SEND_HEADERS.with(|h| {
            let mut h = h.borrow_mut();
            let headers =
                h.get_or_insert_with(|| MultiHeaders::preallocate(SEND_BATCH_DATAGRAMS, None));
            sendmmsg(fd, headers, &slices[..n], &to[..n], [], SendFlags::empty()).is_ok()
        });
        if !sent {
            self.send_errors += 1;
        }
    }
}

impl PacketSink for UdpSink {
    fn send(&mut self, channel: Channel, packet: &[u8]) {
        self.send_batch(channel, &[packet]);
    }

    fn send_all(&mut self, channel: Channel, packets: &[Vec<u8>]) {
        for chunk in packets.chunks(SEND_BATCH_PACKETS) {
            self.send_batch(channel, chunk);
        }
    }
}

/// Binds a receiving socket for one destination (joining its group if multicast).
pub fn bind_receiver(addr: SocketAddrV4) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_address(true)?;
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    if addr.ip().is_multicast() {
        socket.bind(&SocketAddr::from((*addr.ip(), addr.port())).into())?;
        socket.join_multicast_v4(addr.ip(), &Ipv4Addr::LOCALHOST)?;
    } else {
        socket.bind(&SocketAddr::V4(addr).into())?;
    }
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Called with every datagram received (or replayed): channel, feed, bytes, receive time.
pub type OnPacket<'a> = dyn FnMut(Channel, Feed, &[u8], u64) + 'a;

/// A [`Subscriber`] on real sockets: both feeds of every channel, and the replay service.
pub struct UdpSubscriber {
    sockets: Vec<(Channel, Feed, UdpSocket)>,
    replay: Option<SocketAddr>,
    pub sub: Subscriber,
    buf: Vec<u8>,
    pub replay_errors: u64,
}

impl UdpSubscriber {
    /// Listens on the channels named (all when `channels` is empty), both feeds.
    pub fn bind(
        addrs: &FeedAddrs,
        channels: &[Channel],
        config: SubscriberConfig,
        use_replay: bool,
    ) -> io::Result<UdpSubscriber> {
        let mut sockets = Vec::new();
        for c in Channel::ALL {
            if !channels.is_empty() && !channels.contains(&c) {
                continue;
            }
            let a = addrs.channels[c.index()];
            sockets.push((c, Feed::A, bind_receiver(a.a)?));
            sockets.push((c, Feed::B, bind_receiver(a.b)?));
        }
        Ok(UdpSubscriber {
            sockets,
            replay: use_replay.then_some(SocketAddr::V4(addrs.replay)),
            sub: Subscriber::new(config),
            buf: vec![0u8; DATAGRAM_BYTES_MAX],
            replay_errors: 0,
        })
    }

    /// Binds every channel's feeds A and B on free ports of 127.0.0.1 and returns the
    /// addresses to publish to (tests run in parallel and must not share ports).
    pub fn bind_ephemeral(config: SubscriberConfig) -> io::Result<(UdpSubscriber, FeedAddrs)> {
        let mut addrs = FeedAddrs::localhost(0);
        let mut sockets = Vec::new();
        for c in Channel::ALL {
            for feed in [Feed::A, Feed::B] {
                let s = bind_receiver(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
                let SocketAddr::V4(local) = s.local_addr()? else {
                    return Err(io::Error::other("IPv4 socket with an IPv6 address"));
                };
                match feed {
                    Feed::A => addrs.channels[c.index()].a = local,
                    _ => addrs.channels[c.index()].b = local,
                }
                sockets.push((c, feed, s));
            }
        }
        let sub = UdpSubscriber {
            sockets,
            replay: None,
            sub: Subscriber::new(config),
            buf: vec![0u8; DATAGRAM_BYTES_MAX],
            replay_errors: 0,
        };
        Ok((sub, addrs))
    }

    /// Where the order log's replay service is (the other incremental channels' are on the
    /// following ports, see [`replay_addr_of`]); None: recover from snapshots only.
    pub fn set_replay(&mut self, addr: Option<SocketAddr>) {
        self.replay = addr;
    }

    /// Reads everything waiting on every socket (each datagram goes to `on_packet` and then to
    /// the subscriber), then runs due recovery. Returns the number of datagrams read.
    pub fn poll_once(&mut self, on_packet: &mut OnPacket<'_>) -> usize {
        let mut n = 0;
        // Bounded per call so one busy socket cannot starve the rest.
        for _ in 0..64 {
            let mut got = 0;
            for (c, f, s) in &self.sockets {
                match s.recv(&mut self.buf) {
                    Ok(len) => {
                        let now = now_ns();
                        let d = &self.buf[..len];
                        on_packet(*c, *f, d, now);
                        self.sub.on_packet(*c, *f, d, now);
                        got += 1;
                    }
                    Err(_) => continue,
                }
            }
            n += got;
            if got == 0 {
                break;
            }
        }
        let now = now_ns();
        while let Some(req) = self.sub.poll(now) {
            match self.replay.and_then(|a| replay_addr_of(a, req.channel)) {
                Some(addr) => match replay::request(
                    addr,
                    req.from,
                    req.count,
                    Duration::from_millis(REPLAY_TIMEOUT_MS),
                ) {
                    Ok(reply) => {
                        for p in &reply.packets {
                            on_packet(req.channel, Feed::Replay, p, now);
                            self.sub.on_packet(req.channel, Feed::Replay, p, now);
                        }
                    }
                    Err(_) => self.replay_errors += 1,
                },
                None => self.replay_errors += 1,
            }
            self.sub.on_replay_done(req.channel, now_ns());
        }
        n
    }

    /// Blocks until a datagram waits on any of the subscriber's sockets or `timeout_ms`
    /// passes, and says which. A caller that times packets waits here instead of sleeping,
    /// so its receive stamps are not late by a sleep's length.
    pub fn wait_readable(&self, timeout_ms: u16) -> io::Result<bool> {
        use nix::poll::{poll, PollFd, PollFlags};
        use std::os::fd::AsFd;
        let mut fds: Vec<PollFd<'_>> = self
            .sockets
            .iter()
            .map(|(_, _, s)| PollFd::new(s.as_fd(), PollFlags::POLLIN))
            .collect();
        match poll(&mut fds, timeout_ms) {
            Ok(n) => Ok(n > 0),
            Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(io::Error::from(e)),
        }
    }

    /// Polls until `done` says so or `deadline` passes; sleeps briefly when idle. Returns
    /// whether `done` was reached.
    pub fn run_until(
        &mut self,
        deadline: Instant,
        done: &mut dyn FnMut(&Subscriber) -> bool,
        on_packet: &mut OnPacket<'_>,
    ) -> bool {
        while Instant::now() < deadline {
            if self.poll_once(on_packet) == 0 {
                if done(&self.sub) {
                    return true;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        done(&self.sub)
    }
}

/// Whether an address may be used by tools without a namespace: loopback only.
pub fn is_safe_destination(ip: IpAddr) -> bool {
    ip.is_loopback()
}
