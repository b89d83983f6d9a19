//! GGUF tensor data to f32, one ggml type at a time, as ggml's reference `dequantize_row_*`
//! computes it (the same f32 operations in the same order, so the values are bit-identical to
//! ggml's and to the PyPI `gguf` package's): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q4_K, Q5_K, Q6_K. Other types are refused by name.

use super::GgmlType;
use crate::kernels::kquant::{self, KQuantKind, QK_K};
use half::{bf16, f16};

/// The types [`dequantize`] reads.
pub const DEQUANTIZED: &[&str] = &[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
];

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Dequantizes `data` (whole blocks of `ty`) into `out` (`data.len() / block_bytes × block`
/// values).
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), String> {
    if !DEQUANTIZED.contains(&ty.name) {
        return Err(format!(
            "ggml type {} cannot be dequantized (supported: {})",
            ty.name,
            DEQUANTIZED.join(", ")
        ));
    }
    let bb = ty.block_bytes as usize;
    let n = ty.block as usize;
    if !data.len().is_multiple_of(bb) || out.len() != data.len() / bb * n {
        return Err(format!(
            "{} bytes of {} do not make {} values",
            data.len(),
            ty.name,
            out.len()
        ));
    }
    for (b, y) in data.chunks_exact(bb).zip(out.chunks_exact_mut(n)) {
        match ty.name {
            "F32" => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            "F16" => y[0] = h(b, 0),
            "BF16" => y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            "Q8_0" => {
                let d = h(b, 0);
                for (y, &q) in y.iter_mut().zip(&b[2..34]) {
                    *y = f32::from(q as i8) * d;
                }
            }
            "Q4_0" | "Q4_1" => {
                let d = h(b, 0);
                let (m, qs) = if ty.name == "Q4_1" {
                    (h(b, 2), &b[4..20])
                } else {
                    (0.0, &b[2..18])
                };
                for (j, &q) in qs.iter().enumerate() {
                    let (lo, hi) = (i32::from(q & 0x0f), i32::from(q >> 4));
                    if ty.name == "Q4_1" {
                        y[j] = lo as f32 * d + m;
                        y[j + 16] = hi as f32 * d + m;
                    } else {
                        y[j] = (lo - 8) as f32 * d;
                        y[j + 16] = (hi - 8) as f32 * d;
                    }
                }
            }
            "Q5_0" | "Q5_1" => {
                let one = ty.name == "Q5_1";
                let d = h(b, 0);
                let (m, at) = if one { (h(b, 2), 4) } else { (0.0, 2) };
                let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                for (j, &q) in b[at + 4..at + 20].iter().enumerate() {
                    let xh0 = ((qh >> j) << 4) & 0x10;
                    let xh1 = (qh >> (j + 12)) & 0x10;
                    let x0 = (u32::from(q & 0x0f) | xh0) as i32;
                    let x1 = (u32::from(q >> 4) | xh1) as i32;
                    if one {
                        y[j] = x0 as f32 * d + m;
                        y[j + 16] = x1 as f32 * d + m;
                    } else {
                        y[j] = (x0 - 16) as f32 * d;
                        y[j + 16] = (x1 - 16) as f32 * d;
                    }
                }
            }
            "Q4_K" => kquant::dequantize_row(KQuantKind::Q4K, b, QK_K, y),
            "Q6_K" => kquant::dequantize_row(KQuantKind::Q6K, b, QK_K, y),
            "Q5_K" => dequantize_q5k(b, y),
            _ => unreachable!("listed in DEQUANTIZED"),
        }
    }
    Ok(())
}

/// A Q4_K/Q5_K sub-block's 6-bit scale and min (ggml's `get_scale_min_k4`).
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// One Q5_K block: `d`, `dmin` (f16), 12 bytes of scales and mins, 32 of high bits, 128 of
/// nibbles.
fn dequantize_q5k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (h(b, 0), h(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let mut ql = &b[48..176];
    let (mut u1, mut u2) = (1u8, 2u8);
    for (chunk, is) in y.chunks_exact_mut(64).zip((0..8).step_by(2)) {
        let (sc, m) = scale_min(is, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        let (sc, m) = scale_min(is + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        for l in 0..32 {
            let hi = if qh[l] & u1 != 0 { 16 } else { 0 };
            chunk[l] = d1 * f32::from((ql[l] & 0x0f) + hi) - m1;
        }
        for l in 0..32 {
            let hi = if qh[l] & u2 != 0 { 16 } else { 0 };
            chunk[32 + l] = d2 * f32::from((ql[l] >> 4) + hi) - m2;
        }
        ql = &ql[32..];
        u1 <<= 2;
        u2 <<= 2;
    }
}
