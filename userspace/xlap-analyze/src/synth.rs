//! Synthetic runs with a known ground truth, for the query tests and the
//! analysis benchmark: a packets table written as `correlate` writes one
//! (the same columns, totals and stages: `packets_table`) and a `run.json`
//! with tracer counters.
//!
//! Every random draw is a pure function of (seed, packet, stream): a 32-bit
//! integer hash evaluated by DuckDB, so the output does not depend on thread
//! scheduling or on the DuckDB version, and 10 M packets take seconds.
//!
//! Shape: stages are a base plus a log-normal body plus a rare Pareto tail
//! (heavy tails like real kernels). Ground truth planted on purpose:
//! - `qdisc_enqueue__qdisc_dequeue` is inflated by [`INFLATED_NS`] for data
//!   packets with seq in [`INFLATED_SEQS`]: the outlier-cause query must name
//!   it for them;
//! - the receiver's wake-up (`sock_queue__sched_wakeup`) has the heaviest
//!   tail, so it dominates the correlation with end-to-end latency;
//! - the sender's application stage has a large base but little spread
//!   (X-LAP's "high latency, weak correlation").
//! - [`LOSS_RATE`] of the packets are lost (no receiver columns), every 8th
//!   packet is parity (kind 1), the rest data (kind 0).

use crate::packets_table::{self, PointColumns};
use crate::{AnalyzeError, Result};
use duckdb::Connection;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use xlap_records::points::point_of_column;
use xlap_records::run_meta::{ClockPair, PointStats, RunMeta, RunOptions, SeqLayout};
use xlap_records::RunDir;

pub const INFLATED_SEQS: Range<u64> = 100..200;
pub const INFLATED_NS: i64 = 250_000;
pub const INFLATED_STAGE: &str = "qdisc_enqueue__qdisc_dequeue";
pub const LOSS_RATE: f64 = 0.005;
pub const PERIOD_NS: i64 = 100_000;

/// One stage: the time from the previous point of its side to `point`.
struct Stage {
    point: &'static str,
    base_ns: f64,
    /// Median of the log-normal body above the base, and its sigma.
    body_ns: f64,
    sigma: f64,
    /// Probability and scale of a Pareto (alpha 1.5) tail sample, capped at
    /// 100 times the scale.
    tail_p: f64,
    tail_ns: f64,
}

const fn st(
    point: &'static str,
    base_ns: f64,
    body_ns: f64,
    sigma: f64,
    tail_p: f64,
    tail_ns: f64,
) -> Stage {
    Stage {
        point,
        base_ns,
        body_ns,
        sigma,
        tail_p,
        tail_ns,
    }
}

const TX_FIRST: &str = "app_send_start";
const TX: &[Stage] = &[
    st("sock_send_enter", 55_000.0, 800.0, 0.1, 0.0, 0.0),
    st("dev_queue", 1_500.0, 900.0, 0.5, 0.002, 20_000.0),
    st("qdisc_enqueue", 300.0, 500.0, 0.4, 0.001, 10_000.0),
    st("qdisc_dequeue", 200.0, 400.0, 0.5, 0.002, 15_000.0),
    st("dev_start_xmit", 200.0, 300.0, 0.4, 0.001, 8_000.0),
    st("dev_xmit", 300.0, 600.0, 0.4, 0.001, 8_000.0),
    st("sock_send_exit", 400.0, 500.0, 0.4, 0.001, 5_000.0),
];
/// The crossing: dev_start_xmit → dev_netif_rx.
const CHANNEL: Stage = st("dev_netif_rx", 3_000.0, 400.0, 0.3, 0.001, 20_000.0);
const RX: &[Stage] = &[
    st("dev_receive_skb", 500.0, 700.0, 0.5, 0.002, 10_000.0),
    st("sock_queue", 800.0, 1_000.0, 0.5, 0.002, 10_000.0),
    st("sched_wakeup", 300.0, 400.0, 0.6, 0.02, 40_000.0),
    st("sched_switch_in", 1_000.0, 2_000.0, 0.7, 0.01, 30_000.0),
    st("sock_recv_exit", 800.0, 600.0, 0.4, 0.002, 5_000.0),
    st("app_deliver", 2_000.0, 1_500.0, 0.5, 0.005, 20_000.0),
];

fn draw(stage: &Stage, stream: u32) -> String {
    let (a, b, c) = (3 * stream, 3 * stream + 1, 3 * stream + 2);
    format!(
        "({base} + {body} * exp({sigma} * sqrt(-2 * ln(u(i, {a}))) * cos(2 * pi() * u(i, {b})))
          + CASE WHEN u(i, {c}) < {p} THEN {tail} * least(pow(u(i, {c}) / {p}, -1 / 1.5) - 1, 100) ELSE 0 END)::BIGINT",
        base = stage.base_ns,
        body = stage.body_ns,
        sigma = stage.sigma,
        p = stage.tail_p.max(1e-12),
        tail = stage.tail_ns,
    )
}

/// Writes `dir/packets.parquet` and `dir/run.json` for `packets` packets.
pub fn generate(conn: &Connection, dir: &Path, packets: u64, seed: u32) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| AnalyzeError::Input {
        path: dir.display().to_string(),
        what: format!("cannot create the directory: {e}"),
    })?;
    // murmur3's 32-bit finaliser over (packet, stream, seed): uniform in (0, 1).
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP MACRO fm1(x) AS (xor(x, x >> 16) * 2246822507) % 4294967296;
         CREATE OR REPLACE TEMP MACRO fm2(x) AS (xor(x, x >> 13) * 3266489909) % 4294967296;
         CREATE OR REPLACE TEMP MACRO u(i, s) AS
           (xor(fm2(fm1((i::UBIGINT * 2654435761 + s::UBIGINT * 374761393 + {seed}::UBIGINT * 668265263) % 4294967296)),
                fm2(fm1((i::UBIGINT * 2654435761 + s::UBIGINT * 374761393 + {seed}::UBIGINT * 668265263) % 4294967296)) >> 16) + 0.5)
           / 4294967296;"
    ))?;
    let mut stream = 0;
    let mut next_stream = || {
        stream += 1;
        stream
    };
    // Durations first, then points as running sums along each side.
    let mut durations = Vec::new();
    let mut tx_points = vec![TX_FIRST.to_string()];
    let mut prev = TX_FIRST;
    for s in TX {
        let name = format!("{prev}__{}", s.point);
        let mut expr = draw(s, next_stream());
        if name == INFLATED_STAGE {
            expr = format!(
                "{expr} + CASE WHEN kind = 0 AND seq >= {} AND seq < {} THEN {INFLATED_NS} ELSE 0 END",
                INFLATED_SEQS.start, INFLATED_SEQS.end
            );
        }
        durations.push(format!("{expr} AS d_{name}"));
        tx_points.push(s.point.to_string());
        prev = s.point;
    }
    durations.push(format!("{} AS d_channel", draw(&CHANNEL, next_stream())));
    let mut rx_points = vec![CHANNEL.point.to_string()];
    let mut prev = CHANNEL.point;
    for s in RX {
        let name = format!("{prev}__{}", s.point);
        durations.push(format!("{} AS d_{name}", draw(s, next_stream())));
        rx_points.push(s.point.to_string());
        prev = s.point;
    }
    let chain = |points: &[String], start: &str| -> Vec<String> {
        let mut out = Vec::new();
        let mut sum = start.to_string();
        for w in points.windows(2) {
            sum = format!("{sum} + d_{}__{}", w[0], w[1]);
            out.push(format!("{sum} AS {}_ns", w[1]));
        }
        out
    };
    let start = format!("i * {PERIOD_NS} + 1000000000");
    let mut point_cols = vec![format!("{start} AS {TX_FIRST}_ns")];
    point_cols.extend(chain(&tx_points, &start));
    let rx_start = "dev_start_xmit_ns + d_channel".to_string();
    let rx_cols: Vec<String> = std::iter::once(format!("{rx_start} AS dev_netif_rx_ns"))
        .chain(chain(&rx_points, "dev_netif_rx_ns"))
        .collect();
    let rx_null: Vec<String> = rx_points
        .iter()
        .map(|p| format!("CASE WHEN lost THEN NULL ELSE {p}_ns END AS {p}_ns"))
        .collect();
    let cols: Vec<(String, String)> = tx_points
        .iter()
        .map(|p| (format!("{p}_ns"), "tx".to_string()))
        .chain(
            rx_points
                .iter()
                .map(|p| (format!("{p}_ns"), "rx".to_string())),
        )
        .collect();
    let columns = PointColumns {
        cols: &cols,
        alias: "p",
    }
    .select_list(|column, d| match column {
        "run_id" => format!("'synth-{seed}'"),
        "flow" => "1".into(),
        "kind" => "p.kind".into(),
        "seq" => "p.seq".into(),
        "src_addr" => "'10.0.0.1'".into(),
        "dst_addr" => "'10.0.0.2'".into(),
        "dst_port" => "1".into(),
        "src_port" | "tx_socket_cookie" | "rx_socket_cookie" | "duplicate_skew_ns" => "NULL".into(),
        "tx_host" => "'synth-a'".into(),
        "rx_host" => "CASE WHEN p.lost THEN NULL ELSE 'synth-b' END".into(),
        "tx_pid" => "1000".into(),
        "rx_pid" => "CASE WHEN p.lost THEN NULL ELSE 2000 END".into(),
        // the htb classes 1:10 (kind 0) and 1:20 (kind 1) by SO_PRIORITY
        "priority" => "CASE WHEN p.kind = 1 THEN 65568 ELSE 65552 END".into(),
        "lost" => "p.lost".into(),
        "untraced" | "partial" => "false".into(),
        "recovered" | "duplicate" | "reordered" | "retransmitted" => "false".into(),
        "deadline_missed" => format!("coalesce({} - {} > 1000000, false)", d.rx_last, d.tx_first),
        "sample_weight" => "1".into(),
        other => unreachable!("packets column {other} has no expression"),
    });
    // Streamed into the Parquet writer in the order range() yields (the
    // engine keeps insertion order by default): no table of every packet
    // and no sort, which took 10 M packets 45 s and 8.6 GB.
    let query = format!(
        "(WITH r AS (SELECT range AS i, range::UBIGINT AS seq, CASE WHEN range % 8 = 7 THEN 1 ELSE 0 END AS kind,
                             u(range, 0) < {LOSS_RATE} AS lost
                      FROM range({packets})),
                d AS (SELECT *, {durations} FROM r),
                tx AS (SELECT *, {point_cols} FROM d),
                rx AS (SELECT *, {rx_cols} FROM tx),
                p AS (SELECT i, seq, kind, lost, {tx_list}, {rx_null} FROM rx)
           SELECT {columns} FROM p)",
        durations = durations.join(",\n  "),
        point_cols = point_cols.join(", "),
        rx_cols = rx_cols.join(", "),
        tx_list = tx_points
            .iter()
            .map(|p| format!("{p}_ns"))
            .collect::<Vec<_>>()
            .join(", "),
        rx_null = rx_null.join(", "),
    );
    packets_table::write(conn, &query, &RunDir::new(dir).packets(), &cols)?;
    write_run_json(conn, dir, packets, seed, &tx_points, &rx_points)?;
    crate::finish::store_aggregates(&RunDir::new(dir).packets());
    Ok(())
}

/// The tracer's side: per-point stamp counts, with a planted ring-buffer
/// overflow on one point so the loss query has something to report.
fn write_run_json(
    conn: &Connection,
    dir: &Path,
    packets: u64,
    seed: u32,
    tx_points: &[String],
    rx_points: &[String],
) -> Result<()> {
    let delivered: i64 = conn.query_row(
        &format!(
            "SELECT count(*) FILTER (WHERE NOT lost) FROM {}",
            crate::sql::path(&RunDir::new(dir).packets())
        ),
        [],
        |r| r.get(0),
    )?;
    let counter = |stamps: u64, ringbuf_full: u64| {
        let mut c = PointStats {
            stamps,
            ..PointStats::default()
        };
        let mut losses = vec![0; xlap_abi::LOSS_REASONS.len()];
        let full = xlap_abi::LOSS_REASONS
            .iter()
            .position(|r| *r == "ringbuf_full")
            .expect("a ring buffer loss reason");
        losses[full] = ringbuf_full;
        c.add_losses(&losses);
        c
    };
    let mut points = BTreeMap::new();
    for p in tx_points {
        points.insert(point_of_column(&format!("{p}_ns")), counter(packets, 0));
    }
    for p in rx_points {
        let lost = if p == "sched_switch_in" { 3 } else { 0 };
        points.insert(
            point_of_column(&format!("{p}_ns")),
            counter(delivered as u64, lost),
        );
    }
    let meta = RunMeta {
        software_version: env!("CARGO_PKG_VERSION").into(),
        run_id: format!("synth-{seed}"),
        host: "synth-a".into(),
        kernel: "synthetic".into(),
        boot_id: format!("synthetic-{seed}"),
        clock_start: ClockPair {
            monotonic_ns: 1_000_000_000,
            realtime_ns: 1_700_000_000_000_000_000,
            ..ClockPair::default()
        },
        options: RunOptions {
            layout: SeqLayout {
                seq_size: 8,
                kind_names: vec![(0, "data".into()), (1, "parity".into())],
                ..SeqLayout::default()
            },
            other: BTreeMap::from([(
                "synthetic".to_string(),
                serde_json::json!({"packets": packets, "seed": seed}),
            )]),
            ..RunOptions::default()
        },
        points,
        packets,
        stop_reason: "synthetic".into(),
        ..RunMeta::default()
    };
    let path = RunDir::new(dir).meta();
    meta.write(&path).map_err(|e| AnalyzeError::Input {
        path: path.display().to_string(),
        what: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlap_records::points::{column_stem, kernel_points, Side};

    /// The synthetic path is made of real points on their real sides
    /// (the app points are the example protocol's marker names).
    #[test]
    fn synthetic_points_are_the_vocabularys() {
        let side_of = |stem: &str| {
            kernel_points()
                .find(|p| column_stem(p.name) == stem)
                .map(|p| p.side)
        };
        let tx = std::iter::once(TX_FIRST).chain(TX.iter().map(|s| s.point));
        let rx = std::iter::once(CHANNEL.point).chain(RX.iter().map(|s| s.point));
        for (points, side) in [(tx.collect::<Vec<_>>(), Side::Tx), (rx.collect(), Side::Rx)] {
            for p in points {
                if !p.starts_with("app_") {
                    assert_eq!(side_of(p), Some(side), "{p}");
                }
            }
        }
        assert_eq!(INFLATED_STAGE.split("__").count(), 2);
        assert!(TX
            .windows(2)
            .any(|w| format!("{}__{}", w[0].point, w[1].point) == INFLATED_STAGE));
    }
}
