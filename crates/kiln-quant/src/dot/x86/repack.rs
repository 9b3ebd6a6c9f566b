//! The AVX2 body of the repacked Q4_0/Q4_1/Q8_0 kernel (layout and arithmetic: `dot::repack`).
//!
//! One group of 8 weight rows at a time, each row a 32-bit lane: a block's 4 (or 8) quant vectors are loaded
//! and unpacked once and multiplied with every activation row of the call (up to four), whose 4 quant bytes for
//! the vector are broadcast to all lanes, so each lane accumulates its own row's dot with no horizontal sums.
//! 4-bit quants multiply as stored (0..15, unsigned) through `vpmaddubsw`, summed in i16 over the whole block
//! (8 pair sums of at most 2 · 15 · 128 fit), then widened once; Q4_0's offset of 8 comes off as 8 times the
//! activation block's sum, precomputed with its scales (exact: every value is an integer below 2^24). Q8_0's
//! products are widened per vector (one pair of them already reaches 2 · 128 · 127) and multiply as |w| times
//! the activation with w's sign, as in the row kernels.

use crate::blocks::{BlockQ8_0, BlockQ8_1, QK};
use crate::GgmlType;
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

/// Activation rows one call takes at most, and for each type ([`act_rows`]).
pub(crate) const MAX_ACT: usize = 4;

/// Activation rows one call of `ty` takes: four rows' accumulators fit AVX2's 16 vector registers next to a
/// block's unpacked quants in every format (Q4_1's minimum chains run after the block loop).
pub(crate) fn act_rows(_ty: GgmlType) -> usize {
    MAX_ACT
}

#[inline(always)]
unsafe fn bcast32(p: *const u8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
}

/// Prefetches this block's share (`per` bytes from `p`) of the group after the one being multiplied: decode reads
/// weights from memory, and without this the kernel waited on them (measured: below the row kernels' bandwidth
/// from memory).
#[inline(always)]
unsafe fn prefetch_share(p: *const u8, per: usize) {
    let mut pf = 0;
    while pf < per {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf).cast());
        pf += 64;
    }
}

/// Q8_0: `a`, the activation rows (Q8_0 blocks); `ys`, each row's block scales `d` as f32 (`nb` of them).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_body<const R: usize>(
    nb: usize,
    g: *const u8,
    a: [*const u8; R],
    ys: [*const f32; R],
) -> [[f32; 8]; R] {
    let (qb, ab, aq) = (8 * QK, size_of::<BlockQ8_0>(), offset_of!(BlockQ8_0, qs));
    let ds = g.add(nb * qb);
    let per = qb + 16;
    let next = g.wrapping_add(nb * per);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        prefetch_share(next.wrapping_add(b * per), per);
        let q = g.add(b * qb);
        let mut isum = [_mm256_setzero_si256(); R];
        for c in 0..8 {
            let w = _mm256_loadu_si256(q.add(32 * c).cast());
            let aw = _mm256_abs_epi8(w);
            for r in 0..R {
                let y = a[r].add(b * ab + aq + 4 * c);
                let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast32(y), w));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, ones));
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(ds.add(16 * b).cast()));
        for r in 0..R {
            let sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*ys[r].add(b)));
            acc[r] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    let mut out = [[0f32; 8]; R];
    for r in 0..R {
        _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
    }
    out
}

/// Q4_0 (`MIN` false) and Q4_1 (`MIN` true): `a`, the activation rows (Q8_0 or Q8_1 blocks); `ys`, each row's
/// block scales `d` as f32 (`nb`), then `nb` more: Q4_1's `s`, Q4_0's 8 times the block's quant sum.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nib_body<const R: usize, const MIN: bool>(
    nb: usize,
    g: *const u8,
    a: [*const u8; R],
    ys: [*const f32; R],
) -> [[f32; 8]; R] {
    let qb = 4 * QK;
    let (ab, aq) = if MIN {
        (size_of::<BlockQ8_1>(), offset_of!(BlockQ8_1, qs))
    } else {
        (size_of::<BlockQ8_0>(), offset_of!(BlockQ8_0, qs))
    };
    let ds = g.add(nb * qb);
    let per = qb + if MIN { 32 } else { 16 };
    let next = g.wrapping_add(nb * per);
    let mask = _mm256_set1_epi8(0xF);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        prefetch_share(next.wrapping_add(b * per), per);
        let q = g.add(b * qb);
        let mut s16 = [_mm256_setzero_si256(); R];
        for c in 0..4 {
            let v = _mm256_loadu_si256(q.add(32 * c).cast());
            let lo = _mm256_and_si256(v, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            for r in 0..R {
                let y = a[r].add(b * ab + aq + 4 * c);
                s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(lo, bcast32(y)));
                s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(hi, bcast32(y.add(16))));
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(ds.add(16 * b).cast()));
        for r in 0..R {
            let mut isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[r], ones));
            if !MIN {
                isum = _mm256_sub_ps(isum, _mm256_broadcast_ss(&*ys[r].add(nb + b)));
            }
            let sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*ys[r].add(b)));
            acc[r] = _mm256_fmadd_ps(sc, isum, acc[r]);
        }
    }
    let mut out = [[0f32; 8]; R];
    for r in 0..R {
        let mut v = acc[r];
        if MIN {
            // The minimums' own chain (`m_w · s_a` over the blocks), kept out of the block loop's registers.
            let ms = ds.add(nb * 16);
            let mut mins = _mm256_setzero_ps();
            for b in 0..nb {
                let mw = _mm256_cvtph_ps(_mm_loadu_si128(ms.add(16 * b).cast()));
                mins = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(&*ys[r].add(nb + b)), mins);
            }
            v = _mm256_add_ps(v, mins);
        }
        _mm256_storeu_ps(out[r].as_mut_ptr(), v);
    }
    out
}

/// The body for `R` activation rows of `ty`.
#[inline(always)]
unsafe fn group_body<const R: usize>(
    ty: GgmlType,
    nb: usize,
    g: *const u8,
    a: [*const u8; R],
    ys: [*const f32; R],
) -> [[f32; 8]; R] {
    match ty {
        GgmlType::Q8_0 => q8_body::<R>(nb, g, a, ys),
        GgmlType::Q4_1 => nib_body::<R, true>(nb, g, a, ys),
        _ => nib_body::<R, false>(nb, g, a, ys),
    }
}

/// One packed group (`g`: `nb` blocks of 8 rows) against `n_act` ≤ [`MAX_ACT`] activation rows `a_stride` bytes
/// apart, whose block scales are in `ys` as f32 (row `j` at `ys[j * ys_stride]`, as [`act_scales`] wrote them);
/// `out[j][i]` = row `i` · activation row `j`.
///
/// # Safety
/// `g` must hold a whole packed group of `nb` blocks of `ty`, `a` `n_act` activation rows of `nb` blocks, `ys`
/// their scales, and the CPU must have AVX2, FMA and F16C.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_group(
    ty: GgmlType,
    nb: usize,
    g: *const u8,
    a: *const u8,
    a_stride: usize,
    ys: *const f32,
    ys_stride: usize,
    n_act: usize,
    out: &mut [[f32; 8]; MAX_ACT],
) {
    let mut j = 0;
    while j < n_act {
        let (aj, yj) = (a.add(j * a_stride), ys.add(j * ys_stride));
        let left = n_act - j;
        if left >= 4 {
            let a4 = [
                aj,
                aj.add(a_stride),
                aj.add(2 * a_stride),
                aj.add(3 * a_stride),
            ];
            let y4 = [
                yj,
                yj.add(ys_stride),
                yj.add(2 * ys_stride),
                yj.add(3 * ys_stride),
            ];
            out[j..j + 4].copy_from_slice(&group_body::<4>(ty, nb, g, a4, y4));
            j += 4;
        } else if left >= 2 {
            let a2 = [aj, aj.add(a_stride)];
            out[j..j + 2].copy_from_slice(&group_body::<2>(ty, nb, g, a2, [yj, yj.add(ys_stride)]));
            j += 2;
        } else {
            out[j] = group_body::<1>(ty, nb, g, [aj], [yj])[0];
            j += 1;
        }
    }
}

/// Floats per activation row [`act_scales`] writes for `nb` blocks of a `ty` weight: the blocks' `d`, then for
/// Q4_1 their `s` and for Q4_0 8 times their quant sums.
pub(crate) fn scales_per_row(ty: GgmlType, nb: usize) -> usize {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => 2 * nb,
        _ => nb,
    }
}

/// The block scales of `nj` activation rows (`a_stride` bytes apart, `nb` blocks each) of a `ty` weight, as f32:
/// row `j`'s at `out[j * per_row ..]`, laid out as [`scales_per_row`] says.
///
/// # Safety
/// `a` must hold the `nj` rows of `nb` blocks of `ty`'s activation type, `out` `nj * per_row` floats (`per_row`
/// ≥ [`scales_per_row`]), and the CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn act_scales(
    ty: GgmlType,
    a: *const u8,
    a_stride: usize,
    nb: usize,
    nj: usize,
    out: *mut f32,
    per_row: usize,
) {
    let f = |p: *const u8| {
        let h = std::ptr::read_unaligned(p.cast::<u16>());
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    };
    let ab = if ty == GgmlType::Q4_1 {
        size_of::<BlockQ8_1>()
    } else {
        size_of::<BlockQ8_0>()
    };
    for j in 0..nj {
        let (row, o) = (a.add(j * a_stride), out.add(j * per_row));
        for b in 0..nb {
            let blk = row.add(b * ab);
            *o.add(b) = f(blk);
            match ty {
                GgmlType::Q4_1 => *o.add(nb + b) = f(blk.add(2)),
                GgmlType::Q4_0 => {
                    let qs = blk.add(offset_of!(BlockQ8_0, qs)).cast::<i8>();
                    let sum: i32 = (0..QK).map(|i| i32::from(*qs.add(i))).sum();
                    *o.add(nb + b) = (8 * sum) as f32;
                }
                _ => {}
            }
        }
    }
}

/// The 32 bytes at `p0` in the low half and at `p1` in the high half of a 512-bit vector.
#[inline(always)]
unsafe fn load_pair(p0: *const u8, p1: *const u8) -> __m512i {
    let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p0.cast()));
    _mm512_inserti64x4(lo, _mm256_loadu_si256(p1.cast()), 1)
}

/// The 8 f16 at `p0` and the 8 at `p1` as 16 f32.
#[inline(always)]
unsafe fn load_f16_pair(p0: *const u8, p1: *const u8) -> __m512 {
    let lo = _mm256_castsi128_si256(_mm_loadu_si128(p0.cast()));
    _mm512_cvtph_ps(_mm256_inserti128_si256(lo, _mm_loadu_si128(p1.cast()), 1))
}

/// The sum of the 32 signed activation bytes at `y`.
#[inline(always)]
unsafe fn block_sum(y: *const u8) -> i32 {
    let s = _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        _mm256_set1_epi8(1),
        _mm256_loadu_si256(y.cast()),
    );
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
}

/// [`group_body`] on AVX-512 VNNI for two groups at once (`g0`'s 8 rows in lanes 0..8, `g1`'s in 8..16; `next`:
/// the groups after them, prefetched): `vpdpbusd` takes the quants as unsigned bytes (4-bit quants as stored, Q8_0's
/// with the sign bit flipped, i.e. +128), the offsets (8 for Q4_0, 128 for Q8_0) times the activation block's sum
/// are taken off the exact integer dot, and each lane's f32 chain is [`group_body`]'s, so the bits are the same.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_body<const R: usize>(
    ty: GgmlType,
    nb: usize,
    (g0, g1, next): (*const u8, *const u8, *const u8),
    a: [*const u8; R],
    ys: [*const f32; R],
) -> [[f32; 16]; R] {
    let min = ty == GgmlType::Q4_1;
    let q8 = ty == GgmlType::Q8_0;
    let qb = if q8 { 8 * QK } else { 4 * QK };
    let (ab, aq) = if min {
        (size_of::<BlockQ8_1>(), offset_of!(BlockQ8_1, qs))
    } else {
        (size_of::<BlockQ8_0>(), offset_of!(BlockQ8_0, qs))
    };
    let (ds0, ds1) = (g0.add(nb * qb), g1.add(nb * qb));
    let (ms0, ms1) = (ds0.add(nb * 16), ds1.add(nb * 16));
    let per = qb + if min { 32 } else { 16 };
    let m4 = _mm512_set1_epi8(0xF);
    let flip = _mm512_set1_epi8(-128);
    let z = _mm512_setzero_ps();
    let mut acc = [z; R];
    let mut mins = [z; R];
    for b in 0..nb {
        let mut yq = [std::ptr::null::<u8>(); R];
        for r in 0..R {
            yq[r] = a[r].add(b * ab + aq);
        }
        let mut pf = 0;
        while pf < 2 * per {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(2 * b * per + pf).cast());
            pf += 64;
        }
        let (w0, w1) = (g0.add(b * qb), g1.add(b * qb));
        let mut isum = [_mm512_setzero_si512(); R];
        if q8 {
            for c in 0..8 {
                let v = _mm512_xor_si512(load_pair(w0.add(32 * c), w1.add(32 * c)), flip);
                for r in 0..R {
                    isum[r] = _mm512_dpbusd_epi32(isum[r], v, bcast32_512(yq[r].add(4 * c)));
                }
            }
        } else {
            for c in 0..4 {
                let v = load_pair(w0.add(32 * c), w1.add(32 * c));
                let lo = _mm512_and_si512(v, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                for r in 0..R {
                    isum[r] = _mm512_dpbusd_epi32(isum[r], lo, bcast32_512(yq[r].add(4 * c)));
                    isum[r] = _mm512_dpbusd_epi32(isum[r], hi, bcast32_512(yq[r].add(16 + 4 * c)));
                }
            }
        }
        if !min {
            let offset = if q8 { 128 } else { 8 };
            for r in 0..R {
                let off = _mm512_set1_epi32(offset * block_sum(yq[r]));
                isum[r] = _mm512_sub_epi32(isum[r], off);
            }
        }
        let dw = load_f16_pair(ds0.add(16 * b), ds1.add(16 * b));
        for r in 0..R {
            let sc = _mm512_mul_ps(dw, _mm512_set1_ps(*ys[r].add(b)));
            acc[r] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(isum[r]), acc[r]);
        }
        if min {
            let mw = load_f16_pair(ms0.add(16 * b), ms1.add(16 * b));
            for r in 0..R {
                mins[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*ys[r].add(nb + b)), mins[r]);
            }
        }
    }
    let mut out = [[0f32; 16]; R];
    for r in 0..R {
        let v = if min {
            _mm512_add_ps(acc[r], mins[r])
        } else {
            acc[r]
        };
        _mm512_storeu_ps(out[r].as_mut_ptr(), v);
    }
    out
}

#[inline(always)]
unsafe fn bcast32_512(p: *const u8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
}

/// Activation rows one call of [`run_pair`] takes at most.
pub(crate) const PAIR_MAX_ACT: usize = 4;

/// Two packed groups (`g0`, `g1`: `nb` blocks of 8 rows each; `next`, the groups after them, is prefetched) against
/// `n_act` ≤ [`PAIR_MAX_ACT`] activation rows (as [`run_group`]); `out[j][i]` = row `i` (of `g0`'s, then `g1`'s)
/// · activation row `j`.
///
/// # Safety
/// As [`run_group`] for each group, and the CPU must have AVX-512 F/BW/VL and VNNI.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_pair(
    ty: GgmlType,
    nb: usize,
    groups: (*const u8, *const u8, *const u8),
    a: *const u8,
    a_stride: usize,
    ys: *const f32,
    ys_stride: usize,
    n_act: usize,
    out: &mut [[f32; 16]; PAIR_MAX_ACT],
) {
    let mut j = 0;
    while j < n_act {
        let (aj, yj) = (a.add(j * a_stride), ys.add(j * ys_stride));
        let left = n_act - j;
        if left >= 4 {
            let a4 = [
                aj,
                aj.add(a_stride),
                aj.add(2 * a_stride),
                aj.add(3 * a_stride),
            ];
            let y4 = [
                yj,
                yj.add(ys_stride),
                yj.add(2 * ys_stride),
                yj.add(3 * ys_stride),
            ];
            out[j..j + 4].copy_from_slice(&pair_body::<4>(ty, nb, groups, a4, y4));
            j += 4;
        } else if left >= 2 {
            let (a2, y2) = ([aj, aj.add(a_stride)], [yj, yj.add(ys_stride)]);
            out[j..j + 2].copy_from_slice(&pair_body::<2>(ty, nb, groups, a2, y2));
            j += 2;
        } else {
            out[j] = pair_body::<1>(ty, nb, groups, [aj], [yj])[0];
            j += 1;
        }
    }
}
