//! Snapshot to bytes, restore from bytes, and the state hash.
//!
//! The snapshot is canonical: it writes the state in a fixed order (books, accounts, then every
//! resting order book by book, side by side, worst level to best, queue head to tail) and
//! leaves out everything derived (slot numbers, lookup tables, level totals). Restoring
//! rebuilds the derived parts, so `restore(snapshot(x))` snapshots to the very same bytes,
//! and the state hash is simply the hash of those bytes. The incremental state digest
//! (`crate::digest`) is derived too: restore recomputes it.

use crate::book::{Book, Order, NIL};
use crate::risk::{Account, Position};
use crate::{Counters, Engine, EngineConfig};
use bourse_core::codec::{DecodeError, Reader, Writer};
use bourse_core::*;
use std::fmt;

const MAGIC: &[u8; 8] = b"BOURSE01";
/// Version 2 added the checksum trailer; version 4 the kill switches (and the paused phase);
/// version 5 the margin calls; version 6 the call auctions (the auction phases and times in
/// force, each book's volatility guard and auction state, each order's market flag).
/// Version 5 snapshots still restore (as books without guard or auction state).
const FORMAT_VERSION: u32 = 6;
const FORMAT_VERSION_BEFORE_AUCTIONS: u32 = 5;
/// Bytes of the trailer: xxh3-64 of everything before it.
const CHECKSUM_BYTES: usize = 8;

/// Why a snapshot could not be restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreError {
    /// The bytes are not a snapshot of this format.
    Format(DecodeError),
    /// The bytes decode but describe an impossible state.
    Inconsistent(String),
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestoreError::Format(e) => write!(f, "snapshot is damaged or of another format: {e}"),
            RestoreError::Inconsistent(what) => write!(f, "snapshot state is inconsistent: {what}"),
        }
    }
}

impl std::error::Error for RestoreError {}

impl From<DecodeError> for RestoreError {
    fn from(e: DecodeError) -> Self {
        RestoreError::Format(e)
    }
}

pub(crate) fn side_code(s: Side) -> u8 {
    match s {
        Side::Buy => 0,
        Side::Sell => 1,
    }
}
pub(crate) fn tif_code(t: TimeInForce) -> u8 {
    match t {
        TimeInForce::Day => 0,
        TimeInForce::Gtc => 1,
        TimeInForce::Gtd => 2,
        TimeInForce::Ioc => 3,
        TimeInForce::Fok => 4,
        TimeInForce::AtOpening => 5,
        TimeInForce::AtClose => 6,
        TimeInForce::GoodForAuction => 7,
    }
}
const TIFS: [TimeInForce; 8] = [
    TimeInForce::Day,
    TimeInForce::Gtc,
    TimeInForce::Gtd,
    TimeInForce::Ioc,
    TimeInForce::Fok,
    TimeInForce::AtOpening,
    TimeInForce::AtClose,
    TimeInForce::GoodForAuction,
];
const PHASES: [Phase; 7] = [
    Phase::Open,
    Phase::Halted,
    Phase::Closed,
    Phase::Paused,
    Phase::OpeningAuction,
    Phase::ClosingAuction,
    Phase::VolatilityAuction,
];
pub(crate) fn phase_code(p: Phase) -> u8 {
    match p {
        Phase::Open => 0,
        Phase::Halted => 1,
        Phase::Closed => 2,
        Phase::Paused => 3,
        Phase::OpeningAuction => 4,
        Phase::ClosingAuction => 5,
        Phase::VolatilityAuction => 6,
    }
}
pub(crate) fn market_code(m: Market) -> u8 {
    match m {
        Market::Equity => 0,
        Market::Fx => 1,
        Market::Futures => 2,
    }
}
pub(crate) fn stp_code(m: StpMode) -> u8 {
    match m {
        StpMode::None => 0,
        StpMode::CancelResting => 1,
        StpMode::CancelIncoming => 2,
        StpMode::CancelBoth => 3,
    }
}

fn read_enum<T>(r: &mut Reader, values: &[T], what: &'static str) -> Result<T, DecodeError>
where
    T: Copy,
{
    let code = r.u8()? as usize;
    values.get(code).copied().ok_or_else(|| r.error(what))
}

impl Engine {
    /// The whole state as canonical bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        self.snapshot_in(FORMAT_VERSION)
    }

    /// The state in format `version`: the current one, or the one before the call auctions
    /// (for the test that such a snapshot still restores; the state must not use them).
    fn snapshot_in(&self, version: u32) -> Vec<u8> {
        let auctions = version == FORMAT_VERSION;
        let mut w = Writer::with_capacity(
            64 + self.books.len() * 128 + self.accounts.len() * 96 + self.pool.live() * 128,
        );
        w.buf.extend_from_slice(MAGIC);
        w.u32(version);
        let c = &self.config;
        w.u32(c.orders_max);
        w.u32(c.instruments_max);
        w.u32(c.accounts_max);
        w.u32(c.levels_per_side_hint);
        w.u64(c.first_order_id);
        w.u64(self.next_order_id);
        w.u64(self.next_trade_id);
        w.u64(self.next_rec);
        w.u64(self.next_seq);
        let n = &self.counters;
        for v in [
            n.commands,
            n.orders_accepted,
            n.orders_rejected,
            n.trades,
            n.cancels,
            n.replaces,
            n.expiries,
        ] {
            w.u64(v);
        }
        w.i128(n.volume_lots as i128);

        w.u64(self.books.len() as u64);
        for book in &self.books {
            let d = &book.def;
            w.u32(d.instrument.0);
            w.bytes(d.symbol.as_bytes());
            w.u8(market_code(d.market));
            w.u8(d.price_scale);
            w.i64(d.tick.0);
            w.i64(d.lot_size);
            w.i64(d.multiplier);
            w.i128(d.initial_margin.0);
            w.u32(d.band_bps);
            w.i64(d.reference_price.0);
            w.u8(phase_code(book.phase));
            if !auctions {
                continue;
            }
            let g = &d.volatility;
            w.u32(g.dynamic_bps);
            w.u32(g.static_bps);
            w.u64(g.auction_ns);
            let a = &book.auction;
            w.i64(a.static_ref);
            w.i64(a.close);
            w.u64(a.end_ns);
            w.i64(a.indicative.price);
            w.i64(a.indicative.qty);
            w.i64(a.indicative.surplus);
        }

        w.u64(self.accounts.len() as u64);
        for a in &self.accounts {
            w.u32(a.id.0);
            w.u32(a.firm.0);
            w.bool(a.may_short);
            w.u8(stp_code(a.stp));
            w.u8(match a.stp_scope {
                StpScope::Account => 0,
                StpScope::Firm => 1,
            });
            w.i128(a.cash);
            w.i128(a.reserved_cash);
            w.i128(a.margin_locked);
            w.u64(a.positions.len() as u64);
            for p in &a.positions {
                w.u32(p.book);
                w.i64(p.qty);
                w.i64(p.sell_reserved);
                w.i64(p.buy_open);
                w.i64(p.sell_open);
                w.i128(p.cost());
            }
        }

        w.u64(self.pool.live() as u64);
        for book in &self.books {
            for side in [Side::Buy, Side::Sell] {
                for level in book.side(side).iter() {
                    let mut slot = level.head;
                    while slot != NIL {
                        let o = self.pool.get(slot);
                        write_order(&mut w, o, auctions);
                        slot = o.next;
                    }
                }
            }
        }
        w.u64(self.suspended_firms.len() as u64);
        for f in &self.suspended_firms {
            w.u32(f.0);
        }
        w.u64(self.suspended_accounts.len() as u64);
        for a in &self.suspended_accounts {
            w.u32(a.0);
        }
        w.u64(self.margin_calls.len() as u64);
        for &(a, amount) in &self.margin_calls {
            w.u32(a.0);
            w.i128(amount);
        }
        // A checksum over everything before it, so that restore refuses any damage rather
        // than rebuilding a different but self-consistent state from a flipped bit.
        let checksum = xxhash_rust::xxh3::xxh3_64(&w.buf);
        w.u64(checksum);
        w.finish()
    }

    /// A 64-bit hash of the whole state (xxh3 of the snapshot bytes). Replicas compare it.
    pub fn state_hash(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.snapshot())
    }

    /// Rebuilds an engine from [`Engine::snapshot`] bytes. Damaged or inconsistent bytes give an
    /// error, never a panic or a half-built engine.
    pub fn restore(bytes: &[u8]) -> Result<Engine, RestoreError> {
        if bytes.len() < MAGIC.len() + CHECKSUM_BYTES || &bytes[..MAGIC.len()] != MAGIC {
            return Err(Reader::new(bytes)
                .error("not a bourse engine snapshot (bad magic)")
                .into());
        }
        let (body, trailer) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
        let stored = u64::from_le_bytes(trailer.try_into().expect("8 bytes"));
        if xxhash_rust::xxh3::xxh3_64(body) != stored {
            return Err(RestoreError::Format(DecodeError {
                offset: body.len(),
                what: "checksum mismatch: the snapshot is damaged",
            }));
        }
        let bytes = body;
        let mut r = Reader::new(bytes);
        if r.remaining() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(r.error("not a bourse engine snapshot (bad magic)").into());
        }
        for _ in 0..MAGIC.len() {
            r.u8()?;
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION && version != FORMAT_VERSION_BEFORE_AUCTIONS {
            return Err(r.error("unsupported snapshot format version").into());
        }
        let auctions = version == FORMAT_VERSION;
        let config = EngineConfig {
            orders_max: r.u32()?,
            instruments_max: r.u32()?,
            accounts_max: r.u32()?,
            levels_per_side_hint: r.u32()?,
            first_order_id: r.u64()?,
        };
        if config.orders_max == 0
            || config.orders_max == NIL
            || config.instruments_max == 0
            || config.accounts_max == 0
            || config.first_order_id == 0
            || config.levels_per_side_hint > crate::LEVELS_PER_SIDE_HINT_MAX
        {
            return Err(RestoreError::Inconsistent(
                "impossible engine limits".into(),
            ));
        }
        // Guard the pre-allocation against a damaged limit: the pool and lookup tables are
        // sized from orders_max, so refuse sizes that the snapshot itself could not justify.
        if config.orders_max as u64 > (1 << 28) {
            return Err(RestoreError::Inconsistent("orders_max above 2^28".into()));
        }
        // A damaged limit under that bound may still ask for more memory than there is, and an
        // allocation failure aborts the process instead of returning an error: reserve the
        // space the order pool and sweep buffer take first (address space only, untouched).
        // Per order: the slot, its digest entry (two u64) and room in the free list and sweep
        // buffer.
        let pool_bytes = config.orders_max as usize * (std::mem::size_of::<Order>() + 24);
        if Vec::<u8>::new().try_reserve_exact(pool_bytes).is_err() {
            return Err(RestoreError::Inconsistent(
                "orders_max needs more memory than there is".into(),
            ));
        }
        let mut e = Engine::new(config);
        e.next_order_id = r.u64()?;
        e.next_trade_id = r.u64()?;
        e.next_rec = r.u64()?;
        e.next_seq = r.u64()?;
        e.counters = Counters {
            commands: r.u64()?,
            orders_accepted: r.u64()?,
            orders_rejected: r.u64()?,
            trades: r.u64()?,
            cancels: r.u64()?,
            replaces: r.u64()?,
            expiries: r.u64()?,
            volume_lots: {
                let v = r.i128()?;
                u128::try_from(v).map_err(|_| r.error("negative volume"))?
            },
        };
        // Damaged numbers must give an error here, not an overflow later when they count on.
        let c = &e.counters;
        let numbers = [
            e.next_order_id,
            e.next_trade_id,
            e.next_rec,
            e.next_seq,
            c.commands,
            c.orders_accepted,
            c.orders_rejected,
            c.trades,
            c.cancels,
            c.replaces,
            c.expiries,
        ];
        if numbers.iter().any(|&v| v > u64::MAX / 2) || c.volume_lots > u128::MAX / 2 {
            return Err(RestoreError::Inconsistent(
                "a sequence number or counter near its limit".into(),
            ));
        }

        let books = r.count(40)?;
        if books > config.instruments_max as usize {
            return Err(RestoreError::Inconsistent(
                "more books than instruments_max".into(),
            ));
        }
        for _ in 0..books {
            let instrument = InstrumentId(r.u32()?);
            let symbol = String::from_utf8(r.bytes(SYMBOL_LEN_MAX)?.to_vec())
                .map_err(|_| r.error("symbol is not UTF-8"))?;
            let mut def = Instrument {
                instrument,
                symbol,
                market: read_enum(
                    &mut r,
                    &[Market::Equity, Market::Fx, Market::Futures],
                    "bad market",
                )?,
                price_scale: r.u8()?,
                tick: Price(r.i64()?),
                lot_size: r.i64()?,
                multiplier: r.i64()?,
                initial_margin: Cash(r.i128()?),
                band_bps: r.u32()?,
                reference_price: Price(r.i64()?),
                volatility: VolatilityGuard::default(),
            };
            let phases = if auctions { &PHASES[..] } else { &PHASES[..4] };
            let phase = read_enum(&mut r, phases, "bad phase")?;
            let mut state = None;
            if auctions {
                def.volatility = VolatilityGuard {
                    dynamic_bps: r.u32()?,
                    static_bps: r.u32()?,
                    auction_ns: r.u64()?,
                };
                state = Some(crate::book::AuctionState {
                    static_ref: r.i64()?,
                    close: r.i64()?,
                    end_ns: r.u64()?,
                    indicative: crate::book::Uncross {
                        price: r.i64()?,
                        qty: r.i64()?,
                        surplus: r.i64()?,
                    },
                });
            }
            def.validate().map_err(|why| {
                RestoreError::Inconsistent(format!("instrument {instrument}: {why}"))
            })?;
            if e.book_index
                .insert(instrument, e.books.len() as u32)
                .is_some()
            {
                return Err(RestoreError::Inconsistent(format!(
                    "instrument {instrument} twice"
                )));
            }
            let mut book = Book::new(def, config.levels_per_side_hint as usize);
            book.phase = phase;
            if let Some(state) = state {
                crate::auction::check_state(&book, &state).map_err(RestoreError::Inconsistent)?;
                book.auction = state;
            }
            e.books.push(book);
        }

        let accounts = r.count(60)?;
        if accounts > config.accounts_max as usize {
            return Err(RestoreError::Inconsistent(
                "more accounts than accounts_max".into(),
            ));
        }
        e.accounts.reserve(accounts);
        e.account_index.reserve(accounts);
        for _ in 0..accounts {
            let id = AccountId(r.u32()?);
            let firm = FirmId(r.u32()?);
            let may_short = r.bool()?;
            let stp = read_enum(
                &mut r,
                &[
                    StpMode::None,
                    StpMode::CancelResting,
                    StpMode::CancelIncoming,
                    StpMode::CancelBoth,
                ],
                "bad stp mode",
            )?;
            let stp_scope = read_enum(
                &mut r,
                &[StpScope::Account, StpScope::Firm],
                "bad stp scope",
            )?;
            let cash = r.i128()?;
            let reserved_cash = r.i128()?;
            let margin_locked = r.i128()?;
            // Balances far beyond anything deposits can build (10^21 per deposit) are damage;
            // refusing them keeps free cash and later deposits clear of overflow.
            const BALANCE_MAX: i128 = i128::MAX / 4;
            if !(-BALANCE_MAX..=BALANCE_MAX).contains(&cash)
                || !(0..=BALANCE_MAX).contains(&reserved_cash)
                || !(0..=BALANCE_MAX).contains(&margin_locked)
            {
                return Err(RestoreError::Inconsistent(format!(
                    "account {id}: impossible balances"
                )));
            }
            let n = r.count(52)?;
            let mut positions = Vec::with_capacity(n);
            for _ in 0..n {
                let mut p = Position::new(r.u32()?);
                p.qty = r.i64()?;
                p.sell_reserved = r.i64()?;
                p.buy_open = r.i64()?;
                p.sell_open = r.i64()?;
                p.set_cost(r.i128()?);
                // Admission keeps every position within POSITION_MAX and open quantities are
                // sums of order quantities: anything else is damage (and would overflow).
                if p.qty.unsigned_abs() > POSITION_MAX as u64
                    || p.sell_reserved < 0
                    || p.buy_open < 0
                    || p.sell_open < 0
                    || !(-(i128::MAX / 4)..=i128::MAX / 4).contains(&p.cost())
                {
                    return Err(RestoreError::Inconsistent(format!(
                        "account {id}: impossible position"
                    )));
                }
                if p.book as usize >= e.books.len()
                    || positions
                        .last()
                        .is_some_and(|q: &Position| q.book >= p.book)
                {
                    return Err(RestoreError::Inconsistent(format!(
                        "account {id}: positions out of order or of an unknown book"
                    )));
                }
                positions.push(p);
            }
            if e.account_index
                .insert(id, e.accounts.len() as u32)
                .is_some()
            {
                return Err(RestoreError::Inconsistent(format!("account {id} twice")));
            }
            e.accounts.push(Account {
                id,
                firm,
                may_short,
                stp,
                stp_scope,
                cash,
                reserved_cash,
                margin_locked,
                positions,
                digest_key: 0,
            });
        }

        let orders = r.count(if auctions { 101 } else { 100 })?;
        if orders > config.orders_max as usize {
            return Err(RestoreError::Inconsistent(
                "more orders than orders_max".into(),
            ));
        }
        let mut previous: Option<(u32, Side, i64)> = None;
        for _ in 0..orders {
            let o = read_order(&mut r, auctions)?;
            if o.book as usize >= e.books.len() || o.account as usize >= e.accounts.len() {
                return Err(RestoreError::Inconsistent(format!(
                    "order {}: unknown book or account",
                    o.id
                )));
            }
            if o.qty_leaves <= 0
                || o.qty_display <= 0
                || o.qty_display > o.qty_leaves
                || o.qty_filled < 0
                || o.qty_total > QTY_MAX
                || o.qty_filled.checked_add(o.qty_leaves) != Some(o.qty_total)
                || o.price > PRICE_MAX
                || o.reserved_pos < 0
                || o.reserved_pos > o.qty_leaves
                || o.price <= 0
                || o.rec == 0
            {
                return Err(RestoreError::Inconsistent(format!(
                    "order {}: impossible quantities",
                    o.id
                )));
            }
            // Orders must come in canonical order, so that restoring rebuilds the same queues.
            let key = (o.book, o.side, o.price);
            if let Some(prev) = previous {
                let ordered = prev.0 < key.0
                    || (prev.0 == key.0 && side_code(prev.1) < side_code(key.1))
                    || (prev.0 == key.0
                        && prev.1 == key.1
                        && (prev.2 == key.2 || crate::book::better(key.1, key.2, prev.2)));
                if !ordered {
                    return Err(RestoreError::Inconsistent(format!(
                        "order {}: out of book order",
                        o.id
                    )));
                }
            }
            previous = Some(key);
            if e.order_index.contains_key(&o.id)
                || e.clord_index.contains_key(&(o.account, o.cl_ord_id))
                || o.id.0 >= e.next_order_id
            {
                return Err(RestoreError::Inconsistent(format!(
                    "order {}: duplicate id",
                    o.id
                )));
            }
            let slot = e.pool.insert(o);
            e.order_index.insert(o.id, slot);
            e.clord_index.insert((o.account, o.cl_ord_id), slot);
            e.books[o.book as usize].push_back(&mut e.pool, slot);
        }
        e.suspended_firms = read_sorted_ids(&mut r, FirmId, "kill-switched firms")?;
        e.suspended_accounts = read_sorted_ids(&mut r, AccountId, "kill-switched accounts")?;
        e.margin_calls = read_margin_calls(&mut r)?;
        if let Some(&(a, _)) = e
            .margin_calls
            .iter()
            .find(|c| !e.account_index.contains_key(&c.0))
        {
            return Err(RestoreError::Inconsistent(format!(
                "margin call on unknown account {}",
                a.0
            )));
        }
        r.expect_end()?;
        // The digest is not in the snapshot: it is a function of the state, recomputed here.
        e.rebuild_digest();
        e.rebuild_vi_books();
        e.check_invariants().map_err(RestoreError::Inconsistent)?;
        Ok(e)
    }
}

/// The margin calls: a count and that many (account u32, amount i128), accounts strictly
/// ascending, amounts positive and within the cash limit (the engine keeps no closed call).
fn read_margin_calls(r: &mut Reader) -> Result<Vec<(AccountId, i128)>, RestoreError> {
    let n = r.count(20)?;
    let mut calls: Vec<(AccountId, i128)> = Vec::with_capacity(n);
    for _ in 0..n {
        let account = AccountId(r.u32()?);
        let amount = r.i128()?;
        if calls.last().is_some_and(|&(prev, _)| prev >= account) {
            return Err(RestoreError::Inconsistent(
                "margin calls: not sorted or listed twice".into(),
            ));
        }
        if amount <= 0 || amount > CASH_AMOUNT_MAX {
            return Err(RestoreError::Inconsistent(format!(
                "margin call on account {}: amount {amount} out of range",
                account.0
            )));
        }
        calls.push((account, amount));
    }
    Ok(calls)
}

/// A count and that many u32 ids, strictly ascending (the engine keeps them sorted and
/// without duplicates).
fn read_sorted_ids<T>(
    r: &mut Reader,
    make: fn(u32) -> T,
    what: &str,
) -> Result<Vec<T>, RestoreError> {
    let n = r.count(4)?;
    let mut ids: Vec<u32> = Vec::with_capacity(n);
    for _ in 0..n {
        let id = r.u32()?;
        if ids.last().is_some_and(|&prev| prev >= id) {
            return Err(RestoreError::Inconsistent(format!(
                "{what}: not sorted or listed twice"
            )));
        }
        ids.push(id);
    }
    Ok(ids.into_iter().map(make).collect())
}

fn write_order(w: &mut Writer, o: &Order, auctions: bool) {
    w.u32(o.book);
    w.u8(side_code(o.side));
    w.i64(o.price);
    w.u64(o.id.0);
    w.u64(o.cl_ord_id.0);
    w.u32(o.account);
    w.u8(tif_code(o.tif));
    w.i64(o.qty_total);
    w.i64(o.qty_filled);
    w.i64(o.qty_leaves);
    w.i64(o.display_size);
    w.i64(o.qty_display);
    w.u64(o.expire_ts_ns);
    w.u64(o.rec);
    w.i128(o.reserved_cash);
    w.i64(o.reserved_pos);
    if auctions {
        w.bool(o.market);
    }
}

fn read_order(r: &mut Reader, auctions: bool) -> Result<Order, DecodeError> {
    Ok(Order {
        book: r.u32()?,
        side: read_enum(r, &[Side::Buy, Side::Sell], "bad side")?,
        price: r.i64()?,
        id: OrderId(r.u64()?),
        cl_ord_id: ClOrdId(r.u64()?),
        account: r.u32()?,
        tif: read_enum(
            r,
            if auctions { &TIFS[..] } else { &TIFS[..5] },
            "bad time in force",
        )?,
        qty_total: r.i64()?,
        qty_filled: r.i64()?,
        qty_leaves: r.i64()?,
        display_size: r.i64()?,
        qty_display: r.i64()?,
        expire_ts_ns: r.u64()?,
        rec: r.u64()?,
        reserved_cash: r.i128()?,
        reserved_pos: r.i64()?,
        prev: NIL,
        next: NIL,
        resting: false,
        market: auctions && r.bool()?,
    })
}

#[cfg(test)]
mod tests {
    use crate::fixtures::{self, Driver};
    use crate::{Engine, EngineConfig};
    use bourse_core::Side;

    #[test]
    fn a_snapshot_of_the_format_before_the_auctions_still_restores() {
        let mut d = Driver::new(EngineConfig {
            orders_max: 64,
            instruments_max: 2,
            accounts_max: 4,
            levels_per_side_hint: 4,
            first_order_id: 1,
        });
        d.add_instrument(fixtures::equity(1, "EQA", 10_000));
        d.add_account(1, 1, 1_000_000_000_000);
        d.limit(1, 1, 1, Side::Buy, 9_990, 5);
        d.limit(1, 2, 1, Side::Buy, 9_995, 5);
        let old = d.engine.snapshot_in(super::FORMAT_VERSION_BEFORE_AUCTIONS);
        let restored = Engine::restore(&old).expect("a format 5 snapshot restores");
        assert_eq!(restored.snapshot(), d.engine.snapshot());
        assert_eq!(restored.state_digest(), d.engine.state_digest());
    }
}
