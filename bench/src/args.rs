//! Options shared by the benchmark binaries (`xlap-bench*`).

use anyhow::{Context, Result};
use std::path::PathBuf;

/// The value after option `name` (`--name VALUE`), if given; a value that
/// does not parse is an error.
pub fn arg_value<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == name) else {
        return Ok(None);
    };
    let v = args
        .get(i + 1)
        .with_context(|| format!("{name} needs a value"))?;
    v.parse()
        .map(Some)
        .map_err(|_| anyhow::anyhow!("{name} {v:?}: not a valid value"))
}

/// `--baseline PATH`: an `xlap-trace` binary (an older build) to compare
/// with, side by side in the same run.
pub fn baseline_binary() -> Result<Option<PathBuf>> {
    let Some(path) = arg_value::<PathBuf>("--baseline")? else {
        return Ok(None);
    };
    anyhow::ensure!(
        path.is_file(),
        "--baseline {}: no such file (build the baseline's xlap-trace first)",
        path.display()
    );
    Ok(Some(path))
}
