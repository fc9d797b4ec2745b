//! bourse-wire: the SBE schemas, the codecs Real Logic's sbe-tool generates from them, and the
//! safe layer between those codecs and untrusted bytes.
//!
//! One module per protocol and schema (`schemas/`): [`order_entry`] (binary order entry,
//! TWIME-like, over TCP), [`market_data`] (SIMBA-like, over UDP, with the TCP replay messages)
//! and [`delivery`] (GetOrders over TCP); each spec is in `docs/`. Start at
//! [`market_data::PacketParser`] and [`order_entry::decode_message`]: generated decoders get
//! bytes only after the header, schema, version, template, block length and every group were
//! checked, so nothing here panics on any input ([`Error`]). [`frame::FrameReader`] finds frames
//! in a TCP stream; [`sbe::encode_message`] starts any encoder. The generated code is in
//! `crates/wire/generated/` (written by `scripts/gen-sbe.sh`, never by hand).

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
