//! The publisher's encoding path allocates nothing per event in steady state. A counting
//! global allocator watches `Publisher::publish` after a warm-up; what remains is the books'
//! own growth (a B-tree node when price levels split, a slab slot past the peak).

mod common;

use bourse_marketdata::{Channel, PacketSink};
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwards the caller's layout to the system allocator unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    let mut run = |h: &mut Harness, batches: u32, count: bool| -> u64 {
        let mut events_total = 0u64;
        for _ in 0..batches {
            h.batch(20);
            let events = std::mem::take(&mut h.events);
            events_total += events.len() as u64;
            COUNTING.store(count, Ordering::Relaxed);
            h.publisher.publish(&events, h.now_ns, &mut sink);
            COUNTING.store(false, Ordering::Relaxed);
            h.events = events;
        }
        events_total
    };
    run(&mut h, 20_000, false);
    ALLOCATIONS.store(0, Ordering::Relaxed);
    let events = run(&mut h, 20_000, true);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    eprintln!("{allocations} allocations over {events} events");
    assert!(sink.0 > 0);
    // Encoding allocates nothing; the books' B-trees split a node now and then.
    assert!(
        allocations * 100 < events,
        "{allocations} allocations over {events} events"
    );
}
