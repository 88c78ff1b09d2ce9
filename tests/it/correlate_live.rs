//! Privileged: the packets table of a live run (both ends traced by one
//! daemon on the stage) against the protocol's own log; the same table from
//! the two ends recorded separately; a clock offset and drift injected into
//! one end recovered within the reported uncertainty.

use std::collections::BTreeSet;
use std::path::Path;
use xlap_records::points::point_of_column;
use xlap_stage::Stage;
use xlap_tests::example::{events, ExampleOptions};
use xlap_tests::trace::{is_traced, trace_example, Traced};
use xlap_tests::{bin, privileged, Scratch};

fn seqs(conn: &duckdb::Connection, sql: &str) -> BTreeSet<u64> {
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, i64>(0)).unwrap();
    rows.map(|r| r.unwrap() as u64).collect()
}

fn log_seqs(
    log: &[serde_json::Value],
    event: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> BTreeSet<u64> {
    events(log, event)
        .filter(|e| pred(e))
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

/// Splits a run's stamps by process into two run directories, shifting the
/// second one's clock by `offset_ns` plus `drift_ppm`, under `boot_id`.
fn split(
    t: &Traced,
    out: &Path,
    offset_ns: i64,
    drift_ppm: f64,
    boot_id: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let src = t.run_dir();
    let meta = &t.meta;
    let start = meta.clock_start.monotonic_ns as i64;
    let mut dirs = Vec::new();
    for (name, pid, shift) in [("a", t.pids.0, false), ("b", t.pids.1, true)] {
        let dir = out.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let ts = if shift {
            format!("(ts_ns + {offset_ns} + {drift_ppm} * 1e-6 * (ts_ns - {start}))::BIGINT")
        } else {
            "ts_ns".to_string()
        };
        conn.execute_batch(&format!(
            "COPY (SELECT * REPLACE ('{name}' AS run_id, {ts} AS ts_ns) FROM '{}/stamps.parquet' WHERE pid = {pid})
             TO '{}/stamps.parquet' (FORMAT PARQUET);",
            src.display(),
            dir.display()
        ))
        .unwrap();
        let mut m = meta.clone();
        m.run_id = name.into();
        if shift {
            m.boot_id = boot_id.into();
        }
        m.write(&dir.join("run.json")).unwrap();
        dirs.push(dir);
    }
    (dirs[0].clone(), dirs[1].clone())
}

fn correlate_cli(dirs: &[&Path], out: &Path) -> serde_json::Value {
    let o = std::process::Command::new(bin("xlap-trace"))
        .arg("correlate")
        .args(dirs)
        .arg("-o")
        .arg(out)
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_live_packets_table_matches_the_protocol_and_offline_correlation_and_clock_mapping_work() {
    let Some(_guard) = privileged("correlate_live") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "correlate_live",
        &ExampleOptions {
            count: 10_000,
            period_us: 100,
            drop: 0.01,
            markers: true,
            ..Default::default()
        },
        &[],
    );
    let packets = t.run_dir().join("packets.parquet");
    assert!(
        packets.exists(),
        "record builds the packets table: {}",
        t.stderr
    );
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let p = packets.display();

    // Delivered, rebuilt and lost data packets: exactly as the protocol says.
    let delivered = seqs(
        &conn,
        &format!("SELECT seq FROM '{p}' WHERE kind = 1 AND app_deliver_ns IS NOT NULL"),
    );
    assert_eq!(delivered, log_seqs(&t.received, "delivered", |_| true));
    let recovered = seqs(
        &conn,
        &format!("SELECT seq FROM '{p}' WHERE kind = 1 AND recovered"),
    );
    assert_eq!(recovered, log_seqs(&t.received, "recovered", |_| true));
    let dropped = log_seqs(&t.sent, "sent", |e| {
        e["dropped"] == true && e["kind"] == "data"
    });
    let lost = seqs(
        &conn,
        &format!("SELECT seq FROM '{p}' WHERE kind = 1 AND lost"),
    );
    let never_received: BTreeSet<u64> = dropped.difference(&recovered).copied().collect();
    assert_eq!(
        lost, never_received,
        "dropped by the channel and not rebuilt: sent, never received"
    );
    assert!(log_seqs(&t.received, "lost", |_| true).is_subset(&lost));

    // Every delivered packet that crossed the wire has every point of both
    // ends, and X-LAP's decomposition adds up.
    let cols = [
        "app_send_start_ns",
        "app_encode_start_ns",
        "app_encode_end_ns",
        "app_submit_ns",
        "app_link_transmit_start_ns",
        "sock_send_enter_ns",
        "dev_queue_ns",
        "dev_start_xmit_ns",
        "dev_xmit_ns",
        "sock_send_exit_ns",
        "app_link_transmit_end_ns",
        "dev_netif_rx_ns",
        "dev_receive_skb_ns",
        "sock_queue_ns",
        "sock_recv_exit_ns",
        "app_link_receive_ns",
        "app_handle_start_ns",
        "app_decode_start_ns",
        "app_decode_end_ns",
        "app_handle_end_ns",
        "app_deliver_ns",
    ];
    // A column is `<point>_ns`, the point's dot an underscore.
    let all_present = cols
        .iter()
        .filter(|c| is_traced(&t.meta, &point_of_column(c)))
        .map(|c| format!("{c} IS NOT NULL"))
        .collect::<Vec<_>>()
        .join(" AND ");
    let complete = seqs(&conn, &format!("SELECT seq FROM '{p}' WHERE kind = 1 AND NOT recovered AND app_deliver_ns IS NOT NULL AND {all_present}"));
    let crossed: BTreeSet<u64> = delivered.difference(&recovered).copied().collect();
    // Also the packet that completes a receive call already blocked when
    // tracing started: its exit finds the buffer in the saved user registers.
    let incomplete: Vec<u64> = crossed.difference(&complete).copied().collect();
    // A packet may lack a point only where the run counted a loss at that
    // point (a full ring buffer on a loaded machine), no more often.
    let mut lacking: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for seq in &incomplete {
        for c in &cols {
            let null: i64 = conn
                .query_row(
                    &format!(
                        "SELECT count(*) FROM '{p}' WHERE kind = 1 AND seq = {seq} AND {c} IS NULL"
                    ),
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            if null > 0 {
                let point = point_of_column(c);
                lacking.entry(point).or_default().push(*seq);
            }
        }
    }
    let explained: BTreeSet<u64> = lacking.values().flatten().copied().collect();
    let unexplained: Vec<&u64> = incomplete
        .iter()
        .filter(|s| !explained.contains(s))
        .collect();
    assert!(
        unexplained.is_empty(),
        "delivered packets missing from the packets table: {unexplained:?}"
    );
    for (point, seqs) in &lacking {
        let lost: u64 = t
            .meta
            .points
            .get(point)
            .map(|p| {
                p.lost
                    .iter()
                    .filter(|(k, _)| k.starts_with("lost_"))
                    .map(|(_, n)| n)
                    .sum()
            })
            .unwrap_or(0);
        assert!(
            seqs.len() as u64 <= lost,
            "{} packets lack {point}, {lost} counted lost there: {seqs:?}; run.json points: {:?}",
            seqs.len(),
            t.meta.points
        );
    }
    // The table's times against the protocol's own clock readings (both
    // ends read CLOCK_MONOTONIC, the stamps' clock, on one kernel): the
    // first stamp before the send call began, the wire between the send
    // call's start and return (veth transmits inside it) and before the
    // receiver's arrival reading, the receive exit before it, the deliver
    // marker between arrival and the delivered line, and the end of e2e_ns
    // (the receiver's last stamp) not before it.
    let by_seq = |log: &[serde_json::Value],
                  event: &str|
     -> std::collections::BTreeMap<u64, serde_json::Value> {
        let mut m = std::collections::BTreeMap::new();
        for e in events(log, event).filter(|e| e["kind"] == "data" || event == "delivered") {
            m.entry(e["seq"].as_u64().unwrap())
                .or_insert_with(|| e.clone());
        }
        m
    };
    let (sent, received, delivered_at) = (
        by_seq(&t.sent, "sent"),
        by_seq(&t.received, "received"),
        by_seq(&t.received, "delivered"),
    );
    let mut stmt = conn
        .prepare(&format!(
            "SELECT seq, sent_ns, dev_start_xmit_ns, dev_netif_rx_ns, sock_recv_exit_ns, app_deliver_ns, sent_ns + e2e_ns
             FROM '{p}' WHERE kind = 1 AND NOT recovered AND app_deliver_ns IS NOT NULL AND {all_present}"
        ))
        .unwrap();
    let rows: Vec<(u64, [i64; 6])> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                [
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ],
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), complete.len());
    let mut off = Vec::new();
    for (seq, [first, tx_wire, rx_wire, recv_exit, deliver, last]) in &rows {
        let log = |m: &std::collections::BTreeMap<u64, serde_json::Value>, key: &str| {
            m.get(seq)
                .and_then(|e| e[key].as_i64())
                .unwrap_or_else(|| panic!("seq {seq}: no {key} in the log"))
        };
        let (start, returned) = (log(&sent, "t_start_ns"), log(&sent, "t_ns"));
        let arrival = log(&received, "t_ns");
        let done = log(&delivered_at, "t_ns");
        let ok = first <= &start
            && (start..=returned).contains(tx_wire)
            && tx_wire <= rx_wire
            && rx_wire <= &arrival
            && recv_exit <= &arrival
            && (arrival..=done).contains(deliver)
            && last >= deliver;
        if !ok {
            off.push(format!(
                "seq {seq}: first {first} send [{start}, {returned}] tx wire {tx_wire} rx wire {rx_wire} recv exit {recv_exit} arrival {arrival} deliver {deliver} delivered {done} e2e end {last}"
            ));
        }
    }
    assert!(
        off.is_empty(),
        "{} of {} packets' times disagree with the protocol's clock: {:?}",
        off.len(),
        rows.len(),
        &off[..off.len().min(5)]
    );

    // The two ends recorded apart (same kernel): the same table.
    let scratch = Scratch::new("correlate_offline");
    let (a, b) = split(&t, &scratch.path("same"), 0, 0.0, &t.meta.boot_id);
    let offline = scratch.path("offline.parquet");
    let c = correlate_cli(&[&a, &b], &offline);

    // The analyses: after record, on the run, and on the directory of the
    // two ends (correlated on the fly) they agree.
    assert!(
        t.stdout.contains("== summary") && t.stdout.contains("kind 1"),
        "record prints the summary: {}",
        t.stdout
    );
    let summary = |run: &Path| -> serde_json::Value {
        let o = std::process::Command::new(bin("xlap-trace"))
            .args([
                "analyze", "-q", "summary", "-q", "jitter", "--kind", "data", "-f", "json",
                "--quiet",
            ])
            .arg(run)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (live, apart) = (summary(&t.run_dir()), summary(&scratch.path("same")));
    assert_eq!(
        live, apart,
        "the analysis of the run equals that of its two ends"
    );
    let head = &live["summary"][0];
    assert_eq!(head["name"], "kind 1 (data)");
    assert_eq!(head["packets"], 10_000);
    let e2e = live["jitter"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["stage"] == "e2e")
        .expect("an e2e row");
    let with_e2e: i64 = conn
        .query_row(
            &format!("SELECT count(*) FROM '{p}' WHERE kind = 1 AND e2e_ns IS NOT NULL"),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(e2e["packets"].as_i64(), Some(with_e2e));
    assert!(with_e2e as usize >= delivered.len());
    assert_eq!(
        c["clocks"].as_array().unwrap().len(),
        1,
        "one kernel, one clock"
    );
    let differ: i64 = conn
        .query_row(
            &format!(
                "SELECT count(*) FROM (
                   (SELECT flow, kind, seq, e2e_ns, lost, recovered FROM '{p}' EXCEPT SELECT flow, kind, seq, e2e_ns, lost, recovered FROM '{o}')
                   UNION ALL
                   (SELECT flow, kind, seq, e2e_ns, lost, recovered FROM '{o}' EXCEPT SELECT flow, kind, seq, e2e_ns, lost, recovered FROM '{p}'))",
                o = offline.display()
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        differ, 0,
        "offline correlation of the two ends equals the live table"
    );

    // How long the traffic went on, on the one clock: a drift error of
    // δ ppm moves the mapping by δ·span/2 at the run's ends.
    let span_ns: i64 = conn
        .query_row(
            &format!("SELECT max(sent_ns) - min(sent_ns) FROM '{p}'"),
            [],
            |r| r.get(0),
        )
        .unwrap();
    // A known offset (+3.7 ms) and drift (50 ppm) on the receiver's clock.
    for (offset, drift, name) in [(3_700_000i64, 50.0, "shifted"), (0, 0.0, "unshifted")] {
        let (a, b) = split(&t, &scratch.path(name), offset, drift, "another-kernel");
        let c = correlate_cli(&[&a, &b], &scratch.path(&format!("{name}.parquet")));
        let m = &c["clocks"][1];
        let (est, u, t0) = (
            m["offset_ns"].as_f64().unwrap(),
            m["uncertainty_ns"].as_f64().unwrap(),
            m["t0_ns"].as_f64().unwrap(),
        );
        let start = t.meta.clock_start.monotonic_ns as f64;
        let truth = offset as f64 + drift * 1e-6 * (t0 - start);
        assert!(
            (est - truth).abs() <= u,
            "{name}: estimated {est} ± {u}, true {truth}: {m}"
        );
        // The drift too: off by no more than the offset's uncertainty
        // allows over the run (here ~2.5 ppm; the injected drift is 50),
        // and within the mapping's own stated bound.
        let drift_est = m["drift_ppm"].as_f64().unwrap();
        let drift_bound = 2.0 * u / span_ns as f64 * 1e6;
        assert!(
            (drift_est - drift).abs() <= drift_bound,
            "{name}: drift {drift_est} ppm, true {drift}: off by more than ±{u} ns over {span_ns} ns allow ({drift_bound:.2} ppm): {m}"
        );
        let stated = m["drift_uncertainty_ppm"].as_f64().unwrap();
        assert!(
            (drift_est - drift).abs() <= stated,
            "{name}: drift {drift_est} ± {stated} ppm, true {drift}: {m}"
        );
        assert!(m["method"].as_str().unwrap().starts_with("two-way"), "{m}");
    }
}
