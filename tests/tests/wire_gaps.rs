//! Privileged: the `gaps` query (AFDX's Bandwidth Allocation Gap) on a traced
//! run of the example protocol across the two-host stage sending bursts of
//! four back to back, one burst per four periods: the packets that leave
//! sooner than half a period after the previous one are the second to
//! fourth of each burst, as the sender's own log of its send times says.

use xlap_stage::Stage;
use xlap_tests::example::{events, ExampleOptions};
use xlap_tests::privileged;
use xlap_tests::trace::{analyze_rows, trace_example};

const PERIOD_US: u64 = 500;
const COUNT: u32 = 400;

#[test]
fn bursts_break_the_minimum_gap_where_the_sender_says() {
    let Some(_guard) = privileged("wire_gaps") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "wire-gaps",
        &ExampleOptions {
            count: COUNT,
            period_us: PERIOD_US,
            send_args: vec!["--burst".into(), "4".into()],
            ..Default::default()
        },
        &["--quiet"],
    );
    let bag_us = PERIOD_US / 2;
    // The sender's own account: its data packets' send times, in order.
    let mut sent: Vec<(i64, u64)> = events(&t.sent, "sent")
        .filter(|e| e["kind"] == "data" && e["dropped"] == false)
        .map(|e| (e["t_ns"].as_i64().unwrap(), e["seq"].as_u64().unwrap()))
        .collect();
    sent.sort_unstable();
    let mut own: Vec<u64> = sent
        .windows(2)
        .filter(|w| w[1].0 - w[0].0 < bag_us as i64 * 1000)
        .map(|w| w[1].1)
        .collect();
    own.sort_unstable();
    assert!(
        own.len() >= (COUNT as usize / 4) * 3 * 9 / 10,
        "{} in the log",
        own.len()
    );

    let bag = format!("bag={bag_us}");
    let rows = analyze_rows(&t.run_dir(), "gaps", &["--kind", "data", "-p", &bag]);
    assert_eq!(rows.len(), 1, "one flow: {rows:#?}");
    let r = &rows[0];
    assert_eq!(r["violations"], own.len() as u64, "{r:#}");
    let first: Vec<u64> = r["violating_seqs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(first, own[..first.len()].to_vec(), "{r:#}");
    assert!(r["min_us"].as_f64().unwrap() < bag_us as f64, "{r:#}");
    // Between bursts: four periods less the burst's own span.
    assert!(
        r["max_us"].as_f64().unwrap() > 3.0 * PERIOD_US as f64,
        "{r:#}"
    );
}
