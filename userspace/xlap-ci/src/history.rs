//! `xlap-trace history SUMMARY...`: per-stage quantiles over a series of CI
//! runs (oldest first), so a slow drift that no single comparison flags
//! shows: a table, Markdown, and an SVG plot of the metrics that drifted
//! most.

use super::compare::{default_metrics, Metric};
use super::summary::{at_level, Summary};
use serde::Serialize;
use std::fmt::Write;

/// One metric of one kind across the series (µs; None where a run lacks
/// the stage).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Series {
    pub metric: String,
    pub kind: u64,
    pub values_us: Vec<Option<f64>>,
    /// last / first − 1, over the runs that have the stage.
    pub drift: Option<f64>,
}

/// The series of `metrics` (default: p50 and p99 of every stage of the
/// first summary) over `runs`, largest drift first.
pub fn series(runs: &[Summary], metrics: &[Metric]) -> Vec<Series> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let metrics: Vec<Metric> = if metrics.is_empty() {
        default_metrics(first)
    } else {
        metrics.to_vec()
    };
    let mut kinds: Vec<u64> = first.stages.iter().map(|s| s.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let mut out = Vec::new();
    for m in &metrics {
        for &kind in &kinds {
            let values_us: Vec<Option<f64>> = runs
                .iter()
                .map(|r| {
                    r.stage(kind, &m.stage)
                        .map(|s| at_level(&r.levels, &s.quantiles_ns, m.p).round() / 1e3)
                })
                .collect();
            let present: Vec<f64> = values_us.iter().flatten().copied().collect();
            if present.is_empty() {
                continue;
            }
            let drift = (present.len() >= 2 && present[0] > 0.0)
                .then(|| ((present[present.len() - 1] / present[0] - 1.0) * 1e6).round() / 1e6);
            out.push(Series {
                metric: m.label(),
                kind,
                values_us,
                drift,
            });
        }
    }
    out.sort_by(|a, b| {
        b.drift
            .unwrap_or(f64::NEG_INFINITY)
            .total_cmp(&a.drift.unwrap_or(f64::NEG_INFINITY))
    });
    out
}

fn cell(v: Option<f64>) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.1}"))
}

fn drift(d: Option<f64>) -> String {
    d.map_or("–".to_string(), |d| format!("{:+.1}%", d * 100.0))
}

/// Runs shown one column each; a longer series (a CI history of hundreds
/// of runs) shows its first and last runs and the spread over all of them.
const WHOLE_SERIES: usize = 12;
const SHOWN_FIRST: usize = 3;
const SHOWN_LAST: usize = 6;

/// The columns of a series of `n` runs: the indexes shown, with `None`
/// where runs are left out.
fn shown_columns(n: usize) -> Vec<Option<usize>> {
    if n <= WHOLE_SERIES {
        return (0..n).map(Some).collect();
    }
    (0..SHOWN_FIRST)
        .map(Some)
        .chain(std::iter::once(None))
        .chain((n - SHOWN_LAST..n).map(Some))
        .collect()
}

/// The smallest, median and largest of a series' values.
fn spread(values: &[Option<f64>]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().flatten().copied().collect();
    v.sort_by(f64::total_cmp);
    let (first, last) = (*v.first()?, *v.last()?);
    Some((first, v[v.len() / 2], last))
}

/// Markdown (also fine in a terminal): one row per metric and kind, one
/// column per run; beyond a dozen runs, the first and last ones and the
/// spread (min, median, max) over every run.
pub fn markdown(runs: &[Summary], series: &[Series]) -> String {
    let mut out = String::new();
    let names: Vec<String> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.runs
                .first()
                .cloned()
                .unwrap_or_else(|| format!("run {}", i + 1))
        })
        .collect();
    let columns = shown_columns(runs.len());
    let whole = columns.len() == runs.len();
    let left_out = runs.len() + 1 - columns.len();
    let header: Vec<String> = columns
        .iter()
        .map(|c| match c {
            Some(i) => xlap_records::escape::markdown(&names[*i]),
            None => format!("… {left_out} runs"),
        })
        .collect();
    let spread_header = if whole { "" } else { " min | median | max |" };
    let _ = writeln!(
        out,
        "| metric | kind | {} |{spread_header} drift |",
        header.join(" | ")
    );
    let rule_cells = columns.len() + if whole { 0 } else { 3 };
    let _ = writeln!(out, "|---|---|{}---|", "---|".repeat(rule_cells));
    for s in series {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| match c {
                Some(i) => cell(s.values_us[*i]),
                None => "…".to_string(),
            })
            .collect();
        let spread_cells = match (whole, spread(&s.values_us)) {
            (true, _) => String::new(),
            (false, Some((lo, mid, hi))) => {
                format!(
                    " {} | {} | {} |",
                    cell(Some(lo)),
                    cell(Some(mid)),
                    cell(Some(hi))
                )
            }
            (false, None) => " – | – | – |".to_string(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} |{spread_cells} {} |",
            xlap_records::escape::code(&s.metric),
            s.kind,
            cells.join(" | "),
            drift(s.drift)
        );
    }
    let _ = writeln!(
        out,
        "\nValues in µs, oldest run first; drift = last / first − 1{}.",
        if whole {
            String::new()
        } else {
            format!(
                "; {} runs, the first {SHOWN_FIRST} and the last {SHOWN_LAST} shown, min/median/max over all of them",
                runs.len()
            )
        }
    );
    out
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// An SVG line plot of the `top` series that drifted most.
pub fn svg(series: &[Series], runs: usize, top: usize) -> String {
    let shown: Vec<&Series> = series.iter().take(top.min(COLORS.len())).collect();
    let (w, h, left, right, top_m, bottom) = (760.0, 420.0, 64.0, 250.0, 24.0, 40.0);
    let max = shown
        .iter()
        .flat_map(|s| s.values_us.iter().flatten())
        .fold(0.0f64, |a, &b| a.max(b))
        .max(1e-3)
        * 1.1;
    let x = |i: usize| left + (w - left - right) * i as f64 / (runs.max(2) - 1) as f64;
    let y = |v: f64| top_m + (h - top_m - bottom) * (1.0 - v / max);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    );
    let _ = writeln!(
        out,
        "<title>xlap-trace history: the metrics that drifted most</title>"
    );
    // Axes, ticks.
    let _ = writeln!(
        out,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>",
        h - bottom,
        w - right,
        h - bottom
    );
    let _ = writeln!(
        out,
        "<line x1=\"{left}\" y1=\"{top_m}\" x2=\"{left}\" y2=\"{}\" stroke=\"#333\"/>",
        h - bottom
    );
    for t in 0..=4 {
        let v = max * t as f64 / 4.0;
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.1}</text>",
            left - 6.0,
            y(v) + 4.0
        );
    }
    for i in 0..runs {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(i),
            h - bottom + 16.0,
            i + 1
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">µs</text>",
        h / 2.0,
        h / 2.0
    );
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">run</text>",
        (left + w - right) / 2.0,
        h - 6.0
    );
    for (n, s) in shown.iter().enumerate() {
        let color = COLORS[n];
        let points: Vec<String> = s
            .values_us
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", x(i), y(v))))
            .collect();
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
        let ly = top_m + 18.0 * n as f64 + 8.0;
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/>",
            w - right + 10.0,
            w - right + 28.0
        );
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{:.1}\">{} kind {} ({})</text>",
            w - right + 32.0,
            ly + 4.0,
            xlap_records::escape::xml(&s.metric),
            super::render::kind_text(s.kind),
            drift(s.drift)
        );
    }
    out.push_str("</svg>\n");
    out
}
