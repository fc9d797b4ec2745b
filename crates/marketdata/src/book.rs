//! An order-level book of one instrument, as market data sees it: orders in price-time
//! priority, with aggregated levels kept in step.
//!
//! The publisher keeps one per instrument (its own view of what it has published, so it can
//! tell a resting order from one that never rested, and build snapshots); the subscriber keeps
//! one per instrument (the book it rebuilds from the order log). Sharing the type is what makes
//! "the subscriber's book equals the publisher's" a comparison of like with like.
//!
//! Orders live in a slab with a free list and are linked into a FIFO per price level, so adds,
//! deletes and changes are O(log levels) and allocate only when the slab or a new level grows.

use bourse_core::Side;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

const NIL: u32 = u32::MAX;

/// One resting order as market data shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BookOrder {
    pub order_id: u64,
    pub side: Side,
    pub price: i64,
    /// Visible quantity.
    pub qty: i64,
    /// When the order took its place in the queue (ns since the epoch).
    pub ts_ns: u64,
}

/// One aggregated price level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LevelView {
    pub price: i64,
    /// Sum of visible quantity.
    pub qty: i64,
    pub orders: u32,
}

/// Why a book update could not be applied: the update and the book disagree, so the book can
/// no longer be trusted and must be recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BookError {
    DuplicateOrder(u64),
    UnknownOrder(u64),
    QtyNotPositive(u64),
    /// The book holds `ORDERS_PER_BOOK_MAX` orders already.
    Full,
}

/// Most orders one book holds; an order log describing more is treated as corrupt.
pub const ORDERS_PER_BOOK_MAX: usize = 4_000_000;

#[derive(Clone, Copy, Debug)]
struct Node {
    order: BookOrder,
    prev: u32,
    next: u32,
}

#[derive(Clone, Copy, Debug)]
struct Level {
    head: u32,
    tail: u32,
    qty: i64,
    orders: u32,
}

/// The book of one instrument.
#[derive(Clone, Debug, Default)]
pub struct OrderBook {
    nodes: Vec<Node>,
    free: Vec<u32>,
    index: FxHashMap<u64, u32>,
    bids: BTreeMap<i64, Level>,
    asks: BTreeMap<i64, Level>,
}

impl OrderBook {
    pub fn new() -> OrderBook {
        OrderBook::default()
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn clear(&mut self) {
        self.nodes.clear();
        self.free.clear();
        self.index.clear();
        self.bids.clear();
        self.asks.clear();
    }

    pub fn get(&self, order_id: u64) -> Option<&BookOrder> {
        self.index
            .get(&order_id)
            .map(|&s| &self.nodes[s as usize].order)
    }

    fn levels_mut(&mut self, side: Side) -> &mut BTreeMap<i64, Level> {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }

    /// Adds an order at the back of its price level's queue.
    pub fn add(&mut self, order: BookOrder) -> Result<(), BookError> {
        if order.qty <= 0 {
            return Err(BookError::QtyNotPositive(order.order_id));
        }
        if self.index.contains_key(&order.order_id) {
            return Err(BookError::DuplicateOrder(order.order_id));
        }
        if self.index.len() >= ORDERS_PER_BOOK_MAX {
            return Err(BookError::Full);
        }
        let node = Node {
            order,
            prev: NIL,
            next: NIL,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.nodes[s as usize] = node;
                s
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.insert(order.order_id, slot);
        let level = self
            .levels_mut(order.side)
            .entry(order.price)
            .or_insert(Level {
                head: NIL,
                tail: NIL,
                qty: 0,
                orders: 0,
            });
        let tail = level.tail;
        level.tail = slot;
        if level.head == NIL {
            level.head = slot;
        }
        level.qty += order.qty;
        level.orders += 1;
        self.nodes[slot as usize].prev = tail;
        if tail != NIL {
            self.nodes[tail as usize].next = slot;
        }
        Ok(())
    }

    /// Sets an order's visible quantity in place (it keeps its queue position).
    pub fn change_qty(&mut self, order_id: u64, qty: i64) -> Result<(), BookError> {
        if qty <= 0 {
            return Err(BookError::QtyNotPositive(order_id));
        }
        let &slot = self
            .index
            .get(&order_id)
            .ok_or(BookError::UnknownOrder(order_id))?;
        let o = self.nodes[slot as usize].order;
        let delta = qty - o.qty;
        self.nodes[slot as usize].order.qty = qty;
        if let Some(level) = self.levels_mut(o.side).get_mut(&o.price) {
            level.qty += delta;
        }
        Ok(())
    }

    /// Removes an order and returns it.
    pub fn remove(&mut self, order_id: u64) -> Result<BookOrder, BookError> {
        let slot = self
            .index
            .remove(&order_id)
            .ok_or(BookError::UnknownOrder(order_id))?;
        let Node { order, prev, next } = self.nodes[slot as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        }
        let levels = self.levels_mut(order.side);
        let mut empty = false;
        if let Some(level) = levels.get_mut(&order.price) {
            if level.head == slot {
                level.head = next;
            }
            if level.tail == slot {
                level.tail = prev;
            }
            level.qty -= order.qty;
            level.orders -= 1;
            empty = level.orders == 0;
        }
        if empty {
            levels.remove(&order.price);
        }
        self.free.push(slot);
        Ok(order)
    }

    /// Aggregated levels of one side, best first.
    pub fn levels(&self, side: Side) -> Box<dyn Iterator<Item = LevelView> + '_> {
        let view = |(&price, l): (&i64, &Level)| LevelView {
            price,
            qty: l.qty,
            orders: l.orders,
        };
        match side {
            Side::Buy => Box::new(self.bids.iter().rev().map(view)),
            Side::Sell => Box::new(self.asks.iter().map(view)),
        }
    }

    /// The best level of one side.
    pub fn best(&self, side: Side) -> Option<LevelView> {
        let level = match side {
            Side::Buy => self.bids.iter().next_back(),
            Side::Sell => self.asks.iter().next(),
        };
        level.map(|(&price, l)| LevelView {
            price,
            qty: l.qty,
            orders: l.orders,
        })
    }

    /// Writes up to `out.len()` levels of `side`, best first, and returns how many. No
    /// allocation: the publisher calls this after every batch.
    pub fn top_into(&self, side: Side, out: &mut [LevelView]) -> usize {
        // Two loops rather than `levels()`: that one boxes its iterator, and this runs after
        // every batch.
        let view = |(&price, l): (&i64, &Level)| LevelView {
            price,
            qty: l.qty,
            orders: l.orders,
        };
        let mut n = 0;
        match side {
            Side::Buy => {
                for (slot, level) in out.iter_mut().zip(self.bids.iter().rev().map(view)) {
                    *slot = level;
                    n += 1;
                }
            }
            Side::Sell => {
                for (slot, level) in out.iter_mut().zip(self.asks.iter().map(view)) {
                    *slot = level;
                    n += 1;
                }
            }
        }
        n
    }

    /// The orders of one side in priority order: best price first, then time.
    pub fn side_orders(&self, side: Side) -> SideOrders<'_> {
        let levels: Box<dyn Iterator<Item = &Level> + '_> = match side {
            Side::Buy => Box::new(self.bids.values().rev()),
            Side::Sell => Box::new(self.asks.values()),
        };
        SideOrders {
            book: self,
            levels,
            slot: NIL,
        }
    }

    /// Every order in priority order: bids best first, then asks best first (the order of
    /// `bourse_engine::Engine::resting_orders`).
    pub fn orders(&self) -> impl Iterator<Item = &BookOrder> + '_ {
        self.side_orders(Side::Buy)
            .chain(self.side_orders(Side::Sell))
    }
}

/// Iterator over one side's orders in priority order.
pub struct SideOrders<'a> {
    book: &'a OrderBook,
    levels: Box<dyn Iterator<Item = &'a Level> + 'a>,
    slot: u32,
}

impl<'a> Iterator for SideOrders<'a> {
    type Item = &'a BookOrder;
    fn next(&mut self) -> Option<&'a BookOrder> {
        while self.slot == NIL {
            self.slot = self.levels.next()?.head;
        }
        let node = &self.book.nodes[self.slot as usize];
        self.slot = node.next;
        Some(&node.order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(id: u64, side: Side, price: i64, qty: i64) -> BookOrder {
        BookOrder {
            order_id: id,
            side,
            price,
            qty,
            ts_ns: id,
        }
    }

    #[test]
    fn orders_come_out_in_price_time_priority() {
        let mut b = OrderBook::new();
        b.add(o(1, Side::Buy, 100, 5)).unwrap();
        b.add(o(2, Side::Buy, 101, 5)).unwrap();
        b.add(o(3, Side::Buy, 100, 7)).unwrap();
        b.add(o(4, Side::Sell, 103, 1)).unwrap();
        b.add(o(5, Side::Sell, 102, 2)).unwrap();
        let ids: Vec<u64> = b.orders().map(|o| o.order_id).collect();
        assert_eq!(ids, vec![2, 1, 3, 5, 4]);
        b.remove(1).unwrap();
        b.change_qty(3, 2).unwrap();
        assert_eq!(
            b.best(Side::Buy),
            Some(LevelView {
                price: 101,
                qty: 5,
                orders: 1
            })
        );
        let bids: Vec<LevelView> = b.levels(Side::Buy).collect();
        assert_eq!(
            bids[1],
            LevelView {
                price: 100,
                qty: 2,
                orders: 1
            }
        );
        assert_eq!(b.remove(1), Err(BookError::UnknownOrder(1)));
        assert_eq!(
            b.add(o(2, Side::Buy, 1, 1)),
            Err(BookError::DuplicateOrder(2))
        );
        b.remove(2).unwrap();
        b.remove(3).unwrap();
        assert!(b.best(Side::Buy).is_none());
        assert_eq!(b.len(), 2);
    }
}
