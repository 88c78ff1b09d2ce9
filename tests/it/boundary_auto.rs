//! Privileged: `--boundary auto` against the kernel's own
//! account of what is attached (bpftool) and the program's log. It stamps
//! at the socket calls and leaves the machine's syscalls alone (no program
//! on sys_enter or sys_exit) while no traced UDP socket is connected; a
//! connect holds the process until the send syscalls' entry is hooked,
//! so that every datagram of the connected socket has its send_enter; a
//! socket connected before the recorder started hooks it at the start.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use xlap_tests::trace::{read_stamps, run_meta, Recorder, SEQ_U64_LE};
use xlap_tests::{bin, privileged, KillOnDrop, Scratch};

const SCRIPT: &str = "python/boundary_phases.py";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(SCRIPT)
}

fn touch(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), b"").unwrap();
}

fn wait_for(dir: &Path, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join(name).exists() {
        assert!(
            Instant::now() < deadline,
            "the program wrote no {name} in 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The programs with a link in the kernel now, by name (bpftool: the
/// kernel's own list, not the recorder's).
fn linked_programs() -> BTreeSet<String> {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = Command::new("bpftool")
            .args(args)
            .output()
            .expect("bpftool (./run.sh setup installs it)");
        serde_json::from_slice(&out.stdout).expect("bpftool JSON")
    };
    let names: BTreeMap<u64, String> = json(&["-j", "prog", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str()?.to_string())))
        .collect();
    json(&["-j", "link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| names.get(&l["prog_id"].as_u64()?).cloned())
        .collect()
}

const SYSCALL_PROGRAMS: [&str; 3] = ["on_send_syscall", "on_sys_enter", "on_sys_exit"];

/// Every datagram the program logged as sent has its send points, every
/// one it read its receive point: the missing ones.
fn missing_points(dir: &Path, run: &Path) -> Vec<String> {
    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    let mut stamped: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for row in read_stamps(&run.join("stamps.parquet")) {
        if let Some(seq) = row.seq {
            stamped.entry(seq).or_default().insert(row.point);
        }
    }
    let mut missing = Vec::new();
    for line in log.lines() {
        let (what, seq) = line.split_once(' ').unwrap();
        let seq: u64 = seq.parse().unwrap();
        let points: &[&str] = if what == "sent" {
            &["sock.send_enter", "sock.send_exit"]
        } else {
            &["sock.recv_exit"]
        };
        for p in points {
            if !stamped.get(&seq).is_some_and(|s| s.contains(*p)) {
                missing.push(format!("seq {seq}: {p}"));
            }
        }
    }
    missing
}

#[test]
fn auto_hooks_the_send_syscalls_only_once_a_traced_socket_connects() {
    let Some(_guard) = privileged("boundary_auto") else {
        return;
    };
    let scratch = Scratch::new("boundary-auto-connect");
    let dir = scratch.path("prog");
    std::fs::create_dir_all(&dir).unwrap();
    touch(&dir, "start");
    let run = scratch.path("run");
    // Not killed on a failure: the program exits by itself within a minute
    // when no file comes, and the run with it.
    let child = Command::new(bin("xlap-trace"))
        .args(["run", "--no-correlate", "-o"])
        .arg(&run)
        .args(SEQ_U64_LE)
        .args(["--boundary", "auto", "--", "python3"])
        .arg(script())
        .arg(&dir)
        .arg("200")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xlap-trace run");
    // Phase 1, sends that name their destination: the socket calls alone.
    wait_for(&dir, "phase1");
    let linked = linked_programs();
    assert!(
        linked.contains("on_sock_send_length"),
        "the capture's own links are not seen: {linked:?}"
    );
    for p in SYSCALL_PROGRAMS {
        assert!(
            !linked.contains(p),
            "{p} attached before any connect: {linked:?}"
        );
    }
    // Phase 2, a connected socket: its connect hooked the send syscalls.
    touch(&dir, "go");
    wait_for(&dir, "done");
    let linked = linked_programs();
    assert!(linked.contains("on_send_syscall"), "{linked:?}");
    assert!(
        !linked.contains("on_sys_exit") && !linked.contains("on_sys_enter"),
        "{linked:?}"
    );
    touch(&dir, "end");
    let out = child.wait_with_output().expect("wait for xlap-trace run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = run_meta(&run);
    let boundary = meta.options.boundary.clone().unwrap_or_default();
    assert!(
        boundary.starts_with("auto (socket calls; the send syscalls' entry from")
            && boundary.contains("connected a traced UDP socket"),
        "{boundary}"
    );
    let holds = meta.holds.clone().expect("holds");
    assert_eq!((holds.at_connect, holds.not_stopped), (1, 0), "{holds:?}");
    let missing = missing_points(&dir, &run);
    assert!(
        missing.is_empty(),
        "{} missing: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

#[test]
fn a_socket_connected_before_the_recorder_hooks_the_send_syscalls_at_once() {
    let Some(_guard) = privileged("boundary_auto") else {
        return;
    };
    let scratch = Scratch::new("boundary-auto-before");
    let dir = scratch.path("prog");
    std::fs::create_dir_all(&dir).unwrap();
    let program = KillOnDrop(
        Command::new("python3")
            .arg(script())
            .arg(&dir)
            .arg("100")
            .arg("--connect-first")
            .spawn()
            .expect("python3"),
    );
    // The socket exists and is connected before the recorder starts.
    std::thread::sleep(Duration::from_millis(300));
    let run = scratch.path("run");
    let rec = Recorder::start(
        &[program.0.id()],
        &run,
        &[SEQ_U64_LE, &["--boundary", "auto"]].concat(),
    );
    let boundary = run_meta(&run).options.boundary.unwrap_or_default();
    assert!(
        boundary.contains("was connected before it was traced"),
        "{boundary}"
    );
    assert!(linked_programs().contains("on_send_syscall"));
    touch(&dir, "start");
    wait_for(&dir, "phase1");
    touch(&dir, "go");
    wait_for(&dir, "done");
    touch(&dir, "end");
    let meta = rec.meta_after_wait();
    assert_eq!(meta.holds.map_or(0, |h| h.at_connect), 0);
    let missing = missing_points(&dir, &run);
    assert!(
        missing.is_empty(),
        "{} missing: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}
