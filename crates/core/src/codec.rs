//! The binary forms of the core's language: a small little-endian [`Writer`] and [`Reader`],
//! and on them the one encoding of a [`crate::Command`] ([`encode_command`], `command`) and
//! of an event list ([`encode_events`], `event`).
//!
//! Snapshots must be deterministic byte for byte (their hash is the state hash), compact (a
//! core may hold millions of accounts), and safe to read from a damaged file; commands and
//! events cross the network and the journal. So every read is bounds-checked, every length and
//! count is checked against a limit and against the bytes left before anything is allocated,
//! and damage gives a [`DecodeError`], never a panic.

use std::fmt;

mod command;
mod event;

pub use command::{
    check_command_form, decode_command, encode_command, encode_command_into,
    COMMAND_SIZE_BYTES_MAX, SYMBOL_CODEC_BYTES_MAX,
};
pub use event::{
    decode_event, decode_events, decode_events_into, encode_events, encode_events_into,
    EVENTS_SIZE_BYTES_MAX,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    pub offset: usize,
    pub what: &'static str,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.what, self.offset)
    }
}

impl std::error::Error for DecodeError {}

/// Appends little-endian values to a byte vector.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(bytes: usize) -> Writer {
        Writer {
            buf: Vec::with_capacity(bytes),
        }
    }
    #[inline]
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    #[inline]
    pub fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }
    #[inline]
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub fn i128(&mut self, v: i128) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    /// A length-prefixed byte string.
    pub fn bytes(&mut self, v: &[u8]) {
        self.u32(u32::try_from(v.len()).expect("snapshot byte string over 4 GiB"));
        self.buf.extend_from_slice(v);
    }
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads little-endian values from a byte slice, checking every bound.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }
    pub fn offset(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    #[cold]
    pub fn error(&self, what: &'static str) -> DecodeError {
        DecodeError {
            offset: self.pos,
            what,
        }
    }
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(self.error("unexpected end of data"));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    // The readers below are inlined into their callers, in this crate and others: every
    // command of every log entry is decoded on every replica and again on replay, and called
    // out of line once per field they cost about three times as many instructions.
    #[inline(always)]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        match self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.first_chunk::<N>())
        {
            Some(a) => {
                self.pos += N;
                Ok(*a)
            }
            None => Err(self.error("unexpected end of data")),
        }
    }
    #[inline(always)]
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    /// One byte read as an index into `values` (the enum codes of the binary forms).
    #[inline(always)]
    pub fn code<T: Copy>(&mut self, values: &[T], what: &'static str) -> Result<T, DecodeError> {
        let b = self.u8()? as usize;
        match values.get(b) {
            Some(v) => Ok(*v),
            None => Err(self.error(what)),
        }
    }
    #[inline(always)]
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.error("invalid boolean")),
        }
    }
    #[inline(always)]
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    pub fn i128(&mut self) -> Result<i128, DecodeError> {
        Ok(i128::from_le_bytes(self.array()?))
    }
    /// A length-prefixed byte string of at most `len_max` bytes.
    #[inline]
    pub fn bytes(&mut self, len_max: usize) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        if len > len_max {
            return Err(self.error("byte string longer than allowed"));
        }
        self.take(len)
    }
    /// The next `n` bytes as they are (a length the caller read and checked itself).
    #[inline]
    pub fn raw(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        self.take(n)
    }
    /// A count of items that each take at least `item_bytes_min` bytes: refused if the rest of
    /// the data could not hold that many, so a damaged count cannot make us allocate wildly.
    pub fn count(&mut self, item_bytes_min: usize) -> Result<usize, DecodeError> {
        let n = self.u64()?;
        let max = self.remaining() / item_bytes_min.max(1);
        if n as u128 > max as u128 {
            return Err(self.error("item count larger than the data"));
        }
        Ok(n as usize)
    }
    pub fn expect_end(&self) -> Result<(), DecodeError> {
        if self.remaining() != 0 {
            return Err(self.error("trailing bytes"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_short_data_is_an_error() {
        let mut w = Writer::default();
        w.u8(1);
        w.u16(2);
        w.u32(3);
        w.u64(4);
        w.i64(-5);
        w.i128(-6);
        w.bool(true);
        w.bytes(b"abc");
        let buf = w.finish();
        let mut r = Reader::new(&buf);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(2));
        assert_eq!(r.u32(), Ok(3));
        assert_eq!(r.u64(), Ok(4));
        assert_eq!(r.i64(), Ok(-5));
        assert_eq!(r.i128(), Ok(-6));
        assert_eq!(r.bool(), Ok(true));
        assert_eq!(r.bytes(10), Ok(&b"abc"[..]));
        assert!(r.expect_end().is_ok());
        assert!(r.u8().is_err());
        let mut r = Reader::new(&buf[..4]);
        r.u8().unwrap();
        assert!(r.u32().is_err());
    }
}
