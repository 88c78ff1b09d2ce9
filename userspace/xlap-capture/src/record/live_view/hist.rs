//! Log-bucketed histograms of durations (~4 % resolution): quantiles,
//! counts at or below a bound, the outlier fence; beside them, exact counts
//! per power of two of nanoseconds for the metrics' exp2 histograms.

/// Sub-buckets per power of two: 16 (~4.4 % wide).
pub(super) const SUB: f64 = 16.0;
pub(super) const BUCKETS: usize = 64 * SUB as usize;
/// 2^(k/32) for every half bucket: bucket i spans [2^(i/16), 2^((i+1)/16))
/// and its middle is 2^((i+½)/16). Computed once: a power per bucket per
/// metrics bound, and two per packet for the fences, were a tenth of a
/// sampled recording's CPU.
pub(super) fn half_edge(k: usize) -> f64 {
    static EDGES: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    let edges = EDGES.get_or_init(|| {
        (0..=2 * BUCKETS + 2)
            .map(|k| 2f64.powf(k as f64 / (2.0 * SUB)))
            .collect()
    });
    edges[k.min(edges.len() - 1)]
}

/// The largest power-of-two bound of the exp2 histograms: 2^27 ns ≈ 134 ms
/// (netstacklat's and ebpf_exporter's range for a stack's latencies).
pub(super) const EXP2_TOP: u32 = 27;

/// The exp2 slot of a duration: k for (2^(k−1), 2^k] ns (0 for 0 and 1 ns),
/// [`EXP2_TOP`] + 1 above 2^27 ns. Integer bit arithmetic: exact at the
/// bounds, where `log2` of a float might round.
pub(super) fn exp2_slot(ns: u64) -> usize {
    (u64::BITS - ns.saturating_sub(1).leading_zeros()).min(EXP2_TOP + 1) as usize
}

/// Durations in log buckets: `i = ⌊16·log2(ns)⌋`.
#[derive(Clone)]
pub(super) struct Hist {
    pub(super) counts: Vec<u64>,
    /// Per [`exp2_slot`], its durations. Kept apart from `counts` because a
    /// Prometheus bucket `le` includes a duration equal to its bound, and the
    /// log bucket that starts at 2^k ns does not (a stage of exactly 4 096 ns
    /// would land one bucket up).
    pub(super) exp2: [u64; EXP2_TOP as usize + 2],
    pub(super) n: u64,
    pub(super) sum_ns: f64,
}

impl Hist {
    pub(super) fn new() -> Hist {
        Hist {
            counts: vec![0; BUCKETS],
            exp2: [0; EXP2_TOP as usize + 2],
            n: 0,
            sum_ns: 0.0,
        }
    }

    pub(super) fn bucket(ns: u64) -> usize {
        ((ns.max(1) as f64).log2() * SUB) as usize
    }

    /// A value as the histogram holds it: its bucket's middle, as the
    /// quantiles and so the fences are. Compared raw, a latency as steady
    /// as its bucket's width lay above its own fence about half the time
    /// (99 of 100 packets of one latency were outliers).
    pub(super) fn middle(ns: u64) -> f64 {
        half_edge(2 * Self::bucket(ns).min(BUCKETS - 1) + 1)
    }

    pub(super) fn add(&mut self, ns: u64) {
        self.counts[Self::bucket(ns).min(BUCKETS - 1)] += 1;
        self.exp2[exp2_slot(ns)] += 1;
        self.n += 1;
        self.sum_ns += ns as f64;
    }

    pub(super) fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        for (a, b) in self.exp2.iter_mut().zip(&other.exp2) {
            *a += b;
        }
        self.n += other.n;
        self.sum_ns += other.sum_ns;
    }

    /// The p-quantile, ns (the bucket's middle).
    pub(super) fn quantile(&self, p: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = (p * (self.n - 1) as f64).floor() as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > rank {
                return Some(half_edge(2 * i + 1));
            }
        }
        None
    }

    /// Packets at or below `ns` (whole buckets below it).
    pub(super) fn at_or_below(&self, ns: f64) -> u64 {
        let upper = |i: usize| half_edge(2 * (i + 1));
        self.counts
            .iter()
            .enumerate()
            .take_while(|(i, _)| upper(*i) <= ns * 1.000_001)
            .map(|(_, c)| c)
            .sum()
    }

    /// Durations at or below 2^k ns, for k = 0 ..= [`EXP2_TOP`]: a
    /// Prometheus histogram's cumulative buckets (the last, +Inf, is `n`).
    pub(super) fn exp2_cumulative(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.exp2[..=EXP2_TOP as usize]
            .iter()
            .scan(0u64, |sum, c| {
                *sum += c;
                Some(*sum)
            })
            .zip(0..)
            .map(|(n, k)| (k, n))
    }

    /// Tukey's upper fence, Q3 + 1.5·IQR.
    pub(super) fn fence(&self) -> Option<f64> {
        let (q1, q3) = (self.quantile(0.25)?, self.quantile(0.75)?);
        Some(q3 + 1.5 * (q3 - q1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each exp2 bucket holds the durations at or below its bound, the
    /// bound itself included (Prometheus' `le`), and nothing above it.
    #[test]
    fn exp2_buckets_are_exact_at_their_bounds() {
        let top = 1u64 << EXP2_TOP;
        let durations = [
            0,
            1,
            2,
            3,
            4,
            5,
            4_095,
            4_096,
            4_097,
            top,
            top + 1,
            u64::MAX,
        ];
        let mut h = Hist::new();
        for ns in durations {
            h.add(ns);
        }
        let at_or_below = |bound: u64| durations.iter().filter(|ns| **ns <= bound).count() as u64;
        let cumulative: Vec<(u32, u64)> = h.exp2_cumulative().collect();
        assert_eq!(cumulative.len(), EXP2_TOP as usize + 1);
        for (k, n) in cumulative {
            assert_eq!(n, at_or_below(1 << k), "le 2^{k} ns");
        }
        assert_eq!(h.n, 12);
        // Merged, every bucket adds up.
        let mut m = h.clone();
        m.merge(&h);
        assert!(m
            .exp2_cumulative()
            .zip(h.exp2_cumulative())
            .all(|(a, b)| a.1 == 2 * b.1));
    }
}
