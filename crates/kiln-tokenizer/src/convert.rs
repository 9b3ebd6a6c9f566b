//! GGUF tokenizer metadata from a Hugging Face `tokenizer.json` + `tokenizer_config.json`, converted the way
//! llama.cpp's `convert_hf_to_gguf.py` does for byte-level BPE models (Qwen2/Qwen3, Llama 3, SmolLM, GPT-2).

use crate::error::{Error, Result};
use crate::vocab::{GgufVocab, TokenType};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

/// HF's Qwen2 split pattern (`tokenizer.ggml.pre = "qwen2"`).
const HF_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// HF's Llama 3 split pattern (`llama-bpe`).
const HF_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.*` metadata entries for a GGUF file, converted from `tokenizer.json` and
/// `tokenizer_config.json`: tokens (added special tokens, and added tokens that look special such as `<|…|>`,
/// become control tokens; other added tokens user-defined), merges, `tokenizer.ggml.pre` recognised from the
/// pre-tokenizer, BOS/EOS/padding ids, `add_bos_token`/`add_eos_token` and the chat template.
pub fn gguf_metadata_from_tokenizer_json(
    tokenizer_json_path: impl AsRef<Path>,
    tokenizer_config_json_path: impl AsRef<Path>,
) -> Result<Vec<(String, kiln_gguf::Value)>> {
    Ok(
        vocab_from_tokenizer_json(tokenizer_json_path, tokenizer_config_json_path, None)?
            .to_metadata(),
    )
}

/// Like [`gguf_metadata_from_tokenizer_json`], as a [`GgufVocab`]; `vocab_size` pads the vocabulary with
/// unused `[PAD{i}]` tokens up to the model's embedding rows (Qwen3's 151936), as the converter does.
pub fn vocab_from_tokenizer_json(
    tokenizer_json_path: impl AsRef<Path>,
    tokenizer_config_json_path: impl AsRef<Path>,
    vocab_size: Option<usize>,
) -> Result<GgufVocab> {
    let tj_path = tokenizer_json_path.as_ref();
    let tc_path = tokenizer_config_json_path.as_ref();
    let tj = read_json(tj_path)?;
    let tc = read_json(tc_path)?;
    let bad = |message: String| Error::Json {
        path: tj_path.display().to_string(),
        message,
    };

    let model = &tj["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(bad(format!("model type {} is not BPE", model["type"])));
    }
    let byte_level = json_contains_type(&tj["pre_tokenizer"], "ByteLevel")
        || json_contains_type(&tj["decoder"], "ByteLevel");
    if !byte_level {
        return Err(bad("only byte-level BPE tokenizers are converted".into()));
    }
    let pre = detect_pre(&tj["pre_tokenizer"]).map_err(bad)?;

    let mut by_id: HashMap<u32, String> = HashMap::new();
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("model.vocab is not an object".into()))?;
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| bad(format!("bad id for '{text}'")))?;
        by_id.insert(id, text.clone());
    }
    // Added tokens: id → (content, special).
    let mut added: HashMap<u32, (String, bool)> = HashMap::new();
    for a in tj["added_tokens"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let (Some(id), Some(content)) = (a["id"].as_u64(), a["content"].as_str()) else {
            return Err(bad(format!("malformed added token {a}")));
        };
        let id = u32::try_from(id).map_err(|_| bad(format!("added token id {id} out of range")))?;
        added.insert(
            id,
            (content.to_string(), a["special"].as_bool().unwrap_or(false)),
        );
        by_id.insert(id, content.to_string());
    }
    let max_id = by_id
        .keys()
        .copied()
        .max()
        .ok_or_else(|| bad("empty vocabulary".into()))? as usize;
    let n = vocab_size.unwrap_or(max_id + 1).max(max_id + 1);

    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        let id = i as u32;
        match (by_id.get(&id), added.get(&id)) {
            (None, _) => {
                tokens.push(format!("[PAD{i}]"));
                types.push(TokenType::Unused.id());
            }
            (Some(_), Some((content, special))) => {
                if *special || looks_special(content) {
                    tokens.push(content.clone());
                    types.push(TokenType::Control.id());
                } else {
                    // The converter stores user-defined tokens with real spaces.
                    tokens.push(content.replace('\u{2581}', " "));
                    types.push(TokenType::UserDefined.id());
                }
            }
            (Some(text), None) => {
                tokens.push(text.clone());
                types.push(TokenType::Normal.id());
            }
        }
    }

    let mut merges = Vec::new();
    for m in model["merges"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        match m {
            Json::String(s) => merges.push(s.clone()),
            Json::Array(pair) if pair.len() == 2 => match (pair[0].as_str(), pair[1].as_str()) {
                (Some(l), Some(r)) => merges.push(format!("{l} {r}")),
                _ => return Err(bad(format!("malformed merge {m}"))),
            },
            _ => return Err(bad(format!("malformed merge {m}"))),
        }
    }

    let lookup = |key: &str| -> Option<u32> {
        let text = match &tc[key] {
            Json::String(s) => s.as_str(),
            Json::Object(o) => o.get("content")?.as_str()?,
            _ => return None,
        };
        tokens.iter().rposition(|t| t == text).map(|i| i as u32)
    };
    let eos_id = lookup("eos_token");
    let pad_id = lookup("pad_token");
    // Qwen2/Qwen3's tokenizer_config has no BOS; their config.json names <|endoftext|> as bos_token_id, which
    // is what the converter writes. Without config.json, kiln takes the same token.
    let bos_id = lookup("bos_token").or_else(|| {
        tokens
            .iter()
            .position(|t| t == "<|endoftext|>")
            .map(|i| i as u32)
    });
    let unk_id = lookup("unk_token");
    let chat_template = match &tc["chat_template"] {
        Json::String(s) => Some(s.clone()),
        // A list of named templates: the converter stores the default one under this key.
        Json::Array(list) => list
            .iter()
            .find(|t| t["name"].as_str() == Some("default"))
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    };

    Ok(GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        scores: None,
        token_types: Some(types),
        merges: Some(merges),
        bos_id,
        eos_id,
        eot_id: None,
        eom_id: None,
        unk_id,
        pad_id,
        add_bos: tc["add_bos_token"].as_bool(),
        add_eos: tc["add_eos_token"].as_bool(),
        add_space_prefix: None,
        chat_template,
    })
}

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Json {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Json {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// llama.cpp's converter's `does_token_look_special`.
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{FF5C}") && t.ends_with("\u{FF5C}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

fn json_contains_type(v: &Json, ty: &str) -> bool {
    match v {
        Json::Object(o) => {
            o.get("type").and_then(Json::as_str) == Some(ty)
                || o.values().any(|x| json_contains_type(x, ty))
        }
        Json::Array(a) => a.iter().any(|x| json_contains_type(x, ty)),
        _ => false,
    }
}

/// The `tokenizer.ggml.pre` name for a tokenizer.json pre-tokenizer. llama.cpp's converter identifies it by
/// hashing the tokenization of a probe text; kiln recognises the pre-tokenizer definitions directly.
fn detect_pre(pt: &Json) -> std::result::Result<&'static str, String> {
    let steps: Vec<&Json> = match pt["type"].as_str() {
        Some("Sequence") => pt["pretokenizers"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        Some(_) => vec![pt],
        None => return Err("no pre_tokenizer".into()),
    };
    let kinds: Vec<&str> = steps
        .iter()
        .map(|s| s["type"].as_str().unwrap_or(""))
        .collect();
    match kinds.as_slice() {
        ["Split", "ByteLevel"] if steps[1]["use_regex"] == Json::Bool(false) => {
            match steps[0]["pattern"]["Regex"].as_str() {
                Some(HF_QWEN2) => Ok("qwen2"),
                Some(HF_LLAMA3) => Ok("llama-bpe"),
                other => Err(format!(
                    "unrecognised pre-tokenizer split pattern {other:?}"
                )),
            }
        }
        ["ByteLevel"] if steps[0]["use_regex"] != Json::Bool(false) => Ok("gpt-2"),
        ["Digits", "ByteLevel"] if steps[0]["individual_digits"] == Json::Bool(true) => {
            Ok("smollm")
        }
        _ => Err(format!("unrecognised pre-tokenizer {pt}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_looking_tokens() {
        assert!(looks_special("<|fim_prefix|>"));
        assert!(looks_special("<unused12>"));
        assert!(!looks_special("<think>"));
        assert!(!looks_special("<tool_call>"));
    }

    #[test]
    fn pre_detection() {
        let qwen = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": HF_QWEN2}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]});
        assert_eq!(detect_pre(&qwen), Ok("qwen2"));
        let gpt2 =
            serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true});
        assert_eq!(detect_pre(&gpt2), Ok("gpt-2"));
        let odd = serde_json::json!({"type": "Whitespace"});
        assert!(detect_pre(&odd).is_err());
    }
}
