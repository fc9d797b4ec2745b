//! # bourse-client: order entry SDK
//!
//! Rust clients for bourse's two order entry protocols, used by the tests, the `bourse order`
//! command and the load generator:
//!
//! - [`FixClient`]: a FIX 4.4 initiator. It drives `bourse_fix::Session` (sequence numbers,
//!   heartbeats, resend, optional durable store) over a blocking `std::net::TcpStream` and
//!   hands back verified application messages ([`FixMessage`]). [`FixClient::new_order`],
//!   [`FixClient::cancel`], [`FixClient::replace`], [`FixClient::mass_cancel`],
//!   [`FixClient::order_status`] and [`FixClient::mass_status`] build the gateway's messages
//!   ([`FixClient::live_orders`] also collects the answers); [`FixClient::send`] sends any
//!   other.
//! - [`BinaryClient`]: the binary (SBE) protocol: Establish, requests, and every server
//!   response decoded into an owned [`binary::Response`] with its sequence number;
//!   retransmission on request.
//!
//! - [`delivery`]: the data-delivery client ([`delivery::DeliveryClient`] over HTTP/JSON,
//!   [`delivery::BinaryClient`] over SBE/TCP, [`delivery::AnyClient`] over both): the latest
//!   state of every order and trade by cursor (async, tokio).
//! - [`TlsClient`]: either client over TLS to a gateway's TLS listeners (`FixClientConfig::tls`,
//!   [`BinaryClient::connect_tls`]), trusting the authorities of a PEM file.
//!
//! Both read with a timeout the caller chooses (or without blocking) and never panic on what
//! the server sends: a malformed byte stream ends the connection with an error.

#![forbid(unsafe_code)]

pub mod binary;
pub mod delivery;
pub mod fix;
pub mod transport;

pub use binary::{BinaryClient, Received, Response};
pub use fix::{FixClient, FixClientConfig, FixMessage};
pub use transport::TlsClient;

/// The FIX 4.4 dictionary the gateway speaks (its own compact one, shared with the client so
/// both validate the same messages).
pub const GATEWAY_FIX44_XML: &str = include_str!("../../gateway/src/fix44-gateway.xml");
