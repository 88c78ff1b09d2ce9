//! Running a command as a child and measuring it: wall time and peak RSS
//! (from wait4's rusage, the kernel's own account of the child), with an
//! optional time limit and address-space (`RLIMIT_DATA`) limit, so that a
//! command that runs away ends as a row of the bench instead of taking the
//! machine down.

use anyhow::{bail, Context, Result};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// What one run of a command measured.
pub struct Measured {
    pub seconds: f64,
    /// The child's peak resident set (`ru_maxrss`), MiB.
    pub peak_rss_mib: f64,
    pub stdout: String,
    pub stderr: String,
    pub status: ExitStatus,
    /// Killed by the bench at [`Limits::timeout`].
    pub timed_out: bool,
}

/// Limits a measured child runs under (none by default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// Killed (the child's whole process group, SIGKILL) after this long.
    pub timeout: Option<Duration>,
    /// `RLIMIT_DATA` of the child, bytes: its private writable memory
    /// (heap and anonymous mappings, virtual, not resident); an allocation
    /// beyond it fails in the child.
    pub data_bytes: Option<u64>,
}

/// Runs a command to completion: wall time and the child's peak RSS. A
/// command that fails is an error (with its stderr).
pub fn measure(cmd: &mut Command) -> Result<Measured> {
    let m = measure_limited(cmd, Limits::default())?;
    if !m.status.success() {
        bail!("{cmd:?} failed ({}): {}", m.status, m.stderr);
    }
    Ok(m)
}

/// Runs a command under `limits`: whatever its end (success, failure, a
/// signal, killed at the timeout), what it measured. An error only when it
/// cannot be started or waited for.
pub fn measure_limited(cmd: &mut Command, limits: Limits) -> Result<Measured> {
    if let Some(bytes) = limits.data_bytes {
        let lim = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: bytes as libc::rlim_t,
        };
        // SAFETY: setrlimit is async-signal-safe; lim is a plain value
        // moved into the closure.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_DATA, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    // Its own process group: the timeout kills whatever it started too.
    cmd.process_group(0);
    let t0 = Instant::now();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id() as i32;
    let read_all = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut s);
            }
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out_thread = read_all(child.stdout.map(|p| Box::new(p) as _));
    let err_thread = read_all(child.stderr.map(|p| Box::new(p) as _));
    // The watchdog: waits for the end (the sender dropped) or the timeout.
    let (done, wait_done) = mpsc::channel::<()>();
    let timed_out = Arc::new(AtomicBool::new(false));
    let watchdog = limits.timeout.map(|timeout| {
        let timed_out = timed_out.clone();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = wait_done.recv_timeout(timeout) {
                timed_out.store(true, Ordering::SeqCst);
                // SAFETY: the child's group (not yet reaped: wait4 below
                // has not returned, or is about to with the kill's status).
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        })
    });
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter for wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = loop {
        // SAFETY: pid is our child; status and usage are valid pointers.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break r;
    };
    let seconds = t0.elapsed().as_secs_f64();
    drop(done);
    if let Some(w) = watchdog {
        let _ = w.join();
    }
    if r != pid {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    // A child of the killed group may still hold the pipes: kill it too.
    if timed_out.load(Ordering::SeqCst) {
        // SAFETY: the group of our (reaped) child; ESRCH when empty.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    Ok(Measured {
        seconds,
        peak_rss_mib: usage.ru_maxrss as f64 / 1024.0,
        stdout: out_thread.join().unwrap_or_default(),
        stderr: err_thread.join().unwrap_or_default(),
        status: ExitStatus::from_raw(status),
        timed_out: timed_out.load(Ordering::SeqCst),
    })
}

/// The median of `v` (the upper one of an even count); sorts `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_measured_and_a_runaway_one_is_killed_at_its_timeout() {
        let m = measure(Command::new("sh").args(["-c", "echo out; echo err >&2"])).unwrap();
        assert_eq!((m.stdout.as_str(), m.stderr.as_str()), ("out\n", "err\n"));
        assert!(m.peak_rss_mib > 0.0 && !m.timed_out);
        let m = measure_limited(
            Command::new("sleep").arg("30"),
            Limits {
                timeout: Some(Duration::from_millis(200)),
                data_bytes: None,
            },
        )
        .unwrap();
        assert!(m.timed_out && m.seconds < 10.0, "{}", m.seconds);
        assert_eq!(m.status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn an_allocation_beyond_the_data_limit_fails_in_the_child() {
        // 64 MiB of data limit; the shell's own allocation of 100 MB fails.
        let m = measure_limited(
            Command::new("sh").args([
                "-c",
                "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo ${#x}",
            ]),
            Limits {
                timeout: Some(Duration::from_secs(60)),
                data_bytes: Some(64 << 20),
            },
        )
        .unwrap();
        assert!(
            !m.status.success() || m.stdout.trim() != "100000000",
            "{}",
            m.stdout
        );
        assert!(m.peak_rss_mib < 100.0, "{}", m.peak_rss_mib);
    }
}
