//! The heap's live bytes, counted by a global allocator a binary or test opts into.
//!
//! [`Counting`] wraps another allocator (the system's, or any `GlobalAlloc`) and adds every
//! allocation's size to one process-wide counter and takes every free's away, so
//! [`live_bytes`] is exactly what the program holds, blind to what the allocator underneath
//! keeps for reuse: comparing it with RSS tells a live structure that grows from an allocator
//! that retains. Nothing is counted unless a program declares it its `#[global_allocator]`
//! (the `bourse` binary does with its `count-alloc` feature; the steady-memory test always).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicI64, Ordering};

/// Live heap bytes of this process, as counted by [`Counting`] (zero when it is not the
/// global allocator).
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

/// A global allocator that counts live bytes and forwards every call to `A`.
pub struct Counting<A>(A);

impl<A> Counting<A> {
    pub const fn new(inner: A) -> Counting<A> {
        Counting(inner)
    }
}

/// The heap's live bytes: allocations minus frees since the start, when [`Counting`] is the
/// process's global allocator; zero otherwise.
pub fn live_bytes() -> i64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

// SAFETY: every call is forwarded to the inner allocator with the caller's own arguments; the
// counter only observes sizes. A global allocator is unsafe to implement by definition.
#[allow(unsafe_code)]
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's arguments, as the caller gave them, to the inner allocator.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's arguments, as the caller gave them, to the inner allocator.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's arguments, as the caller gave them, to the inner allocator.
        unsafe { self.0.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's arguments, as the caller gave them, to the inner allocator.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        p
    }
}
