//! The cgroup v2 root, where the socket hooks attach (`cgroup_skb/ingress`
//! for the socket-queue point, `cgroup/sock_create` to follow new sockets).
//! Attached at the root, they see every socket of the machine, in every
//! network namespace; the BPF side filters by traced socket.

use anyhow::{Context, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// An open directory fd of the cgroup v2 root.
pub fn open_root() -> Result<File> {
    if let Some(mount) = cgroup2_mount() {
        return File::open(&mount)
            .with_context(|| format!("cannot open the cgroup2 root {}", mount.display()));
    }
    // No cgroup2 hierarchy mounted (a pure cgroup v1 system): mount one
    // privately for as long as it takes to open it; the root cgroup and
    // what is attached to it outlive the mount.
    let dir = std::env::temp_dir().join(format!("xlap-trace-cgroup2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mounted = mount_cgroup2(&dir);
    let opened = mounted
        .and_then(|()| File::open(&dir).with_context(|| format!("cannot open {}", dir.display())));
    // SAFETY: a NUL-terminated path; failure (not mounted) is harmless.
    unsafe {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
        libc::umount2(c.as_ptr(), libc::MNT_DETACH);
    }
    let _ = std::fs::remove_dir(&dir);
    opened
}

/// The first cgroup2 mount point in /proc/self/mountinfo.
pub(crate) fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(parse_mountinfo_cgroup2)
}

/// The mount point of a mountinfo line if its filesystem is cgroup2.
fn parse_mountinfo_cgroup2(line: &str) -> Option<PathBuf> {
    // id parent major:minor root mountpoint options [optional...] - fstype source super
    let (left, right) = line.split_once(" - ")?;
    if right.split_whitespace().next()? != "cgroup2" {
        return None;
    }
    let mount = left.split_whitespace().nth(4)?;
    Some(PathBuf::from(unescape_octal(mount)))
}

/// Mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mount_cgroup2(dir: &Path) -> Result<()> {
    let target = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    let fstype = c"cgroup2";
    // SAFETY: NUL-terminated strings that outlive the call; no data.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        anyhow::bail!(
            "no cgroup2 hierarchy is mounted and mounting one at {} failed: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_in_mountinfo_lines() {
        let hybrid = "35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate";
        let v1 = "36 25 0:31 / /sys/fs/cgroup/cpu rw shared:11 - cgroup cgroup rw,cpu";
        let escaped = "37 25 0:32 / /mnt/my\\040cg rw - cgroup2 none rw";
        assert_eq!(
            parse_mountinfo_cgroup2(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(parse_mountinfo_cgroup2(v1), None);
        assert_eq!(
            parse_mountinfo_cgroup2(escaped),
            Some(PathBuf::from("/mnt/my cg"))
        );
    }
}
