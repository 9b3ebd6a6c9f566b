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

use super::{load_f32, Simd};
use crate::blocks::{BlockQ4K, BlockQ6K, BlockQ8K, QK_K};
use crate::dot::scalar::scale_min_k4;
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

/// 256 decoded quants of the 8 rows of a group, 32-byte aligned for the transposing loads.
#[repr(C, align(32))]
struct Decoded([[u8; QK_K]; GROUP]);

/// Decodes block `b` of Q4_K row `x` into `q` (bytes 0..15), writing its scale, min and d/dmin for lane `i`.
#[inline(always)]
unsafe fn decode_q4_k(x: *const u8, i: usize, q: &mut [u8; QK_K], o: *mut u8) {
    let d = super::load_f16(x.add(offset_of!(BlockQ4K, d)));
    let dmin = super::load_f16(x.add(offset_of!(BlockQ4K, dmin)));
    o.add(P_D + 4 * i).cast::<f32>().write_unaligned(d);
    o.add(P_DMIN + 4 * i).cast::<f32>().write_unaligned(dmin);
    let mut packed = [0u8; 12];
    std::ptr::copy_nonoverlapping(x.add(offset_of!(BlockQ4K, scales)), packed.as_mut_ptr(), 12);
    for s in 0..8 {
        let (sc, m) = scale_min_k4(s, &packed);
        o.add(P_SC + GROUP * s + i).write(sc);
        // The min of 32-element sub-block s multiplies both Q8_K 16-element sums 2s and 2s+1.
        let pair = m as u32 | ((m as u32) << 16);
        o.add(P_OFF + 32 * s + 4 * i)
            .cast::<u32>()
            .write_unaligned(pair);
    }
    let qs = x.add(offset_of!(BlockQ4K, qs));
    let m4 = _mm256_set1_epi8(0xF);
    for j in 0..4 {
        let bits = _mm256_loadu_si256(qs.add(32 * j).cast());
        let dst = q.as_mut_ptr().add(64 * j);
        _mm256_storeu_si256(dst.cast(), _mm256_and_si256(bits, m4));
        let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        _mm256_storeu_si256(dst.add(32).cast(), hi);
    }
}

/// Decodes block `b` of Q6_K row `x` into `q` (bytes 0..63, the stored +32 kept), writing its scales and d.
#[inline(always)]
unsafe fn decode_q6_k(x: *const u8, i: usize, q: &mut [u8; QK_K], o: *mut u8) {
    let d = super::load_f16(x.add(offset_of!(BlockQ6K, d)));
    o.add(P_D + 4 * i).cast::<f32>().write_unaligned(d);
    o.add(P_DMIN + 4 * i).cast::<f32>().write_unaligned(0.0);
    let sc = x.add(offset_of!(BlockQ6K, scales));
    for s in 0..16 {
        o.add(P_SC + GROUP * s + i).write(sc.add(s).read());
    }
    // The -32 offset is Σ scale · bsum per 16 elements: i16 pairs (scale 2t, scale 2t+1) against the Q8_K
    // sums 2t, 2t+1.
    for t in 0..8 {
        let lo = sc.add(2 * t).read() as i8 as i16 as u16 as u32;
        let hi = sc.add(2 * t + 1).read() as i8 as i16 as u16 as u32;
        o.add(P_OFF + 32 * t + 4 * i)
            .cast::<u32>()
            .write_unaligned(lo | (hi << 16));
    }
    let ql = x.add(offset_of!(BlockQ6K, ql));
    let qh = x.add(offset_of!(BlockQ6K, qh));
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    for h in 0..2 {
        let l0 = _mm256_loadu_si256(ql.add(64 * h).cast());
        let l1 = _mm256_loadu_si256(ql.add(64 * h + 32).cast());
        let hb = _mm256_loadu_si256(qh.add(32 * h).cast());
        // Element 128h + 32k + l: nibble of l0 (k even) or l1 (k odd), low for k < 2, top bits qh >> 2k.
        let top = |k: i32| {
            let t = _mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k));
            _mm256_slli_epi16(_mm256_and_si256(t, m2), 4)
        };
        let v = [
            _mm256_or_si256(_mm256_and_si256(l0, m4), top(0)),
            _mm256_or_si256(_mm256_and_si256(l1, m4), top(1)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), top(2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), top(3)),
        ];
        for (k, v) in v.into_iter().enumerate() {
            _mm256_storeu_si256(q.as_mut_ptr().add(128 * h + 32 * k).cast(), v);
        }
    }
}

/// Packs `rows` (1..=8) rows of `nb` super-blocks, row `i` at `w + i * stride`, into one group at `o`
/// (`nb * packed_block_bytes` bytes); lanes past `rows` get zero scales, so they compute zeros.
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
    let mut dec = Decoded([[0u8; QK_K]; GROUP]);
    for b in 0..nb {
        let ob = o.add(b * pbb);
        std::ptr::write_bytes(ob, 0, p_q(Q6));
        for (i, q) in dec.0.iter_mut().enumerate().take(rows) {
            let x = w.add(i * stride + b * wb);
            if Q6 {
                decode_q6_k(x, i, q, ob);
            } else {
                decode_q4_k(x, i, q, ob);
            }
        }
        // Lanes past `rows` keep the zeros written once (their d is zero too).
        let qo = ob.add(p_q(Q6));
        for c in 0..QK_K / 32 {
            let r: [__m256i; GROUP] =
                std::array::from_fn(|i| _mm256_load_si256(dec.0[i].as_ptr().add(32 * c).cast()));
            // 8 × 8 transpose of 4-byte runs: output vector k holds run 8c + k of each row.
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
            for k in 0..4 {
                let lo = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
                let hi = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
                _mm256_storeu_si256(qo.add(32 * (8 * c + k)).cast(), lo);
                _mm256_storeu_si256(qo.add(32 * (8 * c + k + 4)).cast(), hi);
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
