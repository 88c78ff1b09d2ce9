//! Unprivileged: the command line's help, vocabulary and usage errors.

use std::process::Command;
use xlap_tests::bin;

fn xlap(args: &[&str]) -> std::process::Output {
    Command::new(bin("xlap-trace"))
        .args(args)
        .output()
        .expect("run xlap-trace")
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn help_texts() {
    let _guard = xlap_tests::unprivileged();
    for args in [
        &["--help"][..],
        &["record", "--help"],
        &["run", "--help"],
        &["stage", "up", "--help"],
        &["demo", "--help"],
        &["analyze", "--help"],
    ] {
        let out = xlap(args);
        assert!(out.status.success());
        insta::assert_snapshot!(
            format!("help_{}", args[..args.len() - 1].join("_")),
            text(&out)
        );
    }
}

#[test]
fn points_and_presets() {
    let _guard = xlap_tests::unprivileged();
    let out = xlap(&["points"]);
    assert!(out.status.success());
    insta::assert_snapshot!(text(&out));
}

#[test]
fn the_committed_schemas_are_current() {
    let _guard = xlap_tests::unprivileged();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
    let out = xlap(&["schema", "--check", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_stale_schema_file_is_reported_with_the_fix() {
    let _guard = xlap_tests::unprivileged();
    let scratch = xlap_tests::Scratch::new("stale_schema");
    std::fs::write(scratch.path("stamps.schema.json"), "{}").unwrap();
    let out = xlap(&["schema", "--check", scratch.0.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("schema --write"), "{}", text(&out));
}

#[test]
fn usage_errors_exit_2_and_say_what_to_do() {
    let _guard = xlap_tests::unprivileged();
    let cases: &[(&[&str], &str)] = &[
        (&["record"], "--pid"),
        (&[], "--pid"),
        (
            &["record", "--pid", "1", "--proto", "nope"],
            "presets: xlap-example",
        ),
        (
            &["record", "--pid", "1", "--seq-size", "3"],
            "--seq-size must be 1, 2, 4 or 8",
        ),
        (
            &["record", "--pid", "1", "--ringbuf-kib", "3"],
            "power of two",
        ),
        (&["record", "--pid", "notanumber"], "invalid value"),
        (
            &["stage", "up", "--qdisc", "a=netem"],
            "netem is not in this kernel",
        ),
        (&["stage", "up", "--qdisc", "c=tbf"], "no host \"c\""),
    ];
    for (args, needle) in cases {
        let out = xlap(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(needle), "{args:?}: {}", text(&out));
    }
}
