//! Privileged: `xlap-trace run -- CMD` starts a command, traces it from its
//! first datagram (markers included) and through the processes it starts,
//! and exits with its status; a program started through a shell, `env`,
//! `timeout` or a job script gets the markers it gets started directly, and
//! so do the markers of a library it loads with dlopen; checked against
//! the program's own log, through the analysis.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use xlap_tests::c_programs::{dlopen_peer, udp_loop, udp_loop_log};
use xlap_tests::trace::{analyze_rows, read_stamps, run_meta, SEQ_U64_LE};
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
    assert_eq!(meta.lost, 0);
    assert_eq!(meta.stop_reason, "targets exited");

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

/// `run` with the packets table and summary.json (correlated at the end).
fn xlap_run_whole(run_dir: &Path, command: &[&str]) -> Output {
    Command::new(bin("xlap-trace"))
        .args(["run", "--quiet", "-o"])
        .arg(run_dir)
        .args(SEQ_U64_LE)
        .arg("--")
        .args(command)
        .output()
        .expect("xlap-trace run")
}

#[test]
fn markers_follow_every_way_a_job_starts_a_program() {
    let Some(_guard) = privileged("run_command") else {
        return;
    };
    let scratch = Scratch::new("run-shapes");
    let exe = udp_loop(&scratch);
    let exe = exe.to_str().unwrap().to_string();
    const COUNT: usize = 300;
    let mut failures = Vec::new();
    for (i, shape) in [
        "direct",
        "sh -c",
        "env",
        "timeout",
        "bash job.sh",
        "sh -c, bash -c, timeout, env",
    ]
    .iter()
    .enumerate()
    {
        let port = (47420 + i).to_string();
        let log = scratch.path(&format!("shape{i}.log"));
        let program = format!("{exe} {port} {COUNT} 0 {}", log.display());
        let script = scratch.path(&format!("job{i}.sh"));
        std::fs::write(
            &script,
            format!("#!/bin/bash\necho job starts\n{program}\necho job ends\n"),
        )
        .unwrap();
        let command: Vec<String> = match *shape {
            "direct" => program.split(' ').map(String::from).collect(),
            "sh -c" => vec!["sh".into(), "-c".into(), program.clone()],
            "env" => ["env", "XLAP_SHAPE=env"]
                .iter()
                .map(|s| s.to_string())
                .chain(program.split(' ').map(String::from))
                .collect(),
            "timeout" => ["timeout", "120"]
                .iter()
                .map(|s| s.to_string())
                .chain(program.split(' ').map(String::from))
                .collect(),
            "bash job.sh" => vec!["bash".into(), script.display().to_string()],
            _ => vec![
                "sh".into(),
                "-c".into(),
                format!("bash -c 'timeout 120 env XLAP_SHAPE=nested {program}'"),
            ],
        };
        let dir = scratch.path(&format!("shape{i}"));
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        let out = xlap_run_whole(&dir, &args);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        if !out.status.success() {
            failures.push(format!("{shape}: exit {:?}: {stderr}", out.status.code()));
            continue;
        }
        // Against the program's own log: every datagram it received has
        // its markers and the socket points.
        let logged = udp_loop_log(&log);
        assert_eq!(logged.len(), COUNT, "{shape}: the program's log");
        let stamped = points_by_seq(&dir);
        let mut missing: BTreeMap<&str, usize> = BTreeMap::new();
        for (seq, _) in &logged {
            let p = stamped.get(seq).cloned().unwrap_or_default();
            for point in [
                "app.send_start",
                "app.submit",
                "app.deliver",
                "sock.send_enter",
                "sock.recv_exit",
            ] {
                if !p.contains(point) {
                    *missing.entry(point).or_default() += 1;
                }
            }
        }
        if !missing.is_empty() {
            failures.push(format!(
                "{shape}: of {COUNT} datagrams the program logged, missing {missing:?}"
            ));
        }
        let meta = run_meta(&dir);
        let holds = &meta.holds;
        if holds.as_ref().is_none_or(|h| h.not_stopped != 0) {
            failures.push(format!("{shape}: holds {holds:?}"));
        }
        if *shape != "direct" && holds.as_ref().map_or(0, |h| h.at_exec) == 0 {
            failures.push(format!(
                "{shape}: the program's exec was not held: {holds:?}"
            ));
        }
        // Through the analysis: its packet count is the program's, and the
        // marker's stage is there for every packet.
        let rows = analyze_rows(&dir, "summary", &[]);
        let run_row = rows.iter().find(|r| r["section"] == "run");
        if run_row.and_then(|r| r["packets"].as_u64()) != Some(COUNT as u64) {
            failures.push(format!("{shape}: analyze: {run_row:?}, the log: {COUNT}"));
        }
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
        let app_stage = summary["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == "app_send_start__sock_send_enter");
        if app_stage.and_then(|s| s["packets"].as_u64()) != Some(COUNT as u64) {
            failures.push(format!(
                "{shape}: summary.json app_send_start__sock_send_enter: {app_stage:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn markers_of_a_library_loaded_later_are_traced() {
    let Some(_guard) = privileged("run_command") else {
        return;
    };
    let scratch = Scratch::new("run-dlopen");
    let (exe, plugin) = dlopen_peer(&scratch);
    let log = scratch.path("dlopen.log");
    let dir = scratch.path("run");
    let out = xlap_run(
        &dir,
        &[
            exe.to_str().unwrap(),
            plugin.to_str().unwrap(),
            "47430",
            "300",
            log.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let received: Vec<u64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(received.len(), 300, "the program's log");
    let stamped = points_by_seq(&dir);
    let without: Vec<&u64> = received
        .iter()
        .filter(|seq| {
            !stamped
                .get(seq)
                .is_some_and(|p| p.contains("app.plugin_send"))
        })
        .collect();
    assert!(
        without.is_empty(),
        "{} of 300 datagrams have no app.plugin_send (the plugin's marker): {without:?}",
        without.len()
    );
    let meta = run_meta(&dir);
    let sites = &meta.options.usdt_sites;
    assert!(
        sites
            .iter()
            .any(|s| s.file.to_str().unwrap().ends_with("/libplugin.so")),
        "{sites:?}"
    );
    assert!(meta.holds.as_ref().expect("holds").at_loader >= 1);
}
