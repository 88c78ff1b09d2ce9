//! Privileged: `--points minimal` stamps only its four points (the socket
//! boundary and the wire on each side) and still every packet there,
//! checked against the example protocol's own logs, and the packets table
//! still pairs both hosts; an unknown point name is a usage error.

use std::collections::BTreeSet;
use xlap_stage::Stage;
use xlap_tests::example::ExampleOptions;
use xlap_tests::multiset::{assert_same, logged, stamped};
use xlap_tests::trace::trace_example;
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
