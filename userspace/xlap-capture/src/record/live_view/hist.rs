//! Log-bucketed histograms of durations (~4 % resolution): quantiles,
//! counts at or below a bound, the outlier fence.

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

/// Durations in log buckets: `i = ⌊16·log2(ns)⌋`.
#[derive(Clone)]
pub(super) struct Hist {
    pub(super) counts: Vec<u64>,
    pub(super) n: u64,
    pub(super) sum_ns: f64,
}

impl Hist {
    pub(super) fn new() -> Hist {
        Hist {
            counts: vec![0; BUCKETS],
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
        self.n += 1;
        self.sum_ns += ns as f64;
    }

    pub(super) fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
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

    /// Tukey's upper fence, Q3 + 1.5·IQR.
    pub(super) fn fence(&self) -> Option<f64> {
        let (q1, q3) = (self.quantile(0.25)?, self.quantile(0.75)?);
        Some(q3 + 1.5 * (q3 - q1))
    }
}
