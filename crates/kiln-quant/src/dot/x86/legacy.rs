//! x86 kernels for the float types and the 32-element block formats (Q4_0, Q4_1, Q8_0).
//!
//! Block kernels: one 32-element block per 256-bit vector (the integer dot of a block fills 8 i32 lanes),
//! scaled to float and accumulated with FMA. Blocks go four at a time, one accumulator each, so consecutive
//! blocks never wait on each other's FMA; the four blocks' f16 scale pairs (weight `d`,`m`/activation `d`,`s`)
//! are converted with one `vcvtph2ps` and multiplied with one `vmulps`, because per-block scalar f16
//! conversions cost more than the integer dot itself. The VNNI variant replaces `maddubs + madd + add` by one
//! `vpdpbusd`; 512-bit vectors would need two blocks' scales spread over one vector, which costs more
//! shuffles than it saves for blocks this small.

use super::{dot_kernels, hsum_ps, load_f16, Simd};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
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
    /// The exact integer dot of the weight block at `x` with the activation block at `y`, in 8 i32 lanes.
    unsafe fn idot<S: Simd>(x: *const u8, y: *const u8) -> __m256i;
}

struct Q4_0;
impl Legacy for Q4_0 {
    const WB: usize = size_of::<BlockQ4_0>();
    const AB: usize = size_of::<BlockQ8_0>();
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn idot<S: Simd>(x: *const u8, y: *const u8) -> __m256i {
        let xq = _mm256_sub_epi8(
            nibbles(x.add(offset_of!(BlockQ4_0, qs))),
            _mm256_set1_epi8(8),
        );
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
    unsafe fn idot<S: Simd>(x: *const u8, y: *const u8) -> __m256i {
        let xq = nibbles(x.add(offset_of!(BlockQ4_1, qs)));
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
    unsafe fn idot<S: Simd>(x: *const u8, y: *const u8) -> __m256i {
        let xq = _mm256_loadu_si256(x.add(offset_of!(BlockQ8_0, qs)).cast());
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_0, qs)).cast());
        dot_i8i8::<S>(xq, yq)
    }
}

/// The header products of blocks `x + k·WB`, `y + k·AB` for k < 4: lanes 2k, 2k+1 hold d_x·d_y and the
/// product of the second f16s (m·s for Q4_1; meaningless, and unused, for formats whose header is one f16).
#[inline(always)]
unsafe fn scales4<L: Legacy>(x: *const u8, y: *const u8) -> __m256 {
    let xh = _mm_setr_epi32(
        rd32(x),
        rd32(x.add(L::WB)),
        rd32(x.add(2 * L::WB)),
        rd32(x.add(3 * L::WB)),
    );
    let yh = _mm_setr_epi32(
        rd32(y),
        rd32(y.add(L::AB)),
        rd32(y.add(2 * L::AB)),
        rd32(y.add(3 * L::AB)),
    );
    _mm256_mul_ps(_mm256_cvtph_ps(xh), _mm256_cvtph_ps(yh))
}

#[inline(always)]
unsafe fn lane(v: __m256, k: i32) -> __m256 {
    _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(k))
}

#[inline(always)]
unsafe fn legacy_body<L: Legacy, S: Simd>(n: usize, w: *const u8, a: *const u8) -> f32 {
    let nb = n / QK;
    let (mut acc0, mut acc1, mut acc2, mut acc3) = (
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
    );
    // Lanes 1, 3, 5, 7: the running sums of m·s (Q4_1).
    let mut mins = _mm256_setzero_ps();
    let mut i = 0;
    while i + 4 <= nb {
        let (x, y) = (w.add(i * L::WB), a.add(i * L::AB));
        let sc = scales4::<L>(x, y);
        if L::MIN {
            mins = _mm256_add_ps(mins, sc);
        }
        let p0 = _mm256_cvtepi32_ps(L::idot::<S>(x, y));
        let p1 = _mm256_cvtepi32_ps(L::idot::<S>(x.add(L::WB), y.add(L::AB)));
        let p2 = _mm256_cvtepi32_ps(L::idot::<S>(x.add(2 * L::WB), y.add(2 * L::AB)));
        let p3 = _mm256_cvtepi32_ps(L::idot::<S>(x.add(3 * L::WB), y.add(3 * L::AB)));
        acc0 = _mm256_fmadd_ps(lane(sc, 0), p0, acc0);
        acc1 = _mm256_fmadd_ps(lane(sc, 2), p1, acc1);
        acc2 = _mm256_fmadd_ps(lane(sc, 4), p2, acc2);
        acc3 = _mm256_fmadd_ps(lane(sc, 6), p3, acc3);
        i += 4;
    }
    // The last nb % 4 blocks, one at a time into the first accumulator.
    while i < nb {
        let (x, y) = (w.add(i * L::WB), a.add(i * L::AB));
        let sc = _mm_mul_ps(
            _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(x))),
            _mm_cvtph_ps(_mm_cvtsi32_si128(rd32(y))),
        );
        if L::MIN {
            mins = _mm256_add_ps(mins, _mm256_zextps128_ps256(sc));
        }
        let p = _mm256_cvtepi32_ps(L::idot::<S>(x, y));
        acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(sc), p, acc0);
        i += 1;
    }
    let sum = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc0, acc1),
        _mm256_add_ps(acc2, acc3),
    ));
    if L::MIN {
        sum + hsum_ps(_mm256_blend_ps(mins, _mm256_setzero_ps(), 0b0101_0101))
    } else {
        sum
    }
}

#[inline(always)]
unsafe fn q4_0_body<S: Simd>(n: usize, w: *const u8, a: *const u8) -> f32 {
    legacy_body::<Q4_0, S>(n, w, a)
}
dot_kernels!(
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    q4_0_body,
    q4_0_avx2,
    q4_0_vnni
);

#[inline(always)]
unsafe fn q4_1_body<S: Simd>(n: usize, w: *const u8, a: *const u8) -> f32 {
    legacy_body::<Q4_1, S>(n, w, a)
}
dot_kernels!(
    GgmlType::Q4_1,
    GgmlType::Q8_1,
    q4_1_body,
    q4_1_avx2,
    q4_1_vnni
);

#[inline(always)]
unsafe fn q8_0_body<S: Simd>(n: usize, w: *const u8, a: *const u8) -> f32 {
    legacy_body::<Q8_0, S>(n, w, a)
}
dot_kernels!(
    GgmlType::Q8_0,
    GgmlType::Q8_0,
    q8_0_body,
    q8_0_avx2,
    q8_0_vnni
);

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
