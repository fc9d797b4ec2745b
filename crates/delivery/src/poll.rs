//! One GetOrders, whichever front it came through (HTTP/JSON in [`crate::server`], SBE over
//! TCP in [`crate::binary`]): the parameters a client may give ([`Asked`]), their check
//! against the node's limits ([`check`]), the reasons a poll is refused ([`Refusal`]), and
//! the select-and-wait that answers it ([`select`]).
//!
//! When fewer than `min_rows` records are ready, a poll waits up to `wait_us` for more,
//! waking on every entry the feeds write. It holds no lock while it waits: the read lock is
//! taken only to copy out at most `limit` records.

use crate::access::Reader;
use crate::cursor::{Cursor, CursorError};
use crate::node::Shared;
use crate::record::{Filter, Record};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a client may ask of one poll, before it is checked; `None` takes the node's default.
#[derive(Clone, Copy, Debug, Default)]
pub struct Asked {
    pub filter: Filter,
    pub limit: Option<usize>,
    pub wait_us: Option<u64>,
    pub min_rows: Option<usize>,
}

pub use bourse_client::delivery::api::RefusalKind;

/// A refused poll: what kind, and a message naming what is wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub message: String,
}

impl Refusal {
    pub fn bad_request(message: String) -> Refusal {
        Refusal {
            kind: RefusalKind::BadRequest,
            message,
        }
    }

    pub fn busy(s: &Shared) -> Refusal {
        Refusal {
            kind: RefusalKind::Busy,
            message: format!(
                "more than {} polls at once; retry after a pause",
                s.limits.polls_in_flight_max
            ),
        }
    }
}

impl Refusal {
    /// A poll over a connection that asked more often than its limit: counted, and what to
    /// do.
    pub fn rate_limited(s: &Shared, per_s: u32, wait_ms: u32) -> Refusal {
        s.counters.polls_refused_rate.inc();
        Refusal {
            kind: RefusalKind::RateLimited,
            message: format!(
                "this connection polls more than {per_s} times a second; retry in {wait_ms} ms \
                 (a poll with wait_us waits for data instead of asking again)"
            ),
        }
    }
}

impl From<&CursorError> for Refusal {
    fn from(e: &CursorError) -> Refusal {
        let kind = match e {
            CursorError::Malformed(_) => RefusalKind::CursorMalformed,
            CursorError::Foreign(_) => RefusalKind::CursorForeign,
            CursorError::TooOld { .. } => RefusalKind::CursorTooOld,
            CursorError::Ahead { .. } => RefusalKind::CursorAhead,
        };
        Refusal {
            kind,
            message: e.to_string(),
        }
    }
}

/// A checked poll.
#[derive(Clone, Debug)]
pub struct Poll {
    pub cursor: Option<Cursor>,
    /// What was asked, narrowed to what the reader may read ([`Reader::entitle`]).
    pub filter: Filter,
    /// A firm's reader: the firms whose side of a trade it sees in full.
    pub firms: Option<Vec<bourse_core::FirmId>>,
    pub limit: usize,
    pub wait: Duration,
    pub min_rows: usize,
}

/// Checks what a client asked against the node's limits and what `reader` may read.
pub fn check(
    asked: Asked,
    cursor: Option<Cursor>,
    reader: &Reader,
    s: &Shared,
) -> Result<Poll, Refusal> {
    let l = &s.limits;
    let filter = reader.entitle(asked.filter)?;
    let limit = asked.limit.unwrap_or(l.rows_per_answer_default);
    if limit == 0 || limit > l.rows_per_answer_max {
        return Err(Refusal::bad_request(format!(
            "limit {limit} is outside 1..={}",
            l.rows_per_answer_max
        )));
    }
    let wait_us = asked.wait_us.unwrap_or(l.wait_us_default);
    if wait_us > l.wait_us_max {
        return Err(Refusal::bad_request(format!(
            "wait_us {wait_us} is above the most a poll may wait, {}",
            l.wait_us_max
        )));
    }
    if !s.role.serves_filters() && !filter.is_empty() {
        return Err(Refusal {
            kind: RefusalKind::FilterNotServed,
            message: "this node is a read replica without secondary indexes: it answers \
                      unfiltered polls only; send filtered polls to its primary"
                .into(),
        });
    }
    if !s.is_ready() {
        return Err(Refusal {
            kind: RefusalKind::CatchingUp,
            message: "this read replica has not yet read its primary's current state; \
                      retry after a pause, or poll the primary"
                .into(),
        });
    }
    let min_rows = asked.min_rows.unwrap_or(1);
    if min_rows > limit {
        return Err(Refusal::bad_request(format!(
            "min_rows {min_rows} is above limit {limit}"
        )));
    }
    Ok(Poll {
        cursor,
        filter,
        firms: reader.firms().map(<[_]>::to_vec),
        limit,
        wait: Duration::from_micros(wait_us),
        min_rows,
    })
}

pub use bourse_client::delivery::api::ServerTimings;

/// One poll's answer: its records in cursor order, the cursor after them, the timings.
pub struct Selected {
    pub records: Vec<Record>,
    pub next: Cursor,
    pub timings: ServerTimings,
}

impl Selected {
    /// The time stamp of the oldest record (`None` when empty).
    pub fn oldest_ts_ns(&self) -> Option<u64> {
        self.records.iter().map(Record::ts_ns).min()
    }
}

/// Counts one answer: empty or not, its records, their lag, its time.
fn count_answer(s: &Shared, records: &[Record], total: Duration) {
    let c = &s.counters;
    if records.is_empty() {
        c.polls_empty.inc();
    }
    c.rows_sent.add(records.len() as u64);
    c.answer.observe(total);
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    for r in records {
        c.lag.observe_ns(now_ns.saturating_sub(r.ts_ns()));
    }
}

/// Selects, and while fewer than `min_rows` are ready and the deadline has not passed, waits
/// for the feeds' next write and selects again. A cursor ahead of what the node has applied
/// waits the same way for the node to get there, and is refused at the deadline. Counts the
/// answer; a firm's reader gets each trade with the other side withheld.
pub async fn select(s: &Shared, poll: &Poll, started: Instant) -> Result<Selected, CursorError> {
    let deadline = tokio::time::Instant::from_std(started + poll.wait);
    let mut changed: watch::Receiver<u64> = s.changed.subscribe();
    let mut applied: watch::Receiver<u64> = s.applied.subscribe();
    let mut timings = ServerTimings::default();
    loop {
        changed.borrow_and_update();
        applied.borrow_and_update();
        let t = Instant::now();
        let resolved = {
            let store = s.store.read().expect("store");
            store.resolve(poll.cursor.as_ref()).map(|start| {
                let a = store.query_start(&start, &poll.filter, poll.limit);
                let next = store.cursor_after(&start, &a.next);
                (a, next)
            })
        };
        let (mut answer, next) = match resolved {
            Ok(got) => got,
            Err(CursorError::Ahead { .. }) if tokio::time::Instant::now() < deadline => {
                // Entries that write no record move the node along too.
                let _ = tokio::time::timeout_at(deadline, applied.changed()).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Some(firms) = &poll.firms {
            for r in &mut answer.records {
                *r = r.seen_by(firms);
            }
        }
        let select = t.elapsed();
        s.counters.select.observe(select);
        timings.select_us += select.as_micros() as u64;
        timings.selects += 1;
        let ready = answer.records.len() >= poll.min_rows;
        if ready || tokio::time::Instant::now() >= deadline {
            let total = started.elapsed();
            timings.total_us = total.as_micros() as u64;
            count_answer(s, &answer.records, total);
            return Ok(Selected {
                records: answer.records,
                next,
                timings,
            });
        }
        // A timeout or a closed channel: select once more and answer with what there is.
        let _ = tokio::time::timeout_at(deadline, changed.changed()).await;
    }
}
