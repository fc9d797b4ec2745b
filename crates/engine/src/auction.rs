//! Call auctions and the volatility interruption (`docs/engine-jsonl.md`, "Call auctions").
//!
//! In a call phase (`Phase::OpeningAuction`, `ClosingAuction`, `VolatilityAuction`) orders
//! rest in the book without matching, so the book may be crossed. Leaving the phase uncrosses
//! it at one price, chosen among the candidate prices (the limit prices of the crossed region
//! and the reference price) by, in order:
//!
//! 1. the largest executable quantity;
//! 2. the least surplus (the quantity left unmatched at that price);
//! 3. market pressure: if every remaining candidate leaves a surplus of buys, the highest;
//!    if every one leaves a surplus of sells, the lowest;
//! 4. the price nearest the reference price (the last trade price, else the instrument's);
//! 5. the higher of two prices equally near it.
//!
//! The orders execute in price-time priority at that price; every trade is marked `auction`.
//! A market order is a limit order at the band edge fixed on arrival (as in continuous
//! trading): it takes part at every price in the band, its band-edge level is not a candidate
//! price of its own, and what it does not execute is cancelled after the uncrossing, as is
//! whatever orders valid for one auction (at the opening, at the close, good for auction) did
//! not execute. Self-trade prevention does not apply at the uncrossing.
//!
//! Only the crossed region of the book is read: the bid levels at or above the best ask and
//! the ask levels at or below the best bid (a price outside it executes nothing, since one
//! side has nothing there), level by level through their totals. Nothing here reads a clock
//! or iterates a hash map; the buffers are kept and reused.

use crate::book::{AuctionState, Book, Uncross, NIL};
use crate::Engine;
use bourse_core::*;

/// The reused buffers of the uncrossing.
#[derive(Default)]
pub(crate) struct Buffers {
    /// The orders that execute and how much, in priority order.
    buys: Vec<(u32, i64)>,
    sells: Vec<(u32, i64)>,
}

/// Whether an order with time in force `tif` may enter in `phase` (which admits orders): at
/// the opening only in the opening auction, at the close only in the closing auction, good
/// for auction in any auction, IOC and FOK never in one.
pub(crate) fn tif_admits(phase: Phase, tif: TimeInForce) -> Result<(), RejectReason> {
    let ok = match tif {
        TimeInForce::AtOpening => phase == Phase::OpeningAuction,
        TimeInForce::AtClose => phase == Phase::ClosingAuction,
        TimeInForce::GoodForAuction => phase.is_auction(),
        TimeInForce::Ioc | TimeInForce::Fok => !phase.is_auction(),
        TimeInForce::Day | TimeInForce::Gtc | TimeInForce::Gtd => true,
    };
    if ok {
        Ok(())
    } else {
        Err(RejectReason::TimeInForceNotInPhase)
    }
}

/// The prices continuous trading may trade at without a volatility interruption: within the
/// dynamic band around the last trade price and the static band around the static reference.
/// The widest bounds when the instrument has no guard.
#[inline]
pub(crate) fn guard_bounds(book: &Book) -> (i64, i64) {
    let g = book.def.volatility;
    if g.is_off() {
        return (i64::MIN, i64::MAX);
    }
    let (mut low, mut high) = (i64::MIN, i64::MAX);
    for (bps, reference) in [
        (g.dynamic_bps, book.def.reference_price.0),
        (g.static_bps, book.auction.static_ref),
    ] {
        if bps > 0 {
            // |p - r| * 10^4 <= r * bps, with |p - r| whole: |p - r| <= floor(r * bps / 10^4).
            let width = (reference as i128 * bps as i128 / BAND_BPS_MAX as i128) as i64;
            low = low.max(reference - width);
            high = high.min(reference + width);
        }
    }
    (low, high)
}

/// Whether an uncrossing price is within the guard's bands (always, without a guard).
fn within_guard(book: &Book, price: i64) -> bool {
    let g = book.def.volatility;
    VolatilityGuard::within(g.dynamic_bps, book.def.reference_price, Price(price))
        && VolatilityGuard::within(g.static_bps, Price(book.auction.static_ref), Price(price))
}

impl Engine {
    // ----- queries -----

    /// The official close of an instrument: the price of its last closing auction (with
    /// nothing executed there, the reference price at that time); None before the first.
    pub fn closing_price(&self, id: InstrumentId) -> Option<Price> {
        let &b = self.book_index.get(&id)?;
        let close = self.books[b as usize].auction.close;
        (close != 0).then_some(Price(close))
    }

    /// The indicative uncrossing of an instrument's book as it stands (in any phase): price,
    /// executable quantity and surplus (positive: buys left over); None without a cross.
    pub fn indicative_uncross(&self, id: InstrumentId) -> Option<(Price, Qty, i64)> {
        let &b = self.book_index.get(&id)?;
        let u = uncross_price(&self.books[b as usize]);
        (u.qty > 0).then_some((Price(u.price), Qty(u.qty), u.surplus))
    }

    /// The end of the volatility auction an instrument is in (None: none, or no timer).
    pub fn volatility_auction_end(&self, id: InstrumentId) -> Option<u64> {
        let &b = self.book_index.get(&id)?;
        let end = self.books[b as usize].auction.end_ns;
        (end != 0).then_some(end)
    }

    /// The static reference of an instrument's volatility guard.
    pub fn static_reference(&self, id: InstrumentId) -> Option<Price> {
        let &b = self.book_index.get(&id)?;
        Some(Price(self.books[b as usize].auction.static_ref))
    }

    // ----- order entry in a call -----

    /// Rests the (not resting) order in `slot` in its book, which is in a call auction, and
    /// publishes the indicative uncrossing if it changed.
    pub(crate) fn rest_in_call(&mut self, slot: u32, is_new: bool, ts: u64, out: &mut Vec<Event>) {
        let (book, filled) = {
            let o = self.pool.get(slot);
            (o.book, o.qty_filled)
        };
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
        self.publish_indicative(book, ts, out);
    }

    /// Publishes the indicative uncrossing of book `b` (in a call auction) if it differs from
    /// the one last published.
    pub(crate) fn publish_indicative(&mut self, b: u32, ts: u64, out: &mut Vec<Event>) {
        let u = uncross_price(&self.books[b as usize]);
        let book = &mut self.books[b as usize];
        if u == book.auction.indicative {
            return;
        }
        book.auction.indicative = u;
        let instrument = book.def.instrument;
        self.digest_auction(b);
        out.push(Event::AuctionIndicative {
            instrument,
            price: Price(u.price),
            qty: Qty(u.qty),
            surplus: Qty(u.surplus.abs()),
            surplus_side: match u.surplus.signum() {
                1 => Some(Side::Buy),
                -1 => Some(Side::Sell),
                _ => None,
            },
            ts_ns: ts,
        });
    }

    /// Publishes the indicative uncrossing of every book in a call auction that changed (after
    /// a sweep: mass cancel, kill switch, end of day).
    pub(crate) fn publish_all_indicative(&mut self, ts: u64, out: &mut Vec<Event>) {
        for b in 0..self.books.len() as u32 {
            if self.books[b as usize].phase.is_auction() {
                self.publish_indicative(b, ts, out);
            }
        }
    }

    // ----- phases -----

    /// `SetPhase` for one book: leaving a call auction for another phase uncrosses it first.
    pub(crate) fn change_phase(&mut self, b: u32, phase: Phase, ts: u64, out: &mut Vec<Event>) {
        let old = self.books[b as usize].phase;
        if old.is_auction() && phase != old {
            self.uncross(b, ts, out);
        }
        self.books[b as usize].phase = phase;
        self.digest_book(b);
        out.push(Event::PhaseChanged {
            instrument: self.books[b as usize].def.instrument,
            phase,
            ts_ns: ts,
        });
    }

    /// An order would have traded at `price`, outside the guard's bands: book `b` goes into a
    /// volatility auction of the guard's length.
    pub(crate) fn start_volatility_auction(
        &mut self,
        b: u32,
        price: i64,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        let book = &mut self.books[b as usize];
        let end = ts.saturating_add(book.def.volatility.auction_ns);
        book.phase = Phase::VolatilityAuction;
        book.auction.end_ns = end;
        let instrument = book.def.instrument;
        if let Err(at) = self.vi_books.binary_search(&b) {
            self.vi_books.insert(at, b);
        }
        self.digest_auction(b);
        out.push(Event::PhaseChanged {
            instrument,
            phase: Phase::VolatilityAuction,
            ts_ns: ts,
        });
        out.push(Event::VolatilityInterruption {
            instrument,
            price: Price(price),
            end_ns: end,
            extended: false,
            ts_ns: ts,
        });
    }

    /// Ends the volatility auctions due at `ts` (before the command stamped `ts` applies), in
    /// book order: one whose indicative price is within the guard's bands (or that has no
    /// cross) uncrosses and returns to continuous trading; the others are extended by the
    /// guard's length from `ts`.
    pub(crate) fn volatility_timers(&mut self, ts: u64, out: &mut Vec<Event>) {
        let mut i = 0;
        while i < self.vi_books.len() {
            let b = self.vi_books[i];
            let book = &self.books[b as usize];
            if book.auction.end_ns > ts {
                i += 1;
                continue;
            }
            let u = uncross_price(book);
            if u.qty == 0 || within_guard(book, u.price) {
                // `uncross` takes the book off the list.
                self.change_phase(b, Phase::Open, ts, out);
            } else {
                let book = &mut self.books[b as usize];
                let end = ts.saturating_add(book.def.volatility.auction_ns);
                book.auction.end_ns = end;
                let instrument = book.def.instrument;
                self.digest_auction(b);
                out.push(Event::VolatilityInterruption {
                    instrument,
                    price: Price(u.price),
                    end_ns: end,
                    extended: true,
                    ts_ns: ts,
                });
                i += 1;
            }
        }
    }

    // ----- the uncrossing -----

    /// Uncrosses book `b`, which is in a call auction: the trades at the uncrossing price,
    /// the `AuctionUncrossed` event, then the cancels of what may not outlive the auction.
    /// Leaves the phase to the caller.
    fn uncross(&mut self, b: u32, ts: u64, out: &mut Vec<Event>) {
        let mut bufs = std::mem::take(&mut self.auction_bufs);
        let u = uncross_price(&self.books[b as usize]);
        if u.qty > 0 {
            self.allocate(b, u, &mut bufs);
            let (mut i, mut j) = (0, 0);
            while i < bufs.buys.len() && j < bufs.sells.len() {
                let q = bufs.buys[i].1.min(bufs.sells[j].1);
                let (buy, sell) = (bufs.buys[i].0, bufs.sells[j].0);
                self.execute_auction(buy, sell, u.price, q, ts, out);
                bufs.buys[i].1 -= q;
                bufs.sells[j].1 -= q;
                if bufs.buys[i].1 == 0 {
                    self.after_auction_fill(buy, ts, out);
                    i += 1;
                }
                if bufs.sells[j].1 == 0 {
                    self.after_auction_fill(sell, ts, out);
                    j += 1;
                }
            }
            debug_assert!(i == bufs.buys.len() && j == bufs.sells.len());
            let book = &mut self.books[b as usize];
            book.set_reference(u.price);
            book.auction.static_ref = u.price;
        }
        self.auction_bufs = bufs;
        let book = &mut self.books[b as usize];
        let auction = book.phase;
        let price = if u.qty > 0 {
            u.price
        } else {
            book.def.reference_price.0
        };
        if auction == Phase::ClosingAuction {
            book.auction.close = price;
        }
        book.auction.end_ns = 0;
        book.auction.indicative = Uncross::default();
        let instrument = book.def.instrument;
        if let Ok(at) = self.vi_books.binary_search(&b) {
            self.vi_books.remove(at);
        }
        self.digest_auction(b);
        out.push(Event::AuctionUncrossed {
            instrument,
            auction,
            price: Price(price),
            qty: Qty(u.qty),
            ts_ns: ts,
        });
        // Market orders and orders for one auction do not outlive it.
        self.collect(Some(b), None, |o, _| o.market || o.tif.is_auction_only());
        let slots = std::mem::take(&mut self.scratch);
        for &slot in &slots {
            let reason = if self.pool.get(slot).market {
                CancelReason::MarketRemainder
            } else {
                CancelReason::AuctionUnexecuted
            };
            self.cancel_order(slot, reason, ts, out);
        }
        self.scratch = slots;
    }

    /// Lists in `bufs` the orders that execute at `u.price` and how much of each, in price-time
    /// priority, `u.qty` on each side.
    fn allocate(&self, b: u32, u: Uncross, bufs: &mut Buffers) {
        let book = &self.books[b as usize];
        for (side, list) in [(Side::Buy, &mut bufs.buys), (Side::Sell, &mut bufs.sells)] {
            list.clear();
            let mut left = u.qty;
            for level in book.side(side).iter().rev() {
                if left == 0 || !crate::book::crosses(side.opposite(), u.price, level.price) {
                    break;
                }
                let mut slot = level.head;
                while slot != NIL && left > 0 {
                    let o = self.pool.get(slot);
                    let q = o.qty_leaves.min(left);
                    list.push((slot, q));
                    left -= q;
                    slot = o.next;
                }
            }
            debug_assert_eq!(left, 0);
        }
    }

    /// One trade of the uncrossing between two resting orders. Their level totals follow at
    /// once; their places in the book are settled by [`Self::after_auction_fill`] once each
    /// has had all its fills.
    fn execute_auction(
        &mut self,
        buy: u32,
        sell: u32,
        price: i64,
        qty: i64,
        ts: u64,
        out: &mut Vec<Event>,
    ) {
        let book_idx = self.pool.get(buy).book;
        for slot in [buy, sell] {
            let o = self.pool.get_mut(slot);
            o.qty_filled += qty;
            o.qty_leaves -= qty;
            // The visible part goes first: an iceberg executes with its whole quantity.
            let shown = qty.min(o.qty_display);
            o.qty_display -= shown;
            let (side, level_price) = (o.side, o.price);
            let levels = self.books[book_idx as usize].side_mut(side);
            let li = levels
                .find(side, level_price)
                .expect("resting order without level");
            levels[li].qty_leaves -= qty;
            levels[li].qty_display -= shown;
        }
        self.settle(buy, price, qty);
        self.settle(sell, price, qty);
        let trade_id = TradeId(self.next_trade_id);
        self.next_trade_id += 1;
        self.counters.trades += 1;
        self.counters.volume_lots += qty as u128;
        let fill = |o: &crate::book::Order| Fill {
            order_id: o.id,
            account: self.accounts[o.account as usize].id,
            cl_ord_id: o.cl_ord_id,
            qty_leaves: Qty(o.qty_leaves),
            qty_filled: Qty(o.qty_filled),
        };
        let (b, s) = (self.pool.get(buy), self.pool.get(sell));
        out.push(Event::Trade {
            trade_id,
            instrument: self.books[book_idx as usize].def.instrument,
            price: Price(price),
            qty: Qty(qty),
            aggressor: if b.id > s.id { Side::Buy } else { Side::Sell },
            buy: fill(b),
            sell: fill(s),
            auction: true,
            ts_ns: ts,
        });
    }

    /// An order has had all its fills of the uncrossing: it leaves the book, shows its next
    /// part at the back of its level (an iceberg whose visible part executed), or stays.
    fn after_auction_fill(&mut self, slot: u32, ts: u64, out: &mut Vec<Event>) {
        let (book, leaves, display) = {
            let o = self.pool.get(slot);
            (o.book, o.qty_leaves, o.qty_display)
        };
        if leaves == 0 {
            self.books[book as usize].unlink(&mut self.pool, slot, None);
            self.order_log(slot, OrderLogAction::Delete, OrderStatus::Filled, ts, out);
            self.forget(slot);
            return;
        }
        if display == 0 {
            let b = &mut self.books[book as usize];
            b.unlink(&mut self.pool, slot, None);
            let o = self.pool.get_mut(slot);
            o.qty_display = o.display_for(o.qty_leaves);
            b.push_back(&mut self.pool, slot);
        } else {
            self.pool.rehash(slot);
        }
        self.order_log(
            slot,
            OrderLogAction::Change,
            OrderStatus::PartiallyFilled,
            ts,
            out,
        );
    }

    /// Rebuilds the list of books with a volatility auction timer (after a restore).
    pub(crate) fn rebuild_vi_books(&mut self) {
        self.vi_books = (0..self.books.len() as u32)
            .filter(|&b| {
                let book = &self.books[b as usize];
                book.phase == Phase::VolatilityAuction && book.auction.end_ns != 0
            })
            .collect();
    }
}

/// The auction state's invariants for one book; a description of the first violation.
pub(crate) fn check_state(book: &Book, a: &AuctionState) -> Result<(), String> {
    let id = book.def.instrument;
    if a.static_ref <= 0 || a.close < 0 {
        return Err(format!("instrument {id}: impossible auction prices"));
    }
    if a.end_ns != 0 && book.phase != Phase::VolatilityAuction {
        return Err(format!(
            "instrument {id}: a volatility auction end outside one"
        ));
    }
    if !book.phase.is_auction() && a.indicative != Uncross::default() {
        return Err(format!(
            "instrument {id}: an indicative price outside a call"
        ));
    }
    Ok(())
}

/// The uncrossing of a book as it stands (see the module documentation); all 0 without a
/// cross. Reads only the crossed region, level by level.
pub(crate) fn uncross_price(book: &Book) -> Uncross {
    let (Some(best_bid), Some(best_ask)) = (book.bids.last(), book.asks.last()) else {
        return Uncross::default();
    };
    let (bb, ba) = (best_bid.price, best_ask.price);
    if bb < ba {
        return Uncross::default();
    }
    // The crossed region, ascending: the bid levels at or above the best ask (the end of the
    // bid ladder, which is sorted worst to best, so ascending) and the ask levels at or below
    // the best bid (the end of the ask ladder, descending, read backwards). Placeholders (no
    // orders) are skipped.
    let bid_from = book.bids.find(Side::Buy, ba).unwrap_or_else(|i| i);
    let ask_from = book.asks.find(Side::Sell, bb).unwrap_or_else(|i| i);
    let bids = &book.bids[bid_from..];
    let asks = &book.asks[ask_from..];
    // The candidates ascending, by merging bids, asks and the reference price; with each, the
    // demand (bids at or above it) and the supply (asks at or below it). Linear in the
    // region's levels.
    let reference = book.def.reference_price.0;
    let mut rule = Rule::new(reference);
    let demand_total: i64 = bids.iter().map(|l| l.qty_leaves).sum();
    let mut below = 0i64; // bids below the current price
    let mut supply = 0i64; // asks at or below the current price
    let (mut bi, mut ai) = (0, asks.len()); // next bid, next ask (from the back)
    let mut reference_left = (ba..=bb).contains(&reference);
    loop {
        // The next price: the smallest of the next bid, the next ask and the reference.
        let mut p = i64::MAX;
        if bi < bids.len() {
            p = p.min(bids[bi].price);
        }
        if ai > 0 {
            p = p.min(asks[ai - 1].price);
        }
        if reference_left {
            p = p.min(reference);
        }
        if p == i64::MAX {
            break;
        }
        let mut candidate = reference_left && reference == p;
        if candidate {
            reference_left = false;
        }
        // Bids at p stay in the demand at p; they leave it above p.
        let mut bid_here = 0;
        if bi < bids.len() && bids[bi].price == p {
            bid_here = bids[bi].qty_leaves;
            candidate |= bids[bi].orders > bids[bi].market;
            bi += 1;
        }
        if ai > 0 && asks[ai - 1].price == p {
            ai -= 1;
            supply += asks[ai].qty_leaves;
            candidate |= asks[ai].orders > asks[ai].market;
        }
        if candidate {
            let demand = demand_total - below;
            rule.offer(p, demand.min(supply), demand - supply);
        }
        below += bid_here;
    }
    rule.result()
}

/// The price rule applied in one pass over candidates offered in ascending price order: it
/// keeps the largest volume, then the least surplus, and for the candidates tied on both
/// whether all leave buys (then the highest wins), all leave sells (the lowest), or else the
/// one nearest the reference (of two equally near, the higher: the later one).
struct Rule {
    reference: i64,
    found: bool,
    volume: i64,
    least: i64,
    all_buys: bool,
    all_sells: bool,
    lowest: Uncross,
    highest: Uncross,
    nearest: Uncross,
    distance: u64,
}

impl Rule {
    fn new(reference: i64) -> Rule {
        Rule {
            reference,
            found: false,
            volume: 0,
            least: 0,
            all_buys: false,
            all_sells: false,
            lowest: Uncross::default(),
            highest: Uncross::default(),
            nearest: Uncross::default(),
            distance: 0,
        }
    }

    #[inline]
    fn offer(&mut self, price: i64, qty: i64, surplus: i64) {
        if qty <= 0 {
            return;
        }
        let u = Uncross {
            price,
            qty,
            surplus,
        };
        let distance = (price - self.reference).unsigned_abs();
        let least = surplus.abs();
        if !self.found || qty > self.volume || (qty == self.volume && least < self.least) {
            *self = Rule {
                reference: self.reference,
                found: true,
                volume: qty,
                least,
                all_buys: surplus > 0,
                all_sells: surplus < 0,
                lowest: u,
                highest: u,
                nearest: u,
                distance,
            };
        } else if qty == self.volume && least == self.least {
            self.all_buys &= surplus > 0;
            self.all_sells &= surplus < 0;
            self.highest = u;
            if distance <= self.distance {
                self.nearest = u;
                self.distance = distance;
            }
        }
    }

    fn result(&self) -> Uncross {
        if !self.found {
            Uncross::default()
        } else if self.all_buys {
            self.highest
        } else if self.all_sells {
            self.lowest
        } else {
            self.nearest
        }
    }
}

/// Applies the price rule to candidates (price, volume, surplus), ascending by price.
#[cfg(test)]
fn choose(c: &[(i64, i64, i64)], reference: i64) -> Uncross {
    let mut rule = Rule::new(reference);
    for &(price, qty, surplus) in c {
        rule.offer(price, qty, surplus);
    }
    rule.result()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_two_prices_equally_near_the_reference_the_higher_wins() {
        // Rule 5 cannot arise from a book (the reference price is a candidate itself when it
        // lies between two), but the rule is total: here the reference is no candidate.
        let c = [(9_990, 10, 0), (10_010, 10, 0)];
        assert_eq!(choose(&c, 10_000).price, 10_010);
        assert_eq!(choose(&c, 9_999).price, 9_990);
        assert_eq!(choose(&[(9_990, 0, 5)], 10_000), Uncross::default());
    }
}
