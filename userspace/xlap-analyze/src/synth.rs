//! Synthetic runs with a known ground truth, for the query tests and the
//! analysis benchmark: a packets table written as `correlate` writes one
//! (the same columns, totals and stages: `packets_table`) and a `run.json`
//! with tracer counters.
//!
//! Every random draw is a pure function of (seed, packet, stream): a 32-bit
//! integer hash, so the output does not depend on thread scheduling. The
//! points are drawn in Rust on every core and handed to DuckDB, which
//! derives the rest of the table exactly as `correlate` does.
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
use crate::{sql, AnalyzeError, Result};
use duckdb::Connection;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
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
const CHANNEL_FROM: &str = "dev_start_xmit";
const CHANNEL: Stage = st("dev_netif_rx", 3_000.0, 400.0, 0.3, 0.001, 20_000.0);
const RX: &[Stage] = &[
    st("dev_receive_skb", 500.0, 700.0, 0.5, 0.002, 10_000.0),
    st("sock_queue", 800.0, 1_000.0, 0.5, 0.002, 10_000.0),
    st("sched_wakeup", 300.0, 400.0, 0.6, 0.02, 40_000.0),
    st("sched_switch_in", 1_000.0, 2_000.0, 0.7, 0.01, 30_000.0),
    st("sock_recv_exit", 800.0, 600.0, 0.4, 0.002, 5_000.0),
    st("app_deliver", 2_000.0, 1_500.0, 0.5, 0.005, 20_000.0),
];

/// The random draws, in Rust: the SQL version spent 29 of its 40 s on
/// 10 M packets evaluating them (`synth` ≤ 15 s is issue 32's goal).
mod draws {
    use super::Stage;

    /// murmur3's 32-bit finaliser steps (kept in u64, as the SQL had them).
    fn fm1(x: u64) -> u64 {
        ((x ^ (x >> 16)) * 2_246_822_507) % (1 << 32)
    }

    fn fm2(x: u64) -> u64 {
        ((x ^ (x >> 13)) * 3_266_489_909) % (1 << 32)
    }

    /// Uniform in (0, 1), a pure function of (packet, stream, seed).
    pub fn unit(i: u64, stream: u32, seed: u32) -> f64 {
        let h =
            (i * 2_654_435_761 + u64::from(stream) * 374_761_393 + u64::from(seed) * 668_265_263)
                % (1 << 32);
        let f = fm2(fm1(h));
        ((f ^ (f >> 16)) as f64 + 0.5) / 4_294_967_296.0
    }

    /// A stage's duration: base + log-normal body (Box–Muller over two
    /// units) + a Pareto tail with probability `tail_p`, rounded half away
    /// from zero.
    pub fn duration(stage: &Stage, i: u64, stream: u32, seed: u32) -> i64 {
        let (a, b, c) = (3 * stream, 3 * stream + 1, 3 * stream + 2);
        let normal = (-2.0 * unit(i, a, seed).ln()).sqrt()
            * (2.0 * std::f64::consts::PI * unit(i, b, seed)).cos();
        let body = stage.base_ns + stage.body_ns * (stage.sigma * normal).exp();
        let p = stage.tail_p.max(1e-12);
        let uc = unit(i, c, seed);
        let tail = if uc < p {
            stage.tail_ns * ((uc / p).powf(-1.0 / 1.5) - 1.0).min(100.0)
        } else {
            0.0
        };
        round_positive(body + tail)
    }

    /// `x.round() as i64` for `x >= 0` (a duration), bit for bit: the
    /// baseline x86-64 target has no rounding instruction, and the libm
    /// call was 7 % of drawing the points. The fraction `x - trunc(x)` of
    /// a double is exact, so comparing it with 0.5 rounds half away from
    /// zero as `round` does.
    pub fn round_positive(x: f64) -> i64 {
        debug_assert!(x >= 0.0, "{x}");
        let t = x as i64;
        if x - t as f64 >= 0.5 {
            t + 1
        } else {
            t
        }
    }
}

/// The generated points, before the packets table derives the rest: the
/// seq, kind, loss and every point column of each packet.
struct PointsSchema {
    schema: arrow_schema::SchemaRef,
    tx: Vec<String>,
    rx: Vec<String>,
    /// The index in `TX` of the stage that ends in [`INFLATED_STAGE`].
    inflated: usize,
}

impl PointsSchema {
    fn new() -> Self {
        use arrow_schema::{DataType, Field, Schema};
        let tx: Vec<String> = std::iter::once(TX_FIRST)
            .chain(TX.iter().map(|s| s.point))
            .map(|p| format!("{p}_ns"))
            .collect();
        let rx: Vec<String> = std::iter::once(CHANNEL.point)
            .chain(RX.iter().map(|s| s.point))
            .map(|p| format!("{p}_ns"))
            .collect();
        let mut fields = vec![
            Field::new("seq", DataType::UInt64, false),
            Field::new("kind", DataType::Int32, false),
            Field::new("lost", DataType::Boolean, false),
        ];
        fields.extend(tx.iter().map(|c| Field::new(c, DataType::Int64, false)));
        fields.extend(rx.iter().map(|c| Field::new(c, DataType::Int64, true)));
        let inflated = TX
            .iter()
            .enumerate()
            .position(|(n, s)| {
                let prev = if n == 0 { TX_FIRST } else { TX[n - 1].point };
                format!("{prev}__{}", s.point) == INFLATED_STAGE
            })
            .expect("the inflated stage is a sender stage");
        PointsSchema {
            schema: std::sync::Arc::new(Schema::new(fields)),
            tx,
            rx,
            inflated,
        }
    }

    /// Packets `range` as one batch.
    fn batch(&self, range: Range<u64>, seed: u32) -> arrow_array::RecordBatch {
        use arrow_array::builder::{BooleanBuilder, Int32Builder, Int64Builder, UInt64Builder};
        use arrow_array::ArrayRef;
        use std::sync::Arc;
        let n = (range.end - range.start) as usize;
        let mut seq = UInt64Builder::with_capacity(n);
        let mut kind = Int32Builder::with_capacity(n);
        let mut lost = BooleanBuilder::with_capacity(n);
        let mut tx: Vec<Int64Builder> = self
            .tx
            .iter()
            .map(|_| Int64Builder::with_capacity(n))
            .collect();
        let mut rx: Vec<Int64Builder> = self
            .rx
            .iter()
            .map(|_| Int64Builder::with_capacity(n))
            .collect();
        // Streams: 0 decides the loss, then one per stage in path order.
        for i in range {
            let k = if i % 8 == 7 { 1 } else { 0 };
            let is_lost = draws::unit(i, 0, seed) < LOSS_RATE;
            seq.append_value(i);
            kind.append_value(k);
            lost.append_value(is_lost);
            let mut stream = 0;
            let mut at = i as i64 * PERIOD_NS + 1_000_000_000;
            tx[0].append_value(at);
            let mut start_xmit = 0;
            for (n, (s, col)) in TX.iter().zip(&mut tx[1..]).enumerate() {
                stream += 1;
                at += draws::duration(s, i, stream, seed);
                if n == self.inflated && k == 0 && INFLATED_SEQS.contains(&i) {
                    at += INFLATED_NS;
                }
                if s.point == CHANNEL_FROM {
                    start_xmit = at;
                }
                col.append_value(at);
            }
            stream += 1;
            let mut at = start_xmit + draws::duration(&CHANNEL, i, stream, seed);
            let mut points = Vec::with_capacity(rx.len());
            points.push(at);
            for s in RX {
                stream += 1;
                at += draws::duration(s, i, stream, seed);
                points.push(at);
            }
            for (col, at) in rx.iter_mut().zip(points) {
                if is_lost {
                    col.append_null();
                } else {
                    col.append_value(at);
                }
            }
        }
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(seq.finish()),
            Arc::new(kind.finish()),
            Arc::new(lost.finish()),
        ];
        columns.extend(tx.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        columns.extend(rx.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        arrow_array::RecordBatch::try_new(self.schema.clone(), columns)
            .expect("columns built to the schema")
    }
}
/// Rows per generated batch: small enough to stay in cache-sized memory.
const BATCH_ROWS: u64 = 65_536;
/// Row groups of the parts: DuckDB's scan of them holds whole row groups.
/// Measured on 10 M packets, peak memory with groups of 1 M rows 2.6–2.9 GB,
/// of 122 880 rows 1.85 GB, of 61 440 rows 1.15–1.36 GB at the same speed.
const ROW_GROUP_ROWS: usize = 61_440;

/// Writes the generated points of `packets` packets as Parquet files in
/// `dir`, one per thread over consecutive packets, uncompressed (they live
/// for one `COPY`); returns them in packet order, and how many packets
/// were delivered (not lost).
fn write_points(
    dir: &Path,
    points: &PointsSchema,
    packets: u64,
    seed: u32,
) -> Result<(Vec<PathBuf>, u64)> {
    use arrow_array::cast::AsArray;
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::{EnabledStatistics, WriterProperties};
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let per = packets.div_ceil(threads).max(1);
    let parts: Vec<(PathBuf, Range<u64>)> = (0..threads)
        .map(|t| (t * per, ((t + 1) * per).min(packets)))
        .filter(|(a, b)| a < b || (packets == 0 && *a == 0))
        .enumerate()
        .map(|(t, (a, b))| (dir.join(format!(".synth-points-{t}.parquet")), a..b))
        .collect();
    let props = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let write_part = |path: &Path, range: Range<u64>| -> std::result::Result<u64, String> {
        let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
        let mut w = ArrowWriter::try_new(file, points.schema.clone(), Some(props.clone()))
            .map_err(|e| e.to_string())?;
        let (mut at, mut delivered) = (range.start, 0);
        while at < range.end {
            let end = (at + BATCH_ROWS).min(range.end);
            let batch = points.batch(at..end, seed);
            let lost = batch.column(2).as_boolean().true_count();
            delivered += (end - at) - lost as u64;
            w.write(&batch).map_err(|e| e.to_string())?;
            at = end;
        }
        w.close().map_err(|e| e.to_string())?;
        Ok(delivered)
    };
    let results: Vec<std::result::Result<u64, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .iter()
            .map(|(path, range)| s.spawn(|| write_part(path, range.clone())))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("the generator thread panicked".into()))
            })
            .collect()
    });
    let paths: Vec<PathBuf> = parts.into_iter().map(|(p, _)| p).collect();
    let mut delivered = 0;
    for (path, r) in paths.iter().zip(results) {
        match r {
            Ok(n) => delivered += n,
            Err(what) => {
                remove_all(&paths);
                return Err(AnalyzeError::Input {
                    path: path.display().to_string(),
                    what: format!("cannot write the generated points: {what}"),
                });
            }
        }
    }
    Ok((paths, delivered))
}

fn remove_all(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// How long each step of [`generate`] took: printed by `synth`, so that
/// the next change to it knows where the time goes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Steps {
    /// Drawing the points (Rust, every core).
    pub points: std::time::Duration,
    /// The packets table derived from them and written (DuckDB).
    pub packets_table: std::time::Duration,
    /// The per-run aggregates stored beside it (`stored`).
    pub aggregates: std::time::Duration,
}

/// Writes `dir/packets.parquet` and `dir/run.json` for `packets` packets.
pub fn generate(conn: &Connection, dir: &RunDir, packets: u64, seed: u32) -> Result<Steps> {
    let mut steps = Steps::default();
    let t = std::time::Instant::now();
    std::fs::create_dir_all(dir.path()).map_err(|e| AnalyzeError::Input {
        path: dir.path().display().to_string(),
        what: format!("cannot create the directory: {e}"),
    })?;
    let points = PointsSchema::new();
    let (parts, delivered) = write_points(dir.path(), &points, packets, seed)?;
    steps.points = t.elapsed();
    let t = std::time::Instant::now();
    let cols: Vec<(String, String)> = points
        .tx
        .iter()
        .map(|c| (c.clone(), "tx".to_string()))
        .chain(points.rx.iter().map(|c| (c.clone(), "rx".to_string())))
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
        "tx_cgroup" | "rx_cgroup" => "NULL".into(),
        "lost" => "p.lost".into(),
        "untraced" | "partial" => "false".into(),
        "recovered" | "duplicate" | "reordered" | "retransmitted" => "false".into(),
        "deadline_missed" => format!("coalesce({} - {} > 1000000, false)", d.rx_last, d.tx_first),
        "sample_weight" => "1".into(),
        other => unreachable!("packets column {other} has no expression"),
    });
    // The parts are read in the order listed and the engine keeps insertion
    // order: the table comes out in packet order without a sort.
    let files: Vec<String> = parts.iter().map(|p| sql::path(p)).collect();
    let query = format!(
        "(SELECT {columns} FROM read_parquet([{}]) AS p)",
        files.join(", ")
    );
    let written = packets_table::write(conn, &query, &dir.packets(), &cols);
    remove_all(&parts);
    written?;
    write_run_json(dir, packets, delivered, seed, &points.tx, &points.rx)?;
    steps.packets_table = t.elapsed();
    let t = std::time::Instant::now();
    crate::finish::store_aggregates(&dir.packets());
    steps.aggregates = t.elapsed();
    Ok(steps)
}

/// The tracer's side: per-point stamp counts (`tx_columns`, `rx_columns`:
/// the point columns of each side), with a planted ring-buffer overflow on
/// one point so the loss query has something to report.
fn write_run_json(
    dir: &RunDir,
    packets: u64,
    delivered: u64,
    seed: u32,
    tx_columns: &[String],
    rx_columns: &[String],
) -> Result<()> {
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
    for c in tx_columns {
        points.insert(point_of_column(c), counter(packets, 0));
    }
    for c in rx_columns {
        let lost = if c == "sched_switch_in_ns" { 3 } else { 0 };
        points.insert(point_of_column(c), counter(delivered, lost));
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
        stop_reason: xlap_records::run_meta::StopReason::Synthetic,
        ..RunMeta::default()
    };
    let path = dir.meta();
    meta.write(&path).map_err(|e| AnalyzeError::Input {
        path: path.display().to_string(),
        what: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use xlap_records::points::{column_stem, kernel_points, Side};

    /// A packet's draws do not depend on which batch (which thread) made
    /// it: the parts can be split anywhere.
    #[test]
    fn batches_split_anywhere_give_the_same_packets() {
        let points = PointsSchema::new();
        let whole = points.batch(90..300, 5);
        let parts = [points.batch(90..101, 5), points.batch(101..300, 5)];
        let joined = arrow_select_concat(&points, &parts);
        assert_eq!(whole, joined);
        // Loss and the planted inflation are there to be found.
        let lost = whole.column(2).as_boolean().true_count();
        assert!(lost < 10, "{lost}");
        let dequeue = whole
            .column_by_name("qdisc_dequeue_ns")
            .unwrap()
            .as_primitive::<arrow_array::types::Int64Type>();
        let enqueue = whole
            .column_by_name("qdisc_enqueue_ns")
            .unwrap()
            .as_primitive::<arrow_array::types::Int64Type>();
        let stage = |row: usize| dequeue.value(row) - enqueue.value(row);
        // seq 150 (row 60) is a data packet in the inflated range, seq 250
        // (row 160) one outside it.
        assert!(stage(60) >= INFLATED_NS, "{}", stage(60));
        assert!(stage(160) < INFLATED_NS, "{}", stage(160));
    }

    #[test]
    fn rounding_a_duration_is_rounding_half_away_from_zero() {
        let halves = (0..2000).map(|n| n as f64 + 0.5);
        let near = [
            0.0,
            0.49999999999999994,
            1.5 - f64::EPSILON,
            2.5 + f64::EPSILON,
        ];
        let drawn =
            (0..100_000).map(|i| draws::duration(&RX[2], i, 4, 7) as f64 + draws::unit(i, 9, 7));
        for x in halves.chain(near).chain(drawn) {
            assert_eq!(draws::round_positive(x), x.round() as i64, "{x}");
        }
    }

    fn arrow_select_concat(
        points: &PointsSchema,
        parts: &[arrow_array::RecordBatch],
    ) -> arrow_array::RecordBatch {
        let columns = (0..points.schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn arrow_array::Array> =
                    parts.iter().map(|b| b.column(c).as_ref()).collect();
                arrow_select::concat::concat(&arrays).unwrap()
            })
            .collect();
        arrow_array::RecordBatch::try_new(points.schema.clone(), columns).unwrap()
    }

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
        assert_eq!(
            PointsSchema::new().inflated,
            TX.iter().position(|s| s.point == "qdisc_dequeue").unwrap()
        );
        assert!(TX
            .windows(2)
            .any(|w| format!("{}__{}", w[0].point, w[1].point) == INFLATED_STAGE));
    }
}
