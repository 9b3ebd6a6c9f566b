//! Dot kernels on real weight rows (SmolLM2-135M Q4_1/Q8_0, Gemma-3-270M Q4_K/Q6_K/Q5_0) against an independent
//! oracle: the rows as dequantized by the `gguf` Python package (tests/fixtures/dot_rows.bin, written by
//! tools/gen_dot_fixtures.py), times the activation row dequantized here by hand, summed in f64.

use half::f16;
use kiln_quant::dot::{dot_kernel, quantize_activation, vec_dot_type, Isa};
use kiln_quant::{dequantize, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const FIXTURE: &[u8] = include_bytes!("fixtures/dot_rows.bin");

struct Record {
    name: String,
    ty: GgmlType,
    n: usize,
    raw: Vec<Vec<u8>>,
    deq: Vec<Vec<f32>>,
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    head
}

fn u32_at(buf: &mut &[u8]) -> usize {
    u32::from_le_bytes(take(buf, 4).try_into().unwrap()) as usize
}

fn records() -> Vec<Record> {
    let mut buf = FIXTURE;
    assert_eq!(take(&mut buf, 4), b"KDOT");
    let count = u32_at(&mut buf);
    let out: Vec<Record> = (0..count)
        .map(|_| {
            let len = u32_at(&mut buf);
            let name = String::from_utf8(take(&mut buf, len).to_vec()).unwrap();
            let ty = GgmlType::from_id(u32_at(&mut buf) as u32).unwrap();
            let (n, rows) = (u32_at(&mut buf), u32_at(&mut buf));
            let rb = ty.row_bytes(n as u64).unwrap() as usize;
            let raw = (0..rows).map(|_| take(&mut buf, rb).to_vec()).collect();
            let deq = (0..rows)
                .map(|_| {
                    take(&mut buf, 4 * n)
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                        .collect()
                })
                .collect();
            Record {
                name,
                ty,
                n,
                raw,
                deq,
            }
        })
        .collect();
    assert!(buf.is_empty(), "trailing bytes in the fixture");
    out
}

/// An activation row dequantized by hand from its block bytes (Q8_0/Q8_1: f16 d; Q8_K: f32 d).
fn dequant_activation(at: GgmlType, a: &[u8]) -> Vec<f32> {
    let (qs_off, qn) = match at {
        GgmlType::Q8_0 => (2, 32),
        GgmlType::Q8_1 => (4, 32),
        GgmlType::Q8_K => (4, 256),
        _ => unreachable!("the fixture holds only block types"),
    };
    a.chunks_exact(at.block_bytes())
        .flat_map(|b| {
            let d = if at == GgmlType::Q8_K {
                f32::from_le_bytes(b[..4].try_into().unwrap())
            } else {
                f16::from_le_bytes([b[0], b[1]]).to_f32()
            };
            b[qs_off..qs_off + qn]
                .iter()
                .map(move |&q| d * q as i8 as f32)
        })
        .collect()
}

/// Σ|m·s| over the blocks of a Q4_1 row: the part of the dot through the f16-rounded activation sum s.
fn min_term(ty: GgmlType, w: &[u8], a: &[u8]) -> f64 {
    if ty != GgmlType::Q4_1 {
        return 0.0;
    }
    let f = |b: &[u8]| f16::from_le_bytes([b[2], b[3]]).to_f32() as f64;
    w.chunks_exact(ty.block_bytes())
        .zip(a.chunks_exact(GgmlType::Q8_1.block_bytes()))
        .map(|(w, a)| (f(w) * f(a)).abs())
        .sum()
}

#[test]
fn fixture_covers_the_test_models_types() {
    let types: Vec<GgmlType> = records().iter().map(|r| r.ty).collect();
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
    ] {
        assert!(types.contains(&ty), "{ty} missing from the fixture");
    }
}

#[test]
fn kiln_dequantizes_the_real_rows_like_gguf() {
    for r in records() {
        for (raw, want) in r.raw.iter().zip(&r.deq) {
            let mut got = vec![0f32; r.n];
            dequantize(r.ty, raw, &mut got).unwrap();
            assert!(
                got.iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}",
                r.name
            );
        }
    }
}

#[test]
fn dot_kernels_match_the_gguf_oracle_on_real_rows() {
    let seed: u64 = rand::random();
    eprintln!("random seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    for r in records() {
        let at = vec_dot_type(r.ty);
        let arow = at.row_bytes(r.n as u64).unwrap() as usize;
        for _ in 0..4 {
            // Activations like a normed hidden state: unit scale, a few large outliers.
            let mut a = vec![0u8; 3 * arow];
            for chunk in a.chunks_exact_mut(arow) {
                let x: Vec<f32> = (0..r.n)
                    .map(|_| {
                        rng.gen_range(-1.0f32..1.0) * if rng.gen_ratio(1, 50) { 20.0 } else { 1.0 }
                    })
                    .collect();
                quantize_activation(at, &x, chunk).unwrap();
            }
            for (raw, deq) in r.raw.iter().zip(&r.deq) {
                let af = dequant_activation(at, &a[..arow]);
                let want: f64 = deq
                    .iter()
                    .zip(&af)
                    .map(|(&w, &x)| w as f64 * x as f64)
                    .sum();
                let scale: f64 = deq
                    .iter()
                    .zip(&af)
                    .map(|(&w, &x)| (w as f64 * x as f64).abs())
                    .sum();
                let tol = 2e-5 * scale + 1e-3 * min_term(r.ty, raw, &a[..arow]) + 1e-30;
                for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                    let k = dot_kernel(r.ty, isa).unwrap();
                    let got = k.dot(r.n, raw, &a);
                    assert!(
                        (got as f64 - want).abs() <= tol,
                        "{} {isa}: {got} vs oracle {want} (tol {tol:e})",
                        r.name
                    );
                    let mut out = [0f32; 3];
                    k.dot_rows(r.n, raw, &a, arow, &mut out);
                    assert_eq!(
                        out[0].to_bits(),
                        got.to_bits(),
                        "{} {isa}: dot_rows",
                        r.name
                    );
                }
            }
        }
    }
}
