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
pub mod format;
pub mod packets_table;
pub mod perfetto;
pub mod queries;
pub mod report;
pub mod runs;
pub mod synth;

pub use correlate::{correlate, CorrelateOptions, Correlation};
pub use runs::Run;

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
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, AnalyzeError>;

/// The memory DuckDB may use before it spills to disk, unless
/// `XLAP_MEMORY_LIMIT` says otherwise (DuckDB's syntax: `512MB`, `8GB`).
pub const DEFAULT_MEMORY_LIMIT: &str = "4GB";

/// An in-memory DuckDB for every analysis and correlation: its memory
/// bounded ([`DEFAULT_MEMORY_LIMIT`] or `XLAP_MEMORY_LIMIT`), spilling to
/// the system's temporary directory (`TMPDIR`) beyond it. Row order is
/// kept (the packets table is written in flow, kind, seq order); read-only
/// analyses may give it up.
pub fn engine() -> Result<duckdb::Connection> {
    let conn = duckdb::Connection::open_in_memory()?;
    let limit = std::env::var("XLAP_MEMORY_LIMIT").unwrap_or_else(|_| DEFAULT_MEMORY_LIMIT.into());
    let spill = std::env::temp_dir().join(format!("xlap-duckdb-{}", std::process::id()));
    conn.execute_batch(&format!(
        "SET memory_limit = '{}'; SET temp_directory = '{}';",
        limit.replace('\'', ""),
        spill.display().to_string().replace('\'', "''")
    ))
    .map_err(|e| AnalyzeError::Usage(format!("XLAP_MEMORY_LIMIT={limit}: {e}")))?;
    Ok(conn)
}
