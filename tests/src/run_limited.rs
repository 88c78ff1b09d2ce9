//! A child process under a memory and a time budget: what a test runs when
//! the program under test may loop or allocate without end (issue 48:
//! `report` took 24 GiB and never finished), so that a failure is a failed
//! test naming the command, not a machine out of memory or a suite that
//! never ends.
//!
//! The memory budget is `RLIMIT_DATA` (the heap and every private writable
//! mapping, which is what an allocation loop grows). `RLIMIT_AS` would
//! also count address space reserved and never written (each malloc arena
//! of a DuckDB thread reserves 64 MiB up front, as `PROT_NONE`), so a budget
//! near what a command really uses would fail it for memory it never took.
//! It is the limit xlap-trace sets itself (`XLAP_MAX_MEMORY`) as well.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// `RLIMIT_DATA`, bytes.
    pub data_bytes: u64,
    /// Killed (SIGKILL) after this long.
    pub timeout: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            data_bytes: 1536 << 20,
            timeout: Duration::from_secs(60),
        }
    }
}

/// What a command under a [`Budget`] did.
#[derive(Debug)]
pub struct Limited {
    /// The command line, for messages.
    pub command: String,
    pub status: ExitStatus,
    /// Killed at the budget's timeout.
    pub timed_out: bool,
    pub elapsed: Duration,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Limited {
    /// The exit code; `None` when a signal ended it.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// The command, how it ended and its stderr (its tail when long): what
    /// a failed check says.
    pub fn describe(&self) -> String {
        let how = if self.timed_out {
            format!(
                "killed after the {:.0} s budget",
                self.elapsed.as_secs_f64()
            )
        } else if let Some(code) = self.status.code() {
            format!("exit {code} after {:.1} s", self.elapsed.as_secs_f64())
        } else {
            format!(
                "killed by signal {} after {:.1} s",
                self.status.signal().unwrap_or(0),
                self.elapsed.as_secs_f64()
            )
        };
        let err = self.stderr_text();
        let tail = if err.len() > 4000 {
            let mut cut = err.len() - 4000;
            while !err.is_char_boundary(cut) {
                cut += 1;
            }
            format!("...{}", &err[cut..])
        } else {
            err
        };
        format!("`{}`: {how}; stderr:\n{tail}", self.command)
    }
}

/// Runs `cmd` (its stdin closed) within `budget`, its output collected.
pub fn run_limited(cmd: &mut Command, budget: Budget) -> Limited {
    let command = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let data = budget.data_bytes as libc::rlim_t;
    // SAFETY: only async-signal-safe calls (setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let set = |resource, value| {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                if libc::setrlimit(resource, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            set(libc::RLIMIT_DATA, data)?;
            // A program that aborts out of memory leaves no core behind.
            set(libc::RLIMIT_CORE, 0)
        });
    }
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command}: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if start.elapsed() >= budget.timeout {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait for the killed child");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = start.elapsed();
    Limited {
        command,
        status,
        timed_out,
        elapsed,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}
