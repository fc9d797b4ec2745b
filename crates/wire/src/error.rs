//! The one error type of this crate.
//!
//! Every decoder here reports malformed input as a value of [`Error`] instead of panicking, so
//! that a gateway or a subscriber can count, log and drop bad input from an untrusted peer.

/// Everything that can be wrong with a frame, a packet or an SBE message.
///
/// Sizes are in bytes. Each variant carries the values a log line needs to explain itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before the structure it should hold. On a stream this is only an error
    /// when the frame is already known to be complete (see [`crate::frame`]).
    #[error("truncated: need {needed_bytes} bytes, have {available_bytes}")]
    Truncated {
        needed_bytes: usize,
        available_bytes: usize,
    },

    /// A frame header announced more bytes than the receiver accepts.
    #[error("frame of {frame_bytes} bytes exceeds the limit of {frame_bytes_max}")]
    FrameTooLarge {
        frame_bytes: usize,
        frame_bytes_max: usize,
    },

    /// A frame header announced fewer bytes than a frame header plus an SBE header.
    #[error("frame of {frame_bytes} bytes is shorter than the minimum of {frame_bytes_min}")]
    FrameTooSmall {
        frame_bytes: usize,
        frame_bytes_min: usize,
    },

    /// The frame header's encoding type is none this crate knows.
    #[error("unknown frame encoding type {encoding:#06x}")]
    UnknownEncoding { encoding: u16 },

    /// The frame's encoding type is valid but not the one this decoder expects.
    #[error("frame encoding type {encoding:#06x} where {expected:#06x} was expected")]
    UnexpectedEncoding { encoding: u16, expected: u16 },

    /// The SBE header names another schema.
    #[error("schema id {schema_id} where {expected} was expected")]
    WrongSchemaId { schema_id: u16, expected: u16 },

    /// The SBE header names a schema version newer than this build understands.
    #[error("schema version {version} is newer than the supported version {supported}")]
    VersionFromFuture { version: u16, supported: u16 },

    /// The SBE header names a template the schema does not define.
    #[error("unknown template id {template_id}")]
    UnknownTemplate { template_id: u16 },

    /// The SBE header's block length is shorter than the template's fixed fields.
    #[error("template {template_id}: block length {block_length} is below {block_length_min}")]
    BlockLengthTooShort {
        template_id: u16,
        block_length: u16,
        block_length_min: u16,
    },

    /// A repeating group's block length is shorter than the group's fields.
    #[error(
        "template {template_id}: group block length {block_length} is below {block_length_min}"
    )]
    GroupBlockLengthTooShort {
        template_id: u16,
        block_length: u16,
        block_length_min: u16,
    },

    /// A repeating group holds more entries than the schema allows.
    #[error("template {template_id}: group of {count} entries exceeds {count_max}")]
    GroupCountTooLarge {
        template_id: u16,
        count: u16,
        count_max: u16,
    },

    /// A variable-length data field is longer than the schema allows.
    #[error(
        "template {template_id}: variable-length field of {length} bytes exceeds {length_max}"
    )]
    VarDataTooLong {
        template_id: u16,
        length: u16,
        length_max: u16,
    },

    /// Bytes follow the message inside a frame that must hold exactly one message.
    #[error("{trailing_bytes} unexpected bytes after the message")]
    TrailingBytes { trailing_bytes: usize },

    /// A datagram is larger than the receiver accepts.
    #[error("packet of {packet_bytes} bytes exceeds the limit of {packet_bytes_max}")]
    PacketTooLarge {
        packet_bytes: usize,
        packet_bytes_max: usize,
    },

    /// The packet header's MsgSize disagrees with the datagram's length.
    #[error("packet header says {msg_size} bytes, datagram has {datagram_bytes}")]
    PacketSizeMismatch {
        msg_size: u16,
        datagram_bytes: usize,
    },

    /// A packet carries no message at all.
    #[error("packet holds no message")]
    EmptyPacket,

    /// A packet carries more messages than the receiver accepts.
    #[error("packet holds more than {message_count_max} messages")]
    TooManyMessages { message_count_max: usize },

    /// An encoder was given a buffer too small for the fixed part of the message.
    #[error("buffer too small: need {needed_bytes} bytes, have {available_bytes}")]
    BufferTooSmall {
        needed_bytes: usize,
        available_bytes: usize,
    },
}
