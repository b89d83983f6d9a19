//! The activation side of the k-quant kernels: rows quantised to signed int8 with one f32 scale
//! per row (the int8 kernels' formula, `int8::quant`), zero-padded to a multiple of 256, with
//! one i32 sum per 16 values and one i16 sum per 32, so the kernels can apply Q4_K mins and the
//! Q6_K offset per sub-block without touching the values again.

use super::{SUM_GROUP, padded_k};

/// Activation values per sum in [`KActsRef::sums32`] (the Q4_K sub-block).
pub const SUM32_GROUP: usize = 32;
use crate::kernels::int8::{quantize_value, row_params};

/// Quantised activations borrowed: `n` rows of `padded_k(cols)` values.
#[derive(Debug, Clone, Copy)]
pub struct KActsRef<'a> {
    /// Values, `n · padded_k(cols)`, zero past `cols` in each row.
    pub q: &'a [i8],
    /// `sums[t·(pk/16) + g] = Σ q[t·pk + 16g .. 16g + 16]`.
    pub sums: &'a [i32],
    /// `sums32[t·(pk/32) + j] = Σ q[t·pk + 32j .. 32j + 32]` (|·| ≤ 32 · 128 fits i16): the
    /// Q4_K sub-block sums, which the AVX-512 kernel applies to eight tokens at once.
    pub sums32: &'a [i16],
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
            self.sums32.len(),
            n * (pk / SUM32_GROUP),
            "kquant: activation sums32 length != n ({n}) · {}",
            pk / SUM32_GROUP
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
    sums32: Vec<i16>,
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
        let sums32 = take(&mut self.sums32, n * (pk / SUM32_GROUP));
        let scales = take(&mut self.scales, n);
        quantize_activations_k(x, n, cols, q, sums, sums32, scales);
        KActsRef {
            q: &self.q[..n * pk],
            sums: &self.sums[..n * (pk / SUM_GROUP)],
            sums32: &self.sums32[..n * (pk / SUM32_GROUP)],
            scales: &self.scales[..n],
        }
    }
}

/// Quantises `n` rows of `cols` f32 each, per row, with the int8 kernels' symmetric formula:
/// `q_out` gets `n · padded_k(cols)` values (zero padding), `sums_out` one sum per 16 values,
/// `sums32_out` one per 32, `scales_out` one scale per row. Allocation-free.
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
    sums32_out: &mut [i16],
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
    assert_eq!(
        sums32_out.len(),
        n * (pk / SUM32_GROUP),
        "kquant: sums32 length != n · {}",
        pk / SUM32_GROUP
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
        for (sum, pair) in sums32_out[t * (pk / SUM32_GROUP)..][..pk / SUM32_GROUP]
            .iter_mut()
            .zip(sums_out[t * (pk / SUM_GROUP)..].chunks_exact(2))
        {
            // At most 32 · 128 in magnitude.
            *sum = (pair[0] + pair[1]) as i16;
        }
        scales_out[t] = s;
    }
}
