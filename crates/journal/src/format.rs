//! On-disk layout of segments and records, and the decoder that checks them.
//!
//! A segment file is a 128-byte header followed by records:
//!
//! ```text
//! segment header (128 bytes, little endian)
//!   0..8     magic "BOURSEJS"
//!   8..12    format version (2: log entries carry commands in the core's binary form)
//!   12..16   header size in bytes (128)
//!   16..32   cluster id (u128)
//!   32..40   node id
//!   40..48   base index: the index of the first record in this file
//!   48..56   prev term: the term of record base-1 (0 if none)
//!   56..64   prev hash: the chain hash of record base-1 (the genesis hash if none)
//!   64..124  reserved, zero
//!   124..128 CRC32C of bytes 0..124
//!
//! record (32-byte frame header, then the payload)
//!   0..4     payload length in bytes (u32)
//!   4..8     CRC32C of bytes 0..4, 8..32 and the payload
//!   8..16    index
//!   16..24   term
//!   24..32   chain hash = xxh3-64(prev hash ‖ index ‖ term ‖ length ‖ payload)
//!   32..     payload
//! ```
//!
//! The CRC catches damage to one record; the chain hash catches records that are each intact
//! but do not belong together (a spliced, reordered or foreign file), and lets replicas compare
//! their logs by a single number.

use xxhash_rust::xxh3::Xxh3;

pub const SEGMENT_MAGIC: [u8; 8] = *b"BOURSEJS";
pub const FORMAT_VERSION: u32 = 2;
pub const SEGMENT_HEADER_SIZE_BYTES: u64 = 128;
pub const RECORD_HEADER_SIZE_BYTES: u64 = 32;

/// The largest payload any record may carry, whatever the configuration says. It bounds the
/// allocation a damaged length field can ask for during recovery.
pub const PAYLOAD_SIZE_BYTES_LIMIT: u32 = 64 * 1024 * 1024;
/// The largest segment file. Recovery reads a whole segment into memory, and record offsets are
/// kept as u32, so this must stay below 4 GiB.
pub const SEGMENT_SIZE_BYTES_LIMIT: u64 = 1024 * 1024 * 1024;
/// The smallest segment that can hold a header and a useful record.
pub const SEGMENT_SIZE_BYTES_MIN: u64 = 4096;

/// The identity every file of a journal carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub cluster_id: u128,
    pub node_id: u64,
}

/// The chain hash that precedes the very first record of a cluster's log. Seeding it with the
/// cluster id makes chains of different clusters differ from the first record on.
pub fn genesis_hash(cluster_id: u128) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(b"bourse-journal-genesis");
    hasher.update(&cluster_id.to_le_bytes());
    hasher.digest()
}

/// The chain hash of a record, given the chain hash of its predecessor.
pub fn chain_hash(prev_hash: u64, index: u64, term: u64, payload: &[u8]) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(&prev_hash.to_le_bytes());
    hasher.update(&index.to_le_bytes());
    hasher.update(&term.to_le_bytes());
    hasher.update(&(payload.len() as u32).to_le_bytes());
    hasher.update(payload);
    hasher.digest()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub identity: Identity,
    pub base_index: u64,
    pub prev_term: u64,
    pub prev_hash: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_SIZE_BYTES as usize] {
        let mut buf = [0u8; SEGMENT_HEADER_SIZE_BYTES as usize];
        buf[0..8].copy_from_slice(&SEGMENT_MAGIC);
        buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        buf[12..16].copy_from_slice(&(SEGMENT_HEADER_SIZE_BYTES as u32).to_le_bytes());
        buf[16..32].copy_from_slice(&self.identity.cluster_id.to_le_bytes());
        buf[32..40].copy_from_slice(&self.identity.node_id.to_le_bytes());
        buf[40..48].copy_from_slice(&self.base_index.to_le_bytes());
        buf[48..56].copy_from_slice(&self.prev_term.to_le_bytes());
        buf[56..64].copy_from_slice(&self.prev_hash.to_le_bytes());
        let crc = crc32c::crc32c(&buf[0..124]);
        buf[124..128].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Decodes and checks a header. The error is a sentence for an operator.
    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, String> {
        if bytes.len() < SEGMENT_HEADER_SIZE_BYTES as usize {
            return Err(format!(
                "file is {} bytes, shorter than the {SEGMENT_HEADER_SIZE_BYTES}-byte segment header",
                bytes.len()
            ));
        }
        if bytes[0..8] != SEGMENT_MAGIC {
            return Err("wrong magic number (expected \"BOURSEJS\")".to_string());
        }
        let version = read_u32(bytes, 8);
        if version != FORMAT_VERSION {
            return Err(format!(
                "unsupported format version {version} (this build reads version {FORMAT_VERSION})"
            ));
        }
        let stored = read_u32(bytes, 124);
        let computed = crc32c::crc32c(&bytes[0..124]);
        if stored != computed {
            return Err(format!(
                "header checksum mismatch (stored {stored:08x}, computed {computed:08x})"
            ));
        }
        let header_size = read_u32(bytes, 12);
        if u64::from(header_size) != SEGMENT_HEADER_SIZE_BYTES {
            return Err(format!("unexpected header size {header_size}"));
        }
        Ok(SegmentHeader {
            identity: Identity {
                cluster_id: read_u128(bytes, 16),
                node_id: read_u64(bytes, 32),
            },
            base_index: read_u64(bytes, 40),
            prev_term: read_u64(bytes, 48),
            prev_hash: read_u64(bytes, 56),
        })
    }
}

/// Appends the frame of one record to `out`.
pub fn encode_record(out: &mut Vec<u8>, index: u64, term: u64, hash: u64, payload: &[u8]) {
    assert!(payload.len() <= PAYLOAD_SIZE_BYTES_LIMIT as usize);
    let start = out.len();
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&term.to_le_bytes());
    out.extend_from_slice(&hash.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = record_crc(&out[start..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// CRC32C over a whole frame except its own CRC field.
fn record_crc(frame: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&frame[0..4]);
    crc32c::crc32c_append(crc, &frame[8..])
}

/// A frame whose CRC checked out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub index: u64,
    pub term: u64,
    pub hash: u64,
    pub payload_len: u32,
}

impl Frame {
    pub fn size_bytes(&self) -> u64 {
        RECORD_HEADER_SIZE_BYTES + u64::from(self.payload_len)
    }
}

/// Why a frame did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The file ends inside the frame.
    Incomplete(String),
    /// The frame is all there but wrong.
    Damaged(String),
}

impl FrameError {
    pub fn message(&self) -> &str {
        match self {
            FrameError::Incomplete(m) | FrameError::Damaged(m) => m,
        }
    }
}

/// Decodes the frame at `offset` and checks its CRC. Never panics, whatever `bytes` holds.
pub fn decode_frame(bytes: &[u8], offset: u64) -> Result<Frame, FrameError> {
    let available = (bytes.len() as u64).saturating_sub(offset);
    if available < RECORD_HEADER_SIZE_BYTES {
        return Err(FrameError::Incomplete(format!(
            "incomplete record header ({available} of {RECORD_HEADER_SIZE_BYTES} bytes)"
        )));
    }
    let start = offset as usize;
    let payload_len = read_u32(bytes, start);
    if payload_len > PAYLOAD_SIZE_BYTES_LIMIT {
        return Err(FrameError::Damaged(format!(
            "record length {payload_len} exceeds the limit of {PAYLOAD_SIZE_BYTES_LIMIT} bytes"
        )));
    }
    let size = RECORD_HEADER_SIZE_BYTES + u64::from(payload_len);
    if available < size {
        return Err(FrameError::Incomplete(format!(
            "incomplete record ({available} of {size} bytes present)"
        )));
    }
    let frame = &bytes[start..start + size as usize];
    let stored = read_u32(frame, 4);
    let computed = record_crc(frame);
    if stored != computed {
        return Err(FrameError::Damaged(format!(
            "record checksum mismatch (stored {stored:08x}, computed {computed:08x})"
        )));
    }
    Ok(Frame {
        index: read_u64(frame, 8),
        term: read_u64(frame, 16),
        hash: read_u64(frame, 24),
        payload_len,
    })
}

/// The payload of a frame already checked by [`decode_frame`].
pub fn frame_payload<'a>(bytes: &'a [u8], offset: u64, frame: &Frame) -> &'a [u8] {
    let start = (offset + RECORD_HEADER_SIZE_BYTES) as usize;
    &bytes[start..start + frame.payload_len as usize]
}

/// One record found by [`scan_records`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordMeta {
    pub index: u64,
    pub term: u64,
    pub hash: u64,
    pub offset: u64,
    pub payload_len: u32,
}

/// How a segment's record area ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// The last record ends exactly at the end of the file.
    Clean,
    /// From `offset` on the bytes are a torn write: an incomplete or damaged record with no
    /// valid record after it. Recovery may cut it away if this is the last segment.
    TornTail { offset: u64, reason: String },
    /// The record at `offset` is bad and something valid follows it, or it is intact but does
    /// not continue the chain: real damage, never to be truncated.
    Corrupt { offset: u64, reason: String },
}

#[derive(Clone, Debug)]
pub struct SegmentScan {
    pub records: Vec<RecordMeta>,
    /// Bytes of the file up to the end of the last valid record.
    pub valid_len: u64,
    pub end: ScanEnd,
}

/// Checks every record of a segment against the header's chain position. Never panics.
pub fn scan_records(bytes: &[u8], header: &SegmentHeader) -> SegmentScan {
    let mut records = Vec::new();
    let mut offset = SEGMENT_HEADER_SIZE_BYTES;
    let mut expected_index = header.base_index;
    let mut prev_term = header.prev_term;
    let mut prev_hash = header.prev_hash;
    let end = loop {
        if offset == bytes.len() as u64 {
            break ScanEnd::Clean;
        }
        let frame = match decode_frame(bytes, offset) {
            Ok(frame) => frame,
            Err(error) => match valid_frame_after(bytes, offset + 1) {
                Some(later) => {
                    break ScanEnd::Corrupt {
                        offset,
                        reason: format!(
                            "{}; a valid record follows at byte offset {later}",
                            error.message()
                        ),
                    }
                }
                None => {
                    break ScanEnd::TornTail {
                        offset,
                        reason: error.message().to_string(),
                    }
                }
            },
        };
        // From here on the record is intact, so any mismatch is a logic-level inconsistency,
        // not a torn write.
        if frame.index != expected_index {
            break ScanEnd::Corrupt {
                offset,
                reason: format!(
                    "record has index {} but index {expected_index} was expected",
                    frame.index
                ),
            };
        }
        if frame.term < prev_term {
            break ScanEnd::Corrupt {
                offset,
                reason: format!(
                    "record {} has term {} lower than its predecessor's term {prev_term}",
                    frame.index, frame.term
                ),
            };
        }
        let payload = frame_payload(bytes, offset, &frame);
        let computed = chain_hash(prev_hash, frame.index, frame.term, payload);
        if computed != frame.hash {
            break ScanEnd::Corrupt {
                offset,
                reason: format!(
                    "hash chain broken at record {} (stored {:016x}, computed {computed:016x})",
                    frame.index, frame.hash
                ),
            };
        }
        records.push(RecordMeta {
            index: frame.index,
            term: frame.term,
            hash: frame.hash,
            offset,
            payload_len: frame.payload_len,
        });
        offset += frame.size_bytes();
        expected_index = match expected_index.checked_add(1) {
            Some(next) => next,
            None => {
                break ScanEnd::Corrupt {
                    offset,
                    reason: "index overflows u64".to_string(),
                }
            }
        };
        prev_term = frame.term;
        prev_hash = frame.hash;
    };
    SegmentScan {
        records,
        valid_len: offset,
        end,
    }
}

/// Looks for any CRC-valid frame starting at or after `from`. A torn write leaves nothing
/// valid behind it, so finding one means the damage is inside data that was once complete.
fn valid_frame_after(bytes: &[u8], from: u64) -> Option<u64> {
    let len = bytes.len() as u64;
    let mut offset = from;
    while offset + RECORD_HEADER_SIZE_BYTES <= len {
        let start = offset as usize;
        let header = &bytes[start..start + RECORD_HEADER_SIZE_BYTES as usize];
        // An all-zero header is the common shape of an unwritten tail and can never carry a
        // valid CRC; skipping it keeps this scan cheap over zero-filled space.
        if header.iter().any(|&b| b != 0) && decode_frame(bytes, offset).is_ok() {
            return Some(offset);
        }
        offset += 1;
    }
    None
}

pub fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

pub fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

pub fn read_u128(bytes: &[u8], at: usize) -> u128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&bytes[at..at + 16]);
    u128::from_le_bytes(b)
}

/// The file name of the segment whose first record has `base_index`.
pub fn segment_file_name(base_index: u64) -> String {
    format!("{base_index:020}.seg")
}

/// The base index encoded in a segment file name, if `name` is one.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> SegmentHeader {
        SegmentHeader {
            identity: Identity {
                cluster_id: 7,
                node_id: 1,
            },
            base_index: 0,
            prev_term: 0,
            prev_hash: genesis_hash(7),
        }
    }

    #[test]
    fn header_round_trip() {
        let h = header();
        assert_eq!(SegmentHeader::decode(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[50] ^= 1;
        assert!(SegmentHeader::decode(&bad).is_err());
    }

    #[test]
    fn names() {
        assert_eq!(parse_segment_file_name(&segment_file_name(42)), Some(42));
        assert_eq!(parse_segment_file_name("42.seg"), None);
        assert_eq!(
            parse_segment_file_name(&segment_file_name(u64::MAX)),
            Some(u64::MAX)
        );
    }

    #[test]
    fn scan_detects_torn_and_corrupt() {
        let h = header();
        let mut bytes = h.encode().to_vec();
        let mut prev = h.prev_hash;
        for i in 0..3u64 {
            let payload = vec![i as u8; 10];
            let hash = chain_hash(prev, i, 1, &payload);
            encode_record(&mut bytes, i, 1, hash, &payload);
            prev = hash;
        }
        let scan = scan_records(&bytes, &h);
        assert_eq!(scan.records.len(), 3);
        assert_eq!(scan.end, ScanEnd::Clean);

        let mut torn = bytes.clone();
        torn.truncate(torn.len() - 3);
        let scan = scan_records(&torn, &h);
        assert_eq!(scan.records.len(), 2);
        assert!(matches!(scan.end, ScanEnd::TornTail { .. }));

        let mut flipped = bytes.clone();
        flipped[SEGMENT_HEADER_SIZE_BYTES as usize + 40] ^= 0x10;
        let scan = scan_records(&flipped, &h);
        assert_eq!(scan.records.len(), 0);
        assert!(matches!(scan.end, ScanEnd::Corrupt { offset: 128, .. }));
    }
}
