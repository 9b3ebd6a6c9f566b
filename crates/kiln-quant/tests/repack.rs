//! The repacked kernels ([`repack_kernel`]: Q4_0/Q4_1/Q8_0, and Q4_K/Q5_K/Q6_K on AVX-512 VNNI and AVX2) against their scalar
//! model ([`repacked_dot_reference`]) bit for bit over a sweep of shapes (partial groups of 8 or 16 weight rows,
//! activation counts that leave a partial step, odd block counts, padded strides), every activation row's results
//! the same bits whatever rows share its call, and the model itself against the exact dequantized product. The
//! K-quants' model is the scalar dot kernel, so they are also checked against the row kernels.

use half::f16;
use kiln_quant::dot::{
    dot_kernel, quantize_activation, repack_kernel, repacked_dot_reference, vec_dot_type, Isa,
    RepackKernel,
};
use kiln_quant::{dequantize, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Byte offsets of a block's f16 scales.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

fn is_k(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Row lengths to sweep: whole blocks, odd block counts.
fn lengths(ty: GgmlType) -> &'static [usize] {
    if is_k(ty) {
        &[256, 768, 1280]
    } else {
        &[32, 96, 576, 1568]
    }
}

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

/// `rows` random weight rows of `n` elements, `stride` bytes apart: random quant and scale bits everywhere (Q8_0's
/// -128 and Q6_K's negative scales included) and finite f16 scales.
fn random_weights(rng: &mut StdRng, ty: GgmlType, n: usize, rows: usize, stride: usize) -> Vec<u8> {
    let row = ty.row_bytes(n as u64).unwrap() as usize;
    let mut w: Vec<u8> = (0..rows * stride).map(|_| rng.gen()).collect();
    for r in 0..rows {
        for block in w[r * stride..r * stride + row].chunks_exact_mut(ty.block_bytes()) {
            for &o in f16_fields(ty) {
                let s = f16::from_f32(rng.gen_range(-0.05f32..0.05));
                block[o..o + 2].copy_from_slice(&s.to_le_bytes());
            }
        }
    }
    w
}

/// `rows` activation rows of the weight's activation format, `stride` bytes apart, from random floats with an
/// outlier; also the floats.
fn random_acts(
    rng: &mut StdRng,
    ty: GgmlType,
    n: usize,
    rows: usize,
    stride: usize,
) -> (Vec<u8>, Vec<f32>) {
    let at = vec_dot_type(ty);
    let row = at.row_bytes(n as u64).unwrap() as usize;
    let mut a = vec![0x5Au8; rows * stride];
    let mut xs = Vec::with_capacity(rows * n);
    for r in 0..rows {
        let mut x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
        x[rng.gen_range(0..n)] = 40.0;
        quantize_activation(at, &x, &mut a[r * stride..r * stride + row]).unwrap();
        xs.extend_from_slice(&x);
    }
    (a, xs)
}

/// The type's repacked kernels on this CPU: AVX-512 VNNI and AVX2.
fn kernels(ty: GgmlType) -> Vec<RepackKernel> {
    let mut out = Vec::new();
    for isa in [Isa::Avx512Vnni, Isa::Avx2] {
        match repack_kernel(ty, isa) {
            Some(k) => out.push(k),
            None => eprintln!("no {isa} on this CPU: the repacked {ty} kernel is not tested here"),
        }
    }
    out
}

/// Packs `rows` rows, runs `n_act` activation rows through the kernel and returns `out[j * rows + i]`.
#[allow(clippy::too_many_arguments)]
fn run(
    k: RepackKernel,
    n: usize,
    w: &[u8],
    ws: usize,
    rows: usize,
    a: &[u8],
    as_: usize,
    n_act: usize,
) -> Vec<f32> {
    let mut packed = vec![0xA5u8; k.packed_len(n, rows) + 7];
    k.pack(n, w, ws, rows, &mut packed);
    let mut ys = vec![f32::NAN; k.scales_len(n, n_act)];
    k.act_scales(n, a, as_, n_act, &mut ys);
    let mut out = vec![f32::NAN; n_act * rows];
    let mut seen = vec![0u32; n_act * rows];
    k.run_with(n, &packed, rows, a, as_, &ys, n_act, |j, i0, vals| {
        for (i, &v) in vals.iter().enumerate() {
            out[j * rows + i0 + i] = v;
            seen[j * rows + i0 + i] += 1;
        }
    });
    assert!(seen.iter().all(|&s| s == 1), "every pair exactly once");
    out
}

#[test]
fn repacked_kernel_equals_its_scalar_model_bit_for_bit() {
    let mut rng = rng(0x7e9a);
    for (ty, k) in TYPES
        .into_iter()
        .flat_map(|ty| kernels(ty).into_iter().map(move |k| (ty, k)))
    {
        let at = vec_dot_type(ty);
        let row_kernel = dot_kernel(ty, Isa::detect()).unwrap();
        for &n in lengths(ty) {
            for (rows, n_act) in [
                (1, 1),
                (7, 2),
                (8, 3),
                (9, 1),
                (17, 5),
                (24, 4),
                (16, 6),
                (33, 7),
                (16, 11),
                (17, 19),
            ] {
                let (wrow, arow) = (
                    ty.row_bytes(n as u64).unwrap() as usize,
                    at.row_bytes(n as u64).unwrap() as usize,
                );
                let (ws, as_) = (wrow + 5, arow + 3);
                let w = random_weights(&mut rng, ty, n, rows, ws);
                let (a, _) = random_acts(&mut rng, ty, n, n_act, as_);
                let got = run(k, n, &w, ws, rows, &a, as_, n_act);
                for j in 0..n_act {
                    for i in 0..rows {
                        let want = repacked_dot_reference(
                            ty,
                            n,
                            &w[i * ws..i * ws + wrow],
                            &a[j * as_..j * as_ + arow],
                        );
                        assert_eq!(
                            got[j * rows + i].to_bits(),
                            want.to_bits(),
                            "{ty} n={n} rows={rows} n_act={n_act}: row {i}, act {j}: {} vs {want}",
                            got[j * rows + i]
                        );
                        if is_k(ty) {
                            let dot = row_kernel.dot(
                                n,
                                &w[i * ws..i * ws + wrow],
                                &a[j * as_..j * as_ + arow],
                            );
                            assert_eq!(dot.to_bits(), want.to_bits(), "{ty}: the row kernel");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn repacked_rows_do_not_depend_on_their_neighbours() {
    let mut rng = rng(0x51de);
    for (ty, k) in TYPES
        .into_iter()
        .flat_map(|ty| kernels(ty).into_iter().map(move |k| (ty, k)))
    {
        let (n, rows, n_act) = (if is_k(ty) { 512 } else { 320 }, 19, 7);
        let arow = vec_dot_type(ty).row_bytes(n as u64).unwrap() as usize;
        let wrow = ty.row_bytes(n as u64).unwrap() as usize;
        let w = random_weights(&mut rng, ty, n, rows, wrow);
        let (a, _) = random_acts(&mut rng, ty, n, n_act, arow);
        let all = run(k, n, &w, wrow, rows, &a, arow, n_act);
        for j in 0..n_act {
            let one = run(k, n, &w, wrow, rows, &a[j * arow..(j + 1) * arow], arow, 1);
            for i in 0..rows {
                assert_eq!(
                    one[i].to_bits(),
                    all[j * rows + i].to_bits(),
                    "{ty} act {j} row {i}"
                );
            }
        }
    }
}

#[test]
fn repacked_model_matches_the_dequantized_product() {
    let mut rng = rng(0x0dd5);
    for ty in TYPES {
        let n = if is_k(ty) { 768 } else { 576 };
        let (wrow, arow) = (
            ty.row_bytes(n as u64).unwrap() as usize,
            vec_dot_type(ty).row_bytes(n as u64).unwrap() as usize,
        );
        let w = random_weights(&mut rng, ty, n, 1, wrow);
        let (a, x) = random_acts(&mut rng, ty, n, 1, arow);
        let mut wf = vec![0f32; n];
        dequantize(ty, &w, &mut wf).unwrap();
        let mut xq = vec![0f32; n];
        dequantize(vec_dot_type(ty), &a, &mut xq).unwrap();
        // The activation's own quantization error aside, the model computes W · dequant(a) (Q4_1's min term from
        // the f16 `s = d · Σq`, rounded once more).
        let exact: f64 = wf.iter().zip(&xq).map(|(&u, &v)| u as f64 * v as f64).sum();
        let scale: f64 = wf
            .iter()
            .zip(&xq)
            .map(|(&u, &v)| (u as f64 * v as f64).abs())
            .sum();
        let got = repacked_dot_reference(ty, n, &w, &a) as f64;
        assert!(
            (got - exact).abs() <= 2e-3 * scale,
            "{ty}: {got} vs {exact} (scale {scale})"
        );
        let loose: f64 = wf.iter().zip(&x).map(|(&u, &v)| u as f64 * v as f64).sum();
        assert!(
            (got - loose).abs() <= 0.05 * scale,
            "{ty}: {got} vs f32 activations {loose}"
        );
    }
}

/// What the engine gets on this CPU: every type's repacked kernel wherever there is AVX2, and the K-quants'
/// AVX2 form marked decode-only (their AVX-512 form serves every row count).
#[test]
fn this_cpu_gets_every_repacked_kernel() {
    let isa = Isa::detect();
    eprintln!("this CPU: {isa}");
    for ty in TYPES {
        let k = repack_kernel(ty, isa);
        if isa == Isa::Scalar {
            assert!(k.is_none(), "{ty}: no repacked kernel without SIMD");
            continue;
        }
        let k = k.unwrap_or_else(|| panic!("{ty}: no repacked kernel on {isa}"));
        assert_eq!(
            k.decode_only(),
            is_k(ty) && isa == Isa::Avx2,
            "{ty} on {isa}"
        );
        assert_eq!(k.group_rows(), if is_k(ty) { 16 } else { 8 }, "{ty}");
    }
}
