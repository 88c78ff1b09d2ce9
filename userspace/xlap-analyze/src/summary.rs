//! Latency per stage of a packets table: the demo's and `record`'s summary
//! until the bundled query set takes over.

use crate::Result;
use duckdb::Connection;
use serde::Serialize;
use std::path::Path;

#[derive(Clone, Debug, Serialize)]
pub struct StageStat {
    /// Column: a stage `<a>__<b>_ns`, or an X-LAP total.
    pub stage: String,
    pub packets: u64,
    pub p50_ns: f64,
    pub p99_ns: f64,
    pub max_ns: f64,
}

/// Stages in path order, then X-LAP's totals.
pub fn stage_stats(conn: &Connection, packets: &Path) -> Result<Vec<StageStat>> {
    let file = packets.display().to_string().replace('\'', "''");
    let mut names: Vec<String> = {
        let mut stmt = conn.prepare(&format!(
            "SELECT column_name FROM (DESCRIBE SELECT * FROM read_parquet('{file}'))"
        ))?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        rows.collect::<std::result::Result<Vec<_>, _>>()?
    };
    names.retain(|n| n.contains("__") && n.ends_with("_ns"));
    names.extend(
        [
            "sender_total_ns",
            "channel_ns",
            "receiver_total_ns",
            "e2e_ns",
        ]
        .map(String::from),
    );
    let mut out = Vec::new();
    for name in names {
        let sql = format!(
            "SELECT count(\"{name}\"), quantile_cont(\"{name}\", 0.5)::DOUBLE, quantile_cont(\"{name}\", 0.99)::DOUBLE, max(\"{name}\")::DOUBLE
             FROM read_parquet('{file}')"
        );
        let (n, p50, p99, max): (i64, Option<f64>, Option<f64>, Option<f64>) =
            conn.query_row(&sql, [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?;
        if n > 0 {
            out.push(StageStat {
                stage: name.trim_end_matches("_ns").replace("__", " -> "),
                packets: n as u64,
                p50_ns: p50.unwrap_or(f64::NAN),
                p99_ns: p99.unwrap_or(f64::NAN),
                max_ns: max.unwrap_or(f64::NAN),
            });
        }
    }
    Ok(out)
}

pub fn print(stats: &[StageStat]) {
    println!(
        "{:<48} {:>8} {:>10} {:>10} {:>10}",
        "stage", "packets", "p50 µs", "p99 µs", "max µs"
    );
    for s in stats {
        println!(
            "{:<48} {:>8} {:>10.1} {:>10.1} {:>10.1}",
            s.stage,
            s.packets,
            s.p50_ns / 1e3,
            s.p99_ns / 1e3,
            s.max_ns / 1e3
        );
    }
}
