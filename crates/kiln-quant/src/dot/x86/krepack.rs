//! The bodies of the repacked Q4_K/Q5_K/Q6_K kernel (`dot::repack`): groups of 16 weight rows, one row per 32-bit lane
//! of a 512-bit vector on AVX-512 VNNI; on AVX2 the same layout as two halves of 8 rows (256-bit vectors).
//!
//! A packed vector holds 4 consecutive quants of each of the 16 rows (still 4-bit, and for Q5_K/Q6_K the top bits
//! in their own vectors), so after unpacking, one `vpdpbusd` with 4 activation bytes broadcast to every lane adds
//! 4 products to each row's sub-block sum. The sub-block sums are weighted by the rows' scales (`vpmulld`)
//! into the super-block's exact integer `isum`, the minimums (Q4_K) or the -32 offset (Q6_K) come from the
//! activation's per-16 sums (`vpdpwssd`), and the super-block's float step is the scalar reference's, lane by
//! lane. So every (row, activation row) result is bit-identical to `scalar.rs` and to the row kernels.

use super::{load_f32, Simd};
use crate::blocks::{BlockQ8K, QK_K};
use crate::dot::repack::KQuant;
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

/// Weight rows per packed group (the i32 lanes of a 512-bit vector).
pub(crate) const GROUP: usize = 16;

/// Activation rows one call takes at most.
pub(crate) const MAX_ACT: usize = 8;

const Y_QS: usize = offset_of!(BlockQ8K, qs);
const Y_BSUMS: usize = offset_of!(BlockQ8K, bsums);
const AB: usize = size_of::<BlockQ8K>();

// A packed Q4_K super-block of a group: d and dmin (16 f16 each), the 8 sub-block scales (u8, sub-block-major:
// byte 16s + r), the minimums as pairs (byte 32t + 2r + e = min 2t+e of row r, widened to i16 pairs), then the
// quants: vector 8p + c, lane r = row r's bytes 32p + 4c .. +4 (low nibbles: sub-block 2p, high: 2p+1).
// 2,368 bytes, a multiple of 64, so vectors stay cache-line aligned block after block.
pub(crate) const Q4_D: usize = 0;
pub(crate) const Q4_DMIN: usize = 32;
pub(crate) const Q4_SC: usize = 64;
pub(crate) const Q4_MN: usize = 192;
pub(crate) const Q4_Q: usize = 320;
pub(crate) const Q4_BLOCK: usize = Q4_Q + GROUP * QK_K / 2;

// A packed Q5_K super-block of a group: Q4_K's, then the fifth bits (vector c, lane r = row r's qh bytes
// 4c .. +4: bit 2p of a byte belongs to vector 8p + c's low nibble, bit 2p + 1 to its high one). 2,880 bytes.
pub(crate) const Q5_QH: usize = Q4_BLOCK;
pub(crate) const Q5_BLOCK: usize = Q5_QH + GROUP * QK_K / 8;

// A packed Q6_K super-block of a group: d (16 f32), the 16 signed scales as pairs (byte 32t + 2r + e = scale
// 2t+e of row r), the low nibbles (vector 16h + 8k + c, lane r = row r's ql bytes 64h + 32k + 4c .. +4, k = 0, 1)
// and the top bits (vector 8h + c, lane r = qh bytes 32h + 4c .. +4). 3,392 bytes, a multiple of 64.
pub(crate) const Q6_D: usize = 0;
pub(crate) const Q6_SC: usize = 64;
pub(crate) const Q6_QL: usize = 320;
pub(crate) const Q6_QH: usize = Q6_QL + GROUP * QK_K / 2;
pub(crate) const Q6_BLOCK: usize = Q6_QH + GROUP * QK_K / 4;

const _: () = assert!(
    Q4_BLOCK.is_multiple_of(64) && Q5_BLOCK.is_multiple_of(64) && Q6_BLOCK.is_multiple_of(64)
);

/// Bytes of one packed super-block of a group.
pub(crate) const fn block_len(q: KQuant) -> usize {
    match q {
        KQuant::Q4 => Q4_BLOCK,
        KQuant::Q5 => Q5_BLOCK,
        KQuant::Q6 => Q6_BLOCK,
    }
}

/// Q5_K's fifth bits for vector 8p + c (`qh`: vector c of the block's fifth bits) at bit 4 of each byte, for
/// its low nibbles (bit 2p) and its high ones (bit 2p + 1). 16-bit shifts: the mask drops what crosses bytes.
macro_rules! fifth_bits {
    ($p:expr, $qh:expr, $m10:expr, $sl:ident, $sr:ident, $and:ident) => {{
        let (qh, m) = ($qh, $m10);
        let (lo, hi) = match $p {
            0 => ($sl::<4>(qh), $sl::<3>(qh)),
            1 => ($sl::<2>(qh), $sl::<1>(qh)),
            2 => (qh, $sr::<1>(qh)),
            _ => ($sr::<2>(qh), $sr::<3>(qh)),
        };
        ($and(lo, m), $and(hi, m))
    }};
}

/// 4 activation bytes at `p` in every lane.
#[inline(always)]
unsafe fn bcast32(p: *const u8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
}

/// Prefetches part `i` of `parts` of the `len` bytes at `p` (a hint: any address). A block's prefetches are spread
/// over its inner loop: issued all at once they filled the miss buffers and stalled on themselves. T2 rather than
/// T0: 0.6B Q4_K_M decode on 2 threads 49.4 / 47.3 / 49.5 t/s against 47.5 / 46.6 / 45.5 (alternated runs).
#[inline(always)]
unsafe fn prefetch_part(p: *const u8, len: usize, i: usize, parts: usize) {
    let lines = len / 64;
    for l in i * lines / parts..(i + 1) * lines / parts {
        _mm_prefetch::<_MM_HINT_T2>(p.wrapping_add(64 * l).cast());
    }
}

/// One packed Q4_K group (`Q5`: Q5_K; `nb` super-blocks at `g`) against `R` activation rows; `next` is
/// prefetched a block's share per block (the weights stream from memory in decode).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k_group<const R: usize, const Q5: bool>(
    nb: usize,
    g: *const u8,
    a: [*const u8; R],
    next: *const u8,
) -> [[f32; GROUP]; R] {
    let m4 = _mm512_set1_epi8(0x0F);
    let m10 = _mm512_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let zi = _mm512_setzero_si512();
    let len = if Q5 { Q5_BLOCK } else { Q4_BLOCK };
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let blk = g.add(b * len);
        let ahead = next.wrapping_add(b * len);
        let mut y = [std::ptr::null::<u8>(); R];
        for r in 0..R {
            y[r] = a[r].add(b * AB);
        }
        let mut isum = [zi; R];
        for p in 0..4 {
            let mut al = [zi; R];
            let mut ah = [zi; R];
            for c in 0..8 {
                prefetch_part(ahead, len, 8 * p + c, 32);
                let v = _mm512_loadu_si512(blk.add(Q4_Q + 64 * (8 * p + c)).cast());
                let mut lo = _mm512_and_si512(v, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if Q5 {
                    let qh = _mm512_loadu_si512(blk.add(Q5_QH + 64 * c).cast());
                    let (l5, h5) = fifth_bits!(
                        p,
                        qh,
                        m10,
                        _mm512_slli_epi16,
                        _mm512_srli_epi16,
                        _mm512_and_si512
                    );
                    lo = _mm512_or_si512(lo, l5);
                    hi = _mm512_or_si512(hi, h5);
                }
                for r in 0..R {
                    let yq = y[r].add(Y_QS + 64 * p + 4 * c);
                    al[r] = _mm512_dpbusd_epi32(al[r], lo, bcast32(yq));
                    ah[r] = _mm512_dpbusd_epi32(ah[r], hi, bcast32(yq.add(32)));
                }
            }
            let sl = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(Q4_SC + 32 * p).cast()));
            let sh = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(Q4_SC + 32 * p + 16).cast()));
            for r in 0..R {
                let s =
                    _mm512_add_epi32(_mm512_mullo_epi32(al[r], sl), _mm512_mullo_epi32(ah[r], sh));
                isum[r] = _mm512_add_epi32(isum[r], s);
            }
        }
        // The activation's sums per 32 (pairs of its per-16 sums, at most 32 · 128: i16), as i16 pairs
        // (sub-blocks 2t, 2t+1) to broadcast against the minimum pairs.
        let mut bs = [[0i32; 8]; R];
        for r in 0..R {
            let s32 = _mm256_madd_epi16(_mm256_loadu_si256(y[r].add(Y_BSUMS).cast()), ones);
            _mm256_storeu_si256(bs[r].as_mut_ptr().cast(), _mm256_packs_epi32(s32, s32));
        }
        let mut msum = [zi; R];
        for (t, k) in [0usize, 1, 4, 5].into_iter().enumerate() {
            let mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(Q4_MN + 32 * t).cast()));
            for r in 0..R {
                msum[r] = _mm512_dpwssd_epi32(msum[r], mn, _mm512_set1_epi32(bs[r][k]));
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(Q4_D).cast()));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(Q4_DMIN).cast()));
        for r in 0..R {
            // The reference's f32 steps per lane: sum += (d·yd)·isum − (dmin·yd)·msum.
            let yd = _mm512_set1_ps(load_f32(y[r]));
            let t = _mm512_sub_ps(
                _mm512_mul_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(isum[r])),
                _mm512_mul_ps(_mm512_mul_ps(dmin, yd), _mm512_cvtepi32_ps(msum[r])),
            );
            acc[r] = _mm512_add_ps(acc[r], t);
        }
    }
    let mut out = [[0f32; GROUP]; R];
    for r in 0..R {
        _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
    }
    out
}

/// `acc` += `q` (u8) · the 4 activation bytes at `p` (i8, broadcast) per lane, the broadcast as the instruction's
/// memory operand: written as intrinsics, the compiler hoisted the 8 rows' broadcasts into registers and spilled
/// them. (A macro: the caller's AVX-512 target features cover the asm.)
macro_rules! dpbusd_bcast {
    ($acc:expr, $q:expr, $p:expr) => {
        std::arch::asm!(
            "vpdpbusd {acc}, {q}, dword ptr [{p}]{{1to16}}",
            acc = inout(zmm_reg) $acc,
            q = in(zmm_reg) $q,
            p = in(reg) $p,
            options(pure, readonly, nostack, preserves_flags)
        )
    };
}

/// The scale of sub-block `2t + half` from the 16-bit pair `t` of Q6_K scales (per 32-bit lane), sign-extended.
#[inline(always)]
unsafe fn q6_half_scale(pair: __m512i, half: usize) -> __m512i {
    if half == 0 {
        _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16)
    } else {
        _mm512_srai_epi32(pair, 16)
    }
}

/// One packed Q6_K group against `R` activation rows (see [`q4_k_group`]). The sub-block sums go packed vector
/// by vector (four running sums a row: k = 0..4), or with `K_OUTER` one sub-block k at a time (one running sum a
/// row, so 8 rows fit the registers; each packed vector is then loaded twice, its top bits four times: free where
/// a group's block sits in L1 for 8 rows, as in prefill, and not in decode, where the weights stream from
/// memory). The same integers and f32 steps either way, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_group<const R: usize, const K_OUTER: bool>(
    nb: usize,
    g: *const u8,
    a: [*const u8; R],
    next: *const u8,
) -> [[f32; GROUP]; R] {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let zi = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let blk = g.add(b * Q6_BLOCK);
        let ahead = next.wrapping_add(b * Q6_BLOCK);
        let mut y = [std::ptr::null::<u8>(); R];
        for r in 0..R {
            y[r] = a[r].add(b * AB);
        }
        // Scale pairs (i16) of sub-blocks 2t, 2t+1 per lane.
        let sc =
            |t: usize| _mm512_cvtepi8_epi16(_mm256_loadu_si256(blk.add(Q6_SC + 32 * t).cast()));
        let mut isum = [zi; R];
        if K_OUTER {
            for h in 0..2 {
                for k in 0..4 {
                    prefetch_part(ahead, Q6_BLOCK, 4 * h + k, 8);
                    let pair = sc(4 * h + k);
                    for half in 0..2 {
                        // Sub-block 8h + 2k + half: elements 128h + 32k + 16·half .. +16, vectors c = 4·half .. +4.
                        let mut s = [zi; R];
                        for c in 4 * half..4 * half + 4 {
                            let l = _mm512_loadu_si512(
                                blk.add(Q6_QL + 64 * (16 * h + 8 * (k % 2) + c)).cast(),
                            );
                            let qh = _mm512_loadu_si512(blk.add(Q6_QH + 64 * (8 * h + c)).cast());
                            let lo = if k < 2 { l } else { _mm512_srli_epi16(l, 4) };
                            let top = match k {
                                0 => _mm512_slli_epi16(qh, 4),
                                1 => _mm512_slli_epi16(qh, 2),
                                2 => qh,
                                _ => _mm512_srli_epi16(qh, 2),
                            };
                            let q = _mm512_or_si512(
                                _mm512_and_si512(lo, m4),
                                _mm512_and_si512(top, m30),
                            );
                            for r in 0..R {
                                dpbusd_bcast!(s[r], q, y[r].add(Y_QS + 128 * h + 32 * k + 4 * c));
                            }
                        }
                        let scale = q6_half_scale(pair, half);
                        for r in 0..R {
                            isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s[r], scale));
                        }
                    }
                }
            }
        } else {
            for h in 0..2 {
                for half in 0..2 {
                    // Sub-blocks 8h + 2k + half, k = 0..4: elements 128h + 32k + 16·half .. +16.
                    let mut s4 = [[zi; R]; 4];
                    for c in 4 * half..4 * half + 4 {
                        prefetch_part(ahead, Q6_BLOCK, 8 * h + 4 * half + c % 4, 16);
                        let l0 = _mm512_loadu_si512(blk.add(Q6_QL + 64 * (16 * h + c)).cast());
                        let l1 = _mm512_loadu_si512(blk.add(Q6_QL + 64 * (16 * h + 8 + c)).cast());
                        let qh = _mm512_loadu_si512(blk.add(Q6_QH + 64 * (8 * h + c)).cast());
                        // Element 128h + 32k + l: low nibble of l0/l1 (k = 0, 1) or high nibble (k = 2, 3), top
                        // bits 2k, 2k+1 of qh moved to bits 4, 5 (16-bit shifts: the masks drop what crosses bytes).
                        let q = [
                            _mm512_or_si512(
                                _mm512_and_si512(l0, m4),
                                _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30),
                            ),
                            _mm512_or_si512(
                                _mm512_and_si512(l1, m4),
                                _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30),
                            ),
                            _mm512_or_si512(
                                _mm512_and_si512(_mm512_srli_epi16(l0, 4), m4),
                                _mm512_and_si512(qh, m30),
                            ),
                            _mm512_or_si512(
                                _mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                                _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30),
                            ),
                        ];
                        for (k, q) in q.into_iter().enumerate() {
                            for r in 0..R {
                                let yq = y[r].add(Y_QS + 128 * h + 32 * k + 4 * c);
                                s4[k][r] = _mm512_dpbusd_epi32(s4[k][r], q, bcast32(yq));
                            }
                        }
                    }
                    for (k, s4) in s4.iter().enumerate() {
                        // Scale of sub-block s = 8h + 2k + half: half of pair t = 4h + k.
                        let s = q6_half_scale(sc(4 * h + k), half);
                        for r in 0..R {
                            isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s4[r], s));
                        }
                    }
                }
            }
        }
        // Quants are stored +32: subtract 32 · Σ scale · bsum (the activation's per-16 sums, read as pairs).
        let mut off = [zi; R];
        for t in 0..8 {
            let pair = sc(t);
            for r in 0..R {
                let bs = std::ptr::read_unaligned(y[r].add(Y_BSUMS + 4 * t).cast::<i32>());
                off[r] = _mm512_dpwssd_epi32(off[r], pair, _mm512_set1_epi32(bs));
            }
        }
        let d = _mm512_loadu_ps(blk.add(Q6_D).cast());
        for r in 0..R {
            let isum = _mm512_sub_epi32(isum[r], _mm512_slli_epi32(off[r], 5));
            // The reference's f32 step per lane: sum += (d·yd)·isum.
            let yd = _mm512_set1_ps(load_f32(y[r]));
            acc[r] = _mm512_add_ps(
                acc[r],
                _mm512_mul_ps(_mm512_mul_ps(d, yd), _mm512_cvtepi32_ps(isum)),
            );
        }
    }
    let mut out = [[0f32; GROUP]; R];
    for r in 0..R {
        _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]);
    }
    out
}

/// [`q4_k_group`] in AVX2 (no VNNI, 16 vector registers): the group's two halves of 8 rows (the low and high
/// 32 bytes of each packed vector) one after the other, `vpdpbusd` as `vpmaddubsw` + `vpmaddwd` (at most
/// 2 · 31 · 128 in i16: no saturation). Same integers and f32 steps, so the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_group_avx2<const R: usize, const Q5: bool>(
    nb: usize,
    g: *const u8,
    a: [*const u8; R],
    next: *const u8,
) -> [[f32; GROUP]; R] {
    type S = super::Avx2;
    let m4 = _mm256_set1_epi8(0x0F);
    let m10 = _mm256_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let zi = _mm256_setzero_si256();
    let len = if Q5 { Q5_BLOCK } else { Q4_BLOCK };
    let mut out = [[0f32; GROUP]; R];
    for half in 0..2 {
        let (hq, h8) = (32 * half, 8 * half);
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let blk = g.add(b * len);
            let ahead = next.wrapping_add(b * len);
            let mut y = [std::ptr::null::<u8>(); R];
            for r in 0..R {
                y[r] = a[r].add(b * AB);
            }
            let mut isum = [zi; R];
            for p in 0..4 {
                let mut al = [zi; R];
                let mut ah = [zi; R];
                for c in 0..8 {
                    if half == 0 {
                        prefetch_part(ahead, len, 8 * p + c, 32);
                    }
                    let v = _mm256_loadu_si256(blk.add(Q4_Q + 64 * (8 * p + c) + hq).cast());
                    let mut lo = _mm256_and_si256(v, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if Q5 {
                        let qh = _mm256_loadu_si256(blk.add(Q5_QH + 64 * c + hq).cast());
                        let (l5, h5) = fifth_bits!(
                            p,
                            qh,
                            m10,
                            _mm256_slli_epi16,
                            _mm256_srli_epi16,
                            _mm256_and_si256
                        );
                        lo = _mm256_or_si256(lo, l5);
                        hi = _mm256_or_si256(hi, h5);
                    }
                    for r in 0..R {
                        let yq = y[r].add(Y_QS + 64 * p + 4 * c);
                        al[r] = S::dot_u8i8(al[r], lo, bcast32_256(yq));
                        ah[r] = S::dot_u8i8(ah[r], hi, bcast32_256(yq.add(32)));
                    }
                }
                let sl = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(Q4_SC + 32 * p + h8).cast()));
                let sh =
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(Q4_SC + 32 * p + 16 + h8).cast()));
                for r in 0..R {
                    let s = _mm256_add_epi32(
                        _mm256_mullo_epi32(al[r], sl),
                        _mm256_mullo_epi32(ah[r], sh),
                    );
                    isum[r] = _mm256_add_epi32(isum[r], s);
                }
            }
            let mut bs = [[0i32; 8]; R];
            for r in 0..R {
                let s32 = _mm256_madd_epi16(_mm256_loadu_si256(y[r].add(Y_BSUMS).cast()), ones);
                _mm256_storeu_si256(bs[r].as_mut_ptr().cast(), _mm256_packs_epi32(s32, s32));
            }
            let mut msum = [zi; R];
            for (t, k) in [0usize, 1, 4, 5].into_iter().enumerate() {
                let mn =
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(Q4_MN + 32 * t + 2 * h8).cast()));
                for r in 0..R {
                    msum[r] = S::madd_acc(msum[r], mn, _mm256_set1_epi32(bs[r][k]));
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(Q4_D + 2 * h8).cast()));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(Q4_DMIN + 2 * h8).cast()));
            for r in 0..R {
                let yd = _mm256_set1_ps(load_f32(y[r]));
                let t = _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(d, yd), _mm256_cvtepi32_ps(isum[r])),
                    _mm256_mul_ps(_mm256_mul_ps(dmin, yd), _mm256_cvtepi32_ps(msum[r])),
                );
                acc[r] = _mm256_add_ps(acc[r], t);
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr().add(h8), acc[r]);
        }
    }
    out
}

/// [`q6_k_group`] in AVX2, two halves of 8 rows as in [`q4_k_group_avx2`] (at most 2 · 63 · 128 in i16).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_group_avx2<const R: usize>(
    nb: usize,
    g: *const u8,
    a: [*const u8; R],
    next: *const u8,
) -> [[f32; GROUP]; R] {
    type S = super::Avx2;
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let zi = _mm256_setzero_si256();
    let mut out = [[0f32; GROUP]; R];
    for half_rows in 0..2 {
        let (hq, h8) = (32 * half_rows, 8 * half_rows);
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let blk = g.add(b * Q6_BLOCK);
            let ahead = next.wrapping_add(b * Q6_BLOCK);
            let mut y = [std::ptr::null::<u8>(); R];
            for r in 0..R {
                y[r] = a[r].add(b * AB);
            }
            let sc = |t: usize| {
                _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(Q6_SC + 32 * t + 2 * h8).cast()))
            };
            let mut isum = [zi; R];
            for h in 0..2 {
                for half in 0..2 {
                    let mut s4 = [[zi; R]; 4];
                    for c in 4 * half..4 * half + 4 {
                        if half_rows == 0 {
                            prefetch_part(ahead, Q6_BLOCK, 8 * h + 4 * half + c % 4, 16);
                        }
                        let l0 = _mm256_loadu_si256(blk.add(Q6_QL + 64 * (16 * h + c) + hq).cast());
                        let l1 =
                            _mm256_loadu_si256(blk.add(Q6_QL + 64 * (16 * h + 8 + c) + hq).cast());
                        let qh = _mm256_loadu_si256(blk.add(Q6_QH + 64 * (8 * h + c) + hq).cast());
                        let q = [
                            _mm256_or_si256(
                                _mm256_and_si256(l0, m4),
                                _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(l1, m4),
                                _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_and_si256(qh, m30),
                            ),
                            _mm256_or_si256(
                                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                            ),
                        ];
                        for (k, q) in q.into_iter().enumerate() {
                            for r in 0..R {
                                let yq = y[r].add(Y_QS + 128 * h + 32 * k + 4 * c);
                                s4[k][r] = S::dot_u8i8(s4[k][r], q, bcast32_256(yq));
                            }
                        }
                    }
                    for (k, s4) in s4.iter().enumerate() {
                        let pair = sc(4 * h + k);
                        let s = if half == 0 {
                            _mm256_srai_epi32(_mm256_slli_epi32(pair, 16), 16)
                        } else {
                            _mm256_srai_epi32(pair, 16)
                        };
                        for r in 0..R {
                            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(s4[r], s));
                        }
                    }
                }
            }
            let mut off = [zi; R];
            for t in 0..8 {
                let pair = sc(t);
                for r in 0..R {
                    let bs = std::ptr::read_unaligned(y[r].add(Y_BSUMS + 4 * t).cast::<i32>());
                    off[r] = S::madd_acc(off[r], pair, _mm256_set1_epi32(bs));
                }
            }
            let d = _mm256_loadu_ps(blk.add(Q6_D + 4 * h8).cast());
            for r in 0..R {
                let isum = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(off[r], 5));
                let yd = _mm256_set1_ps(load_f32(y[r]));
                acc[r] = _mm256_add_ps(
                    acc[r],
                    _mm256_mul_ps(_mm256_mul_ps(d, yd), _mm256_cvtepi32_ps(isum)),
                );
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr().add(h8), acc[r]);
        }
    }
    out
}

/// 4 activation bytes at `p` in every lane of a 256-bit vector.
#[inline(always)]
unsafe fn bcast32_256(p: *const u8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()))
}

/// One packed group (of `q`; `nb` super-blocks at `g`, the next group at `next` to prefetch)
/// against `n_act` ≤ [`MAX_ACT`] activation rows `a_stride` bytes apart; `out[j][i]` = row `i` · activation
/// row `j`. `vnni`: the AVX-512 VNNI kernel, else the AVX2 one (same results).
///
/// # Safety
/// `g` must hold a whole packed group of `nb` blocks, `a` `n_act` Q8_K rows of `nb` blocks, and the CPU must
/// have AVX2, FMA and F16C, and with `vnni` AVX-512 F/BW/VL and VNNI.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_group(
    vnni: bool,
    q: KQuant,
    nb: usize,
    g: *const u8,
    next: *const u8,
    a: *const u8,
    a_stride: usize,
    n_act: usize,
    out: &mut [[f32; GROUP]; MAX_ACT],
) {
    macro_rules! body {
        ($r:literal, $rows:expr) => {
            match (vnni, q) {
                (true, KQuant::Q4) => q4_k_group::<$r, false>(nb, g, $rows, next),
                (true, KQuant::Q5) => q4_k_group::<$r, true>(nb, g, $rows, next),
                (true, KQuant::Q6) => q6_k_group::<$r, { $r == 8 }>(nb, g, $rows, next),
                (false, KQuant::Q4) => q4_k_group_avx2::<$r, false>(nb, g, $rows, next),
                (false, KQuant::Q5) => q4_k_group_avx2::<$r, true>(nb, g, $rows, next),
                (false, KQuant::Q6) => q6_k_group_avx2::<$r>(nb, g, $rows, next),
            }
        };
    }
    let mut j = 0;
    while j < n_act {
        let aj = a.add(j * a_stride);
        let left = n_act - j;
        // Eight rows a pass halve the unpacking per product (Q6_K in its k-outer order, whose sums fit).
        if left >= 8 && vnni {
            let rows = std::array::from_fn(|i| aj.add(i * a_stride));
            out[j..j + 8].copy_from_slice(&body!(8, rows));
            j += 8;
        } else if left >= 4 && vnni {
            let rows = [
                aj,
                aj.add(a_stride),
                aj.add(2 * a_stride),
                aj.add(3 * a_stride),
            ];
            out[j..j + 4].copy_from_slice(&body!(4, rows));
            j += 4;
        } else if left >= 2 {
            out[j..j + 2].copy_from_slice(&body!(2, [aj, aj.add(a_stride)]));
            j += 2;
        } else {
            out[j] = body!(1, [aj])[0];
            j += 1;
        }
    }
}

/// Packs row `l` (0..16) of a group: its `nb` Q4_K blocks (GGUF layout, `w`) into the group's blocks (`dst`).
pub(crate) fn pack_q4_k_row(nb: usize, w: &[u8], l: usize, dst: &mut [u8]) {
    use crate::blocks::BlockQ4K;
    let wb = size_of::<BlockQ4K>();
    for b in 0..nb {
        let x: BlockQ4K = bytemuck::pod_read_unaligned(&w[b * wb..(b + 1) * wb]);
        let o = &mut dst[b * Q4_BLOCK..(b + 1) * Q4_BLOCK];
        pack_q4_k_part(x.d, x.dmin, &x.scales, &x.qs, l, o);
    }
}

/// Packs row `l` (0..16) of a group: its `nb` Q5_K blocks into the group's blocks (Q4_K's layout, then the
/// fifth bits).
pub(crate) fn pack_q5_k_row(nb: usize, w: &[u8], l: usize, dst: &mut [u8]) {
    use crate::blocks::BlockQ5K;
    let wb = size_of::<BlockQ5K>();
    for b in 0..nb {
        let x: BlockQ5K = bytemuck::pod_read_unaligned(&w[b * wb..(b + 1) * wb]);
        let o = &mut dst[b * Q5_BLOCK..(b + 1) * Q5_BLOCK];
        pack_q4_k_part(x.d, x.dmin, &x.scales, &x.qs, l, o);
        for c in 0..8 {
            let at = Q5_QH + 64 * c + 4 * l;
            o[at..at + 4].copy_from_slice(&x.qh[4 * c..4 * c + 4]);
        }
    }
}

/// The part of a packed block Q4_K and Q5_K share: scales, minimums and the 4-bit quants of row `l`.
fn pack_q4_k_part(
    d: half::f16,
    dmin: half::f16,
    scales: &[u8; 12],
    qs: &[u8; QK_K / 2],
    l: usize,
    o: &mut [u8],
) {
    o[Q4_D + 2 * l..Q4_D + 2 * l + 2].copy_from_slice(&d.to_le_bytes());
    o[Q4_DMIN + 2 * l..Q4_DMIN + 2 * l + 2].copy_from_slice(&dmin.to_le_bytes());
    for s in 0..8 {
        let (sc, m) = crate::dot::scalar::scale_min_k4(s, scales);
        o[Q4_SC + 16 * s + l] = sc;
        o[Q4_MN + 32 * (s / 2) + 2 * l + s % 2] = m;
    }
    for v in 0..32 {
        let (p, c) = (v / 8, v % 8);
        let at = Q4_Q + 64 * v + 4 * l;
        o[at..at + 4].copy_from_slice(&qs[32 * p + 4 * c..32 * p + 4 * c + 4]);
    }
}

/// Packs row `l` (0..16) of a group: its `nb` Q6_K blocks into the group's blocks (see [`pack_q4_k_row`]).
pub(crate) fn pack_q6_k_row(nb: usize, w: &[u8], l: usize, dst: &mut [u8]) {
    use crate::blocks::BlockQ6K;
    let wb = size_of::<BlockQ6K>();
    for b in 0..nb {
        let x: BlockQ6K = bytemuck::pod_read_unaligned(&w[b * wb..(b + 1) * wb]);
        let o = &mut dst[b * Q6_BLOCK..(b + 1) * Q6_BLOCK];
        o[Q6_D + 4 * l..Q6_D + 4 * l + 4].copy_from_slice(&x.d.to_f32().to_le_bytes());
        for s in 0..16 {
            o[Q6_SC + 32 * (s / 2) + 2 * l + s % 2] = x.scales[s] as u8;
        }
        for v in 0..32 {
            // v = 16h + 8k + c: ql bytes 64h + 32k + 4c.
            let at = Q6_QL + 64 * v + 4 * l;
            o[at..at + 4].copy_from_slice(&x.ql[4 * v..4 * v + 4]);
        }
        for v in 0..16 {
            // v = 8h + c: qh bytes 32h + 4c.
            let at = Q6_QH + 64 * v + 4 * l;
            o[at..at + 4].copy_from_slice(&x.qh[4 * v..4 * v + 4]);
        }
    }
}
