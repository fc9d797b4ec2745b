//! Trading fees: a [`FeeSchedule`] (the clearing config's `[fees]`) charges each side of a
//! trade a rate of its value and an amount per lot, the maker (the resting side) and the
//! taker (the aggressor, which the stream's `Trade` names) apart. The state keeps, per
//! account and instrument, what was traded since the last run ([`FeeBase`]); a run turns it
//! into [`FeeLine`]s (the fee rounded down to cash once, on the whole base), debits each
//! account and credits the venue's account on the same core, so cash is conserved exactly.
//! Settling a run subtracts the base it charged, so a run charges each trade once, and
//! settling commutes with later trades. Integers only: rates in parts per million, amounts
//! per lot as decimal text in cash units.

use bourse_core::{parse_scaled, AccountId, Cash, Instrument, InstrumentId, Market, CASH_SCALE};
use serde::{Deserialize, Serialize};

use crate::state::value_to_cash_floor;

/// Rates are parts of this (1 basis point = 100).
pub const PPM: i128 = 1_000_000;

/// One rate: for an instrument, or a market, or (neither) every trade.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeeRate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instrument: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub market: Option<Market>,
    /// Of the trade's value, in parts per million, the passive side.
    #[serde(default)]
    pub maker_ppm: i64,
    /// Of the trade's value, in parts per million, the aggressive side.
    #[serde(default)]
    pub taker_ppm: i64,
    /// Per lot, in cash (decimal text, at most `CASH_SCALE` decimals), the passive side.
    #[serde(default = "zero")]
    pub maker_per_lot: String,
    /// Per lot, in cash, the aggressive side.
    #[serde(default = "zero")]
    pub taker_per_lot: String,
}

fn zero() -> String {
    "0".into()
}

impl Default for FeeRate {
    fn default() -> FeeRate {
        FeeRate {
            instrument: None,
            market: None,
            maker_ppm: 0,
            taker_ppm: 0,
            maker_per_lot: zero(),
            taker_per_lot: zero(),
        }
    }
}

/// `[fees]`: the rates, and the venue's account that receives them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeeSchedule {
    /// The venue's account, credited on each core with the fees charged there (it must be
    /// added on every core, as any account).
    pub venue_account: u32,
    /// The rate of a trade is the first whose instrument is the trade's, else the first
    /// whose market is the trade's, else the first with neither; none: no fee.
    pub rates: Vec<FeeRate>,
}

/// The most rates a schedule may list.
pub const FEE_RATES_MAX: usize = 4_096;

impl FeeSchedule {
    /// Refuses rates that are negative, amounts that are not cash, and too many rates.
    pub fn check(&self) -> Result<(), String> {
        if self.rates.len() > FEE_RATES_MAX {
            return Err(format!("fees: at most {FEE_RATES_MAX} rates"));
        }
        for (i, r) in self.rates.iter().enumerate() {
            if r.maker_ppm < 0
                || r.taker_ppm < 0
                || r.maker_ppm > 1_000_000
                || r.taker_ppm > 1_000_000
            {
                return Err(format!(
                    "fees.rates[{i}]: maker_ppm and taker_ppm must be in 0..=1000000"
                ));
            }
            for (name, text) in [
                ("maker_per_lot", &r.maker_per_lot),
                ("taker_per_lot", &r.taker_per_lot),
            ] {
                match parse_scaled(text, CASH_SCALE) {
                    Ok(v) if v >= 0 => {}
                    Ok(_) => return Err(format!("fees.rates[{i}].{name}: {text:?} is negative")),
                    Err(e) => return Err(format!("fees.rates[{i}].{name}: {text:?}: {e}")),
                }
            }
            if r.instrument.is_some() && r.market.is_some() {
                return Err(format!(
                    "fees.rates[{i}]: an instrument or a market, not both"
                ));
            }
        }
        Ok(())
    }

    /// The rate of `def`'s trades.
    pub fn rate_of(&self, def: &Instrument) -> Option<&FeeRate> {
        let r = &self.rates;
        r.iter()
            .find(|r| r.instrument == Some(def.instrument.0))
            .or_else(|| {
                r.iter()
                    .find(|r| r.instrument.is_none() && r.market == Some(def.market))
            })
            .or_else(|| {
                r.iter()
                    .find(|r| r.instrument.is_none() && r.market.is_none())
            })
    }
}

/// What one account traded in one instrument since the fees were last charged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeeBase {
    /// Value traded as maker and as taker, in the instrument's value units (positive).
    pub maker_value: i128,
    pub taker_value: i128,
    pub maker_lots: i64,
    pub taker_lots: i64,
}

impl FeeBase {
    pub fn is_empty(&self) -> bool {
        *self == FeeBase::default()
    }

    /// The fee on this base at `rate`, in cash, rounded down once.
    pub fn fee(&self, def: &Instrument, rate: &FeeRate) -> i128 {
        let per_lot = |t: &str| i128::from(parse_scaled(t, CASH_SCALE).unwrap_or(0));
        let on_value = self.maker_value * i128::from(rate.maker_ppm)
            + self.taker_value * i128::from(rate.taker_ppm);
        // floor(floor(x / a) / b) = floor(x / ab): rounded down once, to cash.
        value_to_cash_floor(def, on_value.div_euclid(PPM))
            + i128::from(self.maker_lots) * per_lot(&rate.maker_per_lot)
            + i128::from(self.taker_lots) * per_lot(&rate.taker_per_lot)
    }
}

/// The fee one run charges one account in one instrument, and the base it charged it on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeeLine {
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub core: usize,
    pub base: FeeBase,
    /// Charged to the account (and credited to the venue's): positive.
    pub fee: Cash,
}
