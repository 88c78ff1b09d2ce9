//! Checks before loading BPF, each failing with what is missing and what to do.

use crate::exit::{failure, Code};
use anyhow::Result;
use std::path::Path;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capabilities of this process, from /proc/self/status.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Loading tracing BPF needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN).
pub fn check_privileges() -> Result<()> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    Err(failure(
        Code::Privileges,
        "loading BPF programs needs root (or CAP_BPF + CAP_PERFMON): run with sudo",
    ))
}

/// tp_btf programs and CO-RE need the kernel's BTF.
pub fn check_btf() -> Result<()> {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Ok(());
    }
    Err(failure(
        Code::Kernel,
        "this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing): xlap-trace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y",
    ))
}

/// Every pid must name a running process.
pub fn check_pids(pids: &[u32]) -> Result<()> {
    for pid in pids {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(failure(
                Code::NoSuchProcess,
                format!("no process with pid {pid}: check the pid (pgrep NAME) and that it is still running"),
            ));
        }
    }
    Ok(())
}
