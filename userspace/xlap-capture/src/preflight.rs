//! Checks before loading BPF, each failing with what is missing and what to do.

use anyhow::Result;
use std::path::Path;
use xlap_exit::{failure, Code};

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
/// docs/stamp-points.md lists what each feature needs beyond it).
pub const MIN_KERNEL: (u32, u32) = (5, 17);

/// (major, minor) of a kernel release string (`6.18.44-fc-v657`).
pub fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// `XLAP_KERNEL_AS=MAJOR.MINOR`: a run behaves as on that (older) kernel
/// wherever the tool tells kernels apart by version: what it lacks is left
/// out, said at start and listed in run.json, by the same code that runs
/// there. The degraded paths are tested so on a newer kernel
/// (`tests/it/kernel_features.rs`). Unset or unreadable: `None`
/// ([`check_kernel`] refuses an unreadable value).
pub fn kernel_as() -> Option<(u32, u32)> {
    release_version(&std::env::var("XLAP_KERNEL_AS").ok()?)
}

/// Refuses a kernel older than [`MIN_KERNEL`] (or an `XLAP_KERNEL_AS`
/// that is), naming both.
pub fn check_kernel() -> Result<()> {
    if let Some(value) = std::env::var_os("XLAP_KERNEL_AS") {
        let value = value.to_string_lossy();
        let Some(v) = release_version(&value) else {
            return Err(failure(
                Code::Usage,
                format!(
                    "XLAP_KERNEL_AS={value:?} is not a kernel version: use MAJOR.MINOR, e.g. 6.1"
                ),
            ));
        };
        if v < MIN_KERNEL {
            return Err(failure(
                Code::Kernel,
                format!(
                    "XLAP_KERNEL_AS={value}: xlap-trace's capture needs Linux {}.{} or later (bpf_loop)",
                    MIN_KERNEL.0, MIN_KERNEL.1
                ),
            ));
        }
    }
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
