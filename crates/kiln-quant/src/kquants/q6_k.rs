//! Q6_K: 16 sub-blocks of 16, 6-bit quants (4 low bits in `ql`, 2 high in `qh`), signed 8-bit scales.

use super::{make_qx_quants, nearest_int, GROUP_MAX_EPS};
use crate::blocks::{BlockQ6K, QK_K};
use bytemuck::Zeroable;
use half::f16;

/// Q6_K super-block to 256 floats: `y = d * sc * (q - 32)`, evaluated left to right.
pub fn dequantize_q6_k(b: &BlockQ6K, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    for n in 0..2 {
        let ql = &b.ql[64 * n..64 * n + 64];
        let qh = &b.qh[32 * n..32 * n + 32];
        let sc = &b.scales[8 * n..8 * n + 8];
        let out = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            out[l] = d * sc[is] as f32 * q1 as f32;
            out[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
            out[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
            out[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
        }
    }
}

/// 256 floats to a Q6_K super-block (`quantize_row_q6_K_ref`).
pub fn quantize_q6_k(x: &[f32; QK_K]) -> BlockQ6K {
    let mut big_l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(
            32,
            &x[16 * ib..16 * ib + 16],
            &mut big_l[16 * ib..16 * ib + 16],
            1,
        );
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    let mut b = BlockQ6K::zeroed();
    if max_abs_scale < GROUP_MAX_EPS {
        return b;
    }
    let iscale = -128.0 / max_scale;
    b.d = f16::from_f32(1.0 / iscale);
    for ib in 0..16 {
        b.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    for j in 0..16 {
        let d = b.d.to_f32() * b.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            big_l[16 * j + ii] = (l + 32) as i8;
        }
    }
    let big_l = big_l.map(|v| v as u8);
    for n in 0..2 {
        let (j, ql, qh) = (128 * n, 64 * n, 32 * n);
        for l in 0..32 {
            let q1 = big_l[j + l] & 0x0f;
            let q2 = big_l[j + l + 32] & 0x0f;
            let q3 = big_l[j + l + 64] & 0x0f;
            let q4 = big_l[j + l + 96] & 0x0f;
            b.ql[ql + l] = q1 | (q3 << 4);
            b.ql[ql + l + 32] = q2 | (q4 << 4);
            b.qh[qh + l] = (big_l[j + l] >> 4)
                | ((big_l[j + l + 32] >> 4) << 2)
                | ((big_l[j + l + 64] >> 4) << 4)
                | ((big_l[j + l + 96] >> 4) << 6);
        }
    }
    b
}
