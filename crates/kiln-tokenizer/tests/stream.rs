//! StreamDecoder on real vocabularies: characters split across tokens (byte-level BPE pieces, `<0xXX>` byte
//! fallback) are never emitted in halves, and the streamed text equals the one-shot decode.

mod common;

use kiln_tokenizer::{StreamDecoder, Tokenizer};

/// Streams `text`'s ids and checks every chunk is whole UTF-8 that extends the text; returns how many tokens
/// ended in the middle of a character (so the test can insist the case was exercised).
fn stream(tok: &Tokenizer, text: &str) -> usize {
    let ids = tok.encode(text, false, false).unwrap();
    let mut dec = StreamDecoder::new(true);
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        let chunk = dec.push(tok, id).unwrap();
        assert!(
            !chunk.contains('\u{FFFD}'),
            "broken character emitted for {text:?}: {chunk:?}"
        );
        out.push_str(&chunk);
        assert!(
            text.starts_with(&out),
            "{out:?} is not a prefix of {text:?}"
        );
        held += usize::from(dec.has_pending());
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text);
    assert_eq!(out, tok.decode(&ids, true).unwrap());
    held
}

const SPLIT_PRONE: &[&str] = &[
    "Family: 👨‍👩‍👧‍👦 and 🏳️‍🌈 flags 🇺🇸",
    "🦀🦀🦀 crabs",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙",
    "龘靐齉 rare CJK 𠀀𠀁",
    "こんにちは世界、ありがとう",
    "ḁ̴̢͓ combining marks",
];

#[test]
fn byte_level_bpe_streams_whole_characters() {
    let tok = common::smollm2();
    let held: usize = SPLIT_PRONE.iter().map(|t| stream(&tok, t)).sum();
    assert!(
        held > 0,
        "no character was split across tokens: the test exercised nothing"
    );
}

#[test]
fn byte_fallback_streams_whole_characters() {
    let tok = common::gemma3();
    let held: usize = SPLIT_PRONE.iter().map(|t| stream(&tok, t)).sum();
    assert!(
        held > 0,
        "no character fell back to bytes: the test exercised nothing"
    );
}

#[test]
fn qwen3_streams_whole_characters() {
    let tok = common::qwen3();
    let held: usize = SPLIT_PRONE.iter().map(|t| stream(&tok, t)).sum();
    assert!(held > 0);
}

#[test]
fn invalid_byte_sequences_become_replacement_characters() {
    let tok = common::gemma3();
    let b = |x: u8| tok.token_id(&format!("<0x{x:02X}>")).unwrap();
    // A lone continuation byte, then an emoji's first two bytes cut off by a plain token, then a full "é".
    let ids = [
        b(0x80),
        b(0xF0),
        b(0x9F),
        tok.token_id("a").unwrap(),
        b(0xC3),
        b(0xA9),
    ];
    let mut dec = StreamDecoder::new(true);
    let mut out = String::new();
    for id in ids {
        out += &dec.push(&tok, id).unwrap();
    }
    out += &dec.finish();
    assert_eq!(out, "\u{FFFD}\u{FFFD}aé");
    assert_eq!(out, tok.decode(&ids, true).unwrap());
}
