//! [`Positions`] and [`FeeBases`]: per account and instrument, in key order, held compactly.
//!
//! A [`ClearingPosition`] has eight amounts as `i128`, because a product of price, lots, lot
//! size, multiplier and scale can exceed 64 bits; it is 192 bytes, and a `BTreeMap` entry of
//! it took 373 bytes resident (nodes are half full when keys arrive in order). At
//! 100,000,000 positions that is 37 GB. Almost every amount fits 64 bits, so an
//! [`AccountTable`] keeps each record packed (`Compact`: nine `i64`s for a position, 72
//! bytes; four for a fee base) in one vector per account, sorted by instrument and grown by
//! a quarter, under a `BTreeMap` of accounts: 80 bytes per position and 40 per fee base,
//! plus the vectors' spare slots. A position's start of day (six more amounts) is zero for
//! every position opened on the current business day, so it is held apart, in a second
//! sorted vector of the account, only for the positions an end-of-day run carried over
//! (56 bytes each).
//!
//! Every amount is converted with a checked conversion: a record is packed only when each of
//! its amounts fits, so nothing wraps. One that does not fit is kept whole in a side map (its
//! slot in the vector holds the key and a zero placeholder), and moves back when it fits
//! again. Iteration walks accounts and each account's vector in order, so the state stays
//! deterministic.

use std::collections::btree_map;
use std::collections::BTreeMap;
use std::fmt::Debug;

use bourse_core::{AccountId, Cash, InstrumentId};

use crate::fees::FeeBase;
use crate::state::{ClearingPosition, StartOfDay};

/// A record's key: account, then instrument (an account's records are adjacent).
pub type PositionKey = (AccountId, InstrumentId);

/// A record that packs into a smaller form when its amounts fit 64 bits.
pub trait Compact: Copy + Default + Debug + PartialEq + Eq {
    type Packed: Copy + Default + Debug + PartialEq + Eq;
    /// The part of a record that most records leave at zero (a position's start of day:
    /// zero for every position opened on the current clearing business day), held apart and
    /// only for the records where it is not.
    type Rare: Copy + Debug + PartialEq + Eq;
    /// `self` packed with its rare part (`None`: all zero), or `None` when one of its
    /// amounts does not fit.
    fn pack(&self) -> Option<(Self::Packed, Option<Self::Rare>)>;
    fn unpack(packed: &Self::Packed, rare: Option<&Self::Rare>) -> Self;
}

/// A position whose amounts all fit 64 bits, without its start of day: the fields of
/// [`ClearingPosition`], in its order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    qty: i64,
    securities_due: i64,
    lots_bought: i64,
    lots_sold: i64,
    cost_value: i64,
    paid_value: i64,
    realised_value: i64,
    vm_paid: i64,
    cash_due: i64,
}

/// A position's [`StartOfDay`] packed: only a position an end-of-day run carried over has
/// one that is not zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackedStartOfDay {
    qty: i64,
    lots_bought: i64,
    lots_sold: i64,
    paid_value: i64,
    realised_value: i64,
    vm_paid: i64,
}

impl Compact for ClearingPosition {
    type Packed = Packed;
    type Rare = PackedStartOfDay;

    fn pack(&self) -> Option<(Packed, Option<PackedStartOfDay>)> {
        let p = self;
        let n = |v: i128| i64::try_from(v).ok();
        let packed = Packed {
            qty: p.qty,
            securities_due: p.securities_due,
            lots_bought: p.lots_bought,
            lots_sold: p.lots_sold,
            cost_value: n(p.cost_value)?,
            paid_value: n(p.paid_value)?,
            realised_value: n(p.realised_value)?,
            vm_paid: n(p.vm_paid.0)?,
            cash_due: n(p.cash_due.0)?,
        };
        let sod = if p.sod == StartOfDay::default() {
            None
        } else {
            Some(PackedStartOfDay {
                qty: p.sod.qty,
                lots_bought: p.sod.lots_bought,
                lots_sold: p.sod.lots_sold,
                paid_value: n(p.sod.paid_value)?,
                realised_value: n(p.sod.realised_value)?,
                vm_paid: n(p.sod.vm_paid.0)?,
            })
        };
        Some((packed, sod))
    }

    fn unpack(packed: &Packed, sod: Option<&PackedStartOfDay>) -> ClearingPosition {
        let p = packed;
        let sod = sod.map_or_else(StartOfDay::default, |s| StartOfDay {
            qty: s.qty,
            paid_value: s.paid_value as i128,
            realised_value: s.realised_value as i128,
            vm_paid: Cash(s.vm_paid as i128),
            lots_bought: s.lots_bought,
            lots_sold: s.lots_sold,
        });
        ClearingPosition {
            qty: p.qty,
            cost_value: p.cost_value as i128,
            paid_value: p.paid_value as i128,
            realised_value: p.realised_value as i128,
            vm_paid: Cash(p.vm_paid as i128),
            securities_due: p.securities_due,
            cash_due: Cash(p.cash_due as i128),
            lots_bought: p.lots_bought,
            lots_sold: p.lots_sold,
            sod,
        }
    }
}

/// A fee base whose values fit 64 bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackedFeeBase {
    maker_value: i64,
    taker_value: i64,
    maker_lots: i64,
    taker_lots: i64,
}

impl Compact for FeeBase {
    type Packed = PackedFeeBase;
    /// A fee base has no part that is usually zero.
    type Rare = ();

    fn pack(&self) -> Option<(PackedFeeBase, Option<()>)> {
        let packed = PackedFeeBase {
            maker_value: i64::try_from(self.maker_value).ok()?,
            taker_value: i64::try_from(self.taker_value).ok()?,
            maker_lots: self.maker_lots,
            taker_lots: self.taker_lots,
        };
        Some((packed, None))
    }

    fn unpack(p: &PackedFeeBase, _: Option<&()>) -> FeeBase {
        FeeBase {
            maker_value: p.maker_value as i128,
            taker_value: p.taker_value as i128,
            maker_lots: p.maker_lots,
            taker_lots: p.taker_lots,
        }
    }
}

/// Every account's positions.
pub type Positions = AccountTable<ClearingPosition>;
/// Every account's fee bases (what it traded since its fees were last charged).
pub type FeeBases = AccountTable<FeeBase>;

/// One slot of an account's vector: the key (so iteration can lend it) and the packed record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot<P> {
    key: PositionKey,
    packed: P,
}

/// One account's records: a slot per instrument, and the rare parts of those that have one,
/// both sorted by instrument.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Account<P, R> {
    slots: Vec<Slot<P>>,
    rare: Vec<(InstrumentId, R)>,
}

impl<P, R> Account<P, R> {
    /// The rare part of `instrument`'s slot, if it has one.
    fn rare_of(&self, instrument: InstrumentId) -> Option<&R> {
        if self.rare.is_empty() {
            return None;
        }
        let at = self.rare.binary_search_by_key(&instrument, |r| r.0).ok()?;
        Some(&self.rare[at].1)
    }

    fn set_rare(&mut self, instrument: InstrumentId, rare: Option<R>) {
        match (self.rare.binary_search_by_key(&instrument, |r| r.0), rare) {
            (Ok(at), Some(r)) => self.rare[at].1 = r,
            (Ok(at), None) => {
                self.rare.remove(at);
            }
            (Err(at), Some(r)) => self.rare.insert(at, (instrument, r)),
            (Err(_), None) => {}
        }
    }
}

/// The account entry of a table of `V`.
type AccountOf<V> = Account<<V as Compact>::Packed, <V as Compact>::Rare>;

/// Records by account and instrument (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountTable<V: Compact> {
    accounts: BTreeMap<AccountId, AccountOf<V>>,
    /// The records with an amount beyond 64 bits (their slots hold a placeholder, and they
    /// have no rare part).
    wide: BTreeMap<PositionKey, V>,
    len: usize,
}

impl<V: Compact> Default for AccountTable<V> {
    fn default() -> AccountTable<V> {
        AccountTable {
            accounts: BTreeMap::new(),
            wide: BTreeMap::new(),
            len: 0,
        }
    }
}

/// The slots an account's vector starts with.
const SLOTS_MIN: usize = 4;

impl<V: Compact> AccountTable<V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many records are held whole because an amount does not fit 64 bits.
    pub fn wide_len(&self) -> usize {
        self.wide.len()
    }

    /// How many records have a rare part held (for a position: a start of day not zero).
    pub fn rare_len(&self) -> usize {
        self.accounts.values().map(|a| a.rare.len()).sum()
    }

    fn slot(&self, key: &PositionKey) -> Option<(&AccountOf<V>, &Slot<V::Packed>)> {
        let account = self.accounts.get(&key.0)?;
        let at = account
            .slots
            .binary_search_by_key(&key.1, |s| s.key.1)
            .ok()?;
        Some((account, &account.slots[at]))
    }

    /// The record in `slot` with its rare part `rare`: unpacked, or the whole one when it
    /// is wide.
    fn value(&self, slot: &Slot<V::Packed>, rare: Option<&V::Rare>) -> V {
        if !self.wide.is_empty() {
            if let Some(v) = self.wide.get(&slot.key) {
                return *v;
            }
        }
        V::unpack(&slot.packed, rare)
    }

    pub fn get(&self, key: &PositionKey) -> Option<V> {
        self.slot(key)
            .map(|(account, s)| self.value(s, account.rare_of(key.1)))
    }

    pub fn contains_key(&self, key: &PositionKey) -> bool {
        self.slot(key).is_some()
    }

    /// Stores `v` under `key`, packed when it fits, replacing what was there.
    pub(crate) fn insert(&mut self, key: PositionKey, v: V) {
        let (packed, rare) = match v.pack() {
            Some(packed) => {
                if !self.wide.is_empty() {
                    self.wide.remove(&key);
                }
                packed
            }
            None => {
                self.wide.insert(key, v);
                (V::Packed::default(), None)
            }
        };
        let account = self.accounts.entry(key.0).or_insert_with(|| Account {
            slots: Vec::new(),
            rare: Vec::new(),
        });
        account.set_rare(key.1, rare);
        let slots = &mut account.slots;
        match slots.binary_search_by_key(&key.1, |s| s.key.1) {
            Ok(at) => slots[at].packed = packed,
            Err(at) => {
                // Grown by a quarter, not doubled: an account's vector wastes at most a
                // quarter of its slots (doubling wasted up to half).
                if slots.len() == slots.capacity() {
                    slots.reserve_exact((slots.len() / 4).max(SLOTS_MIN));
                }
                slots.insert(at, Slot { key, packed });
                self.len += 1;
            }
        }
    }

    /// The record under `key` (the default when there is none) changed by `change`.
    pub(crate) fn update<R>(&mut self, key: PositionKey, change: impl FnOnce(&mut V) -> R) -> R {
        let mut v = self.get(&key).unwrap_or_default();
        let out = change(&mut v);
        self.insert(key, v);
        out
    }

    pub(crate) fn remove(&mut self, key: &PositionKey) {
        let Some(account) = self.accounts.get_mut(&key.0) else {
            return;
        };
        let Ok(at) = account.slots.binary_search_by_key(&key.1, |s| s.key.1) else {
            return;
        };
        account.slots.remove(at);
        account.set_rare(key.1, None);
        if account.slots.is_empty() {
            self.accounts.remove(&key.0);
        }
        self.wide.remove(key);
        self.len -= 1;
    }

    /// Every record in key order.
    pub fn iter(&self) -> Iter<'_, V> {
        Iter {
            table: self,
            accounts: self.accounts.range(..),
            slots: [].iter(),
            rare: &[],
        }
    }

    pub fn values(&self) -> impl Iterator<Item = V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// One account's records, by instrument.
    pub fn of_account(&self, account: AccountId) -> Iter<'_, V> {
        Iter {
            table: self,
            accounts: self.accounts.range(account..=account),
            slots: [].iter(),
            rare: &[],
        }
    }
}

/// Records in key order (see [`AccountTable::iter`]).
pub struct Iter<'a, V: Compact> {
    table: &'a AccountTable<V>,
    accounts: btree_map::Range<'a, AccountId, AccountOf<V>>,
    slots: std::slice::Iter<'a, Slot<V::Packed>>,
    /// The current account's rare parts not passed yet (both lists are sorted by
    /// instrument, so one walk over each finds every slot's).
    rare: &'a [(InstrumentId, V::Rare)],
}

impl<'a, V: Compact> Iterator for Iter<'a, V> {
    type Item = (&'a PositionKey, V);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(slot) = self.slots.next() {
                while self.rare.first().is_some_and(|r| r.0 < slot.key.1) {
                    self.rare = &self.rare[1..];
                }
                let rare = self
                    .rare
                    .first()
                    .filter(|r| r.0 == slot.key.1)
                    .map(|r| &r.1);
                return Some((&slot.key, self.table.value(slot, rare)));
            }
            let account = self.accounts.next()?.1;
            self.slots = account.slots.iter();
            self.rare = &account.rare;
        }
    }
}

impl<'a, V: Compact> IntoIterator for &'a AccountTable<V> {
    type Item = (&'a PositionKey, V);
    type IntoIter = Iter<'a, V>;

    fn into_iter(self) -> Iter<'a, V> {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened_today(qty: i64) -> ClearingPosition {
        ClearingPosition {
            qty,
            cost_value: 1_000 * qty as i128,
            paid_value: 1_000 * qty as i128,
            lots_bought: qty.max(0),
            lots_sold: (-qty).max(0),
            ..ClearingPosition::default()
        }
    }

    fn carried(qty: i64) -> ClearingPosition {
        let mut p = opened_today(qty);
        p.sod = StartOfDay {
            qty,
            paid_value: p.paid_value,
            realised_value: 0,
            vm_paid: Cash(-7),
            lots_bought: p.lots_bought,
            lots_sold: p.lots_sold,
        };
        p
    }

    #[test]
    fn a_start_of_day_is_held_only_for_carried_positions_and_read_back_in_key_order() {
        let mut t = Positions::default();
        // Carried and opened-today positions interleaved in one account, inserted out of
        // order, and a second account with only a carried one.
        t.insert((AccountId(1), InstrumentId(5)), carried(3));
        t.insert((AccountId(1), InstrumentId(2)), opened_today(-4));
        t.insert((AccountId(1), InstrumentId(9)), opened_today(1));
        t.insert((AccountId(1), InstrumentId(1)), carried(-2));
        t.insert((AccountId(2), InstrumentId(2)), carried(6));
        assert_eq!(t.len(), 5);
        assert_eq!(t.rare_len(), 3);
        let expected = [
            ((AccountId(1), InstrumentId(1)), carried(-2)),
            ((AccountId(1), InstrumentId(2)), opened_today(-4)),
            ((AccountId(1), InstrumentId(5)), carried(3)),
            ((AccountId(1), InstrumentId(9)), opened_today(1)),
            ((AccountId(2), InstrumentId(2)), carried(6)),
        ];
        let walked: Vec<(PositionKey, ClearingPosition)> = t.iter().map(|(k, p)| (*k, p)).collect();
        assert_eq!(walked, expected);
        for (key, p) in expected {
            assert_eq!(t.get(&key), Some(p));
        }
        let one: Vec<ClearingPosition> = t.of_account(AccountId(2)).map(|(_, p)| p).collect();
        assert_eq!(one, [carried(6)]);

        // A start of day set back to zero (a flat position rebased) drops its rare part; a
        // removed position takes its own with it.
        t.insert((AccountId(1), InstrumentId(5)), opened_today(3));
        t.remove(&(AccountId(1), InstrumentId(1)));
        assert_eq!(t.rare_len(), 1);
        assert_eq!(
            t.get(&(AccountId(1), InstrumentId(5))),
            Some(opened_today(3))
        );
        assert_eq!(t.get(&(AccountId(1), InstrumentId(1))), None);
        assert_eq!(t.get(&(AccountId(2), InstrumentId(2))), Some(carried(6)));
    }

    #[test]
    fn a_start_of_day_beyond_64_bits_keeps_the_position_whole_until_it_fits() {
        let mut t = Positions::default();
        let key = (AccountId(3), InstrumentId(4));
        let mut p = carried(2);
        p.sod.paid_value = i128::from(i64::MAX) + 1;
        t.insert(key, p);
        assert_eq!((t.wide_len(), t.rare_len()), (1, 0));
        assert_eq!(t.get(&key), Some(p));
        t.insert(key, carried(2));
        assert_eq!((t.wide_len(), t.rare_len()), (0, 1));
        assert_eq!(t.get(&key), Some(carried(2)));
        assert_eq!(t.iter().map(|(_, p)| p).collect::<Vec<_>>(), [carried(2)]);
    }
}
