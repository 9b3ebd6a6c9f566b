//! Q3_K: 16 sub-blocks of 16, 3-bit quants (2 low bits in `qs`, the third in `hmask`), 6-bit signed
//! scales packed in 12 bytes, one f16 super-scale.

use super::{make_q3_quants, nearest_int, pack_2bit};
use crate::blocks::{BlockQ3K, QK_K};
use half::f16;

/// The 16 six-bit scales (still offset by 32) from their 12-byte packing: low nibbles in bytes 0..8
/// (sub-blocks 0..8 low, 8..16 high), the two high bits of sub-block `i` in byte `8 + i % 4` at `2 * (i / 4)`.
fn unpack_scales(s: &[u8; 12]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let lo = if i < 8 { s[i] & 0x0f } else { s[i - 8] >> 4 };
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (lo | (hi << 4)) as i8
    })
}

/// Q3_K super-block to 256 floats: `y = (d * (sc - 32)) * (q - (hbit ? 0 : 4))`.
pub fn dequantize_q3_k(b: &BlockQ3K, y: &mut [f32; QK_K]) {
    let d_all = b.d.to_f32();
    let scales = unpack_scales(&b.scales);
    let mut is = 0;
    let mut m = 1u8;
    for (half, q) in b.qs.chunks_exact(32).enumerate() {
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                let base = half * 128 + shift / 2 * 32 + part * 16;
                for l in 0..16 {
                    let k = part * 16 + l;
                    let low = ((q[k] >> shift) & 3) as i32;
                    let off = if b.hmask[k] & m != 0 { 0 } else { 4 };
                    y[base + l] = dl * (low - off) as f32;
                }
            }
            m <<= 1;
        }
    }
}

/// 256 floats to a Q3_K super-block (`quantize_row_q3_K_ref`).
pub fn quantize_q3_k(x: &[f32; QK_K]) -> BlockQ3K {
    let mut big_l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut big_l[16 * j..16 * j + 16]);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    let mut b = BlockQ3K {
        hmask: [0; 32],
        qs: [0; 64],
        scales: [0; 12],
        d: f16::ZERO,
    };
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // ggml assigns the int to an int8_t before clamping: keep that truncation.
            let l = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                b.scales[j] = l & 0x0f;
            } else {
                b.scales[j - 8] |= (l & 0x0f) << 4;
            }
            b.scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
        }
        b.d = f16::from_f32(1.0 / iscale);
    }
    let stored = unpack_scales(&b.scales);
    for j in 0..16 {
        let d = b.d.to_f32() * (stored[j] as i32 - 32) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            big_l[16 * j + ii] = (l + 4) as i8;
        }
    }
    // The high bit of element j goes to bit j / 32 of hmask[j % 32].
    let mut low = [0u8; QK_K];
    for (j, &l) in big_l.iter().enumerate() {
        let mut l = l as u8;
        if l > 3 {
            b.hmask[j % 32] |= 1 << (j / 32);
            l -= 4;
        }
        low[j] = l;
    }
    pack_2bit(&low, &mut b.qs);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_unpacking_matches_the_bit_layout() {
        let mut s = [0u8; 12];
        s[0] = 0x5a; // sub-block 0 low nibble 0xa, sub-block 8 low nibble 0x5
        s[8] = 0b1110_0001; // high bits: sub-block 0 -> 01, 4 -> 00, 8 -> 10, 12 -> 11
        let u = unpack_scales(&s);
        assert_eq!(u[0], 0x1a);
        assert_eq!(u[8], 0x25);
        assert_eq!(u[12], 0x30);
        assert_eq!(u[4], 0x00);
    }
}
