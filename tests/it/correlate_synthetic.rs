//! Unprivileged: the correlator on synthetic stamps whose truth is known:
//! 16-bit sequence numbers wrapping, losses, a duplicate, a reordered pair,
//! a packet rebuilt by the receiver without crossing the wire. And point
//! names (the traced programs' own) and run.json names made to break out of
//! SQL: carried quoted through correlation and the analyses, never run.

use std::path::Path;
use xlap_abi::xlap_point;
use xlap_analyze::{correlate, CorrelateOptions, Run};
use xlap_records::{RunDir, Stamp};
use xlap_tests::run_files::{self, RunFiles};
use xlap_tests::Scratch;

const PACKETS: u64 = 70_000; // more than 2^16: the seq field wraps once
const SENDER: u32 = 10;
const RECEIVER: u32 = 20;
const FLOW: u64 = 0x1111_2222_2329_2328; // ports 9001 -> 9000
const APP: u16 = xlap_point::XLAP_POINT_APP_BASE as u16;

fn stamp(point: u16, ts: u64, seq: u64, flow: u64, pid: u32) -> Stamp {
    Stamp {
        ts_ns: ts,
        point,
        seq: Some(seq % 65_536),
        kind: Some(1),
        flow,
        pid,
        tid: pid,
        cpu: 0,
        len: 224,
        ifindex: None,
        queue: None,
        hw_ts_ns: None,
        priority: None,
        cgroup_id: None,
        netns: None,
        from_user: flow == 0,
        fragment: false,
    }
}

fn lost(i: u64) -> bool {
    i % 1000 == 7
}

/// Writes a run directory with the given stamps.
fn write_run(dir: &Path, stamps: &[Stamp]) {
    // app point APP+0 is send_start, APP+1 deliver
    let names = RunNames {
        run_id: "synthetic",
        host: "host",
        boot_id: "boot-a",
        markers: &["send_start", "deliver"],
    };
    write_run_named(dir, stamps, &names);
}

/// The names a run directory gives its run, host, clock and markers
/// (marker i is app point APP+i).
struct RunNames<'a> {
    run_id: &'a str,
    host: &'a str,
    boot_id: &'a str,
    markers: &'a [&'a str],
}

/// Writes a run directory with the given stamps and names.
fn write_run_named(dir: &Path, stamps: &[Stamp], names: &RunNames) {
    let app_names: Vec<String> = names.markers.iter().map(|m| m.to_string()).collect();
    let files = RunFiles {
        run_id: names.run_id,
        host: names.host,
        boot_id: names.boot_id,
        app_names: &app_names,
        seq_size: 2,
        monotonic_ns: 0,
        realtime_ns: 0,
    };
    run_files::write_run(dir, &files, stamps);
}

fn synthetic() -> Vec<Stamp> {
    let mut v = Vec::new();
    for i in 0..PACKETS {
        let t = 1_000_000_000 + i * 10_000;
        v.push(stamp(APP, t, i, 0, SENDER));
        v.push(stamp(
            xlap_point::XLAP_POINT_SOCK_SEND_ENTER as u16,
            t + 1_000,
            i,
            FLOW,
            SENDER,
        ));
        v.push(stamp(
            xlap_point::XLAP_POINT_DEV_QUEUE as u16,
            t + 2_000,
            i,
            FLOW,
            SENDER,
        ));
        v.push(stamp(
            xlap_point::XLAP_POINT_DEV_START_XMIT as u16,
            t + 3_000,
            i,
            FLOW,
            SENDER,
        ));
        if i == 800 {
            // rebuilt from parity: delivered, never received
            v.push(stamp(APP + 1, t + 50_000, i, 0, RECEIVER));
            continue;
        }
        if lost(i) {
            continue;
        }
        // 600 arrives after 601
        let rx = if i == 600 { t + 15_000 } else { t + 4_000 };
        let copies = if i == 500 { 2 } else { 1 };
        for c in 0..copies {
            let rx = rx + c * 5_000;
            v.push(stamp(
                xlap_point::XLAP_POINT_DEV_NETIF_RX as u16,
                rx,
                i,
                FLOW,
                RECEIVER,
            ));
            v.push(stamp(
                xlap_point::XLAP_POINT_SOCK_QUEUE as u16,
                rx + 1_000,
                i,
                FLOW,
                RECEIVER,
            ));
        }
        v.push(stamp(
            xlap_point::XLAP_POINT_SOCK_RECV_EXIT as u16,
            rx + 3_000,
            i,
            0,
            RECEIVER,
        ));
        v.push(stamp(APP + 1, rx + 4_000, i, 0, RECEIVER));
    }
    v
}

#[test]
fn the_packets_table_matches_the_synthetic_truth() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("synthetic");
    let dir = scratch.path("run");
    write_run(&dir, &synthetic());
    let run = Run::open(&RunDir::new(&dir)).unwrap();
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let out = scratch.path("packets.parquet");
    let c = correlate(
        &conn,
        &[run],
        &CorrelateOptions {
            deadline_ns: Some(20_000),
        },
        Some(&out),
    )
    .unwrap();

    assert_eq!(
        c.packets, PACKETS,
        "one row per packet, wrap-around unwrapped"
    );
    assert_eq!(c.lost, (0..PACKETS).filter(|i| lost(*i)).count() as u64);
    assert_eq!(
        (c.recovered, c.duplicates, c.reordered, c.unplaced_stamps),
        (1, 1, 1, 0)
    );
    assert_eq!(
        xlap_tests::packets_file::assert_follows_schema(&out),
        c.points,
        "the file's points are the correlation's"
    );
    assert_eq!(
        c.points,
        [
            "app_send_start_ns",
            "sock_send_enter_ns",
            "dev_queue_ns",
            "dev_start_xmit_ns",
            "dev_netif_rx_ns",
            "sock_queue_ns",
            "sock_recv_exit_ns",
            "app_deliver_ns"
        ]
    );

    let q = |sql: &str| -> Vec<(i64, i64)> {
        let mut stmt = conn.prepare(sql).unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.collect::<Result<Vec<_>, _>>().unwrap()
    };
    let file = out.display();
    // Unwrapped seqs are exactly 0..PACKETS, in order of sending.
    assert_eq!(
        q(&format!(
            "SELECT min(seq)::BIGINT, max(seq)::BIGINT FROM '{file}'"
        )),
        vec![(0, PACKETS as i64 - 1)]
    );
    assert_eq!(
        q(&format!("SELECT count(*), count(DISTINCT app_send_start_ns) FROM '{file}' WHERE seq = 65536 + 12 OR seq = 12")),
        vec![(2, 2)],
        "seq 12 before and after the wrap are two packets"
    );
    // Durations of an ordinary packet (seq 70): X-LAP's equations.
    assert_eq!(
        q(&format!(
            "SELECT sender_total_ns, channel_ns FROM '{file}' WHERE seq = 70"
        )),
        vec![(3_000, 1_000)]
    );
    assert_eq!(
        q(&format!(
            "SELECT receiver_total_ns, e2e_ns FROM '{file}' WHERE seq = 70"
        )),
        vec![(4_000, 8_000)]
    );
    assert_eq!(
        q(&format!("SELECT \"sock_send_enter__dev_queue_ns\", \"sock_recv_exit__app_deliver_ns\" FROM '{file}' WHERE seq = 70")),
        vec![(1_000, 1_000)]
    );
    // Flags where the truth put them.
    let flagged = |flag: &str| {
        q(&format!(
            "SELECT seq::BIGINT, 0 FROM '{file}' WHERE {flag} ORDER BY seq"
        ))
        .into_iter()
        .map(|r| r.0)
        .collect::<Vec<_>>()
    };
    assert_eq!(flagged("duplicate"), vec![500]);
    assert_eq!(flagged("reordered"), vec![600]);
    assert_eq!(flagged("recovered"), vec![800]);
    assert_eq!(flagged("lost").len(), 70);
    assert!(flagged("lost").iter().all(|s| s % 1000 == 7));
    assert_eq!(
        q(&format!(
            "SELECT duplicate_skew_ns, 0 FROM '{file}' WHERE seq = 500"
        )),
        vec![(5_000, 0)]
    );
    // Deadline 20 µs: the recovered packet (delivered 50 µs after sending)
    // and the late 600 (e2e 19 µs: within) only.
    assert_eq!(flagged("deadline_missed"), vec![800]);
}

#[test]
fn a_directory_that_is_not_a_run_is_a_clear_error() {
    let scratch = Scratch::new("notarun");
    let e = Run::open(&RunDir::new(&scratch.0)).unwrap_err().to_string();
    assert!(e.contains("not an xlap-trace run directory"), "{e}");
    std::fs::write(scratch.path("run.json"), r#"{"schema_version": "9"}"#).unwrap();
    let e = Run::open(&RunDir::new(&scratch.0)).unwrap_err().to_string();
    assert!(e.contains("schema version 9"), "{e}");
    // A run.json of the right version without what pairs runs and clocks.
    std::fs::write(
        scratch.path("run.json"),
        r#"{"schema_version": "2", "run_id": "r", "host": "h",
            "clock_start": {"monotonic_ns": 1, "realtime_ns": 2},
            "options": {"layout": {"seq_size": 4}}}"#,
    )
    .unwrap();
    std::fs::write(scratch.path("stamps.parquet"), b"").unwrap();
    let e = Run::open(&RunDir::new(&scratch.0)).unwrap_err().to_string();
    assert!(e.contains("boot_id"), "{e}");
}

/// Where a name that broke out of its quotes would write: no dot in it,
/// so a point column (dots as underscores) names the same file.
fn pwn_file() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("xlap-pwn-{}", std::process::id()))
}

/// Marker names made to end a string literal or an identifier and run a
/// statement of their own (a `COPY ... TO` a file outside the run), plus
/// quotes, a semicolon and dots.
fn hostile_markers(pwn: &Path) -> Vec<String> {
    let pwn = pwn.display();
    vec![
        "send_start'x".into(),
        "deliver\"y".into(),
        format!("x'); COPY (SELECT 1) TO '{pwn}'; --"),
        "..".into(),
        "semi;colon".into(),
        format!("y\" FROM s5; COPY (SELECT 2) TO '{pwn}'; --"),
    ]
}

/// 500 packets, each through three hostile markers on each side around
/// the kernel points, with some jitter for the analyses to find.
fn hostile_stamps() -> Vec<Stamp> {
    let mut v = Vec::new();
    for i in 0..500u64 {
        let t = 1_000_000_000 + i * 10_000;
        let jitter = (i * 7919) % 1_000;
        let tx = [
            (APP, 0, 0),
            (APP + 2, 500, 0),
            (xlap_point::XLAP_POINT_SOCK_SEND_ENTER as u16, 1_000, FLOW),
            (xlap_point::XLAP_POINT_DEV_QUEUE as u16, 2_000, FLOW),
            (
                xlap_point::XLAP_POINT_DEV_START_XMIT as u16,
                3_000 + jitter,
                FLOW,
            ),
            (APP + 3, 3_500 + jitter, 0),
        ];
        let rx = [
            (xlap_point::XLAP_POINT_DEV_NETIF_RX as u16, 4_000, FLOW),
            (xlap_point::XLAP_POINT_SOCK_QUEUE as u16, 5_000, FLOW),
            (xlap_point::XLAP_POINT_SOCK_RECV_EXIT as u16, 7_000, 0),
            (APP + 1, 8_000, 0),
            (APP + 4, 8_500, 0),
            (APP + 5, 9_000, 0),
        ];
        for (point, dt, flow) in tx {
            v.push(stamp(point, t + dt, i, flow, SENDER));
        }
        for (point, dt, flow) in rx {
            v.push(stamp(point, t + jitter + dt, i, flow, RECEIVER));
        }
    }
    v
}

#[test]
fn hostile_names_are_carried_quoted_through_correlation_and_analyses() {
    let _guard = xlap_tests::unprivileged();
    use xlap_analyze::session;
    let pwn = pwn_file();
    let _ = std::fs::remove_file(&pwn);
    let scratch = Scratch::new("hostile");
    let dir = scratch.path("run");
    let markers = hostile_markers(&pwn);
    let marker_refs: Vec<&str> = markers.iter().map(|m| m.as_str()).collect();
    let run_id = format!("run'); COPY (SELECT 3) TO '{}'; --", pwn.display());
    write_run_named(
        &dir,
        &hostile_stamps(),
        &RunNames {
            run_id: &run_id,
            host: "host\"'; --",
            boot_id: "boot'b",
            markers: &marker_refs,
        },
    );

    // As `record` ends: the correlation root would run.
    let out = dir.join("packets.parquet");
    let c = xlap_analyze::finish::correlate_dirs(&[RunDir::new(&dir)], &out, Some(1.0))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!((c.packets, c.lost, c.unplaced_stamps), (500, 0, 0));
    for m in &markers {
        let col = format!("app_{}_ns", m.replace('.', "_"));
        assert!(c.points.contains(&col), "{col} not in {:?}", c.points);
    }
    assert_eq!(
        xlap_tests::packets_file::assert_follows_schema(&out),
        c.points
    );

    // The default analyses, on the run and on its packets file alone.
    for arg in [&dir, &out] {
        let (conn, ds) = session::open(arg, xlap_analyze::dataset::Shared::Materialized, false)
            .unwrap_or_else(|e| panic!("{}: {e:#}", arg.display()));
        assert_eq!(ds.delivered, 500);
        let queries: Vec<_> = xlap_analyze::queries::DEFAULT
            .iter()
            .map(|q| xlap_analyze::queries::find(q).unwrap())
            .collect();
        let results = session::run_queries(&conn, &queries, &[], false).unwrap();
        let jitter = &results.iter().find(|(q, _)| q.name == "jitter").unwrap().1;
        let stages = serde_json::to_string(&jitter.rows).unwrap();
        assert!(stages.contains("send_start'x"), "{stages}");
        assert!(stages.contains("COPY (SELECT 2)"), "{stages}");
        // The report's scatter plots and waterfalls, and the Perfetto
        // export, name their columns too.
        let html = xlap_analyze::report::build(
            &conn,
            &xlap_analyze::report::ReportOptions {
                kind: None,
                slowest: 3,
                title: "hostile".into(),
                others: Vec::new(),
            },
        )
        .unwrap();
        // Escaped as every name from data is (xlap_records::escape::xml).
        assert!(
            html.contains("send_start&#39;x") && !html.contains("send_start'x"),
            "the report names the stages, escaped"
        );
        let trace = scratch.path("trace.json");
        let exported = xlap_analyze::perfetto::export(
            &conn,
            &trace,
            &xlap_analyze::perfetto::ExportOptions {
                max_packets: 10,
                kind: None,
            },
        )
        .unwrap();
        assert_eq!(exported.packets, 10);
    }

    // A CI summary measuring a stage its baseline has and it lacks.
    let mut summary = xlap_analyze::summary::Summary::of_run(&dir).unwrap();
    let stage = "app_send_start'x__app_deliver\"y".to_string();
    summary
        .add_stages_of(&dir, std::slice::from_ref(&stage))
        .unwrap();
    assert!(summary.stages.iter().any(|s| s.stage == stage));

    assert!(
        !pwn.exists(),
        "a name ran a statement of its own: {}",
        pwn.display()
    );
}

#[test]
fn a_point_name_that_cannot_be_a_column_is_named_with_its_file() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("unusable");
    let dir = scratch.path("run");
    let stamps: Vec<Stamp> = hostile_stamps()
        .into_iter()
        .filter(|s| s.point < APP || s.point == APP + 1)
        .collect();
    write_run_named(
        &dir,
        &stamps,
        &RunNames {
            run_id: "r",
            host: "h",
            boot_id: "b",
            markers: &["send_start", "del\u{1}iver"],
        },
    );
    let e = xlap_analyze::finish::correlate_dirs(
        &[RunDir::new(&dir)],
        &dir.join("packets.parquet"),
        None,
    )
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains(&dir.join("stamps.parquet").display().to_string()),
        "{e}"
    );
    assert!(e.contains(r#""app.del\u{1}iver""#), "{e}");
    assert!(e.contains("control character U+0001"), "{e}");
    assert!(!dir.join("packets.parquet").exists());
}

/// Packets in flight at a cut (the run's start, its end) are `partial`,
/// not lost, with the points they lack counted; a point missing between
/// packets that have it is no cut: a packet not received mid-run stays
/// lost, one missing a single point mid-run is neither; so does one sent
/// longer before the end than a whole packet takes, and a flow's last
/// datagrams that never arrived, long before the run's end.
#[test]
fn packets_in_flight_at_a_cut_are_partial_not_lost() {
    use xlap_point::*;
    let _guard = xlap_tests::unprivileged();
    let tx = [
        XLAP_POINT_SOCK_SEND_ENTER,
        XLAP_POINT_DEV_QUEUE,
        XLAP_POINT_DEV_START_XMIT,
    ];
    let rx = [
        XLAP_POINT_DEV_NETIF_RX,
        XLAP_POINT_SOCK_QUEUE,
        XLAP_POINT_SOCK_RECV_EXIT,
    ];
    // A packet every 10 µs, its points 3 µs apart (15 µs end to end); the
    // run from between seq 1's send and its queue to between seq 99's
    // queue and its transmit: no stamp outside (the recorder makes none).
    let at = |seq: u64, point: usize| 1_000_000_000 + seq * 10_000 + point as u64 * 3_000;
    let (from, until) = (at(1, 0) + 500, at(99, 1) + 500);
    // Lost mid-run: 40 entirely, 41 at the socket queue; 96 never arrived
    // though it was sent long enough before the end.
    let lost_at = |seq: u64| -> Vec<u32> {
        match seq {
            40 | 96 => rx.to_vec(),
            41 => vec![rx[1]],
            _ => vec![],
        }
    };
    let mut stamps = Vec::new();
    for seq in 0..100u64 {
        for (i, point) in tx.iter().chain(&rx).enumerate() {
            let t = at(seq, i);
            if lost_at(seq).contains(point) || t < from || t > until {
                continue;
            }
            let (flow, pid) = match (i < 3, *point == XLAP_POINT_SOCK_RECV_EXIT) {
                (true, _) => (FLOW, SENDER),
                (false, true) => (0, RECEIVER),
                (false, false) => (FLOW, RECEIVER),
            };
            stamps.push(stamp(*point as u16, t, seq, flow, pid));
        }
    }
    // A second flow, early in the run, to another receiver: its last
    // three datagrams never arrived, long before the run ended.
    let flow2 = FLOW + 2; // to port 9002
    for seq in 0..20u64 {
        for (i, point) in tx.iter().chain(&rx).enumerate() {
            if i >= 3 && seq >= 17 {
                break;
            }
            let (flow, pid) = match (i < 3, *point == XLAP_POINT_SOCK_RECV_EXIT) {
                (true, _) => (flow2, SENDER),
                (false, true) => (0, RECEIVER + 1),
                (false, false) => (flow2, RECEIVER + 1),
            };
            stamps.push(stamp(*point as u16, at(seq + 10, i) + 500, seq, flow, pid));
        }
    }
    let scratch = Scratch::new("synthetic-cuts");
    let dir = scratch.path("run");
    write_run(&dir, &stamps);
    // The run's window, as the recorder writes it.
    let meta_path = dir.join("run.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
    meta["window"] = serde_json::json!({"from_ns": from, "until_ns": until});
    std::fs::write(&meta_path, meta.to_string()).unwrap();
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let c = correlate(
        &conn,
        &[Run::open(&RunDir::new(&dir)).unwrap()],
        &CorrelateOptions::default(),
        None,
    )
    .unwrap();
    let seqs = |flow: u64, flag: &str| -> Vec<i64> {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT seq::BIGINT FROM packets WHERE flow = {flow} AND {flag} ORDER BY seq"
            ))
            .unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<Result<Vec<_>, _>>().unwrap()
    };
    assert_eq!(seqs(FLOW, "partial"), vec![0, 1, 98, 99]);
    assert_eq!(seqs(FLOW, "lost"), vec![40, 96]);
    assert_eq!(seqs(flow2, "partial"), Vec::<i64>::new());
    assert_eq!(seqs(flow2, "lost"), vec![17, 18, 19]);
    for flow in [FLOW, flow2] {
        assert_eq!(
            seqs(flow, "NOT partial AND NOT lost AND e2e_ns IS NULL"),
            Vec::<i64>::new()
        );
    }
    assert_eq!((c.partial, c.lost), (4, 5));
    let lacking: Vec<(&str, u64)> = c
        .partial_lacking
        .iter()
        .map(|(p, n)| (p.as_str(), *n))
        .collect();
    assert_eq!(
        lacking,
        vec![
            ("dev_netif_rx_ns", 2),
            ("dev_queue_ns", 1),
            ("dev_start_xmit_ns", 2),
            ("sock_queue_ns", 1),
            ("sock_recv_exit_ns", 2),
            ("sock_send_enter_ns", 2),
        ]
    );
    // No end-to-end latency for a partial packet, nor the total of the
    // side it lacks a point of; the other side's total stays.
    let totals = |seq: u64| -> (Option<i64>, Option<i64>, Option<i64>) {
        conn.query_row(
            &format!(
                "SELECT sender_total_ns, receiver_total_ns, e2e_ns FROM packets WHERE flow = {FLOW} AND seq = {seq}"
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    };
    assert_eq!(totals(1), (None, Some(6_000), None));
    assert_eq!(totals(98), (Some(6_000), None, None));
    assert_eq!(totals(50), (Some(6_000), Some(6_000), Some(15_000)));
}
