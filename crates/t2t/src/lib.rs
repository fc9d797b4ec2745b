//! # bourse-t2t: tick-to-trade, measured as seed 004 measures it
//!
//! A [`driver`] replays a recorded feed packet by packet to a reacting [`client`] and times each
//! reaction, last byte sent to first byte back, checking every order against its model. Start at
//! [`reactor::Reactor`] (sans-I/O: a datagram in, SBE or ITCH, orders for every best-ask change
//! out), over [`book::Books`] (allocated once) and [`order::OrderTemplate`] (a NewOrderSingle
//! patched in place). [`capture`] reads pcap, [`gen`] makes captures, [`stats`] reports, and
//! [`floor`] measures the loopback floors of the same run.
//!
//! Design and invariants: ARCHITECTURE.md, `crates/t2t`.

#![forbid(unsafe_code)]

pub mod book;
pub mod capture;
pub mod client;
pub mod driver;
pub mod floor;
pub mod gen;
pub mod itch;
pub mod order;
pub mod reactor;
pub mod stats;

/// Pins the calling thread to one CPU, so that the driver and the client do not preempt each
/// other on a small machine (the driver's clock would then stop while the client runs).
pub fn pin_to_cpu(cpu: usize) -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(|e| format!("CPU {cpu}: {e}"))?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| format!("pinning to CPU {cpu}: {e}"))
}

/// UDP port the captures' order-log packets go to by default: feed A of the orders channel
/// at `bourse md`'s default base port.
pub const ORDERS_PORT_DEFAULT: u16 = bourse_marketdata::udp::BASE_PORT_DEFAULT;

/// The market data a capture, a driver and a client speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum FeedFormat {
    /// bourse's SBE order log (the orders channel of `bourse md`).
    #[default]
    Sbe,
    /// NASDAQ TotalView-ITCH 5.0 over MoldUDP64 (`bourse itch serve`).
    Itch,
}

impl FeedFormat {
    /// `sbe` or `itch`.
    pub fn parse(text: &str) -> Result<FeedFormat, String> {
        match text {
            "sbe" => Ok(FeedFormat::Sbe),
            "itch" => Ok(FeedFormat::Itch),
            other => Err(format!("feed format {other:?} is neither sbe nor itch")),
        }
    }
}
