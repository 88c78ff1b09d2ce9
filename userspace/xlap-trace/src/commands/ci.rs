//! The CI workflow's commands: `summary`, `compare` and `history`.

use crate::cli;
use anyhow::Result;
use std::process::ExitCode;
use xlap_analyze::summary::Summary;
use xlap_exit::{failure, Code};

pub fn summary(a: &cli::SummaryArgs) -> Result<()> {
    let parts = a
        .runs
        .iter()
        .map(|r| Summary::load(r))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let summary = if parts.len() == 1 {
        parts.into_iter().next().expect("one")
    } else {
        Summary::pool(&parts)?
    };
    let out = match (&a.output, a.runs.as_slice()) {
        (Some(o), _) => o.clone(),
        (None, [one]) if one.is_dir() => xlap_records::RunDir::new(one).summary(),
        _ => {
            return Err(failure(
                Code::Usage,
                "several runs pool into one summary: name the file with -o FILE",
            ))
        }
    };
    summary.write(&out)?;
    println!(
        "wrote {} ({} run{}, {} stage distributions)",
        out.display(),
        summary.runs.len(),
        if summary.runs.len() == 1 { "" } else { "s" },
        summary.stages.len()
    );
    Ok(())
}

/// `compare`: 0 no regression, 1 regression, 2 error (usage and input
/// errors keep their own codes: 2 and 6).
pub fn compare(a: &cli::CompareArgs) -> Result<ExitCode> {
    use xlap_ci::{compare, render, stats::Verdict};
    if !(0.5..1.0).contains(&a.confidence) {
        return Err(failure(Code::Usage, "--confidence must lie in [0.5, 1)"));
    }
    let base = Summary::load(&a.baseline)?;
    let mut cand = Summary::load(&a.candidate)?;
    if xlap_records::RunDir::new(&a.candidate).packets().exists() {
        // Measured on the baseline's stages (see add_stages_of).
        let names: Vec<String> = base.stages.iter().map(|s| s.stage.clone()).collect();
        cand.add_stages_of(&a.candidate, &names)?;
    }
    let th = compare::Thresholds {
        max_regression: a.max_regression,
        min_change_ns: a.min_change,
        confidence: a.confidence,
    };
    let c = compare::compare(&base, &cand, &a.metrics, th)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else if a.markdown {
        print!("{}", render::markdown(&c));
    } else {
        print!("{}", render::table(&c));
    }
    if let Some(path) = &a.junit {
        std::fs::write(path, render::junit(&c))?;
    }
    Ok(if c.verdict == Verdict::Regression {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

pub fn history(a: &cli::HistoryArgs) -> Result<()> {
    use xlap_ci::history;
    // A dataset stands for its runs, oldest first.
    let paths: Vec<std::path::PathBuf> = a
        .runs
        .iter()
        .flat_map(|r| match xlap_analyze::partitioned::runs_by_start(r) {
            runs if runs.is_empty() => vec![r.clone()],
            runs => runs,
        })
        .collect();
    let runs = paths
        .iter()
        .map(|r| Summary::load(r))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let series = history::series(&runs, &a.metrics);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&series)?);
    } else {
        print!("{}", history::markdown(&runs, &series));
    }
    if let Some(path) = &a.svg {
        std::fs::write(path, history::svg(&series, runs.len(), a.top))?;
    }
    Ok(())
}
