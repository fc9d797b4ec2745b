//! # bourse-core: the system's language
//!
//! Every other crate of bourse speaks in the types defined here, so they are small, `Copy`
//! where possible, and free of I/O, clocks and floating point.
//!
//! - Ids ([`InstrumentId`], [`AccountId`], [`FirmId`], [`OrderId`], [`ClOrdId`], [`TradeId`])
//!   are newtypes over fixed-width integers so that they cannot be mixed up.
//! - Numbers ([`Price`], [`Qty`], [`Cash`]) are fixed-point integers. A price is counted in
//!   units of `10^-price_scale` of the settlement currency per unit of the instrument; a
//!   quantity is counted in lots; cash is counted in units of `10^-CASH_SCALE`.
//! - [`Instrument`] describes what trades (equity, FX pair or future) and its tick, lot, band
//!   and margin; [`AccountSpec`] describes who trades.
//! - [`Command`] is everything a core can be asked to do. Each command carries the time the
//!   gateway stamped on it (`ts_ns`): the engine never reads a clock.
//! - [`Event`] is everything a core says in answer: acceptances, rejects with a specific
//!   [`RejectReason`], trades, cancels, replaces, expiries, and an [`OrderLog`] record for every
//!   change to an order, numbered by `rec` (per new record) and `seq` (per change).
//! - [`codec`] is the small binary writer/reader that snapshots are made of, and the one
//!   binary form of a command and of an event list (client RPC, log entries, journal,
//!   committed stream).
//! - [`link::CoreLink`] is the seam between an access server and a core: submit a command
//!   under a [`link::RequestKey`] without blocking, receive [`link::CoreOutput`]s tagged by
//!   key; implemented next to the engine (in process) and the cluster (a replica group).

#![forbid(unsafe_code)]

pub mod codec;
mod command;
mod event;
mod ids;
mod instrument;
pub mod link;
mod num;

pub use command::*;
pub use event::*;
pub use ids::*;
pub use instrument::*;
pub use num::*;
