//! `run.json`: what a run was (host, kernel, clocks, options) and how well it
//! went (stamps and losses per point, BPF run time). One declaration serves
//! the recorder that writes it, `recover` that completes it, and the
//! analyses that read it.
//!
//! Reading is strict where the analyses depend on a field and lenient
//! elsewhere: a run.json without `run_id`, `host`, `boot_id`,
//! `clock_start` or the default layout's `seq_size` is refused naming the
//! field (read as empty they would pair clocks that are not one, or place a
//! run at time 0); fields added since the first version, and those only
//! reported, read as absent (`#[serde(default)]`) in runs written before
//! them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The run.json versions this xlap-trace reads: the current
/// [`crate::schema::SCHEMA_VERSION`] and those before it (version 1 stamps
/// lack the address and socket columns and have 8-bit kinds; both read).
pub const READS_RUN_VERSIONS: &[&str] = &["1", "2"];

/// One simultaneous reading of the host's clocks, to map stamps
/// (`CLOCK_MONOTONIC`) to wall time: realtime and TAI are read on either
/// side of monotonic, so the pair is good to half of `spread_ns`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockPair {
    pub monotonic_ns: u64,
    pub realtime_ns: u64,
    #[serde(default)]
    pub tai_ns: u64,
    #[serde(default)]
    pub spread_ns: u64,
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

    /// This pair moved to `monotonic_ns`, realtime and TAI advanced as far
    /// (the pair's mapping assumed to hold until then).
    pub fn advanced_to(&self, monotonic_ns: u64) -> ClockPair {
        let since = monotonic_ns as i64 - self.monotonic_ns as i64;
        let shift = |t: u64| (t as i64 + since) as u64;
        ClockPair {
            monotonic_ns,
            realtime_ns: shift(self.realtime_ns),
            tai_ns: shift(self.tai_ns),
            spread_ns: self.spread_ns,
        }
    }
}

/// A step of the realtime clock against monotonic (settimeofday, a
/// clock jump of NTP or PTP), seen between two clock pairs of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockStep {
    /// The monotonic time of the pair that saw it (the step came after the
    /// pair before).
    pub seen_monotonic_ns: u64,
    /// How far realtime moved beyond monotonic, ns.
    pub step_ns: i64,
}

/// The kernel's view of realtime clock synchronisation (NTP/PTP discipline
/// through adjtimex). Absent: not known to be synchronised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockSync {
    /// adjtimex says the clock is disciplined (no STA_UNSYNC, no TIME_ERROR).
    pub synchronized: bool,
    /// Maximum error of the realtime clock, µs (adjtimex maxerror).
    pub maxerror_us: i64,
    /// Estimated error, µs (adjtimex esterror).
    pub esterror_us: i64,
}

/// Stamps of one point and the stamps it could not record, per reason
/// (`lost_<reason>`, reasons in `xlap_abi::LOSS_REASONS`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointStats {
    pub stamps: u64,
    #[serde(flatten)]
    pub lost: BTreeMap<String, u64>,
}

impl PointStats {
    /// Adds `counts`, one per loss reason in `xlap_abi::LOSS_REASONS` order.
    pub fn add_losses(&mut self, counts: &[u64]) {
        for (name, n) in xlap_abi::LOSS_REASONS.iter().zip(counts) {
            *self.lost.entry(format!("lost_{name}")).or_default() += n;
        }
    }

    /// Stamps lost for `reason` (a run from before a reason existed counts
    /// none of it).
    pub fn lost(&self, reason: &str) -> u64 {
        self.lost
            .get(&format!("lost_{reason}"))
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    pub udp_ports: Vec<u16>,
}

/// A process a target forked, traced since (its stamps carry its own pid).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Child {
    pub pid: u32,
    /// The target it descends from; 0 for a process that entered a traced
    /// cgroup (`--cgroup`, `--container`) during the run, and its children.
    pub target: u32,
    pub comm: String,
    /// Seconds into the run when the recorder first saw it.
    pub seen_after_s: f64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// How a run used the kernel's BPF run-time statistics (`--bpf-stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatsMode {
    /// On in short windows (a tenth of the run).
    #[default]
    Sampled,
    /// On for the whole run.
    Full,
    /// Never on (no cost figures).
    Off,
}

/// When the kernel's BPF run-time statistics were on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BpfStats {
    pub mode: StatsMode,
    /// Seconds they were on, in how many windows.
    pub on_s: f64,
    pub windows: usize,
    /// Stamps taken while they were on (the per-stamp cost's divisor).
    pub stamps: u64,
    /// The kernel refused to turn them on.
    pub unavailable: bool,
}

/// What the flow table held at the end of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
/// stamps.parquet and the final counts are written, `recovered` once
/// `xlap-trace recover` made whole a run whose recorder died. A run.json
/// without a state is from before states (complete).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    #[default]
    Complete,
    Recovered,
}

/// The process that records a run: a recorder whose pid is alive with the
/// same start time is still at work (a pid alone may have been reused).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorder {
    pub pid: u32,
    /// Start time of the process, clock ticks after boot (/proc/PID/stat).
    pub start_ticks: u64,
}

/// The last checkpoint of a running recording: what had reached the live
/// stream, and when (the counts in run.json are those of this moment).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub clock: ClockPair,
    /// Stamps written to stamps.arrows so far.
    pub streamed_stamps: u64,
    /// Its size then, bytes.
    pub stream_bytes: u64,
}

/// Where a protocol keeps its sequence number and kind, as the run used it
/// (`--proto`, `--seq-*`, `--kind-*`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqLayout {
    #[serde(default)]
    pub seq_offset: u32,
    /// Bytes of the sequence number (its wrap-around span).
    pub seq_size: u8,
    #[serde(default)]
    pub kind_offset: u32,
    /// 0: the protocol has no kind field.
    #[serde(default)]
    pub kind_size: u8,
    /// Bits of the kind field that make the kind; 0 keeps all.
    #[serde(default)]
    pub kind_mask: u32,
    #[serde(default)]
    pub big_endian: bool,
    /// The protocol's names of its kind values.
    #[serde(default)]
    pub kind_names: Vec<(u64, String)>,
}

/// `--layout PORT=SPEC`: the layout of datagrams to or from `port`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSeqLayout {
    pub port: u16,
    #[serde(flatten)]
    pub layout: SeqLayout,
}

/// A target that exited during the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Exited {
    pub pid: u32,
    /// Seconds into the run.
    pub after_s: f64,
}

/// How a USDT site was stamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SitePath {
    /// The xlap-marker shared-memory ring (no trap).
    Ring,
    /// A uprobe at the marker.
    Uprobe,
}

/// One USDT marker site the run stamped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsdtSite {
    pub pid: u32,
    pub provider: String,
    pub name: String,
    pub path: SitePath,
    /// The stamp point it makes (`app.<name>`).
    pub point: String,
    /// The binary or library holding it.
    pub file: PathBuf,
    /// Its argument spec, as the ELF note gives it.
    pub args: String,
}

/// What the run was asked to do. The layouts are what the analyses read;
/// the rest reports the command line (a run from another source, such as
/// `xlap-trace synth`, names itself in `other`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    /// The layout of datagrams no `--layout PORT=` names.
    pub layout: SeqLayout,
    #[serde(default)]
    pub port_layouts: Vec<PortSeqLayout>,
    #[serde(default)]
    pub pids: Vec<u32>,
    /// The kernel points the run asked for.
    #[serde(default)]
    pub points: Vec<String>,
    #[serde(default)]
    pub ringbuf_bytes: Option<u32>,
    #[serde(default)]
    pub per_stamp_records: bool,
    /// `--empty-programs`: the hooks were attached with programs that
    /// return at once, so the run stamped nothing by design.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub empty_programs: bool,
    /// Where the send/receive boundary was stamped (`--boundary`):
    /// "syscalls", "socket-calls", or "syscalls (why)" when the socket calls
    /// were asked for on a kernel without what they need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary: Option<String>,
    /// `--sample 1/N`: the run stamped only the datagrams whose seq hashes
    /// into its sample (`xlap_records::sample`); absent: every datagram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<crate::sample::Sample>,
    #[serde(default)]
    pub duration_s: Option<f64>,
    #[serde(default)]
    pub count: Option<u64>,
    #[serde(default)]
    pub exited: Vec<Exited>,
    #[serde(default)]
    pub marker_path: Option<SitePath>,
    #[serde(default)]
    pub usdt_sites: Vec<UsdtSite>,
    /// Options of another source of runs.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// A run's place in a rotated recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// One device in one traced network namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTimestamping {
    pub netns: u32,
    /// Its index in that namespace (0 in runs recorded before it was
    /// kept): what device points' stamps name it by.
    #[serde(default)]
    pub ifindex: u32,
    pub ifname: String,
    /// The driver (`ethtool -i`): veth, tun, virtio_net, ixgbe, ...
    pub driver: String,
    pub hardware_tx: bool,
    pub hardware_rx: bool,
    pub software_tx: bool,
    pub software_rx: bool,
    /// The PTP hardware clock of the device (`/dev/ptpN`), if any.
    pub phc_index: Option<i32>,
    /// Hardware receive timestamping switched on (`SIOCGHWTSTAMP`
    /// rx_filter not NONE); false where the driver has no such setting.
    pub hardware_rx_on: bool,
}

/// What `xlap-trace recover` found and could not know.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecoveryNote {
    /// The xlap-trace that recovered the run.
    pub by: String,
    /// Stamps recovered from the live stream.
    pub stamps: u64,
    /// Stamps the last checkpoint had seen written to the stream.
    pub checkpoint_stamps: Option<u64>,
    pub stream_bytes: u64,
    /// Bytes after the last complete batch (a batch cut short).
    pub stream_bytes_cut: u64,
    pub last_stamp_after_checkpoint_s: Option<f64>,
    /// What a recovery cannot tell.
    pub not_known: Vec<String>,
}

/// The version a run.json says it is, written as this xlap-trace's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchemaVersion(pub String);

impl Default for SchemaVersion {
    fn default() -> Self {
        SchemaVersion(crate::schema::SCHEMA_VERSION.to_string())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    pub schema_version: SchemaVersion,
    #[serde(default)]
    pub software_version: String,
    #[serde(default)]
    pub state: RunState,
    #[serde(default)]
    pub recorder: Option<Recorder>,
    /// Seconds between checkpoints while the run goes on.
    #[serde(default)]
    pub checkpoint_every_s: Option<f64>,
    #[serde(default)]
    pub checkpoint: Option<Checkpoint>,
    /// How often every CPU's batch of stamps was exported to the reader
    /// (null: only by later stamps and idle CPUs, see the run's notes).
    #[serde(default)]
    pub batch_export_every_ms: Option<u64>,
    pub run_id: String,
    pub host: String,
    #[serde(default)]
    pub kernel: String,
    /// Runs with the same boot id share one CLOCK_MONOTONIC (same kernel).
    pub boot_id: String,
    /// For mapping clocks between hosts.
    #[serde(default)]
    pub clock_sync: ClockSync,
    pub clock_start: ClockPair,
    /// The run's last clock pair (absent: the start's).
    #[serde(default)]
    pub clock_end: Option<ClockPair>,
    /// Steps of the realtime clock seen between the run's clock pairs (at
    /// each checkpoint and at the end): wall times and realtime mappings
    /// to other hosts hold only before the first.
    #[serde(default)]
    pub clock_steps: Vec<ClockStep>,
    pub options: RunOptions,
    #[serde(default)]
    pub targets: Vec<Target>,
    /// Children the targets forked, traced since (their stamps carry their
    /// own pid).
    #[serde(default)]
    pub followed: Vec<Child>,
    /// Children followed but not listed in `followed`: beyond its first
    /// thousand, those that never held a UDP socket (a CI job's compilers
    /// and scripts), counted only.
    #[serde(default, skip_serializing_if = "zero")]
    pub followed_unlisted: u64,
    /// The cgroups of the stamps' `cgroup_id`s: each id's path below the
    /// cgroup2 root and the container and pod the path names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<crate::cgroups::CgroupInfo>,
    /// Receive-device stamps taken by port for datagrams that went to a
    /// socket not traced (an SO_REUSEPORT group, a more specific bind on
    /// the port), left out of stamps.parquet.
    #[serde(default)]
    pub foreign_stamps_dropped: u64,
    /// The instants every point of the run stamped between (absent in runs
    /// recorded before it was kept): the run's start and end, or a
    /// rotation's cut, are one instant for all points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<StampWindow>,
    /// The flow table behind stamps' `src_addr`/`dst_addr`/`socket_cookie`.
    #[serde(default)]
    pub flows: FlowCounts,
    /// Ports of traced sockets the kernel's port table had no room for
    /// (their receive-device points are missing).
    #[serde(default)]
    pub ports_not_traced: Vec<u16>,
    /// Sockets the traced processes held before tracing that could not be
    /// traced, per reason (each may have carried the protocol).
    #[serde(default)]
    pub sockets_not_traced: SocketsNotTraced,
    #[serde(default)]
    pub points: BTreeMap<String, PointStats>,
    /// Points of the run's set this kernel could not stamp at all, with
    /// the program and the reason.
    #[serde(default)]
    pub unavailable_points: BTreeMap<String, String>,
    /// Points some of whose stamps this kernel cannot take (which ones,
    /// and why).
    #[serde(default)]
    pub degraded_points: BTreeMap<String, String>,
    /// The tracepoints and hooks refused, with the kernel's reason.
    #[serde(default)]
    pub unavailable_hooks: BTreeMap<String, String>,
    #[serde(default)]
    pub packets: u64,
    #[serde(default)]
    pub stamps: u64,
    #[serde(default)]
    pub lost: u64,
    /// Run counts and times while the statistics were on (`bpf_stats`).
    #[serde(default)]
    pub bpf_programs: BTreeMap<String, ProgramStats>,
    /// How the statistics were taken.
    #[serde(default)]
    pub bpf_stats: Option<BpfStats>,
    /// BPF run time / stamps, over the time the statistics were on
    /// (includes filtered-out calls).
    #[serde(default)]
    pub bpf_ns_per_stamp: Option<f64>,
    /// CPU time (user + system) the reader spent while the run went on:
    /// draining the ring buffer, decoding, writing the Arrow stream.
    #[serde(default)]
    pub reader_cpu_s: Option<f64>,
    #[serde(default)]
    pub stop_reason: StopReason,
    /// Which segment of a rotated recording this run is (`--rotate`; the
    /// recording's `segments.json` is in the directory above).
    #[serde(default)]
    pub segment: Option<SegmentOf>,
    /// The traced namespaces' devices and their timestamping (what
    /// `ethtool -T` says, and whether hardware timestamping is on).
    #[serde(default)]
    pub device_timestamping: Vec<DeviceTimestamping>,
    /// Optional capabilities the recorder ran without (what each one
    /// leaves out: `xlap-trace` says it at start).
    #[serde(default)]
    pub capabilities_missing: Vec<String>,
    /// The in-process marker rings and what their records came to: a
    /// traced process can write anything into its ring, and what it
    /// corrupts is counted here (and lost as `parse` at the app points).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marker_rings: Vec<MarkerRing>,
    /// Traced processes held where new code was mapped (their exec, their
    /// loader mapping libraries) until its markers were attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<Holds>,
    /// Set by `xlap-trace recover`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryNote>,
    /// `record --to`: what this run's stream to a collector came to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_link: Option<PeerLink>,
    /// `record --collect`: what each peer recorder sent, and the
    /// connections refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<PeersCollected>,
}

/// The sending side of a peer link (`record --to`): what left this host
/// and what the collector said it holds. The local run directory is whole
/// whatever these say.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerLink {
    /// The collector as given (`--to HOST:PORT`).
    pub to: String,
    /// `delivered` (the collector holds the whole stream, run.json and
    /// stamps.parquet), `incomplete`, `refused` (the collector refused
    /// the token, or the collector did not prove it holds it),
    /// `never-connected`.
    pub state: String,
    /// Bytes of this run's stamps.arrows at its end.
    pub stream_bytes: u64,
    /// Stream bytes written to the connection (resent ones counted once
    /// per sending).
    pub bytes_sent: u64,
    /// Stream bytes the collector said it holds at the end.
    pub bytes_delivered: u64,
    /// stream_bytes - bytes_delivered.
    pub bytes_not_delivered: u64,
    /// The final run.json and stamps.parquet reached the collector.
    pub final_delivered: bool,
    /// Connections made (more than one: reconnected, resuming where the
    /// collector was).
    pub connections: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The collecting side (`record --collect`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeersCollected {
    /// Where it listened.
    pub listen: String,
    /// Seconds it waited at the end for peers still sending.
    pub waited_s: f64,
    pub peers: Vec<PeerArrival>,
    /// Connections refused (a wrong token, garbage, beyond the limits):
    /// the first 32, and how many in all.
    pub refused: Vec<PeerRefusal>,
    pub refused_total: u64,
}

/// One peer recorder's run as it arrived.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerArrival {
    /// Its run directory, inside this one (named here, never by the peer).
    pub dir: String,
    /// The address it last connected from.
    pub address: String,
    /// The host name it gave, when it was 1 to 64 of `[A-Za-z0-9._-]`.
    pub host: Option<String>,
    /// Stream bytes received (stamps.arrows).
    pub stream_bytes: u64,
    /// Bytes of the stream the peer said it had at its end (absent: it
    /// never said: it died, disconnected or ran out of time).
    pub stream_bytes_sent_total: Option<u64>,
    /// Its final run.json and stamps.parquet arrived, and the whole stream.
    pub complete: bool,
    pub connections: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A connection the collector refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerRefusal {
    pub address: String,
    pub reason: String,
}

/// The instants (CLOCK_MONOTONIC ns of the run's host) between which every
/// point of the run stamped (`struct xlap_stamp_window` on the BPF side):
/// none stamps before `from_ns` or after `until_ns`, whichever order the
/// hooks are attached and detached in. A packet in flight at either is
/// flagged `partial` in the packets table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StampWindow {
    pub from_ns: u64,
    /// Absent while the run or the segment goes on.
    #[serde(default)]
    pub until_ns: Option<u64>,
    /// Stamps that reached the recorder from outside the window (taken by
    /// a program still running after the cut): left out.
    #[serde(default)]
    pub stamps_outside: u64,
}

/// Sockets held before tracing started that are not traced, per reason:
/// created later, a socket is marked by the kernel side and cannot be
/// missed; held already, it is found in /proc and marked from here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SocketsNotTraced {
    /// Processes whose fd table could not be read (no ptrace access): none
    /// of the sockets they held then is traced.
    pub processes_unreadable: u64,
    /// Sockets in no /proc/net table whose protocol could not be asked
    /// (pidfd_getfd refused): each may be an unbound UDP socket.
    pub not_inspectable: u64,
    /// UDP sockets that could not be duplicated (pidfd_getfd refused).
    pub duplicate_refused: u64,
    /// UDP sockets the kernel's socket storage refused to mark.
    pub mark_refused: u64,
}

impl SocketsNotTraced {
    pub fn total(&self) -> u64 {
        self.processes_unreadable
            + self.not_inspectable
            + self.duplicate_refused
            + self.mark_refused
    }
}

fn zero(n: &u64) -> bool {
    *n == 0
}

/// The holds of a run: how often a traced process was stopped until the
/// markers of what it had just mapped were attached, and for how long.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Holds {
    /// At an exec.
    pub at_exec: u64,
    /// Where the dynamic loader had mapped objects (start-up, dlopen).
    pub at_loader: u64,
    /// Holds the kernel refused to stop (the process ran on).
    pub not_stopped: u64,
    /// Time held, from the stop to the resume, summed and the longest.
    pub held_us_total: f64,
    pub held_us_max: f64,
    /// Execs of traced processes not held: the program and its loader
    /// were known code (read before, no traced marker).
    #[serde(default)]
    pub skipped_at_exec: u64,
    /// Loader events not held: every object it lists was known code.
    #[serde(default)]
    pub skipped_at_loader: u64,
    /// Files read and found without a traced marker (and loaders hooked),
    /// handed to the kernel side as known code.
    #[serde(default)]
    pub files_known: u64,
    /// Of those, the ones its table had no room for (their processes are
    /// held each time).
    #[serde(default)]
    pub files_not_known: u64,
    /// At the connect of a traced UDP socket (`--boundary auto`), until
    /// the send syscalls' hook was attached.
    #[serde(default)]
    pub at_connect: u64,
}

/// One marker ring of a run (a process and the binary whose markers wrote
/// it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MarkerRing {
    pub pid: u32,
    pub binary: String,
    /// Records taken as stamps.
    pub records: u64,
    /// Stamps the markers say they dropped on a full ring (counted as
    /// `ringbuf_full` losses only for a ring that showed no corruption).
    #[serde(default)]
    pub full: u64,
    /// Records refused: an unknown site, a pid not of that process, a kind
    /// beyond 32 bits, or a slot reserved and never written.
    pub corrupt: u64,
    /// Times the ring's header held a head the ring cannot have (behind
    /// the reader, or more than the capacity ahead).
    pub header_faults: u64,
    /// Why the ring was switched off before the end, if it was (its
    /// markers' later stamps are missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switched_off: Option<String>,
}

/// Why a run.json cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RunMetaError {
    #[error("run.json is not JSON as xlap-trace writes it: {0}")]
    Json(serde_json::Error),
    #[error("run.json has schema version {found}; this xlap-trace reads versions {} (use a matching xlap-trace)", READS_RUN_VERSIONS.join(", "))]
    Version { found: String },
    #[error("run.json lacks what the analyses need ({0}): it was not written by xlap-trace, or was edited")]
    Incomplete(serde_json::Error),
    #[error("run.json holds {0}: it was not written by xlap-trace, or was edited")]
    Invalid(String),
}

/// The longest run id, host, boot id or kernel name: each is copied into
/// rows and reports (a 50 MB run id became 50 MB of Markdown).
pub const MAX_NAME_BYTES: usize = 1024;

/// The largest count (packets, stamps, losses) a run.json may hold: what
/// a double holds exactly, as in summary.json. Counts of 2^64 - 1 summed
/// overflowed in the engine (`Overflow in addition of UINT64`, exit 1).
pub const MAX_COUNT: u64 = 1 << 53;

impl RunMeta {
    /// A run.json's text, refused unless it is JSON of a version this
    /// xlap-trace reads and holds what the analyses need (the version is
    /// checked first: a newer run.json is refused as newer, not as
    /// malformed).
    pub fn from_json(text: &str) -> Result<RunMeta, RunMetaError> {
        let value = crate::strict_json::parse(text).map_err(RunMetaError::Json)?;
        let version = value["schema_version"].as_str().unwrap_or("?");
        if !READS_RUN_VERSIONS.contains(&version) {
            return Err(RunMetaError::Version {
                found: crate::escape::terminal(&version.chars().take(40).collect::<String>()),
            });
        }
        let meta: RunMeta = serde_json::from_value(value).map_err(RunMetaError::Incomplete)?;
        let points = meta
            .points
            .values()
            .flat_map(|p| std::iter::once(p.stamps).chain(p.lost.values().copied()));
        let outside = meta.window.map_or(0, |w| w.stamps_outside);
        if let Some(n) = [meta.packets, meta.stamps, meta.lost, outside]
            .into_iter()
            .chain(points)
            .find(|n| *n > MAX_COUNT)
        {
            return Err(RunMetaError::Invalid(format!(
                "a count of {n} (at most {MAX_COUNT})"
            )));
        }
        for (what, name) in [
            ("run id", &meta.run_id),
            ("host", &meta.host),
            ("boot id", &meta.boot_id),
            ("kernel", &meta.kernel),
        ] {
            if name.len() > MAX_NAME_BYTES {
                return Err(RunMetaError::Invalid(format!(
                    "a {what} of {} bytes (at most {MAX_NAME_BYTES})",
                    name.len()
                )));
            }
        }
        Ok(meta)
    }

    /// Writes run.json whole or not at all (a temporary file renamed), so
    /// a reader, or a recorder that dies while writing it, never leaves a
    /// torn file.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)? + "\n";
        crate::run_file::write_whole(path, json.as_bytes())
    }

    /// The run's last clock pair (the start's where none was written).
    pub fn clock_end(&self) -> ClockPair {
        self.clock_end.unwrap_or(self.clock_start)
    }

    /// Seconds from the first clock pair to the last.
    pub fn duration_s(&self) -> Option<f64> {
        let end = self.clock_end?;
        Some((end.monotonic_ns as i64 - self.clock_start.monotonic_ns as i64) as f64 / 1e9)
    }

    /// Every layout of the run: the default (port None) and the per-port
    /// ones.
    pub fn layouts(&self) -> impl Iterator<Item = (Option<u16>, &SeqLayout)> {
        std::iter::once((None, &self.options.layout)).chain(
            self.options
                .port_layouts
                .iter()
                .map(|l| (Some(l.port), &l.layout)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step is realtime moving beyond monotonic by more than slewing
    /// and the readings' error explain.
    #[test]
    fn a_realtime_step_is_told_from_slewing() {
        let pair = |m: u64, r: u64| ClockPair {
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

    /// The readers read what the recorder writes.
    #[test]
    fn the_current_version_is_read() {
        assert!(READS_RUN_VERSIONS.contains(&crate::schema::SCHEMA_VERSION));
    }

    fn minimal() -> serde_json::Value {
        serde_json::json!({
            "schema_version": "2", "run_id": "r", "host": "h", "boot_id": "b",
            "clock_start": {"monotonic_ns": 5, "realtime_ns": 7},
            "options": {"layout": {"seq_size": 4}},
        })
    }

    /// What the analyses need is required, by name; the rest reads as
    /// absent (runs from before a field existed).
    #[test]
    fn a_run_json_lacking_what_the_analyses_need_is_refused_naming_it() {
        let meta = RunMeta::from_json(&minimal().to_string()).expect("minimal run.json");
        assert_eq!(meta.state, RunState::Complete);
        assert_eq!(meta.clock_end().monotonic_ns, 5);
        assert_eq!(meta.options.layout.seq_size, 4);
        for field in ["run_id", "host", "boot_id", "clock_start"] {
            let mut v = minimal();
            v.as_object_mut().unwrap().remove(field);
            let e = RunMeta::from_json(&v.to_string()).unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{field}: {e}");
        }
        let mut v = minimal();
        v["options"]["layout"] = serde_json::json!({"seq_offset": 4});
        let e = RunMeta::from_json(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("`seq_size`"), "{e}");
        let mut v = minimal();
        v["schema_version"] = "9".into();
        let e = RunMeta::from_json(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("schema version 9"), "{e}");
    }

    /// What is written reads back the same, including per-port layouts,
    /// loss reasons and another source's options.
    #[test]
    fn run_json_round_trips() {
        let mut meta = RunMeta::from_json(&minimal().to_string()).unwrap();
        meta.options.port_layouts.push(PortSeqLayout {
            port: 9000,
            layout: SeqLayout {
                seq_size: 2,
                kind_names: vec![(1, "data".into())],
                ..SeqLayout::default()
            },
        });
        meta.options
            .other
            .insert("synthetic".into(), serde_json::json!({"seed": 1}));
        let mut p = PointStats::default();
        p.add_losses(&[1, 2]);
        meta.points.insert("dev.xmit".into(), p);
        meta.state = RunState::Recovered;
        let text = serde_json::to_string(&meta).unwrap();
        let back = RunMeta::from_json(&text).unwrap();
        assert_eq!(back, meta);
        let reason = xlap_abi::LOSS_REASONS[1];
        assert_eq!(back.points["dev.xmit"].lost(reason), 2);
        assert!(
            text.contains(r#""port":9000,"seq_offset":0,"seq_size":2"#),
            "{text}"
        );
    }
}

/// Why a run ended (run.json `stop_reason`, written as its text).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum StopReason {
    /// Not written yet (run.json as the run begins).
    #[default]
    Running,
    /// Still recording: a checkpoint's run.json (a recorder that dies
    /// leaves it; `recover` sets `RecorderDied`).
    StillRunning,
    /// A segment of a rotated recording, closed by the rotation.
    Rotated,
    /// SIGINT or SIGTERM.
    Signal,
    /// `--duration` reached.
    Duration,
    /// `--count` packets seen.
    Count,
    /// `--max-size` reached without `--rotate`.
    MaxSize,
    /// Every target process exited.
    TargetsExited,
    /// The recorder died; `recover` made the run whole.
    RecorderDied,
    /// `xlap-trace synth`.
    Synthetic,
    /// Written by another version: kept as it was.
    Other(String),
}

impl StopReason {
    const NAMED: [(StopReason, &'static str); 10] = [
        (StopReason::Running, ""),
        (StopReason::StillRunning, "(still running)"),
        (StopReason::Rotated, "rotated"),
        (StopReason::Signal, "signal"),
        (StopReason::Duration, "duration"),
        (StopReason::Count, "count"),
        (StopReason::MaxSize, "max-size"),
        (StopReason::TargetsExited, "targets exited"),
        (StopReason::RecorderDied, "recorder died"),
        (StopReason::Synthetic, "synthetic"),
    ];

    /// The text run.json holds.
    pub fn as_str(&self) -> &str {
        match self {
            StopReason::Other(text) => text,
            named => Self::NAMED
                .iter()
                .find(|(r, _)| r == named)
                .map_or("", |(_, text)| text),
        }
    }
}

impl From<String> for StopReason {
    fn from(text: String) -> StopReason {
        Self::NAMED
            .iter()
            .find(|(_, t)| *t == text)
            .map_or(StopReason::Other(text), |(r, _)| r.clone())
    }
}

impl From<StopReason> for String {
    fn from(r: StopReason) -> String {
        r.as_str().to_string()
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for StopReason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
