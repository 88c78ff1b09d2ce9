//! The CI workflow: a run's compact summary, and the comparison of two
//! (a baseline and a candidate) with statistical verdicts.

pub mod compare;
pub mod render;
pub mod stats;
pub mod summary;
