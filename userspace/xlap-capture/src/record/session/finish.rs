//! A detached session finished: Parquet and the complete run.json.

use super::*;
use xlap_records::run_meta::StopReason;

/// A session whose programs are gone, with everything they delivered.
pub struct Detached {
    pub(super) following: Following,
    pub(super) marker_sites: MarkerSites,
    pub(super) sink: Sink,
    pub(super) files: RunDir,
    pub(super) segments: Option<Segments>,
    pub(super) info: RunInfo,
    pub(super) losses: Vec<[u64; xlap_loss::XLAP_LOSS_COUNT as usize]>,
    pub(super) flows: capture::Flows,
    pub(super) program_stats: Vec<(String, ProgramStats)>,
    pub(super) marker_rings: Vec<xlap_records::run_meta::MarkerRing>,
    /// Closing the run's uprobes; joined once the run directory is written.
    pub(super) uprobe_closer: crate::record::uprobe_closer::UprobeCloser,
}

impl Detached {
    /// Writes the Parquet stamps (without the by-port stamps of datagrams
    /// that went to other sockets) and `run.json`.
    pub fn finish(self, plan: &Plan, stop_reason: StopReason) -> Result<RunMeta> {
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
            uprobe_closer,
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
        if (flows.collided > 0 || flows.not_noted > 0) && !args.view.quiet {
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
        if recursion_misses > 0 && !args.view.quiet {
            eprintln!(
                "xlap-trace: warning: the kernel skipped {recursion_misses} runs of the capture programs (recursion on a CPU); their stamps are missing (run.json: bpf_programs.*.recursion_misses)"
            );
        }
        let bpf_time: u64 = bpf_programs.values().map(|p| p.run_time_ns).sum();
        let mut meta = info.meta;
        meta.state = RunState::Complete;
        meta.checkpoint = None;
        note_clock_step(&mut meta, clock_end, args.view.quiet);
        meta.clock_end = Some(clock_end);
        meta.foreign_stamps_dropped = dropped.values().sum();
        meta.window = Some(sink.window.meta());
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
            mode: sink.stats.mode(),
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
            end_segments(segments, &meta, &files, args)?;
        }
        // The run directory is whole: what uprobes are left are closed by
        // a child once we have exited (each close waits ~60 ms).
        let mut uprobe_closer = uprobe_closer;
        if let (Some((count, pid)), false) = (uprobe_closer.hand_over(), args.view.quiet) {
            eprintln!(
                "xlap-trace: {count} uprobes are closed in the background by pid {pid} (xlap-closer), each close taking the kernel tens of milliseconds"
            );
        }
        if meta.lost > 0 && !args.view.quiet {
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

/// The end of a rotated recording: the last segments finished, what the
/// finisher could not keep said.
fn end_segments(
    segments: Segments,
    meta: &RunMeta,
    files: &RunDir,
    args: &RecordOptions,
) -> Result<()> {
    // As for every segment: Parquet holds the same stamps.
    std::fs::remove_file(files.stamps_stream())
        .with_context(|| format!("cannot remove {}", files.stamps_stream().display()))?;
    if !args.view.quiet {
        eprintln!("xlap-trace: finishing the last segments ...");
    }
    let index = segments.end(meta, files.path())?;
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
    if !args.view.quiet {
        let kept = index
            .segments
            .iter()
            .filter(|s| s.state != segments::SegmentState::Deleted)
            .count();
        eprintln!(
            "xlap-trace: {} segments in {} ({kept} kept; {})",
            index.segments.len(),
            args.output.dir.display(),
            segments::INDEX_FILE
        );
    }
    Ok(())
}
