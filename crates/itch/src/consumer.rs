//! A gap-filling ITCH consumer, sans-I/O: it applies messages strictly in sequence order,
//! holds what arrives past a gap (bounded) and says which range to request again; it builds
//! one book per stock locate code from Add/Executed/Cancel/Delete/Replace.

use crate::mold::{Packet, PacketHeader, Session};
use crate::msg::{Body, Message};
use bourse_core::Side;
use bourse_marketdata::{BookOrder, OrderBook};
use std::collections::BTreeMap;

/// What the consumer counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConsumerStats {
    pub packets: u64,
    pub messages_applied: u64,
    pub duplicates: u64,
    pub gaps_detected: u64,
    pub held_dropped: u64,
    pub malformed_packets: u64,
    pub malformed_messages: u64,
    pub other_session: u64,
    pub book_errors: u64,
    pub heartbeats: u64,
    pub end_of_session: bool,
}

/// A range to request again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GapRequest {
    pub sequence: u64,
    pub count: u16,
}

impl GapRequest {
    /// The request datagram.
    pub fn encode(&self, session: Session, out: &mut Vec<u8>) {
        out.clear();
        PacketHeader {
            session,
            sequence: self.sequence,
            count: self.count,
        }
        .encode(out);
    }
}

/// One instrument as the consumer sees it.
#[derive(Debug, Default)]
pub struct Stock {
    pub stock: [u8; 8],
    pub book: OrderBook,
    /// During a call auction, its last NOII: paired shares, imbalance shares, imbalance
    /// direction (`B`, `S`, `N`) and the indicative price; cleared by the Cross Trade.
    pub imbalance: Option<(u64, u64, u8, u32)>,
    /// The last Cross Trade: shares, price and cross type.
    pub last_cross: Option<(u64, u32, u8)>,
}

/// See the module documentation.
pub struct Consumer {
    session: Option<Session>,
    next: u64,
    /// The highest sequence number seen announced (by a packet or a heartbeat), exclusive.
    known_end: u64,
    held: BTreeMap<u64, Vec<u8>>,
    held_max: usize,
    stocks: BTreeMap<u16, Stock>,
    stats: ConsumerStats,
}

impl Consumer {
    /// `held_max` bounds the messages kept past a gap while it is filled.
    pub fn new(held_max: usize) -> Consumer {
        Consumer {
            session: None,
            next: 1,
            known_end: 1,
            held: BTreeMap::new(),
            held_max,
            stocks: BTreeMap::new(),
            stats: ConsumerStats::default(),
        }
    }

    pub fn stats(&self) -> ConsumerStats {
        self.stats
    }

    pub fn session(&self) -> Option<Session> {
        self.session
    }

    /// The next sequence number due.
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    /// The books by stock locate code.
    pub fn stocks(&self) -> &BTreeMap<u16, Stock> {
        &self.stocks
    }

    /// Whether every message announced so far was applied.
    pub fn complete(&self) -> bool {
        self.next >= self.known_end
    }

    /// One datagram (live or retransmitted).
    pub fn on_datagram(&mut self, bytes: &[u8]) {
        let Ok(p) = Packet::parse(bytes) else {
            self.stats.malformed_packets += 1;
            return;
        };
        match self.session {
            None => self.session = Some(p.header.session),
            Some(s) if s != p.header.session => {
                self.stats.other_session += 1;
                return;
            }
            Some(_) => {}
        }
        self.stats.packets += 1;
        if p.header.is_end_of_session() {
            self.stats.end_of_session = true;
            self.known_end = self.known_end.max(p.header.sequence);
            return;
        }
        if p.header.is_heartbeat() {
            self.stats.heartbeats += 1;
            self.known_end = self.known_end.max(p.header.sequence);
            return;
        }
        for (seq, m) in p.messages() {
            self.known_end = self.known_end.max(seq + 1);
            if seq < self.next || self.held.contains_key(&seq) {
                self.stats.duplicates += 1;
            } else if seq == self.next {
                self.apply(m);
                self.next += 1;
            } else if self.held.len() < self.held_max {
                if self.held.is_empty() {
                    self.stats.gaps_detected += 1;
                }
                self.held.insert(seq, m.to_vec());
            } else {
                self.stats.held_dropped += 1;
            }
        }
        while let Some(m) = self.held.remove(&self.next) {
            self.apply(&m);
            self.next += 1;
        }
    }

    /// The range to ask for now, if anything is missing: from the next due up to the first
    /// message held (or everything announced), at most `count_max`.
    pub fn gap(&self, count_max: u16) -> Option<GapRequest> {
        let end = self.held.keys().next().copied().unwrap_or(self.known_end);
        (end > self.next).then(|| GapRequest {
            sequence: self.next,
            count: (end - self.next).min(u64::from(count_max)) as u16,
        })
    }

    fn apply(&mut self, bytes: &[u8]) {
        let Ok(m) = Message::decode(bytes) else {
            self.stats.malformed_messages += 1;
            return;
        };
        self.stats.messages_applied += 1;
        let locate = m.header.stock_locate;
        let result = match m.body {
            Body::StockDirectory(d) => {
                self.stocks.entry(locate).or_default().stock = d.stock;
                Ok(())
            }
            Body::AddOrder {
                order_ref,
                side,
                shares,
                price,
                ..
            } => {
                let order = BookOrder {
                    order_id: order_ref,
                    side: if side == b'B' { Side::Buy } else { Side::Sell },
                    price: i64::from(price),
                    qty: i64::from(shares),
                    ts_ns: m.header.timestamp_ns,
                };
                self.stocks.entry(locate).or_default().book.add(order)
            }
            Body::OrderExecuted {
                order_ref,
                executed_shares: n,
                ..
            }
            | Body::OrderExecutedWithPrice {
                order_ref,
                executed_shares: n,
                ..
            }
            | Body::OrderCancel {
                order_ref,
                cancelled_shares: n,
            } => self.reduce(locate, order_ref, i64::from(n)),
            Body::OrderDelete { order_ref } => self
                .stocks
                .entry(locate)
                .or_default()
                .book
                .remove(order_ref)
                .map(|_| ()),
            Body::OrderReplace {
                original_ref,
                new_ref,
                shares,
                price,
            } => {
                let book = &mut self.stocks.entry(locate).or_default().book;
                book.remove(original_ref).and_then(|old| {
                    book.add(BookOrder {
                        order_id: new_ref,
                        side: old.side,
                        price: i64::from(price),
                        qty: i64::from(shares),
                        ts_ns: m.header.timestamp_ns,
                    })
                })
            }
            Body::Noii {
                paired_shares,
                imbalance_shares,
                imbalance_direction,
                near_price,
                ..
            } => {
                self.stocks.entry(locate).or_default().imbalance = Some((
                    paired_shares,
                    imbalance_shares,
                    imbalance_direction,
                    near_price,
                ));
                Ok(())
            }
            Body::CrossTrade {
                shares,
                cross_price,
                cross_type,
                ..
            } => {
                let stock = self.stocks.entry(locate).or_default();
                stock.imbalance = None;
                stock.last_cross = Some((shares, cross_price, cross_type));
                Ok(())
            }
            Body::SystemEvent { .. } | Body::Trade { .. } => Ok(()),
        };
        if result.is_err() {
            self.stats.book_errors += 1;
        }
    }

    fn reduce(
        &mut self,
        locate: u16,
        order_ref: u64,
        n: i64,
    ) -> Result<(), bourse_marketdata::book::BookError> {
        let book = &mut self.stocks.entry(locate).or_default().book;
        let left = book.get(order_ref).map(|o| o.qty - n);
        match left {
            Some(q) if q > 0 => book.change_qty(order_ref, q),
            Some(0) => book.remove(order_ref).map(|_| ()),
            // More shares than the order showed: an error of the feed, counted.
            Some(_) => Err(bourse_marketdata::book::BookError::QtyNotPositive(
                order_ref,
            )),
            None => Err(bourse_marketdata::book::BookError::UnknownOrder(order_ref)),
        }
    }
}
