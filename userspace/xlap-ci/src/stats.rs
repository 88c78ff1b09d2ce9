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

use super::summary::{at_level, cdf};

pub use xlap_random::Rng;

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

/// The change of a quantile, relative and absolute, with confidence
/// intervals of each. Both are kept because they behave differently: the
/// ratio of a stage near zero (80 ns growing to 50 µs) has an interval as
/// wide as the base's own noise divided by almost nothing, while the
/// difference stays as precise as the two quantiles; the absolute
/// threshold is tested on the difference's interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    pub base: f64,
    pub cand: f64,
    /// (cand − base) / base.
    pub rel: f64,
    pub low: f64,
    pub high: f64,
    /// The interval of cand − base, ns.
    pub abs_low: f64,
    pub abs_high: f64,
}

/// Bootstrap replicates per interval.
pub const REPLICATES: usize = 4000;

/// The change of the p-quantile from `base` to `cand`, with a two-sided
/// interval at `confidence`. A base at or below zero is taken as 1 ns.
pub fn quantile_change(base: Dist, cand: Dist, p: f64, confidence: f64, rng: &mut Rng) -> Change {
    let rel = |b: f64, c: f64| (c - b) / b.max(1.0);
    let (mut rels, mut diffs): (Vec<f64>, Vec<f64>) = (0..REPLICATES)
        .map(|_| {
            let (b, c) = (base.replicate(p, rng), cand.replicate(p, rng));
            (rel(b, c), c - b)
        })
        .unzip();
    let (b, c) = (base.quantile(p), cand.quantile(p));
    let (low, high) = percentile_interval(&mut rels, rel(b, c), confidence);
    let (abs_low, abs_high) = percentile_interval(&mut diffs, c - b, confidence);
    Change {
        base: b,
        cand: c,
        rel: rel(b, c),
        low,
        high,
        abs_low,
        abs_high,
    }
}

/// The two-sided percentile interval of bootstrap replicates around the
/// point estimate `x`. Replicates resolve a tail level down to a few of
/// them; a level beyond (many metrics at a high confidence) is
/// extrapolated from the last resolved one, each side scaled by the normal
/// quantiles' ratio.
fn percentile_interval(reps: &mut [f64], x: f64, confidence: f64) -> (f64, f64) {
    reps.sort_by(|a, b| a.total_cmp(b));
    let alpha = (1.0 - confidence) / 2.0;
    let at = |q: f64| reps[((reps.len() - 1) as f64 * q).round() as usize];
    let resolved = TAIL_REPLICATES / reps.len() as f64;
    if alpha >= resolved {
        (at(alpha), at(1.0 - alpha))
    } else {
        let k = normal_quantile(1.0 - alpha) / normal_quantile(1.0 - resolved);
        (
            x - (x - at(resolved)).max(0.0) * k,
            x + (at(1.0 - resolved) - x).max(0.0) * k,
        )
    }
}

/// Replicates beyond a percentile for it to count as resolved.
const TAIL_REPLICATES: f64 = 20.0;

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

/// Student's t quantile with `dof` (> 0, fractional allowed) degrees of
/// freedom, for p in (0, 1): the t distribution's tail is
/// ½·I_x(dof/2, ½) at x = dof/(dof + t²), inverted by bisection in x. Exact
/// to ~1e-10 also far in the tail with few degrees of freedom, where
/// expansions in the normal quantile fail (a Bonferroni level over a
/// hundred metrics with a three-run baseline).
pub fn t_quantile(p: f64, dof: f64) -> f64 {
    if p < 0.5 {
        return -t_quantile(1.0 - p, dof);
    }
    let tail = 1.0 - p;
    if tail >= 0.5 {
        return 0.0;
    }
    // 0.5·I_x(dof/2, 1/2) grows with x from 0 (t = ∞) to 0.5 (t = 0).
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if 0.5 * incomplete_beta(mid, dof / 2.0, 0.5) < tail {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let x = 0.5 * (lo + hi);
    (dof * (1.0 - x) / x).sqrt()
}

/// ln Γ(x) for x ≥ ½ (Lanczos' series, g = 7).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let mut sum = C[0];
    for (i, c) in C.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The regularized incomplete beta function I_x(a, b), by its continued
/// fraction (modified Lentz), on the side of x where it converges fast.
fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - incomplete_beta(1.0 - x, b, a);
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp() / a;
    const TINY: f64 = 1e-300;
    let (mut f, mut c, mut d) = (1.0f64, 1.0f64, 0.0f64);
    for i in 0..400 {
        let m = (i / 2) as f64;
        let num = if i == 0 {
            1.0
        } else if i % 2 == 0 {
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m))
        } else {
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0))
        };
        d = 1.0 + num * d;
        if d.abs() < TINY {
            d = TINY;
        }
        d = 1.0 / d;
        c = 1.0 + num / c;
        if c.abs() < TINY {
            c = TINY;
        }
        f *= c * d;
        if (1.0 - c * d).abs() < 1e-15 {
            break;
        }
    }
    front * (f - 1.0)
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
    let mean = run_values.iter().sum::<f64>() / k as f64;
    let sd = (run_values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (k - 1) as f64).sqrt();
    let t = t_quantile(1.0 - (1.0 - confidence) / 2.0, (k - 1) as f64);
    let extra = t * sd * (1.0 + 1.0 / k as f64).sqrt();
    Change {
        low: c.low - extra / base,
        high: c.high + extra / base,
        abs_low: c.abs_low - extra,
        abs_high: c.abs_high + extra,
        ..c
    }
}

/// The noise of one run's quantile seen in its blocks (batch means): the
/// variance of the run's p-quantile, and the blocks it was estimated from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockNoise {
    pub var: f64,
    pub blocks: usize,
}

/// The variance of a run's p-quantile from its blocks: the run's value x
/// (at `levels`/`values`), each block's fraction of packets at or below x
/// (its grid at `block_levels` inverted), their variance over the block
/// count (batch means on the indicator, robust to a block far off: a burst
/// in a tenth of the run moves the median of the run, and so the blocks'
/// fractions, by little), taken to ns by the run's quantile slope at p.
pub fn block_noise(
    levels: &[f64],
    values: &[f64],
    block_levels: &[f64],
    blocks: &[Vec<f64>],
    p: f64,
) -> Option<BlockNoise> {
    let k = blocks.len();
    if k < 2 || block_levels.is_empty() {
        return None;
    }
    let x = at_level(levels, values, p);
    let fractions: Vec<f64> = blocks.iter().map(|b| cdf(block_levels, b, x)).collect();
    let mean = fractions.iter().sum::<f64>() / k as f64;
    let var_f =
        fractions.iter().map(|f| (f - mean).powi(2)).sum::<f64>() / (k - 1) as f64 / k as f64;
    // dQ/dp over ±1 % (±0.2 % in the tails, where the grid is finer).
    let dp = if (0.02..=0.97).contains(&p) {
        0.01
    } else {
        0.002
    };
    let (lo, hi) = ((p - dp).max(0.0), (p + dp).min(1.0));
    let slope = (at_level(levels, values, hi) - at_level(levels, values, lo)) / (hi - lo);
    Some(BlockNoise {
        var: var_f * slope * slope,
        blocks: k,
    })
}

/// Widens a change's interval by both runs' block noise, where wider than
/// the bootstrap's on either side. The bootstrap takes packets as
/// independent; the blocks hold the noise that comes and goes within a run
/// (another tenant, frequency steps, a flush). The difference gets a Welch
/// t interval; the ratio is bounded by each side's own interval (t at half
/// the error each): [c_lo/b_hi − 1, c_hi/b_lo − 1], which stays right
/// where a delta-method interval of a ratio fails, a base near zero (80 ns
/// of a stage growing to 50 µs).
pub fn widen_by_blocks(
    c: Change,
    base: Option<BlockNoise>,
    cand: Option<BlockNoise>,
    confidence: f64,
) -> Change {
    let (Some(nb), Some(nc)) = (base, cand) else {
        return c;
    };
    if !(nb.var >= 0.0 && nc.var >= 0.0) || nb.var + nc.var <= 0.0 {
        return c;
    }
    let alpha = 1.0 - confidence;
    let dof = (nc.var + nb.var).powi(2)
        / (nc.var * nc.var / (nc.blocks - 1) as f64 + nb.var * nb.var / (nb.blocks - 1) as f64);
    let half_abs = t_quantile(1.0 - alpha / 2.0, dof.max(1.0)) * (nc.var + nb.var).sqrt();
    let side = |n: BlockNoise| t_quantile(1.0 - alpha / 4.0, (n.blocks - 1) as f64) * n.var.sqrt();
    let (b_lo, b_hi) = ((c.base - side(nb)).max(1.0), c.base + side(nb));
    let (c_lo, c_hi) = (c.cand - side(nc), c.cand + side(nc));
    let diff = c.cand - c.base;
    Change {
        low: c.low.min(c_lo / b_hi - 1.0),
        high: c.high.max(c_hi / b_lo - 1.0),
        abs_low: c.abs_low.min(diff - half_abs),
        abs_high: c.abs_high.max(diff + half_abs),
        ..c
    }
}

/// Widens a change's interval by the candidate's block noise alone, where
/// wider: for a pooled baseline, whose own noise (the spread between its
/// runs) is already in the interval, against a single candidate run.
pub fn widen_by_candidate_blocks(c: Change, cand: Option<BlockNoise>, confidence: f64) -> Change {
    let Some(nc) = cand else {
        return c;
    };
    let exact_base = BlockNoise {
        var: 0.0,
        blocks: nc.blocks,
    };
    widen_by_blocks(c, Some(exact_base), Some(nc), confidence)
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
    /// The metric cannot decide (too few packets beyond its quantile, or
    /// its noise unmeasured): whatever its interval says, it is counted
    /// apart from the passes and never makes the overall verdict.
    #[serde(rename = "not_decided")]
    NotDecided,
}

/// The regression allowed at a baseline quantile, ns: the larger of the
/// absolute floor (`min_change_ns`) and the relative allowance
/// (`max_regression` of the baseline). One absolute bar instead of a ratio
/// interval: the ratio of a stage near zero (0.1 µs growing to 50 µs) has
/// an interval as wide as its base's noise divided by almost nothing
/// (−138 % to +428 844 017 %), while the difference stays as precise as
/// the two quantiles.
pub fn allowed_ns(base_ns: f64, max_regression: f64, min_change_ns: f64) -> f64 {
    min_change_ns.max(max_regression * base_ns.max(0.0))
}

/// The verdict of a change's interval against the allowed regression
/// ([`allowed_ns`]): a regression must exceed both thresholds with the
/// stated confidence, so a 1 µs stage whose p99 doubles on a noisy machine
/// is not a regression, nor is a 1 % change of a long one. (Whether the
/// metric may decide, and whether the change stands out of its packets'
/// spread, `compare` checks on top.)
pub fn verdict(c: &Change, max_regression: f64, min_change_ns: f64) -> Verdict {
    let allowed = allowed_ns(c.base, max_regression, min_change_ns);
    if c.abs_low > allowed {
        Verdict::Regression
    } else if c.abs_high < -allowed {
        Verdict::Improvement
    } else if c.abs_high <= allowed {
        Verdict::Pass
    } else {
        Verdict::Inconclusive
    }
}

/// How far a quantile's change stands out of the two runs' own spread
/// around it: the change over the room the packets next to the quantile
/// take on the sides that face each other, the candidate's below it and
/// the baseline's above it (for a rise; mirrored for a fall), each over 80 %
/// of the way from the quantile to the nearer end of the distribution
/// (p10 to p90 around a median, p98.2 to p99.8 around a p99). At 1 or more
/// those packets no longer overlap: the change moved (nearly) all of them.
///
/// Why a single run needs it: a run's stage is often a mixture of states
/// (the peer preempting the sender on a shared core, the receiver behind
/// its queue) whose weights differ from run to run for the whole run;
/// moving between states both runs know shifts a median by tens of µs,
/// tightly (the blocks see the same state throughout), yet leaves the
/// runs' packets overlapping. A delay added to a stage moves every packet
/// past the other run's (measured on the example: 50 µs in decode scores
/// 150 to 700, the machine's states at most 1.2 in 25 unchanged pairs;
/// compare asks for 3, see `compare::MIN_EFFECT`).
pub fn separation(levels: &[f64], base: &[f64], cand: &[f64], p: f64) -> f64 {
    let w = 0.8 * p.min(1.0 - p);
    let (lo, hi) = (p - w, p + w);
    let (b, c) = (at_level(levels, base, p), at_level(levels, cand, p));
    let diff = c - b;
    let room = if diff >= 0.0 {
        (c - at_level(levels, cand, lo)) + (at_level(levels, base, hi) - b)
    } else {
        (at_level(levels, cand, hi) - c) + (b - at_level(levels, base, lo))
    };
    // Whole nanoseconds: the clock's resolution (two runs at one value
    // each are apart by any change).
    diff / room.max(1.0)
}

/// A duration in ns as µs (ms from 10 ms on), signed, one decimal.
fn signed_time(ns: f64, ms: bool) -> String {
    if ms {
        format!("{:+.1}", ns / 1e6)
    } else {
        format!("{:+.1}", ns / 1e3)
    }
}

/// A relative change is shown only where the baseline is at least this
/// (1 µs): below, a percentage mostly divides by the clock's resolution
/// and the scheduler's noise.
pub const RELATIVE_MIN_BASE_NS: f64 = 1_000.0;

/// Whether a relative figure means something at this baseline quantile.
pub fn relative_means_something(base_ns: f64) -> bool {
    base_ns >= RELATIVE_MIN_BASE_NS
}

/// A change as shown: `+50.1 µs`, with the relative change where it means
/// something (`+12.0 µs (+15.3%)`).
pub fn change_text(base_ns: f64, diff_ns: f64) -> String {
    let ms = diff_ns.abs() >= 1e7;
    let unit = if ms { "ms" } else { "µs" };
    let abs = format!("{} {unit}", signed_time(diff_ns, ms));
    if relative_means_something(base_ns) && diff_ns / base_ns <= 10.0 {
        format!("{abs} ({:+.1}%)", diff_ns / base_ns * 100.0)
    } else {
        abs
    }
}

/// An interval of a change as shown: always the absolute one (bounded: the
/// difference of two quantiles), `[+49.9, +50.3] µs`, in ms from 10 ms
/// on; the relative one beside it only where the baseline means something
/// and the interval stays within −100 %..+1000 % (`[+8.1, +12.0] µs
/// (+4.1%..+6.0%)`).
pub fn interval_text(base_ns: f64, low_ns: f64, high_ns: f64) -> String {
    let ms = low_ns.abs().max(high_ns.abs()) >= 1e7;
    let unit = if ms { "ms" } else { "µs" };
    let abs = format!(
        "[{}, {}] {unit}",
        signed_time(low_ns, ms),
        signed_time(high_ns, ms)
    );
    let (rl, rh) = (low_ns / base_ns, high_ns / base_ns);
    if relative_means_something(base_ns) && rl >= -1.0 && rh <= 10.0 {
        format!("{abs} ({:+.1}%..{:+.1}%)", rl * 100.0, rh * 100.0)
    } else {
        abs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{block_grid, grid};

    /// The quantile grid of samples (DuckDB's quantile_cont definition).
    fn summarize(samples: &mut [f64]) -> Vec<f64> {
        summarize_at(samples, &grid())
    }

    fn summarize_at(samples: &mut [f64], levels: &[f64]) -> Vec<f64> {
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len();
        levels
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
        // Values of an independent implementation (scipy.stats.t.ppf),
        // far in the tail with few degrees of freedom too.
        for (p, dof, want) in [
            (0.975, 4.0, 2.776445),
            (0.995, 2.0, 9.924843),
            (0.995, 9.0, 3.249836),
            (0.99996, 2.0, 111.797),
            (0.99996, 4.0, 16.448),
            (0.99996, 12.0, 5.837),
            (0.999996, 9.0, 9.072),
            (0.999996, 30.0, 5.378),
            (0.005, 9.0, -3.249836),
        ] {
            let got = t_quantile(p, dof);
            assert!(
                (got / want - 1.0).abs() < 2e-4,
                "t({p}; {dof}) = {got}, want {want}"
            );
        }
        // Fractional degrees of freedom (Welch) lie between their neighbours.
        let mid = t_quantile(0.995, 9.5);
        assert!(t_quantile(0.995, 10.0) < mid && mid < t_quantile(0.995, 9.0));
    }

    #[test]
    fn a_regression_exceeds_both_thresholds() {
        let c = Change {
            base: 1_000.0,
            cand: 2_000.0,
            rel: 1.0,
            low: 0.8,
            high: 1.2,
            abs_low: 800.0,
            abs_high: 1_200.0,
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
            abs_low: -5_000.0,
            abs_high: 20_000.0,
        };
        assert_eq!(verdict(&c, 0.1, 1_000.0), Verdict::Inconclusive);
        assert_eq!(verdict(&c, 0.1, 50_000.0), Verdict::Pass);
    }

    #[test]
    fn intervals_are_bounded_and_absolute_near_zero() {
        // The CI case: a decode stage of 0.1 µs growing to 50 µs. The
        // ratio's interval was printed as [-137.8%, +428844017.4%].
        let t = interval_text(100.0, 49_900.0, 50_300.0);
        assert_eq!(t, "[+49.9, +50.3] µs");
        assert_eq!(change_text(100.0, 50_100.0), "+50.1 µs");
        // A base of a few µs: a percentage of it is no figure to read.
        assert_eq!(
            interval_text(3_000.0, 45_000.0, 60_000.0),
            "[+45.0, +60.0] µs"
        );
        // Where the base means something, the relative figure is beside it.
        assert_eq!(
            interval_text(200_000.0, 8_100.0, 12_000.0),
            "[+8.1, +12.0] µs (+4.0%..+6.0%)"
        );
        assert_eq!(change_text(80_000.0, 12_000.0), "+12.0 µs (+15.0%)");
        // Wide and long: ms, still two numbers of a few digits.
        assert_eq!(
            interval_text(54_900.0, 45_972_900.0, 70_390_600.0),
            "[+46.0, +70.4] ms"
        );
        assert_eq!(interval_text(-4_300.0, -500.0, 900.0), "[-0.5, +0.9] µs");
        // No figure ever grows past a few characters per bound, whatever
        // the base (zero and negative stage durations included).
        for base in [0.0, 1.0, 80.0, 999.0, 1_000.0, -11_200.0, 1e6] {
            for (lo, hi) in [(-3_000.0, 4e8), (-1e9, 1e9), (0.0, 1.0)] {
                let t = interval_text(base, lo, hi);
                assert!(t.len() < 48 && !t.contains('e'), "{base}: {t}");
            }
        }
    }

    #[test]
    fn allowed_regression_is_absolute_near_zero_and_relative_above() {
        // 10 % of a 0.1 µs base would be 10 ns: the 20 µs floor holds.
        assert_eq!(allowed_ns(100.0, 0.1, 20_000.0), 20_000.0);
        assert_eq!(allowed_ns(-5_000.0, 0.1, 20_000.0), 20_000.0);
        // 10 % of 1 ms is 100 µs.
        assert_eq!(allowed_ns(1e6, 0.1, 20_000.0), 100_000.0);
    }

    #[test]
    fn separation_tells_a_delay_from_a_change_of_state() {
        let levels = grid();
        let mut rng = Rng::new(21);
        // A 0.1 µs stage and the same with 50 µs added to every packet.
        let mut base: Vec<f64> = lognormal(&mut rng, 3000, 100.0, 0.3);
        let mut slow: Vec<f64> = lognormal(&mut rng, 3000, 100.0, 0.3)
            .into_iter()
            .map(|x| x + 50_000.0)
            .collect();
        let (gb, gs) = (summarize(&mut base), summarize(&mut slow));
        assert!(separation(&levels, &gb, &gs, 0.5) > 100.0);
        assert!(separation(&levels, &gs, &gb, 0.5) < -100.0);
        // Two states, 0.5 µs and 23 µs (the peer preempting the sender):
        // 30 % of the baseline's packets in the slow one, 85 % of the
        // candidate's. The median moves by 22 µs, but the packets overlap.
        let mix = |rng: &mut Rng, slow: f64| -> Vec<f64> {
            (0..3000)
                .map(|_| {
                    let x = (0.2 * rng.normal()).exp();
                    if rng.uniform() < slow {
                        23_000.0 * x
                    } else {
                        500.0 * x
                    }
                })
                .collect()
        };
        let (mut a, mut b) = (mix(&mut rng, 0.3), mix(&mut rng, 0.85));
        let (ga, gb) = (summarize(&mut a), summarize(&mut b));
        let moved = at_level(&levels, &gb, 0.5) - at_level(&levels, &ga, 0.5);
        assert!(moved > 20_000.0, "{moved}");
        let s = separation(&levels, &ga, &gb, 0.5);
        assert!((0.0..1.0).contains(&s), "{s}");
    }

    #[test]
    fn the_spread_between_runs_widens_the_interval() {
        let c = Change {
            base: 100.0,
            cand: 120.0,
            rel: 0.2,
            low: 0.15,
            high: 0.25,
            abs_low: 15.0,
            abs_high: 25.0,
        };
        // Five runs at ±10 %: a 20 % change is no longer certain.
        let w = widen_by_runs(c, &[90.0, 110.0, 100.0, 95.0, 105.0], 0.99);
        assert!(w.low < 0.0 && w.high > 0.4, "{w:?}");
        assert!(w.abs_low < 0.0 && w.abs_high > 40.0, "{w:?}");
        assert_eq!(widen_by_runs(c, &[100.0], 0.99), c);
    }

    /// A change of a p99 from 27 µs to `p99` ns, with a bootstrap interval
    /// that sees only the packets (±1 µs of the baseline).
    fn against_27us(p99: f64) -> Change {
        Change {
            base: 27_000.0,
            cand: p99,
            rel: p99 / 27_000.0 - 1.0,
            low: p99 / 28_000.0 - 1.0,
            high: p99 / 26_000.0 - 1.0,
            abs_low: p99 - 28_000.0,
            abs_high: p99 - 26_000.0,
        }
    }

    #[test]
    fn a_candidate_stalled_in_some_blocks_is_no_regression_against_a_pooled_baseline() {
        // Ten blocks of 1 000 packets at 10 µs, a 1.5 ms stall in one of
        // them taking 12 % of its packets: the run's p99 sits in the stall.
        let mut rng = Rng::new(7);
        let levels = grid();
        let mut all = Vec::new();
        let mut blocks = Vec::new();
        for i in 0..10 {
            let mut b: Vec<f64> = lognormal(&mut rng, 1000, 10_000.0, 0.2);
            if i == 6 {
                for v in b.iter_mut().take(120) {
                    *v += 1_500_000.0;
                }
            }
            all.extend_from_slice(&b);
            blocks.push(summarize_at(&mut b, &block_grid()));
        }
        let run = summarize(&mut all);
        let p99 = at_level(&levels, &run, 0.99);
        assert!(p99 > 1_000_000.0, "{p99}");
        // The pooled baseline's p99 at 27 µs, its runs within ±2 µs.
        let c = against_27us(p99);
        let c = widen_by_runs(c, &[25_000.0, 27_000.0, 29_000.0, 26_000.0, 28_000.0], 0.99);
        assert!(c.abs_low > 0.0, "the packets and runs alone call it worse");
        let noise = block_noise(&levels, &run, &block_grid(), &blocks, 0.99);
        let w = widen_by_candidate_blocks(c, noise, 0.99);
        assert!(w.abs_low < 0.0 && w.low < 0.0, "{w:?}");
        // A candidate without blocks keeps the interval.
        assert_eq!(widen_by_candidate_blocks(c, None, 0.99), c);
        // A stable candidate (every block alike) barely widens it.
        let mut all = Vec::new();
        let mut blocks = Vec::new();
        for _ in 0..10 {
            let mut b: Vec<f64> = lognormal(&mut rng, 1000, 80_000.0, 0.2);
            all.extend_from_slice(&b);
            blocks.push(summarize_at(&mut b, &block_grid()));
        }
        let run = summarize(&mut all);
        let p99 = at_level(&levels, &run, 0.99);
        let c = against_27us(p99);
        let noise = block_noise(&levels, &run, &block_grid(), &blocks, 0.99);
        let w = widen_by_candidate_blocks(c, noise, 0.99);
        assert!(
            w.abs_low > 50_000.0,
            "a shift in every block stays a regression: {w:?}"
        );
    }

    /// One run of ten blocks of 1 000 log-normal packets, each block's
    /// level drawn anew (noise that lasts a block): the run's grid and its
    /// blocks' grids.
    fn blocked_run(rng: &mut Rng, level_sigma: f64) -> (Vec<f64>, Vec<Vec<f64>>) {
        let mut all = Vec::new();
        let mut blocks = Vec::new();
        for _ in 0..10 {
            let level = (level_sigma * rng.normal()).exp();
            let mut b: Vec<f64> = lognormal(rng, 1000, 100.0 * level, 0.3);
            all.extend_from_slice(&b);
            blocks.push(summarize_at(&mut b, &block_grid()));
        }
        (summarize(&mut all), blocks)
    }

    #[test]
    fn block_noise_estimates_the_spread_between_runs() {
        // Checked against the spread of the run's median over 300 runs
        // drawn the same way (the independent route).
        let mut rng = Rng::new(11);
        let levels = grid();
        for p in [0.5, 0.99] {
            let mut values = Vec::new();
            let mut estimates = Vec::new();
            for _ in 0..300 {
                let (run, blocks) = blocked_run(&mut rng, 0.1);
                values.push(at_level(&levels, &run, p));
                let n = block_noise(&levels, &run, &block_grid(), &blocks, p).unwrap();
                assert_eq!(n.blocks, 10);
                estimates.push(n.var);
            }
            let mean = values.iter().sum::<f64>() / values.len() as f64;
            let true_var =
                values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64;
            let est_var = estimates.iter().sum::<f64>() / estimates.len() as f64;
            let ratio = (est_var / true_var).sqrt();
            assert!((0.8..1.25).contains(&ratio), "p{p}: sd ratio {ratio}");
        }
    }

    #[test]
    fn a_stage_near_zero_that_grows_is_a_regression() {
        // CI: an 80 ns decode stage of parity packets with 50 µs injected;
        // a delta-method ratio interval spanned −310..1561.
        let c = Change {
            base: 80.0,
            cand: 50_080.0,
            rel: 625.0,
            low: 150.0,
            high: 1_100.0,
            abs_low: 49_900.0,
            abs_high: 50_200.0,
        };
        let noise = |sd: f64| {
            Some(BlockNoise {
                var: sd * sd,
                blocks: 10,
            })
        };
        let w = widen_by_blocks(c, noise(30.0), noise(300.0), 1.0 - 1e-4);
        assert!(w.low > 100.0 && w.high >= c.high, "{w:?}");
        assert!(w.abs_low > 45_000.0, "{w:?}");
        assert_eq!(verdict(&w, 0.1, 20_000.0), Verdict::Regression);
    }

    #[test]
    fn one_block_far_off_barely_moves_the_median_noise() {
        // A burst in the first tenth of the run (3× slower): the run's
        // median moves by little, and so does its estimated noise.
        let mut rng = Rng::new(12);
        let mut all = Vec::new();
        let mut blocks = Vec::new();
        for i in 0..10 {
            let mut b = lognormal(&mut rng, 1000, if i == 0 { 300.0 } else { 100.0 }, 0.05);
            all.extend_from_slice(&b);
            blocks.push(summarize_at(&mut b, &block_grid()));
        }
        let run = summarize(&mut all);
        let n = block_noise(&grid(), &run, &block_grid(), &blocks, 0.5).unwrap();
        assert!(n.var.sqrt() < 2.0, "median sd {} ns of ~100", n.var.sqrt());
        // Blocks widen an interval, never narrow it.
        let c = Change {
            base: 100.0,
            cand: 100.0,
            rel: 0.0,
            low: -0.5,
            high: 0.5,
            abs_low: -50.0,
            abs_high: 50.0,
        };
        assert_eq!(widen_by_blocks(c, Some(n), Some(n), 0.99), c);
        assert_eq!(widen_by_blocks(c, None, Some(n), 0.99), c);
    }

    #[test]
    fn tails_beyond_the_replicates_are_extrapolated() {
        let mut rng = Rng::new(13);
        let mut a = lognormal(&mut rng, 5000, 100.0, 0.3);
        let mut b = lognormal(&mut rng, 5000, 100.0, 0.3);
        let (ga, gb) = (summarize(&mut a), summarize(&mut b));
        let levels = grid();
        let d = |g| Dist {
            levels: &levels,
            values: g,
            packets: 5000,
        };
        let width = |conf| {
            let c = quantile_change(d(&ga), d(&gb), 0.5, conf, &mut Rng::new(5));
            c.high - c.low
        };
        // The normal quantiles' ratio at 1 − 1e-5 against 0.99: 1.71.
        let ratio = width(1.0 - 1e-5) / width(0.99);
        assert!((1.5..1.95).contains(&ratio), "{ratio}");
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
    /// figures docs/ci.md states): 200 trials each.
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
