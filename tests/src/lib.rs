//! Support for xlap-trace's integration tests: finding the workspace's
//! binaries, gating privileged tests, and running the example protocol on a
//! stage.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub mod browser;
pub mod c_programs;
pub mod example;
pub mod go_programs;
pub mod kernel_drops;
pub mod multiset;
pub mod packets_file;
pub mod pcap;
pub mod prometheus;
pub mod run_files;
pub mod run_limited;
pub mod trace;

/// The environment variable that lets a test skip what this machine cannot
/// run (not root, no BTF, no Chromium): without it such a test fails, so a
/// green run never hides a test that did not run. CI never sets it, and
/// sets `XLAP_REQUIRE_PRIVILEGED`, which refuses a skip even with it.
pub const ALLOW_SKIP: &str = "XLAP_ALLOW_SKIP";
pub const REQUIRE_PRIVILEGED: &str = "XLAP_REQUIRE_PRIVILEGED";

fn set(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| v != "0" && !v.is_empty())
}

/// The one check of every test that needs something this machine may not
/// have: `false` means skip (the reason printed), allowed only with
/// `XLAP_ALLOW_SKIP=1` and never under `XLAP_REQUIRE_PRIVILEGED=1`.
pub fn may_skip(test: &str, reason: &str) -> bool {
    if set(REQUIRE_PRIVILEGED) {
        panic!("{test} cannot run ({reason}) and {REQUIRE_PRIVILEGED} is set");
    }
    if !set(ALLOW_SKIP) {
        panic!("{test} cannot run here ({reason}); set {ALLOW_SKIP}=1 to skip what this machine cannot run");
    }
    eprintln!("SKIPPED {test}: {reason}");
    true
}

/// Why privileged tests cannot run here, if they cannot.
pub fn privileged_unavailable() -> Option<String> {
    if let Err(e) = xlap_stage::check_privileges() {
        return Some(e.to_string());
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("the kernel has no BTF (/sys/kernel/btf/vmlinux)".into());
    }
    None
}

/// Taken exclusively by each privileged test ([`privileged`]) and shared by
/// the unprivileged tests that run programs or DuckDB ([`unprivileged`]).
///
/// Privileged tests run one at a time: they share the kernel's probes, and
/// one of them sets `XLAP_KERNEL_AS` in this process for the recorder it
/// starts. All tests are one binary (`it`), so without the shared side an
/// analysis or a CLI run of another area could run beside a privileged
/// test on a 2-core machine, and the traced protocol's timing and the
/// recorder's losses would depend on what else the suite happens to be
/// doing (when each area was its own binary, Cargo ran them one after
/// another and only a file's own unprivileged tests could overlap). The
/// unprivileged tests still run beside each other.
static SERIAL: RwLock<()> = RwLock::new(());

/// Start of every privileged test: `None` means skip ([`may_skip`]). The
/// guard it returns keeps every other privileged test and every
/// [`unprivileged`] test waiting (`SERIAL`).
pub fn privileged(test: &str) -> Option<RwLockWriteGuard<'static, ()>> {
    if let Some(reason) = privileged_unavailable() {
        may_skip(test, &format!("{reason}; privileged tests need root"));
        return None;
    }
    // A failed privileged test poisons the lock; the next one still runs.
    Some(SERIAL.write().unwrap_or_else(|p| p.into_inner()))
}

/// Start of an unprivileged test that runs programs (the CLI, a compiler,
/// a browser) or DuckDB: the guard keeps privileged tests from running
/// beside it (`SERIAL`), not other unprivileged tests. Tests that only
/// read files or compute need none. Never held together with
/// [`privileged`]'s (a test waiting for both would wait forever).
pub fn unprivileged() -> RwLockReadGuard<'static, ()> {
    SERIAL.read().unwrap_or_else(|p| p.into_inner())
}

/// The workspace's build directory for this test binary's profile
/// (`target/<profile>`, the parent of `deps/`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    // Test binaries live in target/<profile>/deps, other binaries beside it.
    if dir.ends_with("deps") {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// `xlap-trace ARGS`, its output whatever its status.
pub fn xlap_trace<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    std::process::Command::new(bin("xlap-trace"))
        .args(args)
        .output()
        .expect("run xlap-trace")
}

/// `xlap-trace ARGS`, which must succeed (its stderr said if not).
pub fn xlap_trace_ok<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    let out = xlap_trace(args);
    assert!(
        out.status.success(),
        "xlap-trace {:?}: {}",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy())
            .collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Path of a workspace binary; they are built by `cargo build --workspace`
/// (the justfile's test recipe does so before `cargo test`). `cargo test`
/// alone rebuilds the libraries a test links but not the other packages'
/// binaries, so a binary older than one of its sources is refused: a test
/// never checks yesterday's tool.
pub fn bin(name: &str) -> PathBuf {
    static FRESH: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace` before the tests (just test does)",
        path.display()
    );
    let mut fresh = FRESH.lock().unwrap_or_else(|p| p.into_inner());
    if !fresh.iter().any(|n| n == name) {
        if let Some(source) = newer_source(&path) {
            panic!(
                "{} is older than its source {}: run `cargo build --workspace` before the tests (just test does)",
                path.display(),
                source.display()
            );
        }
        fresh.push(name.to_string());
    }
    path
}

/// A source file of the binary at `path` changed after it was built, by the
/// dep-info Cargo writes beside it (`NAME.d`: `NAME: SOURCE...`, spaces in
/// paths escaped).
fn newer_source(path: &Path) -> Option<PathBuf> {
    let dep_info = path.with_extension("d");
    let text = std::fs::read_to_string(&dep_info).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (Cargo writes it with the binary): run `cargo build --workspace`",
            dep_info.display()
        )
    });
    let built = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    dep_info_sources(text.lines().next().unwrap_or_default())
        .into_iter()
        .find(|s| {
            std::fs::metadata(s)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > built)
        })
}

/// The prerequisites of a Makefile-style rule `target: a b\ c`.
fn dep_info_sources(rule: &str) -> Vec<PathBuf> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = rule.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => word.push(chars.next().unwrap()),
            ' ' => words.push(std::mem::take(&mut word)),
            _ => word.push(c),
        }
    }
    words.push(word);
    // The first word is the target and its colon.
    words
        .into_iter()
        .skip(1)
        .filter(|w| !w.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// A fresh scratch directory under the target dir (or under
/// `XLAP_TEST_SCRATCH`: the kernel matrix's guests, which run side by side
/// with pids that repeat from one guest to the other), removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let root = std::env::var_os("XLAP_TEST_SCRATCH")
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("test-scratch"));
        let dir = root.join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Kept after a failure, or on request (XLAP_KEEP_SCRATCH=1) to
        // look at a passing run's files.
        if !std::thread::panicking() && std::env::var_os("XLAP_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Reads a JSON-lines log.
pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: bad line {l:?}: {e}", path.display()))
        })
        .collect()
}

/// How long a test waits for the recorder to be ready, and the example's
/// programs for their start: 60 s, or `XLAP_TEST_START_SECS` (the kernel
/// matrix's guests run under QEMU's TCG on one host thread, where the
/// verifier alone takes over a minute for the recorder's programs).
pub fn start_secs() -> u64 {
    std::env::var("XLAP_TEST_START_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(60)
}

/// Waits for a file to appear, failing after `secs`.
pub fn wait_for_file(path: &Path, secs: u64) {
    let start = std::time::Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed().as_secs() < secs,
            "{} did not appear within {secs} s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A helper process (a peer such as iperf3) that must not outlive a failed
/// test.
/// Waits (up to 4 s) until `pid`'s network namespace lists a UDP socket
/// bound to `port` (`/proc/PID/net/udp`): a server its client can reach.
pub fn wait_for_udp_port(pid: u32, port: u16) {
    let bound = format!(":{port:04X} ");
    for _ in 0..200 {
        let udp = std::fs::read_to_string(format!("/proc/{pid}/net/udp")).unwrap_or_default();
        if udp.contains(&bound) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// CLOCK_MONOTONIC now, ns: the clock of the stamps and of the example's
/// log (`t_ns`, `t_start_ns`).
pub fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Bytes of every file under `dir` (subdirectories included), as a test
/// sees them on disk; nothing for a directory that went away meanwhile.
pub fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some(if m.is_dir() {
                bytes_under(&e.path())
            } else {
                m.len()
            })
        })
        .sum()
}

/// Whether two query outputs agree: the same rows, keys, types and text;
/// numbers up to the last rounded digit (the engine's threads add floating
/// sums in no fixed order, so two computations of the same table may
/// differ there).
pub fn json_agree(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x_float, y_float) = (x.is_f64(), y.is_f64());
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            x_float == y_float && (x - y).abs() <= 1e-3 + 1e-9 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_agree(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_agree(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dep_info_rules_give_their_sources() {
        assert_eq!(
            dep_info_sources("/t/xlap-trace: /w/a.rs /w/my\\ dir/b.rs  /w/c.rs"),
            ["/w/a.rs", "/w/my dir/b.rs", "/w/c.rs"].map(PathBuf::from)
        );
        assert!(dep_info_sources("/t/x:").is_empty());
    }

    #[test]
    fn a_binary_older_than_a_source_is_found() {
        let dir = std::env::temp_dir().join(format!("xlap-dep-info-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (bin, src) = (dir.join("tool"), dir.join("main.rs"));
        std::fs::write(&src, "fn main() {}").unwrap();
        std::fs::write(&bin, "built").unwrap();
        let rule = format!("{}: {}\n", bin.display(), src.display());
        std::fs::write(dir.join("tool.d"), rule).unwrap();
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        let set_mtime = |p: &Path, t| {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(t)
                .unwrap()
        };
        set_mtime(&src, past);
        assert_eq!(newer_source(&bin), None);
        set_mtime(&bin, past - std::time::Duration::from_secs(60));
        assert_eq!(newer_source(&bin), Some(src));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
