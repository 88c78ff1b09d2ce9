//! `xlap-trace report` and `export`.

use crate::analyze_cmd::{check_kind, classify, open};
use crate::cli::{ExportArgs, ReportArgs};
use anyhow::{Context, Result};
use xlap_analyze::perfetto::{self, ExportOptions};
use xlap_analyze::report::{self, ReportOptions};

pub fn report(a: &ReportArgs) -> Result<()> {
    let (conn, ds) = open(&a.run, true)?;
    if let Some(k) = a.kind {
        check_kind(&conn, k)?;
    }
    let html = report::build(
        &conn,
        &ReportOptions {
            kind: a.kind,
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
    let (conn, _) = open(&a.run, false)?;
    if let Some(k) = a.kind {
        check_kind(&conn, k)?;
    }
    let done = perfetto::export(
        &conn,
        &a.perfetto,
        &ExportOptions {
            max_packets: a.max_packets,
            kind: a.kind,
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
