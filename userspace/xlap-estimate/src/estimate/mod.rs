//! `xlap-trace estimate`: every host's software latency from the RTTs
//! between pairs of hosts, without synchronised clocks (Puttnies et al.,
//! "Estimating variant software latencies from round-trip times", 2016).
//!
//! Each `probe rtt` file is one equation `RTT_ij = 2·t_i + 2·t_j + 2·h_ij`;
//! with three or more hosts and enough pairs (every connected group of hosts
//! needs an odd cycle of measured pairs: the triangle of three hosts), the
//! system determines every host's t. It is solved by least squares
//! (Householder QR) once per statistic: the mean, and the quantiles level by
//! level (min, p50, p90, p99, max). A bootstrap over each pair's samples
//! gives each estimate's interval.

pub mod linalg;
pub mod report;
pub mod solve;
pub mod stats;
pub mod system;

#[cfg(test)]
mod tests;

use crate::probe::{RttFile, FORMAT, FORMAT_VERSION};
use anyhow::Result;
use std::path::PathBuf;
use system::Refusal;
use xlap_exit::{failure, Code};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns for a terminal.
    Table,
    /// One object: hosts, estimates per host and statistic, pairs with
    /// their RTT statistics and residuals, condition number, notes.
    Json,
}

/// What `estimate` reads and how it reports.
#[derive(Clone, Debug)]
pub struct EstimateOptions {
    /// RTT files written by `xlap-trace probe rtt`, one per measured pair
    /// (more than one per pair: each is an equation).
    pub files: Vec<PathBuf>,
    /// One-way hardware latency of a pair (wire, switch) in microseconds:
    /// A-B=US (repeatable; default 0: it is counted in the hosts' t).
    pub hardware: Vec<String>,
    pub format: Format,
    /// Bootstrap resamples for the intervals (0: none).
    pub bootstrap: usize,
    /// Confidence of the intervals.
    pub confidence: f64,
    /// Seed of the resampling (the same seed, the same intervals).
    pub seed: u64,
}

/// Reads one `probe rtt` file.
pub fn load(path: &std::path::Path) -> Result<solve::PairInput> {
    let bad = |what: String| failure(Code::BadInput, format!("{}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let f: RttFile = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not an RTT file of `xlap-trace probe rtt` ({e})")))?;
    if f.format != FORMAT || f.format_version > FORMAT_VERSION {
        return Err(bad(format!(
            "format {:?} version {}, this xlap-trace reads {FORMAT:?} up to version {FORMAT_VERSION}",
            f.format, f.format_version
        )));
    }
    if f.samples_ns.is_empty() {
        return Err(bad(format!(
            "{}-{} has no RTT sample ({} probes lost)",
            f.from, f.to, f.lost
        )));
    }
    if f.from == f.to {
        return Err(bad(format!("from and to are both {:?}", f.from)));
    }
    Ok(solve::PairInput {
        from: f.from,
        to: f.to,
        source: path.display().to_string(),
        samples_ns: f.samples_ns.iter().map(|v| *v as f64).collect(),
        lost: f.lost,
        hardware_ns: 0.0,
    })
}

/// Applies `--hardware-us A-B=US` to the pairs it names (host names may
/// contain `-`: the split that names two known hosts wins).
pub fn apply_hardware(pairs: &mut [solve::PairInput], specs: &[String]) -> Result<()> {
    for spec in specs {
        let usage = |what: &str| {
            failure(
                Code::Usage,
                format!("--hardware-us {spec:?}: {what} (expected A-B=US)"),
            )
        };
        let (names, us) = spec.rsplit_once('=').ok_or_else(|| usage("no '='"))?;
        let us: f64 = us
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| usage("not a latency in microseconds"))?;
        let is_host = |n: &str| pairs.iter().any(|p| p.from == n || p.to == n);
        let split = names
            .match_indices('-')
            .map(|(i, _)| (&names[..i], &names[i + 1..]))
            .find(|(a, b)| is_host(a) && is_host(b))
            .ok_or_else(|| usage("does not name two hosts of the files"))?;
        let mut hit = false;
        for p in pairs.iter_mut() {
            if (p.from == split.0 && p.to == split.1) || (p.from == split.1 && p.to == split.0) {
                p.hardware_ns = us * 1e3;
                hit = true;
            }
        }
        if !hit {
            return Err(usage("no file measures this pair"));
        }
    }
    Ok(())
}

/// The error for a system that cannot be solved: what to measure.
pub fn refusal_error(system: &system::System, r: &Refusal) -> anyhow::Error {
    match r {
        Refusal::TooFewHosts(n) => failure(
            Code::BadInput,
            format!(
                "the files name {n} host{} ({}); an estimate needs three or more hosts and the RTTs between enough pairs of them",
                if *n == 1 { "" } else { "s" },
                system.hosts.join(", ")
            ),
        ),
        Refusal::Underdetermined { rank, add } => {
            let have: Vec<String> = system.pairs.iter().map(|p| system.pair_name(*p)).collect();
            let want: Vec<String> = add.iter().map(|p| system.pair_name(*p)).collect();
            failure(
                Code::BadInput,
                format!(
                    "the pairs {} do not determine every host's latency ({} hosts, {rank} independent equations): also measure {}",
                    have.join(", "),
                    system.hosts.len(),
                    want.join(", ")
                ),
            )
        }
    }
}

pub fn run(a: &EstimateOptions) -> Result<()> {
    if !(0.5..1.0).contains(&a.confidence) {
        return Err(failure(Code::Usage, "--confidence must lie in [0.5, 1)"));
    }
    let mut pairs = a
        .files
        .iter()
        .map(|f| load(f))
        .collect::<Result<Vec<_>>>()?;
    apply_hardware(&mut pairs, &a.hardware)?;
    let opts = solve::Options {
        resamples: a.bootstrap,
        confidence: a.confidence,
        seed: a.seed,
    };
    let e = solve::estimate(&pairs, opts).map_err(|(s, r)| refusal_error(&s, &r))?;
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&e)?),
        Format::Table => print!("{}", report::table(&e)),
    }
    Ok(())
}
