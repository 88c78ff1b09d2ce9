//! From stamps to X-LAP's table: the `packets` table (a row per packet, a
//! column per stamp point, sender and receiver side by side, derived
//! durations and flags), with the clocks of the hosts mapped onto one.
//!
//! Everything runs in an embedded DuckDB over the runs' Parquet files, so
//! memory stays bounded by DuckDB's limit (it spills to disk) rather than by
//! the number of packets.

pub mod clock;
pub mod correlate;
pub mod dataset;
pub mod finish;
pub mod format;
pub mod layout;
pub mod packets_table;
pub mod partitioned;
pub mod pcapng;
pub mod perfetto;
pub mod queries;
pub mod report;
pub mod runs;
pub mod session;
pub mod sql;
pub mod store;
pub mod stored;
pub mod summary;
pub mod synth;
pub mod views;

pub use correlate::{correlate, CorrelateOptions, Correlation};

pub use runs::Run;
use std::path::{Path, PathBuf};
pub use xlap_records::kinds::{kind_label, KIND_ALL, KIND_ALL_NAME};

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("{path}: {what}")]
    Input { path: String, what: String },
    /// A command-line mistake: unknown query or parameter.
    #[error("{0}")]
    Usage(String),
    /// A query (bundled or the user's) that DuckDB refused.
    #[error("query {query}: {what}")]
    Query { query: String, what: String },
    #[error("DuckDB: {0}")]
    Db(#[from] duckdb::Error),
    /// The runs hold no packet to analyse (bad input: exit 6).
    #[error("{0}")]
    NoPackets(String),
    #[error("{0}")]
    Other(String),
}

impl AnalyzeError {
    /// The engine could not read a file it was given (a Parquet file cut
    /// or with flipped bytes inside a page, past the checks on opening):
    /// bad input, exit 6, not a failure of the tool. Its message names
    /// the file.
    pub fn is_unreadable_file(&self) -> bool {
        let text = match self {
            AnalyzeError::Db(e) => e.to_string(),
            AnalyzeError::Query { what, .. } => what.clone(),
            _ => return false,
        };
        // DuckDB's Parquet reader says it in many ways ("Failed to read
        // file", "likely corrupted", "ZSTD Decompression failure", "don't
        // know what type"): an `Invalid Error` is its own (malformed data),
        // found by fuzzing run directories (tests/fuzz/fuzz_run_dirs.rs).
        let lower = text.to_ascii_lowercase();
        text.contains("Failed to read file")
            || lower.contains("corrupt")
            || text.contains("Invalid Error")
            || (text.contains("Invalid Input Error") && lower.contains("parquet"))
    }
}

pub type Result<T> = std::result::Result<T, AnalyzeError>;

/// An error reading `files` named as bad input in them when the engine
/// could not read one (its own message may name none: "Parquet file is
/// likely corrupted").
pub(crate) fn unreadable_in(files: &[PathBuf]) -> impl Fn(AnalyzeError) -> AnalyzeError + '_ {
    move |e| {
        if !e.is_unreadable_file() {
            return e;
        }
        AnalyzeError::Input {
            path: files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            what: format!("a file does not read whole: {e}"),
        }
    }
}

/// A step that takes this long is said on stderr as it ends (progress);
/// shorter ones are not: twenty lines of "prepared … in 0.00 s" hid what
/// mattered (issue 51).
pub const LONG_STEP: std::time::Duration = std::time::Duration::from_millis(500);

/// The memory DuckDB may use before it spills to disk, unless
/// `XLAP_MEMORY_LIMIT` says otherwise (DuckDB's syntax: `512MB`, `8GB`).
pub const DEFAULT_MEMORY_LIMIT: &str = "4GB";

/// An in-memory DuckDB for every analysis and correlation: its memory
/// bounded ([`DEFAULT_MEMORY_LIMIT`] or `XLAP_MEMORY_LIMIT`), spilling to
/// the system's temporary directory (`TMPDIR`) beyond it. Row order is
/// kept (the packets table is written in flow, kind, seq order); read-only
/// analyses may give it up.
///
/// No extension is installed or loaded behind the caller's back: what the
/// analyses need (Parquet) is built in, and a name from a run must not make
/// the recorder (root) fetch and load code. File access is the caller's to
/// narrow with [`confine`] once its own settings are made; the user's own
/// SQL (`xlap-trace sql`) keeps it.
pub fn engine() -> Result<duckdb::Connection> {
    let conn = duckdb::Connection::open_in_memory()?;
    // The Parquet footers cached (for this connection's life; a file whose
    // modification time changed is read again): the packets view is bound
    // again by every statement that reads it, and each binding parsed the
    // footer again (10 M packets, 757 MiB: the default analysis 1.94 ->
    // 1.70 s, `--query all` 7.6 -> 7.2 s).
    conn.execute_batch(
        "SET autoinstall_known_extensions = false; SET autoload_known_extensions = false;
         SET parquet_metadata_cache = true;",
    )?;
    let limit = std::env::var("XLAP_MEMORY_LIMIT").unwrap_or_else(|_| DEFAULT_MEMORY_LIMIT.into());
    conn.execute_batch(&format!(
        "SET memory_limit = {}; SET temp_directory = {};",
        sql::literal(&limit),
        sql::path(&spill_dir())
    ))
    .map_err(|e| AnalyzeError::Usage(format!("XLAP_MEMORY_LIMIT={limit}: {e}")))?;
    Ok(conn)
}

/// Where [`engine`] spills: a directory of this process's own.
fn spill_dir() -> PathBuf {
    std::env::temp_dir().join(format!("xlap-duckdb-{}", std::process::id()))
}

/// Confines `conn` to `dirs` (and its spill directory): no file elsewhere
/// can be read or written, whatever SQL it is given, and no setting can be
/// changed any more (the caller makes its own settings first). For the
/// commands that know what they read and write: a run directory read from
/// a CI artifact, and the correlation root runs at the end of `record`,
/// work on names that come from traced programs.
pub fn confine(conn: &duckdb::Connection, dirs: &[&Path]) -> Result<()> {
    let mut allowed: Vec<PathBuf> = dirs.iter().map(|d| absolute(d)).collect();
    allowed.push(spill_dir());
    // The list first: it cannot be changed once external access is off.
    conn.execute_batch(&format!(
        "SET allowed_directories = [{}]; SET enable_external_access = false; SET lock_configuration = true;",
        sql::paths(&allowed)
    ))?;
    Ok(())
}

/// `p` as an absolute path (lexically: symlinks and `..` kept). DuckDB
/// checks a file against the allowed directories by its spelling, `..`
/// folded but a relative path left relative: the engine's paths and the
/// allowed directories are both spelled absolute ([`sql::path`]).
pub(crate) fn absolute(p: &Path) -> PathBuf {
    let p = if p.as_os_str().is_empty() {
        Path::new(".")
    } else {
        p
    };
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this test's own under the system's temp dir.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xlap-engine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        std::fs::create_dir_all(dir.join("other")).unwrap();
        dir
    }

    fn count(conn: &duckdb::Connection, file: &Path) -> duckdb::Result<i64> {
        conn.query_row(
            &format!("SELECT count(*) FROM read_csv({})", sql::path(file)),
            [],
            |r| r.get(0),
        )
    }

    #[test]
    fn extensions_are_neither_installed_nor_loaded() {
        let conn = engine().unwrap();
        let (install, load): (bool, bool) = conn
            .query_row(
                "SELECT current_setting('autoinstall_known_extensions'), current_setting('autoload_known_extensions')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert!(!install && !load);
    }

    #[test]
    fn a_confined_engine_touches_nothing_outside_its_directories() {
        let root = scratch("confined");
        let (run, other) = (root.join("run"), root.join("other"));
        std::fs::write(run.join("a.csv"), "x\n1\n2\n").unwrap();
        std::fs::write(other.join("b.csv"), "x\n1\n").unwrap();
        let conn = engine().unwrap();
        // Unconfined it reads anywhere: what fails below fails by confine.
        assert_eq!(count(&conn, &other.join("b.csv")).unwrap(), 1);
        confine(&conn, &[&run]).unwrap();

        assert_eq!(count(&conn, &run.join("a.csv")).unwrap(), 2);
        for file in [
            other.join("b.csv"),
            run.join("../other/b.csv"),
            PathBuf::from("/etc/passwd"),
        ] {
            let e = count(&conn, &file).expect_err(&file.display().to_string());
            assert!(
                e.to_string().contains("ermission"),
                "{}: {e}",
                file.display()
            );
        }
        let copy = |file: &Path| {
            conn.execute_batch(&format!("COPY (SELECT 1 AS x) TO {};", sql::path(file)))
        };
        copy(&run.join("c.csv")).unwrap();
        assert!(copy(&other.join("c.csv")).is_err());
        assert!(!other.join("c.csv").exists());
        // Nothing undoes it, and the queries' own variables still work.
        for undo in [
            "SET enable_external_access = true;",
            "SET allowed_directories = ['/'];",
            "SET lock_configuration = false;",
            "RESET enable_external_access;",
        ] {
            assert!(conn.execute_batch(undo).is_err(), "{undo}");
        }
        assert!(count(&conn, &other.join("b.csv")).is_err());
        conn.execute_batch("SET VARIABLE kind = 1;").unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// `xlap-trace analyze .`: the current directory, spelled relative.
    #[test]
    fn a_confined_engine_takes_relative_paths_as_the_directory_they_lie_in() {
        let conn = engine().unwrap();
        confine(&conn, &[Path::new("")]).unwrap();
        let read = |file: &str| {
            conn.query_row(
                &format!("SELECT size FROM read_text({})", sql::path(Path::new(file))),
                [],
                |r| r.get::<_, i64>(0),
            )
        };
        // The crate's directory (cargo runs unit tests there), not its parent.
        assert!(read("Cargo.toml").unwrap() > 0);
        assert!(read("../../Cargo.toml").is_err());
    }
}
