//! Privileged: the `gaps` query (AFDX's Bandwidth Allocation Gap) on a traced
//! run of the example protocol across the two-host stage sending bursts of
//! four back to back, one burst per four periods: the packets that leave
//! sooner than half a period after the previous one are the second to
//! fourth of each burst, as the sender's own log of its send times says
//! (its clock before and after each send call brackets the wire's time).

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
    let bag_ns = bag_us as i64 * 1000;
    // The sender's own account: per data packet, its clock before and after
    // the send call. Its time on the wire (the device's transmit, inside the
    // call on the stage's noqueue veth) lies between them, so a gap is
    // surely short when even the widest bracket (previous start to this
    // end) is, and surely long when the narrowest (previous end to this
    // start) is not; in between, the scheduler preempted the sender around
    // a send and only the wire can tell.
    let mut sent: Vec<(i64, i64, u64)> = events(&t.sent, "sent")
        .filter(|e| e["kind"] == "data" && e["dropped"] == false)
        .map(|e| {
            let ns = |k: &str| e[k].as_i64().unwrap_or_else(|| panic!("{k} in {e}"));
            (ns("t_start_ns"), ns("t_ns"), e["seq"].as_u64().unwrap())
        })
        .collect();
    sent.sort_unstable();
    let (mut short, mut unsure) = (Vec::new(), Vec::new());
    for w in sent.windows(2) {
        let ((prev_start, prev_end, _), (start, end, seq)) = (w[0], w[1]);
        if end - prev_start < bag_ns {
            short.push(seq);
        } else if start - prev_end < bag_ns {
            unsure.push(seq);
        }
    }
    short.sort_unstable();
    eprintln!(
        "the sender's log: {} gaps surely below {bag_us} us, {} it cannot tell",
        short.len(),
        unsure.len()
    );
    assert!(
        short.len() >= (COUNT as usize / 4) * 3 * 9 / 10,
        "{} in the log",
        short.len()
    );

    let bag = format!("bag={bag_us}");
    let rows = analyze_rows(&t.run_dir(), "gaps", &["--kind", "data", "-p", &bag]);
    assert_eq!(rows.len(), 1, "one flow: {rows:#?}");
    let r = &rows[0];
    let violations = r["violations"].as_u64().unwrap() as usize;
    assert!(
        (short.len()..=short.len() + unsure.len()).contains(&violations),
        "{} surely short and {} unsure in the log: {r:#}",
        short.len(),
        unsure.len()
    );
    // The first violating seqs: each one the log allows, and none of the
    // surely short ones below the last of them left out.
    let first: Vec<u64> = r["violating_seqs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    let last = *first.last().expect("violating seqs");
    for seq in &first {
        assert!(
            short.contains(seq) || unsure.contains(seq),
            "seq {seq} left sooner than {bag_us} us after its predecessor, the log says not: {r:#}"
        );
    }
    for seq in short.iter().filter(|s| **s <= last) {
        assert!(first.contains(seq), "seq {seq} missing: {r:#}");
    }
    assert!(r["min_us"].as_f64().unwrap() < bag_us as f64, "{r:#}");
    // Between bursts: four periods less the burst's own span.
    assert!(
        r["max_us"].as_f64().unwrap() > 3.0 * PERIOD_US as f64,
        "{r:#}"
    );
}
