//! The command line: what clap parses, nothing more. The commands turn
//! these arguments into the libraries' options (`commands/`).

mod estimate;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
pub use estimate::{EstimateArgs, ProbeCommand};
use std::path::PathBuf;
use xlap_capture::proto;
use xlap_exit::{failure, Code};

/// Where the latency and jitter of a live protocol come from, packet by
/// packet, across layers and hosts: eBPF stamps at the socket, qdisc, driver
/// and scheduler, joined by the protocol's own sequence numbers.
///
/// `xlap-trace --pid PID` is short for `xlap-trace record --pid PID`.
///
/// Exit codes: 0 success, 1 runtime failure, 2 bad command line (also an
/// unknown query, parameter or kind, SQL the engine refuses), 3 missing
/// privileges, 4 kernel lacks a feature (BTF, tracepoint), 5 no such process,
/// 6 bad input (not a run directory or packets table, wrong schema version,
/// no packets, only one end recorded).
#[derive(Parser, Debug)]
#[command(name = "xlap-trace", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub record: RecordArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Stamp every packet of running processes at the kernel's socket, qdisc,
    /// device and scheduler points, into Arrow/Parquet.
    Record(Box<RecordArgs>),
    /// Start a command and trace it (and the processes it starts) from its
    /// first instruction to its exit; exits with the command's status.
    Run(Box<RunArgs>),
    /// Write a run's compact summary (per-stage distributions, kilobytes):
    /// a CI baseline to commit or keep as an artifact.
    Summary(SummaryArgs),
    /// Compare a candidate run with a baseline: per metric and stage, the
    /// change with a bootstrap interval and a verdict. Exit codes: 0 no
    /// regression, 1 regression, 2 error, 6 bad input, 8 out of memory.
    Compare(CompareArgs),
    /// Per-stage quantiles over a series of runs (summaries or run
    /// directories, oldest first): the drift no single comparison flags.
    History(HistoryArgs),
    /// Write or check the Arrow schemas of what xlap-trace writes.
    Schema(SchemaArgs),
    /// Network-namespace test hosts joined by veth (for demos and tests).
    #[command(subcommand)]
    Stage(StageCommand),
    /// Join the stamps of one or more runs (e.g. the two hosts of a
    /// connection) into the per-packet table, clocks mapped onto the first.
    Correlate(CorrelateArgs),
    /// A partitioned dataset of runs (hive layout: DIR/run_id=…/), which
    /// DuckDB and Spark read alike, and every command that takes a run
    /// takes: DIR for all its runs, DIR/run_id=ID for one.
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// Make runs whose recorder died (kill -9, out of memory) whole again:
    /// stamps.parquet from the live stream, run.json marked `recovered`
    /// with what cannot be known. The commands that read runs do it by
    /// themselves.
    Recover(RecoverArgs),
    /// List the stamp points and the protocol presets.
    Points,
    /// The main job end to end: a two-host stage, the example protocol
    /// across it, traced at every layer, and what the trace shows.
    Demo(DemoArgs),
    /// Run the bundled analyses (queries/*.sql) over a run: jitter, outlier
    /// causes, correlation, latency profile, histogram, trend, loss, trace.
    Analyze(AnalyzeArgs),
    /// Run your own SQL over a run's views (packets, stages, stamps, runs,
    /// ...); without a statement, an interactive prompt.
    Sql(SqlArgs),
    /// A self-contained HTML report with SVG plots: box plots per stage,
    /// outlier causes, correlation, latency profile, slowest packets.
    Report(ReportArgs),
    /// Export per-packet timelines for Perfetto / chrome://tracing.
    Export(ExportArgs),
    /// Generate a synthetic run with a known ground truth (tests, benchmarks).
    Synth(SynthArgs),
    /// A built-in UDP prober: an echo responder (`serve`) and RTT
    /// measurements to it (`rtt`), for `estimate`.
    #[command(subcommand)]
    Probe(ProbeCommand),
    /// Every host's software latency (mean, quantiles, with intervals) from
    /// the RTTs between pairs of three or more hosts, without synchronised
    /// clocks.
    Estimate(EstimateArgs),
    /// Finish one run directory (its packets table and summary.json) in a
    /// process of its own: what the recorder runs for each segment of a
    /// rotated recording.
    #[command(name = xlap_capture::record::segments::FINISH_COMMAND, hide = true)]
    Finish(FinishArgs),
    /// Decode a peer's stamps stream (stdin) into records (stdout), confined:
    /// what `record --collect --live` runs per peer.
    #[command(name = xlap_capture::peer::live::DECODE_COMMAND, hide = true)]
    PeerDecode,
}

#[derive(Args, Debug)]
pub struct FinishArgs {
    pub run: PathBuf,
    #[arg(long)]
    pub deadline_ms: Option<f64>,
    /// Print the correlation and the latency summary (the end of a run).
    #[arg(long)]
    pub print: bool,
    /// With --print: the latency summary only.
    #[arg(long)]
    pub quiet: bool,
    /// A peer recorder's run inside RUN (record --collect), correlated
    /// with it (repeatable).
    #[arg(long = "peer", value_name = "DIR")]
    pub peers: Vec<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for a terminal.
    Table,
    Json,
    Csv,
    /// GitHub-flavoured Markdown (CI job summaries).
    Markdown,
}

/// What `analyze --by` names each end of a packet by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SplitBy {
    Cgroup,
    Container,
    Pod,
}

impl SplitBy {
    /// The `cgroups` query's `split` parameter.
    pub fn param(self) -> &'static str {
        match self {
            SplitBy::Cgroup => "cgroup",
            SplitBy::Container => "container",
            SplitBy::Pod => "pod",
        }
    }
}

#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// A run directory (from `record`), a directory of runs, or a packets
    /// Parquet file (from `correlate`).
    pub run: Option<PathBuf>,
    /// Query to run (repeatable; `all` for every one). Default: summary,
    /// jitter, outlier_causes, correlation, trend, loss.
    #[arg(short, long)]
    pub query: Vec<String>,
    /// Keep only packets of this kind: its number, or its name when the
    /// protocol preset names kinds (`data`).
    #[arg(long)]
    pub kind: Option<String>,
    /// A query parameter NAME=VALUE (repeatable), e.g. top=10, seq=4711,
    /// stage=e2e, bins=50.
    #[arg(short, long)]
    pub param: Vec<String>,
    /// Round trips of a request kind and its response kind (numbers, or
    /// the preset's names), e.g. 3:2 for sockperf's ping and pong: runs the
    /// `exchange` query for that pair (without it, `-q exchange` takes the
    /// pair of kinds that most seqs travel both ways).
    #[arg(long, value_name = "REQ:RESP")]
    pub exchange: Option<String>,
    /// Split the stages by where each end ran: its process's cgroup (by
    /// path), the container or the Kubernetes pod that cgroup's path names
    /// (run.json `cgroups`): runs the `cgroups` query so.
    #[arg(long, value_enum)]
    pub by: Option<SplitBy>,
    #[arg(short, long, value_enum, default_value = "table")]
    pub format: OutputFormat,
    #[command(flatten)]
    pub view: ViewArgs,
    /// List the bundled queries and their parameters.
    #[arg(long)]
    pub list: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct SqlArgs {
    /// A run directory, a directory of runs, or a packets Parquet file.
    pub run: PathBuf,
    /// The statement; without it, statements are read from stdin (a prompt
    /// on a terminal).
    pub sql: Option<String>,
    #[arg(short, long, value_enum, default_value = "table")]
    pub format: OutputFormat,
    #[command(flatten)]
    pub view: ViewArgs,
}

/// Which end-to-end latency and which packets an analysis sees.
#[derive(Args, Debug, Clone, Copy)]
pub struct ViewArgs {
    /// End-to-end latency as `e2e_ns`: `wire` (first sender point to last
    /// receiver point, the channel included, clocks mapped) or `xlap`
    /// (X-LAP's: sender total + receiver total, no clock mapping).
    #[arg(long, value_enum, default_value = "wire")]
    pub e2e: E2eArg,
    /// Only the packets at or below their kind's end-to-end fence (Q3 +
    /// 1.5·IQR), and the lost: X-LAP's box plots of the regular packets.
    #[arg(long)]
    pub inliers: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum E2eArg {
    Wire,
    Xlap,
}

impl ViewArgs {
    pub fn view(&self) -> xlap_analyze::dataset::View {
        use xlap_analyze::dataset::{E2e, View};
        View {
            e2e: match self.e2e {
                E2eArg::Wire => E2e::Wire,
                E2eArg::Xlap => E2e::Xlap,
            },
            inliers: self.inliers,
        }
    }
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A run directory, a directory of runs, or a packets Parquet file;
    /// more than one: the report is about the first, with every run's
    /// end-to-end latency profile overlaid in one plot.
    #[arg(required = true, num_args = 1..)]
    pub runs: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(short, long, default_value = "report.html")]
    pub output: PathBuf,
    /// Keep only packets of this kind (number or name).
    #[arg(long)]
    pub kind: Option<String>,
    /// Slowest packets drawn as waterfalls.
    #[arg(long, default_value_t = 5)]
    pub slowest: u32,
    #[command(flatten)]
    pub view: ViewArgs,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("format").required(true).multiple(true).args(["perfetto", "pcapng"])))]
pub struct ExportArgs {
    /// A run directory, a directory of runs, or a packets Parquet file.
    pub run: PathBuf,
    /// Chrome trace-event JSON for Perfetto (ui.perfetto.dev) or
    /// chrome://tracing.
    #[arg(long)]
    pub perfetto: Option<PathBuf>,
    /// A pcapng file for Wireshark/tshark: each packet once per side, at
    /// its wire point, headers synthesized (no payload is recorded), the
    /// X-LAP breakdown in each frame's comment.
    #[arg(long)]
    pub pcapng: Option<PathBuf>,
    /// Export at most this many packets (0: all): the slowest first to
    /// Perfetto, the first sent to pcapng.
    #[arg(long, visible_alias = "limit", default_value_t = 10_000)]
    pub max_packets: u64,
    /// Keep only packets of this kind (number or name).
    #[arg(long)]
    pub kind: Option<String>,
}

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Output directory (packets.parquet, run.json).
    #[arg(short, long)]
    pub output: PathBuf,
    #[arg(long, default_value_t = 10_000)]
    pub packets: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u32,
}

#[derive(Args, Debug)]
pub struct SummaryArgs {
    /// Run directories (correlated): one summary; several pool into one
    /// baseline (the spread between runs becomes part of it).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Output file (default: RUN/summary.json for one run).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Baseline: a run directory or a summary file.
    pub baseline: PathBuf,
    /// Candidate: a run directory or a summary file.
    pub candidate: PathBuf,
    /// Metric to compare (repeatable): e2e.pNN or stage:NAME.pNN. Default:
    /// p50 and p99 of the end-to-end latency and of every stage.
    #[arg(long = "metric", value_name = "METRIC")]
    pub metrics: Vec<xlap_ci::compare::Metric>,
    /// Largest change allowed before a regression (5% or 0.05).
    #[arg(long, default_value = "10%", value_parser = xlap_ci::compare::parse_fraction)]
    pub max_regression: f64,
    /// Smallest absolute change that can be a regression (10us, 500ns,
    /// 1ms): a regression exceeds both this and --max-regression.
    #[arg(long, default_value = "20us", value_parser = xlap_ci::compare::parse_duration_ns)]
    pub min_change: f64,
    /// Family-wise confidence: the chance that an unchanged candidate gets
    /// no regression on any metric (each metric's interval at 1 − (1 −
    /// confidence)/metrics).
    #[arg(long, default_value_t = 0.99)]
    pub confidence: f64,
    /// Print GitHub-flavoured Markdown (a CI step summary) instead of a
    /// table.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Print JSON (stable: format_version, verdict, rows).
    #[arg(long)]
    pub json: bool,
    /// Also write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct HistoryArgs {
    /// Summaries or run directories, oldest first.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Metric to follow (repeatable): e2e.pNN or stage:NAME.pNN. Default:
    /// p50 and p99 of every stage.
    #[arg(long = "metric", value_name = "METRIC")]
    pub metrics: Vec<xlap_ci::compare::Metric>,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Also write an SVG plot of the metrics that drifted most.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Metrics in the plot.
    #[arg(long, default_value_t = 6)]
    pub top: usize,
}

#[derive(Args, Debug)]
pub struct RecoverArgs {
    /// Run directories left `running` by a recorder that is gone.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CorrelateArgs {
    /// Run directories (written by `record`); the first one's clock is the
    /// reference.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Output Parquet file of the packets table.
    #[arg(short, long, default_value = xlap_records::run_dir::PACKETS)]
    pub output: PathBuf,
    /// Flag packets whose end-to-end latency exceeds this deadline.
    #[arg(long)]
    pub deadline_ms: Option<f64>,
    /// Print the result as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Data packets the example protocol sends.
    #[arg(long, default_value_t = 10_000)]
    pub count: u32,
    /// Interval between data packets, microseconds.
    #[arg(long, default_value_t = 200)]
    pub period_us: u64,
    /// Run the example build without USDT markers.
    #[arg(long)]
    pub plain: bool,
    /// Directory for the protocol logs and the trace.
    #[arg(short, long, default_value = "xlap-demo")]
    pub output: PathBuf,
}

/// How the markers of the xlap-marker crate deliver their stamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MarkerPath {
    // (Plain comments: see BpfStats.) A shared-memory ring the markers
    // write in process, no trap; other USDT binaries keep uprobes.
    Ring,
    // A uprobe at every marker, as for any USDT binary.
    Uprobe,
}

impl From<MarkerPath> for xlap_records::run_meta::SitePath {
    fn from(path: MarkerPath) -> Self {
        match path {
            MarkerPath::Ring => Self::Ring,
            MarkerPath::Uprobe => Self::Uprobe,
        }
    }
}

/// When the kernel times BPF programs (`--bpf-stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BpfStats {
    // (Plain comments: clap would print doc comments of the values as a
    // long list and switch the whole help to its long layout.)
    // On in short windows (a tenth of the run).
    Sampled,
    // On for the whole run.
    Full,
    // Never on (no cost figures in run.json).
    Off,
}

/// Where the send/receive points are stamped (`--boundary`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BoundaryArg {
    // At the socket calls, and the send syscalls' entry once a traced UDP
    // socket is connected.
    Auto,
    // At the send and receive syscalls.
    Syscalls,
    // At the socket calls.
    SocketCalls,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Endian {
    Big,
    Little,
}

/// `xlap-trace run [OPTIONS] -- CMD [ARGS...]`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub record: RecordArgs,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    /// Process to trace (repeatable): its UDP sockets, send and receive paths.
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Trace every process of this cgroup v2 and of the cgroups below it
    /// (a path below the cgroup2 root, as /proc/PID/cgroup writes it):
    /// those there at the start, what they fork, and those that enter it
    /// later (at their first socket, fork or exec there; the rest by a
    /// rescan of its cgroup.procs every second).
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,
    /// Trace every process of the container whose id starts with ID
    /// (docker, containerd/CRI, CRI-O, podman; found by its cgroup's path),
    /// as --cgroup does its cgroup.
    #[arg(long = "container", value_name = "ID")]
    pub containers: Vec<String>,
    /// Set by `run`: the pid is the command it started, which holds no
    /// socket before its exec (not a target to warn about).
    #[arg(skip)]
    pub started_here: bool,
    /// Output directory: stamps.arrows (live), stamps.parquet, run.json.
    #[arg(short, long, default_value = "xlap-run")]
    pub output: PathBuf,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Stop after this many distinct packets were stamped.
    #[arg(long)]
    pub count: Option<u64>,
    /// Cut the recording into segments, each a run directory of its own
    /// (OUTPUT/seg-000001, ...; OUTPUT/segments.json lists them): when a
    /// segment's live stream reaches SIZE (e.g. 512MiB, 2GB) or after
    /// DURATION (e.g. 30s, 10min, 1h). A packet in flight at a cut is
    /// partial in each (the recording read as a whole joins it).
    #[arg(long, value_name = "SIZE|DURATION", value_parser = xlap_capture::record::segments::parse_rotate)]
    pub rotate: Option<xlap_capture::record::segments::Rotate>,
    /// Disk budget of the recording: with --rotate, the oldest finished
    /// segments are deleted to stay within it (segments.json says which);
    /// without, the run stops when its live stream reaches it (Parquet
    /// adds about a quarter at the end).
    #[arg(long, value_name = "SIZE", value_parser = xlap_capture::record::segments::parse_size)]
    pub max_size: Option<u64>,
    /// Write this file (with our pid) once every probe is attached.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// File mode mask (octal) of everything the run writes; the default
    /// keeps a run private to its owner (files 0600, directories 0700):
    /// 022 shares it read-only.
    #[arg(long, default_value = "077", value_parser = parse_umask)]
    pub umask: u32,
    /// Start even without a capability the run needs (for kernels or
    /// security modules where xlap-trace's table is wrong): it is said, and
    /// the run may fail or miss points.
    #[arg(long)]
    pub skip_capability_check: bool,
    /// Named layout of seq and kind in the UDP payload (see `xlap-trace
    /// points`); default xlap-example. With explicit --seq-* options and no
    /// --proto, the layout has no kind unless --kind-* give one.
    #[arg(long)]
    pub proto: Option<String>,
    /// Byte offset of the sequence number in the UDP payload (overrides --proto).
    #[arg(long)]
    pub seq_offset: Option<u32>,
    /// Bytes of the sequence number: 1, 2, 4 or 8.
    #[arg(long)]
    pub seq_size: Option<u8>,
    /// Byte order of seq and kind.
    #[arg(long, value_enum)]
    pub seq_endian: Option<Endian>,
    /// Byte offset of the packet kind in the UDP payload.
    #[arg(long)]
    pub kind_offset: Option<u32>,
    /// Bytes of the packet kind: 0 (none), 1, 2 or 4.
    #[arg(long)]
    pub kind_size: Option<u8>,
    /// Another layout for the datagrams to or from a UDP port (repeatable,
    /// up to 3): PORT=PRESET (e.g. 5005=rtcp) or
    /// PORT=seq:OFFSET:SIZE[,kind:OFFSET:SIZE[:MASK]][,le]. A datagram takes
    /// the layout of its destination port, else of its source port, else
    /// the one of --proto/--seq-*.
    #[arg(long = "layout", value_name = "PORT=SPEC")]
    pub port_layouts: Vec<proto::PortLayout>,
    /// Attach this USDT probe as an app point (repeatable):
    /// PROVIDER:NAME=POINT[,seq=argN][,kind=argM]. Default: every xlap:NAME
    /// marker as app.NAME with seq=arg0, kind=arg1.
    #[arg(long, value_name = "SPEC")]
    pub usdt: Vec<xlap_capture::usdt::Selection>,
    /// Kernel points to stamp: all (default), standard (each layer once:
    /// no driver-entry points), minimal (sock.send_enter, dev.xmit,
    /// dev.receive_skb, sock.recv_exit) or point names separated by
    /// commas. Fewer points perturb the traced protocol less.
    #[arg(long, value_name = "SET", default_value = "all")]
    pub points: String,
    /// Trace kernel points only, no USDT markers.
    #[arg(long, conflicts_with = "usdt")]
    pub no_usdt: bool,
    /// How markers from our marker crate or C header are stamped: ring (an
    /// in-process shared-memory ring, no trap per marker) or uprobe. Other
    /// USDT binaries, and --usdt selections, always use uprobes.
    #[arg(long, value_name = "PATH", default_value = "ring")]
    pub marker_path: MarkerPath,
    /// Ring buffer size in KiB (power of two).
    #[arg(long, default_value_t = 16 * 1024)]
    pub ringbuf_kib: u32,
    /// Host name recorded with the stamps (default: the system's).
    #[arg(long)]
    pub host: Option<String>,
    /// Keep the reader at normal CPU priority (default: SCHED_BATCH, nice
    /// 19, so the traced processes are perturbed least; raised to normal
    /// while the reader falls behind the ring buffer).
    #[arg(long)]
    pub full_priority: bool,
    /// Export one ring-buffer record per stamp instead of per-CPU batches of
    /// stamps (costlier; for comparison in benchmarks).
    #[arg(long)]
    pub per_stamp_records: bool,
    /// Attach the run's hooks with BPF programs that return at once:
    /// nothing is stamped. What the hooks' dispatch alone costs the traced
    /// protocol, the floor under any program on them (docs/performance.md).
    #[arg(long)]
    pub empty_programs: bool,
    /// Where the send/receive points are stamped: auto (the socket calls'
    /// own hooks, which nothing else on the machine pays for, and, once a
    /// traced UDP socket is connected, the send syscalls' entry for its
    /// sends; the syscalls on kernels before 6.12), syscalls (sys_enter and
    /// sys_exit from the start: every point, but every syscall of the
    /// machine takes the kernel's slow path while they are attached, an
    /// untraced getppid 118 -> 272 ns) or socket-calls (never the
    /// syscalls: a connected socket's sends have no sock.send_enter)
    #[arg(long, value_enum, value_name = "AT", default_value = "auto")]
    pub boundary: BoundaryArg,
    /// Stamp one datagram in N, chosen by a hash of its seq, so recorders
    /// on both hosts keep the same datagrams, each with every point; the
    /// others cost each later point a lookup (run.json and the packets
    /// table's sample_weight say the rate)
    #[arg(long, value_name = "1/N")]
    pub sample: Option<String>,
    /// Sample only these kinds (numbers, or names of the layout's kinds,
    /// separated by commas); datagrams of other kinds are all stamped
    #[arg(long, value_name = "KINDS", requires = "sample", value_delimiter = ',')]
    pub sample_kinds: Vec<String>,
    /// When the kernel times BPF programs, for the run's own cost figures:
    /// sampled (100 ms of every second), full (exact run counts) or off
    /// (the timing costs every BPF program of the machine two clock reads
    /// per run while on)
    #[arg(long, value_enum, value_name = "MODE", default_value = "sampled")]
    pub bpf_stats: BpfStats,
    /// Short for --bpf-stats off.
    #[arg(long, conflicts_with = "bpf_stats")]
    pub no_bpf_stats: bool,
    /// Print only the summary.
    #[arg(short, long)]
    pub quiet: bool,
    /// Show, refreshed every second while recording, per kind the
    /// end-to-end and per-stage p50/p99 of the last 10-20 s, packet and
    /// stamp rates, the tracer's losses and the top outlier cause (redrawn
    /// in place on a terminal, one block per second otherwise).
    #[arg(long)]
    pub live: bool,
    /// Serve the same histograms and loss counters as OpenMetrics (for
    /// Prometheus) on ADDR:PORT while recording, e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Device and qdisc points only on this device (repeatable), looked up
    /// in each traced process's network namespace; default: every device.
    #[arg(long = "iface", value_name = "NAME")]
    pub ifaces: Vec<String>,
    /// A UDP port carrying a VXLAN-like tunnel (Ethernet frames after an
    /// 8-byte header), besides VXLAN's 4789 and 8472 (Geneve's 6081 is
    /// always known): its datagrams are keyed by the datagram inside.
    #[arg(long = "tunnel-port", value_name = "PORT")]
    pub tunnel_ports: Vec<u16>,
    /// Do not build the packets table at the end of the run.
    #[arg(long)]
    pub no_correlate: bool,
    /// End-to-end deadline for the packets table's deadline_missed flag.
    #[arg(long)]
    pub deadline_ms: Option<f64>,
    /// Also stream this run to a recorder started with --collect on
    /// HOST:PORT (its run is recorded here all the same); needs
    /// --token-file or --token. Not with --rotate.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "collect")]
    pub to: Option<String>,
    /// Also accept peer recorders (started with --to) on ADDR:PORT: their
    /// runs are written into OUTPUT/peer-N-HOST as they arrive, and this
    /// run's packets table joins theirs. Needs --token-file or --token.
    /// Not with --rotate.
    #[arg(long, value_name = "ADDR:PORT")]
    pub collect: Option<std::net::SocketAddr>,
    /// The peer link's shared token: this file's text (surrounding white
    /// space left out; at least 8 characters).
    #[arg(long, value_name = "PATH", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// The peer link's shared token itself (visible to every user in `ps`:
    /// prefer --token-file).
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Seconds the end of the peer link may take: a collector's wait for
    /// its peers' ends after its own run ended, a peer's for sending the
    /// rest.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub peer_wait: f64,
}

#[derive(Args, Debug)]
pub struct SchemaArgs {
    /// Write `<table>.schema.json` files into this directory.
    #[arg(long, conflicts_with = "check")]
    pub write: Option<PathBuf>,
    /// Fail (exit 1) when the files in this directory differ from the code.
    #[arg(long)]
    pub check: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum DatasetCommand {
    /// Add runs to a dataset (created if missing): each run's packets
    /// (correlated first if it has none), its recordings' stamps and its
    /// metadata, hard-linked where they share a file system, else copied.
    Add(DatasetAddArgs),
}

#[derive(Args, Debug)]
pub struct DatasetAddArgs {
    /// Runs: run directories, or directories of the hosts' runs.
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The dataset directory.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Replace a run already in the dataset (by its run id) instead of
    /// refusing it.
    #[arg(long)]
    pub replace: bool,
    /// Print what was added as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum StageCommand {
    /// Build a stage and keep it until Ctrl-C (then remove it).
    Up {
        /// Number of hosts: 2 (veth pair) or 3 (bridge).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(2..=3))]
        hosts: u8,
        /// Qdisc of a host's link: HOST=SPEC with HOST a letter (a, b, c) and
        /// SPEC tbf[:RATE[:BURST[:LATENCY]]], htb[:RATE],
        /// htb-classes:MINOR=RATE,... (classes 1:MINOR, hex, the first the
        /// default; SO_PRIORITY 0x1MINOR picks one) or pfifo. Repeatable.
        #[arg(long, value_name = "HOST=SPEC")]
        qdisc: Vec<String>,
        /// A second veth pair xl1 between two veth hosts (10.78.0.x,
        /// fd78::x): a second path for redundant transmission.
        #[arg(long)]
        second_path: bool,
        /// The link between the hosts: veth, veth-gro (NAPI + GRO), tap (a
        /// NIC-style receive through napi_gro_frags), macvlan (a stacked
        /// device) or vxlan (a tunnel). Two hosts only, except veth.
        #[arg(long, default_value = "veth", value_parser = xlap_stage::Link::parse)]
        link: xlap_stage::Link,
        /// MTU of the hosts' links (default: the device's own).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1280..=65535))]
        mtu: Option<u32>,
    },
    /// Remove stages left behind by processes that no longer exist.
    Sweep {
        /// Exit 1 when there was anything to remove (tests leaked a stage).
        #[arg(long)]
        check: bool,
    },
    /// List the stage namespaces on this machine.
    List,
}

/// An octal file mode mask (`077`, `0022`).
fn parse_umask(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("not an octal mode mask (e.g. 077 or 022): {text}"))
}

pub fn parse_qdisc_args(specs: &[String], hosts: usize) -> Result<Vec<Option<xlap_stage::Qdisc>>> {
    let mut out = vec![None; hosts];
    for spec in specs {
        let (host, q) = spec.split_once('=').ok_or_else(|| {
            failure(
                Code::Usage,
                format!("--qdisc wants HOST=SPEC, got {spec:?}"),
            )
        })?;
        let idx = match host {
            "a" => 0,
            "b" => 1,
            "c" => 2,
            _ => usize::MAX,
        };
        if idx >= hosts {
            return Err(failure(
                Code::Usage,
                format!("--qdisc: no host {host:?} on a {hosts}-host stage"),
            ));
        }
        out[idx] = Some(xlap_stage::Qdisc::parse(q).map_err(|e| failure(Code::Usage, e))?);
    }
    Ok(out)
}
