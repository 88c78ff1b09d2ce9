//! Privileged: `xlap-trace run -- CMD` starts a command, traces it from its
//! first datagram (markers included) and through the processes it starts,
//! and exits with its status; checked against the command's own log.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use xlap_tests::c_programs::{udp_loop, udp_loop_log};
use xlap_tests::trace::{read_stamps, run_meta, SEQ_U64_LE};
use xlap_tests::{bin, privileged, Scratch};

fn xlap_run(run_dir: &Path, command: &[&str]) -> Output {
    Command::new(bin("xlap-trace"))
        .args(["run", "--quiet", "--no-correlate", "-o"])
        .arg(run_dir)
        .args(SEQ_U64_LE)
        .arg("--")
        .args(command)
        .output()
        .expect("xlap-trace run")
}

/// Points stamped per seq.
fn points_by_seq(run_dir: &Path) -> BTreeMap<u64, BTreeSet<String>> {
    let mut by_seq: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for row in read_stamps(&run_dir.join("stamps.parquet")) {
        if let Some(seq) = row.seq {
            by_seq.entry(seq).or_default().insert(row.point);
        }
    }
    by_seq
}

#[test]
fn run_traces_a_command_from_its_first_datagram_and_exits_with_its_status() {
    let Some(_guard) = privileged("run_command") else {
        return;
    };
    let scratch = Scratch::new("run-cmd");
    let exe = udp_loop(&scratch);
    let exe = exe.to_str().unwrap();

    // The command itself: no period, so a late attach would miss the first
    // datagrams; its markers are found in the binary stopped after exec.
    let log = scratch.path("direct.log");
    let dir = scratch.path("direct");
    let out = xlap_run(&dir, &[exe, "47411", "300", "0", log.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stamped = points_by_seq(&dir);
    let logged = udp_loop_log(&log);
    assert_eq!(logged.len(), 300);
    for (seq, _) in &logged {
        let p = stamped
            .get(seq)
            .unwrap_or_else(|| panic!("seq {seq} not stamped"));
        for point in [
            "app.send_start",
            "sock.send_enter",
            "sock.recv_exit",
            "app.deliver",
        ] {
            assert!(p.contains(point), "seq {seq}: no {point}: {p:?}");
        }
    }
    let meta = run_meta(&dir);
    assert_eq!(meta["lost"], 0);
    assert_eq!(meta["stop_reason"], "targets exited");

    // Through a shell that starts the program and then fails: the child is
    // followed (kernel points), the run is written, the status is the
    // shell's.
    let log = scratch.path("shell.log");
    let dir = scratch.path("shell");
    let script = format!("{exe} 47412 200 100 {} && exit 3", log.display());
    let out = xlap_run(&dir, &["sh", "-c", &script]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stamped = points_by_seq(&dir);
    for (seq, _) in udp_loop_log(&log) {
        let p = stamped
            .get(&seq)
            .unwrap_or_else(|| panic!("shell: seq {seq} not stamped"));
        assert!(
            p.contains("sock.send_enter") && p.contains("sock.recv_exit"),
            "shell: seq {seq}: {p:?}"
        );
    }
    assert!(dir.join("run.json").exists());

    // A command that sends nothing: said so, its status kept.
    let dir = scratch.path("quiet");
    let out = xlap_run(&dir, &["sh", "-c", "exit 0"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no UDP datagram"), "{stderr}");

    // A command that cannot start: a usage error, nothing run.
    let out = xlap_run(&scratch.path("missing"), &["/nonexistent/command"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot start /nonexistent/command"),
        "{stderr}"
    );
}
