//! Privileged: a run that ends (or rotates) while its protocol sends 2 850
//! datagrams/s, with its tracepoint programs detached 60 ms apart on
//! purpose (`XLAP_TEST_DETACH_PAUSE_MS`: the hooks used to stop one after
//! another, and that order decided which points stamped the last packets),
//! checked against tcpdump's capture of the link and the protocol's logs:
//!
//! - per point, every stamp's seq is a datagram tcpdump saw on the wire
//!   within 50 ms of the stamp, never more stamps of it than copies on the
//!   wire (a transmit point reading an earlier skb's identity stamped one
//!   seq ten times);
//! - no stamp lies outside the run's window (run.json `window`);
//! - every packet row has every point of its path, or is flagged `partial`
//!   (in flight at a cut: its seq was on the wire near one) or `lost`
//!   (never one the receiver logged); none lacks its end-to-end latency
//!   unflagged;
//! - packets.json's and the `loss` query's counts are the rows' flags.

use duckdb::Connection;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use xlap_records::run_meta::RunMeta;
use xlap_stage::Stage;
use xlap_tests::example::{events, kind_code, ExampleOptions, ProtocolRun, RECEIVER_PORT};
use xlap_tests::pcap::{self, Datagram};
use xlap_tests::trace::{analyze_rows, read_stamps, run_meta, segment_dirs, traced, Recorder};
use xlap_tests::{bin, privileged, Scratch};

/// 2 857 datagrams/s for 5 s: the run ends (and rotates) while they go.
const PERIOD_US: u64 = 350;
const COUNT: u32 = 14_000;
/// Between detaching each tracepoint program.
const DETACH_PAUSE_MS: &str = "60";
/// How far a stamp may lie from its datagram's time on the wire.
const WIRE_SLACK_NS: i64 = 50_000_000;
/// How near a cut a partial packet's datagram was on the wire.
const CUT_SLACK_NS: i64 = 300_000_000;

/// The points of a data packet's path on the stage's veth.
const PATH: &[&str] = &[
    "sock.send_enter",
    "dev.queue",
    "dev.start_xmit",
    "dev.xmit",
    "sock.send_exit",
    "dev.netif_rx",
    "dev.receive_skb",
    "sock.queue",
    "sock.recv_exit",
];

#[test]
fn a_run_ends_at_one_instant_for_every_point() {
    let Some(_guard) = privileged("run_end") else {
        return;
    };
    ended_mid_send("run-end", &["--duration", "2"]);
}

#[test]
fn a_rotation_cuts_at_one_instant_for_every_point() {
    let Some(_guard) = privileged("run_end_rotation") else {
        return;
    };
    ended_mid_send("run-end-rotation", &["--duration", "3.2", "--rotate", "1s"]);
}

/// The protocol sending through the stage while `record` with `args` runs
/// and ends; every run directory it wrote (the run, or each segment and the
/// whole) checked against the wire and the logs.
fn ended_mid_send(name: &str, args: &[&str]) {
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new(name);
    let receiver_host = stage.host(1);
    let wire = pcap::Capture::start(
        &receiver_host.netns,
        &receiver_host.wire_ifname,
        &scratch.path("wire.pcap"),
    );
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: COUNT,
            period_us: PERIOD_US,
            gated: true,
            ..Default::default()
        },
    );
    let pids = run.pids();
    let dir = scratch.path("run");
    let mut record_args = vec!["--quiet"];
    record_args.extend_from_slice(args);
    let rec = Recorder::start_env(
        &bin("xlap-trace"),
        &[pids.0, pids.1],
        &dir,
        &record_args,
        &[("XLAP_TEST_DETACH_PAUSE_MS", DETACH_PAUSE_MS)],
    );
    run.start();
    rec.wait();
    let (_sent, received) = run.wait();
    let on_wire = wire.stop();
    let wire = Wire::of(&on_wire);
    let delivered: std::collections::HashSet<u64> = events(&received, "received")
        .filter(|e| e["kind"] == "data")
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(
        wire.data.len() as u32,
        COUNT,
        "data datagrams tcpdump saw on the link, of those the sender sent"
    );
    let runs: Vec<PathBuf> = if dir.join("segments.json").exists() {
        let segs = segment_dirs(&dir);
        assert!(segs.len() >= 3, "segments: {segs:?}");
        segs
    } else {
        vec![dir.clone()]
    };
    for run_dir in &runs {
        let meta = run_meta(run_dir);
        check_stamps(run_dir, &meta, &wire);
        check_packets(run_dir, &meta, &wire, &delivered, &scratch);
    }
}

/// Each data datagram's times on the wire, by seq (CLOCK_REALTIME ns).
struct Wire {
    data: HashMap<u64, Vec<u64>>,
}

impl Wire {
    fn of(datagrams: &[Datagram]) -> Wire {
        let data_kind = kind_code("data");
        let mut data: HashMap<u64, Vec<u64>> = HashMap::new();
        for d in datagrams.iter().filter(|d| d.dst_port == RECEIVER_PORT) {
            let Ok((header, _)) = prrt_lite::wire::Header::decode(&d.payload) else {
                continue;
            };
            if header.kind as u32 == data_kind {
                data.entry(u64::from(header.seq))
                    .or_default()
                    .push(d.realtime_ns);
            }
        }
        Wire { data }
    }
}

/// CLOCK_REALTIME ns → the run's CLOCK_MONOTONIC ns.
fn to_monotonic(meta: &RunMeta, realtime_ns: u64) -> i64 {
    let c = meta.clock_start;
    realtime_ns as i64 - (c.realtime_ns as i64 - c.monotonic_ns as i64)
}

/// Per point: every data stamp a datagram on the wire then, at most as
/// many as its copies; none outside the run's window.
fn check_stamps(dir: &Path, meta: &RunMeta, wire: &Wire) {
    let window = meta.window.expect("run.json has the run's window");
    let until = window.until_ns.expect("a finished run's window has an end");
    let rows = read_stamps(&dir.join("stamps.parquet"));
    let outside: Vec<_> = rows
        .iter()
        .filter(|r| r.ts_ns < window.from_ns as i64 || r.ts_ns > until as i64)
        .collect();
    assert!(
        outside.is_empty(),
        "{}: {} stamps outside the window {}..{until}, e.g. {:?}",
        dir.display(),
        outside.len(),
        window.from_ns,
        outside.first()
    );
    let data_kind = kind_code("data");
    eprintln!(
        "{}: point            stamps  distinct  not-on-wire  off-time  beyond-copies",
        dir.display()
    );
    let mut bad = Vec::new();
    for point in traced(meta, PATH) {
        let mut per_seq: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        for r in rows.iter().filter(|r| {
            r.point == point
                && !r.fragment
                && r.kind == Some(data_kind)
                && (r.dport() == RECEIVER_PORT || r.flow == 0)
        }) {
            per_seq
                .entry(r.seq.expect("a data stamp has its seq"))
                .or_default()
                .push(r.ts_ns);
        }
        let stamps: usize = per_seq.values().map(Vec::len).sum();
        let (mut not_on_wire, mut off_time, mut beyond) = (0, 0, 0);
        for (seq, times) in &per_seq {
            let Some(on_wire) = wire.data.get(seq) else {
                not_on_wire += times.len();
                continue;
            };
            beyond += times.len().saturating_sub(on_wire.len());
            for t in times {
                let nearest = on_wire
                    .iter()
                    .map(|w| (to_monotonic(meta, *w) - t).abs())
                    .min()
                    .unwrap();
                if nearest > WIRE_SLACK_NS {
                    off_time += 1;
                }
            }
        }
        eprintln!(
            "  {point:<18} {stamps:>7} {:>9} {not_on_wire:>12} {off_time:>9} {beyond:>14}",
            per_seq.len()
        );
        if not_on_wire + off_time + beyond > 0 {
            bad.push(point);
        }
    }
    assert!(
        bad.is_empty(),
        "{}: stamps under a seq not on the wire then, or beyond its copies, at {bad:?}",
        dir.display()
    );
}

/// Every data row complete or flagged; partial rows in flight at a cut;
/// no lost row the receiver logged; the counts said equal the flags.
fn check_packets(
    dir: &Path,
    meta: &RunMeta,
    wire: &Wire,
    delivered: &std::collections::HashSet<u64>,
    scratch: &Scratch,
) {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let packets = scratch.path(&format!("{name}.packets.parquet"));
    let out = Command::new(bin("xlap-trace"))
        .arg("correlate")
        .arg(dir)
        .arg("-o")
        .arg(&packets)
        .output()
        .expect("xlap-trace correlate");
    assert!(
        out.status.success(),
        "correlate {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(packets.with_extension("json")).unwrap())
            .unwrap();
    let conn = Connection::open_in_memory().unwrap();
    let columns: Vec<String> = {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT name FROM parquet_schema('{}')",
                packets.display()
            ))
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let path: Vec<String> = traced(meta, PATH)
        .iter()
        .map(|p| format!("{}_ns", p.replace('.', "_")))
        .filter(|c| columns.contains(c))
        .collect();
    assert!(path.len() >= 6, "path columns {path:?} of {columns:?}");
    let complete = path
        .iter()
        .map(|c| format!("{c} IS NOT NULL"))
        .collect::<Vec<_>>()
        .join(" AND ");
    let mut stmt = conn
        .prepare(&format!(
            "SELECT seq::UBIGINT, lost, partial, untraced, e2e_ns IS NOT NULL, {complete}
             FROM read_parquet('{}') WHERE kind = {}",
            packets.display(),
            kind_code("data")
        ))
        .unwrap();
    let rows: Vec<(u64, bool, bool, bool, bool, bool)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let window = meta.window.unwrap();
    let cuts = [window.from_ns as i64, window.until_ns.unwrap() as i64];
    let near_cut = |seq: u64| {
        wire.data.get(&seq).is_some_and(|times| {
            times.iter().any(|w| {
                let t = to_monotonic(meta, *w);
                cuts.iter().any(|c| (t - c).abs() <= CUT_SLACK_NS)
            })
        })
    };
    let (mut whole, mut partial, mut lost) = (0, 0, 0);
    let mut unflagged_incomplete = Vec::new();
    let mut unflagged_without_e2e = Vec::new();
    let mut partial_mid_run = Vec::new();
    let mut lost_but_delivered = Vec::new();
    for &(seq, is_lost, is_partial, is_untraced, has_e2e, is_complete) in &rows {
        let flagged = is_lost || is_partial || is_untraced;
        whole += usize::from(is_complete && has_e2e && !flagged);
        partial += usize::from(is_partial);
        lost += usize::from(is_lost);
        if !flagged && !is_complete {
            unflagged_incomplete.push(seq);
        }
        if !flagged && !has_e2e {
            unflagged_without_e2e.push(seq);
        }
        if is_partial && !near_cut(seq) {
            partial_mid_run.push(seq);
        }
        if is_lost && delivered.contains(&seq) {
            lost_but_delivered.push(seq);
        }
    }
    eprintln!(
        "{}: data rows {}, whole {whole}, partial {partial}, lost {lost}, unflagged incomplete {}, unflagged without e2e {}",
        dir.display(),
        rows.len(),
        unflagged_incomplete.len(),
        unflagged_without_e2e.len()
    );
    assert!(
        unflagged_incomplete.is_empty() && unflagged_without_e2e.is_empty(),
        "{}: rows lacking points of {path:?} or their e2e without a flag: {unflagged_incomplete:?} {unflagged_without_e2e:?}",
        dir.display()
    );
    assert!(
        partial_mid_run.is_empty(),
        "{}: partial rows whose datagram was on the wire far from a cut: {partial_mid_run:?}",
        dir.display()
    );
    assert!(
        lost_but_delivered.is_empty(),
        "{}: rows lost that the receiver logged: {lost_but_delivered:?}",
        dir.display()
    );
    assert!(
        whole > 1000,
        "{}: only {whole} whole data rows",
        dir.display()
    );
    // The counts said: every kind's rows, as the flags have them.
    let flagged: (i64, i64) = conn
        .query_row(
            &format!(
                "SELECT count(*) FILTER (WHERE partial), count(*) FILTER (WHERE lost) FROM read_parquet('{}')",
                packets.display()
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(summary["partial"].as_i64(), Some(flagged.0), "{summary}");
    assert_eq!(summary["lost"].as_i64(), Some(flagged.1), "{summary}");
    let loss = analyze_rows(dir, "loss", &["--kind", "data"]);
    let said = |measure: &str| {
        loss.iter()
            .filter(|r| r["scope"] == "protocol" && r["measure"] == measure)
            .map(|r| r["value"].as_i64().unwrap())
            .sum::<i64>()
    };
    assert_eq!(said("partial"), partial as i64, "loss query: {loss:?}");
    assert_eq!(said("lost"), lost as i64, "loss query: {loss:?}");
}
