//! Privileged: a third protocol layout, RTP (`--proto rtp`), from a sender
//! that also sends RTCP sender reports on the next port up (RFC 3550),
//! checked against both ends' own logs: every RTP packet keyed by its
//! 16-bit sequence number across the wrap, with the payload type as kind
//! (the marker bit masked off); the packets table unwraps the sequence and
//! names the flow's ports and addresses.

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Stdio;
use xlap_stage::Stage;
use xlap_tests::example::events;
use xlap_tests::trace::{read_stamps, run_meta, Recorder, Row};
use xlap_tests::{bin, privileged, read_jsonl, wait_for_file, KillOnDrop, Scratch};

const RTP_PORT: u16 = 5004;
const RTP_COUNT: u32 = 300;

/// (seq, kind) -> copies, as a log names them.
type Multiset = BTreeMap<(u64, u32), usize>;

fn logged(log: &[Value], event: &str, seq_field: &str) -> Multiset {
    let mut m = Multiset::new();
    for e in events(log, event) {
        let key = (
            e[seq_field].as_u64().unwrap(),
            e["pt"].as_u64().unwrap() as u32,
        );
        *m.entry(key).or_default() += 1;
    }
    m
}

fn stamped(rows: &[Row], point: &str, pid: u32, port: u16) -> Multiset {
    let mut m = Multiset::new();
    for r in rows
        .iter()
        .filter(|r| r.point == point && r.pid == pid && !r.fragment)
        .filter(|r| r.dst_port == Some(port) || r.flow == 0)
    {
        let key = (r.seq.expect("seq"), r.kind.expect("kind"));
        *m.entry(key).or_default() += 1;
    }
    m
}

#[test]
fn rtp_keyed_by_its_wrapping_sequence_with_the_payload_type_as_kind() {
    let Some(_guard) = privileged("rtp") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let (a, b) = (stage.host(0), stage.host(1));
    let scratch = Scratch::new("rtp");
    let peer = bin("xlap-rtp-peer");
    let (ready, start) = (scratch.path("ready"), scratch.path("start"));
    let (slog, rlog) = (scratch.path("send.jsonl"), scratch.path("recv.jsonl"));
    let port = RTP_PORT.to_string();
    let count = RTP_COUNT.to_string();
    let receiver = KillOnDrop(
        b.command(&peer)
            .args(["recv", &b.ipv4.to_string(), &port, &count])
            .arg(&rlog)
            .arg(&ready)
            .stdin(Stdio::null())
            .spawn()
            .expect("receiver"),
    );
    wait_for_file(&ready, 20);
    let sender = KillOnDrop(
        a.command(&peer)
            .args([
                "send",
                &a.ipv4.to_string(),
                &b.ipv4.to_string(),
                &port,
                &count,
                "1000",
            ])
            .arg(&slog)
            .arg(&start)
            .stdin(Stdio::null())
            .spawn()
            .expect("sender"),
    );
    let pids = (sender.0.id(), receiver.0.id());
    let rec = Recorder::start(&[pids.0, pids.1], &scratch.path("run"), &["--proto", "rtp"]);
    std::fs::write(&start, "go").unwrap();
    for mut p in [sender, receiver] {
        assert!(p.0.wait().unwrap().success(), "an RTP peer failed");
    }
    let dir = rec.dir.clone();
    rec.wait();
    let rows = read_stamps(&dir.join("stamps.parquet"));
    let (sent, received) = (read_jsonl(&slog), read_jsonl(&rlog));

    let rtp_sent = logged(&sent, "rtp", "seq");
    let rtp_received = logged(&received, "rtp", "seq");
    assert_eq!(rtp_sent.len(), RTP_COUNT as usize);
    assert!(
        rtp_sent.keys().any(|(s, _)| *s < 100) && rtp_sent.keys().any(|(s, _)| *s > 65_000),
        "the sequence should wrap"
    );
    assert!(rtp_received.len() > 280, "the path lost RTP packets");
    for point in ["sock.send_enter", "dev.queue", "dev.xmit", "sock.send_exit"] {
        assert_eq!(
            stamped(&rows, point, pids.0, RTP_PORT),
            rtp_sent,
            "RTP {point}"
        );
    }
    for point in ["dev.receive_skb", "sock.queue"] {
        assert_eq!(
            stamped(&rows, point, pids.1, RTP_PORT),
            rtp_received,
            "RTP {point}"
        );
    }

    // The reads, through the RTP socket's single flow (the RTCP socket's
    // reports, read with the same layout, carry another kind).
    let mut reads = stamped(&rows, "sock.recv_exit", pids.1, RTP_PORT);
    reads.retain(|(_, kind), _| *kind == 96);
    assert_eq!(reads, rtp_received, "RTP sock.recv_exit");
    assert_eq!(
        logged(&sent, "rtcp", "ntp_mid").len(),
        RTP_COUNT as usize / 10
    );

    // The packets table: one row per RTP packet (the sequence unwrapped
    // across 65535 -> 0), on the RTP flow's ports and the stage's
    // addresses.
    let meta = run_meta(&dir);
    assert_eq!(meta["options"]["layout"]["kind_mask"], 0x7f);
    let db = duckdb::Connection::open_in_memory().unwrap();
    let packets = dir.join("packets.parquet");
    let (n, ports, from, to): (i64, String, String, String) = db
        .query_row(
            &format!(
                "SELECT count(DISTINCT seq), string_agg(DISTINCT src_port || '>' || dst_port, ','),
                        any_value(src_addr), any_value(dst_addr)
                 FROM '{}' WHERE kind = 96",
                packets.display()
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .expect("packets table");
    assert_eq!(n, RTP_COUNT as i64, "RTP packets in the packets table");
    assert_eq!(ports, "5004>5004");
    assert_eq!((from, to), (a.ipv4.to_string(), b.ipv4.to_string()));
}
