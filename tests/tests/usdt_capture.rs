//! Privileged: USDT markers of a running protocol become app points, in
//! causal order with the kernel points of the same packet.

use std::collections::{BTreeMap, BTreeSet};
use xlap_stage::Stage;
use xlap_tests::example::{events, ExampleOptions};
use xlap_tests::privileged;
use xlap_tests::trace::trace_example;

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

#[test]
fn markers_become_app_points_in_causal_order_with_kernel_points() {
    let Some(_guard) = privileged("usdt_app_points") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "usdt",
        &ExampleOptions {
            count: 2_000,
            period_us: 200,
            markers: true,
            ..Default::default()
        },
        &[],
    );
    let ((s, r), meta, received) = (t.pids, &t.meta, &t.received);
    assert_eq!(meta["lost"], 0);
    let sites = meta["options"]["usdt_sites"].as_array().unwrap();
    let names: BTreeSet<&str> = sites.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 13, "every marker attached: {names:?}");

    // Data packets (kind 1) by seq: point -> (pid, ts).
    let rows = t.stamps();
    let mut packets: BTreeMap<u64, BTreeMap<String, (u32, i64)>> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.kind == Some(1)) {
        packets
            .entry(row.seq.unwrap())
            .or_default()
            .entry(row.point.clone())
            .or_insert((row.pid, row.ts_ns));
    }
    let delivered: Vec<u64> = events(received, "delivered")
        .filter(|e| e["recovered"] == false)
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(delivered.len(), 2_000);
    for seq in delivered {
        let p = &packets[&seq];
        let chain: Vec<&str> = SENDER_APP
            .iter()
            .copied()
            .chain([
                "sock.send_enter",
                "dev.queue",
                "dev.netif_rx",
                "sock.queue",
                "sock.recv_exit",
            ])
            .chain(RECEIVER_APP.iter().copied())
            .chain(["app.deliver"])
            .collect();
        let mut last = i64::MIN;
        for point in chain {
            let (pid, ts) = *p
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
    }
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
    assert!(t.meta["points"]["dev.queue"]["stamps"].as_u64().unwrap() > 0);
    // Both ends exited: each is said, and recorded, before the run ends.
    for pid in [t.pids.0, t.pids.1] {
        assert!(stderr.contains(&format!("pid {pid} exited")), "{stderr}");
    }
    assert_eq!(t.meta["options"]["exited"].as_array().unwrap().len(), 2);
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
