//! The tiled Q4_K/Q6_K kernel ([`gemm_kernel`]) against the scalar reference, bit for bit, over a sweep of
//! shapes: partial weight groups (1..=24 rows), activation counts that leave partial tiles (1..=17), odd block
//! counts and padded row strides; and the single-row SIMD K-quant kernels bit-identical to the reference too
//! (the engine mixes the two kernels by row count, so batch invariance rests on these equalities).

use half::f16;
use kiln_quant::dot::{dot_fn, dot_kernel, gemm_kernel, quantize_activation, GemmKernel, Isa};
use kiln_quant::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A fresh seed per run (printed; replay with `KILN_TEST_SEED`), `salt` keeping the tests' streams apart.
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

/// Offsets of the f16 scales in a block (random bits there could be inf or NaN).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => unreachable!("K-quants only"),
    }
}

/// `rows` random weight rows of `n` elements, `stride` bytes apart: random bits everywhere (every quant, scale
/// and min pattern) except finite f16 scales.
fn random_weights(rng: &mut StdRng, ty: GgmlType, n: usize, rows: usize, stride: usize) -> Vec<u8> {
    let row = ty.row_bytes(n as u64).unwrap() as usize;
    let mut w: Vec<u8> = (0..rows * stride).map(|_| rng.gen()).collect();
    for r in 0..rows {
        for block in w[r * stride..r * stride + row].chunks_exact_mut(ty.block_bytes()) {
            for &off in f16_fields(ty) {
                let s = f16::from_f32(rng.gen_range(-0.05f32..0.05));
                block[off..off + 2].copy_from_slice(&s.to_le_bytes());
            }
        }
    }
    w
}

/// `rows` Q8_K activation rows of `n` elements, `stride` bytes apart, from random floats with an outlier.
fn random_acts(rng: &mut StdRng, n: usize, rows: usize, stride: usize) -> Vec<u8> {
    let row = GgmlType::Q8_K.row_bytes(n as u64).unwrap() as usize;
    let mut a = vec![0x5Au8; rows * stride];
    for r in 0..rows {
        let mut x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
        x[rng.gen_range(0..n)] = 40.0;
        quantize_activation(GgmlType::Q8_K, &x, &mut a[r * stride..r * stride + row]).unwrap();
    }
    a
}

fn simd_isas() -> Vec<Isa> {
    [Isa::Avx2, Isa::Avx512Vnni]
        .into_iter()
        .filter(|i| i.is_available())
        .collect()
}

/// Runs the tiled kernel on one shape and checks every output against the scalar reference's bits.
fn check_shape(rng: &mut StdRng, g: GemmKernel, isa: Isa, n: usize, rows: usize, n_act: usize) {
    let ty = g.weight_type();
    let (wrow, arow) = (
        ty.row_bytes(n as u64).unwrap() as usize,
        GgmlType::Q8_K.row_bytes(n as u64).unwrap() as usize,
    );
    // Strides padded so a stride mix-up reads the wrong bytes.
    let (ws, as_) = (wrow + 5, arow + 3);
    let w = random_weights(rng, ty, n, rows, ws);
    let a = random_acts(rng, n, n_act, as_);
    let mut packed = vec![0xA5u8; g.packed_len(n, rows)];
    g.pack(n, &w, ws, rows, &mut packed);
    // Poisoned output: an unwritten element stays NaN and fails the comparison.
    let mut out = vec![f32::NAN; n_act * rows + 1];
    g.run(n, &packed, rows, &a, as_, n_act, &mut out[..n_act * rows]);
    assert!(out[n_act * rows].is_nan(), "{ty} {isa}: wrote past the end");
    let reference = dot_fn(ty, Isa::Scalar).unwrap();
    for j in 0..n_act {
        for i in 0..rows {
            let want = reference(n, &w[i * ws..], &a[j * as_..]);
            let got = out[j * rows + i];
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{ty} {isa} n={n} rows={rows} acts={n_act}: weight row {i}, activation row {j}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn tiled_kernel_is_bit_identical_to_the_scalar_reference() {
    let mut rng = rng(0x6e33);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for isa in simd_isas() {
            let g =
                gemm_kernel(ty, isa).expect("Q4_K/Q6_K have a tiled kernel on every x86 SIMD ISA");
            for n in [256, 768, 1024, 256 * 11] {
                for rows in [1, 3, 7, 8, 9, 16, 17, 24] {
                    for n_act in [1, 2, 3, 4, 5, 7, 8, 9, 13, 17] {
                        check_shape(&mut rng, g, isa, n, rows, n_act);
                    }
                }
            }
            // The model's real shapes: Qwen3-0.6B (1024 -> 3072, 3072 -> 1024) for a prefill chunk of 64.
            check_shape(&mut rng, g, isa, 1024, 40, 64);
            check_shape(&mut rng, g, isa, 3072, 16, 64);
        }
    }
}

#[test]
fn single_row_k_quant_kernels_are_bit_identical_to_the_scalar_reference() {
    let mut rng = rng(0x51e);
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        let reference = dot_fn(ty, Isa::Scalar).unwrap();
        for isa in simd_isas() {
            let k = dot_kernel(ty, isa).unwrap();
            for n in [256, 512, 1280, 3072, 12288] {
                let arow = GgmlType::Q8_K.row_bytes(n as u64).unwrap() as usize;
                let w =
                    random_weights(&mut rng, ty, n, 1, ty.row_bytes(n as u64).unwrap() as usize);
                let a = random_acts(&mut rng, n, 6, arow);
                let mut out = [f32::NAN; 6];
                k.dot_rows(n, &w, &a, arow, &mut out);
                for (j, o) in out.iter().enumerate() {
                    let want = reference(n, &w, &a[j * arow..]);
                    assert_eq!(
                        k.dot(n, &w, &a[j * arow..]).to_bits(),
                        want.to_bits(),
                        "{ty} {isa} n={n}"
                    );
                    assert_eq!(
                        o.to_bits(),
                        want.to_bits(),
                        "{ty} {isa} n={n}: row {j} of dot_rows"
                    );
                }
            }
        }
    }
}

#[test]
fn only_q4_k_and_q6_k_on_simd_have_a_tiled_kernel() {
    for isa in Isa::ALL {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_K,
            GgmlType::Q8_0,
            GgmlType::F32,
        ] {
            assert_eq!(gemm_kernel(ty, isa), None, "{ty} {isa}");
        }
    }
    assert_eq!(gemm_kernel(GgmlType::Q4_K, Isa::Scalar), None);
    for isa in simd_isas() {
        let g = gemm_kernel(GgmlType::Q6_K, isa).unwrap();
        assert_eq!(g.weight_type(), GgmlType::Q6_K);
        // Whole groups: 9 rows take two groups' bytes.
        assert_eq!(g.packed_len(512, 9), 2 * g.packed_len(512, 8));
        assert_eq!(g.packed_len(512, 0), 0);
    }
}

#[test]
fn short_buffers_panic_instead_of_reading_out_of_bounds() {
    for isa in simd_isas() {
        let g = gemm_kernel(GgmlType::Q4_K, isa).unwrap();
        let w = vec![0u8; 144 * 3];
        let mut packed = vec![0u8; g.packed_len(256, 3)];
        let short = std::panic::catch_unwind(|| {
            let mut p = vec![0u8; g.packed_len(256, 3)];
            g.pack(256, &w[..144 * 3 - 1], 144, 3, &mut p);
        });
        assert!(short.is_err(), "{isa}: short weights");
        g.pack(256, &w, 144, 3, &mut packed);
        let a = vec![0u8; 292 * 2];
        let runs = std::panic::catch_unwind(|| {
            let mut out = vec![0f32; 6];
            g.run(256, &packed, 3, &a[..292 * 2 - 1], 292, 2, &mut out);
        });
        assert!(runs.is_err(), "{isa}: short activations");
        let mut out = vec![f32::NAN; 6];
        g.run(256, &packed, 3, &a, 292, 2, &mut out);
        assert!(out.iter().all(|&o| o == 0.0), "{isa}: zero rows give zeros");
    }
}
