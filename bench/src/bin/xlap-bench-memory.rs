//! `just bench-memory`: the peak memory (the child's `ru_maxrss`, from
//! wait4) and wall time of every command that reads a run, each run as a
//! child of its own on the same inputs, against the bound it must stay
//! under (issue 48):
//! - a run of 10 000 packets (the demo's size): 500 MB;
//! - a run of 10 M packets (`--quick`: 1 M): the engine's memory limit
//!   (`XLAP_MEMORY_LIMIT`, default 4GB) plus [`ENGINE_MARGIN`].
//!
//! The inputs are `xlap-trace synth` runs (seed 1, and seeds 2 and 3 whose
//! summaries make the `history`), kept in `bench-results/` as
//! `bench-analysis` keeps them, and for `correlate` a synthetic recording
//! of the same packets (`xlap_bench::stamps`); `--run DIR` adds a recorded
//! run (the demo's `xlap-demo/run`): its own stamps are correlated, its
//! summary stands for all three of the history.
//!
//! Every child runs under a time limit (`--timeout S`; default 60 s per
//! million packets, at least 120 s) and `RLIMIT_DATA` (`--data-limit GiB`,
//! default 8): one that runs away is killed and shows as such in the
//! table, the bench goes on.
//!
//! Usage: xlap-bench-memory [--quick] [--sizes N,N] [--run DIR]
//! [--timeout S] [--data-limit GiB] [--xlap PATH] (a copy of an
//! `xlap-trace` binary to measure instead of the build's: one that stays
//! put while its sources change). Prints Markdown, writes
//! `bench-results/memory.json`.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use xlap_bench::measure::{measure_limited, Limits, Measured};
use xlap_exit::memory;
use xlap_tests::bin;

/// The bound of a run of the demo's size: 500 MB.
const SMALL_BOUND_BYTES: f64 = 500e6;
/// Runs up to this many packets are held to [`SMALL_BOUND_BYTES`] (the
/// demo's 10 000 data packets and their parity, with room); larger ones to
/// the engine's limit plus [`ENGINE_MARGIN`].
const SMALL_RUN_PACKETS: u64 = 100_000;
/// What a command may hold beyond the engine's memory limit: DuckDB's
/// limit bounds its buffer manager only, not the process. Beside it live
/// the memory DuckDB does not account there (the query state it allocates
/// outside the buffer pool, the Parquet reader's and writer's buffers),
/// the Rust side's own (the rows a command collects and renders: report's
/// plots, export's trace events, the summaries' blocks), and the binary
/// with its libraries. The margin of the ceiling every command sets itself
/// (`XLAP_MAX_MEMORY`, by default the engine's limit plus this: 2 GiB).
const ENGINE_MARGIN: f64 = memory::DEFAULT_MARGIN as f64;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// `xlap-trace`'s exit code when a command ran out of memory (its own
/// ceiling or the engine's limit: README, exit codes).
const OUT_OF_MEMORY_EXIT: i32 = 8;

/// The engine's memory limit in bytes, in DuckDB's syntax (`4GB` = 4·10⁹,
/// `4GiB` = 4·2³⁰): `XLAP_MEMORY_LIMIT`, which the children inherit, or
/// the default.
fn engine_limit() -> Result<(String, f64)> {
    let text = std::env::var(memory::ENGINE_VAR)
        .unwrap_or_else(|_| xlap_analyze::DEFAULT_MEMORY_LIMIT.to_string());
    let bytes = memory::parse_size(&text)
        .with_context(|| format!("{}={text}: not a size", memory::ENGINE_VAR))?;
    Ok((text, bytes as f64))
}

/// One input the commands read.
struct Input {
    /// Column header: "10 k packets", "xlap-demo/run", ...
    label: String,
    /// The run directory the commands read.
    run: PathBuf,
    /// What `correlate` reads: the recording(s) of the run's stamps.
    recordings: Vec<PathBuf>,
    /// Two more runs whose summaries join this run's in `history`; none:
    /// this run's summary three times.
    others: Vec<PathBuf>,
    /// Packets of the run (synthetic: known; a recorded run: counted by
    /// the `sql` command).
    packets: Option<u64>,
    /// Where the commands write.
    out: PathBuf,
}

/// How a measured command ended.
#[derive(Clone, Debug, PartialEq)]
enum End {
    Ok,
    /// Killed by the bench at its time limit.
    Timeout,
    /// Out of memory: an allocation failed under RLIMIT_DATA (an abort,
    /// `memory allocation ... failed`) or in the engine.
    Memory(String),
    Failed(String),
    /// Not run: what it needs (a summary) was not made.
    Skipped(String),
}

struct Cell {
    end: End,
    seconds: f64,
    peak_mib: f64,
}

impl Cell {
    fn of(m: &Measured, ok_codes: &[i32]) -> Cell {
        let last_line = m
            .stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .chars()
            .take(200)
            .collect::<String>();
        let oom = [
            "memory allocation of",
            "Out of Memory",
            "bad_alloc",
            "out of memory",
        ]
        .iter()
        .any(|s| m.stderr.contains(s));
        let end = if m.timed_out {
            End::Timeout
        } else if m.status.code().is_some_and(|c| ok_codes.contains(&c)) {
            End::Ok
        } else if oom
            || m.status.code() == Some(OUT_OF_MEMORY_EXIT)
            || m.status.signal() == Some(libc::SIGABRT)
        {
            End::Memory(last_line)
        } else {
            End::Failed(format!("{}: {last_line}", m.status))
        };
        Cell {
            end,
            seconds: m.seconds,
            peak_mib: m.peak_rss_mib,
        }
    }

    fn skipped(why: &str) -> Cell {
        Cell {
            end: End::Skipped(why.into()),
            seconds: 0.0,
            peak_mib: 0.0,
        }
    }

    /// Over the bound, or out of memory (a timeout is no result, but says
    /// nothing of memory: [`Cell::unfinished`]).
    fn over(&self, bound_mib: f64) -> bool {
        self.peak_mib > bound_mib || matches!(self.end, End::Memory(_))
    }

    /// Ended without a result.
    fn unfinished(&self) -> bool {
        !matches!(self.end, End::Ok)
    }

    /// Peak and seconds columns of the Markdown table.
    fn columns(&self, bound_mib: f64) -> (String, String) {
        let over = if self.over(bound_mib) {
            " **over**"
        } else {
            ""
        };
        match &self.end {
            End::Ok => (
                format!("{:.0}{over}", self.peak_mib),
                format!("{:.2}", self.seconds),
            ),
            End::Timeout => (
                format!(
                    "killed/limit: timeout, {:.0} at the kill{over}",
                    self.peak_mib
                ),
                format!("> {:.0}", self.seconds),
            ),
            End::Memory(_) => (
                format!("killed/limit: out of memory at {:.0}{over}", self.peak_mib),
                format!("{:.2}", self.seconds),
            ),
            End::Failed(why) => (
                format!(
                    "failed ({}) at {:.0}{over}",
                    why.replace('|', "/"),
                    self.peak_mib
                ),
                format!("{:.2}", self.seconds),
            ),
            End::Skipped(why) => (format!("not run: {why}"), String::new()),
        }
    }

    fn json(&self, bound_mib: f64) -> Value {
        let (end, detail) = match &self.end {
            End::Ok => ("ok", None),
            End::Timeout => ("timeout", None),
            End::Memory(s) => ("out_of_memory", Some(s.clone())),
            End::Failed(s) => ("failed", Some(s.clone())),
            End::Skipped(s) => ("skipped", Some(s.clone())),
        };
        json!({"end": end, "detail": detail, "seconds": self.seconds,
               "peak_rss_mib": self.peak_mib, "bound_mib": bound_mib,
               "over_bound": self.over(bound_mib), "unfinished": self.unfinished()})
    }
}

/// The commands measured, in the order they run on each input.
const COMMANDS: &[&str] = &[
    "correlate",
    "analyze RUN -q all",
    "report RUN -o F",
    "export RUN --perfetto F",
    "summary RUN -o S",
    "compare S RUN",
    "compare S RUN --markdown",
    "history S S2 S3",
    "sql RUN \"SELECT count(*) FROM packets\"",
];

/// `--xlap PATH`, when given: the binary measured instead of the build's.
static XLAP: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn xlap() -> Command {
    match XLAP.get() {
        Some(path) => Command::new(path),
        None => Command::new(bin("xlap-trace")),
    }
}

/// Runs every command on `input`: its cells, in [`COMMANDS`]' order.
fn run_input(input: &mut Input, limits: Limits) -> Result<Vec<Cell>> {
    let _ = std::fs::remove_dir_all(&input.out);
    std::fs::create_dir_all(&input.out)?;
    let out = input.out.clone();
    let run = input.run.clone();
    // The other summaries of the history, made first (not measured here:
    // the same command as the measured `summary`, on other runs).
    let mut others = Vec::new();
    for (i, r) in input.others.iter().enumerate() {
        let s = out.join(format!("summary-other{}.json", i + 2));
        let m = measure_limited(xlap().arg("summary").arg(r).arg("-o").arg(&s), limits)?;
        if m.status.success() {
            others.push(s);
        } else {
            eprintln!(
                "  summary of {} failed ({}): {}",
                r.display(),
                m.status,
                m.stderr
            );
        }
    }
    let summary = out.join("summary.json");
    let mut cells = Vec::new();
    for &name in COMMANDS {
        let mut cmd = xlap();
        let mut ok_codes = vec![0];
        match name {
            "correlate" => {
                cmd.arg("correlate")
                    .args(&input.recordings)
                    .arg("-o")
                    .arg(out.join("packets.parquet"));
            }
            "analyze RUN -q all" => {
                cmd.arg("analyze").arg(&run).args(["-q", "all"]);
            }
            "report RUN -o F" => {
                cmd.arg("report")
                    .arg(&run)
                    .arg("-o")
                    .arg(out.join("report.html"));
            }
            "export RUN --perfetto F" => {
                cmd.arg("export")
                    .arg(&run)
                    .arg("--perfetto")
                    .arg(out.join("perfetto.json"));
            }
            "summary RUN -o S" => {
                cmd.arg("summary").arg(&run).arg("-o").arg(&summary);
            }
            "compare S RUN" | "compare S RUN --markdown" => {
                // 1: a regression, a verdict like any other.
                ok_codes.push(1);
                cmd.arg("compare").arg(&summary).arg(&run);
                if name.ends_with("--markdown") {
                    cmd.arg("--markdown");
                }
            }
            "history S S2 S3" => {
                cmd.arg("history").arg(&summary);
                if others.len() == 2 {
                    cmd.args(&others);
                } else {
                    cmd.arg(&summary).arg(&summary);
                }
            }
            _ => {
                cmd.arg("sql").arg(&run).arg("SELECT count(*) FROM packets");
            }
        }
        let needs_summary = name.starts_with("compare") || name.starts_with("history");
        let cell = if needs_summary && !summary.exists() {
            Cell::skipped("no summary")
        } else {
            let m = measure_limited(&mut cmd, limits)?;
            if name.starts_with("sql") && m.status.success() && input.packets.is_none() {
                input.packets = m
                    .stdout
                    .split(|c: char| !c.is_ascii_digit())
                    .find(|t| !t.is_empty())
                    .and_then(|t| t.parse().ok());
            }
            Cell::of(&m, &ok_codes)
        };
        let (peak, s) = cell.columns(f64::INFINITY);
        eprintln!("  {name}: {peak} MiB, {s} s");
        if let End::Failed(why) | End::Memory(why) = &cell.end {
            eprintln!("    {why}");
        }
        cells.push(cell);
    }
    Ok(cells)
}

/// The recording(s) of a recorded run's stamps: the directory itself, or
/// its subdirectories that hold stamps (a run of one recorder per end).
fn recordings_of(run: &Path) -> Result<Vec<PathBuf>> {
    if run.join("stamps.parquet").exists() {
        return Ok(vec![run.to_path_buf()]);
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(run)
        .with_context(|| format!("--run {}", run.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("stamps.parquet").exists())
        .collect();
    dirs.sort();
    anyhow::ensure!(
        !dirs.is_empty(),
        "--run {}: no stamps.parquet in it or its subdirectories",
        run.display()
    );
    Ok(dirs)
}

fn git(args: &[&str]) -> String {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn short_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{} M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{} k", n / 1_000),
        n => n.to_string(),
    }
}

/// `--prepare`: makes the synthetic runs and recordings of `sizes` (or
/// finds them kept); prints what it made (seconds) as JSON.
fn prepare(sizes: &[u64]) -> Result<()> {
    let mut made = serde_json::Map::new();
    for &packets in sizes {
        let (_, synth_s) = xlap_bench::synth::run(packets, 1)?;
        for seed in [2, 3] {
            xlap_bench::synth::run(packets, seed)?;
        }
        let (_, stamps_s) = xlap_bench::stamps::recording(packets)?;
        made.insert(
            packets.to_string(),
            json!({"synth_s": synth_s, "stamps_s": stamps_s}),
        );
    }
    println!("{}", Value::Object(made));
    Ok(())
}

fn main() -> Result<()> {
    xlap_bench::args::check(
        "usage: xlap-bench-memory [--quick] [--sizes N,N] [--run DIR] [--timeout S] [--data-limit GiB] [--xlap PATH]\nPeak memory and wall time of every command that reads a run, against its bound (docs/performance.md); prints Markdown, writes bench-results/memory.json.",
        &["--quick", "--prepare"],
        &["--sizes", "--run", "--timeout", "--data-limit", "--xlap"],
    )?;
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes: Vec<u64> = match xlap_bench::args::arg_value::<String>("--sizes")? {
        Some(s) => s
            .split(',')
            .map(|n| n.trim().replace('_', "").parse())
            .collect::<std::result::Result<_, _>>()
            .context("--sizes: packet counts, comma-separated")?,
        None if quick => vec![10_000, 1_000_000],
        None => vec![10_000, 10_000_000],
    };
    let recorded: Option<PathBuf> = xlap_bench::args::arg_value("--run")?;
    let timeout: Option<f64> = xlap_bench::args::arg_value("--timeout")?;
    let data_gib: f64 = xlap_bench::args::arg_value("--data-limit")?.unwrap_or(8.0);
    let (limit_text, limit_bytes) = engine_limit()?;
    let small_bound = SMALL_BOUND_BYTES / MIB;
    let engine_bound = (limit_bytes + ENGINE_MARGIN) / MIB;
    let bound_of = |packets: Option<u64>| match packets {
        Some(p) if p <= SMALL_RUN_PACKETS => small_bound,
        _ => engine_bound,
    };
    let limits_for = |packets: u64| Limits {
        timeout: Some(Duration::from_secs_f64(
            timeout.unwrap_or((60.0 * packets as f64 / 1e6).max(120.0)),
        )),
        data_bytes: Some((data_gib * GIB) as u64),
    };
    if let Some(path) = xlap_bench::args::arg_value::<PathBuf>("--xlap")? {
        anyhow::ensure!(path.is_file(), "--xlap {}: no such file", path.display());
        let _ = XLAP.set(path);
    }
    let t0 = Instant::now();
    if std::env::args().any(|a| a == "--prepare") {
        return prepare(&sizes);
    }
    // The inputs, made (or found kept) by a child before anything is
    // measured: a child's ru_maxrss starts at what its parent held when it
    // was forked (the kernel keeps the larger of the old and the new image's
    // peak across exec), so this process stays small (writing the stamps,
    // refreshing stored aggregates in DuckDB would have made it ~190 MiB).
    let out = Command::new(std::env::current_exe()?)
        .arg("--prepare")
        .arg("--sizes")
        .arg(
            sizes
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
        )
        .stderr(std::process::Stdio::inherit())
        .output()?;
    anyhow::ensure!(out.status.success(), "making the inputs failed");
    let made: Value = serde_json::from_slice(&out.stdout)?;
    let mut inputs = Vec::new();
    for &packets in &sizes {
        inputs.push(Input {
            label: format!("{} packets", short_count(packets)),
            run: xlap_bench::synth::run_dir(packets, 1),
            recordings: vec![xlap_bench::stamps::run_dir(packets)],
            others: [2, 3]
                .map(|seed| xlap_bench::synth::run_dir(packets, seed))
                .to_vec(),
            packets: Some(packets),
            out: PathBuf::from(format!("bench-results/memory/synth-{packets}")),
        });
    }
    if let Some(run) = &recorded {
        anyhow::ensure!(
            xlap_records::RunDir::new(run).packets().exists(),
            "--run {}: no packets table (a run of both ends, correlated)",
            run.display()
        );
        inputs.push(Input {
            label: run.display().to_string(),
            run: run.clone(),
            recordings: recordings_of(run)?,
            others: Vec::new(),
            packets: None,
            out: PathBuf::from("bench-results/memory/run"),
        });
    }

    let mut results = Vec::new();
    for input in &mut inputs {
        let limits = limits_for(input.packets.unwrap_or(SMALL_RUN_PACKETS));
        eprintln!(
            "{} ({}): timeout {:.0} s, RLIMIT_DATA {data_gib} GiB",
            input.label,
            input.run.display(),
            limits.timeout.unwrap_or_default().as_secs_f64()
        );
        results.push(run_input(input, limits)?);
    }
    let bounds: Vec<f64> = inputs.iter().map(|i| bound_of(i.packets)).collect();

    let commit = git(&["rev-parse", "--short", "HEAD"]);
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let date = Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!(
        "## Peak memory per command ({date}, commit {commit}{})\n",
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    );
    let bound_text = |b: f64| {
        if b == small_bound {
            format!("{:.0} MiB (500 MB)", b)
        } else {
            format!("{:.0} MiB ({limit_text} + 2 GiB)", b)
        }
    };
    let mut header = "| command |".to_string();
    let mut rule = "|---|".to_string();
    for input in &inputs {
        header += &format!(" {}: peak MiB | s |", input.label);
        rule += "---|---|";
    }
    println!("{header} bound |\n{rule}---|");
    let mut over = Vec::new();
    let mut unfinished = Vec::new();
    for (c, &name) in COMMANDS.iter().enumerate() {
        let mut row = format!("| `{name}` |");
        for (i, cells) in results.iter().enumerate() {
            let (peak, s) = cells[c].columns(bounds[i]);
            row += &format!(" {peak} | {s} |");
            if cells[c].over(bounds[i]) {
                over.push(format!("{name} on {}", inputs[i].label));
            }
            if cells[c].unfinished() {
                unfinished.push(format!("{name} on {}", inputs[i].label));
            }
        }
        let mut b: Vec<String> = bounds.iter().map(|&b| bound_text(b)).collect();
        b.dedup();
        println!("{row} {} |", b.join(" / "));
    }
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut own: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: own is a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut own) };
    let own_mib = own.ru_maxrss as f64 / 1024.0;
    println!(
        "\nPeak: the child's `ru_maxrss` (wait4), which starts at this bench's own peak \
         when it forks ({own_mib:.0} MiB). Each command a child of its own under a time \
         limit and RLIMIT_DATA {data_gib} GiB; engine limit {limit_text}. Bench: {:.0} s.",
        t0.elapsed().as_secs_f64()
    );
    if over.is_empty() {
        println!("\nNo command went over its bound.");
    } else {
        println!("\nOver the bound: {}.", over.join("; "));
    }
    if !unfinished.is_empty() {
        println!("\nWithout a result: {}.", unfinished.join("; "));
    }

    let commands: Vec<Value> = COMMANDS
        .iter()
        .enumerate()
        .map(|(c, name)| {
            let per: serde_json::Map<String, Value> = inputs
                .iter()
                .zip(&results)
                .zip(&bounds)
                .map(|((input, cells), &b)| (input.label.clone(), cells[c].json(b)))
                .collect();
            json!({"command": name, "inputs": per})
        })
        .collect();
    std::fs::create_dir_all("bench-results")?;
    std::fs::write(
        "bench-results/memory.json",
        serde_json::to_string_pretty(&json!({
            "date": date, "commit": commit, "uncommitted_changes": dirty,
            "engine_limit": limit_text, "engine_limit_bytes": limit_bytes,
            "engine_margin_bytes": ENGINE_MARGIN, "small_bound_bytes": SMALL_BOUND_BYTES,
            "small_run_packets": SMALL_RUN_PACKETS, "data_limit_gib": data_gib,
            "inputs": inputs.iter().zip(&bounds).map(|(i, b)| json!({
                "label": i.label, "run": i.run, "packets": i.packets,
                "recordings": i.recordings, "bound_mib": b})).collect::<Vec<_>>(),
            "made": made, "bench_own_peak_mib": own_mib,
            "commands": commands,
            "over_bound": over, "unfinished": unfinished,
            "bench_seconds": t0.elapsed().as_secs_f64(),
        }))? + "\n",
    )?;
    Ok(())
}
