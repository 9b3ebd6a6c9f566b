//! Frontier mode (ds4-bench's): grow one sequence through context "frontiers" (e.g. 2048, 8192, 32768),
//! prefilling only the new interval up to each frontier (timed), then decoding N tokens there (timed), then
//! rolling the KV state back to the frontier (untimed) so the decoded tokens do not become part of the next
//! prefill. The rollback is [`Session::truncate`]: positions past a slot's length are never read and are
//! overwritten by the next prefill, so it restores exactly the state a snapshot would have saved.
//!
//! Full-vocabulary logits at each frontier (the prediction after the frontier's last prompt token) can be
//! written as [`FrontierLogits`] files: byte-identical files before/after a change prove the change exact.

use crate::error::{Error, Result};
use crate::fidelity::argmax;
use crate::session::Session;
use std::time::Instant;

/// The frontiers from `start` to `max`: `start, start·mul, start·mul², …` below `max`, then `max` itself.
/// `2048, 32768, ×4` → `[2048, 8192, 32768]`; `1000, 5000, ×4` → `[1000, 4000, 5000]`.
pub fn frontiers(start: usize, max: usize, mul: usize) -> Result<Vec<usize>> {
    if start == 0 || start > max || mul < 2 {
        return Err(Error::Config(format!(
            "frontiers need 0 < ctx-start ≤ ctx-max and step-mul ≥ 2 (got start {start}, max {max}, mul {mul})"
        )));
    }
    let mut v = Vec::new();
    let mut f = start;
    while f < max {
        v.push(f);
        f = f.saturating_mul(mul);
    }
    v.push(max);
    Ok(v)
}

/// Prompt tokens a frontier run consumes: up to the last frontier, plus the decoded tokens when they are
/// teacher-forced (taken from the prompt after the frontier).
pub fn prompt_tokens_needed(frontiers: &[usize], gen_tokens: usize, teacher_forced: bool) -> usize {
    frontiers.last().copied().unwrap_or(0) + if teacher_forced { gen_tokens } else { 0 }
}

/// One frontier's measurements (ds4-bench's CSV columns plus the timings they come from).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FrontierRecord {
    /// Tokens in the context at the frontier.
    pub ctx_tokens: usize,
    /// Tokens prefilled to reach it from the previous frontier.
    pub prefill_tokens: usize,
    /// Seconds of that prefill.
    pub prefill_s: f64,
    /// Tokens decoded after the frontier.
    pub gen_tokens: usize,
    /// Seconds of the whole decode.
    pub gen_s: f64,
    /// Seconds of the first decode step.
    pub gen_first_s: f64,
    /// KV cache bytes in use at the frontier (keys and values, every layer).
    pub kvcache_bytes: u64,
}

impl FrontierRecord {
    /// Prefill tokens per second.
    pub fn prefill_tps(&self) -> f64 {
        self.prefill_tokens as f64 / self.prefill_s
    }
    /// Decode tokens per second, first step included.
    pub fn gen_tps(&self) -> f64 {
        self.gen_tokens as f64 / self.gen_s
    }
    /// Milliseconds of the first decode step.
    pub fn gen_first_ms(&self) -> f64 {
        self.gen_first_s * 1e3
    }
    /// Decode steps after the first.
    pub fn gen_steady_tokens(&self) -> usize {
        self.gen_tokens.saturating_sub(1)
    }
    /// Tokens per second of the steps after the first (NaN with fewer than two decoded tokens).
    pub fn gen_steady_tps(&self) -> f64 {
        if self.gen_tokens < 2 {
            f64::NAN
        } else {
            self.gen_steady_tokens() as f64 / (self.gen_s - self.gen_first_s)
        }
    }
}

/// Settings of a frontier run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontierOptions {
    /// Ascending frontiers (see [`frontiers`]).
    pub frontiers: Vec<usize>,
    /// Tokens decoded at each frontier.
    pub gen_tokens: usize,
    /// Decode the prompt's next tokens instead of the argmax (the same work in every run, for A/B).
    pub teacher_forced: bool,
    /// KV cache bytes per position (`kv_bytes(model, type, 1)`), to report `kvcache_bytes`.
    pub kv_bytes_per_pos: u64,
}

/// Runs the frontiers on slot 0 of an empty `session` over `prompt`. `on_logits(ctx_tokens, logits)` receives
/// the full logits after each frontier's last prompt token (untimed). A short untimed warm-up (one prefill
/// chunk and one decode step) runs first.
pub fn run_frontiers(
    session: &mut Session,
    prompt: &[u32],
    opts: &FrontierOptions,
    on_logits: &mut dyn FnMut(usize, &[f32]) -> Result<()>,
) -> Result<Vec<FrontierRecord>> {
    let need = prompt_tokens_needed(&opts.frontiers, opts.gen_tokens, opts.teacher_forced);
    if prompt.len() < need {
        return Err(Error::Config(format!(
            "frontier run needs {need} prompt tokens, got {}",
            prompt.len()
        )));
    }
    let last = opts.frontiers.last().copied().unwrap_or(0);
    if last + opts.gen_tokens > session.slot_ctx() {
        return Err(Error::Config(format!(
            "frontier {last} plus {} decoded tokens exceeds the session's {} positions",
            opts.gen_tokens,
            session.slot_ctx()
        )));
    }
    if opts.frontiers.windows(2).any(|w| w[0] >= w[1]) || opts.frontiers.first() == Some(&0) {
        return Err(Error::Config(format!(
            "frontiers must be positive and ascending: {:?}",
            opts.frontiers
        )));
    }
    session.truncate(0, 0)?;
    let warm = session.config().batch.min(last).max(1);
    let l = session.prefill(0, &prompt[..warm.min(prompt.len())])?;
    session.decode(0, argmax(&l).unwrap_or(0) as u32)?;
    session.truncate(0, 0)?;

    let mut out = Vec::with_capacity(opts.frontiers.len());
    let mut prev = 0;
    for &f in &opts.frontiers {
        let t0 = Instant::now();
        let logits = session.prefill(0, &prompt[prev..f])?;
        let prefill_s = t0.elapsed().as_secs_f64();
        on_logits(f, &logits)?;
        let mut next = if opts.teacher_forced {
            prompt[f]
        } else {
            argmax(&logits).unwrap_or(0) as u32
        };
        let t1 = Instant::now();
        let mut gen_first_s = 0.0;
        for i in 0..opts.gen_tokens {
            // The greedy token is chosen where the logits are (a GPU reads back 4 bytes, not the vocabulary).
            let chosen = session.decode_argmax(0, next)?;
            if i == 0 {
                gen_first_s = t1.elapsed().as_secs_f64();
            }
            next = if opts.teacher_forced {
                // Stays in range: the prompt holds `last + gen_tokens` tokens.
                prompt[(f + i + 1).min(prompt.len() - 1)]
            } else {
                chosen
            };
        }
        let gen_s = t1.elapsed().as_secs_f64();
        session.truncate(0, f)?;
        out.push(FrontierRecord {
            ctx_tokens: f,
            prefill_tokens: f - prev,
            prefill_s,
            gen_tokens: opts.gen_tokens,
            gen_s,
            gen_first_s,
            kvcache_bytes: opts.kv_bytes_per_pos * f as u64,
        });
        prev = f;
    }
    session.truncate(0, 0)?;
    Ok(out)
}

/// The first 8 bytes of a frontier logits file.
pub const FRONTIER_LOGITS_MAGIC: &[u8; 8] = b"KILNFLOG";
/// The frontier logits layout version.
pub const FRONTIER_LOGITS_VERSION: u32 = 1;

/// Full-vocabulary logits at one frontier.
///
/// File layout (little-endian, 24-byte header then the logits):
///
/// ```text
/// magic "KILNFLOG" | version u32 | n_vocab u32 | ctx_tokens u64 | logits f32 × n_vocab
/// ```
///
/// `logits[i]` is the raw (unnormalized) logit of token `i` after the first `ctx_tokens` prompt tokens.
/// `kiln bench --dump-frontier-logits-dir DIR` writes one `frontier-<ctx_tokens>.logits` per frontier.
#[derive(Clone, Debug, PartialEq)]
pub struct FrontierLogits {
    /// Tokens in the context.
    pub ctx_tokens: u64,
    /// One logit per vocabulary entry.
    pub logits: Vec<f32>,
}

impl FrontierLogits {
    /// The file name kiln uses for a frontier.
    pub fn file_name(ctx_tokens: usize) -> String {
        format!("frontier-{ctx_tokens}.logits")
    }

    /// Serializes to the layout above.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let n = u32::try_from(self.logits.len()).map_err(|_| {
            Error::Config(format!(
                "{} logits do not fit a u32 count",
                self.logits.len()
            ))
        })?;
        let mut o = Vec::with_capacity(24 + 4 * self.logits.len());
        o.extend_from_slice(FRONTIER_LOGITS_MAGIC);
        o.extend_from_slice(&FRONTIER_LOGITS_VERSION.to_le_bytes());
        o.extend_from_slice(&n.to_le_bytes());
        o.extend_from_slice(&self.ctx_tokens.to_le_bytes());
        for x in &self.logits {
            o.extend_from_slice(&x.to_le_bytes());
        }
        Ok(o)
    }

    /// Parses the layout above; the size must match the header exactly.
    pub fn from_bytes(b: &[u8]) -> Result<FrontierLogits> {
        let bad = |why: String| Error::Config(format!("frontier logits file: {why}"));
        if b.len() < 24 || &b[..8] != FRONTIER_LOGITS_MAGIC {
            return Err(bad("bad magic or shorter than its 24-byte header".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let version = u32_at(8);
        if version != FRONTIER_LOGITS_VERSION {
            return Err(bad(format!("version {version} is not supported")));
        }
        let n = u32_at(12) as usize;
        let mut ctx = [0u8; 8];
        ctx.copy_from_slice(&b[16..24]);
        if b.len() - 24 != n * 4 {
            return Err(bad(format!(
                "header says {n} logits but {} bytes follow it",
                b.len() - 24
            )));
        }
        Ok(FrontierLogits {
            ctx_tokens: u64::from_le_bytes(ctx),
            logits: b[24..]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontier_arithmetic() {
        assert_eq!(frontiers(2048, 32768, 4).unwrap(), [2048, 8192, 32768]);
        assert_eq!(frontiers(1000, 5000, 4).unwrap(), [1000, 4000, 5000]);
        assert_eq!(frontiers(64, 64, 2).unwrap(), [64]);
        assert_eq!(frontiers(3, 40, 3).unwrap(), [3, 9, 27, 40]);
        assert!(frontiers(0, 10, 2).is_err());
        assert!(frontiers(20, 10, 2).is_err());
        assert!(frontiers(2, 10, 1).is_err());
        // No overflow near usize::MAX.
        assert_eq!(
            frontiers(usize::MAX / 2, usize::MAX, 4).unwrap(),
            [usize::MAX / 2, usize::MAX]
        );
        assert_eq!(prompt_tokens_needed(&[16, 64], 8, false), 64);
        assert_eq!(prompt_tokens_needed(&[16, 64], 8, true), 72);
    }

    #[test]
    fn record_rates() {
        let r = FrontierRecord {
            ctx_tokens: 64,
            prefill_tokens: 48,
            prefill_s: 0.5,
            gen_tokens: 5,
            gen_s: 1.0,
            gen_first_s: 0.2,
            kvcache_bytes: 1,
        };
        assert_eq!(r.prefill_tps(), 96.0);
        assert_eq!(r.gen_tps(), 5.0);
        assert!((r.gen_first_ms() - 200.0).abs() < 1e-9);
        assert_eq!(r.gen_steady_tokens(), 4);
        assert!((r.gen_steady_tps() - 5.0).abs() < 1e-12);
        let one = FrontierRecord { gen_tokens: 1, ..r };
        assert!(one.gen_steady_tps().is_nan());
    }

    #[test]
    fn logits_file_round_trip_and_rejects() {
        let f = FrontierLogits {
            ctx_tokens: 8192,
            logits: vec![1.0, -2.5, f32::MIN_POSITIVE],
        };
        let b = f.to_bytes().unwrap();
        assert_eq!(b.len(), 24 + 12);
        assert_eq!(&b[..8], b"KILNFLOG");
        assert_eq!(FrontierLogits::from_bytes(&b).unwrap(), f);
        assert!(FrontierLogits::from_bytes(&b[..30]).is_err());
        assert!(FrontierLogits::from_bytes(&b[..10]).is_err());
        let mut v = b.clone();
        v[8] = 9;
        assert!(FrontierLogits::from_bytes(&v).is_err());
        assert_eq!(FrontierLogits::file_name(2048), "frontier-2048.logits");
    }
}
