//! `just bench`: what tracing costs, measured side by side in one run.
//!
//! 1. The floor of this machine's BPF (empty program, one hash lookup, one
//!    ring-buffer record) with the kernel's run-time statistics.
//! 2. Capture: the example protocol (no markers) across the stage at rising
//!    packet rates, traced by `xlap-trace record`: stamps per second, losses,
//!    BPF run time per stamp.
//! 3. Perturbation: the protocol's own end-to-end latency untraced, traced
//!    (kernel points) and traced with USDT markers, interleaved runs of the
//!    same workload.
//!
//! Prints Markdown and writes `bench-results/capture.json`.

use anyhow::{Context, Result};
use aya::programs::BtfTracePoint;
use aya::{Btf, EbpfLoader};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use xlap_stage::{Qdisc, Stage, StageConfig};
use xlap_tests::example::{events, summary, ExampleOptions, ProtocolRun};
use xlap_tests::trace::Recorder;
use xlap_tests::{privileged_unavailable, Scratch};

/// The perturbation workload: 10 000 packets/s, the rate the issue's
/// acceptance runs use.
const PERTURB_PERIOD_US: u64 = 100;

fn main() -> Result<()> {
    if let Some(reason) = privileged_unavailable() {
        anyhow::bail!("the benchmark loads BPF and builds a stage: {reason}");
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let floor = calibrate(Duration::from_secs(if quick { 1 } else { 3 }))?;
    println!("## BPF cost floor on this machine (sched_switch, run-time statistics)\n");
    println!("| program | runs | ns/run |\n|---|---|---|");
    for (name, runs, ns) in &floor {
        println!("| {name} | {runs} | {ns:.0} |");
    }

    let stage = Stage::build(&StageConfig {
        hosts: 2,
        qdiscs: vec![Some(Qdisc::parse("tbf:10gbit:1mb").expect("valid")), None],
    })?;
    println!("\n## Capture throughput (example protocol, no markers, tbf on the sender)\n");
    println!("| period µs | packets/s offered | stamps | stamps/s | lost | BPF ns/stamp | ns/stamp net of floor |");
    println!("|---|---|---|---|---|---|---|");
    let empty_ns = floor
        .iter()
        .find(|f| f.0 == "cal_empty")
        .map_or(0.0, |f| f.2);
    let mut sweep = Vec::new();
    let periods: &[u64] = if quick {
        &[100, 20]
    } else {
        &[200, 50, 20, 10, 5]
    };
    for &period in periods {
        let count = (2_000_000 / period).clamp(2_000, 200_000) as u32;
        let r = traced_run(&stage, period, count, false, true)?;
        let meta = r.meta.as_ref().expect("traced");
        let stamps = meta["stamps"].as_u64().unwrap_or(0);
        let lost = meta["lost"].as_u64().unwrap_or(0);
        let per_stamp = meta["bpf_ns_per_stamp"].as_f64().unwrap_or(f64::NAN);
        let programs = meta["bpf_programs"].as_object().map_or(0, |p| {
            p.values()
                .map(|v| v["run_count"].as_u64().unwrap_or(0))
                .sum::<u64>()
        });
        let net = per_stamp - empty_ns * programs as f64 / stamps.max(1) as f64;
        let rate = stamps as f64 / r.seconds;
        println!(
            "| {period} | {:.0} | {stamps} | {rate:.0} | {lost} | {per_stamp:.0} | {net:.0} |",
            r.packets as f64 / r.seconds
        );
        sweep.push(json!({"period_us": period, "packets": r.packets, "seconds": r.seconds, "stamps": stamps,
            "stamps_per_s": rate, "lost": lost, "bpf_ns_per_stamp": per_stamp, "net_ns_per_stamp": net,
            "programs": meta["bpf_programs"]}));
    }

    let rounds = if quick { 1 } else { 3 };
    let count: u32 = if quick { 3_000 } else { 10_000 };
    println!(
        "\n## Perturbation of the protocol's end-to-end latency ({count} packets every {PERTURB_PERIOD_US} µs, {rounds} interleaved rounds)\n"
    );
    println!("| configuration | p50 µs | p99 µs | p99.9 µs | ratio p50 | ratio p99 |\n|---|---|---|---|---|---|");
    let configs: [(&str, bool, bool); 4] = [
        ("untraced, plain build", false, false),
        ("untraced, markers build", true, false),
        ("traced, kernel points", false, true),
        ("traced, kernel + USDT", true, true),
    ];
    let mut lat: Vec<Vec<u64>> = vec![Vec::new(); configs.len()];
    for _ in 0..rounds {
        for (i, (_, markers, traced)) in configs.iter().enumerate() {
            let r = traced_run(&stage, PERTURB_PERIOD_US, count, *markers, *traced)?;
            lat[i].extend(r.latencies);
        }
    }
    let pct = |v: &mut Vec<u64>, p: f64| -> f64 {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * p) as usize] as f64 / 1e3
    };
    let base50 = pct(&mut lat[0], 0.5);
    let base99 = pct(&mut lat[0], 0.99);
    let mut perturbation = Vec::new();
    for (i, (name, _, _)) in configs.iter().enumerate() {
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
        perturbation
            .push(json!({"configuration": name, "p50_us": p50, "p99_us": p99, "p999_us": p999}));
    }
    std::fs::create_dir_all("bench-results")?;
    let report = json!({"floor": floor.iter().map(|(n, r, ns)| json!({"program": n, "runs": r, "ns_per_run": ns})).collect::<Vec<_>>(),
        "capture": sweep, "perturbation": perturbation});
    std::fs::write(
        "bench-results/capture.json",
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    println!("\nwrote bench-results/capture.json");
    Ok(())
}

/// (program, runs, ns per run) of the calibration programs.
fn calibrate(duration: Duration) -> Result<Vec<(String, u64, f64)>> {
    let mut bpf = EbpfLoader::new().load(xlap_trace::capture::CALIBRATE_OBJECT)?;
    let btf = Btf::from_sys_fs()?;
    let names = ["cal_empty", "cal_lookup", "cal_emit"];
    for name in names {
        let p: &mut BtfTracePoint = bpf.program_mut(name).context(name)?.try_into()?;
        p.load("sched_switch", &btf)?;
        p.attach()?;
    }
    let mut ring = aya::maps::RingBuf::try_from(bpf.take_map("CAL_RING").context("ring")?)?;
    let _stats = xlap_trace::capture::enable_stats().context("cannot enable BPF statistics")?;
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
    meta: Option<Value>,
    latencies: Vec<u64>,
}

fn traced_run(
    stage: &Stage,
    period_us: u64,
    count: u32,
    markers: bool,
    traced: bool,
) -> Result<RunResult> {
    let scratch = Scratch::new(&format!("bench-{period_us}-{markers}-{traced}"));
    let run = ProtocolRun::spawn(
        stage,
        &scratch,
        &ExampleOptions {
            count,
            period_us,
            markers,
            gated: true,
            recv_args: vec!["--deadline-ms".into(), "1000".into()],
            ..Default::default()
        },
    );
    let (s, r) = run.pids();
    let rec = traced.then(|| Recorder::start(&[s, r], &scratch.path("run"), &["--quiet"]));
    run.start();
    let (sent, received) = run.wait();
    let meta = rec.map(|r| r.meta_after_wait());
    let times: Vec<u64> = events(&sent, "sent")
        .map(|e| e["t_ns"].as_u64().unwrap_or(0))
        .collect();
    let seconds =
        (times.iter().max().unwrap_or(&0) - times.iter().min().unwrap_or(&0)) as f64 / 1e9;
    let latencies = events(&received, "delivered")
        .filter_map(|e| e["latency_ns"].as_u64())
        .collect();
    let packets = summary(&sent)["sent"].as_u64().unwrap_or(0)
        + summary(&received)["feedback_sent"].as_u64().unwrap_or(0);
    Ok(RunResult {
        packets,
        seconds: seconds.max(1e-3),
        meta,
        latencies,
    })
}
