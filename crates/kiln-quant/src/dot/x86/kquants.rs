//! x86 kernels for the K-quants (Q4_K, Q5_K, Q6_K) against Q8_K activations.
//!
//! Per 256-element super-block: the weight quants are unpacked to unsigned bytes, multiplied with the activation
//! bytes into i16 pairs (`maddubs`: at most 63 × 127 × 2, no saturation), weighted by the sub-block scales into
//! i32 (`madd`, or VNNI's `vpdpwssd` which also adds); the super-block's lanes are then reduced to its exact
//! integer sums and scaled with the scalar reference's f32 operations, so the results are bit-identical to
//! `scalar.rs` and to the tiled kernel (`gemm.rs`), which the engine mixes by batch size.
//! Offsets (Q4_K/Q5_K minimums, Q6_K's -32) are applied through the activation's per-16 sums `bsums`, so the
//! inner loop works on unsigned quants only. The idea of folding the offsets into `bsums` is ggml's.

use super::{dot_kernels, load_f16, load_f32, Simd};
use crate::blocks::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
use crate::GgmlType;
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

const Y_QS: usize = offset_of!(BlockQ8K, qs);
const Y_BSUMS: usize = offset_of!(BlockQ8K, bsums);

/// The 8 scales and 8 minimums of a Q4_K/Q5_K block (12 packed bytes at `p`) as 16 i16: scales, then mins.
#[inline(always)]
pub(super) unsafe fn scales_mins_k4(p: *const u8) -> __m256i {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let mut u = [0u32; 3];
    std::ptr::copy_nonoverlapping(p, u.as_mut_ptr().cast::<u8>(), 12);
    let [u0, u1, u2] = u.map(u32::from_le);
    // Scales 0..4 / mins 0..4 are the low 6 bits of bytes 0..4 / 4..8; scales and mins 4..8 take their low
    // nibbles from bytes 8..12 and their top two bits from the top of bytes 0..4 / 4..8.
    let mins_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let scales_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let v = _mm_set_epi32(
        mins_hi as i32,
        (u1 & KMASK1) as i32,
        scales_hi as i32,
        (u0 & KMASK1) as i32,
    );
    _mm256_cvtepu8_epi16(v)
}

/// A shuffle control that broadcasts i16 element `k` of each 128-bit lane.
#[inline(always)]
unsafe fn bcast16(k: i32) -> __m256i {
    _mm256_set1_epi16((0x0100 + 0x0202 * k) as i16)
}

/// Dot of the minimums with the per-32 activation sums, as 4 i32 lanes to be scaled by -dmin.
#[inline(always)]
unsafe fn mins_dot(scales_mins: __m256i, y: *const u8) -> __m128i {
    let bsums = _mm256_loadu_si256(y.add(Y_BSUMS).cast());
    let per32 = _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256(bsums, 1),
    );
    _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), per32)
}

/// Q4_K (`FIFTH = false`) and Q5_K (`FIFTH = true`, the fifth bits from `qh`) against `R` activation rows.
/// The weights of each 64-element chunk are decoded once and shared by the rows; each row's arithmetic is
/// the same whatever `R` is, so its result is bit-identical alone or in a batch.
#[inline(always)]
unsafe fn q45_k_body<S: Simd, const FIFTH: bool, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    // Q4_K and Q5_K share d, dmin and scales at the same offsets; only qs moves (after qh in Q5_K).
    const _: () = assert!(offset_of!(BlockQ4K, scales) == offset_of!(BlockQ5K, scales));
    const _: () = assert!(offset_of!(BlockQ4K, dmin) == offset_of!(BlockQ5K, dmin));
    const AB: usize = size_of::<BlockQ8K>();
    let (wb, qs_off) = if FIFTH {
        (size_of::<BlockQ5K>(), offset_of!(BlockQ5K, qs))
    } else {
        (size_of::<BlockQ4K>(), offset_of!(BlockQ4K, qs))
    };
    let m4 = _mm256_set1_epi8(0xF);
    let sixteen = _mm256_set1_epi8(16);
    let mut acc = [_mm_setzero_ps(); R];
    for i in 0..n / QK_K {
        let x = w.add(i * wb);
        let xd = load_f16(x.add(offset_of!(BlockQ4K, d)));
        let xdmin = load_f16(x.add(offset_of!(BlockQ4K, dmin)));
        let sm = scales_mins_k4(x.add(offset_of!(BlockQ4K, scales)));
        let scales = _mm256_permute2x128_si256(sm, sm, 0x00);
        let qs = x.add(qs_off);
        let hbits = if FIFTH {
            _mm256_loadu_si256(x.add(offset_of!(BlockQ5K, qh)).cast())
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); R];
        for j in 0..QK_K / 64 {
            let bits = _mm256_loadu_si256(qs.add(32 * j).cast());
            let mut lo = _mm256_and_si256(bits, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if FIFTH {
                // Sub-block s takes its fifth bit from bit s of each qh byte: 16 where set.
                let fifth = |s: usize| {
                    let bit = _mm256_set1_epi8((1u8 << s) as i8);
                    _mm256_and_si256(
                        _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), bit),
                        sixteen,
                    )
                };
                lo = _mm256_or_si256(lo, fifth(2 * j));
                hi = _mm256_or_si256(hi, fifth(2 * j + 1));
            }
            let sc_lo = _mm256_shuffle_epi8(scales, bcast16(2 * j as i32));
            let sc_hi = _mm256_shuffle_epi8(scales, bcast16(2 * j as i32 + 1));
            for r in 0..R {
                let y = a[r].add(i * AB + Y_QS + 64 * j);
                let ylo = _mm256_loadu_si256(y.cast());
                let yhi = _mm256_loadu_si256(y.add(32).cast());
                sumi[r] = S::madd_acc(sumi[r], sc_lo, _mm256_maddubs_epi16(lo, ylo));
                sumi[r] = S::madd_acc(sumi[r], sc_hi, _mm256_maddubs_epi16(hi, yhi));
            }
        }
        let dd = _mm_set_ps(0.0, 0.0, xdmin, xd);
        for r in 0..R {
            let y = a[r].add(i * AB);
            // Exact block sums [isum, msum, ..] (integers: the lane order of the adds cannot matter), then the
            // reference's f32 steps: sum += (d·yd)·isum − (dmin·yd)·msum.
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(sumi[r]),
                _mm256_extracti128_si256(sumi[r], 1),
            );
            let h = _mm_hadd_epi32(s4, mins_dot(sm, y));
            let f = _mm_cvtepi32_ps(_mm_hadd_epi32(h, h));
            let t = _mm_mul_ps(_mm_mul_ps(dd, _mm_set1_ps(load_f32(y))), f);
            acc[r] = _mm_add_ss(acc[r], _mm_sub_ss(t, _mm_movehdup_ps(t)));
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = _mm_cvtss_f32(acc[r]);
    }
    out
}

#[inline(always)]
unsafe fn q4_k_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    q45_k_body::<S, false, R>(n, w, a)
}
dot_kernels!(GgmlType::Q4_K, GgmlType::Q8_K, q4_k_body, q4_k);

#[inline(always)]
unsafe fn q5_k_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    q45_k_body::<S, true, R>(n, w, a)
}
dot_kernels!(GgmlType::Q5_K, GgmlType::Q8_K, q5_k_body, q5_k);

/// Q6_K against `R` activation rows, weights decoded once per 128-element half (see [`q45_k_body`]).
#[inline(always)]
unsafe fn q6_k_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    const WB: usize = size_of::<BlockQ6K>();
    const AB: usize = size_of::<BlockQ8K>();
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    let mut acc = [_mm_setzero_ps(); R];
    for i in 0..n / QK_K {
        let x = w.add(i * WB);
        let xd = load_f16(x.add(offset_of!(BlockQ6K, d)));
        let sc8 = _mm_loadu_si128(x.add(offset_of!(BlockQ6K, scales)).cast());
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let ql = x.add(offset_of!(BlockQ6K, ql));
        let qh = x.add(offset_of!(BlockQ6K, qh));
        let mut sumi = [_mm256_setzero_si256(); R];
        for h in 0..QK_K / 128 {
            let l0 = _mm256_loadu_si256(ql.add(64 * h).cast());
            let l1 = _mm256_loadu_si256(ql.add(64 * h + 32).cast());
            let hb = _mm256_loadu_si256(qh.add(32 * h).cast());
            // Element 128h + 32k + l: low nibble of l0/l1 (k = 0, 1) or high nibble (k = 2, 3),
            // top bits from hb >> 2k.
            let top = |k: i32| {
                let t = _mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k));
                _mm256_slli_epi16(_mm256_and_si256(t, m2), 4)
            };
            let q = [
                _mm256_or_si256(_mm256_and_si256(l0, m4), top(0)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), top(1)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), top(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), top(3)),
            ];
            for (k, q) in q.into_iter().enumerate() {
                // 32 elements span sub-blocks s and s+1: their scales in the low and high 128-bit lanes.
                let s = (8 * h + 2 * k) as i64;
                let ctrl =
                    _mm_set_epi64x((s + 1) * 0x0101_0101_0101_0101, s * 0x0101_0101_0101_0101);
                let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, ctrl));
                for r in 0..R {
                    let yq = _mm256_loadu_si256(a[r].add(i * AB + Y_QS + 128 * h + 32 * k).cast());
                    sumi[r] = S::madd_acc(sumi[r], sc, _mm256_maddubs_epi16(q, yq));
                }
            }
        }
        for r in 0..R {
            let y = a[r].add(i * AB);
            // Quants are stored +32: subtract 32 · Σ scale · bsum once per super-block.
            let bsums = _mm256_loadu_si256(y.add(Y_BSUMS).cast());
            let offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
            let s = _mm256_sub_epi32(sumi[r], offset);
            // The exact block sum, then the reference's f32 steps: sum += (d·yd)·isum.
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let h = _mm_hadd_epi32(s4, s4);
            let isum = _mm_cvtepi32_ps(_mm_hadd_epi32(h, h));
            let t = _mm_mul_ss(_mm_set_ss(xd * load_f32(y)), isum);
            acc[r] = _mm_add_ss(acc[r], t);
        }
    }
    let mut out = [0.0f32; R];
    for r in 0..R {
        out[r] = _mm_cvtss_f32(acc[r]);
    }
    out
}
dot_kernels!(GgmlType::Q6_K, GgmlType::Q8_K, q6_k_body, q6_k);
