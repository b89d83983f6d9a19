//! The MoE block (docs/model.md §4.7): router (softmax over all experts, top-k, renormalise), the call
//! to the [`ExpertBackend`](crate::experts::ExpertBackend), and the shared expert with its
//! sigmoid gate.

use super::linear::{self, DenseFormat, Linear, project_new};
use super::ops;
use super::weights::{MappedCheckpoint, WeightsError};
use crate::experts::{ExpertBackend, ExpertError, MoeCall};
use crate::profile::{self, Profiler};
use shared::config::TextConfig;
use shared::kernels::Isa;

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
    layer: usize,
}

impl Moe {
    /// Loads layer `layer`'s router and shared expert.
    pub fn load(w: &MappedCheckpoint, cfg: &TextConfig, prefix: &str, layer: usize, dense: DenseFormat) -> Result<Moe, WeightsError> {
        let m = format!("{prefix}layers.{layer}.mlp.");
        let (d, fs) = (cfg.hidden_size, cfg.shared_expert_intermediate_size);
        Ok(Moe {
            // Router and shared-expert gate stay BF16 in every mode (see `linear`).
            router: Linear::new(w.matrix(&format!("{m}gate.weight"), cfg.num_experts, d)?, DenseFormat::Bf16),
            shared_gate: Linear::new(w.matrix(&format!("{m}shared_expert.gate_proj.weight"), fs, d)?, dense),
            shared_up: Linear::new(w.matrix(&format!("{m}shared_expert.up_proj.weight"), fs, d)?, dense),
            shared_down: Linear::new(w.matrix(&format!("{m}shared_expert.down_proj.weight"), d, fs)?, dense),
            shared_expert_gate: Linear::new(w.matrix(&format!("{m}shared_expert_gate.weight"), 1, d)?, DenseFormat::Bf16),
            top_k: cfg.experts_per_token,
            layer,
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
        Routes { top_k: self.top_k, ids, weights }
    }

    /// Full MoE output for `n` rows of `x` (already post-attention-normed): routed experts via
    /// `experts` plus the gated shared expert. Returns the output and the routes. Op times, and
    /// the expert backend's figures, go to `prof` when given.
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
        let call = MoeCall { layer: self.layer, n_rows: n, top_k: self.top_k, x, ids: &routes.ids, weights: &routes.weights };
        // The distinct experts are counted only for the profile (their weight bytes).
        let scope = prof.map(|p| {
            let mut distinct = routes.ids.clone();
            distinct.sort_unstable();
            distinct.dedup();
            p.scope("moe.routed_experts", distinct.len() * experts.expert_bytes().unwrap_or(0))
        });
        experts.moe_layer_profiled(&call, &mut out, prof)?;
        drop(scope);
        let _scope = profile::scope(
            prof,
            "moe.shared_expert",
            self.shared_gate.bytes() + self.shared_up.bytes() + self.shared_down.bytes() + self.shared_expert_gate.bytes(),
        );

        let [mut g, u, gate]: [Vec<f32>; 3] =
            linear::project_many(isa, &[&self.shared_gate, &self.shared_up, &self.shared_expert_gate], x, n)
                .try_into()
                .expect("three projections");
        for (gv, uv) in g.iter_mut().zip(&u) {
            *gv = ops::silu(*gv) * uv;
        }
        let shared = project_new(isa, &self.shared_down, &g, n);
        for t in 0..n {
            let s = ops::sigmoid(gate[t]);
            for (o, v) in out[t * d..(t + 1) * d].iter_mut().zip(&shared[t * d..(t + 1) * d]) {
                *o += s * v;
            }
        }
        Ok((out, routes))
    }
}
