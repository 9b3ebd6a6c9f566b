//! x86 tiled kernels for Q4_K and Q6_K weights against Q8_K activations: 8 weight rows × up to 8 activation
//! rows per call, the prefill fast path.
//!
//! The weight rows are first packed ([`pack`]) into groups of 8: per super-block, every quant is decoded to an
//! unsigned byte and the 8 rows are interleaved in 4-byte runs, so one 32-byte vector holds 4 consecutive
//! elements of each of the 8 rows. A VNNI `vpdpbusd` of that vector with 4 activation bytes broadcast to every
//! lane then advances 8 (weight row, activation row) dot products at once, each in its own i32 lane: the weights
//! are decoded once per group and reused by every activation row, the activation bytes are reused by 8 weight
//! rows, and no horizontal sum is needed (the lanes are the outputs). The idea of interleaving weight rows for
//! a register-tiled quantized GEMM is ggml's CPU "repack" kernels'; the layout and code here are kiln's own.
//!
//! Each (weight row, activation row) pair goes through exactly the arithmetic of the scalar reference
//! (`scalar::q4_k_q8_k` / `q6_k_q8_k`): exact i32 sums per super-block (`isum`, `msum`: integers, so how they
//! are added up cannot change them), then per block `sum += (d·yd)·isum − (dmin·yd)·msum` with the same f32
//! roundings, vertically per lane. A pair's result is therefore bit-identical to the reference and to the
//! single-row SIMD kernels, whatever the tile and the number of rows in the call (batch invariance).

use super::kquants::scales_mins_k4;
use super::{load_f32, Simd};
use crate::blocks::{BlockQ4K, BlockQ6K, BlockQ8K, QK_K};
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

/// Weight rows per packed group (the i32 lanes of a 256-bit vector).
pub(crate) const GROUP: usize = 8;

const Y_QS: usize = offset_of!(BlockQ8K, qs);
const Y_BSUMS: usize = offset_of!(BlockQ8K, bsums);
const AB: usize = size_of::<BlockQ8K>();

// Packed super-block of a group, in bytes: d (8 f32), dmin (8 f32, zero for Q6_K), the offset weights (8
// vectors of i16 pairs, one per pair of Q8_K 16-element sums), the sub-block scales (i8, 8 per sub-block),
// then the 256 decoded quants of the 8 rows (64 vectors of 8 × 4 bytes).
const P_D: usize = 0;
const P_DMIN: usize = 32;
const P_OFF: usize = 64;
const P_SC: usize = 320;

/// Sub-blocks per super-block: 8 of 32 elements (Q4_K) or 16 of 16 (Q6_K).
const fn n_sub(q6: bool) -> usize {
    if q6 {
        16
    } else {
        8
    }
}

const fn p_q(q6: bool) -> usize {
    P_SC + GROUP * n_sub(q6)
}

/// Bytes of one packed super-block of a group of 8 rows.
pub(crate) const fn packed_block_bytes(q6: bool) -> usize {
    p_q(q6) + GROUP * QK_K
}

/// 8 × 8 transpose of 4-byte runs: output `k` holds run `k` (bytes 4k..4k+4) of each of the 8 inputs.
#[inline(always)]
unsafe fn transpose_runs(r: [__m256i; GROUP]) -> [__m256i; GROUP] {
    let t = [
        _mm256_unpacklo_epi32(r[0], r[1]),
        _mm256_unpackhi_epi32(r[0], r[1]),
        _mm256_unpacklo_epi32(r[2], r[3]),
        _mm256_unpackhi_epi32(r[2], r[3]),
        _mm256_unpacklo_epi32(r[4], r[5]),
        _mm256_unpackhi_epi32(r[4], r[5]),
        _mm256_unpacklo_epi32(r[6], r[7]),
        _mm256_unpackhi_epi32(r[6], r[7]),
    ];
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    [
        _mm256_permute2x128_si256(u[0], u[4], 0x20),
        _mm256_permute2x128_si256(u[1], u[5], 0x20),
        _mm256_permute2x128_si256(u[2], u[6], 0x20),
        _mm256_permute2x128_si256(u[3], u[7], 0x20),
        _mm256_permute2x128_si256(u[0], u[4], 0x31),
        _mm256_permute2x128_si256(u[1], u[5], 0x31),
        _mm256_permute2x128_si256(u[2], u[6], 0x31),
        _mm256_permute2x128_si256(u[3], u[7], 0x31),
    ]
}

/// The 32 bytes at offset `off` of block `b` of each of the group's rows (zeros past `rows`), transposed into
/// 4-byte runs. Quants are decoded after the transpose: every decode step is per byte position, so it commutes
/// with moving whole 4-byte runs around, and the transpose then moves packed bytes (half as many for Q4_K).
#[inline(always)]
unsafe fn load_runs(x: [*const u8; GROUP], rows: usize, off: usize) -> [__m256i; GROUP] {
    let mut r = [_mm256_setzero_si256(); GROUP];
    for (i, v) in r.iter_mut().enumerate().take(rows) {
        *v = _mm256_loadu_si256(x[i].add(off).cast());
    }
    transpose_runs(r)
}

/// 8 × 8 transpose of i16 elements within each 128-bit lane: output `k` holds element `k` of each input.
#[inline(always)]
unsafe fn transpose_i16(v: [__m256i; GROUP]) -> [__m256i; GROUP] {
    let t: [__m256i; GROUP] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * (k / 2)], v[2 * (k / 2) + 1]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi16(a, b)
        } else {
            _mm256_unpackhi_epi16(a, b)
        }
    });
    // u[k]: elements 2k, 2k+1 of rows 0..4 (k < 4) or rows 4..8 (k >= 4).
    let u: [__m256i; GROUP] = std::array::from_fn(|k| {
        let base = 4 * (k / 4);
        let (a, b) = (t[base + (k % 4) / 2], t[base + 2 + (k % 4) / 2]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    std::array::from_fn(|k| {
        let (a, b) = (u[k / 2], u[4 + k / 2]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    })
}

/// The f16 at byte `off` of each row's block (zero past `rows`) as 8 f32 lanes.
#[inline(always)]
unsafe fn gather_f16(x: [*const u8; GROUP], rows: usize, off: usize) -> __m256 {
    let mut h = [0u16; GROUP];
    for (i, v) in h.iter_mut().enumerate().take(rows) {
        *v = std::ptr::read_unaligned(x[i].add(off).cast::<u16>());
    }
    _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast()))
}

/// Writes the Q4_K block header of the group (d, dmin, scales, and mins as offset weights) into `o`.
#[inline(always)]
unsafe fn scales_q4_k(x: [*const u8; GROUP], rows: usize, o: *mut u8) {
    _mm256_storeu_ps(
        o.add(P_D).cast(),
        gather_f16(x, rows, offset_of!(BlockQ4K, d)),
    );
    _mm256_storeu_ps(
        o.add(P_DMIN).cast(),
        gather_f16(x, rows, offset_of!(BlockQ4K, dmin)),
    );
    let mut v = [_mm256_setzero_si256(); GROUP];
    for (i, v) in v.iter_mut().enumerate().take(rows) {
        *v = scales_mins_k4(x[i].add(offset_of!(BlockQ4K, scales)));
    }
    // w[s]: scale s of the 8 rows (low lane) and min s (high lane), as i16.
    let w = transpose_i16(v);
    for (s, w) in w.into_iter().enumerate() {
        let sc = _mm256_castsi256_si128(_mm256_packus_epi16(w, w));
        _mm_storel_epi64(o.add(P_SC + GROUP * s).cast(), sc);
        // The min of 32-element sub-block s multiplies both Q8_K 16-element sums 2s and 2s+1: (m, m) pairs.
        let m = _mm256_extracti128_si256(w, 1);
        _mm_storeu_si128(o.add(P_OFF + 32 * s).cast(), _mm_unpacklo_epi16(m, m));
        _mm_storeu_si128(o.add(P_OFF + 32 * s + 16).cast(), _mm_unpackhi_epi16(m, m));
    }
}

/// Writes the Q6_K block header of the group (d, scales, and scale pairs as offset weights) into `o`.
#[inline(always)]
unsafe fn scales_q6_k(x: [*const u8; GROUP], rows: usize, o: *mut u8) {
    _mm256_storeu_ps(
        o.add(P_D).cast(),
        gather_f16(x, rows, offset_of!(BlockQ6K, d)),
    );
    _mm256_storeu_ps(o.add(P_DMIN).cast(), _mm256_setzero_ps());
    let mut v = [_mm256_setzero_si256(); GROUP];
    for (i, v) in v.iter_mut().enumerate().take(rows) {
        let sc = _mm_loadu_si128(x[i].add(offset_of!(BlockQ6K, scales)).cast());
        *v = _mm256_castsi128_si256(sc);
    }
    // w[t]: the byte pair (scale 2t, scale 2t+1) of each of the 8 rows (low lane).
    let w = transpose_i16(v);
    let split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (t, w) in w.into_iter().enumerate() {
        let pairs = _mm256_castsi256_si128(w);
        // The -32 offset is Σ scale · bsum per 16 elements: i16 pairs (scale 2t, scale 2t+1) against the
        // Q8_K sums 2t, 2t+1.
        _mm256_storeu_si256(o.add(P_OFF + 32 * t).cast(), _mm256_cvtepi8_epi16(pairs));
        // Scales 2t and 2t+1 of the 8 rows: 16 contiguous bytes of the scale table.
        _mm_storeu_si128(
            o.add(P_SC + GROUP * 2 * t).cast(),
            _mm_shuffle_epi8(pairs, split),
        );
    }
}

/// Packs `rows` (1..=8) rows of `nb` super-blocks, row `i` at `w + i * stride`, into one group at `o`
/// (`nb * packed_block_bytes` bytes); lanes past `rows` get zero scales and quants, so they compute zeros.
#[inline(always)]
unsafe fn pack_group<const Q6: bool>(
    nb: usize,
    w: *const u8,
    stride: usize,
    rows: usize,
    o: *mut u8,
) {
    let wb = if Q6 {
        size_of::<BlockQ6K>()
    } else {
        size_of::<BlockQ4K>()
    };
    let pbb = packed_block_bytes(Q6);
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    for b in 0..nb {
        let ob = o.add(b * pbb);
        // Lanes past `rows` read no row (zero vectors), so every header and quant byte is written.
        let x: [*const u8; GROUP] =
            std::array::from_fn(|i| w.add(i.min(rows - 1) * stride + b * wb));
        if Q6 {
            scales_q6_k(x, rows, ob);
        } else {
            scales_q4_k(x, rows, ob);
        }
        // Output vector g holds elements 4g..4g+4 of the 8 rows.
        let store = |g: usize, v: __m256i| _mm256_storeu_si256(ob.add(p_q(Q6) + 32 * g).cast(), v);
        if Q6 {
            let ql = offset_of!(BlockQ6K, ql);
            let qh = offset_of!(BlockQ6K, qh);
            for h in 0..2 {
                let l0 = load_runs(x, rows, ql + 64 * h);
                let l1 = load_runs(x, rows, ql + 64 * h + 32);
                let hb = load_runs(x, rows, qh + 32 * h);
                // Element 128h + 32k + l: nibble of ql[64h + l] (k even) or ql[64h + 32 + l] (k odd), low for
                // k < 2, top bits qh[32h + l] >> 2k.
                for kk in 0..GROUP {
                    let top = |sh: i32| {
                        let t = _mm256_srl_epi16(hb[kk], _mm_cvtsi32_si128(sh));
                        _mm256_slli_epi16(_mm256_and_si256(t, m2), 4)
                    };
                    let hi0 = _mm256_and_si256(_mm256_srli_epi16(l0[kk], 4), m4);
                    let hi1 = _mm256_and_si256(_mm256_srli_epi16(l1[kk], 4), m4);
                    store(
                        32 * h + kk,
                        _mm256_or_si256(_mm256_and_si256(l0[kk], m4), top(0)),
                    );
                    store(
                        32 * h + 8 + kk,
                        _mm256_or_si256(_mm256_and_si256(l1[kk], m4), top(2)),
                    );
                    store(32 * h + 16 + kk, _mm256_or_si256(hi0, top(4)));
                    store(32 * h + 24 + kk, _mm256_or_si256(hi1, top(6)));
                }
            }
        } else {
            let qs = offset_of!(BlockQ4K, qs);
            for c in 0..4 {
                // Bytes 32c..32c+32: low nibbles are elements 64c + l, high nibbles 64c + 32 + l.
                let t = load_runs(x, rows, qs + 32 * c);
                for (kk, v) in t.into_iter().enumerate() {
                    store(16 * c + kk, _mm256_and_si256(v, m4));
                    store(
                        16 * c + 8 + kk,
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                    );
                }
            }
        }
    }
}

/// `out[r][i]` = the dot of packed row `i` of the group at `p` with activation row `a[r]` (`nb` Q8_K blocks).
#[inline(always)]
unsafe fn gemm_body<S: Simd, const Q6: bool, const R: usize>(
    nb: usize,
    p: *const u8,
    a: [*const u8; R],
) -> [[f32; GROUP]; R] {
    let (nsub, sublen) = (n_sub(Q6), QK_K / n_sub(Q6));
    let pbb = packed_block_bytes(Q6);
    let qo = p_q(Q6);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let pb = p.add(b * pbb);
        let mut y = a;
        for yr in &mut y {
            *yr = yr.add(b * AB);
        }
        let mut isum = [_mm256_setzero_si256(); R];
        for s in 0..nsub {
            let mut sub = [_mm256_setzero_si256(); R];
            for g in 0..sublen / 4 {
                let e = s * sublen + 4 * g;
                let wv = _mm256_loadu_si256(pb.add(qo + 8 * e).cast());
                for r in 0..R {
                    let yv = std::ptr::read_unaligned(y[r].add(Y_QS + e).cast::<i32>());
                    sub[r] = S::dot_u8i8(sub[r], wv, _mm256_set1_epi32(yv));
                }
            }
            let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(pb.add(P_SC + GROUP * s).cast()));
            for r in 0..R {
                isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(sub[r], sc));
            }
        }
        let mut off = [_mm256_setzero_si256(); R];
        for t in 0..8 {
            let ov = _mm256_loadu_si256(pb.add(P_OFF + 32 * t).cast());
            for r in 0..R {
                let bs = std::ptr::read_unaligned(y[r].add(Y_BSUMS + 4 * t).cast::<i32>());
                off[r] = S::madd_acc(off[r], ov, _mm256_set1_epi32(bs));
            }
        }
        let d = _mm256_loadu_ps(pb.add(P_D).cast());
        let dmin = _mm256_loadu_ps(pb.add(P_DMIN).cast());
        for r in 0..R {
            let yd = _mm256_set1_ps(load_f32(y[r]));
            let dd = _mm256_mul_ps(d, yd);
            if Q6 {
                // Quants are stored +32: isum = Σ scale · (dot − 32 · bsum), exact.
                let s = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(off[r], 5));
                acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(s)));
            } else {
                let t1 = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum[r]));
                let t2 = _mm256_mul_ps(_mm256_mul_ps(dmin, yd), _mm256_cvtepi32_ps(off[r]));
                acc[r] = _mm256_add_ps(acc[r], _mm256_sub_ps(t1, t2));
            }
        }
    }
    let mut out = [[0f32; GROUP]; R];
    for r in 0..R {
        _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
    }
    out
}

/// The packer for both ISAs (AVX2 instructions only).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_avx2(q6: bool, nb: usize, w: *const u8, stride: usize, rows: usize, o: *mut u8) {
    if q6 {
        pack_group::<true>(nb, w, stride, rows, o)
    } else {
        pack_group::<false>(nb, w, stride, rows, o)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2<const Q6: bool, const R: usize>(
    nb: usize,
    p: *const u8,
    a: [*const u8; R],
) -> [[f32; GROUP]; R] {
    gemm_body::<super::Avx2, Q6, R>(nb, p, a)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemm_vnni<const Q6: bool, const R: usize>(
    nb: usize,
    p: *const u8,
    a: [*const u8; R],
) -> [[f32; GROUP]; R] {
    gemm_body::<super::Vnni, Q6, R>(nb, p, a)
}

/// Packs `rows` (1..=8) weight rows into one group.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `rows` rows of `nb` blocks must be readable at `w + i * stride`, and
/// `nb * packed_block_bytes(q6)` bytes writable at `o`.
pub(crate) unsafe fn pack(
    q6: bool,
    nb: usize,
    w: *const u8,
    stride: usize,
    rows: usize,
    o: *mut u8,
) {
    debug_assert!((1..=GROUP).contains(&rows));
    pack_avx2(q6, nb, w, stride, rows, o)
}

/// Activation rows one call of [`gemm`] carries on `vnni` / AVX2: AVX2's 16 vector registers hold the
/// three accumulators of 4 rows, AVX-512's 32 those of 8 (8 independent `vpdpbusd` chains also cover the
/// instruction's latency).
pub(crate) const fn max_act_rows(vnni: bool) -> usize {
    if vnni {
        8
    } else {
        4
    }
}

/// `out[r * GROUP + i]` = packed row `i` of the group at `p` · activation row `r` (at `a + r * a_stride`), for
/// `r < n_act` (1..=`max_act_rows`).
///
/// # Safety
/// The CPU must have the ISA's features (AVX-512 VNNI when `vnni`); `p` must hold a packed group of `nb` blocks
/// and each activation row `nb` Q8_K blocks; `out` must hold `n_act * GROUP` floats.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    q6: bool,
    vnni: bool,
    nb: usize,
    p: *const u8,
    a: *const u8,
    a_stride: usize,
    n_act: usize,
    out: &mut [f32],
) {
    macro_rules! call {
        ($r:literal) => {{
            let rows: [*const u8; $r] = std::array::from_fn(|r| a.add(r * a_stride));
            let res = match (q6, vnni) {
                (false, false) => gemm_avx2::<false, $r>(nb, p, rows),
                (true, false) => gemm_avx2::<true, $r>(nb, p, rows),
                (false, true) => gemm_vnni::<false, $r>(nb, p, rows),
                (true, true) => gemm_vnni::<true, $r>(nb, p, rows),
            };
            for (o, r) in out.chunks_exact_mut(GROUP).zip(&res) {
                o.copy_from_slice(r);
            }
        }};
    }
    debug_assert!(n_act <= max_act_rows(vnni) && out.len() >= n_act * GROUP);
    match n_act {
        1 => call!(1),
        2 => call!(2),
        3 => call!(3),
        4 => call!(4),
        5 if vnni => call!(5),
        6 if vnni => call!(6),
        7 if vnni => call!(7),
        8 if vnni => call!(8),
        _ => unreachable!("gemm: {n_act} activation rows (the caller splits by max_act_rows)"),
    }
}
