//! llama-bench's tests: `pp<N>` (prefill N tokens), `tg<N>` (decode N tokens one at a time), each optionally
//! `@ d<D>`: D tokens already in the KV cache, prefilled untimed. Tokens are pseudo-random ids (llama-bench
//! does the same: the work per token does not depend on which token it is), fixed by a seed so runs repeat.
//!
//! Timing: one untimed warm-up run of the same test first (page faults, thread pool start, caches), then
//! `reps` timed runs. Restoring the depth between runs is a [`Session::truncate`]: positions past a slot's
//! length are never read and are overwritten by the next rows, so rolling back to `depth` restores exactly the
//! state after the depth prefill without copying anything (the snapshot/restore of the KV state is free).

use crate::error::{Error, Result};
use crate::fidelity::argmax;
use crate::models::Model;
use crate::session::Session;
use crate::KvType;
use std::time::Instant;

/// One test of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestSpec {
    /// Prompt tokens prefilled (timed); 0 for a generation test.
    pub n_prompt: usize,
    /// Tokens decoded one at a time (timed); 0 for a prompt test.
    pub n_gen: usize,
    /// Tokens in the KV cache before the test (prefilled untimed).
    pub depth: usize,
}

impl TestSpec {
    /// llama-bench's name: `pp512`, `tg128`, `pp512+tg128`, with ` @ d4096` when the depth is not 0.
    pub fn name(&self) -> String {
        let mut s = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        };
        if self.depth > 0 {
            s += &format!(" @ d{}", self.depth);
        }
        s
    }

    /// Tokens processed in one timed run (the numerator of t/s).
    pub fn tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }

    /// KV positions the test needs.
    pub fn ctx_needed(&self) -> usize {
        self.depth + self.n_prompt + self.n_gen
    }
}

/// The tests of `-p`, `-n` and `-d` in llama-bench's order: for each depth, every prompt size, then every
/// generation length. Zero sizes are skipped (`-p 0` means no prompt tests).
pub fn test_matrix(prompts: &[usize], gens: &[usize], depths: &[usize]) -> Vec<TestSpec> {
    let mut v = Vec::new();
    for &depth in depths {
        v.extend(prompts.iter().filter(|&&p| p > 0).map(|&p| TestSpec {
            n_prompt: p,
            n_gen: 0,
            depth,
        }));
        v.extend(gens.iter().filter(|&&g| g > 0).map(|&g| TestSpec {
            n_prompt: 0,
            n_gen: g,
            depth,
        }));
    }
    v
}

/// `n` pseudo-random token ids below `n_vocab`, the same for the same seed (a 64-bit LCG; the high bits are
/// used because the low bits of an LCG have short periods).
pub fn bench_tokens(n_vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % n_vocab.max(1) as u64) as u32
        })
        .collect()
}

/// What the table says about a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// The file name (no directory).
    pub filename: String,
    /// llama.cpp-style description: architecture, parameter label, main weight type (`llama 135M Q4_1`).
    pub desc: String,
    /// Bytes of tensor data.
    pub size_bytes: u64,
    /// Parameters (tensor elements).
    pub n_params: u64,
}

impl ModelInfo {
    /// Describes a loaded model; `path` only gives the file name.
    pub fn of(model: &Model, path: &std::path::Path) -> ModelInfo {
        let s = kiln_gguf::Summary::of(model.gguf());
        // The type holding the most bytes names the quantization, as a file's ftype usually does.
        let main_ty = s
            .quant_mix
            .first()
            .map(|t| t.ty.name().to_uppercase())
            .unwrap_or_else(|| "?".into());
        ModelInfo {
            filename: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
            desc: format!(
                "{} {} {}",
                model.hparams().arch.name(),
                params_label(s.parameter_count),
                main_ty
            ),
            size_bytes: s.tensor_bytes,
            n_params: s.parameter_count,
        }
    }
}

/// `135M`, `752M`, `8.2B`: a rounded parameter count for model descriptions (millions below a billion, as
/// llama.cpp prints them).
pub fn params_label(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else {
        format!("{:.0}M", n / 1e6)
    }
}

/// KV cache bytes holding `positions` positions of one sequence (keys and values, every layer).
pub fn kv_bytes(model: &Model, kv_type: KvType, positions: usize) -> u64 {
    let hp = model.hparams();
    let elem = match kv_type {
        KvType::F16 => 2,
        KvType::F32 => 4,
    };
    2 * hp.n_layer as u64 * hp.n_head_kv as u64 * hp.head_dim as u64 * elem * positions as u64
}

/// Runs `spec` on slot 0 of `session`: the untimed depth prefill and warm-up, then `reps` timed runs.
/// Returns the seconds of each timed run. The session must hold at least [`TestSpec::ctx_needed`] positions.
pub fn run_test(
    session: &mut Session,
    spec: &TestSpec,
    reps: usize,
    seed: u64,
) -> Result<Vec<f64>> {
    if spec.ctx_needed() > session.slot_ctx() {
        return Err(Error::Config(format!(
            "test {} needs {} KV positions but the session has {}",
            spec.name(),
            spec.ctx_needed(),
            session.slot_ctx()
        )));
    }
    let n_vocab = session.model().n_vocab();
    let depth_tokens = bench_tokens(n_vocab, spec.depth, seed);
    let prompt = bench_tokens(n_vocab, spec.n_prompt, seed.wrapping_add(1));
    let first_gen = bench_tokens(n_vocab, 1, seed.wrapping_add(2))[0];
    session.truncate(0, 0)?;
    session.prefill(0, &depth_tokens)?;
    let mut times = Vec::with_capacity(reps);
    // Run 0 is the warm-up; its time is dropped.
    for run in 0..=reps {
        session.truncate(0, spec.depth)?;
        let t0 = Instant::now();
        let mut next = first_gen;
        if spec.n_prompt > 0 {
            let logits = session.prefill(0, &prompt)?;
            next = argmax(&logits).unwrap_or(0) as u32;
        }
        for _ in 0..spec.n_gen {
            next = session.decode_argmax(0, next)?;
        }
        let dt = t0.elapsed().as_secs_f64();
        if run > 0 {
            times.push(dt);
        }
    }
    session.truncate(0, 0)?;
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_bench() {
        let t = |p, g, d| TestSpec {
            n_prompt: p,
            n_gen: g,
            depth: d,
        };
        assert_eq!(t(512, 0, 0).name(), "pp512");
        assert_eq!(t(0, 128, 4096).name(), "tg128 @ d4096");
        assert_eq!(t(512, 128, 0).name(), "pp512+tg128");
        assert_eq!(t(512, 128, 7).ctx_needed(), 647);
    }

    #[test]
    fn matrix_order_and_zero_skipping() {
        let m = test_matrix(&[512, 0, 4096], &[128], &[0, 100]);
        let names: Vec<String> = m.iter().map(TestSpec::name).collect();
        assert_eq!(
            names,
            [
                "pp512",
                "pp4096",
                "tg128",
                "pp512 @ d100",
                "pp4096 @ d100",
                "tg128 @ d100"
            ]
        );
        assert!(test_matrix(&[0], &[0], &[0]).is_empty());
    }

    #[test]
    fn tokens_are_deterministic_and_in_range() {
        let a = bench_tokens(1000, 500, 7);
        assert_eq!(a, bench_tokens(1000, 500, 7));
        assert_ne!(a, bench_tokens(1000, 500, 8));
        assert!(a.iter().all(|&t| t < 1000));
        // Not degenerate: many distinct ids.
        let mut d = a.clone();
        d.sort_unstable();
        d.dedup();
        assert!(d.len() > 300, "{}", d.len());
    }

    #[test]
    fn param_labels() {
        assert_eq!(params_label(134_515_008), "135M");
        assert_eq!(params_label(751_632_384), "752M");
        assert_eq!(params_label(8_190_735_360), "8.2B");
        assert_eq!(params_label(1_000_000_000), "1.0B");
    }
}
