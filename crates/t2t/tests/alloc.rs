// Its own binary, outside tests/it: its #[global_allocator] would become every test's there.
//! The reaction allocates nothing: once every instrument has been seen (its order template is
//! encoded at first sight), thousands of packets, damaged ones included, go through
//! `Reactor::on_datagram` without one allocation. A counting global allocator watches this
//! test's thread only.

use bourse_t2t::gen::{synthetic, GenConfig, Sizes};
use bourse_t2t::reactor::{Reactor, ReactorConfig};
use bourse_testkit::alloc::{count_allocations, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn reacting_to_packets_allocates_nothing() {
    let packets = synthetic(&GenConfig {
        packets: 6_000,
        instruments: 4,
        sizes: Sizes::parse("1-20").unwrap(),
        ..GenConfig::default()
    })
    .unwrap();
    let mut damaged: Vec<Vec<u8>> = packets
        .iter()
        .step_by(97)
        .map(|p| p[..p.len() - 3].to_vec())
        .collect();
    damaged.push(vec![0xff; 40]);
    let mut r = Reactor::new(ReactorConfig::default()).unwrap();
    for p in &packets[..50] {
        r.on_datagram(p, 1);
    }
    assert_eq!(
        r.books().instruments().len(),
        4,
        "every instrument seen in the warm-up"
    );
    let ((), allocations) = count_allocations(|| {
        for (k, p) in packets[50..].iter().enumerate() {
            r.on_datagram(p, 1_700_000_000_000_000_000 + k as u64 * 1_000);
            if k % 60 == 0 {
                r.on_datagram(&damaged[(k / 60) % damaged.len()], 0);
            }
        }
    });
    assert!(r.stats().orders > 100);
    assert!(r.stats().truncated > 10);
    assert_eq!(allocations, 0, "allocations while reacting");
}

#[test]
fn reacting_to_itch_packets_allocates_nothing() {
    let packets = bourse_t2t::itch::synthetic(&GenConfig {
        packets: 6_000,
        instruments: 4,
        sizes: Sizes::parse("1-31").unwrap(),
        ..GenConfig::default()
    })
    .unwrap();
    let mut damaged: Vec<Vec<u8>> = packets
        .iter()
        .step_by(97)
        .map(|p| p[..p.len() - 3].to_vec())
        .collect();
    damaged.push(vec![0xff; 40]);
    let mut r = Reactor::new(ReactorConfig {
        feed: bourse_t2t::FeedFormat::Itch,
        ..ReactorConfig::default()
    })
    .unwrap();
    // The warm-up takes the stock directory (each stock's template is encoded then).
    for p in &packets[..50] {
        r.on_datagram(p, 1);
    }
    assert_eq!(r.books().instruments().len(), 4, "every stock defined");
    let ((), allocations) = count_allocations(|| {
        for (k, p) in packets[50..].iter().enumerate() {
            r.on_datagram(p, 1_700_000_000_000_000_000 + k as u64 * 1_000);
            if k % 60 == 0 {
                r.on_datagram(&damaged[(k / 60) % damaged.len()], 0);
                // A copy of the packet just applied: a duplicate.
                r.on_datagram(p, 0);
            }
        }
    });
    assert!(r.stats().orders > 100);
    assert!(r.stats().truncated > 10);
    assert!(r.stats().duplicates > 10);
    assert_eq!(allocations, 0, "allocations while reacting to ITCH");
}
