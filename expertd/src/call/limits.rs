//! What one MoE call may be, checked before anything of its size exists: the row count, the
//! layer, the routing (ids in range, no duplicate within a row, finite weights) and the
//! call-memory bound (`crate::call_memory`). Pure arithmetic over the container's dimensions:
//! the call pipeline runs it for both transports, and the ring fuzz target runs the same code.

use crate::call_memory::CallMemory;
use crate::moe_call::{CallError, CallSpec};
use shared::ids::LayerId;

/// The checks every call passes before it is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Layers in the container.
    pub n_layers: usize,
    /// Experts per layer.
    pub n_experts: usize,
    /// Values per activation row.
    pub hidden: usize,
    /// Most rows one call may carry (`--max-rows-per-call`).
    pub max_rows: usize,
    /// What one call may make the daemon hold.
    pub memory: CallMemory,
}

impl CallLimits {
    /// Checks a call's row count: `1..=max_rows` (before any buffer of that size is touched).
    pub fn check_rows(&self, layer: LayerId, n_rows: usize) -> Result<(), CallError> {
        if n_rows == 0 || n_rows > self.max_rows {
            return Err(CallError::Invalid {
                layer,
                reason: format!("n_tokens {n_rows} must be in 1..={}", self.max_rows),
            });
        }
        Ok(())
    }

    /// Checks a call's shape, before anything of its size is read or allocated: the layer's
    /// range, the row count, then what its buffers would take against what one call may make
    /// the daemon hold.
    pub fn check_shape(
        &self,
        layer: LayerId,
        n_rows: usize,
        top_k: usize,
    ) -> Result<(), CallError> {
        if layer.index() >= self.n_layers {
            return Err(CallError::Invalid {
                layer,
                reason: format!(
                    "layer {layer} out of range (container has {} layers)",
                    self.n_layers
                ),
            });
        }
        self.check_rows(layer, n_rows)?;
        self.memory.check(layer, n_rows, top_k)
    }

    /// Checks a call's routing (after its shape): lengths, expert ranges, duplicates within a row, finite weights.
    pub fn check_routing(&self, spec: &CallSpec<'_>) -> Result<(), CallError> {
        shared::moe_exec::validate_routing(
            spec.n_rows,
            spec.top_k,
            spec.ids,
            spec.weights,
            self.n_experts,
        )
        .map_err(|reason| CallError::Invalid {
            layer: spec.layer,
            reason,
        })
    }

    /// [`check_shape`](Self::check_shape) then [`check_routing`](Self::check_routing): every
    /// check a call passes before it can be admitted, the same for both transports.
    pub fn validate<'a>(&self, spec: CallSpec<'a>) -> Result<Validated<'a>, CallError> {
        self.check_shape(spec.layer, spec.n_rows, spec.top_k)?;
        self.check_routing(&spec)?;
        Ok(Validated(spec))
    }
}

/// A call that passed [`CallLimits::validate`]: the only kind the pipeline admits.
#[derive(Debug, Clone, Copy)]
pub struct Validated<'a>(CallSpec<'a>);

impl<'a> Validated<'a> {
    /// The call.
    pub fn spec(&self) -> &CallSpec<'a> {
        &self.0
    }
}
