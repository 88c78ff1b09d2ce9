//! Privileged: `xlap-trace record` on the stage against the example protocol
//! without markers (the kernel-only path), checked against the protocol's
//! own logs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use xlap_stage::{Qdisc, Stage, StageConfig};
use xlap_tests::example::{
    events, summary, ExampleOptions, ProtocolRun, RECEIVER_PORT, SENDER_PORT,
};
use xlap_tests::kernel_drops::Drops;
use xlap_tests::trace::{read_stamps, run_meta, trace_example, traced, Recorder, Row};
use xlap_tests::{bin, privileged, KillOnDrop, Scratch};

const TX_POINTS: &[&str] = &[
    "sock.send_enter",
    "dev.queue",
    "qdisc.enqueue",
    "qdisc.dequeue",
    "dev.start_xmit",
    "dev.xmit",
    "sock.send_exit",
];
const RX_POINTS: &[&str] = &[
    "dev.netif_rx",
    "dev.receive_skb",
    "sock.queue",
    "sock.recv_exit",
];
const DATA: u32 = 1;

fn stage_with_tbf_on_sender() -> Stage {
    Stage::build(&StageConfig {
        hosts: 2,
        qdiscs: vec![Some(Qdisc::parse("tbf").unwrap()), None],
        ..Default::default()
    })
    .expect("stage")
}

/// Stamps of data packets from sender to receiver, by seq: point -> ts.
fn data_packets(rows: &[Row]) -> BTreeMap<u64, HashMap<String, i64>> {
    let mut out: BTreeMap<u64, HashMap<String, i64>> = BTreeMap::new();
    for r in rows {
        let (Some(seq), Some(DATA)) = (r.seq, r.kind) else {
            continue;
        };
        // recv_exit stamps carry no flow: the receiver's pid places them.
        let data_direction =
            (r.sport() == SENDER_PORT && r.dport() == RECEIVER_PORT) || (r.flow == 0);
        if data_direction {
            out.entry(seq)
                .or_default()
                .entry(r.point.clone())
                .or_insert(r.ts_ns);
        }
    }
    out
}

/// The datagrams a receive point saw (`seen`) against those both hosts
/// put on the wire (`sent`). The receiver goes on sending feedback until it
/// has read everything; a slow one (an emulated guest, 10 s behind) sends
/// the last after the sender has exited. Those reach a port no traced
/// socket holds, rightly unstamped (the packets mark them lost); the
/// sender's host counts each in `Udp: NoPorts` (`late`), so at most that
/// many may be missing, and none when the sender outlived them.
fn assert_received(seen: u64, sent: u64, late: u64) {
    assert!(
        seen <= sent && seen + late >= sent,
        "{seen} stamped at a receive point, {sent} on the wire, \
         {late} of them to the sender's closed port"
    );
}

#[test]
fn every_delivered_packet_has_every_kernel_point_in_causal_order() {
    let Some(_guard) = privileged("kernel_points") else {
        return;
    };
    let stage = stage_with_tbf_on_sender();
    let sender_host_before = Drops::now(stage.host(0));
    // The protocol is already running (sockets open) when tracing starts.
    let t = trace_example(
        &stage,
        "kpoints",
        &ExampleOptions {
            count: 10_000,
            period_us: 100,
            drop: 0.01,
            ..Default::default()
        },
        &[],
    );
    let ((sender_pid, receiver_pid), sent, received, meta) =
        (t.pids, &t.sent, &t.received, &t.meta);
    assert_eq!(meta.stop_reason, "targets exited");
    assert_eq!(meta.lost, 0, "loss counters: {:?}", meta.points);
    let rows = t.stamps();
    assert!(
        rows.iter()
            .all(|r| r.pid == sender_pid || r.pid == receiver_pid),
        "stamps of other processes"
    );

    // Packets that crossed the wire and were delivered (not rebuilt).
    let delivered: BTreeSet<u64> = events(received, "delivered")
        .filter(|e| e["recovered"] == false)
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(delivered.len() > 9_700, "{} delivered", delivered.len());
    let packets = data_packets(&rows);
    let expected = traced(meta, &[TX_POINTS, RX_POINTS].concat());
    let complete = delivered
        .iter()
        .filter(|seq| {
            packets
                .get(seq)
                .is_some_and(|p| expected.iter().all(|pt| p.contains_key(*pt)))
        })
        .count();
    assert!(
        complete * 1000 >= delivered.len() * 999,
        "{complete} of {} delivered packets have every point",
        delivered.len()
    );

    // Causal order along the path, per packet.
    let chains: &[&[&str]] = &[
        &[
            "sock.send_enter",
            "dev.queue",
            "qdisc.enqueue",
            "qdisc.dequeue",
            "dev.start_xmit",
            "dev.xmit",
        ],
        // With a queueing qdisc the driver may run after the send call
        // returned (tbf's watchdog): send_exit follows dev.queue only.
        &["dev.queue", "sock.send_exit"],
        &[
            "dev.start_xmit",
            "dev.netif_rx",
            "dev.receive_skb",
            "sock.queue",
            "sock.recv_exit",
        ],
        &[
            "sock.queue",
            "sched.wakeup",
            "sched.switch_in",
            "sock.recv_exit",
        ],
    ];
    for (seq, p) in &packets {
        for chain in chains {
            let times: Vec<(&str, i64)> = chain
                .iter()
                .filter_map(|pt| p.get(*pt).map(|t| (*pt, *t)))
                .collect();
            for w in times.windows(2) {
                assert!(
                    w[0].1 <= w[1].1,
                    "seq {seq}: {} after {}: {p:?}",
                    w[0].0,
                    w[1].0
                );
            }
        }
    }

    // The counts per point match what the protocol says went over the wire.
    let on_wire = events(sent, "sent")
        .filter(|e| e["dropped"] == false)
        .count() as u64;
    let feedback = summary(received)["feedback_sent"].as_u64().unwrap();
    let points = &meta.points;
    assert_eq!(points["dev.queue"].stamps, on_wire + feedback);
    assert_eq!(
        points["qdisc.enqueue"].stamps, on_wire,
        "tbf is on the sender's link only"
    );
    let late = Drops::now(stage.host(0)).since(&sender_host_before).no_port;
    assert_received(points["dev.netif_rx"].stamps, on_wire + feedback, late);
    // Ground truth for the text output: a pid that exited ends the run with
    // its data kept.
    assert!(t.run_dir().join("stamps.arrows").exists());
}

#[test]
fn unrelated_udp_traffic_leaves_no_stamps() {
    let Some(_guard) = privileged("unrelated_traffic") else {
        return;
    };
    if std::process::Command::new("iperf3")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("iperf3 is missing: ./run.sh setup installs it");
    }
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("unrelated");
    let (a, b) = (stage.host(0), stage.host(1));
    let mut server = KillOnDrop(
        b.command("iperf3")
            .args(["-s", "-1", "-p", "5301", "-B", &b.ipv4.to_string()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: 2_000,
            period_us: 500,
            gated: true,
            ..Default::default()
        },
    );
    let (s, r) = run.pids();
    let rec = Recorder::start(&[s, r], &scratch.path("run"), &[]);
    run.start();
    let client = a
        .command("iperf3")
        .args([
            "-c",
            &b.ipv4.to_string(),
            "-p",
            "5301",
            "-u",
            "-b",
            "20M",
            "-t",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        client.status.success(),
        "iperf3: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&client.stdout).unwrap();
    assert!(
        report["end"]["sum"]["packets"].as_u64().unwrap() > 1000,
        "iperf3 sent traffic"
    );
    let _ = server.0.wait();
    run.wait();
    let meta = rec.meta_after_wait();
    let rows = read_stamps(&scratch.path("run").join("stamps.parquet"));
    assert!(!rows.is_empty());
    for row in rows.iter().filter(|r| r.flow != 0) {
        let ports = [row.sport(), row.dport()];
        assert!(
            ports.contains(&SENDER_PORT) && ports.contains(&RECEIVER_PORT),
            "stamp of a foreign flow: {row:?}"
        );
    }
    assert_eq!(meta.lost, 0);
}

#[test]
fn a_full_ring_buffer_is_counted_exactly() {
    let Some(_guard) = privileged("ringbuf_overflow") else {
        return;
    };
    let stage = stage_with_tbf_on_sender();
    let sender_host_before = Drops::now(stage.host(0));
    // One page of ring buffer: ~70 stamps.
    let t = trace_example(
        &stage,
        "overflow",
        &ExampleOptions {
            count: 20_000,
            period_us: 10,
            ..Default::default()
        },
        &["--ringbuf-kib", "4"],
    );
    let (sent, received, meta) = (&t.sent, &t.received, &t.meta);
    let points = &meta.points;
    let lost: u64 = meta.lost;
    assert!(
        lost > 0,
        "a 4 KiB ring buffer at 100k packets/s must overflow"
    );
    let on_wire = events(sent, "sent")
        .filter(|e| e["dropped"] == false)
        .count() as u64;
    let feedback = summary(received)["feedback_sent"].as_u64().unwrap();
    let seen = |p: &str| {
        points
            .get(p)
            .map_or(0, |p| p.stamps + p.lost("ringbuf_full"))
    };
    // Every packet on the wire is either stamped or counted as lost.
    assert_eq!(seen("dev.queue"), on_wire + feedback);
    assert_eq!(seen("dev.start_xmit"), on_wire + feedback);
    let late = Drops::now(stage.host(0)).since(&sender_host_before).no_port;
    assert_received(seen("dev.receive_skb"), on_wire + feedback, late);
    assert_eq!(seen("qdisc.enqueue"), on_wire);
    // And the Parquet has exactly the stamps run.json counts.
    let rows = t.stamps();
    assert_eq!(rows.len() as u64, meta.stamps);
}

/// A layout that keys nothing: every datagram counted as a parse loss at
/// every point, said while recording, and the run ends with exit 2 (a bad
/// layout, not an empty success), its files written.
#[test]
fn a_seq_offset_beyond_the_packet_is_counted_as_parse_failures_and_warned() {
    let Some(_guard) = privileged("seq_offset_beyond") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("badoffset");
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: 200,
            period_us: 500,
            gated: true,
            ..Default::default()
        },
    );
    let pids = run.pids();
    let dir = scratch.path("run");
    let rec = Recorder::start(&[pids.0, pids.1], &dir, &["--seq-offset", "3000"]);
    run.start();
    let (sent, _) = run.wait();
    let out = rec.child.wait_with_output().expect("the recorder");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("none with a sequence number where the layout says (seq at offset 3000"),
        "{stderr}"
    );
    let meta = run_meta(&dir);
    let on_wire = events(&sent, "sent")
        .filter(|e| e["dropped"] == false)
        .count() as u64;
    assert!(meta.points["dev.queue"].lost("parse") >= on_wire);
    assert!(meta.points["dev.netif_rx"].lost("parse") >= on_wire);
}

#[test]
fn bad_targets_and_privileges_give_clear_errors_and_documented_codes() {
    let Some(_guard) = privileged("bad_targets") else {
        return;
    };
    let out = std::process::Command::new(bin("xlap-trace"))
        .args(["record", "--pid", "999999999", "--duration", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no process with pid 999999999"));

    // Without root: setpriv drops to nobody with no capabilities.
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(bin("xlap-trace"))
        .args(["record", "--pid", "1", "--duration", "1"])
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("root"));
}

#[test]
fn the_parquet_file_has_the_documented_schema() {
    let Some(_guard) = privileged("parquet_schema") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "schema",
        &ExampleOptions {
            count: 100,
            period_us: 500,
            ..Default::default()
        },
        &[],
    );
    let file = std::fs::File::open(t.run_dir().join("stamps.parquet")).unwrap();
    let builder =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let documented = xlap_records::schema::stamps();
    let got = builder.schema();
    assert_eq!(got.fields(), documented.fields());
    assert_eq!(
        got.metadata().get("xlap.table").map(String::as_str),
        Some("stamps")
    );
    // The committed schema file says the same.
    let committed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/stamps.schema.json"),
    )
    .unwrap();
    let committed: arrow_schema::Schema = serde_json::from_str(&committed).unwrap();
    assert_eq!(committed.fields(), documented.fields());
}
