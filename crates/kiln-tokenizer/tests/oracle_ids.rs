//! Token ids against independent oracles (fixtures from tools/gen_tokenizer_fixtures.py):
//! Qwen3 = HF tokenizers on the real tokenizer.json (kiln goes through a converted GGUF), SmolLM2 = transformers'
//! GGUF conversion, Gemma 3 = HF tokenizers on the real tokenizer.json (kiln reads the GGUF).

mod common;

use common::{fixture, ids_of};
use kiln_tokenizer::Tokenizer;

/// Every corpus string: plain ids equal the oracle's, and decoding gives the string back.
fn check(tok: &Tokenizer, name: &str) {
    let fx = fixture(name);
    let corpus = fixture("corpus.json");
    let plain = fx["plain"].as_array().expect("plain");
    assert_eq!(
        plain.len(),
        corpus.as_array().expect("corpus").len(),
        "{name}: fixture out of date"
    );
    let mut failures = Vec::new();
    for case in plain {
        let text = case["text"].as_str().expect("text");
        let want = ids_of(&case["ids"]);
        let got = tok.encode(text, false, false).expect("encode");
        if got != want {
            failures.push(format!("{text:?}\n  kiln   {got:?}\n  oracle {want:?}"));
            continue;
        }
        let back = tok.decode(&got, false).expect("decode");
        if back != text {
            failures.push(format!("{text:?}: round trip gave {back:?}"));
        }
    }
    for case in fx["special"].as_array().expect("special") {
        let text = case["text"].as_str().expect("text");
        let want = ids_of(&case["ids"]);
        let got = tok.encode(text, false, true).expect("encode");
        if got != want {
            failures.push(format!(
                "parse_special {text:?}\n  kiln   {got:?}\n  oracle {want:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen3_ids_match_hf_tokenizers() {
    let tok = common::qwen3();
    check(&tok, "ids_qwen3.json");
    // Qwen: no BOS added, EOS is <|im_end|>, and <|endoftext|> also ends generation.
    assert!(!tok.add_bos());
    assert_eq!(
        tok.encode("hi", true, false).unwrap(),
        tok.encode("hi", false, false).unwrap()
    );
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let eot = tok.token_id("<|endoftext|>").unwrap();
    assert_eq!(tok.eos_id(), Some(im_end));
    assert!(tok.eos_ids().contains(&im_end) && tok.eos_ids().contains(&eot));
    assert_eq!(tok.vocab_size(), 151_669);
}

#[test]
fn smollm2_ids_match_transformers_gguf_conversion() {
    let tok = common::smollm2();
    check(&tok, "ids_smollm2.json");
    assert!(!tok.add_bos(), "SmolLM2's GGUF says add_bos_token = false");
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    // <|endoftext|>, <|im_end|>, and <reponame> (a FIM repository marker, which llama.cpp also stops on).
    assert_eq!(tok.eos_ids(), &[0, 2, 4]);
}

#[test]
fn gemma3_ids_match_hf_tokenizers() {
    let tok = common::gemma3();
    check(&tok, "ids_gemma3.json");
    // Gemma's GGUF asks for BOS (id 2); <end_of_turn> ends generation besides <eos>.
    assert!(tok.add_bos());
    let ids = tok.encode("Hello", true, false).unwrap();
    assert_eq!(ids[0], 2);
    assert_eq!(
        &ids[1..],
        tok.encode("Hello", false, false).unwrap().as_slice()
    );
    assert_eq!(tok.decode(&ids, true).unwrap(), "Hello");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<bos>Hello");
    let eot = tok.token_id("<end_of_turn>").unwrap();
    assert!(tok.is_eog(eot) && tok.is_eog(1));
}

#[test]
fn control_text_is_plain_text_unless_parse_special() {
    for (tok, marker) in [
        (common::smollm2(), "<|im_start|>"),
        (common::qwen3(), "<|im_start|>"),
        (common::gemma3(), "<start_of_turn>"),
    ] {
        let id = tok.token_id(marker).unwrap();
        let text = format!("a {marker} b");
        assert!(
            !tok.encode(&text, false, false).unwrap().contains(&id),
            "{marker} produced from plain text"
        );
        assert!(
            tok.encode(&text, false, true).unwrap().contains(&id),
            "{marker} not parsed with parse_special"
        );
    }
}

#[test]
fn qwen3_vocab_pads_to_the_models_embedding_rows() {
    let dir = common::assets().join("tokenizer-qwen3");
    let v = kiln_tokenizer::vocab_from_tokenizer_json(
        dir.join("tokenizer.json"),
        dir.join("tokenizer_config.json"),
        Some(151_936),
    )
    .unwrap();
    assert_eq!(v.tokens.len(), 151_936);
    assert_eq!(v.tokens[151_935], "[PAD151935]");
    assert_eq!(v.token_type(151_935), kiln_tokenizer::TokenType::Unused);
    // Converted like llama.cpp: added special tokens are control, <think> user-defined, pre = qwen2.
    assert_eq!(v.pre.as_deref(), Some("qwen2"));
    assert_eq!(v.token_type(151_644), kiln_tokenizer::TokenType::Control); // <|im_start|>
    assert_eq!(
        v.token_type(151_667),
        kiln_tokenizer::TokenType::UserDefined
    ); // <think>
    assert_eq!(
        (v.bos_id, v.eos_id, v.pad_id),
        (Some(151_643), Some(151_645), Some(151_643))
    );
    assert_eq!(v.add_bos, Some(false));
    assert!(v
        .chat_template
        .as_deref()
        .is_some_and(|t| t.contains("enable_thinking")));
    let tok = Tokenizer::from_vocab(v).unwrap();
    assert_eq!(tok.vocab_size(), 151_936);
    let unpadded = common::qwen3();
    let text = "Padding must not change ids: 你好 🎉 <think>";
    assert_eq!(
        tok.encode(text, true, false).unwrap(),
        unpadded.encode(text, true, false).unwrap()
    );
}

#[test]
fn tokenizer_and_template_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
    send_sync::<kiln_tokenizer::ChatTemplate>();
    send_sync::<kiln_tokenizer::StreamDecoder>();
}
