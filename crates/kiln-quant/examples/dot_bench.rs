//! Single-thread GEMV speed of the dot kernels: a 4096 × 4096 weight matrix times one activation row, per
//! type and ISA, in GB/s of weight bytes. "hot": one matrix, cache-resident where it fits (kernel speed);
//! "dram": matrices cycled over 512 MiB, so weights stream from memory as in decoding (also with the rows
//! split over 2 threads); "x4": one pass against 4 activation rows through `dot_rows`. Also prints the
//! memory read bandwidth of this machine (1 and 2 threads) as the ceiling to compare with.
//!
//! `cargo run --release -p kiln-quant --example dot_bench [-- TYPE...]`

use half::f16;
use kiln_quant::dot::{dot_fn, dot_kernel, quantize_activation, vec_dot_type, Isa};
use kiln_quant::GgmlType;
use std::hint::black_box;
use std::time::{Duration, Instant};

const ROWS: usize = 4096;
const COLS: usize = 4096;
const DRAM_BYTES: usize = 512 << 20;

/// Offsets of the f16 scales of each block (random bits there could be inf/NaN and slow nothing, but keep the
/// data realistic).
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

/// A deterministic pseudo-random weight matrix with finite scales.
fn weights(ty: GgmlType, seed: u64) -> Vec<u8> {
    let len = ROWS * ty.row_bytes(COLS as u64).expect("4096 is whole blocks") as usize;
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut w: Vec<u8> = (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    let small = f16::from_f32(0.01).to_le_bytes();
    match ty {
        GgmlType::F32 => w
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&(c[0] as f32 / 256.0).to_le_bytes())),
        GgmlType::F16 | GgmlType::BF16 => w.chunks_exact_mut(2).for_each(|c| c[1] &= 0x3f),
        _ => {
            for b in w.chunks_exact_mut(ty.block_bytes()) {
                for &o in f16_fields(ty) {
                    b[o..o + 2].copy_from_slice(&small);
                }
            }
        }
    }
    w
}

/// Seconds per full GEMV over `mats` (cycling), best of a few timed passes after a warm-up.
/// With `threads` > 1 the rows are split between scoped threads spawned per pass (their start-up cost is
/// counted: a few percent of a pass).
fn gemv_time(
    f: kiln_quant::dot::DotFn,
    ty: GgmlType,
    mats: &[Vec<u8>],
    a: &[u8],
    threads: usize,
) -> f64 {
    let rb = ty.row_bytes(COLS as u64).expect("whole blocks") as usize;
    let mut out = vec![0f32; ROWS];
    let mut run = |m: &Vec<u8>| {
        let part = ROWS / threads;
        std::thread::scope(|s| {
            for (t, chunk) in out.chunks_mut(part).enumerate() {
                let mut work = move || {
                    for (k, o) in chunk.iter_mut().enumerate() {
                        let r = t * part + k;
                        *o = f(COLS, &m[r * rb..(r + 1) * rb], a);
                    }
                };
                if threads == 1 {
                    work();
                } else {
                    s.spawn(work);
                }
            }
        });
        black_box(&out);
    };
    for m in mats {
        run(m);
    }
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < Duration::from_millis(600) || i < 3 {
        let t = Instant::now();
        run(&mats[i % mats.len()]);
        best = best.min(t.elapsed().as_secs_f64());
        i += 1;
    }
    best
}

/// Seconds per GEMV of one matrix against 4 activation rows (`dot_rows`), best of several.
fn gemm4_time(
    k: &kiln_quant::dot::DotKernel,
    ty: GgmlType,
    m: &[u8],
    a4: &[u8],
    stride: usize,
) -> f64 {
    let rb = ty.row_bytes(COLS as u64).expect("whole blocks") as usize;
    let mut out = vec![0f32; 4 * ROWS];
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < Duration::from_millis(600) || i < 3 {
        let t = Instant::now();
        for (r, o) in out.chunks_exact_mut(4).enumerate() {
            k.dot_rows(COLS, &m[r * rb..(r + 1) * rb], a4, stride, o);
        }
        black_box(&out);
        best = best.min(t.elapsed().as_secs_f64());
        i += 1;
    }
    best
}

/// Sum of a slice with four independent AVX2 accumulators (load-bound, not add-bound); plain Rust elsewhere.
fn sum_u64(part: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn imp(part: &[u64]) -> u64 {
            use std::arch::x86_64::*;
            let mut acc = [_mm256_setzero_si256(); 4];
            let chunks = part.chunks_exact(16);
            let rest: u64 = chunks.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
            for c in chunks {
                for (k, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: c holds 16 u64, k * 4 + 4 <= 16.
                    let v = unsafe { _mm256_loadu_si256(c.as_ptr().add(4 * k).cast()) };
                    *acc = _mm256_add_epi64(*acc, v);
                }
            }
            let mut out = [0u64; 4];
            let s = _mm256_add_epi64(
                _mm256_add_epi64(acc[0], acc[1]),
                _mm256_add_epi64(acc[2], acc[3]),
            );
            // SAFETY: out holds 4 u64.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), s) };
            out.iter().fold(rest, |a, &b| a.wrapping_add(b))
        }
        // SAFETY: AVX2 was detected just above.
        return unsafe { imp(part) };
    }
    part.iter().fold(0, |a, &b| a.wrapping_add(b))
}

/// Read bandwidth in GB/s with `threads` threads, each streaming its half of `buf` in 2 MiB pieces, three
/// sweeps. Each piece is timed on its own and the 90th-percentile rate is kept: on a shared machine a long
/// timed loop mostly measures the scheduler, a 2 MiB piece (~0.1 ms) usually runs undisturbed.
fn read_bandwidth(buf: &[u64], threads: usize) -> f64 {
    let piece = (2 << 20) / 8;
    let rates: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks(buf.len() / threads)
            .map(|part| {
                s.spawn(move || {
                    let mut rates = Vec::new();
                    for _ in 0..3 {
                        for p in part.chunks(piece) {
                            let t = Instant::now();
                            black_box(sum_u64(p));
                            rates.push((p.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
                        }
                    }
                    rates
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bandwidth thread"))
            .collect()
    });
    rates
        .into_iter()
        .map(|mut r| {
            r.sort_by(f64::total_cmp);
            r[r.len() * 9 / 10]
        })
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let types: Vec<GgmlType> = if args.is_empty() {
        vec![
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::IQ4_NL,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::IQ2_XXS,
        ]
    } else {
        args.iter()
            .map(|a| GgmlType::from_name(a).unwrap_or_else(|| panic!("unknown type {a}")))
            .collect()
    };
    let buf: Vec<u64> = (0..(1u64 << 26)).collect();
    println!(
        "memory read bandwidth: {:.1} GB/s (1 thread), {:.1} GB/s (2 threads)",
        read_bandwidth(&buf, 1),
        read_bandwidth(&buf, 2)
    );
    drop(buf);
    println!("{ROWS}x{COLS} weights, 1 thread, GB/s of weight bytes (ms per pass); x4: 4 activation rows");
    println!(
        "per pass through dot_rows, GB/s counted per activation row (4 x weight bytes / time)"
    );
    println!(
        "{:8} {:11} {:>16} {:>16} {:>16}",
        "type", "isa", "hot", "dram", "hot x4"
    );
    let x: Vec<f32> = (0..COLS)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    for ty in types {
        let at = vec_dot_type(ty);
        let mut a = vec![0u8; at.row_bytes(COLS as u64).expect("whole blocks") as usize];
        quantize_activation(at, &x, &mut a).expect("activation row");
        let a4: Vec<u8> = (0..4).flat_map(|_| a.iter().copied()).collect();
        let mat_bytes = ROWS * ty.row_bytes(COLS as u64).expect("whole blocks") as usize;
        let n_cold = DRAM_BYTES.div_ceil(mat_bytes).max(2);
        let mats: Vec<Vec<u8>> = (0..n_cold as u64).map(|s| weights(ty, s + 1)).collect();
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let f = dot_fn(ty, isa).expect("every weight type has a kernel");
            let k = dot_kernel(ty, isa).expect("every weight type has a kernel");
            let hot = gemv_time(f, ty, &mats[..1], &a, 1);
            let cold = gemv_time(f, ty, &mats, &a, 1);
            let cold2 = gemv_time(f, ty, &mats, &a, 2);
            let x4 = gemm4_time(&k, ty, &mats[0], &a4, a.len());
            let gb = mat_bytes as f64 / 1e9;
            println!(
                "{:8} {:11} {:>7.2} ({:5.2}ms) {:>7.2} ({:5.2}ms) {:>7.2} ({:5.2}ms) {:>7.2} ({:5.2}ms)",
                ty.name(),
                isa.name(),
                gb / hot,
                hot * 1e3,
                gb / cold,
                cold * 1e3,
                gb / cold2,
                cold2 * 1e3,
                4.0 * gb / x4,
                x4 * 1e3
            );
        }
    }
}
