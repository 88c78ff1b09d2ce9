//! `record`, `run -- CMD` and the hidden `finish`: the command line turned
//! into the recorder's options, the recording, and the end of the run.

use super::peer_link;
use crate::cli::{BpfStats, Endian, FinishArgs, RecordArgs, RunArgs};
use anyhow::Result;
use std::process::ExitCode;
use xlap_analyze::finish::{finish_run, print_finished, FinishOptions};
use xlap_capture::capture::BoundaryRequest;
use xlap_capture::cgroup_names::{self, TracedCgroup};
use xlap_capture::point_sets::PointSet;
use xlap_capture::proto::{self, Layout, Layouts};
use xlap_capture::record::options::{Output, Recorder, Stamping, Stop, Targets, View};
use xlap_capture::record::{self, RecordOptions, StatsMode};
use xlap_exit::{failure, Code};
use xlap_records::sample::Sample;
use xlap_records::RunDir;

/// `--pid`s and the processes now in each `--cgroup` and `--container`
/// (their children are followed as any target's), and those cgroups (whose
/// later members are traced as they enter).
fn targets(a: &RecordArgs) -> Result<(Vec<u32>, Vec<TracedCgroup>)> {
    let mut pids = a.pids.clone();
    let mut cgroups = Vec::new();
    for path in &a.cgroups {
        cgroups.push(cgroup_names::cgroup_at(path)?);
    }
    for id in &a.containers {
        let (_, found) = cgroup_names::container_cgroups(id)?;
        cgroups.extend(found);
    }
    for c in &cgroups {
        pids.extend(c.members());
    }
    // In the order given, each once (a --pid inside a --cgroup too).
    let mut seen = std::collections::HashSet::new();
    pids.retain(|p| seen.insert(*p));
    Ok((pids, cgroups))
}

impl TryFrom<&RecordArgs> for RecordOptions {
    type Error = anyhow::Error;

    fn try_from(a: &RecordArgs) -> Result<Self> {
        let layouts = Layouts {
            default: layout(a)?,
            ports: a.port_layouts.clone(),
        };
        layouts.to_abi()?; // the limits, checked before anything starts
        let sample = sample(a, &layouts.default)?;
        let (pids, cgroups) = targets(a)?;
        Ok(RecordOptions {
            targets: Targets {
                pids,
                cgroups,
                started_here: a.started_here,
            },
            stop: Stop {
                duration: a.duration,
                count: a.count,
            },
            output: Output {
                dir: a.output.clone(),
                rotate: a.rotate,
                max_size: a.max_size,
                ready_file: a.ready_file.clone(),
                umask: a.umask,
                no_correlate: a.no_correlate,
                deadline_ms: a.deadline_ms,
            },
            stamping: Stamping {
                // A wrong --points is a usage error before anything starts
                // (with `run`, before the command).
                points: PointSet::parse(&a.points)?,
                no_usdt: a.no_usdt,
                usdt: a.usdt.clone(),
                marker_path: a.marker_path.into(),
                boundary: match a.boundary {
                    crate::cli::BoundaryArg::Auto => BoundaryRequest::Auto,
                    crate::cli::BoundaryArg::SocketCalls => BoundaryRequest::SocketCalls,
                    crate::cli::BoundaryArg::Syscalls => BoundaryRequest::Syscalls,
                },
                sample,
                ifaces: a.ifaces.clone(),
                tunnel_ports: a.tunnel_ports.clone(),
                layouts,
                empty_programs: a.empty_programs,
                per_stamp_records: a.per_stamp_records,
            },
            recorder: Recorder {
                ringbuf_kib: a.ringbuf_kib,
                full_priority: a.full_priority,
                stats_mode: match (a.no_bpf_stats, a.bpf_stats) {
                    (true, _) | (false, BpfStats::Off) => StatsMode::Off,
                    (false, BpfStats::Sampled) => StatsMode::Sampled,
                    (false, BpfStats::Full) => StatsMode::Full,
                },
                host: a.host.clone(),
                skip_capability_check: a.skip_capability_check,
            },
            view: View {
                quiet: a.quiet,
                live: a.live,
                metrics: a.metrics,
                peers: None,
            },
        })
    }
}

/// `--sample` and `--sample-kinds`: kinds by number or by the default
/// layout's names.
fn sample(a: &RecordArgs, layout: &Layout) -> Result<Option<Sample>> {
    let Some(rate) = &a.sample else {
        return Ok(None);
    };
    if !a.sample_kinds.is_empty() && layout.kind_size == 0 {
        return Err(failure(
            Code::Usage,
            "--sample-kinds needs a layout with a kind field (--proto, or --kind-offset and --kind-size)",
        ));
    }
    let mut kinds = Vec::new();
    for k in &a.sample_kinds {
        let named = layout.kind_names.iter().find(|(_, name)| name == k);
        let kind = match (named, k.parse::<u32>()) {
            (Some((kind, _)), _) => *kind as u32,
            (None, Ok(kind)) => kind,
            (None, Err(_)) => {
                let names: Vec<&str> = layout.kind_names.iter().map(|(_, n)| *n).collect();
                return Err(failure(
                    Code::Usage,
                    format!(
                        "--sample-kinds: {k:?} is neither a number nor a kind of the layout ({})",
                        if names.is_empty() {
                            "it names none".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                ));
            }
        };
        kinds.push(kind);
    }
    Sample::parse(rate, kinds).map_err(|e| failure(Code::Usage, e))
}

/// The preset, with any explicit field options applied over it. A layout
/// given only by --seq-* options takes no kind from the default preset:
/// its byte 0 would split a third-party protocol's packets into "kinds".
fn layout(a: &RecordArgs) -> Result<Layout> {
    let mut l = proto::preset(a.proto.as_deref().unwrap_or(proto::DEFAULT_PRESET))?;
    let explicit_seq = a.seq_offset.is_some() || a.seq_size.is_some() || a.seq_endian.is_some();
    if a.proto.is_none() && explicit_seq {
        l.kind_size = 0;
        l.kind_offset = 0;
        l.kind_names = &[];
    }
    if let Some(v) = a.seq_offset {
        l.seq_offset = v;
    }
    if let Some(v) = a.seq_size {
        l.seq_size = v;
    }
    if let Some(e) = a.seq_endian {
        l.big_endian = e == Endian::Big;
    }
    if let Some(v) = a.kind_offset {
        l.kind_offset = v;
        l.kind_names = &[];
    }
    if let Some(v) = a.kind_size {
        l.kind_size = v;
        l.kind_names = &[];
    }
    l.validate()?;
    Ok(l)
}

/// `record` (and `xlap-trace --pid PID`).
pub fn record(args: &RecordArgs) -> Result<()> {
    let mut opts = RecordOptions::try_from(args)?;
    // Before the run: a collector listens from the start (its peers may
    // start first); a failing run drops the link, which stops it.
    let link = peer_link::start(args)?;
    opts.view.peers = link.feed();
    let meta = record::run(&opts)?;
    record::print_summary(&meta, &record::segments::final_dir(&opts.output.dir));
    let ended = peer_link::end(link, args)?;
    if !opts.output.no_correlate {
        finish_confined(&opts, &ended.peers);
    }
    undelivered(ended)
}

/// A peer's run that did not all reach its collector ends in exit 1,
/// once everything here is written.
fn undelivered(ended: peer_link::Ended) -> Result<()> {
    match ended.undelivered {
        Some(why) => Err(failure(Code::Runtime, why)),
        None => Ok(()),
    }
}

/// `run -- CMD`: traced like `record`, then the command's own status.
pub fn run(a: &RunArgs) -> Result<ExitCode> {
    let mut opts = RecordOptions::try_from(&a.record)?;
    let link = peer_link::start(&a.record)?;
    opts.view.peers = link.feed();
    let (meta, status) = record::command::run(&opts, &a.command)?;
    record::print_summary(&meta, &record::segments::final_dir(&opts.output.dir));
    let ended = peer_link::end(link, &a.record)?;
    if meta.packets == 0 && meta.stamps == 0 && !opts.stamping.empty_programs {
        eprintln!(
            "xlap-trace: {} sent and received no UDP datagram on a traced socket: nothing was stamped",
            a.command[0]
        );
    } else if !opts.output.no_correlate {
        finish_confined(&opts, &ended.peers);
    }
    undelivered(ended)?;
    Ok(ExitCode::from(record::command::exit_code(status)))
}

/// The end of a run where its ends were both traced here: the packets
/// table, summary.json and the latency summary printed, made by `finish`
/// in a child confined to the run directory (it parses what the traced
/// programs sent; the recorder is root). A failure is reported, never
/// fatal: the stamps are already safe on disk.
fn finish_confined(opts: &RecordOptions, peers: &[std::path::PathBuf]) {
    let dir = record::segments::final_dir(&opts.output.dir);
    // What this process printed comes first.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // This very binary, even if a rebuild replaced the file since.
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg(record::segments::FINISH_COMMAND)
        .arg(&dir)
        .arg("--print");
    if let Some(d) = opts.output.deadline_ms {
        cmd.args(["--deadline-ms", &d.to_string()]);
    }
    if opts.view.quiet {
        cmd.arg("--quiet");
    }
    for p in peers {
        cmd.arg("--peer").arg(p);
    }
    match cmd.stdin(std::process::Stdio::null()).status() {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!(
            "xlap-trace: warning: finishing the run failed ({s}); `xlap-trace correlate {}` retries",
            dir.display()
        ),
        Err(e) => eprintln!(
            "xlap-trace: warning: cannot start xlap-trace (/proc/self/exe) to finish the run ({e}); `xlap-trace correlate {}` does it",
            dir.display()
        ),
    }
    if opts.output.rotate.is_some() {
        if let Err(e) = record::segments::refresh(&opts.output.dir) {
            eprintln!("xlap-trace: warning: {e:#}");
        }
    }
}

/// `finish RUN`: a run's packets table and summary.json, in a child of the
/// recorder (at the end of the run, `--print`, and for each segment of a
/// rotated one), confined to the run directory before it reads anything.
pub fn finish(a: &FinishArgs) -> Result<()> {
    let run = RunDir::new(&a.run);
    crate::confine::to_run(&run, a.quiet)?;
    let opts = FinishOptions {
        deadline_ms: a.deadline_ms,
        analysis: a.print,
        peers: ready_peers(&a.peers),
    };
    if !a.print {
        finish_run(&run, &opts)?.summary?;
        return Ok(());
    }
    match finish_with_peers(&run, opts) {
        Ok(f) => print_finished(&f, &run, a.quiet),
        Err(e) => eprintln!(
            "xlap-trace: warning: no packets table ({e:#}); run `xlap-trace correlate {}` to retry",
            a.run.display()
        ),
    }
    Ok(())
}

/// [`finish_run`]; when the peers' runs make the correlation fail (a peer
/// whose stream held no batch, a run refused as input), this run alone
/// still gets its packets table, said.
fn finish_with_peers(
    run: &RunDir,
    opts: FinishOptions,
) -> xlap_analyze::Result<xlap_analyze::finish::Finished> {
    match finish_run(run, &opts) {
        Err(e) if !opts.peers.is_empty() => {
            eprintln!(
                "xlap-trace: warning: the peers' runs cannot be correlated with this one ({e}); the packets table is this run's alone (`xlap-trace correlate` with the peers' directories retries)"
            );
            let alone = FinishOptions {
                peers: Vec::new(),
                ..opts
            };
            finish_run(run, &alone)
        }
        other => other,
    }
}

/// The peers' runs (record --collect) ready to correlate: one whose
/// stamps.parquet did not arrive is read from the stream it sent, as a
/// dead recorder's; one that cannot be is left out, said.
fn ready_peers(peers: &[std::path::PathBuf]) -> Vec<RunDir> {
    let mut ready = Vec::new();
    for p in peers {
        let dir = RunDir::new(p);
        match xlap_capture::recover::recover_peer(&dir) {
            Ok(Some(r)) => {
                eprintln!(
                    "xlap-trace: peer run {}: {} stamps read from the stream that arrived{}",
                    p.display(),
                    r.stamps,
                    if r.bytes_cut > 0 {
                        format!(" (a batch cut short, {} bytes, left out)", r.bytes_cut)
                    } else {
                        String::new()
                    }
                );
                ready.push(dir);
            }
            Ok(None) => ready.push(dir),
            Err(e) => eprintln!(
                "xlap-trace: warning: peer run {} left out of the packets table: {e:#}",
                p.display()
            ),
        }
    }
    ready
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn options(args: &[&str]) -> RecordOptions {
        let cli = Cli::parse_from(std::iter::once("xlap-trace").chain(args.iter().copied()));
        RecordOptions::try_from(&cli.record).unwrap()
    }

    #[test]
    fn the_recorders_defaults_are_the_command_lines() {
        assert_eq!(options(&[]), RecordOptions::default());
    }

    #[test]
    fn no_bpf_stats_turns_them_off() {
        assert_eq!(
            options(&["--no-bpf-stats"]).recorder.stats_mode,
            StatsMode::Off
        );
        assert_eq!(
            options(&["--bpf-stats", "full"]).recorder.stats_mode,
            StatsMode::Full
        );
    }

    #[test]
    fn explicit_seq_options_alone_give_no_kind() {
        let layout = |args: &[&str]| options(args).stamping.layouts.default;
        let default = layout(&[]);
        assert_eq!((default.kind_offset, default.kind_size), (0, 1));
        let third_party = layout(&["--seq-offset", "8", "--seq-size", "4"]);
        assert_eq!((third_party.seq_offset, third_party.kind_size), (8, 0));
        assert!(third_party.kind_names.is_empty());
        let with_kind = layout(&[
            "--seq-offset",
            "8",
            "--kind-offset",
            "2",
            "--kind-size",
            "1",
        ]);
        assert_eq!((with_kind.kind_offset, with_kind.kind_size), (2, 1));
        // Over a named preset, the preset's kind stays.
        let over = layout(&["--proto", "xlap-example", "--seq-offset", "8"]);
        assert_eq!((over.seq_offset, over.kind_size), (8, 1));
    }
}
