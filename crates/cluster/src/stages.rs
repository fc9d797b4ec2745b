//! [`Stages`]: where a replicated request's time goes inside a node, stage by stage, in HDR
//! histograms (for `bourse bench cluster` and for anyone who asks a node why it is slow).
//!
//! On the leader, per batch (times from the moment the batch's oldest request was read off
//! its connection):
//!
//! - `queue`: request read → taken by the batcher (waiting for a batch slot);
//! - `propose`: taken → handed to openraft (`client_write_ff` returned);
//! - `replicate`: handed to openraft → the first follower acknowledged an AppendEntries that
//!   holds the batch (with the leader's own append, a quorum of three has it);
//! - `commit_apply`: that acknowledgement → openraft answered the batch (the leader saw the
//!   quorum, committed, applied it in its state machine and woke the batcher's task);
//! - `reply`: the first answer of a write queued for a connection → written to the socket.
//!
//! And per AppendEntries RPC: `ae_round_trip` (leader: sent → answered, entries only) and
//! `follower_append` (follower: request decoded → openraft's answer, which includes the
//! journal append under the configured fsync). `batch_requests` counts requests per batch.
//!
//! Recording costs a clock read and a short uncontended lock per batch or RPC, never per
//! request, so it stays on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use hdrhistogram::Histogram;

/// Log indexes whose first quorum acknowledgement is remembered (a ring: older indexes are
/// overwritten, far more than the batches a node keeps in flight).
const ACK_RING_SLOTS: usize = 4096;
/// The largest latency the histograms track (a minute); longer ones are clamped.
const STAGE_NS_MAX: u64 = 60_000_000_000;

/// The stages, in the order a request passes them (then the RPC figures).
pub const STAGE_NAMES: [&str; 8] = [
    "queue",
    "propose",
    "replicate",
    "commit_apply",
    "reply",
    "ae_round_trip",
    "follower_append",
    "batch_requests",
];

const QUEUE: usize = 0;
const PROPOSE: usize = 1;
const REPLICATE: usize = 2;
const COMMIT_APPLY: usize = 3;
const REPLY: usize = 4;
const AE_ROUND_TRIP: usize = 5;
const FOLLOWER_APPEND: usize = 6;
const BATCH_REQUESTS: usize = 7;

/// One batch's stamps on the leader (nanoseconds since the node's epoch).
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchStamps {
    pub received_ns: u64,
    pub taken_ns: u64,
    pub proposed_ns: u64,
    pub requests: u64,
}

/// A node's stage histograms and the first-acknowledgement ring.
pub struct Stages {
    epoch: Instant,
    /// (log index + 1, first acknowledgement ns) by `index % ACK_RING_SLOTS`; 0: empty.
    acks: Mutex<Vec<(u64, u64)>>,
    histograms: Mutex<Vec<Histogram<u64>>>,
}

impl Default for Stages {
    fn default() -> Stages {
        Stages::new()
    }
}

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stages")
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, STAGE_NS_MAX, 3).expect("valid histogram bounds")
}

impl Stages {
    pub fn new() -> Stages {
        Stages {
            epoch: Instant::now(),
            acks: Mutex::new(vec![(0, 0); ACK_RING_SLOTS]),
            histograms: Mutex::new(STAGE_NAMES.iter().map(|_| new_histogram()).collect()),
        }
    }

    /// Now, in nanoseconds since this node's epoch (never 0).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// An instant in nanoseconds since this node's epoch.
    pub fn ns_of(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.epoch).as_nanos() as u64).max(1)
    }

    fn record(&self, values: &[(usize, u64)]) {
        if let Ok(mut h) = self.histograms.lock() {
            for &(stage, v) in values {
                h[stage].saturating_record(v.clamp(1, STAGE_NS_MAX));
            }
        }
    }

    /// A follower acknowledged an AppendEntries holding `first..=last`: the first such
    /// acknowledgement of each index is kept.
    pub fn on_append_acknowledged(&self, first: u64, last: u64, sent_ns: u64) {
        let now = self.now_ns();
        if let Ok(mut acks) = self.acks.lock() {
            // An RPC holds at most openraft's `max_payload_entries`; bound the loop anyway.
            let first = first.max(last.saturating_sub(ACK_RING_SLOTS as u64 - 1));
            for index in first..=last {
                let slot = &mut acks[(index % ACK_RING_SLOTS as u64) as usize];
                if slot.0 != index + 1 {
                    *slot = (index + 1, now);
                }
            }
        }
        self.record(&[(AE_ROUND_TRIP, now.saturating_sub(sent_ns))]);
    }

    /// A follower answered an AppendEntries with entries that it took `ns` to handle.
    pub fn on_follower_append(&self, ns: u64) {
        self.record(&[(FOLLOWER_APPEND, ns)]);
    }

    /// openraft answered the batch at log `index`.
    pub fn on_batch_answered(&self, index: u64, stamps: &BatchStamps) {
        let now = self.now_ns();
        let acked = self.acks.lock().ok().and_then(|acks| {
            let slot = acks[(index % ACK_RING_SLOTS as u64) as usize];
            (slot.0 == index + 1).then_some(slot.1)
        });
        let mut values = vec![
            (QUEUE, stamps.taken_ns.saturating_sub(stamps.received_ns)),
            (PROPOSE, stamps.proposed_ns.saturating_sub(stamps.taken_ns)),
            (BATCH_REQUESTS, stamps.requests),
        ];
        // A one-node group has no acknowledgement; then the whole wait counts as commit.
        match acked {
            Some(acked) => {
                values.push((REPLICATE, acked.saturating_sub(stamps.proposed_ns)));
                values.push((COMMIT_APPLY, now.saturating_sub(acked)));
            }
            None => values.push((COMMIT_APPLY, now.saturating_sub(stamps.proposed_ns))),
        }
        self.record(&values);
    }

    /// A connection wrote answers, the oldest of which was queued at `queued_ns`.
    pub fn on_reply_written(&self, queued_ns: u64) {
        let now = self.now_ns();
        self.record(&[(REPLY, now.saturating_sub(queued_ns))]);
    }

    /// Copies of the histograms, named as in [`STAGE_NAMES`] (latencies in ns).
    pub fn snapshot(&self) -> Vec<(&'static str, Histogram<u64>)> {
        let h = self.histograms.lock().expect("stage histograms");
        STAGE_NAMES.iter().copied().zip(h.iter().cloned()).collect()
    }

    /// Empties the histograms (between benchmark scenarios).
    pub fn reset(&self) {
        if let Ok(mut h) = self.histograms.lock() {
            for h in h.iter_mut() {
                h.reset();
            }
        }
    }
}

/// The oldest answer queued for a connection and not yet written (ns since the node's
/// epoch; 0: none): set by the first answer after a write, taken by the writer.
#[derive(Debug, Default)]
pub struct ReplyStamp(AtomicU64);

impl ReplyStamp {
    #[inline]
    pub fn mark(&self, now_ns: u64) {
        let _ = self
            .0
            .compare_exchange(0, now_ns, Ordering::Relaxed, Ordering::Relaxed);
    }

    #[inline]
    pub fn take(&self) -> Option<u64> {
        match self.0.swap(0, Ordering::Relaxed) {
            0 => None,
            v => Some(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_split_at_its_first_acknowledgement() {
        let s = Stages::new();
        let stamps = BatchStamps {
            received_ns: 1,
            taken_ns: 2,
            proposed_ns: 3,
            requests: 5,
        };
        s.on_append_acknowledged(10, 12, 3);
        // A later acknowledgement of the same index does not move its first one.
        std::thread::sleep(std::time::Duration::from_millis(2));
        s.on_append_acknowledged(12, 12, 3);
        s.on_batch_answered(12, &stamps);
        let snap = s.snapshot();
        let get = |name: &str| &snap.iter().find(|(n, _)| *n == name).unwrap().1;
        assert_eq!(get("replicate").len(), 1);
        assert_eq!(get("commit_apply").len(), 1);
        assert!(
            get("commit_apply").max() >= 1_000_000,
            "measured from the first ack"
        );
        assert_eq!(get("batch_requests").max(), 5);
        assert_eq!(get("ae_round_trip").len(), 2);
        // An index never acknowledged counts the whole wait as commit.
        s.on_batch_answered(99, &stamps);
        let snap = s.snapshot();
        assert_eq!(snap[REPLICATE].1.len(), 1);
        assert_eq!(snap[COMMIT_APPLY].1.len(), 2);
        s.reset();
        assert!(s.snapshot().iter().all(|(_, h)| h.is_empty()));
    }

    #[test]
    fn a_reply_stamp_keeps_the_oldest_until_taken() {
        let r = ReplyStamp::default();
        assert_eq!(r.take(), None);
        r.mark(5);
        r.mark(9);
        assert_eq!(r.take(), Some(5));
        assert_eq!(r.take(), None);
    }
}
