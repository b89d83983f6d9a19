//! Counter-based pseudo-random weight values: element `i` of a tensor is a pure function of
//! (seed, tensor name, i), so the bytes do not depend on generation order or chunking.
//!
//! Every value is rounded to bf16 (round-to-nearest-even) before it is stored, also in the F32
//! tensors, so a loader that rounds `A_log` or the DeltaNet norm to bf16 loses nothing.

use half::bf16;
use rayon::prelude::*;
use safetensors::Dtype;

/// Elements one parallel task fills (a task's output is at most 256 KiB).
const TASK_ELEMS: usize = 1 << 16;
const SQRT_3: f32 = 1.732_050_8;

use shared::splitmix::GOLDEN_GAMMA as GOLDEN;
pub use shared::splitmix::mix64;

/// The stream key of one tensor: FNV-1a of its name, mixed with the seed.
pub fn tensor_key(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(mix64(seed ^ 0x5851_F42D_4C95_7F2D) ^ h)
}

/// 64 random bits for element `i` of the stream `key` (SplitMix64 at counter `i`).
fn bits(key: u64, i: u64) -> u64 {
    mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A uniform value in (0, 1) from the top 24 bits.
fn unit(b: u64) -> f32 {
    ((b >> 40) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Bell-shaped with mean 0 and standard deviation `std` (Irwin–Hall sum of four uniforms,
    /// bounded at ±3.46 std). Elements at flat index ≥ `live` are multiplied by `pad_scale`
    /// (the padding rows of the embedding and of `lm_head`).
    Normal {
        /// Standard deviation.
        std: f32,
        /// Elements before the padding rows (`u64::MAX`: no padding).
        live: u64,
        /// Scale of the padding elements.
        pad_scale: f32,
    },
    /// Uniform in `[lo, hi)`.
    Uniform {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
    },
    /// `ln(u)` with `u` uniform in `[lo, hi)` (the DeltaNet `A_log`).
    LnUniform {
        /// Lower bound of `u`.
        lo: f32,
        /// Upper bound of `u`.
        hi: f32,
    },
    /// `softplus⁻¹(dt)` with `dt` log-uniform in `[lo, hi)` (Mamba-style `dt_bias`).
    DtBias {
        /// Smallest `dt`.
        lo: f32,
        /// Largest `dt`.
        hi: f32,
    },
}

impl Init {
    /// A bell-shaped init without padding rows.
    pub fn normal(std: f32) -> Init {
        Init::Normal {
            std,
            live: u64::MAX,
            pad_scale: 1.0,
        }
    }

    /// Element `i` of the stream `key`, before rounding.
    pub fn value(&self, key: u64, i: u64) -> f32 {
        let b = bits(key, i);
        match *self {
            Init::Normal {
                std,
                live,
                pad_scale,
            } => {
                let s = (b & 0xFFFF) + ((b >> 16) & 0xFFFF) + ((b >> 32) & 0xFFFF) + (b >> 48);
                // Sum of four uniforms (x + 0.5) / 65536: mean 2, variance 1/3.
                let z = ((s as f32 + 2.0) * (1.0 / 65_536.0) - 2.0) * SQRT_3;
                if i < live {
                    z * std
                } else {
                    z * std * pad_scale
                }
            }
            Init::Uniform { lo, hi } => lo + (hi - lo) * unit(b),
            Init::LnUniform { lo, hi } => (lo + (hi - lo) * unit(b)).ln(),
            Init::DtBias { lo, hi } => {
                let dt = (lo.ln() + (hi.ln() - lo.ln()) * unit(b)).exp();
                dt.exp_m1().ln()
            }
        }
    }

    /// Element `i` rounded to bf16.
    pub fn value_bf16(&self, key: u64, i: u64) -> bf16 {
        bf16::from_f32(self.value(key, i))
    }
}

/// Bytes per element of the dtypes the writer produces.
pub fn elem_bytes(dtype: Dtype) -> usize {
    dtype.bitsize() / 8
}

/// Fills `out` with the little-endian bytes of elements `first..first + out.len() / size` of
/// the stream (`size` = bytes per element of `dtype`, BF16 or F32), in parallel.
pub fn fill(init: &Init, key: u64, dtype: Dtype, first: u64, out: &mut [u8]) {
    let size = elem_bytes(dtype);
    debug_assert_eq!(out.len() % size, 0);
    out.par_chunks_mut(TASK_ELEMS * size)
        .enumerate()
        .for_each(|(task, chunk)| {
            let base = first + (task * TASK_ELEMS) as u64;
            if dtype == Dtype::F32 {
                for (j, dst) in chunk.chunks_exact_mut(4).enumerate() {
                    dst.copy_from_slice(
                        &init.value_bf16(key, base + j as u64).to_f32().to_le_bytes(),
                    );
                }
            } else {
                for (j, dst) in chunk.chunks_exact_mut(2).enumerate() {
                    dst.copy_from_slice(
                        &init
                            .value_bf16(key, base + j as u64)
                            .to_bits()
                            .to_le_bytes(),
                    );
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(init: &Init, n: u64) -> (f64, f64, f32, f32) {
        let key = tensor_key(7, "t");
        let vals: Vec<f32> = (0..n).map(|i| init.value_bf16(key, i).to_f32()).collect();
        let mean = vals.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = vals
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        let min = vals.iter().copied().fold(f32::INFINITY, f32::min);
        let max = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        (mean, var.sqrt(), min, max)
    }

    #[test]
    fn normal_has_the_requested_moments() {
        let (mean, std, min, max) = stats(&Init::normal(0.5), 200_000);
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((std - 0.5).abs() < 0.01, "{std}");
        assert!(min >= -0.5 * 3.47 && max <= 0.5 * 3.47, "{min} {max}");
    }

    #[test]
    fn padding_elements_are_scaled() {
        let init = Init::Normal {
            std: 1.0,
            live: 100,
            pad_scale: 0.01,
        };
        let key = tensor_key(1, "emb");
        for i in 100..1000 {
            assert!(init.value(key, i).abs() <= 0.0347);
        }
    }

    #[test]
    fn special_inits_stay_in_range() {
        let (_, _, min, max) = stats(&Init::LnUniform { lo: 1.0, hi: 16.0 }, 10_000);
        assert!(min >= -0.01 && max <= 16f32.ln() + 0.02, "{min} {max}");
        let (_, _, min, max) = stats(&Init::DtBias { lo: 1e-3, hi: 1e-1 }, 10_000);
        // softplus⁻¹(1e-3) ≈ −6.91, softplus⁻¹(0.1) ≈ −2.25.
        assert!(min >= -6.95 && max <= -2.2, "{min} {max}");
        let (_, _, min, max) = stats(&Init::Uniform { lo: -0.2, hi: 0.2 }, 10_000);
        // bf16 rounding may land one step outside the bounds.
        assert!(min >= -0.201 && max <= 0.201, "{min} {max}");
    }

    #[test]
    fn fill_is_independent_of_chunking_and_exact_in_bf16() {
        let init = Init::normal(1.0);
        let key = tensor_key(3, "w");
        let n = 3 * TASK_ELEMS + 17;
        let mut whole = vec![0u8; n * 4];
        fill(&init, key, Dtype::F32, 0, &mut whole);
        let mut pieces = vec![0u8; n * 4];
        let split = 12_345;
        fill(&init, key, Dtype::F32, 0, &mut pieces[..split * 4]);
        fill(
            &init,
            key,
            Dtype::F32,
            split as u64,
            &mut pieces[split * 4..],
        );
        assert_eq!(whole, pieces);
        for c in whole.chunks_exact(4) {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            assert_eq!(
                bf16::from_f32(v).to_f32(),
                v,
                "F32 values are exactly representable in bf16"
            );
        }
        let mut b = vec![0u8; 64];
        fill(&init, key, Dtype::BF16, 5, &mut b);
        for (j, c) in b.chunks_exact(2).enumerate() {
            assert_eq!(
                u16::from_le_bytes([c[0], c[1]]),
                init.value_bf16(key, 5 + j as u64).to_bits()
            );
        }
    }

    #[test]
    fn keys_differ_by_seed_and_name() {
        assert_ne!(tensor_key(0, "a"), tensor_key(1, "a"));
        assert_ne!(tensor_key(0, "a"), tensor_key(0, "b"));
        assert_eq!(tensor_key(5, "layers.1.x"), tensor_key(5, "layers.1.x"));
    }
}
