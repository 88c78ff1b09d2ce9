//! Privileged: long recordings cut into segments (`--rotate`), each a run
//! directory readable on its own, kept within a disk budget
//! (`--max-size`); checked against the example protocol's own logs: every
//! datagram the sender logged is stamped exactly once across the segments,
//! every one the receiver logged read once; the budget measured on disk by
//! the test, not taken from the tool's index.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use xlap_records::run_meta::RunState;
use xlap_stage::Stage;
use xlap_tests::example::{ExampleOptions, ProtocolRun};
use xlap_tests::multiset::{assert_same, logged, logged_where, stamped, Multiset};
use xlap_tests::trace::{read_stamps, run_meta, segment_dirs, Recorder, Row};
use xlap_tests::{bin, bytes_under, monotonic_ns, privileged, Scratch};

/// `segments.json`.
fn index(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("segments.json")).expect("segments.json");
    serde_json::from_str(&text).expect("JSON")
}

/// The example protocol on the stage, gated, `count` data datagrams one
/// per `period_us` (ports moved by `port_offset`).
fn protocol(
    stage: &Stage,
    scratch: &Scratch,
    count: u32,
    period_us: u64,
    port_offset: u16,
) -> ProtocolRun {
    ProtocolRun::spawn(
        stage,
        scratch,
        &ExampleOptions {
            count,
            period_us,
            gated: true,
            port_offset,
            ..Default::default()
        },
    )
}

fn sum(parts: impl Iterator<Item = Multiset>) -> Multiset {
    let mut all = Multiset::new();
    for part in parts {
        for (k, n) in part {
            *all.entry(k).or_default() += n;
        }
    }
    all
}

#[test]
fn a_rotated_recording_is_segments_each_a_run_with_every_datagram_once() {
    let Some(_guard) = privileged("rotation") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("rotation");
    let run = protocol(&stage, &scratch, 7000, 1000, 0);
    let pids = run.pids();
    let dir = scratch.path("run");
    let rec = Recorder::start(&[pids.0, pids.1], &dir, &["--rotate", "2s", "-q"]);
    run.start();
    let (sent, received) = run.wait();
    rec.wait();

    let idx = index(&dir);
    let segments = idx["segments"].as_array().expect("segments");
    assert!(segments.len() >= 3, "7 s in 2 s segments: {idx}");
    let dirs = segment_dirs(&dir);
    assert_eq!(dirs.len(), segments.len(), "one directory per segment");
    let mut rows_per_segment: Vec<Vec<Row>> = Vec::new();
    let mut run_ids = BTreeSet::new();
    let mut tables = 0;
    for (entry, seg) in segments.iter().zip(&dirs) {
        assert_eq!(entry["state"], "complete", "{idx}");
        assert_eq!(seg.file_name().unwrap(), entry["dir"].as_str().unwrap());
        let meta = run_meta(seg);
        assert_eq!(meta.state, RunState::Complete);
        assert!(run_ids.insert(meta.run_id.clone()));
        assert!(!seg.join("stamps.arrows").exists(), "live stream left");
        let rows = read_stamps(&seg.join("stamps.parquet"));
        assert_eq!(meta.stamps, rows.len() as u64);
        // The flow table is read for every segment, not only at the end.
        assert!(
            rows.iter()
                .filter(|r| r.point == "sock.send_enter")
                .all(|r| r.src_addr.is_some()),
            "a send stamp without its flow's addresses in {}",
            seg.display()
        );
        // Each segment is a run of its own: its packets table and summary
        // built unless the finisher was behind (then the index says so),
        // and the analysis reads it either way.
        let table = seg.join("packets.parquet").is_file();
        assert_eq!(entry["packets_table"], table, "{idx}");
        assert_eq!(seg.join("summary.json").is_file(), table);
        if table {
            tables += 1;
        } else {
            let why = entry["packets_table_missing"].as_str().unwrap_or_default();
            assert!(why.contains("a later segment was waiting"), "{idx}");
        }
        let out = Command::new(bin("xlap-trace"))
            .arg("analyze")
            .arg(seg)
            .args(["-q", "summary", "-f", "json", "--quiet"])
            .output()
            .expect("analyze");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        rows_per_segment.push(rows);
    }
    // A segment every 2 s of 1000 datagrams/s: the finisher keeps up.
    assert!(2 * tables >= segments.len(), "packets tables: {idx}");
    assert_eq!(segments.last().unwrap()["packets_table"], true);
    assert_eq!(
        segments.last().unwrap()["dir"],
        format!("seg-{:06}", segments.len())
    );

    // Against the protocol's own account: every datagram sent stamped once
    // over all segments, every one received read once.
    let sent_stamps = sum(rows_per_segment
        .iter()
        .map(|rows| stamped(rows, "sock.send_enter", pids.0)));
    assert_same(
        &sent_stamps,
        &logged(&sent, "sent"),
        "sent, over the segments",
    );
    let read = sum(rows_per_segment
        .iter()
        .map(|rows| stamped(rows, "sock.recv_exit", pids.1)));
    assert_same(
        &read,
        &logged(&received, "received"),
        "read, over the segments",
    );
    // The segments follow each other in time.
    let spans: Vec<(i64, i64)> = rows_per_segment
        .iter()
        .map(|rows| {
            let ts = rows.iter().map(|r| r.ts_ns);
            (ts.clone().min().unwrap(), ts.max().unwrap())
        })
        .collect();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0 + 1_000_000_000, "{spans:?}");
        assert!(pair[0].0 < pair[1].0, "{spans:?}");
    }

    // The recording's directory reads as one run: every data datagram the
    // receiver logged is one packet with both ends, those in flight at a
    // cut too (their stamps in two segments).
    let out = Command::new(bin("xlap-trace"))
        .arg("sql")
        .arg(&dir)
        .arg("SELECT seq, kind FROM packets WHERE kind = 1 AND sock_send_enter_ns IS NOT NULL AND sock_recv_exit_ns IS NOT NULL")
        .args(["-f", "json"])
        .output()
        .expect("xlap-trace sql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON rows");
    let mut whole = Multiset::new();
    for r in &rows {
        *whole
            .entry((
                r["seq"].as_u64().unwrap(),
                r["kind"].as_u64().unwrap() as u32,
            ))
            .or_default() += 1;
    }
    let data_received: Multiset = logged(&received, "received")
        .into_iter()
        .filter(|((_, kind), _)| *kind == 1)
        .collect();
    assert_same(&whole, &data_received, "the whole recording's packets");
}

#[test]
fn max_size_keeps_a_rotated_recording_within_its_budget_and_stops_one_that_is_not() {
    let Some(_guard) = privileged("rotation") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("rotation-budget");
    // ~10 k datagrams/s for 6 s: several MB of stream at every point.
    let run = protocol(&stage, &scratch, 60_000, 100, 0);
    let pids = run.pids();
    let dir = scratch.path("run");
    let budget: u64 = 4 << 20;
    let rec = Recorder::start(
        &[pids.0, pids.1],
        &dir,
        &["--rotate", "1MiB", "--max-size", "4MiB", "-q"],
    );
    run.start();
    let (sent, _received) = run.wait();
    rec.wait();

    let on_disk = bytes_under(&dir);
    let idx = index(&dir);
    let segments = idx["segments"].as_array().expect("segments");
    let deleted: Vec<&serde_json::Value> = segments
        .iter()
        .filter(|s| s["state"] == "deleted")
        .collect();
    assert!(!deleted.is_empty(), "nothing deleted: {idx}");
    // segments.json itself is not a segment's.
    let index_bytes = std::fs::metadata(dir.join("segments.json")).unwrap().len();
    assert!(
        on_disk - index_bytes <= budget,
        "{on_disk} bytes on disk for a budget of {budget}: {idx}"
    );
    // The oldest finished segments went, the newest stayed; a segment
    // still waiting for a finisher that fell behind may go too, and the
    // index says so.
    let kept: Vec<&serde_json::Value> = segments
        .iter()
        .filter(|s| s["state"] != "deleted")
        .collect();
    let first_kept = kept[0]["index"].as_u64().unwrap();
    for d in &deleted {
        assert!(!dir.join(d["dir"].as_str().unwrap()).exists());
        match d["error"].as_str() {
            None => assert!(d["index"].as_u64().unwrap() < first_kept, "{idx}"),
            Some(why) => assert!(why.contains("before it was finished"), "{idx}"),
        }
    }
    assert_eq!(segment_dirs(&dir).len(), kept.len());
    assert_eq!(kept.last().unwrap()["index"], segments.len() as u64);
    // What is kept after the last deletion is the end of the protocol's
    // log: every datagram the sender logged after that segment began
    // (stamps taken before a cut but read after it fall into the next
    // segment, never the other way) is in the kept segments, once.
    let last_deleted = deleted
        .iter()
        .map(|d| d["index"].as_u64().unwrap())
        .max()
        .unwrap();
    let tail_dirs: Vec<std::path::PathBuf> = kept
        .iter()
        .filter(|s| s["index"].as_u64().unwrap() > last_deleted)
        .map(|s| dir.join(s["dir"].as_str().unwrap()))
        .collect();
    let rows: Vec<Vec<Row>> = tail_dirs
        .iter()
        .map(|d| read_stamps(&d.join("stamps.parquet")))
        .collect();
    let kept_from = run_meta(&tail_dirs[0]).clock_start.monotonic_ns as i64;
    let expected = logged_where(&sent, "sent", |e| {
        e["t_start_ns"].as_i64().is_some_and(|t| t > kept_from)
    });
    assert!(
        expected.len() > 1000,
        "{} datagrams in the kept tail",
        expected.len()
    );
    let stamped_tail = sum(rows.iter().map(|r| stamped(r, "sock.send_enter", pids.0)));
    let stamped_tail: Multiset = stamped_tail
        .into_iter()
        .filter(|(k, _)| expected.contains_key(k))
        .collect();
    assert_same(&stamped_tail, &expected, "the kept tail");

    // Without --rotate the budget ends the run cleanly.
    let run = protocol(&stage, &scratch, 60_000, 100, 10);
    let pids = run.pids();
    let dir = scratch.path("stopped");
    let rec = Recorder::start(&[pids.0, pids.1], &dir, &["--max-size", "1MiB", "-q"]);
    run.start();
    let meta = rec.meta_after_wait();
    let (sent, _) = run.wait();
    assert_eq!(meta.state, RunState::Complete);
    assert_eq!(meta.stop_reason, "max-size");
    let stream = std::fs::metadata(dir.join("stamps.arrows")).unwrap().len();
    assert!(
        (1 << 20..2 << 20).contains(&stream),
        "stream of {stream} bytes"
    );
    assert!(
        logged(&sent, "sent").len() as u64 > meta.packets,
        "the run stopped before the protocol did"
    );
}

#[test]
fn a_rotated_recording_whose_recorder_dies_is_recovered_segment_by_segment() {
    let Some(_guard) = privileged("rotation") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("rotation-crash");
    let run = protocol(&stage, &scratch, 8000, 1000, 0);
    let pids = run.pids();
    let dir = scratch.path("run");
    let mut rec = Recorder::start(&[pids.0, pids.1], &dir, &["--rotate", "2s", "-q"]);
    run.start();
    std::thread::sleep(std::time::Duration::from_millis(5500));
    let killed_at = monotonic_ns();
    rec.child.kill().expect("SIGKILL the recorder");
    assert!(!rec.child.wait().unwrap().success());
    let (sent, _) = run.wait();

    // `recover DIR` takes up the segments the recorder left running.
    let out = Command::new(bin("xlap-trace"))
        .arg("recover")
        .arg(&dir)
        .output()
        .expect("xlap-trace recover");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("recovered"), "{stdout}{stderr}");
    let idx = index(&dir);
    let segments = idx["segments"].as_array().unwrap();
    assert!(segments.len() >= 3, "{idx}");
    assert!(segments.iter().any(|s| s["state"] == "recovered"), "{idx}");
    let dirs = segment_dirs(&dir);
    let mut rows = Vec::new();
    for (seg, entry) in dirs.iter().zip(segments) {
        let meta = run_meta(seg);
        assert!(
            matches!(meta.state, RunState::Complete | RunState::Recovered),
            "{}: {:?}",
            seg.display(),
            meta.state
        );
        assert!(
            ["complete", "recovered"].contains(&entry["state"].as_str().unwrap()),
            "{idx}"
        );
        let r = read_stamps(&seg.join("stamps.parquet"));
        assert_eq!(meta.stamps, r.len() as u64);
        rows.push(r);
    }
    // Against the sender's log: what it sent up to a second before the
    // kill is stamped, once, in one segment or another.
    let expected = logged_where(&sent, "sent", |e| {
        e["t_ns"]
            .as_i64()
            .is_some_and(|t| t < killed_at - 1_000_000_000)
    });
    assert!(
        expected.len() > 3000,
        "{} sent before the kill",
        expected.len()
    );
    let stamped_all = sum(rows.iter().map(|r| stamped(r, "sock.send_enter", pids.0)));
    let early_stamped: Multiset = stamped_all
        .into_iter()
        .filter(|(k, _)| expected.contains_key(k))
        .collect();
    assert_same(
        &early_stamped,
        &expected,
        "sent before the kill, over the segments",
    );
}
