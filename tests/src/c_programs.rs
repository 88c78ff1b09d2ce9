//! C programs of the repository built for a test (with the system's `cc`).

use crate::Scratch;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `examples/markers/c/udp_loop.c` (markers from the C header) into
/// the scratch directory.
pub fn udp_loop(scratch: &Scratch) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/markers/c");
    let exe = scratch.path("udp_loop");
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(&dir)
        .arg(dir.join("udp_loop.c"))
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("cc runs (./run.sh setup installs build-essential)");
    assert!(status.success(), "udp_loop.c does not build");
    exe
}

/// The `received SEQ TID` lines of a udp_loop log.
pub fn udp_loop_log(path: &Path) -> Vec<(u64, u32)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}
