//! Activation quantizers: an f32 row to the Q8_0 / Q8_1 / Q8_K blocks the dot kernels read.
//!
//! The scalar functions are ggml's reference quantizers (`quantize_row_q8_0_ref`, `quantize_row_q8_1_ref`,
//! `quantize_row_q8_K_ref`) written out; the x86 versions compute the same IEEE operations in the same order
//! per element (max, one division, one multiply, the same rounding rule), so their output is bit-identical for
//! finite inputs. Invariant: the caller ([`super::quantize_activation_isa`]) has checked the type, the ISA and
//! that `out` is exactly the row.

use super::Isa;
use crate::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1, QK, QK_K};
use crate::GgmlType;
use half::f16;
use std::mem::size_of;

pub(crate) fn quantize(ty: GgmlType, isa: Isa, x: &[f32], out: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::Q8_0 => {
            let bs = size_of::<BlockQ8_0>();
            for (o, xb) in out.chunks_exact_mut(bs).zip(x.chunks_exact(QK)) {
                let b = q8_0_block(isa, xb);
                o.copy_from_slice(bytemuck::bytes_of(&b));
            }
        }
        GgmlType::Q8_1 => {
            let bs = size_of::<BlockQ8_1>();
            for (o, xb) in out.chunks_exact_mut(bs).zip(x.chunks_exact(QK)) {
                let (b, sum) = q8_0_block_sum(isa, xb);
                let d = block_d(xb);
                let q = BlockQ8_1 {
                    d: b.d,
                    // ggml: s = fp16(sum * d) with the f32 d, not the rounded f16 one.
                    s: f16::from_f32(sum as f32 * d),
                    qs: b.qs,
                };
                o.copy_from_slice(bytemuck::bytes_of(&q));
            }
        }
        GgmlType::Q8_K => {
            let bs = size_of::<BlockQ8K>();
            for (o, xb) in out.chunks_exact_mut(bs).zip(x.chunks_exact(QK_K)) {
                let b = q8_k_block(isa, xb);
                o.copy_from_slice(bytemuck::bytes_of(&b));
            }
        }
        // The caller admits only the four activation formats.
        _ => unreachable!("quantize_activation_isa checked the activation type"),
    }
}

/// The f32 scale of a Q8_0/Q8_1 block: amax / 127.
fn block_d(x: &[f32]) -> f32 {
    let amax = x
        .iter()
        .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    amax / 127.0
}

fn q8_0_block(isa: Isa, x: &[f32]) -> BlockQ8_0 {
    q8_0_block_sum(isa, x).0
}

/// A Q8_0 block and the sum of its quants (for Q8_1).
fn q8_0_block_sum(isa: Isa, x: &[f32]) -> (BlockQ8_0, i32) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: the caller checked that `isa` is available, and every SIMD ISA includes AVX2.
        return unsafe { x86::q8_0_block(x) };
    }
    let _ = isa;
    q8_0_block_ref(x)
}

/// ggml's `quantize_row_q8_0_ref` for one block, plus the quant sum `quantize_row_q8_1_ref` needs.
pub(crate) fn q8_0_block_ref(x: &[f32]) -> (BlockQ8_0, i32) {
    let d = block_d(x);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        // f32::round rounds half away from zero, like C's roundf.
        *q = (v * id).round() as i8;
        sum += *q as i32;
    }
    (
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs,
        },
        sum,
    )
}

fn q8_k_block(isa: Isa, x: &[f32]) -> BlockQ8K {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: the caller checked that `isa` is available, and every SIMD ISA includes AVX2.
        return unsafe { x86::q8_k_block(x) };
    }
    let _ = isa;
    q8_k_block_ref(x)
}

/// The element of largest magnitude, the first one on ties (ggml keeps the sign: the scale is -127/max).
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// ggml's `quantize_row_q8_K_ref` for one super-block (bsums zeroed for an all-zero block too).
pub(crate) fn q8_k_block_ref(x: &[f32]) -> BlockQ8K {
    let mut b = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
    let (amax, max) = signed_max(x);
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, v) in b.qs.iter_mut().zip(x) {
        // ggml's nearest_int rounds half to even (it adds 1.5 * 2^23).
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = g.iter().map(|&q| q as i16).sum();
    }
    b.d = 1.0 / iscale;
    b
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Rounds half away from zero (C's roundf), exactly: trunc, then step away when the dropped part is >= 0.5.
    #[inline(always)]
    unsafe fn round_away(v: __m256) -> __m256 {
        let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        let frac = _mm256_sub_ps(v, t);
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let big = _mm256_cmp_ps(
            _mm256_and_ps(frac, abs_mask),
            _mm256_set1_ps(0.5),
            _CMP_GE_OQ,
        );
        let one = _mm256_or_ps(_mm256_andnot_ps(abs_mask, v), _mm256_set1_ps(1.0));
        _mm256_add_ps(t, _mm256_and_ps(big, one))
    }

    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        _mm_cvtss_f32(m)
    }

    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// Packs 32 i32 (4 vectors, in order) to 32 i8 with signed saturation, in order.
    #[inline(always)]
    unsafe fn pack32(i0: __m256i, i1: __m256i, i2: __m256i, i3: __m256i) -> __m256i {
        let a = _mm256_packs_epi32(i0, i1);
        let b = _mm256_packs_epi32(i2, i3);
        let p = _mm256_packs_epi16(a, b);
        // packs works per 128-bit lane: the dwords come out in the order 0,2,4,6,1,3,5,7 of the wanted one.
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q8_0_block(x: &[f32]) -> (BlockQ8_0, i32) {
        debug_assert_eq!(x.len(), QK);
        let p = x.as_ptr();
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let m01 = _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask));
        let m23 = _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask));
        let amax = hmax(_mm256_max_ps(m01, m23));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        // Explicit, not `array::map`: closures run through core's generic code lose the target features.
        let quant = |v: __m256| _mm256_cvtps_epi32(round_away(_mm256_mul_ps(v, idv)));
        let q = [quant(v[0]), quant(v[1]), quant(v[2]), quant(v[3])];
        let sum = hsum_i32(_mm256_add_epi32(
            _mm256_add_epi32(q[0], q[1]),
            _mm256_add_epi32(q[2], q[3]),
        ));
        let mut b = BlockQ8_0 {
            d: f16::from_f32(d),
            qs: [0; QK],
        };
        _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), pack32(q[0], q[1], q[2], q[3]));
        (b, sum)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q8_k_block(x: &[f32]) -> BlockQ8K {
        debug_assert_eq!(x.len(), QK_K);
        let p = x.as_ptr();
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut m = _mm256_setzero_ps();
        for i in 0..QK_K / 8 {
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(p.add(8 * i)), abs_mask));
        }
        let amax = hmax(m);
        let mut b = BlockQ8K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        };
        if amax == 0.0 {
            return b;
        }
        // The first element whose magnitude is the maximum carries the sign, as in the reference's strict `>` scan.
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let isv = _mm256_set1_ps(iscale);
        for g in 0..QK_K / 32 {
            let quant = |k: usize| {
                let v = _mm256_loadu_ps(p.add(32 * g + 8 * k));
                // cvtps rounds half to even under the default MXCSR, like ggml's nearest_int.
                _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(isv, v)),
                    _mm256_set1_epi32(127),
                )
            };
            // Explicit, not `array::from_fn` (see `q8_0_block`).
            let q = [quant(0), quant(1), quant(2), quant(3)];
            b.bsums[2 * g] = hsum_i32(_mm256_add_epi32(q[0], q[1])) as i16;
            b.bsums[2 * g + 1] = hsum_i32(_mm256_add_epi32(q[2], q[3])) as i16;
            _mm256_storeu_si256(
                b.qs.as_mut_ptr().add(32 * g).cast(),
                pack32(q[0], q[1], q[2], q[3]),
            );
        }
        b.d = 1.0 / iscale;
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_ref_rounds_half_away_and_keeps_scale() {
        // amax 127 gives d = 1, id = 1: quants are roundf of the inputs.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.49999997;
        let (b, sum) = q8_0_block_ref(&x);
        assert_eq!(b.d.to_f32(), 1.0);
        assert_eq!(&b.qs[..4], &[127, 3, -3, 0]);
        assert_eq!(sum, 127);
    }

    #[test]
    fn q8_k_ref_uses_signed_max_and_ties_to_even() {
        let mut x = [0.0f32; QK_K];
        x[5] = -127.0; // first of the two largest magnitudes: its sign wins, iscale = 1
        x[6] = 127.0;
        x[7] = 2.5;
        x[8] = -3.5;
        let b = q8_k_block_ref(&x);
        assert_eq!(b.d, 1.0);
        assert_eq!(&b.qs[5..9], &[-127, 127, 2, -4]);
        assert_eq!(b.bsums[0], -2);
        let zero = q8_k_block_ref(&[0.0; QK_K]);
        assert_eq!(zero.d, 0.0);
        assert!(zero.qs.iter().all(|&q| q == 0));
    }
}
