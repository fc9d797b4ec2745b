//! Settlement dates of equity and FX obligations on the venue's business calendar.
//!
//! A run's obligations (what each account delivers or receives per instrument since the run
//! before) settle a number of business days after the run's trade date: T+0 or T+1 per
//! market by default, overridden per instrument (`[settlement_cycle]`). The calendar is the
//! venue's own (`bourse_admin::schedule::Schedule`: local dates, business weekdays,
//! holidays), read from the `[schedule]` file clearing runs on; without one, Monday to Friday
//! in UTC with no holidays. A run's trade date is the business day (on or after the local
//! date) of the time the schedule asked the run for, or, for a run asked by hand, of the
//! newest event before its cut. The dates are fixed in the plan when it is computed, so a
//! restarted or replayed run settles on the dates it was first given. An end-of-day run also
//! gets the next business day, which settling it rolls the clearing state to.

use std::collections::BTreeMap;

use bourse_admin::schedule::{date_text, Schedule, ScheduleConfig};
use bourse_core::{Instrument, Market};
use serde::{Deserialize, Serialize};

use crate::run::{RunKind, RunPlan};
use crate::state::ClearingState;

/// The longest settlement cycle accepted, in business days.
pub const SETTLEMENT_DAYS_MAX: u32 = 10;

/// `[settlement_cycle]` of a clearing node's config: business days from trade date to
/// settlement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettlementCycle {
    /// Equities: T+1 unless set.
    #[serde(default = "one")]
    pub equity_days: u32,
    /// FX: T+0 unless set (the TOM/TOD distinction is one instrument per tenor, each given
    /// its days below).
    #[serde(default)]
    pub fx_days: u32,
    /// Per instrument symbol, its own cycle.
    #[serde(default)]
    pub instruments: BTreeMap<String, u32>,
}

fn one() -> u32 {
    1
}

impl Default for SettlementCycle {
    fn default() -> SettlementCycle {
        SettlementCycle {
            equity_days: 1,
            fx_days: 0,
            instruments: BTreeMap::new(),
        }
    }
}

impl SettlementCycle {
    /// Checks every cycle against [`SETTLEMENT_DAYS_MAX`] and every symbol against the
    /// instruments clearing knows (a misspelled symbol would otherwise settle on the market's
    /// default without a word); errors name the field.
    pub fn check(&self, definitions: &[Instrument]) -> Result<(), String> {
        let too_long = |what: &str, days: u32| {
            (days > SETTLEMENT_DAYS_MAX).then(|| {
                format!("settlement_cycle.{what}: {days} days, more than {SETTLEMENT_DAYS_MAX}")
            })
        };
        if let Some(e) = too_long("equity_days", self.equity_days) {
            return Err(e);
        }
        if let Some(e) = too_long("fx_days", self.fx_days) {
            return Err(e);
        }
        for (symbol, &days) in &self.instruments {
            if let Some(e) = too_long(&format!("instruments.{symbol}"), days) {
                return Err(e);
            }
            match definitions.iter().find(|d| &d.symbol == symbol) {
                None => {
                    return Err(format!(
                        "settlement_cycle.instruments: no instrument {symbol:?} in the instruments file"
                    ))
                }
                Some(d) if d.market == Market::Futures => {
                    return Err(format!(
                        "settlement_cycle.instruments: {symbol:?} is a future, which settles by \
                         variation margin, not on a date"
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The business days from trade date to settlement of `def`'s obligations.
    pub fn days_of(&self, def: &Instrument) -> u32 {
        if let Some(&days) = self.instruments.get(&def.symbol) {
            return days;
        }
        match def.market {
            Market::Fx => self.fx_days,
            _ => self.equity_days,
        }
    }
}

/// The calendar used without a `[schedule]`: Monday to Friday, UTC, no holidays.
pub fn default_calendar() -> Schedule {
    let config = ScheduleConfig {
        utc_offset_minutes: 0,
        business_days: ["mon", "tue", "wed", "thu", "fri"]
            .map(String::from)
            .to_vec(),
        holidays: Vec::new(),
        random_end_seed: 0,
        markets: Vec::new(),
    };
    Schedule::new(&config).expect("the default calendar is valid")
}

/// Gives `plan` its trade date and each of its obligations its settlement date (see the
/// module documentation); `state` knows the instruments' definitions.
pub fn date_obligations(
    plan: &mut RunPlan,
    calendar: &Schedule,
    cycle: &SettlementCycle,
    state: &ClearingState,
) {
    let at_ns = plan.scheduled_ns.unwrap_or(plan.cut_ts_ns);
    let trade_day = calendar.business_day_on_or_after(calendar.local_day(at_ns));
    plan.trade_date = Some(date_text(trade_day));
    if plan.kind == RunKind::EndOfDay {
        plan.next_business_date = Some(date_text(calendar.add_business_days(trade_day, 1)));
    }
    for o in &mut plan.obligations {
        let days = state
            .definition(o.instrument)
            .map_or(0, |d| cycle.days_of(d));
        o.settlement_date = Some(date_text(calendar.add_business_days(trade_day, days)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{compute_run, ObligationLine, SettlementRule};
    use bourse_core::{AccountId, Cash, InstrumentId};
    use bourse_engine::fixtures::{equity, future, fx};

    /// Moscow's calendar, Monday to Friday, with Monday 2026-11-30 a holiday.
    fn calendar() -> Schedule {
        let config = ScheduleConfig {
            utc_offset_minutes: 180,
            business_days: ["mon", "tue", "wed", "thu", "fri"]
                .map(String::from)
                .to_vec(),
            holidays: vec!["2026-11-30".into()],
            random_end_seed: 0,
            markets: Vec::new(),
        };
        Schedule::new(&config).unwrap()
    }

    /// Unix ns of Moscow (UTC+3) local time, `day` days after Monday 2026-11-23.
    fn msk(day: u64, hh: u64, mm: u64) -> u64 {
        ((20_780 + day) * 1_440 + hh * 60 + mm - 180) * 60_000_000_000
    }

    /// A plan with one obligation in each of `instruments`, at `at_ns`.
    fn plan_at(at_ns: u64, scheduled: bool, instruments: &[u32]) -> RunPlan {
        let state = ClearingState::new(1, []);
        let mut plan = compute_run(&state, 1, RunKind::EndOfDay, &SettlementRule::default());
        plan.cut_ts_ns = at_ns;
        if scheduled {
            plan.scheduled_ns = Some(at_ns);
        }
        plan.obligations = instruments
            .iter()
            .map(|&i| ObligationLine {
                account: AccountId(1),
                instrument: InstrumentId(i),
                securities: 10,
                cash: Cash(-1_000),
                settlement_date: None,
            })
            .collect();
        plan
    }

    fn dated(plan: &RunPlan) -> Vec<(u32, &str)> {
        plan.obligations
            .iter()
            .map(|o| (o.instrument.0, o.settlement_date.as_deref().unwrap()))
            .collect()
    }

    #[test]
    fn obligations_settle_t0_or_t1_on_business_days_skipping_weekends_and_holidays() {
        let defs = [
            equity(1, "SBER", 100),
            fx(2, "USDRUB_TOD", 100),
            fx(3, "USDRUB_TOM", 100),
        ];
        let mut cycle = SettlementCycle::default();
        cycle.instruments.insert("USDRUB_TOM".into(), 1);
        cycle.check(&defs).unwrap();
        let state = ClearingState::new(1, defs.clone());

        // Wednesday: equities and TOM the next day, TOD the same day.
        let mut p = plan_at(msk(2, 18, 50), true, &[1, 2, 3]);
        date_obligations(&mut p, &calendar(), &cycle, &state);
        assert_eq!(p.trade_date.as_deref(), Some("2026-11-25"));
        assert_eq!(
            dated(&p),
            vec![(1, "2026-11-26"), (2, "2026-11-25"), (3, "2026-11-26")]
        );

        // Friday: T+1 skips the weekend and the holiday Monday.
        let mut p = plan_at(msk(4, 14, 0), true, &[1, 2]);
        date_obligations(&mut p, &calendar(), &cycle, &state);
        assert_eq!(dated(&p), vec![(1, "2026-12-01"), (2, "2026-11-27")]);

        // A run asked by hand on Saturday, after Friday's last trade at 23:40 Moscow time
        // (20:40 UTC, still Friday in UTC as in Moscow): its trade date is Friday's.
        let mut p = plan_at(msk(4, 23, 40), false, &[1]);
        date_obligations(&mut p, &calendar(), &cycle, &state);
        assert_eq!(p.trade_date.as_deref(), Some("2026-11-27"));

        // Scheduled on a Sunday (local) it trades on the next business day, Tuesday (Monday
        // is the holiday), and T+0 settles then.
        let mut p = plan_at(msk(6, 1, 0), true, &[2]);
        date_obligations(&mut p, &calendar(), &cycle, &state);
        assert_eq!(p.trade_date.as_deref(), Some("2026-12-01"));
        assert_eq!(dated(&p), vec![(2, "2026-12-01")]);

        // The local date counts, not UTC's: 01:00 Moscow on Thursday is Wednesday 22:00 UTC.
        let mut p = plan_at(msk(3, 1, 0), true, &[2]);
        date_obligations(&mut p, &calendar(), &cycle, &state);
        assert_eq!(p.trade_date.as_deref(), Some("2026-11-26"));
    }

    #[test]
    fn an_end_of_day_rolls_to_the_next_business_day_and_an_intermediate_run_to_none() {
        let state = ClearingState::new(1, []);
        let cycle = SettlementCycle::default();
        // Wednesday's end of day rolls to Thursday.
        let mut p = plan_at(msk(2, 18, 50), true, &[]);
        date_obligations(&mut p, &calendar(), &cycle, &state);
        assert_eq!(p.next_business_date.as_deref(), Some("2026-11-26"));
        // Friday's skips the weekend and the holiday Monday.
        let mut p = plan_at(msk(4, 18, 50), true, &[]);
        date_obligations(&mut p, &calendar(), &cycle, &state);
        assert_eq!(p.next_business_date.as_deref(), Some("2026-12-01"));
        // An intermediate run rolls nothing.
        let mut p = plan_at(msk(4, 14, 0), true, &[]);
        p.kind = RunKind::Intermediate;
        date_obligations(&mut p, &calendar(), &cycle, &state);
        assert_eq!(p.next_business_date, None);
    }

    #[test]
    fn a_cycle_names_what_is_wrong_with_it() {
        let defs = [equity(1, "SBER", 100), future(4, "FUT", 100)];
        let too_long: SettlementCycle = toml::from_str("equity_days = 11").unwrap();
        assert!(too_long.check(&defs).unwrap_err().contains("equity_days"));
        let unknown: SettlementCycle = toml::from_str("[instruments]\nGAZP = 1").unwrap();
        assert!(unknown.check(&defs).unwrap_err().contains("\"GAZP\""));
        let future: SettlementCycle = toml::from_str("[instruments]\nFUT = 1").unwrap();
        assert!(future.check(&defs).unwrap_err().contains("future"));
        assert!(toml::from_str::<SettlementCycle>("equity_day = 1").is_err());
        let c: SettlementCycle = toml::from_str("").unwrap();
        assert_eq!((c.equity_days, c.fx_days), (1, 0));
    }
}
