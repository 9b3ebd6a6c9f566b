//! `kiln`: run GGUF language models. The binary is thin: it parses flags, calls the library crates and prints.
//! Errors print as one line (`kiln: error: …` with its causes) and exit non-zero.

use clap::{Parser, Subcommand};

mod commands;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Run GGUF language models fast and exactly"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (only the text goes to stdout; speeds and diagnostics to stderr).
    Run(commands::run::Args),
    /// Chat interactively with the model's chat template (Ctrl-C stops a reply, Ctrl-D exits).
    Chat(commands::chat::Args),
    /// Print a GGUF file's architecture, hyperparameters, tokenizer and quantization mix.
    Info(commands::info::Args),
    /// Tokenize text with a model's tokenizer and print ids and pieces.
    Tokenize(commands::tokenize::Args),
    /// Convert a DFlash drafter directory (config.json + model.safetensors) into one GGUF, optionally quantized.
    ConvertDraft(commands::convert_draft::Args),
    /// Write a GGUF with random weights, real shapes and real tokenizer metadata (deterministic by seed).
    Synth(commands::synth::Args),
    /// Measure prompt and generation speed (llama-bench's tests, ds4-bench's frontiers, A/B of kill switches).
    Bench(commands::bench::Args),
    /// Perplexity of a text (llama-perplexity's method), logit dumps and comparison against a reference dump.
    Score(commands::score::Args),
    /// Serve the model over an OpenAI-compatible HTTP API with continuous batching.
    Serve(commands::serve::Args),
    /// Run the device kernels against host references (`--device cuda[:N]`).
    Selftest(commands::selftest::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Info(args) => commands::info::run(args),
        Command::Tokenize(args) => commands::tokenize::run(args),
        Command::Synth(args) => commands::synth::run(args),
        Command::ConvertDraft(args) => commands::convert_draft::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Score(args) => commands::score::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Selftest(args) => commands::selftest::run(args),
    };
    if let Err(e) = result {
        // A closed stdout (`kiln … | head`) is not an error worth reporting.
        if e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        }) {
            std::process::exit(0);
        }
        eprintln!("kiln: error: {}", error_chain(&e));
        std::process::exit(1);
    }
}

/// The error and its causes joined by ": ", leaving out a cause whose text the message before it already ends
/// with (an error that shows its source in its own text, e.g. a GGUF error wrapped by the engine's).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.ends_with(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}
