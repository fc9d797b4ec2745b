//! The tag=value codec: framing a byte stream into messages, splitting a
//! message into borrowed fields, checking BodyLength (9) and CheckSum (10),
//! and encoding outbound messages.
//!
//! Decoding never copies field values: a [`RawMessage`] holds `&[u8]` slices
//! into the frame it was decoded from. Encoding goes through [`OutMessage`],
//! which owns its values because the session stores and re-sends them.

use crate::dictionary::Dictionary;
use crate::tags::{self, Tag};
use crate::time::{UnixMs, UtcTimestamp};

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

    /// MsgType: the third field of anything [`decode`] accepts, so looked for there first.
    pub fn msg_type(&self) -> &'a [u8] {
        match self.fields.get(..3) {
            Some([a, b, f])
                if f.tag == tags::MSG_TYPE
                    && a.tag != tags::MSG_TYPE
                    && b.tag != tags::MSG_TYPE =>
            {
                f.value
            }
            _ => self.get(tags::MSG_TYPE).unwrap_or(b""),
        }
    }

    /// BeginString: the first field of anything [`decode`] accepts, so looked for there first.
    pub fn begin_string(&self) -> &'a [u8] {
        match self.fields.first() {
            Some(f) if f.tag == tags::BEGIN_STRING => f.value,
            _ => self.get(tags::BEGIN_STRING).unwrap_or(b""),
        }
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

/// Reads the tag of the field at `pos` and finds its `=` in one pass: Some((tag, index of
/// `=`)) exactly when [`parse_tag`] accepts the bytes from `pos` to the first `=`.
fn scan_tag(frame: &[u8], pos: usize) -> Option<(Tag, usize)> {
    let rest = frame.get(pos..)?;
    let (negative, digits_from) = match rest.first() {
        Some(b'-') => (true, 1),
        _ => (false, 0),
    };
    let mut value: i64 = 0;
    for (i, &b) in rest.iter().enumerate().skip(digits_from) {
        match b {
            b'0'..=b'9' if i - digits_from < 10 => value = value * 10 + i64::from(b - b'0'),
            b'=' if i > digits_from => {
                let value = if negative { -value } else { value };
                return Tag::try_from(value).ok().map(|tag| (tag, pos + i));
            }
            _ => return None,
        }
    }
    None
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
    // Summed in 32-bit lanes (which the compiler vectorises) a block at a time, so that no
    // lane can overflow whatever the length; only the low byte matters.
    bytes
        .chunks(1 << 20)
        .map(|block| block.iter().map(|&b| u32::from(b)).sum::<u32>())
        .fold(0u32, u32::wrapping_add) as u8
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
    decode_reusing(
        frame,
        dictionary,
        message_size_max_bytes,
        Vec::with_capacity(32),
    )
}

/// As [`decode`], with the field table built in `fields` (emptied first), whose allocation
/// a caller keeps from one message to the next with [`recycle_fields`].
pub fn decode_reusing<'a>(
    frame: &'a [u8],
    dictionary: Option<&Dictionary>,
    message_size_max_bytes: usize,
    mut fields: Vec<Field<'a>>,
) -> Result<RawMessage<'a>, DecodeError> {
    if frame.len() > message_size_max_bytes {
        return Err(DecodeError::TooLarge {
            size_bytes: frame.len(),
            size_max_bytes: message_size_max_bytes,
        });
    }
    fields.clear();
    // Byte offsets of the start of the field after BodyLength and of CheckSum.
    let mut body_start: Option<usize> = None;
    let mut checksum_start: Option<usize> = None;
    let mut pos = 0usize;
    while pos < frame.len() {
        let (tag, eq) = scan_tag(frame, pos).ok_or(DecodeError::Garbled { offset: pos })?;
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
    let leading = fields.iter().take(3).map(|f| f.tag);
    if !leading.eq([tags::BEGIN_STRING, tags::BODY_LENGTH, tags::MSG_TYPE]) {
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

/// An empty field table for a message of any lifetime, made from the allocation of one
/// whose message is done with: the table a session decodes every message into, without
/// allocating one per message. (Collecting an empty iterator of a vector into a vector of a
/// type of the same size reuses the vector's allocation; no field survives.)
pub fn recycle_fields<'b>(mut fields: Vec<Field<'_>>) -> Vec<Field<'b>> {
    fields.clear();
    fields
        .into_iter()
        .map(|f| Field {
            tag: f.tag,
            value: &[],
        })
        .collect()
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
    /// More bytes than one message may have arrived without a frame in them: a peer that
    /// sends garbage is cut at the size limit rather than read for ever.
    Garbled { skipped_bytes: usize },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge { size_bytes, size_max_bytes } => write!(
                f,
                "inbound message of at least {size_bytes} bytes exceeds the limit of {size_max_bytes} bytes"
            ),
            FrameError::Garbled { skipped_bytes } => write!(
                f,
                "garbled input: {skipped_bytes} bytes without a FIX message in them"
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
    /// Bytes discarded since the last frame (see [`FrameError::Garbled`]).
    skipped_bytes: usize,
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
            skipped_bytes: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.consumed = 0;
        self.skipped_bytes = 0;
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
            self.bytes.clear();
            self.consumed = 0;
        } else if self.consumed >= 4096 && self.consumed * 2 >= self.bytes.len() {
            self.bytes.drain(..self.consumed);
            self.consumed = 0;
        }
    }

    /// Discards `n` bytes that are no frame; too many in a row end the stream.
    fn skip(&mut self, n: usize) -> Result<(), FrameError> {
        self.consume(n);
        self.skipped_bytes += n;
        if self.skipped_bytes > self.message_size_max_bytes {
            let skipped_bytes = self.skipped_bytes;
            self.clear();
            return Err(FrameError::Garbled { skipped_bytes });
        }
        Ok(())
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
        let mut frame = Vec::new();
        Ok(self.next_frame_into(&mut frame)?.then_some(frame))
    }

    /// As [`FrameBuffer::next_frame`], but the frame replaces the contents of `frame`, whose
    /// allocation a caller keeps from one message to the next; false if more bytes are needed.
    pub fn next_frame_into(&mut self, frame: &mut Vec<u8>) -> Result<bool, FrameError> {
        loop {
            let Some(start) = find(self.view(), b"8=", 0) else {
                // Keep a trailing '8', which may begin the next message.
                let keep = usize::from(self.view().last() == Some(&b'8'));
                self.skip(self.buffered_bytes() - keep)?;
                return Ok(false);
            };
            self.skip(start)?;
            match scan_frame(self.view(), self.message_size_max_bytes) {
                Scan::Complete(end) => {
                    if end > self.message_size_max_bytes {
                        return Err(self.too_large(end));
                    }
                    frame.clear();
                    frame.extend_from_slice(&self.view()[..end]);
                    self.consume(end);
                    self.skipped_bytes = 0;
                    return Ok(true);
                }
                Scan::Incomplete => {
                    if self.buffered_bytes() > self.message_size_max_bytes {
                        return Err(self.too_large(self.buffered_bytes()));
                    }
                    return Ok(false);
                }
                Scan::TooLarge(size_bytes) => return Err(self.too_large(size_bytes)),
                Scan::Garbled => {
                    // Skip this "8=" and resynchronise on the next one.
                    self.skip(2)?;
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
///
/// The body is kept already encoded: every [`OutMessage::push`] appends
/// `tag=value<SOH>` to one byte buffer (`body_text`) and remembers where the value
/// lies, so that encoding copies the body in one piece instead of field by field.
/// Header values live in a second buffer as `(tag, start, end)` ranges, kept sorted
/// by tag as they are set, so encoding sorts nothing. Numbers have their own pushes
/// ([`OutMessage::push_u64`], [`OutMessage::push_int`]) that write digits by hand;
/// [`OutMessage::push_with`] lets a caller write any value in place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutMessage {
    pub msg_type: String,
    header: Vec<(Tag, u32, u32)>,
    header_values: Vec<u8>,
    /// Value ranges of the body fields in `body_text`, in order.
    body: Vec<(Tag, u32, u32)>,
    /// The body fields encoded, `tag=value<SOH>` each, in order.
    body_text: Vec<u8>,
}

/// Header fields and value bytes the session sets on every message, reserved up front.
const HEADER_FIELDS_TYPICAL: usize = 8;
const HEADER_VALUE_BYTES_TYPICAL: usize = 64;
/// Fields and encoded bytes an execution report's body needs, reserved up front.
const BODY_FIELDS_TYPICAL: usize = 24;
const BODY_BYTES_TYPICAL: usize = 320;

impl OutMessage {
    pub fn new(msg_type: &str) -> Self {
        OutMessage {
            msg_type: msg_type.to_string(),
            header: Vec::with_capacity(HEADER_FIELDS_TYPICAL),
            header_values: Vec::with_capacity(HEADER_VALUE_BYTES_TYPICAL),
            body: Vec::with_capacity(BODY_FIELDS_TYPICAL),
            body_text: Vec::with_capacity(BODY_BYTES_TYPICAL),
        }
    }

    fn append_header(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> (u32, u32) {
        let start = self.header_values.len() as u32;
        write(&mut self.header_values);
        (start, self.header_values.len() as u32)
    }

    fn place_header(&mut self, tag: Tag, range: (u32, u32)) {
        assert!(
            tag != tags::BEGIN_STRING
                && tag != tags::BODY_LENGTH
                && tag != tags::MSG_TYPE
                && tag != tags::CHECK_SUM,
            "the encoder owns tags 8, 9, 35 and 10"
        );
        match self.header.binary_search_by_key(&tag, |f| f.0) {
            Ok(i) => self.header[i] = (tag, range.0, range.1),
            Err(i) => self.header.insert(i, (tag, range.0, range.1)),
        }
    }

    /// Sets a header field, replacing any earlier value of the same tag.
    pub fn set_header(&mut self, tag: Tag, value: impl AsRef<[u8]>) -> &mut Self {
        let range = self.append_header(|out| out.extend_from_slice(value.as_ref()));
        self.place_header(tag, range);
        self
    }

    /// Sets a header field to a value's text, written in place.
    pub fn set_header_display(&mut self, tag: Tag, value: &dyn std::fmt::Display) -> &mut Self {
        let range = self.append_header(|out| write_display(out, value));
        self.place_header(tag, range);
        self
    }

    /// Sets a header field to a value written in place by `write`.
    pub fn set_header_with(&mut self, tag: Tag, write: impl FnOnce(&mut Vec<u8>)) -> &mut Self {
        let range = self.append_header(write);
        self.place_header(tag, range);
        self
    }

    /// Sets a header field to an unsigned number.
    pub fn set_header_u64(&mut self, tag: Tag, value: u64) -> &mut Self {
        self.set_header_with(tag, |out| write_u64(out, value))
    }

    pub fn remove_header(&mut self, tag: Tag) -> &mut Self {
        self.header.retain(|f| f.0 != tag);
        self
    }

    pub fn header_value(&self, tag: Tag) -> Option<&[u8]> {
        self.header
            .iter()
            .find(|f| f.0 == tag)
            .map(|f| &self.header_values[f.1 as usize..f.2 as usize])
    }

    fn body_value_of(&self, f: &(Tag, u32, u32)) -> &[u8] {
        &self.body_text[f.1 as usize..f.2 as usize]
    }

    /// Appends a body field whose value `write` appends to the buffer it is given.
    pub fn push_with(&mut self, tag: Tag, write: impl FnOnce(&mut Vec<u8>)) -> &mut Self {
        write_tag(&mut self.body_text, tag);
        self.body_text.push(b'=');
        let start = self.body_text.len() as u32;
        write(&mut self.body_text);
        let end = self.body_text.len() as u32;
        self.body_text.push(SOH);
        self.body.push((tag, start, end));
        self
    }

    /// Appends a body field.
    pub fn push(&mut self, tag: Tag, value: impl AsRef<[u8]>) -> &mut Self {
        self.push_with(tag, |out| out.extend_from_slice(value.as_ref()))
    }

    /// Appends a body field whose value is `value`'s text, written in place (no
    /// intermediate `String`).
    pub fn push_display(&mut self, tag: Tag, value: &dyn std::fmt::Display) -> &mut Self {
        self.push_with(tag, |out| write_display(out, value))
    }

    /// Appends a body field holding an unsigned number, its digits written by hand.
    pub fn push_u64(&mut self, tag: Tag, value: u64) -> &mut Self {
        self.push_with(tag, |out| write_u64(out, value))
    }

    /// Appends a body field holding a signed number, its digits written by hand.
    pub fn push_int(&mut self, tag: Tag, value: i128) -> &mut Self {
        self.push_with(tag, |out| write_i128(out, value))
    }

    pub fn body_value(&self, tag: Tag) -> Option<&[u8]> {
        self.body
            .iter()
            .find(|f| f.0 == tag)
            .map(|f| self.body_value_of(f))
    }

    /// The body fields in order, as (tag, value).
    pub fn body_fields(&self) -> impl Iterator<Item = (Tag, &[u8])> + '_ {
        self.body.iter().map(|f| (f.0, self.body_value_of(f)))
    }

    /// Keeps only the body fields whose tag passes `keep`.
    pub fn retain_body(&mut self, mut keep: impl FnMut(Tag) -> bool) -> &mut Self {
        if self.body.iter().all(|f| keep(f.0)) {
            return self;
        }
        let old_text = std::mem::take(&mut self.body_text);
        let old_body = std::mem::take(&mut self.body);
        for (tag, start, end) in old_body {
            if keep(tag) {
                self.push(tag, &old_text[start as usize..end as usize]);
            }
        }
        self
    }

    /// Encodes the message with BodyLength and CheckSum computed.
    pub fn encode(&self, begin_string: &str) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(begin_string, &mut out);
        out
    }

    /// Appends the encoded message to `out`: the body length is summed first so
    /// that everything is written once, in place; the body is copied in one piece.
    pub fn encode_into(&self, begin_string: &str, out: &mut Vec<u8>) {
        self.encode_merged_into(begin_string, &[], out);
    }

    /// Appends the message encoded as the session sends it: the header fields of `session`
    /// (MsgSeqNum, SenderCompID, SendingTime, TargetCompID) written in their place among
    /// the message's own header fields, each replacing a field of the same tag, exactly as
    /// setting them with [`OutMessage::set_header`] and then encoding would. The message is
    /// not changed, so a caller can keep one and reuse it for the next message.
    pub fn encode_with_session_into(
        &self,
        begin_string: &str,
        session: &SessionHeader<'_>,
        out: &mut Vec<u8>,
    ) {
        let mut seq_digits = [0u8; 20];
        let seq = digits_u64(session.msg_seq_num, &mut seq_digits);
        let time_fixed;
        let time_text;
        let sending_time: &[u8] = match UtcTimestamp(session.sending_time_ms).fixed_width() {
            Some(b) => {
                time_fixed = b;
                &time_fixed
            }
            None => {
                time_text = UtcTimestamp(session.sending_time_ms).to_string();
                time_text.as_bytes()
            }
        };
        if self.header.is_empty() {
            let session_only = SessionFields {
                seq,
                sender: session.sender_comp_id,
                sending_time,
                target: session.target_comp_id,
            };
            self.encode_session_only_into(begin_string, &session_only, out);
            return;
        }
        // In ascending tag order, as the merge below requires.
        let fields: [(Tag, &[u8]); 4] = [
            (tags::MSG_SEQ_NUM, seq),
            (tags::SENDER_COMP_ID, session.sender_comp_id),
            (tags::SENDING_TIME, sending_time),
            (tags::TARGET_COMP_ID, session.target_comp_id),
        ];
        self.encode_merged_into(begin_string, &fields, out);
    }

    /// Calls `f` for every header field in ascending tag order: the message's own, merged
    /// with `extra` (sorted by tag), whose value wins where both have a tag.
    fn for_each_header(&self, extra: &[(Tag, &[u8])], mut f: impl FnMut(Tag, &[u8])) {
        let mut own = self.header.iter().peekable();
        let mut extra = extra.iter().peekable();
        loop {
            match (own.peek(), extra.peek()) {
                (Some(o), Some(x)) if o.0 < x.0 => {
                    f(o.0, &self.header_values[o.1 as usize..o.2 as usize]);
                    own.next();
                }
                (Some(o), Some(x)) if o.0 == x.0 => {
                    f(x.0, x.1);
                    own.next();
                    extra.next();
                }
                (_, Some(x)) => {
                    f(x.0, x.1);
                    extra.next();
                }
                (Some(o), None) => {
                    f(o.0, &self.header_values[o.1 as usize..o.2 as usize]);
                    own.next();
                }
                (None, None) => break,
            }
        }
    }

    /// The general encoder: the body length is summed first so that everything is written once,
    /// in place; the body is copied in one piece.
    fn encode_merged_into(&self, begin_string: &str, extra: &[(Tag, &[u8])], out: &mut Vec<u8>) {
        debug_assert!(extra.windows(2).all(|w| w[0].0 < w[1].0));
        let field_len = |tag: Tag, value_len: usize| tag_digits(tag) + value_len + 2;
        let mut body_len = field_len(tags::MSG_TYPE, self.msg_type.len()) + self.body_text.len();
        self.for_each_header(extra, |tag, value| body_len += field_len(tag, value.len()));
        let begin = out.len();
        out.reserve(body_len + begin_string.len() + 24);
        write_field(out, tags::BEGIN_STRING, begin_string.as_bytes());
        write_tag(out, tags::BODY_LENGTH);
        out.push(b'=');
        write_u64(out, body_len as u64);
        out.push(SOH);
        write_field(out, tags::MSG_TYPE, self.msg_type.as_bytes());
        self.for_each_header(extra, |tag, value| write_field(out, tag, value));
        out.extend_from_slice(&self.body_text);
        write_checksum(out, begin);
    }

    /// [`OutMessage::encode_with_session_into`] for a message with no header fields of its
    /// own (every report the gateway sends): the header is the four session fields in tag
    /// order, so nothing is merged, and the envelope's and header's tags are constants, each
    /// written with its neighbours' separators in one copy. The bytes equal what the merging
    /// encoder writes (a property test checks it).
    fn encode_session_only_into(
        &self,
        begin_string: &str,
        session: &SessionFields<'_>,
        out: &mut Vec<u8>,
    ) {
        const MSG_TYPE: &[u8] = b"\x0135=";
        const MSG_SEQ_NUM: &[u8] = b"\x0134=";
        const SENDER: &[u8] = b"\x0149=";
        const SENDING_TIME: &[u8] = b"\x0152=";
        const TARGET: &[u8] = b"\x0156=";
        // From MsgType's tag to the SOH before the body: five fields of `tag=value<SOH>`.
        let header_len = 5 * 4
            + self.msg_type.len()
            + session.seq.len()
            + session.sender.len()
            + session.sending_time.len()
            + session.target.len();
        let body_len = header_len + self.body_text.len();
        let begin = out.len();
        out.reserve(body_len + begin_string.len() + 24);
        out.extend_from_slice(b"8=");
        out.extend_from_slice(begin_string.as_bytes());
        out.extend_from_slice(b"\x019=");
        write_u64(out, body_len as u64);
        for (tag, value) in [
            (MSG_TYPE, self.msg_type.as_bytes()),
            (MSG_SEQ_NUM, session.seq),
            (SENDER, session.sender),
            (SENDING_TIME, session.sending_time),
            (TARGET, session.target),
        ] {
            out.extend_from_slice(tag);
            out.extend_from_slice(value);
        }
        out.push(SOH);
        out.extend_from_slice(&self.body_text);
        write_checksum(out, begin);
    }

    /// Empties the message for reuse as a message of `msg_type`, keeping its buffers.
    pub fn reset(&mut self, msg_type: &str) -> &mut Self {
        self.msg_type.clear();
        self.msg_type.push_str(msg_type);
        self.header.clear();
        self.header_values.clear();
        self.body.clear();
        self.body_text.clear();
        self
    }
}

/// CheckSum (10) of the bytes from `begin` on, appended as three digits.
fn write_checksum(out: &mut Vec<u8>, begin: usize) {
    let sum = checksum(&out[begin..]);
    out.extend_from_slice(&[
        b'1',
        b'0',
        b'=',
        b'0' + sum / 100,
        b'0' + sum / 10 % 10,
        b'0' + sum % 10,
        SOH,
    ]);
}

/// The session's header values as written, for [`OutMessage::encode_session_only_into`].
struct SessionFields<'a> {
    seq: &'a [u8],
    sender: &'a [u8],
    sending_time: &'a [u8],
    target: &'a [u8],
}

/// The header fields a session writes on every message it sends, for
/// [`OutMessage::encode_with_session_into`].
#[derive(Clone, Copy, Debug)]
pub struct SessionHeader<'a> {
    pub sender_comp_id: &'a [u8],
    pub target_comp_id: &'a [u8],
    pub msg_seq_num: u64,
    pub sending_time_ms: UnixMs,
}

/// The decimal digits of `v`, written at the end of `buf`.
fn digits_u64(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

fn write_display(out: &mut Vec<u8>, value: &dyn std::fmt::Display) {
    use std::io::Write as _;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{value}");
}

fn tag_digits(tag: Tag) -> usize {
    let mut n = 1 + usize::from(tag < 0);
    let mut t = tag.unsigned_abs() / 10;
    while t > 0 {
        n += 1;
        t /= 10;
    }
    n
}

/// Appends the decimal digits of `v`.
pub fn write_u64(out: &mut Vec<u8>, v: u64) {
    // The common small values take one fixed-size copy each, which the compiler inlines.
    if v < 10 {
        out.push(b'0' + v as u8);
        return;
    }
    if v < 100 {
        out.extend_from_slice(&[b'0' + (v / 10) as u8, b'0' + (v % 10) as u8]);
        return;
    }
    // Three and four digits: every tag of an execution report but the two-digit ones.
    if v < 1000 {
        out.extend_from_slice(&[
            b'0' + (v / 100) as u8,
            b'0' + (v / 10 % 10) as u8,
            b'0' + (v % 10) as u8,
        ]);
        return;
    }
    if v < 10_000 {
        out.extend_from_slice(&[
            b'0' + (v / 1000) as u8,
            b'0' + (v / 100 % 10) as u8,
            b'0' + (v / 10 % 10) as u8,
            b'0' + (v % 10) as u8,
        ]);
        return;
    }
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = v;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Appends the decimal digits of `v`, with a minus sign if negative.
pub fn write_i128(out: &mut Vec<u8>, v: i128) {
    if v < 0 {
        out.push(b'-');
    }
    let abs = v.unsigned_abs();
    match u64::try_from(abs) {
        Ok(small) => write_u64(out, small),
        Err(_) => {
            let mut digits = [0u8; 40];
            let mut i = digits.len();
            let mut v = abs;
            loop {
                i -= 1;
                digits[i] = b'0' + (v % 10) as u8;
                v /= 10;
                if v == 0 {
                    break;
                }
            }
            out.extend_from_slice(&digits[i..]);
        }
    }
}

fn write_tag(out: &mut Vec<u8>, tag: Tag) {
    if tag < 0 {
        out.push(b'-');
    }
    write_u64(out, u64::from(tag.unsigned_abs()));
}

fn write_field(out: &mut Vec<u8>, tag: Tag, value: &[u8]) {
    write_tag(out, tag);
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

    proptest::proptest! {
        /// The one-pass tag reader accepts and reads exactly what finding `=` and then
        /// [`parse_tag`] did.
        #[test]
        fn scan_tag_agrees_with_find_then_parse(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![b'0'..=b'9', proptest::strategy::Just(b'-'),
                    proptest::strategy::Just(b'='), proptest::strategy::Just(SOH), 0u8..=255],
                0..16),
            pos in 0usize..4,
        ) {
            let expected = find_byte(&bytes, b'=', pos)
                .and_then(|eq| parse_tag(&bytes[pos..eq]).map(|tag| (tag, eq)));
            proptest::prop_assert_eq!(scan_tag(&bytes, pos), expected);
        }

        /// Numbers written by hand read back as the standard formatting writes them.
        #[test]
        fn written_integers_equal_the_formatted_ones(v in proptest::num::i128::ANY, small in 0u64..100_000) {
            let mut out = Vec::new();
            write_i128(&mut out, v);
            proptest::prop_assert_eq!(out, v.to_string().into_bytes());
            let mut out = Vec::new();
            write_u64(&mut out, small);
            proptest::prop_assert_eq!(out, small.to_string().into_bytes());
        }
    }

    /// The encoder as it was before the body was kept encoded: field by field. What a
    /// message encodes to must not have changed.
    fn encode_field_by_field(m: &OutMessage, begin_string: &str) -> Vec<u8> {
        let mut fields: Vec<(Tag, Vec<u8>)> = vec![(35, m.msg_type.as_bytes().to_vec())];
        for f in &m.header {
            fields.push((f.0, m.header_values[f.1 as usize..f.2 as usize].to_vec()));
        }
        fields.extend(m.body_fields().map(|(t, v)| (t, v.to_vec())));
        let body: Vec<u8> = fields
            .iter()
            .flat_map(|(t, v)| [format!("{t}=").into_bytes(), v.clone(), vec![SOH]].concat())
            .collect();
        let mut out = format!("8={begin_string}\x019={}\x01", body.len()).into_bytes();
        out.extend_from_slice(&body);
        let sum = out.iter().fold(0u8, |a, &b| a.wrapping_add(b));
        out.extend_from_slice(format!("10={sum:03}\x01").as_bytes());
        out
    }

    proptest::proptest! {
        #[test]
        fn encoding_equals_the_field_by_field_encoder(
            header in proptest::collection::vec((proptest::prop_oneof![
                proptest::strategy::Just(34), proptest::strategy::Just(49),
                proptest::strategy::Just(52), proptest::strategy::Just(56)],
                proptest::collection::vec(0x20u8..0x7f, 0..12)), 0..6),
            body in proptest::collection::vec((1..20_000i32, proptest::collection::vec(0x20u8..0x7f, 0..12)), 0..20),
            numbers in proptest::collection::vec((1..1000i32, proptest::num::i64::ANY), 0..4),
            drop_tag in 1..20_000i32,
        ) {
            let mut m = OutMessage::new("8");
            for (t, v) in &header {
                m.set_header(*t, v);
            }
            for (t, v) in &body {
                m.push(*t, v);
            }
            for (t, v) in &numbers {
                m.push_int(*t, i128::from(*v));
                m.push_u64(*t, v.unsigned_abs());
            }
            proptest::prop_assert_eq!(m.encode("FIX.4.4"), encode_field_by_field(&m, "FIX.4.4"));
            m.retain_body(|t| t != drop_tag);
            proptest::prop_assert!(m.body_fields().all(|(t, _)| t != drop_tag));
            proptest::prop_assert_eq!(m.encode("FIX.4.4"), encode_field_by_field(&m, "FIX.4.4"));
        }
    }

    proptest::proptest! {
        /// Encoding with the session's header fields given apart equals setting them on the
        /// message and encoding, whatever header fields the message already has (the same
        /// tags among them), and leaves the message as it was.
        #[test]
        fn encoding_with_the_session_header_equals_setting_it(
            header in proptest::collection::vec((proptest::prop_oneof![
                proptest::strategy::Just(34), proptest::strategy::Just(43),
                proptest::strategy::Just(49), proptest::strategy::Just(52),
                proptest::strategy::Just(56), proptest::strategy::Just(97),
                proptest::strategy::Just(122), proptest::strategy::Just(50)],
                proptest::collection::vec(0x20u8..0x7f, 0..12)), 0..6),
            body in proptest::collection::vec((1..20_000i32, proptest::collection::vec(0x20u8..0x7f, 0..12)), 0..8),
            seq in proptest::num::u64::ANY,
            sending_time_ms in proptest::prop_oneof![
                0i64..4_000_000_000_000, -1_000_000_000_000_000i64..1_000_000_000_000_000],
        ) {
            let mut m = OutMessage::new("8");
            for (t, v) in &header {
                m.set_header(*t, v);
            }
            for (t, v) in &body {
                m.push(*t, v);
            }
            let before = m.clone();
            let session = SessionHeader {
                sender_comp_id: b"BOURSE",
                target_comp_id: b"CLIENT",
                msg_seq_num: seq,
                sending_time_ms,
            };
            let mut out = b"left alone".to_vec();
            m.encode_with_session_into("FIX.4.4", &session, &mut out);
            proptest::prop_assert_eq!(&m, &before);
            let mut set = m.clone();
            set.set_header(tags::SENDER_COMP_ID, "BOURSE");
            set.set_header(tags::TARGET_COMP_ID, "CLIENT");
            set.set_header_u64(tags::MSG_SEQ_NUM, seq);
            set.set_header_display(tags::SENDING_TIME, &UtcTimestamp(sending_time_ms));
            let mut expected = b"left alone".to_vec();
            expected.extend_from_slice(&set.encode("FIX.4.4"));
            proptest::prop_assert_eq!(out, expected);
        }

        /// A report without header fields of its own (the gateway's every report) takes the
        /// session-only encoder; its bytes equal the merging encoder's, byte for byte.
        #[test]
        fn a_report_without_own_header_encodes_as_the_merging_encoder_does(
            msg_type in "[0-9A-Za-z]{1,2}",
            body in proptest::collection::vec((1..20_000i32, proptest::collection::vec(0x20u8..0x7f, 0..24)), 0..24),
            seq in proptest::num::u64::ANY,
            sending_time_ms in proptest::prop_oneof![
                0i64..4_000_000_000_000, -1_000_000_000_000_000i64..1_000_000_000_000_000],
            comp_ids in ("[A-Z]{1,12}", "[A-Z]{1,12}"),
        ) {
            let mut m = OutMessage::new(&msg_type);
            for (t, v) in &body {
                m.push(*t, v);
            }
            let session = SessionHeader {
                sender_comp_id: comp_ids.0.as_bytes(),
                target_comp_id: comp_ids.1.as_bytes(),
                msg_seq_num: seq,
                sending_time_ms,
            };
            let mut out = Vec::new();
            m.encode_with_session_into("FIX.4.4", &session, &mut out);
            let mut merged = Vec::new();
            let seq_text = seq.to_string();
            let time_text = UtcTimestamp(sending_time_ms).to_string();
            let fields: [(Tag, &[u8]); 4] = [
                (tags::MSG_SEQ_NUM, seq_text.as_bytes()),
                (tags::SENDER_COMP_ID, session.sender_comp_id),
                (tags::SENDING_TIME, time_text.as_bytes()),
                (tags::TARGET_COMP_ID, session.target_comp_id),
            ];
            m.encode_merged_into("FIX.4.4", &fields, &mut merged);
            proptest::prop_assert_eq!(out, merged);
        }

        /// A reset message encodes as a new one built the same way.
        #[test]
        fn a_reset_message_encodes_as_a_new_one(
            first in proptest::collection::vec((1..20_000i32, proptest::collection::vec(0x20u8..0x7f, 0..12)), 0..8),
            second in proptest::collection::vec((1..20_000i32, proptest::collection::vec(0x20u8..0x7f, 0..12)), 0..8),
        ) {
            let mut reused = OutMessage::new("D");
            reused.set_header(tags::POSS_DUP_FLAG, "Y");
            for (t, v) in &first {
                reused.push(*t, v);
            }
            reused.reset("8");
            let mut fresh = OutMessage::new("8");
            for (t, v) in &second {
                reused.push(*t, v);
                fresh.push(*t, v);
            }
            proptest::prop_assert_eq!(reused.encode("FIX.4.4"), fresh.encode("FIX.4.4"));
        }
    }

    #[test]
    fn a_recycled_field_table_keeps_its_allocation_and_decodes_as_a_new_one() {
        let a = OutMessage::new("0").encode("FIX.4.4");
        let mut m = OutMessage::new("D");
        m.push(11, "order-1").push(55, "SBER");
        let b = m.encode("FIX.4.4");
        let first = decode(&a, None, 1024).expect("valid");
        let capacity = first.fields.capacity();
        let recycled = recycle_fields(first.fields);
        assert!(recycled.is_empty());
        assert_eq!(recycled.capacity(), capacity);
        let second = decode_reusing(&b, None, 1024, recycled).expect("valid");
        assert_eq!(second.fields, decode(&b, None, 1024).expect("valid").fields);
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
    fn garbage_longer_than_a_message_ends_the_stream() {
        let mut fb = FrameBuffer::new(64);
        fb.push(&[b'x'; 60]);
        assert_eq!(fb.next_frame(), Ok(None));
        fb.push(&[b'x'; 10]);
        assert!(matches!(
            fb.next_frame(),
            Err(FrameError::Garbled { skipped_bytes: 70 })
        ));
        // A BodyLength that never ends is garbage too, whatever its digits.
        let mut fb = FrameBuffer::new(64);
        fb.push(b"8=FIX.4.4\x019=");
        fb.push(&[b'1'; 100]);
        assert!(matches!(fb.next_frame(), Err(FrameError::Garbled { .. })));
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
