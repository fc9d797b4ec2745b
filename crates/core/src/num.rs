//! Fixed-point numbers. No floating point is used anywhere in matching, risk or clearing:
//! rounding must be the same on every replica and every replay, and it must be explicit.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Cash is counted in units of `10^-CASH_SCALE` of the settlement currency (1/10,000).
pub const CASH_SCALE: u8 = 4;

/// The largest price an order may carry, in raw units. Chosen so that
/// `PRICE_MAX * QTY_MAX * lot * multiplier` cannot overflow an i128 intermediate and so that
/// any notional that passes the checks below fits a [`Cash`] comfortably.
pub const PRICE_MAX: i64 = 1_000_000_000_000_000; // 10^15
/// The largest quantity (in lots) a single order may carry.
pub const QTY_MAX: i64 = 1_000_000_000_000; // 10^12
/// The largest absolute position an account may hold in one instrument, in lots. Orders that
/// could take a position past it are rejected before they rest, so positions never overflow.
pub const POSITION_MAX: i64 = 1_000_000_000_000_000; // 10^15
/// The largest cash amount a single deposit, withdrawal or order notional may move.
pub const CASH_AMOUNT_MAX: i128 = 1_000_000_000_000_000_000_000; // 10^21 units = 10^17 currency

/// A price in raw fixed-point units of `10^-price_scale` (the scale belongs to the instrument).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Price(pub i64);

/// A quantity in lots.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Qty(pub i64);

/// An amount of money in units of `10^-CASH_SCALE`. i128 so that balances that accumulate
/// the proceeds of many trades can never overflow; single movements are bounded by
/// [`CASH_AMOUNT_MAX`].
///
/// In JSON it is a plain integer while it fits 64 bits and a decimal string of the raw units
/// beyond (serde's tagged enums cannot carry 128-bit integers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cash(pub i128);

impl Serialize for Cash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match i64::try_from(self.0) {
            Ok(v) => s.serialize_i64(v),
            Err(_) => s.serialize_str(&self.0.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Cash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cash, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Cash;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer amount of cash units, or such an integer as a string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Cash, E> {
                Ok(Cash(v as i128))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Cash, E> {
                Ok(Cash(v as i128))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Cash, E> {
                v.trim()
                    .parse::<i128>()
                    .map(Cash)
                    .map_err(|_| E::custom(format!("'{v}' is not an integer amount")))
            }
        }
        d.deserialize_any(V)
    }
}

impl Price {
    pub const ZERO: Price = Price(0);
    pub fn raw(self) -> i64 {
        self.0
    }
}

impl Qty {
    pub const ZERO: Qty = Qty(0);
    pub fn raw(self) -> i64 {
        self.0
    }
    pub fn is_positive(self) -> bool {
        self.0 > 0
    }
}

impl Cash {
    pub const ZERO: Cash = Cash(0);
}

impl fmt::Display for Price {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Display for Qty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Display for Cash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", format_scaled(self.0, CASH_SCALE))
    }
}

/// Formats a raw fixed-point integer with `scale` decimals, for people (reports, CLI).
pub fn format_scaled(raw: i128, scale: u8) -> String {
    if scale == 0 {
        return raw.to_string();
    }
    let divisor = 10i128.pow(scale as u32);
    let sign = if raw < 0 { "-" } else { "" };
    let abs = raw.unsigned_abs();
    let whole = abs / divisor as u128;
    let frac = abs % divisor as u128;
    format!("{sign}{whole}.{frac:0width$}", width = scale as usize)
}

/// Parses a decimal string ("101.25") into raw units with `scale` decimals. Rejects more
/// decimals than the scale allows rather than rounding silently.
pub fn parse_scaled(text: &str, scale: u8) -> Result<i64, String> {
    let text = text.trim();
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = match body.split_once('.') {
        Some((w, f)) => (w, f),
        None => (body, ""),
    };
    if whole.is_empty() && frac.is_empty() {
        return Err(format!("'{text}' is not a number"));
    }
    if !whole.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("'{text}' is not a decimal number"));
    }
    if frac.len() > scale as usize {
        return Err(format!("'{text}' has more than {scale} decimals"));
    }
    let mut digits = String::with_capacity(whole.len() + scale as usize);
    digits.push_str(if whole.is_empty() { "0" } else { whole });
    digits.push_str(frac);
    for _ in frac.len()..scale as usize {
        digits.push('0');
    }
    let value: i64 = digits
        .parse()
        .map_err(|_| format!("'{text}' is out of range"))?;
    Ok(if negative { -value } else { value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cash_reads_and_writes_as_json_integers_or_strings() {
        assert_eq!(serde_json::to_string(&Cash(42)).unwrap(), "42");
        let big = Cash(i64::MAX as i128 * 4);
        let text = serde_json::to_string(&big).unwrap();
        assert_eq!(serde_json::from_str::<Cash>(&text).unwrap(), big);
        assert_eq!(serde_json::from_str::<Cash>("-7").unwrap(), Cash(-7));
        assert!(serde_json::from_str::<Cash>("1.5").is_err());
    }

    #[test]
    fn scaled_numbers_round_trip_through_text() {
        assert_eq!(format_scaled(12345, 2), "123.45");
        assert_eq!(format_scaled(-5, 2), "-0.05");
        assert_eq!(format_scaled(7, 0), "7");
        assert_eq!(parse_scaled("123.45", 2), Ok(12345));
        assert_eq!(parse_scaled("123.4", 2), Ok(12340));
        assert_eq!(parse_scaled("-0.05", 2), Ok(-5));
        assert!(parse_scaled("1.234", 2).is_err());
        assert!(parse_scaled("abc", 2).is_err());
        assert!(parse_scaled("99999999999999999999", 0).is_err());
    }
}
