//! How many drafts a round verifies, chosen as the run goes ([`crate::dflash::Drafter::set_auto_drafts`]).
//!
//! A round with k drafts emits on average `1 + Σ_{j≤k} P(drafts 1..j all accepted)` tokens and costs the drafter's
//! pass plus a verify forward of k + 1 rows. Where a verify row is dear (a compute-bound CPU) or acceptance falls
//! fast with the position, fewer drafts give more tokens a second; where a verify of 16 rows costs about one of 2
//! (a GPU's tensor-core block) and the drafter is good, more do. The right k depends on the machine, the model
//! pair and the text, so it is measured: running counts of each position's acceptance (given the drafts before it
//! were accepted) and a running mean of a round's wall time for each k tried. Every fourth round tries a neighbour
//! of the current k, so the times of the counts around it stay known; the choice is the k with the most expected
//! tokens a second among the counts whose time is known. Only the number of verified drafts changes, never the
//! output.

/// A drafts-a-round setting (`--draft-max`): at most N drafts a round, or `auto`: the count that measures
/// fastest, chosen as the run goes ([`DraftLength`]). Output is unchanged either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftMax {
    /// The count that measures fastest, up to the drafter's whole block.
    Auto,
    /// At most this many drafts a round.
    At(usize),
}

impl std::str::FromStr for DraftMax {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "auto" => Ok(DraftMax::Auto),
            t => t
                .parse()
                .map(DraftMax::At)
                .map_err(|_| format!("'{s}' is not a draft count (N ≥ 1) or 'auto'")),
        }
    }
}

impl DraftMax {
    /// Sets `drafter` to this setting (`auto`: up to its whole block).
    pub fn apply(self, drafter: &mut super::Drafter) -> crate::Result<()> {
        match self {
            DraftMax::Auto => {
                drafter.set_max_drafts(drafter.config().block_size - 1)?;
                drafter.set_auto_drafts(true);
            }
            DraftMax::At(k) => {
                drafter.set_auto_drafts(false);
                drafter.set_max_drafts(k)?;
            }
        }
        Ok(())
    }

    /// The setting where none is given: `auto` when `target` runs on the host CPU, where a verify row costs
    /// nearly what a plain token does (SmolLM2-135M and its 2-layer drafter on 2 cores: 1.12× plain decoding on
    /// the held-out prompts with `auto`, 0.63× verifying all 15 drafts); on a GPU, where a block of rows costs
    /// little more than one, every draft of the block (`auto` is not yet measured there).
    pub fn default_for(target: &crate::Model, drafter: &super::Drafter) -> DraftMax {
        if target.on_gpu() {
            DraftMax::At(drafter.config().block_size - 1)
        } else {
            DraftMax::Auto
        }
    }

    /// A bench table's name of the setting: `maxN` or `auto`.
    pub fn label(self) -> String {
        match self {
            DraftMax::Auto => "auto".into(),
            DraftMax::At(k) => format!("max{k}"),
        }
    }
}

/// The drafts-a-round chooser (see the module documentation).
#[derive(Clone, Debug)]
pub struct DraftLength {
    /// The most drafts a round.
    cap: usize,
    /// `tried[j]`: rounds that verified draft j + 1 after accepting drafts 1..=j; `took[j]`: of those, the rounds
    /// that accepted it too.
    tried: Vec<u64>,
    took: Vec<u64>,
    /// `secs[k]`: running mean of a round's wall time with k drafts (None: not tried yet).
    secs: Vec<Option<f64>>,
    /// The current choice.
    k: usize,
    rounds: u64,
}

/// Weight of a new round's time in the running mean.
const TIME_WEIGHT: f64 = 0.25;
/// Every this many rounds, a neighbour of the current choice is tried.
const PROBE_EVERY: u64 = 4;

impl DraftLength {
    /// A chooser of 1 to `cap` drafts a round, starting at 3 (or `cap` if smaller).
    pub fn new(cap: usize) -> DraftLength {
        let cap = cap.max(1);
        DraftLength {
            cap,
            tried: vec![0; cap],
            took: vec![0; cap],
            secs: vec![None; cap + 1],
            k: cap.min(3),
            rounds: 0,
        }
    }

    /// The drafts to verify this round.
    pub fn choose(&mut self) -> usize {
        self.rounds += 1;
        if self.rounds.is_multiple_of(PROBE_EVERY) {
            // Alternately one more and one fewer than the current choice, where such a count exists.
            let up = (self.rounds / PROBE_EVERY) % 2 == 1;
            let probe = if up { self.k + 1 } else { self.k - 1 };
            if (1..=self.cap).contains(&probe) {
                return probe;
            }
        }
        self.k
    }

    /// Records a finished round: `k` drafts verified, the first `accepted` of them accepted, `secs` seconds of
    /// wall time (the drafter's pass and context update and the verify forward). Then chooses again.
    pub fn observe(&mut self, k: usize, accepted: usize, secs: f64) {
        if k == 0 || k > self.cap {
            return;
        }
        for j in 0..k.min(accepted + 1) {
            self.tried[j] += 1;
            self.took[j] += u64::from(j < accepted);
        }
        let s = &mut self.secs[k];
        *s = Some(match *s {
            Some(m) => m + TIME_WEIGHT * (secs - m),
            None => secs,
        });
        let best = (1..=self.cap)
            .filter_map(|k| self.secs[k].map(|t| (k, self.expected_tokens(k) / t)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((k, _)) = best {
            self.k = k;
        }
    }

    /// Expected tokens a round emits with `k` drafts: the bonus token plus, for each j ≤ k, the estimated chance
    /// that drafts 1..=j are all accepted (each position's rate with one accepted and one rejected round as prior).
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut all = 1.0;
        let mut sum = 1.0;
        for j in 0..k.min(self.cap) {
            all *= (self.took[j] as f64 + 1.0) / (self.tried[j] as f64 + 2.0);
            sum += all;
        }
        sum
    }

    /// The current choice (the count a round takes unless it probes).
    pub fn current(&self) -> usize {
        self.k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine where each draft is accepted with chance `q` (given the ones before it were; a fixed xorshift
    /// stream) and a round of k drafts takes `cost(k)` seconds. Runs `rounds` rounds and returns the chooser.
    fn run(cap: usize, rounds: usize, q: f64, cost: impl Fn(usize) -> f64) -> DraftLength {
        let mut d = DraftLength::new(cap);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut coin = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 / (1u64 << 53) as f64) < q
        };
        for _ in 0..rounds {
            let k = d.choose();
            assert!((1..=cap).contains(&k), "chose {k} of 1..={cap}");
            let accepted = (0..k).take_while(|_| coin()).count();
            d.observe(k, accepted, cost(k));
        }
        d
    }

    /// Tokens a second with k drafts on that machine.
    fn rate(k: usize, q: f64, cost: &impl Fn(usize) -> f64) -> f64 {
        (0..=k).map(|j| q.powi(j as i32)).sum::<f64>() / cost(k)
    }

    /// The chooser ends within 3 % of the best rate (neighbouring counts can be that close), and `want` is the
    /// best count.
    fn check(q: f64, cost: impl Fn(usize) -> f64, want: usize) {
        let best = (1..=15)
            .max_by(|&a, &b| rate(a, q, &cost).total_cmp(&rate(b, q, &cost)))
            .unwrap();
        assert_eq!(best, want);
        let d = run(15, 2000, q, &cost);
        let got = d.current();
        assert!(
            rate(got, q, &cost) >= 0.97 * rate(best, q, &cost),
            "chose {got} ({:.3} tokens/s) where {best} gives {:.3}",
            rate(got, q, &cost),
            rate(best, q, &cost)
        );
    }

    #[test]
    fn dear_verify_rows_give_few_drafts() {
        // A CPU-like machine: the drafter's pass 0.6 of a plain step, each verify row 0.45 more after the first.
        // (The chooser starts at 3, which is 13 % below the best rate in the first case.)
        check(0.5, |k| 0.6 + 1.0 + 0.45 * k as f64, 1);
        check(0.7, |k| 0.6 + 1.0 + 0.45 * k as f64, 2);
    }

    #[test]
    fn cheap_verify_rows_give_many_drafts() {
        // A GPU-like machine: a verify of any size about one step; a good drafter (3 drafts are 43 % below the
        // best rate), then a modest one.
        check(0.85, |k| 1.4 + 0.01 * k as f64, 15);
        check(0.6, |k| 1.4 + 0.05 * k as f64, 5);
    }

    #[test]
    fn estimates_follow_the_counts() {
        let mut d = DraftLength::new(4);
        // Nothing seen: each position at the prior 1/2.
        assert_eq!(d.expected_tokens(2), 1.0 + 0.5 + 0.25);
        // Three rounds of 4 drafts: 4 accepted, 1 accepted, 0 accepted.
        d.observe(4, 4, 1.0);
        d.observe(4, 1, 1.0);
        d.observe(4, 0, 1.0);
        // Position 1: tried 3, taken 2; position 2: tried 2, taken 1.
        let p1 = 3.0 / 5.0;
        let p2 = 2.0 / 4.0;
        assert!((d.expected_tokens(2) - (1.0 + p1 + p1 * p2)).abs() < 1e-12);
        // Counts past the cap add nothing.
        assert_eq!(d.expected_tokens(9), d.expected_tokens(4));
    }

    #[test]
    fn a_cap_of_one_always_chooses_one() {
        let d = run(1, 50, 0.9, |k| k as f64);
        assert_eq!(d.current(), 1);
    }
}
