//! Loading the capture and attaching it: probes, targets, their sockets,
//! the output files and the first run.json.

use super::*;

/// The capture programs loaded (not yet attached to the targets).
pub struct Session {
    pub(super) capture: Capture,
    /// The targets' devices and their timestamping, surveyed before the
    /// load (the capture reads device times only where a device has them).
    timestamping: Vec<crate::hwts::DeviceTimestamping>,
}

impl Session {
    pub fn load(plan: &Plan) -> Result<Session> {
        let (pids, stamping) = (&plan.args.targets.pids, &plan.args.stamping);
        let timestamping = crate::hwts::survey(pids);
        let mut capture = Capture::load(&Settings {
            layouts: stamping.layouts.clone(),
            points: stamping.points.clone(),
            ringbuf_bytes: plan.ringbuf_bytes,
            per_stamp: stamping.per_stamp_records,
            empty_programs: stamping.empty_programs,
            tunnel_ports: plan.tunnel_ports.clone(),
            iface_filter: !stamping.ifaces.is_empty(),
            hold_at_exec: plan.holds(),
            boundary: stamping.boundary,
            hold_connect: plan.can_resume(),
            sample: stamping.sample.clone(),
            device_rx_times: timestamping.iter().any(|d| d.hardware_rx),
        })?;
        if !stamping.ifaces.is_empty() {
            let devices = crate::ifaces::resolve(pids, &stamping.ifaces)?;
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
        if let (Err(why), false) = (&capture.batch_export, stamping.per_stamp_records) {
            plan.note(format!("per-CPU batches are exported only by later stamps and idle CPUs, not every {} ms: a recorder that dies may lose more ({why})", xlap_abi::XLAP_FLUSH_INTERVAL_MS));
        }
        if stamping.empty_programs {
            plan.note("--empty-programs: every BPF program on a datagram's path returns at once, so nothing is stamped (what the hooks' dispatch alone costs)");
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
        Ok(Session {
            capture,
            timestamping,
        })
    }

    /// Attaches the USDT markers, names the targets to the kernel side,
    /// marks their sockets, and signals readiness.
    pub fn attach(mut self, plan: &Plan) -> Result<Live> {
        let args = plan.args;
        let (pids, quiet) = (&args.targets.pids, args.view.quiet);
        let holds = if plan.holds() {
            Some(self.capture.take_holds()?)
        } else {
            None
        };
        // Markers built with the xlap-marker crate write an in-process ring
        // (no trap per hit); every other site gets a uprobe.
        let markers = Markers::start(
            &mut self.capture,
            pids,
            MarkerOptions {
                selections: &args.stamping.usdt,
                traced: !args.stamping.no_usdt,
                ring_path: args.stamping.marker_path == xlap_records::run_meta::SitePath::Ring,
                started_here: args.targets.started_here,
                quiet,
            },
            holds,
            &|why| plan.note(why),
        )?;
        self.capture.set_targets(pids)?;
        let cgroups = &args.targets.cgroups;
        self.capture
            .set_target_cgroups(&cgroups.iter().map(|c| (c.id, c.level)).collect::<Vec<_>>())?;
        let connects = ConnectHolds::start(&mut self.capture)?;
        let following = Following::start(&mut self.capture, pids, cgroups, quiet)?;
        if let Some(note) = self.capture.send_syscalls_note() {
            plan.note(note);
        }
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
        // The run begins here for every point at once: the targets and
        // their sockets are known, every hook attached. A packet in flight
        // now has only its later stamps (it is partial).
        self.capture
            .set_stamp_window(clock_start.monotonic_ns, u64::MAX)?;
        let (segments, files, segment) = open_output(args, &run_id, clock_start.monotonic_ns)?;
        let run_id = segment.as_ref().map_or(run_id, SegmentOf::run_id);
        let host = args.recorder.host.clone().unwrap_or_else(runmeta::hostname);
        let comms = pids.iter().map(|&p| targets::comm(p)).collect();
        let timestamping = std::mem::take(&mut self.timestamping);
        if let Some(m) = crate::hwts::message(&timestamping) {
            plan.note(m);
        }
        let view = live_view(args, &markers)?;
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
            connects,
            ring,
            batches,
            losses,
            flow_maps,
            sink: new_sink(
                args,
                &run_id,
                &host,
                &markers,
                &files,
                view,
                clock_start.monotonic_ns,
            )?,
            files,
            segments,
            segment_started: Instant::now(),
            pending_cut: None,
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

/// The live view and metrics server (`--live`, `--metrics`), if asked for.
fn live_view(args: &RecordOptions, markers: &Markers) -> Result<Option<LiveView>> {
    let view = &args.view;
    (view.live || view.metrics.is_some())
        .then(|| {
            LiveView::new(
                markers.sites.usdt.app_names.clone(),
                view.live,
                view.metrics,
            )
            .map(|mut v| {
                v.set_sample(args.stamping.sample.as_ref());
                if let Some(feed) = &view.peers {
                    v.set_peers(feed.clone());
                }
                v
            })
        })
        .transpose()
}

/// Where the run's stamps go: batched into the Arrow stream of `files`,
/// tallied, shown in `view`, windowed from `start_monotonic_ns`.
fn new_sink(
    args: &RecordOptions,
    run_id: &str,
    host: &str,
    markers: &Markers,
    files: &RunDir,
    view: Option<LiveView>,
    start_monotonic_ns: u64,
) -> Result<Sink> {
    Ok(Sink {
        batcher: StampBatcher::new(run_id, host, markers.sites.usdt.app_names.clone()),
        stream: StampStream::create(&files.stamps_stream())?,
        streamed: 0,
        stream_bytes: 0,
        stamps_total: 0,
        packets_total: 0,
        tally: Tally::default(),
        foreign: ForeignFlows::default(),
        stats: StatsSampler::start(args.recorder.stats_mode),
        view,
        sample: args.stamping.sample.clone(),
        window: Window::from(start_monotonic_ns),
        held: None,
    })
}

/// The run's directory, or the first segment's of a rotated recording.
fn open_output(
    args: &RecordOptions,
    run_id: &str,
    start_monotonic_ns: u64,
) -> Result<(Option<Segments>, RunDir, Option<SegmentOf>)> {
    let output = &args.output;
    Ok(match output.rotate {
        Some(rotate) => {
            let segments = Segments::start(
                &output.dir,
                rotate,
                output.max_size,
                segments::FinishOptions {
                    correlate: !output.no_correlate,
                    deadline_ms: output.deadline_ms,
                    quiet: args.view.quiet,
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
        None => (None, RunDir::new(output.dir.clone()), None),
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
        options: RunOptions {
            boundary: Some(capture.describe_boundary(clock_start.monotonic_ns)),
            sample: args.stamping.sample.clone(),
            ..RunOptions::default()
        },
        targets: Vec::new(),
        followed: Vec::new(),
        followed_unlisted: 0,
        cgroups: Vec::new(),
        foreign_stamps_dropped: 0,
        window: Some(runmeta::StampWindow {
            from_ns: clock_start.monotonic_ns,
            ..Default::default()
        }),
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
            mode: args.recorder.stats_mode,
            ..runmeta::BpfStats::default()
        }),
        bpf_ns_per_stamp: None,
        reader_cpu_s: Some(0.0),
        stop_reason: xlap_records::run_meta::StopReason::Running,
        segment,
        device_timestamping: timestamping,
        capabilities_missing: plan.caps_missing.iter().map(|n| n.name.into()).collect(),
        marker_rings: Vec::new(),
        holds: None,
        recovery: None,
        peer_link: None,
        peers: None,
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
    if let Some(ready) = &args.output.ready_file {
        std::fs::write(ready, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write the ready file {}", ready.display()))?;
    }
    if !args.view.quiet {
        let pids = args
            .targets
            .pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        // A traced cgroup may have no process yet: it is what is traced.
        let cgroups: Vec<String> = args
            .targets
            .cgroups
            .iter()
            .map(|c| c.dir.display().to_string())
            .collect();
        let what = match (pids.is_empty(), cgroups.is_empty()) {
            (_, true) => format!("pid {pids}"),
            (true, false) => format!("cgroup {} (no process in it yet)", cgroups.join(", ")),
            (false, false) => format!("pid {pids} and cgroup {}", cgroups.join(", ")),
        };
        eprintln!(
            "xlap-trace: tracing {what} (UDP ports {:?}); Ctrl-C to stop",
            live.following.ports()
        );
    }
    Ok(())
}
