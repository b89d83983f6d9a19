//! Copies between this process's memory and memory another process maps and may write at the
//! same moment (a shared-memory segment, the call ring's cells), done with relaxed atomic loads
//! and stores of aligned words (bytes at the unaligned edges): a peer that writes while we copy
//! can change which bytes we get, but never makes the copy a data race — so "a hostile client
//! cannot cause undefined behaviour in the daemon" holds literally, not only in practice.
//! Relaxed atomics of a word compile to plain moves; the copy runs at several GB/s.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Copies `out.len()` bytes from `src` into `out`.
///
/// # Safety
///
/// `src..src + out.len()` must be valid for reads for the whole call, and every access other
/// threads or processes make to it must be atomic or from another process (the segment's
/// peer).
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the word pointers are 8-aligned: `align_offset` skips to the first aligned byte"
)]
#[expect(
    clippy::host_endian_bytes,
    reason = "a word is loaded from memory and stored back as bytes: native order keeps them in place"
)]
pub unsafe fn load_from_shared(src: *const u8, out: &mut [u8]) {
    // PERF-CRITICAL: a call's activations and cells, every call.
    let len = out.len();
    let head = src.align_offset(8).min(len);
    let words = (len - head) / 8;
    for (i, o) in out[..head].iter_mut().enumerate() {
        // SAFETY: inside the source range (caller), one byte, atomically.
        *o = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
    }
    for w in 0..words {
        let at = head + 8 * w;
        // SAFETY: `src + at` is 8-aligned (`head` aligned it) and the 8 bytes lie inside the
        // source range.
        let v = unsafe { AtomicU64::from_ptr(src.add(at).cast::<u64>().cast_mut()) }
            .load(Ordering::Relaxed);
        out[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
    for (i, o) in out.iter_mut().enumerate().skip(head + 8 * words) {
        // SAFETY: inside the source range, one byte, atomically.
        *o = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// Copies `data` to `dst..dst + data.len()`.
///
/// # Safety
///
/// `dst..dst + data.len()` must be valid for writes for the whole call, and every access other
/// threads or processes make to it must be atomic or from another process.
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the word pointers are 8-aligned: `align_offset` skips to the first aligned byte"
)]
#[expect(
    clippy::host_endian_bytes,
    reason = "a word is loaded from memory and stored back as bytes: native order keeps them in place"
)]
pub unsafe fn store_to_shared(dst: *mut u8, data: &[u8]) {
    // PERF-CRITICAL: a call's output, every call.
    let len = data.len();
    let head = dst.align_offset(8).min(len);
    let words = (len - head) / 8;
    for (i, &b) in data[..head].iter().enumerate() {
        // SAFETY: inside the destination range (caller), one byte, atomically.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
    }
    for w in 0..words {
        let at = head + 8 * w;
        let v = u64::from_ne_bytes(data[at..at + 8].try_into().expect("8 bytes"));
        // SAFETY: `dst + at` is 8-aligned and the 8 bytes lie inside the destination range.
        unsafe { AtomicU64::from_ptr(dst.add(at).cast::<u64>()) }.store(v, Ordering::Relaxed);
    }
    for (i, &b) in data.iter().enumerate().skip(head + 8 * words) {
        // SAFETY: inside the destination range, one byte, atomically.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
    }
}

/// Writes `len` zero bytes at `dst`.
///
/// # Safety
///
/// As [`store_to_shared`], for `dst..dst + len`.
pub unsafe fn zero_shared(dst: *mut u8, len: usize) {
    for i in 0..len {
        // SAFETY: inside the destination range (caller), one byte, atomically.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_exact_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        for start in 0..9 {
            for len in [0usize, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 150] {
                let mut out = vec![0u8; len];
                // SAFETY: `start + len` ≤ 200 bytes of `src`, read by this thread only.
                unsafe { load_from_shared(src.as_ptr().add(start), &mut out) };
                assert_eq!(out, src[start..start + len], "load {start}+{len}");
                let mut dst = vec![0xAAu8; 200];
                // SAFETY: as above, for writes.
                unsafe { store_to_shared(dst.as_mut_ptr().add(start), &src[..len]) };
                assert_eq!(&dst[start..start + len], &src[..len], "store {start}+{len}");
                assert!(
                    dst[..start].iter().all(|&b| b == 0xAA),
                    "store wrote before"
                );
                assert!(
                    dst[start + len..].iter().all(|&b| b == 0xAA),
                    "store wrote past"
                );
            }
        }
    }
}
