//! Decoded stamps, the stamp-point vocabulary, the Arrow schema of what
//! xlap-trace writes, writers for it, and `run.json` (typed, written and
//! read through one declaration). Pure Rust: testable without root.

pub mod cgroups;
pub mod escape;
pub mod kinds;
pub mod parquet_check;
pub mod peer_stamps;
pub mod points;
pub mod run_dir;
pub mod run_file;
pub mod run_meta;
pub mod sample;
pub mod schema;
pub mod stages;
pub mod stamp;
pub mod stamp_counts;
pub mod strict_json;
pub mod tracer_cost;
pub mod writer;

pub use points::{Layer, PointInfo, Side};
pub use run_dir::RunDir;
pub use stamp::Stamp;
