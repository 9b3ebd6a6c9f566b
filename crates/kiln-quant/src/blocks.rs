//! Block layouts of the GGML quantization formats, byte-for-byte as they sit in a GGUF file.
//!
//! Every struct is `#[repr(C)]`, `Pod`, and followed by a compile-time size check: the type table in
//! [`crate::GgmlType`] is computed from these structs, so a size can never drift from its layout.
//! Field order and meaning follow ggml's `ggml-common.h` (the on-disk format is the contract).

use bytemuck::{Pod, Zeroable};
use half::f16;

/// Elements per block of the "legacy" formats (Q4_0 … Q8_1, IQ4_NL).
pub const QK: usize = 32;
/// Elements per super-block of the K-quants and i-quants.
pub const QK_K: usize = 256;

// GGUF is little-endian and these structs are read in place, so a big-endian host would misread every
// multi-byte field.
#[cfg(target_endian = "big")]
compile_error!(
    "kiln-quant reads little-endian GGUF blocks in place: big-endian targets are not supported"
);

macro_rules! assert_size {
    ($t:ty, $n:expr) => {
        const _: () = assert!(std::mem::size_of::<$t>() == $n);
    };
}

/// 4-bit, one scale per 32: `x = d * (q - 8)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: element j in the low nibble of byte j, element j+16 in the high nibble.
    pub qs: [u8; QK / 2],
}
assert_size!(BlockQ4_0, 18);

/// 4-bit with scale and minimum: `x = d * q + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Nibbles, laid out as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
assert_size!(BlockQ4_1, 20);

/// 5-bit, one scale per 32: `x = d * (q - 16)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits, little-endian u32: bit j belongs to element j.
    pub qh: [u8; 4],
    /// Low nibbles, laid out as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
assert_size!(BlockQ5_0, 22);

/// 5-bit with scale and minimum: `x = d * q + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Fifth bits, as in [`BlockQ5_0`].
    pub qh: [u8; 4],
    /// Low nibbles, as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
assert_size!(BlockQ5_1, 24);

/// 8-bit, one scale per 32: `x = d * q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; QK],
}
assert_size!(BlockQ8_0, 34);

/// 8-bit with the block sum precomputed (an activation format): `x = d * q`, `s = d * sum(q)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`.
    pub s: f16,
    /// Quants.
    pub qs: [i8; QK],
}
assert_size!(BlockQ8_1, 36);

/// 2-bit K-quant: 16 sub-blocks of 16 with 4-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Low nibble: scale, high nibble: min, per sub-block of 16.
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
}
assert_size!(BlockQ2K, 84);

/// 3-bit K-quant: 16 sub-blocks of 16 with 6-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bit of each quant (set means +0, clear means -4).
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of each quant.
    pub qs: [u8; QK_K / 4],
    /// 16 packed 6-bit scales.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}
assert_size!(BlockQ3K, 110);

/// 4-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins, 6 bits each, packed.
    pub scales: [u8; 12],
    /// Nibbles.
    pub qs: [u8; QK_K / 2],
}
assert_size!(BlockQ4K, 144);

/// 5-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins, 6 bits each, packed as in [`BlockQ4K`].
    pub scales: [u8; 12],
    /// Fifth bits.
    pub qh: [u8; QK_K / 8],
    /// Low nibbles.
    pub qs: [u8; QK_K / 2],
}
assert_size!(BlockQ5K, 176);

/// 6-bit K-quant: 16 sub-blocks of 16 with 8-bit signed scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Signed 8-bit scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}
assert_size!(BlockQ6K, 210);

/// 8-bit activation super-block for the K-quant dot products: `x = d * q`, with sums per 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale (f32: activations need the range).
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 quants.
    pub bsums: [i16; QK_K / 16],
}
assert_size!(BlockQ8K, 292);

/// 2.06-bit i-quant (ds4's expert format): grid indices, signs and scales packed in u16 pairs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIq2Xxs {
    /// Super-block scale.
    pub d: f16,
    /// Per 32 elements, two u32 (as four u16): 4 grid indices (8 bits each), then 4×7 sign bits and a 4-bit scale.
    pub qs: [u16; QK_K / 8],
}
assert_size!(BlockIq2Xxs, 66);

/// 4-bit non-linear: nibbles index a fixed 16-entry codebook, one scale per 32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIq4Nl {
    /// Scale.
    pub d: f16,
    /// Nibbles, laid out as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
assert_size!(BlockIq4Nl, 18);
