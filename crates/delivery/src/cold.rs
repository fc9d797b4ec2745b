//! Cold data (seed 003: "not only hot data that streamed in, but cold data within the last
//! minute or the last day"): the records a core's store evicted from memory, kept on disk so
//! that a cursor behind the memory horizon is still answered, without a gap, for as long as
//! the disk keeps them.
//!
//! One [`ColdLog`] per core, in `state_dir/cold/core-N`, is a `bourse_journal::Journal` (the
//! project's one file store: CRC-framed, segmented, a torn tail repaired on open), written
//! without fsync: what it holds can be lost in a machine crash, and that is found and
//! handled as a gap (below), never served as one. Each journal entry is a *chunk* of at most
//! [`CHUNK_RECORDS_MAX`] records in position order.
//!
//! Why it never serves a gap: evicted records leave memory in position order (the store
//! evicts the oldest final records, and a record behind the horizon is a live order, which
//! moves forward when it changes), so the log holds every evicted record from its first
//! record on, as long as each eviction pass begins where the previous one ended. A pass that
//! begins past the log's end (appends lost in a crash, a failed write) discards the log and
//! starts it again at that pass. Records at or before the log's end are skipped, so a store
//! reloaded from an older state file evicts the same records again harmlessly.
//!
//! Retention: whole segments are dropped once their records are older than `retain_seconds`
//! (by the records' own times) or the log passes `bytes_max`; the first position kept moves
//! on, and older cursors are refused as too old, naming it.

use crate::record::{Filter, Pos, Record};
use bourse_core::codec::{Reader, Writer};
use bourse_journal::{ChainPoint, Config, Entry, Fsync, Journal};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Records in one journal entry at most, so that finding a position reads little.
pub const CHUNK_RECORDS_MAX: usize = 256;

/// A chunk is closed once its encoding passes this size (a record is far smaller than the
/// room left up to [`CHUNK_BYTES_MAX`]).
const CHUNK_BYTES_SOFT: usize = 32 << 10;

/// The journal's payload bound for a chunk.
const CHUNK_BYTES_MAX: u32 = 48 << 10;

/// The smallest segment: a chunk of the largest size fits with room to spare.
pub const SEGMENT_BYTES_MIN: u64 = 64 << 10;

/// Records a cold read examines at most (matching or not), so that one filtered poll stays
/// short while it holds the store's read lock; the answer then ends early and its cursor
/// continues where the scan stopped.
pub const COLD_SCAN_RECORDS_MAX: usize = 65_536;

const CHUNK_VERSION: u8 = 1;

/// The `[cold]` section of a delivery node's config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ColdConfig {
    /// Records older than this (by their own times, against the newest record) are dropped,
    /// a whole segment at a time. The default keeps a trading day.
    pub retain_seconds: u64,
    /// Disk bytes per core at most; past it the oldest segments are dropped.
    pub bytes_max: u64,
    /// The size of one segment file.
    pub segment_bytes: u64,
}

impl Default for ColdConfig {
    fn default() -> ColdConfig {
        ColdConfig {
            retain_seconds: 86_400,
            bytes_max: 8 << 30,
            segment_bytes: 16 << 20,
        }
    }
}

impl ColdConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.retain_seconds == 0 {
            return Err("cold.retain_seconds must be positive".into());
        }
        if !(SEGMENT_BYTES_MIN..=bourse_journal::SEGMENT_SIZE_BYTES_LIMIT)
            .contains(&self.segment_bytes)
        {
            return Err(format!(
                "cold.segment_bytes must be {SEGMENT_BYTES_MIN}..={}",
                bourse_journal::SEGMENT_SIZE_BYTES_LIMIT
            ));
        }
        if self.bytes_max < 2 * self.segment_bytes {
            return Err("cold.bytes_max must hold at least two segments".into());
        }
        Ok(())
    }
}

/// How a cold read ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColdEnd {
    /// Every record below the bound was examined.
    Done,
    /// `limit` matching records were found.
    Limit,
    /// The scan bound was reached; the read continues at this position.
    Scanned(Pos),
}

/// One journal entry: the position from which it (with the chunks after it) holds every
/// evicted record (the previous chunk's end; for a log's first chunk, the memory horizon
/// before its pass), and its records.
#[derive(Debug)]
struct Chunk {
    covers_from: Pos,
    records: Vec<Record>,
}

/// Counters of one core's cold log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ColdStats {
    /// The first position kept (`None`: the log is empty or out of service).
    pub first_index: Option<u64>,
    pub records_written: u64,
    pub chunks: u64,
    /// Times the log was discarded because a pass began past its end.
    pub restarts: u64,
    pub reads: u64,
    /// Why the log is out of service (a write or read failed), if it is.
    pub fault: Option<String>,
}

/// One core's records evicted from memory, on disk.
pub struct ColdLog {
    journal: Journal,
    core: u32,
    config: ColdConfig,
    /// The first position from which every evicted record is here (`None`: empty).
    start: Option<Pos>,
    /// The position after the last record here.
    end: Pos,
    newest_ts_ns: u64,
    payload_bytes: u64,
    stats: ColdStats,
    reads: std::sync::atomic::AtomicU64,
}

impl ColdLog {
    /// Opens (or creates) core `core`'s log in `dir`; a log of another deployment or core is
    /// refused, naming the directory.
    pub fn open(
        dir: &Path,
        deployment: u64,
        core: u32,
        config: &ColdConfig,
    ) -> Result<ColdLog, String> {
        config.validate()?;
        let mut jc = Config::new(
            u128::from(deployment) << 32 | u128::from(core),
            u64::from(core),
        );
        jc.fsync = Fsync::Never;
        jc.segment_size_bytes_max = config.segment_bytes;
        jc.payload_size_bytes_max = CHUNK_BYTES_MAX;
        let (journal, _report) = Journal::open(dir, jc).map_err(|e| {
            format!(
                "cold data of core {core} in {}: {e}; move the directory away to start it again",
                dir.display()
            )
        })?;
        let mut log = ColdLog {
            journal,
            core,
            config: config.clone(),
            start: None,
            end: Pos::START,
            newest_ts_ns: 0,
            payload_bytes: 0,
            stats: ColdStats::default(),
            reads: Default::default(),
        };
        if let (Some(first), Some(last)) = (log.journal.first_index(), log.journal.last_index()) {
            let first_chunk = log.chunk(first)?;
            let last_chunk = log.chunk(last)?;
            log.start = Some(first_chunk.covers_from);
            if let Some(r) = last_chunk.records.last() {
                log.end = r.pos().next();
                log.newest_ts_ns = r.ts_ns();
            }
            log.stats.chunks = last + 1 - first;
            // An estimate for the byte bound: the chunks present times the last one's size.
            log.payload_bytes = log.stats.chunks * (last_chunk.records.len() as u64 * 96);
        }
        Ok(log)
    }

    /// Whether a read from `from` is answered here.
    pub fn covers(&self, from: Pos) -> bool {
        self.stats.fault.is_none() && self.start.is_some_and(|s| s <= from)
    }

    /// The first position kept, if any.
    pub fn start(&self) -> Option<Pos> {
        self.start.filter(|_| self.stats.fault.is_none())
    }

    /// The position after the last record kept.
    pub fn end(&self) -> Pos {
        self.end
    }

    pub fn stats(&self) -> ColdStats {
        let mut s = self.stats.clone();
        s.first_index = self.start().map(|p| p.index);
        s.reads = self.reads.load(std::sync::atomic::Ordering::Relaxed);
        s
    }

    /// A store reloaded from its state file, whose horizon is `horizon`: the log must reach
    /// it, or records between its end and the horizon are missing (lost in a crash) and the
    /// log starts again.
    pub fn check_reaches(&mut self, horizon: Pos) {
        if self.start.is_some() && self.end < horizon {
            self.restart();
        }
    }

    /// One eviction pass: the memory horizon before it and the records it evicted, in
    /// position order.
    pub fn append_pass(&mut self, horizon_before: Pos, evicted: &[Record]) {
        if self.stats.fault.is_some() {
            return;
        }
        debug_assert!(evicted.windows(2).all(|w| w[0].pos() < w[1].pos()));
        let fresh = evicted.partition_point(|r| r.pos() < self.end);
        let evicted = &evicted[fresh..];
        if evicted.is_empty() {
            return;
        }
        if self.start.is_some() && horizon_before > self.end {
            // Something between the log's end and this pass was evicted without reaching
            // the log: reading across it would skip records.
            self.restart();
        }
        let mut rest = evicted;
        while !rest.is_empty() {
            let covers_from = if self.start.is_some() {
                self.end
            } else {
                horizon_before
            };
            let (payload, n) = encode_chunk(covers_from, rest);
            if let Err(e) = self.append_chunk(covers_from, &rest[..n], payload) {
                self.stats.fault = Some(e);
                return;
            }
            rest = &rest[n..];
        }
        self.retain();
    }

    fn append_chunk(
        &mut self,
        covers_from: Pos,
        records: &[Record],
        payload: Vec<u8>,
    ) -> Result<(), String> {
        let index = self.journal.next_index();
        let bytes = payload.len() as u64;
        self.journal
            .append(&[Entry {
                index,
                term: 1,
                payload,
            }])
            .map_err(|e| format!("cold data of core {}: {e}", self.core))?;
        if self.start.is_none() {
            self.start = Some(covers_from);
        }
        let last = records.last().expect("a chunk holds records");
        self.end = last.pos().next();
        self.newest_ts_ns = self.newest_ts_ns.max(last.ts_ns());
        self.payload_bytes += bytes;
        self.stats.chunks += 1;
        self.stats.records_written += records.len() as u64;
        Ok(())
    }

    /// Discards every record: the log starts again with the next pass.
    fn restart(&mut self) {
        let Some(last) = self.journal.last_index() else {
            return;
        };
        let point = ChainPoint {
            index: last,
            term: 1,
            hash: self.journal.last_hash(),
        };
        match self.journal.reset(point) {
            Ok(()) => {
                self.start = None;
                self.payload_bytes = 0;
                self.stats.chunks = 0;
                self.stats.restarts += 1;
            }
            Err(e) => self.stats.fault = Some(format!("cold data of core {}: {e}", self.core)),
        }
    }

    /// Drops the oldest segments past the age or byte bound.
    fn retain(&mut self) {
        let (Some(first), Some(last)) = (self.journal.first_index(), self.journal.last_index())
        else {
            return;
        };
        let chunks = last + 1 - first;
        let per_chunk = (self.payload_bytes / chunks.max(1)).max(1);
        let over_bytes = (chunks * per_chunk).saturating_sub(self.config.bytes_max) / per_chunk;
        let oldest_ns = self
            .newest_ts_ns
            .saturating_sub(self.config.retain_seconds.saturating_mul(1_000_000_000));
        // Chunks wholly older than the age bound: the first whose last record is recent.
        let aged = self.first_chunk_reaching(first, last, oldest_ns) - first;
        let drop = over_bytes.max(aged).min(chunks - 1);
        if drop == 0 {
            return;
        }
        if let Err(e) = self.journal.purge_upto(first + drop - 1) {
            self.stats.fault = Some(format!("cold data of core {}: {e}", self.core));
            return;
        }
        // The journal drops whole segments only; read back what is first now.
        if let Some(first) = self.journal.first_index() {
            match self.chunk(first) {
                Ok(c) => self.start = Some(c.covers_from),
                Err(e) => self.stats.fault = Some(e),
            }
            self.payload_bytes = per_chunk * (last + 1 - first);
            self.stats.chunks = last + 1 - first;
        }
    }

    /// The first chunk in `first..=last` whose last record is at or after `ts_ns` (`last`
    /// when none is), by binary search: times rise with the chunks.
    fn first_chunk_reaching(&self, first: u64, last: u64, ts_ns: u64) -> u64 {
        let (mut lo, mut hi) = (first, last);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.chunk_last_ts(mid) < ts_ns {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn chunk_last_ts(&self, index: u64) -> u64 {
        self.chunk(index)
            .ok()
            .and_then(|c| c.records.last().map(Record::ts_ns))
            .unwrap_or(0)
    }

    fn chunk(&self, index: u64) -> Result<Chunk, String> {
        let entry = self
            .journal
            .entry(index)
            .map_err(|e| format!("cold data of core {}: {e}", self.core))?;
        decode_chunk(self.core, &entry.payload)
            .map_err(|e| format!("cold data of core {}, chunk {index}: {e}", self.core))
    }

    /// The chunk holding `pos`, or the first after it: the last chunk whose first record is
    /// at or before `pos` (the first chunk when none is).
    fn chunk_of(&self, pos: Pos) -> Result<u64, String> {
        let (Some(first), Some(last)) = (self.journal.first_index(), self.journal.last_index())
        else {
            return Err("empty".into());
        };
        let (mut lo, mut hi) = (first, last);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            let c = self.chunk(mid)?;
            if c.records.first().is_some_and(|r| r.pos() <= pos) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Ok(lo)
    }

    /// Up to `limit` matching records at or after `from` and before `below`, appended to
    /// `out` in position order.
    pub fn read(
        &self,
        from: Pos,
        below: Pos,
        f: &Filter,
        limit: usize,
        out: &mut Vec<Record>,
    ) -> Result<ColdEnd, String> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(last) = self.journal.last_index() else {
            return Ok(ColdEnd::Done);
        };
        let start = out.len();
        let mut scanned = 0usize;
        let entries = self
            .journal
            .entries(self.chunk_of(from)?..=last)
            .map_err(|e| format!("cold data of core {}: {e}", self.core))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cold data of core {}: {e}", self.core))?;
            let chunk = decode_chunk(self.core, &entry.payload)?;
            for r in chunk.records.iter().filter(|r| r.pos() >= from) {
                if r.pos() >= below {
                    return Ok(ColdEnd::Done);
                }
                if scanned == COLD_SCAN_RECORDS_MAX {
                    return Ok(ColdEnd::Scanned(r.pos()));
                }
                scanned += 1;
                if r.matches(f) {
                    out.push(*r);
                    if out.len() - start == limit {
                        return Ok(ColdEnd::Limit);
                    }
                }
            }
        }
        Ok(ColdEnd::Done)
    }

    /// The first position whose record's time is at or after `since_ns` (`None` if every
    /// record kept is older). Times come from the gateways' clocks and rise with the log
    /// index up to their skew, so the search may land a few records early, never late by
    /// more than that skew.
    pub fn position_at(&self, since_ns: u64) -> Result<Option<Pos>, String> {
        let (Some(first), Some(last)) = (self.journal.first_index(), self.journal.last_index())
        else {
            return Ok(None);
        };
        if self.chunk_last_ts(last) < since_ns {
            return Ok(None);
        }
        let c = self.chunk(self.first_chunk_reaching(first, last, since_ns))?;
        Ok(c.records
            .iter()
            .find(|r| r.ts_ns() >= since_ns)
            .map(Record::pos))
    }

    /// The time of the oldest record kept.
    pub fn first_ts_ns(&self) -> Option<u64> {
        let first = self.journal.first_index()?;
        self.chunk(first).ok()?.records.first().map(Record::ts_ns)
    }
}

/// The first records of `records` that fit one chunk, encoded, and how many they are.
fn encode_chunk(covers_from: Pos, records: &[Record]) -> (Vec<u8>, usize) {
    let mut body = Writer::with_capacity(CHUNK_BYTES_SOFT + 1024);
    let mut n = 0;
    for r in records.iter().take(CHUNK_RECORDS_MAX) {
        crate::store::encode_record(&mut body, r);
        n += 1;
        if body.buf.len() >= CHUNK_BYTES_SOFT {
            break;
        }
    }
    let mut w = Writer::with_capacity(body.buf.len() + 8);
    w.u8(CHUNK_VERSION);
    w.u64(covers_from.index);
    w.u32(covers_from.ord);
    w.u64(n as u64);
    w.buf.extend_from_slice(&body.buf);
    (w.finish(), n)
}

fn decode_chunk(core: u32, payload: &[u8]) -> Result<Chunk, String> {
    let mut r = Reader::new(payload);
    let e = |e: bourse_core::codec::DecodeError| e.to_string();
    if r.u8().map_err(e)? != CHUNK_VERSION {
        return Err("unknown chunk version".into());
    }
    let covers_from = Pos {
        index: r.u64().map_err(e)?,
        ord: r.u32().map_err(e)?,
    };
    let n = r.count(30).map_err(e)?;
    if n == 0 || n > CHUNK_RECORDS_MAX {
        return Err(format!("a chunk of {n} records"));
    }
    let mut records = Vec::with_capacity(n);
    for _ in 0..n {
        records.push(crate::store::decode_record(&mut r, core)?);
    }
    r.expect_end().map_err(e)?;
    if !records.windows(2).all(|w| w[0].pos() < w[1].pos()) || covers_from > records[0].pos() {
        return Err("records out of position order".into());
    }
    Ok(Chunk {
        covers_from,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::{
        AccountId, ClOrdId, Event, Fill, FirmId, InstrumentId, OrderId, Price, Qty, Side, TradeId,
    };

    const SECOND_NS: u64 = 1_000_000_000;

    /// A trade at log index `index`, `seconds` into the day.
    fn trade(index: u64, seconds: u64) -> Record {
        let fill = |a| Fill {
            order_id: OrderId(index),
            account: AccountId(a),
            cl_ord_id: ClOrdId(1),
            qty_leaves: Qty(0),
            qty_filled: Qty(1),
        };
        Record {
            core: 0,
            index,
            ord: 0,
            firms: [Some(FirmId(1)), Some(FirmId(2))],
            event: Event::Trade {
                trade_id: TradeId(index),
                instrument: InstrumentId(3),
                price: Price(100),
                qty: Qty(1),
                aggressor: Side::Buy,
                buy: fill(1),
                sell: fill(2),
                auction: false,
                ts_ns: seconds * SECOND_NS,
            },
        }
    }

    fn small(retain_seconds: u64) -> ColdConfig {
        ColdConfig {
            retain_seconds,
            bytes_max: 1 << 30,
            segment_bytes: 64 << 10,
        }
    }

    fn read_all(log: &ColdLog, from: Pos) -> Vec<Record> {
        let mut out = Vec::new();
        let end = log
            .read(
                from,
                Pos::entry_start(u64::MAX),
                &Filter::default(),
                usize::MAX,
                &mut out,
            )
            .unwrap();
        assert_eq!(end, ColdEnd::Done);
        out
    }

    #[test]
    fn records_older_than_the_retention_are_dropped_a_segment_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ColdLog::open(dir.path(), 1, 0, &small(600)).unwrap();
        // An hour of trades, one a second, in passes of 60.
        let all: Vec<Record> = (0..3_600).map(|i| trade(i, i)).collect();
        for (n, pass) in all.chunks(60).enumerate() {
            let before = if n == 0 { Pos::START } else { log.end() };
            log.append_pass(before, pass);
        }
        let first = log.start().unwrap();
        let kept = read_all(&log, first);
        // The last ten minutes are all there, and not much more (a segment's worth).
        assert!(kept.first().unwrap().ts_ns() <= (3_599 - 600) * SECOND_NS);
        assert!(kept.len() < 1_500, "{} kept", kept.len());
        assert_eq!(kept[..], all[all.len() - kept.len()..]);
        assert!(!log.covers(Pos::START));
        assert_eq!(log.stats().restarts, 0);
        // A time inside what is kept is found; one before it is not there.
        let at = log.position_at(3_000 * SECOND_NS).unwrap().unwrap();
        assert_eq!(at, Pos::entry_start(3_000));
        // Reopened, the log holds the same.
        drop(log);
        let log = ColdLog::open(dir.path(), 1, 0, &small(600)).unwrap();
        assert_eq!(log.start(), Some(first));
        assert_eq!(read_all(&log, first), kept);
        // Another deployment's log is refused.
        assert!(ColdLog::open(dir.path(), 2, 0, &small(600))
            .err()
            .unwrap()
            .contains("move the directory away"));
    }

    #[test]
    fn a_pass_that_begins_past_the_end_starts_the_log_again_and_repeats_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ColdLog::open(dir.path(), 1, 0, &small(86_400)).unwrap();
        let all: Vec<Record> = (0..100).map(|i| trade(i, i)).collect();
        log.append_pass(Pos::START, &all[..50]);
        // The same records again (a store reloaded from an older state) change nothing.
        log.append_pass(Pos::START, &all[..60]);
        assert_eq!(read_all(&log, Pos::START), all[..60]);
        // Records 60..70 never reached the log: the next pass begins past its end.
        log.append_pass(Pos::entry_start(70), &all[70..]);
        assert_eq!(log.stats().restarts, 1);
        assert!(!log.covers(Pos::START));
        assert_eq!(log.start(), Some(Pos::entry_start(70)));
        assert_eq!(read_all(&log, Pos::entry_start(70)), all[70..]);
    }

    #[test]
    fn a_damaged_chunk_is_refused_naming_it() {
        let r = trade(5, 5);
        let (good, n) = encode_chunk(Pos::START, &[r]);
        assert_eq!(n, 1);
        assert_eq!(decode_chunk(0, &good).unwrap().records, vec![r]);
        for cut in 0..good.len() {
            assert!(decode_chunk(0, &good[..cut]).is_err());
        }
        let mut bad = good.clone();
        bad[0] = 9;
        assert!(decode_chunk(0, &bad).unwrap_err().contains("version"));
    }
}
