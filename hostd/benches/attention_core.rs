//! Micro-benchmark of the attention core at the real shape (16 q heads, 2 KV heads, head_dim
//! 256): prefill of a prompt in 512-token blocks and decode steps at a given depth, the tiled
//! kernel (`model::causal`) against the naive one it replaced (`model::causal::reference`).
//!
//! `cargo bench -p hostd --bench attention_core -- [tiled|naive] [prefill T | decode DEPTH]`
//! prints one JSON line per measurement. Each invocation is one process; interleave them for A/B.

use hostd::model::causal::{self, Heads, reference};
use shared::kernels::Isa;
use std::time::Instant;

const HEADS: Heads = Heads {
    nq: 16,
    nkv: 2,
    dh: 256,
};
const BLOCK: usize = 512;
const DECODE_STEPS: usize = 8;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut r = shared::splitmix::SplitMix64::new(seed);
    (0..n)
        .map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
        .collect()
}

fn run(kernel: &str, q: &[f32], n: usize, start: usize, k: &[f32], v: &[f32]) -> f32 {
    let scale = 1.0 / (HEADS.dh as f32).sqrt();
    let kv = (start + n) * HEADS.nkv * HEADS.dh;
    let (k, v) = (&k[..kv], &v[..kv]);
    let out = match kernel {
        "tiled" => {
            let mut out = vec![0.0f32; q.len()];
            causal::causal_attention(Isa::active(), HEADS, q, n, start, k, v, scale, &mut out);
            out
        }
        "naive" => reference::naive(HEADS, q, n, start, k, v, scale),
        other => panic!("kernel {other:?}: expected tiled or naive"),
    };
    out[out.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let [kernel, mode, len] =
        <[String; 3]>::try_from(args).expect("usage: [tiled|naive] [prefill T | decode DEPTH]");
    let len: usize = len.parse().expect("a token count");
    let per_pos = HEADS.nkv * HEADS.dh;
    let total = len + DECODE_STEPS;
    let (k, v) = (values(total * per_pos, 1), values(total * per_pos, 2));
    let q = values(total * HEADS.nq * HEADS.dh, 3);
    let qrow = HEADS.nq * HEADS.dh;
    let mut sink = 0.0f32;
    let t0 = Instant::now();
    let (what, per) = match mode.as_str() {
        "prefill" => {
            let mut start = 0;
            while start < len {
                let n = BLOCK.min(len - start);
                sink += run(
                    &kernel,
                    &q[start * qrow..(start + n) * qrow],
                    n,
                    start,
                    &k,
                    &v,
                );
                start += n;
            }
            ("prefill_s", 1)
        }
        "decode" => {
            for s in 0..DECODE_STEPS {
                let p = len + s;
                sink += run(&kernel, &q[p * qrow..(p + 1) * qrow], 1, p, &k, &v);
            }
            ("decode_ms_per_step", DECODE_STEPS)
        }
        other => panic!("mode {other:?}: expected prefill or decode"),
    };
    let secs = t0.elapsed().as_secs_f64();
    let value = if per == 1 {
        secs
    } else {
        secs * 1e3 / per as f64
    };
    println!(
        "{{\"kernel\":\"{kernel}\",\"mode\":\"{mode}\",\"tokens\":{len},\"{what}\":{value:.4},\"threads\":{},\"isa\":\"{}\",\"sink\":{sink}}}",
        rayon::current_num_threads(),
        Isa::active()
    );
}
