//! Summary statistics of repeated measurements: mean and sample standard deviation (as llama-bench reports
//! them), median (what A/B comparisons use, robust to one disturbed run), min and max.

/// Statistics of a set of samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean (NaN without samples).
    pub mean: f64,
    /// Sample standard deviation, `n − 1` in the denominator (0 for a single sample, NaN without samples).
    pub sd: f64,
    /// Median: the middle sample, or the mean of the two middle ones (NaN without samples).
    pub median: f64,
    /// Smallest sample (NaN without samples).
    pub min: f64,
    /// Largest sample (NaN without samples).
    pub max: f64,
}

impl Stats {
    /// Statistics of `samples` (NaN samples are kept and poison the results, so a broken run is visible).
    pub fn of(samples: &[f64]) -> Stats {
        let n = samples.len();
        if n == 0 {
            return Stats {
                n,
                mean: f64::NAN,
                sd: f64::NAN,
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        let mean = samples.iter().sum::<f64>() / n as f64;
        let sd = if n > 1 {
            (samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Stats {
            n,
            mean,
            sd,
            median,
            min: sorted[0],
            max: sorted[n - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed() {
        let s = Stats::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.n, 8);
        assert_eq!(s.mean, 5.0);
        // Σ(x − 5)² = 32, / 7.
        assert!((s.sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(s.median, 4.5);
        assert_eq!((s.min, s.max), (2.0, 9.0));
        let odd = Stats::of(&[3.0, 1.0, 2.0]);
        assert_eq!((odd.median, odd.sd), (2.0, 1.0));
    }

    #[test]
    fn degenerate_sizes() {
        let one = Stats::of(&[1.5]);
        assert_eq!((one.mean, one.sd, one.median), (1.5, 0.0, 1.5));
        assert!(Stats::of(&[]).mean.is_nan());
    }
}
