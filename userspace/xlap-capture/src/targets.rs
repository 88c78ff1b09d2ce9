//! The traced processes: which UDP ports their sockets own, read from /proc
//! (works across network namespaces: /proc/PID/net is the process's own).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// Socket inodes of the process's open file descriptors.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|link| {
            let s = link.to_string_lossy().into_owned();
            s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Local UDP ports of the sockets `pid` holds open.
pub fn udp_ports(pid: u32) -> Vec<u16> {
    let inodes = socket_inodes(pid);
    let mut ports: Vec<u16> = ["udp", "udp6"]
        .iter()
        .flat_map(|t| crate::sockets::proc_net_table(Path::new(&format!("/proc/{pid}/net/{t}"))))
        .filter(|(_, inode)| inodes.contains(inode))
        .map(|(port, _)| port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Inode number of the process's network namespace (`/proc/PID/ns/net`).
pub fn netns_inode(pid: u32) -> Option<u32> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let text = link.to_string_lossy().into_owned();
    text.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// The traced sockets: (network namespace, local UDP port) -> owning pid.
pub type PortOwners = BTreeMap<(u32, u16), u32>;

/// The UDP sockets of every traced pid.
pub fn port_owners(pids: &[u32]) -> PortOwners {
    pids.iter()
        .filter_map(|&pid| Some((pid, netns_inode(pid)?)))
        .flat_map(|(pid, ns)| udp_ports(pid).into_iter().map(move |p| ((ns, p), pid)))
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
    fn finds_this_process_udp_socket_port() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        assert!(udp_ports(std::process::id()).contains(&port));
        drop(sock);
        assert!(!udp_ports(std::process::id()).contains(&port));
    }

    #[test]
    fn owners_are_keyed_by_network_namespace() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        let me = std::process::id();
        let ns = netns_inode(me).expect("own netns");
        assert_eq!(port_owners(&[me]).get(&(ns, port)), Some(&me));
    }

    #[test]
    fn this_process_is_alive_and_a_bogus_pid_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }
}
