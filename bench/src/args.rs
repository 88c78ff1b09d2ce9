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

/// Checks the command line of a benchmark before it starts any work:
/// `--help` (or `-h`) prints `usage` and exits; an argument that is none of
/// `flags` (no value) or `options` (`--name VALUE`) is refused with the
/// usage. A benchmark runs for minutes and writes gigabytes of runs, so a
/// mistyped option must not start one with the defaults.
pub fn check(usage: &str, flags: &[&str], options: &[&str]) -> Result<()> {
    check_args(std::env::args().skip(1), usage, flags, options)
}

fn check_args(
    args: impl IntoIterator<Item = String>,
    usage: &str,
    flags: &[&str],
    options: &[&str],
) -> Result<()> {
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            println!("{usage}");
            std::process::exit(0);
        }
        if flags.contains(&a.as_str()) {
            continue;
        }
        if options.contains(&a.as_str()) {
            anyhow::ensure!(args.next().is_some(), "{a} needs a value\n{usage}");
            continue;
        }
        anyhow::bail!("unknown argument {a:?}\n{usage}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_args;

    fn check(args: &[&str]) -> anyhow::Result<()> {
        check_args(
            args.iter().map(|s| s.to_string()),
            "usage: b [--quick] [--rounds N]",
            &["--quick"],
            &["--rounds"],
        )
    }

    #[test]
    fn known_flags_and_options_with_values_pass() {
        check(&[]).unwrap();
        check(&["--quick", "--rounds", "3"]).unwrap();
    }

    #[test]
    fn an_unknown_argument_or_a_missing_value_is_refused_with_the_usage() {
        let e = check(&["--round", "3"]).unwrap_err().to_string();
        assert!(
            e.contains("unknown argument \"--round\"") && e.contains("usage: b"),
            "{e}"
        );
        let e = check(&["--rounds"]).unwrap_err().to_string();
        assert!(e.contains("--rounds needs a value"), "{e}");
    }
}
