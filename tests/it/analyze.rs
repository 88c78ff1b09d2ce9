//! The bundled analyses on a committed synthetic run whose ground truth is
//! known (`xlap-trace synth --packets 2000 --seed 42`): a snapshot per
//! query, every number of jitter, outlier causes and correlation recomputed
//! here from the Parquet file with arrow (not with DuckDB, not with the
//! queries' SQL), the planted cause found, the report rendered in headless
//! Chromium, the Perfetto export checked against the packets table, and
//! every kind of bad input answered with a message and an exit code.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, UInt32Type, UInt64Type, UInt8Type};
use arrow_array::Array;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use xlap_tests::{bin, Scratch};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/synth-2000")
}

fn xlap(args: &[&str]) -> Output {
    Command::new(bin("xlap-trace"))
        .args(args)
        .output()
        .expect("run xlap-trace")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "xlap-trace failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rows of one bundled query on the fixture, as JSON objects.
fn query(name: &str, extra: &[&str]) -> Vec<serde_json::Map<String, Value>> {
    query_on(&fixture(), name, extra)
}

/// The rows of one bundled query on a run or packets file.
fn query_on(run: &Path, name: &str, extra: &[&str]) -> Vec<serde_json::Map<String, Value>> {
    let mut args = vec![
        "analyze",
        run.to_str().unwrap(),
        "-q",
        name,
        "-f",
        "json",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    let v: Value = serde_json::from_str(&stdout(&xlap(&args))).expect("JSON output");
    v[name]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r.as_object().unwrap().clone())
        .collect()
}

/// Every numeric column of a Parquet file, as f64 (None for null).
fn columns(path: &Path) -> BTreeMap<String, Vec<Option<f64>>> {
    let file = std::fs::File::open(path).unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut out: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
    for batch in reader {
        let batch = batch.unwrap();
        for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
            let v = out.entry(field.name().clone()).or_default();
            let n = col.len();
            let get: Box<dyn Fn(usize) -> f64> = match col.data_type() {
                arrow_schema::DataType::Int64 => {
                    let a = col.as_primitive::<Int64Type>().clone();
                    Box::new(move |i| a.value(i) as f64)
                }
                arrow_schema::DataType::UInt64 => {
                    let a = col.as_primitive::<UInt64Type>().clone();
                    Box::new(move |i| a.value(i) as f64)
                }
                arrow_schema::DataType::UInt32 => {
                    let a = col.as_primitive::<UInt32Type>().clone();
                    Box::new(move |i| a.value(i) as f64)
                }
                arrow_schema::DataType::UInt8 => {
                    let a = col.as_primitive::<UInt8Type>().clone();
                    Box::new(move |i| a.value(i) as f64)
                }
                arrow_schema::DataType::Boolean => {
                    let a = col.as_boolean().clone();
                    Box::new(move |i| if a.value(i) { 1.0 } else { 0.0 })
                }
                _ => continue,
            };
            v.extend((0..n).map(|i| (!col.is_null(i)).then(|| get(i))));
        }
    }
    out
}

/// Stage columns of the fixture and the totals, by their query name.
fn stage_values(cols: &BTreeMap<String, Vec<Option<f64>>>) -> Vec<(String, &Vec<Option<f64>>)> {
    cols.iter()
        .filter(|(c, _)| {
            (c.contains("__") && c.ends_with("_ns"))
                || [
                    "sender_total_ns",
                    "channel_ns",
                    "receiver_total_ns",
                    "e2e_ns",
                ]
                .contains(&c.as_str())
        })
        .map(|(c, v)| (c.trim_end_matches("_ns").to_string(), v))
        .collect()
}

/// Quantile with linear interpolation between order statistics (type 7).
fn quantile(sorted: &[f64], p: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * p;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// Values of a stage per kind over delivered packets.
fn by_kind(kind: &[Option<f64>], e2e: &[Option<f64>], v: &[Option<f64>]) -> HashMap<u64, Vec<f64>> {
    let mut out: HashMap<u64, Vec<f64>> = HashMap::new();
    for i in 0..v.len() {
        if let (Some(x), Some(_), Some(k)) = (v[i], e2e[i], kind[i]) {
            out.entry(k as u64).or_default().push(x);
        }
    }
    out
}

fn close(a: f64, b: f64, tol: f64, what: &str) {
    assert!(
        (a - b).abs() <= tol * (1.0 + b.abs()),
        "{what}: query says {a}, independent computation {b}"
    );
}

fn num(row: &serde_json::Map<String, Value>, key: &str) -> f64 {
    row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {row:?}"))
}

#[test]
fn fixture_is_what_the_seeded_generator_makes() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("synth");
    let out = scratch.path("run");
    stdout(&xlap(&[
        "synth",
        "-o",
        out.to_str().unwrap(),
        "--packets",
        "2000",
        "--seed",
        "42",
    ]));
    let (a, b) = (
        columns(&fixture().join("packets.parquet")),
        columns(&out.join("packets.parquet")),
    );
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    assert_eq!(
        a, b,
        "regenerate tests/fixtures/synth-2000 with xlap-trace synth --packets 2000 --seed 42"
    );
    assert_eq!(a["seq"].len(), 2000);
    xlap_tests::packets_file::assert_follows_schema(&out.join("packets.parquet"));
    xlap_tests::packets_file::assert_follows_schema(&fixture().join("packets.parquet"));
    // Raw JSON: the file itself is the fixture, every key as written.
    let run_json = |dir: &Path| -> Value {
        let mut v: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
        v["software_version"] = Value::Null;
        v
    };
    assert_eq!(
        run_json(&fixture()),
        run_json(&out),
        "regenerate tests/fixtures/synth-2000 with xlap-trace synth --packets 2000 --seed 42"
    );
}

#[test]
fn every_query_has_a_snapshot() {
    let _guard = xlap_tests::unprivileged();
    let dir = fixture();
    for name in xlap_analyze::queries::names() {
        let out = stdout(&xlap(&[
            "analyze",
            dir.to_str().unwrap(),
            "-q",
            &name,
            "-f",
            "csv",
            "--quiet",
        ]));
        // The fixture has one path per packet: `redundancy` (streams over
        // several paths) finds none here; its rows are checked on the stage
        // against the protocol's logs (tests/it/redundancy.rs). Nor does a
        // seq travel both ways: `exchange`'s rows are checked against
        // sockperf's own round trips (tests/it/exchange.rs).
        if name != "redundancy" && name != "exchange" {
            assert!(out.lines().count() > 1, "{name} returned no rows");
        }
        insta::assert_snapshot!(format!("query_{name}"), out);
    }
}

#[test]
fn query_headers_are_complete_and_listed() {
    let _guard = xlap_tests::unprivileged();
    let queries = xlap_analyze::queries::all();
    assert!(queries.len() >= 9);
    let list = stdout(&xlap(&["analyze", "--list"]));
    for q in &queries {
        assert!(
            !q.description.is_empty() && !q.reads.is_empty(),
            "{}",
            q.name
        );
        assert!(list.contains(&q.name), "{} not listed", q.name);
    }
}

#[test]
fn jitter_matches_an_independent_computation() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let rows = query("jitter", &[]);
    let mut checked = 0;
    for (stage, values) in stage_values(&cols) {
        for (kind, mut v) in by_kind(&cols["kind"], &cols["e2e_ns"], values) {
            v.sort_by(f64::total_cmp);
            let row = rows
                .iter()
                .find(|r| r["stage"] == stage.as_str() && r["kind"] == kind)
                .unwrap_or_else(|| panic!("no jitter row for {stage} kind {kind}"));
            let (q1, q3) = (quantile(&v, 0.25), quantile(&v, 0.75));
            let (lo, hi) = (q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1));
            let n = v.len() as f64;
            let mean = v.iter().sum::<f64>() / n;
            let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
            let what = |k: &str| format!("jitter {stage} kind {kind} {k}");
            assert_eq!(num(row, "packets"), n, "{}", what("packets"));
            close(num(row, "min_ns"), v[0], 0.0, &what("min"));
            close(num(row, "max_ns"), v[v.len() - 1], 0.0, &what("max"));
            close(num(row, "q1_ns"), q1, 1e-9, &what("q1"));
            close(
                num(row, "median_ns"),
                quantile(&v, 0.5),
                1e-9,
                &what("median"),
            );
            close(num(row, "q3_ns"), q3, 1e-9, &what("q3"));
            close(num(row, "p99_ns"), quantile(&v, 0.99), 1e-9, &what("p99"));
            close(
                num(row, "p99_9_ns"),
                quantile(&v, 0.999),
                1e-9,
                &what("p99.9"),
            );
            let inside: Vec<f64> = v.iter().copied().filter(|x| *x >= lo && *x <= hi).collect();
            close(
                num(row, "whisker_lo_ns"),
                inside[0],
                0.0,
                &what("whisker lo"),
            );
            close(
                num(row, "whisker_hi_ns"),
                inside[inside.len() - 1],
                0.0,
                &what("whisker hi"),
            );
            assert_eq!(
                num(row, "outliers"),
                n - inside.len() as f64,
                "{}",
                what("outliers")
            );
            close(num(row, "mean_ns"), mean, 1e-3, &what("mean"));
            close(num(row, "stddev_ns"), sd, 1e-3, &what("stddev"));
            checked += 1;
        }
    }
    assert_eq!(checked, rows.len(), "a jitter row without a stage column");
    assert!(checked >= 30);
}

#[test]
fn outlier_causes_match_an_independent_computation_and_name_the_planted_stage() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let (kind, e2e, seq) = (&cols["kind"], &cols["e2e_ns"], &cols["seq"]);
    let fence = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let (q1, q3) = (quantile(v, 0.25), quantile(v, 0.75));
        q3 + 1.5 * (q3 - q1)
    };
    // The path's stages: the sender's after its wire point (the driver's
    // and the send call's return) run alongside the channel, and cause
    // nothing (xlap_records::stages).
    let stages: Vec<(String, &Vec<Option<f64>>)> = stage_values(&cols)
        .into_iter()
        .filter(|(s, _)| !["sender_total", "receiver_total", "e2e"].contains(&s.as_str()))
        .filter(|(s, _)| {
            !["dev_start_xmit__dev_xmit", "dev_xmit__sock_send_exit"].contains(&s.as_str())
        })
        .collect();
    let rows = query("outlier_causes", &[]);
    for k in [0u64, 1] {
        let e2e_fence = fence(&mut by_kind(kind, e2e, e2e).remove(&k).unwrap());
        let late: Vec<usize> = (0..e2e.len())
            .filter(|&i| kind[i] == Some(k as f64) && e2e[i].is_some_and(|x| x > e2e_fence))
            .collect();
        let mut expected: BTreeMap<String, usize> = BTreeMap::new();
        let mut uncaused = 0;
        for &i in &late {
            let mut any = false;
            for (stage, v) in &stages {
                let f = fence(&mut by_kind(kind, e2e, v).remove(&k).unwrap());
                if v[i].is_some_and(|x| x > f) {
                    *expected.entry(stage.clone()).or_default() += 1;
                    any = true;
                }
            }
            if !any {
                uncaused += 1;
            }
        }
        if uncaused > 0 {
            expected.insert("(no stage above its fence)".into(), uncaused);
        }
        let got: BTreeMap<String, usize> = rows
            .iter()
            .filter(|r| r["kind"] == k)
            .map(|r| {
                close(num(r, "e2e_fence_ns"), e2e_fence, 1e-9, "e2e fence");
                assert_eq!(num(r, "e2e_outliers") as usize, late.len());
                (
                    r["cause"].as_str().unwrap().to_string(),
                    num(r, "packets") as usize,
                )
            })
            .collect();
        assert_eq!(got, expected, "causes of kind {k}");
        if k == 0 {
            // The ground truth: +250 µs in the qdisc for data seqs 100..200.
            let top = rows.iter().find(|r| r["kind"] == 0).unwrap();
            assert_eq!(top["cause"], xlap_analyze::synth::INFLATED_STAGE);
            let planted: Vec<usize> = (0..e2e.len())
                .filter(|&i| {
                    kind[i] == Some(0.0)
                        && e2e[i].is_some()
                        && seq[i].is_some_and(|s| {
                            xlap_analyze::synth::INFLATED_SEQS.contains(&(s as u64))
                        })
                })
                .collect();
            assert!(planted.len() > 80);
            assert!(
                planted.iter().all(|i| late.contains(i)),
                "a planted packet is not an outlier"
            );
            assert!(got[xlap_analyze::synth::INFLATED_STAGE] >= planted.len());
        }
    }
}

#[test]
fn correlation_matches_an_independent_computation() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let rows = query("correlation", &[]);
    let (kind, e2e) = (&cols["kind"], &cols["e2e_ns"]);
    let mut checked = 0;
    for (stage, v) in stage_values(&cols) {
        if stage == "e2e" {
            continue;
        }
        for k in [0u64, 1] {
            let pairs: Vec<(f64, f64)> = (0..v.len())
                .filter(|&i| kind[i] == Some(k as f64))
                .filter_map(|i| Some((v[i]?, e2e[i]?)))
                .collect();
            let n = pairs.len() as f64;
            let (mx, my) = (
                pairs.iter().map(|p| p.0).sum::<f64>() / n,
                pairs.iter().map(|p| p.1).sum::<f64>() / n,
            );
            let sxy: f64 = pairs.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
            let sxx: f64 = pairs.iter().map(|(x, _)| (x - mx).powi(2)).sum();
            let syy: f64 = pairs.iter().map(|(_, y)| (y - my).powi(2)).sum();
            let row = rows
                .iter()
                .find(|r| r["stage"] == stage.as_str() && r["kind"] == k)
                .unwrap();
            let what = format!("correlation {stage} kind {k}");
            assert_eq!(num(row, "packets"), n, "{what}");
            close(num(row, "pearson_r"), sxy / (sxx * syy).sqrt(), 6e-5, &what);
            close(num(row, "slope_e2e_per_stage"), sxy / sxx, 6e-5, &what);
            close(num(row, "variance_share"), sxy / syy, 6e-5, &what);
            checked += 1;
        }
    }
    assert_eq!(checked, rows.len());
    // Ground truth: the planted +250 µs drives the data packets' variance;
    // without it (parity packets) the heaviest tails, on the receiver, do.
    let top = |k: u64| {
        rows.iter()
            .filter(|r| r["kind"] == k && r["side"] != "total")
            .max_by(|a, b| num(a, "variance_share").total_cmp(&num(b, "variance_share")))
            .unwrap()
    };
    assert_eq!(top(0)["stage"], xlap_analyze::synth::INFLATED_STAGE);
    assert_eq!(top(1)["side"], "rx", "{:?}", top(1));
}

#[test]
fn kind_parameter_filters_and_unknown_kinds_are_refused() {
    let _guard = xlap_tests::unprivileged();
    let rows = query("jitter", &["--kind", "1"]);
    assert!(!rows.is_empty() && rows.iter().all(|r| r["kind"] == 1));
    // Kinds by the names run.json gives them.
    assert_eq!(query("jitter", &["--kind", "parity"]), rows);
    let out = xlap(&["analyze", fixture().to_str().unwrap(), "--kind", "9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("kinds in this run are 0 (data), 1 (parity)")
    );
    let trace = query("trace", &["-p", "seq=150", "--kind", "0"]);
    assert!(trace.iter().all(|r| r["seq"] == 150));
    assert!(trace.iter().any(|r| r["point"] == "qdisc.dequeue"));
}

#[test]
fn sql_runs_statements_from_the_command_line_and_stdin() {
    let _guard = xlap_tests::unprivileged();
    let dir = fixture();
    let out = stdout(&xlap(&[
        "sql",
        dir.to_str().unwrap(),
        "SELECT count(*) AS n FROM packets",
        "-f",
        "csv",
    ]));
    assert_eq!(out, "n\n2000\n");
    let mut child = Command::new(bin("xlap-trace"))
        .args(["sql", dir.to_str().unwrap(), "-f", "csv"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"SELECT count(*) AS lost FROM packets\n  WHERE lost;\nSELECT max(seq) AS top FROM delivered;\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = stdout(&out);
    assert!(text.starts_with("lost\n"), "{text}");
    assert!(text.contains("top\n1999\n"), "{text}");
}

/// Every bundled query's rows on `run` (`-q all`, JSON), and what
/// analyze said on stderr.
fn all_queries(run: &Path, extra: &[&str]) -> (Value, String) {
    let mut args = vec!["analyze", run.to_str().unwrap(), "-q", "all", "-f", "json"];
    args.extend_from_slice(extra);
    let out = xlap(&args);
    let text = stdout(&out);
    (
        serde_json::from_str(&text).expect("JSON output"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The per-run aggregates `synth` (like `record` and `correlate`) keeps
/// beside the packets give every analysis exactly what the packets give
/// without them, and they are read only for the packets they were made
/// from: stale or broken ones are said and left aside.
#[test]
fn stored_aggregates_give_the_analyses_of_the_packets_themselves() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("stored");
    let synth = |name: &str, seed: &str| -> PathBuf {
        let dir = scratch.path(name);
        stdout(&xlap(&[
            "synth",
            "-o",
            dir.to_str().unwrap(),
            "--packets",
            "3000",
            "--seed",
            seed,
        ]));
        dir
    };
    let stored = |dir: &Path, name: &str| dir.join(format!("packets.{name}.parquet"));
    let tables = ["stage_counts", "stage_moments", "send_schedule"];
    let (run, other) = (synth("run", "7"), synth("other", "8"));
    for t in tables {
        assert!(stored(&run, t).is_file(), "synth kept no {t}");
    }
    let (with, said) = all_queries(&run, &[]);
    for t in tables {
        assert!(said.contains(&format!("read {t} in")), "{said}");
    }
    // Progress is for long steps: the twenty short ones once said
    // "prepared … in 0.00 s" each (issue 51).
    assert!(
        !said
            .lines()
            .any(|l| l.ends_with(" in 0.00 s") && !l.contains(": read ")),
        "{said}"
    );
    let (inliers_with, _) = all_queries(&run, &["--inliers"]);
    // The same run without them: computed from the packets.
    let aside = scratch.path("aside");
    std::fs::create_dir_all(&aside).unwrap();
    for t in tables {
        std::fs::rename(stored(&run, t), aside.join(t)).unwrap();
    }
    let (without, said) = all_queries(&run, &[]);
    assert!(!said.contains("read stage_"), "{said}");
    assert!(
        xlap_tests::json_agree(&with, &without),
        "the analyses with and without the stored aggregates:\n{with}\n{without}"
    );
    let (inliers_without, _) = all_queries(&run, &["--inliers"]);
    assert!(
        xlap_tests::json_agree(&inliers_with, &inliers_without),
        "--inliers computes its own:\n{inliers_with}\n{inliers_without}"
    );
    // Another run's aggregates beside these packets: not read.
    let (truth, _) = all_queries(&other, &[]);
    for t in tables {
        std::fs::copy(aside.join(t), stored(&other, t)).unwrap();
    }
    let (got, said) = all_queries(&other, &[]);
    assert!(
        said.contains("stage_counts computed from the packets, not read from")
            && said.contains("computed from other packets"),
        "{said}"
    );
    assert!(
        xlap_tests::json_agree(&got, &truth),
        "stale aggregates must not be read:\n{got}\n{truth}"
    );
    // A file that is not Parquet: said, and computed.
    std::fs::write(stored(&other, "stage_moments"), b"not parquet").unwrap();
    let (got, said) = all_queries(&other, &[]);
    assert!(
        said.contains("stage_moments computed from the packets, not read from"),
        "{said}"
    );
    assert!(
        xlap_tests::json_agree(&got, &truth),
        "a broken file must not be read:\n{got}\n{truth}"
    );
}

/// (exit code, stderr) of analyze on `path`.
fn refused(args: &[&str]) -> (i32, String) {
    let out = xlap(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_inputs_get_a_message_and_an_exit_code() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("badinput");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let sql = |q: &str| {
        let conn = duckdb::Connection::open_in_memory().unwrap();
        conn.execute_batch(q).unwrap();
    };

    let garbage = scratch.path("garbage.parquet");
    std::fs::write(&garbage, b"not parquet at all, just text\n").unwrap();
    let (code, err) = refused(&["analyze", &s(&garbage)]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("garbage.parquet") && err.contains("not a readable Parquet file"),
        "{err}"
    );

    let foreign = scratch.path("foreign.parquet");
    sql(&format!(
        "COPY (SELECT 1 AS a, 'x' AS b) TO '{}' (FORMAT PARQUET)",
        s(&foreign)
    ));
    let (code, err) = refused(&["analyze", &s(&foreign)]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("not an xlap-trace packets table"), "{err}");

    let newer = scratch.path("newer.parquet");
    sql(&format!(
        "COPY (SELECT * FROM '{}') TO '{}' (FORMAT PARQUET, KV_METADATA {{xlap_packets_schema_version: '99'}})",
        s(&fixture().join("packets.parquet")),
        s(&newer)
    ));
    let (code, err) = refused(&["analyze", &s(&newer)]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("version 99 is newer") && err.contains("newer xlap-trace"),
        "{err}"
    );

    let empty = scratch.path("empty");
    stdout(&xlap(&["synth", "-o", &s(&empty), "--packets", "0"]));
    let (code, err) = refused(&["analyze", &s(&empty)]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("no packets"), "{err}");

    // One end only: the sender was recorded, the receiver not.
    let one = scratch.path("one-side");
    std::fs::create_dir_all(&one).unwrap();
    std::fs::copy(fixture().join("run.json"), one.join("run.json")).unwrap();
    sql(&format!(
        "COPY (SELECT * REPLACE (NULL::BIGINT AS e2e_ns, true AS lost) FROM '{}') TO '{}'
         (FORMAT PARQUET, KV_METADATA {{xlap_packets_schema_version: '1', xlap_point_sides: '{{}}'}})",
        s(&fixture().join("packets.parquet")),
        s(&one.join("packets.parquet"))
    ));
    let (code, err) = refused(&["analyze", &s(&one)]);
    assert_eq!(code, 6, "{err}");
    assert!(
        err.contains("both ends") && err.contains("receiver"),
        "{err}"
    );

    let (code, err) = refused(&["analyze", &s(&scratch.path("missing"))]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("no such file or directory"), "{err}");

    let (code, err) = refused(&["analyze", &s(&fixture()), "-q", "jiter"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no query named \"jiter\"") && err.contains("jitter"),
        "{err}"
    );

    let (code, err) = refused(&["analyze", &s(&fixture()), "-q", "jitter", "-p", "tpo=3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tpo"), "{err}");

    let (code, err) = refused(&["sql", &s(&fixture()), "SELEC count(*) FROM packets"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("syntax error") && err.contains("SELEC"),
        "{err}"
    );
}

/// A command that reaches its memory ceiling ends with exit 8 and a line
/// naming its step, wherever the allocation failed (Rust or the engine's
/// C++): never an abort, a panic or the OOM killer (the report once grew
/// to 24 GiB). Ceilings from below what opening the engine takes to above
/// what the command needs on the fixture.
/// The engine says "ZSTD Decompression failure" both for a damaged page
/// and for its decompressor's allocation refused by the memory ceiling:
/// the file decoded again without the ceiling tells which (a damaged one
/// is named, exit 6; the ceiling's case is exit 8, in the test below).
#[test]
fn a_damaged_page_is_named_as_damaged_not_out_of_memory() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("damaged-page");
    let run = scratch.path("run");
    std::fs::create_dir_all(&run).unwrap();
    for f in ["run.json", "packets.parquet"] {
        std::fs::copy(fixture().join(f), run.join(f)).unwrap();
    }
    let packets = run.join("packets.parquet");
    let mut bytes = std::fs::read(&packets).unwrap();
    let frame = bytes
        .windows(4)
        .position(|w| w == [0x28, 0xb5, 0x2f, 0xfd])
        .expect("a zstd page");
    bytes[frame] ^= 0xff;
    std::fs::write(&packets, &bytes).unwrap();
    for ceiling in ["6GB", "off"] {
        let out = Command::new(bin("xlap-trace"))
            .args(["summary", run.to_str().unwrap(), "-o"])
            .arg(scratch.path("s.json"))
            .env("XLAP_MAX_MEMORY", ceiling)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(6), "at {ceiling}: {err}");
        assert!(!err.contains("out of memory"), "at {ceiling}: {err}");
        if ceiling != "off" {
            assert!(
                err.contains(&format!("{}: cannot decode it", packets.display()))
                    && err.contains("the file is damaged"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_command_at_its_memory_ceiling_ends_with_exit_8_naming_its_step() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("ceiling");
    let run = fixture();
    let run = run.to_str().unwrap();
    let html = scratch.path("r.html");
    let json = scratch.path("p.json");
    let summary = scratch.path("s.json");
    let commands: [(&str, Vec<&str>); 4] = [
        (
            "building the report",
            vec!["report", run, "-o", html.to_str().unwrap()],
        ),
        ("analysing", vec!["analyze", run, "-q", "all"]),
        (
            "exporting",
            vec!["export", run, "--perfetto", json.to_str().unwrap()],
        ),
        (
            "summarising runs",
            vec!["summary", run, "-o", summary.to_str().unwrap()],
        ),
    ];
    let mut stopped = 0;
    for (step, args) in &commands {
        for ceiling in ["12MB", "40MB", "90MB", "6GB"] {
            let out = Command::new(bin("xlap-trace"))
                .args(args)
                .env("XLAP_MAX_MEMORY", ceiling)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            let what = format!("{args:?} at {ceiling}: {}\n{err}", out.status);
            for never in [
                "panicked",
                "terminate called",
                "bad_alloc",
                "memory allocation of",
            ] {
                assert!(!err.contains(never), "{what}");
            }
            match out.status.code() {
                // Enough for this command (6GB always is).
                Some(0) => {}
                Some(8) => {
                    stopped += 1;
                    assert!(
                        err.contains(&format!("out of memory while {step}"))
                            && err.contains("XLAP_MAX_MEMORY"),
                        "{what}"
                    );
                }
                _ => panic!("{what}"),
            }
        }
    }
    // 12MB and 40MB are below what opening the engine takes.
    assert!(stopped >= 8, "only {stopped} runs reached their ceiling");
}

#[test]
fn report_renders_every_plot_in_headless_chromium() {
    let _guard = xlap_tests::unprivileged();
    let Some(browser) = xlap_tests::browser::chromium() else {
        xlap_tests::may_skip(
            "report_renders_every_plot_in_headless_chromium",
            "chromium is not installed (./run.sh test installs it)",
        );
        return;
    };
    let scratch = Scratch::new("report");
    let html = scratch.path("report.html");
    // A second run to overlay: another seed of the generator.
    let other = scratch.path("other");
    stdout(&xlap(&[
        "synth",
        "-o",
        other.to_str().unwrap(),
        "--packets",
        "1000",
        "--seed",
        "7",
    ]));
    stdout(&xlap(&[
        "report",
        fixture().to_str().unwrap(),
        other.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]));
    let ids: Vec<&str> = xlap_analyze::report::FIGURES
        .iter()
        .chain([&xlap_analyze::report::OVERLAY_FIGURE])
        .copied()
        .collect();
    for (id, f) in xlap_tests::browser::render(&browser, &html, &ids) {
        assert!(f.width > 200 && f.height > 100, "figure {id} is {f:?}");
        assert!(f.marks > 0, "figure {id} drew nothing");
        if id == xlap_analyze::report::OVERLAY_FIGURE {
            assert_eq!(f.marks, 2, "one profile per run");
        }
    }
}

#[test]
fn perfetto_export_matches_the_packets_table() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("perfetto");
    let out = scratch.path("trace.json");
    let text = stdout(&xlap(&[
        "export",
        fixture().to_str().unwrap(),
        "--perfetto",
        out.to_str().unwrap(),
        "--max-packets",
        "50",
    ]));
    assert!(text.contains("50 packets"), "{text}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    // Every begin has its end, per (pid, id, name).
    let mut open: HashMap<(i64, String, String), i64> = HashMap::new();
    for e in events {
        let key = || {
            (
                e["pid"].as_i64().unwrap(),
                e["id"].as_str().unwrap().to_string(),
                e["name"].as_str().unwrap().to_string(),
            )
        };
        match e["ph"].as_str().unwrap() {
            "b" => *open.entry(key()).or_default() += 1,
            "e" => *open.entry(key()).or_default() -= 1,
            _ => {}
        }
    }
    assert!(open.values().all(|n| *n == 0));
    assert_eq!(open.keys().filter(|k| k.2.starts_with("seq ")).count(), 100);
    // The slowest packet's qdisc step equals its column in the table.
    let cols = columns(&fixture().join("packets.parquet"));
    let e2e = &cols["e2e_ns"];
    let slowest = (0..e2e.len())
        .max_by(|&a, &b| e2e[a].unwrap_or(-1.0).total_cmp(&e2e[b].unwrap_or(-1.0)))
        .unwrap();
    let id = format!(
        "1:{}:{}",
        cols["kind"][slowest].unwrap(),
        cols["seq"][slowest].unwrap()
    );
    let ts = |ph: &str| {
        events
            .iter()
            .find(|e| {
                e["id"] == id.as_str()
                    && e["ph"] == ph
                    && e["name"] == "qdisc_enqueue → qdisc_dequeue"
            })
            .map(|e| e["ts"].as_f64().unwrap())
            .unwrap()
    };
    close(
        (ts("e") - ts("b")) * 1e3,
        cols["qdisc_enqueue__qdisc_dequeue_ns"][slowest].unwrap(),
        1e-6,
        "qdisc step of the slowest packet",
    );
}

#[test]
fn xlap_end_to_end_and_inliers_match_an_independent_computation() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let (kind, e2e) = (&cols["kind"], &cols["e2e_ns"]);
    let (tx, rx) = (&cols["sender_total_ns"], &cols["receiver_total_ns"]);
    // The column: sender + receiver total, the channel left out.
    let xlap: Vec<Option<f64>> = (0..e2e.len()).map(|i| Some(tx[i]? + rx[i]?)).collect();
    assert_eq!(cols["xlap_e2e_ns"], xlap);
    let row = |rows: &[serde_json::Map<String, Value>], k: u64| {
        rows.iter()
            .find(|r| r["stage"] == "e2e" && r["kind"] == k)
            .cloned()
            .unwrap_or_else(|| panic!("no e2e row for kind {k}"))
    };
    // --e2e xlap: the analyses' e2e is that sum.
    let rows = query("jitter", &["--e2e", "xlap"]);
    for (k, mut v) in by_kind(kind, e2e, &xlap) {
        v.sort_by(f64::total_cmp);
        let r = row(&rows, k);
        close(
            num(&r, "median_ns"),
            quantile(&v, 0.5),
            1e-9,
            "xlap e2e median",
        );
        close(num(&r, "max_ns"), v[v.len() - 1], 0.0, "xlap e2e max");
        close(num(&r, "packets"), v.len() as f64, 0.0, "xlap e2e packets");
    }
    // --inliers: only the packets at or below their kind's e2e fence.
    let rows = query("jitter", &["--inliers"]);
    for (k, mut v) in by_kind(kind, e2e, e2e) {
        v.sort_by(f64::total_cmp);
        let fence = quantile(&v, 0.75) + 1.5 * (quantile(&v, 0.75) - quantile(&v, 0.25));
        let inliers: Vec<f64> = v.iter().copied().filter(|x| *x <= fence).collect();
        assert!(inliers.len() < v.len(), "the fixture has e2e outliers");
        let r = row(&rows, k);
        close(
            num(&r, "packets"),
            inliers.len() as f64,
            0.0,
            "inlier packets",
        );
        close(
            num(&r, "max_ns"),
            inliers[inliers.len() - 1],
            0.0,
            "inlier max",
        );
    }
}

#[test]
fn deadline_and_activation_match_an_independent_computation() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let (kind, e2e) = (&cols["kind"], &cols["e2e_ns"]);
    // 300 µs: the fixture's planted qdisc inflation (250 µs, data packets
    // 100–199) pushes those over it.
    let rows = query("deadline", &["-p", "deadline=300"]);
    for (k, v) in by_kind(kind, e2e, e2e) {
        let misses = v.iter().filter(|x| **x > 300_000.0).count();
        let first = rows
            .iter()
            .find(|r| r["kind"] == k)
            .unwrap_or_else(|| panic!("no deadline row for kind {k}"));
        assert_eq!(num(first, "misses") as usize, misses, "kind {k}");
        assert_eq!(num(first, "delivered") as usize, v.len(), "kind {k}");
        if k == 0 {
            assert!(misses >= 80, "{misses} misses");
            assert_eq!(first["cause"], "qdisc_enqueue__qdisc_dequeue", "{rows:#?}");
        }
    }
    // Default: the run's own deadline_missed flag (1 ms in synth).
    let flagged = cols["deadline_missed"]
        .iter()
        .zip(e2e)
        .filter(|(d, e)| *d == &Some(1.0) && e.is_some())
        .count();
    let rows = query("deadline", &[]);
    let total: f64 = rows
        .iter()
        .map(|r| (r["kind"].as_u64().unwrap(), num(r, "misses")))
        .collect::<BTreeMap<u64, f64>>()
        .values()
        .sum();
    assert_eq!(total as usize, flagged);
    // Activation: synth sends exactly every 100 µs per seq step.
    let rows = query("activation", &[]);
    for r in &rows {
        assert_eq!(num(r, "period_us"), 100.0, "{r:?}");
        assert_eq!(num(r, "max_us"), 0.0, "{r:?}");
    }
    // A period that is 1 % off: a drift of 10 ms per s (the schedule runs
    // ahead of the sends by 1 µs per packet).
    let rows = query("activation", &["-p", "period=99", "--kind", "0"]);
    close(num(&rows[0], "drift_us_per_s"), 10_000.0, 1e-3, "drift");
}

#[test]
fn latency_profile_runs_from_the_fastest_to_the_slowest_packet() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let rows = query("latency_profile", &[]);
    for (k, mut v) in by_kind(&cols["kind"], &cols["e2e_ns"], &cols["e2e_ns"]) {
        v.sort_by(f64::total_cmp);
        let at = |e: f64| {
            rows.iter()
                .find(|r| {
                    r["stage"] == "e2e" && r["kind"] == k && (num(r, "exceedance") - e).abs() < 1e-9
                })
                .map(|r| num(r, "ns"))
                .unwrap_or_else(|| panic!("no e2e row at exceedance {e} for kind {k}"))
        };
        let n = v.len() as f64;
        close(at(1.0), v[0], 0.0, "fastest packet");
        close(at(0.5), quantile(&v, 0.5), 1e-9, "median");
        close(at(0.01), quantile(&v, 0.99), 1e-9, "p99");
        close(at(1.0 / n), v[v.len() - 1], 0.0, "slowest packet");
        // Exceedance falls as latency grows.
        let mut line: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r["stage"] == "e2e" && r["kind"] == k)
            .map(|r| (num(r, "exceedance"), num(r, "ns")))
            .collect();
        line.sort_by(|a, b| b.0.total_cmp(&a.0));
        assert!(line.windows(2).all(|w| w[0].1 <= w[1].1), "{line:?}");
    }
}

#[test]
fn qdisc_classes_match_an_independent_computation() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let (priority, e2e) = (&cols["priority"], &cols["e2e_ns"]);
    let queue = &cols["qdisc_enqueue__qdisc_dequeue_ns"];
    // Per priority: the delivered packets and their queueing, from the file.
    let mut by_class: BTreeMap<u64, (usize, Vec<f64>)> = BTreeMap::new();
    for i in 0..e2e.len() {
        if let (Some(_), Some(p)) = (e2e[i], priority[i]) {
            let entry = by_class.entry(p as u64).or_default();
            entry.0 += 1;
            entry.1.extend(queue[i]);
        }
    }
    let rows = query("qdisc_classes", &[]);
    assert_eq!(rows.len(), by_class.len(), "{rows:#?}");
    for (p, (n, mut q)) in by_class {
        let r = rows
            .iter()
            .find(|r| r["priority"] == p)
            .unwrap_or_else(|| panic!("no row for priority {p:#x}"));
        assert_eq!(r["class"], format!("{:x}:{:x}", p >> 16, p & 0xffff));
        assert_eq!(num(r, "packets") as usize, n, "{r:?}");
        assert_eq!(num(r, "queued") as usize, q.len(), "{r:?}");
        q.sort_by(f64::total_cmp);
        close(
            num(r, "queue_p99_us"),
            quantile(&q, 0.99) / 1e3,
            1e-3,
            "queue p99",
        );
        close(
            num(r, "queue_max_us"),
            q[q.len() - 1] / 1e3,
            1e-3,
            "queue max",
        );
    }
    // The planted qdisc inflation (data packets, kind 0, in class 1:10).
    let fast = rows.iter().find(|r| r["class"] == "1:10").unwrap();
    let slow = rows.iter().find(|r| r["class"] == "1:20").unwrap();
    assert!(num(fast, "queue_p99_us") > 200.0 && num(slow, "queue_p99_us") < 10.0);
}

/// (kind, lost, packets) per kind, counted from the file.
fn kinds_and_losses(cols: &BTreeMap<String, Vec<Option<f64>>>) -> BTreeMap<u64, (usize, usize)> {
    let mut out: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for (k, lost) in cols["kind"].iter().zip(&cols["lost"]) {
        let e = out.entry(k.unwrap() as u64).or_default();
        e.0 += (*lost == Some(1.0)) as usize;
        e.1 += 1;
    }
    out
}

#[test]
fn loss_matches_the_planted_loss_and_the_tracers_own_counters() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let rows = query("loss", &[]);
    let row = |scope: &str, measure: &str, what: &str| {
        rows.iter()
            .find(|r| r["scope"] == scope && r["measure"] == measure && r["what"] == what)
            .unwrap_or_else(|| panic!("no {scope} {measure} row for {what}: {rows:#?}"))
    };
    let mut all = (0, 0);
    for (kind, (lost, packets)) in kinds_and_losses(&cols) {
        let r = row("protocol", "lost", &kind.to_string());
        assert_eq!(num(r, "value") as usize, lost, "{r:?}");
        close(
            num(r, "percent"),
            100.0 * lost as f64 / packets as f64,
            1e-2,
            "percent lost",
        );
        // Islands of consecutive lost seqs, per flow, counted here.
        let mut seqs: Vec<(u64, u64)> = (0..cols["seq"].len())
            .filter(|&i| cols["kind"][i] == Some(kind as f64) && cols["lost"][i] == Some(1.0))
            .map(|i| {
                (
                    cols["flow"][i].unwrap() as u64,
                    cols["seq"][i].unwrap() as u64,
                )
            })
            .collect();
        seqs.sort();
        let islands = seqs
            .iter()
            .enumerate()
            .filter(|(i, (f, q))| *i == 0 || seqs[i - 1] != (*f, q - 1))
            .count();
        assert_eq!(
            num(row("protocol", "gaps", &kind.to_string()), "value") as usize,
            islands
        );
        all = (all.0 + lost, all.1 + packets);
    }
    // The generator's planted rate, within what 2000 draws allow (3 sigma).
    let rate = all.0 as f64 / all.1 as f64;
    let sigma = (xlap_analyze::synth::LOSS_RATE / all.1 as f64).sqrt();
    assert!(
        (rate - xlap_analyze::synth::LOSS_RATE).abs() <= 3.0 * sigma,
        "lost {rate} against the planted {}",
        xlap_analyze::synth::LOSS_RATE
    );
    // The tracer's losses are run.json's, point by point.
    let meta = xlap_tests::trace::run_meta(&fixture());
    let host = &meta.host;
    let mut listed = 0;
    for (point, counts) in &meta.points {
        for (reason, &n) in &counts.lost {
            let Some(reason) = reason.strip_prefix("lost_") else {
                continue;
            };
            if n > 0 {
                let r = row("tracer", reason, &format!("{host} {point}"));
                assert_eq!(num(r, "value") as u64, n, "{r:?}");
                listed += 1;
            }
        }
    }
    assert!(listed > 0, "the fixture's run.json has tracer losses");
    assert_eq!(
        rows.iter().filter(|r| r["scope"] == "tracer").count(),
        listed
    );
}

#[test]
fn histogram_bins_and_edges_match_an_independent_count() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let bins = 25;
    let rows = query("histogram", &["-p", &format!("bins={bins}")]);
    for (k, mut v) in by_kind(&cols["kind"], &cols["e2e_ns"], &cols["e2e_ns"]) {
        v.sort_by(f64::total_cmp);
        let (lo, hi) = (v[0], quantile(&v, 0.999));
        let width = ((hi - lo) / bins as f64).max(1.0);
        let mut counts = vec![0usize; bins + 1];
        for x in &v {
            counts[(((x - lo) / width).floor() as usize).min(bins)] += 1;
        }
        let mine: Vec<&serde_json::Map<String, Value>> =
            rows.iter().filter(|r| r["kind"] == k).collect();
        let total: f64 = mine.iter().map(|r| num(r, "packets")).sum();
        assert_eq!(total as usize, v.len(), "every delivered packet in a bin");
        for r in &mine {
            let bin = num(r, "bin") as usize;
            assert_eq!(
                num(r, "packets") as usize,
                counts[bin],
                "kind {k} bin {bin}"
            );
            close(
                num(r, "from_ns"),
                (lo + bin as f64 * width).round(),
                0.0,
                "bin start",
            );
            if bin < bins {
                close(
                    num(r, "to_ns"),
                    (lo + (bin + 1) as f64 * width).round(),
                    0.0,
                    "bin end",
                );
            } else {
                assert!(r["to_ns"].is_null(), "the last bin is open: {r:?}");
            }
            close(
                num(r, "fraction"),
                counts[bin] as f64 / v.len() as f64,
                1e-5,
                "fraction",
            );
        }
        // Empty bins are left out, every other one is there.
        assert_eq!(mine.len(), counts.iter().filter(|c| **c > 0).count());
    }
}

/// The fixture with `step_ns` added to the end-to-end latency of every
/// packet sent in the second half of the run, as a new packets file.
fn with_step(scratch: &Scratch, step_ns: i64) -> PathBuf {
    use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    let src = fixture().join("packets.parquet");
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&src).unwrap()).unwrap();
    let kv: Vec<parquet::file::metadata::KeyValue> = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|kv| kv.key != "ARROW:schema")
        .collect();
    let batches: Vec<RecordBatch> = builder.build().unwrap().map(|b| b.unwrap()).collect();
    let sent: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let c = b
                .column_by_name("sent_ns")
                .unwrap()
                .as_primitive::<Int64Type>();
            (0..c.len())
                .filter(|&i| c.is_valid(i))
                .map(|i| c.value(i))
                .collect::<Vec<_>>()
        })
        .collect();
    let middle = (sent.iter().min().unwrap() + sent.iter().max().unwrap()) / 2;
    let out = scratch.path("stepped.parquet");
    let props = parquet::file::properties::WriterProperties::builder()
        .set_key_value_metadata(Some(kv))
        .build();
    let mut writer = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&out).unwrap(),
        batches[0].schema(),
        Some(props),
    )
    .unwrap();
    for b in &batches {
        let sent = b
            .column_by_name("sent_ns")
            .unwrap()
            .as_primitive::<Int64Type>();
        let e2e = b
            .column_by_name("e2e_ns")
            .unwrap()
            .as_primitive::<Int64Type>();
        let stepped: Int64Array = (0..b.num_rows())
            .map(|i| {
                e2e.is_valid(i)
                    .then(|| e2e.value(i) + if sent.value(i) > middle { step_ns } else { 0 })
            })
            .collect();
        let mut columns: Vec<ArrayRef> = b.columns().to_vec();
        columns[b.schema().index_of("e2e_ns").unwrap()] = std::sync::Arc::new(stepped);
        writer
            .write(&RecordBatch::try_new(b.schema(), columns).unwrap())
            .unwrap();
    }
    writer.close().unwrap();
    out
}

#[test]
fn trend_finds_a_planted_step_as_an_independent_regression_does() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("trend-step");
    let step = 2_000_000i64; // 2 ms, above every e2e of the fixture
    let stepped = with_step(&scratch, step);
    let cols = columns(&stepped);
    let rows = query_on(&stepped, "trend", &[]);
    for k in [0u64, 1] {
        // (seq, sent, e2e) of the delivered packets of kind k, from the file.
        let pts: Vec<(f64, f64, f64)> = (0..cols["seq"].len())
            .filter(|&i| cols["kind"][i] == Some(k as f64))
            .filter_map(|i| Some((cols["seq"][i]?, cols["sent_ns"][i]?, cols["e2e_ns"][i]?)))
            .collect();
        let slope = |x: &dyn Fn(&(f64, f64, f64)) -> f64| {
            let n = pts.len() as f64;
            let (mx, my) = (
                pts.iter().map(x).sum::<f64>() / n,
                pts.iter().map(|p| p.2).sum::<f64>() / n,
            );
            let sxy: f64 = pts.iter().map(|p| (x(p) - mx) * (p.2 - my)).sum();
            let sxx: f64 = pts.iter().map(|p| (x(p) - mx).powi(2)).sum();
            sxy / sxx
        };
        let (t0, t1) = pts
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let tenth = |last: bool| {
            let v: Vec<f64> = pts
                .iter()
                .filter(|p| {
                    if last {
                        (p.1 - t0) * 10.0 >= 9.0 * (t1 - t0)
                    } else {
                        (p.1 - t0) * 10.0 <= t1 - t0
                    }
                })
                .map(|p| p.2)
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        let r = rows
            .iter()
            .find(|r| r["stage"] == "e2e" && r["kind"] == k)
            .unwrap_or_else(|| panic!("no e2e trend for kind {k}"));
        close(
            num(r, "ns_per_1000_packets"),
            slope(&|p| p.0) * 1000.0,
            1e-3,
            "slope per packet",
        );
        close(
            num(r, "ns_per_second"),
            slope(&|p| p.1) * 1e9,
            1e-3,
            "slope per second",
        );
        close(
            num(r, "first_tenth_mean_ns"),
            tenth(false),
            1e-3,
            "first tenth",
        );
        close(
            num(r, "last_tenth_mean_ns"),
            tenth(true),
            1e-3,
            "last tenth",
        );
        // The planted step: the last tenth rose by exactly the step over
        // the fixture's own (its first tenth holds the planted qdisc
        // inflation), and the regression explains most of the variance.
        let base = query("trend", &[]);
        let b = base
            .iter()
            .find(|r| r["stage"] == "e2e" && r["kind"] == k)
            .unwrap();
        let rise = |r: &serde_json::Map<String, Value>| {
            num(r, "last_tenth_mean_ns") - num(r, "first_tenth_mean_ns")
        };
        close(rise(r) - rise(b), step as f64, 1e-6, "the planted step");
        assert!(
            num(r, "r2_time") > 0.5 && num(b, "r2_time") < 0.1,
            "{r:?} {b:?}"
        );
    }
    // A stage the step did not touch shows none.
    let base = query("trend", &[]);
    let stage = "sock_send_enter__dev_queue";
    for k in [0u64, 1] {
        let find = |rows: &[serde_json::Map<String, Value>]| {
            num(
                rows.iter()
                    .find(|r| r["stage"] == stage && r["kind"] == k)
                    .unwrap(),
                "ns_per_second",
            )
        };
        close(find(&rows), find(&base), 1e-9, "an untouched stage");
    }
}

#[test]
fn summary_matches_an_independent_computation() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let losses = kinds_and_losses(&cols);
    for k in [0u64, 1] {
        let rows = query("summary", &["--kind", &k.to_string()]);
        let head = rows.iter().find(|r| r["section"] == "run").unwrap();
        let (lost, packets) = losses[&k];
        assert_eq!(num(head, "packets") as usize, packets);
        let note = head["note"].as_str().unwrap();
        assert!(note.starts_with(&format!("lost {lost} (")), "{note}");
        for (stage, values) in stage_values(&cols) {
            let Some(r) = rows.iter().find(|r| r["name"] == stage.as_str()) else {
                continue;
            };
            let mut v = by_kind(&cols["kind"], &cols["e2e_ns"], values)
                .remove(&k)
                .unwrap_or_default();
            v.sort_by(f64::total_cmp);
            assert_eq!(num(r, "packets") as usize, v.len(), "{stage}");
            // Rounded to 0.1 µs by the query.
            let us = |ns: f64| (ns / 100.0).round() / 10.0;
            close(num(r, "p50_us"), us(quantile(&v, 0.5)), 1e-9, "p50");
            close(num(r, "p99_us"), us(quantile(&v, 0.99)), 1e-9, "p99");
            close(num(r, "max_us"), us(v[v.len() - 1]), 1e-9, "max");
        }
        assert!(
            rows.iter().any(|r| r["name"] == "e2e"),
            "the end-to-end total is listed: {rows:#?}"
        );
    }
}

#[test]
fn trace_shows_the_slowest_packets_stamps_as_the_file_has_them() {
    let _guard = xlap_tests::unprivileged();
    let cols = columns(&fixture().join("packets.parquet"));
    let top = 3;
    let rows = query("trace", &["-p", &format!("top={top}")]);
    // The slowest packets by e2e, from the file.
    let mut order: Vec<usize> = (0..cols["e2e_ns"].len())
        .filter(|&i| cols["e2e_ns"][i].is_some())
        .collect();
    order.sort_by(|&a, &b| {
        cols["e2e_ns"][b]
            .unwrap()
            .total_cmp(&cols["e2e_ns"][a].unwrap())
    });
    let points: Vec<&String> = cols
        .keys()
        .filter(|c| c.ends_with("_ns") && !c.contains("__") && !c.contains("total"))
        .filter(|c| {
            ![
                "e2e_ns",
                "channel_ns",
                "sent_ns",
                "xlap_e2e_ns",
                "duplicate_skew_ns",
            ]
            .contains(&c.as_str())
        })
        .collect();
    for (rank, &i) in order.iter().take(top).enumerate() {
        let seq = cols["seq"][i].unwrap() as u64;
        let mine: Vec<&serde_json::Map<String, Value>> = rows
            .iter()
            .filter(|r| num(r, "rank") as usize == rank + 1)
            .collect();
        assert!(
            mine.iter().all(|r| r["seq"] == seq),
            "rank {} is seq {seq}",
            rank + 1
        );
        let stamps: Vec<(String, f64)> = points
            .iter()
            .filter_map(|c| Some((c.trim_end_matches("_ns").to_string(), cols[c.as_str()][i]?)))
            .collect();
        let first = stamps.iter().map(|s| s.1).fold(f64::MAX, f64::min);
        assert_eq!(mine.len(), stamps.len(), "every stamp of seq {seq}");
        for r in &mine {
            let column = r["point"].as_str().unwrap().replace('.', "_");
            let at = stamps
                .iter()
                .find(|s| s.0 == column)
                .unwrap_or_else(|| panic!("{column} is not a stamp of seq {seq}"))
                .1;
            close(
                num(r, "at_ns"),
                at - first,
                0.0,
                "offset from the first stamp",
            );
        }
        // In time order, each step from the one before.
        for w in mine.windows(2) {
            assert!(num(w[0], "at_ns") <= num(w[1], "at_ns"));
            close(
                num(w[1], "since_previous_ns"),
                num(w[1], "at_ns") - num(w[0], "at_ns"),
                0.0,
                "since the previous stamp",
            );
        }
    }
}
