//! Scalar reference dot products for every weight type: the semantics of ggml's `ggml_vec_dot_*` reference
//! kernels (an exact integer dot product per (sub-)block, then float scaling per block, summed in block order).
//!
//! These are the specification the SIMD kernels are tested against and the fallback on every CPU; they are
//! never deleted. Blocks are read with unaligned copies, so rows may sit at any address (mmapped files).

use super::{rows, DotFn};
use crate::blocks::*;
use crate::iquants::IQ4_NL_VALUES;
use crate::GgmlType;
use bytemuck::Pod;
use half::{bf16, f16};
use std::mem::size_of;

/// The reference kernel of weight type `w`, or `None` for the activation-only formats.
pub(crate) fn kernel(w: GgmlType) -> Option<DotFn> {
    Some(match w {
        GgmlType::F32 => f32_f32,
        GgmlType::F16 => f16_f32,
        GgmlType::BF16 => bf16_f32,
        GgmlType::Q4_0 => q4_0_q8_0,
        GgmlType::Q4_1 => q4_1_q8_1,
        GgmlType::Q5_0 => q5_0_q8_0,
        GgmlType::Q5_1 => q5_1_q8_1,
        GgmlType::Q8_0 => q8_0_q8_0,
        GgmlType::IQ4_NL => iq4_nl_q8_0,
        GgmlType::Q2_K => q2_k_q8_k,
        GgmlType::Q3_K => q3_k_q8_k,
        GgmlType::Q4_K => q4_k_q8_k,
        GgmlType::Q5_K => q5_k_q8_k,
        GgmlType::Q6_K => q6_k_q8_k,
        GgmlType::IQ2_XXS => iq2_xxs_q8_k,
        GgmlType::Q8_1 | GgmlType::Q8_K => return None,
    })
}

/// Block `i` of a row, copied out (rows need not be aligned).
#[inline(always)]
fn block<T: Pod>(row: &[u8], i: usize) -> T {
    let s = size_of::<T>();
    bytemuck::pod_read_unaligned(&row[i * s..(i + 1) * s])
}

fn f32s(row: &[u8]) -> impl Iterator<Item = f32> + '_ {
    row.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

fn u16s(row: &[u8]) -> impl Iterator<Item = u16> + '_ {
    row.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
}

// Float rows accumulate in f64 like ggml's `ggml_float` reference loops.
fn f32_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::F32, GgmlType::F32, n, w, a);
    f32s(w)
        .zip(f32s(a))
        .map(|(x, y)| (x * y) as f64)
        .sum::<f64>() as f32
}

fn f16_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::F16, GgmlType::F32, n, w, a);
    u16s(w)
        .zip(f32s(a))
        .map(|(x, y)| (f16::from_bits(x).to_f32() * y) as f64)
        .sum::<f64>() as f32
}

fn bf16_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::BF16, GgmlType::F32, n, w, a);
    u16s(w)
        .zip(f32s(a))
        .map(|(x, y)| (bf16::from_bits(x).to_f32() * y) as f64)
        .sum::<f64>() as f32
}

/// Element `j` (0..32) of a legacy block's nibbles: low nibbles are elements 0..16, high nibbles 16..32.
#[inline(always)]
fn nibble(qs: &[u8; QK / 2], j: usize) -> u8 {
    if j < QK / 2 {
        qs[j] & 0xF
    } else {
        qs[j - QK / 2] >> 4
    }
}

/// The fifth bit of element `j` of a Q5_0/Q5_1 block, as 0 or 16.
#[inline(always)]
fn fifth_bit(qh: [u8; 4], j: usize) -> u8 {
    (((u32::from_le_bytes(qh) >> j) & 1) << 4) as u8
}

fn q4_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q4_0, GgmlType::Q8_0, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x: BlockQ4_0 = block(w, i);
        let y: BlockQ8_0 = block(a, i);
        let sumi: i32 = (0..QK)
            .map(|j| (nibble(&x.qs, j) as i32 - 8) * y.qs[j] as i32)
            .sum();
        sum += sumi as f32 * x.d.to_f32() * y.d.to_f32();
    }
    sum
}

fn q4_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q4_1, GgmlType::Q8_1, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x: BlockQ4_1 = block(w, i);
        let y: BlockQ8_1 = block(a, i);
        let sumi: i32 = (0..QK)
            .map(|j| nibble(&x.qs, j) as i32 * y.qs[j] as i32)
            .sum();
        // The minimum meets the activation sum s = d_y * sum(q_y) precomputed in the Q8_1 block.
        sum += (x.d.to_f32() * y.d.to_f32()) * sumi as f32 + x.m.to_f32() * y.s.to_f32();
    }
    sum
}

fn q5_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q5_0, GgmlType::Q8_0, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x: BlockQ5_0 = block(w, i);
        let y: BlockQ8_0 = block(a, i);
        let sumi: i32 = (0..QK)
            .map(|j| ((nibble(&x.qs, j) | fifth_bit(x.qh, j)) as i32 - 16) * y.qs[j] as i32)
            .sum();
        sum += (x.d.to_f32() * y.d.to_f32()) * sumi as f32;
    }
    sum
}

fn q5_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q5_1, GgmlType::Q8_1, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x: BlockQ5_1 = block(w, i);
        let y: BlockQ8_1 = block(a, i);
        let sumi: i32 = (0..QK)
            .map(|j| (nibble(&x.qs, j) | fifth_bit(x.qh, j)) as i32 * y.qs[j] as i32)
            .sum();
        sum += (x.d.to_f32() * y.d.to_f32()) * sumi as f32 + x.m.to_f32() * y.s.to_f32();
    }
    sum
}

fn q8_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q8_0, GgmlType::Q8_0, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x: BlockQ8_0 = block(w, i);
        let y: BlockQ8_0 = block(a, i);
        let sumi: i32 =
            x.qs.iter()
                .zip(&y.qs)
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        sum += sumi as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sum
}

fn iq4_nl_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::IQ4_NL, GgmlType::Q8_0, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let x: BlockIq4Nl = block(w, i);
        let y: BlockQ8_0 = block(a, i);
        let sumi: i32 = (0..QK)
            .map(|j| IQ4_NL_VALUES[nibble(&x.qs, j) as usize] as i32 * y.qs[j] as i32)
            .sum();
        sum += (y.d.to_f32() * x.d.to_f32()) * sumi as f32;
    }
    sum
}

/// Integer dot product of 16 (or 32) weight quants with the activation quants at the same positions.
#[inline(always)]
fn idot(q: impl Iterator<Item = i32>, y: &[i8]) -> i32 {
    q.zip(y).map(|(a, &b)| a * b as i32).sum()
}

fn q2_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q2_K, GgmlType::Q8_K, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let x: BlockQ2K = block(w, i);
        let y: BlockQ8K = block(a, i);
        // Sub-block s (16 elements at 16*s): 128-element half h = s/8, 2-bit plane (s%8)/2, bytes 32h + 16(s%2).
        let (mut isum, mut msum) = (0i32, 0i32);
        for s in 0..QK_K / 16 {
            let (h, shift) = (s / 8, 2 * ((s % 8) / 2));
            let q = &x.qs[32 * h + 16 * (s % 2)..][..16];
            let dot = idot(
                q.iter().map(|&b| ((b >> shift) & 3) as i32),
                &y.qs[16 * s..],
            );
            isum += (x.scales[s] & 0xF) as i32 * dot;
            msum += (x.scales[s] >> 4) as i32 * y.bsums[s] as i32;
        }
        sum += y.d * x.d.to_f32() * isum as f32 - y.d * x.dmin.to_f32() * msum as f32;
    }
    sum
}

/// Q3_K's 16 signed 6-bit scales (stored as 4 low bits in bytes 0..8 and 2 high bits in bytes 8..12).
fn q3_k_scales(packed: &[u8; 12]) -> [i32; 16] {
    std::array::from_fn(|s| {
        let low = if s < 8 {
            packed[s] & 0xF
        } else {
            packed[s - 8] >> 4
        };
        let high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
        (low | (high << 4)) as i32 - 32
    })
}

fn q3_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q3_K, GgmlType::Q8_K, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let x: BlockQ3K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let scales = q3_k_scales(&x.scales);
        let mut isum = 0i32;
        for (s, &scale) in scales.iter().enumerate() {
            // Same plane layout as Q2_K; the high bit of element e sits in hmask bit (e / 32) of byte e % 32.
            let (h, plane) = (s / 8, (s % 8) / 2);
            let off = 16 * (s % 2);
            let q = (0..16).map(|l| {
                let low = ((x.qs[32 * h + off + l] >> (2 * plane)) & 3) as i32;
                let hbit = x.hmask[off + l] >> (4 * h + plane) & 1;
                low - if hbit != 0 { 0 } else { 4 }
            });
            isum += scale * idot(q, &y.qs[16 * s..]);
        }
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    sum
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block: 6 bits each, packed in 12 bytes.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q4_K, GgmlType::Q8_K, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let x: BlockQ4K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let (mut isum, mut msum) = (0i32, 0i32);
        for s in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(s, &x.scales);
            // Sub-blocks 2c and 2c+1 are the low and high nibbles of bytes 32c..32c+32.
            let bytes = &x.qs[32 * (s / 2)..][..32];
            let shift = 4 * (s % 2);
            let dot = idot(
                bytes.iter().map(|&b| ((b >> shift) & 0xF) as i32),
                &y.qs[32 * s..],
            );
            isum += sc as i32 * dot;
            msum += m as i32 * (y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32);
        }
        sum += x.d.to_f32() * y.d * isum as f32 - x.dmin.to_f32() * y.d * msum as f32;
    }
    sum
}

fn q5_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q5_K, GgmlType::Q8_K, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let x: BlockQ5K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let (mut isum, mut msum) = (0i32, 0i32);
        for s in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(s, &x.scales);
            let bytes = &x.qs[32 * (s / 2)..][..32];
            let shift = 4 * (s % 2);
            // The fifth bit of element l of sub-block s is bit s of qh[l].
            let q = bytes
                .iter()
                .zip(&x.qh)
                .map(|(&b, &h)| (((b >> shift) & 0xF) | (((h >> s) & 1) << 4)) as i32);
            isum += sc as i32 * idot(q, &y.qs[32 * s..]);
            msum += m as i32 * (y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32);
        }
        sum += x.d.to_f32() * y.d * isum as f32 - x.dmin.to_f32() * y.d * msum as f32;
    }
    sum
}

fn q6_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = rows(GgmlType::Q6_K, GgmlType::Q8_K, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let x: BlockQ6K = block(w, i);
        let y: BlockQ8K = block(a, i);
        let mut isum = 0i32;
        // Element e = 128h + 32k + l (k = 0..4, l = 0..32): low nibble from ql[64h + 32(k%2) + l]
        // (high nibble for k >= 2), top two bits from qh[32h + l] >> 2k; 16-element sub-block e / 16.
        for s in 0..QK_K / 16 {
            let (h, k, l0) = (s / 8, (s % 8) / 2, 16 * (s % 2));
            let q = (l0..l0 + 16).map(|l| {
                let lo = (x.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
                let hi = (x.qh[32 * h + l] >> (2 * k)) & 3;
                (lo | (hi << 4)) as i32 - 32
            });
            isum += x.scales[s] as i32 * idot(q, &y.qs[16 * s..]);
        }
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    sum
}

fn iq2_xxs_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    use crate::iquants::tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};
    let (w, a) = rows(GgmlType::IQ2_XXS, GgmlType::Q8_K, n, w, a);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let x: BlockIq2Xxs = block(w, i);
        let y: BlockQ8K = block(a, i);
        let mut bsum = 0i32;
        for g in 0..QK_K / 32 {
            // Per 32 elements: four 8-bit grid indices, then 4 × 7 sign bits and a 4-bit scale.
            let idx = x.qs[4 * g] as u32 | (x.qs[4 * g + 1] as u32) << 16;
            let aux = x.qs[4 * g + 2] as u32 | (x.qs[4 * g + 3] as u32) << 16;
            let ls = 2 * (aux >> 28) as i32 + 1;
            let mut sumi = 0i32;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[((idx >> (8 * l)) & 0xFF) as usize].to_le_bytes();
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                for (j, &gv) in grid.iter().enumerate() {
                    let v = gv as i32 * y.qs[32 * g + 8 * l + j] as i32;
                    sumi += if signs & (1 << j) != 0 { -v } else { v };
                }
            }
            bsum += sumi * ls;
        }
        sum += x.d.to_f32() * y.d * bsum as f32;
    }
    // The grid holds values 8 times too large and the scale is 2·ls+1 for a multiplier of (0.5 + ls) / 4.
    0.125 * sum
}
