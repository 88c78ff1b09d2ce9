//! `xlap-trace`: the command line over the libraries (xlap-capture records,
//! xlap-analyze correlates and analyses, xlap-ci compares, xlap-estimate
//! probes and estimates). Parsing here, one module per command in
//! `commands/`.

mod cli;
mod commands;
mod confine;
mod decompression;

use anyhow::Result;
use clap::Parser;
use cli::{Cli, Command, DatasetCommand};
use commands::{analyze, ci, correlate, demo, estimate, points, record, report, schema, stage};
use std::process::ExitCode;
use xlap_analyze::AnalyzeError;
use xlap_exit::{memory, Code};

/// An allocation past the memory ceiling ends the command with a message
/// and exit code 8 (xlap_exit::memory), not an abort.
#[global_allocator]
static ALLOCATOR: memory::Ceiling = memory::Ceiling;

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    if let Err(e) = memory::apply() {
        eprintln!("xlap-trace: error: {e}");
        return ExitCode::from(Code::Usage as u8);
    }
    // Before any thread starts: an analysis started with privileges runs
    // in a confined child.
    match confine::analysis(&mut cli.command) {
        Ok(confine::Next::RunHere) => {}
        Ok(confine::Next::Exit(code)) => return code,
        Err(e) => {
            eprintln!("xlap-trace: error: {e:#}");
            // compare's 1 is a regression: its other failures exit 2.
            return match (&cli.command, exit_code(&e)) {
                (Some(Command::Compare(_)), 1) => ExitCode::from(Code::Usage as u8),
                (_, code) => ExitCode::from(code),
            };
        }
    }
    let inputs = runs_read(&cli.command);
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
        Err(e) if memory::ceiling().is_some() && decompression::is_failure(&e) => {
            decompression_failure(&e, &inputs)
        }
        Err(e) if out_of_memory(&e) => {
            eprintln!(
                "xlap-trace: error: out of memory while {}: {e:#}",
                memory::current_step()
            );
            eprintln!("xlap-trace: {}", memory::advice());
            ExitCode::from(Code::OutOfMemory as u8)
        }
        Err(e) => {
            eprintln!("xlap-trace: error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The engine could not decompress a page while the ceiling applied: a
/// damaged file, or its decompressor's allocation refused by the ceiling
/// (decompression.rs); the inputs are decoded once without it to tell.
fn decompression_failure(e: &anyhow::Error, inputs: &[std::path::PathBuf]) -> ExitCode {
    let step = memory::current_step();
    match decompression::cause(inputs) {
        decompression::Cause::Ceiling => {
            eprintln!(
                "xlap-trace: error: out of memory while {step}: the engine could not decompress a page at the memory ceiling ({e:#}); the files decode without the ceiling"
            );
            eprintln!("xlap-trace: {}", memory::advice());
            return ExitCode::from(Code::OutOfMemory as u8);
        }
        decompression::Cause::Damaged(file, why) => {
            eprintln!("xlap-trace: error: {e:#}");
            eprintln!(
                "xlap-trace: {}: {why}: the file is damaged (decoded again without the memory ceiling)",
                file.display()
            );
        }
        decompression::Cause::Unknown => {
            eprintln!("xlap-trace: error: {e:#}");
            eprintln!(
                "xlap-trace: a file is damaged, or the engine's decompressor ran out of memory at the ceiling: run it again with {}=off to tell",
                memory::CEILING_VAR
            );
        }
    }
    ExitCode::from(exit_code(e))
}

/// The engine ran out of memory (its limit, or the ceiling under it).
fn out_of_memory(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| memory::is_engine_out_of_memory(&c.to_string()))
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
        Some(AnalyzeError::Input { .. } | AnalyzeError::NoPackets(_)) => Code::BadInput as u8,
        Some(e) if e.is_unreadable_file() => Code::BadInput as u8,
        Some(AnalyzeError::Usage(_)) => Code::Usage as u8,
        _ => Code::Runtime as u8,
    }
}

/// The runs a command reads, recovered first when their recorder died
/// (`recover` itself says what it recovers).
fn runs_read(command: &Option<Command>) -> Vec<std::path::PathBuf> {
    match command {
        None | Some(Command::Recover(_)) => Vec::new(),
        Some(c) => confine::inputs(c).unwrap_or_default(),
    }
}

/// What a command does, for the message of an allocation failure.
fn step_of(command: &Option<Command>) -> &'static str {
    match command {
        None | Some(Command::Record(_)) => "recording",
        Some(Command::Run(_)) => "recording a command",
        Some(Command::Finish(_)) => "finishing a run",
        Some(Command::Summary(_)) => "summarising runs",
        Some(Command::Compare(_)) => "comparing runs",
        Some(Command::History(_)) => "reading the history of runs",
        Some(Command::Analyze(_)) => "analysing",
        Some(Command::Sql(_)) => "running SQL",
        Some(Command::Synth(_)) => "synthesising a run",
        Some(Command::Report(_)) => "building the report",
        Some(Command::Export(_)) => "exporting",
        Some(Command::Demo(_)) => "running the demo",
        Some(Command::Recover(_)) => "recovering a run",
        Some(Command::Correlate(_)) => "correlating",
        Some(Command::Dataset(_)) => "adding runs to a dataset",
        _ => "working",
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    memory::step("recovering the runs read");
    let runs = runs_read(&cli.command);
    xlap_capture::recover::before_reading(&runs.iter().map(|p| p.as_path()).collect::<Vec<_>>());
    memory::step(step_of(&cli.command));
    let done = match cli.command {
        None => record::record(&cli.record),
        Some(Command::Record(a)) => record::record(&a),
        Some(Command::Run(a)) => return record::run(&a),
        Some(Command::Finish(a)) => record::finish(&a),
        Some(Command::PeerDecode) => commands::peer_link::decode(),
        Some(Command::Summary(a)) => ci::summary(&a),
        // 1 is compare's regression: any other failure exits 2.
        Some(Command::Compare(a)) => {
            return ci::compare(&a).map_err(|e| {
                if exit_code(&e) == Code::Runtime as u8 && !out_of_memory(&e) {
                    e.context(xlap_exit::Failure {
                        code: Code::Usage,
                        message: "compare failed (exit 2; 1 is a regression)".into(),
                    })
                } else {
                    e
                }
            })
        }
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
