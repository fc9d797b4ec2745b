//! Stage probes: timestamps t0..t7 along an order's life, aggregated into HDR histograms.
//!
//! The hot path owns a [`StageRecorder`] (one per thread). It decides which orders are
//! sampled (1 in N), records the legs of a sampled order's [`Trace`] into its own histograms,
//! and every flush interval hands the whole batch of histograms to the [`ProbeHub`] through a
//! bounded channel, taking an empty batch back in exchange. Batches circulate (three per
//! recorder, allocated at registration), so recording never allocates and never takes a lock;
//! merging happens on the control plane when the hub is drained.
//!
//! A leg is the time from the previous stamped stage to a stage, so a trace that skips stages
//! (the demo has no sequencer yet) still adds up to its door-to-door time. Market data
//! published and delivery stored are measured from `processed` (t5), the moment the core's
//! events exist.

use crate::clock;
use bourse_core::CommandKind;
use hdrhistogram::Histogram;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Mutex;

/// The sample points, in order. `as usize` is the index in a [`Trace`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// t0: bytes read from the client's socket at the gateway.
    SocketRead = 0,
    /// t1: decoded and validated.
    Decoded = 1,
    /// t2: handed to the sequencer.
    ToSequencer = 2,
    /// t3: appended to the local journal.
    Appended = 3,
    /// t4: committed on a quorum.
    Committed = 4,
    /// t5: processed by the trading core.
    Processed = 5,
    /// t6: response encoded.
    Encoded = 6,
    /// t7: response written to the client's socket.
    Written = 7,
    /// Market data for the order's events published.
    MdPublished = 8,
    /// The delivery store holds the order's new state.
    DeliveryStored = 9,
}

pub const STAGES: usize = 10;

impl Stage {
    pub const ALL: [Stage; STAGES] = [
        Stage::SocketRead,
        Stage::Decoded,
        Stage::ToSequencer,
        Stage::Appended,
        Stage::Committed,
        Stage::Processed,
        Stage::Encoded,
        Stage::Written,
        Stage::MdPublished,
        Stage::DeliveryStored,
    ];
    /// The label value in metrics and on the dashboard.
    pub fn name(self) -> &'static str {
        match self {
            Stage::SocketRead => "socket_read",
            Stage::Decoded => "decoded",
            Stage::ToSequencer => "to_sequencer",
            Stage::Appended => "appended",
            Stage::Committed => "committed",
            Stage::Processed => "processed",
            Stage::Encoded => "encoded",
            Stage::Written => "written",
            Stage::MdPublished => "md_published",
            Stage::DeliveryStored => "delivery_stored",
        }
    }
}

/// Legs recorded per command kind: slot 0 is door to door (first to last of t0..t7), slots
/// 1..=9 the leg ending at that stage, slot 10 the network leg derived by the LTP formula.
pub const LEGS: usize = STAGES + 1;
pub const LEG_DOOR_TO_DOOR: usize = 0;
pub const LEG_NETWORK: usize = STAGES;
/// Command kinds the probes distinguish.
pub const COMMAND_KINDS: usize = CommandKind::ALL.len();
/// Slots per leg: one per command kind, then [`KIND_ENTRY`].
pub const KINDS: usize = COMMAND_KINDS + 1;
/// The slot of log entries as a replica node observes them: an entry is a batch of commands
/// of mixed kinds, timed from when this node appended it (t3) to when it was committed (t4)
/// and applied (t5). Its label value is `entry`.
pub const KIND_ENTRY: usize = COMMAND_KINDS;

/// The label value of a kind slot (`new_order`, …, `entry`).
pub fn kind_name(slot: usize) -> &'static str {
    if slot < COMMAND_KINDS {
        CommandKind::ALL[slot].name()
    } else {
        "entry"
    }
}

pub fn kind_index(k: CommandKind) -> usize {
    match k {
        CommandKind::NewOrder => 0,
        CommandKind::Cancel => 1,
        CommandKind::Replace => 2,
        CommandKind::MassCancel => 3,
        CommandKind::Admin => 4,
    }
}

/// Stage timestamps of one sampled command, in [`clock::now_ns`] nanoseconds (0: not stamped).
#[derive(Clone, Copy, Debug)]
pub struct Trace {
    pub kind: CommandKind,
    t_ns: [u64; STAGES],
}

impl Trace {
    pub fn new(kind: CommandKind) -> Trace {
        Trace {
            kind,
            t_ns: [0; STAGES],
        }
    }
    /// Stamps `stage` with the clock now.
    #[inline]
    pub fn stamp(&mut self, stage: Stage) {
        self.stamp_at(stage, clock::now_ns());
    }
    /// Stamps `stage` with a time read elsewhere (one clock read can serve two stages).
    #[inline]
    pub fn stamp_at(&mut self, stage: Stage, t_ns: u64) {
        self.t_ns[stage as usize] = t_ns.max(1);
    }
    pub fn get(&self, stage: Stage) -> Option<u64> {
        let t = self.t_ns[stage as usize];
        (t != 0).then_some(t)
    }
    /// Calls `f(leg, ns)` for every leg this trace measures.
    #[inline]
    fn legs(&self, mut f: impl FnMut(usize, u64)) {
        let mut first = 0u64;
        let mut prev = 0u64;
        for i in 0..=Stage::Written as usize {
            let t = self.t_ns[i];
            if t == 0 {
                continue;
            }
            if prev != 0 {
                f(i, t.saturating_sub(prev));
            } else {
                first = t;
            }
            prev = t;
        }
        if first != 0 && prev != first {
            f(LEG_DOOR_TO_DOOR, prev - first);
        }
        let base = match self.t_ns[Stage::Processed as usize] {
            0 => prev,
            t => t,
        };
        for s in [Stage::MdPublished, Stage::DeliveryStored] {
            let t = self.t_ns[s as usize];
            if t != 0 && base != 0 {
                f(s as usize, t.saturating_sub(base));
            }
        }
    }
}

/// The LTP formula for a leg between two processes whose clocks are not comparable: the
/// client measures its round trip T0,7, the server its own residence T1,6, and the two network
/// legs are taken as equal: T1 = T7 = (T0,7 − T1,6) / 2.
pub fn ltp_network_leg_ns(round_trip_ns: u64, server_residence_ns: u64) -> u64 {
    round_trip_ns.saturating_sub(server_residence_ns) / 2
}

/// Latencies above this are recorded as this: a stall is kept, not dropped.
pub const LATENCY_NS_MAX: u64 = 60_000_000_000;
/// Two significant digits (1% resolution) keep a batch of 55 histograms near 1.5 MiB.
const SIGNIFICANT_DIGITS: u8 = 2;
/// Recorders one hub serves at most (the channel of full batches is sized for them).
pub const RECORDERS_MAX: usize = 64;
const BATCHES_PER_RECORDER: usize = 3;

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid")
}

/// Histograms for every (kind, leg), with exact sums for the Prometheus `_sum`.
pub struct Batch {
    owner: usize,
    hist: Vec<Histogram<u64>>,
    sum_ns: Vec<u64>,
    recorded: u64,
}

impl Batch {
    fn new(owner: usize) -> Batch {
        let mut b = Batch {
            owner,
            hist: (0..KINDS * LEGS).map(|_| new_histogram()).collect(),
            sum_ns: vec![0; KINDS * LEGS],
            recorded: 0,
        };
        // Writing every count now faults the pages in here, at registration, instead of on
        // the hot path the first time a value lands on an untouched page.
        b.reset();
        b
    }
    #[inline]
    fn record(&mut self, kind: usize, leg: usize, ns: u64) {
        let i = kind * LEGS + leg;
        let v = ns.clamp(1, LATENCY_NS_MAX);
        // The value is clamped into the histogram's range, so this cannot fail.
        let _ = self.hist[i].record(v);
        self.sum_ns[i] = self.sum_ns[i].saturating_add(ns);
        self.recorded += 1;
    }
    fn reset(&mut self) {
        for h in &mut self.hist {
            h.reset();
        }
        self.sum_ns.iter_mut().for_each(|s| *s = 0);
        self.recorded = 0;
    }
}

/// The hot path's probe: sampling, recording and periodic hand-off. Owned by one thread.
pub struct StageRecorder {
    batch: Option<Box<Batch>>,
    spare: Option<Box<Batch>>,
    full_tx: Option<SyncSender<Box<Batch>>>,
    spare_rx: Option<Receiver<Box<Batch>>>,
    sample_every: u32,
    countdown: u32,
    flush_interval_ns: u64,
    last_flush_ns: u64,
}

impl StageRecorder {
    /// A recorder that samples nothing and records nothing (monitoring off).
    pub fn disabled() -> StageRecorder {
        StageRecorder {
            batch: None,
            spare: None,
            full_tx: None,
            spare_rx: None,
            sample_every: 0,
            countdown: u32::MAX,
            flush_interval_ns: u64::MAX,
            last_flush_ns: 0,
        }
    }

    /// Whether the next command is sampled: true once every `sample_every` calls. Call it once
    /// per command and stamp a [`Trace`] only when it says yes (no clock read otherwise).
    ///
    /// The common case is one compare and one decrement of a field; everything else (re-arming,
    /// sampling off) is on a cold path.
    #[inline]
    pub fn sample(&mut self) -> bool {
        if self.countdown > 1 {
            self.countdown -= 1;
            return false;
        }
        self.rearm()
    }

    #[cold]
    #[inline(never)]
    fn rearm(&mut self) -> bool {
        if self.sample_every == 0 {
            // Off: the countdown runs for a long time before it comes back here.
            self.countdown = u32::MAX;
            return false;
        }
        self.countdown = self.sample_every;
        true
    }

    /// Records every leg of a sampled trace.
    #[inline]
    pub fn record(&mut self, trace: &Trace) {
        let Some(batch) = self.batch.as_deref_mut() else {
            return;
        };
        let k = kind_index(trace.kind);
        trace.legs(|leg, ns| batch.record(k, leg, ns));
    }

    /// Records a cross-process network leg by the LTP formula (see [`ltp_network_leg_ns`]).
    pub fn record_network_leg(
        &mut self,
        kind: CommandKind,
        round_trip_ns: u64,
        server_residence_ns: u64,
    ) {
        if let Some(batch) = self.batch.as_deref_mut() {
            let ns = ltp_network_leg_ns(round_trip_ns, server_residence_ns);
            batch.record(kind_index(kind), LEG_NETWORK, ns);
        }
    }

    /// Records one leg of a log entry as a replica node observes it (kind `entry`): `stage`
    /// is where the leg ends (`Appended`, `Committed` or `Processed`).
    pub fn record_entry_leg(&mut self, stage: Stage, ns: u64) {
        if let Some(batch) = self.batch.as_deref_mut() {
            batch.record(KIND_ENTRY, stage as usize, ns);
        }
    }

    /// Hands the batch to the hub if the flush interval has passed since the last hand-off.
    #[inline]
    pub fn maybe_flush(&mut self, now_ns: u64) {
        if now_ns.saturating_sub(self.last_flush_ns) >= self.flush_interval_ns {
            self.last_flush_ns = now_ns;
            self.flush();
        }
    }

    /// Hands the batch to the hub now if an empty one is available to take its place;
    /// otherwise keeps recording into it (nothing is lost, the hand-off waits).
    pub fn flush(&mut self) {
        let (Some(batch), Some(tx), Some(rx)) = (&mut self.batch, &self.full_tx, &self.spare_rx)
        else {
            return;
        };
        if batch.recorded == 0 {
            return;
        }
        if self.spare.is_none() {
            self.spare = rx.try_recv().ok();
        }
        let Some(spare) = self.spare.take() else {
            return;
        };
        let full = std::mem::replace(batch, spare);
        if let Err(TrySendError::Full(full) | TrySendError::Disconnected(full)) = tx.try_send(full)
        {
            // Keep recording into the full batch; the empty one waits for the next flush.
            self.spare = Some(std::mem::replace(batch, full));
        }
    }
}

impl Drop for StageRecorder {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Percentiles of one histogram in nanoseconds: the project's one latency summary, under the
/// name the monitor has used for it (`None` where nothing was recorded).
pub use bourse_latency::Latency as Percentiles;

struct HubState {
    spare_txs: Vec<SyncSender<Box<Batch>>>,
    /// Since the start, for Prometheus.
    total: Vec<Histogram<u64>>,
    total_sum_ns: Vec<u64>,
    /// Since the last [`ProbeHub::take_interval`], for the dashboard's per-second figures.
    interval: Vec<Histogram<u64>>,
}

/// Where recorders' batches are merged. Shared; every method runs on the control plane.
pub struct ProbeHub {
    sample_every: u32,
    flush_interval_ns: u64,
    full_tx: SyncSender<Box<Batch>>,
    full_rx: Mutex<Receiver<Box<Batch>>>,
    state: Mutex<HubState>,
}

impl ProbeHub {
    /// `sample_every`: 1 records every command, N one in N, 0 none.
    pub fn new(sample_every: u32, flush_interval_ns: u64) -> ProbeHub {
        let (full_tx, full_rx) = sync_channel(RECORDERS_MAX * BATCHES_PER_RECORDER);
        ProbeHub {
            sample_every,
            flush_interval_ns: flush_interval_ns.max(1),
            full_tx,
            full_rx: Mutex::new(full_rx),
            state: Mutex::new(HubState {
                spare_txs: Vec::new(),
                total: (0..KINDS * LEGS).map(|_| new_histogram()).collect(),
                total_sum_ns: vec![0; KINDS * LEGS],
                interval: (0..KINDS * LEGS).map(|_| new_histogram()).collect(),
            }),
        }
    }

    pub fn sample_every(&self) -> u32 {
        self.sample_every
    }

    /// A recorder for one thread. Allocates its batches now, so that recording never does;
    /// past [`RECORDERS_MAX`] (or with sampling off) the recorder is disabled.
    pub fn recorder(&self) -> StageRecorder {
        if self.sample_every == 0 {
            return StageRecorder::disabled();
        }
        let Ok(mut state) = self.state.lock() else {
            return StageRecorder::disabled();
        };
        if state.spare_txs.len() >= RECORDERS_MAX {
            return StageRecorder::disabled();
        }
        let owner = state.spare_txs.len();
        let (spare_tx, spare_rx) = sync_channel(BATCHES_PER_RECORDER);
        for _ in 1..BATCHES_PER_RECORDER {
            let _ = spare_tx.try_send(Box::new(Batch::new(owner)));
        }
        state.spare_txs.push(spare_tx);
        StageRecorder {
            batch: Some(Box::new(Batch::new(owner))),
            spare: None,
            full_tx: Some(self.full_tx.clone()),
            spare_rx: Some(spare_rx),
            sample_every: self.sample_every,
            countdown: self.sample_every,
            flush_interval_ns: self.flush_interval_ns,
            last_flush_ns: clock::now_ns(),
        }
    }

    /// Merges every batch handed off so far and returns the batches to their recorders.
    pub fn drain(&self) {
        let Ok(rx) = self.full_rx.lock() else { return };
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        // Bounded: at most every batch in circulation is waiting.
        for _ in 0..RECORDERS_MAX * BATCHES_PER_RECORDER {
            let Ok(mut batch) = rx.try_recv() else { break };
            let st = &mut *state;
            for i in 0..KINDS * LEGS {
                if batch.hist[i].is_empty() {
                    continue;
                }
                let _ = st.total[i].add(&batch.hist[i]);
                let _ = st.interval[i].add(&batch.hist[i]);
                st.total_sum_ns[i] = st.total_sum_ns[i].saturating_add(batch.sum_ns[i]);
            }
            batch.reset();
            if let Some(tx) = st.spare_txs.get(batch.owner) {
                let _ = tx.try_send(batch);
            }
        }
    }

    /// Percentiles since the last call, then starts a new interval.
    pub fn take_interval(&self) -> IntervalStats {
        self.drain();
        let mut out = IntervalStats {
            by_kind_leg: vec![None; KINDS * LEGS],
            by_leg: vec![None; LEGS],
        };
        let Ok(mut state) = self.state.lock() else {
            return out;
        };
        for leg in 0..LEGS {
            out.by_leg[leg] = Percentiles::of_recorded(&merged_leg(&state.interval, leg));
        }
        for (i, h) in state.interval.iter_mut().enumerate() {
            out.by_kind_leg[i] = Percentiles::of_recorded(h);
            h.reset();
        }
        out
    }

    /// Runs `f` over the histograms since the start and their exact sums, per (kind, leg).
    pub fn with_totals<R>(&self, f: impl FnOnce(&[Histogram<u64>], &[u64]) -> R) -> Option<R> {
        self.drain();
        let state = self.state.lock().ok()?;
        Some(f(&state.total, &state.total_sum_ns))
    }
}

/// Percentiles of one interval: per (kind, leg) at `kind * LEGS + leg`, and per leg over all
/// kinds.
#[derive(Clone, Debug)]
pub struct IntervalStats {
    pub by_kind_leg: Vec<Option<Percentiles>>,
    pub by_leg: Vec<Option<Percentiles>>,
}

impl IntervalStats {
    pub fn get(&self, kind: CommandKind, leg: usize) -> Option<Percentiles> {
        self.by_kind_leg
            .get(kind_index(kind) * LEGS + leg)
            .copied()
            .flatten()
    }
}

/// Merges the histograms of one leg over all kinds.
pub fn merged_leg(hist: &[Histogram<u64>], leg: usize) -> Histogram<u64> {
    let mut h = new_histogram();
    for k in 0..KINDS {
        let _ = h.add(&hist[k * LEGS + leg]);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legs_skip_unstamped_stages_and_add_up_to_door_to_door() {
        let mut t = Trace::new(CommandKind::NewOrder);
        t.stamp_at(Stage::SocketRead, 1_000);
        t.stamp_at(Stage::Decoded, 1_300);
        t.stamp_at(Stage::Processed, 2_000);
        t.stamp_at(Stage::Encoded, 2_100);
        t.stamp_at(Stage::MdPublished, 2_050);
        let mut legs = Vec::new();
        t.legs(|leg, ns| legs.push((leg, ns)));
        assert_eq!(
            legs,
            vec![
                (Stage::Decoded as usize, 300),
                (Stage::Processed as usize, 700),
                (Stage::Encoded as usize, 100),
                (LEG_DOOR_TO_DOOR, 1_100),
                (Stage::MdPublished as usize, 50),
            ]
        );
    }

    #[test]
    fn ltp_formula_splits_the_outside_time_in_two() {
        assert_eq!(ltp_network_leg_ns(1_000, 400), 300);
        assert_eq!(ltp_network_leg_ns(100, 400), 0);
    }

    #[test]
    fn sampling_takes_one_in_n() {
        let hub = ProbeHub::new(4, 1);
        let mut r = hub.recorder();
        let picks: Vec<usize> = (0..100).filter(|_| r.sample()).collect();
        assert_eq!(picks.len(), 25);
        assert_eq!(&picks[..3], &[3, 7, 11], "every 4th call");
        let mut every = ProbeHub::new(1, 1).recorder();
        assert!((0..10).all(|_| every.sample()));
        let mut off = StageRecorder::disabled();
        assert!(!(0..100).any(|_| off.sample()));
    }

    #[test]
    fn recorded_legs_reach_the_hub_after_a_flush_and_batches_circulate() {
        let hub = ProbeHub::new(1, 1);
        let mut r = hub.recorder();
        for round in 0..10u64 {
            for i in 0..100u64 {
                let mut t = Trace::new(CommandKind::Cancel);
                t.stamp_at(Stage::SocketRead, 10);
                t.stamp_at(Stage::Processed, 10 + 1_000 + i + round);
                r.record(&t);
            }
            r.flush();
            hub.drain();
        }
        let n = hub
            .with_totals(|h, sums| {
                let i = kind_index(CommandKind::Cancel) * LEGS + Stage::Processed as usize;
                assert!(sums[i] > 1_000 * 1_000);
                h[i].len()
            })
            .unwrap();
        assert_eq!(n, 1_000);
        let p = hub.take_interval();
        assert_eq!(
            p.get(CommandKind::Cancel, LEG_DOOR_TO_DOOR).unwrap().count,
            1_000
        );
        assert_eq!(p.by_leg[LEG_DOOR_TO_DOOR].unwrap().count, 1_000);
        assert!(
            hub.take_interval().by_leg[LEG_DOOR_TO_DOOR].is_none(),
            "interval starts anew"
        );
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// Prints what the probe path costs per sampled command (run with --ignored --nocapture).
    #[test]
    #[ignore]
    fn probe_cost_per_sampled_command() {
        let hub = ProbeHub::new(1, 100_000_000);
        let mut r = hub.recorder();
        let n = 2_000_000u64;
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            let _ = clock::now_ns();
        }
        let clock_ns = t0.elapsed().as_nanos() as f64 / n as f64;
        let t0 = std::time::Instant::now();
        for i in 0..n {
            let mut t = Trace::new(CommandKind::NewOrder);
            t.stamp_at(Stage::Committed, 1_000 + i);
            t.stamp_at(Stage::Processed, 1_300 + i % 1000);
            r.record(&t);
        }
        let record_ns = t0.elapsed().as_nanos() as f64 / n as f64;
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            let mut t = Trace::new(CommandKind::NewOrder);
            t.stamp(Stage::Committed);
            t.stamp(Stage::Processed);
            r.record(&t);
            r.maybe_flush(0);
        }
        let all_ns = t0.elapsed().as_nanos() as f64 / n as f64;
        eprintln!(
            "clock {clock_ns:.1} ns, record {record_ns:.1} ns, stamp+stamp+record {all_ns:.1} ns"
        );
    }
}
