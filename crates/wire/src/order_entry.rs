//! Binary order entry (schema `schemas/bourse-order-entry.xml`, id 1): limits, the message
//! list, and a stream decoder that turns TCP bytes into validated messages.
//!
//! Every order entry message is a fixed block, so a message's size follows from its template;
//! a frame must hold exactly one message and nothing else.
//!
//! ```
//! use bourse_wire::order_entry::{self, codec, FrameDecoder, Message};
//! use bourse_wire::frame::encode_frame;
//!
//! let mut buf = [0u8; order_entry::FRAME_BYTES_MAX];
//! let frame_bytes = encode_frame(&mut buf, |mut e: codec::new_order_codec::NewOrderEncoder| {
//!     e.cl_ord_id(42).price_opt(Some(10_050)).qty(10).display_qty_opt(None);
//!     e.expire_time_ns_opt(None).account(7).instrument_id(1001);
//!     e.side(codec::side::Side::Buy).ord_type(codec::ord_type::OrdType::Limit);
//!     e.time_in_force(codec::time_in_force::TimeInForce::Day);
//!     e
//! })
//! .unwrap();
//!
//! let decoded = FrameDecoder::default().decode(&buf[..frame_bytes]).unwrap().unwrap();
//! assert_eq!(decoded.frame_bytes, frame_bytes);
//! match decoded.message {
//!     Message::NewOrder(order) => assert_eq!(order.price(), Some(10_050)),
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```

pub use bourse_sbe_order_entry as codec;

use crate::frame::{FrameReader, RawFrame};
use crate::sbe::schema_messages;
use crate::Error;

/// SBE schema id of binary order entry.
pub const SCHEMA_ID: u16 = bourse_sbe_order_entry::SBE_SCHEMA_ID;
/// Newest schema version this build decodes; newer messages are refused.
pub const SCHEMA_VERSION: u16 = bourse_sbe_order_entry::SBE_SCHEMA_VERSION;

/// Largest frame a gateway or client accepts. The largest message of version 1 is 86 bytes
/// framed; the headroom leaves room for fields later versions append without letting a peer
/// make the receiver buffer much.
pub const FRAME_BYTES_MAX: usize = 512;

/// Shortest and longest keepalive interval a client may ask for in Establish.
pub const KEEPALIVE_INTERVAL_MS_MIN: u32 = 100;
pub const KEEPALIVE_INTERVAL_MS_MAX: u32 = 60_000;

/// A session is dead after this many keepalive intervals without any inbound message.
pub const KEEPALIVE_MISSED_INTERVALS_MAX: u32 = 3;

/// Most messages one RetransmitRequest may ask for; larger gaps take several requests.
pub const RETRANSMIT_COUNT_MAX: u32 = 1_000;

/// The client must send Establish within this long of connecting, or the server closes.
pub const ESTABLISH_TIMEOUT_MS: u32 = 5_000;

/// Credentials field width in Establish.
pub const CREDENTIALS_BYTES: usize = 32;
/// Password field width in Establish (since version 2).
pub const PASSWORD_BYTES: usize = 32;
/// Establish's root block in version 1, before `password` was appended.
pub const ESTABLISH_V1_BLOCK_LENGTH: u16 = 44;

/// MassCancel's root block in versions 1 and 2, before `scope` was appended.
pub const MASS_CANCEL_V2_BLOCK_LENGTH: u16 = 17;

/// Root block lengths of older versions: version 2 appended `password` to Establish (a
/// version 1 Establish is 44 bytes), version 3 appended `scope` to MassCancel (17 bytes
/// before); no other template changed.
fn older_block_length(template: TemplateId, version: u16) -> Option<u16> {
    match template {
        TemplateId::Establish if version < 2 => Some(ESTABLISH_V1_BLOCK_LENGTH),
        TemplateId::MassCancel if version < 3 => Some(MASS_CANCEL_V2_BLOCK_LENGTH),
        _ => None,
    }
}

/// Rewrites the schema version in the SBE header of a framed message (frame header, then SBE
/// header) to `version`, for a peer that established with an older version: valid for every
/// message a server sends, since no server message changed after version 1. Frames too short
/// to hold both headers are left alone.
pub fn set_frame_version(frame: &mut [u8], version: u16) {
    let at = crate::frame::FRAME_HEADER_BYTES + 6;
    if let Some(v) = frame.get_mut(at..at + 2) {
        v.copy_from_slice(&version.to_le_bytes());
    }
}

schema_messages! {
    sbe = bourse_sbe_order_entry;
    older_block_length = older_block_length;
    Establish => establish_codec::EstablishDecoder / EstablishEncoder [],
    EstablishmentAck => establishment_ack_codec::EstablishmentAckDecoder / EstablishmentAckEncoder [],
    EstablishmentReject =>
        establishment_reject_codec::EstablishmentRejectDecoder / EstablishmentRejectEncoder [],
    Terminate => terminate_codec::TerminateDecoder / TerminateEncoder [],
    RetransmitRequest =>
        retransmit_request_codec::RetransmitRequestDecoder / RetransmitRequestEncoder [],
    Retransmission => retransmission_codec::RetransmissionDecoder / RetransmissionEncoder [],
    Sequence => sequence_codec::SequenceDecoder / SequenceEncoder [],
    NewOrder => new_order_codec::NewOrderDecoder / NewOrderEncoder [],
    CancelOrder => cancel_order_codec::CancelOrderDecoder / CancelOrderEncoder [],
    ReplaceOrder => replace_order_codec::ReplaceOrderDecoder / ReplaceOrderEncoder [],
    MassCancel => mass_cancel_codec::MassCancelDecoder / MassCancelEncoder [],
    NewOrderAck => new_order_ack_codec::NewOrderAckDecoder / NewOrderAckEncoder [],
    OrderReject => order_reject_codec::OrderRejectDecoder / OrderRejectEncoder [],
    ExecutionReport => execution_report_codec::ExecutionReportDecoder / ExecutionReportEncoder [],
    CancelAck => cancel_ack_codec::CancelAckDecoder / CancelAckEncoder [],
    CancelReject => cancel_reject_codec::CancelRejectDecoder / CancelRejectEncoder [],
    ReplaceAck => replace_ack_codec::ReplaceAckDecoder / ReplaceAckEncoder [],
    ReplaceReject => replace_reject_codec::ReplaceRejectDecoder / ReplaceRejectEncoder [],
    MassCancelAck => mass_cancel_ack_codec::MassCancelAckDecoder / MassCancelAckEncoder [],
    BusinessReject => business_reject_codec::BusinessRejectDecoder / BusinessRejectEncoder [],
}

impl TemplateId {
    /// Session-layer messages (template ids below 100) manage the connection and carry no
    /// sequence number of their own.
    pub fn is_session(self) -> bool {
        (self as u16) < 100
    }

    /// Requests a client sends (template ids 100..=199).
    pub fn is_client_request(self) -> bool {
        (100..200).contains(&(self as u16))
    }

    /// Responses the server sends (template ids 200..=299). Each consumes one server sequence
    /// number and can be retransmitted.
    pub fn is_server_response(self) -> bool {
        (200..300).contains(&(self as u16))
    }
}

/// A message decoded from a stream, with the number of bytes to consume.
#[derive(Debug, Clone, Copy)]
pub struct DecodedFrame<'a> {
    pub message: Message<'a>,
    pub frame_bytes: usize,
}

/// Decodes order entry frames from the bytes of a TCP stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDecoder {
    reader: FrameReader,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(FRAME_BYTES_MAX)
    }
}

impl FrameDecoder {
    /// A decoder that refuses frames longer than `frame_bytes_max`.
    pub fn new(frame_bytes_max: usize) -> Self {
        Self {
            reader: FrameReader::new(frame_bytes_max),
        }
    }

    /// Decodes the frame at the start of `buf`.
    ///
    /// `Ok(None)`: not all of the frame has arrived; read more and call again with the same
    /// bytes at the front. `Ok(Some(decoded))`: consume `decoded.frame_bytes` bytes. `Err`:
    /// the peer sent something malformed; the framing is lost and the session should end with
    /// Terminate(InvalidFrame).
    pub fn decode<'a>(&self, buf: &'a [u8]) -> Result<Option<DecodedFrame<'a>>, Error> {
        match self.reader.next_frame(buf)? {
            None => Ok(None),
            Some(frame) => Ok(Some(DecodedFrame {
                message: message_from_frame(&frame)?,
                frame_bytes: frame.frame_bytes,
            })),
        }
    }

    /// Decodes a buffer that must hold exactly one whole frame.
    pub fn decode_exact<'a>(&self, buf: &'a [u8]) -> Result<Message<'a>, Error> {
        message_from_frame(&self.reader.exact_frame(buf)?)
    }
}

fn message_from_frame<'a>(frame: &RawFrame<'a>) -> Result<Message<'a>, Error> {
    crate::sbe::message_from_frame(frame, decode_message)
}
