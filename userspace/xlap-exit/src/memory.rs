//! The memory ceiling every `xlap-trace` command sets itself: a runaway
//! allocation ends the command with a message naming its step and exit
//! code 8, never the kernel's OOM killer taking the machine's memory first
//! (a report once grew to 24 GiB in 72 s on one unlucky run).
//!
//! The ceiling is the process's `RLIMIT_DATA` (its private writable
//! memory: heap and anonymous mappings, DuckDB's included; the ring
//! buffers the recorder maps shared are not in it): `XLAP_MAX_MEMORY`
//! (`6GB`, `512MiB`, ...; `off` for none), by default the engine's limit
//! (`XLAP_MEMORY_LIMIT`, DuckDB spills to disk beyond it) plus
//! [`DEFAULT_MARGIN`] for everything outside the engine, and never above
//! [`MAX_SHARE_OF_RAM`] of the machine's memory. Programs the command
//! starts (a `run` job, the demo's example protocol) get the limit they
//! had back ([`unbounded`]).
//!
//! An allocation that fails in Rust ends the process through [`Ceiling`],
//! the global allocator of the binaries: it writes one line naming the
//! [`step`] and exits 8. One that fails in DuckDB becomes its `Out of
//! Memory Error`, which the binary maps to the same exit code.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The variable that sets the ceiling.
pub const CEILING_VAR: &str = "XLAP_MAX_MEMORY";
/// The engine's own limit, which the default ceiling is sized from.
pub const ENGINE_VAR: &str = "XLAP_MEMORY_LIMIT";
/// The engine's default limit (xlap-analyze's `DEFAULT_MEMORY_LIMIT`).
pub const DEFAULT_ENGINE_LIMIT: &str = "4GB";
/// Memory beyond the engine's limit: the Arrow batches, the report's
/// tables and the recorder's buffers (measured peaks: docs/performance.md,
/// peak memory per command).
pub const DEFAULT_MARGIN: u64 = 2 << 30;
/// The default ceiling's share of the machine's memory, at most.
pub const MAX_SHARE_OF_RAM: f64 = 0.9;

/// What the command is doing, for the message of an allocation failure.
static STEP: Mutex<&str> = Mutex::new("starting");
/// The ceiling in force (0: none), and the limit the process had before.
static CEILING: AtomicU64 = AtomicU64::new(0);
static BEFORE_SOFT: AtomicU64 = AtomicU64::new(libc::RLIM_INFINITY);
static SET: AtomicBool = AtomicBool::new(false);

/// Names what the command does from now on (for the out-of-memory
/// message).
pub fn step(name: &'static str) {
    if let Ok(mut s) = STEP.lock() {
        *s = name;
    }
}

/// What the command is doing ([`step`]).
pub fn current_step() -> &'static str {
    STEP.lock().map_or("working", |s| *s)
}

/// A size in DuckDB's syntax (`4GB`, `512 MiB`, `1.5GB`, `2000000000`):
/// decimal units are powers of 1000, binary ones of 1024.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = number * factor;
    (bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// The machine's memory, from `/proc/meminfo`.
fn ram_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The ceiling the environment asks for: `Ok(None)` for none.
pub fn configured() -> Result<Option<u64>, String> {
    let ram = ram_bytes();
    match std::env::var(CEILING_VAR) {
        Ok(v) if matches!(v.trim(), "off" | "none" | "unlimited" | "0") => Ok(None),
        Ok(v) => parse_size(&v).map(Some).ok_or_else(|| {
            format!("{CEILING_VAR}={v} is not a size: give one as 6GB, 512MiB or 2000000000, or off for none")
        }),
        Err(_) => {
            let engine = std::env::var(ENGINE_VAR)
                .ok()
                .and_then(|v| parse_size(&v))
                .unwrap_or_else(|| parse_size(DEFAULT_ENGINE_LIMIT).expect("a size"));
            let wanted = engine.saturating_add(DEFAULT_MARGIN);
            Ok(Some(match ram {
                Some(ram) => wanted.min((ram as f64 * MAX_SHARE_OF_RAM) as u64),
                None => wanted,
            }))
        }
    }
}

extern "C" {
    /// terminate.cpp: an uncaught `std::bad_alloc` ends the process as
    /// [`out_of_memory`] does.
    fn xlap_exit_install_terminate();
}

/// Called by terminate.cpp for an uncaught `std::bad_alloc`.
#[no_mangle]
pub extern "C" fn xlap_exit_engine_out_of_memory() -> ! {
    out_of_memory(None)
}

/// Sets the ceiling ([`configured`]) as the process's `RLIMIT_DATA`, never
/// above a lower limit it already has, and makes an allocation failure in
/// the engine's C++ end the process as one in Rust does. Returns the
/// ceiling in force.
pub fn apply() -> Result<Option<u64>, String> {
    // SAFETY: sets a process-wide handler; called before any engine runs.
    unsafe { xlap_exit_install_terminate() };
    let Some(ceiling) = configured()? else {
        return Ok(None);
    };
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to a rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut lim) } != 0 {
        return Err(format!(
            "cannot read the memory limit: {}",
            std::io::Error::last_os_error()
        ));
    }
    let ceiling = ceiling.min(lim.rlim_cur).min(lim.rlim_max);
    if !SET.swap(true, Ordering::SeqCst) {
        BEFORE_SOFT.store(lim.rlim_cur, Ordering::SeqCst);
    }
    let new = libc::rlimit {
        rlim_cur: ceiling,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_DATA, &new) } != 0 {
        return Err(format!(
            "cannot set the memory ceiling {CEILING_VAR}={ceiling}: {}",
            std::io::Error::last_os_error()
        ));
    }
    CEILING.store(ceiling, Ordering::SeqCst);
    Ok(Some(ceiling))
}

/// The ceiling in force, if any.
pub fn ceiling() -> Option<u64> {
    Some(CEILING.load(Ordering::SeqCst)).filter(|c| *c != 0)
}

/// Gives the process back the limit it had before [`apply`]: for a check
/// that must tell whether the ceiling caused a failure.
pub fn lift() {
    if !SET.load(Ordering::SeqCst) {
        return;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers to a rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_DATA, &mut lim) == 0 {
            lim.rlim_cur = BEFORE_SOFT.load(Ordering::SeqCst).min(lim.rlim_max);
            if libc::setrlimit(libc::RLIMIT_DATA, &lim) == 0 {
                CEILING.store(0, Ordering::SeqCst);
            }
        }
    }
}

/// Gives a program this process starts the memory limit the process had
/// before [`apply`] (a traced job is not bounded by the tracer's ceiling).
pub fn unbounded(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    if !SET.load(Ordering::SeqCst) {
        return cmd;
    }
    let soft = BEFORE_SOFT.load(Ordering::SeqCst);
    // SAFETY: getrlimit and setrlimit are async-signal-safe, and the
    // closure allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_DATA, &mut lim) == 0 {
                lim.rlim_cur = soft.min(lim.rlim_max);
                libc::setrlimit(libc::RLIMIT_DATA, &lim);
            }
            Ok(())
        })
    }
}

/// Whether an error message is DuckDB's out-of-memory error.
pub fn is_engine_out_of_memory(message: &str) -> bool {
    message.contains("Out of Memory Error")
}

/// What to do when the ceiling was reached, for every message about it.
pub fn advice() -> String {
    format!(
        "raise {CEILING_VAR} (now {}) or {ENGINE_VAR} (the engine's part, spilled to TMPDIR beyond it), or analyse fewer packets (a kind, a shorter run); docs/usage.md#memory",
        ceiling().map_or("not set".to_string(), human)
    )
}

/// `5.7 GiB`, `300 MiB`.
pub fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// The global allocator of xlap-trace's binaries: the system's, ending the
/// process with exit code 8 and one line on stderr when an allocation
/// fails (instead of Rust's abort).
pub struct Ceiling;

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Ceiling {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if p.is_null() {
            out_of_memory(Some(layout.size()));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if p.is_null() {
            out_of_memory(Some(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if p.is_null() {
            out_of_memory(Some(new_size));
        }
        p
    }
}

/// A fixed buffer to format into where nothing may be allocated.
struct Line {
    bytes: [u8; 640],
    len: usize,
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes the message and exits 8, allocating nothing: `size` is the
/// allocation that failed in Rust, `None` one in the engine's C++.
fn out_of_memory(size: Option<usize>) -> ! {
    let step = STEP.try_lock().map_or("working", |s| *s);
    let mut line = Line {
        bytes: [0; 640],
        len: 0,
    };
    let ceiling = CEILING.load(Ordering::SeqCst);
    let _ = match size {
        Some(size) => write!(
            line,
            "xlap-trace: error: out of memory while {step}: an allocation of {size} bytes failed"
        ),
        None => write!(
            line,
            "xlap-trace: error: out of memory while {step}: an allocation in the engine failed"
        ),
    };
    if ceiling != 0 {
        let _ = write!(
            line,
            " at the memory ceiling of {ceiling} bytes ({CEILING_VAR}); raise it, or {ENGINE_VAR} for the engine, or analyse fewer packets (docs/usage.md#memory)"
        );
    }
    let _ = line.write_str("\n");
    // SAFETY: writing a buffer we own to stderr, then ending the process
    // without running anything else (no destructor may allocate now).
    unsafe {
        libc::write(2, line.bytes.as_ptr().cast(), line.len);
        libc::_exit(crate::Code::OutOfMemory as i32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_duckdb_writes_them() {
        assert_eq!(parse_size("4GB"), Some(4_000_000_000));
        assert_eq!(parse_size("512 MiB"), Some(512 << 20));
        assert_eq!(parse_size("1.5GB"), Some(1_500_000_000));
        assert_eq!(parse_size("2000000000"), Some(2_000_000_000));
        assert_eq!(parse_size("8gib"), Some(8 << 30));
        for bad in ["", "GB", "-1GB", "1e400GB", "4 furlongs", "0"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
