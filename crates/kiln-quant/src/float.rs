//! The plain float types: F32 (little-endian copy), F16 and BF16.
//!
//! BF16 rounding follows ggml's `ggml_compute_fp32_to_bf16`: round to nearest even, NaN forced quiet
//! (`| 0x40`) rather than rounded (rounding a NaN's mantissa could turn it into infinity).

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Little-endian f32 bytes to f32. `src.len() == 4 * dst.len()` (checked by the caller).
pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Little-endian f16 bytes to f32 (exact; a signalling NaN comes back quiet, as from ggml's conversions).
pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    // In place when aligned: `half` converts whole slices with F16C where the CPU has it.
    if let Ok(h) = bytemuck::try_cast_slice::<u8, f16>(src) {
        h.convert_to_f32_slice(dst);
        return;
    }
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// Little-endian bf16 bytes to f32 (exact: bf16 is the top half of an f32).
pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(crate) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}

/// f32 to f16, round to nearest even (as F16C's `vcvtps2ph` with the default rounding and numpy).
pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f16::from_f32(*x).to_bits().to_le_bytes());
    }
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}

/// bf16 bits to f32.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 to bf16 bits, exactly as ggml rounds (nearest even; NaN kept NaN and made quiet).
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly half-way between two bf16 values: ties go to the even one (1.0).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // ... and 0x3f81_8000 rounds up to the even 0x3f82.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        // A signalling NaN whose payload lives only in the low half stays a NaN.
        let h = f32_to_bf16(f32::from_bits(0x7f80_0001));
        assert!(bf16_to_f32(h).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(
            f32_to_bf16(f32::MAX),
            0x7f80,
            "f32::MAX rounds up to infinity"
        );
    }

    #[test]
    fn float_round_trips() {
        let xs = [0.0f32, -0.0, 1.5, -2.25, 65504.0, 1e-7, f32::INFINITY];
        let mut bytes = vec![0u8; xs.len() * 4];
        let mut back = vec![0f32; xs.len()];
        quantize_f32(&xs, &mut bytes);
        dequantize_f32(&bytes, &mut back);
        assert_eq!(
            xs.map(f32::to_bits).to_vec(),
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );

        let mut half_bytes = vec![0u8; xs.len() * 2];
        quantize_f16(&xs, &mut half_bytes);
        dequantize_f16(&half_bytes, &mut back);
        assert_eq!(back[..5], [0.0, -0.0, 1.5, -2.25, 65504.0]);
        assert!(back[1].is_sign_negative());
        // 1e-7 is an f16 subnormal: the nearest one is 2 * 2^-24.
        assert_eq!(back[5], 2.0 * 2f32.powi(-24));

        quantize_bf16(&xs, &mut half_bytes);
        dequantize_bf16(&half_bytes, &mut back);
        assert_eq!(back[..4], [0.0, -0.0, 1.5, -2.25]);
        assert_eq!(back[6], f32::INFINITY);
    }
}
