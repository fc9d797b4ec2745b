//! UTC timestamps in FIX text form (`YYYYMMDD-HH:MM:SS[.sss]`), converted to
//! and from milliseconds since the Unix epoch.
//!
//! The session layer never reads a clock: callers pass `now_ms` in, so these
//! helpers are pure functions of their arguments.

/// Milliseconds since 1970-01-01T00:00:00Z.
pub type UnixMs = i64;

/// The wall clock, for drivers (never called by the session itself).
pub fn system_now_ms() -> UnixMs {
    let elapsed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
}

/// Days since 1970-01-01 for a proleptic Gregorian date (Howard Hinnant's
/// algorithm, which is exact over the whole i64 range we use).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Formats `unix_ms` as `YYYYMMDD-HH:MM:SS.sss`.
pub fn format_utc_timestamp_ms(unix_ms: UnixMs) -> String {
    UtcTimestamp(unix_ms).to_string()
}

/// A time (Unix milliseconds) displayed as a FIX UTCTimestamp, `YYYYMMDD-HH:MM:SS.sss`, so
/// that a message field can be written in place without an intermediate `String`.
#[derive(Clone, Copy, Debug)]
pub struct UtcTimestamp(pub UnixMs);

/// Writes `v` (below 100) as two digits at `b[at..at + 2]`.
#[inline]
fn put2(b: &mut [u8; 21], at: usize, v: u32) {
    b[at] = b'0' + (v / 10) as u8;
    b[at + 1] = b'0' + (v % 10) as u8;
}

thread_local! {
    /// The last day this thread wrote, and its `YYYYMMDD` digits. Reports carry the current
    /// time, so nearly every timestamp falls on the day before it; the calendar conversion
    /// (`civil_from_days`, about two hundred instructions) then runs once a day per thread
    /// instead of twice per report. `i64::MIN` is no day a timestamp can fall on.
    static LAST_DATE: std::cell::Cell<(i64, [u8; 8])> =
        const { std::cell::Cell::new((i64::MIN, [0; 8])) };
}

/// The `YYYYMMDD` digits of `days` since the epoch, for years 0 to 9999 (`None` otherwise).
#[inline]
fn date_digits(days: i64) -> Option<[u8; 8]> {
    let (cached_day, cached_digits) = LAST_DATE.get();
    if cached_day == days {
        return Some(cached_digits);
    }
    let digits = date_digits_uncached(days)?;
    LAST_DATE.set((days, digits));
    Some(digits)
}

/// [`date_digits`] without the cache: the calendar conversion itself.
fn date_digits_uncached(days: i64) -> Option<[u8; 8]> {
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return None;
    }
    let mut b = [0u8; 21];
    let y = y as u32;
    put2(&mut b, 0, y / 100);
    put2(&mut b, 2, y % 100);
    put2(&mut b, 4, m);
    put2(&mut b, 6, d);
    let mut digits = [0u8; 8];
    digits.copy_from_slice(&b[..8]);
    Some(digits)
}

impl UtcTimestamp {
    /// The text as 21 bytes, for years 0 to 9999 (the only ones FIX can carry in four digits).
    pub(crate) fn fixed_width(self) -> Option<[u8; 21]> {
        let unix_ms = self.0;
        let days = unix_ms.div_euclid(86_400_000);
        let ms_of_day = unix_ms.rem_euclid(86_400_000);
        let mut b = *b"00000000-00:00:00.000";
        b[..8].copy_from_slice(&date_digits(days)?);
        let hh = ms_of_day / 3_600_000;
        let mm = (ms_of_day / 60_000) % 60;
        let ss = (ms_of_day / 1000) % 60;
        let ms = ms_of_day % 1000;
        // Digits by hand into a fixed buffer, two at a time with constant divisors (which the
        // compiler turns into multiplications): this runs twice per execution report.
        put2(&mut b, 9, hh as u32);
        put2(&mut b, 12, mm as u32);
        put2(&mut b, 15, ss as u32);
        let ms = ms as u32;
        b[18] = b'0' + (ms / 100) as u8;
        put2(&mut b, 19, ms % 100);
        Some(b)
    }

    /// Appends the text to `out`, as [`std::fmt::Display`] writes it, without the
    /// formatting machinery.
    pub fn write_to(self, out: &mut Vec<u8>) {
        match self.fixed_width() {
            Some(b) => out.extend_from_slice(&b),
            None => {
                use std::io::Write as _;
                // Writing into a Vec cannot fail.
                let _ = write!(out, "{self}");
            }
        }
    }
}

impl std::fmt::Display for UtcTimestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(b) = self.fixed_width() {
            return f.write_str(std::str::from_utf8(&b).map_err(|_| std::fmt::Error)?);
        }
        let unix_ms = self.0;
        let days = unix_ms.div_euclid(86_400_000);
        let ms_of_day = unix_ms.rem_euclid(86_400_000);
        let (y, m, d) = civil_from_days(days);
        let hh = ms_of_day / 3_600_000;
        let mm = (ms_of_day / 60_000) % 60;
        let ss = (ms_of_day / 1000) % 60;
        let ms = ms_of_day % 1000;
        write!(f, "{y:04}{m:02}{d:02}-{hh:02}:{mm:02}:{ss:02}.{ms:03}")
    }
}

/// The value of a run of at most four ASCII digits (`None` if any byte is not a digit), in one
/// pass: four digits cannot overflow, so no checked arithmetic is needed.
#[inline]
fn digits(bytes: &[u8]) -> Option<u32> {
    debug_assert!(!bytes.is_empty() && bytes.len() <= 4);
    let mut value: u32 = 0;
    for &b in bytes {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        value = value * 10 + u32::from(digit);
    }
    Some(value)
}

thread_local! {
    /// The last eight bytes [`parse_utc_date`] was given, and its answer. Inbound timestamps
    /// (SendingTime, TransactTime) nearly all fall on today, so the parse of the date part is
    /// then one comparison. The first entry is true as it stands: eight 0xFF bytes are no date.
    static LAST_PARSED_DATE: std::cell::Cell<(u64, Option<i64>)> =
        const { std::cell::Cell::new((u64::MAX, None)) };
}

/// Parses `YYYYMMDD` into days since the epoch, checking month and day ranges.
pub fn parse_utc_date(bytes: &[u8]) -> Option<i64> {
    let key = u64::from_le_bytes(bytes.try_into().ok()?);
    let (cached_key, cached_days) = LAST_PARSED_DATE.get();
    if cached_key == key {
        return cached_days;
    }
    let days = parse_utc_date_uncached(bytes);
    LAST_PARSED_DATE.set((key, days));
    days
}

/// [`parse_utc_date`] without the cache.
fn parse_utc_date_uncached(bytes: &[u8]) -> Option<i64> {
    if bytes.len() != 8 {
        return None;
    }
    let year = i64::from(digits(&bytes[0..4])?);
    let month = digits(&bytes[4..6])?;
    let day = digits(&bytes[6..8])?;
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some(days_from_civil(year, month, day))
}

/// Parses `HH:MM:SS[.f]` (fraction of 1 to 9 digits) into milliseconds of the
/// day. Leap second 60 is accepted, as the FIX specification allows it.
pub fn parse_utc_time_only(bytes: &[u8]) -> Option<i64> {
    if bytes.len() < 8 || bytes[2] != b':' || bytes[5] != b':' {
        return None;
    }
    let hh = digits(&bytes[0..2])?;
    let mm = digits(&bytes[3..5])?;
    let ss = digits(&bytes[6..8])?;
    if hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let mut ms: i64 = 0;
    if bytes.len() > 8 {
        let frac = &bytes[8..];
        if frac[0] != b'.' || frac.len() < 2 || frac.len() > 10 {
            return None;
        }
        let frac_digits = &frac[1..];
        if !frac_digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Only the first three digits matter at millisecond resolution.
        for i in 0..3 {
            ms = ms * 10 + frac_digits.get(i).map_or(0, |b| i64::from(b - b'0'));
        }
    }
    Some(i64::from(hh) * 3_600_000 + i64::from(mm) * 60_000 + i64::from(ss) * 1000 + ms)
}

/// Parses `YYYYMMDD-HH:MM:SS[.f]` into milliseconds since the epoch.
pub fn parse_utc_timestamp_ms(bytes: &[u8]) -> Option<UnixMs> {
    if bytes.len() < 17 || bytes[8] != b'-' {
        return None;
    }
    let days = parse_utc_date(&bytes[0..8])?;
    let ms_of_day = parse_utc_time_only(&bytes[9..])?;
    days.checked_mul(86_400_000)?.checked_add(ms_of_day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    #[test]
    fn round_trip() {
        for ms in [
            0,
            1_000,
            1_700_000_000_123,
            951_782_400_000, /* 2000-02-29 */
        ] {
            let text = format_utc_timestamp_ms(ms);
            assert_eq!(parse_utc_timestamp_ms(text.as_bytes()), Some(ms), "{text}");
        }
        assert_eq!(format_utc_timestamp_ms(0), "19700101-00:00:00.000");
    }

    proptest::proptest! {
        /// The hand-written digits equal the generic formatting they replaced, for any time,
        /// years past 9999 and before 0 included (which take the generic path).
        #[test]
        fn written_timestamps_equal_the_formatted_ones(unix_ms in -400_000_000_000_000i64..400_000_000_000_000) {
            let days = unix_ms.div_euclid(86_400_000);
            let ms_of_day = unix_ms.rem_euclid(86_400_000);
            let (y, m, d) = civil_from_days(days);
            let (hh, mm, ss, ms) = (ms_of_day / 3_600_000, (ms_of_day / 60_000) % 60, (ms_of_day / 1000) % 60, ms_of_day % 1000);
            let expected = format!("{y:04}{m:02}{d:02}-{hh:02}:{mm:02}:{ss:02}.{ms:03}");
            let mut written = b"x".to_vec();
            UtcTimestamp(unix_ms).write_to(&mut written);
            proptest::prop_assert_eq!(&written[1..], expected.as_bytes());
            proptest::prop_assert_eq!(UtcTimestamp(unix_ms).to_string(), expected);
        }
    }

    proptest::proptest! {
        /// The cached date gives what the calendar conversion gives, whether the next time
        /// falls on the cached day, on the next day or anywhere else.
        #[test]
        fn a_cached_date_equals_the_computed_one(
            first in -400_000_000_000_000i64..400_000_000_000_000,
            step in proptest::prop_oneof![0i64..86_400_000, 0i64..200_000_000, -400_000_000_000_000i64..400_000_000_000_000],
        ) {
            for unix_ms in [first, first.saturating_add(step), first] {
                let days = unix_ms.div_euclid(86_400_000);
                proptest::prop_assert_eq!(date_digits(days), date_digits_uncached(days));
            }
        }
    }

    proptest::proptest! {
        /// A parsed date comes out of the cache as the parse itself gives it, valid or not,
        /// the same bytes twice in a row or after other bytes.
        #[test]
        fn a_cached_parsed_date_equals_the_parsed_one(
            first in proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 8),
                (0u32..=9999, 0u32..=13, 0u32..=32).prop_map(|(y, m, d)| format!("{y:04}{m:02}{d:02}").into_bytes()),
            ],
            second in proptest::collection::vec(b'0'..=b'9', 8),
        ) {
            for bytes in [&first, &first, &second, &first] {
                proptest::prop_assert_eq!(parse_utc_date(bytes), parse_utc_date_uncached(bytes));
            }
        }
    }

    #[test]
    fn rejects_bad_forms() {
        assert!(parse_utc_timestamp_ms(b"20040415").is_none());
        assert!(parse_utc_timestamp_ms(b"20041315-00:00:00").is_none());
        assert!(parse_utc_timestamp_ms(b"20040230-00:00:00").is_none());
        assert!(parse_utc_timestamp_ms(b"20040415-24:00:00").is_none());
        assert!(parse_utc_timestamp_ms(b"20040415-23:00:00.").is_none());
        assert!(parse_utc_timestamp_ms(b"20010101-00:00:00").is_some());
        assert!(parse_utc_timestamp_ms(b"20010101-00:00:00.123456").is_some());
    }
}
