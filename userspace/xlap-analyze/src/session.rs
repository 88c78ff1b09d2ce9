//! A run opened for analysis: an engine confined to the run, its views
//! created, and the bundled queries run on it. Every command that reads a
//! run (analyze, report, summary, compare, the end of `record`) opens it
//! here, so they all see the same views under the same limits.

use crate::dataset::{self, Dataset, Shared, View};
use crate::queries::{self, Query, Table};
use crate::{AnalyzeError, Result};
use duckdb::Connection;
use std::path::Path;

pub use crate::layout::run_root;
use std::time::Instant;

/// An in-memory DuckDB with the run's views, within a memory bound (DuckDB
/// spills beyond it).
pub fn open(run: &Path, shared: Shared, progress: bool) -> Result<(Connection, Dataset)> {
    open_view(run, shared, progress, View::default())
}

/// [`open`], the packets seen through `view` (`--e2e`, `--inliers`). The
/// engine reads nothing outside the run ([`run_root`]): the run may come
/// from elsewhere, and its names with it.
pub fn open_view(
    run: &Path,
    shared: Shared,
    progress: bool,
    view: View,
) -> Result<(Connection, Dataset)> {
    open_engine(run, shared, progress, view, Reach::TheRun)
}

/// [`open_view`] for the user's own SQL: the engine is not confined (the
/// user may read and write files of their choice) and a one-ended run
/// opens too.
pub fn open_unconfined(
    run: &Path,
    shared: Shared,
    progress: bool,
    view: View,
) -> Result<(Connection, Dataset)> {
    open_engine(run, shared, progress, view, Reach::Anywhere)
}

/// What the engine may read and write.
enum Reach {
    /// The run alone (it may come from elsewhere, and its names with it).
    TheRun,
    /// Any file (the user's own SQL); a one-ended run opens too.
    Anywhere,
}

fn open_engine(
    run: &Path,
    shared: Shared,
    progress: bool,
    view: View,
    reach: Reach,
) -> Result<(Connection, Dataset)> {
    let conn = crate::engine()?;
    // The analyses order what they print themselves.
    conn.execute_batch("SET preserve_insertion_order = false;")?;
    let ds = match reach {
        Reach::TheRun => {
            crate::confine(&conn, &[crate::layout::run_root(run)])?;
            dataset::open_view(&conn, run, shared, progress, view)
        }
        Reach::Anywhere => dataset::open_one_end_ok(&conn, run, shared, progress, view),
    }?;
    Ok((conn, ds))
}

/// [`open_view`], and the kind `--kind` names, if given.
pub fn open_with_kind(
    run: &Path,
    shared: Shared,
    progress: bool,
    kind: Option<&str>,
    view: View,
) -> Result<(Connection, Dataset, Option<u64>)> {
    let (conn, ds) = open_view(run, shared, progress, view)?;
    let kind = kind.map(|k| resolve_kind(&conn, k)).transpose()?;
    Ok((conn, ds, kind))
}

/// The kind number `--kind` names (a number, or a name the protocol's
/// preset gave it), refusing kinds no packet has.
pub fn resolve_kind(conn: &Connection, arg: &str) -> Result<u64> {
    let kinds: Vec<(u64, Option<String>)> = {
        let mut stmt = conn.prepare(
            "SELECT DISTINCT p.kind::UBIGINT, k.name FROM packets p LEFT JOIN kinds k ON k.kind = p.kind ORDER BY 1",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    let found = kinds
        .iter()
        .find(|(k, name)| arg.parse::<u64>() == Ok(*k) || name.as_deref() == Some(arg));
    if let Some((k, _)) = found {
        return Ok(*k);
    }
    Err(AnalyzeError::Usage(format!(
        "no packet has kind {arg}; the kinds in this run are {}",
        kinds
            .iter()
            .map(|(k, n)| n.as_ref().map_or(k.to_string(), |n| format!("{k} ({n})")))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// Runs `queries` with `params`, each only with the parameters it takes
/// (`--kind` applies to every query that has it); `progress` prints the
/// time of each.
pub fn run_queries(
    conn: &Connection,
    queries: &[Query],
    params: &[(String, String)],
    progress: bool,
) -> Result<Vec<(Query, Table)>> {
    for (name, _) in params {
        if !queries
            .iter()
            .any(|q| q.params.iter().any(|(n, _)| n == name))
        {
            return Err(AnalyzeError::Usage(format!(
                "no selected query takes the parameter {name:?} (see `xlap-trace analyze --list`)"
            )));
        }
    }
    let mut out = Vec::new();
    for q in queries {
        let t0 = Instant::now();
        let table = queries::run_taking(conn, q, params)?;
        if progress && t0.elapsed() >= crate::LONG_STEP {
            eprintln!(
                "xlap-trace: {} ({} rows) in {:.2} s",
                q.name,
                table.rows.len(),
                t0.elapsed().as_secs_f64()
            );
        }
        out.push((q.clone(), table));
    }
    Ok(out)
}
