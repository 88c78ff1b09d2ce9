//! `xlap-trace report` and `export`.

use crate::analyze_cmd::{classify, open_with_kind};
use crate::cli::{ExportArgs, ReportArgs};
use anyhow::{Context, Result};
use xlap_analyze::dataset::Shared;
use xlap_analyze::perfetto::{self, ExportOptions};
use xlap_analyze::report::{self, ReportOptions};

pub fn report(a: &ReportArgs) -> Result<()> {
    let (conn, ds, kind) = open_with_kind(
        &a.run,
        Shared::Materialized,
        true,
        a.kind.as_deref(),
        a.view.view(),
    )?;
    let html = report::build(
        &conn,
        &ReportOptions {
            kind,
            slowest: a.slowest,
            title: ds.source.clone(),
        },
    )
    .map_err(classify)?;
    std::fs::write(&a.output, html).with_context(|| format!("writing {}", a.output.display()))?;
    println!(
        "wrote {} ({} packets, {} delivered)",
        a.output.display(),
        ds.packets,
        ds.delivered
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
    )
    .map_err(classify)?;
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
