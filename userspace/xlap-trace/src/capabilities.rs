//! The capabilities a recording needs, feature by feature, checked before
//! anything is loaded: a missing required one stops the run at its start
//! with its name and what needs it (exit 3), never a run that quietly
//! misses points; a missing optional one is said, and run.json lists it.
//! The table is what was measured under `capsh` on Linux 6.18 with root
//! targets (the `least_privilege` test runs with exactly the required set,
//! and, past the check with `--skip-capability-check`, without each of
//! them: the kernel refuses). Targets of another user may need more for
//! the marker ring (CAP_CHOWN; without it their markers fall back to
//! uprobes, said at start): not measured.

use crate::exit::{failure, Code};
use anyhow::Result;

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
