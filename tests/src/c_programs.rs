//! C programs of the repository built for a test (with the system's `cc`).

use crate::Scratch;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `examples/markers/c/udp_loop.c` (markers from the C header) into
/// the scratch directory.
pub fn udp_loop(scratch: &Scratch) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/markers/c");
    build(&dir.join("udp_loop.c"), &scratch.path("udp_loop"))
}

/// Builds `tests/c/hostile_target.c` (udp_loop that attacks its tracer's
/// marker ring) to `exe`.
pub fn hostile_target(exe: &Path) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
    build(&dir.join("hostile_target.c"), exe)
}

/// Builds `tests/c/mmsg_peer.c` (a sender and receiver on `sendmmsg` /
/// `recvmmsg`) to `exe`.
pub fn mmsg_peer(exe: &Path) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
    build(&dir.join("mmsg_peer.c"), exe)
}

/// Builds `tests/c/dlopen_peer.c` twice: the program, and the plugin with
/// its markers that the program loads with dlopen. Returns (program, plugin).
pub fn dlopen_peer(scratch: &Scratch) -> (PathBuf, PathBuf) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/dlopen_peer.c");
    let exe = build(&source, &scratch.path("dlopen_peer"));
    let plugin = build_with(
        &source,
        &scratch.path("libplugin.so"),
        &["-DPLUGIN", "-shared", "-fPIC"],
    );
    (exe, plugin)
}

fn build(source: &Path, exe: &Path) -> PathBuf {
    build_with(source, exe, &[])
}

fn build_with(source: &Path, exe: &Path, flags: &[&str]) -> PathBuf {
    let markers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/markers/c");
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-pthread"])
        .args(flags)
        .arg("-I")
        .arg(&markers)
        .arg(source)
        .arg("-o")
        .arg(exe)
        .status()
        .expect("cc runs (./run.sh setup installs build-essential)");
    assert!(status.success(), "{} does not build", source.display());
    exe.to_path_buf()
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
