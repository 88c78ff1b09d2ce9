//! The traced processes as /proc shows them: alive or not, their network
//! namespace, name and descendants, and which UDP ports their sockets own
//! (from their socket scans, `sockets::scan_udp`; /proc/PID/net is the
//! process's own namespace's, so this works across namespaces).

use crate::sockets::UdpScan;
use std::collections::BTreeMap;

/// Inode number of the process's network namespace (`/proc/PID/ns/net`).
pub fn netns_inode(pid: u32) -> Option<u32> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let text = link.to_string_lossy().into_owned();
    text.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// The traced sockets: (network namespace, local UDP port) -> owning pid.
pub type PortOwners = BTreeMap<(u32, u16), u32>;

/// The ports of every traced pid's UDP sockets, from their scans.
pub fn port_owners(scans: &[(u32, UdpScan)]) -> PortOwners {
    scans
        .iter()
        .filter_map(|(pid, scan)| Some((*pid, netns_inode(*pid)?, scan)))
        .flat_map(|(pid, ns, scan)| scan.ports.iter().map(move |p| ((ns, *p), pid)))
        .collect()
}

pub fn alive(pid: u32) -> bool {
    // A zombie keeps its /proc entry; its state says it is gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Whether `pid` is a child of `ancestor`, or a child's child (up to a few
/// generations), by the parent pids in /proc.
pub fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut p = pid;
    for _ in 0..8 {
        match parent(p) {
            Some(q) if q == ancestor => return true,
            Some(q) if q > 1 => p = q,
            _ => return false,
        }
    }
    false
}

fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, then the parent.
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The process's name, as it set it (untrusted: control characters, such
/// as a terminal's escape sequences, become `?`).
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| {
            s.trim()
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect()
        })
        .unwrap_or_default()
}

/// Every process descending from `pid` (children, their children, ...),
/// from /proc/PID/task/*/children (Linux >= 3.5, CONFIG_PROC_CHILDREN).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in text
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                if !out.contains(&child) && child != pid {
                    out.push(child);
                    todo.push(child);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_keyed_by_network_namespace() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        let me = std::process::id();
        let ns = netns_inode(me).expect("own netns");
        let scans = [(me, crate::sockets::scan_udp(me))];
        assert_eq!(port_owners(&scans).get(&(ns, port)), Some(&me));
    }

    #[test]
    fn this_process_is_alive_and_a_bogus_pid_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }
}
