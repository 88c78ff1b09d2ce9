//! The app markers of a run, kept whole while the traced processes change
//! their code: planned at attach for the targets, and again for any traced
//! process (a target or one it forked) held where new code was mapped, at
//! its exec (`bash job.sh` starting the protocol, `env`, `timeout`, `sh -c`)
//! and where its dynamic loader has mapped objects (the libraries it needs
//! at start-up, a `dlopen` later). The BPF side stops such a process before
//! it runs any of that code (bpf/hooks/holds.h); here the new files'
//! markers get their in-process ring or their uprobes, then the process is
//! resumed. How long each was held is counted in run.json (`holds`).

use super::app_ring::{AppRings, RingLosses};
use crate::capture::Capture;
use crate::usdt::{self, FileId, Selection, Site};
use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use std::collections::HashSet;
use std::path::PathBuf;
use xlap_abi::{xlap_hold, xlap_hold_why};
use xlap_records::run_meta::Holds;

/// What the markers of a run ended as (for run.json).
pub struct MarkerSites {
    pub usdt: usdt::Plan,
    /// The (process, binary) whose markers write an in-process ring.
    pub ring_sites: Vec<(u32, PathBuf)>,
    pub holds: Holds,
}

pub struct Markers {
    pub sites: MarkerSites,
    rings: AppRings,
    semaphores: Semaphores,
    selections: Vec<Selection>,
    /// Markers of the xlap-marker crate write an in-process ring.
    ring_path: bool,
    /// Held processes, from the BPF side (None: markers are not traced).
    holds: Option<HoldRing>,
    /// Uprobes attached, per process, file and offset: a uprobe follows
    /// its process through an exec, so a new image of the same file needs
    /// none again.
    uprobes: HashSet<(u32, FileId, u64)>,
    /// Processes whose loader is hooked.
    hooked: HashSet<u32>,
    /// Whether app names were added since the last `take_new_names`.
    new_names: bool,
    quiet: bool,
}

/// What the user asked of the markers (from `record`'s or `run`'s flags).
pub struct MarkerOptions<'a> {
    /// `--usdt NAME`: only these markers (all `xlap:*` when empty).
    pub selections: &'a [Selection],
    /// False with `--no-usdt`: kernel points only.
    pub traced: bool,
    /// Markers built with the xlap-marker crate are read from their ring.
    pub ring_path: bool,
    /// The targets were started by `run` (planned per process as they exec).
    pub started_here: bool,
    pub quiet: bool,
}

impl Markers {
    /// Plans and attaches the markers of `pids` unless `traced` is false
    /// (`--no-usdt`), holding later images of every traced process when
    /// `holds` is given. `started_here`: a
    /// `--usdt` selection may still be found in a program the command
    /// starts, so not finding it now is no error.
    pub fn start(
        capture: &mut Capture,
        pids: &[u32],
        options: MarkerOptions<'_>,
        holds: Option<RingBuf<MapData>>,
        note: &impl Fn(String),
    ) -> Result<Markers> {
        let MarkerOptions {
            selections,
            traced,
            ring_path,
            started_here,
            quiet,
        } = options;
        let usdt = if !traced {
            usdt::Plan::default()
        } else if started_here {
            let mut plan = usdt::Plan::default();
            for &pid in pids {
                plan.add_process(pid, selections)?;
            }
            plan
        } else {
            usdt::plan(pids, selections)?
        };
        for (pid, binary, name) in &usdt.refused_names {
            note(format!(
                "pid {pid}: marker {name} in {binary} is not traced: a point name is 1 to {} letters, digits and underscores",
                usdt::MAX_POINT_NAME
            ));
        }
        for (pid, comm) in &usdt.without_markers {
            note(format!(
                "pid {pid} ({comm}) has no {} USDT markers; tracing its kernel points only",
                if selections.is_empty() {
                    "xlap:*"
                } else {
                    "selected"
                }
            ));
        }
        let mut markers = Markers {
            sites: MarkerSites {
                usdt,
                ring_sites: Vec::new(),
                holds: Holds::default(),
            },
            rings: AppRings::default(),
            semaphores: Semaphores(Vec::new()),
            selections: selections.to_vec(),
            ring_path,
            holds: holds.map(HoldRing),
            uprobes: HashSet::new(),
            hooked: HashSet::new(),
            new_names: false,
            quiet,
        };
        let all = markers.sites.usdt.sites.clone();
        markers.attach(capture, &all, note)?;
        if markers.holds.is_some() {
            for &pid in pids {
                markers.hook_loader(capture, pid, note);
            }
        }
        Ok(markers)
    }

    /// Rings for the sites that can have one, uprobes for the others.
    fn attach(
        &mut self,
        capture: &mut Capture,
        sites: &[Site],
        note: &impl Fn(String),
    ) -> Result<()> {
        let uprobe_sites = if self.ring_path && self.selections.is_empty() {
            self.rings.add(&self.sites.usdt, sites, note)
        } else {
            sites.to_vec()
        };
        let fresh: Vec<Site> = uprobe_sites
            .into_iter()
            .filter(|s| self.uprobes.insert((s.pid, s.file_id, s.probe.file_offset)))
            .collect();
        capture.attach_usdt(&fresh)?;
        self.semaphores.raise(&fresh)?;
        self.sites.ring_sites = self.rings.sites();
        Ok(())
    }

    /// Hooks `pid`'s dynamic loader (a static program has none: then its
    /// exec was its only change of code).
    fn hook_loader(&mut self, capture: &mut Capture, pid: u32, note: &impl Fn(String)) {
        if !self.hooked.insert(pid) {
            return;
        }
        let Some((loader, offset, path)) = usdt::loader_hook(pid) else {
            return;
        };
        if let Err(e) = capture.hold_at_loader(pid, &loader, offset) {
            note(format!(
                "pid {pid}: markers of libraries it loads later are not traced (cannot hook its loader {}: {e:#})",
                path.display()
            ));
        }
    }

    /// The descriptor to poll for held processes.
    pub fn holds_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.holds.as_ref().map(|r| r.0.as_raw_fd())
    }

    /// Attaches the markers of the processes held since the last call and
    /// resumes them.
    pub fn serve(&mut self, capture: &mut Capture, note: &impl Fn(String)) -> Result<()> {
        let Some(ring) = self.holds.as_mut() else {
            return Ok(());
        };
        for hold in ring.take() {
            self.serve_one(capture, &hold, note);
        }
        Ok(())
    }

    fn serve_one(&mut self, capture: &mut Capture, hold: &xlap_hold, note: &impl Fn(String)) {
        let pid = hold.pid;
        let exec = hold.why == xlap_hold_why::XLAP_HOLD_EXEC;
        if exec {
            // A new image: its files are new to it, its old rings gone.
            self.sites.usdt.forget_files(pid);
            self.hooked.remove(&pid);
        }
        let names_before = self.sites.usdt.app_names.len();
        let result = self
            .sites
            .usdt
            .add_process(pid, &self.selections)
            .and_then(|range| {
                let added = self.sites.usdt.sites[range].to_vec();
                self.attach(capture, &added, note)?;
                Ok(added)
            });
        match result {
            Ok(added) if !added.is_empty() && !self.quiet => {
                let mut files: Vec<String> =
                    added.iter().map(|s| s.path.display().to_string()).collect();
                files.dedup();
                eprintln!(
                    "xlap-trace: pid {pid} ({}): {} markers in {}",
                    crate::targets::comm(pid),
                    added.len(),
                    files.join(", ")
                );
            }
            Ok(_) => {}
            Err(e) => note(format!("pid {pid}: its markers are not traced: {e:#}")),
        }
        if self.sites.usdt.app_names.len() > names_before {
            self.new_names = true;
        }
        if exec {
            self.hook_loader(capture, pid, note);
        }
        let counts = &mut self.sites.holds;
        if exec {
            counts.at_exec += 1;
        } else {
            counts.at_loader += 1;
        }
        if hold.stop != 0 {
            // Not stopped (the kernel refused the signal): it ran on, and
            // markers it passed before this point are missing.
            counts.not_stopped += 1;
            return;
        }
        // SAFETY: SIGCONT to the process the BPF side stopped (a pid that
        // exited since may name another process: SIGCONT ends nothing and
        // a process that is not stopped ignores it).
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        let held_us = (monotonic_ns().saturating_sub(hold.ts_ns)) as f64 / 1e3;
        counts.held_us_total += held_us;
        counts.held_us_max = counts.held_us_max.max(held_us);
    }

    /// The app point names, if points were added since the last call.
    pub fn take_new_names(&mut self) -> Option<Vec<String>> {
        std::mem::take(&mut self.new_names).then(|| self.sites.usdt.app_names.clone())
    }

    /// Hands every complete in-process ring record to `take`.
    pub fn drain(&mut self, take: impl FnMut(&xlap_abi::xlap_stamp)) {
        self.rings.drain(take);
    }

    /// Switches the rings off (the capture programs are gone), reads what
    /// is left, lowers the semaphores.
    pub fn close(self, take: impl FnMut(&xlap_abi::xlap_stamp)) -> (RingLosses, MarkerSites) {
        let Markers {
            sites,
            rings,
            semaphores,
            holds,
            ..
        } = self;
        // Held since the last round: resumed without their markers (the
        // programs are gone; they would stamp nothing).
        drop(holds);
        let losses = rings.close(take);
        drop(semaphores);
        (losses, sites)
    }
}

/// The ring buffer of held processes. Dropped (the run ended, or failed),
/// it resumes every process still waiting in it: none stays stopped.
struct HoldRing(RingBuf<MapData>);

impl HoldRing {
    fn take(&mut self) -> Vec<xlap_hold> {
        let mut held = Vec::new();
        while let Some(item) = self.0.next() {
            if item.len() >= std::mem::size_of::<xlap_hold>() {
                // SAFETY: a plain C struct of integers, length checked; read
                // unaligned whatever the record's alignment.
                held.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<xlap_hold>()) });
            }
        }
        held
    }
}

impl Drop for HoldRing {
    fn drop(&mut self) {
        for hold in self.take() {
            if hold.stop == 0 {
                // SAFETY: SIGCONT to a process the BPF side stopped.
                unsafe { libc::kill(hold.pid as i32, libc::SIGCONT) };
            }
        }
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Raised USDT semaphores, lowered again on drop, through the memory
/// opened when raised (bound to that image: a process that exec'd since,
/// or a reused pid, is not written to).
struct Semaphores(Vec<(std::fs::File, u64)>);

impl Semaphores {
    fn raise(&mut self, sites: &[Site]) -> Result<()> {
        for site in sites {
            if let Some(addr) = site.semaphore_addr {
                let mem = usdt::open_memory(site.pid)?;
                usdt::adjust_semaphore(&mem, addr, 1)?;
                self.0.push((mem, addr));
            }
        }
        Ok(())
    }
}

impl Drop for Semaphores {
    fn drop(&mut self) {
        for (mem, addr) in &self.0 {
            let _ = usdt::adjust_semaphore(mem, *addr, -1);
        }
    }
}
