// Its own binary, outside tests/it: its #[global_allocator] would become every test's there.
//! The counting allocator counts what a closure allocates on this thread, and nothing of
//! other threads.

use bourse_testkit::alloc::{count_allocations, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn each_allocation_in_the_closure_is_counted_once() {
    let (v, n) = count_allocations(|| {
        let a = std::hint::black_box(vec![1u8; 10]);
        let b = String::from("counted");
        (a.len(), b.len())
    });
    assert_eq!(v, (10, 7));
    assert_eq!(n, 2);
    let ((), none) = count_allocations(|| ());
    assert_eq!(none, 0);
}

#[test]
fn another_threads_allocations_are_not_counted() {
    let ((), n) = count_allocations(|| {
        std::thread::scope(|s| {
            s.spawn(|| std::hint::black_box(vec![0u64; 1_000]).len());
        })
    });
    // Spawning a thread allocates on this thread (its handle, its name); the thousand
    // vectors' worth inside it is not counted here.
    assert!(n < 10, "{n} allocations counted");
}
