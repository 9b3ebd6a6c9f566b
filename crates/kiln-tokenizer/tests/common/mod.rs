//! Shared helpers: test assets, fixtures, and loading the three tokenizers under test.
#![allow(dead_code)]

use kiln_gguf::{GgufFile, GgufWriter};
use kiln_tokenizer::Tokenizer;
use std::path::PathBuf;

pub fn assets() -> PathBuf {
    let dir = std::env::var_os("KILN_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.test-assets"))
        });
    assert!(
        dir.join("SmolLM2-135M-Instruct.Q4_1.gguf").exists(),
        "test assets missing in {}: run tools/fetch-test-assets.sh",
        dir.display()
    );
    dir
}

pub fn fixture(name: &str) -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/").to_string() + name;
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn smollm2() -> Tokenizer {
    let f = GgufFile::open(assets().join("SmolLM2-135M-Instruct.Q4_1.gguf")).expect("open SmolLM2");
    Tokenizer::from_gguf(&f).expect("SmolLM2 tokenizer")
}

pub fn gemma3() -> Tokenizer {
    let f = GgufFile::open(assets().join("gemma-3-270m-q4_k_m.gguf")).expect("open Gemma 3");
    Tokenizer::from_gguf(&f).expect("Gemma 3 tokenizer")
}

/// Qwen3's tokenizer the way a converted GGUF carries it: tokenizer.json → GGUF metadata → a GGUF file written
/// with kiln-gguf's writer → read back.
pub fn qwen3() -> Tokenizer {
    let dir = assets().join("tokenizer-qwen3");
    let md = kiln_tokenizer::gguf_metadata_from_tokenizer_json(
        dir.join("tokenizer.json"),
        dir.join("tokenizer_config.json"),
    )
    .expect("convert Qwen3 tokenizer.json");
    let mut w = GgufWriter::new();
    w.add("general.architecture", "qwen3").expect("add arch");
    for (k, v) in md {
        w.add(&k, v).expect("add key");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("qwen3-vocab.gguf");
    let file = std::fs::File::create(&path).expect("create");
    w.begin(std::io::BufWriter::new(file))
        .expect("begin")
        .finish()
        .expect("finish");
    let f = GgufFile::open(&path).expect("open written GGUF");
    Tokenizer::from_gguf(&f).expect("Qwen3 tokenizer")
}
