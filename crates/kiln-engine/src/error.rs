//! The engine's error type: what went wrong, with the tensor, metadata key or option it concerns.

use kiln_quant::GgmlType;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A model load, validation or inference error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The GGUF container could not be read.
    #[error("{0}")]
    Gguf(#[from] kiln_gguf::Error),
    /// `general.architecture` names an architecture kiln has no model definition for.
    #[error("unknown architecture '{0}' (kiln runs: llama, qwen3, qwen3moe)")]
    UnknownArch(String),
    /// A required metadata key is absent.
    #[error("metadata key '{key}' is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value is present but unusable.
    #[error("metadata key '{key}': {reason}")]
    BadMetadata {
        /// The key.
        key: String,
        /// Why the value cannot be used.
        reason: String,
    },
    /// A feature of the model that kiln does not implement (and refuses rather than ignores).
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    /// A required tensor is absent from the file.
    #[error("tensor '{name}' is missing (expected shape {expected:?})")]
    MissingTensor {
        /// The tensor name.
        name: String,
        /// The shape the model definition expects (ggml order).
        expected: Vec<u64>,
    },
    /// A tensor has a shape other than the model definition's.
    #[error("tensor '{name}' has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor name.
        name: String,
        /// The shape in the file (ggml order).
        actual: Vec<u64>,
        /// The shape the model definition expects (ggml order).
        expected: Vec<u64>,
    },
    /// A tensor's element type cannot be used where the model needs it.
    #[error("tensor '{name}' has type {ty}, which kiln cannot use for {usage}")]
    TensorType {
        /// The tensor name.
        name: String,
        /// Its type.
        ty: GgmlType,
        /// What the tensor is used for.
        usage: &'static str,
    },
    /// A kernel from the quantization layer is unavailable or failed.
    #[error("tensor '{name}': {error}")]
    Quant {
        /// The tensor being multiplied or read.
        name: String,
        /// The quantization layer's error, as text (its type belongs to that crate).
        error: String,
    },
    /// A batch or session argument is invalid (slot out of range, position beyond the context, …).
    #[error("invalid batch: {0}")]
    Batch(String),
    /// A sequence slot ran out of context positions.
    #[error("slot {slot}: position {pos} is beyond its context of {n_ctx} tokens")]
    ContextFull {
        /// The slot.
        slot: usize,
        /// The position asked for.
        pos: usize,
        /// The slot's context length.
        n_ctx: usize,
    },
    /// The GPU backend failed (no driver or device, a kernel launch, an allocation).
    #[error("{0}")]
    Device(String),
    /// A configuration value (threads, context, batch size) is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Token ids out of the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
}
