//! `kiln tokenize -m MODEL TEXT`.

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
    /// The text to tokenize.
    pub text: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::bail!("kiln tokenize is not built yet ({})", args.model.display())
}
