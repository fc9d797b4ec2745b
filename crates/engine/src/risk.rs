//! Accounts, positions and the reservations that pre-trade risk makes against them.
//!
//! An account's free cash is `cash - reserved_cash - margin_locked`. Every live order holds a
//! reservation that covers the worst the order can cost if it fills completely at its limit
//! price (equities and FX: the notional, rounded up; futures: initial margin per contract),
//! and sells of equities or FX hold back position instead of cash where the account has it.
//! The engine keeps the invariant that free cash is never negative: a new order or a replace
//! is admitted only if its extra reservation fits, and every fill releases at least as much
//! as it costs (trades settle at the resting price, rounded down, which is never more than
//! the reservation made at the limit price, rounded up). Futures are margined per position,
//! open orders included ([`futures_margin`]), rather than per order.

use bourse_core::{
    AccountId, FirmId, Instrument, Market, Price, Qty, RejectReason, Side, StpMode, StpScope,
    CASH_AMOUNT_MAX, POSITION_MAX,
};

/// One account's holding of one instrument.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// Index of the book (instrument) in the engine's book table.
    pub book: u32,
    /// Net quantity in lots: positive long, negative short.
    pub qty: i64,
    /// Lots held back by open sell orders (covered sells).
    pub sell_reserved: i64,
    /// Open quantity of the account's buy orders in this instrument (for the position limit).
    pub buy_open: i64,
    /// Open quantity of the account's sell orders in this instrument.
    pub sell_open: i64,
    /// Net cash paid for the position (negative when proceeds exceed cost), in cash units.
    /// Kept as two 64-bit halves so that the struct needs 8-byte alignment, not 16: a core
    /// may hold 100,000,000 positions and each byte here is 100 MB there.
    cost: [u64; 2],
}

impl Position {
    pub fn new(book: u32) -> Position {
        Position {
            book,
            ..Position::default()
        }
    }
    pub fn cost(&self) -> i128 {
        ((self.cost[1] as u128) << 64 | self.cost[0] as u128) as i128
    }
    pub fn set_cost(&mut self, cost: i128) {
        self.cost = [cost as u128 as u64, ((cost as u128) >> 64) as u64];
    }
    pub fn add_cost(&mut self, delta: i128) {
        self.set_cost(self.cost() + delta);
    }

    /// Lots an additional sell may use without going short.
    pub fn free_qty(&self) -> i64 {
        (self.qty - self.sell_reserved).max(0)
    }
}

#[derive(Clone, Debug)]
pub struct Account {
    pub id: AccountId,
    pub firm: FirmId,
    pub may_short: bool,
    pub stp: StpMode,
    pub stp_scope: StpScope,
    pub cash: i128,
    pub reserved_cash: i128,
    /// Initial margin locked by open futures positions.
    pub margin_locked: i128,
    /// Positions sorted by book index.
    pub positions: Vec<Position>,
    /// The account's key in the state digest (a hash of its index, id, firm and settings,
    /// fixed once it is added; see `crate::digest`).
    pub(crate) digest_key: u64,
}

impl Account {
    pub fn free_cash(&self) -> i128 {
        self.cash - self.reserved_cash - self.margin_locked
    }

    pub fn position(&self, book: u32) -> Option<&Position> {
        self.positions
            .binary_search_by_key(&book, |p| p.book)
            .ok()
            .map(|i| &self.positions[i])
    }

    /// The position in `book`, created empty on first use. Creating one allocates only when
    /// an account trades an instrument for the first time, not per order.
    pub fn position_mut(&mut self, book: u32) -> &mut Position {
        self.position_entry(book).0
    }

    /// The position in `book` and whether it was created just now (see
    /// [`Account::position_mut`]).
    pub fn position_entry(&mut self, book: u32) -> (&mut Position, bool) {
        let (index, created) = match self.positions.binary_search_by_key(&book, |p| p.book) {
            Ok(i) => (i, false),
            Err(i) => {
                if self.positions.len() == self.positions.capacity() {
                    // Grow by a quarter rather than doubling: positions are many and small,
                    // and doubling would leave up to half of their memory unused.
                    let extra = (self.positions.len() / 4).max(2);
                    self.positions.reserve_exact(extra);
                }
                self.positions.insert(i, Position::new(book));
                (i, true)
            }
        };
        (&mut self.positions[index], created)
    }
}

/// Initial margin a futures position locks, open orders included: enough for the worse of
/// "every open buy fills" and "every open sell fills". Netting this way lets an order that
/// reduces the position go in without extra margin, and a fill can never raise the figure
/// (the position after a fill lies between the two extremes).
pub fn futures_margin(initial_margin: i128, p: &Position) -> i128 {
    let if_buys_fill = (p.qty as i128 + p.buy_open as i128).abs();
    let if_sells_fill = (p.qty as i128 - p.sell_open as i128).abs();
    initial_margin * if_buys_fill.max(if_sells_fill)
}

/// Whether an order of `side` with `leaves` open lots (replacing one with `old_leaves`, 0
/// for a new order) can only bring the position towards zero: even if it and every other
/// open order of its side fill, the position does not cross zero. What a margin call lets
/// through; an order on a flat position never qualifies.
pub fn reduces_exposure(pos: &Position, side: Side, leaves: i64, old_leaves: i64) -> bool {
    let (open, held) = match side {
        Side::Sell => (pos.sell_open as i128, pos.qty as i128),
        Side::Buy => (pos.buy_open as i128, -(pos.qty as i128)),
    };
    held > 0 && open + leaves as i128 - old_leaves as i128 <= held
}

/// What a live order holds back from its account.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    pub reserved_cash: i128,
    pub reserved_pos: i64,
    /// Open quantity (counted in the position's open buys or sells).
    pub leaves: i64,
}

/// Pre-trade risk for an order of `side` with `leaves` open lots at `price` that replaces
/// `old` (all zero for a new order): the position limit, covered sells, the arithmetic bounds
/// and collateral. Returns what the order must hold, or the reason it cannot go in. Changes
/// nothing: the caller moves the reservations (futures margin follows the position's open
/// quantities through `Engine::change_position`).
#[allow(clippy::too_many_arguments)]
pub fn admit(
    def: &Instrument,
    account: &Account,
    pos: &Position,
    side: Side,
    price: i64,
    leaves: i64,
    old: Holding,
) -> Result<Holding, RejectReason> {
    let open_delta = leaves - old.leaves;
    match side {
        Side::Buy => {
            if pos.qty as i128 + (pos.buy_open + open_delta) as i128 > POSITION_MAX as i128 {
                return Err(RejectReason::PositionLimit);
            }
        }
        Side::Sell => {
            if (pos.qty as i128 - (pos.sell_open + open_delta) as i128) < -(POSITION_MAX as i128) {
                return Err(RejectReason::PositionLimit);
            }
        }
    }
    let reserved_pos = match (def.market, side) {
        (Market::Equity | Market::Fx, Side::Sell) => {
            // The position the order already holds counts as free for its own replacement.
            let available = (pos.qty - pos.sell_reserved + old.reserved_pos).max(0);
            let covered = available.min(leaves);
            if covered < leaves && !account.may_short {
                return Err(RejectReason::InsufficientPosition);
            }
            covered
        }
        _ => 0,
    };
    let reserved_cash = cash_required(def, side, price, leaves, reserved_pos)
        .filter(|c| *c <= CASH_AMOUNT_MAX)
        .ok_or(RejectReason::Overflow)?;
    // The whole value of what can still trade must fit too: futures and covered sells reserve
    // no notional, yet settlement computes each trade's value, which is at most this (a trade
    // is at the resting order's price for no more than the open quantity).
    def.notional_ceil(Price(price), Qty(leaves))
        .filter(|v| *v <= CASH_AMOUNT_MAX)
        .ok_or(RejectReason::Overflow)?;
    let margin_delta = if def.market == Market::Futures {
        let mut after = *pos;
        match side {
            Side::Buy => after.buy_open += open_delta,
            Side::Sell => after.sell_open += open_delta,
        }
        futures_margin(def.initial_margin.0, &after) - futures_margin(def.initial_margin.0, pos)
    } else {
        0
    };
    if reserved_cash - old.reserved_cash + margin_delta > account.free_cash() {
        return Err(RejectReason::InsufficientCollateral);
    }
    Ok(Holding {
        reserved_cash,
        reserved_pos,
        leaves,
    })
}

/// Whether two accounts count as "self" for the incoming account's self-trade prevention.
pub fn is_self_trade(incoming: &Account, resting: &Account) -> bool {
    if incoming.stp == StpMode::None {
        return false;
    }
    match incoming.stp_scope {
        StpScope::Account => incoming.id == resting.id,
        StpScope::Firm => incoming.firm == resting.firm,
    }
}

/// Cash an order must hold for `leaves` open lots at `price`, of which `reserved_pos` lots are
/// covered by position (sells of equities or FX). None if the amount overflows.
pub fn cash_required(
    def: &Instrument,
    side: Side,
    price: i64,
    leaves: i64,
    reserved_pos: i64,
) -> Option<i128> {
    debug_assert!(leaves >= 0 && reserved_pos >= 0 && reserved_pos <= leaves);
    match def.market {
        // Futures orders hold no cash of their own: their margin is counted per position by
        // [`futures_margin`], which nets buys against sells.
        Market::Futures => Some(0),
        Market::Equity | Market::Fx => {
            let uncovered = match side {
                Side::Buy => leaves,
                Side::Sell => leaves - reserved_pos,
            };
            if uncovered == 0 {
                return Some(0);
            }
            def.notional_ceil(bourse_core::Price(price), bourse_core::Qty(uncovered))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_is_small_and_keeps_its_cost_exactly() {
        // The capacity benchmark's per-position figure rests on this size.
        assert_eq!(std::mem::size_of::<Position>(), 56);
        let mut p = Position::new(3);
        for v in [0i128, -1, i64::MAX as i128 * 7, -(1i128 << 100), 12345] {
            p.set_cost(v);
            assert_eq!(p.cost(), v);
        }
        p.set_cost(10);
        p.add_cost(-25);
        assert_eq!(p.cost(), -15);
    }
}
