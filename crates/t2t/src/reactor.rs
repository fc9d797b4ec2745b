//! The reaction, sans-I/O: one market data datagram in, the orders to send out.
//!
//! [`Reactor::on_datagram`] validates the packet with the subscriber's decoder
//! (`bourse_wire::market_data::parse_packet`, which checks every length before a field is
//! read), applies its order-log messages to [`Books`], and, for every instrument whose best
//! ask changed, patches that instrument's [`OrderTemplate`] into the output buffer: one buy
//! order at the new best ask. Nothing here allocates once the reactor is built, takes a lock
//! or makes a system call (the clock it may read for stage times is the vDSO's).
//!
//! [`order_log_update`] is the one reading of an order-log message shared by the reactor and
//! the driver's reference model, so both count a packet's updates the same way.

use crate::book::{BookError, Books, Limits};
use crate::order::{OrderSpec, OrderTemplate, TimestampCache};
use bourse_core::Side;
use bourse_marketdata::wire::market_data::codec::{
    md_update_action::MdUpdateAction, side::Side as WireSide,
};
use bourse_marketdata::wire::market_data::{
    Message, PacketParser, MESSAGES_PER_PACKET_MAX, PACKET_BYTES_MAX,
};
use bourse_marketdata::wire::Error as WireError;
use serde::Serialize;
use std::time::Instant;

/// Most orders one packet can cause: one per instrument.
const TOUCHED_MAX: usize = MESSAGES_PER_PACKET_MAX;

/// What an order-log message does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    New {
        security_id: u32,
        order_id: u64,
        side: Side,
        price: i64,
        qty: i64,
    },
    Change {
        security_id: u32,
        order_id: u64,
        qty: i64,
    },
    Delete {
        security_id: u32,
        order_id: u64,
    },
    /// Clear one instrument's book, or every book (`None`).
    Empty {
        security_id: Option<u32>,
    },
}

/// The update an order-log message carries: `None` for a message that is not order log,
/// `Some(Err(()))` for one with an enum value this build does not know.
pub fn order_log_update(m: &Message<'_>) -> Option<Result<Update, ()>> {
    let (security_id, order_id, price, qty, action, side) = match m {
        Message::OrderUpdate(d) => (
            d.security_id(),
            d.md_entry_id(),
            d.md_entry_px(),
            d.md_entry_size(),
            d.md_update_action(),
            d.side(),
        ),
        Message::OrderExecution(d) => (
            d.security_id(),
            d.md_entry_id(),
            d.md_entry_px(),
            d.md_entry_size(),
            d.md_update_action(),
            d.side(),
        ),
        Message::EmptyBook(d) => {
            return Some(Ok(Update::Empty {
                security_id: d.security_id(),
            }))
        }
        _ => return None,
    };
    Some(match action {
        MdUpdateAction::New => match side {
            WireSide::Buy | WireSide::Sell => Ok(Update::New {
                security_id,
                order_id,
                side: if side == WireSide::Buy {
                    Side::Buy
                } else {
                    Side::Sell
                },
                price,
                qty,
            }),
            WireSide::NullVal => Err(()),
        },
        MdUpdateAction::Change => Ok(Update::Change {
            security_id,
            order_id,
            qty,
        }),
        MdUpdateAction::Delete => Ok(Update::Delete {
            security_id,
            order_id,
        }),
        MdUpdateAction::NullVal => Err(()),
    })
}

/// Settings of a reactor.
#[derive(Clone, Debug)]
pub struct ReactorConfig {
    pub limits: Limits,
    pub order: OrderSpec,
    /// Take a clock reading between stages (decode, book, decision) of every reaction.
    pub stages: bool,
    /// MsgSeqNum of the first order sent (the Logon took the ones before).
    pub first_seq: u64,
    /// Largest datagram accepted: the feed's 1472 bytes unless a loopback-only capture with
    /// larger packets is replayed.
    pub packet_bytes_max: usize,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            limits: Limits::default(),
            order: OrderSpec::default(),
            stages: false,
            first_seq: 2,
            packet_bytes_max: PACKET_BYTES_MAX,
        }
    }
}

/// What the reactor saw and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReactorStats {
    pub packets: u64,
    /// Datagrams the decoder refused, by reason; counted and skipped.
    pub malformed: u64,
    pub truncated: u64,
    pub unknown_template: u64,
    pub future_version: u64,
    pub wrong_schema: u64,
    /// Packets whose MsgSeqNum was not above the last one applied (the other feed's copy, a
    /// heartbeat repeating the last number).
    pub duplicates: u64,
    pub updates_applied: u64,
    /// Updates the book refused (unknown or duplicate order, a limit reached) or with an
    /// unknown enum value: counted and skipped, as the seed's client does not recover.
    pub updates_refused: u64,
    pub orders: u64,
}

impl ReactorStats {
    /// Every datagram refused by the decoder.
    pub fn skipped(&self) -> u64 {
        self.malformed
            + self.truncated
            + self.unknown_template
            + self.future_version
            + self.wrong_schema
    }
}

/// The outcome of one datagram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reaction {
    /// Order-log messages in the packet (its size, as the seed counts it).
    pub updates: u16,
    /// Orders written to [`Reactor::out`].
    pub orders: u16,
}

/// Clock readings between the stages of the last reaction, when enabled.
#[derive(Clone, Copy, Debug)]
pub struct StageStamps {
    pub decoded: Instant,
    pub booked: Instant,
    pub decided: Instant,
}

/// The reference reacting client's logic.
pub struct Reactor {
    config: ReactorConfig,
    parser: PacketParser,
    books: Books,
    /// One template per instrument, indexed like the books' instruments.
    templates: Vec<OrderTemplate>,
    out: Vec<u8>,
    touched: [(u32, Option<i64>); TOUCHED_MAX],
    touched_len: usize,
    last_seq: Option<u32>,
    next_seq: u64,
    next_cl_ord_id: u64,
    clock: TimestampCache,
    stats: ReactorStats,
    stamps: Option<StageStamps>,
    decided: Option<Instant>,
}

impl Reactor {
    /// Allocates everything a reaction will need.
    pub fn new(config: ReactorConfig) -> Result<Reactor, String> {
        // Checks the order settings once, so a bad spec fails here and not at the first order.
        let probe = OrderTemplate::new(&config.order, 0)?;
        let instruments_max = config.limits.instruments_max;
        let out_bytes = instruments_max.min(TOUCHED_MAX) * probe.bytes().len().max(64) * 2;
        Ok(Reactor {
            parser: PacketParser::new(config.packet_bytes_max, MESSAGES_PER_PACKET_MAX),
            books: Books::new(config.limits),
            templates: Vec::with_capacity(instruments_max),
            out: Vec::with_capacity(out_bytes),
            touched: [(0, None); TOUCHED_MAX],
            touched_len: 0,
            last_seq: None,
            next_seq: config.first_seq,
            next_cl_ord_id: 1,
            clock: TimestampCache::default(),
            stats: ReactorStats::default(),
            stamps: None,
            decided: None,
            config,
        })
    }

    pub fn books(&self) -> &Books {
        &self.books
    }

    pub fn stats(&self) -> &ReactorStats {
        &self.stats
    }

    /// The orders of the last reaction, back to back.
    pub fn out(&self) -> &[u8] {
        &self.out
    }

    /// Stage times of the last reaction (when enabled and the packet was applied).
    pub fn stamps(&self) -> Option<StageStamps> {
        self.stamps
    }

    /// The next MsgSeqNum (for session messages the client sends between reactions).
    pub fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Reacts to one datagram received at `wall_ns` (ns since the epoch, for SendingTime).
    #[inline]
    pub fn on_datagram(&mut self, datagram: &[u8], wall_ns: u64) -> Reaction {
        self.out.clear();
        self.stamps = None;
        self.stats.packets += 1;
        let packet = match self.parser.parse(datagram) {
            Ok(p) => p,
            Err(e) => {
                self.count_refused(&e);
                return Reaction::default();
            }
        };
        let seq = packet.header.msg_seq_num;
        if self.last_seq.is_some_and(|last| seq <= last) {
            self.stats.duplicates += 1;
            return Reaction::default();
        }
        self.last_seq = Some(seq);
        let decoded = self.config.stages.then(Instant::now);
        let mut updates = 0u16;
        self.touched_len = 0;
        for m in packet.messages() {
            let Some(update) = order_log_update(&m) else {
                continue;
            };
            updates += 1;
            match update {
                Ok(u) => self.apply(u),
                Err(()) => self.stats.updates_refused += 1,
            }
        }
        let booked = self.config.stages.then(Instant::now);
        let orders = self.decide_and_encode(wall_ns);
        if let (Some(decoded), Some(booked)) = (decoded, booked) {
            self.stamps = Some(StageStamps {
                decoded,
                booked,
                decided: self.decided.unwrap_or(booked),
            });
        }
        Reaction { updates, orders }
    }

    fn count_refused(&mut self, e: &WireError) {
        match e {
            WireError::VersionFromFuture { .. } => self.stats.future_version += 1,
            WireError::UnknownTemplate { .. } => self.stats.unknown_template += 1,
            WireError::WrongSchemaId { .. } => self.stats.wrong_schema += 1,
            WireError::Truncated { .. } | WireError::PacketSizeMismatch { .. } => {
                self.stats.truncated += 1
            }
            _ => self.stats.malformed += 1,
        }
    }

    /// Notes an instrument's best ask before the packet first changes it.
    #[inline]
    fn touch(&mut self, inst: usize) {
        let inst32 = inst as u32;
        if self.touched[..self.touched_len]
            .iter()
            .any(|t| t.0 == inst32)
        {
            return;
        }
        if self.touched_len < TOUCHED_MAX {
            self.touched[self.touched_len] = (inst32, self.books.instrument(inst).best_ask());
            self.touched_len += 1;
        }
    }

    #[inline]
    fn instrument(&mut self, security_id: u32) -> Result<usize, BookError> {
        let inst = self.books.index_of(security_id)?;
        if inst == self.templates.len() {
            // First sight of the instrument: its template is encoded now, once. The spec was
            // checked in `new`, so this cannot fail for a valid security id.
            let t = OrderTemplate::new(&self.config.order, security_id)
                .map_err(|_| BookError::InstrumentsFull)?;
            self.templates.push(t);
        }
        Ok(inst)
    }

    #[inline]
    fn apply(&mut self, u: Update) {
        let r = match u {
            Update::New {
                security_id,
                order_id,
                side,
                price,
                qty,
            } => self.instrument(security_id).and_then(|i| {
                self.touch(i);
                self.books.add(i, order_id, side, price, qty)
            }),
            Update::Change {
                security_id,
                order_id,
                qty,
            } => self.instrument(security_id).and_then(|i| {
                self.touch(i);
                self.books.change_qty(i, order_id, qty)
            }),
            Update::Delete {
                security_id,
                order_id,
            } => self.instrument(security_id).and_then(|i| {
                self.touch(i);
                self.books.remove(i, order_id)
            }),
            Update::Empty {
                security_id: Some(security_id),
            } => self.instrument(security_id).map(|i| {
                self.touch(i);
                self.books.clear(i)
            }),
            Update::Empty { security_id: None } => {
                for i in 0..self.books.instruments().len() {
                    self.touch(i);
                    self.books.clear(i);
                }
                Ok(())
            }
        };
        match r {
            Ok(()) => self.stats.updates_applied += 1,
            Err(_) => self.stats.updates_refused += 1,
        }
    }

    /// One buy order per touched instrument whose best ask moved to a price.
    #[inline]
    fn decide_and_encode(&mut self, wall_ns: u64) -> u16 {
        let mut orders = 0u16;
        self.decided = None;
        for k in 0..self.touched_len {
            let (inst, before) = self.touched[k];
            let now = self.books.instrument(inst as usize).best_ask();
            let Some(price) = now else { continue };
            if before == Some(price) {
                continue;
            }
            if orders == 0 && self.config.stages {
                self.decided = Some(Instant::now());
            }
            let ts = *self.clock.at(wall_ns);
            let seq = self.next_seq;
            let cl_ord_id = self.next_cl_ord_id;
            let bytes = self.templates[inst as usize].patch(seq, cl_ord_id, price, &ts);
            self.out.extend_from_slice(bytes);
            self.next_seq += 1;
            self.next_cl_ord_id += 1;
            orders += 1;
        }
        self.stats.orders += u64::from(orders);
        orders
    }
}
