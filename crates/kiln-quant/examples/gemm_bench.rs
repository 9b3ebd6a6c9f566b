//! Single-thread speed of the tiled Q4_K/Q6_K kernel against the row-by-row one, on cache-resident data: a
//! tile of 32 weight rows × 64 activation rows (a prefill chunk) at the Qwen3-0.6B widths, in GMAC/s, with the
//! packing time alone.
//!
//! `cargo run --release -p kiln-quant --example gemm_bench`

use kiln_quant::dot::{dot_kernel, gemm_kernel, quantize_activation, Isa};
use kiln_quant::{quantize, GgmlType};
use std::hint::black_box;
use std::time::Instant;

const ROWS: usize = 32;
const ACTS: usize = 64;

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
    let isa = Isa::detect();
    println!("isa {isa}; tile {ROWS} weight rows x {ACTS} activation rows");
    println!("| type | n | tiled GMAC/s | pack share | row-by-row GMAC/s |");
    println!("|---|---|---|---|---|");
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let Some(g) = gemm_kernel(ty, isa) else {
            println!("| {ty} | no tiled kernel on {isa} |");
            continue;
        };
        let k = dot_kernel(ty, isa).expect("K-quants have a kernel");
        for n in [1024, 3072] {
            let rb = ty.row_bytes(n as u64).expect("whole blocks") as usize;
            let ab = GgmlType::Q8_K.row_bytes(n as u64).expect("whole blocks") as usize;
            let mut w = vec![0u8; ROWS * rb];
            quantize(ty, &values(ROWS * n, 1), &mut w).expect("sizes match");
            let mut a = vec![0u8; ACTS * ab];
            for (j, row) in a.chunks_exact_mut(ab).enumerate() {
                quantize_activation(GgmlType::Q8_K, &values(n, 2 + j as u64), row).expect("sizes");
            }
            let mut packed = vec![0u8; g.packed_len(n, ROWS)];
            let mut out = vec![0f32; ROWS * ACTS];
            let macs = (ROWS * ACTS * n) as f64;
            let pack = best(200, || g.pack(n, black_box(&w), rb, ROWS, &mut packed));
            let run = best(50, || {
                g.run(n, black_box(&packed), ROWS, &a, ab, ACTS, &mut out);
            });
            let mut tmp = [0f32; 32];
            let rows = best(20, || {
                for j0 in (0..ACTS).step_by(32) {
                    for r in 0..ROWS {
                        k.dot_rows(n, &w[r * rb..], &a[j0 * ab..], ab, &mut tmp);
                    }
                }
                black_box(&tmp);
            });
            println!(
                "| {ty} | {n} | {:.1} | {:.1} % | {:.1} |",
                macs / (pack + run) / 1e9,
                100.0 * pack / (pack + run),
                macs / rows / 1e9
            );
        }
    }
}
