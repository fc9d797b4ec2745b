//! Data delivery (schema `schemas/bourse-delivery.xml`, id 3): GetOrders over TCP, its
//! limits, the message list, and a stream decoder that turns TCP bytes into validated
//! messages.
//!
//! A client sends GetOrders; the server answers with OrdersHeader and then exactly `count`
//! record messages (OrderState, TradeRecord, RejectRecord), or with DeliveryError. A node
//! with credentials wants a Logon first (answered LogonAck or DeliveryError). Records
//! are fixed blocks; the cursor (GetOrders, OrdersHeader) and the error text are the only
//! variable-length fields, each checked against [`CURSOR_BYTES_MAX`] or
//! [`ERROR_TEXT_BYTES_MAX`] before any generated decoder sees them.
//!
//! ```
//! use bourse_wire::delivery::{self, codec, FrameDecoder, Message};
//! use bourse_wire::frame::encode_frame;
//!
//! let mut buf = [0u8; delivery::FRAME_BYTES_MAX];
//! let n = encode_frame(&mut buf, |mut e: codec::get_orders_codec::GetOrdersEncoder| {
//!     e.request_id(1).limit(100).wait_us(500).min_rows(1);
//!     e.firm_opt(Some(7)).account_opt(None).instrument_opt(None);
//!     e.cursor(&[]);
//!     e
//! })
//! .unwrap();
//! let decoded = FrameDecoder::default().decode(&buf[..n]).unwrap().unwrap();
//! match decoded.message {
//!     Message::GetOrders(mut g) => {
//!         assert_eq!(g.firm(), Some(7));
//!         let at = g.cursor_decoder();
//!         assert!(g.cursor_slice(at).is_empty());
//!     }
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```

pub use bourse_sbe_delivery as codec;

use crate::frame::{FrameReader, RawFrame};
use crate::sbe::schema_messages;
use crate::Error;

/// SBE schema id of data delivery.
pub const SCHEMA_ID: u16 = bourse_sbe_delivery::SBE_SCHEMA_ID;
/// Newest schema version this build decodes; newer messages are refused.
pub const SCHEMA_VERSION: u16 = bourse_sbe_delivery::SBE_SCHEMA_VERSION;

/// The longest cursor, in bytes (the schema's `varDataEncoding.length` maxValue).
pub const CURSOR_BYTES_MAX: u16 = 2_100;
/// The longest error text, in bytes; longer texts are cut by the encoder.
pub const ERROR_TEXT_BYTES_MAX: u16 = 1_100;

/// The longest name and password of a Logon (`bourse_auth`'s limits).
pub const LOGON_NAME_BYTES_MAX: u16 = 64;
pub const LOGON_PASSWORD_BYTES_MAX: u16 = 128;
/// The most firms a LogonAck lists, and their bytes.
pub const LOGON_FIRMS_MAX: usize = 16;
pub const LOGON_FIRMS_BYTES_MAX: u16 = 4 * LOGON_FIRMS_MAX as u16;

/// Largest frame either side accepts: the longest GetOrders or OrdersHeader with the longest
/// cursor, with room for fields later versions append.
pub const FRAME_BYTES_MAX: usize = 4_096;

schema_messages! {
    sbe = bourse_sbe_delivery;
    // Every message of the delivery schema is as version 1 defined it.
    older_block_length = crate::sbe::no_older_block_length;
    GetOrders => get_orders_codec::GetOrdersDecoder / GetOrdersEncoder []
        data [CURSOR_BYTES_MAX],
    OrdersHeader => orders_header_codec::OrdersHeaderDecoder / OrdersHeaderEncoder []
        data [CURSOR_BYTES_MAX],
    OrderState => order_state_codec::OrderStateDecoder / OrderStateEncoder [],
    TradeRecord => trade_record_codec::TradeRecordDecoder / TradeRecordEncoder [],
    RejectRecord => reject_record_codec::RejectRecordDecoder / RejectRecordEncoder [],
    DeliveryError => delivery_error_codec::DeliveryErrorDecoder / DeliveryErrorEncoder []
        data [ERROR_TEXT_BYTES_MAX],
    Logon => logon_codec::LogonDecoder / LogonEncoder []
        data [LOGON_NAME_BYTES_MAX, LOGON_PASSWORD_BYTES_MAX],
    LogonAck => logon_ack_codec::LogonAckDecoder / LogonAckEncoder []
        data [LOGON_FIRMS_BYTES_MAX],
}

/// A message decoded from a stream, with the number of bytes to consume.
#[derive(Debug, Clone, Copy)]
pub struct DecodedFrame<'a> {
    pub message: Message<'a>,
    pub frame_bytes: usize,
}

/// Decodes delivery frames from the bytes of a TCP stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDecoder {
    reader: FrameReader,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self {
            reader: FrameReader::new(FRAME_BYTES_MAX),
        }
    }
}

impl FrameDecoder {
    /// Decodes the frame at the start of `buf`: `Ok(None)` while more bytes are needed,
    /// `Ok(Some(decoded))` to consume `decoded.frame_bytes` bytes, `Err` when the peer sent
    /// something malformed (the framing is lost: close the connection).
    pub fn decode<'a>(&self, buf: &'a [u8]) -> Result<Option<DecodedFrame<'a>>, Error> {
        match self.reader.next_frame(buf)? {
            None => Ok(None),
            Some(frame) => Ok(Some(DecodedFrame {
                message: message_from_frame(&frame)?,
                frame_bytes: frame.frame_bytes,
            })),
        }
    }
}

fn message_from_frame<'a>(frame: &RawFrame<'a>) -> Result<Message<'a>, Error> {
    crate::sbe::message_from_frame(frame, decode_message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::encode_frame;
    use proptest::prelude::*;

    fn get_orders(cursor: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; FRAME_BYTES_MAX];
        let n = encode_frame(
            &mut buf,
            |mut e: codec::get_orders_codec::GetOrdersEncoder| {
                e.request_id(9).limit(10).wait_us(0).min_rows(1);
                e.firm_opt(None).account_opt(Some(3)).instrument_opt(None);
                e.cursor(cursor);
                e
            },
        )
        .unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn a_cursor_reads_back_as_written() {
        let frame = get_orders(&[1, 2, 3, 4, 5]);
        let decoded = FrameDecoder::default().decode(&frame).unwrap().unwrap();
        assert_eq!(decoded.frame_bytes, frame.len());
        let Message::GetOrders(mut g) = decoded.message else {
            panic!("not GetOrders")
        };
        assert_eq!((g.request_id(), g.account(), g.firm()), (9, Some(3), None));
        let at = g.cursor_decoder();
        assert_eq!(g.cursor_slice(at), &[1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_cursor_longer_than_the_schema_allows_is_refused() {
        let frame = get_orders(&vec![7u8; usize::from(CURSOR_BYTES_MAX) + 1]);
        assert!(matches!(
            FrameDecoder::default().decode(&frame),
            Err(Error::VarDataTooLong { length_max, .. }) if length_max == CURSOR_BYTES_MAX
        ));
    }

    #[test]
    fn a_length_past_the_frame_is_truncated_not_read() {
        let mut frame = get_orders(&[1, 2, 3]);
        // Claim 200 cursor bytes where three follow; the frame length stays as it was.
        let at = frame.len() - 5;
        frame[at..at + 2].copy_from_slice(&200u16.to_le_bytes());
        assert!(matches!(
            FrameDecoder::default().decode(&frame),
            Err(Error::Truncated { .. })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = FrameDecoder::default().decode(&bytes);
        }

        #[test]
        fn every_cut_of_a_valid_frame_waits_or_errs(cut in 0usize..40) {
            let frame = get_orders(&[9u8; 30]);
            let cut = cut.min(frame.len() - 1);
            // A prefix is either "need more" or, once the frame header is read and the
            // payload is cut, not yet decodable: it must never decode as a message.
            prop_assert!(!matches!(FrameDecoder::default().decode(&frame[..cut]), Ok(Some(_))));
        }

        #[test]
        fn any_changed_byte_never_panics(at in 0usize..60, value in any::<u8>()) {
            let mut frame = get_orders(&[5u8; 20]);
            let at = at % frame.len();
            frame[at] = value;
            if let Ok(Some(d)) = FrameDecoder::default().decode(&frame) {
                if let Message::GetOrders(mut g) = d.message {
                    let c = g.cursor_decoder();
                    let _ = g.cursor_slice(c);
                }
            }
        }
    }
}
