//! `just bench` (part 2): how much tracing perturbs a fast protocol, the
//! matrix of issue 14, side by side in one run.
//!
//! Workload: `sockperf ping-pong` (a program we did not write) between the
//! two hosts of the stage, 64-byte messages, `--mps=max`; its own per-message
//! latency log (`--full-log`: half the round trip) is the measurement.
//! Client and server pinned to one CPU (no wake-up IPI noise hides the
//! cost), and unpinned. Configurations, interleaved round by round:
//! untraced; a hand-written bpftrace script (bench/diy-net.bt, the
//! anchor a user would otherwise write); `xlap-trace record` of both
//! processes at the syscalls (`--boundary syscalls`, every kernel point)
//! with the kernel's BPF run-time statistics sampled (the default), on all
//! the time (`--bpf-stats full`, which also gives the per-program
//! breakdown) and off; and with fewer points (`--points standard`,
//! `--points minimal`); at `--boundary auto`; at the socket calls
//! (`--boundary socket-calls`, every point and minimal), and sampled there
//! (`--sample 1/16`, `1/64`); and the floor under all of these: the hooks
//! of every point at the syscalls, and of every point and minimal at the
//! socket calls, with programs that return at once (`--empty-programs`).
//! Then the rest of
//! the machine: an untraced process's getppid while each tracer runs; and
//! always-on monitoring (sockperf under-load at a fixed rate, sampled with
//! metrics and a bounded rotation: the protocol's p50 and the recorder's
//! CPU).
//!
//! Prints Markdown (p50/p99/p99.9 half-RTT, their ratios to untraced, the
//! message rate ratio, and which capture programs run per round trip at
//! what cost) and writes `bench-results/perturbation.json`.
//!
//! `--quick`: 1 round of 2 s per cell; default 3 rounds of 5 s.
//! `--seconds S`, `--rounds N` override. `--baseline PATH`: another
//! `xlap-trace` binary (an older build) as one more configuration, so a
//! change's effect is a ratio measured in the same run;
//! `--baseline-boundary B` runs it at `--boundary B` (syscalls,
//! socket-calls, auto) instead of its own default, to compare one
//! boundary's programs across builds.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use xlap_bench::args::{arg_value, baseline_binary};
use xlap_stage::Stage;
use xlap_tests::trace::Recorder;
use xlap_tests::{bin, privileged_unavailable, KillOnDrop, Scratch};

mod programs;

const PORT: u16 = 11_111;
const DIY_SCRIPT: &str = include_str!("../../../diy-net.bt");

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tracer {
    None,
    Bpftrace,
    /// `--boundary syscalls --bpf-stats MODE`.
    Xlap {
        stats: &'static str,
    },
    /// `--boundary syscalls --points SET` (statistics sampled).
    Points(&'static str),
    /// `--boundary auto --bpf-stats off`, every point: the socket calls,
    /// and the send syscalls' entry once a traced socket is connected.
    Auto,
    /// `--boundary socket-calls --points SET` (statistics sampled).
    SocketCalls(&'static str),
    /// `--boundary socket-calls --sample RATE`, every point (statistics
    /// sampled).
    Sampled(&'static str),
    /// `--boundary AT --points SET --empty-programs --bpf-stats off`: the
    /// hooks of that run, every program returning at once (the floor of
    /// their dispatch, under any program on them).
    Empty {
        boundary: &'static str,
        points: &'static str,
    },
    /// The `--baseline` binary, with statistics, at `--baseline-boundary`
    /// (None: its own default).
    Baseline(Option<&'static str>),
    /// `--programs`: one recording configuration, by this build or (old)
    /// the `--baseline` binary.
    Run(RunConfig),
}

/// A recording configuration of the `--programs` matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RunConfig {
    old: bool,
    boundary: &'static str,
    points: &'static str,
    /// `--sample RATE`, or "" for every datagram.
    sample: &'static str,
    stats: &'static str,
}

impl Tracer {
    fn name(self) -> String {
        match self {
            Tracer::Run(c) => format!(
                "{} --boundary {}{}{}{}",
                if c.old {
                    "baseline xlap-trace"
                } else {
                    "xlap-trace"
                },
                c.boundary,
                if c.points == "all" {
                    String::new()
                } else {
                    format!(" --points {}", c.points)
                },
                if c.sample.is_empty() {
                    String::new()
                } else {
                    format!(" --sample {}", c.sample)
                },
                if c.stats == "sampled" {
                    String::new()
                } else {
                    format!(" --bpf-stats {}", c.stats)
                },
            ),
            other => other.label().to_string(),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Tracer::Run(_) => "a recording configuration",
            Tracer::None => "untraced",
            Tracer::Bpftrace => "DIY bpftrace script (6 net tracepoints)",
            Tracer::Xlap { stats: "full" } => {
                "xlap-trace --boundary syscalls, every kernel point, --bpf-stats full"
            }
            Tracer::Xlap { stats: "off" } => {
                "xlap-trace --boundary syscalls, every kernel point, --bpf-stats off"
            }
            Tracer::Xlap { .. } => {
                "xlap-trace --boundary syscalls, every kernel point (statistics sampled)"
            }
            Tracer::Auto => {
                "xlap-trace (the default, --boundary auto), every kernel point, --bpf-stats off"
            }
            Tracer::Points("standard") => "xlap-trace --boundary syscalls --points standard",
            Tracer::Points(_) => "xlap-trace --boundary syscalls --points minimal",
            Tracer::SocketCalls("all") => "xlap-trace --boundary socket-calls, every kernel point",
            Tracer::SocketCalls(_) => "xlap-trace --boundary socket-calls --points minimal",
            Tracer::Sampled("1/16") => "xlap-trace --boundary socket-calls --sample 1/16",
            Tracer::Sampled(_) => "xlap-trace --boundary socket-calls --sample 1/64",
            Tracer::Empty {
                boundary: "syscalls",
                ..
            } => "empty programs on the hooks of every kernel point, at the syscalls",
            Tracer::Empty { points: "all", .. } => {
                "empty programs on the hooks of --boundary socket-calls, every kernel point"
            }
            Tracer::Empty { .. } => {
                "empty programs on the hooks of --boundary socket-calls --points minimal"
            }
            Tracer::Baseline(None) => "baseline xlap-trace, every kernel point",
            Tracer::Baseline(Some("syscalls")) => {
                "baseline xlap-trace, every kernel point, --boundary syscalls"
            }
            Tracer::Baseline(Some("socket-calls")) => {
                "baseline xlap-trace, every kernel point, --boundary socket-calls"
            }
            Tracer::Baseline(Some(_)) => "baseline xlap-trace, every kernel point, --boundary auto",
        }
    }
}

/// What one cell (tracer × pinning) gathered over its rounds.
#[derive(Default)]
struct Cell {
    /// Half round trips, µs, as sockperf logged them.
    latencies_us: Vec<f64>,
    /// Messages measured (after sockperf's warm-up) and their time span.
    messages: u64,
    seconds: f64,
    /// Every message the client sent, warm-up included (what the capture
    /// programs saw).
    sent: u64,
    /// program -> (runs, run time ns), xlap-trace with statistics only.
    programs: BTreeMap<String, (u64, u64)>,
    stamps: u64,
    lost: u64,
}

fn main() -> Result<()> {
    xlap_bench::args::check(
        "usage: xlap-bench-perturb [--quick] [--seconds S] [--rounds R] [--baseline XLAP_TRACE [--baseline-boundary B]] [--programs]\nHow much tracing perturbs sockperf ping-pong, every configuration side by side (docs/performance.md); writes bench-results/perturbation.json.\n--programs: only the programs' cost above the floor of their hooks, pinned, this build and --baseline's (bench-results/programs.json).",
        // `just bench` gives both parts the same arguments: the capture
        // part's own are accepted here too
        &["--quick", "--no-capture", "--programs"],
        &[
            "--seconds",
            "--rounds",
            "--baseline",
            "--baseline-boundary",
            "--loads",
        ],
    )?;
    if let Some(reason) = privileged_unavailable() {
        bail!("the benchmark loads BPF and builds a stage: {reason}");
    }
    for tool in ["sockperf", "bpftrace", "taskset"] {
        if Command::new(tool).arg("--version").output().is_err() {
            bail!("{tool} is missing: ./run.sh setup installs it");
        }
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let seconds = arg_value("--seconds")?.unwrap_or(if quick { 2 } else { 5 });
    let rounds = arg_value("--rounds")?.unwrap_or(if quick { 1 } else { 3 });
    let baseline = baseline_binary()?;
    if std::env::args().any(|a| a == "--programs") {
        return programs::run(baseline.as_deref(), rounds, seconds);
    }
    let mut tracers = vec![
        Tracer::None,
        Tracer::Bpftrace,
        Tracer::Xlap { stats: "sampled" },
        Tracer::Xlap { stats: "full" },
        Tracer::Xlap { stats: "off" },
        Tracer::Auto,
        Tracer::Points("standard"),
        Tracer::Points("minimal"),
        Tracer::SocketCalls("all"),
        Tracer::SocketCalls("minimal"),
        Tracer::Sampled("1/16"),
        Tracer::Sampled("1/64"),
        Tracer::Empty {
            boundary: "syscalls",
            points: "all",
        },
        Tracer::Empty {
            boundary: "socket-calls",
            points: "all",
        },
        Tracer::Empty {
            boundary: "socket-calls",
            points: "minimal",
        },
    ];
    let baseline_boundary = match arg_value::<String>("--baseline-boundary")?.as_deref() {
        None => None,
        Some("syscalls") => Some("syscalls"),
        Some("socket-calls") => Some("socket-calls"),
        Some("auto") => Some("auto"),
        Some(other) => bail!("--baseline-boundary {other}: one of syscalls, socket-calls, auto"),
    };
    if baseline_boundary.is_some() && baseline.is_none() {
        bail!("--baseline-boundary needs --baseline XLAP_TRACE");
    }
    if baseline.is_some() {
        tracers.push(Tracer::Baseline(baseline_boundary));
    }
    let stage = Stage::two_hosts().context("building the stage")?;
    let mut cells: BTreeMap<(bool, usize), Cell> = BTreeMap::new();
    let total = rounds * 2 * tracers.len() as u64;
    let mut done = 0;
    for round in 0..rounds {
        for pinned in [true, false] {
            for (i, tracer) in tracers.iter().enumerate() {
                done += 1;
                eprintln!(
                    "xlap-bench-perturb: [{done}/{total}] round {}, {}, {}",
                    round + 1,
                    if pinned { "pinned" } else { "unpinned" },
                    tracer.name()
                );
                let cell = cells.entry((pinned, i)).or_default();
                one_run(&stage, *tracer, baseline.as_deref(), pinned, seconds, cell)
                    .with_context(|| format!("{} ({})", tracer.name(), round + 1))?;
            }
        }
    }
    let machine = machine_syscalls(&stage, &tracers, baseline.as_deref(), rounds)?;
    let monitoring = monitoring(&stage, rounds, seconds)?;
    let mut report = print_report(&tracers, &mut cells, rounds, seconds);
    report["machine_syscalls"] = machine;
    report["monitoring"] = monitoring;
    xlap_bench::write_results("perturbation.json", &report)
}

/// One sockperf ping-pong of `seconds`, traced by `tracer`.
fn one_run(
    stage: &Stage,
    tracer: Tracer,
    baseline: Option<&Path>,
    pinned: bool,
    seconds: u64,
    cell: &mut Cell,
) -> Result<()> {
    let (a, b) = (stage.host(0), stage.host(1));
    let scratch = Scratch::new("bench-perturb");
    // Both ends exec into sockperf (the pid the tracer follows is sockperf's).
    let pin = if pinned { "taskset -c 0" } else { "" };
    let server_addr = b.ipv4.to_string();
    let server = sockperf_server(b, pin)?;
    let (mut client, start, log) = sockperf_client(
        a,
        &scratch,
        &format!(
            "{pin} sockperf ping-pong -i {server_addr} -p {PORT} -m 64 --mps=max -t {seconds}"
        ),
    )?;
    let pids = [client.0.id(), server.0.id()];
    let (diy, recorder) = start_tracer(tracer, &pids, &scratch, baseline)?;
    std::fs::write(&start, "go")?;
    let status = client.0.wait()?;
    if !status.success() {
        bail!("sockperf ping-pong failed ({status})");
    }
    drop(server); // the recorder ends once both traced processes are gone
    if let Some(mut d) = diy {
        // SIGINT: bpftrace runs its END block and detaches.
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(d.0.id() as i32, libc::SIGINT) };
        let _ = d.0.wait();
    }
    if let Some(rec) = recorder {
        let meta = rec.meta_after_wait();
        cell.stamps += meta.stamps;
        cell.lost += meta.lost;
        for (name, p) in &meta.bpf_programs {
            let e = cell.programs.entry(name.clone()).or_default();
            e.0 += p.run_count;
            e.1 += p.run_time_ns;
        }
    }
    let (latencies, duration, sent) = read_full_log(&log)?;
    cell.sent += sent;
    cell.messages += latencies.len() as u64;
    cell.seconds += duration;
    cell.latencies_us.extend(latencies);
    Ok(())
}

/// A sockperf client on host `a` (`command`: what it execs, without its
/// log), waiting for the start file it returns before it starts, and its
/// `--full-log` file.
fn sockperf_client(
    a: &xlap_stage::Host,
    scratch: &Scratch,
    command: &str,
) -> Result<(KillOnDrop, std::path::PathBuf, std::path::PathBuf)> {
    let start = scratch.path("start");
    let log = scratch.path("full.csv");
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; exec {command} --full-log '{}'",
        start.display(),
        log.display()
    );
    let client = KillOnDrop(
        a.command("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("sockperf client")?,
    );
    Ok((client, start, log))
}

/// A sockperf server on host `b` (`pin`: a taskset prefix or ""), given
/// the moment it takes to listen. It execs into sockperf: the pid a tracer
/// follows is sockperf's.
fn sockperf_server(b: &xlap_stage::Host, pin: &str) -> Result<KillOnDrop> {
    let server = KillOnDrop(
        b.command("sh")
            .args([
                "-c",
                &format!("exec {pin} sockperf server -i {} -p {PORT}", b.ipv4),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("sockperf server")?,
    );
    std::thread::sleep(Duration::from_millis(300));
    Ok(server)
}

/// Starts `tracer` on `pids`: the DIY script, or a recorder.
fn start_tracer(
    tracer: Tracer,
    pids: &[u32],
    scratch: &Scratch,
    baseline: Option<&Path>,
) -> Result<(Option<KillOnDrop>, Option<Recorder>)> {
    let mut args = vec![
        "--quiet",
        "--no-correlate",
        "--no-usdt",
        "--proto",
        "sockperf",
    ];
    match tracer {
        Tracer::None => return Ok((None, None)),
        Tracer::Bpftrace => return Ok((Some(start_bpftrace(scratch)?), None)),
        Tracer::Xlap { stats } => args.extend(["--boundary", "syscalls", "--bpf-stats", stats]),
        Tracer::Points(set) => args.extend(["--boundary", "syscalls", "--points", set]),
        Tracer::Auto => args.extend(["--boundary", "auto", "--bpf-stats", "off"]),
        Tracer::SocketCalls(set) => args.extend(["--boundary", "socket-calls", "--points", set]),
        Tracer::Sampled(rate) => args.extend(["--boundary", "socket-calls", "--sample", rate]),
        Tracer::Empty { boundary, points } => args.extend([
            "--boundary",
            boundary,
            "--points",
            points,
            "--empty-programs",
            "--bpf-stats",
            "off",
        ]),
        Tracer::Baseline(None) => {}
        Tracer::Baseline(Some(boundary)) => args.extend(["--boundary", boundary]),
        Tracer::Run(c) => {
            args.extend([
                "--boundary",
                c.boundary,
                "--points",
                c.points,
                "--bpf-stats",
                c.stats,
            ]);
            if !c.sample.is_empty() {
                args.extend(["--sample", c.sample]);
            }
        }
    }
    let binary = match (tracer, baseline) {
        (Tracer::Baseline(_), Some(b)) => b.to_path_buf(),
        (Tracer::Run(RunConfig { old: true, .. }), Some(b)) => b.to_path_buf(),
        (Tracer::Run(RunConfig { old: true, .. }), None) => {
            bail!("an old build's run needs --baseline")
        }
        _ => bin("xlap-trace"),
    };
    Ok((
        None,
        Some(Recorder::start_binary(
            &binary,
            pids,
            &scratch.path("run"),
            &args,
        )),
    ))
}

/// An untraced process's syscalls while each tracer traces an idle
/// sockperf server: ns per getppid, in a loop pinned to CPU 1 in this
/// (untraced) process. While anything is attached to the syscall
/// tracepoints, every task of the machine takes the slow syscall path.
fn machine_syscalls(
    stage: &Stage,
    tracers: &[Tracer],
    baseline: Option<&Path>,
    rounds: u64,
) -> Result<Value> {
    const CALLS: u32 = 2_000_000;
    let configs: Vec<Tracer> = tracers
        .iter()
        .copied()
        .filter(|t| {
            matches!(
                t,
                Tracer::None
                    | Tracer::Bpftrace
                    | Tracer::Xlap { stats: "off" }
                    | Tracer::Auto
                    | Tracer::SocketCalls("all")
                    | Tracer::Baseline(_)
            )
        })
        .collect();
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..rounds {
        for (i, tracer) in configs.iter().enumerate() {
            eprintln!(
                "xlap-bench-perturb: the rest of the machine, round {}, {}",
                round + 1,
                tracer.name()
            );
            let scratch = Scratch::new("bench-syscalls");
            let server = sockperf_server(stage.host(1), "")?;
            let (diy, recorder) = start_tracer(*tracer, &[server.0.id()], &scratch, baseline)?;
            let per_call = std::thread::spawn(move || {
                let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                // SAFETY: a zeroed cpu_set_t, CPU 1 set; applies to this thread.
                unsafe {
                    libc::CPU_SET(1, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
                }
                let t0 = Instant::now();
                for _ in 0..CALLS {
                    // SAFETY: getppid has no arguments and no side effects.
                    std::hint::black_box(unsafe { libc::getppid() });
                }
                t0.elapsed().as_nanos() as f64 / CALLS as f64
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the getppid loop panicked"))?;
            ns[i].push(per_call);
            drop(server);
            if let Some(mut d) = diy {
                // SAFETY: kill on our own child's pid.
                unsafe { libc::kill(d.0.id() as i32, libc::SIGINT) };
                let _ = d.0.wait();
            }
            if let Some(rec) = recorder {
                rec.wait();
            }
        }
    }
    println!("\n## The rest of the machine: an untraced process's getppid while each tracer traces an idle sockperf server ({rounds} interleaved rounds of {CALLS} calls, CPU 1)\n");
    println!("| configuration | ns per getppid (median of rounds) | ratio of untraced rate |\n|---|---|---|");
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(&mut ns[0]);
    let mut rows = Vec::new();
    for (i, tracer) in configs.iter().enumerate() {
        let m = median(&mut ns[i]);
        println!("| {} | {m:.0} | {:.2} |", tracer.name(), base / m);
        rows.push(
            json!({"configuration": tracer.name(), "ns_per_getppid": m, "rate_ratio": base / m}),
        );
    }
    Ok(Value::Array(rows))
}

/// Always-on monitoring: sockperf under-load across the stage at
/// MONITOR_MPS requests per second, each answered (twice that many
/// datagrams), untraced and traced as a production host would be: at the
/// socket calls, sampled, metrics served, the files a bounded rotation.
/// The protocol's p50 and the recorder's CPU (its /proc stat over the
/// load, start-up and the last write left out).
fn monitoring(stage: &Stage, rounds: u64, seconds: u64) -> Result<Value> {
    const MONITOR_MPS: u32 = 50_000;
    let monitor = |sample: &'static str| {
        let mut args = vec![
            "--boundary",
            "socket-calls",
            "--metrics",
            "127.0.0.1:0",
            "--rotate",
            "16MiB",
            "--max-size",
            "64MiB",
        ];
        if !sample.is_empty() {
            args.extend(["--sample", sample]);
        }
        args
    };
    // The floor: the same hooks, every program returning at once.
    let empty = [monitor(""), vec!["--empty-programs"]].concat();
    let configs: [(&str, Option<Vec<&str>>); 5] = [
        ("untraced", None),
        ("--sample 1/64 --metrics, rotated", Some(monitor("1/64"))),
        ("--sample 1/16 --metrics, rotated", Some(monitor("1/16"))),
        ("every datagram --metrics, rotated", Some(monitor(""))),
        (
            "empty programs on the same hooks (--empty-programs)",
            Some(empty),
        ),
    ];
    let mut p50s: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let (a, b) = (stage.host(0), stage.host(1));
    for round in 0..rounds {
        for (i, (name, args)) in configs.iter().enumerate() {
            eprintln!(
                "xlap-bench-perturb: monitoring at {MONITOR_MPS} requests/s, round {}, {name}",
                round + 1
            );
            let scratch = Scratch::new("bench-monitor");
            let server = sockperf_server(b, "")?;
            let (mut client, start, log) = sockperf_client(
                a,
                &scratch,
                &format!(
                    "sockperf under-load -i {} -p {PORT} -m 64 --mps {MONITOR_MPS} --reply-every 1 -t {seconds}",
                    b.ipv4
                ),
            )?;
            let mut args: Vec<&str> = args.clone().unwrap_or_default();
            let recorder = if args.is_empty() {
                None
            } else {
                args.extend([
                    "--quiet",
                    "--no-correlate",
                    "--no-usdt",
                    "--proto",
                    "sockperf",
                ]);
                Some(Recorder::start(
                    &[client.0.id(), server.0.id()],
                    &scratch.path("run"),
                    &args,
                ))
            };
            let cpu_at = |r: &Option<Recorder>| r.as_ref().map(|r| process_cpu_s(r.child.id()));
            let (t0, c0) = (Instant::now(), cpu_at(&recorder));
            std::fs::write(&start, "go")?;
            let status = client.0.wait()?;
            if !status.success() {
                bail!("sockperf under-load failed ({status})");
            }
            if let (Some(c0), Some(c1)) = (c0, cpu_at(&recorder)) {
                cpu[i].push((c1? - c0?) / t0.elapsed().as_secs_f64());
            }
            drop(server);
            if let Some(r) = recorder {
                r.wait();
            }
            let (mut latencies, _, _) = read_full_log(&log)?;
            latencies.sort_by(f64::total_cmp);
            p50s[i].push(percentile(&latencies, 0.5));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    println!("\n## Always-on monitoring: sockperf under-load, {MONITOR_MPS} requests/s each answered, unpinned, --boundary socket-calls, --metrics, --rotate 16MiB --max-size 64MiB ({rounds} interleaved rounds of {seconds} s)\n");
    println!("| configuration | p50 µs (median of rounds) | ratio p50 | recorder CPU, share of one core |\n|---|---|---|---|");
    let base = median(&mut p50s[0]).unwrap_or(f64::NAN);
    let mut rows = Vec::new();
    for (i, (name, _)) in configs.iter().enumerate() {
        let p50 = median(&mut p50s[i]).unwrap_or(f64::NAN);
        let share = median(&mut cpu[i]);
        println!(
            "| {name} | {p50:.1} | {:.2} | {} |",
            p50 / base,
            share.map_or(String::new(), |s| format!("{:.1} %", s * 100.0))
        );
        rows.push(json!({"configuration": name, "p50_us": p50, "p50_ratio": p50 / base, "recorder_cpu_share": share}));
    }
    Ok(Value::Array(rows))
}

/// CPU seconds (user + system) process `pid` has used so far, all its
/// threads.
fn process_cpu_s(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which may hold spaces: utime and
    // stime are the 14th and 15th of the line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// Starts the DIY script and waits until its probes are attached.
fn start_bpftrace(scratch: &Scratch) -> Result<KillOnDrop> {
    let script = scratch.path("diy-net.bt");
    std::fs::write(&script, DIY_SCRIPT)?;
    let out = scratch.path("bpftrace.out");
    let err = scratch.path("bpftrace.err");
    // bpftrace finds tracepoints in tracefs, which a machine may not have
    // mounted (xlap-trace does not need it): then it runs in a mount
    // namespace of its own with tracefs mounted there, the host left as
    // it was. `exec` keeps its pid, which the round's SIGINT is sent to.
    let tracefs = [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .iter()
    .any(|p| Path::new(p).is_dir());
    let mut command = if tracefs {
        Command::new("bpftrace")
    } else {
        let mut c = Command::new("unshare");
        c.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tracefs nodev /sys/kernel/tracing && exec bpftrace \"$@\"",
            "sh",
        ]);
        c
    };
    let child = command
        .arg(&script)
        .env("BPFTRACE_MAP_KEYS_MAX", "1000000")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?)
        .spawn()
        .context("bpftrace")?;
    let mut child = KillOnDrop(child);
    let t0 = Instant::now();
    loop {
        if std::fs::read_to_string(&out)?.contains("Attaching") {
            // It prints before attaching: give it the moment it takes.
            std::thread::sleep(Duration::from_millis(500));
            return Ok(child);
        }
        if let Some(status) = child.0.try_wait()? {
            let said = std::fs::read_to_string(&err).unwrap_or_default();
            bail!(
                "bpftrace exited ({status}) before attaching: {}",
                said.lines()
                    .filter(|l| l.contains("ERROR") && !l.contains("RLIMIT_MEMLOCK"))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("bpftrace did not attach within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// sockperf's `--full-log`: `packet, txTime(sec), rxTime(sec), latency(usec)`
/// rows of the measured (post-warm-up) messages, after a `[Total Run]` line
/// that counts every message sent. Returns the latencies, the span they
/// cover (seconds) and the messages sent.
fn read_full_log(path: &Path) -> Result<(Vec<f64>, f64, u64)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("sockperf wrote no full log at {}", path.display()))?;
    let mut latencies = Vec::new();
    let (mut first, mut last) = (f64::MAX, 0f64);
    let sent: u64 = text
        .lines()
        .find(|l| l.contains("[Total Run]"))
        .and_then(|l| l.split("SentMessages=").nth(1))
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no [Total Run] SentMessages in {}", path.display()))?;
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 4 || f[0].parse::<u64>().is_err() {
            continue;
        }
        let (tx, rx, lat): (f64, f64, f64) = (f[1].parse()?, f[2].parse()?, f[3].parse()?);
        first = first.min(tx);
        last = last.max(rx);
        latencies.push(lat);
    }
    if latencies.is_empty() {
        bail!("sockperf's full log {} has no messages", path.display());
    }
    Ok((latencies, (last - first).max(1e-6), sent))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn print_report(
    tracers: &[Tracer],
    cells: &mut BTreeMap<(bool, usize), Cell>,
    rounds: u64,
    seconds: u64,
) -> Value {
    let mut rows = Vec::new();
    for pinned in [true, false] {
        println!(
            "\n## Perturbation: sockperf ping-pong, 64 B, --mps=max, {} ({rounds} interleaved rounds of {seconds} s)\n",
            if pinned { "client and server pinned to CPU 0" } else { "unpinned" }
        );
        println!("| configuration | half-RTT p50 µs | p99 µs | p99.9 µs | ratio p50 | ratio p99 | ratio p99.9 | messages/s | rate ratio | stamps | lost |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        let mut base = None;
        for (i, tracer) in tracers.iter().enumerate() {
            let cell = cells.get_mut(&(pinned, i)).expect("every cell ran");
            cell.latencies_us.sort_by(f64::total_cmp);
            let l = &cell.latencies_us;
            let (p50, p99, p999) = (
                percentile(l, 0.5),
                percentile(l, 0.99),
                percentile(l, 0.999),
            );
            let rate = cell.messages as f64 / cell.seconds;
            let (b50, b99, b999, brate) = *base.get_or_insert((p50, p99, p999, rate));
            let traced = !matches!(tracer, Tracer::None | Tracer::Bpftrace);
            println!(
                "| {} | {p50:.1} | {p99:.1} | {p999:.1} | {:.2} | {:.2} | {:.2} | {rate:.0} | {:.2} | {} | {} |",
                tracer.name(),
                p50 / b50,
                p99 / b99,
                p999 / b999,
                rate / brate,
                if traced { cell.stamps.to_string() } else { "".into() },
                if traced { cell.lost.to_string() } else { "".into() },
            );
            rows.push(json!({
                "pinned": pinned, "configuration": tracer.name(),
                "p50_us": p50, "p99_us": p99, "p999_us": p999,
                "ratio_p50": p50 / b50, "ratio_p99": p99 / b99, "ratio_p999": p999 / b999,
                "messages_per_s": rate, "rate_ratio": rate / brate,
                "stamps": traced.then_some(cell.stamps), "lost": traced.then_some(cell.lost),
            }));
        }
    }
    // Where xlap-trace's time goes: the pinned cell with statistics.
    let stats_cell = tracers
        .iter()
        .position(|t| *t == Tracer::Xlap { stats: "full" })
        .and_then(|i| cells.get(&(true, i)))
        .expect("the statistics cell ran");
    let trips = stats_cell.sent.max(1) as f64;
    println!("\n## Capture programs per round trip (pinned, --bpf-stats full: 2 datagrams per round trip)\n");
    println!(
        "| program | runs per round trip | ns per run | ns per round trip |\n|---|---|---|---|"
    );
    let mut programs: Vec<_> = stats_cell
        .programs
        .iter()
        .filter(|(_, (runs, _))| *runs > 0)
        .map(|(name, (runs, ns))| {
            (
                name.clone(),
                *runs as f64 / trips,
                *ns as f64 / *runs as f64,
                *ns as f64 / trips,
            )
        })
        .collect();
    programs.sort_by(|a, b| b.3.total_cmp(&a.3));
    let mut breakdown = Vec::new();
    for (name, per_trip, per_run, ns_trip) in &programs {
        println!("| {name} | {per_trip:.2} | {per_run:.0} | {ns_trip:.0} |");
        breakdown.push(json!({"program": name, "runs_per_round_trip": per_trip, "ns_per_run": per_run, "ns_per_round_trip": ns_trip}));
    }
    let sum: f64 = programs.iter().map(|p| p.3).sum();
    println!("| total | | | {sum:.0} |");
    json!({"rounds": rounds, "seconds": seconds, "matrix": rows, "programs_per_round_trip": breakdown})
}
