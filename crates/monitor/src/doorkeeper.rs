//! The admission policy ([`bourse_admission::Admission`]) for a listener served by tokio tasks:
//! the admin API, delivery's fronts, clearing's HTTP API, the dashboard and `/metrics`, a
//! node's port. The accept loop asks [`Doorkeeper::admit`] for a [`Pass`] before it spawns a
//! connection's task; the task races its work against [`Pass::closed`] (displaced to make
//! room, or past its deadline as a stranger) and tells the pass when the connection proves
//! itself ([`Pass::proven`]) and when it waits again ([`Pass::waiting`], an HTTP connection
//! kept alive between requests). Refusals are counted by reason as
//! `bourse_listener_refusals_total{listener, reason}`, and logged (the first few of each
//! reason, then one in [`REFUSALS_LOGGED_EVERY`]).

use crate::metrics::{Counter, Gauge, Registry};
use bourse_admission::{Admission, Limits, Refusal};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// After the first [`REFUSALS_LOGGED_FIRST`] refusals of a reason, one in this many is logged.
pub const REFUSALS_LOGGED_EVERY: u64 = 1_000;
/// Refusals of each reason logged one by one before thinning out.
pub const REFUSALS_LOGGED_FIRST: u64 = 10;

/// One listener's admission: the policy's table, the open connections' close signals, and the
/// counters. Cloning shares it (several listeners may share one budget).
#[derive(Clone, Debug)]
pub struct Doorkeeper {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    listener: String,
    table: Mutex<Table>,
    started: Instant,
    open_gauge: Gauge,
    /// By [`Refusal`] as index.
    refused: Vec<Counter>,
    requests_per_s: Option<u32>,
}

#[derive(Debug)]
struct Table {
    admission: Admission,
    closers: HashMap<u64, Arc<Notify>>,
}

impl Doorkeeper {
    /// The doorkeeper of `listener` (its name in logs and in the `listener` label) under
    /// `limits`; its counters are registered in `registry` if given (else read them with
    /// [`Doorkeeper::refused`]).
    pub fn new(listener: &str, limits: Limits, registry: Option<&Registry>) -> Doorkeeper {
        let (open_gauge, refused) = match registry {
            Some(r) => (
                r.gauge(
                    crate::names::LISTENER_CONNECTIONS_OPEN,
                    "Connections open at a listener.",
                    &[("listener", listener)],
                ),
                Refusal::ALL
                    .iter()
                    .map(|why| {
                        r.counter(
                            crate::names::LISTENER_REFUSALS_TOTAL,
                            "Connections a listener refused or closed by its admission \
                             policy, by reason.",
                            &[("listener", listener), ("reason", why.name())],
                        )
                    })
                    .collect(),
            ),
            None => (
                Gauge::default(),
                Refusal::ALL.iter().map(|_| Counter::default()).collect(),
            ),
        };
        Doorkeeper {
            inner: Arc::new(Inner {
                listener: listener.to_string(),
                table: Mutex::new(Table {
                    admission: Admission::new(limits),
                    closers: HashMap::new(),
                }),
                started: Instant::now(),
                open_gauge,
                refused,
                requests_per_s: None,
            }),
        }
    }

    /// This doorkeeper, each connection allowed at most `requests_per_s` requests a second:
    /// the HTTP server hands each connection a [`crate::rate::ConnectionRate`].
    pub fn with_requests_per_s(self, requests_per_s: u32) -> Self {
        assert!(requests_per_s > 0, "requests_per_s must be positive");
        let inner = Arc::into_inner(self.inner).expect("set before the doorkeeper is shared");
        Doorkeeper {
            inner: Arc::new(Inner {
                requests_per_s: Some(requests_per_s),
                ..inner
            }),
        }
    }

    pub fn requests_per_s(&self) -> Option<u32> {
        self.inner.requests_per_s
    }

    fn now_ms(&self) -> u64 {
        self.inner.started.elapsed().as_millis() as u64
    }

    /// A pass for a connection just accepted from `peer`, or `None` (refused: counted and
    /// logged; drop the socket). Strangers past their deadline are closed first, and a
    /// stranger displaced to make room is told to close.
    pub fn admit(&self, peer: SocketAddr) -> Option<Pass> {
        let now_ms = self.now_ms();
        let mut t = self.inner.table.lock().expect("doorkeeper lock");
        for id in t.admission.expire(now_ms) {
            if let Some(close) = t.closers.remove(&id) {
                close.notify_one();
            }
            self.count(Refusal::Timeout, None);
        }
        let admit = match t.admission.admit(peer.ip(), now_ms) {
            Ok(admit) => admit,
            Err(why) => {
                drop(t);
                self.count(why, Some(peer));
                return None;
            }
        };
        if let Some((victim, why)) = admit.displaced {
            if let Some(close) = t.closers.remove(&victim) {
                close.notify_one();
            }
            self.count(why, None);
        }
        let close = Arc::new(Notify::new());
        t.closers.insert(admit.id, Arc::clone(&close));
        self.inner.open_gauge.set(t.admission.open() as i64);
        Some(Pass {
            id: admit.id,
            door: self.clone(),
            close,
        })
    }

    fn count(&self, why: Refusal, peer: Option<SocketAddr>) {
        let counter = &self.inner.refused[why as usize];
        counter.inc();
        let n = counter.get();
        if n <= REFUSALS_LOGGED_FIRST || n.is_multiple_of(REFUSALS_LOGGED_EVERY) {
            let from = peer.map(|p| format!(" from {p}")).unwrap_or_default();
            eprintln!(
                "{}: closed a connection{from}: {} ({}; {n} so far)",
                self.inner.listener,
                why.name(),
                why.describe()
            );
        }
    }

    /// How many connections were refused or closed for `why`.
    pub fn refused(&self, why: Refusal) -> u64 {
        self.inner.refused[why as usize].get()
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner
            .table
            .lock()
            .expect("doorkeeper lock")
            .admission
            .open()
    }

    pub fn listener(&self) -> &str {
        &self.inner.listener
    }
}

/// One admitted connection's place; given back when dropped.
#[derive(Debug)]
pub struct Pass {
    id: u64,
    door: Doorkeeper,
    close: Arc<Notify>,
}

impl Pass {
    /// The connection authenticated or sent a whole request: it keeps its place.
    pub fn proven(&self) {
        let mut t = self.door.inner.table.lock().expect("doorkeeper lock");
        t.admission.proven(self.id);
    }

    /// The connection waits for its next request: a stranger again, with a deadline.
    pub fn waiting(&self) {
        let now_ms = self.door.now_ms();
        let mut t = self.door.inner.table.lock().expect("doorkeeper lock");
        t.admission.waiting(self.id, now_ms);
        // Wakes `closed` to arm the new deadline.
        self.close.notify_one();
    }

    /// A handle that marks the connection proven now and waiting again when dropped (held by
    /// an HTTP response's body until it is written).
    pub fn busy(&self) -> Busy {
        self.proven();
        Busy {
            door: self.door.clone(),
            id: self.id,
            close: Arc::clone(&self.close),
        }
    }

    /// Resolves when the connection must close: displaced to make room, or a stranger past its
    /// deadline (counted here).
    pub async fn closed(&self) {
        loop {
            let deadline_ms = {
                let t = self.door.inner.table.lock().expect("doorkeeper lock");
                if !t.closers.contains_key(&self.id) {
                    return;
                }
                t.admission.deadline_ms(self.id)
            };
            match deadline_ms {
                None => self.close.notified().await,
                Some(deadline_ms) => {
                    // One ms past the deadline, so that the table finds it due.
                    let left_ms = deadline_ms.saturating_sub(self.door.now_ms()) + 1;
                    let wait = Duration::from_millis(left_ms);
                    if tokio::time::timeout(wait, self.close.notified())
                        .await
                        .is_err()
                    {
                        self.expire_if_late();
                    }
                }
            }
        }
    }

    /// Whether the connection must close now: displaced, or a stranger past its deadline
    /// (counted here). For a connection served by a thread of its own, which asks between
    /// reads instead of awaiting [`Pass::closed`].
    pub fn is_closed(&self) -> bool {
        self.expire_if_late();
        let t = self.door.inner.table.lock().expect("doorkeeper lock");
        !t.closers.contains_key(&self.id)
    }

    /// Closes this connection if it is still a stranger past its deadline.
    fn expire_if_late(&self) {
        let now_ms = self.door.now_ms();
        let mut t = self.door.inner.table.lock().expect("doorkeeper lock");
        let late = t.admission.expire(now_ms);
        for id in &late {
            if let Some(close) = t.closers.remove(id) {
                close.notify_one();
            }
        }
        drop(t);
        for _ in &late {
            self.door.count(Refusal::Timeout, None);
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut t = self.door.inner.table.lock().expect("doorkeeper lock");
        t.admission.remove(self.id);
        t.closers.remove(&self.id);
        self.door.inner.open_gauge.set(t.admission.open() as i64);
    }
}

/// A connection busy with a request (see [`Pass::busy`]).
#[derive(Debug)]
pub struct Busy {
    door: Doorkeeper,
    id: u64,
    close: Arc<Notify>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now_ms = self.door.now_ms();
        let mut t = self.door.inner.table.lock().expect("doorkeeper lock");
        t.admission.waiting(self.id, now_ms);
        self.close.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 4000))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_displaced_stranger_is_told_to_close_and_a_proven_one_is_not() {
        let registry = Registry::new();
        let door = Doorkeeper::new("test", Limits::new(2, 2, 60_000), Some(&registry));
        let proven = door.admit(peer(1)).unwrap();
        proven.proven();
        let stranger = door.admit(peer(2)).unwrap();
        let newcomer = door.admit(peer(3)).unwrap();
        stranger.closed().await;
        assert_eq!(door.refused(Refusal::Displaced), 1);
        newcomer.proven();
        assert!(door.admit(peer(4)).is_none());
        assert_eq!(door.refused(Refusal::Full), 1);
        let mut text = String::new();
        registry.render(&mut text);
        assert!(
            text.contains("bourse_listener_refusals_total{listener=\"test\",reason=\"full\"} 1"),
            "{text}"
        );
        drop(proven);
        assert!(door.admit(peer(4)).is_some());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stranger_past_its_deadline_is_closed_and_counted() {
        let door = Doorkeeper::new("test", Limits::new(4, 4, 20), None);
        let idle = door.admit(peer(1)).unwrap();
        idle.closed().await;
        assert_eq!(door.refused(Refusal::Timeout), 1);
    }
}
