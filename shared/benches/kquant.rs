//! Criterion benchmarks of the k-quant expert kernels (`Q4_K`, `Q6_K`) on the real
//! Qwen3.6-35B-A3B expert shapes, comparable with the int8 bench (`benches/int8.rs`).
//!
//! Owns only measurement. Every iteration reads the next experts of a pool of [`POOL_EXPERTS`]
//! distinct copies (≈ 1.35 GiB of blocks, more than the L3 this VM reports), so weights stream
//! from DRAM, and reports GB/s (10⁹ bytes) of weight bytes streamed (the blocks, scales
//! included: `Throughput::BytesDecimal`). Cases:
//!
//! - `kq_gemm/<matrix>/n<n>`: one matrix against `n` = 1 (gemv), 8 and 64 tokens, for
//!   `gate_up_q4k` (`[1024, 2048]`), `down_q4k` and `down_q6k` (`[2048, 512]`), 1 thread (the
//!   scalar kernel only for n ≤ 8: at 64 tokens it takes seconds per iteration);
//! - `kq_expert/<gate_up>_<down>/n<n>`: the whole `expert_forward_k`, 1 and 8 tokens, with a
//!   Q4_K `gate_up` and a Q4_K or Q6_K `down`, on 1 thread and on 2.
//!
//! An iteration is one layer's worth of experts ([`EXPERTS_PER_ITER`], a token's top-8): on 1
//! thread one after another, on 2 spread over a 2-thread rayon pool with `par_iter`, as in the
//! int8 bench. The DRAM read bandwidth is printed first, then a best/median summary of every
//! case from its own timed iterations, then criterion's estimates.
//!
//! Run: `cargo bench -p shared --bench kquant -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use rayon::prelude::*;
use shared::kernels::bandwidth::measure_read_bandwidth_gbps;
use shared::kernels::int8::Int8Isa;
use shared::kernels::kquant::{
    KActs, KActsRef, KExpertScratch, KMatrix, KMatrixRef, KQuantKind, expert_forward_k, gemm_k,
    quantize_matrix,
};

/// Hidden size `d`.
const D: usize = 2048;
/// Expert intermediate size `f`.
const F: usize = 512;
/// Distinct experts the iterations rotate over (≈ 2.6 MB each, both `down` kinds).
const POOL_EXPERTS: usize = 512;
/// Experts per iteration: a token's routed experts (`num_experts_per_tok` = 8).
const EXPERTS_PER_ITER: usize = 8;
/// Distinct random experts quantised; the pool holds copies of them at distinct addresses.
const DISTINCT: usize = 4;
/// Bytes the DRAM probe streams per pass.
const PROBE_BYTES: usize = 2 << 30;
/// Thread counts measured for the whole expert.
const THREADS: [usize; 2] = [1, 2];
/// Token counts of the one-matrix cases.
const GEMM_TOKENS: [usize; 3] = [1, 8, 64];
/// Token counts of the expert cases.
const EXPERT_TOKENS: [usize; 2] = [1, 8];

use shared::splitmix::next as splitmix;

/// `len` values uniform in [-scale, scale).
fn uniform(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| ((splitmix(&mut state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale)
        .collect()
}

/// One expert: a Q4_K `gate_up` and its `down` in both kinds.
struct Expert {
    gate_up: KMatrix,
    down_q4k: KMatrix,
    down_q6k: KMatrix,
}

/// Which `down` a case uses.
#[derive(Clone, Copy)]
enum Down {
    Q4K,
    Q6K,
}

impl Expert {
    fn down(&self, which: Down) -> KMatrixRef<'_> {
        match which {
            Down::Q4K => self.down_q4k.as_ref(),
            Down::Q6K => self.down_q6k.as_ref(),
        }
    }

    fn bytes(&self, which: Down) -> usize {
        self.gate_up.data.len() + self.down(which).data.len()
    }
}

/// [`POOL_EXPERTS`] experts at distinct addresses (copies of [`DISTINCT`] random ones).
fn expert_pool() -> Vec<Expert> {
    let originals: Vec<Expert> = (0..DISTINCT as u64)
        .into_par_iter()
        .map(|i| {
            let down = uniform(D * F, 0.05, 2 * i + 1);
            Expert {
                gate_up: quantize_matrix(
                    KQuantKind::Q4K,
                    &uniform(2 * F * D, 0.05, 2 * i),
                    2 * F,
                    D,
                ),
                down_q4k: quantize_matrix(KQuantKind::Q4K, &down, D, F),
                down_q6k: quantize_matrix(KQuantKind::Q6K, &down, D, F),
            }
        })
        .collect();
    (0..POOL_EXPERTS)
        .map(|i| {
            let e = &originals[i % DISTINCT];
            Expert {
                gate_up: e.gate_up.clone(),
                down_q4k: e.down_q4k.clone(),
                down_q6k: e.down_q6k.clone(),
            }
        })
        .collect()
}

fn isas() -> Vec<Int8Isa> {
    shared::kernels::present_or_say(Int8Isa::ALL, |isa| isa.is_available())
}

fn print_dram_bandwidth() {
    for threads in THREADS {
        let gbps = measure_read_bandwidth_gbps(PROBE_BYTES, threads);
        println!(
            "read bandwidth, {threads} thread(s), streaming {} MiB: {gbps:.1} GB/s",
            PROBE_BYTES >> 20
        );
    }
}

/// Per-thread working state: output and scratch.
struct Worker {
    y: Vec<f32>,
    scratch: KExpertScratch,
}

impl Worker {
    fn new() -> Worker {
        Worker {
            y: vec![0.0; GEMM_TOKENS[2] * D],
            scratch: KExpertScratch::new(),
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

/// Prints each case's best and median time per iteration and GB/s over its own timed
/// iterations (the best shows what the kernel can reach on a shared machine, the median what
/// it typically got); criterion's estimate that follows is a mean.
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
        let (best, median) = (secs[0], secs[secs.len() / 2]);
        println!(
            "summary {:<40} best {:9.1} µs {:6.2} GB/s  median {:9.1} µs {:6.2} GB/s  ({} it.)",
            case.label,
            best * 1e6,
            gbps(best),
            median * 1e6,
            gbps(median),
            secs.len()
        );
    }
}

/// One iteration: the next [`EXPERTS_PER_ITER`] experts of the pool through `run`, one after
/// another on the calling thread (`threads == 1`), or spread over the `threads`-thread `tp`
/// with `par_iter`, each pool thread using its own [`Worker`].
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

fn bench_kquant(c: &mut Criterion) {
    print_dram_bandwidth();
    let pool = expert_pool();
    println!(
        "pool: {POOL_EXPERTS} experts × {} bytes (Q4_K gate_up + Q4_K down) = {} MiB, + Q6_K \
         downs ({} bytes each); int8 ISA detected: {}",
        pool[0].bytes(Down::Q4K),
        (POOL_EXPERTS * pool[0].bytes(Down::Q4K)) >> 20,
        pool[0].down_q6k.data.len(),
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
    let one_thread = &thread_pools[0].1;
    let max_n = GEMM_TOKENS[2];
    let x = uniform(max_n * D, 2.0, 99);
    let h = uniform(max_n * F, 0.5, 98);
    let (mut x_acts, mut h_acts) = (KActs::default(), KActs::default());
    let xa = x_acts.quantize(&x, max_n, D);
    let ha = h_acts.quantize(&h, max_n, F);

    let pool = &pool;
    let mut cases: Vec<Case<'_>> = Vec::new();
    // One matrix, n tokens (the first n rows of the quantised activations).
    type Pick = fn(&Expert) -> KMatrixRef<'_>;
    let gemm_cases: [(&str, Pick, usize); 3] = [
        ("gate_up_q4k", |e| e.gate_up.as_ref(), D),
        ("down_q4k", |e| e.down_q4k.as_ref(), F),
        ("down_q6k", |e| e.down_q6k.as_ref(), F),
    ];
    for (name, pick, cols) in gemm_cases {
        let acts = if cols == D { xa } else { ha };
        let pk = acts.q.len() / max_n;
        for n in GEMM_TOKENS {
            let xn = KActsRef {
                q: &acts.q[..n * pk],
                sums: &acts.sums[..n * (pk / 16)],
                sums32: &acts.sums32[..n * (pk / 32)],
                scales: &acts.scales[..n],
            };
            for isa in isas() {
                if isa == Int8Isa::Scalar && n > 8 {
                    continue;
                }
                let run = move |e: &Expert, w: &mut Worker| {
                    let m = pick(e);
                    gemm_k(isa, m, xn, n, &mut w.y[..n * m.rows]);
                };
                cases.push(Case {
                    group: format!("kq_gemm/{name}/n{n}"),
                    id: BenchmarkId::new(isa.name(), "1t"),
                    label: format!("kq_gemm/{name}/n{n}/{isa}/1t"),
                    bytes: EXPERTS_PER_ITER * pick(&pool[0]).data.len(),
                    iter: layer_iter(pool, 1, one_thread, run),
                });
            }
        }
    }
    // The whole expert.
    for (down_name, down) in [("q4k", Down::Q4K), ("q6k", Down::Q6K)] {
        for n in EXPERT_TOKENS {
            let xn = &x[..n * D];
            for isa in isas() {
                for (threads, tp) in &thread_pools {
                    let run = move |e: &Expert, w: &mut Worker| {
                        expert_forward_k(
                            isa,
                            e.gate_up.as_ref(),
                            e.down(down),
                            xn,
                            n,
                            &mut w.y[..n * D],
                            &mut w.scratch,
                        );
                    };
                    cases.push(Case {
                        group: format!("kq_expert/q4k_{down_name}/n{n}"),
                        id: BenchmarkId::new(isa.name(), format!("{threads}t")),
                        label: format!("kq_expert/q4k_{down_name}/n{n}/{isa}/{threads}t"),
                        bytes: EXPERTS_PER_ITER * pool[0].bytes(down),
                        iter: layer_iter(pool, *threads, tp, run),
                    });
                }
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

criterion_group!(benches, bench_kquant);
criterion_main!(benches);
