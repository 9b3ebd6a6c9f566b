//! The i-quants kiln reads: IQ2_XXS (2.06 bits: an 8-element grid codebook with sign bits) and IQ4_NL
//! (4-bit indices into a fixed non-linear codebook). IQ2_XXS is dequantize-only (ggml quantizes it only
//! with an importance matrix and a grid search kiln does not carry); IQ4_NL also has ggml's
//! importance-free reference quantizer.

pub mod tables;

use crate::blocks::{BlockIq2Xxs, BlockIq4Nl, QK, QK_K};
use crate::kquants::GROUP_MAX_EPS;
use half::f16;
use tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};

/// IQ4_NL's codebook (ggml's `kvalues_iq4nl`): denser near zero, like the weights it encodes.
pub const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ2_XXS super-block to 256 floats.
///
/// Each 32 elements own two u32 (`aux0`, `aux1`): the 4 bytes of `aux0` pick 4 grid rows of 8 magnitudes;
/// `aux1` holds four 7-bit sign indices (expanded to 8 signs through `KSIGNS_IQ2XS`) and, in its top 4 bits,
/// the sub-block scale: `db = d * (0.5 + s) * 0.25`, `y = db * grid * sign`.
pub fn dequantize_iq2_xxs(b: &BlockIq2Xxs, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    for ib in 0..QK_K / 32 {
        let q = &b.qs[4 * ib..4 * ib + 4];
        let aux0 = q[0] as u32 | (q[1] as u32) << 16;
        let aux1 = q[2] as u32 | (q[3] as u32) << 16;
        let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
        for l in 0..4 {
            let grid = IQ2XXS_GRID[((aux0 >> (8 * l)) & 0xff) as usize].to_le_bytes();
            let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
            let out = &mut y[32 * ib + 8 * l..32 * ib + 8 * l + 8];
            for j in 0..8 {
                let s = if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
                out[j] = db * grid[j] as f32 * s;
            }
        }
    }
}

/// IQ4_NL block to 32 floats: `y = d * codebook[q]`, nibbles laid out as in Q4_0.
pub fn dequantize_iq4_nl(b: &BlockIq4Nl, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for j in 0..QK / 2 {
        y[j] = d * IQ4_NL_VALUES[(b.qs[j] & 0x0f) as usize] as f32;
        y[j + QK / 2] = d * IQ4_NL_VALUES[(b.qs[j] >> 4) as usize] as f32;
    }
}

/// Index of the codebook entry nearest to `x` (`best_index_int8`): `x` picks entry `i` once it reaches the
/// midpoint of entries `i - 1` and `i`. Comparing `2x` against the integer sum keeps the midpoint exact, as
/// current ggml does (older ggml compared `x - a < b - x`, which can round differently next to a midpoint).
fn best_index_iq4_nl(x: f32) -> u8 {
    let x2 = x + x;
    let mut idx = 0usize;
    let mut step = IQ4_NL_VALUES.len() >> 1;
    while step > 0 {
        let j = idx + step;
        let mid2 = IQ4_NL_VALUES[j - 1] as i32 + IQ4_NL_VALUES[j] as i32;
        if x2 >= mid2 as f32 {
            idx = j;
        }
        step >>= 1;
    }
    idx as u8
}

/// 32 floats to an IQ4_NL block (`quantize_row_iq4_nl_ref`, i.e. ggml's `quantize_row_iq4_nl_impl` with no
/// importance weights and no scale search): indices for `d = max / -127`, then the weighted (x²)
/// least-squares scale for those indices.
pub fn quantize_iq4_nl(x: &[f32; QK]) -> BlockIq4Nl {
    let mut b = BlockIq4Nl {
        d: f16::ZERO,
        qs: [0; QK / 2],
    };
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return b;
    }
    let id = 1.0 / (max / IQ4_NL_VALUES[0] as f32);
    let mut big_l = [0u8; QK];
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (l, &v) in big_l.iter_mut().zip(x) {
        *l = best_index_iq4_nl(id * v);
        let q = IQ4_NL_VALUES[*l as usize] as f32;
        let w = v * v;
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    let d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    b.d = f16::from_f32(d);
    for j in 0..QK / 2 {
        b.qs[j] = big_l[j] | (big_l[j + QK / 2] << 4);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksigns_make_an_even_number_of_minus_signs() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(s & 0x7f, i as u8);
            assert_eq!(s.count_ones() % 2, 0, "entry {i}");
        }
    }

    #[test]
    fn grid_entries_hold_only_the_three_magnitudes() {
        for g in IQ2XXS_GRID {
            assert!(
                g.to_le_bytes().iter().all(|b| [8, 25, 43].contains(b)),
                "{g:#x}"
            );
        }
        assert_eq!(IQ2XXS_GRID[0], 0x0808080808080808);
    }

    #[test]
    fn iq2_xxs_decodes_grid_signs_and_scale() {
        let mut b = BlockIq2Xxs {
            d: f16::from_f32(1.0),
            qs: [0; QK_K / 8],
        };
        // Sub-block 0: grid rows 1, 0, 0, 0; signs index 1 for the first row (elements 0 and 7 negative);
        // scale nibble 3: db = (0.5 + 3) * 0.25 = 0.875.
        b.qs[0] = 1;
        b.qs[2] = 1;
        b.qs[3] = 3 << 12;
        let mut y = [0f32; QK_K];
        dequantize_iq2_xxs(&b, &mut y);
        let row1 = IQ2XXS_GRID[1].to_le_bytes();
        assert_eq!(y[0], -0.875 * row1[0] as f32);
        assert_eq!(y[7], -0.875 * row1[7] as f32);
        assert_eq!(y[1], 0.875 * row1[1] as f32);
        assert_eq!(y[8], 0.875 * 8.0);
        // Sub-block 1 has scale nibble 0: db = 0.125.
        assert_eq!(y[32], 0.125 * 8.0);
    }

    #[test]
    fn iq4_nl_best_index_picks_the_nearest_entry() {
        for (i, &v) in IQ4_NL_VALUES.iter().enumerate() {
            assert_eq!(best_index_iq4_nl(v as f32) as usize, i);
            assert_eq!(
                best_index_iq4_nl(v as f32 + 0.4) as usize,
                i,
                "just above {v}"
            );
        }
        // Exactly between -127 and -104 goes up, as in ggml.
        assert_eq!(best_index_iq4_nl(-115.5), 1);
        assert_eq!(best_index_iq4_nl(-1000.0), 0);
        assert_eq!(best_index_iq4_nl(1000.0), 15);
    }

    #[test]
    fn iq4_nl_quantizes_codebook_multiples_exactly() {
        // x = 0.5 * codebook[i % 16]: max = -63.5, so d = max / -127 = 0.5 picks the exact indices, and
        // the least-squares scale for them is exactly 0.5 (every term scales by a power of two).
        let x: [f32; QK] = std::array::from_fn(|i| 0.5 * IQ4_NL_VALUES[i % 16] as f32);
        let b = quantize_iq4_nl(&x);
        let mut y = [0f32; QK];
        dequantize_iq4_nl(&b, &mut y);
        assert_eq!(y, x);
        let z = quantize_iq4_nl(&[0.0; QK]);
        assert_eq!(z.d.to_f32(), 0.0);
    }

    #[test]
    fn iq4_nl_uses_the_codebook() {
        let mut b = BlockIq4Nl {
            d: f16::from_f32(0.5),
            qs: [0; QK / 2],
        };
        b.qs[3] = 0xf8;
        let mut y = [0f32; QK];
        dequantize_iq4_nl(&b, &mut y);
        assert_eq!(y[3], 0.5);
        assert_eq!(y[19], 56.5);
        assert_eq!(y[0], -63.5);
    }
}
