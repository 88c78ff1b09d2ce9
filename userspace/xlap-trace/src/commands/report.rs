//! `xlap-trace report` and `export`.

use crate::cli::{ExportArgs, ReportArgs};
use anyhow::{Context, Result};
use xlap_analyze::dataset::Shared;
use xlap_analyze::perfetto::{self, ExportOptions};
use xlap_analyze::queries;
use xlap_analyze::report::{self, ReportOptions};
use xlap_analyze::session::{open_view, open_with_kind};

pub fn report(a: &ReportArgs) -> Result<()> {
    let (conn, ds, kind) = open_with_kind(
        &a.runs[0],
        Shared::Materialized,
        true,
        a.kind.as_deref(),
        a.view.view(),
    )?;
    let kind = match kind {
        Some(k) => k,
        None => xlap_analyze::dataset::main_kind(&conn)?,
    };
    // The other runs: their end-to-end profile of the same kind number.
    let mut others = Vec::new();
    for run in &a.runs[1..] {
        let (conn, ds) = open_view(run, Shared::Materialized, false, a.view.view())?;
        let query = queries::find("latency_profile")?;
        let profile = queries::run(&conn, &query, &[("kind".to_string(), kind.to_string())])?;
        if profile.rows.is_empty() {
            eprintln!(
                "xlap-trace: {} has no delivered packet of kind {kind}: not in the overlay",
                ds.source
            );
            continue;
        }
        others.push((ds.source.clone(), profile));
    }
    let html = report::build(
        &conn,
        &ReportOptions {
            kind: Some(kind),
            slowest: a.slowest,
            title: ds.source.clone(),
            others,
        },
    )?;
    std::fs::write(&a.output, html).with_context(|| format!("writing {}", a.output.display()))?;
    println!(
        "wrote {} ({} packets, {} delivered{})",
        a.output.display(),
        ds.packets,
        ds.delivered,
        if a.runs.len() > 1 {
            format!("; {} runs overlaid", a.runs.len())
        } else {
            String::new()
        }
    );
    Ok(())
}

pub fn export(a: &ExportArgs) -> Result<()> {
    let (conn, _, kind) = open_with_kind(
        &a.run,
        Shared::Lazy,
        false,
        a.kind.as_deref(),
        Default::default(),
    )?;
    let done = perfetto::export(
        &conn,
        &a.perfetto,
        &ExportOptions {
            max_packets: a.max_packets,
            kind,
        },
    )?;
    println!(
        "wrote {}: {} packets, {} events; open it in https://ui.perfetto.dev or chrome://tracing",
        a.perfetto.display(),
        done.packets,
        done.events
    );
    if done.left_out > 0 {
        println!(
            "({} faster packets left out: --max-packets 0 exports all)",
            done.left_out
        );
    }
    Ok(())
}
