//! # bourse-itch: a core's order log as NASDAQ TotalView-ITCH 5.0 over MoldUDP64
//!
//! An optional second feed beside the SBE one, for tools that speak ITCH. Principal types:
//!
//! - [`msg::Message`]: the ITCH 5.0 messages bourse publishes (system event, stock directory,
//!   add order, order executed, order cancel, order delete, order replace, trade), their
//!   binary form and a decoder that names what is wrong.
//! - [`mold`]: MoldUDP64 packets (header, message blocks, heartbeat, end of session) and
//!   retransmission requests; [`mold::PacketBuilder`] packs messages up to a size limit.
//! - [`project::Projection`] (sans-I/O): committed events in, ITCH messages out, from its own
//!   book of what it published (the order log read as the SBE publisher reads it).
//! - [`feed::Feed`] (sans-I/O): projection, numbering, the bounded retransmission
//!   [`window::Window`], packing; [`feed::answer_request`] answers a request from the window.
//! - [`consumer::Consumer`] (sans-I/O): a gap-filling subscriber building books.
//! - [`net`]: the feed over UDP with its request server thread, and a consumer loop.
//! - [`service::ItchService`]: the feed fed from a core's committed stream (as delivery and
//!   clearing are), with heartbeats while the stream is idle.
//!
//! Every limit is explicit (packet bytes, window messages, requests per second, messages held
//! past a gap) and every refusal counted by reason.

#![forbid(unsafe_code)]

pub mod consumer;
pub mod feed;
pub mod mold;
pub mod msg;
pub mod net;
pub mod project;
pub mod service;
pub mod window;
