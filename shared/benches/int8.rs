//! Criterion benchmarks of the W8A8 expert kernels on the real Qwen3.6-35B-A3B expert shapes.
//!
//! Owns only measurement. Every iteration reads the next expert of a pool of [`POOL_EXPERTS`]
//! distinct copies (≈ 1.5 GiB of weights, several times the last-level cache; this VM reports
//! a 480 MiB L3, so the brief's 64 experts ≈ 200 MB would stay cache-resident), so weights
//! stream from DRAM, and reports GB/s (10⁹ bytes) of weight bytes streamed: packed bytes plus
//! scales and row sums (`Throughput::BytesDecimal`, matching the probe's GB/s). Cases:
//!
//! - `int8_gemv/gate_up_2048to1024`, `int8_gemv/down_512to2048`: one matrix, one token;
//! - `int8_expert/n1`, `int8_expert/n8`: the whole `expert_forward`, 1 and 8 tokens;
//!
//! each per ISA on 1 thread (one expert per iteration) and 2 threads (two experts per
//! iteration in parallel on a 2-thread rayon pool, as the daemon runs experts). The DRAM read
//! bandwidth (the roofline) is printed first.
//!
//! Run: `cargo bench -p shared --bench int8 -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use rayon::prelude::*;
use shared::kernels::bandwidth::measure_read_bandwidth_gbps;
use shared::kernels::int8::{
    ExpertScratch, Int8Isa, MatrixRef, QuantizedMatrix, expert_forward, gemv_w8a8, padded_cols, quantize_activations,
    quantize_weights,
};

/// Hidden size `d`.
const D: usize = 2048;
/// Expert intermediate size `f`.
const F: usize = 512;
/// Distinct experts the iterations rotate over (3 MiB each).
const POOL_EXPERTS: usize = 512;
/// Distinct random experts quantised; the pool holds copies of them at distinct addresses.
const DISTINCT: usize = 4;
/// Bytes the DRAM probe streams per pass.
const PROBE_BYTES: usize = 2 << 30;
/// The brief's pool size, probed too to show whether it would fit in the cache.
const SMALL_PROBE_BYTES: usize = 192 << 20;
/// Thread counts measured.
const THREADS: [usize; 2] = [1, 2];

/// SplitMix64, enough for benchmark inputs.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` values uniform in [-scale, scale).
fn uniform(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len).map(|_| ((splitmix(&mut state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale).collect()
}

/// One expert's two matrices.
struct Expert {
    gate_up: QuantizedMatrix,
    down: QuantizedMatrix,
}

impl Expert {
    fn bytes(&self) -> usize {
        self.gate_up.as_ref().streamed_bytes() + self.down.as_ref().streamed_bytes()
    }
}

/// [`POOL_EXPERTS`] experts at distinct addresses (copies of [`DISTINCT`] random ones).
fn expert_pool() -> Vec<Expert> {
    let originals: Vec<Expert> = (0..DISTINCT as u64)
        .into_par_iter()
        .map(|i| Expert {
            gate_up: quantize_weights(&uniform(2 * F * D, 0.05, 2 * i), 2 * F, D),
            down: quantize_weights(&uniform(D * F, 0.05, 2 * i + 1), D, F),
        })
        .collect();
    (0..POOL_EXPERTS)
        .map(|i| {
            let e = &originals[i % DISTINCT];
            Expert { gate_up: e.gate_up.clone(), down: e.down.clone() }
        })
        .collect()
}

fn isas() -> Vec<Int8Isa> {
    Int8Isa::ALL
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

fn print_dram_bandwidth() {
    for threads in THREADS {
        for bytes in [PROBE_BYTES, SMALL_PROBE_BYTES] {
            let gbps = measure_read_bandwidth_gbps(bytes, threads);
            println!("read bandwidth, {threads} thread(s), streaming {} MiB: {gbps:.1} GB/s", bytes >> 20);
        }
    }
}

/// Per-thread working state: output and scratch.
struct Worker {
    y: Vec<f32>,
    scratch: ExpertScratch,
}

impl Worker {
    fn new() -> Worker {
        Worker { y: vec![0.0; 8 * D], scratch: ExpertScratch::with_capacity(8, D, F) }
    }
}

fn bench_int8(c: &mut Criterion) {
    print_dram_bandwidth();
    let pool = expert_pool();
    println!(
        "pool: {POOL_EXPERTS} experts × {} bytes = {} MiB; int8 ISA detected: {}",
        pool[0].bytes(),
        POOL_EXPERTS * pool[0].bytes() >> 20,
        Int8Isa::detect()
    );
    let thread_pools: Vec<(usize, rayon::ThreadPool)> = THREADS
        .iter()
        .map(|&t| (t, rayon::ThreadPoolBuilder::new().num_threads(t).build().expect("rayon pool")))
        .collect();
    let x = uniform(8 * D, 2.0, 99);
    let mut x_q = vec![0u8; padded_cols(D)];
    let mut x_scale = [0.0f32];
    quantize_activations(&x[..D], 1, D, &mut x_q, &mut x_scale);
    let h = uniform(F, 0.5, 98);
    let mut h_q = vec![0u8; padded_cols(F)];
    let mut h_scale = [0.0f32];
    quantize_activations(&h, 1, F, &mut h_q, &mut h_scale);

    // One matrix, one token.
    type Pick = fn(&Expert) -> MatrixRef<'_>;
    let gemv_cases: [(&str, Pick, &[u8], f32); 2] = [
        ("gate_up_2048to1024", |e| e.gate_up.as_ref(), &x_q, x_scale[0]),
        ("down_512to2048", |e| e.down.as_ref(), &h_q, h_scale[0]),
    ];
    for (name, pick, xq, xs) in gemv_cases {
        let mut group = c.benchmark_group(format!("int8_gemv/{name}"));
        group.sampling_mode(SamplingMode::Flat).sample_size(10);
        for isa in isas() {
            for (threads, tp) in &thread_pools {
                let bytes = threads * pick(&pool[0]).streamed_bytes();
                group.throughput(Throughput::BytesDecimal(bytes as u64));
                let mut workers = [Worker::new(), Worker::new()];
                let mut next = 0usize;
                group.bench_function(BenchmarkId::new(isa.name(), format!("{threads}t")), |b| {
                    b.iter(|| {
                        let [w0, w1] = &mut workers;
                        let (e0, e1) = (&pool[next], &pool[(next + 1) % POOL_EXPERTS]);
                        let rows = pick(e0).rows;
                        if *threads == 1 {
                            gemv_w8a8(isa, pick(e0), xq, xs, &mut w0.y[..rows]);
                            next = (next + 1) % POOL_EXPERTS;
                        } else {
                            tp.install(|| {
                                rayon::join(
                                    || gemv_w8a8(isa, pick(e0), xq, xs, &mut w0.y[..rows]),
                                    || gemv_w8a8(isa, pick(e1), xq, xs, &mut w1.y[..rows]),
                                )
                            });
                            next = (next + 2) % POOL_EXPERTS;
                        }
                        black_box(&mut workers);
                    })
                });
            }
        }
        group.finish();
    }

    // The whole expert.
    for n in [1usize, 8] {
        let mut group = c.benchmark_group(format!("int8_expert/n{n}"));
        group.sampling_mode(SamplingMode::Flat).sample_size(10);
        let xn = &x[..n * D];
        for isa in isas() {
            for (threads, tp) in &thread_pools {
                group.throughput(Throughput::BytesDecimal((threads * pool[0].bytes()) as u64));
                let mut workers = [Worker::new(), Worker::new()];
                let mut next = 0usize;
                let run = |e: &Expert, w: &mut Worker| {
                    expert_forward(isa, e.gate_up.as_ref(), e.down.as_ref(), xn, n, &mut w.y[..n * D], &mut w.scratch)
                };
                group.bench_function(BenchmarkId::new(isa.name(), format!("{threads}t")), |b| {
                    b.iter(|| {
                        let [w0, w1] = &mut workers;
                        let (e0, e1) = (&pool[next], &pool[(next + 1) % POOL_EXPERTS]);
                        if *threads == 1 {
                            run(e0, w0);
                            next = (next + 1) % POOL_EXPERTS;
                        } else {
                            tp.install(|| rayon::join(|| run(e0, w0), || run(e1, w1)));
                            next = (next + 2) % POOL_EXPERTS;
                        }
                        black_box(&mut workers);
                    })
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, bench_int8);
criterion_main!(benches);
