//! Fidelity math: how close one engine's next-token distributions are to a reference's, from compact dumps.
//!
//! A reference dump keeps, per position, only the top-K logits (K = 64 in kiln's fixtures) and the log-sum-exp
//! of the FULL distribution. That is enough for:
//!
//! - **KL(ref ‖ test)** over K + 1 buckets: the reference's top-K tokens plus one "rest" bucket holding the
//!   remaining mass. With `p_i = exp(r_i − lse_r)` and `q_i = exp(t_i − lse_t)` for the reference's top-K ids
//!   `i` (`t` = the test's logits, `lse_t` over the test's full vocabulary),
//!   `p_rest = 1 − Σ p_i`, `q_rest = 1 − Σ q_i`:
//!
//!   `KL = Σ_i p_i · (ln p_i − ln q_i) + p_rest · (ln p_rest − ln q_rest)`
//!
//!   This is the exact KL divergence between the two distributions coarsened to those buckets, so it is ≥ 0 and
//!   never larger than the full-vocabulary KL (merging outcomes cannot increase a divergence). `p_rest` is
//!   computed as `−expm1(lse(top-K) − lse_r)` so that a tiny rest mass keeps its precision; `q_rest` is floored
//!   at `f64::MIN_POSITIVE` (a test that puts no mass where the reference puts some is infinitely far, and the
//!   floor keeps that visible as a huge but finite number).
//! - **top-1 agreement**: the test's argmax (lowest id on ties) equals the reference's first id.
//! - **max |Δlogit|** over the reference's top-K ids (raw logits: both engines compute the same LM head).
//! - **reference margin**: `r_0 − r_1`; on random-weight models, whose logits are nearly flat, top-1 is only
//!   meaningful where this margin is large (the gate counts top-1 only where it is ≥ 0.1).
//!
//! [`FidelityStats`] accumulates these over positions (mean/max KL, agreement counts, max |Δlogit|).
//! The dump container is [`LogitDump`] (its binary layout is documented there).

use std::fmt;

/// The reference's view of one position: top-K ids in descending logit order, their logits, and the full
/// distribution's log-sum-exp.
#[derive(Debug, Clone, PartialEq)]
pub struct TopK {
    /// Token ids, best first (ties broken by lower id).
    pub ids: Vec<u32>,
    /// The logits of `ids`, same order (non-increasing).
    pub logits: Vec<f32>,
    /// `ln Σ exp(logit)` over the whole vocabulary.
    pub lse: f32,
}

impl TopK {
    /// The top-`k` of a full logit vector (k is clamped to the vocabulary size).
    pub fn from_logits(full: &[f32], k: usize) -> TopK {
        let mut idx: Vec<u32> = (0..full.len() as u32).collect();
        let by = |a: &u32, b: &u32| {
            full[*b as usize]
                .total_cmp(&full[*a as usize])
                .then(a.cmp(b))
        };
        let k = k.min(full.len());
        if k > 0 && k < idx.len() {
            idx.select_nth_unstable_by(k - 1, by);
            idx.truncate(k);
        }
        idx.sort_unstable_by(by);
        let logits = idx.iter().map(|&i| full[i as usize]).collect();
        TopK {
            ids: idx,
            logits,
            lse: log_sum_exp(full) as f32,
        }
    }

    /// `logits[0] − logits[1]` (∞ when there is a single entry).
    pub fn margin(&self) -> f32 {
        match (self.logits.first(), self.logits.get(1)) {
            (Some(a), Some(b)) => a - b,
            _ => f32::INFINITY,
        }
    }
}

/// `ln Σ exp(x)`, in f64, stable for any range; −∞ for an empty or all −∞ input.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    if max == f64::NEG_INFINITY {
        return max;
    }
    let s: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + s.ln()
}

/// Index of the largest value, lowest index on ties, NaN skipped; `None` when there is no non-NaN value.
pub fn argmax(x: &[f32]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|b| v > x[b]) {
            best = Some(i);
        }
    }
    best
}

/// One position's comparison of a test distribution against the reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionMetrics {
    /// KL(ref ‖ test) over the reference's top-K + rest buckets (see the module docs).
    pub kl: f64,
    /// Whether the test's argmax equals the reference's top-1.
    pub top1_agree: bool,
    /// The test's argmax.
    pub test_top1: u32,
    /// max |test − ref| over the reference's top-K logits.
    pub max_abs_dlogit: f32,
    /// The reference's top-1 − top-2 logit gap.
    pub ref_margin: f32,
}

/// Compares the test engine's FULL logits at one position with the reference's top-K.
///
/// Ids of the reference outside the test's vocabulary count as −∞ logits there.
pub fn compare_position(reference: &TopK, test_logits: &[f32]) -> PositionMetrics {
    let lse_t = log_sum_exp(test_logits);
    let lse_r = reference.lse as f64;
    let mut kl = 0.0f64;
    let mut sum_q = 0.0f64;
    let mut max_d = 0.0f32;
    for (&id, &r) in reference.ids.iter().zip(&reference.logits) {
        let t = test_logits
            .get(id as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY);
        let d = (t - r).abs();
        max_d = if d.is_nan() { f32::NAN } else { max_d.max(d) };
        let lp = r as f64 - lse_r;
        let lq = t as f64 - lse_t;
        let p = lp.exp();
        sum_q += lq.exp();
        if p > 0.0 {
            kl += p * (lp - lq);
        }
    }
    let lse_top = log_sum_exp(&reference.logits);
    let p_rest = (-(lse_top - lse_r).exp_m1()).max(0.0);
    let q_rest = (1.0 - sum_q).max(f64::MIN_POSITIVE);
    if p_rest > 0.0 {
        kl += p_rest * (p_rest.ln() - q_rest.ln());
    }
    let test_top1 = argmax(test_logits).unwrap_or(0) as u32;
    PositionMetrics {
        // Rounding can leave a hair below zero when the distributions are identical.
        kl: kl.max(0.0),
        top1_agree: reference.ids.first() == Some(&test_top1),
        test_top1,
        max_abs_dlogit: max_d,
        ref_margin: reference.margin(),
    }
}

/// Running totals of [`PositionMetrics`] over many positions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FidelityStats {
    /// Positions seen.
    pub positions: usize,
    /// Positions where top-1 agreed.
    pub top1_agree: usize,
    /// Positions whose reference margin was ≥ the margin threshold given to [`FidelityStats::add`].
    pub confident: usize,
    /// Of those, positions where top-1 agreed.
    pub confident_top1_agree: usize,
    /// Σ KL.
    pub kl_sum: f64,
    /// max KL.
    pub kl_max: f64,
    /// max |Δlogit| over every position's reference top-K.
    pub max_abs_dlogit: f32,
}

impl FidelityStats {
    /// Adds one position; `margin_threshold` decides whether it also counts as a confident position.
    pub fn add(&mut self, m: &PositionMetrics, margin_threshold: f32) {
        self.positions += 1;
        self.top1_agree += m.top1_agree as usize;
        if m.ref_margin >= margin_threshold {
            self.confident += 1;
            self.confident_top1_agree += m.top1_agree as usize;
        }
        self.kl_sum += m.kl;
        self.kl_max = self.kl_max.max(m.kl);
        self.max_abs_dlogit = if m.max_abs_dlogit.is_nan() {
            f32::NAN
        } else {
            self.max_abs_dlogit.max(m.max_abs_dlogit)
        };
    }

    /// Fraction of positions with top-1 agreement (1 when there are none).
    pub fn top1_rate(&self) -> f64 {
        ratio(self.top1_agree, self.positions)
    }

    /// Top-1 agreement among confident positions (1 when there are none).
    pub fn confident_top1_rate(&self) -> f64 {
        ratio(self.confident_top1_agree, self.confident)
    }

    /// Mean KL (0 when there are no positions).
    pub fn mean_kl(&self) -> f64 {
        if self.positions == 0 {
            0.0
        } else {
            self.kl_sum / self.positions as f64
        }
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

impl fmt::Display for FidelityStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "positions {}, top-1 {}/{} ({:.2} %), confident top-1 {}/{} ({:.2} %), mean KL {:.3e}, max KL {:.3e}, \
             max |dlogit| {:.3e}",
            self.positions,
            self.top1_agree,
            self.positions,
            100.0 * self.top1_rate(),
            self.confident_top1_agree,
            self.confident,
            100.0 * self.confident_top1_rate(),
            self.mean_kl(),
            self.kl_max,
            self.max_abs_dlogit
        )
    }
}

/// Why a logit dump could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DumpError {
    /// The bytes do not start with the dump's magic.
    #[error("not a kiln logit dump (bad magic)")]
    BadMagic,
    /// A version this code does not read.
    #[error("logit dump version {0} is not supported (expected {DUMP_VERSION})")]
    Version(u32),
    /// The data ends before a field it announces.
    #[error("logit dump truncated at byte {offset} while reading {what}")]
    Truncated {
        /// Where the missing field starts.
        offset: usize,
        /// Which field.
        what: &'static str,
    },
    /// A field holds a value that makes no sense (a count too large, text that is not UTF-8, …).
    #[error("logit dump field {what} is invalid: {why}")]
    Invalid {
        /// Which field.
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// Reading or writing the file failed.
    #[error("logit dump {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The first 8 bytes of every dump.
pub const DUMP_MAGIC: &[u8; 8] = b"KILNTOPK";
/// The dump layout version this code reads and writes.
pub const DUMP_VERSION: u32 = 1;

/// One teacher-forced text: its token ids and, for every position `i`, the reference's top-K over the token
/// that follows `tokens[..=i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TeacherForced {
    /// The input token ids (BOS included if the model adds one).
    pub tokens: Vec<u32>,
    /// One entry per token, in order.
    pub positions: Vec<TopK>,
}

/// One greedy continuation by the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct GreedyCase {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// The reference's greedy tokens after the prompt.
    pub generated: Vec<u32>,
    /// The reference's top-1 − top-2 logit gap at each generated step (to report near-ties at divergences).
    pub margins: Vec<f32>,
}

/// A reference logit dump: free-form metadata (JSON text by convention: model, weights' sha256, producer),
/// teacher-forced top-K logits, and greedy continuations.
///
/// Binary layout, all integers and floats little-endian:
///
/// ```text
/// magic "KILNTOPK" | version u32 | meta_len u32 | meta (UTF-8) | k u32
/// n_texts u32 | per text:  n u32 | tokens u32 × n | n × (lse f32 | ids u32 × k | logits f32 × k)
/// n_greedy u32 | per case: n_prompt u32 | prompt u32 × n_prompt | n_gen u32 | generated u32 × n_gen | margins f32 × n_gen
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct LogitDump {
    /// Producer-defined metadata (JSON by convention).
    pub meta: String,
    /// Entries kept per position.
    pub k: usize,
    /// Teacher-forced texts.
    pub texts: Vec<TeacherForced>,
    /// Greedy continuations.
    pub greedy: Vec<GreedyCase>,
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], DumpError> {
        if n > self.b.len() - self.pos {
            return Err(DumpError::Truncated {
                offset: self.pos,
                what,
            });
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DumpError> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn f32(&mut self, what: &'static str) -> Result<f32, DumpError> {
        Ok(f32::from_bits(self.u32(what)?))
    }
    /// A count of `elem`-byte items that must fit in what is left (so a corrupt count cannot allocate wildly).
    fn count(&mut self, elem: usize, what: &'static str) -> Result<usize, DumpError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(elem) > self.b.len() - self.pos {
            return Err(DumpError::Invalid {
                what,
                why: format!(
                    "count {n} exceeds the {} bytes left",
                    self.b.len() - self.pos
                ),
            });
        }
        Ok(n)
    }
    fn u32s(&mut self, n: usize, what: &'static str) -> Result<Vec<u32>, DumpError> {
        (0..n).map(|_| self.u32(what)).collect()
    }
    fn f32s(&mut self, n: usize, what: &'static str) -> Result<Vec<f32>, DumpError> {
        (0..n).map(|_| self.f32(what)).collect()
    }
}

impl LogitDump {
    /// Parses a dump; every count is checked against the bytes left.
    pub fn from_bytes(b: &[u8]) -> Result<LogitDump, DumpError> {
        let mut c = Cursor { b, pos: 0 };
        if c.take(8, "magic").map_err(|_| DumpError::BadMagic)? != DUMP_MAGIC {
            return Err(DumpError::BadMagic);
        }
        let v = c.u32("version")?;
        if v != DUMP_VERSION {
            return Err(DumpError::Version(v));
        }
        let n = c.count(1, "meta length")?;
        let meta = std::str::from_utf8(c.take(n, "meta")?)
            .map_err(|e| DumpError::Invalid {
                what: "meta",
                why: e.to_string(),
            })?
            .to_owned();
        let k = c.u32("k")? as usize;
        let n_texts = c.count(4, "text count")?;
        let mut texts = Vec::with_capacity(n_texts);
        for _ in 0..n_texts {
            let n = c.count(4, "token count")?;
            let tokens = c.u32s(n, "tokens")?;
            let per_pos = 4 + 8usize.saturating_mul(k);
            if n.saturating_mul(per_pos) > b.len() - c.pos {
                return Err(DumpError::Truncated {
                    offset: c.pos,
                    what: "positions",
                });
            }
            let mut positions = Vec::with_capacity(n);
            for _ in 0..n {
                let lse = c.f32("lse")?;
                let ids = c.u32s(k, "top-k ids")?;
                let logits = c.f32s(k, "top-k logits")?;
                positions.push(TopK { ids, logits, lse });
            }
            texts.push(TeacherForced { tokens, positions });
        }
        let n_greedy = c.count(8, "greedy count")?;
        let mut greedy = Vec::with_capacity(n_greedy);
        for _ in 0..n_greedy {
            let n = c.count(4, "prompt length")?;
            let prompt = c.u32s(n, "prompt")?;
            let n = c.count(8, "generated length")?;
            let generated = c.u32s(n, "generated")?;
            let margins = c.f32s(n, "margins")?;
            greedy.push(GreedyCase {
                prompt,
                generated,
                margins,
            });
        }
        if c.pos != b.len() {
            return Err(DumpError::Invalid {
                what: "end",
                why: format!("{} trailing bytes", b.len() - c.pos),
            });
        }
        Ok(LogitDump {
            meta,
            k,
            texts,
            greedy,
        })
    }

    /// Reads a dump file.
    pub fn read(path: &std::path::Path) -> Result<LogitDump, DumpError> {
        let b = std::fs::read(path).map_err(|source| DumpError::Io {
            path: path.display().to_string(),
            source,
        })?;
        LogitDump::from_bytes(&b)
    }

    /// Serializes the dump. Every position must hold exactly `k` entries.
    pub fn to_bytes(&self) -> Result<Vec<u8>, DumpError> {
        fn len32(n: usize, what: &'static str) -> Result<[u8; 4], DumpError> {
            u32::try_from(n)
                .map(u32::to_le_bytes)
                .map_err(|_| DumpError::Invalid {
                    what,
                    why: format!("{n} does not fit in u32"),
                })
        }
        let mut o = Vec::new();
        o.extend_from_slice(DUMP_MAGIC);
        o.extend_from_slice(&DUMP_VERSION.to_le_bytes());
        o.extend_from_slice(&len32(self.meta.len(), "meta length")?);
        o.extend_from_slice(self.meta.as_bytes());
        o.extend_from_slice(&len32(self.k, "k")?);
        o.extend_from_slice(&len32(self.texts.len(), "text count")?);
        for t in &self.texts {
            if t.positions.len() != t.tokens.len() {
                return Err(DumpError::Invalid {
                    what: "positions",
                    why: format!(
                        "{} positions for {} tokens",
                        t.positions.len(),
                        t.tokens.len()
                    ),
                });
            }
            o.extend_from_slice(&len32(t.tokens.len(), "token count")?);
            t.tokens
                .iter()
                .for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
            for p in &t.positions {
                if p.ids.len() != self.k || p.logits.len() != self.k {
                    return Err(DumpError::Invalid {
                        what: "top-k",
                        why: format!(
                            "{} ids / {} logits, expected {}",
                            p.ids.len(),
                            p.logits.len(),
                            self.k
                        ),
                    });
                }
                o.extend_from_slice(&p.lse.to_le_bytes());
                p.ids
                    .iter()
                    .for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
                p.logits
                    .iter()
                    .for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
            }
        }
        o.extend_from_slice(&len32(self.greedy.len(), "greedy count")?);
        for g in &self.greedy {
            if g.margins.len() != g.generated.len() {
                return Err(DumpError::Invalid {
                    what: "margins",
                    why: format!(
                        "{} margins for {} tokens",
                        g.margins.len(),
                        g.generated.len()
                    ),
                });
            }
            o.extend_from_slice(&len32(g.prompt.len(), "prompt length")?);
            g.prompt
                .iter()
                .for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
            o.extend_from_slice(&len32(g.generated.len(), "generated length")?);
            g.generated
                .iter()
                .for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
            g.margins
                .iter()
                .for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) {
        assert!((a - b).abs() <= tol, "{a} vs {b}");
    }

    #[test]
    fn identical_distributions_have_zero_kl() {
        let full = [1.0f32, 3.0, -2.0, 0.5, 2.0];
        let r = TopK::from_logits(&full, 3);
        assert_eq!(r.ids, vec![1, 4, 0]);
        assert_eq!(r.logits, vec![3.0, 2.0, 1.0]);
        let m = compare_position(&r, &full);
        close(m.kl, 0.0, 1e-12);
        assert!(m.top1_agree);
        assert_eq!(m.max_abs_dlogit, 0.0);
        assert_eq!(m.ref_margin, 1.0);
        // A constant shift changes no probability: KL stays 0, Δlogit shows the shift.
        let shifted: Vec<f32> = full.iter().map(|x| x + 0.5).collect();
        let m = compare_position(&r, &shifted);
        close(m.kl, 0.0, 1e-12);
        assert_eq!(m.max_abs_dlogit, 0.5);
    }

    #[test]
    fn kl_matches_a_hand_computed_case() {
        // Reference p = (0.5, 0.25, 0.25) over 3 tokens, top-2 kept, rest = 0.25.
        // Test q = (0.25, 0.25, 0.5): buckets (0.25, 0.25, rest 0.5).
        // KL = 0.5 ln 2 + 0.25 ln 1 + 0.25 ln 0.5 = 0.25 ln 2.
        let reference = TopK::from_logits(&[0.5f32.ln(), 0.25f32.ln(), 0.25f32.ln()], 2);
        assert_eq!(reference.ids, vec![0, 1]);
        close(reference.lse as f64, 0.0, 1e-7);
        let test = [0.25f32.ln(), 0.25f32.ln(), 0.5f32.ln()];
        let m = compare_position(&reference, &test);
        close(m.kl, 0.25 * 2f64.ln(), 1e-6);
        // Test argmax is token 2, not the reference's token 0.
        assert!(!m.top1_agree);
        assert_eq!(m.test_top1, 2);
        close(m.max_abs_dlogit as f64, 2f64.ln(), 1e-6);
    }

    #[test]
    fn rest_bucket_hides_differences_inside_it() {
        // Same mass on the top-1, different split of the rest: the coarsened KL is 0 (by design).
        let a = [2.0f32, 0.0, -1.0];
        let la = log_sum_exp(&a) as f32;
        let pa1 = (0.0f32 - la).exp() + (-1.0f32 - la).exp();
        let p0 = (2.0f32 - la).exp();
        // b: token 0 keeps p0, tokens 1 and 2 split the rest equally.
        let rest = (pa1 / 2.0).ln();
        let b = [p0.ln(), rest, rest];
        let r = TopK::from_logits(&a, 1);
        close(compare_position(&r, &b).kl, 0.0, 1e-6);
        // With top-2 kept, the split is visible: p = (p0, pa_1, pa_2) vs q = (p0, pa1/2, rest).
        let r2 = TopK::from_logits(&a, 2);
        let p1 = (0.0f32 - la).exp() as f64;
        let p2 = (-1.0f32 - la).exp() as f64;
        let q = pa1 as f64 / 2.0;
        let want = p1 * (p1 / q).ln() + p2 * (p2 / q).ln();
        close(compare_position(&r2, &b).kl, want, 1e-6);
    }

    #[test]
    fn stats_accumulate_and_gate_on_margin() {
        let mut s = FidelityStats::default();
        let m = |kl, agree, d, margin| PositionMetrics {
            kl,
            top1_agree: agree,
            test_top1: 0,
            max_abs_dlogit: d,
            ref_margin: margin,
        };
        s.add(&m(0.1, true, 0.5, 0.05), 0.1);
        s.add(&m(0.3, false, 0.2, 0.5), 0.1);
        s.add(&m(0.2, true, 0.1, 0.1), 0.1);
        assert_eq!(s.positions, 3);
        assert_eq!(s.top1_agree, 2);
        assert_eq!((s.confident, s.confident_top1_agree), (2, 1));
        close(s.mean_kl(), 0.2, 1e-12);
        close(s.kl_max, 0.3, 1e-12);
        assert_eq!(s.max_abs_dlogit, 0.5);
        close(s.confident_top1_rate(), 0.5, 1e-12);
        assert!(s.to_string().contains("top-1 2/3"));
    }

    fn sample_dump() -> LogitDump {
        let full = [0.5f32, -1.0, 2.0, 0.25];
        LogitDump {
            meta: r#"{"model":"x"}"#.into(),
            k: 2,
            texts: vec![TeacherForced {
                tokens: vec![3, 1],
                positions: vec![
                    TopK::from_logits(&full, 2),
                    TopK::from_logits(&[1.0, 0.0, 0.0, 0.0], 2),
                ],
            }],
            greedy: vec![GreedyCase {
                prompt: vec![1, 2, 3],
                generated: vec![0, 2],
                margins: vec![0.5, 1.5],
            }],
        }
    }

    #[test]
    fn dump_round_trips_and_rejects_damage() {
        let d = sample_dump();
        let b = d.to_bytes().unwrap();
        assert_eq!(LogitDump::from_bytes(&b).unwrap(), d);
        for cut in [0, 7, 12, b.len() - 1] {
            assert!(
                LogitDump::from_bytes(&b[..cut]).is_err(),
                "cut at {cut} accepted"
            );
        }
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(matches!(
            LogitDump::from_bytes(&bad),
            Err(DumpError::BadMagic)
        ));
        let mut bad = b.clone();
        bad[8] = 9;
        assert!(matches!(
            LogitDump::from_bytes(&bad),
            Err(DumpError::Version(9))
        ));
        // A huge text count must be refused before any allocation.
        let mut bad = b.clone();
        let at = 8 + 4 + 4 + d.meta.len() + 4;
        bad[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            LogitDump::from_bytes(&bad),
            Err(DumpError::Invalid { .. })
        ));
        let mut extra = b;
        extra.push(0);
        assert!(LogitDump::from_bytes(&extra).is_err());
        let mut wrong_k = d;
        wrong_k.k = 3;
        assert!(wrong_k.to_bytes().is_err());
    }

    #[test]
    fn argmax_and_lse_edge_cases() {
        assert_eq!(argmax(&[]), None);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, 1.0]), Some(1));
        assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
        close(log_sum_exp(&[1000.0, 1000.0]), 1000.0 + 2f64.ln(), 1e-9);
    }
}
