// Its own binary, outside tests/it: its #[global_allocator] would become every test's there.
//! The publisher's encoding path allocates nothing per event in steady state. A counting
//! global allocator watches `Publisher::publish` after a warm-up; what remains is the books'
//! own growth (a B-tree node when price levels split, a slab slot past the peak).

#[path = "it/common/mod.rs"]
mod common;

use bourse_marketdata::{Channel, PacketSink};
use bourse_testkit::alloc::{count_allocations, CountingAllocator};
use common::*;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

struct NullSink(u64);
impl PacketSink for NullSink {
    fn send(&mut self, _channel: Channel, packet: &[u8]) {
        self.0 += packet.len() as u64;
    }
}

#[test]
fn publishing_allocates_almost_nothing_per_event_after_warm_up() {
    // A short replay history, so that the warm-up fills it and its buffers get reused.
    let config = bourse_marketdata::PublisherConfig {
        replay_history_packets: 1_000,
        ..test_publisher_config()
    };
    let mut h = Harness::new(3, config);
    let mut sink = NullSink(0);
    // Returns the events published and the allocations made while publishing them.
    let mut run = |h: &mut Harness, batches: u32| -> (u64, u64) {
        let (mut events_total, mut allocations) = (0u64, 0u64);
        for _ in 0..batches {
            h.batch(20);
            let events = std::mem::take(&mut h.events);
            events_total += events.len() as u64;
            let ((), n) = count_allocations(|| h.publisher.publish(&events, h.now_ns, &mut sink));
            allocations += n;
            h.events = events;
        }
        (events_total, allocations)
    };
    run(&mut h, 20_000);
    let (events, allocations) = run(&mut h, 20_000);
    eprintln!("{allocations} allocations over {events} events");
    assert!(sink.0 > 0);
    // Encoding allocates nothing; the books' B-trees split a node now and then.
    assert!(
        allocations * 100 < events,
        "{allocations} allocations over {events} events"
    );
}

/// The sending path as the nodes run it: a replay history far from full (so every packet
/// lands in fresh ring space) and UDP sends to loopback. Keeping and sending a packet
/// allocates nothing, and feeds A and B of every packet of a flush leave in one system call.
#[test]
fn keeping_and_sending_packets_allocates_nothing_and_takes_one_syscall_per_flush() {
    use bourse_marketdata::udp::{bind_receiver, FeedAddrs, UdpSink};
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
    let rx_a = bind_receiver(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let rx_b = bind_receiver(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let (SocketAddr::V4(a), SocketAddr::V4(b)) =
        (rx_a.local_addr().unwrap(), rx_b.local_addr().unwrap())
    else {
        panic!("IPv4 receivers");
    };
    let mut addrs = FeedAddrs::localhost(0);
    for c in addrs.channels.iter_mut() {
        c.a = a;
        c.b = b;
    }
    let mut sink = UdpSink::new(addrs).unwrap();
    let config = bourse_marketdata::PublisherConfig {
        replay_history_packets: 1_000_000,
        ..test_publisher_config()
    };
    let mut h = Harness::new(5, config);
    // Returns the allocations made while publishing.
    let run = |h: &mut Harness, sink: &mut UdpSink, batches: u32| -> u64 {
        let mut allocations = 0u64;
        for _ in 0..batches {
            h.batch(20);
            let events = std::mem::take(&mut h.events);
            let ((), n) = count_allocations(|| h.publisher.publish(&events, h.now_ns, sink));
            allocations += n;
            h.events = events;
        }
        allocations
    };
    run(&mut h, &mut sink, 20_000);
    let packets_before: u64 = Channel::ALL
        .iter()
        .map(|&c| h.publisher.counters(c).packets_sent)
        .sum();
    let (calls_before, kept_before) =
        (sink.send_calls, h.publisher.history().lock().unwrap().len());
    let allocations = run(&mut h, &mut sink, 20_000);
    let packets: u64 = Channel::ALL
        .iter()
        .map(|&c| h.publisher.counters(c).packets_sent)
        .sum::<u64>()
        - packets_before;
    let calls = sink.send_calls - calls_before;
    let kept = h.publisher.history().lock().unwrap().len() - kept_before;
    eprintln!(
        "{allocations} allocations, {calls} sendmmsg calls for {packets} packets \
         ({kept} new order-log packets kept), {} send errors",
        sink.send_errors
    );
    assert!(kept > 1_000, "the history grew: {kept}");
    assert!(packets > 10_000);
    // What remains is the books' own growth, far below one per packet.
    assert!(
        allocations * 100 < packets,
        "{allocations} allocations for {packets} packets"
    );
    // One call per channel flush, carrying both feeds: never more than one per packet.
    assert!(calls <= packets, "{calls} calls for {packets} packets");
    assert_eq!(sink.send_errors, 0);
}
