//! [`ClearingState`]: what clearing knows, folded from the committed streams of the cores.
//!
//! Every amount is a fixed-point integer. Trade values are kept *exactly* (`value` units: the
//! product price × lots × lot size × multiplier at the instrument's `value_scale`, which is the
//! larger of its price scale and `CASH_SCALE`), so that sums over accounts are exact and
//! variation margin sums to zero before it is rounded to cash once, at a run.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bourse_core::{
    AccountId, Cash, CashReason, Event, FirmId, Instrument, InstrumentDef, InstrumentId, Market,
    Price, RejectReason, Side, CASH_SCALE,
};
use serde::Serialize;

use crate::fees::FeeBase;
use crate::positions::{Compact, FeeBases, Positions};

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
    /// A snapshot that does not decode (named: what is wrong and where).
    BadSnapshot(String),
}

impl std::fmt::Display for ClearingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClearingError::UnknownInstrument(i) => write!(
                f,
                "a trade in instrument {i}, whose definition clearing was never given (not in its \
                 instruments file, no InstrumentAdded on its streams)"
            ),
            ClearingError::CoreOutOfRange { core, cores } => {
                write!(
                    f,
                    "core {core} out of range: clearing follows {cores} cores"
                )
            }
            ClearingError::Overflow(what) => write!(f, "{what} does not fit 128 bits"),
            ClearingError::BadSnapshot(why) => write!(f, "clearing snapshot: {why}"),
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
    /// Where the clearing business day started: the position as the last end-of-day run's
    /// cut left it (all zero before the first). The day's figures are the differences.
    pub sod: StartOfDay,
}

/// One position at the start of a clearing business day: what the last end-of-day run's cut
/// left (see `run::RollLine`), with the variation margin paid up to and by that run.
///
/// For an open position the roll keeps the cumulative figures and records this baseline
/// instead of rebasing them, because a standby may settle an end-of-day run after it applied
/// later trades: subtracting a recorded baseline commutes with those trades, rebasing the
/// average cost would not. A position the cut left flat has no average cost, so it is
/// rebased to zero and dropped (see `rebase_flat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StartOfDay {
    /// The day's opening position in lots (the previous day's closing one).
    pub qty: i64,
    pub paid_value: i128,
    pub realised_value: i128,
    pub vm_paid: Cash,
    pub lots_bought: i64,
    pub lots_sold: i64,
}

impl ClearingPosition {
    /// Lots bought on the current clearing business day.
    pub fn day_lots_bought(&self) -> i64 {
        self.lots_bought - self.sod.lots_bought
    }

    /// Lots sold on the current clearing business day.
    pub fn day_lots_sold(&self) -> i64 {
        self.lots_sold - self.sod.lots_sold
    }

    /// Net paid for the day's trades (buys minus sells), in value units.
    pub fn day_paid_value(&self) -> i128 {
        self.paid_value - self.sod.paid_value
    }

    /// Realised P&L of the current clearing business day, in value units.
    pub fn day_realised_value(&self) -> i128 {
        self.realised_value - self.sod.realised_value
    }

    /// Variation margin the day's runs paid (positive) or took, in cash units.
    pub fn day_vm_paid(&self) -> Cash {
        Cash(self.vm_paid.0 - self.sod.vm_paid.0)
    }
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
    /// The settlement price the clearing business day started at: the last end-of-day run's
    /// (start-of-day positions are marked from it).
    pub sod_settlement: Option<Price>,
}

/// One account's cash on one core, mirrored from the stream: the core's own figure from each
/// `CashChanged`, moved by the equity and FX trades in between as the core moves it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AccountCash {
    pub cash: Cash,
    pub deposited: Cash,
    pub withdrawn: Cash,
    /// The margin call the core has open on the account (0: none), from its
    /// `MarginCallSet` events: a run's call, less the deposits since.
    pub margin_called: Cash,
}

/// The clearing state of a set of cores (see the module documentation).
#[derive(Clone, Debug)]
pub struct ClearingState {
    definitions: BTreeMap<InstrumentId, Instrument>,
    /// The definitions the streams announced (`InstrumentAdded`): they win over the
    /// configuration's, and, unlike those, are in the snapshot, so an instrument an operator
    /// added at run time is still known to a clearing restarted from its snapshot.
    learned: BTreeMap<InstrumentId, InstrumentDef>,
    /// Held compactly (see `positions`): 64-bit amounts where they fit.
    positions: Positions,
    instruments: BTreeMap<InstrumentId, InstrumentState>,
    cash: BTreeMap<(usize, AccountId), AccountCash>,
    firms: BTreeMap<AccountId, FirmId>,
    /// The accounts of each firm (derived from `firms`, for per-firm queries and reports).
    firm_accounts: BTreeSet<(FirmId, AccountId)>,
    /// Per core, the position (log index) of the next entry to apply.
    cut: Vec<u64>,
    /// The newest event time stamp seen (the cores' clock, never clearing's).
    last_ts_ns: u64,
    trades: u64,
    /// The id of the last run settled in this state (0: none).
    last_settled_run: u32,
    /// The highest run id whose commands appear on the streams (a run's client id carries
    /// it): a run this state has not settled but the cores applied must be known before a new
    /// run is computed, or its margin would be paid twice.
    runs_on_stream_max: u32,
    /// Per account and instrument, what was traded since fees were last charged (`fees`).
    fee_base: FeeBases,
    /// Per account, the fees runs charged it so far.
    fees_paid: BTreeMap<AccountId, Cash>,
    /// The clearing business date, `YYYYMMDD` (0: none yet): the business day after the
    /// trade date of the last end-of-day run settled.
    business_date: u32,
    /// Per core and account, cash a run could not collect (positive): a run's
    /// `ClearingDebit` the core refused for want of free cash adds its amount (read from the
    /// stream), and settling the next run, which debits it again, subtracts what that run
    /// collects. Both are sums, so a standby settling a run after the core refused part of
    /// it reaches the same debts. Kept apart from the positions: a debt is the account's on
    /// a core, not an instrument's.
    debts: BTreeMap<(usize, AccountId), Cash>,
}

impl ClearingState {
    /// An empty state for `cores` cores, trading `definitions`, every stream at position 0.
    pub fn new(cores: usize, definitions: impl IntoIterator<Item = Instrument>) -> ClearingState {
        ClearingState {
            definitions: definitions.into_iter().map(|d| (d.instrument, d)).collect(),
            learned: BTreeMap::new(),
            positions: Positions::default(),
            instruments: BTreeMap::new(),
            cash: BTreeMap::new(),
            firms: BTreeMap::new(),
            firm_accounts: BTreeSet::new(),
            cut: vec![0; cores],
            last_ts_ns: 0,
            trades: 0,
            last_settled_run: 0,
            runs_on_stream_max: 0,
            fee_base: FeeBases::default(),
            debts: BTreeMap::new(),
            fees_paid: BTreeMap::new(),
            business_date: 0,
        }
    }

    /// The clearing business date the last end-of-day run rolled to (`YYYYMMDD`), if any.
    pub fn business_date(&self) -> Option<u32> {
        (self.business_date != 0).then_some(self.business_date)
    }

    /// What each account traded in each instrument since its fees were last charged.
    pub fn fee_bases(&self) -> &FeeBases {
        &self.fee_base
    }

    /// The fees runs charged `account` so far.
    pub fn fees_paid(&self, account: AccountId) -> Cash {
        self.fees_paid.get(&account).copied().unwrap_or_default()
    }

    /// What runs could not collect, per core and account (see the field).
    pub fn debts(&self) -> &BTreeMap<(usize, AccountId), Cash> {
        &self.debts
    }

    /// What runs could not collect from one account, per core.
    pub fn account_debts(&self, account: AccountId) -> Vec<(usize, Cash)> {
        self.debts
            .iter()
            .filter(|((_, a), _)| *a == account)
            .map(|(&(core, _), &d)| (core, d))
            .collect()
    }

    pub fn last_settled_run(&self) -> u32 {
        self.last_settled_run
    }

    pub fn runs_on_stream_max(&self) -> u32 {
        self.runs_on_stream_max
    }

    pub fn cores(&self) -> usize {
        self.cut.len()
    }

    /// The positions of one account, by instrument.
    pub fn account_positions(
        &self,
        account: AccountId,
    ) -> impl Iterator<Item = (InstrumentId, ClearingPosition)> + '_ {
        self.positions
            .of_account(account)
            .map(|(&(_, i), p)| (i, p))
    }

    /// Initial margin per (core, account) at this state: over the account's futures on the
    /// core, |lots| × the instrument's initial margin per lot (`Instrument::initial_margin`,
    /// the figure the core's pre-trade risk locks per lot), in cash units. Accounts with
    /// none are left out. Equities and FX need none: the cores take their cash at once.
    pub fn initial_margins(&self) -> BTreeMap<(usize, AccountId), i128> {
        let mut out: BTreeMap<(usize, AccountId), i128> = BTreeMap::new();
        for (&(account, instrument), p) in &self.positions {
            let im = self.position_initial_margin(instrument, p.qty);
            if im != 0 {
                let core = self.instruments.get(&instrument).map_or(0, |s| s.core);
                *out.entry((core, account)).or_default() += im;
            }
        }
        out
    }

    /// The initial margin `qty` lots of `instrument` take (0 unless it is a future).
    pub fn position_initial_margin(&self, instrument: InstrumentId, qty: i64) -> i128 {
        match self.definition(instrument) {
            Some(def) if def.market == Market::Futures => {
                (qty as i128).abs().saturating_mul(def.initial_margin.0)
            }
            _ => 0,
        }
    }

    /// The cash of one account on each core it has cash on.
    pub fn account_cash(&self, account: AccountId) -> Vec<(usize, AccountCash)> {
        self.cash
            .iter()
            .filter(|((_, a), _)| *a == account)
            .map(|(&(core, _), &c)| (core, c))
            .collect()
    }

    /// The accounts of `firm` after `after` (exclusive), in order.
    pub fn firm_accounts(
        &self,
        firm: FirmId,
        after: Option<AccountId>,
    ) -> impl Iterator<Item = AccountId> + '_ {
        use std::ops::Bound;
        let start = match after {
            Some(a) => Bound::Excluded((firm, a)),
            None => Bound::Included((firm, AccountId(0))),
        };
        self.firm_accounts
            .range((start, Bound::Included((firm, AccountId(u32::MAX)))))
            .map(|&(_, a)| a)
    }

    /// Every firm with its accounts' count.
    pub fn firms(&self) -> BTreeMap<FirmId, u64> {
        let mut out = BTreeMap::new();
        for &(f, _) in &self.firm_accounts {
            *out.entry(f).or_insert(0) += 1;
        }
        out
    }

    /// The position of each core's stream: the next entry this state has not applied.
    pub fn cut(&self) -> &[u64] {
        &self.cut
    }

    pub fn definition(&self, instrument: InstrumentId) -> Option<&Instrument> {
        self.definitions.get(&instrument)
    }

    /// Takes an instrument's definition from its `InstrumentAdded` event.
    fn learn(&mut self, instrument: InstrumentId, definition: InstrumentDef) {
        self.definitions
            .insert(instrument, definition.instrument(instrument));
        self.learned.insert(instrument, definition);
    }

    pub fn positions(&self) -> &Positions {
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
            let from_run = self.note_client(request.key().0);
            let mut refused = false;
            for event in request.events() {
                // The node encoded these events itself and the consumer checked the frame;
                // a damaged list is a bug upstream, and skipping an event would silently
                // corrupt positions, so it stops clearing with a clear error instead.
                let event = event.map_err(|_| ClearingError::Overflow("a damaged event"))?;
                self.apply_request_event(core, from_run, &mut refused, &event)?;
            }
        }
        self.cut[core] = entry.index() + 1;
        Ok(())
    }

    /// Applies the events of one request applied on `core` under `client_id` (what
    /// `apply_entry` does per request; tests feed requests directly).
    pub fn apply_request(
        &mut self,
        core: usize,
        client_id: u64,
        events: &[Event],
    ) -> Result<(), ClearingError> {
        self.check_core(core)?;
        let from_run = self.note_client(client_id);
        let mut refused = false;
        for event in events {
            self.apply_request_event(core, from_run, &mut refused, event)?;
        }
        Ok(())
    }

    /// Records a run's client id seen on a stream; whether `client_id` is a run's.
    fn note_client(&mut self, client_id: u64) -> bool {
        match crate::run::run_of_client_id(client_id) {
            Some(run) => {
                self.runs_on_stream_max = self.runs_on_stream_max.max(run);
                true
            }
            None => false,
        }
    }

    /// One event of a request: a run's debit the core refused for want of free cash (its
    /// `CommandRejected`, then the `MarginCallSet` that adds the unpaid amount to the
    /// account's call) becomes a debt of the account on that core, for the next run to
    /// collect. The call's rise is the unpaid amount: clearing mirrors the call before it.
    fn apply_request_event(
        &mut self,
        core: usize,
        from_run: bool,
        refused: &mut bool,
        event: &Event,
    ) -> Result<(), ClearingError> {
        match *event {
            Event::CommandRejected { reason, .. } if from_run => {
                *refused = reason == RejectReason::InsufficientFreeCash;
            }
            Event::MarginCallSet {
                account, amount, ..
            } if *refused => {
                let before = self
                    .cash
                    .get(&(core, account))
                    .map_or(0, |c| c.margin_called.0);
                let unpaid = amount.0 - before;
                if unpaid > 0 {
                    self.debts.entry((core, account)).or_default().0 += unpaid;
                }
            }
            _ => {}
        }
        self.apply_event(core, event)
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
                aggressor,
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
                // The aggressor takes liquidity; the resting side made it.
                let (taker, maker) = match aggressor {
                    Side::Buy => (buy.account, sell.account),
                    Side::Sell => (sell.account, buy.account),
                };
                self.fee_base.update((taker, instrument), |t| {
                    t.taker_value += value.abs();
                    t.taker_lots += qty.0;
                });
                self.fee_base.update((maker, instrument), |m| {
                    m.maker_value += value.abs();
                    m.maker_lots += qty.0;
                });
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
            Event::MarginCallSet {
                account, amount, ..
            } => {
                self.cash.entry((core, account)).or_default().margin_called = amount;
            }
            Event::InstrumentAdded {
                instrument,
                definition,
                ..
            } => self.learn(instrument, definition),
            Event::AccountAdded { account, firm, .. } => {
                if let Some(old) = self.firms.insert(account, firm) {
                    self.firm_accounts.remove(&(old, account));
                }
                self.firm_accounts.insert((firm, account));
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
        let key = (account, def.instrument);
        let mut p = self.positions.get(&key).unwrap_or_default();
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
        self.positions.insert(key, p);
        Ok(())
    }

    /// Records a run's results (see `run::RunPlan`): the variation margin it paid on each
    /// futures position, its settlement prices, and the equity and FX obligations it settled.
    pub fn settle(&mut self, plan: &crate::run::RunPlan) {
        self.last_settled_run = self.last_settled_run.max(plan.run_id);
        for line in &plan.margin {
            let key = (line.account, line.instrument);
            if let Some(mut p) = self.positions.get(&key) {
                p.vm_paid.0 += line.vm.0;
                self.positions.insert(key, p);
            }
        }
        for (&instrument, &price) in &plan.prices {
            if let Some(s) = self.instruments.get_mut(&instrument) {
                s.settlement = Some(price);
            }
        }
        for line in &plan.obligations {
            let key = (line.account, line.instrument);
            if let Some(mut p) = self.positions.get(&key) {
                p.securities_due -= line.securities;
                p.cash_due.0 -= line.cash.0;
                self.positions.insert(key, p);
            }
        }
        // The base a run charged is subtracted, not cleared, so trades after its cut stay to
        // be charged by the next run whenever this one is settled.
        for line in &plan.fees {
            let key = (line.account, line.instrument);
            if let Some(mut b) = self.fee_base.get(&key) {
                b.maker_value -= line.base.maker_value;
                b.taker_value -= line.base.taker_value;
                b.maker_lots -= line.base.maker_lots;
                b.taker_lots -= line.base.taker_lots;
                if b.is_empty() {
                    self.fee_base.remove(&key);
                } else {
                    self.fee_base.insert(key, b);
                }
            }
            self.fees_paid.entry(line.account).or_default().0 += line.fee.0;
        }
        // The debts the run collects are debited again in its movements: subtracted here,
        // and added back from the stream if the core refuses the debit once more.
        for line in &plan.debts {
            let key = (line.core, line.account);
            if let Some(d) = self.debts.get_mut(&key) {
                d.0 -= line.amount.0;
                if d.0 == 0 {
                    self.debts.remove(&key);
                }
            }
        }
        if plan.kind == crate::run::RunKind::EndOfDay {
            self.roll(plan);
        }
    }

    /// The end of day's roll (after the run's margin is in `vm_paid`): every position's
    /// start of day becomes what the run's cut left, instruments start the new day at the
    /// run's settlement prices, and the business date moves to the plan's next one. Cash
    /// (the collateral) is the cores' and carries over as it is.
    ///
    /// A position the cut left flat is rebased instead (see `rebase_flat`) and dropped when
    /// nothing of it is left, so plans and reports stop listing every position ever traded.
    fn roll(&mut self, plan: &crate::run::RunPlan) {
        for line in &plan.roll {
            let key = (line.account, line.instrument);
            let Some(mut p) = self.positions.get(&key) else {
                continue;
            };
            if line.qty != 0 {
                p.sod = StartOfDay {
                    qty: line.qty,
                    paid_value: line.paid_value,
                    realised_value: line.realised_value,
                    vm_paid: p.vm_paid,
                    lots_bought: line.lots_bought,
                    lots_sold: line.lots_sold,
                };
                self.positions.insert(key, p);
                continue;
            }
            let futures = self
                .definitions
                .get(&line.instrument)
                .filter(|d| d.market == Market::Futures);
            rebase_flat(&mut p, line, futures);
            // Without a fee schedule nothing ever charges the fee base, so it cannot keep a
            // position alive; with one, a base left uncharged keeps the position (its FIX
            // report carries the fees due).
            let fees_pending = plan.fee_schedule.is_some() && self.fee_base.contains_key(&key);
            if p == ClearingPosition::default() && !fees_pending {
                self.positions.remove(&key);
            } else {
                self.positions.insert(key, p);
            }
        }
        for (&instrument, &price) in &plan.prices {
            if let Some(s) = self.instruments.get_mut(&instrument) {
                s.sod_settlement = Some(price);
            }
        }
        if let Some(date) = plan.next_business_date.as_deref() {
            self.business_date = yyyymmdd(date).unwrap_or(0);
        }
    }

    /// A hash of the whole state: xxh3 of its snapshot encoding (fixed order, fixed widths),
    /// so two states fed the same entries and settled by the same runs hash alike, and a
    /// state decoded from a snapshot hashes as the one that wrote it. The encoding is fed to
    /// the hasher as it is written, never held whole (at 100,000,000 positions it would be
    /// gigabytes).
    pub fn state_hash(&self) -> u64 {
        let mut w = Writer::Hash(Box::new(xxhash_rust::xxh3::Xxh3::new()));
        self.write(&mut w);
        match w {
            Writer::Hash(h) => h.digest(),
            _ => unreachable!("a hashing writer"),
        }
    }

    /// The length of [`ClearingState::encode`]'s bytes, counted without holding them.
    pub fn encoded_len(&self) -> u64 {
        let mut w = Writer::Count(0);
        self.write(&mut w);
        match w {
            Writer::Count(n) => n,
            _ => unreachable!("a counting writer"),
        }
    }

    /// The state as bytes (the snapshot's data; the configuration's definitions are not
    /// included, those learned from the streams are). Little-endian, fixed widths, every map in key order.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::Bytes(Vec::with_capacity(
            64 + self.positions.len() * POSITION_BYTES_PACKED,
        ));
        self.write(&mut w);
        match w {
            Writer::Bytes(bytes) => bytes,
            _ => unreachable!("a byte writer"),
        }
    }

    /// Writes the encoding (see `encode`) to `w`.
    fn write(&self, w: &mut Writer) {
        w.put(SNAPSHOT_MAGIC);
        w.u32(self.cut.len() as u32);
        for &c in &self.cut {
            w.u64(c);
        }
        w.u64(self.last_ts_ns);
        w.u64(self.trades);
        w.u32(self.last_settled_run);
        w.u32(self.runs_on_stream_max);
        w.u32(self.business_date);
        w.u64(self.positions.len() as u64);
        for (&(a, i), p) in &self.positions {
            w.u32(a.0);
            w.u32(i.0);
            for v in [
                p.qty,
                p.securities_due,
                p.lots_bought,
                p.lots_sold,
                p.sod.qty,
                p.sod.lots_bought,
                p.sod.lots_sold,
            ] {
                w.i64(v);
            }
            // The amounts in 64 bits when all fit (as the state holds it), else in 128.
            let wide = p.pack().is_none();
            w.u8(wide as u8);
            for v in [
                p.cost_value,
                p.paid_value,
                p.realised_value,
                p.vm_paid.0,
                p.cash_due.0,
                p.sod.paid_value,
                p.sod.realised_value,
                p.sod.vm_paid.0,
            ] {
                if wide {
                    w.i128(v);
                } else {
                    w.i64(v as i64);
                }
            }
        }
        w.u64(self.instruments.len() as u64);
        for (i, s) in &self.instruments {
            w.u32(i.0);
            w.u32(s.core as u32);
            w.u64(s.trades);
            w.u8(s.settlement.is_some() as u8);
            w.i64(s.settlement.map_or(0, |p| p.0));
            w.u8(s.sod_settlement.is_some() as u8);
            w.i64(s.sod_settlement.map_or(0, |p| p.0));
            w.u32(s.recent.len() as u32);
            for t in &s.recent {
                w.u64(t.ts_ns);
                w.i64(t.price.0);
                w.i64(t.qty);
            }
        }
        w.u64(self.cash.len() as u64);
        for (&(core, a), c) in &self.cash {
            w.u32(core as u32);
            w.u32(a.0);
            for v in [c.cash.0, c.deposited.0, c.withdrawn.0, c.margin_called.0] {
                w.i128(v);
            }
        }
        w.u64(self.firms.len() as u64);
        for (a, f) in &self.firms {
            w.u32(a.0);
            w.u32(f.0);
        }
        w.u64(self.fee_base.len() as u64);
        for (&(a, i), b) in &self.fee_base {
            w.u32(a.0);
            w.u32(i.0);
            w.i128(b.maker_value);
            w.i128(b.taker_value);
            w.i64(b.maker_lots);
            w.i64(b.taker_lots);
        }
        w.u64(self.fees_paid.len() as u64);
        for (a, c) in &self.fees_paid {
            w.u32(a.0);
            w.i128(c.0);
        }
        w.u64(self.debts.len() as u64);
        for (&(core, a), d) in &self.debts {
            w.u32(core as u32);
            w.u32(a.0);
            w.i128(d.0);
        }
        // The learned definitions as the events that announced them, in the core's codec.
        let learned: Vec<Event> = self
            .learned
            .iter()
            .map(|(&instrument, &definition)| Event::InstrumentAdded {
                instrument,
                definition,
                ts_ns: 0,
            })
            .collect();
        let bytes = bourse_core::codec::encode_events(&learned);
        w.u64(bytes.len() as u64);
        w.put(&bytes);
    }

    /// The state [`ClearingState::encode`] wrote, given the same definitions; refuses bytes
    /// that are short, long, of another format, or for another number of cores.
    pub fn decode(
        cores: usize,
        definitions: impl IntoIterator<Item = Instrument>,
        bytes: &[u8],
    ) -> Result<ClearingState, ClearingError> {
        let mut s = ClearingState::new(cores, definitions);
        let mut r = Reader { bytes, at: 0 };
        let magic = r.take(SNAPSHOT_MAGIC.len())?;
        if magic != SNAPSHOT_MAGIC {
            // An older format names itself: say which, so an operator knows to rebuild the
            // state from the streams (and the saved runs) instead of restoring the snapshot.
            let why = match magic.strip_prefix(b"BCLEAR") {
                Some(version) => format!(
                    "format {} (magic {}), written by an older bourse; this one reads only \
                     format {} ({}): rebuild the state from the streams",
                    String::from_utf8_lossy(version),
                    String::from_utf8_lossy(magic),
                    String::from_utf8_lossy(&SNAPSHOT_MAGIC[6..]),
                    String::from_utf8_lossy(SNAPSHOT_MAGIC),
                ),
                None => "not a clearing snapshot (magic)".into(),
            };
            return Err(ClearingError::BadSnapshot(why));
        }
        let n = r.u32()? as usize;
        if n != cores {
            return Err(ClearingError::BadSnapshot(format!(
                "written for {n} cores, this clearing follows {cores}"
            )));
        }
        for c in 0..n {
            s.cut[c] = r.u64()?;
        }
        s.last_ts_ns = r.u64()?;
        s.trades = r.u64()?;
        s.last_settled_run = r.u32()?;
        s.runs_on_stream_max = r.u32()?;
        s.business_date = r.u32()?;
        let mut previous = None;
        for _ in 0..r.count(POSITION_BYTES_PACKED)? {
            let key = (AccountId(r.u32()?), InstrumentId(r.u32()?));
            // Keys in strictly increasing order, as `encode` writes them: a repeated or
            // unordered key is a damaged snapshot, not a position to overwrite.
            if previous.is_some_and(|k| k >= key) {
                return Err(ClearingError::BadSnapshot(format!(
                    "position ({}, {}) out of order at byte {}",
                    key.0, key.1, r.at
                )));
            }
            previous = Some(key);
            let mut p = ClearingPosition {
                qty: r.i64()?,
                securities_due: r.i64()?,
                lots_bought: r.i64()?,
                lots_sold: r.i64()?,
                ..ClearingPosition::default()
            };
            p.sod.qty = r.i64()?;
            p.sod.lots_bought = r.i64()?;
            p.sod.lots_sold = r.i64()?;
            let wide = match r.u8()? {
                0 => false,
                1 => true,
                other => {
                    return Err(ClearingError::BadSnapshot(format!(
                        "position ({}, {}): amount width {other}, not 0 or 1",
                        key.0, key.1
                    )))
                }
            };
            let mut amount = || -> Result<i128, ClearingError> {
                if wide {
                    r.i128()
                } else {
                    r.i64().map(i128::from)
                }
            };
            p.cost_value = amount()?;
            p.paid_value = amount()?;
            p.realised_value = amount()?;
            p.vm_paid = Cash(amount()?);
            p.cash_due = Cash(amount()?);
            p.sod.paid_value = amount()?;
            p.sod.realised_value = amount()?;
            p.sod.vm_paid = Cash(amount()?);
            if wide && p.pack().is_some() {
                return Err(ClearingError::BadSnapshot(format!(
                    "position ({}, {}) written wide though its amounts fit 64 bits",
                    key.0, key.1
                )));
            }
            s.positions.insert(key, p);
        }
        for _ in 0..r.count(38)? {
            let id = InstrumentId(r.u32()?);
            let core = r.u32()? as usize;
            if core >= cores {
                return Err(ClearingError::BadSnapshot(format!(
                    "instrument {id} on core {core} of {cores}"
                )));
            }
            let trades = r.u64()?;
            let has = r.u8()? != 0;
            let price = r.i64()?;
            let has_sod = r.u8()? != 0;
            let sod_price = r.i64()?;
            let mut state = InstrumentState {
                core,
                trades,
                settlement: has.then_some(Price(price)),
                sod_settlement: has_sod.then_some(Price(sod_price)),
                recent: VecDeque::new(),
            };
            let recent = r.u32()? as usize;
            if recent > RECENT_TRADES_MAX {
                return Err(ClearingError::BadSnapshot(format!(
                    "instrument {id} keeps {recent} trades, more than {RECENT_TRADES_MAX}"
                )));
            }
            for _ in 0..recent {
                state.recent.push_back(RecentTrade {
                    ts_ns: r.u64()?,
                    price: Price(r.i64()?),
                    qty: r.i64()?,
                });
            }
            s.instruments.insert(id, state);
        }
        for _ in 0..r.count(72)? {
            let key = (r.u32()? as usize, AccountId(r.u32()?));
            let c = AccountCash {
                cash: Cash(r.i128()?),
                deposited: Cash(r.i128()?),
                withdrawn: Cash(r.i128()?),
                margin_called: Cash(r.i128()?),
            };
            s.cash.insert(key, c);
        }
        for _ in 0..r.count(8)? {
            let (a, f) = (AccountId(r.u32()?), FirmId(r.u32()?));
            s.firms.insert(a, f);
            s.firm_accounts.insert((f, a));
        }
        for _ in 0..r.count(56)? {
            let key = (AccountId(r.u32()?), InstrumentId(r.u32()?));
            let b = FeeBase {
                maker_value: r.i128()?,
                taker_value: r.i128()?,
                maker_lots: r.i64()?,
                taker_lots: r.i64()?,
            };
            s.fee_base.insert(key, b);
        }
        for _ in 0..r.count(20)? {
            let a = AccountId(r.u32()?);
            s.fees_paid.insert(a, Cash(r.i128()?));
        }
        for _ in 0..r.count(24)? {
            let key = (r.u32()? as usize, AccountId(r.u32()?));
            if key.0 >= cores {
                return Err(ClearingError::BadSnapshot(format!(
                    "a debt of account {} on core {} of {cores}",
                    key.1, key.0
                )));
            }
            s.debts.insert(key, Cash(r.i128()?));
        }
        let len = r.count(1)? as usize;
        let events = bourse_core::codec::decode_events(r.take(len)?)
            .map_err(|e| ClearingError::BadSnapshot(format!("learned instruments: {e}")))?;
        for e in events {
            let Event::InstrumentAdded {
                instrument,
                definition,
                ..
            } = e
            else {
                return Err(ClearingError::BadSnapshot(
                    "learned instruments: an event that is not an instrument's".into(),
                ));
            };
            s.learn(instrument, definition);
        }
        if r.at != bytes.len() {
            return Err(ClearingError::BadSnapshot(format!(
                "{} bytes after the end of the state",
                bytes.len() - r.at
            )));
        }
        Ok(s)
    }
}

/// The first bytes of a clearing snapshot's data (format 7: with the accounts' debts; format
/// 6 had each position's amounts in 64 bits where they fit, with a width byte, but no debts;
/// format 5 had every amount in 128 bits, format 4 no margin calls, format 3 no business date
/// nor start of day, format 2 no fees, format 1 no instruments learned from the streams; all
/// are refused by their magic, naming it).
const SNAPSHOT_MAGIC: &[u8; 8] = b"BCLEAR07";

/// The bytes of a position packed in a snapshot: key 8, seven lot counts 56, the width byte,
/// eight amounts of 8.
const POSITION_BYTES_PACKED: usize = 8 + 56 + 1 + 64;

/// `YYYY-MM-DD` as the number `YYYYMMDD`.
fn yyyymmdd(date: &str) -> Option<u32> {
    let digits: String = date.chars().filter(|c| *c != '-').collect();
    (digits.len() == 8).then(|| digits.parse().ok()).flatten()
}

/// Where the encoding goes: bytes (a snapshot), straight into a hasher (`state_hash`), or
/// only counted (`encoded_len`).
enum Writer {
    Bytes(Vec<u8>),
    Hash(Box<xxhash_rust::xxh3::Xxh3>),
    Count(u64),
}

impl Writer {
    fn put(&mut self, bytes: &[u8]) {
        match self {
            Writer::Bytes(out) => out.extend_from_slice(bytes),
            Writer::Hash(h) => h.update(bytes),
            Writer::Count(n) => *n += bytes.len() as u64,
        }
    }
    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.put(&v.to_le_bytes());
    }
    fn i128(&mut self, v: i128) {
        self.put(&v.to_le_bytes());
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ClearingError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(ClearingError::BadSnapshot(format!(
                "ends at byte {} inside a field of {n} bytes",
                self.bytes.len()
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, ClearingError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, ClearingError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, ClearingError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, ClearingError> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn i128(&mut self) -> Result<i128, ClearingError> {
        Ok(i128::from_le_bytes(
            self.take(16)?.try_into().expect("16 bytes"),
        ))
    }
    /// A count of records of at least `min_bytes` each, refused when the bytes left cannot
    /// hold that many (so a damaged count cannot make the decoder loop for long).
    fn count(&mut self, min_bytes: usize) -> Result<u64, ClearingError> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.at) as u64;
        if n.saturating_mul(min_bytes as u64) > left {
            return Err(ClearingError::BadSnapshot(format!(
                "a count of {n} records at byte {} where {left} bytes are left",
                self.at - 8
            )));
        }
        Ok(n)
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

/// Rebases a position an end-of-day cut left flat (`line.qty == 0`), so that it starts the
/// next business day from zero: the cut's cumulative figures are subtracted and the start of
/// day is zero. With no lots open at the cut its average cost was zero there, so the trades
/// after the cut do not depend on its history, and subtracting the cut's figures commutes
/// with them: a standby settling the run after later trades reaches the state a node that
/// settled at the cut does (the later trades then recreate the dropped position).
///
/// For a future the variation margin must stay exact. The runs paid `floor(-paid_value)` in
/// cash, and the sub-cash remainder `s` (0 ≤ s < one cash unit, in value units) is a credit
/// the account is still owed when the position moves again. The rebase therefore subtracts
/// only the cash-aligned part of `paid_value` (and the cash it paid from `vm_paid`), leaving
/// `paid_value = -s`, which is also the day's baseline so the day's figures are those of the
/// day's trades alone. Every later run then computes the same margin as without the rebase.
/// Only a position with no remainder is left all zero and can be dropped.
fn rebase_flat(
    p: &mut ClearingPosition,
    line: &crate::run::RollLine,
    futures: Option<&Instrument>,
) {
    let (aligned, paid_cash) = match futures {
        Some(def) => {
            let unit = 10i128.pow((value_scale(def) - CASH_SCALE) as u32);
            let paid_cash = value_to_cash_floor(def, -line.paid_value);
            (-paid_cash * unit, paid_cash)
        }
        None => (line.paid_value, 0),
    };
    p.paid_value -= aligned;
    p.realised_value -= line.realised_value;
    p.lots_bought -= line.lots_bought;
    p.lots_sold -= line.lots_sold;
    p.vm_paid.0 -= paid_cash;
    p.sod = StartOfDay {
        qty: 0,
        paid_value: line.paid_value - aligned,
        realised_value: 0,
        // `vm_paid` moves only when a run is settled, so it is still the cut's here.
        vm_paid: p.vm_paid,
        lots_bought: 0,
        lots_sold: 0,
    };
}
