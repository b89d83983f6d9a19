//! Gated full attention (docs/model.md §4.4–4.5): q/gate interleaved per head in `q_proj`, per-head
//! zero-centred q/k norms, partial rotate-half RoPE, GQA, causal softmax, sigmoid output gate,
//! and the layer's KV cache.
//!
//! Owns the attention math and its cache; the caller owns the residual stream and the norms
//! around the mixer.

use super::causal;
use super::linear::{self, Linear, project_new};
use super::ops;
use super::weights::{LayerTensors, WeightsError};
use crate::profile::{self, Profiler};
use shared::config::{AttentionLayout, TextConfig};
use shared::kernels::Isa;

/// Keys and values of every past token of one sequence in one attention layer (f32, post-norm,
/// post-RoPE), laid out `[position][kv head][head_dim]`.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    len: usize,
}

impl KvCache {
    /// Cached positions.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes held by the cache's buffers.
    pub fn bytes(&self) -> usize {
        (self.k.capacity() + self.v.capacity()) * 4
    }

    /// Keys and values of positions `range` (each `range.len() × row_width` floats).
    pub fn rows(&self, range: std::ops::Range<usize>) -> (&[f32], &[f32]) {
        assert!(
            range.end <= self.len,
            "rows {range:?} past the cache's {}",
            self.len
        );
        let w = self.row_width();
        (
            &self.k[range.start * w..range.end * w],
            &self.v[range.start * w..range.end * w],
        )
    }

    /// A cache holding `len` positions whose rows are the concatenation of `parts` (key and
    /// value slices of equal length, whole rows).
    pub fn from_rows<'a>(
        len: usize,
        parts: impl Iterator<Item = (&'a [f32], &'a [f32])>,
    ) -> KvCache {
        let mut cache = KvCache::default();
        for (k, v) in parts {
            cache.k.extend_from_slice(k);
            cache.v.extend_from_slice(v);
        }
        assert_eq!(cache.k.len(), cache.v.len(), "key and value rows differ");
        cache.len = len;
        assert!(
            len == 0 || cache.k.len() % len == 0,
            "{} floats are not {len} whole rows",
            cache.k.len()
        );
        cache
    }

    /// Floats per position (`n_kv_heads × head_dim`), 0 while empty.
    fn row_width(&self) -> usize {
        self.k.len().checked_div(self.len).unwrap_or(0)
    }
}

/// RoPE inverse frequencies for the rotary dims, computed as transformers does (fp32 table).
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// `inv_freq[j] = 1 / θ^(2j / rotary_dims)` for j in `0..rotary_dims/2`.
    pub fn new(theta: f64, rotary_dims: usize) -> Rope {
        let inv_freq = (0..rotary_dims / 2)
            .map(|j| {
                let exponent = (2 * j) as f32 / rotary_dims as f32;
                (1.0 / theta.powf(f64::from(exponent))) as f32
            })
            .collect();
        Rope { inv_freq }
    }

    /// Rotates the first `rotary_dims` entries of one head vector at position `pos`
    /// (rotate-half pairing `(j, j + rotary_dims/2)`).
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for (j, &f) in self.inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            let (sin, cos) = angle.sin_cos();
            let (a, b) = (x[j], x[j + half]);
            x[j] = a * cos - b * sin;
            x[j + half] = b * cos + a * sin;
        }
    }
}

/// Weights of one full-attention layer.
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_scale: Vec<f32>,
    k_scale: Vec<f32>,
    layout: AttentionLayout,
    rope: Rope,
    eps: f32,
}

impl Attention {
    /// Loads a layer's attention weights from its `self_attn` tensors.
    pub fn load(t: &LayerTensors<'_>, cfg: &TextConfig) -> Result<Attention, WeightsError> {
        let at = cfg.attention;
        let d = cfg.hidden_size;
        Ok(Attention {
            q_proj: t.linear("q_proj.weight", at.q_proj_rows(), d)?,
            k_proj: t.linear("k_proj.weight", at.kv_proj_rows(), d)?,
            v_proj: t.linear("v_proj.weight", at.kv_proj_rows(), d)?,
            o_proj: t.linear("o_proj.weight", d, at.o_proj_cols())?,
            q_scale: ops::zero_centred_scale(&t.vector("q_norm.weight")?),
            k_scale: ops::zero_centred_scale(&t.vector("k_norm.weight")?),
            layout: at,
            rope: Rope::new(cfg.rope_theta, at.rotary_dims),
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// Runs `n` new tokens (rows of `x`, already normed) at positions `cache.len()..`, appends
    /// their keys and values to `cache`, and returns the `n × d` mixer output. Op times go to
    /// `prof` when given.
    pub fn forward(
        &self,
        isa: Isa,
        x: &[f32],
        n: usize,
        cache: &mut KvCache,
        prof: Option<&Profiler>,
    ) -> Vec<f32> {
        let at = self.layout;
        let (nq, nkv, dh) = (at.n_q_heads, at.n_kv_heads, at.head_dim);
        let start = cache.len;
        let scope = profile::scope(
            prof,
            "attention.qkv_proj",
            self.q_proj.bytes() + self.k_proj.bytes() + self.v_proj.bytes(),
        );
        let [p, mut k, v]: [Vec<f32>; 3] =
            linear::project_many(isa, &[&self.q_proj, &self.k_proj, &self.v_proj], x, n)
                .try_into()
                .expect("three projections");
        drop(scope);
        let scope = profile::scope(prof, "attention.core", 0);

        // Split q and gate (interleaved per head: [q_h | gate_h] blocks of head_dim), norm, rotate.
        let mut q = vec![0.0f32; n * nq * dh];
        let mut gate = vec![0.0f32; n * nq * dh];
        for t in 0..n {
            for h in 0..nq {
                let src = &p[(t * nq + h) * 2 * dh..(t * nq + h + 1) * 2 * dh];
                let qd = &mut q[(t * nq + h) * dh..(t * nq + h + 1) * dh];
                qd.copy_from_slice(&src[..dh]);
                gate[(t * nq + h) * dh..(t * nq + h + 1) * dh].copy_from_slice(&src[dh..]);
                ops::rms_norm_scaled(qd, &self.q_scale, self.eps);
                self.rope.apply(qd, start + t);
            }
            for g in 0..nkv {
                let kd = &mut k[(t * nkv + g) * dh..(t * nkv + g + 1) * dh];
                ops::rms_norm_scaled(kd, &self.k_scale, self.eps);
                self.rope.apply(kd, start + t);
            }
        }
        grow(&mut cache.k, k.len());
        grow(&mut cache.v, v.len());
        cache.k.extend_from_slice(&k);
        cache.v.extend_from_slice(&v);
        cache.len += n;

        // Causal attention, tiled over the cache (see `causal` for its reduction order).
        let scale = 1.0 / (dh as f32).sqrt();
        let mut o = vec![0.0f32; n * nq * dh];
        let heads = causal::Heads { nq, nkv, dh };
        causal::causal_attention(isa, heads, &q, n, start, &cache.k, &cache.v, scale, &mut o);
        for (ov, gv) in o.iter_mut().zip(&gate) {
            *ov *= ops::sigmoid(*gv);
        }
        drop(scope);
        let _scope = profile::scope(prof, "attention.o_proj", self.o_proj.bytes());
        project_new(isa, &self.o_proj, &o, n)
    }
}

/// Makes room for `extra` more elements, growing the capacity by an eighth (or to what is
/// needed, if more) instead of `Vec`'s doubling: the cache's slack stays under 12.5% of it, not
/// up to 100%, at the price of more reallocations (each amortised over an eighth of the cache;
/// large buffers are moved by `mremap`, not copied).
fn grow(buf: &mut Vec<f32>, extra: usize) {
    let needed = buf.len() + extra;
    if needed > buf.capacity() {
        let target = needed.max(buf.capacity() + buf.capacity() / 8);
        buf.reserve_exact(target - buf.len());
    }
}
