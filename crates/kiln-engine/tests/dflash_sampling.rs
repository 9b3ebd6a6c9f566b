//! Sampling exactness of speculative decoding: on a tiny Qwen3, the distribution of the tokens that speculative
//! sampling emits from verify blocks matches the target model's exact distribution, computed by enumerating
//! every history (no sampling in the oracle), as plain sampling's does.
//!
//! Setup: temperature 0.2 sampling (no truncation; the tiny model's logits are close, and at this
//! temperature the greedy path is likely but far from certain, where a bias shows most), 4 tokens per run, thousands of runs with a fixed seed set (so
//! the test is deterministic), drafts forced to the greedy continuation (point masses on the most likely
//! tokens: the drafts a good drafter makes, and the ones a biased acceptance rule would over-produce). Token 0
//! comes from the prompt's logits; tokens 1 and 2 come from verify blocks, either accepted drafts or the
//! target's own choice after a rejection. Each marginal is compared with the exact one by a chi-square
//! goodness-of-fit test (bins with an expected count below 5 merged) at p = 1e-4, and the speculative sample
//! with the plain one (disjoint seeds) by a two-sample chi-square test.
//!
//! The test's power is checked too: [`Acceptance::BiasedArgmaxForTests`] (emit the draft without sampling when
//! it is the target's argmax — a plausible bug) must fail the same test.

mod common;

use kiln_engine::dflash::{
    generate_with, write_random_drafter, Acceptance, DraftSpec, Drafter, Forced,
};
use kiln_engine::sampler::SamplerParams;
use kiln_engine::{
    GenerateParams, Generator, KvType, LoadOptions, Model, Session, SessionConfig, StepOutcome,
};
use kiln_quant::GgmlType;

const TEMP: f32 = 0.2;
const RUNS: u64 = 3000;
const N_GEN: usize = 4;
const PROMPT: [u32; 4] = [5, 6, 7, 8];

fn session(m: &Model) -> Session<'_> {
    Session::new(
        m,
        SessionConfig {
            n_ctx: 64,
            n_slots: 1,
            batch: 16,
            kv_type: KvType::F32,
        },
    )
    .unwrap()
}

fn params(seed: u64) -> GenerateParams {
    GenerateParams {
        max_tokens: N_GEN,
        stop_tokens: Vec::new(),
        sampler: SamplerParams {
            temperature: TEMP,
            seed,
            ..SamplerParams::greedy()
        },
    }
}

/// The sampler's distribution for `logits`: softmax of logits / T.
fn probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| (((l - max) / TEMP) as f64).exp())
        .collect();
    let z: f64 = w.iter().sum();
    w.into_iter().map(|x| x / z).collect()
}

/// Exact marginal distributions of generated tokens 1 and 2, by enumerating tokens 0 and 1 (histories whose
/// probability is below 1e-9 are skipped: at most 256² × 1e-9 of mass, far below what thousands of runs see).
fn exact_marginals(m: &Model) -> [Vec<f64>; 2] {
    let n = m.n_vocab();
    let mut s = session(m);
    let p0 = probs(&s.prefill(0, &PROMPT).unwrap());
    let base = PROMPT.len();
    let mut p1 = vec![0f64; n];
    let mut p2 = vec![0f64; n];
    for (t0, &w0) in p0.iter().enumerate() {
        if w0 < 1e-9 {
            continue;
        }
        s.truncate(0, base).unwrap();
        let q1 = probs(&s.decode(0, t0 as u32).unwrap());
        for (t1, &w1) in q1.iter().enumerate() {
            p1[t1] += w0 * w1;
            if w0 * w1 < 1e-9 {
                continue;
            }
            s.truncate(0, base + 1).unwrap();
            let q2 = probs(&s.decode(0, t1 as u32).unwrap());
            for (t2, &w2) in q2.iter().enumerate() {
                p2[t2] += w0 * w1 * w2;
            }
        }
    }
    [p1, p2]
}

/// Chi-square statistic of `counts` against `p` (bins expected below 5 merged into one), and the critical
/// value at p = 1e-4 for its degrees of freedom (Wilson–Hilferty).
fn chi_square(counts: &[u64], p: &[f64]) -> (f64, f64) {
    let total: u64 = counts.iter().sum();
    let nt = total as f64;
    let (mut stat, mut bins) = (0.0, 0usize);
    let (mut rest_obs, mut rest_exp) = (0.0, 0.0);
    for (&c, &q) in counts.iter().zip(p) {
        let e = q * nt;
        if e >= 5.0 {
            stat += (c as f64 - e).powi(2) / e;
            bins += 1;
        } else {
            rest_obs += c as f64;
            rest_exp += e;
        }
    }
    if rest_exp > 0.0 {
        stat += (rest_obs - rest_exp).powi(2) / rest_exp.max(1.0);
        bins += 1;
    }
    let df = (bins.max(2) - 1) as f64;
    let z = 3.719; // one-sided normal quantile of 1e-4
    let a = 2.0 / (9.0 * df);
    (stat, df * (1.0 - a + z * a.sqrt()).powi(3))
}

/// Two-sample chi-square (homogeneity) of two equal-sized samples' counts (bins with fewer than 10 together
/// merged into one), and the critical value at p = 1e-4.
fn chi_square_two(a: &[u64], b: &[u64]) -> (f64, f64) {
    let (mut stat, mut bins) = (0.0, 0usize);
    let (mut ra, mut rb) = (0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        if x + y >= 10.0 {
            stat += (x - y).powi(2) / (x + y);
            bins += 1;
        } else {
            ra += x;
            rb += y;
        }
    }
    if ra + rb > 0.0 {
        stat += (ra - rb).powi(2) / (ra + rb);
        bins += 1;
    }
    let df = (bins.max(2) - 1) as f64;
    let a = 2.0 / (9.0 * df);
    (stat, df * (1.0 - a + 3.719 * a.sqrt()).powi(3))
}

fn counts(runs: &[Vec<u32>], index: usize, n_vocab: usize) -> Vec<u64> {
    let mut c = vec![0u64; n_vocab];
    for r in runs {
        c[r[index] as usize] += 1;
    }
    c
}

#[test]
fn speculative_sampling_matches_the_target_distribution() {
    let path = common::tiny_file("qwen3", GgmlType::F32);
    let m = Model::load(
        &path,
        LoadOptions {
            threads: 1,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let n_vocab = m.n_vocab();
    let dir = std::env::temp_dir().join(format!("kiln-dflash-sampling-{}", std::process::id()));
    write_random_drafter(
        &dir,
        &DraftSpec {
            hidden: common::D as usize,
            n_ff: 64,
            n_layer: 1,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            vocab: n_vocab,
            block_size: 4,
            num_target_layers: common::LAYERS,
            target_layer_ids: vec![0],
            mask_token_id: 3,
            rope_theta: 1e4,
            seed: 21,
            sliding: None,
        },
    )
    .unwrap();
    let d = Drafter::load(&dir, &m).unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    // The greedy continuation: the drafts every run gets.
    let mut s = session(&m);
    let greedy = GenerateParams {
        sampler: SamplerParams::greedy(),
        ..params(0)
    };
    let mut g = Generator::new(&mut s, 0, &PROMPT, greedy).unwrap();
    let mut cont = Vec::new();
    while let StepOutcome::Token(t) = g.step().unwrap() {
        cont.push(t);
    }
    drop(g);
    let forced = Forced {
        continuation: cont,
        cap: None,
        corrupt: Vec::new(),
    };

    let exact = exact_marginals(&m);
    // The setting must make the test meaningful: the greedy path is likely (drafts get accepted often), yet the
    // marginals are spread over many tokens.
    let top1 = exact[0].iter().copied().fold(0.0, f64::max);
    assert!(top1 > 0.2 && top1 < 0.9, "p(top token 1) = {top1}");

    // One session reused (emptied before each run): runs are independent, the cache is rewritten.
    let mut s = session(&m);
    let plain: Vec<Vec<u32>> = (0..RUNS)
        .map(|seed| {
            s.truncate(0, 0).unwrap();
            let mut g = Generator::new(&mut s, 0, &PROMPT, params(seed)).unwrap();
            let mut out = Vec::new();
            while let StepOutcome::Token(t) = g.step().unwrap() {
                out.push(t);
            }
            out
        })
        .collect();
    let mut spec_runs = |acceptance: Acceptance| -> (Vec<Vec<u32>>, usize, usize) {
        let (mut rounds, mut accepted) = (0, 0);
        // Seeds disjoint from the plain runs': an independent sample, not the same draws replayed.
        let runs = (RUNS..2 * RUNS)
            .map(|seed| {
                s.truncate(0, 0).unwrap();
                let o = generate_with(
                    &mut s,
                    0,
                    &d,
                    &PROMPT,
                    &params(seed),
                    Some(&forced),
                    acceptance,
                    &mut |_| false,
                )
                .unwrap();
                rounds += o.stats.rounds;
                accepted += o
                    .stats
                    .hist
                    .iter()
                    .enumerate()
                    .map(|(a, n)| a * n)
                    .sum::<usize>();
                o.tokens
            })
            .collect();
        (runs, rounds, accepted)
    };
    let (spec, rounds, accepted) = spec_runs(Acceptance::Exact);
    let (biased, _, _) = spec_runs(Acceptance::BiasedArgmaxForTests);
    assert!(plain.iter().chain(&spec).all(|r| r.len() == N_GEN));
    // Drafts are accepted in a good share of rounds, so accepted tokens are a real part of the sample.
    assert!(
        accepted * 5 > rounds,
        "{accepted} drafts accepted in {rounds} rounds"
    );

    // (by the exact oracle, by the two-sample test)
    let mut biased_detected = (false, false);
    for (k, p) in exact.iter().enumerate() {
        let index = k + 1;
        let (x_plain, crit) = chi_square(&counts(&plain, index, n_vocab), p);
        let (x_spec, crit_s) = chi_square(&counts(&spec, index, n_vocab), p);
        let (x_biased, _) = chi_square(&counts(&biased, index, n_vocab), p);
        // Speculative against plain sampling directly (disjoint seeds): the same distribution.
        let c_plain = counts(&plain, index, n_vocab);
        let (x_two, crit_two) = chi_square_two(&counts(&spec, index, n_vocab), &c_plain);
        let (x_two_biased, crit_two_b) = chi_square_two(&counts(&biased, index, n_vocab), &c_plain);
        eprintln!(
            "token {index}: chi-square against the exact distribution: plain {x_plain:.1}, speculative \
             {x_spec:.1}, biased {x_biased:.1} (critical {crit:.1}, p = 1e-4); speculative vs plain {x_two:.1}, \
             biased vs plain {x_two_biased:.1} (critical {crit_two:.1})"
        );
        assert!(
            x_two < crit_two,
            "speculative and plain sampling differ at token {index}: {x_two:.1} ≥ {crit_two:.1}"
        );
        biased_detected.1 |= x_two_biased > crit_two_b;
        assert!(
            x_plain < crit,
            "plain sampling fails its own oracle at token {index}"
        );
        assert!(
            x_spec < crit_s,
            "speculative sampling is biased at token {index}: chi-square {x_spec:.1} ≥ {crit_s:.1}"
        );
        biased_detected.0 |= x_biased > crit;
    }
    assert_eq!(
        biased_detected,
        (true, true),
        "the deliberately biased acceptance rule was not detected: the test has no power"
    );
}
