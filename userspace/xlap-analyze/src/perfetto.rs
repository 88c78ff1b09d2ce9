//! Per-packet timelines as Chrome trace-event JSON, for Perfetto
//! (ui.perfetto.dev) and chrome://tracing.
//!
//! Process 1 is the sender, process 2 the receiver. Each packet is a
//! nestable async slice `seq N` (id `flow:kind:seq`, category `kind K`) on
//! each side, with a child slice per stage between consecutive stamps of
//! that side; on the receiver the first child is `channel`, from the
//! sender's wire point to the receiver's. Times are µs from the earliest
//! stamp exported, with ns precision.

use crate::correlate::{RX_WIRE, TX_WIRE};
use crate::{AnalyzeError, Result};
use duckdb::Connection;
use serde_json::json;
use std::io::Write;
use std::path::Path;

pub struct ExportOptions {
    /// At most this many packets, the slowest first (0: all).
    pub max_packets: u64,
    pub kind: Option<u64>,
}

/// flow, kind, seq, sender host, receiver host, a stamp per point column.
type Packet = (u64, u64, u64, String, String, Vec<Option<i64>>);

pub struct Exported {
    pub packets: u64,
    /// Packets left out by `max_packets`.
    pub left_out: u64,
    pub events: u64,
}

pub fn export(conn: &Connection, out: &Path, opts: &ExportOptions) -> Result<Exported> {
    let points: Vec<(String, String)> = {
        let mut stmt = conn.prepare("SELECT col, side FROM point_columns ORDER BY position")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    let (packets, total) = slowest_packets(conn, &points, opts)?;
    let origin = packets
        .iter()
        .flat_map(|p| p.5.iter().flatten())
        .min()
        .copied()
        .unwrap_or(0);
    let file = std::fs::File::create(out).map_err(|e| AnalyzeError::Input {
        path: out.display().to_string(),
        what: format!("cannot write: {e}"),
    })?;
    let mut w = std::io::BufWriter::new(file);
    let io = |e: std::io::Error| AnalyzeError::Input {
        path: out.display().to_string(),
        what: e.to_string(),
    };
    let us = |ns: i64| (ns - origin) as f64 / 1e3;
    let mut events: u64 = 0;
    let mut first = true;
    let mut emit = |w: &mut std::io::BufWriter<std::fs::File>, e: serde_json::Value| {
        let sep = if first { "" } else { ",\n" };
        first = false;
        events += 1;
        write!(w, "{sep}{e}")
    };
    writeln!(w, "{{\"displayTimeUnit\": \"ns\", \"traceEvents\": [").map_err(io)?;
    let (tx_host, rx_host) = packets
        .first()
        .map(|p| (p.3.clone(), p.4.clone()))
        .unwrap_or_default();
    for (pid, name) in [
        (1, format!("sender {tx_host}")),
        (2, format!("receiver {rx_host}")),
    ] {
        emit(
            &mut w,
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}),
        )
        .map_err(io)?;
    }
    let col_index = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| points.iter().position(|(c, _)| *c == format!("{n}_ns")))
    };
    let (tx_wire, rx_wire) = (col_index(TX_WIRE), col_index(RX_WIRE));
    for (flow, kind, seq, _, _, stamps) in &packets {
        let id = format!("{flow}:{kind}:{seq}");
        let cat = format!("kind {kind}");
        for (pid, side) in [(1, "tx"), (2, "rx")] {
            let steps = side_steps(&points, stamps, side, (tx_wire, rx_wire));
            let (Some(start), Some(end)) = (steps.first(), steps.last()) else {
                continue;
            };
            let outer = format!("seq {seq}");
            emit(&mut w, json!({"ph": "b", "cat": cat, "id": id, "name": outer, "pid": pid, "tid": 0, "ts": us(start.1)}))
                .map_err(io)?;
            for pair in steps.windows(2) {
                let name = if pair[0].0 == "sender wire" {
                    "channel".to_string()
                } else {
                    format!("{} → {}", pair[0].0, pair[1].0)
                };
                emit(&mut w, json!({"ph": "b", "cat": cat, "id": id, "name": name, "pid": pid, "tid": 0, "ts": us(pair[0].1)}))
                    .map_err(io)?;
                emit(&mut w, json!({"ph": "e", "cat": cat, "id": id, "name": name, "pid": pid, "tid": 0, "ts": us(pair[1].1)}))
                    .map_err(io)?;
            }
            emit(&mut w, json!({"ph": "e", "cat": cat, "id": id, "name": outer, "pid": pid, "tid": 0, "ts": us(end.1)}))
                .map_err(io)?;
        }
    }
    write!(w, "\n]}}\n").map_err(io)?;
    w.flush().map_err(io)?;
    Ok(Exported {
        packets: packets.len() as u64,
        left_out: total.saturating_sub(packets.len() as u64),
        events,
    })
}

/// The packets to export, the slowest first (at most `max_packets`), and
/// how many there are of the kind.
fn slowest_packets(
    conn: &Connection,
    points: &[(String, String)],
    opts: &ExportOptions,
) -> Result<(Vec<Packet>, u64)> {
    let kind_filter = opts
        .kind
        .map_or("true".to_string(), |k| format!("kind = {k}"));
    let total: i64 = conn.query_row(
        &format!("SELECT count(*) FROM packets WHERE {kind_filter}"),
        [],
        |r| r.get(0),
    )?;
    let limit = if opts.max_packets == 0 {
        String::new()
    } else {
        format!("LIMIT {}", opts.max_packets)
    };
    let cols = points
        .iter()
        .map(|(c, _)| crate::sql::ident(c))
        .collect::<Vec<_>>()
        .join(", ");
    let mut stmt = conn.prepare(&format!(
        "SELECT flow, kind, seq, coalesce(tx_host, ''), coalesce(rx_host, ''), {cols}
         FROM packets WHERE {kind_filter}
         ORDER BY e2e_ns DESC NULLS LAST, flow, kind, seq {limit}"
    ))?;
    let mut rows = stmt.query([])?;
    let mut packets: Vec<Packet> = Vec::new();
    while let Some(r) = rows.next()? {
        let stamps = (0..points.len())
            .map(|i| r.get::<_, Option<i64>>(5 + i))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        packets.push((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            stamps,
        ));
    }
    Ok((packets, total.max(0) as u64))
}

/// A packet's steps on one side, in time order: (point, stamp). The
/// receiver's begin at the sender's wire point when both wire points are
/// stamped (the channel between them is a step too).
fn side_steps(
    points: &[(String, String)],
    stamps: &[Option<i64>],
    side: &str,
    (tx_wire, rx_wire): (Option<usize>, Option<usize>),
) -> Vec<(String, i64)> {
    let mut steps: Vec<(String, i64)> = points
        .iter()
        .zip(stamps)
        .filter(|((_, s), _)| s == side)
        .filter_map(|((c, _), t)| t.map(|t| (c.trim_end_matches("_ns").to_string(), t)))
        .collect();
    steps.sort_by_key(|(_, t)| *t);
    if side == "rx" {
        if let (Some(a), Some(b)) = (
            tx_wire.and_then(|i| stamps[i]),
            rx_wire.and_then(|i| stamps[i]),
        ) {
            if a <= steps.first().map_or(a, |s| s.1) && b >= a {
                steps.insert(0, ("sender wire".to_string(), a));
            }
        }
    }
    steps
}
