//! GGML block quantization formats for kiln.
//!
//! - [`GgmlType`]: the GGUF tensor type table, with block geometry computed from the `#[repr(C)]` block structs
//!   in [`blocks`].
//!
//! ```
//! use kiln_quant::GgmlType;
//! assert_eq!(GgmlType::Q4_K.row_bytes(256), Some(144));
//! ```
#![deny(missing_docs)]

pub mod blocks;
mod types;

pub use types::GgmlType;
