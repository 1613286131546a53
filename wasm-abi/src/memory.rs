//! The allocator a module exports as `proxy_on_memory_allocate`: the host calls it for a
//! block to write a returned value into, and [`crate::hostcalls`] adopts that block as a
//! `Vec<u8>` (its module doc says why that is sound).

use std::alloc::{alloc, Layout};
use std::ptr::{null_mut, NonNull};

/// A block of `size` bytes of alignment 1 from the global allocator; null if memory is
/// exhausted.
pub fn allocate(size: usize) -> *mut u8 {
    if size == 0 {
        // What an empty `Vec<u8>` holds; adopting it with capacity 0 frees nothing.
        return NonNull::<u8>::dangling().as_ptr();
    }
    match Layout::array::<u8>(size) {
        // SAFETY: a non-zero-sized layout.
        Ok(layout) => unsafe { alloc(layout) },
        Err(_) => null_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_adopted_and_freed_as_a_vec() {
        let p = allocate(16);
        assert!(!p.is_null());
        // SAFETY: a block of 16 bytes from `allocate`, written before it is read.
        let v = unsafe {
            p.write_bytes(7, 16);
            Vec::from_raw_parts(p, 16, 16)
        };
        assert_eq!(v, vec![7; 16]);
        let empty = allocate(0);
        // SAFETY: the dangling pointer of capacity 0, as an empty `Vec` holds.
        let v = unsafe { Vec::from_raw_parts(empty, 0, 0) };
        assert!(v.is_empty());
    }
}
