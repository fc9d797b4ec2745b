//! The ITCH projection of a recorded run, read back with an independent ITCH 5.0 parser
//! (`itchy`): the books it builds equal the core's, order for order; every trade's shares are
//! accounted for by executions; the Add Orders carry the core's order ids, sides, prices and
//! quantities; and bourse's own gap-filling consumer builds the same books.

use crate::common;

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

#[test]
fn a_load_run_exercises_every_message_kind() {
    let rec = record(7, 3_000);
    let (_, packets) = itch_packets(&rec, FeedLimits::default());
    let mut kinds = BTreeMap::new();
    for (_, m) in messages_of(&packets) {
        *kinds.entry(m[0] as char).or_insert(0u64) += 1;
    }
    for k in ['S', 'R', 'A', 'E', 'D', 'U'] {
        assert!(
            kinds.get(&k).copied().unwrap_or(0) > 0,
            "no '{k}' in {kinds:?}"
        );
    }
}

/// A hand-written day: a replace that lowers the quantity (priority kept: Order Cancel), one
/// that moves the price (Order Replace with a new reference), an iceberg traded through its
/// refills (Order Executed, then Add Order under a new reference), and a cancel (Order
/// Delete); decoded by `itchy`, message for message.
#[test]
fn replaces_icebergs_and_cancels_become_cancel_replace_trade_and_delete() {
    use bourse_core::*;
    use bourse_engine::fixtures::{accepted_id, equity, Driver};
    use bourse_itch::feed::Feed;
    use bourse_itch::mold::session_of;
    let mut d = Driver::new(bourse_engine::EngineConfig::default());
    let def = equity(1, "SBER", 30_000);
    d.add_instrument(def.clone());
    d.add_account(1, 1, 1_000_000_000_0000);
    let seller = AccountSpec {
        account: AccountId(2),
        firm: FirmId(2),
        may_short: true,
        stp: StpMode::None,
        stp_scope: StpScope::Account,
    };
    d.add_account_spec(seller, 1_000_000_000_0000);
    let mut feed = Feed::new(session_of("S").unwrap(), FeedLimits::default(), 4).unwrap();
    let mut packets = Vec::new();
    let mut send = |p: &[u8]| packets.push(p.to_vec());
    feed.define(&def, d.ts_ns, &mut send);
    let mut step = |d: &mut Driver, body: CommandBody, send: &mut dyn FnMut(&[u8])| {
        let ev = d.run(body).to_vec();
        feed.publish(&ev, send);
        ev
    };
    let new = |cl: u64, side, price, qty, display| {
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(if side == Side::Buy { 1 } else { 2 }),
            cl_ord_id: ClOrdId(cl),
            instrument: InstrumentId(1),
            side,
            ord_type: OrdType::Limit,
            price: Price(price),
            qty: Qty(qty),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(display),
        })
    };
    let ev = step(&mut d, new(1, Side::Buy, 29_900, 100, 0), &mut send);
    let bid = accepted_id(&ev).unwrap_or_else(|| panic!("{ev:?}"));
    let replace = |cl: u64, id: OrderId, price: Option<i64>, qty: Option<i64>| {
        CommandBody::Replace(Replace {
            account: AccountId(1),
            cl_ord_id: ClOrdId(cl),
            target: OrderRef {
                order_id: Some(id),
                orig_cl_ord_id: None,
            },
            price: price.map(Price),
            qty: qty.map(Qty),
        })
    };
    step(&mut d, replace(2, bid, None, Some(60)), &mut send);
    step(&mut d, replace(3, bid, Some(29_950), None), &mut send);
    let ice = accepted_id(&step(&mut d, new(4, Side::Sell, 30_100, 50, 10), &mut send)).unwrap();
    step(&mut d, new(5, Side::Buy, 30_100, 25, 0), &mut send);
    step(
        &mut d,
        CommandBody::Cancel(Cancel {
            account: AccountId(1),
            cl_ord_id: ClOrdId(6),
            target: OrderRef {
                order_id: Some(bid),
                orig_cl_ord_id: None,
            },
        }),
        &mut send,
    );
    let got: Vec<itchy::Body> = messages_of(&packets)
        .iter()
        .map(|(_, m)| itchy_decode(m).body)
        .collect();
    use itchy::Body as B;
    let price = |p: i64| itch_price(p, 2);
    let mut k = 0;
    let mut next = || {
        k += 1;
        got[k].clone()
    };
    // got[0] is the stock directory.
    assert!(matches!(got[0], B::StockDirectory(_)));
    assert!(
        matches!(next(), B::AddOrder(a) if a.reference == bid.0 && a.shares == 100 && a.price.raw() == price(29_900))
    );
    assert!(matches!(next(), B::OrderCancelled { reference, cancelled: 40 } if reference == bid.0));
    let B::ReplaceOrder(r) = next() else {
        panic!("{got:?}")
    };
    assert_eq!(
        (r.old_reference, r.shares, r.price.raw()),
        (bid.0, 60, price(29_950))
    );
    assert!(r.new_reference >= REPLACEMENT_REF_BASE);
    assert!(
        matches!(next(), B::AddOrder(a) if a.reference == ice.0 && a.shares == 10 && a.side == itchy::Side::Sell)
    );
    // 25 bought from the iceberg: the core trades it a shown slice at a time (10, 10, 5),
    // each refill entering the book anew (a new reference at the back of the queue).
    let mut shown_ref = ice.0;
    for (n, executed) in [10, 10, 5].into_iter().enumerate() {
        let B::OrderExecuted {
            reference,
            executed: e,
            match_number,
        } = next()
        else {
            panic!("{got:?}")
        };
        assert_eq!(
            (reference, e, match_number),
            (shown_ref, executed, n as u64 + 1)
        );
        if n < 2 {
            let B::AddOrder(a) = next() else {
                panic!("{got:?}")
            };
            assert!(
                a.reference >= REPLACEMENT_REF_BASE && a.shares == 10,
                "{a:?}"
            );
            shown_ref = a.reference;
        }
    }
    assert!(matches!(next(), B::DeleteOrder { reference } if reference == r.new_reference));
    assert_eq!(k + 1, got.len(), "{got:?}");
}

#[test]
fn an_instrument_added_at_run_time_gets_its_stock_directory_from_its_event() {
    use bourse_core::*;
    use bourse_engine::fixtures::{equity, Driver};
    use bourse_itch::msg::{Body, Message};
    use bourse_itch::project::Projection;
    let mut d = Driver::new(bourse_engine::EngineConfig::default());
    let mut projection = Projection::new(4);
    let mut out: Vec<Message> = Vec::new();
    // Defined at start, then added: one directory entry, not two.
    let sber = equity(1, "SBER", 30_000);
    projection.define(&sber, d.ts_ns, &mut out);
    let ev = d.run(CommandBody::AddInstrument(sber)).to_vec();
    projection.on_events(&ev, &mut out);
    // Added while the feed runs, with nothing defined beforehand: its event defines it.
    let ev = d
        .run(CommandBody::AddInstrument(equity(2, "GAZP", 16_000)))
        .to_vec();
    projection.on_events(&ev, &mut out);
    let stocks: Vec<[u8; 8]> = out
        .iter()
        .filter_map(|m| match &m.body {
            Body::StockDirectory(dir) => Some(dir.stock),
            _ => None,
        })
        .collect();
    assert_eq!(stocks, vec![*b"SBER    ", *b"GAZP    "]);
    assert_eq!(projection.locate(2), Some(2));
}

/// A day with an opening auction, read by `itchy`: NOII while the books are called, each
/// executed order's non-printable Order Executed With Price at the uncrossing, one Cross Trade
/// per instrument with every share of it, and the books the core's after it; bourse's own
/// consumer agrees.
#[test]
fn an_uncrossing_is_published_as_noii_executions_with_price_and_a_cross_trade() {
    use bourse_core::Phase;
    let rec = record_phases(
        5,
        &[
            (None, 1_000),
            (Some(Phase::OpeningAuction), 1_500),
            (Some(Phase::Open), 500),
        ],
    );
    let (feed, packets) = itch_packets(&rec, FeedLimits::default());
    let mut books = IndependentBooks::default();
    for (_, m) in messages_of(&packets) {
        books.apply(&itchy_decode(&m));
    }
    assert_books_equal_engine(&rec, &books, |id| feed.projection().locate(id).unwrap());

    // What the core said of the uncrossing, per published instrument.
    let mut uncrossed: BTreeMap<u32, (i64, i64)> = BTreeMap::new();
    let mut last_indicative: BTreeMap<u32, (i64, i64, i64)> = BTreeMap::new();
    let mut auction_trades: BTreeMap<u64, u64> = BTreeMap::new();
    let defs: BTreeMap<u32, &bourse_core::Instrument> =
        rec.defs.iter().map(|d| (d.instrument.0, d)).collect();
    for e in rec.batches.iter().flatten() {
        match *e {
            Event::AuctionUncrossed {
                instrument,
                price,
                qty,
                ..
            } if published(defs[&instrument.0]) => {
                uncrossed.insert(instrument.0, (price.0, qty.0));
            }
            Event::AuctionIndicative {
                instrument,
                price,
                qty,
                surplus,
                ..
            } if published(defs[&instrument.0]) => {
                last_indicative.insert(instrument.0, (price.0, qty.0, surplus.0));
            }
            Event::Trade {
                trade_id,
                qty,
                auction: true,
                instrument,
                ..
            } if published(defs[&instrument.0]) => {
                auction_trades.insert(trade_id.0, qty.0 as u64);
            }
            _ => {}
        }
    }
    assert!(
        uncrossed.values().any(|u| u.1 > 0),
        "some instrument uncrossed with trades"
    );
    let mut cross_matches = BTreeMap::new();
    for (&id, &(price, qty)) in &uncrossed {
        let def = defs[&id];
        let locate = feed.projection().locate(id).unwrap();
        let crosses = &books.crosses[&locate];
        assert_eq!(crosses.len(), 1, "one cross of {}", def.symbol);
        let (shares, cross_price, cross_type, match_number) = crosses[0];
        assert_eq!(shares, qty as u64, "{}", def.symbol);
        assert_eq!(cross_price, itch_price(price, def.price_scale));
        assert_eq!(cross_type, itchy::CrossType::Opening);
        if qty > 0 {
            cross_matches.insert(match_number, qty as u64);
        }
        if let Some(&(price, qty, surplus)) = last_indicative.get(&id) {
            let noii = books.imbalances[&locate].last().copied().unwrap();
            assert_eq!(
                (noii.0, noii.1, noii.3),
                (
                    qty as u64,
                    surplus as u64,
                    itch_price(price, def.price_scale)
                ),
                "the last NOII of {}",
                def.symbol
            );
        }
    }
    // The executions in the crosses add up, per cross, to twice what it traded (both sides
    // execute), less what icebergs did not show; none is printable, and no auction trade is
    // published as a continuous execution.
    for (m, shares) in &cross_matches {
        let executed = books.cross_executed_by_match.get(m).copied().unwrap_or(0);
        assert!(
            executed <= 2 * shares && executed > 0,
            "{m}: {executed} of {shares}"
        );
    }
    for id in auction_trades.keys() {
        assert!(!books.executed_by_match.contains_key(id), "trade {id}");
    }

    // bourse's consumer: the same books, and each stock's last cross.
    let mut c = Consumer::new(1 << 16);
    for p in &packets {
        c.on_datagram(p);
    }
    let s = c.stats();
    assert_eq!(
        s.book_errors + s.malformed_messages + s.malformed_packets,
        0,
        "{s:?}"
    );
    for (&id, &(price, qty)) in &uncrossed {
        let locate = feed.projection().locate(id).unwrap();
        let stock = &c.stocks()[&locate];
        assert_eq!(
            stock.last_cross,
            Some((qty as u64, itch_price(price, defs[&id].price_scale), b'O'))
        );
        assert_eq!(stock.imbalance, None, "the cross clears the imbalance");
        let orders: Vec<_> = stock
            .book
            .orders()
            .map(|o| {
                (
                    o.side == bourse_core::Side::Buy,
                    o.price as u32,
                    o.qty as u32,
                )
            })
            .collect();
        let core: Vec<_> = engine_shown(&rec.engine, defs[&id])
            .into_iter()
            .map(|o| (o.1 == bourse_core::Side::Buy, o.2, o.3))
            .collect();
        let (mut a, mut b) = (orders, core);
        a.sort();
        b.sort();
        assert_eq!(a, b, "consumer's book of {}", defs[&id].symbol);
    }
}
