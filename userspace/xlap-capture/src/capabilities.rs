//! The capabilities a recording needs, feature by feature, checked before
//! anything is loaded: a missing required one stops the run at its start
//! with its name and what needs it (exit 3), never a run that quietly
//! misses points; a missing optional one is said, and run.json lists it.
//! The table is what was measured under `capsh` on Linux 6.18 with root
//! targets (the `least_privilege` test runs with exactly the required set,
//! and, past the check with `--skip-capability-check`, without each of
//! them: the kernel refuses). The marker ring of a target of another user
//! is created with that user's credentials (CAP_SETUID and CAP_SETGID for
//! the creating thread; without them its markers fall back to uprobes,
//! said at start).

use anyhow::Result;
use xlap_exit::{failure, Code};

/// One capability and why a recording needs it.
#[derive(Clone, Copy, Debug)]
pub struct Need {
    pub bit: u32,
    pub name: &'static str,
    pub for_what: &'static str,
    /// Without it the run cannot be whole; without an optional one a
    /// feature is left out (said at start, listed in run.json).
    pub required: bool,
    /// A capability that does the same (the kernel takes CAP_SYS_ADMIN
    /// for CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN).
    pub or_instead: Option<(u32, &'static str)>,
}

const SYS_ADMIN: (u32, &str) = (21, "CAP_SYS_ADMIN");

pub const NEEDS: &[Need] = &[
    Need {
        bit: 39,
        name: "CAP_BPF",
        for_what: "the capture's maps and programs",
        required: true,
        or_instead: Some(SYS_ADMIN),
    },
    Need {
        bit: 38,
        name: "CAP_PERFMON",
        for_what: "tracing programs on tracepoints, uprobes on USDT markers",
        required: true,
        or_instead: Some(SYS_ADMIN),
    },
    Need {
        bit: 12,
        name: "CAP_NET_ADMIN",
        for_what: "the socket hooks on the root cgroup (which sockets and ports are the targets')",
        required: true,
        or_instead: Some(SYS_ADMIN),
    },
    Need {
        bit: 19,
        name: "CAP_SYS_PTRACE",
        for_what: "the targets' sockets (pidfd_getfd), USDT notes, semaphores and marker rings (/proc/PID/...)",
        required: true,
        or_instead: None,
    },
    Need {
        bit: 21,
        name: "CAP_SYS_ADMIN",
        for_what: "the kernel's BPF run-time statistics (--bpf-stats), the timestamping survey of the targets' devices, --iface",
        required: false,
        or_instead: None,
    },
    Need {
        bit: 7,
        name: "CAP_SETUID",
        for_what: "the in-process marker ring of a target of another user, created as that user (else its markers are stamped by uprobes)",
        required: false,
        or_instead: None,
    },
    Need {
        bit: 6,
        name: "CAP_SETGID",
        for_what: "the same ring, with that user's groups",
        required: false,
        or_instead: None,
    },
    Need {
        bit: 5,
        name: "CAP_KILL",
        for_what: "resuming a traced process of another user held at an exec or a library load until its markers are attached (else none is held: the markers of programs a target execs, and of libraries it loads, are missed)",
        required: false,
        or_instead: None,
    },
    Need {
        bit: 23,
        name: "CAP_SYS_NICE",
        for_what: "raising the reader's priority when it falls behind (else more stamps may be lost, counted)",
        required: false,
        or_instead: None,
    },
];

/// The table of needs as the README shows it (a test keeps them equal).
pub fn markdown_table() -> String {
    let mut out = String::from("| capability | needed for | without it |\n|---|---|---|\n");
    for n in NEEDS {
        out += &format!(
            "| `{}`{} | {} | {} |\n",
            n.name,
            n.or_instead
                .map(|(_, name)| format!(" (or `{name}`)"))
                .unwrap_or_default(),
            n.for_what,
            if n.required {
                "refused at start (exit 3)"
            } else {
                "said at start, in run.json `capabilities_missing`"
            }
        );
    }
    out
}

/// This process's effective capability set.
pub fn effective() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// The needs `caps` does not meet.
pub fn missing(caps: u64) -> Vec<Need> {
    let has = |bit: u32| caps & (1 << bit) != 0;
    NEEDS
        .iter()
        .filter(|n| !has(n.bit) && !n.or_instead.is_some_and(|(bit, _)| has(bit)))
        .copied()
        .collect()
}

/// Refuses to start without a required capability (naming every one that
/// is missing), unless `unchecked` (then they are only said); returns the
/// needs that are not met.
pub fn check(unchecked: bool) -> Result<Vec<Need>> {
    let missing = missing(effective());
    let required: Vec<String> = missing
        .iter()
        .filter(|n| n.required)
        .map(|n| format!("{} ({})", n.name, n.for_what))
        .collect();
    if !required.is_empty() && !unchecked {
        return Err(failure(
            Code::Privileges,
            format!(
                "missing capabilities: {}; run as root, or give xlap-trace these capabilities (README: Privileges and privacy)",
                required.join("; ")
            ),
        ));
    }
    Ok(missing)
}

/// What a recording keeps once its probes are attached: bpf() on the
/// maps it holds (CAP_BPF, or CAP_SYS_ADMIN for it, which the kernel's
/// run-time statistics also need), the targets' new sockets and the
/// semaphores lowered at the end (CAP_SYS_PTRACE), the reader's priority
/// (CAP_SYS_NICE), removing a marker ring file a target of another user
/// owns from its sticky /dev/shm at the end (CAP_FOWNER). Attaching
/// (CAP_PERFMON, CAP_NET_ADMIN) and everything else root holds are
/// dropped. capset leaves the bounding set alone: a root binary the
/// recorder executed would have them again (the demo runs `ip` after
/// recording to tear its stage down).
pub const KEPT_AFTER_ATTACH: &[u32] = &[39, 19, 23, 21, 3];

/// What a recording keeps once attached while it holds processes at their
/// exec and library loads (record/markers.rs): it attaches their markers
/// then, so it also keeps uprobes (CAP_PERFMON), the rings of other users
/// (CAP_SETUID, CAP_SETGID) and resuming their processes (CAP_KILL).
pub const KEPT_WHILE_HOLDING: &[u32] = &[39, 19, 23, 21, 3, 38, 7, 6, 5];

/// `struct __user_cap_header_struct` / `__user_cap_data_struct` (v3: two
/// 32-bit words per set).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// Keeps only `keep` in the calling thread's effective and permitted sets
/// (threads it starts later inherit that); returns the bits dropped.
/// Threads already running keep theirs: drop early, or in each of them.
pub fn keep_only(keep: &[u32]) -> std::io::Result<u64> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and two data words as capget(2) v3 expects.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mask: u64 = keep.iter().map(|b| 1u64 << b).sum();
    let before = data[0].permitted as u64 | (data[1].permitted as u64) << 32;
    for (i, word) in data.iter_mut().enumerate() {
        let m = (mask >> (32 * i)) as u32;
        word.effective &= m;
        word.permitted &= m;
        word.inheritable &= m;
    }
    // SAFETY: as above; capset only lowers this thread's sets.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(before & !mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bits as in linux/capability.h (checked against capsh's own names).
    #[test]
    fn names_match_capsh_bits() {
        for n in NEEDS {
            let out = std::process::Command::new("capsh")
                .arg(format!("--decode={:#x}", 1u64 << n.bit))
                .output()
                .expect("capsh (Debian libcap2-bin; ./run.sh setup installs it)");
            let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
            assert!(
                text.contains(&n.name.to_lowercase()),
                "{} is not bit {}: capsh says {text}",
                n.name,
                n.bit
            );
        }
    }

    /// The README's table is this one.
    #[test]
    fn the_readme_lists_the_needs() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        let table = markdown_table();
        assert!(
            readme.contains(&table),
            "README.md's capability table differs from capabilities::NEEDS; it should read:\n{table}"
        );
    }

    /// In a thread of its own (capabilities are per thread): what it keeps
    /// is what /proc says it has, and nothing comes back.
    #[test]
    fn keep_only_lowers_this_threads_capabilities() {
        std::thread::spawn(|| {
            let before = effective_of_thread();
            keep_only(&[19]).expect("capset");
            assert_eq!(effective_of_thread(), before & (1 << 19));
            keep_only(&[19, 21]).expect("capset");
            assert_eq!(
                effective_of_thread(),
                before & (1 << 19),
                "regained a capability"
            );
        })
        .join()
        .unwrap();
    }

    fn effective_of_thread() -> u64 {
        // SAFETY: gettid has no arguments.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap()
    }

    #[test]
    fn missing_lists_the_unmet_needs() {
        let all: u64 = NEEDS.iter().map(|n| 1 << n.bit).sum();
        assert!(missing(all).is_empty());
        let names = |caps: u64| missing(caps).iter().map(|n| n.name).collect::<Vec<_>>();
        assert_eq!(names(all & !(1 << 19)), ["CAP_SYS_PTRACE"]);
        // CAP_SYS_ADMIN stands in for CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN.
        assert!(names(all & !(1 << 39) & !(1 << 38) & !(1 << 12)).is_empty());
        assert_eq!(
            names(all & !(1 << 39) & !(1 << 21)),
            ["CAP_BPF", "CAP_SYS_ADMIN"]
        );
    }
}
