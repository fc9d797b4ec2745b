//! The feed over loopback UDP: a request server answers a range with exactly those messages
//! and refuses, visibly (counted by reason), what left its window; a gap-filling consumer that
//! loses live packets ends, after requesting them again, with the same books as bourse's own
//! SBE subscriber fed the same run.

use crate::common;

use bourse_core::Side;
use bourse_itch::feed::FeedLimits;
use bourse_itch::mold::{session_of, Packet, PacketHeader};
use bourse_itch::net::{run_consumer, ConsumerLimits, ServeConfig, UdpFeed};
use bourse_marketdata::{
    Feed as AB, Publisher, PublisherConfig, Subscriber, SubscriberConfig, VecSink,
};
use common::*;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

fn serve_config(dest: SocketAddr, window_messages: usize) -> ServeConfig {
    ServeConfig {
        session: session_of("RT1").unwrap(),
        dest,
        request_listen: "127.0.0.1:0".parse().unwrap(),
        limits: FeedLimits {
            window_messages,
            ..FeedLimits::default()
        },
        heartbeat_ms: 1_000,
        default_price_scale: 4,
    }
}

fn request(socket: &UdpSocket, server: SocketAddr, sequence: u64, count: u16) {
    let mut r = Vec::new();
    PacketHeader {
        session: session_of("RT1").unwrap(),
        sequence,
        count,
    }
    .encode(&mut r);
    socket.send_to(&r, server).unwrap();
}

/// Waits (bounded) for a condition on the feed's report.
fn wait_for(feed: &UdpFeed, what: &str, ok: impl Fn(&bourse_itch::net::FeedReport) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok(&feed.report()) {
        assert!(Instant::now() < deadline, "{what}: {:?}", feed.report());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_request_gets_exactly_the_messages_asked_for_and_out_of_window_is_refused() {
    let rec = record(9, 300);
    let listener = UdpSocket::bind("127.0.0.1:0").unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let window = 2_000;
    let mut feed = UdpFeed::start(&serve_config(listener.local_addr().unwrap(), window)).unwrap();
    for def in &rec.defs {
        feed.define(def);
    }
    for b in &rec.batches {
        feed.publish(b);
    }
    // What was sent, as the in-process feed numbers it: the same run through `Feed` gives the
    // same messages (the stock directory and system events carry a different clock).
    let next = feed.report().next_sequence;
    assert!(
        next > window as u64 + 100,
        "the run overflows the window ({next})"
    );
    let (_, packets) = itch_packets(&rec, FeedLimits::default());
    let sent = messages_of(&packets);
    let asker = UdpSocket::bind("127.0.0.1:0").unwrap();
    asker
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let server = feed.request_addr();
    let first = next - 50;
    request(&asker, server, first, 7);
    let mut buf = [0u8; 2048];
    let (n, from) = asker.recv_from(&mut buf).unwrap();
    assert_eq!(from, server);
    let p = Packet::parse(&buf[..n]).unwrap();
    let got: Vec<_> = p.messages().map(|(s, m)| (s, m.to_vec())).collect();
    let want: Vec<_> = sent[(first - 1) as usize..(first + 6) as usize].to_vec();
    assert_eq!(got, want, "exactly the seven messages asked for");

    request(&asker, server, 1, 5);
    wait_for(&feed, "the out-of-window request is counted", |r| {
        r.requests.too_old == 1
    });
    request(&asker, server, next + 10, 5);
    wait_for(&feed, "the future request is counted", |r| {
        r.requests.not_yet_sent == 1
    });
    let report = feed.stop();
    assert_eq!(report.requests.answered, 1);
    assert_eq!(report.requests.messages_resent, 7);
}

/// Per instrument id, the orders as bourse's SBE subscriber holds them, in ITCH's units.
type Books = Vec<(u32, Vec<(Side, u32, u32)>)>;

fn subscriber_books(rec: &Recording) -> Books {
    let mut publisher = Publisher::new(PublisherConfig::default(), &rec.defs);
    let mut sub = Subscriber::new(SubscriberConfig::default());
    let mut sink = VecSink::default();
    let mut now = T0_NS;
    for b in &rec.batches {
        now += 1_000_000;
        publisher.publish(b, now, &mut sink);
        publisher.tick(now, &mut sink);
        for (c, p) in sink.packets.drain(..) {
            sub.on_packet(c, AB::A, &p, now);
        }
    }
    assert_eq!(sub.stats().gaps_detected, 0);
    rec.defs
        .iter()
        .filter(|d| d.price_scale <= 4)
        .map(|d| {
            let book = sub
                .book(d.instrument.0)
                .expect("the subscriber follows every book");
            let mut bids: Vec<_> = book
                .side_orders(Side::Buy)
                .map(|o| (o.side, itch_price(o.price, d.price_scale), o.qty as u32))
                .collect();
            let asks: Vec<_> = book
                .side_orders(Side::Sell)
                .map(|o| (o.side, itch_price(o.price, d.price_scale), o.qty as u32))
                .collect();
            bids.extend(asks);
            (d.instrument.0, bids)
        })
        .collect()
}

#[test]
fn a_consumer_that_loses_packets_fills_the_gaps_and_ends_with_the_subscriber_books() {
    let rec = record(13, 1_500);
    let consumer_socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dest = consumer_socket.local_addr().unwrap();
    let mut feed = UdpFeed::start(&serve_config(dest, 1 << 20)).unwrap();
    let server = feed.request_addr();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = {
        let done = done.clone();
        std::thread::spawn(move || {
            let limits = ConsumerLimits {
                deadline_ms: 60_000,
                ..ConsumerLimits::default()
            };
            // Every fifth live packet is lost.
            let r = run_consumer(&consumer_socket, server, limits, |k, _| {
                k.is_none_or(|k| k % 5 != 0)
            });
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            r
        })
    };
    for def in &rec.defs {
        feed.define(def);
    }
    for b in &rec.batches {
        feed.publish(b);
    }
    feed.end();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
        feed.repeat_end_of_session();
        std::thread::sleep(Duration::from_millis(20));
    }
    let (c, requests) = consumer.join().unwrap().unwrap();
    let report = feed.stop();
    let s = c.stats();
    assert!(s.end_of_session && c.complete(), "{s:?} {report:?}");
    assert!(
        s.gaps_detected > 0 && requests > 0,
        "packets were lost and asked for: {s:?}"
    );
    assert!(report.requests.messages_resent > 0, "{report:?}");
    assert_eq!(
        s.book_errors + s.malformed_messages + s.malformed_packets,
        0,
        "{s:?}"
    );
    for (id, want) in subscriber_books(&rec) {
        let locate = rec.defs.iter().position(|d| d.instrument.0 == id).unwrap() as u16 + 1;
        let book = &c.stocks()[&locate].book;
        let mut got: Vec<_> = book
            .side_orders(Side::Buy)
            .map(|o| (o.side, o.price as u32, o.qty as u32))
            .collect();
        got.extend(
            book.side_orders(Side::Sell)
                .map(|o| (o.side, o.price as u32, o.qty as u32)),
        );
        assert!(!want.is_empty());
        assert_eq!(got, want, "book of instrument {id}");
    }
}
