//! The probes' clock: monotonic nanoseconds since the first read in this process.
//!
//! `Instant` reads CLOCK_MONOTONIC through the vDSO (about 20-25 ns here), which is cheap
//! enough at a sampled rate and needs no calibration, unlike a raw cycle counter. Stamps from
//! different threads of one process are comparable; stamps from different processes are not,
//! which is why cross-process legs use the LTP formula ([`crate::probe::ltp_network_leg_ns`]).

use std::sync::OnceLock;
use std::time::Instant;

static ANCHOR: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since this process first read the clock (never 0 after the first call).
#[inline]
pub fn now_ns() -> u64 {
    let anchor = ANCHOR.get_or_init(Instant::now);
    anchor.elapsed().as_nanos() as u64 + 1
}

/// The probe time of an `Instant` read elsewhere (for a stage stamped with a scheduled time).
#[inline]
pub fn ns_of(t: Instant) -> u64 {
    let anchor = ANCHOR.get_or_init(Instant::now);
    t.saturating_duration_since(*anchor).as_nanos() as u64 + 1
}
