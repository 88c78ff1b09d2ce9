//! `just bench`: what tracing costs, measured side by side in one run.
//!
//! 1. The floor of this machine's BPF (empty program, one hash lookup, one
//!    ring-buffer record) with the kernel's run-time statistics.
//! 2. Capture: the example protocol (no markers) across the stage at rising
//!    packet rates (up to several sender/receiver pairs at once), traced by
//!    `xlap-trace record` in both export modes side by side (one ring-buffer
//!    record per stamp, and per-CPU batches, the default): stamps per second,
//!    losses, BPF run time per stamp; the highest lossless stamp rate.
//! 3. Perturbation: the protocol's own end-to-end latency untraced, traced
//!    (kernel points) and traced with USDT markers, interleaved runs of the
//!    same workload.
//!
//! 4. Start: `record` to ready, with the verifier's instructions per program
//!    (`start.rs`).
//!
//! `--baseline PATH`: also runs every load and perturbation round with
//! another `xlap-trace` binary (an older build, per-CPU batches),
//! interleaved with this one, so a change's cost is a ratio measured in the
//! same run. `--rounds N` sets the perturbation rounds, `--no-capture`
//! skips the throughput sweep.
//!
//! Prints Markdown and writes `bench-results/capture.json`.

use anyhow::{Context, Result};
use aya::programs::BtfTracePoint;
use aya::{Btf, EbpfLoader};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use xlap_bench::args::{arg_value, baseline_binary};
use xlap_stage::{Qdisc, Stage, StageConfig};
use xlap_tests::example::{events, summary, ExampleOptions, ProtocolRun};
use xlap_tests::trace::Recorder;
use xlap_tests::{privileged_unavailable, Scratch};

/// The perturbation workload: 10 000 packets/s, the rate the issue's
/// acceptance runs use.
const PERTURB_PERIOD_US: u64 = 100;

fn main() -> Result<()> {
    xlap_bench::args::check(
        "usage: xlap-bench [--quick] [--no-capture] [--loads PAIRSxPERIOD_US,...] [--rounds R] [--baseline XLAP_TRACE]\nThe BPF cost floor and capture at rising loads (docs/performance.md); writes bench-results/capture.json.",
        // `just bench` gives both parts the same arguments: the
        // perturbation part's own are accepted here too
        &["--quick", "--no-capture"],
        &["--loads", "--rounds", "--baseline", "--seconds"],
    )?;
    if let Some(reason) = privileged_unavailable() {
        anyhow::bail!("the benchmark loads BPF and builds a stage: {reason}");
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let baseline = baseline_binary()?;
    let floor = calibrate(Duration::from_secs(if quick { 1 } else { 3 }))?;
    println!("## BPF cost floor on this machine (sched_switch, run-time statistics)\n");
    println!("| program | runs | ns/run |\n|---|---|---|");
    for (name, runs, ns) in &floor {
        println!("| {name} | {runs} | {ns:.0} |");
    }

    let start_rounds = if quick { 2 } else { 5 };
    let this_build = xlap_tests::bin("xlap-trace");
    let mut builds = vec![this_build.as_path()];
    builds.extend(baseline.as_deref());
    let scratch = Scratch::new("bench-start");
    let starts = xlap_bench::start::measure(&builds, start_rounds, &scratch.0)?;
    println!("\n## Start: `record` to ready ({start_rounds} rounds interleaved; the verifier's instructions, of its 1 M limit)\n");
    println!(
        "| build | median s | rounds s | largest programs (verified_insns) |\n|---|---|---|---|"
    );
    let mut start_json = Vec::new();
    for (binary, start) in builds.iter().zip(&starts) {
        let name = if *binary == this_build.as_path() {
            "this build"
        } else {
            "baseline"
        };
        let mut largest: Vec<(&String, &u64)> = start.verified_insns.iter().collect();
        largest.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
        let largest: Vec<String> = largest
            .iter()
            .take(3)
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        let rounds: Vec<String> = start.seconds.iter().map(|s| format!("{s:.2}")).collect();
        println!(
            "| {name} | {:.2} | {} | {} |",
            xlap_bench::start::median(&start.seconds),
            rounds.join(", "),
            largest.join(", ")
        );
        start_json.push(
            json!({"build": name, "binary": binary, "seconds": start.seconds,
            "verified_insns": start.verified_insns}),
        );
    }

    let stage = Stage::build(&StageConfig {
        hosts: 2,
        qdiscs: vec![Some(Qdisc::parse("tbf:10gbit:1mb").expect("valid")), None],
        ..Default::default()
    })?;
    println!("\n## Capture throughput (example protocol, no markers, tbf on the sender; both export modes per load)\n");
    println!("| pairs | period µs | export | packets/s | stamps | stamps/s | lost (ring buffer) | BPF ns/stamp | ns/stamp net of floor | reader CPU ns/stamp |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let empty_ns = floor
        .iter()
        .find(|f| f.0 == "cal_empty")
        .map_or(0.0, |f| f.2);
    let mut sweep = Vec::new();
    // (pairs, period µs): one example pair tops out near 85 k packets/s;
    // several pairs at once push the stamp rate further.
    let custom = custom_loads()?;
    let loads: &[(usize, u64)] = if let Some(l) = &custom {
        l
    } else if quick {
        &[(1, 100), (1, 20), (2, 10)]
    } else {
        &[(1, 200), (1, 50), (1, 20), (1, 10), (2, 10), (2, 5), (3, 5)]
    };
    // Highest stamp rate per export mode without any loss, and without a
    // ring-buffer loss (the export's own limit; the other reasons are
    // pairing misses of the receive path).
    let mut best: BTreeMap<(&str, &str), (f64, f64)> = BTreeMap::new();
    let loads = if std::env::args().any(|a| a == "--no-capture") {
        &[][..]
    } else {
        loads
    };
    for &(pairs, period) in loads {
        let count = (2_000_000 / period).clamp(2_000, 200_000) as u32;
        let this = xlap_tests::bin("xlap-trace");
        let mut modes: Vec<(&str, &str, &std::path::Path)> = EXPORT_MODES
            .iter()
            .map(|(mode, extra)| (*mode, *extra, this.as_path()))
            .collect();
        if let Some(b) = &baseline {
            modes.push(("baseline: per-CPU batches", "", b.as_path()));
        }
        for (mode, extra, binary) in modes {
            let load = Workload {
                pairs,
                period_us: period,
                count,
                markers: false,
                pinned: false,
            };
            let r = traced_run(&stage, &load, Some(extra), binary)?;
            let meta = r.meta.as_ref().expect("traced");
            let stamps = meta.stamps;
            let lost = meta.lost;
            let per_stamp = meta.bpf_ns_per_stamp.unwrap_or(f64::NAN);
            let programs: u64 = meta.bpf_programs.values().map(|p| p.run_count).sum();
            let ringbuf_lost: u64 = meta.points.values().map(|p| p.lost("ringbuf_full")).sum();
            let net = per_stamp - empty_ns * programs as f64 / stamps.max(1) as f64;
            let rate = stamps as f64 / r.seconds;
            let pkt_rate = r.packets as f64 / r.seconds;
            // The reader's CPU while capturing (the Parquet copy at the end
            // is not in it; recorder_cpu_s in the JSON has everything).
            let reader_ns = meta.reader_cpu_s.unwrap_or(f64::NAN) * 1e9 / stamps.max(1) as f64;
            println!(
                "| {pairs} | {period} | {mode} | {pkt_rate:.0} | {stamps} | {rate:.0} | {lost} ({ringbuf_lost}) | {per_stamp:.0} | {net:.0} | {reader_ns:.0} |"
            );
            for (what, ok) in [
                ("no loss", lost == 0),
                ("no ring-buffer loss", ringbuf_lost == 0),
            ] {
                if ok && best.get(&(mode, what)).is_none_or(|b| rate > b.0) {
                    best.insert((mode, what), (rate, pkt_rate));
                }
            }
            sweep.push(json!({"pairs": pairs, "period_us": period, "export": mode, "packets": r.packets,
                "seconds": r.seconds, "stamps": stamps, "stamps_per_s": rate, "lost": lost, "lost_ringbuf_full": ringbuf_lost,
                "recorder_cpu_s": r.recorder_cpu_s,
                "lost_by_point": meta.points, "bpf_ns_per_stamp": per_stamp, "net_ns_per_stamp": net,
                "programs": meta.bpf_programs}));
        }
    }
    println!();
    for ((mode, what), (rate, pkt_rate)) in &best {
        println!("highest rate with {what}, {mode}: {rate:.0} stamps/s ({pkt_rate:.0} packets/s)");
    }

    let rounds = if let Some(n) = arg_value("--rounds")? {
        n
    } else if custom.is_some() {
        0
    } else if quick {
        1
    } else {
        3
    };
    let count: u32 = if quick { 3_000 } else { 10_000 };
    let mut perturbation = Vec::new();
    if rounds > 0 {
        let this = xlap_tests::bin("xlap-trace");
        // (name, markers build, traced by, its extra options)
        let mut configs: Vec<(&str, bool, Option<&std::path::Path>, &str)> = vec![
            ("untraced, plain build", false, None, ""),
            ("untraced, markers build", true, None, ""),
            ("traced, kernel points", false, Some(this.as_path()), ""),
            (
                "traced, kernel points, --bpf-stats off",
                false,
                Some(this.as_path()),
                "--bpf-stats off",
            ),
            (
                "traced, kernel + USDT (markers: in-process ring)",
                true,
                Some(this.as_path()),
                "",
            ),
            (
                "traced, kernel + USDT (markers: uprobes)",
                true,
                Some(this.as_path()),
                "--marker-path uprobe",
            ),
        ];
        if let Some(b) = &baseline {
            configs.push((
                "baseline: traced, kernel points",
                false,
                Some(b.as_path()),
                "",
            ));
        }
        // Latencies per (pinned, configuration), rounds interleaved.
        let mut lat: Vec<Vec<Vec<u64>>> = vec![vec![Vec::new(); configs.len()]; 2];
        for _ in 0..rounds {
            for pinned in [false, true] {
                for (i, (_, markers, traced_by, extra)) in configs.iter().enumerate() {
                    let load = Workload {
                        pairs: 1,
                        period_us: PERTURB_PERIOD_US,
                        count,
                        markers: *markers,
                        pinned,
                    };
                    let r = traced_run(
                        &stage,
                        &load,
                        traced_by.map(|_| *extra),
                        traced_by.unwrap_or(this.as_path()),
                    )?;
                    lat[pinned as usize][i].extend(r.latencies);
                }
            }
        }
        let pct = |v: &mut Vec<u64>, p: f64| -> f64 {
            v.sort_unstable();
            v[((v.len() - 1) as f64 * p) as usize] as f64 / 1e3
        };
        for pinned in [false, true] {
            let lat = &mut lat[pinned as usize];
            println!(
                "\n## Perturbation of the protocol's end-to-end latency ({count} packets every {PERTURB_PERIOD_US} µs, {}, {rounds} interleaved rounds)\n",
                if pinned { "sender and receiver pinned to CPU 0" } else { "unpinned" }
            );
            println!("| configuration | p50 µs | p99 µs | p99.9 µs | ratio p50 | ratio p99 |\n|---|---|---|---|---|---|");
            let base50 = pct(&mut lat[0], 0.5);
            let base99 = pct(&mut lat[0], 0.99);
            for (i, (name, _, _, _)) in configs.iter().enumerate() {
                let (p50, p99, p999) = (
                    pct(&mut lat[i], 0.5),
                    pct(&mut lat[i], 0.99),
                    pct(&mut lat[i], 0.999),
                );
                println!(
                    "| {name} | {p50:.1} | {p99:.1} | {p999:.1} | {:.2} | {:.2} |",
                    p50 / base50,
                    p99 / base99
                );
                perturbation.push(json!({"configuration": name, "pinned": pinned,
                    "p50_us": p50, "p99_us": p99, "p999_us": p999,
                    "ratio_p50": p50 / base50, "ratio_p99": p99 / base99}));
            }
        }
    }
    let report = json!({"floor": floor.iter().map(|(n, r, ns)| json!({"program": n, "runs": r, "ns_per_run": ns})).collect::<Vec<_>>(),
        "capture": sweep, "highest": best.iter().map(|((m, w), (r, p))| json!({"export": m, "with": w, "stamps_per_s": r, "packets_per_s": p})).collect::<Vec<_>>(),
        "perturbation": perturbation, "start": start_json});
    xlap_bench::write_results("capture.json", &report)?;
    Ok(())
}

/// `--loads PAIRSxPERIOD,...` (e.g. `2x10,3x5`): only these capture loads,
/// no perturbation rounds.
fn custom_loads() -> Result<Option<Vec<(usize, u64)>>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == "--loads") else {
        return Ok(None);
    };
    let spec = args.get(i + 1).context("--loads needs PAIRSxPERIOD,...")?;
    spec.split(',')
        .map(|l| {
            let (p, t) = l.split_once('x').context("a load is PAIRSxPERIOD_US")?;
            Ok((p.parse()?, t.parse()?))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// (program, runs, ns per run) of the calibration programs.
fn calibrate(duration: Duration) -> Result<Vec<(String, u64, f64)>> {
    let mut bpf = EbpfLoader::new().load(xlap_capture::capture::CALIBRATE_OBJECT)?;
    let btf = Btf::from_sys_fs()?;
    let names = ["cal_empty", "cal_lookup", "cal_emit"];
    for name in names {
        let p: &mut BtfTracePoint = bpf.program_mut(name).context(name)?.try_into()?;
        p.load("sched_switch", &btf)?;
        p.attach()?;
    }
    let mut ring = aya::maps::RingBuf::try_from(bpf.take_map("CAL_RING").context("ring")?)?;
    let _stats = xlap_capture::capture::enable_stats().context("cannot enable BPF statistics")?;
    let start = Instant::now();
    // Context switches: two threads ping-ponging through a channel.
    let (tx, rx) = std::sync::mpsc::sync_channel::<u32>(0);
    let pinger = std::thread::spawn(move || {
        for i in 0.. {
            if tx.send(i).is_err() {
                break;
            }
        }
    });
    while start.elapsed() < duration {
        for _ in 0..1000 {
            let _ = rx.recv();
        }
        while ring.next().is_some() {}
    }
    drop(rx);
    let _ = pinger.join();
    let mut out = Vec::new();
    for name in names {
        let info = bpf.program(name).context(name)?.info()?;
        let runs = info.run_count();
        out.push((
            name.to_string(),
            runs,
            info.run_time().as_nanos() as f64 / runs.max(1) as f64,
        ));
    }
    Ok(out)
}

struct RunResult {
    packets: u64,
    seconds: f64,
    meta: Option<xlap_records::run_meta::RunMeta>,
    latencies: Vec<u64>,
    recorder_cpu_s: f64,
}

/// The two export modes of `xlap-trace record` (name, extra option).
const EXPORT_MODES: [(&str, &str); 2] = [
    ("record per stamp", "--per-stamp-records"),
    ("per-CPU batches", ""),
];

/// `pairs` example sender/receiver pairs at once (ports apart), traced by
/// one recorder (`binary`) with `extra` options unless `traced` is None.
/// What the protocol runs: pairs of sender and receiver, each sending
/// `count` packets every `period_us`, with or without markers, pinned to
/// CPU 0 or not.
struct Workload {
    pairs: usize,
    period_us: u64,
    count: u32,
    markers: bool,
    pinned: bool,
}

/// Pins every thread of `pid` to CPU 0 (threads it starts later inherit
/// it).
fn pin_to_cpu0(pid: u32) -> Result<()> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("threads of pid {pid}"))?;
    for task in tasks {
        let tid: i32 = task?.file_name().to_string_lossy().parse()?;
        // SAFETY: a zeroed cpu_set_t with one bit set, passed by pointer.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("sched_setaffinity");
        }
    }
    Ok(())
}

fn traced_run(
    stage: &Stage,
    load: &Workload,
    traced: Option<&str>,
    binary: &std::path::Path,
) -> Result<RunResult> {
    let Workload {
        pairs,
        period_us,
        count,
        markers,
        pinned,
    } = *load;
    let scratch = Scratch::new(&format!(
        "bench-{pairs}-{period_us}-{markers}-{}",
        traced.is_some()
    ));
    let scratches: Vec<Scratch> = (0..pairs)
        .map(|i| Scratch::new(&format!("bench-pair{i}")))
        .collect();
    let runs: Vec<ProtocolRun> = scratches
        .iter()
        .enumerate()
        .map(|(i, sc)| {
            ProtocolRun::spawn(
                stage,
                sc,
                &ExampleOptions {
                    count,
                    period_us,
                    markers,
                    gated: true,
                    recv_args: vec!["--deadline-ms".into(), "1000".into()],
                    port_offset: 10 * i as u16,
                    ..Default::default()
                },
            )
        })
        .collect();
    let pids: Vec<u32> = runs
        .iter()
        .flat_map(|r| {
            let (s, r) = r.pids();
            [s, r]
        })
        .collect();
    let rec = traced.map(|extra| {
        let mut args = vec!["--quiet", "--no-correlate"];
        args.extend(extra.split_whitespace());
        Recorder::start_binary(binary, &pids, &scratch.path("run"), &args)
    });
    if pinned {
        for &pid in &pids {
            pin_to_cpu0(pid)?;
        }
    }
    for run in &runs {
        run.start();
    }
    let logs: Vec<_> = runs.into_iter().map(ProtocolRun::wait).collect();
    // The protocol's processes are waited for already: the children's CPU
    // time that grows now is the recorder's (its reading and decoding, and
    // the Parquet copy at the end).
    let cpu_before = children_cpu_s();
    let meta = rec.map(|r| r.meta_after_wait());
    let recorder_cpu_s = children_cpu_s() - cpu_before;
    let times: Vec<u64> = logs
        .iter()
        .flat_map(|(sent, _)| events(sent, "sent").map(|e| e["t_ns"].as_u64().unwrap_or(0)))
        .collect();
    let seconds =
        (times.iter().max().unwrap_or(&0) - times.iter().min().unwrap_or(&0)) as f64 / 1e9;
    let mut latencies = Vec::new();
    let mut packets = 0;
    for (sent, received) in &logs {
        latencies.extend(events(received, "delivered").filter_map(|e| e["latency_ns"].as_u64()));
        packets += summary(sent)["sent"].as_u64().unwrap_or(0)
            + summary(received)["feedback_sent"].as_u64().unwrap_or(0);
    }
    Ok(RunResult {
        packets,
        seconds: seconds.max(1e-3),
        meta,
        latencies,
        recorder_cpu_s,
    })
}

/// User + system CPU seconds of this process's waited-for children
/// (cutime + cstime of /proc/self/stat, in clock ticks of 10 ms).
fn children_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    // fields[0] is field 3 (state): cutime is field 16, cstime 17.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(13) + ticks(14)) / 100.0
}
