//! Paths inside a traced process's root (`/proc/PID/root/...`), walked the
//! way the process would walk them: a symlink it planted, absolute ones
//! included, resolves inside its root, never against the recorder's, and
//! no `/proc` magic link is followed on the way (docs/threat-model.md).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `struct open_how` of openat2(2) (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The root directory of `pid`, held open (`O_PATH`).
pub fn open_root(pid: u32) -> std::io::Result<OwnedFd> {
    open_dir(&format!("/proc/{pid}/root"))
}

/// A directory of ours, held open (`O_PATH`): a handle for `*at` calls.
pub fn open_dir(path: &str) -> std::io::Result<OwnedFd> {
    let c = CString::new(path)?;
    // SAFETY: open of a NUL-terminated path; the fd is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` (absolute as the process sees it, or relative) below
/// `root` with `flags`, resolved as if `root` were `/`.
pub fn open_in_root(root: &OwnedFd, path: &str, flags: i32) -> std::io::Result<OwnedFd> {
    let rel = CString::new(path.trim_start_matches('/'))?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 with a NUL-terminated path and an open_how of its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            rel.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An absolute symlink below a root resolves inside that root.
    #[test]
    fn absolute_links_stay_inside_the_root() {
        let dir = std::env::temp_dir().join(format!("xlap-proc-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::write(dir.join("etc/hostname"), "inside").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("link")).unwrap();
        let root = open_dir(dir.to_str().unwrap()).unwrap();
        let fd = open_in_root(&root, "/link", libc::O_RDONLY).unwrap();
        let text = std::fs::read_to_string(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(text, "inside");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
