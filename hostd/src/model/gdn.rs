//! Gated DeltaNet (docs/model.md §4.6): in-projections, causal depthwise conv with SiLU and its rolling
//! state, L2-normalised q/k, β = σ(b), decay g = −exp(A_log)·softplus(a + dt_bias), the
//! delta-rule recurrence in f32 (decode) and its chunked form (prefill, chunks of 64), the
//! SiLU-gated RMSNorm and the out-projection.
//!
//! Owns the DeltaNet math and its per-sequence state; the caller owns the residual stream.

use super::linear::{self, DenseFormat, Linear, project_new};
use super::ops;
use super::weights::{LayerTensors, WeightsError};
use crate::profile::{self, Profiler};
use rayon::prelude::*;
use shared::config::{DeltaNetLayout, TextConfig};
use shared::kernels::{self, Isa};

/// Chunk length of the chunked (prefill) form, as transformers uses.
pub const CHUNK: usize = 64;

/// Per-sequence state of one DeltaNet layer (f32).
#[derive(Debug, Clone)]
pub struct DeltaNetState {
    /// The last `conv_kernel − 1` pre-conv qkv rows, oldest first: `[(K−1) × conv_dim]`.
    conv: Vec<f32>,
    /// Recurrent state per v head, `[n_v_heads][key_head_dim][value_head_dim]`.
    recurrent: Vec<f32>,
}

impl DeltaNetState {
    /// A fresh (all-zero) state.
    pub fn new(dn: &DeltaNetLayout) -> DeltaNetState {
        DeltaNetState {
            conv: vec![0.0; (dn.conv_kernel - 1) * dn.conv_dim()],
            recurrent: vec![0.0; dn.n_v_heads * dn.key_head_dim * dn.value_head_dim],
        }
    }
    /// Bytes held by the state.
    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.recurrent.len()) * 4
    }

    /// The conv rows and the recurrent state, as [`Self::from_parts`] takes them.
    pub fn parts(&self) -> (&[f32], &[f32]) {
        (&self.conv, &self.recurrent)
    }

    /// A state from its parts (a saved one); `None` unless their lengths are those of
    /// `like` (the layer's layout).
    pub fn from_parts(
        like: &DeltaNetState,
        conv: Vec<f32>,
        recurrent: Vec<f32>,
    ) -> Option<DeltaNetState> {
        (conv.len() == like.conv.len() && recurrent.len() == like.recurrent.len())
            .then_some(DeltaNetState { conv, recurrent })
    }
}

/// Weights of one Gated DeltaNet layer.
pub struct DeltaNet {
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    /// Conv taps `[conv_dim][K]`, tap K−1 multiplies the current token.
    conv: Vec<f32>,
    dt_bias: Vec<f32>,
    /// −exp(A_log) per v head.
    neg_a: Vec<f32>,
    norm: Vec<f32>,
    out_proj: Linear,
    dn: DeltaNetLayout,
    eps: f32,
}

/// The in-projections of `n` rows: `[n × conv_dim]` pre-conv q|k|v, `[n × value_dim]` output
/// gate z, and `[n × n_v_heads]` each of the β and decay inputs b and a.
struct Projected {
    xqkv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
}

/// Per-token inputs of the recurrence for one v head, after conv, norms and gates.
struct HeadInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    beta: &'a [f32],
    g: &'a [f32],
    n: usize,
}

impl DeltaNet {
    /// Loads a layer's DeltaNet weights from its `linear_attn` tensors.
    pub fn load(t: &LayerTensors<'_>, cfg: &TextConfig) -> Result<DeltaNet, WeightsError> {
        let dn = cfg.delta_net;
        let d = cfg.hidden_size;
        let a_log = t.vector("A_log")?;
        Ok(DeltaNet {
            in_proj_qkv: t.linear("in_proj_qkv.weight", dn.conv_dim(), d)?,
            in_proj_z: t.linear("in_proj_z.weight", dn.value_dim(), d)?,
            // The per-head β and decay gates stay BF16 (see `linear`).
            in_proj_b: t.linear_in(DenseFormat::Bf16, "in_proj_b.weight", dn.n_v_heads, d)?,
            in_proj_a: t.linear_in(DenseFormat::Bf16, "in_proj_a.weight", dn.n_v_heads, d)?,
            conv: t.vector("conv1d.weight")?,
            dt_bias: t.vector("dt_bias")?,
            neg_a: a_log.iter().map(|v| -v.exp()).collect(),
            norm: t.vector("norm.weight")?,
            out_proj: t.linear("out_proj.weight", d, dn.value_dim())?,
            dn,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// Runs `n` new tokens (rows of `x`, already normed) through the layer, advancing `state`,
    /// and returns the `n × d` mixer output. One token uses the recurrence; more use the
    /// chunked form; a single token runs its whole per-head work in one parallel region
    /// ([`Self::decode_heads`]). Op times go to `prof` when given.
    pub fn forward(
        &self,
        isa: Isa,
        x: &[f32],
        n: usize,
        state: &mut DeltaNetState,
        prof: Option<&Profiler>,
    ) -> Vec<f32> {
        let in_bytes = self.in_proj_qkv.bytes()
            + self.in_proj_z.bytes()
            + self.in_proj_b.bytes()
            + self.in_proj_a.bytes();
        let scope = profile::scope(prof, "deltanet.in_proj", in_bytes);
        let [xqkv, z, b, a]: [Vec<f32>; 4] = linear::project_many(
            isa,
            &[
                &self.in_proj_qkv,
                &self.in_proj_z,
                &self.in_proj_b,
                &self.in_proj_a,
            ],
            x,
            n,
        )
        .try_into()
        .expect("four projections");
        let p = Projected { xqkv, z, b, a };
        drop(scope);
        let o = if n == 1 {
            let _scope = profile::scope(prof, "deltanet.heads", 0);
            self.decode_heads(isa, &p, state)
        } else {
            self.mix_rows(isa, &p, n, state, prof)
        };
        let _scope = profile::scope(prof, "deltanet.out_proj", self.out_proj.bytes());
        project_new(isa, &self.out_proj, &o, n)
    }

    /// Conv, q/k norms, gates, recurrence (chunked form for `n > 1`) and gated norm of `n` rows:
    /// the general path, in phases, each phase parallel over rows or heads. Returns the
    /// `n × value_dim` gated-normed outputs, ready for the out-projection. The model runs it for
    /// `n > 1` only (prefill); with `n = 1` it is the reference [`Self::decode_heads`] is
    /// tested against, and keeps the phased decode's recurrence step ([`decode_step`]) for that.
    fn mix_rows(
        &self,
        isa: Isa,
        p: &Projected,
        n: usize,
        state: &mut DeltaNetState,
        prof: Option<&Profiler>,
    ) -> Vec<f32> {
        let Projected { xqkv, z, b, a } = p;
        let dn = self.dn;
        let (nk, nv, dk, dv) = (
            dn.n_k_heads,
            dn.n_v_heads,
            dn.key_head_dim,
            dn.value_head_dim,
        );
        let (cdim, kw) = (dn.conv_dim(), dn.conv_kernel);
        let scope = profile::scope(prof, "deltanet.conv_norm_gates", 0);

        // Causal depthwise conv over [history ; new rows], then SiLU.
        let hist = kw - 1;
        let mut ext = Vec::with_capacity((hist + n) * cdim);
        ext.extend_from_slice(&state.conv);
        ext.extend_from_slice(xqkv);
        let mut y = vec![0.0f32; n * cdim];
        // A task per token; every element is the same sum whichever way the work is cut.
        y.par_chunks_mut(cdim).enumerate().for_each(|(t, row)| {
            for (c, out) in row.iter_mut().enumerate() {
                *out = self.conv_channel(c, |m| ext[(t + m) * cdim + c]);
            }
        });
        state
            .conv
            .copy_from_slice(&ext[n * cdim..(n + hist) * cdim]);

        // Split and normalise q, k per head; v as is.
        let (ck, cv) = (nk * dk, nv * dv);
        let q_mul = 1.0 / (dk as f32).sqrt();
        let mut q = vec![0.0f32; n * ck];
        let mut k = vec![0.0f32; n * ck];
        let mut v = vec![0.0f32; n * cv];
        for t in 0..n {
            let row = &y[t * cdim..(t + 1) * cdim];
            q[t * ck..(t + 1) * ck].copy_from_slice(&row[..ck]);
            k[t * ck..(t + 1) * ck].copy_from_slice(&row[ck..2 * ck]);
            v[t * cv..(t + 1) * cv].copy_from_slice(&row[2 * ck..]);
            for h in 0..nk {
                ops::l2_norm(&mut q[t * ck + h * dk..t * ck + (h + 1) * dk], 1e-6, q_mul);
                ops::l2_norm(&mut k[t * ck + h * dk..t * ck + (h + 1) * dk], 1e-6, 1.0);
            }
        }
        // Gates laid out per head: beta[h][t], g[h][t].
        let mut beta = vec![0.0f32; nv * n];
        let mut g = vec![0.0f32; nv * n];
        for t in 0..n {
            for h in 0..nv {
                (beta[h * n + t], g[h * n + t]) = self.gates(h, b[t * nv + h], a[t * nv + h]);
            }
        }

        drop(scope);
        let scope = profile::scope(
            prof,
            if n == 1 {
                "deltanet.recurrence"
            } else {
                "deltanet.chunked"
            },
            0,
        );
        // Per v head: gather its inputs, run the recurrence, write outputs [t][h][dv].
        let head_out: Vec<Vec<f32>> = state
            .recurrent
            .par_chunks_mut(dk * dv)
            .enumerate()
            .map(|(h, s)| {
                let kh = h / dn.v_per_k;
                let gather = |src: &[f32], width: usize, stride: usize, head: usize| -> Vec<f32> {
                    (0..n)
                        .flat_map(|t| {
                            src[t * stride + head * width..t * stride + (head + 1) * width]
                                .iter()
                                .copied()
                        })
                        .collect()
                };
                let (qh, khv, vh) = (
                    gather(&q, dk, ck, kh),
                    gather(&k, dk, ck, kh),
                    gather(&v, dv, cv, h),
                );
                let inputs = HeadInputs {
                    q: &qh,
                    k: &khv,
                    v: &vh,
                    beta: &beta[h * n..(h + 1) * n],
                    g: &g[h * n..(h + 1) * n],
                    n,
                };
                if n == 1 {
                    decode_step(isa, s, &inputs, dk, dv)
                } else {
                    chunked(s, &inputs, dk, dv)
                }
            })
            .collect();

        drop(scope);
        let scope = profile::scope(prof, "deltanet.gated_norm", 0);
        // Gated RMSNorm per head, flattened head-major.
        let mut o = vec![0.0f32; n * cv];
        for t in 0..n {
            for (h, out_h) in head_out.iter().enumerate() {
                let dst = &mut o[t * cv + h * dv..t * cv + (h + 1) * dv];
                dst.copy_from_slice(&out_h[t * dv..(t + 1) * dv]);
                self.gated_norm(dst, &z[t * cv + h * dv..t * cv + (h + 1) * dv]);
            }
        }
        drop(scope);
        o
    }

    /// One token's per-head work in ONE parallel region, a task per v head: the conv (with
    /// SiLU) of its k head's q and k channels and of its own v channels, the q/k L2 norms, the
    /// gates, [`decode_step`] and the gated norm; then the conv state moves on by one row. The
    /// `v_per_k` v heads of a k head each redo its q/k conv and norms (2 · key_head_dim
    /// channels, small beside the head's state), so there are `n_v_heads` independent tasks.
    /// Every value is the same expression, in the same order, as in [`Self::mix_rows`] with
    /// `n = 1`, so the output and the state are the same bits (tested); the work is only cut
    /// differently (no fork/join per phase, no serial phases, no gathers). Returns `value_dim`
    /// gated-normed outputs.
    fn decode_heads(&self, isa: Isa, p: &Projected, state: &mut DeltaNetState) -> Vec<f32> {
        let Projected { xqkv, z, b, a } = p;
        let dn = self.dn;
        let (dk, dv, vpk) = (dn.key_head_dim, dn.value_head_dim, dn.v_per_k);
        let (cdim, hist) = (dn.conv_dim(), dn.conv_kernel - 1);
        let (ck, q_mul) = (dn.key_dim(), 1.0 / (dk as f32).sqrt());
        let conv_state = &state.conv;
        // Channel c after the conv: the history rows, then this token's row.
        let conv = |c: usize| {
            self.conv_channel(c, |m| {
                if m < hist {
                    conv_state[m * cdim + c]
                } else {
                    xqkv[c]
                }
            })
        };
        let mut o = vec![0.0f32; dn.value_dim()];
        o.par_chunks_mut(dv)
            .zip(state.recurrent.par_chunks_mut(dk * dv))
            .enumerate()
            .for_each(|(h, (dst, s))| {
                let kh = h / vpk;
                let mut q: Vec<f32> = (kh * dk..(kh + 1) * dk).map(conv).collect();
                let mut k: Vec<f32> = (ck + kh * dk..ck + (kh + 1) * dk).map(conv).collect();
                ops::l2_norm(&mut q, 1e-6, q_mul);
                ops::l2_norm(&mut k, 1e-6, 1.0);
                let v: Vec<f32> = (2 * ck + h * dv..2 * ck + (h + 1) * dv).map(conv).collect();
                let (beta, g) = self.gates(h, b[h], a[h]);
                let inputs = HeadInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    beta: &[beta],
                    g: &[g],
                    n: 1,
                };
                dst.copy_from_slice(&decode_step(isa, s, &inputs, dk, dv));
                self.gated_norm(dst, &z[h * dv..(h + 1) * dv]);
            });
        if hist > 0 {
            state.conv.copy_within(cdim.., 0);
            state.conv[(hist - 1) * cdim..].copy_from_slice(xqkv);
        }
        o
    }

    /// Channel `c` of the causal conv with SiLU; `input(m)` is the value under tap `m` (tap
    /// `K − 1` is the current token).
    #[inline]
    fn conv_channel(&self, c: usize, input: impl Fn(usize) -> f32) -> f32 {
        let kw = self.dn.conv_kernel;
        let taps = &self.conv[c * kw..(c + 1) * kw];
        let acc: f32 = taps.iter().enumerate().map(|(m, w)| w * input(m)).sum();
        ops::silu(acc)
    }

    /// v head `h`'s gates from its `b` and `a` projections: (β = σ(b), g = −exp(A_log)·softplus(a + dt_bias)).
    #[inline]
    fn gates(&self, h: usize, b: f32, a: f32) -> (f32, f32) {
        (
            ops::sigmoid(b),
            self.neg_a[h] * ops::softplus(a + self.dt_bias[h]),
        )
    }

    /// The SiLU-gated RMSNorm of one head's output `x` (in place) with its `z` gate values.
    #[inline]
    fn gated_norm(&self, x: &mut [f32], z: &[f32]) {
        let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
        let inv = 1.0 / (ms + self.eps).sqrt();
        for ((v, w), zv) in x.iter_mut().zip(&self.norm).zip(z) {
            *v = w * (*v * inv) * ops::silu(*zv);
        }
    }
}

/// The delta rule token by token (the normative form, which the tests hold [`decode_step`] and
/// [`chunked`] to). `s` is `[dk][dv]`; returns `[n][dv]`.
#[cfg(test)]
fn recurrent(s: &mut [f32], x: &HeadInputs<'_>, dk: usize, dv: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.n * dv];
    let mut u = vec![0.0f32; dv];
    for t in 0..x.n {
        let (q, k, v) = (
            &x.q[t * dk..(t + 1) * dk],
            &x.k[t * dk..(t + 1) * dk],
            &x.v[t * dv..(t + 1) * dv],
        );
        let decay = x.g[t].exp();
        s.iter_mut().for_each(|e| *e *= decay);
        // u = β (v − Sᵀk)
        u.copy_from_slice(v);
        for (i, ki) in k.iter().enumerate() {
            for (uj, sij) in u.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                *uj -= ki * sij;
            }
        }
        u.iter_mut().for_each(|e| *e *= x.beta[t]);
        // S += k ⊗ u, then o = Sᵀq
        let o = &mut out[t * dv..(t + 1) * dv];
        for i in 0..dk {
            let row = &mut s[i * dv..(i + 1) * dv];
            for (sij, uj) in row.iter_mut().zip(&u) {
                *sij += k[i] * uj;
            }
            for (oj, sij) in o.iter_mut().zip(row.iter()) {
                *oj += q[i] * sij;
            }
        }
    }
    out
}

/// One token of the delta rule in three passes over the state instead of [`recurrent`]'s
/// four (the decay, `Sᵀk`, then the update fused with `Sᵀq`): with `S' = γS + k⊗u` and
/// `u = β(v − γSᵀk)`, the output `S'ᵀq = γSᵀq + (k·q)u` needs only the old state, so two read
/// passes (the SIMD kernel's `Sᵀk` and `Sᵀq`; a head's 64 KiB state stays in L2 between them)
/// and one read-write pass that applies the update do it. Mathematically
/// equal to [`recurrent`] for `n = 1`; the sums are grouped differently (tested close).
/// `s` is `[dk][dv]`; returns `[dv]`.
fn decode_step(isa: Isa, s: &mut [f32], x: &HeadInputs<'_>, dk: usize, dv: usize) -> Vec<f32> {
    debug_assert_eq!(x.n, 1);
    let (q, k, v) = (&x.q[..dk], &x.k[..dk], &x.v[..dv]);
    let decay = x.g[0].exp();
    let mut sk = vec![0.0f32; dv];
    let mut sq = vec![0.0f32; dv];
    kernels::scale_axpy_rows_f32(isa, &mut sk, 0.0, k, s, dv);
    kernels::scale_axpy_rows_f32(isa, &mut sq, 0.0, q, s, dv);
    let kq = ops::dot(k, q);
    let u: Vec<f32> = v
        .iter()
        .zip(&sk)
        .map(|(vj, skj)| x.beta[0] * (vj - decay * skj))
        .collect();
    for (i, ki) in k.iter().enumerate() {
        for (sij, uj) in s[i * dv..(i + 1) * dv].iter_mut().zip(&u) {
            *sij = decay * *sij + ki * uj;
        }
    }
    sq.iter()
        .zip(&u)
        .map(|(sqj, uj)| decay * sqj + kq * uj)
        .collect()
}

/// The chunked form (docs/model.md §4.6): mathematically identical to [`recurrent`], with work done as
/// small matrix products per chunk of [`CHUNK`] tokens. `s` is `[dk][dv]`; returns `[n][dv]`.
fn chunked(s: &mut [f32], x: &HeadInputs<'_>, dk: usize, dv: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.n * dv];
    let mut start = 0;
    while start < x.n {
        let l = CHUNK.min(x.n - start);
        let q = &x.q[start * dk..(start + l) * dk];
        let k = &x.k[start * dk..(start + l) * dk];
        let v = &x.v[start * dv..(start + l) * dv];
        let beta = &x.beta[start..start + l];
        // γ_i = Σ_{s≤i} g_s
        let gamma: Vec<f32> = x.g[start..start + l]
            .iter()
            .scan(0.0f32, |acc, g| {
                *acc += g;
                Some(*acc)
            })
            .collect();
        // Strictly lower L_ij = β_i (k_i·k_j) e^{γ_i−γ_j}.
        let mut lmat = vec![0.0f32; l * l];
        for i in 0..l {
            for j in 0..i {
                lmat[i * l + j] = beta[i]
                    * ops::dot(&k[i * dk..(i + 1) * dk], &k[j * dk..(j + 1) * dk])
                    * (gamma[i] - gamma[j]).exp();
            }
        }
        // Forward substitution with (I + L): U = (I+L)⁻¹(β v), W = (I+L)⁻¹(β e^γ k).
        let mut u = vec![0.0f32; l * dv];
        let mut w = vec![0.0f32; l * dk];
        for i in 0..l {
            for c in 0..dv {
                u[i * dv + c] = beta[i] * v[i * dv + c];
            }
            let scale = beta[i] * gamma[i].exp();
            for c in 0..dk {
                w[i * dk + c] = scale * k[i * dk + c];
            }
            for j in 0..i {
                let lij = lmat[i * l + j];
                if lij != 0.0 {
                    let (done, cur) = u.split_at_mut(i * dv);
                    for (uc, uj) in cur[..dv].iter_mut().zip(&done[j * dv..(j + 1) * dv]) {
                        *uc -= lij * uj;
                    }
                    let (done, cur) = w.split_at_mut(i * dk);
                    for (wc, wj) in cur[..dk].iter_mut().zip(&done[j * dk..(j + 1) * dk]) {
                        *wc -= lij * wj;
                    }
                }
            }
        }
        // V' = U − W·S
        let mut vp = u;
        for i in 0..l {
            for r in 0..dk {
                let wir = w[i * dk + r];
                for (vc, sc) in vp[i * dv..(i + 1) * dv]
                    .iter_mut()
                    .zip(&s[r * dv..(r + 1) * dv])
                {
                    *vc -= wir * sc;
                }
            }
        }
        // O_i = e^{γ_i} q_i·S + Σ_{j≤i} (q_i·k_j) e^{γ_i−γ_j} V'_j
        for i in 0..l {
            let o = &mut out[(start + i) * dv..(start + i + 1) * dv];
            let eg = gamma[i].exp();
            for r in 0..dk {
                let qr = q[i * dk + r] * eg;
                for (oc, sc) in o.iter_mut().zip(&s[r * dv..(r + 1) * dv]) {
                    *oc += qr * sc;
                }
            }
            for j in 0..=i {
                let a = ops::dot(&q[i * dk..(i + 1) * dk], &k[j * dk..(j + 1) * dk])
                    * (gamma[i] - gamma[j]).exp();
                for (oc, vc) in o.iter_mut().zip(&vp[j * dv..(j + 1) * dv]) {
                    *oc += a * vc;
                }
            }
        }
        // S_new = e^{γ_last} S + Σ_j (k_j e^{γ_last−γ_j}) ⊗ V'_j
        let last = gamma[l - 1];
        let el = last.exp();
        s.iter_mut().for_each(|e| *e *= el);
        for j in 0..l {
            let f = (last - gamma[j]).exp();
            for r in 0..dk {
                let kr = k[j * dk + r] * f;
                for (sc, vc) in s[r * dv..(r + 1) * dv]
                    .iter_mut()
                    .zip(&vp[j * dv..(j + 1) * dv])
                {
                    *sc += kr * vc;
                }
            }
        }
        start += l;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic inputs in realistic ranges (unit-norm k, β in (0,1), g ≤ 0).
    /// q, k, v, β, g for `n` tokens.
    type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    /// Deterministic values uniform in [-1, 1): xorshift32 from `state`.
    fn uniform(mut state: u32) -> impl FnMut() -> f32 {
        move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32) * 2.0 - 1.0
        }
    }

    fn inputs(n: usize, dk: usize, dv: usize, seed: u32) -> Inputs {
        let mut rnd = uniform(seed.wrapping_mul(2654435761).wrapping_add(1));
        let mut q: Vec<f32> = (0..n * dk).map(|_| rnd()).collect();
        let mut k: Vec<f32> = (0..n * dk).map(|_| rnd()).collect();
        for t in 0..n {
            ops::l2_norm(&mut q[t * dk..(t + 1) * dk], 1e-6, 1.0 / (dk as f32).sqrt());
            ops::l2_norm(&mut k[t * dk..(t + 1) * dk], 1e-6, 1.0);
        }
        let v = (0..n * dv).map(|_| rnd()).collect();
        let beta = (0..n).map(|_| ops::sigmoid(rnd() * 3.0)).collect();
        let g = (0..n).map(|_| -ops::softplus(rnd() * 2.0) * 0.5).collect();
        (q, k, v, beta, g)
    }

    fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn decode_step_matches_the_normative_recurrence_over_many_tokens() {
        let (dk, dv) = (128, 128);
        let n = 40;
        let (q, k, v, beta, g) = inputs(n, dk, dv, 7);
        for isa in kernels::present_or_say(Isa::ALL, |isa| isa.is_available()) {
            let mut s_ref: Vec<f32> = (0..dk * dv)
                .map(|i| ((i % 11) as f32 - 5.0) * 0.02)
                .collect();
            let mut s_new = s_ref.clone();
            for t in 0..n {
                let x = HeadInputs {
                    q: &q[t * dk..(t + 1) * dk],
                    k: &k[t * dk..(t + 1) * dk],
                    v: &v[t * dv..(t + 1) * dv],
                    beta: &beta[t..t + 1],
                    g: &g[t..t + 1],
                    n: 1,
                };
                let o_ref = recurrent(&mut s_ref, &x, dk, dv);
                let o_new = decode_step(isa, &mut s_new, &x, dk, dv);
                let (max_o, max_s) = (max_abs_diff(&o_ref, &o_new), max_abs_diff(&s_ref, &s_new));
                assert!(
                    max_o < 1e-5 && max_s < 1e-5,
                    "{isa} token {t}: max |Δo| {max_o}, max |ΔS| {max_s}"
                );
            }
        }
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_boundaries_and_carried_state() {
        let (dk, dv) = (16, 24);
        for n in [1, 2, 63, 64, 65, 130] {
            let (q, k, v, beta, g) = inputs(n, dk, dv, n as u32);
            let x = HeadInputs {
                q: &q,
                k: &k,
                v: &v,
                beta: &beta,
                g: &g,
                n,
            };
            // Non-zero incoming state, as when a prompt is fed in pieces.
            let s0: Vec<f32> = (0..dk * dv)
                .map(|i| ((i % 7) as f32 - 3.0) * 0.05)
                .collect();
            let (mut s_rec, mut s_chk) = (s0.clone(), s0);
            let o_rec = recurrent(&mut s_rec, &x, dk, dv);
            let o_chk = chunked(&mut s_chk, &x, dk, dv);
            let (max_o, max_s) = (max_abs_diff(&o_rec, &o_chk), max_abs_diff(&s_rec, &s_chk));
            assert!(
                max_o < 1e-5 && max_s < 1e-5,
                "n={n}: max |Δo| {max_o}, max |ΔS| {max_s}"
            );
        }
    }

    /// A small layer of layout `dn` with random non-trivial weights (the
    /// projections are never used: the tests feed [`Projected`] directly).
    fn layer(dn: DeltaNetLayout, seed: u32) -> DeltaNet {
        let mut rnd = uniform(seed.wrapping_mul(2654435761).wrapping_add(3));
        let unused = || {
            Linear::new(
                super::super::weights::Matrix::from_vec(vec![half::bf16::ZERO; 16], 1, 16),
                DenseFormat::Bf16,
            )
        };
        DeltaNet {
            in_proj_qkv: unused(),
            in_proj_z: unused(),
            in_proj_b: unused(),
            in_proj_a: unused(),
            conv: (0..dn.conv_dim() * dn.conv_kernel)
                .map(|_| rnd() * 0.5)
                .collect(),
            dt_bias: (0..dn.n_v_heads).map(|_| rnd()).collect(),
            neg_a: (0..dn.n_v_heads).map(|_| -(rnd() * 0.5).exp()).collect(),
            norm: (0..dn.value_head_dim).map(|_| 1.0 + rnd() * 0.1).collect(),
            out_proj: unused(),
            dn,
            eps: 1e-6,
        }
    }

    #[test]
    fn decode_heads_gives_the_general_paths_bits_token_after_token() {
        for (vpk, kw) in [(2, 4), (1, 4), (3, 2), (2, 1)] {
            decode_heads_matches(DeltaNetLayout {
                n_k_heads: 3,
                n_v_heads: 3 * vpk,
                key_head_dim: 32,
                value_head_dim: 48,
                v_per_k: vpk,
                conv_kernel: kw,
            });
        }
    }

    fn decode_heads_matches(dn: DeltaNetLayout) {
        let net = layer(dn, 5);
        let isa = Isa::active();
        let (mut s_general, mut s_fused) = (DeltaNetState::new(&dn), DeltaNetState::new(&dn));
        let (q, k, v, beta, g) = inputs(12, dn.conv_dim(), dn.value_dim(), 9);
        for t in 0..12 {
            // Arbitrary projections for token t (q, k, v, β and g of `inputs` reused as raw values).
            let p = Projected {
                xqkv: q[t * dn.conv_dim()..(t + 1) * dn.conv_dim()]
                    .iter()
                    .zip(&k[t * dn.conv_dim()..])
                    .map(|(a, b)| a * 40.0 + b)
                    .collect(),
                z: v[t * dn.value_dim()..(t + 1) * dn.value_dim()]
                    .iter()
                    .map(|z| z * 3.0)
                    .collect(),
                b: (0..dn.n_v_heads)
                    .map(|h| beta[t] * 4.0 - 2.0 + h as f32 * 0.3)
                    .collect(),
                a: (0..dn.n_v_heads).map(|h| g[t] + h as f32 * 0.2).collect(),
            };
            let o_general = net.mix_rows(isa, &p, 1, &mut s_general, None);
            let o_fused = net.decode_heads(isa, &p, &mut s_fused);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&o_fused),
                bits(&o_general),
                "{dn:?} token {t}: outputs"
            );
            assert_eq!(
                bits(&s_fused.recurrent),
                bits(&s_general.recurrent),
                "{dn:?} token {t}: recurrent state"
            );
            assert_eq!(
                bits(&s_fused.conv),
                bits(&s_general.conv),
                "{dn:?} token {t}: conv state"
            );
            assert!(
                o_fused.iter().any(|v| v.abs() > 1e-3),
                "{dn:?} token {t}: the outputs are not trivially zero"
            );
        }
    }
}
