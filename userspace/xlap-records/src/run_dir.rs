//! The files of a run directory, named once: the recorder writes them, the
//! analyses, `recover`, the CI summary and the rotation read them, all
//! through this type.

use std::path::{Path, PathBuf};

/// The run's metadata, typed in [`crate::run_meta`].
pub const META: &str = "run.json";
/// The stamps as written while recording: an Arrow IPC stream, flushed per
/// batch, that survives a killed recorder (`recover` reads it).
pub const STAMPS_STREAM: &str = "stamps.arrows";
/// The stamps of an ended run (schema [`crate::schema::stamps`]).
pub const STAMPS: &str = "stamps.parquet";
/// One row per packet, correlated from the stamps of one or more runs.
pub const PACKETS: &str = "packets.parquet";
/// The per-kind statistics CI compares (`xlap-trace summary`).
pub const SUMMARY: &str = "summary.json";
/// The index of a rotated recording: a directory of segment runs.
pub const SEGMENTS: &str = "segments.json";

/// A run directory (or a rotated recording's directory of segments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunDir(PathBuf);

impl RunDir {
    pub fn new(dir: impl Into<PathBuf>) -> RunDir {
        RunDir(dir.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn meta(&self) -> PathBuf {
        self.0.join(META)
    }

    pub fn stamps_stream(&self) -> PathBuf {
        self.0.join(STAMPS_STREAM)
    }

    pub fn stamps(&self) -> PathBuf {
        self.0.join(STAMPS)
    }

    pub fn packets(&self) -> PathBuf {
        self.0.join(PACKETS)
    }

    pub fn summary(&self) -> PathBuf {
        self.0.join(SUMMARY)
    }

    pub fn segments(&self) -> PathBuf {
        self.0.join(SEGMENTS)
    }

    /// A recorded run (its run.json is there, whatever its state).
    pub fn is_run(&self) -> bool {
        self.meta().is_file()
    }

    /// A rotated recording: segments, each a run of its own.
    pub fn is_rotated(&self) -> bool {
        !self.is_run() && self.segments().is_file()
    }
}

impl AsRef<Path> for RunDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}
