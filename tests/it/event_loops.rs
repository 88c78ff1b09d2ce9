//! Privileged: receivers that wait in an event loop, not in a receive call.
//! sockperf (a program we did not write) as a UDP server in its epoll, poll
//! and select modes, traced with `--proto sockperf`, against the client's
//! own report ("Total of N messages sent") less what the kernel counts
//! dropped: every message reaches the server's socket and its read is
//! stamped, and the datagrams that wake the
//! waiting thread are stamped at sched.wakeup / sched.switch_in, each one a
//! datagram that reached that socket.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;
use xlap_stage::Stage;
use xlap_tests::kernel_drops::{wait_udp_drained, Drops};
use xlap_tests::trace::{is_traced, read_stamps, run_meta, Recorder};
use xlap_tests::{privileged, KillOnDrop, Scratch};

const PORT: u16 = 11111;

/// Messages the client says it sent.
fn client_total(report: &str) -> u64 {
    report
        .lines()
        .find_map(|l| {
            let rest = l.split("Total of ").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no 'Total of N messages sent' in sockperf's output:\n{report}"))
}

fn run_mode(stage: &Stage, mode: &str) {
    let scratch = Scratch::new(&format!("event-loop-{mode}"));
    let (a, b) = (stage.host(0), stage.host(1));
    // sockperf multiplexes only sockets listed in a feed file (-f, -F).
    let feed = scratch.path("feed");
    std::fs::write(&feed, format!("U:{}:{PORT}\n", b.ipv4)).unwrap();
    let server = KillOnDrop(
        b.command("sockperf")
            .args(["sr", "-f"])
            .arg(&feed)
            .args(["-F", mode])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sockperf (./run.sh setup installs it)"),
    );
    let server_pid = server.0.id();
    xlap_tests::wait_for_udp_port(server_pid, PORT);
    let rec = Recorder::start(
        &[server_pid],
        &scratch.path("run"),
        &["--proto", "sockperf"],
    );
    let before = Drops::now(b);
    let out = a
        .command("sockperf")
        .args(["tp", "-i", &b.ipv4.to_string(), "-p", &PORT.to_string()])
        .args(["-t", "1", "--mps", "2000", "-m", "64"])
        .output()
        .expect("sockperf client");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "sockperf client failed: {report}");
    let sent = client_total(&report);
    // A slow server (a loaded machine, an emulated guest) reads on after
    // the client ends: what it has not read when stopped has no read to
    // stamp. What its socket or the backlogs dropped never reaches it
    // (the kernel's counters).
    assert!(
        wait_udp_drained(server_pid, PORT, Duration::from_secs(30)),
        "{mode}: the server left datagrams unread 30 s after the client ended"
    );
    let drops = Drops::now(b).since(&before);
    // The server never exits on its own: stop it, and the recorder ends
    // with its target.
    drop(server);
    let meta = rec.meta_after_wait();

    let rows = read_stamps(&scratch.path("run").join("stamps.parquet"));
    let seqs = |point: &str| -> Vec<u64> {
        rows.iter()
            .filter(|r| r.point == point && r.pid == server_pid)
            .filter_map(|r| r.seq)
            .collect()
    };
    let read = seqs("sock.recv_exit");
    assert_eq!(
        read.len() as u64,
        sent - drops.backlog - drops.socket_buffer,
        "{mode}: sock.recv_exit vs the client's report less the kernel's drops {drops:?}"
    );
    // What reached the socket: its queue point where this kernel has it,
    // else what was read.
    let queued: HashSet<u64> = if is_traced(&meta, "sock.queue") {
        let queued: HashSet<u64> = seqs("sock.queue").into_iter().collect();
        assert_eq!(
            queued.len() as u64,
            sent - drops.backlog,
            "{mode}: sock.queue vs the client's report less the backlogs' drops {drops:?}"
        );
        queued
    } else {
        read.iter().copied().collect()
    };
    assert!(
        read.iter().all(|s| queued.contains(s)),
        "{mode}: a read of a datagram never queued"
    );
    if is_traced(&meta, "sched.wakeup") {
        let woke = seqs("sched.wakeup");
        let switched = seqs("sched.switch_in");
        assert!(
            !woke.is_empty() && !switched.is_empty(),
            "{mode}: no wake-up stamps for the waiting server ({} wakeup, {} switch_in): {:?}",
            woke.len(),
            switched.len(),
            meta.points
        );
        assert!(
            woke.iter().all(|s| queued.contains(s)),
            "{mode}: a wake-up credited to a datagram that never reached the socket"
        );
        assert!(
            switched.len() <= woke.len(),
            "{mode}: more switch-ins than wake-ups"
        );
    }
    assert_eq!(meta.lost, 0, "{mode}: {:?}", meta.points);
}

#[test]
fn sockperf_servers_in_epoll_poll_and_select_get_their_wakeups() {
    let Some(_guard) = privileged("event_loops") else {
        return;
    };
    assert!(
        Command::new("sockperf").arg("--version").output().is_ok(),
        "sockperf is missing: ./run.sh setup installs it"
    );
    let stage = Stage::two_hosts().expect("stage");
    for mode in ["epoll", "poll", "select"] {
        run_mode(&stage, mode);
    }
}

/// A tokio service (examples/tokio-echo): the server reads on runtime
/// worker threads that wait in epoll. Checked against both ends' own logs:
/// every datagram the server logged is stamped at its read, the client's
/// sends and reads of the echoes too, and the server's wake-ups are present,
/// each one a datagram the server received.
#[test]
fn a_tokio_echo_server_gets_its_reads_and_wakeups() {
    let Some(_guard) = privileged("event_loops_tokio") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("event-loop-tokio");
    let (a, b) = (stage.host(0), stage.host(1));
    let echo = xlap_tests::bin("xlap-tokio-echo");
    let (ready, start) = (scratch.path("ready"), scratch.path("start"));
    let (slog, clog) = (scratch.path("server.jsonl"), scratch.path("client.jsonl"));
    let server_addr = format!("{}:9700", b.ipv4);
    let server = KillOnDrop(
        b.command(&echo)
            .args(["server", &server_addr, "500"])
            .arg(&slog)
            .arg(&ready)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    xlap_tests::wait_for_file(&ready, 20);
    let client = KillOnDrop(
        a.command(&echo)
            .args([
                "client",
                &format!("{}:9701", a.ipv4),
                &server_addr,
                "500",
                "300",
            ])
            .arg(&clog)
            .arg(&start)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (server_pid, client_pid) = (server.0.id(), client.0.id());
    let rec = Recorder::start(&[server_pid, client_pid], &scratch.path("run"), &[]);
    std::fs::write(&start, "go").unwrap();
    for mut p in [client, server] {
        assert!(p.0.wait().unwrap().success(), "the tokio echo failed");
    }
    let dir = rec.dir.clone();
    rec.wait();
    let rows = read_stamps(&dir.join("stamps.parquet"));
    let seqs = |log: &std::path::Path, event: &str| -> std::collections::BTreeSet<u64> {
        xlap_tests::read_jsonl(log)
            .iter()
            .filter(|e| e["event"] == event)
            .map(|e| e["seq"].as_u64().unwrap())
            .collect()
    };
    let stamped = |point: &str, pid: u32| -> std::collections::BTreeSet<u64> {
        rows.iter()
            .filter(|r| r.point == point && r.pid == pid && r.kind == Some(1))
            .filter_map(|r| r.seq)
            .collect()
    };
    let received = seqs(&slog, "received");
    assert_eq!(received.len(), 500, "the server's log");
    assert_eq!(
        stamped("sock.recv_exit", server_pid),
        received,
        "server reads"
    );
    let meta = run_meta(&dir);
    if is_traced(&meta, "sock.queue") {
        assert_eq!(stamped("sock.queue", server_pid), received, "server socket");
    }
    assert_eq!(
        stamped("sock.send_enter", client_pid),
        seqs(&clog, "sent"),
        "client sends"
    );
    assert_eq!(
        stamped("sock.recv_exit", client_pid),
        seqs(&clog, "echoed"),
        "client reads"
    );
    let woke = stamped("sched.wakeup", server_pid);
    if is_traced(&meta, "sched.wakeup") {
        assert!(
            woke.len() > 100 && woke.is_subset(&received),
            "the epoll-waiting workers' wake-ups: {} of {}",
            woke.len(),
            received.len()
        );
    }
}
