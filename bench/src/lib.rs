//! xlap-trace's benchmarks: the binaries in `src/bin`, each reporting
//! ratios measured side by side in one run (README: Performance), and the
//! scripts beside them (the bpftrace anchor, the pandas baseline, the
//! compare-verdict study).

pub mod args;
pub mod measure;
pub mod stamps;
pub mod start;
pub mod synth;
