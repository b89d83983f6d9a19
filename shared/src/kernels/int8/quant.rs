//! Symmetric per-row int8 quantisation of weights and activations, defined once.
//!
//! Owns the quantisation formula; every caller (weights at conversion time, activations in the
//! expert's hot path) goes through [`row_params`] and [`quantize_value`], so weights and
//! activations round identically. For a row `w`:
//!
//! - `max_abs = max_c |w[c]|`; if it is `0` the row quantises to all zeros with scale `0.0`;
//! - else `inv = 127.0f32 / max_abs`, `q = (w · inv).round_ties_even().clamp(-127.0, 127.0) as
//!   i8` and `scale = max_abs / 127.0f32`, so `w ≈ q · scale` within `scale / 2` (plus f32
//!   rounding of `inv` and `scale`).
//!
//! Activations are stored unsigned as `q + 128 ∈ [1, 255]` (the `u8` operand of `vpdpbusd`),
//! their padding as `128`, i.e. zero.
//!
//! Rows whose `max_abs` is below `127 / f32::MAX ≈ 3.7e-37` overflow `inv` to infinity and
//! quantise every non-zero element to ±127; real weights and activations are many orders of
//! magnitude larger. Non-finite inputs give unspecified (but memory-safe) values.

use super::pack::{MAX_COLS, QuantizedMatrix, padded_cols};

/// `(inv, scale)` for a row: `inv` multiplies values into the int8 range, `scale` maps them
/// back. `(0.0, 0.0)` for an all-zero row.
pub(crate) fn row_params(row: &[f32]) -> (f32, f32) {
    let max_abs = row.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    if max_abs == 0.0 {
        (0.0, 0.0)
    } else {
        (127.0f32 / max_abs, max_abs / 127.0f32)
    }
}

/// One value: `(v · inv).round_ties_even().clamp(-127.0, 127.0) as i8`, bit for bit.
///
/// Computed as clamp-then-round, with the rounding done by adding and subtracting
/// `1.5 · 2²³`: for `|y| ≤ 127` the sum lies in `[2²³, 2²⁴)`, where the f32 spacing is 1, so
/// the addition rounds `y` to an integer, ties to even (the default rounding mode; the magic
/// number is even), and the subtraction is exact. Clamping first changes nothing since the
/// bounds are integers; NaN stays NaN and casts to 0 either way. This avoids a `rintf` call per
/// element (x86_64's baseline has no `roundss`) and lets the loops vectorise; the test
/// `quantize_value_matches_the_formula` checks it against the formula as written.
#[inline]
pub(crate) fn quantize_value(v: f32, inv: f32) -> i8 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³
    let y = (v * inv).clamp(-127.0, 127.0);
    ((y + ROUND) - ROUND) as i8
}

/// Symmetric per-output-row quantisation of a row-major f32 `[rows, cols]` matrix, then R16C4
/// packing (see the module docs for the formula).
///
/// # Panics
///
/// Panics if `w.len() != rows · cols` or `cols > MAX_COLS`.
pub fn quantize_weights(w: &[f32], rows: usize, cols: usize) -> QuantizedMatrix {
    assert_eq!(
        w.len(),
        rows * cols,
        "int8: weight length != rows ({rows}) · cols ({cols})"
    );
    assert!(
        cols <= MAX_COLS,
        "int8: {cols} columns exceed MAX_COLS ({MAX_COLS})"
    );
    let mut q = vec![0i8; rows * cols];
    let mut scales = vec![0.0f32; rows];
    if cols > 0 {
        for ((row, q_row), scale) in w
            .chunks_exact(cols)
            .zip(q.chunks_exact_mut(cols))
            .zip(&mut scales)
        {
            let (inv, s) = row_params(row);
            for (qv, &v) in q_row.iter_mut().zip(row) {
                *qv = quantize_value(v, inv);
            }
            *scale = s;
        }
    }
    QuantizedMatrix::from_quantized(&q, rows, cols, &scales)
}

/// Quantises `n` row-major activation rows of `cols` f32 each, per row, into `q_out`
/// (`n · padded_cols(cols)` bytes: `q + 128` for real columns, `128` for padding) and
/// `scales_out` (`n` scales). Allocation-free; row `t` dequantises as
/// `(q_out[t][c] as f32 − 128) · scales_out[t]`.
///
/// # Panics
///
/// Panics if `x.len() != n · cols`, `q_out.len() != n · padded_cols(cols)` or
/// `scales_out.len() != n`.
pub fn quantize_activations(
    x: &[f32],
    n: usize,
    cols: usize,
    q_out: &mut [u8],
    scales_out: &mut [f32],
) {
    let pc = padded_cols(cols);
    assert_eq!(
        x.len(),
        n * cols,
        "int8: activation length != n ({n}) · cols ({cols})"
    );
    assert_eq!(
        q_out.len(),
        n * pc,
        "int8: quantised activation length != n ({n}) · padded cols ({pc})"
    );
    assert_eq!(
        scales_out.len(),
        n,
        "int8: activation scales length != n ({n})"
    );
    if pc == 0 {
        scales_out.fill(0.0);
        return;
    }
    for ((t, q_row), scale) in q_out
        .chunks_exact_mut(pc)
        .enumerate()
        .zip(scales_out.iter_mut())
    {
        let row = &x[t * cols..][..cols];
        let (inv, s) = row_params(row);
        for (qv, &v) in q_row.iter_mut().zip(row) {
            *qv = (i16::from(quantize_value(v, inv)) + 128) as u8;
        }
        q_row[cols..].fill(128);
        *scale = s;
    }
}
