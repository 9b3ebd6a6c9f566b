//! `kiln bench`: prompt-processing and generation speed, in llama-bench's terms (`-p -n -d -r -t -o`), ds4-bench's
//! frontier mode (`--ctx-start/--ctx-max`), and interleaved A/B runs of a kill switch (`--ab KILN_NO_X=1`).
//! With `--draft DIR`, DFlash speculative generation is measured against plain generation in the same run
//! (`tg` tests only; `--draft-force` chooses τ on any drafter).
//! The measuring and rendering live in `kiln_engine::bench`; this module parses flags, loads models and prints.

use anyhow::{bail, Context, Result};
use kiln_engine::bench::{
    bench_tokens, frontiers, kv_bytes, prompt_tokens_needed, render_bench, render_frontiers,
    run_frontiers, run_test, test_matrix, BenchRecord, Format, FrontierLogits, FrontierOptions,
    ModelInfo, Stats,
};
use kiln_engine::dflash::DraftMax;
use kiln_engine::fidelity::{compare_position, TopK};
use kiln_engine::{Flags, KvType, LoadOptions, Model, Session, SessionConfig};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the model runs: `cpu`, or `cuda` / `cuda:N` (GPU N).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend.
    Cpu,
    /// NVIDIA GPU with this index (needs a build with the `cuda` feature).
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device '{s}' (cpu, cuda or cuda:N)")),
        }
    }
}

impl Device {
    /// Prompt rows a forward pass takes unless `-b` says otherwise: 512 on CUDA, where the prefill matmuls run
    /// on cuBLAS from 17 rows and reach full speed near 512 (synth Qwen3-8B Q4_K_M on an H200: 7.8k tok/s in
    /// passes of 64, 29.5k in passes of 512, docs/PERFORMANCE.md); 64 on the CPU, where larger passes measured
    /// within the noise (SmolLM2-135M pp128 on 2 cores) and keep the scratch small.
    pub fn default_batch(self) -> usize {
        match self {
            Device::Cpu => SessionConfig::default().batch,
            Device::Cuda(_) => 512,
        }
    }

    /// Fails for a device this binary cannot drive.
    pub fn check(self) -> Result<&'static str> {
        match self {
            Device::Cpu => Ok("CPU"),
            Device::Cuda(_) if cfg!(feature = "cuda") => Ok("CUDA"),
            Device::Cuda(_) => {
                bail!("--device cuda: this kiln binary has no CUDA backend (build with --features cuda); use --device cpu")
            }
        }
    }

    /// Moves a loaded model to this device; on the CPU, prepares its weights for the CPU kernels instead
    /// ([`Model::warm_up`]).
    pub fn attach(self, model: &mut Model) -> Result<()> {
        match self {
            Device::Cpu => {
                let spinner = indicatif::ProgressBar::new_spinner()
                    .with_message("preparing the weights for the CPU kernels");
                spinner.enable_steady_tick(std::time::Duration::from_millis(120));
                model.warm_up().context("warming up the model")?;
                spinner.finish_and_clear();
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => {
                // Weights go to the GPU once, with a progress bar (hidden when stderr is not a terminal).
                let bar = indicatif::ProgressBar::new(0);
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "uploading to cuda:{msg} [{bar:30}] {bytes}/{total_bytes}",
                    )
                    .expect("static progress template is valid")
                    .progress_chars("=> "),
                );
                bar.set_message(n.to_string());
                let mut progress = |done: u64, total: u64| {
                    bar.set_length(total);
                    bar.set_position(done);
                };
                model
                    .use_cuda(n, Some(&mut progress))
                    .with_context(|| format!("opening CUDA device {n}"))?;
                bar.finish_and_clear();
                if let Some(be) = model.cuda() {
                    let d = be.device();
                    eprintln!("kiln: CUDA device {n}: {}", d.summary());
                    if let Some(w) = &d.warning {
                        eprintln!("kiln: warning: {w}");
                    }
                }
                Ok(())
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => {
                let _ = model;
                self.check().map(|_| ())
            }
        }
    }
}

/// Arguments of `kiln bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF models (comma-separated, or the flag repeated).
    #[arg(short = 'm', long = "model", value_delimiter = ',', required = true)]
    pub models: Vec<PathBuf>,
    /// Prompt sizes: one `pp<N>` test each (0 = none).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths: one `tg<N>` test each (0 = none).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Depths: tokens already in the KV cache before each test (prefilled untimed).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub depth: Vec<usize>,
    /// Timed repetitions of each test (after one untimed warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// CPU threads (comma-separated list to compare; 0 = all cores).
    #[arg(
        short = 't',
        long = "threads",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub threads: Vec<usize>,
    /// Prefill chunk: rows per forward pass (default: 512 on CUDA, 64 on the CPU).
    #[arg(short = 'b', long = "batch")]
    pub batch: Option<usize>,
    /// KV cache element type (f16 or f32).
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvType,
    /// The session's context, when larger than what the tests need (the default): measures what a run with a
    /// large `-c` pays at the same depths (on a GPU, the attention's launches are sized by the slot).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<usize>,
    /// Device to run on.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Output format: md, csv or json.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub output: Format,
    /// Frontier mode: the first context frontier.
    #[arg(long)]
    pub ctx_start: Option<usize>,
    /// Frontier mode: the last context frontier.
    #[arg(long)]
    pub ctx_max: Option<usize>,
    /// Frontier mode: each frontier is the previous one times this.
    #[arg(long, default_value_t = 4)]
    pub step_mul: usize,
    /// Frontier mode: tokens decoded at each frontier.
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Frontier mode: text whose tokens are the prompt (repeated to length); default pseudo-random tokens.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Frontier mode: decode the prompt's next tokens instead of the argmax (the same work every run).
    #[arg(long)]
    pub teacher_forced_decode: bool,
    /// Frontier mode: write the full logits at each frontier to DIR/frontier-<ctx>.logits.
    #[arg(long, value_name = "DIR")]
    pub dump_frontier_logits_dir: Option<PathBuf>,
    /// Frontier mode: compare the logits at each frontier with DIR/frontier-<ctx>.logits (an earlier
    /// --dump-frontier-logits-dir run, e.g. with a kill switch set): "identical" when every bit matches, else the
    /// KL divergence, top-1 agreement and max |Δlogit| (stderr).
    #[arg(long, value_name = "DIR")]
    pub ref_frontier_logits: Option<PathBuf>,
    /// DFlash drafter (z-lab directory or converted GGUF): each `tg` test is run plainly and speculatively in
    /// the same run; the table has both speeds (after prefill), the speed-up (median of per-repetition ratios),
    /// τ, the acceptance histogram and the per-round time split (on a GPU also the GPU time of a plain step, a
    /// round's drafter and its verify, from events around each pass). The prompt is `-d` tokens (`--prompt-file`
    /// text, or pseudo-random ids); `-p` tests are not run.
    #[arg(long, value_name = "DIR")]
    pub draft: Option<PathBuf>,
    /// With --draft: force the drafts to the plain run's continuation, accepting at most K per round (τ = K + 1
    /// on any drafter, the drafter's cost still paid); comma-separated, one row each; `own` = the drafter's
    /// own proposals.
    #[arg(long = "draft-force", value_delimiter = ',', requires = "draft")]
    pub draft_force: Vec<ForceArg>,
    /// With --draft: propose and verify at most N drafts a round (1 ≤ N < the drafter's block; default: `auto`
    /// on the CPU, 7 on a GPU): a shorter verify block costs less where a verify row is dear (a CPU) and τ is
    /// modest; `auto`: the count that measures fastest, chosen as the run goes (learnt over the row's
    /// repetitions; forced rows keep every draft). Output unchanged. Comma-separated: one row each (the draft
    /// column says `maxN` or `auto`).
    #[arg(
        long = "draft-max",
        value_name = "N|auto",
        value_delimiter = ',',
        requires = "draft"
    )]
    pub draft_max: Vec<DraftMax>,
    /// A/B: run the baseline and a variant with these environment assignments (`KILN_NO_X=1`, several separated
    /// by spaces or commas) interleaved, each run in its own process, and print medians and the ratio.
    #[arg(long, value_name = "VAR=VALUE")]
    pub ab: Option<String>,
    /// CUDA: what each kind of launch costs inside a step. Every test is also timed with the launches of each
    /// set left out in turn (sets separated by spaces, a set's kernel-name prefixes or weight roles by commas,
    /// as `KILN_CUDA_TIMING_SKIP`), in this process (one model load), the variants interleaved per repetition.
    /// The runs without launches compute wrong outputs on purpose; their time is the point.
    #[arg(long, value_name = "SETS", conflicts_with_all = ["ab", "draft", "ctx_start", "ctx_max"])]
    pub skip_each: Option<String>,
}

impl Args {
    fn batch(&self) -> usize {
        self.batch.unwrap_or(self.device.default_batch())
    }
}

pub fn run(args: Args) -> Result<()> {
    let backend = args.device.check()?;
    if args.reps == 0 {
        bail!("-r must be at least 1");
    }
    if let Some(spec) = &args.ab {
        return run_ab(&args, spec);
    }
    let (flags, warnings) = Flags::from_env();
    for w in warnings {
        eprintln!("kiln: warning: {w}");
    }
    if let Some(dir) = &args.draft {
        if args.ctx_start.is_some() || args.ctx_max.is_some() {
            bail!("--draft measures tg tests; it does not combine with frontier mode");
        }
        return run_draft_mode(&args, dir, flags, backend);
    }
    if args.ctx_start.is_some() || args.ctx_max.is_some() {
        return run_frontier_mode(&args, flags);
    }
    let tests = test_matrix(&args.n_prompt, &args.n_gen, &args.depth);
    if tests.is_empty() {
        bail!("no tests: every -p and -n size is 0");
    }
    let n_ctx = tests
        .iter()
        .map(|t| t.ctx_needed())
        .max()
        .unwrap_or(1)
        .max(1);
    if let Some(sets) = &args.skip_each {
        #[cfg(feature = "cuda")]
        return run_skip_each(&args, flags, &tests, n_ctx, sets);
        #[cfg(not(feature = "cuda"))]
        bail!(
            "--skip-each ({sets}) times CUDA launches: this kiln was built without --features cuda"
        );
    }
    let mut records = Vec::new();
    for path in &args.models {
        for &threads in &args.threads {
            let mut model = load(path, threads, flags)?;
            args.device.attach(&mut model)?;
            let info = ModelInfo::of(&model, path);
            let mut session = Session::new(&model, session_config(&args, n_ctx))?;
            let n_threads = model.backend().threads();
            for (i, t) in tests.iter().enumerate() {
                let seconds = run_test(&mut session, t, args.reps, i as u64 + 1)
                    .with_context(|| format!("{}: {}", path.display(), t.name()))?;
                let r = BenchRecord {
                    model: info.clone(),
                    backend: backend.into(),
                    threads: n_threads,
                    batch: args.batch(),
                    test: *t,
                    seconds,
                };
                if args.output == Format::Md {
                    // Progress for long runs; the table itself is printed at the end.
                    let s = r.tps_stats();
                    eprintln!(
                        "kiln bench: {} {}: {:.2} ± {:.2} t/s",
                        info.filename,
                        t.name(),
                        s.mean,
                        s.sd
                    );
                }
                records.push(r);
            }
        }
    }
    print!("{}", render_bench(&records, args.output));
    Ok(())
}

/// One `--draft-force` value: `own` (the drafter's own proposals) or K (at most K accepted per round).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForceArg(pub Option<usize>);

impl std::str::FromStr for ForceArg {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "own" | "-" => Ok(ForceArg(None)),
            t => t
                .parse()
                .map(|k| ForceArg(Some(k)))
                .map_err(|_| format!("'{s}' is not a draft count (K ≥ 0) or '-'")),
        }
    }
}

/// `kiln bench --draft`: every (depth, tg) pair × every forcing, plain and speculative side by side.
fn run_draft_mode(args: &Args, dir: &Path, flags: Flags, backend: &str) -> Result<()> {
    use kiln_engine::bench::{render_spec, run_spec_test, SpecRecord, SpecTest};
    use kiln_engine::dflash::Drafter;
    let gens: Vec<usize> = args.n_gen.iter().copied().filter(|&n| n > 0).collect();
    if gens.is_empty() {
        bail!("--draft measures generation: give -n > 0");
    }
    if args.n_prompt.iter().any(|&p| p > 0) && args.n_prompt != [512] {
        eprintln!(
            "kiln bench: --draft runs tg tests only; -p is ignored (the prompt is -d tokens)"
        );
    }
    let forces: Vec<Option<usize>> = if args.draft_force.is_empty() {
        vec![None]
    } else {
        args.draft_force.iter().map(|f| f.0).collect()
    };
    let maxes: Vec<Option<DraftMax>> = if args.draft_max.is_empty() {
        vec![None]
    } else {
        args.draft_max.iter().map(|&m| Some(m)).collect()
    };
    let mut records = Vec::new();
    for path in &args.models {
        for &threads in &args.threads {
            let mut model = load(path, threads, flags)?;
            args.device.attach(&mut model)?;
            let mut drafter = Drafter::load(dir, &model)
                .with_context(|| format!("loading the drafter {}", dir.display()))?;
            let dc = drafter.config();
            let (block, n_layer) = (dc.block_size, dc.n_layer);
            if let Some(k) = forces.iter().flatten().find(|&&k| k >= block) {
                bail!(
                    "--draft-force {k}: a block of {block} holds at most {} drafts",
                    block - 1
                );
            }
            let info = ModelInfo::of(&model, path);
            let n_threads = model.backend().threads();
            let max_depth = args.depth.iter().copied().max().unwrap_or(0).max(1);
            let max_gen = gens.iter().copied().max().unwrap_or(1);
            let mut session = Session::new(&model, session_config(args, max_depth + max_gen))?;
            for &depth in &args.depth {
                let prompt_len = depth.max(1);
                let prompt = match &args.prompt_file {
                    Some(f) => prompt_from_file(&model, f, prompt_len)?,
                    None => bench_tokens(model.n_vocab(), prompt_len, 1),
                };
                for &n_gen in &gens {
                    for (&max, &force) in maxes
                        .iter()
                        .flat_map(|m| forces.iter().map(move |f| (m, f)))
                    {
                        let m = max.unwrap_or_else(|| DraftMax::default_for(&model, &drafter));
                        m.apply(&mut drafter).context("--draft-max")?;
                        let draft_desc = format!("{n_layer}L b{block} {}", m.label());
                        let test = SpecTest {
                            prompt_len,
                            n_gen,
                            force,
                        };
                        let runs = run_spec_test(&mut session, &drafter, &prompt, &test, args.reps)
                            .with_context(|| format!("{}: {}", path.display(), test.name()))?;
                        let r = SpecRecord {
                            model: info.clone(),
                            draft: draft_desc,
                            backend: backend.into(),
                            threads: n_threads,
                            test,
                            runs,
                        };
                        if args.output == Format::Md {
                            eprintln!(
                                "kiln bench: {} {} {}: AR {:.2} t/s, DFlash {:.2} t/s, tau {:.2}",
                                info.filename,
                                test.name(),
                                test.force_label(),
                                r.ar_tps().mean,
                                r.spec_tps().mean,
                                r.total().tau()
                            );
                        }
                        records.push(r);
                    }
                }
            }
        }
    }
    print!("{}", render_spec(&records, args.output));
    Ok(())
}

fn session_config(args: &Args, n_ctx: usize) -> SessionConfig {
    SessionConfig {
        n_ctx: n_ctx.max(args.ctx.unwrap_or(0)),
        n_slots: 1,
        batch: args.batch(),
        kv_type: args.kv_type,
    }
}

fn load(path: &Path, threads: usize, flags: Flags) -> Result<Model> {
    Model::load(
        path,
        LoadOptions {
            threads,
            flags,
            progress: None,
        },
    )
    .with_context(|| format!("loading {}", path.display()))
}

fn run_frontier_mode(args: &Args, flags: Flags) -> Result<()> {
    if args.models.len() != 1 || args.threads.len() != 1 {
        bail!("frontier mode measures one model with one thread count");
    }
    let ctx_max = args.ctx_max.or(args.ctx_start).unwrap_or(0);
    let ctx_start = args.ctx_start.unwrap_or(ctx_max.min(2048));
    let fr = frontiers(ctx_start, ctx_max, args.step_mul)?;
    let path = &args.models[0];
    let mut model = load(path, args.threads[0], flags)?;
    args.device.attach(&mut model)?;
    let need = prompt_tokens_needed(&fr, args.gen_tokens, args.teacher_forced_decode);
    let prompt = match &args.prompt_file {
        Some(f) => prompt_from_file(&model, f, need)?,
        None => bench_tokens(model.n_vocab(), need, 1),
    };
    let mut session = Session::new(&model, session_config(args, ctx_max + args.gen_tokens))?;
    if let Some(dir) = &args.dump_frontier_logits_dir {
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    }
    let opts = FrontierOptions {
        frontiers: fr,
        gen_tokens: args.gen_tokens,
        teacher_forced: args.teacher_forced_decode,
        kv_bytes_per_pos: kv_bytes(&model, args.kv_type, 1),
    };
    let dump_dir = args.dump_frontier_logits_dir.clone();
    let ref_dir = args.ref_frontier_logits.clone();
    let mut on_logits = |ctx: usize, logits: &[f32]| -> kiln_engine::Result<()> {
        if let Some(dir) = &ref_dir {
            eprintln!(
                "kiln bench: frontier {ctx}: {}",
                compare_frontier(dir, ctx, logits)?
            );
        }
        if let Some(dir) = &dump_dir {
            let p = dir.join(FrontierLogits::file_name(ctx));
            let bytes = FrontierLogits {
                ctx_tokens: ctx as u64,
                logits: logits.to_vec(),
            }
            .to_bytes()?;
            std::fs::write(&p, bytes)
                .map_err(|e| kiln_engine::Error::Config(format!("{}: {e}", p.display())))?;
        }
        Ok(())
    };
    let records = run_frontiers(&mut session, &prompt, &opts, &mut on_logits)?;
    print!("{}", render_frontiers(&records, args.output));
    Ok(())
}

/// The logits at frontier `ctx` against the reference run's file in `dir`, in words.
fn compare_frontier(dir: &Path, ctx: usize, logits: &[f32]) -> kiln_engine::Result<String> {
    let p = dir.join(FrontierLogits::file_name(ctx));
    let bytes = std::fs::read(&p).map_err(|e| {
        kiln_engine::Error::Config(format!("reference logits {}: {e}", p.display()))
    })?;
    let r = FrontierLogits::from_bytes(&bytes)?;
    if r.ctx_tokens != ctx as u64 || r.logits.len() != logits.len() {
        return Err(kiln_engine::Error::Config(format!(
            "{}: {} logits after {} tokens, but this run has {} after {ctx}",
            p.display(),
            r.logits.len(),
            r.ctx_tokens,
            logits.len()
        )));
    }
    if r.logits
        .iter()
        .zip(logits)
        .all(|(a, b)| a.to_bits() == b.to_bits())
    {
        return Ok("logits identical to the reference".into());
    }
    let m = compare_position(&TopK::from_logits(&r.logits, 64), logits);
    Ok(format!(
        "KL {:.3e} vs the reference, top-1 {}, max |Δlogit| over its top-64 {:.4}",
        m.kl,
        if m.top1_agree { "same" } else { "differs" },
        m.max_abs_dlogit
    ))
}

/// The text's tokens (with BOS when the model adds one), repeated without the BOS until `need` tokens.
fn prompt_from_file(model: &Model, file: &Path, need: usize) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    let tok = kiln_tokenizer::Tokenizer::from_gguf(model.gguf())
        .context("building the model's tokenizer")?;
    let mut ids = tok.encode(&text, true, false)?;
    let body = tok.encode(&text, false, false)?;
    if body.is_empty() {
        bail!("{}: the prompt file holds no tokens", file.display());
    }
    if ids.len() < need {
        eprintln!(
            "kiln bench: {} holds {} tokens; repeating it to {need}",
            file.display(),
            body.len()
        );
    }
    while ids.len() < need {
        ids.extend_from_slice(&body);
    }
    ids.truncate(need);
    Ok(ids)
}

/// `KILN_NO_X=1 KILN_NO_Y=1` or `A=1,B=0` → pairs.
pub fn parse_assignments(spec: &str) -> Result<Vec<(String, String)>> {
    let mut v = Vec::new();
    for part in spec.split([',', ' ']).filter(|s| !s.is_empty()) {
        let Some((k, val)) = part.split_once('=') else {
            bail!("--ab expects VAR=VALUE assignments, got '{part}'");
        };
        if k.is_empty() {
            bail!("--ab: empty variable name in '{part}'");
        }
        v.push((k.to_string(), val.to_string()));
    }
    if v.is_empty() {
        bail!("--ab needs at least one VAR=VALUE assignment");
    }
    Ok(v)
}

/// The command line of one A/B child: this invocation without `--ab`, `-o` and `-r`, plus `-o json -r 1`.
pub fn child_args(argv: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in argv {
        if skip_value {
            skip_value = false;
            continue;
        }
        let s = a.to_string_lossy();
        let takes_value = ["--ab", "-o", "--output", "-r", "--repetitions"];
        if takes_value.contains(&s.as_ref()) {
            skip_value = true;
            continue;
        }
        let joined = ["--ab=", "--output=", "--repetitions="]
            .iter()
            .any(|p| s.starts_with(p))
            || ((s.starts_with("-o") || s.starts_with("-r"))
                && !s.starts_with("--")
                && s.len() > 2);
        if !joined {
            out.push(a.clone());
        }
    }
    out.extend(["-o", "json", "-r", "1"].map(OsString::from));
    out
}

/// `(metric name, t/s)` pairs of one child's JSON output (standard or frontier records).
pub fn metrics_of(json: &serde_json::Value) -> Result<Vec<(String, f64)>> {
    let arr = json
        .as_array()
        .context("A/B child output is not a JSON array")?;
    let mut v = Vec::new();
    for o in arr {
        let num = |k: &str| o.get(k).and_then(serde_json::Value::as_f64);
        if let Some(ctx) = o.get("ctx_tokens").and_then(serde_json::Value::as_u64) {
            v.push((
                format!("prefill @ ctx {ctx}"),
                num("prefill_tps").unwrap_or(f64::NAN),
            ));
            v.push((
                format!("gen @ ctx {ctx}"),
                num("gen_tps").unwrap_or(f64::NAN),
            ));
        } else {
            let s = |k: &str| o.get(k).and_then(serde_json::Value::as_str).unwrap_or("?");
            let name = format!(
                "{} t{} {}",
                s("model_filename"),
                o.get("n_threads")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0),
                s("test")
            );
            if let Some(spec) = num("spec_avg_ts") {
                // A --draft record: plain and speculative decoding at one forced acceptance and drafts-a-round
                // setting (the drafter's label ends with it: `5L b16 max7`), each its own metric.
                let force = o.get("force").map_or("own".into(), |f| f.to_string());
                let draft = s("draft");
                v.push((
                    format!("{name} AR"),
                    num("ar_avg_ts").context("A/B child record without ar_avg_ts")?,
                ));
                v.push((format!("{name} {draft} k={force} DFlash"), spec));
            } else {
                v.push((
                    name,
                    num("avg_ts").context("A/B child record without avg_ts")?,
                ));
            }
        }
    }
    Ok(v)
}

fn run_ab(args: &Args, spec: &str) -> Result<()> {
    let vars = parse_assignments(spec)?;
    let exe = std::env::current_exe().context("locating the kiln binary for the A/B children")?;
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    let cargs = child_args(&argv);
    // metric → (A samples, B samples), in first-seen order.
    let mut table: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for rep in 0..args.reps {
        for arm in 0..2 {
            let mut cmd = Command::new(&exe);
            cmd.args(&cargs);
            for (k, v) in &vars {
                if arm == 0 {
                    cmd.env_remove(k);
                } else {
                    cmd.env(k, v);
                }
            }
            let label = if arm == 0 { "A" } else { "B" };
            eprintln!("kiln bench: A/B run {}/{} arm {label}", rep + 1, args.reps);
            let out = cmd.output().context("starting an A/B child")?;
            if !out.status.success() {
                bail!(
                    "A/B child (arm {label}) failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            let json: serde_json::Value =
                serde_json::from_slice(&out.stdout).context("parsing an A/B child's JSON")?;
            for (name, tps) in metrics_of(&json)? {
                let i = match table.iter().position(|r| r.0 == name) {
                    Some(i) => i,
                    None => {
                        table.push((name, Vec::new(), Vec::new()));
                        table.len() - 1
                    }
                };
                if arm == 0 {
                    table[i].1.push(tps);
                } else {
                    table[i].2.push(tps);
                }
            }
        }
    }
    let variant = vars
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    // Each metric's medians and the range of its repetitions' B/A (a run's B against the A just before it): a ratio
    // of medians inside a narrow range is an effect, one inside a range that straddles 1 may be noise.
    let rows: Vec<(String, f64, f64, (f64, f64))> = table
        .iter()
        .map(|(n, a, b)| {
            let pairs: Vec<f64> = a.iter().zip(b).map(|(a, b)| b / a).collect();
            let p = Stats::of(&pairs);
            (
                n.clone(),
                Stats::of(a).median,
                Stats::of(b).median,
                (p.min, p.max),
            )
        })
        .collect();
    match args.output {
        Format::Json => {
            use kiln_engine::bench::{json_num, json_str};
            let objs: Vec<String> = rows
                .iter()
                .map(|(n, a, b, (lo, hi))| {
                    format!(
                        "{{\"metric\": {}, \"a_median_ts\": {}, \"b_median_ts\": {}, \"ratio_b_over_a\": {}, \"pair_ratio_min\": {}, \"pair_ratio_max\": {}, \"us_per_token_b_minus_a\": {}, \"runs\": {}}}",
                        json_str(n),
                        json_num(*a),
                        json_num(*b),
                        json_num(b / a),
                        json_num(*lo),
                        json_num(*hi),
                        json_num(us_per_token_delta(*a, *b)),
                        args.reps
                    )
                })
                .collect();
            println!(
                "{{\"baseline\": \"A\", \"variant\": {}, \"results\": [{}]}}",
                json_str(&variant),
                objs.join(", ")
            );
        }
        Format::Md | Format::Csv => {
            println!(
                "A = baseline (without {}), B = {variant}; {} runs of each, interleaved A B A B …, one process per run; medians in t/s; pairs: the lowest and highest B/A of one repetition",
                vars.iter().map(|v| v.0.as_str()).collect::<Vec<_>>().join(", "),
                args.reps
            );
            let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(6).max(6);
            println!(
                "| {:<w$} | {:>10} | {:>10} | {:>7} | {:>13} | {:>10} |",
                "metric", "A t/s", "B t/s", "B/A", "pairs B/A", "B−A µs/t"
            );
            println!(
                "| {:-<w$} | {:->10}: | {:->9}: | {:->6}: | {:->12}: | {:->9}: |",
                "", "", "", "", "", ""
            );
            for (n, a, b, (lo, hi)) in rows {
                println!(
                    "| {n:<w$} | {a:>10.2} | {b:>10.2} | {:>7.3} | {:>13} | {:>10.2} |",
                    b / a,
                    format!("{lo:.3}–{hi:.3}"),
                    us_per_token_delta(a, b)
                );
            }
        }
    }
    Ok(())
}

/// `kiln bench --skip-each`: every test with all launches and without each set, interleaved per repetition in
/// one process; prints each variant's median and its difference from all launches in µs a token.
#[cfg(feature = "cuda")]
fn run_skip_each(
    args: &Args,
    flags: Flags,
    tests: &[kiln_engine::bench::TestSpec],
    n_ctx: usize,
    sets: &str,
) -> Result<()> {
    let variants: Vec<&str> = std::iter::once("").chain(sets.split_whitespace()).collect();
    if variants.len() < 2 {
        bail!("--skip-each needs at least one set of launches");
    }
    if args.device == Device::Cpu {
        bail!("--skip-each leaves out CUDA launches: use --device cuda");
    }
    // (model, test, variant, median t/s)
    let mut rows: Vec<(String, String, String, f64)> = Vec::new();
    for path in &args.models {
        let mut model = load(path, args.threads[0], flags)?;
        args.device.attach(&mut model)?;
        let Some(dev) = model.cuda().map(|c| c.device()) else {
            bail!("{}: not on the GPU", path.display());
        };
        let name = ModelInfo::of(&model, path).filename;
        let mut session = Session::new(&model, session_config(args, n_ctx))?;
        for (i, t) in tests.iter().enumerate() {
            let mut tps = vec![Vec::new(); variants.len()];
            for rep in 0..args.reps {
                for (v, set) in variants.iter().enumerate() {
                    dev.set_timing_skip(set);
                    let s = run_test(&mut session, t, 1, i as u64 + 1)
                        .with_context(|| format!("{}: {}", path.display(), t.name()))?;
                    tps[v].push(t.tokens() as f64 / s[0]);
                    eprintln!(
                        "kiln bench: {name} {} run {}/{} without [{set}]: {:.2} t/s",
                        t.name(),
                        rep + 1,
                        args.reps,
                        tps[v][rep]
                    );
                }
            }
            dev.set_timing_skip("");
            for (v, set) in variants.iter().enumerate() {
                rows.push((
                    name.clone(),
                    t.name(),
                    set.to_string(),
                    Stats::of(&tps[v]).median,
                ));
            }
        }
    }
    println!(
        "each test with all launches and without each set (KILN_CUDA_TIMING_SKIP patterns; outputs wrong there), \
         {} runs each interleaved in one process; medians in t/s; Δ = minus that set's cost in place",
        args.reps
    );
    let w = rows.iter().map(|r| r.2.len()).max().unwrap_or(14).max(14);
    println!(
        "| model | test | {:<w$} | {:>10} | {:>10} |",
        "without", "t/s", "Δ µs/t"
    );
    println!("| --- | --- | {:-<w$} | {:->9}: | {:->9}: |", "", "", "");
    // Each test's rows start with its all-launches run (the empty set), the base of its Δ.
    let mut base = 0.0;
    for (model, test, set, ts) in &rows {
        if set.is_empty() {
            base = *ts;
        }
        let label = if set.is_empty() {
            "(all launches)"
        } else {
            set
        };
        println!(
            "| {model} | {test} | {label:<w$} | {ts:>10.2} | {:>10.2} |",
            us_per_token_delta(base, *ts)
        );
    }
    Ok(())
}

/// What B changes in the time of one token (µs; negative when B is faster): with `KILN_CUDA_TIMING_SKIP` as B,
/// minus the cost of the launches left out.
fn us_per_token_delta(a_ts: f64, b_ts: f64) -> f64 {
    1e6 / b_ts - 1e6 / a_ts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn ctx_size_raises_the_session_context_never_lowers_it() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            bench: Args,
        }
        let ctx = |extra: &[&str]| {
            let mut a = vec!["kiln", "-m", "x.gguf"];
            a.extend_from_slice(extra);
            session_config(&Cli::parse_from(a).bench, 384).n_ctx
        };
        assert_eq!(ctx(&[]), 384);
        assert_eq!(ctx(&["-c", "4096"]), 4096);
        assert_eq!(ctx(&["--ctx-size", "100"]), 384);
    }

    #[test]
    fn child_args_drop_ab_output_and_reps() {
        let a = os(&[
            "bench",
            "-m",
            "x.gguf",
            "--ab",
            "KILN_NO_SIMD=1",
            "-o",
            "md",
            "-r3",
            "-p",
            "8",
            "--output=csv",
            "--repetitions",
            "4",
            "-t",
            "2",
        ]);
        assert_eq!(
            child_args(&a),
            os(&["bench", "-m", "x.gguf", "-p", "8", "-t", "2", "-o", "json", "-r", "1"])
        );
    }

    #[test]
    fn assignments() {
        assert_eq!(
            parse_assignments("KILN_NO_A=1, KILN_NO_B=0").unwrap(),
            vec![
                ("KILN_NO_A".into(), "1".into()),
                ("KILN_NO_B".into(), "0".into())
            ]
        );
        assert!(parse_assignments("KILN_NO_A").is_err());
        assert!(parse_assignments(" ").is_err());
        assert!(parse_assignments("=1").is_err());
    }

    #[test]
    fn metrics_from_both_record_kinds() {
        let j: serde_json::Value = serde_json::from_str(
            r#"[{"model_filename":"m.gguf","n_threads":2,"test":"pp8","avg_ts":10.5},
                {"ctx_tokens":64,"prefill_tps":100.0,"gen_tps":null}]"#,
        )
        .unwrap();
        let m = metrics_of(&j).unwrap();
        assert_eq!(m[0], ("m.gguf t2 pp8".to_string(), 10.5));
        assert_eq!(m[1], ("prefill @ ctx 64".to_string(), 100.0));
        assert_eq!(m[2].0, "gen @ ctx 64");
        assert!(m[2].1.is_nan());
        assert!(metrics_of(&serde_json::json!({"a": 1})).is_err());
    }

    #[test]
    fn dflash_metrics_are_told_apart_by_their_drafts_setting() {
        let rec = |max: usize, ts: f64| {
            serde_json::json!({"model_filename": "t.gguf", "n_threads": 16, "test": "tg128 @ d256",
                "draft": format!("5L b16 max{max}"), "force": 3, "ar_avg_ts": 300.0, "spec_avg_ts": ts})
        };
        let m = metrics_of(&serde_json::json!([rec(7, 700.0), rec(15, 600.0)])).unwrap();
        let spec: Vec<_> = m.iter().filter(|(n, _)| n.ends_with("DFlash")).collect();
        assert_eq!(spec.len(), 2);
        assert_eq!(spec[0].0, "t.gguf t16 tg128 @ d256 5L b16 max7 k=3 DFlash");
        assert_ne!(spec[0].0, spec[1].0);
        assert_eq!((spec[0].1, spec[1].1), (700.0, 600.0));
    }
}
