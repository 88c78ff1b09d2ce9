//! Privileged: a send whose thread moves to another CPU inside the call
//! keeps its send_enter at the socket calls (`--boundary socket-calls`
//! and `auto`, with and without sock.send_exit). The start of a send that names its destination is noted
//! as the call begins (cgroup sendmsg4); a thread that sleeps there for
//! send buffer wakes on another CPU, where a note kept per CPU is not.
//! Checked against the program's own log of its sends and of the CPU it
//! ran on before and after each.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use xlap_stage::{Qdisc, Stage, StageConfig};
use xlap_tests::trace::{read_stamps, Recorder, SEQ_U64_LE};
use xlap_tests::{privileged, KillOnDrop, Scratch};

const COUNT: u64 = 1500;
const PORT: u16 = 9700;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/moved_sender.py")
}

/// One run at `boundary` (and `points`, "" for every point): every send
/// the program logged has its send_enter, while many began on one CPU and
/// returned on another.
fn moved_sends_keep_their_start(boundary: &str, points: &str) {
    // Slower than the sender: 1500 datagrams of 1 KB take 1.5 s at 8 Mbit/s,
    // the socket's two-datagram buffer full all along.
    let stage = Stage::build(&StageConfig {
        hosts: 2,
        qdiscs: vec![Some(Qdisc::parse("tbf:8mbit:16kb:50ms").unwrap()), None],
        ..Default::default()
    })
    .expect("stage");
    let scratch = Scratch::new(&format!("moved-{boundary}{points}"));
    let dir = scratch.path("prog");
    std::fs::create_dir_all(&dir).unwrap();
    let receiver = stage.host(1).addr(false).to_string();
    let child = stage
        .host(0)
        .command("python3")
        .arg(script())
        .arg(&dir)
        .arg(&receiver)
        .arg(PORT.to_string())
        .arg(COUNT.to_string())
        // The recorder's start (XLAP_TEST_START_SECS), and then some.
        .arg((xlap_tests::start_secs() + 30).to_string())
        .stdin(Stdio::null())
        .spawn()
        .expect("python3");
    let mut program = KillOnDrop(child);
    let run = scratch.path("run");
    let mut args = [SEQ_U64_LE, &["--boundary", boundary]].concat();
    if !points.is_empty() {
        args.extend(["--points", points]);
    }
    let rec = Recorder::start(&[program.0.id()], &run, &args);
    std::fs::write(dir.join("start"), b"").unwrap();
    let status = program.0.wait().expect("wait for the sender");
    assert!(status.success(), "moved_sender.py: {status}");
    let meta = rec.meta_after_wait();

    let log = std::fs::read_to_string(dir.join("log")).expect("the sender's log");
    let mut sent = Vec::new();
    let mut moved = 0;
    for line in log.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 4, "log line {line:?}");
        sent.push(f[1].parse::<u64>().unwrap());
        moved += usize::from(f[2] != f[3]);
    }
    assert_eq!(sent.len() as u64, COUNT, "the sender logged every send");
    // Without moves the test checks nothing: the mover thread must have
    // taken sends to the other CPU (here most of them move).
    assert!(
        moved >= 20,
        "only {moved} of {COUNT} sends returned on another CPU"
    );

    let mut enter = std::collections::BTreeSet::new();
    let mut exit = std::collections::BTreeSet::new();
    for row in read_stamps(&run.join("stamps.parquet")) {
        match (row.point.as_str(), row.seq) {
            ("sock.send_enter", Some(seq)) => enter.insert(seq),
            ("sock.send_exit", Some(seq)) => exit.insert(seq),
            _ => false,
        };
    }
    let without: Vec<u64> = sent
        .iter()
        .filter(|s| !enter.contains(s))
        .copied()
        .collect();
    assert!(
        without.is_empty(),
        "{boundary} {points}: {} of {COUNT} sends ({moved} moved) without send_enter, e.g. {:?}; run.json: {:?}",
        without.len(),
        &without[..without.len().min(10)],
        meta.points.get("sock.send_enter")
    );
    assert!(
        points == "minimal" || sent.iter().all(|s| exit.contains(s)),
        "{boundary}: sends without send_exit"
    );
    assert_eq!(meta.lost, 0, "{boundary}: {:?}", meta.points);
}

#[test]
fn a_send_moved_to_another_cpu_inside_the_call_keeps_its_send_enter() {
    let Some(_guard) = privileged("moved_senders") else {
        return;
    };
    moved_sends_keep_their_start("socket-calls", "");
    moved_sends_keep_their_start("auto", "");
    // Without sock.send_exit no hook runs as the call returns: the first
    // device point takes the start.
    moved_sends_keep_their_start("auto", "minimal");
}
