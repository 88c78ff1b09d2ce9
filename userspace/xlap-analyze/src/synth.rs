//! Synthetic runs with a known ground truth, for the query tests and the
//! analysis benchmark: a packets table shaped like `correlate`'s (same point,
//! stage, total and flag columns) and a `run.json` with tracer counters.
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

use crate::dataset::{sides_json, PACKETS_SCHEMA_VERSION, SIDES_KEY, VERSION_KEY};
use crate::{AnalyzeError, Result};
use duckdb::Connection;
use std::ops::Range;
use std::path::Path;

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
    let stage_cols = |points: &[String]| -> Vec<String> {
        points
            .windows(2)
            .map(|w| format!("{b}_ns - {a}_ns AS {a}__{b}_ns", a = w[0], b = w[1]))
            .collect()
    };
    let last_rx = rx_points.last().unwrap();
    let rx_null: Vec<String> = rx_points
        .iter()
        .map(|p| format!("CASE WHEN lost THEN NULL ELSE {p}_ns END AS {p}_ns"))
        .collect();
    let out = dir.join("packets.parquet");
    let sql = format!(
        "COPY (
           WITH r AS (SELECT range AS i, range::UBIGINT AS seq, CASE WHEN range % 8 = 7 THEN 1 ELSE 0 END::UTINYINT AS kind,
                             u(range, 0) < {LOSS_RATE} AS lost
                      FROM range({packets})),
                d AS (SELECT *, {durations} FROM r),
                tx AS (SELECT *, {point_cols} FROM d),
                rx AS (SELECT *, {rx_cols} FROM tx),
                p AS (SELECT i, seq, kind, lost, {tx_list}, {rx_null} FROM rx)
           SELECT 'synth-{seed}' AS run_id, 1::UBIGINT AS flow, kind, seq,
                  '10.0.0.1' AS src_addr, '10.0.0.2' AS dst_addr,
                  NULL::USMALLINT AS src_port, 1::USMALLINT AS dst_port,
                  NULL::UBIGINT AS tx_socket_cookie, NULL::UBIGINT AS rx_socket_cookie,
                  'synth-a' AS tx_host, CASE WHEN lost THEN NULL ELSE 'synth-b' END AS rx_host,
                  1000::UINTEGER AS tx_pid, CASE WHEN lost THEN NULL ELSE 2000::UINTEGER END AS rx_pid,
                  {TX_FIRST}_ns AS sent_ns,
                  -- the htb classes 1:10 (kind 0) and 1:20 (kind 1) by SO_PRIORITY
                  CASE WHEN kind = 1 THEN 65568 ELSE 65552 END::UINTEGER AS priority,
                  {all_points},
                  dev_start_xmit_ns - {TX_FIRST}_ns AS sender_total_ns,
                  dev_netif_rx_ns - dev_start_xmit_ns AS channel_ns,
                  {last_rx}_ns - dev_netif_rx_ns AS receiver_total_ns,
                  {last_rx}_ns - {TX_FIRST}_ns AS e2e_ns,
                  (dev_start_xmit_ns - {TX_FIRST}_ns) + ({last_rx}_ns - dev_netif_rx_ns) AS xlap_e2e_ns,
                  {stages},
                  lost, false AS recovered, false AS duplicate, NULL::BIGINT AS duplicate_skew_ns,
                  false AS reordered, false AS retransmitted,
                  coalesce({last_rx}_ns - {TX_FIRST}_ns > 1000000, false) AS deadline_missed
           FROM p
         ) TO '{file}' (FORMAT PARQUET, COMPRESSION ZSTD, KV_METADATA {{{VERSION_KEY}: '{PACKETS_SCHEMA_VERSION}', {SIDES_KEY}: '{sides}'}});",
        sides = sides_json(
            &tx_points
                .iter()
                .map(|p| (format!("{p}_ns"), "tx".to_string()))
                .chain(rx_points.iter().map(|p| (format!("{p}_ns"), "rx".to_string())))
                .collect::<Vec<_>>()
        ),
        durations = durations.join(",\n  "),
        point_cols = point_cols.join(", "),
        rx_cols = rx_cols.join(", "),
        tx_list = tx_points
            .iter()
            .map(|p| format!("{p}_ns"))
            .collect::<Vec<_>>()
            .join(", "),
        rx_null = rx_null.join(", "),
        all_points = tx_points
            .iter()
            .chain(rx_points.iter())
            .map(|p| format!("{p}_ns"))
            .collect::<Vec<_>>()
            .join(", "),
        stages = stage_cols(&tx_points)
            .into_iter()
            .chain(stage_cols(&rx_points))
            .collect::<Vec<_>>()
            .join(", "),
        file = out.display().to_string().replace('\'', "''"),
    );
    conn.execute_batch(&sql)?;
    write_run_json(conn, dir, packets, seed, &tx_points, &rx_points)
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
            "SELECT count(*) FILTER (WHERE NOT lost) FROM '{}'",
            dir.join("packets.parquet")
                .display()
                .to_string()
                .replace('\'', "''")
        ),
        [],
        |r| r.get(0),
    )?;
    let mut points = serde_json::Map::new();
    let counter = |stamps: u64, ringbuf_full: u64| {
        serde_json::json!({
            "stamps": stamps, "lost_ringbuf_full": ringbuf_full, "lost_map_full": 0,
            "lost_parse": 0, "lost_unmatched": 0
        })
    };
    for p in tx_points {
        points.insert(p.replacen('_', ".", 1), counter(packets, 0));
    }
    for p in rx_points {
        let lost = if p == "sched_switch_in" { 3 } else { 0 };
        points.insert(p.replacen('_', ".", 1), counter(delivered as u64, lost));
    }
    let meta = serde_json::json!({
        "schema_version": "1",
        "software_version": env!("CARGO_PKG_VERSION"),
        "run_id": format!("synth-{seed}"),
        "host": "synth-a",
        "kernel": "synthetic",
        "boot_id": format!("synthetic-{seed}"),
        "clock_start": {"monotonic_ns": 1_000_000_000i64, "realtime_ns": 1_700_000_000_000_000_000i64},
        "options": {
            "layout": {"seq_size": 8, "kind_names": [[0, "data"], [1, "parity"]]},
            "synthetic": {"packets": packets, "seed": seed}
        },
        "points": points,
        "packets": packets,
        "stop_reason": "synthetic",
    });
    let path = dir.join("run.json");
    std::fs::write(&path, serde_json::to_string_pretty(&meta).unwrap() + "\n").map_err(|e| {
        AnalyzeError::Input {
            path: path.display().to_string(),
            what: e.to_string(),
        }
    })
}
