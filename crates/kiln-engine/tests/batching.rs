//! Batch invariance (bit equality), KV rollback and the context limit, on the real SmolLM2 model and on tiny
//! models of every architecture.

mod common;
use common::*;
use kiln_engine::sampler::{greedy_argmax, SamplerParams};
use kiln_engine::{
    Batch, BatchRow, FinishReason, GenerateParams, Generator, KvType, LoadOptions, Model, Session,
    SessionConfig, StepOutcome,
};
use kiln_quant::GgmlType;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map(|(i, _)| i as u32)
        .unwrap()
}

fn cfg(slots: usize, kv: KvType) -> SessionConfig {
    SessionConfig {
        n_ctx: 128 * slots,
        n_slots: slots,
        batch: 16,
        kv_type: kv,
    }
}

/// Prompts of different lengths, so the sequences decode at different positions.
fn prompts(n_vocab: u32) -> Vec<Vec<u32>> {
    (0..3u32)
        .map(|s| {
            (0..(5 + 7 * s))
                .map(|i| (i * 31 + s * 7 + 3) % n_vocab)
                .collect()
        })
        .collect()
}

/// Decoding several sequences in one batch gives each the bits it gets alone.
// `step` indexes the per-sequence histories, not one slice, so the loop is clearer with an index.
#[allow(clippy::needless_range_loop)]
fn decode_batch_equals_alone(model: &Model, kv: KvType) {
    let ps = prompts(model.n_vocab() as u32);
    let steps = 3;
    // Alone: each sequence in its own session.
    let mut alone: Vec<Vec<Vec<u32>>> = Vec::new();
    for p in &ps {
        let mut s = Session::new(model, cfg(1, kv)).unwrap();
        let mut l = s.prefill(0, p).unwrap();
        let mut seq = Vec::new();
        for _ in 0..steps {
            let t = argmax(&l);
            l = s.decode(0, t).unwrap();
            seq.push(bits(&l));
        }
        alone.push(seq);
    }
    // Together: one session with a slot per sequence, one batch row per sequence each step.
    let mut s = Session::new(model, cfg(ps.len(), kv)).unwrap();
    let mut last: Vec<Vec<f32>> = ps
        .iter()
        .enumerate()
        .map(|(slot, p)| s.prefill(slot, p).unwrap())
        .collect();
    for step in 0..steps {
        let rows = (0..ps.len())
            .map(|slot| BatchRow {
                slot,
                pos: s.len(slot),
                token: argmax(&last[slot]),
                logits: true,
            })
            .collect();
        let out = s
            .forward(&Batch {
                rows,
                taps: vec![],
                argmax_only: false,
                prefill: false,
                keep_taps: false,
            })
            .unwrap();
        for slot in 0..ps.len() {
            last[slot] = out.row(slot).to_vec();
            assert_eq!(
                bits(&last[slot]),
                alone[slot][step],
                "sequence {slot} step {step}: batched logits differ from alone"
            );
        }
    }
}

/// A block of k tokens verified in one call gives the bits of k single-token steps, mixed with another
/// sequence's decode row in the same batch.
fn verify_block_equals_steps(model: &Model, kv: KvType) {
    let ps = prompts(model.n_vocab() as u32);
    let block: Vec<u32> = vec![5, 17, 2, 99 % model.n_vocab() as u32, 1];
    let mut s1 = Session::new(model, cfg(1, kv)).unwrap();
    s1.prefill(0, &ps[1]).unwrap();
    let singles: Vec<Vec<u32>> = block
        .iter()
        .map(|&t| bits(&s1.decode(0, t).unwrap()))
        .collect();

    let mut s2 = Session::new(model, cfg(2, kv)).unwrap();
    s2.prefill(0, &ps[1]).unwrap();
    let other = s2.prefill(1, &ps[2]).unwrap();
    let start = s2.len(0);
    let mut rows: Vec<BatchRow> = block
        .iter()
        .enumerate()
        .map(|(i, &token)| BatchRow {
            slot: 0,
            pos: start + i,
            token,
            logits: true,
        })
        .collect();
    rows.insert(
        2,
        BatchRow {
            slot: 1,
            pos: s2.len(1),
            token: argmax(&other),
            logits: true,
        },
    );
    let batch_rows = rows.clone();
    let out = s2
        .forward(&Batch {
            rows,
            taps: vec![],
            argmax_only: false,
            prefill: false,
            keep_taps: false,
        })
        .unwrap();
    let block_rows: Vec<usize> = (0..block.len() + 1).filter(|&i| i != 2).collect();
    for (i, &r) in block_rows.iter().enumerate() {
        assert_eq!(
            bits(out.for_batch_row(r).unwrap()),
            singles[i],
            "block token {i}: verify-block logits differ from single steps"
        );
    }

    // The same batch asking only for greedy tokens: each row's argmax of those logits, and no logits.
    let greedy: Vec<u32> = (0..out.rows.len())
        .map(|i| greedy_argmax(out.row(i)))
        .collect();
    s2.truncate(0, start).unwrap();
    s2.truncate(1, ps[2].len()).unwrap();
    let again = s2
        .forward(&Batch {
            rows: batch_rows.clone(),
            taps: vec![],
            argmax_only: true,
            prefill: false,
            keep_taps: false,
        })
        .unwrap();
    assert!(again.logits.is_empty());
    assert_eq!(again.rows, out.rows);
    assert_eq!(again.argmax, greedy);
    // And a single decode step's greedy token.
    s1.truncate(0, ps[1].len()).unwrap();
    for (i, &t) in block.iter().enumerate() {
        let logits: Vec<f32> = singles[i].iter().map(|&b| f32::from_bits(b)).collect();
        assert_eq!(s1.decode_argmax(0, t).unwrap(), greedy_argmax(&logits));
    }
}

/// Truncating a slot and decoding again reproduces the logits bit for bit.
fn rollback_is_exact(model: &Model, kv: KvType) {
    let p = &prompts(model.n_vocab() as u32)[2];
    let mut s = Session::new(model, cfg(1, kv)).unwrap();
    let mut l = s.prefill(0, p).unwrap();
    let mark = s.len(0);
    let mut first = Vec::new();
    let mut toks = Vec::new();
    for _ in 0..5 {
        let t = argmax(&l);
        toks.push(t);
        l = s.decode(0, t).unwrap();
        first.push(bits(&l));
    }
    s.truncate(0, mark).unwrap();
    assert_eq!(s.len(0), mark);
    for (i, &t) in toks.iter().enumerate() {
        assert_eq!(
            bits(&s.decode(0, t).unwrap()),
            first[i],
            "after rollback, step {i}"
        );
    }
    // Rolling back into the prompt and re-feeding its tail also reproduces the prompt's last logits.
    let mut s2 = Session::new(model, cfg(1, kv)).unwrap();
    let full = s2.prefill(0, p).unwrap();
    s2.truncate(0, p.len() - 3).unwrap();
    let again = s2.prefill(0, &p[p.len() - 3..]).unwrap();
    assert_eq!(bits(&full), bits(&again));
}

/// Prefill chunking does not change a row's logits (each row is computed with the same arithmetic).
fn chunking_is_invisible(model: &Model) {
    let p: Vec<u32> = (0..20u32)
        .map(|i| (i * 13 + 1) % model.n_vocab() as u32)
        .collect();
    let mut res = Vec::new();
    for batch in [1, 7, 32] {
        let mut s = Session::new(
            model,
            SessionConfig {
                n_ctx: 64,
                n_slots: 1,
                batch,
                kv_type: KvType::F32,
            },
        )
        .unwrap();
        res.push(bits(&s.prefill_all_logits(0, &p).unwrap()));
    }
    assert_eq!(res[0], res[1]);
    assert_eq!(res[0], res[2]);
}

fn all_checks(model: &Model, kvs: &[KvType]) {
    for &kv in kvs {
        decode_batch_equals_alone(model, kv);
        verify_block_equals_steps(model, kv);
        rollback_is_exact(model, kv);
    }
    chunking_is_invisible(model);
}

#[test]
fn smollm2_batch_invariance_and_rollback() {
    let model = Model::load(smollm2(), LoadOptions::default()).unwrap();
    // One KV type keeps CI time down; the tiny models cover both.
    all_checks(&model, &[KvType::F16]);
}

#[test]
fn warm_up_packs_the_weights_and_changes_no_bits() {
    let prompt = [1u32, 504, 3458, 282, 1029];
    let logits = |model: &Model| {
        let mut s = Session::new(model, cfg(1, KvType::F16)).unwrap();
        let l = s.prefill(0, &prompt).unwrap();
        bits(&s.decode(0, argmax(&l)).unwrap())
    };
    let cold = Model::load(smollm2(), LoadOptions::default()).unwrap();
    let warm = Model::load(smollm2(), LoadOptions::default()).unwrap();
    assert_eq!(warm.backend().packed_weights(), 0);
    warm.warm_up().unwrap();
    // Every matmul weight of SmolLM2 (Q4_1, Q8_0) is packed by one token, where this CPU has the kernel:
    // 7 a layer and the head.
    let packs = kiln_quant::dot::repack_kernel(GgmlType::Q4_1, warm.backend().isa()).is_some();
    let n = warm.hparams().n_layer * 7 + 1;
    assert_eq!(warm.backend().packed_weights(), if packs { n } else { 0 });
    assert_eq!(logits(&warm), logits(&cold));
}

#[test]
fn reference_mode_batch_invariance() {
    // The reference path dequantizes weights per call, too slow for many SmolLM2 steps: tiny models here.
    for arch in ["llama", "qwen3moe"] {
        let p = tiny_file(arch, GgmlType::Q4_1);
        let model = Model::load(
            &p,
            LoadOptions {
                flags: kiln_engine::Flags::reference(),
                ..LoadOptions::default()
            },
        )
        .unwrap();
        let _ = std::fs::remove_file(&p);
        all_checks(&model, &[KvType::F32]);
    }
}

#[test]
fn tiny_models_batch_invariance_and_rollback() {
    for arch in ["llama", "qwen3", "qwen3moe"] {
        for ty in [GgmlType::Q8_0, GgmlType::F32] {
            let p = tiny_file(arch, ty);
            let model = Model::load(&p, LoadOptions::default()).unwrap();
            let _ = std::fs::remove_file(&p);
            all_checks(&model, &[KvType::F16, KvType::F32]);
        }
    }
}

#[test]
fn context_limit_stops_with_length() {
    let p = tiny_file("qwen3", GgmlType::Q8_0);
    let model = Model::load(&p, LoadOptions::default()).unwrap();
    let _ = std::fs::remove_file(&p);
    let mut s = Session::new(
        &model,
        SessionConfig {
            n_ctx: 12,
            n_slots: 1,
            batch: 4,
            kv_type: KvType::F16,
        },
    )
    .unwrap();
    let prompt: Vec<u32> = (1..=8).collect();
    let params = GenerateParams {
        max_tokens: 100,
        stop_tokens: vec![],
        sampler: SamplerParams::greedy(),
    };
    let mut g = Generator::new(&mut s, 0, &prompt, params).unwrap();
    let mut n = 0;
    let reason = loop {
        match g.step().unwrap() {
            StepOutcome::Token(_) => n += 1,
            StepOutcome::Finished(r) => break r,
        }
    };
    assert_eq!(reason, FinishReason::Length);
    // 8 prompt positions + 4 decoded = 12 = context; the 5th sampled token cannot be decoded but is emitted.
    assert_eq!(n, 5);
    assert_eq!(s.len(0), 12);
    // Going further is an error naming the limit, not a wrap-around.
    let e = s.decode(0, 1).unwrap_err().to_string();
    assert!(e.contains("beyond its context of 12"), "{e}");
}

#[test]
fn max_tokens_and_stop_tokens() {
    let p = tiny_file("llama", GgmlType::Q8_0);
    let model = Model::load(&p, LoadOptions::default()).unwrap();
    let _ = std::fs::remove_file(&p);
    let run = |stop: Vec<u32>, max: usize| {
        let mut s = Session::new(&model, cfg(1, KvType::F16)).unwrap();
        let params = GenerateParams {
            max_tokens: max,
            stop_tokens: stop,
            sampler: SamplerParams::greedy(),
        };
        let mut g = Generator::new(&mut s, 0, &[1, 2, 3], params).unwrap();
        let mut toks = Vec::new();
        loop {
            match g.step().unwrap() {
                StepOutcome::Token(t) => toks.push(t),
                StepOutcome::Finished(r) => return (toks, r),
            }
        }
    };
    let (toks, r) = run(vec![], 6);
    assert_eq!((toks.len(), r), (6, FinishReason::Length));
    // Stopping on the third generated token returns the two before it.
    let (toks2, r2) = run(vec![toks[2]], 6);
    assert_eq!(r2, FinishReason::Stop);
    assert_eq!(
        toks2,
        toks[..toks.iter().position(|&t| t == toks[2]).unwrap()]
    );
}

#[test]
fn hidden_state_taps() {
    let p = tiny_file("qwen3", GgmlType::F32);
    let model = Model::load(&p, LoadOptions::default()).unwrap();
    let _ = std::fs::remove_file(&p);
    let mut s = Session::new(&model, cfg(1, KvType::F32)).unwrap();
    let rows: Vec<BatchRow> = (0..3)
        .map(|i| BatchRow {
            slot: 0,
            pos: i,
            token: i as u32 + 1,
            logits: i == 2,
        })
        .collect();
    let batch = Batch {
        rows,
        taps: vec![1, 0],
        argmax_only: false,
        prefill: false,
        keep_taps: false,
    };
    let out = s.forward(&batch).unwrap();
    assert_eq!(out.rows, vec![2]);
    assert_eq!(out.logits.len(), VOCAB as usize);
    let layers: Vec<usize> = out.hidden.iter().map(|h| h.0).collect();
    assert_eq!(layers, vec![0, 1]);
    assert!(out.hidden.iter().all(|h| h.1.len() == 3 * D as usize));
    assert_ne!(out.hidden[0].1, out.hidden[1].1);
    // Asked to keep its taps on the device, a host session returns them as usual.
    s.truncate(0, 0).unwrap();
    let kept = s
        .forward(&Batch {
            keep_taps: true,
            ..batch
        })
        .unwrap();
    assert_eq!(kept.hidden, out.hidden);
    assert_eq!(kept.logits, out.logits);
}

#[test]
fn k_quant_models_batch_invariance() {
    // Q4_K/Q6_K weights take the tiled prefill kernel from 3 activation rows and the row kernel below: a row's bits
    // must not depend on which one ran. The tiny synth presets are 256 wide, so every K-quant row fits.
    use kiln_engine::synth::{
        find_preset, synthesize_to_file, Arch, QuantScheme, SynthSpec, TokenizerSource,
    };
    for arch in [Arch::Qwen3, Arch::Qwen3Moe, Arch::Llama] {
        let spec = SynthSpec {
            preset: find_preset(arch, "tiny").unwrap().clone(),
            quant: QuantScheme::Q4KM,
            seed: 7,
        };
        let p = std::env::temp_dir().join(format!(
            "kiln-batching-q4km-{}-{arch:?}.gguf",
            std::process::id()
        ));
        synthesize_to_file(&spec, TokenizerSource::Builtin, &p, &mut |_| {}).unwrap();
        let model = Model::load(&p, LoadOptions::default()).unwrap();
        let _ = std::fs::remove_file(&p);
        all_checks(&model, &[KvType::F16]);
    }
}
