//! Test instruments: free ports, certificates, a counting allocator, the bed's netem.
//!
//! [`try_free_port_block`] (and the panicking [`free_port`], [`free_ports`] and
//! [`free_port_block`]) hands out ports below Linux's ephemeral range, never the same twice in
//! a process; [`certs::Authority`] makes throw-away certificates; [`alloc::CountingAllocator`]
//! and [`alloc::count_allocations`] prove a path allocates nothing; [`netem::Impairment`] and
//! [`netem::Held`] are the decisions of `bourse-netem` (src/bin).
//!
//! Why ports come from below the ephemeral range: ARCHITECTURE.md, `crates/testkit`.

pub mod alloc;
pub mod certs;
pub mod netem;

use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// The first port handed out (above the well-known and most registered service ports).
const RANGE_START: u16 = 10_000;
/// Ports handed out: 10000-31999, below the ephemeral range.
const RANGE_LEN: u16 = 22_000;
/// Blocks tried before giving up (each probe binds `n` sockets twice).
const TRIES_MAX: u32 = 500;
/// Not yet drawn: `CURSOR` holds an offset into the range once the first call has drawn one.
const UNSET: u32 = u32::MAX;

static CURSOR: AtomicU32 = AtomicU32::new(UNSET);

/// A process-specific starting offset, so that two test binaries rarely probe the same ports.
fn start_offset() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seed = (std::process::id() as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(nanos);
    (seed % RANGE_LEN as u64) as u32
}

/// Takes the next `n` offsets of the range for this process (wrapping at its end).
fn take_offsets(n: u16) -> u32 {
    let _ = CURSOR.compare_exchange(UNSET, start_offset(), Ordering::Relaxed, Ordering::Relaxed);
    CURSOR.fetch_add(n as u32, Ordering::Relaxed) % RANGE_LEN as u32
}

fn is_free(port: u16) -> bool {
    UdpSocket::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// The first of `n` consecutive ports that were free on 127.0.0.1 for TCP and UDP a moment
/// ago, below the ephemeral range. Fails only when `TRIES_MAX` blocks in a row were busy.
pub fn try_free_port_block(n: u16) -> std::io::Result<u16> {
    if n == 0 || n > RANGE_LEN / 2 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("a block of {n} ports (1 to {} allowed)", RANGE_LEN / 2),
        ));
    }
    for _ in 0..TRIES_MAX {
        let offset = take_offsets(n);
        if offset + n as u32 > RANGE_LEN as u32 {
            continue; // The block would leave the range: take the next one from the start.
        }
        let base = RANGE_START + offset as u16;
        if (0..n).all(|i| is_free(base + i)) {
            return Ok(base);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no block of {n} free ports on 127.0.0.1 in {TRIES_MAX} tries"),
    ))
}

/// One free port (see [`try_free_port_block`]); panics when none is found.
pub fn free_port() -> u16 {
    free_port_block(1)
}

/// `n` consecutive free ports, the first returned; panics when none are found.
pub fn free_port_block(n: u16) -> u16 {
    try_free_port_block(n).unwrap_or_else(|e| panic!("{e}"))
}

/// `N` distinct free ports (one block); panics when none are found.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let base = free_port_block(N as u16);
    std::array::from_fn(|i| base + i as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_lie_below_the_ephemeral_range() {
        for _ in 0..100 {
            let p = free_port();
            assert!((RANGE_START..RANGE_START + RANGE_LEN).contains(&p), "{p}");
        }
    }

    #[test]
    fn calls_in_one_process_never_share_a_port() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let base = free_port_block(4);
            for p in base..base + 4 {
                assert!(seen.insert(p), "port {p} handed out twice");
            }
        }
    }

    #[test]
    fn a_port_held_for_tcp_or_udp_is_not_free() {
        let base = free_port_block(2);
        let _tcp = TcpListener::bind(("127.0.0.1", base)).unwrap();
        let _udp = UdpSocket::bind(("127.0.0.1", base + 1)).unwrap();
        assert!(!is_free(base));
        assert!(!is_free(base + 1));
    }

    #[test]
    fn block_sizes_out_of_range_are_refused() {
        assert!(try_free_port_block(0).is_err());
        assert!(try_free_port_block(RANGE_LEN).is_err());
        assert_eq!(free_ports::<3>().len(), 3);
    }
}
