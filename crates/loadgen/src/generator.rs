//! The open-loop generator: one worker's loop over a [`Target`].
//!
//! Commands go out on a schedule that does not wait for answers. Each command's latency is
//! counted from the moment it was *scheduled*, not from the moment it was actually sent, so
//! a stall in the target (or in the generator itself) shows up in the figures instead of
//! silently slowing the offered load (no coordinated omission). The only exception is the
//! closed-loop search phase, which by design pauses after a failed step until the target has
//! drained, and says so in the report.
//!
//! A worker owns a disjoint slice of each market's accounts and 1/workers of the rate; the
//! workers' [`Record`]s are merged afterwards.

use crate::flow::{Hot, MarketFlow, Op};
use crate::profile::{Pacing, Phase, Profile, Rate, SearchRate};
use crate::target::{Answer, SubmitError, Target, NOTIFY_TAG};
use bourse_core::*;
use bourse_engine::workload::Rng;
use hdrhistogram::Histogram;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const SECOND_NS: u64 = 1_000_000_000;
/// Recovery after a peak is judged on windows of this length.
pub const WINDOW_NS: u64 = 100_000_000;
/// Latencies are recorded from 1 ns to this (a later answer is recorded as this).
pub const LATENCY_NS_MAX: u64 = 100_000_000_000;
/// Commands sent in one turn of the loop before it looks at answers again.
const SEND_BURST_MAX: usize = 512;
/// A search step fails if more than this share of a second's load is still unanswered at its
/// end (a queue is building).
const SEARCH_BACKLOG_S_MAX: f64 = 0.05;
/// A search never offers less than its start rate divided by this.
const SEARCH_FLOOR_DIVISOR: f64 = 16.0;
/// After the last answer, notifications are taken until the target is quiet this long...
const SETTLE_QUIET: Duration = Duration::from_millis(200);
/// ...but for at most this long.
const SETTLE_MAX: Duration = Duration::from_secs(2);
/// After a failed search step, wait at most this long for the target to drain.
const SEARCH_DRAIN_NS_MAX: u64 = 3 * SECOND_NS;
/// Once the phases are over on the clock by this much, commands the schedule still holds
/// (a target that could not take them kept the generator behind) are no longer sent: they
/// are counted as not sent, and the run goes on to drain. Without this bound a target that
/// takes a tenth of the offered rate would keep the run going ten times the phases' length.
const SEND_LATE_NS_MAX: u64 = SECOND_NS;

/// A latency histogram with the precision of the summaries.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid histogram bounds")
}

/// A cheaper histogram, one per second of the run, for the load ranges.
pub fn second_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 2).expect("valid histogram bounds")
}

pub fn record(h: &mut Histogram<u64>, ns: u64) {
    let v = ns.clamp(1, h.high());
    // Clamped into range, so recording cannot fail; a failure would only lose one sample.
    let _ = h.record(v);
}

/// One second of the run. Rates count answers by the second they arrived in (what the
/// target processed); latency by the second the command was scheduled in.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Second {
    pub phase: u16,
    pub warmup: bool,
    pub offered: u64,
    pub answered: u64,
    pub transactions: u64,
    pub orders: u64,
    pub cancels: u64,
    pub trades: u64,
    pub rejects: u64,
    /// Of the rejects, requests the target refused as busy (overload: a gateway's busy or
    /// throttle reject), by the second the answer arrived.
    #[serde(default)]
    pub busy: u64,
    #[serde(skip)]
    pub latency: Option<Histogram<u64>>,
}

/// Latency of the answers that arrived in one window.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Window {
    pub count: u64,
    pub latency_ns_sum: u64,
    /// Of them, requests the target refused as busy (overload).
    #[serde(default)]
    pub busy: u64,
    /// Their latencies in [`WINDOW_BINS`] logarithmic bins (see [`window_bin`]); empty until
    /// the first answer. Enough for a window's 99th percentile to within one bin (12%).
    #[serde(default)]
    pub bins: Vec<u32>,
}

/// Latency bins of a [`Window`]: 20 per decade from 100 ns to 10 s, the last one open.
pub const WINDOW_BINS: usize = 161;
const WINDOW_BINS_PER_DECADE: f64 = 20.0;
const WINDOW_BIN_LOW_NS: f64 = 100.0;

/// The bin of a latency (0: up to 100 ns).
pub fn window_bin(ns: u64) -> usize {
    if ns as f64 <= WINDOW_BIN_LOW_NS {
        return 0;
    }
    let b = ((ns as f64 / WINDOW_BIN_LOW_NS).log10() * WINDOW_BINS_PER_DECADE).ceil() as usize;
    b.min(WINDOW_BINS - 1)
}

/// The upper bound of a bin, in nanoseconds (the open last bin: its lower bound).
pub fn window_bin_upper_ns(bin: usize) -> f64 {
    WINDOW_BIN_LOW_NS * 10f64.powf(bin.min(WINDOW_BINS - 2) as f64 / WINDOW_BINS_PER_DECADE)
}

impl Window {
    pub fn record(&mut self, latency_ns: u64, busy: bool) {
        self.count += 1;
        self.latency_ns_sum += latency_ns;
        self.busy += busy as u64;
        if self.bins.is_empty() {
            self.bins = vec![0; WINDOW_BINS];
        }
        self.bins[window_bin(latency_ns)] += 1;
    }

    pub fn add(&mut self, other: &Window) {
        self.count += other.count;
        self.latency_ns_sum += other.latency_ns_sum;
        self.busy += other.busy;
        if !other.bins.is_empty() {
            if self.bins.is_empty() {
                self.bins = vec![0; WINDOW_BINS];
            }
            for (a, b) in self.bins.iter_mut().zip(&other.bins) {
                *a += b;
            }
        }
    }
}

/// The 99th percentile of some windows' answers together, as the upper bound of its bin;
/// `None` without answers.
pub fn windows_p99_ns(windows: &[Window]) -> Option<f64> {
    let mut all = Window::default();
    for w in windows {
        all.add(w);
    }
    if all.count == 0 {
        return None;
    }
    // The rank of the 99th percentile, rounded up (at least the first answer).
    let rank = (all.count * 99).div_ceil(100).max(1);
    let mut seen = 0u64;
    for (bin, &n) in all.bins.iter().enumerate() {
        seen += u64::from(n);
        if seen >= rank {
            return Some(window_bin_upper_ns(bin));
        }
    }
    None
}

/// One step of a closed-loop search.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SearchStep {
    pub worker: u32,
    pub phase: u16,
    pub start_s: f64,
    pub offered_per_s: f64,
    pub answered_per_s: f64,
    pub p99_ns: u64,
    pub kept_up: bool,
}

/// Counts over the whole run (warm-up included), for the cross-checks.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Counts {
    pub sent: u64,
    pub answered: u64,
    pub unanswered: u64,
    pub transactions: u64,
    pub orders_accepted: u64,
    pub orders_rejected: u64,
    pub cancels_ok: u64,
    pub replaces_ok: u64,
    pub mass_cancels_ok: u64,
    pub cancel_rejects: u64,
    pub trades: u64,
    pub order_log_new: u64,
    pub order_log_delete: u64,
    /// Times a submit found the queue to a core full.
    pub queue_full: u64,
    /// Requests the target answered with a busy or throttle reject (overload refused at the
    /// door: not processed at all).
    #[serde(default)]
    pub busy_rejects: u64,
    /// Commands the schedule offered that were never sent: still due when the phases had
    /// ended on the clock (the target did not take them in time), estimated from the
    /// schedule's rate.
    #[serde(default)]
    pub not_sent: u64,
    pub sent_by_op: [u64; 7],
    pub ok_by_op: [u64; 7],
}

/// What one worker measured; [`Record::merge`] adds workers together.
pub struct Record {
    pub by_op: Vec<Histogram<u64>>,
    pub all: Histogram<u64>,
    pub seconds: Vec<Second>,
    pub windows: Vec<Window>,
    /// Sums over measured answers: lateness of the send, queue in, matching, queue out.
    pub stage_ns_sums: [u128; 4],
    pub stage_samples: u64,
    pub counts: Counts,
    pub search: Vec<SearchStep>,
    pub elapsed_ns: u64,
}

impl Record {
    fn new() -> Record {
        Record {
            by_op: Op::ALL.iter().map(|_| histogram()).collect(),
            all: histogram(),
            seconds: Vec::new(),
            windows: Vec::new(),
            stage_ns_sums: [0; 4],
            stage_samples: 0,
            counts: Counts::default(),
            search: Vec::new(),
            elapsed_ns: 0,
        }
    }

    fn second(&mut self, index: usize) -> &mut Second {
        if self.seconds.len() <= index {
            self.seconds.resize_with(index + 1, Second::default);
        }
        &mut self.seconds[index]
    }

    /// Second `index` of the run, unless it is past the `kept` first seconds (the profile's
    /// `series_seconds_max`): then `None`, and what happened in it counts in the totals only.
    fn kept_second(&mut self, index: usize, kept: usize) -> Option<&mut Second> {
        if index < kept {
            Some(self.second(index))
        } else {
            None
        }
    }

    /// Records an answer's latency in its 100 ms window, unless the window is past the kept
    /// seconds.
    fn window_record(&mut self, received_ns: u64, kept_s: usize, latency_ns: u64, busy: bool) {
        let w = (received_ns / WINDOW_NS) as usize;
        if w >= kept_s.saturating_mul((SECOND_NS / WINDOW_NS) as usize) {
            return;
        }
        if self.windows.len() <= w {
            self.windows.resize(w + 1, Window::default());
        }
        self.windows[w].record(latency_ns, busy);
    }

    pub fn merge(&mut self, other: Record) {
        for (a, b) in self.by_op.iter_mut().zip(&other.by_op) {
            let _ = a.add(b);
        }
        let _ = self.all.add(&other.all);
        for (i, s) in other.seconds.into_iter().enumerate() {
            let d = self.second(i);
            d.phase = s.phase;
            d.warmup = s.warmup;
            d.offered += s.offered;
            d.answered += s.answered;
            d.transactions += s.transactions;
            d.orders += s.orders;
            d.cancels += s.cancels;
            d.trades += s.trades;
            d.rejects += s.rejects;
            d.busy += s.busy;
            match (&mut d.latency, s.latency) {
                (Some(a), Some(b)) => {
                    let _ = a.add(&b);
                }
                (a @ None, b) => *a = b,
                _ => {}
            }
        }
        if self.windows.len() < other.windows.len() {
            self.windows.resize(other.windows.len(), Window::default());
        }
        for (a, b) in self.windows.iter_mut().zip(&other.windows) {
            a.add(b);
        }
        for i in 0..4 {
            self.stage_ns_sums[i] += other.stage_ns_sums[i];
        }
        self.stage_samples += other.stage_samples;
        let (c, o) = (&mut self.counts, other.counts);
        c.sent += o.sent;
        c.answered += o.answered;
        c.unanswered += o.unanswered;
        c.transactions += o.transactions;
        c.orders_accepted += o.orders_accepted;
        c.orders_rejected += o.orders_rejected;
        c.cancels_ok += o.cancels_ok;
        c.replaces_ok += o.replaces_ok;
        c.mass_cancels_ok += o.mass_cancels_ok;
        c.cancel_rejects += o.cancel_rejects;
        c.trades += o.trades;
        c.order_log_new += o.order_log_new;
        c.order_log_delete += o.order_log_delete;
        c.queue_full += o.queue_full;
        c.busy_rejects += o.busy_rejects;
        c.not_sent += o.not_sent;
        for i in 0..7 {
            c.sent_by_op[i] += o.sent_by_op[i];
            c.ok_by_op[i] += o.ok_by_op[i];
        }
        self.search.extend(other.search);
        self.elapsed_ns = self.elapsed_ns.max(other.elapsed_ns);
    }
}

/// A histogram as (value, count) pairs of its recorded buckets: exact at the histogram's
/// precision, and readable by any process (a worker process hands its record to the parent).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HistogramWire(pub Vec<(u64, u64)>);

impl HistogramWire {
    pub fn of(h: &Histogram<u64>) -> HistogramWire {
        HistogramWire(
            h.iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
        )
    }

    /// Adds the recorded values into `h` (values out of its range are clamped into it).
    pub fn into_histogram(&self, mut h: Histogram<u64>) -> Histogram<u64> {
        for &(value, count) in &self.0 {
            let _ = h.record_n(value.clamp(1, h.high()), count);
        }
        h
    }
}

/// A [`Record`] as JSON: what a `bourse loadgen-worker` process writes for its parent.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RecordWire {
    pub by_op: Vec<HistogramWire>,
    pub all: HistogramWire,
    pub seconds: Vec<Second>,
    pub second_latency: Vec<Option<HistogramWire>>,
    pub windows: Vec<Window>,
    pub stage_ns_sums: [u128; 4],
    pub stage_samples: u64,
    pub counts: Counts,
    pub search: Vec<SearchStep>,
    pub elapsed_ns: u64,
}

impl RecordWire {
    pub fn of(r: &Record) -> RecordWire {
        RecordWire {
            by_op: r.by_op.iter().map(HistogramWire::of).collect(),
            all: HistogramWire::of(&r.all),
            seconds: r.seconds.clone(),
            second_latency: r
                .seconds
                .iter()
                .map(|s| s.latency.as_ref().map(HistogramWire::of))
                .collect(),
            windows: r.windows.clone(),
            stage_ns_sums: r.stage_ns_sums,
            stage_samples: r.stage_samples,
            counts: r.counts,
            search: r.search.clone(),
            elapsed_ns: r.elapsed_ns,
        }
    }

    pub fn into_record(self) -> Record {
        let mut seconds = self.seconds;
        for (s, h) in seconds.iter_mut().zip(&self.second_latency) {
            s.latency = h.as_ref().map(|h| h.into_histogram(second_histogram()));
        }
        Record {
            by_op: Op::ALL
                .iter()
                .enumerate()
                .map(|(i, _)| match self.by_op.get(i) {
                    Some(h) => h.into_histogram(histogram()),
                    None => histogram(),
                })
                .collect(),
            all: self.all.into_histogram(histogram()),
            seconds,
            windows: self.windows,
            stage_ns_sums: self.stage_ns_sums,
            stage_samples: self.stage_samples,
            counts: self.counts,
            search: self.search,
            elapsed_ns: self.elapsed_ns,
        }
    }
}

/// Live figures every worker adds to, for the progress bar.
#[derive(Debug, Default)]
pub struct Live {
    pub sent: AtomicU64,
    pub transactions: AtomicU64,
    pub trades: AtomicU64,
    /// Commands answered (successful or not).
    pub answered: AtomicU64,
    /// Set to end the run early (Ctrl-C in the demo): workers stop sending and drain.
    pub stop: std::sync::atomic::AtomicBool,
}

/// When each phase starts, in nanoseconds from the start of the run.
pub fn phase_starts_ns(profile: &Profile) -> Vec<u64> {
    let mut t = 0u64;
    profile
        .phases
        .iter()
        .map(|p| {
            let s = t;
            t += (p.duration_s * 1e9) as u64;
            s
        })
        .collect()
}

/// The peaks of every `peaks` phase, as (start, end) in nanoseconds from the run's start.
pub fn peaks_ns(profile: &Profile) -> Vec<(u64, u64)> {
    let starts = phase_starts_ns(profile);
    let mut v = Vec::new();
    for (p, &start) in profile.phases.iter().zip(&starts) {
        if let Rate::Peaks(r) = &p.rate {
            let period = (r.period_s * 1e9) as u64;
            let peak = (r.peak_s * 1e9) as u64;
            let end = start + (p.duration_s * 1e9) as u64;
            let mut t = start;
            // The peak sits in the middle of each period: base load before it (the baseline)
            // and after it (the recovery), both inside the phase.
            while t + period <= end && period > 0 {
                let from = t + (period - peak) / 2;
                v.push((from, from + peak));
                t += period;
            }
        }
    }
    v
}

/// The offered rate (all workers together) at `t_s` seconds into `phase`, and whether a peak
/// is on. `search_rate` is the rate a search phase has reached.
fn rate_at(phase: &Phase, t_s: f64, search_rate: f64) -> (f64, bool) {
    match &phase.rate {
        Rate::Constant(r) => (r.per_s, false),
        Rate::Ramp(r) => (
            r.from_per_s + (r.to_per_s - r.from_per_s) * (t_s / phase.duration_s).min(1.0),
            false,
        ),
        Rate::Steps(r) => {
            let v = r.from_per_s + r.step_per_s * (t_s / r.step_s).floor();
            let (lo, hi) = if r.from_per_s <= r.to_per_s {
                (r.from_per_s, r.to_per_s)
            } else {
                (r.to_per_s, r.from_per_s)
            };
            (v.clamp(lo, hi), false)
        }
        Rate::Peaks(r) => {
            let pos = t_s % r.period_s;
            let from = (r.period_s - r.peak_s) / 2.0;
            if pos >= from && pos < from + r.peak_s {
                (r.peak_per_s, true)
            } else {
                (r.base_per_s, false)
            }
        }
        Rate::Search(_) => (search_rate, false),
    }
}

struct Pending {
    scheduled_ns: u64,
    market: u16,
    op: Op,
    measured: bool,
}

/// The state of a closed-loop search phase.
struct Search {
    spec: SearchRate,
    phase: u16,
    rate: f64,
    good: Option<f64>,
    bad: Option<f64>,
    step_start_ns: u64,
    step_offered: u64,
    step_answered: u64,
    step_latency: Histogram<u64>,
    /// After a failed step: no sending until the target drained, or until this time.
    draining_until_ns: Option<u64>,
    /// The last step kept up with the rate but missed the p99 limit, and is being run again
    /// at the same rate before the rate counts as failed.
    retrying: bool,
}

impl Search {
    fn new(spec: &SearchRate, phase: u16, now_ns: u64) -> Search {
        Search {
            spec: spec.clone(),
            phase,
            rate: spec.start_per_s,
            good: None,
            bad: None,
            step_start_ns: now_ns,
            step_offered: 0,
            step_answered: 0,
            step_latency: second_histogram(),
            draining_until_ns: None,
            retrying: false,
        }
    }

    /// Ends a step: judges it and picks the next rate.
    fn judge(&mut self, now_ns: u64, inflight: usize, worker: u32, workers: u32) -> SearchStep {
        let seconds = (now_ns - self.step_start_ns) as f64 / 1e9;
        let answered_per_s = self.step_answered as f64 / seconds.max(1e-9) * workers as f64;
        let p99 = self.step_latency.value_at_quantile(0.99);
        let backlog_ok = (inflight as f64) <= self.rate / workers as f64 * SEARCH_BACKLOG_S_MAX;
        let carried = self.step_offered > 0
            && self.step_answered as f64 >= self.step_offered as f64 * self.spec.keep_up_share
            && backlog_ok;
        let kept_up = carried && p99 as f64 <= self.spec.p99_limit_us * 1e3;
        // A step that carried the rate but missed the p99 limit is run once more at the same
        // rate before the rate counts as failed: on a shared machine one fsync or scheduling
        // stall can put a 2 s step's p99 over the limit at any rate, and a search that takes
        // that for the rate's limit never climbs past it again.
        let retry = !kept_up && carried && !self.retrying;
        let step = SearchStep {
            worker,
            phase: self.phase,
            start_s: self.step_start_ns as f64 / 1e9,
            // The rate the step was run at (all workers): what "sustainable" refers to.
            offered_per_s: self.rate,
            answered_per_s,
            p99_ns: p99,
            kept_up,
        };
        let rate = self.rate;
        self.retrying = retry;
        if retry {
            self.step_start_ns = now_ns;
            self.step_offered = 0;
            self.step_answered = 0;
            self.step_latency.reset();
            return step;
        }
        if kept_up {
            self.good = Some(self.good.map_or(rate, |g| g.max(rate)));
        } else {
            self.bad = Some(self.bad.map_or(rate, |b| b.min(rate)));
            self.draining_until_ns = Some(now_ns + SEARCH_DRAIN_NS_MAX);
        }
        self.rate = match (self.good, self.bad) {
            (Some(g), None) => (g * self.spec.factor).min(self.spec.max_per_s),
            // Nothing kept up yet: go down, but not forever. On a noisy machine the latency
            // limit may not be met at any rate, and a search that ends at a handful of
            // commands per second says nothing; the floor makes that failure visible.
            (None, Some(b)) => {
                (b / self.spec.factor).max(self.spec.start_per_s / SEARCH_FLOOR_DIVISOR)
            }
            (Some(g), Some(b)) if b > g * 1.05 => (g + b) / 2.0,
            // Converged: hold at the best rate that kept up.
            (Some(g), Some(_)) => g,
            (None, None) => rate,
        };
        self.step_start_ns = now_ns;
        self.step_offered = 0;
        self.step_answered = 0;
        self.step_latency.reset();
        step
    }
}

/// How many commands one worker's schedule offers from `from_ns` to `to_ns` (the rate
/// integrated over 1 ms steps; a search phase counts at its start rate).
fn unsent_of_schedule(
    profile: &Profile,
    starts: &[u64],
    from_ns: u64,
    to_ns: u64,
    workers: u32,
) -> u64 {
    const STEP_NS: u64 = 1_000_000;
    let mut sum = 0.0;
    let mut t = from_ns;
    while t < to_ns {
        let i = starts.iter().rposition(|&s| s <= t).unwrap_or(0);
        let phase = &profile.phases[i];
        let search_rate = match &phase.rate {
            Rate::Search(s) => s.start_per_s,
            _ => 0.0,
        };
        let (rate, _) = rate_at(phase, (t - starts[i]) as f64 / 1e9, search_rate);
        let dt = STEP_NS.min(to_ns - t);
        sum += rate / workers.max(1) as f64 * dt as f64 / 1e9;
        t += dt;
    }
    sum.round() as u64
}

/// What a worker needs to run.
pub struct Worker {
    pub index: u32,
    pub workers: u32,
    pub profile: Arc<Profile>,
    pub flows: Vec<MarketFlow>,
    pub live: Arc<Live>,
}

/// Classifies a command's answer the way the seeds count: a new order registered, or a
/// cancel (or replace, or mass cancel) that succeeded, is a successful transaction.
fn classify(op: Op, events: &[Event]) -> (bool, u64, u64, u64, u64, bool) {
    let mut accepted = 0;
    let mut trades = 0;
    let mut log_new = 0;
    let mut log_delete = 0;
    let mut ok = false;
    let mut rejected = false;
    for e in events {
        match e {
            Event::OrderAccepted { .. } => {
                accepted += 1;
                if op.is_new_order() {
                    ok = true;
                }
            }
            Event::Trade { .. } => trades += 1,
            Event::OrderCancelled { reason, .. }
                if op == Op::Cancel && *reason == CancelReason::Requested =>
            {
                ok = true
            }
            Event::OrderReplaced { .. } if op == Op::Replace => ok = true,
            Event::MassCancelDone { .. } if op == Op::MassCancel => ok = true,
            Event::OrderRejected { .. }
            | Event::CancelRejected { .. }
            | Event::CommandRejected { .. } => rejected = true,
            Event::OrderLog(l) => match l.action {
                OrderLogAction::New => log_new += 1,
                OrderLogAction::Delete => log_delete += 1,
                OrderLogAction::Change => {}
            },
            _ => {}
        }
    }
    (ok, accepted, trades, log_new, log_delete, rejected)
}

impl Worker {
    /// Takes a notification: events about this worker's orders that no answer of its own
    /// carried (a resting order filled or cancelled by another command, or, through a
    /// gateway, the reports that follow the acknowledgement of a request). Targets put each
    /// trade and each order-log record in exactly one answer or notification, so counting
    /// both counts each once. Returns the trades it held.
    fn notification(&mut self, rec: &mut Record, a: &Answer, start: Instant) -> u64 {
        if let Some(f) = self.flows.get_mut(a.market) {
            f.observe(&a.events);
        }
        let (_, _, trades, log_new, log_delete, _) = classify(Op::Limit, &a.events);
        let c = &mut rec.counts;
        c.trades += trades;
        c.order_log_new += log_new;
        c.order_log_delete += log_delete;
        if trades > 0 {
            let received_ns = a.received.saturating_duration_since(start).as_nanos() as u64;
            let kept = self.profile.generator.series_seconds_max as usize;
            if let Some(sec) = rec.kept_second((received_ns / SECOND_NS) as usize, kept) {
                sec.trades += trades;
            }
        }
        trades
    }

    /// Runs every phase against `target` and returns what was measured. Bounded: it stops
    /// after the last phase plus the drain timeout, whatever the target does.
    pub fn run<T: Target + ?Sized>(
        mut self,
        target: &mut T,
        start: Instant,
    ) -> Result<Record, String> {
        let profile = self.profile.clone();
        let workers = self.workers.max(1);
        let starts = phase_starts_ns(&profile);
        let total_ns = starts.last().copied().unwrap_or(0)
            + (profile.phases.last().map_or(0.0, |p| p.duration_s) * 1e9) as u64;
        let drain_ns = (profile.generator.drain_timeout_s * 1e9) as u64;
        let inflight_max = profile.generator.inflight_max as usize;
        let share_total: f64 = profile.markets.iter().map(|m| m.share).sum();
        let market_ppm: Vec<u64> = profile
            .markets
            .iter()
            .scan(0.0, |acc, m| {
                *acc += m.share / share_total;
                Some((*acc * 1e6).round() as u64)
            })
            .collect();
        let mut rng = Rng::new(profile.seed ^ 0xA5A5_0000 ^ self.index as u64);
        let mut rec = Record::new();
        let kept_s = profile.generator.series_seconds_max as usize;
        let mut pending: FxHashMap<u64, Pending> = FxHashMap::default();
        pending.reserve(inflight_max.min(1 << 16));
        let mut answers: Vec<Answer> = Vec::with_capacity(SEND_BURST_MAX * 4);
        let mut next_tag: u64 = (self.index as u64) << 48;
        // Each worker starts at a different offset inside the first gap, so that uniform
        // pacing from several workers interleaves instead of sending in lockstep.
        let mut next_ns: f64 = 0.0;
        let mut held: Option<(u16, Op, Command)> = None;
        let mut phase_index = 0usize;
        let mut search: Option<Search> = None;
        let mut hot_applied: Option<Hot> = None;
        let mut live_flush = Instant::now();
        let mut live_sent = 0u64;
        let mut live_tx = 0u64;
        let mut live_answered = 0u64;
        let mut live_trades = 0u64;
        let mut done_sending = false;
        let mut stopped_at_ns: Option<u64> = None;
        let mut first_gap = true;
        loop {
            let now = Instant::now();
            let t_ns = now.saturating_duration_since(start).as_nanos() as u64;
            // ---- send what is due ----
            let mut burst = 0;
            if !done_sending && self.live.stop.load(Ordering::Relaxed) {
                done_sending = true;
            }
            if !done_sending && t_ns >= total_ns + SEND_LATE_NS_MAX && (next_ns as u64) < total_ns {
                rec.counts.not_sent = held.take().map_or(0, |_| 1)
                    + unsent_of_schedule(&profile, &starts, next_ns as u64, total_ns, workers);
                done_sending = true;
            }
            while !done_sending && burst < SEND_BURST_MAX {
                while phase_index + 1 < starts.len() && next_ns as u64 >= starts[phase_index + 1] {
                    phase_index += 1;
                }
                if next_ns as u64 >= total_ns {
                    done_sending = true;
                    break;
                }
                let phase = &profile.phases[phase_index];
                let phase_t_s = (next_ns as u64 - starts[phase_index]) as f64 / 1e9;
                // The search phase decides its own rate from what it measures.
                if let Rate::Search(spec) = &phase.rate {
                    let s = search.get_or_insert_with(|| {
                        Search::new(
                            spec,
                            phase_index as u16,
                            starts[phase_index].max(t_ns.min(next_ns as u64)),
                        )
                    });
                    if let Some(until) = s.draining_until_ns {
                        if pending.is_empty() || t_ns >= until {
                            s.draining_until_ns = None;
                            s.step_start_ns = t_ns;
                            s.step_offered = 0;
                            s.step_answered = 0;
                            s.step_latency.reset();
                            next_ns = next_ns.max(t_ns as f64);
                        } else {
                            break;
                        }
                    }
                    if t_ns >= s.step_start_ns + (spec.step_s * 1e9) as u64 {
                        let step = s.judge(t_ns, pending.len(), self.index, workers);
                        rec.search.push(step);
                        if s.draining_until_ns.is_some() {
                            break;
                        }
                    }
                } else if let Some(s) = search.take() {
                    // Leaving a search phase: judge its last, partial step.
                    let mut s = s;
                    if s.step_offered > 0 {
                        let step = s.judge(
                            t_ns.max(s.step_start_ns + 1),
                            pending.len(),
                            self.index,
                            workers,
                        );
                        rec.search.push(step);
                    }
                }
                if next_ns > t_ns as f64 {
                    break;
                }
                if held.is_none() && pending.len() >= inflight_max {
                    break;
                }
                let search_rate = search.as_ref().map_or(0.0, |s| s.rate);
                let (rate_all, in_peak) = rate_at(phase, phase_t_s, search_rate);
                let hot = phase.hot.and_then(|h| {
                    (!h.during_peaks_only || in_peak).then_some(Hot {
                        instruments: h.instruments,
                        share_ppm: (h.share * 1e6) as u64,
                    })
                });
                if hot != hot_applied {
                    for f in &mut self.flows {
                        f.set_hot(hot);
                    }
                    hot_applied = hot;
                }
                let (market, op, command) = match held.take() {
                    Some(h) => h,
                    None => {
                        let pick = rng.below(1_000_000);
                        let market = market_ppm.iter().position(|&p| pick < p).unwrap_or(0);
                        let (op, body) = self.flows[market].next_command();
                        (market as u16, op, Command::new(0, body))
                    }
                };
                let tag = next_tag;
                let lateness_ns = t_ns.saturating_sub(next_ns as u64);
                match target.submit(tag, market as usize, command.clone()) {
                    Ok(()) => {}
                    Err(SubmitError::Full) => {
                        rec.counts.queue_full += 1;
                        held = Some((market, op, command));
                        break;
                    }
                    Err(SubmitError::Closed(why)) => return Err(why),
                }
                next_tag += 1;
                let scheduled_ns = next_ns as u64;
                let measured = !phase.warmup;
                pending.insert(
                    tag,
                    Pending {
                        scheduled_ns,
                        market,
                        op,
                        measured,
                    },
                );
                rec.stage_ns_sums[0] += if measured { lateness_ns as u128 } else { 0 };
                rec.counts.sent += 1;
                rec.counts.sent_by_op[op.index()] += 1;
                live_sent += 1;
                if let Some(sec) = rec.kept_second((scheduled_ns / SECOND_NS) as usize, kept_s) {
                    sec.offered += 1;
                    sec.phase = phase_index as u16;
                    sec.warmup = phase.warmup;
                }
                if let Some(s) = search.as_mut() {
                    s.step_offered += 1;
                }
                let rate = (rate_all / workers as f64).max(1e-3);
                let gap_ns = match profile.generator.pacing {
                    Pacing::Uniform => 1e9 / rate,
                    Pacing::Poisson => {
                        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                        -(1.0 - u).ln() * 1e9 / rate
                    }
                };
                if first_gap {
                    first_gap = false;
                    next_ns += gap_ns * self.index as f64 / workers as f64;
                }
                next_ns += gap_ns;
                burst += 1;
            }
            // ---- take answers ----
            let draining = search
                .as_ref()
                .is_some_and(|s| s.draining_until_ns.is_some());
            let wait = if done_sending {
                Duration::from_millis(1)
            } else if draining {
                Duration::from_micros(200)
            } else if held.is_some() || pending.len() >= inflight_max {
                Duration::from_micros(20)
            } else {
                let now_ns = start.elapsed().as_nanos() as u64;
                Duration::from_nanos((next_ns as u64).saturating_sub(now_ns).min(1_000_000))
            };
            answers.clear();
            match target.poll(&mut answers, wait) {
                Ok(_) => {}
                Err(SubmitError::Closed(why)) => return Err(why),
                Err(SubmitError::Full) => return Err("the target refused to answer".into()),
            }
            for a in answers.drain(..) {
                if a.tag == NOTIFY_TAG {
                    live_trades += self.notification(&mut rec, &a, start);
                    continue;
                }
                let Some(p) = pending.remove(&a.tag) else {
                    continue;
                };
                let received_ns = a.received.saturating_duration_since(start).as_nanos() as u64;
                let latency_ns = received_ns.saturating_sub(p.scheduled_ns);
                let (ok, accepted, trades, log_new, log_delete, rejected) =
                    classify(p.op, &a.events);
                self.flows[p.market as usize].observe(&a.events);
                let c = &mut rec.counts;
                c.answered += 1;
                c.orders_accepted += accepted;
                c.trades += trades;
                c.order_log_new += log_new;
                c.order_log_delete += log_delete;
                if ok {
                    c.transactions += 1;
                    c.ok_by_op[p.op.index()] += 1;
                    match p.op {
                        Op::Cancel => c.cancels_ok += 1,
                        Op::Replace => c.replaces_ok += 1,
                        Op::MassCancel => c.mass_cancels_ok += 1,
                        _ => {}
                    }
                }
                if a.busy {
                    c.busy_rejects += 1;
                }
                if rejected {
                    if p.op.is_new_order() {
                        c.orders_rejected += 1;
                    } else {
                        c.cancel_rejects += 1;
                    }
                }
                live_tx += ok as u64;
                live_answered += 1;
                live_trades += trades;
                if let Some(sec) = rec.kept_second((received_ns / SECOND_NS) as usize, kept_s) {
                    sec.answered += 1;
                    sec.transactions += ok as u64;
                    sec.orders += accepted;
                    sec.cancels += (ok && p.op == Op::Cancel) as u64;
                    sec.trades += trades;
                    sec.rejects += rejected as u64;
                    sec.busy += a.busy as u64;
                }
                let scheduled_s = (p.scheduled_ns / SECOND_NS) as usize;
                if let Some(lat_sec) = rec.kept_second(scheduled_s, kept_s) {
                    record(
                        lat_sec.latency.get_or_insert_with(second_histogram),
                        latency_ns,
                    );
                }
                rec.window_record(received_ns, kept_s, latency_ns, a.busy);
                if p.measured {
                    record(&mut rec.all, latency_ns);
                    record(&mut rec.by_op[p.op.index()], latency_ns);
                    if let Some(s) = a.stages {
                        rec.stage_ns_sums[1] += s.queue_in_ns as u128;
                        rec.stage_ns_sums[2] += s.matching_ns as u128;
                        rec.stage_ns_sums[3] += s.queue_out_ns as u128;
                        rec.stage_samples += 1;
                    }
                }
                if let Some(s) = search.as_mut() {
                    // A request refused as busy was not served: a step whose load the target
                    // refused in part did not keep up, however quick the refusals were.
                    s.step_answered += u64::from(!a.busy);
                    record(&mut s.step_latency, latency_ns);
                }
            }
            if live_flush.elapsed() >= Duration::from_millis(50) {
                self.live.sent.fetch_add(live_sent, Ordering::Relaxed);
                self.live.transactions.fetch_add(live_tx, Ordering::Relaxed);
                self.live.trades.fetch_add(live_trades, Ordering::Relaxed);
                self.live
                    .answered
                    .fetch_add(live_answered, Ordering::Relaxed);
                (live_sent, live_tx, live_trades, live_answered) = (0, 0, 0, 0);
                live_flush = Instant::now();
            }
            if done_sending {
                let t = start.elapsed().as_nanos() as u64;
                let stopped_ns = stopped_at_ns.get_or_insert(t.min(total_ns));
                if pending.is_empty() || t >= *stopped_ns + drain_ns {
                    break;
                }
            }
        }
        // Reports about this worker's orders can trail the last answer (the fills and the
        // cancelled remainder that follow an acknowledgement through a gateway): take them
        // until the target has been quiet for a moment, within a bound.
        let settle_until = Instant::now() + SETTLE_MAX;
        let mut quiet_since = Instant::now();
        while Instant::now() < settle_until && quiet_since.elapsed() < SETTLE_QUIET {
            answers.clear();
            match target.poll(&mut answers, Duration::from_millis(5)) {
                Ok(0) => {}
                Ok(_) => quiet_since = Instant::now(),
                Err(_) => break,
            }
            for a in answers.drain(..) {
                if a.tag == NOTIFY_TAG {
                    live_trades += self.notification(&mut rec, &a, start);
                }
            }
        }
        if let Some(mut s) = search.take() {
            if s.step_offered > 0 {
                let t = start.elapsed().as_nanos() as u64;
                let step = s.judge(
                    t.max(s.step_start_ns + 1),
                    pending.len(),
                    self.index,
                    workers,
                );
                rec.search.push(step);
            }
        }
        self.live.sent.fetch_add(live_sent, Ordering::Relaxed);
        self.live.transactions.fetch_add(live_tx, Ordering::Relaxed);
        self.live.trades.fetch_add(live_trades, Ordering::Relaxed);
        self.live
            .answered
            .fetch_add(live_answered, Ordering::Relaxed);
        rec.counts.unanswered = pending.len() as u64;
        rec.elapsed_ns = start.elapsed().as_nanos() as u64;
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_p99_is_the_bin_of_the_99th_answer_and_busy_answers_are_counted() {
        let mut w = Window::default();
        // 98 answers of 1 ms and 2 of 100 ms: the 99th is 100 ms (rank 99 of 100).
        for i in 0..100 {
            let ns = if i < 98 { 1_000_000 } else { 100_000_000 };
            w.record(ns, i % 10 == 0);
        }
        assert_eq!(w.busy, 10);
        let p99 = windows_p99_ns(std::slice::from_ref(&w)).unwrap();
        assert!((100_000_000.0..=112_300_000.0).contains(&p99), "{p99}");
        // With 99 quick answers the 99th is quick.
        let mut quick = Window::default();
        for _ in 0..99 {
            quick.record(1_000_000, false);
        }
        quick.record(100_000_000, false);
        let p99 = windows_p99_ns(std::slice::from_ref(&quick)).unwrap();
        assert!((1_000_000.0..=1_123_000.0).contains(&p99), "{p99}");
        assert_eq!(windows_p99_ns(&[Window::default()]), None);
        // Windows add up.
        let mut both = w.clone();
        both.add(&quick);
        assert_eq!((both.count, both.busy), (200, 10));
    }

    fn profile_with(rate: &str, duration_s: u32) -> Profile {
        Profile::parse(&format!(
            r#"
name = "t"
[[markets]]
name = "eq"
kind = "equity"
instruments = 2
accounts = 10
[mix]
limit = 1
market = 0
ioc = 0
fok = 0
cancel = 1
replace = 0
[[phases]]
name = "p"
duration_s = {duration_s}
[phases.rate]
{rate}
"#
        ))
        .unwrap()
    }

    #[test]
    fn peaks_sit_in_the_middle_of_each_period_with_base_load_around_them() {
        let p = profile_with(
            "shape = \"peaks\"\nbase_per_s = 100\npeak_per_s = 500\npeak_s = 5\nperiod_s = 30",
            90,
        );
        let peaks = peaks_ns(&p);
        assert_eq!(
            peaks,
            vec![
                (12_500_000_000, 17_500_000_000),
                (42_500_000_000, 47_500_000_000),
                (72_500_000_000, 77_500_000_000)
            ]
        );
        let phase = &p.phases[0];
        assert_eq!(rate_at(phase, 12.0, 0.0), (100.0, false));
        assert_eq!(rate_at(phase, 13.0, 0.0), (500.0, true));
        assert_eq!(rate_at(phase, 18.0, 0.0), (100.0, false));
        assert_eq!(rate_at(phase, 43.0, 0.0), (500.0, true));
    }

    #[test]
    fn commands_not_sent_are_counted_from_the_schedule() {
        let p = profile_with("shape = \"constant\"\nper_s = 1000", 10);
        let starts = phase_starts_ns(&p);
        // 4 s of a 1,000/s schedule left, over two workers.
        assert_eq!(
            unsent_of_schedule(&p, &starts, 6 * SECOND_NS, 10 * SECOND_NS, 2),
            2_000
        );
        let p = profile_with("shape = \"ramp\"\nfrom_per_s = 1000\nto_per_s = 3000", 10);
        let starts = phase_starts_ns(&p);
        // The last half of a ramp from 1,000 to 3,000/s over 10 s offers 12,500.
        let n = unsent_of_schedule(&p, &starts, 5 * SECOND_NS, 10 * SECOND_NS, 1);
        assert!((12_499..=12_501).contains(&n), "{n}");
    }

    #[test]
    fn ramps_and_steps_follow_their_shape() {
        let p = profile_with("shape = \"ramp\"\nfrom_per_s = 100\nto_per_s = 300", 10);
        assert_eq!(rate_at(&p.phases[0], 5.0, 0.0).0, 200.0);
        let p = profile_with(
            "shape = \"steps\"\nfrom_per_s = 1000\nto_per_s = 200\nstep_per_s = -300\nstep_s = 2",
            10,
        );
        let r: Vec<f64> = [0.0, 2.0, 4.0, 6.0, 9.0]
            .iter()
            .map(|t| rate_at(&p.phases[0], *t, 0.0).0)
            .collect();
        assert_eq!(r, vec![1000.0, 700.0, 400.0, 200.0, 200.0]);
    }

    #[test]
    fn a_search_climbs_while_steps_keep_up_and_bisects_after_a_failure() {
        let spec = SearchRate {
            start_per_s: 1000.0,
            max_per_s: 1e6,
            factor: 2.0,
            step_s: 1.0,
            p99_limit_us: 1000.0,
            keep_up_share: 0.97,
        };
        let mut s = Search::new(&spec, 0, 0);
        let step = |s: &mut Search, ok: bool, t: u64| {
            s.step_offered = 1000;
            s.step_answered = if ok { 1000 } else { 500 };
            record(&mut s.step_latency, 10_000);
            s.judge(t, 0, 0, 1)
        };
        assert!(step(&mut s, true, SECOND_NS).kept_up);
        assert_eq!(s.rate, 2000.0);
        assert!(step(&mut s, true, 2 * SECOND_NS).kept_up);
        assert_eq!(s.rate, 4000.0);
        assert!(!step(&mut s, false, 3 * SECOND_NS).kept_up);
        assert_eq!(
            s.rate, 3000.0,
            "halfway between the last good and the failed rate"
        );
        assert!(s.draining_until_ns.is_some(), "a failed step drains first");
    }

    #[test]
    fn a_step_that_only_misses_the_p99_limit_is_run_again_before_the_rate_fails() {
        let spec = SearchRate {
            start_per_s: 1000.0,
            max_per_s: 1e6,
            factor: 2.0,
            step_s: 1.0,
            p99_limit_us: 1000.0,
            keep_up_share: 0.97,
        };
        let mut s = Search::new(&spec, 0, 0);
        // Every answer came, but the p99 is 5 ms against a 1 ms limit.
        let slow = |s: &mut Search, t: u64| {
            s.step_offered = 1000;
            s.step_answered = 1000;
            record(&mut s.step_latency, 5_000_000);
            s.judge(t, 0, 0, 1)
        };
        assert!(!slow(&mut s, SECOND_NS).kept_up);
        assert_eq!(s.rate, 1000.0, "the same rate is tried once more");
        assert!(s.draining_until_ns.is_none() && s.bad.is_none());
        assert!(!slow(&mut s, 2 * SECOND_NS).kept_up);
        assert_eq!(s.bad, Some(1000.0), "a second miss fails the rate");
        assert!(s.draining_until_ns.is_some());
        assert!(s.rate < 1000.0);
    }
}
