//! The R16C4 packed weight layout: shapes, padding and the byte order the kernels read.
//!
//! Owns only index arithmetic and the packing copy; quantisation lives in `quant`. A matrix of
//! `rows × cols` int8 values is padded to [`padded_rows`] × [`padded_cols`] with zeros and
//! stored as row blocks of [`ROW_BLOCK`] rows, each a run of column groups of [`COL_GROUP`]
//! bytes per row:
//!
//! ```text
//! for rb in 0..padded_rows / 16 {          // row block
//!     for cg in 0..padded_cols / 4 {       // column group: one 64-byte chunk
//!         for r in 0..16 {
//!             for c in 0..4 { byte = q[rb·16 + r][cg·4 + c]  (0 where padded) }
//!         }
//!     }
//! }
//! ```
//!
//! One 64-byte chunk therefore holds 4 consecutive columns of 16 consecutive rows: exactly one
//! zmm for `vpdpbusd` against the 4 activation bytes of that column group broadcast to every
//! lane, leaving lane `r` with row `r`'s partial dot product. The whole matrix is one forward
//! stream of such chunks.

/// Rows interleaved per block.
pub const ROW_BLOCK: usize = 16;
/// Bytes per row per column group (one `vpdpbusd` lane).
pub const COL_GROUP: usize = 4;

/// `rows` rounded up to a multiple of [`ROW_BLOCK`].
pub fn padded_rows(rows: usize) -> usize {
    rows.next_multiple_of(ROW_BLOCK)
}

/// `cols` rounded up to a multiple of [`COL_GROUP`].
pub fn padded_cols(cols: usize) -> usize {
    cols.next_multiple_of(COL_GROUP)
}

/// The position of element `(r, c)` in the packed bytes of a matrix with `cols` columns
/// (`r < padded_rows`, `c < padded_cols(cols)`).
pub fn packed_index(r: usize, c: usize, cols: usize) -> usize {
    let pc = padded_cols(cols);
    (r / ROW_BLOCK) * ROW_BLOCK * pc
        + (c / COL_GROUP) * ROW_BLOCK * COL_GROUP
        + (r % ROW_BLOCK) * COL_GROUP
        + c % COL_GROUP
}

/// Packs a row-major `[rows, cols]` int8 matrix into R16C4 order, zero-padded to
/// `padded_rows(rows) · padded_cols(cols)` bytes.
///
/// # Panics
///
/// Panics if `q.len() != rows · cols`.
pub fn pack_r16c4(q: &[i8], rows: usize, cols: usize) -> Vec<i8> {
    assert_eq!(
        q.len(),
        rows * cols,
        "int8: quantised length != rows ({rows}) · cols ({cols})"
    );
    let pc = padded_cols(cols);
    let mut packed = vec![0i8; padded_rows(rows) * pc];
    for (r, row) in q.chunks_exact(cols.max(1)).take(rows).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            packed[packed_index(r, c, cols)] = v;
        }
    }
    packed
}

/// The inverse of [`pack_r16c4`]: the row-major `[rows, cols]` values, padding dropped.
///
/// # Panics
///
/// Panics if `packed.len() != padded_rows(rows) · padded_cols(cols)`.
pub fn unpack_r16c4(packed: &[i8], rows: usize, cols: usize) -> Vec<i8> {
    assert_eq!(
        packed.len(),
        padded_rows(rows) * padded_cols(cols),
        "int8: packed length mismatch"
    );
    let mut q = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        q.extend((0..cols).map(|c| packed[packed_index(r, c, cols)]));
    }
    q
}

/// The most columns a matrix may have. Every intermediate the kernels form, the unsigned-offset
/// sum `Σ_c w·(x + 128)` included, is bounded by `128 · 255 · cols < 2³¹` up to this width, so
/// the i32 accumulators are exact (nothing wraps, nothing saturates) for any byte values.
pub const MAX_COLS: usize = 65_536;

/// An owned quantised matrix in R16C4 order (see the module docs).
///
/// `packed.len() == padded_rows · padded_cols`; `scales` and `row_sums` hold `padded_rows`
/// entries, the padded ones `0.0` and `0`. Row `r` dequantises as `q[r][c] as f32 · scales[r]`,
/// and `row_sums[r] = Σ_c q[r][c]` is what the SIMD kernels need for the unsigned-offset trick.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedMatrix {
    /// Logical output rows.
    pub rows: usize,
    /// Logical input columns.
    pub cols: usize,
    /// The R16C4 bytes, zero-padded.
    pub packed: Vec<i8>,
    /// Per-row dequantisation scales, `padded_rows` long.
    pub scales: Vec<f32>,
    /// Per-row sums of the quantised values, `padded_rows` long.
    pub row_sums: Vec<i32>,
}

/// A borrowed view of a [`QuantizedMatrix`]: what the kernels take, and what the INT8 expert
/// container hands out over its blob bytes. Same fields, same invariants.
#[derive(Debug, Clone, Copy)]
pub struct MatrixRef<'a> {
    /// Logical output rows.
    pub rows: usize,
    /// Logical input columns.
    pub cols: usize,
    /// The R16C4 bytes, zero-padded; `padded_rows · padded_cols` long.
    pub packed: &'a [i8],
    /// Per-row dequantisation scales, `padded_rows` long.
    pub scales: &'a [f32],
    /// Per-row sums of the quantised values, `padded_rows` long.
    pub row_sums: &'a [i32],
}

/// Why a [`MatrixRef`] breaks the R16C4 invariants ([`MatrixRef::verify`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MatrixError {
    /// A slice has the wrong length for `rows × cols`.
    #[error("int8 matrix {rows}×{cols}: {what} holds {got} entries, expected {want}")]
    Length {
        /// Logical rows.
        rows: usize,
        /// Logical columns.
        cols: usize,
        /// Which slice.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length the shape implies.
        want: usize,
    },
    /// More than [`MAX_COLS`] columns.
    #[error("int8 matrix has {0} columns, more than the {MAX_COLS} the i32 accumulators allow")]
    TooWide(usize),
    /// A padding byte, padded scale or padded row sum is not zero.
    #[error("int8 matrix: padding at packed row {row} is not zero")]
    Padding {
        /// The (padded) row holding the non-zero.
        row: usize,
    },
    /// A stored row sum differs from the sum of the row's packed bytes.
    #[error("int8 matrix: row {row} sums to {actual}, but row_sums says {stored}")]
    RowSum {
        /// The row.
        row: usize,
        /// The stored value.
        stored: i32,
        /// The sum of the packed bytes.
        actual: i32,
    },
}

impl QuantizedMatrix {
    /// Packs already-quantised row-major `[rows, cols]` values with their per-row `scales`
    /// (`rows` long), computing the row sums and the padding.
    ///
    /// # Panics
    ///
    /// Panics if `q.len() != rows · cols`, `scales.len() != rows` or `cols > MAX_COLS`.
    pub fn from_quantized(q: &[i8], rows: usize, cols: usize, scales: &[f32]) -> QuantizedMatrix {
        assert!(
            cols <= MAX_COLS,
            "int8: {cols} columns exceed MAX_COLS ({MAX_COLS})"
        );
        assert_eq!(scales.len(), rows, "int8: scales length != rows ({rows})");
        let packed = pack_r16c4(q, rows, cols);
        let pr = padded_rows(rows);
        let mut padded_scales = vec![0.0f32; pr];
        padded_scales[..rows].copy_from_slice(scales);
        let mut row_sums = vec![0i32; pr];
        for (sum, row) in row_sums
            .iter_mut()
            .zip(q.chunks_exact(cols.max(1)).take(rows))
        {
            *sum = row.iter().map(|&v| i32::from(v)).sum();
        }
        QuantizedMatrix {
            rows,
            cols,
            packed,
            scales: padded_scales,
            row_sums,
        }
    }

    /// The borrowed view the kernels take.
    pub fn as_ref(&self) -> MatrixRef<'_> {
        MatrixRef {
            rows: self.rows,
            cols: self.cols,
            packed: &self.packed,
            scales: &self.scales,
            row_sums: &self.row_sums,
        }
    }

    /// The row-major `[rows, cols]` f32 values `q[r][c] as f32 · scales[r]`, for error reports.
    pub fn dequantize(&self) -> Vec<f32> {
        self.as_ref().dequantize()
    }
}

impl MatrixRef<'_> {
    /// Rows rounded up to [`ROW_BLOCK`].
    pub fn padded_rows(&self) -> usize {
        padded_rows(self.rows)
    }

    /// Columns rounded up to [`COL_GROUP`]: the length of one quantised activation row.
    pub fn padded_cols(&self) -> usize {
        padded_cols(self.cols)
    }

    /// Bytes the kernels stream for this matrix: packed values, scales and row sums.
    pub fn streamed_bytes(&self) -> usize {
        self.packed.len() + 4 * self.scales.len() + 4 * self.row_sums.len()
    }

    /// The quantised value at `(r, c)`, `r < rows`, `c < cols`.
    pub fn get(&self, r: usize, c: usize) -> i8 {
        self.packed[packed_index(r, c, self.cols)]
    }

    /// The row-major `[rows, cols]` f32 values `q[r][c] as f32 · scales[r]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            out.extend((0..self.cols).map(|c| f32::from(self.get(r, c)) * self.scales[r]));
        }
        out
    }

    /// Panics unless the slice lengths match the shape and `cols <= MAX_COLS`: the cheap check
    /// the kernels make on every call (memory safety needs no more than this).
    pub(super) fn assert_shape(&self) {
        if let Err(e) = self.check_shape() {
            panic!("{e}");
        }
    }

    fn check_shape(&self) -> Result<(), MatrixError> {
        if self.cols > MAX_COLS {
            return Err(MatrixError::TooWide(self.cols));
        }
        let pr = padded_rows(self.rows);
        let lengths = [
            ("packed", self.packed.len(), pr * padded_cols(self.cols)),
            ("scales", self.scales.len(), pr),
            ("row_sums", self.row_sums.len(), pr),
        ];
        for (what, got, want) in lengths {
            if got != want {
                return Err(MatrixError::Length {
                    rows: self.rows,
                    cols: self.cols,
                    what,
                    got,
                    want,
                });
            }
        }
        Ok(())
    }

    /// Checks every invariant: lengths, `cols <= MAX_COLS`, zero padding (bytes, scales, row
    /// sums) and each stored row sum against the packed bytes. The SIMD kernels rely on the
    /// last two for results equal to the scalar reference; a container reader can run this
    /// once per matrix it loads. Reads every byte, so keep it off the hot path.
    pub fn verify(&self) -> Result<(), MatrixError> {
        self.check_shape()?;
        let pc = padded_cols(self.cols);
        for r in 0..padded_rows(self.rows) {
            let mut sum = 0i32;
            for c in 0..pc {
                let v = self.packed[packed_index(r, c, self.cols)];
                if (r >= self.rows || c >= self.cols) && v != 0 {
                    return Err(MatrixError::Padding { row: r });
                }
                sum += i32::from(v);
            }
            if r >= self.rows && (self.scales[r] != 0.0 || self.row_sums[r] != 0) {
                return Err(MatrixError::Padding { row: r });
            }
            if sum != self.row_sums[r] {
                return Err(MatrixError::RowSum {
                    row: r,
                    stored: self.row_sums[r],
                    actual: sum,
                });
            }
        }
        Ok(())
    }
}
