//! A recorded run: its directory, `run.json` and `stamps.parquet`.

use crate::{AnalyzeError, Result};
use std::path::{Path, PathBuf};
use xlap_records::run_meta::{RunMeta, RunState};
use xlap_records::RunDir;

/// A run directory and its typed `run.json` (the only copy of what it
/// says: the accessors below read it).
#[derive(Clone, Debug)]
pub struct Run {
    pub dir: PathBuf,
    pub meta: RunMeta,
}

impl Run {
    pub fn run_id(&self) -> &str {
        &self.meta.run_id
    }

    pub fn host(&self) -> &str {
        &self.meta.host
    }

    /// Runs with equal boot ids share one monotonic clock.
    pub fn boot_id(&self) -> &str {
        &self.meta.boot_id
    }

    /// Bytes of the protocol's sequence number (wrap-around span).
    pub fn seq_size(&self) -> u8 {
        self.meta.options.layout.seq_size
    }

    /// Bytes of the sequence number of datagrams to or from these ports
    /// (`--layout PORT=...`), where it differs from the default layout.
    pub fn port_seq_sizes(&self) -> impl Iterator<Item = (u16, u8)> + '_ {
        self.meta
            .options
            .port_layouts
            .iter()
            .map(|l| (l.port, l.layout.seq_size))
    }

    /// (monotonic, realtime) ns of the run's first clock pair.
    pub fn clock_pair(&self) -> (i64, i64) {
        (
            self.meta.clock_start.monotonic_ns as i64,
            self.meta.clock_start.realtime_ns as i64,
        )
    }

    pub fn stamps(&self) -> PathBuf {
        RunDir::new(&self.dir).stamps()
    }

    /// Opens a run directory, saying what is wrong when it is not one.
    pub fn open(dir: &RunDir) -> Result<Run> {
        let shown = dir.path().display().to_string();
        let err = |what: String| AnalyzeError::Input {
            path: shown.clone(),
            what,
        };
        let meta = read_meta(&dir.meta()).map_err(|e| match e {
            AnalyzeError::Input { what, .. } => err(what),
            other => other,
        })?;
        if meta.state == RunState::Running {
            return Err(err(format!(
                "the run has not ended (run.json says running): it is still being recorded, or its recorder died; `xlap-trace recover {shown}` makes it whole once the recorder is gone"
            )));
        }
        let stamps = dir.stamps();
        if !stamps.exists() {
            return Err(err(
                "stamps.parquet is missing (the run did not end cleanly: stamps.arrows holds what was recorded)".into(),
            ));
        }
        stamps_whole(dir).map_err(err)?;
        xlap_records::schema::check_stamps_parquet(&stamps)
            .map_err(|why| err(format!("stamps.parquet: {why}")))?;
        Ok(Run {
            dir: dir.path().to_path_buf(),
            meta,
        })
    }
}

/// A run's `run.json`, refused unless it is JSON of a version we read
/// holding what the analyses need (`xlap_records::run_meta`: a missing
/// run id, host, boot id, start clock or layout is named, not read as
/// empty).
pub fn read_meta(path: &Path) -> Result<RunMeta> {
    let err = |what: String| AnalyzeError::Input {
        path: path.display().to_string(),
        what,
    };
    let text = xlap_records::run_file::read_json_text(path).map_err(|e| {
        let dir = path.parent().unwrap_or(Path::new("."));
        if RunDir::new(dir).segments().is_file() {
            err(format!(
                "a recording cut into segments (--rotate): each of {}/seg-* is a run of its own, segments.json lists them",
                dir.display()
            ))
        } else {
            err(format!("not an xlap-trace run directory (run.json: {e})"))
        }
    })?;
    RunMeta::from_json(&text).map_err(|e| err(e.to_string()))
}

/// Refuses a run whose stamps.parquet is cut short, saying how to get it
/// back.
pub(crate) fn stamps_whole(dir: &RunDir) -> std::result::Result<(), String> {
    whole_parquet(&dir.stamps()).map_err(|why| {
        let way_out = if dir.stamps_stream().is_file() {
            format!(
                "stamps.arrows remains: move stamps.parquet aside and `xlap-trace recover {}` rebuilds it",
                dir.path().display()
            )
        } else {
            "record the run again (no stamps.arrows remains to rebuild it from)".to_string()
        };
        format!("stamps.parquet is not a whole Parquet file ({why}); {way_out}")
    })
}

/// Whether `path` starts and ends with Parquet's magic: a file cut short
/// (a full disk, a copy interrupted) has lost its footer, and DuckDB's
/// error on it names neither the file's state nor a way out.
fn whole_parquet(path: &Path) -> std::result::Result<(), String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = xlap_records::run_file::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len < 12 {
        return Err(format!("{len} bytes"));
    }
    let mut head = [0u8; 4];
    let mut tail = [0u8; 4];
    f.read_exact(&mut head).map_err(|e| e.to_string())?;
    f.seek(SeekFrom::End(-4)).map_err(|e| e.to_string())?;
    f.read_exact(&mut tail).map_err(|e| e.to_string())?;
    match (&head, &tail) {
        (b"PAR1", b"PAR1") => Ok(()),
        (b"PAR1", _) => Err(format!("its end is missing: cut short at {len} bytes")),
        _ => Err("it does not start as Parquet does".to_string()),
    }
}
