//! One capture session, step by step: `Plan::new` (check the request),
//! `Session::load` (the BPF object), `attach` (probes, targets, their
//! sockets), `follow` (drain the ring buffer while following processes and
//! sockets), `detach` (programs gone, the last stamps and the losses read
//! after), `Detached::finish` (Parquet and `run.json`).

use super::bpf_stats::StatsSampler;
use super::follow::Following;
use super::live_view::LiveView;
use super::markers::{MarkerOptions, MarkerSites, Markers};
use super::segments::{self, Rotate, Segments};
use super::tally::{ForeignFlows, Tally, BY_PORT_POINTS};
use super::RecordOptions;
use super::{brief_reason, protocols};
use crate::capture::{self, Batch, Capture, Settings};
use crate::proto::Layouts;
use crate::reader_priority::{thread_cpu_s, ReaderPriority};
use crate::runmeta::{
    self, Checkpoint, ClockPair, Exited, PointStats, ProgramStats, RunMeta, RunOptions, RunState,
    SchemaVersion, SegmentOf, SitePath, Target, UsdtSite,
};
use crate::{preflight, targets};
use anyhow::{Context, Result};
use aya::maps::{MapData, PerCpuArray, RingBuf};
use std::collections::{BTreeMap, HashSet};
use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xlap_abi::{xlap_loss, xlap_point, xlap_stamp};
use xlap_exit::{failure, Code};
use xlap_records::points::point_info;
use xlap_records::run_meta::Holds;
use xlap_records::writer::{stream_to_parquet_with, DropFlows, StampBatcher, StampStream};
use xlap_records::RunDir;
use xlap_records::Stamp;

/// Rows per Arrow batch; a batch is also cut every `FLUSH_EVERY`.
const BATCH_ROWS: usize = 16 * 1024;
const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// run.json is rewritten this often while the run goes on (counts, losses,
/// a clock pair): what `recover` reports for a recorder that died.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// Every CPU's batch is exported this often (bpf/hooks/flush.h).
const FLUSH_BATCHES_EVERY: Duration =
    Duration::from_millis(xlap_abi::XLAP_FLUSH_INTERVAL_MS as u64);
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
const POLL_MS: i32 = 20;

/// What the user asked for, checked before anything is loaded.
pub struct Plan<'a> {
    pub args: &'a RecordOptions,
    layouts: Layouts,
    points: crate::point_sets::PointSet,
    ringbuf_bytes: u32,
    tunnel_ports: Vec<u16>,
    /// Targets holding only TCP sockets at attach.
    tcp_only: Vec<(u32, String)>,
    /// Optional capabilities this process lacks.
    caps_missing: Vec<crate::capabilities::Need>,
}

impl<'a> Plan<'a> {
    pub fn new(args: &'a RecordOptions) -> Result<Plan<'a>> {
        if args.pids.is_empty() {
            return Err(failure(
                Code::Usage,
                "name the process to trace with --pid PID (repeatable)",
            ));
        }
        let layouts = args.layouts.clone();
        let points = crate::point_sets::PointSet::parse(&args.points)?;
        let ringbuf_bytes = args
            .ringbuf_kib
            .checked_mul(1024)
            .filter(|b| b.is_power_of_two() && *b >= 4096)
            .ok_or_else(|| {
                failure(
                    Code::Usage,
                    format!(
                        "--ringbuf-kib must be a power of two of at least 4, not {}",
                        args.ringbuf_kib
                    ),
                )
            })?;
        // SAFETY: umask only sets this process's file mode mask.
        unsafe { libc::umask(args.umask as libc::mode_t) };
        let caps_missing = preflight::check_privileges(args.skip_capability_check)?;
        preflight::check_btf()?;
        crate::preflight::check_kernel()?;
        preflight::check_pids(&args.pids)?;
        if let (Some(Rotate::Bytes(segment)), Some(max)) = (args.rotate, args.max_size) {
            if max < 2 * segment {
                return Err(failure(
                    Code::Usage,
                    format!("--max-size {max} cannot hold two segments of --rotate {segment} bytes: the budget deletes only finished segments"),
                ));
            }
        }
        std::fs::create_dir_all(&args.output).with_context(|| {
            format!(
                "cannot create the output directory {}",
                args.output.display()
            )
        })?;
        let mut tunnel_ports = capture::DEFAULT_TUNNEL_PORTS.to_vec();
        for port in &args.tunnel_ports {
            if !tunnel_ports.contains(port) {
                tunnel_ports.push(*port);
            }
        }
        Ok(Plan {
            args,
            layouts,
            points,
            ringbuf_bytes,
            tunnel_ports,
            tcp_only: if args.started_here {
                Vec::new()
            } else {
                protocols::check(&args.pids, args.quiet)
            },
            caps_missing,
        })
    }

    /// Whether traced processes are held at their exec and library loads
    /// for their markers: markers are traced, and a held process of
    /// another user can be resumed.
    fn holds(&self) -> bool {
        !self.args.no_usdt && !self.caps_missing.iter().any(|n| n.name == "CAP_KILL")
    }

    fn note(&self, text: impl std::fmt::Display) {
        if !self.args.quiet {
            eprintln!("xlap-trace: note: {text}");
        }
    }
}

/// The capture programs loaded (not yet attached to the targets).
pub struct Session {
    capture: Capture,
}

impl Session {
    pub fn load(plan: &Plan) -> Result<Session> {
        let args = plan.args;
        let mut capture = Capture::load(&Settings {
            layouts: plan.layouts.clone(),
            points: plan.points.clone(),
            ringbuf_bytes: plan.ringbuf_bytes,
            per_stamp: args.per_stamp_records,
            tunnel_ports: plan.tunnel_ports.clone(),
            iface_filter: !args.ifaces.is_empty(),
            hold_at_exec: plan.holds(),
        })?;
        if !args.ifaces.is_empty() {
            let devices = crate::ifaces::resolve(&args.pids, &args.ifaces)?;
            capture.set_ifaces(&devices)?;
        }
        for need in &plan.caps_missing {
            if need.required {
                eprintln!("xlap-trace: warning: without {} (--skip-capability-check) the run may fail or miss points; it is needed for {}", need.name, need.for_what);
            } else {
                plan.note(format!(
                    "without {}, left out: {}",
                    need.name, need.for_what
                ));
            }
        }
        if let (Err(why), false) = (&capture.batch_export, args.per_stamp_records) {
            plan.note(format!("per-CPU batches are exported only by later stamps and idle CPUs, not every {} ms: a recorder that dies may lose more ({why})", xlap_abi::XLAP_FLUSH_INTERVAL_MS));
        }
        if let Some((major, minor)) = preflight::kernel_as() {
            plan.note(format!("behaving as Linux {major}.{minor} would (XLAP_KERNEL_AS): what it lacks is left out"));
        }
        let lacking = capture.lacking();
        for (point, why) in &lacking.missing {
            plan.note(format!(
                "{point} not traced here ({}; run.json has the whole reason)",
                brief_reason(why)
            ));
        }
        // One line per reason, with the points it weakens.
        let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (point, what) in &lacking.degraded {
            by_reason.entry(what).or_default().push(point);
        }
        for (what, points) in by_reason {
            plan.note(format!("{}: {}", points.join(", "), brief_reason(what)));
        }
        Ok(Session { capture })
    }

    /// Attaches the USDT markers, names the targets to the kernel side,
    /// marks their sockets, and signals readiness.
    pub fn attach(mut self, plan: &Plan) -> Result<Live> {
        let args = plan.args;
        let holds = if plan.holds() {
            Some(self.capture.take_holds()?)
        } else {
            None
        };
        // Markers built with the xlap-marker crate write an in-process ring
        // (no trap per hit); every other site gets a uprobe.
        let markers = Markers::start(
            &mut self.capture,
            &args.pids,
            MarkerOptions {
                selections: &args.usdt,
                traced: !args.no_usdt,
                ring_path: args.marker_path == xlap_records::run_meta::SitePath::Ring,
                started_here: args.started_here,
                quiet: args.quiet,
            },
            holds,
            &|why| plan.note(why),
        )?;
        self.capture.set_targets(&args.pids)?;
        let following = Following::start(&mut self.capture, &args.pids, args.quiet)?;
        let ring = self.capture.take_ring()?;
        let batches = self.capture.take_batches()?;
        let losses = self.capture.take_losses()?;
        let flow_maps = self.capture.take_flows()?;

        let run_id = format!(
            "{}-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            std::process::id()
        );
        let clock_start = runmeta::sample_clocks();
        let (segments, files, segment) = open_output(args, &run_id, clock_start.monotonic_ns)?;
        let run_id = segment.as_ref().map_or(run_id, SegmentOf::run_id);
        let host = args.host.clone().unwrap_or_else(runmeta::hostname);
        let comms = args.pids.iter().map(|&p| targets::comm(p)).collect();
        let timestamping = crate::hwts::survey(&args.pids);
        if let Some(m) = crate::hwts::message(&timestamping) {
            plan.note(m);
        }
        let view = (args.live || args.metrics.is_some())
            .then(|| {
                LiveView::new(
                    markers.sites.usdt.app_names.clone(),
                    args.live,
                    args.metrics,
                )
            })
            .transpose()?;
        let meta = initial_meta(
            &self.capture,
            plan,
            run_id.clone(),
            host.clone(),
            clock_start,
            segment,
            timestamping,
        );
        let mut live = Live {
            attached: Attached {
                capture: self.capture,
            },
            following,
            ring,
            batches,
            losses,
            flow_maps,
            sink: Sink {
                batcher: StampBatcher::new(&run_id, &host, markers.sites.usdt.app_names.clone()),
                stream: StampStream::create(&files.stamps_stream())?,
                streamed: 0,
                stream_bytes: 0,
                stamps_total: 0,
                packets_total: 0,
                tally: Tally::default(),
                foreign: ForeignFlows::default(),
                stats: StatsSampler::start(args.stats_mode),
                view,
            },
            files,
            segments,
            segment_started: Instant::now(),
            segment_losses: Vec::new(),
            info: RunInfo {
                started: Instant::now(),
                cpu_start: thread_cpu_s(),
                comms,
                meta,
            },
            markers,
        };
        // run.json exists from the start: a run whose recorder dies is
        // still a run (`xlap-trace recover`).
        live.info.update_meta(
            plan,
            &live.markers.sites,
            &live.following,
            &live.sink.tally,
            &[],
            &BTreeMap::new(),
            &HashSet::new(),
        );
        live.info.meta.write(&live.files.meta())?;
        announce_ready(plan, &live)?;
        Ok(live)
    }
}

/// The run's directory, or the first segment's of a rotated recording.
fn open_output(
    args: &RecordOptions,
    run_id: &str,
    start_monotonic_ns: u64,
) -> Result<(Option<Segments>, RunDir, Option<SegmentOf>)> {
    Ok(match args.rotate {
        Some(rotate) => {
            let segments = Segments::start(
                &args.output,
                rotate,
                args.max_size,
                segments::FinishOptions {
                    correlate: !args.no_correlate,
                    deadline_ms: args.deadline_ms,
                    quiet: args.quiet,
                },
            )?;
            let segment = SegmentOf {
                index: 1,
                recording_id: run_id.to_string(),
                rotate: rotate.to_string(),
            };
            let files = segments.open(1, &segment.run_id(), start_monotonic_ns)?;
            (Some(segments), files, Some(segment))
        }
        None => (None, RunDir::new(args.output.clone()), None),
    })
}

/// run.json as it is written at the start (state `running`).
fn initial_meta(
    capture: &Capture,
    plan: &Plan,
    run_id: String,
    host: String,
    clock_start: runmeta::ClockPair,
    segment: Option<SegmentOf>,
    timestamping: Vec<runmeta::DeviceTimestamping>,
) -> RunMeta {
    let args = plan.args;
    let lacking = capture.lacking();
    RunMeta {
        schema_version: SchemaVersion::default(),
        software_version: env!("CARGO_PKG_VERSION").into(),
        state: RunState::Running,
        recorder: Some(runmeta::this_recorder()),
        checkpoint_every_s: Some(CHECKPOINT_EVERY.as_secs_f64()),
        checkpoint: None,
        batch_export_every_ms: capture
            .batch_export
            .is_ok()
            .then_some(FLUSH_BATCHES_EVERY.as_millis() as u64),
        run_id,
        host,
        kernel: runmeta::kernel_release(),
        boot_id: runmeta::boot_id(),
        clock_sync: runmeta::clock_sync(),
        clock_start,
        clock_end: Some(clock_start),
        clock_steps: Vec::new(),
        options: RunOptions::default(),
        targets: Vec::new(),
        followed: Vec::new(),
        foreign_stamps_dropped: 0,
        flows: runmeta::FlowCounts::default(),
        ports_not_traced: Vec::new(),
        sockets_not_traced: Default::default(),
        points: BTreeMap::new(),
        unavailable_points: lacking.missing,
        degraded_points: lacking.degraded,
        unavailable_hooks: capture.unavailable_hooks(),
        packets: 0,
        stamps: 0,
        lost: 0,
        bpf_programs: BTreeMap::new(),
        bpf_stats: Some(runmeta::BpfStats {
            mode: args.stats_mode.into(),
            ..runmeta::BpfStats::default()
        }),
        bpf_ns_per_stamp: None,
        reader_cpu_s: Some(0.0),
        stop_reason: String::new(),
        segment,
        device_timestamping: timestamping,
        capabilities_missing: plan.caps_missing.iter().map(|n| n.name.into()).collect(),
        marker_rings: Vec::new(),
        holds: None,
        recovery: None,
    }
}

/// Drops what the rest of the run does not need, writes the ready file and
/// says what is traced.
fn announce_ready(plan: &Plan, live: &Live) -> Result<()> {
    let args = plan.args;
    // Least privilege: the rest of the run needs only these (threads
    // started from here on inherit it; the metrics server drops all).
    let kept = if plan.holds() {
        crate::capabilities::KEPT_WHILE_HOLDING
    } else {
        crate::capabilities::KEPT_AFTER_ATTACH
    };
    if let Err(e) = crate::capabilities::keep_only(kept) {
        plan.note(format!(
            "cannot drop the capabilities the run no longer needs: {e}"
        ));
    }
    if let Some(ready) = &args.ready_file {
        std::fs::write(ready, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write the ready file {}", ready.display()))?;
    }
    if !args.quiet {
        eprintln!(
            "xlap-trace: tracing pid {} (UDP ports {:?}); Ctrl-C to stop",
            args.pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            live.following.ports()
        );
    }
    Ok(())
}

/// What is attached to the kernel while a run goes on; dropping it
/// detaches every program.
struct Attached {
    capture: Capture,
}

/// Where the stamps go: counted, foreign markers taken out, batched into
/// the live Arrow stream.
struct Sink {
    batcher: StampBatcher,
    stream: StampStream,
    /// Stamps written to the stream so far, and its size.
    streamed: u64,
    stream_bytes: u64,
    /// Stamps and packets of the segments before this one.
    stamps_total: u64,
    packets_total: u64,
    tally: Tally,
    foreign: ForeignFlows,
    /// The windows in which the kernel times our programs.
    stats: StatsSampler,
    /// `--live` / `--metrics`.
    view: Option<LiveView>,
}

impl Sink {
    /// Writes the batch collected so far to the live stream.
    fn write_batch(&mut self) -> Result<()> {
        let batch = self.batcher.finish();
        self.streamed += batch.num_rows() as u64;
        self.stream.write(&batch)?;
        self.stream_bytes = self.stream.bytes();
        Ok(())
    }

    fn take(&mut self, raw: &xlap_stamp) {
        let stamp = Stamp::decode(raw);
        if self.foreign.note(&stamp) {
            return;
        }
        self.tally.add(&stamp);
        self.stats.note_stamp(stamp.ts_ns);
        if let Some(v) = self.view.as_mut() {
            v.note(&stamp);
        }
        self.batcher.push(&stamp);
    }
}

/// The run's identity and start, and its run.json as last written.
struct RunInfo {
    started: Instant,
    cpu_start: f64,
    comms: Vec<String>,
    meta: RunMeta,
}

type LossTable = [[u64; xlap_loss::XLAP_LOSS_COUNT as usize]];

impl RunInfo {
    /// The run so far into `meta`: options (with the targets that
    /// exited), targets and their ports, followed children, stamps and
    /// losses per point (less the `dropped` foreign stamps).
    #[allow(clippy::too_many_arguments)]
    fn update_meta(
        &mut self,
        plan: &Plan,
        markers: &MarkerSites,
        following: &Following,
        tally: &Tally,
        losses: &LossTable,
        dropped: &BTreeMap<String, u64>,
        foreign_flows: &HashSet<u64>,
    ) {
        let args = plan.args;
        let usdt = &markers.usdt;
        let ring_sites = &markers.ring_sites;
        let meta = &mut self.meta;
        meta.holds = Some(markers.holds.clone()).filter(|h| *h != Holds::default());
        meta.options = RunOptions {
            pids: args.pids.clone(),
            layout: plan.layouts.default.into(),
            port_layouts: plan.layouts.ports.iter().map(Into::into).collect(),
            points: plan.points.names().into_iter().map(String::from).collect(),
            ringbuf_bytes: Some(plan.ringbuf_bytes),
            per_stamp_records: args.per_stamp_records,
            duration_s: args.duration,
            count: args.count,
            exited: following
                .exited
                .iter()
                .map(|&(pid, after_s)| Exited { pid, after_s })
                .collect(),
            marker_path: Some(args.marker_path),
            usdt_sites: usdt
                .sites
                .iter()
                .map(|s| UsdtSite {
                    pid: s.pid,
                    provider: s.probe.provider.clone(),
                    name: s.probe.name.clone(),
                    path: if ring_sites.iter().any(|(p, f)| *p == s.pid && *f == s.path) {
                        SitePath::Ring
                    } else {
                        SitePath::Uprobe
                    },
                    point: format!(
                        "app.{}",
                        usdt.app_names
                            [(s.spec.point - xlap_point::XLAP_POINT_APP_BASE as u16) as usize]
                    ),
                    file: s.path.clone(),
                    args: s.probe.args_spec.clone(),
                })
                .collect(),
            other: BTreeMap::new(),
        };
        meta.targets = args
            .pids
            .iter()
            .zip(&self.comms)
            .map(|(&pid, comm)| Target {
                pid,
                comm: comm.clone(),
                udp_ports: following
                    .known_ports
                    .iter()
                    .filter(|(_, p)| **p == pid)
                    .map(|((_, port), _)| *port)
                    .collect(),
            })
            .collect();
        meta.followed = following.children.values().cloned().collect();
        meta.ports_not_traced = following.ports_not_traced.iter().map(|(_, p)| *p).collect();
        meta.sockets_not_traced = following.sockets_not_traced.clone();
        let mut points: BTreeMap<String, PointStats> = BTreeMap::new();
        for (id, n) in tally.points() {
            let name = point_info(id, &usdt.app_names).map_or(format!("unknown.{id}"), |p| p.0);
            let n = n - dropped.get(&name).copied().unwrap_or(0);
            points.entry(name).or_default().stamps += n;
        }
        let mut lost = 0;
        for (row, counts) in losses.iter().enumerate() {
            if counts.iter().all(|c| *c == 0) {
                continue;
            }
            let name = if row == xlap_point::XLAP_POINT_KERNEL_COUNT as usize {
                "app.*".to_string()
            } else {
                point_info(row as u16, &[]).map_or(format!("unknown.{row}"), |p| p.0)
            };
            points.entry(name).or_default().add_losses(counts);
            lost += counts.iter().sum::<u64>();
        }
        for p in points.values_mut() {
            p.add_losses(&[0; xlap_loss::XLAP_LOSS_COUNT as usize]); // every reason listed
        }
        meta.points = points;
        meta.lost = lost;
        meta.stamps = tally.stamps - dropped.values().sum::<u64>();
        meta.packets = tally.packets.len_without(foreign_flows);
    }
}

/// A session attached to its targets.
pub struct Live {
    attached: Attached,
    following: Following,
    ring: RingBuf<MapData>,
    markers: Markers,
    batches: PerCpuArray<MapData, Batch>,
    losses: PerCpuArray<MapData, u64>,
    flow_maps: capture::FlowMaps,
    sink: Sink,
    /// The files of the run, or of the segment being recorded.
    files: RunDir,
    segments: Option<Segments>,
    segment_started: Instant,
    /// The loss counters when the segment began (empty: zeros).
    segment_losses: Vec<[u64; xlap_loss::XLAP_LOSS_COUNT as usize]>,
    info: RunInfo,
}

impl Live {
    /// Drains the ring buffer and follows the targets until a stop
    /// condition; returns which.
    pub fn follow(&mut self, plan: &Plan, stop: &Arc<AtomicBool>) -> Result<String> {
        let result = self.follow_until_stop(plan, stop);
        // The segment being recorded when it stopped (a rotated recording
        // has moved on from its first); `recover` of the recording's
        // directory takes up every segment left running.
        let segment = self.files.path().display().to_string();
        let recording = plan.args.output.display().to_string();
        result.with_context(|| {
            format!(
                "the recording stopped ({segment}/stamps.arrows keeps every batch written; `xlap-trace recover {recording}` makes it whole, on a disk with room)"
            )
        })
    }

    fn follow_until_stop(&mut self, plan: &Plan, stop: &Arc<AtomicBool>) -> Result<String> {
        let args = plan.args;
        let mut priority =
            (!args.full_priority).then(|| ReaderPriority::background(plan.ringbuf_bytes));
        let mut last_flush = Instant::now();
        let mut last_checkpoint = Instant::now();
        let mut last_batch_export = Instant::now();
        let mut last_follow = Instant::now();
        let mut last_progress = Instant::now();
        let mut layout_watch = LayoutWatch::new(&plan.layouts);
        let progress = !args.quiet && !args.live && std::io::stderr().is_terminal();
        let ring_fd = self.ring.as_raw_fd();
        let holds_fd = self.markers.holds_fd();
        let reason = loop {
            let pfd = |fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // The kernel side wakes us only when the buffer is an eighth
            // full; the timeout bounds how stale the output files get. A
            // held process wakes us at once (-1 is ignored by poll).
            let mut pfds = [pfd(ring_fd), pfd(holds_fd.unwrap_or(-1))];
            // SAFETY: valid pollfds; a signal interrupting poll is fine.
            unsafe { libc::poll(pfds.as_mut_ptr(), 2, POLL_MS) };
            self.markers
                .serve(&mut self.attached.capture, &|why| plan.note(why))?;
            if let Some(names) = self.markers.take_new_names() {
                self.sink.batcher.set_app_names(names.clone());
                if let Some(v) = self.sink.view.as_mut() {
                    v.set_app_names(names);
                }
            }
            let mut drained = 0usize;
            while let Some(item) = self.ring.next() {
                drained += item.len();
                if drained >= plan.ringbuf_bytes as usize / 4 {
                    // Behind by a quarter of the buffer in this one drain.
                    if let Some(p) = priority.as_mut() {
                        p.adjust(drained);
                    }
                    drained = 0;
                }
                // One record: a stamp or a per-CPU batch of them.
                for raw in xlap_stamp::all_from_bytes(&item) {
                    self.sink.take(&raw);
                }
                if self.sink.batcher.len() >= BATCH_ROWS {
                    self.sink.write_batch()?;
                    last_flush = Instant::now();
                }
            }
            let sink = &mut self.sink;
            self.markers.drain(|raw| sink.take(raw));
            if let Some(p) = priority.as_mut() {
                p.adjust(drained);
                p.caught_up();
            }
            self.sink.stats.tick();
            // The loss table is ~150 map reads: only when the view is due.
            if self.sink.view.as_ref().is_some_and(|v| v.due()) {
                let losses = losses_by_reason(&capture::losses(&self.losses)?);
                if let Some(v) = self.sink.view.as_mut() {
                    v.tick(&losses);
                }
            }
            if !self.sink.batcher.is_empty() && last_flush.elapsed() >= FLUSH_EVERY {
                self.sink.write_batch()?;
                last_flush = Instant::now();
            }
            if last_batch_export.elapsed() >= FLUSH_BATCHES_EVERY {
                self.attached.capture.export_batches();
                last_batch_export = Instant::now();
            }
            if last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
                self.checkpoint(plan)?;
                last_checkpoint = Instant::now();
            }
            if layout_watch.due() {
                let packets = self.sink.packets_total + self.sink.tally.packets.len();
                let unparsed = capture::losses(&self.losses)?
                    .iter()
                    .map(|row| row[xlap_loss::XLAP_LOSS_PARSE as usize])
                    .max()
                    .unwrap_or(0);
                if let Some(warning) = layout_watch.check(packets, unparsed) {
                    if !args.quiet {
                        eprintln!("xlap-trace: warning: {warning}");
                    }
                }
            }
            let elapsed = self.info.started.elapsed().as_secs_f64();
            if progress && last_progress.elapsed() >= Duration::from_secs(1) {
                eprint!(
                    "\rxlap-trace: {} stamps, {} packets, {elapsed:.0} s   ",
                    self.sink.stamps_total + self.sink.tally.stamps,
                    self.sink.packets_total + self.sink.tally.packets.len(),
                );
                last_progress = Instant::now();
            }
            if stop.load(Ordering::Relaxed) {
                break "signal";
            }
            if args.duration.is_some_and(|d| elapsed >= d) {
                break "duration";
            }
            if args
                .count
                .is_some_and(|c| self.sink.packets_total + self.sink.tally.packets.len() >= c)
            {
                break "count";
            }
            if args.rotate.is_none() && args.max_size.is_some_and(|m| self.sink.stream_bytes >= m) {
                if !args.quiet {
                    eprintln!("xlap-trace: warning: the live stream reached --max-size: the run stops here (--rotate keeps recording within the budget)");
                }
                break "max-size";
            }
            if self.rotation_due() {
                self.rotate(plan)?;
            }
            if last_follow.elapsed() >= FOLLOW_EVERY {
                last_follow = Instant::now();
                if self
                    .following
                    .refresh(&mut self.attached.capture, elapsed)?
                {
                    break "targets exited";
                }
            }
        };
        if progress {
            eprintln!();
        }
        Ok(reason.to_string())
    }

    /// Rewrites run.json with the counts so far and what the live stream
    /// holds: all a recovery can go by if the recorder dies.
    fn checkpoint(&mut self, plan: &Plan) -> Result<()> {
        let losses = capture::losses(&self.losses)?;
        let losses = since(&losses, &self.segment_losses);
        self.info.update_meta(
            plan,
            &self.markers.sites,
            &self.following,
            &self.sink.tally,
            &losses,
            &BTreeMap::new(),
            &HashSet::new(),
        );
        let clock = runmeta::sample_clocks();
        let meta = &mut self.info.meta;
        note_clock_step(meta, clock, plan.args.quiet);
        meta.clock_end = Some(clock);
        meta.checkpoint = Some(Checkpoint {
            clock,
            streamed_stamps: self.sink.streamed,
            stream_bytes: self.sink.stream_bytes,
        });
        meta.reader_cpu_s = Some(thread_cpu_s() - self.info.cpu_start);
        meta.stop_reason = "(still running)".into();
        Ok(meta.write(&self.files.meta())?)
    }

    fn rotation_due(&self) -> bool {
        match self.segments.as_ref().map(|s| s.rotate) {
            Some(Rotate::Bytes(b)) => self.sink.stream_bytes >= b,
            Some(Rotate::Every(d)) => self.segment_started.elapsed() >= d,
            None => false,
        }
    }

    /// Closes the segment being recorded (its stream finished, its
    /// run.json counts of its own, handed to the finisher) and records on
    /// into the next one.
    fn rotate(&mut self, plan: &Plan) -> Result<()> {
        let Some(segments) = self.segments.as_ref() else {
            return Ok(());
        };
        if !self.sink.batcher.is_empty() {
            self.sink.write_batch()?;
        }
        let clock = runmeta::sample_clocks();
        let meta = &mut self.info.meta;
        let mut next_segment = meta.segment.clone().expect("a rotated run's segment");
        next_segment.index += 1;
        let next_files = segments.open(
            next_segment.index,
            &next_segment.run_id(),
            clock.monotonic_ns,
        )?;
        let next_stream = StampStream::create(&next_files.stamps_stream())?;
        std::mem::replace(&mut self.sink.stream, next_stream).finish()?;
        let closed_files = std::mem::replace(&mut self.files, next_files);
        let next_tally = self.sink.tally.next_segment();
        let tally = std::mem::replace(&mut self.sink.tally, next_tally);
        let losses_now = capture::losses(&self.losses)?;
        let losses = since(&losses_now, &self.segment_losses);
        self.segment_losses = losses_now;
        let foreign = self.sink.foreign.to_drop();
        self.info.update_meta(
            plan,
            &self.markers.sites,
            &self.following,
            &tally,
            &losses,
            &BTreeMap::new(),
            &foreign,
        );
        let flows = capture::flows(&self.flow_maps)?;
        let meta = &mut self.info.meta;
        note_clock_step(meta, clock, plan.args.quiet);
        let mut closed = meta.clone();
        closed.state = RunState::Complete;
        closed.checkpoint = None;
        closed.clock_end = Some(clock);
        closed.stop_reason = "rotated".into();
        closed.reader_cpu_s = Some(thread_cpu_s() - self.info.cpu_start);
        closed.flows = runmeta::FlowCounts {
            known: flows.table.len() as u64,
            collided: flows.collided,
            not_noted: flows.not_noted,
        };
        self.sink.stamps_total += tally.stamps;
        self.sink.packets_total += tally.packets.len();
        // The next segment: a run of its own from here.
        meta.run_id = next_segment.run_id();
        meta.clock_start = clock;
        meta.clock_end = Some(clock);
        meta.clock_steps.clear();
        meta.segment = Some(next_segment);
        self.sink.batcher = StampBatcher::new(
            &meta.run_id,
            &meta.host,
            self.markers.sites.usdt.app_names.clone(),
        );
        self.sink.streamed = 0;
        self.sink.stream_bytes = 0;
        self.segment_started = Instant::now();
        self.info.cpu_start = thread_cpu_s();
        let deleted = segments.close(segments::Finish {
            files: closed_files,
            meta: closed,
            foreign,
            flows: flows.table,
        })?;
        if !deleted.is_empty() && !plan.args.quiet {
            eprintln!("xlap-trace: note: deleted segments {deleted:?} to stay within --max-size");
        }
        self.checkpoint(plan)
    }

    /// Detaches every program, then reads what the ring buffer and the
    /// per-CPU batches still hold, and the loss counters (complete now:
    /// nothing runs any more).
    pub fn detach(self) -> Result<Detached> {
        let Live {
            attached,
            following,
            mut ring,
            markers,
            batches,
            losses,
            flow_maps,
            mut sink,
            files,
            segments,
            segment_started: _,
            segment_losses,
            info,
        } = self;
        // The statistics stop growing here: read them once they are off.
        sink.stats.finish();
        let program_stats = attached.capture.program_stats();
        drop(attached);
        // Detaching does not wait for a program already running on another
        // CPU; let it finish (it may still flush a batch) before the last
        // drains.
        std::thread::sleep(Duration::from_millis(20));
        while let Some(item) = ring.next() {
            for raw in xlap_stamp::all_from_bytes(&item) {
                sink.take(&raw);
            }
        }
        for raw in capture::drain_batches(&batches)? {
            sink.take(&raw);
        }
        let (ring_losses, marker_sites) = markers.close(|raw| sink.take(raw));
        let mut losses = since(&capture::losses(&losses)?, &segment_losses);
        // The app points share the last row of the loss table.
        if let Some(app) = losses.get_mut(xlap_point::XLAP_POINT_KERNEL_COUNT as usize) {
            app[xlap_loss::XLAP_LOSS_RINGBUF_FULL as usize] += ring_losses.full;
            app[xlap_loss::XLAP_LOSS_PARSE as usize] += ring_losses.skipped;
        }
        let marker_rings = ring_losses.rings;
        if let Some(v) = sink.view.as_mut() {
            v.finish(&losses_by_reason(&losses));
        }
        let flows = capture::flows(&flow_maps)?;
        Ok(Detached {
            following,
            marker_sites,
            sink,
            files,
            segments,
            info,
            losses,
            flows,
            program_stats,
            marker_rings,
        })
    }
}

/// Notes (and says) a step of the realtime clock since the run's last
/// clock pair (`clock_end` holds the last checkpoint's).
fn note_clock_step(meta: &mut RunMeta, now: ClockPair, quiet: bool) {
    if let Some(step) = now.step_since(&meta.clock_end()) {
        if !quiet {
            eprintln!(
                "xlap-trace: warning: the realtime clock stepped {:+.6} s during the run ({:.1} s in); stamps use the monotonic clock and this host's stages are unaffected, but wall times and realtime mappings to other hosts hold only before it (run.json: clock_steps)",
                step.step_ns as f64 / 1e9,
                (step.seen_monotonic_ns - meta.clock_start.monotonic_ns) as f64 / 1e9
            );
        }
        meta.clock_steps.push(step);
    }
}

/// The loss table summed over points, by reason name.
fn losses_by_reason(
    table: &[[u64; xlap_loss::XLAP_LOSS_COUNT as usize]],
) -> Vec<(&'static str, u64)> {
    xlap_abi::LOSS_REASONS
        .iter()
        .enumerate()
        .map(|(i, name)| (*name, table.iter().map(|row| row[i]).sum()))
        .collect()
}

/// Says, within the first second of datagrams, that the layout keys none
/// of them (`--seq-offset 5000` on 400-byte datagrams): found only at the
/// end, the user had waited a whole run for an empty table.
struct LayoutWatch {
    layout: String,
    last: Instant,
    done: bool,
}

impl LayoutWatch {
    const EVERY: Duration = Duration::from_millis(250);

    fn new(layouts: &crate::proto::Layouts) -> LayoutWatch {
        let l = &layouts.default;
        let mut layout = format!("seq at offset {} ({} bytes)", l.seq_offset, l.seq_size);
        if l.kind_size > 0 {
            layout += &format!(", kind at offset {} ({} bytes)", l.kind_offset, l.kind_size);
        }
        if !layouts.ports.is_empty() {
            layout += &format!(", and {} per-port layouts", layouts.ports.len());
        }
        LayoutWatch {
            layout,
            last: Instant::now(),
            done: false,
        }
    }

    fn due(&mut self) -> bool {
        if self.done || self.last.elapsed() < Self::EVERY {
            return false;
        }
        self.last = Instant::now();
        true
    }

    /// The warning, once: datagrams came (`unparsed` failed the layout)
    /// and not one was keyed. Done as soon as one is.
    fn check(&mut self, packets: u64, unparsed: u64) -> Option<String> {
        if packets > 0 {
            self.done = true;
            return None;
        }
        if unparsed == 0 {
            return None;
        }
        self.done = true;
        Some(format!(
            "{unparsed} datagrams of the traced sockets so far, none with a sequence number where the layout says ({}): too short, or laid out otherwise; check --proto or --seq-offset/--seq-size (`xlap-trace points` lists the presets). Recording goes on; a run that keys nothing ends with exit 2",
            self.layout
        ))
    }
}

/// A session whose programs are gone, with everything they delivered.
pub struct Detached {
    following: Following,
    marker_sites: MarkerSites,
    sink: Sink,
    files: RunDir,
    segments: Option<Segments>,
    info: RunInfo,
    losses: Vec<[u64; xlap_loss::XLAP_LOSS_COUNT as usize]>,
    flows: capture::Flows,
    program_stats: Vec<(String, ProgramStats)>,
    marker_rings: Vec<xlap_records::run_meta::MarkerRing>,
}

impl Detached {
    /// Writes the Parquet stamps (without the by-port stamps of datagrams
    /// that went to other sockets) and `run.json`.
    pub fn finish(self, plan: &Plan, stop_reason: String) -> Result<RunMeta> {
        let Detached {
            following,
            marker_sites,
            mut sink,
            files,
            segments,
            mut info,
            losses,
            flows,
            program_stats,
            marker_rings,
        } = self;
        let args = plan.args;
        if !sink.batcher.is_empty() {
            sink.write_batch()?;
        }
        sink.stream.finish()?;
        let reader_cpu_s = thread_cpu_s() - info.cpu_start;
        let clock_end = runmeta::sample_clocks();
        let drop = DropFlows {
            flows: sink.foreign.to_drop(),
            points: BY_PORT_POINTS,
        };
        let dropped =
            stream_to_parquet_with(&files.stamps_stream(), &files.stamps(), &drop, &flows.table)?
                .removed;
        if (flows.collided > 0 || flows.not_noted > 0) && !args.quiet {
            eprintln!(
                "xlap-trace: warning: the addresses of some flows are unknown ({} flow keys shared by two address pairs, {} flows found the flow table full): their stamps have no src_addr/dst_addr (run.json: flows)",
                flows.collided, flows.not_noted
            );
        }
        info.update_meta(
            plan,
            &marker_sites,
            &following,
            &sink.tally,
            &losses,
            &dropped,
            &drop.flows,
        );
        let bpf_programs: BTreeMap<String, ProgramStats> = program_stats.into_iter().collect();
        let recursion_misses: u64 = bpf_programs
            .values()
            .filter_map(|p| p.recursion_misses)
            .sum();
        if recursion_misses > 0 && !args.quiet {
            eprintln!(
                "xlap-trace: warning: the kernel skipped {recursion_misses} runs of the capture programs (recursion on a CPU); their stamps are missing (run.json: bpf_programs.*.recursion_misses)"
            );
        }
        let bpf_time: u64 = bpf_programs.values().map(|p| p.run_time_ns).sum();
        let mut meta = info.meta;
        meta.state = RunState::Complete;
        meta.checkpoint = None;
        note_clock_step(&mut meta, clock_end, args.quiet);
        meta.clock_end = Some(clock_end);
        meta.foreign_stamps_dropped = dropped.values().sum();
        meta.flows = runmeta::FlowCounts {
            known: flows.table.len() as u64,
            collided: flows.collided,
            not_noted: flows.not_noted,
        };
        meta.bpf_ns_per_stamp = {
            let timed = sink.stats.stamps_in_windows;
            (bpf_time > 0 && timed > 0).then(|| bpf_time as f64 / timed as f64)
        };
        meta.bpf_stats = Some(runmeta::BpfStats {
            mode: sink.stats.mode().into(),
            on_s: sink.stats.sampled_s(),
            windows: sink.stats.windows(),
            stamps: sink.stats.stamps_in_windows,
            unavailable: sink.stats.unavailable,
        });
        meta.bpf_programs = bpf_programs;
        meta.marker_rings = marker_rings;
        meta.reader_cpu_s = Some(reader_cpu_s);
        meta.stop_reason = stop_reason;
        meta.write(&files.meta())?;
        if let Some(segments) = segments {
            // As for every segment: Parquet holds the same stamps.
            std::fs::remove_file(files.stamps_stream())
                .with_context(|| format!("cannot remove {}", files.stamps_stream().display()))?;
            if !args.quiet {
                eprintln!("xlap-trace: finishing the last segments ...");
            }
            let index = segments.end(&meta, files.path())?;
            let unfinished: Vec<&segments::SegmentEntry> = index
                .segments
                .iter()
                .filter(|s| s.state == segments::SegmentState::Deleted && s.error.is_some())
                .collect();
            if !unfinished.is_empty() {
                eprintln!(
                    "xlap-trace: warning: {} segments ({} stamps) were deleted before they were finished: the finisher fell behind the budget (--max-size larger, --rotate smaller or fewer points keep them; segments.json)",
                    unfinished.len(),
                    unfinished.iter().map(|s| s.stamps).sum::<u64>()
                );
            }
            if !args.quiet {
                let kept = index
                    .segments
                    .iter()
                    .filter(|s| s.state != segments::SegmentState::Deleted)
                    .count();
                eprintln!(
                    "xlap-trace: {} segments in {} ({kept} kept; {})",
                    index.segments.len(),
                    args.output.display(),
                    segments::INDEX_FILE
                );
            }
        }
        if meta.lost > 0 && !args.quiet {
            eprintln!(
                "xlap-trace: warning: {} stamps were lost (see the loss columns below and run.json)",
                meta.lost
            );
        }
        protocols::refuse_tcp_only(&plan.tcp_only, &following.udp_pids, meta.packets)?;
        protocols::refuse_unkeyed(&meta)?;
        Ok(meta)
    }
}

/// Loss counters since `start` (an empty `start`: since the run began).
fn since(now: &LossTable, start: &LossTable) -> Vec<[u64; xlap_loss::XLAP_LOSS_COUNT as usize]> {
    now.iter()
        .enumerate()
        .map(|(row, counts)| {
            let mut out = *counts;
            if let Some(before) = start.get(row) {
                for (o, b) in out.iter_mut().zip(before) {
                    *o -= (*b).min(*o);
                }
            }
            out
        })
        .collect()
}
