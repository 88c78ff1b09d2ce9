//! `xlap-trace`: the command line over the libraries (xlap-capture records,
//! xlap-analyze correlates and analyses, xlap-ci compares, xlap-estimate
//! probes and estimates). Parsing here, one module per command in
//! `commands/`.

mod cli;
mod commands;

use anyhow::Result;
use clap::Parser;
use cli::{Cli, Command, DatasetCommand};
use commands::{analyze, ci, correlate, demo, estimate, points, record, report, schema, stage};
use std::process::ExitCode;
use xlap_analyze::AnalyzeError;
use xlap_exit::Code;

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
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The exit code of an error (README: exit codes): the code a library
/// attached to it, else the one of an analysis error (a bad input file 6,
/// an unknown name 2), else 1.
fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<xlap_exit::Failure>()) {
        return xlap_exit::code_of(e);
    }
    let analysis = e.chain().find_map(|c| c.downcast_ref::<AnalyzeError>());
    match analysis {
        Some(AnalyzeError::Input { .. }) => Code::BadInput as u8,
        Some(AnalyzeError::Usage(_)) => Code::Usage as u8,
        _ => Code::Runtime as u8,
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
        Some(Command::Dataset(DatasetCommand::Add(a))) => {
            a.runs.iter().map(|p| p.as_path()).collect()
        }
        _ => Vec::new(),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    xlap_capture::recover::before_reading(&runs_read(&cli.command));
    let done = match cli.command {
        None => record::record(&cli.record),
        Some(Command::Record(a)) => record::record(&a),
        Some(Command::Run(a)) => return record::run(&a),
        Some(Command::Finish(a)) => record::finish(&a),
        Some(Command::Summary(a)) => ci::summary(&a),
        Some(Command::Compare(a)) => return ci::compare(&a),
        Some(Command::History(a)) => ci::history(&a),
        Some(Command::Schema(a)) => schema::schema(a),
        Some(Command::Analyze(a)) => analyze::analyze(&a),
        Some(Command::Sql(a)) => analyze::sql(&a),
        Some(Command::Synth(a)) => analyze::synth(&a),
        Some(Command::Report(a)) => report::report(&a),
        Some(Command::Export(a)) => report::export(&a),
        Some(Command::Stage(c)) => stage::stage(c),
        Some(Command::Demo(a)) => demo::run(&a),
        Some(Command::Probe(c)) => estimate::probe(&c),
        Some(Command::Estimate(a)) => estimate::estimate(&a),
        Some(Command::Recover(a)) => correlate::recover(&a),
        Some(Command::Correlate(a)) => correlate::correlate(&a),
        Some(Command::Dataset(DatasetCommand::Add(a))) => correlate::dataset_add(&a),
        Some(Command::Points) => {
            points::points();
            Ok(())
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}
