//! The driver and the reference client end to end over loopback: every order the reference
//! model expects arrives, right, and nothing else; both directions written as a pcap that
//! tshark decodes (when tshark is installed, as scripts/install-test-tools.sh does).

use bourse_marketdata::pcap::PcapWriter;
use bourse_t2t::capture::parse_pcap;
use bourse_t2t::client::{bind_feed, run_client, ClientConfig};
use bourse_t2t::driver::{drive, prepare, write_pcap, DriveConfig};
use bourse_t2t::gen::{synthetic, GenConfig, Sizes};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::sync::atomic::AtomicBool;

fn capture_bytes(packets: &[Vec<u8>], port: u16) -> Vec<u8> {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let src = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40_000);
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    for (k, p) in packets.iter().enumerate() {
        w.write_udp(k as u64 * 1_000, src, dst, p).unwrap();
    }
    // A datagram to another port (feed B, say) is left out of the replay.
    w.write_udp(
        0,
        src,
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, port + 1),
        &packets[0],
    )
    .unwrap();
    w.into_inner()
}

#[test]
fn every_expected_order_arrives_right_and_nothing_else() {
    let mut packets = synthetic(&GenConfig {
        packets: 400,
        instruments: 3,
        sizes: Sizes::parse("1-20").unwrap(),
        ..GenConfig::default()
    })
    .unwrap();
    // A truncated packet in the middle: the client counts it and carries on.
    let cut = packets[200][..20].to_vec();
    packets.insert(200, cut);
    let capture = parse_pcap(&capture_bytes(&packets, 31_400)).unwrap();
    let replay = prepare(
        &capture,
        bourse_t2t::FeedFormat::Sbe,
        None,
        usize::MAX,
        1472,
    )
    .unwrap();
    assert_eq!(replay.packets.len(), 401);
    assert!(replay.orders_expected() > 20);

    let feed = bind_feed(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let SocketAddr::V4(feed_addr) = feed.local_addr().unwrap() else {
        unreachable!()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = ClientConfig::new(listener.local_addr().unwrap());
    let stop = AtomicBool::new(false);
    let (report, client) = std::thread::scope(|s| {
        let client = s.spawn(|| run_client(&cfg, feed, &stop));
        let report = drive(
            &replay,
            &listener,
            &DriveConfig {
                timeout_ms: 20_000,
                keep_traffic: true,
                ..DriveConfig::new(feed_addr)
            },
        );
        (report, client.join().unwrap())
    });
    let report = report.unwrap();
    let client = client.unwrap();
    assert_eq!(report.packets_sent, 401);
    assert_eq!(report.orders_received, report.orders_expected);
    assert_eq!(report.orders_matching, report.orders_expected);
    assert_eq!(
        (report.packets_wrong, report.timeouts, report.undecodable),
        (0, 0, 0)
    );
    assert_eq!(report.t2t_ns.count, report.answered);
    assert_eq!(client.stats.orders, report.orders_expected);
    assert_eq!(client.stats.truncated, 1);
    assert_eq!(client.stats.packets, 401);
    assert_eq!(client.exit, "the FIX peer closed the connection");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("both.pcap");
    let records = write_pcap(&path, &replay, &report.traffic).unwrap();
    // Every packet, the Logon both ways, and one segment per answered packet.
    assert_eq!(records, 401 + 2 + report.answered);
    let back = parse_pcap(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        back.datagrams.len(),
        401,
        "the UDP side reads back; TCP is skipped"
    );
    tshark_sees_the_orders(
        &path,
        listener.local_addr().unwrap().port(),
        report.orders_expected,
    );
}

/// tshark's FIX dissector reads every order of the capture.
fn tshark_sees_the_orders(path: &std::path::Path, fix_port: u16, orders: u64) {
    let out = std::process::Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args([
            "-d",
            &format!("tcp.port=={fix_port},fix"),
            "-Y",
            "fix.MsgType == \"D\"",
            "-T",
            "fields",
            "-e",
            "fix.Price",
        ])
        .output();
    let Ok(out) = out else {
        eprintln!("tshark is not installed (scripts/install-test-tools.sh installs it): decode check skipped");
        return;
    };
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let prices: usize = text.lines().map(|l| l.split(',').count()).sum();
    assert_eq!(prices as u64, orders, "tshark output:\n{text}");
}

#[test]
fn an_itch_capture_replays_with_every_expected_order_right_and_nothing_else() {
    let mut packets = bourse_t2t::itch::synthetic(&GenConfig {
        packets: 400,
        instruments: 3,
        sizes: Sizes::parse("1-31").unwrap(),
        ..GenConfig::default()
    })
    .unwrap();
    // A truncated packet and a copy of an earlier one (as a retransmission recorded by
    // `bourse itch tail --pcap` replays): the client counts both and carries on.
    let cut = packets[200][..30].to_vec();
    packets.insert(200, cut);
    let copy = packets[100].clone();
    packets.insert(300, copy);
    let capture = parse_pcap(&capture_bytes(&packets, 26_400)).unwrap();
    let feed_format = bourse_t2t::FeedFormat::Itch;
    let replay = prepare(&capture, feed_format, None, usize::MAX, 1472).unwrap();
    assert_eq!(replay.packets.len(), 402);
    assert!(replay.orders_expected() > 20);

    let feed = bind_feed(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let SocketAddr::V4(feed_addr) = feed.local_addr().unwrap() else {
        unreachable!()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = ClientConfig::new(listener.local_addr().unwrap());
    cfg.reactor.feed = feed_format;
    let stop = AtomicBool::new(false);
    let (report, client) = std::thread::scope(|s| {
        let client = s.spawn(|| run_client(&cfg, feed, &stop));
        let report = drive(
            &replay,
            &listener,
            &DriveConfig {
                timeout_ms: 20_000,
                ..DriveConfig::new(feed_addr)
            },
        );
        (report, client.join().unwrap())
    });
    let report = report.unwrap();
    let client = client.unwrap();
    assert_eq!(report.orders_received, report.orders_expected);
    assert_eq!(report.orders_matching, report.orders_expected);
    assert_eq!(
        (report.packets_wrong, report.timeouts, report.undecodable),
        (0, 0, 0)
    );
    assert_eq!(client.stats.orders, report.orders_expected);
    assert_eq!(client.stats.truncated, 1);
    assert_eq!(client.stats.duplicates, 1);
    assert_eq!(client.stats.packets, 402);
}
