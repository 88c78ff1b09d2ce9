//! Privileged: a UDP sender and receiver that use only io_uring
//! (IORING_OP_SEND and IORING_OP_SEND_ZC; IORING_OP_RECV on a connected
//! socket, IORING_OP_RECVMSG on an unconnected one), checked against their own logs: every datagram
//! at its send points, its device points and its read, the reads joined to
//! their flow through the socket, the receiver's wake-ups in
//! io_uring_enter.

use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Stdio;
use xlap_records::run_meta::RunMeta;
use xlap_stage::Stage;
use xlap_tests::example::events;
use xlap_tests::trace::{degraded, is_traced, read_stamps, run_meta, Recorder, Row};
use xlap_tests::{bin, privileged, read_jsonl, wait_for_file, KillOnDrop, Scratch};

fn seqs(log: &[Value], event: &str) -> BTreeSet<u64> {
    events(log, event)
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

fn stamped(rows: &[Row], point: &str, pid: u32) -> BTreeSet<u64> {
    rows.iter()
        .filter(|r| r.point == point && r.pid == pid && r.kind == Some(1))
        .filter_map(|r| r.seq)
        .collect()
}

/// Whether the run stamped `point` for io_uring requests: a kernel whose
/// io_uring tracepoints differ leaves the requests' own points out
/// (run.json's `degraded_points` says so) but not the device, queue and
/// wake-up points.
fn uring_traced(meta: &RunMeta, point: &str) -> bool {
    let partial = meta
        .degraded_points
        .get(point)
        .is_some_and(|why| why.contains("io_uring"));
    if partial {
        eprintln!("{point} misses io_uring requests on this kernel: its checks are left out");
    }
    is_traced(meta, point) && !partial
}

/// One run: (sender log, receiver log, stamps, sender pid, receiver pid,
/// run.json).
fn run(
    stage: &Stage,
    send_op: &str,
    mode: &str,
    connect: bool,
    record_args: &[&str],
) -> (Vec<Value>, Vec<Value>, Vec<Row>, u32, u32, RunMeta) {
    let (a, b) = (stage.host(0), stage.host(1));
    let scratch = Scratch::new(&format!("uring-{send_op}-{mode}"));
    let peer = bin("xlap-uring-peer");
    let (local, dest) = (format!("{}:9601", a.ipv4), format!("{}:9600", b.ipv4));
    let (ready, start) = (scratch.path("ready"), scratch.path("start"));
    let (slog, rlog) = (scratch.path("send.jsonl"), scratch.path("recv.jsonl"));
    let receiver = KillOnDrop(
        b.command(&peer)
            .args(["recv", &dest, if connect { &local } else { "-" }, "400"])
            .arg(&rlog)
            .arg(&ready)
            .arg(mode)
            .stdin(Stdio::null())
            .spawn()
            .expect("receiver"),
    );
    wait_for_file(&ready, 20);
    let sender = KillOnDrop(
        a.command(&peer)
            .args(["send", &local, &dest, "400", "200"])
            .arg(&slog)
            .arg(&start)
            .arg(send_op)
            .stdin(Stdio::null())
            .spawn()
            .expect("sender"),
    );
    let pids = (sender.0.id(), receiver.0.id());
    let rec = Recorder::start(&[pids.0, pids.1], &scratch.path("run"), record_args);
    std::fs::write(&start, "go").unwrap();
    for mut p in [sender, receiver] {
        assert!(p.0.wait().unwrap().success(), "an io_uring peer failed");
    }
    let dir = rec.dir.clone();
    rec.wait();
    (
        read_jsonl(&slog),
        read_jsonl(&rlog),
        read_stamps(&dir.join("stamps.parquet")),
        pids.0,
        pids.1,
        run_meta(&dir),
    )
}

#[test]
fn io_uring_sends_and_receives_are_stamped_per_datagram() {
    let Some(_guard) = privileged("io_uring") else {
        return;
    };
    check_io_uring(&[]);
}

/// The same at the socket calls (`--boundary socket-calls`): a receive
/// request's read is stamped by its socket call, a send request still from
/// its submission (not twice: its socket call is the request's).
#[test]
fn io_uring_at_the_socket_calls_is_stamped_per_datagram() {
    let Some(_guard) = privileged("io_uring") else {
        return;
    };
    check_io_uring(&["--boundary", "socket-calls"]);
}

fn check_io_uring(record_args: &[&str]) {
    let stage = Stage::two_hosts().expect("stage");
    for (send_op, mode, connect) in [("send", "recv", true), ("send_zc", "recvmsg", false)] {
        let (sent, received, rows, sender, receiver, meta) =
            run(&stage, send_op, mode, connect, record_args);
        // One stamp per datagram and point: none twice.
        for point in ["sock.send_enter", "sock.send_exit", "sock.recv_exit"] {
            let all = rows
                .iter()
                .filter(|r| r.point == point && r.kind == Some(1))
                .count();
            let distinct =
                stamped(&rows, point, sender).len() + stamped(&rows, point, receiver).len();
            assert_eq!(
                all, distinct,
                "{send_op}/{mode}: {point} stamped twice for some datagram"
            );
        }
        let mode = format!("{send_op}/{mode}");
        let (sent, received) = (seqs(&sent, "sent"), seqs(&received, "received"));
        assert_eq!(sent.len(), 400, "{mode}");
        assert!(received.len() > 350, "{mode}: the path lost datagrams");
        for point in ["sock.send_enter", "sock.send_exit", "dev.queue", "dev.xmit"] {
            // A zero-copy send's datagram is in page fragments.
            let paged =
                send_op == "send_zc" && degraded(&meta, point, "datagrams in page fragments");
            if uring_traced(&meta, point) && !paged {
                assert_eq!(stamped(&rows, point, sender), sent, "{mode}: {point}");
            }
        }
        for point in ["sock.queue", "sock.recv_exit"] {
            if uring_traced(&meta, point) {
                assert_eq!(stamped(&rows, point, receiver), received, "{mode}: {point}");
            }
        }
        // The receiver waits for completions in io_uring_enter: woken by
        // the datagrams that reach its socket.
        let woke = stamped(&rows, "sched.wakeup", receiver);
        if is_traced(&meta, "sched.wakeup") {
            assert!(
                !woke.is_empty() && woke.is_subset(&received),
                "{mode}: {} wake-ups",
                woke.len()
            );
        }
        // A connected socket gives every read its flow: the one its
        // datagram had on the wire.
        if connect && !degraded(&meta, "sock.recv_exit", "no flow") {
            for r in rows.iter().filter(|r| r.point == "sock.recv_exit") {
                let wire = rows
                    .iter()
                    .find(|q| q.point == "dev.receive_skb" && q.seq == r.seq && q.kind == r.kind)
                    .unwrap_or_else(|| panic!("{mode}: seq {:?} never on the device", r.seq));
                assert_eq!(r.flow, wire.flow, "{mode}: seq {:?}", r.seq);
            }
        }
    }
}
