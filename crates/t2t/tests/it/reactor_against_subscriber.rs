//! The reacting client's logic checked against the market data library: the same capture
//! through the reactor and through `bourse_marketdata::Subscriber` gives the same books, every
//! best-ask change gives exactly one order at the new price, and bad packets are counted and
//! skipped without disturbing anything.

use bourse_core::Side;
use bourse_fix::decode;
use bourse_marketdata::{Channel, Feed, Subscriber, SubscriberConfig};
use bourse_t2t::gen::{synthetic, GenConfig, Sizes};
use bourse_t2t::order::{parse_price, OrderSpec};
use bourse_t2t::reactor::{Reactor, ReactorConfig};
use proptest::prelude::*;

fn capture(packets: usize, sizes: &str, seed: u64) -> Vec<Vec<u8>> {
    synthetic(&GenConfig {
        packets,
        instruments: 3,
        sizes: Sizes::parse(sizes).unwrap(),
        seed,
        ..GenConfig::default()
    })
    .unwrap()
}

fn reactor(price_scale: u8) -> Reactor {
    Reactor::new(ReactorConfig {
        order: OrderSpec {
            price_scale,
            ..OrderSpec::default()
        },
        ..ReactorConfig::default()
    })
    .unwrap()
}

/// The (security id, price) of every order in a reaction's output.
fn orders_of(out: &[u8], price_scale: u8) -> Vec<(u32, i64)> {
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
            parse_price(m.get(44).unwrap(), price_scale).unwrap(),
        ));
        rest = &rest[end..];
    }
    orders.sort_unstable();
    orders
}

fn best_asks(sub: &Subscriber) -> Vec<(u32, Option<i64>)> {
    sub.instruments()
        .map(|i| (i.id, i.book.best(Side::Sell).map(|l| l.price)))
        .collect()
}

#[test]
fn the_client_book_after_a_replay_equals_the_subscriber_book() {
    let packets = capture(3_000, "1-20", 11);
    let mut r = reactor(0);
    let mut sub = Subscriber::new(SubscriberConfig::default());
    for (k, p) in packets.iter().enumerate() {
        r.on_datagram(p, k as u64);
        sub.on_packet(Channel::Orders, Feed::A, p, k as u64);
    }
    assert_eq!(r.stats().updates_refused, 0);
    assert_eq!(sub.stats().skipped(), 0);
    let mut compared = 0;
    for inst in sub.instruments() {
        assert!(inst.live, "the subscriber follows every book");
        let theirs: Vec<_> = inst
            .book
            .orders()
            .map(|o| (o.order_id, o.side, o.price, o.qty))
            .collect();
        assert_eq!(
            r.books().orders_of(inst.id),
            theirs,
            "instrument {}",
            inst.id
        );
        assert!(!theirs.is_empty());
        compared += 1;
    }
    assert_eq!(compared, 3);
}

#[test]
fn every_best_ask_change_produces_exactly_one_order_at_the_new_price() {
    let packets = capture(3_000, "1-20", 12);
    let mut r = reactor(2);
    let mut sub = Subscriber::new(SubscriberConfig::default());
    let (mut changes, mut orders) = (0, 0);
    for (k, p) in packets.iter().enumerate() {
        let before = best_asks(&sub);
        sub.on_packet(Channel::Orders, Feed::A, p, k as u64);
        let after = best_asks(&sub);
        let mut want: Vec<(u32, i64)> = after
            .iter()
            .filter_map(|&(id, now)| {
                let was = before.iter().find(|b| b.0 == id).and_then(|b| b.1);
                now.filter(|&p| was != Some(p)).map(|p| (id, p))
            })
            .collect();
        want.sort_unstable();
        let reaction = r.on_datagram(p, 1_700_000_000_000_000_000 + k as u64);
        let got = orders_of(r.out(), 2);
        assert_eq!(got, want, "packet {k}");
        assert_eq!(usize::from(reaction.orders), got.len());
        changes += want.len();
        orders += got.len();
    }
    assert_eq!(changes, orders);
    assert!(
        changes > 100,
        "the capture moves the best ask often ({changes})"
    );
    assert_eq!(r.stats().orders, orders as u64);
}

#[test]
fn orders_carry_consecutive_sequence_numbers_and_client_order_ids() {
    let packets = capture(500, "1-8", 13);
    let mut r = reactor(0);
    let mut seqs = Vec::new();
    for p in &packets {
        r.on_datagram(p, 0);
        let mut rest = r.out();
        while !rest.is_empty() {
            let end = rest.windows(4).position(|w| w == b"\x0110=").unwrap() + 8;
            let m = decode(&rest[..end], None, 4096).unwrap();
            seqs.push((m.get_u64(34).unwrap(), m.get_u64(11).unwrap()));
            rest = &rest[end..];
        }
    }
    assert!(!seqs.is_empty());
    for (k, &(seq, cl)) in seqs.iter().enumerate() {
        assert_eq!((seq, cl), (k as u64 + 2, k as u64 + 1));
    }
}

/// Damaged copies of a packet, one per way a datagram can be wrong.
fn damaged(p: &[u8]) -> Vec<(Vec<u8>, &'static str)> {
    let mut size_lie = p.to_vec();
    size_lie[4] = size_lie[4].wrapping_add(1);
    let mut future = p.to_vec();
    future[28 + 6] = 99; // the first message's schema version
    let mut schema = p.to_vec();
    schema[28 + 4] = 7; // the first message's schema id
    let mut template = p.to_vec();
    template[28 + 2] = 200; // the first message's template id
    vec![
        (p[..p.len() - 5].to_vec(), "truncated"),
        (p[..10].to_vec(), "truncated"),
        (size_lie, "truncated"),
        (future, "future_version"),
        (schema, "wrong_schema"),
        (template, "unknown_template"),
        (Vec::new(), "truncated"),
    ]
}

#[test]
fn malformed_and_truncated_packets_are_counted_and_skipped() {
    let packets = capture(1_000, "1-16", 14);
    let mut clean = reactor(0);
    let mut dirty = reactor(0);
    let mut inserted = std::collections::BTreeMap::<&str, u64>::new();
    for (k, p) in packets.iter().enumerate() {
        if k % 50 == 7 {
            for (bad, kind) in damaged(p) {
                let reaction = dirty.on_datagram(&bad, 0);
                assert_eq!(reaction.orders, 0, "a refused packet causes no order");
                *inserted.entry(kind).or_default() += 1;
            }
        }
        clean.on_datagram(p, 0);
        dirty.on_datagram(p, 0);
    }
    let s = dirty.stats();
    assert_eq!(s.truncated, inserted["truncated"]);
    assert_eq!(s.future_version, inserted["future_version"]);
    assert_eq!(s.wrong_schema, inserted["wrong_schema"]);
    assert_eq!(s.unknown_template, inserted["unknown_template"]);
    assert_eq!(s.orders, clean.stats().orders);
    for id in 1001..1004 {
        assert_eq!(dirty.books().orders_of(id), clean.books().orders_of(id));
    }
}

#[test]
fn a_copy_of_an_applied_packet_is_a_duplicate() {
    let packets = capture(100, "1-4", 15);
    let mut r = reactor(0);
    for p in &packets {
        r.on_datagram(p, 0);
        let again = r.on_datagram(p, 0);
        assert_eq!(again.orders, 0);
    }
    assert_eq!(r.stats().duplicates, 100);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever a packet's bytes are changed to, the reactor neither panics nor loses count.
    #[test]
    fn any_damage_to_packets_never_panics(
        edits in proptest::collection::vec((0usize..400, 0usize..200, any::<u8>()), 1..40),
    ) {
        let packets = capture(400, "1-20", 16);
        let mut r = reactor(0);
        for (k, p) in packets.iter().enumerate() {
            let mut p = p.clone();
            for &(pk, at, byte) in &edits {
                if pk == k && at < p.len() {
                    p[at] = byte;
                }
            }
            if edits.iter().any(|&(pk, at, _)| pk == k && at == 0) {
                p.truncate(p.len() / 2);
            }
            r.on_datagram(&p, 0);
        }
        prop_assert_eq!(r.stats().packets, 400);
    }
}
