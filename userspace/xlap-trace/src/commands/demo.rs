//! `xlap-trace demo`: the main job end to end. Builds a two-host stage (a
//! `tbf` qdisc on the sender's link, so the qdisc layer is exercised), runs
//! the example protocol across it, traces both ends and prints what was
//! found.

use crate::cli::DemoArgs;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use xlap_capture::preflight;
use xlap_capture::record::options::{Output, Targets, View};
use xlap_capture::record::{self, RecordOptions};
use xlap_exit::{failure, memory, Code};
use xlap_stage::{Qdisc, Stage, StageConfig};

/// The example binaries are built beside xlap-trace.
fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.parent().context("exe dir")?.join(name);
    if !path.exists() {
        return Err(failure(
            Code::Runtime,
            format!(
                "{} is missing: build the workspace first (cargo build --workspace)",
                path.display()
            ),
        ));
    }
    Ok(path)
}

fn wait_for(path: &Path, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > timeout {
            anyhow::bail!("{} did not appear within {timeout:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The example protocol's receiver on host b and its sender on host a,
/// the sender waiting for `OUT/start`.
fn start_example(
    stage: &Stage,
    example: &Path,
    out: &Path,
    args: &DemoArgs,
) -> Result<(std::process::Child, std::process::Child)> {
    let (a, b) = (stage.host(0), stage.host(1));
    let files = |n: &str| out.join(n);
    for f in ["receiver.ready", "start", "tracer.ready"] {
        let _ = std::fs::remove_file(files(f));
    }
    let dest = format!("{}:9000", b.ipv4);
    let receiver = memory::unbounded(&mut b.command(example))
        .args(["recv", "--bind", &dest, "--expect", &args.count.to_string()])
        .arg("--ready-file")
        .arg(files("receiver.ready"))
        .arg("--log")
        .arg(files("receiver.jsonl"))
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start the example receiver")?;
    wait_for(&files("receiver.ready"), Duration::from_secs(20))?;
    let sender = memory::unbounded(&mut a.command(example))
        .args([
            "send",
            "--dest",
            &dest,
            "--bind",
            &format!("{}:9001", a.ipv4),
        ])
        .args([
            "--count",
            &args.count.to_string(),
            "--period-us",
            &args.period_us.to_string(),
        ])
        .args(["--drop", "0.01"])
        .arg("--start-file")
        .arg(files("start"))
        .arg("--log")
        .arg(files("sender.jsonl"))
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start the example sender")?;
    Ok((sender, receiver))
}

pub fn run(args: &DemoArgs) -> Result<()> {
    preflight::check_privileges(false)?;
    preflight::check_btf()?;
    preflight::check_kernel()?;
    let example = sibling(if args.plain {
        "xlap-example-plain"
    } else {
        "xlap-example"
    })?;
    let out = args.output.clone();
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let stage = Stage::build(&StageConfig {
        hosts: 2,
        qdiscs: vec![Some(Qdisc::parse("tbf").expect("valid")), None],
        ..Default::default()
    })
    .map_err(|e| match e {
        xlap_stage::StageError::NotRoot => failure(Code::Privileges, e.to_string()),
        other => anyhow::Error::new(other),
    })?;
    let (a, b) = (stage.host(0), stage.host(1));
    println!(
        "stage: host a {} ({}, tbf qdisc) -> host b {} ({})",
        a.ipv4, a.netns, b.ipv4, b.netns
    );
    let files = |n: &str| out.join(n);
    let (mut sender, mut receiver) = start_example(&stage, &example, &out, args)?;
    println!(
        "example protocol: {} data packets every {} µs, FEC k=4, 1 % artificial drop",
        args.count, args.period_us
    );

    let record_args = RecordOptions {
        targets: Targets {
            pids: vec![sender.id(), receiver.id()],
            ..Targets::default()
        },
        output: Output {
            dir: out.join("run"),
            ready_file: Some(files("tracer.ready")),
            // The demo correlates and prints the table itself.
            no_correlate: true,
            ..Output::default()
        },
        view: View {
            quiet: true,
            ..View::default()
        },
        ..RecordOptions::default()
    };
    let starter = {
        let (ready, start) = (files("tracer.ready"), files("start"));
        std::thread::spawn(move || -> Result<()> {
            wait_for(&ready, Duration::from_secs(60))?;
            std::fs::write(start, "go\n")?;
            Ok(())
        })
    };
    let meta = record::run(&record_args);
    let _ = starter.join();
    let (s, r) = (sender.wait()?, receiver.wait()?);
    let meta = meta?;
    if !s.success() || !r.success() {
        anyhow::bail!(
            "the example protocol failed (sender {s}, receiver {r}); see {}",
            out.display()
        );
    }
    drop(stage);

    println!("\n== protocol's own account ==");
    for (role, log) in [("sender", "sender.jsonl"), ("receiver", "receiver.jsonl")] {
        let text = std::fs::read_to_string(files(log)).unwrap_or_default();
        if let Some(summary) = text.lines().rev().find(|l| l.contains("\"summary\"")) {
            println!("{role}: {summary}");
        }
    }
    println!("\n== what the kernel saw ==");
    record::print_summary(&meta, &record_args.output.dir);
    analyse(&record_args.output.dir, &out)
}

/// The demo's analysis of its run `run`: the packets table, the main
/// kind's summary, outlier causes and correlation, and the report in
/// `out`.
fn analyse(run_dir: &Path, out: &Path) -> Result<()> {
    println!("\n== the packets table (sender and receiver joined by seq) ==");
    let files = xlap_records::RunDir::new(run_dir);
    let packets = files.packets();
    let correlation = xlap_analyze::finish::correlate_dirs(&[files], &packets, None)?;
    xlap_analyze::finish::print_correlation(&correlation, &packets);
    let run = run_dir.display().to_string();
    let (conn, _) =
        xlap_analyze::session::open(run_dir, xlap_analyze::dataset::Shared::Materialized, false)?;
    // The data packets: the protocol's most common kind.
    let kind = xlap_analyze::dataset::main_kind(&conn)?;
    let kind_arg: String = conn
        .query_row("SELECT name FROM kinds WHERE kind = ?", [kind], |r| {
            r.get(0)
        })
        .unwrap_or_else(|_| kind.to_string());
    println!(
        "\n== the analysis of kind {kind_arg} (xlap-trace analyze {run} --kind {kind_arg}) =="
    );
    let queries = ["summary", "outlier_causes", "correlation"]
        .iter()
        .map(|n| xlap_analyze::queries::find(n))
        .collect::<Result<Vec<_>, _>>()?;
    let params = [("kind".to_string(), kind.to_string())];
    let results = xlap_analyze::session::run_queries(&conn, &queries, &params, false)?;
    super::analyze::print_results(&results, xlap_analyze::format::Format::Table)?;
    let report = out.join("report.html");
    let html = xlap_analyze::report::build(
        &conn,
        &xlap_analyze::report::ReportOptions {
            kind: Some(kind),
            slowest: 5,
            title: format!("the demo ({run})"),
            others: Vec::new(),
        },
    )?;
    std::fs::write(&report, html)?;
    println!(
        "\nplots: {} (xlap-trace report {run}); every query: xlap-trace analyze {run} -q all",
        report.display()
    );
    Ok(())
}
