//! # bourse-client: the SDK for bourse's order entry and data delivery
//!
//! [`FixClient`] (a FIX 4.4 initiator over `bourse_fix::Session`: orders, cancels, replaces,
//! mass cancel, status; [`FixClient::send`] for any other message) and [`BinaryClient`] (the
//! SBE protocol, every response decoded into a [`binary::Response`]) are the blocking clients
//! of the tests, `bourse order` and the load generator; [`TlsClient`] runs either over TLS.
//! [`delivery`] is the data-delivery client (HTTP/JSON and SBE, async). No client panics on
//! what a server sends: a malformed stream ends the connection with an error.
//!
//! Design: ARCHITECTURE.md, `crates/gateway` and `crates/client`.

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
