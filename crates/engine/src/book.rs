//! The order book of one instrument: price levels on each side, each a FIFO of orders.
//!
//! Orders live in one [`OrderPool`] per core (a slab with a free list, sized once at start), and
//! levels link them with `prev`/`next` slot indices, so that adding, cancelling and moving an
//! order allocates nothing. Each side keeps its levels in a `Vec` sorted so that the best price
//! is the *last* element: almost all activity happens near the best price, so inserting or
//! removing a level moves only the few levels behind it.

use crate::digest;
use bourse_core::{ClOrdId, Instrument, OrderId, Phase, Side, TimeInForce};

/// "No slot": the end of a list.
pub const NIL: u32 = u32::MAX;

/// An order in the pool. Sizes are in lots, prices in raw units, cash in cash units.
#[derive(Clone, Copy, Debug)]
pub struct Order {
    pub id: OrderId,
    pub cl_ord_id: ClOrdId,
    /// Index of the owning account in the engine's account table.
    pub account: u32,
    /// Index of the book (instrument) in the engine's book table.
    pub book: u32,
    pub side: Side,
    pub tif: TimeInForce,
    /// The limit price; for a market order, the band edge fixed when it arrived.
    pub price: i64,
    pub qty_total: i64,
    pub qty_filled: i64,
    pub qty_leaves: i64,
    /// The iceberg's display size; 0 for an ordinary order.
    pub display_size: i64,
    /// The part of `qty_leaves` visible in the book now.
    pub qty_display: i64,
    pub expire_ts_ns: u64,
    pub rec: u64,
    /// Cash this order holds back from its account's free cash.
    pub reserved_cash: i128,
    /// Position this (sell) order holds back from its account's free position.
    pub reserved_pos: i64,
    pub prev: u32,
    pub next: u32,
    /// True while the order sits in a level's list.
    pub resting: bool,
    /// A market order resting in a call auction (its `price` is the band edge fixed on
    /// arrival, its protection limit). Never set in continuous trading, where market orders
    /// do not rest.
    pub market: bool,
}

impl Order {
    pub fn is_iceberg(&self) -> bool {
        self.display_size > 0
    }
    /// The visible size the order shows when (re)entering the book with `qty_leaves` open.
    pub fn display_for(&self, qty_leaves: i64) -> i64 {
        if self.display_size > 0 {
            self.display_size.min(qty_leaves)
        } else {
            qty_leaves
        }
    }
}

/// A fixed-capacity slab of orders with a free list.
///
/// The pool also keeps the resting orders' part of the state digest (`crate::digest`): per
/// slot the order's key and its item as last added, and their sum. [`Book::push_back`] adds an
/// order's item, [`Book::unlink`] takes it away (and rehashes the order behind it, whose
/// predecessor changed), and [`OrderPool::rehash`] follows a change to a resting order.
pub struct OrderPool {
    slots: Vec<Order>,
    free: Vec<u32>,
    capacity: usize,
    /// Per slot: (the order's key, its item while it rests).
    digests: Vec<(u64, u64)>,
    /// The sum of the items of the resting orders.
    digest: u64,
}

impl OrderPool {
    /// Bytes [`with_capacity`](Self::with_capacity) reserves per order: the slot, its digest
    /// entry and its room in the free list.
    pub const BYTES_PER_ORDER: usize = std::mem::size_of::<Order>()
        + std::mem::size_of::<(u64, u64)>()
        + std::mem::size_of::<u32>();

    pub fn with_capacity(capacity: usize) -> OrderPool {
        assert!(capacity > 0 && capacity < NIL as usize);
        OrderPool {
            slots: Vec::with_capacity(capacity),
            free: Vec::with_capacity(capacity),
            capacity,
            digests: Vec::with_capacity(capacity),
            digest: 0,
        }
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
    pub fn is_full(&self) -> bool {
        self.live() >= self.capacity
    }
    /// Stores `order` and returns its slot. The caller checks `is_full` first.
    pub fn insert(&mut self, order: Order) -> u32 {
        let key = digest::order_key(&order);
        if let Some(slot) = self.free.pop() {
            self.slots[slot as usize] = order;
            self.digests[slot as usize] = (key, 0);
            slot
        } else {
            assert!(self.slots.len() < self.capacity, "order pool overflow");
            self.slots.push(order);
            self.digests.push((key, 0));
            (self.slots.len() - 1) as u32
        }
    }
    pub fn remove(&mut self, slot: u32) {
        debug_assert!(!self.slots[slot as usize].resting);
        self.free.push(slot);
    }
    #[inline]
    pub fn get(&self, slot: u32) -> &Order {
        &self.slots[slot as usize]
    }
    #[inline]
    pub fn get_mut(&mut self, slot: u32) -> &mut Order {
        &mut self.slots[slot as usize]
    }

    /// The sum of the resting orders' digest items.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Adds the item of the (just linked) resting order in `slot` to the digest.
    #[inline]
    fn digest_link(&mut self, slot: u32) {
        let o = &self.slots[slot as usize];
        let prev_id = if o.prev == NIL {
            0
        } else {
            self.slots[o.prev as usize].id.0
        };
        let entry = &mut self.digests[slot as usize];
        entry.1 = digest::order_item(entry.0, o, prev_id);
        self.digest = self.digest.wrapping_add(entry.1);
    }

    /// Takes the item of the resting order in `slot` (as last added) out of the digest.
    #[inline]
    fn digest_unlink(&mut self, slot: u32) {
        self.digest = self.digest.wrapping_sub(self.digests[slot as usize].1);
    }

    /// The order ahead of the resting order in `slot` changed from `old_prev_id` to
    /// `new_prev_id` (ids; 0 for none): only its link term moves.
    #[inline]
    fn digest_repoint(&mut self, slot: u32, old_prev_id: u64, new_prev_id: u64) {
        let entry = &mut self.digests[slot as usize];
        // The link term is linear in the predecessor's id.
        let delta = digest::link_term(entry.0, new_prev_id.wrapping_sub(old_prev_id));
        entry.1 = entry.1.wrapping_add(delta);
        self.digest = self.digest.wrapping_add(delta);
    }

    /// Follows a change to the resting order in `slot` (its quantities, price or client id)
    /// in the digest. Every change to a resting order that stays resting must call this.
    #[inline]
    pub fn rehash(&mut self, slot: u32) {
        debug_assert!(self.slots[slot as usize].resting);
        self.digest_unlink(slot);
        self.digest_link(slot);
    }

    /// Recomputes every resting order's key and item and their sum (after a restore).
    pub(crate) fn rebuild_digest(&mut self) {
        let mut sum = 0u64;
        for slot in 0..self.slots.len() as u32 {
            let o = &self.slots[slot as usize];
            if !o.resting {
                continue;
            }
            self.digests[slot as usize].0 = digest::order_key(o);
            self.digest_link(slot);
            sum = sum.wrapping_add(self.digests[slot as usize].1);
        }
        self.digest = sum;
    }

    /// A resting order whose cached key or item disagrees with the order, if any.
    pub(crate) fn stale_digest_slot(&self) -> Option<u32> {
        (0..self.slots.len() as u32).find(|&slot| {
            let o = &self.slots[slot as usize];
            if !o.resting {
                return false;
            }
            let prev_id = if o.prev == NIL {
                0
            } else {
                self.slots[o.prev as usize].id.0
            };
            let key = digest::order_key(o);
            self.digests[slot as usize] != (key, digest::order_item(key, o, prev_id))
        })
    }
}

/// One price level: a FIFO of resting orders at the same price.
#[derive(Clone, Copy, Debug)]
pub struct Level {
    pub price: i64,
    pub head: u32,
    pub tail: u32,
    /// Sum of the open quantity of the level's orders (hidden iceberg parts included).
    pub qty_leaves: i64,
    /// Sum of the visible quantity: what the aggregated book shows.
    pub qty_display: i64,
    pub orders: u32,
    /// How many of the level's orders are market orders (only ever in a call auction): a
    /// level of market orders only is no candidate price of an uncrossing.
    pub market: u32,
}

/// The levels of one side, sorted worst to best (best last), with their prices repeated in a
/// dense array: a binary search then touches 8 bytes per probe instead of a whole level, so a
/// ladder of hundreds of levels stays in the first-level cache.
///
/// A level that empties in the middle of the ladder stays as an empty placeholder (no orders,
/// no quantity) instead of being removed: removing and re-inserting levels shifts every level
/// behind them, which was the largest single cost of the order path. Placeholders are reused
/// when their price comes back, the best level is never a placeholder (trailing empties are
/// trimmed), and the ladder is compacted when placeholders outnumber live levels. Readers skip
/// levels with no orders.
pub struct Ladder {
    prices: Vec<i64>,
    levels: Vec<Level>,
    /// Placeholders currently in the ladder.
    empty: usize,
}

/// Compaction waits until there are at least this many placeholders.
const LADDER_EMPTY_MIN: usize = 64;

impl Ladder {
    /// Bytes [`with_capacity`](Self::with_capacity) reserves per level: the level and its
    /// price in the dense array.
    pub const BYTES_PER_LEVEL: usize = std::mem::size_of::<Level>() + std::mem::size_of::<i64>();

    fn with_capacity(levels: usize) -> Ladder {
        Ladder {
            prices: Vec::with_capacity(levels),
            levels: Vec::with_capacity(levels),
            empty: 0,
        }
    }

    /// Levels with orders.
    pub fn live_levels(&self) -> usize {
        self.levels.len() - self.empty
    }

    /// The index of the level at `price`, making one (or reviving a placeholder) if needed.
    fn level_for(&mut self, side: Side, price: i64) -> usize {
        match self.find(side, price) {
            Ok(i) => {
                if self.levels[i].orders == 0 {
                    self.empty -= 1;
                }
                i
            }
            Err(i) => {
                self.insert(
                    i,
                    Level {
                        price,
                        head: NIL,
                        tail: NIL,
                        qty_leaves: 0,
                        qty_display: 0,
                        orders: 0,
                        market: 0,
                    },
                );
                i
            }
        }
    }

    /// The level at `index` has just lost its last order.
    fn emptied(&mut self, index: usize) {
        debug_assert_eq!(self.levels[index].orders, 0);
        self.empty += 1;
        // Keep the best level live: trim placeholders from the end.
        while self.levels.last().is_some_and(|l| l.orders == 0) {
            self.prices.pop();
            self.levels.pop();
            self.empty -= 1;
        }
        if self.empty >= LADDER_EMPTY_MIN && self.empty > self.live_levels() {
            self.compact();
        }
    }

    /// Drops every placeholder, keeping the order of the live levels.
    fn compact(&mut self) {
        self.levels.retain(|l| l.orders > 0);
        self.prices.clear();
        self.prices.extend(self.levels.iter().map(|l| l.price));
        self.empty = 0;
    }

    /// Finds the level at `price`: Ok(index) if present, Err(insert index) if not.
    #[inline]
    pub fn find(&self, side: Side, price: i64) -> Result<usize, usize> {
        // Levels are sorted worst to best: bids ascending, asks descending.
        match side {
            Side::Buy => self.prices.binary_search(&price),
            Side::Sell => self.prices.binary_search_by(|p| price.cmp(p)),
        }
    }

    fn insert(&mut self, index: usize, level: Level) {
        self.prices.insert(index, level.price);
        self.levels.insert(index, level);
    }
}

impl std::ops::Deref for Ladder {
    type Target = [Level];
    fn deref(&self) -> &[Level] {
        &self.levels
    }
}

impl std::ops::DerefMut for Ladder {
    /// Levels may be changed in place, but never their price (the ladder's order depends on it).
    fn deref_mut(&mut self) -> &mut [Level] {
        &mut self.levels
    }
}

/// The book and state of one instrument.
pub struct Book {
    pub def: Instrument,
    pub phase: Phase,
    pub bids: Ladder,
    pub asks: Ladder,
    /// Band limits derived from the reference price, kept to avoid recomputing per order.
    pub band_low: i64,
    pub band_high: i64,
    /// The call auctions' state (all zero in continuous trading with no guard).
    pub auction: AuctionState,
    /// The hash of the definition (all but the reference price), for the state digest.
    pub(crate) def_digest: u64,
    /// The book's item in the state digest as last added (the engine keeps it).
    pub(crate) digest_item: u64,
    /// The hash of `auction` (`digest::auction_digest`), kept with it.
    pub(crate) auction_digest: u64,
}

/// An uncrossing of a call auction's book: the price, the quantity that executes there, and
/// what is left unmatched at that price (positive: buys, negative: sells).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uncross {
    pub price: i64,
    pub qty: i64,
    pub surplus: i64,
}

/// The part of a book's state the call auctions and the volatility interruption keep. In the
/// snapshot and the state digest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuctionState {
    /// The static reference of the volatility guard: the instrument's reference price, then
    /// the price of each auction that executed (0 until the book is made).
    pub static_ref: i64,
    /// The official close: the price of the last closing auction (0: none yet).
    pub close: i64,
    /// The end of the volatility auction under way (0: none).
    pub end_ns: u64,
    /// The indicative uncrossing last published in the auction under way (all 0: no cross,
    /// or none published).
    pub indicative: Uncross,
}

/// Is `a` a better price than `b` for resting orders of `side`?
#[inline]
pub fn better(side: Side, a: i64, b: i64) -> bool {
    match side {
        Side::Buy => a > b,
        Side::Sell => a < b,
    }
}

/// Does a resting price `resting` satisfy an incoming order of `side` with limit `limit`?
#[inline]
pub fn crosses(incoming: Side, limit: i64, resting: i64) -> bool {
    match incoming {
        Side::Buy => resting <= limit,
        Side::Sell => resting >= limit,
    }
}

impl Book {
    pub fn new(def: Instrument, levels_per_side_hint: usize) -> Book {
        let (low, high) = def.band();
        let def_digest = digest::instrument_digest(&def);
        let static_ref = def.reference_price.0;
        Book {
            def,
            phase: Phase::Open,
            bids: Ladder::with_capacity(levels_per_side_hint),
            asks: Ladder::with_capacity(levels_per_side_hint),
            band_low: low.0,
            band_high: high.0,
            auction: AuctionState {
                static_ref,
                ..AuctionState::default()
            },
            def_digest,
            digest_item: 0,
            auction_digest: 0,
        }
    }

    pub fn side(&self, side: Side) -> &Ladder {
        match side {
            Side::Buy => &self.bids,
            Side::Sell => &self.asks,
        }
    }

    pub fn side_mut(&mut self, side: Side) -> &mut Ladder {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }

    pub fn set_reference(&mut self, price: i64) {
        self.def.reference_price = bourse_core::Price(price);
        let (low, high) = self.def.band();
        self.band_low = low.0;
        self.band_high = high.0;
    }

    /// Appends the order in `slot` to the tail of its price level, creating the level if needed.
    pub fn push_back(&mut self, pool: &mut OrderPool, slot: u32) {
        let (side, price, leaves, display) = {
            let o = pool.get(slot);
            debug_assert!(!o.resting && o.qty_leaves > 0);
            (o.side, o.price, o.qty_leaves, o.qty_display)
        };
        let levels = self.side_mut(side);
        let index = levels.level_for(side, price);
        let level = &mut levels[index];
        let old_tail = level.tail;
        {
            let o = pool.get_mut(slot);
            o.prev = old_tail;
            o.next = NIL;
            o.resting = true;
        }
        if old_tail == NIL {
            level.head = slot;
        } else {
            pool.get_mut(old_tail).next = slot;
        }
        level.tail = slot;
        level.qty_leaves += leaves;
        level.qty_display += display;
        level.orders += 1;
        level.market += pool.get(slot).market as u32;
        pool.digest_link(slot);
    }

    /// Takes the order in `slot` out of its level (which may become a placeholder).
    /// `level_index` may be given when the caller already knows it.
    pub fn unlink(&mut self, pool: &mut OrderPool, slot: u32, level_index: Option<usize>) {
        let (side, price, prev, next, leaves, display, market) = {
            let o = pool.get(slot);
            debug_assert!(o.resting);
            (
                o.side,
                o.price,
                o.prev,
                o.next,
                o.qty_leaves,
                o.qty_display,
                o.market,
            )
        };
        let levels = self.side_mut(side);
        let index = match level_index {
            Some(i) => i,
            None => levels
                .find(side, price)
                .expect("resting order without level"),
        };
        let level = &mut levels[index];
        debug_assert_eq!(level.price, price);
        // The order's item leaves the digest; the one behind it gets a new predecessor.
        pool.digest_unlink(slot);
        if next != NIL {
            let old_prev_id = pool.get(slot).id.0;
            let new_prev_id = if prev == NIL { 0 } else { pool.get(prev).id.0 };
            pool.digest_repoint(next, old_prev_id, new_prev_id);
        }
        if prev == NIL {
            level.head = next;
        } else {
            pool.get_mut(prev).next = next;
        }
        if next == NIL {
            level.tail = prev;
        } else {
            pool.get_mut(next).prev = prev;
        }
        level.qty_leaves -= leaves;
        level.qty_display -= display;
        level.orders -= 1;
        level.market -= market as u32;
        if level.orders == 0 {
            debug_assert!(level.head == NIL && level.qty_leaves == 0 && level.qty_display == 0);
            levels.emptied(index);
        }
        let o = pool.get_mut(slot);
        o.resting = false;
        o.prev = NIL;
        o.next = NIL;
    }

    /// The best level of `side`, if any.
    #[inline]
    pub fn best(&self, side: Side) -> Option<&Level> {
        self.side(side).last()
    }
}

/// Whether a day-end sweep expires an order with this time in force and expiry.
pub fn expires_at_end_of_day(tif: TimeInForce, expire_ts_ns: u64, now_ns: u64) -> bool {
    match tif {
        // Orders for one auction are day orders too.
        TimeInForce::Day
        | TimeInForce::AtOpening
        | TimeInForce::AtClose
        | TimeInForce::GoodForAuction => true,
        TimeInForce::Gtd => expire_ts_ns <= now_ns,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_order_fits_two_cache_lines_and_a_level_is_small() {
        // The pool's memory per order and the ladder's search speed rest on these sizes.
        assert!(std::mem::size_of::<super::Order>() <= 128);
        assert!(std::mem::size_of::<super::Level>() <= 40);
    }
}
