//! The HTTP/JSON API: `GET /v1/orders` (GetOrders, a long poll) and `GET /v1/status`.
//!
//! `GET /v1/orders?cursor=&firm=&account=&instrument=&limit=&wait_us=&min_rows=` answers
//! `{"header":{...},"records":[...]}` with the header first (next cursor, count, oldest
//! record's time, the server's timings), and the next cursor also in the response header
//! `x-bourse-next-cursor`, so a client can ask again before it decodes the records. The poll
//! itself (limits, the wait for `min_rows`; tokio's timer rounds a deadline up to the next
//! millisecond) is [`crate::poll`]'s, shared with the binary front. Bad input gets a JSON
//! error naming what is wrong: 400 (bad parameter, unknown parameter, malformed cursor), 409
//! (foreign cursor), 410 (cursor too old), 429 with `Retry-After` (this connection polls
//! more often than `polls_per_second_per_connection_max`), 503 with `Retry-After` (too many
//! polls at once).
//!
//! A node with readers' credentials (`[access]`) answers every route only to them, as HTTP
//! Basic on each request (checked once and remembered: [`crate::access::Gate`]): 401
//! `unauthenticated` without them or with wrong ones, 403 `not_entitled` for a credential
//! that reads no delivery data or a poll naming a firm it does not read. A firm's reader gets
//! its own firm's records only ([`crate::access`]). With `access.tls` the front speaks HTTPS
//! only.
//!
//! Instead of a cursor a poll may name `since_ns`, a time: it then starts at each core's
//! first record at or after that time, from the cold data on disk where memory no longer
//! holds it (`[cold]`, [`crate::cold`]); 410 when nothing that old is kept. Its next cursor
//! is an ordinary one, good on the binary front too.

use crate::access::Reader;
use crate::cursor::Cursor;
use crate::node::{Front, Shared};
use crate::poll::{self, Asked, Refusal, RefusalKind, Selected};
use crate::record::Filter;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::Router;
use bourse_core::{AccountId, FirmId, InstrumentId};
use bourse_monitor::rate::ConnectionRate;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use crate::poll::ServerTimings;

/// The name of the response header that repeats the next cursor.
pub const NEXT_CURSOR_HEADER: &str = "x-bourse-next-cursor";
/// Request line and headers together may take at most this many bytes (the monitor's
/// accept loop enforces it).
pub use bourse_monitor::server::REQUEST_HEAD_BYTES_MAX;

/// GetOrders' parameters; any other parameter is refused.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollParams {
    pub cursor: Option<String>,
    pub firm: Option<u32>,
    pub account: Option<u32>,
    pub instrument: Option<u32>,
    pub limit: Option<usize>,
    pub wait_us: Option<u64>,
    pub min_rows: Option<usize>,
    /// Start at this time (ns since the epoch) instead of a cursor.
    pub since_ns: Option<u64>,
}

pub use bourse_client::delivery::api::{AnswerHeader, ApiError};

fn error(status: StatusCode, code: &str, message: String) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    let mut r = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn refused(r: &Refusal) -> Response {
    let status = StatusCode::from_u16(r.kind.http_status()).expect("refusal statuses are valid");
    let mut response = error(status, r.kind.code(), r.message.clone());
    if r.kind == RefusalKind::Unauthenticated {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"bourse delivery\""),
        );
    }
    response
}

/// The reader the request's credentials make (everyone reads everything at a node without
/// credentials); a refusal is counted.
async fn reader(s: &Shared, headers: &HeaderMap) -> Result<Reader, Refusal> {
    if s.gate.is_open() {
        return Ok(Reader::All);
    }
    let checked = match basic_credentials(headers) {
        Some((name, password)) => s.gate.check(&name, &password).await,
        None => Err(crate::access::unauthenticated(
            "credentials required (HTTP Basic)",
        )),
    };
    if let Err(r) = &checked {
        s.counters.refused(r.kind);
    }
    checked
}

fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    bourse_auth::http_basic(headers.get(header::AUTHORIZATION)?.to_str().ok()?)
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/orders", get(orders))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "not_found",
                "unknown path: the API is GET /v1/orders, GET /v1/status and GET /metrics".into(),
            )
        })
        .with_state(shared)
}

fn checked(p: PollParams, reader: &Reader, s: &Shared) -> Result<poll::Poll, Refusal> {
    let cursor = match (p.cursor.as_deref(), p.since_ns) {
        (Some(text), Some(_)) if !text.is_empty() => {
            return Err(Refusal::bad_request(
                "give either a cursor or since_ns, not both".into(),
            ))
        }
        (_, Some(ns)) => {
            let store = s.store.read().expect("store");
            Some(store.cursor_since(ns).map_err(|e| Refusal::from(&e))?)
        }
        (None | Some(""), None) => None,
        (Some(text), None) => Some(Cursor::decode(text).map_err(|e| Refusal::from(&e))?),
    };
    let asked = Asked {
        filter: Filter {
            firm: p.firm.map(FirmId),
            account: p.account.map(AccountId),
            instrument: p.instrument.map(InstrumentId),
        },
        limit: p.limit,
        wait_us: p.wait_us,
        min_rows: p.min_rows,
    };
    poll::check(asked, cursor, reader, s)
}

async fn orders(
    State(s): State<Arc<Shared>>,
    rate: Option<Extension<ConnectionRate>>,
    headers: HeaderMap,
    query: Result<Query<PollParams>, QueryRejection>,
) -> Response {
    let started = Instant::now();
    s.counters.polls.inc();
    if let Some(Extension(rate)) = rate {
        if let Err(wait_ms) = rate.take() {
            let r = Refusal::rate_limited(&s, rate.requests_per_s(), wait_ms);
            s.counters.refused(r.kind);
            return refused(&r);
        }
    }
    let reader = match reader(&s, &headers).await {
        Ok(r) => r,
        Err(r) => {
            s.counters.polls_bad_request.inc();
            return refused(&r);
        }
    };
    let Ok(_permit) = s.polls.try_acquire() else {
        s.counters.polls_refused_busy.inc();
        s.counters.refused(RefusalKind::Busy);
        return refused(&Refusal::busy(&s));
    };
    let checked = match query {
        Ok(Query(p)) => checked(p, &reader, &s),
        Err(e) => Err(Refusal::bad_request(e.body_text())),
    };
    let result = match checked {
        Ok(p) => poll::select(&s, &p, started)
            .await
            .map_err(|e| Refusal::from(&e)),
        Err(r) => Err(r),
    };
    match result {
        Ok(selected) => respond(selected),
        Err(r) => {
            s.counters.polls_bad_request.inc();
            s.counters.refused(r.kind);
            refused(&r)
        }
    }
}

fn respond(selected: Selected) -> Response {
    let header = AnswerHeader {
        next_cursor: selected.next.encode(),
        count: selected.records.len(),
        oldest_ts_ns: selected.oldest_ts_ns(),
        server: selected.timings,
    };
    let records = &selected.records;
    let mut body = Vec::with_capacity(256 + records.len() * 400);
    body.extend_from_slice(b"{\"header\":");
    serde_json::to_writer(&mut body, &header).expect("a header serialises");
    body.extend_from_slice(b",\"records\":[");
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        serde_json::to_writer(&mut body, r).expect("a record serialises");
    }
    body.extend_from_slice(b"]}");
    let cursor = HeaderValue::from_str(&header.next_cursor).expect("hex is a header value");
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::HeaderName::from_static(NEXT_CURSOR_HEADER), cursor),
        ],
        body,
    )
        .into_response()
}

async fn status(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = reader(&s, &headers).await {
        return refused(&r);
    }
    let cores = s.store.read().expect("store").stats();
    let feeds = s.feed_errors.lock().expect("feed errors").clone();
    let c = &s.counters;
    let role = match s.role {
        crate::node::Role::Primary => "primary",
        crate::node::Role::Replica { .. } => "replica",
    };
    axum::Json(serde_json::json!({
        "role": role,
        "ready": s.is_ready(),
        "serves_filters": s.role.serves_filters(),
        "cores": cores,
        "feed_errors": feeds,
        "polls": c.polls.get(),
        "polls_empty": c.polls_empty.get(),
        "rows_sent": c.rows_sent.get(),
        "polls_refused_busy": c.polls_refused_busy.get(),
        "polls_refused_rate": c.polls_refused_rate.get(),
        "polls_bad_request": c.polls_bad_request.get(),
        "refusals": c.refusals_by_reason(),
        "identity": format!("{:016x}", s.store.read().expect("store").deployment()),
        "credentials": !s.gate.is_open(),
        "tls": s.tls.is_some(),
        "records_written": c.records_written.get(),
        "connections": {"http": c.connections_http.get(), "binary": c.connections_binary.get()},
        "limits": s.limits,
    }))
    .into_response()
}

/// The node's figures in the Prometheus text format.
async fn metrics(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = reader(&s, &headers).await {
        return refused(&r);
    }
    let mut text = String::with_capacity(8 * 1024);
    s.counters.registry.render(&mut text);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

/// Serves until `stopped` changes, on the venue's HTTP accept loop with this front's
/// admission (`bourse_monitor::server::serve_admitted`).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, stopped: watch::Receiver<bool>) {
    let door = shared.counters.doorkeeper(Front::Http, &shared.limits);
    let options = bourse_monitor::server::ServeOptions {
        header_read_timeout_ms: shared.limits.header_read_timeout_ms,
        tls: shared.tls.clone(),
        send_buffer_bytes: None,
    };
    bourse_monitor::server::serve_admitted(listener, router(shared), door, options, stopped).await
}
