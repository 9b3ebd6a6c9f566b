//! The crate's error type: every failure names the GGML type and the sizes involved.

use crate::GgmlType;

/// Which conversion an [`Error::Unsupported`] refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Blocks to f32 ([`crate::dequantize`]).
    Dequantize,
    /// f32 to blocks ([`crate::quantize`]).
    Quantize,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Dequantize => "dequantization",
            Op::Quantize => "quantization",
        })
    }
}

/// A (de)quantization request that cannot be carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The element count is not a whole number of blocks of the type.
    #[error("{ty}: {elems} elements is not a multiple of the block size {block_elems}")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// Elements requested.
        elems: usize,
        /// Elements per block of `ty`.
        block_elems: usize,
    },
    /// The byte buffer does not hold exactly the blocks of the element buffer.
    #[error("{ty}: {elems} elements take {expected} bytes, but the byte buffer has {got}")]
    ByteLength {
        /// The type.
        ty: GgmlType,
        /// Elements in the f32 buffer.
        elems: usize,
        /// Bytes `elems` elements of `ty` take.
        expected: u64,
        /// Bytes given.
        got: usize,
    },
    /// kiln has no implementation of this conversion for the type.
    #[error("{ty}: {op} is not supported")]
    Unsupported {
        /// The type.
        ty: GgmlType,
        /// The conversion asked for.
        op: Op,
    },
}
