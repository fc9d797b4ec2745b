//! The ITCH projection of a recorded run, read back with an independent ITCH 5.0 parser
//! (`itchy`): the books it builds equal the core's, order for order; every trade's shares are
//! accounted for by executions; the Add Orders carry the core's order ids, sides, prices and
//! quantities; and bourse's own gap-filling consumer builds the same books.

mod common;

use bourse_core::{Event, OrderLogAction};
use bourse_itch::consumer::Consumer;
use bourse_itch::feed::FeedLimits;
use bourse_itch::project::REPLACEMENT_REF_BASE;
use common::*;
use std::collections::BTreeMap;

fn published(def: &bourse_core::Instrument) -> bool {
    def.price_scale <= 4
}

/// Compares one reading of the books with the engine's, instrument by instrument.
fn assert_books_equal_engine(
    rec: &Recording,
    books: &IndependentBooks,
    locate_of: impl Fn(u32) -> u16,
) {
    let mut compared = 0;
    for def in rec.defs.iter().filter(|d| published(d)) {
        let locate = locate_of(def.instrument.0);
        assert_eq!(
            books.stocks[&locate], def.symbol,
            "stock directory of {}",
            def.symbol
        );
        let ours = books.sorted(locate);
        let core = engine_shown(&rec.engine, def);
        let strip = |v: &[(u64, bourse_core::Side, u32, u32)]| -> Vec<_> {
            v.iter().map(|o| (o.1, o.2, o.3)).collect()
        };
        assert_eq!(strip(&ours), strip(&core), "book of {}", def.symbol);
        for (o, c) in ours.iter().zip(&core) {
            if o.0 < REPLACEMENT_REF_BASE {
                assert_eq!(o.0, c.0, "an order's first entry carries its order id");
            }
        }
        compared += core.len();
    }
    assert!(
        compared > 100,
        "the run left orders on the books ({compared})"
    );
}

#[test]
fn an_independent_itch_parser_rebuilds_the_core_books_from_the_projection() {
    let rec = record(7, 3_000);
    let (feed, packets) = itch_packets(&rec, FeedLimits::default());
    let stats = feed.stats();
    assert_eq!(
        stats.unknown_instrument + stats.unrepresentable,
        0,
        "{stats:?}"
    );
    assert_eq!(
        stats.instruments_refused, 2,
        "the two FX pairs have five decimals"
    );
    let mut books = IndependentBooks::default();
    let messages = messages_of(&packets);
    for (k, (seq, m)) in messages.iter().enumerate() {
        assert_eq!(
            *seq,
            k as u64 + 1,
            "sequence numbers are consecutive from 1"
        );
        books.apply(&itchy_decode(m));
    }
    assert_eq!(
        books.system_events,
        vec![
            itchy::EventCode::StartOfMessages,
            itchy::EventCode::EndOfMessages
        ]
    );
    assert_books_equal_engine(&rec, &books, |id| feed.projection().locate(id).unwrap());

    // Every trade of a published instrument is accounted for in full, under its trade id.
    let mut traded: BTreeMap<u64, u64> = BTreeMap::new();
    let scale_of: BTreeMap<u32, u8> = rec
        .defs
        .iter()
        .map(|d| (d.instrument.0, d.price_scale))
        .collect();
    for e in rec.batches.iter().flatten() {
        if let Event::Trade {
            trade_id,
            instrument,
            qty,
            ..
        } = e
        {
            if scale_of[&instrument.0] <= 4 {
                traded.insert(trade_id.0, qty.0 as u64);
            }
        }
    }
    assert!(traded.len() > 100, "the run traded");
    assert_eq!(books.executed_by_match, traded);
}

#[test]
fn add_orders_carry_the_core_order_fields() {
    let rec = record(3, 1_000);
    let (feed, packets) = itch_packets(&rec, FeedLimits::default());
    // The core's first record of every order that rested, by order id.
    let mut entered = BTreeMap::new();
    for e in rec.batches.iter().flatten() {
        if let Event::OrderLog(l) = e {
            if l.action == OrderLogAction::New && l.qty_display.0 > 0 {
                entered.insert(l.order_id.0, *l);
            }
        }
    }
    let defs: BTreeMap<u32, _> = rec.defs.iter().map(|d| (d.instrument.0, d)).collect();
    let mut checked = 0;
    for (_, m) in messages_of(&packets) {
        let m = itchy_decode(&m);
        if let itchy::Body::AddOrder(a) = &m.body {
            if a.reference >= REPLACEMENT_REF_BASE {
                continue;
            }
            let l = entered
                .get(&a.reference)
                .expect("an Add Order names an order that rested");
            let def = defs[&l.instrument.0];
            assert_eq!(
                m.stock_locate,
                feed.projection().locate(def.instrument.0).unwrap()
            );
            assert_eq!(a.stock.trim_end(), def.symbol);
            assert_eq!(a.side == itchy::Side::Buy, l.side == bourse_core::Side::Buy);
            assert_eq!(a.price.raw(), itch_price(l.price.0, def.price_scale));
            assert_eq!(i64::from(a.shares), l.qty_display.0);
            assert_eq!(m.timestamp, l.ts_ns % 86_400_000_000_000);
            checked += 1;
        }
    }
    assert!(checked > 500, "{checked} Add Orders checked");
}

#[test]
fn bourse_consumer_builds_the_same_books_as_the_independent_reading() {
    let rec = record(11, 2_000);
    let (feed, packets) = itch_packets(&rec, FeedLimits::default());
    let mut c = Consumer::new(1 << 16);
    for p in &packets {
        c.on_datagram(p);
    }
    let s = c.stats();
    assert!(s.end_of_session && c.complete(), "{s:?}");
    assert_eq!(
        s.book_errors + s.malformed_messages + s.malformed_packets,
        0,
        "{s:?}"
    );
    let mut books = IndependentBooks::default();
    for (locate, stock) in c.stocks() {
        books.stocks.insert(
            *locate,
            String::from_utf8_lossy(&stock.stock).trim_end().to_string(),
        );
        let orders = stock
            .book
            .orders()
            .map(|o| (o.order_id, o.side, o.price as u32, o.qty as u32))
            .collect();
        books.orders.insert(*locate, orders);
    }
    assert_books_equal_engine(&rec, &books, |id| feed.projection().locate(id).unwrap());
}
