//! Privileged: the example protocol across the stage, checked against its own
//! logs: 10 000 packets with a 1 % artificial drop, losses recovered exactly
//! as single-parity FEC allows.

use std::collections::{BTreeMap, BTreeSet};
use xlap_stage::Stage;
use xlap_tests::example::{events, summary, ExampleOptions, ProtocolRun};
use xlap_tests::{privileged, Scratch};

const K: u64 = 4;

#[test]
fn fec_recovers_every_single_loss_per_block_and_nothing_else_is_lost() {
    let Some(_guard) = privileged("fec_recovery") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("fec");
    let count = 10_000u64;
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: count as u32,
            period_us: 50,
            drop: 0.01,
            markers: true,
            ..Default::default()
        },
    );
    let (sent, received) = run.wait();

    // What the artificial channel dropped, per block: data indexes and parity.
    let mut dropped_data: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut dropped_parity: BTreeSet<u64> = BTreeSet::new();
    let mut drops = 0;
    for e in events(&sent, "sent").filter(|e| e["dropped"] == true) {
        drops += 1;
        let seq = e["seq"].as_u64().unwrap();
        match e["kind"].as_str().unwrap() {
            "data" => {
                dropped_data.entry(seq / K).or_default().insert(seq);
            }
            "parity" => {
                dropped_parity.insert(seq);
            }
            other => panic!("unexpected kind {other}"),
        }
    }
    assert!(
        (60..=160).contains(&drops),
        "a 1 % drop of ~12 500 packets dropped {drops}"
    );

    // Single parity: a block is rebuilt when it lost one data packet and its
    // parity arrived; otherwise its dropped data is lost.
    let mut expect_recovered = BTreeSet::new();
    let mut expect_lost = BTreeSet::new();
    for (block, seqs) in &dropped_data {
        if seqs.len() == 1 && !dropped_parity.contains(block) {
            expect_recovered.extend(seqs.iter().copied());
        } else {
            expect_lost.extend(seqs.iter().copied());
        }
    }
    let recovered: BTreeSet<u64> = events(&received, "recovered")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    let lost: BTreeSet<u64> = events(&received, "lost")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    let delivered: Vec<u64> = events(&received, "delivered")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(recovered, expect_recovered);
    assert_eq!(lost, expect_lost);
    assert!(
        !expect_recovered.is_empty(),
        "a 1 % drop over 2 500 blocks recovers something"
    );
    assert!(
        events(&received, "recovered").all(|e| e["intact"] == true),
        "rebuilt payloads match byte for byte"
    );

    // Delivered in order, every seq exactly once unless lost.
    assert!(
        delivered.windows(2).all(|w| w[0] < w[1]),
        "in-order delivery"
    );
    let all: BTreeSet<u64> = delivered
        .iter()
        .copied()
        .chain(lost.iter().copied())
        .collect();
    assert_eq!(all, (0..count).collect());
    let s = summary(&received);
    assert_eq!(
        s["delivered"].as_u64().unwrap() + s["lost"].as_u64().unwrap(),
        count
    );
    assert_eq!(
        s["recovered"].as_u64().unwrap(),
        expect_recovered.len() as u64
    );
    // Feedback flowed back.
    assert!(summary(&sent)["feedback_received"].as_u64().unwrap() > 0);
}

#[test]
fn ipv6_and_injected_delays_work_end_to_end() {
    let Some(_guard) = privileged("ipv6_inject") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("v6inject");
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: 400,
            period_us: 1000,
            ipv6: true,
            recv_args: vec!["--inject".into(), "deliver=500@100-199".into()],
            ..Default::default()
        },
    );
    let (_, received) = run.wait();
    assert_eq!(summary(&received)["delivered"], 400);
    // The application thread busy-waits 500 µs before delivering 100-199,
    // so by construction none of them can be delivered sooner than that.
    let min_injected = events(&received, "delivered")
        .filter(|e| (100..200).contains(&e["seq"].as_u64().unwrap()))
        .map(|e| e["latency_ns"].as_u64().unwrap())
        .min()
        .unwrap();
    assert!(min_injected >= 500_000, "{min_injected} ns");
}

/// Kinds have one name: the `xlap-example` preset (what the analyses show)
/// names them as the protocol's wire format and logs do.
#[test]
fn the_example_preset_names_kinds_as_the_protocol_does() {
    use prrt_lite::wire::Kind;
    let layout = xlap_capture::proto::preset("xlap-example").expect("the preset");
    let protocol: Vec<(u64, &str)> = Kind::ALL.iter().map(|k| (*k as u64, k.name())).collect();
    assert_eq!(layout.kind_names.to_vec(), protocol);
    for kind in Kind::ALL {
        assert_eq!(
            serde_json::to_value(kind).unwrap(),
            kind.name(),
            "the logs' name"
        );
    }
}
