//! `run.json`: what a run was (host, kernel, clocks, options) and how well it
//! went (stamps and losses per point, BPF run time).

use serde::Serialize;
use std::collections::BTreeMap;

/// One simultaneous reading of the host's clocks, to map stamps
/// (`CLOCK_MONOTONIC`) to wall time: realtime and TAI are read on either
/// side of monotonic, so the pair is good to half of `spread_ns`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ClockPair {
    pub monotonic_ns: u64,
    pub realtime_ns: u64,
    pub tai_ns: u64,
    pub spread_ns: u64,
}

/// One clock's time now, ns.
pub fn read_clock(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl ClockPair {
    /// The tightest of a few readings.
    pub fn sample() -> ClockPair {
        (0..5)
            .map(|_| {
                let r0 = read_clock(libc::CLOCK_REALTIME);
                let t0 = read_clock(libc::CLOCK_TAI);
                let m = read_clock(libc::CLOCK_MONOTONIC);
                let t1 = read_clock(libc::CLOCK_TAI);
                let r1 = read_clock(libc::CLOCK_REALTIME);
                ClockPair {
                    monotonic_ns: m,
                    realtime_ns: r0 / 2 + r1 / 2,
                    tai_ns: t0 / 2 + t1 / 2,
                    spread_ns: r1 - r0,
                }
            })
            .min_by_key(|p| p.spread_ns)
            .expect("five samples")
    }
}

/// Stamps of one point and the stamps it could not record, per reason
/// (`lost_<reason>`, reasons in `xlap_abi::LOSS_REASONS`).
#[derive(Debug, Default, Serialize)]
pub struct PointStats {
    pub stamps: u64,
    #[serde(flatten)]
    pub lost: BTreeMap<String, u64>,
}

impl PointStats {
    pub fn add_losses(&mut self, counts: &[u64]) {
        for (name, n) in xlap_abi::LOSS_REASONS.iter().zip(counts) {
            *self.lost.entry(format!("lost_{name}")).or_default() += n;
        }
    }

    pub fn lost(&self, reason: &str) -> u64 {
        self.lost
            .get(&format!("lost_{reason}"))
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Debug, Serialize)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    pub udp_ports: Vec<u16>,
}

#[derive(Debug, Serialize)]
pub struct ProgramStats {
    pub run_count: u64,
    pub run_time_ns: u64,
    /// Runs the kernel skipped: the program was already running on that
    /// CPU (a tracepoint hit inside our own program). Their stamps are
    /// missing; None where the kernel does not say.
    pub recursion_misses: Option<u64>,
    /// Instructions the verifier processed to accept it (its limit is 1M:
    /// how close a program is to being refused). None where the kernel
    /// does not say.
    pub verified_insns: Option<u32>,
}

/// When the kernel's BPF run-time statistics were on (`--bpf-stats`).
#[derive(Clone, Debug, Serialize)]
pub struct BpfStats {
    pub mode: crate::record::StatsMode,
    /// Seconds they were on, in how many windows.
    pub on_s: f64,
    pub windows: usize,
    /// Stamps taken while they were on (the per-stamp cost's divisor).
    pub stamps: u64,
    /// The kernel refused to turn them on.
    pub unavailable: bool,
}

/// What the flow table held at the end of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FlowCounts {
    /// Flows with their addresses known.
    pub known: u64,
    /// Flow keys two address pairs shared (their stamps have no addresses).
    pub collided: u64,
    /// Times a flow found the table full (its stamps have no addresses).
    pub not_noted: u64,
}

#[derive(Debug, Serialize)]
pub struct RunMeta {
    pub schema_version: &'static str,
    pub software_version: &'static str,
    pub run_id: String,
    pub host: String,
    pub kernel: String,
    /// Runs with the same boot id share one CLOCK_MONOTONIC (same kernel).
    pub boot_id: String,
    /// The kernel's view of realtime clock synchronisation (NTP/PTP
    /// discipline through adjtimex), for mapping clocks between hosts.
    pub clock_sync: ClockSync,
    pub clock_start: ClockPair,
    pub clock_end: ClockPair,
    pub options: serde_json::Value,
    pub targets: Vec<Target>,
    /// Children the targets forked, traced since (their stamps carry their
    /// own pid).
    pub followed: Vec<crate::record::Child>,
    /// Receive-device stamps taken by port for datagrams that went to a
    /// socket not traced (an SO_REUSEPORT group, a more specific bind on
    /// the port), left out of stamps.parquet.
    pub foreign_stamps_dropped: u64,
    /// The flow table behind stamps' `src_addr`/`dst_addr`/`socket_cookie`.
    pub flows: FlowCounts,
    /// Ports of traced sockets the kernel's port table had no room for
    /// (their receive-device points are missing).
    pub ports_not_traced: Vec<u16>,
    pub points: BTreeMap<String, PointStats>,
    /// Tracepoints that could not be attached, with the reason.
    pub unavailable_points: BTreeMap<String, String>,
    pub packets: u64,
    pub stamps: u64,
    pub lost: u64,
    /// Run counts and times while the statistics were on (`bpf_stats`).
    pub bpf_programs: BTreeMap<String, ProgramStats>,
    /// How the statistics were taken.
    pub bpf_stats: BpfStats,
    /// BPF run time / stamps, over the time the statistics were on
    /// (includes filtered-out calls).
    pub bpf_ns_per_stamp: Option<f64>,
    /// CPU time (user + system) the reader spent while the run went on:
    /// draining the ring buffer, decoding, writing the Arrow stream.
    pub reader_cpu_s: f64,
    pub stop_reason: String,
    /// The traced namespaces' devices and their timestamping (what
    /// `ethtool -T` says, and whether hardware timestamping is on).
    pub device_timestamping: Vec<crate::hwts::DeviceTimestamping>,
}

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[derive(Debug, Serialize)]
pub struct ClockSync {
    /// adjtimex says the clock is disciplined (no STA_UNSYNC, no TIME_ERROR).
    pub synchronized: bool,
    /// Maximum error of the realtime clock, µs (adjtimex maxerror).
    pub maxerror_us: i64,
    /// Estimated error, µs (adjtimex esterror).
    pub esterror_us: i64,
}

impl ClockSync {
    pub fn read() -> ClockSync {
        // SAFETY: modes = 0 only reads the kernel's clock state into `tx`.
        let mut tx: libc::timex = unsafe { std::mem::zeroed() };
        let state = unsafe { libc::adjtimex(&mut tx) };
        ClockSync {
            synchronized: state >= 0
                && state != libc::TIME_ERROR
                && tx.status & libc::STA_UNSYNC == 0,
            maxerror_us: tx.maxerror,
            esterror_us: tx.esterror,
        }
    }
}

pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    /// The analyser reads what the recorder writes.
    #[test]
    fn the_analyser_reads_the_current_run_version() {
        assert!(
            xlap_analyze::runs::READS_RUN_VERSIONS.contains(&xlap_records::schema::SCHEMA_VERSION)
        );
    }
}
