//! The trading day's schedule: a calendar (a fixed UTC offset, business days, holidays) and
//! per market its sessions, from which the phases follow by one rule (docs/admin.md, "The
//! trading day"): inside a session `open`; between two sessions of the day `paused` (a
//! clearing pause: new orders refused, resting orders stay); before the first and after the
//! last `closed`; and the end of day at its own time.
//!
//! [`Schedule::transitions`] lists what is due in a time interval, a pure function of the
//! config, so it is tested with any instants; [`ScheduleDriver::step`] issues what became due
//! since its last step through the [`AdminService`] (the sequenced path, audited as operator
//! `schedule`), each under a request id made of the market, the date and the time, so a
//! driver that steps twice over the same instant, or restarts, applies nothing twice. At its
//! start the driver puts each market in the phase in force
//! ([`ScheduleDriver::enter_phase_in_force`]). Only the driver's caller reads a clock; a test
//! passes simulated instants.

use crate::action::Action;
use crate::service::AdminService;
use bourse_core::Phase;
use serde::Deserialize;
use std::sync::Arc;

const NS_PER_MIN: u64 = 60_000_000_000;
const MIN_PER_DAY: u64 = 24 * 60;

/// The calendar and every market's sessions.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// The venue's local time as a fixed offset from UTC, in minutes (Moscow: 180).
    #[serde(default = "moscow")]
    pub utc_offset_minutes: i32,
    /// Days that trade: `mon` .. `sun`.
    #[serde(default = "weekdays")]
    pub business_days: Vec<String>,
    /// Dates that do not trade, `YYYY-MM-DD` in local time.
    #[serde(default)]
    pub holidays: Vec<String>,
    pub markets: Vec<MarketSchedule>,
}

/// One market's day.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketSchedule {
    pub market: String,
    /// Trading sessions, `HH:MM` local, in order and apart.
    pub sessions: Vec<Session>,
    /// When the trading day ends (Day orders expire), `HH:MM` local.
    pub end_of_day: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Session {
    pub from: String,
    pub to: String,
}

fn moscow() -> i32 {
    180
}

fn weekdays() -> Vec<String> {
    ["mon", "tue", "wed", "thu", "fri"]
        .map(String::from)
        .to_vec()
}

/// The part of a venue's config file the schedule driver reads: its `[schedule]` table (with
/// `[[schedule.markets]]`). Nothing else may be in the file: a misspelled section would
/// otherwise leave the venue on the default day without a word.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VenueScheduleFile {
    schedule: ScheduleConfig,
}

impl ScheduleConfig {
    /// Reads a venue config's `[schedule]` and checks it against the venue: every market it
    /// names must be one of `markets`. Errors name the field, the line (TOML's) or the
    /// market.
    pub fn from_venue_toml(text: &str, markets: &[&str]) -> Result<ScheduleConfig, String> {
        let file: VenueScheduleFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let config = file.schedule;
        config.check(markets)?;
        Ok(config)
    }

    /// Checks a `[schedule]` read from a file against the venue: every market it names must
    /// be one of `markets`, and the rules of [`Schedule::new`] hold. Errors name the field.
    pub fn check(&self, markets: &[&str]) -> Result<(), String> {
        for m in &self.markets {
            if !markets.contains(&m.market.as_str()) {
                return Err(format!(
                    "schedule.markets: no market {:?} in this venue (markets: {})",
                    m.market,
                    markets.join(", ")
                ));
            }
        }
        Schedule::new(self).map_err(|e| format!("schedule: {e}"))?;
        Ok(())
    }

    /// MOEX's derivatives day for each named market: main session 10:00–14:00, the
    /// intermediate clearing pause 14:00–14:05, main session to 18:45, the pause through the
    /// evening clearing 18:50–19:05 (the trading day ends at 18:50), evening session to 23:50;
    /// Moscow time (UTC+3), Monday to Friday.
    pub fn moex_derivatives(markets: &[&str]) -> ScheduleConfig {
        let s = |from: &str, to: &str| Session {
            from: from.into(),
            to: to.into(),
        };
        ScheduleConfig {
            utc_offset_minutes: moscow(),
            business_days: weekdays(),
            holidays: Vec::new(),
            markets: markets
                .iter()
                .map(|m| MarketSchedule {
                    market: (*m).into(),
                    sessions: vec![
                        s("10:00", "14:00"),
                        s("14:05", "18:45"),
                        s("19:05", "23:50"),
                    ],
                    end_of_day: "18:50".into(),
                })
                .collect(),
        }
    }
}

/// What happens to a market at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Phase(Phase),
    EndOfDay,
}

/// One due transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    pub at_ns: u64,
    pub market: String,
    pub transition: Transition,
    /// Local date and time, `YYYY-MM-DD HH:MM`: the request id's part.
    pub local: String,
}

/// A checked schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    offset_min: i64,
    /// Business days as bits, Monday = bit 0.
    days: u8,
    /// Holidays as days since 1970-01-01, local.
    holidays: Vec<i64>,
    /// Per market: its name and its day's transitions by minute of the local day, sorted.
    markets: Vec<(String, Vec<(u64, Transition)>)>,
}

fn minute_of(hhmm: &str, what: &str) -> Result<u64, String> {
    let bad = || format!("{what}: {hhmm:?} is not a time HH:MM");
    let (h, m) = hhmm.split_once(':').ok_or_else(bad)?;
    let (h, m): (u64, u64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 23 || m > 59 || hhmm.len() != 5 {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

fn parse_date(s: &str) -> Result<i64, String> {
    day_of_date(s).ok_or_else(|| format!("holidays: {s:?} is not a date YYYY-MM-DD"))
}

/// The day (since 1970-01-01) of a date `YYYY-MM-DD`; none when it is not one.
pub fn day_of_date(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.split('-').collect();
    if parts.len() != 3 || s.len() != 10 {
        return None;
    }
    let n = |p: &str| p.parse::<i64>().ok();
    let (y, m, d) = (n(parts[0])?, n(parts[1])?, n(parts[2])?);
    if !(1..=12).contains(&m)
        || !(1..=31).contains(&d)
        || civil_from_days(days_from_civil(y, m, d)) != (y, m, d)
    {
        return None;
    }
    Some(days_from_civil(y, m, d))
}

/// A day (since 1970-01-01) as its date, `YYYY-MM-DD`.
pub fn date_text(day: i64) -> String {
    let (y, m, d) = civil_from_days(day);
    format!("{y:04}-{m:02}-{d:02}")
}

impl Schedule {
    /// Checks the config: times, sessions in order and apart, days, dates, an offset within
    /// ±14 h; each error names what is wrong.
    pub fn new(config: &ScheduleConfig) -> Result<Schedule, String> {
        if config.utc_offset_minutes.abs() > 14 * 60 {
            return Err("utc_offset_minutes: outside -840..=840".into());
        }
        let mut days = 0u8;
        for d in &config.business_days {
            let bit = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
                .iter()
                .position(|x| x == d)
                .ok_or_else(|| format!("business_days: {d:?} is not mon..sun"))?;
            days |= 1 << bit;
        }
        if days == 0 {
            return Err("business_days: none (a venue trades on at least one weekday)".into());
        }
        let mut holidays = config
            .holidays
            .iter()
            .map(|h| parse_date(h))
            .collect::<Result<Vec<_>, _>>()?;
        holidays.sort_unstable();
        let mut markets = Vec::new();
        for m in &config.markets {
            let what = format!("market {}", m.market);
            if m.sessions.is_empty() {
                return Err(format!("{what}: no sessions"));
            }
            let mut steps = Vec::new();
            let mut last_end = None;
            for (i, s) in m.sessions.iter().enumerate() {
                let from = minute_of(&s.from, &what)?;
                let to = minute_of(&s.to, &what)?;
                if to <= from || last_end.is_some_and(|e| from <= e) {
                    return Err(format!(
                        "{what}: sessions must be in order, each ending after it starts and \
                         before the next ({} - {})",
                        s.from, s.to
                    ));
                }
                steps.push((from, Transition::Phase(Phase::Open)));
                let after = if i + 1 == m.sessions.len() {
                    Phase::Closed
                } else {
                    Phase::Paused
                };
                steps.push((to, Transition::Phase(after)));
                last_end = Some(to);
            }
            steps.push((minute_of(&m.end_of_day, &what)?, Transition::EndOfDay));
            steps.sort_by_key(|(minute, _)| *minute);
            markets.push((m.market.clone(), steps));
        }
        Ok(Schedule {
            offset_min: i64::from(config.utc_offset_minutes),
            days,
            holidays,
            markets,
        })
    }

    fn trades_on(&self, day: i64) -> bool {
        // 1970-01-01 was a Thursday (bit 3).
        let weekday = (day + 3).rem_euclid(7);
        self.days & (1 << weekday) != 0 && self.holidays.binary_search(&day).is_err()
    }

    /// Whether the local day `day` (days since 1970-01-01) is a business day: a business
    /// weekday and no holiday.
    pub fn is_business_day(&self, day: i64) -> bool {
        self.trades_on(day)
    }

    /// The local day (days since 1970-01-01 in the venue's time) of an instant.
    pub fn local_day(&self, at_ns: u64) -> i64 {
        (at_ns as i64 + self.offset_min * NS_PER_MIN as i64)
            .div_euclid((MIN_PER_DAY * NS_PER_MIN) as i64)
    }

    /// The first business day on or after `day` (a schedule has at least one business
    /// weekday and finitely many holidays, so there is one).
    pub fn business_day_on_or_after(&self, day: i64) -> i64 {
        let mut d = day;
        while !self.trades_on(d) {
            d += 1;
        }
        d
    }

    /// The business day `n` business days after the business day on or after `day` (T+n).
    pub fn add_business_days(&self, day: i64, n: u32) -> i64 {
        let mut d = self.business_day_on_or_after(day);
        for _ in 0..n {
            d = self.business_day_on_or_after(d + 1);
        }
        d
    }

    /// Every transition due in `(after_ns, until_ns]`, in time order (markets in config order
    /// at one instant).
    pub fn transitions(&self, after_ns: u64, until_ns: u64) -> Vec<Due> {
        let mut out = Vec::new();
        if until_ns <= after_ns {
            return out;
        }
        let offset_ns = self.offset_min * NS_PER_MIN as i64;
        let local = |t: u64| t as i64 + offset_ns;
        let first_day = local(after_ns).div_euclid((MIN_PER_DAY * NS_PER_MIN) as i64);
        let last_day = local(until_ns).div_euclid((MIN_PER_DAY * NS_PER_MIN) as i64);
        for day in first_day..=last_day {
            if !self.trades_on(day) {
                continue;
            }
            let (y, mo, d) = civil_from_days(day);
            let mut today = Vec::new();
            for (name, steps) in &self.markets {
                for &(minute, transition) in steps {
                    let local_ns =
                        day * (MIN_PER_DAY * NS_PER_MIN) as i64 + (minute * NS_PER_MIN) as i64;
                    let at = local_ns - offset_ns;
                    if at <= after_ns as i64 || at > until_ns as i64 {
                        continue;
                    }
                    today.push(Due {
                        at_ns: at as u64,
                        market: name.clone(),
                        transition,
                        local: format!(
                            "{y:04}-{mo:02}-{d:02} {:02}:{:02}",
                            minute / 60,
                            minute % 60
                        ),
                    });
                }
            }
            today.sort_by_key(|d| d.at_ns);
            out.extend(today);
        }
        out
    }
}

impl Schedule {
    /// Per market (in config order), the last phase change due at or before `at_ns`: the
    /// phase the schedule puts the market in at that instant, and when it began. A market
    /// with no phase change in the last [`IN_FORCE_LOOKBACK_DAYS`] is left out.
    pub fn in_force(&self, at_ns: u64) -> Vec<Due> {
        let after = at_ns.saturating_sub(IN_FORCE_LOOKBACK_DAYS * MIN_PER_DAY * NS_PER_MIN);
        let mut last: Vec<Option<Due>> = vec![None; self.markets.len()];
        for d in self.transitions(after, at_ns) {
            if !matches!(d.transition, Transition::Phase(_)) {
                continue;
            }
            if let Some(n) = self.markets.iter().position(|(name, _)| *name == d.market) {
                last[n] = Some(d);
            }
        }
        last.into_iter().flatten().collect()
    }
}

/// How far back [`Schedule::in_force`] looks for the phase change in force: longer than any
/// run of days without trading a calendar has (a weekend, the new-year holidays).
pub const IN_FORCE_LOOKBACK_DAYS: u64 = 400;

/// Issues the schedule's transitions through the admin service; see the module docs.
pub struct ScheduleDriver {
    schedule: Schedule,
    service: Arc<AdminService>,
    last_ns: u64,
}

/// The operator name the driver's actions are audited under.
pub const SCHEDULE_OPERATOR: &str = "schedule";

impl ScheduleDriver {
    /// A driver whose first step issues what is due after `start_ns`.
    pub fn new(schedule: Schedule, service: Arc<AdminService>, start_ns: u64) -> ScheduleDriver {
        ScheduleDriver {
            schedule,
            service,
            last_ns: start_ns,
        }
    }

    /// Puts every market in the phase the schedule says at the driver's start instant, so a
    /// driver started mid-day (or on a weekend) does not leave the markets in whatever
    /// phase they had until the next boundary. Call it once, before the first step. Each
    /// market gets the last phase change due at or before the start ([`Schedule::in_force`]),
    /// issued under the request id it had when due: if it was issued then (by this service
    /// before a restart), it is answered from that run and applies nothing again, so a halt
    /// an operator made since stays. The end of day is not replayed: one missed while no
    /// driver ran is the operator's to issue.
    pub async fn enter_phase_in_force(&mut self) -> Vec<(Due, String)> {
        let due = self.schedule.in_force(self.last_ns);
        self.issue(due).await
    }

    /// Issues every transition due up to `now_ns` (one at a time, in order) and returns them
    /// with the answer's outcome.
    pub async fn step(&mut self, now_ns: u64) -> Vec<(Due, String)> {
        let due = self.schedule.transitions(self.last_ns, now_ns);
        self.last_ns = self.last_ns.max(now_ns);
        self.issue(due).await
    }

    /// Issues `due` one at a time, in order, each under its request id.
    async fn issue(&self, due: Vec<Due>) -> Vec<(Due, String)> {
        let mut done = Vec::new();
        for d in due {
            let (action, kind) = match d.transition {
                Transition::Phase(phase) => (
                    Action::SetPhase {
                        market: Some(d.market.clone()),
                        instrument: None,
                        phase,
                    },
                    "phase",
                ),
                Transition::EndOfDay => (
                    Action::EndOfDay {
                        market: Some(d.market.clone()),
                    },
                    "eod",
                ),
            };
            let id = format!(
                "schedule-{}-{}-{kind}",
                d.market,
                d.local.replace([' ', ':'], "-")
            );
            let answer = self.service.run(SCHEDULE_OPERATOR, &id, action).await;
            done.push((d, answer.outcome().to_string()));
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix ns of a local (UTC+3) date and time.
    fn msk(y: i64, m: i64, d: i64, hh: u64, mm: u64) -> u64 {
        let local = days_from_civil(y, m, d) as u64 * MIN_PER_DAY * NS_PER_MIN
            + (hh * 60 + mm) * NS_PER_MIN;
        local - 180 * NS_PER_MIN
    }

    #[test]
    fn the_moex_derivatives_day_has_its_pauses_and_end_of_day_in_order() {
        let s = Schedule::new(&ScheduleConfig::moex_derivatives(&["futures"])).unwrap();
        // Monday 2026-11-23, the whole local day.
        let day = s.transitions(msk(2026, 11, 23, 0, 0), msk(2026, 11, 24, 0, 0));
        let got: Vec<(String, Transition)> = day
            .iter()
            .map(|d| (d.local[11..].to_string(), d.transition))
            .collect();
        let p = Transition::Phase;
        let want = [
            ("10:00", p(Phase::Open)),
            ("14:00", p(Phase::Paused)),
            ("14:05", p(Phase::Open)),
            ("18:45", p(Phase::Paused)),
            ("18:50", Transition::EndOfDay),
            ("19:05", p(Phase::Open)),
            ("23:50", p(Phase::Closed)),
        ];
        let want: Vec<(String, Transition)> =
            want.iter().map(|(t, x)| (t.to_string(), *x)).collect();
        assert_eq!(got, want);
        assert_eq!(day[1].at_ns, msk(2026, 11, 23, 14, 0));
        assert_eq!(day[1].local, "2026-11-23 14:00");
    }

    #[test]
    fn weekends_and_holidays_have_no_transitions() {
        let mut c = ScheduleConfig::moex_derivatives(&["futures"]);
        c.holidays = vec!["2026-11-24".into()];
        let s = Schedule::new(&c).unwrap();
        // Saturday 2026-11-28 and Sunday: nothing; the holiday Tuesday: nothing.
        assert!(s
            .transitions(msk(2026, 11, 28, 0, 0), msk(2026, 11, 30, 0, 0))
            .is_empty());
        assert!(s
            .transitions(msk(2026, 11, 24, 0, 0), msk(2026, 11, 25, 0, 0))
            .is_empty());
        assert_eq!(
            s.transitions(msk(2026, 11, 25, 0, 0), msk(2026, 11, 26, 0, 0))
                .len(),
            7
        );
    }

    #[test]
    fn an_interval_includes_its_end_and_excludes_its_start() {
        let s = Schedule::new(&ScheduleConfig::moex_derivatives(&["futures"])).unwrap();
        let t = msk(2026, 11, 23, 14, 0);
        assert_eq!(s.transitions(t - 1, t).len(), 1);
        assert!(s.transitions(t, t + 1).is_empty());
    }

    #[test]
    fn a_bad_config_is_refused_naming_what_is_wrong() {
        let mut c = ScheduleConfig::moex_derivatives(&["futures"]);
        c.markets[0].sessions[1].from = "13:00".into();
        assert!(Schedule::new(&c).unwrap_err().contains("in order"));
        let mut c = ScheduleConfig::moex_derivatives(&["futures"]);
        c.holidays = vec!["2026-02-30".into()];
        assert!(Schedule::new(&c).unwrap_err().contains("2026-02-30"));
        let mut c = ScheduleConfig::moex_derivatives(&["futures"]);
        c.markets[0].end_of_day = "25:00".into();
        assert!(Schedule::new(&c).unwrap_err().contains("25:00"));
        let mut c = ScheduleConfig::moex_derivatives(&["futures"]);
        c.business_days = vec!["monday".into()];
        assert!(Schedule::new(&c).unwrap_err().contains("monday"));
        let e =
            toml::from_str::<ScheduleConfig>("markets = []\nutc_ofset_minutes = 1\n").unwrap_err();
        assert!(e.to_string().contains("utc_ofset_minutes"), "{e}");
    }

    #[test]
    fn a_venue_config_schedule_is_read_and_refused_by_name() {
        let text = r#"
[schedule]
utc_offset_minutes = 180
business_days = ["mon", "tue", "wed", "thu", "fri"]
holidays = ["2026-12-31"]

[[schedule.markets]]
market = "equities"
sessions = [{ from = "10:00", to = "18:40" }, { from = "19:05", to = "23:50" }]
end_of_day = "18:45"
"#;
        let c = ScheduleConfig::from_venue_toml(text, &["equities", "fx"]).unwrap();
        assert_eq!(c.markets.len(), 1);
        assert_eq!(c.markets[0].sessions[1].from, "19:05");
        assert_eq!(c.holidays, vec!["2026-12-31".to_string()]);
        let schedule = Schedule::new(&c).unwrap();
        // Monday 2026-11-23 at 18:40 Moscow (15:40 UTC): equities pause until 19:05.
        let at = |h: u64, m: u64| ((20_780 * 24 + h) * 60 + m) * NS_PER_MIN;
        let due = schedule.transitions(at(15, 39), at(15, 41));
        assert_eq!(due.len(), 1, "{due:?}");
        assert_eq!(due[0].transition, Transition::Phase(Phase::Paused));
        let e = ScheduleConfig::from_venue_toml(text, &["fx"]).unwrap_err();
        assert!(e.contains("\"equities\"") && e.contains("fx"), "{e}");
        let e = ScheduleConfig::from_venue_toml(&text.replace("[schedule]", "[schedul]"), &[])
            .unwrap_err();
        assert!(e.contains("schedul"), "{e}");
        let e = ScheduleConfig::from_venue_toml(&text.replace("end_of_day", "end_of_dya"), &[])
            .unwrap_err();
        assert!(e.contains("end_of_dya"), "{e}");
        let e = ScheduleConfig::from_venue_toml(&text.replace("19:05", "18:00"), &["equities"])
            .unwrap_err();
        assert!(e.contains("in order"), "{e}");
    }

    #[test]
    fn civil_dates_round_trip() {
        for day in -800_000..800_000i64 {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
        // 1970-01-01 was a Thursday, 2026-11-23 a Monday.
        assert_eq!((days_from_civil(2026, 11, 23) + 3).rem_euclid(7), 0);
    }
}
