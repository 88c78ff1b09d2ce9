//! The kernel's BPF run-time statistics, from which a run reports its own
//! cost (BPF ns per stamp, per-program run counts and times).
//!
//! While they are on, the kernel reads the clock twice around every run of
//! every BPF program of the machine: measured on a pinned 10 µs sockperf
//! ping-pong (`xlap-bench-perturb`), that is about a sixth of the tracer's
//! perturbation. So by default they are only on in short windows
//! (`SAMPLE_WINDOW` of every `SAMPLE_PERIOD`, the first one at the start),
//! and the cost per stamp is the programs' run time in the windows over
//! the stamps whose timestamps fall in them (stamps carry the monotonic
//! clock the windows are taken on). `full` keeps them on for the whole
//! run (exact run counts: the benchmark's per-program breakdown), `off`
//! never turns them on.

use crate::capture::{self, StatsGuard};
use std::time::Duration;

/// How a run uses the statistics (`--bpf-stats`): run.json's own type.
pub use crate::runmeta::StatsMode;

pub const SAMPLE_WINDOW: Duration = Duration::from_millis(100);
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// The statistics' on/off windows of one run.
pub struct StatsSampler {
    mode: StatsMode,
    guard: Option<StatsGuard>,
    /// Closed windows, monotonic ns [start, end), in order.
    windows: Vec<(u64, u64)>,
    /// Start of the open window.
    open: Option<u64>,
    /// When the next window opens (sampled mode).
    next_open: u64,
    /// Stamps whose time fell in a window.
    pub stamps_in_windows: u64,
    /// The kernel refused to turn them on.
    pub unavailable: bool,
}

fn monotonic_ns() -> u64 {
    crate::runmeta::read_clock(libc::CLOCK_MONOTONIC)
}

impl StatsSampler {
    /// Turns the statistics on (unless `off`): the first window starts now.
    pub fn start(mode: StatsMode) -> StatsSampler {
        let mut s = StatsSampler {
            mode,
            guard: None,
            windows: Vec::new(),
            open: None,
            next_open: 0,
            stamps_in_windows: 0,
            unavailable: false,
        };
        if mode != StatsMode::Off {
            s.turn_on(monotonic_ns());
        }
        s
    }

    fn turn_on(&mut self, now: u64) {
        match capture::enable_stats() {
            Some(g) => {
                self.guard = Some(g);
                self.open = Some(now);
            }
            None => self.unavailable = true,
        }
        self.next_open = now + SAMPLE_PERIOD.as_nanos() as u64;
    }

    fn turn_off(&mut self, now: u64) {
        self.guard = None; // closing the fd turns them off
        if let Some(start) = self.open.take() {
            self.windows.push((start, now));
        }
    }

    /// Opens or closes the sampled window as time goes on (call often).
    pub fn tick(&mut self) {
        if self.mode != StatsMode::Sampled || self.unavailable {
            return;
        }
        let now = monotonic_ns();
        match self.open {
            Some(start) if now - start >= SAMPLE_WINDOW.as_nanos() as u64 => self.turn_off(now),
            None if now >= self.next_open => self.turn_on(now),
            _ => {}
        }
    }

    /// Ends the open window (at the end of the run, before the programs'
    /// statistics are read: they stop growing then).
    pub fn finish(&mut self) {
        self.turn_off(monotonic_ns());
    }

    /// Counts a stamp taken at `ts_ns` if a window covered it.
    pub fn note_stamp(&mut self, ts_ns: u64) {
        if self.mode == StatsMode::Off {
            return;
        }
        let inside = self.open.is_some_and(|start| ts_ns >= start)
            || match self.windows.binary_search_by(|w| w.0.cmp(&ts_ns)) {
                Ok(_) => true,
                Err(0) => false,
                Err(i) => ts_ns < self.windows[i - 1].1,
            };
        if inside {
            self.stamps_in_windows += 1;
        }
    }

    pub fn mode(&self) -> StatsMode {
        self.mode
    }

    /// Seconds the statistics were on.
    pub fn sampled_s(&self) -> f64 {
        self.windows.iter().map(|(a, b)| (b - a) as f64 / 1e9).sum()
    }

    pub fn windows(&self) -> usize {
        self.windows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(windows: Vec<(u64, u64)>) -> StatsSampler {
        StatsSampler {
            mode: StatsMode::Sampled,
            guard: None,
            windows,
            open: None,
            next_open: u64::MAX,
            stamps_in_windows: 0,
            unavailable: false,
        }
    }

    #[test]
    fn stamps_count_only_inside_the_windows() {
        let mut s = sampler(vec![(100, 200), (1_000, 1_100)]);
        for ts in [50, 100, 150, 199, 200, 500, 1_000, 1_099, 1_100, 5_000] {
            s.note_stamp(ts);
        }
        // 100, 150, 199 and 1_000, 1_099: windows are [start, end).
        assert_eq!(s.stamps_in_windows, 5);
        assert!((s.sampled_s() - 200e-9).abs() < 1e-15);
        s.open = Some(4_000);
        s.note_stamp(5_000);
        assert_eq!(s.stamps_in_windows, 6, "the open window counts too");
    }
}
