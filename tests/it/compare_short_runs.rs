//! Privileged: `compare` on short single runs of the example CI job
//! (examples/ci/xlap-ci.sh, 3 000 packets, 0.3 s), each pair a single-run
//! baseline and one check: 50 µs injected into the receiver's decode is a
//! regression with that stage named first, and an unchanged check is none.
//! On this shared machine whole-run states of the scheduler (the receiver
//! behind its queue, the peer preempting the sender) used to make seven of
//! ten unchanged pairs regressions (docs/ci.md, `just bench-compare`); two pairs
//! of each keep the fix honest at CI cost. The intervals it prints stay
//! bounded numbers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use xlap_tests::{bin, privileged, target_dir, Scratch};

fn ci_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ci/xlap-ci.sh")
}

/// One step of the CI script with the built binaries on PATH, its runs
/// short, on a port of its own.
fn step(args: &[&Path], inject: Option<&str>) -> Output {
    let path = format!(
        "{}:{}",
        target_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("sh");
    cmd.arg(ci_script())
        .args(args)
        .env("PATH", path)
        .env("XLAP_CI_COUNT", "3000")
        .env("XLAP_CI_PORT", "47640")
        .env_remove("XLAP_INJECT");
    if let Some(i) = inject {
        cmd.env("XLAP_INJECT", i);
    }
    cmd.output().expect("xlap-ci.sh runs")
}

/// A single-run baseline, then one check against it (injected or not):
/// the check's output and the comparison as JSON.
fn pair(scratch: &Scratch, name: &str, inject: Option<&str>) -> (Output, serde_json::Value) {
    let base = scratch.path(&format!("{name}-base"));
    let out = step(&[Path::new("baseline"), &base, Path::new("1")], None);
    assert!(
        out.status.success(),
        "baseline {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let baseline = base.join("baseline.json");
    let check = scratch.path(&format!("{name}-check"));
    let out = step(&[Path::new("check"), &baseline, &check], inject);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "check {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = Command::new(bin("xlap-trace"))
        .arg("compare")
        .arg(&baseline)
        .arg(check.join("run"))
        .arg("--json")
        .output()
        .expect("xlap-trace compare");
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap_or_else(|e| {
        panic!(
            "compare printed no JSON ({e}): {}",
            String::from_utf8_lossy(&json.stderr)
        )
    });
    assert_eq!(
        json.status.code(),
        out.status.code(),
        "the check's exit is compare's"
    );
    (out, v)
}

fn regressions(v: &serde_json::Value) -> Vec<String> {
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] == "regression")
        .map(|r| {
            format!(
                "{} kind {} ({} -> {} us, [{}, {}] us, effect {})",
                r["metric"],
                r["kind"],
                r["baseline_us"],
                r["candidate_us"],
                r["ci_low_us"],
                r["ci_high_us"],
                r["effect"]
            )
        })
        .collect()
}

/// Every interval cell of the Markdown: a few digits per bound (the ratio
/// of a stage near zero printed `[-137.8%, +428844017.4%]`).
fn assert_bounded_intervals(md: &str) {
    for line in md.lines().filter(|l| l.starts_with("| `")) {
        let interval = line.split(" | ").nth(4).unwrap_or_default();
        assert!(
            interval.starts_with('[') && interval.len() < 48,
            "unbounded interval {interval:?} in {line}"
        );
        let longest = interval
            .split(|c: char| !c.is_ascii_digit())
            .map(str::len)
            .max()
            .unwrap_or(0);
        assert!(longest <= 5, "a {longest}-digit figure in {line}");
    }
}

#[test]
fn short_single_runs_find_an_injected_delay_and_no_false_alarm() {
    let Some(_guard) = privileged("compare_short_runs") else {
        return;
    };
    let scratch = Scratch::new("compare-short");
    // Interleaved, as the bench does: a state of the machine falls on both.
    for i in 0..2 {
        let (out, v) = pair(&scratch, &format!("injected{i}"), Some("decode=50"));
        let md = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "injected pair {i}: {md}");
        let first = &v["rows"][0];
        assert_eq!(first["verdict"], "regression", "{md}");
        assert_eq!(
            first["stage"], "app_decode_start__app_decode_end",
            "the injected stage first: {md}"
        );
        assert_eq!(first["quantile"], 0.5);
        let added =
            first["candidate_us"].as_f64().unwrap() - first["baseline_us"].as_f64().unwrap();
        assert!((45.0..80.0).contains(&added), "{added} µs added: {first:#}");
        assert!(md.starts_with("### ❌ xlap-trace: REGRESSION"), "{md}");
        assert_bounded_intervals(&md);

        let (out, v) = pair(&scratch, &format!("unchanged{i}"), None);
        let md = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            regressions(&v),
            Vec::<String>::new(),
            "unchanged pair {i}: {md}"
        );
        assert_eq!(out.status.code(), Some(0), "unchanged pair {i}: {md}");
        // p99 of 3 000 packets has 30 beyond it: never deciding.
        for r in v["rows"].as_array().unwrap() {
            if r["quantile"] == 0.99 {
                assert_eq!(r["decides"], false, "{r:#}");
            }
        }
        assert_bounded_intervals(&md);
    }
}
