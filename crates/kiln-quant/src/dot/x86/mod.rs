//! x86_64 SIMD dot kernels (AVX2 and AVX-512 VNNI), selected at run time.
//!
//! Each kernel body is written once, generic over [`Simd`] (the few operations whose best instruction differs
//! between the ISAs), and instantiated in a `#[target_feature]` function per ISA. The safe [`DotFn`] wrappers are
//! only handed out by [`kernel`] after [`super::dot_fn`] has checked that the CPU supports the ISA, which is what
//! makes calling the `target_feature` functions from them sound.
//!
//! Integer results are identical on both ISAs (the AVX2 16-bit intermediate sums cannot saturate for the value
//! ranges of these formats: at most 128 × 127 × 2 < 2^15) and the block kernels share their float code, so a
//! block type's AVX2 and VNNI results are bit-identical; only the float types (F32/F16/BF16, 16 lanes on
//! AVX-512 instead of 8) differ in rounding between the ISAs.

pub(crate) mod gemm;
mod kquants;
pub(crate) mod krepack;
mod legacy;
pub(crate) mod repack;

use super::{Dot4Fn, DotFn, Isa};
use crate::GgmlType;
use std::arch::x86_64::*;

pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

pub(crate) fn has_avx512vnni() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// The SIMD kernel for `w` on `isa` with its four-row variant when it has one, or `None` when the type
/// only has the scalar reference.
pub(crate) fn kernel(w: GgmlType, isa: Isa) -> Option<(DotFn, Option<Dot4Fn>)> {
    let vnni = isa == Isa::Avx512Vnni;
    macro_rules! pick {
        ($m:path) => {{
            use $m as k;
            if vnni {
                (k::vnni as DotFn, Some(k::vnni_x4 as Dot4Fn))
            } else {
                (k::avx2 as DotFn, Some(k::avx2_x4 as Dot4Fn))
            }
        }};
        // Single rows on AVX2 even under VNNI: measured ~4% faster for Q4_K/Q5_K (dot_bench), while the
        // four-row form gains ~30% from VNNI. Mixing is exact: AVX2 and VNNI block kernels compute the same
        // integers and the same float operations, so their results are bit-identical.
        ($m:path, avx2_single) => {{
            use $m as k;
            if vnni {
                (k::avx2 as DotFn, Some(k::vnni_x4 as Dot4Fn))
            } else {
                (k::avx2 as DotFn, Some(k::avx2_x4 as Dot4Fn))
            }
        }};
    }
    Some(match w {
        GgmlType::F32 if vnni => (legacy::f32_avx512 as DotFn, None),
        GgmlType::F32 => (legacy::f32_avx2 as DotFn, None),
        GgmlType::F16 if vnni => (legacy::f16_avx512 as DotFn, None),
        GgmlType::F16 => (legacy::f16_avx2 as DotFn, None),
        GgmlType::BF16 if vnni => (legacy::bf16_avx512 as DotFn, None),
        GgmlType::BF16 => (legacy::bf16_avx2 as DotFn, None),
        GgmlType::Q4_0 => pick!(legacy::q4_0),
        GgmlType::Q4_1 => pick!(legacy::q4_1),
        GgmlType::Q8_0 => pick!(legacy::q8_0),
        GgmlType::Q5_0 => pick!(legacy::q5_0),
        GgmlType::Q5_1 => pick!(legacy::q5_1),
        GgmlType::IQ4_NL => pick!(legacy::iq4_nl),
        GgmlType::Q4_K => pick!(kquants::q4_k, avx2_single),
        GgmlType::Q5_K => pick!(kquants::q5_k, avx2_single),
        GgmlType::Q6_K => pick!(kquants::q6_k),
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::IQ2_XXS | GgmlType::Q8_1 | GgmlType::Q8_K => {
            return None
        }
    })
}

/// The integer operations whose best instruction depends on the ISA. Implementations are `#[inline(always)]`
/// so they compile into the calling `#[target_feature]` kernel.
pub(super) trait Simd {
    /// `acc + Σ₄ a·b`: unsigned bytes `a` times signed bytes `b`, summed in groups of 4 into 8 i32 lanes.
    unsafe fn dot_u8i8(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// `acc + Σ₂ a·b`: i16 products summed in pairs into 8 i32 lanes.
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

/// AVX2: `vpmaddubsw` + `vpmaddwd`.
pub(super) struct Avx2;
/// AVX-512 VNNI (on 256-bit vectors through VL): `vpdpbusd` / `vpdpwssd`, one instruction each.
pub(super) struct Vnni;

impl Simd for Avx2 {
    #[inline(always)]
    unsafe fn dot_u8i8(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        let p16 = _mm256_maddubs_epi16(a, b);
        _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }
}

impl Simd for Vnni {
    #[inline(always)]
    unsafe fn dot_u8i8(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, b)
    }
    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, a, b)
    }
}

/// An f16 at `p` (any alignment) as f32.
#[inline(always)]
pub(super) unsafe fn load_f16(p: *const u8) -> f32 {
    let bits = std::ptr::read_unaligned(p.cast::<u16>());
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// An f32 at `p` (any alignment).
#[inline(always)]
pub(super) unsafe fn load_f32(p: *const u8) -> f32 {
    std::ptr::read_unaligned(p.cast::<f32>())
}

/// Sum of the 8 lanes, in a fixed order.
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Generates module `$name` with the safe wrappers of a kernel body `$body::<Simd, R>` for both ISAs:
/// `avx2`/`vnni` (one activation row, a [`DotFn`]) and `avx2_x4`/`vnni_x4` (four rows, a [`Dot4Fn`]). Each
/// slices the rows (panicking per the [`DotFn`] contract) and calls the body inside a `#[target_feature]` fn.
///
/// `$avx2_rows` (1 or 4) is how many activation rows one AVX2 call carries: AVX2 has 16 vector registers, too
/// few for several rows of the legacy kernels' four accumulators each (they spill: measured slower than one
/// row at a time even for two rows), so those run row by row. AVX-512 VL's 32 registers hold four rows.
macro_rules! dot_kernels {
    ($wt:expr, $at:expr, $body:ident, $name:ident) => {
        dot_kernels!($wt, $at, $body, $name, 4);
    };
    ($wt:expr, $at:expr, $body:ident, $name:ident, $avx2_rows:literal) => {
        pub(crate) mod $name {
            use super::*;
            use crate::dot::rows;

            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn imp_avx2<const R: usize>(
                n: usize,
                w: *const u8,
                a: [*const u8; R],
            ) -> [f32; R] {
                $body::<crate::dot::x86::Avx2, R>(n, w, a)
            }

            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            unsafe fn imp_vnni<const R: usize>(
                n: usize,
                w: *const u8,
                a: [*const u8; R],
            ) -> [f32; R] {
                $body::<crate::dot::x86::Vnni, R>(n, w, a)
            }

            pub(crate) fn avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
                let (w, a) = rows($wt, $at, n, w, a);
                // SAFETY: `rows` checked both rows hold n elements; this fn is only reachable through
                // `dot_fn`/`dot_kernel`, which checked that the CPU has AVX2, FMA and F16C.
                unsafe { imp_avx2(n, w.as_ptr(), [a.as_ptr()])[0] }
            }

            // Unused for the types whose single rows run the AVX2 kernel under VNNI (see `kernel`).
            #[allow(dead_code)]
            pub(crate) fn vnni(n: usize, w: &[u8], a: &[u8]) -> f32 {
                let (w, a) = rows($wt, $at, n, w, a);
                // SAFETY: as in `avx2`, for the AVX-512 VNNI feature set.
                unsafe { imp_vnni(n, w.as_ptr(), [a.as_ptr()])[0] }
            }

            pub(crate) fn avx2_x4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
                // Spelled out rather than `a.map(..)`, whose closure was not inlined (~3% of a prefill).
                let row = |a: &[u8]| rows($wt, $at, n, w, a).1.as_ptr();
                let a = [row(a[0]), row(a[1]), row(a[2]), row(a[3])];
                // SAFETY: as in `avx2`, for each of the four activation rows.
                unsafe {
                    if $avx2_rows == 4 {
                        imp_avx2::<4>(n, w.as_ptr(), a)
                    } else {
                        a.map(|a| imp_avx2::<1>(n, w.as_ptr(), [a])[0])
                    }
                }
            }

            pub(crate) fn vnni_x4(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4] {
                let row = |a: &[u8]| rows($wt, $at, n, w, a).1.as_ptr();
                let a = [row(a[0]), row(a[1]), row(a[2]), row(a[3])];
                // SAFETY: as in `vnni`, for each of the four activation rows.
                unsafe { imp_vnni(n, w.as_ptr(), a) }
            }
        }
    };
}
pub(super) use dot_kernels;
