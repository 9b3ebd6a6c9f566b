//! SPEC_AGREE: speculative generation with a DFlash drafter emits exactly what plain generation emits — greedy
//! and seeded sampling, with the drafter's own proposals and with forced acceptance of every length, rejection at
//! every block row, stop tokens inside a block, the token budget and the context limit.
//!
//! A random drafter accepts almost nothing, so [`Forced`] replaces its proposals with the recorded plain
//! continuation (capped to k accepted per round, or corrupted at chosen rows): that exercises acceptance, the KV
//! rollback after a partial block, the bonus token and the drafter's context bookkeeping.

mod common;

use kiln_engine::dflash::{generate, write_random_drafter, DraftSpec, DraftState, Drafter, Forced};
use kiln_engine::sampler::SamplerParams;
use kiln_engine::{
    FinishReason, GenerateParams, Generator, KvType, LoadOptions, Model, Session, SessionConfig,
    StepOutcome,
};
use kiln_quant::GgmlType;
use kiln_tokenizer::{apply_chat_template_ids, Message, Tokenizer};
use std::path::PathBuf;

fn session(m: &Model, n_ctx: usize) -> Session<'_> {
    Session::new(
        m,
        SessionConfig {
            n_ctx,
            n_slots: 1,
            batch: 16,
            kv_type: KvType::F16,
        },
    )
    .unwrap()
}

/// Plain generation: tokens, finish reason, and the slot's length afterwards.
fn plain_len(
    m: &Model,
    prompt: &[u32],
    p: &GenerateParams,
    n_ctx: usize,
) -> (Vec<u32>, FinishReason, usize) {
    let mut s = session(m, n_ctx);
    let mut g = Generator::new(&mut s, 0, prompt, p.clone()).unwrap();
    let mut out = Vec::new();
    let r = loop {
        match g.step().unwrap() {
            StepOutcome::Token(t) => out.push(t),
            StepOutcome::Finished(r) => break r,
        }
    };
    drop(g);
    (out, r, s.len(0))
}

fn plain(m: &Model, prompt: &[u32], p: &GenerateParams, n_ctx: usize) -> (Vec<u32>, FinishReason) {
    let (t, r, _) = plain_len(m, prompt, p, n_ctx);
    (t, r)
}

fn spec(
    m: &Model,
    d: &Drafter,
    prompt: &[u32],
    p: &GenerateParams,
    n_ctx: usize,
    forced: Option<&Forced>,
) -> (Vec<u32>, FinishReason, f64) {
    let mut s = session(m, n_ctx);
    let o = generate(&mut s, 0, d, prompt, p, forced, &mut |_| false).unwrap();
    // The slot ends as plain generation leaves it: rejected rows rolled back, nothing more or less decoded.
    let (_, _, want_len) = plain_len(m, prompt, p, n_ctx);
    assert_eq!(s.len(0), want_len, "slot length after generation");
    (o.tokens, o.finish, o.stats.tau())
}

fn params(max_tokens: usize, stop: Vec<u32>, sampler: SamplerParams) -> GenerateParams {
    GenerateParams {
        max_tokens,
        stop_tokens: stop,
        sampler,
    }
}

fn drafter_dir(tag: &str, spec: &DraftSpec) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-dflash-{}-{tag}", std::process::id()));
    write_random_drafter(&dir, spec).unwrap();
    dir
}

/// Checks every variant against plain generation for one prompt; returns τ at full forced acceptance.
fn agree_all(m: &Model, d: &Drafter, prompt: &[u32], max_tokens: usize, n_ctx: usize) -> f64 {
    let b = d.config().block_size;
    let g = params(max_tokens, vec![], SamplerParams::greedy());
    let (want, why) = plain(m, prompt, &g, n_ctx);
    let check = |forced: Option<&Forced>, p: &GenerateParams, want: &(Vec<u32>, FinishReason)| {
        let (got, r, tau) = spec(m, d, prompt, p, n_ctx, forced);
        assert_eq!(
            (&got, r),
            (&want.0, want.1),
            "forced {forced:?}, params {p:?}"
        );
        tau
    };
    check(None, &g, &(want.clone(), why));
    let mut full_tau = 0.0;
    for k in 0..b {
        let f = Forced {
            continuation: want.clone(),
            cap: Some(k),
            corrupt: vec![],
        };
        let tau = check(Some(&f), &g, &(want.clone(), why));
        if k == b - 1 {
            full_tau = tau;
        }
    }
    for j in 1..b {
        let f = Forced {
            continuation: want.clone(),
            cap: None,
            corrupt: vec![j],
        };
        check(Some(&f), &g, &(want.clone(), why));
    }
    // A stop token inside a block: the plain run's token at index 5 (and wherever it first occurs).
    if want.len() > 6 {
        let stop = params(max_tokens, vec![want[5]], SamplerParams::greedy());
        let w = plain(m, prompt, &stop, n_ctx);
        assert_eq!(w.1, FinishReason::Stop);
        let f = Forced {
            continuation: want.clone(),
            cap: None,
            corrupt: vec![],
        };
        check(Some(&f), &stop, &w);
        check(None, &stop, &w);
    }
    // Seeded sampling: one sample per emitted token in the same order, so the same seed gives the same text.
    let samp = SamplerParams {
        temperature: 0.9,
        seed: 7,
        ..SamplerParams::greedy()
    };
    let sp = params(max_tokens, vec![], samp);
    let w = plain(m, prompt, &sp, n_ctx);
    let f = Forced {
        continuation: w.0.clone(),
        cap: None,
        corrupt: vec![3.min(b - 1)],
    };
    check(None, &sp, &w);
    check(Some(&f), &sp, &w);
    full_tau
}

#[test]
fn spec_agree_tiny_qwen3() {
    let path = common::tiny_file("qwen3", GgmlType::F32);
    let m = Model::load(&path, LoadOptions::default()).unwrap();
    let spec_ = DraftSpec {
        hidden: common::D as usize,
        n_ff: 96,
        n_layer: 1,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        vocab: common::VOCAB as usize,
        block_size: 5,
        num_target_layers: common::LAYERS,
        target_layer_ids: vec![0],
        mask_token_id: 3,
        rope_theta: 1e4,
        seed: 11,
        sliding: None,
    };
    let d = Drafter::load(drafter_dir("tiny", &spec_), &m).unwrap();
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[9, 200, 17, 5, 44, 81, 3, 120], &[77]];
    for (i, pr) in prompts.iter().enumerate() {
        for max in [1, 7, 23] {
            let tau = agree_all(&m, &d, pr, max, 256);
            if max == 23 {
                assert!(tau > 3.0, "prompt {i}: τ {tau} at full forced acceptance");
            }
        }
        // Context-limit edges: the slot fills inside a block, exactly at a block boundary, and right after
        // the prompt.
        for extra in [0, 1, 4, 5, 9] {
            agree_all(&m, &d, pr, 100, pr.len() + extra);
        }
    }
    // A drafter whose first layer is a sliding-window one (causal, window 2: shorter than a block).
    let sliding = DraftSpec {
        n_layer: 2,
        sliding: Some((2, vec![true, false])),
        ..spec_
    };
    let d = Drafter::load(drafter_dir("tiny-sliding", &sliding), &m).unwrap();
    for max in [7, 23] {
        let tau = agree_all(&m, &d, prompts[1], max, 256);
        assert!(
            max < 23 || tau > 3.0,
            "sliding drafter: τ {tau} at full forced acceptance"
        );
    }
}

#[test]
fn spec_agree_smollm2() {
    let m = Model::load(common::smollm2(), LoadOptions::default()).unwrap();
    let hp = m.hparams();
    // SmolLM2 has no mask token: id 0 (`<|endoftext|>`, inside the embedding table) fills the draft rows.
    let spec_ = DraftSpec {
        hidden: hp.n_embd,
        n_ff: 256,
        n_layer: 1,
        n_head: 9,
        n_head_kv: 3,
        head_dim: 64,
        vocab: hp.n_vocab,
        block_size: 8,
        num_target_layers: hp.n_layer,
        target_layer_ids: vec![2, 15, 27],
        mask_token_id: 0,
        rope_theta: 1e5,
        seed: 5,
        sliding: None,
    };
    let d = Drafter::load(drafter_dir("smollm2", &spec_), &m).unwrap();
    // "The capital of France is" / a chat-ish fragment, as token ids of SmolLM2's vocabulary.
    let prompts: [&[u32]; 2] = [
        &[504, 3575, 282, 4649, 314],
        &[1, 9690, 198, 2683, 359, 253, 5356, 30],
    ];
    for pr in prompts {
        let tau = agree_all(&m, &d, pr, 20, 512);
        assert!(tau > 5.0, "τ {tau} at full forced acceptance (block 8)");
    }
    agree_all(&m, &d, prompts[0], 40, prompts[0].len() + 11);
}

/// SPEC_AGREE with the drafters trained for SmolLM2 (tools/dflash-train, committed as Q8_0 GGUFs: 3 layers and
/// 2 layers) on the 31 held-out prompts of its prompt set, built as `kiln run --chat` builds them: speculative
/// greedy output equals plain greedy output token for token, including where the model stops (EOS inside a
/// block), and each trained drafter's own drafts are accepted (τ well above the ~1.0 of a random drafter).
#[test]
fn spec_agree_trained_drafter_held_out_prompts() {
    let m = Model::load(common::smollm2(), LoadOptions::default()).unwrap();
    let tok = Tokenizer::from_gguf(m.gguf()).unwrap();
    let prompts = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tools/dflash-train/prompts.jsonl"
    ))
    .unwrap();
    let held_out: Vec<String> = prompts
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["split"] == "test")
        .map(|v| v["prompt"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(held_out.len(), 31);
    let p = params(32, tok.eos_ids().to_vec(), SamplerParams::greedy());
    // Each prompt's plain greedy output once, for both drafters.
    let cases: Vec<_> = held_out
        .iter()
        .map(|text| {
            let ids = chat_ids(&tok, text);
            let want = plain(&m, &ids, &p, 512);
            (ids, want)
        })
        .collect();
    for path in [TRAINED_DRAFTER, TRAINED_DRAFTER_2L] {
        let d = Drafter::load(path, &m).unwrap();
        let name = std::path::Path::new(path)
            .file_name()
            .unwrap()
            .to_string_lossy();
        let (mut emitted, mut rounds, mut stopped) = (0usize, 0usize, 0usize);
        for ((ids, want), text) in cases.iter().zip(&held_out) {
            let mut s = session(&m, 512);
            let o = generate(&mut s, 0, &d, ids, &p, None, &mut |_| false).unwrap();
            assert_eq!(
                (&o.tokens, o.finish),
                (&want.0, want.1),
                "{path}: prompt {text:?}"
            );
            emitted += o.stats.round_tokens;
            rounds += o.stats.rounds;
            stopped += (o.finish == FinishReason::Stop) as usize;
        }
        let tau = emitted as f64 / rounds as f64;
        eprintln!("{name}: τ {tau:.2} over {rounds} rounds, {stopped} of 31 stopped at EOS");
        assert!(
            tau > 1.4,
            "{name}: τ {tau:.2}: the trained drafter's drafts are not being accepted"
        );
    }
}

/// The drafters trained for SmolLM2-135M-Instruct (tools/dflash-train), committed as Q8_0 GGUFs.
const TRAINED_DRAFTER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/dflash-train/trained/smollm2-135m-dflash-3l-q8_0.gguf"
);
const TRAINED_DRAFTER_2L: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/dflash-train/trained/smollm2-135m-dflash-2l-q8_0.gguf"
);

/// One user message in the model's chat template, as `kiln run --chat` builds it.
fn chat_ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
    apply_chat_template_ids(
        tok,
        &[Message::new("user", text)],
        true,
        &serde_json::json!({}),
    )
    .unwrap()
}

/// Speculative generation for one user message in the model's chat template, asserted equal to plain generation.
fn spec_chat_agrees(
    m: &Model,
    tok: &Tokenizer,
    d: &Drafter,
    text: &str,
    p: &GenerateParams,
) -> kiln_engine::dflash::SpecOutput {
    let ids = chat_ids(tok, text);
    let want = plain(m, &ids, p, 512);
    let mut s = session(m, 512);
    let o = generate(&mut s, 0, d, &ids, p, None, &mut |_| false).unwrap();
    assert_eq!((&o.tokens, o.finish), (&want.0, want.1), "prompt {text:?}");
    o
}

/// A drafter state holding 10 positions of made-up context features.
fn state_with_context(d: &Drafter, be: &kiln_engine::CpuBackend) -> DraftState {
    let width = d.config().hidden * d.config().target_layer_ids.len();
    let ctx: Vec<f32> = (0..10 * width)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut st = d.new_state(be, 64).unwrap();
    d.append_context(be, &mut st, &ctx).unwrap();
    st
}

/// `--draft-max K`: the drafter still runs its whole block, so its K proposals are the first K of the full
/// block's; at most K drafts are verified a round, and the output is plain greedy output.
#[test]
fn draft_max_proposes_a_prefix_and_keeps_the_output() {
    let m = Model::load(common::smollm2(), LoadOptions::default()).unwrap();
    let mut d = Drafter::load(TRAINED_DRAFTER, &m).unwrap();
    for bad in [0, 16] {
        let e = d.set_max_drafts(bad).unwrap_err().to_string();
        assert!(e.contains("proposes 1 to 15"), "{e}");
    }
    let be = m.backend();
    let mut st = state_with_context(&d, be);
    let full = d.propose(be, &mut st, 28, 16, 15).unwrap();
    assert_eq!(full.len(), 15);
    let tok = Tokenizer::from_gguf(m.gguf()).unwrap();
    let prompts = [
        "Write a Python function that returns the n-th Fibonacci number.",
        "List three facts about the Moon.",
        "What is 17 times 23?",
    ];
    let p = params(40, tok.eos_ids().to_vec(), SamplerParams::greedy());
    for k in [1, 3, 7] {
        d.set_max_drafts(k).unwrap();
        assert_eq!(d.propose(be, &mut st, 28, 16, 15).unwrap(), full[..k]);
        assert_eq!(d.propose(be, &mut st, 28, 16, 2).unwrap(), full[..k.min(2)]);
        for text in prompts {
            let o = spec_chat_agrees(&m, &tok, &d, text, &p);
            assert!(
                o.stats.hist[k + 1..].iter().all(|&h| h == 0),
                "K {k}: a round accepted more than K drafts: {:?}",
                o.stats.hist
            );
        }
    }
}

/// Auto drafts on a host drafter: each proposal comes with its drafts' margins (top-1 minus second head logit),
/// the ones the drafter's own head logits give; without auto, or with KILN_NO_DRAFT_MARGINS, none. Drafts and
/// margins are those of the whole block's hidden states, though a proposing pass takes its last layer only as
/// far as the drafted rows need (and the same with KILN_NO_DRAFT_PRUNE, which runs every row through).
#[test]
fn auto_proposals_on_the_host_carry_their_margins() {
    let m = Model::load(common::smollm2(), LoadOptions::default()).unwrap();
    let mut d = Drafter::load(TRAINED_DRAFTER, &m).unwrap();
    let be = m.backend();
    let hidden = d.config().hidden;
    let mut st = state_with_context(&d, be);
    let drafts = d.propose(be, &mut st, 28, 16, 6).unwrap();
    assert!(st.margins().is_empty(), "margins without auto drafts");
    d.set_auto_drafts(true);
    assert!(d.scores_drafts(&st));
    assert_eq!(d.propose(be, &mut st, 28, 16, 6).unwrap(), drafts);
    let got = st.margins().to_vec();
    assert_eq!(got.len(), 6);
    let mut block = vec![d.config().mask_token_id; 16];
    block[0] = 28;
    let h = d.block_hidden(be, &mut st, &block).unwrap();
    let logits = d.logits(be, &h[hidden..7 * hidden]).unwrap();
    for (i, row) in logits.chunks_exact(d.config().vocab).enumerate() {
        let mut sorted = row.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(got[i], sorted[0] - sorted[1], "draft {}", i + 1);
        assert_eq!(row[drafts[i] as usize], sorted[0], "draft {}", i + 1);
        assert!(got[i] >= 0.0);
    }
    // KILN_NO_DRAFT_PRUNE: every block row through the last layer, the same drafts and margins.
    let whole = auto_proposal(kiln_engine::Flags {
        draft_prune: false,
        ..kiln_engine::Flags::default()
    });
    assert_eq!(whole, (true, drafts.clone(), got));
    // KILN_NO_DRAFT_MARGINS: auto rounds carry no margins, so none is cut by them.
    let plain = auto_proposal(kiln_engine::Flags {
        draft_margins: false,
        ..kiln_engine::Flags::default()
    });
    assert_eq!(
        plain,
        (false, drafts, Vec::new()),
        "margins with the switch off"
    );
}

/// The trained drafter on SmolLM2 loaded with `flags`, auto drafts on: whether it scores its drafts, then its
/// 6 proposals after [`state_with_context`] and their margins.
fn auto_proposal(flags: kiln_engine::Flags) -> (bool, Vec<u32>, Vec<f32>) {
    let opts = LoadOptions {
        flags,
        ..LoadOptions::default()
    };
    let m = Model::load(common::smollm2(), opts).unwrap();
    let mut d = Drafter::load(TRAINED_DRAFTER, &m).unwrap();
    d.set_auto_drafts(true);
    let mut st = state_with_context(&d, m.backend());
    let scores = d.scores_drafts(&st);
    let drafts = d.propose(m.backend(), &mut st, 28, 16, 6).unwrap();
    (scores, drafts, st.margins().to_vec())
}

/// A host drafter whose head is Q8_0 proposes from a Q4_0 copy of it and scores the copy's 8 likeliest tokens a
/// row again with the head: the same drafts and margins as the head itself over the whole vocabulary
/// (KILN_NO_DRAFT_HEAD_Q4), on made-up context and in real rounds (the same acceptance in every round).
#[test]
fn compact_head_proposes_what_the_head_proposes() {
    let m = Model::load(common::smollm2(), LoadOptions::default()).unwrap();
    let mut d = Drafter::load(TRAINED_DRAFTER, &m).unwrap();
    let opts = LoadOptions {
        flags: kiln_engine::Flags {
            draft_head_q4: false,
            ..kiln_engine::Flags::default()
        },
        ..LoadOptions::default()
    };
    let m_full = Model::load(common::smollm2(), opts).unwrap();
    let mut d_full = Drafter::load(TRAINED_DRAFTER, &m_full).unwrap();
    assert!(d.has_compact_head() && !d_full.has_compact_head());
    d.set_auto_drafts(true);
    d_full.set_auto_drafts(true);
    for anchor in [28, 198, 1000, 7046, 30000] {
        let mut st = state_with_context(&d, m.backend());
        let mut st_full = state_with_context(&d_full, m_full.backend());
        let got = d.propose(m.backend(), &mut st, anchor, 16, 15).unwrap();
        let want = d_full
            .propose(m_full.backend(), &mut st_full, anchor, 16, 15)
            .unwrap();
        assert_eq!(got, want, "anchor {anchor}");
        assert_eq!(st.margins(), st_full.margins(), "anchor {anchor}");
    }
    d.set_auto_drafts(false);
    d_full.set_auto_drafts(false);
    let tok = Tokenizer::from_gguf(m.gguf()).unwrap();
    let p = params(48, tok.eos_ids().to_vec(), SamplerParams::greedy());
    for text in ["List three facts about the Moon.", "What is 17 times 23?"] {
        let got = spec_chat_agrees(&m, &tok, &d, text, &p);
        let want = spec_chat_agrees(&m_full, &tok, &d_full, text, &p);
        assert_eq!(got.stats.hist, want.stats.hist, "prompt {text:?}");
    }
}

/// Auto drafts a round (`--draft-max auto`): the count changes from round to round (the chooser's probes and
/// its measured choice; dflash/adaptive.rs tests the choice), the output stays plain greedy output, and a cap
/// set after it still holds.
#[test]
fn auto_draft_count_keeps_the_output() {
    let m = Model::load(common::smollm2(), LoadOptions::default()).unwrap();
    let mut d = Drafter::load(TRAINED_DRAFTER, &m).unwrap();
    let tok = Tokenizer::from_gguf(m.gguf()).unwrap();
    let p = params(64, tok.eos_ids().to_vec(), SamplerParams::greedy());
    let prompts = [
        "Write a Python function that returns the n-th Fibonacci number.",
        "List three facts about the Moon.",
    ];
    d.set_auto_drafts(true);
    for text in prompts {
        spec_chat_agrees(&m, &tok, &d, text, &p);
    }
    d.set_max_drafts(2).unwrap();
    for text in prompts {
        let o = spec_chat_agrees(&m, &tok, &d, text, &p);
        assert!(
            o.stats.hist[3..].iter().all(|&h| h == 0),
            "auto under a cap of 2 accepted more: {:?}",
            o.stats.hist
        );
    }
}

/// A one-layer drafter of block 4 for the tiny target.
fn small_spec(seed: u64) -> DraftSpec {
    DraftSpec {
        hidden: common::D as usize,
        n_ff: 32,
        n_layer: 1,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        vocab: common::VOCAB as usize,
        block_size: 4,
        num_target_layers: common::LAYERS,
        target_layer_ids: vec![0],
        mask_token_id: 3,
        rope_theta: 1e4,
        seed,
        sliding: None,
    }
}

#[test]
fn drafter_validation_errors() {
    let path = common::tiny_file("qwen3", GgmlType::F32);
    let m = Model::load(&path, LoadOptions::default()).unwrap();
    let base = small_spec(1);
    let cases: Vec<(DraftSpec, &str)> = vec![
        (
            DraftSpec {
                hidden: 32,
                ..base.clone()
            },
            "hidden_size 32",
        ),
        (
            DraftSpec {
                vocab: 300,
                ..base.clone()
            },
            "vocab_size 300",
        ),
        (
            DraftSpec {
                target_layer_ids: vec![5],
                ..base.clone()
            },
            "target_layer_ids holds 5",
        ),
        (
            DraftSpec {
                mask_token_id: 256,
                ..base.clone()
            },
            "mask_token_id 256",
        ),
        (
            DraftSpec {
                num_target_layers: 36,
                ..base.clone()
            },
            "36 layers",
        ),
    ];
    for (i, (s, want)) in cases.into_iter().enumerate() {
        let e = Drafter::load(drafter_dir(&format!("bad{i}"), &s), &m)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "case {i}: {e}");
    }
    // A missing tensor is named.
    let dir = drafter_dir("ok", &base);
    assert!(Drafter::load(&dir, &m).is_ok());
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("\"num_hidden_layers\": 1", "\"num_hidden_layers\": 2"),
    )
    .unwrap();
    let e = Drafter::load(&dir, &m).unwrap_err().to_string();
    assert!(e.contains("layers.1.input_layernorm.weight"), "{e}");
}

/// A stop string found by the caller (the callback returns true) ends generation right there, as
/// `Generator::stop` does after the same token, at every position inside a block.
#[test]
fn caller_stop_inside_a_block() {
    let path = common::tiny_file("qwen3", GgmlType::F32);
    let m = Model::load(&path, LoadOptions::default()).unwrap();
    let spec_ = DraftSpec {
        hidden: common::D as usize,
        n_ff: 96,
        n_layer: 1,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        vocab: common::VOCAB as usize,
        block_size: 6,
        num_target_layers: common::LAYERS,
        target_layer_ids: vec![0],
        mask_token_id: 3,
        rope_theta: 1e4,
        seed: 3,
        sliding: None,
    };
    let d = Drafter::load(drafter_dir("stop", &spec_), &m).unwrap();
    let prompt = [5u32, 6, 7];
    let g = params(30, vec![], SamplerParams::greedy());
    let (want, _) = plain(&m, &prompt, &g, 256);
    let forced = Forced {
        continuation: want.clone(),
        cap: None,
        corrupt: vec![],
    };
    for stop_at in 0..12 {
        let mut s = session(&m, 256);
        let mut seen = 0;
        let o = generate(&mut s, 0, &d, &prompt, &g, Some(&forced), &mut |_| {
            seen += 1;
            seen == stop_at + 1
        })
        .unwrap();
        assert_eq!(o.tokens, want[..=stop_at], "stop after token {stop_at}");
        assert_eq!(o.finish, FinishReason::Stop);
        // The slot holds the prompt and every emitted token but the last (never decoded), as in plain
        // generation after `stop`: the rejected rows of the block were rolled back.
        assert_eq!(
            s.len(0),
            prompt.len() + stop_at,
            "slot length after stop at {stop_at}"
        );
    }
}

/// Damaged drafter directories give an error, never a panic or a drafter: the safetensors file truncated at
/// every length of its header and at points in its data, and a few hundred seeded byte mutations of its header
/// and of config.json (each either refused or, when the bytes still form a valid drafter, loaded).
#[test]
fn damaged_drafter_files() {
    let path = common::tiny_file("qwen3", GgmlType::F32);
    let m = Model::load(&path, LoadOptions::default()).unwrap();
    let dir = drafter_dir("damaged", &small_spec(2));
    let st_path = dir.join("model.safetensors");
    let cfg_path = dir.join("config.json");
    let st = std::fs::read(&st_path).unwrap();
    let cfg = std::fs::read(&cfg_path).unwrap();
    let header = 8 + u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let load = |st_bytes: &[u8], cfg_bytes: &[u8]| {
        std::fs::write(&st_path, st_bytes).unwrap();
        std::fs::write(&cfg_path, cfg_bytes).unwrap();
        Drafter::load(&dir, &m)
    };
    assert!(load(&st, &cfg).is_ok());
    for cut in (0..header + 16).chain([st.len() / 2, st.len() - 1]) {
        let e = load(&st[..cut], &cfg).unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "cut at {cut}: {e}");
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut refused, mut loaded) = (0, 0);
    for i in 0..400 {
        let (mut s, mut c) = (st.clone(), cfg.clone());
        let target = if i % 2 == 0 {
            &mut s[..header]
        } else {
            &mut c[..]
        };
        for _ in 0..1 + next() % 3 {
            let at = (next() % target.len() as u64) as usize;
            target[at] = next() as u8;
        }
        match load(&s, &c) {
            Ok(_) => loaded += 1,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                refused += 1
            }
        }
    }
    eprintln!("damaged drafter files: {refused} refused, {loaded} still valid");
    assert!(refused > 200, "only {refused} of 400 mutations refused");
}
