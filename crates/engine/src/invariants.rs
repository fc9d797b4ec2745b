//! A full consistency check of the engine's state. It walks everything, so it is for tests,
//! restores and operators, never for the order path.

use crate::book::{better, NIL};
use crate::risk::cash_required;
use crate::Engine;
use bourse_core::{Market, Side, TimeInForce};

impl Engine {
    /// Checks every invariant of the state; returns a description of the first violation.
    ///
    /// - Books: levels strictly sorted, the best level of each side live (placeholders only
    ///   behind it), best bid below best ask (never crossed, but in a call auction), level
    ///   totals (market orders counted too)
    ///   equal to the sums over their queues, queues doubly linked without breaks.
    /// - Orders: open quantity positive, visible quantity within the open quantity and the
    ///   iceberg's display size, total = filled + open, no IOC or FOK order resting, each
    ///   order reachable from exactly one lookup entry of each kind.
    /// - Accounts: reservations equal to the sum over their orders and never negative, free
    ///   cash never negative, futures margin equal to [`crate::risk::futures_margin`] summed over
    ///   the account's futures positions,
    ///   open buy and sell quantities equal to the sums over the orders.
    /// - State digest: every cached digest item (orders, accounts, books) equal to the item
    ///   recomputed from the state, and the maintained sums equal to a from-scratch
    ///   recomputation, so [`Engine::state_digest`] equals [`Engine::recompute_state_digest`].
    pub fn check_invariants(&self) -> Result<(), String> {
        // Expected per-account and per-position sums, rebuilt from the orders.
        let mut reserved_cash = vec![0i128; self.accounts.len()];
        // (account, book) -> (sell_reserved, buy_open, sell_open), kept sorted for lookup.
        type PositionSums = Vec<((u32, u32), (i64, i64, i64))>;
        let mut pos_sums: PositionSums = Vec::new();
        let mut resting = 0usize;

        for (b, book) in self.books.iter().enumerate() {
            for side in [Side::Buy, Side::Sell] {
                let levels = book.side(side);
                let mut empty = 0usize;
                for (i, level) in levels.iter().enumerate() {
                    if i > 0 && !better(side, level.price, levels[i - 1].price) {
                        return Err(format!("book {b} {side:?}: levels not strictly sorted"));
                    }
                    let (mut leaves, mut display, mut count, mut market) = (0i64, 0i64, 0u32, 0u32);
                    let mut prev = NIL;
                    let mut slot = level.head;
                    while slot != NIL {
                        let o = self.pool.get(slot);
                        if o.prev != prev {
                            return Err(format!("order {}: broken back link", o.id));
                        }
                        if !o.resting
                            || o.book != b as u32
                            || o.side != side
                            || o.price != level.price
                        {
                            return Err(format!("order {}: in the wrong level", o.id));
                        }
                        if o.qty_leaves <= 0
                            || o.qty_display <= 0
                            || o.qty_display > o.qty_leaves
                            || (o.display_size == 0 && o.qty_display != o.qty_leaves)
                            || (o.display_size > 0 && o.qty_display > o.display_size)
                            || o.qty_total != o.qty_filled + o.qty_leaves
                            || o.qty_filled < 0
                        {
                            return Err(format!("order {}: impossible quantities", o.id));
                        }
                        if matches!(o.tif, TimeInForce::Ioc | TimeInForce::Fok) {
                            return Err(format!("order {}: IOC/FOK order resting", o.id));
                        }
                        if o.market && !book.phase.is_auction() {
                            return Err(format!("order {}: market order outside a call", o.id));
                        }
                        market += o.market as u32;
                        if self.order_index.get(&o.id) != Some(&slot)
                            || self.clord_index.get(&(o.account, o.cl_ord_id)) != Some(&slot)
                        {
                            return Err(format!("order {}: lookup tables disagree", o.id));
                        }
                        // Only sells of equities and FX hold position back. Checked before the
                        // reservation is recomputed, which assumes it (restore runs this check on
                        // untrusted bytes).
                        let holds_pos = o.side == Side::Sell && book.def.market != Market::Futures;
                        if o.reserved_pos < 0
                            || o.reserved_pos > o.qty_leaves
                            || (!holds_pos && o.reserved_pos != 0)
                        {
                            return Err(format!(
                                "order {}: holds {} lots of position",
                                o.id, o.reserved_pos
                            ));
                        }
                        let expected =
                            cash_required(&book.def, o.side, o.price, o.qty_leaves, o.reserved_pos);
                        if expected != Some(o.reserved_cash) {
                            return Err(format!(
                                "order {}: reservation {} (pos {}) but {:?} required",
                                o.id, o.reserved_cash, o.reserved_pos, expected
                            ));
                        }
                        reserved_cash[o.account as usize] += o.reserved_cash;
                        let key = (o.account, o.book);
                        let i = match pos_sums.binary_search_by_key(&key, |e| e.0) {
                            Ok(i) => i,
                            Err(i) => {
                                pos_sums.insert(i, (key, (0, 0, 0)));
                                i
                            }
                        };
                        let sums = &mut pos_sums[i].1;
                        match o.side {
                            Side::Buy => sums.1 += o.qty_leaves,
                            Side::Sell => {
                                sums.0 += o.reserved_pos;
                                sums.2 += o.qty_leaves;
                            }
                        }
                        leaves += o.qty_leaves;
                        display += o.qty_display;
                        count += 1;
                        resting += 1;
                        prev = slot;
                        slot = o.next;
                    }
                    if level.tail != prev {
                        return Err(format!("book {b} level {}: bad tail", level.price));
                    }
                    if count == 0 {
                        empty += 1;
                        if i + 1 == levels.len() {
                            return Err(format!("book {b} {side:?}: the best level is empty"));
                        }
                    }
                    if leaves != level.qty_leaves
                        || display != level.qty_display
                        || count != level.orders
                        || market != level.market
                    {
                        return Err(format!("book {b} level {}: totals disagree", level.price));
                    }
                }
                if empty != levels.len() - levels.live_levels() {
                    return Err(format!("book {b} {side:?}: placeholder count disagrees"));
                }
            }
            crate::auction::check_state(book, &book.auction)?;
            let listed = self.vi_books.binary_search(&(b as u32)).is_ok();
            if listed
                != (book.phase == bourse_core::Phase::VolatilityAuction && book.auction.end_ns != 0)
            {
                return Err(format!("book {b}: volatility auction timer list disagrees"));
            }
            // A call auction's book may be crossed; any other is not.
            if let (Some(bid), Some(ask), false) = (
                book.best(Side::Buy),
                book.best(Side::Sell),
                book.phase.is_auction(),
            ) {
                if bid.price >= ask.price {
                    return Err(format!(
                        "book {b}: crossed ({} >= {})",
                        bid.price, ask.price
                    ));
                }
            }
        }
        if resting != self.pool.live()
            || resting != self.order_index.len()
            || resting != self.clord_index.len()
        {
            return Err(format!(
                "{resting} resting orders, {} in the pool, {} and {} in the lookups",
                self.pool.live(),
                self.order_index.len(),
                self.clord_index.len()
            ));
        }

        for (a, acc) in self.accounts.iter().enumerate() {
            if acc.reserved_cash != reserved_cash[a] || acc.reserved_cash < 0 {
                return Err(format!(
                    "account {}: reserved {} but its orders hold {}",
                    acc.id, acc.reserved_cash, reserved_cash[a]
                ));
            }
            if acc.free_cash() < 0 {
                return Err(format!("account {}: negative free cash", acc.id));
            }
            let mut margin = 0i128;
            for p in &acc.positions {
                let def = &self.books[p.book as usize].def;
                if def.market == Market::Futures {
                    margin += crate::risk::futures_margin(def.initial_margin.0, p);
                }
                let expected = pos_sums
                    .binary_search_by_key(&(a as u32, p.book), |e| e.0)
                    .map(|i| pos_sums[i].1)
                    .unwrap_or((0, 0, 0));
                if (p.sell_reserved, p.buy_open, p.sell_open) != expected {
                    return Err(format!(
                        "account {} book {}: open quantities {:?} but orders hold {:?}",
                        acc.id,
                        p.book,
                        (p.sell_reserved, p.buy_open, p.sell_open),
                        expected
                    ));
                }
                if !acc.may_short && p.sell_reserved > p.qty.max(0) {
                    return Err(format!(
                        "account {}: sells reserve more than it holds",
                        acc.id
                    ));
                }
                if !acc.may_short && def.market != Market::Futures && p.qty < 0 {
                    return Err(format!("account {}: short without permission", acc.id));
                }
            }
            if margin != acc.margin_locked {
                return Err(format!(
                    "account {}: margin {} but positions need {}",
                    acc.id, acc.margin_locked, margin
                ));
            }
        }
        // Last: a stale digest is worth reporting only once the state itself is consistent.
        self.check_digest()
    }
}
