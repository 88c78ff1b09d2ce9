//! Privileged: Prometheus for real. A real Prometheus server (Debian's
//! package, the test's own instance on loopback) scrapes `record --metrics`
//! every second while the example protocol runs on the two-host stage.
//! What it stored agrees with the run's packets table: per stage of the
//! data kind, the final `_count` of the exp2 histogram
//! `xlap_stage_latency_seconds` is the number of packets with that stage,
//! and `histogram_quantile(0.5, ...)` of its final buckets lies within a
//! factor 2 (one power-of-two bucket) of the stage's exact median. Every
//! query of the Grafana dashboard (examples/grafana/xlap-trace.json) runs
//! against the same server and finds series; `promtool check metrics`
//! accepts the scraped text.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use xlap_stage::Stage;
use xlap_tests::example::{kind_code, ExampleOptions, ProtocolRun};
use xlap_tests::prometheus::{self, free_port, http_get, unix_now, Prometheus};
use xlap_tests::trace::{run_holder, Recorder};
use xlap_tests::{may_skip, privileged, Scratch};

const FAMILY: &str = "xlap_stage_latency_seconds";
/// The protocol's packets: 6 s at one per millisecond, several scrapes.
const PACKETS: u32 = 6_000;

/// The value of one sample line of OpenMetrics text, by name and labels.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The endpoint's text once the view has counted every packet: its packet
/// total unchanged for 2.5 s (two ticks and more; the view completes the
/// last packets at the first tick without stamps).
fn settled(addr: &str) -> String {
    let start = Instant::now();
    let (mut last, mut since) = (None, Instant::now());
    loop {
        let text = http_get(addr, "/metrics").map(|r| r.1).unwrap_or_default();
        let n = sample(&text, "xlap_packets_total");
        if n.is_some() && n == last && since.elapsed() >= Duration::from_millis(2_500) {
            return text;
        }
        if n != last {
            (last, since) = (n, Instant::now());
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the metrics did not settle: {text}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `promtool check metrics` on the text: what it finds wrong. promtool
/// 2.42 reads the Prometheus text format (0.0.4), where OpenMetrics'
/// `# UNIT` and `# EOF` are comments and a counter's HELP names the sample
/// (`x_total`), while OpenMetrics names the family (`x`, its sample
/// `x_total`): so "`x_total` no help text" for a counter family `x` with
/// its HELP is the two formats' difference, not a fault, and is left out.
/// Anything else (a parse error, exit 1, or another lint) is returned.
pub(crate) fn promtool_says(promtool: &Path, text: &str) -> Vec<String> {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let format_difference = |line: &str| {
        line.strip_suffix("_total no help text")
            .is_some_and(|family| {
                text.contains(&format!("\n# TYPE {family} counter\n"))
                    && text.contains(&format!("\n# HELP {family} "))
            })
    };
    let mut wrong: Vec<String> = said
        .lines()
        .filter(|l| !l.trim().is_empty() && !format_difference(l.trim()))
        .map(str::to_string)
        .collect();
    // 0: accepted; 3: lint problems only (listed above); else: it failed.
    if !matches!(out.status.code(), Some(0 | 3))
        || (out.status.code() == Some(3) && said.trim().is_empty())
    {
        wrong.push(format!("promtool check metrics: {}", out.status));
    }
    wrong
}

/// The dashboard's PromQL: every panel target's `expr`, and the metric
/// selector inside every `label_values(SELECTOR, LABEL)` variable.
fn dashboard_queries() -> (Vec<String>, Vec<(String, String)>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/grafana/xlap-trace.json"
    );
    let text = std::fs::read_to_string(path).expect("the dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_string())
        .collect();
    let vars = dash["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter_map(|v| v["definition"].as_str())
        .map(|d| {
            let inner = d
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap_or_else(|| panic!("a variable that is not label_values: {d}"));
            let (selector, label) = inner
                .rsplit_once(',')
                .expect("label_values(SELECTOR, LABEL)");
            (selector.trim().to_string(), label.trim().to_string())
        })
        .collect();
    (exprs, vars)
}

/// Grafana's variables as one choice of them: the data kind, `stage`, all
/// recorders, a rate window of four scrapes (as `$__rate_interval` is).
fn substitute(q: &str, kind: u32, stage: &str) -> String {
    q.replace("$__rate_interval", "4s")
        .replace("$kind", &kind.to_string())
        .replace("$stage", stage)
        .replace("$instance", ".*")
}

/// Every dashboard query runs over the run and finds series; every
/// variable's selector has values.
fn check_dashboard(prom: &Prometheus, (start, end): (f64, f64), kind: u32, stage: &str) {
    let (exprs, vars) = dashboard_queries();
    assert!(exprs.len() >= 5, "{exprs:?}");
    for e in &exprs {
        let q = substitute(e, kind, stage);
        let series = prom.query_range(&q, start, end, 1);
        assert!(!series.is_empty(), "the dashboard's {q} finds no series");
        println!("dashboard: {} series for {q}", series.len());
    }
    for (selector, label) in &vars {
        let sel = substitute(selector, kind, stage);
        let v = prom.api(&format!(
            "/api/v1/label/{label}/values?match[]={}&start={start:.3}&end={end:.3}",
            prometheus::encode(&sel)
        ));
        let values = v["data"].as_array().cloned().unwrap_or_default();
        assert!(!values.is_empty(), "variable {label}: {sel} has no values");
    }
}

/// What the packets table says of one kind.
struct Table {
    /// Per stage column (`a__b`, `channel`, `e2e`): packets having it, its
    /// exact median (the lower one) and its sum, ns. A packet that
    /// contradicts its kind's order has a negative stage in the table, which
    /// the view counts as 0 (its histograms have no negative buckets): so
    /// here too.
    stages: BTreeMap<String, (u64, f64, f64)>,
    /// Points (column stems) that come before some other point in some
    /// packets and after it in others.
    ambiguous: BTreeSet<String>,
}

fn read_table(run: &Path, kind: u32) -> Table {
    let path = run.join("packets.parquet");
    let points = point_stems(&path);
    let conn = duckdb::Connection::open_in_memory().unwrap();
    conn.execute_batch(&format!(
        "CREATE VIEW packets AS FROM read_parquet('{}') WHERE kind = {kind};",
        path.display()
    ))
    .unwrap();
    let mut cols = conn
        .prepare("SELECT column_name FROM (DESCRIBE packets)")
        .unwrap();
    let columns: Vec<String> = cols
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .filter(|c: &String| c.contains("__") || c == "channel_ns" || c == "e2e_ns")
        .collect();
    let mut stages = BTreeMap::new();
    for col in &columns {
        let clamped = format!("CASE WHEN {col} < 0 THEN 0 ELSE {col} END");
        let row: (u64, f64, f64) = conn
            .query_row(
                &format!(
                    "SELECT count({col}), coalesce(quantile_disc({clamped}, 0.5), 0)::DOUBLE, \
                     coalesce(sum({clamped}), 0)::DOUBLE FROM packets"
                ),
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        stages.insert(col.trim_end_matches("_ns").to_string(), row);
    }
    Table {
        stages,
        ambiguous: ambiguous_points(&conn, &points),
    }
}

/// The table's point columns' stems and sides, as its metadata names them
/// (the key-value `xlap_point_sides`: point column to side).
fn point_stems(path: &Path) -> Vec<(String, String)> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path).expect("packets.parquet");
    let reader = SerializedFileReader::new(file).expect("a Parquet file");
    let sides = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| {
            kv.iter()
                .find(|k| k.key == xlap_records::schema::PACKETS_SIDES_KEY)
        })
        .and_then(|k| k.value.clone())
        .expect("the table names its points' sides");
    let sides: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&sides).expect("sides are JSON");
    sides
        .iter()
        .map(|(c, side)| (c.trim_end_matches("_ns").to_string(), side.to_string()))
        .collect()
}

/// The points found in either order against another point of their side
/// (each pair counted both ways in one pass). Points of the two sides may
/// interleave any way: the view orders each side apart.
fn ambiguous_points(conn: &duckdb::Connection, points: &[(String, String)]) -> BTreeSet<String> {
    let pairs: Vec<(&String, &String)> = points
        .iter()
        .enumerate()
        .flat_map(|(i, (p, side))| {
            points[i + 1..]
                .iter()
                .filter(move |(_, s)| s == side)
                .map(move |(q, _)| (p, q))
        })
        .collect();
    let counts: Vec<String> = pairs
        .iter()
        .flat_map(|(p, q)| {
            [
                format!("count(*) FILTER (WHERE {p}_ns < {q}_ns)"),
                format!("count(*) FILTER (WHERE {p}_ns > {q}_ns)"),
            ]
        })
        .collect();
    let row: Vec<u64> = conn
        .query_row(
            &format!("SELECT {} FROM packets", counts.join(", ")),
            [],
            |r| (0..counts.len()).map(|i| r.get(i)).collect(),
        )
        .unwrap();
    pairs
        .iter()
        .zip(row.chunks(2))
        .filter(|(_, n)| n[0] > 0 && n[1] > 0)
        .flat_map(|((p, q), _)| [p.to_string(), q.to_string()])
        .collect()
}

/// What Prometheus stored of one kind's exp2 histograms, per stage: the
/// final `_count`, `_sum` (s), and the median of the final cumulative
/// buckets (s).
struct Stored {
    counts: BTreeMap<String, f64>,
    sums: BTreeMap<String, f64>,
    medians: BTreeMap<String, f64>,
}

impl Stored {
    fn at(prom: &Prometheus, kind: u32, time: f64) -> Stored {
        let sel = format!("{{kind=\"{kind}\"}}");
        Stored {
            counts: by_stage(prom, &format!("{FAMILY}_count{sel}"), time),
            sums: by_stage(prom, &format!("{FAMILY}_sum{sel}"), time),
            medians: by_stage(
                prom,
                &format!("histogram_quantile(0.5, sum by (stage, le) ({FAMILY}_bucket{sel}))"),
                time,
            ),
        }
    }
}

/// The stored series of `query` by their `stage` label: instant values at
/// `time`.
fn by_stage(prom: &Prometheus, query: &str, time: f64) -> BTreeMap<String, f64> {
    prom.query(query, Some(time))
        .iter()
        .map(|s| {
            let stage = s["metric"]["stage"].as_str().unwrap_or("").to_string();
            let v = s["value"][1].as_str().and_then(|v| v.parse().ok());
            (stage, v.unwrap_or(f64::NAN))
        })
        .collect()
}

#[test]
fn prometheus_scrapes_exp2_histograms_that_agree_with_the_packets_table() {
    let Some(_guard) = privileged("prometheus_scrape") else {
        return;
    };
    let (Some(server), Some(promtool)) = (prometheus::binary(), prometheus::promtool()) else {
        may_skip(
            "prometheus_scrape",
            "no prometheus/promtool (Debian's package prometheus; run.sh installs it)",
        );
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("prometheus-scrape");
    let addr = format!("127.0.0.1:{}", free_port());
    let prom = Prometheus::start(
        &server,
        &scratch.path("prometheus"),
        &addr,
        &scratch.path("prometheus.log"),
    );
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: PACKETS,
            period_us: 1_000,
            markers: true,
            gated: true,
            ..Default::default()
        },
    );
    let pids = run.pids();
    // The recorder outlives the protocol until the test has seen Prometheus
    // store the final counts.
    let holder = run_holder();
    let rec = Recorder::start(
        &[pids.0, pids.1, holder.0.id()],
        &scratch.path("run"),
        &["--metrics", &addr],
    );
    let start = unix_now();
    run.start();
    let (sent, _) = run.wait();
    let text = settled(&addr);
    let packets = sample(&text, "xlap_packets_total").unwrap();
    let complaints = promtool_says(&promtool, &text);
    assert!(complaints.is_empty(), "{complaints:#?}\n{text}");
    // Prometheus has scraped the final state.
    let waited = Instant::now();
    while prom.value("xlap_packets_total{job=\"xlap\"}", None) != Some(packets) {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "Prometheus did not store the final xlap_packets_total {packets}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let end = unix_now();
    // Its OpenMetrics parser took every scrape of the running recorder.
    let targets = prom.api("/api/v1/targets");
    let target = &targets["data"]["activeTargets"][0];
    assert!(
        target["health"] == "up" && target["lastError"] == "",
        "{target}"
    );
    let kind = kind_code("data");
    let stored = Stored::at(&prom, kind, end);
    let scrapes = prom.value("sum_over_time(up{job=\"xlap\"}[10m])", Some(end));
    let with_data = prom.value("count_over_time(xlap_packets_total[10m])", Some(end));
    println!("scrapes: {scrapes:?} up, {with_data:?} with data; packets {packets}");
    assert!(
        with_data.is_some_and(|n| n >= 3.0),
        "too few scrapes: {with_data:?}"
    );
    check_dashboard(&prom, (start, end), kind, "channel");
    drop(prom);

    rec.interrupt();
    rec.wait();
    drop(holder);
    let table = read_table(&scratch.path("run"), kind);
    compare(&table, &stored);
    let sent_data = sent
        .iter()
        .filter(|e| e["event"] == "sent" && e["kind"] == "data" && e["dropped"] == false)
        .count() as f64;
    assert!(stored.counts["channel"] <= sent_data, "{:?}", stored.counts);
}

/// Per stage whose points come in one order in every packet (and the
/// channel and e2e): Prometheus' count is the table's, its sum the table's
/// (to a nanosecond), its median within one power-of-two bucket of the
/// table's exact median. A stage with a point that comes in either order
/// (the example's `app_deliver` and `app_handle_end`) may differ: the view
/// stages each packet along the order inferred from the packets so far,
/// which can differ from the whole run's while it learns (docs/usage.md),
/// so its packets then split into other stages. Each packet still splits
/// into as many stages as its points allow: over all stages, the counts
/// are the table's.
fn compare(table: &Table, stored: &Stored) {
    let Stored {
        counts,
        sums,
        medians,
    } = stored;
    let settled = |stage: &str| {
        stage
            .split("__")
            .all(|point| !table.ambiguous.contains(point))
    };
    let mut wrong = Vec::new();
    let mut compared = Vec::new();
    for (stage, (n, median_ns, sum_ns)) in &table.stages {
        let prom_n = counts.get(stage).copied().unwrap_or(0.0);
        let prom_median_ns = medians.get(stage).copied().unwrap_or(f64::NAN) * 1e9;
        let prom_sum_ns = sums.get(stage).copied().unwrap_or(f64::NAN) * 1e9;
        let ratio = prom_median_ns / median_ns;
        let checked = settled(stage);
        println!(
            "{stage}{}: count {prom_n} (table {n}), median {prom_median_ns:.0} ns (table {median_ns} ns, ratio {ratio:.3}), sum {prom_sum_ns:.0} ns (table {sum_ns})",
            if checked { "" } else { " [either order]" }
        );
        if !checked || *n == 0 {
            continue;
        }
        compared.push(stage.as_str());
        if prom_n != *n as f64 {
            wrong.push(format!("{stage}: count {prom_n}, table {n}"));
        }
        if !(0.5..=2.0).contains(&ratio) {
            wrong.push(format!(
                "{stage}: median {prom_median_ns} ns, table {median_ns} ns"
            ));
        }
        if (prom_sum_ns - sum_ns).abs() > 1.0 + 1e-9 * sum_ns {
            wrong.push(format!("{stage}: sum {prom_sum_ns} ns, table {sum_ns} ns"));
        }
    }
    let whole = ["e2e", "span", "channel"];
    let view_total: f64 = counts
        .iter()
        .filter(|(s, _)| !whole.contains(&s.as_str()))
        .map(|(_, n)| n)
        .sum();
    let table_total: u64 = table
        .stages
        .iter()
        .filter(|(s, _)| !whole.contains(&s.as_str()))
        .map(|(_, r)| r.0)
        .sum();
    println!(
        "either order: {:?}; stages compared: {}; stage counts in all: {view_total} (table {table_total})",
        table.ambiguous,
        compared.len()
    );
    if view_total != table_total as f64 {
        wrong.push(format!(
            "stage counts in all: {view_total}, table {table_total}"
        ));
    }
    assert!(
        compared.contains(&"channel") && compared.contains(&"e2e") && compared.len() >= 10,
        "too few stages compared: {compared:?}"
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
}
