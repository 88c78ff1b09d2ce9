//! `--iface NAME`: the devices device and qdisc points are restricted to,
//! looked up in the network namespace of every traced process.

use anyhow::Result;
use std::os::fd::AsRawFd;
use xlap_exit::{failure, Code};

/// (network namespace inode, ifindex) of each named device in each target's
/// namespace; a name found in none of them is an error.
pub fn resolve(pids: &[u32], names: &[String]) -> Result<Vec<(u32, u32)>> {
    let mut out = Vec::new();
    for name in names {
        let mut found = false;
        for &pid in pids {
            let Some(netns) = crate::targets::netns_inode(pid) else {
                continue;
            };
            if let Some(ifindex) = ifindex_in(pid, name)? {
                if !out.contains(&(netns, ifindex)) {
                    out.push((netns, ifindex));
                }
                found = true;
            }
        }
        if !found {
            return Err(failure(
                Code::Usage,
                format!("--iface {name}: no such device in the network namespace of any traced process (see `ip link` there)"),
            ));
        }
    }
    Ok(out)
}

/// The index of device `name` in the network namespace of `pid`: looked up
/// on a thread of our own that joins that namespace (setns affects only the
/// calling thread).
fn ifindex_in(pid: u32, name: &str) -> Result<Option<u32>> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    let cname = std::ffi::CString::new(name)
        .map_err(|_| failure(Code::Usage, format!("--iface {name:?}: not a device name")))?;
    let handle = std::thread::spawn(move || -> std::io::Result<u32> {
        // SAFETY: an fd we own, of a network namespace; only this thread
        // changes namespace, and it ends right after.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a NUL-terminated name.
        Ok(unsafe { libc::if_nametoindex(cname.as_ptr()) })
    });
    let index = handle
        .join()
        .map_err(|_| anyhow::anyhow!("device lookup thread panicked"))??;
    Ok((index != 0).then_some(index))
}
