//! What tracing a run cost, as data: from its `run.json`, carried into
//! `summary.json` and `compare`, so that a CI job sees when tracing itself
//! got dearer (a protocol stage that grew by what the tracer added is not
//! the protocol's regression).

use crate::run_meta::RunMeta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TracerCost {
    /// The capture's BPF run time per datagram of the traced processes
    /// (every program: the points on the datagram's path and the calls
    /// they filtered out), ns, while the kernel's statistics were on. On a
    /// path that runs on one CPU it is also an estimate of the latency the
    /// tracing added to each datagram. With `--sample 1/N` it counts every
    /// datagram, sampled or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_ns_per_datagram: Option<f64>,
    /// The capture's BPF run time per program run (every program's time
    /// over every program's runs), ns. A per-datagram figure grows when
    /// other traffic on the machine runs the programs more often; this one
    /// grows when each run got dearer (the tracer's code, the kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf_ns_per_run: Option<f64>,
    /// The same per capture program (`on_net_dev_queue`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub program_ns_per_datagram: BTreeMap<String, f64>,
    /// The recorder's reader (draining, decoding, writing) as a share of
    /// one CPU over the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorder_cpu_share: Option<f64>,
}

impl TracerCost {
    /// The cost of the run `meta` describes; None when it says nothing of
    /// it (statistics off, no packets, no reader time).
    pub fn of_run(meta: &RunMeta) -> Option<TracerCost> {
        let one_in = meta.options.sample.as_ref().map_or(1, |s| s.one_in) as f64;
        // Datagrams while the statistics were on: the stamps taken then,
        // over the stamps per (sampled) packet, times the packets each
        // sampled one stands for.
        let timed_stamps = meta.bpf_stats.as_ref().map_or(0, |s| s.stamps);
        let datagrams = (meta.packets > 0 && meta.stamps > 0 && timed_stamps > 0)
            .then(|| timed_stamps as f64 * meta.packets as f64 / meta.stamps as f64 * one_in);
        let program_ns_per_datagram: BTreeMap<String, f64> = match datagrams {
            Some(n) => meta
                .bpf_programs
                .iter()
                .filter(|(_, p)| p.run_time_ns > 0)
                .map(|(name, p)| (name.clone(), p.run_time_ns as f64 / n))
                .collect(),
            None => BTreeMap::new(),
        };
        let bpf_ns_per_datagram =
            (!program_ns_per_datagram.is_empty()).then(|| program_ns_per_datagram.values().sum());
        let (time, runs) = meta.bpf_programs.values().fold((0u64, 0u64), |(t, n), p| {
            (
                t.saturating_add(p.run_time_ns),
                n.saturating_add(p.run_count),
            )
        });
        let bpf_ns_per_run =
            (datagrams.is_some() && time > 0 && runs > 0).then(|| time as f64 / runs as f64);
        let recorder_cpu_share = match (meta.reader_cpu_s, meta.duration_s()) {
            (Some(cpu), Some(s)) if s > 0.0 => Some(cpu / s),
            _ => None,
        };
        let cost = TracerCost {
            bpf_ns_per_datagram,
            bpf_ns_per_run,
            program_ns_per_datagram,
            recorder_cpu_share,
        };
        (cost != TracerCost::default()).then_some(cost)
    }

    /// Several runs' costs as one (a pooled baseline): the mean of each
    /// figure over the runs that have it.
    pub fn mean(parts: &[&TracerCost]) -> Option<TracerCost> {
        Self::combine(parts, mean_of)
    }

    /// The runs of one connection, a recorder per host: each end's
    /// programs and reader are its own, so the figures add up.
    pub fn sum(parts: &[&TracerCost]) -> Option<TracerCost> {
        Self::combine(parts, |v| v.iter().sum())
    }

    /// Each figure of `parts` reduced by `reduce` over the runs that have it.
    fn combine(parts: &[&TracerCost], reduce: fn(&[f64]) -> f64) -> Option<TracerCost> {
        let over = |f: fn(&TracerCost) -> Option<f64>| reduce_over(parts, f, reduce);
        let mut programs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for c in parts {
            for (name, ns) in &c.program_ns_per_datagram {
                programs.entry(name.clone()).or_default().push(*ns);
            }
        }
        let cost = TracerCost {
            bpf_ns_per_datagram: over(|c| c.bpf_ns_per_datagram),
            // Each recorder's programs run on their own: a mean either way.
            bpf_ns_per_run: reduce_over(parts, |c| c.bpf_ns_per_run, mean_of),
            program_ns_per_datagram: programs
                .into_iter()
                .map(|(name, v)| (name, reduce(&v)))
                .collect(),
            recorder_cpu_share: over(|c| c.recorder_cpu_share),
        };
        (cost != TracerCost::default()).then_some(cost)
    }
}

/// `reduce` of figure `f` over the parts that have it.
fn reduce_over(
    parts: &[&TracerCost],
    f: fn(&TracerCost) -> Option<f64>,
    reduce: fn(&[f64]) -> f64,
) -> Option<f64> {
    let v: Vec<f64> = parts.iter().filter_map(|c| f(c)).collect();
    (!v.is_empty()).then(|| reduce(&v))
}

fn mean_of(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_meta::{BpfStats, ClockPair, ProgramStats};

    fn program(ns: u64, runs: u64) -> ProgramStats {
        ProgramStats {
            run_count: runs,
            run_time_ns: ns,
            recursion_misses: None,
            verified_insns: None,
        }
    }

    #[test]
    fn cost_per_datagram_counts_the_datagrams_a_sampled_packet_stands_for() {
        let mut meta = RunMeta {
            packets: 1_000,
            stamps: 10_000,
            bpf_stats: Some(BpfStats {
                stamps: 1_000, // a tenth of the run: 100 packets then
                ..BpfStats::default()
            }),
            reader_cpu_s: Some(0.5),
            clock_start: ClockPair {
                monotonic_ns: 1_000_000_000,
                ..ClockPair::default()
            },
            clock_end: Some(ClockPair {
                monotonic_ns: 11_000_000_000,
                ..ClockPair::default()
            }),
            ..RunMeta::default()
        };
        meta.bpf_programs
            .insert("on_net_dev_queue".into(), program(40_000, 200));
        meta.bpf_programs
            .insert("on_netif_rx".into(), program(20_000, 400));
        let cost = TracerCost::of_run(&meta).unwrap();
        assert_eq!(cost.bpf_ns_per_datagram, Some(600.0));
        assert_eq!(cost.program_ns_per_datagram["on_netif_rx"], 200.0);
        assert_eq!(cost.recorder_cpu_share, Some(0.05));
        // 60 µs over 600 runs, whatever the datagrams.
        assert_eq!(cost.bpf_ns_per_run, Some(100.0));
        meta.options.sample = crate::sample::Sample::parse("1/4", vec![]).unwrap();
        let sampled = TracerCost::of_run(&meta).unwrap();
        assert_eq!(sampled.bpf_ns_per_datagram, Some(150.0));
        let pooled = TracerCost::mean(&[&cost, &sampled]).unwrap();
        assert_eq!(pooled.bpf_ns_per_datagram, Some(375.0));
        let ends = TracerCost::sum(&[&cost, &sampled]).unwrap();
        assert_eq!(ends.bpf_ns_per_datagram, Some(750.0));
        assert_eq!(ends.recorder_cpu_share, Some(0.1));
        assert_eq!(ends.bpf_ns_per_run, Some(100.0));
        assert_eq!(TracerCost::of_run(&RunMeta::default()), None);
    }
}
