//! `kiln tokenize -m MODEL TEXT`, or `--lines FILE` for a file of texts.

use anyhow::Context;
use kiln_gguf::GgufFile;
use kiln_tokenizer::Tokenizer;
use std::io::{BufRead, Write};
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
    /// Tokenize each line of FILE (`-`: standard input) on its own, printing one `{"ids": [...]}` line per
    /// input line (a dataset's prompts in one run rather than a process each).
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    pub lines: Option<PathBuf>,
    /// The text to tokenize.
    #[arg(required_unless_present = "lines")]
    pub text: Option<String>,
}

/// Tokenizes the text as the model's own tokenizer would for a prompt: BOS/EOS only where the model's
/// metadata asks for them. Prints one `id 'piece'` line per token, or `{"ids": [...]}` with `--json`; with
/// `--lines`, one `{"ids": [...]}` line per line of the file.
pub fn run(args: Args) -> anyhow::Result<()> {
    let file =
        GgufFile::open(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    let tok = Tokenizer::from_gguf(&file)
        .with_context(|| format!("tokenizer of {}", args.model.display()))?;
    let mut out = std::io::stdout().lock();
    let json_ids = |ids: &[u32]| {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        format!("{{\"ids\": [{}]}}", list.join(", "))
    };
    if let Some(path) = &args.lines {
        let input: Box<dyn BufRead> = if path.as_os_str() == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            let f =
                std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
            Box::new(std::io::BufReader::new(f))
        };
        for (i, line) in input.lines().enumerate() {
            let line =
                line.with_context(|| format!("reading line {} of {}", i + 1, path.display()))?;
            let ids = tok.encode(&line, true, args.special)?;
            writeln!(out, "{}", json_ids(&ids))?;
        }
        out.flush()?;
        return Ok(());
    }
    let text = args.text.as_deref().unwrap_or_default();
    let ids = tok.encode(text, true, args.special)?;
    if args.json {
        writeln!(out, "{}", json_ids(&ids))?;
    } else {
        for &id in &ids {
            writeln!(out, "{id:>7} {:?}", tok.token_piece(id)?)?;
        }
    }
    out.flush()?;
    Ok(())
}
