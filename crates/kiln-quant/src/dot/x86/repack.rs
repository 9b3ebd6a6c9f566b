//! The AVX2 body of the repacked Q4_0/Q4_1/Q8_0 kernel (layout and arithmetic: `dot::repack`).
//!
//! One group of 8 weight rows at a time, each row a 32-bit lane: a block's 4 (or 8) quant vectors are loaded
//! and unpacked once and multiplied with every activation row of the call, whose 4 quant bytes for the vector
//! are broadcast to all lanes, so each lane accumulates its own row's dot with no horizontal sums. 4-bit
//! products go through `vpmaddubsw` and are summed in i16 over the whole block (8 products of at most
//! 2 · 15 · 127 or 2 · 8 · 127 fit), then widened once; 8-bit products are widened per vector (one pair of
//! them already reaches 2 · 128 · 127). Signed weights (Q4_0 minus 8, Q8_0) multiply as |w| times the
//! activation with w's sign, as in the row kernels.

use crate::blocks::{BlockQ8_0, BlockQ8_1, QK};
use crate::GgmlType;
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

/// Activation rows one call takes at most, and for each type ([`act_rows`]).
pub(crate) const MAX_ACT: usize = 4;

/// Activation rows one call of `ty` takes: AVX2's 16 vector registers hold four rows' accumulators next to Q8_0's
/// weights, two rows' next to the 4-bit formats' unpacked nibbles (Q4_1 also keeps a min chain per row).
pub(crate) fn act_rows(ty: GgmlType) -> usize {
    if ty == GgmlType::Q8_0 {
        4
    } else {
        2
    }
}

#[inline(always)]
unsafe fn bcast32(p: *const u8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
}

/// The block's exact integer dots of the 8 rows with each of `R` activation quant rows `y` (32 bytes each).
#[inline(always)]
unsafe fn block_dots<const R: usize>(
    ty: GgmlType,
    q: *const u8,
    y: [*const u8; R],
) -> [__m256i; R] {
    let ones = _mm256_set1_epi16(1);
    let z = _mm256_setzero_si256();
    let mut out = [z; R];
    if ty == GgmlType::Q8_0 {
        for c in 0..8 {
            let w = _mm256_loadu_si256(q.add(32 * c).cast());
            let aw = _mm256_abs_epi8(w);
            for r in 0..R {
                let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast32(y[r].add(4 * c)), w));
                out[r] = _mm256_add_epi32(out[r], _mm256_madd_epi16(p, ones));
            }
        }
        return out;
    }
    let mask = _mm256_set1_epi8(0xF);
    let mut s16 = [z; R];
    for c in 0..4 {
        let v = _mm256_loadu_si256(q.add(32 * c).cast());
        let lo = _mm256_and_si256(v, mask);
        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
        if ty == GgmlType::Q4_1 {
            for r in 0..R {
                let pl = _mm256_maddubs_epi16(lo, bcast32(y[r].add(4 * c)));
                let ph = _mm256_maddubs_epi16(hi, bcast32(y[r].add(16 + 4 * c)));
                s16[r] = _mm256_add_epi16(s16[r], _mm256_add_epi16(pl, ph));
            }
        } else {
            let eight = _mm256_set1_epi8(8);
            let (wl, wh) = (_mm256_sub_epi8(lo, eight), _mm256_sub_epi8(hi, eight));
            let (al, ah) = (_mm256_abs_epi8(wl), _mm256_abs_epi8(wh));
            for r in 0..R {
                let pl = _mm256_maddubs_epi16(al, _mm256_sign_epi8(bcast32(y[r].add(4 * c)), wl));
                let ph =
                    _mm256_maddubs_epi16(ah, _mm256_sign_epi8(bcast32(y[r].add(16 + 4 * c)), wh));
                s16[r] = _mm256_add_epi16(s16[r], _mm256_add_epi16(pl, ph));
            }
        }
    }
    for r in 0..R {
        out[r] = _mm256_madd_epi16(s16[r], ones);
    }
    out
}

/// `a`: the activation rows; `ys`: each row's block scales `d` as f32 (`nb` of them), then its `s` (Q4_1).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_body<const R: usize>(
    ty: GgmlType,
    nb: usize,
    g: *const u8,
    a: [*const u8; R],
    ys: [*const f32; R],
) -> [[f32; 8]; R] {
    let min = ty == GgmlType::Q4_1;
    let qb = if ty == GgmlType::Q8_0 { 8 * QK } else { 4 * QK };
    let (ab, aq) = if min {
        (size_of::<BlockQ8_1>(), offset_of!(BlockQ8_1, qs))
    } else {
        (size_of::<BlockQ8_0>(), offset_of!(BlockQ8_0, qs))
    };
    let ds = g.add(nb * qb);
    let ms = ds.add(nb * 16);
    // The next group (the next rows of the weight, right after this one) is fetched while this one is
    // multiplied, a block's share per block: decode reads weights from memory, and without this the kernel
    // waited on them (measured: below the row kernels' bandwidth from memory).
    let per = qb + if min { 32 } else { 16 };
    let next = g.wrapping_add(nb * per);
    let z = _mm256_setzero_ps();
    let mut acc = [z; R];
    let mut mins = [z; R];
    for b in 0..nb {
        // A loop, not `array::from_fn`/`map`: their closures run in core's generic code without this
        // function's target features and would not inline.
        let mut yq = [std::ptr::null::<u8>(); R];
        for r in 0..R {
            yq[r] = a[r].add(b * ab + aq);
        }
        let mut pf = 0;
        while pf < per {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(b * per + pf).cast());
            pf += 64;
        }
        let isum = block_dots::<R>(ty, g.add(b * qb), yq);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(ds.add(16 * b).cast()));
        for r in 0..R {
            let sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*ys[r].add(b)));
            acc[r] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
        if min {
            let mw = _mm256_cvtph_ps(_mm_loadu_si128(ms.add(16 * b).cast()));
            for r in 0..R {
                mins[r] = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(&*ys[r].add(nb + b)), mins[r]);
            }
        }
    }
    let mut out = [[0f32; 8]; R];
    for r in 0..R {
        let v = if min {
            _mm256_add_ps(acc[r], mins[r])
        } else {
            acc[r]
        };
        _mm256_storeu_ps(out[r].as_mut_ptr(), v);
    }
    out
}

/// One packed group (`g`: `nb` blocks of 8 rows) against `n_act` ≤ [`MAX_ACT`] activation rows `a_stride` bytes
/// apart, whose block scales are in `ys` as f32 (row `j` at `ys[j * ys_stride]`: `nb` values of `d`, then `nb`
/// of `s` for Q4_1); `out[j][i]` = row `i` · activation row `j`.
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
        if left >= 4 && act_rows(ty) >= 4 {
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

/// The f16 block scales of `nj` activation rows (`a_stride` bytes apart, blocks of `ab` bytes) as f32: row `j`'s
/// `d` of every block at `out[j * per_row ..]`, then (`two`) its `s`.
///
/// # Safety
/// `a` must hold the `nj` rows of `nb` blocks, `out` `nj * per_row` floats (`per_row` ≥ `nb`, or ≥ 2 `nb` with
/// `two`), and the CPU must have AVX2 and F16C.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn act_scales(
    a: *const u8,
    a_stride: usize,
    ab: usize,
    nb: usize,
    nj: usize,
    two: bool,
    out: *mut f32,
    per_row: usize,
) {
    let f = |p: *const u8| {
        let h = std::ptr::read_unaligned(p.cast::<u16>());
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    };
    for j in 0..nj {
        let (row, o) = (a.add(j * a_stride), out.add(j * per_row));
        for b in 0..nb {
            *o.add(b) = f(row.add(b * ab));
            if two {
                *o.add(nb + b) = f(row.add(b * ab + 2));
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
