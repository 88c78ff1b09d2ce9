//! The confinement of the commands that parse what traced programs or a
//! run directory from elsewhere control (xlap-sandbox): no capabilities,
//! no_new_privs, and files only where the command reads and writes.

use anyhow::{anyhow, Result};
use std::path::Path;

/// Confines this process to run directory `run` (read and written) and
/// the system's read-only files. DuckDB spills beneath the run, the one
/// place it may write. Without Landlock the process still drops every
/// capability, and says once what it lacks (unless `quiet`).
pub fn to_run(run: &Path, quiet: bool) -> Result<()> {
    // Still one thread (apply checks): no other thread reads the
    // environment while it changes.
    std::env::set_var("TMPDIR", run);
    let confined = xlap_sandbox::Policy::new()
        .write(run)
        .apply()
        .map_err(|e| anyhow!("cannot confine the analysis of {}: {e}", run.display()))?;
    if let (Some(shortfall), false) = (confined.shortfall(), quiet) {
        eprintln!("xlap-trace: note: {shortfall}");
    }
    Ok(())
}
