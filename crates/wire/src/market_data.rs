//! Market data (schema `schemas/bourse-market-data.xml`, id 2): UDP packet headers, a packet
//! parser that validates every message before handing out decoders, a packet writer, and a
//! decoder for the frames of the TCP replay service.
//!
//! A datagram is one packet:
//!
//! ```text
//! MarketDataPacketHeader (16) [IncrementalPacketHeader (12)] message message ...
//! ```
//!
//! where each message is an SBE header (8) plus its root block and groups. The incremental
//! header is present exactly when `MsgFlags::INCREMENTAL_PACKET` is set.
//!
//! ```
//! use bourse_wire::market_data::{self, codec, Message, MsgFlags, PacketHeader, PacketWriter};
//!
//! let mut buf = [0u8; market_data::PACKET_BYTES_MAX];
//! let header = PacketHeader {
//!     msg_seq_num: 1,
//!     msg_size: 0, // filled in by finish()
//!     msg_flags: MsgFlags(MsgFlags::LAST_FRAGMENT),
//!     sending_time_ns: 1_700_000_000_000_000_000,
//! };
//! let mut writer = PacketWriter::new(&mut buf, header, None).unwrap();
//! writer
//!     .append(|mut e: codec::heartbeat_codec::HeartbeatEncoder| {
//!         e.last_msg_seq_num(0);
//!         e
//!     })
//!     .unwrap();
//! let packet_bytes = writer.finish().unwrap();
//!
//! let packet = market_data::parse_packet(&buf[..packet_bytes]).unwrap();
//! assert_eq!(packet.header.msg_seq_num, 1);
//! assert!(matches!(packet.messages().next(), Some(Message::Heartbeat(_))));
//! ```

pub use bourse_sbe_market_data as codec;

use crate::frame::{Encoding, FrameReader, RawFrame, FRAME_HEADER_BYTES};
use crate::sbe::{schema_messages, GroupLayout, MessageEncoder};
use crate::Error;
use bourse_sbe_market_data::{aggregated_book_codec, best_prices_codec, order_book_snapshot_codec};

/// SBE schema id of market data.
pub const SCHEMA_ID: u16 = bourse_sbe_market_data::SBE_SCHEMA_ID;
/// Newest schema version this build decodes; a packet holding a newer message is refused,
/// which is how a subscriber notices a feed from the future instead of misreading it.
pub const SCHEMA_VERSION: u16 = bourse_sbe_market_data::SBE_SCHEMA_VERSION;

/// Size of MarketDataPacketHeader.
pub const PACKET_HEADER_BYTES: usize = 16;
/// Size of IncrementalPacketHeader.
pub const INCREMENTAL_HEADER_BYTES: usize = 12;
/// Largest packet a publisher sends and a subscriber accepts by default: the UDP payload of a
/// 1500-byte Ethernet frame under IPv4 (1500 - 20 IP - 8 UDP), so packets never fragment.
pub const PACKET_BYTES_MAX: usize = 1472;
/// Most messages in one packet. The order-log replays the seeds describe carry up to 128.
pub const MESSAGES_PER_PACKET_MAX: usize = 128;
/// Price levels per side in AggregatedBook.
pub const AGGREGATED_BOOK_LEVELS_PER_SIDE_MAX: u16 = 20;
/// Largest numInGroup the schema's uint8 group counter may carry (255 is reserved as null).
pub const GROUP_COUNT_MAX: u16 = 254;
/// Most packets one ReplayRequest may ask for.
pub const REPLAY_COUNT_MAX: u32 = 10_000;
/// How many recent packets per channel the replay service keeps; older gaps need a snapshot.
pub const REPLAY_HISTORY_PACKETS: u32 = 1_000_000;
/// A channel with nothing to publish sends a Heartbeat packet after this long.
pub const HEARTBEAT_INTERVAL_MS: u32 = 1_000;
/// Largest frame on a replay connection: a whole packet behind a frame header.
pub const REPLAY_FRAME_BYTES_MAX: usize = FRAME_HEADER_BYTES + PACKET_BYTES_MAX;

const GROUP_HEADER_BYTES: usize = 3;

/// Root block length of a version 1 Trade: version 2 appended `tradeType`.
pub const TRADE_V1_BLOCK_LENGTH: u16 = 29;

/// Root block lengths of older versions: version 2 appended `tradeType` to Trade (a version 1
/// Trade reads as a continuous trade); no other template changed.
fn older_block_length(template: TemplateId, version: u16) -> Option<u16> {
    match template {
        TemplateId::Trade if version < 2 => Some(TRADE_V1_BLOCK_LENGTH),
        _ => None,
    }
}

schema_messages! {
    sbe = bourse_sbe_market_data;
    older_block_length = older_block_length;
    Heartbeat => heartbeat_codec::HeartbeatDecoder / HeartbeatEncoder [],
    SequenceReset => sequence_reset_codec::SequenceResetDecoder / SequenceResetEncoder [],
    BestPrices => best_prices_codec::BestPricesDecoder / BestPricesEncoder [GroupLayout {
        header_bytes: GROUP_HEADER_BYTES,
        block_length_min: best_prices_codec::encoder::EntriesEncoder::<
            best_prices_codec::BestPricesEncoder<'static>,
        >::block_length(),
        count_max: GROUP_COUNT_MAX,
    }],
    EmptyBook => empty_book_codec::EmptyBookDecoder / EmptyBookEncoder [],
    OrderUpdate => order_update_codec::OrderUpdateDecoder / OrderUpdateEncoder [],
    OrderExecution => order_execution_codec::OrderExecutionDecoder / OrderExecutionEncoder [],
    OrderBookSnapshot =>
        order_book_snapshot_codec::OrderBookSnapshotDecoder / OrderBookSnapshotEncoder
        [GroupLayout {
            header_bytes: GROUP_HEADER_BYTES,
            block_length_min: order_book_snapshot_codec::encoder::EntriesEncoder::<
                order_book_snapshot_codec::OrderBookSnapshotEncoder<'static>,
            >::block_length(),
            count_max: GROUP_COUNT_MAX,
        }],
    SecurityDefinition =>
        security_definition_codec::SecurityDefinitionDecoder / SecurityDefinitionEncoder [],
    SecurityStatus => security_status_codec::SecurityStatusDecoder / SecurityStatusEncoder [],
    TradingSessionStatus =>
        trading_session_status_codec::TradingSessionStatusDecoder / TradingSessionStatusEncoder [],
    AggregatedBook => aggregated_book_codec::AggregatedBookDecoder / AggregatedBookEncoder
        [GroupLayout {
            header_bytes: GROUP_HEADER_BYTES,
            block_length_min: aggregated_book_codec::encoder::LevelsEncoder::<
                aggregated_book_codec::AggregatedBookEncoder<'static>,
            >::block_length(),
            count_max: 2 * AGGREGATED_BOOK_LEVELS_PER_SIDE_MAX,
        }],
    Statistics => statistics_codec::StatisticsDecoder / StatisticsEncoder [],
    Trade => trade_codec::TradeDecoder / TradeEncoder [],
    AuctionIndicative =>
        auction_indicative_codec::AuctionIndicativeDecoder / AuctionIndicativeEncoder [],
    ReplayRequest => replay_request_codec::ReplayRequestDecoder / ReplayRequestEncoder [],
    ReplayResponse => replay_response_codec::ReplayResponseDecoder / ReplayResponseEncoder [],
}

/// The MsgFlags bit set of the packet header.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MsgFlags(pub u16);

impl MsgFlags {
    /// The packet ends a transaction (all updates caused by one command): the book is
    /// consistent after applying it. Cleared when the transaction continues in the next packet.
    /// Always set on snapshot and instrument feeds, where every packet stands alone.
    pub const LAST_FRAGMENT: u16 = 1 << 0;
    /// First packet of one instrument's snapshot.
    pub const START_OF_SNAPSHOT: u16 = 1 << 1;
    /// Last packet of one instrument's snapshot.
    pub const END_OF_SNAPSHOT: u16 = 1 << 2;
    /// An IncrementalPacketHeader follows the packet header.
    pub const INCREMENTAL_PACKET: u16 = 1 << 3;
    /// The packet is a resend by the TCP replay service; apart from this bit it is the packet
    /// that was published on UDP.
    pub const POSS_DUP: u16 = 1 << 4;
    /// Bits version 1 defines; a publisher never sets the others.
    pub const KNOWN: u16 = 0b1_1111;

    /// Whether every bit of `bits` is set.
    pub fn contains(self, bits: u16) -> bool {
        self.0 & bits == bits
    }

    /// These flags with `bits` set or cleared.
    pub fn with(self, bits: u16, set: bool) -> Self {
        if set {
            MsgFlags(self.0 | bits)
        } else {
            MsgFlags(self.0 & !bits)
        }
    }
}

impl std::fmt::Debug for MsgFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [(u16, &str); 5] = [
            (MsgFlags::LAST_FRAGMENT, "LastFragment"),
            (MsgFlags::START_OF_SNAPSHOT, "StartOfSnapshot"),
            (MsgFlags::END_OF_SNAPSHOT, "EndOfSnapshot"),
            (MsgFlags::INCREMENTAL_PACKET, "IncrementalPacket"),
            (MsgFlags::POSS_DUP, "PossDup"),
        ];
        write!(f, "MsgFlags({:#06x}", self.0)?;
        for (bit, name) in NAMES {
            if self.contains(bit) {
                write!(f, " {name}")?;
            }
        }
        write!(f, ")")
    }
}

/// MarketDataPacketHeader: the first 16 bytes of every datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketHeader {
    /// Packet sequence number within the channel, from 1, one per data packet. A packet
    /// holding only a Heartbeat repeats the number of the last data packet; a packet holding a
    /// SequenceReset has 0.
    pub msg_seq_num: u32,
    /// Size of the whole packet, this header included.
    pub msg_size: u16,
    pub msg_flags: MsgFlags,
    /// When the publisher sent the packet, ns since the Unix epoch.
    pub sending_time_ns: u64,
}

impl PacketHeader {
    /// Reads the header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, Error> {
        let b: &[u8; PACKET_HEADER_BYTES] = buf
            .get(..PACKET_HEADER_BYTES)
            .and_then(|b| b.try_into().ok())
            .ok_or(Error::Truncated {
                needed_bytes: PACKET_HEADER_BYTES,
                available_bytes: buf.len(),
            })?;
        Ok(Self {
            msg_seq_num: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            msg_size: u16::from_le_bytes([b[4], b[5]]),
            msg_flags: MsgFlags(u16::from_le_bytes([b[6], b[7]])),
            sending_time_ns: u64::from_le_bytes([
                b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15],
            ]),
        })
    }

    /// Writes the header at the start of `buf`.
    pub fn write(&self, buf: &mut [u8]) -> Result<(), Error> {
        let available_bytes = buf.len();
        let out = buf
            .get_mut(..PACKET_HEADER_BYTES)
            .ok_or(Error::BufferTooSmall {
                needed_bytes: PACKET_HEADER_BYTES,
                available_bytes,
            })?;
        out[0..4].copy_from_slice(&self.msg_seq_num.to_le_bytes());
        out[4..6].copy_from_slice(&self.msg_size.to_le_bytes());
        out[6..8].copy_from_slice(&self.msg_flags.0.to_le_bytes());
        out[8..16].copy_from_slice(&self.sending_time_ns.to_le_bytes());
        Ok(())
    }
}

/// IncrementalPacketHeader: follows the packet header on incremental feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IncrementalHeader {
    /// Time of the matching event the packet's updates come from, ns since the Unix epoch.
    pub transact_time_ns: u64,
    pub exchange_trading_session_id: u32,
}

impl IncrementalHeader {
    /// Reads the header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, Error> {
        let b: &[u8; INCREMENTAL_HEADER_BYTES] = buf
            .get(..INCREMENTAL_HEADER_BYTES)
            .and_then(|b| b.try_into().ok())
            .ok_or(Error::Truncated {
                needed_bytes: INCREMENTAL_HEADER_BYTES,
                available_bytes: buf.len(),
            })?;
        Ok(Self {
            transact_time_ns: u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            exchange_trading_session_id: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        })
    }

    /// Writes the header at the start of `buf`.
    pub fn write(&self, buf: &mut [u8]) -> Result<(), Error> {
        let available_bytes = buf.len();
        let out = buf
            .get_mut(..INCREMENTAL_HEADER_BYTES)
            .ok_or(Error::BufferTooSmall {
                needed_bytes: INCREMENTAL_HEADER_BYTES,
                available_bytes,
            })?;
        out[0..8].copy_from_slice(&self.transact_time_ns.to_le_bytes());
        out[8..12].copy_from_slice(&self.exchange_trading_session_id.to_le_bytes());
        Ok(())
    }
}

/// A validated packet: its headers and an iterator over its messages.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    pub header: PacketHeader,
    /// Present exactly when the packet header has `MsgFlags::INCREMENTAL_PACKET`.
    pub incremental: Option<IncrementalHeader>,
    body: &'a [u8],
    message_count: usize,
}

impl<'a> Packet<'a> {
    /// Number of messages in the packet, at least 1.
    pub fn message_count(&self) -> usize {
        self.message_count
    }

    /// The packet's messages in order. Every one was validated when the packet was parsed.
    pub fn messages(&self) -> Messages<'a> {
        Messages { rest: self.body }
    }
}

/// Iterator over the messages of a [`Packet`].
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Messages<'a> {
    type Item = Message<'a>;

    fn next(&mut self) -> Option<Message<'a>> {
        // The packet was validated as a whole, so decoding cannot fail here; stopping on an
        // error rather than panicking keeps the iterator total anyway.
        let (message, message_bytes) = decode_message(self.rest).ok()?;
        self.rest = self.rest.get(message_bytes..).unwrap_or(&[]);
        Some(message)
    }
}

/// Parses datagrams with configurable limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketParser {
    packet_bytes_max: usize,
    message_count_max: usize,
}

impl Default for PacketParser {
    fn default() -> Self {
        Self {
            packet_bytes_max: PACKET_BYTES_MAX,
            message_count_max: MESSAGES_PER_PACKET_MAX,
        }
    }
}

impl PacketParser {
    /// A parser with other limits; `packet_bytes_max` is capped at what MsgSize can express.
    pub fn new(packet_bytes_max: usize, message_count_max: usize) -> Self {
        Self {
            packet_bytes_max: packet_bytes_max.min(usize::from(u16::MAX)),
            message_count_max,
        }
    }

    /// Validates a whole datagram: the headers, MsgSize against the datagram length, and every
    /// message's schema, version, template and bounds.
    pub fn parse<'a>(&self, datagram: &'a [u8]) -> Result<Packet<'a>, Error> {
        if datagram.len() > self.packet_bytes_max {
            return Err(Error::PacketTooLarge {
                packet_bytes: datagram.len(),
                packet_bytes_max: self.packet_bytes_max,
            });
        }
        let header = PacketHeader::parse(datagram)?;
        if usize::from(header.msg_size) != datagram.len() {
            return Err(Error::PacketSizeMismatch {
                msg_size: header.msg_size,
                datagram_bytes: datagram.len(),
            });
        }
        let mut body = datagram.get(PACKET_HEADER_BYTES..).unwrap_or(&[]);
        let incremental = if header.msg_flags.contains(MsgFlags::INCREMENTAL_PACKET) {
            let incremental = IncrementalHeader::parse(body)?;
            body = body.get(INCREMENTAL_HEADER_BYTES..).unwrap_or(&[]);
            Some(incremental)
        } else {
            None
        };
        let mut rest = body;
        let mut message_count = 0;
        while !rest.is_empty() {
            if message_count == self.message_count_max {
                return Err(Error::TooManyMessages {
                    message_count_max: self.message_count_max,
                });
            }
            let (_, message_bytes) = decode_message(rest)?;
            rest = rest.get(message_bytes..).unwrap_or(&[]);
            message_count += 1;
        }
        if message_count == 0 {
            return Err(Error::EmptyPacket);
        }
        Ok(Packet {
            header,
            incremental,
            body,
            message_count,
        })
    }
}

/// Parses a datagram with the default limits.
pub fn parse_packet(datagram: &[u8]) -> Result<Packet<'_>, Error> {
    PacketParser::default().parse(datagram)
}

/// Builds one packet in a caller-owned buffer.
#[derive(Debug)]
pub struct PacketWriter<'a> {
    buf: &'a mut [u8],
    header: PacketHeader,
    packet_bytes: usize,
    message_count: usize,
}

impl<'a> PacketWriter<'a> {
    /// Starts a packet. The INCREMENTAL_PACKET flag is set exactly when `incremental` is
    /// given, so the flag and the header can never disagree. The packet may use at most
    /// [`PACKET_BYTES_MAX`] bytes of `buf`.
    pub fn new(
        buf: &'a mut [u8],
        header: PacketHeader,
        incremental: Option<IncrementalHeader>,
    ) -> Result<Self, Error> {
        let capacity = buf.len().min(PACKET_BYTES_MAX);
        let buf = &mut buf[..capacity];
        let header = PacketHeader {
            msg_flags: header
                .msg_flags
                .with(MsgFlags::INCREMENTAL_PACKET, incremental.is_some()),
            ..header
        };
        header.write(buf)?;
        let mut packet_bytes = PACKET_HEADER_BYTES;
        if let Some(incremental) = incremental {
            incremental.write(&mut buf[packet_bytes..])?;
            packet_bytes += INCREMENTAL_HEADER_BYTES;
        }
        Ok(Self {
            buf,
            header,
            packet_bytes,
            message_count: 0,
        })
    }

    /// Bytes still free for messages.
    pub fn remaining_bytes(&self) -> usize {
        self.buf.len() - self.packet_bytes
    }

    /// Number of messages appended so far.
    pub fn message_count(&self) -> usize {
        self.message_count
    }

    /// Appends one message; `fill` sets its fields and writes its groups (see
    /// [`crate::sbe::encode_message`]). Returns the message's size.
    ///
    /// A publisher should check [`PacketWriter::remaining_bytes`] before appending a message
    /// with groups, because the generated group encoders panic when they run out of buffer.
    pub fn append<'s, E, F>(&'s mut self, fill: F) -> Result<usize, Error>
    where
        E: MessageEncoder<'s>,
        F: FnOnce(E) -> E,
    {
        if self.message_count == MESSAGES_PER_PACKET_MAX {
            return Err(Error::TooManyMessages {
                message_count_max: MESSAGES_PER_PACKET_MAX,
            });
        }
        let message_bytes =
            crate::sbe::encode_message::<E, F>(&mut self.buf[self.packet_bytes..], fill)?;
        self.packet_bytes += message_bytes;
        self.message_count += 1;
        Ok(message_bytes)
    }

    /// Writes MsgSize and returns the packet's size; the packet is `buf[..size]`.
    pub fn finish(self) -> Result<usize, Error> {
        if self.message_count == 0 {
            return Err(Error::EmptyPacket);
        }
        // packet_bytes <= PACKET_BYTES_MAX < u16::MAX by construction.
        let msg_size = u16::try_from(self.packet_bytes).map_err(|_| Error::PacketTooLarge {
            packet_bytes: self.packet_bytes,
            packet_bytes_max: PACKET_BYTES_MAX,
        })?;
        PacketHeader {
            msg_size,
            ..self.header
        }
        .write(self.buf)?;
        Ok(self.packet_bytes)
    }
}

/// What a frame on a replay connection carries.
#[derive(Debug, Clone, Copy)]
pub enum ReplayFrame<'a> {
    /// ReplayRequest (client to server) or ReplayResponse (server to client).
    Message(Message<'a>),
    /// A resent packet as published on UDP, with `MsgFlags::POSS_DUP` set.
    Packet(Packet<'a>),
}

/// A replay frame with the number of bytes to consume.
#[derive(Debug, Clone, Copy)]
pub struct DecodedReplayFrame<'a> {
    pub frame: ReplayFrame<'a>,
    pub frame_bytes: usize,
}

/// Decodes the frames of a TCP replay connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayFrameDecoder {
    reader: FrameReader,
}

impl Default for ReplayFrameDecoder {
    fn default() -> Self {
        Self {
            reader: FrameReader::new(REPLAY_FRAME_BYTES_MAX),
        }
    }
}

impl ReplayFrameDecoder {
    /// Decodes the frame at the start of `buf`; `Ok(None)` while more bytes are needed.
    pub fn decode<'a>(&self, buf: &'a [u8]) -> Result<Option<DecodedReplayFrame<'a>>, Error> {
        match self.reader.next_frame(buf)? {
            None => Ok(None),
            Some(frame) => Ok(Some(DecodedReplayFrame {
                frame: replay_frame(&frame)?,
                frame_bytes: frame.frame_bytes,
            })),
        }
    }
}

fn replay_frame<'a>(frame: &RawFrame<'a>) -> Result<ReplayFrame<'a>, Error> {
    match frame.encoding {
        Encoding::MarketDataPacket => Ok(ReplayFrame::Packet(parse_packet(frame.payload)?)),
        Encoding::SbeMessage => {
            let (message, message_bytes) = decode_message(frame.payload)?;
            if message_bytes != frame.payload.len() {
                return Err(Error::TrailingBytes {
                    trailing_bytes: frame.payload.len() - message_bytes,
                });
            }
            Ok(ReplayFrame::Message(message))
        }
    }
}
