//! The app markers of a run, kept whole while the traced processes change
//! their code: planned at attach for the targets, and again for any traced
//! process (a target or one it forked) held where new code was mapped, at
//! its exec (`bash job.sh` starting the protocol, `env`, `timeout`, `sh -c`)
//! and where its dynamic loader has mapped objects (the libraries it needs
//! at start-up, a `dlopen` later). The BPF side stops such a process before
//! it runs any of that code (bpf/hooks/holds.h); here the new files'
//! markers get their in-process ring or their uprobes, then the process is
//! resumed. How long each was held is counted in run.json (`holds`).
//!
//! Only code not read yet holds a process: each file read and found
//! without a traced marker goes to the BPF side's KNOWN_CODE, and a
//! loader, hooked once for every process that maps it, joins them once
//! its hook is attached. A process with markers is noted (MARKED_PIDS): its
//! every exec is held, its uprobes closed when it exits.

use super::app_ring::{AppRings, RingLosses};
use super::uprobe_closer::UprobeCloser;
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
    /// Processes with markers attached (held at each exec).
    marked: HashSet<u32>,
    /// Closes the uprobes of processes that exited, and at the end.
    closer: UprobeCloser,
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
            marked: HashSet::new(),
            closer: UprobeCloser::default(),
            new_names: false,
            quiet,
        };
        let all = markers.sites.usdt.sites.clone();
        markers.attach(capture, &all, note)?;
        for site in &all {
            markers.mark(capture, site.pid);
        }
        markers.learn(capture, note);
        Ok(markers)
    }

    /// Tells the BPF side what the last scans read: hooks the loaders first
    /// seen, then notes as known code the files without a traced marker
    /// and the loaders now hooked.
    fn learn(&mut self, capture: &mut Capture, note: &impl Fn(String)) {
        let (mut known, loaders) = self.sites.usdt.take_scanned();
        if self.holds.is_none() {
            return;
        }
        for loader in loaders {
            match capture.hook_loader(&loader.file, loader.offset, loader.to_r_debug) {
                Ok(()) => known.push(loader.code),
                Err(e) => note(format!(
                    "markers of libraries loaded through {} are not traced (cannot hook it: {e:#})",
                    loader.path.display()
                )),
            }
        }
        match capture.know_code(&known) {
            Ok(0) => {}
            Ok(n) => self.sites.holds.files_not_known += n as u64,
            Err(e) => note(format!("every exec and library load is held: {e:#}")),
        }
        self.sites.holds.files_known += known.len() as u64;
    }

    /// Notes that `pid` has markers attached: each of its execs is held.
    fn mark(&mut self, capture: &mut Capture, pid: u32) {
        if self.holds.is_some() && self.marked.insert(pid) {
            if let Err(e) = capture.set_marked(pid, true) {
                // Its exec into a known program then goes unheld: the new
                // image's markers are found at its next library load only.
                eprintln!("xlap-trace: warning: pid {pid}: {e:#}");
            }
        }
    }

    /// A traced process exited: its uprobes are closed (off the run's
    /// path), what was planned for it forgotten (its pid may come back).
    pub fn release(&mut self, capture: &mut Capture, pid: u32) {
        self.closer.close(capture.take_uprobes(Some(pid)));
        self.uprobes.retain(|(p, _, _)| *p != pid);
        self.sites.usdt.forget_files(pid);
        self.semaphores.release(pid);
        if self.marked.remove(&pid) {
            let _ = capture.set_marked(pid, false);
        }
    }

    /// The run ends: every uprobe left is queued to be closed; what is not
    /// closed once the run directory is written is handed over
    /// (`UprobeCloser::hand_over`).
    pub fn close_uprobes(&mut self, capture: &mut Capture) -> UprobeCloser {
        let (at_exec, at_loader) = capture.hold_skips();
        self.sites.holds.skipped_at_exec = at_exec;
        self.sites.holds.skipped_at_loader = at_loader;
        self.closer.close(capture.take_uprobes(None));
        std::mem::take(&mut self.closer)
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
            if self.marked.remove(&pid) {
                let _ = capture.set_marked(pid, false);
            }
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
        match &result {
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
        if let Ok(added) = &result {
            if !added.is_empty() {
                self.mark(capture, pid);
            }
        }
        self.learn(capture, note);
        if self.sites.usdt.app_names.len() > names_before {
            self.new_names = true;
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
    crate::runmeta::read_clock(libc::CLOCK_MONOTONIC)
}

/// Raised USDT semaphores, lowered again on drop, through the memory
/// opened when raised (bound to that image: a process that exec'd since,
/// or a reused pid, is not written to).
struct Semaphores(Vec<(u32, std::fs::File, u64)>);

impl Semaphores {
    fn raise(&mut self, sites: &[Site]) -> Result<()> {
        for site in sites {
            if let Some(addr) = site.semaphore_addr {
                let mem = usdt::open_memory(site.pid)?;
                usdt::adjust_semaphore(&mem, addr, 1)?;
                self.0.push((site.pid, mem, addr));
            }
        }
        Ok(())
    }

    /// Closes the memory of `pid`, which exited (nothing to lower).
    fn release(&mut self, pid: u32) {
        self.0.retain(|(p, _, _)| *p != pid);
    }
}

impl Drop for Semaphores {
    fn drop(&mut self) {
        for (_, mem, addr) in &self.0 {
            let _ = usdt::adjust_semaphore(mem, *addr, -1);
        }
    }
}
