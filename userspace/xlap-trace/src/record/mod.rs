//! `xlap-trace record`: attach, stream stamps to Arrow while the target runs
//! (following the processes it forks and the sockets they open), stop,
//! write Parquet and `run.json`, print a summary. The session's steps live
//! in `session`, the following of processes and sockets in `follow`.

mod app_ring;
mod bpf_stats;
pub mod command;
mod follow;
mod live_view;
mod markers;
mod protocols;
pub mod segments;
mod session;
pub(crate) mod shm_file;
mod shm_guard;
mod tally;

pub use bpf_stats::StatsMode;

use crate::cli::RecordArgs;
use crate::runmeta::RunMeta;
use anyhow::{Context, Result};
use session::{Plan, Session};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use xlap_records::RunDir;

pub use follow::Child;

/// Records one run: each step of the session's life a function of its own.
pub fn run(args: &RecordArgs) -> Result<RunMeta> {
    let plan = Plan::new(args)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let mut live = Session::load(&plan)?.attach(&plan)?;
    let stop_reason = live.follow(&plan, &stop)?;
    live.detach()?.finish(&plan, stop_reason)
}

/// The live correlation of a run whose ends were both traced here: the
/// packets table next to the stamps. A failure is reported, never fatal: the
/// stamps are already safe on disk.
pub fn correlate_run(args: &RecordArgs) {
    // A rotated recording's earlier segments got theirs from the finisher
    // (or left it out, said in segments.json); the last one is built here.
    let dir = segments::final_dir(&args.output);
    correlate_dir(args, &dir);
    if args.rotate.is_some() {
        if let Err(e) = segments::refresh(&args.output) {
            eprintln!("xlap-trace: warning: {e:#}");
        }
    }
}

fn correlate_dir(args: &RecordArgs, dir: &std::path::Path) {
    let out = RunDir::new(dir).packets();
    match crate::correlate_cmd::correlate(&[dir], &out, args.deadline_ms) {
        Ok(c) => {
            if !args.quiet {
                crate::correlate_cmd::print(&c, &out);
            }
            // The compact summary for CI comparisons (`compare`).
            let summary = RunDir::new(dir).summary();
            if let Err(e) = crate::ci::summary::Summary::of_run(dir).and_then(|s| s.write(&summary))
            {
                eprintln!(
                    "xlap-trace: warning: no summary.json ({e:#}); `xlap-trace summary {}` retries",
                    dir.display()
                );
            }
            print_analysis_summary(dir);
        }
        Err(e) => eprintln!(
            "xlap-trace: warning: no packets table ({e:#}); run `xlap-trace correlate {}` to retry",
            dir.display()
        ),
    }
}

/// The bundled `summary` query over the run just recorded; a run that
/// cannot have one (one side only) says why instead.
fn print_analysis_summary(dir: &std::path::Path) {
    let result = crate::analyze_cmd::open(dir, xlap_analyze::dataset::Shared::Materialized, false)
        .and_then(|(conn, _)| {
            let q = xlap_analyze::queries::find("summary")?;
            // One summary per direction (sockperf's ping and pong).
            let kinds = xlap_analyze::dataset::direction_kinds(&conn)?;
            let mut results = Vec::new();
            for kind in kinds {
                let params = [("kind".to_string(), kind.to_string())];
                results.extend(crate::analyze_cmd::run_queries(
                    &conn,
                    std::slice::from_ref(&q),
                    &params,
                    false,
                )?);
            }
            Ok(results)
        });
    match result {
        Ok(results) => {
            println!(
                "\n== summary (more: xlap-trace analyze {}; xlap-trace report {}) ==",
                dir.display(),
                dir.display()
            );
            let tables: Vec<String> = results
                .iter()
                .map(|(_, t)| xlap_analyze::format::render(t, xlap_analyze::format::Format::Table))
                .collect();
            print!("{}", tables.join("\n"));
        }
        Err(e) => println!("(no latency summary: {e:#})"),
    }
}

/// The end-of-run summary: stamps and losses per point.
pub fn print_summary(meta: &RunMeta, dir: &std::path::Path) {
    println!(
        "run {} on {} ({}), stopped by {}",
        meta.run_id, meta.host, meta.kernel, meta.stop_reason
    );
    let mut header = format!("{:<18} {:>10}", "point", "stamps");
    for reason in xlap_abi::LOSS_REASONS {
        header += &format!(" {reason:>12}");
    }
    println!("{header}");
    for (name, p) in &meta.points {
        let mut line = format!("{:<18} {:>10}", name, p.stamps);
        for reason in xlap_abi::LOSS_REASONS {
            line += &format!(" {:>12}", p.lost(reason));
        }
        println!("{line}");
    }
    println!(
        "packets: {}  stamps: {}  lost: {}",
        meta.packets, meta.stamps, meta.lost
    );
    if let Some(ns) = meta.bpf_ns_per_stamp {
        println!("BPF run time per stamp: {ns:.0} ns (all programs, filtered calls included)");
    }
    match &meta.segment {
        // The segments' live streams are gone once their Parquet is whole.
        Some(s) => println!(
            "wrote {} segments in {} ({}); the last: {}/{{stamps.parquet, run.json}}",
            s.index,
            dir.parent().unwrap_or(dir).display(),
            segments::INDEX_FILE,
            dir.display()
        ),
        None => println!(
            "wrote {}/{{stamps.parquet, stamps.arrows, run.json}}",
            dir.display()
        ),
    }
}

/// A one-line form of a program's load or attach error: a verifier failure
/// carries the whole verifier log (thousands of lines), of which the first
/// line and the verifier's own last words say what happened.
fn brief_reason(why: &str) -> String {
    let mut lines = why.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or_default().to_string();
    let rest: Vec<&str> = lines.collect();
    let mut tail: Vec<&str> = rest
        .iter()
        .rev()
        .filter(|l| !l.starts_with("verification time") && !l.starts_with("stack depth"))
        .take(2)
        .copied()
        .collect();
    tail.reverse();
    if tail.is_empty() {
        first
    } else {
        format!("{first} ... {}", tail.join(" / "))
    }
}

#[cfg(test)]
mod brief_reason_tests {
    use super::brief_reason;

    #[test]
    fn a_verifier_log_shrinks_to_its_first_and_last_lines() {
        let log = "load failed. Verifier output: 0: R1=ctx()\n1: (79) r9 = *(u64 *)(r1 +0)\n\
                   R5 unbounded memory access\nprocessed 867 insns (limit 1000000)\n\
                   verification time 30 usec\nstack depth 8\n";
        assert_eq!(
            brief_reason(log),
            "load failed. Verifier output: 0: R1=ctx() ... R5 unbounded memory access / processed 867 insns (limit 1000000)"
        );
        assert_eq!(brief_reason("no such tracepoint"), "no such tracepoint");
    }
}
