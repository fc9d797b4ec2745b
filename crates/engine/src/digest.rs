//! The state digest: a 64-bit hash of the whole trading state that the engine keeps up to
//! date as the state changes, so that replicas can compare their states at O(1) cost.
//!
//! [`Engine::state_hash`] hashes the snapshot bytes, which means encoding the whole state (over a
//! second at a million accounts). The digest instead is a *multiset hash*: the wrapping sum,
//! modulo 2^64, of one hash per piece of state (an *item*). When a piece changes, the engine
//! moves the sum by the difference between its new and old item hash, so the digest follows
//! every command for a few dozen instructions, and [`Engine::recompute_state_digest`] can
//! rebuild it from scratch by walking the state in its fixed order (the sum does not depend on
//! the order, but the walk never touches a hash map anyway). Restore recomputes it; `check_invariants` compares the two.
//!
//! Each item is its *key* (a hash of what identifies it, fixed for its life) plus its values
//! as a polynomial in `key | 1`: `v1 * c + v2 * c^2 + ...` modulo 2^64, with `c` the key made
//! odd. The polynomial is linear in the values, so a change by `d` moves the digest by the
//! polynomial of `d` (a few multiplies, no old value needed), while each item has its own
//! pseudo-random point `c`, so differences in different items or fields do not line up. A
//! difference in a single value always shows (`c` is odd, hence invertible modulo 2^64). The
//! items:
//! - **Resting order** (the pool keeps these, [`crate::book::OrderPool`]): key over its id,
//!   owner, book, side, time in force, iceberg display size, expiry and `rec` (hashed once,
//!   when it is admitted); values: client order id, price (with the market flag), total, filled and visible
//!   quantities, the position it holds back. Its time priority enters as the id of the order
//!   ahead of it in its queue (0 at the head), times a second coefficient drawn from the key:
//!   the set of (order, predecessor) pairs fixes every queue's order, survives snapshot and
//!   restore (slot numbers would not), and when an order leaves only its successor's term
//!   moves. The pool caches each resting order's key and item, so that taking an order out
//!   costs a subtraction.
//! - **Account**: key over its index, id, firm, short permission and self-trade settings;
//!   values: cash, reserved cash, locked margin.
//! - **Position**: key from its owner's key plus an odd multiple of its book; values: net
//!   quantity, cost, lots held back by sells, open buy and sell quantities.
//! - **Book**: one hash (cached, rehashed when it changes) of its index, its instrument's
//!   definition (hashed once, when it is added), phase and reference price (the last trade
//!   price, which also sets the band).
//! - **Engine**: the next order, trade, `rec` and `seq` numbers, the counters and the limits.
//!   These change with every command, so they are not kept in the sum: [`Engine::state_digest`]
//!   hashes them with the sum when it is asked (a dozen words, O(1)).
//!
//! Amounts are taken modulo 2^64 (states whose amounts differ by an exact multiple of 2^64
//! cash units, 1.8 * 10^15 in currency, would not be told apart).
//!
//! Left out, because they are functions of what is hashed and `check_invariants` proves them
//! so: each order's open quantity (total minus filled) and cash reservation
//! (`risk::cash_required`), level totals, price bands, lookup tables, slot numbers and empty
//! level placeholders (which a restore does not rebuild either). Everything the snapshot
//! writes is covered either directly or through these functions.
//!
//! Keys and the book and engine hashes use a mixer of two lanes of xor, multiply by an odd
//! constant and rotate (each step a bijection of the lane, so inputs that differ in one word
//! always differ), joined by the murmur3 64-bit finalizer. Nothing here reads a clock,
//! allocates or iterates a hash map. The digest detects accidental divergence (a replica that
//! applied something differently), not an adversary: anyone who can choose the state can
//! choose a collision.

use crate::book::{Book, Order};
use crate::risk::{Account, Position};
use crate::snapshot::{market_code, phase_code, side_code, stp_code, tif_code};
use crate::Engine;
use bourse_core::{Instrument, Side, StpScope};

/// The odd multiplier of the lanes.
const K_LANE: u64 = 0x9fb2_1c65_1e98_df25;
/// The starting state of the second lane (any constant different from the tags).
const LANE_B: u64 = 0x6a09_e667_f3bc_c909;

// Domain tags: one per kind of item, so that items of different kinds never cancel.
const TAG_ORDER_KEY: u64 = 0x3c6e_f372_fe94_f82b;
const TAG_ACCOUNT: u64 = 0x510e_527f_ade6_82d1;
const TAG_POSITION: u64 = 0x1f83_d9ab_fb41_bd6b;
const TAG_INSTRUMENT: u64 = 0xcbbb_9d5d_c105_9ed8;
const TAG_BOOK: u64 = 0x629a_292a_367c_d507;
const TAG_ENGINE: u64 = 0x9159_015a_3070_dd17;
const TAG_SUSPENDED: u64 = 0x152f_ecd8_f70e_5939;
const TAG_MARGIN_CALLS: u64 = 0x7a3c_51e9_0b6d_24f1;
const TAG_AUCTION: u64 = 0x2d4f_8e17_c3a9_6b05;

/// The murmur3 64-bit finalizer: a bijection that spreads every input bit over the output.
#[inline(always)]
pub(crate) fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Hashes a few words under a domain tag.
#[inline(always)]
fn mix<const N: usize>(tag: u64, w: [u64; N]) -> u64 {
    let mut a = tag;
    let mut b = tag ^ LANE_B;
    let mut i = 0;
    while i + 1 < N {
        // Rotating after the multiply brings the high bits (which a multiply only moves up)
        // back down, where the next multiply spreads them.
        a = (a ^ w[i]).wrapping_mul(K_LANE).rotate_left(29);
        b = (b ^ w[i + 1]).wrapping_mul(K_LANE).rotate_left(29);
        i += 2;
    }
    if N % 2 == 1 {
        a = (a ^ w[N - 1]).wrapping_mul(K_LANE).rotate_left(29);
    }
    fmix64(a ^ b.rotate_left(32) ^ N as u64)
}

/// `v[0] * c + v[1] * c^2 + ... + v[n-1] * c^n` modulo 2^64 (Horner's rule: one multiply and
/// one add per value). Linear in `v`, so a change of some values by `d` moves it by
/// `poly(c, d)`.
#[inline(always)]
fn poly<const N: usize>(c: u64, v: [u64; N]) -> u64 {
    let mut acc = 0u64;
    let mut i = N;
    while i > 0 {
        i -= 1;
        acc = acc.wrapping_add(v[i]).wrapping_mul(c);
    }
    acc
}

/// The low 64 bits of an amount: amounts enter the digest modulo 2^64 (two states whose
/// amounts differ by an exact multiple of 2^64 cash units, 1.8 * 10^15 in currency, would
/// not be told apart).
fn lo(v: i128) -> u64 {
    v as u64
}
fn hi(v: i128) -> u64 {
    (v >> 64) as u64
}

/// The part of an order that never changes while it lives: its identity in the digest.
#[inline]
pub(crate) fn order_key(o: &Order) -> u64 {
    let codes = side_code(o.side) as u64 | (tif_code(o.tif) as u64) << 8;
    mix(
        TAG_ORDER_KEY,
        [
            o.id.0,
            (o.account as u64) << 32 | o.book as u64,
            codes,
            o.display_size as u64,
            o.expire_ts_ns,
            o.rec,
        ],
    )
}

/// A resting order's item, given its key and the id of the order ahead of it in its queue (0
/// at the head): the key, plus its client order id, price, total, filled and visible
/// quantities and the position it holds back as a polynomial in `key | 1`, plus the
/// predecessor's term.
///
/// The predecessor has a separate linear term, `prev_id * (key.rotate_left(32) | 1)`, so that
/// when the order ahead leaves only that term moves (one multiply).
#[inline]
pub(crate) fn order_item(key: u64, o: &Order, prev_id: u64) -> u64 {
    key.wrapping_add(poly(
        key | 1,
        [
            o.cl_ord_id.0,
            // A price is positive, so its top bit is free for the market flag (which a
            // replace with a price clears, so it is a value, not part of the key).
            o.price as u64 | (o.market as u64) << 63,
            o.qty_total as u64,
            o.qty_filled as u64,
            o.qty_display as u64,
            o.reserved_pos as u64,
        ],
    ))
    .wrapping_add(link_term(key, prev_id))
}

/// The term of an order's predecessor (see [`order_item`]); linear in `prev_id`.
#[inline(always)]
pub(crate) fn link_term(key: u64, prev_id: u64) -> u64 {
    prev_id.wrapping_mul(key.rotate_left(32) | 1)
}

/// An account's identity (index, id, firm, short permission, self-trade settings), fixed
/// once it is added: its key in the digest.
#[inline]
pub(crate) fn account_key(index: u32, a: &Account) -> u64 {
    let settings = a.may_short as u64
        | (stp_code(a.stp) as u64) << 8
        | (match a.stp_scope {
            StpScope::Account => 0u64,
            StpScope::Firm => 1,
        }) << 16;
    mix(
        TAG_ACCOUNT,
        [
            (a.id.0 as u64) << 32 | index as u64,
            (a.firm.0 as u64) << 32 | settings,
        ],
    )
}

/// How an account's item moves when its cash, reserved cash and locked margin move by these
/// amounts (its item is its key plus this of its balances).
#[inline(always)]
pub(crate) fn account_delta(key: u64, cash: i128, reserved: i128, margin: i128) -> u64 {
    poly(key | 1, [lo(cash), lo(reserved), lo(margin)])
}

/// A position's key: its owner's key (already a finalized hash, so pseudo-random) moved by
/// an odd multiple of its book, so that each (owner, book) has its own key and point.
#[inline(always)]
pub(crate) fn position_key(account_key: u64, book: u32) -> u64 {
    account_key.wrapping_add((book as u64 + 1).wrapping_mul(TAG_POSITION | 1))
}

/// The changes of one position, for [`position_delta`].
#[derive(Clone, Copy, Default)]
pub(crate) struct PositionChange {
    pub qty: i64,
    pub cost: i128,
    pub sell_reserved: i64,
    pub buy_open: i64,
    pub sell_open: i64,
}

/// How a position's item moves with these changes (its item is its key plus this of its
/// values).
#[inline(always)]
pub(crate) fn position_delta(key: u64, d: PositionChange) -> u64 {
    poly(
        key | 1,
        [
            d.qty as u64,
            lo(d.cost),
            d.sell_reserved as u64,
            d.buy_open as u64,
            d.sell_open as u64,
        ],
    )
}

fn position_item(account_key: u64, p: &Position) -> u64 {
    let key = position_key(account_key, p.book);
    key.wrapping_add(position_delta(
        key,
        PositionChange {
            qty: p.qty,
            cost: p.cost(),
            sell_reserved: p.sell_reserved,
            buy_open: p.buy_open,
            sell_open: p.sell_open,
        },
    ))
}

/// Everything of an instrument's definition except the reference price (which moves with
/// trading and is part of the book's item). Computed once, when the book is made.
pub(crate) fn instrument_digest(d: &Instrument) -> u64 {
    mix(
        TAG_INSTRUMENT,
        [
            d.instrument.0 as u64 | (market_code(d.market) as u64) << 32,
            xxhash_rust::xxh3::xxh3_64(d.symbol.as_bytes()),
            d.price_scale as u64 | (d.band_bps as u64) << 32,
            d.tick.0 as u64,
            d.lot_size as u64,
            d.multiplier as u64,
            lo(d.initial_margin.0),
            hi(d.initial_margin.0),
            d.volatility.dynamic_bps as u64 | (d.volatility.static_bps as u64) << 32,
            d.volatility.auction_ns,
        ],
    )
}

/// A book's call auction state (static reference, official close, volatility auction end,
/// indicative uncrossing last published). Cached in the book (`Book::auction_digest`) and
/// folded into its item, so that the item of a trade's book costs what it did.
pub(crate) fn auction_digest(a: &crate::book::AuctionState) -> u64 {
    mix(
        TAG_AUCTION,
        [
            a.static_ref as u64,
            a.close as u64,
            a.end_ns,
            a.indicative.price as u64,
            a.indicative.qty as u64,
            a.indicative.surplus as u64,
        ],
    )
}

/// A book: its index, its instrument (`def_digest`, from [`instrument_digest`]), its call
/// auction state ([`auction_digest`], cached), its phase and its reference price.
#[inline]
pub(crate) fn book_item(index: u32, b: &Book, def_digest: u64, auction: u64) -> u64 {
    mix(
        TAG_BOOK,
        [
            index as u64 | (phase_code(b.phase) as u64) << 32,
            def_digest ^ auction,
            b.def.reference_price.0 as u64,
        ],
    )
}

impl Engine {
    /// The state digest (see the module documentation of `digest`): equal on every replica
    /// that applied the same commands, and after [`Engine::snapshot`] and [`Engine::restore`].
    /// O(1): the engine keeps the sum of its items up to date.
    pub fn state_digest(&self) -> u64 {
        self.finish_digest(self.pool.digest().wrapping_add(self.digest_items))
    }

    /// The state digest computed from scratch by walking the whole state: what
    /// [`Engine::state_digest`] must equal. O(state); for checks and tests.
    pub fn recompute_state_digest(&self) -> u64 {
        self.finish_digest(
            self.recompute_order_items()
                .wrapping_add(self.recompute_other_items()),
        )
    }

    /// Hashes the item sum with the engine's numbers, counters and limits.
    fn finish_digest(&self, items: u64) -> u64 {
        let c = &self.counters;
        let g = &self.config;
        mix(
            TAG_ENGINE,
            [
                items,
                self.next_order_id,
                self.next_trade_id,
                self.next_rec,
                self.next_seq,
                c.commands,
                c.orders_accepted,
                c.orders_rejected,
                c.trades,
                c.cancels,
                c.replaces,
                c.expiries,
                c.volume_lots as u64,
                (c.volume_lots >> 64) as u64,
                g.orders_max as u64 | (g.instruments_max as u64) << 32,
                g.accounts_max as u64 | (g.levels_per_side_hint as u64) << 32,
                g.first_order_id,
                self.suspension_digest(),
                self.margin_call_digest(),
            ],
        )
    }

    /// A hash of the kill switches engaged (two short sorted lists, folded in order; 0 when
    /// none is).
    fn suspension_digest(&self) -> u64 {
        let (firms, accounts) = self.suspended();
        if firms.is_empty() && accounts.is_empty() {
            return 0;
        }
        let mut h = mix(TAG_SUSPENDED, [firms.len() as u64, accounts.len() as u64]);
        for f in firms {
            h = mix(TAG_SUSPENDED, [h, 1, u64::from(f.0)]);
        }
        for a in accounts {
            h = mix(TAG_SUSPENDED, [h, 2, u64::from(a.0)]);
        }
        h
    }

    /// A hash of the margin calls open (a short sorted list, folded in order; 0 when none is).
    fn margin_call_digest(&self) -> u64 {
        let calls = self.margin_calls();
        if calls.is_empty() {
            return 0;
        }
        let mut h = mix(TAG_MARGIN_CALLS, [calls.len() as u64, 0]);
        for &(a, amount) in calls {
            h = mix(
                TAG_MARGIN_CALLS,
                [h, u64::from(a.0), amount as u64, (amount >> 64) as u64],
            );
        }
        h
    }

    /// The sum of the resting orders' items, from scratch (keys included).
    pub(crate) fn recompute_order_items(&self) -> u64 {
        let mut sum = 0u64;
        for book in &self.books {
            for side in [Side::Buy, Side::Sell] {
                for level in book.side(side).iter() {
                    let mut prev_id = 0;
                    let mut slot = level.head;
                    while slot != crate::book::NIL {
                        let o = self.pool.get(slot);
                        sum = sum.wrapping_add(order_item(order_key(o), o, prev_id));
                        prev_id = o.id.0;
                        slot = o.next;
                    }
                }
            }
        }
        sum
    }

    /// The sum of the books', accounts' and positions' items, from scratch.
    pub(crate) fn recompute_other_items(&self) -> u64 {
        let mut sum = 0u64;
        for (b, book) in self.books.iter().enumerate() {
            let item = book_item(
                b as u32,
                book,
                instrument_digest(&book.def),
                auction_digest(&book.auction),
            );
            sum = sum.wrapping_add(item);
        }
        for (a, acc) in self.accounts.iter().enumerate() {
            let key = account_key(a as u32, acc);
            sum = sum.wrapping_add(key).wrapping_add(account_delta(
                key,
                acc.cash,
                acc.reserved_cash,
                acc.margin_locked,
            ));
            for p in &acc.positions {
                sum = sum.wrapping_add(position_item(key, p));
            }
        }
        sum
    }

    /// Sets every cached key and item and the sums from the state (after a restore).
    pub(crate) fn rebuild_digest(&mut self) {
        for (b, book) in self.books.iter_mut().enumerate() {
            book.def_digest = instrument_digest(&book.def);
            book.auction_digest = auction_digest(&book.auction);
            book.digest_item = book_item(b as u32, book, book.def_digest, book.auction_digest);
        }
        for (a, acc) in self.accounts.iter_mut().enumerate() {
            acc.digest_key = account_key(a as u32, acc);
        }
        self.pool.rebuild_digest();
        self.digest_items = self.recompute_other_items();
    }

    /// Checks the cached keys and items and the sums against the state; describes the first
    /// mismatch.
    pub(crate) fn check_digest(&self) -> Result<(), String> {
        for (b, book) in self.books.iter().enumerate() {
            if book.def_digest != instrument_digest(&book.def)
                || book.auction_digest != auction_digest(&book.auction)
                || book.digest_item
                    != book_item(b as u32, book, book.def_digest, book.auction_digest)
            {
                return Err(format!("book {b}: cached digest item is stale"));
            }
        }
        for (a, acc) in self.accounts.iter().enumerate() {
            if acc.digest_key != account_key(a as u32, acc) {
                return Err(format!("account {}: cached digest key is stale", acc.id));
            }
        }
        if let Some(slot) = self.pool.stale_digest_slot() {
            return Err(format!(
                "order {}: cached digest item is stale",
                self.pool.get(slot).id
            ));
        }
        if self.pool.digest() != self.recompute_order_items() {
            return Err("the orders' digest sum disagrees with the orders".into());
        }
        if self.digest_items != self.recompute_other_items() {
            return Err("the accounts' and books' digest sum disagrees with the state".into());
        }
        Ok(())
    }

    // ----- maintenance, called where the state changes -----

    /// Rehashes book `b` after its call auction state changed (and its phase or reference
    /// price, if they did too).
    pub(crate) fn digest_auction(&mut self, b: u32) {
        let book = &mut self.books[b as usize];
        book.auction_digest = auction_digest(&book.auction);
        self.digest_book(b);
    }

    /// Rehashes book `b` after its phase or reference price changed.
    #[inline]
    pub(crate) fn digest_book(&mut self, b: u32) {
        let book = &mut self.books[b as usize];
        let new = book_item(b, book, book.def_digest, book.auction_digest);
        self.digest_items = self
            .digest_items
            .wrapping_sub(book.digest_item)
            .wrapping_add(new);
        book.digest_item = new;
    }

    /// Adds a new account (with nothing in it) to the digest.
    pub(crate) fn digest_account_added(&mut self, a: u32) {
        let acc = &mut self.accounts[a as usize];
        acc.digest_key = account_key(a, acc);
        self.digest_items = self.digest_items.wrapping_add(acc.digest_key);
    }

    /// Account `a`'s cash, reserved cash and locked margin moved by these amounts.
    #[inline]
    pub(crate) fn digest_account_moved(
        &mut self,
        a: u32,
        cash: i128,
        reserved: i128,
        margin: i128,
    ) {
        let key = self.accounts[a as usize].digest_key;
        self.digest_items = self
            .digest_items
            .wrapping_add(account_delta(key, cash, reserved, margin));
    }

    /// Account `a`'s position in `book` changed by `change` (and was created just before, if
    /// `created`).
    #[inline]
    pub(crate) fn digest_position_moved(
        &mut self,
        a: u32,
        book: u32,
        created: bool,
        change: PositionChange,
    ) {
        let key = position_key(self.accounts[a as usize].digest_key, book);
        let mut items = self.digest_items.wrapping_add(position_delta(key, change));
        if created {
            items = items.wrapping_add(key);
        }
        self.digest_items = items;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, Driver};
    use crate::EngineConfig;
    use bourse_core::*;

    fn config() -> EngineConfig {
        EngineConfig {
            orders_max: 1024,
            instruments_max: 8,
            accounts_max: 64,
            levels_per_side_hint: 8,
            first_order_id: 1,
        }
    }

    fn order(account: u32, cl: u64, side: Side, price: i64, qty: i64) -> CommandBody {
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(account),
            cl_ord_id: ClOrdId(cl),
            instrument: InstrumentId(1),
            side,
            ord_type: OrdType::Limit,
            price: Price(price),
            qty: Qty(qty),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        })
    }

    /// Two instruments, three accounts with cash and shares, a few resting orders (two at one
    /// price, so that a queue has an order behind its head) and a trade.
    fn market() -> Driver {
        let mut d = Driver::new(config());
        d.run(CommandBody::AddInstrument(fixtures::equity(1, "A", 10_000)));
        d.run(CommandBody::AddInstrument(fixtures::future(
            2, "F", 100_000,
        )));
        for id in 1..=3 {
            d.run(CommandBody::AddAccount(AccountSpec {
                account: AccountId(id),
                firm: FirmId(id),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            }));
            d.run(CommandBody::Deposit {
                account: AccountId(id),
                amount: Cash(1_000_000_000_000),
            });
        }
        d.run(order(1, 1, Side::Buy, 9_990, 5));
        d.run(order(2, 2, Side::Buy, 9_990, 7));
        d.run(order(3, 3, Side::Sell, 10_010, 4));
        d.run(order(3, 4, Side::Sell, 9_990, 2));
        assert!(d.engine.live_orders() >= 3);
        d.engine.check_invariants().unwrap();
        d
    }

    fn detects(what: &str, corrupt: impl FnOnce(&mut Engine)) {
        let mut d = market();
        let before = d.engine.state_digest();
        assert_eq!(before, d.engine.recompute_state_digest());
        corrupt(&mut d.engine);
        assert_ne!(
            d.engine.recompute_state_digest(),
            d.engine.state_digest(),
            "{what}: a corrupted state recomputes to the maintained digest"
        );
        let why = d.engine.check_invariants().expect_err(what);
        assert!(!why.is_empty());
    }

    #[test]
    fn a_corrupted_field_is_found_by_recomputing() {
        detects("cash", |e| e.accounts[0].cash += 1);
        detects("reserved cash", |e| e.accounts[1].reserved_cash += 1);
        detects("firm", |e| e.accounts[2].firm = FirmId(9));
        detects("reference price", |e| e.books[0].def.reference_price.0 += 1);
        detects("phase", |e| e.books[1].phase = Phase::Halted);
        detects("symbol", |e| e.books[1].def.symbol = "G".into());
        detects("position", |e| {
            let p = e.accounts[2].positions.first_mut().unwrap();
            p.qty += 1;
        });
        detects("open buys", |e| {
            let p = e.accounts[0].positions.first_mut().unwrap();
            p.buy_open += 1;
        });
        let first_resting = |e: &Engine| {
            let id = e.resting_orders(InstrumentId(1))[0].order_id;
            *e.order_index.get(&id).unwrap()
        };
        detects("order client id", |e| {
            let s = first_resting(e);
            e.pool.get_mut(s).cl_ord_id = ClOrdId(77);
        });
        detects("order filled", |e| {
            let s = first_resting(e);
            e.pool.get_mut(s).qty_filled += 1;
        });
        detects("order expiry", |e| {
            let s = first_resting(e);
            e.pool.get_mut(s).expire_ts_ns = 5;
        });
    }

    #[test]
    fn swapping_two_orders_in_a_queue_changes_the_digest() {
        // The same orders at the same price in the other time order: a different state.
        let mut a = Driver::new(config());
        let mut b = Driver::new(config());
        for d in [&mut a, &mut b] {
            d.run(CommandBody::AddInstrument(fixtures::equity(1, "A", 10_000)));
            for id in 1..=2 {
                d.run(CommandBody::AddAccount(AccountSpec {
                    account: AccountId(id),
                    firm: FirmId(1),
                    may_short: true,
                    stp: StpMode::None,
                    stp_scope: StpScope::Account,
                }));
                d.run(CommandBody::Deposit {
                    account: AccountId(id),
                    amount: Cash(1_000_000_000_000),
                });
            }
        }
        a.run(order(1, 1, Side::Buy, 9_990, 5));
        a.run(order(2, 1, Side::Buy, 9_990, 5));
        b.run(order(1, 1, Side::Buy, 9_990, 5));
        b.run(order(2, 1, Side::Buy, 9_990, 5));
        assert_eq!(a.engine.state_digest(), b.engine.state_digest());
        // Cancel and re-enter the first order on one engine only, the second on the other:
        // each ends with both orders (new ids on both), in opposite time order.
        let cancel = |account: u32| {
            CommandBody::Cancel(Cancel {
                account: AccountId(account),
                cl_ord_id: ClOrdId(2),
                target: OrderRef {
                    order_id: None,
                    orig_cl_ord_id: Some(ClOrdId(1)),
                },
            })
        };
        a.run(cancel(1));
        a.run(order(1, 3, Side::Buy, 9_990, 5));
        b.run(cancel(2));
        b.run(order(2, 3, Side::Buy, 9_990, 5));
        a.engine.check_invariants().unwrap();
        b.engine.check_invariants().unwrap();
        assert_ne!(a.engine.state_digest(), b.engine.state_digest());
    }

    #[test]
    fn the_engine_numbers_are_part_of_the_digest() {
        let mut d = market();
        let before = d.engine.state_digest();
        d.engine.next_seq += 1;
        assert_ne!(d.engine.state_digest(), before);
        assert_eq!(d.engine.state_digest(), d.engine.recompute_state_digest());
    }

    #[test]
    fn one_word_changes_the_item() {
        // Each lane step is a bijection: items that differ in one word never collide. Sample
        // single-bit changes in every position, the top bits included.
        let base = [3u64, 1 << 40, 77, u64::MAX, 0, 12345, 9, 1];
        let h = mix(TAG_ORDER_KEY, base);
        for i in 0..base.len() {
            for bit in [0, 1, 31, 32, 62, 63] {
                let mut w = base;
                w[i] ^= 1 << bit;
                assert_ne!(mix(TAG_ORDER_KEY, w), h, "word {i} bit {bit}");
            }
        }
        // Two top-bit flips in one lane do not cancel (without the rotation they would).
        let mut w = base;
        w[0] ^= 1 << 63;
        w[2] ^= 1 << 63;
        assert_ne!(mix(TAG_ORDER_KEY, w), h);
        assert_ne!(mix(TAG_ACCOUNT, base), h, "tags separate kinds");
    }
}
