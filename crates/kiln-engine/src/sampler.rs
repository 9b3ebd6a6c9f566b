//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition/presence/frequency penalties, seeded.
//!
//! Order of operations (llama.cpp's default chain, so the same flags mean the same thing in both engines):
//!
//! 1. **penalties** over the last `repeat_last_n` tokens of the history: for a token seen `c > 0` times,
//!    `logit = logit > 0 ? logit / repeat_penalty : logit * repeat_penalty`, then
//!    `logit -= c * frequency_penalty + presence_penalty`;
//! 2. **top-k**: keep the `top_k` highest logits (`0` = off);
//! 3. **top-p**: keep the smallest prefix of the descending candidates whose probability mass (softmax of the
//!    candidates left, at temperature 1) reaches `top_p` (`1.0` = off);
//! 4. **min-p**: keep candidates whose probability is at least `min_p` times the largest one (`0.0` = off);
//! 5. **temperature**: divide the logits by `temperature`;
//! 6. **sample** from the softmax of what is left, with a ChaCha20 generator seeded by `seed`.
//!
//! `temperature == 0` is greedy: penalties are still applied, then the argmax is taken (lowest id on ties), and
//! no random number is drawn. Truncation steps always keep at least one token.
//!
//! Determinism: the same params, logits and history give the same tokens on every platform. The generator is
//! `rand_chacha::ChaCha20Rng` (a fixed, documented algorithm, unlike `StdRng`), and each draw turns one `u64`
//! into a uniform `f64` by hand, so no rand-version-dependent conversion is involved.
//!
//! The sampler owns its scratch buffers: after the first call at a given vocabulary size it allocates nothing.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Why a [`SamplerParams`] value was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SamplerError {
    /// A parameter is outside its valid range (or NaN/infinite).
    #[error("invalid sampling parameter {name} = {value}: {expected}")]
    InvalidParam {
        /// The parameter's name (as in [`SamplerParams`]).
        name: &'static str,
        /// The rejected value, printed.
        value: String,
        /// What a valid value looks like.
        expected: &'static str,
    },
}

/// Sampling settings. [`SamplerParams::default`] is llama.cpp's default set (temperature 0.8, top-k 40,
/// top-p 0.95, min-p 0.05, no penalties); [`SamplerParams::greedy`] is argmax.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Softmax temperature; `0` means greedy. Must be finite and ≥ 0.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Nucleus sampling mass in (0, 1]; `1.0` disables.
    pub top_p: f32,
    /// Keep tokens with probability ≥ `min_p` × the top probability; in [0, 1], `0` disables.
    pub min_p: f32,
    /// Multiplicative repetition penalty (> 0); `1.0` disables.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalties look at; `0` disables all penalties.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token present in the window (finite, any sign).
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token in the window (finite, any sign).
    pub frequency_penalty: f32,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// Pure argmax, no penalties.
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerParams::default()
        }
    }

    /// Whether these params pick the argmax (no randomness involved).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every field's range; the error names the field and its value.
    pub fn validate(&self) -> Result<(), SamplerError> {
        fn bad(name: &'static str, value: f32, expected: &'static str) -> SamplerError {
            SamplerError::InvalidParam {
                name,
                value: value.to_string(),
                expected,
            }
        }
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(bad("temperature", t, "a finite number >= 0 (0 = greedy)"));
        }
        let p = self.top_p;
        if !p.is_finite() || p <= 0.0 || p > 1.0 {
            return Err(bad("top_p", p, "a number in (0, 1] (1 = off)"));
        }
        let m = self.min_p;
        if !m.is_finite() || !(0.0..=1.0).contains(&m) {
            return Err(bad("min_p", m, "a number in [0, 1] (0 = off)"));
        }
        let r = self.repeat_penalty;
        if !r.is_finite() || r <= 0.0 {
            return Err(bad("repeat_penalty", r, "a finite number > 0 (1 = off)"));
        }
        if !self.presence_penalty.is_finite() {
            return Err(bad(
                "presence_penalty",
                self.presence_penalty,
                "a finite number (0 = off)",
            ));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(bad(
                "frequency_penalty",
                self.frequency_penalty,
                "a finite number (0 = off)",
            ));
        }
        Ok(())
    }

    /// Whether a draw is the plain argmax of the logits ([`greedy_argmax`]): greedy with no penalties, so the
    /// choice needs no history and can be made where the logits are (on the GPU).
    pub fn is_plain_argmax(&self) -> bool {
        self.is_greedy() && !self.penalties_active()
    }

    fn penalties_active(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// A seeded sampler with reusable scratch buffers. One per sequence: its random stream advances per draw.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    rng: ChaCha20Rng,
    /// `(token id, logit)` candidates; vocab-sized, reused across calls.
    cand: Vec<(u32, f32)>,
    /// The penalty window, sorted, to count occurrences; at most `repeat_last_n` long.
    window: Vec<u32>,
}

impl Sampler {
    /// A sampler for `params` (validated first).
    pub fn new(params: SamplerParams) -> Result<Self, SamplerError> {
        params.validate()?;
        let rng = ChaCha20Rng::seed_from_u64(params.seed);
        Ok(Sampler {
            params,
            rng,
            cand: Vec::new(),
            window: Vec::new(),
        })
    }

    /// The params this sampler was built with.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Picks the next token from `logits` (one per vocabulary entry), given the tokens so far (`history`, prompt
    /// included; only its last `repeat_last_n` entries matter). NaN logits count as −∞; history ids outside the
    /// vocabulary are ignored.
    ///
    /// # Panics
    /// If `logits` is empty (a model always has a vocabulary) or longer than `u32::MAX`.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        assert!(
            !logits.is_empty(),
            "sampler called with an empty logit vector"
        );
        let n = u32::try_from(logits.len()).expect("vocabulary larger than u32 ids");
        self.cand.clear();
        self.cand.extend(
            (0..n)
                .zip(logits.iter().copied())
                .map(|(i, l)| (i, if l.is_nan() { f32::NEG_INFINITY } else { l })),
        );
        if self.params.penalties_active() {
            self.apply_penalties(history);
        }
        if self.params.is_greedy() {
            return argmax(&self.cand);
        }
        // `sorted` says whether `cand` is already in descending logit order (top-p needs that order).
        let mut sorted = false;
        if self.params.top_k > 0 && self.params.top_k < self.cand.len() {
            top_k_sorted(&mut self.cand, self.params.top_k);
            sorted = true;
        }
        if self.params.top_p < 1.0 {
            top_p(&mut self.cand, self.params.top_p, sorted);
        }
        if self.params.min_p > 0.0 {
            min_p(&mut self.cand, self.params.min_p);
        }
        let inv_t = 1.0 / self.params.temperature;
        let u = unit_f64(self.rng.next_u64());
        draw(&self.cand, inv_t, u)
    }

    fn apply_penalties(&mut self, history: &[u32]) {
        let p = &self.params;
        let start = history.len().saturating_sub(p.repeat_last_n);
        self.window.clear();
        self.window.extend_from_slice(&history[start..]);
        self.window.sort_unstable();
        let mut i = 0;
        while i < self.window.len() {
            let tok = self.window[i];
            let mut j = i;
            while j < self.window.len() && self.window[j] == tok {
                j += 1;
            }
            let count = (j - i) as f32;
            // Before any truncation `cand[id].0 == id`, so the id indexes directly.
            if let Some(c) = self.cand.get_mut(tok as usize) {
                let l = &mut c.1;
                *l = if *l > 0.0 {
                    *l / p.repeat_penalty
                } else {
                    *l * p.repeat_penalty
                };
                *l -= count * p.frequency_penalty + p.presence_penalty;
            }
            i = j;
        }
    }
}

/// The greedy choice over raw logits: the largest, lowest id on ties, NaN treated as -inf (0 when nothing beats
/// -inf). The same token as a greedy [`Sampler`] without penalties; backends compute it in place
/// ([`crate::backend::Backend::argmax_rows`]).
pub fn greedy_argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate().skip(1) {
        if v > logits[best] || (logits[best].is_nan() && v > f32::NEG_INFINITY) {
            best = i;
        }
    }
    best as u32
}

/// Argmax of the candidates, lowest id on ties (candidates are in id order here).
fn argmax(cand: &[(u32, f32)]) -> u32 {
    let mut best = cand[0];
    for &c in &cand[1..] {
        if c.1 > best.1 {
            best = c;
        }
    }
    best.0
}

/// Descending by logit, then ascending by id, so the order (and thus the draw) is fully determined.
fn desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Keeps the `k` best candidates (`0 < k < len`), sorted descending.
fn top_k_sorted(cand: &mut Vec<(u32, f32)>, k: usize) {
    cand.select_nth_unstable_by(k - 1, desc);
    cand.truncate(k);
    cand.sort_unstable_by(desc);
}

/// Nucleus truncation. When `cand` is not yet sorted, only as large a prefix as needed is sorted: a prefix of
/// 64, 512, 4096, … candidates is selected and sorted until its mass (against the normalizer of all
/// candidates) reaches `p`, so a 150k vocabulary is rarely sorted in full.
fn top_p(cand: &mut Vec<(u32, f32)>, p: f32, sorted: bool) {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    let z: f64 = cand.iter().map(|c| ((c.1 - max) as f64).exp()).sum();
    let target = p as f64 * z;
    let mut k = if sorted {
        cand.len()
    } else {
        64.min(cand.len())
    };
    loop {
        if !sorted {
            if k < cand.len() {
                cand.select_nth_unstable_by(k - 1, desc);
            }
            cand[..k].sort_unstable_by(desc);
        }
        let mut cum = 0.0f64;
        for i in 0..k {
            cum += ((cand[i].1 - max) as f64).exp();
            if cum >= target {
                cand.truncate(i + 1);
                return;
            }
        }
        if k == cand.len() {
            return; // rounding left the total a hair under `target`: keep everything
        }
        k = (k * 8).min(cand.len());
    }
}

/// Keeps candidates with `prob >= min_p * max_prob`, i.e. `logit >= max_logit + ln(min_p)`. Keeps the order.
fn min_p(cand: &mut Vec<(u32, f32)>, min_p: f32) {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    let cut = max + min_p.ln();
    cand.retain(|c| c.1 >= cut);
}

/// A uniform number in [0, 1) from the top 53 bits of `x`.
fn unit_f64(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Inverse-CDF draw from softmax(logit · inv_t) over the candidates, with uniform `u` in [0, 1).
fn draw(cand: &[(u32, f32)], inv_t: f32, u: f64) -> u32 {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        // Every logit is −∞ (or NaN): no distribution to draw from; fall back to the first candidate.
        return cand.iter().map(|c| c.0).min().unwrap_or(0);
    }
    let w = |l: f32| (((l - max) * inv_t) as f64).exp();
    let z: f64 = cand.iter().map(|c| w(c.1)).sum();
    let target = u * z;
    let mut cum = 0.0f64;
    let mut last = cand[0].0;
    for c in cand {
        let wi = w(c.1);
        if wi == 0.0 {
            continue;
        }
        cum += wi;
        last = c.0;
        if target < cum {
            return c.0;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplerParams {
        SamplerParams {
            temperature: t,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 42,
        }
    }

    #[test]
    fn greedy_picks_argmax_and_lowest_id_on_ties() {
        let mut s = Sampler::new(SamplerParams::greedy()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -2.0, 2.9], &[]), 1);
        assert_eq!(s.sample(&[1.0, 5.0, 5.0, 5.0], &[]), 1);
        assert_eq!(s.sample(&[7.0, 7.0], &[]), 0);
        assert_eq!(s.sample(&[f32::NAN, -1.0, f32::NAN], &[]), 1);
    }

    #[test]
    fn greedy_argmax_is_the_greedy_samplers_choice() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let specials = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 0.0, 1.0];
        for case in 0..500 {
            let n = 1 + case % 9;
            // Few distinct values, so ties, NaN and infinities are common.
            let logits: Vec<f32> = (0..n)
                .map(|_| match rng.next_u64() % 8 {
                    k @ 0..=4 => specials[k as usize],
                    k => k as f32,
                })
                .collect();
            let want = Sampler::new(SamplerParams::greedy())
                .unwrap()
                .sample(&logits, &[]);
            assert_eq!(greedy_argmax(&logits), want, "{logits:?}");
        }
        assert!(SamplerParams::greedy().is_plain_argmax());
        let mut p = SamplerParams::greedy();
        p.repeat_penalty = 1.1;
        assert!(!p.is_plain_argmax());
    }

    #[test]
    fn top_k_one_equals_greedy_at_any_temperature() {
        let mut rngs = ChaCha20Rng::seed_from_u64(7);
        for seed in 0..20 {
            let logits: Vec<f32> = (0..100)
                .map(|_| (unit_f64(rngs.next_u64()) * 10.0) as f32)
                .collect();
            let want = Sampler::new(SamplerParams::greedy())
                .unwrap()
                .sample(&logits, &[]);
            let mut p = params(1.5);
            p.top_k = 1;
            p.seed = seed;
            assert_eq!(Sampler::new(p).unwrap().sample(&logits, &[]), want);
        }
    }

    /// The set of tokens a sampler can return, found by trying many seeds.
    fn support(p: &SamplerParams, logits: &[f32], history: &[u32]) -> Vec<u32> {
        let mut s = Sampler::new(p.clone()).unwrap();
        let mut seen: Vec<u32> = (0..2000).map(|_| s.sample(logits, history)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_the_mass() {
        // probs 0.5, 0.25, 0.125, 0.125 (ids shuffled so sorting matters).
        let l = [0.125f32.ln(), 0.5f32.ln(), 0.125f32.ln(), 0.25f32.ln()];
        let mut p = params(1.0);
        p.top_p = 0.5;
        assert_eq!(support(&p, &l, &[]), vec![1]);
        p.top_p = 0.6;
        assert_eq!(support(&p, &l, &[]), vec![1, 3]);
        p.top_p = 0.75;
        assert_eq!(support(&p, &l, &[]), vec![1, 3]);
        p.top_p = 0.8;
        assert_eq!(support(&p, &l, &[]), vec![0, 1, 3]); // tie at 0.125: lower id kept
        p.top_p = 0.95;
        assert_eq!(support(&p, &l, &[]), vec![0, 1, 2, 3]);
    }

    #[test]
    fn top_p_on_a_large_vocab_matches_full_sort() {
        // Many small tokens force the prefix search past its first 64 and 512 candidates.
        let mut r = ChaCha20Rng::seed_from_u64(3);
        let mut l: Vec<(u32, f32)> = (0..5000u32)
            .map(|i| (i, (unit_f64(r.next_u64()) * 2.0) as f32))
            .collect();
        let mut full = l.clone();
        full.sort_unstable_by(desc);
        let max = full[0].1;
        let z: f64 = full.iter().map(|c| ((c.1 - max) as f64).exp()).sum();
        let mut cum = 0.0;
        let mut want = 0;
        for (i, c) in full.iter().enumerate() {
            cum += ((c.1 - max) as f64).exp();
            if cum >= 0.9 * z {
                want = i + 1;
                break;
            }
        }
        top_p(&mut l, 0.9, false);
        assert!(want > 512);
        assert_eq!(l, full[..want].to_vec());
    }

    #[test]
    fn min_p_cuts_relative_to_the_top_probability() {
        // probs 0.5, 0.3, 0.15, 0.05: min_p 0.2 keeps p >= 0.1.
        let l = [0.5f32.ln(), 0.3f32.ln(), 0.15f32.ln(), 0.05f32.ln()];
        let mut p = params(1.0);
        p.min_p = 0.2;
        assert_eq!(support(&p, &l, &[]), vec![0, 1, 2]);
        p.min_p = 0.59;
        assert_eq!(support(&p, &l, &[]), vec![0, 1]);
        p.min_p = 1.0;
        assert_eq!(support(&p, &l, &[]), vec![0]);
    }

    #[test]
    fn penalties_follow_llama_cpp_formula() {
        let mut p = params(0.0);
        p.repeat_penalty = 2.0;
        p.presence_penalty = 0.5;
        p.frequency_penalty = 0.25;
        p.repeat_last_n = 3;
        let mut s = Sampler::new(p).unwrap();
        s.cand = vec![(0, 4.0), (1, 3.0), (2, -1.0), (3, 0.0)];
        s.apply_penalties(&[0, 2, 1, 2, 99]);
        // window is the last 3 = [1, 2, 99]; 99 is outside the vocabulary and ignored.
        let got: Vec<f32> = s.cand.iter().map(|c| c.1).collect();
        assert_eq!(
            got,
            vec![4.0, 3.0 / 2.0 - 0.25 - 0.5, -2.0 - 0.25 - 0.5, 0.0]
        );
        s.cand = vec![(0, 4.0), (1, 3.0), (2, -1.0), (3, 0.0)];
        s.apply_penalties(&[2, 1, 2]);
        let got: Vec<f32> = s.cand.iter().map(|c| c.1).collect();
        // token 1 once, token 2 twice.
        assert_eq!(
            got,
            vec![4.0, 1.5 - 0.25 - 0.5, -2.0 - 2.0 * 0.25 - 0.5, 0.0]
        );
    }

    #[test]
    fn penalties_change_the_greedy_choice() {
        let mut p = params(0.0);
        p.repeat_penalty = 1.5;
        let mut s = Sampler::new(p).unwrap();
        assert_eq!(s.sample(&[1.0, 1.2, 0.0], &[]), 1);
        assert_eq!(s.sample(&[1.0, 1.2, 0.0], &[1]), 0);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_different_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let p = SamplerParams {
                seed,
                ..SamplerParams::default()
            };
            let mut s = Sampler::new(p).unwrap();
            (0..64).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn temperature_one_matches_softmax_frequencies() {
        // Chi-square goodness of fit, 7 degrees of freedom; 24.32 is the p = 0.001 critical value.
        let logits = [0.0f32, 1.0, -1.0, 2.0, 0.5, -0.5, 1.5, -2.0];
        let max = 2.0f64;
        let w: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
        let z: f64 = w.iter().sum();
        let n = 100_000;
        let mut s = Sampler::new(params(1.0)).unwrap();
        let mut counts = [0usize; 8];
        for _ in 0..n {
            counts[s.sample(&logits, &[]) as usize] += 1;
        }
        let chi2: f64 = (0..8)
            .map(|i| {
                let e = n as f64 * w[i] / z;
                (counts[i] as f64 - e).powi(2) / e
            })
            .sum();
        assert!(chi2 < 24.32, "chi2 = {chi2}, counts = {counts:?}");
    }

    #[test]
    fn temperature_sharpens_the_distribution() {
        let logits = [0.0f32, 1.0];
        let frac1 = |t: f32| {
            let mut s = Sampler::new(params(t)).unwrap();
            (0..20_000).filter(|_| s.sample(&logits, &[]) == 1).count() as f64 / 20_000.0
        };
        // softmax([0, 1/T]): T=1 → 0.731, T=0.25 → 0.982.
        assert!((frac1(1.0) - 0.731).abs() < 0.02);
        assert!((frac1(0.25) - 0.982).abs() < 0.01);
    }

    #[test]
    fn validation_names_the_bad_field() {
        type Edit = Box<dyn Fn(&mut SamplerParams)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("temperature", Box::new(|p| p.temperature = f32::NAN)),
            ("temperature", Box::new(|p| p.temperature = -0.1)),
            ("top_p", Box::new(|p| p.top_p = 0.0)),
            ("top_p", Box::new(|p| p.top_p = 1.5)),
            ("min_p", Box::new(|p| p.min_p = -0.01)),
            ("repeat_penalty", Box::new(|p| p.repeat_penalty = 0.0)),
            (
                "presence_penalty",
                Box::new(|p| p.presence_penalty = f32::INFINITY),
            ),
            (
                "frequency_penalty",
                Box::new(|p| p.frequency_penalty = f32::NAN),
            ),
        ];
        for (name, f) in cases {
            let mut p = SamplerParams::default();
            f(&mut p);
            match Sampler::new(p) {
                Err(SamplerError::InvalidParam { name: got, .. }) => assert_eq!(got, name),
                Ok(_) => panic!("{name} accepted"),
            }
        }
        assert!(SamplerParams::default().validate().is_ok());
        assert!(SamplerParams::greedy().validate().is_ok());
    }

    #[test]
    fn all_masked_logits_do_not_panic() {
        let mut s = Sampler::new(params(1.0)).unwrap();
        assert_eq!(s.sample(&[f32::NEG_INFINITY, f32::NAN], &[]), 0);
        let mut p = params(1.0);
        p.top_p = 0.5;
        p.min_p = 0.1;
        let mut s = Sampler::new(p).unwrap();
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 3], &[]), 0);
    }
}
