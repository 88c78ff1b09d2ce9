//! The end of a run: its stamps correlated into the packets table, its
//! compact summary (`summary.json`) and the latency summary printed after
//! `record` and `run`. One function for every run directory that gets
//! finished: a recording's, and each segment of a rotated recording (whose
//! finisher runs it in a child process, to keep DuckDB's memory apart from
//! the recorder's).

use crate::dataset::{self, Shared, View};
use crate::queries::{Query, Table};
use crate::summary::Summary;
use crate::{AnalyzeError, CorrelateOptions, Correlation, Result, Run};
use duckdb::Connection;
use std::path::{Path, PathBuf};
use xlap_records::RunDir;

/// How a run is finished.
#[derive(Clone, Debug, Default)]
pub struct FinishOptions {
    /// End-to-end deadline for the packets table's `deadline_missed` flag.
    pub deadline_ms: Option<f64>,
    /// Run the bundled `summary` query for printing (the recorder's end of
    /// run); a segment's finisher has no one to print to.
    pub analysis: bool,
    /// Peer recorders' runs inside this one (`record --collect`),
    /// correlated with it into its packets table.
    pub peers: Vec<RunDir>,
}

/// What finishing a run made.
pub struct Finished {
    pub correlation: Correlation,
    /// The packets table written.
    pub packets: PathBuf,
    /// `summary.json`, or why there is none.
    pub summary: std::result::Result<PathBuf, AnalyzeError>,
    /// The bundled `summary` query, one table per direction, or why there
    /// is none (one end only); empty when not asked for.
    pub analysis: Result<Vec<(Query, Table)>>,
}

/// Correlates `dir` into its packets table, then writes its summary.json
/// and (if asked) runs the latency summary, all on one DuckDB connection
/// confined to the run. Only the correlation failing is an error: the
/// summary and the analysis say why they are missing in [`Finished`].
pub fn finish_run(dir: &RunDir, opts: &FinishOptions) -> Result<Finished> {
    let packets = dir.packets();
    let conn = crate::engine()?;
    crate::confine(&conn, &[dir.path()])?;
    // The peers' directories lie beneath the run's: the confinement above
    // reaches them.
    let runs: Vec<RunDir> = std::iter::once(dir.clone())
        .chain(opts.peers.iter().cloned())
        .collect();
    let correlation = correlate_on(&conn, &runs, &packets, opts.deadline_ms)?;
    // The packets just written are read back through the analyses' views;
    // the correlator's own table would shadow them (and hold memory).
    conn.execute_batch("DROP TABLE IF EXISTS packets;")?;
    let opened = dataset::open_view(
        &conn,
        dir.path(),
        Shared::Materialized,
        false,
        View::default(),
    );
    let summary = match &opened {
        Ok(_) => Summary::of_conn(&conn, dir.path()).and_then(|s| {
            let path = dir.summary();
            s.write(&path)?;
            Ok(path)
        }),
        Err(e) => Err(AnalyzeError::Other(e.to_string())),
    };
    let analysis = match (opts.analysis, opened) {
        (false, _) => Ok(Vec::new()),
        (true, Ok(_)) => latency_summary(&conn),
        (true, Err(e)) => Err(e),
    };
    Ok(Finished {
        correlation,
        packets,
        summary,
        analysis,
    })
}

/// The bundled `summary` query, once per direction (sockperf's ping and
/// pong).
fn latency_summary(conn: &Connection) -> Result<Vec<(Query, Table)>> {
    let q = crate::queries::find("summary")?;
    let mut results = Vec::new();
    for kind in dataset::direction_kinds(conn)? {
        let params = [("kind".to_string(), kind.to_string())];
        results.extend(crate::session::run_queries(
            conn,
            std::slice::from_ref(&q),
            &params,
            false,
        )?);
    }
    Ok(results)
}

/// Correlates run directories into `out` (Parquet) and `<out>.json`, on an
/// engine that reads the runs and writes beside `out`, nothing else: root
/// runs this at the end of `record`, on point names the traced programs
/// chose.
pub fn correlate_dirs(
    dirs: &[RunDir],
    out: &Path,
    deadline_ms: Option<f64>,
) -> Result<Correlation> {
    let conn = crate::engine()?;
    let out_dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut allowed: Vec<&Path> = dirs.iter().map(RunDir::path).collect();
    allowed.push(out_dir);
    crate::confine(&conn, &allowed)?;
    correlate_on(&conn, dirs, out, deadline_ms)
}

fn correlate_on(
    conn: &Connection,
    dirs: &[RunDir],
    out: &Path,
    deadline_ms: Option<f64>,
) -> Result<Correlation> {
    let runs = dirs.iter().map(Run::open).collect::<Result<Vec<_>>>()?;
    let opts = CorrelateOptions {
        deadline_ns: deadline_ms.map(|ms| (ms * 1e6) as i64),
    };
    let result = crate::correlate(conn, &runs, &opts, Some(out))?;
    let json = out.with_extension("json");
    let text = serde_json::to_string_pretty(&result)
        .map_err(|e| AnalyzeError::Other(format!("correlation summary: {e}")))?;
    xlap_records::run_file::write_whole(&json, (text + "\n").as_bytes())
        .map_err(|e| AnalyzeError::Other(e.to_string()))?;
    store_aggregates(out);
    Ok(result)
}

/// Every file `correlate` writes for packets table `out`: the table, its
/// summary (`.json`) and its stored aggregates.
pub fn correlation_files(out: &Path) -> Vec<std::path::PathBuf> {
    let aggregates = crate::stored::TABLES
        .iter()
        .map(|t| crate::stored::path(out, t));
    [out.to_path_buf(), out.with_extension("json")]
        .into_iter()
        .chain(aggregates)
        .collect()
}

/// Keeps the aggregates every analysis of `packets` reads beside it
/// (crate::stored). Without them the analyses compute them, as before:
/// a failure here is said, not the end of the correlation.
pub fn store_aggregates(packets: &Path) {
    say_unstored(packets, crate::store::store(packets));
}

/// The same for packets that may have them already: computed again only
/// when one is missing or does not match them (crate::stored::refresh).
pub fn refresh_aggregates(packets: &Path) {
    say_unstored(packets, crate::store::refresh(packets).map(|_| ()));
}

fn say_unstored(packets: &Path, stored: crate::Result<()>) {
    if let Err(e) = stored {
        eprintln!(
            "xlap-trace: warning: the per-run aggregates of {} were not stored ({e}); analyses compute them from the packets",
            packets.display()
        );
    }
}

/// The correlation as `correlate` and `record` print it.
pub fn print_correlation(c: &Correlation, out: &Path) {
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
    if c.partial > 0 {
        let lacking = c
            .partial_lacking
            .iter()
            .map(|(point, n)| format!("{} {n}", point.trim_end_matches("_ns")))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "partial: {} packets were in flight when a point's recording began or ended (the run's start or end, a rotation, a receiver that stopped reading): stamped by some points, not all, and not counted lost; lacking {lacking}",
            c.partial
        );
    }
    for m in &c.clocks {
        let u = m
            .uncertainty_ns
            .map_or("unknown".to_string(), |u| format!("±{:.1} µs", u / 1e3));
        let du = m
            .drift_uncertainty_ppm
            .map_or(String::new(), |d| format!(" ±{d:.2}"));
        println!(
            "clock {}: offset {:.1} µs, drift {:.2}{du} ppm, {u} ({})",
            m.domain,
            m.offset_ns / 1e3,
            m.drift_ppm,
            m.method
        );
    }
    println!("points in path order: {}", c.points.join(", "));
    // No order fits every packet: those packets have a negative stage.
    // The first few: a run from elsewhere may have thousands, all in
    // packets.json.
    const SHOWN: usize = 10;
    for conflict in c.order_conflicts.iter().take(SHOWN) {
        println!("path order does not fit every packet: {conflict}");
    }
    if c.order_conflicts.len() > SHOWN {
        println!(
            "path order: {} more pairs out of order, listed in {}",
            c.order_conflicts.len() - SHOWN,
            out.with_extension("json").display()
        );
    }
    println!(
        "wrote {} and {}",
        out.display(),
        out.with_extension("json").display()
    );
}

/// What `record` prints after the run: the correlation, where the summary
/// went (or why not), and the latency summary.
pub fn print_finished(f: &Finished, dir: &RunDir, quiet: bool) {
    let dir = dir.path();
    if !quiet {
        print_correlation(&f.correlation, &f.packets);
    }
    if let Err(e) = &f.summary {
        eprintln!(
            "xlap-trace: warning: no summary.json ({e}); `xlap-trace summary {}` retries",
            dir.display()
        );
    }
    match &f.analysis {
        Ok(results) => {
            println!(
                "\n== summary (more: xlap-trace analyze {}; xlap-trace report {}) ==",
                dir.display(),
                dir.display()
            );
            let tables: Vec<String> = results
                .iter()
                .map(|(_, t)| crate::format::render(t, crate::format::Format::Table))
                .collect();
            print!("{}", tables.join("\n"));
        }
        Err(e) => println!("(no latency summary: {e})"),
    }
}
