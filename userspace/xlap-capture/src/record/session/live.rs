//! The live session: the reader's loop (drain the ring buffer, follow
//! processes and sockets, checkpoint run.json, rotate segments) until
//! the run stops, then the probes detached.

use super::*;
use xlap_records::run_meta::StopReason;

/// A session attached to its targets.
pub struct Live {
    pub(super) attached: Attached,
    pub(super) following: Following,
    /// `--boundary auto`: processes held at a traced UDP socket's connect.
    pub(super) connects: ConnectHolds,
    pub(super) ring: RingBuf<MapData>,
    pub(super) markers: Markers,
    pub(super) batches: PerCpuArray<MapData, Batch>,
    pub(super) losses: PerCpuArray<MapData, u64>,
    pub(super) flow_maps: capture::FlowMaps,
    pub(super) sink: Sink,
    /// The files of the run, or of the segment being recorded.
    pub(super) files: RunDir,
    pub(super) segments: Option<Segments>,
    pub(super) segment_started: Instant,
    /// A rotation under way: its cut (CLOCK_MONOTONIC ns) and when it was
    /// taken. The segment closes once the stamps taken before the cut
    /// have come in (`ROTATION_SETTLE`); those taken after wait.
    pub(super) pending_cut: Option<(u64, Instant)>,
    /// The loss counters when the segment began (empty: zeros).
    pub(super) segment_losses: Vec<[u64; xlap_loss::XLAP_LOSS_COUNT as usize]>,
    pub(super) info: RunInfo,
}

impl Live {
    /// Drains the ring buffer and follows the targets until a stop
    /// condition; returns which.
    pub fn follow(&mut self, plan: &Plan, stop: &Arc<AtomicBool>) -> Result<StopReason> {
        let result = self.follow_until_stop(plan, stop);
        // The segment being recorded when it stopped (a rotated recording
        // has moved on from its first); `recover` of the recording's
        // directory takes up every segment left running.
        let segment = self.files.path().display().to_string();
        let recording = plan.args.output.dir.display().to_string();
        result.with_context(|| {
            format!(
                "the recording stopped ({segment}/stamps.arrows keeps every batch written; `xlap-trace recover {recording}` makes it whole, on a disk with room)"
            )
        })
    }

    fn follow_until_stop(&mut self, plan: &Plan, stop: &Arc<AtomicBool>) -> Result<StopReason> {
        let args = plan.args;
        let mut priority =
            (!args.recorder.full_priority).then(|| ReaderPriority::background(plan.ringbuf_bytes));
        let mut last_flush = Instant::now();
        let mut last_checkpoint = Instant::now();
        let mut last_batch_export = Instant::now();
        let mut last_follow = Instant::now();
        let mut last_progress = Instant::now();
        let mut layout_watch = LayoutWatch::new(&args.stamping.layouts);
        let progress = !args.view.quiet && !args.view.live && std::io::stderr().is_terminal();
        let ring_fd = self.ring.as_raw_fd();
        let holds_fd = self.markers.holds_fd();
        let connects_fd = self.connects.fd();
        let reason = loop {
            let pfd = |fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // The kernel side wakes us only when the buffer is an eighth
            // full; the timeout bounds how stale the output files get. A
            // held process wakes us at once (-1 is ignored by poll).
            let mut pfds = [
                pfd(ring_fd),
                pfd(holds_fd.unwrap_or(-1)),
                pfd(connects_fd.unwrap_or(-1)),
            ];
            // SAFETY: valid pollfds; a signal interrupting poll is fine.
            unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, POLL_MS) };
            self.serve_connects(plan)?;
            self.markers
                .serve(&mut self.attached.capture, &|why| plan.note(why))?;
            if let Some(names) = self.markers.take_new_names() {
                self.sink.batcher.set_app_names(names.clone());
                if let Some(v) = self.sink.view.as_mut() {
                    v.set_app_names(names);
                }
            }
            let drained = self.drain_ring(plan, &mut priority, &mut last_flush)?;
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
                self.attached.capture.export_batches(&self.batches);
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
                    if !args.view.quiet {
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
            if let Some(reason) = self.stop_due(args, stop, elapsed) {
                break reason;
            }
            self.rotation_step(plan)?;
            if last_follow.elapsed() >= FOLLOW_EVERY {
                last_follow = Instant::now();
                let all_exited = self
                    .following
                    .refresh(&mut self.attached.capture, elapsed)?;
                // A socket marked now may be connected already.
                self.note_boundary(plan);
                for pid in self.following.take_exited() {
                    self.markers.release(&mut self.attached.capture, pid);
                }
                if all_exited {
                    break StopReason::TargetsExited;
                }
            }
        };
        if progress {
            eprintln!();
        }
        // A rotation the end overtook: its segment takes the held stamps.
        self.pending_cut = None;
        self.sink.release_held();
        Ok(reason)
    }

    /// Takes what the ring buffer holds, writing batches as they fill;
    /// returns the bytes taken since the reader's priority last adjusted.
    fn drain_ring(
        &mut self,
        plan: &Plan,
        priority: &mut Option<ReaderPriority>,
        last_flush: &mut Instant,
    ) -> Result<usize> {
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
                *last_flush = Instant::now();
            }
        }
        Ok(drained)
    }

    /// Why the run stops now, if it does: a signal, `--duration`,
    /// `--count`, or `--max-size` without `--rotate`.
    fn stop_due(
        &self,
        args: &RecordOptions,
        stop: &Arc<AtomicBool>,
        elapsed: f64,
    ) -> Option<StopReason> {
        if stop.load(Ordering::Relaxed) {
            return Some(StopReason::Signal);
        }
        if args.stop.duration.is_some_and(|d| elapsed >= d) {
            return Some(StopReason::Duration);
        }
        if args
            .stop
            .count
            .is_some_and(|c| self.sink.packets_total + self.sink.tally.packets.len() >= c)
        {
            return Some(StopReason::Count);
        }
        let output = &args.output;
        if output.rotate.is_none() && output.max_size.is_some_and(|m| self.sink.stream_bytes >= m) {
            if !args.view.quiet {
                eprintln!("xlap-trace: warning: the live stream reached --max-size: the run stops here (--rotate keeps recording within the budget)");
            }
            return Some(StopReason::MaxSize);
        }
        None
    }

    /// A rotation: its cut taken when due, and made once the stamps up to
    /// it have settled.
    fn rotation_step(&mut self, plan: &Plan) -> Result<()> {
        match self.pending_cut {
            Some((cut, at)) if at.elapsed() >= ROTATION_SETTLE => {
                self.attached.capture.export_batches(&self.batches);
                self.drain_now();
                self.pending_cut = None;
                self.rotate(plan, cut)?;
            }
            None if self.rotation_due() => {
                // The cut is an instant of the stamps' clock, not of
                // their arrival: a CPU's batch can come in up to the
                // export interval late.
                let cut = runmeta::sample_clocks().monotonic_ns;
                self.sink.held = Some((cut, Vec::new()));
                self.attached.capture.export_batches(&self.batches);
                self.pending_cut = Some((cut, Instant::now()));
            }
            _ => {}
        }
        Ok(())
    }

    /// Takes what the ring buffer and the markers' rings hold now.
    fn drain_now(&mut self) {
        while let Some(item) = self.ring.next() {
            for raw in xlap_stamp::all_from_bytes(&item) {
                self.sink.take(&raw);
            }
        }
        let sink = &mut self.sink;
        self.markers.drain(|raw| sink.take(raw));
    }

    /// `--boundary auto`: hooks the send syscalls for the processes held at
    /// a connect and resumes them, counted with the other holds.
    fn serve_connects(&mut self, plan: &Plan) -> Result<()> {
        let held = self
            .connects
            .serve(&mut self.attached.capture, &mut self.markers.sites.holds)?;
        if held > 0 {
            self.note_boundary(plan);
        }
        Ok(())
    }

    /// run.json's `boundary`, once `--boundary auto` hooked the send
    /// syscalls (said on stderr too: the whole machine pays from now on).
    fn note_boundary(&mut self, plan: &Plan) {
        let start = self.info.meta.clock_start.monotonic_ns;
        let now = self.attached.capture.describe_boundary(start);
        if self.info.meta.options.boundary.as_deref() != Some(now.as_str()) {
            if let Some(note) = self.attached.capture.send_syscalls_note() {
                plan.note(note);
            }
            self.info.meta.options.boundary = Some(now);
        }
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
        note_clock_step(meta, clock, plan.args.view.quiet);
        meta.clock_end = Some(clock);
        meta.checkpoint = Some(Checkpoint {
            clock,
            streamed_stamps: self.sink.streamed,
            stream_bytes: self.sink.stream_bytes,
        });
        meta.reader_cpu_s = Some(thread_cpu_s() - self.info.cpu_start);
        meta.window = Some(self.sink.window.meta());
        meta.stop_reason = StopReason::StillRunning;
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
    fn rotate(&mut self, plan: &Plan, cut: u64) -> Result<()> {
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
        note_clock_step(meta, clock, plan.args.view.quiet);
        let mut closed = meta.clone();
        closed.state = RunState::Complete;
        closed.checkpoint = None;
        closed.clock_end = Some(clock);
        closed.stop_reason = StopReason::Rotated;
        let mut window = self.sink.window;
        window.until_ns = cut;
        closed.window = Some(window.meta());
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
        self.sink.window = Window::from(cut.saturating_add(1));
        self.sink.release_held();
        self.segment_started = Instant::now();
        self.info.cpu_start = thread_cpu_s();
        let deleted = segments.close(segments::Finish {
            files: closed_files,
            meta: closed,
            foreign,
            flows: flows.table,
        })?;
        if !deleted.is_empty() && !plan.args.view.quiet {
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
            connects,
            mut ring,
            mut markers,
            batches,
            losses,
            flow_maps,
            mut sink,
            files,
            segments,
            segment_started: _,
            pending_cut: _,
            segment_losses,
            info,
        } = self;
        // The run ends here, at one instant for every point: no program
        // stamps after it, whichever is detached first (they used to stop
        // one after the other, leaving packets stamped by some points and
        // not others, and transmit points reading identities their queue
        // point no longer left).
        let mut attached = attached;
        let cut = runmeta::sample_clocks().monotonic_ns;
        sink.window.until_ns = cut;
        if let Err(e) = attached.capture.set_stamp_window(sink.window.from_ns, cut) {
            // The reader still leaves out what came after the cut.
            eprintln!("xlap-trace: warning: {e:#}");
        }
        // Calls in progress at the cut finish and emit the stamps they
        // took before it (a send's start leaves with its device point).
        std::thread::sleep(SETTLE_AFTER_CUT);
        // The statistics stop growing here: read them once they are off.
        sink.stats.finish();
        let program_stats = attached.capture.program_stats();
        if let Some(pause) = test_detach_pause() {
            attached.capture.detach_one_by_one(pause);
        }
        // The uprobes go on threads of their own (each close waits for a
        // grace period); the rest detaches at once.
        let uprobe_closer = markers.close_uprobes(&mut attached.capture);
        drop(attached);
        // Detaching does not wait for a program already running on another
        // CPU; let it finish (it may still flush a batch) before the last
        // drains.
        std::thread::sleep(Duration::from_millis(20));
        // No connect is held any more: resume those still waiting.
        drop(connects);
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
            uprobe_closer,
        })
    }
}

/// How long the programs stay attached after the cut: a send or receive
/// call in progress then ends within microseconds and emits the stamps it
/// took before the cut.
const SETTLE_AFTER_CUT: Duration = Duration::from_millis(10);

/// How long a rotation waits after its cut for the stamps taken before it:
/// past two batch exports, every CPU's batch of them has come in.
const ROTATION_SETTLE: Duration =
    Duration::from_millis(2 * xlap_abi::XLAP_FLUSH_INTERVAL_MS as u64 + 50);

/// Tests of a run's end only (`XLAP_TEST_DETACH_PAUSE_MS`): a pause between
/// detaching each tracepoint program, so that the time in which some
/// hooks are gone and others still fire is wide enough to see.
fn test_detach_pause() -> Option<Duration> {
    std::env::var("XLAP_TEST_DETACH_PAUSE_MS")
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
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
