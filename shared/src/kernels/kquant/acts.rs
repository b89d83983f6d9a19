//! The activation side of the k-quant kernels: rows quantised to signed int8 with one f32 scale
//! per row (the int8 kernels' formula, `int8::quant`), zero-padded to a multiple of 256, with
//! one i32 sum per 16 values so the kernels can apply Q4_K mins and the Q6_K offset per
//! sub-block without touching the values again.

use super::{SUM_GROUP, padded_k};
use crate::kernels::int8::{quantize_value, row_params};

/// Quantised activations borrowed: `n` rows of `padded_k(cols)` values.
#[derive(Debug, Clone, Copy)]
pub struct KActsRef<'a> {
    /// Values, `n · padded_k(cols)`, zero past `cols` in each row.
    pub q: &'a [i8],
    /// `sums[t·(pk/16) + g] = Σ q[t·pk + 16g .. 16g + 16]`.
    pub sums: &'a [i32],
    /// One scale per row: value `c` of row `t` is `q[t][c] · scales[t]`.
    pub scales: &'a [f32],
}

impl KActsRef<'_> {
    /// Panics unless this holds `n` rows for a matrix of `cols` columns.
    pub(crate) fn assert_shape(&self, n: usize, cols: usize) {
        let pk = padded_k(cols);
        assert_eq!(
            Some(self.q.len()),
            n.checked_mul(pk),
            "kquant: activation length != n ({n}) · padded cols ({pk})"
        );
        assert_eq!(
            self.sums.len(),
            n * (pk / SUM_GROUP),
            "kquant: activation sums length != n ({n}) · {}",
            pk / SUM_GROUP
        );
        assert_eq!(
            self.scales.len(),
            n,
            "kquant: activation scales length != n ({n})"
        );
    }

    /// Row `t`'s values, sums and scale.
    #[inline]
    pub(crate) fn row(&self, t: usize, pk: usize) -> (&[i8], &[i32], f32) {
        (
            &self.q[t * pk..][..pk],
            &self.sums[t * (pk / SUM_GROUP)..][..pk / SUM_GROUP],
            self.scales[t],
        )
    }
}

/// Owned quantised activations, reusable across calls (grows, never shrinks).
#[derive(Debug, Default, Clone)]
pub struct KActs {
    q: Vec<i8>,
    sums: Vec<i32>,
    scales: Vec<f32>,
}

impl KActs {
    /// Quantises `n` rows of `cols` values and borrows the result.
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) -> KActsRef<'_> {
        let pk = padded_k(cols);
        fn take<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
            if v.len() < len {
                v.resize(len, T::default());
            }
            &mut v[..len]
        }
        let q = take(&mut self.q, n * pk);
        let sums = take(&mut self.sums, n * (pk / SUM_GROUP));
        let scales = take(&mut self.scales, n);
        quantize_activations_k(x, n, cols, q, sums, scales);
        KActsRef {
            q: &self.q[..n * pk],
            sums: &self.sums[..n * (pk / SUM_GROUP)],
            scales: &self.scales[..n],
        }
    }
}

/// Quantises `n` rows of `cols` f32 each, per row, with the int8 kernels' symmetric formula:
/// `q_out` gets `n · padded_k(cols)` values (zero padding), `sums_out` one sum per 16 values,
/// `scales_out` one scale per row. Allocation-free.
///
/// # Panics
///
/// Panics if the slices' lengths do not match `n` and `cols`.
pub fn quantize_activations_k(
    x: &[f32],
    n: usize,
    cols: usize,
    q_out: &mut [i8],
    sums_out: &mut [i32],
    scales_out: &mut [f32],
) {
    let pk = padded_k(cols);
    assert_eq!(
        x.len(),
        n * cols,
        "kquant: activation length != n ({n}) · cols ({cols})"
    );
    assert_eq!(q_out.len(), n * pk, "kquant: quantised length != n · {pk}");
    assert_eq!(
        sums_out.len(),
        n * (pk / SUM_GROUP),
        "kquant: sums length != n · {}",
        pk / SUM_GROUP
    );
    assert_eq!(scales_out.len(), n, "kquant: scales length != n ({n})");
    if pk == 0 {
        scales_out.fill(0.0);
        return;
    }
    for t in 0..n {
        let row = &x[t * cols..][..cols];
        let q_row = &mut q_out[t * pk..][..pk];
        let (inv, s) = row_params(row);
        for (qv, &v) in q_row.iter_mut().zip(row) {
            *qv = quantize_value(v, inv);
        }
        q_row[cols..].fill(0);
        for (sum, group) in sums_out[t * (pk / SUM_GROUP)..][..pk / SUM_GROUP]
            .iter_mut()
            .zip(q_row.chunks_exact(SUM_GROUP))
        {
            *sum = group.iter().map(|&v| i32::from(v)).sum();
        }
        scales_out[t] = s;
    }
}
