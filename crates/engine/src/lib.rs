//! # bourse-engine: one trading core
//!
//! [`Engine`] is the deterministic state machine of one trading core: books, accounts, cash,
//! reservations and positions. Start at [`Engine::apply`]: one [`Command`] in, [`Event`]s into
//! a caller-owned buffer. [`book`] holds the levels and the order pool, [`risk`] accounts and
//! positions, `auction` the call auctions, `snapshot` and `digest` the state hash
//! ([`Engine::state_hash`]) and its O(1) digest ([`Engine::state_digest`]); [`in_process`] runs
//! an engine on a thread of its own behind `bourse_core::link::CoreLink`.
//!
//! Determinism, no allocation per order and the other invariants: ARCHITECTURE.md,
//! `crates/engine`.

#![forbid(unsafe_code)]

mod auction;
pub mod book;
pub mod capacity;
mod digest;
pub mod fixtures;
pub mod in_process;
mod invariants;
pub mod risk;
mod snapshot;
pub mod workload;

pub use snapshot::RestoreError;

use book::{crosses, expires_at_end_of_day, Book, Ladder, Order, OrderPool, NIL};
use bourse_core::*;
use capacity::Preallocation;
use risk::{cash_required, futures_margin, is_self_trade, Account, Holding};
use rustc_hash::FxHashMap;

/// An iceberg may be split into at most this many visible parts: its display size must be at
/// least 1/1000 of its total quantity. Each refill is a separate trade, so without a bound one
/// order (10^12 lots showing 1) could make a single command emit 10^12 trades and stall the core.
pub const ICEBERG_PARTS_MAX: i64 = 1_000;

/// Entries the order lookup tables hold before their first growth.
const LOOKUP_CAPACITY_INITIAL: usize = 1024;

/// The most price levels per book side a core reserves up front: each instrument added
/// reserves this many for both sides, so a larger hint is a typo that would make the first
/// instrument ask for gigabytes. Snapshots are held to the same bound.
pub const LEVELS_PER_SIDE_HINT_MAX: u32 = 1 << 20;

/// Bytes the order lookup tables take per live order once they have grown to hold
/// `orders_max` orders: each table's entry and its control byte, at the hash table's load
/// factor of 7/8. Growth rounds a table up to a power of two, so a full table may take up to
/// twice this; the figure is the floor the check holds a configuration to, not a ceiling.
const LOOKUP_BYTES_PER_ORDER: usize =
    (std::mem::size_of::<(OrderId, u32)>() + std::mem::size_of::<((u32, ClOrdId), u32)>() + 2) * 8
        / 7;

/// Bytes a core sets aside per order of `orders_max`: what the order pool reserves, the
/// sweep buffer's room (`Engine::scratch`), and the lookup tables at their full size.
pub const ORDER_BYTES: usize =
    OrderPool::BYTES_PER_ORDER + std::mem::size_of::<u32>() + LOOKUP_BYTES_PER_ORDER;

/// Fixed limits of one core. Every table is sized from these once, at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Live orders the core can hold at once (resting plus the one being matched).
    pub orders_max: u32,
    /// Instruments the core can hold.
    pub instruments_max: u32,
    /// Accounts the core can hold.
    pub accounts_max: u32,
    /// Price levels reserved per book side up front (more are added if needed).
    pub levels_per_side_hint: u32,
    /// The id the core gives its first order. Cores of one venue start at different bases
    /// (`core_index << ORDER_ID_CORE_SHIFT`) so that an order id names one order across the
    /// whole venue: gateways and market data serve several cores at once.
    pub first_order_id: u64,
}

impl EngineConfig {
    /// Checks the limits [`Engine::new`] asserts, with an error that names the field and the
    /// values it accepts: configs and command-line flags are checked with it at startup, so a
    /// bad limit is a clear error rather than a panic.
    pub fn check(&self) -> Result<(), String> {
        if self.orders_max == 0 || self.orders_max == NIL {
            return Err(format!(
                "orders_max {} is out of range: it must be in 1..={}",
                self.orders_max,
                NIL - 1
            ));
        }
        if self.instruments_max == 0 {
            return Err("instruments_max 0: a core needs room for at least one instrument".into());
        }
        if self.accounts_max == 0 {
            return Err("accounts_max 0: a core needs room for at least one account".into());
        }
        if self.levels_per_side_hint > LEVELS_PER_SIDE_HINT_MAX {
            return Err(format!(
                "levels_per_side_hint {} is out of range: it must be at most {LEVELS_PER_SIDE_HINT_MAX}",
                self.levels_per_side_hint
            ));
        }
        if self.first_order_id == 0 {
            return Err("first_order_id 0: order id 0 means no order".into());
        }
        Ok(())
    }

    /// The memory a core with these limits sets aside, by the setting that sizes it (named by
    /// its configuration key): the order table, reserved at start for `orders_max` orders,
    /// and the price ladders each instrument reserves when it is added, for
    /// `instruments_max` instruments. Accounts are not listed: their table grows one account
    /// at a time and reserves nothing ahead.
    pub fn preallocations(&self) -> Vec<Preallocation> {
        let ladders_bytes_per_instrument =
            2 * u64::from(self.levels_per_side_hint) * Ladder::BYTES_PER_LEVEL as u64;
        vec![
            Preallocation::new(
                "orders_max",
                u64::from(self.orders_max),
                ORDER_BYTES as u64,
                "the order table",
            ),
            Preallocation::new(
                "instruments_max",
                u64::from(self.instruments_max),
                ladders_bytes_per_instrument,
                "the price ladders of the instruments",
            ),
        ]
    }

    /// Refuses limits whose [`preallocations`](Self::preallocations) exceed
    /// `available_bytes`, naming the setting to lower and how far
    /// ([`capacity::check_fits`]).
    pub fn check_fits(&self, available_bytes: u64) -> Result<(), String> {
        capacity::check_fits(&self.preallocations(), available_bytes)
    }
}

/// The bits of an order id below a core's base: each core may accept 2^48 orders.
pub const ORDER_ID_CORE_SHIFT: u32 = 48;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            orders_max: 1 << 20,
            instruments_max: 10_000,
            accounts_max: 10_000_000,
            levels_per_side_hint: 64,
            first_order_id: 1,
        }
    }
}

/// Running totals the engine keeps (they are part of the state and of the hash).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub commands: u64,
    pub orders_accepted: u64,
    pub orders_rejected: u64,
    pub trades: u64,
    pub cancels: u64,
    pub replaces: u64,
    pub expiries: u64,
    pub volume_lots: u128,
}

/// How matching an incoming order ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MatchEnd {
    /// No more quantity to match, or no crossing price.
    Done,
    /// Self-trade prevention cancels the incoming remainder.
    StpCancelIncoming,
    /// The next trade would have been at this price, outside a band of the instrument's
    /// volatility guard: the instrument goes into a volatility auction.
    Interrupted(i64),
}

/// One trading core's state machine.
pub struct Engine {
    config: EngineConfig,
    books: Vec<Book>,
    book_index: FxHashMap<InstrumentId, u32>,
    accounts: Vec<Account>,
    account_index: FxHashMap<AccountId, u32>,
    pool: OrderPool,
    /// Live orders by exchange id.
    order_index: FxHashMap<OrderId, u32>,
    /// Live orders by (account index, client order id).
    clord_index: FxHashMap<(u32, ClOrdId), u32>,
    next_order_id: u64,
    next_trade_id: u64,
    next_rec: u64,
    next_seq: u64,
    counters: Counters,
    /// Reused buffer of slots for sweeps (mass cancel, end of day).
    scratch: Vec<u32>,
    /// The state digest's sum over books, accounts and positions (the pool keeps the
    /// orders'; see `digest`).
    digest_items: u64,
    /// Firms and accounts whose kill switch is engaged, each list sorted and without
    /// duplicates (see `kill_switch`). Few entries: searched by bisection, never hashed.
    suspended_firms: Vec<FirmId>,
    suspended_accounts: Vec<AccountId>,
    /// The margin calls open (clearing's `MarginCall`), as (account, amount still called),
    /// sorted by account, amounts positive. Few entries: searched by bisection, never hashed.
    margin_calls: Vec<(AccountId, i128)>,
    /// The books in a volatility auction with an end time, by index (derived from the books;
    /// `auction`). Empty in the common case: one length test per command.
    vi_books: Vec<u32>,
    /// Reused buffers of the uncrossing (`auction`): the orders that execute.
    auction_bufs: auction::Buffers,
}

impl Engine {
    /// A core with the given limits, which must pass [`EngineConfig::check`].
    pub fn new(config: EngineConfig) -> Engine {
        if let Err(why) = config.check() {
            panic!("Engine::new: {why}");
        }
        let orders = config.orders_max as usize;
        // The lookup tables start small and grow with the largest number of orders ever live
        // at once (growth is the only allocation, and it stops once that peak is reached).
        // Reserving `orders_max` up front would spread a few thousand live orders over
        // megabytes of table and make every lookup a cache miss.
        let initial = orders.min(LOOKUP_CAPACITY_INITIAL);
        let mut order_index = FxHashMap::default();
        order_index.reserve(initial);
        let mut clord_index = FxHashMap::default();
        clord_index.reserve(initial);
        Engine {
            config,
            books: Vec::new(),
            book_index: FxHashMap::default(),
            accounts: Vec::new(),
            account_index: FxHashMap::default(),
            pool: OrderPool::with_capacity(orders),
            order_index,
            clord_index,
            next_order_id: config.first_order_id,
            next_trade_id: 1,
            next_rec: 1,
            next_seq: 1,
            counters: Counters::default(),
            scratch: Vec::with_capacity(orders),
            digest_items: 0,
            suspended_firms: Vec::new(),
            suspended_accounts: Vec::new(),
            margin_calls: Vec::new(),
            vi_books: Vec::new(),
            auction_bufs: auction::Buffers::default(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    pub fn live_orders(&self) -> usize {
        self.pool.live()
    }
    pub fn instrument_count(&self) -> usize {
        self.books.len()
    }
    pub fn account_count(&self) -> usize {
        self.accounts.len()
    }

    /// Applies one command and appends its events to `out`.
    pub fn apply(&mut self, cmd: &Command, out: &mut Vec<Event>) {
        self.counters.commands += 1;
        let ts = cmd.ts_ns;
        if !self.vi_books.is_empty() {
            self.volatility_timers(ts, out);
        }
        match &cmd.body {
            CommandBody::NewOrder(o) => self.new_order(o, ts, out),
            CommandBody::Cancel(c) => self.cancel(c, ts, out),
            CommandBody::Replace(r) => self.replace(r, ts, out),
            CommandBody::MassCancel(m) => self.mass_cancel(m, ts, out),
            CommandBody::SetPhase { instrument, phase } => {
                self.set_phase(*instrument, *phase, ts, out)
            }
            CommandBody::AddInstrument(def) => self.add_instrument(def, ts, out),
            CommandBody::AddAccount(spec) => self.add_account(spec, ts, out),
            CommandBody::AddFundedAccount { spec, cash } => {
                self.add_funded_account(spec, *cash, ts, out)
            }
            CommandBody::Deposit { account, amount } => {
                self.cash_op(*account, CashReason::Deposit, *amount, false, ts, out)
            }
            CommandBody::Withdraw { account, amount } => {
                self.cash_op(*account, CashReason::Withdraw, *amount, false, ts, out)
            }
            CommandBody::ClearingDebit { account, amount } => {
                self.cash_op(*account, CashReason::Withdraw, *amount, true, ts, out)
            }
            CommandBody::SetCollateral { account, amount } => {
                self.cash_op(*account, CashReason::SetCollateral, *amount, false, ts, out)
            }
            CommandBody::EndOfDay => self.end_of_day(ts, out),
            CommandBody::KillSwitch {
                firm,
                account,
                engaged,
            } => self.kill_switch(*firm, *account, *engaged, ts, out),
            CommandBody::MarginCall { account, amount } => {
                self.margin_call(*account, *amount, ts, out)
            }
        }
    }

    // ----- queries (for tests, market data snapshots, tools) -----

    /// The definition of an instrument, with its current reference price.
    pub fn instrument(&self, id: InstrumentId) -> Option<&Instrument> {
        self.book_index
            .get(&id)
            .map(|&b| &self.books[b as usize].def)
    }

    pub fn phase(&self, id: InstrumentId) -> Option<Phase> {
        self.book_index
            .get(&id)
            .map(|&b| self.books[b as usize].phase)
    }

    /// Instruments in the order they were added.
    pub fn instruments(&self) -> impl Iterator<Item = &Instrument> {
        self.books.iter().map(|b| &b.def)
    }

    /// Aggregated levels of one side, best first: (price, visible qty, order count), at most
    /// `depth` of them.
    pub fn depth(&self, id: InstrumentId, side: Side, depth: usize) -> Vec<(Price, Qty, u32)> {
        let Some(&b) = self.book_index.get(&id) else {
            return Vec::new();
        };
        self.books[b as usize]
            .side(side)
            .iter()
            .rev()
            .filter(|l| l.orders > 0)
            .take(depth)
            .map(|l| (Price(l.price), Qty(l.qty_display), l.orders))
            .collect()
    }

    /// Every resting order of an instrument in priority order (best price first, then time):
    /// bids then asks. Used to build market data snapshots and by tests.
    pub fn resting_orders(&self, id: InstrumentId) -> Vec<OrderView> {
        let mut v = Vec::new();
        let Some(&b) = self.book_index.get(&id) else {
            return v;
        };
        let book = &self.books[b as usize];
        for side in [Side::Buy, Side::Sell] {
            for level in book.side(side).iter().rev() {
                let mut slot = level.head;
                while slot != NIL {
                    let o = self.pool.get(slot);
                    v.push(self.view(o));
                    slot = o.next;
                }
            }
        }
        v
    }

    /// The first `max` resting orders of an instrument in the order of
    /// [`resting_orders`](Self::resting_orders), and how many rest in all; `None` for an
    /// instrument without a book. For readers of a large book (an operator's query), which
    /// must not copy millions of orders to show the first few.
    pub fn book_orders(&self, id: InstrumentId, max: usize) -> Option<(Vec<OrderView>, u64)> {
        let &b = self.book_index.get(&id)?;
        let book = &self.books[b as usize];
        let mut v = Vec::new();
        let mut total = 0u64;
        for side in [Side::Buy, Side::Sell] {
            for level in book.side(side).iter().rev() {
                total += u64::from(level.orders);
                let mut slot = level.head;
                while slot != NIL && v.len() < max {
                    let o = self.pool.get(slot);
                    v.push(self.view(o));
                    slot = o.next;
                }
            }
        }
        Some((v, total))
    }

    /// A live order by exchange id.
    pub fn order(&self, id: OrderId) -> Option<OrderView> {
        self.order_index
            .get(&id)
            .map(|&s| self.view(self.pool.get(s)))
    }

    /// An account's balances.
    pub fn account(&self, id: AccountId) -> Option<AccountView> {
        self.account_index.get(&id).map(|&a| {
            let acc = &self.accounts[a as usize];
            AccountView {
                account: acc.id,
                firm: acc.firm,
                cash: Cash(acc.cash),
                cash_reserved: Cash(acc.reserved_cash),
                margin_locked: Cash(acc.margin_locked),
                cash_free: Cash(acc.free_cash()),
            }
        })
    }

    /// An account's position in an instrument: (net qty, net cost).
    pub fn position(&self, account: AccountId, instrument: InstrumentId) -> Option<(Qty, Cash)> {
        let a = *self.account_index.get(&account)?;
        let b = *self.book_index.get(&instrument)?;
        let p = self.accounts[a as usize].position(b)?;
        Some((Qty(p.qty), Cash(p.cost())))
    }

    /// One account's positions as (instrument, net qty, net cost), in instrument order of
    /// addition; empty for an unknown account.
    pub fn account_positions(&self, account: AccountId) -> Vec<(InstrumentId, Qty, Cash)> {
        let Some(&a) = self.account_index.get(&account) else {
            return Vec::new();
        };
        self.accounts[a as usize]
            .positions
            .iter()
            .map(|p| {
                let instrument = self.books[p.book as usize].def.instrument;
                (instrument, Qty(p.qty), Cash(p.cost()))
            })
            .collect()
    }

    /// Up to `max` live orders of one account, walking the books in their fixed order (best
    /// price first, bids then asks). O(live orders): for operators' queries, not the hot path.
    pub fn account_orders(&self, account: AccountId, max: usize) -> Vec<OrderView> {
        let mut v = Vec::new();
        let Some(&a) = self.account_index.get(&account) else {
            return v;
        };
        for book in &self.books {
            for side in [Side::Buy, Side::Sell] {
                for level in book.side(side).iter().rev() {
                    let mut slot = level.head;
                    while slot != NIL {
                        let o = self.pool.get(slot);
                        if o.account == a {
                            if v.len() == max {
                                return v;
                            }
                            v.push(self.view(o));
                        }
                        slot = o.next;
                    }
                }
            }
        }
        v
    }

    /// Every (account, instrument, qty, cost) position, in account then instrument order.
    pub fn positions(&self) -> impl Iterator<Item = (AccountId, InstrumentId, Qty, Cash)> + '_ {
        self.accounts.iter().flat_map(move |a| {
            a.positions.iter().map(move |p| {
                (
                    a.id,
                    self.books[p.book as usize].def.instrument,
                    Qty(p.qty),
                    Cash(p.cost()),
                )
            })
        })
    }

    fn view(&self, o: &Order) -> OrderView {
        OrderView {
            order_id: o.id,
            cl_ord_id: o.cl_ord_id,
            account: self.accounts[o.account as usize].id,
            instrument: self.books[o.book as usize].def.instrument,
            side: o.side,
            price: Price(o.price),
            qty_total: Qty(o.qty_total),
            qty_filled: Qty(o.qty_filled),
            qty_leaves: Qty(o.qty_leaves),
            qty_display: Qty(o.qty_display),
            tif: o.tif,
            rec: o.rec,
            market: o.market,
        }
    }

    // ----- new orders -----

    fn new_order(&mut self, o: &NewOrder, ts: u64, out: &mut Vec<Event>) {
        match self.admit_new(o, ts) {
            Err(reason) => {
                self.counters.orders_rejected += 1;
                out.push(Event::OrderRejected {
                    account: o.account,
                    cl_ord_id: o.cl_ord_id,
                    instrument: o.instrument,
                    reason,
                    ts_ns: ts,
                });
            }
            Ok(slot) => {
                self.counters.orders_accepted += 1;
                let order = *self.pool.get(slot);
                out.push(Event::OrderAccepted {
                    order_id: order.id,
                    account: o.account,
                    cl_ord_id: o.cl_ord_id,
                    instrument: o.instrument,
                    side: o.side,
                    price: Price(order.price),
                    qty: o.qty,
                    ts_ns: ts,
                });
                if self.books[order.book as usize].phase != Phase::Open {
                    // A call auction (admission lets no other phase through): the order rests.
                    self.rest_in_call(slot, true, ts, out);
                    return;
                }
                let end = if o.tif == TimeInForce::Fok && !self.fok_fillable(slot) {
                    None
                } else {
                    Some(self.match_incoming(slot, ts, out))
                };
                let is_market = o.ord_type == OrdType::Market;
                self.finish_incoming(slot, end, is_market, true, ts, out);
            }
        }
    }

    /// Validates a new order and, if it passes, registers it with its reservations.
    fn admit_new(&mut self, o: &NewOrder, ts: u64) -> Result<u32, RejectReason> {
        let &book_idx = self
            .book_index
            .get(&o.instrument)
            .ok_or(RejectReason::UnknownInstrument)?;
        let &acct_idx = self
            .account_index
            .get(&o.account)
            .ok_or(RejectReason::UnknownAccount)?;
        if o.firm
            .is_some_and(|f| f != self.accounts[acct_idx as usize].firm)
        {
            return Err(RejectReason::AccountNotOfFirm);
        }
        self.check_not_suspended(acct_idx)?;
        let book = &self.books[book_idx as usize];
        phase_admits(book.phase)?;
        let in_call = book.phase != Phase::Open;
        if in_call || o.tif.is_auction_only() {
            auction::tif_admits(book.phase, o.tif)?;
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
                // A market order is a limit order at the band edge: it can never trade
                // outside the band, and its reservation is bounded.
                match o.side {
                    Side::Buy => book.band_high,
                    Side::Sell => book.band_low,
                }
            }
            OrdType::Limit => {
                check_price(book, o.price.0)?;
                o.price.0
            }
        };
        match o.tif {
            TimeInForce::Gtd => {
                if o.expire_ts_ns == 0 {
                    return Err(RejectReason::ExpireTimeMissing);
                }
                if o.expire_ts_ns <= ts {
                    return Err(RejectReason::ExpireTimeInPast);
                }
            }
            _ => {
                if o.expire_ts_ns != 0 {
                    return Err(RejectReason::ExpireTimeUnexpected);
                }
            }
        }
        let display_size = o.display_qty.0;
        if display_size != 0
            && (display_size < 0
                || display_size > o.qty.0
                || (display_size as i128) * (ICEBERG_PARTS_MAX as i128) < o.qty.0 as i128
                || o.ord_type == OrdType::Market
                || matches!(o.tif, TimeInForce::Ioc | TimeInForce::Fok))
        {
            return Err(RejectReason::DisplayQtyInvalid);
        }
        if self.clord_index.contains_key(&(acct_idx, o.cl_ord_id)) {
            return Err(RejectReason::DuplicateClOrdId);
        }
        if self.pool.is_full() {
            return Err(RejectReason::CapacityExceeded);
        }

        // Pre-trade risk: position limit, covered sells, collateral.
        let account = &self.accounts[acct_idx as usize];
        let pos = account.position(book_idx).copied().unwrap_or_default();
        let qty = o.qty.0;
        if self.margin_call_open(account.id) && !risk::reduces_exposure(&pos, o.side, qty, 0) {
            return Err(RejectReason::MarginCallOpen);
        }
        let holding = risk::admit(
            &book.def,
            account,
            &pos,
            o.side,
            limit,
            qty,
            Holding::default(),
        )?;
        let (reserved_cash, reserved_pos) = (holding.reserved_cash, holding.reserved_pos);

        // Admitted: register the order and its reservations.
        let order = Order {
            id: OrderId(self.next_order_id),
            cl_ord_id: o.cl_ord_id,
            account: acct_idx,
            book: book_idx,
            side: o.side,
            // A market order does not rest in continuous trading: Day reads as IOC there. In a
            // call auction it rests until the uncrossing.
            tif: if o.ord_type == OrdType::Market && o.tif == TimeInForce::Day && !in_call {
                TimeInForce::Ioc
            } else {
                o.tif
            },
            price: limit,
            qty_total: qty,
            qty_filled: 0,
            qty_leaves: qty,
            display_size,
            qty_display: if display_size > 0 { display_size } else { qty },
            expire_ts_ns: o.expire_ts_ns,
            rec: self.next_rec,
            reserved_cash,
            reserved_pos,
            prev: NIL,
            next: NIL,
            resting: false,
            market: in_call && o.ord_type == OrdType::Market,
        };
        self.next_order_id += 1;
        self.next_rec += 1;
        let slot = self.pool.insert(order);
        self.order_index.insert(order.id, slot);
        self.clord_index.insert((acct_idx, o.cl_ord_id), slot);
        self.move_holdings(acct_idx, book_idx, o.side, reserved_cash, reserved_pos, qty);
        Ok(slot)
    }

    /// Can the FOK order in `slot` be filled in full right now? Walks the opposite side in
    /// priority order as matching would, honouring self-trade prevention.
    fn fok_fillable(&self, slot: u32) -> bool {
        let o = self.pool.get(slot);
        let book = &self.books[o.book as usize];
        let incoming_acct = &self.accounts[o.account as usize];
        let mut needed = o.qty_leaves;
        // A trade outside the volatility guard's bands would interrupt instead.
        let (vi_low, vi_high) = auction::guard_bounds(book);
        for level in book.side(o.side.opposite()).iter().rev() {
            if !crosses(o.side, o.price, level.price)
                || level.price < vi_low
                || level.price > vi_high
            {
                break;
            }
            if incoming_acct.stp == StpMode::None {
                needed -= level.qty_leaves;
                if needed <= 0 {
                    return true;
                }
                continue;
            }
            // With CancelIncoming or CancelBoth the first self order in a level ends matching.
            // An iceberg ahead of it trades only its visible part there: its refill goes to the
            // back of the level, behind the self order. So orders ahead of a self order count
            // with their visible quantity, and all of them only if no self order follows.
            let blocking = incoming_acct.stp != StpMode::CancelResting;
            let (mut visible, mut leaves) = (0i64, 0i64);
            let mut s = level.head;
            while s != NIL {
                let r = self.pool.get(s);
                if is_self_trade(incoming_acct, &self.accounts[r.account as usize]) {
                    if blocking {
                        return needed <= visible;
                    }
                } else {
                    visible += r.qty_display;
                    leaves += r.qty_leaves;
                }
                s = r.next;
            }
            needed -= leaves;
            if needed <= 0 {
                return true;
            }
        }
        false
    }

    /// Matches the (not resting) order in `slot` against the opposite side.
    fn match_incoming(&mut self, slot: u32, ts: u64, out: &mut Vec<Event>) -> MatchEnd {
        let (book_idx, side, limit, acct_idx) = {
            let o = self.pool.get(slot);
            debug_assert!(!o.resting);
            (o.book, o.side, o.price, o.account)
        };
        let opposite = side.opposite();
        // The volatility guard's bounds, fixed as the order arrives (no bounds: the widest).
        let (vi_low, vi_high) = auction::guard_bounds(&self.books[book_idx as usize]);
        loop {
            let leaves = self.pool.get(slot).qty_leaves;
            if leaves == 0 {
                return MatchEnd::Done;
            }
            let book = &self.books[book_idx as usize];
            let levels = book.side(opposite);
            let Some(level) = levels.last() else {
                return MatchEnd::Done;
            };
            if !crosses(side, limit, level.price) {
                return MatchEnd::Done;
            }
            let level_index = levels.len() - 1;
            let level_price = level.price;
            if level_price < vi_low || level_price > vi_high {
                return MatchEnd::Interrupted(level_price);
            }
            let resting = level.head;
            debug_assert!(resting != NIL);
            let resting_acct = self.pool.get(resting).account;
            let incoming_account = &self.accounts[acct_idx as usize];
            if is_self_trade(incoming_account, &self.accounts[resting_acct as usize]) {
                match incoming_account.stp {
                    StpMode::CancelResting => {
                        self.cancel_order(resting, CancelReason::SelfTradePrevention, ts, out);
                        continue;
                    }
                    StpMode::CancelIncoming => return MatchEnd::StpCancelIncoming,
                    StpMode::CancelBoth => {
                        self.cancel_order(resting, CancelReason::SelfTradePrevention, ts, out);
                        return MatchEnd::StpCancelIncoming;
                    }
                    StpMode::None => unreachable!("is_self_trade is false without STP"),
                }
            }
            let qty = leaves.min(self.pool.get(resting).qty_display);
            debug_assert!(qty > 0);
            self.execute(slot, resting, level_index, level_price, qty, ts, out);
        }
    }

    /// One trade of `qty` lots at `price` between the incoming order and the resting order at
    /// the head of level `level_index` of the opposite side.
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &mut self,
        incoming: u32,
        resting: u32,
        level_index: usize,
        price: i64,
        qty: i64,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        let book_idx = self.pool.get(incoming).book;
        // Fill both orders and the level's totals.
        {
            let r = self.pool.get_mut(resting);
            r.qty_filled += qty;
            r.qty_leaves -= qty;
            r.qty_display -= qty;
            debug_assert!(r.qty_display >= 0 && r.qty_leaves >= 0);
            let side = r.side;
            let level = &mut self.books[book_idx as usize].side_mut(side)[level_index];
            level.qty_leaves -= qty;
            level.qty_display -= qty;
        }
        {
            let i = self.pool.get_mut(incoming);
            i.qty_filled += qty;
            i.qty_leaves -= qty;
            i.qty_display = i.display_for(i.qty_leaves);
        }
        self.settle(incoming, price, qty);
        self.settle(resting, price, qty);

        let trade_id = TradeId(self.next_trade_id);
        self.next_trade_id += 1;
        self.counters.trades += 1;
        self.counters.volume_lots += qty as u128;
        if self.books[book_idx as usize].def.reference_price.0 != price {
            self.books[book_idx as usize].set_reference(price);
            self.digest_book(book_idx);
        }
        let book = &self.books[book_idx as usize];
        let fill = |o: &Order| Fill {
            order_id: o.id,
            account: self.accounts[o.account as usize].id,
            cl_ord_id: o.cl_ord_id,
            qty_leaves: Qty(o.qty_leaves),
            qty_filled: Qty(o.qty_filled),
        };
        let (i, r) = (self.pool.get(incoming), self.pool.get(resting));
        let aggressor = i.side;
        let (r_leaves, r_display) = (r.qty_leaves, r.qty_display);
        let (buy, sell) = match aggressor {
            Side::Buy => (fill(i), fill(r)),
            Side::Sell => (fill(r), fill(i)),
        };
        out.push(Event::Trade {
            trade_id,
            instrument: book.def.instrument,
            price: Price(price),
            qty: Qty(qty),
            aggressor,
            buy,
            sell,
            auction: false,
            ts_ns: ts,
        });

        // The resting order leaves, refills its iceberg, or stays with less.
        if r_leaves == 0 {
            self.books[book_idx as usize].unlink(&mut self.pool, resting, Some(level_index));
            self.order_log(
                resting,
                OrderLogAction::Delete,
                OrderStatus::Filled,
                ts,
                out,
            );
            self.forget(resting);
        } else if r_display == 0 {
            // An iceberg shows its next part and goes to the back of the queue.
            let book = &mut self.books[book_idx as usize];
            book.unlink(&mut self.pool, resting, Some(level_index));
            let o = self.pool.get_mut(resting);
            o.qty_display = o.display_for(o.qty_leaves);
            book.push_back(&mut self.pool, resting);
            self.order_log(
                resting,
                OrderLogAction::Change,
                OrderStatus::PartiallyFilled,
                ts,
                out,
            );
        } else {
            self.pool.rehash(resting);
            self.order_log(
                resting,
                OrderLogAction::Change,
                OrderStatus::PartiallyFilled,
                ts,
                out,
            );
        }
    }

    /// Moves cash, positions and reservations for one side of a trade.
    fn settle(&mut self, slot: u32, price: i64, qty: i64) {
        let o = self.pool.get(slot);
        let (account_idx, book_idx, side, limit, leaves, reserved_cash, reserved_pos) = (
            o.account,
            o.book,
            o.side,
            o.price,
            o.qty_leaves,
            o.reserved_cash,
            o.reserved_pos,
        );
        let def = &self.books[book_idx as usize].def;
        let value = def
            .notional_floor(Price(price), Qty(qty))
            .expect("notional of an admitted order fits");
        let from_pos = match side {
            Side::Sell => reserved_pos.min(qty),
            Side::Buy => 0,
        };
        let new_reserved_pos = reserved_pos - from_pos;
        let new_reserved_cash = cash_required(def, side, limit, leaves, new_reserved_pos)
            .expect("reservation of an admitted order fits");
        let market = def.market;
        let margin_per_lot = def.initial_margin.0;
        let account = &mut self.accounts[account_idx as usize];
        let reserved_delta = new_reserved_cash - reserved_cash;
        account.reserved_cash += reserved_delta;
        let (pos, created) = account.position_entry(book_idx);
        let margin_before = futures_margin(margin_per_lot, pos);
        let (d_qty, d_cost, d_buy, d_sell) = match side {
            Side::Buy => (qty, value, -qty, 0),
            Side::Sell => (-qty, -value, 0, -qty),
        };
        pos.qty += d_qty;
        pos.add_cost(d_cost);
        pos.buy_open += d_buy;
        pos.sell_open += d_sell;
        pos.sell_reserved -= from_pos;
        let (d_cash, d_margin) = match market {
            // Equities and FX pay for what they buy; futures lock margin instead.
            Market::Equity | Market::Fx => (-d_cost, 0),
            Market::Futures => {
                let after = futures_margin(margin_per_lot, pos);
                debug_assert!(after <= margin_before, "a fill raised futures margin");
                (0, after - margin_before)
            }
        };
        account.cash += d_cash;
        account.margin_locked += d_margin;
        debug_assert!(account.free_cash() >= 0, "a fill made free cash negative");
        self.digest_account_moved(account_idx, d_cash, reserved_delta, d_margin);
        self.digest_position_moved(
            account_idx,
            book_idx,
            created,
            digest::PositionChange {
                qty: d_qty,
                cost: d_cost,
                sell_reserved: -from_pos,
                buy_open: d_buy,
                sell_open: d_sell,
            },
        );
        let o = self.pool.get_mut(slot);
        o.reserved_cash = new_reserved_cash;
        o.reserved_pos = new_reserved_pos;
    }

    /// Decides the fate of an order after matching: rest it, or take it away.
    /// `end` is None for a FOK order that could not be filled.
    fn finish_incoming(
        &mut self,
        slot: u32,
        end: Option<MatchEnd>,
        is_market: bool,
        is_new: bool,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        // Read the few fields needed rather than copying the whole order (this is the path
        // of every new order and every moved order).
        let (leaves, filled, tif, book) = {
            let o = self.pool.get(slot);
            (o.qty_leaves, o.qty_filled, o.tif, o.book)
        };
        if leaves == 0 {
            self.order_log(slot, OrderLogAction::Delete, OrderStatus::Filled, ts, out);
            self.forget(slot);
            return;
        }
        if let Some(MatchEnd::Interrupted(price)) = end {
            self.start_volatility_auction(book, price, ts, out);
        }
        let reason = match end {
            None => Some(CancelReason::FillOrKillUnfilled),
            Some(MatchEnd::StpCancelIncoming) => Some(CancelReason::SelfTradePrevention),
            Some(MatchEnd::Done | MatchEnd::Interrupted(_)) if is_market => {
                Some(CancelReason::MarketRemainder)
            }
            Some(MatchEnd::Done | MatchEnd::Interrupted(_)) => match tif {
                TimeInForce::Ioc => Some(CancelReason::ImmediateOrCancelRemainder),
                TimeInForce::Fok => Some(CancelReason::FillOrKillUnfilled),
                _ => None,
            },
        };
        match reason {
            Some(reason) => self.cancel_order(slot, reason, ts, out),
            None => {
                self.books[book as usize].push_back(&mut self.pool, slot);
                let status = if filled > 0 {
                    OrderStatus::PartiallyFilled
                } else if is_new {
                    OrderStatus::New
                } else {
                    OrderStatus::Replaced
                };
                let action = if is_new {
                    OrderLogAction::New
                } else {
                    OrderLogAction::Change
                };
                self.order_log(slot, action, status, ts, out);
            }
        }
        if matches!(end, Some(MatchEnd::Interrupted(_))) {
            self.publish_indicative(book, ts, out);
        }
    }

    /// Takes a live order away (cancel of any kind), releasing its reservations.
    fn cancel_order(&mut self, slot: u32, reason: CancelReason, ts: u64, out: &mut Vec<Event>) {
        let o = *self.pool.get(slot);
        if o.resting {
            self.books[o.book as usize].unlink(&mut self.pool, slot, None);
        }
        self.counters.cancels += 1;
        out.push(Event::OrderCancelled {
            order_id: o.id,
            account: self.accounts[o.account as usize].id,
            cl_ord_id: o.cl_ord_id,
            instrument: self.books[o.book as usize].def.instrument,
            side: o.side,
            qty_cancelled: Qty(o.qty_leaves),
            reason,
            ts_ns: ts,
        });
        self.release(slot);
        self.order_log(
            slot,
            OrderLogAction::Delete,
            OrderStatus::Cancelled,
            ts,
            out,
        );
        self.forget(slot);
    }

    /// Returns an order's reservations and open quantity to its account; leaves it empty.
    fn release(&mut self, slot: u32) {
        let (account, book, side, leaves, reserved_cash, reserved_pos) = {
            let o = self.pool.get(slot);
            (
                o.account,
                o.book,
                o.side,
                o.qty_leaves,
                o.reserved_cash,
                o.reserved_pos,
            )
        };
        self.move_holdings(account, book, side, -reserved_cash, -reserved_pos, -leaves);
        let o = self.pool.get_mut(slot);
        o.reserved_cash = 0;
        o.reserved_pos = 0;
        o.qty_leaves = 0;
        o.qty_display = 0;
    }

    /// Moves what an order holds in its account: reserved cash by `d_cash`, the lots its
    /// sells hold back by `d_pos`, the position's open quantity on `side` by `d_open`. Keeps
    /// the futures margin and the state digest in step.
    #[inline]
    fn move_holdings(
        &mut self,
        acct: u32,
        book: u32,
        side: Side,
        d_cash: i128,
        d_pos: i64,
        d_open: i64,
    ) {
        let def = &self.books[book as usize].def;
        let futures = def.market == Market::Futures;
        let im = def.initial_margin.0;
        let account = &mut self.accounts[acct as usize];
        account.reserved_cash += d_cash;
        let (p, created) = account.position_entry(book);
        let (d_buy, d_sell) = match side {
            Side::Buy => (d_open, 0),
            Side::Sell => (0, d_open),
        };
        let margin_before = if futures { futures_margin(im, p) } else { 0 };
        p.sell_reserved += d_pos;
        p.buy_open += d_buy;
        p.sell_open += d_sell;
        let d_margin = if futures {
            futures_margin(im, p) - margin_before
        } else {
            0
        };
        account.margin_locked += d_margin;
        self.digest_account_moved(acct, 0, d_cash, d_margin);
        if created || d_pos != 0 || d_open != 0 {
            self.digest_position_moved(
                acct,
                book,
                created,
                digest::PositionChange {
                    sell_reserved: d_pos,
                    buy_open: d_buy,
                    sell_open: d_sell,
                    ..Default::default()
                },
            );
        }
    }

    /// Drops a finished order (not resting, nothing reserved) from the indexes and the pool.
    fn forget(&mut self, slot: u32) {
        let (id, account, cl_ord_id) = {
            let o = self.pool.get(slot);
            debug_assert!(!o.resting && o.qty_leaves == 0 && o.reserved_cash == 0);
            (o.id, o.account, o.cl_ord_id)
        };
        self.order_index.remove(&id);
        self.clord_index.remove(&(account, cl_ord_id));
        self.pool.remove(slot);
    }

    /// Writes the order-log record of the order's current state, with the next `seq`.
    fn order_log(
        &mut self,
        slot: u32,
        action: OrderLogAction,
        status: OrderStatus,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        let o = self.pool.get(slot);
        let account = &self.accounts[o.account as usize];
        let seq = self.next_seq;
        self.next_seq += 1;
        let gone = action == OrderLogAction::Delete;
        out.push(Event::OrderLog(OrderLog {
            rec: o.rec,
            seq,
            action,
            status,
            order_id: o.id,
            instrument: self.books[o.book as usize].def.instrument,
            account: account.id,
            firm: account.firm,
            cl_ord_id: o.cl_ord_id,
            side: o.side,
            price: Price(o.price),
            qty_display: Qty(if gone { 0 } else { o.qty_display }),
            qty_leaves: Qty(if gone { 0 } else { o.qty_leaves }),
            qty_filled: Qty(o.qty_filled),
            qty_total: Qty(o.qty_total),
            ts_ns: ts,
        }));
    }

    // ----- cancel and replace -----

    /// Finds a live order of `account` by exchange or client id.
    fn lookup(&self, account: AccountId, target: &OrderRef) -> Result<u32, RejectReason> {
        let &acct_idx = self
            .account_index
            .get(&account)
            .ok_or(RejectReason::UnknownAccount)?;
        match (target.order_id, target.orig_cl_ord_id) {
            (Some(id), None) => {
                let &slot = self
                    .order_index
                    .get(&id)
                    .ok_or(RejectReason::UnknownOrder)?;
                if self.pool.get(slot).account != acct_idx {
                    // Another account's order is reported as unknown: its existence is not
                    // this account's business.
                    return Err(RejectReason::UnknownOrder);
                }
                Ok(slot)
            }
            (None, Some(cl)) => self
                .clord_index
                .get(&(acct_idx, cl))
                .copied()
                .ok_or(RejectReason::UnknownOrder),
            _ => Err(RejectReason::OrderRefInvalid),
        }
    }

    fn cancel(&mut self, c: &Cancel, ts: u64, out: &mut Vec<Event>) {
        match self.lookup(c.account, &c.target) {
            Ok(slot) => {
                let book = self.pool.get(slot).book;
                self.cancel_order(slot, CancelReason::Requested, ts, out);
                if self.books[book as usize].phase.is_auction() {
                    self.publish_indicative(book, ts, out);
                }
            }
            Err(reason) => out.push(Event::CancelRejected {
                account: c.account,
                cl_ord_id: c.cl_ord_id,
                order_id: c.target.order_id,
                response_to: CancelRejectTo::Cancel,
                reason,
                ts_ns: ts,
            }),
        }
    }

    fn replace(&mut self, r: &Replace, ts: u64, out: &mut Vec<Event>) {
        if let Err(reason) = self.try_replace(r, ts, out) {
            out.push(Event::CancelRejected {
                account: r.account,
                cl_ord_id: r.cl_ord_id,
                order_id: r.target.order_id,
                response_to: CancelRejectTo::Replace,
                reason,
                ts_ns: ts,
            });
        }
    }

    fn try_replace(
        &mut self,
        r: &Replace,
        ts: u64,
        out: &mut Vec<Event>,
    ) -> Result<(), RejectReason> {
        let slot = self.lookup(r.account, &r.target)?;
        let o = *self.pool.get(slot);
        self.check_not_suspended(o.account)?;
        let book = &self.books[o.book as usize];
        phase_admits(book.phase)?;
        let new_price = r.price.map_or(o.price, |p| p.0);
        let new_total = r.qty.map_or(o.qty_total, |q| q.0);
        if new_price == o.price && new_total == o.qty_total {
            return Err(RejectReason::ReplaceNoChange);
        }
        if new_price != o.price {
            check_price(book, new_price)?;
        }
        if new_total <= 0 {
            return Err(RejectReason::QtyNotPositive);
        }
        if new_total > QTY_MAX {
            return Err(RejectReason::QtyTooLarge);
        }
        if new_total <= o.qty_filled {
            return Err(RejectReason::ReplaceQtyNotAboveFilled);
        }
        if o.display_size > 0
            && (o.display_size as i128) * (ICEBERG_PARTS_MAX as i128) < new_total as i128
        {
            return Err(RejectReason::DisplayQtyInvalid);
        }
        if r.cl_ord_id != o.cl_ord_id && self.clord_index.contains_key(&(o.account, r.cl_ord_id)) {
            return Err(RejectReason::DuplicateClOrdId);
        }
        let new_leaves = new_total - o.qty_filled;
        let account = &self.accounts[o.account as usize];
        let pos = account.position(o.book).copied().unwrap_or_default();
        // Under a margin call a replace passes if the order only shrinks in place, or if it
        // reduces the exposure after the change.
        if self.margin_call_open(account.id)
            && !(new_price == o.price && new_leaves <= o.qty_leaves)
            && !risk::reduces_exposure(&pos, o.side, new_leaves, o.qty_leaves)
        {
            return Err(RejectReason::MarginCallOpen);
        }
        let old = Holding {
            reserved_cash: o.reserved_cash,
            reserved_pos: o.reserved_pos,
            leaves: o.qty_leaves,
        };
        let holding = risk::admit(&book.def, account, &pos, o.side, new_price, new_leaves, old)?;
        let (new_reserved_cash, new_reserved_pos) = (holding.reserved_cash, holding.reserved_pos);
        let open_delta = new_leaves - o.qty_leaves;

        // Admitted. Move the reservations, then the order.
        let acct_idx = o.account;
        let book_idx = o.book;
        self.move_holdings(
            acct_idx,
            book_idx,
            o.side,
            new_reserved_cash - o.reserved_cash,
            new_reserved_pos - o.reserved_pos,
            open_delta,
        );
        if r.cl_ord_id != o.cl_ord_id {
            self.clord_index.remove(&(acct_idx, o.cl_ord_id));
            self.clord_index.insert((acct_idx, r.cl_ord_id), slot);
        }
        self.counters.replaces += 1;
        let priority_kept = new_price == o.price && new_leaves <= o.qty_leaves;
        let new_display = {
            let x = self.pool.get(slot);
            if x.display_size > 0 {
                // Keep what is shown unless the order no longer has that much.
                x.qty_display.min(new_leaves)
            } else {
                new_leaves
            }
        };
        if priority_kept {
            let book = &mut self.books[book_idx as usize];
            let levels = book.side_mut(o.side);
            let li = levels
                .find(o.side, o.price)
                .expect("resting order without level");
            levels[li].qty_leaves += new_leaves - o.qty_leaves;
            levels[li].qty_display += new_display - o.qty_display;
        } else {
            self.books[book_idx as usize].unlink(&mut self.pool, slot, None);
        }
        {
            let x = self.pool.get_mut(slot);
            x.cl_ord_id = r.cl_ord_id;
            x.price = new_price;
            x.qty_total = new_total;
            x.qty_leaves = new_leaves;
            x.qty_display = if priority_kept {
                new_display
            } else {
                x.display_for(new_leaves)
            };
            x.reserved_cash = new_reserved_cash;
            x.reserved_pos = new_reserved_pos;
            // A market order given a price is a limit order from then on.
            x.market &= new_price == o.price;
        }
        if priority_kept {
            // Still resting, changed in place (an order that lost priority is out of its
            // level and is hashed again when it rests).
            self.pool.rehash(slot);
        }
        out.push(Event::OrderReplaced {
            order_id: o.id,
            account: r.account,
            cl_ord_id: r.cl_ord_id,
            orig_cl_ord_id: o.cl_ord_id,
            instrument: def_id(&self.books[book_idx as usize]),
            price: Price(new_price),
            qty_total: Qty(new_total),
            qty_leaves: Qty(new_leaves),
            priority_kept,
            ts_ns: ts,
        });
        if priority_kept {
            let status = if o.qty_filled > 0 {
                OrderStatus::PartiallyFilled
            } else {
                OrderStatus::Replaced
            };
            self.order_log(slot, OrderLogAction::Change, status, ts, out);
            if self.books[book_idx as usize].phase != Phase::Open {
                self.publish_indicative(book_idx, ts, out);
            }
        } else if self.books[book_idx as usize].phase != Phase::Open {
            // In a call auction nothing matches: the order rests at its new place.
            self.rest_in_call(slot, false, ts, out);
        } else {
            // A new price may cross: the order trades as an aggressor, then rests.
            let end = self.match_incoming(slot, ts, out);
            self.finish_incoming(slot, Some(end), false, false, ts, out);
        }
        Ok(())
    }

    // ----- sweeps -----

    /// Collects into `scratch` the slots of resting orders that `keep` selects, walking
    /// books, sides, levels and queues in their fixed order.
    fn collect(
        &mut self,
        book_filter: Option<u32>,
        side: Option<Side>,
        keep: impl Fn(&Order, &[Account]) -> bool,
    ) {
        self.scratch.clear();
        for (b, book) in self.books.iter().enumerate() {
            if book_filter.is_some_and(|f| f != b as u32) {
                continue;
            }
            for s in [Side::Buy, Side::Sell] {
                if side.is_some_and(|f| f != s) {
                    continue;
                }
                for level in book.side(s).iter().rev() {
                    let mut slot = level.head;
                    while slot != NIL {
                        let o = self.pool.get(slot);
                        if keep(o, &self.accounts) {
                            self.scratch.push(slot);
                        }
                        slot = o.next;
                    }
                }
            }
        }
    }

    fn mass_cancel(&mut self, m: &MassCancel, ts: u64, out: &mut Vec<Event>) {
        if m.account.is_none() && m.firm.is_none() && m.instrument.is_none() && m.side.is_none() {
            out.push(Event::CommandRejected {
                reason: RejectReason::MassCancelUnfiltered,
                ts_ns: ts,
            });
            return;
        }
        let acct_filter = match m.account {
            None => None,
            Some(a) => match self.account_index.get(&a) {
                Some(&i) => Some(i),
                None => {
                    out.push(Event::CommandRejected {
                        reason: RejectReason::UnknownAccount,
                        ts_ns: ts,
                    });
                    return;
                }
            },
        };
        let book_filter = match m.instrument {
            None => None,
            Some(i) => match self.book_index.get(&i) {
                Some(&b) => Some(b),
                None => {
                    out.push(Event::CommandRejected {
                        reason: RejectReason::UnknownInstrument,
                        ts_ns: ts,
                    });
                    return;
                }
            },
        };
        let firm = m.firm;
        self.collect(book_filter, m.side, |o, accounts| {
            acct_filter.is_none_or(|a| a == o.account)
                && firm.is_none_or(|f| f == accounts[o.account as usize].firm)
        });
        let slots = std::mem::take(&mut self.scratch);
        for &slot in &slots {
            self.cancel_order(slot, CancelReason::MassCancel, ts, out);
        }
        self.scratch = slots;
        self.publish_all_indicative(ts, out);
        out.push(Event::MassCancelDone {
            cl_ord_id: m.cl_ord_id,
            orders_cancelled: self.scratch.len() as u64,
            ts_ns: ts,
        });
    }

    fn end_of_day(&mut self, ts: u64, out: &mut Vec<Event>) {
        self.collect(None, None, |o, _| {
            expires_at_end_of_day(o.tif, o.expire_ts_ns, ts)
        });
        let slots = std::mem::take(&mut self.scratch);
        for &slot in &slots {
            let o = *self.pool.get(slot);
            self.books[o.book as usize].unlink(&mut self.pool, slot, None);
            self.counters.expiries += 1;
            out.push(Event::OrderExpired {
                order_id: o.id,
                account: self.accounts[o.account as usize].id,
                cl_ord_id: o.cl_ord_id,
                instrument: self.books[o.book as usize].def.instrument,
                qty_expired: Qty(o.qty_leaves),
                ts_ns: ts,
            });
            self.release(slot);
            self.order_log(slot, OrderLogAction::Delete, OrderStatus::Expired, ts, out);
            self.forget(slot);
        }
        self.scratch = slots;
        self.publish_all_indicative(ts, out);
        out.push(Event::EndOfDayDone {
            orders_expired: self.scratch.len() as u64,
            ts_ns: ts,
        });
    }

    // ----- administration -----

    /// Refuses a new order or replace of an account whose kill switch, or whose firm's, is
    /// engaged. Free when no switch is engaged (the common case).
    fn check_not_suspended(&self, acct_idx: u32) -> Result<(), RejectReason> {
        if self.suspended_firms.is_empty() && self.suspended_accounts.is_empty() {
            return Ok(());
        }
        let acc = &self.accounts[acct_idx as usize];
        if self.suspended_accounts.binary_search(&acc.id).is_ok()
            || self.suspended_firms.binary_search(&acc.firm).is_ok()
        {
            return Err(RejectReason::TradingSuspended);
        }
        Ok(())
    }

    /// The firms and accounts whose kill switch is engaged, each sorted.
    pub fn suspended(&self) -> (&[FirmId], &[AccountId]) {
        (&self.suspended_firms, &self.suspended_accounts)
    }

    /// Engages or releases a kill switch. Engaging cancels every resting order of the target
    /// (reason `MassCancel`, in the books' fixed order) and refuses its new orders and
    /// replaces (`TradingSuspended`) until it is released; cancels stay possible. The target
    /// need not be known to this core: a venue engages a firm's switch in every core, and an
    /// account or firm added later is refused as well. Engaging twice or releasing what is
    /// not engaged is accepted and changes nothing but the answer.
    fn kill_switch(
        &mut self,
        firm: Option<FirmId>,
        account: Option<AccountId>,
        engaged: bool,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        if firm.is_some() == account.is_some() {
            out.push(Event::CommandRejected {
                reason: RejectReason::KillSwitchTargetInvalid,
                ts_ns: ts,
            });
            return;
        }
        let mut orders_cancelled = 0;
        if let Some(f) = firm {
            set_member(&mut self.suspended_firms, f, engaged);
        }
        if let Some(a) = account {
            set_member(&mut self.suspended_accounts, a, engaged);
        }
        if engaged {
            let acct_filter = account.and_then(|a| self.account_index.get(&a).copied());
            if firm.is_some() || acct_filter.is_some() {
                self.collect(None, None, |o, accounts| match (firm, acct_filter) {
                    (Some(f), _) => accounts[o.account as usize].firm == f,
                    (None, Some(a)) => o.account == a,
                    (None, None) => false,
                });
                let slots = std::mem::take(&mut self.scratch);
                for &slot in &slots {
                    self.cancel_order(slot, CancelReason::MassCancel, ts, out);
                }
                orders_cancelled = slots.len() as u64;
                self.scratch = slots;
                self.publish_all_indicative(ts, out);
            }
        }
        out.push(Event::KillSwitchSet {
            firm,
            account,
            engaged,
            orders_cancelled,
            ts_ns: ts,
        });
    }

    fn set_phase(
        &mut self,
        instrument: Option<InstrumentId>,
        phase: Phase,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        match instrument {
            Some(id) => match self.book_index.get(&id) {
                Some(&b) => self.change_phase(b, phase, ts, out),
                None => out.push(Event::CommandRejected {
                    reason: RejectReason::UnknownInstrument,
                    ts_ns: ts,
                }),
            },
            None => {
                for b in 0..self.books.len() {
                    self.change_phase(b as u32, phase, ts, out);
                }
            }
        }
    }

    fn add_instrument(&mut self, def: &Instrument, ts: u64, out: &mut Vec<Event>) {
        let reject = |reason| Event::CommandRejected { reason, ts_ns: ts };
        // A valid definition always has one for its event (its symbol fits).
        let Some(definition) = def.validate().ok().and_then(|()| def.def()) else {
            out.push(reject(RejectReason::InvalidInstrument));
            return;
        };
        if self.book_index.contains_key(&def.instrument) {
            out.push(reject(RejectReason::DuplicateInstrument));
        } else if self.books.len() >= self.config.instruments_max as usize {
            out.push(reject(RejectReason::CapacityExceeded));
        } else {
            let b = self.books.len() as u32;
            self.book_index.insert(def.instrument, b);
            let mut book = Book::new(def.clone(), self.config.levels_per_side_hint as usize);
            book.auction_digest = digest::auction_digest(&book.auction);
            book.digest_item = digest::book_item(b, &book, book.def_digest, book.auction_digest);
            self.digest_items = self.digest_items.wrapping_add(book.digest_item);
            self.books.push(book);
            out.push(Event::InstrumentAdded {
                instrument: def.instrument,
                definition,
                ts_ns: ts,
            });
        }
    }

    fn add_account(&mut self, spec: &AccountSpec, ts: u64, out: &mut Vec<Event>) {
        let reject = |reason| Event::CommandRejected { reason, ts_ns: ts };
        if self.account_index.contains_key(&spec.account) {
            out.push(reject(RejectReason::DuplicateAccount));
        } else if self.accounts.len() >= self.config.accounts_max as usize {
            out.push(reject(RejectReason::CapacityExceeded));
        } else {
            let a = self.accounts.len() as u32;
            self.account_index.insert(spec.account, a);
            self.accounts.push(Account {
                id: spec.account,
                firm: spec.firm,
                may_short: spec.may_short,
                stp: spec.stp,
                stp_scope: spec.stp_scope,
                cash: 0,
                reserved_cash: 0,
                margin_locked: 0,
                positions: Vec::new(),
                digest_key: 0,
            });
            self.digest_account_added(a);
            out.push(Event::AccountAdded {
                account: spec.account,
                firm: spec.firm,
                ts_ns: ts,
            });
        }
    }

    /// An addition and its deposit as one command: the cash is checked before anything is
    /// added (a negative amount, or one over the deposit limit, refuses the command), and the
    /// deposit follows only an addition that happened (a duplicate account gets nothing).
    fn add_funded_account(
        &mut self,
        spec: &AccountSpec,
        cash: Cash,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        let reject = |reason| Event::CommandRejected { reason, ts_ns: ts };
        if cash.0 < 0 {
            out.push(reject(RejectReason::AmountNotPositive));
            return;
        }
        if cash.0 > CASH_AMOUNT_MAX {
            out.push(reject(RejectReason::Overflow));
            return;
        }
        let before = out.len();
        self.add_account(spec, ts, out);
        let added = matches!(out[before..], [Event::AccountAdded { .. }]);
        if added && cash.0 > 0 {
            self.cash_op(spec.account, CashReason::Deposit, cash, false, ts, out);
        }
    }

    /// A deposit, a withdrawal, a collateral setting, or (`clearing`: a `ClearingDebit`) a
    /// withdrawal a clearing run makes.
    ///
    /// While a margin call is open the account's own withdrawals are refused
    /// (`MarginCallOpen`): a clearing house lets no cash leave an account that owes it
    /// margin. A clearing run's debit is not: the house takes what the account owes whatever
    /// the account owes besides. A clearing debit above the free cash is refused like a
    /// withdrawal, and the unpaid amount is added to the account's margin call, so that the
    /// account can only reduce its exposure until it pays (clearing carries the debt and
    /// collects it at its next run).
    fn cash_op(
        &mut self,
        account: AccountId,
        reason: CashReason,
        amount: Cash,
        clearing: bool,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        let called = self.margin_called(account);
        let result = (|| {
            let &a = self
                .account_index
                .get(&account)
                .ok_or(RejectReason::UnknownAccount)?;
            let acc = &mut self.accounts[a as usize];
            let cash_before = acc.cash;
            let amount = amount.0;
            if amount > CASH_AMOUNT_MAX {
                return Err(RejectReason::Overflow);
            }
            match reason {
                CashReason::Deposit => {
                    if amount <= 0 {
                        return Err(RejectReason::AmountNotPositive);
                    }
                    acc.cash += amount;
                }
                CashReason::Withdraw => {
                    if amount <= 0 {
                        return Err(RejectReason::AmountNotPositive);
                    }
                    if called > 0 && !clearing {
                        return Err(RejectReason::MarginCallOpen);
                    }
                    if amount > acc.free_cash() {
                        return Err(RejectReason::InsufficientFreeCash);
                    }
                    acc.cash -= amount;
                }
                CashReason::SetCollateral => {
                    if amount < 0 {
                        return Err(RejectReason::AmountNotPositive);
                    }
                    if amount < acc.reserved_cash + acc.margin_locked {
                        return Err(RejectReason::CollateralBelowLocked);
                    }
                    acc.cash = amount;
                }
            }
            Ok((a, acc.cash - cash_before, acc.cash, acc.free_cash()))
        })();
        match result {
            Ok((a, moved, cash, free)) => {
                self.digest_account_moved(a, moved, 0, 0);
                out.push(Event::CashChanged {
                    account,
                    reason,
                    amount,
                    cash: Cash(cash),
                    cash_free: Cash(free),
                    ts_ns: ts,
                });
                // A deposit goes towards the account's margin call: what is still called
                // shrinks by it, and the call closes once it is covered.
                if reason == CashReason::Deposit && self.margin_call_open(account) {
                    let called = self.margin_called(account);
                    let left = (called - amount.0).max(0);
                    self.set_margin_call(account, left);
                    out.push(Event::MarginCallSet {
                        account,
                        amount: Cash(left),
                        ts_ns: ts,
                    });
                }
            }
            Err(reason) => {
                out.push(Event::CommandRejected { reason, ts_ns: ts });
                if clearing && reason == RejectReason::InsufficientFreeCash {
                    // Within the cash limit, as every call (the snapshot holds no larger).
                    let left = (called + amount.0).min(CASH_AMOUNT_MAX);
                    self.set_margin_call(account, left);
                    out.push(Event::MarginCallSet {
                        account,
                        amount: Cash(left),
                        ts_ns: ts,
                    });
                }
            }
        }
    }
}

impl Engine {
    /// Whether `account` has a margin call open (cheap when none is: one length test).
    #[inline]
    fn margin_call_open(&self, account: AccountId) -> bool {
        !self.margin_calls.is_empty()
            && self
                .margin_calls
                .binary_search_by_key(&account, |c| c.0)
                .is_ok()
    }

    /// The cash still called from `account` (0: no call open).
    pub fn margin_called(&self, account: AccountId) -> i128 {
        match self.margin_calls.binary_search_by_key(&account, |c| c.0) {
            Ok(i) => self.margin_calls[i].1,
            Err(_) => 0,
        }
    }

    /// The margin calls open, as (account, amount still called), by account.
    pub fn margin_calls(&self) -> &[(AccountId, i128)] {
        &self.margin_calls
    }

    /// Opens, changes or (amount 0) closes the call on `account`.
    fn set_margin_call(&mut self, account: AccountId, amount: i128) {
        match (
            self.margin_calls.binary_search_by_key(&account, |c| c.0),
            amount > 0,
        ) {
            (Ok(i), true) => self.margin_calls[i].1 = amount,
            (Ok(i), false) => {
                self.margin_calls.remove(i);
            }
            (Err(i), true) => self.margin_calls.insert(i, (account, amount)),
            (Err(_), false) => {}
        }
    }

    /// Clearing's margin call (see `CommandBody::MarginCall`): sets what is called from the
    /// account, replacing any call open; 0 closes it. Refused for an unknown account, a
    /// negative amount or one over the cash limit.
    fn margin_call(&mut self, account: AccountId, amount: Cash, ts: u64, out: &mut Vec<Event>) {
        let reason = if !self.account_index.contains_key(&account) {
            Some(RejectReason::UnknownAccount)
        } else if amount.0 < 0 {
            Some(RejectReason::AmountNotPositive)
        } else if amount.0 > CASH_AMOUNT_MAX {
            Some(RejectReason::Overflow)
        } else {
            None
        };
        if let Some(reason) = reason {
            out.push(Event::CommandRejected { reason, ts_ns: ts });
            return;
        }
        self.set_margin_call(account, amount.0);
        out.push(Event::MarginCallSet {
            account,
            amount,
            ts_ns: ts,
        });
    }
}

/// Adds `v` to or removes it from a sorted list without duplicates.
fn set_member<T: Ord + Copy>(list: &mut Vec<T>, v: T, present: bool) {
    match (list.binary_search(&v), present) {
        (Err(at), true) => list.insert(at, v),
        (Ok(at), false) => {
            list.remove(at);
        }
        _ => {}
    }
}

/// Whether an instrument in `phase` takes new orders and replaces; each phase that does not
/// has a reject reason of its own.
fn phase_admits(phase: Phase) -> Result<(), RejectReason> {
    match phase {
        Phase::Open | Phase::OpeningAuction | Phase::ClosingAuction | Phase::VolatilityAuction => {
            Ok(())
        }
        Phase::Halted => Err(RejectReason::InstrumentHalted),
        Phase::Closed => Err(RejectReason::InstrumentClosed),
        Phase::Paused => Err(RejectReason::InstrumentPaused),
    }
}

fn def_id(book: &Book) -> InstrumentId {
    book.def.instrument
}

/// Checks a limit price against the instrument's limits, tick and band.
fn check_price(book: &Book, price: i64) -> Result<(), RejectReason> {
    if price <= 0 {
        return Err(RejectReason::PriceNotPositive);
    }
    if price > PRICE_MAX {
        return Err(RejectReason::PriceTooLarge);
    }
    if price % book.def.tick.0 != 0 {
        return Err(RejectReason::PriceOffTick);
    }
    if price < book.band_low || price > book.band_high {
        return Err(RejectReason::PriceOutsideBand);
    }
    Ok(())
}

/// A read-only copy of a live order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderView {
    pub order_id: OrderId,
    pub cl_ord_id: ClOrdId,
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub side: Side,
    pub price: Price,
    pub qty_total: Qty,
    pub qty_filled: Qty,
    pub qty_leaves: Qty,
    pub qty_display: Qty,
    pub tif: TimeInForce,
    pub rec: u64,
    /// A market order resting in a call auction (`price` is its band edge).
    pub market: bool,
}

/// A read-only copy of an account's balances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccountView {
    pub account: AccountId,
    pub firm: FirmId,
    pub cash: Cash,
    pub cash_reserved: Cash,
    pub margin_locked: Cash,
    pub cash_free: Cash,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn an_order_costs_its_slot_its_bookkeeping_and_its_lookup_entries() {
        // The slot, the digest entry (two u64), the free list's and the sweep buffer's u32s.
        let reserved = std::mem::size_of::<Order>() + 16 + 4 + 4;
        assert!(ORDER_BYTES > reserved, "{ORDER_BYTES} <= {reserved}");
        assert_eq!(ORDER_BYTES, reserved + LOOKUP_BYTES_PER_ORDER);
    }

    #[test]
    fn the_default_limits_fit_in_under_a_gibibyte() {
        let config = EngineConfig::default();
        let total_bytes: u64 = config.preallocations().iter().map(|p| p.bytes()).sum();
        assert!(total_bytes < GIB, "{total_bytes}");
        assert_eq!(config.check_fits(GIB), Ok(()));
    }

    #[test]
    fn orders_max_too_large_for_the_memory_is_refused_with_the_largest_that_fits() {
        let config = EngineConfig {
            orders_max: 4_294_967_294,
            ..EngineConfig::default()
        };
        assert_eq!(config.check(), Ok(()));
        let text = config.check_fits(23 * GIB).unwrap_err();
        assert!(text.starts_with("orders_max 4294967294 needs "), "{text}");
        assert!(text.contains("for the order table"), "{text}");
        assert!(
            text.contains("this machine has 23.0 GiB available"),
            "{text}"
        );
        let ladders_bytes = config.preallocations()[1].bytes();
        let fit = (23 * GIB - ladders_bytes) / ORDER_BYTES as u64;
        assert!(
            text.ends_with(&format!("at most {} fit", capacity::format_count(fit))),
            "{text}"
        );
        let largest = EngineConfig {
            orders_max: fit as u32,
            ..config
        };
        assert_eq!(largest.check_fits(23 * GIB), Ok(()));
        let one_more = EngineConfig {
            orders_max: fit as u32 + 1,
            ..config
        };
        assert!(one_more.check_fits(23 * GIB).is_err());
    }

    #[test]
    fn instruments_max_is_charged_the_ladders_its_hint_reserves() {
        let config = EngineConfig {
            instruments_max: u32::MAX,
            levels_per_side_hint: LEVELS_PER_SIDE_HINT_MAX,
            ..EngineConfig::default()
        };
        let text = config.check_fits(23 * GIB).unwrap_err();
        assert!(
            text.starts_with("instruments_max 4294967295 needs "),
            "{text}"
        );
        assert!(text.contains("price ladders"), "{text}");
    }

    #[test]
    fn a_levels_hint_above_its_bound_is_refused_before_any_book_reserves_it() {
        let config = EngineConfig {
            levels_per_side_hint: LEVELS_PER_SIDE_HINT_MAX + 1,
            ..EngineConfig::default()
        };
        let text = config.check().unwrap_err();
        assert!(text.starts_with("levels_per_side_hint "), "{text}");
    }
}
