//! The store: per core, the latest state of every order, every trade and every rejected new
//! order, in an ordered index by position, with secondary indexes by firm, account and
//! instrument; and the query that reads it from a cursor.
//!
//! It is written only from committed entries ([`Store::apply_entry`]), so it never holds
//! anything a core has not committed. An order that changes moves to the end of its core's
//! index (its old record is replaced), so a client reading from a cursor gets each order once,
//! in its latest state, in the order of its last change. When a core's records pass
//! `records_per_core_max`, the oldest final records (trades, rejects, orders that left the
//! book) are evicted and the core's horizon moves past them; a cursor behind the horizon is
//! refused as too old. Live orders are never evicted (the core's own capacity bounds them).

use crate::cold::{ColdEnd, ColdLog, ColdStats};
use crate::cursor::{Cursor, CursorError};
use crate::record::{is_kept, Filter, Pos, Record};
use bourse_cluster::consumer::EntryView;
use bourse_core::codec::{decode_event, encode_events_into, DecodeError, Reader, Writer};
use bourse_core::{AccountId, Event, FirmId, OrderId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

/// What a store is asked to hold.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// The deployment's name: the tag of its identity, which every cursor carries (see
    /// `cursor`; a new store's identity is the name's hash until [`Store::set_identity`]).
    pub deployment: String,
    /// The ids of the cores it follows, in the order cursors list them.
    pub cores: Vec<u32>,
    /// Records kept per core before the oldest final ones are evicted.
    pub records_per_core_max: usize,
    /// Keeps the indexes by firm, account and instrument that filtered polls read. A read
    /// replica for unfiltered clients goes without them (seed 003).
    pub secondary_indexes: bool,
}

/// Records examined per eviction pass at most, so that one entry's apply stays short even
/// when the oldest records are all live orders.
const EVICTION_SCAN_MAX: usize = 4096;

/// Counters of one core's part of the store.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CoreStats {
    pub core: u32,
    /// The next log index the store will apply.
    pub applied_index: u64,
    pub records: usize,
    pub live_orders: usize,
    /// Records written (new or replacing an order's previous state).
    pub writes: u64,
    pub evicted: u64,
    /// Positions below this one may have been evicted.
    pub horizon_index: u64,
    pub last_ts_ns: u64,
    /// The records evicted from memory and kept on disk (`None`: no cold log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cold: Option<ColdStats>,
}

struct CoreStore {
    id: u32,
    /// Whether `by_firm`, `by_account` and `by_instrument` are kept.
    indexed: bool,
    /// The next log index the store will apply (a replica: the entries before it are whole).
    applied: u64,
    /// A replica's next position to read from its primary (`None` on a primary, and on a
    /// replica before its first record or answer of this core).
    received: Option<Pos>,
    /// Every record before this position may have been evicted.
    horizon: Pos,
    records: BTreeMap<Pos, Record>,
    orders: HashMap<OrderId, Pos>,
    firms_of: HashMap<AccountId, FirmId>,
    by_firm: BTreeSet<(u32, Pos)>,
    by_account: BTreeSet<(u32, Pos)>,
    by_instrument: BTreeSet<(u32, Pos)>,
    writes: u64,
    evicted: u64,
    last_ts_ns: u64,
    /// The evicted records on disk, which answer cursors behind the horizon.
    cold: Option<ColdLog>,
}

/// How a core's scan ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScanEnd {
    /// Everything after the start that matches was taken.
    Exhausted,
    /// `limit` records were taken.
    Limit,
    /// A cold read's scan bound was reached: the core continues at this position.
    Scanned(Pos),
}

/// Why an entry could not be applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApplyError {
    /// The entry is past the next one due: applying it would leave a gap.
    Gap { expected: u64, got: u64 },
    /// A replica was handed a record of a core it does not follow.
    UnknownCore(u32),
    /// A replica was handed a record before the position it had read up to.
    Behind { core: u32, at: Pos, got: Pos },
    /// A request's events do not decode.
    Events(DecodeError),
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::Gap { expected, got } => {
                write!(f, "entry {got} arrived where {expected} was due")
            }
            ApplyError::Events(e) => write!(f, "events do not decode: {e}"),
            ApplyError::UnknownCore(core) => {
                write!(
                    f,
                    "a record of core {core}, which this node does not follow"
                )
            }
            ApplyError::Behind { core, at, got } => write!(
                f,
                "core {core}: a record at {}.{} came after {}.{} was read",
                got.index, got.ord, at.index, at.ord
            ),
        }
    }
}

/// The store of every core a delivery node follows.
pub struct Store {
    config: StoreConfig,
    deployment: u64,
    cores: Vec<CoreStore>,
    records_per_core_max: usize,
    events: Vec<Event>,
}

fn keys<const N: usize>(values: [Option<u32>; N]) -> impl Iterator<Item = u32> {
    let mut seen: [Option<u32>; N] = [None; N];
    let mut n = 0;
    for v in values.into_iter().flatten() {
        if !seen[..n].contains(&Some(v)) {
            seen[n] = Some(v);
            n += 1;
        }
    }
    seen.into_iter().take(n).flatten()
}

impl CoreStore {
    fn new(id: u32, indexed: bool) -> CoreStore {
        CoreStore {
            id,
            indexed,
            applied: 0,
            received: None,
            horizon: Pos::START,
            records: BTreeMap::new(),
            orders: HashMap::new(),
            firms_of: HashMap::new(),
            by_firm: BTreeSet::new(),
            by_account: BTreeSet::new(),
            by_instrument: BTreeSet::new(),
            writes: 0,
            evicted: 0,
            last_ts_ns: 0,
            cold: None,
        }
    }

    fn index_keys(r: &Record) -> (impl Iterator<Item = u32>, impl Iterator<Item = u32>) {
        let [a, b] = r.firms;
        let [x, y] = r.accounts();
        (
            keys([a.map(|f| f.0), b.map(|f| f.0)]),
            keys([Some(x.0), Some(y.0)]),
        )
    }

    fn insert(&mut self, r: Record) {
        let pos = r.pos();
        if let Some(id) = r.order_id() {
            if let Some(old) = self.orders.insert(id, pos) {
                self.remove(old);
            }
        }
        if self.indexed {
            let (firms, accounts) = Self::index_keys(&r);
            for f in firms {
                self.by_firm.insert((f, pos));
            }
            for a in accounts {
                self.by_account.insert((a, pos));
            }
            self.by_instrument.insert((r.instrument().0, pos));
        }
        self.last_ts_ns = self.last_ts_ns.max(r.ts_ns());
        self.records.insert(pos, r);
        self.writes += 1;
    }

    /// Takes the record at `pos` out of every index (not out of `orders`).
    fn remove(&mut self, pos: Pos) -> Option<Record> {
        let r = self.records.remove(&pos)?;
        if self.indexed {
            let (firms, accounts) = Self::index_keys(&r);
            for f in firms {
                self.by_firm.remove(&(f, pos));
            }
            for a in accounts {
                self.by_account.remove(&(a, pos));
            }
            self.by_instrument.remove(&(r.instrument().0, pos));
        }
        Some(r)
    }

    /// Evicts the oldest final records until the core holds `max` records or the scan bound
    /// is reached; moves the horizon past every evicted one.
    fn evict(&mut self, max: usize) {
        if self.records.len() <= max {
            return;
        }
        // Down to 7/8 of the bound, so eviction runs once per many entries, not every one.
        let target = max - max / 8;
        let mut gone = Vec::new();
        for (pos, r) in self.records.iter().take(EVICTION_SCAN_MAX) {
            if self.records.len() - gone.len() <= target {
                break;
            }
            if r.is_final() {
                gone.push(*pos);
            }
        }
        let horizon_before = self.horizon;
        let mut evicted = Vec::with_capacity(if self.cold.is_some() { gone.len() } else { 0 });
        for pos in gone {
            if let Some(r) = self.remove(pos) {
                if let Some(id) = r.order_id() {
                    self.orders.remove(&id);
                }
                self.evicted += 1;
                self.horizon = self.horizon.max(pos.next());
                if self.cold.is_some() {
                    evicted.push(r);
                }
            }
        }
        if let Some(cold) = &mut self.cold {
            cold.append_pass(horizon_before, &evicted);
        }
    }

    /// Whether a read from `from` (no snapshot floor) is answered by the cold log.
    fn cold_covers(&self, from: Pos) -> bool {
        from < self.horizon && self.cold.as_ref().is_some_and(|c| c.covers(from))
    }

    /// Up to `limit` records at or after `from` that match, in position order, appended to
    /// `out`; true if that is all there is.
    fn scan(&self, from: Pos, f: &Filter, limit: usize, out: &mut Vec<Record>) -> bool {
        self.scan_below(from, None, f, limit, out)
    }

    /// [`CoreStore::scan`] of the records before `below` only (all when `None`).
    fn scan_below(
        &self,
        from: Pos,
        below: Option<Pos>,
        f: &Filter,
        limit: usize,
        out: &mut Vec<Record>,
    ) -> bool {
        let start = out.len();
        let below_ok = |p: &Pos| below.is_none_or(|b| *p < b);
        let mut push = |r: &Record| {
            if r.matches(f) {
                out.push(*r);
            }
            out.len() - start < limit
        };
        // Without secondary indexes every filter reads the ordered index (the node refuses
        // filtered polls before they get here; this keeps the answer right regardless).
        let index = match (f.account, f.instrument, f.firm) {
            _ if !self.indexed => None,
            (Some(a), _, _) => Some((&self.by_account, a.0)),
            (None, Some(i), _) => Some((&self.by_instrument, i.0)),
            (None, None, Some(firm)) => Some((&self.by_firm, firm.0)),
            (None, None, None) => None,
        };
        let exhausted = match index {
            None => self
                .records
                .range(from..)
                .take_while(|(p, _)| below_ok(p))
                .all(|(_, r)| push(r)),
            Some((set, key)) => set
                .range((Bound::Included((key, from)), Bound::Unbounded))
                .take_while(|(k, p)| *k == key && below_ok(p))
                .all(|(_, pos)| push(&self.records[pos])),
        };
        // `all` stops early only when the limit was reached; reaching it on the very last
        // record still counts as not exhausted (the next scan finds nothing, which is fine).
        exhausted && out.len() - start < limit
    }

    fn stats(&self) -> CoreStats {
        CoreStats {
            core: self.id,
            applied_index: self.applied,
            records: self.records.len(),
            live_orders: self.records.values().filter(|r| !r.is_final()).count(),
            writes: self.writes,
            evicted: self.evicted,
            horizon_index: self.horizon.index,
            last_ts_ns: self.last_ts_ns,
            cold: self.cold.as_ref().map(ColdLog::stats),
        }
    }

    /// The first position whose record is at or after `since_ns` (see
    /// [`Store::cursor_since`]).
    fn position_at(&self, since_ns: u64) -> Result<Pos, CursorError> {
        let too_old = |oldest: Pos| CursorError::TooOld {
            core: self.id,
            oldest_index: oldest.index,
        };
        if let Some(cold) = self.cold.as_ref().filter(|c| c.start().is_some()) {
            let start = cold.start().expect("filtered");
            if start > Pos::START && cold.first_ts_ns().is_some_and(|t| since_ns < t) {
                return Err(too_old(start));
            }
            if let Ok(Some(pos)) = cold.position_at(since_ns) {
                if pos < self.horizon {
                    // A live order below the horizon is in memory, not on disk.
                    let live = self
                        .records
                        .range(..pos)
                        .find(|(_, r)| r.ts_ns() >= since_ns)
                        .map(|(p, _)| *p);
                    return Ok(live.map_or(pos, |l| l.min(pos)));
                }
            }
        } else if self.horizon > Pos::START {
            // Without cold data, memory holds whole history only from the horizon on.
            let first_ts = self
                .records
                .range(self.horizon..)
                .next()
                .map(|(_, r)| r.ts_ns());
            if first_ts.is_none_or(|t| since_ns < t) {
                return Err(too_old(self.horizon));
            }
        }
        let found = self
            .records
            .range(self.horizon..)
            .find(|(_, r)| r.ts_ns() >= since_ns)
            .map(|(p, _)| *p);
        Ok(found.unwrap_or(Pos::entry_start(self.applied)))
    }

    /// A read from `from`, behind the horizon, where the cold log has it: the evicted
    /// records from disk merged by position with the live orders that stayed in memory
    /// below the horizon, then (if the limit allows) the records above it.
    fn scan_with_cold(
        &self,
        cold: &ColdLog,
        from: Pos,
        f: &Filter,
        limit: usize,
        out: &mut Vec<Record>,
    ) -> ScanEnd {
        let mut old = Vec::new();
        let end = match cold.read(from, self.horizon, f, limit, &mut old) {
            Ok(end) => end,
            // A read that fails answers nothing from here: the poll is answered again later
            // (the fault is in the core's stats), never with a gap.
            Err(_) => return ScanEnd::Scanned(from),
        };
        let bound = match end {
            ColdEnd::Scanned(p) => p,
            ColdEnd::Done | ColdEnd::Limit => self.horizon,
        };
        let mut live = Vec::new();
        self.scan_below(from, Some(bound), f, limit, &mut live);
        let start = out.len();
        let (mut a, mut b) = (old.into_iter().peekable(), live.into_iter().peekable());
        while out.len() - start < limit {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.pos() < y.pos() => a.next(),
                (Some(_), Some(_)) | (None, Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, None) => break,
            };
            out.extend(next);
        }
        let taken = out.len() - start;
        if taken == limit {
            return ScanEnd::Limit;
        }
        match end {
            ColdEnd::Scanned(p) => ScanEnd::Scanned(p),
            ColdEnd::Limit => ScanEnd::Limit,
            ColdEnd::Done => {
                if self.scan(self.horizon, f, limit - taken, out) {
                    ScanEnd::Exhausted
                } else {
                    ScanEnd::Limit
                }
            }
        }
    }
}

/// Where a poll starts, per core in the store's order: the position, and the floor of a
/// snapshot read (`None` outside one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub from: Vec<Pos>,
    pub floors: Vec<Option<Pos>>,
}

/// One answer's records and the cursor that continues after them.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    pub records: Vec<Record>,
    /// Per core (in the store's order), the first position not yet delivered.
    pub next: Vec<Pos>,
}

impl Store {
    pub fn new(config: &StoreConfig) -> Store {
        assert!(
            config.cores.len() <= crate::cursor::CORES_MAX,
            "at most {} cores",
            crate::cursor::CORES_MAX
        );
        Store {
            config: config.clone(),
            deployment: crate::cursor::deployment_hash(&config.deployment),
            cores: config
                .cores
                .iter()
                .map(|&id| CoreStore::new(id, config.secondary_indexes))
                .collect(),
            records_per_core_max: config.records_per_core_max.max(16),
            events: Vec::new(),
        }
    }

    /// What this store was made with.
    pub fn config(&self) -> StoreConfig {
        self.config.clone()
    }

    /// The identity every cursor of this store carries (see [`crate::cursor::fresh_identity`]).
    pub fn deployment(&self) -> u64 {
        self.deployment
    }

    /// Gives this store its identity: a fresh random one for a new, empty store, or its
    /// primary's for a read replica (before it hands out a cursor, and before
    /// [`Store::attach_cold`], whose files carry it).
    pub fn set_identity(&mut self, identity: u64) {
        self.deployment = identity;
    }

    /// The first position of the core at `slot` this store does not hold yet: a cursor past
    /// it is ahead of this node.
    fn end_of(&self, slot: usize) -> Pos {
        let c = &self.cores[slot];
        Pos::entry_start(c.applied).max(c.received.unwrap_or(Pos::START))
    }

    pub fn core_ids(&self) -> Vec<u32> {
        self.cores.iter().map(|c| c.id).collect()
    }

    /// The next log index the store will apply for the core at `slot`.
    pub fn applied_index(&self, slot: usize) -> u64 {
        self.cores[slot].applied
    }

    pub fn stats(&self) -> Vec<CoreStats> {
        self.cores.iter().map(CoreStore::stats).collect()
    }

    /// Applies one committed entry of the core at `slot`: the records of its applied requests
    /// at positions `(index, 0)`, `(index, 1)`, ... An entry already applied is skipped (a
    /// feed that resumed earlier); one past the next due is refused. Returns the records
    /// written.
    pub fn apply_entry(&mut self, slot: usize, entry: &EntryView) -> Result<usize, ApplyError> {
        let core = &mut self.cores[slot];
        let index = entry.index();
        if index < core.applied {
            return Ok(0);
        }
        if index > core.applied {
            return Err(ApplyError::Gap {
                expected: core.applied,
                got: index,
            });
        }
        let mut ord = 0u32;
        for request in entry.requests().filter(|r| r.applied_here()) {
            self.events.clear();
            bourse_core::codec::decode_events_into(request.event_bytes(), &mut self.events)
                .map_err(ApplyError::Events)?;
            // Learn the firms first: a trade comes before the order-log records of its
            // orders, which carry their accounts' firms.
            for e in &self.events {
                match e {
                    Event::AccountAdded { account, firm, .. } => {
                        core.firms_of.insert(*account, *firm);
                    }
                    Event::OrderLog(l) => {
                        core.firms_of.insert(l.account, l.firm);
                    }
                    _ => {}
                }
            }
            for e in self.events.iter().filter(|e| is_kept(e)) {
                let firm = |a: &AccountId| core.firms_of.get(a).copied();
                let firms = match e {
                    Event::OrderLog(l) => [Some(l.firm); 2],
                    Event::Trade { buy, sell, .. } => [firm(&buy.account), firm(&sell.account)],
                    Event::OrderRejected { account, .. } => [firm(account); 2],
                    _ => [None; 2],
                };
                core.insert(Record {
                    core: core.id,
                    index,
                    ord,
                    firms,
                    event: *e,
                });
                ord += 1;
            }
        }
        core.applied = index + 1;
        core.evict(self.records_per_core_max);
        Ok(ord as usize)
    }

    /// Applies one answer a read replica got from its primary: its records (each at the
    /// primary's position, which is the core's, so cursors hold on both) and the cursor after
    /// them, as `(core, position)` parts. `complete` says the answer held everything the
    /// primary had (fewer records than asked for). A core's horizon is set by the first
    /// record or complete answer that names it: a cursor before what the replica first read
    /// is refused as too old, never answered with a gap. Returns the records written.
    pub fn apply_answer(
        &mut self,
        records: &[Record],
        next: &[(u32, Pos)],
        complete: bool,
    ) -> Result<usize, ApplyError> {
        for r in records {
            let core = self
                .cores
                .iter_mut()
                .find(|c| c.id == r.core)
                .ok_or(ApplyError::UnknownCore(r.core))?;
            if let Some(at) = core.received {
                if r.pos() < at {
                    return Err(ApplyError::Behind {
                        core: r.core,
                        at,
                        got: r.pos(),
                    });
                }
            } else {
                core.horizon = r.pos();
            }
            core.received = Some(r.pos().next());
            core.insert(*r);
        }
        for &(id, pos) in next {
            let core = self
                .cores
                .iter_mut()
                .find(|c| c.id == id)
                .ok_or(ApplyError::UnknownCore(id))?;
            match core.received {
                Some(at) => core.received = Some(at.max(pos)),
                None if complete => {
                    core.horizon = pos;
                    core.received = Some(pos);
                }
                None => continue,
            }
            // Entries before the one the cursor stops in are whole here.
            core.applied = core.applied.max(pos.index);
        }
        let max = self.records_per_core_max;
        for core in &mut self.cores {
            core.evict(max);
        }
        Ok(records.len())
    }

    /// A replica about to read its primary from the origin (every core from its first
    /// position): if the primary accepts that cursor it has evicted nothing, so the replica
    /// will hold everything and its horizon is the origin too.
    pub fn read_from_origin(&mut self) {
        for core in &mut self.cores {
            assert!(
                core.records.is_empty() && core.received.is_none_or(|p| p == Pos::START),
                "only a store that has read nothing reads from the origin"
            );
            core.received = Some(Pos::START);
            core.horizon = Pos::START;
        }
    }

    /// Keeps each core's evicted records on disk under `dir` (`core-N`), so that cursors
    /// behind the horizon are answered while the disk keeps them (see [`crate::cold`]). A
    /// log that does not reach the store's horizon (appends lost in a crash) starts again.
    pub fn attach_cold(
        &mut self,
        dir: &std::path::Path,
        config: &crate::cold::ColdConfig,
    ) -> Result<(), String> {
        for core in &mut self.cores {
            let mut log = ColdLog::open(
                &dir.join(format!("core-{}", core.id)),
                self.deployment,
                core.id,
                config,
            )?;
            log.check_reaches(core.horizon);
            core.cold = Some(log);
        }
        Ok(())
    }

    /// A cursor at the first record of each core whose time is at or after `since_ns`, read
    /// from the cold log where memory no longer has it; refused as too old when a core
    /// keeps nothing that far back.
    pub fn cursor_since(&self, since_ns: u64) -> Result<Cursor, CursorError> {
        let mut next = Vec::with_capacity(self.cores.len());
        for core in &self.cores {
            next.push(core.position_at(since_ns)?);
        }
        Ok(self.cursor(&next))
    }

    /// A replica: whether every core's horizon is known (its first answers are read).
    pub fn has_read_every_core(&self) -> bool {
        self.cores.iter().all(|c| c.received.is_some())
    }

    /// The per-core start positions a cursor names (every core from its start for `None`),
    /// with the floors of a snapshot read (see [`crate::cursor`]): a read without a cursor
    /// starts below a core's horizon when live orders sit behind evicted records, and its
    /// continuation stays good while that horizon holds.
    pub fn resolve(&self, cursor: Option<&Cursor>) -> Result<Start, CursorError> {
        let mut start = Start {
            from: vec![Pos::START; self.cores.len()],
            floors: vec![None; self.cores.len()],
        };
        let Some(c) = cursor else {
            for (slot, core) in self.cores.iter().enumerate() {
                if core.horizon > Pos::START {
                    start.floors[slot] = Some(core.horizon);
                }
            }
            return Ok(start);
        };
        if c.deployment != self.deployment {
            return Err(CursorError::Foreign(
                "it names another deployment".to_string(),
            ));
        }
        let slot_of = |core: u32| {
            self.cores.iter().position(|s| s.id == core).ok_or_else(|| {
                CursorError::Foreign(format!(
                    "it names core {core}, which this deployment does not serve"
                ))
            })
        };
        for (core, pos) in &c.parts {
            start.from[slot_of(*core)?] = *pos;
        }
        for (core, floor) in &c.floors {
            start.floors[slot_of(*core)?] = Some(*floor);
        }
        for (slot, core) in self.cores.iter().enumerate() {
            if start.from[slot] > self.end_of(slot) {
                return Err(CursorError::Ahead {
                    core: core.id,
                    index: start.from[slot].index,
                    applied: core.applied,
                });
            }
        }
        for (slot, core) in self.cores.iter().enumerate() {
            let inside_snapshot = start.floors[slot].is_some_and(|f| core.horizon <= f);
            let from = start.from[slot];
            if from < core.horizon && !inside_snapshot {
                if !core.cold_covers(from) {
                    let oldest = core.cold.as_ref().and_then(ColdLog::start);
                    return Err(CursorError::TooOld {
                        core: core.id,
                        oldest_index: oldest.unwrap_or(core.horizon).index,
                    });
                }
                // Eviction passed the snapshot's floor: its records are on disk now.
                start.floors[slot] = None;
            }
        }
        Ok(start)
    }

    /// The cursor text for per-core positions.
    pub fn cursor(&self, next: &[Pos]) -> Cursor {
        Cursor {
            deployment: self.deployment,
            parts: self
                .cores
                .iter()
                .map(|c| c.id)
                .zip(next.iter().copied())
                .collect(),
            floors: Vec::new(),
        }
    }

    /// The cursor after an answer that read from `start`: a snapshot's floors are carried
    /// for the cores whose position is still below them.
    pub fn cursor_after(&self, start: &Start, next: &[Pos]) -> Cursor {
        let mut c = self.cursor(next);
        c.floors = self
            .cores
            .iter()
            .zip(next.iter().zip(&start.floors))
            .filter_map(|(core, (&pos, floor))| floor.filter(|&f| pos < f).map(|f| (core.id, f)))
            .collect();
        c
    }

    /// Up to `limit` matching records after `from`, merged across cores by time (each core's
    /// own order kept), and the positions after them. A core with nothing more that matches
    /// moves to its end, so a quiet core or a filter that matches nothing there never holds
    /// a cursor behind the horizon.
    pub fn query(&self, from: &[Pos], f: &Filter, limit: usize) -> Answer {
        self.query_floors(from, &vec![None; from.len()], f, limit)
    }

    /// [`Store::query`] from where [`Store::resolve`] says a poll starts: a core read behind
    /// its horizon outside a snapshot is read from its cold log.
    pub fn query_start(&self, start: &Start, f: &Filter, limit: usize) -> Answer {
        self.query_floors(&start.from, &start.floors, f, limit)
    }

    fn query_floors(
        &self,
        from: &[Pos],
        floors: &[Option<Pos>],
        f: &Filter,
        limit: usize,
    ) -> Answer {
        let limit = limit.max(1);
        let mut per_core: Vec<Vec<Record>> = Vec::with_capacity(self.cores.len());
        let mut ends = Vec::with_capacity(self.cores.len());
        for ((core, &from), floor) in self.cores.iter().zip(from).zip(floors) {
            let mut v = Vec::new();
            let end = match core.cold.as_ref() {
                Some(cold) if floor.is_none() && core.cold_covers(from) => {
                    core.scan_with_cold(cold, from, f, limit, &mut v)
                }
                _ if core.scan(from, f, limit, &mut v) => ScanEnd::Exhausted,
                _ => ScanEnd::Limit,
            };
            ends.push(end);
            per_core.push(v);
        }
        let mut taken = vec![0usize; self.cores.len()];
        let mut records = Vec::with_capacity(limit.min(per_core.iter().map(Vec::len).sum()));
        while records.len() < limit {
            // The core whose next record is oldest (ties: the first core).
            let best = (0..per_core.len())
                .filter(|&c| taken[c] < per_core[c].len())
                .min_by_key(|&c| per_core[c][taken[c]].ts_ns());
            let Some(c) = best else { break };
            records.push(per_core[c][taken[c]]);
            taken[c] += 1;
        }
        let next = (0..self.cores.len())
            .map(|c| {
                let all_taken = taken[c] == per_core[c].len();
                if let (true, ScanEnd::Scanned(p)) = (all_taken, ends[c]) {
                    p.max(from[c])
                } else if all_taken && ends[c] == ScanEnd::Exhausted {
                    // A replica may hold part of the entry at `applied`: never step back
                    // over what this answer handed out.
                    let after_taken = per_core[c][..taken[c]].last().map(|r| r.pos().next());
                    from[c]
                        .max(Pos::entry_start(self.cores[c].applied))
                        .max(after_taken.unwrap_or(Pos::START))
                } else if taken[c] > 0 {
                    per_core[c][taken[c] - 1].pos().next()
                } else {
                    from[c]
                }
            })
            .collect();
        Answer { records, next }
    }

    /// The whole store in its persisted form (see [`Store::decode`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(
            64 + self
                .cores
                .iter()
                .map(|c| c.records.len() * 96)
                .sum::<usize>(),
        );
        w.u32(STATE_MAGIC);
        w.u64(self.deployment);
        w.u64(self.cores.len() as u64);
        for c in &self.cores {
            w.u32(c.id);
            w.u64(c.applied);
            w.u64(c.horizon.index);
            w.u32(c.horizon.ord);
            w.u64(c.writes);
            w.u64(c.evicted);
            let mut firms: Vec<_> = c.firms_of.iter().map(|(a, f)| (a.0, f.0)).collect();
            firms.sort_unstable();
            w.u64(firms.len() as u64);
            for (a, f) in firms {
                w.u32(a);
                w.u32(f);
            }
            w.u64(c.records.len() as u64);
            for r in c.records.values() {
                encode_record(&mut w, r);
            }
        }
        let crc = crc32c::crc32c(&w.buf);
        w.u32(crc);
        w.finish()
    }

    /// A store from its persisted form. The file must be this deployment's and name only
    /// cores it follows; a core it lacks starts empty.
    pub fn decode(config: &StoreConfig, bytes: &[u8]) -> Result<Store, String> {
        let mut store = Store::new(config);
        if bytes.len() < 8 {
            return Err("state file too short".into());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
            return Err("state file checksum does not match (damaged)".into());
        }
        let e = |e: DecodeError| format!("state file: {e}");
        let mut r = Reader::new(body);
        // A version 1 file's identity is the name's hash; version 2 keeps a random one.
        let legacy = match r.u32().map_err(e)? {
            STATE_MAGIC => false,
            STATE_MAGIC_V1 => true,
            _ => return Err("not a delivery state file".into()),
        };
        let identity = r.u64().map_err(e)?;
        let ours = if legacy {
            identity == store.deployment
        } else {
            crate::cursor::identity_names(identity, &config.deployment)
        };
        if !ours {
            return Err(format!(
                "state file of another deployment than `{}`",
                config.deployment
            ));
        }
        store.deployment = identity;
        let n = r.count(40).map_err(e)?;
        for _ in 0..n {
            let id = r.u32().map_err(e)?;
            let Some(slot) = store.cores.iter().position(|c| c.id == id) else {
                return Err(format!(
                    "state file holds core {id}, which is not configured"
                ));
            };
            let mut c = CoreStore::new(id, config.secondary_indexes);
            c.applied = r.u64().map_err(e)?;
            c.horizon = Pos {
                index: r.u64().map_err(e)?,
                ord: r.u32().map_err(e)?,
            };
            c.writes = r.u64().map_err(e)?;
            c.evicted = r.u64().map_err(e)?;
            for _ in 0..r.count(8).map_err(e)? {
                let a = AccountId(r.u32().map_err(e)?);
                c.firms_of.insert(a, FirmId(r.u32().map_err(e)?));
            }
            let writes = c.writes;
            for _ in 0..r.count(30).map_err(e)? {
                let record = decode_record(&mut r, id).map_err(|m| format!("state file: {m}"))?;
                c.insert(record);
            }
            c.writes = writes;
            store.cores[slot] = c;
        }
        r.expect_end().map_err(e)?;
        Ok(store)
    }
}

/// The state file's first bytes: version 2 holds the store's random identity after them.
const STATE_MAGIC: u32 = u32::from_le_bytes(*b"BDS2");
/// A version 1 file (read, never written): the identity was the name's hash.
const STATE_MAGIC_V1: u32 = u32::from_le_bytes(*b"BDS1");

/// One record as the state file and the cold log write it: position, firms, the event.
pub(crate) fn encode_record(w: &mut Writer, r: &Record) {
    w.u64(r.index);
    w.u32(r.ord);
    for firm in r.firms {
        w.bool(firm.is_some());
        w.u32(firm.map_or(0, |f| f.0));
    }
    encode_events_into(w, &[r.event]);
}

/// A record of core `core` written by [`encode_record`].
pub(crate) fn decode_record(r: &mut Reader, core: u32) -> Result<Record, String> {
    let e = |e: DecodeError| e.to_string();
    let index = r.u64().map_err(e)?;
    let ord = r.u32().map_err(e)?;
    let mut firms = [None; 2];
    for f in &mut firms {
        let some = r.bool().map_err(e)?;
        let v = r.u32().map_err(e)?;
        *f = some.then_some(FirmId(v));
    }
    if r.u32().map_err(e)? != 1 {
        return Err("a record holds other than one event".into());
    }
    let event = decode_event(r).map_err(e)?;
    Ok(Record {
        core,
        index,
        ord,
        firms,
        event,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bourse_cluster::stream::{CommittedEntry, CommittedRequest};
    use bourse_cluster::OutcomeKind;
    use bourse_core::{Command, OrderLog};
    use bourse_engine::workload::{Flow, FlowConfig};
    use bourse_engine::{Engine, EngineConfig};
    use std::sync::Arc;

    /// Committed entries of a small order flow through a real engine, `per_entry` commands
    /// each, and the events of every command in order (the core's own event log).
    pub(crate) fn flow_entries(seed: u64, commands: usize, per_entry: usize) -> Vec<EntryView> {
        let mut config = FlowConfig::exchange_core(seed);
        config.accounts = 40;
        config.live_orders_target = 60;
        let mut flow = Flow::new(config);
        let mut engine = Engine::new(EngineConfig::default());
        let mut bodies: Vec<_> = flow.setup();
        let mut entries = Vec::new();
        let mut requests = Vec::new();
        let mut events = Vec::new();
        let mut seq = 0;
        let mut i = 0;
        while i < commands {
            let body = if bodies.is_empty() {
                i += 1;
                flow.next_command()
            } else {
                bodies.remove(0)
            };
            events.clear();
            engine.apply(&Command::new(seq, body), &mut events);
            flow.observe(&events);
            seq += 1;
            requests.push(CommittedRequest {
                client_id: 1,
                request_seq: seq,
                kind: OutcomeKind::Applied,
                applied_index: entries.len() as u64,
                events: bourse_core::codec::encode_events(&events),
                audit: None,
            });
            if requests.len() == per_entry {
                entries.push(EntryView::new(Arc::new(CommittedEntry {
                    index: entries.len() as u64,
                    requests: std::mem::take(&mut requests),
                    market_data_flush_ns: None,
                })));
            }
        }
        entries
    }

    /// The latest order-log record of every order, and every trade, in the entries.
    fn expected(entries: &[EntryView]) -> (BTreeMap<OrderId, OrderLog>, usize) {
        let mut orders = BTreeMap::new();
        let mut trades = 0;
        for e in entries {
            for r in e.requests() {
                for ev in r.events() {
                    match ev.unwrap() {
                        Event::OrderLog(l) => {
                            orders.insert(l.order_id, l);
                        }
                        Event::Trade { .. } => trades += 1,
                        _ => {}
                    }
                }
            }
        }
        (orders, trades)
    }

    fn config(cores: Vec<u32>, max: usize) -> StoreConfig {
        StoreConfig {
            deployment: "test".into(),
            cores,
            records_per_core_max: max,
            secondary_indexes: true,
        }
    }

    /// One poll of `primary` by a replica, as the replica's feed makes it: from the cursor
    /// of the primary's last answer.
    fn replicate_once(
        primary: &Store,
        replica: &mut Store,
        resume: &mut Option<Cursor>,
        limit: usize,
    ) -> usize {
        let start = primary.resolve(resume.as_ref()).unwrap();
        let a = primary.query(&start.from, &Filter::default(), limit);
        let next = primary.cursor_after(&start, &a.next);
        let complete = a.records.len() < limit;
        let n = replica
            .apply_answer(&a.records, &next.parts, complete)
            .unwrap();
        *resume = Some(next);
        n
    }

    #[test]
    fn a_replica_reading_its_primary_answers_every_cursor_as_the_primary_does() {
        let entries = flow_entries(9, 3_000, 4);
        let mut primary = Store::new(&config(vec![0, 1], 1 << 20));
        let mut replica = Store::new(&StoreConfig {
            secondary_indexes: false,
            ..config(vec![0, 1], 1 << 20)
        });
        replica.read_from_origin();
        let mut resume = Some(primary.cursor(&[Pos::START; 2]));
        // The replica reads while the primary is written, in small answers, so that answers
        // stop inside entries and orders move after the replica read them.
        // A client of the primary keeps its cursors along the way.
        let mut cursors = Vec::new();
        let mut client_from = vec![Pos::START; 2];
        for (i, e) in entries.iter().enumerate() {
            primary.apply_entry(0, e).unwrap();
            if i % 3 == 0 {
                primary.apply_entry(1, &entries[i / 3]).unwrap();
            }
            if i % 7 == 0 {
                replicate_once(&primary, &mut replica, &mut resume, 11);
                client_from = primary.query(&client_from, &Filter::default(), 23).next;
                cursors.push(client_from.clone());
            }
        }
        assert!(replica.has_read_every_core());
        while replicate_once(&primary, &mut replica, &mut resume, 11) > 0 {}
        // Every cursor a client took from the primary reads the same records on both.
        for from in cursors {
            let from_text = primary.cursor(&from);
            let on_replica = replica.resolve(Some(&from_text)).unwrap().from;
            let (a, _) = read_all(&primary, from.clone(), &Filter::default(), 17);
            let (b, _) = read_all(&replica, on_replica, &Filter::default(), 17);
            assert_eq!(a, b);
        }
        for slot in 0..2 {
            assert_eq!(replica.applied_index(slot), primary.applied_index(slot));
        }
        assert!(replica.cores.iter().all(|c| c.by_account.is_empty()));
    }

    #[test]
    fn a_replica_refuses_cursors_from_before_what_it_first_read() {
        let entries = flow_entries(10, 2_000, 4);
        let mut primary = Store::new(&config(vec![0], 64));
        for e in &entries[..entries.len() / 2] {
            primary.apply_entry(0, e).unwrap();
        }
        let old = primary.cursor(&[Pos::START]);
        assert!(primary.resolve(Some(&old)).is_err(), "the primary evicted");
        let mut replica = Store::new(&StoreConfig {
            secondary_indexes: false,
            ..config(vec![0], 1 << 20)
        });
        // The primary refuses the origin, so the replica reads its current picture, in
        // answers cut below the primary's horizon (old live orders come first): the floors
        // keep those cursors good.
        let mut resume = None;
        while replicate_once(&primary, &mut replica, &mut resume, 5) > 0 {}
        assert!(replica.has_read_every_core());
        assert!(matches!(
            replica.resolve(Some(&old)),
            Err(CursorError::TooOld { core: 0, .. })
        ));
        // A record handed over out of order is refused, not applied.
        let first = primary.query(&[Pos::START], &Filter::default(), 1).records;
        let r = primary.cursor(&[Pos::START]).parts;
        assert!(matches!(
            replica.apply_answer(&first, &r, false),
            Err(ApplyError::Behind { .. })
        ));
    }

    /// Reads everything from `from` in answers of `limit`; returns the records and the end.
    fn read_all(
        store: &Store,
        from: Vec<Pos>,
        f: &Filter,
        limit: usize,
    ) -> (Vec<Record>, Vec<Pos>) {
        let mut from = from;
        let mut out = Vec::new();
        loop {
            let a = store.query(&from, f, limit);
            if a.records.is_empty() {
                return (out, a.next);
            }
            out.extend(a.records);
            from = a.next;
        }
    }

    #[test]
    fn the_store_holds_each_orders_latest_state_and_every_trade() {
        let entries = flow_entries(1, 3_000, 7);
        let mut store = Store::new(&config(vec![0], 1 << 20));
        for e in &entries {
            store.apply_entry(0, e).unwrap();
        }
        let (orders, trades) = expected(&entries);
        let (got, _) = read_all(&store, vec![Pos::START], &Filter::default(), 97);
        let got_orders: BTreeMap<OrderId, OrderLog> = got
            .iter()
            .filter_map(|r| match r.event {
                Event::OrderLog(l) => Some((l.order_id, l)),
                _ => None,
            })
            .collect();
        assert_eq!(got_orders, orders);
        assert_eq!(
            got.iter()
                .filter(|r| matches!(r.event, Event::Trade { .. }))
                .count(),
            trades
        );
        assert!(
            got.windows(2).all(|w| w[0].pos() < w[1].pos()),
            "in position order"
        );
        // Every record is exactly the event the core wrote at that position.
        for r in &got {
            let events: Vec<Event> = entries[r.index as usize]
                .requests()
                .flat_map(|q| q.events().map(|e| e.unwrap()).collect::<Vec<_>>())
                .filter(is_kept)
                .collect();
            assert_eq!(events[r.ord as usize], r.event);
        }
    }

    #[test]
    fn a_client_polling_while_the_store_is_written_misses_no_change() {
        let entries = flow_entries(2, 2_000, 3);
        let mut store = Store::new(&config(vec![0], 1 << 20));
        let mut from = vec![Pos::START];
        let mut seen: BTreeMap<OrderId, OrderLog> = BTreeMap::new();
        let mut last_seq = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            store.apply_entry(0, e).unwrap();
            if i % 5 == 0 {
                let a = store.query(&from, &Filter::default(), 13);
                for r in a.records {
                    if let Event::OrderLog(l) = r.event {
                        // An order's state never goes backwards.
                        let prev = last_seq.insert(l.order_id, l.seq);
                        assert!(prev.is_none_or(|p| p < l.seq));
                        seen.insert(l.order_id, l);
                    }
                }
                from = a.next;
            }
        }
        let (rest, _) = read_all(&store, from, &Filter::default(), 13);
        for r in rest {
            if let Event::OrderLog(l) = r.event {
                seen.insert(l.order_id, l);
            }
        }
        assert_eq!(seen, expected(&entries).0);
    }

    #[test]
    fn filters_are_exact() {
        let entries = flow_entries(3, 2_000, 5);
        let mut store = Store::new(&config(vec![0], 1 << 20));
        for e in &entries {
            store.apply_entry(0, e).unwrap();
        }
        let (all, _) = read_all(&store, vec![Pos::START], &Filter::default(), 1000);
        let filters = [
            Filter {
                firm: Some(FirmId(2)),
                ..Filter::default()
            },
            Filter {
                account: Some(AccountId(all[5].accounts()[0].0)),
                ..Filter::default()
            },
            Filter {
                instrument: Some(all[0].instrument()),
                ..Filter::default()
            },
            Filter {
                firm: Some(FirmId(1)),
                instrument: Some(all[0].instrument()),
                ..Filter::default()
            },
            Filter {
                firm: Some(FirmId(999)),
                ..Filter::default()
            },
        ];
        for f in filters {
            let (got, _) = read_all(&store, vec![Pos::START], &f, 7);
            let want: Vec<Record> = all.iter().filter(|r| r.matches(&f)).copied().collect();
            assert_eq!(got, want, "{f:?}");
        }
        assert!(!read_all(&store, vec![Pos::START], &filters[0], 7)
            .0
            .is_empty());
    }

    #[test]
    fn a_quiet_core_does_not_hold_back_the_merged_cursor() {
        let entries = flow_entries(4, 600, 4);
        let mut store = Store::new(&config(vec![7, 9], 1 << 20));
        for e in &entries {
            store.apply_entry(0, e).unwrap();
        }
        // Core 9 never wrote anything: core 7's records all come, and the cursor moves on.
        let (got, next) = read_all(&store, vec![Pos::START; 2], &Filter::default(), 50);
        assert_eq!(got.len(), store.stats()[0].records);
        assert!(got.iter().all(|r| r.core == 7));
        assert_eq!(next[0], Pos::entry_start(entries.len() as u64));
        // Core 9 starts writing: its records come after the cursor, core 7's do not again.
        for e in &entries {
            store.apply_entry(1, e).unwrap();
        }
        let (more, _) = read_all(&store, next, &Filter::default(), 50);
        assert!(!more.is_empty() && more.iter().all(|r| r.core == 9));
    }

    /// Every record from `cursor` on, polled as a client does (resolve, query from where
    /// the poll starts, the cursor after it), `limit` per answer.
    fn poll_all(store: &Store, cursor: Option<Cursor>, f: &Filter, limit: usize) -> Vec<Record> {
        let mut cursor = cursor;
        let mut out = Vec::new();
        loop {
            let start = store.resolve(cursor.as_ref()).expect("a good cursor");
            let a = store.query_start(&start, f, limit);
            let next = store.cursor_after(&start, &a.next);
            if a.records.is_empty() && cursor.as_ref() == Some(&next) {
                return out;
            }
            out.extend(a.records);
            cursor = Some(next);
        }
    }

    fn cold_config() -> crate::cold::ColdConfig {
        crate::cold::ColdConfig {
            segment_bytes: 64 << 10,
            ..Default::default()
        }
    }

    fn filters() -> Vec<Filter> {
        vec![
            Filter::default(),
            Filter {
                firm: Some(FirmId(2)),
                ..Filter::default()
            },
            Filter {
                account: Some(AccountId(7)),
                ..Filter::default()
            },
            Filter {
                instrument: Some(bourse_core::InstrumentId(1)),
                ..Filter::default()
            },
        ]
    }

    #[test]
    fn a_cursor_behind_the_horizon_is_answered_from_cold_data_as_if_nothing_was_evicted() {
        let entries = flow_entries(7, 6_000, 5);
        let dir = tempfile::tempdir().unwrap();
        let mut cold = Store::new(&config(vec![0, 1], 300));
        cold.attach_cold(dir.path(), &cold_config()).unwrap();
        let mut whole = Store::new(&config(vec![0, 1], usize::MAX / 2));
        let early = cold.cursor(&[Pos::START, Pos::START]);
        let mut middle = None;
        for (i, e) in entries.iter().enumerate() {
            for slot in 0..2 {
                cold.apply_entry(slot, e).unwrap();
                whole.apply_entry(slot, e).unwrap();
            }
            if i == entries.len() / 2 {
                let a = whole.query(&[Pos::START; 2], &Filter::default(), 5_000);
                middle = Some(whole.cursor(&a.next));
            }
        }
        let s = &cold.stats()[0];
        assert!(s.evicted > 300, "{s:?}");
        assert!(
            s.cold.as_ref().unwrap().records_written as u64 == s.evicted,
            "{s:?}"
        );
        for f in filters() {
            for (cursor, limit) in [(early.clone(), 97), (middle.clone().unwrap(), 1_000)] {
                let got = poll_all(&cold, Some(cursor.clone()), &f, limit);
                let want = poll_all(&whole, Some(cursor), &f, limit);
                assert!(!want.is_empty());
                assert_eq!(got, want, "filter {f:?}");
            }
        }
        // A poll without a cursor still reads the memory's picture, not the disk's.
        assert_eq!(
            poll_all(&cold, None, &Filter::default(), 500).len(),
            cold.stats().iter().map(|s| s.records).sum::<usize>()
        );
    }

    #[test]
    fn cold_data_survives_a_restart_from_an_older_state_file_and_a_lost_tail_is_never_a_gap() {
        let entries = flow_entries(8, 6_000, 5);
        let dir = tempfile::tempdir().unwrap();
        let (first, rest) = entries.split_at(entries.len() / 2);
        let mut store = Store::new(&config(vec![0], 300));
        store.attach_cold(dir.path(), &cold_config()).unwrap();
        let mut whole = Store::new(&config(vec![0], usize::MAX / 2));
        for e in first {
            store.apply_entry(0, e).unwrap();
            whole.apply_entry(0, e).unwrap();
        }
        let saved = store.encode();
        let copy = tempfile::tempdir().unwrap();
        let copy_cold = |from: &std::path::Path, to: &std::path::Path| {
            let (from, to) = (from.join("core-0"), to.join("core-0"));
            std::fs::create_dir_all(&to).unwrap();
            for f in std::fs::read_dir(&from).unwrap() {
                let f = f.unwrap().path();
                std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
            }
        };
        copy_cold(dir.path(), copy.path());
        for e in rest {
            store.apply_entry(0, e).unwrap();
            whole.apply_entry(0, e).unwrap();
        }
        let early = store.cursor(&[Pos::START]);
        let want = poll_all(&whole, Some(early.clone()), &Filter::default(), 200);
        drop(store);
        // A crash after the last persist: the older state file, the newer cold log; the
        // entries after the state file are applied again.
        let mut again = Store::decode(&config(vec![0], 300), &saved).unwrap();
        again.attach_cold(dir.path(), &cold_config()).unwrap();
        for e in rest {
            again.apply_entry(0, e).unwrap();
        }
        assert_eq!(
            poll_all(&again, Some(early.clone()), &Filter::default(), 200),
            want
        );
        // The newer state file with the cold log as it was before (its tail lost): the log
        // starts again rather than answer across the missing records.
        let newer = again.encode();
        drop(again);
        let mut lost = Store::decode(&config(vec![0], 300), &newer).unwrap();
        lost.attach_cold(copy.path(), &cold_config()).unwrap();
        assert!(matches!(
            lost.resolve(Some(&early)),
            Err(CursorError::TooOld { core: 0, .. })
        ));
        assert_eq!(lost.stats()[0].cold.as_ref().unwrap().restarts, 1);
    }

    #[test]
    fn a_read_since_a_time_starts_there_and_cold_data_past_its_byte_bound_is_refused() {
        let entries = flow_entries(9, 8_000, 5);
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::new(&config(vec![0], 300));
        store.attach_cold(dir.path(), &cold_config()).unwrap();
        let mut whole = Store::new(&config(vec![0], usize::MAX / 2));
        for e in &entries {
            store.apply_entry(0, e).unwrap();
            whole.apply_entry(0, e).unwrap();
        }
        // Times are command numbers here: 4,000 lies in what was evicted.
        let since = store.cursor_since(4_000).unwrap();
        assert!(store.resolve(Some(&since)).unwrap().from[0] < store.cores[0].horizon);
        let got = poll_all(&store, Some(since.clone()), &Filter::default(), 300);
        let want = poll_all(&whole, Some(since), &Filter::default(), 300);
        assert_eq!(got, want);
        assert!(got.first().unwrap().ts_ns() >= 4_000);
        let early = store.cursor(&[Pos::START]);
        assert!(poll_all(&store, Some(early), &Filter::default(), 300).len() > got.len());
        // A byte bound of two small segments drops the oldest.
        let small = crate::cold::ColdConfig {
            bytes_max: 128 << 10,
            segment_bytes: 64 << 10,
            ..Default::default()
        };
        let dir2 = tempfile::tempdir().unwrap();
        let entries = flow_entries(9, 40_000, 5);
        let mut whole = Store::new(&config(vec![0], usize::MAX / 2));
        let mut store = Store::new(&config(vec![0], 300));
        store.attach_cold(dir2.path(), &small).unwrap();
        for e in &entries {
            store.apply_entry(0, e).unwrap();
            whole.apply_entry(0, e).unwrap();
        }
        assert!(
            std::fs::read_dir(dir2.path().join("core-0"))
                .unwrap()
                .count()
                <= 6
        );
        let first = store.stats()[0].cold.clone().unwrap().first_index.unwrap();
        assert!(first > 0);
        assert!(matches!(
            store.resolve(Some(&store.cursor(&[Pos::START]))),
            Err(CursorError::TooOld { core: 0, oldest_index }) if oldest_index == first
        ));
        assert!(matches!(
            store.cursor_since(0),
            Err(CursorError::TooOld { core: 0, .. })
        ));
        let kept_from = store.cores[0].cold.as_ref().unwrap().start().unwrap();
        assert_eq!(kept_from.index, first);
        let from_first = store.cursor(&[kept_from]);
        let got = poll_all(&store, Some(from_first), &Filter::default(), 300);
        let want: Vec<Record> = poll_all(&whole, None, &Filter::default(), 300)
            .into_iter()
            .filter(|r| r.pos() >= kept_from)
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn eviction_moves_the_horizon_and_an_older_cursor_is_too_old() {
        let entries = flow_entries(5, 3_000, 5);
        let mut store = Store::new(&config(vec![0], 200));
        let early = store.cursor(&[Pos::START]);
        for e in &entries {
            store.apply_entry(0, e).unwrap();
        }
        let s = &store.stats()[0];
        assert!(s.evicted > 0 && s.records <= 200 + s.live_orders, "{s:?}");
        assert!(matches!(
            store.resolve(Some(&early)),
            Err(CursorError::TooOld { core: 0, .. })
        ));
        // A snapshot (no cursor) still works and holds every live order.
        let from = store.resolve(None).unwrap().from;
        let (got, _) = read_all(&store, from, &Filter::default(), 100);
        assert_eq!(got.len(), store.stats()[0].records);
    }

    #[test]
    fn a_snapshot_cut_below_the_horizon_goes_on_until_eviction_passes_its_floor() {
        let entries = flow_entries(5, 6_000, 5);
        let (first, rest) = entries.split_at(entries.len() / 2);
        // Far fewer records kept than live orders: the oldest live orders sit below the
        // horizon, among evicted trades.
        let mut store = Store::new(&config(vec![0], 16));
        for e in first {
            store.apply_entry(0, e).unwrap();
        }
        // A snapshot (no cursor) still works and holds every live order, read in small
        // answers through the cursors a client hands back: they are cut below the horizon
        // (live orders older than evicted records come first) and the floors keep them good.
        let mut cursor: Option<Cursor> = None;
        let mut got = Vec::new();
        let mut inside = None;
        loop {
            let start = store.resolve(cursor.as_ref()).unwrap();
            let a = store.query(&start.from, &Filter::default(), 1);
            let next = store.cursor_after(&start, &a.next);
            if !next.floors.is_empty() {
                inside.get_or_insert(next.clone());
            }
            cursor = Some(next);
            if a.records.is_empty() {
                break;
            }
            got.extend(a.records);
        }
        assert_eq!(got.len(), store.stats()[0].records);
        assert!(
            cursor.unwrap().floors.is_empty(),
            "floors end with the snapshot"
        );
        // Once eviction passes the floor, a cursor inside that snapshot is too old.
        let inside = inside.expect("the snapshot was cut below the horizon");
        for e in rest {
            store.apply_entry(0, e).unwrap();
        }
        assert!(matches!(
            store.resolve(Some(&inside)),
            Err(CursorError::TooOld { core: 0, .. })
        ));
    }

    #[test]
    fn cursors_of_another_deployment_or_core_are_foreign() {
        let store = Store::new(&config(vec![0, 1], 100));
        let mut other = Store::new(&config(vec![0], 100)).cursor(&[Pos::START]);
        other.deployment ^= 1;
        assert!(matches!(
            store.resolve(Some(&other)),
            Err(CursorError::Foreign(_))
        ));
        let stranger = Cursor {
            deployment: store.deployment(),
            parts: vec![(5, Pos::START)],
            floors: Vec::new(),
        };
        let e = store.resolve(Some(&stranger)).unwrap_err();
        assert!(e.to_string().contains("core 5"), "{e}");
    }

    #[test]
    fn the_store_reads_back_from_its_persisted_form_and_goes_on_identically() {
        let entries = flow_entries(6, 2_000, 4);
        let (half, rest) = entries.split_at(entries.len() / 2);
        let mut straight = Store::new(&config(vec![0], 1 << 20));
        let mut saved = Store::new(&config(vec![0], 1 << 20));
        for e in half {
            straight.apply_entry(0, e).unwrap();
            saved.apply_entry(0, e).unwrap();
        }
        let bytes = saved.encode();
        let mut restored = Store::decode(&config(vec![0], 1 << 20), &bytes).unwrap();
        assert_eq!(restored.encode(), bytes);
        // Entries already applied are skipped; the rest applies as without the restart.
        for e in entries.iter() {
            straight.apply_entry(0, e).unwrap();
            restored.apply_entry(0, e).unwrap();
        }
        assert_eq!(restored.encode(), straight.encode());
        let mut damaged = bytes.clone();
        damaged[20] ^= 1;
        assert!(Store::decode(&config(vec![0], 100), &damaged)
            .err()
            .unwrap()
            .contains("checksum"));
        let other = StoreConfig {
            deployment: "other".into(),
            ..config(vec![0], 100)
        };
        assert!(Store::decode(&other, &bytes)
            .err()
            .unwrap()
            .contains("another deployment"));
        let _ = rest;
    }

    #[test]
    fn a_stores_identity_is_kept_in_its_persisted_form_and_a_version_1_file_still_reads() {
        let entries = flow_entries(8, 200, 4);
        let mut store = Store::new(&config(vec![0], 1 << 20));
        let identity = crate::cursor::fresh_identity("test", 0x1234_5678_9abc);
        store.set_identity(identity);
        for e in &entries {
            store.apply_entry(0, e).unwrap();
        }
        let bytes = store.encode();
        let restored = Store::decode(&config(vec![0], 1 << 20), &bytes).unwrap();
        assert_eq!(restored.deployment(), identity);
        let end = restored.cursor(&[Pos::entry_start(restored.applied_index(0))]);
        assert!(restored.resolve(Some(&end)).is_ok());
        // Another deployment's fresh identity is not this one's, even in a file of this name.
        let other = crate::cursor::fresh_identity("other", 0x1234_5678_9abc);
        let mut forged = bytes.clone();
        forged[4..12].copy_from_slice(&other.to_le_bytes());
        let n = forged.len() - 4;
        let crc = crc32c::crc32c(&forged[..n]);
        forged[n..].copy_from_slice(&crc.to_le_bytes());
        let e = Store::decode(&config(vec![0], 100), &forged).err().unwrap();
        assert!(e.contains("another deployment"), "{e}");
        // A version 1 file (identity: the name's hash) reads back with that identity, so
        // the cursors handed out before the upgrade hold.
        let mut v1 = Store::new(&config(vec![0], 1 << 20));
        for e in &entries {
            v1.apply_entry(0, e).unwrap();
        }
        let mut old = v1.encode();
        old[..4].copy_from_slice(b"BDS1");
        let n = old.len() - 4;
        let crc = crc32c::crc32c(&old[..n]);
        old[n..].copy_from_slice(&crc.to_le_bytes());
        let read = Store::decode(&config(vec![0], 1 << 20), &old).unwrap();
        assert_eq!(read.deployment(), crate::cursor::deployment_hash("test"));
    }

    #[test]
    fn a_cursor_past_what_the_store_applied_is_ahead() {
        let entries = flow_entries(9, 100, 4);
        let mut store = Store::new(&config(vec![0, 1], 1 << 20));
        for e in &entries {
            store.apply_entry(0, e).unwrap();
        }
        let applied = store.applied_index(0);
        let at = |index: u64, ord: u32| store.cursor(&[Pos { index, ord }, Pos::START]);
        assert!(store.resolve(Some(&at(applied, 0))).is_ok());
        assert!(store.resolve(Some(&at(applied - 1, 7))).is_ok());
        assert_eq!(
            store.resolve(Some(&at(applied, 1))).unwrap_err(),
            CursorError::Ahead {
                core: 0,
                index: applied,
                applied
            }
        );
        let e = store.resolve(Some(&at(applied + 100, 0))).unwrap_err();
        assert!(e.to_string().contains("cursor ahead"), "{e}");
        let other = store.cursor(&[Pos::START, Pos::entry_start(1)]);
        assert!(matches!(
            store.resolve(Some(&other)),
            Err(CursorError::Ahead { core: 1, .. })
        ));
    }

    #[test]
    fn an_entry_past_the_next_due_is_refused() {
        let entries = flow_entries(7, 100, 10);
        let mut store = Store::new(&config(vec![0], 100));
        assert_eq!(
            store.apply_entry(0, &entries[2]),
            Err(ApplyError::Gap {
                expected: 0,
                got: 2
            })
        );
    }
}
