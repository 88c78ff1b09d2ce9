//! What a recording does, decided before it starts: the recorder's whole
//! configuration, built by the CLI from its arguments (or by any caller
//! that records in-process), never the argument structs themselves.
//!
//! Grouped by concern, so each step of the recorder reads the part it
//! acts on; what the command line can get wrong is parsed while the
//! options are built, before anything starts.

use super::segments::Rotate;
use super::StatsMode;
use crate::capture::BoundaryRequest;
use crate::point_sets::PointSet;
use crate::proto::{self, Layouts};
use crate::usdt::Selection;
use std::path::PathBuf;
use xlap_records::run_meta::SitePath;
use xlap_records::sample::Sample;

/// A recording's configuration. [`Default`] is the command line's
/// defaults (the CLI checks that the two agree).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordOptions {
    pub targets: Targets,
    pub stop: Stop,
    pub output: Output,
    pub stamping: Stamping,
    pub recorder: Recorder,
    pub view: View,
}

/// The processes traced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Targets {
    /// Processes to trace: their UDP sockets, send and receive paths.
    pub pids: Vec<u32>,
    /// Cgroups traced whole: every process in them or below them, those
    /// that enter during the run too (`--cgroup`, `--container`).
    pub cgroups: Vec<crate::cgroup_names::TracedCgroup>,
    /// The pid is the command `run` started, which holds no socket before
    /// its exec (not a target to warn about).
    pub started_here: bool,
}

/// When the run stops by itself (besides a signal and `--max-size`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stop {
    /// Stop after this many seconds.
    pub duration: Option<f64>,
    /// Stop after this many distinct packets were stamped.
    pub count: Option<u64>,
}

/// What the run writes, where, within what budget, and how it is finished.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// Output directory: stamps.arrows (live), stamps.parquet, run.json.
    pub dir: PathBuf,
    /// Cut the recording into segments.
    pub rotate: Option<Rotate>,
    /// Disk budget of the recording (bytes).
    pub max_size: Option<u64>,
    /// Write this file (with our pid) once every probe is attached.
    pub ready_file: Option<PathBuf>,
    /// File mode mask of everything the run writes.
    pub umask: u32,
    /// Do not build the packets table at the end of the run.
    pub no_correlate: bool,
    /// End-to-end deadline for the packets table's deadline_missed flag.
    pub deadline_ms: Option<f64>,
}

impl Default for Output {
    fn default() -> Self {
        Output {
            dir: PathBuf::from("xlap-run"),
            rotate: None,
            max_size: None,
            ready_file: None,
            umask: 0o077,
            no_correlate: false,
            deadline_ms: None,
        }
    }
}

/// What is stamped, where, and how the stamps reach the reader.
#[derive(Clone, Debug, PartialEq)]
pub struct Stamping {
    /// Kernel points to stamp (`--points`).
    pub points: PointSet,
    /// Trace kernel points only, no USDT markers.
    pub no_usdt: bool,
    /// USDT probes to attach as app points (none: every xlap marker).
    pub usdt: Vec<Selection>,
    /// How markers of our marker crate and C header are stamped.
    pub marker_path: SitePath,
    /// Where the send/receive boundary is stamped (`--boundary`).
    pub boundary: BoundaryRequest,
    /// Stamp only the datagrams of this sample (`--sample 1/N`).
    pub sample: Option<Sample>,
    /// Device and qdisc points only on these devices.
    pub ifaces: Vec<String>,
    /// UDP ports carrying a VXLAN-like tunnel, besides the known ones.
    pub tunnel_ports: Vec<u16>,
    /// Where seq and kind are in the UDP payload: the default layout and
    /// those per port, their limits checked.
    pub layouts: Layouts,
    /// Every BPF program on a datagram's path returns at once: the hooks'
    /// dispatch cost alone, nothing stamped.
    pub empty_programs: bool,
    /// One ring-buffer record per stamp instead of per-CPU batches.
    pub per_stamp_records: bool,
}

impl Default for Stamping {
    fn default() -> Self {
        Stamping {
            points: PointSet::all(),
            no_usdt: false,
            usdt: Vec::new(),
            marker_path: SitePath::Ring,
            boundary: BoundaryRequest::Auto,
            sample: None,
            ifaces: Vec::new(),
            tunnel_ports: Vec::new(),
            layouts: Layouts {
                default: proto::preset(proto::DEFAULT_PRESET).expect("the default preset exists"),
                ports: Vec::new(),
            },
            empty_programs: false,
            per_stamp_records: false,
        }
    }
}

/// The recording process itself: its ring buffer, priority, privileges,
/// and what it says of the machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorder {
    /// Ring buffer size in KiB (power of two).
    pub ringbuf_kib: u32,
    /// Keep the reader at normal CPU priority.
    pub full_priority: bool,
    /// When the kernel times BPF programs.
    pub stats_mode: StatsMode,
    /// Host name recorded with the stamps (default: the system's).
    pub host: Option<String>,
    /// Start even without a capability the run needs.
    pub skip_capability_check: bool,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            ringbuf_kib: 16 * 1024,
            full_priority: false,
            stats_mode: StatsMode::Sampled,
            host: None,
            skip_capability_check: false,
        }
    }
}

/// What the user sees while the run goes on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct View {
    /// Print only the summary.
    pub quiet: bool,
    /// The live view on the terminal.
    pub live: bool,
    /// Serve OpenMetrics on this address while recording.
    pub metrics: Option<std::net::SocketAddr>,
    /// `--collect` with the view: the peers' stamps as they arrive, joined
    /// with this host's for the cross-host latency.
    pub peers: Option<std::sync::Arc<crate::peer::live::PeerFeed>>,
}
