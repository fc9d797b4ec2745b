//! The reacting client's books: every instrument's orders in price-time priority, in memory
//! allocated once at start-up, so that applying an update never allocates.
//!
//! - Orders live in a slab of nodes (a free list reuses slots), linked into a FIFO per price
//!   level.
//! - An open-addressing table (linear probing, deletion by backward shift, so no tombstones
//!   pile up) finds an order by (instrument, order id).
//! - Each side's levels are a sorted array with the best level last: most activity is at the
//!   top of the book, so inserting or removing a level there moves little, and the best price
//!   is one load.
//!
//! Every limit is explicit ([`Limits`]): an update past one is refused with a [`BookError`]
//! and counted by the caller, never grown into.

use bourse_core::Side;
use bourse_engine::capacity::Preallocation;
use std::mem::size_of;

const NIL: u32 = u32::MAX;

/// Sizes fixed at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub instruments_max: usize,
    /// Resting orders over all instruments.
    pub orders_max: usize,
    pub levels_per_side_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            instruments_max: 64,
            orders_max: 1 << 16,
            levels_per_side_max: 1_024,
        }
    }
}

impl Limits {
    /// Refuses limits the books cannot number: order slots and instruments are u32 indexes,
    /// with `u32::MAX` meaning none.
    pub fn check(&self) -> Result<(), String> {
        let index_max = (NIL - 1) as usize;
        if self.orders_max > index_max {
            return Err(format!(
                "orders_max {} is out of range: it must be at most {index_max}",
                self.orders_max
            ));
        }
        if self.instruments_max > index_max {
            return Err(format!(
                "instruments_max {} is out of range: it must be at most {index_max}",
                self.instruments_max
            ));
        }
        Ok(())
    }

    /// The memory [`Books::new`] allocates and writes, by the limit that sizes it: per order
    /// a node, a free-list entry and two hash table entries (the table is rounded up to a
    /// power of two, up to twice that), and per instrument its two spare ladders of
    /// `levels_per_side_max` levels.
    pub fn preallocations(&self) -> Vec<Preallocation> {
        let order_bytes = size_of::<Node>() + size_of::<u32>() + 2 * size_of::<Entry>();
        let instrument_bytes = (2 * size_of::<Level>() as u64)
            .saturating_mul(self.levels_per_side_max as u64)
            .saturating_add(2 * size_of::<Instrument>() as u64);
        vec![
            Preallocation::new(
                "orders_max",
                self.orders_max as u64,
                order_bytes as u64,
                "the order table",
            ),
            Preallocation::new(
                "instruments_max",
                self.instruments_max as u64,
                instrument_bytes,
                &format!(
                    "the books' price levels, {} per side",
                    self.levels_per_side_max
                ),
            ),
        ]
    }
}

/// Why an update was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BookError {
    DuplicateOrder,
    UnknownOrder,
    QtyNotPositive,
    OrdersFull,
    LevelsFull,
    InstrumentsFull,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    order_id: u64,
    price: i64,
    qty: i64,
    inst: u32,
    side: Side,
    prev: u32,
    next: u32,
}

/// One aggregated price level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    pub price: i64,
    /// Sum of visible quantity.
    pub qty: i64,
    pub orders: u32,
    head: u32,
    tail: u32,
}

/// One instrument's two sides. Bids are sorted ascending and asks descending, so that the
/// best level of either side is the last element.
#[derive(Debug)]
pub struct Instrument {
    pub security_id: u32,
    bids: Vec<Level>,
    asks: Vec<Level>,
}

impl Instrument {
    fn side(&self, side: Side) -> &Vec<Level> {
        match side {
            Side::Buy => &self.bids,
            Side::Sell => &self.asks,
        }
    }

    fn side_mut(&mut self, side: Side) -> &mut Vec<Level> {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }

    /// The best ask price.
    #[inline]
    pub fn best_ask(&self) -> Option<i64> {
        self.asks.last().map(|l| l.price)
    }

    /// The levels of one side, best first.
    pub fn levels(&self, side: Side) -> impl Iterator<Item = &Level> + '_ {
        self.side(side).iter().rev()
    }
}

/// Where `price` is (or would go) in a side's sorted levels.
#[inline]
fn find_level(levels: &[Level], side: Side, price: i64) -> Result<usize, usize> {
    match side {
        Side::Buy => levels.binary_search_by(|l| l.price.cmp(&price)),
        Side::Sell => levels.binary_search_by(|l| price.cmp(&l.price)),
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    order_id: u64,
    inst: u32,
    /// Slab slot plus one; 0 marks an empty entry (so the table starts as zeroed memory).
    slot_plus_one: u32,
}

/// Every instrument's book.
#[derive(Debug)]
pub struct Books {
    limits: Limits,
    instruments: Vec<Instrument>,
    /// Instruments made at start-up and handed out on first sight.
    spare: Vec<Instrument>,
    last_hit: usize,
    /// The slab, written in full at start-up so that no page is first touched on the hot
    /// path; slots below `used` have been handed out at least once.
    nodes: Vec<Node>,
    used: usize,
    free: Vec<u32>,
    table: Vec<Entry>,
    mask: usize,
    /// log2 of the table length.
    bits: u32,
    orders: usize,
}

const NODE_EMPTY: Node = Node {
    order_id: 0,
    price: 0,
    qty: 0,
    inst: 0,
    side: Side::Buy,
    prev: NIL,
    next: NIL,
};

const LEVEL_EMPTY: Level = Level {
    price: 0,
    qty: 0,
    orders: 0,
    head: NIL,
    tail: NIL,
};

/// A vector with room for `n` elements whose pages have all been written once.
fn touched_vec<T: Clone>(n: usize, fill: T) -> Vec<T> {
    let mut v = vec![fill; n];
    v.clear();
    v
}

impl Books {
    /// Allocates everything the books will ever use.
    pub fn new(limits: Limits) -> Books {
        let table_len = (limits.orders_max.max(8) * 2).next_power_of_two();
        let spare = (0..limits.instruments_max)
            .map(|_| Instrument {
                security_id: 0,
                bids: touched_vec(limits.levels_per_side_max, LEVEL_EMPTY),
                asks: touched_vec(limits.levels_per_side_max, LEVEL_EMPTY),
            })
            .collect();
        Books {
            limits,
            instruments: Vec::with_capacity(limits.instruments_max),
            spare,
            last_hit: 0,
            nodes: vec![NODE_EMPTY; limits.orders_max],
            used: 0,
            free: touched_vec(limits.orders_max, 0),
            table: vec![Entry::default(); table_len],
            mask: table_len - 1,
            bits: table_len.trailing_zeros(),
            orders: 0,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Resting orders over all instruments.
    pub fn orders(&self) -> usize {
        self.orders
    }

    pub fn instruments(&self) -> &[Instrument] {
        &self.instruments
    }

    pub fn instrument(&self, index: usize) -> &Instrument {
        &self.instruments[index]
    }

    /// The instrument with this security id, if seen.
    pub fn by_security_id(&self, security_id: u32) -> Option<&Instrument> {
        self.instruments
            .iter()
            .find(|i| i.security_id == security_id)
    }

    /// The index of an instrument, made on first sight (from the spares: no allocation).
    #[inline]
    pub fn index_of(&mut self, security_id: u32) -> Result<usize, BookError> {
        if let Some(i) = self.instruments.get(self.last_hit) {
            if i.security_id == security_id {
                return Ok(self.last_hit);
            }
        }
        let found = self
            .instruments
            .iter()
            .position(|i| i.security_id == security_id);
        let index = match found {
            Some(index) => index,
            None => {
                let mut inst = self.spare.pop().ok_or(BookError::InstrumentsFull)?;
                inst.security_id = security_id;
                self.instruments.push(inst);
                self.instruments.len() - 1
            }
        };
        self.last_hit = index;
        Ok(index)
    }

    /// Where an order's probe starts. Exchanges number orders sequentially, so the low bits
    /// of the id are kept as they are: orders placed close in time sit in neighbouring entries
    /// (a few per cache line) instead of scattered over the table, which on a busy machine is
    /// the difference between a cache hit and a miss per update. Higher bits are folded in and
    /// each instrument starts at its own scattered offset.
    #[inline]
    fn home(&self, order_id: u64, inst: u32) -> usize {
        let folded = order_id ^ (order_id >> self.bits);
        let offset = u64::from(inst).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
        (folded.wrapping_add(offset) as usize) & self.mask
    }

    #[inline]
    fn find(&self, order_id: u64, inst: u32) -> Option<(usize, u32)> {
        let mut at = self.home(order_id, inst);
        loop {
            let e = self.table[at];
            if e.slot_plus_one == 0 {
                return None;
            }
            if e.order_id == order_id && e.inst == inst {
                return Some((at, e.slot_plus_one - 1));
            }
            at = (at + 1) & self.mask;
        }
    }

    fn table_insert(&mut self, order_id: u64, inst: u32, slot: u32) {
        let mut at = self.home(order_id, inst);
        while self.table[at].slot_plus_one != 0 {
            at = (at + 1) & self.mask;
        }
        self.table[at] = Entry {
            order_id,
            inst,
            slot_plus_one: slot + 1,
        };
    }

    /// Empties entry `at` and shifts later entries of its probe run back, so lookups never
    /// need tombstones.
    fn table_remove(&mut self, mut at: usize) {
        self.table[at] = Entry::default();
        let mut next = at;
        loop {
            next = (next + 1) & self.mask;
            let e = self.table[next];
            if e.slot_plus_one == 0 {
                return;
            }
            let home = self.home(e.order_id, e.inst);
            // The entry may move back to `at` unless its home lies cyclically in (at, next].
            let stays = if at <= next {
                at < home && home <= next
            } else {
                at < home || home <= next
            };
            if !stays {
                self.table[at] = e;
                self.table[next] = Entry::default();
                at = next;
            }
        }
    }

    /// Adds an order at the back of its level's queue.
    pub fn add(
        &mut self,
        inst: usize,
        order_id: u64,
        side: Side,
        price: i64,
        qty: i64,
    ) -> Result<(), BookError> {
        if qty <= 0 {
            return Err(BookError::QtyNotPositive);
        }
        let inst32 = inst as u32;
        if self.find(order_id, inst32).is_some() {
            return Err(BookError::DuplicateOrder);
        }
        if self.free.is_empty() && self.used >= self.nodes.len() {
            return Err(BookError::OrdersFull);
        }
        let levels_max = self.limits.levels_per_side_max;
        let levels = self.instruments[inst].side_mut(side);
        let at = match find_level(levels, side, price) {
            Ok(at) => at,
            Err(at) => {
                if levels.len() >= levels_max {
                    return Err(BookError::LevelsFull);
                }
                levels.insert(
                    at,
                    Level {
                        price,
                        qty: 0,
                        orders: 0,
                        head: NIL,
                        tail: NIL,
                    },
                );
                at
            }
        };
        let level = &mut levels[at];
        let tail = level.tail;
        let node = Node {
            order_id,
            price,
            qty,
            inst: inst32,
            side,
            prev: tail,
            next: NIL,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes[self.used] = node;
                self.used += 1;
                (self.used - 1) as u32
            }
        };
        level.tail = slot;
        if level.head == NIL {
            level.head = slot;
        }
        level.qty += qty;
        level.orders += 1;
        if tail != NIL {
            self.nodes[tail as usize].next = slot;
        }
        self.table_insert(order_id, inst32, slot);
        self.orders += 1;
        Ok(())
    }

    /// Sets an order's visible quantity (it keeps its place in the queue).
    pub fn change_qty(&mut self, inst: usize, order_id: u64, qty: i64) -> Result<(), BookError> {
        if qty <= 0 {
            return Err(BookError::QtyNotPositive);
        }
        let (_, slot) = self
            .find(order_id, inst as u32)
            .ok_or(BookError::UnknownOrder)?;
        let node = &mut self.nodes[slot as usize];
        let delta = qty - node.qty;
        node.qty = qty;
        let (side, price) = (node.side, node.price);
        let levels = self.instruments[inst].side_mut(side);
        if let Ok(at) = find_level(levels, side, price) {
            levels[at].qty += delta;
        }
        Ok(())
    }

    /// Takes `by` off an order's visible quantity (an ITCH execution or partial cancel): it
    /// keeps its place, or leaves the book when nothing is left. More than it shows is refused.
    pub fn reduce(&mut self, inst: usize, order_id: u64, by: i64) -> Result<(), BookError> {
        let (_, slot) = self
            .find(order_id, inst as u32)
            .ok_or(BookError::UnknownOrder)?;
        let left = self.nodes[slot as usize].qty - by;
        match left {
            0 => self.remove(inst, order_id),
            l if l > 0 && by > 0 => self.change_qty(inst, order_id, l),
            _ => Err(BookError::QtyNotPositive),
        }
    }

    /// Replaces an order by a new one on the same side (an ITCH Order Replace): the old one
    /// leaves, the new one enters at the back of its level under `new_order_id`.
    pub fn replace(
        &mut self,
        inst: usize,
        order_id: u64,
        new_order_id: u64,
        price: i64,
        qty: i64,
    ) -> Result<(), BookError> {
        let (_, slot) = self
            .find(order_id, inst as u32)
            .ok_or(BookError::UnknownOrder)?;
        let side = self.nodes[slot as usize].side;
        if qty <= 0 {
            return Err(BookError::QtyNotPositive);
        }
        if new_order_id != order_id && self.find(new_order_id, inst as u32).is_some() {
            return Err(BookError::DuplicateOrder);
        }
        self.remove(inst, order_id)?;
        self.add(inst, new_order_id, side, price, qty)
    }

    /// Removes an order.
    pub fn remove(&mut self, inst: usize, order_id: u64) -> Result<(), BookError> {
        let (entry, slot) = self
            .find(order_id, inst as u32)
            .ok_or(BookError::UnknownOrder)?;
        self.table_remove(entry);
        self.unlink(slot);
        Ok(())
    }

    /// Takes a node out of its level (dropping the level when it empties) and frees it.
    fn unlink(&mut self, slot: u32) {
        let node = self.nodes[slot as usize];
        if node.prev != NIL {
            self.nodes[node.prev as usize].next = node.next;
        }
        if node.next != NIL {
            self.nodes[node.next as usize].prev = node.prev;
        }
        let levels = self.instruments[node.inst as usize].side_mut(node.side);
        if let Ok(at) = find_level(levels, node.side, node.price) {
            let level = &mut levels[at];
            if level.head == slot {
                level.head = node.next;
            }
            if level.tail == slot {
                level.tail = node.prev;
            }
            level.qty -= node.qty;
            level.orders -= 1;
            if level.orders == 0 {
                levels.remove(at);
            }
        }
        self.free.push(slot);
        self.orders -= 1;
    }

    /// Empties one instrument's book.
    pub fn clear(&mut self, inst: usize) {
        for side in [Side::Buy, Side::Sell] {
            while let Some(level) = self.instruments[inst].side(side).last().copied() {
                let mut slot = level.head;
                while slot != NIL {
                    let node = self.nodes[slot as usize];
                    if let Some((entry, _)) = self.find(node.order_id, node.inst) {
                        self.table_remove(entry);
                    }
                    self.unlink(slot);
                    slot = node.next;
                }
            }
        }
    }

    /// Every order of one instrument in priority order (bids best first, then asks best
    /// first), as (order id, side, price, qty). For tests and tools: it allocates.
    pub fn orders_of(&self, security_id: u32) -> Vec<(u64, Side, i64, i64)> {
        let Some(inst) = self.by_security_id(security_id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for side in [Side::Buy, Side::Sell] {
            for level in inst.levels(side) {
                let mut slot = level.head;
                while slot != NIL {
                    let n = &self.nodes[slot as usize];
                    out.push((n.order_id, n.side, n.price, n.qty));
                    slot = n.next;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_marketdata::book::{BookOrder, OrderBook};
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_default_limits_pass_and_fit_in_a_gibibyte() {
        let limits = Limits::default();
        assert_eq!(limits.check(), Ok(()));
        let list = limits.preallocations();
        assert_eq!(bourse_engine::capacity::check_fits(&list, GIB), Ok(()));
    }

    #[test]
    fn an_orders_max_past_the_u32_slots_is_refused_before_any_arithmetic() {
        let limits = Limits {
            orders_max: usize::MAX,
            ..Limits::default()
        };
        let text = limits.check().unwrap_err();
        assert!(
            text.starts_with("orders_max 18446744073709551615 is out of range"),
            "{text}"
        );
    }

    #[test]
    fn huge_levels_are_charged_to_the_instruments_without_overflow() {
        let limits = Limits {
            levels_per_side_max: usize::MAX,
            ..Limits::default()
        };
        let list = limits.preallocations();
        let text = bourse_engine::capacity::check_fits(&list, GIB).unwrap_err();
        assert!(
            text.starts_with("instruments_max 64 needs 16.0 EiB"),
            "{text}"
        );
        assert!(text.contains(&format!("{} per side", usize::MAX)), "{text}");
    }

    fn small() -> Books {
        Books::new(Limits {
            instruments_max: 2,
            orders_max: 64,
            levels_per_side_max: 8,
        })
    }

    #[test]
    fn best_ask_follows_adds_and_removes() {
        let mut b = small();
        let i = b.index_of(7).unwrap();
        assert_eq!(b.instrument(i).best_ask(), None);
        b.add(i, 1, Side::Sell, 105, 1).unwrap();
        b.add(i, 2, Side::Sell, 103, 1).unwrap();
        b.add(i, 3, Side::Buy, 101, 1).unwrap();
        assert_eq!(b.instrument(i).best_ask(), Some(103));
        b.remove(i, 2).unwrap();
        assert_eq!(b.instrument(i).best_ask(), Some(105));
        assert_eq!(b.remove(i, 2), Err(BookError::UnknownOrder));
        assert_eq!(b.add(i, 1, Side::Buy, 1, 1), Err(BookError::DuplicateOrder));
        b.clear(i);
        assert_eq!(b.orders(), 0);
        assert_eq!(b.instrument(i).best_ask(), None);
    }

    #[test]
    fn limits_refuse_rather_than_grow() {
        let mut b = small();
        let i = b.index_of(1).unwrap();
        for p in 0..8 {
            b.add(i, p as u64, Side::Buy, p, 1).unwrap();
        }
        assert_eq!(b.add(i, 100, Side::Buy, 100, 1), Err(BookError::LevelsFull));
        b.index_of(2).unwrap();
        assert_eq!(b.index_of(3), Err(BookError::InstrumentsFull));
        assert_eq!(
            b.add(i, 101, Side::Buy, 0, 0),
            Err(BookError::QtyNotPositive)
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Add(u64, bool, i64, i64),
        Change(u64, i64),
        Remove(u64),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u64..40, any::<bool>(), 90i64..110, 1i64..50).prop_map(|(id, b, p, q)| Op::Add(id, b, p, q)),
            2 => (0u64..40, 1i64..50).prop_map(|(id, q)| Op::Change(id, q)),
            3 => (0u64..40).prop_map(Op::Remove),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// Whatever the ids look like (strides that collide in the table, values near the
        /// top of the range), the table finds every order and loses none.
        #[test]
        fn any_id_pattern_is_found_and_removed(
            start in any::<u64>(),
            stride in prop_oneof![Just(1u64), Just(128), Just(1 << 20), any::<u64>()],
            removals in proptest::collection::vec(0usize..60, 0..60),
        ) {
            let mut b = Books::new(Limits { instruments_max: 2, orders_max: 64, levels_per_side_max: 64 });
            let i = b.index_of(9).unwrap();
            let ids: Vec<u64> = (0..60u64).map(|k| start.wrapping_add(k.wrapping_mul(stride))).collect();
            let mut live = std::collections::BTreeSet::new();
            for &id in &ids {
                prop_assert_eq!(b.add(i, id, Side::Sell, (id % 50) as i64, 1).is_ok(), live.insert(id));
            }
            for k in removals {
                prop_assert_eq!(b.remove(i, ids[k]).is_ok(), live.remove(&ids[k]));
            }
            let mut left: Vec<u64> = b.orders_of(9).iter().map(|o| o.0).collect();
            left.sort_unstable();
            prop_assert_eq!(left, live.into_iter().collect::<Vec<_>>());
        }

        /// The client's book and the market data library's book agree order by order after
        /// any sequence of updates (refused ones included).
        #[test]
        fn matches_the_marketdata_order_book(ops in proptest::collection::vec(op(), 0..300)) {
            let mut mine = Books::new(Limits { instruments_max: 1, orders_max: 64, levels_per_side_max: 64 });
            let i = mine.index_of(5).unwrap();
            let mut theirs = OrderBook::new();
            for op in ops {
                match op {
                    Op::Add(id, buy, price, qty) => {
                        let side = if buy { Side::Buy } else { Side::Sell };
                        let a = mine.add(i, id, side, price, qty).is_ok();
                        let b = theirs.add(BookOrder { order_id: id, side, price, qty, ts_ns: 0 }).is_ok();
                        prop_assert_eq!(a, b);
                    }
                    Op::Change(id, qty) => {
                        prop_assert_eq!(mine.change_qty(i, id, qty).is_ok(), theirs.change_qty(id, qty).is_ok());
                    }
                    Op::Remove(id) => {
                        prop_assert_eq!(mine.remove(i, id).is_ok(), theirs.remove(id).is_ok());
                    }
                    Op::Clear => {
                        mine.clear(i);
                        theirs.clear();
                    }
                }
                let a = mine.orders_of(5);
                let b: Vec<_> = theirs.orders().map(|o| (o.order_id, o.side, o.price, o.qty)).collect();
                prop_assert_eq!(a, b);
                prop_assert_eq!(mine.instrument(i).best_ask(), theirs.best(Side::Sell).map(|l| l.price));
                let la: Vec<_> = mine.instrument(i).levels(Side::Buy).map(|l| (l.price, l.qty, l.orders)).collect();
                let lb: Vec<_> = theirs.levels(Side::Buy).map(|l| (l.price, l.qty, l.orders)).collect();
                prop_assert_eq!(la, lb);
            }
        }
    }
}
