//! `kiln score`: perplexity of a text in llama-perplexity's windows, top-K logit dumps, and comparison against a
//! reference dump (KL, top-1 agreement, Δp). The computation lives in `kiln_engine::bench`; this module reads
//! the inputs, shows progress and prints.

use crate::commands::bench::Device;
use anyhow::{bail, Context, Result};
use kiln_engine::bench::{
    json_num, json_str, score, Comparison, ScoreOptions, ScoreResult, ScoreSeq, WindowPlan,
};
use kiln_engine::fidelity::LogitDump;
use kiln_engine::{Flags, KvType, LoadOptions, Model, Session, SessionConfig};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The dump's file name inside `--dump-logits` / `--ref-logits` directories.
pub const DUMP_FILE: &str = "topk.kdump";

/// Arguments of `kiln score`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF model.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// The text to score (with --teacher-forced: token ids, one sequence per line).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Window size in tokens (llama-perplexity's -c).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many windows.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
    /// Rows per forward pass (default: 512 on CUDA, 64 on the CPU).
    #[arg(short = 'b', long = "batch")]
    pub batch: Option<usize>,
    /// KV cache element type (f16 or f32).
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvType,
    /// Device to run on.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Write the top-K logits and log-sum-exp of every scored position to DIR/topk.kdump.
    #[arg(long, value_name = "DIR")]
    pub dump_logits: Option<PathBuf>,
    /// Entries per position in --dump-logits.
    #[arg(long, default_value_t = 64)]
    pub top_k: usize,
    /// Compare against the dump in DIR (written by --dump-logits on the same text and settings).
    #[arg(long, value_name = "DIR")]
    pub ref_logits: Option<PathBuf>,
    /// Score fixed token sequences (the file holds ids, one sequence per line), each from an empty cache, every
    /// position after the first scored.
    #[arg(long)]
    pub teacher_forced: bool,
    /// Print a JSON summary on stdout (the human-readable report goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// Parses a token-id file: one sequence per line, ids separated by spaces or commas; blank lines skipped.
pub fn parse_token_file(text: &str) -> Result<Vec<Vec<u32>>> {
    let mut seqs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let ids = line
            .split([' ', ',', '\t'])
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u32>())
            .collect::<std::result::Result<Vec<u32>, _>>()
            .with_context(|| format!("line {}: not a list of token ids", i + 1))?;
        if ids.len() == 1 {
            bail!("line {}: one token has nothing to predict", i + 1);
        }
        if !ids.is_empty() {
            seqs.push(ids);
        }
    }
    if seqs.is_empty() {
        bail!("no token sequences in the file");
    }
    Ok(seqs)
}

pub fn run(args: Args) -> Result<()> {
    args.device.check()?;
    let (flags, warnings) = Flags::from_env();
    for w in warnings {
        eprintln!("kiln: warning: {w}");
    }
    let mut model = Model::load(
        &args.model,
        LoadOptions {
            threads: args.threads,
            flags,
            progress: None,
        },
    )
    .with_context(|| format!("loading {}", args.model.display()))?;
    args.device.attach(&mut model)?;
    let model_name = args
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();

    let mut report = String::new();
    let (seqs, n_ctx, mode, first, n_text_tokens) = if args.teacher_forced {
        let text =
            std::fs::read_to_string(&args.file).with_context(|| args.file.display().to_string())?;
        let seqs = parse_token_file(&text).with_context(|| args.file.display().to_string())?;
        let n_ctx = seqs.iter().map(Vec::len).max().unwrap_or(1);
        let total: usize = seqs.iter().map(Vec::len).sum();
        report += &format!(
            "teacher-forced: {} sequences ({total} tokens) from {}, each from an empty cache; every next token scored\n",
            seqs.len(),
            args.file.display()
        );
        let seqs: Vec<ScoreSeq> = seqs
            .into_iter()
            .map(|tokens| ScoreSeq { tokens, first: 0 })
            .collect();
        (seqs, n_ctx, "teacher-forced", 0, total)
    } else {
        let text =
            std::fs::read_to_string(&args.file).with_context(|| args.file.display().to_string())?;
        let tok = kiln_tokenizer::Tokenizer::from_gguf(model.gguf())
            .context("building the model's tokenizer")?;
        let tokens = tok.encode(&text, true, false)?;
        let bos = if tok.add_bos() { tok.bos_id() } else { None };
        let plan = WindowPlan::new(tokens.len(), args.ctx, args.chunks)?;
        report += &format!(
            "{}: {} bytes, {} tokens ({}BOS added by the tokenizer)\n",
            args.file.display(),
            text.len(),
            tokens.len(),
            if bos.is_some() { "" } else { "no " }
        );
        report += &format!(
            "method (llama-perplexity's): {}\n",
            plan.describe(bos.is_some())
        );
        let seqs: Vec<ScoreSeq> = (0..plan.n_windows)
            .map(|i| ScoreSeq {
                tokens: plan.window(&tokens, i, bos),
                first: plan.first,
            })
            .collect();
        (seqs, plan.n_ctx, "windows", plan.first, tokens.len())
    };
    eprint!("{report}");

    let reference = match &args.ref_logits {
        Some(dir) => {
            let p = dir.join(DUMP_FILE);
            let d = LogitDump::read(&p)
                .with_context(|| format!("reading the reference {}", p.display()))?;
            check_meta(&d.meta, mode, n_ctx, first).with_context(|| p.display().to_string())?;
            Some(d)
        }
        None => None,
    };

    let mut session = Session::new(
        &model,
        SessionConfig {
            n_ctx,
            n_slots: 1,
            batch: args.batch.unwrap_or(args.device.default_batch()),
            kv_type: args.kv_type,
        },
    )?;
    let bar = indicatif::ProgressBar::new(seqs.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} windows, {msg} (ETA {eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut progress = |_done: usize, _total: usize, nll: &kiln_engine::bench::NllSum| {
        bar.inc(1);
        bar.set_message(format!("PPL {:.4}", nll.ppl()));
    };
    let res = score(
        &mut session,
        &seqs,
        ScoreOptions {
            dump_k: args.dump_logits.as_ref().map(|_| args.top_k),
            reference: reference.as_ref(),
            progress: Some(&mut progress),
        },
    )?;
    bar.finish_and_clear();

    if let Some(dir) = &args.dump_logits {
        write_dump(dir, &res, &model_name, mode, n_ctx, first, args.top_k)?;
    }

    let summary = human_summary(
        &res,
        args.ref_logits.as_deref(),
        args.top_k_of(reference.as_ref()),
    );
    if args.json {
        eprint!("{summary}");
        println!("{}", json_summary(&res, n_text_tokens, n_ctx, seqs.len()));
    } else {
        print!("{summary}");
        std::io::stdout().flush()?;
    }
    Ok(())
}

impl Args {
    fn top_k_of(&self, d: Option<&LogitDump>) -> usize {
        d.map_or(self.top_k, |d| d.k)
    }
}

fn meta_json(model: &str, mode: &str, n_ctx: usize, first: usize, k: usize) -> String {
    format!(
        "{{\"producer\": \"kiln score\", \"model\": {}, \"mode\": {}, \"n_ctx\": {n_ctx}, \"first\": {first}, \"k\": {k}}}",
        json_str(model),
        json_str(mode)
    )
}

/// Refuses a reference produced with another mode or window geometry (its tokens would not line up).
fn check_meta(meta: &str, mode: &str, n_ctx: usize, first: usize) -> Result<()> {
    let m: serde_json::Value =
        serde_json::from_str(meta).context("the dump's metadata is not JSON")?;
    let got_mode = m.get("mode").and_then(|v| v.as_str()).unwrap_or("?");
    if got_mode != mode {
        bail!("the reference was scored in {got_mode} mode, this run in {mode} mode");
    }
    if mode == "windows" {
        let ctx = m.get("n_ctx").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        let f = m.get("first").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        if (ctx, f) != (n_ctx, first) {
            bail!(
                "the reference used -c {ctx} (first scored position {f}); this run uses -c {n_ctx}"
            );
        }
    }
    Ok(())
}

fn write_dump(
    dir: &Path,
    res: &ScoreResult,
    model: &str,
    mode: &str,
    n_ctx: usize,
    first: usize,
    k: usize,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let dump = LogitDump {
        meta: meta_json(model, mode, n_ctx, first, k),
        k,
        texts: res.dump.clone(),
        greedy: Vec::new(),
    };
    let p = dir.join(DUMP_FILE);
    std::fs::write(&p, dump.to_bytes()?).with_context(|| p.display().to_string())?;
    eprintln!(
        "wrote {} ({} sequences, top-{k})",
        p.display(),
        dump.texts.len()
    );
    Ok(())
}

fn human_summary(res: &ScoreResult, ref_dir: Option<&Path>, k: usize) -> String {
    let mut s = format!(
        "Final estimate: PPL = {:.4} +/- {:.5}  ({} tokens scored)\n",
        res.nll.ppl(),
        res.nll.ppl_err(),
        res.nll.count
    );
    if let (Some(c), Some(dir)) = (&res.comparison, ref_dir) {
        s += &comparison_text(c, dir, k);
    }
    s
}

fn comparison_text(c: &Comparison, dir: &Path, k: usize) -> String {
    let kl = c.kl_stats();
    let dp = c.dp_stats();
    let f = &c.fidelity;
    format!(
        "vs reference {} (KL over its top-{k} + rest):\n\
         KL divergence: mean {:.6}, median {:.6}, max {:.6}\n\
         Same top p: {:.3} % ({}/{}); where the reference's top-1 margin ≥ 0.1: {:.3} % ({}/{})\n\
         Δp (next token in the reference's top-{k}, {} of {} positions): mean {:+.5} %, RMS {:.5} %, min {:+.5} %, max {:+.5} %\n\
         max |Δlogit| over the reference's top-{k}: {:.5}\n",
        dir.display(),
        kl.mean,
        kl.median,
        kl.max,
        100.0 * f.top1_rate(),
        f.top1_agree,
        f.positions,
        100.0 * f.confident_top1_rate(),
        f.confident_top1_agree,
        f.confident,
        c.dp.len(),
        f.positions,
        100.0 * dp.mean,
        100.0 * c.dp_rms(),
        100.0 * dp.min,
        100.0 * dp.max,
        f.max_abs_dlogit
    )
}

fn json_summary(res: &ScoreResult, n_text_tokens: usize, n_ctx: usize, n_seqs: usize) -> String {
    let mut fields = vec![
        format!("\"ppl\": {}", json_num(res.nll.ppl())),
        format!("\"ppl_err\": {}", json_num(res.nll.ppl_err())),
        format!("\"n_tokens\": {}", res.nll.count),
        format!("\"n_text_tokens\": {n_text_tokens}"),
        format!("\"n_ctx\": {n_ctx}"),
        format!("\"n_windows\": {n_seqs}"),
    ];
    if let Some(c) = &res.comparison {
        let kl = c.kl_stats();
        let dp = c.dp_stats();
        fields.extend([
            format!("\"kl_mean\": {}", json_num(kl.mean)),
            format!("\"kl_median\": {}", json_num(kl.median)),
            format!("\"kl_max\": {}", json_num(kl.max)),
            format!("\"top1\": {}", json_num(c.fidelity.top1_rate())),
            format!(
                "\"top1_confident\": {}",
                json_num(c.fidelity.confident_top1_rate())
            ),
            format!("\"dp_mean\": {}", json_num(dp.mean)),
            format!("\"dp_rms\": {}", json_num(c.dp_rms())),
            format!("\"dp_n\": {}", c.dp.len()),
            format!(
                "\"max_abs_dlogit\": {}",
                json_num(c.fidelity.max_abs_dlogit as f64)
            ),
        ]);
    }
    format!("{{{}}}", fields.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files() {
        assert_eq!(
            parse_token_file("1 2 3\n\n4,5\t6\n").unwrap(),
            vec![vec![1, 2, 3], vec![4, 5, 6]]
        );
        assert!(parse_token_file("1 x\n").is_err());
        assert!(parse_token_file("7\n").is_err());
        assert!(parse_token_file("\n\n").is_err());
    }

    #[test]
    fn meta_is_checked() {
        let m = meta_json("m.gguf", "windows", 512, 256, 64);
        assert!(check_meta(&m, "windows", 512, 256).is_ok());
        assert!(check_meta(&m, "windows", 256, 128).is_err());
        assert!(check_meta(&m, "teacher-forced", 512, 0).is_err());
        assert!(check_meta("not json", "windows", 512, 256).is_err());
    }
}
