//! `xlap-trace correlate`, and the correlation at the end of `record`.

use crate::exit::{failure, Code};
use anyhow::Result;
use std::path::Path;
use xlap_analyze::{AnalyzeError, CorrelateOptions, Correlation, Run};

fn classify(e: AnalyzeError) -> anyhow::Error {
    match e {
        AnalyzeError::Input { .. } => failure(Code::BadInput, e.to_string()),
        AnalyzeError::Usage(_) => failure(Code::Usage, e.to_string()),
        other => anyhow::Error::new(other),
    }
}

/// Correlates run directories into `out` (Parquet) and `<out>.json`.
pub fn correlate(dirs: &[&Path], out: &Path, deadline_ms: Option<f64>) -> Result<Correlation> {
    let runs = dirs
        .iter()
        .map(|d| Run::open(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(classify)?;
    let conn = xlap_analyze::engine().map_err(classify)?;
    // Root runs this at the end of `record`, on point names the traced
    // programs chose: the engine reads the runs and writes beside `out`,
    // nothing else.
    let out_dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut allowed = dirs.to_vec();
    allowed.push(out_dir);
    xlap_analyze::confine(&conn, &allowed).map_err(classify)?;
    let opts = CorrelateOptions {
        deadline_ns: deadline_ms.map(|ms| (ms * 1e6) as i64),
    };
    let result = xlap_analyze::correlate(&conn, &runs, &opts, Some(out)).map_err(classify)?;
    std::fs::write(
        out.with_extension("json"),
        serde_json::to_string_pretty(&result)? + "\n",
    )?;
    Ok(result)
}

pub fn print(c: &Correlation, out: &Path) {
    println!(
        "packets: {}  lost: {}  recovered: {}  duplicates: {}  reordered: {}  unplaced stamps: {}",
        c.packets, c.lost, c.recovered, c.duplicates, c.reordered, c.unplaced_stamps
    );
    if c.untraced > 0 {
        println!(
            "untraced: {} packets were sent on flows no traced socket received (the receiving process was not recorded, or an untraced socket on the port took them): not counted lost",
            c.untraced
        );
    }
    for m in &c.clocks {
        let u = m
            .uncertainty_ns
            .map_or("unknown".to_string(), |u| format!("±{:.1} µs", u / 1e3));
        println!(
            "clock {}: offset {:.1} µs, drift {:.2} ppm, {u} ({})",
            m.domain,
            m.offset_ns / 1e3,
            m.drift_ppm,
            m.method
        );
    }
    println!("points in path order: {}", c.points.join(", "));
    // No order fits every packet: those packets have a negative stage.
    for conflict in &c.order_conflicts {
        println!("path order does not fit every packet: {conflict}");
    }
    println!(
        "wrote {} and {}",
        out.display(),
        out.with_extension("json").display()
    );
}
