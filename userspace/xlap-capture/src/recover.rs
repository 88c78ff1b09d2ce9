//! `xlap-trace recover DIR`: a run whose recorder died (kill -9, OOM, a
//! power cut of the process) is still a run. Its run.json says `running`
//! (written when the probes were attached, rewritten at every checkpoint)
//! and its live stream `stamps.arrows` holds every complete batch; recovery
//! converts the stream to `stamps.parquet`, counts what it holds, and marks
//! the run `recovered` with what is known to be missing. The commands that
//! read runs (analyze, sql, report, export, correlate, summary, compare,
//! history) recover such a run by themselves first.

use crate::runmeta::{process_start_ticks, RecoveryNote, RunMeta, RunState};
use anyhow::Result;
use std::path::{Path, PathBuf};
use xlap_exit::{failure, Code};
use xlap_records::writer::stream_to_parquet;
use xlap_records::RunDir;

/// What a recovery found.
#[derive(Debug)]
pub struct Recovery {
    pub dir: PathBuf,
    pub recorder_pid: u32,
    pub stamps: u64,
    /// Stamps the last checkpoint had seen written to the stream.
    pub checkpoint_stamps: Option<u64>,
    /// Bytes after the last complete batch (a batch cut short).
    pub bytes_cut: u64,
    /// Seconds between the last checkpoint and the last stamp recovered.
    pub after_checkpoint_s: Option<f64>,
}

/// Whether the run's recorder is still at work: its pid alive and started
/// when run.json says it did.
fn recorder_alive(meta: &RunMeta) -> Option<u32> {
    let r = meta.recorder.as_ref()?;
    (process_start_ticks(r.pid) == Some(r.start_ticks)).then_some(r.pid)
}

fn read_meta(path: &Path) -> Result<RunMeta> {
    let text = xlap_records::run_file::read_json_text(path).map_err(|e| {
        failure(
            Code::BadInput,
            format!(
                "{}: not an xlap-trace run directory ({e})",
                path.parent().unwrap_or(path).display()
            ),
        )
    })?;
    RunMeta::from_json(&text)
        .map_err(|e| failure(Code::BadInput, format!("{}: {e}", path.display())))
}

/// Recovers the run in `dir`; `None` when there is nothing to recover (the
/// run ended, or was recovered before).
pub fn recover(dir: &RunDir) -> Result<Option<Recovery>> {
    let meta = read_meta(&dir.meta())?;
    if meta.state != RunState::Running {
        return Ok(None);
    }
    if let Some(pid) = recorder_alive(&meta) {
        return Err(failure(
            Code::BadInput,
            format!(
                "{}: the run is still being recorded by pid {pid}; stop it (kill -INT {pid}) and it completes itself",
                dir.path().display()
            ),
        ));
    }
    from_stream(dir, meta, None).map(Some)
}

/// A peer's run as it arrived at a collector (`record --collect`): when
/// its stamps.parquet did not arrive, the stream it sent is made into one,
/// as for a recorder that died. Its recorder ran on another host, so
/// whether it is alive is not asked here. `None`: the Parquet file is
/// there.
pub fn recover_peer(dir: &RunDir) -> Result<Option<Recovery>> {
    if dir.stamps().is_file() {
        return Ok(None);
    }
    let meta = read_meta(&dir.meta())?;
    let ended = meta.state != RunState::Running;
    from_stream(dir, meta, Some(ended)).map(Some)
}

/// The stream of `dir` into stamps.parquet, its run.json marked
/// `recovered`. `peer`: a peer's run (whether its final run.json arrived).
fn from_stream(dir: &RunDir, mut meta: RunMeta, peer: Option<bool>) -> Result<Recovery> {
    let meta_path = dir.meta();
    let stream = dir.stamps_stream();
    let parquet = dir.stamps();
    if !stream.is_file() {
        return Err(failure(
            Code::BadInput,
            format!(
                "{}: the recorder died before it wrote stamps.arrows; nothing to recover",
                dir.path().display()
            ),
        ));
    }
    let copy = stream_to_parquet(&stream, &parquet).map_err(|e| {
        failure(
            Code::BadInput,
            format!(
                "{}: cannot read the live stream ({e})",
                dir.path().display()
            ),
        )
    })?;
    let counts = count(&parquet)?;
    let checkpoint = meta.checkpoint.clone();
    let recovery = Recovery {
        dir: dir.path().to_path_buf(),
        recorder_pid: meta.recorder.as_ref().map_or(0, |r| r.pid),
        stamps: copy.rows,
        checkpoint_stamps: checkpoint.as_ref().map(|c| c.streamed_stamps),
        bytes_cut: copy.bytes_total - copy.bytes_used,
        after_checkpoint_s: checkpoint
            .as_ref()
            .zip(counts.last_ts_ns)
            // The checkpoint is taken after the stamps it counts: a last
            // stamp before it means none came after (not a negative time).
            .map(|(c, l)| ((l - c.clock.monotonic_ns as i64) as f64 / 1e9).max(0.0)),
    };
    // Stamps per point as recovered; the losses stay those of the last
    // checkpoint (the kernel's counters died with the recorder).
    for p in meta.points.values_mut() {
        p.stamps = 0;
    }
    for (name, n) in &counts.per_point {
        meta.points.entry(name.clone()).or_default().stamps = *n;
    }
    meta.stamps = copy.rows;
    meta.packets = counts.packets;
    // The run's end: the last stamp recovered, on the start's clock pair.
    if let Some(last) = counts.last_ts_ns.map(|t| t as u64) {
        if last > meta.clock_end().monotonic_ns {
            meta.clock_end = Some(meta.clock_start.advanced_to(last));
        }
    }
    // A killed recorder left its marker rings in the targets' /dev/shm.
    // (A peer's targets are another host's pids: nothing of theirs here.)
    if peer.is_none() {
        let targets: Vec<u32> = meta.targets.iter().map(|t| t.pid).collect();
        crate::record::shm_file::sweep_after_crash(&targets);
    }
    meta.state = RunState::Recovered;
    if peer != Some(true) {
        meta.stop_reason = xlap_records::run_meta::StopReason::RecorderDied;
    }
    let mut not_known = match peer {
        Some(true) => vec!["the peer's own stamps.parquet did not reach the collector: its stamps are those of the stream that did, read as after a crash".to_string()],
        Some(false) => vec!["the peer's stream ended before its run did (it died, disconnected, or the collector stopped waiting): what it recorded after that is not here".to_string()],
        None => Vec::new(),
    };
    not_known.extend([
        "stamps the kernel side counted lost after the last checkpoint (the losses here are the checkpoint's)".into(),
        format!("stamps the recorder had not yet written to stamps.arrows when it died (at most the last {} ms of each CPU's stamps, and those read but not yet in a written batch: up to 0.5 s)", meta.batch_export_every_ms.map_or("?".into(), |ms| ms.to_string())),
        "the flows' addresses and sockets (src_addr, dst_addr, socket_cookie are null)".into(),
        "whether a receive-device stamp belongs to a socket not traced (they are kept)".into(),
    ]);
    meta.recovery = Some(RecoveryNote {
        by: format!("xlap-trace {}", env!("CARGO_PKG_VERSION")),
        stamps: copy.rows,
        checkpoint_stamps: recovery.checkpoint_stamps,
        stream_bytes: copy.bytes_total,
        stream_bytes_cut: recovery.bytes_cut,
        last_stamp_after_checkpoint_s: recovery.after_checkpoint_s,
        not_known,
    });
    meta.write(&meta_path)?;
    if peer.is_none() {
        crate::record::segments::note_recovered(dir, copy.rows)?;
    }
    Ok(recovery)
}

/// Stamps per point, packets (distinct flow, kind, seq of stamps that know
/// their flow, as the recorder counts them) and the last stamp's time.
fn count(parquet: &Path) -> Result<xlap_records::stamp_counts::StampCounts> {
    xlap_records::stamp_counts::stamp_counts(parquet)
        .map_err(|e| anyhow::anyhow!("{}: {e}", parquet.display()))
}

/// Says what a recovery found, on standard error.
pub fn report(r: &Recovery) {
    eprintln!(
        "xlap-trace: recovered {}: its recorder (pid {}) died; {} stamps from stamps.arrows into stamps.parquet{}{}; run.json says what cannot be known (recovery.not_known)",
        r.dir.display(),
        r.recorder_pid,
        r.stamps,
        r.after_checkpoint_s
            .map(|s| {
                if s < 0.05 {
                    ", none of them after the last checkpoint".to_string()
                } else {
                    format!(", the last {s:.1} s after the last checkpoint")
                }
            })
            .unwrap_or_default(),
        if r.bytes_cut > 0 {
            format!(", a batch cut short ({} bytes) left out", r.bytes_cut)
        } else {
            String::new()
        },
    );
}

/// Before a command reads runs: recovers every run under `paths` (a run
/// directory, a directory of runs, or a file in a run directory) left
/// `running` by a recorder that is gone. A run still being recorded is
/// left alone (reading it then says so).
pub fn before_reading(paths: &[&Path]) {
    for dir in paths.iter().flat_map(|p| run_dirs(p)) {
        let running = read_meta(&dir.meta())
            .map(|m| m.state == RunState::Running && recorder_alive(&m).is_none())
            .unwrap_or(false);
        if !running {
            continue;
        }
        match recover(&dir) {
            Ok(Some(r)) => report(&r),
            Ok(None) => {}
            Err(e) => eprintln!(
                "xlap-trace: warning: cannot recover {}: {e:#}",
                dir.path().display()
            ),
        }
    }
}

/// Removes the marker rings dead recorders left in this mount namespace's
/// /dev/shm, for a process that recovers runs without the privileges the
/// removal needs (`xlap-trace`'s confine.rs calls it before its confined
/// child recovers the runs). Reads nothing of any run: a ring's name says
/// its recorder, which is gone. Rings a dead recorder left in a target's
/// own /dev/shm (another mount namespace) are named by the run's targets:
/// only an unconfined recovery reaches them.
pub fn sweep_dead_recorders_rings() -> usize {
    crate::record::shm_file::sweep_after_crash(&[])
}

/// The runs `recover DIR` takes up: DIR, or the segments of a rotated
/// recording in DIR.
pub fn runs_named(dir: &Path) -> Vec<RunDir> {
    let named = RunDir::new(dir);
    if !named.is_rotated() {
        return vec![named];
    }
    let mut dirs = run_dirs(dir);
    dirs.sort_by(|a, b| a.path().cmp(b.path()));
    dirs
}

/// The run directories a path names.
fn run_dirs(path: &Path) -> Vec<RunDir> {
    let dir = RunDir::new(if path.is_file() {
        path.parent().unwrap_or(Path::new("."))
    } else {
        path
    });
    let mut dirs: Vec<RunDir> = std::fs::read_dir(dir.path())
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| RunDir::new(e.path())))
                .filter(RunDir::is_run)
                .collect()
        })
        .unwrap_or_default();
    if dir.is_run() {
        dirs.push(dir);
    }
    dirs
}
