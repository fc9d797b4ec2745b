//! The tag=value codec: framing a byte stream into messages, splitting a
//! message into borrowed fields, checking BodyLength (9) and CheckSum (10),
//! and encoding outbound messages.
//!
//! Decoding never copies field values: a [`RawMessage`] holds `&[u8]` slices
//! into the frame it was decoded from. Encoding goes through [`OutMessage`],
//! which owns its values because the session stores and re-sends them.

use crate::dictionary::Dictionary;
use crate::tags::{self, Tag};

/// The FIX field separator.
pub const SOH: u8 = 0x01;

/// The default limit on one message's size, the whole frame included.
pub const MESSAGE_SIZE_MAX_BYTES_DEFAULT: usize = 64 * 1024;

/// A limit on the number of fields in one message, so that a hostile peer
/// cannot make us allocate a field table out of proportion to the frame.
pub const MESSAGE_FIELDS_MAX: usize = 16 * 1024;

/// One field of a decoded message, borrowing its value from the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    pub tag: Tag,
    pub value: &'a [u8],
}

/// A decoded message: its fields in wire order, borrowed from `frame`.
#[derive(Clone, Debug)]
pub struct RawMessage<'a> {
    pub frame: &'a [u8],
    pub fields: Vec<Field<'a>>,
}

impl<'a> RawMessage<'a> {
    /// The first value of `tag`, if present.
    pub fn get(&self, tag: Tag) -> Option<&'a [u8]> {
        self.fields.iter().find(|f| f.tag == tag).map(|f| f.value)
    }

    pub fn get_str(&self, tag: Tag) -> Option<&'a str> {
        self.get(tag).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The value of `tag` as an unsigned integer, if present and well formed.
    pub fn get_u64(&self, tag: Tag) -> Option<u64> {
        self.get(tag).and_then(parse_u64)
    }

    pub fn msg_type(&self) -> &'a [u8] {
        self.get(tags::MSG_TYPE).unwrap_or(b"")
    }

    pub fn begin_string(&self) -> &'a [u8] {
        self.get(tags::BEGIN_STRING).unwrap_or(b"")
    }
}

/// Why a frame could not be decoded. The session drops such messages
/// without a reject, as FIX prescribes for garbled data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// A field lacks `=`, its tag is not a number, or its value runs off the end.
    Garbled {
        offset: usize,
    },
    /// The frame is bigger than the configured limit.
    TooLarge {
        size_bytes: usize,
        size_max_bytes: usize,
    },
    TooManyFields {
        fields_max: usize,
    },
    /// The first three fields are not BeginString, BodyLength, MsgType.
    HeaderOutOfOrder,
    /// The last field is not CheckSum.
    MissingCheckSum,
    BodyLengthMismatch {
        declared: u64,
        actual: u64,
    },
    CheckSumMismatch {
        declared: u64,
        actual: u8,
    },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Garbled { offset } => write!(f, "garbled field at byte {offset}"),
            DecodeError::TooLarge {
                size_bytes,
                size_max_bytes,
            } => write!(
                f,
                "message of {size_bytes} bytes exceeds the limit of {size_max_bytes} bytes"
            ),
            DecodeError::TooManyFields { fields_max } => {
                write!(f, "message has more than {fields_max} fields")
            }
            DecodeError::HeaderOutOfOrder => {
                write!(f, "header must start with BeginString, BodyLength, MsgType")
            }
            DecodeError::MissingCheckSum => write!(f, "message does not end with CheckSum"),
            DecodeError::BodyLengthMismatch { declared, actual } => {
                write!(
                    f,
                    "BodyLength is {declared} but the body has {actual} bytes"
                )
            }
            DecodeError::CheckSumMismatch { declared, actual } => {
                write!(f, "CheckSum is {declared} but the message sums to {actual}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Parses a tag: an optional minus sign and decimal digits that fit an i32.
pub fn parse_tag(bytes: &[u8]) -> Option<Tag> {
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: i64 = 0;
    for &b in digits {
        value = value * 10 + i64::from(b - b'0');
    }
    let value = if negative { -value } else { value };
    Tag::try_from(value).ok()
}

/// Parses an unsigned decimal integer without sign or spaces.
pub fn parse_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || bytes.len() > 19 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: u64 = 0;
    for &b in bytes {
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(value)
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from >= haystack.len() || needle.is_empty() {
        return None;
    }
    haystack[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

fn find_byte(haystack: &[u8], byte: u8, from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .iter()
        .position(|&b| b == byte)
        .map(|p| p + from)
}

/// The sum of all bytes modulo 256, as CheckSum (10) defines it.
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |acc, &b| acc.wrapping_add(b))
}

/// Data fields whose value may contain SOH, keyed by their length field, for
/// decoding without a dictionary.
const DATA_FIELDS_BY_LENGTH_TAG: &[(Tag, Tag)] = &[
    (90, 91),
    (93, 89),
    (95, 96),
    (212, 213),
    (348, 349),
    (350, 351),
    (352, 353),
    (354, 355),
    (356, 357),
    (358, 359),
    (360, 361),
    (362, 363),
    (364, 365),
    (445, 446),
    (618, 619),
    (621, 622),
];

/// If `tag` is a data field announced by the `previous` length field, the
/// number of value bytes to take regardless of SOH.
fn data_field_length(
    dictionary: Option<&Dictionary>,
    previous: Option<&Field<'_>>,
    tag: Tag,
) -> Option<usize> {
    let previous = previous?;
    let announced = match dictionary {
        Some(d) => d.is_data_field(tag) && d.is_length_field(previous.tag),
        None => DATA_FIELDS_BY_LENGTH_TAG
            .iter()
            .any(|&(len_tag, data_tag)| len_tag == previous.tag && data_tag == tag),
    };
    if !announced {
        return None;
    }
    usize::try_from(parse_u64(previous.value)?).ok()
}

/// Splits a frame into fields and checks its envelope: 8, 9, 35 first, 10
/// last, BodyLength and CheckSum right. The dictionary, if given, says which
/// fields are data fields whose length was announced by the field before.
pub fn decode<'a>(
    frame: &'a [u8],
    dictionary: Option<&Dictionary>,
    message_size_max_bytes: usize,
) -> Result<RawMessage<'a>, DecodeError> {
    if frame.len() > message_size_max_bytes {
        return Err(DecodeError::TooLarge {
            size_bytes: frame.len(),
            size_max_bytes: message_size_max_bytes,
        });
    }
    let mut fields: Vec<Field<'a>> = Vec::with_capacity(32);
    // Byte offsets of the start of the field after BodyLength and of CheckSum.
    let mut body_start: Option<usize> = None;
    let mut checksum_start: Option<usize> = None;
    let mut pos = 0usize;
    while pos < frame.len() {
        let eq = find_byte(frame, b'=', pos).ok_or(DecodeError::Garbled { offset: pos })?;
        let tag = parse_tag(&frame[pos..eq]).ok_or(DecodeError::Garbled { offset: pos })?;
        let value_start = eq + 1;
        let value_end = match data_field_length(dictionary, fields.last(), tag) {
            Some(len) => {
                let end = value_start
                    .checked_add(len)
                    .ok_or(DecodeError::Garbled { offset: pos })?;
                if frame.get(end) != Some(&SOH) {
                    return Err(DecodeError::Garbled { offset: pos });
                }
                end
            }
            None => {
                find_byte(frame, SOH, value_start).ok_or(DecodeError::Garbled { offset: pos })?
            }
        };
        if tag == tags::CHECK_SUM && checksum_start.is_none() {
            checksum_start = Some(pos);
        }
        fields.push(Field {
            tag,
            value: &frame[value_start..value_end],
        });
        if fields.len() == 2 {
            body_start = Some(value_end + 1);
        }
        if fields.len() > MESSAGE_FIELDS_MAX {
            return Err(DecodeError::TooManyFields {
                fields_max: MESSAGE_FIELDS_MAX,
            });
        }
        pos = value_end + 1;
    }
    let leading: Vec<Tag> = fields.iter().take(3).map(|f| f.tag).collect();
    if leading != [tags::BEGIN_STRING, tags::BODY_LENGTH, tags::MSG_TYPE] {
        return Err(DecodeError::HeaderOutOfOrder);
    }
    let last = fields.last().ok_or(DecodeError::MissingCheckSum)?;
    let checksum_start = checksum_start.ok_or(DecodeError::MissingCheckSum)?;
    if last.tag != tags::CHECK_SUM {
        return Err(DecodeError::MissingCheckSum);
    }
    let body_start = body_start.ok_or(DecodeError::HeaderOutOfOrder)?;
    assert!(
        body_start <= checksum_start,
        "BodyLength is decoded before CheckSum"
    );
    let declared_length = parse_u64(fields[1].value).ok_or(DecodeError::Garbled { offset: 0 })?;
    let actual_length = (checksum_start - body_start) as u64;
    if declared_length != actual_length {
        return Err(DecodeError::BodyLengthMismatch {
            declared: declared_length,
            actual: actual_length,
        });
    }
    let declared_checksum = parse_u64(last.value).ok_or(DecodeError::Garbled {
        offset: checksum_start,
    })?;
    let actual_checksum = checksum(&frame[..checksum_start]);
    if declared_checksum != u64::from(actual_checksum) {
        return Err(DecodeError::CheckSumMismatch {
            declared: declared_checksum,
            actual: actual_checksum,
        });
    }
    Ok(RawMessage { frame, fields })
}

/// Finds MsgType in a frame that may not decode, the way QuickFIX's
/// `identifyType` does, so a garbled Logon can still end the connection.
pub fn peek_msg_type(frame: &[u8]) -> Option<&[u8]> {
    let start = find(frame, b"\x0135=", 0)? + 4;
    let end = find_byte(frame, SOH, start)?;
    Some(&frame[start..end])
}

/// Why the inbound byte stream cannot go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    TooLarge {
        size_bytes: usize,
        size_max_bytes: usize,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge { size_bytes, size_max_bytes } => write!(
                f,
                "inbound message of at least {size_bytes} bytes exceeds the limit of {size_max_bytes} bytes"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

/// Accumulates inbound bytes and cuts them into frames: from `8=` through
/// the SOH that ends CheckSum. BodyLength says where to start looking for
/// CheckSum; as in QuickFIX, a wrong BodyLength still yields a frame, which
/// then fails [`decode`] and is dropped. Bytes before `8=` are discarded.
#[derive(Debug)]
pub struct FrameBuffer {
    bytes: Vec<u8>,
    /// Bytes at the front of `bytes` already handed out or skipped.
    consumed: usize,
    message_size_max_bytes: usize,
}

impl FrameBuffer {
    pub fn new(message_size_max_bytes: usize) -> Self {
        assert!(
            message_size_max_bytes >= 64,
            "a limit below 64 bytes cannot hold a Heartbeat"
        );
        FrameBuffer {
            bytes: Vec::new(),
            consumed: 0,
            message_size_max_bytes,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.consumed = 0;
    }

    /// Removes and returns whatever is buffered, complete frames or not.
    pub fn take_bytes(&mut self) -> Vec<u8> {
        let rest = self.view().to_vec();
        self.clear();
        rest
    }

    pub fn buffered_bytes(&self) -> usize {
        self.bytes.len() - self.consumed
    }

    fn view(&self) -> &[u8] {
        &self.bytes[self.consumed..]
    }

    /// Drops `n` bytes from the front. Consumed bytes are only moved out
    /// of the vector once they outweigh what is left, so that cutting many
    /// small frames from one large read costs linear time.
    fn consume(&mut self, n: usize) {
        assert!(n <= self.buffered_bytes());
        self.consumed += n;
        if self.consumed == self.bytes.len() {
            self.clear();
        } else if self.consumed >= 4096 && self.consumed * 2 >= self.bytes.len() {
            self.bytes.drain(..self.consumed);
            self.consumed = 0;
        }
    }

    fn too_large(&mut self, size_bytes: usize) -> FrameError {
        self.clear();
        FrameError::TooLarge {
            size_bytes,
            size_max_bytes: self.message_size_max_bytes,
        }
    }

    /// Removes and returns the next complete frame, `Ok(None)` if more bytes
    /// are needed, or an error if the peer exceeds the size limit (the
    /// connection should then be dropped: the stream cannot be resynchronised
    /// without reading unbounded data).
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        loop {
            let Some(start) = find(self.view(), b"8=", 0) else {
                // Keep a trailing '8', which may begin the next message.
                let keep = usize::from(self.view().last() == Some(&b'8'));
                self.consume(self.buffered_bytes() - keep);
                return Ok(None);
            };
            self.consume(start);
            match scan_frame(self.view(), self.message_size_max_bytes) {
                Scan::Complete(end) => {
                    if end > self.message_size_max_bytes {
                        return Err(self.too_large(end));
                    }
                    let frame = self.view()[..end].to_vec();
                    self.consume(end);
                    return Ok(Some(frame));
                }
                Scan::Incomplete => {
                    if self.buffered_bytes() > self.message_size_max_bytes {
                        return Err(self.too_large(self.buffered_bytes()));
                    }
                    return Ok(None);
                }
                Scan::TooLarge(size_bytes) => return Err(self.too_large(size_bytes)),
                Scan::Garbled => {
                    // Skip this "8=" and resynchronise on the next one.
                    self.consume(2);
                }
            }
        }
    }
}

/// Looks for a whole frame at the start of `b`, which begins `8=`.
fn scan_frame(b: &[u8], message_size_max_bytes: usize) -> Scan {
    debug_assert!(b.starts_with(b"8="));
    let Some(begin_end) = find_byte(b, SOH, 2) else {
        return Scan::Incomplete;
    };
    let length_tag = begin_end + 1;
    if b.len() < length_tag + 2 {
        return Scan::Incomplete;
    }
    if &b[length_tag..length_tag + 2] != b"9=" {
        return Scan::Garbled;
    }
    let Some(length_end) = find_byte(b, SOH, length_tag + 2) else {
        return if b.len() - length_tag > 24 {
            Scan::Garbled
        } else {
            Scan::Incomplete
        };
    };
    let Some(length) = parse_u64(&b[length_tag + 2..length_end]) else {
        return Scan::Garbled;
    };
    let body_start = length_end + 1;
    let Some(body_end) = usize::try_from(length)
        .ok()
        .and_then(|l| body_start.checked_add(l))
    else {
        return Scan::Garbled;
    };
    if body_end > message_size_max_bytes {
        // The peer announces a message over the limit: refuse it now
        // rather than buffer that much data first.
        return Scan::TooLarge(body_end);
    }
    if b.len() < body_end {
        return Scan::Incomplete;
    }
    let Some(checksum_at) = find(b, b"\x0110=", body_end.saturating_sub(1).max(length_end)) else {
        return Scan::Incomplete;
    };
    let Some(end) = find_byte(b, SOH, checksum_at + 4) else {
        return Scan::Incomplete;
    };
    Scan::Complete(end + 1)
}

enum Scan {
    Complete(usize),
    TooLarge(usize),
    Incomplete,
    Garbled,
}

/// An outbound message under construction. The encoder writes BeginString,
/// BodyLength and MsgType first, then the other header fields in ascending
/// tag order, then the body fields in the order they were added, then
/// CheckSum.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutMessage {
    pub msg_type: String,
    pub header: Vec<(Tag, Vec<u8>)>,
    pub body: Vec<(Tag, Vec<u8>)>,
}

impl OutMessage {
    pub fn new(msg_type: &str) -> Self {
        OutMessage {
            msg_type: msg_type.to_string(),
            header: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Sets a header field, replacing any earlier value of the same tag.
    pub fn set_header(&mut self, tag: Tag, value: impl AsRef<[u8]>) -> &mut Self {
        assert!(
            tag != tags::BEGIN_STRING
                && tag != tags::BODY_LENGTH
                && tag != tags::MSG_TYPE
                && tag != tags::CHECK_SUM,
            "the encoder owns tags 8, 9, 35 and 10"
        );
        let value = value.as_ref().to_vec();
        match self.header.iter_mut().find(|(t, _)| *t == tag) {
            Some(slot) => slot.1 = value,
            None => self.header.push((tag, value)),
        }
        self
    }

    pub fn remove_header(&mut self, tag: Tag) -> &mut Self {
        self.header.retain(|(t, _)| *t != tag);
        self
    }

    pub fn header_value(&self, tag: Tag) -> Option<&[u8]> {
        self.header
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v.as_slice())
    }

    /// Appends a body field.
    pub fn push(&mut self, tag: Tag, value: impl AsRef<[u8]>) -> &mut Self {
        self.body.push((tag, value.as_ref().to_vec()));
        self
    }

    pub fn body_value(&self, tag: Tag) -> Option<&[u8]> {
        self.body
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v.as_slice())
    }

    /// Encodes the message with BodyLength and CheckSum computed.
    pub fn encode(&self, begin_string: &str) -> Vec<u8> {
        let mut header: Vec<&(Tag, Vec<u8>)> = self.header.iter().collect();
        header.sort_by_key(|(tag, _)| *tag);
        let mut body = Vec::with_capacity(256);
        write_field(&mut body, tags::MSG_TYPE, self.msg_type.as_bytes());
        for (tag, value) in header {
            write_field(&mut body, *tag, value);
        }
        for (tag, value) in &self.body {
            write_field(&mut body, *tag, value);
        }
        let mut out = Vec::with_capacity(body.len() + 32);
        write_field(&mut out, tags::BEGIN_STRING, begin_string.as_bytes());
        write_field(
            &mut out,
            tags::BODY_LENGTH,
            body.len().to_string().as_bytes(),
        );
        out.extend_from_slice(&body);
        let sum = checksum(&out);
        out.extend_from_slice(format!("10={sum:03}").as_bytes());
        out.push(SOH);
        out
    }
}

fn write_field(out: &mut Vec<u8>, tag: Tag, value: &[u8]) {
    out.extend_from_slice(tag.to_string().as_bytes());
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(SOH);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soh(text: &str) -> Vec<u8> {
        text.replace('|', "\x01").into_bytes()
    }

    #[test]
    fn encode_then_decode() {
        let mut m = OutMessage::new("0");
        m.set_header(tags::SENDER_COMP_ID, "ISLD")
            .set_header(tags::MSG_SEQ_NUM, "2");
        m.push(tags::TEST_REQ_ID, "HELLO");
        let bytes = m.encode("FIX.4.4");
        let raw = decode(&bytes, None, MESSAGE_SIZE_MAX_BYTES_DEFAULT).expect("valid");
        let tags_seen: Vec<Tag> = raw.fields.iter().map(|f| f.tag).collect();
        assert_eq!(tags_seen, vec![8, 9, 35, 34, 49, 112, 10]);
        assert_eq!(raw.get(112), Some(&b"HELLO"[..]));
    }

    #[test]
    fn rejects_bad_checksum_and_length() {
        let good = OutMessage::new("0").encode("FIX.4.4");
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 2] = if bad[n - 2] == b'9' { b'8' } else { b'9' };
        assert!(matches!(
            decode(&bad, None, 1024),
            Err(DecodeError::CheckSumMismatch { .. })
        ));
        let wrong_len = soh("8=FIX.4.4|9=3|35=0|10=000|");
        assert!(matches!(
            decode(&wrong_len, None, 1024),
            Err(DecodeError::BodyLengthMismatch { .. })
        ));
    }

    #[test]
    fn frames_stream_and_skips_garbage() {
        let a = OutMessage::new("0").encode("FIX.4.4");
        let mut fb = FrameBuffer::new(1024);
        fb.push(b"garbage");
        fb.push(&a[..10]);
        assert_eq!(fb.next_frame(), Ok(None));
        fb.push(&a[10..]);
        fb.push(&a);
        assert_eq!(fb.next_frame(), Ok(Some(a.clone())));
        assert_eq!(fb.next_frame(), Ok(Some(a)));
        assert_eq!(fb.next_frame(), Ok(None));
    }

    #[test]
    fn size_limit_is_enforced() {
        let mut fb = FrameBuffer::new(64);
        fb.push(&soh("8=FIX.4.4|9=100|35=0|"));
        fb.push(&[b'x'; 80]);
        assert!(matches!(fb.next_frame(), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn data_field_may_hold_soh() {
        let msg = soh("8=FIX.4.4|9=24|35=n|212=5|213=a|b=c|10=000|");
        let frame = {
            // Fix up BodyLength and CheckSum so that only the data field is under test.
            let raw_body = soh("35=n|212=5|213=a|b=c|");
            let mut out = soh(&format!("8=FIX.4.4|9={}|", raw_body.len()));
            out.extend_from_slice(&raw_body);
            let sum = checksum(&out);
            out.extend_from_slice(format!("10={sum:03}\x01").as_bytes());
            out
        };
        let _ = msg;
        let raw = decode(&frame, None, 1024).expect("valid");
        assert_eq!(raw.get(213), Some(&b"a\x01b=c"[..]));
    }
}
