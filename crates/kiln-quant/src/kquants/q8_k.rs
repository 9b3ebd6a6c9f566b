//! Q8_K: the 8-bit activation super-block the K-quant dot products multiply against.

use super::nearest_int;
use crate::blocks::{BlockQ8K, QK_K};
use bytemuck::Zeroable;

/// Q8_K super-block to 256 floats: `y = d * q`.
pub fn dequantize_q8_k(b: &BlockQ8K, y: &mut [f32; QK_K]) {
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = b.d * q as f32;
    }
}

/// 256 floats to a Q8_K super-block (`quantize_row_q8_K_ref`): `iscale = -127 / max` where `max` is the
/// signed element of largest magnitude, `q = min(127, nearest_int(iscale * x))` (ties to even),
/// `d = 1 / iscale`, and `bsums` the sums of each 16 quants.
///
/// Current ggml uses -127 (it once used -128; the change keeps every quant in [-127, 127], which the
/// IQ2_XXS dot product needs). For an all-zero input ggml leaves `bsums` untouched; here they are 0,
/// which is what the zero quants sum to.
pub fn quantize_q8_k(x: &[f32; QK_K]) -> BlockQ8K {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let mut b = BlockQ8K::zeroed();
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    for (s, qs) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = qs.iter().map(|&q| q as i16).sum();
    }
    b.d = 1.0 / iscale;
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_k_uses_127_and_sums_per_16() {
        let x: [f32; QK_K] = std::array::from_fn(|i| (i as f32 - 100.0) / 155.0);
        let b = quantize_q8_k(&x);
        // max = x[255] = 1.0, so iscale = -127: the largest element maps to -127 and d = -1/127.
        assert_eq!(b.qs[255], -127);
        assert_eq!(b.qs[100], 0);
        assert_eq!(b.qs[0], 82, "nearest_int(-127 * -100/155) = 82");
        assert_eq!(b.d, 1.0 / (-127.0f32 / 1.0));
        for j in 0..16 {
            let s: i16 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
            assert_eq!(b.bsums[j], s);
        }
        let mut y = [0f32; QK_K];
        dequantize_q8_k(&b, &mut y);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(a, b)| (a - b).abs() <= 0.5 / 127.0 + 1e-6));
        let z = quantize_q8_k(&[0.0; QK_K]);
        assert_eq!(z.d, 0.0);
        assert!(z.qs.iter().all(|&q| q == 0) && z.bsums.iter().all(|&s| s == 0));
    }
}
