//! Q5_K: Q4_K's layout plus a fifth bit per quant in `qh`.

use super::get_scale_min_k4;
use super::q4_k::quantize_k4_scales;
use super::Qkx2Search;
use crate::blocks::{BlockQ5K, QK_K};
use half::f16;

/// Q5_K super-block to 256 floats: `y = d1 * (q + (hbit ? 16 : 0)) - m1`, as Q4_K.
pub fn dequantize_q5_k(b: &BlockQ5K, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let min = b.dmin.to_f32();
    let (mut u1, mut u2) = (1u8, 2u8);
    for (j, ql) in b.qs.chunks_exact(32).enumerate() {
        let (sc, m) = get_scale_min_k4(2 * j, &b.scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = get_scale_min_k4(2 * j + 1, &b.scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        let out = &mut y[64 * j..64 * j + 64];
        for l in 0..32 {
            let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - m1;
            out[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
        u1 <<= 2;
        u2 <<= 2;
    }
}

/// 256 floats to a Q5_K super-block (`quantize_row_q5_K_ref`).
pub fn quantize_q5_k(x: &[f32; QK_K]) -> BlockQ5K {
    let search = Qkx2Search {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    let mut b = BlockQ5K {
        d: f16::ZERO,
        dmin: f16::ZERO,
        scales: [0; 12],
        qh: [0; 32],
        qs: [0; 128],
    };
    let big_l = quantize_k4_scales(x, &search, &mut b.scales, &mut b.d, &mut b.dmin);
    let (mut m1, mut m2) = (1u8, 2u8);
    for n in 0..4 {
        for j in 0..32 {
            let mut l1 = big_l[64 * n + j];
            if l1 > 15 {
                l1 -= 16;
                b.qh[j] |= m1;
            }
            let mut l2 = big_l[64 * n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                b.qh[j] |= m2;
            }
            b.qs[32 * n + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
    b
}
