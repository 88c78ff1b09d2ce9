//! `xlap-trace analyze`, `sql` and `synth`: the bundled queries and the
//! user's own SQL over a run, and synthetic runs for tests and benchmarks.

use crate::cli::{AnalyzeArgs, OutputFormat, SqlArgs, SynthArgs};
use anyhow::Result;
use duckdb::Connection;
use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;
use xlap_analyze::dataset;
use xlap_analyze::format::{json_rows, render, Format};
use xlap_analyze::queries::{self, Query, Table};
use xlap_analyze::session::{open_unconfined, open_with_kind, resolve_kind, run_queries};
use xlap_exit::{failure, Code};

pub fn format_of(f: OutputFormat) -> Format {
    match f {
        OutputFormat::Table => Format::Table,
        OutputFormat::Json => Format::Json,
        OutputFormat::Csv => Format::Csv,
        OutputFormat::Markdown => Format::Markdown,
    }
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

/// `--exchange REQ:RESP` as the `exchange` query's parameters, each kind a
/// number or the preset's name of a kind the packets have.
fn exchange_params(conn: &Connection, pair: &str) -> Result<Vec<(String, String)>> {
    let (req, resp) = pair.split_once(':').ok_or_else(|| {
        failure(
            Code::Usage,
            format!("--exchange {pair:?}: expected REQ:RESP, two kinds, e.g. --exchange 3:2"),
        )
    })?;
    Ok(vec![
        ("request".into(), resolve_kind(conn, req)?.to_string()),
        ("response".into(), resolve_kind(conn, resp)?.to_string()),
    ])
}

/// The queries to run: the named ones (`all` for every one), else the
/// default set.
fn selected(names: &[String]) -> Result<Vec<Query>> {
    if names.iter().any(|n| n == "all") {
        return Ok(queries::all());
    }
    let names: Vec<&str> = if names.is_empty() {
        queries::DEFAULT.to_vec()
    } else {
        names.iter().map(|s| s.as_str()).collect()
    };
    names.iter().map(|n| Ok(queries::find(n)?)).collect()
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
    let mut queries = selected(&a.query)?;
    // --exchange and --by each run their query: alone, unless -q asked for
    // others too.
    let implied: Vec<&str> = [
        (a.exchange.is_some(), "exchange"),
        (a.by.is_some(), "cgroups"),
    ]
    .into_iter()
    .filter_map(|(asked, name)| asked.then_some(name))
    .collect();
    if !implied.is_empty() && a.query.is_empty() {
        queries.clear();
    }
    for name in implied {
        if !queries.iter().any(|q| q.name == name) {
            queries.push(queries::find(name)?);
        }
    }
    let (conn, _, kind) = open_with_kind(
        run,
        dataset::Shared::Materialized,
        !a.quiet,
        a.kind.as_deref(),
        a.view.view(),
    )?;
    let mut params = params(kind, &a.param)?;
    if let Some(pair) = &a.exchange {
        params.extend(exchange_params(&conn, pair)?);
    }
    if let Some(by) = a.by {
        params.push(("split".into(), by.param().into()));
    }
    let results = run_queries(&conn, &queries, &params, !a.quiet)?;
    print_results(&results, format_of(a.format))
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
    let (conn, ds) = open_unconfined(&a.run, dataset::Shared::Lazy, false, a.view.view())?;
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
            "{}: {} packets ({} delivered). Views: packets, delivered, stages, stage_counts, stage_quantiles(levels), fences, stage_moments, late, late_stages, late_causes, send_schedule, exchanges, stage_columns, point_columns, runs, tracer_points, kinds, cgroups{}. End statements with ';', Ctrl-D quits.",
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
    let conn = xlap_analyze::engine()?;
    xlap_analyze::confine(&conn, &[&a.output])?;
    let t0 = Instant::now();
    eprintln!(
        "xlap-trace: generating {} packets (seed {}) into {}",
        a.packets,
        a.seed,
        a.output.display()
    );
    let output = xlap_records::RunDir::new(&a.output);
    let steps = xlap_analyze::synth::generate(&conn, &output, a.packets, a.seed)?;
    eprintln!(
        "xlap-trace: done in {:.1} s (points {:.1} s, packets table {:.1} s, stored aggregates {:.1} s)",
        t0.elapsed().as_secs_f64(),
        steps.points.as_secs_f64(),
        steps.packets_table.as_secs_f64(),
        steps.aggregates.as_secs_f64()
    );
    Ok(())
}
