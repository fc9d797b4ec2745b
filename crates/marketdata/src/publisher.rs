//! The publisher: committed event batches in, channel packets out.
//!
//! Sans-I/O: [`Publisher::publish`] and [`Publisher::tick`] take the time from the caller and
//! hand finished packets to a [`PacketSink`] (UDP feeds A and B in production, a vector in
//! tests). Every message is encoded straight into a reused packet buffer, so the encoding path
//! allocates nothing per event in steady state; allocation happens only when a book grows (a
//! new price level, more orders than ever before) or when a packet queue grows past its peak.
//!
//! # How events become the order log
//!
//! The core writes an `OrderLog` record for every change of every order, including orders that
//! never rested (an aggressor filled at once, an IOC remainder). The publisher keeps its own
//! book per instrument and publishes only what changes that book, so the order log a
//! subscriber applies reproduces the core's book order by order, queue position included:
//!
//! - `New` for an order not in the book: OrderUpdate New (back of the queue).
//! - `Change` right after a `Trade` naming the order: OrderExecution Change. If the fill used up
//!   the visible part of an iceberg, the core refills it at the back of the queue, published as
//!   OrderExecution Delete then OrderUpdate New.
//! - `Change` otherwise: in place (OrderUpdate Change) when the price is the same and the
//!   visible quantity did not grow (a replace that keeps priority); otherwise Delete + New.
//! - `OrderReplaced` that loses priority: OrderUpdate Delete at once (the order matches as an
//!   aggressor and, if it rests, comes back as New).
//! - `Delete` for an order in the book: OrderUpdate Delete, or OrderExecution Delete after a
//!   trade; for an order never in the book: nothing.
//! - In a call auction's uncrossing both orders of a trade rest and an order may trade several
//!   times before its record: its `Change` or `Delete` is an OrderUpdate (in place when it
//!   kept its place), and its trades are on the trades channel, `tradeType` Auction.
//! - `AuctionIndicative`: an AuctionIndicative message on the same channel, in order with
//!   the order log that moved it.
//!
//! # Failover
//!
//! Sequence numbers are state. A standby publisher on a follower is fed the same committed
//! batches in the same order with [`Publisher::set_active`]`(false)`: it builds the same books,
//! RptSeqs and (in online mode, where packet boundaries depend only on the batches) the same
//! packets with the same MsgSeqNums, and keeps them in its replay history, but sends nothing.
//! When it becomes leader it is activated and continues from its next MsgSeqNum: whatever the
//! old leader had not sent is a gap the subscriber fills from the new leader's replay service,
//! whatever both sent is dropped as a duplicate by MsgSeqNum and RptSeq. A publisher can also be
//! rebuilt from a [`PublisherState`] taken with [`Publisher::state`] (a checkpoint beside the
//! core's snapshot) and then continues at exactly that state's sequence numbers. In the 1 ms
//! and 15 ms modes packet boundaries depend on timing, so the same MsgSeqNum may carry
//! different messages on the two publishers; the subscriber applies order-log messages by
//! RptSeq, so the worst case is a detected RptSeq gap and a recovery from the snapshot loop.

use crate::book::{BookError, BookOrder, LevelView, OrderBook};
use crate::history::History;
use crate::{Channel, PublicationMode, PublisherConfig, CHANNEL_COUNT, TOP_LEVELS};
use bourse_core::codec::{DecodeError, Reader, Writer};
use bourse_core::{
    Cash, Event, Instrument, InstrumentId, Market, OrderLog, OrderLogAction, Phase, Price, Side,
};
use bourse_wire::market_data::codec::{
    aggregated_book_codec, auction_indicative_codec::AuctionIndicativeEncoder,
    empty_book_codec::EmptyBookEncoder, heartbeat_codec::HeartbeatEncoder,
    market::Market as WireMarket, md_update_action::MdUpdateAction, order_book_snapshot_codec,
    order_execution_codec::OrderExecutionEncoder, order_update_codec::OrderUpdateEncoder,
    security_definition_codec::SecurityDefinitionEncoder,
    security_status_codec::SecurityStatusEncoder, security_trading_status::SecurityTradingStatus,
    sequence_reset_codec::SequenceResetEncoder, side::Side as WireSide, side_opt::SideOpt,
    statistics_codec::StatisticsEncoder, trade_codec::TradeEncoder, trade_type::TradeType,
    trading_session_state::TradingSessionState,
    trading_session_status_codec::TradingSessionStatusEncoder,
};
use bourse_wire::market_data::{
    IncrementalHeader, MsgFlags, PacketHeader, INCREMENTAL_HEADER_BYTES, MESSAGES_PER_PACKET_MAX,
    PACKET_BYTES_MAX, PACKET_HEADER_BYTES,
};
use bourse_wire::sbe::{encode_message, MessageEncoder, MESSAGE_HEADER_BYTES};
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};

/// Where finished packets go.
pub trait PacketSink {
    /// Sends one packet of `channel` (on feeds A and B).
    fn send(&mut self, channel: Channel, packet: &[u8]);

    /// Sends packets of `channel` in order: what one flush of a channel hands over. A sink
    /// that can send several datagrams in one system call does it here.
    fn send_all(&mut self, channel: Channel, packets: &[Vec<u8>]) {
        for p in packets {
            self.send(channel, p);
        }
    }
}

/// A sink that keeps every packet, for tests and tools.
#[derive(Debug, Default)]
pub struct VecSink {
    pub packets: Vec<(Channel, Vec<u8>)>,
}

impl PacketSink for VecSink {
    fn send(&mut self, channel: Channel, packet: &[u8]) {
        self.packets.push((channel, packet.to_vec()));
    }
}

const GROUP_HEADER_BYTES: usize = 3;
const ORDER_UPDATE_BYTES: usize = MESSAGE_HEADER_BYTES + 34;
const ORDER_EXECUTION_BYTES: usize = MESSAGE_HEADER_BYTES + 58;
const EMPTY_BOOK_BYTES: usize = MESSAGE_HEADER_BYTES + 8;
const TRADE_BYTES: usize = MESSAGE_HEADER_BYTES + 30;
const AUCTION_INDICATIVE_BYTES: usize = MESSAGE_HEADER_BYTES + 29;
const STATISTICS_BYTES: usize = MESSAGE_HEADER_BYTES + 104;
const SECURITY_STATUS_BYTES: usize = MESSAGE_HEADER_BYTES + 21;
const SESSION_STATUS_BYTES: usize = MESSAGE_HEADER_BYTES + 6;
const SECURITY_DEFINITION_BYTES: usize = MESSAGE_HEADER_BYTES + 81;
const HEARTBEAT_BYTES: usize = MESSAGE_HEADER_BYTES + 4;
const SEQUENCE_RESET_BYTES: usize = MESSAGE_HEADER_BYTES + 4;
const AGGREGATED_LEVEL_BYTES: usize = 22;
const AGGREGATED_ROOT_BYTES: usize = MESSAGE_HEADER_BYTES + 8 + GROUP_HEADER_BYTES;
const SNAPSHOT_ENTRY_BYTES: usize = 33;
const SNAPSHOT_ROOT_BYTES: usize = MESSAGE_HEADER_BYTES + 20 + GROUP_HEADER_BYTES;
/// The smallest packet size that still holds a full top-20 AggregatedBook.
pub const PACKET_BYTES_MIN: usize = PACKET_HEADER_BYTES
    + INCREMENTAL_HEADER_BYTES
    + AGGREGATED_ROOT_BYTES
    + 2 * TOP_LEVELS * AGGREGATED_LEVEL_BYTES;

fn wire_side(side: Side) -> WireSide {
    match side {
        Side::Buy => WireSide::Buy,
        Side::Sell => WireSide::Sell,
    }
}

fn wire_market(market: Market) -> WireMarket {
    match market {
        Market::Equity => WireMarket::Equities,
        Market::Fx => WireMarket::Fx,
        Market::Futures => WireMarket::Derivatives,
    }
}

fn wire_status(phase: Phase) -> SecurityTradingStatus {
    match phase {
        Phase::Open => SecurityTradingStatus::Trading,
        Phase::Halted => SecurityTradingStatus::Halted,
        Phase::Closed => SecurityTradingStatus::Closed,
        // A scheduled clearing pause: the feed's one status for "not trading now, resting
        // orders kept, back by schedule".
        Phase::Paused => SecurityTradingStatus::Suspended,
        // A call auction: orders are taken, nothing trades until the uncrossing.
        Phase::OpeningAuction => SecurityTradingStatus::OpeningAuction,
        Phase::ClosingAuction => SecurityTradingStatus::ClosingAuction,
        Phase::VolatilityAuction => SecurityTradingStatus::VolatilityAuction,
    }
}

/// Counters of one channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelCounters {
    pub packets_sent: u64,
    /// UDP payload bytes sent per feed.
    pub bytes_sent: u64,
    pub messages: u64,
    pub heartbeats: u64,
    pub sequence_resets: u64,
}

/// One channel's packet under construction and its queue of finished, unsent packets.
#[derive(Clone, Debug)]
pub(crate) struct ChannelOut {
    channel: Channel,
    mode: PublicationMode,
    packet_bytes_max: usize,
    /// MsgSeqNum the next data packet takes.
    pub(crate) next_seq: u32,
    buf: Vec<u8>,
    /// Bytes of the open packet; 0 when none is open.
    len: usize,
    msgs: usize,
    /// The open packet's last message ends a batch (LastFragment).
    ends_txn: bool,
    flags_extra: u16,
    ready: Vec<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    pub(crate) last_send_ns: u64,
    last_flush_ns: u64,
    /// Interval modes: the `ts_ns / interval` bucket of the commands whose messages the
    /// channel holds unsent (see [`Publisher::publish`]).
    bucket: u64,
    pub(crate) counters: ChannelCounters,
}

impl ChannelOut {
    pub(crate) fn new(
        channel: Channel,
        mode: PublicationMode,
        packet_bytes_max: usize,
    ) -> ChannelOut {
        ChannelOut {
            channel,
            mode,
            packet_bytes_max,
            next_seq: 1,
            buf: vec![0u8; PACKET_BYTES_MAX],
            len: 0,
            msgs: 0,
            ends_txn: false,
            flags_extra: 0,
            ready: Vec::new(),
            spare: Vec::new(),
            last_send_ns: 0,
            last_flush_ns: 0,
            bucket: 0,
            counters: ChannelCounters::default(),
        }
    }

    pub(crate) fn has_unsent(&self) -> bool {
        self.len > 0 || !self.ready.is_empty()
    }

    pub(crate) fn open(&mut self, transact_ns: u64, session_id: u32) {
        debug_assert_eq!(self.len, 0);
        self.len = PACKET_HEADER_BYTES;
        self.msgs = 0;
        self.ends_txn = false;
        self.flags_extra = 0;
        if self.channel.is_incremental() {
            let inc = IncrementalHeader {
                transact_time_ns: transact_ns,
                exchange_trading_session_id: session_id,
            };
            // The buffer is PACKET_BYTES_MAX long, so the header always fits.
            let _ = inc.write(&mut self.buf[PACKET_HEADER_BYTES..]);
            self.len += INCREMENTAL_HEADER_BYTES;
        }
    }

    /// Makes room for a message of `message_bytes`, closing the open packet if it is full.
    pub(crate) fn reserve(
        &mut self,
        message_bytes: usize,
        now_ns: u64,
        transact_ns: u64,
        session_id: u32,
        history: Option<&Mutex<History>>,
    ) {
        if self.len > 0
            && (self.len + message_bytes > self.packet_bytes_max
                || self.msgs == MESSAGES_PER_PACKET_MAX)
        {
            self.close(now_ns, history);
        }
        if self.len == 0 {
            self.open(transact_ns, session_id);
        }
    }

    /// Appends one message to the open packet. The caller reserved room for it.
    pub(crate) fn put<'s, E, F>(&'s mut self, fill: F)
    where
        E: MessageEncoder<'s>,
        F: FnOnce(E) -> E,
    {
        let end = self.packet_bytes_max;
        match encode_message::<E, F>(&mut self.buf[self.len..end], fill) {
            Ok(n) => {
                self.len += n;
                self.msgs += 1;
                self.ends_txn = false;
                self.counters.messages += 1;
            }
            // Unreachable: reserve() made room for the message's known size.
            Err(e) => debug_assert!(false, "message did not fit: {e}"),
        }
    }

    /// Closes the open packet: numbers it, keeps it for replay, queues it for sending.
    pub(crate) fn close(&mut self, now_ns: u64, history: Option<&Mutex<History>>) {
        if self.len == 0 {
            return;
        }
        if self.msgs == 0 {
            self.len = 0;
            return;
        }
        let mut flags = self.flags_extra;
        // Full refreshes (book, statistics) and the loops are consistent in every packet.
        if self.ends_txn || !matches!(self.channel, Channel::Orders | Channel::Trades) {
            flags |= MsgFlags::LAST_FRAGMENT;
        }
        if self.channel.is_incremental() {
            flags |= MsgFlags::INCREMENTAL_PACKET;
        }
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1).max(1);
        let header = PacketHeader {
            msg_seq_num: seq,
            msg_size: self.len as u16,
            msg_flags: MsgFlags(flags),
            sending_time_ns: now_ns,
        };
        let _ = header.write(&mut self.buf);
        let packet = &self.buf[..self.len];
        if let Some(h) = history {
            if let Ok(mut h) = h.lock() {
                h.push(seq, packet);
            }
        }
        let mut out = self.spare.pop().unwrap_or_default();
        out.clear();
        out.extend_from_slice(packet);
        self.ready.push(out);
        self.len = 0;
        self.msgs = 0;
    }

    /// Sends every queued packet (when active) and recycles the buffers.
    pub(crate) fn flush(&mut self, now_ns: u64, active: bool, sink: &mut dyn PacketSink) {
        self.last_flush_ns = now_ns;
        if self.ready.is_empty() {
            return;
        }
        if active {
            sink.send_all(self.channel, &self.ready);
            for p in &self.ready {
                self.counters.packets_sent += 1;
                self.counters.bytes_sent += p.len() as u64;
            }
        }
        self.spare.append(&mut self.ready);
        self.last_send_ns = now_ns;
    }

    /// Sends a SequenceReset packet (MsgSeqNum 0) announcing that the next data packet takes
    /// `next_seq`: a publisher that takes over says so on the loop channels, whose numbering
    /// (driven by the wall clock) is not shared with the publisher it replaces.
    pub(crate) fn sequence_reset(&mut self, now_ns: u64, active: bool, sink: &mut dyn PacketSink) {
        let next = self.next_seq;
        let mut buf = [0u8; PACKET_HEADER_BYTES + SEQUENCE_RESET_BYTES];
        let Ok(n) =
            encode_message::<SequenceResetEncoder, _>(&mut buf[PACKET_HEADER_BYTES..], |mut e| {
                e.new_seq_no(next);
                e
            })
        else {
            return;
        };
        let len = PACKET_HEADER_BYTES + n;
        let header = PacketHeader {
            msg_seq_num: 0,
            msg_size: len as u16,
            msg_flags: MsgFlags(MsgFlags::LAST_FRAGMENT),
            sending_time_ns: now_ns,
        };
        let _ = header.write(&mut buf);
        if active {
            sink.send(self.channel, &buf[..len]);
            self.counters.sequence_resets += 1;
            self.counters.bytes_sent += len as u64;
        }
        self.last_send_ns = now_ns;
    }

    /// Sends a Heartbeat packet repeating the last MsgSeqNum; it takes no number itself.
    pub(crate) fn heartbeat(&mut self, now_ns: u64, active: bool, sink: &mut dyn PacketSink) {
        let last = self.next_seq.wrapping_sub(1);
        let mut buf = [0u8; PACKET_HEADER_BYTES + HEARTBEAT_BYTES];
        let Ok(n) =
            encode_message::<HeartbeatEncoder, _>(&mut buf[PACKET_HEADER_BYTES..], |mut e| {
                e.last_msg_seq_num(last);
                e
            })
        else {
            return;
        };
        let len = PACKET_HEADER_BYTES + n;
        let header = PacketHeader {
            msg_seq_num: last,
            msg_size: len as u16,
            msg_flags: MsgFlags(MsgFlags::LAST_FRAGMENT),
            sending_time_ns: now_ns,
        };
        let _ = header.write(&mut buf);
        if active {
            sink.send(self.channel, &buf[..len]);
            self.counters.heartbeats += 1;
            self.counters.bytes_sent += len as u64;
        }
        self.last_send_ns = now_ns;
    }
}

/// Session statistics of one instrument.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Stats {
    last_px: Option<i64>,
    last_qty: Option<i64>,
    volume: i64,
    turnover: i64,
    open_px: Option<i64>,
    high_px: Option<i64>,
    low_px: Option<i64>,
    trades: u32,
}

impl Stats {
    fn on_trade(&mut self, price: i64, qty: i64) {
        self.last_px = Some(price);
        self.last_qty = Some(qty);
        self.volume = self.volume.saturating_add(qty);
        self.turnover = self.turnover.saturating_add(price.saturating_mul(qty));
        self.open_px.get_or_insert(price);
        self.high_px = Some(self.high_px.map_or(price, |h| h.max(price)));
        self.low_px = Some(self.low_px.map_or(price, |l| l.min(price)));
        self.trades = self.trades.saturating_add(1);
    }

    /// turnover / volume, rounded half away from zero.
    fn vwap(&self) -> Option<i64> {
        if self.volume <= 0 {
            return None;
        }
        let (t, v) = (self.turnover as i128, self.volume as i128);
        let q = (2 * t.abs() + v) / (2 * v);
        Some((if t < 0 { -q } else { q }) as i64)
    }
}

/// What the publisher knows of one instrument.
#[derive(Clone, Debug)]
struct InstrumentOut {
    id: u32,
    def: Option<Instrument>,
    book: OrderBook,
    rpt_seq: u32,
    stats: Stats,
    phase: Option<Phase>,
    /// Last published top 20: bids then asks.
    top: [LevelView; 2 * TOP_LEVELS],
    top_bids: usize,
    top_asks: usize,
    touched: bool,
    traded: bool,
    book_dirty: bool,
    stats_dirty: bool,
    /// EmptyBook not yet published (a newly added instrument).
    announce: bool,
    /// A trade in this batch moved the reference price, and with it the price band, since the
    /// last SecurityStatus: one is due at the end of the batch.
    band_moved: bool,
}

impl InstrumentOut {
    fn new(id: u32, def: Option<Instrument>) -> InstrumentOut {
        InstrumentOut {
            id,
            def,
            book: OrderBook::new(),
            rpt_seq: 0,
            stats: Stats::default(),
            phase: None,
            top: [LevelView::default(); 2 * TOP_LEVELS],
            top_bids: 0,
            top_asks: 0,
            touched: false,
            traded: false,
            book_dirty: false,
            stats_dirty: false,
            announce: true,
            band_moved: false,
        }
    }
}

/// A trade waiting for the order-log record of its resting order.
#[derive(Clone, Copy, Debug)]
struct PendingExec {
    resting_order: u64,
    trade_id: u64,
    price: i64,
    qty: i64,
}

/// Everything a publisher needs to continue where another left off.
#[derive(Clone, Debug)]
pub struct PublisherState {
    next_seq: [u32; CHANNEL_COUNT],
    instruments: Vec<InstrumentOut>,
    session_status_sent: bool,
}

impl PublisherState {
    /// The MsgSeqNum the next data packet of `channel` will take.
    pub fn next_seq(&self, channel: Channel) -> u32 {
        self.next_seq[channel.index()]
    }

    /// Canonical bytes of the state (see [`Publisher::encode_state`], which writes the same
    /// bytes without copying the books first).
    pub fn encode(&self, w: &mut Writer) {
        encode_state_parts(
            &self.next_seq,
            &self.instruments,
            self.session_status_sent,
            w,
        );
    }

    /// Reads what [`PublisherState::encode`] wrote. Every count is bounded by the bytes left,
    /// every book is rebuilt order by order (a duplicate order id is an error), and nothing
    /// in the input can make it panic.
    pub fn decode(r: &mut Reader<'_>) -> Result<PublisherState, DecodeError> {
        let version = r.u8()?;
        if version != STATE_VERSION {
            return Err(r.error("unknown publisher state version"));
        }
        let mut next_seq = [1u32; CHANNEL_COUNT];
        for s in &mut next_seq {
            *s = r.u32()?;
        }
        let session_status_sent = r.bool()?;
        let count = r.count(INSTRUMENT_STATE_BYTES_MIN)?;
        if count > STATE_INSTRUMENTS_MAX {
            return Err(r.error("more instruments than a publisher state may hold"));
        }
        let mut instruments = Vec::with_capacity(count);
        for _ in 0..count {
            instruments.push(decode_instrument(r)?);
        }
        let mut seen = std::collections::BTreeSet::new();
        if !instruments.iter().all(|i| seen.insert(i.id)) {
            return Err(r.error("an instrument appears twice in the publisher state"));
        }
        Ok(PublisherState {
            next_seq,
            instruments,
            session_status_sent,
        })
    }
}

/// Version byte of the publisher state's encoding.
const STATE_VERSION: u8 = 1;
/// Most instruments a decoded publisher state may hold.
const STATE_INSTRUMENTS_MAX: usize = 1 << 20;
/// The fewest bytes one instrument's state takes (used to bound counts before allocating).
const INSTRUMENT_STATE_BYTES_MIN: usize = 64;
const BOOK_ORDER_STATE_BYTES: usize = 33;
const SYMBOL_STATE_BYTES_MAX: usize = 64;

fn encode_state_parts(
    next_seq: &[u32; CHANNEL_COUNT],
    instruments: &[InstrumentOut],
    session_status_sent: bool,
    w: &mut Writer,
) {
    w.u8(STATE_VERSION);
    for s in next_seq {
        w.u32(*s);
    }
    w.bool(session_status_sent);
    w.u64(instruments.len() as u64);
    for inst in instruments {
        encode_instrument(inst, w);
    }
}

fn opt_i64(w: &mut Writer, v: Option<i64>) {
    w.bool(v.is_some());
    w.i64(v.unwrap_or(0));
}

fn read_opt_i64(r: &mut Reader<'_>) -> Result<Option<i64>, DecodeError> {
    let some = r.bool()?;
    let v = r.i64()?;
    Ok(some.then_some(v))
}

fn side_byte(side: Side) -> u8 {
    match side {
        Side::Buy => 0,
        Side::Sell => 1,
    }
}

fn read_side(r: &mut Reader<'_>) -> Result<Side, DecodeError> {
    match r.u8()? {
        0 => Ok(Side::Buy),
        1 => Ok(Side::Sell),
        _ => Err(r.error("bad side in the publisher state")),
    }
}

fn encode_instrument(inst: &InstrumentOut, w: &mut Writer) {
    w.u32(inst.id);
    w.u32(inst.rpt_seq);
    let flags = u8::from(inst.touched)
        | u8::from(inst.traded) << 1
        | u8::from(inst.book_dirty) << 2
        | u8::from(inst.stats_dirty) << 3
        | u8::from(inst.announce) << 4;
    w.u8(flags);
    w.u8(match inst.phase {
        None => 0,
        Some(Phase::Open) => 1,
        Some(Phase::Halted) => 2,
        Some(Phase::Closed) => 3,
        Some(Phase::Paused) => 4,
        Some(Phase::OpeningAuction) => 5,
        Some(Phase::ClosingAuction) => 6,
        Some(Phase::VolatilityAuction) => 7,
    });
    let s = &inst.stats;
    opt_i64(w, s.last_px);
    opt_i64(w, s.last_qty);
    w.i64(s.volume);
    w.i64(s.turnover);
    opt_i64(w, s.open_px);
    opt_i64(w, s.high_px);
    opt_i64(w, s.low_px);
    w.u32(s.trades);
    match &inst.def {
        None => w.bool(false),
        Some(d) => {
            w.bool(true);
            w.u32(d.instrument.0);
            w.bytes(d.symbol.as_bytes());
            w.u8(match d.market {
                Market::Equity => 0,
                Market::Fx => 1,
                Market::Futures => 2,
            });
            w.u8(d.price_scale);
            w.i64(d.tick.0);
            w.i64(d.lot_size);
            w.i64(d.multiplier);
            w.i128(d.initial_margin.0);
            w.u32(d.band_bps);
            w.i64(d.reference_price.0);
        }
    }
    // The last published top 20 (what the book channel compares the next top with).
    w.u8(inst.top_bids as u8);
    w.u8(inst.top_asks as u8);
    for l in inst.top[..inst.top_bids]
        .iter()
        .chain(&inst.top[TOP_LEVELS..TOP_LEVELS + inst.top_asks])
    {
        w.i64(l.price);
        w.i64(l.qty);
        w.u32(l.orders);
    }
    // Orders in priority order: re-adding them in this order rebuilds every queue.
    w.u64(inst.book.len() as u64);
    for o in inst.book.orders() {
        w.u64(o.order_id);
        w.u8(side_byte(o.side));
        w.i64(o.price);
        w.i64(o.qty);
        w.u64(o.ts_ns);
    }
}

fn decode_instrument(r: &mut Reader<'_>) -> Result<InstrumentOut, DecodeError> {
    let id = r.u32()?;
    let mut inst = InstrumentOut::new(id, None);
    inst.rpt_seq = r.u32()?;
    let flags = r.u8()?;
    if flags >> 5 != 0 {
        return Err(r.error("unknown instrument flags in the publisher state"));
    }
    inst.touched = flags & 1 != 0;
    inst.traded = flags & 2 != 0;
    inst.book_dirty = flags & 4 != 0;
    inst.stats_dirty = flags & 8 != 0;
    inst.announce = flags & 16 != 0;
    inst.phase = match r.u8()? {
        0 => None,
        1 => Some(Phase::Open),
        2 => Some(Phase::Halted),
        3 => Some(Phase::Closed),
        4 => Some(Phase::Paused),
        5 => Some(Phase::OpeningAuction),
        6 => Some(Phase::ClosingAuction),
        7 => Some(Phase::VolatilityAuction),
        _ => return Err(r.error("bad phase in the publisher state")),
    };
    inst.stats = Stats {
        last_px: read_opt_i64(r)?,
        last_qty: read_opt_i64(r)?,
        volume: r.i64()?,
        turnover: r.i64()?,
        open_px: read_opt_i64(r)?,
        high_px: read_opt_i64(r)?,
        low_px: read_opt_i64(r)?,
        trades: r.u32()?,
    };
    if r.bool()? {
        let instrument = InstrumentId(r.u32()?);
        let symbol = String::from_utf8(r.bytes(SYMBOL_STATE_BYTES_MAX)?.to_vec())
            .map_err(|_| r.error("symbol is not UTF-8"))?;
        let market = match r.u8()? {
            0 => Market::Equity,
            1 => Market::Fx,
            2 => Market::Futures,
            _ => return Err(r.error("bad market in the publisher state")),
        };
        inst.def = Some(Instrument {
            instrument,
            symbol,
            market,
            price_scale: r.u8()?,
            tick: Price(r.i64()?),
            lot_size: r.i64()?,
            multiplier: r.i64()?,
            initial_margin: Cash(r.i128()?),
            band_bps: r.u32()?,
            reference_price: Price(r.i64()?),
            volatility: Default::default(),
        });
    }
    let (nb, na) = (r.u8()? as usize, r.u8()? as usize);
    if nb > TOP_LEVELS || na > TOP_LEVELS {
        return Err(r.error("more than 20 top levels in the publisher state"));
    }
    inst.top_bids = nb;
    inst.top_asks = na;
    for k in 0..nb + na {
        let slot = if k < nb { k } else { TOP_LEVELS + k - nb };
        inst.top[slot] = LevelView {
            price: r.i64()?,
            qty: r.i64()?,
            orders: r.u32()?,
        };
    }
    let orders = r.count(BOOK_ORDER_STATE_BYTES)?;
    for _ in 0..orders {
        let order = BookOrder {
            order_id: r.u64()?,
            side: read_side(r)?,
            price: r.i64()?,
            qty: r.i64()?,
            ts_ns: r.u64()?,
        };
        if inst.book.add(order).is_err() {
            return Err(r.error("a book order of the publisher state does not apply"));
        }
    }
    Ok(inst)
}

/// Errors the publisher met in its own view of the books: the events contradicted what it had
/// published (it was started mid-stream, or given uncommitted events). Counted, never fatal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherAnomalies {
    pub book_errors: u64,
    pub last_error: Option<BookError>,
}

/// A replay history per incremental channel, `None` for the loops, as `config` asks; none at
/// all when it asks for none (a publisher kept only for its numbering copies no packet).
pub(crate) fn replay_histories(config: &PublisherConfig) -> Vec<Option<Arc<Mutex<History>>>> {
    Channel::ALL
        .iter()
        .map(|c| {
            (c.is_incremental() && config.replay_history_packets > 0).then(|| {
                Arc::new(Mutex::new(History::with_bytes(
                    config.replay_history_packets,
                    config.replay_history_bytes,
                )))
            })
        })
        .collect()
}

/// The market data publisher of one core. See the module documentation.
pub struct Publisher {
    config: PublisherConfig,
    channels: Vec<ChannelOut>,
    instruments: Vec<InstrumentOut>,
    index: FxHashMap<u32, usize>,
    /// Replay history per channel: kept for the incremental channels, `None` for the loops.
    histories: Vec<Option<Arc<Mutex<History>>>>,
    active: bool,
    /// Became active after being a standby: announce the loop channels' numbering.
    loop_reset_due: bool,
    pending_exec: Option<PendingExec>,
    touched: Vec<usize>,
    book_dirty: Vec<usize>,
    stats_dirty: Vec<usize>,
    transact_ns: u64,
    session_status_sent: bool,
    snapshot_cursor: usize,
    last_snapshot_ns: u64,
    last_instruments_ns: Option<u64>,
    scratch: [LevelView; 2 * TOP_LEVELS],
    anomalies: PublisherAnomalies,
    /// See [`Publisher::definitions_version`].
    definitions_version: u64,
}

impl Publisher {
    /// A publisher starting a fresh session: every channel at MsgSeqNum 1.
    pub fn new(config: PublisherConfig, instruments: &[Instrument]) -> Publisher {
        assert!(
            config.packet_bytes_max >= PACKET_BYTES_MIN
                && config.packet_bytes_max <= PACKET_BYTES_MAX,
            "packet_bytes_max must be in {PACKET_BYTES_MIN}..={PACKET_BYTES_MAX}"
        );
        let channels = Channel::ALL
            .iter()
            .map(|&c| {
                let mode = if c.is_incremental() {
                    config.modes[c.index()]
                } else {
                    PublicationMode::Online
                };
                ChannelOut::new(c, mode, config.packet_bytes_max)
            })
            .collect();
        let histories = replay_histories(&config);
        let mut p = Publisher {
            config,
            channels,
            instruments: Vec::new(),
            index: FxHashMap::default(),
            histories,
            active: true,
            loop_reset_due: false,
            pending_exec: None,
            touched: Vec::new(),
            book_dirty: Vec::new(),
            stats_dirty: Vec::new(),
            transact_ns: 0,
            session_status_sent: false,
            snapshot_cursor: 0,
            last_snapshot_ns: 0,
            last_instruments_ns: None,
            scratch: [LevelView::default(); 2 * TOP_LEVELS],
            anomalies: PublisherAnomalies::default(),
            definitions_version: 0,
        };
        for def in instruments {
            p.add_instrument(def.clone());
        }
        p
    }

    /// A publisher that continues exactly where `state` was taken: same books, RptSeqs and
    /// next MsgSeqNums. Its replay history starts empty.
    pub fn from_state(config: PublisherConfig, state: PublisherState) -> Publisher {
        let mut p = Publisher::new(config, &[]);
        for (c, &seq) in p.channels.iter_mut().zip(state.next_seq.iter()) {
            c.next_seq = seq;
        }
        p.session_status_sent = state.session_status_sent;
        for inst in state.instruments {
            let i = p.instruments.len();
            // The lists of pending refreshes follow the instruments' own flags, so that a
            // refresh owed when the state was taken (1 ms / 15 ms modes) is still sent.
            if inst.touched {
                p.touched.push(i);
            }
            if inst.book_dirty {
                p.book_dirty.push(i);
            }
            if inst.stats_dirty {
                p.stats_dirty.push(i);
            }
            p.index.insert(inst.id, i);
            p.instruments.push(inst);
        }
        p
    }

    /// A copy of everything needed to continue the feed (see [`Publisher::from_state`]).
    /// Packets not yet flushed are not part of it: take it right after a publish in online
    /// mode, or after [`Publisher::flush_all`].
    pub fn state(&self) -> PublisherState {
        let mut next_seq = [1u32; CHANNEL_COUNT];
        for (s, c) in next_seq.iter_mut().zip(self.channels.iter()) {
            *s = c.next_seq;
        }
        PublisherState {
            next_seq,
            instruments: self.instruments.clone(),
            session_status_sent: self.session_status_sent,
        }
    }

    /// Writes the bytes of [`Publisher::state`] (the same as [`PublisherState::encode`])
    /// without copying the books. Like `state`, it leaves out packets not yet flushed.
    pub fn encode_state(&self, w: &mut Writer) {
        let mut next_seq = [1u32; CHANNEL_COUNT];
        for (s, c) in next_seq.iter_mut().zip(self.channels.iter()) {
            *s = c.next_seq;
        }
        encode_state_parts(&next_seq, &self.instruments, self.session_status_sent, w);
    }

    /// A standby (inactive) publisher does all its work and keeps its replay history but sends
    /// nothing; activating it makes it the leader's publisher. On activation the next
    /// [`Publisher::tick`] sends SequenceReset on the instrument and snapshot loops (whose
    /// numbering follows the wall clock, so it is not the old leader's) and restarts the
    /// instrument loop at once; the incremental channels continue their numbering.
    pub fn set_active(&mut self, active: bool) {
        if active && !self.active {
            self.loop_reset_due = true;
            self.last_instruments_ns = None;
        }
        self.active = active;
    }

    pub fn is_active(&self) -> bool {
        self.active
    }

    pub fn config(&self) -> &PublisherConfig {
        &self.config
    }

    /// The order-log packets kept for replay; hand this to a [`crate::replay::ReplayServer`].
    /// Panics if the publisher was configured to keep none (`replay_history_packets = 0`).
    pub fn history(&self) -> Arc<Mutex<History>> {
        self.history_of(Channel::Orders)
            .expect("a publisher configured with replay_history_packets > 0")
    }

    /// The packets of an incremental channel kept for replay (`None` for the loops).
    pub fn history_of(&self, channel: Channel) -> Option<Arc<Mutex<History>>> {
        self.histories[channel.index()].as_ref().map(Arc::clone)
    }

    pub fn counters(&self, channel: Channel) -> ChannelCounters {
        self.channels[channel.index()].counters
    }

    pub fn anomalies(&self) -> PublisherAnomalies {
        self.anomalies
    }

    /// The MsgSeqNum the next data packet of `channel` will take.
    pub fn next_seq(&self, channel: Channel) -> u32 {
        self.channels[channel.index()].next_seq
    }

    /// The MsgSeqNum of the next packet of `channel` not yet handed to a sink: packets closed
    /// but waiting for their flush (1 ms / 15 ms modes) are numbered and not yet handed over.
    pub fn next_unsent_seq(&self, channel: Channel) -> u32 {
        let ch = &self.channels[channel.index()];
        ch.next_seq.wrapping_sub(ch.ready.len() as u32)
    }

    /// The publisher's book of an instrument.
    pub fn book(&self, instrument: u32) -> Option<&OrderBook> {
        self.index
            .get(&instrument)
            .map(|&i| &self.instruments[i].book)
    }

    /// The instruments known, in the order they were added.
    pub fn instrument_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.instruments.iter().map(|i| i.id)
    }

    /// Gives (or replaces) an instrument's definition. A new instrument is announced on the
    /// order log with an EmptyBook (RptSeq 1) on the next publish.
    pub fn add_instrument(&mut self, def: Instrument) {
        self.definitions_version += 1;
        let id = def.instrument.0;
        match self.index.get(&id) {
            Some(&i) => self.instruments[i].def = Some(def),
            None => {
                self.index.insert(id, self.instruments.len());
                self.instruments.push(InstrumentOut::new(id, Some(def)));
            }
        }
    }

    fn instrument_index(&mut self, id: InstrumentId) -> usize {
        if let Some(&i) = self.index.get(&id.0) {
            return i;
        }
        // Events about an instrument nobody defined: publish its order log anyway; the
        // definition loop will carry it once a definition is given.
        self.index.insert(id.0, self.instruments.len());
        self.instruments.push(InstrumentOut::new(id.0, None));
        self.instruments.len() - 1
    }

    fn touch(&mut self, i: usize) {
        if !self.instruments[i].touched {
            self.instruments[i].touched = true;
            self.touched.push(i);
        }
    }

    /// Publishes one committed batch of events (in commit order). Online channels send before
    /// this returns; the others wait for [`Publisher::tick`].
    ///
    /// In the 1 ms and 15 ms modes a channel's packets close when a batch's time (the `ts_ns`
    /// of its first event, which the core took from the command) enters a new interval
    /// (`ts_ns / interval` changes), so packet boundaries, and hence MsgSeqNums, are a
    /// function of the committed batches alone, as in online mode. [`Publisher::tick`] flushes
    /// by the wall clock only a channel left idle: one whose unsent messages belong to an
    /// interval that ended at least one interval ago.
    pub fn publish(&mut self, events: &[Event], now_ns: u64, sink: &mut dyn PacketSink) {
        self.transact_ns = events.first().map_or(now_ns, Event::ts_ns).max(1);
        for c in Channel::ALL {
            let interval = self.channels[c.index()].mode.interval_ns();
            if interval == 0 || !c.is_incremental() {
                continue;
            }
            let bucket = self.transact_ns / interval;
            if self.channels[c.index()].bucket != bucket {
                if self.has_pending(c) {
                    self.flush_channel(c, now_ns, sink);
                }
                self.channels[c.index()].bucket = bucket;
            }
        }
        self.start_session(now_ns);
        self.announce_instruments(now_ns);
        for e in events {
            self.on_event(e, now_ns);
        }
        self.pending_exec = None;
        self.end_batch(now_ns, sink);
    }

    fn start_session(&mut self, now_ns: u64) {
        if self.session_status_sent {
            return;
        }
        self.session_status_sent = true;
        let session = self.config.session_id;
        let market = self
            .instruments
            .first()
            .and_then(|i| i.def.as_ref())
            .map_or(WireMarket::Equities, |d| wire_market(d.market));
        self.reserve(Channel::Orders, SESSION_STATUS_BYTES, now_ns);
        self.channels[Channel::Orders.index()].put(|mut e: TradingSessionStatusEncoder| {
            e.exchange_trading_session_id(session).market(market);
            e.state(TradingSessionState::Open);
            e
        });
    }

    fn announce_instruments(&mut self, now_ns: u64) {
        for i in 0..self.instruments.len() {
            if self.instruments[i].announce {
                self.instruments[i].announce = false;
                self.empty_book(i, now_ns);
            }
        }
    }

    /// Whether a channel holds messages (or coalesced refreshes) not yet sent.
    fn has_pending(&self, c: Channel) -> bool {
        self.channels[c.index()].has_unsent()
            || (c == Channel::Book && !self.book_dirty.is_empty())
            || (c == Channel::Statistics && !self.stats_dirty.is_empty())
    }

    fn reserve(&mut self, channel: Channel, message_bytes: usize, now_ns: u64) {
        let history = self.histories[channel.index()].as_deref();
        self.channels[channel.index()].reserve(
            message_bytes,
            now_ns,
            self.transact_ns,
            self.config.session_id,
            history,
        );
    }

    fn next_rpt(&mut self, i: usize) -> u32 {
        let inst = &mut self.instruments[i];
        inst.rpt_seq = inst.rpt_seq.wrapping_add(1);
        inst.rpt_seq
    }

    fn empty_book(&mut self, i: usize, now_ns: u64) {
        self.instruments[i].book.clear();
        self.touch(i);
        let rpt = self.next_rpt(i);
        let id = self.instruments[i].id;
        self.reserve(Channel::Orders, EMPTY_BOOK_BYTES, now_ns);
        self.channels[Channel::Orders.index()].put(|mut e: EmptyBookEncoder| {
            e.security_id_opt(Some(id)).rpt_seq(rpt);
            e
        });
    }

    fn on_event(&mut self, e: &Event, now_ns: u64) {
        match *e {
            Event::OrderLog(ref l) => self.order_log(l, now_ns),
            Event::Trade {
                trade_id,
                instrument,
                price,
                qty,
                aggressor,
                buy,
                sell,
                auction,
                ..
            } => {
                let i = self.instrument_index(instrument);
                self.touch(i);
                self.instruments[i].stats.on_trade(price.0, qty.0);
                self.instruments[i].traded = true;
                self.follow_reference(i, price.0);
                let resting = match aggressor {
                    Side::Buy => sell.order_id,
                    Side::Sell => buy.order_id,
                };
                // In an uncrossing both orders rest and one may trade several times before its
                // order-log record comes, so its record is an OrderUpdate of what is left and
                // the trades are on the trades channel alone (tradeType Auction).
                self.pending_exec = (!auction).then_some(PendingExec {
                    resting_order: resting.0,
                    trade_id: trade_id.0,
                    price: price.0,
                    qty: qty.0,
                });
                let id = self.instruments[i].id;
                self.reserve(Channel::Trades, TRADE_BYTES, now_ns);
                self.channels[Channel::Trades.index()].put(|mut e: TradeEncoder| {
                    e.trade_id(trade_id.0)
                        .price(price.0)
                        .qty(qty.0)
                        .security_id(id)
                        .aggressor_side(wire_side(aggressor))
                        .trade_type(if auction {
                            TradeType::Auction
                        } else {
                            TradeType::Continuous
                        });
                    e
                });
            }
            Event::AuctionIndicative {
                instrument,
                price,
                qty,
                surplus,
                surplus_side,
                ..
            } => {
                // On the incremental channel, in order with the order log that moved it, so a
                // subscriber sees the indicative uncrossing of the book it just rebuilt.
                let i = self.instrument_index(instrument);
                let id = self.instruments[i].id;
                let side = match surplus_side {
                    None => SideOpt::None,
                    Some(Side::Buy) => SideOpt::Buy,
                    Some(Side::Sell) => SideOpt::Sell,
                };
                let price = (qty.0 > 0).then_some(price.0);
                self.reserve(Channel::Orders, AUCTION_INDICATIVE_BYTES, now_ns);
                self.channels[Channel::Orders.index()].put(|mut e: AuctionIndicativeEncoder| {
                    e.security_id(id)
                        .price_opt(price)
                        .qty(qty.0)
                        .surplus(surplus.0)
                        .surplus_side(side);
                    e
                });
            }
            Event::OrderReplaced {
                order_id,
                instrument,
                priority_kept: false,
                ..
            } => {
                let i = self.instrument_index(instrument);
                if let Ok(o) = self.instruments[i].book.remove(order_id.0) {
                    self.touch(i);
                    self.emit_update(i, &o, 0, MdUpdateAction::Delete, now_ns);
                }
            }
            Event::InstrumentAdded {
                instrument,
                definition,
                ..
            } => {
                // Known from now on (announced with EmptyBook on the next batch), and
                // defined by its event unless a definition was given already
                // (`add_instrument`): an operator's addition at run time reaches the
                // instruments channel on its next pass.
                let i = self.instrument_index(instrument);
                if self.instruments[i].def.is_none() {
                    self.instruments[i].def = Some(definition.instrument(instrument));
                }
            }
            Event::PhaseChanged {
                instrument, phase, ..
            } => {
                let i = self.instrument_index(instrument);
                self.instruments[i].phase = Some(phase);
                self.emit_status(i, phase, now_ns);
            }
            _ => {}
        }
    }

    /// Moves the instrument's reference price to a trade's price, as the core does
    /// (`bourse_engine`'s `Book::set_reference`), so that the band this feed states is the band
    /// the core enforces on the next order.
    fn follow_reference(&mut self, i: usize, price: i64) {
        let inst = &mut self.instruments[i];
        if let Some(def) = inst.def.as_mut() {
            if def.reference_price.0 != price {
                def.reference_price = Price(price);
                inst.band_moved = true;
                // The instrument loop's SecurityDefinitions state the band too; the node's
                // loop copies the definitions again at its next pass (not per batch).
                self.definitions_version += 1;
            }
        }
    }

    /// SecurityStatus for instrument `i`: its phase and the price band in force now.
    fn emit_status(&mut self, i: usize, phase: Phase, now_ns: u64) {
        let inst = &mut self.instruments[i];
        inst.band_moved = false;
        let id = inst.id;
        let band = inst.def.as_ref().map(|d| d.band());
        self.reserve(Channel::Orders, SECURITY_STATUS_BYTES, now_ns);
        self.channels[Channel::Orders.index()].put(|mut e: SecurityStatusEncoder| {
            e.security_id(id)
                .low_limit_px_opt(band.map(|b| b.0 .0))
                .high_limit_px_opt(band.map(|b| b.1 .0));
            e.trading_status(wire_status(phase));
            e
        });
    }

    /// A SecurityStatus for every instrument whose band a trade of this batch moved (one per
    /// instrument and batch, however many trades moved it), so the order log's subscribers
    /// learn the new band before the next batch can be refused against it.
    fn emit_moved_bands(&mut self, now_ns: u64) {
        for k in 0..self.touched.len() {
            let i = self.touched[k];
            if self.instruments[i].band_moved {
                // A trade implies a phase that trades; a feed that has seen no phase change
                // yet is in the phase every instrument starts the session in.
                let phase = self.instruments[i].phase.unwrap_or(Phase::Open);
                self.emit_status(i, phase, now_ns);
            }
        }
    }

    fn book_error(&mut self, e: BookError) {
        self.anomalies.book_errors += 1;
        self.anomalies.last_error = Some(e);
    }

    fn order_log(&mut self, l: &OrderLog, now_ns: u64) {
        let i = self.instrument_index(l.instrument);
        let id = l.order_id.0;
        let exec = match self.pending_exec {
            Some(p) if p.resting_order == id => {
                self.pending_exec = None;
                Some(p)
            }
            _ => None,
        };
        let order = BookOrder {
            order_id: id,
            side: l.side,
            price: l.price.0,
            qty: l.qty_display.0,
            ts_ns: l.ts_ns,
        };
        let prev = self.instruments[i].book.get(id).copied();
        match (l.action, prev) {
            (OrderLogAction::New, None) | (OrderLogAction::Change, None) => {
                if order.qty > 0 {
                    self.add(i, order, now_ns);
                }
            }
            (OrderLogAction::Delete, None) => {} // never rested: nothing to publish
            (OrderLogAction::Delete, Some(p)) => {
                let _ = self.instruments[i].book.remove(id);
                self.touch(i);
                match exec {
                    Some(x) => self.emit_exec(i, &p, 0, x, MdUpdateAction::Delete, now_ns),
                    None => self.emit_update(i, &p, 0, MdUpdateAction::Delete, now_ns),
                }
            }
            (OrderLogAction::New | OrderLogAction::Change, Some(p)) => {
                self.touch(i);
                let in_place = p.price == order.price
                    && order.qty > 0
                    && match exec {
                        Some(x) => p.qty - x.qty == order.qty,
                        None => order.qty <= p.qty,
                    };
                if in_place {
                    if let Err(e) = self.instruments[i].book.change_qty(id, order.qty) {
                        self.book_error(e);
                    }
                    match exec {
                        Some(x) => {
                            self.emit_exec(i, &p, order.qty, x, MdUpdateAction::Change, now_ns)
                        }
                        None => self.emit_update(i, &p, order.qty, MdUpdateAction::Change, now_ns),
                    }
                } else {
                    // The order lost its place (iceberg refill, replace that grew or moved it):
                    // Delete, then New at the back of the queue.
                    let _ = self.instruments[i].book.remove(id);
                    match exec {
                        Some(x) => self.emit_exec(i, &p, 0, x, MdUpdateAction::Delete, now_ns),
                        None => self.emit_update(i, &p, 0, MdUpdateAction::Delete, now_ns),
                    }
                    if order.qty > 0 {
                        self.add(i, order, now_ns);
                    }
                }
            }
        }
    }

    fn add(&mut self, i: usize, order: BookOrder, now_ns: u64) {
        self.touch(i);
        match self.instruments[i].book.add(order) {
            Ok(()) => self.emit_update(i, &order, order.qty, MdUpdateAction::New, now_ns),
            Err(e) => self.book_error(e),
        }
    }

    fn emit_update(
        &mut self,
        i: usize,
        o: &BookOrder,
        size: i64,
        action: MdUpdateAction,
        now_ns: u64,
    ) {
        let rpt = self.next_rpt(i);
        let sid = self.instruments[i].id;
        self.reserve(Channel::Orders, ORDER_UPDATE_BYTES, now_ns);
        let (id, px, side) = (o.order_id, o.price, wire_side(o.side));
        self.channels[Channel::Orders.index()].put(|mut e: OrderUpdateEncoder| {
            e.md_entry_id(id)
                .md_entry_px(px)
                .md_entry_size(size)
                .security_id(sid);
            e.rpt_seq(rpt).md_update_action(action).side(side);
            e
        });
    }

    fn emit_exec(
        &mut self,
        i: usize,
        o: &BookOrder,
        size: i64,
        x: PendingExec,
        action: MdUpdateAction,
        now_ns: u64,
    ) {
        let rpt = self.next_rpt(i);
        let sid = self.instruments[i].id;
        self.reserve(Channel::Orders, ORDER_EXECUTION_BYTES, now_ns);
        let (id, px, side) = (o.order_id, o.price, wire_side(o.side));
        self.channels[Channel::Orders.index()].put(|mut e: OrderExecutionEncoder| {
            e.md_entry_id(id)
                .trade_id(x.trade_id)
                .md_entry_px(px)
                .md_entry_size(size);
            e.last_px(x.price)
                .last_qty(x.qty)
                .security_id(sid)
                .rpt_seq(rpt);
            e.md_update_action(action).side(side);
            e
        });
    }

    /// After a batch: mark transaction ends, find instruments whose top 20 or statistics
    /// changed, and send what is online.
    fn end_batch(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        self.emit_moved_bands(now_ns);
        for c in [Channel::Orders, Channel::Trades] {
            let ch = &mut self.channels[c.index()];
            if ch.len > 0 && ch.msgs > 0 {
                ch.ends_txn = true;
            }
            // The order log and trades leave first: the top-20 and statistics work below
            // must not delay them.
            if ch.mode == PublicationMode::Online {
                self.flush_channel(c, now_ns, sink);
            }
        }
        let touched = std::mem::take(&mut self.touched);
        for &i in &touched {
            let inst = &mut self.instruments[i];
            inst.touched = false;
            let (bids, asks) = self.scratch.split_at_mut(TOP_LEVELS);
            let nb = inst.book.top_into(Side::Buy, bids);
            let na = inst.book.top_into(Side::Sell, asks);
            let changed = nb != inst.top_bids
                || na != inst.top_asks
                || inst.top[..nb] != self.scratch[..nb]
                || inst.top[TOP_LEVELS..TOP_LEVELS + na]
                    != self.scratch[TOP_LEVELS..TOP_LEVELS + na];
            let best_changed = (nb > 0) != (inst.top_bids > 0)
                || (na > 0) != (inst.top_asks > 0)
                || (nb > 0 && inst.top[0] != self.scratch[0])
                || (na > 0 && inst.top[TOP_LEVELS] != self.scratch[TOP_LEVELS]);
            if changed {
                inst.top = self.scratch;
                inst.top_bids = nb;
                inst.top_asks = na;
                if !inst.book_dirty {
                    inst.book_dirty = true;
                    self.book_dirty.push(i);
                }
            }
            if (best_changed || inst.traded) && !inst.stats_dirty {
                inst.stats_dirty = true;
                self.stats_dirty.push(i);
            }
            inst.traded = false;
        }
        self.touched = touched;
        self.touched.clear();
        for c in [Channel::Book, Channel::Statistics] {
            if self.channels[c.index()].mode == PublicationMode::Online {
                self.flush_channel(c, now_ns, sink);
            }
        }
    }

    fn emit_books(&mut self, now_ns: u64) {
        let dirty = std::mem::take(&mut self.book_dirty);
        let bytes_max = self.config.packet_bytes_max;
        for &i in &dirty {
            self.instruments[i].book_dirty = false;
            let (nb, na) = (self.instruments[i].top_bids, self.instruments[i].top_asks);
            let bytes = AGGREGATED_ROOT_BYTES + (nb + na) * AGGREGATED_LEVEL_BYTES;
            debug_assert!(bytes + PACKET_HEADER_BYTES + INCREMENTAL_HEADER_BYTES <= bytes_max);
            self.reserve(Channel::Book, bytes, now_ns);
            let inst = &self.instruments[i];
            let (sid, rpt, top) = (inst.id, inst.rpt_seq, inst.top);
            self.channels[Channel::Book.index()].put(
                |mut e: aggregated_book_codec::AggregatedBookEncoder| {
                    e.security_id(sid).rpt_seq(rpt);
                    let mut g = e.levels_encoder(
                        (nb + na) as u8,
                        aggregated_book_codec::encoder::LevelsEncoder::default(),
                    );
                    let mut k = 0usize;
                    while let Ok(Some(_)) = g.advance() {
                        let (l, side, level) = if k < nb {
                            (top[k], WireSide::Buy, k + 1)
                        } else {
                            (top[TOP_LEVELS + k - nb], WireSide::Sell, k - nb + 1)
                        };
                        g.price(l.price).qty(l.qty).order_count(l.orders).side(side);
                        g.level(level as u8);
                        k += 1;
                    }
                    // The group was wrapped around its parent just above; it is always there.
                    g.parent().expect("group parent set by levels_encoder")
                },
            );
        }
        self.book_dirty = dirty;
        self.book_dirty.clear();
    }

    fn emit_stats(&mut self, now_ns: u64) {
        let dirty = std::mem::take(&mut self.stats_dirty);
        for &i in &dirty {
            self.instruments[i].stats_dirty = false;
            self.reserve(Channel::Statistics, STATISTICS_BYTES, now_ns);
            let inst = &self.instruments[i];
            let s = inst.stats;
            let vwap = s.vwap();
            let bid = (inst.top_bids > 0).then_some(inst.top[0]);
            let ask = (inst.top_asks > 0).then_some(inst.top[TOP_LEVELS]);
            let sid = inst.id;
            self.channels[Channel::Statistics.index()].put(|mut e: StatisticsEncoder| {
                e.last_px_opt(s.last_px)
                    .last_qty_opt(s.last_qty)
                    .volume(s.volume)
                    .turnover(s.turnover);
                e.open_px_opt(s.open_px)
                    .high_px_opt(s.high_px)
                    .low_px_opt(s.low_px)
                    .vwap_px_opt(vwap);
                e.best_bid_px_opt(bid.map(|l| l.price))
                    .best_bid_qty_opt(bid.map(|l| l.qty));
                e.best_ask_px_opt(ask.map(|l| l.price))
                    .best_ask_qty_opt(ask.map(|l| l.qty));
                e.security_id(sid).number_of_trades(s.trades);
                e
            });
        }
        self.stats_dirty = dirty;
        self.stats_dirty.clear();
    }

    fn flush_channel(&mut self, c: Channel, now_ns: u64, sink: &mut dyn PacketSink) {
        match c {
            Channel::Book => self.emit_books(now_ns),
            Channel::Statistics => self.emit_stats(now_ns),
            _ => {}
        }
        let history = self.histories[c.index()].as_deref();
        let active = self.active;
        let ch = &mut self.channels[c.index()];
        ch.close(now_ns, history);
        ch.flush(now_ns, active, sink);
    }

    /// Sends everything pending on every channel now, whatever the mode.
    pub fn flush_all(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        for c in Channel::ALL {
            self.flush_channel(c, now_ns, sink);
        }
    }

    /// The duty cycle between batches: flushes interval channels that are due, sends
    /// heartbeats on idle channels, and advances the snapshot and instrument loops. Call it
    /// often (every few hundred µs); it does little when nothing is due.
    pub fn tick(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        if self.loop_reset_due {
            self.loop_reset_due = false;
            let active = self.active;
            for c in [Channel::Instruments, Channel::Snapshot] {
                self.channels[c.index()].sequence_reset(now_ns, active, sink);
            }
        }
        if self.config.idle_flush_by_clock {
            self.idle_flush(now_ns, sink);
        }
        self.instrument_loop(now_ns, sink);
        self.snapshot_loop(now_ns, sink);
        let hb = self.config.heartbeat_interval_ns;
        let active = self.active;
        for ch in &mut self.channels {
            if !ch.has_unsent() && now_ns.saturating_sub(ch.last_send_ns) >= hb {
                ch.heartbeat(now_ns, active, sink);
            }
        }
    }

    /// Whether a 1 ms / 15 ms channel is idle at `now_ns`: its unsent messages' interval
    /// ended a whole interval ago and no batch of a later interval came to close them (see
    /// [`Publisher::publish`]).
    pub fn idle_flush_due(&self, now_ns: u64) -> bool {
        Channel::ALL.into_iter().any(|c| self.idle(c, now_ns))
    }

    fn idle(&self, c: Channel, now_ns: u64) -> bool {
        let ch = &self.channels[c.index()];
        let interval = ch.mode.interval_ns();
        interval > 0 && now_ns / interval >= ch.bucket.saturating_add(2) && self.has_pending(c)
    }

    /// The idle flush: closes and sends (when active) the packets of every channel idle at
    /// `now_ns`. A function of the publisher's state and `now_ns` alone, so replicas that
    /// apply it at the same point of the same log with the same `now_ns` close the same
    /// packets.
    pub fn idle_flush(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        for c in Channel::ALL {
            if self.idle(c, now_ns) {
                self.flush_channel(c, now_ns, sink);
            }
        }
    }

    fn instrument_loop(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        if self
            .last_instruments_ns
            .is_some_and(|t| now_ns.saturating_sub(t) < self.config.instruments_interval_ns)
        {
            return;
        }
        self.last_instruments_ns = Some(now_ns);
        self.send_definitions(now_ns, sink);
    }

    /// Sends one full pass of SecurityDefinition messages now.
    pub fn send_definitions(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        put_definitions(
            &mut self.channels[Channel::Instruments.index()],
            self.instruments.iter().filter_map(|i| i.def.as_ref()),
            now_ns,
        );
        self.flush_channel(Channel::Instruments, now_ns, sink);
    }

    fn snapshot_loop(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        // One instrument per slice of the cycle, so a full pass takes the cycle whatever the
        // number of instruments.
        let spacing_ns = self.config.snapshot_cycle_ns / (self.instruments.len().max(1) as u64);
        if self.instruments.is_empty() || now_ns.saturating_sub(self.last_snapshot_ns) < spacing_ns
        {
            return;
        }
        // A snapshot must reflect exactly the order-log packets already sent: skip this turn
        // while the order log holds unsent messages (1 ms / 15 ms modes between flushes).
        if !self.snapshot_consistent() {
            return;
        }
        self.last_snapshot_ns = now_ns;
        let i = self.snapshot_cursor % self.instruments.len();
        self.snapshot_cursor = (i + 1) % self.instruments.len();
        self.send_snapshot(i, now_ns, sink);
    }

    /// Sends one instrument's snapshot (one or more packets) on the snapshot channel.
    fn send_snapshot(&mut self, i: usize, now_ns: u64, sink: &mut dyn PacketSink) {
        let head = self.snapshot_head(i);
        let inst = &self.instruments[i];
        let ch = &mut self.channels[Channel::Snapshot.index()];
        put_snapshot(
            ch,
            self.config.packet_bytes_max,
            self.config.session_id,
            &head,
            inst.book.orders(),
            inst.book.len(),
            now_ns,
        );
        ch.flush(now_ns, self.active, sink);
    }

    /// The instruments known (those the snapshot loop cycles over).
    pub fn instrument_count(&self) -> usize {
        self.instruments.len()
    }

    /// Grows by one whenever an instrument's definition is given or replaced, so that a
    /// holder of a copy of the definitions knows when to take them again.
    pub fn definitions_version(&self) -> u64 {
        self.definitions_version
    }

    /// Copies every known definition, in the order the instrument loop sends them.
    pub fn definitions_into(&self, out: &mut Vec<Instrument>) {
        out.clear();
        out.extend(self.instruments.iter().filter_map(|i| i.def.clone()));
    }

    /// What the snapshot of the instrument at `position` (modulo the number known) says, its
    /// orders copied into `orders` in priority order; `None` while the order log holds
    /// messages not yet in a closed packet or a new instrument is not yet announced (a
    /// snapshot must reflect exactly the order-log packets closed so far).
    pub fn snapshot_of(
        &self,
        position: usize,
        orders: &mut Vec<BookOrder>,
    ) -> Option<SnapshotHead> {
        if self.instruments.is_empty() || !self.snapshot_consistent() {
            return None;
        }
        let i = position % self.instruments.len();
        orders.clear();
        orders.extend(self.instruments[i].book.orders().copied());
        Some(self.snapshot_head(i))
    }

    /// Whether a snapshot taken now reflects exactly the order-log packets closed so far: no
    /// order-log message waits in an open packet, no new instrument waits for its EmptyBook.
    fn snapshot_consistent(&self) -> bool {
        !self.channels[Channel::Orders.index()].has_unsent()
            && !self.instruments.iter().any(|i| i.announce)
    }

    /// What the snapshot of the instrument at `i` says besides its orders.
    fn snapshot_head(&self, i: usize) -> SnapshotHead {
        SnapshotHead {
            security_id: self.instruments[i].id,
            rpt_seq: self.instruments[i].rpt_seq,
            last_msg_seq_num: self.channels[Channel::Orders.index()]
                .next_seq
                .wrapping_sub(1),
            instruments_total: self.instruments.len() as u32,
        }
    }

    /// When the next idle flush falls due (see [`Publisher::idle_flush_due`]): the earliest
    /// time at which a 1 ms / 15 ms channel holding unsent messages is idle; `None` when
    /// nothing waits.
    pub fn idle_flush_deadline_ns(&self) -> Option<u64> {
        Channel::ALL
            .into_iter()
            .filter(|&c| self.has_pending(c))
            .filter_map(|c| {
                let ch = &self.channels[c.index()];
                let interval = ch.mode.interval_ns();
                (interval > 0).then(|| ch.bucket.saturating_add(2).saturating_mul(interval))
            })
            .min()
    }
}

/// What one instrument's snapshot says besides its orders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotHead {
    pub security_id: u32,
    /// The instrument's RptSeq after the last order-log message about it.
    pub rpt_seq: u32,
    /// The order log's last MsgSeqNum the snapshot reflects.
    pub last_msg_seq_num: u32,
    /// Instruments in the loop (TotNumReports).
    pub instruments_total: u32,
}

/// Puts one full pass of SecurityDefinition messages on the instrument loop's channel; the
/// caller closes and flushes it.
pub(crate) fn put_definitions<'a>(
    ch: &mut ChannelOut,
    defs: impl Iterator<Item = &'a Instrument> + Clone,
    now_ns: u64,
) {
    let total = defs.clone().count() as u32;
    for def in defs {
        ch.reserve(SECURITY_DEFINITION_BYTES, now_ns, 0, 0, None);
        let symbol = def.symbol.as_bytes();
        let symbol = &symbol[..symbol.len().min(24)];
        let (low, high) = def.band();
        ch.put(|mut e: SecurityDefinitionEncoder| {
            e.security_id(def.instrument.0)
                .tick_size(def.tick.0)
                .lot_size(def.lot_size)
                .contract_multiplier(def.multiplier);
            e.low_limit_px_opt(Some(low.0))
                .high_limit_px_opt(Some(high.0))
                .tot_num_reports(total)
                .maturity_date_opt(None);
            e.symbol_zero_padded(symbol)
                .currency(b"XXX")
                .market(wire_market(def.market))
                .price_scale(def.price_scale);
            e
        });
    }
}

/// Puts one instrument's snapshot (one or more closed packets) on the snapshot channel; the
/// caller flushes it.
pub(crate) fn put_snapshot<'a>(
    ch: &mut ChannelOut,
    packet_bytes_max: usize,
    session: u32,
    head: &SnapshotHead,
    mut orders: impl Iterator<Item = &'a BookOrder>,
    count: usize,
    now_ns: u64,
) {
    let per_packet = ((packet_bytes_max - PACKET_HEADER_BYTES - SNAPSHOT_ROOT_BYTES)
        / SNAPSHOT_ENTRY_BYTES)
        .min(usize::from(bourse_wire::market_data::GROUP_COUNT_MAX));
    let (sid, rpt, last_seq, total) = (
        head.security_id,
        head.rpt_seq,
        head.last_msg_seq_num,
        head.instruments_total,
    );
    let mut remaining = count;
    let mut first = true;
    loop {
        let n = remaining.min(per_packet);
        remaining -= n;
        ch.open(0, session);
        let mut flags = 0;
        if first {
            flags |= MsgFlags::START_OF_SNAPSHOT;
        }
        if remaining == 0 {
            flags |= MsgFlags::END_OF_SNAPSHOT;
        }
        ch.flags_extra = flags;
        ch.put(
            |mut e: order_book_snapshot_codec::OrderBookSnapshotEncoder| {
                e.security_id(sid)
                    .last_msg_seq_num_processed(last_seq)
                    .rpt_seq(rpt);
                e.exchange_trading_session_id(session)
                    .tot_num_reports(total);
                let mut g = e.entries_encoder(
                    n as u8,
                    order_book_snapshot_codec::encoder::EntriesEncoder::default(),
                );
                while let Ok(Some(_)) = g.advance() {
                    let Some(o) = orders.next() else { break };
                    g.md_entry_id(o.order_id)
                        .transact_time_ns(o.ts_ns)
                        .md_entry_px(o.price);
                    g.md_entry_size(o.qty).side(wire_side(o.side));
                }
                // The group was wrapped around its parent just above; it is always there.
                g.parent().expect("group parent set by entries_encoder")
            },
        );
        let flags_extra = ch.flags_extra;
        ch.close(now_ns, None);
        ch.flags_extra = flags_extra;
        first = false;
        if remaining == 0 {
            break;
        }
    }
}
