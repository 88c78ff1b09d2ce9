//! Following the traced processes and their sockets while a run goes on.
//!
//! The BPF side follows what happens at once (a child a target forks, a
//! socket it creates, a port a bind or an autobind takes); this side does
//! what needs /proc: marking the sockets a process held before it was
//! traced, reading the port table (the safety net for ports the kernel side
//! could not see), noticing exits, and forgetting exited children (whose
//! pids the system may give to unrelated processes).
//!
//! A traced cgroup (`--cgroup`, `--container`) is followed both ways: the
//! BPF side adopts a process found in it at its socket creation, fork or
//! exec (the usual way in: `docker exec`, `systemd-run --scope`), and a
//! rescan of its `cgroup.procs` every second adopts those that entered
//! with their sockets already open (their sockets are then marked as any
//! target's held before tracing).

use crate::capture::{Capture, NotMarked};
use crate::cgroup_names::TracedCgroup;
use crate::sockets::UdpScan;
use crate::targets::{self, PortOwners};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use xlap_records::run_meta::SocketsNotTraced;

/// A child a target forked, followed since (as run.json lists it).
pub use xlap_records::run_meta::Child;

/// Children listed in run.json (`followed`) whatever they did; beyond,
/// only those that held a UDP socket are, and the rest are counted
/// (`followed_unlisted`): a CI job starts thousands of processes, and the
/// recorder's memory must follow those alive, not all it ever saw.
pub const LISTED_CHILDREN: usize = 1000;

/// Children announced on stderr one by one; the rest are only listed.
const PRINTED_CHILDREN: u64 = 8;

/// Rounds of following (FOLLOW_EVERY apart: 200 ms) between two rescans
/// of the traced cgroups' members (a walk of their cgroup trees).
const RESCAN_CGROUPS_EVERY: u32 = 5;

pub struct Following {
    /// The processes named on the command line.
    pub targets: Vec<u32>,
    /// Cgroups traced whole (their later members too).
    cgroups: Vec<TracedCgroup>,
    /// Rounds since the last rescan of the cgroups.
    rounds_since_rescan: u32,
    /// Whether the kernel's table of traced processes was found full
    /// (said once).
    table_full_said: bool,
    /// Children listed in run.json, by pid (alive or exited).
    pub children: BTreeMap<u32, Child>,
    /// Children beyond the listed ones, while they live.
    unlisted: HashMap<u32, Child>,
    /// Children alive (listed or not).
    alive: BTreeSet<u32>,
    /// Children followed in all, and those not listed.
    pub followed_total: u64,
    pub followed_unlisted: u64,
    /// Targets and listed children that exited, with when (seconds into
    /// the run).
    pub exited: Vec<(u32, f64)>,
    exited_targets: HashSet<u32>,
    /// Those not yet taken by `take_exited`.
    exited_since: Vec<u32>,
    /// Socket inodes marked as traced.
    marked: HashSet<u64>,
    /// Processes that held a UDP socket at some point.
    pub udp_pids: HashSet<u32>,
    /// The port table as last read from /proc.
    owners: PortOwners,
    /// Every port a traced process held during the run.
    pub known_ports: PortOwners,
    /// Ports the kernel's table had no room for.
    pub ports_not_traced: HashSet<(u32, u16)>,
    /// Sockets held before tracing that could not be traced, per reason.
    pub sockets_not_traced: SocketsNotTraced,
    /// Processes whose fd table could not be read (said once each).
    unreadable: HashSet<u32>,
    quiet: bool,
}

impl Following {
    /// Marks the targets' sockets and registers their ports.
    pub fn start(
        capture: &mut Capture,
        targets: &[u32],
        cgroups: &[TracedCgroup],
        quiet: bool,
    ) -> Result<Following> {
        let mut f = Following {
            targets: targets.to_vec(),
            cgroups: cgroups.to_vec(),
            rounds_since_rescan: 0,
            table_full_said: false,
            children: BTreeMap::new(),
            unlisted: HashMap::new(),
            alive: BTreeSet::new(),
            followed_total: 0,
            followed_unlisted: 0,
            exited: Vec::new(),
            exited_targets: HashSet::new(),
            exited_since: Vec::new(),
            marked: HashSet::new(),
            udp_pids: HashSet::new(),
            owners: PortOwners::new(),
            known_ports: PortOwners::new(),
            ports_not_traced: HashSet::new(),
            sockets_not_traced: SocketsNotTraced::default(),
            unreadable: HashSet::new(),
            quiet,
        };
        // Children that exist already (a pre-forked worker pool); those
        // forked from now on the BPF side follows itself.
        for &target in targets {
            for child in targets::descendants(target) {
                capture.follow_process(child, target)?;
            }
        }
        // Members that entered since the command line listed them.
        f.rescan_cgroups(capture);
        f.note_children(capture, 0.0)?;
        let scans = f.scan();
        f.mark_new_sockets(capture, &scans)?;
        f.sync_ports(capture, &scans)?;
        Ok(f)
    }

    /// The traced processes still alive.
    pub fn live(&self) -> Vec<u32> {
        self.targets
            .iter()
            .filter(|p| !self.exited_targets.contains(p))
            .chain(self.alive.iter())
            .copied()
            .collect()
    }

    /// The children run.json lists (`followed`): the listed ones, and those
    /// still alive beyond them that held a UDP socket; and how many it does
    /// not list.
    pub fn listed(&self) -> (Vec<Child>, u64) {
        let mut listed: Vec<Child> = self.children.values().cloned().collect();
        let mut unlisted = self.followed_unlisted;
        for (pid, child) in &self.unlisted {
            if self.udp_pids.contains(pid) {
                listed.push(child.clone());
            } else {
                unlisted += 1;
            }
        }
        listed.sort_by_key(|c| c.pid);
        (listed, unlisted)
    }

    /// The processes seen to exit since the last call.
    pub fn take_exited(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.exited_since)
    }

    /// One round of following; returns whether every traced process (the
    /// targets and the children they forked) has exited.
    /// A traced cgroup keeps the run going while it exists, empty or not:
    /// a process may enter it later.
    pub fn refresh(&mut self, capture: &mut Capture, elapsed_s: f64) -> Result<bool> {
        self.rounds_since_rescan += 1;
        if self.rounds_since_rescan >= RESCAN_CGROUPS_EVERY {
            self.rounds_since_rescan = 0;
            self.rescan_cgroups(capture);
        }
        self.note_children(capture, elapsed_s)?;
        for pid in self.live() {
            if targets::alive(pid) {
                continue;
            }
            if !self.quiet && self.targets.contains(&pid) {
                // Its probes went with it: a restarted process has a new
                // pid and needs a new run (we do not guess which it is).
                eprintln!(
                    "xlap-trace: note: pid {pid} exited after {elapsed_s:.1} s; its stamps so far are kept, a restart is not traced (trace the new pid)"
                );
            }
            if self.alive.remove(&pid) {
                capture.forget_process(pid)?;
                if let Some(child) = self.unlisted.remove(&pid) {
                    if self.udp_pids.contains(&pid) {
                        // It held a UDP socket: its stamps carry its pid.
                        self.children.insert(pid, child);
                    } else {
                        self.followed_unlisted += 1;
                    }
                }
            } else {
                self.exited_targets.insert(pid);
            }
            if self.children.contains_key(&pid) || self.targets.contains(&pid) {
                self.exited.push((pid, elapsed_s));
            }
            self.exited_since.push(pid);
        }
        if self.live().is_empty() {
            // A traced cgroup that still exists may get new members (a
            // container's cgroup goes when the container stops).
            return Ok(self.cgroups.iter().all(|c| !c.dir.exists()));
        }
        let scans = self.scan();
        self.mark_new_sockets(capture, &scans)?;
        self.sync_ports(capture, &scans)?;
        Ok(false)
    }

    /// One look at each live process's sockets and UDP ports, shared by
    /// the marking and the port table (each read of /proc/PID/net/udp walks
    /// the whole namespace's table: the recorder's largest cost when idle).
    fn scan(&self) -> Vec<(u32, UdpScan)> {
        self.live()
            .into_iter()
            .map(|pid| (pid, crate::sockets::scan_udp(pid)))
            .collect()
    }

    /// Follows the processes in the traced cgroups that are not traced
    /// yet (they entered without creating a socket, forking or exec'ing
    /// since: e.g. moved in with their sockets open). A full table of
    /// traced processes is said once and leaves them untraced.
    fn rescan_cgroups(&mut self, capture: &mut Capture) {
        if self.cgroups.is_empty() {
            return;
        }
        let traced: HashSet<u32> = match capture.traced_processes() {
            Ok(t) => t.into_iter().map(|(pid, _)| pid).collect(),
            Err(_) => return,
        };
        let me = std::process::id();
        let new: BTreeSet<u32> = self
            .cgroups
            .iter()
            .flat_map(|c| c.rescan_members())
            .filter(|p| *p != me && !traced.contains(p))
            .collect();
        for pid in new {
            if let Err(e) = capture.follow_process(pid, xlap_abi::XLAP_ROOT_CGROUP) {
                if !self.table_full_said && !self.quiet {
                    eprintln!("xlap-trace: warning: pid {pid} entered a traced cgroup but cannot be traced ({e:#}: the kernel's table of traced processes is full?); it and later ones are left out");
                }
                self.table_full_said = true;
                return;
            }
        }
    }

    /// Children the BPF side started following since the last round.
    fn note_children(&mut self, capture: &Capture, elapsed_s: f64) -> Result<()> {
        for (pid, target) in capture.traced_processes()? {
            if pid == target || self.alive.contains(&pid) {
                continue;
            }
            let comm = targets::comm(pid);
            self.followed_total += 1;
            if !self.quiet && self.followed_total <= PRINTED_CHILDREN {
                if target == xlap_abi::XLAP_ROOT_CGROUP {
                    eprintln!(
                        "xlap-trace: following pid {pid} ({comm}), which entered a traced cgroup"
                    );
                } else {
                    eprintln!(
                        "xlap-trace: following pid {pid} ({comm}), forked from target {target}"
                    );
                }
                if self.followed_total == PRINTED_CHILDREN {
                    eprintln!("xlap-trace: following the targets' further children without saying so each time (run.json: followed)");
                }
            }
            let child = Child {
                pid,
                target,
                comm,
                seen_after_s: elapsed_s,
            };
            self.alive.insert(pid);
            if self.children.len() < LISTED_CHILDREN {
                self.children.insert(pid, child);
            } else {
                self.unlisted.insert(pid, child);
            }
        }
        Ok(())
    }

    /// Marks the UDP sockets of the live processes not marked yet (sockets
    /// created after attaching are marked by the BPF side; this catches
    /// those that existed before and those passed in from elsewhere), and
    /// counts, per reason, those that cannot be.
    fn mark_new_sockets(&mut self, capture: &mut Capture, scans: &[(u32, UdpScan)]) -> Result<()> {
        let mut new = Vec::new();
        for (pid, scan) in scans {
            let pid = *pid;
            if scan.fd_table_unreadable && self.unreadable.insert(pid) {
                self.sockets_not_traced.processes_unreadable += 1;
                self.warn(&format!(
                    "the sockets pid {pid} holds cannot be listed (/proc/{pid}/fd: permission denied; the recorder needs CAP_SYS_PTRACE over it): those it held before tracing are not traced"
                ));
            }
            for s in &scan.uninspectable {
                if self.marked.insert(s.inode) {
                    self.sockets_not_traced.not_inspectable += 1;
                    self.warn(&format!(
                        "socket fd {} of pid {pid} cannot be asked its protocol (pidfd_getfd refused); if it is UDP, its datagrams are not traced",
                        s.fd
                    ));
                }
            }
            new.extend(
                scan.udp
                    .iter()
                    .filter(|s| !self.marked.contains(&s.inode))
                    .copied(),
            );
        }
        if new.is_empty() {
            return Ok(());
        }
        let failed = capture.mark_sockets(&new)?;
        for s in &new {
            self.marked.insert(s.inode);
            self.udp_pids.insert(s.pid);
        }
        for (s, why) in failed {
            match why {
                NotMarked::Duplicate(_) => self.sockets_not_traced.duplicate_refused += 1,
                NotMarked::Mark(_) => self.sockets_not_traced.mark_refused += 1,
            }
            self.warn(&format!(
                "socket fd {} of pid {}: {why}; its datagrams are not traced",
                s.fd, s.pid
            ));
        }
        Ok(())
    }

    /// A warning counted in run.json (`sockets_not_traced`).
    fn warn(&self, what: &str) {
        if !self.quiet {
            eprintln!("xlap-trace: warning: {what} (counted in run.json: sockets_not_traced)");
        }
    }

    fn sync_ports(&mut self, capture: &mut Capture, scans: &[(u32, UdpScan)]) -> Result<()> {
        let now = targets::port_owners(scans);
        if now == self.owners {
            return Ok(());
        }
        for sock in capture.sync_ports(&self.owners, &now)? {
            if self.ports_not_traced.insert(sock) && !self.quiet {
                eprintln!(
                    "xlap-trace: warning: the kernel's port table is full; port {} is not traced at its receive devices (counted in run.json: ports_not_traced)",
                    sock.1
                );
            }
        }
        self.known_ports.extend(now.iter().map(|(k, v)| (*k, *v)));
        self.owners = now;
        Ok(())
    }

    /// The ports as last read (for the start message).
    pub fn ports(&self) -> Vec<u16> {
        self.owners.keys().map(|(_, port)| *port).collect()
    }
}
