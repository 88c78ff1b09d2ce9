//! Unprivileged: `summary` and `compare` on synthetic runs (fixed seeds):
//! the Markdown and JSON outputs are snapshots, the results reproducible,
//! and bad input is a clear error with its exit code.

use std::path::Path;
use std::process::{Command, Output};
use xlap_tests::{bin, Scratch};

fn xlap(args: &[&str]) -> Output {
    Command::new(bin("xlap-trace"))
        .args(args)
        .output()
        .expect("xlap-trace runs")
}

fn synth(dir: &Path, seed: &str) {
    let d = dir.to_str().unwrap();
    let out = xlap(&["synth", "-o", d, "--packets", "2000", "--seed", seed]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = xlap(&["summary", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("summary.json").exists());
}

/// The summary.json of a synthetic run per seed, in `scratch`.
fn summaries(scratch: &Scratch, seeds: &[&str]) -> Vec<std::path::PathBuf> {
    seeds
        .iter()
        .map(|seed| {
            let d = scratch.path(&format!("s{seed}"));
            synth(&d, seed);
            d.join("summary.json")
        })
        .collect()
}

const METRICS: &[&str] = &[
    "--metric",
    "e2e.p50",
    "--metric",
    "e2e.p99",
    "--metric",
    "stage:receiver_total.p99",
];

#[test]
fn compare_outputs_on_fixed_runs() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("compare-cli");
    let (a, b) = (scratch.path("a"), scratch.path("b"));
    synth(&a, "1");
    synth(&b, "2");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let run = |extra: &[&str]| {
        let mut args = vec!["compare", a, b];
        args.extend(METRICS);
        args.extend(extra);
        let out = xlap(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json = run(&["--json"]);
    assert_eq!(
        json,
        run(&["--json"]),
        "the same inputs give the same intervals"
    );
    insta::assert_snapshot!("compare_json", json);
    insta::assert_snapshot!("compare_markdown", run(&["--markdown"]));
    // A run compared with itself: every change is exactly 0 with the
    // interval [0, 0], so every metric that can decide passes, and the
    // whole comparison too (it once said inconclusive, ±5.7 ms).
    let out = xlap(&["compare", a, a, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        assert_eq!(r["change"], 0.0, "{r}");
        assert_eq!(
            (r["ci_low_us"].as_f64(), r["ci_high_us"].as_f64()),
            (Some(0.0), Some(0.0)),
            "{r}"
        );
        assert_eq!(r["width"], "same_data", "{r}");
        let expected = if r["decides"] == true {
            "pass"
        } else {
            "not_decided"
        };
        assert_eq!(r["verdict"], expected, "{r}");
    }
    assert_eq!(v["verdict"], "pass", "{v}");
    assert!(
        v["notes"].to_string().contains("the same data"),
        "{}",
        v["notes"]
    );
    // Pooling the two: each run's grid is kept for the spread.
    let pooled = scratch.path("pooled.json");
    let out = xlap(&["summary", a, b, "-o", pooled.to_str().unwrap()]);
    assert!(out.status.success());
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&pooled).unwrap()).unwrap();
    assert_eq!(p["runs"], serde_json::json!(["synth-1", "synth-2"]));
    assert_eq!(p["stages"][0]["runs_ns"].as_array().unwrap().len(), 2);
}

#[test]
fn compare_bad_input_is_said_with_its_code() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("compare-bad");
    let junk = scratch.path("junk.json");
    std::fs::write(&junk, "{\"hello\": 1}").unwrap();
    let j = junk.to_str().unwrap();
    let out = xlap(&["compare", j, j]);
    assert_eq!(out.status.code(), Some(6));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not an xlap-trace summary"), "{err}");
    let out = xlap(&["compare", j, j, "--metric", "e2e"]);
    assert_eq!(out.status.code(), Some(2));
    let out = xlap(&["compare", j, j, "--max-regression", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    // A stage neither run has, named explicitly.
    let a = scratch.path("a");
    synth(&a, "1");
    let a = a.to_str().unwrap();
    let out = xlap(&["compare", a, a, "--metric", "stage:nope.p50"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no stage nope in both runs; the stages are:"),
        "{err}"
    );
    // A JUnit file that cannot be written (as root, before the confined
    // child starts): an error, never 1, which is a regression.
    let junit = scratch.path("no-such-dir").join("junit.xml");
    let out = xlap(&["compare", a, a, "--junit", junit.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot write") && err.contains("junit.xml"),
        "{err}"
    );
}

#[test]
fn history_over_a_series() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("history-cli");
    let dirs: Vec<String> = summaries(&scratch, &["1", "2", "3"])
        .iter()
        .map(|f| f.to_str().unwrap().to_string())
        .collect();
    let svg = scratch.path("h.svg");
    let mut args = vec!["history"];
    args.extend(dirs.iter().map(String::as_str));
    args.extend(METRICS);
    args.extend(["--svg", svg.to_str().unwrap()]);
    let out = xlap(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    insta::assert_snapshot!("history_markdown", String::from_utf8(out.stdout).unwrap());
    // The same values as compare reports for the first and last run.
    let json = xlap(&{
        let mut a = args.clone();
        a.truncate(a.len() - 2);
        a.push("--json");
        a
    });
    let series: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let cmp = xlap(&[
        "compare", &dirs[0], &dirs[2], "--metric", "e2e.p50", "--json",
    ]);
    let cmp: serde_json::Value = serde_json::from_slice(&cmp.stdout).unwrap();
    for row in cmp["rows"].as_array().unwrap() {
        let s = series
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["metric"] == "e2e.p50" && s["kind"] == row["kind"])
            .unwrap();
        assert_eq!(s["values_us"][0], row["baseline_us"]);
        assert_eq!(s["values_us"][2], row["candidate_us"]);
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    assert_eq!(plot.matches("<polyline").count(), 6, "3 metrics x 2 kinds");
}

/// A CI history of many runs: the Markdown keeps to the first and last
/// runs, says how many it leaves out, and gives the spread over every run
/// (as the JSON series, which `history_over_a_series` holds to `compare`).
#[test]
fn a_long_history_shows_its_ends_and_the_spread_of_every_run() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("history-long");
    let seeds = summaries(&scratch, &["4", "5", "6"]);
    let files: Vec<String> = (0..30)
        .map(|i| {
            let f = scratch.path(&format!("{i:02}.json"));
            std::fs::copy(&seeds[i % 3], &f).unwrap();
            f.to_str().unwrap().to_string()
        })
        .collect();
    let mut args = vec!["history", "--metric", "e2e.p50"];
    args.extend(files.iter().map(String::as_str));
    let out = xlap(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = String::from_utf8(out.stdout).unwrap();
    let mut json_args = args.clone();
    json_args.push("--json");
    let series: serde_json::Value =
        serde_json::from_slice(&xlap(&json_args).stdout).expect("JSON series");
    let lines: Vec<&str> = md.lines().collect();
    assert!(lines[0].contains("| … 21 runs |"), "{md}");
    assert!(lines[0].ends_with("| min | median | max | drift |"), "{md}");
    for s in series.as_array().unwrap() {
        let mut v: Vec<f64> = s["values_us"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(v.len(), 30);
        let (first, last) = (v[0], v[29]);
        v.sort_by(f64::total_cmp);
        let row = lines
            .iter()
            .find(|l| l.starts_with(&format!("| `e2e.p50` | {} |", s["kind"])))
            .unwrap_or_else(|| panic!("no row of kind {} in\n{md}", s["kind"]));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | metric | kind | 3 first | … | 6 last | min | median | max | drift |
        assert_eq!(cells.len(), 2 + 2 + 3 + 1 + 6 + 3 + 1, "{row}");
        assert_eq!(cells[3], format!("{first:.1}"), "{row}");
        assert_eq!(cells[6], "…", "{row}");
        assert_eq!(cells[12], format!("{last:.1}"), "{row}");
        assert_eq!(cells[13], format!("{:.1}", v[0]), "{row}");
        assert_eq!(cells[14], format!("{:.1}", v[15]), "{row}");
        assert_eq!(cells[15], format!("{:.1}", v[29]), "{row}");
    }
}
