//! Criterion benchmarks of the W8A8 expert kernels on the real Qwen3.6-35B-A3B expert shapes.
//!
//! Owns only measurement. Every iteration reads the next experts of a pool of [`POOL_EXPERTS`]
//! distinct copies (≈ 1.5 GiB of weights, more than the 480 MiB L3 this VM reports; the probe
//! also streams 192 MiB, the size of a 64-expert pool, to show whether that would have been
//! cache-resident), so weights stream from DRAM, and reports GB/s (10⁹ bytes) of weight bytes
//! streamed: packed bytes plus scales and row sums (`Throughput::BytesDecimal`, matching the
//! probe's GB/s). Cases:
//!
//! - `int8_gemv/gate_up_2048to1024`, `int8_gemv/down_512to2048`: one matrix, one token;
//! - `int8_expert/n1`, `int8_expert/n8`: the whole `expert_forward`, 1 and 8 tokens;
//!
//! each per ISA on 1 thread and on 2 threads. An iteration is one layer's worth of experts
//! ([`EXPERTS_PER_ITER`], a token's top-8): on 1 thread one after another, on 2 threads spread
//! over a 2-thread rayon pool with `par_iter` (two experts in flight at a time), as the daemon
//! runs a layer's routed experts. The DRAM read bandwidth (the roofline) is printed first, then
//! a best/median summary of every case from its own timed iterations (robust to a busy
//! machine), then criterion's estimates.
//!
//! Run: `cargo bench -p shared --bench int8 -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use rayon::prelude::*;
use shared::kernels::bandwidth::measure_read_bandwidth_gbps;
use shared::kernels::int8::{
    ExpertScratch, Int8Isa, MatrixRef, QuantizedMatrix, expert_forward, gemv_w8a8, padded_cols,
    quantize_activations, quantize_weights,
};

/// Hidden size `d`.
const D: usize = 2048;
/// Expert intermediate size `f`.
const F: usize = 512;
/// Distinct experts the iterations rotate over (3 MiB each).
const POOL_EXPERTS: usize = 512;
/// Experts per iteration: a token's routed experts (`num_experts_per_tok` = 8).
const EXPERTS_PER_ITER: usize = 8;
/// Distinct random experts quantised; the pool holds copies of them at distinct addresses.
const DISTINCT: usize = 4;
/// Bytes the DRAM probe streams per pass.
const PROBE_BYTES: usize = 2 << 30;
/// The brief's pool size, probed too to show whether it would fit in the cache.
const SMALL_PROBE_BYTES: usize = 192 << 20;
/// Thread counts measured.
const THREADS: [usize; 2] = [1, 2];

use shared::splitmix::next as splitmix;

/// `len` values uniform in [-scale, scale).
fn uniform(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| ((splitmix(&mut state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale)
        .collect()
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
            Expert {
                gate_up: e.gate_up.clone(),
                down: e.down.clone(),
            }
        })
        .collect()
}

fn isas() -> Vec<Int8Isa> {
    shared::kernels::present_or_say(Int8Isa::ALL, |isa| isa.is_available())
}

fn print_dram_bandwidth() {
    for threads in THREADS {
        for bytes in [PROBE_BYTES, SMALL_PROBE_BYTES] {
            let gbps = measure_read_bandwidth_gbps(bytes, threads);
            println!(
                "read bandwidth, {threads} thread(s), streaming {} MiB: {gbps:.1} GB/s",
                bytes >> 20
            );
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
        Worker {
            y: vec![0.0; 8 * D],
            scratch: ExpertScratch::with_capacity(8, D, F),
        }
    }
}

/// One benchmark: its criterion group and id, the weight bytes one iteration streams, and the
/// iteration itself (which rotates through the pool on its own).
struct Case<'a> {
    group: String,
    id: BenchmarkId,
    label: String,
    bytes: usize,
    iter: Box<dyn FnMut() + 'a>,
}

/// Iterations (at most) and seconds (at most) of the best/median summary, per case.
const SUMMARY_ITERS: usize = 300;
/// See [`SUMMARY_ITERS`].
const SUMMARY_SECS: f64 = 1.5;

/// Prints each case's best and median GB/s over its own timed iterations. On a shared machine
/// (other processes stealing a core now and then) the best iteration shows what the kernel can
/// reach and the median what it typically got; criterion's estimate that follows is a mean.
fn print_summary(cases: &mut [Case<'_>]) {
    for case in cases.iter_mut() {
        let mut secs = Vec::with_capacity(SUMMARY_ITERS);
        let begin = Instant::now();
        while secs.len() < SUMMARY_ITERS && begin.elapsed().as_secs_f64() < SUMMARY_SECS {
            let start = Instant::now();
            (case.iter)();
            secs.push(start.elapsed().as_secs_f64());
        }
        secs.sort_by(f64::total_cmp);
        let gbps = |s: f64| case.bytes as f64 / s / 1e9;
        println!(
            "summary {:<48} best {:6.2} GB/s  median {:6.2} GB/s  ({} iterations)",
            case.label,
            gbps(secs[0]),
            gbps(secs[secs.len() / 2]),
            secs.len()
        );
    }
}

/// One iteration: the next [`EXPERTS_PER_ITER`] experts of the pool through `run`, one after
/// another on the calling thread (`threads == 1`), or spread over the `threads`-thread `tp`
/// with `par_iter`, each pool thread using its own [`Worker`] — as the daemon runs one layer's
/// routed experts. Waking the pool (≈ 80 µs in this VM) is thus paid once per 8 experts, as
/// in the daemon, rather than once per expert.
fn layer_iter<'a>(
    pool: &'a [Expert],
    threads: usize,
    tp: &'a rayon::ThreadPool,
    run: impl Fn(&Expert, &mut Worker) + Sync + 'a,
) -> Box<dyn FnMut() + 'a> {
    let workers: Vec<Mutex<Worker>> = (0..threads).map(|_| Mutex::new(Worker::new())).collect();
    let mut next = 0usize;
    Box::new(move || {
        let experts = &pool[next..next + EXPERTS_PER_ITER];
        if threads == 1 {
            let mut w = workers[0].lock().expect("worker");
            experts.iter().for_each(|e| run(e, &mut w));
        } else {
            tp.install(|| {
                experts.par_iter().with_max_len(1).for_each(|e| {
                    let i = rayon::current_thread_index().expect("inside the pool");
                    run(e, &mut workers[i].lock().expect("worker"));
                });
            });
        }
        next = (next + EXPERTS_PER_ITER) % POOL_EXPERTS;
        black_box(&workers);
    })
}

fn bench_int8(c: &mut Criterion) {
    print_dram_bandwidth();
    let pool = expert_pool();
    println!(
        "pool: {POOL_EXPERTS} experts × {} bytes = {} MiB; int8 ISA detected: {}",
        pool[0].bytes(),
        (POOL_EXPERTS * pool[0].bytes()) >> 20,
        Int8Isa::detect()
    );
    let thread_pools: Vec<(usize, rayon::ThreadPool)> = THREADS
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
        .collect();
    let x = uniform(8 * D, 2.0, 99);
    let mut x_q = vec![0u8; padded_cols(D)];
    let mut x_scale = [0.0f32];
    quantize_activations(&x[..D], 1, D, &mut x_q, &mut x_scale);
    let h = uniform(F, 0.5, 98);
    let mut h_q = vec![0u8; padded_cols(F)];
    let mut h_scale = [0.0f32];
    quantize_activations(&h, 1, F, &mut h_q, &mut h_scale);

    let pool = &pool;
    let mut cases: Vec<Case<'_>> = Vec::new();
    // One matrix, one token.
    type Pick = fn(&Expert) -> MatrixRef<'_>;
    let gemv_cases: [(&str, Pick, &[u8], f32); 2] = [
        (
            "gate_up_2048to1024",
            |e| e.gate_up.as_ref(),
            &x_q,
            x_scale[0],
        ),
        ("down_512to2048", |e| e.down.as_ref(), &h_q, h_scale[0]),
    ];
    for (name, pick, xq, xs) in gemv_cases {
        for isa in isas() {
            for (threads, tp) in &thread_pools {
                let run = move |e: &Expert, w: &mut Worker| {
                    let m = pick(e);
                    gemv_w8a8(isa, m, xq, xs, &mut w.y[..m.rows]);
                };
                cases.push(Case {
                    group: format!("int8_gemv/{name}"),
                    id: BenchmarkId::new(isa.name(), format!("{threads}t")),
                    label: format!("int8_gemv/{name}/{isa}/{threads}t"),
                    bytes: EXPERTS_PER_ITER * pick(&pool[0]).streamed_bytes(),
                    iter: layer_iter(pool, *threads, tp, run),
                });
            }
        }
    }
    // The whole expert.
    for n in [1usize, 8] {
        let xn = &x[..n * D];
        for isa in isas() {
            for (threads, tp) in &thread_pools {
                let run = move |e: &Expert, w: &mut Worker| {
                    expert_forward(
                        isa,
                        e.gate_up.as_ref(),
                        e.down.as_ref(),
                        xn,
                        n,
                        &mut w.y[..n * D],
                        &mut w.scratch,
                    );
                };
                cases.push(Case {
                    group: format!("int8_expert/n{n}"),
                    id: BenchmarkId::new(isa.name(), format!("{threads}t")),
                    label: format!("int8_expert/n{n}/{isa}/{threads}t"),
                    bytes: EXPERTS_PER_ITER * pool[0].bytes(),
                    iter: layer_iter(pool, *threads, tp, run),
                });
            }
        }
    }

    print_summary(&mut cases);
    let mut cases = cases.into_iter().peekable();
    while let Some(first) = cases.next() {
        let mut group = c.benchmark_group(first.group.clone());
        group.sampling_mode(SamplingMode::Flat).sample_size(10);
        let mut members = vec![first];
        while let Some(case) = cases.next_if(|case| case.group == members[0].group) {
            members.push(case);
        }
        for mut case in members {
            group.throughput(Throughput::BytesDecimal(case.bytes as u64));
            group.bench_function(case.id, |b| b.iter(&mut case.iter));
        }
        group.finish();
    }
}

criterion_group!(benches, bench_int8);
criterion_main!(benches);
