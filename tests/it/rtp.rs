//! Privileged: a third-party protocol layout, RTP (`--proto rtp`), from a
//! sender that also sends RTCP sender reports on the next port up (RFC
//! 3550) from the same process, with a layout of their own (`--layout
//! 5005=rtcp`), checked against both ends' own logs: every RTP packet keyed
//! by its 16-bit sequence number across the wrap, with the payload type as
//! kind (the marker bit masked off); every RTCP report by the middle bits
//! of its NTP timestamp, with its packet type as kind, at every point; the
//! packets table unwraps the RTP sequence and names each flow's ports and
//! addresses.

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Stdio;
use xlap_records::run_meta::RunMeta;
use xlap_stage::Stage;
use xlap_tests::example::events;
use xlap_tests::trace::{read_stamps, run_meta, traced, Recorder, Row};
use xlap_tests::{bin, privileged, read_jsonl, wait_for_file, KillOnDrop, Scratch};

const RTP_PORT: u16 = 5004;
const RTCP_PORT: u16 = RTP_PORT + 1;
const RTP_COUNT: u32 = 300;
/// RTCP sender reports: one every ten RTP packets.
const SR_COUNT: usize = RTP_COUNT as usize / 10;
const RTP_PT: u32 = 96;
const RTCP_SR: u32 = 200;

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

/// The stamps of one run, by sender and receiver pid.
struct Protocol<'a> {
    rows: &'a [Row],
    pids: (u32, u32),
    meta: &'a RunMeta,
}

impl Protocol<'_> {
    /// Every packet of `port` the sender logged at each send and transmit
    /// point; at the receiver's device and socket queue every packet it
    /// logged, and nothing that was not sent (a report that arrives after
    /// the receiver stopped reading is there but never logged); its reads
    /// (of `kind`: the socket's other reads are the other protocol's)
    /// exactly as logged.
    fn check(&self, what: &str, port: u16, kind: u32, sent: &Multiset, received: &Multiset) {
        for point in ["sock.send_enter", "dev.queue", "dev.xmit", "sock.send_exit"] {
            let got = stamped(self.rows, point, self.pids.0, port);
            assert_eq!(&got, sent, "{what} {point}");
        }
        for point in traced(self.meta, &["dev.receive_skb", "sock.queue"]) {
            let got = stamped(self.rows, point, self.pids.1, port);
            let missing: Vec<_> = received.keys().filter(|k| !got.contains_key(k)).collect();
            assert!(
                missing.is_empty(),
                "{what} {point}: logged, not stamped: {missing:?}"
            );
            let foreign: Vec<_> = got.keys().filter(|k| !sent.contains_key(k)).collect();
            assert!(
                foreign.is_empty(),
                "{what} {point}: stamped, never sent: {foreign:?}"
            );
            assert!(
                got.values().all(|n| *n == 1),
                "{what} {point}: a packet twice"
            );
        }
        let mut reads = stamped(self.rows, "sock.recv_exit", self.pids.1, port);
        reads.retain(|(_, k), _| *k == kind);
        assert_eq!(&reads, received, "{what} sock.recv_exit");
    }
}

#[test]
fn rtp_and_rtcp_of_one_process_keyed_by_their_own_layouts() {
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
    let rec = Recorder::start(
        &[pids.0, pids.1],
        &scratch.path("run"),
        &["--proto", "rtp", "--layout", &format!("{RTCP_PORT}=rtcp")],
    );
    std::fs::write(&start, "go").unwrap();
    for mut p in [sender, receiver] {
        assert!(p.0.wait().unwrap().success(), "an RTP peer failed");
    }
    let dir = rec.dir.clone();
    rec.wait();
    let rows = read_stamps(&dir.join("stamps.parquet"));
    let meta = run_meta(&dir);
    let (sent, received) = (read_jsonl(&slog), read_jsonl(&rlog));

    let rtp_sent = logged(&sent, "rtp", "seq");
    let rtp_received = logged(&received, "rtp", "seq");
    assert_eq!(rtp_sent.len(), RTP_COUNT as usize);
    assert!(
        rtp_sent.keys().any(|(s, _)| *s < 100) && rtp_sent.keys().any(|(s, _)| *s > 65_000),
        "the sequence should wrap"
    );
    assert!(rtp_received.len() > 280, "the path lost RTP packets");
    let protocol = Protocol {
        rows: &rows,
        pids,
        meta: &meta,
    };
    protocol.check("RTP", RTP_PORT, RTP_PT, &rtp_sent, &rtp_received);

    // The reports, on the next port, by the RTCP layout: the same points,
    // none read as RTP.
    let rtcp_sent = logged(&sent, "rtcp", "ntp_mid");
    let rtcp_received = logged(&received, "rtcp", "ntp_mid");
    assert_eq!(rtcp_sent.len(), SR_COUNT);
    assert!(rtcp_sent.keys().all(|(_, pt)| *pt == RTCP_SR));
    protocol.check("RTCP", RTCP_PORT, RTCP_SR, &rtcp_sent, &rtcp_received);

    // The packets table: one row per RTP packet (the sequence unwrapped
    // across 65535 -> 0), on the RTP flow's ports and the stage's
    // addresses.
    assert_eq!(meta.options.layout.kind_mask, 0x7f);
    assert_eq!(meta.options.port_layouts[0].port, RTCP_PORT);
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
    let (reports, ports): (i64, String) = db
        .query_row(
            &format!(
                "SELECT count(DISTINCT seq), string_agg(DISTINCT src_port || '>' || dst_port, ',')
                 FROM '{}' WHERE kind = {RTCP_SR}",
                packets.display()
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("packets table");
    assert_eq!(
        reports, SR_COUNT as i64,
        "RTCP reports in the packets table"
    );
    assert_eq!(ports, "5005>5005");
    let names: String = db
        .query_row(
            &format!(
                "SELECT string_agg(DISTINCT kind, ',' ORDER BY kind) FROM '{}'",
                packets.display()
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(names, format!("{RTP_PT},{RTCP_SR}"), "no other kinds");
}
