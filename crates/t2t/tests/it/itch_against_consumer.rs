//! The reacting client on ITCH 5.0 over MoldUDP64, checked against `bourse_itch`'s own
//! gap-filling consumer: a seeded engine run projected by `bourse_itch::feed::Feed` (the real
//! projection: adds, executions, cancels, replaces, iceberg refills, deletes) and a synthetic
//! capture both give the client the consumer's books; every best-ask change gives exactly one
//! order at the new price (Price(4)) with the stock's symbol; damaged, foreign and repeated
//! packets are counted and skipped without disturbing anything.

use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig, Rng};
use bourse_engine::{Engine, EngineConfig};
use bourse_fix::decode;
use bourse_itch::consumer::Consumer;
use bourse_itch::feed::{Feed, FeedLimits};
use bourse_itch::mold::{session_of, Packet, PacketHeader};
use bourse_t2t::gen::{GenConfig, Sizes};
use bourse_t2t::order::parse_price;
use bourse_t2t::reactor::{Reactor, ReactorConfig};
use bourse_t2t::FeedFormat;
use proptest::prelude::*;
use std::collections::BTreeMap;

const T0_NS: u64 = 1_763_700_000_000_000_000;

/// A seeded engine run over three markets, projected to ITCH packets batch by batch.
fn engine_capture(seed: u64, batches: usize) -> Vec<Vec<u8>> {
    let mut fc = FlowConfig::three_markets(200, seed);
    fc.live_orders_target = 1_500;
    let defs = fc.instruments.clone();
    let mut flow = Flow::new(fc);
    let mut engine = Engine::new(EngineConfig {
        orders_max: 1 << 16,
        instruments_max: 64,
        accounts_max: 10_000,
        levels_per_side_hint: 64,
        first_order_id: 1,
    });
    let mut feed = Feed::new(session_of("T2TTEST").unwrap(), FeedLimits::default(), 4).unwrap();
    let mut packets = Vec::new();
    let mut send = |p: &[u8]| packets.push(p.to_vec());
    feed.start(T0_NS, &mut send);
    for def in &defs {
        feed.define(def, T0_NS, &mut send);
    }
    let mut now_ns = T0_NS;
    let mut events = Vec::new();
    for body in flow.setup() {
        now_ns += 1_000;
        engine.apply(&Command::new(now_ns, body), &mut events);
    }
    feed.publish(&events, &mut send);
    let mut rng = Rng::new(seed ^ 0xABCD);
    for _ in 0..batches {
        let mut batch = Vec::new();
        for _ in 0..1 + rng.below(20) {
            now_ns += 2_000;
            let start = batch.len();
            engine.apply(&Command::new(now_ns, flow.next_command()), &mut batch);
            flow.observe(&batch[start..]);
        }
        feed.publish(&batch, &mut send);
    }
    feed.end(now_ns, &mut send);
    assert!(
        feed.stats().hidden_executions + feed.stats().messages > 0,
        "the run published"
    );
    packets
}

fn synthetic_capture(packets: usize, sizes: &str, seed: u64) -> Vec<Vec<u8>> {
    bourse_t2t::itch::synthetic(&GenConfig {
        packets,
        instruments: 3,
        sizes: Sizes::parse(sizes).unwrap(),
        seed,
        ..GenConfig::default()
    })
    .unwrap()
}

fn reactor() -> Reactor {
    Reactor::new(ReactorConfig {
        feed: FeedFormat::Itch,
        ..ReactorConfig::default()
    })
    .unwrap()
}

/// The (stock locate, price, symbol) of every order in a reaction's output.
fn orders_of(out: &[u8]) -> Vec<(u32, i64, String)> {
    let mut orders = Vec::new();
    let mut rest = out;
    while !rest.is_empty() {
        let end = rest
            .windows(4)
            .position(|w| w == b"\x0110=")
            .expect("a CheckSum ends every order")
            + 8;
        let m = decode(&rest[..end], None, 4096).expect("every order decodes");
        assert_eq!(m.msg_type(), b"D");
        orders.push((
            m.get_str(48).unwrap().parse().unwrap(),
            parse_price(m.get(44).unwrap(), 4).unwrap(),
            m.get_str(55).unwrap().to_string(),
        ));
        rest = &rest[end..];
    }
    orders.sort_unstable();
    orders
}

fn best_asks(c: &Consumer) -> BTreeMap<u16, Option<i64>> {
    c.stocks()
        .iter()
        .map(|(&locate, s)| (locate, s.book.best(Side::Sell).map(|l| l.price)))
        .collect()
}

fn symbols(c: &Consumer) -> BTreeMap<u16, String> {
    c.stocks()
        .iter()
        .map(|(&locate, s)| {
            let text = String::from_utf8_lossy(&s.stock).trim_end().to_string();
            (locate, text)
        })
        .collect()
}

/// Replays `packets` through the reactor and the consumer: per packet, the orders the client
/// sent must be one per stock whose best ask moved, at the new price, with its symbol. At the
/// end the books must be equal. Returns the orders sent.
fn replay_and_compare(packets: &[Vec<u8>]) -> (Reactor, u64) {
    let mut r = reactor();
    let mut c = Consumer::new(1 << 16);
    let mut orders = 0u64;
    for (k, p) in packets.iter().enumerate() {
        let before = best_asks(&c);
        c.on_datagram(p);
        let after = best_asks(&c);
        let names = symbols(&c);
        let mut want: Vec<(u32, i64, String)> = after
            .iter()
            .filter_map(|(&locate, &now)| {
                let was = before.get(&locate).copied().flatten();
                now.filter(|&p| was != Some(p))
                    .map(|p| (u32::from(locate), p, names[&locate].clone()))
            })
            .collect();
        want.sort_unstable();
        let reaction = r.on_datagram(p, T0_NS + k as u64);
        let got = orders_of(r.out());
        assert_eq!(got, want, "packet {k}");
        assert_eq!(usize::from(reaction.orders), got.len());
        orders += got.len() as u64;
    }
    assert!(c.complete(), "the consumer saw every message");
    assert_eq!(c.stats().book_errors, 0);
    assert_eq!(r.stats().updates_refused, 0);
    let mut compared = 0;
    for (&locate, stock) in c.stocks() {
        let theirs: Vec<_> = stock
            .book
            .orders()
            .map(|o| (o.order_id, o.side, o.price, o.qty))
            .collect();
        assert_eq!(
            r.books().orders_of(u32::from(locate)),
            theirs,
            "stock locate {locate}"
        );
        compared += usize::from(!theirs.is_empty());
    }
    assert!(compared >= 2, "books with orders were compared");
    assert_eq!(r.stats().orders, orders);
    (r, orders)
}

#[test]
fn an_engine_run_through_the_projection_gives_the_client_the_consumer_books_and_one_order_per_ask_change(
) {
    let packets = engine_capture(21, 1_500);
    let (r, orders) = replay_and_compare(&packets);
    assert!(orders > 50, "the run moved the best ask often ({orders})");
    assert!(r.stats().heartbeats >= 1, "the end of session is counted");
}

#[test]
fn a_synthetic_capture_of_1_to_31_messages_gives_the_consumer_books_and_one_order_per_ask_change() {
    let packets = synthetic_capture(3_000, "1-31", 5);
    let (_, orders) = replay_and_compare(&packets);
    assert!(orders > 100);
}

/// A packet of `messages` (raw ITCH bytes) at `sequence` in `session`.
fn packet(session: &[u8; 10], sequence: u64, messages: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketHeader {
        session: *session,
        sequence,
        count: messages.len() as u16,
    }
    .encode(&mut out);
    for m in messages {
        out.extend_from_slice(&(m.len() as u16).to_be_bytes());
        out.extend_from_slice(m);
    }
    out
}

#[test]
fn damaged_foreign_and_repeated_packets_are_counted_and_skipped() {
    let packets = synthetic_capture(1_500, "1-20", 6);
    let session = Packet::parse(&packets[0]).unwrap().header.session;
    let mut clean = reactor();
    let mut r = reactor();
    let mut extra = 0u64;
    for (k, p) in packets.iter().enumerate() {
        clean.on_datagram(p, T0_NS);
        if k > 0 && k % 50 == 0 {
            // Damage before the real packet: cut in a block, only a header's worth, bytes
            // after the last block, another session's copy, the previous packet again.
            let cut = &p[..p.len() - 3];
            let mut trailing = p.clone();
            trailing.push(0);
            let mut foreign = p.clone();
            foreign[..10].copy_from_slice(b"OTHER     ");
            for bad in [cut, &p[..12], &trailing, &foreign, &packets[k - 1], &[][..]] {
                assert_eq!(r.on_datagram(bad, T0_NS).orders, 0);
                extra += 1;
            }
        }
        r.on_datagram(p, T0_NS);
    }
    let s = r.stats();
    let damaged = (packets.len() as u64 - 1) / 50;
    assert_eq!(s.truncated, damaged * 3, "cut, header-only and empty");
    assert_eq!(s.malformed, damaged, "trailing bytes");
    assert_eq!(s.other_session, damaged);
    assert_eq!(s.duplicates, damaged);
    assert_eq!(s.packets, packets.len() as u64 + extra);
    assert_eq!(s.orders, clean.stats().orders);
    assert_eq!(s.updates_applied, clean.stats().updates_applied);
    for inst in clean.books().instruments() {
        assert_eq!(
            r.books().orders_of(inst.security_id),
            clean.books().orders_of(inst.security_id)
        );
    }

    // Inside a well-framed packet: a message type bourse does not publish and an Add with a
    // bad side are counted; the Add after them is applied and moves the best ask.
    let add = |order_ref: u64, side: u8, price: u32| {
        let mut m = vec![b'A', 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];
        m.extend_from_slice(&order_ref.to_be_bytes());
        m.push(side);
        m.extend_from_slice(&10u32.to_be_bytes());
        m.extend_from_slice(b"T2T1    ");
        m.extend_from_slice(&price.to_be_bytes());
        m
    };
    let mut fresh = reactor();
    let next = 1;
    let p = packet(
        &session,
        next,
        &[b"Zjunk", &add(7, b'Q', 5_000), &add(8, b'S', 1_234_500)],
    );
    let reaction = fresh.on_datagram(&p, T0_NS);
    assert_eq!(fresh.stats().unknown_template, 1);
    assert_eq!(fresh.stats().malformed_messages, 1);
    assert_eq!(reaction.orders, 1);
    assert_eq!(orders_of(fresh.out()), vec![(1, 1_234_500, "T2T1".into())]);
    // A packet overlapping what was applied is applied from the next number on; one past a
    // gap is followed and the gap counted.
    let p2 = packet(&session, 3, &[&add(8, b'S', 1), &add(9, b'S', 1_234_400)]);
    assert_eq!(fresh.on_datagram(&p2, T0_NS).orders, 1);
    assert_eq!(
        fresh.stats().updates_refused,
        0,
        "order 8 was not added twice"
    );
    let p3 = packet(&session, 10, &[&add(10, b'S', 1_234_300)]);
    assert_eq!(fresh.on_datagram(&p3, T0_NS).orders, 1);
    assert_eq!(fresh.stats().gaps, 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Random damage to real packets never panics the client, and never makes an order
    /// out of a packet it refused.
    #[test]
    fn random_damage_never_panics(
        flips in proptest::collection::vec((0usize..200, 0usize..2000, any::<u8>()), 1..40),
        cut in proptest::collection::vec((0usize..200, 0usize..2000), 0..10),
    ) {
        let mut packets = synthetic_capture(200, "1-20", 8);
        for (k, at, v) in flips {
            let p = &mut packets[k];
            let i = at % p.len();
            p[i] = v;
        }
        for (k, at) in cut {
            // A packet may be cut twice; one already cut to nothing stays empty.
            let p = &mut packets[k];
            let keep = at % (p.len() + 1);
            p.truncate(keep);
        }
        let mut r = reactor();
        for p in &packets {
            let reaction = r.on_datagram(p, T0_NS);
            if Packet::parse(p).is_err() {
                prop_assert_eq!(reaction.orders, 0);
            }
        }
        prop_assert_eq!(r.stats().packets, 200);
    }
}

#[test]
fn a_client_that_joins_after_the_stock_directory_names_stocks_from_their_add_orders() {
    let packets = synthetic_capture(1_000, "1-20", 9);
    let mut r = reactor();
    let mut orders = Vec::new();
    // The first packets (Start of Messages and the stock directory) were missed.
    for p in &packets[50..] {
        r.on_datagram(p, T0_NS);
        orders.extend(orders_of(r.out()));
    }
    assert!(orders.len() > 20);
    let unnamed: Vec<_> = orders
        .iter()
        .filter(|(locate, _, symbol)| *symbol != format!("T2T{locate}"))
        .collect();
    // A best ask moves only once an order of the stock is known, and an order becomes known
    // by its Add Order, which carries the stock: no order goes out by number.
    assert!(unnamed.is_empty(), "{unnamed:?}");
}
