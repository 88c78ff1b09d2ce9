//! Exporting every CPU's batch of stamps on a timer (`bpf/hooks/flush.h`):
//! the BPF program is never attached; it is run on each CPU in turn with
//! `BPF_PROG_TEST_RUN` and `BPF_F_TEST_RUN_ON_CPU` (Linux 5.10+), so a batch
//! waits at most `XLAP_FLUSH_INTERVAL_MS` for the reader, even on a CPU that
//! never goes idle, and a recorder that dies loses at most that much of it.

use aya::programs::RawTracePoint;
use aya::Ebpf;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

pub const PROGRAM: &str = "on_flush_timer";

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_F_TEST_RUN_ON_CPU: u32 = 1;

/// The `test` member of the kernel's `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// The loaded exporter and the CPUs to run it on.
pub struct BatchExport {
    program: OwnedFd,
    cpus: Vec<u32>,
    /// Runs the kernel refused (a CPU gone offline): counted, not fatal.
    pub failed_runs: u64,
}

impl BatchExport {
    /// Loads the exporter program of the capture object; the reason when
    /// it cannot be (the run goes on with batches exported by the stamps
    /// that follow and by idle CPUs only).
    pub fn load(bpf: &mut Ebpf) -> Result<BatchExport, String> {
        let program: &mut RawTracePoint = bpf
            .program_mut(PROGRAM)
            .ok_or_else(|| format!("{PROGRAM} is missing from the capture object"))?
            .try_into()
            .map_err(|e| format!("{PROGRAM}: {e}"))?;
        program.load().map_err(|e| format!("{PROGRAM}: {e}"))?;
        let program = program
            .fd()
            .map_err(|e| e.to_string())?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| e.to_string())?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| format!("{what}: {e}"))?;
        let export = BatchExport {
            program,
            cpus,
            failed_runs: 0,
        };
        // One run up front: a kernel without test runs on a CPU says so
        // here, not every 100 ms.
        if let Some(&cpu) = export.cpus.first() {
            run_on_cpu(&export.program, cpu).map_err(|e| {
                format!("cannot run a BPF program on a CPU (BPF_PROG_TEST_RUN, Linux 5.10+): {e}")
            })?;
        }
        Ok(export)
    }

    /// Exports the batch of every CPU `waiting` says holds stamps.
    pub fn run(&mut self, waiting: impl Fn(u32) -> bool) {
        for &cpu in self.cpus.iter().filter(|&&cpu| waiting(cpu)) {
            if run_on_cpu(&self.program, cpu).is_err() {
                self.failed_runs += 1;
            }
        }
    }
}

fn run_on_cpu(program: &OwnedFd, cpu: u32) -> std::io::Result<()> {
    let mut attr = TestRunAttr {
        prog_fd: program.as_raw_fd() as u32,
        flags: BPF_F_TEST_RUN_ON_CPU,
        cpu,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid, zero-padded bpf_attr prefix of the size
    // passed; the kernel only reads it and writes retval/duration back.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestRunAttr,
            std::mem::size_of::<TestRunAttr>() as u32,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
