//! The tokenizer part of a GGUF file's metadata (`tokenizer.ggml.*`), as plain data.
//!
//! Keeping this a plain struct separates "what the file says" from "how kiln tokenizes": tests and converters
//! can build a [`GgufVocab`] directly, and [`GgufVocab::from_metadata`] is the only code that knows the keys.

use crate::error::{Error, Result};
use kiln_gguf::Metadata;

/// GGUF metadata keys of the tokenizer.
pub mod keys {
    /// `gpt2` (byte-level BPE) or `llama` (SentencePiece-style).
    pub const MODEL: &str = "tokenizer.ggml.model";
    /// The BPE pre-tokenizer name (`qwen2`, `smollm`, `llama-bpe`, …).
    pub const PRE: &str = "tokenizer.ggml.pre";
    /// Token texts, one per id.
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    /// SentencePiece scores, one per id.
    pub const SCORES: &str = "tokenizer.ggml.scores";
    /// Token types, one per id (see [`crate::TokenType`]).
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    /// BPE merges, `"left right"`, highest priority first.
    pub const MERGES: &str = "tokenizer.ggml.merges";
    /// Beginning-of-sequence token id.
    pub const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
    /// End-of-sequence token id.
    pub const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
    /// End-of-turn token id.
    pub const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
    /// End-of-message token id.
    pub const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
    /// Unknown token id.
    pub const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
    /// Padding token id.
    pub const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
    /// Whether encoding with special tokens prepends BOS.
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    /// Whether encoding with special tokens appends EOS.
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    /// Whether SentencePiece-style encoding prepends a space to the text.
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
    /// The Jinja chat template.
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
}

/// A token's type, as stored in `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: not specified.
    Undefined,
    /// 1: an ordinary piece of text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<|im_start|>`, `<bos>`): only produced from text when parsing special tokens.
    Control,
    /// 4: a user-defined token: always matched as a whole in text.
    UserDefined,
    /// 5: unused.
    Unused,
    /// 6: a byte-fallback token `<0xXX>`.
    Byte,
}

impl TokenType {
    /// The type stored as `id` in the file; unknown ids read as [`TokenType::Undefined`], as in llama.cpp.
    pub fn from_id(id: i32) -> TokenType {
        match id {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// The id stored in the file.
    pub fn id(self) -> i32 {
        match self {
            TokenType::Undefined => 0,
            TokenType::Normal => 1,
            TokenType::Unknown => 2,
            TokenType::Control => 3,
            TokenType::UserDefined => 4,
            TokenType::Unused => 5,
            TokenType::Byte => 6,
        }
    }
}

/// The tokenizer metadata of a GGUF file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` or `llama`.
    pub model: String,
    /// `tokenizer.ggml.pre`: the BPE pre-tokenizer name.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// Reads the tokenizer keys of a GGUF metadata table. Only type errors and missing required keys
    /// (`tokenizer.ggml.model`, `tokenizer.ggml.tokens`) fail here; consistency is checked when building a
    /// [`crate::Tokenizer`].
    pub fn from_metadata(md: &Metadata) -> Result<GgufVocab> {
        let token_types = md.opt_arr_i32(keys::TOKEN_TYPE)?.map(|c| c.into_owned());
        Ok(GgufVocab {
            model: md.get_str(keys::MODEL)?.to_string(),
            pre: md.opt_str(keys::PRE)?.map(str::to_string),
            tokens: md.get_arr_str(keys::TOKENS)?.to_vec(),
            scores: md.opt_arr_f32(keys::SCORES)?.map(<[f32]>::to_vec),
            token_types,
            merges: md.opt_arr_str(keys::MERGES)?.map(<[String]>::to_vec),
            bos_id: md.opt_u32(keys::BOS_ID)?,
            eos_id: md.opt_u32(keys::EOS_ID)?,
            eot_id: md.opt_u32(keys::EOT_ID)?,
            eom_id: md.opt_u32(keys::EOM_ID)?,
            unk_id: md.opt_u32(keys::UNK_ID)?,
            pad_id: md.opt_u32(keys::PAD_ID)?,
            add_bos: md.opt_bool(keys::ADD_BOS)?,
            add_eos: md.opt_bool(keys::ADD_EOS)?,
            add_space_prefix: md.opt_bool(keys::ADD_SPACE_PREFIX)?,
            chat_template: md.opt_str(keys::CHAT_TEMPLATE)?.map(str::to_string),
        })
    }

    /// The metadata entries describing this vocabulary, in the order llama.cpp's converter writes them; absent
    /// optional fields are left out.
    pub fn to_metadata(&self) -> Vec<(String, kiln_gguf::Value)> {
        use kiln_gguf::{Array, Value};
        let mut out: Vec<(String, Value)> = Vec::new();
        let mut put = |k: &str, v: Value| out.push((k.to_string(), v));
        put(keys::MODEL, Value::String(self.model.clone()));
        if let Some(p) = &self.pre {
            put(keys::PRE, Value::String(p.clone()));
        }
        put(
            keys::TOKENS,
            Value::Array(Array::String(self.tokens.clone())),
        );
        if let Some(s) = &self.scores {
            put(keys::SCORES, Value::Array(Array::F32(s.clone())));
        }
        if let Some(t) = &self.token_types {
            put(keys::TOKEN_TYPE, Value::Array(Array::I32(t.clone())));
        }
        if let Some(m) = &self.merges {
            put(keys::MERGES, Value::Array(Array::String(m.clone())));
        }
        for (k, v) in [
            (keys::BOS_ID, self.bos_id),
            (keys::EOS_ID, self.eos_id),
            (keys::EOT_ID, self.eot_id),
            (keys::EOM_ID, self.eom_id),
            (keys::UNK_ID, self.unk_id),
            (keys::PAD_ID, self.pad_id),
        ] {
            if let Some(v) = v {
                put(k, Value::U32(v));
            }
        }
        for (k, v) in [
            (keys::ADD_BOS, self.add_bos),
            (keys::ADD_EOS, self.add_eos),
            (keys::ADD_SPACE_PREFIX, self.add_space_prefix),
        ] {
            if let Some(v) = v {
                put(k, Value::Bool(v));
            }
        }
        if let Some(t) = &self.chat_template {
            put(keys::CHAT_TEMPLATE, Value::String(t.clone()));
        }
        out
    }

    /// The type of token `id` ([`TokenType::Normal`] when the file has no types).
    pub fn token_type(&self, id: usize) -> TokenType {
        match &self.token_types {
            Some(t) => t
                .get(id)
                .map_or(TokenType::Undefined, |&v| TokenType::from_id(v)),
            None => TokenType::Normal,
        }
    }

    pub(crate) fn check_lengths(&self) -> Result<()> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(Error::BadVocab(format!("'{}' is empty", keys::TOKENS)));
        }
        if let Some(s) = &self.scores {
            if s.len() != n {
                return Err(Error::LengthMismatch {
                    key: keys::SCORES,
                    expected: n,
                    found: s.len(),
                });
            }
        }
        if let Some(t) = &self.token_types {
            if t.len() != n {
                return Err(Error::LengthMismatch {
                    key: keys::TOKEN_TYPE,
                    expected: n,
                    found: t.len(),
                });
            }
        }
        Ok(())
    }
}
