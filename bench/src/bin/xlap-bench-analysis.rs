//! `just bench-analysis`: the whole bundled query set (`xlap-trace analyze
//! --query all`) against a pandas re-implementation of X-LAP's notebook
//! analyses (`bench/xlap_pandas.py`) on the same synthetic Parquet run,
//! interleaved rounds in one session: wall time, peak memory, their ratio.
//! Both sides' results are compared (e2e median per kind, top outlier
//! cause) so they are seen to do the same work.
//!
//! Usage: xlap-bench-analysis [--packets N] [--rounds R] [--python PATH]
//! [--quick]. Prints Markdown, writes `bench-results/analysis.json`.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use xlap_tests::bin;

struct Measured {
    seconds: f64,
    peak_rss_mib: f64,
    stdout: String,
    stderr: String,
}

/// Runs a command to completion: wall time and the child's peak RSS (from
/// wait4's rusage, the kernel's own account).
fn measure(cmd: &mut Command) -> Result<Measured> {
    let t0 = Instant::now();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id() as i32;
    let out_pipe = child.stdout;
    let err_pipe = child.stderr;
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = out_pipe {
            let _ = std::io::Read::read_to_string(&mut p, &mut s);
        }
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = err_pipe {
            let _ = std::io::Read::read_to_string(&mut p, &mut s);
        }
        s
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter for wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child; status and usage are valid pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let seconds = t0.elapsed().as_secs_f64();
    if r != pid {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let stdout = out_thread.join().unwrap_or_default();
    let stderr = err_thread.join().unwrap_or_default();
    let exit = std::process::ExitStatus::from_raw(status);
    if !exit.success() {
        bail!("{cmd:?} failed ({exit}): {stderr}");
    }
    Ok(Measured {
        seconds,
        peak_rss_mib: usage.ru_maxrss as f64 / 1024.0,
        stdout,
        stderr,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The value of `--name VALUE`, `default` when absent; a bad value is an error.
fn arg<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    Ok(xlap_bench::args::arg_value(name)?.unwrap_or(default))
}

/// The synthetic run, generated once per size and kept in bench-results/.
fn dataset(packets: u64) -> Result<PathBuf> {
    let dir = PathBuf::from(format!("bench-results/synth-{packets}"));
    let meta: Option<Value> = std::fs::read_to_string(dir.join("run.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let current = meta.is_some_and(|m| {
        m["options"]["synthetic"]["packets"] == packets && dir.join("packets.parquet").exists()
    });
    if !current {
        eprintln!(
            "generating {packets} synthetic packets into {}",
            dir.display()
        );
        let s = Command::new(bin("xlap-trace"))
            .args([
                "synth",
                "--packets",
                &packets.to_string(),
                "--seed",
                "1",
                "-o",
            ])
            .arg(&dir)
            .status()?;
        if !s.success() {
            bail!("xlap-trace synth failed");
        }
    }
    Ok(dir)
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let packets: u64 = arg("--packets", if quick { 1_000_000 } else { 10_000_000 })?;
    let rounds: usize = arg("--rounds", if quick { 1 } else { 3 })?.max(1);
    let python: String = arg("--python", "python3".to_string())?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("xlap_pandas.py");
    let run = dataset(packets)?;
    let size_mib = std::fs::metadata(run.join("packets.parquet"))?.len() as f64 / 1048576.0;
    println!("## Analysis: {packets} packets ({size_mib:.0} MiB of Parquet), {rounds} interleaved rounds\n");

    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut last_ours = None;
    let mut last_theirs = None;
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}: xlap-trace analyze --query all");
        let m = measure(
            Command::new(bin("xlap-trace"))
                .args(["analyze", "--query", "all", "--format", "json"])
                .arg(&run),
        )?;
        eprintln!("  {:.2} s, {:.0} MiB", m.seconds, m.peak_rss_mib);
        ours.push((m.seconds, m.peak_rss_mib));
        last_ours = Some(m);
        eprintln!("round {round}/{rounds}: pandas (bench/xlap_pandas.py)");
        let p = measure(Command::new(&python).arg(&script).arg(&run))?;
        eprintln!("  {:.2} s, {:.0} MiB", p.seconds, p.peak_rss_mib);
        theirs.push((p.seconds, p.peak_rss_mib));
        last_theirs = Some(p);
    }
    let (ours_out, theirs_out) = (last_ours.unwrap(), last_theirs.unwrap());

    // Same work: the e2e median per kind and the top outlier cause agree.
    let a: Value = serde_json::from_str(&ours_out.stdout)?;
    let b: Value = serde_json::from_str(theirs_out.stdout.trim())?;
    let mut agree = true;
    for row in a["jitter"].as_array().into_iter().flatten() {
        if row["stage"] == "e2e" {
            let k = row["kind"].to_string();
            let (x, y) = (
                row["median_ns"].as_f64(),
                b["results"]["e2e_median"][&k].as_f64(),
            );
            if x != y {
                eprintln!("e2e median of kind {k} differs: xlap-trace {x:?}, pandas {y:?}");
                agree = false;
            }
        }
    }
    for row in a["outlier_causes"].as_array().into_iter().flatten() {
        let k = row["kind"].to_string();
        let first = a["outlier_causes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == row["kind"])
            .unwrap();
        if first == row && b["results"]["top_cause"][&k] != row["cause"] {
            eprintln!(
                "top cause of kind {k} differs: xlap-trace {}, pandas {}",
                row["cause"], b["results"]["top_cause"][&k]
            );
            agree = false;
        }
    }

    let mut our_s: Vec<f64> = ours.iter().map(|m| m.0).collect();
    let mut their_s: Vec<f64> = theirs.iter().map(|m| m.0).collect();
    let (ms, ps) = (median(&mut our_s), median(&mut their_s));
    let our_rss = ours.iter().map(|m| m.1).fold(0.0, f64::max);
    let their_rss = theirs.iter().map(|m| m.1).fold(0.0, f64::max);
    println!("| analysis | wall s (median) | all rounds | peak RSS MiB |\n|---|---|---|---|");
    println!("| xlap-trace analyze --query all (DuckDB) | {ms:.2} | {our_s:.2?} | {our_rss:.0} |");
    println!("| pandas (X-LAP notebook style) | {ps:.2} | {their_s:.2?} | {their_rss:.0} |");
    println!(
        "\nxlap-trace is **{:.1}×** faster; results agree: {agree}",
        ps / ms
    );
    let steps: Vec<String> = ours_out
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("xlap-trace: "))
        .map(String::from)
        .collect();
    println!("\nxlap-trace steps (last round):\n");
    for s in &steps {
        println!("- {s}");
    }
    println!("\npandas steps (last round, s): {}", b["steps"]);
    std::fs::create_dir_all("bench-results")?;
    std::fs::write(
        "bench-results/analysis.json",
        serde_json::to_string_pretty(&json!({
            "packets": packets, "parquet_mib": size_mib, "rounds": rounds,
            "xlap_trace": {"seconds": our_s, "median_s": ms, "peak_rss_mib": our_rss, "steps": steps},
            "pandas": {"seconds": their_s, "median_s": ps, "peak_rss_mib": their_rss, "steps": b["steps"]},
            "speedup": ps / ms, "results_agree": agree,
        }))? + "\n",
    )?;
    if !agree {
        bail!("xlap-trace and pandas disagree (see above): the comparison is not like for like");
    }
    Ok(())
}
