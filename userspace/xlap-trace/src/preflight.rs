//! Checks before loading BPF, each failing with what is missing and what to do.

use crate::exit::{failure, Code};
use anyhow::Result;
use std::path::Path;

/// The capabilities of a recording (`capabilities::NEEDS`): a missing
/// required one is an error naming it (unless `unchecked`); the needs not
/// met are returned.
pub fn check_privileges(unchecked: bool) -> Result<Vec<crate::capabilities::Need>> {
    crate::capabilities::check(unchecked)
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

/// The oldest kernel the capture loads on (`bpf_loop`: Linux 5.17; the
/// README lists what each feature needs beyond it).
pub const MIN_KERNEL: (u32, u32) = (5, 17);

/// (major, minor) of a kernel release string (`6.18.44-fc-v657`).
fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Refuses a kernel older than [`MIN_KERNEL`], naming both.
pub fn check_kernel() -> Result<()> {
    let release = crate::runmeta::kernel_release();
    match release_version(&release) {
        Some(v) if v < MIN_KERNEL => Err(failure(
            Code::Kernel,
            format!(
                "this kernel is Linux {release}; xlap-trace's capture needs Linux {}.{} or later (bpf_loop), and 6.12+ for datagrams in page fragments and the sock.queue point",
                MIN_KERNEL.0, MIN_KERNEL.1
            ),
        )),
        _ => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_releases_parse_to_major_minor() {
        assert_eq!(super::release_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(super::release_version("6.1.0-28-amd64"), Some((6, 1)));
        assert_eq!(super::release_version("5.4"), Some((5, 4)));
        assert_eq!(super::release_version("garbage"), None);
        assert!(super::release_version("5.15.0").unwrap() < super::MIN_KERNEL);
        assert!(super::release_version("6.1.0").unwrap() >= super::MIN_KERNEL);
    }
}
