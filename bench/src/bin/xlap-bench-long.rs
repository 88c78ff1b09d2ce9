//! `just bench-long`: a long capture at a high rate, as a day-long run
//! would go, cut into segments within a disk budget: the recorder's memory
//! (RSS, sampled), CPU, the disk the recording holds, losses, and bytes per
//! stamp of the live stream and of Parquet.
//!
//! The example protocol (no markers, every kernel point) runs PAIRS
//! sender/receiver pairs across the stage at one datagram per PERIOD µs
//! each, logging only its summary; `xlap-trace record --rotate ROTATE
//! --max-size MAX` traces them for MINUTES, segments finished (Parquet,
//! packets table) behind the reader as the run goes.
//!
//! Options: `--minutes N` (30), `--period-us N` (20), `--pairs N` (1),
//! `--rotate SPEC` (512MiB), `--max-size SPEC` (4GiB), `--quick` (2
//! minutes, 128MiB segments). Prints Markdown (a line per minute while it
//! runs) and writes `bench-results/long.json` (the samples) and
//! `bench-results/long.svg` (RSS and disk over time).

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use xlap_bench::args::arg_value;
use xlap_stage::Stage;
use xlap_tests::example::{RECEIVER_PORT, SENDER_PORT};
use xlap_tests::trace::Recorder;
use xlap_tests::{bin, bytes_under, privileged_unavailable, wait_for_file, KillOnDrop, Scratch};

/// One look at the recorder and its recording.
#[derive(Clone, Debug)]
struct Sample {
    t_s: f64,
    rss_kib: u64,
    cpu_s: f64,
    disk_bytes: u64,
    segments: usize,
    segments_deleted: usize,
}

impl Sample {
    fn to_json(&self) -> Value {
        json!({
            "t_s": self.t_s, "rss_kib": self.rss_kib, "cpu_s": self.cpu_s,
            "disk_bytes": self.disk_bytes, "segments": self.segments,
            "segments_deleted": self.segments_deleted,
        })
    }
}

fn main() -> Result<()> {
    xlap_bench::args::check(
        "usage: xlap-bench-long [--quick] [--minutes M] [--period-us P] [--pairs N] [--rotate SIZE] [--max-size SIZE]\nA long recording with rotation (docs/performance.md); writes bench-results/long.json and long.svg.",
        &["--quick"],
        &["--minutes", "--period-us", "--pairs", "--rotate", "--max-size"],
    )?;
    if let Some(reason) = privileged_unavailable() {
        anyhow::bail!("the benchmark loads BPF and builds a stage: {reason}");
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let minutes: f64 = arg_value("--minutes")?.unwrap_or(if quick { 2.0 } else { 30.0 });
    let period_us: u64 = arg_value("--period-us")?.unwrap_or(20);
    let pairs: u16 = arg_value("--pairs")?.unwrap_or(1);
    let rotate: String =
        arg_value("--rotate")?.unwrap_or_else(|| if quick { "128MiB" } else { "512MiB" }.into());
    let max_size: String = arg_value("--max-size")?.unwrap_or_else(|| "4GiB".into());
    let count = (minutes * 60e6 / period_us as f64) as u64;
    anyhow::ensure!(
        count <= u32::MAX as u64,
        "too many datagrams per sender: {count}"
    );

    let stage = Stage::two_hosts()?;
    let scratch = Scratch::new("bench-long");
    let (a, b) = (stage.host(0), stage.host(1));
    let program = bin("xlap-example-plain");
    let mut protocol: Vec<(KillOnDrop, KillOnDrop)> = Vec::new();
    let start_file = scratch.path("start");
    for pair in 0..pairs {
        let port = |base: u16| std::net::SocketAddr::new(b.addr(false), base + 10 * pair);
        let ready = scratch.path(&format!("ready-{pair}"));
        let receiver = b
            .command(&program)
            .arg("recv")
            .arg("--bind")
            .arg(port(RECEIVER_PORT).to_string())
            .args(["--expect", &count.to_string(), "--log-events", "summary"])
            .arg("--log")
            .arg(scratch.path(&format!("receiver-{pair}.jsonl")))
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .spawn()
            .context("receiver")?;
        wait_for_file(&ready, 20);
        let sender = a
            .command(&program)
            .arg("send")
            .arg("--dest")
            .arg(port(RECEIVER_PORT).to_string())
            .arg("--bind")
            .arg(std::net::SocketAddr::new(a.addr(false), SENDER_PORT + 10 * pair).to_string())
            .args(["--count", &count.to_string()])
            .args(["--period-us", &period_us.to_string()])
            .args(["--log-events", "summary", "--start-timeout-s", "120"])
            .arg("--log")
            .arg(scratch.path(&format!("sender-{pair}.jsonl")))
            .arg("--start-file")
            .arg(&start_file)
            .stdin(Stdio::null())
            .spawn()
            .context("sender")?;
        protocol.push((KillOnDrop(sender), KillOnDrop(receiver)));
    }
    let pids: Vec<u32> = protocol
        .iter()
        .flat_map(|(s, r)| [s.0.id(), r.0.id()])
        .collect();
    let dir = scratch.path("run");
    let rec = Recorder::start(
        &pids,
        &dir,
        &["--rotate", &rotate, "--max-size", &max_size, "-q"],
    );
    let recorder_pid = rec.child.id();
    println!(
        "## Long run: {minutes} min, {pairs} pair(s) at one datagram per {period_us} µs each, --rotate {rotate} --max-size {max_size}\n"
    );
    println!("| min | RSS MiB | recorder CPU % | disk MiB | segments (deleted) |");
    println!("|---|---|---|---|---|");
    std::fs::write(&start_file, "go\n")?;
    let began = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    let mut last_line = 0.0;
    let mut rec = Some(rec);
    loop {
        std::thread::sleep(Duration::from_secs(5));
        let Some(s) = sample(recorder_pid, &dir, began) else {
            break;
        };
        if s.t_s - last_line >= 60.0 {
            last_line = s.t_s;
            let cpu = samples
                .last()
                .map_or(0.0, |p| 100.0 * (s.cpu_s - p.cpu_s) / (s.t_s - p.t_s));
            println!(
                "| {:.0} | {:.0} | {cpu:.0} | {:.0} | {} ({}) |",
                s.t_s / 60.0,
                s.rss_kib as f64 / 1024.0,
                s.disk_bytes as f64 / (1 << 20) as f64,
                s.segments,
                s.segments_deleted
            );
        }
        samples.push(s);
        if protocol
            .iter_mut()
            .all(|(s, _)| matches!(s.0.try_wait(), Ok(Some(_))))
        {
            // The senders are done: the recorder ends with the receivers.
            if let Some(r) = rec.take() {
                let out = r.wait();
                let err = String::from_utf8_lossy(&out.stderr);
                if !err.trim().is_empty() {
                    println!("\nrecorder said: {}", err.trim());
                }
            }
        }
    }
    if let Some(r) = rec.take() {
        r.wait();
    }
    let wall_s = began.elapsed().as_secs_f64();
    report(&dir, &scratch, &samples, wall_s, pairs)
}

/// The recorder's RSS and CPU, the recording's disk; None once it exited.
fn sample(pid: u32, dir: &Path, began: Instant) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    if stat.contains(") Z ") {
        return None;
    }
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    // utime and stime: fields 14 and 15, the 12th and 13th after the comm.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let index = index(dir);
    let segments = index["segments"].as_array().map_or(0, |s| s.len());
    let deleted = index["segments"]
        .as_array()
        .map_or(0, |s| s.iter().filter(|e| e["state"] == "deleted").count());
    Some(Sample {
        t_s: began.elapsed().as_secs_f64(),
        rss_kib,
        cpu_s: ticks as f64 / hz,
        disk_bytes: bytes_under(dir),
        segments,
        segments_deleted: deleted,
    })
}

fn index(dir: &Path) -> Value {
    std::fs::read_to_string(dir.join("segments.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

fn read_json(path: &Path) -> Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// The summary line of each example log.
fn summaries(scratch: &Scratch, role: &str, pairs: u16) -> Vec<Value> {
    (0..pairs)
        .filter_map(|p| {
            let text = std::fs::read_to_string(scratch.path(&format!("{role}-{p}.jsonl"))).ok()?;
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|e| e["event"] == "summary")
        })
        .collect()
}

fn report(
    dir: &Path,
    scratch: &Scratch,
    samples: &[Sample],
    wall_s: f64,
    pairs: u16,
) -> Result<()> {
    let index = index(dir);
    let segments = index["segments"].as_array().cloned().unwrap_or_default();
    let sum = |key: &str| -> u64 { segments.iter().filter_map(|s| s[key].as_u64()).sum() };
    let (stamps, lost, packets) = (sum("stamps"), sum("lost"), sum("packets"));
    let rotate_bytes = index["rotate"]
        .as_str()
        .and_then(|r| r.strip_suffix(" bytes"))
        .and_then(|b| b.parse::<f64>().ok());
    // Every segment but the last ended at the rotation size: its live
    // stream held rotate bytes for its stamps.
    let full: Vec<&Value> = segments[..segments.len().saturating_sub(1)]
        .iter()
        .collect();
    let stream_b_per_stamp = rotate_bytes.map(|r| {
        r * full.len() as f64
            / full
                .iter()
                .filter_map(|s| s["stamps"].as_u64())
                .sum::<u64>()
                .max(1) as f64
    });
    // Where the losses were, by reason and by point: from each segment
    // still on disk (a deleted one's run.json went with it).
    let mut lost_by: std::collections::BTreeMap<(String, String), u64> = Default::default();
    let mut kept_lost = 0u64;
    for s in &segments {
        let d = dir.join(s["dir"].as_str().unwrap_or_default());
        let Ok(text) = std::fs::read_to_string(d.join("run.json")) else {
            continue;
        };
        let meta = xlap_records::run_meta::RunMeta::from_json(&text)?;
        kept_lost += meta.lost;
        for (point, stats) in &meta.points {
            for (key, n) in stats.lost.iter().filter(|(_, n)| **n > 0) {
                let reason = key.trim_start_matches("lost_").to_string();
                *lost_by.entry((reason, point.clone())).or_default() += n;
            }
        }
    }
    let mut parquet_bytes = 0u64;
    let mut parquet_stamps = 0u64;
    for s in segments.iter().filter(|s| s["state"] == "complete") {
        let d = dir.join(s["dir"].as_str().unwrap_or_default());
        if let Ok(m) = std::fs::metadata(d.join("stamps.parquet")) {
            parquet_bytes += m.len();
            parquet_stamps += read_json(&d.join("run.json"))["stamps"]
                .as_u64()
                .unwrap_or(0);
        }
    }
    let sent: u64 = summaries(scratch, "sender", pairs)
        .iter()
        .filter_map(|s| s["sent"].as_u64())
        .sum();
    let rss_max = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    let rss_1min = samples
        .iter()
        .find(|s| s.t_s >= 60.0)
        .or(samples.first())
        .map_or(0, |s| s.rss_kib);
    let rss_end = samples.last().map_or(0, |s| s.rss_kib);
    let disk_max = samples.iter().map(|s| s.disk_bytes).max().unwrap_or(0);
    let cpu_s = samples.last().map_or(0.0, |s| s.cpu_s);
    let deleted = segments.iter().filter(|s| s["state"] == "deleted").count();
    let mib = |b: f64| b / (1 << 20) as f64;
    println!("\n| measure | value |\n|---|---|");
    println!("| wall time | {:.1} min |", wall_s / 60.0);
    println!("| datagrams sent (the senders' summaries) | {sent} |");
    println!("| packets counted (segments) | {packets} |");
    println!(
        "| stamps | {stamps} ({:.0}/s) |",
        stamps as f64 / wall_s.max(1.0)
    );
    println!(
        "| stamps lost | {lost} ({:.4} %) |",
        100.0 * lost as f64 / (stamps + lost).max(1) as f64
    );
    let mut by: Vec<(&(String, String), &u64)> = lost_by.iter().collect();
    by.sort_by(|a, b| b.1.cmp(a.1));
    println!(
        "| stamps lost by reason and point (segments kept: {kept_lost}) | {} |",
        if by.is_empty() {
            "none".to_string()
        } else {
            by.iter()
                .map(|((reason, point), n)| format!("{reason} at {point}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    println!(
        "| recorder RSS: after 1 min, max, end | {:.0} / {:.0} / {:.0} MiB |",
        rss_1min as f64 / 1024.0,
        rss_max as f64 / 1024.0,
        rss_end as f64 / 1024.0
    );
    println!(
        "| recorder CPU (reader, finisher, DuckDB) | {cpu_s:.0} s ({:.0} % of one core) |",
        100.0 * cpu_s / wall_s
    );
    println!(
        "| disk: max while running / budget | {:.0} MiB / {} |",
        mib(disk_max as f64),
        index["max_size_bytes"]
            .as_u64()
            .map_or("none".into(), |b| format!("{:.0} MiB", mib(b as f64)))
    );
    println!(
        "| segments (deleted for the budget) | {} ({deleted}) |",
        segments.len()
    );
    let finished: Vec<(f64, u64)> = segments
        .iter()
        .filter_map(|s| Some((s["finish_s"].as_f64()?, s["stamps"].as_u64()?)))
        .collect();
    let unfinished = segments
        .iter()
        .filter(|s| s["state"] == "deleted" && !s["error"].is_null())
        .count();
    println!("| segments deleted before they were finished (finisher behind) | {unfinished} |");
    if !finished.is_empty() {
        let secs: f64 = finished.iter().map(|f| f.0).sum();
        let n: u64 = finished.iter().map(|f| f.1).sum();
        println!(
            "| finisher: Parquet per segment, mean | {:.1} s ({:.0} k stamps/s on idle CPU time) |",
            secs / finished.len() as f64,
            n as f64 / secs / 1e3
        );
    }
    if let Some(b) = stream_b_per_stamp {
        println!("| live stream (zstd IPC), bytes/stamp | {b:.1} |");
    }
    println!(
        "| stamps.parquet, bytes/stamp | {:.1} |",
        parquet_bytes as f64 / parquet_stamps.max(1) as f64
    );
    let out = Path::new("bench-results");
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join("long.json"),
        serde_json::to_string_pretty(&json!({
            "samples": samples.iter().map(Sample::to_json).collect::<Vec<_>>(), "segments": segments, "sent": sent, "stamps": stamps,
            "lost": lost, "lost_by": by.iter().map(|((reason, point), n)| json!({"reason": reason, "point": point, "stamps": n})).collect::<Vec<_>>(), "wall_s": wall_s, "stream_bytes_per_stamp": stream_b_per_stamp,
            "parquet_bytes_per_stamp": parquet_bytes as f64 / parquet_stamps.max(1) as f64,
        }))?,
    )?;
    std::fs::write(out.join("long.svg"), plot(samples))?;
    println!("\nwrote bench-results/long.json and bench-results/long.svg");
    Ok(())
}

/// RSS and disk over time, one SVG, each line on its own scale.
fn plot(samples: &[Sample]) -> String {
    let (w, h, pad) = (720.0, 300.0, 50.0);
    let t_max = samples.last().map_or(1.0, |s| s.t_s).max(1.0);
    let line = |values: Vec<f64>, colour: &str, label: &str, row: f64| -> String {
        let max = values.iter().cloned().fold(1e-9, f64::max);
        let points: Vec<String> = samples
            .iter()
            .zip(&values)
            .map(|(s, v)| {
                format!(
                    "{:.1},{:.1}",
                    pad + (w - 2.0 * pad) * s.t_s / t_max,
                    h - pad - (h - 2.0 * pad) * v / max
                )
            })
            .collect();
        format!(
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/><text x="{pad}" y="{row}" fill="{colour}" font-size="12">{label} (max {max:.0})</text>"#,
            points.join(" ")
        )
    };
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif"><rect width="{w}" height="{h}" fill="white"/><line x1="{pad}" y1="{y}" x2="{x2}" y2="{y}" stroke="black"/><text x="{x2}" y="{ty}" font-size="12" text-anchor="end">{t:.0} min</text>{}{}</svg>"#,
        line(
            samples.iter().map(|s| s.rss_kib as f64 / 1024.0).collect(),
            "#c0392b",
            "recorder RSS, MiB",
            18.0
        ),
        line(
            samples
                .iter()
                .map(|s| s.disk_bytes as f64 / (1 << 20) as f64)
                .collect(),
            "#2471a3",
            "recording on disk, MiB",
            34.0
        ),
        y = h - pad,
        x2 = w - pad,
        ty = h - pad + 18.0,
        t = t_max / 60.0,
    )
}
