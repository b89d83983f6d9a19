//! Criterion benchmarks of the dense bf16 kernels on the real Qwen3.6-35B-A3B shapes.
//!
//! Owns only measurement. Each GEMV case streams its weights from DRAM: every iteration reads
//! the next window of a 2 GiB pool (several times any last-level cache), at a randomized
//! element offset so alignment luck doesn't flatter a kernel, and reports GB/s of weights read
//! (`Throughput::BytesDecimal`, 10⁹ bytes). The GEMM case (n = 64 tokens) reports GFLOP/s as
//! "Gelem/s" (`Throughput::Elements` counts 2 · rows · cols · n flops). The DRAM read
//! bandwidth (the roofline for GEMV) is printed once before the cases run.
//!
//! Run: `cargo bench -p shared --bench kernels -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
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

/// SplitMix64, enough for benchmark inputs.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [-1, 1), never subnormal.
fn unit(state: &mut u64) -> f32 {
    (splitmix(state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// A pool of random weights, handed out as rotating windows larger than any cache.
struct WeightPool {
    elems: Vec<bf16>,
}

impl WeightPool {
    fn new() -> WeightPool {
        let mut elems = vec![bf16::ZERO; POOL_ELEMS];
        elems.par_chunks_mut(1 << 20).enumerate().for_each(|(i, chunk)| {
            let mut state = i as u64;
            chunk.iter_mut().for_each(|w| *w = bf16::from_f32(unit(&mut state)));
        });
        WeightPool { elems }
    }

    /// A cycle of windows of `len` elements, each at a randomized offset of 0..=3 elements so
    /// that consecutive iterations see different alignments and no window is cache-resident.
    fn windows<'a>(&'a self, len: usize) -> impl FnMut() -> &'a [bf16] + 'a {
        let stride = len + 4;
        let count = self.elems.len() / stride;
        assert!(count >= 2, "the pool must hold two windows of {len} elements");
        let mut next = 0usize;
        let mut state = len as u64;
        move || {
            let offset = (splitmix(&mut state) % 4) as usize;
            let window = &self.elems[next * stride + offset..][..len];
            next = (next + 1) % count;
            window
        }
    }
}

fn isas() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|isa| {
            let ok = isa.is_available();
            if !ok {
                println!("skipping {isa}: not available on this CPU");
            }
            ok
        })
        .collect()
}

fn pools() -> Vec<(usize, rayon::ThreadPool)> {
    THREADS
        .iter()
        .map(|&t| (t, rayon::ThreadPoolBuilder::new().num_threads(t).build().expect("rayon pool")))
        .collect()
}

fn print_dram_bandwidth() {
    for threads in THREADS {
        let gbps = kernels::bandwidth::measure_read_bandwidth_gbps(PROBE_BYTES, threads);
        println!("DRAM read bandwidth, {threads} thread(s): {gbps:.1} GB/s (streaming {PROBE_BYTES} bytes)");
    }
}

fn bench_kernels(c: &mut Criterion) {
    print_dram_bandwidth();
    let pool = WeightPool::new();
    let pools = pools();
    let mut state = 42u64;

    for (name, rows, cols) in GEMV_SHAPES {
        let x: Vec<f32> = (0..cols).map(|_| unit(&mut state)).collect();
        let mut y = vec![0.0f32; rows];
        let mut group = c.benchmark_group(format!("gemv/{name}_{rows}x{cols}"));
        group.sampling_mode(SamplingMode::Flat).sample_size(10);
        group.throughput(Throughput::BytesDecimal((rows * cols * 2) as u64));
        for isa in isas() {
            for (threads, thread_pool) in &pools {
                let mut next_w = pool.windows(rows * cols);
                group.bench_function(BenchmarkId::new(isa.name(), format!("{threads}t")), |b| {
                    b.iter(|| {
                        let w = next_w();
                        if *threads == 1 {
                            kernels::gemv_bf16(isa, w, rows, cols, &x, &mut y);
                        } else {
                            thread_pool.install(|| kernels::par_gemv_bf16(isa, w, rows, cols, &x, &mut y));
                        }
                        black_box(&mut y);
                    })
                });
            }
        }
        group.finish();
    }

    let (name, rows, cols, n) = GEMM_SHAPE;
    let x: Vec<f32> = (0..n * cols).map(|_| unit(&mut state)).collect();
    let mut y = vec![0.0f32; n * rows];
    let mut group = c.benchmark_group(format!("gemm/{name}_{rows}x{cols}_n{n}"));
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
    for isa in isas() {
        for (threads, thread_pool) in &pools {
            let mut next_w = pool.windows(rows * cols);
            group.bench_function(BenchmarkId::new(isa.name(), format!("{threads}t")), |b| {
                b.iter(|| {
                    let w = next_w();
                    if *threads == 1 {
                        kernels::gemm_bf16(isa, w, rows, cols, &x, n, &mut y);
                    } else {
                        thread_pool.install(|| kernels::par_gemm_bf16(isa, w, rows, cols, &x, n, &mut y));
                    }
                    black_box(&mut y);
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_kernels);
criterion_main!(benches);
