//! `kiln score`'s computation against an independent one: perplexity of a tiny synthetic model from
//! `Model::teacher_forced_logits` with an explicit log-softmax written here, windows cut as llama-perplexity
//! cuts them; and the dump/compare path (a dump compared with itself is exact; a mismatched one is refused).

use kiln_engine::bench::{bench_tokens, score, ScoreOptions, ScoreSeq, WindowPlan};
use kiln_engine::fidelity::LogitDump;
use kiln_engine::synth::{find_preset, synthesize, Arch, QuantScheme, SynthSpec, TokenizerSource};
use kiln_engine::{KvType, LoadOptions, Model, Session, SessionConfig};
use kiln_gguf::GgufFile;
use std::sync::Arc;

fn tiny(arch: Arch) -> Model {
    let spec = SynthSpec {
        preset: find_preset(arch, "tiny").unwrap().clone(),
        quant: QuantScheme::from_name("q4_k_m").unwrap(),
        seed: 5,
    };
    let bytes = synthesize(&spec, TokenizerSource::Builtin, Vec::new(), &mut |_| {}).unwrap();
    Model::from_gguf(
        Arc::new(GgufFile::from_bytes(bytes).unwrap()),
        LoadOptions::default(),
    )
    .unwrap()
}

/// −ln p(target) by a plain max-shifted log-softmax in f64.
fn nll(row: &[f32], target: u32) -> f64 {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x as f64));
    let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
    -((row[target as usize] as f64 - m) - z.ln())
}

fn windows(tokens: &[u32], n_ctx: usize, bos: u32) -> (WindowPlan, Vec<ScoreSeq>) {
    let plan = WindowPlan::new(tokens.len(), n_ctx, None).unwrap();
    let seqs = (0..plan.n_windows)
        .map(|i| ScoreSeq {
            tokens: plan.window(tokens, i, Some(bos)),
            first: plan.first,
        })
        .collect();
    (plan, seqs)
}

#[test]
fn perplexity_matches_an_independent_computation() {
    for arch in [Arch::Llama, Arch::Qwen3] {
        let model = tiny(arch);
        let tokens = bench_tokens(model.n_vocab(), 75, 9);
        // 75 tokens, windows of 24: 3 windows (the 3-token tail is dropped), scored from position 12.
        let (plan, seqs) = windows(&tokens, 24, 1);
        assert_eq!(
            (plan.n_windows, plan.first, plan.scored_per_window()),
            (3, 12, 11)
        );

        // The independent computation, straight from the definition.
        let v = model.n_vocab();
        let mut nlls = Vec::new();
        for w in 0..3 {
            let mut win = tokens[w * 24..(w + 1) * 24].to_vec();
            win[0] = 1; // BOS substitution
            let logits = model.teacher_forced_logits(&win).unwrap();
            for pos in 12..23 {
                nlls.push(nll(&logits[pos * v..(pos + 1) * v], win[pos + 1]));
            }
        }
        let n = nlls.len() as f64;
        let mean = nlls.iter().sum::<f64>() / n;
        let ppl = mean.exp();
        let var = nlls.iter().map(|x| x * x).sum::<f64>() / n - mean * mean;
        let err = ppl * (var / (n - 1.0)).sqrt();

        let mut s = Session::new(
            &model,
            SessionConfig {
                n_ctx: 24,
                n_slots: 1,
                batch: 7, // chunk boundaries that do not line up with `first`
                kv_type: KvType::F32,
            },
        )
        .unwrap();
        let res = score(&mut s, &seqs, ScoreOptions::default()).unwrap();
        assert_eq!(res.nll.count, 33);
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs();
        assert!(
            rel(res.nll.ppl(), ppl) < 1e-9,
            "{arch:?}: {} vs {ppl}",
            res.nll.ppl()
        );
        assert!(
            rel(res.nll.ppl_err(), err) < 1e-6,
            "{} vs {err}",
            res.nll.ppl_err()
        );
        // Random weights predict random tokens badly, but finitely.
        assert!(ppl.is_finite() && ppl > 2.0, "{ppl}");
    }
}

#[test]
fn dump_compares_exactly_with_itself_and_refuses_other_tokens() {
    let model = tiny(Arch::Qwen3);
    let tokens = bench_tokens(model.n_vocab(), 64, 2);
    let (_, seqs) = windows(&tokens, 32, 1);
    let cfg = |kv_type| SessionConfig {
        n_ctx: 32,
        n_slots: 1,
        batch: 16,
        kv_type,
    };
    let mut s = Session::new(&model, cfg(KvType::F32)).unwrap();
    let mut calls = Vec::new();
    let mut progress = |d: usize, t: usize, _: &kiln_engine::bench::NllSum| calls.push((d, t));
    let res = score(
        &mut s,
        &seqs,
        ScoreOptions {
            dump_k: Some(8),
            reference: None,
            progress: Some(&mut progress),
        },
    )
    .unwrap();
    assert_eq!(calls, [(1, 2), (2, 2)]);
    // One text per window: tokens from `first` on, one top-K per token.
    assert_eq!(res.dump.len(), 2);
    assert_eq!(res.dump[1].tokens[..], seqs[1].tokens[16..]);
    assert!(res
        .dump
        .iter()
        .all(|t| t.positions.len() == 16 && t.positions[0].ids.len() == 8));
    let dump = LogitDump {
        meta: "{}".into(),
        k: 8,
        texts: res.dump.clone(),
        greedy: vec![],
    };
    let dump = LogitDump::from_bytes(&dump.to_bytes().unwrap()).unwrap();

    let same = score(
        &mut s,
        &seqs,
        ScoreOptions {
            reference: Some(&dump),
            ..ScoreOptions::default()
        },
    )
    .unwrap();
    let c = same.comparison.unwrap();
    assert_eq!(c.fidelity.positions, 30);
    assert_eq!(c.fidelity.top1_agree, 30);
    assert!(c.kl_stats().max < 1e-9, "{}", c.kl_stats().max);
    assert!(c.dp.iter().all(|d| d.abs() < 1e-6));
    assert_eq!(same.nll, res.nll);

    // An f16 KV cache is a different engine configuration: close to, but measurably not, the reference.
    let mut h = Session::new(&model, cfg(KvType::F16)).unwrap();
    let half = score(
        &mut h,
        &seqs,
        ScoreOptions {
            reference: Some(&dump),
            ..ScoreOptions::default()
        },
    )
    .unwrap();
    let hc = half.comparison.unwrap();
    assert!(hc.kl_stats().mean < 1e-2, "{}", hc.kl_stats().mean);
    assert!(hc.fidelity.max_abs_dlogit > 0.0);

    // Other tokens, or more windows than the reference holds, are refused; fewer (`--chunks`) are compared.
    let mut other = seqs.clone();
    other[1].tokens[20] ^= 1;
    let opts = || ScoreOptions {
        reference: Some(&dump),
        ..ScoreOptions::default()
    };
    assert!(score(&mut s, &other, opts()).is_err());
    let mut more = seqs.clone();
    more.push(seqs[0].clone());
    assert!(score(&mut s, &more, opts()).is_err());
    let first = score(&mut s, &seqs[..1], opts()).unwrap();
    assert_eq!(first.comparison.unwrap().fidelity.positions, 15);
}
