//! A deliberately simple reference model of one trading core's matching, for differential
//! testing against `bourse_engine::Engine`.
//!
//! Everything here is chosen to be obviously right rather than fast: each book is a plain
//! `Vec` of resting orders, and every match re-scans it for the best price and, at that price,
//! the smallest arrival stamp. Priority is nothing but that stamp: an order takes a fresh one
//! whenever it (re)enters the book (arrival, a replace that loses priority, an iceberg refill).
//!
//! The model leaves out cash and risk: the differential test gives every account huge cash and
//! lets it go short, so the engine's risk checks never refuse anything and need no mirror.
//! Everything else is modelled: validation (in the engine's documented order; an iceberg shows at least 1/1000 of its total, an order's value must fit the arithmetic), limit and
//! market orders (a market order is a limit at the band edge fixed on arrival, the remainder
//! cancelled), Day/GTC/GTD/IOC/FOK, icebergs, self-trade prevention, the price band following
//! the last trade, replace, cancel, mass cancel, phases and end of day, and the call auctions:
//! orders resting without matching, the indicative price, the uncrossing (found by trying
//! every limit price in the book and the reference price, the rule applied step by step), the
//! auction times in force and the volatility interruption.
//!
//! The model speaks in [`Out`], a projection of the engine's events that keeps what the
//! differential test compares (outcomes, trades, cancels) and drops what the model does not
//! track (order-log numbering, cash).
#![allow(dead_code)]

pub mod gen;

use bourse_core::*;

/// What happened, as both the model and the (projected) engine report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out {
    Accepted {
        order_id: u64,
    },
    Rejected {
        reason: RejectReason,
    },
    CancelRejected {
        to: CancelRejectTo,
        reason: RejectReason,
    },
    CommandRejected {
        reason: RejectReason,
    },
    Trade {
        price: i64,
        qty: i64,
        buy: u64,
        sell: u64,
        aggressor: Side,
        auction: bool,
    },
    /// An indicative uncrossing: price, volume, surplus (positive: buys; all 0: no cross).
    Indicative {
        price: i64,
        qty: i64,
        surplus: i64,
    },
    Uncrossed {
        auction: Phase,
        price: i64,
        qty: i64,
    },
    Interruption {
        price: i64,
        end_ns: u64,
        extended: bool,
    },
    Cancelled {
        order_id: u64,
        qty: i64,
        reason: CancelReason,
    },
    Replaced {
        order_id: u64,
        price: i64,
        total: i64,
        leaves: i64,
        priority_kept: bool,
    },
    Expired {
        order_id: u64,
        qty: i64,
    },
    MassCancelDone {
        n: u64,
    },
    EndOfDayDone {
        n: u64,
    },
    PhaseChanged {
        instrument: u32,
        phase: Phase,
    },
    /// The id and the definition as the command gave it: symbol, market, price scale, tick,
    /// lot, multiplier, initial margin, band and reference price.
    InstrumentAdded {
        instrument: u32,
        definition: (String, Market, u8, i64, i64, i64, i128, u32, i64),
    },
    AccountAdded {
        account: u32,
    },
    CashChanged {
        account: u32,
    },
    KillSwitchSet {
        engaged: bool,
        n: u64,
    },
    MarginCallSet {
        account: u32,
        amount: i128,
    },
}

/// Projects engine events onto [`Out`]; order-log records are dropped.
pub fn project(events: &[Event]) -> Vec<Out> {
    events
        .iter()
        .filter_map(|e| {
            Some(match *e {
                Event::OrderAccepted { order_id, .. } => Out::Accepted {
                    order_id: order_id.0,
                },
                Event::OrderRejected { reason, .. } => Out::Rejected { reason },
                Event::CancelRejected {
                    response_to,
                    reason,
                    ..
                } => Out::CancelRejected {
                    to: response_to,
                    reason,
                },
                Event::CommandRejected { reason, .. } => Out::CommandRejected { reason },
                Event::Trade {
                    price,
                    qty,
                    aggressor,
                    buy,
                    sell,
                    auction,
                    ..
                } => Out::Trade {
                    price: price.0,
                    qty: qty.0,
                    buy: buy.order_id.0,
                    sell: sell.order_id.0,
                    aggressor,
                    auction,
                },
                Event::AuctionIndicative {
                    price,
                    qty,
                    surplus,
                    surplus_side,
                    ..
                } => Out::Indicative {
                    price: price.0,
                    qty: qty.0,
                    surplus: match surplus_side {
                        Some(Side::Buy) => surplus.0,
                        Some(Side::Sell) => -surplus.0,
                        None => {
                            assert_eq!(surplus.0, 0, "a surplus without a side");
                            0
                        }
                    },
                },
                Event::AuctionUncrossed {
                    auction,
                    price,
                    qty,
                    ..
                } => Out::Uncrossed {
                    auction,
                    price: price.0,
                    qty: qty.0,
                },
                Event::VolatilityInterruption {
                    price,
                    end_ns,
                    extended,
                    ..
                } => Out::Interruption {
                    price: price.0,
                    end_ns,
                    extended,
                },
                Event::OrderCancelled {
                    order_id,
                    qty_cancelled,
                    reason,
                    ..
                } => Out::Cancelled {
                    order_id: order_id.0,
                    qty: qty_cancelled.0,
                    reason,
                },
                Event::OrderReplaced {
                    order_id,
                    price,
                    qty_total,
                    qty_leaves,
                    priority_kept,
                    ..
                } => Out::Replaced {
                    order_id: order_id.0,
                    price: price.0,
                    total: qty_total.0,
                    leaves: qty_leaves.0,
                    priority_kept,
                },
                Event::OrderExpired {
                    order_id,
                    qty_expired,
                    ..
                } => Out::Expired {
                    order_id: order_id.0,
                    qty: qty_expired.0,
                },
                Event::MassCancelDone {
                    orders_cancelled, ..
                } => Out::MassCancelDone {
                    n: orders_cancelled,
                },
                Event::EndOfDayDone { orders_expired, .. } => {
                    Out::EndOfDayDone { n: orders_expired }
                }
                Event::PhaseChanged {
                    instrument, phase, ..
                } => Out::PhaseChanged {
                    instrument: instrument.0,
                    phase,
                },
                Event::InstrumentAdded {
                    instrument,
                    definition: d,
                    ..
                } => Out::InstrumentAdded {
                    instrument: instrument.0,
                    definition: (
                        d.symbol.as_str().to_owned(),
                        d.market,
                        d.price_scale,
                        d.tick.0,
                        d.lot_size,
                        d.multiplier,
                        d.initial_margin.0,
                        d.band_bps,
                        d.reference_price.0,
                    ),
                },
                Event::AccountAdded { account, .. } => Out::AccountAdded { account: account.0 },
                Event::CashChanged { account, .. } => Out::CashChanged { account: account.0 },
                Event::OrderLog(_) => return None,
                Event::KillSwitchSet {
                    engaged,
                    orders_cancelled,
                    ..
                } => Out::KillSwitchSet {
                    engaged,
                    n: orders_cancelled,
                },
                Event::MarginCallSet {
                    account, amount, ..
                } => Out::MarginCallSet {
                    account: account.0,
                    amount: amount.0,
                },
            })
        })
        .collect()
}

/// A resting order as the model keeps it (and as the test compares it with `OrderView`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ROrder {
    pub id: u64,
    pub cl: u64,
    pub account: u32,
    pub side: Side,
    pub price: i64,
    pub total: i64,
    pub filled: i64,
    pub leaves: i64,
    /// The iceberg's display size, 0 for an ordinary order.
    pub display_size: i64,
    /// The quantity visible now.
    pub display: i64,
    pub tif: TimeInForce,
    pub expire: u64,
    /// Arrival stamp: the only source of time priority.
    pub stamp: u64,
    /// A market order resting in a call auction (its price is the band edge).
    pub market: bool,
}

impl ROrder {
    fn show(&self, leaves: i64) -> i64 {
        if self.display_size > 0 {
            self.display_size.min(leaves)
        } else {
            leaves
        }
    }
}

#[derive(Clone, Debug)]
pub struct RBook {
    pub id: u32,
    /// For the value of an order: decimals of the price, lot size, multiplier.
    pub price_scale: u8,
    pub lot_size: i64,
    pub multiplier: i64,
    pub tick: i64,
    pub band_bps: i64,
    pub reference: i64,
    pub phase: Phase,
    /// Resting orders in no particular order.
    pub resting: Vec<ROrder>,
    /// The volatility guard, its static reference, the volatility auction's end (0: none),
    /// the official close (0: none) and the indicative uncrossing last published.
    pub guard: VolatilityGuard,
    pub static_ref: i64,
    pub end_ns: u64,
    pub close: i64,
    pub indicative: (i64, i64, i64),
}

impl RBook {
    /// Does the value of `qty` lots at `price` (rounded up to whole cash units of 10^-4) fit
    /// what one order may move? The engine refuses orders whose value does not.
    pub fn value_fits(&self, price: i64, qty: i64) -> bool {
        let raw = (price as i128)
            .checked_mul(qty as i128)
            .and_then(|v| v.checked_mul(self.lot_size as i128))
            .and_then(|v| v.checked_mul(self.multiplier as i128));
        let value = match raw {
            None => return false,
            Some(raw) if self.price_scale <= 4 => {
                raw.checked_mul(10i128.pow(4 - self.price_scale as u32))
            }
            Some(raw) => {
                let div = 10i128.pow(self.price_scale as u32 - 4);
                Some((raw + div - 1) / div)
            }
        };
        value.is_some_and(|v| v <= CASH_AMOUNT_MAX)
    }

    /// The band's lowest and highest acceptable prices, snapped inwards to the tick.
    pub fn band(&self) -> (i64, i64) {
        let width = self.reference as i128 * self.band_bps as i128 / 10_000;
        let (lo, hi) = (
            self.reference as i128 - width,
            self.reference as i128 + width,
        );
        let t = self.tick as i128;
        // Smallest multiple of the tick at or above lo; largest at or below hi.
        let mut low = if lo % t == 0 { lo } else { (lo / t + 1) * t };
        if lo < 0 {
            low = 0;
        }
        let low = low.max(t);
        let high = (hi / t * t).min(PRICE_MAX as i128 / t * t);
        (low as i64, high as i64)
    }

    /// Resting orders in priority order: bids best price first, then asks best price first;
    /// within a price, by arrival stamp.
    pub fn in_priority(&self) -> Vec<&ROrder> {
        let mut bids: Vec<&ROrder> = self
            .resting
            .iter()
            .filter(|o| o.side == Side::Buy)
            .collect();
        bids.sort_by_key(|o| (std::cmp::Reverse(o.price), o.stamp));
        let mut asks: Vec<&ROrder> = self
            .resting
            .iter()
            .filter(|o| o.side == Side::Sell)
            .collect();
        asks.sort_by_key(|o| (o.price, o.stamp));
        bids.extend(asks);
        bids
    }

    /// The index of the best resting order an incoming order of `side` with limit `limit`
    /// may trade with, if any.
    fn best_against(&self, side: Side, limit: i64) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, o) in self.resting.iter().enumerate() {
            if o.side == side {
                continue;
            }
            let crosses = match side {
                Side::Buy => o.price <= limit,
                Side::Sell => o.price >= limit,
            };
            if !crosses {
                continue;
            }
            best = match best {
                None => Some(i),
                Some(b) => {
                    let cur = &self.resting[b];
                    let better_price = match side {
                        Side::Buy => o.price < cur.price,
                        Side::Sell => o.price > cur.price,
                    };
                    if better_price || (o.price == cur.price && o.stamp < cur.stamp) {
                        Some(i)
                    } else {
                        Some(b)
                    }
                }
            };
        }
        best
    }
}

#[derive(Clone, Copy, Debug)]
pub struct RAccount {
    pub id: u32,
    pub firm: u32,
    pub stp: StpMode,
    pub scope: StpScope,
}

#[derive(PartialEq, Eq, Debug, Clone, Copy)]
enum End {
    Done,
    Stp,
    /// The next trade would have been at this price, outside the volatility guard.
    Interrupted(i64),
}

/// Is `price` within `bps` basis points of `reference` (always, for a band of 0)?
fn within(bps: u32, reference: i64, price: i64) -> bool {
    bps == 0
        || (price as i128 - reference as i128).abs() * 10_000 <= reference as i128 * bps as i128
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub books: Vec<RBook>,
    pub accounts: Vec<RAccount>,
    next_order_id: u64,
    next_stamp: u64,
    /// The time of the command being applied (a volatility auction's end is counted from it).
    now: u64,
    /// Firms and accounts whose kill switch is engaged.
    suspended_firms: std::collections::BTreeSet<u32>,
    suspended_accounts: std::collections::BTreeSet<u32>,
    /// Net lots per (account, book index), from the trades.
    positions: std::collections::BTreeMap<(u32, usize), i64>,
    /// The margin calls open: account to the amount still called (positive).
    margin_calls: std::collections::BTreeMap<u32, i128>,
}

impl Model {
    /// The accounts with a margin call open, by account.
    pub fn margin_called_accounts(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.margin_calls.keys().copied()
    }
}

impl Model {
    pub fn new() -> Model {
        Model {
            next_order_id: 1,
            ..Model::default()
        }
    }

    /// A model holding the engine's current books (priority as the engine has it), to aim
    /// generated flow at an engine the model cannot follow, such as one with real risk.
    pub fn from_engine(e: &bourse_engine::Engine) -> Model {
        let mut m = Model::new();
        for def in e.instruments() {
            let mut resting = Vec::new();
            for v in e.resting_orders(def.instrument) {
                m.next_stamp += 1;
                resting.push(ROrder {
                    id: v.order_id.0,
                    cl: v.cl_ord_id.0,
                    account: v.account.0,
                    side: v.side,
                    price: v.price.0,
                    total: v.qty_total.0,
                    filled: v.qty_filled.0,
                    leaves: v.qty_leaves.0,
                    display_size: if v.qty_display == v.qty_leaves {
                        0
                    } else {
                        v.qty_display.0
                    },
                    display: v.qty_display.0,
                    tif: v.tif,
                    expire: 0,
                    stamp: m.next_stamp,
                    market: v.market,
                });
            }
            let id = def.instrument;
            m.books.push(RBook {
                id: def.instrument.0,
                price_scale: def.price_scale,
                lot_size: def.lot_size,
                multiplier: def.multiplier,
                tick: def.tick.0,
                band_bps: def.band_bps as i64,
                reference: def.reference_price.0,
                phase: e.phase(def.instrument).expect("listed instrument"),
                resting,
                guard: def.volatility,
                static_ref: e.static_reference(id).expect("listed").0,
                end_ns: e.volatility_auction_end(id).unwrap_or(0),
                close: e.closing_price(id).map_or(0, |p| p.0),
                indicative: e
                    .indicative_uncross(id)
                    .filter(|_| e.phase(id).is_some_and(Phase::is_auction))
                    .map_or((0, 0, 0), |(p, q, s)| (p.0, q.0, s)),
            });
        }
        m
    }

    pub fn book(&self, id: u32) -> Option<&RBook> {
        self.books.iter().find(|b| b.id == id)
    }

    fn book_index(&self, id: InstrumentId) -> Option<usize> {
        self.books.iter().position(|b| b.id == id.0)
    }

    fn account(&self, id: AccountId) -> Option<RAccount> {
        self.accounts.iter().copied().find(|a| a.id == id.0)
    }

    fn firm_of(&self, account: u32) -> u32 {
        self.account(AccountId(account))
            .expect("known account")
            .firm
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Is there a live order of `account` with client id `cl`?
    fn live_cl(&self, account: u32, cl: u64) -> bool {
        self.books
            .iter()
            .any(|b| b.resting.iter().any(|o| o.account == account && o.cl == cl))
    }

    /// Every live order, wherever it rests: (book index, index in the book).
    pub fn live_orders(&self) -> impl Iterator<Item = &ROrder> {
        self.books.iter().flat_map(|b| b.resting.iter())
    }

    pub fn live_count(&self) -> usize {
        self.books.iter().map(|b| b.resting.len()).sum()
    }

    pub fn apply(&mut self, cmd: &Command) -> Vec<Out> {
        let mut out = Vec::new();
        let ts = cmd.ts_ns;
        self.now = ts;
        self.volatility_timers(ts, &mut out);
        match &cmd.body {
            CommandBody::NewOrder(o) => self.new_order(o, ts, &mut out),
            CommandBody::Cancel(c) => match self.lookup(c.account, &c.target) {
                Err(reason) => out.push(Out::CancelRejected {
                    to: CancelRejectTo::Cancel,
                    reason,
                }),
                Ok((b, i)) => {
                    let o = self.books[b].resting.remove(i);
                    out.push(Out::Cancelled {
                        order_id: o.id,
                        qty: o.leaves,
                        reason: CancelReason::Requested,
                    });
                    self.publish(b, &mut out);
                }
            },
            CommandBody::Replace(r) => {
                if let Err(reason) = self.replace(r, &mut out) {
                    out.push(Out::CancelRejected {
                        to: CancelRejectTo::Replace,
                        reason,
                    });
                }
            }
            CommandBody::MassCancel(m) => self.mass_cancel(m, &mut out),
            CommandBody::KillSwitch {
                firm,
                account,
                engaged,
            } => self.kill_switch(*firm, *account, *engaged, &mut out),
            CommandBody::MarginCall { account, amount } => {
                let reason = if self.account(*account).is_none() {
                    Some(RejectReason::UnknownAccount)
                } else if amount.0 < 0 {
                    Some(RejectReason::AmountNotPositive)
                } else if amount.0 > CASH_AMOUNT_MAX {
                    Some(RejectReason::Overflow)
                } else {
                    None
                };
                match reason {
                    Some(reason) => out.push(Out::CommandRejected { reason }),
                    None => {
                        if amount.0 == 0 {
                            self.margin_calls.remove(&account.0);
                        } else {
                            self.margin_calls.insert(account.0, amount.0);
                        }
                        out.push(Out::MarginCallSet {
                            account: account.0,
                            amount: amount.0,
                        });
                    }
                }
            }
            CommandBody::SetPhase { instrument, phase } => match instrument {
                Some(id) => match self.book_index(*id) {
                    Some(b) => self.change_phase(b, *phase, &mut out),
                    None => out.push(Out::CommandRejected {
                        reason: RejectReason::UnknownInstrument,
                    }),
                },
                None => {
                    for b in 0..self.books.len() {
                        self.change_phase(b, *phase, &mut out);
                    }
                }
            },
            CommandBody::AddInstrument(def) => {
                if def.validate().is_err() {
                    out.push(Out::CommandRejected {
                        reason: RejectReason::InvalidInstrument,
                    });
                } else if self.book_index(def.instrument).is_some() {
                    out.push(Out::CommandRejected {
                        reason: RejectReason::DuplicateInstrument,
                    });
                } else {
                    self.books.push(RBook {
                        id: def.instrument.0,
                        price_scale: def.price_scale,
                        lot_size: def.lot_size,
                        multiplier: def.multiplier,
                        tick: def.tick.0,
                        band_bps: def.band_bps as i64,
                        reference: def.reference_price.0,
                        phase: Phase::Open,
                        resting: Vec::new(),
                        guard: def.volatility,
                        static_ref: def.reference_price.0,
                        end_ns: 0,
                        close: 0,
                        indicative: (0, 0, 0),
                    });
                    out.push(Out::InstrumentAdded {
                        instrument: def.instrument.0,
                        definition: (
                            def.symbol.clone(),
                            def.market,
                            def.price_scale,
                            def.tick.0,
                            def.lot_size,
                            def.multiplier,
                            def.initial_margin.0,
                            def.band_bps,
                            def.reference_price.0,
                        ),
                    });
                }
            }
            CommandBody::AddAccount(spec) => {
                if self.account(spec.account).is_some() {
                    out.push(Out::CommandRejected {
                        reason: RejectReason::DuplicateAccount,
                    });
                } else {
                    assert!(
                        spec.may_short,
                        "the model does not model risk: accounts must be allowed to short"
                    );
                    self.accounts.push(RAccount {
                        id: spec.account.0,
                        firm: spec.firm.0,
                        stp: spec.stp,
                        scope: spec.stp_scope,
                    });
                    out.push(Out::AccountAdded {
                        account: spec.account.0,
                    });
                }
            }
            CommandBody::AddFundedAccount { spec, cash } => {
                let reason = if cash.0 < 0 {
                    Some(RejectReason::AmountNotPositive)
                } else if cash.0 > CASH_AMOUNT_MAX {
                    Some(RejectReason::Overflow)
                } else if self.account(spec.account).is_some() {
                    Some(RejectReason::DuplicateAccount)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    out.push(Out::CommandRejected { reason });
                } else {
                    assert!(
                        spec.may_short,
                        "the model does not model risk: accounts must be allowed to short"
                    );
                    self.accounts.push(RAccount {
                        id: spec.account.0,
                        firm: spec.firm.0,
                        stp: spec.stp,
                        scope: spec.stp_scope,
                    });
                    out.push(Out::AccountAdded {
                        account: spec.account.0,
                    });
                    if cash.0 > 0 {
                        out.push(Out::CashChanged {
                            account: spec.account.0,
                        });
                    }
                }
            }
            CommandBody::Deposit { account, amount } => {
                // Cash is not modelled; the test deposits only valid amounts.
                assert!(amount.0 > 0 && amount.0 <= CASH_AMOUNT_MAX);
                match self.account(*account) {
                    Some(_) => {
                        out.push(Out::CashChanged { account: account.0 });
                        // A deposit goes towards the margin call open, if any.
                        if let Some(called) = self.margin_calls.get(&account.0).copied() {
                            let left = (called - amount.0).max(0);
                            if left == 0 {
                                self.margin_calls.remove(&account.0);
                            } else {
                                self.margin_calls.insert(account.0, left);
                            }
                            out.push(Out::MarginCallSet {
                                account: account.0,
                                amount: left,
                            });
                        }
                    }
                    None => out.push(Out::CommandRejected {
                        reason: RejectReason::UnknownAccount,
                    }),
                }
            }
            // Cash is not modelled, but a withdrawal while a margin call is open is refused
            // whatever the account's cash: the test asks for only those.
            CommandBody::Withdraw { account, amount } => {
                assert!(amount.0 > 0 && amount.0 <= CASH_AMOUNT_MAX);
                assert!(
                    self.margin_calls.contains_key(&account.0),
                    "the reference model does not model cash: withdraw only under a margin call"
                );
                out.push(Out::CommandRejected {
                    reason: RejectReason::MarginCallOpen,
                });
            }
            CommandBody::SetCollateral { .. } | CommandBody::ClearingDebit { .. } => {
                panic!("the reference model does not model cash")
            }
            CommandBody::EndOfDay => {
                let expired: Vec<u64> = self
                    .books
                    .iter()
                    .flat_map(|b| b.in_priority())
                    .filter(|o| match o.tif {
                        TimeInForce::Day
                        | TimeInForce::AtOpening
                        | TimeInForce::AtClose
                        | TimeInForce::GoodForAuction => true,
                        TimeInForce::Gtd => o.expire <= ts,
                        _ => false,
                    })
                    .map(|o| o.id)
                    .collect();
                for id in &expired {
                    let (b, i) = self.find(*id).expect("live");
                    let o = self.books[b].resting.remove(i);
                    out.push(Out::Expired {
                        order_id: o.id,
                        qty: o.leaves,
                    });
                }
                self.publish_all(&mut out);
                out.push(Out::EndOfDayDone {
                    n: expired.len() as u64,
                });
            }
        }
        out
    }

    fn find(&self, id: u64) -> Option<(usize, usize)> {
        for (b, book) in self.books.iter().enumerate() {
            if let Some(i) = book.resting.iter().position(|o| o.id == id) {
                return Some((b, i));
            }
        }
        None
    }

    fn lookup(
        &self,
        account: AccountId,
        target: &OrderRef,
    ) -> Result<(usize, usize), RejectReason> {
        self.account(account).ok_or(RejectReason::UnknownAccount)?;
        let found = match (target.order_id, target.orig_cl_ord_id) {
            (Some(id), None) => self
                .find(id.0)
                .filter(|&(b, i)| self.books[b].resting[i].account == account.0),
            (None, Some(cl)) => {
                let mut hit = None;
                for (b, book) in self.books.iter().enumerate() {
                    for (i, o) in book.resting.iter().enumerate() {
                        if o.account == account.0 && o.cl == cl.0 {
                            hit = Some((b, i));
                        }
                    }
                }
                hit
            }
            _ => return Err(RejectReason::OrderRefInvalid),
        };
        found.ok_or(RejectReason::UnknownOrder)
    }

    fn check_price(book: &RBook, price: i64) -> Result<(), RejectReason> {
        if price <= 0 {
            return Err(RejectReason::PriceNotPositive);
        }
        if price > PRICE_MAX {
            return Err(RejectReason::PriceTooLarge);
        }
        if price % book.tick != 0 {
            return Err(RejectReason::PriceOffTick);
        }
        let (low, high) = book.band();
        if price < low || price > high {
            return Err(RejectReason::PriceOutsideBand);
        }
        Ok(())
    }

    fn validate_new(&self, o: &NewOrder, ts: u64) -> Result<(usize, i64), RejectReason> {
        let b = self
            .book_index(o.instrument)
            .ok_or(RejectReason::UnknownInstrument)?;
        self.account(o.account)
            .ok_or(RejectReason::UnknownAccount)?;
        self.check_not_suspended(o.account.0)?;
        let book = &self.books[b];
        Self::phase_admits(book.phase)?;
        let ok = match o.tif {
            TimeInForce::AtOpening => book.phase == Phase::OpeningAuction,
            TimeInForce::AtClose => book.phase == Phase::ClosingAuction,
            TimeInForce::GoodForAuction => book.phase.is_auction(),
            TimeInForce::Ioc | TimeInForce::Fok => !book.phase.is_auction(),
            _ => true,
        };
        if !ok {
            return Err(RejectReason::TimeInForceNotInPhase);
        }
        if o.qty.0 <= 0 {
            return Err(RejectReason::QtyNotPositive);
        }
        if o.qty.0 > QTY_MAX {
            return Err(RejectReason::QtyTooLarge);
        }
        let limit = match o.ord_type {
            OrdType::Market => {
                if matches!(o.tif, TimeInForce::Gtc | TimeInForce::Gtd) {
                    return Err(RejectReason::InvalidTimeInForce);
                }
                let (low, high) = book.band();
                match o.side {
                    Side::Buy => high,
                    Side::Sell => low,
                }
            }
            OrdType::Limit => {
                Self::check_price(book, o.price.0)?;
                o.price.0
            }
        };
        if o.tif == TimeInForce::Gtd {
            if o.expire_ts_ns == 0 {
                return Err(RejectReason::ExpireTimeMissing);
            }
            if o.expire_ts_ns <= ts {
                return Err(RejectReason::ExpireTimeInPast);
            }
        } else if o.expire_ts_ns != 0 {
            return Err(RejectReason::ExpireTimeUnexpected);
        }
        let d = o.display_qty.0;
        if d != 0
            && (d < 0
                || d > o.qty.0
                || (d as i128) * 1000 < o.qty.0 as i128
                || o.ord_type == OrdType::Market
                || matches!(o.tif, TimeInForce::Ioc | TimeInForce::Fok))
        {
            return Err(RejectReason::DisplayQtyInvalid);
        }
        if self.live_cl(o.account.0, o.cl_ord_id.0) {
            return Err(RejectReason::DuplicateClOrdId);
        }
        if self.margin_calls.contains_key(&o.account.0)
            && !self.reduces_exposure(o.account.0, b, o.side, o.qty.0, 0)
        {
            return Err(RejectReason::MarginCallOpen);
        }
        if !book.value_fits(limit, o.qty.0) {
            return Err(RejectReason::Overflow);
        }
        Ok((b, limit))
    }

    fn new_order(&mut self, o: &NewOrder, ts: u64, out: &mut Vec<Out>) {
        let (b, limit) = match self.validate_new(o, ts) {
            Ok(x) => x,
            Err(reason) => {
                out.push(Out::Rejected { reason });
                return;
            }
        };
        let id = self.next_order_id;
        self.next_order_id += 1;
        out.push(Out::Accepted { order_id: id });
        let is_market = o.ord_type == OrdType::Market;
        let in_call = self.books[b].phase.is_auction();
        let mut order = ROrder {
            id,
            cl: o.cl_ord_id.0,
            account: o.account.0,
            side: o.side,
            price: limit,
            total: o.qty.0,
            filled: 0,
            leaves: o.qty.0,
            display_size: o.display_qty.0,
            display: 0,
            // A market order is never resting in continuous trading: Day reads as IOC. In a
            // call it rests until the uncrossing.
            tif: if is_market && o.tif == TimeInForce::Day && !in_call {
                TimeInForce::Ioc
            } else {
                o.tif
            },
            expire: o.expire_ts_ns,
            stamp: 0,
            market: is_market && in_call,
        };
        order.display = order.show(order.leaves);
        if in_call {
            order.stamp = self.stamp();
            self.books[b].resting.push(order);
            self.publish(b, out);
            return;
        }
        if order.tif == TimeInForce::Fok {
            // Fill or kill: try the whole match on a copy; if it would not fill completely,
            // nothing at all happens.
            let mut trial_model = self.clone();
            let mut trial = order.clone();
            let mut scratch = Vec::new();
            let end = trial_model.match_incoming(b, &mut trial, &mut scratch);
            if !(end == End::Done && trial.leaves == 0) {
                out.push(Out::Cancelled {
                    order_id: id,
                    qty: order.leaves,
                    reason: CancelReason::FillOrKillUnfilled,
                });
                return;
            }
        }
        let end = self.match_incoming(b, &mut order, out);
        self.finish(b, order, end, is_market, out);
    }

    /// Matches `inc` (not resting) against the opposite side of book `b`.
    fn match_incoming(&mut self, b: usize, inc: &mut ROrder, out: &mut Vec<Out>) -> End {
        let me = self.account(AccountId(inc.account)).expect("known account");
        // The volatility guard's references as the order arrives.
        let (guard, dynamic_ref, static_ref) = {
            let book = &self.books[b];
            (book.guard, book.reference, book.static_ref)
        };
        loop {
            if inc.leaves == 0 {
                return End::Done;
            }
            let Some(i) = self.books[b].best_against(inc.side, inc.price) else {
                return End::Done;
            };
            let r = self.books[b].resting[i].clone();
            if !within(guard.dynamic_bps, dynamic_ref, r.price)
                || !within(guard.static_bps, static_ref, r.price)
            {
                return End::Interrupted(r.price);
            }
            let same = match me.stp {
                StpMode::None => false,
                _ => match me.scope {
                    StpScope::Account => r.account == me.id,
                    StpScope::Firm => self.firm_of(r.account) == me.firm,
                },
            };
            if same {
                match me.stp {
                    StpMode::CancelResting | StpMode::CancelBoth => {
                        self.books[b].resting.remove(i);
                        out.push(Out::Cancelled {
                            order_id: r.id,
                            qty: r.leaves,
                            reason: CancelReason::SelfTradePrevention,
                        });
                        if me.stp == StpMode::CancelBoth {
                            return End::Stp;
                        }
                        continue;
                    }
                    StpMode::CancelIncoming => return End::Stp,
                    StpMode::None => unreachable!(),
                }
            }
            // Only the visible part of the resting order trades at a time.
            let qty = inc.leaves.min(r.display);
            inc.leaves -= qty;
            inc.filled += qty;
            inc.display = inc.show(inc.leaves);
            let (buy, sell) = match inc.side {
                Side::Buy => (inc.id, r.id),
                Side::Sell => (r.id, inc.id),
            };
            out.push(Out::Trade {
                price: r.price,
                qty,
                buy,
                sell,
                aggressor: inc.side,
                auction: false,
            });
            let (buyer, seller) = match inc.side {
                Side::Buy => (inc.account, r.account),
                Side::Sell => (r.account, inc.account),
            };
            *self.positions.entry((buyer, b)).or_default() += qty;
            *self.positions.entry((seller, b)).or_default() -= qty;
            self.books[b].reference = r.price;
            let stamp = self.stamp();
            let ro = &mut self.books[b].resting[i];
            ro.leaves -= qty;
            ro.filled += qty;
            ro.display -= qty;
            if ro.leaves == 0 {
                self.books[b].resting.remove(i);
            } else if ro.display == 0 {
                // The iceberg shows its next part and goes to the back of its level.
                ro.display = ro.show(ro.leaves);
                ro.stamp = stamp;
            }
        }
    }

    /// After matching: the order rests, or what is left of it is cancelled.
    fn finish(&mut self, b: usize, mut o: ROrder, end: End, is_market: bool, out: &mut Vec<Out>) {
        if o.leaves == 0 {
            return;
        }
        if let End::Interrupted(price) = end {
            let book = &mut self.books[b];
            book.phase = Phase::VolatilityAuction;
            book.end_ns = self.now.saturating_add(book.guard.auction_ns);
            out.push(Out::PhaseChanged {
                instrument: book.id,
                phase: Phase::VolatilityAuction,
            });
            out.push(Out::Interruption {
                price,
                end_ns: book.end_ns,
                extended: false,
            });
        }
        let reason = if end == End::Stp {
            Some(CancelReason::SelfTradePrevention)
        } else if is_market {
            Some(CancelReason::MarketRemainder)
        } else {
            match o.tif {
                TimeInForce::Ioc => Some(CancelReason::ImmediateOrCancelRemainder),
                TimeInForce::Fok => Some(CancelReason::FillOrKillUnfilled),
                _ => None,
            }
        };
        match reason {
            Some(reason) => out.push(Out::Cancelled {
                order_id: o.id,
                qty: o.leaves,
                reason,
            }),
            None => {
                o.stamp = self.stamp();
                self.books[b].resting.push(o);
            }
        }
        if matches!(end, End::Interrupted(_)) {
            self.publish(b, out);
        }
    }

    fn replace(&mut self, r: &Replace, out: &mut Vec<Out>) -> Result<(), RejectReason> {
        let (b, i) = self.lookup(r.account, &r.target)?;
        self.check_not_suspended(r.account.0)?;
        let book = &self.books[b];
        Self::phase_admits(book.phase)?;
        let o = &book.resting[i];
        let new_price = r.price.map_or(o.price, |p| p.0);
        let new_total = r.qty.map_or(o.total, |q| q.0);
        if new_price == o.price && new_total == o.total {
            return Err(RejectReason::ReplaceNoChange);
        }
        if new_price != o.price {
            Self::check_price(book, new_price)?;
        }
        if new_total <= 0 {
            return Err(RejectReason::QtyNotPositive);
        }
        if new_total > QTY_MAX {
            return Err(RejectReason::QtyTooLarge);
        }
        if new_total <= o.filled {
            return Err(RejectReason::ReplaceQtyNotAboveFilled);
        }
        // An iceberg is shown in at most 1,000 parts.
        if o.display_size > 0 && (o.display_size as i128) * 1000 < new_total as i128 {
            return Err(RejectReason::DisplayQtyInvalid);
        }
        if r.cl_ord_id.0 != o.cl && self.live_cl(o.account, r.cl_ord_id.0) {
            return Err(RejectReason::DuplicateClOrdId);
        }
        let new_leaves = new_total - o.filled;
        if self.margin_calls.contains_key(&o.account)
            && !(new_price == o.price && new_leaves <= o.leaves)
            && !self.reduces_exposure(o.account, b, o.side, new_leaves, o.leaves)
        {
            return Err(RejectReason::MarginCallOpen);
        }
        if !book.value_fits(new_price, new_leaves) {
            return Err(RejectReason::Overflow);
        }
        let kept = new_price == o.price && new_leaves <= o.leaves;
        let mut o = self.books[b].resting.remove(i);
        o.cl = r.cl_ord_id.0;
        o.total = new_total;
        out.push(Out::Replaced {
            order_id: o.id,
            price: new_price,
            total: new_total,
            leaves: new_leaves,
            priority_kept: kept,
        });
        if kept {
            // A decrease keeps the place in the queue (and the stamp); the visible part
            // shrinks only if the order no longer has that much.
            o.display = if o.display_size > 0 {
                o.display.min(new_leaves)
            } else {
                new_leaves
            };
            o.leaves = new_leaves;
            self.books[b].resting.push(o);
            if self.books[b].phase.is_auction() {
                self.publish(b, out);
            }
        } else {
            // Priority lost: the order re-enters as an aggressor at its new price (a market
            // order given a price is a limit order from then on). In a call it just rests.
            o.market &= new_price == o.price;
            o.price = new_price;
            o.leaves = new_leaves;
            o.display = o.show(new_leaves);
            if self.books[b].phase.is_auction() {
                o.stamp = self.stamp();
                self.books[b].resting.push(o);
                self.publish(b, out);
            } else {
                let end = self.match_incoming(b, &mut o, out);
                self.finish(b, o, end, false, out);
            }
        }
        Ok(())
    }

    fn mass_cancel(&mut self, m: &MassCancel, out: &mut Vec<Out>) {
        if m.account.is_none() && m.firm.is_none() && m.instrument.is_none() && m.side.is_none() {
            out.push(Out::CommandRejected {
                reason: RejectReason::MassCancelUnfiltered,
            });
            return;
        }
        if let Some(a) = m.account {
            if self.account(a).is_none() {
                out.push(Out::CommandRejected {
                    reason: RejectReason::UnknownAccount,
                });
                return;
            }
        }
        if let Some(i) = m.instrument {
            if self.book_index(i).is_none() {
                out.push(Out::CommandRejected {
                    reason: RejectReason::UnknownInstrument,
                });
                return;
            }
        }
        let victims: Vec<u64> = self
            .books
            .iter()
            .filter(|b| m.instrument.is_none_or(|i| i.0 == b.id))
            .flat_map(|b| b.in_priority())
            .filter(|o| {
                m.side.is_none_or(|s| s == o.side)
                    && m.account.is_none_or(|a| a.0 == o.account)
                    && m.firm.is_none_or(|f| f.0 == self.firm_of(o.account))
            })
            .map(|o| o.id)
            .collect();
        for id in &victims {
            let (b, i) = self.find(*id).expect("live");
            let o = self.books[b].resting.remove(i);
            out.push(Out::Cancelled {
                order_id: o.id,
                qty: o.leaves,
                reason: CancelReason::MassCancel,
            });
        }
        self.publish_all(out);
        out.push(Out::MassCancelDone {
            n: victims.len() as u64,
        });
    }

    /// Whether an order can only bring the account's position in book `b` towards zero, its
    /// side's other open orders counted (the engine's `risk::reduces_exposure`).
    fn reduces_exposure(&self, account: u32, b: usize, side: Side, leaves: i64, old: i64) -> bool {
        let qty = self.positions.get(&(account, b)).copied().unwrap_or(0) as i128;
        let open: i128 = self.books[b]
            .resting
            .iter()
            .filter(|o| o.account == account && o.side == side)
            .map(|o| o.leaves as i128)
            .sum();
        let held = match side {
            Side::Sell => qty,
            Side::Buy => -qty,
        };
        held > 0 && open + leaves as i128 - old as i128 <= held
    }

    fn check_not_suspended(&self, account: u32) -> Result<(), RejectReason> {
        if self.suspended_accounts.contains(&account)
            || self.suspended_firms.contains(&self.firm_of(account))
        {
            return Err(RejectReason::TradingSuspended);
        }
        Ok(())
    }

    fn kill_switch(
        &mut self,
        firm: Option<FirmId>,
        account: Option<AccountId>,
        engaged: bool,
        out: &mut Vec<Out>,
    ) {
        if firm.is_some() == account.is_some() {
            out.push(Out::CommandRejected {
                reason: RejectReason::KillSwitchTargetInvalid,
            });
            return;
        }
        let (set, id) = match (firm, account) {
            (Some(f), _) => (&mut self.suspended_firms, f.0),
            (_, Some(a)) => (&mut self.suspended_accounts, a.0),
            _ => unreachable!(),
        };
        if engaged {
            set.insert(id);
        } else {
            set.remove(&id);
        }
        let mut n = 0;
        if engaged {
            let victims: Vec<u64> = self
                .books
                .iter()
                .flat_map(|b| b.in_priority())
                .filter(|o| {
                    firm.is_some_and(|f| f.0 == self.firm_of(o.account))
                        || account.is_some_and(|a| a.0 == o.account)
                })
                .map(|o| o.id)
                .collect();
            for id in &victims {
                let (b, i) = self.find(*id).expect("live");
                let o = self.books[b].resting.remove(i);
                out.push(Out::Cancelled {
                    order_id: o.id,
                    qty: o.leaves,
                    reason: CancelReason::MassCancel,
                });
            }
            n = victims.len() as u64;
            self.publish_all(out);
        }
        out.push(Out::KillSwitchSet { engaged, n });
    }
}

/// The call auctions, as simply as they can be said.
impl Model {
    fn phase_admits(phase: Phase) -> Result<(), RejectReason> {
        match phase {
            Phase::Halted => Err(RejectReason::InstrumentHalted),
            Phase::Closed => Err(RejectReason::InstrumentClosed),
            Phase::Paused => Err(RejectReason::InstrumentPaused),
            _ => Ok(()),
        }
    }

    /// The uncrossing of book `b` as it stands: (price, volume, surplus), all 0 without a
    /// cross. Every limit price of the book and the reference price are tried, each against
    /// every resting order, and the rule is applied step by step.
    pub fn uncross_price(&self, b: usize) -> (i64, i64, i64) {
        let book = &self.books[b];
        let mut candidates: Vec<i64> = book
            .resting
            .iter()
            .filter(|o| !o.market)
            .map(|o| o.price)
            .collect();
        candidates.push(book.reference);
        candidates.sort();
        candidates.dedup();
        // (price, volume, surplus)
        let evaluated: Vec<(i64, i64, i64)> = candidates
            .iter()
            .map(|&p| {
                let demand: i64 = book
                    .resting
                    .iter()
                    .filter(|o| o.side == Side::Buy && o.price >= p)
                    .map(|o| o.leaves)
                    .sum();
                let supply: i64 = book
                    .resting
                    .iter()
                    .filter(|o| o.side == Side::Sell && o.price <= p)
                    .map(|o| o.leaves)
                    .sum();
                (p, demand.min(supply), demand - supply)
            })
            .collect();
        // (a) the largest volume
        let volume = evaluated.iter().map(|c| c.1).max().unwrap_or(0);
        if volume == 0 {
            return (0, 0, 0);
        }
        let left: Vec<_> = evaluated.into_iter().filter(|c| c.1 == volume).collect();
        // (b) the least surplus
        let least = left.iter().map(|c| c.2.abs()).min().unwrap();
        let left: Vec<_> = left.into_iter().filter(|c| c.2.abs() == least).collect();
        // (c) market pressure
        if left.iter().all(|c| c.2 > 0) {
            return *left.iter().max_by_key(|c| c.0).unwrap();
        }
        if left.iter().all(|c| c.2 < 0) {
            return *left.iter().min_by_key(|c| c.0).unwrap();
        }
        // (d) nearest the reference price, (e) then the higher
        let nearest = left
            .iter()
            .map(|c| (c.0 - book.reference).abs())
            .min()
            .unwrap();
        *left
            .iter()
            .filter(|c| (c.0 - book.reference).abs() == nearest)
            .max_by_key(|c| c.0)
            .unwrap()
    }

    /// Publishes the indicative uncrossing of book `b`, if it is in a call and it changed.
    fn publish(&mut self, b: usize, out: &mut Vec<Out>) {
        if !self.books[b].phase.is_auction() {
            return;
        }
        let u = self.uncross_price(b);
        if u != self.books[b].indicative {
            self.books[b].indicative = u;
            out.push(Out::Indicative {
                price: u.0,
                qty: u.1,
                surplus: u.2,
            });
        }
    }

    fn publish_all(&mut self, out: &mut Vec<Out>) {
        for b in 0..self.books.len() {
            self.publish(b, out);
        }
    }

    fn change_phase(&mut self, b: usize, phase: Phase, out: &mut Vec<Out>) {
        let old = self.books[b].phase;
        if old.is_auction() && phase != old {
            self.uncross(b, out);
        }
        self.books[b].phase = phase;
        out.push(Out::PhaseChanged {
            instrument: self.books[b].id,
            phase,
        });
    }

    /// The volatility auctions due at `ts`, in book order: uncrossed if the indicative price
    /// is within the guard (or there is no cross), else extended from `ts`.
    fn volatility_timers(&mut self, ts: u64, out: &mut Vec<Out>) {
        for b in 0..self.books.len() {
            let book = &self.books[b];
            if book.phase != Phase::VolatilityAuction || book.end_ns == 0 || book.end_ns > ts {
                continue;
            }
            let (price, qty, _) = self.uncross_price(b);
            let book = &self.books[b];
            let inside = within(book.guard.dynamic_bps, book.reference, price)
                && within(book.guard.static_bps, book.static_ref, price);
            if qty == 0 || inside {
                self.change_phase(b, Phase::Open, out);
            } else {
                let book = &mut self.books[b];
                book.end_ns = ts.saturating_add(book.guard.auction_ns);
                out.push(Out::Interruption {
                    price,
                    end_ns: book.end_ns,
                    extended: true,
                });
            }
        }
    }

    /// The uncrossing: trades in price-time priority at the price, the auction's end, then
    /// the cancels of market orders and orders for one auction.
    fn uncross(&mut self, b: usize, out: &mut Vec<Out>) {
        let (price, volume, _) = self.uncross_price(b);
        if volume > 0 {
            let book = &self.books[b];
            let mut buys: Vec<&ROrder> = book
                .resting
                .iter()
                .filter(|o| o.side == Side::Buy && o.price >= price)
                .collect();
            buys.sort_by_key(|o| (std::cmp::Reverse(o.price), o.stamp));
            let mut sells: Vec<&ROrder> = book
                .resting
                .iter()
                .filter(|o| o.side == Side::Sell && o.price <= price)
                .collect();
            sells.sort_by_key(|o| (o.price, o.stamp));
            let take = |list: Vec<&ROrder>| {
                let mut left = volume;
                let mut v = Vec::new();
                for o in list {
                    if left == 0 {
                        break;
                    }
                    let q = o.leaves.min(left);
                    v.push((o.id, q));
                    left -= q;
                }
                v
            };
            let (mut buys, mut sells) = (take(buys), take(sells));
            let (mut i, mut j) = (0, 0);
            while i < buys.len() && j < sells.len() {
                let q = buys[i].1.min(sells[j].1);
                let (buy, sell) = (buys[i].0, sells[j].0);
                out.push(Out::Trade {
                    price,
                    qty: q,
                    buy,
                    sell,
                    aggressor: if buy > sell { Side::Buy } else { Side::Sell },
                    auction: true,
                });
                for id in [buy, sell] {
                    let (_, k) = self.find(id).expect("live");
                    let o = &mut self.books[b].resting[k];
                    o.filled += q;
                    o.leaves -= q;
                    o.display -= q.min(o.display);
                }
                let (buyer, seller) = (
                    self.books[b].resting[self.find(buy).unwrap().1].account,
                    self.books[b].resting[self.find(sell).unwrap().1].account,
                );
                *self.positions.entry((buyer, b)).or_default() += q;
                *self.positions.entry((seller, b)).or_default() -= q;
                buys[i].1 -= q;
                sells[j].1 -= q;
                if buys[i].1 == 0 {
                    self.after_auction_fill(b, buy);
                    i += 1;
                }
                if sells[j].1 == 0 {
                    self.after_auction_fill(b, sell);
                    j += 1;
                }
            }
            self.books[b].reference = price;
            self.books[b].static_ref = price;
        }
        let book = &mut self.books[b];
        let shown = if volume > 0 { price } else { book.reference };
        if book.phase == Phase::ClosingAuction {
            book.close = shown;
        }
        book.end_ns = 0;
        book.indicative = (0, 0, 0);
        out.push(Out::Uncrossed {
            auction: book.phase,
            price: shown,
            qty: volume,
        });
        let gone: Vec<(u64, bool)> = book
            .in_priority()
            .into_iter()
            .filter(|o| o.market || o.tif.is_auction_only())
            .map(|o| (o.id, o.market))
            .collect();
        for (id, market) in gone {
            let (_, k) = self.find(id).expect("live");
            let o = self.books[b].resting.remove(k);
            out.push(Out::Cancelled {
                order_id: o.id,
                qty: o.leaves,
                reason: if market {
                    CancelReason::MarketRemainder
                } else {
                    CancelReason::AuctionUnexecuted
                },
            });
        }
    }

    /// After its last fill of an uncrossing: filled orders leave, an iceberg whose visible
    /// part executed shows its next part at the back of its level.
    fn after_auction_fill(&mut self, b: usize, id: u64) {
        let (_, k) = self.find(id).expect("live");
        let o = &self.books[b].resting[k];
        if o.leaves == 0 {
            self.books[b].resting.remove(k);
        } else if o.display == 0 {
            let stamp = self.stamp();
            let o = &mut self.books[b].resting[k];
            o.display = o.show(o.leaves);
            o.stamp = stamp;
        }
    }
}
