//! Q2_K: 16 sub-blocks of 16, 2-bit quants, 4-bit scale and 4-bit min per sub-block, f16 super-scales.

use super::{make_qkx2_quants, nearest_int, pack_2bit, Qkx2Search};
use crate::blocks::{BlockQ2K, QK_K};
use half::f16;

/// Q2_K super-block to 256 floats: `y = (d * sc) * q - (dmin * m)`.
pub fn dequantize_q2_k(b: &BlockQ2K, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let min = b.dmin.to_f32();
    let mut is = 0;
    for (half, q) in b.qs.chunks_exact(32).enumerate() {
        for shift in [0, 2, 4, 6] {
            for part in 0..2 {
                let sc = b.scales[is];
                is += 1;
                let dl = d * (sc & 0x0f) as f32;
                let ml = min * (sc >> 4) as f32;
                let base = half * 128 + shift / 2 * 32 + part * 16;
                for l in 0..16 {
                    y[base + l] = dl * ((q[part * 16 + l] >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// 256 floats to a Q2_K super-block (`quantize_row_q2_K_ref`).
pub fn quantize_q2_k(x: &[f32; QK_K]) -> BlockQ2K {
    const Q4SCALE: f32 = 15.0;
    let search = Qkx2Search {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let mut big_l = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
        let (scale, min) = make_qkx2_quants(
            &search,
            xs,
            &weights,
            &mut big_l[16 * j..16 * j + 16],
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
    let mut b = BlockQ2K {
        scales: [0; 16],
        qs: [0; 64],
        d: f16::ZERO,
        dmin: f16::ZERO,
    };
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            // ggml stores the int into a uint8_t: keep the low byte.
            b.scales[j] = nearest_int(iscale * scales[j]) as u8;
        }
        b.d = f16::from_f32(max_scale / Q4SCALE);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            let l = nearest_int(iscale * mins[j]);
            b.scales[j] |= (l << 4) as u8;
        }
        b.dmin = f16::from_f32(max_min / Q4SCALE);
    }
    // Requantize against the rounded scales actually stored.
    for j in 0..16 {
        let d = b.d.to_f32() * (b.scales[j] & 0x0f) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = b.dmin.to_f32() * (b.scales[j] >> 4) as f32;
        for ii in 0..16 {
            let l = nearest_int((x[16 * j + ii] + dm) / d);
            big_l[16 * j + ii] = l.clamp(0, 3) as u8;
        }
    }
    pack_2bit(&big_l, &mut b.qs);
    b
}
