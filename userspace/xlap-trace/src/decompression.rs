//! A decompression failure under the memory ceiling. DuckDB's zstd
//! allocates with `malloc`, outside the engine's own memory limit, so an
//! allocation that fails there under the ceiling (`RLIMIT_DATA`) reads as
//! a damaged file ("ZSTD Decompression failure"). Which of the two it was
//! is told once, by decoding the inputs' Parquet files in Rust without the
//! ceiling.

use std::path::{Path, PathBuf};
use xlap_exit::memory;

/// What the check found.
pub enum Cause {
    /// Every input file decodes: the ceiling stopped the engine.
    Ceiling,
    /// This file does not decode (why).
    Damaged(PathBuf, String),
    /// No Parquet file to check among the inputs.
    Unknown,
}

/// Files looked at, at most: a dataset of many runs is checked in part.
const MAX_FILES: usize = 4096;
/// How deep a dataset's partitions go (`run_id=`/`recorder=`/file).
const MAX_DEPTH: usize = 4;

/// Whether an error is the engine's report of a page it could not
/// decompress.
pub fn is_failure(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.to_string()
            .to_ascii_lowercase()
            .contains("decompression failure")
    })
}

/// Decodes the Parquet files of `inputs` (files, run directories,
/// datasets) with the ceiling lifted.
pub fn cause(inputs: &[PathBuf]) -> Cause {
    memory::lift();
    let mut files = Vec::new();
    for input in inputs {
        parquet_files(input, 0, &mut files);
    }
    if files.is_empty() {
        return Cause::Unknown;
    }
    for file in files {
        if let Err(why) = xlap_records::parquet_check::decodes(&file) {
            return Cause::Damaged(file, why);
        }
    }
    Cause::Ceiling
}

/// The `.parquet` files at or under `path`; links are not followed (a run
/// directory from elsewhere may hold any).
fn parquet_files(path: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_file() && path.extension().is_some_and(|e| e == "parquet") {
        if out.len() < MAX_FILES {
            out.push(path.to_path_buf());
        }
    } else if meta.is_dir() && depth < MAX_DEPTH {
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        // A directory from elsewhere may hold any number of entries.
        let mut names: Vec<PathBuf> = entries
            .flatten()
            .take(MAX_FILES)
            .map(|e| e.path())
            .collect();
        names.sort();
        for name in names {
            if out.len() >= MAX_FILES {
                return;
            }
            parquet_files(&name, depth + 1, out);
        }
    }
}
