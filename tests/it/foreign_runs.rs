//! Unprivileged: a run directory from elsewhere (a CI artifact, the run a
//! pull request recorded) is untrusted input (docs/threat-model.md). Cases
//! of issue 50 as regression tests: a genuine synthetic run, one file
//! tampered with, each command a child under a timeout; it must refuse with
//! exit 6 naming the file, never panic, hang, read a file outside the run
//! or write through a link.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use xlap_tests::{bin, Scratch};

/// A marker that only the file outside the run holds.
const OUTSIDE: &str = "OUTSIDE-THE-RUN-7f3a";

/// `xlap-trace ARGS`, ended after 60 s (a hang is a failure, not a wait).
fn xlap(args: &[&str]) -> Output {
    let mut child = Command::new(bin("xlap-trace"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xlap-trace runs");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "xlap-trace {args:?} still running after 60 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A genuine run with its summary.json.
fn genuine(dir: &Path) {
    let d = dir.to_str().unwrap();
    for args in [
        &["synth", "-o", d, "--packets", "2000", "--seed", "3"][..],
        &["summary", d],
    ] {
        let out = xlap(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The command ended with exit 6, naming `file`, with no panic and no byte
/// of the outside file in what it printed.
fn refused(out: &Output, file: &str, why: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains(file) && stderr.contains(why), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !stderr.contains(OUTSIDE) && !stdout.contains(OUTSIDE),
        "{stdout}{stderr}"
    );
}

/// A change to a summary.json's JSON.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

fn edit_summary(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

#[test]
fn a_summary_with_edited_grids_or_counts_is_refused_where_compare_once_panicked() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-summary");
    let base = scratch.path("base");
    genuine(&base);
    let cases: [(&str, Edit, &str); 5] = [
        // Once: index out of bounds: the len is 0 but the index is 49.
        (
            "empty grid",
            Box::new(|v| v["levels"] = serde_json::json!([])),
            "quantile levels",
        ),
        // Once: the len is 1 but the index is 5.
        (
            "one block level",
            Box::new(|v| v["block_levels"] = serde_json::json!([0.5])),
            "block levels",
        ),
        // Once: attempt to add with overflow, pooled.
        (
            "2^64-1 packets",
            Box::new(|v| v["stages"][0]["packets"] = serde_json::json!(u64::MAX)),
            "packets",
        ),
        (
            "a grid short of its levels",
            Box::new(|v| v["stages"][0]["quantiles_ns"] = serde_json::json!([1.0, 2.0])),
            "grid",
        ),
        (
            "a run id of 2 MB",
            Box::new(|v| v["runs"][0] = serde_json::json!("x".repeat(2 << 20))),
            "name",
        ),
    ];
    for (i, (what, edit, why)) in cases.iter().enumerate() {
        let cand = scratch.path(&format!("cand{i}"));
        std::fs::create_dir_all(&cand).unwrap();
        let summary = cand.join("summary.json");
        std::fs::copy(base.join("summary.json"), &summary).unwrap();
        edit_summary(&summary, edit);
        let s = summary.to_str().unwrap();
        let b = base.to_str().unwrap();
        for args in [
            vec!["compare", b, s, "--markdown"],
            vec!["compare", s, b, "--markdown"],
        ] {
            let out = xlap(&args);
            refused(&out, "summary.json", why);
            assert!(out.stdout.is_empty(), "{what}: a verdict was printed");
        }
    }
}

#[test]
fn links_fifos_and_devices_in_a_run_are_refused_and_nothing_is_written_through_a_link() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-links");
    let base = scratch.path("base");
    genuine(&base);
    let outside: PathBuf = scratch.path("outside-file");
    std::fs::write(&outside, format!("{{\"secret\": \"{OUTSIDE}\"}}")).unwrap();
    let b = base.to_str().unwrap();

    // summary.json a link to a file outside the run, to /dev/zero, a FIFO.
    for name in ["link", "zero", "fifo"] {
        let cand = scratch.path(&format!("cand-{name}"));
        std::fs::create_dir_all(&cand).unwrap();
        let s = cand.join("summary.json");
        match name {
            "link" => std::os::unix::fs::symlink(&outside, &s).unwrap(),
            "zero" => std::os::unix::fs::symlink("/dev/zero", &s).unwrap(),
            _ => {
                let c = std::ffi::CString::new(s.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a NUL-terminated path in this test's scratch.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }
        }
        let out = xlap(&["compare", b, s.to_str().unwrap(), "--markdown"]);
        let why = if name == "fifo" {
            "FIFO"
        } else {
            "symbolic link"
        };
        refused(&out, "summary.json", why);
    }

    // run.json a link out of the run: analyze refuses it.
    let run = scratch.path("run-link");
    genuine(&run);
    std::fs::remove_file(run.join("run.json")).unwrap();
    std::os::unix::fs::symlink(&outside, run.join("run.json")).unwrap();
    let out = xlap(&["analyze", run.to_str().unwrap()]);
    refused(&out, "run.json", "symbolic link");

    // A dangling summary.json link: `summary` creates nothing through it.
    let dangling = scratch.path("dangling");
    genuine(&dangling);
    std::fs::remove_file(dangling.join("summary.json")).unwrap();
    let target = scratch.path("created-through-the-link");
    std::os::unix::fs::symlink(&target, dangling.join("summary.json")).unwrap();
    let out = xlap(&["summary", dangling.to_str().unwrap()]);
    refused(&out, "summary.json", "symbolic link");
    assert!(!target.exists(), "summary wrote through the link");
}
