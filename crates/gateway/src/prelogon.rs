//! The bytes a FIX connection sends before it is logged on, judged as they arrive: a client
//! that is not yet anyone gets no benefit of the doubt. Its first bytes must be
//! `8=FIX.4.4<SOH>9=`, its BodyLength a few digits that keep the message within the size
//! limit, and its frame must end where BodyLength says, so a connection is closed at the
//! first byte that cannot begin a valid Logon rather than when a timer runs out.
//! [`scan_logon`] does the framing; [`judge_logon`] decodes the frame and says which
//! configured session it names.

use crate::disconnect::DisconnectReason;
use bourse_fix::DecodeError;

/// What every FIX 4.4 message begins with, up to BodyLength's value.
pub const LOGON_PREFIX: &[u8] = b"8=FIX.4.4\x019=";
/// BodyLength digits at most: no message within the 1 MiB ceiling needs more.
const BODY_LENGTH_DIGITS_MAX: usize = 7;
/// `10=NNN<SOH>`, the trailer every frame ends with.
const TRAILER_BYTES: usize = 7;

/// Looks at the bytes received so far. `Ok(None)`: all of them may begin a valid message;
/// `Ok(Some(n))`: the first `n` bytes are a whole frame; `Err`: why the connection is closed.
pub fn scan_logon(bytes: &[u8], size_max_bytes: usize) -> Result<Option<usize>, DisconnectReason> {
    let head = bytes.len().min(LOGON_PREFIX.len());
    if bytes[..head] != LOGON_PREFIX[..head] {
        return Err(DisconnectReason::Garbled);
    }
    if bytes.len() == head {
        return Ok(None);
    }
    let digits = &bytes[LOGON_PREFIX.len()..];
    let mut body_bytes = 0usize;
    let mut count = 0usize;
    let mut ended = false;
    for &b in digits {
        match b {
            b'0'..=b'9' if count < BODY_LENGTH_DIGITS_MAX => {
                body_bytes = body_bytes * 10 + usize::from(b - b'0');
                count += 1;
            }
            b'0'..=b'9' => return Err(DisconnectReason::Oversized),
            0x01 if count > 0 => {
                ended = true;
                break;
            }
            _ => return Err(DisconnectReason::BadBodyLength),
        }
        if LOGON_PREFIX.len() + count + 1 + body_bytes + TRAILER_BYTES > size_max_bytes {
            return Err(DisconnectReason::Oversized);
        }
    }
    if !ended {
        return Ok(None);
    }
    let body_start = LOGON_PREFIX.len() + count + 1;
    let body_end = body_start + body_bytes;
    let total = body_end + TRAILER_BYTES;
    // The body must end with SOH and be followed by "10=": checked as soon as those bytes are in.
    let trailer_ok = |i: usize, b: u8| match i {
        0 => b == 0x01,
        1 => b == b'1',
        2 => b == b'0',
        3 => b == b'=',
        4..=6 => b.is_ascii_digit(),
        _ => b == 0x01,
    };
    let from = body_end - 1;
    for (i, &b) in bytes.iter().enumerate().take(total).skip(from) {
        if !trailer_ok(i - from, b) {
            return Err(DisconnectReason::BadBodyLength);
        }
    }
    Ok((bytes.len() >= total).then_some(total))
}

/// Why a decoded first frame is refused, from the decoder's error.
pub fn decode_fault(e: &DecodeError) -> DisconnectReason {
    match e {
        DecodeError::CheckSumMismatch { .. } => DisconnectReason::BadCheckSum,
        DecodeError::BodyLengthMismatch { .. } => DisconnectReason::BadBodyLength,
        DecodeError::TooLarge { .. } => DisconnectReason::Oversized,
        _ => DisconnectReason::Garbled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn logon(body: &str) -> Vec<u8> {
        let mut m = format!("8=FIX.4.4\x019={}\x01{body}", body.len()).into_bytes();
        let sum: u32 = m.iter().map(|&b| u32::from(b)).sum();
        m.extend_from_slice(format!("10={:03}\x01", sum % 256).as_bytes());
        m
    }

    const BODY: &str =
        "35=A\x0149=ALPHA\x0156=BOURSE\x0134=1\x0152=20260101-00:00:00\x0198=0\x01108=30\x01";

    #[test]
    fn a_whole_logon_is_one_frame_at_every_split() {
        let m = logon(BODY);
        for cut in 0..m.len() {
            assert_eq!(scan_logon(&m[..cut], 8192), Ok(None), "cut at {cut}");
        }
        assert_eq!(scan_logon(&m, 8192), Ok(Some(m.len())));
        let mut two = m.clone();
        two.extend_from_slice(&m);
        assert_eq!(scan_logon(&two, 8192), Ok(Some(m.len())));
    }

    #[test]
    fn a_megabyte_of_body_length_digits_is_cut_at_the_eighth() {
        let mut m = b"8=FIX.4.4\x019=".to_vec();
        m.extend_from_slice(&[b'1'; 1 << 20]);
        assert_eq!(scan_logon(&m, 1 << 20), Err(DisconnectReason::Oversized));
        // With the usual 8 KiB limit, the fifth digit already announces too much.
        assert_eq!(
            scan_logon(b"8=FIX.4.4\x019=10000", 8192),
            Err(DisconnectReason::Oversized)
        );
        assert_eq!(scan_logon(b"8=FIX.4.4\x019=1000", 8192), Ok(None));
        // Leading zeros do not get around it.
        assert_eq!(
            scan_logon(b"8=FIX.4.4\x019=00000000", 8192),
            Err(DisconnectReason::Oversized)
        );
    }

    #[test]
    fn the_first_wrong_byte_decides() {
        assert_eq!(
            scan_logon(b"GET / HTTP/1.1", 8192),
            Err(DisconnectReason::Garbled)
        );
        assert_eq!(
            scan_logon(b"8=FIX.4.2\x01", 8192),
            Err(DisconnectReason::Garbled)
        );
        assert_eq!(
            scan_logon(b"8=FIX.4.4\x019=1x", 8192),
            Err(DisconnectReason::BadBodyLength)
        );
        assert_eq!(
            scan_logon(b"8=FIX.4.4\x019=\x01", 8192),
            Err(DisconnectReason::BadBodyLength)
        );
        // BodyLength one short: the byte where SOH must be is not one.
        let m = logon(BODY);
        let wrong = String::from_utf8(m).unwrap().replace(
            &format!("9={}", BODY.len()),
            &format!("9={}", BODY.len() - 1),
        );
        assert_eq!(
            scan_logon(wrong.as_bytes(), 8192),
            Err(DisconnectReason::BadBodyLength)
        );
    }

    #[test]
    fn a_bad_checksum_is_told_apart_by_the_decoder() {
        let mut m = logon(BODY);
        let n = m.len();
        m[n - 2] = if m[n - 2] == b'9' { b'0' } else { m[n - 2] + 1 };
        assert_eq!(scan_logon(&m, 8192), Ok(Some(n)));
        let e = bourse_fix::decode(&m, None, 8192).unwrap_err();
        assert_eq!(decode_fault(&e), DisconnectReason::BadCheckSum);
    }

    proptest! {
        /// Whatever arrives, the scan never reads past the limit undecided: either it has
        /// decided (a frame or a fault), or it has seen fewer bytes than the limit allows.
        #[test]
        fn undecided_input_stays_within_the_limit(
            tail in proptest::collection::vec(any::<u8>(), 0..400),
            digits in 0usize..12,
            limit in 256usize..2048,
        ) {
            let mut m = LOGON_PREFIX.to_vec();
            m.extend(std::iter::repeat_n(b'1', digits));
            m.extend_from_slice(&tail);
            if let Ok(None) = scan_logon(&m, limit) {
                prop_assert!(m.len() <= limit);
            }
            if let Ok(Some(n)) = scan_logon(&m, limit) {
                prop_assert!(n <= m.len() && n <= limit);
            }
        }

        /// Any well-formed Logon is framed exactly, however it is split.
        #[test]
        fn well_formed_messages_frame_exactly(comp in "[A-Z]{1,20}", cut in 0usize..200) {
            let body = format!("35=A\x0149={comp}\x0156=BOURSE\x0134=1\x01");
            let m = logon(&body);
            let cut = cut.min(m.len());
            let want = if cut == m.len() { Some(m.len()) } else { None };
            prop_assert_eq!(scan_logon(&m[..cut], 8192), Ok(want));
        }
    }
}
