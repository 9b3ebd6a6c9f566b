//! GGML block quantization formats for kiln.
//!
//! - [`GgmlType`]: the GGUF tensor type table, with block geometry computed from the `#[repr(C)]` block structs
//!   in [`blocks`].
//! - [`dequantize`] / [`quantize`]: whole rows between GGUF bytes and f32, checked against the type's block
//!   geometry ([`Error`] names the type and the sizes). Dequantization covers every [`GgmlType`];
//!   quantization covers the float types, the legacy formats, the K-quants and IQ4_NL (not IQ2_XXS).
//!   Results are bit-identical to ggml's reference C code, checked against fixtures produced by the
//!   `gguf` Python package (tools/gen_quant_fixtures.py).
//! - [`mod@reference`]: the same conversions one block at a time (`dequantize_q4_k(&BlockQ4K, &mut [f32; 256])`,
//!   `quantize_q8_0(&[f32; 32]) -> BlockQ8_0`, …), the scalar reference every faster path is tested against.
//! - [`dot`]: the CPU dot-product kernels of matmul (scalar reference for every type, AVX2 and AVX-512 VNNI
//!   for the common ones, picked at run time) and the activation quantizers they read.
//!
//! The source bytes of [`dequantize`] may start at any address (a sub-slice of a memory map is fine).
//!
//! ```
//! use kiln_quant::{dequantize, quantize, GgmlType};
//! assert_eq!(GgmlType::Q4_K.row_bytes(256), Some(144));
//!
//! let x: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
//! let mut q = vec![0u8; GgmlType::Q8_0.row_bytes(64).unwrap() as usize];
//! quantize(GgmlType::Q8_0, &x, &mut q)?;
//! let mut y = vec![0f32; 64];
//! dequantize(GgmlType::Q8_0, &q, &mut y)?;
//! assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 0.02));
//!
//! // Sizes are checked: 64 elements of Q8_0 are 68 bytes, not 67.
//! assert!(dequantize(GgmlType::Q8_0, &q[..67], &mut y).is_err());
//! # Ok::<(), kiln_quant::Error>(())
//! ```
#![deny(missing_docs)]

pub mod blocks;
mod convert;
pub mod dot;
mod error;
mod float;
pub(crate) mod iquants;
mod kquants;
mod legacy;
pub mod reference;
mod types;

pub use convert::{dequantize, quantize};
pub use error::{Error, Op};
/// IQ2_XXS's codebook, for decoders outside this crate (the CUDA kernels are given it at compile time).
pub use iquants::tables::IQ2XXS_GRID;
pub use types::GgmlType;
