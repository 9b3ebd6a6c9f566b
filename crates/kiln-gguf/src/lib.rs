//! The GGUF container for kiln: a validating reader over a memory map, typed metadata, zero-copy tensor views,
//! and a streaming writer.
//!
//! - [`GgufFile`] opens GGUF v2 and v3 ([`GgufFile::open`] maps the file; [`GgufFile::from_bytes`] parses a
//!   buffer through the same code). Everything is validated on open: magic, version, every count against the
//!   bytes left (so a hostile count never allocates), string lengths and UTF-8, array nesting
//!   ([`MAX_NESTING`]), dims (at most [`MAX_DIMS`], each ≥ 1: zero-sized tensors are rejected), element-count and
//!   size overflow, known tensor types, whole blocks per row, alignment (`general.alignment`, default 32, a
//!   power of two), data ranges inside the file and not overlapping, unique keys and names. A bad file is an
//!   [`Error`] naming the key or tensor and the offset, never a panic. Memory for parsed metadata is bounded by a
//!   small multiple of the metadata's bytes in the file (at most ~3× for arrays of empty strings), whatever the
//!   counts claim.
//! - [`Metadata`] holds the key/value table in file order with typed accessors (`get_u32`, `opt_str`,
//!   `get_arr_str`, …); integer accessors accept any integer type whose value fits.
//! - [`GgufWriter`] writes v3 files in one forward pass: declare metadata and tensors, then stream each
//!   tensor's bytes through a [`TensorDataWriter`].
//! - [`Summary`] is the overview `kiln info` prints.
//!
//! ```
//! use kiln_gguf::{GgufFile, GgufWriter, Value};
//! use kiln_quant::GgmlType;
//!
//! let mut w = GgufWriter::new();
//! w.add("general.architecture", "llama")?;
//! w.add("llama.block_count", 2u32)?;
//! w.add("tokenizer.ggml.scores", vec![0.0f32, -1.5])?;
//! w.add_tensor("token_embd.weight", GgmlType::F32, &[4, 2])?;
//! let mut data = w.begin(Vec::new())?;
//! let weights: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
//! data.write_tensor_data("token_embd.weight", &weights)?;
//! let bytes = data.finish()?;
//!
//! let file = GgufFile::from_bytes(bytes)?;
//! assert_eq!(file.version(), 3);
//! assert_eq!(file.metadata().get_str("general.architecture")?, "llama");
//! assert_eq!(file.metadata().get_u64("llama.block_count")?, 2); // stored as u32, read as u64
//! assert_eq!(file.metadata().get_arr_f32("tokenizer.ggml.scores")?, &[0.0, -1.5]);
//! assert_eq!(file.metadata().get("llama.block_count"), Some(&Value::U32(2)));
//! let t = file.tensor("token_embd.weight").unwrap();
//! assert_eq!((t.shape.as_slice(), t.n_elements(), t.size), (&[4, 2][..], 8, 32));
//! assert_eq!(file.tensor_data(t), &weights[..]);
//! # Ok::<(), kiln_gguf::Error>(())
//! ```
#![deny(missing_docs)]

mod error;
mod file;
mod reader;
mod summary;
mod value;
mod writer;

pub use error::{Error, ErrorKind, Result};
pub use file::{GgufFile, TensorInfo};
pub use reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, MAX_NESTING};
pub use summary::{Summary, TypeShare, HPARAM_KEYS};
pub use value::{Array, Metadata, Value, ValueType};
pub use writer::{GgufWriter, TensorDataWriter};
