//! # bourse-core: the system's language
//!
//! The types every other crate speaks: small, `Copy` where possible, free of I/O, clocks and
//! floating point. Start at [`Command`] (everything a core can be asked, stamped with `ts_ns`)
//! and [`Event`] (everything it answers, with an [`OrderLog`] record for every change to an
//! order). Ids ([`InstrumentId`], [`AccountId`], [`OrderId`], ...) are newtypes; [`Price`],
//! [`Qty`] and [`Cash`] are fixed-point integers; [`Instrument`] and [`AccountSpec`] say what
//! trades and who. [`codec`] is the one binary form of commands and events, and the snapshot
//! writer; [`link::CoreLink`] is the seam between an access server and a core.
//!
//! Units, limits and invariants: ARCHITECTURE.md, `crates/core`.

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
