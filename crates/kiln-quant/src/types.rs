//! The GGML tensor type table: ids as stored in GGUF, names, and block geometry computed from the block structs.

use crate::blocks::*;
use std::mem::size_of;

/// A tensor element type as stored in GGUF (`ggml_type`). Only the types kiln reads are listed; any other id
/// is rejected by [`GgmlType::from_id`] with the id in the error.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// See [`BlockQ4_0`].
    Q4_0,
    /// See [`BlockQ4_1`].
    Q4_1,
    /// See [`BlockQ5_0`].
    Q5_0,
    /// See [`BlockQ5_1`].
    Q5_1,
    /// See [`BlockQ8_0`].
    Q8_0,
    /// See [`BlockQ8_1`].
    Q8_1,
    /// See [`BlockQ2K`].
    Q2_K,
    /// See [`BlockQ3K`].
    Q3_K,
    /// See [`BlockQ4K`].
    Q4_K,
    /// See [`BlockQ5K`].
    Q5_K,
    /// See [`BlockQ6K`].
    Q6_K,
    /// See [`BlockQ8K`].
    Q8_K,
    /// See [`BlockIq2Xxs`].
    IQ2_XXS,
    /// See [`BlockIq4Nl`].
    IQ4_NL,
}

impl GgmlType {
    /// Every type kiln knows, in id order.
    pub const ALL: [GgmlType; 17] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ4_NL,
        GgmlType::BF16,
    ];

    /// The id stored in GGUF tensor infos.
    pub const fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ4_NL => 20,
            GgmlType::BF16 => 30,
        }
    }

    /// The type with GGUF id `id`, if kiln supports it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The type named `name` (case-insensitive, as printed by [`GgmlType::name`]).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// ggml's name for the type ("q4_K", "f16", …).
    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::BF16 => "bf16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::Q2_K => "q2_K",
            GgmlType::Q3_K => "q3_K",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::Q8_K => "q8_K",
            GgmlType::IQ2_XXS => "iq2_xxs",
            GgmlType::IQ4_NL => "iq4_nl",
        }
    }

    /// Elements per block (1 for the float types).
    pub const fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::IQ4_NL => QK,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K
            | GgmlType::IQ2_XXS => QK_K,
        }
    }

    /// Bytes per block, from the block struct.
    pub const fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<BlockQ5_0>(),
            GgmlType::Q5_1 => size_of::<BlockQ5_1>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
            GgmlType::Q8_1 => size_of::<BlockQ8_1>(),
            GgmlType::Q2_K => size_of::<BlockQ2K>(),
            GgmlType::Q3_K => size_of::<BlockQ3K>(),
            GgmlType::Q4_K => size_of::<BlockQ4K>(),
            GgmlType::Q5_K => size_of::<BlockQ5K>(),
            GgmlType::Q6_K => size_of::<BlockQ6K>(),
            GgmlType::Q8_K => size_of::<BlockQ8K>(),
            GgmlType::IQ2_XXS => size_of::<BlockIq2Xxs>(),
            GgmlType::IQ4_NL => size_of::<BlockIq4Nl>(),
        }
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !n.is_multiple_of(be) {
            return None;
        }
        (n / be).checked_mul(self.block_bytes() as u64)
    }

    /// True for the plain float types (no blocks).
    pub const fn is_float(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None, "4 was Q4_2, removed from ggml");
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn row_bytes_checks_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_K.row_bytes(4096), Some(16 * 144));
        assert_eq!(GgmlType::Q4_0.row_bytes(33), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
