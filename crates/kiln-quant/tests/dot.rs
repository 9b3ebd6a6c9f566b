//! Dot kernels and activation quantizers against their references, on fresh random rows of many lengths:
//! - every SIMD kernel against the scalar reference kernel of its type (float-summation-order tolerance);
//! - every scalar kernel against an f64 dot of the dequantized weight and activation rows;
//! - activation quantizers on every ISA bit-identical to the crate's reference quantizers (ggml's `_ref`);
//! - unaligned rows, determinism, and the scalar path always available.

use half::{bf16, f16};
use kiln_quant::dot::{
    dot_fn, dot_kernel, quantize_activation, quantize_activation_isa, vec_dot, vec_dot_type, Isa,
};
use kiln_quant::{dequantize, quantize, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A fresh random generator per run (the seed is printed, and shown when a test fails), or the one of
/// `KILN_TEST_SEED` to replay a failure; `salt` keeps the tests' streams apart.
fn rng(salt: u64) -> StdRng {
    let seed = std::env::var("KILN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
    eprintln!("random seed {seed} (replay with KILN_TEST_SEED={seed})");
    StdRng::seed_from_u64(seed ^ salt)
}

/// Every type with a dot product.
const WEIGHT_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
];

/// Row lengths: one block, odd block counts, and the real widths of SmolLM2-135M (576, 1536), Qwen3-0.6B
/// (1024, 3072) and Qwen3-8B (4096, 12288).
fn lengths(ty: GgmlType) -> Vec<usize> {
    match ty.block_elems() {
        1 => vec![
            1, 7, 31, 33, 100, 576, 1000, 1024, 1536, 3072, 4096, 8192, 12288,
        ],
        32 => vec![
            32,
            64,
            96,
            160,
            32 * 33,
            576,
            1024,
            1536,
            3072,
            4096,
            8192,
            12288,
        ],
        _ => vec![
            256,
            512,
            768,
            1280,
            256 * 11,
            1024,
            1536,
            3072,
            4096,
            12288,
            16384,
        ],
    }
}

/// Byte offsets of the f16 scale fields in a block: random bytes there could be inf or NaN.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ2_XXS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// A random weight row: random bits everywhere (every quant and packed-scale pattern occurs) with finite
/// scales; float rows get normal-ish values.
fn random_weights(rng: &mut StdRng, ty: GgmlType, n: usize) -> Vec<u8> {
    let len = ty.row_bytes(n as u64).unwrap() as usize;
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| rng.gen_range(-2.0f32..2.0).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(rng.gen_range(-2.0f32..2.0)).to_le_bytes())
            .collect(),
        _ => {
            let mut w: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            for block in w.chunks_exact_mut(ty.block_bytes()) {
                for &off in f16_fields(ty) {
                    let s = f16::from_f32(rng.gen_range(-0.05f32..0.05));
                    block[off..off + 2].copy_from_slice(&s.to_le_bytes());
                }
            }
            w
        }
    }
}

/// Random activations, with a few outliers like real hidden states.
fn random_activations(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v = rng.gen_range(-1.0f32..1.0);
            if rng.gen_ratio(1, 64) {
                v * 30.0
            } else {
                v
            }
        })
        .collect()
}

fn isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
}

/// A weight row, its activation row in the vec-dot format, and both dequantized.
struct Case {
    w: Vec<u8>,
    a: Vec<u8>,
    wf: Vec<f32>,
    af: Vec<f32>,
}

fn case(rng: &mut StdRng, ty: GgmlType, n: usize) -> Case {
    let w = random_weights(rng, ty, n);
    let x = random_activations(rng, n);
    let at = vec_dot_type(ty);
    let mut a = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
    quantize_activation(at, &x, &mut a).unwrap();
    let mut wf = vec![0f32; n];
    dequantize(ty, &w, &mut wf).unwrap();
    let mut af = vec![0f32; n];
    dequantize(at, &a, &mut af).unwrap();
    Case { w, a, wf, af }
}

/// Σ|w·a| in f64: the scale every rounding error is relative to.
fn abs_dot(c: &Case) -> f64 {
    c.wf.iter()
        .zip(&c.af)
        .map(|(&w, &a)| (w as f64 * a as f64).abs())
        .sum()
}

/// Σ|m·s| over the blocks of a Q4_1/Q5_1 row (0 for other types): the part of the dot that goes through the
/// f16-rounded activation sum.
fn min_term(ty: GgmlType, c: &Case) -> f64 {
    if !matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        return 0.0;
    }
    let f = |b: &[u8]| f16::from_le_bytes([b[2], b[3]]).to_f32() as f64;
    let ab = GgmlType::Q8_1.block_bytes();
    c.w.chunks_exact(ty.block_bytes())
        .zip(c.a.chunks_exact(ab))
        .map(|(w, a)| (f(w) * f(a)).abs())
        .sum()
}

#[test]
fn simd_kernels_match_the_scalar_reference() {
    let mut rng = rng(0x05ee_dd07);
    let simd: Vec<Isa> = isas().into_iter().filter(|&i| i != Isa::Scalar).collect();
    assert!(!simd.is_empty() || !cfg!(target_arch = "x86_64") || !is_x86_feature_detected!("avx2"));
    for ty in WEIGHT_TYPES {
        let reference = dot_fn(ty, Isa::Scalar).unwrap();
        for n in lengths(ty) {
            for _ in 0..3 {
                let c = case(&mut rng, ty, n);
                let want = reference(n, &c.w, &c.a);
                // The SIMD kernels sum the same exact per-block integers; only the float summation order of
                // the n / block scaled terms differs (f64 in the float references).
                let terms = (n / ty.block_elems()) as f64;
                let tol = 4.0 * f32::EPSILON as f64 * (terms + 8.0) * abs_dot(&c) + 1e-30;
                for &isa in &simd {
                    let got = dot_fn(ty, isa).unwrap()(n, &c.w, &c.a);
                    assert!(
                        ((got - want) as f64).abs() <= tol,
                        "{ty} {isa} n={n}: simd {got} vs scalar {want} (tol {tol:e})"
                    );
                }
            }
        }
    }
}

#[test]
fn scalar_kernels_match_an_f64_dot_of_the_dequantized_rows() {
    let mut rng = rng(0xf64);
    for ty in WEIGHT_TYPES {
        let dot = dot_fn(ty, Isa::Scalar).unwrap();
        for n in lengths(ty) {
            let c = case(&mut rng, ty, n);
            let want: f64 =
                c.wf.iter()
                    .zip(&c.af)
                    .map(|(&w, &a)| w as f64 * a as f64)
                    .sum();
            let got = dot(n, &c.w, &c.a) as f64;
            // Both sides use the same quantized values; they differ by f32 rounding of the scales and sums
            // (K-quant minimums are subtracted as separate sums, hence the larger constant), and for the
            // Q4_1/Q5_1 minimums by the f16 rounding of the activation sum s = d·Σq (relative 2^-11).
            let tol = 2e-5 * abs_dot(&c) + min_term(ty, &c) * 1e-3 + 1e-30;
            assert!(
                (got - want).abs() <= tol,
                "{ty} n={n}: scalar {got} vs f64 {want} (tol {tol:e})"
            );
        }
    }
}

#[test]
fn scalar_dot_of_real_quantization_is_close_to_the_f32_dot() {
    // End to end with real quantizers: weights quantized from smooth f32 data, activations too; the dot must
    // land within the quantization error of the exact f32 dot (a loose bound that a wrong layout breaks).
    let mut rng = rng(7);
    let n = 4096;
    for ty in WEIGHT_TYPES {
        if matches!(ty, GgmlType::IQ4_NL | GgmlType::IQ2_XXS) {
            continue; // kiln has no quantizer for the i-quants
        }
        let wf: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut w = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
        quantize(ty, &wf, &mut w).unwrap();
        let at = vec_dot_type(ty);
        let mut a = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
        quantize_activation(at, &x, &mut a).unwrap();
        let exact: f64 = wf.iter().zip(&x).map(|(&p, &q)| p as f64 * q as f64).sum();
        // Σ|w·x| ≈ n/4 for uniform data; Q2_K's error is the largest (~1/6 of the weight range per element).
        let scale = n as f64 / 4.0;
        let bound = if ty == GgmlType::Q2_K { 0.1 } else { 0.03 } * scale;
        for isa in isas() {
            let got = vec_dot(ty, isa, n, &w, &a).unwrap() as f64;
            assert!(
                (got - exact).abs() <= bound,
                "{ty} {isa}: {got} vs exact {exact} (bound {bound})"
            );
        }
    }
}

#[test]
fn kernels_read_unaligned_rows_and_are_deterministic() {
    let mut rng = rng(11);
    for ty in WEIGHT_TYPES {
        let n = lengths(ty)[3];
        let c = case(&mut rng, ty, n);
        for isa in isas() {
            let dot = dot_fn(ty, isa).unwrap();
            let base = dot(n, &c.w, &c.a);
            for shift in 1..4 {
                let mut w = vec![0u8; shift];
                w.extend_from_slice(&c.w);
                let mut a = vec![0u8; shift];
                a.extend_from_slice(&c.a);
                let got = dot(n, &w[shift..], &a[shift..]);
                assert_eq!(
                    got.to_bits(),
                    base.to_bits(),
                    "{ty} {isa} shifted by {shift}"
                );
            }
            assert_eq!(
                dot(n, &c.w, &c.a).to_bits(),
                base.to_bits(),
                "{ty} {isa} repeat"
            );
        }
    }
}

#[test]
fn multi_row_results_are_bit_identical_to_single_rows() {
    // Batch invariance: a row's result must not depend on how many rows share the call or where it sits.
    let mut rng = rng(0xba7c);
    for ty in WEIGHT_TYPES {
        let at = vec_dot_type(ty);
        for n in [lengths(ty)[0], lengths(ty)[3], lengths(ty)[7]] {
            let w = random_weights(&mut rng, ty, n);
            let row = at.row_bytes(n as u64).unwrap() as usize;
            // Rows padded apart so a stride mix-up reads the wrong bytes.
            let stride = row + 3;
            let rows = 11;
            let mut a = vec![0u8; rows * stride];
            for r in 0..rows {
                let x = random_activations(&mut rng, n);
                quantize_activation(at, &x, &mut a[r * stride..r * stride + row]).unwrap();
            }
            for isa in isas() {
                let k = dot_kernel(ty, isa).unwrap();
                let single: Vec<u32> = (0..rows)
                    .map(|r| k.dot(n, &w, &a[r * stride..]).to_bits())
                    .collect();
                for first in 0..3 {
                    for count in 1..=rows - first {
                        let mut out = vec![f32::NAN; count];
                        k.dot_rows(n, &w, &a[first * stride..], stride, &mut out);
                        for (j, o) in out.iter().enumerate() {
                            assert_eq!(
                                o.to_bits(),
                                single[first + j],
                                "{ty} {isa} n={n}: row {} of a {count}-row call",
                                first + j
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn block_kernels_are_bit_identical_across_simd_isas() {
    // AVX2 and VNNI compute the same exact integers and the same float operations for the block types, so a
    // quantized model's output does not depend on which of the two the CPU has.
    if !Isa::Avx512Vnni.is_available() {
        return; // nothing to compare on this CPU: Isa::Avx2 is the only SIMD path
    }
    let mut rng = rng(0x15a);
    for ty in WEIGHT_TYPES.into_iter().filter(|t| !t.is_float()) {
        for n in lengths(ty) {
            let c = case(&mut rng, ty, n);
            let avx2 = dot_fn(ty, Isa::Avx2).unwrap()(n, &c.w, &c.a);
            let vnni = dot_fn(ty, Isa::Avx512Vnni).unwrap()(n, &c.w, &c.a);
            assert_eq!(avx2.to_bits(), vnni.to_bits(), "{ty} n={n}");
            let mut out = [0f32; 4];
            let a4: Vec<u8> = c.a.iter().copied().cycle().take(4 * c.a.len()).collect();
            dot_kernel(ty, Isa::Avx2)
                .unwrap()
                .dot_rows(n, &c.w, &a4, c.a.len(), &mut out);
            assert!(
                out.iter().all(|o| o.to_bits() == avx2.to_bits()),
                "{ty} n={n} x4"
            );
        }
    }
}

/// Inputs that hit the quantizers' edge cases: exact .5 ties after scaling, all-zero blocks, a negative
/// maximum, equal magnitudes of both signs, tiny and huge magnitudes.
fn tricky_rows(rng: &mut StdRng, n: usize) -> Vec<Vec<f32>> {
    let ties: Vec<f32> = (0..n)
        .map(|i| {
            if i % 32 == 0 {
                127.0
            } else {
                (i % 255) as f32 / 2.0 - 63.5
            }
        })
        .collect();
    let neg_max: Vec<f32> = (0..n)
        .map(|i| {
            if i % 256 == 5 {
                -127.0
            } else if i % 256 == 9 {
                127.0
            } else {
                rng.gen_range(-100.0..100.0)
            }
        })
        .collect();
    let mut zeros = random_activations(rng, n);
    zeros[..256.min(n)].fill(0.0);
    let tiny: Vec<f32> = (0..n).map(|_| rng.gen_range(-1e-30f32..1e-30)).collect();
    let huge: Vec<f32> = (0..n).map(|_| rng.gen_range(-1e30f32..1e30)).collect();
    vec![ties, neg_max, zeros, tiny, huge]
}

#[test]
fn activation_quantizers_are_bit_identical_to_the_reference_on_every_isa() {
    let mut rng = rng(0xac7);
    for at in [
        GgmlType::F32,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
    ] {
        for n in [256, 512, 1536, 3072, 4096, 12288] {
            let mut rows = tricky_rows(&mut rng, n);
            rows.extend((0..4).map(|_| random_activations(&mut rng, n)));
            for x in rows {
                let len = at.row_bytes(n as u64).unwrap() as usize;
                let mut want = vec![0u8; len];
                quantize(at, &x, &mut want).unwrap();
                for isa in isas() {
                    // Poison the output so an unwritten byte cannot pass.
                    let mut got = vec![0xA5u8; len];
                    quantize_activation_isa(at, isa, &x, &mut got).unwrap();
                    assert!(
                        got == want,
                        "{at} {isa} n={n}: differs from the reference quantizer"
                    );
                }
            }
        }
    }
}

#[test]
fn scalar_isa_always_works_and_unavailable_isas_are_refused() {
    for ty in WEIGHT_TYPES {
        assert!(dot_fn(ty, Isa::Scalar).is_ok(), "{ty}");
    }
    for isa in Isa::ALL {
        assert_eq!(
            dot_fn(GgmlType::Q4_0, isa).is_ok(),
            isa.is_available(),
            "{isa}"
        );
    }
}
