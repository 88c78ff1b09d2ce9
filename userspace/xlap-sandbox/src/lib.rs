//! The confinement of a process that parses what a traced program or a run
//! directory from elsewhere controls (Parquet, JSON, names): the recorder's
//! post-processing and the analysis commands started as root. A bug in a
//! parser (DuckDB's C++ readers among them) then runs without privileges:
//!
//! - no capabilities: none effective, permitted, inheritable or ambient,
//!   none left in the bounding set, and securebits that keep an exec (even
//!   as uid 0) from granting any again;
//! - `no_new_privs`: no set-uid program raises them either;
//! - a Landlock ruleset: the process reads only the system's libraries and
//!   data, `/proc`, `/sys`, and the paths it was given to read; it writes
//!   only beneath the paths it was given to write. A symlink a run
//!   directory holds is followed by the kernel and judged by its target,
//!   so one that points outside is refused.
//!
//! Both are per thread in the kernel and inherited by the threads created
//! after: [`Policy::apply`] refuses to run once the process has a second
//! thread, so that none escapes.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What a confined process may touch, besides the system's read-only files.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    reads: Vec<PathBuf>,
    writes: Vec<PathBuf>,
    /// The uid and gid to run as from now on (where Landlock is missing:
    /// the files' owner keeps the process to what that user may touch).
    user: Option<(u32, u32)>,
}

/// How far the confinement went: said by the caller when it is partial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confined {
    /// The Landlock ABI the ruleset was built for, or why there is none
    /// (a kernel without Landlock, or without it among its LSMs).
    pub landlock: Result<u32, String>,
    /// The process had capabilities, and has none now.
    pub capabilities_dropped: bool,
    /// The uid the process switched to ([`Policy::as_user`]).
    pub user: Option<u32>,
}

impl Confined {
    /// One line for the user when the file confinement is missing, None
    /// when it is complete.
    pub fn shortfall(&self) -> Option<String> {
        let user = match self.user {
            Some(uid) => format!("it runs as uid {uid}, the owner of its files"),
            None => "it keeps its uid (its files belong to root or to several users)".into(),
        };
        self.landlock.as_ref().err().map(|why| {
            format!(
                "the analysis runs without capabilities but not confined to its files: {why}; {user}"
            )
        })
    }
}

/// The system's files a process reads to run at all (its libraries, time
/// zones, the name service's tables), read-only. Not `/etc` as a whole: a
/// root-owned secret there (`/etc/shadow`) is readable by uid 0 without
/// any capability.
const SYSTEM_READS: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/ssl",
    "/proc",
    "/sys",
    "/dev/urandom",
    "/dev/random",
];

/// Written by anything: the null device.
const SYSTEM_WRITES: &[&str] = &["/dev/null"];

impl Policy {
    pub fn new() -> Policy {
        Policy::default()
    }

    /// `path` (a file, or a directory and everything beneath it) may be read.
    pub fn read(mut self, path: impl Into<PathBuf>) -> Policy {
        self.reads.push(path.into());
        self
    }

    /// `path` (a file, or a directory and everything beneath it) may be
    /// read, written, created in and removed from.
    pub fn write(mut self, path: impl Into<PathBuf>) -> Policy {
        self.writes.push(path.into());
        self
    }

    /// Runs as `uid` and `gid` (no supplementary groups) from now on: for
    /// a kernel without Landlock, where the owner of the files a process
    /// works on is what keeps it from the rest ([`user_for`]).
    pub fn as_user(mut self, uid: u32, gid: u32) -> Policy {
        self.user = Some((uid, gid));
        self
    }

    /// Confines the calling process for the rest of its life (and its
    /// children's). Paths that do not exist are left out (nothing there can
    /// be read; a directory to write in must exist first). Errors when the
    /// process has more than one thread, or when a step the kernel offers
    /// fails; a kernel without Landlock is not an error
    /// ([`Confined::landlock`] says why).
    pub fn apply(&self) -> Result<Confined, String> {
        let threads = std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .map_err(|e| format!("cannot count this process's threads (/proc/self/task): {e}"))?;
        if threads != 1 {
            return Err(format!(
                "the confinement must come before any thread starts ({threads} threads): it would not reach the others"
            ));
        }
        // The uid first: it needs CAP_SETUID, and leaving uid 0 clears the
        // capabilities the dropping below then finds gone.
        let had_capabilities = caps::held()?;
        if let Some((uid, gid)) = self.user {
            switch_user(uid, gid)?;
        }
        let capabilities_dropped = caps::drop_all()? || (had_capabilities && self.user.is_some());
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(format!(
                "cannot set no_new_privs: {}",
                std::io::Error::last_os_error()
            ));
        }
        let landlock = match landlock::abi() {
            Ok(abi) => {
                self.restrict(abi)?;
                Ok(abi)
            }
            Err(why) => Err(why),
        };
        Ok(Confined {
            landlock,
            capabilities_dropped,
            user: self.user.map(|(uid, _)| uid),
        })
    }

    fn restrict(&self, abi: u32) -> Result<(), String> {
        let handled = landlock::handled(abi);
        let ruleset = landlock::Ruleset::new(handled)?;
        let read = landlock::READ & handled;
        let write = (landlock::READ | landlock::WRITE) & handled;
        let system = SYSTEM_READS.iter().map(|p| (Path::new(*p), read));
        let null = SYSTEM_WRITES.iter().map(|p| (Path::new(*p), write));
        let reads = self.reads.iter().map(|p| (p.as_path(), read));
        let writes = self.writes.iter().map(|p| (p.as_path(), write));
        for (path, access) in system.chain(null).chain(reads).chain(writes) {
            ruleset.allow(path, access)?;
        }
        ruleset.restrict_self()
    }
}

/// The kernel's Landlock ABI, or why there is none (the same answer
/// [`Policy::apply`] gets).
pub fn landlock_abi() -> Result<u32, String> {
    landlock::abi()
}

/// The user a confined process runs as where Landlock is missing: the one
/// non-root owner (uid, gid) of every path in `paths` (the directories it
/// works in), None when one of them belongs to root, their owners differ,
/// or one cannot be read. Root's own files keep uid 0: another uid could
/// not read them, and root gains nothing from running as itself.
pub fn user_for(paths: &[&Path]) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut owner = None;
    for path in paths {
        let meta = std::fs::metadata(path).ok()?;
        let this = (meta.uid(), meta.gid());
        if this.0 == 0 || owner.is_some_and(|o| o != this) {
            return None;
        }
        owner = Some(this);
    }
    owner
}

/// Leaves uid 0 for `uid`/`gid` for good (real, effective and saved ids),
/// without supplementary groups.
fn switch_user(uid: u32, gid: u32) -> Result<(), String> {
    let fail = |what: &str| format!("cannot {what}: {}", std::io::Error::last_os_error());
    // SAFETY: setgroups with no list; setresgid/setresuid take integers.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(fail("drop the supplementary groups"));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(fail(&format!("switch to gid {gid}")));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(fail(&format!("switch to uid {uid}")));
        }
    }
    Ok(())
}

/// Whether this process holds privileges a parser should not have: uid 0
/// (its files, `/etc/shadow` among them, are open to it by ownership even
/// without capabilities) or any capability.
pub fn privileged() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    root || caps::held().unwrap_or(true)
}

/// The capability calls (`capset`, `prctl`); constants from
/// `linux/capability.h` and `linux/securebits.h`.
mod caps {
    const VERSION_3: u32 = 0x2008_0522;
    const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
    const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
    const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
    const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }

    fn get() -> Result<[Data; 2], String> {
        let mut header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: capget writes two Data (version 3) into `data`.
        let r = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
        if r != 0 {
            return Err(format!(
                "cannot read this process's capabilities: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(data)
    }

    const CAP_SETPCAP: u32 = 8;

    /// Whether the process has any capability (effective, permitted or
    /// inheritable).
    pub fn held() -> Result<bool, String> {
        get().map(|d| any(&d))
    }

    fn any(data: &[Data; 2]) -> bool {
        data.iter()
            .any(|d| d.effective | d.permitted | d.inheritable != 0)
    }

    /// Drops every capability for good; true when there were any.
    pub fn drop_all() -> Result<bool, String> {
        let now = get()?;
        if !any(&now) {
            return Ok(false);
        }
        let fail = |what: &str| format!("cannot {what}: {}", std::io::Error::last_os_error());
        // Without CAP_SETPCAP (a recorder given only the capabilities it
        // needs) the bounding set and securebits stay as they are;
        // no_new_privs, set next, still keeps an exec from granting any
        // capability back (the kernel caps a new program's at the old,
        // now empty, set).
        if now[0].effective & (1 << CAP_SETPCAP) != 0 {
            lock_out()?;
        }
        let clear = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAP_AMBIENT, clear, 0, 0, 0) } != 0 {
            return Err(fail("clear the ambient capabilities"));
        }
        let mut header = Header {
            version: VERSION_3,
            pid: 0,
        };
        let none = [Data::default(); 2];
        // SAFETY: capset reads two Data (version 3) from `none`.
        if unsafe { libc::syscall(libc::SYS_capset, &mut header, none.as_ptr()) } != 0 {
            return Err(fail("drop the capabilities"));
        }
        if any(&get()?) {
            return Err("capabilities remain after capset".into());
        }
        Ok(true)
    }

    /// With CAP_SETPCAP, before the capabilities go: an exec as uid 0
    /// grants none and nothing can change that any more (securebits), and
    /// the bounding set is empty.
    fn lock_out() -> Result<(), String> {
        let fail = |what: &str| format!("cannot {what}: {}", std::io::Error::last_os_error());
        let bits = SECBIT_NOROOT
            | SECBIT_NOROOT_LOCKED
            | SECBIT_NO_SETUID_FIXUP
            | SECBIT_NO_SETUID_FIXUP_LOCKED
            | SECBIT_KEEP_CAPS_LOCKED
            | SECBIT_NO_CAP_AMBIENT_RAISE
            | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
        // SAFETY: prctl with integer arguments only (here and below).
        if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) } != 0 {
            return Err(fail("lock the securebits"));
        }
        let last: libc::c_ulong = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63);
        for cap in 0..=last {
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
                return Err(fail("empty the capability bounding set"));
            }
        }
        Ok(())
    }
}

/// The Landlock system calls and rights (`linux/landlock.h`).
mod landlock {
    use super::*;

    const CREATE_RULESET_VERSION: u32 = 1;
    const RULE_PATH_BENEATH: libc::c_int = 1;

    pub const EXECUTE: u64 = 1 << 0;
    pub const WRITE_FILE: u64 = 1 << 1;
    pub const READ_FILE: u64 = 1 << 2;
    pub const READ_DIR: u64 = 1 << 3;
    pub const REMOVE_DIR: u64 = 1 << 4;
    pub const REMOVE_FILE: u64 = 1 << 5;
    pub const MAKE_DIR: u64 = 1 << 7;
    pub const MAKE_REG: u64 = 1 << 8;
    pub const REFER: u64 = 1 << 13;
    pub const TRUNCATE: u64 = 1 << 14;
    pub const IOCTL_DEV: u64 = 1 << 15;
    /// What a path given to read allows.
    pub const READ: u64 = EXECUTE | READ_FILE | READ_DIR;
    /// What a path given to write adds: files and directories made,
    /// written, truncated, renamed and removed beneath it.
    pub const WRITE: u64 =
        WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | REFER | TRUNCATE;
    /// The rights a rule on a file (not a directory) may carry.
    const FILE: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;

    /// Every filesystem right of ABI `abi`: all of them are denied unless
    /// a rule allows them (the character and block devices, sockets,
    /// FIFOs and symlinks made, too).
    pub fn handled(abi: u32) -> u64 {
        let mut all = (1 << 13) - 1;
        if abi >= 2 {
            all |= REFER;
        }
        if abi >= 3 {
            all |= TRUNCATE;
        }
        if abi >= 5 {
            all |= IOCTL_DEV;
        }
        all
    }

    /// The kernel's Landlock ABI, or why there is none.
    pub fn abi() -> Result<u32, String> {
        // SAFETY: the version query takes no attribute.
        let r = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                CREATE_RULESET_VERSION,
            )
        };
        if r >= 1 {
            return Ok(r as u32);
        }
        let e = std::io::Error::last_os_error();
        Err(match e.raw_os_error() {
            Some(libc::ENOSYS) => "this kernel has no Landlock (CONFIG_SECURITY_LANDLOCK)".into(),
            Some(libc::EOPNOTSUPP) => {
                "Landlock is not enabled at boot (add it to the lsm= list or CONFIG_LSM)".into()
            }
            _ => format!("Landlock: {e}"),
        })
    }

    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
    }

    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }

    pub struct Ruleset(libc::c_int);

    impl Drop for Ruleset {
        fn drop(&mut self) {
            // SAFETY: our own descriptor.
            unsafe { libc::close(self.0) };
        }
    }

    impl Ruleset {
        pub fn new(handled: u64) -> Result<Ruleset, String> {
            let attr = RulesetAttr {
                handled_access_fs: handled,
            };
            // SAFETY: `attr` lives across the call; its size is passed.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_landlock_create_ruleset,
                    &attr,
                    std::mem::size_of::<RulesetAttr>(),
                    0,
                )
            };
            if fd < 0 {
                return Err(format!(
                    "cannot create a Landlock ruleset: {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(Ruleset(fd as libc::c_int))
        }

        /// Allows `access` beneath `path` (only the file rights when it is
        /// a file); a path that does not exist is left out.
        pub fn allow(&self, path: &Path, access: u64) -> Result<(), String> {
            let c = CString::new(path.as_os_str().as_bytes())
                .map_err(|_| format!("{}: a NUL byte in the path", path.display()))?;
            // SAFETY: a NUL-terminated path; O_PATH opens nothing for I/O.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
            if fd < 0 {
                return Ok(());
            }
            let is_dir = std::fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false);
            let rule = PathBeneath {
                allowed_access: if is_dir { access } else { access & FILE },
                parent_fd: fd,
            };
            // SAFETY: `rule` lives across the call.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_landlock_add_rule,
                    self.0,
                    RULE_PATH_BENEATH,
                    &rule,
                    0,
                )
            };
            let e = std::io::Error::last_os_error();
            // SAFETY: the descriptor opened above.
            unsafe { libc::close(fd) };
            if r != 0 {
                return Err(format!(
                    "cannot allow {} in the Landlock ruleset: {e}",
                    path.display()
                ));
            }
            Ok(())
        }

        pub fn restrict_self(&self) -> Result<(), String> {
            // SAFETY: our ruleset descriptor, no flags.
            let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, self.0, 0) };
            if r != 0 {
                return Err(format!(
                    "cannot enforce the Landlock ruleset: {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_is_the_one_non_root_owner_of_every_directory() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("needs root to give directories away: left out");
            return;
        }
        let base = std::env::temp_dir().join(format!("xlap-user-for-{}", std::process::id()));
        let dir = |name: &str, owner: Option<(u32, u32)>| {
            let d = base.join(name);
            std::fs::create_dir_all(&d).unwrap();
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&d, Some(uid), Some(gid)).unwrap();
            }
            d
        };
        let a = dir("a", Some((65534, 65534)));
        let b = dir("b", Some((65534, 65534)));
        let other = dir("other", Some((65533, 65534)));
        let roots = dir("root", None);
        assert_eq!(user_for(&[&a, &b]), Some((65534, 65534)));
        assert_eq!(user_for(&[&a, &other]), None, "two owners");
        assert_eq!(user_for(&[&a, &roots]), None, "root's files keep uid 0");
        assert_eq!(user_for(&[&a, &base.join("missing")]), None);
        let _ = std::fs::remove_dir_all(&base);
    }
}
