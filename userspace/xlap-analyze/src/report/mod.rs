//! `xlap-trace report`: one self-contained HTML file (inline CSS and SVG, no
//! network, no script needed to read it) built from the bundled queries.
//!
//! Plots: box plots per stage (jitter), outlier-cause frequencies, variance
//! share and scatter of the most correlated stages, the latency profile on
//! log axes (with other runs' end-to-end profiles overlaid when given),
//! end-to-end latency over send time, and waterfalls of the slowest packets. A few lines of script
//! at the end record, on each figure, the size the browser laid it out at
//! and how many marks it drew (`data-rendered`): the report's tests read it
//! back from headless Chromium.

pub mod svg;

use crate::format::cell;
use crate::queries::{self, Table};
use crate::Result;
use duckdb::Connection;
use serde_json::Value;
use std::fmt::Write;
use svg::{esc, Extent, Frame, Scale};

pub struct ReportOptions {
    /// The packet kind to show (default: the most common).
    pub kind: Option<u64>,
    /// Slowest packets drawn as waterfalls.
    pub slowest: u32,
    /// What the report is about (the run argument).
    pub title: String,
    /// Other runs (label, their `latency_profile` for the same kind): their
    /// end-to-end profiles are overlaid on this run's in one plot.
    pub others: Vec<(String, Table)>,
}

/// The ids of the figures every report has (tests check each).
pub const FIGURES: &[&str] = &[
    "jitter",
    "outlier-causes",
    "variance-share",
    "scatter",
    "latency-profile",
    "time-series",
    "waterfall",
];

/// The figure a report of several runs adds: their end-to-end profiles.
pub const OVERLAY_FIGURE: &str = "profile-overlay";

/// Points of a scatter panel at most (a sample of the packets it plots).
const SCATTER_POINTS: u32 = 2000;

/// Packets a stage needs to be shown as one that drives end-to-end
/// latency: two packets give any stage a Pearson r of 1.
const MIN_LEADING_PACKETS: i64 = 30;

/// Stages shown in the scatter and the profile.
const LEADING_STAGES: usize = 3;

/// The stages that drive end-to-end latency most, from the `correlation`
/// rows: by their share of the end-to-end variance (which weighs a stage
/// by the packets it has, where r does not), among stages of at least
/// [`MIN_LEADING_PACKETS`] packets.
fn leading_stages(corr: &[impl Fn(&str) -> Value]) -> Vec<String> {
    let mut by_share: Vec<(String, f64)> = corr
        .iter()
        .filter(|r| text(&r("side")) != "total")
        .filter(|r| r("packets").as_i64().unwrap_or(0) >= MIN_LEADING_PACKETS)
        .map(|r| (text(&r("stage")), num(&r("variance_share"))))
        .filter(|(_, share)| share.is_finite())
        .collect();
    by_share.sort_by(|a, b| b.1.total_cmp(&a.1));
    by_share
        .into_iter()
        .take(LEADING_STAGES)
        .map(|(s, _)| s)
        .collect()
}

/// Send-time bins of the time series.
const TIME_BINS: usize = 600;

const PALETTE: &[&str] = &[
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn run(conn: &Connection, name: &str, params: &[(String, String)]) -> Result<Table> {
    queries::run_taking(conn, &queries::find(name)?, params)
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => cell(other),
    }
}

/// Rows of `t` as (column → value) lookups.
fn rows(t: &Table) -> Vec<impl Fn(&str) -> Value + '_> {
    t.rows
        .iter()
        .map(move |r| {
            move |c: &str| {
                t.columns
                    .iter()
                    .position(|x| x == c)
                    .map_or(Value::Null, |i| r[i].clone())
            }
        })
        .collect()
}

fn html_table(t: &Table) -> String {
    let mut s = String::from("<table><thead><tr>");
    for c in &t.columns {
        let _ = write!(s, "<th>{}</th>", esc(c));
    }
    s.push_str("</tr></thead><tbody>");
    for r in &t.rows {
        s.push_str("<tr>");
        for v in r {
            let class = if v.is_number() { " class=\"n\"" } else { "" };
            let _ = write!(s, "<td{class}>{}</td>", esc(&cell(v)));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>");
    s
}

fn figure(id: &str, caption: &str, svg: String) -> String {
    format!(
        "<figure class=\"plot\" id=\"{id}\">{svg}<figcaption>{}</figcaption></figure>\n",
        esc(caption)
    )
}

fn us(ns: f64) -> f64 {
    ns / 1e3
}

/// The lowest latency a log axis shows, µs: a stage can take 0 ns (or
/// less, when clocks are mapped).
const AXIS_FLOOR_US: f64 = 0.1;

/// The vertical scale of `n` rows (at least one).
fn rows_scale(n: usize) -> Scale {
    Scale::linear(Extent::new(0.0, n.max(1) as f64).expect("finite"))
}

/// A plot with nothing to draw says so, in a frame of the plot's size.
fn empty_plot(width: f64, height: f64, note: &str, aria: &str) -> String {
    let unit = Extent::new(0.0, 1.0).expect("finite");
    let mut f = Frame::new(
        width,
        height,
        20.0,
        Scale::linear(unit),
        Scale::linear(unit),
    );
    f.push(&format!(
        r#"<text x="{:.1}" y="{:.1}" class="empty" text-anchor="middle">{}</text>"#,
        width / 2.0,
        height / 2.0,
        esc(note)
    ));
    f.finish(aria)
}

/// Every value finite.
fn finite(values: &[f64]) -> bool {
    values.iter().all(|v| v.is_finite())
}

/// Horizontal box plots, one row per stage, on a log µs axis.
fn jitter_plot(t: &Table) -> String {
    let rs = rows(t);
    let extent = Extent::of(
        rs.iter()
            .flat_map(|r| [num(&r("min_ns")), num(&r("max_ns"))])
            .map(us),
    );
    let Some(extent) = extent else {
        return empty_plot(
            960.0,
            80.0,
            "no stage has a packet of this kind",
            "box plots per stage",
        );
    };
    let row_h = 22.0;
    let mut f = Frame::new(
        960.0,
        rs.len() as f64 * row_h + 60.0,
        300.0,
        Scale::log(extent.at_least(AXIS_FLOOR_US)),
        rows_scale(rs.len()),
    );
    f.y_down = true;
    for (i, r) in rs.iter().enumerate() {
        let y = f.py(i as f64 + 0.5);
        let quartiles = [
            "whisker_lo_ns",
            "q1_ns",
            "median_ns",
            "q3_ns",
            "whisker_hi_ns",
            "max_ns",
        ]
        .map(|c| num(&r(c)));
        if !finite(&quartiles) {
            // A stage without a value of this kind: its label alone.
            f.row_label(y, &text(&r("stage")).replace("__", " → "));
            continue;
        }
        let color = match text(&r("side")).as_str() {
            "tx" => PALETTE[0],
            "rx" => PALETTE[1],
            "channel" => PALETTE[2],
            _ => PALETTE[7],
        };
        let (wl, q1, med, q3, wh, max) = (
            f.px(us(num(&r("whisker_lo_ns")))),
            f.px(us(num(&r("q1_ns")))),
            f.px(us(num(&r("median_ns")))),
            f.px(us(num(&r("q3_ns")))),
            f.px(us(num(&r("whisker_hi_ns")))),
            f.px(us(num(&r("max_ns")))),
        );
        let tip = format!(
            "{}: median {:.1} µs, IQR {:.1}–{:.1} µs, whiskers {:.1}–{:.1} µs, {} outliers, max {:.1} µs",
            text(&r("stage")),
            us(num(&r("median_ns"))),
            us(num(&r("q1_ns"))),
            us(num(&r("q3_ns"))),
            us(num(&r("whisker_lo_ns"))),
            us(num(&r("whisker_hi_ns"))),
            cell(&r("outliers")),
            us(num(&r("max_ns")))
        );
        f.row_label(y, &text(&r("stage")).replace("__", " → "));
        f.push(&format!(
            r#"<g class="mark"><title>{}</title><line x1="{wl:.1}" y1="{y:.1}" x2="{wh:.1}" y2="{y:.1}" stroke="{color}"/><rect x="{q1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}" fill-opacity="0.35" stroke="{color}"/><line x1="{med:.1}" y1="{:.1}" x2="{med:.1}" y2="{:.1}" stroke="black" stroke-width="2"/><line x1="{wh:.1}" y1="{:.1}" x2="{max:.1}" y2="{y:.1}" stroke="{color}" stroke-dasharray="2 3"/><circle cx="{max:.1}" cy="{y:.1}" r="2.5" fill="{color}"/></g>"#,
            esc(&tip),
            y - 7.0,
            (q3 - q1).max(1.0),
            14.0,
            y - 7.0,
            y + 7.0,
            y
        ));
    }
    f.x_axis("µs (log scale): box = quartiles, whiskers = 1.5·IQR, dotted = up to the maximum");
    f.finish("box plots per stage")
}

/// Horizontal bars: a value per labelled row.
fn bars(items: &[(String, f64, String)], x_title: &str, color: &str, aria: &str) -> String {
    let row_h = 22.0;
    let zero = Extent::new(0.0, 0.0).expect("finite");
    let extent = items.iter().fold(zero, |e, i| e.with(i.1));
    let lo = extent.lo();
    let mut f = Frame::new(
        960.0,
        items.len().max(1) as f64 * row_h + 60.0,
        300.0,
        Scale::linear(extent),
        rows_scale(items.len()),
    );
    f.y_down = true;
    for (i, (name, v, tip)) in items.iter().enumerate() {
        let y = f.py(i as f64 + 0.5);
        f.row_label(y, name);
        if !v.is_finite() {
            continue;
        }
        let (x0, x1) = (f.px(0.0f64.max(lo)), f.px(*v));
        f.push(&format!(
            r#"<rect class="mark" x="{:.1}" y="{:.1}" width="{:.1}" height="14" fill="{color}"><title>{}</title></rect>"#,
            x0.min(x1),
            y - 7.0,
            (x1 - x0).abs().max(1.0),
            esc(tip)
        ));
    }
    f.x_axis(x_title);
    f.finish(aria)
}

fn scatter(conn: &Connection, stages: &[String], kind: u64) -> Result<String> {
    let mut panels = String::new();
    for (i, stage) in stages.iter().enumerate() {
        let col = crate::sql::ident(&format!("{stage}_ns"));
        // The sample is drawn from the rows the panel plots: a sample of
        // the table, filtered after, missed a small stage's packets.
        let t = queries::run_sql(
            conn,
            &format!(
                "SELECT x, y FROM (
                     SELECT {col}::DOUBLE AS x, e2e_ns::DOUBLE AS y FROM packets
                     WHERE kind = {kind} AND e2e_ns IS NOT NULL AND {col} IS NOT NULL
                 ) USING SAMPLE reservoir({SCATTER_POINTS} ROWS) REPEATABLE (42)"
            ),
        )?;
        let pts: Vec<(f64, f64)> = t
            .rows
            .iter()
            .map(|r| (us(num(&r[0])), us(num(&r[1]))))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        let title = format!("{} µs", stage.replace("__", " → "));
        let aria = format!("{stage} against end-to-end");
        let (Some(xe), Some(ye)) = (
            Extent::of(pts.iter().map(|p| p.0)),
            Extent::of(pts.iter().map(|p| p.1)),
        ) else {
            panels.push_str(&empty_plot(
                320.0,
                280.0,
                &format!("{title}: no packet with an end-to-end value"),
                &aria,
            ));
            continue;
        };
        // As in the box plots, the axes start at 0.1 µs at the lowest.
        let mut f = Frame::new(
            320.0,
            280.0,
            56.0,
            Scale::log(xe.at_least(AXIS_FLOOR_US)),
            Scale::log(ye.at_least(AXIS_FLOOR_US)),
        );
        let color = PALETTE[i % PALETTE.len()];
        let mut dots = String::from("<g class=\"mark\">");
        for (x, y) in &pts {
            let _ = write!(
                dots,
                r#"<circle cx="{:.1}" cy="{:.1}" r="1.6" fill="{color}" fill-opacity="0.5"/>"#,
                f.px(*x),
                f.py(*y)
            );
        }
        dots.push_str("</g>");
        f.push(&dots);
        f.x_axis(&format!("{title} ({} packets)", pts.len()));
        f.y_axis("end-to-end µs");
        panels.push_str(&f.finish(&aria));
    }
    Ok(panels)
}

/// One line of a profile plot: label, (ns, exceedance) points, stroke width.
type ProfileLine = (String, Vec<(f64, f64)>, f64);

/// A stage's profile points (ns, exceedance) from a `latency_profile` table.
fn profile_points(t: &Table, stage: &str) -> Vec<(f64, f64)> {
    rows(t)
        .iter()
        .filter(|r| text(&r("stage")) == stage)
        .map(|r| (num(&r("ns")), num(&r("exceedance"))))
        .filter(|(ns, e)| ns.is_finite() && e.is_finite())
        .collect()
}

/// Latency profile: latency (log x) against the fraction of packets at or
/// above it (log y, 1 at the top), one line per stage of this run.
fn profile_plot(t: &Table, stages: &[String]) -> String {
    let lines: Vec<ProfileLine> = stages
        .iter()
        .map(|stage| {
            let width = if stage == "e2e" { 3.0 } else { 1.5 };
            (stage.replace("__", " → "), profile_points(t, stage), width)
        })
        .collect();
    profile_lines(&lines, "latency, µs (log scale)", "latency profile")
}

/// End-to-end profiles of several runs in one plot, one line per run.
fn overlay_plot(runs: &[(String, &Table)]) -> String {
    let lines: Vec<ProfileLine> = runs
        .iter()
        .map(|(label, t)| (label.clone(), profile_points(t, "e2e"), 2.0))
        .collect();
    profile_lines(
        &lines,
        "end-to-end latency, µs (log scale)",
        "end-to-end latency profiles of several runs",
    )
}

/// Lines of (ns, exceedance) on log-log axes, with a legend: (label,
/// points, stroke width) each.
fn profile_lines(lines: &[ProfileLine], x_title: &str, aria: &str) -> String {
    let all = || lines.iter().flat_map(|(_, p, _)| p.iter());
    let (Some(x), Some(y)) = (
        Extent::of(all().map(|p| us(p.0))),
        Extent::of(all().map(|p| p.1)),
    ) else {
        return empty_plot(960.0, 120.0, "no packet with a latency to profile", aria);
    };
    // The legend beside the plot area, not over the curves.
    let legend_width = 300.0;
    let mut f = Frame::new(
        960.0,
        420.0,
        70.0,
        Scale::log(x.at_least(1e-3)),
        Scale::log(y.with(1.0)),
    );
    f.right = legend_width;
    let mut legend = String::new();
    for (i, (label, pts, width)) in lines.iter().enumerate() {
        if pts.is_empty() {
            continue;
        }
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<String> = pts
            .iter()
            .map(|(ns, e)| format!("{:.1},{:.1}", f.px(us(*ns)), f.py(*e)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        f.push(&format!(
            r#"<polyline class="mark" points="{}" fill="none" stroke="{color}" stroke-width="{width}"><title>{}</title></polyline>"#,
            pts.join(" "),
            esc(label)
        ));
        let _ = write!(
            legend,
            r#"<text x="{:.1}" y="{:.1}" style="fill:{color}" class="row">{}</text>"#,
            f.width - f.right + 10.0,
            f.top + 16.0 + 15.0 * i as f64,
            esc(label)
        );
    }
    f.push(&legend);
    f.x_axis(x_title);
    f.y_axis("fraction of packets at or above (log)");
    f.finish(aria)
}

/// End-to-end latency over send time, in [`TIME_BINS`] bins: each bin's
/// median and maximum (log y), so periodic spikes show as a comb and a
/// drift as a slope.
fn time_series(conn: &Connection, kind: u64) -> Result<String> {
    let t = queries::run_sql(
        conn,
        &format!(
            "WITH d AS (
                 SELECT (sent_ns - min(sent_ns) OVER ()) / 1e9 AS t, e2e_ns FROM packets
                 WHERE kind = {kind} AND e2e_ns IS NOT NULL AND sent_ns IS NOT NULL
             ), b AS (
                 SELECT floor(t / (max(t) OVER () / {TIME_BINS} + 1e-9)) AS bin, t, e2e_ns FROM d
             )
             SELECT min(t)::DOUBLE, median(e2e_ns)::DOUBLE, max(e2e_ns)::DOUBLE
             FROM b GROUP BY bin ORDER BY bin"
        ),
    )?;
    let pts: Vec<(f64, f64, f64)> = t
        .rows
        .iter()
        .map(|r| (num(&r[0]), us(num(&r[1])), us(num(&r[2]))))
        .filter(|p| finite(&[p.0, p.1, p.2]))
        .collect();
    let aria = "end-to-end latency over send time";
    let (Some(time), Some(latency)) = (
        Extent::of(pts.iter().map(|p| p.0)),
        Extent::of(pts.iter().flat_map(|p| [p.1, p.2])),
    ) else {
        return Ok(empty_plot(
            960.0,
            120.0,
            "no packet of this kind with a send time and an end-to-end value",
            aria,
        ));
    };
    let mut f = Frame::new(
        960.0,
        360.0,
        70.0,
        Scale::linear(time.with(0.0)),
        Scale::log(latency.at_least(AXIS_FLOOR_US)),
    );
    for (series, color, pick) in [("max", PALETTE[3], 2usize), ("median", PALETTE[0], 1usize)] {
        let line: Vec<String> = pts
            .iter()
            .map(|p| {
                let y = if pick == 1 { p.1 } else { p.2 };
                format!("{:.1},{:.1}", f.px(p.0), f.py(y))
            })
            .collect();
        if line.is_empty() {
            continue;
        }
        f.push(&format!(
            r#"<polyline class="mark" points="{}" fill="none" stroke="{color}" stroke-width="1.2"><title>{series} per bin</title></polyline>"#,
            line.join(" ")
        ));
    }
    f.x_axis("send time, s since the first packet");
    f.y_axis("end-to-end µs (log)");
    Ok(f.finish(aria))
}

/// Waterfalls: a row per slow packet, a segment per step between
/// consecutive stamps, coloured by the side of the step's end point.
fn waterfall(t: &Table) -> String {
    let rs = rows(t);
    let ranks: Vec<i64> = {
        let mut v: Vec<i64> = rs.iter().filter_map(|r| r("rank").as_i64()).collect();
        v.dedup();
        v
    };
    let zero = Extent::new(0.0, 0.0).expect("finite");
    let span = rs.iter().fold(zero, |e, r| e.with(us(num(&r("at_ns")))));
    let mut f = Frame::new(
        960.0,
        ranks.len().max(1) as f64 * 30.0 + 60.0,
        300.0,
        Scale::linear(span),
        rows_scale(ranks.len()),
    );
    f.y_down = true;
    for (i, rank) in ranks.iter().enumerate() {
        let y = f.py(i as f64 + 0.5);
        let steps: Vec<_> = rs
            .iter()
            .filter(|r| r("rank").as_i64() == Some(*rank))
            .collect();
        if let Some(first) = steps.first() {
            f.row_label(
                y,
                &format!(
                    "seq {} (kind {}): {:.1} µs",
                    cell(&first("seq")),
                    cell(&first("kind")),
                    us(num(&first("e2e_ns")))
                ),
            );
        }
        let mut prev: Option<(f64, String)> = None;
        for r in &steps {
            let at = num(&r("at_ns"));
            if !at.is_finite() {
                continue;
            }
            let point = text(&r("point"));
            if let Some((p_at, p_point)) = &prev {
                let color = if text(&r("side")) == "rx" {
                    PALETTE[1]
                } else {
                    PALETTE[0]
                };
                f.push(&format!(
                    r#"<rect class="mark" x="{:.1}" y="{:.1}" width="{:.1}" height="16" fill="{color}" fill-opacity="0.7" stroke="white" stroke-width="0.5"><title>{} → {}: {:.1} µs</title></rect>"#,
                    f.px(us(*p_at)),
                    y - 8.0,
                    (f.px(us(at)) - f.px(us(*p_at))).max(1.0),
                    // point names come from the traced programs
                    esc(p_point),
                    esc(&point),
                    us(at - p_at)
                ));
            }
            prev = Some((at, point));
        }
    }
    f.x_axis("µs since the packet's first stamp (blue: sender, orange: receiver)");
    f.finish("waterfalls of the slowest packets")
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85em}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}figure{margin:1em 0}figcaption{font-size:.85em;color:#555}
svg text{font-size:11px;fill:#333}svg .title{font-size:12px}svg .axis{stroke:#333}svg .grid{stroke:#eee}
.panels{display:flex;flex-wrap:wrap;gap:8px}";

/// The report's self-check: layout size and drawn marks of every figure.
const SELF_CHECK: &str = "<script>
for (const f of document.querySelectorAll('figure.plot')) {
  let marks = 0, w = 0, h = 0;
  for (const s of f.querySelectorAll('svg')) {
    const b = s.getBoundingClientRect(); w = Math.max(w, b.width); h += b.height;
    for (const m of s.querySelectorAll('.mark')) { const r = m.getBBox(); if (r.width > 0 || r.height > 0) marks++; }
  }
  f.dataset.rendered = Math.round(w) + 'x' + Math.round(h) + ' marks=' + marks;
}
</script>";

/// `kind N (name)` with the name the run gives the kind, if any.
fn kind_label(conn: &Connection, kind: u64) -> String {
    let name: Option<String> = conn
        .query_row(
            "SELECT any_value(name) FROM kinds WHERE kind = ?",
            [kind],
            |r| r.get(0),
        )
        .ok()
        .flatten();
    crate::kind_label(kind, name.as_deref())
}

/// The bars of the outlier causes: each stage's share of the end-to-end
/// outliers.
fn cause_bars(causes: &Table) -> Vec<(String, f64, String)> {
    rows(causes)
        .iter()
        .map(|r| {
            (
                text(&r("cause")).replace("__", " → "),
                num(&r("share_of_outliers")),
                format!(
                    "{} of {} outliers (e2e fence {:.1} µs)",
                    cell(&r("packets")),
                    cell(&r("e2e_outliers")),
                    us(num(&r("e2e_fence_ns")))
                ),
            )
        })
        .collect()
}

/// The bars of the variance shares: each stage's share of the end-to-end
/// variance (the totals left out).
fn share_bars<R: Fn(&str) -> Value>(corr_rows: &[R]) -> Vec<(String, f64, String)> {
    corr_rows
        .iter()
        .filter(|r| text(&r("side")) != "total")
        .map(|r| {
            (
                text(&r("stage")).replace("__", " → "),
                num(&r("variance_share")),
                format!(
                    "r = {}, slope {}, share {}",
                    cell(&r("pearson_r")),
                    cell(&r("slope_e2e_per_stage")),
                    cell(&r("variance_share"))
                ),
            )
        })
        .collect()
}

/// The other directions of a two-way protocol (sockperf's pong), in brief:
/// the plots are of `kind` (`--kind` picks).
fn other_directions(conn: &Connection, kind: u64) -> Result<String> {
    let mut html = String::new();
    for other in crate::dataset::direction_kinds(conn)? {
        if other == kind {
            continue;
        }
        let params = vec![("kind".to_string(), other.to_string())];
        let _ = writeln!(
            html,
            "<h3>The other direction: {}</h3>{}",
            esc(&kind_label(conn, other)),
            html_table(&run(conn, "summary", &params)?)
        );
    }
    Ok(html)
}

/// Builds the report's HTML.
pub fn build(conn: &Connection, opts: &ReportOptions) -> Result<String> {
    let kind: u64 = match opts.kind {
        Some(k) => k,
        None => crate::dataset::main_kind(conn)?,
    };
    let params = vec![
        ("kind".to_string(), kind.to_string()),
        ("top".to_string(), opts.slowest.to_string()),
    ];
    let summary = run(conn, "summary", &params)?;
    let jitter = run(conn, "jitter", &params)?;
    let causes = run(conn, "outlier_causes", &params)?;
    let corr = run(conn, "correlation", &params)?;
    let profile = run(conn, "latency_profile", &params)?;
    let trace = run(conn, "trace", &params)?;
    let loss = run(conn, "loss", &[])?;

    let cause_items = cause_bars(&causes);
    let corr_rows = rows(&corr);
    let share_items = share_bars(&corr_rows);
    let top_stages = leading_stages(&corr_rows);
    let mut profile_stages = vec![
        "e2e".to_string(),
        "sender_total".to_string(),
        "receiver_total".to_string(),
    ];
    profile_stages.extend(top_stages.iter().cloned());

    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>xlap-trace report: {t}</title><style>{STYLE}</style></head><body>\n<h1>Where the latency comes from: {t}</h1>\n<p>Packets of {label}. Generated by xlap-trace {v} from the bundled queries (<code>xlap-trace analyze</code> prints the same numbers).</p>\n",
        t = esc(&opts.title),
        label = esc(&kind_label(conn, kind)),
        v = env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(html, "<h2>Summary</h2>{}", html_table(&summary));
    html.push_str(&other_directions(conn, kind)?);
    let _ = write!(
        html,
        "<h2>Jitter per stage</h2>{}",
        figure(
            "jitter",
            "Box plots of every stage and total (X-LAP's trace jitter); hover for the numbers.",
            jitter_plot(&jitter)
        )
    );
    let _ = write!(
        html,
        "<h2>Causes of end-to-end outliers</h2>{}",
        figure(
            "outlier-causes",
            "Share of the end-to-end outliers (above Q3 + 1.5·IQR) in which each stage was itself above its fence.",
            bars(&cause_items, "share of the end-to-end outliers", PALETTE[3], "outlier causes")
        )
    );
    let _ = write!(
        html,
        "<h2>Correlation with end-to-end latency</h2>{}{}",
        figure(
            "variance-share",
            "Each stage's share of the end-to-end variance, cov(stage, e2e) / var(e2e): where the jitter comes from.",
            bars(&share_items, "share of the end-to-end variance", PALETTE[4], "variance share")
        ),
        figure(
            "scatter",
            &format!("The {LEADING_STAGES} stages with the largest share of the end-to-end variance (of those with {MIN_LEADING_PACKETS} packets or more), against it: a sample of up to {SCATTER_POINTS} of each stage's packets, log axes."),
            format!("<div class=\"panels\">{}</div>", scatter(conn, &top_stages, kind)?)
        )
    );
    let _ = write!(
        html,
        "<h2>Latency profile</h2>{}",
        figure(
            "latency-profile",
            "Fraction of packets at or above a latency (log-log), from the fastest packet (1) to the slowest: the worst cases magnified.",
            profile_plot(&profile, &profile_stages)
        )
    );
    if !opts.others.is_empty() {
        let mut runs: Vec<(String, &Table)> = vec![(opts.title.clone(), &profile)];
        runs.extend(opts.others.iter().map(|(l, t)| (l.clone(), t)));
        let _ = write!(
            html,
            "{}",
            figure(
                OVERLAY_FIGURE,
                "End-to-end latency profiles of the runs given, overlaid (log-log): load scenarios or builds side by side.",
                overlay_plot(&runs)
            )
        );
    }
    let _ = write!(
        html,
        "<h2>Latency over time</h2>{}",
        figure(
            "time-series",
            "End-to-end latency over send time: median and maximum per bin (600 bins); periodic spikes show as a comb.",
            time_series(conn, kind)?
        )
    );
    let _ = write!(
        html,
        "<h2>Slowest packets</h2>{}",
        figure(
            "waterfall",
            "Every stamp of the slowest packets, both hosts; hover a segment for the step.",
            waterfall(&trace)
        )
    );
    let _ = writeln!(html, "<h2>Losses</h2>{}", html_table(&loss));
    html.push_str(SELF_CHECK);
    html.push_str("\n</body></html>\n");
    Ok(html)
}
