//! [`Tokenizer`]: text ↔ token ids for a GGUF model, with llama.cpp's semantics for special tokens, BOS/EOS and
//! SentencePiece space handling.

use crate::build::{self, PreTokenizer};
use crate::bytelevel;
use crate::error::{Error, Result};
use crate::vocab::{keys, GgufVocab, TokenType};
use kiln_gguf::{GgufFile, Metadata};

/// Token texts llama.cpp treats as end of generation wherever they appear in a vocabulary. llama.cpp also
/// makes each of them a control token, whatever the file says (so `</s>` in Gemma 3, a user-defined token in
/// the file, is not matched in plain text).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "[e~[",
];

/// Token texts llama.cpp takes as the end-of-turn token when `tokenizer.ggml.eot_token_id` is absent, in the
/// order kiln prefers them.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\u{FF5C}end\u{2581}of\u{2581}sentence\u{FF5C}>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle pad, repository and file-separator texts: llama.cpp makes the first one found of each
/// group a control token that ends generation.
const FIM_EOG_GROUPS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// Fill-in-the-middle prefix/suffix/middle texts: llama.cpp makes the first one found of each group a control
/// token.
const FIM_GROUPS: &[&[&str]] = &[
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<\u{FF5C}fim\u{2581}begin\u{FF5C}>",
        "<PRE>",
        "\u{2581}<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<\u{FF5C}fim\u{2581}hole\u{FF5C}>",
        "<SUF>",
        "\u{2581}<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<\u{FF5C}fim\u{2581}end\u{FF5C}>",
        "<MID>",
        "\u{2581}<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
];

/// The kind of vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE with a regex pre-tokenizer.
    Bpe(PreTokenizer),
    /// `tokenizer.ggml.model = "llama"`: SentencePiece-style, `▁` for spaces, `<0xXX>` byte fallback.
    Spm,
}

/// One piece of input after special tokens are split out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// A GGUF model's tokenizer. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Tokenizer {
    kind: VocabKind,
    hf: tokenizers::Tokenizer,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// The bytes each token stands for when decoded (control tokens: their text), concatenated.
    piece_bytes: Vec<u8>,
    piece_ends: Vec<usize>,
    /// Tokens split out of text before the model runs, longest text first, with whether they need
    /// `parse_special` (control and unknown tokens) or are always matched (user-defined tokens).
    specials: Vec<(u32, bool)>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("n_vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// The tokenizer of a GGUF file (its `tokenizer.*` metadata).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        Tokenizer::from_metadata(file.metadata())
    }

    /// The tokenizer described by a metadata table.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer> {
        Tokenizer::from_vocab(GgufVocab::from_metadata(md)?)
    }

    /// The tokenizer described by `v`. Defaults for absent keys follow llama.cpp: SentencePiece vocabularies
    /// add BOS and a space prefix, BPE vocabularies add BOS only for the Llama 3 family; absent BOS/EOS ids are
    /// llama.cpp's defaults (1/2 for SentencePiece, 11/11 for BPE) when those ids exist.
    pub fn from_vocab(v: GgufVocab) -> Result<Tokenizer> {
        v.check_lengths()?;
        let n = v.tokens.len();
        let (kind, hf) = match v.model.as_str() {
            "gpt2" => {
                let pre = PreTokenizer::from_name(v.pre.as_deref())?;
                (VocabKind::Bpe(pre), build::bpe(&v, pre)?)
            }
            "llama" => (VocabKind::Spm, build::spm(&v)?),
            other => return Err(Error::UnsupportedModel(other.to_string())),
        };
        let check = |key: &'static str, id: Option<u32>| -> Result<Option<u32>> {
            match id {
                Some(id) if id as usize >= n => Err(Error::BadTokenId {
                    key,
                    id,
                    n_vocab: n,
                }),
                other => Ok(other),
            }
        };
        let (default_bos, default_eos) = match kind {
            VocabKind::Spm => (1, 2),
            VocabKind::Bpe(_) => (11, 11),
        };
        let in_range = |id: u32| (id as usize) < n;
        let bos = check(keys::BOS_ID, v.bos_id)?.or(Some(default_bos).filter(|&i| in_range(i)));
        let eos = check(keys::EOS_ID, v.eos_id)?.or(Some(default_eos).filter(|&i| in_range(i)));
        let eom = check(keys::EOM_ID, v.eom_id)?;
        let eot_meta = check(keys::EOT_ID, v.eot_id)?;
        check(keys::UNK_ID, v.unk_id)?;
        check(keys::PAD_ID, v.pad_id)?;

        let mut types: Vec<TokenType> = (0..n).map(|i| v.token_type(i)).collect();
        let by_text: std::collections::HashMap<&str, u32> = v
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_str(), i as u32))
            .collect();
        let find = |text: &str| by_text.get(text).copied();
        let eot = eot_meta.or_else(|| EOT_TEXTS.iter().find_map(|t| find(t)));
        let mut eog: Vec<u32> = EOG_TEXTS.iter().filter_map(|t| find(t)).collect();
        let fim_eog: Vec<u32> = FIM_EOG_GROUPS
            .iter()
            .filter_map(|g| g.iter().find_map(|t| find(t)))
            .collect();
        let fim: Vec<u32> = FIM_GROUPS
            .iter()
            .filter_map(|g| g.iter().find_map(|t| find(t)))
            .collect();
        // llama.cpp's exceptions: with harmony-style <|return|>/<|call|>, <|end|> is an ordinary (user-defined)
        // token; with gemma4/plamo markers, </s> is a normal token.
        let has = |t: &str| find(t).is_some();
        let mut demote = Vec::new();
        if (has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")) {
            demote.extend(find("<|end|>").map(|i| (i, TokenType::UserDefined)));
        }
        if has("<|tool_response>") || has("<|plamo:eos|>") {
            demote.extend(find("</s>").map(|i| (i, TokenType::Normal)));
        }
        for &id in eog
            .iter()
            .chain(&fim_eog)
            .chain(&fim)
            .chain(eot.iter())
            .chain(eom.iter())
        {
            if !matches!(types[id as usize], TokenType::Control | TokenType::Unknown) {
                types[id as usize] = TokenType::Control;
            }
        }
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            demote.extend(find(t).map(|i| (i, TokenType::UserDefined)));
        }
        for &(id, ty) in &demote {
            types[id as usize] = ty;
        }
        eog.retain(|id| !demote.iter().any(|d| d.0 == *id));
        eog.extend(fim_eog);
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        let (add_bos_default, add_space_default) = match kind {
            VocabKind::Spm => (true, true),
            VocabKind::Bpe(pre) => (pre.default_add_bos(), false),
        };
        let clean_spaces = match kind {
            VocabKind::Spm => false,
            VocabKind::Bpe(_) => build::clean_spaces(v.pre.as_deref()),
        };

        let mut specials: Vec<(u32, bool)> = types
            .iter()
            .enumerate()
            .filter(|(i, _)| !v.tokens[*i].is_empty())
            .filter_map(|(i, ty)| match ty {
                TokenType::Control | TokenType::Unknown => Some((i as u32, true)),
                TokenType::UserDefined => Some((i as u32, false)),
                _ => None,
            })
            .collect();
        specials.sort_by(|a, b| {
            let (la, lb) = (v.tokens[a.0 as usize].len(), v.tokens[b.0 as usize].len());
            lb.cmp(&la).then(a.0.cmp(&b.0))
        });

        let (piece_bytes, piece_ends) = pieces(&v.tokens, &types, kind);
        Ok(Tokenizer {
            kind,
            hf,
            specials,
            bos,
            eos,
            eot,
            eog,
            add_bos: v.add_bos.unwrap_or(add_bos_default),
            add_eos: v.add_eos.unwrap_or(false),
            add_space_prefix: match kind {
                VocabKind::Spm => v.add_space_prefix.unwrap_or(add_space_default),
                VocabKind::Bpe(_) => false,
            },
            clean_spaces,
            chat_template: v.chat_template,
            tokens: v.tokens,
            types,
            piece_bytes,
            piece_ends,
        })
    }

    /// Text → ids. `add_special` adds BOS/EOS where the model asks for them (`tokenizer.ggml.add_bos_token`,
    /// `add_eos_token`, or llama.cpp's default for the vocabulary type). `parse_special` lets the text produce
    /// control tokens (`<|im_start|>`); without it such text is tokenized as ordinary text. User-defined tokens
    /// are always matched, as in llama.cpp and HF.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let frags = self.partition(text, |needs_parse| !needs_parse || parse_special);
        self.encode_fragments(&frags, add_special, std::borrow::Cow::Borrowed)
    }

    /// Tokenizes pre-split fragments: `Token`s are emitted as they are, `Text`s (after `clean`) go through the
    /// model, with SentencePiece's space prefix at the start and after every token fragment.
    pub(crate) fn encode_fragments<'a, F>(
        &self,
        frags: &[Fragment<'a>],
        add_special: bool,
        clean: F,
    ) -> Result<Vec<u32>>
    where
        F: Fn(&'a str) -> std::borrow::Cow<'a, str>,
    {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        let mut prev_special = true;
        for f in frags {
            match *f {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(s) => {
                    let s = clean(s);
                    if s.is_empty() {
                        continue;
                    }
                    if self.kind == VocabKind::Spm && self.add_space_prefix && prev_special {
                        self.model_encode(&format!(" {s}"), &mut out)?;
                    } else {
                        self.model_encode(&s, &mut out)?;
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(e) = self.eos {
                out.push(e);
            }
        }
        Ok(out)
    }

    fn model_encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let enc = self.hf.encode_fast(text, false).map_err(Error::hf)?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }

    /// Splits special tokens out of `text` as llama.cpp does: longest token text first, each occurrence in what
    /// is still plain text. `wanted(needs_parse_special)` says which tokens take part.
    pub(crate) fn partition<'a>(
        &self,
        text: &'a str,
        wanted: impl Fn(bool) -> bool,
    ) -> Vec<Fragment<'a>> {
        let mut frags = Vec::new();
        if !text.is_empty() {
            frags.push(Fragment::Text(text));
        }
        for &(id, needs_parse) in &self.specials {
            if !wanted(needs_parse) {
                continue;
            }
            let pat = self.tokens[id as usize].as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(s) if s.contains(pat)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut s) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = s.find(pat) {
                    if pos > 0 {
                        next.push(Fragment::Text(&s[..pos]));
                    }
                    next.push(Fragment::Token(id));
                    s = &s[pos + pat.len()..];
                }
                if !s.is_empty() {
                    next.push(Fragment::Text(s));
                }
            }
            frags = next;
        }
        frags
    }

    /// Ids → text. `skip_special` drops control tokens (BOS, EOS, `<|im_start|>`, …); otherwise they appear as
    /// their text. Byte-level and byte-fallback pieces are joined as bytes, so characters split across tokens
    /// come out whole; bytes that are not valid UTF-8 become U+FFFD. SentencePiece vocabularies with a space
    /// prefix drop the first token's leading space, as llama.cpp does.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::new();
        let mut first = true;
        for &id in ids {
            if self.skips_leading_bos(id, skip_special, first) {
                continue;
            }
            let piece = self.decode_piece(id, skip_special)?;
            bytes.extend_from_slice(self.strip_first(piece, &mut first));
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(if self.clean_spaces {
            clean_up_spaces(&text)
        } else {
            text
        })
    }

    /// The bytes `id` decodes to (empty for a skipped special token).
    pub(crate) fn decode_piece(&self, id: u32, skip_special: bool) -> Result<&[u8]> {
        let ty = *self.types.get(id as usize).ok_or(Error::UnknownId {
            id,
            n_vocab: self.tokens.len(),
        })?;
        if skip_special && matches!(ty, TokenType::Control | TokenType::Unknown) {
            return Ok(&[]);
        }
        Ok(self.token_bytes_unchecked(id))
    }

    /// Whether `id` is a leading BOS that a decode skipping special tokens drops before anything else, so that
    /// the space-prefix removal applies to the first real token (llama.cpp's `remove_special`).
    pub(crate) fn skips_leading_bos(&self, id: u32, skip_special: bool, first: bool) -> bool {
        first && skip_special && self.add_bos && Some(id) == self.bos
    }

    /// Drops one leading space from the first piece of a SentencePiece decode with a space prefix.
    pub(crate) fn strip_first<'p>(&self, piece: &'p [u8], first: &mut bool) -> &'p [u8] {
        let strip = *first && self.add_space_prefix;
        *first = false;
        match piece {
            [b' ', rest @ ..] if strip => rest,
            p => p,
        }
    }

    fn token_bytes_unchecked(&self, id: u32) -> &[u8] {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.piece_ends[i - 1] };
        &self.piece_bytes[start..self.piece_ends[i]]
    }

    /// The bytes token `id` stands for (a control token: its text).
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.decode_piece(id, false)
    }

    /// Token `id` as readable text: its bytes, with invalid UTF-8 (a partial character) shown as U+FFFD.
    pub fn token_piece(&self, id: u32) -> Result<String> {
        Ok(String::from_utf8_lossy(self.token_bytes(id)?).into_owned())
    }

    /// Token `id`'s text as stored in the vocabulary (byte-level or `▁` form).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Token `id`'s type.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.tokens
            .iter()
            .rposition(|t| t == text)
            .map(|i| i as u32)
    }

    /// Whether `id` is a control (or unknown) token: one that plain text never produces.
    pub fn is_control(&self, id: u32) -> bool {
        matches!(
            self.token_type(id),
            Some(TokenType::Control | TokenType::Unknown)
        )
    }

    /// The beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token (`tokenizer.ggml.eos_token_id`).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn token: `tokenizer.ggml.eot_token_id`, else the first of llama.cpp's end-of-turn texts
    /// present (`<|eot_id|>`, `<|im_end|>`, `<end_of_turn>`, …).
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// Every token that ends generation, sorted, as llama.cpp determines them: EOS, EOT, EOM, the tokens it
    /// recognises by their text (`<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`, `<|eot_id|>`, `</s>`, …) and
    /// the fill-in-the-middle pad/repository/file-separator tokens.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    /// The number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The kind of vocabulary.
    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    /// The raw chat template source (`tokenizer.chat_template`).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The model's chat template, compiled, with this vocabulary's BOS/EOS texts; `Ok(None)` when the model
    /// has none, an error when it does not compile.
    pub fn chat_template(&self) -> Result<Option<crate::ChatTemplate>> {
        let Some(src) = &self.chat_template else {
            return Ok(None);
        };
        let text = |id: Option<u32>| {
            id.and_then(|i| self.token_text(i))
                .unwrap_or("")
                .to_string()
        };
        crate::ChatTemplate::new(src, &text(self.bos), &text(self.eos)).map(Some)
    }

    /// The texts of control tokens, longest first (what `parse_special` matches).
    pub(crate) fn control_texts(&self) -> impl Iterator<Item = &str> {
        self.specials
            .iter()
            .filter(|s| s.1)
            .map(|s| self.tokens[s.0 as usize].as_str())
    }
}

/// The decoded bytes of every token, concatenated, with end offsets.
fn pieces(tokens: &[String], types: &[TokenType], kind: VocabKind) -> (Vec<u8>, Vec<usize>) {
    let inv = bytelevel::char_to_byte();
    let mut bytes = Vec::with_capacity(tokens.iter().map(String::len).sum());
    let mut ends = Vec::with_capacity(tokens.len());
    for (t, ty) in tokens.iter().zip(types) {
        match (kind, ty) {
            // Control, unknown and user-defined tokens are stored as their literal text.
            (_, TokenType::Control | TokenType::Unknown | TokenType::UserDefined) => {
                bytes.extend_from_slice(t.as_bytes())
            }
            (VocabKind::Bpe(_), _) => bytelevel::decode_into(t, &inv, &mut bytes),
            (VocabKind::Spm, TokenType::Byte) => match parse_byte_token(t) {
                Some(b) => bytes.push(b),
                None => bytes.extend_from_slice(t.as_bytes()),
            },
            (VocabKind::Spm, _) => bytes.extend_from_slice(t.replace('\u{2581}', " ").as_bytes()),
        }
        ends.push(bytes.len());
    }
    (bytes, ends)
}

/// `<0xAB>` → 0xAB.
fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// HF's `clean_up_tokenization`: removes the space before punctuation and English contractions.
fn clean_up_spaces(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy byte-level BPE vocabulary: all 256 byte characters, a few merges, and control/user tokens.
    pub(crate) fn toy_bpe(pre: &str) -> GgufVocab {
        let table = bytelevel::byte_to_char();
        let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
        let mut types = vec![1; 256];
        let merges = vec![
            "h e".to_string(),
            "l l".to_string(),
            "he ll".to_string(),
            "hell o".to_string(),
        ];
        for t in ["he", "ll", "hell", "hello"] {
            tokens.push(t.to_string());
            types.push(1);
        }
        for (t, ty) in [("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4)] {
            tokens.push(t.to_string());
            types.push(ty);
        }
        GgufVocab {
            model: "gpt2".into(),
            pre: Some(pre.into()),
            tokens,
            token_types: Some(types),
            merges: Some(merges),
            eos_id: Some(261),
            ..GgufVocab::default()
        }
    }

    #[test]
    fn special_tokens_need_parse_special_but_user_tokens_do_not() {
        let t = Tokenizer::from_vocab(toy_bpe("qwen2")).unwrap();
        let plain = t.encode("<|im_start|>hello<think>", false, false).unwrap();
        assert!(
            !plain.contains(&260),
            "control token from plain text: {plain:?}"
        );
        assert!(
            plain.contains(&262),
            "user-defined token must always match: {plain:?}"
        );
        assert!(
            plain.contains(&259),
            "'hello' merges to one token: {plain:?}"
        );
        let parsed = t.encode("<|im_start|>hello<think>", false, true).unwrap();
        assert_eq!(parsed, vec![260, 259, 262]);
        assert_eq!(t.decode(&parsed, true).unwrap(), "hello<think>");
        assert_eq!(
            t.decode(&parsed, false).unwrap(),
            "<|im_start|>hello<think>"
        );
        assert_eq!(t.decode(&plain, false).unwrap(), "<|im_start|>hello<think>");
    }

    #[test]
    fn unknown_model_and_pre_are_errors_naming_the_value() {
        let mut v = toy_bpe("qwen2");
        v.pre = Some("martian".into());
        let e = Tokenizer::from_vocab(v).unwrap_err().to_string();
        assert!(e.contains("'martian'"), "{e}");
        let mut v = toy_bpe("qwen2");
        v.model = "wordpiece9".into();
        let e = Tokenizer::from_vocab(v).unwrap_err().to_string();
        assert!(e.contains("'wordpiece9'"), "{e}");
    }

    #[test]
    fn bad_ids_and_lengths_are_errors() {
        let mut v = toy_bpe("qwen2");
        v.bos_id = Some(100_000);
        assert!(matches!(
            Tokenizer::from_vocab(v),
            Err(Error::BadTokenId { .. })
        ));
        let mut v = toy_bpe("qwen2");
        v.token_types.as_mut().unwrap().pop();
        assert!(matches!(
            Tokenizer::from_vocab(v),
            Err(Error::LengthMismatch { .. })
        ));
        let t = Tokenizer::from_vocab(toy_bpe("qwen2")).unwrap();
        assert!(matches!(
            t.decode(&[9999], false),
            Err(Error::UnknownId { id: 9999, .. })
        ));
    }

    #[test]
    fn eog_includes_eos_and_end_of_turn_texts() {
        let t = Tokenizer::from_vocab(toy_bpe("qwen2")).unwrap();
        assert_eq!(t.eos_id(), Some(261));
        assert_eq!(t.eot_id(), Some(261));
        assert_eq!(t.eos_ids(), &[261]);
        assert!(t.is_eog(261) && !t.is_eog(260));
    }

    #[test]
    fn every_pre_tokenizer_family_builds_and_round_trips() {
        let text = "It's 2024: 12345 apples,\n\n  ok?  ";
        for pre in [
            None,
            Some("default"),
            Some("gpt2"),
            Some("gpt-2"),
            Some("llama-bpe"),
            Some("qwen2"),
            Some("smollm"),
        ] {
            let mut v = toy_bpe("qwen2");
            v.pre = pre.map(String::from);
            let t = Tokenizer::from_vocab(v).unwrap_or_else(|e| panic!("{pre:?}: {e}"));
            let ids = t.encode(text, false, false).unwrap();
            assert_eq!(
                t.decode(&ids, false).unwrap().replace(" ?", "?"),
                text.replace(" ?", "?"),
                "{pre:?}"
            );
        }
        // Llama 3 family adds BOS by default; the others do not.
        let mut v = toy_bpe("llama-bpe");
        v.bos_id = Some(260);
        assert!(Tokenizer::from_vocab(v).unwrap().add_bos());
        let mut v = toy_bpe("qwen2");
        v.bos_id = Some(260);
        assert!(!Tokenizer::from_vocab(v).unwrap().add_bos());
    }

    #[test]
    fn spm_space_prefix_applies_at_the_start_and_after_special_tokens() {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "\u{2581}", "a", "\u{2581}a", "<x>"]
            .map(String::from)
            .to_vec();
        let mut types = vec![2, 3, 3, 1, 1, 1, 4];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        let scores = vec![0.0; tokens.len()];
        let v = GgufVocab {
            model: "llama".into(),
            tokens,
            token_types: Some(types),
            scores: Some(scores),
            ..GgufVocab::default()
        };
        let t = Tokenizer::from_vocab(v.clone()).unwrap();
        // " a" at the start and after the user-defined <x>; "a" right after ordinary text.
        assert_eq!(t.encode("a<x>a", true, false).unwrap(), vec![1, 5, 6, 5]);
        assert_eq!(t.decode(&[1, 5, 6, 5], true).unwrap(), "a<x> a");
        let mut v2 = v;
        v2.add_space_prefix = Some(false);
        v2.add_bos = Some(false);
        let t2 = Tokenizer::from_vocab(v2).unwrap();
        assert_eq!(t2.encode("a a", true, false).unwrap(), vec![4, 5]);
        assert_eq!(t2.decode(&[4, 5], true).unwrap(), "a a");
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xff>"), Some(255));
        assert_eq!(parse_byte_token("<0x0A"), None);
        assert_eq!(parse_byte_token("<0x123>"), None);
    }

    #[test]
    fn clean_up_matches_hf() {
        assert_eq!(
            clean_up_spaces("Hi , you ! I 'm here ."),
            "Hi, you! I'm here."
        );
    }
}
