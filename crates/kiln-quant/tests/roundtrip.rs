//! Quantize → dequantize round trips against the error bounds of llama.cpp's tests/test-quantize-fns.cpp.
//!
//! The metric is that test's `array_rmse`: sqrt(sum of squared differences) / n (not a true RMS: the
//! bound tightens with n), on its synthetic signal `0.1 + 2 * cos(i + offset)` over 32 * 128 elements.
//! The K-quant quantizers have no Python oracle, so this is their accuracy check (plus the unit tests).

use kiln_quant::{dequantize, quantize, GgmlType};

const TEST_SIZE: usize = 32 * 128;

/// Per-type bounds, as in test-quantize-fns.cpp: MAX_QUANTIZATION_TOTAL_ERROR (0.002) for every type
/// except Q2_K (…_2BITS, 0.0075) and Q3_K (…_3BITS, 0.0040).
const BOUNDS: [(GgmlType, f64); 15] = [
    (GgmlType::F16, 0.002),
    (GgmlType::BF16, 0.002),
    (GgmlType::Q4_0, 0.002),
    (GgmlType::Q4_1, 0.002),
    (GgmlType::Q5_0, 0.002),
    (GgmlType::Q5_1, 0.002),
    (GgmlType::Q8_0, 0.002),
    (GgmlType::Q8_1, 0.002),
    (GgmlType::Q2_K, 0.0075),
    (GgmlType::Q3_K, 0.0040),
    (GgmlType::Q4_K, 0.002),
    (GgmlType::Q5_K, 0.002),
    (GgmlType::Q6_K, 0.002),
    (GgmlType::Q8_K, 0.002),
    (GgmlType::IQ4_NL, 0.002),
];

/// `generate_data`: the C code evaluates `0.1 + 2*cosf(i + offset)` in double and stores a float.
fn generate_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0.1f64 + 2.0 * ((i as f32 + offset).cos() as f64)) as f32)
        .collect()
}

/// `array_rmse`: sqrt(sum (a - b)^2) / n, accumulated in double.
fn array_rmse(a: &[f32], b: &[f32]) -> f64 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (*x - *y) as f64;
            d * d
        })
        .sum();
    sum.sqrt() / a.len() as f64
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; ty.row_bytes(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut q).unwrap();
    let mut y = vec![f32::NAN; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    y
}

#[test]
fn total_quantization_error_is_within_ggml_bounds() {
    let x = generate_data(0.0, TEST_SIZE);
    let mut failures = Vec::new();
    for (ty, bound) in BOUNDS {
        let err = array_rmse(&x, &round_trip(ty, &x));
        eprintln!(
            "{:8} total quantization error {err:.6} (bound {bound})",
            ty.name()
        );
        // Written so that a NaN error fails too.
        if err.is_nan() || err >= bound {
            failures.push(format!("{ty}: {err} >= {bound}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn every_quantizable_type_has_a_bound() {
    let x = vec![0.25f32; 256];
    for ty in GgmlType::ALL {
        let mut q = vec![0u8; ty.row_bytes(256).unwrap() as usize];
        let quantizable = quantize(ty, &x, &mut q).is_ok();
        let bounded = ty == GgmlType::F32 || BOUNDS.iter().any(|(t, _)| *t == ty);
        assert_eq!(quantizable, bounded, "{ty}");
    }
}

#[test]
fn f32_round_trip_is_exact() {
    let x = generate_data(1.0, 256);
    assert_eq!(round_trip(GgmlType::F32, &x), x);
}

#[test]
fn zero_and_constant_rows_round_trip() {
    for (ty, _) in BOUNDS {
        let zeros = vec![0f32; 512];
        let y = round_trip(ty, &zeros);
        assert!(
            y.iter().all(|v| *v == 0.0),
            "{ty}: zeros came back as {y:?}"
        );
        // A constant row is a block whose values all equal its extreme: every format represents it to
        // within a few f16 ulps of the value (the K-quants through two rounded 6-bit scales).
        for c in [0.7f32, -2.5] {
            let x = vec![c; 512];
            let y = round_trip(ty, &x);
            for v in &y {
                assert!(
                    (v - c).abs() <= c.abs() * 0.02,
                    "{ty}: constant {c} came back as {v}"
                );
            }
        }
    }
}

#[test]
fn other_signals_stay_within_bounds() {
    // Offsets and amplitudes of test-quantize-fns' other test vectors, shifted to be one-signed too.
    for (offset, shift) in [(1.0f32, 0.0f32), (3.0, 2.5), (4.0, -2.5)] {
        let x: Vec<f32> = generate_data(offset, TEST_SIZE)
            .iter()
            .map(|v| v + shift)
            .collect();
        for (ty, bound) in BOUNDS {
            // The one-signed rows have a larger range, so allow for it proportionally.
            let range = 2.0 + shift.abs() as f64;
            let err = array_rmse(&x, &round_trip(ty, &x));
            assert!(
                err < bound * range / 2.0,
                "{ty} offset {offset} shift {shift}: {err}"
            );
        }
    }
}

#[test]
fn non_finite_inputs_never_panic() {
    // Garbage in, garbage out, but no panic and every output written: a NaN or infinity in an activation
    // row must not take the process down.
    let mut x = generate_data(2.0, 512);
    x[3] = f32::NAN;
    x[40] = f32::INFINITY;
    x[300] = f32::NEG_INFINITY;
    x[301] = f32::MAX;
    x[302] = f32::MIN_POSITIVE / 4.0;
    for (ty, _) in BOUNDS {
        let y = round_trip(ty, &x);
        assert_eq!(y.len(), x.len(), "{ty}");
    }
}
