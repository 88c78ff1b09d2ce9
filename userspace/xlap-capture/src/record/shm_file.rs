//! Files the recorder places in a traced process's `/dev/shm` (its marker
//! rings), made so that the process gets nothing it could not have made
//! itself (docs/threat-model.md).
//!
//! - The directory is reached through `/proc/PID/root` inside the process's
//!   root ([`crate::proc_root`]).
//! - The file is created with the process's credentials (fsuid, fsgid and
//!   groups, set in a thread of its own: credentials are per thread), so a
//!   directory the process cannot write (a host directory it bind-mounted
//!   over its `/dev/shm` in a user namespace) refuses it, and it is the
//!   process's own file from the start (no chown of anything).
//! - `O_CREAT | O_EXCL | O_NOFOLLOW` relative to the held directory, under
//!   a name with 64 random bits: a symlink or file planted at a guessed
//!   name is never followed, truncated or taken over.
//! - Rings a dead recorder left (`kill -9`) are removed by the next
//!   recording that opens the directory and by `xlap-trace recover`.

use anyhow::{bail, Context, Result};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The start of every ring file's name: `xlap-trace.<recorder pid>.<hex>`.
const PREFIX: &str = "xlap-trace.";

/// The credentials a process creates files with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The file-system credentials of `pid` (`/proc/PID/status`: fsuid, fsgid
/// and supplementary groups, as this pid namespace's user namespace sees
/// them).
pub fn creds_of(pid: u32) -> Result<Creds> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read the credentials of pid {pid}"))?;
    parse_creds(&status).with_context(|| format!("pid {pid}: no Uid/Gid lines in its status"))
}

fn parse_creds(status: &str) -> Option<Creds> {
    let ids = |name: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(name))?;
        line.split_whitespace().map(|v| v.parse().ok()).collect()
    };
    // Real, effective, saved, file system: files are created as the last.
    let uid = *ids("Uid:")?.get(3)?;
    let gid = *ids("Gid:")?.get(3)?;
    Some(Creds {
        uid,
        gid,
        groups: ids("Groups:").unwrap_or_default(),
    })
}

/// Runs `f` in a thread whose file-system credentials are `creds` (and
/// whose other capabilities are those of the caller). Refused when the
/// switch does not take (no CAP_SETUID / CAP_SETGID) and `creds` are not
/// already ours.
pub fn as_creds<T: Send>(creds: &Creds, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                switch_to(creds)?;
                f()
            })
            .join()
            .unwrap_or_else(|_| bail!("the thread creating the marker ring panicked"))
    })
}

fn switch_to(creds: &Creds) -> Result<()> {
    let groups: Vec<libc::gid_t> = creds.groups.clone();
    // Raw system calls: they change this thread only (glibc's wrappers
    // would change every thread of the recorder).
    // SAFETY: setgroups with a count and a pointer to that many gids.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    // SAFETY: set/query of this thread's fs ids (-1 only queries).
    let (gid, uid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, creds.gid);
        libc::syscall(libc::SYS_setfsuid, creds.uid);
        (
            libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32,
            libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32,
        )
    };
    if (uid, gid) != (creds.uid, creds.gid) {
        bail!(
            "cannot take the file credentials of uid {} gid {} to create it as the process would (needs CAP_SETUID and CAP_SETGID)",
            creds.uid,
            creds.gid
        );
    }
    // Without CAP_SETGID the groups stay the recorder's: only refuse when
    // they could grant more than the process's own.
    if r != 0 && !own_groups_within(&creds.groups) {
        bail!(
            "cannot take the groups of uid {} (needs CAP_SETGID)",
            creds.uid
        );
    }
    Ok(())
}

fn own_groups_within(allowed: &[u32]) -> bool {
    // SAFETY: getgroups with a buffer of its size.
    let mut buf = vec![0 as libc::gid_t; 256];
    let n = unsafe { libc::getgroups(buf.len() as i32, buf.as_mut_ptr()) };
    n >= 0 && buf[..n as usize].iter().all(|g| allowed.contains(g))
}

/// `/dev/shm` as `pid` sees it, resolved inside its root, held open
/// (`O_PATH`): later calls work relative to it, even after the process
/// (and so its `/proc/PID/root`) is gone.
pub fn open_shm_dir(pid: u32) -> Result<OwnedFd> {
    let root = crate::proc_root::open_root(pid)
        .with_context(|| format!("cannot open the root of pid {pid}"))?;
    crate::proc_root::open_in_root(&root, "/dev/shm", libc::O_PATH | libc::O_DIRECTORY)
        .with_context(|| format!("cannot open /dev/shm of pid {pid} inside its root"))
}

/// A fresh ring name of this recorder: 64 random bits make it unguessable.
pub fn ring_name() -> Result<String> {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom into a local buffer of its size.
    let n = unsafe { libc::syscall(libc::SYS_getrandom, bytes.as_mut_ptr(), bytes.len(), 0) };
    if n != bytes.len() as i64 {
        return Err(std::io::Error::last_os_error()).context("no random bytes for the ring name");
    }
    Ok(format!(
        "{PREFIX}{}.{:016x}",
        std::process::id(),
        u64::from_ne_bytes(bytes)
    ))
}

/// Creates `leaf` in `dir`, never following or reusing what is there, as
/// the caller's thread's credentials allow, sized `len`; checks it is the
/// regular file just made.
pub fn create_exclusive(dir: &OwnedFd, leaf: &CStr, len: u64) -> Result<std::fs::File> {
    // SAFETY: openat relative to our directory fd, NUL-terminated leaf.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            leaf.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot create {} there", leaf.to_string_lossy()));
    }
    // SAFETY: a fresh fd of ours.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || std::os::unix::fs::MetadataExt::nlink(&meta) != 1 {
        bail!("{} is not the new regular file", leaf.to_string_lossy());
    }
    file.set_len(len)?;
    Ok(file)
}

/// Removes the rings of recorders that are gone from `dir` (a recorder
/// killed before its end leaves its ring files: memory on tmpfs). Names
/// only (`unlinkat` never follows a link); returns how many.
pub fn sweep_dead_rings(dir: &OwnedFd) -> usize {
    let Ok(names) = list(dir) else {
        return 0;
    };
    names
        .iter()
        .filter(|n| ring_of_dead_recorder(n))
        .filter(|n| {
            let Ok(c) = CString::new(n.as_str()) else {
                return false;
            };
            // SAFETY: unlinkat on our directory fd and a NUL-terminated name.
            unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) == 0 }
        })
        .count()
}

/// Removes `leaf` from `dir` (the end of a ring).
pub fn remove(dir: &OwnedFd, leaf: &CStr) {
    // SAFETY: unlinkat on our directory fd and a NUL-terminated name.
    unsafe { libc::unlinkat(dir.as_raw_fd(), leaf.as_ptr(), 0) };
}

fn list(dir: &OwnedFd) -> std::io::Result<Vec<String>> {
    // The O_PATH fd cannot be read: the directory itself, reopened.
    let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
    Ok(std::fs::read_dir(path)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(PREFIX))
        .collect())
}

/// `xlap-trace.<pid>.<16 hex>` whose pid is no running xlap-trace.
fn ring_of_dead_recorder(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return false;
    };
    let Some((pid, hex)) = rest.split_once('.') else {
        return false;
    };
    let (Ok(pid), true) = (
        pid.parse::<u32>(),
        hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
    ) else {
        return false;
    };
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    comm.trim_end() != "xlap-trace"
}

/// Removes the rings dead recorders left in this process's `/dev/shm` and
/// in those of `pids` still running (what `recover` does after a crash).
pub fn sweep_after_crash(pids: &[u32]) -> usize {
    let mut removed = crate::proc_root::open_dir("/dev/shm")
        .map(|d| sweep_dead_rings(&d))
        .unwrap_or(0);
    for &pid in pids {
        // In a process's directory, only what the process could remove.
        if let (Ok(dir), Ok(creds)) = (open_shm_dir(pid), creds_of(pid)) {
            removed += as_creds(&creds, || Ok(sweep_dead_rings(&dir))).unwrap_or(0);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_the_file_system_ids() {
        let status = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t2000\t2001\t2002\t2003\nGroups:\t4 24 \n";
        assert_eq!(
            parse_creds(status),
            Some(Creds {
                uid: 1003,
                gid: 2003,
                groups: vec![4, 24]
            })
        );
        assert_eq!(parse_creds("Uid:\t1\n"), None);
    }

    #[test]
    fn only_well_formed_names_of_dead_recorders_are_swept() {
        let own = format!("{PREFIX}{}.0123456789abcdef", std::process::id());
        // This test process is not named xlap-trace: it counts as dead.
        assert!(ring_of_dead_recorder(&own));
        assert!(!ring_of_dead_recorder("xlap-trace.12.short"));
        assert!(!ring_of_dead_recorder("xlap-trace.x.0123456789abcdef"));
        assert!(!ring_of_dead_recorder("other.12.0123456789abcdef"));
        assert!(!ring_of_dead_recorder("xlap-trace.12.0123456789abcdef/x"));
        let name = ring_name().unwrap();
        assert!(name.len() < xlap_marker::ring::PATH_BYTES - "/dev/shm/".len());
        assert_ne!(name, ring_name().unwrap());
    }

    /// A symlink at the name is refused, and what it points at untouched.
    #[test]
    fn a_planted_link_is_never_followed() {
        let dir = std::env::temp_dir().join(format!("xlap-shm-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("ring")).unwrap();
        let fd = crate::proc_root::open_dir(dir.to_str().unwrap()).unwrap();
        let leaf = CString::new("ring").unwrap();
        assert!(create_exclusive(&fd, &leaf, 4096).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
