//! CPU dot products between a quantized weight row and a quantized activation row: the inner loop of matmul.
//!
//! Each weight type is multiplied with activations in its "vec dot" format ([`vec_dot_type`], as in ggml):
//!
//! | weight | activation |
//! |---|---|
//! | Q4_0, Q5_0, Q8_0, IQ4_NL | Q8_0 |
//! | Q4_1, Q5_1 | Q8_1 (`s = d * sum(qs)`) |
//! | Q2_K … Q6_K, IQ2_XXS | Q8_K |
//! | F32, F16, BF16 | F32 (kiln's choice: half activations would add a rounding for no bandwidth gain, since the activation row sits in cache) |
//!
//! The caller quantizes an activation row once with [`quantize_activation`], picks a kernel once per matmul with
//! [`dot_kernel`] (or [`dot_fn`]) and calls it for every weight row, for one activation row ([`DotKernel::dot`])
//! or several ([`DotKernel::dot_rows`]: the weights are decoded once for up to four activation rows). Every type
//! has a scalar reference kernel ([`Isa::Scalar`]) that follows ggml's `ggml_vec_dot_*` reference semantics
//! (integer dot products per (sub-)block, then float scaling); the SIMD kernels are tested against it. SIMD
//! kernels (AVX2, and AVX-512 VNNI) exist for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K
//! and Q6_K, with a four-row form for the block types; Q2_K, Q3_K and IQ2_XXS run the reference kernel under
//! every [`Isa`].
//!
//! A kernel's result for a given (weight row, activation row) depends only on those two rows, the type and the
//! [`Isa`]: the reduction order is fixed, so the result is bit-identical from call to call and between
//! [`DotKernel::dot`] and [`DotKernel::dot_rows`] (the engine's batch invariance rests on this). For the block
//! types it is also the same on AVX2 and AVX-512 VNNI (same integers, same float operations); only the float
//! types round differently per ISA (8 vs 16 lanes). Q4_K, Q5_K and Q6_K go further: their SIMD kernels apply the
//! scalar reference's f32 operations to the same exact block integers, so they equal [`Isa::Scalar`] bit for bit.
//!
//! Prefill of Q4_K/Q6_K weights has a tiled kernel, [`GemmKernel`] ([`gemm_kernel`]): 8 weight rows packed once
//! (decoded, interleaved) and multiplied with up to 8 activation rows per call, every output a lane of a VNNI
//! accumulator. Its results are bit-identical to [`DotKernel::dot`] too, so callers pick it by speed alone.
//!
//! Q4_0, Q4_1 and Q8_0 on AVX2 (and AVX-512), and Q4_K and Q6_K on AVX-512 VNNI, have [`RepackKernel`]
//! ([`repack_kernel`]): a weight repacked once into groups of 8 (16 for the K-quants) interleaved rows, then
//! multiplied with any number of activation rows (decode as well as prefill), each lane one row's dot. For the
//! legacy formats it has its own per-pair float order (one f32 chain over the blocks, [`repacked_dot_reference`]),
//! not the row kernels', so a caller that uses it for a weight must use it for every matmul on that weight; the
//! K-quants' form keeps the row kernels' bits.
//!
//! ```
//! use kiln_quant::dot::{dot_kernel, quantize_activation, vec_dot_type, Isa};
//! use kiln_quant::{quantize, GgmlType};
//!
//! let n = 256;
//! let wf: Vec<f32> = (0..n).map(|i| ((i * 7 % 17) as f32 - 8.0) / 8.0).collect();
//! let mut w = vec![0u8; GgmlType::Q4_K.row_bytes(n as u64).unwrap() as usize];
//! quantize(GgmlType::Q4_K, &wf, &mut w)?;
//!
//! // Two activation rows, quantized once to Q4_K's activation format (Q8_K).
//! let act_ty = vec_dot_type(GgmlType::Q4_K);
//! let row = act_ty.row_bytes(n as u64).unwrap() as usize;
//! let mut a = vec![0u8; 2 * row];
//! for (r, chunk) in a.chunks_exact_mut(row).enumerate() {
//!     let x: Vec<f32> = (0..n).map(|i| ((i + r) % 5) as f32 - 2.0).collect();
//!     quantize_activation(act_ty, &x, chunk)?;
//! }
//!
//! let k = dot_kernel(GgmlType::Q4_K, Isa::detect())?;
//! let mut out = [0f32; 2];
//! k.dot_rows(n, &w, &a, row, &mut out);
//! let prods: Vec<f32> = wf.iter().enumerate().map(|(i, v)| v * ((i % 5) as f32 - 2.0)).collect();
//! let (exact, scale) = (prods.iter().sum::<f32>(), prods.iter().map(|p| p.abs()).sum::<f32>());
//! assert!((out[0] - exact).abs() < 0.02 * scale, "{} vs {exact}", out[0]);
//! // Batch invariance: the second row alone gives the same bits as in the two-row call.
//! assert_eq!(k.dot(n, &w, &a[row..]).to_bits(), out[1].to_bits());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod act;
mod gemm;
mod repack;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::GgmlType;

pub use gemm::{gemm_kernel, GemmKernel};
pub use repack::{repack_kernel, repacked_dot_reference, RepackKernel};

/// A dot product kernel: `dot(n, weight_row, activation_row)` over `n` elements. The weight row is `n` elements of
/// the weight type the kernel was chosen for, the activation row `n` elements of its [`vec_dot_type`], both as raw
/// little-endian block bytes (no alignment needed).
///
/// # Panics
/// If `n` is not a whole number of blocks or either slice is shorter than its row: the caller validates shapes
/// once (at model load) and a mismatch here is a bug in the caller, not bad data.
pub type DotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;

/// One weight row against four activation rows, each result bit-identical to the [`DotFn`] of the same
/// type and ISA on that row (same contract and panics).
pub(crate) type Dot4Fn = fn(n: usize, w: &[u8], a: [&[u8]; 4]) -> [f32; 4];

/// A dot kernel chosen once per matmul ([`dot_kernel`]): one weight row against one activation row
/// ([`DotKernel::dot`]) or against several ([`DotKernel::dot_rows`], which decodes the weights once for up to
/// four activation rows: the fast path of prefill and batched decode).
///
/// Batch invariance: a row's result from [`DotKernel::dot_rows`] is bit-identical to [`DotKernel::dot`] on that
/// row, whatever the other rows and their number (each row's arithmetic runs in the same order in both).
#[derive(Clone, Copy, Debug)]
pub struct DotKernel {
    single: DotFn,
    four: Option<Dot4Fn>,
}

impl DotKernel {
    /// The dot product of a weight row and an activation row of `n` elements (see [`DotFn`]).
    #[inline]
    pub fn dot(&self, n: usize, w: &[u8], a: &[u8]) -> f32 {
        (self.single)(n, w, a)
    }

    /// The single-row kernel as a plain function pointer.
    pub fn dot_fn(&self) -> DotFn {
        self.single
    }

    /// `out[j] = dot(w, activation row j)` for every `j < out.len()`, activation row `j` starting at byte
    /// `j * a_stride` of `a`.
    ///
    /// # Panics
    /// As [`DotFn`], for any row that `a` does not hold.
    pub fn dot_rows(&self, n: usize, w: &[u8], a: &[u8], a_stride: usize, out: &mut [f32]) {
        let row = |j: usize| &a[j * a_stride..];
        let mut j = 0;
        if let Some(four) = self.four {
            while j + 4 <= out.len() {
                let r = four(n, w, [row(j), row(j + 1), row(j + 2), row(j + 3)]);
                out[j..j + 4].copy_from_slice(&r);
                j += 4;
            }
        }
        for (k, o) in out.iter_mut().enumerate().skip(j) {
            *o = (self.single)(n, w, row(k));
        }
    }
}

/// An instruction set a kernel can be compiled for, ordered from the most portable to the fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust: runs everywhere, the reference every other path is tested against.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 AVX2 + FMA + F16C + AVX-512 F/BW/VL + VNNI.
    Avx512Vnni,
}

impl Isa {
    /// Every ISA, from the most portable to the fastest.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni];

    /// The fastest ISA this CPU supports.
    pub fn detect() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// Whether this CPU can run kernels of this ISA.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::has_avx2(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => x86::has_avx512vnni(),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512Vnni => false,
        }
    }

    /// The fastest available ISA not above `cap`: `Isa::capped(Isa::Scalar)` is the kill switch for SIMD.
    pub fn capped(cap: Isa) -> Isa {
        Isa::detect().min(cap)
    }

    /// Lower-case name ("scalar", "avx2", "avx512vnni").
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A dot-product request that cannot be carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DotError {
    /// The type has no dot product with an activation format (Q8_1 and Q8_K are activation-only formats).
    #[error("no dot product for weight type {0}")]
    UnsupportedWeight(GgmlType),
    /// The type is not an activation format (those are f32, q8_0, q8_1 and q8_K).
    #[error("{0} is not an activation format (f32, q8_0, q8_1, q8_K)")]
    UnsupportedActivation(GgmlType),
    /// The CPU cannot run kernels of the requested ISA.
    #[error("this CPU does not support {0} kernels")]
    IsaUnavailable(Isa),
    /// The row length is not a whole number of blocks.
    #[error("{ty}: a row of {n} elements is not a whole number of {block_elems}-element blocks")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// Elements in the row.
        n: usize,
        /// Elements per block of `ty`.
        block_elems: usize,
    },
    /// A buffer does not hold exactly the row.
    #[error("{what} row of {n} {ty} elements takes {expected} bytes, but the buffer has {got}")]
    BufferSize {
        /// Which buffer ("weight", "activation", "f32 input").
        what: &'static str,
        /// Its type.
        ty: GgmlType,
        /// Elements in the row.
        n: usize,
        /// Bytes expected.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
}

/// The activation format weight type `w` is multiplied with (see the module table). Q8_1 and Q8_K map to
/// themselves, as in ggml, though they have no dot product.
pub const fn vec_dot_type(w: GgmlType) -> GgmlType {
    match w {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => GgmlType::F32,
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => GgmlType::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlType::Q8_1,
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::Q8_K
        | GgmlType::IQ2_XXS => GgmlType::Q8_K,
    }
}

/// Bytes of a row of `n` elements of `ty`, or the error naming `what`.
pub(crate) fn row_len(ty: GgmlType, n: usize) -> Result<usize, DotError> {
    let block_elems = ty.block_elems();
    if !n.is_multiple_of(block_elems) {
        return Err(DotError::PartialBlock { ty, n, block_elems });
    }
    // n / block_elems * block_bytes cannot overflow beyond what a slice of n f32 could already hold.
    Ok(n / block_elems * ty.block_bytes())
}

fn check_len(what: &'static str, ty: GgmlType, n: usize, got: usize) -> Result<(), DotError> {
    let expected = row_len(ty, n)?;
    if got != expected {
        return Err(DotError::BufferSize {
            what,
            ty,
            n,
            expected,
            got,
        });
    }
    Ok(())
}

/// Slices the weight and activation rows of a kernel call to their exact lengths, panicking (the [`DotFn`]
/// contract) when they are too short.
#[inline(always)]
pub(crate) fn rows<'a>(
    wt: GgmlType,
    at: GgmlType,
    n: usize,
    w: &'a [u8],
    a: &'a [u8],
) -> (&'a [u8], &'a [u8]) {
    assert!(
        n.is_multiple_of(wt.block_elems()) && n.is_multiple_of(at.block_elems()),
        "dot {wt}: n = {n} is not a whole number of blocks"
    );
    let wl = n / wt.block_elems() * wt.block_bytes();
    let al = n / at.block_elems() * at.block_bytes();
    assert!(
        w.len() >= wl && a.len() >= al,
        "dot {wt}: rows of {n} elements need {wl} weight and {al} activation bytes, got {} and {}",
        w.len(),
        a.len()
    );
    (&w[..wl], &a[..al])
}

/// The single-row kernel for weight type `w` on `isa`, chosen once per matmul. Types without a SIMD kernel
/// get the scalar reference under every ISA.
pub fn dot_fn(w: GgmlType, isa: Isa) -> Result<DotFn, DotError> {
    Ok(dot_kernel(w, isa)?.single)
}

/// The kernel for weight type `w` on `isa` with its multi-row form (see [`DotKernel`]).
pub fn dot_kernel(w: GgmlType, isa: Isa) -> Result<DotKernel, DotError> {
    if !isa.is_available() {
        return Err(DotError::IsaUnavailable(isa));
    }
    let reference = DotKernel {
        single: scalar::kernel(w).ok_or(DotError::UnsupportedWeight(w))?,
        four: None,
    };
    match isa {
        Isa::Scalar => Ok(reference),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => Ok(x86::kernel(w, isa)
            .map(|(single, four)| DotKernel { single, four })
            .unwrap_or(reference)),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512Vnni => Err(DotError::IsaUnavailable(isa)),
    }
}

/// One dot product with full validation: `w_bytes` must be exactly a row of `n` elements of `w`, `a_bytes`
/// exactly a row of `n` elements of [`vec_dot_type`]`(w)`.
pub fn vec_dot(
    w: GgmlType,
    isa: Isa,
    n: usize,
    w_bytes: &[u8],
    a_bytes: &[u8],
) -> Result<f32, DotError> {
    let f = dot_fn(w, isa)?;
    check_len("weight", w, n, w_bytes.len())?;
    check_len("activation", vec_dot_type(w), n, a_bytes.len())?;
    Ok(f(n, w_bytes, a_bytes))
}

/// Converts an f32 activation row to the activation format `act_ty` (F32, Q8_0, Q8_1 or Q8_K), using the fastest
/// ISA of this CPU. The output is bit-identical to ggml's reference quantizers (`quantize_row_q8_0_ref` etc.)
/// whatever the ISA. `out` must be exactly the row's bytes.
pub fn quantize_activation(act_ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), DotError> {
    quantize_activation_isa(act_ty, Isa::detect(), x, out)
}

/// [`quantize_activation`] on a chosen ISA (for kill switches and tests); the output is the same for every ISA.
pub fn quantize_activation_isa(
    act_ty: GgmlType,
    isa: Isa,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), DotError> {
    if !isa.is_available() {
        return Err(DotError::IsaUnavailable(isa));
    }
    if !matches!(
        act_ty,
        GgmlType::F32 | GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K
    ) {
        return Err(DotError::UnsupportedActivation(act_ty));
    }
    let n = x.len();
    check_len("activation", act_ty, n, out.len())?;
    act::quantize(act_ty, isa, x, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_dot_types_follow_ggml() {
        assert_eq!(vec_dot_type(GgmlType::Q4_0), GgmlType::Q8_0);
        assert_eq!(vec_dot_type(GgmlType::IQ4_NL), GgmlType::Q8_0);
        assert_eq!(vec_dot_type(GgmlType::Q5_1), GgmlType::Q8_1);
        assert_eq!(vec_dot_type(GgmlType::Q6_K), GgmlType::Q8_K);
        assert_eq!(vec_dot_type(GgmlType::IQ2_XXS), GgmlType::Q8_K);
        assert_eq!(vec_dot_type(GgmlType::BF16), GgmlType::F32);
    }

    #[test]
    fn activation_only_types_have_no_kernel() {
        for ty in [GgmlType::Q8_1, GgmlType::Q8_K] {
            assert_eq!(
                dot_fn(ty, Isa::Scalar).err(),
                Some(DotError::UnsupportedWeight(ty))
            );
        }
    }

    #[test]
    fn isa_order_and_cap() {
        assert!(Isa::Scalar < Isa::Avx2 && Isa::Avx2 < Isa::Avx512Vnni);
        assert_eq!(Isa::capped(Isa::Scalar), Isa::Scalar);
        assert!(Isa::detect().is_available());
    }

    #[test]
    fn vec_dot_validates_lengths() {
        let w = vec![0u8; 18];
        let a = vec![0u8; 34];
        assert!(vec_dot(GgmlType::Q4_0, Isa::Scalar, 32, &w, &a).is_ok());
        assert!(matches!(
            vec_dot(GgmlType::Q4_0, Isa::Scalar, 32, &w[..17], &a),
            Err(DotError::BufferSize { what: "weight", .. })
        ));
        assert!(matches!(
            vec_dot(GgmlType::Q4_0, Isa::Scalar, 33, &w, &a),
            Err(DotError::PartialBlock { .. })
        ));
        let mut out = vec![0u8; 34];
        assert_eq!(
            quantize_activation(GgmlType::Q4_0, &[0.0; 32], &mut out),
            Err(DotError::UnsupportedActivation(GgmlType::Q4_0))
        );
        assert!(matches!(
            quantize_activation(GgmlType::Q8_0, &[0.0; 32], &mut out[..33]),
            Err(DotError::BufferSize { .. })
        ));
    }
}
