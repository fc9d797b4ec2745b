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
//!
//! A node with readers' credentials (`[access]`) wants a Logon first on each connection: it
//! checks the credentials once ([`crate::access::Gate`]) and answers LogonAck, or
//! DeliveryError(Unauthenticated) and closes; a GetOrders before a good Logon gets
//! DeliveryError(Unauthenticated) and the connection is closed. Every poll of the connection
//! then reads what its credentials may ([`crate::access::Reader`]). With `access.tls` the
//! front speaks TLS only: a connection that does not finish a handshake within
//! `header_read_timeout_ms` is closed before any byte of the protocol is read.

use crate::access::Reader;
use crate::cursor::{Cursor, CURSOR_BYTES_MAX};
use crate::node::{Front, Shared};
use crate::poll::{self, Asked, Refusal, RefusalKind, Selected};
use crate::record::{Filter, Record};
use bourse_core::{
    AccountId, Event, FirmId, InstrumentId, OrderLog, OrderLogAction, OrderStatus, Side,
};
use bourse_monitor::doorkeeper::Pass;
use bourse_wire::delivery::codec;
use bourse_wire::delivery::{self as wire, FrameDecoder, Message, FRAME_BYTES_MAX};
use bourse_wire::frame::encode_frame;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

const _: () = assert!(CURSOR_BYTES_MAX <= wire::CURSOR_BYTES_MAX as usize);

pub use bourse_client::delivery::api::WAIT_US_DEFAULT;
use bourse_client::delivery::binary::push_frame;

/// Serves binary connections until `stopped` changes, each admitted by the front's
/// doorkeeper (the venue's admission policy): a connection proves itself with each whole
/// request and waits again once answered, when it may be displaced for a newcomer.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let door = shared.counters.doorkeeper(Front::Binary, &shared.limits);
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
        let Some(pass) = door.admit(peer) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let mut stopped = stopped.clone();
        let tls = shared.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(async move {
            let idle = Duration::from_millis(shared.limits.header_read_timeout_ms);
            tokio::select! {
                _ = async {
                    match tls {
                        None => connection(stream, &shared, &pass).await,
                        Some(acceptor) => {
                            // A failed or late handshake closes the connection.
                            if let Ok(Ok(tls)) =
                                tokio::time::timeout(idle, acceptor.accept(stream)).await
                            {
                                connection(tls, &shared, &pass).await
                            }
                        }
                    }
                } => {}
                _ = pass.closed() => {}
                _ = stopped.changed() => {}
            }
        });
        // Lets the connections just admitted read their requests before the next accepts.
        tokio::task::yield_now().await;
    }
}

/// One connection: requests in, answers out, until the peer leaves, idles past the limit or
/// breaks the framing.
async fn connection<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, s: &Shared, pass: &Pass) {
    let idle = Duration::from_millis(s.limits.header_read_timeout_ms);
    let decoder = FrameDecoder::default();
    let mut inbuf = vec![0u8; FRAME_BYTES_MAX];
    let mut have = 0;
    let mut out = Vec::with_capacity(64 * 1024);
    let per_s = s.limits.polls_per_second_per_connection_max;
    let rate = bourse_monitor::rate::ConnectionRate::new(per_s);
    // Who this connection reads as: everyone at a node without credentials, else whom its
    // Logon named.
    let mut reader: Option<Reader> = s.gate.is_open().then_some(Reader::All);
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
        // A whole request: the connection is busy, and not displaced, until it is answered.
        let busy = pass.busy();
        out.clear();
        let keep = match frame {
            Ok((Ok(Frame::Logon(id, name, password)), used)) => {
                inbuf.copy_within(used..have, 0);
                have -= used;
                match s.gate.check(&name, &password).await {
                    Ok(r) => {
                        logon_ack(id, &r, &mut out);
                        reader = Some(r);
                        true
                    }
                    Err(r) => {
                        s.counters.refused(r.kind);
                        error_frame(id, &r, &mut out);
                        false
                    }
                }
            }
            Ok((Ok(Frame::Get(req)), used)) => {
                inbuf.copy_within(used..have, 0);
                have -= used;
                match (&reader, rate.take()) {
                    (None, _) => {
                        s.counters.polls.inc();
                        s.counters.polls_bad_request.inc();
                        let r = crate::access::unauthenticated(
                            "this node has credentials: send a Logon first on the connection",
                        );
                        s.counters.refused(r.kind);
                        error_frame(req.0, &r, &mut out);
                        false
                    }
                    (Some(reader), Ok(())) => {
                        answer(s, req, reader, &mut out).await;
                        true
                    }
                    (Some(_), Err(wait_ms)) => {
                        s.counters.polls.inc();
                        let r = Refusal::rate_limited(s, per_s, wait_ms);
                        s.counters.refused(r.kind);
                        error_frame(req.0, &r, &mut out);
                        true
                    }
                }
            }
            Ok((Err((id, why)), _)) => {
                s.counters.polls_bad_request.inc();
                s.counters.refused(RefusalKind::BadRequest);
                error_frame(id, &Refusal::bad_request(why), &mut out);
                false
            }
            Err(why) => {
                s.counters.polls_bad_request.inc();
                s.counters.refused(RefusalKind::BadRequest);
                let why = format!("not a delivery frame: {why}");
                error_frame(0, &Refusal::bad_request(why), &mut out);
                false
            }
        };
        if stream.write_all(&out).await.is_err() || stream.flush().await.is_err() || !keep {
            return;
        }
        drop(busy);
    }
}

/// A decoded GetOrders: request id, what was asked, the cursor (or why it is refused: a
/// refusal of the poll, after which the connection goes on).
type Request = (u64, Asked, Result<Option<Cursor>, Refusal>);

/// A request frame: a poll, or a Logon (request id, name, password).
enum Frame {
    Get(Request),
    Logon(u64, String, String),
}

/// What a frame asks, or (request id, why it is not a request).
fn request(m: &Message<'_>) -> Result<Frame, (u64, String)> {
    if let Message::Logon(l) = m {
        let mut l = *l;
        let id = l.request_id();
        let at = l.name_decoder();
        let name = String::from_utf8_lossy(l.name_slice(at)).into_owned();
        let at = l.password_decoder();
        let password = String::from_utf8_lossy(l.password_slice(at)).into_owned();
        return Ok(Frame::Logon(id, name, password));
    }
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
    Ok(Frame::Get((id, asked, cursor)))
}

/// LogonAck: whose records the credentials read.
fn logon_ack(id: u64, reader: &Reader, out: &mut Vec<u8>) {
    let firms: Vec<u8> = reader
        .firms()
        .unwrap_or(&[])
        .iter()
        .take(wire::LOGON_FIRMS_MAX)
        .flat_map(|f| f.0.to_le_bytes())
        .collect();
    push_frame(out, |b| {
        encode_frame(b, |mut e: codec::logon_ack_codec::LogonAckEncoder| {
            e.request_id(id)
                .all_firms(u8::from(reader.firms().is_none()));
            e.firms(&firms);
            e
        })
    });
}

async fn answer(s: &Shared, (id, asked, cursor): Request, reader: &Reader, out: &mut Vec<u8>) {
    let started = Instant::now();
    s.counters.polls.inc();
    let Ok(_permit) = s.polls.try_acquire() else {
        s.counters.polls_refused_busy.inc();
        s.counters.refused(RefusalKind::Busy);
        error_frame(id, &Refusal::busy(s), out);
        return;
    };
    let result = match cursor.and_then(|c| poll::check(asked, c, reader, s)) {
        Ok(p) => poll::select(s, &p, started)
            .await
            .map_err(|e| Refusal::from(&e)),
        Err(r) => Err(r),
    };
    match result {
        Ok(selected) => encode_answer(id, &selected, out),
        Err(r) => {
            s.counters.polls_bad_request.inc();
            s.counters.refused(r.kind);
            error_frame(id, &r, out);
        }
    }
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
        RefusalKind::CursorAhead => ErrorCode::CursorAhead,
        RefusalKind::Unauthenticated => ErrorCode::Unauthenticated,
        RefusalKind::NotEntitled => ErrorCode::NotEntitled,
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
            auction: _,
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
