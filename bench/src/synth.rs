//! The synthetic runs the analysis benchmarks read: made once per size
//! and seed by `xlap-trace synth` and kept in `bench-results/` between
//! sessions (`bench-analysis` and `bench-memory` share them).

use crate::measure::measure;
use anyhow::Result;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
use xlap_tests::bin;

/// The directory of the synthetic run of `packets` packets and `seed`:
/// `bench-results/synth-N` for seed 1, `synth-N-seedS` for the others.
pub fn run_dir(packets: u64, seed: u32) -> PathBuf {
    PathBuf::from(match seed {
        1 => format!("bench-results/synth-{packets}"),
        s => format!("bench-results/synth-{packets}-seed{s}"),
    })
}

/// `xlap-trace synth` of `packets` packets and `seed` into `dir`.
pub fn synth_command(packets: u64, seed: u32, dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(bin("xlap-trace"));
    cmd.args(["synth", "--packets", &packets.to_string(), "--seed"])
        .arg(seed.to_string())
        .arg("-o")
        .arg(dir);
    cmd
}

/// The synthetic run of `packets` packets and `seed`, generated when it is
/// missing (or was made with other settings) and kept; the seconds `synth`
/// took when it ran now. A kept run's stale stored aggregates are made
/// again ([`fresh_aggregates`]).
pub fn run(packets: u64, seed: u32) -> Result<(PathBuf, Option<f64>)> {
    let dir = run_dir(packets, seed);
    let meta: Option<Value> = std::fs::read_to_string(dir.join("run.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let current = meta.is_some_and(|m| {
        let s = &m["options"]["synthetic"];
        s["packets"] == packets
            && (s["seed"] == seed || s["seed"].is_null())
            && dir.join("packets.parquet").exists()
    });
    if current {
        fresh_aggregates(&packets_of(std::slice::from_ref(&dir)))?;
        return Ok((dir, None));
    }
    eprintln!(
        "generating {packets} synthetic packets (seed {seed}) into {}",
        dir.display()
    );
    let m = measure(&mut synth_command(packets, seed, &dir))?;
    eprintln!("  {:.2} s, {:.0} MiB", m.seconds, m.peak_rss_mib);
    Ok((dir, Some(m.seconds)))
}

/// The stored aggregates of kept runs, computed again when a change to
/// `queries/views.sql` (or another release) made them stale: else every
/// side that should read them would compute them, and the bench would
/// measure the wrong path without a word.
pub fn fresh_aggregates(packets: &[PathBuf]) -> Result<()> {
    let t0 = Instant::now();
    let mut stale = 0;
    for p in packets {
        stale += usize::from(xlap_analyze::store::refresh(p)?);
    }
    if stale > 0 {
        eprintln!(
            "stored aggregates of {stale} kept runs ({}...) were stale or missing: computed again in {:.1} s",
            packets[0].display(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The packets file of each run directory.
pub fn packets_of(dirs: &[PathBuf]) -> Vec<PathBuf> {
    dirs.iter()
        .map(|d| xlap_records::RunDir::new(d).packets())
        .collect()
}
