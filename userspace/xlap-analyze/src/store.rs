//! Computes the per-run aggregates of crate::stored and writes them beside
//! their packets file, on an engine that opened the packets as any
//! analysis does (crate::dataset): the one module that both opens a
//! dataset and writes the stored tables, so neither imports the other.

use crate::stored::{
    content_id, io_error, packets_id, path, statements_id, usable, CONTENT_KEY, PACKETS_KEY,
    STATEMENTS_KEY, TABLES,
};
use crate::{dataset, sql, AnalyzeError, Result};
use duckdb::Connection;
use std::path::Path;

/// Computes the stored tables of the packets file `packets` (just written)
/// and writes them beside it, on an engine confined to its directory.
pub fn store(packets: &Path) -> Result<()> {
    let conn = crate::engine()?;
    conn.execute_batch("SET preserve_insertion_order = false;")?;
    crate::confine(&conn, &[crate::layout::run_root(packets)])?;
    dataset::open_for_store(&conn, packets)?;
    write(&conn, packets)
}

/// Computes the stored tables of `packets` again when one is missing or
/// does not match it (made by another release, or from other packets);
/// whether it did. For the kept runs of `dataset add` and the benchmarks,
/// which would otherwise analyse them without their tables.
pub fn refresh(packets: &Path) -> Result<bool> {
    let conn = crate::engine()?;
    crate::confine(&conn, &[crate::layout::run_root(packets)])?;
    let found = usable(&conn, packets);
    if found.len() == TABLES.len() && found.iter().all(|(_, how)| how.is_ok()) {
        return Ok(false);
    }
    drop(conn);
    // None of the old ones stays beside the new (a link into another
    // run's directory is replaced, not written through).
    for t in TABLES {
        let _ = std::fs::remove_file(path(packets, t));
    }
    store(packets)?;
    Ok(true)
}

/// Writes the tables, already made in `conn` from `packets`, beside it.
fn write(conn: &Connection, packets: &Path) -> Result<()> {
    let id = packets_id(packets).map_err(|e| io_error(packets, e))?;
    for name in TABLES {
        let out = path(packets, name);
        let tmp = xlap_records::run_file::engine_target(&out).map_err(|e| io_error(&out, e))?;
        // The rows' digest is of the rows as Parquet gives them back (its
        // types, not the engine's), so the table goes through a file once
        // before the file that carries the digest.
        let rows = out.with_extension("parquet.rows");
        let _ = std::fs::remove_file(&rows); // a link left there, not followed
        conn.execute_batch(&format!(
            "COPY {name} TO {} (FORMAT PARQUET, COMPRESSION ZSTD);",
            sql::path(&rows)
        ))?;
        let content = content_id(conn, &rows);
        let copied = content.map_err(AnalyzeError::Other).and_then(|content| {
            conn.execute_batch(&format!(
                "COPY (FROM read_parquet({})) TO {} (FORMAT PARQUET, COMPRESSION ZSTD, KV_METADATA {{{}: {}, {}: {}, {}: {}}});",
                sql::path(&rows),
                sql::path(&tmp),
                sql::literal(PACKETS_KEY),
                sql::literal(&id),
                sql::literal(STATEMENTS_KEY),
                sql::literal(&statements_id()),
                sql::literal(CONTENT_KEY),
                sql::literal(&content),
            ))
            .map_err(AnalyzeError::from)
        });
        let _ = std::fs::remove_file(&rows);
        copied?;
        std::fs::rename(&tmp, &out).map_err(|e| io_error(&out, e))?;
    }
    Ok(())
}
