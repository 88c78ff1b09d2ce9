//! Privileged: the `deadline` and `activation` queries on a traced run of the
//! example protocol across the two-host stage, with known causes injected:
//! the receiver's application thread busy-waits 5 ms before delivering a few
//! packets (they miss a 4 ms deadline, as the receiver's own verdict says,
//! and the stage that ends at delivery explains them), and the sender starts a few
//! packets 1.5 ms late (reported late, as late as its own log says).
//! Checked against the example's own logs: the receiver's own deadline
//! verdict per packet, the sender's send times.

use serde_json::Value;
use std::collections::BTreeMap;
use xlap_stage::Stage;
use xlap_tests::example::{events, ExampleOptions};
use xlap_tests::privileged;
use xlap_tests::trace::{analyze_rows, trace_example};

const PERIOD_US: u64 = 2_000;
const DEADLINE_US: u64 = 4_000;
/// How near the deadline a packet may be missed by one account and not
/// the other (their clock reads lie a marker apart at each end).
const BORDERLINE_NS: i64 = 100_000;
const DELIVER_SLOW: [u32; 5] = [300, 600, 900, 1_200, 1_350];
const LATE_START: std::ops::RangeInclusive<u32> = 500..=504;
const LATE_START_US: u64 = 1_500;

fn query(dir: &std::path::Path, name: &str, params: &[&str]) -> Vec<Value> {
    let mut args = vec!["--kind", "data"];
    for p in params {
        args.extend(["-p", p]);
    }
    analyze_rows(dir, name, &args)
}

/// seq → t_ns of one event of the data packets in a log.
fn times(log: &[Value], event: &str) -> BTreeMap<u64, i64> {
    events(log, event)
        .filter(|e| e.get("kind").is_none_or(|k| k == "data"))
        .map(|e| (e["seq"].as_u64().unwrap(), e["t_ns"].as_i64().unwrap()))
        .collect()
}

#[test]
fn deadline_misses_and_late_activations_are_found_with_their_cause() {
    let Some(_guard) = privileged("deadline_activation") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let mut recv_args = vec![
        "--deadline-ms".to_string(),
        (DEADLINE_US / 1000).to_string(),
    ];
    for s in DELIVER_SLOW {
        recv_args.extend(["--inject".to_string(), format!("deliver=5000@{s}-{s}")]);
    }
    let t = trace_example(
        &stage,
        "deadline",
        &ExampleOptions {
            count: 1_500,
            period_us: PERIOD_US,
            markers: true,
            send_args: vec![
                "--inject".into(),
                format!(
                    "activate={LATE_START_US}@{}-{}",
                    LATE_START.start(),
                    LATE_START.end()
                ),
            ],
            recv_args,
            ..Default::default()
        },
        &["--quiet"],
    );
    let dir = t.run_dir();
    let sent = times(&t.sent, "sent");

    // The program's own account: the receiver's deadline verdict per
    // packet (its latency from the send time in the header).
    let own_misses: Vec<u64> = events(&t.received, "delivered")
        .filter(|e| e["deadline_missed"] == true)
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    // The slowed packets miss; on a shared machine another packet may too
    // (a stall of milliseconds), and then the tool must count it as well.
    for s in DELIVER_SLOW {
        assert!(
            own_misses.contains(&s.into()),
            "{s} not late: {own_misses:?}"
        );
    }

    let rows = query(&dir, "deadline", &[&format!("deadline={DEADLINE_US}")]);
    let first = &rows[0];
    // The program times a packet from just after its send_start marker to
    // just after its deliver marker, the tool from marker to marker: a
    // packet within a few microseconds of the deadline may fall on either
    // side (CI once: 6 misses against the program's 5). Those may differ,
    // no other.
    let borderline = events(&t.received, "delivered")
        .filter(|e| {
            let latency = e["latency_ns"].as_i64().unwrap();
            (latency - DEADLINE_US as i64 * 1000).abs() < BORDERLINE_NS
        })
        .count() as i64;
    let tool_misses = first["misses"].as_i64().unwrap();
    assert!(
        (tool_misses - own_misses.len() as i64).abs() <= borderline,
        "{tool_misses} misses, the program's {}, {borderline} within {BORDERLINE_NS} ns of the deadline: {rows:#?}",
        own_misses.len()
    );
    assert!(
        first["cause"].as_str().unwrap().ends_with("__app_deliver"),
        "the stage that ends at delivery first: {rows:#?}"
    );
    assert!(first["packets"].as_u64().unwrap() >= DELIVER_SLOW.len() as u64);
    assert!(first["worst_us"].as_f64().unwrap() > 5_000.0, "{first:#}");
    // Without the parameter, the run's own flag (none given: no misses).
    let rows = query(&dir, "deadline", &[]);
    assert_eq!(rows[0]["misses"], 0, "{rows:#?}");

    // Activation: the log's send times (taken after the send call) against
    // the schedule at the nominal period, less their median offset (the
    // first send's own latency, which anchors the log's schedule).
    let (&seq0, &t0) = sent.iter().next().unwrap();
    let raw = |seq: u64| sent[&seq] - (t0 + (seq - seq0) as i64 * PERIOD_US as i64 * 1000);
    let mut offsets: Vec<i64> = sent.keys().map(|s| raw(*s)).collect();
    offsets.sort_unstable();
    let median = offsets[offsets.len() / 2];
    let own_dev = |seq: u64| raw(seq) - median;
    // The log confirms the late starts (its times also hold the transmit
    // thread's delays, so its own worst need not be an injected one).
    for seq in LATE_START {
        let late = own_dev(seq.into()) as f64 / 1e3;
        assert!(
            late > LATE_START_US as f64 - 200.0,
            "seq {seq}: {late} µs late in the log"
        );
    }
    let rows = query(&dir, "activation", &[&format!("period={PERIOD_US}")]);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let a = &rows[0];
    assert_eq!(a["period_us"], PERIOD_US as f64);
    // Late starts (over half a period): the injected ones, and any stall
    // of the machine the log shows as well. The query lists the first 20
    // (its documented cap), so the list is checked against the log and its
    // count, and the injected ones against the query with `late` just
    // below their lateness, where a stall of the machine rarely reaches.
    let late_seqs = |a: &Value| -> Vec<u64> {
        a["late_seqs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_u64().unwrap())
            .collect()
    };
    let late = late_seqs(a);
    for &seq in &late {
        let own = own_dev(seq) as f64 / 1e3;
        assert!(
            own > PERIOD_US as f64 / 2.0 - 100.0,
            "seq {seq} reported late, the log has it {own} µs off: {a:#}"
        );
    }
    let late_packets = a["late_packets"].as_u64().unwrap();
    assert_eq!(late.len() as u64, late_packets.min(20), "{a:#}");
    let threshold_us = LATE_START_US - 300;
    let rows = query(
        &dir,
        "activation",
        &[
            &format!("period={PERIOD_US}"),
            &format!("late={threshold_us}"),
        ],
    );
    let very_late = late_seqs(&rows[0]);
    for seq in LATE_START {
        assert!(
            very_late.contains(&seq.into()),
            "{seq} not reported late: {:#}",
            rows[0]
        );
    }
    for &seq in &very_late {
        let own = own_dev(seq) as f64 / 1e3;
        assert!(
            own > threshold_us as f64 - 100.0,
            "seq {seq} reported over {threshold_us} µs late, the log has it {own} µs off: {:#}",
            rows[0]
        );
    }
    // The worst start: at least as late as an injected one, and the log
    // confirms it. The tool stamps app.send_start, the log times the send
    // after it, so the log is as late or later: a stall of the machine
    // between the two (CI once: 3.4 ms stamped, 5.7 ms in the log) makes
    // it later, never earlier.
    let worst = a["worst_seq"].as_u64().unwrap();
    let worst_us = a["worst_us"].as_f64().unwrap();
    let own_us = own_dev(worst) as f64 / 1e3;
    assert!(
        worst_us > LATE_START_US as f64 - 50.0 && own_us > worst_us - 200.0,
        "worst {worst} at {worst_us} µs, the log says {own_us} µs: {a:#}"
    );
    // A few late starts of 1 500 do not move the p99 nor make a drift.
    // A machine that stalled the sender past the bound for 1 % of its
    // sends or more moves the p99 with reason (CI once: 11 stalls besides
    // the 5 injected; once 13 over half a period and more between the
    // bound and that, p99 820 µs). The log counts them: it times each
    // send after its stamp, so it is as late or later.
    let bound_us = LATE_START_US as f64 / 2.0;
    let stalled = sent
        .keys()
        .filter(|&&seq| own_dev(seq) as f64 / 1e3 > bound_us)
        .count();
    if stalled * 100 < sent.len() {
        assert!(a["p99_us"].as_f64().unwrap() < bound_us, "{a:#}");
    }
    assert!(a["drift_us_per_s"].as_f64().unwrap().abs() < 100.0, "{a:#}");
}
