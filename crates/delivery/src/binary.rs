//! The binary front: GetOrders as SBE over TCP (`schemas/bourse-delivery.xml`, decoded and
//! bounds-checked by `bourse_wire::delivery`), and [`BinaryClient`], its Rust client.
//!
//! One request at a time per connection: the client sends GetOrders, the server answers with
//! OrdersHeader and then exactly `count` record frames (OrderState, TradeRecord,
//! RejectRecord), or with DeliveryError. The poll is [`crate::poll`]'s, the same as the HTTP
//! front's, so both answer the same records for the same cursor, and a cursor is the same
//! bytes on both (the HTTP API carries them in hex). A refused poll (bad parameter, cursor,
//! busy) gets DeliveryError and the connection stays open; bytes that are not a valid frame
//! get DeliveryError(BadRequest) and the connection is closed, since its framing is lost. A
//! connection must send its next request within `header_read_timeout_ms`.

use crate::client::{ClientError, PollAnswer, PollRequest};
use crate::cursor::{hex_bytes, hex_text, Cursor, CURSOR_BYTES_MAX};
use crate::node::{Front, Shared};
use crate::poll::{self, Asked, Refusal, RefusalKind, Selected, ServerTimings};
use crate::record::{Filter, Record};
use crate::server::{AnswerHeader, ApiError};
use bourse_core::{
    AccountId, ClOrdId, Event, Fill, FirmId, InstrumentId, OrderId, OrderLog, OrderLogAction,
    OrderStatus, Price, Qty, RejectReason, Side, TradeId,
};
use bourse_wire::delivery::codec;
use bourse_wire::delivery::{self as wire, FrameDecoder, Message, FRAME_BYTES_MAX};
use bourse_wire::frame::encode_frame;
use bourse_wire::Error as WireError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const _: () = assert!(CURSOR_BYTES_MAX <= wire::CURSOR_BYTES_MAX as usize);

/// `waitUs` that asks for the node's default wait.
pub const WAIT_US_DEFAULT: u32 = u32::MAX;

/// Serves binary connections until `stopped` changes; connections past `connections_max`,
/// or past `connections_per_address_max` from one address, are closed on accept.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let slots = shared.counters.slots(Front::Binary, &shared.limits);
    loop {
        let accepted = tokio::select! {
            _ = stopped.changed() => return,
            r = listener.accept() => r,
        };
        let Ok((stream, peer)) = accepted else {
            // Out of file descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(slot) = slots.try_take(peer.ip()) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::select! {
                _ = connection(stream, &shared) => {}
                _ = stopped.changed() => {}
            }
        });
    }
}

/// One connection: requests in, answers out, until the peer leaves, idles past the limit or
/// breaks the framing.
async fn connection(mut stream: TcpStream, s: &Shared) {
    let idle = Duration::from_millis(s.limits.header_read_timeout_ms);
    let decoder = FrameDecoder::default();
    let mut inbuf = vec![0u8; FRAME_BYTES_MAX];
    let mut have = 0;
    let mut out = Vec::with_capacity(64 * 1024);
    let per_s = s.limits.polls_per_second_per_connection_max;
    let rate = bourse_monitor::rate::ConnectionRate::new(per_s);
    loop {
        let frame = loop {
            match decoder.decode(&inbuf[..have]) {
                Ok(Some(d)) => break Ok((request(&d.message), d.frame_bytes)),
                Ok(None) => {}
                Err(e) => break Err(e.to_string()),
            }
            // A frame never exceeds the buffer: the decoder refuses longer ones first.
            match tokio::time::timeout(idle, stream.read(&mut inbuf[have..])).await {
                Ok(Ok(n)) if n > 0 => have += n,
                _ => return,
            }
        };
        out.clear();
        let keep = match frame {
            Ok((Ok(req), used)) => {
                inbuf.copy_within(used..have, 0);
                have -= used;
                match rate.take() {
                    Ok(()) => answer(s, req, &mut out).await,
                    Err(wait_ms) => {
                        s.counters.polls.inc();
                        error_frame(req.0, &Refusal::rate_limited(s, per_s, wait_ms), &mut out);
                    }
                }
                true
            }
            Ok((Err((id, why)), _)) => {
                s.counters.polls_bad_request.inc();
                error_frame(id, &Refusal::bad_request(why), &mut out);
                false
            }
            Err(why) => {
                s.counters.polls_bad_request.inc();
                let why = format!("not a delivery frame: {why}");
                error_frame(0, &Refusal::bad_request(why), &mut out);
                false
            }
        };
        if stream.write_all(&out).await.is_err() || !keep {
            return;
        }
    }
}

/// A decoded GetOrders: request id, what was asked, the cursor (or why it is refused: a
/// refusal of the poll, after which the connection goes on).
type Request = (u64, Asked, Result<Option<Cursor>, Refusal>);

/// What a frame asks, or (request id, why it is not a request).
fn request(m: &Message<'_>) -> Result<Request, (u64, String)> {
    let Message::GetOrders(g) = m else {
        return Err((0, format!("{:?} is not a request", m.template_id())));
    };
    let mut g = *g;
    let id = g.request_id();
    let at = g.cursor_decoder();
    let bytes = g.cursor_slice(at);
    let cursor = if bytes.is_empty() {
        Ok(None)
    } else {
        Cursor::from_bytes(bytes)
            .map(Some)
            .map_err(|e| Refusal::from(&e))
    };
    let asked = Asked {
        filter: Filter {
            firm: g.firm().map(FirmId),
            account: g.account().map(AccountId),
            instrument: g.instrument().map(InstrumentId),
        },
        limit: (g.limit() != 0).then_some(g.limit() as usize),
        wait_us: (g.wait_us() != WAIT_US_DEFAULT).then_some(u64::from(g.wait_us())),
        min_rows: (g.min_rows() != 0).then_some(g.min_rows() as usize),
    };
    Ok((id, asked, cursor))
}

async fn answer(s: &Shared, (id, asked, cursor): Request, out: &mut Vec<u8>) {
    let started = Instant::now();
    s.counters.polls.inc();
    let Ok(_permit) = s.polls.try_acquire() else {
        s.counters.polls_refused_busy.inc();
        error_frame(id, &Refusal::busy(s), out);
        return;
    };
    let result = match cursor.and_then(|c| poll::check(asked, c, s)) {
        Ok(p) => poll::select(s, &p, started)
            .await
            .map_err(|e| Refusal::from(&e)),
        Err(r) => Err(r),
    };
    match result {
        Ok(selected) => encode_answer(id, &selected, out),
        Err(r) => {
            s.counters.polls_bad_request.inc();
            error_frame(id, &r, out);
        }
    }
}

/// Appends one frame to `out`, written by `encode` (an `encode_frame` call) into room for the
/// largest frame.
fn push_frame(out: &mut Vec<u8>, encode: impl FnOnce(&mut [u8]) -> Result<usize, WireError>) {
    let start = out.len();
    out.resize(start + FRAME_BYTES_MAX, 0);
    let n = encode(&mut out[start..]).expect("a delivery frame fits its maximum");
    out.truncate(start + n);
}

fn error_code(kind: RefusalKind) -> codec::error_code::ErrorCode {
    use codec::error_code::ErrorCode;
    match kind {
        RefusalKind::BadRequest => ErrorCode::BadRequest,
        RefusalKind::CursorMalformed => ErrorCode::CursorMalformed,
        RefusalKind::CursorForeign => ErrorCode::CursorForeign,
        RefusalKind::CursorTooOld => ErrorCode::CursorTooOld,
        RefusalKind::Busy | RefusalKind::RateLimited => ErrorCode::Busy,
        RefusalKind::CatchingUp => ErrorCode::CatchingUp,
        RefusalKind::FilterNotServed => ErrorCode::FilterNotServed,
    }
}

fn error_frame(id: u64, r: &Refusal, out: &mut Vec<u8>) {
    let text = r.message.as_bytes();
    let text = &text[..text.len().min(usize::from(wire::ERROR_TEXT_BYTES_MAX))];
    push_frame(out, |b| {
        encode_frame(
            b,
            |mut e: codec::delivery_error_codec::DeliveryErrorEncoder| {
                e.request_id(id).code(error_code(r.kind));
                e.message(text);
                e
            },
        )
    });
}

fn us32(us: u64) -> u32 {
    u32::try_from(us).unwrap_or(u32::MAX)
}

fn encode_answer(id: u64, selected: &Selected, out: &mut Vec<u8>) {
    let cursor = selected.next.to_bytes();
    let t = selected.timings;
    push_frame(out, |b| {
        encode_frame(
            b,
            |mut e: codec::orders_header_codec::OrdersHeaderEncoder| {
                e.request_id(id)
                    .oldest_ts_ns_opt(selected.oldest_ts_ns())
                    .count(selected.records.len() as u32);
                e.total_us(us32(t.total_us))
                    .select_us(us32(t.select_us))
                    .selects(t.selects);
                e.next_cursor(&cursor);
                e
            },
        )
    });
    for r in &selected.records {
        encode_record(r, out);
    }
}

fn side(s: Side) -> codec::side::Side {
    match s {
        Side::Buy => codec::side::Side::Buy,
        Side::Sell => codec::side::Side::Sell,
    }
}

fn encode_record(r: &Record, out: &mut Vec<u8>) {
    match &r.event {
        Event::OrderLog(l) => encode_order_state(r, l, out),
        Event::Trade {
            trade_id,
            instrument,
            price,
            qty,
            aggressor,
            buy,
            sell,
            ts_ns,
        } => push_frame(out, |b| {
            encode_frame(b, |mut e: codec::trade_record_codec::TradeRecordEncoder| {
                e.index(r.index)
                    .trade_id(trade_id.0)
                    .price(price.0)
                    .qty(qty.0)
                    .ts_ns(*ts_ns);
                e.buy_order_id(buy.order_id.0)
                    .buy_cl_ord_id(buy.cl_ord_id.0)
                    .buy_qty_leaves(buy.qty_leaves.0)
                    .buy_qty_filled(buy.qty_filled.0);
                e.sell_order_id(sell.order_id.0)
                    .sell_cl_ord_id(sell.cl_ord_id.0)
                    .sell_qty_leaves(sell.qty_leaves.0)
                    .sell_qty_filled(sell.qty_filled.0);
                e.core(r.core).ord(r.ord).instrument(instrument.0);
                e.buy_account(buy.account.0).sell_account(sell.account.0);
                e.buy_firm_opt(r.firms[0].map(|f| f.0))
                    .sell_firm_opt(r.firms[1].map(|f| f.0))
                    .aggressor(side(*aggressor));
                e
            })
        }),
        Event::OrderRejected {
            account,
            cl_ord_id,
            instrument,
            reason,
            ts_ns,
        } => push_frame(out, |b| {
            encode_frame(
                b,
                |mut e: codec::reject_record_codec::RejectRecordEncoder| {
                    e.index(r.index).cl_ord_id(cl_ord_id.0).ts_ns(*ts_ns);
                    e.core(r.core).ord(r.ord).instrument(instrument.0);
                    e.account(account.0)
                        .firm_opt(r.firms[0].map(|f| f.0))
                        .reason(*reason as u16);
                    e
                },
            )
        }),
        // The store keeps no other event (see `record::is_kept`).
        other => unreachable!("a stored record is never {other:?}"),
    }
}

fn encode_order_state(r: &Record, l: &OrderLog, out: &mut Vec<u8>) {
    use codec::order_log_action::OrderLogAction as A;
    use codec::order_status::OrderStatus as S;
    let action = match l.action {
        OrderLogAction::New => A::New,
        OrderLogAction::Change => A::Change,
        OrderLogAction::Delete => A::Delete,
    };
    let status = match l.status {
        OrderStatus::New => S::New,
        OrderStatus::PartiallyFilled => S::PartiallyFilled,
        OrderStatus::Filled => S::Filled,
        OrderStatus::Cancelled => S::Cancelled,
        OrderStatus::Replaced => S::Replaced,
        OrderStatus::Expired => S::Expired,
    };
    push_frame(out, |b| {
        encode_frame(b, |mut e: codec::order_state_codec::OrderStateEncoder| {
            e.index(r.index)
                .rec(l.rec)
                .seq(l.seq)
                .order_id(l.order_id.0);
            e.cl_ord_id(l.cl_ord_id.0)
                .price(l.price.0)
                .qty_display(l.qty_display.0);
            e.qty_leaves(l.qty_leaves.0)
                .qty_filled(l.qty_filled.0)
                .qty_total(l.qty_total.0)
                .ts_ns(l.ts_ns);
            e.core(r.core)
                .ord(r.ord)
                .instrument(l.instrument.0)
                .account(l.account.0)
                .firm(l.firm.0);
            e.action(action).status(status).side(side(l.side));
            e
        })
    });
}

/// A Rust client of the binary front: one connection, one request at a time. It takes the
/// same [`PollRequest`] and gives the same [`PollAnswer`] as the HTTP client (cursors in
/// hex), so a program can switch fronts without other change.
pub struct BinaryClient {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    next_request_id: u64,
    inbuf: Vec<u8>,
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
            let s = TcpStream::connect(self.addr).await?;
            s.set_nodelay(true)?;
            self.stream = Some(s);
            self.inbuf.clear();
        }
        let result = self.exchange(&out, id).await;
        if matches!(result, Err(ClientError::Io(_) | ClientError::Protocol(_))) {
            self.stream = None;
        }
        result
    }

    async fn exchange(&mut self, request: &[u8], id: u64) -> Result<PollAnswer, ClientError> {
        let stream = self.stream.as_mut().expect("connected");
        stream.write_all(request).await?;
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
