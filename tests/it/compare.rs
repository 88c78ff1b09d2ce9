//! Privileged: `summary` and `compare` on real runs of the example protocol
//! across the two-host stage: ten unchanged runs compared pairwise (every
//! ordered pair, each run a single-run baseline) give no regression
//! verdict at the default confidence (beyond the few runs a whole-run
//! state sets apart), nor do unchanged runs against a baseline pooled
//! from five; a 50 µs busy-wait injected in the receiver's
//! decode is a regression against every unchanged run, named first, exit
//! code 1, its size the injected 50 µs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use xlap_stage::Stage;
use xlap_tests::example::ExampleOptions;
use xlap_tests::trace::trace_example;
use xlap_tests::{bin, privileged, Scratch};

fn compare(base: &Path, cand: &Path, extra: &[&str]) -> Output {
    Command::new(bin("xlap-trace"))
        .arg("compare")
        .arg(base)
        .arg(cand)
        .args(extra)
        .output()
        .expect("xlap-trace compare")
}

/// Packets per run (at 200 µs: 3 s).
const RUN_PACKETS: u32 = 15_000;

/// One traced run of the example (markers on), its summary kept.
fn run_summary(stage: &Stage, keep: &Scratch, i: usize, recv_args: &[&str]) -> PathBuf {
    let t = trace_example(
        stage,
        &format!("cmp-{i}"),
        &ExampleOptions {
            // 3 s: long enough for its blocks to see the machine's noise
            // (compare's note below this is what the test asserts away).
            count: RUN_PACKETS,
            period_us: 200,
            markers: true,
            recv_args: recv_args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
        &["--quiet"],
    );
    let summary = t.run_dir().join("summary.json");
    assert!(
        summary.exists(),
        "record wrote no summary.json: {}",
        t.stderr
    );
    let kept = keep.path(&format!("summary-{i}.json"));
    std::fs::copy(&summary, &kept).unwrap();
    kept
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "compare printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The metrics a comparison calls regressions.
fn regressions(json: &serde_json::Value) -> Vec<String> {
    json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] == "regression")
        .map(|r| {
            format!(
                "{} kind {} ({} -> {} us, interval {}..{})",
                r["metric"],
                r["kind"],
                r["baseline_us"],
                r["candidate_us"],
                r["ci_low"],
                r["ci_high"]
            )
        })
        .collect()
}

#[test]
fn unchanged_runs_pass_and_an_injected_stage_delay_is_a_regression_named_first() {
    let Some(_guard) = privileged("compare") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let keep = Scratch::new("cmp-summaries");
    let runs: Vec<PathBuf> = (0..10)
        .map(|i| run_summary(&stage, &keep, i, &[]))
        .collect();

    // Every ordered pair: the first a single-run baseline, the second the
    // candidate. Its intervals hold the spread between blocks of each run.
    let mut false_alarms = Vec::new();
    let mut alarm_pairs: Vec<(usize, usize)> = Vec::new();
    for (i, base) in runs.iter().enumerate() {
        for (j, cand) in runs.iter().enumerate() {
            if i == j {
                continue;
            }
            let out = compare(base, cand, &["--json"]);
            let json = json(&out);
            assert_eq!(json["noise"], "blocks", "{json:#}");
            // Runs long enough. The tracer's own cost may be noted: its
            // BPF time per datagram and per program run move with the other
            // tests' load (×1.53 and ×1.73 between unchanged runs here,
            // docs/ci.md); it decides no verdict.
            let notes = json["notes"].as_array().unwrap();
            assert!(
                notes.iter().all(|n| {
                    let n = n.as_str().unwrap();
                    n.contains("tracing itself got dearer")
                        || n.contains("as often per traced datagram")
                }),
                "run {i} -> run {j}: {notes:?}"
            );
            let regressed = regressions(&json);
            let expected = if regressed.is_empty() { 0 } else { 1 };
            assert_eq!(out.status.code(), Some(expected), "{regressed:?}");
            if !regressed.is_empty() {
                false_alarms.push(format!("run {i} -> run {j}: {regressed:?}"));
                alarm_pairs.push((i, j));
            }
        }
    }
    // The family-wise level bounds the false alarms that the noise within
    // a run makes (1 % of comparisons). A state that lasts a whole run is
    // noise a single-run baseline cannot know, and this machine has them:
    // about one run in ten has its parity packets' sender_total p50 at
    // 38 µs instead of 10, in every block. Such a run is flagged against
    // the others; intervals too narrow would instead spread false alarms
    // over many pairs. So: the false alarms must all involve a few runs
    // (at most three of the ten, greedily chosen).
    eprintln!(
        "{} of 90 comparisons of unchanged runs called a regression:\n{}",
        false_alarms.len(),
        false_alarms.join("\n")
    );
    let pair = |a: &(usize, usize)| [a.0, a.1];
    let mut rest: Vec<(usize, usize)> = alarm_pairs.clone();
    let mut odd = Vec::new();
    while !rest.is_empty() {
        let worst = (0..10)
            .max_by_key(|r| rest.iter().filter(|a| pair(a).contains(r)).count())
            .unwrap();
        odd.push(worst);
        rest.retain(|a| !pair(a).contains(&worst));
    }
    assert!(
        odd.len() <= 3,
        "unchanged runs called regressions, spread over runs {odd:?}:\n{}",
        false_alarms.join("\n")
    );

    // A baseline pooled from the first five (their spread is the machine's
    // noise); each of the other five, unchanged: no regression, exit 0.
    // A run found odd above (a state that lasted the whole run) may be
    // flagged against five runs that did not see that state: it is the
    // same noise the pairs allowed, not a second allowance.
    let pooled = keep.path("baseline.json");
    let st = Command::new(bin("xlap-trace"))
        .arg("summary")
        .args(&runs[..5])
        .arg("-o")
        .arg(&pooled)
        .status()
        .unwrap();
    assert!(st.success());
    for (k, cand) in runs.iter().enumerate().skip(5) {
        let out = compare(&pooled, cand, &["--json"]);
        let json = json(&out);
        assert_eq!(json["baseline_run_count"], 5);
        assert_eq!(json["noise"], "runs");
        let regressed = regressions(&json);
        eprintln!("pooled baseline -> run {k}: {regressed:?}");
        if odd.contains(&k) {
            continue;
        }
        assert_eq!(
            regressed,
            Vec::<String>::new(),
            "run {k} ({}) against the pooled baseline; odd runs {odd:?}",
            cand.display()
        );
        assert_eq!(out.status.code(), Some(0));
    }

    // The candidate: 50 µs more in the receiver's decode, against every
    // unchanged run and the pooled baseline.
    let slow = run_summary(&stage, &keep, 99, &["--inject", "decode=50"]);
    for base in runs.iter().chain([&pooled]) {
        let out = compare(base, &slow, &["--json"]);
        let json = json(&out);
        assert_eq!(out.status.code(), Some(1), "{json:#}");
        assert_eq!(json["verdict"], "regression");
        let first = &json["rows"][0];
        assert_eq!(first["verdict"], "regression");
        assert_eq!(
            first["stage"], "app_decode_start__app_decode_end",
            "the injected stage first: {json:#}"
        );
        // Its median grew by the injected 50 µs (a busy-wait: at least
        // that). Its p99 is not the size: a busy-wait preempted by the
        // other tests of a loaded CI machine lasts longer.
        let median = json["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["stage"] == first["stage"] && r["kind"] == first["kind"] && r["quantile"] == 0.5
            })
            .unwrap_or_else(|| panic!("no p50 row of the injected stage: {json:#}"));
        assert_eq!(median["verdict"], "regression", "{median:#}");
        let added =
            median["candidate_us"].as_f64().unwrap() - median["baseline_us"].as_f64().unwrap();
        assert!(
            (45.0..80.0).contains(&added),
            "{added} µs added: {median:#}"
        );
    }
    // Markdown for the CI step summary, and JUnit.
    let junit = keep.path("junit.xml");
    let out = compare(
        &pooled,
        &slow,
        &["--markdown", "--junit", junit.to_str().unwrap()],
    );
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(md.starts_with("### ❌ xlap-trace: REGRESSION"), "{md}");
    assert!(md.contains("app_decode_start__app_decode_end"));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("<failure message=\"regression\">"), "{xml}");
}
