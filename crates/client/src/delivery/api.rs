//! What both delivery fronts and their clients agree on: the request ([`PollRequest`]), the
//! answer ([`PollAnswer`], its [`AnswerHeader`] and the server's [`ServerTimings`]), the
//! refusals ([`RefusalKind`], [`ApiError`]) and the client's errors ([`ClientError`]);
//! cursors travel as lowercase hex over HTTP and as bytes over SBE.

use super::record::{Filter, Record};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Why a poll was refused, in terms both fronts translate (an HTTP status and code, an SBE
/// `ErrorCode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    BadRequest,
    CursorMalformed,
    CursorForeign,
    CursorTooOld,
    /// Too many polls in flight; retry after a pause.
    Busy,
    /// This connection polls more often than its limit; retry after a pause (the binary
    /// front answers `Busy` with this message).
    RateLimited,
    /// A read replica that has not yet read its primary's whole picture; retry after a
    /// pause or read the primary.
    CatchingUp,
    /// A filtered poll at a read replica that keeps no secondary indexes; filtered reads go
    /// to the primary.
    FilterNotServed,
    /// The cursor names a position past what the node has applied (after waiting `wait_us`
    /// for it to get there).
    CursorAhead,
    /// No credentials, or wrong ones, at a node that has credentials.
    Unauthenticated,
    /// The poll names a firm the credentials do not read (or they read none).
    NotEntitled,
}

impl RefusalKind {
    /// Every kind, in a fixed order (a server counts refusals per kind).
    pub const ALL: [RefusalKind; 11] = [
        RefusalKind::BadRequest,
        RefusalKind::CursorMalformed,
        RefusalKind::CursorForeign,
        RefusalKind::CursorTooOld,
        RefusalKind::Busy,
        RefusalKind::RateLimited,
        RefusalKind::CatchingUp,
        RefusalKind::FilterNotServed,
        RefusalKind::CursorAhead,
        RefusalKind::Unauthenticated,
        RefusalKind::NotEntitled,
    ];

    /// The code both fronts name the refusal by (`error.code` in JSON).
    pub fn code(self) -> &'static str {
        match self {
            RefusalKind::BadRequest => "bad_request",
            RefusalKind::CursorMalformed => "cursor_malformed",
            RefusalKind::CursorForeign => "cursor_foreign",
            RefusalKind::CursorTooOld => "cursor_too_old",
            RefusalKind::Busy => "busy",
            RefusalKind::RateLimited => "rate_limited",
            RefusalKind::CatchingUp => "catching_up",
            RefusalKind::FilterNotServed => "filter_not_served",
            RefusalKind::CursorAhead => "cursor_ahead",
            RefusalKind::Unauthenticated => "unauthenticated",
            RefusalKind::NotEntitled => "not_entitled",
        }
    }

    /// The HTTP status the HTTP front answers with (the binary client reports the same).
    pub fn http_status(self) -> u16 {
        match self {
            RefusalKind::BadRequest
            | RefusalKind::CursorMalformed
            | RefusalKind::FilterNotServed => 400,
            RefusalKind::CursorForeign | RefusalKind::CursorAhead => 409,
            RefusalKind::Unauthenticated => 401,
            RefusalKind::NotEntitled => 403,
            RefusalKind::CursorTooOld => 410,
            RefusalKind::RateLimited => 429,
            RefusalKind::Busy | RefusalKind::CatchingUp => 503,
        }
    }
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

/// One GetOrders request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollRequest {
    /// The cursor of the last answer; `None` reads a snapshot of the current state first.
    pub cursor: Option<String>,
    pub filter: Filter,
    pub limit: Option<usize>,
    pub wait_us: Option<u64>,
    pub min_rows: Option<usize>,
    /// Start at this time (ns since the epoch) instead of a cursor: HTTP only; the answer's
    /// cursor then serves either front.
    pub since_ns: Option<u64>,
}

impl PollRequest {
    /// The path and query string of this request.
    pub fn path(&self) -> String {
        let mut q = String::from("/v1/orders?");
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                let _ = write!(q, "{k}={v}&");
            }
        };
        add("cursor", self.cursor.clone());
        add("firm", self.filter.firm.map(|f| f.0.to_string()));
        add("account", self.filter.account.map(|a| a.0.to_string()));
        add(
            "instrument",
            self.filter.instrument.map(|i| i.0.to_string()),
        );
        add("limit", self.limit.map(|v| v.to_string()));
        add("wait_us", self.wait_us.map(|v| v.to_string()));
        add("min_rows", self.min_rows.map(|v| v.to_string()));
        add("since_ns", self.since_ns.map(|v| v.to_string()));
        q.pop();
        q
    }
}

/// One GetOrders answer.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct PollAnswer {
    pub header: AnswerHeader,
    pub records: Vec<Record>,
}

#[derive(Debug)]
pub enum ClientError {
    Io(std::io::Error),
    /// The server answered with an error (status and its JSON error).
    Api {
        status: u16,
        error: ApiError,
    },
    /// The answer is not what the API sends.
    Protocol(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Api { status, error } => {
                write!(f, "{status} {}: {}", error.code, error.message)
            }
            ClientError::Protocol(why) => write!(f, "unexpected answer: {why}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> ClientError {
        ClientError::Io(e)
    }
}

/// `waitUs` that asks for the node's default wait (binary front).
pub const WAIT_US_DEFAULT: u32 = u32::MAX;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Bytes as lowercase hex, the cursor's text form.
pub fn hex_text(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push(char::from(HEX[usize::from(b >> 4)]));
        text.push(char::from(HEX[usize::from(b & 15)]));
    }
    text
}

/// Lowercase hex back to bytes; `None` for an odd length or any other character.
pub fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}
