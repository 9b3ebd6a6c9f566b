//! x86 kernels for the float types and the 32-element block formats (Q4_0, Q4_1, Q8_0).
//!
//! Block kernels: one 32-element block per 256-bit vector (the integer dot of a block fills 8 i32 lanes), scaled
//! to float and accumulated with FMA into two accumulators (even and odd blocks) so consecutive blocks do not
//! wait on each other's FMA latency. 512-bit vectors would need the scales of two blocks spread over one vector,
//! which costs more shuffles than it saves for these small blocks; the VNNI variant instead replaces the
//! `maddubs + madd + add` triple by one `vpdpbusd`.

use super::{dot_kernels, hsum_ps, load_f16, Simd};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, QK};
use crate::GgmlType;
use std::arch::x86_64::*;
use std::mem::{offset_of, size_of};

/// The 32 nibbles of a legacy block as bytes in element order: low nibbles (elements 0..16), then high.
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    let q = _mm_loadu_si128(qs.cast());
    let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0xF))
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
unsafe fn q4_0_body<S: Simd>(n: usize, w: *const u8, a: *const u8) -> f32 {
    const WB: usize = size_of::<BlockQ4_0>();
    const AB: usize = size_of::<BlockQ8_0>();
    let nb = n / QK;
    let mut acc = [_mm256_setzero_ps(); 2];
    for i in 0..nb {
        let (x, y) = (w.add(i * WB), a.add(i * AB));
        let xq = _mm256_sub_epi8(
            nibbles(x.add(offset_of!(BlockQ4_0, qs))),
            _mm256_set1_epi8(8),
        );
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_0, qs)).cast());
        let d = load_f16(x) * load_f16(y);
        let p = _mm256_cvtepi32_ps(dot_i8i8::<S>(xq, yq));
        acc[i & 1] = _mm256_fmadd_ps(_mm256_set1_ps(d), p, acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
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
    const WB: usize = size_of::<BlockQ4_1>();
    const AB: usize = size_of::<BlockQ8_1>();
    let nb = n / QK;
    let mut acc = [_mm256_setzero_ps(); 2];
    // The minimum's contribution m·s is one scalar per block: summed apart, added once at the end.
    let mut summs = 0.0f32;
    for i in 0..nb {
        let (x, y) = (w.add(i * WB), a.add(i * AB));
        let xq = nibbles(x.add(offset_of!(BlockQ4_1, qs)));
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_1, qs)).cast());
        let d = load_f16(x) * load_f16(y);
        summs +=
            load_f16(x.add(offset_of!(BlockQ4_1, m))) * load_f16(y.add(offset_of!(BlockQ8_1, s)));
        let p = _mm256_cvtepi32_ps(S::dot_u8i8(_mm256_setzero_si256(), xq, yq));
        acc[i & 1] = _mm256_fmadd_ps(_mm256_set1_ps(d), p, acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1])) + summs
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
    const B: usize = size_of::<BlockQ8_0>();
    let nb = n / QK;
    let mut acc = [_mm256_setzero_ps(); 2];
    for i in 0..nb {
        let (x, y) = (w.add(i * B), a.add(i * B));
        let xq = _mm256_loadu_si256(x.add(offset_of!(BlockQ8_0, qs)).cast());
        let yq = _mm256_loadu_si256(y.add(offset_of!(BlockQ8_0, qs)).cast());
        let d = load_f16(x) * load_f16(y);
        let p = _mm256_cvtepi32_ps(dot_i8i8::<S>(xq, yq));
        acc[i & 1] = _mm256_fmadd_ps(_mm256_set1_ps(d), p, acc[i & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
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
