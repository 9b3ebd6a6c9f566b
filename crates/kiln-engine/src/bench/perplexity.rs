//! Perplexity the way llama-perplexity computes it, so the two tools' numbers can be set side by side:
//!
//! - The text is tokenized once, with BOS when the model's tokenizer adds one.
//! - It is cut into `n_windows = n_tokens / n_ctx` NON-overlapping windows of `n_ctx` tokens (the stride is
//!   `n_ctx`; the tail that does not fill a window is dropped). Each window is evaluated from an empty KV cache.
//! - When the tokenizer adds BOS, each window's first token is replaced by BOS (the text token there is only
//!   context, never scored).
//! - Only the second half is scored: the logits at window positions `first = n_ctx/2 ..= n_ctx − 2` predict
//!   the tokens at `first + 1 ..= n_ctx − 1`, i.e. `n_ctx − 1 − first` scored tokens per window, so every
//!   prediction has at least `n_ctx/2` tokens of context.
//! - `PPL = exp(mean NLL)`, and its error is llama-perplexity's: `ppl · sqrt((E[nll²] − E[nll]²) / (count − 1))`.
//!
//! [`score`] also writes top-K dumps in the [`crate::fidelity::LogitDump`] format (one text per window holding
//! the tokens from `first` on, with the window geometry in the metadata) and compares against such a dump.

use crate::bench::stats::Stats;
use crate::error::{Error, Result};
use crate::fidelity::{
    compare_position, log_sum_exp, FidelityStats, LogitDump, TeacherForced, TopK,
};
use crate::session::{Batch, BatchRow, Session};

/// How a token stream is cut into scored windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// Tokens per window.
    pub n_ctx: usize,
    /// Windows evaluated.
    pub n_windows: usize,
    /// First window position whose logits are scored (`n_ctx / 2`).
    pub first: usize,
}

impl WindowPlan {
    /// llama-perplexity's plan for `n_tokens` tokens: it requires at least two windows' worth of tokens.
    /// `max_windows` limits the count (`--chunks`).
    pub fn new(n_tokens: usize, n_ctx: usize, max_windows: Option<usize>) -> Result<WindowPlan> {
        if n_ctx < 4 {
            return Err(Error::Config(format!(
                "context {n_ctx} is too small to score (at least 4)"
            )));
        }
        if n_tokens < 2 * n_ctx {
            return Err(Error::Config(format!(
                "the text tokenizes to {n_tokens} tokens; scoring with a context of {n_ctx} needs at least {}",
                2 * n_ctx
            )));
        }
        let n = n_tokens / n_ctx;
        Ok(WindowPlan {
            n_ctx,
            n_windows: max_windows.map_or(n, |m| m.min(n)),
            first: n_ctx / 2,
        })
    }

    /// Tokens scored per window.
    pub fn scored_per_window(&self) -> usize {
        self.n_ctx - 1 - self.first
    }

    /// Window `i`'s tokens, its first token replaced by `bos` when given.
    pub fn window(&self, tokens: &[u32], i: usize, bos: Option<u32>) -> Vec<u32> {
        let mut w = tokens[i * self.n_ctx..(i + 1) * self.n_ctx].to_vec();
        if let Some(b) = bos {
            w[0] = b;
        }
        w
    }

    /// The sentence kiln score prints about its method.
    pub fn describe(&self, bos: bool) -> String {
        format!(
            "{} non-overlapping windows of {} tokens (stride {}), each from an empty cache{}; \
             scoring the second half of each window: positions {}..{} predict the next token ({} per window)",
            self.n_windows,
            self.n_ctx,
            self.n_ctx,
            if bos {
                ", its first token replaced by BOS"
            } else {
                ""
            },
            self.first,
            self.n_ctx - 2,
            self.scored_per_window()
        )
    }
}

/// `−ln softmax(logits)[target]`, in f64.
pub fn token_nll(logits: &[f32], target: u32) -> f64 {
    let x = logits
        .get(target as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY) as f64;
    log_sum_exp(logits) - x
}

/// Running sums of per-token negative log-likelihoods.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NllSum {
    /// Σ nll.
    pub sum: f64,
    /// Σ nll².
    pub sum2: f64,
    /// Tokens.
    pub count: usize,
}

impl NllSum {
    /// Adds one token's NLL.
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }
    /// `exp(mean NLL)`.
    pub fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }
    /// llama-perplexity's uncertainty of the PPL: `ppl · sqrt(var(nll) / (count − 1))` with the population
    /// variance `E[nll²] − E[nll]²` (NaN with fewer than two tokens or a non-positive variance).
    pub fn ppl_err(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum2 / n - mean * mean;
        if self.count < 2 || var <= 0.0 {
            return f64::NAN;
        }
        self.ppl() * (var / (n - 1.0)).sqrt()
    }
}

/// One scored sequence: its tokens and the first position whose logits are scored. Positions
/// `first..len − 1` predict the next token; for windows `first = n_ctx / 2`, for teacher-forced sequences 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScoreSeq {
    /// Input tokens (BOS substituted already where the method wants it).
    pub tokens: Vec<u32>,
    /// First scored logit position.
    pub first: usize,
}

/// A progress callback: `(sequences done, total, running NLL sums)`.
pub type ProgressFn<'a> = dyn FnMut(usize, usize, &NllSum) + 'a;

/// What [`score`] does besides summing NLLs.
#[derive(Default)]
pub struct ScoreOptions<'a> {
    /// Keep the top-K of every scored position (plus the last position's) for a dump.
    pub dump_k: Option<usize>,
    /// Compare every scored position with this reference (the same sequences, or more, with the same `first`).
    pub reference: Option<&'a LogitDump>,
    /// Called after each sequence with `(done, total, running NLL sums)`.
    pub progress: Option<&'a mut ProgressFn<'a>>,
}

/// Reference-comparison results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    /// KL, top-1 and |Δlogit| totals.
    pub fidelity: FidelityStats,
    /// Every position's KL (for the median and percentiles).
    pub kl: Vec<f64>,
    /// `p_test(next) − p_ref(next)` where the next token is among the reference's top-K (elsewhere the
    /// reference's probability of it is unknown).
    pub dp: Vec<f64>,
}

impl Comparison {
    /// Statistics of the per-position KL.
    pub fn kl_stats(&self) -> Stats {
        Stats::of(&self.kl)
    }
    /// Statistics of Δp.
    pub fn dp_stats(&self) -> Stats {
        Stats::of(&self.dp)
    }
    /// Root mean square of Δp (NaN when empty).
    pub fn dp_rms(&self) -> f64 {
        (self.dp.iter().map(|d| d * d).sum::<f64>() / self.dp.len() as f64).sqrt()
    }
}

/// The result of [`score`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScoreResult {
    /// NLL sums over the scored tokens.
    pub nll: NllSum,
    /// The top-K dump texts, when asked for (one per sequence: tokens from `first` on, one top-K each).
    pub dump: Vec<TeacherForced>,
    /// The comparison, when a reference was given.
    pub comparison: Option<Comparison>,
}

/// Top-1 margin at which a position counts as confident in [`FidelityStats`].
pub const CONFIDENT_MARGIN: f32 = 0.1;

/// Scores `seqs` on slot 0 of `session`, each from an empty cache, computing logits only where they are used.
pub fn score(
    session: &mut Session,
    seqs: &[ScoreSeq],
    mut opts: ScoreOptions,
) -> Result<ScoreResult> {
    if let Some(r) = opts.reference {
        // A reference of the whole text also serves a run limited to its first windows (`--chunks`).
        if r.texts.len() < seqs.len() {
            return Err(Error::Config(format!(
                "the reference dump holds {} sequences but {} are scored (same text and -c?)",
                r.texts.len(),
                seqs.len()
            )));
        }
    }
    let mut res = ScoreResult {
        comparison: opts.reference.map(|_| Comparison::default()),
        ..ScoreResult::default()
    };
    let chunk = session.config().batch;
    for (si, seq) in seqs.iter().enumerate() {
        let n = seq.tokens.len();
        if seq.first >= n {
            return Err(Error::Config(format!(
                "sequence {si}: first scored position {} is past its {n} tokens",
                seq.first
            )));
        }
        let reference = match opts.reference {
            Some(r) => {
                let t = &r.texts[si];
                if t.tokens[..] != seq.tokens[seq.first..] {
                    return Err(Error::Config(format!(
                        "sequence {si}: the reference dump's tokens differ from this text's"
                    )));
                }
                Some(t)
            }
            None => None,
        };
        let mut dumped = Vec::new();
        session.truncate(0, 0)?;
        for start in (0..n).step_by(chunk) {
            let end = (start + chunk).min(n);
            let batch = Batch {
                rows: (start..end)
                    .map(|p| BatchRow {
                        slot: 0,
                        pos: p,
                        token: seq.tokens[p],
                        logits: p >= seq.first,
                    })
                    .collect(),
                taps: Vec::new(),
                argmax_only: false,
                prefill: true,
                keep_taps: false,
            };
            let out = session.forward(&batch)?;
            for (i, &row) in out.rows.iter().enumerate() {
                let pos = start + row;
                let logits = out.row(i);
                if let Some(k) = opts.dump_k {
                    dumped.push(TopK::from_logits(logits, k));
                }
                let Some(&target) = seq.tokens.get(pos + 1) else {
                    continue; // the last position predicts past the sequence
                };
                res.nll.add(token_nll(logits, target));
                if let (Some(r), Some(c)) = (reference, res.comparison.as_mut()) {
                    let rk = &r.positions[pos - seq.first];
                    let m = compare_position(rk, logits);
                    c.fidelity.add(&m, CONFIDENT_MARGIN);
                    c.kl.push(m.kl);
                    if let Some(j) = rk.ids.iter().position(|&id| id == target) {
                        let p_ref = (rk.logits[j] as f64 - rk.lse as f64).exp();
                        let p_test = (-token_nll(logits, target)).exp();
                        c.dp.push(p_test - p_ref);
                    }
                }
            }
        }
        if opts.dump_k.is_some() {
            res.dump.push(TeacherForced {
                tokens: seq.tokens[seq.first..].to_vec(),
                positions: dumped,
            });
        }
        if let Some(p) = opts.progress.as_mut() {
            p(si + 1, seqs.len(), &res.nll);
        }
    }
    session.truncate(0, 0)?;
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_follows_llama_perplexity() {
        let p = WindowPlan::new(1100, 512, None).unwrap();
        assert_eq!((p.n_windows, p.first, p.scored_per_window()), (2, 256, 255));
        assert_eq!(WindowPlan::new(5000, 512, Some(3)).unwrap().n_windows, 3);
        assert!(WindowPlan::new(1023, 512, None).is_err());
        assert!(WindowPlan::new(100, 2, None).is_err());
        let toks: Vec<u32> = (100..1300).collect();
        assert_eq!(p.window(&toks, 1, Some(1))[..3], [1, 613, 614]);
        assert_eq!(p.window(&toks, 1, None)[0], 612);
        assert!(p.describe(true).contains("positions 256..510"));
    }

    #[test]
    fn nll_of_uniform_and_hand_case() {
        // Uniform over 4: −ln(1/4).
        assert!((token_nll(&[0.0; 4], 2) - 4f64.ln()).abs() < 1e-12);
        // logits [ln 1, ln 3] → p = [0.25, 0.75].
        let l = [0.0f32, 3f32.ln()];
        assert!((token_nll(&l, 1) - (-(0.75f64).ln())).abs() < 1e-6);
        assert!(token_nll(&l, 5).is_infinite());
    }

    #[test]
    fn ppl_and_error_formula() {
        let mut s = NllSum::default();
        for x in [1.0, 2.0, 3.0, 2.0] {
            s.add(x);
        }
        assert!((s.ppl() - 2f64.exp()).abs() < 1e-12);
        // E[nll²] = 18/4 = 4.5, E[nll]² = 4 → var 0.5; err = e² · sqrt(0.5 / 3).
        assert!((s.ppl_err() - 2f64.exp() * (0.5f64 / 3.0).sqrt()).abs() < 1e-12);
        let mut c = NllSum::default();
        c.add(1.0);
        c.add(1.0);
        assert!(c.ppl_err().is_nan());
    }
}
