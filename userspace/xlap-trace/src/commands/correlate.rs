//! `correlate`, `dataset add` and `recover`: a run's stamps joined into
//! packets, runs laid out as a partitioned dataset, and runs whose recorder
//! died made whole.

use crate::cli::{CorrelateArgs, DatasetAddArgs, RecoverArgs};
use anyhow::Result;
use xlap_analyze::finish::{correlate_dirs, print_correlation};
use xlap_capture::recover;
use xlap_records::RunDir;

pub fn correlate(a: &CorrelateArgs) -> Result<()> {
    let dirs: Vec<RunDir> = a.runs.iter().map(RunDir::new).collect();
    let result = correlate_dirs(&dirs, &a.output, a.deadline_ms)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print_correlation(&result, &crate::confine::shown(&a.output));
    }
    Ok(())
}

pub fn dataset_add(a: &DatasetAddArgs) -> Result<()> {
    let mut added = Vec::new();
    for (i, run) in a.runs.iter().enumerate() {
        if !a.json {
            eprintln!(
                "xlap-trace: adding {} ({}/{})",
                run.display(),
                i + 1,
                a.runs.len()
            );
        }
        let r = xlap_analyze::partitioned::add(run, &a.output, a.replace)?;
        if !a.json {
            println!(
                "{}: run {} ({} packets, {} recording{}){}: {} files linked, {} copied",
                r.dir.display(),
                r.run_id,
                r.packets,
                r.recorders.len(),
                if r.recorders.len() == 1 { "" } else { "s" },
                if r.replaced { ", replaced" } else { "" },
                r.linked,
                r.copied
            );
        }
        added.push(r);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&added)?);
    }
    Ok(())
}

pub fn recover(a: &RecoverArgs) -> Result<()> {
    for dir in a.runs.iter().flat_map(|d| recover::runs_named(d)) {
        match recover::recover(&dir)? {
            Some(r) => recover::report(&r),
            None => println!(
                "{}: nothing to recover (the run ended)",
                dir.path().display()
            ),
        }
    }
    Ok(())
}
