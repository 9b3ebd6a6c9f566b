//! The built-in tokenizer of the tiny presets, and padding of a real tokenizer's vocabulary to the model's rows.
//!
//! The built-in one is a byte-level BPE in the GPT-2 / Qwen2 style (`tokenizer.ggml.model = "gpt2"`,
//! pre-tokenizer `qwen2`): the 256 byte tokens in GPT-2's byte-to-unicode spelling, a handful of English merges,
//! and Qwen's three special tokens, padded with `[PADn]` tokens to the preset's vocabulary. Any text
//! tokenizes (bytes always do), so a tiny model can run end to end without a 151k-entry vocabulary.

use kiln_gguf::{Array, Value};

use super::SynthError;

/// GGUF token types (llama.cpp's `llama_token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const UNUSED: i32 = 5;

const MERGES: [(&str, &str); 8] = [
    ("Ġ", "t"),
    ("h", "e"),
    ("i", "n"),
    ("e", "r"),
    ("a", "n"),
    ("Ġ", "a"),
    ("o", "n"),
    ("Ġt", "he"),
];

/// The special tokens, in id order after the bytes and merges.
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// A ChatML template (Qwen's format without tools or thinking).
const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// GPT-2's reversible byte → printable character map.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("256 + rank < 0x200 is a valid scalar")
}

/// Metadata of the built-in tokenizer padded to `vocab` tokens.
pub(crate) fn builtin(vocab: usize) -> Result<Vec<(String, Value)>, SynthError> {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![NORMAL; 256];
    for (a, b) in MERGES {
        tokens.push(format!("{a}{b}"));
        types.push(NORMAL);
    }
    let first_special = tokens.len() as u32;
    for s in SPECIALS {
        tokens.push(s.to_owned());
        types.push(CONTROL);
    }
    let merges: Vec<String> = MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    let mut meta = vec![
        ("tokenizer.ggml.model".to_owned(), Value::from("gpt2")),
        ("tokenizer.ggml.pre".to_owned(), Value::from("qwen2")),
        (
            "tokenizer.ggml.tokens".to_owned(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".to_owned(),
            Value::Array(Array::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".to_owned(),
            Value::Array(Array::String(merges)),
        ),
        (
            "tokenizer.ggml.bos_token_id".to_owned(),
            Value::U32(first_special),
        ),
        (
            "tokenizer.ggml.eos_token_id".to_owned(),
            Value::U32(first_special + 2),
        ),
        (
            "tokenizer.ggml.padding_token_id".to_owned(),
            Value::U32(first_special),
        ),
        (
            "tokenizer.ggml.add_bos_token".to_owned(),
            Value::Bool(false),
        ),
        (
            "tokenizer.chat_template".to_owned(),
            Value::from(CHAT_TEMPLATE),
        ),
    ];
    pad_vocab(&mut meta, vocab)?;
    Ok(meta)
}

/// Pads `tokenizer.ggml.tokens` (and `token_type`, `scores` when present) with unused `[PADn]` tokens up to
/// `vocab`, as llama.cpp's converter does when a model's embedding has more rows than its tokenizer has
/// tokens (Qwen3: 151,669 tokens, 151,936 rows).
pub(crate) fn pad_vocab(meta: &mut [(String, Value)], vocab: usize) -> Result<(), SynthError> {
    let tok_err = |why: String| SynthError::Tokenizer(why);
    let n = match meta.iter_mut().find(|(k, _)| k == "tokenizer.ggml.tokens") {
        Some((_, Value::Array(Array::String(t)))) => {
            let n = t.len();
            if n > vocab {
                return Err(tok_err(format!(
                    "the tokenizer has {n} tokens but the model has only {vocab} embedding rows"
                )));
            }
            t.extend((n..vocab).map(|i| format!("[PAD{i}]")));
            n
        }
        Some(_) => {
            return Err(tok_err(
                "tokenizer.ggml.tokens is not an array of strings".into(),
            ))
        }
        None => {
            return Err(tok_err(
                "the tokenizer metadata has no tokenizer.ggml.tokens".into(),
            ))
        }
    };
    for (k, v) in meta.iter_mut() {
        match (k.as_str(), v) {
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(t))) if t.len() == n => {
                t.resize(vocab, UNUSED)
            }
            ("tokenizer.ggml.scores", Value::Array(Array::F32(s))) if s.len() == n => {
                s.resize(vocab, 0.0)
            }
            ("tokenizer.ggml.token_type" | "tokenizer.ggml.scores", _) => {
                return Err(tok_err(format!(
                    "{k} is not an array matching the {n} tokens"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn builtin_is_padded_and_consistent() {
        let m = builtin(300).unwrap();
        let get = |k: &str| {
            m.iter()
                .find(|(kk, _)| kk == k)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        let Value::Array(Array::String(t)) = get("tokenizer.ggml.tokens") else {
            panic!()
        };
        let Value::Array(Array::I32(ty)) = get("tokenizer.ggml.token_type") else {
            panic!()
        };
        assert_eq!((t.len(), ty.len()), (300, 300));
        assert_eq!(t[263], "Ġthe");
        assert_eq!(t[266], "<|im_end|>");
        assert_eq!(get("tokenizer.ggml.eos_token_id"), Value::U32(266));
        assert_eq!((t[299].as_str(), ty[299]), ("[PAD299]", UNUSED));
        assert_eq!(256 + MERGES.len() + SPECIALS.len(), 267);
        assert!(builtin(100).is_err());
    }
}
