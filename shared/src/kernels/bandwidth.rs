//! A streaming-read probe of DRAM bandwidth: the roofline the GEMV benchmarks are compared to.
//!
//! Owns only the measurement (allocate, touch, sum in parallel, time); it is meant for
//! benchmarks and startup diagnostics, not for the hot path. It allocates and spawns threads.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Passes over the whole buffer.
const PASSES: usize = 3;
/// Bytes all threads together read in one timed step.
const STEP_BYTES: usize = 64 << 20;

/// Measures the read bandwidth, in GB/s (10⁹ bytes per second), of `threads` threads streaming
/// through a `bytes`-long buffer together.
///
/// Pass a buffer well beyond the last-level cache (1–2 GiB) for a DRAM figure; a smaller one
/// measures the cache instead. The buffer is written once first so every page is backed by
/// real memory (untouched pages would all map the shared zero page and flatter the result).
/// The threads walk the buffer front to back, [`PASSES`] times, in synchronized steps of
/// [`STEP_BYTES`] (each thread reads its own share of the step); the result is the fastest
/// step. Every step reads lines last touched a whole buffer ago, so it comes from DRAM, and
/// taking the fastest step rather than a whole pass keeps the figure meaningful on a machine
/// where other processes take turns on the cores. Reads use 64-byte AVX-512 loads where the CPU
/// has them, else four-way unrolled u64 sums.
///
/// `threads` is raised to at least 1 and `bytes` to at least one step; `bytes` is rounded down to
/// whole steps. Allocates the buffer and spawns `threads − 1` scoped threads.
pub fn measure_read_bandwidth_gbps(bytes: usize, threads: usize) -> f64 {
    let threads = threads.max(1);
    // Each thread's share of a step: whole 4 KiB pages.
    let share_words = (STEP_BYTES / 8 / threads).next_multiple_of(512);
    let step_words = share_words * threads;
    let steps = (bytes / 8 / step_words).max(1);
    let buf: Vec<u64> = (0..steps * step_words).map(|i| i as u64).collect();
    let barrier = Barrier::new(threads);
    let read_share = |thread: usize, step: usize| {
        sum_words(&buf[step * step_words + thread * share_words..][..share_words])
    };
    let mut best = Duration::MAX;
    let mut sink = 0u64;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (1..threads)
            .map(|thread| {
                let (barrier, read_share) = (&barrier, &read_share);
                scope.spawn(move || {
                    let mut sum = 0u64;
                    for step in (0..PASSES).flat_map(|_| 0..steps) {
                        barrier.wait();
                        sum = sum.wrapping_add(read_share(thread, step));
                        barrier.wait();
                    }
                    sum
                })
            })
            .collect();
        for step in (0..PASSES).flat_map(|_| 0..steps) {
            barrier.wait();
            let start = Instant::now();
            sink = sink.wrapping_add(read_share(0, step));
            // The step ends when the slowest thread reaches the second barrier.
            barrier.wait();
            best = best.min(start.elapsed());
        }
        for worker in workers {
            sink = sink.wrapping_add(worker.join().expect("bandwidth worker panicked"));
        }
    });
    std::hint::black_box(sink);
    (step_words * 8) as f64 / best.as_secs_f64() / 1e9
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
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |s, &v| s.wrapping_add(v));
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
    let vec_sum = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |s, &v| s.wrapping_add(v));
    tail.wrapping_add(_mm512_reduce_add_epi64(vec_sum) as u64)
}
