//! The CI workflow: a run's compact summary, and the comparison of two
//! (a baseline and a candidate) with statistical verdicts, and their
//! history over a series of runs.

pub mod compare;
pub mod history;
pub mod render;
pub mod stats;
/// The summaries this crate compares (written by the analysis crate).
pub use xlap_analyze::summary;
