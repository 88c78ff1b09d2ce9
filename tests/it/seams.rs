//! Privileged: the seams a newcomer crosses with a program of their own,
//! each checked against the program's own log.
//!
//! - A kind-less layout (`--seq-*` only, docs/usage.md's way for third-party
//!   programs) from a socket created before tracing began and bound only by
//!   its first send: every datagram the program received carries the send
//!   and receive points from the first one, and `analyze`, `report` and
//!   `summary.json` show its packets as one kind (`kind all`).
//! - A stamps.parquet cut short: exit 6, naming the way back (`recover`).
//! - A layout that keys nothing: said while recording, exit 2 at the end.
//! - A target without any socket: said at start, exit 7 when it never
//!   opens one.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use xlap_tests::trace::{read_stamps, Recorder, SEQ_U64_LE};
use xlap_tests::{bin, privileged, wait_for_file, KillOnDrop, Scratch};

/// One process, two sockets on loopback: `tx` made (not bound) at start,
/// then COUNT datagrams of 64 bytes (u64 LE seq first) to `rx` once the
/// gate file exists, each read back; the seqs read go to the log.
const PROGRAM: &str = r#"
import os, socket, sys, time
gate, ready, log, port, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", port))
rx.settimeout(2.0)
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)   # bound by its first send
open(ready, "w").write("ready")
while not os.path.exists(gate):
    time.sleep(0.01)
got = []
for seq in range(count):
    tx.sendto(seq.to_bytes(8, "little") + bytes(56), ("127.0.0.1", port))
    try:
        data = rx.recv(2048)
        got.append(int.from_bytes(data[:8], "little"))
    except socket.timeout:
        pass
    time.sleep(0.0002)
with open(log, "w") as f:
    f.write("\n".join(map(str, got)) + "\n")
"#;

const COUNT: usize = 3000;

struct Program {
    child: KillOnDrop,
    gate: std::path::PathBuf,
    log: std::path::PathBuf,
}

fn start_program(scratch: &Scratch, name: &str, port: u16) -> Program {
    let (gate, ready, log) = (
        scratch.path(&format!("{name}.gate")),
        scratch.path(&format!("{name}.ready")),
        scratch.path(&format!("{name}.log")),
    );
    let child = KillOnDrop(
        Command::new("python3")
            .args(["-c", PROGRAM])
            .arg(&gate)
            .arg(&ready)
            .arg(&log)
            .args([port.to_string(), COUNT.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .expect("python3"),
    );
    wait_for_file(&ready, 20);
    Program { child, gate, log }
}

impl Program {
    /// Opens the gate, waits for the program; the seqs it read.
    fn run(mut self) -> BTreeSet<u64> {
        std::fs::write(&self.gate, "go").unwrap();
        assert!(self.child.0.wait().unwrap().success(), "the program failed");
        std::fs::read_to_string(&self.log)
            .expect("the program's log")
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.parse().unwrap())
            .collect()
    }
}

fn xlap(args: &[&str], dir: &Path) -> Output {
    Command::new(bin("xlap-trace"))
        .args(&args[..1])
        .arg(dir)
        .args(&args[1..])
        .output()
        .expect("xlap-trace")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_kindless_program_from_a_socket_made_before_tracing_analyses_end_to_end() {
    let Some(_guard) = privileged("seams_kindless") else {
        return;
    };
    let scratch = Scratch::new("seams-kindless");
    let program = start_program(&scratch, "p", 47450);
    let dir = scratch.path("run");
    let rec = Recorder::start(
        &[program.child.0.id()],
        &dir,
        &[SEQ_U64_LE, &["--no-usdt"]].concat(),
    );
    let received = program.run();
    rec.wait();
    assert!(
        received.len() > COUNT * 9 / 10,
        "the program read {} of {COUNT}",
        received.len()
    );

    // Every datagram the program read, at every socket point, from the
    // first (the sending socket existed, unbound, before tracing began).
    let rows = read_stamps(&dir.join("stamps.parquet"));
    for point in [
        "sock.send_enter",
        "sock.send_exit",
        "sock.queue",
        "sock.recv_exit",
    ] {
        let stamped: BTreeSet<u64> = rows
            .iter()
            .filter(|r| r.point == point && !r.fragment)
            .filter_map(|r| r.seq)
            .collect();
        let missing: Vec<&u64> = received.difference(&stamped).take(10).collect();
        assert!(
            missing.is_empty(),
            "{point}: {} of the {} datagrams the program read have no stamp, e.g. {missing:?}",
            received.difference(&stamped).count(),
            received.len()
        );
        assert!(rows
            .iter()
            .filter(|r| r.point == point)
            .all(|r| r.kind.is_none()));
    }

    // The analysis: one kind, `all`, with the program's packets.
    let analyze = xlap(&["analyze", "-q", "summary", "-f", "json", "--quiet"], &dir);
    assert!(analyze.status.success(), "analyze: {}", text(&analyze));
    let summary: serde_json::Value = serde_json::from_slice(&analyze.stdout).expect("JSON");
    let run_row = summary["summary"]
        .as_array()
        .expect("summary rows")
        .iter()
        .find(|r| r["section"] == "run")
        .cloned()
        .expect("the run row");
    assert_eq!(run_row["name"], "kind all", "{run_row}");
    let packets = run_row["packets"].as_u64().unwrap() as usize;
    assert!(
        packets >= received.len() && packets <= COUNT,
        "analyze counts {packets} packets; the program sent {COUNT} and read {}",
        received.len()
    );
    let jitter = xlap(&["analyze", "-q", "jitter", "--quiet"], &dir);
    assert!(jitter.status.success(), "{}", text(&jitter));
    let table = String::from_utf8_lossy(&jitter.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("e2e") && l.contains(" all ")),
        "the jitter table names the kind `all`:\n{table}"
    );
    let html = scratch.path("report.html");
    let report = xlap(&["report", "-o", html.to_str().unwrap()], &dir);
    assert!(report.status.success(), "report: {}", text(&report));
    assert!(std::fs::read_to_string(&html).unwrap().contains("kind all"));
    let summary_json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("summary.json")).expect("summary.json"),
    )
    .expect("summary.json is JSON");
    assert!(
        summary_json["stages"]
            .as_array()
            .is_some_and(|s| !s.is_empty()),
        "summary.json has no stage: {summary_json}"
    );

    // A stamps.parquet cut short: bad input, with the way back.
    let cut = scratch.path("cut");
    std::fs::create_dir_all(&cut).unwrap();
    for f in ["run.json", "stamps.arrows"] {
        std::fs::copy(dir.join(f), cut.join(f)).unwrap();
    }
    let whole = std::fs::read(dir.join("stamps.parquet")).unwrap();
    std::fs::write(cut.join("stamps.parquet"), &whole[..whole.len() / 2]).unwrap();
    let refused = xlap(&["analyze", "--quiet"], &cut);
    assert_eq!(refused.status.code(), Some(6), "{}", text(&refused));
    assert!(text(&refused).contains("recover"), "{}", text(&refused));
}

#[test]
fn a_layout_that_keys_nothing_is_said_while_recording_and_fails_the_run() {
    let Some(_guard) = privileged("seams_layout") else {
        return;
    };
    let scratch = Scratch::new("seams-layout");
    let program = start_program(&scratch, "p", 47451);
    let dir = scratch.path("run");
    let rec = Recorder::start(
        &[program.child.0.id()],
        &dir,
        &["--seq-offset", "5000", "--seq-size", "4", "--no-usdt"],
    );
    let received = program.run();
    assert!(!received.is_empty());
    let out = rec.child.wait_with_output().expect("the recorder");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let warned = err
        .lines()
        .position(|l| l.contains("none with a sequence number where the layout says"))
        .unwrap_or_else(|| panic!("no layout warning:\n{err}"));
    // Said while the datagrams flowed: before the run's closing table.
    let closing = err
        .lines()
        .position(|l| l.starts_with("run "))
        .unwrap_or(usize::MAX);
    assert!(warned < closing, "{err}");
}

#[test]
fn a_target_without_a_socket_is_said_at_start_and_ends_with_exit_7() {
    let Some(_guard) = privileged("seams_no_socket") else {
        return;
    };
    let scratch = Scratch::new("seams-no-socket");
    let sleeper = KillOnDrop(Command::new("sleep").arg("1.5").spawn().expect("sleep"));
    let rec = Recorder::start(&[sleeper.0.id()], &scratch.path("run"), &["--no-usdt"]);
    let out = rec.child.wait_with_output().expect("the recorder");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no UDP socket yet"), "{err}");
    assert_eq!(out.status.code(), Some(7), "{err}");
}
