//! Privileged: the C marker header's two paths (the in-process ring and
//! uprobes) on a C program, against the program's own log and the kernel's
//! stamps of the same datagrams.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use xlap_tests::c_programs::{udp_loop, udp_loop_log};
use xlap_tests::trace::{site_path, Recorder, SEQ_U64_LE};
use xlap_tests::{privileged, Scratch};

const COUNT: u64 = 500;

/// Per datagram (by seq): point -> (ts, tid) of the stamps of one traced run
/// of udp_loop with `--marker-path marker_path`, after checking its run.
fn traced(
    exe: &Path,
    scratch: &Scratch,
    port: u16,
    marker_path: &str,
) -> BTreeMap<u64, BTreeMap<String, (i64, u32)>> {
    let log = scratch.path(&format!("{marker_path}.log"));
    let gate = scratch.path(&format!("{marker_path}.gate"));
    let mut child = Command::new(exe)
        .arg(port.to_string())
        .arg(COUNT.to_string())
        .arg("200")
        .arg(&log)
        .arg(&gate)
        .stdout(Stdio::null())
        .spawn()
        .expect("udp_loop");
    let pid = child.id();
    let run = scratch.path(&format!("run-{marker_path}"));
    let rec = Recorder::start(
        &[pid],
        &run,
        &[SEQ_U64_LE, &["--quiet", "--marker-path", marker_path]].concat(),
    );
    std::fs::write(&gate, "go").unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "udp_loop failed: {status}");
    let meta = rec.meta_after_wait();
    assert_eq!(meta.lost, 0, "{marker_path}");
    let sites = &meta.options.usdt_sites;
    assert_eq!(sites.len(), 3, "{marker_path}: {sites:?}");
    assert!(
        sites.iter().all(|s| s.path == site_path(marker_path)),
        "{sites:?}"
    );

    // The program's own account: every datagram received, by which thread.
    let logged = udp_loop_log(&log);
    assert_eq!(logged.len() as u64, COUNT);
    let mut by_seq: BTreeMap<u64, BTreeMap<String, (i64, u32)>> = BTreeMap::new();
    for row in xlap_tests::trace::read_stamps(&run.join("stamps.parquet")) {
        if let Some(seq) = row.seq {
            assert_eq!(row.pid, pid, "{marker_path}: {row:?}");
            if row.point.starts_with("app.") {
                assert_eq!(row.kind, Some(1), "{marker_path}: {row:?}");
            }
            by_seq
                .entry(seq)
                .or_default()
                .insert(row.point.clone(), (row.ts_ns, row.tid));
        }
    }
    let chain = [
        "app.send_start",
        "sock.send_enter",
        "sock.send_exit",
        "app.submit",
        "sock.recv_exit",
        "app.deliver",
    ];
    for (seq, tid) in logged {
        let p = by_seq
            .get(&seq)
            .unwrap_or_else(|| panic!("{marker_path}: seq {seq} not stamped"));
        let mut last = i64::MIN;
        for point in chain {
            let (ts, t) = *p
                .get(point)
                .unwrap_or_else(|| panic!("{marker_path}: seq {seq}: no {point}: {p:?}"));
            assert!(
                ts >= last,
                "{marker_path}: seq {seq}: {point} out of order: {p:?}"
            );
            assert_eq!(
                t, tid,
                "{marker_path}: seq {seq}: {point} not in the logged thread"
            );
            last = ts;
        }
    }
    by_seq
}

#[test]
fn c_markers_stamp_the_same_on_the_ring_and_by_uprobes() {
    let Some(_guard) = privileged("c_markers") else {
        return;
    };
    let scratch = Scratch::new("c-markers");
    let exe = udp_loop(&scratch);
    let ring = traced(&exe, &scratch, 47311, "ring");
    let uprobe = traced(&exe, &scratch, 47312, "uprobe");
    // Side by side: the same points for the same datagrams.
    let points = |m: &BTreeMap<u64, BTreeMap<String, (i64, u32)>>| -> BTreeMap<u64, Vec<String>> {
        m.iter()
            .map(|(s, p)| {
                (
                    *s,
                    p.keys()
                        .filter(|k| k.starts_with("app."))
                        .cloned()
                        .collect(),
                )
            })
            .collect()
    };
    assert_eq!(points(&ring), points(&uprobe));
}
