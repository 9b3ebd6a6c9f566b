//! Q4_K: 8 sub-blocks of 32, 4-bit quants, 6-bit scale and min per sub-block, f16 super-scales.

use super::{get_scale_min_k4, make_qkx2_quants, nearest_int, set_scale_min_k4, Qkx2Search};
use crate::blocks::{BlockQ4K, QK_K};
use half::f16;

/// Q4_K super-block to 256 floats: `d1 = d * sc; m1 = dmin * m; y = d1 * q - m1`.
pub fn dequantize_q4_k(b: &BlockQ4K, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let min = b.dmin.to_f32();
    for (j, q) in b.qs.chunks_exact(32).enumerate() {
        let (sc, m) = get_scale_min_k4(2 * j, &b.scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = get_scale_min_k4(2 * j + 1, &b.scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        let out = &mut y[64 * j..64 * j + 64];
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0f) as f32 - m1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Runs the per-sub-block search shared by Q4_K and Q5_K (`nmax` 15 or 31) and fills in the packed
/// scales and super-scales of the result; returns the quants `L` (0..=nmax) for all 256 elements.
pub(super) fn quantize_k4_scales(
    x: &[f32; QK_K],
    search: &Qkx2Search,
    scales_out: &mut [u8; 12],
    d_out: &mut f16,
    dmin_out: &mut f16,
) -> [u8; QK_K] {
    let mut big_l = [0u8; QK_K];
    let mut laux = [0u8; 32];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| av_x + xs[l].abs());
        let (scale, min) = make_qkx2_quants(
            search,
            xs,
            &weights,
            &mut big_l[32 * j..32 * j + 32],
            &mut laux,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    *scales_out = [0; 12];
    for j in 0..8 {
        // ggml stores the int into a uint8_t before the MIN: keep the low byte.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        set_scale_min_k4(j, scales_out, ls, lm);
    }
    *d_out = f16::from_f32(max_scale / 63.0);
    *dmin_out = f16::from_f32(max_min / 63.0);
    // Requantize against the rounded scales actually stored.
    let nmax = search.nmax;
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, scales_out);
        let d = d_out.to_f32() * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_out.to_f32() * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / d);
            big_l[32 * j + ii] = l.clamp(0, nmax) as u8;
        }
    }
    big_l
}

/// 256 floats to a Q4_K super-block (`quantize_row_q4_K_ref`).
pub fn quantize_q4_k(x: &[f32; QK_K]) -> BlockQ4K {
    let search = Qkx2Search {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let mut b = BlockQ4K {
        d: f16::ZERO,
        dmin: f16::ZERO,
        scales: [0; 12],
        qs: [0; 128],
    };
    let big_l = quantize_k4_scales(x, &search, &mut b.scales, &mut b.d, &mut b.dmin);
    for j in 0..4 {
        for l in 0..32 {
            b.qs[32 * j + l] = big_l[64 * j + l] | (big_l[64 * j + l + 32] << 4);
        }
    }
    b
}
