//! A clearing run as a pure function of the state at a cut: settlement prices, variation
//! margin per futures position, equity and FX obligations, and the cash movements that feed
//! the results back to the cores, each under an idempotency key derived from the run id.

use std::collections::BTreeMap;

use bourse_core::{AccountId, Cash, Command, CommandBody, InstrumentId, Market, Price};
use serde::{Deserialize, Serialize};

use crate::fees::{FeeLine, FeeSchedule};
use crate::state::{trade_value, value_to_cash_floor, ClearingState, RECENT_TRADES_MAX};

/// The upper 16 bits of every clearing run's client id, so that a run's keys never meet a
/// gateway link's or a load generator's (which number from small ids or carry an epoch).
pub const CLEARING_CLIENT_ID_TAG: u64 = 0xC1EA << 48;

/// The client id under which run `run_id` submits its movements to core `core`: a function
/// of both alone, so that a restarted run submits under the same keys.
pub fn run_client_id(run_id: u32, core: usize) -> u64 {
    CLEARING_CLIENT_ID_TAG | (u64::from(run_id) << 16) | (core as u64 & 0xFFFF)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    Intermediate,
    EndOfDay,
}

/// How a run fixes settlement prices: the volume-weighted average of the last `last_trades`
/// trades of the instrument before the cut, counting only those within `window_ns` of the
/// newest one when a window is given (the newest trade always counts, so an instrument that
/// traded has a price: at worst its last trade's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettlementRule {
    pub last_trades: usize,
    #[serde(default)]
    pub window_ns: Option<u64>,
}

impl Default for SettlementRule {
    fn default() -> SettlementRule {
        SettlementRule {
            last_trades: 100,
            window_ns: None,
        }
    }
}

impl SettlementRule {
    pub fn check(&self) -> Result<(), String> {
        if self.last_trades == 0 || self.last_trades > RECENT_TRADES_MAX {
            return Err(format!(
                "last_trades must be in 1..={RECENT_TRADES_MAX}, not {}",
                self.last_trades
            ));
        }
        Ok(())
    }
}

/// Variation margin on one futures position in one run: what the account receives
/// (positive) or pays. Every position open at the cut has a line (its `vm` may be 0), so the
/// plan also records the positions a run cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarginLine {
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub qty: i64,
    pub vm: Cash,
}

/// Equity or FX obligations of one account in one instrument since the previous run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObligationLine {
    pub account: AccountId,
    pub instrument: InstrumentId,
    /// Units of the underlying to receive (positive) or deliver.
    pub securities: i64,
    /// Cash to receive (positive) or pay.
    pub cash: Cash,
    /// The business day it settles, `YYYY-MM-DD` (`settlement`): the run's trade date plus
    /// the instrument's cycle; none in a plan computed without a calendar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settlement_date: Option<String>,
}

/// One position as an end-of-day run's cut leaves it: the next clearing business day starts
/// from it (`ClearingPosition::sod`). Amounts in the instrument's value units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollLine {
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub qty: i64,
    pub paid_value: i128,
    pub realised_value: i128,
    pub lots_bought: i64,
    pub lots_sold: i64,
}

/// One cash movement fed back to a core: the account's net variation margin on that core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Movement {
    pub core: usize,
    /// The request seq under the run's client id for this core (1, 2, 3, ... per core).
    pub seq: u64,
    pub account: AccountId,
    /// Positive: a deposit; negative: a withdrawal of its absolute value.
    pub amount: Cash,
}

impl Movement {
    /// The command that makes the movement, stamped `ts_ns` (the cut's time).
    pub fn command(&self, ts_ns: u64) -> Command {
        let body = if self.amount.0 >= 0 {
            CommandBody::Deposit {
                account: self.account,
                amount: self.amount,
            }
        } else {
            // Not a `Withdraw`: the core refuses an account's withdrawals while it has a
            // margin call open, but the house's collection of what the account owes must go
            // through (and, unpaid, raises the call instead).
            CommandBody::ClearingDebit {
                account: self.account,
                amount: Cash(-self.amount.0),
            }
        };
        Command::new(ts_ns, body)
    }
}

/// A debt a run collects: cash an earlier run's debit could not take from the account on
/// that core (`ClearingState::debts`), debited again in the account's net movement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebtLine {
    pub core: usize,
    pub account: AccountId,
    /// What is owed, positive.
    pub amount: Cash,
}

/// An account's initial margin on one core at a run's cut, against its collateral there, and
/// the margin call the run issues. Amounts in cash units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitialMarginLine {
    pub core: usize,
    pub account: AccountId,
    /// Over the account's futures on the core: |lots| × initial margin per lot
    /// (`ClearingState::initial_margins`).
    pub initial_margin: Cash,
    /// The account's cash on the core once the run's movements are applied.
    pub collateral: Cash,
    /// What the run calls: `initial_margin - collateral` where that is positive, else 0.
    pub call: Cash,
    /// The seq of the run's `MarginCall` command for this line on its core (after the
    /// core's movements), or 0 when the run sends none: nothing to call and no call open.
    pub seq: u64,
}

impl InitialMarginLine {
    /// The margin call command of the line, if the run sends one.
    pub fn command(&self, ts_ns: u64) -> Option<Command> {
        (self.seq != 0).then(|| {
            let body = CommandBody::MarginCall {
                account: self.account,
                amount: self.call,
            };
            Command::new(ts_ns, body)
        })
    }
}

/// Everything a run decides, fixed before anything is submitted (and saved, so that a
/// restarted run submits exactly this again).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunPlan {
    pub run_id: u32,
    pub kind: RunKind,
    pub rule: SettlementRule,
    /// Per core, the stream position the run cleared up to (exclusive).
    pub cut: Vec<u64>,
    /// The time stamp of the newest event before the cut; the movements carry it.
    pub cut_ts_ns: u64,
    /// The clearing state's hash at the cut.
    pub state_hash: u64,
    pub prices: BTreeMap<InstrumentId, Price>,
    pub margin: Vec<MarginLine>,
    /// Per instrument, what rounding the accounts' margin to cash left with the clearing
    /// house (minus the sum of the instrument's margin lines; 0 when the instrument's prices
    /// have at most `CASH_SCALE` decimals; such an instrument has no entry).
    pub rounding: BTreeMap<InstrumentId, Cash>,
    pub obligations: Vec<ObligationLine>,
    pub movements: Vec<Movement>,
    /// The schedule's time (ns since the Unix epoch) this run was due at, for a run the
    /// venue's schedule asked for: a restarted node finds it and runs that slot no second time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_ns: Option<u64>,
    /// The fee schedule the run charged with (none: no fees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee_schedule: Option<FeeSchedule>,
    /// The fees charged, per account and instrument with a non-zero fee; each is debited to
    /// the account and credited to the schedule's venue account on the same core (in the
    /// movements).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fees: Vec<FeeLine>,
    /// The business day the run's obligations were traded on, `YYYY-MM-DD` (`settlement`);
    /// none in a plan computed without a calendar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trade_date: Option<String>,
    /// End of day: the business day after the trade date, `YYYY-MM-DD`, that settling the
    /// run rolls the state to; none in a plan computed without a calendar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_business_date: Option<String>,
    /// End of day: every position at the cut, which the next business day starts from (in
    /// the plan, not read from the state when settling, so that a standby settling the run
    /// after later trades rolls to the cut's positions all the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roll: Vec<RollLine>,
    /// Per core and account with initial margin or a margin call open at the cut: the
    /// initial margin, the collateral after the movements and the call, by (core, account).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub initial_margin: Vec<InitialMarginLine>,
    /// The debts the run collects (every one open at the cut), in its movements: the
    /// movements, the rounding and these sum to zero.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub debts: Vec<DebtLine>,
}

impl RunPlan {
    /// The commands the run submits to `core`, in seq order (1, 2, 3, ...): its movements,
    /// then its margin calls (each after the cash it is measured against has moved), then,
    /// at the end of the day, the engine's `EndOfDay` (Day orders expire), so that every
    /// command of a run, the day's close included, is keyed and applied once.
    pub fn commands(&self, core: usize) -> Vec<(u64, Command)> {
        let mut out: Vec<(u64, Command)> = self
            .movements
            .iter()
            .filter(|m| m.core == core)
            .map(|m| (m.seq, m.command(self.cut_ts_ns)))
            .collect();
        let mut calls: Vec<(u64, Command)> = self
            .initial_margin
            .iter()
            .filter(|l| l.core == core)
            .filter_map(|l| Some((l.seq, l.command(self.cut_ts_ns)?)))
            .collect();
        calls.sort_by_key(|c| c.0);
        out.extend(calls);
        if self.kind == RunKind::EndOfDay {
            let seq = out.len() as u64 + 1;
            out.push((seq, Command::new(self.cut_ts_ns, CommandBody::EndOfDay)));
        }
        out
    }
}

/// The settlement price of every instrument that traded, by `rule`.
pub fn settlement_prices(
    state: &ClearingState,
    rule: &SettlementRule,
) -> BTreeMap<InstrumentId, Price> {
    let mut prices = BTreeMap::new();
    for (&id, s) in state.instruments() {
        let Some(newest) = s.recent.back() else {
            continue;
        };
        let mut value: i128 = 0;
        let mut lots: i128 = 0;
        for t in s.recent.iter().rev().take(rule.last_trades) {
            if let Some(w) = rule.window_ns {
                if newest.ts_ns.saturating_sub(t.ts_ns) > w {
                    break;
                }
            }
            value += t.price.0 as i128 * t.qty as i128;
            lots += t.qty as i128;
        }
        let vwap = round_half_up(value, lots);
        let tick = state.definition(id).map_or(1, |d| d.tick.0 as i128);
        prices.insert(id, Price(round_half_up(vwap, tick) as i64 * tick as i64));
    }
    prices
}

/// `num / den` rounded to the nearest integer, halves up (`num`, `den` positive).
fn round_half_up(num: i128, den: i128) -> i128 {
    (2 * num + den).div_euclid(2 * den)
}

/// Computes run `run_id` on `state` (which stands at the run's cut), charging no fees.
/// Pure: the same state, rule and id give the same plan.
pub fn compute_run(
    state: &ClearingState,
    run_id: u32,
    kind: RunKind,
    rule: &SettlementRule,
) -> RunPlan {
    compute_run_with_fees(state, run_id, kind, rule, None)
}

/// The fees due on `state`'s bases at `schedule`, one line per account and instrument with a
/// non-zero fee.
pub fn fee_lines(state: &ClearingState, schedule: &FeeSchedule) -> Vec<FeeLine> {
    let mut out = Vec::new();
    for (&(account, instrument), base) in state.fee_bases() {
        let Some(def) = state.definition(instrument) else {
            continue;
        };
        let Some(rate) = schedule.rate_of(def) else {
            continue;
        };
        let fee = base.fee(def, rate);
        if fee != 0 {
            let core = state.instruments().get(&instrument).map_or(0, |s| s.core);
            out.push(FeeLine {
                account,
                instrument,
                core,
                base,
                fee: Cash(fee),
            });
        }
    }
    out
}

/// [`compute_run`] that also charges the fees of `fees` (see `fees`): each account's net
/// movement on a core is its variation margin less its fees, and the venue's account
/// receives the fees, so the movements and the rounding still sum to zero.
pub fn compute_run_with_fees(
    state: &ClearingState,
    run_id: u32,
    kind: RunKind,
    rule: &SettlementRule,
    fees: Option<&FeeSchedule>,
) -> RunPlan {
    let prices = settlement_prices(state, rule);
    let mut margin = Vec::new();
    let mut rounding = BTreeMap::new();
    let mut obligations = Vec::new();
    let mut net: BTreeMap<(usize, AccountId), i128> = BTreeMap::new();
    for (&(account, instrument), p) in state.positions() {
        let Some(def) = state.definition(instrument) else {
            continue;
        };
        let core = state.instruments().get(&instrument).map_or(0, |s| s.core);
        if def.market == Market::Futures {
            let Some(&price) = prices.get(&instrument) else {
                continue;
            };
            // Total P&L since the position opened, marked to the settlement price, minus
            // what earlier runs paid: value sums to zero over the accounts of an instrument
            // exactly, so the rounding to cash below is all that can leave a remainder.
            let marked =
                trade_value(def, price, p.qty).expect("a position's value fits") - p.paid_value;
            let vm = value_to_cash_floor(def, marked) - p.vm_paid.0;
            *rounding.entry(instrument).or_insert(0i128) -= vm;
            // An open position has its line even when it owes nothing: the line records
            // the position at the cut (an end-of-day report reads it).
            if vm != 0 || p.qty != 0 {
                margin.push(MarginLine {
                    account,
                    instrument,
                    qty: p.qty,
                    vm: Cash(vm),
                });
                *net.entry((core, account)).or_default() += vm;
            }
        } else if p.securities_due != 0 || p.cash_due.0 != 0 {
            obligations.push(ObligationLine {
                account,
                instrument,
                securities: p.securities_due,
                cash: p.cash_due,
                settlement_date: None,
            });
        }
    }
    let roll = if kind == RunKind::EndOfDay {
        state
            .positions()
            .iter()
            .map(|(&(account, instrument), p)| RollLine {
                account,
                instrument,
                qty: p.qty,
                paid_value: p.paid_value,
                realised_value: p.realised_value,
                lots_bought: p.lots_bought,
                lots_sold: p.lots_sold,
            })
            .collect()
    } else {
        Vec::new()
    };
    let fee_lines = fees.map(|f| fee_lines(state, f)).unwrap_or_default();
    if let Some(schedule) = fees {
        let venue = AccountId(schedule.venue_account);
        for l in &fee_lines {
            *net.entry((l.core, l.account)).or_default() -= l.fee.0;
            *net.entry((l.core, venue)).or_default() += l.fee.0;
        }
    }
    // What earlier runs could not collect is debited again: the account owes it on top of
    // this run's margin and fees, and its collateral is what is left once it is paid.
    let debts: Vec<DebtLine> = state
        .debts()
        .iter()
        .map(|(&(core, account), &amount)| DebtLine {
            core,
            account,
            amount,
        })
        .collect();
    for d in &debts {
        *net.entry((d.core, d.account)).or_default() -= d.amount.0;
    }
    let movements = movements(net.clone());
    let initial_margin = initial_margin_lines(state, &net, &movements);
    RunPlan {
        run_id,
        kind,
        rule: *rule,
        cut: state.cut().to_vec(),
        cut_ts_ns: state.last_ts_ns(),
        state_hash: state.state_hash(),
        prices,
        margin,
        // Only what rounding kept: an instrument whose margin rounded exactly has no entry,
        // so the plan does not depend on whether flat positions were dropped at a roll.
        rounding: rounding
            .into_iter()
            .filter(|&(_, c)| c != 0)
            .map(|(i, c)| (i, Cash(c)))
            .collect(),
        obligations,
        movements,
        scheduled_ns: None,
        fee_schedule: fees.cloned(),
        fees: fee_lines,
        trade_date: None,
        next_business_date: None,
        roll,
        initial_margin,
        debts,
    }
}

/// The initial margin lines of a run (see [`InitialMarginLine`]): one per core and account
/// with initial margin at the cut or a call open there. The collateral is the cash the core
/// had at the cut plus the account's net movement `net`. A line gets a `MarginCall` when it
/// calls something or closes the call open (amount 0), numbered per core after that core's
/// `movements`, by account.
fn initial_margin_lines(
    state: &ClearingState,
    net: &BTreeMap<(usize, AccountId), i128>,
    movements: &[Movement],
) -> Vec<InitialMarginLine> {
    let mut keys: BTreeMap<(usize, AccountId), i128> = state.initial_margins();
    for (&key, c) in state.cash() {
        if c.margin_called.0 != 0 {
            keys.entry(key).or_insert(0);
        }
    }
    let mut seq_of_core: BTreeMap<usize, u64> = BTreeMap::new();
    for m in movements {
        let seq = seq_of_core.entry(m.core).or_insert(0);
        *seq = (*seq).max(m.seq);
    }
    let mut lines = Vec::new();
    for ((core, account), im) in keys {
        let at_cut = state
            .cash()
            .get(&(core, account))
            .copied()
            .unwrap_or_default();
        let collateral = at_cut.cash.0 + net.get(&(core, account)).copied().unwrap_or(0);
        let call = (im - collateral).max(0);
        let seq = if call != 0 || at_cut.margin_called.0 != 0 {
            let seq = seq_of_core.entry(core).or_insert(0);
            *seq += 1;
            *seq
        } else {
            0
        };
        lines.push(InitialMarginLine {
            core,
            account,
            initial_margin: Cash(im),
            collateral: Cash(collateral),
            call: Cash(call),
            seq,
        });
    }
    lines
}

/// Net amounts per core and account as movements: per core the withdrawals first (so that
/// the losers' cash is taken before the winners' is credited), each group by account, then
/// numbered 1, 2, 3, ... per core.
fn movements(net: BTreeMap<(usize, AccountId), i128>) -> Vec<Movement> {
    let mut list: Vec<Movement> = net
        .into_iter()
        .filter(|&(_, amount)| amount != 0)
        .map(|((core, account), amount)| Movement {
            core,
            seq: 0,
            account,
            amount: Cash(amount),
        })
        .collect();
    list.sort_by_key(|m| (m.core, m.amount.0 > 0, m.account));
    let mut seq_of_core: BTreeMap<usize, u64> = BTreeMap::new();
    for m in &mut list {
        let seq = seq_of_core.entry(m.core).or_insert(0);
        *seq += 1;
        m.seq = *seq;
    }
    list
}

/// The run id a client id belongs to, if it is a clearing run's (see [`run_client_id`]).
pub fn run_of_client_id(client_id: u64) -> Option<u32> {
    (client_id & (0xFFFF << 48) == CLEARING_CLIENT_ID_TAG).then_some((client_id >> 16) as u32)
}
