//! Long runs: a recording cut into segments (`--rotate SIZE|DURATION`),
//! each a run directory readable on its own (`DIR/seg-000001`, ...), kept
//! within a disk budget (`--max-size`: the oldest finished segments go),
//! listed in `DIR/segments.json`.
//!
//! The reader only closes a segment's live stream and opens the next one;
//! a finisher thread that runs only on CPU time nobody else wants
//! (SCHED_IDLE: the traced processes and the reader come first; normal
//! priority once the recording ended) turns the closed stream into Parquet,
//! completes its run.json and deletes the live stream (Parquet holds the
//! same stamps in a quarter of the bytes): that keeps up with any rate the
//! reader does. The segment's packets table and summary come after, from a
//! child `xlap-trace finish` (its DuckDB memory apart from the
//! recorder's, bounded by [`SEGMENT_MEMORY_LIMIT`]), and only when no other
//! segment waits: a finisher that fell behind leaves them out
//! (`packets_table: false` in the index; `xlap-trace correlate SEG` builds
//! one later). A packet in flight at a cut has its stamps in two segments:
//! each segment's packets table shows it partial, the recording's
//! directory read as a whole (`xlap-trace analyze DIR`) joins them.

use super::tally::BY_PORT_POINTS;
use crate::runmeta::RunMeta;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use xlap_records::writer::{stream_to_parquet_with, DropFlows, FlowTable};
use xlap_records::RunDir;

/// The index of a rotated recording.
pub use xlap_records::run_dir::SEGMENTS as INDEX_FILE;

/// DuckDB's memory for a segment's packets table while the recording goes
/// on (unless `XLAP_MEMORY_LIMIT` is set): it spills beyond.
pub const SEGMENT_MEMORY_LIMIT: &str = "1GB";

/// When a segment ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotate {
    /// Its live stream reached this many bytes.
    Bytes(u64),
    /// It has been recording this long.
    Every(Duration),
}

impl std::fmt::Display for Rotate {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Rotate::Bytes(b) => write!(f, "{b} bytes"),
            Rotate::Every(d) => write!(f, "{} s", d.as_secs_f64()),
        }
    }
}

/// Bytes: `512MiB`, `2G`, `1.5GB`, `100000` (K, M, G, T and KiB... are
/// powers of 1024; KB, MB, GB, TB powers of 1000; any case).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (e.g. 512MiB, 2GB, 100000)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{text}' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ))
        }
    };
    let bytes = number * scale;
    if !(1.0..=u64::MAX as f64).contains(&bytes) {
        return Err(format!("'{text}' is not a size of at least one byte"));
    }
    Ok(bytes as u64)
}

/// `--rotate`: a duration (`30s`, `10min`, `1h`) or a size (see
/// [`parse_size`]); a bare `m` is refused as ambiguous.
pub fn parse_rotate(text: &str) -> Result<Rotate, String> {
    let t = text.trim().to_ascii_lowercase();
    if t.ends_with('m') && !t.ends_with("im") && t.trim_end_matches('m').parse::<f64>().is_ok() {
        return Err(format!(
            "'{text}' is ambiguous: write {0}min for minutes or {0}MiB for a size",
            t.trim_end_matches('m')
        ));
    }
    for (suffix, secs) in [("min", 60.0), ("h", 3600.0), ("s", 1.0)] {
        if let Some(n) = t.strip_suffix(suffix) {
            if let Ok(n) = n.trim().parse::<f64>() {
                if n * secs < 1.0 {
                    return Err(format!("--rotate {text}: segments of at least 1 s"));
                }
                return Ok(Rotate::Every(Duration::from_secs_f64(n * secs)));
            }
        }
    }
    let bytes =
        parse_size(text).map_err(|e| format!("{e}; or a duration such as 30s, 10min, 1h"))?;
    if bytes < 64 * 1024 {
        return Err(format!("--rotate {text}: segments of at least 64 KiB"));
    }
    Ok(Rotate::Bytes(bytes))
}

/// Where a segment is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SegmentState {
    /// Its stamps are being recorded.
    Recording,
    /// Recorded, waiting for the finisher.
    Finishing,
    /// Its Parquet being written.
    Converting,
    /// A run directory of its own.
    Complete,
    /// Finishing failed (`error` says why; its live stream is kept).
    Failed,
    /// Made whole by `xlap-trace recover` after its recorder died.
    Recovered,
    /// Removed to keep the recording within `--max-size` (one still
    /// waiting for the finisher, too: `error` says so).
    Deleted,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SegmentEntry {
    pub index: u32,
    /// Its directory, relative to the index.
    pub dir: String,
    pub state: SegmentState,
    pub run_id: String,
    /// Its first clock pair's monotonic time, ns (the run's clock).
    pub start_monotonic_ns: u64,
    pub stamps: u64,
    pub packets: u64,
    pub lost: u64,
    /// Its directory's size on disk when last looked at.
    pub bytes: u64,
    /// Its packets table and summary.json were built.
    #[serde(default)]
    pub packets_table: bool,
    /// Why they were not.
    #[serde(default)]
    pub packets_table_missing: Option<String>,
    /// Seconds the finisher took to write its Parquet (behind the reader,
    /// on idle CPU time).
    #[serde(default)]
    pub finish_s: Option<f64>,
    /// Why finishing failed, or why it was deleted unfinished.
    pub error: Option<String>,
}

/// `segments.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SegmentIndex {
    pub rotate: String,
    pub max_size_bytes: Option<u64>,
    pub segments: Vec<SegmentEntry>,
    /// Room kept for the segment being recorded: its --rotate size (0
    /// for segments cut by time).
    #[serde(default)]
    pub recording_reserve_bytes: u64,
}

impl SegmentIndex {
    pub fn read(dir: &Path) -> Result<SegmentIndex> {
        let path = dir.join(INDEX_FILE);
        let text = xlap_records::run_file::read_json_text(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        xlap_records::strict_json::parse(&text)
            .and_then(serde_json::from_value)
            .with_context(|| format!("{} is not a segment index", path.display()))
    }

    fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(INDEX_FILE);
        let json = serde_json::to_string_pretty(self)? + "\n";
        Ok(xlap_records::run_file::write_whole(&path, json.as_bytes())?)
    }

    /// Deletes the oldest complete segments (never the newest one) while
    /// the recording's directories, with room for the segment being
    /// recorded, exceed the budget; when the finisher fell that far
    /// behind, segments still waiting for it go too (the budget holds, the
    /// index says what went unfinished).
    fn keep_within(&mut self, dir: &Path) -> Vec<u32> {
        let Some(max) = self.max_size_bytes else {
            return Vec::new();
        };
        let mut deleted = Vec::new();
        let last = self.segments.last().map_or(0, |s| s.index);
        loop {
            let total: u64 = self
                .segments
                .iter()
                .map(|s| match s.state {
                    SegmentState::Recording => self.recording_reserve_bytes,
                    SegmentState::Deleted => 0,
                    _ => s.bytes,
                })
                .sum();
            if total <= max {
                break;
            }
            let Some(oldest) = self.segments.iter_mut().find(|s| {
                matches!(s.state, SegmentState::Complete | SegmentState::Finishing)
                    && s.index != last
            }) else {
                break;
            };
            if std::fs::remove_dir_all(dir.join(&oldest.dir)).is_err() {
                break;
            }
            if oldest.state == SegmentState::Finishing {
                oldest.error = Some(
                    "deleted before it was finished: the finisher was behind and --max-size reached"
                        .into(),
                );
            }
            oldest.state = SegmentState::Deleted;
            oldest.bytes = 0;
            deleted.push(oldest.index);
        }
        deleted
    }
}

/// Bytes of the files of a directory (one level: a run directory).
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// The directory of the last segment still on disk (the run's own
/// directory when it was not rotated).
pub fn final_dir(output: &Path) -> PathBuf {
    SegmentIndex::read(output)
        .ok()
        .and_then(|i| {
            i.segments
                .iter()
                .rev()
                .find(|s| s.state != SegmentState::Deleted)
                .map(|s| output.join(&s.dir))
        })
        .unwrap_or_else(|| output.to_path_buf())
}

/// A closed segment for the finisher.
pub struct Finish {
    pub files: RunDir,
    pub meta: RunMeta,
    /// Flows whose by-port receive stamps went to a socket not traced.
    pub foreign: HashSet<u64>,
    pub flows: FlowTable,
}

/// The segments of a rotated recording, and the thread finishing them.
pub struct Segments {
    output: PathBuf,
    pub rotate: Rotate,
    index: Arc<Mutex<SegmentIndex>>,
    jobs: Option<mpsc::Sender<Finish>>,
    finisher: Option<std::thread::JoinHandle<()>>,
    /// The recording ended: the finisher takes normal priority.
    ending: Arc<std::sync::atomic::AtomicBool>,
}

/// What the finisher does besides Parquet and run.json.
#[derive(Clone)]
pub struct FinishOptions {
    pub correlate: bool,
    pub deadline_ms: Option<f64>,
    pub quiet: bool,
}

impl Segments {
    /// Starts a rotated recording in `output` (which must not hold
    /// another run).
    pub fn start(
        output: &Path,
        rotate: Rotate,
        max_size: Option<u64>,
        opts: FinishOptions,
    ) -> Result<Segments> {
        let taken = RunDir::new(output);
        if taken.meta().exists() || taken.segments().exists() {
            return Err(xlap_exit::failure(
                xlap_exit::Code::Usage,
                format!(
                    "{} already holds a run: a rotated recording needs a directory of its own (-o NEW_DIR)",
                    output.display()
                ),
            ));
        }
        let index = Arc::new(Mutex::new(SegmentIndex {
            rotate: rotate.to_string(),
            max_size_bytes: max_size,
            segments: Vec::new(),
            recording_reserve_bytes: match rotate {
                Rotate::Bytes(b) => b,
                Rotate::Every(_) => 0,
            },
        }));
        let (jobs, rx) = mpsc::channel::<Finish>();
        let ending = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let finisher = {
            let (index, output) = (index.clone(), output.to_path_buf());
            let ending = ending.clone();
            std::thread::Builder::new()
                .name("xlap-segments".into())
                .spawn(move || {
                    crate::reader_priority::idle_priority();
                    let mut waiting = std::collections::VecDeque::new();
                    let mut normal = false;
                    while let Some(job) = waiting.pop_front().or_else(|| rx.recv().ok()) {
                        if !normal && ending.load(std::sync::atomic::Ordering::Relaxed) {
                            crate::reader_priority::normal_priority();
                            normal = true;
                        }
                        let dir = finish_one(&output, &index, job, &opts);
                        if let (Some(dir), true) = (dir, opts.correlate) {
                            let mut behind = || {
                                waiting.extend(rx.try_iter());
                                !waiting.is_empty()
                            };
                            packets_table(&output, &index, &dir, &mut behind, &opts);
                        }
                    }
                })
                .context("cannot start the segment finisher")?
        };
        Ok(Segments {
            output: output.to_path_buf(),
            rotate,
            index,
            jobs: Some(jobs),
            finisher: Some(finisher),
            ending,
        })
    }

    /// Directory files of segment `n` (created).
    pub fn open(&self, n: u32, run_id: &str, start_monotonic_ns: u64) -> Result<RunDir> {
        let name = format!("seg-{n:06}");
        let files = RunDir::new(self.output.join(&name));
        std::fs::create_dir_all(files.path())
            .with_context(|| format!("cannot create {}", files.path().display()))?;
        let mut index = self.index.lock().expect("index lock");
        index.segments.push(SegmentEntry {
            index: n,
            dir: name,
            state: SegmentState::Recording,
            run_id: run_id.to_string(),
            start_monotonic_ns,
            stamps: 0,
            packets: 0,
            lost: 0,
            bytes: 0,
            packets_table: false,
            packets_table_missing: None,
            finish_s: None,
            error: None,
        });
        index.write(&self.output)?;
        Ok(files)
    }

    /// Hands a closed segment to the finisher; returns the segments deleted
    /// for the budget.
    pub fn close(&self, job: Finish) -> Result<Vec<u32>> {
        let deleted = {
            let mut index = self.index.lock().expect("index lock");
            if let Some(e) = index
                .segments
                .iter_mut()
                .find(|s| s.run_id == job.meta.run_id)
            {
                e.state = SegmentState::Finishing;
                e.stamps = job.meta.stamps;
                e.packets = job.meta.packets;
                e.lost = job.meta.lost;
                e.bytes = dir_bytes(job.files.path());
            }
            let deleted = index.keep_within(&self.output);
            index.write(&self.output)?;
            deleted
        };
        self.jobs
            .as_ref()
            .expect("finisher running")
            .send(job)
            .context("the segment finisher stopped")?;
        Ok(deleted)
    }

    /// Waits for the finisher, then marks the last segment (finished by
    /// the recording's own end) complete with its counts.
    pub fn end(mut self, last: &RunMeta, last_dir: &Path) -> Result<SegmentIndex> {
        self.ending
            .store(true, std::sync::atomic::Ordering::Relaxed);
        drop(self.jobs.take());
        if let Some(f) = self.finisher.take() {
            let _ = f.join();
        }
        let mut index = self.index.lock().expect("index lock");
        if let Some(e) = index.segments.iter_mut().find(|s| s.run_id == last.run_id) {
            e.state = SegmentState::Complete;
            e.stamps = last.stamps;
            e.packets = last.packets;
            e.lost = last.lost;
            e.bytes = dir_bytes(last_dir);
        }
        index.keep_within(&self.output);
        index.write(&self.output)?;
        Ok(index.clone())
    }
}

/// A segment `xlap-trace recover` made whole: the recording's index says
/// so (no index above it: not a segment, nothing to do).
pub fn note_recovered(segment: &RunDir, stamps: u64) -> Result<()> {
    let segment_dir = segment.path();
    let (Some(output), Some(name)) = (segment_dir.parent(), segment_dir.file_name()) else {
        return Ok(());
    };
    if !RunDir::new(output).segments().is_file() {
        return Ok(());
    }
    let mut index = SegmentIndex::read(output)?;
    if let Some(e) = index
        .segments
        .iter_mut()
        .find(|s| s.dir == name.to_string_lossy())
    {
        e.state = SegmentState::Recovered;
        e.stamps = stamps;
        e.bytes = dir_bytes(segment_dir);
    }
    index.write(output)
}

/// After the last segment's packets table: sizes brought up to date and
/// the budget kept.
pub fn refresh(output: &Path) -> Result<()> {
    let mut index = SegmentIndex::read(output)?;
    for s in &mut index.segments {
        if s.state != SegmentState::Deleted {
            let dir = output.join(&s.dir);
            s.bytes = dir_bytes(&dir);
            s.packets_table = RunDir::new(&dir).packets().is_file();
            if s.packets_table {
                s.packets_table_missing = None;
            }
        }
    }
    index.keep_within(output);
    index.write(output)
}

/// Parquet and run.json of a closed segment; its directory when it has
/// packets to correlate.
fn finish_one(
    output: &Path,
    index: &Mutex<SegmentIndex>,
    job: Finish,
    opts: &FinishOptions,
) -> Option<PathBuf> {
    let run_id = job.meta.run_id.clone();
    let dir = job.files.path().to_path_buf();
    {
        // Taken up, unless the budget deleted it while it waited.
        let mut index = index.lock().expect("index lock");
        let entry = index.segments.iter_mut().find(|s| s.run_id == run_id)?;
        if entry.state == SegmentState::Deleted {
            return None;
        }
        entry.state = SegmentState::Converting;
    }
    let began = std::time::Instant::now();
    let result = finish_files(job);
    let took = began.elapsed().as_secs_f64();
    let mut index = index.lock().expect("index lock");
    if let Some(e) = index.segments.iter_mut().find(|s| s.run_id == run_id) {
        match &result {
            Ok(meta) => {
                e.state = SegmentState::Complete;
                e.stamps = meta.stamps;
                e.finish_s = Some(took);
            }
            Err(err) => {
                e.state = SegmentState::Failed;
                e.error = Some(format!("{err:#}"));
                eprintln!(
                    "xlap-trace: warning: segment {} not finished ({err:#}); `xlap-trace recover {}` retries",
                    dir.display(),
                    dir.display()
                );
            }
        }
        e.bytes = dir_bytes(&dir);
    }
    let deleted = index.keep_within(output);
    if !deleted.is_empty() && !opts.quiet {
        eprintln!(
            "xlap-trace: note: deleted segments {deleted:?} to stay within --max-size ({}: deleted)",
            INDEX_FILE
        );
    }
    if let Err(e) = index.write(output) {
        eprintln!("xlap-trace: warning: {e:#}");
    }
    result.ok().filter(|m| m.packets > 0).map(|_| dir)
}

/// The segment's packets table and summary, from a child process (nice
/// like this thread), or a note why not.
fn packets_table(
    output: &Path,
    index: &Mutex<SegmentIndex>,
    dir: &Path,
    behind: &mut dyn FnMut() -> bool,
    opts: &FinishOptions,
) {
    let result = correlate_child(dir, opts.deadline_ms, behind);
    let left_out = matches!(&result, Err(e) if e.to_string().contains(LEFT_OUT));
    if let (Err(e), false) = (&result, opts.quiet || left_out) {
        eprintln!(
            "xlap-trace: note: no packets table in {} ({e:#})",
            dir.display()
        );
    }
    let mut index = index.lock().expect("index lock");
    let run_dir = dir.file_name().map(|n| n.to_string_lossy().to_string());
    if let Some(e) = index
        .segments
        .iter_mut()
        .find(|s| Some(&s.dir) == run_dir.as_ref())
    {
        e.packets_table = result.is_ok();
        e.packets_table_missing = result.err().map(|e| format!("{e:#}"));
        e.bytes = dir_bytes(dir);
    }
    index.keep_within(output);
    if let Err(e) = index.write(output) {
        eprintln!("xlap-trace: warning: {e:#}");
    }
}

const LEFT_OUT: &str = "left out: a later segment was waiting";

/// The hidden subcommand of `xlap-trace` that finishes one run directory
/// (the packets table and summary.json) in a process of its own.
pub const FINISH_COMMAND: &str = "finish";

/// `xlap-trace finish SEG` (the end of every run, `finish_run`), as a
/// child (DuckDB's memory is its own, not the recorder's; it inherits the
/// finisher's priority), given up (killed) as
/// soon as `behind` says another segment waits: the segments' Parquet
/// comes first.
fn correlate_child(
    dir: &Path,
    deadline_ms: Option<f64>,
    behind: &mut dyn FnMut() -> bool,
) -> Result<()> {
    // This very binary, even if a rebuild replaced the file since.
    let exe = Path::new("/proc/self/exe");
    let left_out = || {
        anyhow::anyhow!(
            "{LEFT_OUT} (`xlap-trace correlate {}` builds it)",
            dir.display()
        )
    };
    let mut run = |args: Vec<std::ffi::OsString>| -> Result<()> {
        if behind() {
            return Err(left_out());
        }
        let mut cmd = std::process::Command::new(exe);
        cmd.args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if std::env::var_os("XLAP_MEMORY_LIMIT").is_none() {
            cmd.env("XLAP_MEMORY_LIMIT", SEGMENT_MEMORY_LIMIT);
        }
        let mut child = cmd
            .spawn()
            .context("cannot start xlap-trace (/proc/self/exe)")?;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if behind() {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(RunDir::new(dir).packets());
                return Err(left_out());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        anyhow::ensure!(status.success(), "{}", err.trim());
        Ok(())
    };
    let mut finish: Vec<std::ffi::OsString> = vec![FINISH_COMMAND.into(), dir.into()];
    if let Some(d) = deadline_ms {
        finish.extend(["--deadline-ms".into(), d.to_string().into()]);
    }
    run(finish)
}

/// Parquet from the closed stream, run.json complete, the live stream gone.
fn finish_files(job: Finish) -> Result<RunMeta> {
    let Finish {
        files,
        mut meta,
        foreign,
        flows,
    } = job;
    let drop = DropFlows {
        flows: foreign,
        points: BY_PORT_POINTS,
    };
    let copy = stream_to_parquet_with(&files.stamps_stream(), &files.stamps(), &drop, &flows)?;
    for (point, n) in &copy.removed {
        if let Some(p) = meta.points.get_mut(point) {
            p.stamps = p.stamps.saturating_sub(*n);
        }
    }
    let removed: u64 = copy.removed.values().sum();
    meta.stamps -= removed.min(meta.stamps);
    meta.foreign_stamps_dropped = removed;
    meta.write(&files.meta())?;
    std::fs::remove_file(files.stamps_stream())
        .with_context(|| format!("cannot remove {}", files.stamps_stream().display()))?;
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse_and_bad_ones_say_why() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("100000"), Ok(100_000));
        assert!(parse_size("12 parsecs")
            .unwrap_err()
            .contains("unknown size unit"));
        assert!(parse_size("MiB").unwrap_err().contains("not a size"));
        assert_eq!(
            parse_rotate("30s"),
            Ok(Rotate::Every(Duration::from_secs(30)))
        );
        assert_eq!(
            parse_rotate("10min"),
            Ok(Rotate::Every(Duration::from_secs(600)))
        );
        assert_eq!(
            parse_rotate("1h"),
            Ok(Rotate::Every(Duration::from_secs(3600)))
        );
        assert_eq!(parse_rotate("256MiB"), Ok(Rotate::Bytes(256 << 20)));
        assert!(parse_rotate("10m").unwrap_err().contains("ambiguous"));
        assert!(parse_rotate("0.1s").unwrap_err().contains("at least 1 s"));
        assert!(parse_rotate("1000")
            .unwrap_err()
            .contains("at least 64 KiB"));
    }

    /// The budget deletes the oldest complete segments, never one still
    /// being finished nor the newest, and counts the one recording.
    #[test]
    fn the_budget_deletes_the_oldest_complete_segments_only() {
        let dir = std::env::temp_dir().join(format!("xlap-budget-{}", std::process::id()));
        let entry = |index: u32, state, bytes| SegmentEntry {
            index,
            dir: format!("seg-{index:06}"),
            state,
            run_id: index.to_string(),
            start_monotonic_ns: 0,
            stamps: 0,
            packets: 0,
            lost: 0,
            bytes,
            packets_table: false,
            packets_table_missing: None,
            finish_s: None,
            error: None,
        };
        let mut index = SegmentIndex {
            rotate: "1 s".into(),
            max_size_bytes: Some(150),
            recording_reserve_bytes: 50,
            segments: vec![
                entry(1, SegmentState::Converting, 100),
                entry(2, SegmentState::Complete, 100),
                entry(3, SegmentState::Complete, 100),
                entry(4, SegmentState::Recording, 0),
            ],
        };
        for s in &index.segments {
            std::fs::create_dir_all(dir.join(&s.dir)).unwrap();
        }
        // 300 finished + 50 recording: two go, oldest first, the one being
        // converted kept.
        assert_eq!(index.keep_within(&dir), vec![2, 3]);
        assert!(dir.join("seg-000001").exists() && !dir.join("seg-000002").exists());
        // Over budget with nothing deletable: nothing more goes.
        index.max_size_bytes = Some(10);
        assert_eq!(index.keep_within(&dir), Vec::<u32>::new());
        // A segment still waiting for the finisher goes when it must, and
        // says so.
        index.segments[0].state = SegmentState::Finishing;
        assert_eq!(index.keep_within(&dir), vec![1]);
        assert!(index.segments[0]
            .error
            .as_ref()
            .unwrap()
            .contains("before it was finished"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
