//! A partitioned dataset of runs (`xlap-trace dataset add RUN... -o DIR`):
//! runs laid out as hive partitions, which DuckDB and Spark read alike,
//! and which every command that takes a run takes too.
//!
//! ```text
//! DIR/run_id=<run>/packets.parquet           the run's packets (+ its stored
//!                                            aggregates, packets.json, summary.json)
//! DIR/run_id=<run>/runs.parquet              the run's metadata: the `runs` view
//! DIR/run_id=<run>/recorder=<id>/run.json    each recorder's run (one per host
//! DIR/run_id=<run>/recorder=<id>/stamps.parquet   of the connection)
//! ```
//!
//! A run is what the analyses read as one: one recording, or the
//! recordings of a connection's hosts correlated together; `<run>` is the
//! run id its packets carry (the first recording's). Each directory
//! `DIR/run_id=<run>` is itself a run argument; `DIR` is the whole
//! dataset (`sql`, `analyze`, `history`). A reader that derives columns
//! from the path (DuckDB's `hive_partitioning`, Spark's partition
//! discovery) takes `run_id` from it, so a second host's stamps read with
//! the run's id, not their recorder's (which `recorder` keeps). The host
//! is not a key: two recorders of one machine (two network namespaces)
//! share a host name.
//!
//! A run is built in a staging directory beside the others and renamed
//! into place, so a reader never sees half a run. Files are hard-linked
//! where the run and the dataset share a file system, else copied.

use crate::{sql, AnalyzeError, Result};
use std::path::{Path, PathBuf};
use xlap_records::RunDir;

pub use crate::layout::{
    is_dataset, recorders_of, runs_by_start, runs_of, RECORDER_KEY, RUNS_TABLE, RUN_KEY,
};

/// A run added to a dataset.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Added {
    pub run_id: String,
    pub dir: PathBuf,
    pub recorders: Vec<String>,
    pub packets: u64,
    /// Files hard-linked (the rest copied).
    pub linked: usize,
    pub copied: usize,
    /// A run of that id was there and is replaced.
    pub replaced: bool,
}

/// A run id as a directory name: ids come from the files (a run.json, a
/// packets column), so anything that could leave the dataset directory
/// or read as another key is refused.
fn partition_value(id: &str, of: &Path) -> Result<String> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '+'));
    if ok {
        Ok(id.to_string())
    } else {
        Err(input(
            of,
            format!("run id {id:?} cannot name a partition (letters, digits and - _ . : + only, at most 128): re-record or correlate it with this xlap-trace"),
        ))
    }
}

fn input(path: &Path, what: impl Into<String>) -> AnalyzeError {
    AnalyzeError::Input {
        path: path.display().to_string(),
        what: what.into(),
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> AnalyzeError {
    AnalyzeError::Other(format!("cannot {what} {}: {e}", path.display()))
}

/// Hard-links `from` to `to`, or copies it across file systems. Returns
/// whether it linked. Only a regular file: a symbolic link in a run from
/// elsewhere would put the file it names into the dataset (a copy follows
/// it), so it is refused.
fn link_or_copy(from: &Path, to: &Path) -> Result<bool> {
    let meta = std::fs::symlink_metadata(from).map_err(|e| io("read", from, e))?;
    if !meta.file_type().is_file() {
        return Err(input(
            from,
            "not a regular file (a symbolic link?): a dataset takes the run's own files only",
        ));
    }
    match std::fs::hard_link(from, to) {
        Ok(()) => Ok(true),
        Err(_) => {
            std::fs::copy(from, to).map_err(|e| io("copy", from, e))?;
            Ok(false)
        }
    }
}

/// Adds run `run` (a run directory, or a directory of the hosts' runs)
/// to dataset `dataset`, correlating it first if it has no packets.
/// A run already there is an error unless `replace`.
pub fn add(run: &Path, dataset: &Path, replace: bool) -> Result<Added> {
    if !run.is_dir() {
        return Err(input(
            run,
            "not a run directory (give a directory written by `xlap-trace record`, or one holding the hosts' runs)",
        ));
    }
    if is_dataset(run) {
        return Err(input(
            run,
            "a dataset, not a run: add its runs (DIR/run_id=…) one by one",
        ));
    }
    let files = RunDir::new(run);
    if files.is_rotated() {
        return Err(input(
            run,
            "a rotated recording: add its segments one by one",
        ));
    }
    let mut recorders = Vec::new();
    if files.is_run() {
        recorders.push(files.clone());
    }
    // (A run partition of another dataset: its recorder=… directories.)
    recorders.extend(crate::layout::run_dirs_in(run));
    if recorders.is_empty() {
        return Err(input(
            run,
            "not an xlap-trace run: no run.json here or in its subdirectories",
        ));
    }
    std::fs::create_dir_all(dataset).map_err(|e| io("create", dataset, e))?;
    let staging = dataset.join(format!(".adding-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| io("remove", &staging, e))?;
    }
    std::fs::create_dir(&staging).map_err(|e| io("create", &staging, e))?;
    let built = build(&files, &recorders, &staging);
    let (run_id, names, packets, linked, copied) = match built {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    let target = dataset.join(format!("{RUN_KEY}={run_id}"));
    let replaced = target.exists();
    if replaced && !replace {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(input(
            &target,
            format!("run {run_id} is already in the dataset: give --replace to replace it"),
        ));
    }
    let old = dataset.join(format!(".replaced-{}", std::process::id()));
    if replaced {
        std::fs::rename(&target, &old).map_err(|e| io("move aside", &target, e))?;
    }
    std::fs::rename(&staging, &target).map_err(|e| io("move into place", &staging, e))?;
    if replaced {
        let _ = std::fs::remove_dir_all(&old);
    }
    Ok(Added {
        run_id,
        dir: target,
        recorders: names,
        packets,
        linked,
        copied,
        replaced,
    })
}

type Built = (String, Vec<String>, u64, usize, usize);

/// The run's files in `staging`: its packets (correlated here when it has
/// none) with their stored aggregates and summary, each recorder's run,
/// and the runs table.
fn build(files: &RunDir, recorders: &[RunDir], staging: &Path) -> Result<Built> {
    let run = files.path();
    let staged = RunDir::new(staging);
    let (mut linked, mut copied) = (0, 0);
    let mut put = |from: &Path, to: &Path| -> Result<()> {
        if link_or_copy(from, to)? {
            linked += 1;
        } else {
            copied += 1;
        }
        Ok(())
    };
    let packets = staged.packets();
    let own = files.packets();
    if own.is_file() {
        put(&own, &packets)?;
        let beside = crate::stored::TABLES
            .iter()
            .map(|t| {
                (
                    crate::stored::path(&own, t),
                    crate::stored::path(&packets, t),
                )
            })
            .chain([(own.with_extension("json"), packets.with_extension("json"))])
            .chain([(files.summary(), staged.summary())]);
        for (from, to) in beside {
            if from.is_file() {
                put(&from, &to)?;
            }
        }
    } else {
        crate::finish::correlate_dirs(recorders, &packets, None)?;
    }
    // Stored aggregates the packets lack or cannot use (another release,
    // other packets) are computed again: the dataset's runs read fast.
    crate::finish::refresh_aggregates(&packets);
    let conn = crate::engine()?;
    crate::confine(&conn, &[staging, run])?;
    let (ids, count): (Vec<String>, u64) = {
        let mut stmt = conn.prepare(&format!(
            "SELECT DISTINCT run_id FROM read_parquet({}) ORDER BY 1 LIMIT 3",
            sql::path(&packets)
        ))?;
        let ids = stmt
            .query_map([], |r| r.get::<_, Option<String>>(0))?
            .collect::<std::result::Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .collect();
        let count: i64 = conn.query_row(
            &format!("SELECT count(*) FROM read_parquet({})", sql::path(&packets)),
            [],
            |r| r.get(0),
        )?;
        (ids, count as u64)
    };
    let run_id = match ids.as_slice() {
        [one] => partition_value(one, &own)?,
        [] => return Err(input(run, "its packets carry no run id: nothing to add")),
        _ => {
            return Err(input(
                run,
                format!(
                    "its packets carry several run ids ({}): add the runs one by one",
                    ids.join(", ")
                ),
            ))
        }
    };
    let mut names = Vec::new();
    let mut metas = Vec::new();
    for dir in recorders {
        let meta = crate::runs::read_meta(&dir.meta())?;
        let id = partition_value(&meta.run_id, &dir.meta())?;
        let to = RunDir::new(staging.join(format!("{RECORDER_KEY}={id}")));
        if to.path().exists() {
            return Err(input(
                dir.path(),
                format!("two recordings with run id {id}: a run holds each recording once"),
            ));
        }
        std::fs::create_dir(to.path()).map_err(|e| io("create", to.path(), e))?;
        put(&dir.meta(), &to.meta())?;
        let stamps = dir.stamps();
        if stamps.is_file() {
            put(&stamps, &to.stamps())?;
        }
        metas.push(to.meta());
        names.push(id);
    }
    crate::dataset::load_runs(&conn, &metas)?;
    // The file column names the recording inside the dataset, not where it
    // was added from.
    conn.execute_batch(&format!(
        "UPDATE runs SET file = '{RECORDER_KEY}=' || run_id || '/run.json';
         COPY runs TO {} (FORMAT parquet);",
        sql::path(&staging.join(RUNS_TABLE))
    ))?;
    if !staged.summary().is_file() {
        crate::summary::Summary::of_run(staging)?.write(&staged.summary())?;
    }
    Ok((run_id, names, count, linked, copied))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_that_could_leave_the_dataset_are_refused() {
        let of = Path::new("run.json");
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "a=b",
            "x\0",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(partition_value(bad, of).is_err(), "{bad:?}");
        }
        for good in ["synth-1", "7f3a-09b2_host.a", "2026-11-27T02:40:00+00:00"] {
            assert_eq!(partition_value(good, of).unwrap(), good);
        }
    }

    #[test]
    fn a_symbolic_link_is_not_taken_into_a_dataset() {
        let dir = std::env::temp_dir().join(format!("xlap-part-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, b"not for the dataset").unwrap();
        let link = dir.join("stamps.parquet");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let to = dir.join("copied");
        assert!(link_or_copy(&link, &to).is_err());
        assert!(!to.exists());
        assert!(
            link_or_copy(&secret, &to).unwrap(),
            "a regular file is linked"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_without_run_partitions_is_not_a_dataset() {
        let dir = std::env::temp_dir().join(format!("xlap-part-{}", std::process::id()));
        let run = dir.join("run_id=r1");
        std::fs::create_dir_all(&run).unwrap();
        assert!(!is_dataset(&dir), "a partition without packets");
        std::fs::write(RunDir::new(&run).packets(), b"x").unwrap();
        assert!(is_dataset(&dir));
        assert_eq!(runs_of(&dir), vec![run.clone()]);
        std::fs::create_dir_all(dir.join("other")).unwrap();
        assert_eq!(runs_of(&dir), vec![run]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
