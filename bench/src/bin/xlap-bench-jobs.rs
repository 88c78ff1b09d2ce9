//! `just bench` (part 3): `xlap-trace run` on jobs shaped like CI jobs,
//! each untraced and under `run` (and `--baseline`'s binary), interleaved
//! round by round:
//!
//! - `short processes`: 300 execs of `/bin/true`, then 30 `python3 -c
//!   'import json'` (no marker anywhere);
//! - `C build + protocol`: `make -j2` of 50 C files, then the protocol with
//!   markers (udp_loop, 300 datagrams);
//! - `pytest-like + protocol`: a Python unittest run of 40 tests that start
//!   short processes, one of which starts the protocol.
//!
//! Each job times itself (its own first and last instant, written to a
//! file); the table gives its time traced over untraced (medians), how long
//! `run` took after the job's end, the holds per kind from run.json, the
//! recorder's peak descriptors (sampled every 20 ms) and peak memory
//! (wait4's maxrss), and for the protocol, its markers stamped against its
//! log. Prints Markdown, writes `bench-results/jobs.json`.

use anyhow::{Context, Result};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xlap_bench::args::{arg_value, baseline_binary};
use xlap_tests::c_programs::{udp_loop, udp_loop_log};
use xlap_tests::trace::{read_stamps, SEQ_U64_LE};
use xlap_tests::{bin, privileged_unavailable, Scratch};

const PROTOCOL_COUNT: usize = 300;

struct Job {
    name: &'static str,
    script: PathBuf,
    /// The protocol's log, when the job runs it.
    log: Option<PathBuf>,
}

/// One run of a job: its own time, and under `run` what `run` reported.
#[derive(Default, Clone)]
struct Sample {
    job_ms: f64,
    after_job_ms: f64,
    holds: serde_json::Value,
    peak_fds: usize,
    max_rss_kib: i64,
    markers_stamped: Option<(usize, usize)>,
}

fn main() -> Result<()> {
    xlap_bench::args::check(
        "usage: xlap-bench-jobs [--quick] [--rounds R] [--baseline XLAP_TRACE]\n`run` on CI-shaped jobs, untraced and traced, interleaved (docs/performance.md); writes bench-results/jobs.json.",
        &["--quick", "--no-capture"],
        &["--rounds", "--baseline", "--loads", "--seconds"],
    )?;
    if let Some(reason) = privileged_unavailable() {
        anyhow::bail!("the benchmark traces with BPF: {reason}");
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds: usize = arg_value("--rounds")?.unwrap_or(if quick { 1 } else { 3 });
    let baseline = baseline_binary()?;
    let scratch = Scratch::new("bench-jobs");
    let jobs = make_jobs(&scratch)?;
    // The syscalls (which slow every process of the job), the default
    // boundary, auto (the socket calls, and the send syscalls' entry once
    // the protocol connects its socket), and the socket calls alone, which
    // never slow the job's other processes.
    let mut tracers: Vec<(String, PathBuf, Vec<&str>)> = vec![
        (
            "run --boundary syscalls".into(),
            bin("xlap-trace"),
            vec!["--boundary", "syscalls"],
        ),
        ("run (auto, the default)".into(), bin("xlap-trace"), vec![]),
        (
            "run --boundary socket-calls".into(),
            bin("xlap-trace"),
            vec!["--boundary", "socket-calls"],
        ),
    ];
    if let Some(b) = &baseline {
        tracers.push(("run (baseline)".into(), b.clone(), vec![]));
    }
    println!("## `run` on CI-shaped jobs ({rounds} rounds, interleaved; medians)\n");
    println!("| job | tracer | job time ms | × untraced | run ends after the job, ms | holds exec / loader | not held exec / loader | recorder peak fds | recorder peak RSS MiB | markers stamped / logged |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for job in &jobs {
        let mut untraced = Vec::new();
        let mut traced: Vec<Vec<Sample>> = vec![Vec::new(); tracers.len()];
        for round in 0..rounds {
            eprintln!("xlap-bench-jobs: {} round {}/{rounds}", job.name, round + 1);
            untraced.push(run_untraced(job)?);
            for (i, (_, tracer, extra)) in tracers.iter().enumerate() {
                let dir = scratch.path(&format!("{}-{i}-{round}", job.name.replace(' ', "_")));
                traced[i].push(run_traced(job, tracer, extra, &dir)?);
            }
        }
        let base = median(untraced.iter().map(|s| s.job_ms));
        println!("| {} | untraced | {base:.0} | 1.00 | | | | | | |", job.name);
        let mut row = json!({"job": job.name, "untraced_ms": base, "tracers": []});
        for (i, (name, _, _)) in tracers.iter().enumerate() {
            let samples = &traced[i];
            let ms = median(samples.iter().map(|s| s.job_ms));
            let after = median(samples.iter().map(|s| s.after_job_ms));
            let last = samples.last().cloned().unwrap_or_default();
            let h = &last.holds;
            let n = |k: &str| h[k].as_u64().unwrap_or(0);
            let fds = samples.iter().map(|s| s.peak_fds).max().unwrap_or(0);
            let rss = samples.iter().map(|s| s.max_rss_kib).max().unwrap_or(0) as f64 / 1024.0;
            let markers = last
                .markers_stamped
                .map_or(String::new(), |(s, l)| format!("{s} / {l}"));
            println!(
                "| {} | {name} | {ms:.0} | {:.2} | {after:.0} | {} / {} | {} / {} | {fds} | {rss:.0} | {markers} |",
                job.name,
                ms / base,
                n("at_exec"),
                n("at_loader"),
                n("skipped_at_exec"),
                n("skipped_at_loader"),
            );
            row["tracers"].as_array_mut().unwrap().push(json!({
                "tracer": name,
                "job_ms": ms,
                "ratio": ms / base,
                "after_job_ms": after,
                "holds": h,
                "peak_fds": fds,
                "peak_rss_mib": rss,
                "markers_stamped": last.markers_stamped.map(|(s, _)| s),
                "markers_logged": last.markers_stamped.map(|(_, l)| l),
            }));
        }
        results.push(row);
    }
    xlap_bench::write_results("jobs.json", &json!({"rounds": rounds, "jobs": results}))
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

fn make_jobs(scratch: &Scratch) -> Result<Vec<Job>> {
    let times = scratch.path("times");
    let start = format!("date +%s%N > {}\n", times.display());
    let end = format!("date +%s%N >> {}\n", times.display());
    let protocol = udp_loop(scratch);
    let log = scratch.path("protocol.log");
    let run_protocol = format!(
        "{} 47711 {PROTOCOL_COUNT} 0 {}\n",
        protocol.display(),
        log.display()
    );

    let short = scratch.path("short.sh");
    std::fs::write(
        &short,
        format!("set -e\n{start}for i in $(seq 300); do /bin/true; done\nfor i in $(seq 30); do python3 -c 'import json'; done\n{end}"),
    )?;

    // A C project of 50 files, rebuilt from clean each time.
    let project = scratch.path("cproject");
    std::fs::create_dir_all(&project)?;
    let mut objects = Vec::new();
    for i in 0..50 {
        std::fs::write(
            project.join(format!("f{i}.c")),
            format!(
                "#include <stdio.h>\n#include <string.h>\n#include <stdlib.h>\nint f{i}(int x) {{ char b[64]; snprintf(b, sizeof b, \"%d\", x * {i}); return (int)strlen(b) + atoi(b); }}\n"
            ),
        )?;
        objects.push(format!("f{i}.o"));
    }
    std::fs::write(project.join("main.c"), "int main(void) { return 0; }\n")?;
    std::fs::write(
        project.join("Makefile"),
        format!(
            "prog: main.o {o}\n\tcc -o $@ $^\n%.o: %.c\n\tcc -O2 -c $< -o $@\nclean:\n\trm -f *.o prog\n",
            o = objects.join(" ")
        ),
    )?;
    let build = scratch.path("build.sh");
    std::fs::write(
        &build,
        format!(
            "set -e\ncd {}\nmake -s clean\n{start}make -s -j2\n{run_protocol}{end}",
            project.display()
        ),
    )?;

    // A unittest run: 40 tests each starting a short process, one starting
    // the protocol.
    let tests = scratch.path("test_job.py");
    let mut py = String::from("import subprocess, unittest\n\nclass Job(unittest.TestCase):\n");
    for i in 0..40 {
        py.push_str(&format!(
            "    def test_{i:02}(self):\n        self.assertEqual(subprocess.run(['/bin/true']).returncode, 0)\n"
        ));
    }
    py.push_str(&format!(
        "    def test_protocol(self):\n        subprocess.run([{:?}, '47712', '{PROTOCOL_COUNT}', '0', {:?}], check=True)\n\nif __name__ == '__main__':\n    unittest.main()\n",
        protocol.display().to_string(),
        log.display().to_string()
    ));
    std::fs::write(&tests, py)?;
    let pytest = scratch.path("pytest.sh");
    std::fs::write(
        &pytest,
        format!(
            "set -e\n{start}python3 -q {} 2>/dev/null\n{end}",
            tests.display()
        ),
    )?;
    Ok(vec![
        Job {
            name: "short processes",
            script: short,
            log: None,
        },
        Job {
            name: "C build + protocol",
            script: build,
            log: Some(log.clone()),
        },
        Job {
            name: "pytest-like + protocol",
            script: pytest,
            log: Some(log),
        },
    ])
}

/// The job's own (first, last) instants, ns.
fn job_times(job: &Job) -> Result<(u128, u128)> {
    let times = job.script.with_file_name("times");
    let text = std::fs::read_to_string(&times).context("the job's times")?;
    let v: Vec<u128> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    anyhow::ensure!(v.len() == 2, "{}: {text:?}", times.display());
    Ok((v[0], v[1]))
}

fn run_untraced(job: &Job) -> Result<Sample> {
    let status = Command::new("bash")
        .arg(&job.script)
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "{}: {status}", job.name);
    let (a, b) = job_times(job)?;
    Ok(Sample {
        job_ms: (b - a) as f64 / 1e6,
        ..Default::default()
    })
}

fn run_traced(job: &Job, tracer: &Path, extra: &[&str], dir: &Path) -> Result<Sample> {
    let _ = std::fs::remove_dir_all(dir);
    let mut child = Command::new(tracer)
        .args(["run", "--quiet", "--no-correlate", "-o"])
        .arg(dir)
        .args(SEQ_U64_LE)
        .args(extra)
        .arg("--")
        .arg("bash")
        .arg(&job.script)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (stop, peak) = (stop.clone(), peak.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                    peak.fetch_max(d.count(), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let stderr = child.stderr.take();
    let mut status = 0;
    // SAFETY: a zeroed rusage for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child.
    unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
    let exited = Instant::now();
    let exited_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let mut err = String::new();
    if let Some(mut e) = stderr {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    anyhow::ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} under {}: status {status:#x}: {err}",
        job.name,
        tracer.display()
    );
    let (a, b) = job_times(job)?;
    let exited_ns = exited_ns - exited.elapsed().as_nanos();
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).context("run.json")?)?;
    let markers_stamped = match &job.log {
        Some(log) => {
            let logged = udp_loop_log(log);
            let with: std::collections::BTreeSet<u64> = read_stamps(&dir.join("stamps.parquet"))
                .into_iter()
                .filter(|r| r.point == "app.send_start")
                .filter_map(|r| r.seq)
                .collect();
            let stamped = logged.iter().filter(|(seq, _)| with.contains(seq)).count();
            Some((stamped, logged.len()))
        }
        None => None,
    };
    Ok(Sample {
        job_ms: (b - a) as f64 / 1e6,
        after_job_ms: exited_ns.saturating_sub(b) as f64 / 1e6,
        holds: meta["holds"].clone(),
        peak_fds: peak.load(Ordering::Relaxed),
        max_rss_kib: usage.ru_maxrss,
        markers_stamped,
    })
}
