//! Privileged: `--points minimal` stamps only its four points (the socket
//! boundary and the wire on each side) and still every packet there,
//! checked against the example protocol's own logs, and the packets table
//! still pairs both hosts; at the socket calls it does so without the
//! send-call hook (fragments of large datagrams included); an unknown point
//! name is a usage error. `--empty-programs` keeps a run's hooks and
//! stamps nothing.

use std::collections::BTreeSet;
use xlap_stage::Stage;
use xlap_tests::example::ExampleOptions;
use xlap_tests::multiset::{assert_same, logged, stamped};
use xlap_tests::trace::{trace_example, Row, Traced};
use xlap_tests::{bin, privileged};

#[test]
fn minimal_points_stamp_every_packet_at_four_points_only() {
    let Some(_guard) = privileged("point_sets") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "points-minimal",
        &ExampleOptions {
            count: 500,
            period_us: 200,
            ..Default::default()
        },
        &["--points", "minimal"],
    );
    assert_minimal(&t);
}

/// The same at the socket calls, for a sender that names its destination
/// (sendto): with sock.send_exit left out, the send-call hook is not
/// attached at all, and each datagram's first device point stamps its
/// send_enter from the start cgroup sendmsg4 noted. Large datagrams too:
/// their later IP fragments still get their device stamps.
#[test]
fn minimal_points_at_the_socket_calls_leave_the_send_call_hook_out() {
    let Some(_guard) = privileged("point_sets_calls") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let sendto = || vec!["--send-call".to_string(), "sendto".to_string()];
    let calls_minimal = ["--boundary", "socket-calls", "--points", "minimal"];
    let t = trace_example(
        &stage,
        "points-minimal-calls",
        &ExampleOptions {
            count: 500,
            period_us: 200,
            send_args: sendto(),
            ..Default::default()
        },
        &calls_minimal,
    );
    assert_minimal(&t);
    // A kernel without skb dynptrs for tracing (before 6.12) falls back to
    // the syscalls, and says so.
    if t.meta.options.boundary.as_deref() == Some("socket-calls") {
        let programs: Vec<&String> = t.meta.bpf_programs.keys().collect();
        assert!(
            !programs.iter().any(|p| *p == "on_sock_send_length"),
            "send-call hook attached without sock.send_exit: {programs:?}"
        );
    }

    let large = trace_example(
        &stage,
        "points-minimal-calls-fragments",
        &ExampleOptions {
            count: 100,
            period_us: 500,
            send_args: [sendto(), vec!["--payload".into(), "20000".into()]].concat(),
            ..Default::default()
        },
        &calls_minimal,
    );
    let rows = large.stamps();
    let sent = logged(&large.sent, "sent");
    assert!(sent.len() >= 100, "data and parity sent: {}", sent.len());
    let whole: Vec<Row> = rows.iter().filter(|r| !r.fragment).cloned().collect();
    for point in ["sock.send_enter", "dev.xmit"] {
        assert_same(&stamped(&whole, point, large.pids.0), &sent, point);
    }
    // Each datagram leaves in as many fragments as the others of its size.
    let fragments: Vec<Row> = rows
        .iter()
        .filter(|r| r.fragment && r.point == "dev.xmit")
        .cloned()
        .collect();
    let per_datagram = stamped(&fragments, "dev.xmit", large.pids.0);
    let counts: BTreeSet<usize> = sent
        .keys()
        .map(|k| per_datagram.get(k).copied().unwrap_or(0))
        .collect();
    assert!(
        counts.len() == 1 && !counts.contains(&0),
        "later fragments per datagram at dev.xmit: {counts:?}"
    );
    assert_same(
        &stamped(&rows, "sock.recv_exit", large.pids.1),
        &logged(&large.received, "received"),
        "sock.recv_exit",
    );
}

/// What every `--points minimal` run holds: the four points, every
/// datagram at them by the example's own logs, both hosts paired.
fn assert_minimal(t: &Traced) {
    let rows = t.stamps();
    let points: BTreeSet<&str> = rows.iter().map(|r| r.point.as_str()).collect();
    assert_eq!(
        points,
        BTreeSet::from([
            "dev.receive_skb",
            "dev.xmit",
            "sock.recv_exit",
            "sock.send_enter"
        ]),
        "only the minimal set"
    );
    assert_eq!(
        t.meta.options.points,
        [
            "sock.send_enter",
            "dev.xmit",
            "dev.receive_skb",
            "sock.recv_exit"
        ]
    );
    let sent = logged(&t.sent, "sent");
    let received = logged(&t.received, "received");
    assert!(sent.len() >= 500, "data and parity sent: {}", sent.len());
    for point in ["sock.send_enter", "dev.xmit"] {
        assert_same(&stamped(&rows, point, t.pids.0), &sent, point);
    }
    assert_same(
        &stamped(&rows, "sock.recv_exit", t.pids.1),
        &received,
        "sock.recv_exit",
    );
    // The wire: every datagram read arrived; a datagram that arrives after
    // the receiver closed its socket (the last parity) is on the wire but
    // never read.
    let arrived = stamped(&rows, "dev.receive_skb", t.pids.1);
    let read_not_arrived: Vec<_> = received
        .keys()
        .filter(|k| !arrived.contains_key(k))
        .collect();
    assert!(
        read_not_arrived.is_empty(),
        "read, never on the device: {read_not_arrived:?}"
    );
    let not_sent: Vec<_> = arrived.keys().filter(|k| !sent.contains_key(k)).collect();
    assert!(not_sent.is_empty(), "arrived, never sent: {not_sent:?}");
    assert!(
        arrived.values().all(|n| *n == 1),
        "a datagram arrived twice"
    );

    // Both hosts paired through the wire points that are left.
    let db = duckdb::Connection::open_in_memory().unwrap();
    let paired: i64 = db
        .query_row(
            &format!(
                "SELECT count(*) FROM '{}' WHERE kind = 1 AND e2e_ns IS NOT NULL",
                t.run_dir().join("packets.parquet").display()
            ),
            [],
            |r| r.get(0),
        )
        .expect("packets table");
    let data_received = received.keys().filter(|(_, k)| *k == 1).count() as i64;
    assert_eq!(
        paired, data_received,
        "data packets with an end-to-end time"
    );
}

/// `--empty-programs` attaches the very hooks of the run it is given and
/// stamps nothing: each hook still runs for every datagram the example's
/// own logs count (the kernel's run counts), and the verifier kept almost
/// nothing of each program (its own instruction count).
#[test]
fn empty_programs_run_on_the_same_hooks_and_stamp_nothing() {
    let Some(_guard) = privileged("point_sets_empty") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let opts = ExampleOptions {
        count: 300,
        period_us: 500,
        send_args: vec!["--send-call".to_string(), "sendto".to_string()],
        ..Default::default()
    };
    let args = [
        "--boundary",
        "socket-calls",
        "--points",
        "minimal",
        "--bpf-stats",
        "full",
    ];
    let working = trace_example(&stage, "points-not-empty", &opts, &args);
    let empty = trace_example(
        &stage,
        "points-empty",
        &opts,
        &[&args[..], &["--empty-programs"]].concat(),
    );
    assert!(empty.meta.options.empty_programs && !working.meta.options.empty_programs);
    let hooks = |t: &Traced| t.meta.bpf_programs.keys().cloned().collect::<Vec<_>>();
    assert_eq!(hooks(&empty), hooks(&working), "the same programs attached");
    assert_eq!(empty.meta.stamps, 0, "{}", empty.stderr);
    assert!(empty.stamps().is_empty(), "stamps.parquet holds stamps");
    assert!(
        empty.stderr.contains("--empty-programs"),
        "the run does not say why it stamped nothing: {}",
        empty.stderr
    );

    let sent = logged(&empty.sent, "sent").len() as u64;
    let received = logged(&empty.received, "received").len() as u64;
    assert!(
        sent >= 300 && received >= 300,
        "{sent} sent, {received} read"
    );
    let runs = |name: &str| {
        empty
            .meta
            .bpf_programs
            .get(name)
            .unwrap_or_else(|| panic!("{name} not attached: {:?}", hooks(&empty)))
            .run_count
    };
    for (program, at_least) in [
        ("on_net_dev_queue", sent),
        ("on_net_dev_xmit", sent),
        ("on_netif_receive_skb", received),
        ("on_sock_recv_length", received),
    ] {
        assert!(
            runs(program) >= at_least,
            "{program} ran {} times for {at_least} datagrams",
            runs(program)
        );
    }
    // What the verifier walked: the working program's body, the empty
    // one's first branch and return.
    for (program, stats) in &empty.meta.bpf_programs {
        let (Some(kept), Some(whole)) = (
            stats.verified_insns,
            working.meta.bpf_programs[program].verified_insns,
        ) else {
            continue;
        };
        if program.starts_with("on_net_dev") || program.starts_with("on_netif") {
            assert!(
                kept * 10 < whole,
                "{program}: {kept} instructions verified, {whole} in the working run"
            );
        }
    }
}

#[test]
fn an_unknown_point_is_a_usage_error() {
    let _guard = xlap_tests::unprivileged();
    let out = std::process::Command::new(bin("xlap-trace"))
        .args(["record", "--pid", "1", "--points", "dev.xmit,dev.nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dev.nope") && err.contains("sock.recv_exit"),
        "{err}"
    );
}
