//! Frontier mode and llama-bench tests on a tiny synthetic model: the records' arithmetic, and the rollback
//! between frontiers (the logits at every frontier must equal a teacher-forced pass over the same prompt, even
//! though tokens were decoded past the previous frontier and rolled back).

use kiln_engine::bench::{
    bench_tokens, frontiers, kv_bytes, run_frontiers, run_test, test_matrix, FrontierLogits,
    FrontierOptions,
};
use kiln_engine::synth::{find_preset, synthesize, Arch, QuantScheme, SynthSpec, TokenizerSource};
use kiln_engine::{KvType, LoadOptions, Model, Session, SessionConfig};
use kiln_gguf::GgufFile;
use std::sync::Arc;

fn tiny(arch: Arch) -> Model {
    let spec = SynthSpec {
        preset: find_preset(arch, "tiny").unwrap().clone(),
        quant: QuantScheme::from_name("q8_0").unwrap(),
        seed: 11,
    };
    let bytes = synthesize(&spec, TokenizerSource::Builtin, Vec::new(), &mut |_| {}).unwrap();
    Model::from_gguf(
        Arc::new(GgufFile::from_bytes(bytes).unwrap()),
        LoadOptions::default(),
    )
    .unwrap()
}

fn session(model: &Model, n_ctx: usize, batch: usize) -> Session<'_> {
    Session::new(
        model,
        SessionConfig {
            n_ctx,
            n_slots: 1,
            batch,
            kv_type: KvType::F32,
        },
    )
    .unwrap()
}

#[test]
fn frontier_records_and_logits_match_teacher_forcing() {
    for arch in [Arch::Llama, Arch::Qwen3] {
        let model = tiny(arch);
        let fr = frontiers(10, 45, 2).unwrap();
        assert_eq!(fr, [10, 20, 40, 45]);
        for teacher_forced in [false, true] {
            let prompt = bench_tokens(model.n_vocab(), 45 + 6, 3);
            let mut s = session(&model, 45 + 6, 8);
            let opts = FrontierOptions {
                frontiers: fr.clone(),
                gen_tokens: 6,
                teacher_forced,
                kv_bytes_per_pos: kv_bytes(&model, KvType::F32, 1),
            };
            let mut seen: Vec<(usize, Vec<f32>)> = Vec::new();
            let recs = run_frontiers(&mut s, &prompt, &opts, &mut |ctx, l| {
                seen.push((ctx, l.to_vec()));
                Ok(())
            })
            .unwrap();
            assert_eq!(s.len(0), 0, "the run leaves the slot empty");
            let ctx: Vec<usize> = recs.iter().map(|r| r.ctx_tokens).collect();
            let pre: Vec<usize> = recs.iter().map(|r| r.prefill_tokens).collect();
            assert_eq!(ctx, fr);
            assert_eq!(pre, [10, 10, 20, 5]);
            let hp = model.hparams();
            for r in &recs {
                assert_eq!(r.gen_tokens, 6);
                assert_eq!(
                    r.kvcache_bytes,
                    (2 * hp.n_layer * hp.n_head_kv * hp.head_dim * 4 * r.ctx_tokens) as u64
                );
                assert!(r.prefill_s > 0.0 && r.gen_s >= r.gen_first_s && r.gen_first_s > 0.0);
            }
            // The frontier logits are those of a straight pass over the prompt: the decoded tokens of
            // earlier frontiers were rolled back and left no trace.
            let tf = model.teacher_forced_logits(&prompt[..45]).unwrap();
            let v = model.n_vocab();
            assert_eq!(seen.len(), fr.len());
            for (f, l) in &seen {
                assert_eq!(l[..], tf[(f - 1) * v..f * v], "{arch:?} frontier {f}");
            }
        }
    }
}

#[test]
fn frontier_logits_file_holds_the_full_vocabulary() {
    let model = tiny(Arch::Qwen3);
    let prompt = bench_tokens(model.n_vocab(), 16, 5);
    let mut s = session(&model, 20, 8);
    let opts = FrontierOptions {
        frontiers: vec![16],
        gen_tokens: 2,
        teacher_forced: false,
        kv_bytes_per_pos: 0,
    };
    let mut files = Vec::new();
    run_frontiers(&mut s, &prompt, &opts, &mut |ctx, l| {
        files.push(
            FrontierLogits {
                ctx_tokens: ctx as u64,
                logits: l.to_vec(),
            }
            .to_bytes()?,
        );
        Ok(())
    })
    .unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].len(), 24 + 4 * model.n_vocab());
    let back = FrontierLogits::from_bytes(&files[0]).unwrap();
    assert_eq!(back.ctx_tokens, 16);
    let tf = model.teacher_forced_logits(&prompt).unwrap();
    assert_eq!(back.logits[..], tf[15 * model.n_vocab()..]);
}

#[test]
fn frontier_run_rejects_short_prompts_and_small_sessions() {
    let model = tiny(Arch::Qwen3);
    let prompt = bench_tokens(model.n_vocab(), 20, 5);
    let opts = |teacher_forced| FrontierOptions {
        frontiers: vec![10, 20],
        gen_tokens: 4,
        teacher_forced,
        kv_bytes_per_pos: 0,
    };
    let mut noop = |_: usize, _: &[f32]| Ok(());
    // Teacher-forced decoding needs 4 prompt tokens past the last frontier.
    let mut s = session(&model, 24, 8);
    assert!(run_frontiers(&mut s, &prompt, &opts(true), &mut noop).is_err());
    assert!(run_frontiers(&mut s, &prompt, &opts(false), &mut noop).is_ok());
    // 20 + 4 positions do not fit in 23.
    let mut small = session(&model, 23, 8);
    assert!(run_frontiers(&mut small, &prompt, &opts(false), &mut noop).is_err());
}

#[test]
fn bench_tests_run_and_leave_the_session_empty() {
    let model = tiny(Arch::Llama);
    let tests = test_matrix(&[12], &[3], &[0, 7]);
    let need = tests.iter().map(|t| t.ctx_needed()).max().unwrap();
    assert_eq!(need, 19);
    let mut s = session(&model, need, 8);
    for t in &tests {
        let secs = run_test(&mut s, t, 3, 1).unwrap();
        assert_eq!(secs.len(), 3, "{}", t.name());
        assert!(secs.iter().all(|&x| x > 0.0));
        assert_eq!(s.len(0), 0);
    }
    let mut small = session(&model, need - 1, 8);
    assert_eq!(tests[2].name(), "pp12 @ d7");
    assert!(run_test(&mut small, &tests[2], 1, 1).is_err());
}
