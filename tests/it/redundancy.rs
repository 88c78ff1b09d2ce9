//! Privileged: the `redundancy` query on a traced run of the example protocol
//! sending every datagram over two independent paths (the stage's second
//! veth pair, AFDX's networks A and B). For a known range of packets the
//! copy on path 1 leaves 1.5 ms after the copy on path 2 (the sender's
//! `path1` injection), so path 2 wins them and their copies are further
//! apart than a 1 ms SkewMax. Checked against the program's own account:
//! when the sender sent each copy (its `sent` lines; on veth a copy sent
//! first reaches the receiving device first). The receiver's own choice (the
//! copy it read first) is not the arrival order when it was descheduled
//! while both copies arrived (it then reads path 1 first): it is checked
//! only to mostly follow the injection.

use std::collections::{BTreeMap, BTreeSet};
use xlap_stage::{Stage, StageConfig};
use xlap_tests::example::{events, ExampleOptions, RECEIVER_PORT, SENDER_PORT};
use xlap_tests::privileged;
use xlap_tests::trace::{analyze_rows, trace_example};

const COUNT: u32 = 300;
/// Longer than the injected delay: the transmit thread never falls behind.
const PERIOD_US: u64 = 2_000;
const LATE_PATH1: (u32, u32) = (200, 239);
const LATE_US: u64 = 1_500;
const SKEW_MAX_US: i64 = 1_000;
/// Copies whose send times lie this close to SkewMax may fall either side
/// of it at the receiver's device.
const BORDER_US: i64 = 50;

#[test]
fn the_tool_sees_which_path_won_and_the_late_copies_as_the_protocol_does() {
    let Some(_guard) = privileged("redundancy") else {
        return;
    };
    let stage = Stage::build(&StageConfig {
        second_path: true,
        ..Default::default()
    })
    .expect("stage");
    let (a, b) = (stage.host(0), stage.host(1));
    let second = |host: &xlap_stage::Host, port: u16| {
        std::net::SocketAddr::new(host.second_addr(false).expect("second path"), port).to_string()
    };
    let t = trace_example(
        &stage,
        "redundancy",
        &ExampleOptions {
            count: COUNT,
            period_us: PERIOD_US,
            send_args: vec![
                "--dest2".into(),
                second(b, RECEIVER_PORT),
                "--bind2".into(),
                second(a, SENDER_PORT),
                "--inject".into(),
                format!("path1={LATE_US}@{}-{}", LATE_PATH1.0, LATE_PATH1.1),
            ],
            recv_args: vec!["--bind2".into(), second(b, RECEIVER_PORT)],
            ..Default::default()
        },
        &["--quiet"],
    );

    // The receiver's account: the path of the first copy it read, per seq.
    let mut first_path: BTreeMap<u64, u64> = BTreeMap::new();
    for e in events(&t.received, "received").filter(|e| e["kind"] == "data") {
        first_path
            .entry(e["seq"].as_u64().unwrap())
            .or_insert(e["path"].as_u64().expect("received lines carry a path"));
    }
    let path2_first: BTreeSet<u64> = first_path
        .iter()
        .filter(|(_, p)| **p == 2)
        .map(|(s, _)| *s)
        .collect();
    let injected: BTreeSet<u64> = (LATE_PATH1.0 as u64..=LATE_PATH1.1 as u64).collect();
    assert!(
        injected.intersection(&path2_first).count() * 10 >= injected.len() * 9,
        "the receiver read path 2 first for {path2_first:?}"
    );
    // The sender's account: when each copy left (after its send call), and
    // the span of both calls (from before the first to after the second).
    let mut sent: BTreeMap<u64, [Option<i64>; 2]> = BTreeMap::new();
    let mut calls: BTreeMap<u64, [Option<(i64, i64)>; 2]> = BTreeMap::new();
    for e in events(&t.sent, "sent").filter(|e| e["kind"] == "data") {
        let path = e["path"].as_u64().expect("sent lines carry a path") as usize;
        let seq = e["seq"].as_u64().unwrap();
        let end = e["t_ns"].as_i64().unwrap();
        let start = e["t_start_ns"]
            .as_i64()
            .expect("sent lines carry t_start_ns");
        sent.entry(seq).or_default()[path - 1] = Some(end);
        calls.entry(seq).or_default()[path - 1] = Some((start, end));
    }
    // On veth a copy reaches the receiving device inside its send call, so
    // the skew at the device is at most from the first call's start to the
    // second call's end.
    let call_spans: Vec<i64> = calls
        .values()
        .filter_map(|[p1, p2]| {
            let (a, b) = (p1.as_ref()?, p2.as_ref()?);
            Some((a.1.max(b.1) - a.0.min(b.0)) / 1000)
        })
        .collect();
    let skews: BTreeMap<u64, i64> = sent
        .iter()
        .filter_map(|(s, [p1, p2])| Some((*s, (p1.as_ref()? - p2.as_ref()?).abs() / 1000)))
        .collect();
    assert_eq!(
        skews.len(),
        COUNT as usize,
        "both copies of every packet sent"
    );
    let path2_sent_first: BTreeSet<u64> = sent
        .iter()
        .filter(|(_, [p1, p2])| p2 < p1)
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(path2_sent_first, injected);
    // Each copy reached the device somewhere inside its send call: the
    // skew at the device lies between the calls' nearest ends and their
    // farthest ends (a sender preempted inside its first call, after its
    // copy left, sends the second copy late: 1 ms apart at the device for
    // a pair whose after-call times are close). Over SkewMax for certain
    // when even the nearest ends are; either side when the range holds it.
    let device_skew_us = |[p1, p2]: &[Option<(i64, i64)>; 2]| -> Option<(i64, i64)> {
        let ((s1, e1), (s2, e2)) = (p1.as_ref()?, p2.as_ref()?);
        let least = (s2 - e1).max(s1 - e2).max(0);
        let most = (e2 - s1).max(e1 - s2);
        Some((least / 1000, most / 1000))
    };
    let over: BTreeSet<u64> = calls
        .iter()
        .filter(|(_, c)| {
            device_skew_us(c).is_some_and(|(least, _)| least > SKEW_MAX_US + BORDER_US)
        })
        .map(|(s, _)| *s)
        .collect();
    let border: BTreeSet<u64> = calls
        .iter()
        .filter(|(s, c)| {
            !over.contains(s)
                && device_skew_us(c).is_some_and(|(_, most)| most >= SKEW_MAX_US - BORDER_US)
        })
        .map(|(s, _)| *s)
        .collect();

    let skew_max = format!("skew_max={SKEW_MAX_US}");
    let rows = analyze_rows(
        &t.run_dir(),
        "redundancy",
        &["--kind", "data", "-p", &skew_max],
    );
    assert_eq!(rows.len(), 1, "one redundant stream: {rows:#?}");
    let r = &rows[0];
    let paths: Vec<&str> = r["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let mut expected = vec![
        second(b, RECEIVER_PORT),
        std::net::SocketAddr::new(b.addr(false), RECEIVER_PORT).to_string(),
    ];
    expected.sort();
    assert_eq!(paths, expected, "{r:#}");
    assert_eq!(r["packets"], COUNT, "{r:#}");
    assert_eq!(r["with_copies"], COUNT, "{r:#}");
    assert_eq!(r["one_path_only"], 0, "{r:#}");
    let copies: Vec<u64> = r["copies_per_path"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(copies, [COUNT as u64, COUNT as u64], "{r:#}");
    // Which path won: the seqs the usually slower path won are exactly
    // those whose path-2 copy the sender sent first.
    let upsets: BTreeSet<u64> = r["upset_seqs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(upsets, path2_sent_first, "{r:#}");
    let wins: u64 = r["wins_per_path"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .sum();
    assert_eq!(wins, COUNT as u64, "{r:#}");
    // The copies beyond SkewMax: those the sender sent further apart.
    let tool_over: BTreeSet<u64> = r["over_skew_max_seqs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    let unexplained: Vec<_> = tool_over
        .symmetric_difference(&over)
        .filter(|s| !border.contains(s))
        .collect();
    assert!(
        unexplained.is_empty(),
        "over SkewMax: tool {tool_over:?}, sender {over:?} (border {border:?})"
    );
    assert!(injected.is_subset(&tool_over), "{r:#}");
    let max_sent = *skews.values().max().unwrap() as f64;
    let max_span = *call_spans.iter().max().unwrap() as f64;
    let max_tool = r["skew_max_us"].as_f64().unwrap();
    // The busy-wait between the two sends bounds the skew from below; the
    // span of the two send calls from above (a preemption inside the first
    // call after its copy reached the device shortens the skew of the
    // sender's after-call times, not the device's).
    assert!(
        max_tool >= LATE_US as f64 - 50.0 && max_tool <= max_span,
        "largest skew: tool {max_tool} µs, injected {LATE_US} µs, sender's log {max_sent} µs after the calls, {max_span} µs over both calls"
    );
    // Most copies leave together: each copy's skew is within the span of
    // its two send calls, so the median is within their median (how long a
    // call takes depends on the machine's load: the bound is the sender's
    // log, not a constant), and it stays far below SkewMax.
    let mut spans = call_spans.clone();
    spans.sort_unstable();
    let p50_span = spans[spans.len() / 2] as f64;
    let p50_tool = r["skew_p50_us"].as_f64().unwrap();
    assert!(
        p50_tool <= p50_span && p50_tool < SKEW_MAX_US as f64 / 2.0,
        "median skew: tool {p50_tool} µs, the send calls' span {p50_span} µs: {r:#}"
    );
}
