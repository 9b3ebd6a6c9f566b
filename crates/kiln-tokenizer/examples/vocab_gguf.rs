//! Writes a vocabulary-only GGUF from a Hugging Face tokenizer.json + tokenizer_config.json, converted with
//! `gguf_metadata_from_tokenizer_json`, so other tools (llama.cpp's `llama-tokenize`) can check the conversion.
//!
//! `cargo run -p kiln-tokenizer --example vocab_gguf -- tokenizer.json tokenizer_config.json out.gguf [arch]`

use kiln_gguf::GgufWriter;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [tj, tc, out, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: vocab_gguf tokenizer.json tokenizer_config.json out.gguf [arch]".into(),
        );
    };
    let arch = rest.first().map_or("qwen3", String::as_str);
    let md = kiln_tokenizer::gguf_metadata_from_tokenizer_json(tj, tc)?;
    let mut w = GgufWriter::new();
    w.add("general.architecture", arch)?;
    // Loaders read these hyperparameters even for a vocabulary-only load; the values are placeholders.
    for (k, v) in [
        ("context_length", 4096u32),
        ("embedding_length", 64),
        ("block_count", 1),
        ("feed_forward_length", 128),
        ("attention.head_count", 1),
        ("attention.head_count_kv", 1),
        ("attention.key_length", 64),
        ("attention.value_length", 64),
    ] {
        w.add(&format!("{arch}.{k}"), v)?;
    }
    w.add(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-6f32)?;
    w.add(&format!("{arch}.rope.freq_base"), 1e6f32)?;
    for (k, v) in md {
        w.add(&k, v)?;
    }
    let file = std::io::BufWriter::new(std::fs::File::create(out)?);
    w.begin(file)?.finish()?;
    Ok(())
}
