//! The HTTP/JSON API: `GET /v1/orders` (GetOrders, a long poll) and `GET /v1/status`.
//!
//! `GET /v1/orders?cursor=&firm=&account=&instrument=&limit=&wait_us=&min_rows=` answers
//! `{"header":{...},"records":[...]}` with the header first (next cursor, count, oldest
//! record's time, the server's timings), and the next cursor also in the response header
//! `x-bourse-next-cursor`, so a client can ask again before it decodes the records. When
//! fewer than `min_rows` (default 1) records are ready, the poll waits up to `wait_us`
//! (default 500 µs; tokio's timer rounds a deadline up to the next millisecond) for more,
//! waking on every entry the feeds write. It holds no lock while it waits: the read lock is
//! taken only to copy out at most `limit` records. Bad input gets a JSON error naming what is
//! wrong: 400 (bad parameter, unknown parameter, malformed cursor), 409 (foreign cursor), 410
//! (cursor too old), 503 with `Retry-After` (too many polls at once).

use crate::cursor::{Cursor, CursorError};
use crate::node::Shared;
use crate::record::Filter;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bourse_core::{AccountId, FirmId, InstrumentId};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

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
}

/// The server's own timings of one poll.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerTimings {
    /// From the request's arrival to the answer, waiting included.
    pub total_us: u64,
    /// Time spent selecting records (under the read lock).
    pub select_us: u64,
    /// Selects made (1, plus one per wake-up while waiting for `min_rows`).
    pub selects: u32,
}

/// The header that opens every answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerHeader {
    pub next_cursor: String,
    pub count: usize,
    /// The time stamp of the oldest record in the answer (`None` when empty).
    pub oldest_ts_ns: Option<u64>,
    pub server: ServerTimings,
}

/// An error answer: `{"error":{"code":..., "message":...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: String,
    pub message: String,
}

fn error(status: StatusCode, code: &str, message: String) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    let mut r = (status, axum::Json(body)).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// A refused request: status, error code, message.
type Refusal = (StatusCode, &'static str, String);

fn cursor_refusal(e: &CursorError) -> Refusal {
    let (status, code) = match e {
        CursorError::Malformed(_) => (StatusCode::BAD_REQUEST, "cursor_malformed"),
        CursorError::Foreign(_) => (StatusCode::CONFLICT, "cursor_foreign"),
        CursorError::TooOld { .. } => (StatusCode::GONE, "cursor_too_old"),
    };
    (status, code, e.to_string())
}

fn cursor_error(e: &CursorError) -> Response {
    let (status, code, message) = cursor_refusal(e);
    error(status, code, message)
}

pub fn router(shared: Arc<Shared>) -> Router {
    let polls = Arc::new(Semaphore::new(shared.limits.polls_in_flight_max));
    Router::new()
        .route(
            "/v1/orders",
            get(move |state, query| orders(state, query, polls.clone())),
        )
        .route("/v1/status", get(status))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "not_found",
                "unknown path: the API is GET /v1/orders and GET /v1/status".into(),
            )
        })
        .with_state(shared)
}

/// Checked parameters of one poll.
struct Poll {
    cursor: Option<Cursor>,
    filter: Filter,
    limit: usize,
    wait: Duration,
    min_rows: usize,
}

fn check(p: PollParams, s: &Shared) -> Result<Poll, Refusal> {
    let l = &s.limits;
    let bad = |m: String| (StatusCode::BAD_REQUEST, "bad_request", m);
    let limit = p.limit.unwrap_or(l.rows_per_answer_default);
    if limit == 0 || limit > l.rows_per_answer_max {
        return Err(bad(format!(
            "limit {limit} is outside 1..={}",
            l.rows_per_answer_max
        )));
    }
    let wait_us = p.wait_us.unwrap_or(l.wait_us_default);
    if wait_us > l.wait_us_max {
        return Err(bad(format!(
            "wait_us {wait_us} is above the most a poll may wait, {}",
            l.wait_us_max
        )));
    }
    let min_rows = p.min_rows.unwrap_or(1);
    if min_rows > limit {
        return Err(bad(format!("min_rows {min_rows} is above limit {limit}")));
    }
    let cursor = match p.cursor.as_deref() {
        None | Some("") => None,
        Some(text) => Some(Cursor::decode(text).map_err(|e| cursor_refusal(&e))?),
    };
    Ok(Poll {
        cursor,
        filter: Filter {
            firm: p.firm.map(FirmId),
            account: p.account.map(AccountId),
            instrument: p.instrument.map(InstrumentId),
        },
        limit,
        wait: Duration::from_micros(wait_us),
        min_rows,
    })
}

async fn orders(
    State(s): State<Arc<Shared>>,
    query: Result<Query<PollParams>, QueryRejection>,
    polls: Arc<Semaphore>,
) -> Response {
    let started = Instant::now();
    s.counters.polls.fetch_add(1, Ordering::Relaxed);
    let Ok(_permit) = polls.try_acquire() else {
        s.counters
            .polls_refused_busy
            .fetch_add(1, Ordering::Relaxed);
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!(
                "more than {} polls at once; retry after a pause",
                s.limits.polls_in_flight_max
            ),
        );
    };
    let poll = match query {
        Ok(Query(p)) => check(p, &s),
        Err(e) => Err((StatusCode::BAD_REQUEST, "bad_request", e.body_text())),
    };
    let poll = match poll {
        Ok(p) => p,
        Err((status, code, message)) => {
            s.counters.polls_bad_request.fetch_add(1, Ordering::Relaxed);
            return error(status, code, message);
        }
    };
    match answer(&s, &poll, started).await {
        Ok(r) => r,
        Err(e) => {
            s.counters.polls_bad_request.fetch_add(1, Ordering::Relaxed);
            cursor_error(&e)
        }
    }
}

/// Selects, and while fewer than `min_rows` are ready and the deadline has not passed, waits
/// for the feeds' next write and selects again.
async fn answer(s: &Shared, poll: &Poll, started: Instant) -> Result<Response, CursorError> {
    let deadline = tokio::time::Instant::from_std(started + poll.wait);
    let mut changed: watch::Receiver<u64> = s.changed.subscribe();
    let mut timings = ServerTimings::default();
    loop {
        changed.borrow_and_update();
        let t = Instant::now();
        let (answer, next) = {
            let store = s.store.read().expect("store");
            let from = store.resolve(poll.cursor.as_ref())?;
            let a = store.query(&from, &poll.filter, poll.limit);
            let next = store.cursor(&a.next).encode();
            (a, next)
        };
        timings.select_us += t.elapsed().as_micros() as u64;
        timings.selects += 1;
        let ready = answer.records.len() >= poll.min_rows;
        if ready || tokio::time::Instant::now() >= deadline {
            timings.total_us = started.elapsed().as_micros() as u64;
            return Ok(respond(s, answer.records, next, timings));
        }
        // A timeout or a closed channel: select once more and answer with what there is.
        let _ = tokio::time::timeout_at(deadline, changed.changed()).await;
    }
}

fn respond(
    s: &Shared,
    records: Vec<crate::record::Record>,
    next: String,
    timings: ServerTimings,
) -> Response {
    let c = &s.counters;
    if records.is_empty() {
        c.polls_empty.fetch_add(1, Ordering::Relaxed);
    }
    c.rows_sent
        .fetch_add(records.len() as u64, Ordering::Relaxed);
    let header = AnswerHeader {
        next_cursor: next,
        count: records.len(),
        oldest_ts_ns: records.iter().map(|r| r.ts_ns()).min(),
        server: timings,
    };
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

async fn status(State(s): State<Arc<Shared>>) -> Response {
    let cores = s.store.read().expect("store").stats();
    let feeds = s.feed_errors.lock().expect("feed errors").clone();
    let c = &s.counters;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    axum::Json(serde_json::json!({
        "cores": cores,
        "feed_errors": feeds,
        "polls": n(&c.polls),
        "polls_empty": n(&c.polls_empty),
        "rows_sent": n(&c.rows_sent),
        "polls_refused_busy": n(&c.polls_refused_busy),
        "polls_bad_request": n(&c.polls_bad_request),
        "limits": s.limits,
    }))
    .into_response()
}

/// Serves until `stopped` changes, on the monitor's accept loop with this node's limits
/// (`bourse_monitor::server::serve_limited`).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, stopped: watch::Receiver<bool>) {
    let connections_max = shared.limits.connections_max;
    let header_read_timeout_ms = shared.limits.header_read_timeout_ms;
    bourse_monitor::server::serve_limited(
        listener,
        router(shared),
        connections_max,
        header_read_timeout_ms,
        stopped,
    )
    .await
}
