//! Dense projection weights in the format the run chose: BF16 straight from the mapped
//! checkpoint (the exact mode, the default), W8A8 INT8 quantised at load (`--dense int8`), or a
//! GGUF's own `Q4_K` / `Q6_K` blocks run by the k-quant kernels (`--dense gguf`, W4A8 / W6A8,
//! the same activation quantisation), and the projections `y = x · Wᵀ` over any of them.
//!
//! The INT8 form uses the routed experts' scheme and kernels (`shared::kernels::int8`):
//! symmetric per-output-row weights in the R16C4 layout, activations quantised per row, exact
//! i32 accumulation. Because every row of a W8A8 GEMM is bitwise equal to the GEMV of that
//! row, prefill in one block, in pieces or token by token give identical results in INT8 mode
//! too. Gates whose output feeds a decision or a nonlinearity directly (router, shared-expert
//! gate, DeltaNet `a`/`b`) stay BF16 in both modes: they are < 2% of the dense bytes.

use super::ops;
use super::weights::Matrix;
use rayon::prelude::*;
use shared::kernels::int8::{
    self, Int8Isa, MatrixRef, QuantizedMatrix, ROW_BLOCK, padded_cols, padded_rows,
};
use shared::kernels::kquant::{self, KActs, KMatrix};
use shared::kernels::{self, Isa};

/// Storage format of the large dense projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenseFormat {
    /// BF16 weights from the checkpoint, f32 activations: the exact mode.
    #[default]
    Bf16,
    /// INT8 weights quantised at load (per output row), INT8 activations (per row).
    Int8,
    /// A GGUF's `Q4_K` / `Q6_K` projections kept in their blocks (k-quant kernels, INT8
    /// activations per row); every other projection as [`DenseFormat::Int8`].
    Gguf,
}

impl DenseFormat {
    /// `bf16` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            DenseFormat::Bf16 => "bf16",
            DenseFormat::Int8 => "int8",
            DenseFormat::Gguf => "gguf",
        }
    }
}

/// Weights of one projection.
enum Weights {
    Bf16(Matrix),
    Int8(QuantizedMatrix),
    KQuant(KMatrix),
}

/// A `[rows, cols]` (`[out, in]`) dense projection weight.
pub struct Linear {
    w: Weights,
    /// Output dimension.
    pub rows: usize,
    /// Input dimension.
    pub cols: usize,
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Linear[{}×{} {}]",
            self.rows,
            self.cols,
            self.format().name()
        )
    }
}

/// Rows quantised per rayon task at load (a multiple of [`ROW_BLOCK`], so chunks concatenate).
const QUANT_CHUNK_ROWS: usize = 64 * ROW_BLOCK;

impl Linear {
    /// Wraps a BF16 matrix, converting it to `format` ([`DenseFormat::Gguf`]: INT8, as for a
    /// projection that is not k-quant in the file). INT8 conversion reads the matrix once (in
    /// parallel) and then advises the kernel to drop its mapped pages, so the BF16 copy does
    /// not stay resident beside the INT8 one.
    pub fn new(m: Matrix, format: DenseFormat) -> Linear {
        let (rows, cols) = (m.rows, m.cols);
        match format {
            DenseFormat::Bf16 => Linear {
                w: Weights::Bf16(m),
                rows,
                cols,
            },
            DenseFormat::Int8 | DenseFormat::Gguf => {
                let q = quantize_bf16(&m);
                m.release_pages();
                Linear {
                    w: Weights::Int8(q),
                    rows,
                    cols,
                }
            }
        }
    }

    /// Wraps k-quant blocks as they are (a GGUF's `Q4_K` / `Q6_K` projection).
    pub fn kquant(m: KMatrix) -> Linear {
        m.as_ref().assert_shape();
        let (rows, cols) = (m.rows, m.cols);
        Linear {
            w: Weights::KQuant(m),
            rows,
            cols,
        }
    }

    /// The format the weights are held in.
    pub fn format(&self) -> DenseFormat {
        match self.w {
            Weights::Bf16(_) => DenseFormat::Bf16,
            Weights::Int8(_) => DenseFormat::Int8,
            Weights::KQuant(_) => DenseFormat::Gguf,
        }
    }

    /// Bytes of weights one full pass streams (INT8: values, scales and row sums).
    pub fn bytes(&self) -> usize {
        match &self.w {
            Weights::Bf16(m) => m.bytes(),
            Weights::Int8(q) => q.as_ref().streamed_bytes(),
            Weights::KQuant(m) => m.data.len(),
        }
    }

    /// The row-major f32 values the projection multiplies by (dequantised for INT8), for
    /// quality reports and tests.
    pub fn dequantize(&self) -> Vec<f32> {
        match &self.w {
            Weights::Bf16(m) => m.data().iter().map(|v| v.to_f32()).collect(),
            Weights::Int8(q) => q.dequantize(),
            Weights::KQuant(m) => m.dequantize(),
        }
    }
}

/// Quantises a BF16 matrix per output row into R16C4, in parallel over chunks of rows.
fn quantize_bf16(m: &Matrix) -> QuantizedMatrix {
    let (rows, cols) = (m.rows, m.cols);
    let chunks: Vec<QuantizedMatrix> = (0..rows.div_ceil(QUANT_CHUNK_ROWS))
        .into_par_iter()
        .map(|c| {
            let r0 = c * QUANT_CHUNK_ROWS;
            let r1 = (r0 + QUANT_CHUNK_ROWS).min(rows);
            let f: Vec<f32> = m.data()[r0 * cols..r1 * cols]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            int8::quantize_weights(&f, r1 - r0, cols)
        })
        .collect();
    // Chunks are whole 16-row blocks (except the last), so the packed bytes, scales and row
    // sums of the whole matrix are the chunks' concatenation.
    let pc = padded_cols(cols);
    let pr = padded_rows(rows);
    let mut packed = Vec::with_capacity(pr * pc);
    advise_huge_pages(&packed);
    let mut scales = Vec::with_capacity(pr);
    let mut row_sums = Vec::with_capacity(pr);
    for q in chunks {
        packed.extend_from_slice(&q.packed);
        scales.extend_from_slice(&q.scales);
        row_sums.extend_from_slice(&q.row_sums);
    }
    QuantizedMatrix {
        rows,
        cols,
        packed,
        scales,
        row_sums,
    }
}

/// Asks for transparent huge pages over a freshly allocated, not yet written buffer (its
/// whole capacity), before it is filled: a GEMV streams the buffer front to back, and with 4 KiB
/// pages the hardware prefetchers stop at every page boundary and the TLB misses every 4 KiB.
/// Only page-aligned 2 MiB stretches inside the allocation can become huge pages; failure (THP
/// off, not Linux) changes nothing but speed.
fn advise_huge_pages<T>(v: &Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = v.as_ptr() as usize;
        let end = start + v.capacity() * size_of::<T>();
        let aligned = start.next_multiple_of(PAGE);
        if end > aligned + (2 << 20) {
            // SAFETY: [aligned, end) lies inside the Vec's own allocation, which stays alive
            // for the call; MADV_HUGEPAGE changes only how the kernel backs those pages, never
            // their contents or protection.
            let _ = unsafe {
                rustix::mm::madvise(
                    aligned as *mut std::ffi::c_void,
                    (end - aligned) & !(PAGE - 1),
                    rustix::mm::Advice::LinuxHugepage,
                )
            };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// Rows `r0 .. r0 + len` of a quantised matrix (`r0` a multiple of [`ROW_BLOCK`]).
fn row_slice(q: &QuantizedMatrix, r0: usize, len: usize) -> MatrixRef<'_> {
    debug_assert_eq!(r0 % ROW_BLOCK, 0);
    let pc = padded_cols(q.cols);
    let pr = padded_rows(len);
    MatrixRef {
        rows: len,
        cols: q.cols,
        packed: &q.packed[r0 * pc..(r0 + pr) * pc],
        scales: &q.scales[r0..r0 + pr],
        row_sums: &q.row_sums[r0..r0 + pr],
    }
}

/// Input rows quantised once for every INT8 projection that reads them.
struct QuantizedInput {
    q: Vec<u8>,
    scales: Vec<f32>,
}

impl QuantizedInput {
    fn new(x: &[f32], n: usize, cols: usize) -> QuantizedInput {
        let mut q = vec![0u8; n * padded_cols(cols)];
        let mut scales = vec![0.0f32; n];
        int8::quantize_activations(x, n, cols, &mut q, &mut scales);
        QuantizedInput { q, scales }
    }
}

/// One unit of parallel work: rows `r0 .. r0 + rows` of one matrix.
struct Tile<'a> {
    lin: &'a Linear,
    r0: usize,
    rows: usize,
    out: usize,
}

/// Several projections of the same `n` input rows in ONE parallel region: `x · Wᵢᵀ` for every
/// matrix, returned in order (`[n, rows_i]` each). The rows of all matrices are cut into tiles
/// that share the rayon pool, paying one fork/join instead of one per matrix; every tile runs
/// the same single-threaded kernel whatever the tiling (GEMV for one row, GEMM otherwise), so
/// results do not depend on the thread count. The INT8 matrices share one quantisation of `x`,
/// the k-quant ones another (the same values, with the sums the k-quant kernels need).
pub fn project_many(isa: Isa, mats: &[&Linear], x: &[f32], n: usize) -> Vec<Vec<f32>> {
    // PERF-CRITICAL: decode runs this a few times per layer per token.
    let Some(first) = mats.first() else {
        return Vec::new();
    };
    let cols = first.cols;
    assert!(
        mats.iter().all(|m| m.cols == cols),
        "project_many: matrices read inputs of different widths"
    );
    assert_eq!(
        x.len(),
        n * cols,
        "project_many: input length != n ({n}) · cols ({cols})"
    );
    let bf16: Option<Vec<&Matrix>> = mats
        .iter()
        .map(|m| match &m.w {
            Weights::Bf16(w) => Some(w),
            Weights::Int8(_) | Weights::KQuant(_) => None,
        })
        .collect();
    if let Some(bf16) = bf16 {
        // The exact mode's path, unchanged: BF16 kernels writing straight into the outputs.
        return ops::project_many(isa, &bf16, x, n);
    }
    // Each quantised form of x only if a matrix reads it (both use the same formula).
    let has = |f: DenseFormat| mats.iter().any(|m| m.format() == f);
    let xq = has(DenseFormat::Int8).then(|| QuantizedInput::new(x, n, cols));
    let mut k_acts = KActs::default();
    let xk = has(DenseFormat::Gguf).then(|| k_acts.quantize(x, n, cols));
    let mut tiles = Vec::new();
    for (out, m) in mats.iter().enumerate() {
        // Bytes of one weight row: what sizes the tiles.
        let row_bytes = match m.format() {
            DenseFormat::Bf16 => 2 * cols,
            DenseFormat::Int8 => cols,
            DenseFormat::Gguf => m.bytes() / m.rows.max(1),
        };
        let tile = ops::tile_rows(m.rows, row_bytes, ROW_BLOCK);
        for r0 in (0..m.rows).step_by(tile.max(1)) {
            tiles.push(Tile {
                lin: m,
                r0,
                rows: tile.min(m.rows - r0),
                out,
            });
        }
    }
    let i8isa = Int8Isa::active();
    // One stealable job per tile, as in `ops::project_many` (unequal tiles balance).
    let parts: Vec<(usize, usize, Vec<f32>)> = tiles
        .into_par_iter()
        .with_max_len(1)
        .map(|t| {
            let mut y = vec![0.0f32; n * t.rows];
            match &t.lin.w {
                Weights::Bf16(m) => {
                    let w = &m.data()[t.r0 * cols..(t.r0 + t.rows) * cols];
                    if n == 1 {
                        kernels::gemv_bf16(isa, w, t.rows, cols, x, &mut y);
                    } else {
                        kernels::gemm_bf16(isa, w, t.rows, cols, x, n, &mut y);
                    }
                }
                Weights::Int8(q) => {
                    let xq = xq.as_ref().expect("quantised for the INT8 matrices");
                    int8::gemm_w8a8(
                        i8isa,
                        row_slice(q, t.r0, t.rows),
                        &xq.q,
                        &xq.scales,
                        n,
                        &mut y,
                    );
                }
                Weights::KQuant(m) => {
                    let rows = m.as_ref().split_rows(t.r0).1.split_rows(t.rows).0;
                    let xk = xk.expect("quantised for the k-quant matrices");
                    kquant::gemm_k(i8isa, rows, xk, n, &mut y);
                }
            }
            (t.out, t.r0, y)
        })
        .collect();
    let mut outs: Vec<Vec<f32>> = mats.iter().map(|m| vec![0.0f32; n * m.rows]).collect();
    for (o, r0, y) in parts {
        let rows = mats[o].rows;
        let tile_rows = y.len() / n;
        for t in 0..n {
            outs[o][t * rows + r0..t * rows + r0 + tile_rows]
                .copy_from_slice(&y[t * tile_rows..(t + 1) * tile_rows]);
        }
    }
    outs
}

/// `x[n × cols] · Wᵀ` into a new `[n, rows]` buffer.
pub fn project_new(isa: Isa, w: &Linear, x: &[f32], n: usize) -> Vec<f32> {
    project_many(isa, &[w], x, n).pop().expect("one projection")
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn matrix(rows: usize, cols: usize, seed: u32) -> Matrix {
        let data = (0..rows * cols)
            .map(|i| {
                bf16::from_f32(
                    (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0,
                )
            })
            .collect();
        Matrix::from_vec(data, rows, cols)
    }

    #[test]
    fn chunked_quantisation_equals_whole_matrix_quantisation() {
        // More rows than one chunk, and not a multiple of 16, so chunks and padding both matter.
        let m = matrix(QUANT_CHUNK_ROWS + 37, 52, 7);
        let f: Vec<f32> = m.data().iter().map(|v| v.to_f32()).collect();
        let whole = int8::quantize_weights(&f, m.rows, m.cols);
        let chunked = quantize_bf16(&m);
        assert_eq!(chunked, whole);
        chunked.as_ref().verify().expect("valid R16C4 matrix");
    }

    #[test]
    fn int8_rows_do_not_depend_on_the_batch_or_the_tiling() {
        let isa = Isa::active();
        let (a, b, c) = (matrix(300, 96, 1), matrix(7, 96, 2), matrix(1030, 96, 3));
        let a = Linear::new(a, DenseFormat::Int8);
        let b = Linear::new(b, DenseFormat::Bf16);
        let c = Linear::new(c, DenseFormat::Int8);
        let n = 5;
        let x: Vec<f32> = (0..n * 96).map(|i| (i as f32 * 0.37).sin()).collect();
        let block = project_many(isa, &[&a, &b, &c], &x, n);
        for t in 0..n {
            let one = project_many(isa, &[&a, &b, &c], &x[t * 96..(t + 1) * 96], 1);
            for (m, (blk, row)) in block.iter().zip(&one).enumerate() {
                let rows = row.len();
                assert_eq!(
                    &blk[t * rows..(t + 1) * rows],
                    &row[..],
                    "matrix {m}, row {t}"
                );
            }
            assert_eq!(project_new(isa, &a, &x[t * 96..(t + 1) * 96], 1), one[0]);
        }
    }

    #[test]
    fn int8_projection_is_close_to_the_bf16_projection() {
        let isa = Isa::active();
        let m = matrix(64, 128, 9);
        let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact = project_new(isa, &Linear::new(m.clone(), DenseFormat::Bf16), &x, 1);
        let q = project_new(isa, &Linear::new(m, DenseFormat::Int8), &x, 1);
        let scale = exact.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (e, g) in exact.iter().zip(&q) {
            assert!((e - g).abs() < 0.02 * scale, "{e} vs {g}");
        }
    }

    #[test]
    fn kquant_rows_are_the_kernel_over_the_whole_matrix_whatever_the_batch_or_tiling() {
        // Enough rows that project_many cuts the k-quant matrices into several tiles, beside an
        // INT8 and a BF16 matrix in the same call.
        let isa = Isa::active();
        let cols = 512;
        let k_mat = |rows: usize, kind, seed| {
            let w: Vec<f32> = matrix(rows, cols, seed)
                .data()
                .iter()
                .map(|v| v.to_f32())
                .collect();
            kquant::quantize_matrix(kind, &w, rows, cols)
        };
        let (q4, q6) = (
            k_mat(1500, kquant::KQuantKind::Q4K, 4),
            k_mat(33, kquant::KQuantKind::Q6K, 5),
        );
        let lins = [
            Linear::kquant(q4.clone()),
            Linear::new(matrix(40, cols, 6), DenseFormat::Int8),
            Linear::kquant(q6.clone()),
            Linear::new(matrix(9, cols, 7), DenseFormat::Bf16),
        ];
        assert_eq!(lins[0].format(), DenseFormat::Gguf);
        assert_eq!(lins[0].bytes(), q4.data.len());
        let n = 9;
        let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.13).sin()).collect();
        let block = project_many(isa, &lins.iter().collect::<Vec<_>>(), &x, n);
        // The k-quant outputs are gemm_k over the whole matrix.
        let mut acts = KActs::default();
        let xa = acts.quantize(&x, n, cols);
        for (m, o) in [(&q4, 0), (&q6, 2)] {
            let mut want = vec![0.0f32; n * m.rows];
            kquant::gemm_k(Int8Isa::active(), m.as_ref(), xa, n, &mut want);
            assert_eq!(block[o], want, "matrix {o}");
        }
        // Each token alone gives its row of the block.
        for t in 0..n {
            let one = project_many(
                isa,
                &lins.iter().collect::<Vec<_>>(),
                &x[t * cols..(t + 1) * cols],
                1,
            );
            for (m, (blk, row)) in block.iter().zip(&one).enumerate() {
                let rows = row.len();
                assert_eq!(
                    &blk[t * rows..(t + 1) * rows],
                    &row[..],
                    "matrix {m}, token {t}"
                );
            }
        }
        // And each value is the dequantized row times x, within what rounding x to int8 can
        // move it: Σ|w| · max|x| / 254 (half a step of the row's scale), plus f32 slack.
        let deq = lins[0].dequantize();
        let x_max = x[..cols].iter().fold(0f32, |a, v| a.max(v.abs()));
        for r in (0..1500).step_by(75) {
            let w = &deq[r * cols..(r + 1) * cols];
            let exact: f32 = w.iter().zip(&x).map(|(w, x)| w * x).sum();
            let bound = w.iter().map(|w| w.abs()).sum::<f32>() * x_max / 254.0 + 1e-3;
            let got = block[0][r];
            assert!(
                (exact - got).abs() <= bound,
                "row {r}: {exact} vs {got} (bound {bound})"
            );
        }
    }
}
