//! x86 kernels for the float types and the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL).
//!
//! Block kernels: one 32-element block per 256-bit vector (the integer dot of a block fills 8 i32 lanes),
//! scaled to float and accumulated with FMA. Blocks go four at a time, one accumulator each, so consecutive
//! blocks never wait on each other's FMA; the four blocks' f16 scale pairs (weight `d`,`m`/activation `d`,`s`)
//! are converted with one `vcvtph2ps` and multiplied with one `vmulps`, because per-block scalar f16
//! conversions cost more than the integer dot itself. The VNNI variant replaces `maddubs + madd + add` by one
//! `vpdpbusd`; 512-bit vectors would need two blocks' scales spread over one vector, which costs more
//! shuffles than it saves for blocks this small.

use super::{dot_kernels, hsum_ps, load_f16, Simd};
use crate::blocks::{
    BlockIq4Nl, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK,
};
use crate::iquants::IQ4_NL_VALUES;
use crate::GgmlType;
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

/// The 32 nibbles of a legacy block as bytes in element order: low nibbles (elements 0..16), then high.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.cast()));
    // Shifting the upper copy right by 4 brings each byte's high nibble down (the bits shifted in from the
    // next byte are masked off).
    let q = _mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    _mm256_and_si256(q, _mm256_set1_epi8(0xF))
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    std::ptr::read_unaligned(p.cast::<i32>())
}

/// A legacy weight format against its activation format.
trait Legacy {
    /// Weight and activation block bytes.
    const WB: usize;
    const AB: usize;
    /// Whether the second f16 of each header pair (weight `m` × activation `s`) is part of the dot.
    const MIN: bool;
    /// The weight block at `x` as 32 bytes in element order.
    unsafe fn weights(x: *const u8) -> __m256i;
    /// The exact integer dot of prepared weights with the activation quants at `y`, in 8 i32 lanes.
    unsafe fn idot<S: Simd>(xq: __m256i, y: *const u8) -> __m256i;
}

/// Signed weight bytes `x` times signed activation bytes `y` via the unsigned × signed instruction:
/// |x| · (y with x's sign).
#[inline(always)]
unsafe fn dot_i8i8<S: Simd>(x: __m256i, y: __m256i) -> __m256i {
    S::dot_u8i8(
        _mm256_setzero_si256(),
        _mm256_sign_epi8(x, x),
        _mm256_sign_epi8(y, x),
    )
}

struct Q4_0;
impl Legacy for Q4_0 {
    const WB: usize = size_of::<BlockQ4_0>();
    const AB: usize = size_of::<BlockQ8_0>();
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn weights(x: *const u8) -> __m256i {
        _mm256_sub_epi8(
            nibbles(x.add(offset_of!(BlockQ4_0, qs))),
            _mm256_set1_epi8(8),
        )
    }
    #[inline(always)]
    unsafe fn idot<S: Simd>(xq: __m256i, y: *const u8) -> __m256i {
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_0, qs)).cast());
        dot_i8i8::<S>(xq, yq)
    }
}

struct Q4_1;
impl Legacy for Q4_1 {
    const WB: usize = size_of::<BlockQ4_1>();
    const AB: usize = size_of::<BlockQ8_1>();
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn weights(x: *const u8) -> __m256i {
        nibbles(x.add(offset_of!(BlockQ4_1, qs)))
    }
    #[inline(always)]
    unsafe fn idot<S: Simd>(xq: __m256i, y: *const u8) -> __m256i {
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_1, qs)).cast());
        S::dot_u8i8(_mm256_setzero_si256(), xq, yq)
    }
}

struct Q8_0;
impl Legacy for Q8_0 {
    const WB: usize = size_of::<BlockQ8_0>();
    const AB: usize = size_of::<BlockQ8_0>();
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn weights(x: *const u8) -> __m256i {
        _mm256_loadu_si256(x.add(offset_of!(BlockQ8_0, qs)).cast())
    }
    #[inline(always)]
    unsafe fn idot<S: Simd>(xq: __m256i, y: *const u8) -> __m256i {
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_0, qs)).cast());
        dot_i8i8::<S>(xq, yq)
    }
}

/// The 32 bits of a Q5 block's `qh` (at `p`) as bytes: 0xFF for a set bit, 0 for a clear one.
#[inline(always)]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let v = _mm256_set1_epi32(rd32(p));
    // Byte j takes byte j / 8 of qh (each 128-bit lane holds the word), then tests bit j % 8.
    let spread = _mm256_shuffle_epi8(
        v,
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

struct Q5_0;
impl Legacy for Q5_0 {
    const WB: usize = size_of::<BlockQ5_0>();
    const AB: usize = size_of::<BlockQ8_0>();
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn weights(x: *const u8) -> __m256i {
        let lo = nibbles(x.add(offset_of!(BlockQ5_0, qs)));
        // q - 16 as a signed byte: the nibble with 0xF0 or'ed in where the fifth bit is clear.
        let hi = _mm256_andnot_si256(
            fifth_bits(x.add(offset_of!(BlockQ5_0, qh))),
            _mm256_set1_epi8(0xF0u8 as i8),
        );
        _mm256_or_si256(lo, hi)
    }
    #[inline(always)]
    unsafe fn idot<S: Simd>(xq: __m256i, y: *const u8) -> __m256i {
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_0, qs)).cast());
        dot_i8i8::<S>(xq, yq)
    }
}

struct Q5_1;
impl Legacy for Q5_1 {
    const WB: usize = size_of::<BlockQ5_1>();
    const AB: usize = size_of::<BlockQ8_1>();
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn weights(x: *const u8) -> __m256i {
        let lo = nibbles(x.add(offset_of!(BlockQ5_1, qs)));
        let hi = _mm256_and_si256(
            fifth_bits(x.add(offset_of!(BlockQ5_1, qh))),
            _mm256_set1_epi8(0x10),
        );
        _mm256_or_si256(lo, hi)
    }
    #[inline(always)]
    unsafe fn idot<S: Simd>(xq: __m256i, y: *const u8) -> __m256i {
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_1, qs)).cast());
        S::dot_u8i8(_mm256_setzero_si256(), xq, yq)
    }
}

struct Iq4Nl;
impl Legacy for Iq4Nl {
    const WB: usize = size_of::<BlockIq4Nl>();
    const AB: usize = size_of::<BlockQ8_0>();
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn weights(x: *const u8) -> __m256i {
        // The nibbles index the 16-entry codebook: one byte shuffle looks all 32 up.
        let table = _mm_loadu_si128(IQ4_NL_VALUES.as_ptr().cast());
        _mm256_shuffle_epi8(
            _mm256_set_m128i(table, table),
            nibbles(x.add(offset_of!(BlockIq4Nl, qs))),
        )
    }
    #[inline(always)]
    unsafe fn idot<S: Simd>(xq: __m256i, y: *const u8) -> __m256i {
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_0, qs)).cast());
        dot_i8i8::<S>(xq, yq)
    }
}

/// The first 4 header bytes (two f16) of 4 consecutive blocks `stride` bytes apart, as 8 f32. For formats with
/// one f16 header (`MIN` false) the odd lanes are quant bytes read as f16: meaningless and never used (masking
/// them was measured slightly slower, and they cannot trap: FP exceptions are masked).
#[inline(always)]
unsafe fn headers4(p: *const u8, stride: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_setr_epi32(
        rd32(p),
        rd32(p.add(stride)),
        rd32(p.add(2 * stride)),
        rd32(p.add(3 * stride)),
    ))
}

/// The header of one block as in [`headers4`], in lanes 0 and 1.
#[inline(always)]
unsafe fn header1(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(p)))
}

#[inline(always)]
unsafe fn lane(v: __m256, k: i32) -> __m256 {
    _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(k))
}

/// One weight row against `R` activation rows. Each row's arithmetic (operations, operands, order) is the
/// same whatever `R` is: the weights are decoded once and shared, nothing else is. That makes a row's result
/// bit-identical whether it is computed alone or with others (batch invariance).
///
/// Blocks go four at a time, one accumulator each; lanes 2k and 2k+1 of the header product hold block k's
/// d_x·d_y and (Q4_1) m·s. The last nb % 4 blocks go one at a time into the first accumulator.
#[inline(always)]
unsafe fn legacy_body<L: Legacy, S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    let nb = n / QK;
    let z = _mm256_setzero_ps();
    let mut acc = [[z; 4]; R];
    // Lanes 1, 3, 5, 7: the running sums of m·s (Q4_1).
    let mut mins = [z; R];
    let mut i = 0;
    while i + 4 <= nb {
        let x = w.add(i * L::WB);
        let xh = headers4(x, L::WB);
        // Not `array::from_fn`: its closure runs inside core's generic code, which lacks this function's
        // target features, so nothing in it would inline (measured: 60x slower).
        let xq = [
            L::weights(x),
            L::weights(x.add(L::WB)),
            L::weights(x.add(2 * L::WB)),
            L::weights(x.add(3 * L::WB)),
        ];
        for r in 0..R {
            let y = a[r].add(i * L::AB);
            let sc = _mm256_mul_ps(xh, headers4(y, L::AB));
            if L::MIN {
                mins[r] = _mm256_add_ps(mins[r], sc);
            }
            for k in 0..4 {
                let p = _mm256_cvtepi32_ps(L::idot::<S>(xq[k], y.add(k * L::AB)));
                acc[r][k] = _mm256_fmadd_ps(lane(sc, 2 * k as i32), p, acc[r][k]);
            }
        }
        i += 4;
    }
    while i < nb {
        let x = w.add(i * L::WB);
        let xh = header1(x);
        let xq = L::weights(x);
        for r in 0..R {
            let y = a[r].add(i * L::AB);
            let sc = _mm_mul_ps(xh, header1(y));
            if L::MIN {
                mins[r] = _mm256_add_ps(mins[r], _mm256_zextps128_ps256(sc));
            }
            let p = _mm256_cvtepi32_ps(L::idot::<S>(xq, y));
            acc[r][0] = _mm256_fmadd_ps(_mm256_broadcastss_ps(sc), p, acc[r][0]);
        }
        i += 1;
    }
    // A loop, not a closure: a closure borrowing the accumulators keeps them in memory (a store per FMA).
    let mut out = [0.0f32; R];
    for r in 0..R {
        let [a0, a1, a2, a3] = acc[r];
        out[r] = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        if L::MIN {
            out[r] += hsum_ps(_mm256_blend_ps(mins[r], z, 0b0101_0101));
        }
    }
    out
}

#[inline(always)]
unsafe fn q4_0_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    legacy_body::<Q4_0, S, R>(n, w, a)
}
dot_kernels!(GgmlType::Q4_0, GgmlType::Q8_0, q4_0_body, q4_0, 1);

#[inline(always)]
unsafe fn q4_1_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    legacy_body::<Q4_1, S, R>(n, w, a)
}
dot_kernels!(GgmlType::Q4_1, GgmlType::Q8_1, q4_1_body, q4_1, 1);

#[inline(always)]
unsafe fn q8_0_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    legacy_body::<Q8_0, S, R>(n, w, a)
}
dot_kernels!(GgmlType::Q8_0, GgmlType::Q8_0, q8_0_body, q8_0, 1);

#[inline(always)]
unsafe fn q5_0_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    legacy_body::<Q5_0, S, R>(n, w, a)
}
dot_kernels!(GgmlType::Q5_0, GgmlType::Q8_0, q5_0_body, q5_0, 1);

#[inline(always)]
unsafe fn q5_1_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    legacy_body::<Q5_1, S, R>(n, w, a)
}
dot_kernels!(GgmlType::Q5_1, GgmlType::Q8_1, q5_1_body, q5_1, 1);

#[inline(always)]
unsafe fn iq4_nl_body<S: Simd, const R: usize>(
    n: usize,
    w: *const u8,
    a: [*const u8; R],
) -> [f32; R] {
    legacy_body::<Iq4Nl, S, R>(n, w, a)
}
dot_kernels!(GgmlType::IQ4_NL, GgmlType::Q8_0, iq4_nl_body, iq4_nl, 1);

/// Float rows: `$load` turns a pointer to `$lanes` weights into f32 lanes; four accumulators hide FMA latency;
/// the tail (n % (4 · lanes)) is summed in scalar order.
macro_rules! float_kernel {
    ($name:ident, $wt:expr, $feat:literal, $lanes:expr, $elem:expr, $zero:expr, $fma:path, $add:path,
     $loada:path, $load:expr, $hsum:expr, $tail:expr) => {
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            #[target_feature(enable = $feat)]
            unsafe fn imp(n: usize, w: *const u8, a: *const u8) -> f32 {
                let a = a.cast::<f32>();
                let step = 4 * $lanes;
                let mut acc = [$zero; 4];
                let mut i = 0;
                while i + step <= n {
                    for (k, acc) in acc.iter_mut().enumerate() {
                        let j = i + k * $lanes;
                        *acc = $fma($load(w.add(j * $elem)), $loada(a.add(j)), *acc);
                    }
                    i += step;
                }
                let mut sum = $hsum($add($add(acc[0], acc[1]), $add(acc[2], acc[3])));
                while i < n {
                    sum += $tail(w.add(i * $elem)) * std::ptr::read_unaligned(a.add(i));
                    i += 1;
                }
                sum
            }
            let (w, a) = crate::dot::rows($wt, GgmlType::F32, n, w, a);
            // SAFETY: `rows` checked the lengths; only handed out by `dot_fn` after checking the CPU features.
            unsafe { imp(n, w.as_ptr(), a.as_ptr()) }
        }
    };
}

#[inline(always)]
unsafe fn f32_8(p: *const u8) -> __m256 {
    _mm256_loadu_ps(p.cast())
}
#[inline(always)]
unsafe fn f16_8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
}
#[inline(always)]
unsafe fn bf16_8(p: *const u8) -> __m256 {
    // bf16 is the top half of an f32: widen and shift.
    _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())),
        16,
    ))
}
#[inline(always)]
unsafe fn f32_16(p: *const u8) -> __m512 {
    _mm512_loadu_ps(p.cast())
}
#[inline(always)]
unsafe fn f16_16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
}
#[inline(always)]
unsafe fn bf16_16(p: *const u8) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())),
        16,
    ))
}
#[inline(always)]
unsafe fn f32_1(p: *const u8) -> f32 {
    std::ptr::read_unaligned(p.cast::<f32>())
}
#[inline(always)]
unsafe fn bf16_1(p: *const u8) -> f32 {
    f32::from_bits((std::ptr::read_unaligned(p.cast::<u16>()) as u32) << 16)
}
#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    let h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    hsum_ps(h)
}
#[inline(always)]
unsafe fn loadu256(p: *const f32) -> __m256 {
    _mm256_loadu_ps(p)
}
#[inline(always)]
unsafe fn loadu512(p: *const f32) -> __m512 {
    _mm512_loadu_ps(p)
}

float_kernel!(
    f32_avx2,
    GgmlType::F32,
    "avx2,fma,f16c",
    8,
    4,
    _mm256_setzero_ps(),
    _mm256_fmadd_ps,
    _mm256_add_ps,
    loadu256,
    f32_8,
    hsum_ps,
    f32_1
);
float_kernel!(
    f16_avx2,
    GgmlType::F16,
    "avx2,fma,f16c",
    8,
    2,
    _mm256_setzero_ps(),
    _mm256_fmadd_ps,
    _mm256_add_ps,
    loadu256,
    f16_8,
    hsum_ps,
    load_f16
);
float_kernel!(
    bf16_avx2,
    GgmlType::BF16,
    "avx2,fma,f16c",
    8,
    2,
    _mm256_setzero_ps(),
    _mm256_fmadd_ps,
    _mm256_add_ps,
    loadu256,
    bf16_8,
    hsum_ps,
    bf16_1
);
float_kernel!(
    f32_avx512,
    GgmlType::F32,
    "avx2,fma,f16c,avx512f",
    16,
    4,
    _mm512_setzero_ps(),
    _mm512_fmadd_ps,
    _mm512_add_ps,
    loadu512,
    f32_16,
    hsum512,
    f32_1
);
float_kernel!(
    f16_avx512,
    GgmlType::F16,
    "avx2,fma,f16c,avx512f",
    16,
    2,
    _mm512_setzero_ps(),
    _mm512_fmadd_ps,
    _mm512_add_ps,
    loadu512,
    f16_16,
    hsum512,
    load_f16
);
float_kernel!(
    bf16_avx512,
    GgmlType::BF16,
    "avx2,fma,f16c,avx512f",
    16,
    2,
    _mm512_setzero_ps(),
    _mm512_fmadd_ps,
    _mm512_add_ps,
    loadu512,
    bf16_16,
    hsum512,
    bf16_1
);
