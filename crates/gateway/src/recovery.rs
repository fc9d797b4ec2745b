//! What lets a gateway restart without forgetting its orders or confusing its requests.
//!
//! Two files in the gateway's `store_dir`, beside the FIX session stores:
//!
//! - `orders.state`: the router's durable state ([`RouterState`]: live and recently finished
//!   orders, the next internal order id, and each core's stream position the state is exact
//!   at), written atomically (temporary file, fsync, rename) when the gateway stops after
//!   draining its requests in flight. A restarted gateway whose links resume each core's
//!   committed stream at the saved position ([`Recovery::resume_index`]; a
//!   `bourse_cluster::link::ClusterLink` started with it as its `from_index`) loads it: status
//!   requests get the true answer for open and finished orders, and what the cores did while
//!   the gateway was away (the resting side of trades sent through another gateway) is
//!   reported to the owners once. The file is consumed at load (renamed to
//!   `orders.state.loaded`): after a crash there is no state newer than the last load, and a
//!   stale one is never replayed twice, which could report the same fill twice. A crash thus
//!   loses the order table (status answers "unknown" for orders of the previous run) but
//!   never doubles a report.
//! - `link-epoch`: a number raised durably at every start. The client id a cluster link
//!   uses at its core ([`Recovery::link_client_id`]) is the configured id with the epoch in
//!   its upper 32 bits, so requests a previous run left in flight (crash, or a stop whose
//!   drain timed out) can never share an idempotency key `(client_id, request_seq)` with this
//!   run's: the core applies each under its own id and this run's numbering starts at 1
//!   under a fresh one. (The core allows no gap in a client's sequence, so reserving seqs in
//!   blocks is not an option; and the last seq the leader applied says nothing about
//!   requests still in its pipeline.) The cost is one idempotency-table entry per restart at
//!   the core.
//!
//! The state file: `BGWS`, version u32, body length u64, body, FNV-1a 64 of the body; every
//! number little-endian; lengths and counts are checked against limits before anything is
//! allocated, so a damaged file is refused with a reason, never trusted. Version 2 adds, after
//! the orders, the instruments learned from the cores' streams ([`SavedInstrument`]: a link
//! resumed after an `InstrumentAdded` never sees it again): a count, then per instrument its
//! core (u32) and its `InstrumentAdded` event as a one-event list in the core's event codec
//! (`bourse_core::codec`), length u16 first. Version 1 files are still read (no instruments).

use crate::config::GatewayConfig;
use crate::router::{ClientId, Finished, RouterState, SavedInstrument, SavedOrder};
use bourse_core::codec::{decode_events, encode_events};
use bourse_core::{
    AccountId, ClOrdId, Event, InstrumentId, OrdType, OrderId, Price, Side, TimeInForce,
};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

pub const STATE_FILE: &str = "orders.state";
pub const STATE_FILE_LOADED: &str = "orders.state.loaded";
pub const EPOCH_FILE: &str = "link-epoch";

const MAGIC: &[u8; 4] = b"BGWS";
const VERSION: u32 = 2;
/// The first version, without learned instruments: still read.
const VERSION_WITHOUT_INSTRUMENTS: u32 = 1;
/// Learned instruments in one state file at most.
const INSTRUMENTS_MAX: u32 = 1 << 20;
/// The longest encoded `InstrumentAdded` event list a state may hold.
const INSTRUMENT_EVENT_BYTES_MAX: usize = 1_024;
/// A state file may not exceed this (about 2.5 million orders); more is damage.
pub const STATE_FILE_BYTES_MAX: u64 = 512 << 20;
/// Orders in one state file at most (live plus finished).
const ORDERS_MAX: u32 = 4_000_000;
const POSITIONS_MAX: u32 = 64;
const TEXT_BYTES_MAX: usize = 256;

/// The largest restart epoch: a link's id (`epoch << 32 | configured`) then stays below
/// `1 << 61`, under the ids the venue's setup (`1 << 61` on) and the bulk clients (the
/// admin's and clearing's, `1 << 62` on: `bourse_cluster::admission::BULK_CLIENT_ID_MIN`) use.
pub const LINK_EPOCH_MAX: u32 = (1 << 29) - 1;

/// The client id a link uses at its core in `epoch`: see the module documentation.
pub fn link_client_id(configured: u64, epoch: u32) -> u64 {
    assert!(epoch <= LINK_EPOCH_MAX, "link epoch {epoch} out of range");
    (u64::from(epoch) << 32) | (configured & 0xffff_ffff)
}

/// Raises the epoch kept in `dir` durably and returns the new one (1 the first time).
pub fn next_link_epoch(dir: &Path) -> io::Result<u32> {
    fs::create_dir_all(dir)?;
    let path = dir.join(EPOCH_FILE);
    let previous = match fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u32>().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not an epoch number: {text:?}", path.display()),
            )
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    let next = previous
        .checked_add(1)
        .filter(|&n| n <= LINK_EPOCH_MAX)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: link epoch exhausted ({LINK_EPOCH_MAX} starts); give the gateway a \
                     new state directory",
                    path.display()
                ),
            )
        })?;
    write_atomically(dir, EPOCH_FILE, format!("{next}\n").as_bytes())?;
    Ok(next)
}

fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    // The rename is durable once the directory is.
    File::open(dir)?.sync_all()
}

/// Writes `state` to `dir/orders.state` atomically.
pub fn save_state(dir: &Path, state: &RouterState) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    write_atomically(dir, STATE_FILE, &encode_state(state))
}

/// Reads `dir/orders.state` without consuming it. `Ok(None)`: there is none.
pub fn read_state(dir: &Path) -> Result<Option<RouterState>, String> {
    let path = dir.join(STATE_FILE);
    let mut f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let len = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if len > STATE_FILE_BYTES_MAX {
        return Err(format!(
            "{}: {len} bytes, more than the {STATE_FILE_BYTES_MAX} a state may have",
            path.display()
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    decode_state(&bytes)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Marks the state in `dir` as loaded (renames it), so that it is never loaded twice.
pub fn consume_state(dir: &Path) -> io::Result<()> {
    fs::rename(dir.join(STATE_FILE), dir.join(STATE_FILE_LOADED))?;
    File::open(dir)?.sync_all()
}

/// What a starting gateway learned from its `store_dir`: this run's link epoch and the saved
/// order state, if any. Start the cluster links with [`Recovery::link_client_id`] and
/// [`Recovery::resume_index`] so that they resume where the state is exact; `spawn_cores`
/// then loads the state.
#[derive(Debug)]
pub struct Recovery {
    pub dir: PathBuf,
    pub epoch: u32,
    pub state: Option<RouterState>,
}

impl Recovery {
    /// Raises the link epoch and reads the saved state (a damaged state is an error: the
    /// operator decides, by moving the file away, to start without it).
    pub fn open(config: &GatewayConfig) -> Result<Recovery, String> {
        let dir = config.gateway.store_dir.clone();
        let epoch =
            next_link_epoch(&dir).map_err(|e| format!("link epoch in {}: {e}", dir.display()))?;
        let state = read_state(&dir)?;
        Ok(Recovery { dir, epoch, state })
    }

    /// The client id a link to a replicated core uses at its core in this run: the
    /// configured id with this run's epoch (see the module documentation).
    pub fn link_client_id(&self, configured_client_id: u64) -> u64 {
        link_client_id(configured_client_id, self.epoch)
    }

    /// Where the link to core number `core` (in [`GatewayConfig::core_plan`] order) resumes
    /// the core's committed stream: the index after the position the saved state is exact
    /// at, if the state has one for this core; none: the link starts where it likes.
    pub fn resume_index(&self, core: usize) -> Option<u64> {
        self.state
            .as_ref()
            .and_then(|s| s.positions.get(core).copied().flatten())
            .map(|p| p + 1)
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn side_code(s: Side) -> u8 {
    match s {
        Side::Buy => 1,
        Side::Sell => 2,
    }
}
fn ord_type_code(t: OrdType) -> u8 {
    match t {
        OrdType::Limit => 1,
        OrdType::Market => 2,
    }
}
fn tif_code(t: TimeInForce) -> u8 {
    match t {
        TimeInForce::Day => 1,
        TimeInForce::Gtc => 2,
        TimeInForce::Gtd => 3,
        TimeInForce::Ioc => 4,
        TimeInForce::Fok => 5,
        TimeInForce::AtOpening => 6,
        TimeInForce::AtClose => 7,
        TimeInForce::GoodForAuction => 8,
    }
}
fn finished_code(f: Option<Finished>) -> u8 {
    match f {
        None => 0,
        Some(Finished::Filled) => 1,
        Some(Finished::Canceled) => 2,
        Some(Finished::Expired) => 3,
    }
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    let bytes = &text.as_bytes()[..text.len().min(TEXT_BYTES_MAX)];
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_order(out: &mut Vec<u8>, o: &SavedOrder) {
    put_text(out, &o.session);
    out.extend_from_slice(&o.order_id.0.to_le_bytes());
    match &o.client {
        ClientId::Text(t) => {
            out.push(0);
            put_text(out, t);
        }
        ClientId::Num(n) => {
            out.push(1);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
    out.extend_from_slice(&o.internal.0.to_le_bytes());
    out.extend_from_slice(&o.core.to_le_bytes());
    out.extend_from_slice(&o.account.0.to_le_bytes());
    out.extend_from_slice(&o.instrument.0.to_le_bytes());
    out.push(side_code(o.side));
    out.push(ord_type_code(o.ord_type));
    out.push(tif_code(o.tif));
    out.extend_from_slice(&o.price.0.to_le_bytes());
    out.extend_from_slice(&o.qty_lots.to_le_bytes());
    out.extend_from_slice(&o.cum_lots.to_le_bytes());
    out.extend_from_slice(&o.notional.to_le_bytes());
    out.push(finished_code(o.finished));
}

/// The state file's bytes.
pub fn encode_state(state: &RouterState) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + 96 * (state.live.len() + state.finished.len()));
    body.extend_from_slice(&state.next_internal.to_le_bytes());
    body.extend_from_slice(&(state.positions.len() as u32).to_le_bytes());
    for p in &state.positions {
        body.push(u8::from(p.is_some()));
        body.extend_from_slice(&p.unwrap_or(0).to_le_bytes());
    }
    for list in [&state.live, &state.finished] {
        body.extend_from_slice(&(list.len() as u32).to_le_bytes());
        for o in list {
            put_order(&mut body, o);
        }
    }
    body.extend_from_slice(&(state.instruments.len() as u32).to_le_bytes());
    for i in &state.instruments {
        body.extend_from_slice(&i.core.to_le_bytes());
        let event = encode_events(&[Event::InstrumentAdded {
            instrument: i.instrument,
            definition: i.definition,
            ts_ns: 0,
        }]);
        body.extend_from_slice(&(event.len() as u16).to_le_bytes());
        body.extend_from_slice(&event);
    }
    let mut out = Vec::with_capacity(body.len() + 24);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&fnv1a64(&body).to_le_bytes());
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.bytes.len() - self.pos < n {
            return Err(format!("truncated at byte {} reading {what}", self.pos));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, String> {
        let mut b = [0; 2];
        b.copy_from_slice(self.take(2, what)?);
        Ok(u16::from_le_bytes(b))
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(b))
    }
    fn i64(&mut self, what: &str) -> Result<i64, String> {
        Ok(self.u64(what)? as i64)
    }
    fn i128(&mut self, what: &str) -> Result<i128, String> {
        let mut b = [0; 16];
        b.copy_from_slice(self.take(16, what)?);
        Ok(i128::from_le_bytes(b))
    }
    fn text(&mut self, what: &str) -> Result<String, String> {
        let n = self.u16(what)? as usize;
        if n > TEXT_BYTES_MAX {
            return Err(format!("{what}: {n} bytes, more than {TEXT_BYTES_MAX}"));
        }
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what}: not UTF-8"))
    }
    fn count(&mut self, what: &str, max: u32) -> Result<usize, String> {
        let n = self.u32(what)?;
        if n > max {
            return Err(format!("{what}: {n}, more than {max}"));
        }
        Ok(n as usize)
    }
}

fn get_order(r: &mut Reader<'_>) -> Result<SavedOrder, String> {
    let session = r.text("session name")?;
    let order_id = OrderId(r.u64("order id")?);
    let client = match r.u8("client id kind")? {
        0 => ClientId::Text(r.text("client order id")?.into_boxed_str()),
        1 => ClientId::Num(r.u64("client order id")?),
        k => return Err(format!("order {}: client id kind {k}", order_id.0)),
    };
    let internal = ClOrdId(r.u64("internal id")?);
    let core = r.u32("core")?;
    let account = AccountId(r.u32("account")?);
    let instrument = InstrumentId(r.u32("instrument")?);
    let side = match r.u8("side")? {
        1 => Side::Buy,
        2 => Side::Sell,
        k => return Err(format!("order {}: side {k}", order_id.0)),
    };
    let ord_type = match r.u8("order type")? {
        1 => OrdType::Limit,
        2 => OrdType::Market,
        k => return Err(format!("order {}: order type {k}", order_id.0)),
    };
    let tif = match r.u8("time in force")? {
        1 => TimeInForce::Day,
        2 => TimeInForce::Gtc,
        3 => TimeInForce::Gtd,
        4 => TimeInForce::Ioc,
        5 => TimeInForce::Fok,
        6 => TimeInForce::AtOpening,
        7 => TimeInForce::AtClose,
        8 => TimeInForce::GoodForAuction,
        k => return Err(format!("order {}: time in force {k}", order_id.0)),
    };
    let price = Price(r.i64("price")?);
    let qty_lots = r.i64("quantity")?;
    let cum_lots = r.i64("filled quantity")?;
    let notional = r.i128("notional")?;
    let finished = match r.u8("finished")? {
        0 => None,
        1 => Some(Finished::Filled),
        2 => Some(Finished::Canceled),
        3 => Some(Finished::Expired),
        k => return Err(format!("order {}: finished code {k}", order_id.0)),
    };
    if qty_lots <= 0 || cum_lots < 0 || cum_lots > qty_lots {
        return Err(format!(
            "order {}: quantity {qty_lots} with {cum_lots} filled",
            order_id.0
        ));
    }
    Ok(SavedOrder {
        session,
        order_id,
        client,
        internal,
        core,
        account,
        instrument,
        side,
        ord_type,
        tif,
        price,
        qty_lots,
        cum_lots,
        notional,
        finished,
    })
}

/// Decodes a state file's bytes; any damage is an error that says where.
pub fn decode_state(bytes: &[u8]) -> Result<RouterState, String> {
    let mut r = Reader { bytes, pos: 0 };
    if r.take(4, "magic")? != MAGIC {
        return Err("not a gateway order state (bad magic)".into());
    }
    let version = r.u32("version")?;
    if version != VERSION && version != VERSION_WITHOUT_INSTRUMENTS {
        return Err(format!(
            "state version {version}, this gateway reads {VERSION}"
        ));
    }
    let body_len = r.u64("body length")?;
    if body_len > STATE_FILE_BYTES_MAX || body_len as usize + 8 != bytes.len() - r.pos {
        return Err(format!(
            "body length {body_len} does not match the file's {} bytes",
            bytes.len()
        ));
    }
    let body = &bytes[r.pos..r.pos + body_len as usize];
    let mut sum = [0; 8];
    sum.copy_from_slice(&bytes[r.pos + body_len as usize..]);
    if u64::from_le_bytes(sum) != fnv1a64(body) {
        return Err("checksum mismatch: the state is damaged".into());
    }
    let mut r = Reader {
        bytes: body,
        pos: 0,
    };
    let next_internal = r.u64("next internal id")?;
    let n = r.count("positions", POSITIONS_MAX)?;
    let mut positions = Vec::with_capacity(n);
    for _ in 0..n {
        let present = r.u8("position flag")?;
        let p = r.u64("position")?;
        positions.push(match present {
            0 => None,
            1 => Some(p),
            k => return Err(format!("position flag {k}")),
        });
    }
    let mut lists = [Vec::new(), Vec::new()];
    for (i, list) in lists.iter_mut().enumerate() {
        let n = r.count(
            if i == 0 {
                "live orders"
            } else {
                "finished orders"
            },
            ORDERS_MAX,
        )?;
        // Each order takes at least 70 bytes: never reserve more than the body could hold.
        list.reserve(n.min(body.len() / 70));
        for _ in 0..n {
            let o = get_order(&mut r)?;
            if (i == 0) != o.finished.is_none() {
                return Err(format!("order {} in the wrong list", o.order_id.0));
            }
            list.push(o);
        }
    }
    let instruments = if version == VERSION_WITHOUT_INSTRUMENTS {
        Vec::new()
    } else {
        get_instruments(&mut r)?
    };
    if r.pos != body.len() {
        return Err(format!(
            "{} bytes after the last {}",
            body.len() - r.pos,
            if version == VERSION_WITHOUT_INSTRUMENTS {
                "order"
            } else {
                "instrument"
            }
        ));
    }
    let [live, finished] = lists;
    Ok(RouterState {
        next_internal,
        positions,
        live,
        finished,
        instruments,
    })
}

/// The learned instruments of a version 2 state (see the module documentation).
fn get_instruments(r: &mut Reader<'_>) -> Result<Vec<SavedInstrument>, String> {
    let n = r.count("learned instruments", INSTRUMENTS_MAX)?;
    // Each takes at least 6 bytes: never reserve more than the body could hold.
    let mut out = Vec::with_capacity(n.min(r.bytes.len() / 6));
    for k in 0..n {
        let core = r.u32("instrument core")?;
        let len = r.u16("instrument event length")? as usize;
        if len > INSTRUMENT_EVENT_BYTES_MAX {
            return Err(format!(
                "learned instrument {k}: event of {len} bytes, more than {INSTRUMENT_EVENT_BYTES_MAX}"
            ));
        }
        let bytes = r.take(len, "instrument event")?;
        let events = decode_events(bytes).map_err(|e| {
            format!(
                "learned instrument {k}: {} at byte {} of its event",
                e.what, e.offset
            )
        })?;
        match events.as_slice() {
            [Event::InstrumentAdded {
                instrument,
                definition,
                ..
            }] => out.push(SavedInstrument {
                core,
                instrument: *instrument,
                definition: *definition,
            }),
            _ => {
                return Err(format!(
                    "learned instrument {k}: not one instrument_added event"
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(n: u64, finished: Option<Finished>) -> SavedOrder {
        SavedOrder {
            session: "FIX ALPHA".into(),
            order_id: OrderId(n),
            client: if n.is_multiple_of(2) {
                ClientId::Text(format!("c-{n}").into_boxed_str())
            } else {
                ClientId::Num(n * 7)
            },
            internal: ClOrdId(n + 100),
            core: (n % 3) as u32,
            account: AccountId(101),
            instrument: InstrumentId(1),
            side: if n.is_multiple_of(2) {
                Side::Buy
            } else {
                Side::Sell
            },
            ord_type: OrdType::Limit,
            tif: TimeInForce::Gtc,
            price: Price(10_000 + n as i64),
            qty_lots: 10,
            cum_lots: (n % 10) as i64,
            notional: -12345678901234567890i128,
            finished,
        }
    }

    fn sample() -> RouterState {
        RouterState {
            next_internal: 77,
            positions: vec![Some(5), None, Some(0)],
            live: (1..20).map(|n| order(n, None)).collect(),
            finished: (20..30)
                .map(|n| {
                    order(
                        n,
                        Some([Finished::Filled, Finished::Canceled][n as usize % 2]),
                    )
                })
                .collect(),
            instruments: vec![learned(3, 0, "RTS"), learned(9, 2, "SILVER-12.26")],
        }
    }

    fn learned(id: u32, core: u32, symbol: &str) -> SavedInstrument {
        SavedInstrument {
            core,
            instrument: InstrumentId(id),
            definition: bourse_core::InstrumentDef {
                symbol: bourse_core::Symbol::new(symbol).unwrap(),
                market: bourse_core::Market::Futures,
                price_scale: 0,
                tick: Price(10),
                lot_size: 1,
                multiplier: 1,
                initial_margin: bourse_core::Cash(5_000),
                band_bps: 1_000,
                reference_price: Price(110_000),
                volatility: Default::default(),
            },
        }
    }

    #[test]
    fn a_version_1_state_is_read_without_instruments() {
        let mut s = sample();
        s.instruments.clear();
        let mut bytes = encode_state(&s);
        // Version 1 is version 2 without the instrument count at the body's end.
        bytes[4..8].copy_from_slice(&VERSION_WITHOUT_INSTRUMENTS.to_le_bytes());
        let body_len = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) - 4;
        bytes[8..16].copy_from_slice(&body_len.to_le_bytes());
        let body_end = 16 + body_len as usize;
        bytes.truncate(body_end);
        let sum = fnv1a64(&bytes[16..body_end]);
        bytes.extend_from_slice(&sum.to_le_bytes());
        assert_eq!(decode_state(&bytes).unwrap(), s);
    }

    #[test]
    fn a_state_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_state(dir.path()).unwrap(), None);
        let s = sample();
        save_state(dir.path(), &s).unwrap();
        assert_eq!(read_state(dir.path()).unwrap(), Some(s));
        consume_state(dir.path()).unwrap();
        assert_eq!(read_state(dir.path()).unwrap(), None, "a state loads once");
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused_with_a_reason() {
        let bytes = encode_state(&sample());
        for cut in 0..bytes.len() {
            assert!(decode_state(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x5a;
            let e = decode_state(&b).expect_err("flipped byte accepted");
            assert!(!e.is_empty());
        }
    }

    #[test]
    fn the_epoch_rises_durably_and_names_a_fresh_client_id() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(next_link_epoch(dir.path()).unwrap(), 1);
        assert_eq!(next_link_epoch(dir.path()).unwrap(), 2);
        assert_ne!(link_client_id(7, 1), link_client_id(7, 2));
        assert_eq!(link_client_id(7, 2) & 0xffff_ffff, 7);
        fs::write(dir.path().join(EPOCH_FILE), "garbage").unwrap();
        assert!(next_link_epoch(dir.path()).is_err());
    }
}
