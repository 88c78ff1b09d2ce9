//! Privileged: a recorder killed with SIGKILL mid-run leaves a run that the
//! analysis commands recover by themselves (run.json said `running` since
//! the probes were attached), with every datagram the protocol's own log
//! sent before the last second, no stamp after the kill, and no BPF program
//! left in the kernel; a CPU that never goes idle does not keep the last
//! stamps in its batch (they are exported on a timer), checked against a
//! sender's own list of what it sent. The marker rings the dead recorder
//! left in /dev/shm are removed by the recovery.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;
use xlap_records::run_meta::RunState;
use xlap_stage::Stage;
use xlap_tests::example::{ExampleOptions, ProtocolRun};
use xlap_tests::multiset::logged_where;
use xlap_tests::trace::{read_stamps, run_meta, Recorder, SEQ_U64_LE};
use xlap_tests::{bin, monotonic_ns, privileged, KillOnDrop, Scratch};

/// Ids of the BPF programs loaded now whose names are the capture's.
fn capture_programs() -> BTreeSet<u64> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .expect("bpftool (./run.sh setup installs it)");
    assert!(out.status.success(), "bpftool prog show failed");
    let progs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    progs
        .as_array()
        .expect("a list")
        .iter()
        .filter(|p| {
            let name = p["name"].as_str().unwrap_or_default();
            [
                "on_sys_enter",
                // Both boundaries attach it (bpftool gives the full name
                // from BTF, or the kernel's 15 characters).
                "on_sock_recv_length",
                "on_sock_recv_le",
                "on_net_dev_queue",
                "on_net_dev_queu",
                "on_flush_timer",
            ]
            .contains(&name)
        })
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

/// The marker ring files of the recorder `pid` in /dev/shm.
fn rings_of(pid: u32) -> Vec<String> {
    let prefix = format!("xlap-trace.{pid}.");
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// SIGKILL, then wait for the recorder's end: it must not exit cleanly.
fn kill_hard(rec: Recorder) -> i64 {
    let mut child = rec.child;
    let killed_at = monotonic_ns();
    child.kill().expect("SIGKILL the recorder");
    let status = child.wait().expect("wait for the recorder");
    assert!(!status.success(), "the recorder ended cleanly: {status}");
    killed_at
}

#[test]
fn a_recorder_killed_mid_run_leaves_a_run_the_analysis_recovers() {
    let Some(_guard) = privileged("crash_recovery") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("crash-recovery");
    let before = capture_programs();
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: 4000,
            period_us: 1000,
            gated: true,
            markers: true,
            ..Default::default()
        },
    );
    let pids = run.pids();
    let dir = scratch.path("run");
    let rec = Recorder::start(&[pids.0, pids.1], &dir, &[]);
    // run.json exists from the start, and says whose run it is.
    let meta = run_meta(&dir);
    assert_eq!(meta.state, RunState::Running);
    assert_eq!(meta.recorder.as_ref().map(|r| r.pid), Some(rec.child.id()));
    run.start();
    std::thread::sleep(Duration::from_millis(2500));
    let during = capture_programs();
    assert!(
        during.difference(&before).count() >= 3,
        "the capture's programs while it runs: {during:?}"
    );
    // While it records, reading the run is refused, saying why.
    let out = Command::new(bin("xlap-trace"))
        .arg("analyze")
        .arg(&dir)
        .args(["-q", "summary", "--quiet"])
        .output()
        .expect("xlap-trace analyze");
    assert_eq!(out.status.code(), Some(6), "analyze of a live run");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("still being recorded"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let recorder = rec.child.id();
    let killed_at = kill_hard(rec);
    let (sent, _received) = run.wait();
    // The dead recorder's marker rings (one per process with markers) are
    // still in /dev/shm: memory, until someone removes them.
    assert_eq!(rings_of(recorder).len(), 2, "the rings left by the kill");

    // The kernel freed every program of the dead recorder.
    let mut left: Vec<u64> = Vec::new();
    for _ in 0..100 {
        left = capture_programs().difference(&before).copied().collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(left.is_empty(), "BPF programs left behind: {left:?}");

    let meta = run_meta(&dir);
    assert_eq!(
        meta.state,
        RunState::Running,
        "the dead recorder's run.json"
    );
    assert!(meta.checkpoint.as_ref().unwrap().streamed_stamps > 0);
    assert!(!dir.join("stamps.parquet").exists());

    // The analysis recovers it by itself and says so.
    let out = Command::new(bin("xlap-trace"))
        .arg("analyze")
        .arg(&dir)
        .args(["-q", "summary", "-f", "json", "--quiet"])
        .output()
        .expect("xlap-trace analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "analyze of a crashed run: {stderr}");
    assert!(stderr.contains("recovered"), "says it recovered: {stderr}");
    let meta = run_meta(&dir);
    assert_eq!(meta.state, RunState::Recovered);
    assert_eq!(meta.stop_reason, "recorder died");
    let left = rings_of(recorder);
    assert!(left.is_empty(), "rings left after the recovery: {left:?}");

    // Against the sender's own log: every datagram it sent more than a
    // second before the kill (the stream is written every 0.5 s, batches
    // exported every 0.1 s) has its send stamp; no stamp is later than
    // the kill; the counts in run.json are the file's.
    let rows = read_stamps(&dir.join("stamps.parquet"));
    assert_eq!(meta.stamps, rows.len() as u64);
    let latest = rows.iter().map(|r| r.ts_ns).max().expect("stamps");
    assert!(latest <= killed_at, "a stamp after the kill");
    let stamped: BTreeSet<(u64, u32)> = rows
        .iter()
        .filter(|r| r.point == "sock.send_enter" && r.pid == pids.0)
        .filter_map(|r| Some((r.seq?, r.kind?)))
        .collect();
    let expected = logged_where(&sent, "sent", |e| {
        e["t_ns"]
            .as_i64()
            .is_some_and(|t| t < killed_at - 1_000_000_000)
    });
    assert!(
        expected.len() > 1000,
        "sent before the kill: {}",
        expected.len()
    );
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !stamped.contains(k))
        .take(20)
        .collect();
    assert!(missing.is_empty(), "sent, not recovered: {missing:?}");
    let after_kill = sent
        .iter()
        .filter(|e| e["event"] == "sent" && e["t_ns"].as_i64().is_some_and(|t| t > killed_at))
        .count();
    assert!(after_kill > 500, "the protocol went on after the kill");

    // And the packets table pairs both ends of what was recovered.
    let out = Command::new(bin("xlap-trace"))
        .arg("correlate")
        .arg(&dir)
        .arg("-o")
        .arg(scratch.path("packets.parquet"))
        .args(["--json"])
        .output()
        .expect("xlap-trace correlate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(c["packets"].as_u64().unwrap() as usize >= expected.len());

    // A second recovery has nothing to do.
    let out = Command::new(bin("xlap-trace"))
        .arg("recover")
        .arg(&dir)
        .output()
        .expect("xlap-trace recover");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to recover"));
}

/// A sender pinned to a CPU that a spinning process keeps busy: after its
/// last datagram the CPU never goes idle and no later stamp comes, so only
/// the timer export takes the CPU's last batch to the stream before the
/// recorder dies.
#[test]
fn a_busy_cpu_does_not_keep_the_last_stamps_from_a_crashed_run() {
    let Some(_guard) = privileged("crash_recovery_busy_cpu") else {
        return;
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(cpus >= 2, "needs two CPUs (one to keep busy)");
    let cpu = (cpus - 1).to_string();
    let scratch = Scratch::new("crash-busy-cpu");
    let gate = scratch.path("gate");
    let log = scratch.path("sent.log");
    let spinner = KillOnDrop(
        Command::new("taskset")
            .args(["-c", &cpu, "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("taskset"),
    );
    // A third-party-style program: 8-byte little-endian seq, 40 bytes.
    let script = r#"
import os, socket, struct, sys, time
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); tx.connect(rx.getsockname())
while not os.path.exists(sys.argv[1]): time.sleep(0.005)
with open(sys.argv[2], "w") as log:
    for seq in range(40):
        tx.send(struct.pack("<Q", seq) + bytes(32))
        rx.recv(64)
        log.write("%d\n" % seq)
    log.write("done\n")
time.sleep(60)
"#;
    let sender = KillOnDrop(
        Command::new("taskset")
            .args(["-c", &cpu, "python3", "-c", script])
            .arg(&gate)
            .arg(&log)
            .stdin(Stdio::null())
            .spawn()
            .expect("python3"),
    );
    let dir = scratch.path("run");
    let rec = Recorder::start(
        &[sender.0.id()],
        &dir,
        &[SEQ_U64_LE, &["--no-usdt"]].concat(),
    );
    std::fs::write(&gate, "go").unwrap();
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("done")
    {
        assert!(start.elapsed().as_secs() < 30, "the sender did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Longer than the stream's flush (0.5 s) and the batch export (0.1 s).
    std::thread::sleep(Duration::from_millis(1200));
    kill_hard(rec);
    drop(sender);
    drop(spinner);
    let out = Command::new(bin("xlap-trace"))
        .arg("recover")
        .arg(&dir)
        .output()
        .expect("xlap-trace recover");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: BTreeSet<u64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    assert_eq!(sent.len(), 40);
    let rows = read_stamps(&dir.join("stamps.parquet"));
    for point in ["sock.send_enter", "sock.recv_exit"] {
        let stamped: BTreeSet<u64> = rows
            .iter()
            .filter(|r| r.point == point)
            .filter_map(|r| r.seq)
            .collect();
        let missing: Vec<_> = sent.difference(&stamped).collect();
        assert!(
            missing.is_empty(),
            "{point}: sent, not recovered: {missing:?}"
        );
    }
}
