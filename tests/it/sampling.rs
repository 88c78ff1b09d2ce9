//! Privileged: `--sample 1/N` with one recorder per host, as on two
//! machines. Both recorders keep exactly the datagrams whose seq is in the
//! sample, each with every point of its end, and no other datagram appears
//! anywhere; the sample is checked against the protocol's own logs. The
//! receiver's host stamps at the socket calls, the sender's at the
//! syscalls: the sample does not depend on the boundary.

use std::collections::{BTreeMap, BTreeSet};
use xlap_records::points::point_of_column;
use xlap_records::sample::Sample;
use xlap_stage::Stage;
use xlap_tests::example::{events, kind_code, ExampleOptions, ProtocolRun};
use xlap_tests::trace::{is_traced, read_stamps, Recorder};
use xlap_tests::{privileged, xlap_trace, xlap_trace_ok, Scratch};

/// (kind, seq) of every datagram a log line names with `event`.
fn datagrams(log: &[serde_json::Value], event: &str) -> BTreeSet<(u32, u64)> {
    events(log, event)
        .filter(|e| e["dropped"] != true)
        .map(|e| {
            (
                kind_code(e["kind"].as_str().unwrap()),
                e["seq"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The kernel and app points of one end, those this kernel traces.
const SENDER_POINTS: &[&str] = &[
    "app.send_start",
    "app.submit",
    "sock.send_enter",
    "dev.queue",
    "dev.start_xmit",
    "dev.xmit",
    "sock.send_exit",
];
const RECEIVER_POINTS: &[&str] = &[
    "dev.netif_rx",
    "dev.receive_skb",
    "sock.queue",
    "sock.recv_exit",
    "app.handle_start",
    "app.deliver",
];

#[test]
fn two_recorders_with_the_same_sample_keep_the_same_datagrams_whole_on_both_hosts() {
    let Some(_guard) = privileged("sampling") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("sampling");
    std::fs::create_dir_all(scratch.path("runs")).unwrap();
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: 8000,
            period_us: 100,
            markers: true,
            gated: true,
            ..Default::default()
        },
    );
    let (sender, receiver) = run.pids();
    // The receiver's host at the socket calls: the sample is the same
    // whichever boundary each host stamps.
    let args = ["--sample", "1/16", "--no-correlate"];
    let a = Recorder::start(&[sender], &scratch.path("runs/a"), &args);
    let b = Recorder::start(
        &[receiver],
        &scratch.path("runs/b"),
        &[&args[..], &["--boundary", "socket-calls"]].concat(),
    );
    run.start();
    let (sent, received) = run.wait();
    let (meta_a, meta_b) = (a.meta_after_wait(), b.meta_after_wait());
    let sample = Sample::parse("1/16", vec![]).unwrap().unwrap();
    for meta in [&meta_a, &meta_b] {
        assert_eq!(
            meta.options.sample.as_ref(),
            Some(&sample),
            "run.json says the sample"
        );
    }

    // What the protocol says it sent and received, and the part of it in
    // the sample (every kind: data, parity, feedback).
    let sent_all = datagrams(&sent, "sent");
    let received_all = datagrams(&received, "received");
    let in_sample = |set: &BTreeSet<(u32, u64)>| -> BTreeSet<(u32, u64)> {
        set.iter()
            .copied()
            .filter(|(k, s)| sample.keeps(*s, Some(*k)))
            .collect()
    };
    let (sent_kept, received_kept) = (in_sample(&sent_all), in_sample(&received_all));
    let data = kind_code("data");
    let data_sent = sent_all.iter().filter(|(k, _)| *k == data).count();
    let data_kept = sent_kept.iter().filter(|(k, _)| *k == data).count();
    assert!(
        (data_sent / 16 - data_sent / 80..=data_sent / 16 + data_sent / 80).contains(&data_kept),
        "1/16 of {data_sent} data packets sent, {data_kept} in the sample"
    );

    // Every stamp of each recorder is of a datagram in the sample; the
    // sender's recorder has each datagram the sender sent in the sample at
    // every transmit point, the receiver's each one received at every
    // receive point: the same set on both hosts.
    let stamps_a = read_stamps(&scratch.path("runs/a").join("stamps.parquet"));
    let stamps_b = read_stamps(&scratch.path("runs/b").join("stamps.parquet"));
    let by_point = |rows: &[xlap_tests::trace::Row]| {
        let mut m: BTreeMap<String, BTreeSet<(u32, u64)>> = BTreeMap::new();
        for r in rows.iter().filter(|r| !r.fragment) {
            let (Some(seq), kind) = (r.seq, r.kind.unwrap_or(0)) else {
                continue;
            };
            m.entry(r.point.clone()).or_default().insert((kind, seq));
        }
        m
    };
    let (points_a, points_b) = (by_point(&stamps_a), by_point(&stamps_b));
    for (host, points) in [("a", &points_a), ("b", &points_b)] {
        for (point, set) in points {
            let outside: Vec<_> = set
                .iter()
                .filter(|(k, s)| !sample.keeps(*s, Some(*k)))
                .take(5)
                .collect();
            assert!(
                outside.is_empty(),
                "host {host}: {point} stamped datagrams outside the sample: {outside:?}"
            );
        }
    }
    let data_of = |set: &BTreeSet<(u32, u64)>| -> BTreeSet<u64> {
        set.iter()
            .filter(|(k, _)| *k == data)
            .map(|(_, s)| *s)
            .collect()
    };
    let sent_data = data_of(&sent_kept);
    let received_data = data_of(&received_kept);
    // The channel drops nothing, but a loaded machine's receive buffer may:
    // the receiver's own log says what it got.
    assert!(
        received_data.is_subset(&sent_data) && received_data.len() * 100 >= sent_data.len() * 99,
        "{} of {} sampled data packets received",
        received_data.len(),
        sent_data.len()
    );
    for (host, points, expected, meta, names) in [
        ("a", &points_a, &sent_data, &meta_a, SENDER_POINTS),
        ("b", &points_b, &received_data, &meta_b, RECEIVER_POINTS),
    ] {
        for point in names.iter().filter(|p| is_traced(meta, p)) {
            let got = points.get(*point).map(data_of).unwrap_or_default();
            let missing: Vec<_> = expected.difference(&got).take(5).collect();
            let extra: Vec<_> = got.difference(expected).take(5).collect();
            let lost: u64 = meta
                .points
                .get(*point)
                .map(|p| p.lost.values().sum())
                .unwrap_or(0);
            assert!(
                extra.is_empty() && missing.len() as u64 <= lost,
                "host {host}, {point}: {} stamped, {} in the sample; missing {missing:?} ({lost} counted lost), beyond the log {extra:?}",
                got.len(),
                expected.len()
            );
        }
    }

    // The packets table of the two runs: one row per datagram in the
    // sample, each standing for 16, complete on both ends where it was
    // received; those not received are the ones it calls lost.
    let packets = scratch.path("runs/packets.parquet");
    xlap_trace_ok(&[
        "correlate".as_ref(),
        scratch.path("runs/a").as_os_str(),
        scratch.path("runs/b").as_os_str(),
        "-o".as_ref(),
        packets.as_os_str(),
    ]);
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let p = packets.display();
    let rows: Vec<(u64, u32, bool)> = {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT seq, sample_weight, lost FROM '{p}' WHERE kind = {data} ORDER BY seq"
            ))
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let table: BTreeSet<u64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        table, sent_data,
        "the packets table has the sample's data packets, no other"
    );
    assert!(
        rows.iter().all(|r| r.1 == 16),
        "each row stands for 16 packets"
    );
    let lost: BTreeSet<u64> = rows.iter().filter(|r| r.2).map(|r| r.0).collect();
    let not_received: BTreeSet<u64> = sent_data.difference(&received_data).copied().collect();
    assert_eq!(lost, not_received, "lost: sent and never received");
    let cols: Vec<String> = SENDER_POINTS
        .iter()
        .chain(RECEIVER_POINTS)
        .filter(|p| is_traced(&meta_a, p))
        .map(|p| format!("{}_ns", p.replace('.', "_")))
        .collect();
    for c in &cols {
        let null: i64 = conn
            .query_row(
                &format!(
                    "SELECT count(*) FROM '{p}' WHERE kind = {data} AND NOT lost AND {c} IS NULL"
                ),
                [],
                |r| r.get(0),
            )
            .unwrap();
        let point = point_of_column(c);
        let lost: u64 = [&meta_a, &meta_b]
            .iter()
            .filter_map(|m| m.points.get(&point))
            .map(|p| p.lost.values().sum::<u64>())
            .sum();
        assert!(
            null as u64 <= lost,
            "{null} sampled data packets lack {point} ({lost} counted lost)"
        );
    }

    // The summary and a comparison say the sample; runs sampled
    // differently are refused by the correlation, naming the option.
    let summary = scratch.path("summary.json");
    let out = xlap_trace(&[
        "summary".as_ref(),
        scratch.path("runs").as_os_str(),
        "-o".as_ref(),
        summary.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(json["sample"]["one_in"], 16, "summary.json says the sample");
    let out = xlap_trace(&[
        "compare".as_ref(),
        summary.as_os_str(),
        summary.as_os_str(),
        "--markdown".as_ref(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("sampled 1/16"),
        "compare says the sample: {text}"
    );
    let unsampled = scratch.path("unsampled/b");
    std::fs::create_dir_all(&unsampled).unwrap();
    std::fs::copy(
        scratch.path("runs/b/stamps.parquet"),
        unsampled.join("stamps.parquet"),
    )
    .unwrap();
    let mut meta = meta_b.clone();
    meta.options.sample = None;
    meta.write(&unsampled.join("run.json")).unwrap();
    let out = xlap_trace(&[
        "correlate".as_ref(),
        scratch.path("runs/a").as_os_str(),
        unsampled.as_os_str(),
        "-o".as_ref(),
        scratch.path("mixed.parquet").as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--sample"), "{err}");
}
