//! kiln-tokenizer: the tokenizer of a GGUF model, built from its `tokenizer.ggml.*` metadata with the HF
//! `tokenizers` library and llama.cpp's semantics.
//!
//! * `tokenizer.ggml.model = "gpt2"`: byte-level BPE with the pre-tokenizer regexes llama.cpp uses for
//!   `tokenizer.ggml.pre` (`qwen2`, `smollm`/StarCoder family, `llama-bpe`/Llama 3 family, `gpt-2`, and
//!   llama.cpp's default when the key is absent). An unknown name is an error.
//! * `tokenizer.ggml.model = "llama"`: SentencePiece-style (Gemma, Llama 2): score-ordered merges, `▁` for
//!   spaces, `<0xXX>` byte fallback, optional space prefix.
//! * Control tokens (type 3) come from text only with `parse_special`; user-defined tokens (type 4) always.
//! * [`StreamDecoder`] emits only whole UTF-8 characters; [`ChatTemplate`] renders `tokenizer.chat_template`
//!   like transformers; [`apply_chat_template_ids`] tokenizes a rendered chat so that control-token text inside
//!   messages cannot inject turns.
//!
//! ```
//! use kiln_tokenizer::{GgufVocab, StreamDecoder, Tokenizer};
//! // A tiny SentencePiece-style vocabulary: <unk>, <s>, </s>, pieces with scores, and byte tokens.
//! let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "▁", "h", "i", "▁h", "▁hi"].map(String::from).to_vec();
//! let mut types = vec![2, 3, 3, 1, 1, 1, 1, 1];
//! let mut scores = vec![0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -0.5, -0.1];
//! for b in 0..=255u8 {
//!     tokens.push(format!("<0x{b:02X}>"));
//!     types.push(6);
//!     scores.push(0.0);
//! }
//! let vocab = GgufVocab {
//!     model: "llama".into(),
//!     tokens,
//!     token_types: Some(types),
//!     scores: Some(scores),
//!     ..GgufVocab::default()
//! };
//! let tok = Tokenizer::from_vocab(vocab)?;
//! // SentencePiece defaults: BOS (id 1) and a space prefix; "é" is not a piece, so it falls back to bytes.
//! let ids = tok.encode("hi é", true, false)?;
//! assert_eq!(ids[..2], [1, 7]);
//! assert_eq!(tok.decode(&ids, true)?, "hi é");
//! let mut stream = StreamDecoder::new(true);
//! let mut text = String::new();
//! for &id in &ids {
//!     text += &stream.push(&tok, id)?; // never half of "é"
//! }
//! text += &stream.finish();
//! assert_eq!(text, "hi é");
//! # Ok::<(), kiln_tokenizer::Error>(())
//! ```
//!
//! For a model file: `Tokenizer::from_gguf(&kiln_gguf::GgufFile::open(path)?)`.

#![deny(missing_docs)]

mod build;
mod bytelevel;
mod chat;
mod convert;
mod error;
mod stream;
mod tokenizer;
mod vocab;

pub use build::PreTokenizer;
pub use chat::{apply_chat_template_ids, ChatTemplate, Message};
pub use convert::{gguf_metadata_from_tokenizer_json, vocab_from_tokenizer_json};
pub use error::{Error, Result};
pub use stream::StreamDecoder;
pub use tokenizer::{Tokenizer, VocabKind};
pub use vocab::{keys, GgufVocab, TokenType};
