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
//! And per log entry whose order-log packet the node's market data feed sent (leader only,
//! online mode): `md_published`, from the entry's first follower acknowledgement (as for
//! `replicate`: with the leader's own append, a quorum of three holds it) to the return of
//! the send of that packet on feeds A and B.
//!
//! Recording costs a clock read and a short uncontended lock per batch, RPC or entry, never
//! per request, so it stays on. Every value goes into two histograms: one since start (or
//! since [`Stages::reset`], for `bourse bench cluster`) and one for the current interval,
//! which the node's monitor takes with [`Stages::take_interval`] every poll and exports as
//! Prometheus histograms and the dashboard's per-batch table.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hdrhistogram::Histogram;

/// Log indexes whose first quorum acknowledgement is remembered (a ring: older indexes are
/// overwritten, far more than the batches a node keeps in flight).
const ACK_RING_SLOTS: usize = 4096;
/// The largest latency the histograms track (a minute); longer ones are clamped.
const STAGE_NS_MAX: u64 = 60_000_000_000;
/// Interval histograms keep two significant digits (1%): enough for the dashboard and for
/// Prometheus buckets, at a tenth of the memory of the three-digit ones.
const INTERVAL_SIGNIFICANT_DIGITS: u8 = 2;

/// The stages, in the order a request passes them (then the RPC figures, then the batch
/// size, which is a count, not a latency).
pub const STAGE_NAMES: [&str; 9] = [
    "queue",
    "propose",
    "replicate",
    "commit_apply",
    "reply",
    "md_published",
    "ae_round_trip",
    "follower_append",
    "batch_requests",
];

const QUEUE: usize = 0;
const PROPOSE: usize = 1;
const REPLICATE: usize = 2;
const COMMIT_APPLY: usize = 3;
const REPLY: usize = 4;
const MD_PUBLISHED: usize = 5;
const AE_ROUND_TRIP: usize = 6;
const FOLLOWER_APPEND: usize = 7;
const BATCH_REQUESTS: usize = 8;
/// Stages before this index are latencies in nanoseconds; `batch_requests` is a count.
const LATENCY_STAGES: usize = BATCH_REQUESTS;

/// One batch's stamps on the leader (nanoseconds since the node's epoch).
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchStamps {
    pub received_ns: u64,
    pub taken_ns: u64,
    pub proposed_ns: u64,
    pub requests: u64,
}

/// Histograms of one interval with the exact sum of each (Prometheus exports sums).
pub struct StageInterval {
    hist: Vec<Histogram<u64>>,
    sum: Vec<u64>,
}

impl Default for StageInterval {
    fn default() -> StageInterval {
        StageInterval::new()
    }
}

impl std::fmt::Debug for StageInterval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StageInterval")
    }
}

impl StageInterval {
    pub fn new() -> StageInterval {
        StageInterval {
            hist: STAGE_NAMES
                .iter()
                .map(|_| {
                    Histogram::new_with_bounds(1, STAGE_NS_MAX, INTERVAL_SIGNIFICANT_DIGITS)
                        .expect("valid histogram bounds")
                })
                .collect(),
            sum: vec![0; STAGE_NAMES.len()],
        }
    }

    fn record(&mut self, stage: usize, v: u64) {
        self.hist[stage].saturating_record(v);
        self.sum[stage] = self.sum[stage].saturating_add(v);
    }

    fn clear(&mut self) {
        for h in &mut self.hist {
            h.reset();
        }
        self.sum.iter_mut().for_each(|s| *s = 0);
    }

    /// The latency stages (all but `batch_requests`): name, histogram (ns) and exact sum (ns).
    pub fn latencies(&self) -> impl Iterator<Item = (&'static str, &Histogram<u64>, u64)> + '_ {
        (0..LATENCY_STAGES).map(|i| (STAGE_NAMES[i], &self.hist[i], self.sum[i]))
    }

    /// Requests per batch over the interval.
    pub fn batch_requests(&self) -> &Histogram<u64> {
        &self.hist[BATCH_REQUESTS]
    }
}

struct Histograms {
    /// Since start or the last [`Stages::reset`].
    total: Vec<Histogram<u64>>,
    /// Since the last [`Stages::take_interval`].
    interval: StageInterval,
}

struct Inner {
    epoch: Instant,
    /// (log index + 1, first acknowledgement ns) by `index % ACK_RING_SLOTS`; 0: empty.
    acks: Mutex<Vec<(u64, u64)>>,
    histograms: Mutex<Histograms>,
    /// AppendEntries this node took as a follower on pipelined replication streams.
    append_stream_requests: AtomicU64,
    /// The most of them it held unanswered at once on one stream.
    append_stream_unanswered_max: AtomicU64,
    /// Pipelined replication streams this node served as a follower since start.
    append_streams_served: AtomicU64,
    /// Connections this node serves now (peers, clients, streams): each one's task and socket
    /// live until this goes down, so a count that only grows is a leak.
    connections_open: AtomicU64,
}

/// One open connection in [`Stages::connections_open`], counted down when dropped.
pub struct ConnectionGuard(Stages);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0 .0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A node's stage histograms and the first-acknowledgement ring. Cloning shares them (the
/// node's market data thread records into the same ones).
#[derive(Clone)]
pub struct Stages(Arc<Inner>);

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
        Stages(Arc::new(Inner {
            epoch: Instant::now(),
            acks: Mutex::new(vec![(0, 0); ACK_RING_SLOTS]),
            histograms: Mutex::new(Histograms {
                total: STAGE_NAMES.iter().map(|_| new_histogram()).collect(),
                interval: StageInterval::new(),
            }),
            append_stream_requests: AtomicU64::new(0),
            append_stream_unanswered_max: AtomicU64::new(0),
            append_streams_served: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
        }))
    }

    /// Now, in nanoseconds since this node's epoch (never 0).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        (self.0.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// An instant in nanoseconds since this node's epoch.
    pub fn ns_of(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.0.epoch).as_nanos() as u64).max(1)
    }

    fn record(&self, values: &[(usize, u64)]) {
        if let Ok(mut h) = self.0.histograms.lock() {
            for &(stage, v) in values {
                let v = v.clamp(1, STAGE_NS_MAX);
                h.total[stage].saturating_record(v);
                h.interval.record(stage, v);
            }
        }
    }

    /// When a follower first acknowledged log `index` (`None`: not seen, or overwritten).
    fn first_ack_ns(&self, index: u64) -> Option<u64> {
        self.0.acks.lock().ok().and_then(|acks| {
            let slot = acks[(index % ACK_RING_SLOTS as u64) as usize];
            (slot.0 == index + 1).then_some(slot.1)
        })
    }

    /// A follower acknowledged an AppendEntries holding `first..=last`: the first such
    /// acknowledgement of each index is kept.
    pub fn on_append_acknowledged(&self, first: u64, last: u64, sent_ns: u64) {
        let now = self.now_ns();
        if let Ok(mut acks) = self.0.acks.lock() {
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

    /// A follower took an AppendEntries on a pipelined stream, which now holds `unanswered`
    /// (this one included).
    pub fn on_append_stream_request(&self, unanswered: u64) {
        self.0
            .append_stream_requests
            .fetch_add(1, Ordering::Relaxed);
        self.0
            .append_stream_unanswered_max
            .fetch_max(unanswered, Ordering::Relaxed);
    }

    /// AppendEntries taken on pipelined streams since start.
    pub fn append_stream_requests(&self) -> u64 {
        self.0.append_stream_requests.load(Ordering::Relaxed)
    }

    /// The most AppendEntries one pipelined stream held unanswered at once since start.
    pub fn append_stream_unanswered_max(&self) -> u64 {
        self.0.append_stream_unanswered_max.load(Ordering::Relaxed)
    }

    /// A follower started serving a pipelined replication stream.
    pub fn on_append_stream_served(&self) {
        self.0.append_streams_served.fetch_add(1, Ordering::Relaxed);
    }

    /// Pipelined replication streams served as a follower since start.
    pub fn append_streams_served(&self) -> u64 {
        self.0.append_streams_served.load(Ordering::Relaxed)
    }

    /// A connection's task started; the guard marks its end when dropped (however the task
    /// ends, aborted included).
    pub fn connection_opened(&self) -> ConnectionGuard {
        self.0.connections_open.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard(self.clone())
    }

    /// Connections served now.
    pub fn connections_open(&self) -> u64 {
        self.0.connections_open.load(Ordering::Relaxed)
    }

    /// A follower answered an AppendEntries with entries that it took `ns` to handle.
    pub fn on_follower_append(&self, ns: u64) {
        self.record(&[(FOLLOWER_APPEND, ns)]);
    }

    /// openraft answered the batch at log `index`.
    pub fn on_batch_answered(&self, index: u64, stamps: &BatchStamps) {
        let now = self.now_ns();
        let acked = self.first_ack_ns(index);
        let mut values = [
            (QUEUE, stamps.taken_ns.saturating_sub(stamps.received_ns)),
            (PROPOSE, stamps.proposed_ns.saturating_sub(stamps.taken_ns)),
            (BATCH_REQUESTS, stamps.requests),
            (COMMIT_APPLY, 0),
            (REPLICATE, 0),
        ];
        // A one-node group has no acknowledgement; then the whole wait counts as commit.
        let n = match acked {
            Some(acked) => {
                values[3].1 = now.saturating_sub(acked);
                values[4].1 = acked.saturating_sub(stamps.proposed_ns);
                5
            }
            None => {
                values[3].1 = now.saturating_sub(stamps.proposed_ns);
                4
            }
        };
        self.record(&values[..n]);
    }

    /// The market data feed sent the order-log packet of log `index` just now: records the
    /// publication delay from the entry's first acknowledgement. Returns whether it was
    /// recorded (an entry this node never saw acknowledged, e.g. in a one-node group or
    /// after the ring moved past it, is not).
    pub fn on_md_published(&self, index: u64) -> bool {
        let now = self.now_ns();
        match self.first_ack_ns(index) {
            Some(acked) => {
                self.record(&[(MD_PUBLISHED, now.saturating_sub(acked))]);
                true
            }
            None => false,
        }
    }

    /// A connection wrote answers, the oldest of which was queued at `queued_ns`.
    pub fn on_reply_written(&self, queued_ns: u64) {
        let now = self.now_ns();
        self.record(&[(REPLY, now.saturating_sub(queued_ns))]);
    }

    /// Copies of the histograms since start or reset, named as in [`STAGE_NAMES`]
    /// (latencies in ns).
    pub fn snapshot(&self) -> Vec<(&'static str, Histogram<u64>)> {
        let h = self.0.histograms.lock().expect("stage histograms");
        STAGE_NAMES
            .iter()
            .copied()
            .zip(h.total.iter().cloned())
            .collect()
    }

    /// Swaps the current interval's histograms into `into` (emptying what `into` held first)
    /// and starts a new interval. Under the lock only the swap happens, so the hot path waits
    /// for no copying.
    pub fn take_interval(&self, into: &mut StageInterval) {
        into.clear();
        if let Ok(mut h) = self.0.histograms.lock() {
            std::mem::swap(&mut h.interval, into);
        }
    }

    /// Empties the histograms since start (between benchmark scenarios); the interval ones,
    /// which feed counters that never go down, are left alone.
    pub fn reset(&self) {
        if let Ok(mut h) = self.0.histograms.lock() {
            for h in h.total.iter_mut() {
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
    fn intervals_are_taken_whole_and_md_delay_runs_from_the_first_ack() {
        let s = Stages::new();
        let clone = s.clone();
        let mut interval = StageInterval::new();
        assert!(!s.on_md_published(7), "index 7 was never acknowledged");
        s.on_append_acknowledged(7, 7, s.now_ns());
        std::thread::sleep(std::time::Duration::from_millis(2));
        // A clone records into the same histograms (the market data thread holds one).
        assert!(clone.on_md_published(7));
        s.on_reply_written(s.now_ns());
        s.take_interval(&mut interval);
        let got: Vec<(&str, u64, u64)> = interval
            .latencies()
            .map(|(n, h, sum)| (n, h.len(), sum))
            .filter(|(_, n, _)| *n > 0)
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        let md = got.iter().find(|(n, _, _)| *n == "md_published").unwrap();
        assert!(md.2 >= 2_000_000, "from the ack: {md:?}");
        assert!(
            interval.latencies().all(|(n, _, _)| n != "batch_requests"),
            "a count is not a latency"
        );
        // The next interval starts empty; the since-start histograms keep everything.
        s.take_interval(&mut interval);
        assert!(interval
            .latencies()
            .all(|(_, h, sum)| h.is_empty() && sum == 0));
        assert_eq!(s.snapshot()[MD_PUBLISHED].1.len(), 1);
        // A reset (between benchmark scenarios) leaves the interval alone.
        s.on_follower_append(5_000);
        s.reset();
        s.take_interval(&mut interval);
        assert_eq!(interval.hist[FOLLOWER_APPEND].len(), 1);
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
