//! `xlap-trace run -- CMD`: a command this process starts, traced from
//! before its first instruction.
//!
//! The command is started under `PTRACE_TRACEME`, so the kernel stops it
//! right after its `execve`, with its own binary mapped (its markers can be
//! found) and nothing run yet. The probes are attached to it there, then it
//! is released (`PTRACE_DETACH`) and traced like a `--pid` target until it
//! and the processes it started have exited. A thread waits for it, so its
//! exit is seen at once and its status is what `run` exits with.

use super::session::{Plan, Session};
use super::RecordOptions;
use crate::runmeta::RunMeta;
use anyhow::{Context, Result};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use xlap_exit::{failure, Code};

/// The command, stopped after its exec.
struct Stopped {
    pid: u32,
}

impl Stopped {
    fn start(command: &[String]) -> Result<Stopped> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| failure(Code::Usage, "give the command to run after --"))?;
        let mut cmd = std::process::Command::new(program);
        cmd.args(args);
        // The job has the memory limit it would have had untraced.
        xlap_exit::memory::unbounded(&mut cmd);
        // SAFETY: ptrace(PTRACE_TRACEME) is async-signal-safe and touches
        // no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            failure(
                Code::Usage,
                format!("cannot start {program}: {e} (is it on PATH and executable?)"),
            )
        })?;
        let pid = child.id();
        // The exec stop (SIGTRAP). std's Child is not used to wait: the
        // waiter thread reaps the process by pid.
        let mut status = 0;
        // SAFETY: waitpid on our own child into a local.
        let got = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        if got != pid as i32 || !libc::WIFSTOPPED(status) {
            anyhow::bail!("{program} did not stop after its exec (status {status:#x})");
        }
        Ok(Stopped { pid })
    }

    /// Lets the command run (no longer traced by ptrace).
    fn release(self) -> Result<Waiter> {
        // SAFETY: detaching our own stopped tracee, signal 0.
        if unsafe { libc::ptrace(libc::PTRACE_DETACH, self.pid as i32, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error()).context("cannot release the command");
        }
        Ok(Waiter::start(self.pid))
    }

    /// Ends a command that never ran (the tracer could not attach).
    fn abandon(self) {
        // SAFETY: our own child, by pid; then reaped.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
            libc::ptrace(libc::PTRACE_DETACH, self.pid as i32, 0, 0);
            let mut status = 0;
            libc::waitpid(self.pid as i32, &mut status, 0);
        }
    }
}

/// Reaps the command as soon as it exits.
struct Waiter {
    pid: u32,
    done: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<ExitStatus>,
}

impl Waiter {
    fn start(pid: u32) -> Waiter {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            // Waiting for our own child needs no capability.
            let _ = crate::capabilities::keep_only(&[]);
            let mut status = 0;
            loop {
                // SAFETY: waitpid on our own child into a local.
                let got = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
                if got == pid as i32
                    || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    break;
                }
            }
            flag.store(true, Ordering::Relaxed);
            ExitStatus::from_raw(status)
        });
        Waiter { pid, done, thread }
    }

    /// Asks a command still running to end (the run was stopped by a
    /// signal), then waits for it.
    fn finish(self) -> ExitStatus {
        if !self.done.load(Ordering::Relaxed) {
            // SAFETY: our own child, by pid.
            unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        }
        self.thread
            .join()
            .unwrap_or_else(|_| ExitStatus::from_raw(1 << 8))
    }
}

/// Runs `command` traced with `args` (whose targets must be empty); returns
/// the run and the command's status.
pub fn run(args: &RecordOptions, command: &[String]) -> Result<(RunMeta, ExitStatus)> {
    if !args.targets.pids.is_empty() || !args.targets.cgroups.is_empty() {
        return Err(failure(
            Code::Usage,
            "run traces the command it starts: no --pid, --cgroup or --container (use `xlap-trace record` for running processes and cgroups)",
        ));
    }
    // Before the command starts: a tracer that cannot trace says so
    // without running it.
    crate::preflight::check_privileges(args.recorder.skip_capability_check)?;
    crate::preflight::check_btf()?;
    crate::preflight::check_kernel()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let stopped = Stopped::start(command)?;
    let mut args = args.clone();
    args.targets = super::options::Targets {
        pids: vec![stopped.pid],
        cgroups: Vec::new(),
        started_here: true,
    };
    let attached = Plan::new(&args).and_then(|plan| {
        let live = Session::load(&plan)?.attach(&plan)?;
        Ok((plan, live))
    });
    let (plan, mut live) = match attached {
        Ok(x) => x,
        Err(e) => {
            stopped.abandon();
            return Err(e);
        }
    };
    let waiter = stopped.release()?;
    let stop_reason = live.follow(&plan, &stop);
    let meta = stop_reason.and_then(|reason| live.detach()?.finish(&plan, reason));
    let status = waiter.finish();
    Ok((meta?, status))
}

/// `run`'s exit code: the command's (128 + the signal that ended it).
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        _ => 1,
    }
}
