//! The reference expert backend: computes routed experts straight from the checkpoint's BF16
//! bytes (memory-mapped, located by `shared::safetensors_locator`), f32 activations.
//!
//! Each expert's weights are read once per call for all rows routed to it (a GEMM over its
//! rows), and each row's outputs are summed in the call's order.

use super::{ExpertBackend, ExpertError, MoeCall, combine_in_call_order, validate_call};
use crate::model::ops::silu;
use crate::model::weights::{MappedCheckpoint, Matrix, WeightsError};
use crate::profile::Profiler;
use rayon::prelude::*;
use shared::ids::{ExpertId, LayerId};
use shared::kernels::{self, Isa};
use shared::safetensors_locator::ExpertLocator;

/// Gate, up and down matrices of one expert.
struct ExpertMatrices {
    gate: Matrix,
    up: Matrix,
    down: Matrix,
}

/// Routed experts computed from the checkpoint's BF16 weights.
pub struct Bf16Experts {
    /// `[layer][expert]`.
    experts: Vec<Vec<ExpertMatrices>>,
    n_experts: usize,
    hidden: usize,
    isa: Isa,
}

impl Bf16Experts {
    /// Locates every expert of every layer in the mapped checkpoint.
    pub fn new(w: &MappedCheckpoint, isa: Isa) -> Result<Bf16Experts, WeightsError> {
        let ckpt = w.checkpoint().ok_or_else(|| WeightsError::NotSafetensors {
            path: w.path().display().to_string(),
            what: "--experts bf16 reads BF16 experts from a safetensors directory; prepare a \
                   container from the GGUF (`expertd prepare FILE.gguf --out DIR`) and use \
                   --experts int8 --container DIR, or --experts expertd"
                .into(),
        })?;
        let cfg = &ckpt.config.text;
        let locator = ExpertLocator::new(ckpt);
        let mut experts = Vec::with_capacity(cfg.num_layers);
        for layer in LayerId::all(cfg.num_layers) {
            let mut row = Vec::with_capacity(cfg.num_experts);
            for e in ExpertId::all(cfg.num_experts) {
                let r = locator
                    .expert(layer, e)
                    .map_err(|err| WeightsError::Missing(err.to_string()))?;
                let name = format!("layer {layer} expert {e}");
                let m = |b: &shared::safetensors_locator::ByteRange| {
                    w.matrix_at(&name, b.shard, b.offset, b.shape[0], b.shape[1])
                };
                row.push(ExpertMatrices {
                    gate: m(&r.gate)?,
                    up: m(&r.up)?,
                    down: m(&r.down)?,
                });
            }
            experts.push(row);
        }
        Ok(Bf16Experts {
            experts,
            n_experts: cfg.num_experts,
            hidden: cfg.hidden_size,
            isa,
        })
    }
}

impl ExpertBackend for Bf16Experts {
    fn name(&self) -> &'static str {
        "bf16"
    }

    fn results_identity(&self) -> Option<String> {
        Some("bf16".to_string())
    }

    fn expert_bytes(&self) -> Option<usize> {
        self.experts
            .first()
            .and_then(|l| l.first())
            .map(|m| m.gate.bytes() + m.up.bytes() + m.down.bytes())
    }

    fn moe_layer_profiled(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        _profiler: Option<&Profiler>,
    ) -> Result<(), ExpertError> {
        validate_call(
            call,
            self.experts.len(),
            self.n_experts,
            self.hidden,
            out.len(),
        )?;
        let (d, k) = (self.hidden, call.top_k);
        // Group (row, slot) cells by expert.
        let used = shared::moe_combine::cells_by_expert(call.ids, self.n_experts);
        // One GEMM chain per expert over its rows; results land in per-cell slots.
        let results: Vec<(Vec<usize>, Vec<f32>)> = used
            .into_par_iter()
            .map(|(e, cells)| {
                let m = &self.experts[call.layer.index()][e.index()];
                let rows = cells.len();
                let xs = shared::moe_combine::gather(call.x, d, k, &cells);
                let f = m.gate.rows;
                let mut g = vec![0.0f32; rows * f];
                let mut u = vec![0.0f32; rows * f];
                kernels::gemm_bf16(self.isa, m.gate.data(), f, d, &xs, rows, &mut g);
                kernels::gemm_bf16(self.isa, m.up.data(), f, d, &xs, rows, &mut u);
                for (gv, uv) in g.iter_mut().zip(&u) {
                    *gv = silu(*gv) * uv;
                }
                let mut y = vec![0.0f32; rows * d];
                kernels::gemm_bf16(self.isa, m.down.data(), d, f, &g, rows, &mut y);
                (cells, y)
            })
            .collect();
        combine_in_call_order(call, d, results, out);
        Ok(())
    }
}
