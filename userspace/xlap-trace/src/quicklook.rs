//! A first look at a run without SQL: per-stage latency percentiles between
//! consecutive stamp points of the same packet on the same host.
//!
//! Stages are named `from -> to` and computed per packet from the points in
//! their order along the path; a packet missing a point skips the stages that
//! touch it.

use crate::exit::{failure, Code};
use anyhow::{Context, Result};
use arrow_array::{Array, Int64Array, StringArray, UInt64Array, UInt8Array};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Path order of the kernel points (TX, then RX).
const ORDER: &[&str] = &[
    "sock.send_enter",
    "dev.queue",
    "qdisc.enqueue",
    "qdisc.dequeue",
    "dev.start_xmit",
    "dev.netif_rx",
    "dev.gro_receive",
    "dev.receive_skb",
    "sock.queue",
    "sched.wakeup",
    "sched.switch_in",
    "sock.recv_exit",
];

pub struct StageStats {
    pub stage: String,
    pub packets: usize,
    pub p50_ns: i64,
    pub p99_ns: i64,
    pub max_ns: i64,
}

/// Per-stage statistics of the stamps in a Parquet file.
pub fn stage_stats(parquet: &Path) -> Result<Vec<StageStats>> {
    let file = std::fs::File::open(parquet)
        .with_context(|| format!("cannot open {}", parquet.display()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| {
            failure(
                Code::Runtime,
                format!("{} is not a readable Parquet file: {e}", parquet.display()),
            )
        })?
        .build()?;
    // (host, flow, kind, seq) -> point -> first ts; stamps without a flow
    // (recv_exit) are matched by (host, pid, kind, seq) below.
    type Key = (String, u64, u8, u64);
    let mut packets: HashMap<Key, BTreeMap<usize, i64>> = HashMap::new();
    let mut by_pid: HashMap<(String, u32, u8, u64), u64> = HashMap::new();
    let mut flowless: Vec<(String, u32, u8, u64, usize, i64)> = Vec::new();
    for batch in reader {
        let batch = batch?;
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .with_context(|| format!("column {name} missing"))
        };
        let host = col("host")?
            .as_any()
            .downcast_ref::<StringArray>()
            .context("host")?
            .clone();
        let point = col("point")?
            .as_any()
            .downcast_ref::<StringArray>()
            .context("point")?
            .clone();
        let ts = col("ts_ns")?
            .as_any()
            .downcast_ref::<Int64Array>()
            .context("ts")?
            .clone();
        let seq = col("seq")?
            .as_any()
            .downcast_ref::<UInt64Array>()
            .context("seq")?
            .clone();
        let kind = col("kind")?
            .as_any()
            .downcast_ref::<UInt8Array>()
            .context("kind")?
            .clone();
        let flow = col("flow")?
            .as_any()
            .downcast_ref::<UInt64Array>()
            .context("flow")?
            .clone();
        let pid = col("pid")?
            .as_any()
            .downcast_ref::<arrow_array::UInt32Array>()
            .context("pid")?
            .clone();
        for i in 0..batch.num_rows() {
            if seq.is_null(i) {
                continue;
            }
            let Some(pos) = ORDER.iter().position(|p| *p == point.value(i)) else {
                continue;
            };
            let (h, s, k) = (host.value(i).to_string(), seq.value(i), kind.value(i));
            if flow.value(i) == 0 {
                flowless.push((h, pid.value(i), k, s, pos, ts.value(i)));
                continue;
            }
            if pos >= ORDER.iter().position(|p| *p == "dev.netif_rx").unwrap_or(0) {
                by_pid.insert((h.clone(), pid.value(i), k, s), flow.value(i));
            }
            packets
                .entry((h, flow.value(i), k, s))
                .or_default()
                .entry(pos)
                .or_insert(ts.value(i));
        }
    }
    for (h, pid, k, s, pos, t) in flowless {
        if let Some(flow) = by_pid.get(&(h.clone(), pid, k, s)) {
            packets
                .entry((h, *flow, k, s))
                .or_default()
                .entry(pos)
                .or_insert(t);
        }
    }
    let mut stages: BTreeMap<(usize, usize), Vec<i64>> = BTreeMap::new();
    for points in packets.values() {
        let v: Vec<(&usize, &i64)> = points.iter().collect();
        for w in v.windows(2) {
            // TX and RX halves of the same packet on one host are joined at
            // the wire (start_xmit -> netif_rx): both are one host's clock.
            stages
                .entry((*w[0].0, *w[1].0))
                .or_default()
                .push(w[1].1 - w[0].1);
        }
    }
    Ok(stages
        .into_iter()
        .map(|((a, b), mut d)| {
            d.sort_unstable();
            let q = |p: f64| d[((d.len() - 1) as f64 * p).round() as usize];
            StageStats {
                stage: format!("{} -> {}", ORDER[a], ORDER[b]),
                packets: d.len(),
                p50_ns: q(0.5),
                p99_ns: q(0.99),
                max_ns: *d.last().expect("non-empty"),
            }
        })
        .collect())
}

pub fn print(stats: &[StageStats]) {
    println!(
        "{:<36} {:>8} {:>10} {:>10} {:>10}",
        "stage", "packets", "p50 µs", "p99 µs", "max µs"
    );
    for s in stats {
        println!(
            "{:<36} {:>8} {:>10.1} {:>10.1} {:>10.1}",
            s.stage,
            s.packets,
            s.p50_ns as f64 / 1e3,
            s.p99_ns as f64 / 1e3,
            s.max_ns as f64 / 1e3
        );
    }
}
