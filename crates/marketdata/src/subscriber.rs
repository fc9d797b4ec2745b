//! The subscriber: A/B arbitration, gap detection, recovery, and books.
//!
//! Sans-I/O like the publisher: [`Subscriber::on_packet`] takes one datagram with the channel
//! and feed it came from and the time; [`Subscriber::poll`] says when a gap has waited long
//! enough and should be replayed (the caller runs the TCP request and feeds the packets back
//! with [`Feed::Replay`], then calls [`Subscriber::on_replay_done`]).
//!
//! Two sequence numbers guard every book:
//!
//! - **MsgSeqNum per channel** orders packets and finds gaps. A packet below the next expected
//!   number is the other feed's copy (dropped); above it, it waits in a bounded buffer for the
//!   missing ones (from the other feed or from replay). A gap that cannot be filled is skipped
//!   and, on the order log, every book is marked stale.
//! - **RptSeq per instrument** decides what an order-log message does to its book: at or below
//!   the book's RptSeq it is already applied (a duplicate, or a message the snapshot already
//!   contains), one above it is applied, further above it reveals lost updates and the book
//!   goes stale. A stale book keeps the instrument's messages in a bounded pending queue until a
//!   snapshot from the snapshot loop arrives, then applies those newer than the snapshot. This
//!   is also what makes a late join and a publisher failover work: nothing depends on which
//!   publisher numbered the packets.
//!
//! Anything that fails validation (malformed, truncated, unknown template, schema version from
//! the future, unknown enum values) is counted in [`SubscriberStats`], described in
//! [`Subscriber::last_skipped`], and skipped; nothing panics.

use crate::book::{BookOrder, LevelView, OrderBook};
use crate::{Channel, Feed, CHANNEL_COUNT};
use bourse_core::Side;
use bourse_wire::market_data::codec::{
    md_update_action::MdUpdateAction, security_trading_status::SecurityTradingStatus,
    side::Side as WireSide, side_opt::SideOpt, trade_type::TradeType,
};
use bourse_wire::market_data::{parse_packet, Message, MsgFlags, Packet, REPLAY_COUNT_MAX};
use bourse_wire::Error as WireError;
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, VecDeque};

/// Most instruments a subscriber tracks; messages naming more are counted and dropped, so a
/// hostile feed cannot grow its memory without bound.
pub const INSTRUMENTS_MAX: usize = 100_000;
/// Most orders collected for one instrument's snapshot.
pub const SNAPSHOT_ORDERS_MAX: usize = 1_000_000;

/// Settings of a subscriber.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// How long a gap waits for the other feed before recovery starts.
    pub arbitration_window_ns: u64,
    /// Packets buffered behind a gap per channel; past this the gap is skipped at once.
    pub gap_buffer_packets_max: usize,
    /// Order-log messages kept per stale instrument while it waits for a snapshot.
    pub pending_messages_per_instrument_max: usize,
    /// Ask the replay services for gaps on the incremental channels (otherwise the order log
    /// recovers from snapshots and the other channels skip the gap).
    pub replay: bool,
}

impl Default for SubscriberConfig {
    fn default() -> Self {
        SubscriberConfig {
            arbitration_window_ns: 2_000_000,
            gap_buffer_packets_max: 100_000,
            pending_messages_per_instrument_max: 1_000_000,
            replay: true,
        }
    }
}

/// What the subscriber saw, did and skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    pub packets_a: u64,
    pub packets_b: u64,
    pub packets_replay: u64,
    /// Packets applied (first copy of each MsgSeqNum).
    pub packets_applied: u64,
    /// Copies dropped because the MsgSeqNum was already applied (mostly the other feed's).
    pub duplicates: u64,
    pub heartbeats: u64,
    pub gaps_detected: u64,
    pub replays_requested: u64,
    pub replay_packets_used: u64,
    /// Gaps given up on (replay failed, too large, or not configured); books recovered from
    /// snapshots instead.
    pub gaps_skipped: u64,
    /// SequenceReset packets on the incremental channels (the publisher restarted them).
    pub sequence_resets: u64,
    /// SequenceReset packets on the instrument and snapshot loops (a new leader's publisher
    /// numbers its loops afresh; nothing is lost).
    pub loop_resets: u64,
    /// Datagrams refused by the parser: bad lengths, bad group counts, no messages, ...
    pub malformed: u64,
    /// Datagrams shorter than their headers say.
    pub truncated: u64,
    pub unknown_template: u64,
    /// Datagrams holding a message of a schema version newer than this build.
    pub future_version: u64,
    pub wrong_schema: u64,
    /// Messages with an enum value this build does not know (side, action): the instrument is
    /// recovered instead of guessing.
    pub unknown_enum: u64,
    pub messages_applied: u64,
    /// Order-log messages at or below the book's RptSeq (already applied).
    pub stale_messages: u64,
    /// RptSeq jumps that made a book stale.
    pub rpt_gaps: u64,
    /// Updates the book could not take (unknown order, duplicate order): the book went stale.
    pub book_errors: u64,
    pub snapshots_applied: u64,
    /// Pending messages dropped because a stale instrument's queue was full.
    pub pending_dropped: u64,
    pub trades: u64,
    /// Messages about instruments beyond `INSTRUMENTS_MAX`, or snapshots beyond
    /// `SNAPSHOT_ORDERS_MAX` orders.
    pub over_limit: u64,
}

impl SubscriberStats {
    /// Every datagram skipped as invalid.
    pub fn skipped(&self) -> u64 {
        self.malformed
            + self.truncated
            + self.unknown_template
            + self.future_version
            + self.wrong_schema
    }
}

/// Ask the replay service for `count` packets of `channel` from `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryRequest {
    pub channel: Channel,
    pub from: u32,
    pub count: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OrderMsg {
    Update {
        id: u64,
        px: i64,
        size: i64,
        action: MdUpdateAction,
        side: WireSide,
    },
    Empty,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    rpt: u32,
    ts_ns: u64,
    msg: OrderMsg,
}

/// Latest statistics of an instrument as published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsView {
    pub last_px: Option<i64>,
    pub last_qty: Option<i64>,
    pub volume: i64,
    pub turnover: i64,
    pub open_px: Option<i64>,
    pub high_px: Option<i64>,
    pub low_px: Option<i64>,
    pub vwap_px: Option<i64>,
    pub best_bid: Option<(i64, i64)>,
    pub best_ask: Option<(i64, i64)>,
    pub trades: u32,
}

/// An instrument's indicative uncrossing during a call auction, as last published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndicativeView {
    /// Where the book would uncross now; none when it does not cross.
    pub price: Option<i64>,
    /// What would execute at `price`.
    pub qty: i64,
    /// What would be left unmatched at `price` (the imbalance), and on which side.
    pub surplus: i64,
    pub surplus_side: Option<Side>,
}

/// What the subscriber knows of one instrument.
#[derive(Clone, Debug, Default)]
pub struct InstrumentView {
    pub id: u32,
    pub symbol: String,
    pub price_scale: u8,
    pub tick: i64,
    /// The order-level book rebuilt from the order log.
    pub book: OrderBook,
    pub rpt_seq: u32,
    /// The book is in step with the feed (false while waiting for a snapshot).
    pub live: bool,
    /// Top 20 as last published on the book channel: bids best first, asks best first.
    pub published_bids: Vec<LevelView>,
    pub published_asks: Vec<LevelView>,
    pub published_rpt_seq: u32,
    pub stats: Option<StatsView>,
    pub status: Option<SecurityTradingStatus>,
    /// The price band (lowest, highest acceptable limit price) the core enforces, as the
    /// latest SecurityStatus or SecurityDefinition stated it (a status after each move; a
    /// subscriber that recovered a gap from a snapshot learns it again at the next pass of
    /// the instruments loop).
    pub band: Option<(i64, i64)>,
    /// During a call auction, its indicative uncrossing; none outside one (cleared when the
    /// instrument's status leaves the auction).
    pub indicative: Option<IndicativeView>,
    /// Trades of call auctions' uncrossings seen on the trades channel.
    pub auction_trades: u32,
    pending: VecDeque<Pending>,
    assembly: Option<(u32, Vec<BookOrder>)>,
}

#[derive(Debug, Default)]
struct ChannelIn {
    expected: Option<u32>,
    buffer: BTreeMap<u32, Vec<u8>>,
    gap_since_ns: Option<u64>,
    /// A heartbeat said packets up to this (exclusive) exist.
    known_until: u32,
    replay_in_flight: bool,
}

impl ChannelIn {
    fn missing_until(&self) -> Option<u32> {
        let exp = self.expected?;
        let first = self.buffer.keys().next().copied();
        let end = match first {
            Some(f) => f,
            None if self.known_until > exp => self.known_until,
            None => return None,
        };
        (end > exp).then_some(end)
    }
}

/// Whether a published trading status is one of the call auctions'.
fn is_auction(status: SecurityTradingStatus) -> bool {
    matches!(
        status,
        SecurityTradingStatus::OpeningAuction
            | SecurityTradingStatus::ClosingAuction
            | SecurityTradingStatus::VolatilityAuction
    )
}

/// A market data subscriber. See the module documentation.
#[derive(Debug)]
pub struct Subscriber {
    config: SubscriberConfig,
    channels: Vec<ChannelIn>,
    instruments: BTreeMap<u32, InstrumentView>,
    stats: SubscriberStats,
    last_skipped: Option<String>,
    instruments_total: u32,
    session_id: Option<u32>,
    last_transact_ns: u64,
    /// Trades seen, by instrument (for tools).
    last_trade: FxHashMap<u32, (i64, i64)>,
}

impl Subscriber {
    pub fn new(config: SubscriberConfig) -> Subscriber {
        Subscriber {
            config,
            channels: (0..CHANNEL_COUNT).map(|_| ChannelIn::default()).collect(),
            instruments: BTreeMap::new(),
            stats: SubscriberStats::default(),
            last_skipped: None,
            instruments_total: 0,
            session_id: None,
            last_transact_ns: 0,
            last_trade: FxHashMap::default(),
        }
    }

    pub fn stats(&self) -> &SubscriberStats {
        &self.stats
    }

    /// What the last skipped datagram was and why.
    pub fn last_skipped(&self) -> Option<&str> {
        self.last_skipped.as_deref()
    }

    pub fn instrument(&self, id: u32) -> Option<&InstrumentView> {
        self.instruments.get(&id)
    }

    pub fn instruments(&self) -> impl Iterator<Item = &InstrumentView> {
        self.instruments.values()
    }

    /// The instrument with this symbol (from the instrument loop).
    pub fn by_symbol(&self, symbol: &str) -> Option<&InstrumentView> {
        self.instruments.values().find(|i| i.symbol == symbol)
    }

    pub fn book(&self, id: u32) -> Option<&OrderBook> {
        self.instruments.get(&id).map(|i| &i.book)
    }

    /// The next MsgSeqNum expected on a channel.
    pub fn expected(&self, channel: Channel) -> Option<u32> {
        self.channels[channel.index()].expected
    }

    /// Every instrument the feed announced is known and live, and no incremental channel has
    /// an open gap.
    pub fn is_synced(&self) -> bool {
        self.instruments.len() as u32 >= self.instruments_total
            && !self.instruments.is_empty()
            && self.instruments.values().all(|i| i.live)
            && self
                .channels
                .iter()
                .all(|c| c.gap_since_ns.is_none() && c.buffer.is_empty())
    }

    /// The instrument's state, created on first sight unless the table is full.
    fn inst(&mut self, id: u32) -> Option<&mut InstrumentView> {
        if self.instruments.len() >= INSTRUMENTS_MAX && !self.instruments.contains_key(&id) {
            self.stats.over_limit += 1;
            return None;
        }
        Some(
            self.instruments
                .entry(id)
                .or_insert_with(|| InstrumentView {
                    id,
                    ..InstrumentView::default()
                }),
        )
    }

    fn skip(&mut self, channel: Channel, feed: Feed, e: WireError) {
        match e {
            WireError::VersionFromFuture { .. } => self.stats.future_version += 1,
            WireError::UnknownTemplate { .. } => self.stats.unknown_template += 1,
            WireError::WrongSchemaId { .. } => self.stats.wrong_schema += 1,
            WireError::Truncated { .. } | WireError::PacketSizeMismatch { .. } => {
                self.stats.truncated += 1
            }
            _ => self.stats.malformed += 1,
        }
        self.last_skipped = Some(format!(
            "{} feed {:?}: skipped datagram: {e}",
            channel.name(),
            feed
        ));
    }

    /// Takes one datagram.
    pub fn on_packet(&mut self, channel: Channel, feed: Feed, datagram: &[u8], now_ns: u64) {
        match feed {
            Feed::A => self.stats.packets_a += 1,
            Feed::B => self.stats.packets_b += 1,
            Feed::Replay => self.stats.packets_replay += 1,
        }
        let packet = match parse_packet(datagram) {
            Ok(p) => p,
            Err(e) => return self.skip(channel, feed, e),
        };
        let mut first = packet.messages();
        if !channel.is_incremental() {
            if let Some(Message::SequenceReset(r)) = first.next() {
                // Feeds A and B both carry it: only a change of numbering counts.
                let ch = &mut self.channels[channel.index()];
                if ch.expected != Some(r.new_seq_no()) {
                    ch.expected = Some(r.new_seq_no());
                    self.stats.loop_resets += 1;
                    for inst in self.instruments.values_mut() {
                        inst.assembly = None;
                    }
                }
                return;
            }
            return self.on_loop_packet(channel, &packet);
        }
        let seq = packet.header.msg_seq_num;
        match first.next() {
            Some(Message::Heartbeat(h)) if packet.message_count() == 1 => {
                self.stats.heartbeats += 1;
                let last = h.last_msg_seq_num();
                let ch = &mut self.channels[channel.index()];
                match ch.expected {
                    None => ch.expected = Some(last.wrapping_add(1).max(1)),
                    Some(exp) if last >= exp => {
                        ch.known_until = ch.known_until.max(last.wrapping_add(1));
                        if ch.gap_since_ns.is_none() {
                            ch.gap_since_ns = Some(now_ns);
                            self.stats.gaps_detected += 1;
                        }
                    }
                    Some(_) => {}
                }
                return;
            }
            Some(Message::SequenceReset(r)) => {
                let ch = &mut self.channels[channel.index()];
                if ch.expected == Some(r.new_seq_no()) && ch.buffer.is_empty() {
                    // The other feed's copy of a reset already taken.
                    return;
                }
                self.stats.sequence_resets += 1;
                ch.expected = Some(r.new_seq_no());
                ch.buffer.clear();
                ch.gap_since_ns = None;
                ch.known_until = 0;
                ch.replay_in_flight = false;
                if channel == Channel::Orders {
                    // Nothing queued under the old numbering can be trusted: every book
                    // comes back from the snapshot loop.
                    self.mark_all_stale();
                    for inst in self.instruments.values_mut() {
                        inst.pending.clear();
                    }
                }
                return;
            }
            _ => {}
        }
        let ch = &mut self.channels[channel.index()];
        let exp = *ch.expected.get_or_insert(seq);
        if seq < exp {
            self.stats.duplicates += 1;
            return;
        }
        if seq > exp {
            if ch.buffer.contains_key(&seq) {
                self.stats.duplicates += 1;
            } else if ch.buffer.len() < self.config.gap_buffer_packets_max {
                ch.buffer.insert(seq, datagram.to_vec());
            }
            if ch.gap_since_ns.is_none() {
                ch.gap_since_ns = Some(now_ns);
                self.stats.gaps_detected += 1;
            }
            if ch.buffer.len() >= self.config.gap_buffer_packets_max {
                self.skip_gap(channel, now_ns);
            }
            return;
        }
        self.apply_incremental(channel, &packet);
        self.channels[channel.index()].expected = Some(seq.wrapping_add(1));
        self.drain(channel, now_ns);
    }

    fn drain(&mut self, channel: Channel, now_ns: u64) {
        loop {
            let ch = &mut self.channels[channel.index()];
            let Some(exp) = ch.expected else { return };
            // Copies that arrived twice while waiting are below `expected` now.
            while let Some((&k, _)) = ch.buffer.iter().next() {
                if k >= exp {
                    break;
                }
                ch.buffer.remove(&k);
                self.stats.duplicates += 1;
            }
            let ch = &mut self.channels[channel.index()];
            match ch.buffer.remove(&exp) {
                Some(bytes) => {
                    if let Ok(p) = parse_packet(&bytes) {
                        self.apply_incremental(channel, &p);
                    }
                    self.channels[channel.index()].expected = Some(exp.wrapping_add(1));
                }
                None => {
                    ch.gap_since_ns = match ch.missing_until() {
                        // Still missing: keep the time the gap was first seen.
                        Some(_) => Some(ch.gap_since_ns.unwrap_or(now_ns)),
                        None => None,
                    };
                    if ch.gap_since_ns.is_none() {
                        ch.known_until = 0;
                    }
                    return;
                }
            }
        }
    }

    /// Gives up on a gap: continues after it and, on the order log, recovers every book from
    /// the snapshot loop.
    fn skip_gap(&mut self, channel: Channel, now_ns: u64) {
        let ch = &mut self.channels[channel.index()];
        let Some(until) = ch.missing_until() else {
            ch.gap_since_ns = None;
            return;
        };
        self.stats.gaps_skipped += 1;
        ch.expected = Some(until);
        ch.replay_in_flight = false;
        if channel == Channel::Orders {
            self.mark_all_stale();
        }
        self.drain(channel, now_ns);
    }

    fn mark_all_stale(&mut self) {
        for inst in self.instruments.values_mut() {
            inst.live = false;
        }
    }

    /// Recovery due now: a replay to run, if any. Gaps that cannot be replayed are skipped
    /// here (their books recover from snapshots).
    pub fn poll(&mut self, now_ns: u64) -> Option<RecoveryRequest> {
        for channel in Channel::ALL {
            if !channel.is_incremental() {
                continue;
            }
            let ch = &self.channels[channel.index()];
            let Some(since) = ch.gap_since_ns else {
                continue;
            };
            if ch.replay_in_flight
                || now_ns.saturating_sub(since) < self.config.arbitration_window_ns
            {
                continue;
            }
            let (Some(from), Some(until)) = (ch.expected, ch.missing_until()) else {
                self.channels[channel.index()].gap_since_ns = None;
                continue;
            };
            let count = until - from;
            if self.config.replay && count <= REPLAY_COUNT_MAX {
                self.channels[channel.index()].replay_in_flight = true;
                self.stats.replays_requested += 1;
                return Some(RecoveryRequest {
                    channel,
                    from,
                    count,
                });
            }
            self.skip_gap(channel, now_ns);
        }
        None
    }

    /// The replay for `channel` ended (its packets were fed with [`Feed::Replay`]). What is
    /// still missing is skipped and recovered from snapshots.
    pub fn on_replay_done(&mut self, channel: Channel, now_ns: u64) {
        self.channels[channel.index()].replay_in_flight = false;
        if self.channels[channel.index()].missing_until().is_some() {
            self.skip_gap(channel, now_ns);
        }
    }

    fn apply_incremental(&mut self, channel: Channel, packet: &Packet<'_>) {
        self.stats.packets_applied += 1;
        if packet.header.msg_flags.contains(MsgFlags::POSS_DUP) {
            self.stats.replay_packets_used += 1;
        }
        let ts = packet.incremental.map_or(0, |i| i.transact_time_ns);
        if let Some(inc) = packet.incremental {
            self.last_transact_ns = inc.transact_time_ns;
            if channel == Channel::Orders {
                let session = inc.exchange_trading_session_id;
                if self.session_id.is_some_and(|s| s != session) {
                    // A new trading session: RptSeqs restart; rebuild from snapshots.
                    self.mark_all_stale();
                    for inst in self.instruments.values_mut() {
                        inst.rpt_seq = 0;
                    }
                }
                self.session_id = Some(session);
            }
        }
        for m in packet.messages() {
            self.apply_message(m, ts);
        }
    }

    fn apply_message(&mut self, m: Message<'_>, ts_ns: u64) {
        match m {
            Message::OrderUpdate(d) => {
                let msg = OrderMsg::Update {
                    id: d.md_entry_id(),
                    px: d.md_entry_px(),
                    size: d.md_entry_size(),
                    action: d.md_update_action(),
                    side: d.side(),
                };
                self.order_msg(d.security_id(), d.rpt_seq(), ts_ns, msg);
            }
            Message::OrderExecution(d) => {
                let msg = OrderMsg::Update {
                    id: d.md_entry_id(),
                    px: d.md_entry_px(),
                    size: d.md_entry_size(),
                    action: d.md_update_action(),
                    side: d.side(),
                };
                self.order_msg(d.security_id(), d.rpt_seq(), ts_ns, msg);
            }
            Message::EmptyBook(d) => match d.security_id() {
                Some(id) => self.order_msg(id, d.rpt_seq(), ts_ns, OrderMsg::Empty),
                None => {
                    for inst in self.instruments.values_mut() {
                        inst.book.clear();
                        inst.rpt_seq = 0;
                        inst.live = true;
                        inst.pending.clear();
                    }
                }
            },
            Message::SecurityStatus(d) => {
                if let Some(inst) = self.inst(d.security_id()) {
                    let status = d.trading_status();
                    inst.status = Some(status);
                    if !is_auction(status) {
                        inst.indicative = None;
                    }
                    if let (Some(low), Some(high)) = (d.low_limit_px(), d.high_limit_px()) {
                        inst.band = Some((low, high));
                    }
                }
            }
            Message::AuctionIndicative(d) => {
                let view = IndicativeView {
                    price: d.price(),
                    qty: d.qty(),
                    surplus: d.surplus(),
                    surplus_side: match d.surplus_side() {
                        SideOpt::Buy => Some(Side::Buy),
                        SideOpt::Sell => Some(Side::Sell),
                        SideOpt::None | SideOpt::NullVal => None,
                    },
                };
                if let Some(inst) = self.inst(d.security_id()) {
                    inst.indicative = Some(view);
                }
            }
            Message::Trade(d) => {
                self.stats.trades += 1;
                let id = d.security_id();
                self.last_trade.insert(id, (d.price(), d.qty()));
                if d.trade_type() == TradeType::Auction {
                    if let Some(inst) = self.inst(id) {
                        inst.auction_trades += 1;
                    }
                }
            }
            Message::AggregatedBook(d) => {
                let id = d.security_id();
                let rpt = d.rpt_seq();
                let Some(inst) = self.inst(id) else { return };
                if rpt < inst.published_rpt_seq {
                    return;
                }
                inst.published_rpt_seq = rpt;
                inst.published_bids.clear();
                inst.published_asks.clear();
                let mut g = d.levels_decoder();
                while let Ok(Some(_)) = g.advance() {
                    let l = LevelView {
                        price: g.price(),
                        qty: g.qty(),
                        orders: g.order_count(),
                    };
                    match g.side() {
                        WireSide::Buy => inst.published_bids.push(l),
                        WireSide::Sell => inst.published_asks.push(l),
                        WireSide::NullVal => {}
                    }
                }
            }
            Message::Statistics(d) => {
                let s = StatsView {
                    last_px: d.last_px(),
                    last_qty: d.last_qty(),
                    volume: d.volume(),
                    turnover: d.turnover(),
                    open_px: d.open_px(),
                    high_px: d.high_px(),
                    low_px: d.low_px(),
                    vwap_px: d.vwap_px(),
                    best_bid: d.best_bid_px().zip(d.best_bid_qty()),
                    best_ask: d.best_ask_px().zip(d.best_ask_qty()),
                    trades: d.number_of_trades(),
                };
                if let Some(inst) = self.inst(d.security_id()) {
                    inst.stats = Some(s);
                }
            }
            Message::BestPrices(d) => {
                let mut g = d.entries_decoder();
                while let Ok(Some(_)) = g.advance() {
                    let (bid, ask) = (g.bid_px().zip(g.bid_qty()), g.ask_px().zip(g.ask_qty()));
                    let Some(inst) = self.inst(g.security_id()) else {
                        continue;
                    };
                    let s = inst.stats.get_or_insert_with(StatsView::default);
                    s.best_bid = bid;
                    s.best_ask = ask;
                }
            }
            Message::SecurityDefinition(d) => self.on_definition(&d),
            _ => {}
        }
    }

    fn on_definition(
        &mut self,
        d: &bourse_wire::market_data::codec::security_definition_codec::SecurityDefinitionDecoder<
            '_,
        >,
    ) {
        self.instruments_total = self.instruments_total.max(d.tot_num_reports());
        let symbol = d.symbol();
        let symbol = bourse_wire::ascii_field(&symbol).unwrap_or("?").to_string();
        let Some(inst) = self.inst(d.security_id()) else {
            return;
        };
        inst.symbol = symbol;
        inst.price_scale = d.price_scale();
        inst.tick = d.tick_size();
        if let (Some(low), Some(high)) = (d.low_limit_px(), d.high_limit_px()) {
            inst.band = Some((low, high));
        }
    }

    fn order_msg(&mut self, id: u32, rpt: u32, ts_ns: u64, msg: OrderMsg) {
        let pending_max = self.config.pending_messages_per_instrument_max;
        if self.inst(id).is_none() {
            return;
        }
        let Some(inst) = self.instruments.get_mut(&id) else {
            return;
        };
        let p = Pending { rpt, ts_ns, msg };
        if !inst.live {
            if msg == OrderMsg::Empty {
                // An empty book is a complete statement of the book's state.
                inst.book.clear();
                inst.rpt_seq = rpt;
                inst.live = true;
                inst.pending.clear();
                return;
            }
            if inst.pending.len() >= pending_max {
                inst.pending.pop_front();
                self.stats.pending_dropped += 1;
            }
            inst.pending.push_back(p);
            return;
        }
        if rpt <= inst.rpt_seq {
            self.stats.stale_messages += 1;
            return;
        }
        if rpt != inst.rpt_seq.wrapping_add(1) {
            self.stats.rpt_gaps += 1;
            inst.live = false;
            inst.pending.push_back(p);
            return;
        }
        match apply(&mut inst.book, &p) {
            Ok(()) => {
                inst.rpt_seq = rpt;
                self.stats.messages_applied += 1;
            }
            Err(unknown_enum) => {
                if unknown_enum {
                    self.stats.unknown_enum += 1;
                } else {
                    self.stats.book_errors += 1;
                }
                inst.live = false;
            }
        }
    }

    fn on_loop_packet(&mut self, channel: Channel, packet: &Packet<'_>) {
        let seq = packet.header.msg_seq_num;
        let ch = &mut self.channels[channel.index()];
        match ch.expected {
            Some(exp) if seq < exp => {
                self.stats.duplicates += 1;
                return;
            }
            Some(exp) if seq > exp && channel == Channel::Snapshot => {
                // Lost snapshot packets: partial snapshots cannot be trusted.
                for inst in self.instruments.values_mut() {
                    inst.assembly = None;
                }
            }
            _ => {}
        }
        self.channels[channel.index()].expected = Some(seq.wrapping_add(1));
        self.stats.packets_applied += 1;
        let flags = packet.header.msg_flags;
        for m in packet.messages() {
            match m {
                Message::OrderBookSnapshot(d) => self.on_snapshot(&d, flags),
                Message::SecurityDefinition(d) => self.on_definition(&d),
                other => self.apply_message(other, 0),
            }
        }
    }

    fn on_snapshot(
        &mut self,
        d: &bourse_wire::market_data::codec::order_book_snapshot_codec::OrderBookSnapshotDecoder<
            '_,
        >,
        flags: MsgFlags,
    ) {
        self.instruments_total = self.instruments_total.max(d.tot_num_reports());
        let rpt = d.rpt_seq();
        let id = d.security_id();
        if self.inst(id).is_none() {
            return;
        }
        let stats = &mut self.stats;
        let Some(inst) = self.instruments.get_mut(&id) else {
            return;
        };
        if inst.live {
            return;
        }
        if flags.contains(MsgFlags::START_OF_SNAPSHOT) {
            inst.assembly = Some((rpt, Vec::new()));
        }
        let Some((assembly_rpt, orders)) = inst.assembly.as_mut() else {
            return;
        };
        if *assembly_rpt != rpt {
            inst.assembly = None;
            return;
        }
        let mut g = d.entries_decoder();
        let mut bad = false;
        if orders.len() + usize::from(g.count()) > SNAPSHOT_ORDERS_MAX {
            inst.assembly = None;
            stats.over_limit += 1;
            return;
        }
        while let Ok(Some(_)) = g.advance() {
            let side = match g.side() {
                WireSide::Buy => Side::Buy,
                WireSide::Sell => Side::Sell,
                WireSide::NullVal => {
                    bad = true;
                    continue;
                }
            };
            orders.push(BookOrder {
                order_id: g.md_entry_id(),
                side,
                price: g.md_entry_px(),
                qty: g.md_entry_size(),
                ts_ns: g.transact_time_ns(),
            });
        }
        if bad {
            inst.assembly = None;
            stats.unknown_enum += 1;
            return;
        }
        if !flags.contains(MsgFlags::END_OF_SNAPSHOT) {
            return;
        }
        let Some((_, orders)) = inst.assembly.take() else {
            return;
        };
        inst.book.clear();
        for o in orders {
            if inst.book.add(o).is_err() {
                stats.book_errors += 1;
                inst.book.clear();
                return;
            }
        }
        inst.rpt_seq = rpt;
        inst.live = true;
        stats.snapshots_applied += 1;
        // Apply what arrived meanwhile and is newer than the snapshot.
        while let Some(&p) = inst.pending.front() {
            if p.rpt <= inst.rpt_seq {
                inst.pending.pop_front();
                continue;
            }
            if p.rpt != inst.rpt_seq.wrapping_add(1) {
                // The queue does not reach back to this snapshot: wait for a newer one.
                inst.live = false;
                return;
            }
            inst.pending.pop_front();
            if apply(&mut inst.book, &p).is_err() {
                stats.book_errors += 1;
                inst.live = false;
                return;
            }
            inst.rpt_seq = p.rpt;
            stats.messages_applied += 1;
        }
    }
}

/// Applies one order-log message. `Err(true)`: an enum value this build does not know;
/// `Err(false)`: the book disagrees with the update.
fn apply(book: &mut OrderBook, p: &Pending) -> Result<(), bool> {
    match p.msg {
        OrderMsg::Empty => {
            book.clear();
            Ok(())
        }
        OrderMsg::Update {
            id,
            px,
            size,
            action,
            side,
        } => {
            let side = match side {
                WireSide::Buy => Side::Buy,
                WireSide::Sell => Side::Sell,
                WireSide::NullVal => return Err(true),
            };
            let r = match action {
                MdUpdateAction::New => book.add(BookOrder {
                    order_id: id,
                    side,
                    price: px,
                    qty: size,
                    ts_ns: p.ts_ns,
                }),
                MdUpdateAction::Change => book.change_qty(id, size),
                MdUpdateAction::Delete => book.remove(id).map(|_| ()),
                MdUpdateAction::NullVal => return Err(true),
            };
            r.map_err(|_| false)
        }
    }
}
