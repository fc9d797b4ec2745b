//! The projection: a core's committed events in, ITCH 5.0 messages out.
//!
//! It keeps its own book of what it has published (as the SBE publisher does, and with the
//! same reading of the order log), so every message follows from the events alone and the
//! same events always give the same messages. Order references: an order's first Add Order
//! uses the core's order id (unique across a venue); an order that re-enters the book later
//! (a replace that lost priority, an iceberg refill) gets a fresh reference from
//! [`REPLACEMENT_REF_BASE`] up, as ITCH wants a new reference for every entry into the book.

use crate::msg::{cross_type, event_code, stock_of, Body, Header, Message, StockDirectory, DAY_NS};
use bourse_core::{Event, Instrument, OrderLog, OrderLogAction, Phase, Side};
use bourse_marketdata::{BookOrder, OrderBook};
use std::collections::{BTreeMap, HashMap};

/// References of orders that re-entered the book count up from here (the core's order ids
/// stay below 2^63).
pub const REPLACEMENT_REF_BASE: u64 = 1 << 63;
/// Most instruments one projection carries (stock locate codes are u16, 0 is not used).
pub const INSTRUMENTS_MAX: usize = u16::MAX as usize;
/// ITCH prices carry four decimals.
pub const ITCH_PRICE_SCALE: u8 = 4;

/// What the projection could not say in ITCH, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProjectionStats {
    pub messages: u64,
    /// Order-log records of instruments with no definition and no room to define one.
    pub unknown_instrument: u64,
    /// Instruments whose price scale exceeds ITCH's four decimals: their orders are not
    /// published.
    pub instruments_refused: u64,
    /// Orders of refused instruments, not published.
    pub orders_not_published: u64,
    /// Orders whose price (at four decimals) or quantity does not fit ITCH's u32 fields.
    pub unrepresentable: u64,
    /// Executions against an order not in the published book (published as Trade).
    pub hidden_executions: u64,
}

struct Inst {
    locate: u16,
    stock: [u8; 8],
    /// ITCH price = core price × this; `None` if the scale exceeds four decimals.
    price_mul: Option<u32>,
    book: OrderBook,
    /// The phase the instrument is in: a call auction's NOII names its cross type.
    phase: Phase,
}

#[derive(Clone, Copy)]
struct PendingExec {
    resting_order: u64,
    resting_side: Side,
    instrument: u32,
    match_number: u64,
    price: i64,
    qty: i64,
    ts_ns: u64,
    /// An execution in a call auction's uncrossing: published as a non-printable Order
    /// Executed With Price, its hidden part not at all (the Cross Trade prints the whole).
    auction: bool,
}

/// The uncrossing being published: its match number (its first trade's id), its price, and
/// per order what it executed in it, until the order's order-log record comes.
#[derive(Default)]
struct Cross {
    match_number: Option<u64>,
    price: i64,
    fills: BTreeMap<u64, i64>,
}

#[derive(Clone, Copy)]
struct PendingReplace {
    order_id: u64,
    order_ref: u64,
    instrument: u32,
    ts_ns: u64,
}

/// Events in, messages out. See the module documentation.
pub struct Projection {
    instruments: BTreeMap<u32, Inst>,
    /// Instrument id by stock locate code - 1.
    by_locate: Vec<u32>,
    default_price_scale: u8,
    refs: HashMap<u64, u64>,
    next_replacement_ref: u64,
    pending_exec: Option<PendingExec>,
    pending_replace: Option<PendingReplace>,
    cross: Cross,
    stats: ProjectionStats,
}

fn side_byte(side: Side) -> u8 {
    match side {
        Side::Buy => b'B',
        Side::Sell => b'S',
    }
}

impl Projection {
    /// `default_price_scale` is assumed for an instrument seen before any definition (its
    /// symbol is then its id in decimal).
    pub fn new(default_price_scale: u8) -> Projection {
        Projection {
            instruments: BTreeMap::new(),
            by_locate: Vec::new(),
            default_price_scale,
            refs: HashMap::new(),
            next_replacement_ref: REPLACEMENT_REF_BASE,
            pending_exec: None,
            pending_replace: None,
            cross: Cross::default(),
            stats: ProjectionStats::default(),
        }
    }

    pub fn stats(&self) -> ProjectionStats {
        self.stats
    }

    /// The system event that opens the feed.
    pub fn start(&mut self, ts_ns: u64, out: &mut Vec<Message>) {
        self.emit(
            0,
            ts_ns,
            Body::SystemEvent {
                event_code: event_code::START_OF_MESSAGES,
            },
            out,
        );
    }

    /// The system event that closes the feed.
    pub fn end(&mut self, ts_ns: u64, out: &mut Vec<Message>) {
        self.flush_pending(out);
        self.emit(
            0,
            ts_ns,
            Body::SystemEvent {
                event_code: event_code::END_OF_MESSAGES,
            },
            out,
        );
    }

    /// Defines an instrument (once; a second definition of the same id is ignored) and
    /// publishes its stock directory entry.
    pub fn define(&mut self, def: &Instrument, ts_ns: u64, out: &mut Vec<Message>) {
        // ITCH has no blank issue classification: equities are common stock, the rest
        // "other securities".
        let class = match def.market {
            bourse_core::Market::Equity => b'C',
            _ => b'Q',
        };
        let spec = (def.price_scale, def.lot_size, class);
        self.define_as(def.instrument.0, &def.symbol, spec, ts_ns, out);
    }

    fn define_as(
        &mut self,
        id: u32,
        symbol: &str,
        (price_scale, lot_size, issue_classification): (u8, i64, u8),
        ts_ns: u64,
        out: &mut Vec<Message>,
    ) -> bool {
        if self.instruments.contains_key(&id) {
            return true;
        }
        if self.instruments.len() >= INSTRUMENTS_MAX {
            return false;
        }
        let locate = self.instruments.len() as u16 + 1;
        let price_mul = (price_scale <= ITCH_PRICE_SCALE)
            .then(|| 10u32.pow(u32::from(ITCH_PRICE_SCALE - price_scale)));
        if price_mul.is_none() {
            self.stats.instruments_refused += 1;
        }
        let stock = stock_of(symbol);
        self.by_locate.push(id);
        self.instruments.insert(
            id,
            Inst {
                locate,
                stock,
                price_mul,
                book: OrderBook::new(),
                phase: Phase::Open,
            },
        );
        let dir = StockDirectory {
            stock,
            market_category: b' ',
            financial_status: b' ',
            round_lot_size: u32::try_from(lot_size).unwrap_or(1).max(1),
            round_lots_only: b'N',
            issue_classification,
            issue_subtype: *b"Z ",
            authenticity: b'P',
            short_sale_threshold: b' ',
            ipo_flag: b' ',
            luld_tier: b' ',
            etp_flag: b' ',
            etp_leverage_factor: 0,
            inverse: b'N',
        };
        self.emit(locate, ts_ns, Body::StockDirectory(dir), out);
        true
    }

    /// The published book of an instrument (keyed by the core's order ids).
    pub fn book(&self, instrument: u32) -> Option<&OrderBook> {
        self.instruments.get(&instrument).map(|i| &i.book)
    }

    /// The stock locate code given to an instrument.
    pub fn locate(&self, instrument: u32) -> Option<u16> {
        self.instruments.get(&instrument).map(|i| i.locate)
    }

    /// The ITCH reference an order currently rests under.
    pub fn order_ref(&self, order_id: u64) -> Option<u64> {
        self.refs.get(&order_id).copied()
    }

    /// One committed request's (or entry's) events, in order.
    pub fn on_events(&mut self, events: &[Event], out: &mut Vec<Message>) {
        for e in events {
            self.on_event(e, out);
        }
        self.flush_pending(out);
    }

    fn emit(&mut self, locate: u16, ts_ns: u64, body: Body, out: &mut Vec<Message>) {
        self.stats.messages += 1;
        out.push(Message {
            header: Header {
                stock_locate: locate,
                tracking_number: 0,
                timestamp_ns: ts_ns % DAY_NS,
            },
            body,
        });
    }

    fn flush_pending(&mut self, out: &mut Vec<Message>) {
        if let Some(x) = self.pending_exec.take() {
            self.hidden_trade(x, x.qty, out);
        }
        if let Some(r) = self.pending_replace.take() {
            let locate = self.instruments.get(&r.instrument).map_or(0, |i| i.locate);
            self.emit(
                locate,
                r.ts_ns,
                Body::OrderDelete {
                    order_ref: r.order_ref,
                },
                out,
            );
        }
    }

    fn hidden_trade(&mut self, x: PendingExec, qty: i64, out: &mut Vec<Message>) {
        if x.auction {
            // The uncrossing's Cross Trade prints every share of it.
            return;
        }
        let Some(inst) = self.instruments.get(&x.instrument) else {
            return;
        };
        let (locate, stock) = (inst.locate, inst.stock);
        if inst.price_mul.is_none() {
            return;
        }
        let (Some(price), Ok(shares)) = (itch_price(inst.price_mul, x.price), u32::try_from(qty))
        else {
            self.stats.unrepresentable += 1;
            return;
        };
        self.stats.hidden_executions += 1;
        let body = Body::Trade {
            order_ref: 0,
            side: side_byte(x.resting_side),
            shares,
            stock,
            price,
            match_number: x.match_number,
        };
        self.emit(locate, x.ts_ns, body, out);
    }

    fn on_event(&mut self, e: &Event, out: &mut Vec<Message>) {
        match *e {
            Event::OrderLog(ref l) => self.order_log(l, out),
            // An instrument added while the feed runs (an operator's addition) gets its stock
            // directory from its event; one defined already (at start) is left as it is.
            Event::InstrumentAdded {
                instrument,
                definition,
                ts_ns,
            } => {
                self.flush_pending(out);
                self.define(&definition.instrument(instrument), ts_ns, out);
            }
            Event::Trade {
                trade_id,
                price,
                qty,
                buy,
                sell,
                auction: true,
                ..
            } => {
                // Both orders of an auction trade rest; each executes in the uncrossing and
                // its order-log record comes once it has had all its fills.
                self.flush_pending(out);
                let cross = &mut self.cross;
                cross.match_number.get_or_insert(trade_id.0);
                cross.price = price.0;
                for id in [buy.order_id, sell.order_id] {
                    *cross.fills.entry(id.0).or_insert(0) += qty.0;
                }
            }
            Event::Trade {
                trade_id,
                instrument,
                price,
                qty,
                aggressor,
                buy,
                sell,
                auction: false,
                ts_ns,
            } => {
                self.flush_pending(out);
                let (resting, resting_side) = match aggressor {
                    Side::Buy => (sell.order_id, Side::Sell),
                    Side::Sell => (buy.order_id, Side::Buy),
                };
                self.pending_exec = Some(PendingExec {
                    resting_order: resting.0,
                    resting_side,
                    instrument: instrument.0,
                    match_number: trade_id.0,
                    price: price.0,
                    qty: qty.0,
                    ts_ns,
                    auction: false,
                });
            }
            Event::PhaseChanged {
                instrument, phase, ..
            } => {
                if let Some(inst) = self.instruments.get_mut(&instrument.0) {
                    inst.phase = phase;
                }
            }
            Event::AuctionIndicative {
                instrument,
                price,
                qty,
                surplus,
                surplus_side,
                ts_ns,
            } => {
                self.flush_pending(out);
                let Some(inst) = self.instruments.get(&instrument.0) else {
                    return;
                };
                if inst.price_mul.is_none() {
                    return;
                }
                let (locate, stock) = (inst.locate, inst.stock);
                let cross = cross_type_of(inst.phase);
                let Some(price) = itch_price(inst.price_mul, price.0) else {
                    self.stats.unrepresentable += 1;
                    return;
                };
                let body = Body::Noii {
                    paired_shares: qty.0.max(0) as u64,
                    imbalance_shares: surplus.0.max(0) as u64,
                    imbalance_direction: surplus_side.map_or(b'N', side_byte),
                    stock,
                    far_price: price,
                    near_price: price,
                    reference_price: price,
                    cross_type: cross,
                    // Not computed: ITCH's "cannot be calculated".
                    price_variation: b' ',
                };
                self.emit(locate, ts_ns, body, out);
            }
            Event::AuctionUncrossed {
                instrument,
                auction,
                price,
                qty,
                ts_ns,
            } => {
                self.flush_pending(out);
                let cross = std::mem::take(&mut self.cross);
                debug_assert!(cross.fills.is_empty(), "an auction fill without its record");
                let Some(inst) = self.instruments.get(&instrument.0) else {
                    return;
                };
                if inst.price_mul.is_none() {
                    return;
                }
                let (locate, stock) = (inst.locate, inst.stock);
                let Some(cross_price) = itch_price(inst.price_mul, price.0) else {
                    self.stats.unrepresentable += 1;
                    return;
                };
                // Sent for every uncrossing, with 0 shares when nothing executed, as NASDAQ
                // does.
                let body = Body::CrossTrade {
                    shares: qty.0.max(0) as u64,
                    stock,
                    cross_price,
                    match_number: cross.match_number.unwrap_or(0),
                    cross_type: cross_type_of(auction),
                };
                self.emit(locate, ts_ns, body, out);
            }
            Event::OrderReplaced {
                order_id,
                instrument,
                priority_kept: false,
                ts_ns,
                ..
            } => {
                self.flush_pending(out);
                let Some(inst) = self.instruments.get_mut(&instrument.0) else {
                    return;
                };
                if inst.book.remove(order_id.0).is_ok() {
                    if let Some(order_ref) = self.refs.remove(&order_id.0) {
                        self.pending_replace = Some(PendingReplace {
                            order_id: order_id.0,
                            order_ref,
                            instrument: instrument.0,
                            ts_ns,
                        });
                    }
                }
            }
            _ => {}
        }
    }

    fn order_log(&mut self, l: &OrderLog, out: &mut Vec<Message>) {
        let id = l.order_id.0;
        let instrument = l.instrument.0;
        if !self.instruments.contains_key(&instrument) {
            let symbol = instrument.to_string();
            if !self.define_as(
                instrument,
                &symbol,
                (self.default_price_scale, 1, b'Q'),
                l.ts_ns,
                out,
            ) {
                self.stats.unknown_instrument += 1;
                return;
            }
        }
        let exec = match self.pending_exec {
            Some(p) if p.resting_order == id => self.pending_exec.take(),
            _ => self.cross.fills.remove(&id).map(|qty| PendingExec {
                resting_order: id,
                resting_side: l.side,
                instrument,
                match_number: self.cross.match_number.unwrap_or(0),
                price: self.cross.price,
                qty,
                ts_ns: l.ts_ns,
                auction: true,
            }),
        };
        // A replace that lost priority continues here only for the same order.
        let replaced = match self.pending_replace {
            Some(r) if r.order_id == id => self.pending_replace.take(),
            _ => {
                self.flush_pending_replace(out);
                None
            }
        };
        let inst = &self.instruments[&instrument];
        let (locate, stock, price_mul) = (inst.locate, inst.stock, inst.price_mul);
        let order = BookOrder {
            order_id: id,
            side: l.side,
            price: l.price.0,
            qty: l.qty_display.0,
            ts_ns: l.ts_ns,
        };
        let prev = inst.book.get(id).copied();
        let ts = l.ts_ns;
        match (l.action, prev) {
            (OrderLogAction::New | OrderLogAction::Change, None) => {
                if let Some(x) = exec {
                    self.hidden_trade(x, x.qty, out);
                }
                match replaced {
                    Some(r) if order.qty > 0 => self.enter(
                        locate,
                        stock,
                        price_mul,
                        order,
                        Some(r.order_ref),
                        l.action,
                        out,
                    ),
                    Some(r) => self.emit(
                        locate,
                        ts,
                        Body::OrderDelete {
                            order_ref: r.order_ref,
                        },
                        out,
                    ),
                    None if order.qty > 0 => {
                        self.enter(locate, stock, price_mul, order, None, l.action, out)
                    }
                    None => {}
                }
            }
            (OrderLogAction::Delete, None) => {
                if let Some(x) = exec {
                    self.hidden_trade(x, x.qty, out);
                }
                if let Some(r) = replaced {
                    self.emit(
                        locate,
                        ts,
                        Body::OrderDelete {
                            order_ref: r.order_ref,
                        },
                        out,
                    );
                }
            }
            (OrderLogAction::Delete, Some(p)) => {
                let order_ref = self.leave(instrument, id);
                let left = self.execute(locate, order_ref, &p, exec, ts, out);
                if left > 0 {
                    self.emit(locate, ts, Body::OrderDelete { order_ref }, out);
                }
            }
            (OrderLogAction::New | OrderLogAction::Change, Some(p)) => {
                let in_place = p.price == order.price
                    && order.qty > 0
                    && match exec {
                        Some(x) => p.qty - x.qty == order.qty,
                        None => order.qty <= p.qty,
                    };
                if in_place {
                    let order_ref = self.refs.get(&id).copied().unwrap_or(id);
                    let inst = self
                        .instruments
                        .get_mut(&instrument)
                        .expect("defined above");
                    let _ = inst.book.change_qty(id, order.qty);
                    let left = self.execute(locate, order_ref, &p, exec, ts, out);
                    if left > order.qty {
                        let cancelled = u32::try_from(left - order.qty).unwrap_or(u32::MAX);
                        self.emit(
                            locate,
                            ts,
                            Body::OrderCancel {
                                order_ref,
                                cancelled_shares: cancelled,
                            },
                            out,
                        );
                    }
                } else {
                    // The order lost its place: what traded first, then Replace (or Delete
                    // and Add if nothing of it is left on the book) at the back of the queue.
                    let order_ref = self.leave(instrument, id);
                    let left = self.execute(locate, order_ref, &p, exec, ts, out);
                    match (left > 0, order.qty > 0) {
                        (true, true) => self.enter(
                            locate,
                            stock,
                            price_mul,
                            order,
                            Some(order_ref),
                            OrderLogAction::Change,
                            out,
                        ),
                        (true, false) => {
                            self.emit(locate, ts, Body::OrderDelete { order_ref }, out)
                        }
                        (false, true) => self.enter(
                            locate,
                            stock,
                            price_mul,
                            order,
                            None,
                            OrderLogAction::Change,
                            out,
                        ),
                        (false, false) => {}
                    }
                }
            }
        }
    }

    fn flush_pending_replace(&mut self, out: &mut Vec<Message>) {
        if let Some(r) = self.pending_replace.take() {
            let locate = self.instruments.get(&r.instrument).map_or(0, |i| i.locate);
            self.emit(
                locate,
                r.ts_ns,
                Body::OrderDelete {
                    order_ref: r.order_ref,
                },
                out,
            );
        }
    }

    /// Takes an order off the published book; returns the reference it rested under.
    fn leave(&mut self, instrument: u32, id: u64) -> u64 {
        if let Some(inst) = self.instruments.get_mut(&instrument) {
            let _ = inst.book.remove(id);
        }
        self.refs.remove(&id).unwrap_or(id)
    }

    /// Publishes an execution against a resting order whose published size was `p.qty`
    /// (Order Executed for the shown part, Trade for any hidden rest); returns the shares
    /// still shown under its reference.
    fn execute(
        &mut self,
        locate: u16,
        order_ref: u64,
        p: &BookOrder,
        exec: Option<PendingExec>,
        ts: u64,
        out: &mut Vec<Message>,
    ) -> i64 {
        let Some(x) = exec else {
            return p.qty;
        };
        let shown = x.qty.min(p.qty);
        if shown > 0 {
            let executed_shares = u32::try_from(shown).unwrap_or(u32::MAX);
            let price_mul = self
                .instruments
                .get(&x.instrument)
                .and_then(|i| i.price_mul);
            let body = match (x.auction, itch_price(price_mul, x.price)) {
                (true, Some(price)) => Body::OrderExecutedWithPrice {
                    order_ref,
                    executed_shares,
                    match_number: x.match_number,
                    printable: b'N',
                    price,
                },
                _ => Body::OrderExecuted {
                    order_ref,
                    executed_shares,
                    match_number: x.match_number,
                },
            };
            self.emit(locate, ts, body, out);
        }
        if x.qty > shown {
            self.hidden_trade(x, x.qty - shown, out);
        }
        p.qty - shown
    }

    /// Puts an order on the published book: Add Order, or Order Replace of `replacing`.
    #[allow(clippy::too_many_arguments)]
    fn enter(
        &mut self,
        locate: u16,
        stock: [u8; 8],
        price_mul: Option<u32>,
        order: BookOrder,
        replacing: Option<u64>,
        action: OrderLogAction,
        out: &mut Vec<Message>,
    ) {
        if price_mul.is_none() {
            self.stats.orders_not_published += 1;
            return;
        }
        let (Some(price), Ok(shares)) =
            (itch_price(price_mul, order.price), u32::try_from(order.qty))
        else {
            self.stats.unrepresentable += 1;
            if let Some(original_ref) = replacing {
                self.emit(
                    locate,
                    order.ts_ns,
                    Body::OrderDelete {
                        order_ref: original_ref,
                    },
                    out,
                );
            }
            return;
        };
        let first_entry = action == OrderLogAction::New && replacing.is_none();
        let new_ref = if first_entry {
            order.order_id
        } else {
            let r = self.next_replacement_ref;
            self.next_replacement_ref += 1;
            r
        };
        let id = self.by_locate[usize::from(locate) - 1];
        let instrument = self
            .instruments
            .get_mut(&id)
            .expect("locates name defined instruments");
        if instrument.book.add(order).is_err() {
            self.stats.unrepresentable += 1;
            return;
        }
        self.refs.insert(order.order_id, new_ref);
        let body = match replacing {
            Some(original_ref) => Body::OrderReplace {
                original_ref,
                new_ref,
                shares,
                price,
            },
            None => Body::AddOrder {
                order_ref: new_ref,
                side: side_byte(order.side),
                shares,
                stock,
                price,
            },
        };
        self.emit(locate, order.ts_ns, body, out);
    }
}

/// A core price as ITCH's Price(4), if it fits.
/// The cross type of a call auction phase (a volatility auction is a halt's cross).
fn cross_type_of(phase: Phase) -> u8 {
    match phase {
        Phase::ClosingAuction => cross_type::CLOSING,
        Phase::VolatilityAuction => cross_type::HALT,
        _ => cross_type::OPENING,
    }
}

fn itch_price(price_mul: Option<u32>, price: i64) -> Option<u32> {
    let v = price.checked_mul(i64::from(price_mul?))?;
    u32::try_from(v).ok()
}
