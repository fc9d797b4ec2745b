//! # bourse-t2t: tick-to-trade, measured as seed 004 measures it
//!
//! A driver replays a recorded order-log feed packet by packet to a reacting client and times
//! each reaction from the last byte of the packet it sent to the first byte of the order it
//! gets back. Principal types:
//!
//! - [`capture`]: reads a classic pcap (what `bourse md record` writes) into memory.
//! - [`book::Books`]: the client's books, allocated once, updated without allocation.
//! - [`order::OrderTemplate`]: a FIX NewOrderSingle encoded once and patched in place
//!   (MsgSeqNum, ClOrdID, Price, SendingTime, TransactTime, CheckSum).
//! - [`reactor::Reactor`] (sans-I/O): one datagram in (bourse's SBE, validated by the
//!   subscriber's decoder, or MoldUDP64/ITCH 5.0 read by `bourse_itch`'s, see [`itch`]), the
//!   orders for every best-ask change out.
//! - [`client`]: the reference reacting client around a reactor (UDP in, FIX over TCP out).
//! - [`driver`]: the replay driver playing the exchange's side (feed out, FIX session in), its
//!   reference model of the expected orders, and its report ([`stats`]).
//! - [`gen`]: captures with packets of 1 to 128 updates, synthetic or repacked from a
//!   recording.
//! - [`floor`]: the loopback floors of the same run (UDP one way, TCP echo, a null reactor).

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
