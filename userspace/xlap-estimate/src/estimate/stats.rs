//! The statistics estimated per host, and the resampling behind their
//! intervals (with the CI comparison's generator, `ci::stats::Rng`).

use xlap_random::Rng;

/// A statistic of an RTT distribution and of a host's latency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stat {
    Mean,
    /// The quantile at this level (0 = min, 1 = max).
    Quantile(f64),
}

/// What `estimate` solves for, in this order.
pub const STATS: &[Stat] = &[
    Stat::Mean,
    Stat::Quantile(0.0),
    Stat::Quantile(0.5),
    Stat::Quantile(0.9),
    Stat::Quantile(0.99),
    Stat::Quantile(1.0),
];

impl Stat {
    pub fn name(&self) -> String {
        match *self {
            Stat::Mean => "mean".into(),
            Stat::Quantile(0.0) => "min".into(),
            Stat::Quantile(1.0) => "max".into(),
            Stat::Quantile(q) => format!("p{}", (q * 1000.0).round() / 10.0),
        }
    }

    /// This statistic of sorted samples.
    pub fn of_sorted(&self, sorted: &[f64]) -> f64 {
        match *self {
            Stat::Mean => sorted.iter().sum::<f64>() / sorted.len() as f64,
            Stat::Quantile(q) => quantile_sorted(sorted, q),
        }
    }
}

/// The `q` quantile of sorted samples, linear between order statistics
/// (Hyndman & Fan type 7, as DuckDB's `quantile_cont`).
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
            let lo = h.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
        }
    }
}

/// Every statistic of [`STATS`] of these samples (sorted in place).
pub fn all_stats(samples: &mut [f64]) -> Vec<f64> {
    samples.sort_unstable_by(f64::total_cmp);
    STATS.iter().map(|s| s.of_sorted(samples)).collect()
}

/// A resample with replacement of `from`, into `into`.
pub fn resample(rng: &mut Rng, from: &[f64], into: &mut Vec<f64>) {
    into.clear();
    into.extend((0..from.len()).map(|_| from[rng.below(from.len())]));
}

/// The percentile interval of bootstrap replicates at `confidence`.
pub fn interval(replicates: &mut [f64], confidence: f64) -> (f64, f64) {
    replicates.sort_unstable_by(f64::total_cmp);
    let tail = (1.0 - confidence) / 2.0;
    (
        quantile_sorted(replicates, tail),
        quantile_sorted(replicates, 1.0 - tail),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_and_names_read_well() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile_sorted(&s, 0.5), 3.0);
        assert_eq!(quantile_sorted(&s, 0.9), 4.6);
        assert_eq!(quantile_sorted(&s, 0.0), 1.0);
        assert_eq!(quantile_sorted(&s, 1.0), 5.0);
        let names: Vec<String> = STATS.iter().map(Stat::name).collect();
        assert_eq!(names, ["mean", "min", "p50", "p90", "p99", "max"]);
    }

    #[test]
    fn resamples_are_reproducible_and_uniform() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(a.next_u64(), b.next_u64());
        let mut counts = [0u32; 4];
        for _ in 0..40_000 {
            counts[a.below(4)] += 1;
        }
        assert!(
            counts.iter().all(|c| (9_400..10_600).contains(c)),
            "{counts:?}"
        );
    }
}
