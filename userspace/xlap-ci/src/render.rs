//! How a comparison is shown: a terminal table, Markdown for a CI job
//! summary (worst first, with both sides' box statistics), JUnit XML for CI
//! test reports. The JSON is the `Comparison` itself.

use super::compare::{Comparison, Limit, Noise, Row};
use super::stats::{change_text, interval_text, Verdict};
use std::fmt::Write;
use xlap_records::escape::{code, markdown as md, xml as xml_escape};

fn verdict_text(v: Verdict) -> &'static str {
    match v {
        Verdict::Regression => "REGRESSION",
        Verdict::Improvement => "improvement",
        Verdict::Pass => "pass",
        Verdict::Inconclusive => "inconclusive",
        Verdict::NotDecided => "not decided",
    }
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

/// The change, in µs (and relative where the baseline means something).
fn change(r: &Row) -> String {
    change_text(r.baseline_us * 1e3, (r.candidate_us - r.baseline_us) * 1e3)
}

/// The interval, bounded: in µs, relative only beside it and only where
/// that means something (the ratio of a stage near zero does not).
fn interval(r: &Row) -> String {
    interval_text(r.baseline_us * 1e3, r.ci_low_us * 1e3, r.ci_high_us * 1e3)
}

/// The verdict, and why a change past the threshold is not called one.
fn verdict_cell(r: &Row) -> String {
    match r.limit {
        None => verdict_text(r.verdict).to_string(),
        Some(l) => format!("{} ({})", verdict_text(r.verdict), limit_text(l)),
    }
}

fn limit_text(l: Limit) -> &'static str {
    match l {
        Limit::Packets => "few packets",
        Limit::Blocks => "noise unmeasured",
        Limit::Overlap => "packets overlap",
    }
}

pub fn table(c: &Comparison) -> String {
    let mut out = String::new();
    let head = [
        "metric",
        "kind",
        "baseline µs",
        "candidate µs",
        "change",
        "interval",
        "effect",
        "verdict",
    ];
    let rows: Vec<[String; 8]> = c
        .rows
        .iter()
        .map(|r| {
            [
                r.metric.clone(),
                kind_text(r.kind),
                format!("{:.1}", r.baseline_us),
                format!("{:.1}", r.candidate_us),
                change(r),
                interval(r),
                format!("{:.1}", r.effect),
                verdict_cell(r),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let _ = writeln!(out, "{}", line(head.to_vec()));
    for r in &rows {
        let _ = writeln!(out, "{}", line(r.iter().map(String::as_str).collect()));
    }
    let _ = writeln!(
        out,
        "\nverdict: {} (allowed regression {} and {} µs, confidence {}, {} of {} metrics can decide, baseline of {} run{}, intervals {})",
        verdict_text(c.verdict),
        pct(c.max_regression),
        c.min_change_us,
        c.confidence,
        c.deciding,
        c.rows.len(),
        c.baseline_run_count,
        if c.baseline_run_count == 1 { "" } else { "s" },
        noise_text(c.noise)
    );
    for (side, sample) in [
        ("baseline", &c.baseline_sample),
        ("candidate", &c.candidate_sample),
    ] {
        if let Some(s) = sample {
            let _ = writeln!(out, "{side} sampled {s}");
        }
    }
    if let Some(line) = tracer_line(c) {
        let _ = writeln!(out, "{line}");
    }
    if not_decided(c) > 0 {
        let _ = writeln!(
            out,
            "not decided: {} of {} metrics (too few packets, or noise unmeasured)",
            not_decided(c),
            c.rows.len()
        );
    }
    for w in why_wide(c) {
        let _ = writeln!(out, "wide: {w}");
    }
    if !c.not_compared.is_empty() {
        let _ = writeln!(out, "not in the candidate: {}", c.not_compared.join(", "));
    }
    for n in &c.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// What made each inconclusive metric's interval wide, one line each.
fn why_wide(c: &Comparison) -> Vec<String> {
    c.rows
        .iter()
        .filter_map(|r| {
            r.wide_because
                .as_ref()
                .map(|w| format!("{} kind {}: {w}", r.metric, kind_text(r.kind)))
        })
        .collect()
}

/// The metrics that cannot decide, counted apart from the passes.
fn not_decided(c: &Comparison) -> usize {
    c.rows
        .iter()
        .filter(|r| r.verdict == Verdict::NotDecided)
        .count()
}

/// Where the intervals' noise comes from, in words.
fn noise_text(n: Noise) -> &'static str {
    match n {
        Noise::Runs => "widened by the spread between its runs",
        Noise::Blocks => "widened by the spread between blocks of each run",
        Noise::Packets => "from the packets alone",
    }
}

pub fn markdown(c: &Comparison) -> String {
    let mut out = String::new();
    let icon = match c.verdict {
        Verdict::Regression => "❌",
        Verdict::Inconclusive => "⚠️",
        _ => "✅",
    };
    let regressions = c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regression)
        .count();
    let _ = writeln!(
        out,
        "### {icon} xlap-trace: {} ({} of {} metrics regressed, {} can decide, {} not decided; allowed {} and {} µs, confidence {})\n",
        verdict_text(c.verdict),
        regressions,
        c.rows.len(),
        c.deciding,
        not_decided(c),
        pct(c.max_regression),
        c.min_change_us,
        c.confidence
    );
    let _ = writeln!(
        out,
        "| metric | kind | verdict | change | interval | effect | baseline p25 / p50 / p75 / p99 µs (packets) | candidate p25 / p50 / p75 / p99 µs (packets) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let boxes = |b: &super::compare::BoxStats| {
        format!(
            "{:.1} / {:.1} / {:.1} / {:.1} ({})",
            b.p25_us, b.p50_us, b.p75_us, b.p99_us, b.packets
        )
    };
    for r in &c.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.1} | {} | {} |",
            code(&r.metric),
            kind_text(r.kind),
            verdict_cell(r),
            change(r),
            interval(r),
            r.effect,
            boxes(&r.baseline),
            boxes(&r.candidate)
        );
    }
    let base_sample = c
        .baseline_sample
        .as_ref()
        .map_or(String::new(), |s| format!(", sampled {s}"));
    let cand_sample = c
        .candidate_sample
        .as_ref()
        .map_or(String::new(), |s| format!(" (sampled {s})"));
    let _ = writeln!(
        out,
        "\nBaseline: {} ({} run{}{base_sample}). Candidate: {}{cand_sample}. Intervals {}.",
        md(&c.baseline_runs.join(", ")),
        c.baseline_run_count,
        if c.baseline_run_count == 1 { "" } else { "s" },
        md(&c.candidate_runs.join(", ")),
        noise_text(c.noise)
    );
    if let Some(line) = tracer_line(c) {
        let _ = writeln!(out, "\n{line}");
    }
    let wide = why_wide(c);
    if !wide.is_empty() {
        let _ = writeln!(out, "\nWhat made the inconclusive intervals wide:\n");
        for w in &wide {
            let _ = writeln!(out, "- {}", md(w));
        }
    }
    if !c.not_compared.is_empty() {
        let _ = writeln!(
            out,
            "\nStages of the baseline the candidate lacks: {}.",
            md(&c.not_compared.join(", "))
        );
    }
    for n in &c.notes {
        let _ = writeln!(out, "\n> {}", md(n));
    }
    out
}

/// The tracer's own cost on both sides, where the summaries carry it.
fn tracer_line(c: &Comparison) -> Option<String> {
    let (b, k) = (c.baseline_tracer.as_ref(), c.candidate_tracer.as_ref());
    let pair = |f: &dyn Fn(&xlap_records::tracer_cost::TracerCost) -> Option<f64>,
                show: &dyn Fn(f64) -> String| {
        let (x, y) = (b.and_then(f), k.and_then(f));
        (x.is_some() || y.is_some()).then(|| {
            let say = |v: Option<f64>| v.map_or("?".to_string(), show);
            format!("{} → {}", say(x), say(y))
        })
    };
    let mut parts = Vec::new();
    if let Some(p) = pair(&|t| t.bpf_ns_per_datagram, &|v| format!("{v:.0}")) {
        parts.push(format!("BPF {p} ns per datagram"));
    }
    if let Some(p) = pair(&|t| t.bpf_ns_per_run, &|v| format!("{v:.0}")) {
        parts.push(format!("{p} ns per program run"));
    }
    if let Some(p) = pair(&|t| t.recorder_cpu_share, &|v| {
        format!("{:.1} %", v * 100.0)
    }) {
        parts.push(format!("recorder {p} of a CPU"));
    }
    (!parts.is_empty())
        .then(|| format!("Tracer cost (baseline → candidate): {}.", parts.join(", ")))
}

pub fn junit(c: &Comparison) -> String {
    let failures = c
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Regression)
        .count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuite name=\"xlap-trace compare\" tests=\"{}\" failures=\"{failures}\" skipped=\"{}\">",
        c.rows.len(),
        not_decided(c)
    );
    for r in &c.rows {
        let name = xml_escape(&format!("{} kind {}", r.metric, kind_text(r.kind)));
        let _ = write!(out, "  <testcase classname=\"xlap-trace\" name=\"{name}\"");
        let detail = xml_escape(&format!(
            "{:.1} µs -> {:.1} µs ({}, interval {}, effect {:.1})",
            r.baseline_us,
            r.candidate_us,
            change(r),
            interval(r),
            r.effect
        ));
        match r.verdict {
            Verdict::Regression => {
                let _ = writeln!(
                    out,
                    ">\n    <failure message=\"regression\">{detail}</failure>\n  </testcase>"
                );
            }
            Verdict::NotDecided => {
                let _ = writeln!(
                    out,
                    ">\n    <skipped message=\"not decided\">{detail}</skipped>\n  </testcase>"
                );
            }
            v => {
                let _ = writeln!(
                    out,
                    ">\n    <system-out>{}: {detail}</system-out>\n  </testcase>",
                    verdict_text(v)
                );
            }
        }
    }
    out.push_str("</testsuite>\n");
    out
}
/// A kind for people: its number, or `all` for the packets of a layout
/// without a kind field (the JSON keeps the number).
pub fn kind_text(kind: u64) -> String {
    if kind == xlap_analyze::KIND_ALL {
        xlap_analyze::KIND_ALL_NAME.to_string()
    } else {
        kind.to_string()
    }
}
