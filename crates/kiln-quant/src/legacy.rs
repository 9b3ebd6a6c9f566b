//! The legacy 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Every function here is the scalar reference for one block and mirrors ggml's `quantize_row_*_ref` /
//! `dequantize_row_*` operation for operation (same float expression order, same truncating casts), so
//! results are bit-identical to ggml and to the `gguf` Python package. Rust never fuses `a * b + c`
//! into an FMA on its own, which is what keeps `q * d + m` bit-exact.

use crate::blocks::*;
use half::f16;

const H: usize = QK / 2;

/// Element `j` of the two nibble halves: `j` in the low nibble of byte `j`, `j + 16` in the high one.
#[inline]
fn nibbles(qs: &[u8; H], j: usize) -> (u8, u8) {
    (qs[j] & 0x0f, qs[j] >> 4)
}

/// The sign-carrying absolute maximum: the first element of largest magnitude, with its sign.
#[inline]
fn signed_absmax(x: &[f32; QK]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[inline]
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline]
fn abs_max(x: &[f32; QK]) -> f32 {
    // ggml's MAX(a, b) is `a > b ? a : b`; with NaN inputs that keeps `amax`, as f32::max would not
    // always, so the comparison is spelled out.
    x.iter()
        .fold(0f32, |a, v| if a > v.abs() { a } else { v.abs() })
}

/// Q4_0 block to 32 floats: `y = (q - 8) * d`.
pub fn dequantize_q4_0(b: &BlockQ4_0, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for j in 0..H {
        let (lo, hi) = nibbles(&b.qs, j);
        y[j] = (lo as i32 - 8) as f32 * d;
        y[j + H] = (hi as i32 - 8) as f32 * d;
    }
}

/// 32 floats to a Q4_0 block (`quantize_row_q4_0_ref`).
pub fn quantize_q4_0(x: &[f32; QK]) -> BlockQ4_0 {
    let max = signed_absmax(x);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; H];
    for j in 0..H {
        // `as i8` truncates toward zero like C's (int8_t) cast (and saturates where C is undefined).
        let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let q1 = ((x[j + H] * id + 8.5) as i8).min(15) as u8;
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_0 {
        d: f16::from_f32(d),
        qs,
    }
}

/// Q4_1 block to 32 floats: `y = q * d + m`.
pub fn dequantize_q4_1(b: &BlockQ4_1, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    let m = b.m.to_f32();
    for j in 0..H {
        let (lo, hi) = nibbles(&b.qs, j);
        y[j] = lo as f32 * d + m;
        y[j + H] = hi as f32 * d + m;
    }
}

/// 32 floats to a Q4_1 block (`quantize_row_q4_1_ref`).
pub fn quantize_q4_1(x: &[f32; QK]) -> BlockQ4_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; H];
    for j in 0..H {
        let q0 = ((((x[j] - min) * id) + 0.5) as i8).min(15) as u8;
        let q1 = ((((x[j + H] - min) * id) + 0.5) as i8).min(15) as u8;
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(min),
        qs,
    }
}

/// Q5_0 block to 32 floats: `y = (q - 16) * d`, the fifth bit of element j in bit j of `qh`.
pub fn dequantize_q5_0(b: &BlockQ5_0, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..H {
        let (lo, hi) = nibbles(&b.qs, j);
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = ((lo | h0) as i32 - 16) as f32 * d;
        y[j + H] = ((hi | h1) as i32 - 16) as f32 * d;
    }
}

/// 32 floats to a Q5_0 block (`quantize_row_q5_0_ref`).
pub fn quantize_q5_0(x: &[f32; QK]) -> BlockQ5_0 {
    let max = signed_absmax(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; H];
    let mut qh = 0u32;
    for j in 0..H {
        let q0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
        let q1 = ((x[j + H] * id + 16.5) as i8).min(31) as u8;
        qs[j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + H);
    }
    BlockQ5_0 {
        d: f16::from_f32(d),
        qh: qh.to_le_bytes(),
        qs,
    }
}

/// Q5_1 block to 32 floats: `y = q * d + m`.
pub fn dequantize_q5_1(b: &BlockQ5_1, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    let m = b.m.to_f32();
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..H {
        let (lo, hi) = nibbles(&b.qs, j);
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        y[j] = (lo | h0) as f32 * d + m;
        y[j + H] = (hi | h1) as f32 * d + m;
    }
}

/// 32 floats to a Q5_1 block (`quantize_row_q5_1_ref`).
pub fn quantize_q5_1(x: &[f32; QK]) -> BlockQ5_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; H];
    let mut qh = 0u32;
    for j in 0..H {
        // ggml casts straight to uint8_t here (no MIN): the largest value is 31.5 at most.
        let q0 = (((x[j] - min) * id) + 0.5) as u8;
        let q1 = (((x[j + H] - min) * id) + 0.5) as u8;
        qs[j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + H);
    }
    BlockQ5_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(min),
        qh: qh.to_le_bytes(),
        qs,
    }
}

/// Q8_0 block to 32 floats: `y = q * d`.
pub fn dequantize_q8_0(b: &BlockQ8_0, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for (y, q) in y.iter_mut().zip(b.qs) {
        *y = q as f32 * d;
    }
}

/// 32 floats to a Q8_0 block (`quantize_row_q8_0_ref`): `d = amax / 127`, `q = round(x / d)` with ties
/// away from zero. This is the exact reference for the activation quantizers of the dot products.
pub fn quantize_q8_0(x: &[f32; QK]) -> BlockQ8_0 {
    let d = abs_max(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    for (q, v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    BlockQ8_0 {
        d: f16::from_f32(d),
        qs,
    }
}

/// Q8_1 block to 32 floats: `y = q * d` (the stored sum is not needed).
pub fn dequantize_q8_1(b: &BlockQ8_1, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for (y, q) in y.iter_mut().zip(b.qs) {
        *y = q as f32 * d;
    }
}

/// 32 floats to a Q8_1 block (`quantize_row_q8_1_ref`): as Q8_0, plus `s = sum(q) * d` (with the f32
/// `d`, before it is rounded to f16).
pub fn quantize_q8_1(x: &[f32; QK]) -> BlockQ8_1 {
    let d = abs_max(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    let mut sum = 0i32;
    for j in 0..H {
        qs[j] = (x[j] * id).round() as i8;
        qs[j + H] = (x[j + H] * id).round() as i8;
        sum += qs[j] as i32 + qs[j + H] as i32;
    }
    BlockQ8_1 {
        d: f16::from_f32(d),
        s: f16::from_f32(sum as f32 * d),
        qs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> [f32; QK] {
        std::array::from_fn(|i| (i as f32 - 12.0) * 0.25)
    }

    #[test]
    fn q4_0_layout_and_values() {
        let mut b = BlockQ4_0 {
            d: f16::from_f32(0.5),
            qs: [0; H],
        };
        b.qs[0] = 0x9f; // element 0 = 15, element 16 = 9
        let mut y = [0f32; QK];
        dequantize_q4_0(&b, &mut y);
        assert_eq!(y[0], 3.5);
        assert_eq!(y[16], 0.5);
        assert_eq!(y[1], -4.0);
        // The element of largest magnitude maps to -8 exactly (d = max / -8).
        let q = quantize_q4_0(&ramp());
        dequantize_q4_0(&q, &mut y);
        assert_eq!(y[31], ramp()[31]);
    }

    #[test]
    fn q5_high_bits_follow_qh() {
        let mut b = BlockQ5_1 {
            d: f16::from_f32(1.0),
            m: f16::from_f32(-16.0),
            qh: 0x8000_0001u32.to_le_bytes(),
            qs: [0; H],
        };
        b.qs[15] = 0xf0; // element 31 low nibble = 15
        let mut y = [0f32; QK];
        dequantize_q5_1(&b, &mut y);
        assert_eq!(y[0], 0.0, "bit 0 set: q = 16");
        assert_eq!(y[31], 15.0, "bit 31 set, nibble 15: q = 31");
        assert_eq!(y[1], -16.0);
    }

    #[test]
    fn legacy_round_trips_are_close() {
        let x = ramp();
        let mut y = [0f32; QK];
        let step = 43.0 * 0.25 / 15.0;
        dequantize_q4_1(&quantize_q4_1(&x), &mut y);
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() <= step * 0.51));
        dequantize_q5_1(&quantize_q5_1(&x), &mut y);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(a, b)| (a - b).abs() <= step * 0.51 / 2.0));
        dequantize_q5_0(&quantize_q5_0(&x), &mut y);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(a, b)| (a - b).abs() <= 4.75 / 16.0 * 0.51));
        dequantize_q8_0(&quantize_q8_0(&x), &mut y);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(a, b)| (a - b).abs() <= 4.75 / 127.0 * 0.51));
    }

    #[test]
    fn q8_1_sum_matches_quants() {
        let b = quantize_q8_1(&ramp());
        let q0 = quantize_q8_0(&ramp());
        assert_eq!(b.qs, q0.qs);
        assert_eq!(b.d, q0.d);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        let d = 4.75f32 / 127.0;
        assert_eq!(b.s, f16::from_f32(sum as f32 * d));
        let mut y = [0f32; QK];
        dequantize_q8_1(&b, &mut y);
        assert_eq!(y[12], 0.0);
    }

    #[test]
    fn zero_block_quantizes_to_zero() {
        let z = [0f32; QK];
        let mut y = [1f32; QK];
        dequantize_q4_0(&quantize_q4_0(&z), &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
        let b = quantize_q8_0(&z);
        assert_eq!(b.qs, [0; QK]);
        assert_eq!(b.d.to_f32(), 0.0);
    }
}
