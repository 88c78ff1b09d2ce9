//! `--programs`: what the capture programs themselves cost above the floor
//! of their hooks (issue 56), this build beside `--baseline`'s, pinned,
//! interleaved round by round in one run.
//!
//! Each configuration's p50 ratio to untraced is set beside the ratio of
//! empty programs on the same hooks (`--empty-programs`, which returns at
//! once in every program: the hooks' dispatch alone); the difference is the
//! programs' share. The DIY bpftrace script is the anchor a user would
//! otherwise write. Two more cells per build run every point with
//! `--bpf-stats full`: BPF ns per run and per round trip of each program,
//! and ns per stamp. Writes `bench-results/programs.json`.

use super::{one_run, percentile, Cell, RunConfig, Stage, Tracer};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The configurations of the goal rows: every point at both boundaries,
/// `--points minimal` and `--sample 1/16` at the socket calls.
const GOALS: [(&str, &str, &str); 4] = [
    ("syscalls", "all", ""),
    ("socket-calls", "all", ""),
    ("socket-calls", "minimal", ""),
    ("socket-calls", "all", "1/16"),
];

/// The floor each goal row is measured above: empty programs on its hooks
/// (a sampled run attaches the hooks of every point).
fn floor_of(boundary: &str, points: &str) -> Tracer {
    match (boundary, points) {
        ("syscalls", _) => Tracer::Empty {
            boundary: "syscalls",
            points: "all",
        },
        (_, "minimal") => Tracer::Empty {
            boundary: "socket-calls",
            points: "minimal",
        },
        _ => Tracer::Empty {
            boundary: "socket-calls",
            points: "all",
        },
    }
}

fn config(
    old: bool,
    boundary: &'static str,
    points: &'static str,
    sample: &'static str,
    stats: &'static str,
) -> Tracer {
    Tracer::Run(RunConfig {
        old,
        boundary,
        points,
        sample,
        stats,
    })
}

pub fn run(baseline: Option<&Path>, rounds: u64, seconds: u64) -> Result<()> {
    let builds: &[bool] = if baseline.is_some() {
        &[false, true]
    } else {
        &[false]
    };
    let mut tracers = vec![
        Tracer::None,
        Tracer::Bpftrace,
        floor_of("syscalls", "all"),
        floor_of("socket-calls", "all"),
        floor_of("socket-calls", "minimal"),
    ];
    for &old in builds {
        for (boundary, points, sample) in GOALS {
            tracers.push(config(old, boundary, points, sample, "sampled"));
        }
        tracers.push(config(old, "socket-calls", "all", "", "full"));
        tracers.push(config(old, "syscalls", "all", "", "full"));
    }
    let stage = Stage::two_hosts().context("building the stage")?;
    let mut cells: Vec<Cell> = tracers.iter().map(|_| Cell::default()).collect();
    let total = rounds * tracers.len() as u64;
    let mut done = 0;
    for round in 0..rounds {
        for (i, tracer) in tracers.iter().enumerate() {
            done += 1;
            eprintln!(
                "xlap-bench-perturb --programs: [{done}/{total}] round {}, {}",
                round + 1,
                tracer.name()
            );
            one_run(&stage, *tracer, baseline, true, seconds, &mut cells[i])
                .with_context(|| format!("{} ({})", tracer.name(), round + 1))?;
        }
    }
    let report = report(&tracers, &mut cells, rounds, seconds);
    xlap_bench::write_results("programs.json", &report)
}

fn p50(cell: &mut Cell) -> f64 {
    cell.latencies_us.sort_by(f64::total_cmp);
    percentile(&cell.latencies_us, 0.5)
}

fn report(tracers: &[Tracer], cells: &mut [Cell], rounds: u64, seconds: u64) -> Value {
    let untraced = p50(&mut cells[0]);
    let ratio: Vec<f64> = cells.iter_mut().map(|c| p50(c) / untraced).collect();
    let index = |t: Tracer| {
        tracers
            .iter()
            .position(|x| *x == t)
            .expect("a configuration that ran")
    };
    println!(
        "\n## The programs above their hooks' floor: sockperf ping-pong, 64 B, pinned to CPU 0 ({rounds} interleaved rounds of {seconds} s)\n"
    );
    println!("| configuration | half-RTT p50 µs | ratio p50 | floor (empty programs, same hooks) | programs' share | stamps | lost |");
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (i, tracer) in tracers.iter().enumerate() {
        let floor = match tracer {
            Tracer::Run(c) => Some(ratio[index(floor_of(c.boundary, c.points))]),
            _ => None,
        };
        let share = floor.map(|f| ratio[i] - f);
        let traced = !matches!(tracer, Tracer::None | Tracer::Bpftrace);
        println!(
            "| {} | {:.2} | {:.2} | {} | {} | {} | {} |",
            tracer.name(),
            ratio[i] * untraced,
            ratio[i],
            floor.map_or(String::new(), |f| format!("{f:.2}")),
            share.map_or(String::new(), |s| format!("{s:+.2}")),
            if traced {
                cells[i].stamps.to_string()
            } else {
                String::new()
            },
            if traced {
                cells[i].lost.to_string()
            } else {
                String::new()
            },
        );
        rows.push(json!({
            "configuration": tracer.name(), "p50_us": ratio[i] * untraced, "ratio_p50": ratio[i],
            "floor_ratio_p50": floor, "programs_share": share,
            "stamps": traced.then_some(cells[i].stamps), "lost": traced.then_some(cells[i].lost),
        }));
    }
    let mut breakdowns = Vec::new();
    for (i, tracer) in tracers.iter().enumerate() {
        if matches!(tracer, Tracer::Run(c) if c.stats == "full") {
            breakdowns.push(breakdown(&tracer.name(), &cells[i]));
        }
    }
    json!({"rounds": rounds, "seconds": seconds, "matrix": rows, "programs": breakdowns})
}

/// Per program: runs and BPF ns per round trip and per run, and the whole
/// run's BPF ns per stamp.
fn breakdown(name: &str, cell: &Cell) -> Value {
    let trips = cell.sent.max(1) as f64;
    println!("\n### {name}: BPF run time per program (2 datagrams per round trip)\n");
    println!(
        "| program | runs per round trip | ns per run | ns per round trip |\n|---|---|---|---|"
    );
    let mut programs: Vec<(&String, &(u64, u64))> = cell
        .programs
        .iter()
        .filter(|(_, (runs, _))| *runs > 0)
        .collect();
    programs.sort_by_key(|p| std::cmp::Reverse(p.1 .1));
    let mut rows = BTreeMap::new();
    let mut total = 0.0;
    for (program, (runs, ns)) in programs {
        let per_trip = *ns as f64 / trips;
        total += per_trip;
        println!(
            "| {program} | {:.2} | {:.0} | {per_trip:.0} |",
            *runs as f64 / trips,
            *ns as f64 / *runs as f64
        );
        rows.insert(program.clone(), json!({"runs_per_round_trip": *runs as f64 / trips, "ns_per_run": *ns as f64 / *runs as f64, "ns_per_round_trip": per_trip}));
    }
    let all_ns: u64 = cell.programs.values().map(|(_, ns)| ns).sum();
    let per_stamp = all_ns as f64 / cell.stamps.max(1) as f64;
    println!("| total | | | {total:.0} |\n\nBPF ns per stamp (all programs, the run's stamps): {per_stamp:.0}");
    json!({"configuration": name, "programs": rows, "ns_per_round_trip": total, "ns_per_stamp": per_stamp})
}
