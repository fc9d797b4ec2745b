//! [`BinaryClient`]: a Rust client of the binary front (GetOrders as SBE over TCP,
//! `schemas/bourse-delivery.xml`): one connection, one request at a time, the same
//! [`PollRequest`] and [`PollAnswer`] as the HTTP client.

use super::api::{
    hex_bytes, hex_text, AnswerHeader, ApiError, ClientError, PollAnswer, PollRequest, RefusalKind,
    ServerTimings, WAIT_US_DEFAULT,
};
use super::conn::{connect, Access, Conn};
use super::record::Record;
use bourse_core::{
    AccountId, ClOrdId, Event, Fill, FirmId, InstrumentId, OrderId, OrderLog, OrderLogAction,
    OrderStatus, Price, Qty, RejectReason, Side, TradeId,
};
use bourse_wire::delivery::codec;
use bourse_wire::delivery::{self as wire, FrameDecoder, Message, FRAME_BYTES_MAX};
use bourse_wire::frame::encode_frame;
use bourse_wire::Error as WireError;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Appends one frame to `out`, written by `encode` (an `encode_frame` call) into room for the
/// largest frame.
pub fn push_frame(out: &mut Vec<u8>, encode: impl FnOnce(&mut [u8]) -> Result<usize, WireError>) {
    let start = out.len();
    out.resize(start + FRAME_BYTES_MAX, 0);
    let n = encode(&mut out[start..]).expect("a delivery frame fits its maximum");
    out.truncate(start + n);
}

/// A Rust client of the binary front: one connection, one request at a time. It takes the
/// same [`PollRequest`] and gives the same [`PollAnswer`] as the HTTP client (cursors in
/// hex), so a program can switch fronts without other change.
pub struct BinaryClient {
    addr: SocketAddr,
    stream: Option<Conn>,
    next_request_id: u64,
    inbuf: Vec<u8>,
    access: Access,
    logon: Option<Logon>,
}

/// What a node's LogonAck said: whose records the credentials read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logon {
    /// Every firm's (roles `viewer`, `operator`).
    pub all_firms: bool,
    /// Otherwise these firms' only.
    pub firms: Vec<FirmId>,
}

/// The most bytes of records one answer may hold before the client refuses it.
const ANSWER_RECORDS_MAX: usize = 1_000_000;

impl BinaryClient {
    pub fn new(addr: SocketAddr) -> BinaryClient {
        BinaryClient {
            addr,
            stream: None,
            next_request_id: 1,
            inbuf: Vec::with_capacity(64 * 1024),
            access: Access::default(),
            logon: None,
        }
    }

    /// The same client over TLS and/or with credentials: each connection then opens with a
    /// Logon, checked once by the node.
    pub fn with_access(mut self, access: Access) -> BinaryClient {
        self.access = access;
        self.stream = None;
        self
    }

    /// What the last Logon's LogonAck said (`None` before one, or without credentials).
    pub fn logon(&self) -> Option<&Logon> {
        self.logon.as_ref()
    }

    /// Connects (TLS if asked) and logs on if the client has credentials.
    async fn connect(&mut self) -> Result<(), ClientError> {
        let s = connect(self.addr, self.access.tls.as_ref()).await?;
        self.stream = Some(s);
        self.inbuf.clear();
        self.logon = None;
        let Some((name, password)) = self.access.credentials.clone() else {
            return Ok(());
        };
        let id = self.next_request_id;
        self.next_request_id += 1;
        let mut out = Vec::with_capacity(FRAME_BYTES_MAX);
        let (name, password) = (name.as_bytes(), password.as_bytes());
        if name.len() > usize::from(wire::LOGON_NAME_BYTES_MAX)
            || password.len() > usize::from(wire::LOGON_PASSWORD_BYTES_MAX)
        {
            self.stream = None;
            return Err(ClientError::Protocol(
                "a name of at most 64 bytes and a password of at most 128".into(),
            ));
        }
        push_frame(&mut out, |b| {
            encode_frame(b, |mut e: codec::logon_codec::LogonEncoder| {
                e.request_id(id);
                e.name(name);
                e.password(password);
                e
            })
        });
        let result = self.logon_exchange(&out, id).await;
        match result {
            Ok(l) => {
                self.logon = Some(l);
                Ok(())
            }
            Err(e) => {
                self.stream = None;
                Err(e)
            }
        }
    }

    async fn logon_exchange(&mut self, request: &[u8], id: u64) -> Result<Logon, ClientError> {
        let stream = self.stream.as_mut().expect("connected");
        stream.write_all(request).await?;
        stream.flush().await?;
        let decoder = FrameDecoder::default();
        loop {
            if let Some(d) = decoder
                .decode(&self.inbuf)
                .map_err(|e| ClientError::Protocol(e.to_string()))?
            {
                let used = d.frame_bytes;
                let answer = match d.message {
                    Message::LogonAck(mut a) if a.request_id() == id => {
                        let all_firms = a.all_firms() == 1;
                        let at = a.firms_decoder();
                        let firms = a
                            .firms_slice(at)
                            .chunks_exact(4)
                            .map(|c| FirmId(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                            .collect();
                        Ok(Logon { all_firms, firms })
                    }
                    Message::DeliveryError(e) => Err(read_error(e)),
                    m => Err(ClientError::Protocol(format!(
                        "{:?} in answer to a Logon",
                        m.template_id()
                    ))),
                };
                self.inbuf.drain(..used);
                return answer;
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(ClientError::Protocol("the server closed".into()));
            }
            self.inbuf.extend_from_slice(&chunk[..n]);
        }
    }

    /// One GetOrders poll. A refused poll is `ClientError::Api` with the same status and
    /// code the HTTP API gives.
    pub async fn poll(&mut self, req: &PollRequest) -> Result<PollAnswer, ClientError> {
        if req.since_ns.is_some() {
            return Err(ClientError::Protocol(
                "since_ns is asked over HTTP; its answer's cursor serves this front".into(),
            ));
        }
        let cursor = match req.cursor.as_deref() {
            None | Some("") => Vec::new(),
            Some(text) => hex_bytes(text).ok_or_else(|| {
                ClientError::Protocol("a cursor is the hex text an answer gave".into())
            })?,
        };
        if cursor.len() > usize::from(wire::CURSOR_BYTES_MAX) {
            return Err(ClientError::Protocol(
                "cursor longer than any cursor".into(),
            ));
        }
        let id = self.next_request_id;
        self.next_request_id += 1;
        let mut out = Vec::with_capacity(FRAME_BYTES_MAX);
        push_frame(&mut out, |b| {
            encode_frame(b, |mut e: codec::get_orders_codec::GetOrdersEncoder| {
                e.request_id(id)
                    .limit(req.limit.map_or(0, |v| v.min(u32::MAX as usize) as u32))
                    .wait_us(req.wait_us.map_or(WAIT_US_DEFAULT, |v| {
                        v.min(u64::from(WAIT_US_DEFAULT - 1)) as u32
                    }))
                    .min_rows(req.min_rows.map_or(0, |v| v.min(u32::MAX as usize) as u32));
                e.firm_opt(req.filter.firm.map(|f| f.0))
                    .account_opt(req.filter.account.map(|a| a.0))
                    .instrument_opt(req.filter.instrument.map(|i| i.0));
                e.cursor(&cursor);
                e
            })
        });
        if self.stream.is_none() {
            self.connect().await?;
        }
        let result = self.exchange(&out, id).await;
        // A refused Logon or poll for want of credentials closes the connection too.
        if matches!(
            result,
            Err(ClientError::Io(_)
                | ClientError::Protocol(_)
                | ClientError::Api { status: 401, .. })
        ) {
            self.stream = None;
        }
        result
    }

    async fn exchange(&mut self, request: &[u8], id: u64) -> Result<PollAnswer, ClientError> {
        let stream = self.stream.as_mut().expect("connected");
        stream.write_all(request).await?;
        stream.flush().await?;
        let decoder = FrameDecoder::default();
        let mut consumed = 0;
        let mut header: Option<AnswerHeader> = None;
        let mut records = Vec::new();
        loop {
            let decoded = decoder
                .decode(&self.inbuf[consumed..])
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            let Some(d) = decoded else {
                self.inbuf.drain(..consumed);
                consumed = 0;
                let mut chunk = [0u8; 64 * 1024];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Err(ClientError::Protocol("the server closed".into()));
                }
                self.inbuf.extend_from_slice(&chunk[..n]);
                continue;
            };
            consumed += d.frame_bytes;
            match (&mut header, d.message) {
                (None, Message::OrdersHeader(h)) => {
                    if h.request_id() != id {
                        return Err(ClientError::Protocol("an answer to another request".into()));
                    }
                    let h = read_header(h)?;
                    records.reserve(h.count.min(ANSWER_RECORDS_MAX));
                    header = Some(h);
                }
                (None, Message::DeliveryError(e)) => {
                    let refused = read_error(e);
                    self.inbuf.drain(..consumed);
                    return Err(refused);
                }
                (Some(_), m) => records.push(read_record(&m)?),
                (None, m) => {
                    return Err(ClientError::Protocol(format!(
                        "{:?} before the answer's header",
                        m.template_id()
                    )))
                }
            }
            if let Some(h) = &header {
                if records.len() == h.count {
                    self.inbuf.drain(..consumed);
                    return Ok(PollAnswer {
                        header: h.clone(),
                        records,
                    });
                }
            }
        }
    }
}

fn read_header(
    mut h: codec::orders_header_codec::OrdersHeaderDecoder<'_>,
) -> Result<AnswerHeader, ClientError> {
    let count = h.count() as usize;
    if count > ANSWER_RECORDS_MAX {
        return Err(ClientError::Protocol(format!("{count} records announced")));
    }
    let server = ServerTimings {
        total_us: u64::from(h.total_us()),
        select_us: u64::from(h.select_us()),
        selects: h.selects(),
    };
    let oldest_ts_ns = h.oldest_ts_ns();
    let at = h.next_cursor_decoder();
    Ok(AnswerHeader {
        next_cursor: hex_text(h.next_cursor_slice(at)),
        count,
        oldest_ts_ns,
        server,
    })
}

fn read_error(mut e: codec::delivery_error_codec::DeliveryErrorDecoder<'_>) -> ClientError {
    use codec::error_code::ErrorCode;
    let kind = match e.code() {
        ErrorCode::CursorMalformed => RefusalKind::CursorMalformed,
        ErrorCode::CursorForeign => RefusalKind::CursorForeign,
        ErrorCode::CursorTooOld => RefusalKind::CursorTooOld,
        ErrorCode::Busy => RefusalKind::Busy,
        ErrorCode::CatchingUp => RefusalKind::CatchingUp,
        ErrorCode::FilterNotServed => RefusalKind::FilterNotServed,
        ErrorCode::CursorAhead => RefusalKind::CursorAhead,
        ErrorCode::Unauthenticated => RefusalKind::Unauthenticated,
        ErrorCode::NotEntitled => RefusalKind::NotEntitled,
        _ => RefusalKind::BadRequest,
    };
    let at = e.message_decoder();
    let message = String::from_utf8_lossy(e.message_slice(at)).into_owned();
    ClientError::Api {
        status: kind.http_status(),
        error: ApiError {
            code: kind.code().to_string(),
            message,
        },
    }
}

fn bad(what: &str) -> ClientError {
    ClientError::Protocol(format!("record with {what}"))
}

fn read_side(s: codec::side::Side) -> Result<Side, ClientError> {
    match s {
        codec::side::Side::Buy => Ok(Side::Buy),
        codec::side::Side::Sell => Ok(Side::Sell),
        _ => Err(bad("an unknown side")),
    }
}

/// The record a record frame carries, as the store holds it.
fn read_record(m: &Message<'_>) -> Result<Record, ClientError> {
    match m {
        Message::OrderState(o) => read_order_state(o),
        Message::TradeRecord(t) => {
            let fill = |order_id, account, cl_ord_id, leaves, filled| Fill {
                order_id: OrderId(order_id),
                account: AccountId(account),
                cl_ord_id: ClOrdId(cl_ord_id),
                qty_leaves: Qty(leaves),
                qty_filled: Qty(filled),
            };
            Ok(Record {
                core: t.core(),
                index: t.index(),
                ord: t.ord(),
                firms: [t.buy_firm().map(FirmId), t.sell_firm().map(FirmId)],
                event: Event::Trade {
                    trade_id: TradeId(t.trade_id()),
                    instrument: InstrumentId(t.instrument()),
                    price: Price(t.price()),
                    qty: Qty(t.qty()),
                    aggressor: read_side(t.aggressor())?,
                    buy: fill(
                        t.buy_order_id(),
                        t.buy_account(),
                        t.buy_cl_ord_id(),
                        t.buy_qty_leaves(),
                        t.buy_qty_filled(),
                    ),
                    sell: fill(
                        t.sell_order_id(),
                        t.sell_account(),
                        t.sell_cl_ord_id(),
                        t.sell_qty_leaves(),
                        t.sell_qty_filled(),
                    ),
                    auction: false,
                    ts_ns: t.ts_ns(),
                },
            })
        }
        Message::RejectRecord(j) => {
            let firm = j.firm().map(FirmId);
            Ok(Record {
                core: j.core(),
                index: j.index(),
                ord: j.ord(),
                firms: [firm, firm],
                event: Event::OrderRejected {
                    account: AccountId(j.account()),
                    cl_ord_id: ClOrdId(j.cl_ord_id()),
                    instrument: InstrumentId(j.instrument()),
                    reason: RejectReason::from_code(j.reason())
                        .ok_or_else(|| bad("an unknown reject reason"))?,
                    ts_ns: j.ts_ns(),
                },
            })
        }
        other => Err(ClientError::Protocol(format!(
            "{:?} among the records",
            other.template_id()
        ))),
    }
}

fn read_order_state(
    o: &codec::order_state_codec::OrderStateDecoder<'_>,
) -> Result<Record, ClientError> {
    use codec::order_log_action::OrderLogAction as A;
    use codec::order_status::OrderStatus as S;
    let action = match o.action() {
        A::New => OrderLogAction::New,
        A::Change => OrderLogAction::Change,
        A::Delete => OrderLogAction::Delete,
        _ => return Err(bad("an unknown action")),
    };
    let status = match o.status() {
        S::New => OrderStatus::New,
        S::PartiallyFilled => OrderStatus::PartiallyFilled,
        S::Filled => OrderStatus::Filled,
        S::Cancelled => OrderStatus::Cancelled,
        S::Replaced => OrderStatus::Replaced,
        S::Expired => OrderStatus::Expired,
        _ => return Err(bad("an unknown status")),
    };
    let firm = FirmId(o.firm());
    Ok(Record {
        core: o.core(),
        index: o.index(),
        ord: o.ord(),
        firms: [Some(firm), Some(firm)],
        event: Event::OrderLog(OrderLog {
            rec: o.rec(),
            seq: o.seq(),
            action,
            status,
            order_id: OrderId(o.order_id()),
            instrument: InstrumentId(o.instrument()),
            account: AccountId(o.account()),
            firm,
            cl_ord_id: ClOrdId(o.cl_ord_id()),
            side: read_side(o.side())?,
            price: Price(o.price()),
            qty_display: Qty(o.qty_display()),
            qty_leaves: Qty(o.qty_leaves()),
            qty_filled: Qty(o.qty_filled()),
            qty_total: Qty(o.qty_total()),
            ts_ns: o.ts_ns(),
        }),
    })
}
