//! Single-thread speed of the repacked kernels against the row-by-row kernels (and, for Q4_K/Q6_K, the tiled
//! prefill kernel, packing included), at SmolLM2-135M's shapes (576 → 1536 and 1536 → 576) for Q4_0/Q4_1/Q8_0 and
//! Qwen3-0.6B's (1024 → 3072 and 3072 → 1024) for Q4_K/Q5_K/Q6_K, for 1 activation row (decode), 4 (a short
//! verify block) and 16 (a whole one), on weights that fit in L2 and on weights 10 and 100 times that size (read from memory), in GMAC/s; each
//! on AVX-512 VNNI and on AVX2 (all the kernels of a row on that ISA).
//!
//! `cargo run --release -p kiln-quant --example repack_bench [TYPE ...]` (e.g. `q6_K`: only those types)

use kiln_quant::dot::{
    dot_kernel, gemm_kernel, quantize_activation, repack_kernel, vec_dot_type, Isa,
};
use kiln_quant::{quantize, GgmlType};
use std::hint::black_box;
use std::time::Instant;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Best time of `reps` runs of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    println!(
        "| type | rows x cols | copies | act rows | row kernel GMAC/s | tiled GMAC/s | repacked GMAC/s | repacked / row |"
    );
    println!("|---|---|---|---|---:|---:|---:|---:|");
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    let only: Vec<String> = std::env::args().skip(1).collect();
    let runs = types
        .into_iter()
        .filter(move |ty| only.is_empty() || only.contains(&ty.to_string()))
        .flat_map(|ty| {
            let k_quant = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K);
            [Isa::Avx512Vnni, Isa::Avx2]
                .into_iter()
                .map(move |isa| (ty, k_quant, isa))
        });
    for (ty, k_quant, isa) in runs {
        let Some(k) = repack_kernel(ty, isa) else {
            println!("| {ty} | no repacked kernel on this CPU ({isa}) |");
            continue;
        };
        let at = vec_dot_type(ty);
        let shapes = if k_quant {
            [(3072usize, 1024usize), (1024, 3072)]
        } else {
            [(1536, 576), (576, 1536)]
        };
        for (m, n) in shapes {
            for copies in [1usize, 10, 100] {
                let rb = ty.row_bytes(n as u64).unwrap() as usize;
                let rows = m * copies;
                let wf = values(rows * n, 1);
                let mut w = vec![0u8; rows * rb];
                for (src, dst) in wf.chunks_exact(n).zip(w.chunks_exact_mut(rb)) {
                    quantize(ty, src, dst).unwrap();
                }
                let mut packed = vec![0u8; k.packed_len(n, rows)];
                k.pack(n, &w, rb, rows, &mut packed);
                for acts in [1usize, 4, 16] {
                    let arb = at.row_bytes(n as u64).unwrap() as usize;
                    let xf = values(acts * n, 2);
                    let mut a = vec![0u8; acts * arb];
                    for (src, dst) in xf.chunks_exact(n).zip(a.chunks_exact_mut(arb)) {
                        quantize_activation(at, src, dst).unwrap();
                    }
                    let dk = dot_kernel(ty, isa).unwrap();
                    let mut out = vec![0f32; acts * rows];
                    let t_row = best(7, || {
                        let mut tmp = [0f32; 16];
                        for r in 0..rows {
                            dk.dot_rows(n, &w[r * rb..(r + 1) * rb], &a, arb, &mut tmp[..acts]);
                            black_box(&tmp);
                        }
                    });
                    // The engine's tiled path: tiles of 32 weight rows packed, then every activation row.
                    let tiled = gemm_kernel(ty, isa).filter(|_| acts > 1).map(|g| {
                        let mut scratch = vec![0u8; g.packed_len(n, 32)];
                        best(7, || {
                            for r0 in (0..rows).step_by(32) {
                                let nr = (rows - r0).min(32);
                                g.pack(n, &w[r0 * rb..], rb, nr, &mut scratch);
                                g.run_with(n, &scratch, nr, &a, arb, acts, |j, i0, v| {
                                    out[j * rows + r0 + i0..j * rows + r0 + i0 + v.len()]
                                        .copy_from_slice(v)
                                });
                            }
                            black_box(&out);
                        })
                    });
                    let t_rep = best(7, || {
                        let mut ys = vec![0f32; k.scales_len(n, acts)];
                        k.act_scales(n, &a, arb, acts, &mut ys);
                        k.run_with(n, &packed, rows, &a, arb, &ys, acts, |j, i0, v| {
                            out[j * rows + i0..j * rows + i0 + v.len()].copy_from_slice(v)
                        });
                        black_box(&out);
                    });
                    let macs = (rows * n * acts) as f64 / 1e9;
                    let tiled = tiled.map_or("-".to_string(), |t| format!("{:.1}", macs / t));
                    println!(
                        "| {ty} {isa} | {m}x{n} | {copies} | {acts} | {:.1} | {tiled} | {:.1} | {:.2} |",
                        macs / t_row,
                        macs / t_rep,
                        t_row / t_rep
                    );
                }
            }
        }
    }
}
