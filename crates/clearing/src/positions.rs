//! [`Positions`] and [`FeeBases`]: per account and instrument, in key order, held compactly.
//!
//! A [`ClearingPosition`] has eight amounts as `i128`, because a product of price, lots, lot
//! size, multiplier and scale can exceed 64 bits; it is 192 bytes, and a `BTreeMap` entry of
//! it took 373 bytes resident (nodes are half full when keys arrive in order). At
//! 100,000,000 positions that is 37 GB. Almost every amount fits 64 bits, so an
//! [`AccountTable`] keeps each record packed (`Compact`: fifteen `i64`s for a position, 120
//! bytes; four for a fee base) in one vector per account, sorted by instrument and grown by
//! a quarter, under a `BTreeMap` of accounts: 128 bytes per position and 40 per fee base,
//! plus the vectors' spare slots (measured: 219 bytes per position with its fee base at ten
//! positions per account, against 484 in `BTreeMap`s of the whole records).
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
    /// `self` packed, or `None` when one of its amounts does not fit.
    fn pack(&self) -> Option<Self::Packed>;
    fn unpack(packed: &Self::Packed) -> Self;
}

/// A position whose amounts all fit 64 bits: the fields of [`ClearingPosition`], in its order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    qty: i64,
    securities_due: i64,
    lots_bought: i64,
    lots_sold: i64,
    sod_qty: i64,
    sod_lots_bought: i64,
    sod_lots_sold: i64,
    cost_value: i64,
    paid_value: i64,
    realised_value: i64,
    vm_paid: i64,
    cash_due: i64,
    sod_paid_value: i64,
    sod_realised_value: i64,
    sod_vm_paid: i64,
}

impl Compact for ClearingPosition {
    type Packed = Packed;

    fn pack(&self) -> Option<Packed> {
        let p = self;
        let n = |v: i128| i64::try_from(v).ok();
        Some(Packed {
            qty: p.qty,
            securities_due: p.securities_due,
            lots_bought: p.lots_bought,
            lots_sold: p.lots_sold,
            sod_qty: p.sod.qty,
            sod_lots_bought: p.sod.lots_bought,
            sod_lots_sold: p.sod.lots_sold,
            cost_value: n(p.cost_value)?,
            paid_value: n(p.paid_value)?,
            realised_value: n(p.realised_value)?,
            vm_paid: n(p.vm_paid.0)?,
            cash_due: n(p.cash_due.0)?,
            sod_paid_value: n(p.sod.paid_value)?,
            sod_realised_value: n(p.sod.realised_value)?,
            sod_vm_paid: n(p.sod.vm_paid.0)?,
        })
    }

    fn unpack(packed: &Packed) -> ClearingPosition {
        let p = packed;
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
            sod: StartOfDay {
                qty: p.sod_qty,
                paid_value: p.sod_paid_value as i128,
                realised_value: p.sod_realised_value as i128,
                vm_paid: Cash(p.sod_vm_paid as i128),
                lots_bought: p.sod_lots_bought,
                lots_sold: p.sod_lots_sold,
            },
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

    fn pack(&self) -> Option<PackedFeeBase> {
        Some(PackedFeeBase {
            maker_value: i64::try_from(self.maker_value).ok()?,
            taker_value: i64::try_from(self.taker_value).ok()?,
            maker_lots: self.maker_lots,
            taker_lots: self.taker_lots,
        })
    }

    fn unpack(p: &PackedFeeBase) -> FeeBase {
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

/// Records by account and instrument (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountTable<V: Compact> {
    accounts: BTreeMap<AccountId, Vec<Slot<V::Packed>>>,
    /// The records with an amount beyond 64 bits (their slots hold a placeholder).
    wide: BTreeMap<PositionKey, V>,
    len: usize,
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

    fn slot(&self, key: &PositionKey) -> Option<&Slot<V::Packed>> {
        let slots = self.accounts.get(&key.0)?;
        let at = slots.binary_search_by_key(&key.1, |s| s.key.1).ok()?;
        Some(&slots[at])
    }

    /// The record in `slot`: unpacked, or the whole one when it is wide.
    fn value(&self, slot: &Slot<V::Packed>) -> V {
        if !self.wide.is_empty() {
            if let Some(v) = self.wide.get(&slot.key) {
                return *v;
            }
        }
        V::unpack(&slot.packed)
    }

    pub fn get(&self, key: &PositionKey) -> Option<V> {
        self.slot(key).map(|s| self.value(s))
    }

    pub fn contains_key(&self, key: &PositionKey) -> bool {
        self.slot(key).is_some()
    }

    /// Stores `v` under `key`, packed when it fits, replacing what was there.
    pub(crate) fn insert(&mut self, key: PositionKey, v: V) {
        let packed = match v.pack() {
            Some(packed) => {
                if !self.wide.is_empty() {
                    self.wide.remove(&key);
                }
                packed
            }
            None => {
                self.wide.insert(key, v);
                V::Packed::default()
            }
        };
        let slots = self.accounts.entry(key.0).or_default();
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
        let Some(slots) = self.accounts.get_mut(&key.0) else {
            return;
        };
        let Ok(at) = slots.binary_search_by_key(&key.1, |s| s.key.1) else {
            return;
        };
        slots.remove(at);
        if slots.is_empty() {
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
        }
    }
}

/// Records in key order (see [`AccountTable::iter`]).
pub struct Iter<'a, V: Compact> {
    table: &'a AccountTable<V>,
    accounts: btree_map::Range<'a, AccountId, Vec<Slot<V::Packed>>>,
    slots: std::slice::Iter<'a, Slot<V::Packed>>,
}

impl<'a, V: Compact> Iterator for Iter<'a, V> {
    type Item = (&'a PositionKey, V);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(slot) = self.slots.next() {
                return Some((&slot.key, self.table.value(slot)));
            }
            self.slots = self.accounts.next()?.1.iter();
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
