//! How long `xlap-trace record` takes from its start to tracing (its ready
//! file), per build, rounds interleaved: loading the programs, which the
//! kernel's verifier checks one by one, is most of it. The instructions the
//! verifier processed per program (`verified_insns` in run.json, of its
//! 1 M limit) come with it.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One build's start: seconds to ready, per round, and the verifier's
/// instructions per program of its last round.
pub struct Start {
    pub seconds: Vec<f64>,
    pub verified_insns: BTreeMap<String, u64>,
}

/// Starts each binary of `builds` `rounds` times, interleaved, tracing this
/// process (it holds a UDP socket on loopback for the time), each run in a
/// directory under `scratch`.
pub fn measure(builds: &[&Path], rounds: usize, scratch: &Path) -> Result<Vec<Start>> {
    let _socket = UdpSocket::bind("127.0.0.1:0").context("bind a UDP socket to trace")?;
    let mut starts: Vec<Start> = builds
        .iter()
        .map(|_| Start {
            seconds: Vec::new(),
            verified_insns: BTreeMap::new(),
        })
        .collect();
    for round in 0..rounds {
        for (i, binary) in builds.iter().enumerate() {
            let dir = scratch.join(format!("start-{i}-{round}"));
            let (seconds, insns) = one(binary, &dir)?;
            starts[i].seconds.push(seconds);
            starts[i].verified_insns = insns;
        }
    }
    Ok(starts)
}

fn one(binary: &Path, dir: &Path) -> Result<(f64, BTreeMap<String, u64>)> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let ready = dir.join("ready");
    let started = Instant::now();
    let mut child = Command::new(binary)
        .args(["record", "--no-usdt", "--quiet", "--pid"])
        .arg(std::process::id().to_string())
        .arg("-o")
        .arg(dir.join("run"))
        .arg("--ready-file")
        .arg(&ready)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {}", binary.display()))?;
    while !ready.exists() {
        if let Some(status) = child.try_wait()? {
            let mut err = String::new();
            if let Some(e) = child.stderr.as_mut() {
                let _ = std::io::Read::read_to_string(e, &mut err);
            }
            anyhow::bail!(
                "{} exited ({status}) before it was ready: {err}",
                binary.display()
            );
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "{} not ready after 300 s",
            binary.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = started.elapsed().as_secs_f64();
    // SAFETY: a signal to the recorder this function started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    child.wait()?;
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run/run.json"))?)?;
    let insns = meta["bpf_programs"]
        .as_object()
        .map(|programs| {
            programs
                .iter()
                .filter_map(|(name, p)| Some((name.clone(), p["verified_insns"].as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(dir);
    Ok((seconds, insns))
}

/// The median of `v` (not empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}
