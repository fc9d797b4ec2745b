//! bourse's wire formats: SBE schemas, the Rust codecs Real Logic's sbe-tool generates from
//! them, and the thin safe layer that stands between those codecs and untrusted bytes.
//!
//! Three protocols, one schema each (in `schemas/` at the repository root):
//!
//! - [`order_entry`]: binary order entry, TWIME-like, SBE over TCP. Session messages
//!   (Establish, Sequence, RetransmitRequest, Terminate, ...) and application messages
//!   (NewOrder, CancelOrder, ReplaceOrder, MassCancel and their responses). Every message is a
//!   fixed block. Spec: `docs/protocol-binary-order-entry.md`.
//! - [`market_data`]: market data, SIMBA-like, SBE over UDP. A packet header, an incremental
//!   header on incremental feeds, then messages (OrderUpdate, OrderExecution,
//!   OrderBookSnapshot, AggregatedBook, Statistics, Trade, SecurityDefinition, ...), plus the
//!   two messages of the TCP replay service. Spec: `docs/protocol-market-data.md`.
//! - [`delivery`]: data delivery's GetOrders, SBE over TCP: a request, then a header and
//!   fixed-block records (order states, trades, rejects). Spec: `docs/delivery.md`.
//!
//! Principal types:
//!
//! - [`frame::FrameReader`] finds length-prefixed frames in a TCP byte stream;
//!   [`order_entry::FrameDecoder`] and [`market_data::ReplayFrameDecoder`] build on it.
//! - [`market_data::PacketParser`] validates a whole datagram; [`market_data::PacketWriter`]
//!   builds one.
//! - `order_entry::Message` and `market_data::Message` are enums of the generated decoders, one
//!   variant per template; they exist only after the bytes under them were bounds-checked.
//! - [`frame::encode_frame`] and [`sbe::encode_message`] start any generated encoder.
//! - [`Error`] is the single error type; nothing in this crate panics on any input.
//!
//! The generated code lives in `crates/wire/generated/` as three crates, re-exported here as
//! [`order_entry::codec`], [`market_data::codec`] and [`delivery::codec`]. It is written by `scripts/gen-sbe.sh`
//! and must not be edited by hand; CI runs `scripts/gen-sbe.sh --check`.
//!
//! The generated decoders index their buffer without checks and panic on short input, which
//! is why they are never handed raw bytes: [`order_entry::decode_message`],
//! [`market_data::decode_message`] and the decoders above first check the schema id, the
//! version (a version newer than this build is refused), the template, the block length and
//! every repeating group against the buffer.

#![forbid(unsafe_code)]

pub mod delivery;
mod error;
pub mod frame;
pub mod market_data;
pub mod order_entry;
pub mod sbe;

pub use error::Error;

/// Reads a NUL-padded ASCII field (credentials, symbols, currencies) as text: the bytes up to
/// the first NUL. Returns `None` when they are not printable ASCII.
pub fn ascii_field(bytes: &[u8]) -> Option<&str> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let text = bytes.get(..end)?;
    if text.iter().all(|b| (0x20..0x7f).contains(b)) {
        std::str::from_utf8(text).ok()
    } else {
        None
    }
}
