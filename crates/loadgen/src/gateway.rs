//! The gateway target: a generator worker's sessions on the access servers (binary SBE or
//! FIX 4.4, through the client SDK), open loop over loopback TCP.
//!
//! The generator speaks core commands and learns from core events; a gateway speaks order
//! entry messages and answers with execution reports. This module translates both ways:
//! each command becomes one request on the session that may trade its account (its client
//! order id is the generator's tag, unique per worker), and each report becomes the events a
//! client can know from it. The first report that answers a request (an acknowledgement, a
//! reject, a cancel or replace confirmation, a mass-cancel report, a business reject) is the
//! request's [`Answer`]: its arrival is what the latency measures. Later reports about the
//! worker's orders (fills, the cancelled remainder of an IOC, orders a mass cancel removed)
//! are notifications.
//!
//! What a report does not carry is not invented: the target keeps its own table of its live
//! orders (from acknowledgements, fills and cancels) and writes the order-log records a
//! client can derive from it (an order entered the book at its acknowledgement, changed at
//! its replace, left it at its last fill or its cancel), so that the flows know which orders
//! they may cancel and the report can account for every acknowledged order. Each trade is
//! counted once: on the aggressor's report (binary) or on the buy side's report (FIX, which
//! does not say who was the aggressor). Reject reasons are not carried back (the generator
//! only counts rejects).
//!
//! The sessions belong to the target's I/O thread: `submit` only queues the command (a full
//! queue, [`SUBMIT_QUEUE_MAX`], is `Full`), so a gateway that reads slowly delays that
//! thread's writes and never the generator's schedule or its taking of answers; the I/O
//! thread stamps each report as it reads it. A mass cancel has the same scope on both
//! protocols: the named account's orders in the named instrument (FIX carries the account in
//! Account (1)).
//!
//! Limits: a worker holds at most [`SESSIONS_PER_WORKER_MAX`] sessions; orders that have
//! left are remembered ([`GONE_ORDERS_KEPT`]) so that a late cancel of one still names it.

use crate::target::{Answer, SubmitError, Target, NOTIFY_TAG};
use bourse_client::binary::BinTif;
use bourse_client::{BinaryClient, FixClient, FixClientConfig, Response};
use bourse_core::*;
use bourse_fix::OutMessage;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sessions one generator worker may hold open.
pub const SESSIONS_PER_WORKER_MAX: usize = 1_000;
/// Orders that have left the book, remembered for late cancels and replaces that name them.
pub const GONE_ORDERS_KEPT: usize = 1 << 16;
/// Accounts one gateway session may trade (the gateway's own ceiling).
pub const ACCOUNTS_PER_SESSION_MAX: usize = 255;
/// How long connecting and logging on may take, per session.
pub const LOGON_TIMEOUT_MS: u64 = 5_000;
/// Reports read from one session in one turn of `poll` before the next session is read.
const READS_PER_SESSION_MAX: usize = 4_096;
/// BusinessRejectReason codes of the binary protocol that mean the request was refused
/// unprocessed and may be sent again (docs/protocol-binary-order-entry.md): Throttled,
/// SystemUnavailable, and CoreNoQuorum (since schema version 4: the trading core's replica
/// group has no quorum).
const BIN_REASON_THROTTLED: u8 = 1;
const BIN_REASON_SYSTEM_UNAVAILABLE: u8 = 4;
const BIN_REASON_CORE_NO_QUORUM: u8 = 7;
/// MassCancelResult codes that mean the mass cancel was refused unprocessed (since schema
/// version 5): CoreNoQuorum and SystemUnavailable.
const BIN_MASS_CORE_NO_QUORUM: u8 = 6;
const BIN_MASS_SYSTEM_UNAVAILABLE: u8 = 7;

/// The order entry protocol of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionProtocol {
    Binary,
    Fix,
}

/// One session a worker opens: where, as whom, and what it may trade.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionPlan {
    pub addr: SocketAddr,
    pub protocol: SessionProtocol,
    /// Binary: the credentials of Establish. FIX: our SenderCompID.
    pub name: String,
    /// FIX: the gateway's CompID.
    pub gateway_comp_id: String,
    /// The markets (indexes into the profile's markets) this session's gateway routes.
    pub markets: Vec<usize>,
    /// The accounts the session may trade, at most [`ACCOUNTS_PER_SESSION_MAX`].
    pub accounts: Vec<u32>,
}

/// Everything a worker needs to reach the gateways (also handed to worker processes).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerPlan {
    pub sessions: Vec<SessionPlan>,
    /// Every instrument of every market, as the gateways know them.
    pub instruments: Vec<Vec<Instrument>>,
}

/// The request a pending client order id stands for.
#[derive(Clone, Copy, Debug)]
enum Request {
    New {
        account: AccountId,
        instrument: InstrumentId,
        side: Side,
        price: Price,
        qty_lots: i64,
    },
    Cancel,
    Replace {
        order_id: OrderId,
        price: Price,
        qty_lots: i64,
    },
    MassCancel,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    tag: u64,
    market: u16,
    request: Request,
}

/// One of the worker's orders, as its reports describe it.
#[derive(Clone, Copy, Debug)]
struct OrderInfo {
    /// The client order id that names the order now (a replace gives it a new one).
    cl: u64,
    account: AccountId,
    instrument: InstrumentId,
    side: Side,
    price: Price,
    qty_lots: i64,
    leaves_lots: i64,
    market: u16,
    session: u32,
    live: bool,
}

/// A report, whichever protocol carried it.
#[derive(Clone, Copy, Debug)]
enum Rep {
    NewAck {
        cl: u64,
        order_id: u64,
        leaves_units: i64,
    },
    NewReject {
        cl: u64,
    },
    Fill {
        order_id: u64,
        trade_id: u64,
        px: i64,
        qty_units: i64,
        leaves_units: i64,
        /// The report that counts the trade (aggressor, or buy side on FIX).
        counts_trade: bool,
    },
    Cancelled {
        by: Option<u64>,
        order_id: u64,
        requested: bool,
    },
    CancelReject {
        cl: u64,
    },
    Replaced {
        cl: u64,
        order_id: u64,
        leaves_units: i64,
    },
    ReplaceReject {
        cl: u64,
    },
    MassDone {
        cl: u64,
        count: u64,
        ok: bool,
    },
    BusinessReject {
        cl: Option<u64>,
    },
    /// The gateway refused the request for overload or for its core's lost quorum, not
    /// processing it: binary BusinessReject(SystemUnavailable, Throttled or CoreNoQuorum), FIX
    /// reject text "system busy", "throttle" or "trading core has no quorum".
    Busy {
        cl: u64,
    },
    Closed,
    Ignore,
}

enum Conn {
    Binary(Box<BinaryClient>),
    Fix(Box<FixClient>),
}

/// One worker's sessions on the gateways, driven by the target's I/O thread.
struct Sessions {
    sessions: Vec<Conn>,
    /// (market, account) to the session that may trade it.
    route: FxHashMap<(u16, u32), u32>,
    instruments: FxHashMap<InstrumentId, Instrument>,
    first_instrument: Vec<InstrumentId>,
    pending: FxHashMap<u64, Pending>,
    orders: FxHashMap<OrderId, OrderInfo>,
    gone: VecDeque<OrderId>,
    /// Notifications per market, gathered while reading.
    notify: Vec<Vec<Event>>,
}

fn lots(units: i64, lot: i64) -> i64 {
    if lot > 0 {
        units / lot
    } else {
        units
    }
}

/// `raw` in units of 10^-scale as decimal text.
fn decimal(raw: i64, scale: u8) -> String {
    if scale == 0 {
        return raw.to_string();
    }
    let p = 10i64.pow(scale as u32);
    let sign = if raw < 0 { "-" } else { "" };
    let a = raw.unsigned_abs();
    format!(
        "{sign}{}.{:0width$}",
        a / p as u64,
        a % p as u64,
        width = scale as usize
    )
}

fn order_log(action: OrderLogAction, id: OrderId, o: &OrderInfo) -> Event {
    Event::OrderLog(OrderLog {
        rec: 0,
        seq: 0,
        action,
        status: if action == OrderLogAction::Delete {
            OrderStatus::Cancelled
        } else {
            OrderStatus::New
        },
        order_id: id,
        instrument: o.instrument,
        account: o.account,
        firm: FirmId(0),
        cl_ord_id: ClOrdId(o.cl),
        side: o.side,
        price: o.price,
        qty_display: Qty(o.leaves_lots),
        qty_leaves: Qty(o.leaves_lots),
        qty_filled: Qty(o.qty_lots - o.leaves_lots),
        qty_total: Qty(o.qty_lots),
        ts_ns: 0,
    })
}

impl Sessions {
    /// Opens (and logs on) every session of `plan`.
    fn connect(plan: &WorkerPlan) -> Result<Sessions, String> {
        if plan.sessions.is_empty() || plan.sessions.len() > SESSIONS_PER_WORKER_MAX {
            return Err(format!(
                "a worker needs 1 to {SESSIONS_PER_WORKER_MAX} sessions, not {}",
                plan.sessions.len()
            ));
        }
        let mut route = FxHashMap::default();
        let mut sessions = Vec::new();
        for (i, s) in plan.sessions.iter().enumerate() {
            if s.accounts.len() > ACCOUNTS_PER_SESSION_MAX {
                return Err(format!(
                    "session {}: {} accounts; a gateway session trades at most {ACCOUNTS_PER_SESSION_MAX}",
                    s.name,
                    s.accounts.len()
                ));
            }
            for &m in &s.markets {
                for &a in &s.accounts {
                    route.insert((m as u16, a), i as u32);
                }
            }
            let conn = match s.protocol {
                SessionProtocol::Binary => {
                    let mut c = BinaryClient::connect(s.addr, &s.name, 1_000, 1)
                        .map_err(|e| format!("binary session {} at {}: {e}", s.name, s.addr))?;
                    c.set_nonblocking(true)
                        .map_err(|e| format!("binary session {}: {e}", s.name))?;
                    Conn::Binary(Box::new(c))
                }
                SessionProtocol::Fix => {
                    let mut config = FixClientConfig::new(s.addr, &s.name, &s.gateway_comp_id);
                    config.reset_on_logon = true;
                    config.logon_timeout = Duration::from_millis(LOGON_TIMEOUT_MS);
                    let mut c = FixClient::connect(&config)
                        .map_err(|e| format!("FIX session {} at {}: {e}", s.name, s.addr))?;
                    c.set_nonblocking(true)
                        .map_err(|e| format!("FIX session {}: {e}", s.name))?;
                    Conn::Fix(Box::new(c))
                }
            };
            sessions.push(conn);
        }
        let mut instruments = FxHashMap::default();
        let mut first_instrument = Vec::new();
        for list in &plan.instruments {
            first_instrument.push(list.first().map_or(InstrumentId(0), |i| i.instrument));
            for i in list {
                instruments.insert(i.instrument, i.clone());
            }
        }
        Ok(Sessions {
            sessions,
            route,
            instruments,
            first_instrument,
            pending: FxHashMap::default(),
            orders: FxHashMap::default(),
            gone: VecDeque::new(),
            notify: vec![Vec::new(); plan.instruments.len()],
        })
    }

    fn lot(&self, instrument: InstrumentId) -> i64 {
        self.instruments
            .get(&instrument)
            .map_or(1, |i| i.lot_size.max(1))
    }

    fn session_of(&self, market: usize, account: AccountId) -> Result<u32, SubmitError> {
        self.route
            .get(&(market as u16, account.0))
            .copied()
            .ok_or_else(|| {
                SubmitError::Closed(format!(
                    "no session may trade account {} on market {market}",
                    account.0
                ))
            })
    }

    fn send(&mut self, tag: u64, market: usize, command: &Command) -> Result<Request, String> {
        let io = |e: std::io::Error| format!("send: {e}");
        match &command.body {
            CommandBody::NewOrder(o) => {
                let s = self
                    .session_of(market, o.account)
                    .map_err(|e| format!("{e:?}"))?;
                let info = self
                    .instruments
                    .get(&o.instrument)
                    .ok_or_else(|| format!("unknown instrument {}", o.instrument.0))?;
                let lot = info.lot_size.max(1);
                let scale = info.price_scale;
                let symbol = info.symbol.clone();
                let market_order = o.ord_type == OrdType::Market;
                let qty_units = o.qty.0 * lot;
                match &mut self.sessions[s as usize] {
                    Conn::Binary(c) => {
                        let tif = match o.tif {
                            TimeInForce::Ioc => BinTif::ImmediateOrCancel,
                            TimeInForce::Fok => BinTif::FillOrKill,
                            TimeInForce::Gtc => BinTif::GoodTillCancel,
                            _ => BinTif::Day,
                        };
                        let price = (!market_order).then_some(o.price.0);
                        c.new_order(
                            tag,
                            o.account.0,
                            o.instrument.0,
                            o.side == Side::Buy,
                            qty_units,
                            price,
                            tif,
                        )
                        .map_err(io)?;
                    }
                    Conn::Fix(c) => {
                        let tif = match o.tif {
                            TimeInForce::Ioc => '3',
                            TimeInForce::Fok => '4',
                            TimeInForce::Gtc => '1',
                            _ => '0',
                        };
                        let price = (!market_order).then(|| decimal(o.price.0, scale));
                        c.new_order(
                            &tag.to_string(),
                            Some(o.account.0),
                            &symbol,
                            o.side == Side::Buy,
                            qty_units,
                            price.as_deref(),
                            tif,
                        )
                        .map_err(io)?;
                    }
                }
                Ok(Request::New {
                    account: o.account,
                    instrument: o.instrument,
                    side: o.side,
                    price: o.price,
                    qty_lots: o.qty.0,
                })
            }
            CommandBody::Cancel(c) => {
                let known = c
                    .target
                    .order_id
                    .and_then(|id| self.orders.get(&id).copied());
                let (s, orig, instrument, side) = match known {
                    Some(o) => (o.session, o.cl, o.instrument, o.side),
                    // An order this worker never saw (or forgot): the gateway answers that it
                    // does not know it, as it would answer any client.
                    None => (
                        self.session_of(market, c.account)
                            .map_err(|e| format!("{e:?}"))?,
                        0,
                        self.first_instrument[market],
                        Side::Buy,
                    ),
                };
                let symbol = self
                    .instruments
                    .get(&instrument)
                    .map_or_else(String::new, |i| i.symbol.clone());
                match &mut self.sessions[s as usize] {
                    Conn::Binary(b) => {
                        b.cancel(tag, orig, c.account.0, instrument.0).map_err(io)?
                    }
                    Conn::Fix(f) => {
                        f.cancel(
                            &tag.to_string(),
                            &orig.to_string(),
                            &symbol,
                            side == Side::Buy,
                        )
                        .map_err(io)?;
                    }
                }
                Ok(Request::Cancel)
            }
            CommandBody::Replace(r) => {
                let id = r.target.order_id.unwrap_or(OrderId(0));
                let known = self.orders.get(&id).copied();
                let (s, orig, instrument, side, price, qty_lots) = match known {
                    Some(o) => (
                        o.session,
                        o.cl,
                        o.instrument,
                        o.side,
                        r.price.unwrap_or(o.price),
                        r.qty.map_or(o.qty_lots, |q| q.0),
                    ),
                    None => (
                        self.session_of(market, r.account)
                            .map_err(|e| format!("{e:?}"))?,
                        0,
                        self.first_instrument[market],
                        Side::Buy,
                        r.price.unwrap_or(Price(1)),
                        r.qty.map_or(1, |q| q.0),
                    ),
                };
                let lot = self.lot(instrument);
                let (symbol, scale) = self
                    .instruments
                    .get(&instrument)
                    .map_or((String::new(), 0), |i| (i.symbol.clone(), i.price_scale));
                match &mut self.sessions[s as usize] {
                    Conn::Binary(b) => b
                        .replace(
                            tag,
                            orig,
                            r.account.0,
                            instrument.0,
                            price.0,
                            qty_lots * lot,
                        )
                        .map_err(io)?,
                    Conn::Fix(f) => {
                        f.replace(
                            &tag.to_string(),
                            &orig.to_string(),
                            &symbol,
                            side == Side::Buy,
                            qty_lots * lot,
                            &decimal(price.0, scale),
                        )
                        .map_err(io)?;
                    }
                }
                Ok(Request::Replace {
                    order_id: id,
                    price,
                    qty_lots,
                })
            }
            CommandBody::MassCancel(m) => {
                let account = m.account.unwrap_or(AccountId(0));
                let s = self
                    .session_of(market, account)
                    .map_err(|e| format!("{e:?}"))?;
                let symbol = m
                    .instrument
                    .and_then(|i| self.instruments.get(&i))
                    .map(|i| i.symbol.clone());
                match &mut self.sessions[s as usize] {
                    Conn::Binary(b) => b
                        .mass_cancel(tag, m.account.map(|a| a.0), m.instrument.map(|i| i.0))
                        .map_err(io)?,
                    // The same scope on both protocols: the account's orders (the session's
                    // when the command names none) in the instrument (in every instrument
                    // when it names none). The SDK's `mass_cancel` names no account, so the
                    // request is built here with Account (1), which the gateway honours.
                    Conn::Fix(f) => {
                        f.send(fix_mass_cancel(
                            &tag.to_string(),
                            m.account,
                            symbol.as_deref(),
                        ))
                        .map_err(io)?;
                    }
                }
                Ok(Request::MassCancel)
            }
            other => Err(format!(
                "the gateway target sends trading commands only, not {other:?}"
            )),
        }
    }

    fn read(conn: &mut Conn) -> Result<Option<Rep>, String> {
        match conn {
            Conn::Binary(c) => match c.recv(Duration::ZERO) {
                Ok(Some(r)) => Ok(Some(Self::binary_rep(r.response))),
                Ok(None) if c.is_closed() => Ok(Some(Rep::Closed)),
                Ok(None) => Ok(None),
                Err(e) => Err(format!("binary session: {e}")),
            },
            Conn::Fix(c) => match c.recv(Duration::ZERO) {
                Ok(Some(m)) => Ok(Some(Self::fix_rep(&m))),
                Ok(None) => match c.closed_reason() {
                    Some(why) => Err(format!("FIX session closed: {why}")),
                    None => Ok(None),
                },
                Err(e) => Err(format!("FIX session: {e}")),
            },
        }
    }

    fn binary_rep(r: Response) -> Rep {
        match r {
            Response::NewOrderAck {
                cl_ord_id,
                order_id,
                leaves_qty,
            } => Rep::NewAck {
                cl: cl_ord_id,
                order_id,
                leaves_units: leaves_qty,
            },
            Response::OrderReject { cl_ord_id, .. } => Rep::NewReject { cl: cl_ord_id },
            Response::Execution {
                order_id,
                trade_id,
                last_px,
                last_qty,
                leaves_qty,
                aggressor,
                ..
            } => Rep::Fill {
                order_id,
                trade_id,
                px: last_px,
                qty_units: last_qty,
                leaves_units: leaves_qty,
                counts_trade: aggressor,
            },
            Response::CancelAck {
                cl_ord_id,
                order_id,
                reason,
                ..
            } => Rep::Cancelled {
                by: cl_ord_id,
                order_id,
                // Wire code 0: cancelled at the owner's request.
                requested: reason == 0,
            },
            Response::CancelReject { cl_ord_id, .. } => Rep::CancelReject { cl: cl_ord_id },
            Response::ReplaceAck {
                cl_ord_id,
                order_id,
                leaves_qty,
                ..
            } => Rep::Replaced {
                cl: cl_ord_id,
                order_id,
                leaves_units: leaves_qty,
            },
            Response::ReplaceReject { cl_ord_id, .. } => Rep::ReplaceReject { cl: cl_ord_id },
            Response::MassCancelAck {
                cl_ord_id,
                result: BIN_MASS_CORE_NO_QUORUM | BIN_MASS_SYSTEM_UNAVAILABLE,
                ..
            } => Rep::Busy { cl: cl_ord_id },
            Response::MassCancelAck {
                cl_ord_id,
                canceled_count,
                result,
            } => Rep::MassDone {
                cl: cl_ord_id,
                count: canceled_count as u64,
                // Wire code 0: done.
                ok: result == 0,
            },
            Response::BusinessReject {
                ref_cl_ord_id: Some(cl),
                reason:
                    BIN_REASON_THROTTLED | BIN_REASON_SYSTEM_UNAVAILABLE | BIN_REASON_CORE_NO_QUORUM,
                ..
            } => Rep::Busy { cl },
            Response::BusinessReject { ref_cl_ord_id, .. } => {
                Rep::BusinessReject { cl: ref_cl_ord_id }
            }
            Response::Terminate { .. } => Rep::Closed,
            _ => Rep::Ignore,
        }
    }

    fn fix_rep(m: &bourse_client::FixMessage) -> Rep {
        let text = |tag: i32| m.get(tag).and_then(|v| std::str::from_utf8(v).ok());
        let num = |tag: i32| text(tag).and_then(|t| t.parse::<u64>().ok());
        let int = |tag: i32| text(tag).and_then(|t| t.parse::<i64>().ok());
        let cl = num(11).unwrap_or(0);
        // The gateway's overload and no-quorum refusals say so in Text (58), whatever the
        // message type.
        let busy = text(58).is_some_and(|t| {
            t.starts_with("system busy")
                || t.starts_with("throttle")
                || t.starts_with("trading core has no quorum")
        });
        match m.msg_type.as_str() {
            "8" | "9" if busy && text(150).is_none_or(|t| t == "8") => Rep::Busy { cl },
            "r" if busy => Rep::Busy { cl },
            "j" if busy => match num(379) {
                Some(cl) => Rep::Busy { cl },
                None => Rep::BusinessReject { cl: None },
            },
            "8" => match text(150).unwrap_or("") {
                "0" => Rep::NewAck {
                    cl,
                    order_id: num(37).unwrap_or(0),
                    leaves_units: int(151).unwrap_or(0),
                },
                "8" => Rep::NewReject { cl },
                "F" => Rep::Fill {
                    order_id: num(37).unwrap_or(0),
                    trade_id: 0,
                    px: 0,
                    qty_units: int(32).unwrap_or(0),
                    leaves_units: int(151).unwrap_or(0),
                    counts_trade: text(54) == Some("1"),
                },
                "4" | "C" => Rep::Cancelled {
                    by: m.get(41).is_some().then_some(cl),
                    order_id: num(37).unwrap_or(0),
                    requested: text(58) == Some("Requested"),
                },
                "5" => Rep::Replaced {
                    cl,
                    order_id: num(37).unwrap_or(0),
                    leaves_units: int(151).unwrap_or(0),
                },
                "I" if text(39) == Some("8") => Rep::BusinessReject { cl: Some(cl) },
                _ => Rep::Ignore,
            },
            "9" => {
                if text(434) == Some("2") {
                    Rep::ReplaceReject { cl }
                } else {
                    Rep::CancelReject { cl }
                }
            }
            "r" => Rep::MassDone {
                cl,
                count: num(533).unwrap_or(0),
                ok: text(531) != Some("0"),
            },
            "j" => Rep::BusinessReject { cl: num(379) },
            _ => Rep::Ignore,
        }
    }

    fn forget(&mut self, id: OrderId) {
        self.gone.push_back(id);
        while self.gone.len() > GONE_ORDERS_KEPT {
            if let Some(old) = self.gone.pop_front() {
                if self.orders.get(&old).is_some_and(|o| !o.live) {
                    self.orders.remove(&old);
                }
            }
        }
    }

    /// The order leaves the book (if it was in it): its order-log delete.
    fn leave(&mut self, id: OrderId, out: &mut Vec<Event>) {
        if let Some(o) = self.orders.get_mut(&id) {
            if o.live {
                o.live = false;
                o.leaves_lots = 0;
                let o = *o;
                out.push(order_log(OrderLogAction::Delete, id, &o));
                self.forget(id);
            }
        }
    }

    /// Turns one report into an answer (returned) or notifications (gathered).
    fn on_report(&mut self, session: u32, rep: Rep, received: Instant) -> Option<Answer> {
        let answer = |p: Pending, events: Vec<Event>| Answer {
            tag: p.tag,
            market: p.market as usize,
            received,
            stages: None,
            events,
            busy: false,
        };
        match rep {
            Rep::NewAck {
                cl,
                order_id,
                leaves_units,
            } => {
                let p = self.pending.remove(&cl)?;
                let Request::New {
                    account,
                    instrument,
                    side,
                    price,
                    qty_lots,
                } = p.request
                else {
                    return Some(answer(p, Vec::new()));
                };
                let id = OrderId(order_id);
                let o = OrderInfo {
                    cl,
                    account,
                    instrument,
                    side,
                    price,
                    qty_lots,
                    leaves_lots: lots(leaves_units, self.lot(instrument)),
                    market: p.market,
                    session,
                    live: true,
                };
                self.orders.insert(id, o);
                let events = vec![
                    Event::OrderAccepted {
                        order_id: id,
                        account,
                        cl_ord_id: ClOrdId(cl),
                        instrument,
                        side,
                        price,
                        qty: Qty(qty_lots),
                        ts_ns: 0,
                    },
                    order_log(OrderLogAction::New, id, &o),
                ];
                Some(answer(p, events))
            }
            Rep::NewReject { cl } => {
                let p = self.pending.remove(&cl)?;
                let (account, instrument) = match p.request {
                    Request::New {
                        account,
                        instrument,
                        ..
                    } => (account, instrument),
                    _ => (AccountId(0), InstrumentId(0)),
                };
                Some(answer(
                    p,
                    vec![Event::OrderRejected {
                        account,
                        cl_ord_id: ClOrdId(cl),
                        instrument,
                        reason: RejectReason::UnknownOrder,
                        ts_ns: 0,
                    }],
                ))
            }
            Rep::Fill {
                order_id,
                trade_id,
                px,
                qty_units,
                leaves_units,
                counts_trade,
            } => {
                let id = OrderId(order_id);
                let o = self.orders.get(&id).copied()?;
                let lot = self.lot(o.instrument);
                let mut events = Vec::new();
                if counts_trade {
                    let fill = Fill {
                        order_id: id,
                        account: o.account,
                        cl_ord_id: ClOrdId(o.cl),
                        qty_leaves: Qty(lots(leaves_units, lot)),
                        qty_filled: Qty(o.qty_lots - lots(leaves_units, lot)),
                    };
                    let other = Fill {
                        order_id: OrderId(0),
                        account: AccountId(0),
                        cl_ord_id: ClOrdId(0),
                        qty_leaves: Qty(0),
                        qty_filled: Qty(0),
                    };
                    let (buy, sell) = if o.side == Side::Buy {
                        (fill, other)
                    } else {
                        (other, fill)
                    };
                    events.push(Event::Trade {
                        trade_id: TradeId(trade_id),
                        instrument: o.instrument,
                        price: Price(px),
                        qty: Qty(lots(qty_units, lot)),
                        aggressor: o.side,
                        buy,
                        sell,
                        auction: false,
                        ts_ns: 0,
                    });
                }
                if leaves_units == 0 {
                    self.leave(id, &mut events);
                } else if let Some(o) = self.orders.get_mut(&id) {
                    o.leaves_lots = lots(leaves_units, lot);
                }
                self.notify[o.market as usize].extend(events);
                None
            }
            Rep::Cancelled {
                by,
                order_id,
                requested,
            } => {
                let id = OrderId(order_id);
                let o = self.orders.get(&id).copied();
                let mut events = Vec::new();
                if let Some(o) = o {
                    events.push(Event::OrderCancelled {
                        order_id: id,
                        account: o.account,
                        cl_ord_id: ClOrdId(o.cl),
                        instrument: o.instrument,
                        side: o.side,
                        qty_cancelled: Qty(o.leaves_lots),
                        reason: if requested {
                            CancelReason::Requested
                        } else {
                            CancelReason::MassCancel
                        },
                        ts_ns: 0,
                    });
                }
                self.leave(id, &mut events);
                let answers_cancel = by.and_then(|cl| {
                    self.pending
                        .get(&cl)
                        .is_some_and(|p| matches!(p.request, Request::Cancel))
                        .then_some(cl)
                });
                match answers_cancel {
                    Some(cl) => {
                        let p = self.pending.remove(&cl)?;
                        Some(answer(p, events))
                    }
                    None => {
                        if let Some(o) = o {
                            self.notify[o.market as usize].extend(events);
                        }
                        None
                    }
                }
            }
            Rep::CancelReject { cl } | Rep::ReplaceReject { cl } => {
                let p = self.pending.remove(&cl)?;
                let to = if matches!(rep, Rep::ReplaceReject { .. }) {
                    CancelRejectTo::Replace
                } else {
                    CancelRejectTo::Cancel
                };
                Some(answer(
                    p,
                    vec![Event::CancelRejected {
                        account: AccountId(0),
                        cl_ord_id: ClOrdId(cl),
                        order_id: None,
                        response_to: to,
                        reason: RejectReason::UnknownOrder,
                        ts_ns: 0,
                    }],
                ))
            }
            Rep::Replaced {
                cl,
                order_id,
                leaves_units,
            } => {
                let p = self.pending.remove(&cl)?;
                let Request::Replace {
                    order_id: asked,
                    price,
                    qty_lots,
                } = p.request
                else {
                    return Some(answer(p, Vec::new()));
                };
                let id = OrderId(order_id);
                let mut events = Vec::new();
                let key = if self.orders.contains_key(&id) {
                    id
                } else {
                    asked
                };
                if let Some(o) = self.orders.get_mut(&key) {
                    let lot = self
                        .instruments
                        .get(&o.instrument)
                        .map_or(1, |i| i.lot_size.max(1));
                    o.cl = cl;
                    o.price = price;
                    o.qty_lots = qty_lots;
                    o.leaves_lots = lots(leaves_units, lot);
                    let o = *o;
                    events.push(Event::OrderReplaced {
                        order_id: id,
                        account: o.account,
                        cl_ord_id: ClOrdId(cl),
                        orig_cl_ord_id: ClOrdId(0),
                        instrument: o.instrument,
                        price,
                        qty_total: Qty(qty_lots),
                        qty_leaves: Qty(o.leaves_lots),
                        priority_kept: false,
                        ts_ns: 0,
                    });
                    events.push(order_log(OrderLogAction::Change, id, &o));
                }
                Some(answer(p, events))
            }
            Rep::MassDone { cl, count, ok } => {
                let p = self.pending.remove(&cl)?;
                let e = if ok {
                    Event::MassCancelDone {
                        cl_ord_id: ClOrdId(cl),
                        orders_cancelled: count,
                        ts_ns: 0,
                    }
                } else {
                    Event::CommandRejected {
                        reason: RejectReason::UnknownAccount,
                        ts_ns: 0,
                    }
                };
                Some(answer(p, vec![e]))
            }
            Rep::BusinessReject { cl } => {
                let p = self.pending.remove(&cl?)?;
                Some(answer(
                    p,
                    vec![Event::CommandRejected {
                        reason: RejectReason::CapacityExceeded,
                        ts_ns: 0,
                    }],
                ))
            }
            Rep::Busy { cl } => {
                let p = self.pending.remove(&cl)?;
                Some(Answer {
                    busy: true,
                    ..answer(
                        p,
                        vec![Event::CommandRejected {
                            reason: RejectReason::CapacityExceeded,
                            ts_ns: 0,
                        }],
                    )
                })
            }
            Rep::Closed | Rep::Ignore => None,
        }
    }

    /// Reads whatever every session has ready; returns how many answers were added.
    fn drain(&mut self, out: &mut Vec<Answer>) -> Result<usize, SubmitError> {
        let before = out.len();
        for s in 0..self.sessions.len() {
            for _ in 0..READS_PER_SESSION_MAX {
                let rep = Self::read(&mut self.sessions[s]).map_err(SubmitError::Closed)?;
                let Some(rep) = rep else { break };
                if let Rep::Closed = rep {
                    return Err(SubmitError::Closed(format!(
                        "the gateway closed session {s}"
                    )));
                }
                if let Some(a) = self.on_report(s as u32, rep, Instant::now()) {
                    out.push(a);
                }
            }
        }
        let now = Instant::now();
        for (m, events) in self.notify.iter_mut().enumerate() {
            if !events.is_empty() {
                out.push(Answer {
                    tag: NOTIFY_TAG,
                    market: m,
                    received: now,
                    stages: None,
                    events: std::mem::take(events),
                    busy: false,
                });
            }
        }
        Ok(out.len() - before)
    }

    /// Logs every session out (FIX) or terminates it (binary), without waiting long.
    fn close(&mut self) {
        for s in &mut self.sessions {
            match s {
                Conn::Binary(b) => {
                    let _ = b.terminate();
                }
                Conn::Fix(f) => {
                    let _ = f.logout(Duration::from_millis(200));
                }
            }
        }
    }
}

impl Sessions {
    /// Sends one command on the session that may trade its account.
    fn submit(&mut self, tag: u64, market: usize, command: Command) -> Result<(), String> {
        if market >= self.first_instrument.len() {
            return Err(format!("no market {market}"));
        }
        let request = self.send(tag, market, &command)?;
        self.pending.insert(
            tag,
            Pending {
                tag,
                market: market as u16,
                request,
            },
        );
        Ok(())
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        self.close();
    }
}

/// Commands queued for the I/O thread at most; past it `submit` answers `Full` and the
/// generator holds the command (its wait counts in its latency).
pub const SUBMIT_QUEUE_MAX: usize = 65_536;
/// Batches of answers queued for the generator at most (the I/O thread waits past it).
const ANSWER_BATCHES_QUEUED_MAX: usize = 4_096;
/// Commands the I/O thread sends before it reads the sessions again.
const SENDS_PER_TURN_MAX: usize = 256;
/// The longest the I/O thread sleeps in poll(2) when nothing was ready to read or send: a
/// report or a command wakes it at once, so this only paces the sessions' own timers.
const IDLE_WAIT_MS: u16 = 100;

enum ToIo {
    Submit {
        tag: u64,
        market: usize,
        command: Command,
    },
    Close,
}

enum FromIo {
    Answers(Vec<Answer>),
    Failed(String),
}

/// One generator worker's sessions on the gateways.
///
/// `submit` never blocks: it queues the command for the target's I/O thread, which owns the
/// sessions, writes each request and reads every report, stamping the time a report arrives.
/// A gateway that reads slowly delays that thread's writes (TCP's own back pressure), never
/// the generator's schedule: commands wait in the queue, their wait counts in their latency
/// (measured from the scheduled send), and a full queue is `SubmitError::Full`. Meanwhile the
/// generator keeps taking answers, so it never stops reading because it is writing.
pub struct GatewayTarget {
    to_io: crossbeam_channel::Sender<ToIo>,
    wake: Arc<IoWake>,
    from_io: Option<crossbeam_channel::Receiver<FromIo>>,
    thread: Option<std::thread::JoinHandle<()>>,
    failed: Option<String>,
}

impl GatewayTarget {
    /// Opens (and logs on) every session of `plan` and starts the I/O thread.
    pub fn connect(plan: &WorkerPlan) -> Result<GatewayTarget, String> {
        let sessions = Sessions::connect(plan)?;
        let (to_io, commands) = crossbeam_channel::bounded(SUBMIT_QUEUE_MAX);
        let (answers, from_io) = crossbeam_channel::bounded(ANSWER_BATCHES_QUEUED_MAX);
        let wake = Arc::new(IoWake::new().map_err(|e| format!("the I/O thread's wake-up: {e}"))?);
        let io_wake = Arc::clone(&wake);
        let thread = std::thread::Builder::new()
            .name("loadgen-io".into())
            .spawn(move || io_loop(sessions, commands, answers, &io_wake))
            .map_err(|e| format!("cannot start the I/O thread: {e}"))?;
        Ok(GatewayTarget {
            to_io,
            wake,
            from_io: Some(from_io),
            thread: Some(thread),
            failed: None,
        })
    }

    /// Logs every session out (FIX) or terminates it (binary), without waiting long, and
    /// ends the I/O thread.
    pub fn close(&mut self) {
        // Answers nobody will take must not keep the thread waiting.
        self.from_io = None;
        let _ = self.to_io.send(ToIo::Close);
        self.wake.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    fn closed(&mut self) -> SubmitError {
        SubmitError::Closed(
            self.failed
                .clone()
                .unwrap_or_else(|| "the target's I/O thread has ended".into()),
        )
    }

    fn take(&mut self, msg: FromIo, out: &mut Vec<Answer>) -> Result<usize, SubmitError> {
        match msg {
            FromIo::Answers(list) => {
                let n = list.len();
                out.extend(list);
                Ok(n)
            }
            FromIo::Failed(why) => {
                self.failed = Some(why);
                Err(self.closed())
            }
        }
    }
}

/// How the generator wakes the I/O thread when it sleeps in poll(2): a byte on a socket pair
/// that the thread polls beside its sessions, written only while the thread says it sleeps.
struct IoWake {
    asleep: AtomicBool,
    tx: std::os::unix::net::UnixStream,
    rx: std::os::unix::net::UnixStream,
}

impl IoWake {
    fn new() -> std::io::Result<IoWake> {
        let (tx, rx) = std::os::unix::net::UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(IoWake {
            asleep: AtomicBool::new(false),
            tx,
            rx,
        })
    }

    /// After a command was queued: wakes the thread if it sleeps (a full socket buffer means
    /// a wake-up is already pending, so a refused write loses nothing).
    fn wake(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::SeqCst) {
            let _ = (&self.tx).write(&[1]);
        }
    }
}

/// Sleeps until a session is readable, a command is queued or `IDLE_WAIT_MS` pass. The flag
/// is raised before the queue is looked at once more, so a command queued meanwhile either is
/// seen here or wakes the poll (each side fences before it reads the other's).
fn io_sleep(sessions: &Sessions, commands: &crossbeam_channel::Receiver<ToIo>, wake: &IoWake) {
    use nix::poll::{poll, PollFd, PollFlags};
    use std::os::fd::AsFd;
    wake.asleep.store(true, Ordering::SeqCst);
    std::sync::atomic::fence(Ordering::SeqCst);
    if commands.is_empty() {
        let mut fds: Vec<PollFd<'_>> = sessions
            .sessions
            .iter()
            .map(|c| match c {
                Conn::Binary(b) => b.socket_fd(),
                Conn::Fix(f) => f.socket_fd(),
            })
            .chain(std::iter::once(wake.rx.as_fd()))
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect();
        // An error (EINTR) only ends the sleep early.
        let _ = poll(&mut fds, IDLE_WAIT_MS);
    }
    wake.asleep.store(false, Ordering::SeqCst);
    let mut buf = [0u8; 64];
    while matches!((&wake.rx).read(&mut buf), Ok(n) if n > 0) {}
}

/// The I/O thread: sends what the generator queued, reads what the gateways answered.
fn io_loop(
    mut sessions: Sessions,
    commands: crossbeam_channel::Receiver<ToIo>,
    answers: crossbeam_channel::Sender<FromIo>,
    wake: &IoWake,
) {
    use crossbeam_channel::TryRecvError;
    let mut next: Option<ToIo> = None;
    let mut out: Vec<Answer> = Vec::new();
    loop {
        let mut busy = false;
        for _ in 0..SENDS_PER_TURN_MAX {
            let msg = match next.take() {
                Some(m) => m,
                None => match commands.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                },
            };
            match msg {
                ToIo::Submit {
                    tag,
                    market,
                    command,
                } => {
                    busy = true;
                    if let Err(why) = sessions.submit(tag, market, command) {
                        let _ = answers.send(FromIo::Failed(why));
                        return;
                    }
                }
                ToIo::Close => return,
            }
        }
        match sessions.drain(&mut out) {
            Ok(0) => {}
            Ok(_) => {
                busy = true;
                if answers
                    .send(FromIo::Answers(std::mem::take(&mut out)))
                    .is_err()
                {
                    return;
                }
            }
            Err(SubmitError::Closed(why)) => {
                let _ = answers.send(FromIo::Failed(why));
                return;
            }
            Err(SubmitError::Full) => {}
        }
        if !busy {
            // Nothing to read or send: sleep until a report or a command arrives.
            io_sleep(&sessions, &commands, wake);
        }
    }
}

impl Target for GatewayTarget {
    fn submit(&mut self, tag: u64, market: usize, command: Command) -> Result<(), SubmitError> {
        if self.failed.is_some() {
            return Err(self.closed());
        }
        match self.to_io.try_send(ToIo::Submit {
            tag,
            market,
            command,
        }) {
            Ok(()) => {
                self.wake.wake();
                Ok(())
            }
            Err(crossbeam_channel::TrySendError::Full(_)) => Err(SubmitError::Full),
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => Err(self.closed()),
        }
    }

    fn poll(&mut self, out: &mut Vec<Answer>, wait: Duration) -> Result<usize, SubmitError> {
        let Some(rx) = self.from_io.clone() else {
            return Err(self.closed());
        };
        let mut n = match rx.recv_timeout(wait) {
            Ok(msg) => self.take(msg, out)?,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => return Ok(0),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Err(self.closed()),
        };
        while let Ok(msg) = rx.try_recv() {
            n += self.take(msg, out)?;
        }
        Ok(n)
    }
}

/// OrderMassCancelRequest (q) for one account's orders (`account` none: the session's) in
/// one instrument (`symbol` none: in all).
fn fix_mass_cancel(
    cl_ord_id: &str,
    account: Option<AccountId>,
    symbol: Option<&str>,
) -> OutMessage {
    let mut m = OutMessage::new("q");
    m.push(11, cl_ord_id);
    match symbol {
        Some(s) => {
            m.push(530, "1");
            m.push(55, s);
        }
        None => {
            m.push(530, "7");
        }
    }
    if let Some(a) = account {
        m.push(1, a.0.to_string());
    }
    m.push(60, bourse_fix::time::format_utc_timestamp_ms(unix_ms()));
    m
}

fn unix_ms() -> i64 {
    (crate::unix_ns() / 1_000_000) as i64
}

impl Drop for GatewayTarget {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overload_refusal_is_busy_on_both_protocols_and_other_rejects_are_not() {
        let busy = |r: Rep| matches!(r, Rep::Busy { cl: 7 });
        let biz = |reason: u8| Response::BusinessReject {
            ref_cl_ord_id: Some(7),
            reason,
            retry_after_ms: 0,
        };
        assert!(busy(Sessions::binary_rep(biz(
            BIN_REASON_SYSTEM_UNAVAILABLE
        ))));
        assert!(busy(Sessions::binary_rep(biz(BIN_REASON_THROTTLED))));
        assert!(busy(Sessions::binary_rep(biz(BIN_REASON_CORE_NO_QUORUM))));
        let mass = |result: u8| Response::MassCancelAck {
            cl_ord_id: 7,
            canceled_count: 0,
            result,
        };
        assert!(busy(Sessions::binary_rep(mass(BIN_MASS_CORE_NO_QUORUM))));
        assert!(busy(Sessions::binary_rep(mass(
            BIN_MASS_SYSTEM_UNAVAILABLE
        ))));
        assert!(matches!(
            Sessions::binary_rep(mass(0)),
            Rep::MassDone {
                cl: 7,
                ok: true,
                ..
            }
        ));
        assert!(matches!(
            Sessions::binary_rep(biz(6)),
            Rep::BusinessReject { cl: Some(7) }
        ));
        let fix = |msg_type: &str, fields: &[(i32, &str)]| {
            let m = bourse_client::FixMessage {
                msg_type: msg_type.into(),
                seq_num: 1,
                fields: fields
                    .iter()
                    .map(|&(tag, v)| (tag, v.as_bytes().to_vec()))
                    .collect(),
            };
            Sessions::fix_rep(&m)
        };
        assert!(busy(fix(
            "8",
            &[(11, "7"), (150, "8"), (58, "system busy, retry")]
        )));
        assert!(busy(fix("9", &[(11, "7"), (58, "system busy, retry")])));
        assert!(busy(fix(
            "8",
            &[
                (11, "7"),
                (150, "8"),
                (
                    58,
                    "trading core has no quorum (replicas unreachable): not accepted, retry later"
                )
            ]
        )));
        assert!(matches!(
            fix(
                "8",
                &[(11, "7"), (150, "8"), (58, "InsufficientCollateral")]
            ),
            Rep::NewReject { cl: 7 }
        ));
        // A mass cancel refused unprocessed (OrderMassCancelReport, response 0 with the
        // refusal's Text) is busy too; one the core rejected is not.
        let no_quorum =
            "trading core has no quorum (replicas unreachable): not accepted, retry later";
        assert!(busy(fix("r", &[(11, "7"), (531, "0"), (58, no_quorum)])));
        assert!(matches!(
            fix("r", &[(11, "7"), (531, "0"), (58, "UnknownAccount")]),
            Rep::MassDone {
                cl: 7,
                ok: false,
                ..
            }
        ));
    }

    #[test]
    fn decimals_keep_every_digit_of_the_scale() {
        assert_eq!(decimal(12345, 2), "123.45");
        assert_eq!(decimal(5, 3), "0.005");
        assert_eq!(decimal(-5, 1), "-0.5");
        assert_eq!(decimal(7, 0), "7");
    }
}
