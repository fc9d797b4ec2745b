//! Decimal text (FIX prices and quantities) to fixed point and back. No floating point: a
//! price with more decimals than the instrument's scale is refused, not rounded.

use bourse_core::PRICE_MAX;

/// Longest decimal text accepted for a number, in bytes.
pub const DECIMAL_TEXT_BYTES_MAX: usize = 32;

/// Parses `text` ("101.25", "-3", "7.50") as a fixed-point mantissa with `scale` decimals.
/// None if it is not a decimal, has more significant decimals than `scale`, or is too large.
pub fn parse_decimal(text: &[u8], scale: u8) -> Option<i64> {
    if text.is_empty() || text.len() > DECIMAL_TEXT_BYTES_MAX {
        return None;
    }
    let (negative, digits) = match text[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (int_part, frac_part) = match digits.iter().position(|&b| b == b'.') {
        Some(p) => (&digits[..p], &digits[p + 1..]),
        None => (digits, &[][..]),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part.iter().chain(frac_part).all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: i128 = 0;
    for &d in int_part {
        value = value * 10 + i128::from(d - b'0');
        if value > i128::from(PRICE_MAX) * 10 {
            return None;
        }
    }
    let scale = usize::from(scale);
    for i in 0..scale {
        let d = frac_part.get(i).map_or(0, |&d| i128::from(d - b'0'));
        value = value * 10 + d;
    }
    // Decimals beyond the scale must be zeros.
    if frac_part.iter().skip(scale).any(|&d| d != b'0') {
        return None;
    }
    if negative {
        value = -value;
    }
    i64::try_from(value).ok()
}

/// Formats a fixed-point mantissa with `scale` decimals ("101.25"; "7" when scale is 0).
pub fn format_decimal(mantissa: i128, scale: u8) -> String {
    Decimal(mantissa, scale).to_string()
}

/// A fixed-point mantissa and its scale, displayed as [`format_decimal`] formats it, so that
/// a message field can be written in place without an intermediate `String`.
#[derive(Clone, Copy, Debug)]
pub struct Decimal(pub i128, pub u8);

impl Decimal {
    /// Appends the text to `out` as [`std::fmt::Display`] writes it, digits by hand: this
    /// runs for every price of every execution report.
    pub fn write_to(self, out: &mut Vec<u8>) {
        let Decimal(mantissa, scale) = self;
        if scale == 0 {
            bourse_fix::codec::write_i128(out, mantissa);
            return;
        }
        let abs = mantissa.unsigned_abs();
        let (Ok(abs), Some(div)) = (u64::try_from(abs), 10u64.checked_pow(u32::from(scale))) else {
            use std::io::Write as _;
            // Writing into a Vec cannot fail.
            let _ = write!(out, "{self}");
            return;
        };
        if mantissa < 0 {
            out.push(b'-');
        }
        bourse_fix::codec::write_u64(out, abs / div);
        out.push(b'.');
        let mut frac = abs % div;
        let mut digits = [b'0'; 20];
        let width = usize::from(scale);
        for d in digits[..width].iter_mut().rev() {
            *d = b'0' + (frac % 10) as u8;
            frac /= 10;
        }
        out.extend_from_slice(&digits[..width]);
    }
}

impl std::fmt::Display for Decimal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Decimal(mantissa, scale) = *self;
        if scale == 0 {
            return write!(f, "{mantissa}");
        }
        let div = 10u128.pow(u32::from(scale));
        let sign = if mantissa < 0 { "-" } else { "" };
        let abs = mantissa.unsigned_abs();
        write!(
            f,
            "{sign}{}.{:0width$}",
            abs / div,
            abs % div,
            width = usize::from(scale)
        )
    }
}

/// Decimals of every AvgPx the gateway sends (more only for an instrument whose prices have
/// more): one format whatever the instrument, so a client parses all reports alike.
pub const AVG_PX_DECIMALS: u8 = 6;

/// The average price of `cum_lots` lots that cost `notional` (price mantissas at `scale`
/// times lots), rounded half away from zero to [`AVG_PX_DECIMALS`] decimals; 0 without lots.
pub fn avg_px(notional: i128, cum_lots: i64, scale: u8) -> Decimal {
    let decimals = AVG_PX_DECIMALS.max(scale);
    if cum_lots == 0 {
        return Decimal(0, decimals);
    }
    let num = notional * 10i128.pow(u32::from(decimals - scale));
    let den = i128::from(cum_lots);
    // Half away from zero: add half the divisor in the direction of the sign. In 64 bits
    // when everything fits (a 128-bit division is a call), else in 128.
    let (n, d) = (num.unsigned_abs(), den.unsigned_abs());
    let q = match (u64::try_from(2 * n + d), u64::try_from(2 * d)) {
        (Ok(top), Ok(bottom)) => i128::from(top / bottom),
        _ => ((2 * n + d) / (2 * d)) as i128,
    };
    let negative = (num < 0) != (den < 0);
    Decimal(if negative { -q } else { q }, decimals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avg_px_is_rounded_to_six_decimals_for_every_instrument() {
        // 250.1666666...: rounded up, not truncated.
        assert_eq!(avg_px(75_050, 3, 2).to_string(), "250.166667");
        assert_eq!(avg_px(75_049, 3, 2).to_string(), "250.163333");
        assert_eq!(avg_px(500, 2, 0).to_string(), "250.000000");
        assert_eq!(avg_px(1, 3, 5).to_string(), "0.000003");
        assert_eq!(avg_px(-75_050, 3, 2).to_string(), "-250.166667");
        assert_eq!(avg_px(0, 0, 2).to_string(), "0.000000");
        // Half a millionth rounds away from zero.
        assert_eq!(avg_px(1, 2, 6).to_string(), "0.000001");
        assert_eq!(avg_px(1, 2, 7).to_string(), "0.0000001");
    }

    #[test]
    fn decimals_become_mantissas_at_the_instrument_scale() {
        assert_eq!(parse_decimal(b"101.25", 2), Some(10125));
        assert_eq!(parse_decimal(b"101", 2), Some(10100));
        assert_eq!(parse_decimal(b"101.5", 2), Some(10150));
        assert_eq!(parse_decimal(b"101.250", 2), Some(10125));
        assert_eq!(parse_decimal(b".5", 1), Some(5));
        assert_eq!(parse_decimal(b"-3", 0), Some(-3));
    }

    #[test]
    fn text_that_is_not_an_exact_decimal_is_refused() {
        assert_eq!(parse_decimal(b"101.255", 2), None);
        assert_eq!(parse_decimal(b"1e5", 2), None);
        assert_eq!(parse_decimal(b"", 2), None);
        assert_eq!(parse_decimal(b".", 2), None);
        assert_eq!(parse_decimal(b"99999999999999999999999", 2), None);
        assert_eq!(parse_decimal(b"1.2.3", 2), None);
    }

    #[test]
    fn mantissas_format_with_their_scale() {
        assert_eq!(format_decimal(10125, 2), "101.25");
        assert_eq!(format_decimal(5, 2), "0.05");
        assert_eq!(format_decimal(-5, 2), "-0.05");
        assert_eq!(format_decimal(42, 0), "42");
    }
}
