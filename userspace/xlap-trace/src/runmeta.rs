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

/// A step of the realtime clock against monotonic (settimeofday, a
/// clock jump of NTP or PTP), seen between two clock pairs of a run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ClockStep {
    /// The monotonic time of the pair that saw it (the step came after the
    /// pair before).
    pub seen_monotonic_ns: u64,
    /// How far realtime moved beyond monotonic, ns.
    pub step_ns: i64,
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
    /// How far realtime moved beyond monotonic since `earlier`, when more
    /// than slewing can (NTP slews at most 500 ppm; 1000 ppm allowed) plus
    /// the two readings' error and 100 µs.
    pub fn step_since(&self, earlier: &ClockPair) -> Option<ClockStep> {
        let mono = self.monotonic_ns as i64 - earlier.monotonic_ns as i64;
        let real = self.realtime_ns as i64 - earlier.realtime_ns as i64;
        let step = real - mono;
        let tolerance = mono.abs() / 1000 + (self.spread_ns + earlier.spread_ns) as i64 + 100_000;
        (step.abs() > tolerance).then_some(ClockStep {
            seen_monotonic_ns: self.monotonic_ns,
            step_ns: step,
        })
    }

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
#[derive(Clone, Debug, Default, Serialize)]
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

#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    pub udp_ports: Vec<u16>,
}

#[derive(Clone, Debug, Serialize)]
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

/// Where a run is in its life: `running` from the moment its probes are
/// attached (run.json is rewritten at every checkpoint), `complete` once
/// stamps.parquet and the final counts are written. A run left `running`
/// by a recorder that died is taken up by `xlap-trace recover`, which
/// marks it `recovered`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Complete,
}

/// The process that records a run: a recorder whose pid is alive with the
/// same start time is still at work (a pid alone may have been reused).
#[derive(Clone, Debug, Serialize)]
pub struct Recorder {
    pub pid: u32,
    /// Start time of the process, clock ticks after boot (/proc/PID/stat).
    pub start_ticks: u64,
}

impl Recorder {
    pub fn this_process() -> Recorder {
        let pid = std::process::id();
        Recorder {
            pid,
            start_ticks: process_start_ticks(pid).unwrap_or(0),
        }
    }
}

/// Field 22 of /proc/PID/stat (after the parenthesised command, which may
/// itself hold spaces and parentheses).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    start_ticks_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn start_ticks_of(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the command: state is field 3, start time 22.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// The last checkpoint of a running recording: what had reached the live
/// stream, and when (the counts in run.json are those of this moment).
#[derive(Clone, Debug, Serialize)]
pub struct Checkpoint {
    pub clock: ClockPair,
    /// Stamps written to stamps.arrows so far.
    pub streamed_stamps: u64,
    /// Its size then, bytes.
    pub stream_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunMeta {
    pub schema_version: &'static str,
    pub software_version: &'static str,
    pub state: RunState,
    pub recorder: Recorder,
    /// Seconds between checkpoints while the run goes on.
    pub checkpoint_every_s: f64,
    pub checkpoint: Option<Checkpoint>,
    /// How often every CPU's batch of stamps was exported to the reader
    /// (null: only by later stamps and idle CPUs, see the run's notes).
    pub batch_export_every_ms: Option<u64>,
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
    /// Steps of the realtime clock seen between the run's clock pairs (at
    /// each checkpoint and at the end): wall times and realtime mappings
    /// to other hosts hold only before the first.
    pub clock_steps: Vec<ClockStep>,
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
    /// Points of the run's set this kernel could not stamp at all, with
    /// the program and the reason.
    pub unavailable_points: BTreeMap<String, String>,
    /// Points some of whose stamps this kernel cannot take (which ones,
    /// and why).
    #[serde(default)]
    pub degraded_points: BTreeMap<String, String>,
    /// The tracepoints and hooks refused, with the kernel's reason.
    #[serde(default)]
    pub unavailable_hooks: BTreeMap<String, String>,
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
    /// Which segment of a rotated recording this run is (`--rotate`; the
    /// recording's `segments.json` is in the directory above).
    pub segment: Option<SegmentOf>,
    /// The traced namespaces' devices and their timestamping (what
    /// `ethtool -T` says, and whether hardware timestamping is on).
    pub device_timestamping: Vec<crate::hwts::DeviceTimestamping>,
    /// Optional capabilities the recorder ran without (what each one
    /// leaves out: `xlap-trace` says it at start).
    pub capabilities_missing: Vec<&'static str>,
}

/// A run's place in a rotated recording.
#[derive(Clone, Debug, Serialize)]
pub struct SegmentOf {
    /// 1, 2, ...: `seg-000001`, ...
    pub index: u32,
    /// The run id the segments share (each segment's own is this and
    /// `-seg<index>`).
    pub recording_id: String,
    /// When a segment ends: `--rotate` as bytes of the live stream or
    /// seconds.
    pub rotate: String,
}

impl SegmentOf {
    pub fn run_id(&self) -> String {
        format!("{}-seg{:06}", self.recording_id, self.index)
    }
}

impl RunMeta {
    /// Writes run.json whole or not at all (a temporary file renamed), so
    /// a reader, or a recorder that dies while writing it, never leaves a
    /// torn file.
    pub fn write(&self, path: &std::path::Path) -> anyhow::Result<()> {
        use anyhow::Context;
        let json = serde_json::to_string_pretty(self)? + "\n";
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, json).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
    }
}

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[derive(Clone, Debug, Serialize)]
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
    /// A command may hold spaces and parentheses: fields count from the
    /// last ')'.
    /// A step is realtime moving beyond monotonic by more than slewing
    /// and the readings' error explain.
    #[test]
    fn a_realtime_step_is_told_from_slewing() {
        let pair = |m: u64, r: u64| super::ClockPair {
            monotonic_ns: m,
            realtime_ns: r,
            tai_ns: r,
            spread_ns: 1_000,
        };
        let start = pair(1_000_000_000, 5_000_000_000);
        // 10 s later, slewed by 400 ppm: no step.
        assert!(pair(11_000_000_000, 15_004_000_000)
            .step_since(&start)
            .is_none());
        // Stepped back 2 s.
        let s = pair(11_000_000_000, 13_000_000_000)
            .step_since(&start)
            .unwrap();
        assert_eq!(s.step_ns, -2_000_000_000);
        // 5 ms forward within a second: a step.
        assert_eq!(
            pair(2_000_000_000, 6_005_000_000)
                .step_since(&start)
                .unwrap()
                .step_ns,
            5_000_000
        );
    }

    #[test]
    fn start_time_is_field_22_after_any_command() {
        let stat =
            "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(super::start_ticks_of(stat), Some(987654));
        assert_eq!(super::start_ticks_of("4242 (x) S 1"), None);
        let own = super::process_start_ticks(std::process::id()).expect("own stat");
        // SAFETY: sysconf reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (own as f64) / hz <= uptime + 1.0,
            "started {own} ticks after boot, uptime {uptime} s"
        );
    }

    /// The analyser reads what the recorder writes.
    #[test]
    fn the_analyser_reads_the_current_run_version() {
        assert!(
            xlap_analyze::runs::READS_RUN_VERSIONS.contains(&xlap_records::schema::SCHEMA_VERSION)
        );
    }
}
