//! Criterion benchmarks of the dense bf16 kernels on the real Qwen3.6-35B-A3B shapes.
//!
//! Owns only measurement. Each GEMV case streams its weights from DRAM: every iteration reads
//! the next window of a 2 GiB pool (several times any last-level cache; this machine's L3 is
//! 480 MiB), at a randomized element offset so alignment luck doesn't flatter a kernel, and
//! no window is read again before the whole pool has been. It reports GB/s of weights read
//! (`Throughput::BytesDecimal`, 10⁹ bytes). The GEMM case (n = 64 tokens) reports GFLOP/s as
//! "Gelem/s" (`Throughput::Elements` counts 2 · rows · cols · n flops). The DRAM read
//! bandwidth (the roofline for GEMV) is printed once before the cases run, and a best-of
//! summary of the SIMD GEMV cases after them (`SLUICE_BENCH_SUMMARY=0` skips it).
//!
//! Run: `cargo bench -p shared --bench kernels -- --warm-up-time 1 --measurement-time 3`.

use std::cell::Cell;
use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group};
use half::bf16;
use rayon::prelude::*;
use shared::kernels::{self, Isa};

/// The weight pool every case reads its windows from: 2 GiB of bf16.
const POOL_ELEMS: usize = 1 << 30;
/// Bytes the DRAM probe streams per pass.
const PROBE_BYTES: usize = 2 << 30;
/// The GEMV shapes, `[rows, cols]` as the checkpoint stores them (`[out, in]`).
const GEMV_SHAPES: [(&str, usize, usize); 6] = [
    ("in_proj_qkv", 8192, 2048),
    ("in_proj_z", 4096, 2048),
    ("out_proj", 2048, 4096),
    ("q_proj", 8192, 2048),
    ("router", 256, 2048),
    ("lm_head", 248_320, 2048),
];
/// The GEMM (prefill) shape and token count.
const GEMM_SHAPE: (&str, usize, usize, usize) = ("in_proj_qkv", 8192, 2048, 64);
/// Thread counts measured: the single-threaded kernel, and the `par_` wrapper on a pool of 2.
const THREADS: [usize; 2] = [1, 2];

use shared::splitmix::next as splitmix;

/// Uniform in [-1, 1), never subnormal.
fn unit(state: &mut u64) -> f32 {
    (splitmix(state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// A pool of random weights, handed out as consecutive windows so that every window is read
/// again only after the whole pool (several times any cache) has streamed past.
struct WeightPool {
    elems: Vec<bf16>,
    /// Where the next window starts; shared by all cases so the reuse distance never shrinks.
    cursor: Cell<usize>,
    rng: Cell<u64>,
}

impl WeightPool {
    fn new() -> WeightPool {
        let mut elems = vec![bf16::ZERO; POOL_ELEMS];
        elems
            .par_chunks_mut(1 << 20)
            .enumerate()
            .for_each(|(i, chunk)| {
                let mut state = i as u64;
                chunk
                    .iter_mut()
                    .for_each(|w| *w = bf16::from_f32(unit(&mut state)));
            });
        WeightPool {
            elems,
            cursor: Cell::new(0),
            rng: Cell::new(7),
        }
    }

    /// The next `len` elements after the previous window, starting 0..=3 elements further on
    /// (randomized, so alignment luck doesn't flatter a kernel); wraps to the pool's start.
    fn next_window(&self, len: usize) -> &[bf16] {
        assert!(
            2 * (len + 3) <= self.elems.len(),
            "the pool must hold two windows of {len} elements"
        );
        let mut rng = self.rng.get();
        let offset = (splitmix(&mut rng) % 4) as usize;
        self.rng.set(rng);
        let mut start = self.cursor.get() + offset;
        if start + len > self.elems.len() {
            start = offset;
        }
        self.cursor.set(start + len);
        &self.elems[start..][..len]
    }
}

fn isas() -> Vec<Isa> {
    kernels::present_or_say(Isa::ALL, |isa| isa.is_available())
}

fn pools() -> Vec<(usize, rayon::ThreadPool)> {
    THREADS
        .iter()
        .map(|&t| {
            (
                t,
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .expect("rayon pool"),
            )
        })
        .collect()
}

/// Measures and prints the DRAM read bandwidth for each thread count.
fn print_dram_bandwidth() -> Vec<(usize, f64)> {
    THREADS
        .iter()
        .map(|&threads| {
            let gbps = kernels::bandwidth::measure_read_bandwidth_gbps(PROBE_BYTES, threads);
            println!("DRAM read bandwidth, {threads} thread(s): {gbps:.1} GB/s (streaming {PROBE_BYTES} bytes)");
            (threads, gbps)
        })
        .collect()
}

fn bench_kernels(c: &mut Criterion) {
    let pool = WeightPool::new();
    let pools = pools();
    let mut state = 42u64;

    for (name, rows, cols) in GEMV_SHAPES {
        let x: Vec<f32> = (0..cols).map(|_| unit(&mut state)).collect();
        let bytes = Throughput::BytesDecimal((rows * cols * 2) as u64);
        bench_shape(
            c,
            format!("gemv/{name}_{rows}x{cols}"),
            bytes,
            &pool,
            &pools,
            (rows, cols, 1),
            &x,
        );
    }

    let (name, rows, cols, n) = GEMM_SHAPE;
    let x: Vec<f32> = (0..n * cols).map(|_| unit(&mut state)).collect();
    let flops = Throughput::Elements((2 * rows * cols * n) as u64);
    bench_shape(
        c,
        format!("gemm/{name}_{rows}x{cols}_n{n}"),
        flops,
        &pool,
        &pools,
        (rows, cols, n),
        &x,
    );
}

/// One criterion group: `(rows, cols, n)` on every ISA and thread count, each iteration on the
/// pool's next weight window.
fn bench_shape(
    c: &mut Criterion,
    group: String,
    throughput: Throughput,
    pool: &WeightPool,
    pools: &[(usize, rayon::ThreadPool)],
    shape: (usize, usize, usize),
    x: &[f32],
) {
    let (rows, cols, n) = shape;
    let mut y = vec![0.0f32; n * rows];
    let mut group = c.benchmark_group(group);
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.throughput(throughput);
    for isa in isas() {
        for (threads, thread_pool) in pools {
            group.bench_function(BenchmarkId::new(isa.name(), format!("{threads}t")), |b| {
                b.iter(|| {
                    project(
                        isa,
                        *threads,
                        thread_pool,
                        pool.next_window(rows * cols),
                        shape,
                        x,
                        &mut y,
                    );
                });
            });
        }
    }
    group.finish();
}

/// `y = W·x` for `n` tokens as the model runs it: GEMV for one token, GEMM for more; the
/// single-threaded kernel on 1 thread, the `par_` wrapper on `thread_pool` otherwise.
fn project(
    isa: Isa,
    threads: usize,
    thread_pool: &rayon::ThreadPool,
    w: &[bf16],
    (rows, cols, n): (usize, usize, usize),
    x: &[f32],
    y: &mut [f32],
) {
    match (threads, n) {
        (1, 1) => kernels::gemv_bf16(isa, w, rows, cols, x, y),
        (1, _) => kernels::gemm_bf16(isa, w, rows, cols, x, n, y),
        (_, 1) => thread_pool.install(|| kernels::par_gemv_bf16(isa, w, rows, cols, x, y)),
        _ => thread_pool.install(|| kernels::par_gemm_bf16(isa, w, rows, cols, x, n, y)),
    }
    black_box(y);
}

/// Iterations per case of the best-of summary (lm_head, ~1 GB per iteration, gets fewer).
const SUMMARY_ITERS: usize = 100;

/// A criterion-free pass over the GEMV cases that reports the fastest and the median iteration
/// next to the DRAM probe. On a shared machine other processes take turns on the cores, which
/// drags criterion's means down; the fastest few-millisecond iteration shows what the kernel
/// does when it has its core, which is what the probe (fastest 64 MiB step) measures too.
fn best_of_summary(probe_gbps: &[(usize, f64)]) {
    let pool = WeightPool::new();
    let pools = pools();
    let mut state = 43u64;
    println!(
        "\nbest-of summary: GB/s of weights, fastest / median of {SUMMARY_ITERS} iterations, fastest as % of the DRAM probe"
    );
    for (name, rows, cols) in GEMV_SHAPES {
        let x: Vec<f32> = (0..cols).map(|_| unit(&mut state)).collect();
        let mut y = vec![0.0f32; rows];
        let gb = (rows * cols * 2) as f64 / 1e9;
        let iters = if gb > 0.5 { 5 } else { SUMMARY_ITERS };
        for isa in isas().into_iter().filter(|&isa| isa != Isa::Scalar) {
            for (threads, thread_pool) in &pools {
                let mut secs: Vec<f64> = (0..iters)
                    .map(|_| {
                        let w = pool.next_window(rows * cols);
                        let start = Instant::now();
                        project(isa, *threads, thread_pool, w, (rows, cols, 1), &x, &mut y);
                        start.elapsed().as_secs_f64()
                    })
                    .collect();
                secs.sort_by(f64::total_cmp);
                let (best, median) = (gb / secs[0], gb / secs[iters / 2]);
                let probe = probe_gbps
                    .iter()
                    .find(|(t, _)| t == threads)
                    .map_or(f64::NAN, |p| p.1);
                println!(
                    "  {name:<12} {rows:>6}x{cols:<5} {isa:<6} {threads}t  {best:6.2} / {median:6.2} GB/s  ({:3.0}% of {probe:.1})",
                    100.0 * best / probe
                );
            }
        }
    }
}

criterion_group!(benches, bench_kernels);

fn main() {
    let probe_gbps = print_dram_bandwidth();
    benches();
    Criterion::default().configure_from_args().final_summary();
    // `cargo bench` passes `--bench`; `cargo test --benches` doesn't, and needs no summary.
    let benchmarking = std::env::args().any(|a| a == "--bench");
    if benchmarking && std::env::var("SLUICE_BENCH_SUMMARY").as_deref() != Ok("0") {
        best_of_summary(&probe_gbps);
    }
}
