//! The public entry points [`dequantize`] and [`quantize`]: size checks, then a per-type dispatch onto the
//! per-block reference functions of each family.
//!
//! Source bytes may sit at any address (callers pass sub-slices of a memory map): when `src` happens to be
//! aligned for the block struct the blocks are read in place, otherwise each block is copied out first
//! (at most 292 bytes, negligible next to the arithmetic).

use crate::error::{Error, Op};
use crate::{float, iquants, kquants, legacy, GgmlType};
use bytemuck::Pod;
use std::mem::size_of;

/// Checks that `elems` is whole blocks of `ty` and that `bytes` is exactly their size.
fn check_sizes(ty: GgmlType, elems: usize, bytes: usize) -> Result<(), Error> {
    let block_elems = ty.block_elems();
    if !elems.is_multiple_of(block_elems) {
        return Err(Error::PartialBlock {
            ty,
            elems,
            block_elems,
        });
    }
    // `elems` fits in u64 on every supported target; the multiplication cannot overflow because a block
    // of any type is at most 292 bytes for 256 elements (and 4 bytes for 1).
    let expected = (elems / block_elems) as u64 * ty.block_bytes() as u64;
    if expected != bytes as u64 {
        return Err(Error::ByteLength {
            ty,
            elems,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Dequantizes `src` (whole blocks of `ty`, as stored in GGUF) into `dst`.
///
/// `src.len()` must equal `ty.row_bytes(dst.len())`. Every type in [`GgmlType::ALL`] is supported. The
/// result is bit-identical to ggml's reference C code (`dequantize_row_*`).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), Error> {
    check_sizes(ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => float::dequantize_f32(src, dst),
        GgmlType::F16 => float::dequantize_f16(src, dst),
        GgmlType::BF16 => float::dequantize_bf16(src, dst),
        GgmlType::Q4_0 => each_block(src, dst, legacy::dequantize_q4_0),
        GgmlType::Q4_1 => each_block(src, dst, legacy::dequantize_q4_1),
        GgmlType::Q5_0 => each_block(src, dst, legacy::dequantize_q5_0),
        GgmlType::Q5_1 => each_block(src, dst, legacy::dequantize_q5_1),
        GgmlType::Q8_0 => each_block(src, dst, legacy::dequantize_q8_0),
        GgmlType::Q8_1 => each_block(src, dst, legacy::dequantize_q8_1),
        GgmlType::Q2_K => each_block(src, dst, kquants::dequantize_q2_k),
        GgmlType::Q3_K => each_block(src, dst, kquants::dequantize_q3_k),
        GgmlType::Q4_K => each_block(src, dst, kquants::dequantize_q4_k),
        GgmlType::Q5_K => each_block(src, dst, kquants::dequantize_q5_k),
        GgmlType::Q6_K => each_block(src, dst, kquants::dequantize_q6_k),
        GgmlType::Q8_K => each_block(src, dst, kquants::dequantize_q8_k),
        GgmlType::IQ2_XXS => each_block(src, dst, iquants::dequantize_iq2_xxs),
        GgmlType::IQ4_NL => each_block(src, dst, iquants::dequantize_iq4_nl),
    }
    Ok(())
}

/// Quantizes `src` into `dst` (whole blocks of `ty`, as stored in GGUF).
///
/// `dst.len()` must equal `ty.row_bytes(src.len())`. Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
/// Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K and IQ4_NL, each following ggml's `quantize_row_*_ref`
/// (the importance-matrix-free path) operation for operation. IQ2_XXS returns [`Error::Unsupported`].
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), Error> {
    check_sizes(ty, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => float::quantize_f32(src, dst),
        GgmlType::F16 => float::quantize_f16(src, dst),
        GgmlType::BF16 => float::quantize_bf16(src, dst),
        GgmlType::Q4_0 => each_input(src, dst, legacy::quantize_q4_0),
        GgmlType::Q4_1 => each_input(src, dst, legacy::quantize_q4_1),
        GgmlType::Q5_0 => each_input(src, dst, legacy::quantize_q5_0),
        GgmlType::Q5_1 => each_input(src, dst, legacy::quantize_q5_1),
        GgmlType::Q8_0 => each_input(src, dst, legacy::quantize_q8_0),
        GgmlType::Q8_1 => each_input(src, dst, legacy::quantize_q8_1),
        GgmlType::Q2_K => each_input(src, dst, kquants::quantize_q2_k),
        GgmlType::Q3_K => each_input(src, dst, kquants::quantize_q3_k),
        GgmlType::Q4_K => each_input(src, dst, kquants::quantize_q4_k),
        GgmlType::Q5_K => each_input(src, dst, kquants::quantize_q5_k),
        GgmlType::Q6_K => each_input(src, dst, kquants::quantize_q6_k),
        GgmlType::Q8_K => each_input(src, dst, kquants::quantize_q8_k),
        GgmlType::IQ4_NL => each_input(src, dst, iquants::quantize_iq4_nl),
        GgmlType::IQ2_XXS => {
            return Err(Error::Unsupported {
                ty,
                op: Op::Quantize,
            })
        }
    }
    Ok(())
}

/// Calls `f` on every block of `src` with its `N` outputs. Sizes were checked by the caller.
fn each_block<B: Pod, const N: usize>(src: &[u8], dst: &mut [f32], f: fn(&B, &mut [f32; N])) {
    let out = dst.chunks_exact_mut(N).map(array_mut::<N>);
    match bytemuck::try_cast_slice::<u8, B>(src) {
        Ok(blocks) => blocks.iter().zip(out).for_each(|(b, y)| f(b, y)),
        Err(_) => src
            .chunks_exact(size_of::<B>())
            .zip(out)
            .for_each(|(raw, y)| f(&bytemuck::pod_read_unaligned::<B>(raw), y)),
    }
}

/// Calls `f` on every `N` inputs of `src` and stores the block it returns. Sizes were checked by the caller.
fn each_input<B: Pod, const N: usize>(src: &[f32], dst: &mut [u8], f: fn(&[f32; N]) -> B) {
    for (x, out) in src
        .chunks_exact(N)
        .zip(dst.chunks_exact_mut(size_of::<B>()))
    {
        let x: &[f32; N] = x.try_into().expect("chunks_exact yields N elements");
        out.copy_from_slice(bytemuck::bytes_of(&f(x)));
    }
}

fn array_mut<const N: usize>(s: &mut [f32]) -> &mut [f32; N] {
    s.try_into().expect("chunks_exact_mut yields N elements")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_errors_name_type_and_sizes() {
        let mut out = [0f32; 32];
        let e = dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
        assert_eq!(
            e,
            Error::ByteLength {
                ty: GgmlType::Q4_0,
                elems: 32,
                expected: 18,
                got: 17
            }
        );
        assert_eq!(
            e.to_string(),
            "q4_0: 32 elements take 18 bytes, but the byte buffer has 17"
        );
        let e = dequantize(GgmlType::Q4_K, &[0u8; 144], &mut out).unwrap_err();
        assert!(
            matches!(
                e,
                Error::PartialBlock {
                    block_elems: 256,
                    ..
                }
            ),
            "{e}"
        );
        let e = quantize(GgmlType::Q8_0, &[0f32; 33], &mut [0u8; 34]).unwrap_err();
        assert!(matches!(e, Error::PartialBlock { elems: 33, .. }), "{e}");
        let e = quantize(GgmlType::F16, &[0f32; 4], &mut [0u8; 9]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::ByteLength {
                    expected: 8,
                    got: 9,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn unsupported_quantization_is_an_error() {
        let ty = GgmlType::IQ2_XXS;
        let mut dst = vec![0u8; ty.block_bytes()];
        let e = quantize(ty, &[0.5; 256], &mut dst).unwrap_err();
        assert_eq!(
            e,
            Error::Unsupported {
                ty,
                op: Op::Quantize
            }
        );
        assert_eq!(e.to_string(), "iq2_xxs: quantization is not supported");
        // The output is left untouched.
        assert!(dst.iter().all(|&b| b == 0));
    }

    #[test]
    fn every_type_dequantizes_empty_and_zero_blocks() {
        for ty in GgmlType::ALL {
            dequantize(ty, &[], &mut []).unwrap();
            let n = ty.block_elems() * 3;
            let src = vec![0u8; ty.block_bytes() * 3];
            let mut dst = vec![f32::NAN; n];
            dequantize(ty, &src, &mut dst).unwrap();
            // Zero bytes mean a zero scale in every format, so every element is (±)0.
            assert!(dst.iter().all(|v| *v == 0.0), "{ty}: {dst:?}");
        }
    }

    #[test]
    fn unaligned_source_gives_the_same_result() {
        for ty in GgmlType::ALL {
            let n = ty.block_elems() * 4;
            let bytes = ty.block_bytes() * 4;
            // Bytes with small f16/f32 scales everywhere: 0x11 repeated is a finite value in each format.
            let mut buf = vec![0x11u8; bytes + 1];
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(37) & 0x3b;
            }
            let mut a = vec![0f32; n];
            let mut b = vec![0f32; n];
            // A u32 buffer is 4-aligned, so offset 0 is the in-place path and offset 1 the copying one.
            let mut words = vec![0u32; bytes.div_ceil(4) + 1];
            let base: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
            base[..bytes].copy_from_slice(&buf[..bytes]);
            dequantize(ty, &base[..bytes], &mut a).unwrap();
            base[1..=bytes].copy_from_slice(&buf[..bytes]);
            dequantize(ty, &base[1..=bytes], &mut b).unwrap();
            let ab: Vec<u32> = a.iter().map(|v| v.to_bits()).collect();
            let bb: Vec<u32> = b.iter().map(|v| v.to_bits()).collect();
            assert_eq!(ab, bb, "{ty}");
        }
    }
}
