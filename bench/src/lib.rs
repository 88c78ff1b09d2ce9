//! xlap-trace's benchmarks: the binaries in `src/bin`, each reporting
//! ratios measured side by side in one run (README: Performance), and the
//! scripts beside them (the bpftrace anchor, the pandas baseline, the
//! compare-verdict study).

pub mod args;
pub mod measure;
pub mod stamps;
pub mod start;
pub mod synth;

/// Writes a benchmark's results to `bench-results/NAME` (pretty JSON) and
/// says so.
pub fn write_results(name: &str, report: &serde_json::Value) -> anyhow::Result<()> {
    std::fs::create_dir_all("bench-results")?;
    let path = format!("bench-results/{name}");
    std::fs::write(&path, serde_json::to_string_pretty(report)? + "\n")?;
    println!("\nwrote {path}");
    Ok(())
}
