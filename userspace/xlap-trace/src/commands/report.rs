//! `xlap-trace report` and `export`.

use crate::cli::{ExportArgs, ReportArgs};
use anyhow::{Context, Result};
use xlap_analyze::dataset::Shared;
use xlap_analyze::pcapng::{self, PcapngOptions};
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
    let (conn, ds, kind) = open_with_kind(
        &a.run,
        Shared::Lazy,
        false,
        a.kind.as_deref(),
        Default::default(),
    )?;
    if let Some(out) = &a.perfetto {
        export_perfetto(&conn, out, a.max_packets, kind)?;
    }
    if let Some(out) = &a.pcapng {
        export_pcapng(&conn, &ds, out, a.max_packets, kind)?;
    }
    Ok(())
}

fn export_perfetto(
    conn: &duckdb::Connection,
    out: &std::path::Path,
    max_packets: u64,
    kind: Option<u64>,
) -> Result<()> {
    let done = perfetto::export(conn, out, &ExportOptions { max_packets, kind })?;
    println!(
        "wrote {}: {} packets, {} events; open it in https://ui.perfetto.dev or chrome://tracing",
        out.display(),
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

/// The clock pair that maps the packets table's times to wall time: the
/// first run's (the reference clock correlation maps the others onto).
/// A packets file without its runs has none: its times are then written
/// as they are (monotonic ns since boot, shown as 1970), and said so.
fn clock_pair(ds: &xlap_analyze::dataset::Dataset) -> Result<(i64, i64)> {
    let Some(first) = ds.run_files.first() else {
        eprintln!(
            "xlap-trace: note: {} has no run.json beside it: the pcapng times are the monotonic clock's (since boot), not wall time",
            ds.source
        );
        return Ok((0, 0));
    };
    let meta = xlap_analyze::runs::read_meta(first)?;
    Ok((
        meta.clock_start.monotonic_ns as i64,
        meta.clock_start.realtime_ns as i64,
    ))
}

/// Every run's devices, (host, ifindex, name), to name the pcapng
/// interfaces by.
fn devices(ds: &xlap_analyze::dataset::Dataset) -> Result<Vec<(String, u32, String)>> {
    let mut out = Vec::new();
    for file in &ds.run_files {
        let meta = xlap_analyze::runs::read_meta(file)?;
        out.extend(
            meta.device_timestamping
                .into_iter()
                .filter(|d| d.ifindex != 0)
                .map(|d| (meta.host.clone(), d.ifindex, d.ifname)),
        );
    }
    Ok(out)
}

fn export_pcapng(
    conn: &duckdb::Connection,
    ds: &xlap_analyze::dataset::Dataset,
    out: &std::path::Path,
    max_packets: u64,
    kind: Option<u64>,
) -> Result<()> {
    let started = std::time::Instant::now();
    let done = pcapng::export(
        conn,
        out,
        &PcapngOptions {
            max_packets,
            kind,
            clock_pair: clock_pair(ds)?,
            progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            devices: devices(ds)?,
        },
    )?;
    println!(
        "wrote {}: {} packets, {} frames on {} interfaces, {} bytes in {:.1} s; open it in Wireshark or `tshark -r`",
        crate::confine::shown(out).display(),
        done.packets,
        done.frames,
        done.interfaces,
        done.bytes,
        started.elapsed().as_secs_f64()
    );
    if done.left_out > 0 {
        println!(
            "({} later packets left out: --max-packets 0 exports all)",
            done.left_out
        );
    }
    Ok(())
}
