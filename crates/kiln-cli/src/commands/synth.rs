//! `kiln synth --arch ARCH --preset NAME --quant TYPE [--tokenizer tokenizer.json] [--seed S] -o FILE`, and
//! `kiln synth --arch dflash --target T.gguf [--draft-layers 5] [--block 16] --quant bf16|q8_0|… -o OUT`: a
//! random-weight DFlash drafter of the target's shape (bf16: a z-lab directory; other types: a converted GGUF).

use std::path::PathBuf;

use anyhow::Context;
use kiln_engine::synth::{self, Arch, QuantScheme, SynthError, SynthSpec, TokenizerSource};

/// Arguments of `kiln synth`.
#[derive(clap::Args)]
pub struct Args {
    /// Architecture: qwen3, qwen3moe, llama, or dflash (a drafter for --target).
    #[arg(long)]
    pub arch: String,
    /// Shape preset: qwen3 0.6b | 8b | tiny; qwen3moe 30b-a3b | tiny; llama smollm2-135m | tiny.
    #[arg(long, required_unless_present = "target")]
    pub preset: Option<String>,
    /// --arch dflash: the target model whose shape the drafter takes (hidden size, FFN, heads, vocabulary).
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// --arch dflash: drafter layers (z-lab's Qwen3-8B drafter has 5).
    #[arg(long, default_value_t = 5)]
    pub draft_layers: usize,
    /// --arch dflash: block size.
    #[arg(long, default_value_t = 16)]
    pub block: usize,
    /// --arch dflash: mask token id (default: the target's last vocabulary entry).
    #[arg(long)]
    pub mask_id: Option<u32>,
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
    if args.arch.eq_ignore_ascii_case("dflash") {
        return draft(&args);
    }
    let arch = Arch::from_name(&args.arch)?;
    let name = args
        .preset
        .as_deref()
        .context("--preset is required (or --arch dflash --target T.gguf)")?;
    let preset = synth::find_preset(arch, name)?.clone();
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

/// `--arch dflash`: a random drafter of the target's shape.
fn draft(args: &Args) -> anyhow::Result<()> {
    let target = args
        .target
        .as_ref()
        .context("--arch dflash needs --target T.gguf")?;
    let spec = kiln_engine::dflash::draft_spec_for(
        target,
        args.draft_layers,
        args.block,
        args.mask_id,
        args.seed,
    )
    .with_context(|| format!("reading the target {}", target.display()))?;
    let start = std::time::Instant::now();
    if args.quant.eq_ignore_ascii_case("bf16") {
        kiln_engine::dflash::write_random_drafter(&args.output, &spec)?;
    } else {
        let ty = kiln_quant::GgmlType::from_name(&args.quant)
            .with_context(|| format!("unknown tensor type '{}'", args.quant))?;
        let dir = args.output.with_extension("bf16-dir");
        kiln_engine::dflash::write_random_drafter(&dir, &spec)?;
        let converted = kiln_engine::dflash::convert_to_gguf(&dir, &args.output, ty);
        let _ = std::fs::remove_dir_all(&dir);
        converted?;
    }
    eprintln!(
        "kiln synth: wrote {} (DFlash drafter: {} layers, hidden {}, block {}, taps {:?}, mask {}, {}) in {:.1} s",
        args.output.display(),
        spec.n_layer,
        spec.hidden,
        spec.block_size,
        spec.target_layer_ids,
        spec.mask_token_id,
        args.quant,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
