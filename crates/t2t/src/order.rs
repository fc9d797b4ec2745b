//! The pre-encoded FIX 4.4 NewOrderSingle the reacting client sends, patched in place.
//!
//! The template is encoded once by `bourse_fix`'s encoder with every field that changes
//! (MsgSeqNum, SendingTime, ClOrdID, Price, TransactTime) at a fixed width, so BodyLength never
//! changes and a reaction only writes digits over digits and recomputes CheckSum. FIX allows
//! the leading zeros this needs: int and float values "may contain leading zeros" (FIX 4.4,
//! volume 1, data types). Prices are the feed's integer mantissas written with
//! `price_scale` decimal places.

use bourse_fix::codec::{checksum, OutMessage};
use bourse_fix::time::UtcTimestamp;
use std::io::Write as _;

/// Largest encoded template.
pub const TEMPLATE_BYTES_MAX: usize = 512;
/// Digits of MsgSeqNum.
pub const SEQ_DIGITS: usize = 9;
/// Digits of ClOrdID.
pub const CL_ORD_ID_DIGITS: usize = 12;
/// Integer digits of Price after its sign position (every i64 mantissa fits).
const PRICE_INT_DIGITS: usize = 19;
/// Length of a UTCTimestamp with milliseconds: `YYYYMMDD-HH:MM:SS.sss`.
pub const TIMESTAMP_BYTES: usize = 21;
/// Most decimal places of a price.
pub const PRICE_SCALE_MAX: u8 = 9;

/// What an exchange calls an instrument the feed names by number: its symbol (FIX tag 55, which
/// bourse's gateway looks orders up by) and the decimal places of its price mantissas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstrumentName {
    pub security_id: u32,
    pub symbol: String,
    pub price_scale: u8,
}

/// What every order of a client carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrderSpec {
    pub sender_comp_id: String,
    pub target_comp_id: String,
    /// Quantity of every order.
    pub qty: i64,
    /// Decimal places of the feed's price mantissas, for instruments not in `instruments`.
    pub price_scale: u8,
    /// Symbols and price scales by security id (from instrument definitions); an instrument
    /// not listed is sent with its number as Symbol.
    pub instruments: Vec<InstrumentName>,
}

impl Default for OrderSpec {
    fn default() -> Self {
        OrderSpec {
            sender_comp_id: "T2T".into(),
            target_comp_id: "BOURSE".into(),
            qty: 1,
            price_scale: 0,
            instruments: Vec::new(),
        }
    }
}

impl OrderSpec {
    /// The symbol and price scale an instrument's orders are written with.
    pub fn name_of(&self, security_id: u32) -> (Option<&str>, u8) {
        match self
            .instruments
            .iter()
            .find(|i| i.security_id == security_id)
        {
            Some(i) => (Some(i.symbol.as_str()), i.price_scale),
            None => (None, self.price_scale),
        }
    }
}

/// One instrument's NewOrderSingle, ready to patch.
#[derive(Clone, Debug)]
pub struct OrderTemplate {
    bytes: [u8; TEMPLATE_BYTES_MAX],
    len: usize,
    seq_at: usize,
    sending_at: usize,
    cl_ord_id_at: usize,
    price_at: usize,
    transact_at: usize,
    checksum_at: usize,
    price_scale: u8,
}

/// Writes `v` as exactly `out.len()` decimal digits (the high digits of a larger value are
/// dropped; callers size fields so that cannot happen for the values they pass).
#[inline]
fn put_digits(out: &mut [u8], mut v: u64) {
    for b in out.iter_mut().rev() {
        *b = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Byte offset of the value of the first field `tag` (searching for `SOH tag =`).
fn value_offset(bytes: &[u8], tag: i32) -> Option<usize> {
    let needle = format!("\x01{tag}=");
    bytes
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .map(|p| p + needle.len())
}

impl OrderTemplate {
    /// Encodes the template of a buy order for `security_id`, with the symbol and price scale
    /// `spec` names it by (see [`OrderTemplate::named`]).
    pub fn new(spec: &OrderSpec, security_id: u32) -> Result<OrderTemplate, String> {
        let (symbol, price_scale) = spec.name_of(security_id);
        OrderTemplate::named(spec, security_id, symbol, price_scale)
    }

    /// Encodes the template of a buy order for `security_id`: Symbol (55) is `symbol`, or the
    /// number when there is none; SecurityID (48) is the number with IDSource (22) 8, so a
    /// driver can check the instrument whatever the symbol; prices are written with
    /// `price_scale` decimal places.
    pub fn named(
        spec: &OrderSpec,
        security_id: u32,
        symbol: Option<&str>,
        price_scale: u8,
    ) -> Result<OrderTemplate, String> {
        if price_scale > PRICE_SCALE_MAX {
            return Err(format!(
                "price scale {price_scale} is above {PRICE_SCALE_MAX}"
            ));
        }
        if let Some(s) = symbol {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("symbol {s:?} is not printable ASCII"));
            }
        }
        if spec.qty <= 0 {
            return Err(format!("order quantity {} must be positive", spec.qty));
        }
        let zeros = |n: usize| "0".repeat(n);
        let price_width =
            1 + PRICE_INT_DIGITS + usize::from(price_scale > 0) + usize::from(price_scale);
        let number = security_id.to_string();
        let time = "00000000-00:00:00.000";
        let mut m = OutMessage::new("D");
        m.set_header(34, zeros(SEQ_DIGITS))
            .set_header(49, &spec.sender_comp_id)
            .set_header(52, time)
            .set_header(56, &spec.target_comp_id);
        m.push(11, zeros(CL_ORD_ID_DIGITS))
            .push(55, symbol.unwrap_or(&number))
            .push_display(48, &security_id)
            .push(22, "8")
            .push(54, "1")
            .push_display(38, &spec.qty)
            .push(40, "2")
            .push(44, zeros(price_width))
            .push(59, "3")
            .push(60, time);
        let encoded = m.encode("FIX.4.4");
        if encoded.len() > TEMPLATE_BYTES_MAX {
            return Err(format!(
                "the order template takes {} bytes, more than {TEMPLATE_BYTES_MAX} (shorter CompIDs?)",
                encoded.len()
            ));
        }
        let find = |tag| value_offset(&encoded, tag).ok_or(format!("template lacks tag {tag}"));
        let mut bytes = [0u8; TEMPLATE_BYTES_MAX];
        bytes[..encoded.len()].copy_from_slice(&encoded);
        Ok(OrderTemplate {
            bytes,
            len: encoded.len(),
            seq_at: find(34)?,
            sending_at: find(52)?,
            cl_ord_id_at: find(11)?,
            price_at: find(44)?,
            transact_at: find(60)?,
            checksum_at: find(10)?,
            price_scale,
        })
    }

    /// The encoded message as last patched.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Writes the changing fields and the CheckSum; returns the message.
    #[inline]
    pub fn patch(
        &mut self,
        seq: u64,
        cl_ord_id: u64,
        price: i64,
        timestamp: &[u8; TIMESTAMP_BYTES],
    ) -> &[u8] {
        put_digits(&mut self.bytes[self.seq_at..self.seq_at + SEQ_DIGITS], seq);
        put_digits(
            &mut self.bytes[self.cl_ord_id_at..self.cl_ord_id_at + CL_ORD_ID_DIGITS],
            cl_ord_id,
        );
        self.bytes[self.sending_at..self.sending_at + TIMESTAMP_BYTES].copy_from_slice(timestamp);
        self.bytes[self.transact_at..self.transact_at + TIMESTAMP_BYTES].copy_from_slice(timestamp);
        self.put_price(price);
        let sum = checksum(&self.bytes[..self.checksum_at - 3]);
        put_digits(
            &mut self.bytes[self.checksum_at..self.checksum_at + 3],
            u64::from(sum),
        );
        &self.bytes[..self.len]
    }

    #[inline]
    fn put_price(&mut self, price: i64) {
        let scale = usize::from(self.price_scale);
        let at = self.price_at;
        self.bytes[at] = if price < 0 { b'-' } else { b'0' };
        let abs = price.unsigned_abs();
        let unit = 10u64.pow(u32::from(self.price_scale));
        let int_at = at + 1;
        put_digits(
            &mut self.bytes[int_at..int_at + PRICE_INT_DIGITS],
            abs / unit,
        );
        if scale > 0 {
            let dot = int_at + PRICE_INT_DIGITS;
            self.bytes[dot] = b'.';
            put_digits(&mut self.bytes[dot + 1..dot + 1 + scale], abs % unit);
        }
    }
}

/// The SendingTime text of the current millisecond, reformatted in full only when the second
/// changes (the date and clock digits), otherwise patched in its three millisecond digits.
#[derive(Clone, Debug)]
pub struct TimestampCache {
    text: [u8; TIMESTAMP_BYTES],
    second: i64,
}

impl Default for TimestampCache {
    fn default() -> Self {
        TimestampCache {
            text: *b"19700101-00:00:00.000",
            second: i64::MIN,
        }
    }
}

impl TimestampCache {
    /// The text for `unix_ns` (ns since the epoch).
    #[inline]
    pub fn at(&mut self, unix_ns: u64) -> &[u8; TIMESTAMP_BYTES] {
        let unix_ms = (unix_ns / 1_000_000) as i64;
        let second = unix_ms.div_euclid(1000);
        if second != self.second {
            // Formatting into a fixed buffer: no allocation. Years past 9999 do not fit and
            // keep the old text.
            let mut cursor = std::io::Cursor::new(&mut self.text[..]);
            let _ = write!(cursor, "{}", UtcTimestamp(second * 1000));
            self.second = second;
        }
        put_digits(
            &mut self.text[TIMESTAMP_BYTES - 3..],
            unix_ms.rem_euclid(1000) as u64,
        );
        &self.text
    }
}

/// Reads a FIX price back into a mantissa with `price_scale` decimal places (for the driver's
/// check of the orders it receives). `None` when the text is not a price of that scale.
pub fn parse_price(text: &[u8], price_scale: u8) -> Option<i64> {
    let (negative, digits) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, text),
    };
    let (int, frac) = match digits.iter().position(|&b| b == b'.') {
        Some(dot) => (&digits[..dot], &digits[dot + 1..]),
        None => (digits, &digits[digits.len()..]),
    };
    if frac.len() > usize::from(price_scale) || int.is_empty() {
        return None;
    }
    let mut v: i128 = 0;
    for &b in int.iter().chain(frac) {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
    }
    for _ in frac.len()..usize::from(price_scale) {
        v = v.checked_mul(10)?;
    }
    i64::try_from(if negative { -v } else { v }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_fix::decode;
    use proptest::prelude::*;

    #[test]
    fn the_template_is_a_valid_new_order_single() {
        let spec = OrderSpec {
            price_scale: 2,
            ..OrderSpec::default()
        };
        let mut t = OrderTemplate::new(&spec, 1001).unwrap();
        let mut clock = TimestampCache::default();
        let ts = *clock.at(1_700_000_000_123_000_000);
        let bytes = t.patch(2, 1, 10_050, &ts).to_vec();
        let m = decode(&bytes, None, 4096).unwrap();
        assert_eq!(m.msg_type(), b"D");
        assert_eq!(m.get_u64(34), Some(2));
        assert_eq!(m.get_str(52), Some("20231114-22:13:20.123"));
        assert_eq!(m.get_str(48), Some("1001"));
        assert_eq!(parse_price(m.get(44).unwrap(), 2), Some(10_050));
    }

    #[test]
    fn a_named_instrument_is_sent_with_its_symbol_and_price_scale() {
        let spec = OrderSpec {
            instruments: vec![InstrumentName {
                security_id: 7,
                symbol: "SBER".into(),
                price_scale: 2,
            }],
            ..OrderSpec::default()
        };
        let mut t = OrderTemplate::new(&spec, 7).unwrap();
        let ts = *TimestampCache::default().at(1_700_000_000_000_000_000);
        let m = decode(t.patch(2, 1, 10_050, &ts), None, 4096).unwrap();
        assert_eq!(m.get_str(55), Some("SBER"));
        assert_eq!(m.get_str(48), Some("7"));
        assert_eq!(parse_price(m.get(44).unwrap(), 2), Some(10_050));
        let mut other = OrderTemplate::new(&spec, 8).unwrap();
        let m = decode(other.patch(3, 2, 5, &ts), None, 4096).unwrap();
        assert_eq!(m.get_str(55), Some("8"));
        assert_eq!(parse_price(m.get(44).unwrap(), 0), Some(5));
        assert!(OrderTemplate::named(&spec, 9, Some("A B"), 2).is_err());
    }

    #[test]
    fn the_timestamp_cache_matches_the_fix_formatter() {
        let mut clock = TimestampCache::default();
        for ns in [
            0u64,
            999_999_999,
            1_700_000_000_999_000_000,
            1_700_000_001_000_000_000,
        ] {
            let want = UtcTimestamp((ns / 1_000_000) as i64).to_string();
            assert_eq!(clock.at(ns), want.as_bytes());
        }
    }

    proptest! {
        /// Whatever is patched in, the message decodes (BodyLength and CheckSum right) and
        /// reads back the values written.
        #[test]
        fn patched_templates_decode_to_what_was_patched(
            seq in 0u64..1_000_000_000,
            cl_ord_id in 0u64..1_000_000_000_000,
            price in any::<i64>(),
            scale in 0u8..=PRICE_SCALE_MAX,
            ms in 0u64..253_402_300_799_000,
            security_id in any::<u32>(),
        ) {
            let spec = OrderSpec { price_scale: scale, ..OrderSpec::default() };
            let mut t = OrderTemplate::new(&spec, security_id).unwrap();
            let mut clock = TimestampCache::default();
            let ts = *clock.at(ms * 1_000_000);
            let bytes = t.patch(seq, cl_ord_id, price, &ts).to_vec();
            let m = decode(&bytes, None, 4096).unwrap();
            prop_assert_eq!(m.get_u64(34), Some(seq));
            prop_assert_eq!(m.get_u64(11), Some(cl_ord_id));
            prop_assert_eq!(parse_price(m.get(44).unwrap(), scale), Some(price));
            prop_assert_eq!(m.get(52), Some(&ts[..]));
            prop_assert_eq!(m.get(60), Some(&ts[..]));
            prop_assert_eq!(m.get_u64(48), Some(u64::from(security_id)));
        }
    }
}
