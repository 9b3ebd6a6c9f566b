//! Builds the HF `tokenizers` model that does the text-to-ids work for one fragment of text: byte-level BPE
//! with llama.cpp's pre-tokenizer regexes for `gpt2` vocabularies, and BPE with byte fallback and merges derived
//! from the scores for SentencePiece-style (`llama`) vocabularies. Special tokens are not part of this model:
//! [`crate::Tokenizer`] splits them out first, the way llama.cpp does, so that `parse_special` can be honoured.

use crate::error::{Error, Result};
use crate::vocab::{GgufVocab, TokenType};
use std::collections::HashMap;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

/// GPT-2's pattern. llama.cpp lists it without the final `|\s+`; text a pattern leaves unmatched becomes a piece
/// of its own in both llama.cpp and HF's `Split(Isolated)`, so the two forms split alike.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's pattern, with the case-insensitive contractions spelled as classes as llama.cpp does.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pattern: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A BPE pre-tokenizer family: the regexes llama.cpp applies, in order, for a `tokenizer.ggml.pre` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's default (also used when `tokenizer.ggml.pre` is missing): punctuation runs, GPT-2's pattern,
    /// digit runs, then groups of three ASCII digits.
    Default,
    /// GPT-2's pattern alone (`gpt-2`, `phi-2`, `mpt`, `olmo`, …).
    Gpt2,
    /// Llama 3 (`llama-bpe`, `llama3`, …): digits in groups of up to three; merges are skipped for words that
    /// are whole tokens.
    Llama3,
    /// Qwen2/Qwen3 (`qwen2`, …): Llama 3's pattern with single digits.
    Qwen2,
    /// StarCoder family (`smollm`, `starcoder`, `refact`, …): every digit on its own, then GPT-2's pattern.
    StarCoder,
}

impl PreTokenizer {
    /// The family for a `tokenizer.ggml.pre` value; `None` (key absent) is llama.cpp's default. An unknown name
    /// is an error: a wrong pre-tokenizer silently changes token ids.
    pub fn from_name(name: Option<&str>) -> Result<PreTokenizer> {
        let Some(name) = name else {
            return Ok(PreTokenizer::Default);
        };
        Ok(match name {
            // "gpt2" is not a name llama.cpp knows; it falls back to its default, and so does kiln.
            "default" | "gpt2" => PreTokenizer::Default,
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "exaone4" | "a.x-4.0"
            | "mellum" | "gigachat" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de"
            | "modern-bert" => PreTokenizer::Gpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe" => PreTokenizer::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" | "hunyuan" => {
                PreTokenizer::Qwen2
            }
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => PreTokenizer::StarCoder,
            other => return Err(Error::UnsupportedPre(other.to_string())),
        })
    }

    fn regexes(self) -> &'static [&'static str] {
        match self {
            PreTokenizer::Default => {
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
            }
            PreTokenizer::Gpt2 => &[GPT2],
            PreTokenizer::Llama3 => &[LLAMA3],
            PreTokenizer::Qwen2 => &[QWEN2],
            PreTokenizer::StarCoder => &[r"\p{N}", GPT2],
        }
    }

    /// Whether a word that is itself a token skips the merges (llama.cpp's `ignore_merges`).
    pub(crate) fn ignore_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// llama.cpp's default for `add_bos` when the file does not say.
    pub(crate) fn default_add_bos(self) -> bool {
        self == PreTokenizer::Llama3
    }
}

/// Whether decoding applies `clean_up_tokenization_spaces` for a `tokenizer.ggml.pre` value: llama.cpp turns it
/// on for every BPE vocabulary and off again for a list of names, not by pre-tokenizer family.
pub(crate) fn clean_spaces(pre: Option<&str>) -> bool {
    !matches!(
        pre,
        Some("qwen2" | "deepseek-r1-qwen" | "kormo" | "smollm" | "command-r")
    )
}

/// Token text → id. Where a text appears twice the later id wins, as in llama.cpp's loader.
fn vocab_map(v: &GgufVocab) -> Vocab {
    let mut map = Vocab::with_capacity(v.tokens.len());
    for (i, t) in v.tokens.iter().enumerate() {
        map.insert(t.clone(), i as u32);
    }
    map
}

/// The byte-level BPE model of a `gpt2` vocabulary.
pub(crate) fn bpe(v: &GgufVocab, pre: PreTokenizer) -> Result<tokenizers::Tokenizer> {
    let vocab = vocab_map(v);
    let raw = v
        .merges
        .as_ref()
        .ok_or_else(|| Error::BadVocab("BPE vocabulary without 'tokenizer.ggml.merges'".into()))?;
    let mut merges = Vec::with_capacity(raw.len());
    for m in raw {
        // llama.cpp splits at the first space after the first byte, so a merge may start with a space.
        let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
            return Err(Error::BadVocab(format!(
                "merge '{m}' has no separating space"
            )));
        };
        let (l, r) = (&m[..pos], &m[pos + 1..]);
        // A merge naming an unknown token can never fire in llama.cpp (its result must be a token to be
        // emitted whole); HF refuses such merges, so they are left out.
        let joined = format!("{l}{r}");
        if vocab.contains_key(l) && vocab.contains_key(r) && vocab.contains_key(&joined) {
            merges.push((l.to_string(), r.to_string()));
        }
    }
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges())
        .build()
        .map_err(Error::hf)?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in pre.regexes() {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(Error::hf)?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tok)
}

/// The SentencePiece-style model of a `llama` vocabulary: llama.cpp repeatedly merges the adjacent pair whose
/// concatenation is the highest-scoring token (leftmost on ties) and falls back to `<0xXX>` byte tokens. That is
/// BPE whose merge ranks follow the merged token's score, which is how HF converts SentencePiece BPE models too.
pub(crate) fn spm(v: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    let vocab = vocab_map(v);
    let scores = v.scores.as_deref();
    let score = |id: usize| scores.map_or(0.0, |s| s[id]);
    // Only normal tokens are formed by merging: control and user-defined pieces are never built from parts.
    let mut order: Vec<usize> = (0..v.tokens.len())
        .filter(|&i| v.token_type(i) == TokenType::Normal && v.tokens[i].chars().nth(1).is_some())
        .collect();
    order.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
    let ids: HashMap<&str, u32> = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let mut merges = Vec::new();
    for id in order {
        let t = v.tokens[id].as_str();
        if ids.get(t) != Some(&(id as u32)) {
            continue; // a duplicate text: the other id owns it
        }
        for (pos, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(pos);
            if ids.contains_key(l) && ids.contains_key(r) {
                merges.push((l.to_string(), r.to_string()));
            }
        }
    }
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true);
    if let Some(unk) = v.unk_id.and_then(|u| v.tokens.get(u as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let model = builder.build().map_err(Error::hf)?;
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_normalizer(Some(Replace::new(" ", "\u{2581}").map_err(Error::hf)?))
        .map_err(Error::hf)?;
    Ok(tok)
}
