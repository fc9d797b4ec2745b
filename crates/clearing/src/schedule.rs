//! Clearing runs on the venue's schedule. The venue's trading day (`bourse_admin::schedule`:
//! a calendar and, per market, sessions with pauses between them and an end of day) says
//! when the markets pause; clearing runs in those pauses, as MOEX's derivatives market does:
//! an intermediate run at the start of each pause between sessions (14:00), and the end of
//! day's run at the end of day (18:50, the evening clearing), which takes the place of the
//! intermediate run of the pause it falls in.
//!
//! [`ClearingSchedule::due`] is a pure function of the schedule and an interval; the node's
//! scheduler reads a [`Clock`] (the system's, or a [`ManualClock`] a test sets), so tests step
//! through a simulated day without waiting for it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bourse_admin::schedule::{Schedule, ScheduleConfig, Transition};
use bourse_core::Phase;
use serde::Deserialize;

use crate::run::RunKind;

/// How far ahead of a pause's start its end (or the day's end) is looked for.
const DAY_NS: u64 = 24 * 3_600 * 1_000_000_000;

/// The time now, in nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    fn now_ns(&self) -> u64;
}

/// The system's clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

/// A clock that stands where it is set (tests simulate a day with it).
#[derive(Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now_ns: u64) -> ManualClock {
        ManualClock(AtomicU64::new(now_ns))
    }

    pub fn set(&self, now_ns: u64) {
        self.0.store(now_ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// `[schedule]` of a clearing node's config.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSection {
    /// A venue config file whose `[schedule]` gives the trading day (the file
    /// `bourse demo --day --schedule` reads). A relative path is taken from the clearing
    /// config's directory.
    pub file: PathBuf,
    /// The markets whose pauses drive the runs (names in the file); empty: every market in it.
    #[serde(default)]
    pub markets: Vec<String>,
    /// A run found due more than this long ago (the node was down, or a standby when it was
    /// due) is skipped, not run late.
    #[serde(default = "catch_up_ms_default")]
    pub catch_up_ms: u64,
    /// How often the clock is read.
    #[serde(default = "poll_ms_default")]
    pub poll_ms: u64,
}

fn catch_up_ms_default() -> u64 {
    // MOEX's intermediate clearing pause.
    5 * 60 * 1_000
}

fn poll_ms_default() -> u64 {
    1_000
}

/// A run the schedule asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledRun {
    pub at_ns: u64,
    pub kind: RunKind,
    /// The local date and time, `YYYY-MM-DD HH:MM`.
    pub local: String,
}

/// The venue's day as clearing runs.
#[derive(Clone, Debug)]
pub struct ClearingSchedule {
    schedule: Schedule,
    /// The venue's local time less UTC, in minutes (its business dates are local dates).
    utc_offset_min: i64,
}

/// The market names a venue config's `[schedule]` lists.
fn markets_in(text: &str) -> Result<Vec<String>, String> {
    let value: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    let markets = value
        .get("schedule")
        .and_then(|s| s.get("markets"))
        .and_then(|m| m.as_array())
        .ok_or("no [[schedule.markets]] in the file")?;
    Ok(markets
        .iter()
        .filter_map(|m| m.get("market").and_then(|n| n.as_str()).map(String::from))
        .collect())
}

impl ClearingSchedule {
    /// Reads the section's file and keeps the markets it names; errors name the file and
    /// what is wrong in it.
    pub fn load(section: &ScheduleSection) -> Result<ClearingSchedule, String> {
        let text = std::fs::read_to_string(&section.file)
            .map_err(|e| format!("schedule.file {}: {e}", section.file.display()))?;
        Self::from_venue_toml(&text, &section.markets)
            .map_err(|e| format!("schedule.file {}: {e}", section.file.display()))
    }

    /// The schedule of a venue config's text, kept to `markets` (all when empty).
    pub fn from_venue_toml(text: &str, markets: &[String]) -> Result<ClearingSchedule, String> {
        let named = markets_in(text)?;
        let names: Vec<&str> = named.iter().map(String::as_str).collect();
        let mut config = ScheduleConfig::from_venue_toml(text, &names)?;
        if let Some(m) = markets.iter().find(|m| !named.contains(m)) {
            return Err(format!(
                "schedule.markets: {m:?} has no day in the file (it has: {})",
                names.join(", ")
            ));
        }
        if !markets.is_empty() {
            config.markets.retain(|m| markets.contains(&m.market));
        }
        Ok(ClearingSchedule {
            schedule: Schedule::new(&config)?,
            utc_offset_min: i64::from(config.utc_offset_minutes),
        })
    }

    /// The venue's business calendar (its local dates, business weekdays and holidays).
    pub fn calendar(&self) -> &Schedule {
        &self.schedule
    }

    /// The venue's local time less UTC, in minutes.
    pub fn utc_offset_minutes(&self) -> i64 {
        self.utc_offset_min
    }

    /// Every run due in `(after_ns, until_ns]`, in time order, one per instant and kind
    /// whatever the number of markets pausing then.
    pub fn due(&self, after_ns: u64, until_ns: u64) -> Vec<ScheduledRun> {
        let ahead = self
            .schedule
            .transitions(after_ns, until_ns.saturating_add(DAY_NS));
        let mut out = BTreeSet::new();
        for (i, d) in ahead.iter().enumerate() {
            if d.at_ns > until_ns {
                break;
            }
            let kind = match d.transition {
                Transition::EndOfDay => RunKind::EndOfDay,
                Transition::Phase(Phase::Paused) => {
                    // The pause lasts until the market's next phase; the end of day inside
                    // it is the pause's run.
                    let later = ahead[i + 1..].iter().filter(|n| n.market == d.market);
                    let eod_inside = later
                        .take_while(|n| !matches!(n.transition, Transition::Phase(_)))
                        .any(|n| n.transition == Transition::EndOfDay);
                    if eod_inside {
                        continue;
                    }
                    RunKind::Intermediate
                }
                Transition::Phase(_) => continue,
            };
            out.insert((d.at_ns, kind_order(kind), d.local.clone()));
        }
        let mut runs: Vec<ScheduledRun> = Vec::new();
        for (at_ns, k, local) in out {
            let kind = if k == 0 {
                RunKind::Intermediate
            } else {
                RunKind::EndOfDay
            };
            if runs
                .last()
                .is_some_and(|r| r.at_ns == at_ns && r.kind == kind)
            {
                continue;
            }
            runs.push(ScheduledRun { at_ns, kind, local });
        }
        runs
    }
}

fn kind_order(kind: RunKind) -> u8 {
    match kind {
        RunKind::Intermediate => 0,
        RunKind::EndOfDay => 1,
    }
}

/// The section's file resolved against the config file's directory.
pub fn resolve(section: &mut ScheduleSection, base: &Path) {
    section.file = base.join(&section.file);
}

#[cfg(test)]
mod tests {
    use super::*;

    const VENUE: &str = r#"
[schedule]
utc_offset_minutes = 180

[[schedule.markets]]
market = "futures"
sessions = [{ from = "10:00", to = "14:00" }, { from = "14:05", to = "18:45" }, { from = "19:05", to = "23:50" }]
end_of_day = "18:50"

[[schedule.markets]]
market = "options"
sessions = [{ from = "10:00", to = "14:00" }, { from = "14:05", to = "18:45" }, { from = "19:05", to = "23:50" }]
end_of_day = "18:50"
"#;

    /// Unix ns of Moscow (UTC+3) local time on Monday 2026-11-23 (day 20780 since 1970).
    fn msk(day_offset: u64, hh: u64, mm: u64) -> u64 {
        const MIN: u64 = 60_000_000_000;
        ((20_780 + day_offset) * 1_440 + hh * 60 + mm - 180) * MIN
    }

    #[test]
    fn the_moex_day_asks_an_intermediate_run_at_14_00_and_end_of_day_at_18_50_once() {
        let s = ClearingSchedule::from_venue_toml(VENUE, &[]).unwrap();
        let day = s.due(msk(0, 0, 0), msk(1, 0, 0));
        let got: Vec<(&str, RunKind)> = day.iter().map(|r| (&r.local[11..], r.kind)).collect();
        assert_eq!(
            got,
            vec![
                ("14:00", RunKind::Intermediate),
                ("18:50", RunKind::EndOfDay)
            ]
        );
        assert_eq!(day[0].at_ns, msk(0, 14, 0));
        assert_eq!(day[0].local, "2026-11-23 14:00");
        // The weekend asks for nothing.
        assert!(s.due(msk(5, 0, 0), msk(7, 0, 0)).is_empty());
    }

    #[test]
    fn a_schedule_names_what_is_wrong_with_it() {
        let e = ClearingSchedule::from_venue_toml(VENUE, &["bonds".into()]).unwrap_err();
        assert!(e.contains("\"bonds\""), "{e}");
        let e = ClearingSchedule::from_venue_toml("[other]\n", &[]).unwrap_err();
        assert!(e.contains("schedule"), "{e}");
        let bad = VENUE.replace("end_of_day = \"18:50\"\n\n", "end_of_day = \"18:70\"\n\n");
        assert!(ClearingSchedule::from_venue_toml(&bad, &[])
            .unwrap_err()
            .contains("18:70"));
        let only = ClearingSchedule::from_venue_toml(VENUE, &["options".into()]).unwrap();
        assert_eq!(only.due(msk(0, 0, 0), msk(1, 0, 0)).len(), 2);
    }
}
