//! `xlap-trace compare BASELINE CANDIDATE`: per metric (a quantile of the
//! end-to-end latency or of a stage, per kind), the candidate's change
//! against the baseline with a bootstrap interval, and a verdict.

use super::stats::{
    block_noise, quantile_change, relative_means_something, separation, verdict, widen_by_blocks,
    widen_by_candidate_blocks, widen_by_runs, Change, Dist, Rng, Verdict,
};
use super::summary::at_level;
use super::summary::{StageSummary, Summary};
use anyhow::Result;
use serde::Serialize;
use xlap_exit::{failure, Code};
use xlap_records::tracer_cost::TracerCost;

/// A metric: `e2e.p99`, `stage:NAME.p50` (p with up to two decimals, e.g.
/// `p99.9`).
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub stage: String,
    pub p: f64,
}

impl std::str::FromStr for Metric {
    type Err = String;

    fn from_str(s: &str) -> Result<Metric, String> {
        let usage = || {
            format!("--metric wants e2e.pNN or stage:NAME.pNN (e.g. e2e.p99, stage:sock_queue__sock_recv_exit.p50), got {s:?}")
        };
        let (what, q) = s.rsplit_once(".p").ok_or_else(usage)?;
        // "p99.9": the split found ".p" before "99" only if no later one.
        let (what, q) = match what.rsplit_once(".p") {
            Some((w, q0)) if q0.chars().all(|c| c.is_ascii_digit()) && !q0.is_empty() => {
                (w, format!("{q0}.{}", q.trim_start_matches('p')))
            }
            _ => (what, q.to_string()),
        };
        let pct: f64 = q.parse().map_err(|_| usage())?;
        if !(0.0..=100.0).contains(&pct) {
            return Err(usage());
        }
        let stage = match what {
            "e2e" => "e2e".to_string(),
            _ => what
                .strip_prefix("stage:")
                .filter(|n| !n.is_empty())
                .ok_or_else(usage)?
                .to_string(),
        };
        Ok(Metric {
            stage,
            p: pct / 100.0,
        })
    }
}

impl Metric {
    pub fn label(&self) -> String {
        let pct = format!("{}", (self.p * 1e4).round() / 1e2);
        if self.stage == "e2e" {
            format!("e2e.p{pct}")
        } else {
            format!("stage:{}.p{pct}", self.stage)
        }
    }
}

/// Box statistics of a distribution (µs).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BoxStats {
    pub packets: u64,
    pub p25_us: f64,
    pub p50_us: f64,
    pub p75_us: f64,
    pub p99_us: f64,
}

fn dist<'a>(levels: &'a [f64], s: &'a StageSummary) -> Dist<'a> {
    Dist {
        levels,
        values: &s.quantiles_ns,
        packets: s.packets,
    }
}

/// Nanoseconds as µs with ns resolution (the JSON carries no digits the
/// clock does not have).
fn us(ns: f64) -> f64 {
    (ns).round() / 1e3
}

/// A relative change to 1e-6.
fn frac(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

fn box_of(levels: &[f64], s: &StageSummary) -> BoxStats {
    let d = dist(levels, s);
    BoxStats {
        packets: s.packets,
        p25_us: us(d.quantile(0.25)),
        p50_us: us(d.quantile(0.5)),
        p75_us: us(d.quantile(0.75)),
        p99_us: us(d.quantile(0.99)),
    }
}

/// One compared metric.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Row {
    pub metric: String,
    pub kind: u64,
    pub stage: String,
    pub side: String,
    pub quantile: f64,
    pub baseline_us: f64,
    pub candidate_us: f64,
    /// (candidate − baseline) / baseline.
    pub change: f64,
    /// The interval of the difference over the baseline (a base under
    /// 1 ns taken as 1 ns): `relative` says whether it means anything.
    pub ci_low: f64,
    pub ci_high: f64,
    /// Whether the relative figures mean something: a baseline quantile
    /// of at least 1 µs (below, read the µs).
    pub relative: bool,
    /// The interval of candidate − baseline, µs: what the verdict tests
    /// against the allowed regression (the larger of --min-change and
    /// --max-regression of the baseline).
    pub ci_low_us: f64,
    pub ci_high_us: f64,
    /// How far the change stands out of the packets around the quantile
    /// (stats::separation): at 1 or more the two runs' packets there no
    /// longer overlap. A single-run baseline needs [`MIN_EFFECT`] for a
    /// verdict.
    pub effect: f64,
    /// Whether the metric can decide the verdict: enough packets beyond
    /// its quantile in both runs (and, for a single-run baseline, the
    /// blocks that measure the machine's noise). One that cannot is
    /// `not_decided`, whatever its interval says.
    pub decides: bool,
    pub verdict: Verdict,
    /// Why the metric is `not_decided`, or why the interval alone would
    /// have said regression (or improvement) but the verdict does not;
    /// null otherwise.
    pub limit: Option<Limit>,
    /// What set the interval's width.
    pub width: Width,
    /// For an `inconclusive` metric, what made its interval wider than the
    /// allowed regression, with the figures (the range of the quantile
    /// over the blocks or runs that widened it); null otherwise.
    pub wide_because: Option<String>,
    pub baseline: BoxStats,
    pub candidate: BoxStats,
}

/// The whole comparison (`--json` prints it as is: a stable format).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Comparison {
    pub format_version: u32,
    /// regression if any metric regressed, else inconclusive if any is,
    /// else pass.
    pub verdict: Verdict,
    pub max_regression: f64,
    pub min_change_us: f64,
    /// Family-wise: the chance that an unchanged candidate gets no
    /// regression verdict on any metric.
    pub confidence: f64,
    /// The confidence of each metric's interval: `confidence` shared out
    /// over the metrics that can decide (Bonferroni), so that a hundred
    /// metrics do not make a false alarm likely.
    pub metric_confidence: f64,
    /// The metrics that can decide the verdict (`Row::decides`).
    pub deciding: usize,
    pub baseline_runs: Vec<String>,
    pub candidate_runs: Vec<String>,
    /// `--sample` of each side (`1/16`), absent where every datagram was
    /// stamped: the box statistics' `packets` are the sampled packets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_sample: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate_sample: Option<String>,
    /// What tracing cost on each side (`summary.json`'s `tracer`): beside
    /// the protocol's stages, so that a stage grown by the tracer's own
    /// cost is seen as such.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_tracer: Option<xlap_records::tracer_cost::TracerCost>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate_tracer: Option<xlap_records::tracer_cost::TracerCost>,
    /// Runs pooled in the baseline; with two or more, their spread widens
    /// every interval (a single-run baseline knows no machine noise).
    pub baseline_run_count: usize,
    /// What the intervals hold besides the packets' own sampling noise:
    /// `runs` (the spread between a pooled baseline's runs), `blocks` (the
    /// spread between blocks of each run in send order), `packets` (nothing
    /// more: summaries without blocks).
    pub noise: Noise,
    /// Stages of the baseline the candidate does not have.
    pub not_compared: Vec<String>,
    /// What the reader should know about the verdict's limits.
    pub notes: Vec<String>,
    /// Worst first: regressions, inconclusive, pass, improvements; within
    /// each, by the interval's lower end, highest first.
    pub rows: Vec<Row>,
}

/// A change of the tracer's BPF time per datagram that is only noise: it
/// has no distribution to test, and unchanged runs of the example protocol
/// differ by up to ×1.13 here (the statistics' windows see different
/// moments, and the figure includes the calls filtered out for the rest of
/// the machine). Growth beyond half is noted.
const TRACER_COST_NOISE: f64 = 0.5;

/// Why a metric whose interval clears the allowed regression is not
/// called one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    /// Fewer than [`MIN_TAIL_PACKETS`] packets beyond the quantile in a
    /// run: one stall of the machine delays that many consecutive packets.
    Packets,
    /// A single-run comparison where a side has no blocks for the stage
    /// (under 500 packets): the machine's noise is not measured.
    Blocks,
    /// A single-run baseline, and the two runs' packets around the
    /// quantile are not far apart (effect under [`MIN_EFFECT`]): a change
    /// of the machine's state for a whole run looks the same, and one
    /// baseline run cannot tell.
    Overlap,
}

/// What set a metric's interval width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Width {
    /// Both sides hold the same data (a run compared with itself): the
    /// change is exactly 0, the interval [0, 0].
    SameData,
    /// The packets' own sampling noise (the bootstrap) alone.
    Packets,
    /// The spread between blocks of a run (the candidate's, against a
    /// pooled baseline).
    Blocks,
    /// The spread between a pooled baseline's runs.
    Runs,
}

/// Whether a stage holds the same data on both sides: every difference is
/// exactly zero, and no noise can make it anything else.
fn same_data(b: &StageSummary, c: &StageSummary) -> bool {
    b.packets == c.packets
        && b.quantiles_ns == c.quantiles_ns
        && b.runs_ns == c.runs_ns
        && b.blocks_ns == c.blocks_ns
}

/// A duration for people: µs with one decimal, ms from 10 ms on.
fn time_text(ns: f64) -> String {
    if ns.abs() >= 1e7 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}

/// The range of a quantile over grids (a run's blocks, a baseline's runs).
fn range_text(levels: &[f64], grids: &[Vec<f64>], p: f64) -> Option<String> {
    let values: Vec<f64> = grids.iter().map(|g| at_level(levels, g, p)).collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo.is_finite() && hi.is_finite()).then(|| format!("{} to {}", time_text(lo), time_text(hi)))
}

/// Why an interval reaches past the allowed regression, in figures.
fn why_wide(
    width: Width,
    m: &Metric,
    base: &Summary,
    b: &StageSummary,
    cand: &Summary,
    c: &StageSummary,
    ch: &Change,
) -> String {
    let q = format!("p{}", (m.p * 1e4).round() / 1e2);
    let beyond = |n: u64| (n as f64 * m.p.min(1.0 - m.p)).round();
    let half = time_text((ch.abs_high - ch.abs_low) / 2.0);
    let blocks = |side: &str, s: &Summary, st: &StageSummary| {
        range_text(&s.block_levels, &st.blocks_ns, m.p).map(|r| {
            format!(
                "the {side}'s {q} ranges {r} over its {} blocks",
                st.blocks_ns.len()
            )
        })
    };
    match width {
        Width::SameData => "both sides hold the same data".to_string(),
        Width::Packets => format!(
            "the packets' own sampling (half-width {half}): {} and {} packets, about {} and {} beyond the {q}",
            b.packets,
            c.packets,
            beyond(b.packets),
            beyond(c.packets)
        ),
        Width::Blocks => {
            let parts: Vec<String> = [blocks("baseline", base, b), blocks("candidate", cand, c)]
                .into_iter()
                .flatten()
                .collect();
            format!(
                "the spread between blocks of each run (half-width {half}): {}",
                parts.join("; ")
            )
        }
        Width::Runs => {
            let runs = range_text(&base.levels, &b.runs_ns, m.p).map_or(String::new(), |r| {
                format!(": the baseline's {q} ranges {r} over its {} runs", b.runs_ns.len())
            });
            format!("the spread between the baseline's runs (half-width {half}){runs}")
        }
    }
}

/// Fewest packets beyond a quantile (on its nearer side) in each run for
/// the metric to decide: five per block. The bootstrap takes packets as
/// independent, but a stall delays consecutive packets together (3 ms at
/// 10 k packets/s: 30 of them, a whole p99 of a 3 000-packet run), and
/// blocks with fewer tell nothing of how the tail varies.
pub const MIN_TAIL_PACKETS: f64 = 50.0;

/// The separation a single-run comparison needs for a verdict (see
/// `Row::effect`): three times the room of the packets around the
/// quantile. At 1 they merely stop overlapping, and a queue that grows
/// through a whole run (the receiver falling behind on a loaded machine)
/// does that to every stage that queues: 1 to 2.2 measured on the
/// example's e2e and receiver totals, with and without a change. A delay
/// added to a stage moves its tight packets by 150 to 700 times their room.
pub const MIN_EFFECT: f64 = 3.0;

/// Where a comparison's intervals take the machine's noise from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Noise {
    Runs,
    Blocks,
    Packets,
}

/// A single run shorter than this is said to be short: noise that persists
/// longer than its blocks is not in its spread.
const SHORT_RUN_S: f64 = 2.0;

/// The metrics when none are named (compare, history): p50 and p99 of the
/// end-to-end latency and of every stage of `base`.
pub fn default_metrics(base: &Summary) -> Vec<Metric> {
    let mut names: Vec<&str> = Vec::new();
    for s in &base.stages {
        if !names.contains(&s.stage.as_str()) {
            names.push(&s.stage);
        }
    }
    names
        .iter()
        .flat_map(|n| {
            [0.5, 0.99].map(|p| Metric {
                stage: n.to_string(),
                p,
            })
        })
        .collect()
}

/// The thresholds and confidence of a comparison.
#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// Relative change allowed (0.1 = 10 %).
    pub max_regression: f64,
    /// Absolute change allowed, ns.
    pub min_change_ns: f64,
    /// Family-wise over the metrics compared (see `Comparison`).
    pub confidence: f64,
}

pub fn compare(
    base: &Summary,
    cand: &Summary,
    metrics: &[Metric],
    th: Thresholds,
) -> Result<Comparison> {
    if base.levels != cand.levels {
        return Err(failure(
            Code::BadInput,
            "the two summaries use different quantile levels (written by different xlap-trace versions): summarize both runs with one version",
        ));
    }
    let named = !metrics.is_empty();
    let metrics = if named {
        metrics.to_vec()
    } else {
        default_metrics(base)
    };
    let noise = noise_of(base, cand);
    let pairs: Vec<(&Metric, &StageSummary, &StageSummary)> = metrics
        .iter()
        .flat_map(|m| {
            base.stages
                .iter()
                .filter(move |b| b.stage == m.stage)
                .filter_map(move |b| cand.stage(b.kind, &b.stage).map(|c| (m, b, c)))
        })
        .collect();
    let not_compared = uncompared(&metrics, &pairs, named, base)?;
    // Bonferroni over the metrics that can decide: only they can make a
    // false alarm.
    let deciding = pairs
        .iter()
        .filter(|(m, b, c)| can_decide(noise, b, c, m.p).is_none())
        .count();
    let metric_confidence = 1.0 - (1.0 - th.confidence) / deciding.max(1) as f64;
    let mut judge = Judge {
        base,
        cand,
        th,
        noise,
        confidence: metric_confidence,
        // One generator per comparison, seeded by what is compared: the
        // same inputs give the same intervals.
        rng: Rng::new(0x5EED_C0DE),
    };
    let mut rows: Vec<Row> = pairs.iter().map(|&(m, b, c)| judge.row(m, b, c)).collect();
    // Within a verdict, the change that stands out most first: a delay
    // added to one stage moves its tight packets far past the baseline's,
    // while the stages that queue behind it (e2e, the receiver's total)
    // are spread out; the origin is named first.
    rows.sort_by(|a, b| {
        rank(a.verdict)
            .cmp(&rank(b.verdict))
            .then(b.effect.total_cmp(&a.effect))
    });
    let overall = rows
        .iter()
        .map(|r| r.verdict)
        .filter(|v| *v != Verdict::NotDecided)
        .min_by_key(|v| rank(*v).min(2))
        // Nothing compared, or nothing that can decide, decides nothing:
        // never a pass.
        .map_or(Verdict::Inconclusive, |v| match v {
            Verdict::Improvement => Verdict::Pass,
            v => v,
        });
    let notes = notes_of(&rows, noise, base, cand, th.max_regression);
    Ok(Comparison {
        format_version: 2,
        verdict: overall,
        max_regression: th.max_regression,
        min_change_us: th.min_change_ns / 1e3,
        confidence: th.confidence,
        metric_confidence,
        deciding,
        baseline_runs: base.runs.clone(),
        candidate_runs: cand.runs.clone(),
        baseline_sample: base.sample.as_ref().map(|s| s.describe()),
        candidate_sample: cand.sample.as_ref().map(|s| s.describe()),
        baseline_tracer: base.tracer.clone(),
        candidate_tracer: cand.tracer.clone(),
        baseline_run_count: base
            .stages
            .iter()
            .map(|s| s.runs_ns.len().max(1))
            .max()
            .unwrap_or(1),
        noise,
        not_compared,
        notes,
        rows,
    })
}

/// What a comparison's intervals hold besides the packets' sampling noise:
/// the spread between a pooled baseline's runs, else the blocks of single
/// runs, else nothing more (summaries of an older version).
fn noise_of(base: &Summary, cand: &Summary) -> Noise {
    let pooled = base.stages.iter().any(|s| s.runs_ns.len() >= 2);
    let blocked = base.stages.iter().any(|s| !s.blocks_ns.is_empty())
        && cand.stages.iter().any(|s| !s.blocks_ns.is_empty());
    if pooled {
        Noise::Runs
    } else if blocked {
        Noise::Blocks
    } else {
        Noise::Packets
    }
}

/// Whether a metric can decide, from the data alone (never from its
/// change): enough packets beyond the quantile in both runs, and for a
/// single-run comparison with blocks, blocks on both sides. `Some`: what
/// keeps it from deciding.
fn can_decide(noise: Noise, b: &StageSummary, c: &StageSummary, p: f64) -> Option<Limit> {
    let beyond = |n: u64| n as f64 * p.min(1.0 - p);
    if beyond(b.packets) < MIN_TAIL_PACKETS || beyond(c.packets) < MIN_TAIL_PACKETS {
        Some(Limit::Packets)
    } else if noise == Noise::Blocks && (b.blocks_ns.is_empty() || c.blocks_ns.is_empty()) {
        Some(Limit::Blocks)
    } else {
        None
    }
}

/// The stages of the metrics that are not in both runs: said (not
/// compared) when the metrics are the defaults, a usage error when the
/// user named them.
fn uncompared(
    metrics: &[Metric],
    pairs: &[(&Metric, &StageSummary, &StageSummary)],
    named: bool,
    base: &Summary,
) -> Result<Vec<String>> {
    let mut not_compared: Vec<String> = Vec::new();
    for m in metrics {
        if pairs.iter().any(|(pm, _, _)| pm.stage == m.stage) {
            continue;
        }
        if named {
            let mut stages: Vec<&str> = base.stages.iter().map(|s| s.stage.as_str()).collect();
            stages.sort_unstable();
            stages.dedup();
            return Err(failure(
                Code::Usage,
                format!(
                    "no stage {} in both runs; the stages are: {}",
                    m.stage,
                    stages.join(", ")
                ),
            ));
        }
        // A stage of the baseline the candidate lacks (its points differ: a
        // marker that moved, a point set): said, not compared.
        if !not_compared.contains(&m.stage) {
            not_compared.push(m.stage.clone());
        }
    }
    Ok(not_compared)
}

/// The order of verdicts in a comparison's rows and its overall verdict.
fn rank(v: Verdict) -> u8 {
    match v {
        Verdict::Regression => 0,
        Verdict::Inconclusive => 1,
        Verdict::Pass => 2,
        Verdict::Improvement => 3,
        Verdict::NotDecided => 4,
    }
}

/// What judges each metric of one comparison.
struct Judge<'a> {
    base: &'a Summary,
    cand: &'a Summary,
    th: Thresholds,
    noise: Noise,
    /// Each metric's confidence (the family's, over the deciding metrics).
    confidence: f64,
    rng: Rng,
}

impl Judge<'_> {
    /// The row of metric `m` on baseline stage `b` and candidate stage `c`.
    fn row(&mut self, m: &Metric, b: &StageSummary, c: &StageSummary) -> Row {
        let levels = &self.base.levels;
        let unfit = can_decide(self.noise, b, c, m.p);
        let judged = if same_data(b, c) {
            Self::unchanged(levels, m, b, unfit, self.th)
        } else {
            self.changed(m, b, c, unfit)
        };
        let ch = judged.change;
        let rel_of = |ns: f64| frac(ns / ch.base.max(1.0));
        Row {
            metric: m.label(),
            kind: b.kind,
            stage: b.stage.clone(),
            side: b.side.clone(),
            quantile: m.p,
            baseline_us: us(ch.base),
            candidate_us: us(ch.cand),
            change: frac(ch.rel),
            ci_low: rel_of(ch.abs_low),
            ci_high: rel_of(ch.abs_high),
            relative: relative_means_something(ch.base),
            ci_low_us: us(ch.abs_low),
            ci_high_us: us(ch.abs_high),
            effect: frac(judged.effect),
            decides: unfit.is_none(),
            verdict: judged.verdict,
            limit: judged.limit,
            width: judged.width,
            wide_because: judged.wide_because,
            baseline: box_of(levels, b),
            candidate: box_of(levels, c),
        }
    }

    /// The same data on both sides: exactly no change, no interval to
    /// draw, nothing to widen.
    fn unchanged(
        levels: &[f64],
        m: &Metric,
        b: &StageSummary,
        unfit: Option<Limit>,
        th: Thresholds,
    ) -> Judged {
        let q = dist(levels, b).quantile(m.p);
        let exact = Change {
            base: q,
            cand: q,
            rel: 0.0,
            low: 0.0,
            high: 0.0,
            abs_low: 0.0,
            abs_high: 0.0,
        };
        let verdict = match unfit {
            Some(_) => Verdict::NotDecided,
            None => verdict(&exact, th.max_regression, th.min_change_ns),
        };
        Judged {
            change: exact,
            width: Width::SameData,
            effect: 0.0,
            verdict,
            limit: unfit,
            wide_because: None,
        }
    }

    /// A change: its interval from the packets, widened by the noise the
    /// summaries measured, and its verdict.
    fn changed(
        &mut self,
        m: &Metric,
        b: &StageSummary,
        c: &StageSummary,
        unfit: Option<Limit>,
    ) -> Judged {
        let (base, cand, th, confidence) = (self.base, self.cand, self.th, self.confidence);
        let levels = &base.levels;
        let half = |c: &Change| c.abs_high - c.abs_low;
        let sampled: Change = quantile_change(
            dist(levels, b),
            dist(levels, c),
            m.p,
            confidence,
            &mut self.rng,
        );
        let noise = |s: &Summary, st: &StageSummary| {
            block_noise(
                levels,
                &st.quantiles_ns,
                &s.block_levels,
                &st.blocks_ns,
                m.p,
            )
        };
        let pooled = b.runs_ns.len() >= 2;
        let (ch, width) = if pooled {
            let per_run: Vec<f64> = b.runs_ns.iter().map(|g| at_level(levels, g, m.p)).collect();
            // The spread between the baseline's runs; and the candidate,
            // one run, also by its own blocks: a stall in one of its blocks
            // can carry its p99 (1.5 ms in a tenth of a run took a stage's
            // p99 from 27 to 277 µs), which no spread of the baseline holds.
            let by_runs = widen_by_runs(sampled, &per_run, confidence);
            let by_blocks = widen_by_candidate_blocks(by_runs, noise(cand, c), confidence);
            let width = if half(&by_blocks) > half(&by_runs) {
                Width::Blocks
            } else if half(&by_runs) > half(&sampled) {
                Width::Runs
            } else {
                Width::Packets
            };
            (by_blocks, width)
        } else {
            let by_blocks = widen_by_blocks(sampled, noise(base, b), noise(cand, c), confidence);
            let width = if half(&by_blocks) > half(&sampled) {
                Width::Blocks
            } else {
                Width::Packets
            };
            (by_blocks, width)
        };
        let effect = separation(levels, &b.quantiles_ns, &c.quantiles_ns, m.p);
        // A pooled baseline measures the spread between runs; a single run
        // does not, so its change must also stand out of the packets.
        let overlap = self.noise != Noise::Runs && effect.abs() < MIN_EFFECT;
        let (verdict, limit) = match (unfit, verdict(&ch, th.max_regression, th.min_change_ns)) {
            // Too few packets decide nothing, whatever the interval says.
            (Some(l), _) => (Verdict::NotDecided, Some(l)),
            (None, Verdict::Regression) if overlap => (Verdict::Inconclusive, Some(Limit::Overlap)),
            // Not worse by more than allowed: a pass, if no improvement.
            (None, Verdict::Improvement) if overlap => (Verdict::Pass, Some(Limit::Overlap)),
            (None, v) => (v, None),
        };
        let wide_because = (verdict == Verdict::Inconclusive && limit.is_none())
            .then(|| why_wide(width, m, base, b, cand, c, &ch));
        Judged {
            change: ch,
            width,
            effect,
            verdict,
            limit,
            wide_because,
        }
    }
}

/// One metric judged.
struct Judged {
    change: Change,
    width: Width,
    effect: f64,
    verdict: Verdict,
    limit: Option<Limit>,
    wide_because: Option<String>,
}

/// The notes of a comparison: what it could not decide, and what the
/// reader should know about its inputs (short runs, samples, the tracer's
/// own cost).
fn notes_of(
    rows: &[Row],
    noise: Noise,
    base: &Summary,
    cand: &Summary,
    max_regression: f64,
) -> Vec<String> {
    let mut notes = Vec::new();
    if rows.is_empty() {
        notes.push(
            "no metric of the baseline is in the candidate (other kinds or stages): nothing was compared".into(),
        );
    } else if rows.iter().all(|r| r.verdict == Verdict::NotDecided) {
        notes.push(format!(
            "no metric can decide (each needs {MIN_TAIL_PACKETS} packets beyond its quantile in both runs): record longer runs"
        ));
    }
    if !rows.is_empty() && rows.iter().all(|r| r.width == Width::SameData) {
        notes.push(
            "the baseline and the candidate hold the same data (a run compared with itself?): every change is exactly 0".into(),
        );
    }
    match noise {
        Noise::Runs => {}
        Noise::Blocks => {
            let short = [base.duration_s, cand.duration_s]
                .into_iter()
                .flatten()
                .fold(f64::INFINITY, f64::min);
            if short < SHORT_RUN_S {
                notes.push(format!(
                    "a run lasts only {short:.1} s: noise that lasts longer than its blocks ({:.0} ms) is not measured, so a change counts only where the runs' packets no longer overlap; record runs of several seconds or pool baseline runs (xlap-trace summary RUN... -o FILE) to find smaller ones",
                    short * 1e3 / super::summary::BLOCKS as f64
                ));
            }
        }
        Noise::Packets => notes.push(
            "the summaries have no blocks (written by an older xlap-trace): the intervals hold the packets' sampling noise only; pool baseline runs to account for the machine's".into(),
        ),
    }
    let (base_sample, cand_sample) = (
        base.sample.as_ref().map(|s| s.describe()),
        cand.sample.as_ref().map(|s| s.describe()),
    );
    if base_sample != cand_sample {
        let say = |s: &Option<String>| {
            s.as_ref()
                .map_or("every datagram".to_string(), |s| format!("sampled {s}"))
        };
        notes.push(format!(
            "the baseline is {} and the candidate {}: quantiles compare alike, packet counts do not (each sampled packet stands for N)",
            say(&base_sample),
            say(&cand_sample)
        ));
    }
    notes.extend(tracer_note(base, cand, max_regression));
    notes
}

/// What the tracer's own cost says of a comparison: that tracing got
/// dearer (its BPF time per datagram grew, and so did each program run's),
/// or that the programs ran more often per traced datagram at the same
/// cost per run (other traffic on the machine, or more points), which
/// tells nothing of the latency tracing added to the traced datagrams.
fn tracer_note(base: &Summary, cand: &Summary, max_regression: f64) -> Option<String> {
    let figure = |s: &Summary, f: fn(&TracerCost) -> Option<f64>| s.tracer.as_ref().and_then(f);
    let grew = |b: f64, c: f64| b > 0.0 && c > b * (1.0 + max_regression.max(TRACER_COST_NOISE));
    let (b, c) = (
        figure(base, |t| t.bpf_ns_per_datagram)?,
        figure(cand, |t| t.bpf_ns_per_datagram)?,
    );
    if !grew(b, c) {
        return None;
    }
    let per_run = (
        figure(base, |t| t.bpf_ns_per_run),
        figure(cand, |t| t.bpf_ns_per_run),
    );
    if let (Some(rb), Some(rc)) = per_run {
        if !grew(rb, rc) {
            return Some(format!(
                "the capture's programs ran ×{:.2} as often per traced datagram (BPF time per datagram {b:.0} → {c:.0} ns, per program run {rb:.0} → {rc:.0} ns): other traffic on the machine or more points ran them, each run did not get dearer",
                (c / rc) / (b / rb)
            ));
        }
    }
    Some(format!(
        "tracing itself got dearer: the capture's BPF time per datagram went from {b:.0} to {c:.0} ns (×{:.2}); on a path that runs on one CPU that much of a stage's growth is the tracer's",
        c / b
    ))
}

/// `--min-change 10us` (also `ns`, `ms`; a bare number is µs), in ns.
pub fn parse_duration_ns(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e6)
    } else {
        (t, 1e3)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: give a duration such as 10us, 500ns or 1ms"))?;
    if v < 0.0 || !v.is_finite() {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(v * scale)
}

/// `--max-regression 5%` or `0.05`.
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    let v = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{s:?}: give a fraction (0.05) or a percentage (5%)"))?;
    if !(0.0..10.0).contains(&v) {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_parse() {
        let m: Metric = "e2e.p99".parse().unwrap();
        assert_eq!((m.stage.as_str(), m.p), ("e2e", 0.99));
        let m: Metric = "stage:sock_queue__sock_recv_exit.p50".parse().unwrap();
        assert_eq!(m.stage, "sock_queue__sock_recv_exit");
        assert_eq!(m.label(), "stage:sock_queue__sock_recv_exit.p50");
        let m: Metric = "e2e.p99.9".parse().unwrap();
        assert!((m.p - 0.999).abs() < 1e-12);
        assert_eq!(m.label(), "e2e.p99.9");
        for bad in ["e2e", "p99", "stage:.p50", "x.p50", "e2e.p101", "e2e.pxx"] {
            assert!(bad.parse::<Metric>().is_err(), "{bad}");
        }
        assert_eq!(parse_duration_ns("10us"), Ok(10_000.0));
        assert_eq!(parse_duration_ns("2"), Ok(2_000.0));
        assert_eq!(parse_duration_ns("1ms"), Ok(1e6));
        assert!(parse_duration_ns("fast").is_err());
        assert_eq!(parse_fraction("5%"), Ok(0.05));
        assert_eq!(parse_fraction("0.1"), Ok(0.1));
        assert!(parse_fraction("x").is_err());
    }

    fn traced_at(bpf_ns: f64) -> Summary {
        let levels = super::super::summary::grid();
        let quantiles_ns = levels.iter().map(|p| 10_000.0 + 1_000.0 * p).collect();
        Summary {
            summary_version: super::super::summary::SUMMARY_VERSION,
            runs: vec!["r".into()],
            hosts: Vec::new(),
            kernels: Vec::new(),
            stamps: 0,
            lost: 0,
            bpf_ns_per_stamp: None,
            levels,
            duration_s: Some(10.0),
            block_levels: Vec::new(),
            sample: None,
            tracer: Some(xlap_records::tracer_cost::TracerCost {
                bpf_ns_per_datagram: Some(bpf_ns),
                recorder_cpu_share: Some(0.02),
                ..Default::default()
            }),
            stages: vec![StageSummary {
                stage: "e2e".into(),
                side: String::new(),
                position: 0,
                kind: 1,
                packets: 10_000,
                quantiles_ns,
                runs_ns: Vec::new(),
                blocks_ns: Vec::new(),
            }],
        }
    }

    /// One e2e stage of `packets` packets, uniform from `lo` to `hi` ns,
    /// with blocks whose p99 goes from `hi` (blocks 0..8) to `burst` (the
    /// last block: a stall in a tenth of the run).
    fn uniform(packets: u64, lo: f64, hi: f64, burst: Option<f64>) -> Summary {
        let mut s = traced_at(1_000.0);
        let levels = s.levels.clone();
        let at = |p: f64, top: f64| lo + (top - lo) * p;
        s.stages[0].packets = packets;
        s.stages[0].quantiles_ns = levels.iter().map(|&p| at(p, hi)).collect();
        if let Some(burst) = burst {
            s.block_levels = super::super::summary::block_grid();
            s.stages[0].blocks_ns = (0..super::super::summary::BLOCKS)
                .map(|i| {
                    let top = if i == 9 { burst } else { hi };
                    s.block_levels.iter().map(|&p| at(p, top)).collect()
                })
                .collect();
        }
        s
    }

    const TH: Thresholds = Thresholds {
        max_regression: 0.1,
        min_change_ns: 20_000.0,
        confidence: 0.99,
    };

    #[test]
    fn too_few_packets_decide_nothing_and_are_counted_apart() {
        let (one, two) = (
            uniform(1, 10_000.0, 10_000.0, None),
            uniform(2, 5_000.0, 6_000.0, None),
        );
        let c = compare(&one, &two, &[], TH).unwrap();
        assert!(c
            .rows
            .iter()
            .all(|r| r.verdict == Verdict::NotDecided && r.limit == Some(Limit::Packets)));
        // Nothing that can decide: never a pass.
        assert_eq!(c.verdict, Verdict::Inconclusive);
        assert!(c.notes.iter().any(|n| n.contains("no metric can decide")));
        let text = super::super::render::table(&c);
        assert!(text.contains("not decided (few packets)"), "{text}");
        assert!(text.contains("not decided: 2 of 2 metrics"), "{text}");
        let junit = super::super::render::junit(&c);
        assert!(junit.contains("skipped=\"2\""), "{junit}");
    }

    #[test]
    fn a_summary_against_itself_passes_with_an_empty_interval() {
        let s = uniform(100_000, 1_000.0, 900_000.0, Some(9_000_000.0));
        let c = compare(&s, &s, &[], TH).unwrap();
        assert_eq!(c.verdict, Verdict::Pass);
        for r in &c.rows {
            assert_eq!((r.ci_low_us, r.ci_high_us, r.change), (0.0, 0.0, 0.0));
            assert_eq!((r.width, r.verdict), (Width::SameData, Verdict::Pass));
        }
    }

    #[test]
    fn a_wide_interval_says_what_widened_it() {
        // Two runs of one distribution, each with a stalled block: the
        // p99 differs between blocks by milliseconds.
        let base = uniform(100_000, 1_000.0, 900_000.0, Some(9_000_000.0));
        let mut cand = uniform(100_000, 1_000.0, 900_000.0, Some(9_000_000.0));
        cand.stages[0].quantiles_ns[1] += 1.0; // not the same data
        let p99 = Metric {
            stage: "e2e".into(),
            p: 0.99,
        };
        let c = compare(&base, &cand, &[p99], TH).unwrap();
        let r = &c.rows[0];
        assert_eq!(
            (r.verdict, r.width),
            (Verdict::Inconclusive, Width::Blocks),
            "{r:?}"
        );
        let why = r.wide_because.as_deref().unwrap();
        assert!(
            why.contains("the baseline's p99 ranges 891.0 µs to 8910.0 µs over its 10 blocks"),
            "{why}"
        );
        assert!(super::super::render::markdown(&c)
            .contains("What made the inconclusive intervals wide"));
    }

    #[test]
    fn the_tracers_cost_is_shown_and_a_much_dearer_tracer_is_noted() {
        let th = Thresholds {
            max_regression: 0.1,
            min_change_ns: 20_000.0,
            confidence: 0.99,
        };
        let dearer = |c: &Comparison| c.notes.iter().any(|n| n.contains("got dearer"));
        let noise = compare(&traced_at(4_662.0), &traced_at(5_245.0), &[], th).unwrap();
        assert!(!dearer(&noise), "{:?}", noise.notes);
        let text = super::super::render::markdown(&noise);
        assert!(
            text.contains("Tracer cost (baseline → candidate): BPF 4662 → 5245 ns per datagram, recorder 2.0 % → 2.0 % of a CPU."),
            "{text}"
        );
        let worse = compare(&traced_at(2_000.0), &traced_at(3_100.0), &[], th).unwrap();
        assert!(dearer(&worse), "{:?}", worse.notes);
        // The same growth at the same cost per run: other traffic ran the
        // programs more often; not dearer, and said so.
        let per_run = |bpf_ns: f64, run_ns: f64| {
            let mut s = traced_at(bpf_ns);
            s.tracer.as_mut().unwrap().bpf_ns_per_run = Some(run_ns);
            s
        };
        let busier = compare(&per_run(2_000.0, 150.0), &per_run(3_100.0, 160.0), &[], th).unwrap();
        assert!(!dearer(&busier), "{:?}", busier.notes);
        assert!(
            busier
                .notes
                .iter()
                .any(|n| n.contains("ran ×1.45 as often")),
            "{:?}",
            busier.notes
        );
        let each_run =
            compare(&per_run(2_000.0, 150.0), &per_run(3_100.0, 240.0), &[], th).unwrap();
        assert!(dearer(&each_run), "{:?}", each_run.notes);
    }
}
