//! Speculative requests in the continuous-batching scheduler, on the real SmolLM2-135M with a random-weight
//! DFlash drafter: every event a speculative request produces (tokens, log-probabilities, finish reason, usage)
//! equals the plain request's, whether the drafter's own proposals are used (a random drafter accepts almost
//! nothing, so every round rejects), or the drafts are forced to the plain continuation (full acceptance,
//! acceptance capped at k, a rejection at a chosen row); greedy and seeded sampling; mixed with plain requests
//! in the same batches; with prefix reuse; at the context limit; and when the client goes away mid-block.

use kiln_engine::dflash::{write_random_drafter, DraftSpec, Drafter, Forced};
use kiln_engine::sampler::SamplerParams;
use kiln_engine::scheduler::{
    Event, Finish, Request, Scheduler, SchedulerConfig, Speculative, Stats, SubmitError,
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

const BLOCK: usize = 8;

fn load() -> (Model, Tokenizer, Arc<Drafter>) {
    let model = Model::load(model_path(), LoadOptions::default()).expect("SmolLM2 loads");
    let tok = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    // One directory per call: the tests run in parallel threads of one process.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("kiln-sched-spec-{}-{n}", std::process::id()));
    // SmolLM2 has no mask token: id 0 (inside its embedding table) fills the draft rows.
    write_random_drafter(
        &dir,
        &DraftSpec {
            hidden: 576,
            n_ff: 128,
            n_layer: 1,
            n_head: 9,
            n_head_kv: 3,
            head_dim: 64,
            vocab: 49152,
            block_size: BLOCK,
            num_target_layers: 30,
            target_layer_ids: vec![2, 15, 27],
            mask_token_id: 0,
            rope_theta: 1e5,
            seed: 9,
            sliding: None,
        },
    )
    .unwrap();
    let d = Drafter::load(&dir, &model).expect("drafter loads");
    let _ = std::fs::remove_dir_all(&dir);
    (model, tok, Arc::new(d))
}

fn chat(tok: &Tokenizer, system: Option<&str>, q: &str) -> Vec<u32> {
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(Message::new("system", s));
    }
    msgs.push(Message::new("user", q));
    apply_chat_template_ids(tok, &msgs, true, &serde_json::Value::Null).expect("template")
}

type Log = Arc<Mutex<Vec<Event>>>;

/// What a request asks for, so the same request can be built plain and speculative.
#[derive(Clone)]
struct Ask {
    prompt: Vec<u32>,
    max_tokens: usize,
    stop: Vec<u32>,
    sampler: SamplerParams,
    top_logprobs: Option<usize>,
    spec: Option<Speculative>,
    /// The sink refuses events after this many tokens (the client went away).
    leave_after: Option<usize>,
}

impl Ask {
    fn new(prompt: Vec<u32>, max_tokens: usize, stop: &[u32]) -> Ask {
        Ask {
            prompt,
            max_tokens,
            stop: stop.to_vec(),
            sampler: SamplerParams::greedy(),
            top_logprobs: None,
            spec: None,
            leave_after: None,
        }
    }

    fn spec(&self, forced: Option<Forced>) -> Ask {
        Ask {
            spec: Some(Speculative { forced }),
            ..self.clone()
        }
    }

    fn request(&self) -> (Request, Log) {
        let log: Log = Arc::default();
        let sink_log = log.clone();
        let leave = self.leave_after;
        let req = Request {
            prompt: self.prompt.clone(),
            max_tokens: self.max_tokens,
            stop_tokens: self.stop.clone(),
            sampler: self.sampler.clone(),
            top_logprobs: self.top_logprobs,
            speculative: self.spec.clone(),
            sink: Box::new(move |ev| {
                let mut l = sink_log.lock().unwrap();
                let n = l
                    .iter()
                    .filter(|e| matches!(e, Event::Token { .. }))
                    .count();
                if leave.is_some_and(|k| n >= k) {
                    return false;
                }
                l.push(ev);
                true
            }),
        };
        (req, log)
    }
}

fn cfg(prefix_reuse: bool) -> SchedulerConfig {
    SchedulerConfig {
        chunk: 16,
        queue_capacity: 32,
        prefix_reuse,
        prefill_passes: None,
    }
}

/// Runs `asks` all at once on `n_slots` slots of `slot_ctx` positions (with the drafter when given) and returns
/// each request's events and the scheduler's counters.
fn run_all(
    model: &Model,
    drafter: Option<&Arc<Drafter>>,
    n_slots: usize,
    slot_ctx: usize,
    c: SchedulerConfig,
    asks: &[Ask],
) -> (Vec<Vec<Event>>, Stats) {
    let mut sess = Session::new(
        model,
        SessionConfig {
            n_ctx: n_slots * slot_ctx,
            n_slots,
            batch: c.session_batch_speculative(n_slots, BLOCK),
            ..SessionConfig::default()
        },
    )
    .unwrap();
    let (s, h) = Scheduler::new(&mut sess, c).unwrap();
    let mut s = match drafter {
        Some(d) => s.with_drafter(d.clone()).unwrap(),
        None => s,
    };
    let logs: Vec<Log> = asks
        .iter()
        .map(|a| {
            let (req, log) = a.request();
            h.submit(req).unwrap();
            log
        })
        .collect();
    for _ in 0..100_000 {
        if !s.step().unwrap() {
            let events = logs.iter().map(|l| l.lock().unwrap().clone()).collect();
            return (events, h.stats());
        }
    }
    panic!("the scheduler never went idle");
}

fn tokens(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

fn finish(events: &[Event]) -> Option<Finish> {
    events.iter().find_map(|e| match e {
        Event::Done { reason, .. } => Some(*reason),
        _ => None,
    })
}

const QUESTIONS: [&str; 5] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Explain what a CPU does in one sentence.",
];

#[test]
fn speculative_requests_equal_plain_ones() {
    let (model, tok, drafter) = load();
    let eos = tok.eos_ids().to_vec();
    let system = "You are a helpful assistant who answers briefly. ".repeat(6);
    let mut asks: Vec<Ask> = QUESTIONS
        .iter()
        .map(|q| Ask::new(chat(&tok, None, q), 24, &eos))
        .collect();
    // A long prompt prefilled in several chunks while other requests verify blocks.
    asks.push(Ask::new(chat(&tok, Some(&system), QUESTIONS[0]), 24, &eos));
    // Log-probabilities of every emitted token, and seeded sampling.
    asks[1].top_logprobs = Some(3);
    asks[2].sampler = SamplerParams {
        temperature: 0.9,
        seed: 7,
        ..SamplerParams::greedy()
    };
    let (plain, _) = run_all(&model, None, 3, 512, cfg(false), &asks);
    assert!(plain.iter().all(|e| tokens(e).len() > 3));

    // The drafter's own proposals, every request speculative.
    let spec: Vec<Ask> = asks.iter().map(|a| a.spec(None)).collect();
    let (got, st) = run_all(&model, Some(&drafter), 3, 512, cfg(false), &spec);
    for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
        assert_eq!(g, p, "request {i}, drafter's own proposals");
    }
    // Every round emits a token but a request's last, which may sample its stop token.
    assert!(st.spec_rounds > 0 && st.spec_tokens + spec.len() as u64 >= st.spec_rounds);
    // The prompt chunks in passes of their own (as on CUDA), tapped for the drafter's context there.
    let split = SchedulerConfig {
        prefill_passes: Some(true),
        ..cfg(false)
    };
    let (got, _) = run_all(&model, Some(&drafter), 3, 512, split, &spec);
    for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
        assert_eq!(
            g, p,
            "request {i}, drafter's own proposals, prefill passes of their own"
        );
    }

    // Forced: full acceptance, acceptance capped at k, a rejection at row j; mixed with plain requests.
    let forced = |i: usize, cap: Option<usize>, corrupt: Vec<usize>| Forced {
        continuation: tokens(&plain[i]),
        cap,
        corrupt,
    };
    for (variant, make) in [
        (
            "full",
            &(|i| forced(i, None, vec![])) as &dyn Fn(usize) -> Forced,
        ),
        ("cap 2", &|i| forced(i, Some(2), vec![])),
        ("reject row 3", &|i| forced(i, None, vec![3])),
    ] {
        let mixed: Vec<Ask> = asks
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if i == 4 {
                    a.clone()
                } else {
                    a.spec(Some(make(i)))
                }
            })
            .collect();
        let (got, st) = run_all(&model, Some(&drafter), 3, 512, cfg(false), &mixed);
        for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
            assert_eq!(g, p, "request {i}, forced {variant}");
        }
        let tau = st.spec_tokens as f64 / st.spec_rounds as f64;
        match variant {
            "full" => assert!(tau > 5.0, "τ {tau} at full acceptance (block {BLOCK})"),
            "cap 2" => assert!(tau > 2.0 && tau <= 3.0, "τ {tau} with at most 2 accepted"),
            _ => assert!(tau > 2.0 && tau <= 4.0, "τ {tau} rejecting row 3"),
        }
    }

    // Prefix reuse: the second request after the same system prompt reuses the slot's cache and drafter
    // context; its events equal a cold plain run's (but for the reuse count).
    let first = Ask::new(chat(&tok, Some(&system), QUESTIONS[1]), 8, &eos).spec(None);
    let second = asks[5].spec(Some(forced(5, None, vec![])));
    let mut sess = Session::new(
        &model,
        SessionConfig {
            n_ctx: 512,
            n_slots: 1,
            batch: cfg(true).session_batch_speculative(1, BLOCK),
            ..SessionConfig::default()
        },
    )
    .unwrap();
    let (s, h) = Scheduler::new(&mut sess, cfg(true)).unwrap();
    let mut s = s.with_drafter(drafter.clone()).unwrap();
    let (r1, _) = first.request();
    h.submit(r1).unwrap();
    while s.step().unwrap() {}
    let (r2, log) = second.request();
    h.submit(r2).unwrap();
    while s.step().unwrap() {}
    let ev = log.lock().unwrap().clone();
    assert_eq!(tokens(&ev), tokens(&plain[5]), "prefix reuse");
    let Some(Event::Done { usage, .. }) = ev.last() else {
        panic!("no Done event: {ev:?}");
    };
    assert!(usage.reused_tokens > 40, "reused {}", usage.reused_tokens);
}

/// `--draft-max auto` in the scheduler: the drafts a round come from the chooser for the drafter's own proposals
/// (outputs still equal plain ones), and forced requests keep every draft (full acceptance still gives τ near the
/// block).
#[test]
fn auto_drafts_keep_outputs_and_leave_forced_requests_alone() {
    let (model, tok, drafter) = load();
    let mut d = Arc::try_unwrap(drafter).expect("the only handle");
    d.set_auto_drafts(true);
    let drafter = Arc::new(d);
    let eos = tok.eos_ids().to_vec();
    let asks: Vec<Ask> = QUESTIONS
        .iter()
        .take(3)
        .map(|q| Ask::new(chat(&tok, None, q), 24, &eos))
        .collect();
    let (plain, _) = run_all(&model, None, 3, 512, cfg(false), &asks);
    let spec: Vec<Ask> = asks.iter().map(|a| a.spec(None)).collect();
    let (got, st) = run_all(&model, Some(&drafter), 3, 512, cfg(false), &spec);
    for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
        assert_eq!(g, p, "request {i}, auto drafts");
    }
    assert!(st.spec_rounds > 0);
    let forced: Vec<Ask> = asks
        .iter()
        .enumerate()
        .map(|(i, a)| {
            a.spec(Some(Forced {
                continuation: tokens(&plain[i]),
                cap: None,
                corrupt: vec![],
            }))
        })
        .collect();
    let (got, st) = run_all(&model, Some(&drafter), 3, 512, cfg(false), &forced);
    for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
        assert_eq!(g, p, "request {i}, forced, auto drafts");
    }
    let tau = st.spec_tokens as f64 / st.spec_rounds as f64;
    assert!(
        tau > 5.0,
        "τ {tau} at full forced acceptance with auto drafts (block {BLOCK})"
    );
}

#[test]
fn context_limit_cancellation_and_no_drafter() {
    let (model, tok, drafter) = load();
    let prompt = chat(&tok, None, QUESTIONS[3]);
    // No stop tokens, no budget: the slot's 64 positions end it, inside a block or at its end.
    let ask = Ask::new(prompt.clone(), usize::MAX, &[]);
    let (plain, _) = run_all(&model, None, 1, 64, cfg(false), std::slice::from_ref(&ask));
    // The last token is sent but never run (no position is left for it).
    assert_eq!(tokens(&plain[0]).len(), 64 - prompt.len() + 1);
    assert_eq!(finish(&plain[0]), Some(Finish::Length));
    for f in [
        None,
        Some(Forced {
            continuation: tokens(&plain[0]),
            cap: None,
            corrupt: vec![],
        }),
    ] {
        let (got, _) = run_all(&model, Some(&drafter), 1, 64, cfg(false), &[ask.spec(f)]);
        assert_eq!(got[0], plain[0]);
    }
    // A client that leaves after 5 tokens: the request ends inside a fully accepted block.
    let leaving = Ask {
        leave_after: Some(5),
        ..Ask::new(prompt.clone(), 30, &[])
    };
    let full = Forced {
        continuation: tokens(&plain[0]),
        cap: None,
        corrupt: vec![],
    };
    let (got, st) = run_all(
        &model,
        Some(&drafter),
        1,
        64,
        cfg(false),
        &[leaving.spec(Some(full))],
    );
    assert_eq!(tokens(&got[0]), tokens(&plain[0])[..5]);
    assert_eq!((st.active, st.finished), (0, 1));
    // No drafter: a speculative request is refused on submit.
    let mut sess = Session::new(&model, SessionConfig::default()).unwrap();
    // Batch 64 = chunk 60 + 1 decode row, but not + a block of 8.
    let c = SchedulerConfig {
        chunk: 60,
        ..SchedulerConfig::default()
    };
    let (_s, h) = Scheduler::new(&mut sess, c).unwrap();
    let (req, _) = ask.spec(None).request();
    assert_eq!(h.submit(req).unwrap_err(), SubmitError::NoDrafter);
    assert!(!h.has_drafter());
    // A session batch too small for a block on every slot is refused.
    let (s, _) = Scheduler::new(&mut sess, c).unwrap();
    let e = s.with_drafter(drafter).err().expect("batch too small");
    assert!(e.to_string().contains("session batch"), "{e}");
}
