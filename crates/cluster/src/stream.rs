//! The committed stream: every log entry a node applies, in log order, with the outcome of
//! each request it carried (its idempotency key, its [`OutcomeKind`] and its events,
//! `Event::OrderLog` included).
//!
//! The state machine publishes each applied entry here (blank, membership and hash-check
//! entries too, with no requests, so that a subscriber sees every index and can tell there is
//! no gap). The stream keeps a bounded ring of the most recent entries, so a subscriber may
//! start a little in the past (a gateway resubscribing after a failover from the last index it
//! saw), and a broadcast channel of bounded depth for live entries: a subscriber that falls
//! further behind than that depth is cut off with [`StreamError::Lagged`] rather than buffered
//! without bound. Followers apply only committed entries, so any node may serve the stream.
//!
//! An installed snapshot (a follower that fell too far behind) jumps the applied index; the
//! ring restarts after it and a subscriber that was in the middle gets
//! [`StreamError::Gap`] rather than a silent hole.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use bourse_core::codec::{DecodeError, Reader, Writer};

use crate::batch::Audit;
use crate::state::OutcomeKind;

/// The most entries `stream_entries_kept` may ask a node to keep in its ring.
pub const STREAM_ENTRIES_KEPT_LIMIT: usize = 1 << 20;
/// Entries a node keeps unless its configuration says otherwise.
pub const STREAM_ENTRIES_KEPT_DEFAULT: usize = 65_536;
/// The most bytes `stream_bytes_kept` may ask a node to keep in its ring.
pub const STREAM_BYTES_KEPT_LIMIT: usize = 1 << 32;
/// Bytes of entries a node keeps in its ring unless its configuration says otherwise: a count
/// of entries alone does not bound memory (an entry holds a whole batch's events), and a
/// consumer further behind catches up from the stream archive on disk.
pub const STREAM_BYTES_KEPT_DEFAULT: usize = 16 << 20;
/// The most entries a live subscriber may lag before it is cut off (the broadcast depth).
pub const STREAM_SUBSCRIBER_LAG_ENTRIES: usize = 16_384;

/// One request of a committed entry, as applied: the one place its events travel (the
/// answer to the client names the entry, `crate::state::Outcome`, and carries no events).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedRequest {
    pub client_id: u64,
    pub request_seq: u64,
    pub kind: OutcomeKind,
    /// The index of the entry that applied the command: this entry's for `Applied`, the
    /// first application's for `Duplicate`, 0 when it was not applied.
    pub applied_index: u64,
    /// The encoded events of the command (see `bourse_core::codec::decode_events`) when it
    /// applied in this entry; empty otherwise (a duplicate's events are at `applied_index`).
    pub events: Vec<u8>,
    /// Who asked, for a request that carried an audit trailer (admin actions); `None` for
    /// every other (trading requests), which costs no allocation.
    pub audit: Option<Audit>,
}

/// One applied log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedEntry {
    /// The entry's log index: consecutive, one entry per index.
    pub index: u64,
    /// The requests of a batch entry in log order; empty for other entries.
    pub requests: Vec<CommittedRequest>,
    /// A market data idle flush entry: the time it closes the idle 1 ms / 15 ms channels at
    /// (`LogCommand::MarketDataFlush`); `None` for every other entry.
    pub market_data_flush_ns: Option<u64>,
}

/// An encoded entry's flags (its first byte): a market data flush time follows.
const FLAG_MARKET_DATA_FLUSH: u8 = 1;
/// An encoded entry's flags: each request ends with an audit byte (0: none, 1: a trailer
/// follows). Entries written before audit trailers existed have flags 0 or 1 and read as
/// they did.
const FLAG_AUDITED: u8 = 2;

/// The most requests one encoded entry may hold (a batch is far smaller).
const REQUESTS_PER_ENTRY_MAX: usize = 1 << 20;
/// The largest encoded entry [`CommittedEntry::decode`] accepts.
pub const ENTRY_BYTES_MAX: usize = 16 * 1024 * 1024;

impl CommittedEntry {
    /// About how many bytes the entry holds in memory (its requests, their events and the
    /// fixed parts), what the ring's byte bound counts.
    pub fn size_bytes(&self) -> usize {
        let request = std::mem::size_of::<CommittedRequest>();
        let events: usize = self.requests.iter().map(|r| r.events.len()).sum();
        std::mem::size_of::<CommittedEntry>() + self.requests.len() * request + events
    }

    /// The entry's one binary form, without its index (which the carrier gives: a stream
    /// frame's header, an archive record's own index). The stream archive stores it and a
    /// node sends it to remote subscribers: the events are copied as one byte string.
    pub fn encode(&self) -> Vec<u8> {
        let bytes: usize = self.requests.iter().map(|r| 40 + r.events.len()).sum();
        let mut w = Writer::with_capacity(13 + bytes);
        // An entry with an audited request says so in its flags, and then each of its
        // requests has an audit byte; entries without one keep the form they always had.
        let audited = self.requests.iter().any(|r| r.audit.is_some());
        let flags = if audited { FLAG_AUDITED } else { 0 };
        match self.market_data_flush_ns {
            None => w.u8(flags),
            Some(ns) => {
                w.u8(flags | FLAG_MARKET_DATA_FLUSH);
                w.u64(ns);
            }
        }
        w.u32(self.requests.len() as u32);
        for r in &self.requests {
            w.u64(r.client_id);
            w.u64(r.request_seq);
            r.kind.encode(&mut w);
            w.u64(r.applied_index);
            w.bytes(&r.events);
            if audited {
                match &r.audit {
                    None => w.u8(0),
                    Some(a) => {
                        w.u8(1);
                        a.encode_into(&mut w);
                    }
                }
            }
        }
        w.finish()
    }

    /// Reads what [`CommittedEntry::encode`] wrote for the entry at `index`; refuses anything
    /// else (bytes from a peer are checked as if hostile: counts bounded by the bytes there).
    pub fn decode(index: u64, bytes: &[u8]) -> Result<CommittedEntry, DecodeError> {
        let mut r = Reader::new(bytes);
        let flags = r.u8()?;
        if flags & !(FLAG_MARKET_DATA_FLUSH | FLAG_AUDITED) != 0 {
            return Err(r.error("bad entry flags"));
        }
        let audited = flags & FLAG_AUDITED != 0;
        let market_data_flush_ns = if flags & FLAG_MARKET_DATA_FLUSH != 0 {
            Some(r.u64()?)
        } else {
            None
        };
        let count = r.u32()? as usize;
        // Each request takes at least 29 bytes (three u64, the kind, an empty byte string's
        // length).
        if count > REQUESTS_PER_ENTRY_MAX || count > r.remaining() / 29 {
            return Err(r.error("request count larger than the bytes can hold"));
        }
        let mut requests = Vec::with_capacity(count);
        for _ in 0..count {
            let client_id = r.u64()?;
            let request_seq = r.u64()?;
            let kind = OutcomeKind::decode(&mut r)?;
            let applied_index = r.u64()?;
            let events = r.bytes(ENTRY_BYTES_MAX)?.to_vec();
            let audit = match audited {
                false => None,
                true => match r.u8()? {
                    0 => None,
                    1 => Some(Audit::decode_from(&mut r)?),
                    _ => return Err(r.error("bad audit flag")),
                },
            };
            requests.push(CommittedRequest {
                client_id,
                request_seq,
                kind,
                applied_index,
                events,
                audit,
            });
        }
        r.expect_end()?;
        // One form per entry: the audit flag only on an entry with an audited request.
        if audited && requests.iter().all(|q| q.audit.is_none()) {
            return Err(DecodeError {
                offset: 0,
                what: "audit flag on an entry without an audited request",
            });
        }
        Ok(CommittedEntry {
            index,
            requests,
            market_data_flush_ns,
        })
    }
}

/// Why a subscription could not start or had to end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamError {
    /// The entries from `from_index` are no longer kept; the oldest one kept is `oldest_kept`.
    TooOld { from_index: u64, oldest_kept: u64 },
    /// The subscriber fell more than `lag_max` entries behind and was cut off.
    Lagged { lag_max: u64 },
    /// The node installed a snapshot: entries `expected..next` were never applied one by one
    /// here, so the stream cannot show them.
    Gap { expected: u64, next: u64 },
    /// The node stopped.
    Closed,
    /// The node would not start another subscription (a limit), or could not read its
    /// stream archive.
    Refused(String),
    /// No node sent the next entry for a while (a remote [`crate::consumer::StreamConsumer`]
    /// tried each in turn).
    Unreachable(String),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::TooOld {
                from_index,
                oldest_kept,
            } => write!(
                f,
                "entries from index {from_index} are no longer kept (oldest kept: {oldest_kept})"
            ),
            StreamError::Lagged { lag_max } => write!(
                f,
                "subscriber fell more than {lag_max} entries behind and was disconnected"
            ),
            StreamError::Gap { expected, next } => write!(
                f,
                "a snapshot was installed: entries {expected}..{next} are not in the stream"
            ),
            StreamError::Closed => write!(f, "the node stopped"),
            StreamError::Refused(why) => write!(f, "subscription refused: {why}"),
            StreamError::Unreachable(why) => write!(f, "stream unreachable: {why}"),
        }
    }
}

impl std::error::Error for StreamError {}

struct Inner {
    ring: VecDeque<Arc<CommittedEntry>>,
    kept_max: usize,
    bytes_kept_max: usize,
    /// [`CommittedEntry::size_bytes`] summed over the ring.
    bytes: usize,
    /// The index the next applied entry will have.
    next_index: u64,
}

impl Inner {
    /// Drops the oldest entries past either bound, keeping at least the newest one.
    fn trim(&mut self) {
        while self.ring.len() > 1
            && (self.ring.len() > self.kept_max || self.bytes > self.bytes_kept_max)
        {
            let old = self.ring.pop_front().expect("more than one entry");
            self.bytes -= old.size_bytes();
        }
    }
}

/// The committed stream of one node (cheap to clone: clones share it).
#[derive(Clone)]
pub struct CommittedStream {
    inner: Arc<Mutex<Inner>>,
    live: broadcast::Sender<Arc<CommittedEntry>>,
}

impl CommittedStream {
    /// A stream that keeps `kept_max` entries (clamped to 1..=[`STREAM_ENTRIES_KEPT_LIMIT`])
    /// and whose first entry will have index `next_index`.
    pub fn new(kept_max: usize, next_index: u64) -> CommittedStream {
        let (live, _) = broadcast::channel(STREAM_SUBSCRIBER_LAG_ENTRIES);
        CommittedStream {
            inner: Arc::new(Mutex::new(Inner {
                ring: VecDeque::new(),
                kept_max: kept_max.clamp(1, STREAM_ENTRIES_KEPT_LIMIT),
                bytes_kept_max: STREAM_BYTES_KEPT_DEFAULT,
                bytes: 0,
                next_index,
            })),
            live,
        }
    }

    /// Publishes an applied entry (the state machine calls this in log order).
    pub fn publish(&self, entry: CommittedEntry) {
        let entry = Arc::new(entry);
        let mut inner = self.inner.lock().expect("stream lock");
        if entry.index != inner.next_index {
            // Only a snapshot install moves the index otherwise; keep the ring contiguous.
            inner.ring.clear();
            inner.bytes = 0;
        }
        inner.next_index = entry.index + 1;
        inner.bytes += entry.size_bytes();
        inner.ring.push_back(entry.clone());
        inner.trim();
        // Sent under the lock, so a subscriber that copies the ring under the same lock sees
        // each entry exactly once (from the ring or from the channel). No receiver is fine.
        let _ = self.live.send(entry);
    }

    /// Changes how many entries, and how many bytes of them, the ring keeps at most (each
    /// clamped to its limit; the newest entry is always kept).
    pub fn set_kept(&self, kept_max: usize, bytes_kept_max: usize) {
        let mut inner = self.inner.lock().expect("stream lock");
        inner.kept_max = kept_max.clamp(1, STREAM_ENTRIES_KEPT_LIMIT);
        inner.bytes_kept_max = bytes_kept_max.clamp(1, STREAM_BYTES_KEPT_LIMIT);
        inner.trim();
    }

    /// The ring's size now: entries and their bytes.
    pub fn kept(&self) -> (usize, usize) {
        let inner = self.inner.lock().expect("stream lock");
        (inner.ring.len(), inner.bytes)
    }

    /// A snapshot replaced the state: the next entry will be `next_index`.
    pub fn reset(&self, next_index: u64) {
        let mut inner = self.inner.lock().expect("stream lock");
        inner.ring.clear();
        inner.bytes = 0;
        inner.next_index = next_index;
    }

    /// The index of the next entry to be applied.
    pub fn next_index(&self) -> u64 {
        self.inner.lock().expect("stream lock").next_index
    }

    /// The oldest entry index a subscription may start from now.
    pub fn oldest_kept(&self) -> u64 {
        let inner = self.inner.lock().expect("stream lock");
        inner.ring.front().map_or(inner.next_index, |e| e.index)
    }

    /// Starts a subscription at `from_index` (the entries kept from there, then live ones).
    /// An index in the future is allowed: the subscription starts when it is applied.
    pub fn subscribe(&self, from_index: u64) -> Result<Subscription, StreamError> {
        let inner = self.inner.lock().expect("stream lock");
        let oldest_kept = inner.ring.front().map_or(inner.next_index, |e| e.index);
        if from_index < oldest_kept {
            return Err(StreamError::TooOld {
                from_index,
                oldest_kept,
            });
        }
        let skip = (from_index - oldest_kept) as usize;
        let backlog: VecDeque<Arc<CommittedEntry>> =
            inner.ring.iter().skip(skip).cloned().collect();
        let live = self.live.subscribe();
        Ok(Subscription {
            backlog,
            live,
            expected: from_index,
        })
    }
}

/// Entries from a chosen index on, each exactly once and in order.
pub struct Subscription {
    backlog: VecDeque<Arc<CommittedEntry>>,
    live: broadcast::Receiver<Arc<CommittedEntry>>,
    /// The index the next entry handed out must have.
    expected: u64,
}

impl Subscription {
    /// The index of the next entry this subscription will hand out.
    pub fn next_index(&self) -> u64 {
        self.expected
    }

    /// The next entry; an error ends the subscription.
    pub async fn recv(&mut self) -> Result<Arc<CommittedEntry>, StreamError> {
        loop {
            let entry = match self.backlog.pop_front() {
                Some(e) => e,
                None => match self.live.recv().await {
                    Ok(e) => e,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        return Err(StreamError::Lagged {
                            lag_max: STREAM_SUBSCRIBER_LAG_ENTRIES as u64,
                        })
                    }
                    Err(broadcast::error::RecvError::Closed) => return Err(StreamError::Closed),
                },
            };
            if entry.index < self.expected {
                // Before the start of a subscription to a future index.
                continue;
            }
            if entry.index > self.expected {
                return Err(StreamError::Gap {
                    expected: self.expected,
                    next: entry.index,
                });
            }
            self.expected += 1;
            return Ok(entry);
        }
    }

    /// The next entry if one is ready, without waiting (`Ok(None)` when none is).
    pub fn try_recv(&mut self) -> Result<Option<Arc<CommittedEntry>>, StreamError> {
        loop {
            let entry = match self.backlog.pop_front() {
                Some(e) => e,
                None => match self.live.try_recv() {
                    Ok(e) => e,
                    Err(broadcast::error::TryRecvError::Empty) => return Ok(None),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {
                        return Err(StreamError::Lagged {
                            lag_max: STREAM_SUBSCRIBER_LAG_ENTRIES as u64,
                        })
                    }
                    Err(broadcast::error::TryRecvError::Closed) => return Err(StreamError::Closed),
                },
            };
            if entry.index < self.expected {
                continue;
            }
            if entry.index > self.expected {
                return Err(StreamError::Gap {
                    expected: self.expected,
                    next: entry.index,
                });
            }
            self.expected += 1;
            return Ok(Some(entry));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64) -> CommittedEntry {
        CommittedEntry {
            index,
            requests: vec![CommittedRequest {
                client_id: 1,
                request_seq: index,
                kind: OutcomeKind::Applied,
                applied_index: index,
                events: vec![index as u8],
                audit: None,
            }],
            market_data_flush_ns: None,
        }
    }

    #[test]
    fn an_entry_without_audit_trailers_keeps_the_form_written_before_them() {
        let e = entry(5);
        // The form as it was before trailers existed, by hand: flags 0, one request.
        let mut old = vec![0u8];
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&1u64.to_le_bytes());
        old.extend_from_slice(&5u64.to_le_bytes());
        let mut w = Writer::default();
        OutcomeKind::Applied.encode(&mut w);
        old.extend_from_slice(&w.buf);
        old.extend_from_slice(&5u64.to_le_bytes());
        old.extend_from_slice(&1u32.to_le_bytes());
        old.push(5);
        assert_eq!(e.encode(), old);
        assert_eq!(CommittedEntry::decode(5, &old).unwrap(), e);
        // With a trailer: flagged, and read back with it.
        let mut audited = entry(5);
        audited.requests[0].audit = Some(Audit::new("alice", "halt-1").unwrap());
        let bytes = audited.encode();
        assert_eq!(bytes[0], FLAG_AUDITED);
        assert_eq!(CommittedEntry::decode(5, &bytes).unwrap(), audited);
        // The flag on an entry none of whose requests has a trailer is not its one form.
        let mut flagged = e.encode();
        flagged[0] = FLAG_AUDITED;
        flagged.push(0);
        assert!(CommittedEntry::decode(5, &flagged).is_err());
    }

    #[test]
    fn the_ring_keeps_at_most_its_bytes_whatever_the_entry_count_allows() {
        let s = CommittedStream::new(1_000, 1);
        let one = entry(1).size_bytes();
        s.set_kept(1_000, 3 * one);
        for i in 1..=10 {
            s.publish(entry(i));
        }
        assert_eq!(s.kept(), (3, 3 * one));
        assert_eq!(s.oldest_kept(), 8);
        // A bound smaller than one entry still keeps the newest.
        s.set_kept(1_000, 1);
        assert_eq!(s.kept(), (1, one));
        assert_eq!(s.oldest_kept(), 10);
    }

    #[tokio::test]
    async fn a_subscriber_gets_kept_then_live_entries_once_in_order() {
        let s = CommittedStream::new(4, 1);
        for i in 1..=6 {
            s.publish(entry(i));
        }
        assert_eq!(s.oldest_kept(), 3);
        assert_eq!(
            s.subscribe(2).err(),
            Some(StreamError::TooOld {
                from_index: 2,
                oldest_kept: 3
            })
        );
        let mut sub = s.subscribe(4).unwrap();
        s.publish(entry(7));
        for i in 4..=7 {
            assert_eq!(sub.recv().await.unwrap().index, i);
        }
        assert_eq!(sub.try_recv().unwrap(), None);
        // A future start waits for its index.
        let mut future = s.subscribe(9).unwrap();
        s.publish(entry(8));
        s.publish(entry(9));
        assert_eq!(future.recv().await.unwrap().index, 9);
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_cut_off_and_a_snapshot_jump_is_a_gap() {
        let s = CommittedStream::new(8, 1);
        let mut slow = s.subscribe(1).unwrap();
        for i in 1..=(STREAM_SUBSCRIBER_LAG_ENTRIES as u64 + 10) {
            s.publish(entry(i));
        }
        assert!(matches!(slow.recv().await, Err(StreamError::Lagged { .. })));
        let next = s.next_index();
        let mut sub = s.subscribe(next).unwrap();
        s.reset(next + 100);
        s.publish(entry(next + 100));
        assert_eq!(
            sub.recv().await.err(),
            Some(StreamError::Gap {
                expected: next,
                next: next + 100
            })
        );
        assert_eq!(s.oldest_kept(), next + 100);
    }
}
