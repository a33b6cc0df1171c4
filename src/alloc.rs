//! The process's allocator: mimalloc, called the way a C program calls it.
//!
//! The `mimalloc` crate hands every allocation to `mi_malloc_aligned`, because a Rust
//! allocation always comes with an alignment. mimalloc (v3, as v2) takes that call's fast path
//! only while the size class's free list holds a block; otherwise it falls to its generic
//! aligned path, which over-allocates by `align - 1` whenever the block size is not a power
//! of two, so a 48-byte request is served from the 56- or 64-byte class. Those blocks return
//! to the larger class, the natural class's free list is never refilled by them, and the
//! next request of that size takes the slow path again. On the gateway's route without limits
//! that was 6 of its 10.7 allocations per request (callgrind); see docs/performance.md.
//!
//! Every mimalloc block of 16 bytes or more is 16-aligned (`MI_MAX_ALIGN_SIZE`, what `malloc`
//! owes `max_align_t`), so a layout whose alignment is at most 16 and at most its size (a Rust
//! layout's size is a multiple of its alignment) goes to plain `mi_malloc`, as `std`'s own
//! `System` allocator sends such layouts to `malloc`. Larger alignments keep the aligned API.
//! `mi_free` frees blocks of either kind.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};

use libmimalloc_sys as mi;

/// mimalloc's guaranteed alignment for blocks of at least this size (`MI_MAX_ALIGN_SIZE`).
const MALLOC_ALIGN: usize = 16;

/// The global allocator (`#[global_allocator]` in `main.rs`).
pub struct Mimalloc;

/// Whether plain `malloc` already gives `layout` its alignment.
#[inline]
fn natural(align: usize, size: usize) -> bool {
    align <= MALLOC_ALIGN && align <= size
}

// SAFETY: every pointer comes from mimalloc with at least the layout's size and alignment:
// the aligned API where the alignment is larger than malloc's guarantee (or the size smaller
// than the alignment), plain malloc where its guarantee covers the layout (see the module
// comment). `mi_free` and `mi_realloc*` accept pointers from any mimalloc allocation function.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain FFI calls; mimalloc returns null on failure, as `alloc` must.
        unsafe {
            if natural(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if natural(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract), so from mimalloc.
        unsafe { mi::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from mimalloc; the new block keeps `layout.align()` by the same
        // rule as `alloc`, applied to the new size.
        unsafe {
            if natural(layout.align(), new_size) {
                mi::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layout gets a block with its alignment and its size writable, whichever API
    /// served it, through alloc, alloc_zeroed (zeroed, even when handed a block just freed
    /// dirty) and realloc (contents kept); many at once, so blocks come from the middle of
    /// pages, not only their start.
    #[test]
    fn every_layout_gets_its_alignment_and_size() {
        let a = Mimalloc;
        let mut live = Vec::new();
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [
                1, 7, 8, 16, 24, 40, 48, 56, 80, 100, 1000, 1024, 2232, 8192, 70_000,
            ] {
                let size = size.max(align).next_multiple_of(align);
                let layout = Layout::from_size_align(size, align).unwrap();
                for round in 0..40u8 {
                    // SAFETY: a valid, non-zero layout; every block is freed below with it.
                    unsafe {
                        // A block freed dirty first, so that a zeroed one may be handed it.
                        let dirty = a.alloc(layout);
                        assert!(!dirty.is_null());
                        dirty.write_bytes(0xa5, size);
                        a.dealloc(dirty, layout);
                        let zeroed = round % 2 == 1;
                        let p = if zeroed {
                            a.alloc_zeroed(layout)
                        } else {
                            a.alloc(layout)
                        };
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0, "{size} bytes aligned to {align}");
                        if zeroed {
                            assert!((0..size).all(|i| *p.add(i) == 0), "{size}/{align} zeroed");
                        }
                        p.write_bytes(round, size);
                        live.push((p, layout, round));
                    }
                }
            }
        }
        for (p, layout, fill) in live {
            // SAFETY: `p` is live with `layout`; it is reallocated, then freed, once.
            unsafe {
                let grown = layout.size() * 3;
                let q = a.realloc(p, layout, grown);
                assert!(!q.is_null());
                assert_eq!(
                    q as usize % layout.align(),
                    0,
                    "realloc keeps the alignment"
                );
                let kept = std::slice::from_raw_parts(q, layout.size());
                assert!(
                    kept.iter().all(|&b| b == fill),
                    "realloc keeps the contents"
                );
                let new = Layout::from_size_align(grown, layout.align()).unwrap();
                a.dealloc(q, new);
            }
        }
    }

    #[test]
    fn only_what_malloc_guarantees_skips_the_aligned_api() {
        assert!(natural(1, 1));
        assert!(natural(8, 8));
        assert!(natural(8, 48));
        assert!(natural(16, 16));
        assert!(natural(16, 2048));
        assert!(!natural(32, 32), "past malloc's 16");
        assert!(!natural(128, 256));
        assert!(!natural(8, 0), "smaller than its alignment");
    }
}
