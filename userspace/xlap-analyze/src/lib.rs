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
