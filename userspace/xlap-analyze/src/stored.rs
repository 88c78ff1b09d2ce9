//! Per-run aggregates kept beside a packets file (this module names and
//! checks them and reads them back; crate::store computes and writes them): the shared tables of
//! `queries/views.sql` that cost a full pass over the packets each
//! (`stage_counts`, `stage_moments`: together two thirds of a default
//! analysis of 10 M packets, which every analysis reads; `send_schedule`:
//! a sort of the packets, two thirds of `activation`), computed once when the
//! packets are written (`record`, `correlate`, `synth`) and read back by
//! every later analysis of the same file instead of scanning it again.
//!
//! A stored table is used only when it was computed from these very
//! packets by these very statements: its Parquet metadata names the
//! packets file (its size and a hash of its footer, which holds every
//! column chunk's offsets and statistics) and the statements (a hash of
//! the code of the `views.sql` statements that make them, comments left
//! out, and this crate's version), and its own rows (their count and the
//! sum of their hashes, checked as it is read). Anything else (a file of an
//! older release, packets rewritten by a later `correlate`, a file that
//! does not read) is ignored, said when progress is shown, and the table
//! computed from the packets as before. Only the default view of the
//! packets uses them: `--e2e xlap` and `--inliers` change what the tables
//! hold.

use crate::{sql, AnalyzeError};
use duckdb::Connection;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The shared tables kept beside a packets file.
pub const TABLES: &[&str] = &["stage_counts", "stage_moments", "send_schedule"];

/// Metadata keys of a stored table.
pub(crate) const PACKETS_KEY: &str = "xlap.packets";
pub(crate) const STATEMENTS_KEY: &str = "xlap.statements";
/// The table's own rows: their count and the sum of their hashes. The
/// other two keys name where the rows came from, not what they are: a
/// table edited by hand with its keys kept was trusted (counts 1 740 000
/// for 1 740).
pub(crate) const CONTENT_KEY: &str = "xlap.content";

/// The bytes of a packets file's end hashed: its Parquet footer (the
/// metadata of every row group and column chunk) lies there.
const FOOTER_BYTES: u64 = 64 * 1024;

/// Where table `name` of `packets` is kept: `RUN/packets.parquet` →
/// `RUN/packets.stage_counts.parquet`.
pub fn path(packets: &Path, name: &str) -> PathBuf {
    packets.with_extension(format!("{name}.parquet"))
}

/// FNV-1a, 64 bits: stable across releases and platforms (the standard
/// library's hasher is not), enough to tell files and statements apart.
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Names the packets file's content: its size and the hash of its footer.
pub(crate) fn packets_id(packets: &Path) -> std::io::Result<String> {
    let mut f = xlap_records::run_file::open(packets)?;
    let size = f.metadata()?.len();
    let from = size.saturating_sub(FOOTER_BYTES);
    f.seek(SeekFrom::Start(from))?;
    let mut tail = Vec::with_capacity((size - from) as usize);
    f.read_to_end(&mut tail)?;
    Ok(format!("{size}:{:016x}", fnv1a(&tail, FNV_OFFSET)))
}

/// What the tables hold beyond `views.sql`'s text: the `packets` view and
/// `stage_columns` that `dataset` makes. Raise it when those change, so that
/// tables stored before are computed again.
const FORMAT: u32 = 2;

/// Names the statements that make the tables: those of `views.sql` up to
/// the last stored table, not the whole file.
pub(crate) fn statements_id() -> String {
    let hash = code_hash(&crate::views::statements_making(TABLES));
    format!("{}:{FORMAT}:{hash:016x}", env!("CARGO_PKG_VERSION"))
}

/// The hash of the statements' code, their comment and blank lines left
/// out: a comment reworded leaves every run's stored tables valid.
fn code_hash(statements: &[&str]) -> u64 {
    statements
        .iter()
        .flat_map(|s| s.lines())
        .filter(|l| crate::views::is_code(l))
        .fold(FNV_OFFSET, |h, l| fnv1a(b"\n", fnv1a(l.as_bytes(), h)))
}

/// A table file's rows: their count and the sum of their hashes (order
/// free: the engine writes them in any order), the file's own columns only
/// (a dataset's path says `run_id=…`, which the engine would add).
pub(crate) fn content_id(conn: &Connection, file: &Path) -> std::result::Result<String, String> {
    conn.query_row(
        &format!(
            "SELECT count(*)::VARCHAR || ':' || coalesce(sum(hash(t)::HUGEINT), 0)::VARCHAR
             FROM read_parquet({}, hive_partitioning = false) t",
            sql::path(file)
        ),
        [],
        |r| r.get(0),
    )
    .map_err(|e| e.to_string())
}

/// Whether `file`'s rows are those its content key names.
fn rows_match(
    conn: &Connection,
    file: &Path,
    key: Option<&str>,
) -> std::result::Result<(), String> {
    if key == Some(content_id(conn, file)?.as_str()) {
        Ok(())
    } else {
        Err("its rows are not those its key names: edited after it was written".into())
    }
}

pub(crate) fn io_error(path: &Path, e: std::io::Error) -> AnalyzeError {
    AnalyzeError::Input {
        path: path.display().to_string(),
        what: e.to_string(),
    }
}

/// The stored tables beside `packets`, by name: for each, what the
/// statement that makes it reads instead (`FROM read_parquet(...)`), or
/// why the file is left aside. A table without a file is not listed.
pub fn usable(
    conn: &Connection,
    packets: &Path,
) -> Vec<(&'static str, std::result::Result<String, String>)> {
    let Ok(id) = packets_id(packets) else {
        return Vec::new();
    };
    TABLES
        .iter()
        .filter(|name| path(packets, name).is_file())
        .map(|name| (*name, check(conn, &path(packets, name), &id)))
        .collect()
}

/// Whether `file` was computed from the packets named `id` by these
/// statements.
fn check(conn: &Connection, file: &Path, id: &str) -> std::result::Result<String, String> {
    let meta = |key: &str| -> std::result::Result<Option<String>, String> {
        conn.query_row(
            &format!(
                "SELECT decode(value) FROM parquet_kv_metadata({}) WHERE decode(key) = ?",
                sql::path(file)
            ),
            [key],
            |r| r.get(0),
        )
        .map(Some)
        .or_else(|e| match e {
            duckdb::Error::QueryReturnedNoRows => Ok(None),
            e => Err(e.to_string()),
        })
    };
    verdict(
        meta(PACKETS_KEY)?.as_deref(),
        meta(STATEMENTS_KEY)?.as_deref(),
        id,
    )?;
    rows_match(conn, file, meta(CONTENT_KEY)?.as_deref())?;
    Ok(format!("FROM read_parquet({})", sql::path(file)))
}

/// Whether a stored table's metadata (its packets and statements keys)
/// says it was computed from the packets named `id` by these statements.
fn verdict(
    packets: Option<&str>,
    statements: Option<&str>,
    id: &str,
) -> std::result::Result<(), String> {
    if packets != Some(id) {
        return Err("computed from other packets".into());
    }
    if statements != Some(statements_id().as_str()) {
        return Err("made by another version of xlap-trace or of its queries/views.sql".into());
    }
    Ok(())
}

/// For a dataset of runs (`packets`: each run's packets file), the
/// statement tables of the whole population can take from the runs'
/// stored tables: `stage_value_counts` as the sum of every run's
/// `stage_counts` (value counts add up; the moments do not: their trends
/// and correlations span the whole population, and are computed from the
/// packets), and `send_schedule` as every run's own rows (a schedule is
/// per run already), with the run id from the partition as the packets
/// view takes it. Each given only when every run's table matches its
/// packets (the reason otherwise); all files' metadata is read by one
/// query.
pub fn merged(
    conn: &Connection,
    packets: &[PathBuf],
) -> Vec<(&'static str, std::result::Result<String, String>)> {
    let counts = matching(conn, packets, "stage_counts").map(|list| {
        format!(
            "SELECT c.col, s.kind, s.ns, sum(s.n)::BIGINT AS n
             FROM read_parquet([{list}]) s JOIN stage_columns c USING (stage) GROUP BY ALL"
        )
    });
    let schedule = matching(conn, packets, "send_schedule").map(|list| {
        format!(
            "SELECT run_id AS run, * EXCLUDE (run, run_id)
             FROM read_parquet([{list}], hive_partitioning = true)"
        )
    });
    vec![("stage_value_counts", counts), ("send_schedule", schedule)]
}

/// The runs' stored table `name` as a list of files for `read_parquet`,
/// when each matches its run's packets.
fn matching(
    conn: &Connection,
    packets: &[PathBuf],
    name: &str,
) -> std::result::Result<String, String> {
    let files: Vec<PathBuf> = packets.iter().map(|p| path(p, name)).collect();
    if let Some(missing) = files.iter().find(|f| !f.is_file()) {
        return Err(format!("{} is missing", missing.display()));
    }
    let list = sql::paths(&files);
    let mut stmt = conn
        .prepare(&format!(
            "SELECT file_name, decode(key), decode(value) FROM parquet_kv_metadata([{list}])
             WHERE decode(key) IN ({}, {}, {})",
            sql::literal(PACKETS_KEY),
            sql::literal(STATEMENTS_KEY),
            sql::literal(CONTENT_KEY)
        ))
        .map_err(|e| e.to_string())?;
    let mut meta = std::collections::HashMap::new();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .map_err(|e| e.to_string())?;
    for row in rows {
        let (file, key, value) = row.map_err(|e| e.to_string())?;
        meta.insert((file, key), value);
    }
    for (file, packets) in files.iter().zip(packets) {
        let id = packets_id(packets).map_err(|e| format!("{}: {e}", packets.display()))?;
        // The engine names each file as the list gave it: absolute.
        let name = crate::absolute(file).display().to_string();
        let get = |key: &str| {
            meta.get(&(name.clone(), key.to_string()))
                .map(String::as_str)
        };
        verdict(get(PACKETS_KEY), get(STATEMENTS_KEY), &id)
            .and_then(|()| rows_match(conn, file, get(CONTENT_KEY)))
            .map_err(|why| format!("{}: {why}", file.display()))?;
    }
    Ok(list)
}

/// The statement that makes table `name` from its stored file (`from`, as
/// [`usable`] or [`merged`] gives it), in views.sql's own form (a view where
/// the caller makes views of the tables).
pub fn load_statement(name: &str, from: &str) -> String {
    format!("CREATE OR REPLACE TEMP TABLE {name} AS {from};")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_tables_are_named_by_the_statements_that_make_them_only() {
        let names: Vec<&str> = crate::views::statements_making(TABLES)
            .iter()
            .filter_map(|s| crate::views::statement_name(s))
            .collect();
        for t in TABLES {
            assert!(names.contains(t), "{t} not among {names:?}");
        }
        // the outliers after them may change without making every run's
        // stored tables stale
        assert!(!names.iter().any(|n| n.starts_with("late")), "{names:?}");
    }

    #[test]
    fn a_comment_reworded_keeps_the_stored_tables_and_code_changed_does_not() {
        let code = "-- the counts\nCREATE TABLE t AS\nSELECT 1; -- one\n";
        let base = code_hash(&[code, "SELECT 2;\n"]);
        let reworded =
            "-- the counts, per kind\n  -- a second line\n\nCREATE TABLE t AS\nSELECT 1; -- one\n";
        assert_eq!(code_hash(&[reworded, "SELECT 2;\n"]), base);
        for changed in [
            "-- the counts\nCREATE TABLE t AS\nSELECT 2; -- one\n",
            "-- the counts\nCREATE TABLE t AS\nSELECT 1; -- two\n",
            "-- the counts\nCREATE TABLE t AS SELECT 1; -- one\n",
        ] {
            assert_ne!(code_hash(&[changed, "SELECT 2;\n"]), base, "{changed}");
        }
    }

    #[test]
    fn fnv1a_is_the_published_function() {
        // Test vectors of FNV-1a 64 (Fowler, Noll, Vo).
        assert_eq!(fnv1a(b"", FNV_OFFSET), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a", FNV_OFFSET), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar", FNV_OFFSET), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn stored_tables_sit_beside_their_packets() {
        assert_eq!(
            path(Path::new("run/packets.parquet"), "stage_counts"),
            Path::new("run/packets.stage_counts.parquet")
        );
    }
}
