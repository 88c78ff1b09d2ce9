//! `just bench-analysis`, interleaved rounds in one session on the same
//! synthetic Parquet run, wall time and peak memory side by side:
//! - the default analysis (`xlap-trace analyze RUN`) against the same set
//!   written in polars (`bench/xlap_polars.py`), with the run's stored
//!   aggregates (as `record`, `correlate` and `synth` leave them) and
//!   without (computed from the packets, as for a run of an older release);
//! - the whole bundled query set (`--query all`) against a pandas
//!   re-implementation of X-LAP's notebook analyses (`bench/xlap_pandas.py`);
//! - `xlap-trace synth` itself, once (the run is kept between sessions);
//! - a CI history of many runs (`--history-runs`, 500): `history` and a
//!   per-run `sql` query over a dataset of them (`dataset add`, built once
//!   and kept), against `history` over the same runs' directories, each
//!   opened (as before datasets kept summaries);
//! - a dataset of `--big-runs` runs of the same size (10: 100 M packets;
//!   the run above and `synth` seeds 2..), built once and kept, analysed
//!   as one population under the engine's memory limit (out of core):
//!   the default set every round, `--query all` once.
//!
//! Every side's results are compared (e2e median per kind, top outlier
//! cause) so they are seen to do the same work.
//!
//! Usage: xlap-bench-analysis [--packets N] [--rounds R] [--python PATH]
//! [--history-runs N] [--big-runs N] [--quick]. Prints Markdown, writes `bench-results/analysis.json`.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use xlap_bench::measure::{measure, median, Measured};
use xlap_bench::synth::{fresh_aggregates, packets_of};
use xlap_tests::bin;

/// The value of `--name VALUE`, `default` when absent; a bad value is an error.
fn arg<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    Ok(xlap_bench::args::arg_value(name)?.unwrap_or(default))
}

/// `runs` small synthetic runs (2000 packets each, seeds 1..) and a
/// dataset of them, generated once and kept in bench-results/.
fn history_runs(runs: u32) -> Result<(Vec<PathBuf>, PathBuf)> {
    let base = PathBuf::from(format!("bench-results/history-{runs}"));
    let dirs: Vec<PathBuf> = (1..=runs).map(|i| base.join(format!("r{i:04}"))).collect();
    let ds = base.join("dataset");
    let made = base.join("complete");
    if made.exists() {
        fresh_aggregates(&packets_of(&dirs))?;
        return Ok((dirs, ds));
    }
    let _ = std::fs::remove_dir_all(&base);
    eprintln!(
        "generating {runs} runs of 2000 packets and their dataset in {}",
        base.display()
    );
    for (i, dir) in dirs.iter().enumerate() {
        if i % 50 == 0 {
            eprintln!("  run {}/{runs}", i + 1);
        }
        let out = Command::new(bin("xlap-trace"))
            .args([
                "synth",
                "--packets",
                "2000",
                "--seed",
                &(i + 1).to_string(),
                "-o",
            ])
            .arg(dir)
            .output()?;
        if !out.status.success() {
            bail!("synth: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    dataset_add(&ds, &dirs, &made)?;
    Ok((dirs, ds))
}

/// Adds `runs` to dataset `ds` (measured), then writes `made`: what was
/// built is complete and is kept for the next sessions.
fn dataset_add(ds: &Path, runs: &[PathBuf], made: &Path) -> Result<()> {
    let m = measure(
        Command::new(bin("xlap-trace"))
            .args(["dataset", "add", "-o"])
            .arg(ds)
            .args(runs),
    )?;
    eprintln!(
        "  dataset add: {:.1} s, {:.0} MiB",
        m.seconds, m.peak_rss_mib
    );
    std::fs::write(made, format!("{}\n", m.seconds))?;
    Ok(())
}

/// A dataset of `runs` runs of `packets` packets: `first` (the run the
/// other sides read) and `synth` seeds 2.., built once and kept in
/// bench-results/ (the runs are linked into it, not copied).
fn big_dataset(first: &Path, packets: u64, runs: u32) -> Result<PathBuf> {
    let base = PathBuf::from(format!("bench-results/big-{runs}x{packets}"));
    let ds = base.join("dataset");
    let made = base.join("complete");
    if made.exists() {
        let parts = std::fs::read_dir(&ds)?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<Vec<_>>>()?;
        let packets: Vec<PathBuf> = packets_of(&parts)
            .into_iter()
            .filter(|p| p.is_file())
            .collect();
        fresh_aggregates(&packets)?;
        return Ok(ds);
    }
    let _ = std::fs::remove_dir_all(&base);
    eprintln!(
        "generating {} more runs of {packets} packets and a dataset of {runs} in {}",
        runs - 1,
        base.display()
    );
    let mut dirs = vec![first.to_path_buf()];
    for seed in 2..=runs {
        let dir = base.join(format!("s{seed}"));
        let m = measure(&mut xlap_bench::synth::synth_command(packets, seed, &dir))?;
        eprintln!("  run {seed}/{runs}: synth {:.1} s", m.seconds);
        dirs.push(dir);
    }
    dataset_add(&ds, &dirs, &made)?;
    Ok(ds)
}

/// The same run without its stored aggregates: its packets and run.json
/// linked into a directory of their own.
fn bare_copy(run: &Path) -> Result<PathBuf> {
    let bare = run.with_file_name(format!(
        "{}-bare",
        run.file_name().unwrap_or_default().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&bare);
    std::fs::create_dir_all(&bare)?;
    for f in ["packets.parquet", "run.json"] {
        std::fs::hard_link(run.join(f), bare.join(f))?;
    }
    Ok(bare)
}

/// The e2e median per kind and the top outlier cause per kind of the
/// default analysis' JSON, as the anchors print them.
fn headline(a: &Value) -> (Value, Value) {
    let mut median = serde_json::Map::new();
    for row in a["jitter"].as_array().into_iter().flatten() {
        if row["stage"] == "e2e" {
            median.insert(row["kind"].to_string(), row["median_ns"].clone());
        }
    }
    let mut top = serde_json::Map::new();
    for row in a["outlier_causes"].as_array().into_iter().flatten() {
        top.entry(row["kind"].to_string())
            .or_insert_with(|| row["cause"].clone());
    }
    (Value::Object(median), Value::Object(top))
}

/// Whether an anchor's results are xlap-trace's (numbers as numbers).
fn same_results(name: &str, ours: &(Value, Value), theirs: &Value) -> bool {
    let mut agree = true;
    for (k, v) in ours.0.as_object().into_iter().flatten() {
        let t = &theirs["e2e_median"][k];
        if v.as_f64() != t.as_f64() {
            eprintln!("e2e median of kind {k} differs: xlap-trace {v}, {name} {t}");
            agree = false;
        }
    }
    for (k, v) in ours.1.as_object().into_iter().flatten() {
        let t = &theirs["top_cause"][k];
        if v != t {
            eprintln!("top cause of kind {k} differs: xlap-trace {v}, {name} {t}");
            agree = false;
        }
    }
    agree
}

/// One side of the benchmark: what it runs, and its measured rounds.
struct Side {
    name: &'static str,
    cmd: Box<dyn Fn() -> Command>,
    rounds: Vec<(f64, f64)>,
    last: Option<Measured>,
}

impl Side {
    fn new(name: &'static str, cmd: impl Fn() -> Command + 'static) -> Self {
        Side {
            name,
            cmd: Box::new(cmd),
            rounds: Vec::new(),
            last: None,
        }
    }

    fn run(&mut self) -> Result<()> {
        eprintln!("  {}", self.name);
        let m = measure(&mut (self.cmd)())?;
        eprintln!("    {:.2} s, {:.0} MiB", m.seconds, m.peak_rss_mib);
        self.rounds.push((m.seconds, m.peak_rss_mib));
        self.last = Some(m);
        Ok(())
    }

    /// The side's row of a Markdown table: name, median, every round, peak.
    fn row(&self) -> String {
        let all_s: Vec<f64> = self.rounds.iter().map(|r| r.0).collect();
        format!(
            "| {} | {:.2} | {all_s:.2?} | {:.0} |",
            self.name,
            self.median_s(),
            self.peak_mib()
        )
    }

    fn median_s(&self) -> f64 {
        median(&mut self.rounds.iter().map(|r| r.0).collect::<Vec<_>>())
    }

    fn peak_mib(&self) -> f64 {
        self.rounds.iter().map(|r| r.1).fold(0.0, f64::max)
    }

    fn stdout_json(&self) -> Result<Value> {
        let out = self.last.as_ref().map(|m| m.stdout.trim()).unwrap_or("");
        serde_json::from_str(out).with_context(|| format!("{}: its output is not JSON", self.name))
    }

    fn json(&self) -> Value {
        let seconds: Vec<f64> = self.rounds.iter().map(|r| r.0).collect();
        json!({"seconds": seconds, "median_s": self.median_s(), "peak_rss_mib": self.peak_mib()})
    }
}

fn main() -> Result<()> {
    xlap_bench::args::check(
        "usage: xlap-bench-analysis [--quick] [--packets N] [--rounds R] [--python PATH] [--history-runs N] [--big-runs N]\nThe analyses of a synthetic run against pandas and polars (docs/performance.md); prints Markdown, writes bench-results/analysis.json.",
        &["--quick"],
        &["--packets", "--rounds", "--python", "--history-runs", "--big-runs"],
    )?;
    let quick = std::env::args().any(|a| a == "--quick");
    let packets: u64 = arg("--packets", if quick { 1_000_000 } else { 10_000_000 })?;
    let rounds: usize = arg("--rounds", if quick { 1 } else { 3 })?.max(1);
    let python: String = arg("--python", "python3".to_string())?;
    let history_n: u32 = arg("--history-runs", if quick { 50 } else { 500 })?;
    let big_n: u32 = arg("--big-runs", if quick { 2 } else { 10 })?;
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (run, synth_s) = xlap_bench::synth::run(packets, 1)?;
    let bare = bare_copy(&run)?;
    let size_mib = std::fs::metadata(run.join("packets.parquet"))?.len() as f64 / 1048576.0;
    println!("## Analysis: {packets} packets ({size_mib:.0} MiB of Parquet), {rounds} interleaved rounds\n");

    let analyze = |dir: &Path, all: bool| {
        let dir = dir.to_path_buf();
        move || {
            let mut c = Command::new(bin("xlap-trace"));
            c.arg("analyze").arg(&dir).args(["--format", "json"]);
            if all {
                c.args(["--query", "all"]);
            }
            c
        }
    };
    let script = |name: &str| {
        let (python, script, run) = (python.clone(), here.join(name), run.clone());
        move || {
            let mut c = Command::new(&python);
            c.arg(&script).arg(&run);
            c
        }
    };
    let mut sides = [
        Side::new("xlap-trace analyze (default set)", analyze(&run, false)),
        Side::new(
            "xlap-trace analyze (default set), no stored aggregates",
            analyze(&bare, false),
        ),
        Side::new(
            "polars, the default set (bench/xlap_polars.py)",
            script("xlap_polars.py"),
        ),
        Side::new("xlap-trace analyze --query all", analyze(&run, true)),
        Side::new(
            "pandas, X-LAP notebook style (bench/xlap_pandas.py)",
            script("xlap_pandas.py"),
        ),
    ];
    let (history_dirs, history_ds) = history_runs(history_n)?;
    let mut history = [
        Side::new("history of a dataset", {
            let ds = history_ds.clone();
            move || {
                let mut c = Command::new(bin("xlap-trace"));
                c.arg("history").arg(&ds).arg("--json");
                c
            }
        }),
        Side::new("sql over a dataset: each run's e2e median", {
            let ds = history_ds.clone();
            move || {
                let mut c = Command::new(bin("xlap-trace"));
                c.arg("sql").arg(&ds).args([
                    "SELECT run_id, kind, median(e2e_ns) FROM packets GROUP BY ALL",
                    "-f",
                    "json",
                ]);
                c
            }
        }),
        Side::new("history of the run directories, each opened", {
            // In the dataset's order: synthetic runs all start at the same
            // instant, so it orders them by partition name (synth-1,
            // synth-10, ...).
            let mut dirs = history_dirs.clone();
            dirs.sort_by_key(|d| {
                let seed = d.file_name().unwrap_or_default().to_string_lossy();
                format!(
                    "synth-{}",
                    seed.trim_start_matches('r').trim_start_matches('0')
                )
            });
            move || {
                let mut c = Command::new(bin("xlap-trace"));
                c.arg("history").args(&dirs).arg("--json");
                c
            }
        }),
    ];
    let big = if big_n > 1 {
        Some(big_dataset(&run, packets, big_n)?)
    } else {
        None
    };
    let mut big_sides: Vec<Side> = big
        .iter()
        .map(|ds| {
            Side::new(
                "xlap-trace analyze DATASET (default set)",
                analyze(ds, false),
            )
        })
        .collect();
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}");
        for side in sides
            .iter_mut()
            .chain(history.iter_mut())
            .chain(big_sides.iter_mut())
        {
            side.run()?;
        }
    }
    // The whole set over the big dataset, once: minutes, not seconds, under
    // the default engine limit as a user runs it.
    let mut big_all: Vec<Side> = big
        .iter()
        .map(|ds| {
            Side::new(
                "xlap-trace analyze DATASET --query all (once)",
                analyze(ds, true),
            )
        })
        .collect();
    for side in &mut big_all {
        side.run()?;
    }
    let [of_dataset, sql_dataset, of_dirs] = &history;
    // Same work: the dataset's history is the directories' history.
    let same_history = of_dataset.stdout_json()? == of_dirs.stdout_json()?;
    if !same_history {
        eprintln!("history differs between the dataset and the run directories");
    }
    let [default, bare_default, polars, all, pandas] = &sides;
    // The default side measures a run as `synth` leaves it now: stored
    // aggregates of an older build are left aside (and computed), which
    // would measure the other side twice.
    if !default
        .last
        .as_ref()
        .is_some_and(|m| m.stderr.contains("read stage_counts"))
    {
        bail!(
            "{} has no stored aggregates this build reads (made by an older one): remove it to generate it again",
            run.display()
        );
    }

    // Same work: the e2e median per kind and the top outlier cause agree.
    let ours = headline(&default.stdout_json()?);
    let mut agree = headline(&bare_default.stdout_json()?) == ours;
    if !agree {
        eprintln!("the default analysis differs with and without the stored aggregates");
    }
    let (p, q) = (polars.stdout_json()?, pandas.stdout_json()?);
    agree &= same_results("polars", &ours, &p["results"]);
    agree &= same_results("pandas", &headline(&all.stdout_json()?), &q["results"]);

    println!("| analysis | wall s (median) | all rounds | peak RSS MiB |\n|---|---|---|---|");
    for side in &sides {
        println!("{}", side.row());
    }
    if let Some(s) = synth_s {
        println!("| xlap-trace synth (this session) | {s:.2} | | |");
    }
    println!("\n### {history_n} runs of 2000 packets\n\n| | wall s (median) | all rounds | peak RSS MiB |\n|---|---|---|---|");
    for side in &history {
        println!("{}", side.row());
    }
    if !big_sides.is_empty() {
        println!(
            "\n### A dataset of {big_n} runs of {packets} packets ({} M), engine limit {}\n\n| | wall s (median) | all rounds | peak RSS MiB |\n|---|---|---|---|",
            big_n as u64 * packets / 1_000_000,
            std::env::var("XLAP_MEMORY_LIMIT").unwrap_or_else(|_| "the default".into()),
        );
        for side in big_sides.iter().chain(&big_all) {
            println!("{}", side.row());
        }
    }
    println!(
        "\n`history` of the dataset is **{:.1}×** faster than over the run directories; same series: {same_history}",
        of_dirs.median_s() / of_dataset.median_s()
    );
    println!(
        "\nThe default analysis is **{:.1}×** faster than polars ({:.1}× without stored aggregates); the whole set is **{:.1}×** faster than pandas; results agree: {agree}",
        polars.median_s() / default.median_s(),
        polars.median_s() / bare_default.median_s(),
        pandas.median_s() / all.median_s()
    );
    let steps = |side: &Side| -> Vec<String> {
        side.last
            .as_ref()
            .map(|m| {
                m.stderr
                    .lines()
                    .filter_map(|l| l.strip_prefix("xlap-trace: "))
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    for side in [default, bare_default, all]
        .into_iter()
        .chain(&big_sides)
        .chain(&big_all)
    {
        println!("\n{} steps (last round):\n", side.name);
        for s in steps(side) {
            println!("- {s}");
        }
    }
    println!("\npolars steps (last round, s): {}", p["steps"]);
    println!("\npandas steps (last round, s): {}", q["steps"]);
    std::fs::create_dir_all("bench-results")?;
    std::fs::write(
        "bench-results/analysis.json",
        serde_json::to_string_pretty(&json!({
            "packets": packets, "parquet_mib": size_mib, "rounds": rounds,
            "synth_s": synth_s,
            "default": default.json(), "default_without_stored": bare_default.json(),
            "polars": polars.json(), "all": all.json(), "pandas": pandas.json(),
            "default_steps": steps(default), "default_without_stored_steps": steps(bare_default),
            "all_steps": steps(all), "polars_steps": p["steps"], "pandas_steps": q["steps"],
            "speedup_vs_polars": polars.median_s() / default.median_s(),
            "speedup_vs_pandas": pandas.median_s() / all.median_s(),
            "results_agree": agree,
            "history": {"runs": history_n, "dataset": of_dataset.json(), "sql_dataset": sql_dataset.json(),
                        "run_directories": of_dirs.json(),
                        "speedup": of_dirs.median_s() / of_dataset.median_s(),
                        "same_series": same_history},
            "big_dataset": {"runs": big_n, "packets_per_run": packets,
                            "default": big_sides.first().map(Side::json),
                            "all": big_all.first().map(Side::json),
                            "default_steps": big_sides.first().map(steps),
                            "all_steps": big_all.first().map(steps)},
        }))? + "\n",
    )?;
    if !same_history {
        bail!("history of the dataset and of the run directories differ");
    }
    if !agree {
        bail!(
            "xlap-trace and its anchors disagree (see above): the comparison is not like for like"
        );
    }
    Ok(())
}
