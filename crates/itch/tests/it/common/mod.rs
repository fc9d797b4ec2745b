//! Shared by the behaviour tests: a recorded run of a core (seeded order flow through the
//! engine, events by committed batch), the ITCH packets of it, and an independent reading of
//! those packets with the `itchy` crate's ITCH 5.0 parser.
#![allow(dead_code)]

use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig, Rng};
use bourse_engine::{Engine, EngineConfig};
use bourse_itch::feed::{Feed, FeedLimits};
use bourse_itch::mold::{session_of, Packet};
use std::collections::BTreeMap;

pub const T0_NS: u64 = 1_763_700_000_000_000_000;

/// A core after a seeded run, and the events of each committed batch.
pub struct Recording {
    pub engine: Engine,
    pub defs: Vec<Instrument>,
    pub batches: Vec<Vec<Event>>,
}

pub fn record(seed: u64, batches: usize) -> Recording {
    record_phases(seed, &[(None, batches)])
}

/// A recorded run in segments: each first puts every instrument in its phase (if given, as
/// one batch of `SetPhase` commands), then runs its number of batches of the flow.
pub fn record_phases(seed: u64, segments: &[(Option<Phase>, usize)]) -> Recording {
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
    let mut now_ns = T0_NS;
    let mut events = Vec::new();
    for body in flow.setup() {
        now_ns += 1_000;
        engine.apply(&Command::new(now_ns, body), &mut events);
    }
    let mut out = vec![std::mem::take(&mut events)];
    let mut rng = Rng::new(seed ^ 0xABCD);
    for &(phase, batches) in segments {
        if let Some(phase) = phase {
            let mut batch = Vec::new();
            for def in &defs {
                now_ns += 2_000;
                let body = CommandBody::SetPhase {
                    instrument: Some(def.instrument),
                    phase,
                };
                engine.apply(&Command::new(now_ns, body), &mut batch);
            }
            out.push(batch);
        }
        for _ in 0..batches {
            let mut batch = Vec::new();
            for _ in 0..1 + rng.below(20) {
                now_ns += 2_000;
                let start = batch.len();
                engine.apply(&Command::new(now_ns, flow.next_command()), &mut batch);
                flow.observe(&batch[start..]);
            }
            out.push(batch);
        }
    }
    Recording {
        engine,
        defs,
        batches: out,
    }
}

/// The recording through a feed: every packet, in order, with the session ended.
pub fn itch_packets(rec: &Recording, limits: FeedLimits) -> (Feed, Vec<Vec<u8>>) {
    let mut feed = Feed::new(session_of("TEST1").unwrap(), limits, 4).unwrap();
    let mut packets = Vec::new();
    let mut send = |p: &[u8]| packets.push(p.to_vec());
    feed.start(T0_NS, &mut send);
    for def in &rec.defs {
        feed.define(def, T0_NS, &mut send);
    }
    for b in &rec.batches {
        feed.publish(b, &mut send);
    }
    feed.end(T0_NS + 1, &mut send);
    (feed, packets)
}

/// Every message of the packets, with its sequence number, as MoldUDP64 frames them.
pub fn messages_of(packets: &[Vec<u8>]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for p in packets {
        let p = Packet::parse(p).expect("every packet frames");
        out.extend(p.messages().map(|(s, m)| (s, m.to_vec())));
    }
    out
}

/// One message read by `itchy` (an ITCH 5.0 parser that is not ours).
pub fn itchy_decode(message: &[u8]) -> itchy::Message {
    let mut framed = (message.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(message);
    let mut stream = itchy::MessageStream::from_reader(&framed[..]);
    stream
        .next()
        .expect("one message")
        .unwrap_or_else(|e| panic!("itchy refuses {message:?}: {e:?}"))
}

/// An order as a book shows it: reference, side, ITCH price, shares.
pub type ShownOrder = (u64, Side, u32, u32);

/// Books (per stock, bids then asks, each in price-time order) built from messages read by
/// `itchy`, with the stock directory, and per match number the shares executed.
#[derive(Default)]
pub struct IndependentBooks {
    pub stocks: BTreeMap<u16, String>,
    pub orders: BTreeMap<u16, Vec<ShownOrder>>,
    pub executed_by_match: BTreeMap<u64, u64>,
    pub system_events: Vec<itchy::EventCode>,
    /// Per stock, every NOII: paired shares, imbalance shares, direction, near price.
    pub imbalances: BTreeMap<u16, Vec<(u64, u64, itchy::ImbalanceDirection, u32)>>,
    /// Per stock, every Cross Trade: shares, price, cross type, match number.
    pub crosses: BTreeMap<u16, Vec<(u64, u32, itchy::CrossType, u64)>>,
    /// Shares of non-printable executions (a cross's), by match number.
    pub cross_executed_by_match: BTreeMap<u64, u64>,
}

impl IndependentBooks {
    pub fn apply(&mut self, m: &itchy::Message) {
        use itchy::Body as B;
        let book = self.orders.entry(m.stock_locate).or_default();
        let find = |book: &Vec<ShownOrder>, r: u64| {
            book.iter()
                .position(|o| o.0 == r)
                .unwrap_or_else(|| panic!("reference {r} names no order"))
        };
        match &m.body {
            B::SystemEvent { event } => self.system_events.push(*event),
            B::StockDirectory(d) => {
                self.stocks
                    .insert(m.stock_locate, d.stock.trim_end().to_string());
            }
            B::AddOrder(a) => {
                let side = match a.side {
                    itchy::Side::Buy => Side::Buy,
                    itchy::Side::Sell => Side::Sell,
                };
                book.push((a.reference, side, a.price.raw(), a.shares));
            }
            B::OrderExecuted {
                reference,
                executed,
                match_number,
            } => {
                let k = find(book, *reference);
                assert!(book[k].3 >= *executed, "executes at most what is shown");
                book[k].3 -= executed;
                if book[k].3 == 0 {
                    book.remove(k);
                }
                *self.executed_by_match.entry(*match_number).or_default() += u64::from(*executed);
            }
            B::OrderCancelled {
                reference,
                cancelled,
            } => {
                let k = find(book, *reference);
                assert!(book[k].3 > *cancelled, "a cancel leaves part of the order");
                book[k].3 -= cancelled;
            }
            B::DeleteOrder { reference } => {
                let k = find(book, *reference);
                book.remove(k);
            }
            B::ReplaceOrder(r) => {
                let k = find(book, r.old_reference);
                let old = book.remove(k);
                book.push((r.new_reference, old.1, r.price.raw(), r.shares));
            }
            B::OrderExecutedWithPrice {
                reference,
                executed,
                match_number,
                printable,
                ..
            } => {
                assert!(!printable, "bourse's executions with price are a cross's");
                let k = find(book, *reference);
                assert!(book[k].3 >= *executed, "executes at most what is shown");
                book[k].3 -= executed;
                if book[k].3 == 0 {
                    book.remove(k);
                }
                *self
                    .cross_executed_by_match
                    .entry(*match_number)
                    .or_default() += u64::from(*executed);
            }
            B::Imbalance(i) => self.imbalances.entry(m.stock_locate).or_default().push((
                i.paired_shares,
                i.imbalance_shares,
                i.imbalance_direction,
                i.near_price.raw(),
            )),
            B::CrossTrade(c) => self.crosses.entry(m.stock_locate).or_default().push((
                c.shares,
                c.cross_price.raw(),
                c.cross_type,
                c.match_number,
            )),
            B::NonCrossTrade(t) => {
                *self.executed_by_match.entry(t.match_number).or_default() += u64::from(t.shares);
            }
            other => panic!("bourse does not publish {other:?}"),
        }
    }

    /// One stock's orders in price-time order: bids best first, then asks best first.
    pub fn sorted(&self, locate: u16) -> Vec<ShownOrder> {
        let book = self.orders.get(&locate).cloned().unwrap_or_default();
        let mut bids: Vec<_> = book.iter().filter(|o| o.1 == Side::Buy).cloned().collect();
        let mut asks: Vec<_> = book.iter().filter(|o| o.1 == Side::Sell).cloned().collect();
        // Stable sorts keep arrival order within a price.
        bids.sort_by_key(|o| std::cmp::Reverse(o.2));
        asks.sort_by_key(|o| o.2);
        bids.extend(asks);
        bids
    }
}

/// ITCH's Price(4) of a core price at `scale` decimals.
pub fn itch_price(price: i64, scale: u8) -> u32 {
    u32::try_from(price * 10i64.pow(u32::from(4 - scale))).expect("fits")
}

/// The engine's resting orders of an instrument as ITCH shows them (bids best first, then
/// asks best first, time order within a price): order id, side, price, shown shares.
pub fn engine_shown(engine: &Engine, def: &Instrument) -> Vec<(u64, Side, u32, u32)> {
    let mut v: Vec<_> = engine
        .resting_orders(def.instrument)
        .iter()
        .filter(|o| o.qty_display.0 > 0)
        .map(|o| {
            (
                o.order_id.0,
                o.side,
                itch_price(o.price.0, def.price_scale),
                o.qty_display.0 as u32,
            )
        })
        .collect();
    let mut bids: Vec<_> = v.iter().filter(|o| o.1 == Side::Buy).cloned().collect();
    let mut asks: Vec<_> = v.drain(..).filter(|o| o.1 == Side::Sell).collect();
    bids.sort_by_key(|o| std::cmp::Reverse(o.2));
    asks.sort_by_key(|o| o.2);
    bids.extend(asks);
    bids
}
