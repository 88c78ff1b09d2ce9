//! A recorded run: its directory, `run.json` and `stamps.parquet`.

use crate::{AnalyzeError, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct Run {
    pub dir: PathBuf,
    pub run_id: String,
    pub host: String,
    /// Runs with equal boot ids share one monotonic clock.
    pub boot_id: String,
    /// Bytes of the protocol's sequence number (wrap-around span).
    pub seq_size: u8,
    /// Bytes of the sequence number of datagrams to or from these ports
    /// (`--layout PORT=...`), where it differs from the default layout.
    pub port_seq_sizes: Vec<(u16, u8)>,
    /// (monotonic, realtime) ns of the run's first clock pair.
    pub clock_pair: (i64, i64),
    pub meta: serde_json::Value,
}

impl Run {
    pub fn stamps(&self) -> PathBuf {
        self.dir.join("stamps.parquet")
    }

    /// Opens a run directory, saying what is wrong when it is not one.
    pub fn open(dir: &Path) -> Result<Run> {
        let shown = dir.display().to_string();
        let err = |what: String| AnalyzeError::Input {
            path: shown.clone(),
            what,
        };
        let meta = read_meta(&dir.join("run.json")).map_err(|e| match e {
            AnalyzeError::Input { what, .. } => err(what),
            other => other,
        })?;
        if meta["state"] == "running" {
            return Err(err(format!(
                "the run has not ended (run.json says running): it is still being recorded, or its recorder died; `xlap-trace recover {shown}` makes it whole once the recorder is gone"
            )));
        }
        if !dir.join("stamps.parquet").exists() {
            return Err(err(
                "stamps.parquet is missing (the run did not end cleanly: stamps.arrows holds what was recorded)".into(),
            ));
        }
        let head = RunHead::deserialize(&meta).map_err(|e| {
            err(format!(
                "run.json lacks what the analyses need ({e}): it was not written by xlap-trace, or was edited"
            ))
        })?;
        Ok(Run {
            dir: dir.to_path_buf(),
            run_id: head.run_id,
            host: head.host,
            boot_id: head.boot_id,
            seq_size: head.options.layout.seq_size,
            port_seq_sizes: head
                .options
                .port_layouts
                .iter()
                .map(|l| (l.port, l.seq_size))
                .collect(),
            clock_pair: (head.clock_start.monotonic_ns, head.clock_start.realtime_ns),
            meta,
        })
    }
}

/// The part of `run.json` the analyses rely on, typed: a run.json without
/// one of these is refused, naming the field, rather than read as an empty
/// host or boot id (which would pair clocks that are not one) or a clock
/// at 0.
#[derive(Deserialize)]
struct RunHead {
    run_id: String,
    host: String,
    boot_id: String,
    clock_start: ClockStart,
    options: RunOptions,
}

#[derive(Deserialize)]
struct ClockStart {
    monotonic_ns: i64,
    realtime_ns: i64,
}

#[derive(Deserialize)]
struct RunOptions {
    layout: SeqLayout,
    #[serde(default)]
    port_layouts: Vec<PortSeqLayout>,
}

#[derive(Deserialize)]
struct SeqLayout {
    seq_size: u8,
}

#[derive(Deserialize)]
struct PortSeqLayout {
    port: u16,
    seq_size: u8,
}

/// The run (stamps) schema versions this analyser reads: xlap-records'
/// current one and those before it.
pub const READS_RUN_VERSIONS: &[&str] = &["1", "2"];

/// A run's `run.json`, refused unless it is JSON of the version we read.
pub fn read_meta(path: &Path) -> Result<serde_json::Value> {
    let err = |what: String| AnalyzeError::Input {
        path: path.display().to_string(),
        what,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        let dir = path.parent().unwrap_or(Path::new("."));
        if dir.join("segments.json").is_file() {
            err(format!(
                "a recording cut into segments (--rotate): each of {}/seg-* is a run of its own, segments.json lists them",
                dir.display()
            ))
        } else {
            err(format!("not an xlap-trace run directory (run.json: {e})"))
        }
    })?;
    let meta: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| err(format!("run.json is not valid JSON: {e}")))?;
    // Version 1 stamps lack the address and socket columns and have 8-bit
    // kinds; both still read.
    let version = meta["schema_version"].as_str().unwrap_or("?");
    if !READS_RUN_VERSIONS.contains(&version) {
        return Err(err(format!(
            "run.json has schema version {version}; this xlap-trace reads versions {} (use a matching xlap-trace)",
            READS_RUN_VERSIONS.join(", ")
        )));
    }
    Ok(meta)
}
