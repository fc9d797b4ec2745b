//! UDP feeds A and B: destinations, the sending side, and a subscriber on real sockets.
//!
//! Where the feeds go is the operator's: [`UdpSink::routed`] sends to any multicast group or
//! unicast host, from the interface its [`SendRoutes`] names, with the multicast TTL and loop
//! set explicitly. [`UdpSink::new`] is the tools' sink and sends only to 127.0.0.0/8 (tests and
//! tools keep their traffic on the host or in network namespaces they create).

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
/// Where feeds on one host go by default: the loopback network's broadcast address. Every
/// socket bound to it and a feed's port receives every datagram, so the venue's own
/// subscribers, `bourse md listen` and `bourse md record` can all read one feed at once; to
/// 127.0.0.1 the kernel would hand each datagram to one of them only. It never leaves the
/// host.
pub const LOOPBACK_BROADCAST: Ipv4Addr = Ipv4Addr::new(127, 255, 255, 255);
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
    /// The default configuration: ports from `base_port` on the loopback broadcast address
    /// ([`LOOPBACK_BROADCAST`]), so that every subscriber on the host gets every packet.
    pub fn localhost(base_port: u16) -> FeedAddrs {
        FeedAddrs::on(LOOPBACK_BROADCAST, LOOPBACK_BROADCAST, base_port)
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

    fn check_loopback(&self) -> io::Result<()> {
        for c in &self.channels {
            for a in [c.a, c.b] {
                if !a.ip().is_loopback() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("refusing to publish to {a}: this sink sends to 127.0.0.0/8 only (a configured one, UdpSink::routed, sends anywhere)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every destination is a multicast group or one host (not 0.0.0.0 or a broadcast), and a
    /// feed leaving the host is not sent from the loopback interface.
    pub fn check_routes(&self, routes: &SendRoutes) -> Result<(), String> {
        for c in &self.channels {
            for (feed, a, interface) in [
                ("A", c.a, routes.interface_a),
                ("B", c.b, routes.interface_b),
            ] {
                let ip = *a.ip();
                if ip.is_unspecified() || ip.is_broadcast() {
                    return Err(format!(
                        "feed {feed} to {a}: a destination is a multicast group or one host"
                    ));
                }
                if !ip.is_multicast() && !ip.is_loopback() && interface.is_loopback() {
                    return Err(format!(
                        "feed {feed} to {a} leaves the host, but is to be sent from {interface}"
                    ));
                }
                if interface.is_multicast() || interface.is_broadcast() {
                    return Err(format!(
                        "feed {feed}: interface {interface} is not an interface's address"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// How a configured sink's datagrams leave the host: the address of the interface each feed
/// is sent from (feeds A and B may leave on different networks; 0.0.0.0 lets the routing
/// table choose), and the multicast TTL (hops; 0 keeps a group on the host) and loop (whether
/// this host's own subscribers receive the groups it sends to). All three are set on the
/// socket explicitly rather than left to the kernel's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendRoutes {
    pub interface_a: Ipv4Addr,
    pub interface_b: Ipv4Addr,
    pub multicast_ttl: u32,
    pub multicast_loop: bool,
}

impl SendRoutes {
    /// Both feeds from 127.0.0.1; multicast stays on the host and loops back to it.
    pub fn loopback() -> SendRoutes {
        SendRoutes {
            interface_a: Ipv4Addr::LOCALHOST,
            interface_b: Ipv4Addr::LOCALHOST,
            multicast_ttl: 0,
            multicast_loop: true,
        }
    }
}

/// A sending socket bound to `interface` (port chosen by the kernel), with the multicast
/// interface, TTL and loop of `routes` set.
fn send_socket(interface: Ipv4Addr, routes: &SendRoutes) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    // Needed to send to the loopback broadcast address (the default on one host).
    socket.set_broadcast(true)?;
    socket.set_multicast_loop_v4(routes.multicast_loop)?;
    socket.set_multicast_ttl_v4(routes.multicast_ttl)?;
    if !interface.is_unspecified() {
        socket.set_multicast_if_v4(&interface).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("multicast interface {interface}: {e} (is it this host's address?)"),
            )
        })?;
    }
    socket
        .bind(&SocketAddr::from((interface, 0)).into())
        .map_err(|e| io::Error::new(e.kind(), format!("binding {interface}: {e}")))?;
    Ok(socket.into())
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
    /// One socket for both feeds, or feed A's and feed B's when they leave on different
    /// interfaces.
    sockets: Vec<UdpSocket>,
    addrs: FeedAddrs,
    /// Feed A and B destinations per channel, in the form `sendmmsg` takes.
    dests: [[SockaddrIn; 2]; CHANNEL_COUNT],
    /// Send calls that failed (each loses the datagrams it carried).
    pub send_errors: u64,
    /// System calls made, for measuring syscalls per packet.
    pub send_calls: u64,
}

impl UdpSink {
    /// A sink to loopback destinations only (the tools' and benchmarks' sink).
    pub fn new(addrs: FeedAddrs) -> io::Result<UdpSink> {
        addrs.check_loopback()?;
        UdpSink::routed(addrs, SendRoutes::loopback())
    }

    /// A sink to wherever `addrs` say, through `routes` (a deployment's configured feeds).
    pub fn routed(addrs: FeedAddrs, routes: SendRoutes) -> io::Result<UdpSink> {
        addrs
            .check_routes(&routes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut sockets = vec![send_socket(routes.interface_a, &routes)?];
        if routes.interface_b != routes.interface_a {
            sockets.push(send_socket(routes.interface_b, &routes)?);
        }
        let mut dests =
            [[SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)); 2]; CHANNEL_COUNT];
        for (d, c) in dests.iter_mut().zip(addrs.channels.iter()) {
            *d = [SockaddrIn::from(c.a), SockaddrIn::from(c.b)];
        }
        Ok(UdpSink {
            sockets,
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
        if self.sockets.len() == 2 {
            return self.send_split(&slices[..n], &to[..n]);
        }
        self.send_calls += 1;
        // A failed call loses its datagrams; a call the kernel ends early after an error
        // (it returns how many it sent, which nix's wrapper does not pass on) loses the rest.
        // On a blocking socket to loopback neither happens short of a system fault, and
        // subscribers recover either like any other loss.
        let fd = self.sockets[0].as_raw_fd();
        if !send_many(fd, &slices[..n], &to[..n]) {
            self.send_errors += 1;
        }
    }

    /// Feed A's copies through the first socket, then feed B's through the second (the two
    /// feeds leave on different interfaces): two system calls per batch.
    fn send_split(&mut self, slices: &[[IoSlice<'_>; 1]], to: &[Option<SockaddrIn>]) {
        let mut a_slices = [[IoSlice::new(&[])]; SEND_BATCH_PACKETS];
        let mut b_slices = [[IoSlice::new(&[])]; SEND_BATCH_PACKETS];
        let mut a_to = [None; SEND_BATCH_PACKETS];
        let mut b_to = [None; SEND_BATCH_PACKETS];
        let k = slices.len() / 2;
        for i in 0..k {
            a_slices[i] = slices[2 * i];
            a_to[i] = to[2 * i];
            b_slices[i] = slices[2 * i + 1];
            b_to[i] = to[2 * i + 1];
        }
        for (socket, s, t) in [
            (0, &a_slices[..k], &a_to[..k]),
            (1, &b_slices[..k], &b_to[..k]),
        ] {
            self.send_calls += 1;
            if !send_many(self.sockets[socket].as_raw_fd(), s, t) {
                self.send_errors += 1;
            }
        }
    }
}

/// One `sendmmsg` of `slices` to `to` through the sending thread's headers; false if it failed.
fn send_many(
    fd: std::os::fd::RawFd,
    slices: &[[IoSlice<'_>; 1]],
    to: &[Option<SockaddrIn>],
) -> bool {
    SEND_HEADERS.with(|h| {
        let mut h = h.borrow_mut();
        let headers =
            h.get_or_insert_with(|| MultiHeaders::preallocate(SEND_BATCH_DATAGRAMS, None));
        sendmmsg(fd, headers, slices, to, [], SendFlags::empty()).is_ok()
    })
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

/// Binds a receiving socket for one destination (joining its group on the loopback interface
/// if multicast).
pub fn bind_receiver(addr: SocketAddrV4) -> io::Result<UdpSocket> {
    bind_receiver_on(addr, Ipv4Addr::LOCALHOST)
}

/// Binds a receiving socket for one destination, joining its group on the interface whose
/// address is `interface` if it is a multicast group. Several receivers of one group on one
/// host each get every datagram (the port is shared).
pub fn bind_receiver_on(addr: SocketAddrV4, interface: Ipv4Addr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // A named port is shared by every receiver on the host; an ephemeral one (port 0) must
    // not be: with SO_REUSEADDR on both, Linux may hand two sockets the same ephemeral UDP
    // port, and a subscriber would then listen to two feeds on one socket.
    socket.set_reuse_address(addr.port() != 0)?;
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
    if addr.ip().is_multicast() {
        socket.bind(&SocketAddr::from((*addr.ip(), addr.port())).into())?;
        socket
            .join_multicast_v4(addr.ip(), &interface)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("joining {} on {interface}: {e}", addr.ip()),
                )
            })?;
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
    /// Listens on the channels named (all when `channels` is empty), both feeds, joining
    /// multicast groups on the loopback interface.
    pub fn bind(
        addrs: &FeedAddrs,
        channels: &[Channel],
        config: SubscriberConfig,
        use_replay: bool,
    ) -> io::Result<UdpSubscriber> {
        let lo = Ipv4Addr::LOCALHOST;
        UdpSubscriber::bind_on(addrs, channels, config, use_replay, [lo, lo])
    }

    /// As [`UdpSubscriber::bind`], joining feed A's multicast groups on the interface whose
    /// address is `interfaces[0]` and feed B's on `interfaces[1]` (a subscriber on another
    /// host than the publisher, the two feeds perhaps on two networks).
    pub fn bind_on(
        addrs: &FeedAddrs,
        channels: &[Channel],
        config: SubscriberConfig,
        use_replay: bool,
        interfaces: [Ipv4Addr; 2],
    ) -> io::Result<UdpSubscriber> {
        let mut sockets = Vec::new();
        for c in Channel::ALL {
            if !channels.is_empty() && !channels.contains(&c) {
                continue;
            }
            let a = addrs.channels[c.index()];
            sockets.push((c, Feed::A, bind_receiver_on(a.a, interfaces[0])?));
            sockets.push((c, Feed::B, bind_receiver_on(a.b, interfaces[1])?));
        }
        Ok(UdpSubscriber {
            sockets,
            replay: use_replay.then_some(SocketAddr::V4(addrs.replay)),
            sub: Subscriber::new(config),
            buf: vec![0u8; DATAGRAM_BYTES_MAX],
            replay_errors: 0,
        })
    }

    /// Binds every channel's feeds A and B on free ports of the loopback broadcast address
    /// and returns the addresses to publish to (tests run in parallel and must not share
    /// ports).
    pub fn bind_ephemeral(config: SubscriberConfig) -> io::Result<(UdpSubscriber, FeedAddrs)> {
        let mut addrs = FeedAddrs::localhost(0);
        let mut sockets = Vec::new();
        for c in Channel::ALL {
            for feed in [Feed::A, Feed::B] {
                let s = bind_receiver(SocketAddrV4::new(LOOPBACK_BROADCAST, 0))?;
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
