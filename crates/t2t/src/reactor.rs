//! The reaction, sans-I/O: one market data datagram in, the orders to send out.
//!
//! [`Reactor::on_datagram`] validates the packet with the subscriber's decoder
//! (`bourse_wire::market_data::parse_packet`, which checks every length before a field is
//! read) or, for an ITCH feed, with `bourse_itch`'s MoldUDP64 and ITCH decoders (see
//! [`crate::itch`]), applies its order-log messages to [`Books`], and, for every instrument
//! whose best ask changed, patches that instrument's [`OrderTemplate`] into the output
//! buffer: one buy order at the new best ask. Nothing here allocates once the reactor is built
//! and its instruments defined (a template is encoded when an instrument is first seen or its
//! ITCH stock directory entry arrives), takes a lock or makes a system call (the clock it may
//! read for stage times is the vDSO's).
//!
//! [`order_log_update`] is the one reading of an order-log message shared by the reactor and
//! the driver's reference model, so both count a packet's updates the same way.

use crate::book::{BookError, Books, Limits};
use crate::itch::{item_of, Admit, Item, Sequencer};
use crate::order::{OrderSpec, OrderTemplate, TimestampCache};
use crate::FeedFormat;
use bourse_core::Side;
use bourse_itch::mold::{FrameError, Packet as MoldPacket};
use bourse_itch::msg::{Body, DecodeError, Message as ItchMessage};
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
    /// Take `by` off the visible quantity (ITCH Executed, Cancel); the order leaves at 0.
    Reduce {
        security_id: u32,
        order_id: u64,
        by: i64,
    },
    /// The order leaves and a new one of the same side enters (ITCH Replace).
    Replace {
        security_id: u32,
        order_id: u64,
        new_order_id: u64,
        price: i64,
        qty: i64,
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
    pub feed: FeedFormat,
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
            feed: FeedFormat::Sbe,
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
    /// heartbeat repeating the last number; for ITCH, a packet whose every message was
    /// applied already).
    pub duplicates: u64,
    /// ITCH: messages inside a well-framed packet that do not decode (a wrong length for the
    /// type, a bad side); counted and skipped. Types bourse does not publish count as
    /// `unknown_template`.
    pub malformed_messages: u64,
    /// ITCH: packets of another MoldUDP64 session than the first one seen.
    pub other_session: u64,
    /// ITCH: heartbeats and end-of-session packets.
    pub heartbeats: u64,
    /// ITCH: packets that came after a gap in the sequence numbers (applied anyway: the
    /// client follows and does not ask for what it missed).
    pub gaps: u64,
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
    sequencer: Sequencer,
    books: Books,
    /// One template per instrument, indexed like the books' instruments.
    templates: Vec<OrderTemplate>,
    /// Per instrument, whether the feed named it (ITCH stock directory or Add Order).
    named: Vec<bool>,
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
        let mut config = config;
        if config.feed == FeedFormat::Itch {
            // ITCH prices are Price(4) whatever the instrument; the gateway reads any exact
            // decimal at the instrument's own scale.
            config.order.price_scale = crate::itch::PRICE_SCALE;
            config.order.instruments.clear();
        }
        let probe = OrderTemplate::new(&config.order, 0)?;
        let instruments_max = config.limits.instruments_max;
        let out_bytes = instruments_max.min(TOUCHED_MAX) * probe.bytes().len().max(64) * 2;
        Ok(Reactor {
            parser: PacketParser::new(config.packet_bytes_max, MESSAGES_PER_PACKET_MAX),
            sequencer: Sequencer::default(),
            books: Books::new(config.limits),
            templates: Vec::with_capacity(instruments_max),
            named: Vec::with_capacity(instruments_max),
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
        self.touched_len = 0;
        let mut decoded = None;
        let applied = match self.config.feed {
            FeedFormat::Sbe => self.on_sbe(datagram, &mut decoded),
            FeedFormat::Itch => self.on_itch(datagram, &mut decoded),
        };
        let Some(updates) = applied else {
            return Reaction::default();
        };
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

    /// Applies an SBE packet; `None` if it was refused or a copy.
    #[inline]
    fn on_sbe(&mut self, datagram: &[u8], decoded: &mut Option<Instant>) -> Option<u16> {
        let packet = match self.parser.parse(datagram) {
            Ok(p) => p,
            Err(e) => {
                self.count_refused(&e);
                return None;
            }
        };
        let seq = packet.header.msg_seq_num;
        if self.last_seq.is_some_and(|last| seq <= last) {
            self.stats.duplicates += 1;
            return None;
        }
        self.last_seq = Some(seq);
        *decoded = self.config.stages.then(Instant::now);
        let mut updates = 0u16;
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
        Some(updates)
    }

    /// Applies a MoldUDP64 packet of ITCH messages; `None` if it was refused, a copy, or
    /// carried no messages. The framing is checked whole before any message is read; a
    /// message that does not decode is counted and skipped, the rest of the packet applied.
    #[inline]
    fn on_itch(&mut self, datagram: &[u8], decoded: &mut Option<Instant>) -> Option<u16> {
        if datagram.len() > self.config.packet_bytes_max {
            self.stats.malformed += 1;
            return None;
        }
        let packet = match MoldPacket::parse(datagram) {
            Ok(p) => p,
            Err(FrameError::Short(_) | FrameError::BlockOverrun { .. }) => {
                self.stats.truncated += 1;
                return None;
            }
            Err(FrameError::Trailing(_) | FrameError::Extra(_)) => {
                self.stats.malformed += 1;
                return None;
            }
        };
        let from = match self.sequencer.admit(&packet.header) {
            Admit::Apply { from, gap } => {
                self.stats.gaps += u64::from(gap);
                from
            }
            Admit::Duplicate => {
                self.stats.duplicates += 1;
                return None;
            }
            Admit::OtherSession => {
                self.stats.other_session += 1;
                return None;
            }
            Admit::Heartbeat | Admit::EndOfSession => {
                self.stats.heartbeats += 1;
                return None;
            }
        };
        *decoded = self.config.stages.then(Instant::now);
        let mut updates = 0u16;
        for (seq, bytes) in packet.messages() {
            if seq < from {
                continue;
            }
            let message = ItchMessage::decode(bytes);
            if let Ok(ItchMessage {
                header,
                body: Body::AddOrder { stock, .. },
            }) = message
            {
                self.name_from_add(header.stock_locate, &stock);
            }
            match message.map(|m| item_of(&m)) {
                Ok(Item::Update(u)) => {
                    updates += 1;
                    self.apply(u);
                }
                Ok(Item::Directory { locate, stock }) => self.define(locate, &stock),
                Ok(Item::Other) => {}
                Err(DecodeError::UnknownType(_)) => self.stats.unknown_template += 1,
                Err(_) => self.stats.malformed_messages += 1,
            }
        }
        Some(updates)
    }

    /// A client that joined after the stock directory went out learns a stock's symbol from
    /// its first Add Order (which carries it): once per stock, so the allocation of
    /// [`Reactor::define`] happens once.
    #[inline]
    fn name_from_add(&mut self, locate: u16, stock: &[u8; 8]) {
        match self.instrument(u32::from(locate)) {
            Ok(inst) if !self.named[inst] => self.define(locate, stock),
            _ => {}
        }
    }

    /// An ITCH stock directory entry: the instrument's orders carry its symbol from now on.
    /// Encoding the template allocates; definitions come before the trading they define.
    fn define(&mut self, locate: u16, stock: &[u8; 8]) {
        let Ok(inst) = self.instrument(u32::from(locate)) else {
            self.stats.updates_refused += 1;
            return;
        };
        let symbol = crate::itch::stock_text(stock);
        let symbol = (!symbol.is_empty()).then_some(symbol);
        match OrderTemplate::named(
            &self.config.order,
            u32::from(locate),
            symbol,
            self.config.order.price_scale,
        ) {
            Ok(t) => self.templates[inst] = t,
            Err(_) => self.stats.updates_refused += 1,
        }
        // Named by the feed, well or not: an Add Order does not try again.
        self.named[inst] = true;
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
            self.named.push(false);
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
            Update::Reduce {
                security_id,
                order_id,
                by,
            } => self.instrument(security_id).and_then(|i| {
                self.touch(i);
                self.books.reduce(i, order_id, by)
            }),
            Update::Replace {
                security_id,
                order_id,
                new_order_id,
                price,
                qty,
            } => self.instrument(security_id).and_then(|i| {
                self.touch(i);
                self.books.replace(i, order_id, new_order_id, price, qty)
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
