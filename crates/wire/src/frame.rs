//! Framing for TCP streams: binary order entry sessions and the market data replay service.
//!
//! TCP delivers bytes, not messages, so every message travels behind a 4-byte frame header:
//!
//! | offset | size | field        | meaning                                                   |
//! |-------:|-----:|--------------|-----------------------------------------------------------|
//! | 0      | 2    | frame_bytes  | u16 little-endian, size of the whole frame, header included |
//! | 2      | 2    | encoding     | u16 little-endian, what the payload is (see [`Encoding`])  |
//!
//! The layout follows the spirit of the FIX Simple Open Framing Header, shortened to 16 bits
//! of length because no bourse frame comes near 64 KiB, and kept little-endian like the SBE
//! payload so a client needs only one byte order. The encoding type doubles as a sanity check:
//! a reader that lost its place in the stream sees a wrong encoding at once instead of
//! decoding garbage.
//!
//! [`FrameReader`] checks the header as soon as its 4 bytes have arrived, so a peer cannot make
//! a receiver buffer an oversized frame before it is refused.

use crate::sbe::MESSAGE_HEADER_BYTES;
use crate::Error;

/// Size of the frame header.
pub const FRAME_HEADER_BYTES: usize = 4;

/// No frame can be longer than its u16 length field allows.
pub const FRAME_BYTES_LIMIT: usize = u16::MAX as usize;

/// The smallest frame that can hold anything: a frame header and an SBE message header.
pub const FRAME_BYTES_MIN: usize = FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Encoding {
    /// One SBE message, little-endian. The value is the one FIXP's framing header assigns to
    /// little-endian SBE 1.0.
    SbeMessage = 0xEB50,
    /// One market data packet exactly as it was sent by UDP (packet header first); used by the
    /// replay service to resend packets.
    MarketDataPacket = 0xEB51,
}

impl Encoding {
    /// The encoding with this wire value, if any.
    pub fn from_u16(value: u16) -> Option<Self> {
        match value {
            0xEB50 => Some(Encoding::SbeMessage),
            0xEB51 => Some(Encoding::MarketDataPacket),
            _ => None,
        }
    }
}

/// One complete frame found in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame<'a> {
    pub encoding: Encoding,
    /// The bytes after the frame header.
    pub payload: &'a [u8],
    /// Size of the frame, header included: how many bytes the caller should consume.
    pub frame_bytes: usize,
}

/// Finds frames in the bytes read from a TCP stream, refusing frames above a size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameReader {
    frame_bytes_max: usize,
}

impl FrameReader {
    /// A reader that refuses frames longer than `frame_bytes_max`. The limit is clamped to
    /// the range a frame header can express.
    pub fn new(frame_bytes_max: usize) -> Self {
        Self {
            frame_bytes_max: frame_bytes_max.clamp(FRAME_BYTES_MIN, FRAME_BYTES_LIMIT),
        }
    }

    /// The size limit in force.
    pub fn frame_bytes_max(&self) -> usize {
        self.frame_bytes_max
    }

    /// Looks for a frame at the start of `buf`.
    ///
    /// Returns `Ok(None)` while more bytes are needed, `Ok(Some(frame))` when a whole frame is
    /// there, and an error as soon as the header is known to be bad. After an error the
    /// stream's framing can no longer be trusted; the session should be terminated.
    pub fn next_frame<'a>(&self, buf: &'a [u8]) -> Result<Option<RawFrame<'a>>, Error> {
        let Some(header) = buf.get(..FRAME_HEADER_BYTES) else {
            return Ok(None);
        };
        let frame_bytes = usize::from(u16::from_le_bytes([header[0], header[1]]));
        let encoding_value = u16::from_le_bytes([header[2], header[3]]);
        if frame_bytes < FRAME_BYTES_MIN {
            return Err(Error::FrameTooSmall {
                frame_bytes,
                frame_bytes_min: FRAME_BYTES_MIN,
            });
        }
        if frame_bytes > self.frame_bytes_max {
            return Err(Error::FrameTooLarge {
                frame_bytes,
                frame_bytes_max: self.frame_bytes_max,
            });
        }
        let encoding = Encoding::from_u16(encoding_value).ok_or(Error::UnknownEncoding {
            encoding: encoding_value,
        })?;
        let Some(payload) = buf.get(FRAME_HEADER_BYTES..frame_bytes) else {
            return Ok(None);
        };
        Ok(Some(RawFrame {
            encoding,
            payload,
            frame_bytes,
        }))
    }

    /// Like [`FrameReader::next_frame`] for a buffer that must hold exactly one whole frame
    /// (a test vector, a captured message): missing bytes are [`Error::Truncated`] and extra
    /// bytes are [`Error::TrailingBytes`].
    pub fn exact_frame<'a>(&self, buf: &'a [u8]) -> Result<RawFrame<'a>, Error> {
        match self.next_frame(buf)? {
            None => {
                let needed_bytes = match buf.get(..2) {
                    Some(len) => usize::from(u16::from_le_bytes([len[0], len[1]])),
                    None => FRAME_HEADER_BYTES,
                };
                Err(Error::Truncated {
                    needed_bytes: needed_bytes.max(FRAME_HEADER_BYTES),
                    available_bytes: buf.len(),
                })
            }
            Some(frame) if frame.frame_bytes < buf.len() => Err(Error::TrailingBytes {
                trailing_bytes: buf.len() - frame.frame_bytes,
            }),
            Some(frame) => Ok(frame),
        }
    }
}

/// Writes a frame header at the start of `buf` for a payload of `payload_bytes` that the caller
/// has already placed (or will place) at `buf[FRAME_HEADER_BYTES..]`. Returns the frame size.
pub fn write_frame_header(
    buf: &mut [u8],
    encoding: Encoding,
    payload_bytes: usize,
) -> Result<usize, Error> {
    let frame_bytes = FRAME_HEADER_BYTES + payload_bytes;
    let frame_len = u16::try_from(frame_bytes).map_err(|_| Error::FrameTooLarge {
        frame_bytes,
        frame_bytes_max: FRAME_BYTES_LIMIT,
    })?;
    let available_bytes = buf.len();
    let header = buf
        .get_mut(..FRAME_HEADER_BYTES)
        .ok_or(Error::BufferTooSmall {
            needed_bytes: FRAME_HEADER_BYTES,
            available_bytes,
        })?;
    header[0..2].copy_from_slice(&frame_len.to_le_bytes());
    header[2..4].copy_from_slice(&(encoding as u16).to_le_bytes());
    Ok(frame_bytes)
}

/// Encodes one SBE message as a frame at the start of `buf` and returns the frame size.
///
/// `fill` receives the generated encoder positioned on the root block; see
/// [`crate::sbe::encode_message`] for what it may and may not do.
pub fn encode_frame<'a, E, F>(buf: &'a mut [u8], fill: F) -> Result<usize, Error>
where
    E: crate::sbe::MessageEncoder<'a>,
    F: FnOnce(E) -> E,
{
    let available_bytes = buf.len();
    if available_bytes < FRAME_HEADER_BYTES {
        return Err(Error::BufferTooSmall {
            needed_bytes: FRAME_HEADER_BYTES,
            available_bytes,
        });
    }
    let (header, payload) = buf.split_at_mut(FRAME_HEADER_BYTES);
    let message_bytes = crate::sbe::encode_message::<E, F>(payload, fill)?;
    write_frame_header(header, Encoding::SbeMessage, message_bytes)
}
