//! Where runs lie on disk: a run directory, a directory of runs, the
//! directory of a packets file given instead of its run, and the
//! partitions of a dataset (`run_id=…/recorder=…`, crate::partitioned
//! writes them). Read by every module that opens runs; imports none of
//! them.

use std::path::{Path, PathBuf};
use xlap_records::RunDir;

/// The partition key of a run, and of a recorder within it.
pub const RUN_KEY: &str = "run_id";
pub const RECORDER_KEY: &str = "recorder";
/// The run's metadata table, beside its packets.
pub const RUNS_TABLE: &str = "runs.parquet";

/// Where `dataset::open` looks for a run's files: the directory given, or
/// the directory of the packets file given (its runs are beside it).
pub fn run_root(run: &Path) -> &Path {
    if run.is_file() {
        run.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    } else {
        run
    }
}

/// The run directories directly in `dir`, in name order.
pub(crate) fn run_dirs_in(dir: &Path) -> Vec<RunDir> {
    let mut out: Vec<RunDir> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| RunDir::new(e.path())))
                .filter(RunDir::is_run)
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| a.path().cmp(b.path()));
    out
}

/// Whether `dir` is a dataset: it holds run partitions.
pub fn is_dataset(dir: &Path) -> bool {
    !runs_of(dir).is_empty()
}

/// The run partitions of dataset `dir` (`run_id=*` holding packets), in
/// name order.
pub fn runs_of(dir: &Path) -> Vec<PathBuf> {
    partitions(dir, RUN_KEY)
        .into_iter()
        .filter(|p| RunDir::new(p).packets().is_file())
        .collect()
}

/// The run partitions of dataset `dir`, oldest first (by their first
/// recording's start; a run whose recordings do not read goes last).
pub fn runs_by_start(dir: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<(u64, PathBuf)> = runs_of(dir)
        .into_iter()
        .map(|run| {
            let start = recorders_of(&run)
                .iter()
                .filter_map(|r| crate::runs::read_meta(&r.meta()).ok())
                .map(|m| m.clock_start.realtime_ns)
                .min()
                .unwrap_or(u64::MAX);
            (start, run)
        })
        .collect();
    runs.sort();
    runs.into_iter().map(|(_, r)| r).collect()
}

/// The recorders' runs of run partition `run`.
pub fn recorders_of(run: &Path) -> Vec<RunDir> {
    partitions(run, RECORDER_KEY)
        .into_iter()
        .map(RunDir::new)
        .filter(RunDir::is_run)
        .collect()
}

fn partitions(dir: &Path, key: &str) -> Vec<PathBuf> {
    let prefix = format!("{key}=");
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}
