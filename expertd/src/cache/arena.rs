//! The cache's memory: one reservation of address space, made up front, holding every resident
//! slot followed by the transient pool, each `slot_bytes` long and 4096-aligned so an `O_DIRECT`
//! read lands in it directly and the int8 kernels use the bytes in place. Owns the mapping and
//! the address arithmetic; it does not decide who may touch which slot (that is the planner's
//! pins and the lease guards in [`super::lease`]).
//!
//! **The budget is a cap, not an allocation.** The arena is a private anonymous mapping made
//! with `MAP_NORESERVE` and without `MAP_POPULATE`, and nothing writes to it at start: the
//! kernel hands out zero pages on first touch, so resident memory grows only as experts are
//! read into slots (a slot is written by exactly one read before any lease reads it). (The
//! earlier `alloc_zeroed` with a 2 MiB alignment is served by `std` as an aligned allocation
//! followed by an explicit zeroing loop, which committed the whole budget at start.) Arenas of
//! at least 2 MiB are placed at a 2 MiB boundary and advised `MADV_HUGEPAGE`, so transparent
//! huge pages (when the system allows them) cut the TLB misses of the kernels' streaming reads;
//! the advice commits nothing by itself, it is a hint, and its failure is only reported in
//! [`Arena::huge_pages`].

use super::CacheError;
use rustix::mm;
use std::ptr::NonNull;

/// Alignment of every slot: the container's blob alignment and the `O_DIRECT` block size.
pub const SLOT_ALIGN: usize = 4096;
/// Alignment of arenas of at least this size, so that huge pages can back them.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// The slots' memory; see the module doc.
pub(crate) struct Arena {
    ptr: NonNull<u8>,
    /// Bytes mapped at `ptr` (0 for an empty arena: nothing was mapped).
    bytes: usize,
    slot_bytes: usize,
    n_slots: u32,
    n_transient: u32,
    huge_pages: bool,
}

// SAFETY: the arena owns its mapping outright (no aliasing handles exist outside it), and
// it only hands out raw pointers; who may read or write through them at any time is decided
// by the planner's pins and enforced by the lease guards, which are the only users.
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only computes addresses.
unsafe impl Sync for Arena {}

impl Arena {
    /// Reserves `n_slots + n_transient` slots of `slot_bytes` (a positive multiple of
    /// [`SLOT_ALIGN`], checked by the caller). Commits no memory: see the module doc.
    pub(super) fn new(
        slot_bytes: usize,
        n_slots: u32,
        n_transient: u32,
    ) -> Result<Arena, CacheError> {
        assert!(slot_bytes > 0 && slot_bytes.is_multiple_of(SLOT_ALIGN));
        let n = u64::from(n_slots) + u64::from(n_transient);
        let bytes = n
            .checked_mul(slot_bytes as u64)
            .filter(|&b| b <= isize::MAX as u64 / 2)
            .ok_or(CacheError::ArenaAlloc { bytes: u64::MAX })?;
        let bytes = bytes as usize;
        if bytes == 0 {
            return Ok(Arena {
                ptr: NonNull::dangling(),
                bytes: 0,
                slot_bytes,
                n_slots,
                n_transient,
                huge_pages: false,
            });
        }
        let align = if bytes >= HUGE_PAGE_BYTES {
            HUGE_PAGE_BYTES
        } else {
            SLOT_ALIGN
        };
        let ptr = map_aligned(bytes, align).ok_or(CacheError::ArenaAlloc {
            bytes: bytes as u64,
        })?;
        let huge_pages = align == HUGE_PAGE_BYTES && advise_huge_pages(ptr, bytes);
        Ok(Arena {
            ptr,
            bytes,
            slot_bytes,
            n_slots,
            n_transient,
            huge_pages,
        })
    }

    /// Start of resident slot `slot` (< `n_slots`).
    pub(super) fn slot_ptr(&self, slot: u32) -> NonNull<u8> {
        assert!(slot < self.n_slots, "slot {slot} of {}", self.n_slots);
        self.at(slot as usize)
    }

    /// Start of transient buffer `buffer` (< `n_transient`).
    pub(super) fn transient_ptr(&self, buffer: u32) -> NonNull<u8> {
        assert!(
            buffer < self.n_transient,
            "transient buffer {buffer} of {}",
            self.n_transient
        );
        self.at(self.n_slots as usize + buffer as usize)
    }

    fn at(&self, i: usize) -> NonNull<u8> {
        // SAFETY: `i` < n_slots + n_transient (asserted by the callers), so the offset
        // `i × slot_bytes` stays inside the mapping of `(n_slots + n_transient) × slot_bytes`.
        unsafe { self.ptr.add(i * self.slot_bytes) }
    }

    /// Resident slots.
    pub(super) fn n_slots(&self) -> u32 {
        self.n_slots
    }

    /// Transient buffers.
    pub(super) fn n_transient(&self) -> u32 {
        self.n_transient
    }

    /// Bytes of one slot.
    pub(super) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes reserved: resident slots plus the transient pool (address space; what is
    /// resident is only what has been written).
    pub(super) fn total_bytes(&self) -> u64 {
        self.bytes as u64
    }

    /// The whole mapping as `(start, len)`, for residency checks in tests.
    #[cfg(test)]
    pub(super) fn span(&self) -> (NonNull<u8>, usize) {
        (self.ptr, self.bytes)
    }

    /// Whether `MADV_HUGEPAGE` was accepted for the arena.
    pub(super) fn huge_pages(&self) -> bool {
        self.huge_pages
    }
}

/// Maps `bytes` (> 0) of private, anonymous, unpopulated memory at an `align`-aligned address
/// (`align` a power of two, a multiple of the page size): maps `bytes + align` and unmaps the
/// unaligned head and the tail. `None` when the kernel refuses.
fn map_aligned(bytes: usize, align: usize) -> Option<NonNull<u8>> {
    let span = bytes.checked_add(align)?;
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing (no fixed
    // address, no file): it aliases nothing. MAP_NORESERVE without MAP_POPULATE commits no
    // memory; pages are zero-filled on first touch.
    let raw = unsafe {
        mm::mmap_anonymous(
            std::ptr::null_mut(),
            span,
            mm::ProtFlags::READ | mm::ProtFlags::WRITE,
            mm::MapFlags::PRIVATE | mm::MapFlags::NORESERVE,
        )
    }
    .ok()?;
    let base = raw as usize;
    let start = base.next_multiple_of(align);
    let head = start - base;
    let tail = span - head - bytes;
    // SAFETY: `[base, base + head)` and `[start + bytes, base + span)` are page-aligned (base,
    // align and bytes are multiples of the page size) parts of the mapping just made, disjoint
    // from the `[start, start + bytes)` kept, and nothing refers to them.
    unsafe {
        if head > 0 {
            let _ = mm::munmap(raw, head);
        }
        if tail > 0 {
            let _ = mm::munmap((start + bytes) as *mut std::ffi::c_void, tail);
        }
    }
    NonNull::new(start as *mut u8)
}

/// Asks for transparent huge pages on `[ptr, ptr + bytes)`; returns whether the kernel agreed.
fn advise_huge_pages(ptr: NonNull<u8>, bytes: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the range is one live mapping owned by the caller, 2 MiB-aligned;
        // MADV_HUGEPAGE only changes how the kernel backs later faults, never the contents, and
        // commits nothing.
        unsafe { mm::madvise(ptr.as_ptr().cast(), bytes, mm::Advice::LinuxHugepage).is_ok() }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (ptr, bytes);
        false
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // SAFETY: `[ptr, ptr + bytes)` is the mapping made by `map_aligned` and is unmapped
            // exactly once, here; no lease outlives the arena (each holds an `Arc` of the cache
            // state that owns it).
            let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.bytes) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of `[ptr, ptr + len)` resident in memory (4 KiB pages), by the "present" bit (63) of
    /// each page's entry in `/proc/self/pagemap`.
    fn resident_bytes(ptr: NonNull<u8>, len: usize) -> usize {
        use std::os::unix::fs::FileExt;
        const PAGE: usize = 4096;
        let pagemap = std::fs::File::open("/proc/self/pagemap").expect("open /proc/self/pagemap");
        let mut entries = vec![0u8; len.div_ceil(PAGE) * 8];
        pagemap
            .read_exact_at(&mut entries, (ptr.as_ptr() as usize / PAGE * 8) as u64)
            .expect("read /proc/self/pagemap");
        let present = entries.chunks_exact(8).filter(|e| e[7] & 0x80 != 0).count();
        present * PAGE
    }

    #[test]
    fn a_big_arena_commits_nothing_until_a_slot_is_written() {
        // 1 GiB of address space: 250 slots of 4 MiB and a transient pool of 6.
        let slot = 4 << 20;
        let arena = Arena::new(slot, 250, 6).expect("arena");
        let (ptr, len) = arena.span();
        assert_eq!(len, 256 * slot);
        assert_eq!(arena.total_bytes(), len as u64);
        assert_eq!(
            ptr.as_ptr() as usize % HUGE_PAGE_BYTES,
            0,
            "a big arena starts on a 2 MiB boundary"
        );
        assert_eq!(
            resident_bytes(ptr, len),
            0,
            "nothing is resident right after start"
        );
        // Filling one slot (as a read does) commits that slot and no more (huge pages may
        // round to their 2 MiB).
        let s = arena.slot_ptr(7);
        // SAFETY: slot 7 is `slot` bytes inside the arena and nothing else refers to it.
        unsafe { std::ptr::write_bytes(s.as_ptr(), 0xA5, slot) };
        let resident = resident_bytes(ptr, len);
        assert!(
            (slot..=slot + 2 * HUGE_PAGE_BYTES).contains(&resident),
            "{resident} bytes resident after one {slot}-byte slot"
        );
        // SAFETY: as above; the slot was just written.
        let back = unsafe { std::slice::from_raw_parts(s.as_ptr(), slot) };
        assert!(back.iter().all(|&b| b == 0xA5));
        let t = arena.transient_ptr(5);
        assert_eq!(t.as_ptr() as usize % SLOT_ALIGN, 0);
        // SAFETY: the last transient buffer is `slot` bytes inside the arena, never written: it
        // reads as zeros (fresh anonymous pages).
        let zeros = unsafe { std::slice::from_raw_parts(t.as_ptr(), slot) };
        assert!(zeros.iter().all(|&b| b == 0));
    }

    #[test]
    fn small_and_empty_arenas_are_slot_aligned() {
        let arena = Arena::new(SLOT_ALIGN, 3, 1).expect("arena");
        assert_eq!(arena.total_bytes(), 4 * SLOT_ALIGN as u64);
        for i in 0..3 {
            assert_eq!(arena.slot_ptr(i).as_ptr() as usize % SLOT_ALIGN, 0);
        }
        assert!(
            !arena.huge_pages(),
            "below 2 MiB no huge-page advice is asked for"
        );
        let empty = Arena::new(SLOT_ALIGN, 0, 0).expect("empty arena");
        assert_eq!(empty.total_bytes(), 0);
    }
}
