//! Causal attention of a block of new query rows over a KV cache, tiled with an online softmax
//! (docs/attention.md): per KV head, a block of query rows × all q heads of
//! the group against KV tiles of [`TILE`] positions, with O(block) scratch and no T×T matrix.
//!
//! Owns the attention core only: the caller (`attention`) projects, norms and rotates q and k,
//! keeps the cache, and gates and projects the output.
//!
//! # Reduction order (the bitwise contract)
//!
//! The output of a query at absolute position `p` sees positions `0..=p`. They are cut into
//! tiles of [`TILE`] positions aligned to absolute multiples of `TILE`, grouped into segments of
//! [`SEGMENT`] positions aligned to multiples of `SEGMENT`; the last tile and segment stop at
//! `p`. Within a segment a fresh running state `(max m, sum l, accumulator acc)` takes the tiles
//! in ascending order; the segments' states are then merged into the row's state in ascending
//! order, and the row's output is `acc / l`. Every step is a function of `p` and the absolute
//! positions alone, never of where the block starts, how many rows it has, how the work is
//! split across tasks or how many threads run it. Hence a query row gets identical bits whether
//! the prompt was prefilled in one block, in uneven chunks or token by token (decode), alone or
//! in a batch. Segments exist so that decode (one query row) can run the segments of a long
//! cache on different threads and still merge them in the order a prefill block does.

use rayon::prelude::*;
use shared::kernels::{self, Isa};

/// KV positions per tile (aligned to multiples of `TILE`): the keys or values of one KV head
/// in a tile are 64 KiB at head_dim 256, kept in L2 while every query vector of the block
/// passes over them.
pub const TILE: usize = 64;
/// KV positions per segment (aligned to multiples of `SEGMENT`), the unit decode splits
/// across threads. A merge per segment costs `head_dim` operations per query vector, noise
/// against the segment's `2 · SEGMENT · head_dim`.
pub const SEGMENT: usize = 16 * TILE;
/// Query rows per task.
pub const ROW_BLOCK: usize = 16;
/// Most f32 that split mode may hold in per-segment partial states (64 MiB).
const MAX_PARTIAL_FLOATS: usize = 16 << 20;

/// Head counts and size of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub nq: usize,
    /// Key/value heads (each serves `nq / nkv` query heads).
    pub nkv: usize,
    /// Elements per head.
    pub dh: usize,
}

/// Whether the segments of a (KV head, row block) run as tasks of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Split when there are too few (KV head, row block) tasks to occupy the pool.
    Auto,
    /// One task per (KV head, row block), walking its segments in turn.
    Never,
    /// One task per (KV head, row block, segment), merged afterwards.
    Always,
}

/// Causal attention for `n` new query rows at positions `start..start + n`.
///
/// `q` is `[n][nq][dh]` (normed, rotated); `k` and `v` are the cache `[pos][nkv][dh]` holding at
/// least `start + n` positions (the new rows' keys included); `scale` multiplies each q·k.
/// Writes the softmax-weighted values to `out`, `[n][nq][dh]`.
///
/// # Panics
///
/// Panics if the slices do not match the shapes, or `nq` is not a multiple of `nkv`.
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    isa: Isa,
    heads: Heads,
    q: &[f32],
    n: usize,
    start: usize,
    k: &[f32],
    v: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    causal_attention_split(isa, heads, q, n, start, k, v, scale, out, Split::Auto);
}

/// [`causal_attention`] with the task split chosen by the caller (tests force each).
#[allow(clippy::too_many_arguments)]
pub fn causal_attention_split(
    isa: Isa,
    heads: Heads,
    q: &[f32],
    n: usize,
    start: usize,
    k: &[f32],
    v: &[f32],
    scale: f32,
    out: &mut [f32],
    split: Split,
) {
    let Heads { nq, nkv, dh } = heads;
    assert!(
        nkv > 0 && nq % nkv == 0,
        "attention: {nq} q heads do not divide into {nkv} kv heads"
    );
    assert_eq!(
        q.len(),
        n * nq * dh,
        "attention: q is not n ({n}) × {nq} heads × {dh}"
    );
    assert_eq!(out.len(), q.len(), "attention: output is not the size of q");
    let kv_len = (start + n) * nkv * dh;
    assert!(
        k.len() >= kv_len && v.len() >= kv_len,
        "attention: the cache holds fewer than {} positions",
        start + n
    );
    if n == 0 {
        return;
    }
    let ctx = Ctx {
        isa,
        heads,
        q,
        n,
        start,
        k,
        v,
        scale,
    };
    let row_blocks = n.div_ceil(ROW_BLOCK);
    let segments = (start + n - 1) / SEGMENT + 1;
    let pairs = nkv * row_blocks;
    let partial_floats = pairs * segments * ROW_BLOCK.min(n) * (nq / nkv) * (dh + 2);
    let split = match split {
        Split::Auto => {
            segments > 1
                && pairs < 2 * rayon::current_num_threads()
                && partial_floats <= MAX_PARTIAL_FLOATS
        }
        Split::Never => false,
        Split::Always => true,
    };
    let blocks: Vec<State> = if split {
        let tasks: Vec<(usize, usize, usize)> = (0..nkv)
            .flat_map(|g| {
                (0..row_blocks)
                    .flat_map(move |rb| (0..ctx.segments_of(rb)).map(move |s| (g, rb, s)))
            })
            .collect();
        let parts: Vec<State> = tasks
            .par_iter()
            .map(|&(g, rb, s)| ctx.segment(g, rb, s))
            .collect();
        // Per (g, rb), its segments are contiguous in `tasks`, ascending.
        let mut offsets = Vec::with_capacity(pairs);
        let mut at = 0;
        for _g in 0..nkv {
            for rb in 0..row_blocks {
                offsets.push(at);
                at += ctx.segments_of(rb);
            }
        }
        (0..pairs)
            .into_par_iter()
            .map(|pair| {
                let rb = pair % row_blocks;
                let mut row = State::empty(ctx.vectors(rb), dh);
                for part in &parts[offsets[pair]..offsets[pair] + ctx.segments_of(rb)] {
                    row.merge(isa, part, dh);
                }
                row
            })
            .collect()
    } else {
        (0..pairs)
            .into_par_iter()
            .map(|pair| {
                let (g, rb) = (pair / row_blocks, pair % row_blocks);
                let mut row = State::empty(ctx.vectors(rb), dh);
                for s in 0..ctx.segments_of(rb) {
                    row.merge(isa, &ctx.segment(g, rb, s), dh);
                }
                row
            })
            .collect()
    };
    let qpk = nq / nkv;
    for (pair, row) in blocks.iter().enumerate() {
        let (g, rb) = (pair / row_blocks, pair % row_blocks);
        for (vi, (acc, l)) in row.acc.chunks_exact(dh).zip(&row.l).enumerate() {
            let (t, h) = (rb * ROW_BLOCK + vi / qpk, g * qpk + vi % qpk);
            let dst = &mut out[(t * nq + h) * dh..][..dh];
            for (o, a) in dst.iter_mut().zip(acc) {
                *o = a / l;
            }
        }
    }
}

/// The inputs of one call, shared by its tasks.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    isa: Isa,
    heads: Heads,
    q: &'a [f32],
    n: usize,
    start: usize,
    k: &'a [f32],
    v: &'a [f32],
    scale: f32,
}

impl Ctx<'_> {
    /// Rows of row block `rb`.
    fn rows(&self, rb: usize) -> std::ops::Range<usize> {
        rb * ROW_BLOCK..self.n.min((rb + 1) * ROW_BLOCK)
    }

    /// Query vectors (rows × q heads per KV head) of row block `rb`.
    fn vectors(&self, rb: usize) -> usize {
        self.rows(rb).len() * (self.heads.nq / self.heads.nkv)
    }

    /// Segments the last row of row block `rb` sees.
    fn segments_of(&self, rb: usize) -> usize {
        (self.start + self.rows(rb).end - 1) / SEGMENT + 1
    }

    /// The fresh state of every query vector of (KV head `g`, row block `rb`) over segment
    /// `s`, its tiles taken in ascending order; a row that sees none of the segment keeps the
    /// empty state. Tiles are the outer loop, so a tile's keys and values stay in cache while
    /// every vector of the block passes over them.
    fn segment(&self, g: usize, rb: usize, s: usize) -> State {
        let Heads { nq, nkv, dh } = self.heads;
        let qpk = nq / nkv;
        let stride = nkv * dh;
        let rows = self.rows(rb);
        let mut st = State::empty(self.vectors(rb), dh);
        // One tile's scores, then probabilities, per q head of a row; its heads' rescale factors.
        let (mut scores, mut corr) = (vec![0.0f32; qpk * TILE], vec![0.0f32; qpk]);
        let seg_begin = s * SEGMENT;
        // The block's last row sees the most; earlier rows stop at their own position.
        let seg_end = (self.start + rows.end).min(seg_begin + SEGMENT);
        let mut a = seg_begin;
        while a < seg_end {
            let tile_end = seg_end.min(a + TILE);
            let (kt, vt) = (&self.k[(a * nkv + g) * dh..], &self.v[(a * nkv + g) * dh..]);
            for (ri, t) in rows.clone().enumerate() {
                let b = tile_end.min(self.start + t + 1);
                if b <= a {
                    continue;
                }
                // All q heads of the row at once: they share the row's range of the tile.
                let n = b - a;
                let qs = &self.q[(t * nq + g * qpk) * dh..][..qpk * dh];
                let sc = &mut scores[..qpk * n];
                kernels::dot_rows_multi_f32(self.isa, dh, qs, kt, stride, sc, n);
                for (hi, (p, c)) in sc.chunks_exact_mut(n).zip(corr.iter_mut()).enumerate() {
                    let vi = ri * qpk + hi;
                    let m = st.m[vi];
                    let (m_new, sum) = kernels::softmax_tile_f32(self.isa, p, self.scale, m);
                    *c = (m - m_new).exp();
                    st.l[vi] = st.l[vi] * *c + sum;
                    st.m[vi] = m_new;
                }
                kernels::scale_axpy_rows_multi_f32(
                    self.isa,
                    &mut st.acc[ri * qpk * dh..][..qpk * dh],
                    &corr,
                    sc,
                    vt,
                    stride,
                );
            }
            a = tile_end;
        }
        st
    }
}

/// Running softmax state of a set of query vectors: max score `m`, sum of `exp(score − m)` `l`,
/// and the `exp(score − m)`-weighted sum of values `acc` (`dh` per vector). Empty: `m = −∞`,
/// `l = 0`, `acc = 0`.
struct State {
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
}

impl State {
    fn empty(vectors: usize, dh: usize) -> State {
        State {
            m: vec![f32::NEG_INFINITY; vectors],
            l: vec![0.0; vectors],
            acc: vec![0.0; vectors * dh],
        }
    }

    /// Folds `other` (a later segment) into `self`, vector by vector; an empty `other` vector
    /// leaves `self`'s unchanged. Merging into an empty state reproduces `other` exactly
    /// (factor `exp(−∞) = 0` on the empty side, `exp(0) = 1` on the other).
    fn merge(&mut self, isa: Isa, other: &State, dh: usize) {
        for vi in 0..self.m.len() {
            let (mb, lb) = (other.m[vi], other.l[vi]);
            if lb == 0.0 && mb == f32::NEG_INFINITY {
                continue;
            }
            let m = self.m[vi].max(mb);
            let (ca, cb) = ((self.m[vi] - m).exp(), (mb - m).exp());
            self.l[vi] = self.l[vi] * ca + lb * cb;
            self.m[vi] = m;
            kernels::scale_axpy_rows_f32(
                isa,
                &mut self.acc[vi * dh..][..dh],
                ca,
                &[cb],
                &other.acc[vi * dh..][..dh],
                dh,
            );
        }
    }
}

pub mod reference;
#[cfg(test)]
mod tests;
