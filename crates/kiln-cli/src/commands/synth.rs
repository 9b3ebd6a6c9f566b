//! `kiln synth --arch ARCH --preset NAME --quant TYPE [--tokenizer tokenizer.json] [--seed S] -o FILE`.

use std::path::PathBuf;

use anyhow::Context;
use kiln_engine::synth::{self, Arch, QuantScheme, SynthError, SynthSpec, TokenizerSource};

/// Arguments of `kiln synth`.
#[derive(clap::Args)]
pub struct Args {
    /// Architecture: qwen3, qwen3moe or llama.
    #[arg(long)]
    pub arch: String,
    /// Shape preset: qwen3 0.6b | 8b | tiny; qwen3moe 30b-a3b | tiny; llama smollm2-135m | tiny.
    #[arg(long)]
    pub preset: String,
    /// Tensor types: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, or q4_k_m (llama.cpp's mix).
    #[arg(long)]
    pub quant: String,
    /// A Hugging Face tokenizer.json whose vocabulary, merges and special tokens go into the file (padded to
    /// the preset's embedding rows). Without it, a built-in byte-level tokenizer is used.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The tokenizer_config.json (chat template, BOS/EOS); default: next to --tokenizer.
    #[arg(long)]
    pub tokenizer_config: Option<PathBuf>,
    /// Seed of the random weights: the same seed gives the same file.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output GGUF file.
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let arch = Arch::from_name(&args.arch)?;
    let preset = synth::find_preset(arch, &args.preset)?.clone();
    let quant =
        QuantScheme::from_name(&args.quant).ok_or(SynthError::UnknownQuant(args.quant.clone()))?;
    let tokenizer = match &args.tokenizer {
        None => TokenizerSource::Builtin,
        Some(tj) => {
            let tc = match &args.tokenizer_config {
                Some(p) => p.clone(),
                None => tj.with_file_name("tokenizer_config.json"),
            };
            let meta =
                kiln_tokenizer::gguf_metadata_from_tokenizer_json(tj, &tc).with_context(|| {
                    format!("reading tokenizer {} and {}", tj.display(), tc.display())
                })?;
            TokenizerSource::Metadata(meta)
        }
    };
    let spec = SynthSpec {
        preset,
        quant,
        seed: args.seed,
    };
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .context("progress bar template")?
        .progress_chars("=> "),
    );
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_message("synthesizing");
    let start = std::time::Instant::now();
    let size = synth::synthesize_to_file(&spec, tokenizer, &args.output, &mut |p| {
        bar.set_length(p.total_bytes);
        bar.set_position(p.done_bytes);
    })
    .with_context(|| format!("writing {}", args.output.display()))?;
    bar.finish_and_clear();
    eprintln!(
        "kiln synth: wrote {} ({} {} {}, seed {}): {:.3} GiB in {:.1} s",
        args.output.display(),
        arch.name(),
        spec.preset.name,
        quant.name(),
        spec.seed,
        size as f64 / (1u64 << 30) as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
