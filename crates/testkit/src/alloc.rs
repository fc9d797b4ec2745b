//! A counting global allocator for the tests that prove a path allocates nothing.
//!
//! A test binary installs it with
//! `#[global_allocator] static A: CountingAllocator = CountingAllocator;` and measures with
//! [`count_allocations`]. Counting is per thread, so tests running side by side in one binary
//! do not count each other's allocations; frees are not counted (a path that allocates and
//! frees at once still allocates).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// While set, allocations on this thread are counted into it.
    static WATCHED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Forwards to the system allocator and counts the allocations of a thread inside
/// [`count_allocations`].
pub struct CountingAllocator;

// A global allocator is unsafe to implement by definition; this one counts and forwards.
#[allow(unsafe_code)]
// SAFETY: every call goes unchanged to the system allocator, which upholds the contract.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // `try_with`: the allocator may be called while this thread's locals are torn down.
        let _ = WATCHED.try_with(|w| w.set(w.get().map(|n| n + 1)));
        // SAFETY: the caller's layout, forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs `f` and returns its result with the number of allocations this thread made in it.
///
/// Panics if the binary did not install [`CountingAllocator`] (one `Box` is counted first), so
/// a test can never pass by counting nothing; and if called inside itself.
pub fn count_allocations<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let outer = WATCHED.with(|w| w.replace(Some(0)));
    assert!(outer.is_none(), "count_allocations called inside itself");
    std::hint::black_box(Box::new(0u64));
    let probe = WATCHED.with(|w| w.replace(Some(0)));
    assert_eq!(
        probe,
        Some(1),
        "one Box not counted as one allocation: install `CountingAllocator` as this test \
         binary's #[global_allocator]"
    );
    let result = f();
    let allocations = WATCHED.with(|w| w.take()).expect("counting was on");
    (result, allocations)
}
