//! The MoE block (docs/model.md §4.7): router (softmax over all experts, top-k, renormalise), the call
//! to the [`ExpertBackend`](crate::experts::ExpertBackend), and the shared expert with its
//! sigmoid gate.

use super::linear::{self, DenseFormat, Linear, project_new};
use super::ops;
use super::weights::{LayerTensors, WeightsError};
use crate::experts::{ExpertBackend, ExpertError, MoeCall};
use crate::profile::{self, Profiler};
use shared::config::TextConfig;
use shared::ids::LayerId;
use shared::kernels::Isa;
use std::time::Instant;

/// The experts and weights one layer chose for a batch of rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    /// Experts per row.
    pub top_k: usize,
    /// `n_rows × top_k` expert ids, each row in descending probability (lower id first on ties).
    pub ids: Vec<u32>,
    /// Renormalised weights aligned with `ids`.
    pub weights: Vec<f32>,
}

/// Router and shared-expert weights of one layer.
pub struct Moe {
    router: Linear,
    shared_gate: Linear,
    shared_up: Linear,
    shared_down: Linear,
    shared_expert_gate: Linear,
    top_k: usize,
    layer: LayerId,
}

impl Moe {
    /// Loads a layer's router and shared expert from its `mlp` tensors.
    pub fn load(t: &LayerTensors<'_>, cfg: &TextConfig) -> Result<Moe, WeightsError> {
        let (d, fs) = (cfg.hidden_size, cfg.shared_expert_intermediate_size);
        Ok(Moe {
            // Router and shared-expert gate stay BF16 in every mode (see `linear`).
            router: t.linear_in(DenseFormat::Bf16, "gate.weight", cfg.num_experts, d)?,
            shared_gate: t.linear("shared_expert.gate_proj.weight", fs, d)?,
            shared_up: t.linear("shared_expert.up_proj.weight", fs, d)?,
            shared_down: t.linear("shared_expert.down_proj.weight", d, fs)?,
            shared_expert_gate: t.linear_in(
                DenseFormat::Bf16,
                "shared_expert_gate.weight",
                1,
                d,
            )?,
            top_k: cfg.experts_per_token,
            layer: LayerId::from_index(t.layer),
        })
    }

    /// Chooses experts for `n` rows of `x`.
    pub fn route(&self, isa: Isa, x: &[f32], n: usize) -> Routes {
        let e = self.router.rows;
        let logits = project_new(isa, &self.router, x, n);
        let mut ids = Vec::with_capacity(n * self.top_k);
        let mut weights = Vec::with_capacity(n * self.top_k);
        let mut order: Vec<u32> = Vec::with_capacity(e);
        for row in logits.chunks_exact(e) {
            let mut p = row.to_vec();
            ops::softmax(&mut p);
            order.clear();
            order.extend(0..e as u32);
            // Descending probability; equal probabilities keep the lower id first.
            order.sort_by(|&a, &b| p[b as usize].total_cmp(&p[a as usize]).then(a.cmp(&b)));
            let chosen = &order[..self.top_k];
            let sum: f32 = chosen.iter().map(|&i| p[i as usize]).sum();
            ids.extend_from_slice(chosen);
            weights.extend(chosen.iter().map(|&i| p[i as usize] / sum));
        }
        Routes {
            top_k: self.top_k,
            ids,
            weights,
        }
    }

    /// Full MoE output for `n` rows of `x` (already post-attention-normed): routed experts via
    /// `experts` plus the gated shared expert, which the backend runs while its call is in
    /// flight when it computes elsewhere (see [`ExpertBackend::moe_layer_overlapped`]); the
    /// result is the same either way. Returns the output and the routes. Op times, and the
    /// expert backend's figures, go to `prof` when given.
    pub fn forward(
        &self,
        isa: Isa,
        experts: &dyn ExpertBackend,
        x: &[f32],
        n: usize,
        prof: Option<&Profiler>,
    ) -> Result<(Vec<f32>, Routes), ExpertError> {
        let d = self.router.cols;
        let scope = profile::scope(prof, "moe.router", self.router.bytes());
        let routes = self.route(isa, x, n);
        drop(scope);
        let mut out = vec![0.0f32; n * d];
        let call = MoeCall {
            layer: self.layer,
            n_rows: n,
            top_k: self.top_k,
            x,
            ids: &routes.ids,
            weights: &routes.weights,
        };
        // The distinct experts are counted only for the profile (their weight bytes).
        let routed_bytes = prof.map_or(0, |_| {
            let mut distinct = routes.ids.clone();
            distinct.sort_unstable();
            distinct.dedup();
            distinct.len() * experts.expert_bytes().unwrap_or(0)
        });
        let mut shared: Option<(Vec<f32>, Vec<f32>)> = None;
        let mut shared_ns = 0u64;
        let mut shared_expert = || {
            let t = prof.map(|_| Instant::now());
            shared = Some(self.shared_expert(isa, x, n));
            shared_ns = t.map_or(0, |t| t.elapsed().as_nanos() as u64);
        };
        let t = prof.map(|_| Instant::now());
        experts.moe_layer_overlapped(&call, &mut out, prof, &mut shared_expert)?;
        let (shared, gate) = shared.expect("the backend runs `during` exactly once");
        // moe.routed_experts: the call's wall time on this thread minus the shared expert's
        // (which ran inside it, overlapped or not).
        if let (Some(p), Some(t)) = (prof, t) {
            p.add(
                "moe.routed_experts",
                (t.elapsed().as_nanos() as u64).saturating_sub(shared_ns),
                routed_bytes as u64,
            );
        }
        let t = prof.map(|_| Instant::now());
        for t in 0..n {
            let s = ops::sigmoid(gate[t]);
            for (o, v) in out[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&shared[t * d..(t + 1) * d])
            {
                *o += s * v;
            }
        }
        if let (Some(p), Some(t)) = (prof, t) {
            let bytes = self.shared_gate.bytes()
                + self.shared_up.bytes()
                + self.shared_down.bytes()
                + self.shared_expert_gate.bytes();
            p.add(
                "moe.shared_expert",
                shared_ns + t.elapsed().as_nanos() as u64,
                bytes as u64,
            );
        }
        Ok((out, routes))
    }

    /// The shared expert of `n` rows of `x`, before its gate: (`n × hidden` outputs, `n` gate
    /// logits).
    fn shared_expert(&self, isa: Isa, x: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
        let [mut g, u, gate]: [Vec<f32>; 3] = linear::project_many(
            isa,
            &[&self.shared_gate, &self.shared_up, &self.shared_expert_gate],
            x,
            n,
        )
        .try_into()
        .expect("three projections");
        for (gv, uv) in g.iter_mut().zip(&u) {
            *gv = ops::silu(*gv) * uv;
        }
        (project_new(isa, &self.shared_down, &g, n), gate)
    }
}
