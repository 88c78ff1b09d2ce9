//! Per-host latency from pairwise RTTs: every statistic of every pair's RTT
//! distribution, less twice the pair's hardware time, solved for the hosts
//! by least squares; a bootstrap over each pair's samples for the error.

use super::linalg::LeastSquares;
use super::stats::{all_stats, interval, resample, STATS};
use super::system::{Determined, Refusal, System};
use serde::Serialize;
use std::collections::BTreeMap;
use xlap_random::Rng;

/// One measured pair: the samples of one `probe rtt` file.
#[derive(Clone, Debug)]
pub struct PairInput {
    pub from: String,
    pub to: String,
    /// Where it came from (a file name), for messages.
    pub source: String,
    pub samples_ns: Vec<f64>,
    pub lost: u64,
    /// One-way hardware latency of the pair (h_ij), nanoseconds.
    pub hardware_ns: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Bootstrap resamples (0: no intervals).
    pub resamples: usize,
    pub confidence: f64,
    pub seed: u64,
}

/// The estimate of one statistic of one host, microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct StatEstimate {
    pub us: f64,
    /// The bootstrap interval at the chosen confidence (null without one).
    pub lo_us: Option<f64>,
    pub hi_us: Option<f64>,
    /// The larger distance from the estimate to an end of its interval.
    pub err_us: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HostEstimate {
    pub host: String,
    /// By statistic: mean, min, p50, p90, p99, max.
    pub stats: BTreeMap<String, StatEstimate>,
    /// The model's own limit: t is the mean of the host's send and receive
    /// latencies, and either one alone may differ from it by up to t.
    pub conceptual_error_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PairResult {
    pub from: String,
    pub to: String,
    pub source: String,
    pub samples: usize,
    pub lost: u64,
    pub hardware_us: f64,
    /// The pair's RTT statistics.
    pub rtt_us: BTreeMap<String, f64>,
    /// Measured minus fitted RTT (zero when exactly determined).
    pub residual_us: BTreeMap<String, f64>,
}

/// The whole estimate (the JSON of `estimate -f json`).
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    pub format_version: u32,
    pub hosts: Vec<String>,
    pub equations: usize,
    pub determined: Determined,
    /// σ_max/σ_min of the design matrix: how much the RTTs' errors can be
    /// amplified in the hosts' estimates (2 for three hosts, all pairs).
    pub condition_number: f64,
    pub resamples: usize,
    pub confidence: f64,
    pub seed: u64,
    /// Statistic names in table order.
    pub stats: Vec<String>,
    pub estimates: Vec<HostEstimate>,
    pub pairs: Vec<PairResult>,
    /// Root mean square of the residuals per statistic.
    pub residual_rms_us: BTreeMap<String, f64>,
    pub notes: Vec<String>,
}

pub const FORMAT_VERSION: u32 = 1;

/// The assumptions every estimate rests on (printed with it).
pub const ASSUMPTIONS: &[&str] = &[
    "t is a host's software latency per direction, the mean of its send and receive latency (RTT_ij = 2t_i + 2t_j + 2h_ij); either direction alone may differ from t by up to t (conceptual_error_us)",
    "quantiles are solved level by level, which assumes comonotone per-host latencies (a slow RTT is slow on both hosts); the mean needs no such assumption",
    "time on the path besides the hosts' software that --hardware-us does not name (wire, switch, the kernel's transmit and receive) is counted in the hosts' t, half of a pair's per host",
    "intervals come from resampling each pair's RTTs (and its files, when several measure it from the same end): with one file per pair they cover the sampling error, not a change of the system between runs; those of min and max understate it",
];

/// Solves the system of `pairs`.
pub fn estimate(pairs: &[PairInput], opts: Options) -> Result<Estimate, (System, Refusal)> {
    let names: Vec<(&str, &str)> = pairs
        .iter()
        .map(|p| (p.from.as_str(), p.to.as_str()))
        .collect();
    let system = System::new(&names);
    let (solver, determined) = match system.solver() {
        Ok(s) => s,
        Err(r) => return Err((system, r)),
    };
    let mut own: Vec<Vec<f64>> = pairs.iter().map(|p| p.samples_ns.clone()).collect();
    let rhs = rhs_of(pairs, &mut own);
    let solution: Vec<Vec<f64>> = rhs.iter().map(|b| solver.solve(b)).collect();

    let hosts = system.hosts.len();
    let mut reps = bootstrap(pairs, &system, &solver, opts);

    let us = |ns: f64| ns / 1e3;
    let estimates = (0..hosts)
        .map(|h| {
            let stats = STATS
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let est = solution[k][h];
                    let (lo, hi, err) = if opts.resamples > 0 {
                        let (lo, hi) = interval(&mut reps[k][h], opts.confidence);
                        (
                            Some(us(lo)),
                            Some(us(hi)),
                            Some(us((hi - est).max(est - lo))),
                        )
                    } else {
                        (None, None, None)
                    };
                    let e = StatEstimate {
                        us: us(est),
                        lo_us: lo,
                        hi_us: hi,
                        err_us: err,
                    };
                    (s.name(), e)
                })
                .collect();
            HostEstimate {
                host: system.hosts[h].clone(),
                stats,
                conceptual_error_us: us(solution[0][h].max(0.0)),
            }
        })
        .collect::<Vec<_>>();

    let fitted: Vec<Vec<f64>> = solution.iter().map(|x| system.design.mul_vec(x)).collect();
    let (pair_results, residual_rms_us) = pair_results(pairs, &rhs, &fitted);
    let notes = notes_of(&estimates);
    Ok(Estimate {
        format_version: FORMAT_VERSION,
        hosts: system.hosts.clone(),
        equations: pairs.len(),
        determined,
        condition_number: system.condition_number(),
        resamples: opts.resamples,
        confidence: opts.confidence,
        seed: opts.seed,
        stats: STATS.iter().map(|s| s.name()).collect(),
        estimates,
        pairs: pair_results,
        residual_rms_us,
        notes,
    })
}

/// rhs[stat][pair]: each pair's statistics of `samples` less 2h.
fn rhs_of(pairs: &[PairInput], samples: &mut [Vec<f64>]) -> Vec<Vec<f64>> {
    let per_pair: Vec<Vec<f64>> = samples
        .iter_mut()
        .zip(pairs)
        .map(|(s, p)| {
            all_stats(s)
                .into_iter()
                .map(|v| v - 2.0 * p.hardware_ns)
                .collect()
        })
        .collect();
    (0..STATS.len())
        .map(|k| per_pair.iter().map(|v| v[k]).collect())
        .collect()
}

/// Bootstrap: solution replicates [stat][host][replicate]. A pair measured
/// from the same end in several files is resampled in two stages, its
/// files first, then each drawn file's samples: the spread between the
/// runs enters the interval, not only the sampling error within one. (The
/// two ends of a pair are not exchangeable: a host's latency as prober
/// and as responder may differ, and measuring from both ends averages the
/// two.)
fn bootstrap(
    pairs: &[PairInput],
    system: &System,
    solver: &LeastSquares,
    opts: Options,
) -> Vec<Vec<Vec<f64>>> {
    let hosts = system.hosts.len();
    let mut reps = vec![vec![Vec::with_capacity(opts.resamples); hosts]; STATS.len()];
    let mut rng = Rng::new(opts.seed);
    let mut drawn: Vec<Vec<f64>> = vec![Vec::new(); pairs.len()];
    let same_pair: Vec<Vec<usize>> = system
        .pairs
        .iter()
        .map(|p| {
            (0..pairs.len())
                .filter(|r| system.pairs[*r] == *p)
                .collect()
        })
        .collect();
    for _ in 0..opts.resamples {
        for (d, files) in drawn.iter_mut().zip(&same_pair) {
            let file = files[rng.below(files.len())];
            resample(&mut rng, &pairs[file].samples_ns, d);
        }
        for (k, b) in rhs_of(pairs, &mut drawn).iter().enumerate() {
            for (h, x) in solver.solve(b).into_iter().enumerate() {
                reps[k][h].push(x);
            }
        }
    }
    reps
}

/// Each pair's RTT statistics and residuals, and the residuals' RMS per
/// statistic.
#[allow(clippy::type_complexity)]
fn pair_results(
    pairs: &[PairInput],
    rhs: &[Vec<f64>],
    fitted: &[Vec<f64>],
) -> (Vec<PairResult>, BTreeMap<String, f64>) {
    let us = |ns: f64| ns / 1e3;
    let pair_results = pairs
        .iter()
        .enumerate()
        .map(|(r, p)| PairResult {
            from: p.from.clone(),
            to: p.to.clone(),
            source: p.source.clone(),
            samples: p.samples_ns.len(),
            lost: p.lost,
            hardware_us: us(p.hardware_ns),
            rtt_us: STATS
                .iter()
                .enumerate()
                .map(|(k, s)| (s.name(), us(rhs[k][r] + 2.0 * p.hardware_ns)))
                .collect(),
            residual_us: STATS
                .iter()
                .enumerate()
                .map(|(k, s)| (s.name(), us(rhs[k][r] - fitted[k][r])))
                .collect(),
        })
        .collect::<Vec<_>>();
    let residual_rms_us = STATS
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let ss: f64 = (0..pairs.len())
                .map(|r| (rhs[k][r] - fitted[k][r]).powi(2))
                .sum();
            (s.name(), us((ss / pairs.len() as f64).sqrt()))
        })
        .collect();
    (pair_results, residual_rms_us)
}

/// The model's assumptions, and each host whose estimates came out
/// negative.
fn notes_of(estimates: &[HostEstimate]) -> Vec<String> {
    let mut notes: Vec<String> = ASSUMPTIONS.iter().map(|s| s.to_string()).collect();
    for e in estimates {
        let negative: Vec<&str> = e
            .stats
            .iter()
            .filter(|(_, v)| v.us < 0.0)
            .map(|(k, _)| k.as_str())
            .collect();
        if !negative.is_empty() {
            notes.push(format!(
                "{}: negative {}: the model does not fit these RTTs (a host whose latency depends on its peer, or a hardware time given too large)",
                e.host,
                negative.join(", ")
            ));
        }
    }
    notes
}
