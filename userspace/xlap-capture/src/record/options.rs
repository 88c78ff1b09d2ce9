//! What a recording does, decided before it starts: the recorder's whole
//! configuration, built by the CLI from its arguments (or by any caller
//! that records in-process), never the argument structs themselves.

use super::segments::Rotate;
use super::StatsMode;
use crate::proto::{self, Layouts};
use crate::usdt::Selection;
use std::path::PathBuf;
use xlap_records::run_meta::SitePath;

/// A recording's configuration. [`Default`] is the command line's
/// defaults (the CLI checks that the two agree).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordOptions {
    /// Processes to trace: their UDP sockets, send and receive paths.
    pub pids: Vec<u32>,
    /// The pid is the command `run` started, which holds no socket before
    /// its exec (not a target to warn about).
    pub started_here: bool,
    /// Output directory: stamps.arrows (live), stamps.parquet, run.json.
    pub output: PathBuf,
    /// Stop after this many seconds.
    pub duration: Option<f64>,
    /// Stop after this many distinct packets were stamped.
    pub count: Option<u64>,
    /// Cut the recording into segments.
    pub rotate: Option<Rotate>,
    /// Disk budget of the recording (bytes).
    pub max_size: Option<u64>,
    /// Write this file (with our pid) once every probe is attached.
    pub ready_file: Option<PathBuf>,
    /// File mode mask of everything the run writes.
    pub umask: u32,
    /// Start even without a capability the run needs.
    pub skip_capability_check: bool,
    /// Where seq and kind are in the UDP payload: the default layout and
    /// those per port, their limits checked.
    pub layouts: Layouts,
    /// USDT probes to attach as app points (none: every xlap marker).
    pub usdt: Vec<Selection>,
    /// Kernel points to stamp: a set name or point names separated by
    /// commas.
    pub points: String,
    /// Trace kernel points only, no USDT markers.
    pub no_usdt: bool,
    /// How markers of our marker crate and C header are stamped.
    pub marker_path: SitePath,
    /// Ring buffer size in KiB (power of two).
    pub ringbuf_kib: u32,
    /// Host name recorded with the stamps (default: the system's).
    pub host: Option<String>,
    /// Keep the reader at normal CPU priority.
    pub full_priority: bool,
    /// One ring-buffer record per stamp instead of per-CPU batches.
    pub per_stamp_records: bool,
    /// Every BPF program on a datagram's path returns at once: the hooks'
    /// dispatch cost alone, nothing stamped.
    pub empty_programs: bool,
    /// Where the send/receive boundary is stamped (`--boundary`).
    pub boundary: crate::capture::BoundaryRequest,
    /// Stamp only the datagrams of this sample (`--sample 1/N`).
    pub sample: Option<xlap_records::sample::Sample>,
    /// When the kernel times BPF programs.
    pub stats_mode: StatsMode,
    /// Print only the summary.
    pub quiet: bool,
    /// The live view on the terminal.
    pub live: bool,
    /// Serve OpenMetrics on this address while recording.
    pub metrics: Option<std::net::SocketAddr>,
    /// Device and qdisc points only on these devices.
    pub ifaces: Vec<String>,
    /// UDP ports carrying a VXLAN-like tunnel, besides the known ones.
    pub tunnel_ports: Vec<u16>,
    /// Do not build the packets table at the end of the run.
    pub no_correlate: bool,
    /// End-to-end deadline for the packets table's deadline_missed flag.
    pub deadline_ms: Option<f64>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            pids: Vec::new(),
            started_here: false,
            output: PathBuf::from("xlap-run"),
            duration: None,
            count: None,
            rotate: None,
            max_size: None,
            ready_file: None,
            umask: 0o077,
            skip_capability_check: false,
            layouts: Layouts {
                default: proto::preset(proto::DEFAULT_PRESET).expect("the default preset exists"),
                ports: Vec::new(),
            },
            usdt: Vec::new(),
            points: "all".into(),
            no_usdt: false,
            marker_path: SitePath::Ring,
            ringbuf_kib: 16 * 1024,
            host: None,
            full_priority: false,
            per_stamp_records: false,
            empty_programs: false,
            boundary: crate::capture::BoundaryRequest::Auto,
            sample: None,
            stats_mode: StatsMode::Sampled,
            quiet: false,
            live: false,
            metrics: None,
            ifaces: Vec::new(),
            tunnel_ports: Vec::new(),
            no_correlate: false,
            deadline_ms: None,
        }
    }
}
