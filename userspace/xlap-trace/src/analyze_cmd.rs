//! `xlap-trace analyze`, `sql` and `synth`: the bundled queries and the
//! user's own SQL over a run, and synthetic runs for tests and benchmarks.

use crate::cli::{AnalyzeArgs, OutputFormat, SqlArgs, SynthArgs};
use crate::exit::{failure, Code};
use anyhow::Result;
use duckdb::Connection;
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::time::Instant;
use xlap_analyze::format::{json_rows, render, Format};
use xlap_analyze::queries::{self, Query, Table};
use xlap_analyze::{dataset, AnalyzeError};

/// The queries `analyze` runs when none is named.
pub const DEFAULT_QUERIES: &[&str] = &[
    "summary",
    "jitter",
    "outlier_causes",
    "correlation",
    "trend",
    "loss",
];

/// An analysis error with its exit code: bad input files 6, unknown names
/// 2, a bundled query DuckDB refused 1 (our bug: please report it).
pub fn classify(e: AnalyzeError) -> anyhow::Error {
    match e {
        AnalyzeError::Input { .. } => failure(Code::BadInput, e.to_string()),
        AnalyzeError::Usage(_) => failure(Code::Usage, e.to_string()),
        other => anyhow::Error::new(other),
    }
}

fn format_of(f: OutputFormat) -> Format {
    match f {
        OutputFormat::Table => Format::Table,
        OutputFormat::Json => Format::Json,
        OutputFormat::Csv => Format::Csv,
        OutputFormat::Markdown => Format::Markdown,
    }
}

/// An in-memory DuckDB with the run's views, within a memory bound (DuckDB
/// spills beyond it).
pub fn open(
    run: &Path,
    shared: dataset::Shared,
    progress: bool,
) -> Result<(Connection, dataset::Dataset)> {
    open_view(run, shared, progress, dataset::View::default())
}

/// [`open`], the packets seen through `view` (`--e2e`, `--inliers`). The
/// engine reads nothing outside the run ([`run_root`]): the run may come
/// from elsewhere, and its names with it.
pub fn open_view(
    run: &Path,
    shared: dataset::Shared,
    progress: bool,
    view: dataset::View,
) -> Result<(Connection, dataset::Dataset)> {
    open_engine(run, shared, progress, view, true)
}

/// Where `dataset::open` looks for a run's files: the directory given, or
/// the directory of the packets file given (its runs are beside it).
pub fn run_root(run: &Path) -> &Path {
    if run.is_file() {
        run.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    } else {
        run
    }
}

fn open_engine(
    run: &Path,
    shared: dataset::Shared,
    progress: bool,
    view: dataset::View,
    confined: bool,
) -> Result<(Connection, dataset::Dataset)> {
    let conn = xlap_analyze::engine().map_err(classify)?;
    // The analyses order what they print themselves.
    conn.execute_batch("SET preserve_insertion_order = false;")?;
    if confined {
        xlap_analyze::confine(&conn, &[run_root(run)]).map_err(classify)?;
    }
    // Unconfined is the user's own SQL, which may ask a one-ended run too.
    let ds = if confined {
        dataset::open_view(&conn, run, shared, progress, view)
    } else {
        dataset::open_one_end_ok(&conn, run, shared, progress, view)
    }
    .map_err(classify)?;
    Ok((conn, ds))
}

/// [`open`], and the kind `--kind` names, if given.
pub fn open_with_kind(
    run: &Path,
    shared: dataset::Shared,
    progress: bool,
    kind: Option<&str>,
    view: dataset::View,
) -> Result<(Connection, dataset::Dataset, Option<u64>)> {
    let (conn, ds) = open_view(run, shared, progress, view)?;
    let kind = kind.map(|k| resolve_kind(&conn, k)).transpose()?;
    Ok((conn, ds, kind))
}

/// Parses `NAME=VALUE` parameters.
fn params(kind: Option<u64>, raw: &[String]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    if let Some(k) = kind {
        out.push(("kind".to_string(), k.to_string()));
    }
    for p in raw {
        let (n, v) = p.split_once('=').ok_or_else(|| {
            failure(
                Code::Usage,
                format!("--param {p:?}: expected NAME=VALUE, e.g. --param top=10"),
            )
        })?;
        out.push((n.trim().to_string(), v.trim().to_string()));
    }
    Ok(out)
}

/// The queries to run: the named ones (`all` for every one), else the
/// default set.
fn selected(names: &[String]) -> Result<Vec<Query>> {
    if names.iter().any(|n| n == "all") {
        return Ok(queries::all());
    }
    let names: Vec<&str> = if names.is_empty() {
        DEFAULT_QUERIES.to_vec()
    } else {
        names.iter().map(|s| s.as_str()).collect()
    };
    names
        .iter()
        .map(|n| queries::find(n).map_err(classify))
        .collect()
}

/// Runs `queries` with `params`, each only with the parameters it takes
/// (`--kind` applies to every query that has it).
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
            return Err(failure(
                Code::Usage,
                format!(
                    "no selected query takes the parameter {name:?} (see `xlap-trace analyze --list`)"
                ),
            ));
        }
    }
    let mut out = Vec::new();
    for q in queries {
        let t0 = Instant::now();
        let table = queries::run_taking(conn, q, params).map_err(classify)?;
        if progress {
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

/// Prints results in one of the formats; several queries as sections (JSON:
/// one object keyed by query name).
pub fn print_results(results: &[(Query, Table)], format: Format) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match format {
        Format::Json => {
            let map: serde_json::Map<String, serde_json::Value> = results
                .iter()
                .map(|(q, t)| (q.name.clone(), json_rows(t)))
                .collect();
            writeln!(stdout, "{}", serde_json::to_string_pretty(&map)?)?;
        }
        _ => {
            for (i, (q, t)) in results.iter().enumerate() {
                if results.len() > 1 || format == Format::Markdown {
                    if i > 0 {
                        writeln!(stdout)?;
                    }
                    match format {
                        Format::Markdown => {
                            writeln!(stdout, "### {}\n\n{}\n", q.name, q.description)?
                        }
                        Format::Csv => writeln!(stdout, "# {}", q.name)?,
                        _ => writeln!(stdout, "== {}: {} ==", q.name, q.description)?,
                    }
                }
                write!(stdout, "{}", render(t, format))?;
            }
        }
    }
    Ok(())
}

pub fn analyze(a: &AnalyzeArgs) -> Result<()> {
    if a.list {
        for q in queries::all() {
            println!("{:<16} {}", q.name, q.description);
            println!("{:<16} reads: {}", "", q.reads);
            for (n, d) in &q.params {
                println!("{:<16} --param {n}=…  {d}", "");
            }
        }
        return Ok(());
    }
    let Some(run) = &a.run else {
        return Err(failure(
            Code::Usage,
            "give a run directory (or --list for the queries)",
        ));
    };
    let queries = selected(&a.query)?;
    let (conn, _, kind) = open_with_kind(
        run,
        dataset::Shared::Materialized,
        !a.quiet,
        a.kind.as_deref(),
        a.view.view(),
    )?;
    let params = params(kind, &a.param)?;
    let results = run_queries(&conn, &queries, &params, !a.quiet)?;
    print_results(&results, format_of(a.format))
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
    Err(failure(
        Code::Usage,
        format!(
            "no packet has kind {arg}; the kinds in this run are {}",
            kinds
                .iter()
                .map(|(k, n)| n.as_ref().map_or(k.to_string(), |n| format!("{k} ({n})")))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

/// Runs one user statement, naming it in the error.
fn user_sql(conn: &Connection, sql: &str) -> Result<Table> {
    queries::run_sql(conn, sql).map_err(|e| {
        failure(
            Code::Usage,
            format!(
                "the SQL failed: {e}\n  in: {}",
                sql.trim().lines().next().unwrap_or_default()
            ),
        )
    })
}

pub fn sql(a: &SqlArgs) -> Result<()> {
    // The user's own SQL may read (and write) files of the user's choice.
    let (conn, ds) = open_engine(&a.run, dataset::Shared::Lazy, false, a.view.view(), false)?;
    let format = format_of(a.format);
    if let Some(sql) = &a.sql {
        let t = user_sql(&conn, sql)?;
        write!(std::io::stdout(), "{}", render(&t, format))?;
        return Ok(());
    }
    // The prompt: statements end with `;`, errors are shown and the prompt
    // goes on; Ctrl-D ends it.
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "{}: {} packets ({} delivered). Views: packets, delivered, stages, stage_counts, stage_quantiles(levels), fences, stage_moments, late, late_stages, stage_columns, point_columns, runs, tracer_points, kinds{}. End statements with ';', Ctrl-D quits.",
            ds.source,
            ds.packets,
            ds.delivered,
            if ds.run_files.is_empty() { "" } else { ", stamps" }
        );
    }
    let mut buf = String::new();
    let mut failed = false;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("{}", if buf.is_empty() { "xlap> " } else { "  ... " });
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        buf.push_str(&line);
        buf.push('\n');
        if line.trim_end().ends_with(';') {
            let stmt = std::mem::take(&mut buf);
            match user_sql(&conn, &stmt) {
                Ok(t) => write!(std::io::stdout(), "{}", render(&t, format))?,
                Err(e) => {
                    eprintln!("xlap-trace: error: {e:#}");
                    failed = true;
                }
            }
        }
    }
    if !buf.trim().is_empty() {
        let t = user_sql(&conn, &buf)?;
        write!(std::io::stdout(), "{}", render(&t, format))?;
    }
    if failed && !interactive {
        return Err(failure(Code::Usage, "a statement failed (see above)"));
    }
    Ok(())
}

pub fn synth(a: &SynthArgs) -> Result<()> {
    let conn = xlap_analyze::engine().map_err(classify)?;
    xlap_analyze::confine(&conn, &[&a.output]).map_err(classify)?;
    let t0 = Instant::now();
    eprintln!(
        "xlap-trace: generating {} packets (seed {}) into {}",
        a.packets,
        a.seed,
        a.output.display()
    );
    xlap_analyze::synth::generate(&conn, &a.output, a.packets, a.seed).map_err(classify)?;
    eprintln!("xlap-trace: done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}
