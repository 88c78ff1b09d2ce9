//! `correlate` and `recover`: a run's stamps joined into packets, and runs
//! whose recorder died made whole.

use crate::cli::{CorrelateArgs, RecoverArgs};
use anyhow::Result;
use std::path::Path;
use xlap_analyze::finish::{correlate_dirs, print_correlation};
use xlap_capture::recover;

pub fn correlate(a: &CorrelateArgs) -> Result<()> {
    let dirs: Vec<&Path> = a.runs.iter().map(|p| p.as_path()).collect();
    let result = correlate_dirs(&dirs, &a.output, a.deadline_ms)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print_correlation(&result, &a.output);
    }
    Ok(())
}

pub fn recover(a: &RecoverArgs) -> Result<()> {
    for dir in a.runs.iter().flat_map(|d| recover::runs_named(d)) {
        match recover::recover(&dir)? {
            Some(r) => recover::report(&r),
            None => println!("{}: nothing to recover (the run ended)", dir.display()),
        }
    }
    Ok(())
}
