//! The engine's continuous-batching scheduler on the real SmolLM2-135M: concurrent requests (more than there
//! are slots, so some join a running batch) give token-for-token the same greedy output as each request run
//! alone; prefix reuse gives the same output while running fewer prompt tokens; cancellation frees the slot;
//! the context limit ends generation with `Length`; the queue is bounded.

use kiln_engine::sampler::SamplerParams;
use kiln_engine::scheduler::{
    Event, Finish, Request, Scheduler, SchedulerConfig, SubmitError, Usage,
};
use kiln_engine::{LoadOptions, Model, Session, SessionConfig};
use kiln_tokenizer::{apply_chat_template_ids, Message, Tokenizer};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

fn model_path() -> PathBuf {
    let dir = std::env::var_os("KILN_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.test-assets"))
        });
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-test-assets.sh",
        p.display()
    );
    p
}

fn load() -> (Model, Tokenizer) {
    let model = Model::load(model_path(), LoadOptions::default()).expect("SmolLM2 loads");
    let tok = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    (model, tok)
}

fn chat_prompt(tok: &Tokenizer, system: Option<&str>, q: &str) -> Vec<u32> {
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(Message::new("system", s));
    }
    msgs.push(Message::new("user", q));
    apply_chat_template_ids(tok, &msgs, true, &serde_json::Value::Null).expect("template")
}

type Log = Arc<Mutex<Vec<Event>>>;

fn request(prompt: Vec<u32>, max_tokens: usize, stop: &[u32]) -> (Request, Log) {
    let log: Log = Arc::default();
    let sink_log = log.clone();
    let req = Request {
        prompt,
        max_tokens,
        stop_tokens: stop.to_vec(),
        sampler: SamplerParams::greedy(),
        top_logprobs: None,
        speculative: None,
        sink: Box::new(move |ev| {
            sink_log.lock().unwrap().push(ev);
            true
        }),
    };
    (req, log)
}

/// Generated tokens and the final event's reason/usage.
fn outcome(log: &Log) -> (Vec<u32>, Option<(Finish, Usage)>) {
    let evs = log.lock().unwrap();
    let toks = evs
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    let end = evs.iter().find_map(|e| match e {
        Event::Done { reason, usage } => Some((*reason, *usage)),
        _ => None,
    });
    (toks, end)
}

fn session(model: &Model, n_ctx: usize, n_slots: usize, cfg: SchedulerConfig) -> Session<'_> {
    Session::new(
        model,
        SessionConfig {
            n_ctx,
            n_slots,
            batch: cfg.session_batch(n_slots),
            ..SessionConfig::default()
        },
    )
    .expect("session")
}

fn run_until_idle(s: &mut Scheduler) {
    for _ in 0..100_000 {
        if !s.step().expect("step") {
            return;
        }
    }
    panic!("the scheduler never went idle");
}

const QUESTIONS: [&str; 6] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Explain what a CPU does in one sentence.",
    "Give me a synonym for happy.",
];

#[test]
fn concurrent_requests_match_solo_runs_and_prefix_reuse_is_exact() {
    let (model, tok) = load();
    let stop = tok.eos_ids().to_vec();
    // A small chunk so the long prompt takes several chunks, interleaved with other requests' decode rows.
    let cfg = SchedulerConfig {
        chunk: 16,
        queue_capacity: 16,
        prefix_reuse: false,
        prefill_passes: None,
    };
    let system = "You are a helpful assistant who answers briefly. ".repeat(8);
    let mut prompts: Vec<Vec<u32>> = QUESTIONS
        .iter()
        .map(|q| chat_prompt(&tok, None, q))
        .collect();
    prompts.push(chat_prompt(&tok, Some(&system), QUESTIONS[0]));
    assert!(prompts[6].len() > 4 * cfg.chunk, "{}", prompts[6].len());
    let max_tokens = 12;

    // Each request alone, on a fresh session.
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut sess = session(&model, 1024, 1, cfg);
            let (mut s, h) = Scheduler::new(&mut sess, cfg).unwrap();
            let (req, log) = request(p.clone(), max_tokens, &stop);
            h.submit(req).unwrap();
            run_until_idle(&mut s);
            let (toks, end) = outcome(&log);
            assert!(end.is_some(), "request did not finish");
            toks
        })
        .collect();
    assert!(solo.iter().all(|t| !t.is_empty()));

    // All at once on 4 slots: three wait in the queue and join the running batch as slots free up; the
    // prompt chunks in the decode rows' pass (the CPU's default) and in passes of their own (CUDA's).
    let mut passes = Vec::new();
    for prefill_passes in [false, true] {
        let cfg = SchedulerConfig {
            prefill_passes: Some(prefill_passes),
            ..cfg
        };
        let mut sess = session(&model, 4 * 256, 4, cfg);
        let (mut s, h) = Scheduler::new(&mut sess, cfg).unwrap();
        let logs: Vec<Log> = prompts
            .iter()
            .map(|p| {
                let (req, log) = request(p.clone(), max_tokens, &stop);
                h.submit(req).unwrap();
                log
            })
            .collect();
        run_until_idle(&mut s);
        for (i, log) in logs.iter().enumerate() {
            let (toks, end) = outcome(log);
            assert_eq!(
                toks, solo[i],
                "request {i} differs from its solo run (prefill passes {prefill_passes})"
            );
            let (_, usage) = end.expect("finished");
            assert_eq!(usage.prompt_tokens, prompts[i].len());
            assert_eq!(usage.completion_tokens, toks.len());
        }
        let st = h.stats();
        assert_eq!(
            (
                st.active,
                st.queued,
                st.finished,
                st.prompt_tokens_processed
            ),
            (
                0,
                0,
                prompts.len() as u64,
                prompts.iter().map(|p| p.len() as u64).sum()
            )
        );
        assert_eq!(st.prompt_tokens_reused, 0);
        passes.push(st.steps);
    }
    // Split, the steps that mix a chunk with decode rows take two passes.
    assert!(
        passes[1] > passes[0],
        "forward passes merged / split: {passes:?}"
    );

    // Prefix reuse: a second question after the same long system prompt reuses the cached prefix, and its
    // output equals the cold run of the same prompt.
    let reuse_cfg = SchedulerConfig {
        prefix_reuse: true,
        ..cfg
    };
    let mut sess = session(&model, 2 * 256, 2, reuse_cfg);
    let (mut s, h) = Scheduler::new(&mut sess, reuse_cfg).unwrap();
    let first = chat_prompt(&tok, Some(&system), QUESTIONS[1]);
    let (req, _) = request(first, max_tokens, &stop);
    h.submit(req).unwrap();
    run_until_idle(&mut s);
    let before = h.stats();
    let (req, log) = request(prompts[6].clone(), max_tokens, &stop);
    h.submit(req).unwrap();
    run_until_idle(&mut s);
    let after = h.stats();
    let (toks, end) = outcome(&log);
    assert_eq!(toks, solo[6], "prefix reuse changed the output");
    let reused = end.expect("finished").1.reused_tokens;
    let processed = after.prompt_tokens_processed - before.prompt_tokens_processed;
    assert!(reused > system.len() / 8, "only {reused} tokens reused");
    assert_eq!(processed as usize, prompts[6].len() - reused);
    assert_eq!(
        after.prompt_tokens_reused - before.prompt_tokens_reused,
        reused as u64
    );
}

#[test]
fn cancel_context_limit_and_queue_bounds() {
    let (model, tok) = load();
    let cfg = SchedulerConfig {
        chunk: 16,
        queue_capacity: 2,
        prefix_reuse: true,
        prefill_passes: None,
    };
    let mut sess = session(&model, 2 * 64, 2, cfg);
    let (mut s, h) = Scheduler::new(&mut sess, cfg).unwrap();
    assert_eq!(h.slot_ctx(), 64);
    let prompt = chat_prompt(&tok, None, QUESTIONS[0]);

    // Refused before queueing.
    let (req, _) = request(vec![1; 64], 4, &[]);
    assert!(matches!(
        h.submit(req),
        Err(SubmitError::PromptTooLong { len: 64, n_ctx: 64 })
    ));
    let (req, _) = request(Vec::new(), 4, &[]);
    assert_eq!(h.submit(req).unwrap_err(), SubmitError::EmptyPrompt);
    let (req, _) = request(vec![u32::MAX], 4, &[]);
    assert!(matches!(h.submit(req), Err(SubmitError::BadToken { .. })));
    let (req, _) = request(prompt.clone(), 0, &[]);
    assert_eq!(h.submit(req).unwrap_err(), SubmitError::ZeroMaxTokens);

    // No stop tokens and no budget limit: the slot's context ends it, every position used.
    let (req, long_log) = request(prompt.clone(), usize::MAX, &[]);
    let long_ticket = h.submit(req).unwrap();
    let (req, cancel_log) = request(prompt.clone(), usize::MAX, &[]);
    let ticket = h.submit(req).unwrap();
    s.step().unwrap(); // both take a slot
                       // The queue holds 2 waiting requests; running ones do not count.
    let (q1, _) = request(prompt.clone(), 1, &[]);
    let (q2, _) = request(prompt.clone(), 1, &[]);
    let (q3, _) = request(prompt.clone(), 1, &[]);
    h.submit(q1).unwrap();
    h.submit(q2).unwrap();
    assert!(matches!(
        h.submit(q3),
        Err(SubmitError::QueueFull { capacity: 2 })
    ));
    for _ in 0..4 {
        s.step().unwrap();
    }
    // Both slots are still busy, so both still wait.
    assert_eq!((h.stats().active, h.stats().queued), (2, 2));
    // Cancel once the second request is generating.
    for _ in 0..100 {
        if !outcome(&cancel_log).0.is_empty() {
            break;
        }
        s.step().unwrap();
    }
    ticket.cancel();
    s.step().unwrap();
    let (toks, end) = outcome(&cancel_log);
    assert_eq!(end.map(|e| e.0), Some(Finish::Cancelled));
    assert!(!toks.is_empty());
    run_until_idle(&mut s);
    let (toks, end) = outcome(&long_log);
    let (reason, usage) = end.expect("finished");
    assert_eq!(reason, Finish::Length);
    assert_eq!(usage.prompt_tokens + toks.len(), 64 + 1);
    drop(long_ticket);
    let st = h.stats();
    assert_eq!((st.active, st.queued), (0, 0));

    // Closed: no new requests; run() returns once idle.
    h.close();
    let (req, _) = request(prompt, 1, &[]);
    assert_eq!(h.submit(req).unwrap_err(), SubmitError::ShuttingDown);
    s.run().unwrap();
}
