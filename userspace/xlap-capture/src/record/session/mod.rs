//! One capture session, step by step: `Plan::new` (check the request),
//! `Session::load` (the BPF object), `attach` (probes, targets, their
//! sockets), `follow` (drain the ring buffer while following processes and
//! sockets), `detach` (programs gone, the last stamps and the losses read
//! after), `Detached::finish` (Parquet and `run.json`).

//!
//! One file per phase: `start` (load and attach), `live` (the reader's loop:
//! drain, follow, checkpoint, rotate; detach), `finish` (the files of the
//! run). The plan, the limits and the types they share live here.

mod finish;
mod live;
mod start;

pub use finish::Detached;
pub use live::Live;
pub use start::Session;

use super::bpf_stats::StatsSampler;
use super::connects::ConnectHolds;
use super::follow::Following;
use super::live_view::LiveView;
use super::markers::{MarkerOptions, MarkerSites, Markers};
use super::segments::{self, Rotate, Segments};
use super::tally::{ForeignFlows, Tally, BY_PORT_POINTS};
use super::RecordOptions;
use super::{brief_reason, protocols};
use crate::capture::{self, Batch, Capture, Settings};
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
    ringbuf_bytes: u32,
    tunnel_ports: Vec<u16>,
    /// Targets holding only TCP sockets at attach.
    tcp_only: Vec<(u32, String)>,
    /// Optional capabilities this process lacks.
    caps_missing: Vec<crate::capabilities::Need>,
}

impl<'a> Plan<'a> {
    pub fn new(args: &'a RecordOptions) -> Result<Plan<'a>> {
        let (targets, output) = (&args.targets, &args.output);
        if targets.pids.is_empty() && targets.cgroups.is_empty() {
            return Err(failure(
                Code::Usage,
                "name the process to trace with --pid PID (repeatable), or its cgroup with --cgroup PATH",
            ));
        }
        let ringbuf_kib = args.recorder.ringbuf_kib;
        let ringbuf_bytes = ringbuf_kib
            .checked_mul(1024)
            .filter(|b| b.is_power_of_two() && *b >= 4096)
            .ok_or_else(|| {
                failure(
                    Code::Usage,
                    format!(
                        "--ringbuf-kib must be a power of two of at least 4, not {ringbuf_kib}"
                    ),
                )
            })?;
        // SAFETY: umask only sets this process's file mode mask.
        unsafe { libc::umask(output.umask as libc::mode_t) };
        let caps_missing = preflight::check_privileges(args.recorder.skip_capability_check)?;
        preflight::check_btf()?;
        crate::preflight::check_kernel()?;
        preflight::check_pids(&targets.pids)?;
        if let (Some(Rotate::Bytes(segment)), Some(max)) = (output.rotate, output.max_size) {
            if max < 2 * segment {
                return Err(failure(
                    Code::Usage,
                    format!("--max-size {max} cannot hold two segments of --rotate {segment} bytes: the budget deletes only finished segments"),
                ));
            }
        }
        std::fs::create_dir_all(&output.dir).with_context(|| {
            format!(
                "cannot create the output directory {}",
                output.dir.display()
            )
        })?;
        let mut tunnel_ports = capture::DEFAULT_TUNNEL_PORTS.to_vec();
        for port in &args.stamping.tunnel_ports {
            if !tunnel_ports.contains(port) {
                tunnel_ports.push(*port);
            }
        }
        Ok(Plan {
            args,
            ringbuf_bytes,
            tunnel_ports,
            tcp_only: if targets.started_here {
                Vec::new()
            } else {
                protocols::check(&targets.pids, args.view.quiet)
            },
            caps_missing,
        })
    }

    /// Whether traced processes are held at their exec and library loads
    /// for their markers: markers are traced, and a held process of
    /// another user can be resumed.
    fn holds(&self) -> bool {
        !self.args.stamping.no_usdt && self.can_resume()
    }

    /// Whether a process the BPF side stopped can be resumed (SIGCONT to a
    /// process of another user needs CAP_KILL).
    fn can_resume(&self) -> bool {
        !self.caps_missing.iter().any(|n| n.name == "CAP_KILL")
    }

    fn note(&self, text: impl std::fmt::Display) {
        if !self.args.view.quiet {
            eprintln!("xlap-trace: note: {text}");
        }
    }
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
    /// `--sample`: markers read from a process's ring are filtered here
    /// (the BPF side filters the rest).
    sample: Option<xlap_records::sample::Sample>,
    /// The run's window: stamps taken outside it are left out here too (a
    /// program that read the window before it closed, the markers' rings,
    /// which no BPF program reads).
    window: Window,
    /// During a rotation: its cut, and the stamps taken after it that
    /// came in before the closing segment had all of its own.
    held: Option<(u64, Vec<xlap_stamp>)>,
}

/// The instants (CLOCK_MONOTONIC ns) the run's stamps lie between, and
/// the stamps that came from outside them.
#[derive(Clone, Copy, Debug)]
struct Window {
    from_ns: u64,
    until_ns: u64,
    outside: u64,
}

impl Window {
    /// Open from `from_ns` on.
    fn from(from_ns: u64) -> Window {
        Window {
            from_ns,
            until_ns: u64::MAX,
            outside: 0,
        }
    }

    fn holds(&self, ts_ns: u64) -> bool {
        (self.from_ns..=self.until_ns).contains(&ts_ns)
    }

    /// As run.json says it.
    fn meta(&self) -> runmeta::StampWindow {
        runmeta::StampWindow {
            from_ns: self.from_ns,
            until_ns: (self.until_ns != u64::MAX).then_some(self.until_ns),
            stamps_outside: self.outside,
        }
    }
}

impl Sink {
    /// Takes the stamps a rotation held back, into the segment now
    /// recorded.
    fn release_held(&mut self) {
        if let Some((_, held)) = self.held.take() {
            for raw in &held {
                self.take(raw);
            }
        }
    }

    /// Writes the batch collected so far to the live stream.
    fn write_batch(&mut self) -> Result<()> {
        let batch = self.batcher.finish();
        self.streamed += batch.num_rows() as u64;
        self.stream.write(&batch)?;
        self.stream_bytes = self.stream.bytes();
        Ok(())
    }

    fn take(&mut self, raw: &xlap_stamp) {
        if !self.window.holds(raw.ts_ns) {
            self.window.outside += 1;
            return;
        }
        if let Some((cut, held)) = self.held.as_mut() {
            if raw.ts_ns > *cut {
                held.push(*raw);
                return;
            }
        }
        if let Some(sample) = &self.sample {
            if raw.point >= xlap_point::XLAP_POINT_APP_BASE as u16
                && raw.flags & xlap_abi::XLAP_FLAG_SEQ_VALID as u8 != 0
            {
                let kind = (raw.flags & xlap_abi::XLAP_FLAG_KIND as u8 != 0).then_some(raw.kind);
                if !sample.keeps(raw.seq, kind) {
                    return;
                }
            }
        }
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
        let stamping = &args.stamping;
        let usdt = &markers.usdt;
        let ring_sites = &markers.ring_sites;
        let meta = &mut self.meta;
        meta.holds = Some(markers.holds.clone()).filter(|h| *h != Holds::default());
        meta.options = RunOptions {
            pids: args.targets.pids.clone(),
            layout: stamping.layouts.default.into(),
            port_layouts: stamping.layouts.ports.iter().map(Into::into).collect(),
            points: stamping
                .points
                .names()
                .into_iter()
                .map(String::from)
                .collect(),
            ringbuf_bytes: Some(plan.ringbuf_bytes),
            per_stamp_records: stamping.per_stamp_records,
            empty_programs: stamping.empty_programs,
            boundary: meta.options.boundary.clone(),
            sample: stamping.sample.clone(),
            duration_s: args.stop.duration,
            count: args.stop.count,
            exited: following
                .exited
                .iter()
                .map(|&(pid, after_s)| Exited { pid, after_s })
                .collect(),
            marker_path: Some(stamping.marker_path),
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
            .targets
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
        (meta.followed, meta.followed_unlisted) = following.listed();
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
        meta.cgroups = crate::cgroup_names::describe(tally.cgroup_ids().collect());
        meta.lost = lost;
        meta.stamps = tally.stamps - dropped.values().sum::<u64>();
        meta.packets = tally.packets.len_without(foreign_flows);
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
