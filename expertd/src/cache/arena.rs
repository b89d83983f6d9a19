//! The cache's memory: one allocation, made up front, holding every resident slot followed by
//! the transient pool, each `slot_bytes` long and 4096-aligned so an `O_DIRECT` read lands in
//! it directly and the int8 kernels use the bytes in place. Owns the allocation and the
//! address arithmetic; it does not decide who may touch which slot (that is the planner's pins
//! and the lease guards in [`super::lease`]).
//!
//! The memory is zeroed by the allocator: for an arena this large it is a fresh anonymous
//! mapping, so pages are committed on first write, not at startup. Arenas of at least 2 MiB
//! are aligned to 2 MiB and advised `MADV_HUGEPAGE`, so transparent huge pages (when the
//! system allows them) cut the TLB misses of the kernels' streaming reads; the advice is a
//! hint and its failure is only reported in [`Arena::huge_pages`].

use super::CacheError;
use std::alloc::Layout;
use std::ptr::NonNull;

/// Alignment of every slot: the container's blob alignment and the `O_DIRECT` block size.
pub const SLOT_ALIGN: usize = 4096;
/// Alignment of arenas of at least this size, so that huge pages can back them.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// The slots' memory; see the module doc.
pub(crate) struct Arena {
    ptr: NonNull<u8>,
    /// `None` for an empty arena (nothing was allocated).
    layout: Option<Layout>,
    slot_bytes: usize,
    n_slots: u32,
    n_transient: u32,
    huge_pages: bool,
}

// SAFETY: the arena owns its allocation outright (no aliasing handles exist outside it), and
// it only hands out raw pointers; who may read or write through them at any time is decided
// by the planner's pins and enforced by the lease guards, which are the only users.
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only computes addresses.
unsafe impl Sync for Arena {}

impl Arena {
    /// Allocates `n_slots + n_transient` slots of `slot_bytes` (a positive multiple of
    /// [`SLOT_ALIGN`], checked by the caller).
    pub fn new(slot_bytes: usize, n_slots: u32, n_transient: u32) -> Result<Arena, CacheError> {
        debug_assert!(slot_bytes > 0 && slot_bytes.is_multiple_of(SLOT_ALIGN));
        let n = u64::from(n_slots) + u64::from(n_transient);
        let bytes = n.checked_mul(slot_bytes as u64).filter(|&b| b <= isize::MAX as u64).ok_or(CacheError::ArenaAlloc { bytes: u64::MAX })?;
        let bytes = bytes as usize;
        if bytes == 0 {
            return Ok(Arena { ptr: NonNull::dangling(), layout: None, slot_bytes, n_slots, n_transient, huge_pages: false });
        }
        let align = if bytes >= HUGE_PAGE_BYTES { HUGE_PAGE_BYTES } else { SLOT_ALIGN };
        let layout = Layout::from_size_align(bytes, align).map_err(|_| CacheError::ArenaAlloc { bytes: bytes as u64 })?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(CacheError::ArenaAlloc { bytes: bytes as u64 })?;
        let huge_pages = align == HUGE_PAGE_BYTES && advise_huge_pages(ptr, bytes);
        Ok(Arena { ptr, layout: Some(layout), slot_bytes, n_slots, n_transient, huge_pages })
    }

    /// Start of resident slot `slot` (< `n_slots`).
    pub fn slot_ptr(&self, slot: u32) -> NonNull<u8> {
        assert!(slot < self.n_slots, "slot {slot} of {}", self.n_slots);
        self.at(slot as usize)
    }

    /// Start of transient buffer `buffer` (< `n_transient`).
    pub fn transient_ptr(&self, buffer: u32) -> NonNull<u8> {
        assert!(buffer < self.n_transient, "transient buffer {buffer} of {}", self.n_transient);
        self.at(self.n_slots as usize + buffer as usize)
    }

    fn at(&self, i: usize) -> NonNull<u8> {
        // SAFETY: `i` < n_slots + n_transient (asserted by the callers), so the offset
        // `i × slot_bytes` stays inside the allocation of `(n_slots + n_transient) × slot_bytes`.
        unsafe { self.ptr.add(i * self.slot_bytes) }
    }

    /// Resident slots.
    pub fn n_slots(&self) -> u32 {
        self.n_slots
    }

    /// Transient buffers.
    pub fn n_transient(&self) -> u32 {
        self.n_transient
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes allocated: resident slots plus the transient pool.
    pub fn total_bytes(&self) -> u64 {
        self.layout.map_or(0, |l| l.size() as u64)
    }

    /// Whether `MADV_HUGEPAGE` was accepted for the arena.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }
}

/// Asks for transparent huge pages on `[ptr, ptr + bytes)`; returns whether the kernel agreed.
fn advise_huge_pages(ptr: NonNull<u8>, bytes: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the range is one live allocation owned by the caller, page-aligned (2 MiB);
        // MADV_HUGEPAGE only changes how the kernel backs it, never its contents.
        unsafe { libc::madvise(ptr.as_ptr().cast(), bytes, libc::MADV_HUGEPAGE) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (ptr, bytes);
        false
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed exactly once, here; no
            // lease outlives the arena (each holds an `Arc` of the cache state that owns it).
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}
