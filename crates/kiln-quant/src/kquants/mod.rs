//! The K-quants (256-element super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and the Q8_K activation format.
//!
//! One file per type, each with its block's scalar `dequantize_*` / `quantize_*` reference. This file
//! holds the search helpers they share, written after ggml's `ggml-quants.c` (the importance-matrix-free
//! `_ref` paths): the same loops, the same float expression order, so a model quantized here gets the
//! same bytes as with ggml's reference quantizer on the same machine.

// Index loops are kept where they mirror ggml's index arithmetic line for line: that correspondence is
// what a reviewer checks, and it matters more here than iterator style.
#![allow(clippy::needless_range_loop)]

mod q2_k;
mod q3_k;
mod q4_k;
mod q5_k;
mod q6_k;
mod q8_k;

pub use q2_k::{dequantize_q2_k, quantize_q2_k};
pub use q3_k::{dequantize_q3_k, quantize_q3_k};
pub use q4_k::{dequantize_q4_k, quantize_q4_k};
pub use q5_k::{dequantize_q5_k, quantize_q5_k};
pub use q6_k::{dequantize_q6_k, quantize_q6_k};
pub use q8_k::{dequantize_q8_k, quantize_q8_k};

/// Below this magnitude a group counts as all zeros (ggml's `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, through the float-add trick ggml uses (`nearest_int`): adding 1.5 * 2^23
/// leaves the integer in the low mantissa bits. Exact for |x| < 2^22; larger inputs give a wrong but
/// deterministic value, as in ggml (only reachable with non-finite or absurd inputs).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Scale `d` and min `m` of sub-block `j` (0..8) from the 12-byte packed 6-bit scales of Q4_K/Q5_K.
#[inline]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Inverse of [`get_scale_min_k4`] for sub-block `j`, given `q` zeroed before sub-block 0 is stored.
#[inline]
pub(crate) fn set_scale_min_k4(j: usize, q: &mut [u8; 12], ls: u8, lm: u8) {
    if j < 4 {
        q[j] = ls;
        q[j + 4] = lm;
    } else {
        q[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
        q[j - 4] |= (ls >> 4) << 6;
        q[j] |= (lm >> 4) << 6;
    }
}

/// Symmetric quantization of `x` to `l` in [-nmax, nmax-1], stored as `l + nmax` in `big_l`, with a
/// weighted least-squares scale search over 19 candidate scales (`make_qx_quants`, weights x² when
/// `rmse_type` is 1). Returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], big_l: &mut [i8], rmse_type: i32) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        big_l[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    if rmse_type == 0 {
        for (q, &v) in big_l.iter_mut().zip(x) {
            let l = nearest_int(iscale * v);
            *q = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let weight = |v: f32| -> f32 {
        match rmse_type {
            1 => v * v,
            2 => 1.0,
            3 => v.abs(),
            _ => v.abs().sqrt(),
        }
    };
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (q, &v) in big_l.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *q = (l + nmax) as i8;
        let w = weight(v);
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = weight(v);
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (q, &v) in big_l.iter_mut().zip(x) {
                let l = nearest_int(iscale * v);
                *q = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric 3-bit quantization with iterative per-element refinement (`make_q3_quants`, `do_rmse`
/// true): `l` in [-nmax, nmax-1] stored as `l + nmax`. Returns the scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], big_l: &mut [i8]) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        big_l[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (q, &v) in big_l.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *q = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (q, &v) in big_l.iter_mut().zip(x) {
            let w = v * v;
            let lq = *q as f32;
            let mut slx = sumlx - w * v * lq;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * lq * lq;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *q as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *q = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for q in big_l[..n].iter_mut() {
        *q += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of the scale search in [`make_qkx2_quants`].
pub(crate) struct Qkx2Search {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

/// Asymmetric quantization `x ≈ scale * l - the_min` with `l` in [0, nmax], searching `nstep + 1`
/// candidate scales and solving the weighted least-squares scale/min for each (`make_qkx2_quants`).
/// Returns `(scale, the_min)`; `the_min` is ≥ 0 (a positive minimum is clamped to 0).
pub(crate) fn make_qkx2_quants(
    p: &Qkx2Search,
    x: &[f32],
    weights: &[f32],
    big_l: &mut [u8],
    laux: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        big_l[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = p.nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
        big_l[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
            laux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                big_l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 2-bit quants (values 0..=3) the way Q2_K and Q3_K store them: per 128 elements, 32 bytes, with
/// element `l + 32 * k` in bits `2k..2k+2` of byte `l`.
pub(crate) fn pack_2bit(big_l: &[u8; 256], qs: &mut [u8; 64]) {
    for j in (0..256).step_by(128) {
        for l in 0..32 {
            qs[j / 4 + l] = big_l[j + l]
                | (big_l[j + l + 32] << 2)
                | (big_l[j + l + 64] << 4)
                | (big_l[j + l + 96] << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
    }

    #[test]
    fn k4_scale_packing_round_trips() {
        let mut q = [0u8; 12];
        let vals: [(u8, u8); 8] =
            std::array::from_fn(|j| ((j as u8 * 9 + 5) & 63, (j as u8 * 23 + 1) & 63));
        for (j, &(s, m)) in vals.iter().enumerate() {
            set_scale_min_k4(j, &mut q, s, m);
        }
        for (j, &v) in vals.iter().enumerate() {
            assert_eq!(get_scale_min_k4(j, &q), v, "sub-block {j}");
        }
    }

    #[test]
    fn qkx2_fits_an_exact_grid() {
        // x = 0.5 * l - 1 for l in 0..16 repeated: representable exactly with scale 0.5, min 1.
        let x: Vec<f32> = (0..32).map(|i| 0.5 * (i % 16) as f32 - 1.0).collect();
        let w = vec![1f32; 32];
        let (mut l, mut aux) = ([0u8; 32], [0u8; 32]);
        let p = Qkx2Search {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (scale, min) = make_qkx2_quants(&p, &x, &w, &mut l, &mut aux);
        assert!((scale - 0.5).abs() < 1e-6, "{scale}");
        assert!((min - 1.0).abs() < 1e-6, "{min}");
        for i in 0..32 {
            assert_eq!(l[i] as usize, i % 16);
        }
    }
}
