//! The statistics of `compare`: a bootstrap confidence interval of the
//! relative change of a quantile between two distributions given as
//! quantile grids.
//!
//! A bootstrap replicate of the p-quantile of n packets is the quantile of n
//! draws from the distribution; its order statistic k = ⌊(n−1)p⌋+1 is the
//! distribution's inverse CDF at a Beta(k, n−k+1) draw (the k-th of n
//! uniform draws). So each replicate costs two Beta draws, not n draws and a
//! sort, whatever the packet count; a test checks it against a plain
//! resampling bootstrap on raw samples.

use super::summary::at_level;

/// A small deterministic generator (splitmix64): the same inputs give the
/// same intervals, so CI verdicts and snapshots are reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// Gamma(shape ≥ 1, 1): Marsaglia and Tsang's method.
    pub fn gamma(&mut self, shape: f64) -> f64 {
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// Beta(a, b) for a, b ≥ 1.
    pub fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        x / (x + y)
    }
}

/// A distribution as its quantile grid and packet count.
#[derive(Clone, Copy)]
pub struct Dist<'a> {
    pub levels: &'a [f64],
    pub values: &'a [f64],
    pub packets: u64,
}

impl Dist<'_> {
    pub fn quantile(&self, p: f64) -> f64 {
        at_level(self.levels, self.values, p)
    }

    /// One bootstrap replicate of the p-quantile of `packets` draws.
    fn replicate(&self, p: f64, rng: &mut Rng) -> f64 {
        let n = self.packets.max(1) as f64;
        let k = ((n - 1.0) * p).floor() + 1.0;
        self.quantile(rng.beta(k, n - k + 1.0))
    }
}

/// The relative change of a quantile and its confidence interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    pub base: f64,
    pub cand: f64,
    /// (cand − base) / base.
    pub rel: f64,
    pub low: f64,
    pub high: f64,
}

/// Bootstrap replicates per interval.
pub const REPLICATES: usize = 4000;

/// The change of the p-quantile from `base` to `cand`, with a two-sided
/// interval at `confidence`. A base at or below zero is taken as 1 ns.
pub fn quantile_change(base: Dist, cand: Dist, p: f64, confidence: f64, rng: &mut Rng) -> Change {
    let rel = |b: f64, c: f64| (c - b) / b.max(1.0);
    let mut reps: Vec<f64> = (0..REPLICATES)
        .map(|_| rel(base.replicate(p, rng), cand.replicate(p, rng)))
        .collect();
    reps.sort_by(|a, b| a.total_cmp(b));
    let alpha = (1.0 - confidence) / 2.0;
    let at = |q: f64| reps[((reps.len() - 1) as f64 * q).round() as usize];
    let (b, c) = (base.quantile(p), cand.quantile(p));
    Change {
        base: b,
        cand: c,
        rel: rel(b, c),
        low: at(alpha),
        high: at(1.0 - alpha),
    }
}

/// The standard normal quantile (Acklam's rational approximation,
/// relative error < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Student's t quantile with `dof` degrees of freedom (Hill's expansion in
/// the normal quantile; within 1 % for dof ≥ 3 at the levels used here).
pub fn t_quantile(p: f64, dof: f64) -> f64 {
    let z = normal_quantile(p);
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * dof)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * dof * dof)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * dof.powi(3))
}

/// Widens a change's interval by the spread between a pooled baseline's
/// runs: `run_values` are the metric in each baseline run. A new run
/// differs from the baseline by that spread even when nothing changed, so
/// the half-width grows by a t prediction interval of it (k runs: k − 1
/// degrees of freedom, √(1 + 1/k)).
pub fn widen_by_runs(c: Change, run_values: &[f64], confidence: f64) -> Change {
    let k = run_values.len();
    if k < 2 {
        return c;
    }
    let base = c.base.max(1.0);
    let rel: Vec<f64> = run_values.iter().map(|v| v / base - 1.0).collect();
    let mean = rel.iter().sum::<f64>() / k as f64;
    let sd = (rel.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (k - 1) as f64).sqrt();
    let t = t_quantile(1.0 - (1.0 - confidence) / 2.0, (k - 1) as f64);
    let extra = t * sd * (1.0 + 1.0 / k as f64).sqrt();
    Change {
        low: c.low - extra,
        high: c.high + extra,
        ..c
    }
}

/// What a change means against the allowed regression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Worse by more than allowed, with the stated confidence.
    Regression,
    /// Better by more than the allowed margin, with the stated confidence.
    Improvement,
    /// Not worse by more than allowed, with the stated confidence.
    Pass,
    /// The interval reaches past the allowed regression: more packets or
    /// runs would tell.
    Inconclusive,
}

/// The verdict of a change against both thresholds: relative
/// (`max_regression`, a fraction) and absolute (`min_change_ns`): a
/// regression must exceed both with the stated confidence, so a 1 µs stage
/// whose p99 doubles on a noisy machine is not a regression, nor is a 1 %
/// change of a long one.
pub fn verdict(c: &Change, max_regression: f64, min_change_ns: f64) -> Verdict {
    let base = c.base.max(1.0);
    let (abs_low, abs_high) = (c.low * base, c.high * base);
    if c.low > max_regression && abs_low > min_change_ns {
        Verdict::Regression
    } else if c.high < -max_regression && abs_high < -min_change_ns {
        Verdict::Improvement
    } else if c.high <= max_regression || abs_high <= min_change_ns {
        Verdict::Pass
    } else {
        Verdict::Inconclusive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ci::summary::grid;

    /// The quantile grid of samples (DuckDB's quantile_cont definition).
    fn summarize(samples: &mut [f64]) -> Vec<f64> {
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        grid()
            .iter()
            .map(|&p| {
                let h = (n - 1) as f64 * p;
                let (r, f) = (h.floor() as usize, h - h.floor());
                samples[r] + f * (samples[(r + 1).min(n - 1)] - samples[r])
            })
            .collect()
    }

    fn lognormal(rng: &mut Rng, n: usize, median: f64, sigma: f64) -> Vec<f64> {
        (0..n)
            .map(|_| median * (sigma * rng.normal()).exp())
            .collect()
    }

    #[test]
    fn normal_and_t_quantiles() {
        assert!((normal_quantile(0.995) - 2.5758).abs() < 1e-4);
        assert!((normal_quantile(0.975) - 1.9600).abs() < 1e-4);
        assert!((normal_quantile(0.01) + 2.3263).abs() < 1e-4);
        // Tables: t(0.995; 4) = 4.604, t(0.995; 9) = 3.250, t(0.975; 4) = 2.776.
        assert!((t_quantile(0.995, 4.0) / 4.604 - 1.0).abs() < 0.03);
        assert!((t_quantile(0.995, 9.0) / 3.250 - 1.0).abs() < 0.01);
        assert!((t_quantile(0.975, 4.0) / 2.776 - 1.0).abs() < 0.01);
    }

    #[test]
    fn a_regression_exceeds_both_thresholds() {
        let c = Change {
            base: 1_000.0,
            cand: 2_000.0,
            rel: 1.0,
            low: 0.8,
            high: 1.2,
        };
        assert_eq!(verdict(&c, 0.1, 0.0), Verdict::Regression);
        // +800 to +1 200 ns: under a 1 µs floor it may or may not matter,
        // under 2 µs it does not.
        assert_eq!(verdict(&c, 0.1, 1_000.0), Verdict::Inconclusive);
        assert_eq!(verdict(&c, 0.1, 2_000.0), Verdict::Pass);
        let c = Change {
            base: 100_000.0,
            cand: 100_000.0,
            rel: 0.0,
            low: -0.05,
            high: 0.2,
        };
        assert_eq!(verdict(&c, 0.1, 1_000.0), Verdict::Inconclusive);
        assert_eq!(verdict(&c, 0.1, 50_000.0), Verdict::Pass);
    }

    #[test]
    fn the_spread_between_runs_widens_the_interval() {
        let c = Change {
            base: 100.0,
            cand: 120.0,
            rel: 0.2,
            low: 0.15,
            high: 0.25,
        };
        // Five runs at ±10 %: a 20 % change is no longer certain.
        let w = widen_by_runs(c, &[90.0, 110.0, 100.0, 95.0, 105.0], 0.99);
        assert!(w.low < 0.0 && w.high > 0.4, "{w:?}");
        assert_eq!(widen_by_runs(c, &[100.0], 0.99), c);
    }

    #[test]
    fn beta_draws_have_the_right_mean() {
        let mut rng = Rng::new(1);
        let (a, b) = (30.0, 70.0);
        let m: f64 = (0..20_000).map(|_| rng.beta(a, b)).sum::<f64>() / 20_000.0;
        assert!((m - 0.3).abs() < 0.003, "{m}");
    }

    /// The independent route: a plain bootstrap (resample the raw samples
    /// with replacement, sort, take the quantile) gives the same interval
    /// as the order-statistic shortcut on the grid summary.
    #[test]
    fn the_interval_matches_a_plain_resampling_bootstrap() {
        let mut rng = Rng::new(7);
        let (n, p, conf) = (2_000usize, 0.5, 0.95);
        let mut a = lognormal(&mut rng, n, 100_000.0, 0.3);
        let mut b = lognormal(&mut rng, n, 104_000.0, 0.3);
        let (ga, gb) = (summarize(&mut a), summarize(&mut b));
        let levels = grid();
        let da = Dist {
            levels: &levels,
            values: &ga,
            packets: n as u64,
        };
        let db = Dist {
            levels: &levels,
            values: &gb,
            packets: n as u64,
        };
        let fast = quantile_change(da, db, p, conf, &mut Rng::new(3));
        // Plain bootstrap.
        let q = |s: &mut Vec<f64>| {
            s.sort_by(|x, y| x.total_cmp(y));
            let h = (s.len() - 1) as f64 * p;
            s[h.floor() as usize]
        };
        let mut r = Rng::new(11);
        let mut reps: Vec<f64> = (0..2_000)
            .map(|_| {
                let mut ra: Vec<f64> = (0..n)
                    .map(|_| a[(r.next_u64() % n as u64) as usize])
                    .collect();
                let mut rb: Vec<f64> = (0..n)
                    .map(|_| b[(r.next_u64() % n as u64) as usize])
                    .collect();
                let (qa, qb) = (q(&mut ra), q(&mut rb));
                (qb - qa) / qa
            })
            .collect();
        reps.sort_by(|x, y| x.total_cmp(y));
        let (low, high) = (reps[49], reps[1949]);
        assert!((fast.low - low).abs() < 0.01, "low {} vs {low}", fast.low);
        assert!(
            (fast.high - high).abs() < 0.01,
            "high {} vs {high}",
            fast.high
        );
        // And the width matches the asymptotic standard error of a median
        // difference: sqrt(2) · 1.2533 · σ/√n relative, ×2×1.96.
        let width = 2.0 * 1.96 * 2f64.sqrt() * 1.2533 * 0.3 / (n as f64).sqrt();
        assert!(
            ((fast.high - fast.low) / width - 1.0).abs() < 0.2,
            "{} vs {width}",
            fast.high - fast.low
        );
    }

    /// Power and false positives on distributions with a known shift (the
    /// figures the README states): 200 trials each.
    #[test]
    fn power_and_false_positive_rate_on_known_shifts() {
        let levels = grid();
        let trials = 200;
        let mut rng = Rng::new(42);
        let rate = |shift: f64, p: f64, n: usize, rng: &mut Rng| -> f64 {
            let mut hits = 0;
            for _ in 0..trials {
                let mut a = lognormal(rng, n, 50_000.0, 0.4);
                let mut b: Vec<f64> = lognormal(rng, n, 50_000.0, 0.4)
                    .into_iter()
                    .map(|x| x * (1.0 + shift))
                    .collect();
                let (ga, gb) = (summarize(&mut a), summarize(&mut b));
                let da = Dist {
                    levels: &levels,
                    values: &ga,
                    packets: n as u64,
                };
                let db = Dist {
                    levels: &levels,
                    values: &gb,
                    packets: n as u64,
                };
                let c = quantile_change(da, db, p, 0.99, rng);
                if verdict(&c, 0.05, 0.0) == Verdict::Regression {
                    hits += 1;
                }
            }
            hits as f64 / trials as f64
        };
        // No change: regressions are false positives.
        let fp50 = rate(0.0, 0.5, 5_000, &mut rng);
        let fp99 = rate(0.0, 0.99, 5_000, &mut rng);
        assert!(
            fp50 <= 0.01 && fp99 <= 0.01,
            "false positives {fp50} {fp99}"
        );
        // Shifts well past the allowed 5 %, 5 000 packets: 15 % is found at
        // p50 every time, at p99 most of the time (the tail has 50 packets
        // above it); 25 % at p99 nearly always.
        let pw50 = rate(0.15, 0.5, 5_000, &mut rng);
        let pw99 = rate(0.15, 0.99, 5_000, &mut rng);
        let pw99_25 = rate(0.25, 0.99, 5_000, &mut rng);
        eprintln!("false positives p50 {fp50} p99 {fp99}; power 15 % p50 {pw50} p99 {pw99}; 25 % p99 {pw99_25}");
        assert!(
            pw50 >= 0.95 && pw99 >= 0.6 && pw99_25 >= 0.95,
            "power {pw50} {pw99} {pw99_25}"
        );
    }
}
