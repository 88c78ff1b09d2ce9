//! The in-process path of the app points: for each traced process built with
//! the `xlap-marker` crate (its `xlap_ring:control` note), a shared-memory
//! ring that its markers write and this reader drains, instead of a uprobe
//! per marker hit. The layout is the marker crate's (`xlap_marker::ring`).
//!
//! Switching on: the ring file is created in the process's own view of
//! `/dev/shm` with the process's own credentials ([`shm_file`]), mode 0600;
//! then the path, a new generation and finally `state = 1` are written into
//! the process's control block through `/proc/PID/mem` (the same way USDT
//! semaphores are raised). Switching off at the end: `state = 0`, a last
//! drain, and the file is removed (the process keeps its mapping until it
//! exits, unused).
//!
//! The ring is the traced process's to write, so nothing in it is trusted
//! (docs/threat-model.md): the capacity is ours, the reader's position is
//! ours (the shared `tail` only tells the markers), a head the ring cannot
//! have is a header fault, a record that cannot be the process's is
//! counted corrupt, the file shrunk under us is survived ([`shm_guard`]),
//! and a ring that stays corrupt is switched off, said once.
//!
//! A record becomes a stamp with the same columns a uprobe stamp has: the
//! clock (CLOCK_MONOTONIC), pid, tid, CPU, seq, kind and flags.

use super::{shm_file, shm_guard};
use crate::usdt::{Plan, Site};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use xlap_abi::{xlap_stamp, XLAP_FLAG_FROM_USER, XLAP_FLAG_KIND, XLAP_FLAG_SEQ_VALID};
use xlap_marker::ring::{self, Control, Header, Record};
use xlap_records::run_meta::MarkerRing;

/// Slots per ring: 4 MiB, room for what the markers write between two
/// drains (every 20 ms) at millions of stamps per second.
const CAPACITY: u64 = 1 << 16;
/// A slot reserved but not written for this long belongs to a thread that
/// died between the two steps: it is skipped and counted lost.
const STUCK_AFTER: Duration = Duration::from_millis(200);
/// A ring whose header was found impossible this often is switched off.
const HEADER_FAULTS_TOLERATED: u64 = 8;
/// A ring with this many corrupt records, and more of them than good
/// ones, is switched off.
const CORRUPT_TOLERATED: u64 = 1024;
/// Distinct pids a ring's records are checked against /proc for.
const PIDS_CACHED: usize = 1024;

/// What one site's records become.
#[derive(Clone, Copy)]
struct SiteInfo {
    point: u16,
    has_kind: bool,
}

struct AppRing {
    pid: u32,
    /// The process's memory (`/proc/PID/mem`) as it was when the ring was
    /// switched on: bound to that image, not to the pid.
    mem: std::fs::File,
    /// The binary whose markers write it.
    path: PathBuf,
    control: u64,
    /// The process's /dev/shm (held open: the file is removed there at the
    /// end, also when the process, and so its /proc/PID/root, is gone).
    dir: std::os::fd::OwnedFd,
    leaf: std::ffi::CString,
    map: *mut u8,
    len: usize,
    /// The mapping survives the file being shrunk (then it reads zeros).
    guard: shm_guard::Guarded,
    sites: HashMap<u64, SiteInfo>,
    /// The next slot to read: ours, whatever the shared header says.
    tail: u64,
    stuck_since: Option<Instant>,
    /// Whether a record's pid is the process or one it forked (cached).
    pids: HashMap<u32, bool>,
    /// The cgroup id of each process seen writing (the stamps' scope: the
    /// ring has none, the BPF markers read theirs at the stamp). Read at a
    /// process's first record: a process moved to another cgroup later
    /// keeps its first one here. Its keys are `pids`' (bounded as those).
    cgroups: HashMap<u32, u64>,
    report: MarkerRing,
}

/// The rings of a run.
#[derive(Default)]
pub struct AppRings {
    rings: Vec<AppRing>,
}

/// Counts at the end of a run.
#[derive(Default, Debug, Clone)]
pub struct RingLosses {
    /// Stamps the markers could not write (the ring was full).
    pub full: u64,
    /// Records refused (corrupt, or never completed).
    pub skipped: u64,
    /// Per ring, for run.json.
    pub rings: Vec<MarkerRing>,
}

impl AppRings {
    /// Switches the processes of `sites` that have a ring control in
    /// `plan` to the in-process path. Returns the sites left to uprobes: a
    /// process whose ring cannot be set up keeps uprobes (`note` says why).
    pub fn add(&mut self, plan: &Plan, sites: &[Site], note: impl Fn(String)) -> Vec<Site> {
        // One ring per switch: per process and binary.
        let mut by_switch: BTreeMap<(u32, PathBuf), HashMap<u64, SiteInfo>> = BTreeMap::new();
        let mut uprobe_sites = Vec::new();
        for site in sites {
            let key = (site.pid, site.path.clone());
            match (plan.ring_controls.get(&key), site.runtime_addr) {
                (Some(_), Some(addr)) => {
                    by_switch.entry(key).or_default().insert(
                        addr,
                        SiteInfo {
                            point: site.spec.point,
                            has_kind: site.spec.kind.kind != 0,
                        },
                    );
                }
                _ => uprobe_sites.push(site.clone()),
            }
        }
        for ((pid, path), infos) in by_switch {
            let control = plan.ring_controls[&(pid, path.clone())];
            match AppRing::create(pid, &path, control, infos) {
                Ok(ring) => self.rings.push(ring),
                Err(e) => {
                    note(format!(
                        "pid {pid}: the markers of {} are stamped by uprobes (slower), the in-process ring failed: {e:#}",
                        path.display()
                    ));
                    uprobe_sites.extend(
                        sites
                            .iter()
                            .filter(|s| s.pid == pid && s.path == path)
                            .cloned(),
                    );
                }
            }
        }
        uprobe_sites
    }

    /// The sites (process, binary) on the in-process path.
    pub fn sites(&self) -> Vec<(u32, PathBuf)> {
        self.rings.iter().map(|r| (r.pid, r.path.clone())).collect()
    }

    /// Hands every complete record to `take`, in ring order.
    pub fn drain(&mut self, mut take: impl FnMut(&xlap_stamp)) {
        for r in &mut self.rings {
            r.drain(&mut take);
        }
    }

    /// Switches the markers off, reads what is left, removes the files.
    pub fn close(mut self, mut take: impl FnMut(&xlap_stamp)) -> RingLosses {
        for r in &self.rings {
            r.switch_off();
        }
        // A marker that saw state = 1 just before may still be writing.
        std::thread::sleep(Duration::from_millis(5));
        let mut losses = RingLosses::default();
        for r in &mut self.rings {
            r.drain(&mut take);
            r.stuck_since = Some(Instant::now() - STUCK_AFTER);
            r.drain(&mut take); // skips a slot a dead thread left reserved
                                // The markers' own count of what a full ring made them drop:
                                // taken only from a ring that never showed corruption (the
                                // process could say anything), and said per ring.
            r.report.full = r.header().dropped.load(Ordering::Relaxed);
            if r.report.corrupt == 0 && r.report.header_faults == 0 && !r.guard.faulted() {
                losses.full = losses.full.saturating_add(r.report.full);
            }
            losses.skipped += r.report.corrupt;
            losses.rings.push(r.report.clone());
        }
        losses
    }
}
fn state_offset() -> u64 {
    std::mem::offset_of!(Control, state) as u64
}

/// `/proc/PID/mem` access with the address in the error.
fn write_mem(mem: &std::fs::File, addr: u64, bytes: &[u8]) -> Result<()> {
    mem.write_all_at(bytes, addr)
        .with_context(|| format!("cannot write the process's memory at {addr:#x}"))
}

fn read_mem(mem: &std::fs::File, addr: u64, bytes: &mut [u8]) -> Result<()> {
    mem.read_exact_at(bytes, addr)
        .with_context(|| format!("cannot read the process's memory at {addr:#x}"))
}

impl AppRing {
    fn create(
        pid: u32,
        binary: &std::path::Path,
        control: u64,
        sites: HashMap<u64, SiteInfo>,
    ) -> Result<AppRing> {
        let leaf = shm_file::ring_name()?;
        let name = format!("/dev/shm/{leaf}");
        if name.len() >= ring::PATH_BYTES {
            anyhow::bail!("ring path {name} too long");
        }
        let leaf = std::ffi::CString::new(leaf)?;
        let dir = shm_file::open_shm_dir(pid)?;
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .with_context(|| format!("cannot open the memory of pid {pid}"))?;
        let creds = shm_file::creds_of(pid)?;
        let len = ring::file_bytes(CAPACITY);
        let file = shm_file::as_creds(&creds, || {
            shm_file::sweep_dead_rings(&dir);
            shm_file::create_exclusive(&dir, &leaf, len as u64)
        })?;
        // SAFETY: a shared mapping of a file we sized; unmapped on drop.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            shm_file::remove(&dir, &leaf);
            return Err(std::io::Error::last_os_error()).context("cannot map the marker ring");
        }
        let Some(guard) = shm_guard::register(map as *mut u8, len) else {
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(map, len) };
            shm_file::remove(&dir, &leaf);
            anyhow::bail!("too many marker rings in one recording");
        };
        let r = AppRing {
            pid,
            mem,
            path: binary.to_path_buf(),
            control,
            dir,
            leaf,
            map: map as *mut u8,
            len,
            guard,
            sites,
            tail: 0,
            stuck_since: None,
            pids: HashMap::new(),
            cgroups: HashMap::new(),
            report: MarkerRing {
                pid,
                binary: binary.display().to_string(),
                ..MarkerRing::default()
            },
        };
        // SAFETY: the mapping is large enough and page aligned (nobody
        // else has the file yet).
        unsafe { std::ptr::write(r.map as *mut Header, Header::new(CAPACITY)) };
        // Path and generation first, the switch last: a marker that sees
        // state = 1 finds the path of this ring.
        let mut path = [0u8; ring::PATH_BYTES];
        path[..name.len()].copy_from_slice(name.as_bytes());
        let mut generation = [0u8; 4];
        let gen_at = control + std::mem::offset_of!(Control, generation) as u64;
        read_mem(&r.mem, gen_at, &mut generation)?;
        let generation = u32::from_ne_bytes(generation).wrapping_add(1);
        write_mem(
            &r.mem,
            control + std::mem::offset_of!(Control, path) as u64,
            &path,
        )?;
        write_mem(&r.mem, gen_at, &generation.to_ne_bytes())?;
        write_mem(&r.mem, control + state_offset(), &1u32.to_ne_bytes())?;
        Ok(r)
    }

    /// Markers of the process stop writing (if it still runs). Through the
    /// memory opened when the ring was switched on: a process that exec'd
    /// since, or a pid reused by another, is not written to.
    fn switch_off(&self) {
        let _ = self
            .mem
            .write_all_at(&0u32.to_ne_bytes(), self.control + state_offset());
    }

    /// Stops reading a ring the process keeps corrupting (said once).
    fn give_up(&mut self, why: &str) {
        if self.report.switched_off.is_some() {
            return;
        }
        self.switch_off();
        eprintln!(
            "xlap-trace: warning: pid {}: the marker ring of {} is switched off: {why}; its later app stamps are missing (run.json: marker_rings)",
            self.pid,
            self.path.display()
        );
        self.report.switched_off = Some(why.to_string());
    }

    fn header(&self) -> &Header {
        // SAFETY: written in create, lives as long as the mapping (which
        // the guard keeps readable even if the file shrinks).
        unsafe { &*(self.map as *const Header) }
    }

    fn drain(&mut self, take: &mut impl FnMut(&xlap_stamp)) {
        if self.report.switched_off.is_some() {
            return;
        }
        // SAFETY: as in header() (not borrowed from self: the loop updates
        // self's counters).
        let h: &Header = unsafe { &*(self.map as *const Header) };
        loop {
            if self.guard.faulted() {
                self.give_up("its file was shrunk under the reader");
                return;
            }
            let head = h.head.load(Ordering::Acquire);
            let pending = head.wrapping_sub(self.tail);
            if pending == 0 {
                self.stuck_since = None;
                break;
            }
            if pending > CAPACITY {
                // Behind the reader, or more than a ring ahead: not a head
                // the markers can have written. Nothing between is read.
                self.report.header_faults += 1;
                self.tail = head;
                h.tail.store(self.tail, Ordering::Release);
                if self.report.header_faults >= HEADER_FAULTS_TOLERATED {
                    self.give_up("its header keeps being overwritten");
                }
                return;
            }
            // The slot index from our capacity: always inside the mapping.
            let slot = (self.tail & (CAPACITY - 1)) as usize;
            // SAFETY: slot < CAPACITY records after RECORDS_OFFSET, all
            // inside the mapping of file_bytes(CAPACITY).
            let rec =
                unsafe { &*((self.map.add(ring::RECORDS_OFFSET) as *const Record).add(slot)) };
            if rec.commit.load(Ordering::Acquire) != self.tail.wrapping_add(1) {
                // Reserved, not written yet: wait, unless for too long.
                let since = *self.stuck_since.get_or_insert_with(Instant::now);
                if since.elapsed() < STUCK_AFTER {
                    break;
                }
                self.report.corrupt += 1;
            } else {
                self.stuck_since = None;
                match self.stamp_of(rec) {
                    Some(stamp) => {
                        self.report.records += 1;
                        take(&stamp);
                    }
                    None => self.report.corrupt += 1,
                }
            }
            self.tail = self.tail.wrapping_add(1);
            h.tail.store(self.tail, Ordering::Release);
        }
        if self.report.corrupt >= CORRUPT_TOLERATED && self.report.corrupt > self.report.records {
            self.give_up("most of its records are corrupt");
        }
    }

    /// Whether `pid` is a process this one forked (cached; forged pids
    /// cannot grow the cache, or the /proc reads, without bound).
    fn is_child(&mut self, pid: u32) -> bool {
        if let Some(&known) = self.pids.get(&pid) {
            return known;
        }
        if self.pids.len() >= PIDS_CACHED {
            return false;
        }
        let child = crate::targets::descends_from(pid, self.pid);
        self.pids.insert(pid, child);
        child
    }

    /// The stamp of a complete record, if it can be one of this process's.
    fn stamp_of(&mut self, rec: &Record) -> Option<xlap_stamp> {
        // Copied once: the process may change the slot while we look.
        // SAFETY: plain reads of fields inside the mapping.
        let (ts_ns, site, seq, kind, pid, tid, cpu) = unsafe {
            (
                std::ptr::read_volatile(&rec.ts_ns),
                std::ptr::read_volatile(&rec.site),
                std::ptr::read_volatile(&rec.seq),
                std::ptr::read_volatile(&rec.kind),
                std::ptr::read_volatile(&rec.pid),
                std::ptr::read_volatile(&rec.tid),
                std::ptr::read_volatile(&rec.cpu),
            )
        };
        let info = *self.sites.get(&site)?;
        if info.has_kind && u32::try_from(kind).is_err() {
            return None;
        }
        if pid != self.pid && !self.is_child(pid) {
            return None;
        }
        let scope = *self
            .cgroups
            .entry(pid)
            .or_insert_with(|| crate::cgroup_names::cgroup_id_of(pid).unwrap_or(0));
        let mut s = stamp(ts_ns, seq, kind, pid, tid, u16::try_from(cpu).ok()?, &info);
        s.scope = scope;
        Some(s)
    }
}

fn stamp(
    ts_ns: u64,
    seq: i64,
    kind: i64,
    pid: u32,
    tid: u32,
    cpu: u16,
    site: &SiteInfo,
) -> xlap_stamp {
    let mut flags = (XLAP_FLAG_SEQ_VALID | XLAP_FLAG_FROM_USER) as u8;
    if site.has_kind {
        flags |= XLAP_FLAG_KIND as u8;
    }
    xlap_stamp {
        ts_ns,
        seq: seq as u64,
        pid,
        tid,
        point: site.point,
        cpu,
        flags,
        kind: kind as u32,
        ..Default::default()
    }
}

impl Drop for AppRing {
    fn drop(&mut self) {
        self.switch_off();
        // SAFETY: our own mapping (its guard slot is released after).
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.len) };
        shm_file::remove(&self.dir, &self.leaf);
    }
}
