//! # bourse-itch: a core's order log as NASDAQ TotalView-ITCH 5.0 over MoldUDP64
//!
//! An optional second feed beside the SBE one. [`msg::Message`] is the ITCH messages bourse
//! publishes and [`mold`] the MoldUDP64 packets and retransmission requests;
//! [`project::Projection`] (sans-I/O) turns committed events into messages; [`feed::Feed`]
//! numbers, packs and keeps the retransmission [`window::Window`]; [`consumer::Consumer`] is a
//! gap-filling subscriber; [`net`] and [`service::ItchService`] run the feed from a core's
//! committed stream. Every limit is explicit and every refusal counted.
//!
//! Design: ARCHITECTURE.md, `crates/itch`.

#![forbid(unsafe_code)]

pub mod consumer;
pub mod feed;
pub mod mold;
pub mod msg;
pub mod net;
pub mod project;
pub mod service;
pub mod window;
