//! Copies between this process's memory and memory another process maps and may write at the
//! same moment (a shared-memory segment, the call ring's cells), done with relaxed atomic
//! 32-bit loads and stores: a peer that writes while we copy can change which bytes we get, but
//! never makes the copy a data race — so "a hostile client cannot cause undefined behaviour in
//! the daemon" holds literally, not only in practice. Every access to peer-mapped words is a
//! 32-bit atomic (activations, outputs, ids and weights are all 4-byte values at 4-aligned
//! offsets), so no two threads of this process access the same bytes with atomics of different
//! sizes; only the ring's error text, written by one worker and read by its client, goes byte by
//! byte ([`load_bytes_from_shared`], [`store_bytes_to_shared`]). Relaxed atomics compile to
//! plain moves; the copy runs at several GB/s.

use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

/// Copies `out.len()` bytes from `src` into `out`, one 32-bit word at a time.
///
/// # Safety
///
/// `src` must be 4-aligned and `src..src + out.len()` valid for reads and writes (a read-write
/// mapping) for the whole call; every access other threads of this process make to it must be
/// a 32-bit atomic (the peer process may do anything).
///
/// # Panics
///
/// If `src` is not 4-aligned or `out.len()` is not a multiple of 4.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the word pointers are 4-aligned: asserted before the first access"
)]
pub unsafe fn load_from_shared(src: *const u8, out: &mut [u8]) {
    // PERF-CRITICAL: a call's activations and cells, every call.
    assert!(
        src.cast::<u32>().is_aligned() && out.len().is_multiple_of(4),
        "shared copy of {} bytes at {src:p}: needs 4-aligned whole words",
        out.len()
    );
    for (i, o) in out.chunks_exact_mut(4).enumerate() {
        // SAFETY: `src + 4i` is 4-aligned (asserted) and the word lies inside the source range;
        // the range is valid for reads and writes (caller).
        let v = unsafe { AtomicU32::from_ptr(src.cast::<u32>().add(i).cast_mut()) }
            .load(Ordering::Relaxed);
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// Copies `data` to `dst..dst + data.len()`, one 32-bit word at a time.
///
/// # Safety
///
/// As [`load_from_shared`], for `dst` and `data.len()`.
///
/// # Panics
///
/// If `dst` is not 4-aligned or `data.len()` is not a multiple of 4.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the word pointers are 4-aligned: asserted before the first access"
)]
pub unsafe fn store_to_shared(dst: *mut u8, data: &[u8]) {
    // PERF-CRITICAL: a call's output, every call.
    assert!(
        dst.cast::<u32>().is_aligned() && data.len().is_multiple_of(4),
        "shared copy of {} bytes to {dst:p}: needs 4-aligned whole words",
        data.len()
    );
    for (i, w) in data.chunks_exact(4).enumerate() {
        let v = u32::from_le_bytes(w.try_into().expect("4 bytes"));
        // SAFETY: `dst + 4i` is 4-aligned (asserted), inside the destination range, which is
        // valid for reads and writes (caller).
        unsafe { AtomicU32::from_ptr(dst.cast::<u32>().add(i)) }.store(v, Ordering::Relaxed);
    }
}

/// Writes `len` (a multiple of 4) zero bytes at the 4-aligned `dst`.
///
/// # Safety
///
/// As [`store_to_shared`], for `dst..dst + len`.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the word pointers are 4-aligned: asserted before the first access"
)]
pub unsafe fn zero_shared(dst: *mut u8, len: usize) {
    assert!(
        dst.cast::<u32>().is_aligned() && len.is_multiple_of(4),
        "zeroing {len} shared bytes at {dst:p}: needs 4-aligned whole words"
    );
    for i in 0..len / 4 {
        // SAFETY: 4-aligned (asserted) and inside the destination range (caller).
        unsafe { AtomicU32::from_ptr(dst.cast::<u32>().add(i)) }.store(0, Ordering::Relaxed);
    }
}

/// Copies `out.len()` bytes from `src` byte by byte (the ring's error text).
///
/// # Safety
///
/// `src..src + out.len()` valid for reads and writes for the whole call; every access other
/// threads of this process make to it is a byte atomic.
pub unsafe fn load_bytes_from_shared(src: *const u8, out: &mut [u8]) {
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: inside the source range (caller), one byte, atomically.
        *o = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// Copies `data` to `dst` byte by byte (the ring's error text).
///
/// # Safety
///
/// As [`load_bytes_from_shared`], for `dst..dst + data.len()`.
pub unsafe fn store_bytes_to_shared(dst: *mut u8, data: &[u8]) {
    for (i, &b) in data.iter().enumerate() {
        // SAFETY: inside the destination range (caller), one byte, atomically.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_exact_for_every_word_count_and_bytes_at_every_length() {
        let src: Vec<u32> = (0..64u32).map(|i| i.wrapping_mul(0x9E37_79B9)).collect();
        let src_bytes: &[u8] = bytemuck::cast_slice(&src);
        for start in 0..4 {
            for words in [0usize, 1, 2, 3, 7, 16, 33] {
                let len = 4 * words;
                let at = 4 * start;
                let mut out = vec![0u8; len];
                // SAFETY: 4-aligned, inside `src`, accessed by this thread only.
                unsafe { load_from_shared(src_bytes.as_ptr().add(at), &mut out) };
                assert_eq!(out, src_bytes[at..at + len], "load {at}+{len}");
                let mut dst = vec![0xAAAA_AAAAu32; 64];
                let dst_bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut dst);
                // SAFETY: as above, for writes.
                unsafe { store_to_shared(dst_bytes.as_mut_ptr().add(at), &src_bytes[..len]) };
                assert_eq!(
                    &dst_bytes[at..at + len],
                    &src_bytes[..len],
                    "store {at}+{len}"
                );
                assert!(
                    dst_bytes[..at].iter().all(|&b| b == 0xAA),
                    "store wrote before"
                );
                assert!(
                    dst_bytes[at + len..].iter().all(|&b| b == 0xAA),
                    "store wrote past"
                );
            }
        }
        for len in 0..20 {
            let mut out = vec![0u8; len];
            // SAFETY: inside `src`, accessed by this thread only.
            unsafe { load_bytes_from_shared(src_bytes.as_ptr().add(3), &mut out) };
            assert_eq!(out, src_bytes[3..3 + len]);
        }
    }

    #[test]
    #[should_panic(expected = "needs 4-aligned whole words")]
    fn a_misaligned_word_copy_is_refused() {
        let src = [0u32; 4];
        let mut out = [0u8; 4];
        // SAFETY: inside `src`; the call panics on the alignment before reading.
        unsafe {
            load_from_shared(
                bytemuck::cast_slice::<u32, u8>(&src).as_ptr().add(1),
                &mut out,
            );
        };
    }
}
