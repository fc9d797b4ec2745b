//! bourse-consensus: a sans-I/O Raft core that a node's own loop drives.
//!
//! - [`Core`]: one member of a replica group. Inputs are `tick`, `step(Message)`,
//!   `propose(payload)`, `persisted(LogId)`, `snapshot_taken(index)`; every output comes out
//!   of `ready(&mut Ready)`. It reads no clock, does no I/O and draws its election timeouts
//!   from a generator the caller seeds, so a run is a function of its inputs.
//! - [`Ready`]: what to persist (hard state, snapshot to install), send, sync and apply.
//! - [`LogStore`]: the log as the core reads and writes it (the node implements it over its
//!   journal); [`MemStore`] keeps it in memory for tests and benchmarks.
//! - [`Message`] / [`Body`]: the peer messages; [`codec`] their length-checked binary form.
//! - [`Config`]: fixed voters, timers in ticks (`election_window_ticks` gives each node its
//!   slot), and the limits (in flight, entries and bytes per message, uncommitted entries).
//!
//! Design notes (what is kept from the openraft-based consensus and how): docs/consensus.md.

pub mod codec;
mod config;
mod core;
mod message;
mod progress;
mod rng;
mod store;
mod types;

pub use crate::config::{election_window_ticks, Config, ConfigError, VOTERS_MAX};
pub use crate::core::{Core, ProposeError, Ready, StepError};
pub use crate::message::{AppendResult, Body, Message};
pub use crate::progress::{Progress, ProgressState};
pub use crate::rng::Rng;
pub use crate::store::{LogStore, MemStore};
pub use crate::types::{
    Entry, EntryKind, HardState, Index, LogId, NodeId, Role, SoftState, Term, ENTRY_OVERHEAD_BYTES,
};
