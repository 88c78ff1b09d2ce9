//! Privileged: a protocol nobody here wrote. iperf3 in UDP mode between the
//! two hosts, traced by payload offset only (`--proto iperf3`: its packet
//! counter), against iperf3's own JSON report.

use std::process::{Command, Stdio};
use std::time::Duration;
use xlap_stage::Stage;
use xlap_tests::trace::{read_stamps, Recorder};
use xlap_tests::{privileged, KillOnDrop, Scratch};

#[test]
fn iperf3_udp_counts_per_point_match_its_own_report() {
    let Some(_guard) = privileged("iperf3") else {
        return;
    };
    assert!(
        Command::new("iperf3").arg("--version").output().is_ok(),
        "iperf3 is missing: ./run.sh setup installs it"
    );
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("iperf3");
    let (a, b) = (stage.host(0), stage.host(1));
    let server = KillOnDrop(
        b.command("iperf3")
            .args(["-s", "-1", "-p", "5201", "-B", &b.ipv4.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    // The client waits for the start file, then execs iperf3 (same pid).
    let start = scratch.path("start");
    let client = KillOnDrop(
        a.command("sh")
            .arg("-c")
            .arg(format!(
                "while [ ! -e {} ]; do sleep 0.01; done; exec iperf3 -c {} -p 5201 -u -b 8M -l 200 -t 1 --json",
                start.display(),
                b.ipv4
            ))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (client_pid, server_pid) = (client.0.id(), server.0.id());
    let rec = Recorder::start(
        &[client_pid, server_pid],
        &scratch.path("run"),
        &["--proto", "iperf3"],
    );
    std::fs::write(&start, "go").unwrap();
    let mut client = client;
    let out = std::mem::replace(&mut client.0, Command::new("true").spawn().unwrap())
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "iperf3 client failed");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut server = server;
    let _ = server.0.wait();
    let meta = rec.meta_after_wait();

    let sum = &report["end"]["sum"];
    let sent = sum["packets"].as_u64().unwrap();
    let lost = sum["lost_packets"].as_u64().unwrap();
    assert!(sent > 1000, "{sum}");
    let rows = read_stamps(&scratch.path("run").join("stamps.parquet"));
    let count = |point: &str, pid: u32| {
        rows.iter()
            .filter(|r| r.point == point && r.pid == pid && r.seq.is_some())
            .count() as u64
    };
    assert_eq!(count("sock.send_enter", client_pid), sent, "{sum}");
    assert_eq!(count("dev.queue", client_pid), sent);
    assert_eq!(count("dev.xmit", client_pid), sent);
    assert_eq!(count("dev.receive_skb", server_pid), sent - lost);
    assert_eq!(count("sock.queue", server_pid), sent - lost);
    assert_eq!(count("sock.recv_exit", server_pid), sent - lost);
    // iperf3's packet counter starts at 1 and counts every datagram.
    let mut seqs: Vec<u64> = rows
        .iter()
        .filter(|r| r.point == "dev.queue" && r.pid == client_pid)
        .filter_map(|r| r.seq)
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=sent).collect::<Vec<_>>());
    // The server waits in select() between reads: the datagrams that wake
    // it are stamped at sched.wakeup (and sched.switch_in), each one a
    // datagram that reached its socket.
    let queued: std::collections::HashSet<u64> = rows
        .iter()
        .filter(|r| r.point == "sock.queue" && r.pid == server_pid)
        .filter_map(|r| r.seq)
        .collect();
    let woke: Vec<u64> = rows
        .iter()
        .filter(|r| r.point == "sched.wakeup" && r.pid == server_pid)
        .filter_map(|r| r.seq)
        .collect();
    let switched = count("sched.switch_in", server_pid);
    assert!(
        !woke.is_empty() && switched > 0,
        "no wake-up of the select()-based server: {} sched.wakeup, {switched} sched.switch_in",
        woke.len()
    );
    assert!(
        woke.iter().all(|s| queued.contains(s)),
        "a wake-up credited to a datagram that never reached the server's socket"
    );
    assert!(switched <= woke.len() as u64);
    // Only the handshake datagrams (4 bytes, no counter: the client's hello
    // and the server's reply) fail to parse, at most once each per point;
    // nothing else is lost.
    for (point, p) in meta["points"].as_object().unwrap() {
        for (key, value) in p.as_object().unwrap() {
            let n = value.as_u64().unwrap_or(0);
            match key.as_str() {
                "lost_parse" => assert!(n <= 2, "{point}: {p}"),
                k if k.starts_with("lost_") => assert_eq!(n, 0, "{point} {k}: {p}"),
                _ => {}
            }
        }
    }
}
