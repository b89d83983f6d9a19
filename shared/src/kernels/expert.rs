//! One routed expert in whichever format its weights are: [`ExpertMatrices`] names the two
//! matrices (INT8 or k-quant), [`expert_forward_any`] runs the matching kernel family. The
//! one place that chooses between the families, so the executor and the backends never do.

use super::int8::{ExpertScratch, Int8Isa, MatrixRef, expert_forward};
use super::kquant::{KExpertScratch, KMatrixRef, expert_forward_k};

/// One expert's two matrices, as the kernels consume them, borrowed in place.
#[derive(Debug, Clone, Copy)]
pub enum ExpertMatrices<'a> {
    /// INT8 (R16C4, per-row scales): container format v1.
    Int8 {
        /// Fused gate and up projection, `[2f × d]`, gate rows first.
        gate_up: MatrixRef<'a>,
        /// Down projection, `[d × f]`.
        down: MatrixRef<'a>,
    },
    /// k-quant blocks (Q4_K / Q6_K): container format v2.
    KQuant {
        /// Fused gate and up projection, `[2f × d]`, gate rows first.
        gate_up: KMatrixRef<'a>,
        /// Down projection, `[d × f]`.
        down: KMatrixRef<'a>,
    },
}

impl<'a> ExpertMatrices<'a> {
    /// The INT8 matrices `(gate_up, down)`, or `None` for a k-quant expert.
    pub fn int8(&self) -> Option<(MatrixRef<'a>, MatrixRef<'a>)> {
        match *self {
            ExpertMatrices::Int8 { gate_up, down } => Some((gate_up, down)),
            ExpertMatrices::KQuant { .. } => None,
        }
    }

    /// The k-quant matrices `(gate_up, down)`, or `None` for an INT8 expert.
    pub fn kquant(&self) -> Option<(KMatrixRef<'a>, KMatrixRef<'a>)> {
        match *self {
            ExpertMatrices::KQuant { gate_up, down } => Some((gate_up, down)),
            ExpertMatrices::Int8 { .. } => None,
        }
    }

    /// `(rows, cols)` of gate_up and of down.
    pub fn shapes(&self) -> [(usize, usize); 2] {
        match self {
            ExpertMatrices::Int8 { gate_up, down } => {
                [(gate_up.rows, gate_up.cols), (down.rows, down.cols)]
            }
            ExpertMatrices::KQuant { gate_up, down } => {
                [(gate_up.rows, gate_up.cols), (down.rows, down.cols)]
            }
        }
    }
}

/// Scratch for either kernel family (one per worker thread; each part grows on first use).
#[derive(Debug, Default, Clone)]
pub struct AnyExpertScratch {
    int8: ExpertScratch,
    kquant: KExpertScratch,
}

impl AnyExpertScratch {
    /// Empty scratch.
    pub fn new() -> AnyExpertScratch {
        AnyExpertScratch::default()
    }
}

/// One expert for `n` tokens (`x`, `out`: row-major `[n, d]`) with the kernel family of `m`:
/// [`expert_forward`] for INT8, [`expert_forward_k`] for k-quants. Bit-identical across ISAs.
///
/// # Panics
///
/// As the family's kernel: shapes that disagree, or `isa` not available.
pub fn expert_forward_any(
    isa: Int8Isa,
    m: ExpertMatrices<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    scratch: &mut AnyExpertScratch,
) {
    match m {
        ExpertMatrices::Int8 { gate_up, down } => {
            expert_forward(isa, gate_up, down, x, n, out, &mut scratch.int8);
        }
        ExpertMatrices::KQuant { gate_up, down } => {
            expert_forward_k(isa, gate_up, down, x, n, out, &mut scratch.kquant);
        }
    }
}
