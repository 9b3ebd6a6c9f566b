//! Prints how fast `dequantize` and `quantize` run per type on this machine (one thread).
//!
//! `cargo run --release -p kiln-quant --example dequant_speed [elements]` (default 50M elements).

use kiln_quant::{dequantize, quantize, GgmlType};
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(50 * 1024 * 1024);
    let n = n / 256 * 256;
    let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
    // Touch every page up front so the first type measured does not pay for the page faults.
    let mut y = vec![1f32; n];
    println!("{n} elements, single thread");
    println!("{:8} {:>12} {:>12}", "type", "dequant ms", "quant ms");
    for ty in GgmlType::ALL {
        let bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
        let mut q = vec![0u8; bytes];
        let t = Instant::now();
        let quant_ms = match quantize(ty, &x, &mut q) {
            Ok(()) => format!("{:.0}", t.elapsed().as_secs_f64() * 1e3),
            Err(_) => {
                // Not quantizable here: dequantize arbitrary (valid) bytes instead.
                for (i, b) in q.iter_mut().enumerate() {
                    *b = (i as u8).wrapping_mul(29) & 0x3b;
                }
                "-".to_string()
            }
        };
        let t = Instant::now();
        dequantize(ty, &q, &mut y).expect("sizes match");
        let deq = t.elapsed().as_secs_f64() * 1e3;
        println!("{:8} {:>12.0} {:>12}", ty.name(), deq, quant_ms);
    }
}
