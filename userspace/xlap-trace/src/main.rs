//! `xlap-trace`: the CLI and recording daemon.

use anyhow::Result;
use clap::Parser;
use std::process::ExitCode;
use xlap_trace::cli::{self, Cli, Command, StageCommand};
use xlap_trace::exit::{failure, Code};
use xlap_trace::{
    analyze_cmd, correlate_cmd, demo, estimate, exit, probe, proto, record, recover, report_cmd,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        // Output piped into `head`: not an error.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xlap-trace: error: {e:#}");
            ExitCode::from(exit::code_of(&e))
        }
    }
}

/// The runs a command reads (recovered first when their recorder died).
fn runs_read(command: &Option<Command>) -> Vec<&std::path::Path> {
    match command {
        Some(Command::Analyze(a)) => a.run.iter().map(|p| p.as_path()).collect(),
        Some(Command::Sql(a)) => vec![a.run.as_path()],
        Some(Command::Report(a)) => a.runs.iter().map(|p| p.as_path()).collect(),
        Some(Command::Export(a)) => vec![a.run.as_path()],
        Some(Command::Correlate(a)) => a.runs.iter().map(|p| p.as_path()).collect(),
        Some(Command::Summary(a)) => a.runs.iter().map(|p| p.as_path()).collect(),
        Some(Command::Compare(a)) => vec![a.baseline.as_path(), a.candidate.as_path()],
        Some(Command::History(a)) => a.runs.iter().map(|p| p.as_path()).collect(),
        _ => Vec::new(),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    recover::before_reading(&runs_read(&cli.command));
    let done = match cli.command {
        None | Some(Command::Record(_)) => {
            let args = match cli.command {
                Some(Command::Record(a)) => *a,
                _ => cli.record,
            };
            let meta = record::run(&args)?;
            record::print_summary(&meta, &record::segments::final_dir(&args.output));
            if !args.no_correlate {
                record::correlate_run(&args);
            }
            Ok(())
        }
        Some(Command::Run(a)) => return run_command(&a),
        Some(Command::Summary(a)) => summary(&a),
        Some(Command::Compare(a)) => return compare(&a),
        Some(Command::History(a)) => history(&a),
        Some(Command::Schema(a)) => schema(a),
        Some(Command::Analyze(a)) => analyze_cmd::analyze(&a),
        Some(Command::Sql(a)) => analyze_cmd::sql(&a),
        Some(Command::Synth(a)) => analyze_cmd::synth(&a),
        Some(Command::Report(a)) => report_cmd::report(&a),
        Some(Command::Export(a)) => report_cmd::export(&a),
        Some(Command::Stage(c)) => stage(c),
        Some(Command::Demo(a)) => demo::run(&a),
        Some(Command::Probe(probe::ProbeCommand::Serve(a))) => {
            let s = probe::serve::run(&a)?;
            println!(
                "probe serve {}: echoed {} probes, ignored {} other datagrams",
                a.bind, s.echoed, s.ignored
            );
            if a.delay_us > 0 && s.echoed > 0 {
                println!(
                    "probe serve {}: delay spent {:.1} us per direction on average (--delay-us {})",
                    a.bind,
                    s.delay_spent.as_secs_f64() * 1e6 / (2 * s.echoed) as f64,
                    a.delay_us
                );
            }
            Ok(())
        }
        Some(Command::Probe(probe::ProbeCommand::Rtt(a))) => {
            let f = probe::rtt::run(&a)?;
            probe::rtt::write(&a, &f)
        }
        Some(Command::Estimate(a)) => estimate::run(&a),
        Some(Command::Recover(a)) => {
            for dir in a.runs.iter().flat_map(|d| recover::runs_named(d)) {
                let dir = &dir;
                match recover::recover(dir)? {
                    Some(r) => recover::report(&r),
                    None => println!("{}: nothing to recover (the run ended)", dir.display()),
                }
            }
            Ok(())
        }
        Some(Command::Correlate(a)) => {
            let dirs: Vec<&std::path::Path> = a.runs.iter().map(|p| p.as_path()).collect();
            let result = correlate_cmd::correlate(&dirs, &a.output, a.deadline_ms)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                correlate_cmd::print(&result, &a.output);
            }
            Ok(())
        }
        Some(Command::Points) => {
            println!("kernel stamp points:");
            for p in xlap_records::points::kernel_points() {
                println!("  {:<18} {}", p.name, p.side.as_str());
            }
            println!("app points: app.<marker> for every USDT marker xlap:<marker>");
            println!("protocol presets (--proto):");
            for (name, layout, what) in proto::PRESETS {
                println!("  {name:<14} {what}");
                if !layout.kind_names.is_empty() {
                    let kinds: Vec<String> = layout
                        .kind_names
                        .iter()
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect();
                    println!("  {:<14} kinds: {}", "", kinds.join(", "));
                }
            }
            Ok(())
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}

/// `run -- CMD`: traced like `record`, then the command's own status.
fn run_command(a: &cli::RunArgs) -> Result<ExitCode> {
    let args = &a.record;
    let (meta, status) = record::command::run(args, &a.command)?;
    record::print_summary(&meta, &record::segments::final_dir(&args.output));
    if meta.packets == 0 && meta.stamps == 0 {
        eprintln!(
            "xlap-trace: {} sent and received no UDP datagram on a traced socket: nothing was stamped",
            a.command[0]
        );
    } else if !args.no_correlate {
        record::correlate_run(args);
    }
    Ok(ExitCode::from(record::command::exit_code(status)))
}

fn summary(a: &cli::SummaryArgs) -> Result<()> {
    use xlap_trace::ci::summary::Summary;
    let parts = a
        .runs
        .iter()
        .map(|r| Summary::load(r))
        .collect::<Result<Vec<_>>>()?;
    let summary = if parts.len() == 1 {
        parts.into_iter().next().expect("one")
    } else {
        Summary::pool(&parts)?
    };
    let out = match (&a.output, a.runs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) if one.is_dir() => xlap_records::RunDir::new(one).summary(),
        _ => {
            return Err(failure(
                Code::Usage,
                "several runs pool into one summary: name the file with -o FILE",
            ))
        }
    };
    summary.write(&out)?;
    println!(
        "wrote {} ({} run{}, {} stage distributions)",
        out.display(),
        summary.runs.len(),
        if summary.runs.len() == 1 { "" } else { "s" },
        summary.stages.len()
    );
    Ok(())
}

/// `compare`: 0 no regression, 1 regression, 2 error (usage and input
/// errors keep their own codes: 2 and 6).
fn compare(a: &cli::CompareArgs) -> Result<ExitCode> {
    use xlap_trace::ci::{compare, render, stats::Verdict, summary::Summary};
    if !(0.5..1.0).contains(&a.confidence) {
        return Err(failure(Code::Usage, "--confidence must lie in [0.5, 1)"));
    }
    let base = Summary::load(&a.baseline)?;
    let mut cand = Summary::load(&a.candidate)?;
    if xlap_records::RunDir::new(&a.candidate).packets().exists() {
        // Measured on the baseline's stages (see add_stages_of).
        let names: Vec<String> = base.stages.iter().map(|s| s.stage.clone()).collect();
        cand.add_stages_of(&a.candidate, &names)?;
    }
    let th = compare::Thresholds {
        max_regression: a.max_regression,
        min_change_ns: a.min_change,
        confidence: a.confidence,
    };
    let c = compare::compare(&base, &cand, &a.metrics, th)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else if a.markdown {
        print!("{}", render::markdown(&c));
    } else {
        print!("{}", render::table(&c));
    }
    if let Some(path) = &a.junit {
        std::fs::write(path, render::junit(&c))?;
    }
    Ok(if c.verdict == Verdict::Regression {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn history(a: &cli::HistoryArgs) -> Result<()> {
    use xlap_trace::ci::{history, summary::Summary};
    let runs = a
        .runs
        .iter()
        .map(|r| Summary::load(r))
        .collect::<Result<Vec<_>>>()?;
    let series = history::series(&runs, &a.metrics);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&series)?);
    } else {
        print!("{}", history::markdown(&runs, &series));
    }
    if let Some(path) = &a.svg {
        std::fs::write(path, history::svg(&series, runs.len(), a.top))?;
    }
    Ok(())
}

fn schema(a: cli::SchemaArgs) -> Result<()> {
    use xlap_records::schema::{all, to_json};
    match (a.write, a.check) {
        (Some(dir), _) => {
            std::fs::create_dir_all(&dir)?;
            for (name, s) in all() {
                let path = dir.join(format!("{name}.schema.json"));
                std::fs::write(&path, to_json(&s))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        (None, Some(dir)) => {
            let mut stale = Vec::new();
            for (name, s) in all() {
                let path = dir.join(format!("{name}.schema.json"));
                if std::fs::read_to_string(&path).ok().as_deref() != Some(to_json(&s).as_str()) {
                    stale.push(path.display().to_string());
                }
            }
            if stale.is_empty() {
                println!("schemas are up to date");
                Ok(())
            } else {
                Err(failure(
                    Code::Runtime,
                    format!(
                        "stale schema files: {} (run `xlap-trace schema --write {}`)",
                        stale.join(", "),
                        dir.display()
                    ),
                ))
            }
        }
        (None, None) => {
            for (name, s) in all() {
                println!("# {name}\n{}", to_json(&s));
            }
            Ok(())
        }
    }
}

fn stage(c: StageCommand) -> Result<()> {
    let stage_err = |e: xlap_stage::StageError| match e {
        xlap_stage::StageError::NotRoot => failure(Code::Privileges, e.to_string()),
        other => anyhow::Error::new(other),
    };
    match c {
        StageCommand::Up {
            hosts,
            qdisc,
            link,
            mtu,
            second_path,
        } => {
            let qdiscs = cli::parse_qdisc_args(&qdisc, hosts as usize)?;
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone())?;
            }
            let stage = xlap_stage::Stage::build(&xlap_stage::StageConfig {
                hosts: hosts as usize,
                qdiscs,
                link,
                mtu,
                second_path,
            })
            .map_err(stage_err)?;
            for h in &stage.hosts {
                println!(
                    "host {}: netns {} dev {} {} {}",
                    h.netns.rsplit('-').next().unwrap_or(""),
                    h.netns,
                    h.ifname,
                    h.ipv4,
                    h.ipv6
                );
                if let Some((v4, v6)) = h.second {
                    println!("  second path: dev xl1 {v4} {v6}");
                }
            }
            println!(
                "run commands in a host with: ip netns exec NETNS CMD; Ctrl-C removes the stage"
            );
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            drop(stage);
            println!("stage removed");
            Ok(())
        }
        StageCommand::Sweep { check } => {
            let mut removed = xlap_stage::sweep_orphans().map_err(stage_err)?;
            for ns in &removed {
                println!("removed {ns}");
            }
            // Leaks a stage swept before it was built (since the last sweep).
            for ns in xlap_stage::take_noted_leaks() {
                println!("removed earlier by a new stage: {ns}");
                removed.push(ns);
            }
            if check && !removed.is_empty() {
                return Err(failure(
                    Code::Runtime,
                    format!(
                        "{} stage namespaces were left behind by exited processes",
                        removed.len()
                    ),
                ));
            }
            Ok(())
        }
        StageCommand::List => {
            for ns in xlap_stage::list_namespaces().map_err(stage_err)? {
                if ns.starts_with("xlt") {
                    println!("{ns}");
                }
            }
            Ok(())
        }
    }
}
