//! The confinement of the commands that parse what traced programs or a
//! run directory from elsewhere control (xlap-sandbox): no capabilities,
//! no_new_privs, and files only where the command reads and writes.
//!
//! `finish` (the end of `record` and `run`) confines itself to its run.
//! An analysis command started with privileges (`analyze`, `report`,
//! `compare`, ... as root on a CI artifact) runs in a confined child of
//! itself; the privileged parent parses nothing: it makes the files the
//! child may write, waits, and moves what the child wrote in a staging
//! directory into place (module [`outputs`]).

mod outputs;

use crate::cli::{Command, DatasetCommand};
use anyhow::{anyhow, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use xlap_records::RunDir;

/// Confines this process to run directory `run` (read and written) and
/// the system's read-only files. DuckDB spills beneath the run, the one
/// place it may write. Without Landlock the process still drops every
/// capability, and says once what it lacks (unless `quiet`).
pub fn to_run(run: &RunDir, quiet: bool) -> Result<()> {
    let run = run.path();
    // Still one thread (apply checks): no other thread reads the
    // environment while it changes.
    std::env::set_var("TMPDIR", run);
    let mut policy = xlap_sandbox::Policy::new().write(run);
    // Without Landlock, the run's owner where it is not root's.
    if xlap_sandbox::landlock_abi().is_err() {
        if let Some((uid, gid)) = xlap_sandbox::user_for(&[run]) {
            policy = policy.as_user(uid, gid);
        }
    }
    let confined = policy
        .apply()
        .map_err(|e| anyhow!("cannot confine the analysis of {}: {e}", run.display()))?;
    if let (Some(shortfall), false) = (confined.shortfall(), quiet) {
        eprintln!("xlap-trace: note: {shortfall}");
    }
    Ok(())
}

/// Set in the environment of the confined child: it confines itself, and
/// takes the outputs the parent staged for it.
const CHILD: &str = "XLAP_CONFINED_ANALYSIS";

/// How an output of a command reaches its place.
enum Output<'a> {
    /// A file the command opens by name and writes in place: the parent
    /// makes it, the child may write that one file.
    File(&'a mut PathBuf),
    /// A file the command writes whole through a temporary file beside it
    /// and a rename, with the other files it writes beside it (all named):
    /// the child writes in a staging directory beside it, the parent moves
    /// the named files into place.
    Staged(&'a mut PathBuf, Vec<PathBuf>),
    /// A directory the command fills (a dataset): made when missing,
    /// written beneath by the child.
    Directory(&'a Path),
}

/// What an analysis command reads and writes.
struct Access<'a> {
    /// Run directories (read and written: a run whose recorder died is
    /// recovered, a missing packets table is built) or files (read: a
    /// summary, a packets Parquet file).
    inputs: Vec<PathBuf>,
    outputs: Vec<Output<'a>>,
}

/// What an analysis command reads: run directories, or files in them (a
/// summary, a packets Parquet file); None for the other commands
/// (recording needs its privileges, `finish` confines itself, `schema`,
/// `synth`, `stage`, `probe`, `estimate` and `points` read no run).
pub fn inputs(command: &Command) -> Option<Vec<PathBuf>> {
    Some(match command {
        Command::Analyze(a) => a.run.iter().cloned().collect(),
        Command::Sql(a) => vec![a.run.clone()],
        Command::Report(a) => a.runs.clone(),
        Command::Export(a) => vec![a.run.clone()],
        Command::Correlate(a) => a.runs.clone(),
        Command::Summary(a) => a.runs.clone(),
        Command::Compare(a) => vec![a.baseline.clone(), a.candidate.clone()],
        Command::History(a) => a.runs.clone(),
        Command::Recover(a) => a.runs.clone(),
        Command::Dataset(DatasetCommand::Add(a)) => a.runs.clone(),
        _ => return None,
    })
}

/// What an analysis command writes.
fn outputs(command: &mut Command) -> Vec<Output<'_>> {
    match command {
        Command::Report(a) => vec![Output::File(&mut a.output)],
        Command::Export(a) => {
            let pcapng = a.pcapng.iter_mut().map(|p| {
                let files = vec![p.clone()];
                Output::Staged(p, files)
            });
            a.perfetto
                .iter_mut()
                .map(Output::File)
                .chain(pcapng)
                .collect()
        }
        Command::Correlate(a) => {
            let files = xlap_analyze::finish::correlation_files(&a.output);
            vec![Output::Staged(&mut a.output, files)]
        }
        Command::Summary(a) => a.output.iter_mut().map(Output::File).collect(),
        Command::Compare(a) => a.junit.iter_mut().map(Output::File).collect(),
        Command::History(a) => a.svg.iter_mut().map(Output::File).collect(),
        Command::Dataset(DatasetCommand::Add(a)) => vec![Output::Directory(&a.output)],
        _ => vec![],
    }
}

/// The files of an analysis command; None for the others.
fn access(command: &mut Option<Command>) -> Option<Access<'_>> {
    let command = command.as_mut()?;
    let inputs = inputs(command)?;
    Some(Access {
        inputs,
        outputs: outputs(command),
    })
}

/// What `main` does next.
pub enum Next {
    /// Run the command in this process (confined already, or never
    /// privileged).
    RunHere,
    /// The confined child ran it and exited so.
    Exit(ExitCode),
}

/// Confines an analysis command: in the child, itself; in a privileged
/// parent, by running the child. Must come before any thread starts.
pub fn analysis(command: &mut Option<Command>) -> Result<Next> {
    let Some(access) = access(command) else {
        return Ok(Next::RunHere);
    };
    if std::env::var_os(CHILD).is_some() {
        outputs::confine_child(access, CHILD)?;
        return Ok(Next::RunHere);
    }
    if !xlap_sandbox::privileged() {
        return Ok(Next::RunHere);
    }
    outputs::run_child(access, CHILD).map(Next::Exit)
}

/// The path a message names for `path`: the one the user gave, where the
/// child writes a staged file instead.
pub fn shown(path: &Path) -> PathBuf {
    outputs::shown(path)
}
