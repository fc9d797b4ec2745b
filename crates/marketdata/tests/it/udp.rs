//! The feeds over real sockets: UDP to 127.0.0.1 with loss on both feeds recovered by the TCP
//! replay service; the replay service's bounds; multicast inside a private network namespace;
//! a recorded pcap read back by tshark.

use crate::common;

use bourse_marketdata::pcap::PcapWriter;
use bourse_marketdata::replay::{self, ReplayServer};
use bourse_marketdata::udp::{FeedAddrs, SendRoutes, UdpSink, UdpSubscriber};
use bourse_marketdata::{now_ns, Channel, PacketSink, SubscriberConfig, VecSink};
use bourse_wire::market_data::codec::replay_status::ReplayStatus;
use common::*;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;
use std::time::{Duration, Instant};

/// Drops every `every`-th order-log packet on both feeds.
struct Dropping {
    inner: UdpSink,
    every: u64,
    n: u64,
    dropped: u64,
}

impl PacketSink for Dropping {
    fn send(&mut self, channel: Channel, packet: &[u8]) {
        if channel == Channel::Orders {
            self.n += 1;
            if self.n.is_multiple_of(self.every) {
                self.dropped += 1;
                return;
            }
        }
        self.inner.send(channel, packet);
    }
}

fn run_over_udp(addrs: FeedAddrs, routes: SendRoutes, mut sub: UdpSubscriber, steps: u32) {
    let mut h = Harness::new(5, test_publisher_config());
    let server = ReplayServer::spawn(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        h.publisher.history(),
    )
    .unwrap();
    sub.set_replay(Some(server.local_addr()));
    let mut sink = Dropping {
        inner: UdpSink::routed(addrs, routes).unwrap(),
        every: 97,
        n: 0,
        dropped: 0,
    };
    let mut ignore = |_: Channel, _: bourse_marketdata::Feed, _: &[u8], _: u64| {};
    for _ in 0..steps {
        h.batch(20);
        let events = std::mem::take(&mut h.events);
        let now = now_ns();
        h.publisher.publish(&events, now, &mut sink);
        h.publisher.tick(now, &mut sink);
        h.events = events;
        sub.poll_once(&mut ignore);
    }
    assert!(sink.dropped > 0);
    // Keep the publisher ticking (snapshots, heartbeats) until the subscriber is in step.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut synced = false;
    while Instant::now() < deadline {
        h.publisher.tick(now_ns(), &mut sink);
        sub.poll_once(&mut ignore);
        if sub.sub.is_synced()
            && sub.sub.expected(Channel::Orders) == Some(h.publisher.next_seq(Channel::Orders))
        {
            synced = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let s = *sub.sub.stats();
    assert!(synced, "not in step: {s:?}");
    assert!(
        s.replays_requested > 0 && s.replay_packets_used > 0,
        "{s:?}"
    );
    assert_eq!(s.book_errors, 0, "{s:?}");
    assert!(
        server
            .stats()
            .packets_sent
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "the TCP replay service resent packets"
    );
    assert_books_equal(&h.engine, &sub.sub, &h.defs);
}

#[test]
fn udp_feeds_on_loopback_with_loss_on_both_feeds_recover_by_tcp_replay() {
    let (sub, addrs) = UdpSubscriber::bind_ephemeral(SubscriberConfig::default()).unwrap();
    run_over_udp(addrs, SendRoutes::loopback(), sub, 3_000);
}

/// An idle connection to `addr` from the loopback address `from` (127.0.0.0/8 only).
fn idle_from(from: Ipv4Addr, addr: SocketAddr) -> std::net::TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    socket.connect(&addr.into()).unwrap();
    socket.into()
}

/// Hundreds of idle sockets, from the requester's own address and from others, reopened
/// between requests, do not keep a subscriber that lost packets from its replay: the server
/// serves connections side by side and makes room by closing the oldest still waiting.
#[test]
fn replay_service_serves_every_request_beside_hundreds_of_idle_sockets() {
    let mut h = Harness::new(11, test_publisher_config());
    let mut sink = VecSink::default();
    for _ in 0..50 {
        h.step(20, &mut sink);
    }
    let last = h.publisher.next_seq(Channel::Orders) - 1;
    let server = ReplayServer::spawn(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        h.publisher.history(),
    )
    .unwrap();
    let addr = server.local_addr();
    let sources: Vec<Ipv4Addr> = (1..=20u8).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    let mut idle: Vec<std::net::TcpStream> = (0..400)
        .map(|i| idle_from(sources[i % sources.len()], addr))
        .collect();
    for round in 0..10 {
        // A wave of fresh idle sockets before each request, as a hostile client reopens them.
        for i in 0..60 {
            idle.push(idle_from(sources[(round + i) % sources.len()], addr));
        }
        let reply = replay::request(addr, 1, last, Duration::from_secs(10)).unwrap();
        assert_eq!(reply.status, ReplayStatus::Complete, "round {round}");
        assert_eq!(reply.packets.len(), last as usize, "round {round}");
    }
    let stats = server.stats();
    assert_eq!(
        stats.requests.load(std::sync::atomic::Ordering::Relaxed),
        10
    );
    assert!(
        stats.displaced.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the idle sockets were more than the server holds"
    );
    drop(idle);
}

#[test]
fn replay_service_refuses_ranges_past_its_bound_or_its_history() {
    let mut h = Harness::new(9, test_publisher_config());
    let mut sink = VecSink::default();
    for _ in 0..200 {
        h.step(20, &mut sink);
    }
    let last = h.publisher.next_seq(Channel::Orders) - 1;
    let server = ReplayServer::spawn(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        h.publisher.history(),
    )
    .unwrap();
    let t = Duration::from_secs(2);
    let ok = replay::request(server.local_addr(), 1, last, t).unwrap();
    assert_eq!(ok.status, ReplayStatus::Complete);
    assert_eq!(ok.packets.len(), last as usize);
    let first = bourse_wire::market_data::parse_packet(&ok.packets[0]).unwrap();
    assert!(first
        .header
        .msg_flags
        .contains(bourse_wire::market_data::MsgFlags::POSS_DUP));
    let too_many = replay::request(server.local_addr(), 1, 10_001, t).unwrap();
    assert_eq!(too_many.status, ReplayStatus::TooManyRequested);
    assert!(too_many.packets.is_empty());
    let future = replay::request(server.local_addr(), last, 2, t).unwrap();
    assert_eq!(future.status, ReplayStatus::OutOfRange);
    let zero = replay::request(server.local_addr(), 1, 0, t).unwrap();
    assert_eq!(zero.status, ReplayStatus::InvalidRequest);
    // One client asking too often is throttled (the window is one second). A loaded machine
    // may spread the requests over more than one window, so the flood goes on (bounded)
    // until the throttle answers rather than for a fixed count.
    let mut throttled = false;
    for _ in 0..100 * replay::REQUESTS_PER_CLIENT_PER_S_MAX {
        let r = replay::request(server.local_addr(), 1, 1, t).unwrap();
        if r.status == ReplayStatus::Throttled {
            assert!(r.packets.is_empty());
            throttled = true;
            break;
        }
    }
    assert!(throttled, "a flood of requests is throttled");
}

#[test]
fn every_incremental_channel_has_its_own_bounded_replay_service() {
    let mut h = Harness::new(12, test_publisher_config());
    let mut sink = VecSink::default();
    for _ in 0..300 {
        h.step(20, &mut sink);
    }
    let server =
        ReplayServer::spawn_for(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), &h.publisher).unwrap();
    let t = Duration::from_secs(2);
    for c in [Channel::Trades, Channel::Book, Channel::Statistics] {
        let addr = server.local_addr_of(c).expect("served");
        let last = h.publisher.next_seq(c) - 1;
        assert!(last > 2, "{} published", c.name());
        let ok = replay::request(addr, 2, last - 1, t).unwrap();
        assert_eq!(ok.status, ReplayStatus::Complete, "{}", c.name());
        assert_eq!(ok.packets.len(), last as usize - 1);
        // The packets are the channel's own data packets (heartbeats carry no incremental
        // header and are never kept), resent as published with PossDupFlag.
        let published: Vec<&Vec<u8>> = sink
            .packets
            .iter()
            .filter(|(pc, p)| *pc == c && p[6] & 0x08 != 0)
            .map(|(_, p)| p)
            .collect();
        assert_eq!(published.len(), last as usize);
        for (got, want) in ok.packets.iter().zip(published.iter().skip(1)) {
            let p = bourse_wire::market_data::parse_packet(got).unwrap();
            assert!(p
                .header
                .msg_flags
                .contains(bourse_wire::market_data::MsgFlags::POSS_DUP));
            assert_eq!(
                got[8..],
                want[8..],
                "{}: same packet but for its flags",
                c.name()
            );
        }
        let too_many = replay::request(addr, 1, 10_001, t).unwrap();
        assert_eq!(too_many.status, ReplayStatus::TooManyRequested);
        assert!(too_many.packets.is_empty());
        let past = replay::request(addr, last, 2, t).unwrap();
        assert_eq!(past.status, ReplayStatus::OutOfRange);
        assert!(past.packets.is_empty());
    }
    assert_eq!(
        server.local_addr_of(Channel::Snapshot),
        None,
        "the loops have no replay"
    );
}

#[test]
fn a_replay_of_packets_no_longer_kept_is_refused_with_nothing_sent() {
    let config = bourse_marketdata::PublisherConfig {
        replay_history_packets: 20,
        ..test_publisher_config()
    };
    let mut h = Harness::new(13, config);
    let mut sink = VecSink::default();
    for _ in 0..300 {
        h.step(20, &mut sink);
    }
    let server =
        ReplayServer::spawn_for(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), &h.publisher).unwrap();
    let t = Duration::from_secs(2);
    for c in [Channel::Orders, Channel::Trades] {
        let addr = server.local_addr_of(c).unwrap();
        let last = h.publisher.next_seq(c) - 1;
        assert!(last > 40, "{} published {last}", c.name());
        let gone = replay::request(addr, 1, 10, t).unwrap();
        assert_eq!(gone.status, ReplayStatus::OutOfRange, "{}", c.name());
        assert!(gone.packets.is_empty());
        let kept = replay::request(addr, last - 19, 20, t).unwrap();
        assert_eq!(kept.status, ReplayStatus::Complete, "{}", c.name());
        assert_eq!(kept.packets.len(), 20);
    }
}

/// Runs inside the namespace made by `multicast_feed_inside_a_private_network_namespace`.
fn multicast_inner() {
    let addrs = FeedAddrs::on(
        Ipv4Addr::new(239, 192, 77, 1),
        Ipv4Addr::new(239, 192, 77, 2),
        32_000,
    );
    let sub = UdpSubscriber::bind(&addrs, &[], SubscriberConfig::default(), true).unwrap();
    run_over_udp(addrs, SendRoutes::loopback(), sub, 1_000);
}

#[test]
fn multicast_feed_inside_a_private_network_namespace() {
    if std::env::var_os("BOURSE_MD_NETNS_INNER").is_some() {
        return multicast_inner();
    }
    let ns = format!("bourse-md-test-{}", std::process::id());
    let add = Command::new("ip").args(["netns", "add", &ns]).output();
    match add {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!(
                "SKIPPED multicast test: `ip netns add` failed (needs root): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("SKIPPED multicast test: `ip` is not available: {e}");
            return;
        }
    }
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _cleanup = Cleanup(ns.clone());
    for args in [
        vec!["link", "set", "lo", "up"],
        vec!["link", "set", "lo", "multicast", "on"],
        vec!["route", "add", "224.0.0.0/4", "dev", "lo"],
    ] {
        let st = Command::new("ip")
            .arg("-n")
            .arg(&ns)
            .args(&args)
            .status()
            .unwrap();
        assert!(st.success(), "ip -n {ns} {args:?}");
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(exe)
        .args([
            // The test's full name in the `it` binary, module path included.
            "udp::multicast_feed_inside_a_private_network_namespace",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BOURSE_MD_NETNS_INNER", "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "inner test failed:\n{text}");
    assert!(text.contains("1 passed"), "inner test did not run:\n{text}");
}

#[test]
fn recorded_pcap_opens_in_tshark_with_every_packet() {
    let mut h = Harness::new(13, test_publisher_config());
    let mut sink = VecSink::default();
    for _ in 0..100 {
        h.step(10, &mut sink);
    }
    let addrs = FeedAddrs::localhost(31_400);
    let path = std::env::temp_dir().join(format!("bourse-md-{}.pcap", std::process::id()));
    let mut w = PcapWriter::new(std::io::BufWriter::new(
        std::fs::File::create(&path).unwrap(),
    ))
    .unwrap();
    let src = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40_000);
    for (i, (c, p)) in sink.packets.iter().enumerate() {
        w.write_udp(
            T0_NS + i as u64 * 1_000,
            src,
            addrs.channels[c.index()].a,
            p,
        )
        .unwrap();
    }
    w.flush().unwrap();
    let written = w.packets;
    drop(w);
    let tshark = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&path)
        .args(["-T", "fields", "-e", "udp.dstport"])
        .output();
    let _ = std::fs::remove_file(&path);
    match tshark {
        Err(e) => eprintln!(
            "SKIPPED tshark check: tshark not installed ({e}); run scripts/install-test-tools.sh"
        ),
        Ok(o) => {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let lines = String::from_utf8_lossy(&o.stdout).lines().count() as u64;
            assert_eq!(lines, written, "tshark read every packet");
        }
    }
}

/// Feeds on one host go to the loopback broadcast address by default, so two readers of the
/// same ports (the venue's subscriber and `bourse md record`, say) each get every datagram;
/// to 127.0.0.1 the kernel would give each datagram to one of them.
#[test]
fn two_readers_of_the_default_feed_each_get_every_packet() {
    use bourse_marketdata::udp::{bind_receiver, LOOPBACK_BROADCAST};
    let (first, addrs) = UdpSubscriber::bind_ephemeral(SubscriberConfig::default()).unwrap();
    drop(first);
    assert_eq!(*addrs.channels[0].a.ip(), LOOPBACK_BROADCAST);
    let target = addrs.channels[Channel::Orders.index()].a;
    let readers = [
        bind_receiver(target).unwrap(),
        bind_receiver(target).unwrap(),
    ];
    let mut sink = UdpSink::new(addrs).unwrap();
    const PACKETS: usize = 200;
    for i in 0..PACKETS {
        sink.send(Channel::Orders, &(i as u32).to_le_bytes());
    }
    assert_eq!(sink.send_errors, 0);
    for r in &readers {
        r.set_nonblocking(false).unwrap();
        // A hang guard only: loopback datagrams are already queued when send returns.
        r.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 16];
        for i in 0..PACKETS {
            let n = r.recv(&mut buf).expect("every packet reaches every reader");
            assert_eq!(&buf[..n], &(i as u32).to_le_bytes());
        }
    }
}

/// An ephemeral receiver's port is its own: Linux may hand one ephemeral UDP port to two
/// sockets that both set SO_REUSEADDR, and a CI run once drew a subscriber whose two feeds
/// shared a port. Many subscribers held at once never share one.
#[test]
fn ephemeral_receivers_never_share_a_port() {
    let mut seen = std::collections::BTreeSet::new();
    let mut held = Vec::new();
    for _ in 0..64 {
        let (sub, addrs) = UdpSubscriber::bind_ephemeral(SubscriberConfig::default()).unwrap();
        for c in &addrs.channels {
            for p in [c.a.port(), c.b.port()] {
                assert!(seen.insert(p), "ephemeral port {p} handed out twice");
            }
        }
        held.push(sub);
    }
}
