//! Every figure of a run, as one serialisable value: `results.json` in the output directory.
//! The report (HTML, Markdown) is rendered from this alone, so `bourse report DIR` can
//! re-render an old run and compare it with another.

use crate::flow::Op;
use crate::generator::{peaks_ns, Record, SearchStep, Second, SECOND_NS, WINDOW_NS};
use crate::profile::Profile;
use crate::target::CoreTotals;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Bumped when the shape of `results.json` changes incompatibly.
pub const RESULTS_FORMAT: u32 = 1;
/// Latency distribution bins: this many per decade, from 100 ns to 10 s.
pub const BINS_PER_DECADE: u32 = 20;
const BIN_DECADE_LOW: i32 = 2;
const BIN_DECADE_HIGH: i32 = 10;
/// After a peak, latency counts as recovered when a window's mean is within this factor of
/// the mean before the peak (or within the slack below, whichever is larger) ...
const RECOVERY_FACTOR: f64 = 1.5;
const RECOVERY_SLACK_NS: f64 = 50_000.0;
/// ... for this many windows in a row.
const RECOVERY_WINDOWS: usize = 3;
/// The mean before a peak is taken over this long.
const BASELINE_NS: u64 = 5 * SECOND_NS;

/// Percentiles of a latency histogram, in nanoseconds: the project's one summary.
pub use bourse_latency::Latency;

/// The machine a run was measured on.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub model: String,
    pub kernel: String,
    /// Load average (1 minute) when the run started and ended: a shared machine shows here.
    pub load_average_start: f64,
    pub load_average_end: f64,
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

impl Machine {
    pub fn this() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Machine {
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            model,
            kernel,
            load_average_start: load_average(),
            load_average_end: 0.0,
        }
    }

    pub fn finish(&mut self) {
        self.load_average_end = load_average();
    }
}

/// The seeds' first table: what was done, and the most in any one second.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Totals {
    pub commands_sent: u64,
    pub answers: u64,
    pub unanswered: u64,
    /// New orders registered plus cancels, replaces and mass cancels that succeeded.
    pub transactions: u64,
    /// New orders registered.
    pub orders: u64,
    pub trades: u64,
    pub cancels: u64,
    pub replaces: u64,
    pub mass_cancels: u64,
    pub orders_rejected: u64,
    pub cancels_rejected: u64,
    pub transactions_max_per_s: u64,
    pub orders_max_per_s: u64,
    pub trades_max_per_s: u64,
    /// Successful transactions per second over the measured phases.
    pub transactions_mean_per_s: f64,
    /// Times the generator found a core's queue full and held a command back.
    pub queue_full: u64,
    /// Requests the target refused as busy (overload refused at the door; among the rejects).
    #[serde(default)]
    pub busy_rejects: u64,
    /// Commands the schedule offered that were never sent, because the phases had ended on
    /// the clock while the target still had not taken them (the backlog left in the
    /// generator; a target that keeps up leaves none).
    #[serde(default)]
    pub not_sent: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SecondRow {
    pub t_s: u64,
    pub phase: String,
    pub warmup: bool,
    pub offered: u64,
    pub answered: u64,
    pub transactions: u64,
    pub orders: u64,
    pub cancels: u64,
    pub trades: u64,
    pub rejects: u64,
    pub latency_mean_ns: u64,
    pub latency_p50_ns: u64,
    pub latency_p99_ns: u64,
}

/// Latency of one op: summary and distribution.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpLatency {
    pub op: String,
    pub sent: u64,
    pub succeeded: u64,
    pub latency: Latency,
    /// Counts per bin of [`Results::bin_edges_ns`].
    pub bins: Vec<u64>,
}

/// Latency over the seconds whose successful transactions fell in a range.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadRange {
    pub from_per_s: f64,
    /// `None`: no upper bound.
    pub to_per_s: Option<f64>,
    pub seconds: u64,
    pub transactions_mean_per_s: f64,
    pub latency: Latency,
    /// Market data publication delay of the trades read in these seconds (`None`: not
    /// timed per second by this target).
    #[serde(default)]
    pub md_delay: Option<Latency>,
}

/// One row of LTP's stage table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stage {
    pub name: String,
    /// Mean per command, where this target measures it.
    pub mean_ns: Option<f64>,
    /// Share of the measured door-to-door mean.
    pub share: Option<f64>,
    /// LTP's share for the same stage (3×3 configuration), for comparison.
    pub ltp_share: Option<f64>,
    pub note: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Recovery {
    pub peak: usize,
    pub peak_start_s: f64,
    pub peak_end_s: f64,
    pub baseline_mean_ns: f64,
    pub peak_mean_ns: f64,
    /// Time from the end of the peak until latency was back near the baseline; `None`: not
    /// within the time before the next peak (or the end of the run).
    pub recovery_ms: Option<f64>,
    /// Answers that arrived during the peak, and of them the requests refused as busy
    /// (overload refused at the door).
    #[serde(default)]
    pub peak_answered: u64,
    #[serde(default)]
    pub peak_busy: u64,
    /// The 99th percentile of the answers in the 5 s before the peak and during it (to one
    /// bin of 12%, see `generator::window_bin`).
    #[serde(default)]
    pub baseline_p99_ns: Option<f64>,
    #[serde(default)]
    pub peak_p99_ns: Option<f64>,
    /// Time from the end of the peak until the 99th percentile of 100 ms windows was back at
    /// its value before the peak (within [`RECOVERY_FACTOR`]) for [`RECOVERY_WINDOWS`]
    /// windows in a row; `None`: not before the next peak (or the phase's end).
    #[serde(default)]
    pub p99_recovery_ms: Option<f64>,
}

/// A figure measured on a cross-check against what the cores themselves counted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub expected: u64,
    pub actual: u64,
    pub ok: bool,
}

/// The target as the report describes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetInfo {
    pub kind: String,
    pub protocol: String,
    pub sessions: u32,
    pub workers: u32,
    pub pacing: String,
    pub note: String,
}

/// Every figure of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub format: u32,
    pub profile_name: String,
    pub profile: Profile,
    pub started_unix_s: u64,
    pub elapsed_s: f64,
    pub version: String,
    pub machine: Machine,
    pub target: TargetInfo,
    pub totals: Totals,
    pub per_second: Vec<SecondRow>,
    pub latency_all: Latency,
    pub bin_edges_ns: Vec<u64>,
    pub by_op: Vec<OpLatency>,
    pub load_ranges: Vec<LoadRange>,
    pub stages: Vec<Stage>,
    /// Market data publication delay: for each trade, from the core's apply of the entry that
    /// made it (when the order's acknowledgement leaves the leader) to a subscriber's receipt
    /// of its Trade record on the feed (`None`: not measured by this target).
    pub market_data_delay: Option<Latency>,
    /// The part of it after the publisher took the entry: a packet's SendingTime to a
    /// subscriber's read of it (`None`: not measured by this target).
    #[serde(default)]
    pub market_data_send_to_read: Option<Latency>,
    /// Replication lag of the followers (`None`: no replication in this target).
    pub replication_lag: Option<Latency>,
    pub recovery: Vec<Recovery>,
    pub search: Vec<SearchStep>,
    /// The highest offered rate a search step sustained, commands per second.
    pub sustainable_per_s: Option<f64>,
    pub cores: Vec<CoreTotals>,
    pub checks: Vec<Check>,
    /// Accounts added through the admin API during the run (`None`: the profile adds none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts_under_load: Option<AccountsUnderLoadFigures>,
    /// Clearing runs asked while the load ran (empty: the profile asks none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clearing_runs: Vec<ClearingRunFigures>,
}

/// What a deployment reports of one clearing run it asked under load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClearingRunDone {
    /// The profile's run (`clearing_runs[i]`): when it was due and its kind.
    pub at_s: f64,
    pub kind: String,
    /// The clearing service's id of the run (0: it never got one).
    pub run_id: u32,
    /// From the request to the last movement applied by its core.
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    /// `done`, or `failed` with the error.
    pub outcome: String,
    pub error: Option<String>,
    /// Futures positions margined and equity/FX positions given obligations.
    pub positions: u64,
    /// Accounts in the run's report (a position or a movement).
    pub accounts: u64,
    /// Cash movements fed back to the cores; of them refused (margin calls) and not applied.
    pub movements: u64,
    pub refused: u64,
    pub pending: u64,
    /// Per core, the stream position the run cleared up to.
    pub cut: Vec<u64>,
    /// Variation margin paid (sum of the positive lines), fixed-point cash units.
    pub margin_paid: i128,
    /// The instruments whose margin lines and rounding did not sum to zero (must be none).
    pub unbalanced_instruments: Vec<u32>,
    /// The run's time by step, as the clearing service measured it (milliseconds): waiting
    /// until its state had applied the cores' streams up to their ends at the ask,
    /// computing (plan, report, settling), executing (movements submitted and answered).
    #[serde(default)]
    pub wait_ms: u64,
    #[serde(default)]
    pub compute_ms: u64,
    #[serde(default)]
    pub execute_ms: u64,
}

/// The report's section on one clearing run under load: when it ran, what it cleared, and
/// the trading latency of the measured seconds before, during and after it (each merged from
/// the seconds' HDR histograms; before and after stop at the neighbouring runs).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClearingRunFigures {
    pub run: ClearingRunDone,
    /// Seconds from the run's start when the clearing started, and how long it took.
    pub started_s: f64,
    pub elapsed_s: f64,
    pub positions_per_s: f64,
    /// The run's seconds the clearing overlapped, `[first_s, end_s)`.
    pub first_s: u64,
    pub end_s: u64,
    pub latency_before: Latency,
    pub latency_during: Latency,
    pub latency_after: Latency,
}

impl ClearingRunFigures {
    /// The figures of every run in `done` (in time order) over the run recorded in `rec`,
    /// whose second 0 began at `run_start_unix_ns`.
    pub fn of_all(
        rec: &Record,
        done: Vec<ClearingRunDone>,
        run_start_unix_ns: u64,
    ) -> Vec<ClearingRunFigures> {
        let second_of = |ns: u64| ns.saturating_sub(run_start_unix_ns) / 1_000_000_000;
        let spans: Vec<(u64, u64)> = done
            .iter()
            .map(|d| (second_of(d.start_unix_ns), second_of(d.end_unix_ns) + 1))
            .collect();
        done.into_iter()
            .enumerate()
            .map(|(k, run)| {
                let (first_s, end_s) = spans[k];
                let before_from = if k > 0 { spans[k - 1].1 } else { 0 };
                let after_to = spans.get(k + 1).map_or(u64::MAX, |s| s.0);
                let merged = |from: u64, to: u64| {
                    let mut h = crate::generator::histogram();
                    for (i, s) in rec.seconds.iter().enumerate() {
                        if let (Some(l), false) = (&s.latency, s.warmup) {
                            if (from..to).contains(&(i as u64)) {
                                let _ = h.add(l);
                            }
                        }
                    }
                    Latency::of(&h)
                };
                let elapsed_s = run.end_unix_ns.saturating_sub(run.start_unix_ns) as f64 / 1e9;
                ClearingRunFigures {
                    started_s: run.start_unix_ns.saturating_sub(run_start_unix_ns) as f64 / 1e9,
                    elapsed_s,
                    positions_per_s: run.positions as f64 / elapsed_s.max(1e-9),
                    first_s,
                    end_s,
                    latency_before: merged(before_from, first_s),
                    latency_during: merged(first_s, end_s),
                    latency_after: merged(end_s, after_to),
                    run,
                }
            })
            .collect()
    }
}

/// What a deployment reports of the accounts it added under load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccountsAdded {
    pub market: String,
    /// Accounts the admin API added, and the commands that took (additions and deposits).
    pub accounts: u64,
    pub commands: u64,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    /// The bulk request's outcome (`applied`, or why not) and its error, if any.
    pub outcome: String,
    pub error: Option<String>,
    /// Of these, the accounts the generator traded (`traded` of the profile), and the
    /// positions (account × instrument) they held with a non-zero net quantity at the end of
    /// the run, read from the core's state once the load was done.
    #[serde(default)]
    pub traded_accounts: u64,
    #[serde(default)]
    pub positions_held: u64,
}

/// The report's section on accounts added under load: their rate, and the trading latency
/// of the measured seconds they overlapped against the other measured seconds (each merged
/// from the seconds' HDR histograms).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AccountsUnderLoadFigures {
    pub added: AccountsAdded,
    pub elapsed_s: f64,
    pub accounts_per_s: f64,
    /// The run's seconds the additions overlapped, `[first_s, end_s)`.
    pub first_s: u64,
    pub end_s: u64,
    pub latency_during: Latency,
    pub latency_outside: Latency,
}

impl AccountsUnderLoadFigures {
    /// The figures of `added` over the run recorded in `rec`, whose second 0 began at
    /// `run_start_unix_ns`.
    pub fn of(
        rec: &Record,
        added: AccountsAdded,
        run_start_unix_ns: u64,
    ) -> AccountsUnderLoadFigures {
        let second_of = |ns: u64| ns.saturating_sub(run_start_unix_ns) / 1_000_000_000;
        let first_s = second_of(added.start_unix_ns);
        let end_s = second_of(added.end_unix_ns) + 1;
        let mut during = crate::generator::histogram();
        let mut outside = crate::generator::histogram();
        for (i, s) in rec.seconds.iter().enumerate() {
            let (Some(h), false) = (&s.latency, s.warmup) else {
                continue;
            };
            let into = if (first_s..end_s).contains(&(i as u64)) {
                &mut during
            } else {
                &mut outside
            };
            let _ = into.add(h);
        }
        let elapsed_s = added.end_unix_ns.saturating_sub(added.start_unix_ns) as f64 / 1e9;
        AccountsUnderLoadFigures {
            accounts_per_s: added.accounts as f64 / elapsed_s.max(1e-9),
            elapsed_s,
            first_s,
            end_s,
            latency_during: Latency::of(&during),
            latency_outside: Latency::of(&outside),
            added,
        }
    }
}

/// Bin edges: `BINS_PER_DECADE` per decade from 100 ns to 10 s (the last bin takes the rest).
pub fn bin_edges_ns() -> Vec<u64> {
    let n = ((BIN_DECADE_HIGH - BIN_DECADE_LOW) as u32 * BINS_PER_DECADE) as usize;
    (0..=n)
        .map(|i| {
            10f64
                .powf(BIN_DECADE_LOW as f64 + i as f64 / BINS_PER_DECADE as f64)
                .round() as u64
        })
        .collect()
}

fn bins_of(h: &Histogram<u64>, edges: &[u64]) -> Vec<u64> {
    let mut bins = vec![0u64; edges.len() - 1];
    for v in h.iter_recorded() {
        let x = v.value_iterated_to();
        let i = match edges.binary_search(&x) {
            Ok(i) => i,
            Err(0) => 0,
            Err(i) => i - 1,
        };
        let last = bins.len() - 1;
        bins[i.min(last)] += v.count_at_value();
    }
    bins
}

fn mean_over(windows: &[crate::generator::Window]) -> Option<f64> {
    let (c, s) = windows.iter().fold((0u64, 0u64), |(c, s), w| {
        (c + w.count, s + w.latency_ns_sum)
    });
    (c > 0).then(|| s as f64 / c as f64)
}

impl Results {
    /// Builds the figures from the merged record of every worker and the cores' own counts.
    pub fn build(
        profile: &Profile,
        rec: &Record,
        cores: Vec<CoreTotals>,
        machine: Machine,
        version: String,
        started_unix_s: u64,
    ) -> Results {
        let c = rec.counts;
        let measured: Vec<&Second> = rec.seconds.iter().filter(|s| !s.warmup).collect();
        let max_of = |f: fn(&Second) -> u64| rec.seconds.iter().map(f).max().unwrap_or(0);
        // The last second is usually partial (the drain): leave it out of the mean.
        let full_measured: Vec<&Second> =
            measured.iter().copied().filter(|s| s.offered > 0).collect();
        let transactions_mean_per_s = if full_measured.is_empty() {
            0.0
        } else {
            full_measured.iter().map(|s| s.transactions).sum::<u64>() as f64
                / full_measured.len() as f64
        };
        let totals = Totals {
            commands_sent: c.sent,
            answers: c.answered,
            unanswered: c.unanswered,
            transactions: c.transactions,
            orders: c.orders_accepted,
            trades: c.trades,
            cancels: c.cancels_ok,
            replaces: c.replaces_ok,
            mass_cancels: c.mass_cancels_ok,
            orders_rejected: c.orders_rejected,
            cancels_rejected: c.cancel_rejects,
            transactions_max_per_s: max_of(|s| s.transactions),
            orders_max_per_s: max_of(|s| s.orders),
            trades_max_per_s: max_of(|s| s.trades),
            transactions_mean_per_s,
            queue_full: c.queue_full,
            busy_rejects: c.busy_rejects,
            not_sent: c.not_sent,
        };
        let per_second = rec
            .seconds
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let l = s.latency.as_ref().map(Latency::of).unwrap_or_default();
                SecondRow {
                    t_s: i as u64,
                    // A second with nothing scheduled is the drain after the last phase.
                    phase: if s.offered == 0 {
                        "(drain)".to_string()
                    } else {
                        profile
                            .phases
                            .get(s.phase as usize)
                            .map(|p| p.name.clone())
                            .unwrap_or_default()
                    },
                    warmup: s.warmup,
                    offered: s.offered,
                    answered: s.answered,
                    transactions: s.transactions,
                    orders: s.orders,
                    cancels: s.cancels,
                    trades: s.trades,
                    rejects: s.rejects,
                    latency_mean_ns: l.mean,
                    latency_p50_ns: l.p50,
                    latency_p99_ns: l.p99,
                }
            })
            .collect();
        let edges = bin_edges_ns();
        let by_op = Op::ALL
            .iter()
            .filter(|op| c.sent_by_op[op.index()] > 0)
            .map(|op| {
                let h = &rec.by_op[op.index()];
                OpLatency {
                    op: op.name().into(),
                    sent: c.sent_by_op[op.index()],
                    succeeded: c.ok_by_op[op.index()],
                    latency: Latency::of(h),
                    bins: bins_of(h, &edges),
                }
            })
            .collect();
        let load_ranges = load_ranges(profile, rec, &cores, totals.transactions_max_per_s);
        let stages = stages(rec, profile.target.kind, &cores, &Latency::of(&rec.all));
        let replication_lag = combined(&cores, "replica_apply_spread");
        let market_data_delay = combined(&cores, "md_publication_delay");
        let market_data_send_to_read = combined(&cores, "md_send_to_read");
        let recovery = recovery(profile, rec);
        let sustainable_per_s = sustainable(&rec.search);
        let mut search = rec.search.clone();
        search.sort_by(|a, b| {
            a.start_s
                .total_cmp(&b.start_s)
                .then(a.worker.cmp(&b.worker))
        });
        let checks = checks(&c, &cores);
        Results {
            format: RESULTS_FORMAT,
            profile_name: profile.name.clone(),
            profile: profile.clone(),
            started_unix_s,
            elapsed_s: rec.elapsed_ns as f64 / 1e9,
            version,
            machine,
            target: TargetInfo {
                kind: profile.target.kind.name().into(),
                protocol: profile.target.protocol.name().into(),
                sessions: profile.target.sessions,
                workers: profile.generator.workers,
                pacing: format!("{:?}", profile.generator.pacing).to_lowercase(),
                note: "one engine per market on its own thread behind bounded queues; no \
                       network, no gateway, no replication, no market data"
                    .into(),
            },
            totals,
            per_second,
            latency_all: Latency::of(&rec.all),
            bin_edges_ns: edges,
            by_op,
            load_ranges,
            stages,
            market_data_delay,
            market_data_send_to_read,
            replication_lag,
            recovery,
            search,
            sustainable_per_s,
            cores,
            checks,
            accounts_under_load: None,
            clearing_runs: Vec::new(),
        }
    }

    pub fn checks_pass(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// The names of the checks that failed, in order.
    pub fn failed_checks(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect()
    }
}

/// The highest rate a search sustained: per worker, the highest rate at which at least half
/// of the steps run at it kept up (a search that converges holds its best rate and keeps
/// judging it, and a rate that kept up once but failed most of its later steps is not
/// sustained); the figure is the mean over the workers (each worker's rate is stated for all
/// workers together). `None`: no rate qualified.
fn sustainable(steps: &[SearchStep]) -> Option<f64> {
    use std::collections::BTreeMap;
    // (worker, rate in mcommands/s, so it can be a key) -> (kept up, steps).
    let mut tally: BTreeMap<(u32, u64), (u32, u32)> = BTreeMap::new();
    for s in steps {
        let t = tally
            .entry((s.worker, (s.offered_per_s * 1e3).round() as u64))
            .or_default();
        t.0 += u32::from(s.kept_up);
        t.1 += 1;
    }
    let mut best_by_worker: BTreeMap<u32, f64> = BTreeMap::new();
    for (&(w, rate_m), &(kept, all)) in &tally {
        if kept > 0 && kept * 2 >= all {
            let b = best_by_worker.entry(w).or_insert(0.0);
            *b = b.max(rate_m as f64 / 1e3);
        }
    }
    (!best_by_worker.is_empty())
        .then(|| best_by_worker.values().sum::<f64>() / best_by_worker.len() as f64)
}

fn load_ranges(
    profile: &Profile,
    rec: &Record,
    cores: &[CoreTotals],
    max_per_s: u64,
) -> Vec<LoadRange> {
    let timed_md = cores.iter().any(|c| !c.md_delay_by_second.is_empty());
    let bounds: Vec<f64> = if profile.report.load_ranges_per_s.is_empty() {
        let m = max_per_s.max(1) as f64;
        vec![0.25 * m, 0.5 * m, 0.75 * m, 0.9 * m]
    } else {
        profile.report.load_ranges_per_s.clone()
    };
    let mut out = Vec::new();
    for i in 0..=bounds.len() {
        let from = if i == 0 { 0.0 } else { bounds[i - 1] };
        let to = bounds.get(i).copied();
        let mut h = crate::generator::second_histogram();
        let mut md = crate::generator::second_histogram();
        let mut seconds = 0u64;
        let mut tx = 0u64;
        for (i, s) in rec.seconds.iter().enumerate() {
            if s.warmup {
                continue;
            }
            let r = s.transactions as f64;
            if r >= from && to.is_none_or(|t| r < t) && s.offered > 0 {
                seconds += 1;
                tx += s.transactions;
                if let Some(l) = &s.latency {
                    let _ = h.add(l);
                }
                for c in cores {
                    if let Some(w) = c.md_delay_by_second.get(i) {
                        md = w.into_histogram(md);
                    }
                }
            }
        }
        out.push(LoadRange {
            from_per_s: from,
            to_per_s: to,
            seconds,
            transactions_mean_per_s: if seconds > 0 {
                tx as f64 / seconds as f64
            } else {
                0.0
            },
            latency: Latency::of(&h),
            md_delay: timed_md.then(|| Latency::of(&md)),
        });
    }
    out
}

fn stages(
    rec: &Record,
    kind: crate::profile::TargetKind,
    cores: &[CoreTotals],
    client: &Latency,
) -> Vec<Stage> {
    if kind != crate::profile::TargetKind::InProcess {
        return match timed_stages(cores, client) {
            Some(rows) => rows,
            None => deployed_stages(kind),
        };
    }
    let n = rec.stage_samples.max(1) as f64;
    let mean = |i: usize| rec.stage_ns_sums[i] as f64 / n;
    let measured = rec.stage_samples > 0;
    let lateness = mean(0);
    let ipc = mean(1) + mean(3);
    let matching = mean(2);
    let total = lateness + ipc + matching;
    let share = |v: f64| (measured && total > 0.0).then(|| v / total);
    let some = |v: f64| measured.then_some(v);
    vec![
        Stage {
            name: "network (client ↔ gateway ↔ core)".into(),
            mean_ns: None,
            share: None,
            ltp_share: Some(0.75),
            note: "n/a: the in-process target has no network".into(),
        },
        Stage {
            name: "IPC (queues into and out of the core)".into(),
            mean_ns: some(ipc),
            share: share(ipc),
            ltp_share: Some(0.18),
            note: "bounded queues between the generator and each core's thread".into(),
        },
        Stage {
            name: "sequencing / replication".into(),
            mean_ns: None,
            share: None,
            ltp_share: None,
            note: "n/a: no sequencer or replication in the in-process target (LTP counts its \
                   sequencing hops as network)"
                .into(),
        },
        Stage {
            name: "matching (Engine::apply)".into(),
            mean_ns: some(matching),
            share: share(matching),
            ltp_share: Some(0.07),
            note: "validation, risk, matching, events".into(),
        },
        Stage {
            name: "generator behind schedule".into(),
            mean_ns: some(lateness),
            share: share(lateness),
            ltp_share: None,
            note: "time a command waited in the generator past its scheduled send (open loop: \
                   it counts in the latency)"
                .into(),
        },
    ]
}

/// One stage over every core that timed it: counts and means add exactly; the percentiles
/// and the maximum are the highest any core had (a percentile of a union is not derivable
/// from the parts' percentiles).
pub fn combined(cores: &[CoreTotals], name: &str) -> Option<Latency> {
    let parts: Vec<&Latency> = cores
        .iter()
        .flat_map(|c| c.stage_figures.iter())
        .filter(|f| f.name == name && f.latency.count > 0)
        .map(|f| &f.latency)
        .collect();
    let count: u64 = parts.iter().map(|l| l.count).sum();
    if count == 0 {
        return None;
    }
    let sum: u128 = parts.iter().map(|l| l.mean as u128 * l.count as u128).sum();
    let max_of = |f: fn(&Latency) -> u64| parts.iter().map(|l| f(l)).max().unwrap_or(0);
    Some(Latency {
        count,
        mean: (sum / count as u128) as u64,
        p50: max_of(|l| l.p50),
        p90: max_of(|l| l.p90),
        p99: max_of(|l| l.p99),
        p999: max_of(|l| l.p999),
        p9999: max_of(|l| l.p9999),
        max: max_of(|l| l.max),
    })
}

/// The stage table of a deployment that timed its own path (the replicated stack): the
/// client's round trip minus the gateways' links' own round trip is the network and the
/// gateway; the link's legs split the rest. `None` when the deployment timed nothing.
fn timed_stages(cores: &[CoreTotals], client: &Latency) -> Option<Vec<Stage>> {
    let link = combined(cores, "link_round_trip")?;
    let answer = combined(cores, "group_answer");
    let stream = combined(cores, "stream_after_answer");
    let fsync = combined(cores, "journal_fsync");
    let quorum = combined(cores, "quorum_append");
    let commit = combined(cores, "commit_apply");
    let total = client.mean as f64;
    let share = |v: f64| (total > 0.0).then(|| v / total);
    let outside = client.mean.saturating_sub(link.mean) as f64;
    let mut rows = vec![Stage {
        name: "network + IPC (client ↔ gateway ↔ core link)".into(),
        mean_ns: Some(outside),
        share: share(outside),
        ltp_share: Some(0.93),
        note: "loopback TCP both ways between the generator and a gateway, the gateway's \
               decode, routing, queues to and from its link, encoding, and the generator's \
               own lateness: the client's mean round trip minus the links' (LTP: network 75% \
               + IPC 18%)"
            .into(),
    }];
    if let Some(a) = answer {
        rows.push(Stage {
            name: "sequencing / replication (link → group → answer)".into(),
            mean_ns: Some(a.mean as f64),
            share: share(a.mean as f64),
            ltp_share: None,
            note: format!(
                "the link's pipelined client to the leader over loopback TCP, the batcher, \
                 journal appends and fsyncs on the leader and a follower, the quorum, the \
                 apply (matching included), the answer back; median {}, 99% {} ({} requests)",
                crate::report::ns(a.p50 as f64),
                crate::report::ns(a.p99 as f64),
                crate::report::count(a.count)
            ),
        });
    }
    if let (Some(a), Some(q), Some(c)) = (answer, quorum, commit) {
        let to_leader = a.mean.saturating_sub(q.mean + c.mean) as f64;
        rows.push(Stage {
            name: "· to the leader and its journal append".into(),
            mean_ns: Some(to_leader),
            share: share(to_leader),
            ltp_share: None,
            note: "the row above minus the two below (means; those are per log entry, the \
                   link's per request): the link's client to the leader, the node's batcher, \
                   openraft, the leader's append and fsync"
                .into(),
        });
        rows.push(Stage {
            name: "· leader's append to a quorum's".into(),
            mean_ns: Some(q.mean as f64),
            share: share(q.mean as f64),
            ltp_share: None,
            note: format!(
                "per entry: from the first replica's journal append completing (the leader's) \
                 to the second's: the entry sent to a follower, its append and fsync; median \
                 {}, 99% {} ({} entries)",
                crate::report::ns(q.p50 as f64),
                crate::report::ns(q.p99 as f64),
                crate::report::count(q.count)
            ),
        });
        rows.push(Stage {
            name: "· quorum to applied".into(),
            mean_ns: Some(c.mean as f64),
            share: share(c.mean as f64),
            ltp_share: None,
            note: format!(
                "per entry: from the second append to the first replica applying the entry \
                 (the follower's answer, the commit, the apply); median {}, 99% {}",
                crate::report::ns(c.p50 as f64),
                crate::report::ns(c.p99 as f64)
            ),
        });
    }
    if let Some(f) = fsync {
        rows.push(Stage {
            name: "· of which one journal fsync".into(),
            mean_ns: Some(f.mean as f64),
            share: share(f.mean as f64),
            ltp_share: None,
            note: format!(
                "the mean of one fsync of a replica's journal ({} fsyncs over every replica; \
                 99% {}); a commit waits for the leader's and a follower's",
                crate::report::count(f.count),
                crate::report::ns(f.p99 as f64)
            ),
        });
    }
    if let Some(st) = stream {
        rows.push(Stage {
            name: "committed stream back to the gateway".into(),
            mean_ns: Some(st.mean as f64),
            share: share(st.mean as f64),
            ltp_share: None,
            note: "from the group's answer to the request's entry reaching the link on the \
                   committed stream its reports come from"
                .into(),
        });
    }
    rows.push(Stage {
        name: "matching (Engine::apply)".into(),
        mean_ns: None,
        share: None,
        ltp_share: Some(0.07),
        note: "inside the replication row (the apply); a few µs per command (`bourse bench \
               engine`), not timed separately here"
            .into(),
    });
    Some(rows)
}

/// The stage table of a target with gateways: the generator sees only the door-to-door
/// round trip, so the rows say where each stage's time goes without inventing a split.
fn deployed_stages(kind: crate::profile::TargetKind) -> Vec<Stage> {
    let replicated = kind == crate::profile::TargetKind::Cluster;
    let row = |name: &str, ltp: Option<f64>, note: &str| Stage {
        name: name.into(),
        mean_ns: None,
        share: None,
        ltp_share: ltp,
        note: note.into(),
    };
    vec![
        row(
            "network (client ↔ gateway ↔ core)",
            Some(0.75),
            "loopback TCP: generator ↔ gateway, and gateway ↔ nodes for replicated cores; \
             inside the door-to-door figure, not separated by the generator",
        ),
        row(
            "IPC (queues into and out of the core)",
            Some(0.18),
            "the gateway's queues to and from each core link; inside the door-to-door figure",
        ),
        row(
            "sequencing / replication",
            None,
            if replicated {
                "openraft: append to the leader's journal and a follower's (fsync as the \
                 profile says), commit, apply, committed stream back to the gateway; inside \
                 the door-to-door figure (the nodes' /metrics probes time it per stage)"
            } else {
                "n/a: the gateway target's cores are not replicated"
            },
        ),
        row(
            "matching (Engine::apply)",
            Some(0.07),
            "validation, risk, matching, events; a few µs per command (see `bourse bench \
             engine`), inside the door-to-door figure",
        ),
    ]
}

fn recovery(profile: &Profile, rec: &Record) -> Vec<Recovery> {
    let peaks = peaks_ns(profile);
    let w = |ns: u64| (ns / WINDOW_NS) as usize;
    let end_of_run = rec.windows.len();
    let mut out = Vec::new();
    // Recovery is looked for until the next peak starts, and never past the end of the
    // peak's own phase (the next phase's load is another experiment).
    let phase_ends: Vec<u64> = crate::generator::phase_starts_ns(profile)
        .iter()
        .zip(&profile.phases)
        .map(|(s, p)| s + (p.duration_s * 1e9) as u64)
        .collect();
    for (i, &(start, end)) in peaks.iter().enumerate() {
        let phase_end = phase_ends
            .iter()
            .copied()
            .find(|&e| e >= end)
            .unwrap_or(u64::MAX);
        let slice = |a: usize, b: usize| &rec.windows[a.min(end_of_run)..b.min(end_of_run)];
        let baseline = mean_over(slice(w(start.saturating_sub(BASELINE_NS)), w(start)));
        let peak = mean_over(slice(w(start), w(end)));
        let (Some(baseline), Some(peak)) = (baseline, peak) else {
            continue;
        };
        let limit = (baseline * RECOVERY_FACTOR).max(baseline + RECOVERY_SLACK_NS);
        let until = peaks
            .get(i + 1)
            .map_or(end_of_run, |&(next, _)| w(next))
            .min(w(phase_end))
            .min(end_of_run);
        let recovery_ms = first_calm_run(&rec.windows, w(end)..until, end, |window| {
            (window.latency_ns_sum as f64 / window.count as f64) <= limit
        });
        let before = slice(w(start.saturating_sub(BASELINE_NS)), w(start));
        let during = slice(w(start), w(end));
        let baseline_p99_ns = crate::generator::windows_p99_ns(before);
        let p99_recovery_ms = baseline_p99_ns.and_then(|b| {
            let limit = b * RECOVERY_FACTOR;
            first_calm_run(&rec.windows, w(end)..until, end, |window| {
                crate::generator::windows_p99_ns(std::slice::from_ref(window))
                    .is_some_and(|p| p <= limit)
            })
        });
        out.push(Recovery {
            peak_answered: during.iter().map(|x| x.count).sum(),
            peak_busy: during.iter().map(|x| x.busy).sum(),
            baseline_p99_ns,
            peak_p99_ns: crate::generator::windows_p99_ns(during),
            p99_recovery_ms,
            peak: i + 1,
            peak_start_s: start as f64 / 1e9,
            peak_end_s: end as f64 / 1e9,
            baseline_mean_ns: baseline,
            peak_mean_ns: peak,
            recovery_ms,
        });
    }
    out
}

/// The time from `end_ns` to the first of [`RECOVERY_WINDOWS`] windows in a row (within
/// `range`) that have answers and are `calm`.
fn first_calm_run(
    windows: &[crate::generator::Window],
    range: std::ops::Range<usize>,
    end_ns: u64,
    calm: impl Fn(&crate::generator::Window) -> bool,
) -> Option<f64> {
    let mut run = 0;
    for k in range {
        let window = &windows[k];
        if window.count > 0 && calm(window) {
            run += 1;
            if run == RECOVERY_WINDOWS {
                let first = k + 1 - RECOVERY_WINDOWS;
                let ns = (first as u64 * WINDOW_NS).saturating_sub(end_ns);
                return Some(ns as f64 / 1e6);
            }
        } else {
            run = 0;
        }
    }
    None
}

/// What every core applied during the run by source, added up (`None`: no core tells its
/// sources apart).
pub fn applied_by_source(cores: &[CoreTotals]) -> Option<crate::AppliedBySource> {
    cores
        .iter()
        .filter_map(|t| t.applied_by_source)
        .reduce(|a, b| a.plus(&b))
}

fn checks(c: &crate::generator::Counts, cores: &[CoreTotals]) -> Vec<Check> {
    let sum = |f: fn(&CoreTotals) -> u64| cores.iter().map(f).sum::<u64>();
    let check = |name: &str, expected: u64, actual: u64| Check {
        name: name.into(),
        expected,
        actual,
        ok: expected == actual,
    };
    let forwarded: Option<u64> = cores.iter().map(|t| t.commands_forwarded).sum();
    let md_trades: Option<u64> = cores.iter().map(|t| t.md_trades).sum();
    let other: u64 = cores.iter().map(|t| t.commands_other).sum();
    let mut v = vec![
        check(
            "no other session traded on the cores (the checks below count the generator's \
             commands only)",
            0,
            other,
        ),
        check(
            "every command sent was answered (answers = commands sent)",
            c.sent,
            c.answered,
        ),
        match forwarded {
            None => check(
                "the cores applied every command sent",
                c.sent,
                sum(|t| t.commands),
            ),
            Some(f) => check(
                "the cores applied every command the gateways forwarded",
                f + other,
                sum(|t| t.applied_by_source.map_or(t.commands, |s| s.gateways)),
            ),
        },
        check(
            "trades in the report = trades the cores executed",
            sum(|t| t.trades),
            c.trades,
        ),
        check(
            "orders acknowledged = orders the cores accepted",
            sum(|t| t.orders_accepted),
            c.orders_accepted,
        ),
        check(
            "every acknowledged order accounted for (= still live + left the book)",
            c.orders_accepted,
            sum(|t| t.live_orders_at_end) + c.order_log_delete,
        ),
    ];
    if let Some(sources) = applied_by_source(cores) {
        // The cores also apply what the admin API and clearing runs send: those are counted
        // on their own, and only a command no known source sent is a fault.
        v.push(check(
            "every command the cores applied came from a known source (gateways, admin, \
             clearing, setup)",
            0,
            sources.unknown,
        ));
    }
    if let Some(md) = md_trades {
        v.push(check(
            "trades on the market data feed = trades the cores executed",
            sum(|t| t.trades),
            md,
        ));
    }
    if cores.iter().any(|t| t.replica_hashes.is_some()) {
        let agreeing = cores
            .iter()
            .filter(|t| {
                t.replica_hashes
                    .as_ref()
                    .is_some_and(|h| !h.is_empty() && h.iter().all(|x| *x == h[0]))
            })
            .count();
        v.push(check(
            "every replica of each core ends in the same state (equal state hashes)",
            cores.len() as u64,
            agreeing as u64,
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rate: f64, kept_up: bool) -> SearchStep {
        SearchStep {
            worker: 0,
            phase: 0,
            start_s: 0.0,
            offered_per_s: rate,
            answered_per_s: rate,
            p99_ns: 0,
            kept_up,
        }
    }

    /// A core that applied `gateways` commands from the gateways' links, all forwarded, and
    /// what the admin, clearing and an unknown source sent beside them.
    fn core_with_sources(gateways: u64, (admin, clearing, unknown): (u64, u64, u64)) -> CoreTotals {
        CoreTotals {
            commands: gateways,
            commands_forwarded: Some(gateways),
            applied_by_source: Some(crate::AppliedBySource {
                gateways,
                admin,
                clearing,
                setup: 0,
                unknown,
            }),
            ..CoreTotals::default()
        }
    }

    fn sent_and_answered(n: u64) -> crate::generator::Counts {
        crate::generator::Counts {
            sent: n,
            answered: n,
            ..Default::default()
        }
    }

    #[test]
    fn an_operator_s_and_a_clearing_run_s_commands_are_counted_apart_and_the_checks_hold() {
        let cores = [
            core_with_sources(30_000, (3, 600, 0)),
            core_with_sources(24_921, (0, 326, 0)),
        ];
        let v = checks(&sent_and_answered(54_921), &cores);
        let failed: Vec<&Check> = v.iter().filter(|c| !c.ok).collect();
        assert!(failed.is_empty(), "{failed:?}");
        let forwarded = v
            .iter()
            .find(|c| c.name == "the cores applied every command the gateways forwarded")
            .expect("the forwarding check");
        assert_eq!((forwarded.expected, forwarded.actual), (54_921, 54_921));
        let sources = applied_by_source(&cores).expect("the cores tell their sources apart");
        assert_eq!((sources.admin, sources.clearing), (3, 926));
        assert_eq!(sources.total(), 54_921 + 3 + 926);
    }

    #[test]
    fn a_command_from_an_unknown_source_fails_its_own_check_only() {
        let cores = [core_with_sources(100, (0, 0, 2))];
        let v = checks(&sent_and_answered(100), &cores);
        let failed: Vec<&str> = v
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].starts_with("every command the cores applied came from a known source"));
    }

    #[test]
    fn cores_that_cannot_tell_sources_apart_are_checked_on_all_they_applied() {
        let mut core = core_with_sources(10, (0, 0, 0));
        core.applied_by_source = None;
        let v = checks(&sent_and_answered(10), &[core]);
        assert!(v.iter().all(|c| c.ok), "{v:?}");
        assert!(!v.iter().any(|c| c.name.contains("known source")));
    }

    #[test]
    fn a_rate_is_sustained_when_at_least_half_of_its_steps_kept_up() {
        let steps = [
            step(1000.0, true),
            step(2000.0, false),
            step(2000.0, true),
            step(3000.0, false),
            step(2500.0, true),
            step(2500.0, false),
            step(2500.0, false),
        ];
        // 2,500 kept up once in three steps: not sustained; 2,000 in one of two: sustained.
        assert_eq!(sustainable(&steps), Some(2000.0));
        assert_eq!(sustainable(&[step(1000.0, false)]), None);
    }
}
