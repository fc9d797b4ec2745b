//! The trading day's schedule: a calendar (a fixed UTC offset, business days, holidays) and
//! per market its sessions, from which the phases follow by one rule (docs/admin.md, "The
//! trading day"): inside a session its phase (`open`, or a call auction:
//! `opening_auction`, `closing_auction`); between two sessions of the day that do not touch
//! `paused` (a clearing pause: new orders refused, resting orders stay); before the first and
//! after the last `closed`; and the end of day at its own time. Leaving an auction session
//! uncrosses its book (the engine does, on the phase change); an auction session may end at a
//! random instant within a window after its `to`, drawn from the schedule's seed, the market
//! and the date, so the same config gives the same day everywhere and on every replay.
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
    /// The seed of the auctions' random ends (`random_end_seconds`): the same seed gives the
    /// same ends.
    #[serde(default)]
    pub random_end_seed: u64,
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
    /// The session's phase: `open` (continuous trading, the default), `opening_auction` or
    /// `closing_auction` (a call; its book uncrosses when the session ends).
    #[serde(default = "open")]
    pub phase: Phase,
    /// An auction session only: it ends at `to` plus a random whole number of seconds below
    /// this (as LSE's and Xetra's random ends), and the next session starts then.
    #[serde(default)]
    pub random_end_seconds: u32,
}

fn open() -> Phase {
    Phase::Open
}

impl Session {
    /// A continuous session.
    pub fn open(from: &str, to: &str) -> Session {
        Session::of(Phase::Open, from, to)
    }

    /// A session in `phase`, without a random end.
    pub fn of(phase: Phase, from: &str, to: &str) -> Session {
        Session {
            from: from.into(),
            to: to.into(),
            phase,
            random_end_seconds: 0,
        }
    }
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
        ScheduleConfig::moex(&markets.iter().map(|m| (*m, false)).collect::<Vec<_>>())
    }

    /// MOEX's day per market, `(market, auctions)`: a market without auctions has the
    /// derivatives day (SPECTRA has no call auctions); one with auctions (equities and FX)
    /// MOEX equities' opening auction 09:50–10:00, the main session to 18:40, the closing
    /// auction 18:40–18:50 (its price the official close), the pause to 19:05 and the evening
    /// session to 23:50; the trading day ends at 18:50, after the closing auction.
    pub fn moex(markets: &[(&str, bool)]) -> ScheduleConfig {
        let s = Session::open;
        ScheduleConfig {
            utc_offset_minutes: moscow(),
            business_days: weekdays(),
            holidays: Vec::new(),
            random_end_seed: 0,
            markets: markets
                .iter()
                .map(|&(m, auctions)| MarketSchedule {
                    market: m.into(),
                    sessions: if auctions {
                        vec![
                            Session::of(Phase::OpeningAuction, "09:50", "10:00"),
                            s("10:00", "18:40"),
                            Session::of(Phase::ClosingAuction, "18:40", "18:50"),
                            s("19:05", "23:50"),
                        ]
                    } else {
                        vec![
                            s("10:00", "14:00"),
                            s("14:05", "18:45"),
                            s("19:05", "23:50"),
                        ]
                    },
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

/// One of a market's daily transitions: its minute of the local day, what it does, and the
/// window (seconds) of its random delay, 0 for none.
#[derive(Clone, Copy, Debug)]
struct Step {
    minute: u64,
    transition: Transition,
    random_end_seconds: u32,
}

/// A checked schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    offset_min: i64,
    /// Business days as bits, Monday = bit 0.
    days: u8,
    /// Holidays as days since 1970-01-01, local.
    holidays: Vec<i64>,
    random_end_seed: u64,
    /// Per market: its name and its day's transitions, sorted by minute.
    markets: Vec<(String, Vec<Step>)>,
}

/// The delay of a random end in `[0, window_s)` whole seconds, in ns: a SplitMix64 of the
/// seed, the market's name, the day and the minute, so it is the same on every replay.
fn random_end_ns(seed: u64, market: &str, day: i64, minute: u64, window_s: u32) -> u64 {
    if window_s == 0 {
        return 0;
    }
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut h = mix(seed);
    for b in market.bytes() {
        h = mix(h ^ u64::from(b));
    }
    h = mix(h ^ day as u64);
    h = mix(h ^ minute);
    (h % u64::from(window_s)) * 1_000_000_000
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
            let times = m
                .sessions
                .iter()
                .map(|s| Ok((minute_of(&s.from, &what)?, minute_of(&s.to, &what)?)))
                .collect::<Result<Vec<_>, String>>()?;
            let mut steps = Vec::new();
            for (i, (s, &(from, to))) in m.sessions.iter().zip(&times).enumerate() {
                let next_from = times.get(i + 1).map(|t| t.0);
                // Sessions may touch (an auction and the session it opens or closes), never
                // overlap.
                if to <= from || next_from.is_some_and(|n| n < to) {
                    return Err(format!(
                        "{what}: sessions must be in order, each ending after it starts and \
                         no later than the next starts ({} - {})",
                        s.from, s.to
                    ));
                }
                if !matches!(
                    s.phase,
                    Phase::Open | Phase::OpeningAuction | Phase::ClosingAuction
                ) {
                    return Err(format!(
                        "{what}: session {} - {}: phase {:?} is not a session's (open, \
                         opening_auction, closing_auction)",
                        s.from, s.to, s.phase
                    ));
                }
                if s.random_end_seconds > 0 && !s.phase.is_auction() {
                    return Err(format!(
                        "{what}: session {} - {}: random_end_seconds is for auction sessions",
                        s.from, s.to
                    ));
                }
                let touches_previous = i > 0 && times[i - 1].1 == from;
                if touches_previous && m.sessions[i - 1].phase == s.phase {
                    return Err(format!(
                        "{what}: sessions {} and {} touch in the same phase: make them one",
                        m.sessions[i - 1].to,
                        s.from
                    ));
                }
                // A session that starts where the previous ended takes over at that step (which
                // carries the previous session's random end).
                if !touches_previous {
                    steps.push(Step {
                        minute: from,
                        transition: Transition::Phase(s.phase),
                        random_end_seconds: 0,
                    });
                }
                let after = match next_from {
                    Some(n) if n == to => m.sessions[i + 1].phase,
                    Some(_) => Phase::Paused,
                    None => Phase::Closed,
                };
                steps.push(Step {
                    minute: to,
                    transition: Transition::Phase(after),
                    random_end_seconds: s.random_end_seconds,
                });
            }
            steps.push(Step {
                minute: minute_of(&m.end_of_day, &what)?,
                transition: Transition::EndOfDay,
                random_end_seconds: 0,
            });
            // Stable: at one minute, the phase change comes before the end of day.
            steps.sort_by_key(|s| s.minute);
            // A random end must stay before the market's next step, so the order of the day
            // is the same whatever is drawn.
            for pair in steps.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                if a.random_end_seconds > 0
                    && a.minute * 60 + u64::from(a.random_end_seconds) > b.minute * 60
                {
                    return Err(format!(
                        "{what}: the random end of the session ending {:02}:{:02} (up to {} s) \
                         would reach the next step at {:02}:{:02}",
                        a.minute / 60,
                        a.minute % 60,
                        a.random_end_seconds,
                        b.minute / 60,
                        b.minute % 60
                    ));
                }
            }
            markets.push((m.market.clone(), steps));
        }
        Ok(Schedule {
            offset_min: i64::from(config.utc_offset_minutes),
            days,
            holidays,
            random_end_seed: config.random_end_seed,
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
                for step in steps {
                    let (minute, transition) = (step.minute, step.transition);
                    let delay = random_end_ns(
                        self.random_end_seed,
                        name,
                        day,
                        minute,
                        step.random_end_seconds,
                    );
                    let local_ns = day * (MIN_PER_DAY * NS_PER_MIN) as i64
                        + (minute * NS_PER_MIN) as i64
                        + delay as i64;
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
    fn equities_and_fx_open_and_close_with_call_auctions_and_futures_do_not() {
        let s = Schedule::new(&ScheduleConfig::moex(&[
            ("equities", true),
            ("futures", false),
        ]))
        .unwrap();
        let day = s.transitions(msk(2026, 11, 23, 0, 0), msk(2026, 11, 24, 0, 0));
        let of = |market: &str| -> Vec<(String, Transition)> {
            day.iter()
                .filter(|d| d.market == market)
                .map(|d| (d.local[11..].to_string(), d.transition))
                .collect()
        };
        let p = Transition::Phase;
        let want: Vec<(String, Transition)> = [
            ("09:50", p(Phase::OpeningAuction)),
            ("10:00", p(Phase::Open)),
            ("18:40", p(Phase::ClosingAuction)),
            ("18:50", p(Phase::Paused)),
            ("18:50", Transition::EndOfDay),
            ("19:05", p(Phase::Open)),
            ("23:50", p(Phase::Closed)),
        ]
        .iter()
        .map(|(t, x)| (t.to_string(), *x))
        .collect();
        assert_eq!(of("equities"), want);
        assert!(of("futures")
            .iter()
            .all(|(_, t)| !matches!(t, Transition::Phase(p) if p.is_auction())));
        assert_eq!(of("futures").len(), 7);
        // At 09:55 the equities market is in its opening auction, futures still closed.
        let force = s.in_force(msk(2026, 11, 23, 9, 55));
        assert_eq!(force[0].transition, p(Phase::OpeningAuction));
        assert_eq!(force[1].transition, p(Phase::Closed));
    }

    #[test]
    fn a_random_end_is_within_its_window_the_same_for_one_seed_and_moves_the_next_session() {
        let with_seed = |seed: u64| {
            let mut c = ScheduleConfig::moex(&[("equities", true)]);
            c.random_end_seed = seed;
            c.markets[0].sessions[0].random_end_seconds = 30;
            Schedule::new(&c).unwrap()
        };
        let opens = |s: &Schedule| -> Vec<u64> {
            s.transitions(msk(2026, 11, 23, 0, 0), msk(2026, 11, 28, 0, 0))
                .into_iter()
                .filter(|d| d.local.ends_with("10:00"))
                .map(|d| d.at_ns)
                .collect()
        };
        let (a, b) = (opens(&with_seed(7)), opens(&with_seed(7)));
        assert_eq!(a, b, "one seed, one day");
        assert_eq!(a.len(), 5);
        let mut delays = Vec::new();
        for (i, at) in a.iter().enumerate() {
            let nominal = msk(2026, 11, 23 + i as i64, 10, 0);
            let delay = at - nominal;
            assert!(
                delay < 30 * 1_000_000_000 && delay.is_multiple_of(1_000_000_000),
                "{delay}"
            );
            delays.push(delay);
        }
        assert!(delays.iter().any(|d| *d != delays[0]), "{delays:?}");
        assert_ne!(opens(&with_seed(8)), a, "another seed, other ends");
        // The request id keeps the nominal minute, so a restarted driver finds it.
        let due = with_seed(7).transitions(msk(2026, 11, 23, 9, 59), msk(2026, 11, 23, 10, 1));
        assert_eq!(due[0].local, "2026-11-23 10:00");
    }

    #[test]
    fn auction_sessions_are_refused_where_they_cannot_be() {
        let mut c = ScheduleConfig::moex(&[("equities", true)]);
        c.markets[0].sessions[0].random_end_seconds = 9 * 3600;
        let e = Schedule::new(&c).unwrap_err();
        assert!(e.contains("ending 10:00") && e.contains("18:40"), "{e}");
        let mut c = ScheduleConfig::moex(&[("equities", true)]);
        c.markets[0].sessions[1].random_end_seconds = 5;
        assert!(Schedule::new(&c).unwrap_err().contains("auction sessions"));
        let mut c = ScheduleConfig::moex(&[("equities", true)]);
        c.markets[0].sessions[2].phase = Phase::Halted;
        assert!(Schedule::new(&c).unwrap_err().contains("not a session's"));
        let mut c = ScheduleConfig::moex(&[("equities", true)]);
        c.markets[0].sessions[0].phase = Phase::Open;
        assert!(Schedule::new(&c).unwrap_err().contains("make them one"));
        // The closing auction's random end may not pass the end of day at 18:50.
        let mut c = ScheduleConfig::moex(&[("equities", true)]);
        c.markets[0].sessions[2].random_end_seconds = 10;
        assert!(Schedule::new(&c).unwrap_err().contains("18:50"));
        let text = r#"
[schedule]
random_end_seed = 3
[[schedule.markets]]
market = "equities"
sessions = [
  { from = "09:50", to = "10:00", phase = "opening_auction", random_end_seconds = 30 },
  { from = "10:00", to = "18:40" },
  { from = "18:40", to = "18:50", phase = "closing_auction" },
]
end_of_day = "18:55"
"#;
        let c = ScheduleConfig::from_venue_toml(text, &["equities"]).unwrap();
        assert_eq!(c.markets[0].sessions[0].phase, Phase::OpeningAuction);
        let e = ScheduleConfig::from_venue_toml(
            &text.replace("\"closing_auction\"", "\"closing_auktion\""),
            &["equities"],
        )
        .unwrap_err();
        assert!(e.contains("closing_auktion"), "{e}");
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
