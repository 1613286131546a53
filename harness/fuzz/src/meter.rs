//! A counting global allocator: how many bytes a call had allocated at its peak, per
//! thread, so a fuzz target can assert that memory grows with its input by no more than a
//! fixed factor (a parser that builds a 32-byte node per input byte fails that at once).
//!
//! It wraps the system allocator and keeps two thread-local counters (live bytes, and the
//! highest live count since [`peak_during`] started). Allocations made by other threads do
//! not count, so tests running in parallel do not disturb each other.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // Const-initialised and without destructors: reading them never allocates, so the
    // allocator can use them.
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, counting per thread.
pub struct Meter;

#[global_allocator]
static METER: Meter = Meter;

fn grew(n: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(n);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(n: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(n)));
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the `GlobalAlloc`
// contract; the counters only observe sizes and never touch the memory.
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same layout contract as our caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same layout contract as our caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` and `layout` come from `System` as above; `new_size` is the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

/// Runs `f` and returns its result with the most bytes that were live at once during the
/// call on this thread, beyond those live when it started (so what `f` itself needed,
/// including what it returns).
pub fn peak_during<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, peak.saturating_sub(base))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::peak_during;

    #[test]
    fn counts_what_a_call_allocates_at_its_peak() {
        let ((), peak) = peak_during(|| {
            let a = vec![0u8; 1 << 20];
            drop(a);
            let b = vec![0u8; 1000];
            drop(b);
        });
        assert!((1 << 20..(1 << 20) + 4096).contains(&peak), "{peak}");
        let (v, peak) = peak_during(|| Vec::<u8>::with_capacity(10));
        assert_eq!((v.capacity(), peak), (10, 10));
    }
}
