//! `xlap-trace export RUN --pcapng FILE` read back by an outside account:
//! tshark and capinfos (Wireshark's own readers) against the packets table
//! read with DuckDB. Every frame is a (packet, side) pair of the table, at
//! that side's wire point on the wall clock, with the flow's addresses and
//! ports and X-LAP's breakdown in its comment. Synthetic runs cover the
//! edges (no packet, one IPv6 packet, lost packets with a sender side
//! only); a recorded run of the example protocol on the stage the real
//! points.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use xlap_stage::Stage;
use xlap_tests::example::{kind_code, ExampleOptions, RECEIVER_PORT};
use xlap_tests::pcap;
use xlap_tests::trace::trace_example;
use xlap_tests::{privileged, xlap_trace, xlap_trace_ok, Scratch};

/// The sender's wire points, then its socket points (the fallback), as
/// the docs name them; the receiver's likewise.
const TX: &[&str] = &[
    "dev_start_xmit",
    "dev_xmit",
    "dev_queue",
    "sock_send_exit",
    "sock_send_enter",
];
const RX: &[&str] = &[
    "dev_netif_rx",
    "dev_gro_receive",
    "dev_receive_skb",
    "sock_queue",
    "sock_recv_exit",
];

/// One frame as tshark shows it, or as the packets table says it must be.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Frame {
    /// Seconds since the epoch with 9 decimals.
    time: String,
    src: String,
    dst: String,
    src_port: u16,
    dst_port: u16,
    comment: String,
}

fn tool(name: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{name} is missing: ./run.sh installs tshark (apt-get install tshark)"
    );
    path
}

/// The fields `fields` of every frame of `file` as tshark decodes them,
/// one row per frame (the first occurrence of each field).
fn tshark_fields(file: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new(tool("tshark"));
    cmd.arg("-r")
        .arg(file)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let row: Vec<String> = line.split('\t').map(str::to_string).collect();
            assert_eq!(row.len(), fields.len(), "{line}");
            row
        })
        .collect()
}

/// The frames of `file` as tshark decodes them. `frame.comment` is the
/// field of a packet comment in tshark 4.0 (Debian 12); later versions
/// name it `frame.comment` too (`pkt_comment` was 3.x's).
fn tshark_frames(file: &Path) -> Vec<Frame> {
    let fields = [
        "frame.time_epoch",
        "ip.src",
        "ipv6.src",
        "ip.dst",
        "ipv6.dst",
        "udp.srcport",
        "udp.dstport",
        "frame.comment",
    ];
    tshark_fields(file, &fields)
        .into_iter()
        .map(|f| {
            let either = |a: &str, b: &str| if a.is_empty() { b } else { a }.to_string();
            let port = |p: &str| p.parse().unwrap_or_else(|_| panic!("{f:?}"));
            Frame {
                time: f[0].clone(),
                src: either(&f[1], &f[2]),
                dst: either(&f[3], &f[4]),
                src_port: port(&f[5]),
                dst_port: port(&f[6]),
                comment: f[7].clone(),
            }
        })
        .collect()
}

/// capinfos' count of packets and its file type.
fn capinfos(file: &Path) -> (u64, String) {
    let out = Command::new(tool("capinfos"))
        .args(["-M", "-c", "-t"])
        .arg(file)
        .output()
        .expect("run capinfos");
    assert!(
        out.status.success(),
        "capinfos: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    (
        field("Number of packets:").parse().unwrap(),
        field("File type:"),
    )
}

/// A duration as the comment shows it (µs, ns exact), read independently
/// of the exporter's formatting code.
fn us(ns: Option<i64>) -> String {
    ns.map_or("-".into(), |ns| {
        let sign = if ns < 0 { "-" } else { "" };
        let a = ns.unsigned_abs();
        format!("{sign}{}.{:03}us", a / 1000, a % 1000)
    })
}

/// The frames the packets table `packets` of the run with `run_json`
/// calls for: each packet on each side it has a wire (or socket) point
/// on, at wall time.
fn expected(packets: &Path, run_json: &Path) -> Vec<Frame> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_json).unwrap()).unwrap();
    let (mono, real) = (
        meta["clock_start"]["monotonic_ns"].as_i64().unwrap(),
        meta["clock_start"]["realtime_ns"].as_i64().unwrap(),
    );
    let names: BTreeMap<u64, String> = meta["options"]["layout"]["kind_names"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| (p[0].as_u64().unwrap(), p[1].as_str().unwrap().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let p = packets.display();
    let columns: Vec<String> = {
        let mut stmt = conn
            .prepare(&format!("SELECT name FROM parquet_schema('{p}')"))
            .unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.map(|r| r.unwrap()).collect()
    };
    let first = |points: &[&str]| -> (String, String) {
        let present: Vec<&&str> = points
            .iter()
            .filter(|s| columns.contains(&format!("{s}_ns")))
            .collect();
        if present.is_empty() {
            return ("NULL::BIGINT".into(), "NULL".into());
        }
        let value = present
            .iter()
            .map(|s| format!("{s}_ns"))
            .collect::<Vec<_>>();
        let at = present
            .iter()
            .map(|s| format!("WHEN {s}_ns IS NOT NULL THEN '{s}'"))
            .collect::<Vec<_>>();
        (
            format!("coalesce({}, NULL)", value.join(", ")),
            format!("CASE {} END", at.join(" ")),
        )
    };
    let mut frames = Vec::new();
    for (side, points) in [("sender", TX), ("receiver", RX)] {
        let (t, at) = first(points);
        let sql = format!(
            "SELECT {t}, {at}, src_addr, dst_addr, src_port, dst_port, seq, kind, e2e_ns,
                    sender_total_ns, channel_ns, receiver_total_ns, coalesce(lost, false)
             FROM '{p}' WHERE {t} IS NOT NULL"
        );
        let mut stmt = conn.prepare(&sql).unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let t: i64 = r.get(0).unwrap();
            let at: String = r.get(1).unwrap();
            let wall = t - mono + real;
            let kind: Option<u64> = r.get(7).unwrap();
            let kind = kind.map_or("all".into(), |k| {
                names.get(&k).cloned().unwrap_or(k.to_string())
            });
            let socket = if at.starts_with("sock_") {
                " (no device point)"
            } else {
                ""
            };
            let comment = format!(
                "seq={} kind={kind} side={side} at={at}{socket} e2e={} sender_total={} channel={} receiver_total={} lost={}",
                r.get::<_, u64>(6).unwrap(),
                us(r.get(8).unwrap()),
                us(r.get(9).unwrap()),
                us(r.get(10).unwrap()),
                us(r.get(11).unwrap()),
                r.get::<_, bool>(12).unwrap(),
            );
            let addr = |a: Option<String>| a.unwrap_or_else(|| "0.0.0.0".into());
            frames.push(Frame {
                time: format!("{}.{:09}", wall / 1_000_000_000, wall % 1_000_000_000),
                src: addr(r.get(2).unwrap()),
                dst: addr(r.get(3).unwrap()),
                src_port: r.get::<_, Option<u16>>(4).unwrap().unwrap_or(0),
                dst_port: r.get::<_, Option<u16>>(5).unwrap().unwrap_or(0),
                comment,
            });
        }
    }
    frames.sort();
    frames
}

/// Exports `run` to a pcapng file in `scratch` and holds it to the table:
/// the same frames (times to the ns, addresses, ports, comments) and
/// capinfos' count. Returns the frames.
fn export_and_check(scratch: &Scratch, run: &Path, packets: &Path, run_json: &Path) -> Vec<Frame> {
    let file = scratch.path("run.pcapng");
    let out = xlap_trace_ok(&[
        "export".as_ref(),
        run.as_os_str(),
        "--pcapng".as_ref(),
        file.as_os_str(),
        "--max-packets".as_ref(),
        "0".as_ref(),
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    let want = expected(packets, run_json);
    assert!(said.contains(&format!("{} frames", want.len())), "{said}");
    let (count, kind) = capinfos(&file);
    assert_eq!(kind, "pcapng");
    assert_eq!(count, want.len() as u64);
    let mut got = tshark_frames(&file);
    // Frames are in time order in the file.
    assert!(got.windows(2).all(|w| w[0].time <= w[1].time));
    got.sort();
    // The first frame that differs, not thousands of them.
    if let Some(i) = (0..got.len().min(want.len())).find(|&i| got[i] != want[i]) {
        panic!(
            "frame {i} of {}: tshark read\n{:?}\nthe table says\n{:?}",
            want.len(),
            got[i],
            want[i]
        );
    }
    assert_eq!(got.len(), want.len());
    // No temporary file is left beside it.
    let left: Vec<_> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    got
}

/// A copy of the synthetic run `src` as `dst` whose packets are those
/// `select` picks from it (a SELECT list and a WHERE/LIMIT tail), the
/// packets file's metadata kept (readers need its sides and version).
fn derived_run(src: &Path, dst: &Path, select: &str, tail: &str) {
    std::fs::create_dir_all(dst).unwrap();
    std::fs::copy(src.join("run.json"), dst.join("run.json")).unwrap();
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let from = src.join("packets.parquet");
    let kv: Vec<(String, String)> = {
        let mut stmt = conn
            .prepare("SELECT decode(key), decode(value) FROM parquet_kv_metadata(?)")
            .unwrap();
        let rows = stmt
            .query_map([from.to_str().unwrap()], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        rows.map(|r| r.unwrap()).collect()
    };
    let kv = kv
        .iter()
        .map(|(k, v)| format!("{k}: '{}'", v.replace('\'', "''")))
        .collect::<Vec<_>>()
        .join(", ");
    conn.execute_batch(&format!(
        "CREATE VIEW packets_src AS FROM '{}';
         COPY (SELECT {select} FROM packets_src {tail}) TO '{}' (FORMAT PARQUET, KV_METADATA {{{kv}}});",
        from.display(),
        dst.join("packets.parquet").display()
    ))
    .unwrap();
}

fn synth(scratch: &Scratch, packets: u64) -> PathBuf {
    let dir = scratch.path(&format!("synth-{packets}"));
    xlap_trace_ok(&[
        "synth",
        "-o",
        dir.to_str().unwrap(),
        "--packets",
        &packets.to_string(),
        "--seed",
        "7",
    ]);
    dir
}

#[test]
fn a_synthetic_run_exports_every_packet_on_each_side_it_was_stamped() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("pcapng-synth");
    let run = synth(&scratch, 3000);
    let packets = run.join("packets.parquet");
    let frames = export_and_check(&scratch, &run, &packets, &run.join("run.json"));
    // Lost packets have their sender's frame only (synth loses 0.5 %).
    let lost: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.comment.contains("lost=true"))
        .collect();
    assert!(!lost.is_empty(), "synth loses some packets");
    assert!(lost.iter().all(|f| f.comment.contains("side=sender")));
    let senders = frames
        .iter()
        .filter(|f| f.comment.contains("side=sender"))
        .count();
    assert_eq!(senders, 3000);
    assert_eq!(frames.len(), 2 * 3000 - lost.len());
}

#[test]
fn one_ipv6_packet_and_a_lost_one_with_ports() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("pcapng-edges");
    let run = synth(&scratch, 3000);
    // One delivered packet, over IPv6, ports set.
    let one = scratch.path("one");
    derived_run(
        &run,
        &one,
        "* REPLACE ('fd00:77::1' AS src_addr, 'fd00:77::2' AS dst_addr, 40000::USMALLINT AS src_port, 9000::USMALLINT AS dst_port)",
        "WHERE NOT lost ORDER BY seq LIMIT 1",
    );
    let frames = export_and_check(
        &scratch,
        &one,
        &one.join("packets.parquet"),
        &one.join("run.json"),
    );
    assert_eq!(frames.len(), 2);
    assert!(frames
        .iter()
        .all(|f| f.src == "fd00:77::1" && f.dst_port == 9000));
    // A lost packet beside a delivered one (a run of lost packets alone
    // has none to analyse: exit 6): three frames, the lost one's the
    // sender's only.
    let lost = scratch.path("lost");
    derived_run(
        &run,
        &lost,
        "* REPLACE (1234::USMALLINT AS src_port, 5678::USMALLINT AS dst_port)",
        "WHERE seq IN ((SELECT min(seq) FROM packets_src WHERE lost), (SELECT min(seq) FROM packets_src WHERE NOT lost))",
    );
    let s = Scratch::new("pcapng-edges-lost");
    let frames = export_and_check(
        &s,
        &lost,
        &lost.join("packets.parquet"),
        &lost.join("run.json"),
    );
    assert_eq!(frames.len(), 3);
    let lost: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.comment.contains("lost=true"))
        .collect();
    assert_eq!(lost.len(), 1);
    assert!(lost[0].comment.contains("side=sender") && lost[0].src_port == 1234);
}

#[test]
fn no_packet_and_a_limit() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("pcapng-limits");
    // A run without packets is bad input (exit 6), and leaves no file.
    let empty = synth(&scratch, 0);
    let file = scratch.path("empty.pcapng");
    let out = xlap_trace(&[
        "export",
        empty.to_str().unwrap(),
        "--pcapng",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(!file.exists());
    // --max-packets takes the first packets sent, each with its sides.
    let run = synth(&scratch, 400);
    let file = scratch.path("limited.pcapng");
    let out = xlap_trace_ok(&[
        "export",
        run.to_str().unwrap(),
        "--pcapng",
        file.to_str().unwrap(),
        "--max-packets",
        "25",
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("25 packets") && said.contains("375 later packets left out"),
        "{said}"
    );
    let frames = tshark_frames(&file);
    let seqs: std::collections::BTreeSet<String> = frames
        .iter()
        .map(|f| f.comment.split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(seqs.len(), 25);
    assert_eq!(capinfos(&file).0, frames.len() as u64);
}

/// The index of device `ifname` in the network namespace `netns`, as
/// `ip link` there says.
fn ifindex_in(netns: &str, ifname: &str) -> u32 {
    let out = Command::new("ip")
        .args(["-n", netns, "-o", "link", "show", "dev", ifname])
        .output()
        .expect("run ip");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{text}"))
}

/// Each frame's interface and lengths as tshark reads them, against the
/// stage's devices (`ip link`) and the datagrams tcpdump captured on the
/// receiver's link: every frame timed at a device point is on that
/// device's interface, and a data packet's frame has the length its
/// datagram had on the wire, of which the file holds the headers.
fn check_devices_and_lengths(file: &Path, stage: &Stage, on_wire: &[pcap::Datagram], ipv6: bool) {
    let headers: u32 = 14 + if ipv6 { 40 } else { 20 } + 8;
    let data = kind_code("data");
    let wire_len: BTreeMap<u64, u32> = on_wire
        .iter()
        .filter(|d| d.dst_port == RECEIVER_PORT)
        .filter_map(|d| {
            let (h, _) = prrt_lite::wire::Header::decode(&d.payload).ok()?;
            (h.kind as u32 == data).then(|| (u64::from(h.seq), headers + d.payload.len() as u32))
        })
        .collect();
    assert!(
        wire_len.len() > 1000,
        "{} data datagrams on the wire",
        wire_len.len()
    );
    let devices: Vec<(String, u32)> = [stage.host(0), stage.host(1)]
        .iter()
        .map(|h| (h.ifname.clone(), ifindex_in(&h.netns, &h.ifname)))
        .collect();
    let fields = [
        "frame.interface_name",
        "frame.interface_description",
        "frame.len",
        "frame.cap_len",
        "frame.comment",
    ];
    let (mut at_device, mut checked) = (0, 0);
    for f in tshark_fields(file, &fields) {
        let line = f.join("\t");
        let (name, description, comment) = (&f[0], &f[1], &f[4]);
        let (len, cap_len): (u32, u32) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        assert_eq!(cap_len, headers, "{line}");
        if comment.contains("(no device point)") {
            continue;
        }
        at_device += 1;
        assert!(
            devices
                .iter()
                .any(|(n, i)| name.starts_with(&format!("{n}@"))
                    && description.contains(&format!("(ifindex {i})"))),
            "{line}: not a stage device {devices:?}"
        );
        if !comment.contains("kind=data") {
            continue;
        }
        let seq: u64 = comment
            .strip_prefix("seq=")
            .and_then(|c| c.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        if let Some(want) = wire_len.get(&seq) {
            assert_eq!(len, *want, "seq {seq}: {line}");
            checked += 1;
        }
    }
    assert!(
        at_device > 0 && checked > 1000,
        "{at_device} frames at devices, {checked} data frames checked"
    );
}

#[test]
fn a_recorded_run_of_the_example_protocol_reads_in_tshark_as_the_packets_table() {
    let Some(_guard) = privileged("pcapng_export") else {
        return;
    };
    for ipv6 in [false, true] {
        let stage = Stage::two_hosts().expect("stage");
        // The receiver's link as tcpdump sees it: the data datagrams' real
        // lengths, against which the export's are checked.
        let receiver = stage.host(1);
        let wire_file = std::env::temp_dir().join(format!(
            "xlap-pcapng-wire-{}-{ipv6}.pcap",
            std::process::id()
        ));
        let wire = pcap::Capture::start(&receiver.netns, &receiver.wire_ifname, &wire_file);
        let t = trace_example(
            &stage,
            if ipv6 {
                "pcapng-live-v6"
            } else {
                "pcapng-live"
            },
            &ExampleOptions {
                count: 2000,
                period_us: 100,
                drop: 0.02,
                markers: true,
                ipv6,
                ..Default::default()
            },
            &[],
        );
        let run = t.run_dir();
        let packets = run.join("packets.parquet");
        assert!(packets.exists(), "{}", t.stderr);
        let on_wire = wire.stop();
        let _ = std::fs::remove_file(&wire_file);
        let frames = export_and_check(&t.scratch, &run, &packets, &run.join("run.json"));
        check_devices_and_lengths(&t.scratch.path("run.pcapng"), &stage, &on_wire, ipv6);
        // The real points: the sender's device point and the receiver's.
        assert!(frames
            .iter()
            .any(|f| f.comment.contains("side=sender at=dev_")));
        assert!(frames
            .iter()
            .any(|f| f.comment.contains("side=receiver at=dev_")));
        // The example's drops (--drop) happen in the sender before its
        // send call: such a packet never reached a socket or the wire and
        // has no frame (export_and_check counted the table's sides so);
        // the synthetic runs cover lost packets with a sender's frame.
        if ipv6 {
            assert!(
                frames.iter().all(|f| f.src.contains(':')),
                "{:?}",
                frames[0]
            );
        } else {
            assert!(
                frames.iter().all(|f| f.src.contains('.')),
                "{:?}",
                frames[0]
            );
        }
    }
}
