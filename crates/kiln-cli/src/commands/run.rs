//! `kiln run`: generate a continuation of one prompt. Only the generated text goes to stdout (streamed, flushed
//! per token, UTF-8 safe); the load progress bar, speeds and diagnostics go to stderr, so scripts can capture the
//! text. The prompt is used raw unless `--chat` wraps it in the model's chat template as one user message.
//!
//! Also home of what `kiln chat` shares: engine and sampling flags, model loading with a progress bar, and the
//! streaming generation loop.

use anyhow::{bail, Context, Result};
use kiln_engine::sampler::SamplerParams;
use kiln_engine::{
    FinishReason, Flags, GenerateParams, Generator, KvType, LoadOptions, Model, Session,
    SessionConfig, StepOutcome, StopMatcher,
};
use kiln_tokenizer::{apply_chat_template_ids, Message, StreamDecoder, Tokenizer};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Engine options shared by `run` and `chat`.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Model file (GGUF).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Context size in tokens (the KV cache holds this many positions).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Worker threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Prompt processing chunk size (tokens per forward pass during prefill; default: 512 on CUDA, 64 on the CPU).
    #[arg(short = 'b', long = "batch")]
    pub batch: Option<usize>,
    /// KV cache element type: f16 or f32.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvType,
    /// Device to run on: cpu, cuda or cuda:N (CUDA needs a build with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: super::bench::Device,
}

/// Loads the model of `engine` and moves it to its device.
pub(crate) fn load_engine(engine: &EngineArgs) -> Result<Model> {
    engine.device.check()?;
    let mut model = load_model(&engine.model, engine.threads)?;
    engine.device.attach(&mut model)?;
    Ok(model)
}

/// Sampling options shared by `run` and `chat` (llama.cpp's defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens of history the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Presence penalty.
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty.
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock; printed to stderr).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler parameters these flags describe.
    pub fn params(&self) -> SamplerParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        }
    }
}

/// `kiln run` flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Wrap the prompt in the model's chat template as one user message.
    #[arg(long)]
    pub chat: bool,
    /// Stop when this text is generated (repeatable); the stop text is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// DFlash drafter directory (z-lab format: config.json + model.safetensors): speculative decoding, same output.
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// With --draft: first generate without the drafter, then force the drafts to that continuation with at most
    /// K accepted per round (measures the engine at τ = K + 1 with any drafter).
    #[arg(long = "draft-force", requires = "draft")]
    pub draft_force: Option<usize>,
    /// With --draft: propose and verify at most N drafts a round (1 ≤ N < the drafter's block): a shorter verify
    /// block costs less where a verify row is dear (a CPU) and τ is modest. `auto`: the count that measures
    /// fastest, chosen as the run goes (on the CPU, each round also cut where the drafter's margins say the rest
    /// are unlikely to be accepted). Default: `auto` on the CPU, 7 on a GPU. Output unchanged.
    #[arg(long = "draft-max", value_name = "N|auto", requires = "draft")]
    pub draft_max: Option<kiln_engine::dflash::DraftMax>,
}

/// Loads a model with a progress bar on stderr; prints kill-switch and load warnings.
pub fn load_model(path: &Path, threads: usize) -> Result<Model> {
    let (flags, warnings) = Flags::from_env();
    for w in warnings {
        eprintln!("kiln: warning: {w}");
    }
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("loading {msg} [{bar:30}] {bytes}/{total_bytes}")
            .expect("static progress template is valid")
            .progress_chars("=> "),
    );
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let model = Model::load(
        path,
        LoadOptions {
            threads,
            flags,
            progress: Some(&mut progress),
        },
    )
    .with_context(|| format!("loading {}", path.display()))?;
    bar.finish_and_clear();
    for w in model.warnings() {
        eprintln!("kiln: warning: {w}");
    }
    let hp = model.hparams();
    eprintln!(
        "kiln: {} model, {} layers, {} embd, vocab {}; {} threads, {} kernels{}",
        hp.arch.name(),
        hp.n_layer,
        hp.n_embd,
        hp.n_vocab,
        model.backend().threads(),
        model.backend().isa(),
        if flags.quant_act {
            ""
        } else {
            ", f32 activations (reference mode)"
        }
    );
    Ok(model)
}

/// A session with one slot of `-c` positions.
pub fn new_session<'m>(model: &'m Model, e: &EngineArgs) -> Result<Session<'m>> {
    Ok(Session::new(
        model,
        SessionConfig {
            n_ctx: e.ctx,
            n_slots: 1,
            batch: e.batch.unwrap_or(e.device.default_batch()),
            kv_type: e.kv_type,
        },
    )?)
}

/// What one generation did.
pub struct GenStats {
    /// Prompt tokens prefilled.
    pub prompt_tokens: usize,
    /// Prefill seconds.
    pub prompt_secs: f64,
    /// Tokens generated.
    pub gen_tokens: usize,
    /// Generation seconds.
    pub gen_secs: f64,
    /// Why it ended ("interrupted" when the flag was raised).
    pub reason: &'static str,
    /// The generated text (without stop strings).
    pub text: String,
    /// The generated token ids (without the stop token).
    pub tokens: Vec<u32>,
}

impl GenStats {
    /// One stderr line of speeds.
    pub fn report(&self) {
        eprintln!(
            "kiln: prompt {} tokens in {:.2} s ({:.1} tok/s); generation {} tokens in {:.2} s ({:.1} tok/s); finish: {}",
            self.prompt_tokens,
            self.prompt_secs,
            self.prompt_tokens as f64 / self.prompt_secs.max(1e-9),
            self.gen_tokens,
            self.gen_secs,
            self.gen_tokens as f64 / self.gen_secs.max(1e-9),
            self.reason
        );
    }
}

/// Generates after `prompt` (appended to slot 0), streaming text to `out` as it is produced.
#[allow(clippy::too_many_arguments)]
pub fn generate_stream(
    session: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    max_tokens: usize,
    sampler: SamplerParams,
    stops: &[String],
    out: &mut dyn Write,
    interrupt: Option<&AtomicBool>,
) -> Result<GenStats> {
    let ctx = session.slot_ctx();
    if session.len(0) + prompt.len() > ctx {
        bail!(
            "the prompt needs {} tokens but the context holds {ctx} (raise -c)",
            session.len(0) + prompt.len()
        );
    }
    let params = GenerateParams {
        max_tokens,
        stop_tokens: tok.eos_ids().to_vec(),
        sampler,
    };
    let t0 = Instant::now();
    let mut g = Generator::new(session, 0, prompt, params)?;
    let prompt_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut dec = StreamDecoder::new(true);
    let mut stop = StopMatcher::new(stops);
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut emit = |s: &str, text: &mut String| -> Result<()> {
        if !s.is_empty() {
            out.write_all(s.as_bytes())?;
            out.flush()?;
            text.push_str(s);
        }
        Ok(())
    };
    let reason = loop {
        if interrupt.is_some_and(|f| f.load(Ordering::Relaxed)) {
            g.stop(FinishReason::Stop);
            break "interrupted";
        }
        match g.step()? {
            StepOutcome::Token(t) => {
                tokens.push(t);
                let piece = dec.push(tok, t)?;
                let (safe, hit) = stop.push(&piece);
                emit(&safe, &mut text)?;
                if hit {
                    g.stop(FinishReason::Stop);
                    break FinishReason::Stop.as_str();
                }
            }
            StepOutcome::Finished(r) => {
                let (safe, _) = stop.push(&dec.finish());
                emit(&safe, &mut text)?;
                emit(&stop.flush(), &mut text)?;
                break r.as_str();
            }
        }
    };
    Ok(GenStats {
        prompt_tokens: prompt.len(),
        prompt_secs,
        gen_tokens: g.generated(),
        gen_secs: t1.elapsed().as_secs_f64(),
        reason,
        text,
        tokens,
    })
}

/// `kiln run`.
pub fn run(args: Args) -> Result<()> {
    let model = load_engine(&args.engine)?;
    let tok = Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?;
    let prompt = if args.chat {
        apply_chat_template_ids(
            &tok,
            &[Message::new("user", args.prompt.clone())],
            true,
            &serde_json::json!({}),
        )
        .context("rendering the chat template")?
    } else {
        tok.encode(&args.prompt, tok.add_bos(), false)?
    };
    if prompt.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let sampler = args.sampling.params();
    eprintln!(
        "kiln: {} prompt tokens, seed {}, context {}",
        prompt.len(),
        sampler.seed,
        args.engine.ctx
    );
    let mut session = new_session(&model, &args.engine)?;
    if let Some(dir) = &args.draft {
        return run_draft(&args, dir, &model, &tok, &prompt, sampler, &mut session);
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stats = generate_stream(
        &mut session,
        &tok,
        &prompt,
        args.n_predict,
        sampler,
        &args.stop,
        &mut out,
        None,
    )?;
    out.write_all(b"\n")?;
    out.flush()?;
    stats.report();
    Ok(())
}

/// `kiln run --draft`: DFlash speculative generation, streamed like plain generation; τ, the acceptance
/// histogram and speeds to stderr.
fn run_draft(
    args: &Args,
    dir: &Path,
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    sampler: SamplerParams,
    session: &mut Session,
) -> Result<()> {
    use kiln_engine::dflash::{generate, DraftMax, Drafter, Forced};
    if prompt.len() > session.slot_ctx() {
        bail!(
            "the prompt needs {} tokens but the context holds {} (raise -c)",
            prompt.len(),
            session.slot_ctx()
        );
    }
    let mut drafter = Drafter::load(dir, model)
        .with_context(|| format!("loading the drafter {}", dir.display()))?;
    let draft_max = args
        .draft_max
        .unwrap_or_else(|| DraftMax::default_for(model, &drafter));
    draft_max.apply(&mut drafter).context("--draft-max")?;
    let dc = drafter.config();
    eprintln!(
        "kiln: drafter {} layers, block {}, taps {:?}, mask id {}, at most {} drafts a round{}",
        dc.n_layer,
        dc.block_size,
        dc.target_layer_ids,
        dc.mask_token_id,
        drafter.max_drafts(),
        if draft_max == DraftMax::Auto {
            " (auto: as many as measure fastest)"
        } else {
            ""
        }
    );
    let params = GenerateParams {
        max_tokens: args.n_predict,
        stop_tokens: tok.eos_ids().to_vec(),
        sampler,
    };
    let forced = match args.draft_force {
        Some(k) => {
            let mut s = new_session(model, &args.engine)?;
            let t0 = Instant::now();
            let mut g = Generator::new(&mut s, 0, prompt, params.clone())?;
            let mut cont = Vec::new();
            while let StepOutcome::Token(t) = g.step()? {
                cont.push(t);
            }
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "kiln: plain run for --draft-force: {} tokens in {secs:.2} s incl. prefill ({:.1} tok/s)",
                cont.len(),
                cont.len() as f64 / secs.max(1e-9)
            );
            Some(Forced {
                continuation: cont,
                cap: Some(k),
                corrupt: vec![],
            })
        }
        None => None,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut dec = StreamDecoder::new(true);
    let mut stop = StopMatcher::new(&args.stop);
    let mut io_err = None;
    let t0 = Instant::now();
    let o = generate(
        session,
        0,
        &drafter,
        prompt,
        &params,
        forced.as_ref(),
        &mut |t| {
            let piece = match dec.push(tok, t) {
                Ok(p) => p,
                Err(e) => {
                    io_err = Some(anyhow::Error::from(e));
                    return true;
                }
            };
            let (safe, hit) = stop.push(&piece);
            if let Err(e) = out.write_all(safe.as_bytes()).and_then(|_| out.flush()) {
                io_err = Some(e.into());
                return true;
            }
            hit
        },
    )?;
    if let Some(e) = io_err {
        return Err(e);
    }
    let secs = t0.elapsed().as_secs_f64();
    let (safe, hit) = stop.push(&dec.finish());
    if !hit {
        out.write_all(safe.as_bytes())?;
        out.write_all(stop.flush().as_bytes())?;
    }
    out.write_all(b"\n")?;
    out.flush()?;
    let st = &o.stats;
    eprintln!(
        "kiln: {} tokens in {secs:.2} s incl. prefill ({:.1} tok/s); finish: {}",
        o.tokens.len(),
        o.tokens.len() as f64 / secs.max(1e-9),
        o.finish.as_str()
    );
    eprintln!(
        "kiln: dflash tau {:.2} ({} tokens over {} verify forwards); accepted-drafts histogram {:?}",
        st.tau(),
        st.round_tokens,
        st.rounds,
        st.hist
    );
    eprintln!(
        "kiln: dflash per round: draft {:.1} ms, verify {:.1} ms",
        st.draft_time.as_secs_f64() * 1e3 / st.rounds.max(1) as f64,
        st.verify_time.as_secs_f64() * 1e3 / st.rounds.max(1) as f64
    );
    // Where the rest of the wall time went: one-off set-up, the prompt, and the loop's own work (sampling,
    // streaming the text out, the first uses of each pass shape are inside draft/verify).
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let other = secs * 1e3
        - ms(st.state_time)
        - ms(st.prefill_time)
        - ms(st.draft_time)
        - ms(st.verify_time);
    eprintln!(
        "kiln: dflash time: drafter state {:.1} ms, prefill {:.1} ms, drafts {:.1} ms, verify {:.1} ms, other {:.1} ms",
        ms(st.state_time),
        ms(st.prefill_time),
        ms(st.draft_time),
        ms(st.verify_time),
        other
    );
    Ok(())
}
