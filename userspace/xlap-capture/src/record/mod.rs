//! `xlap-trace record`: attach, stream stamps to Arrow while the target runs
//! (following the processes it forks and the sockets they open), stop,
//! write Parquet and `run.json`, print a summary. The session's steps live
//! in `session`, the following of processes and sockets in `follow`.

mod app_ring;
mod bpf_stats;
pub mod command;
mod connects;
mod follow;
mod live_view;
mod markers;
pub mod options;
mod protocols;
pub mod segments;
mod session;
pub(crate) mod shm_file;
mod shm_guard;
mod tally;
pub(crate) mod uprobe_closer;

pub use bpf_stats::StatsMode;

use crate::runmeta::RunMeta;
use anyhow::{Context, Result};
pub use options::RecordOptions;
use session::{Plan, Session};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use follow::Child;

/// Records one run: each step of the session's life a function of its own.
pub fn run(args: &RecordOptions) -> Result<RunMeta> {
    let plan = Plan::new(args)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let mut live = Session::load(&plan)?.attach(&plan)?;
    let stop_reason = live.follow(&plan, &stop)?;
    live.detach()?.finish(&plan, stop_reason)
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
    if let Some(s) = &meta.options.sample {
        // With --sample-kinds the other kinds were all stamped: no single
        // factor scales the count.
        let estimate = if s.kinds.is_empty() {
            format!(
                ", about {} packets in all",
                meta.packets.saturating_mul(u64::from(s.one_in))
            )
        } else {
            String::new()
        };
        println!(
            "sampled {}: the datagrams whose seq hashes into the sample{estimate}",
            s.describe()
        );
    }
    if let Some(ns) = meta.bpf_ns_per_stamp {
        println!("BPF run time per stamp: {ns:.0} ns (all programs, filtered calls included)");
    }
    if let Some(cost) = xlap_records::tracer_cost::TracerCost::of_run(meta) {
        let mut parts = Vec::new();
        if let Some(ns) = cost.bpf_ns_per_datagram {
            parts.push(format!("BPF {ns:.0} ns per datagram"));
        }
        if let Some(ns) = cost.bpf_ns_per_run {
            parts.push(format!("{ns:.0} ns per program run"));
        }
        if let Some(share) = cost.recorder_cpu_share {
            parts.push(format!("the recorder {:.1} % of a CPU", share * 100.0));
        }
        println!("tracer cost: {}", parts.join(", "));
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
