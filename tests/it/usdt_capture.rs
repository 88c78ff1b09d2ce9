//! Privileged: USDT markers of a running protocol become app points, in
//! causal order with the kernel points of the same packet.

use std::collections::{BTreeMap, BTreeSet};
use xlap_stage::Stage;
use xlap_tests::example::{events, ExampleOptions};
use xlap_tests::privileged;
use xlap_tests::trace::{site_path, trace_example, traced};

const SENDER_APP: &[&str] = &[
    "app.send_start",
    "app.encode_start",
    "app.encode_end",
    "app.submit",
    "app.link_transmit_start",
];
// handle_end is not on the chain: the receive thread hands a packet to the
// application thread (deliver) before it ends handling it, so the two overlap.
const RECEIVER_APP: &[&str] = &[
    "app.link_receive",
    "app.handle_start",
    "app.decode_start",
    "app.decode_end",
];

/// What an app stamp says besides its point and seq: the process (sender
/// or receiver), and whether its thread is the one the kernel saw next on
/// the same packet.
type AppFacts = BTreeMap<(String, u64), (&'static str, bool)>;

#[test]
fn markers_become_app_points_in_causal_order_with_kernel_points() {
    let Some(_guard) = privileged("usdt_app_points") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let ring = app_points_in_causal_order(&stage, "ring");
    let uprobe = app_points_in_causal_order(&stage, "uprobe");
    // Side by side: both paths stamp the same packets at the same points,
    // for the same processes and threads.
    assert_eq!(ring.len(), uprobe.len());
    let differ: Vec<_> = ring
        .iter()
        .filter(|(k, v)| uprobe.get(*k) != Some(*v))
        .take(5)
        .collect();
    assert!(
        differ.is_empty(),
        "ring and uprobe stamps differ: {differ:?}"
    );
}

/// One traced run of the example with its markers on `marker_path`: every
/// delivered packet has every app point, in causal order with its kernel
/// points (one clock), from the right process.
fn app_points_in_causal_order(stage: &Stage, marker_path: &str) -> AppFacts {
    let t = trace_example(
        stage,
        &format!("usdt-{marker_path}"),
        &ExampleOptions {
            count: 2_000,
            period_us: 200,
            markers: true,
            ..Default::default()
        },
        &["--marker-path", marker_path],
    );
    let ((s, r), meta, received) = (t.pids, &t.meta, &t.received);
    assert_eq!(meta.lost, 0);
    assert_eq!(meta.options.marker_path, Some(site_path(marker_path)));
    let sites = &meta.options.usdt_sites;
    let names: BTreeSet<&str> = sites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.len(), 13, "every marker attached: {names:?}");
    assert!(
        sites.iter().all(|s| s.path == site_path(marker_path)),
        "{marker_path}: {sites:?}"
    );
    let cpus = std::thread::available_parallelism().unwrap().get() as u16;

    // Data packets (kind 1) by seq: point -> (pid, ts, tid).
    let rows = t.stamps();
    let mut packets: BTreeMap<u64, BTreeMap<String, (u32, i64, u32)>> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.kind == Some(1)) {
        if row.point.starts_with("app.") {
            assert!(row.cpu < cpus, "{marker_path}: {row:?}");
        }
        packets
            .entry(row.seq.unwrap())
            .or_default()
            .entry(row.point.clone())
            .or_insert((row.pid, row.ts_ns, row.tid));
    }
    let mut facts = AppFacts::new();
    let delivered: Vec<u64> = events(received, "delivered")
        .filter(|e| e["recovered"] == false)
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(delivered.len(), 2_000);
    let kernel_chain = traced(
        meta,
        &[
            "sock.send_enter",
            "dev.queue",
            "dev.netif_rx",
            "sock.queue",
            "sock.recv_exit",
        ],
    );
    for seq in delivered {
        let p = &packets[&seq];
        let chain: Vec<&str> = SENDER_APP
            .iter()
            .copied()
            .chain(kernel_chain.iter().copied())
            .chain(RECEIVER_APP.iter().copied())
            .chain(["app.deliver"])
            .collect();
        let mut last = i64::MIN;
        for point in chain {
            let (pid, ts, _) = *p
                .get(point)
                .unwrap_or_else(|| panic!("seq {seq}: no {point}"));
            assert!(
                ts >= last,
                "seq {seq}: {point} before the point preceding it: {p:?}"
            );
            last = ts;
            let expected_pid = if point.starts_with("app.") && SENDER_APP.contains(&point) {
                s
            } else if point.starts_with("app.") {
                r
            } else {
                pid
            };
            assert_eq!(
                pid, expected_pid,
                "seq {seq}: {point} attributed to the wrong process"
            );
        }
        assert!(
            p["app.handle_end"].1 >= p["app.decode_end"].1,
            "seq {seq}: handle_end before decode_end"
        );
        // The thread: the sender's last marker runs in the thread that
        // makes the send call, the receiver's first in the one that read.
        let same_thread = |app: &str, kernel: &str| p[app].2 == p[kernel].2 && p[app].2 != 0;
        for (point, v) in p.iter().filter(|(k, _)| k.starts_with("app.")) {
            let thread_checked = match point.as_str() {
                "app.link_transmit_start" => same_thread(point, "sock.send_enter"),
                "app.link_receive" => same_thread(point, "sock.recv_exit"),
                _ => true,
            };
            assert!(
                thread_checked,
                "{marker_path}: seq {seq}: {point} not in the thread the kernel saw: {p:?}"
            );
            let role = if v.0 == s { "sender" } else { "receiver" };
            facts.insert((point.clone(), seq), (role, thread_checked));
        }
    }
    facts
}

#[test]
fn a_binary_without_markers_is_said_and_its_kernel_points_still_traced() {
    let Some(_guard) = privileged("usdt_none") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "usdt_none",
        &ExampleOptions {
            count: 200,
            period_us: 500,
            ..Default::default()
        },
        &[],
    );
    let (s, stderr) = (t.pids.0, &t.stderr);
    assert!(
        stderr.contains(&format!("pid {s}")) && stderr.contains("no xlap:* USDT markers"),
        "{stderr}"
    );
    assert!(t.meta.points["dev.queue"].stamps > 0);
    // Both ends exited: each is said, and recorded, before the run ends.
    for pid in [t.pids.0, t.pids.1] {
        assert!(stderr.contains(&format!("pid {pid} exited")), "{stderr}");
    }
    assert_eq!(t.meta.options.exited.len(), 2);
}

#[test]
fn a_usdt_probe_that_does_not_exist_is_a_usage_error() {
    let Some(_guard) = privileged("usdt_missing") else {
        return;
    };
    let out = std::process::Command::new(xlap_tests::bin("xlap-trace"))
        .args([
            "record",
            "--pid",
            &std::process::id().to_string(),
            "--usdt",
            "nosuch:probe=app.x",
            "--duration",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no USDT probe nosuch:probe"), "{err}");
}
