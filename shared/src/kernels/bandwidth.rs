//! A streaming-read probe of DRAM bandwidth: the roofline the GEMV benchmarks are compared to.
//!
//! Owns only the measurement (allocate, touch, sum in parallel, time); it is meant for
//! benchmarks and startup diagnostics, not for the hot path. It allocates and spawns threads.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Timed passes per measurement; the fastest one is reported.
const PASSES: usize = 5;

/// Measures the read bandwidth, in GB/s (10⁹ bytes per second), of summing a `bytes`-long
/// buffer split evenly over `threads` threads; the best of a few passes.
///
/// Pass a buffer well beyond the last-level cache (1–2 GiB) for a DRAM figure; a smaller one
/// measures the cache instead. The buffer is written once first so every page is backed by
/// real memory (untouched pages would all map the shared zero page and flatter the result).
/// Reads use 64-byte AVX-512 loads where the CPU has them, else four-way unrolled u64 sums.
///
/// `bytes` is rounded down to a multiple of 4 KiB per thread (at least one page each) and
/// `threads` is raised to at least 1. Allocates the buffer and spawns `threads` scoped threads.
pub fn measure_read_bandwidth_gbps(bytes: usize, threads: usize) -> f64 {
    const PAGE_WORDS: usize = 4096 / 8;
    let threads = threads.max(1);
    let words_per_thread = (bytes / 8 / threads / PAGE_WORDS).max(1) * PAGE_WORDS;
    let buf: Vec<u64> = (0..words_per_thread * threads).map(|i| i as u64).collect();
    let barrier = Barrier::new(threads);
    let mut best = Duration::MAX;
    let mut sink = 0u64;
    std::thread::scope(|scope| {
        let workers: Vec<_> = buf
            .chunks(words_per_thread)
            .skip(1)
            .map(|part| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut sum = 0u64;
                    for _ in 0..PASSES {
                        barrier.wait();
                        sum = sum.wrapping_add(sum_words(part));
                        barrier.wait();
                    }
                    sum
                })
            })
            .collect();
        let part = &buf[..words_per_thread];
        for _ in 0..PASSES {
            barrier.wait();
            let start = Instant::now();
            sink = sink.wrapping_add(sum_words(part));
            // The pass ends when the slowest thread reaches the second barrier.
            barrier.wait();
            best = best.min(start.elapsed());
        }
        for worker in workers {
            sink = sink.wrapping_add(worker.join().expect("bandwidth worker panicked"));
        }
    });
    std::hint::black_box(sink);
    (words_per_thread * threads * 8) as f64 / best.as_secs_f64() / 1e9
}

/// The wrapping sum of `words`, read as fast as this CPU allows.
fn sum_words(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F was just detected.
        return unsafe { sum_words_avx512(words) };
    }
    let mut acc = [0u64; 4];
    let mut chunks = words.chunks_exact(4);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(v);
        }
    }
    let tail = chunks.remainder().iter().fold(0u64, |s, &v| s.wrapping_add(v));
    acc.iter().fold(tail, |s, &a| s.wrapping_add(a))
}

/// [`sum_words`] with four independent 64-byte accumulators.
///
/// # Safety
///
/// The CPU must support AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_words_avx512(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    const STEP: usize = 32; // four 8-word vectors
    let mut acc = [_mm512_setzero_si512(); 4];
    let mut chunks = words.chunks_exact(STEP);
    for c in &mut chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 32 words, so words 8i..8i + 8 are in bounds.
            let v = unsafe { _mm512_loadu_si512(c.as_ptr().add(8 * i).cast()) };
            *a = _mm512_add_epi64(*a, v);
        }
    }
    let vec_sum = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
    let tail = chunks.remainder().iter().fold(0u64, |s, &v| s.wrapping_add(v));
    tail.wrapping_add(_mm512_reduce_add_epi64(vec_sum) as u64)
}
