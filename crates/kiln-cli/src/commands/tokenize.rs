//! `kiln tokenize -m MODEL TEXT`.

use anyhow::Context;
use kiln_gguf::GgufFile;
use kiln_tokenizer::Tokenizer;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `kiln tokenize`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model whose tokenizer to use.
    #[arg(short, long)]
    pub model: PathBuf,
    /// Print `{"ids": [...]}` only.
    #[arg(long)]
    pub json: bool,
    /// Parse control-token text (`<|im_start|>`) in TEXT as the control tokens; by default it is plain text.
    #[arg(long)]
    pub special: bool,
    /// The text to tokenize.
    pub text: String,
}

/// Tokenizes the text as the model's own tokenizer would for a prompt: BOS/EOS only where the model's
/// metadata asks for them. Prints one `id 'piece'` line per token, or `{"ids": [...]}` with `--json`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let file =
        GgufFile::open(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    let tok = Tokenizer::from_gguf(&file)
        .with_context(|| format!("tokenizer of {}", args.model.display()))?;
    let ids = tok.encode(&args.text, true, args.special)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "{{\"ids\": [{}]}}", list.join(", "))?;
    } else {
        for &id in &ids {
            writeln!(out, "{id:>7} {:?}", tok.token_piece(id)?)?;
        }
    }
    out.flush()?;
    Ok(())
}
