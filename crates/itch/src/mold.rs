//! MoldUDP64: the framing that carries ITCH messages in UDP datagrams, and its retransmission
//! requests.
//!
//! A downstream packet is a 20-byte header (session, ten ASCII bytes; the sequence number of
//! its first message, u64; the message count, u16) followed by that many message blocks, each
//! a u16 length and the message. A packet with no messages is a heartbeat (its sequence
//! number is the next one to come); a count of 0xFFFF ends the session. A request, sent to the
//! retransmission server, is the same 20-byte header naming the first sequence number wanted
//! and how many.

use std::fmt;

/// Bytes of the header of every packet and of a request.
pub const HEADER_BYTES: usize = 20;
/// The message count that marks the end of a session.
pub const END_OF_SESSION: u16 = 0xFFFF;
/// The largest UDP payload bourse sends by default: an Ethernet MTU of 1,500 less the IPv4 and
/// UDP headers.
pub const PACKET_BYTES_DEFAULT: usize = 1_472;
/// The smallest packet size accepted: a header and the largest message.
pub const PACKET_BYTES_MIN: usize = HEADER_BYTES + 2 + crate::msg::MESSAGE_BYTES_MAX;
/// Largest packet size accepted (a UDP datagram on loopback).
pub const PACKET_BYTES_MAX: usize = 65_507;

/// A MoldUDP64 session name: ten ASCII bytes, space-padded.
pub type Session = [u8; 10];

/// A session name from text (at most ten printable ASCII characters).
pub fn session_of(name: &str) -> Result<Session, String> {
    if name.len() > 10 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "MoldUDP64 session {name:?} must be at most 10 printable ASCII characters"
        ));
    }
    let mut s = [b' '; 10];
    s[..name.len()].copy_from_slice(name.as_bytes());
    Ok(s)
}

/// A packet's header (and a request's: the same fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketHeader {
    pub session: Session,
    pub sequence: u64,
    pub count: u16,
}

impl PacketHeader {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.session);
        out.extend_from_slice(&self.sequence.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
    }

    fn read(bytes: &[u8]) -> Result<PacketHeader, FrameError> {
        if bytes.len() < HEADER_BYTES {
            return Err(FrameError::Short(bytes.len()));
        }
        let mut session = [0; 10];
        session.copy_from_slice(&bytes[..10]);
        let mut seq = [0; 8];
        seq.copy_from_slice(&bytes[10..18]);
        Ok(PacketHeader {
            session,
            sequence: u64::from_be_bytes(seq),
            count: u16::from_be_bytes([bytes[18], bytes[19]]),
        })
    }

    /// A heartbeat carries no messages.
    pub fn is_heartbeat(&self) -> bool {
        self.count == 0
    }

    pub fn is_end_of_session(&self) -> bool {
        self.count == END_OF_SESSION
    }
}

/// Why a datagram is not a MoldUDP64 packet or request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the 20-byte header.
    Short(usize),
    /// A message block runs past the end of the datagram (its index is given).
    BlockOverrun { block: u16 },
    /// Bytes left after the last counted message block.
    Trailing(usize),
    /// An end-of-session packet or a request with bytes after its header.
    Extra(usize),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FrameError::Short(n) => {
                write!(
                    f,
                    "MoldUDP64 datagram of {n} bytes is shorter than its header"
                )
            }
            FrameError::BlockOverrun { block } => {
                write!(f, "MoldUDP64 message block {block} runs past the datagram")
            }
            FrameError::Trailing(n) => {
                write!(f, "{n} bytes follow the last MoldUDP64 message block")
            }
            FrameError::Extra(n) => write!(f, "{n} bytes follow a header that takes none"),
        }
    }
}

impl std::error::Error for FrameError {}

/// A checked downstream packet: every block lies inside the datagram.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    pub header: PacketHeader,
    blocks: &'a [u8],
}

impl<'a> Packet<'a> {
    /// Checks a datagram's framing (not the messages inside).
    pub fn parse(bytes: &'a [u8]) -> Result<Packet<'a>, FrameError> {
        let header = PacketHeader::read(bytes)?;
        let blocks = &bytes[HEADER_BYTES..];
        if header.is_end_of_session() {
            if !blocks.is_empty() {
                return Err(FrameError::Extra(blocks.len()));
            }
            return Ok(Packet { header, blocks });
        }
        let mut at = 0usize;
        for block in 0..header.count {
            let len = blocks
                .get(at..at + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
                .ok_or(FrameError::BlockOverrun { block })?;
            if at + 2 + len > blocks.len() {
                return Err(FrameError::BlockOverrun { block });
            }
            at += 2 + len;
        }
        if at != blocks.len() {
            return Err(FrameError::Trailing(blocks.len() - at));
        }
        Ok(Packet { header, blocks })
    }

    /// The messages with their sequence numbers, in order.
    pub fn messages(&self) -> impl Iterator<Item = (u64, &'a [u8])> + 'a {
        let count = if self.header.is_end_of_session() {
            0
        } else {
            self.header.count
        };
        let first = self.header.sequence;
        let mut rest = self.blocks;
        (0..count).map(move |k| {
            let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
            let m = &rest[2..2 + len];
            rest = &rest[2 + len..];
            (first + u64::from(k), m)
        })
    }
}

/// Reads a retransmission request (exactly a header).
pub fn parse_request(bytes: &[u8]) -> Result<PacketHeader, FrameError> {
    let h = PacketHeader::read(bytes)?;
    if bytes.len() != HEADER_BYTES {
        return Err(FrameError::Extra(bytes.len() - HEADER_BYTES));
    }
    Ok(h)
}

/// Builds downstream packets up to a size limit: messages are appended while they fit.
#[derive(Debug)]
pub struct PacketBuilder {
    session: Session,
    packet_bytes_max: usize,
    buf: Vec<u8>,
    first: u64,
    count: u16,
}

impl PacketBuilder {
    /// `packet_bytes_max` must lie within [`PACKET_BYTES_MIN`]..=[`PACKET_BYTES_MAX`].
    pub fn new(session: Session, packet_bytes_max: usize) -> Result<PacketBuilder, String> {
        if !(PACKET_BYTES_MIN..=PACKET_BYTES_MAX).contains(&packet_bytes_max) {
            return Err(format!(
                "MoldUDP64 packet size {packet_bytes_max} is outside \
                 {PACKET_BYTES_MIN}..={PACKET_BYTES_MAX} bytes"
            ));
        }
        Ok(PacketBuilder {
            session,
            packet_bytes_max,
            buf: Vec::with_capacity(packet_bytes_max),
            first: 0,
            count: 0,
        })
    }

    pub fn session(&self) -> Session {
        self.session
    }

    /// Whether a message of `len` bytes still fits in the open packet.
    pub fn fits(&self, len: usize) -> bool {
        let used = if self.count == 0 {
            HEADER_BYTES
        } else {
            self.buf.len()
        };
        used + 2 + len <= self.packet_bytes_max && self.count < END_OF_SESSION - 1
    }

    /// Appends a message numbered `sequence` (the caller checked [`PacketBuilder::fits`] and
    /// numbers consecutively within a packet).
    pub fn push(&mut self, sequence: u64, message: &[u8]) {
        if self.count == 0 {
            self.buf.clear();
            self.first = sequence;
            PacketHeader {
                session: self.session,
                sequence,
                count: 0,
            }
            .encode(&mut self.buf);
        }
        debug_assert_eq!(sequence, self.first + u64::from(self.count));
        self.buf
            .extend_from_slice(&(message.len() as u16).to_be_bytes());
        self.buf.extend_from_slice(message);
        self.count += 1;
        self.buf[18..20].copy_from_slice(&self.count.to_be_bytes());
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The open packet's bytes; the builder starts a new one at the next push.
    pub fn take(&mut self) -> Option<&[u8]> {
        if self.count == 0 {
            return None;
        }
        self.count = 0;
        Some(&self.buf)
    }

    /// A packet with no messages: a heartbeat whose sequence number is the next to come, or
    /// with `end` the end of the session.
    pub fn empty_packet(&self, next_sequence: u64, end: bool, out: &mut Vec<u8>) {
        out.clear();
        PacketHeader {
            session: self.session,
            sequence: next_sequence,
            count: if end { END_OF_SESSION } else { 0 },
        }
        .encode(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn built_packets_parse_back_message_for_message(
            messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..45), 1..80),
            first in 1u64..1_000_000,
            size in PACKET_BYTES_MIN..600usize,
        ) {
            let mut b = PacketBuilder::new(session_of("TEST").unwrap(), size).unwrap();
            let mut got = Vec::new();
            for (seq, m) in (first..).zip(messages.iter()) {
                if !b.fits(m.len()) {
                    let p = b.take().unwrap().to_vec();
                    prop_assert!(p.len() <= size);
                    got.extend(Packet::parse(&p).unwrap().messages().map(|(s, m)| (s, m.to_vec())));
                }
                b.push(seq, m);
            }
            let p = b.take().unwrap().to_vec();
            got.extend(Packet::parse(&p).unwrap().messages().map(|(s, m)| (s, m.to_vec())));
            let want: Vec<_> = messages.iter().cloned().enumerate().map(|(k, m)| (first + k as u64, m)).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn any_bytes_parse_or_are_refused_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(p) = Packet::parse(&bytes) {
                let total: usize = p.messages().map(|(_, m)| m.len() + 2).sum();
                prop_assert_eq!(total + HEADER_BYTES, bytes.len());
            }
            let _ = parse_request(&bytes);
        }
    }

    #[test]
    fn heartbeats_end_of_session_and_bad_frames_are_told_apart() {
        let b = PacketBuilder::new(session_of("S1").unwrap(), 200).unwrap();
        let mut hb = Vec::new();
        b.empty_packet(42, false, &mut hb);
        let p = Packet::parse(&hb).unwrap();
        assert!(p.header.is_heartbeat());
        assert_eq!(p.header.sequence, 42);
        assert_eq!(&p.header.session, b"S1        ");
        b.empty_packet(42, true, &mut hb);
        assert!(Packet::parse(&hb).unwrap().header.is_end_of_session());
        hb.push(0);
        assert_eq!(Packet::parse(&hb).unwrap_err(), FrameError::Extra(1));
        assert_eq!(Packet::parse(&[0; 5]).unwrap_err(), FrameError::Short(5));
        let mut one = Vec::new();
        PacketHeader {
            session: *b"S1        ",
            sequence: 1,
            count: 1,
        }
        .encode(&mut one);
        one.extend_from_slice(&[0, 9, 1]);
        assert_eq!(
            Packet::parse(&one).unwrap_err(),
            FrameError::BlockOverrun { block: 0 }
        );
        assert!(session_of("ELEVENCHARS").is_err());
        assert!(PacketBuilder::new(*b"S1        ", 10).is_err());
    }
}
