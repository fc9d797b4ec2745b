//! [`ClearingState`]: what clearing knows, folded from the committed streams of the cores.
//!
//! Every amount is a fixed-point integer. Trade values are kept *exactly* (`value` units: the
//! product price × lots × lot size × multiplier at the instrument's `value_scale`, which is the
//! larger of its price scale and `CASH_SCALE`), so that sums over accounts are exact and
//! variation margin sums to zero before it is rounded to cash once, at a run.

use std::collections::{BTreeMap, VecDeque};

use bourse_core::{
    AccountId, Cash, CashReason, Event, FirmId, Instrument, InstrumentId, Market, Price, Side,
    CASH_SCALE,
};
use serde::Serialize;

/// The most recent trades kept per instrument for settlement prices (a bound on memory; a
/// settlement rule may ask for at most this many).
pub const RECENT_TRADES_MAX: usize = 4096;

/// Why the state refused an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClearingError {
    /// A trade in an instrument clearing was not given the definition of.
    UnknownInstrument(InstrumentId),
    /// The streams' position vector has another length than the number of cores.
    CoreOutOfRange { core: usize, cores: usize },
    /// A value does not fit the arithmetic.
    Overflow(&'static str),
}

impl std::fmt::Display for ClearingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClearingError::UnknownInstrument(i) => write!(
                f,
                "a trade in instrument {i}, which is not among the instruments given to clearing"
            ),
            ClearingError::CoreOutOfRange { core, cores } => {
                write!(
                    f,
                    "core {core} out of range: clearing follows {cores} cores"
                )
            }
            ClearingError::Overflow(what) => write!(f, "{what} does not fit 128 bits"),
        }
    }
}

impl std::error::Error for ClearingError {}

/// One account's holding of one instrument, as clearing sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClearingPosition {
    /// Net lots: positive long, negative short.
    pub qty: i64,
    /// Cost of the open position (average cost), in value units; negative for a short.
    pub cost_value: i128,
    /// Net paid for every trade so far (buys minus sells), in value units.
    pub paid_value: i128,
    /// Realised profit and loss (average cost), in value units.
    pub realised_value: i128,
    /// Futures: variation margin paid to (positive) or taken from (negative) the account by
    /// the runs so far, in cash units.
    pub vm_paid: Cash,
    /// Equities and FX: securities to receive (positive) or deliver since the last run, in
    /// units of the underlying (lots × lot size).
    pub securities_due: i64,
    /// Equities and FX: cash to receive (positive) or pay since the last run, in cash units,
    /// rounded as the core moved it (the trade's notional rounded down, on both sides).
    pub cash_due: Cash,
    pub lots_bought: i64,
    pub lots_sold: i64,
}

/// One trade kept for settlement prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RecentTrade {
    pub ts_ns: u64,
    pub price: Price,
    pub qty: i64,
}

/// Per instrument: which core trades it, its trades kept for settlement prices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstrumentState {
    pub core: usize,
    pub recent: VecDeque<RecentTrade>,
    pub trades: u64,
    /// The settlement price of the last run that fixed one.
    pub settlement: Option<Price>,
}

/// One account's cash on one core, mirrored from the stream: the core's own figure from each
/// `CashChanged`, moved by the equity and FX trades in between as the core moves it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AccountCash {
    pub cash: Cash,
    pub deposited: Cash,
    pub withdrawn: Cash,
}

/// The clearing state of a set of cores (see the module documentation).
#[derive(Clone, Debug)]
pub struct ClearingState {
    definitions: BTreeMap<InstrumentId, Instrument>,
    positions: BTreeMap<(AccountId, InstrumentId), ClearingPosition>,
    instruments: BTreeMap<InstrumentId, InstrumentState>,
    cash: BTreeMap<(usize, AccountId), AccountCash>,
    firms: BTreeMap<AccountId, FirmId>,
    /// Per core, the position (log index) of the next entry to apply.
    cut: Vec<u64>,
    /// The newest event time stamp seen (the cores' clock, never clearing's).
    last_ts_ns: u64,
    trades: u64,
}

impl ClearingState {
    /// An empty state for `cores` cores, trading `definitions`, every stream at position 0.
    pub fn new(cores: usize, definitions: impl IntoIterator<Item = Instrument>) -> ClearingState {
        ClearingState {
            definitions: definitions.into_iter().map(|d| (d.instrument, d)).collect(),
            positions: BTreeMap::new(),
            instruments: BTreeMap::new(),
            cash: BTreeMap::new(),
            firms: BTreeMap::new(),
            cut: vec![0; cores],
            last_ts_ns: 0,
            trades: 0,
        }
    }

    /// The position of each core's stream: the next entry this state has not applied.
    pub fn cut(&self) -> &[u64] {
        &self.cut
    }

    pub fn definition(&self, instrument: InstrumentId) -> Option<&Instrument> {
        self.definitions.get(&instrument)
    }

    pub fn positions(&self) -> &BTreeMap<(AccountId, InstrumentId), ClearingPosition> {
        &self.positions
    }

    pub fn instruments(&self) -> &BTreeMap<InstrumentId, InstrumentState> {
        &self.instruments
    }

    pub fn cash(&self) -> &BTreeMap<(usize, AccountId), AccountCash> {
        &self.cash
    }

    pub fn firm_of(&self, account: AccountId) -> Option<FirmId> {
        self.firms.get(&account).copied()
    }

    pub fn last_ts_ns(&self) -> u64 {
        self.last_ts_ns
    }

    pub fn trades(&self) -> u64 {
        self.trades
    }

    /// Applies one committed entry of `core`: the events of the requests applied in it.
    /// Entries must come in order from the state's position for that core (the consumer
    /// guarantees it); the position moves past the entry.
    pub fn apply_entry(
        &mut self,
        core: usize,
        entry: &bourse_cluster::EntryView,
    ) -> Result<(), ClearingError> {
        self.check_core(core)?;
        for request in entry.requests() {
            if !request.applied_here() {
                continue;
            }
            for event in request.events() {
                // The node encoded these events itself and the consumer checked the frame;
                // a damaged list is a bug upstream, and skipping an event would silently
                // corrupt positions, so it stops clearing with a clear error instead.
                let event = event.map_err(|_| ClearingError::Overflow("a damaged event"))?;
                self.apply_event(core, &event)?;
            }
        }
        self.cut[core] = entry.index() + 1;
        Ok(())
    }

    fn check_core(&self, core: usize) -> Result<(), ClearingError> {
        if core >= self.cut.len() {
            return Err(ClearingError::CoreOutOfRange {
                core,
                cores: self.cut.len(),
            });
        }
        Ok(())
    }

    /// Applies one event of `core` (what `apply_entry` does per event; tests feed events
    /// directly).
    pub fn apply_event(&mut self, core: usize, event: &Event) -> Result<(), ClearingError> {
        self.check_core(core)?;
        self.last_ts_ns = self.last_ts_ns.max(event.ts_ns());
        match *event {
            Event::Trade {
                instrument,
                price,
                qty,
                buy,
                sell,
                ts_ns,
                ..
            } => {
                let def = self
                    .definitions
                    .get(&instrument)
                    .ok_or(ClearingError::UnknownInstrument(instrument))?
                    .clone();
                let value = trade_value(&def, price, qty.0)?;
                let cash = def
                    .notional_floor(price, qty)
                    .ok_or(ClearingError::Overflow("a trade's notional"))?;
                self.fill(core, &def, buy.account, Side::Buy, qty.0, value, cash)?;
                self.fill(core, &def, sell.account, Side::Sell, qty.0, value, cash)?;
                let state = self.instruments.entry(instrument).or_default();
                state.core = core;
                state.trades += 1;
                if state.recent.len() == RECENT_TRADES_MAX {
                    state.recent.pop_front();
                }
                state.recent.push_back(RecentTrade {
                    ts_ns,
                    price,
                    qty: qty.0,
                });
                self.trades += 1;
            }
            Event::CashChanged {
                account,
                reason,
                amount,
                cash,
                ..
            } => {
                let c = self.cash.entry((core, account)).or_default();
                c.cash = cash;
                match reason {
                    CashReason::Deposit => c.deposited.0 += amount.0,
                    CashReason::Withdraw => c.withdrawn.0 += amount.0,
                    CashReason::SetCollateral => {}
                }
            }
            Event::AccountAdded { account, firm, .. } => {
                self.firms.insert(account, firm);
                self.cash.entry((core, account)).or_default();
            }
            _ => {}
        }
        Ok(())
    }

    /// One side of a trade: position, cost and realised P&L (average cost), and for equities
    /// and FX the settlement obligations and the cash the core moved.
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &mut self,
        core: usize,
        def: &Instrument,
        account: AccountId,
        side: Side,
        lots: i64,
        value: i128,
        notional_cash: i128,
    ) -> Result<(), ClearingError> {
        let dir: i64 = match side {
            Side::Buy => 1,
            Side::Sell => -1,
        };
        let p = self.positions.entry((account, def.instrument)).or_default();
        p.paid_value += dir as i128 * value;
        match side {
            Side::Buy => p.lots_bought += lots,
            Side::Sell => p.lots_sold += lots,
        }
        // The part of the trade that closes an opposite position realises P&L against the
        // position's average cost; the rest opens (or adds to) a position at the trade price.
        let closing = if p.qty.signum() == -dir {
            lots.min(p.qty.abs())
        } else {
            0
        };
        if closing > 0 {
            let removed = p.cost_value * closing as i128 / p.qty.abs() as i128;
            let closed_value = value * closing as i128 / lots as i128;
            p.realised_value += -(dir as i128) * closed_value - removed;
            p.cost_value -= removed;
            p.qty += dir * closing;
            let opening_value = value - closed_value;
            p.cost_value += dir as i128 * opening_value;
            p.qty += dir * (lots - closing);
        } else {
            p.cost_value += dir as i128 * value;
            p.qty += dir * lots;
        }
        if def.market != Market::Futures {
            p.securities_due += dir * lots * def.lot_size;
            p.cash_due.0 -= dir as i128 * notional_cash;
            // The core pays for equities and FX at once (T+0): mirror its cash.
            self.cash.entry((core, account)).or_default().cash.0 -= dir as i128 * notional_cash;
        }
        Ok(())
    }

    /// Records a run's results (see `run::RunPlan`): the variation margin it paid on each
    /// futures position, its settlement prices, and the equity and FX obligations it settled.
    pub fn settle(&mut self, plan: &crate::run::RunPlan) {
        for line in &plan.margin {
            if let Some(p) = self.positions.get_mut(&(line.account, line.instrument)) {
                p.vm_paid.0 += line.vm.0;
            }
        }
        for (&instrument, &price) in &plan.prices {
            if let Some(s) = self.instruments.get_mut(&instrument) {
                s.settlement = Some(price);
            }
        }
        for line in &plan.obligations {
            if let Some(p) = self.positions.get_mut(&(line.account, line.instrument)) {
                p.securities_due -= line.securities;
                p.cash_due.0 -= line.cash.0;
            }
        }
    }

    /// A hash of the whole state, in a fixed order: two states fed the same entries (and
    /// settled by the same runs) have the same hash.
    pub fn state_hash(&self) -> u64 {
        let mut h = Vec::with_capacity(64 + self.positions.len() * 120);
        for c in &self.cut {
            h.extend_from_slice(&c.to_le_bytes());
        }
        h.extend_from_slice(&self.last_ts_ns.to_le_bytes());
        h.extend_from_slice(&self.trades.to_le_bytes());
        for ((a, i), p) in &self.positions {
            h.extend_from_slice(&a.0.to_le_bytes());
            h.extend_from_slice(&i.0.to_le_bytes());
            for v in [p.qty, p.securities_due, p.lots_bought, p.lots_sold] {
                h.extend_from_slice(&v.to_le_bytes());
            }
            for v in [
                p.cost_value,
                p.paid_value,
                p.realised_value,
                p.vm_paid.0,
                p.cash_due.0,
            ] {
                h.extend_from_slice(&v.to_le_bytes());
            }
        }
        for (i, s) in &self.instruments {
            h.extend_from_slice(&i.0.to_le_bytes());
            h.extend_from_slice(&(s.core as u64).to_le_bytes());
            h.extend_from_slice(&s.trades.to_le_bytes());
            h.extend_from_slice(&s.settlement.map_or(-1, |p| p.0).to_le_bytes());
            for t in &s.recent {
                h.extend_from_slice(&t.ts_ns.to_le_bytes());
                h.extend_from_slice(&t.price.0.to_le_bytes());
                h.extend_from_slice(&t.qty.to_le_bytes());
            }
        }
        for ((core, a), c) in &self.cash {
            h.extend_from_slice(&(*core as u64).to_le_bytes());
            h.extend_from_slice(&a.0.to_le_bytes());
            for v in [c.cash.0, c.deposited.0, c.withdrawn.0] {
                h.extend_from_slice(&v.to_le_bytes());
            }
        }
        for (a, f) in &self.firms {
            h.extend_from_slice(&a.0.to_le_bytes());
            h.extend_from_slice(&f.0.to_le_bytes());
        }
        xxhash_rust::xxh3::xxh3_64(&h)
    }
}

/// The decimals of an instrument's exact values: its price scale, at least `CASH_SCALE`.
pub fn value_scale(def: &Instrument) -> u8 {
    def.price_scale.max(CASH_SCALE)
}

/// The exact value of `lots` at `price`, in value units (see the module documentation).
pub fn trade_value(def: &Instrument, price: Price, lots: i64) -> Result<i128, ClearingError> {
    let up = 10i128.pow((value_scale(def) - def.price_scale) as u32);
    (price.0 as i128)
        .checked_mul(lots as i128)
        .and_then(|v| v.checked_mul(def.lot_size as i128))
        .and_then(|v| v.checked_mul(def.multiplier as i128))
        .and_then(|v| v.checked_mul(up))
        .ok_or(ClearingError::Overflow("a trade's value"))
}

/// A value in value units as cash, rounded down (towards minus infinity): a debit is never
/// rounded away, a credit never rounded up.
pub fn value_to_cash_floor(def: &Instrument, value: i128) -> i128 {
    let div = 10i128.pow((value_scale(def) - CASH_SCALE) as u32);
    value.div_euclid(div)
}
