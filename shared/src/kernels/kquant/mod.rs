//! 4- and 6-bit expert kernels over GGUF-compatible k-quant blocks (`Q4_K`, `Q6_K`) × int8
//! activations (per-row scales), with exact i32 sums per 256-weight super-block and one shared
//! scalar fold into f32.
//!
//! Owns the block formats ([`KQuantKind`], byte-compatible with ggml's `block_q4_K` and
//! `block_q6_K`, so a GGUF's expert rows can be copied in unchanged), the safe API (shape and
//! ISA checks) and the dispatch to one kernel per instruction set: `scalar` (the reference),
//! `avx2` and `avx512` (x86_64 only). The quantisers live in `quant`, the activation format in
//! `acts`, the expert in `expert`. No IO, no logging, no threads.
//!
//! # Shapes
//!
//! A [`KMatrixRef`] is `[rows, cols]` (`[out, in]`), each row `padded_k(cols) / 256` blocks
//! back to back, columns past `cols` quantised as zeros. Activations ([`KActsRef`]) are `n`
//! rows of `padded_k(cols)` signed bytes (zero past `cols`), one i32 sum per 16 bytes and one
//! i16 sum per 32, one f32 scale per row. Outputs are row-major `[n, rows]`.
//!
//! # Arithmetic (the bitwise contract)
//!
//! For token `t`, row `r` and super-block `b` (weights `w = d·sc_j·q − dmin·m_j` for Q4_K,
//! `w = d·sc_j·(q − 32)` for Q6_K, `j` the sub-block):
//!
//! 1. Q4_K: `a = Σ_j sc_j · Σ_{i∈j} q_i·x_i` and `m = Σ_j m_j · Σ_{i∈j} x_i`, exact i32.
//!    Q6_K: `a = Σ_j sc_j · Σ_{i∈j} (q_i − 32)·x_i`, exact i32 (the SIMD kernels compute it as
//!    `Σ_j sc_j·Σ q_i·x_i − 32·Σ_j sc_j·Σ x_i`, the same integer).
//! 2. `acc ← fold(acc, block, a, m)` over `b` in order, starting from `0.0` ([`fold_q4k`],
//!    [`fold_q6k`]: plain f32 multiplies and adds, never fused), then `y = acc · x_scale[t]`.
//!
//! Integer sums do not depend on order and step 2 is the same f32 operations in the same order
//! in every ISA (one scalar routine, or its lane-wise copy where eight tokens fold at once), so
//! every ISA gives bit-identical outputs, and a token computed alone equals the same token in a
//! batch.

mod acts;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod expert;
mod quant;
mod scalar;
#[cfg(test)]
mod tests;

pub use acts::{KActs, KActsRef, SUM32_GROUP, quantize_activations_k};
pub use expert::{KExpertScratch, expert_forward_k};
pub use quant::{dequantize_row, quantize_matrix};

use super::int8::Int8Isa;
use half::f16;

/// Weights per super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// Activation values per partial sum in [`KActsRef::sums`] (the Q6_K sub-block).
pub const SUM_GROUP: usize = 16;

/// Bytes of a Q4_K block: `d`, `dmin` (f16), 12 bytes of 6-bit scales and mins, 128 of nibbles.
pub const Q4K_BLOCK_BYTES: usize = 144;
/// Bytes of a Q6_K block: 128 of low nibbles, 64 of high 2-bit pairs, 16 i8 scales, `d` (f16).
pub const Q6K_BLOCK_BYTES: usize = 210;

/// The largest `cols` a k-quant matrix may have (the container's dimension cap, with room).
/// Every i32 sum is exact whatever `cols` is, since sums never span blocks: per block a Q4_K
/// `a` is at most 8 · 63 · 32 · 15 · 128 < 2²⁵ and a Q6_K `a` at most 16 · 128 · 16 · 32 · 128
/// < 2²⁸ (sub-scales reach −128, codes −32..31, activations −128..127).
pub const MAX_K_COLS: usize = 1 << 20;

/// A k-quant block format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KQuantKind {
    /// ggml `Q4_K`: 4.5 bits per weight; 8 sub-blocks of 32 with 6-bit scale and min.
    Q4K,
    /// ggml `Q6_K`: 6.5625 bits per weight; 16 sub-blocks of 16 with an i8 scale.
    Q6K,
}

impl KQuantKind {
    /// Bytes of one 256-weight block.
    pub const fn block_bytes(self) -> usize {
        match self {
            KQuantKind::Q4K => Q4K_BLOCK_BYTES,
            KQuantKind::Q6K => Q6K_BLOCK_BYTES,
        }
    }

    /// ggml's name of the type: `Q4_K`, `Q6_K`.
    pub const fn name(self) -> &'static str {
        match self {
            KQuantKind::Q4K => "Q4_K",
            KQuantKind::Q6K => "Q6_K",
        }
    }
}

/// `cols` rounded up to a multiple of [`QK_K`].
pub const fn padded_k(cols: usize) -> usize {
    cols.div_ceil(QK_K) * QK_K
}

/// Bytes of one row of `cols` weights in `kind`.
pub const fn row_bytes(kind: KQuantKind, cols: usize) -> usize {
    padded_k(cols) / QK_K * kind.block_bytes()
}

/// A k-quant matrix borrowed in place (from a container blob or a [`KMatrix`]).
#[derive(Debug, Clone, Copy)]
pub struct KMatrixRef<'a> {
    /// The block format.
    pub kind: KQuantKind,
    /// Output rows.
    pub rows: usize,
    /// Input columns (real, unpadded).
    pub cols: usize,
    /// `rows · row_bytes(kind, cols)` bytes, row-major blocks.
    pub data: &'a [u8],
}

impl KMatrixRef<'_> {
    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        row_bytes(self.kind, self.cols)
    }

    /// Blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        padded_k(self.cols) / QK_K
    }

    /// Panics unless `data` holds exactly `rows` rows and `cols` is within [`MAX_K_COLS`].
    pub fn assert_shape(&self) {
        assert!(
            self.cols <= MAX_K_COLS,
            "kquant: {} columns exceed MAX_K_COLS ({MAX_K_COLS})",
            self.cols
        );
        let want = self.rows.checked_mul(self.row_bytes());
        assert_eq!(
            Some(self.data.len()),
            want,
            "kquant: {} data is {} bytes, not rows ({}) · row bytes ({})",
            self.kind.name(),
            self.data.len(),
            self.rows,
            self.row_bytes()
        );
    }
}

impl<'a> KMatrixRef<'a> {
    /// Rows `..at` and rows `at..` as two matrices (`at` clamped to `rows`).
    pub fn split_rows(&self, at: usize) -> (KMatrixRef<'a>, KMatrixRef<'a>) {
        let at = at.min(self.rows);
        let (head, tail) = self
            .data
            .split_at((at * self.row_bytes()).min(self.data.len()));
        (
            KMatrixRef {
                rows: at,
                data: head,
                ..*self
            },
            KMatrixRef {
                rows: self.rows - at,
                data: tail,
                ..*self
            },
        )
    }

    /// Checks what a checksum cannot: the shape, and that every block's f16 super-scales
    /// (`d`, and `dmin` for Q4_K) are finite. Names the first bad row and block.
    pub fn verify(&self) -> Result<(), String> {
        let rb = self.row_bytes();
        if Some(self.data.len()) != self.rows.checked_mul(rb) {
            return Err(format!(
                "{} data is {} bytes, not {} rows × {rb}",
                self.kind.name(),
                self.data.len(),
                self.rows
            ));
        }
        let bb = self.kind.block_bytes();
        for (i, block) in self.data.chunks_exact(bb).enumerate() {
            let scales: &[usize] = match self.kind {
                KQuantKind::Q4K => &[0, 2],
                KQuantKind::Q6K => &[208],
            };
            for &at in scales {
                let v = f16_at(block, at);
                if !v.is_finite() {
                    return Err(format!(
                        "{} row {} block {}: super-scale at block byte {at} is {v}",
                        self.kind.name(),
                        i / (rb / bb),
                        i % (rb / bb)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// An owned k-quant matrix (what [`quantize_matrix`] returns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KMatrix {
    /// The block format.
    pub kind: KQuantKind,
    /// Output rows.
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
    /// The blocks.
    pub data: Vec<u8>,
}

impl KMatrix {
    /// Every row dequantised, row-major `[rows, cols]` (reports and tests).
    pub fn dequantize(&self) -> Vec<f32> {
        let rb = row_bytes(self.kind, self.cols);
        let mut out = vec![0.0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (row, bytes) in out
                .chunks_exact_mut(self.cols)
                .zip(self.data.chunks_exact(rb))
            {
                dequantize_row(self.kind, bytes, self.cols, row);
            }
        }
        out
    }

    /// Borrows it.
    pub fn as_ref(&self) -> KMatrixRef<'_> {
        KMatrixRef {
            kind: self.kind,
            rows: self.rows,
            cols: self.cols,
            data: &self.data,
        }
    }
}

/// Reads an f16 stored little-endian at `b[at..at + 2]` as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The 8 scales and 8 mins of a Q4_K block's 12 packed bytes (ggml's `get_scale_min_k4` for
/// every sub-block at once): `(scales, mins)`, each 0..=63.
#[inline]
pub(crate) fn q4k_scales_mins(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = packed[j] & 63;
        m[j] = packed[j + 4] & 63;
        sc[j + 4] = (packed[j + 8] & 0xF) | ((packed[j] >> 6) << 4);
        m[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4);
    }
    (sc, m)
}

/// One Q4_K super-block folded into the row's accumulator: `acc + d·a − dmin·m`, left to right,
/// in f32. The one definition every ISA calls.
#[inline(always)]
pub(crate) fn fold_q4k(acc: f32, d: f32, dmin: f32, a: i32, m: i32) -> f32 {
    acc + d * a as f32 - dmin * m as f32
}

/// One Q6_K super-block folded into the row's accumulator: `acc + d·a`, in f32.
#[inline(always)]
pub(crate) fn fold_q6k(acc: f32, d: f32, a: i32) -> f32 {
    acc + d * a as f32
}

/// `Y = dequant(X · Wᵀ)` for `n` activation rows: `y[t·rows + r]` per the module docs.
/// Row `t` of `y` is bitwise equal to this call on row `t` alone, and bitwise equal across ISAs.
///
/// # Panics
///
/// Panics if `m` is malformed, `x` does not hold `n` rows of `padded_k(m.cols)`, `y.len() !=
/// n · m.rows`, or `isa` is not available on this CPU.
pub fn gemm_k(isa: Int8Isa, m: KMatrixRef<'_>, x: KActsRef<'_>, n: usize, y: &mut [f32]) {
    assert!(
        isa.is_available(),
        "kquant: ISA {isa} is not available on this CPU"
    );
    m.assert_shape();
    x.assert_shape(n, m.cols);
    assert_eq!(
        y.len(),
        n * m.rows,
        "kquant: output length != n ({n}) · rows ({})",
        m.rows
    );
    match isa {
        Int8Isa::Scalar => scalar::gemm(m, x, n, y),
        // SAFETY: AVX2 is available (checked above) and the shapes were checked.
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx2 => unsafe { avx2::gemm(m, x, n, y) },
        // SAFETY: AVX-512 F/BW/VNNI are available (checked above) and the shapes were checked.
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx512Vnni => unsafe { avx512::gemm(m, x, n, y) },
        #[cfg(not(target_arch = "x86_64"))]
        Int8Isa::Avx2 | Int8Isa::Avx512Vnni => {
            unreachable!("kquant: {isa} is never available off x86_64")
        }
    }
}

/// `y = dequant(W · x)` for one activation row ([`gemm_k`] with `n = 1`).
pub fn gemv_k(isa: Int8Isa, m: KMatrixRef<'_>, x: KActsRef<'_>, y: &mut [f32]) {
    gemm_k(isa, m, x, 1, y);
}
