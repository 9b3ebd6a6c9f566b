//! The crate's error type.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A tokenizer construction, encoding, decoding or chat-template error. Every variant names what it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A metadata key is missing, has the wrong type, or holds a bad value.
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] kiln_gguf::Error),
    /// `tokenizer.ggml.model` names a tokenizer kiln does not implement.
    #[error("tokenizer.ggml.model = '{0}' is not supported (kiln supports 'gpt2' (BPE) and 'llama' (SentencePiece-style))")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer kiln does not implement.
    #[error("tokenizer.ggml.pre = '{0}' is not supported by kiln's BPE pre-tokenizers")]
    UnsupportedPre(String),
    /// A per-token array does not have one entry per token.
    #[error("metadata key '{key}' has {found} entries, but the vocabulary has {expected} tokens")]
    LengthMismatch {
        /// The array's key.
        key: &'static str,
        /// The number of tokens.
        expected: usize,
        /// The array's length.
        found: usize,
    },
    /// A special-token id is outside the vocabulary.
    #[error("metadata key '{key}' = {id} is outside the vocabulary of {n_vocab} tokens")]
    BadTokenId {
        /// The key holding the id.
        key: &'static str,
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// The vocabulary is inconsistent (e.g. empty, or a merge names an unknown token).
    #[error("bad vocabulary: {0}")]
    BadVocab(String),
    /// The HF `tokenizers` library reported an error.
    #[error("tokenizers: {0}")]
    Hf(String),
    /// A token id passed to decode or lookup is outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    UnknownId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// The model has no chat template.
    #[error("the model has no chat template (tokenizer.chat_template)")]
    NoChatTemplate,
    /// The chat template failed to compile or render.
    #[error("chat template: {0:#}")]
    Template(#[from] minijinja::Error),
    /// A JSON file (tokenizer.json, tokenizer_config.json) could not be read or understood.
    #[error("{path}: {message}")]
    Json {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl Error {
    pub(crate) fn hf(e: impl std::fmt::Display) -> Error {
        Error::Hf(e.to_string())
    }
}
