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

#[cfg(test)]
mod tests {
    use super::*;

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
