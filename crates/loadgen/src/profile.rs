//! Load profiles: what a test runs, read from TOML and checked before anything starts.
//!
//! Parsing is strict in two layers. serde with `deny_unknown_fields` refuses unknown keys and
//! wrong types (a negative count does not fit an unsigned field), and toml reports the line.
//! Then [`Profile::validate`] checks what types cannot say (a rate of zero, a peak shorter
//! than its base, shares that add up to nothing) and names the key by its path; the path is
//! mapped back to a line of the source with toml_edit's spans, so every error reads
//! `profile.toml:12: phases[1].rate.peak_per_s: ...`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// No profile may offer more than this: beyond it the generator's own clock reads and queue
/// operations dominate, and a typo (an extra zero) is more likely than intent.
pub const RATE_PER_S_MAX: f64 = 10_000_000.0;
/// The longest a single phase may run.
pub const PHASE_DURATION_S_MAX: f64 = 3_600.0;
/// The longest a whole profile may run: per-second histograms are kept for the report.
pub const PROFILE_DURATION_S_MAX: f64 = 3_600.0;
/// The seeds' SPECTRA test added 4,000,000 client accounts.
pub const ACCOUNTS_MAX: u32 = 4_000_000;
pub const INSTRUMENTS_PER_MARKET_MAX: u32 = 10_000;
pub const MARKETS_MAX: usize = 16;
pub const PHASES_MAX: usize = 256;
pub const WORKERS_MAX: u32 = 64;
pub const SESSIONS_MAX: u32 = 10_000;
/// Sessions one gateway holds (the gateway's own ceiling).
pub const GATEWAY_SESSIONS_MAX: u32 = 1_000;
pub const GATEWAYS_MAX: u32 = 16;
/// Commands in flight (sent, not yet answered) per worker.
pub const INFLIGHT_MAX: u32 = 1 << 20;
pub const QUEUE_CAPACITY_MAX: u32 = 1 << 20;
pub const LIVE_ORDERS_TARGET_MAX: u32 = 1_000_000;

/// A whole load test.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Seeds every flow, so that two runs of a profile offer the same commands.
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub target: TargetSpec,
    #[serde(default)]
    pub generator: GeneratorSpec,
    pub markets: Vec<MarketSpec>,
    pub mix: MixSpec,
    pub phases: Vec<Phase>,
    #[serde(default)]
    pub report: ReportSpec,
    /// Accounts added through the venue's admin API while the load runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts_under_load: Option<AccountsUnderLoad>,
    /// Clearing runs asked of a clearing service that follows the cores while the load runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clearing_runs: Vec<ClearingRunSpec>,
}

/// The most clearing runs one profile may ask for.
pub const CLEARING_RUNS_MAX: usize = 16;

/// The kind of a clearing run asked under load (the clearing service's own kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClearingRunKind {
    /// Variation margin and obligations since the last run; trading goes on.
    Intermediate,
    /// As intermediate, and the cores expire their Day orders.
    EndOfDay,
}

impl ClearingRunKind {
    pub fn name(self) -> &'static str {
        match self {
            ClearingRunKind::Intermediate => "intermediate",
            ClearingRunKind::EndOfDay => "end_of_day",
        }
    }
}

/// `[[clearing_runs]]`: a clearing run the load test asks of a clearing service (started on
/// the deployment, following every core's committed stream) at `at_s` seconds after the
/// run's start, as the seeds' exchange ran its intermediate clearing in the middle of the
/// load. Replicated targets only (clearing reads the cores' committed streams and feeds its
/// results back through the sequenced path).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearingRunSpec {
    /// When the run is asked, in seconds from the run's start (warm-up included).
    pub at_s: f64,
    pub kind: ClearingRunKind,
}

/// The most accounts a profile may add under load.
pub const ACCOUNTS_UNDER_LOAD_MAX: u64 = 10_000_000;

/// The id of the first account added under load (far above the generator's own); the rest
/// follow in order.
pub const ACCOUNTS_UNDER_LOAD_ID_BASE: u32 = 100_000_000;
/// The most added accounts the generator may trade (its sessions list them one by one).
pub const ACCOUNTS_UNDER_LOAD_TRADED_MAX: u32 = 10_000;

/// `[accounts_under_load]`: accounts added to one market through the venue's admin API (one
/// bulk request, one command per account adding it with its cash) while the load runs, as
/// SPECTRA's 2020 test added its client accounts during the load, and opened positions on
/// them. Replicated targets only (the admin API acts through the replicated path).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountsUnderLoad {
    /// The market (by name) they are added to.
    pub market: String,
    pub count: u64,
    /// When the additions start, in seconds from the run's start (warm-up included).
    pub start_s: f64,
    /// Cash deposited in each, in units of 10^-4.
    #[serde(default)]
    pub cash: i64,
    /// How many of them (the first added) the generator trades, as it trades its own
    /// accounts: its sessions are allowed them from the start, its orders for one not yet
    /// added are refused `unknown_account` until the addition reaches it, and the positions
    /// it opens on them are counted in the report. 0: none.
    #[serde(default)]
    pub traded: u32,
}

fn default_seed() -> u64 {
    42
}

/// What the generator drives.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    pub kind: TargetKind,
    /// The protocol the sessions speak. Recorded in the report; the in-process target hands
    /// commands to the cores directly and has no wire protocol.
    pub protocol: Protocol,
    /// Client sessions; accounts are spread over them.
    pub sessions: u32,
    /// Capacity of each bounded queue between the generator and a core, in commands.
    pub queue_capacity: u32,
    /// Gateways in front of the cores (`gateway` and `cluster` targets); the sessions are
    /// spread over them and every gateway routes every market.
    #[serde(default = "one_u32")]
    pub gateways: u32,
    /// Journal durability of the replicated cores (`cluster` target): "always" fsyncs
    /// before an entry counts toward its commit, "batch" within a couple of milliseconds,
    /// "never" leaves it to the operating system.
    #[serde(default)]
    pub fsync: FsyncMode,
    /// The nodes publish market data and the run counts the trades on the feed (`cluster`
    /// target).
    #[serde(default = "yes")]
    pub market_data: bool,
    /// Commands each gateway keeps in flight to one core before it refuses more as busy
    /// (`gateway.core_in_flight_max`; `gateway` and `cluster` targets). Absent: the
    /// gateway's default.
    #[serde(default)]
    pub core_in_flight_max: Option<u32>,
}

fn one_u32() -> u32 {
    1
}
fn yes() -> bool {
    true
}

/// Journal durability of the replicated cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncMode {
    #[default]
    Always,
    Batch,
    Never,
}

impl Default for TargetSpec {
    fn default() -> Self {
        TargetSpec {
            kind: TargetKind::InProcess,
            protocol: Protocol::Binary,
            sessions: 1,
            queue_capacity: 8_192,
            gateways: 1,
            fsync: FsyncMode::Always,
            market_data: true,
            core_in_flight_max: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    /// One engine per market on its own thread, behind bounded queues, in this process.
    InProcess,
    /// Access servers (FIX or binary) in front of the cores, over loopback TCP.
    Gateway,
    /// Gateways in front of replicated cores (three nodes per core).
    Cluster,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::InProcess => "in-process",
            TargetKind::Gateway => "gateway",
            TargetKind::Cluster => "cluster",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Fix,
    Binary,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Fix => "FIX 4.4",
            Protocol::Binary => "binary (SBE)",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pacing {
    /// Commands evenly spaced at the current rate (LTP sent one order every ~30 µs).
    Uniform,
    /// Exponentially distributed gaps at the current rate: bursts and lulls as real flow has.
    Poisson,
}

/// How the generator runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorSpec {
    /// Generator threads; each drives its own connection to the target with its own share of
    /// the rate and of the accounts. (Several processes run one profile each with `--worker`.)
    pub workers: u32,
    pub pacing: Pacing,
    /// Commands in flight per worker; past it the generator stops sending and the lateness
    /// counts in the latency of the commands it sends later.
    pub inflight_max: u32,
    /// After the last phase, how long to wait for outstanding answers.
    pub drain_timeout_s: f64,
    /// Seconds of the run whose per-second series are kept: each second's counts and latency
    /// histogram, the 100 ms windows and the deployment's per-second market data delay, which
    /// the report's per-second table, charts, load ranges and recovery after peaks read.
    /// Later seconds count in the totals only. Each kept second costs about 40 KB per worker
    /// and 32 KB per timed core, so this bounds the harness's memory in a long run; 0 keeps
    /// none (`bourse soak`, which reports totals only). At most [`SERIES_SECONDS_MAX_LIMIT`].
    #[serde(default = "default_series_seconds_max")]
    pub series_seconds_max: u32,
}

/// The seconds of per-second series a run keeps unless its profile says otherwise (as long
/// as the longest phase).
pub const SERIES_SECONDS_MAX_DEFAULT: u32 = 3_600;
/// The most seconds of per-second series a profile may ask for (a day).
pub const SERIES_SECONDS_MAX_LIMIT: u32 = 86_400;

fn default_series_seconds_max() -> u32 {
    SERIES_SECONDS_MAX_DEFAULT
}

impl Default for GeneratorSpec {
    fn default() -> Self {
        GeneratorSpec {
            workers: 1,
            pacing: Pacing::Uniform,
            inflight_max: 65_536,
            drain_timeout_s: 10.0,
            series_seconds_max: SERIES_SECONDS_MAX_DEFAULT,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarketKind {
    Equity,
    Fx,
    Futures,
}

/// One market: its own trading core, its instruments and accounts.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketSpec {
    pub name: String,
    pub kind: MarketKind,
    pub instruments: u32,
    pub accounts: u32,
    /// This market's share of the offered rate (shares are normalised over markets).
    #[serde(default = "one_f64")]
    pub share: f64,
    /// The flow keeps about this many orders resting in the market.
    #[serde(default = "default_live_orders")]
    pub live_orders_target: u32,
    /// Passive orders rest up to this many ticks from the middle.
    #[serde(default = "default_spread_ticks")]
    pub spread_ticks: u32,
}

fn one_f64() -> f64 {
    1.0
}
fn default_live_orders() -> u32 {
    5_000
}
fn default_spread_ticks() -> u32 {
    40
}

/// The command mix, as relative weights (they need not add up to anything in particular).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixSpec {
    /// Limit orders (Day or GTC).
    pub limit: f64,
    pub market: f64,
    /// Marketable limit orders, immediate or cancel.
    pub ioc: f64,
    /// Marketable limit orders, fill or kill.
    pub fok: f64,
    pub cancel: f64,
    pub replace: f64,
    /// Mass cancels of one account's orders in one instrument.
    #[serde(default)]
    pub mass_cancel: f64,
    /// Share (0..1) of limit orders priced through the middle, so that they trade on arrival.
    #[serde(default)]
    pub crossing_share: f64,
}

impl MixSpec {
    pub fn total(&self) -> f64 {
        self.limit
            + self.market
            + self.ioc
            + self.fok
            + self.cancel
            + self.replace
            + self.mass_cancel
    }
}

/// Concentration of the flow on a few instruments ("bursts on hot instruments").
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotSpec {
    /// How many instruments of each market are hot (the first ones).
    pub instruments: u32,
    /// Share (0..1) of new orders that go to the hot instruments.
    pub share: f64,
    /// Hot only during the peaks of a `peaks` rate; otherwise for the whole phase.
    #[serde(default)]
    pub during_peaks_only: bool,
}

/// One phase of a test.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub name: String,
    pub duration_s: f64,
    pub rate: Rate,
    #[serde(default)]
    pub hot: Option<HotSpec>,
    /// A warm-up phase is run but left out of the figures.
    #[serde(default)]
    pub warmup: bool,
}

/// The shape of the offered rate over a phase, in commands per second (all markets).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "shape", rename_all = "snake_case")]
pub enum Rate {
    Constant(ConstantRate),
    Ramp(RampRate),
    Steps(StepsRate),
    Peaks(PeaksRate),
    Search(SearchRate),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConstantRate {
    pub per_s: f64,
}

/// Linear from `from_per_s` to `to_per_s` over the phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RampRate {
    pub from_per_s: f64,
    pub to_per_s: f64,
}

/// A staircase: `from_per_s`, then `+ step_per_s` every `step_s`, never above `to_per_s`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepsRate {
    pub from_per_s: f64,
    pub to_per_s: f64,
    pub step_per_s: f64,
    pub step_s: f64,
}

/// `base_per_s`, with `peak_s` seconds at `peak_per_s` in the middle of every `period_s`
/// (MOEX 2020: 5-second peaks, to measure recovery after each). The base before a peak is
/// the baseline its recovery is judged against.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeaksRate {
    pub base_per_s: f64,
    pub peak_per_s: f64,
    pub peak_s: f64,
    pub period_s: f64,
}

/// Closed-loop search for the highest sustainable rate: run `step_s` at a rate; if the step
/// kept up (answers at least `keep_up_share` of the offered rate, p99 within
/// `p99_limit_us`), multiply the rate by `factor`; once a step fails, bisect between the last
/// good and the failed rate until they are within 5% or the phase ends. A step that kept up
/// but missed only the p99 limit is run again at the same rate before the rate fails.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchRate {
    pub start_per_s: f64,
    pub max_per_s: f64,
    pub factor: f64,
    pub step_s: f64,
    pub p99_limit_us: f64,
    #[serde(default = "default_keep_up")]
    pub keep_up_share: f64,
}

fn default_keep_up() -> f64 {
    0.97
}

/// How the report groups load.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    /// Upper bounds of the load ranges, in successful transactions per second (as seed 001:
    /// "up to 12,000", "12,000 to 25,000", "25,000 and more"). Empty: quarters of the peak.
    #[serde(default)]
    pub load_ranges_per_s: Vec<f64>,
}

/// A profile error with the line it refers to.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileError {
    /// 1-based line in the source, when known.
    pub line: Option<usize>,
    /// The key, as a path (`phases[1].rate.peak_per_s`), when known.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.path.is_empty()) {
            (Some(l), false) => write!(f, "line {l}: {}: {}", self.path, self.reason),
            (Some(l), true) => write!(f, "line {l}: {}", self.reason),
            (None, false) => write!(f, "{}: {}", self.path, self.reason),
            (None, true) => write!(f, "{}", self.reason),
        }
    }
}

impl std::error::Error for ProfileError {}

/// A step of a key path, for mapping a validation error back to its line.
#[derive(Clone, Debug)]
enum Key {
    Name(&'static str),
    Index(usize),
}

fn path_text(path: &[Key]) -> String {
    let mut s = String::new();
    for k in path {
        match k {
            Key::Name(n) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(n);
            }
            Key::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn line_of(source: &str, byte: usize) -> usize {
    source[..byte.min(source.len())].matches('\n').count() + 1
}

/// The line of the key at `path`, or of its nearest ancestor that has a span.
fn line_of_path(source: &str, path: &[Key]) -> Option<usize> {
    let doc = toml_edit::ImDocument::parse(source).ok()?;
    let mut item: &toml_edit::Item = doc.as_item();
    let mut best = None;
    for k in path {
        let next = match k {
            Key::Name(n) => item.get(n),
            Key::Index(i) => match item {
                toml_edit::Item::ArrayOfTables(a) => a.get(*i).map(|_| &item[*i]),
                toml_edit::Item::Value(toml_edit::Value::Array(a)) => a.get(*i).map(|_| &item[*i]),
                _ => None,
            },
        };
        let Some(next) = next else { break };
        if let Some(span) = next.span() {
            best = Some(line_of(source, span.start));
        }
        // A key's own span is more useful than its value's: report the key's line.
        if let (Key::Name(n), Some(table)) = (k, item.as_table_like()) {
            if let Some((key, _)) = table.get_key_value(n) {
                if let Some(span) = key.span() {
                    best = Some(line_of(source, span.start));
                }
            }
        }
        item = next;
    }
    best
}

impl Profile {
    fn validate_accounts_under_load(
        &self,
        a: &AccountsUnderLoad,
    ) -> Result<(), (Vec<Key>, String)> {
        use Key::*;
        let at = |field: &'static str| vec![Name("accounts_under_load"), Name(field)];
        if self.target.kind != TargetKind::Cluster {
            return Err((
                at("market"),
                "needs target.kind = \"cluster\" (the admin API acts through the replicated path)"
                    .into(),
            ));
        }
        if !self.markets.iter().any(|m| m.name == a.market) {
            return Err((at("market"), format!("no market named {:?}", a.market)));
        }
        if a.count == 0 || a.count > ACCOUNTS_UNDER_LOAD_MAX {
            return Err((
                at("count"),
                format!("must be 1 to {ACCOUNTS_UNDER_LOAD_MAX}"),
            ));
        }
        if !(a.start_s >= 0.0 && a.start_s < self.duration_s()) {
            return Err((
                at("start_s"),
                format!(
                    "must be 0 or more and before the run's end ({} s)",
                    self.duration_s()
                ),
            ));
        }
        if a.cash < 0 {
            return Err((at("cash"), "must be 0 or more".into()));
        }
        if u64::from(a.traded) > a.count || a.traded > ACCOUNTS_UNDER_LOAD_TRADED_MAX {
            return Err((
                at("traded"),
                format!("must be at most count and at most {ACCOUNTS_UNDER_LOAD_TRADED_MAX}"),
            ));
        }
        if a.traded > 0 && a.cash == 0 {
            return Err((
                at("cash"),
                "traded accounts need cash to trade with (cash > 0)".into(),
            ));
        }
        Ok(())
    }

    fn validate_clearing_runs(&self) -> Result<(), (Vec<Key>, String)> {
        use Key::*;
        if self.clearing_runs.len() > CLEARING_RUNS_MAX {
            return Err((
                vec![Name("clearing_runs")],
                format!("at most {CLEARING_RUNS_MAX} runs"),
            ));
        }
        for (i, r) in self.clearing_runs.iter().enumerate() {
            let at = |field: &'static str| vec![Name("clearing_runs"), Index(i), Name(field)];
            if self.target.kind != TargetKind::Cluster {
                return Err((
                    at("kind"),
                    "needs target.kind = \"cluster\" (clearing follows the replicated cores' \
                     committed streams and pays through their sequenced path)"
                        .into(),
                ));
            }
            if !(r.at_s.is_finite() && r.at_s >= 0.0 && r.at_s < self.duration_s()) {
                return Err((
                    at("at_s"),
                    format!(
                        "must be 0 or more and before the run's end ({} s)",
                        self.duration_s()
                    ),
                ));
            }
            if i > 0 && r.at_s <= self.clearing_runs[i - 1].at_s {
                return Err((
                    at("at_s"),
                    "runs must be listed in time order, each after the one before".into(),
                ));
            }
        }
        Ok(())
    }

    /// Parses and validates a profile. Every error names its line and its reason.
    pub fn parse(source: &str) -> Result<Profile, ProfileError> {
        let profile: Profile = toml::from_str(source).map_err(|e| ProfileError {
            line: e.span().map(|s| line_of(source, s.start)),
            path: String::new(),
            // toml's message repeats the source excerpt; the first line is the reason.
            reason: e.message().trim().to_string(),
        })?;
        profile.validate().map_err(|(path, reason)| ProfileError {
            line: line_of_path(source, &path),
            path: path_text(&path),
            reason,
        })?;
        Ok(profile)
    }

    /// Total seconds of all phases.
    pub fn duration_s(&self) -> f64 {
        self.phases.iter().map(|p| p.duration_s).sum()
    }

    /// Whether the profile can run in this build; the error says why not.
    /// What can be refused about running this profile before anything starts, beyond its
    /// syntax and values: a gateway session trades at most 255 accounts, so the accounts
    /// of each worker must fit the sessions a gateway can hold.
    pub fn check_runnable(&self) -> Result<(), String> {
        if self.target.kind == TargetKind::InProcess {
            return Ok(());
        }
        let workers = self.generator.workers as u64;
        let per_session = crate::gateway::ACCOUNTS_PER_SESSION_MAX as u64;
        let accounts = self
            .markets
            .iter()
            .map(|m| m.accounts as u64)
            .max()
            .unwrap_or(0)
            // The added accounts the generator trades take places in its sessions too.
            + self
                .accounts_under_load
                .as_ref()
                .map_or(0, |a| u64::from(a.traded));
        let sessions = accounts.div_ceil(per_session).max(workers);
        if sessions > GATEWAY_SESSIONS_MAX as u64 {
            return Err(format!(
                "target.kind = \"{}\": {accounts} accounts in one market need {sessions} gateway \
                 sessions of {per_session} accounts; a gateway holds at most {GATEWAY_SESSIONS_MAX} \
                 (use at most {} accounts per market, or target.kind = \"in-process\")",
                self.target.kind.name(),
                GATEWAY_SESSIONS_MAX as u64 * per_session
            ));
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), (Vec<Key>, String)> {
        use Key::*;
        let err = |path: Vec<Key>, reason: String| Err((path, reason));
        if self.name.trim().is_empty() {
            return err(vec![Name("name")], "must not be empty".into());
        }
        if let Some(a) = &self.accounts_under_load {
            self.validate_accounts_under_load(a)?;
        }
        self.validate_clearing_runs()?;
        let t = &self.target;
        if t.sessions == 0 || t.sessions > SESSIONS_MAX {
            return err(
                vec![Name("target"), Name("sessions")],
                format!("must be 1 to {SESSIONS_MAX}"),
            );
        }
        if t.queue_capacity < 16 || t.queue_capacity > QUEUE_CAPACITY_MAX {
            return err(
                vec![Name("target"), Name("queue_capacity")],
                format!("must be 16 to {QUEUE_CAPACITY_MAX}"),
            );
        }
        if t.core_in_flight_max == Some(0) {
            return err(
                vec![Name("target"), Name("core_in_flight_max")],
                "must be positive".into(),
            );
        }
        if t.gateways == 0 || t.gateways > GATEWAYS_MAX {
            return err(
                vec![Name("target"), Name("gateways")],
                format!("must be 1 to {GATEWAYS_MAX}"),
            );
        }
        if t.gateways > 1 && t.kind != TargetKind::Cluster {
            return err(
                vec![Name("target"), Name("gateways")],
                "several gateways need target.kind = \"cluster\" (in-process cores serve one)"
                    .into(),
            );
        }
        let g = &self.generator;
        if g.workers == 0 || g.workers > WORKERS_MAX {
            return err(
                vec![Name("generator"), Name("workers")],
                format!("must be 1 to {WORKERS_MAX}"),
            );
        }
        if g.inflight_max == 0 || g.inflight_max > INFLIGHT_MAX {
            return err(
                vec![Name("generator"), Name("inflight_max")],
                format!("must be 1 to {INFLIGHT_MAX}"),
            );
        }
        if !(g.drain_timeout_s.is_finite() && g.drain_timeout_s > 0.0 && g.drain_timeout_s <= 600.0)
        {
            return err(
                vec![Name("generator"), Name("drain_timeout_s")],
                "must be more than 0 and at most 600 seconds".into(),
            );
        }
        if g.series_seconds_max > SERIES_SECONDS_MAX_LIMIT {
            return err(
                vec![Name("generator"), Name("series_seconds_max")],
                format!("must be at most {SERIES_SECONDS_MAX_LIMIT} seconds"),
            );
        }
        if self.markets.is_empty() || self.markets.len() > MARKETS_MAX {
            return err(
                vec![Name("markets")],
                format!("need 1 to {MARKETS_MAX} markets"),
            );
        }
        let mut accounts_total: u64 = 0;
        for (i, m) in self.markets.iter().enumerate() {
            let p = |k: &'static str| vec![Name("markets"), Index(i), Name(k)];
            if m.name.trim().is_empty() {
                return err(p("name"), "must not be empty".into());
            }
            if self.markets[..i].iter().any(|o| o.name == m.name) {
                return err(p("name"), format!("market \"{}\" appears twice", m.name));
            }
            if m.instruments == 0 || m.instruments > INSTRUMENTS_PER_MARKET_MAX {
                return err(
                    p("instruments"),
                    format!("must be 1 to {INSTRUMENTS_PER_MARKET_MAX}"),
                );
            }
            if m.accounts == 0 || m.accounts > ACCOUNTS_MAX {
                return err(p("accounts"), format!("must be 1 to {ACCOUNTS_MAX}"));
            }
            if m.accounts < g.workers {
                return err(
                    p("accounts"),
                    format!("fewer accounts than generator workers ({})", g.workers),
                );
            }
            accounts_total += m.accounts as u64;
            if !(m.share.is_finite() && m.share > 0.0) {
                return err(p("share"), "must be a positive number".into());
            }
            if m.live_orders_target == 0 || m.live_orders_target > LIVE_ORDERS_TARGET_MAX {
                return err(
                    p("live_orders_target"),
                    format!("must be 1 to {LIVE_ORDERS_TARGET_MAX}"),
                );
            }
            if m.spread_ticks < 4 || m.spread_ticks > 1_000 {
                return err(p("spread_ticks"), "must be 4 to 1000".into());
            }
        }
        if accounts_total > ACCOUNTS_MAX as u64 {
            return err(
                vec![Name("markets")],
                format!("{accounts_total} accounts in all; at most {ACCOUNTS_MAX}"),
            );
        }
        let mix = &self.mix;
        for (k, v) in [
            ("limit", mix.limit),
            ("market", mix.market),
            ("ioc", mix.ioc),
            ("fok", mix.fok),
            ("cancel", mix.cancel),
            ("replace", mix.replace),
            ("mass_cancel", mix.mass_cancel),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return err(
                    vec![Name("mix"), Name(k)],
                    "must be a weight of 0 or more".into(),
                );
            }
        }
        if mix.limit <= 0.0 {
            return err(
                vec![Name("mix"), Name("limit")],
                "must be positive: without resting orders nothing can trade or be cancelled".into(),
            );
        }
        if !(mix.crossing_share.is_finite() && (0.0..=1.0).contains(&mix.crossing_share)) {
            return err(
                vec![Name("mix"), Name("crossing_share")],
                "must be between 0 and 1".into(),
            );
        }
        if self.phases.is_empty() || self.phases.len() > PHASES_MAX {
            return err(
                vec![Name("phases")],
                format!("need 1 to {PHASES_MAX} phases"),
            );
        }
        for (i, ph) in self.phases.iter().enumerate() {
            let p = |k: &'static str| vec![Name("phases"), Index(i), Name(k)];
            let r = |k: &'static str| vec![Name("phases"), Index(i), Name("rate"), Name(k)];
            if !(ph.duration_s.is_finite()
                && ph.duration_s > 0.0
                && ph.duration_s <= PHASE_DURATION_S_MAX)
            {
                return err(
                    p("duration_s"),
                    format!("must be more than 0 and at most {PHASE_DURATION_S_MAX} seconds"),
                );
            }
            let rate_ok = |v: f64| v.is_finite() && v > 0.0 && v <= RATE_PER_S_MAX;
            let rate_msg = format!(
                "impossible rate: must be more than 0 and at most {RATE_PER_S_MAX} commands per second"
            );
            match &ph.rate {
                Rate::Constant(c) => {
                    if !rate_ok(c.per_s) {
                        return err(r("per_s"), rate_msg);
                    }
                }
                Rate::Ramp(c) => {
                    if !rate_ok(c.from_per_s) {
                        return err(r("from_per_s"), rate_msg);
                    }
                    if !rate_ok(c.to_per_s) {
                        return err(r("to_per_s"), rate_msg);
                    }
                }
                Rate::Steps(c) => {
                    if !rate_ok(c.from_per_s) {
                        return err(r("from_per_s"), rate_msg);
                    }
                    if !rate_ok(c.to_per_s) {
                        return err(r("to_per_s"), rate_msg);
                    }
                    if !(c.step_per_s.is_finite() && c.step_per_s != 0.0) {
                        return err(r("step_per_s"), "must not be zero".into());
                    }
                    if !(c.step_s.is_finite() && c.step_s > 0.0 && c.step_s <= ph.duration_s) {
                        return err(
                            r("step_s"),
                            "must be more than 0 and at most the phase's duration".into(),
                        );
                    }
                }
                Rate::Peaks(c) => {
                    if !rate_ok(c.base_per_s) {
                        return err(r("base_per_s"), rate_msg);
                    }
                    if !rate_ok(c.peak_per_s) {
                        return err(r("peak_per_s"), rate_msg);
                    }
                    if c.peak_per_s < c.base_per_s {
                        return err(
                            r("peak_per_s"),
                            "a peak must not be below the base rate".into(),
                        );
                    }
                    if !(c.period_s.is_finite() && c.period_s > 0.0 && c.period_s <= ph.duration_s)
                    {
                        return err(
                            r("period_s"),
                            "must be more than 0 and at most the phase's duration".into(),
                        );
                    }
                    if !(c.peak_s.is_finite() && c.peak_s > 0.0 && c.peak_s < c.period_s) {
                        return err(r("peak_s"), "must be more than 0 and shorter than period_s (recovery needs time at the base rate)".into());
                    }
                }
                Rate::Search(c) => {
                    if !rate_ok(c.start_per_s) {
                        return err(r("start_per_s"), rate_msg);
                    }
                    if !rate_ok(c.max_per_s) {
                        return err(r("max_per_s"), rate_msg);
                    }
                    if c.max_per_s < c.start_per_s {
                        return err(r("max_per_s"), "must not be below start_per_s".into());
                    }
                    if !(c.factor.is_finite() && c.factor > 1.0 && c.factor <= 10.0) {
                        return err(r("factor"), "must be more than 1 and at most 10".into());
                    }
                    if !(c.step_s.is_finite() && c.step_s >= 0.2 && c.step_s <= ph.duration_s) {
                        return err(
                            r("step_s"),
                            "must be at least 0.2 s and at most the phase's duration".into(),
                        );
                    }
                    if !(c.p99_limit_us.is_finite() && c.p99_limit_us > 0.0) {
                        return err(r("p99_limit_us"), "must be positive".into());
                    }
                    if !(c.keep_up_share.is_finite()
                        && c.keep_up_share > 0.0
                        && c.keep_up_share <= 1.0)
                    {
                        return err(
                            r("keep_up_share"),
                            "must be more than 0 and at most 1".into(),
                        );
                    }
                }
            }
            if let Some(h) = &ph.hot {
                let hp = |k: &'static str| vec![Name("phases"), Index(i), Name("hot"), Name(k)];
                let fewest = self
                    .markets
                    .iter()
                    .map(|m| m.instruments)
                    .min()
                    .unwrap_or(0);
                if h.instruments == 0 || h.instruments > fewest {
                    return err(
                        hp("instruments"),
                        format!("must be 1 to {fewest} (the fewest instruments of any market)"),
                    );
                }
                if !(h.share.is_finite() && h.share > 0.0 && h.share <= 1.0) {
                    return err(hp("share"), "must be more than 0 and at most 1".into());
                }
                if h.during_peaks_only && !matches!(ph.rate, Rate::Peaks(_)) {
                    return err(
                        hp("during_peaks_only"),
                        "needs a rate of shape \"peaks\"".into(),
                    );
                }
            }
        }
        let total = self.duration_s();
        if total > PROFILE_DURATION_S_MAX {
            return err(
                vec![Name("phases")],
                format!("{total} seconds in all; at most {PROFILE_DURATION_S_MAX}"),
            );
        }
        if self.phases.iter().all(|p| p.warmup) {
            return err(
                vec![Name("phases")],
                "every phase is a warm-up: nothing would be measured".into(),
            );
        }
        for (i, v) in self.report.load_ranges_per_s.iter().enumerate() {
            if !(v.is_finite() && *v > 0.0) || (i > 0 && *v <= self.report.load_ranges_per_s[i - 1])
            {
                return err(
                    vec![Name("report"), Name("load_ranges_per_s")],
                    "must be positive and increasing".into(),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "t"
[[markets]]
name = "eq"
kind = "equity"
instruments = 4
accounts = 100

[mix]
limit = 50
market = 1
ioc = 2
fok = 1
cancel = 40
replace = 5
mass_cancel = 1
crossing_share = 0.05

[[phases]]
name = "one"
duration_s = 1
[phases.rate]
shape = "constant"
per_s = 1000
"#;

    #[test]
    fn a_good_profile_parses() {
        let p = Profile::parse(GOOD).unwrap();
        assert_eq!(p.markets[0].instruments, 4);
        assert_eq!(p.target.kind, TargetKind::InProcess);
        assert!(p.check_runnable().is_ok());
    }

    #[test]
    fn accounts_under_load_are_refused_by_name_unless_a_cluster_adds_them_to_a_known_market() {
        let section = "\n[accounts_under_load]\nmarket = \"eq\"\ncount = 10\nstart_s = 0.5\n";
        let in_process = Profile::parse(&format!("{GOOD}{section}")).unwrap_err();
        assert!(
            in_process
                .to_string()
                .contains("accounts_under_load.market"),
            "{in_process}"
        );
        assert!(in_process.reason.contains("cluster"), "{in_process}");
        let cluster = GOOD.replacen(
            "name = \"t\"\n",
            "name = \"t\"\n[target]\nkind = \"cluster\"\nprotocol = \"binary\"\nsessions = 1\nqueue_capacity = 64\n",
            1,
        );
        let ok = Profile::parse(&format!("{cluster}{section}")).unwrap();
        assert_eq!(ok.accounts_under_load.unwrap().count, 10);
        let unknown = section.replace("\"eq\"", "\"nowhere\"");
        let e = Profile::parse(&format!("{cluster}{unknown}")).unwrap_err();
        assert!(e.reason.contains("no market named \"nowhere\""), "{e}");
        let zero = section.replace("count = 10", "count = 0");
        let e = Profile::parse(&format!("{cluster}{zero}")).unwrap_err();
        assert!(e.to_string().contains("accounts_under_load.count"), "{e}");
        let typo = section.replace("start_s", "start_secs");
        assert!(Profile::parse(&format!("{cluster}{typo}")).is_err());
    }

    #[test]
    fn clearing_runs_are_refused_by_name_unless_a_cluster_runs_them_in_order_in_time() {
        let section = "\n[[clearing_runs]]\nat_s = 0.5\nkind = \"intermediate\"\n";
        let in_process = Profile::parse(&format!("{GOOD}{section}")).unwrap_err();
        assert!(
            in_process.to_string().contains("clearing_runs[0].kind"),
            "{in_process}"
        );
        assert!(in_process.reason.contains("cluster"), "{in_process}");
        let cluster = GOOD.replacen(
            "name = \"t\"\n",
            "name = \"t\"\n[target]\nkind = \"cluster\"\nprotocol = \"binary\"\nsessions = 1\nqueue_capacity = 64\n",
            1,
        );
        let ok = Profile::parse(&format!("{cluster}{section}")).unwrap();
        assert_eq!(ok.clearing_runs[0].kind, ClearingRunKind::Intermediate);
        let wrong_kind = section.replace("intermediate", "midday");
        let e = Profile::parse(&format!("{cluster}{wrong_kind}")).unwrap_err();
        assert!(e.reason.contains("midday"), "{e}");
        assert!(e.reason.contains("end_of_day"), "{e}");
        assert!(e.line.is_some(), "{e}");
        let late = section.replace("at_s = 0.5", "at_s = 1.5");
        let e = Profile::parse(&format!("{cluster}{late}")).unwrap_err();
        assert!(e.to_string().contains("clearing_runs[0].at_s"), "{e}");
        let backwards = format!("{section}{}", section.replace("0.5", "0.25"));
        let e = Profile::parse(&format!("{cluster}{backwards}")).unwrap_err();
        assert!(e.to_string().contains("clearing_runs[1].at_s"), "{e}");
        let typo = section.replace("at_s", "at_secs");
        assert!(Profile::parse(&format!("{cluster}{typo}")).is_err());
    }

    #[test]
    fn series_seconds_max_defaults_to_an_hour_and_is_refused_past_a_day() {
        let p = Profile::parse(GOOD).unwrap();
        assert_eq!(p.generator.series_seconds_max, SERIES_SECONDS_MAX_DEFAULT);
        let section = |n: u32| {
            format!(
                "{GOOD}\n[generator]\nworkers = 1\npacing = \"uniform\"\ninflight_max = 64\n\
                 drain_timeout_s = 1\nseries_seconds_max = {n}\n"
            )
        };
        assert_eq!(
            Profile::parse(&section(0))
                .unwrap()
                .generator
                .series_seconds_max,
            0
        );
        let e = Profile::parse(&section(SERIES_SECONDS_MAX_LIMIT + 1)).unwrap_err();
        assert!(
            e.to_string().contains("generator.series_seconds_max"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_key_names_its_line() {
        let bad = GOOD.replace("accounts = 100", "accounts = 100\nacounts = 7");
        let e = Profile::parse(&bad).unwrap_err();
        assert_eq!(e.line, Some(8), "{e}");
        assert!(e.reason.contains("unknown field `acounts`"), "{e}");
    }

    #[test]
    fn a_misspelled_key_in_a_rate_table_names_its_line_and_field() {
        let bad = GOOD.replacen(
            "shape = \"constant\"",
            "shape = \"constant\"\nper_sec = 5",
            1,
        );
        let e = Profile::parse(&bad).unwrap_err();
        assert!(e.reason.contains("unknown field `per_sec`"), "{e}");
        assert!(e.line.is_some(), "{e}");
    }

    #[test]
    fn every_profile_in_the_repository_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../profiles");
        let mut parsed = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                Profile::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                parsed += 1;
            }
        }
        assert!(parsed >= 7, "{parsed} profiles in {}", dir.display());
    }

    #[test]
    fn a_negative_count_names_its_line() {
        let bad = GOOD.replace("instruments = 4", "instruments = -4");
        let e = Profile::parse(&bad).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.reason.contains("-4"), "{e}");
    }

    #[test]
    fn an_impossible_rate_names_its_line_and_key() {
        let bad = GOOD.replace("per_s = 1000", "per_s = 0");
        let e = Profile::parse(&bad).unwrap_err();
        assert_eq!(e.line, Some(24), "{e}");
        assert_eq!(e.path, "phases[0].rate.per_s");
        assert!(e.reason.contains("impossible rate"), "{e}");
    }

    #[test]
    fn a_peak_longer_than_its_period_is_refused() {
        let bad = GOOD.replace(
            "shape = \"constant\"\nper_s = 1000",
            "shape = \"peaks\"\nbase_per_s = 10\npeak_per_s = 100\npeak_s = 5\nperiod_s = 1",
        );
        let e = Profile::parse(&bad).unwrap_err();
        assert!(e.path.starts_with("phases[0].rate."), "{e}");
        assert!(e.line.is_some(), "{e}");
    }

    #[test]
    fn a_gateway_target_refuses_more_accounts_than_its_sessions_can_trade() {
        let p = GOOD.replace("name = \"t\"", "name = \"t\"\n[target]\nkind = \"cluster\"\nprotocol = \"fix\"\nsessions = 2\nqueue_capacity = 1024");
        let p = Profile::parse(&p).unwrap();
        assert!(p.check_runnable().is_ok());
        let mut big = p.clone();
        big.markets[0].accounts = 300_000;
        let e = big.check_runnable().unwrap_err();
        assert!(
            e.contains("1177 gateway sessions") && e.contains("at most 1000"),
            "{e}"
        );
    }
}
