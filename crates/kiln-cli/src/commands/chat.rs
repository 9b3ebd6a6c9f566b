//! `kiln chat`: interactive chat with the model's chat template. The conversation is kept; each turn re-renders
//! it and reuses the KV cache for the longest common token prefix, so only the new turn is prefilled.
//! Ctrl-C stops the reply being generated; Ctrl-D (end of input) exits.

use super::run::{generate_stream, load_engine, new_session, EngineArgs, SamplingArgs};
use anyhow::{Context, Result};
use kiln_tokenizer::{apply_chat_template_ids, Message, Tokenizer};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `kiln chat` flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message opening the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens per reply at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 1024)]
    pub n_predict: usize,
}

/// `kiln chat`.
pub fn run(args: Args) -> Result<()> {
    let model = load_engine(&args.engine)?;
    let tok = Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?;
    let mut session = new_session(&model, &args.engine)?;
    let interrupt = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupt.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))
            .context("installing the Ctrl-C handler")?;
    }
    let mut messages: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new("system", s.clone()))
        .collect();
    // Tokens whose K/V are in slot 0, position by position.
    let mut cached: Vec<u32> = Vec::new();
    let mut sampler = args.sampling.params();
    eprintln!(
        "kiln: chat ready (seed {}); Ctrl-C stops a reply, Ctrl-D exits",
        sampler.seed
    );
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    loop {
        {
            let mut out = stdout.lock();
            write!(out, "\n> ")?;
            out.flush()?;
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(stdout.lock())?;
            return Ok(());
        }
        interrupt.store(false, Ordering::Relaxed);
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        messages.push(Message::new("user", line));
        let ids = apply_chat_template_ids(&tok, &messages, true, &serde_json::json!({}))
            .context("rendering the chat template")?;
        if ids.len() >= session.slot_ctx() {
            eprintln!(
                "kiln: the conversation needs {} tokens but the context holds {} (raise -c); message dropped",
                ids.len(),
                session.slot_ctx()
            );
            messages.pop();
            continue;
        }
        // Reuse the cached prefix; at least one token must be fed to get fresh logits.
        let common = cached
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1);
        session.truncate(0, common)?;
        cached.truncate(common);
        let mut out = stdout.lock();
        let stats = generate_stream(
            &mut session,
            &tok,
            &ids[common..],
            args.n_predict,
            sampler.clone(),
            &[],
            &mut out,
            Some(&interrupt),
        )?;
        writeln!(out)?;
        drop(out);
        stats.report();
        // What is in the KV cache now: the prompt, then the generated tokens that were decoded.
        cached.extend_from_slice(&ids[common..]);
        cached.extend_from_slice(&stats.tokens);
        cached.truncate(session.len(0));
        messages.push(Message::new("assistant", stats.text));
        // A new seed per turn, derived from the first, so replies differ but the session is reproducible.
        sampler.seed = sampler.seed.wrapping_add(1);
    }
}
