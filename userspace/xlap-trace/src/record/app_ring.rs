//! The in-process path of the app points: for each traced process built with
//! the `xlap-marker` crate (its `xlap_ring:control` note), a shared-memory
//! ring that its markers write and this reader drains, instead of a uprobe
//! per marker hit. The layout is the marker crate's (`xlap_marker::ring`).
//!
//! Switching on: the ring file is created in the process's own view of
//! `/dev/shm` (through `/proc/PID/root`), owned by the process's user, mode
//! 0600; then the path, a new generation and finally `state = 1` are written
//! into the process's control block through `/proc/PID/mem` (the same way
//! USDT semaphores are raised). Switching off at the end: `state = 0`, a last
//! drain, and the file is removed (the process keeps its mapping until it
//! exits, unused).
//!
//! A record becomes a stamp with the same columns a uprobe stamp has: the
//! clock (CLOCK_MONOTONIC), pid, tid, CPU, seq, kind and flags.

use crate::usdt::{Plan, Site};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use xlap_abi::{xlap_stamp, XLAP_FLAG_FROM_USER, XLAP_FLAG_KIND, XLAP_FLAG_SEQ_VALID};
use xlap_marker::ring::{self, Control, Header, Record};

/// Slots per ring: 4 MiB, room for what the markers write between two
/// drains (every 20 ms) at millions of stamps per second.
const CAPACITY: u64 = 1 << 16;
/// A slot reserved but not written for this long belongs to a thread that
/// died between the two steps: it is skipped and counted lost.
const STUCK_AFTER: Duration = Duration::from_millis(200);

/// What one site's records become.
#[derive(Clone, Copy)]
struct SiteInfo {
    point: u16,
    has_kind: bool,
}

struct AppRing {
    pid: u32,
    /// The binary whose markers write it.
    path: PathBuf,
    control: u64,
    /// The process's /dev/shm (held open: the file is removed there at the
    /// end, also when the process, and so its /proc/PID/root, is gone).
    dir: std::os::fd::OwnedFd,
    leaf: std::ffi::CString,
    map: *mut u8,
    len: usize,
    sites: HashMap<u64, SiteInfo>,
    stuck_since: Option<Instant>,
    /// Records skipped: from an unknown site, or a slot never written.
    skipped: u64,
}

/// The rings of a run.
#[derive(Default)]
pub struct AppRings {
    rings: Vec<AppRing>,
}

/// Counts at the end of a run.
#[derive(Default, Debug, Clone, Copy)]
pub struct RingLosses {
    /// Stamps the markers could not write (the ring was full).
    pub full: u64,
    /// Records of unknown sites or never completed.
    pub skipped: u64,
}

impl AppRings {
    /// Switches every process of the plan that has a ring control to the
    /// in-process path. Returns the rings and the sites left to uprobes: a
    /// process whose ring cannot be set up keeps uprobes (`note` says why).
    pub fn open(plan: &Plan, note: impl Fn(String)) -> (AppRings, Vec<Site>) {
        let mut rings = AppRings::default();
        // One ring per switch: per process and binary.
        let mut by_switch: BTreeMap<(u32, PathBuf), HashMap<u64, SiteInfo>> = BTreeMap::new();
        let mut uprobe_sites = Vec::new();
        for site in &plan.sites {
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
        for (index, ((pid, path), sites)) in by_switch.into_iter().enumerate() {
            let control = plan.ring_controls[&(pid, path.clone())];
            match AppRing::create(pid, &path, index, control, sites) {
                Ok(ring) => rings.rings.push(ring),
                Err(e) => {
                    note(format!(
                        "pid {pid}: the markers of {} are stamped by uprobes (slower), the in-process ring failed: {e:#}",
                        path.display()
                    ));
                    uprobe_sites.extend(
                        plan.sites
                            .iter()
                            .filter(|s| s.pid == pid && s.path == path)
                            .cloned(),
                    );
                }
            }
        }
        (rings, uprobe_sites)
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
            losses.full += r.header().dropped.load(Ordering::Relaxed);
            losses.skipped += r.skipped;
        }
        losses
    }
}

fn state_offset() -> u64 {
    std::mem::offset_of!(Control, state) as u64
}

fn write_mem(pid: u32, addr: u64, bytes: &[u8]) -> Result<()> {
    let mem = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .with_context(|| format!("cannot open the memory of pid {pid}"))?;
    mem.write_all_at(bytes, addr)
        .with_context(|| format!("cannot write the memory of pid {pid} at {addr:#x}"))
}

fn read_mem(pid: u32, addr: u64, bytes: &mut [u8]) -> Result<()> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .with_context(|| format!("cannot open the memory of pid {pid}"))?;
    mem.read_exact_at(bytes, addr)
        .with_context(|| format!("cannot read the memory of pid {pid} at {addr:#x}"))
}

/// The effective uid and gid of a process (its ring file is theirs).
fn owner(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(2)?.parse().ok()
    };
    Some((field("Uid:")?, field("Gid:")?))
}

impl AppRing {
    fn create(
        pid: u32,
        binary: &std::path::Path,
        index: usize,
        control: u64,
        sites: HashMap<u64, SiteInfo>,
    ) -> Result<AppRing> {
        let name = format!("/dev/shm/xlap-trace.{}.{pid}.{index}", std::process::id());
        if name.len() >= ring::PATH_BYTES {
            anyhow::bail!("ring path {name} too long");
        }
        let host_path = PathBuf::from(format!("/proc/{pid}/root{name}"));
        let dir_path = std::ffi::CString::new(format!("/proc/{pid}/root/dev/shm"))?;
        // SAFETY: open of a NUL-terminated path; the fd is owned below.
        let dir = unsafe {
            libc::open(
                dir_path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if dir < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot open /dev/shm of pid {pid}"));
        }
        // SAFETY: a fresh fd of ours.
        let dir = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dir) };
        let leaf = std::ffi::CString::new(name.trim_start_matches("/dev/shm/"))?;
        let len = ring::file_bytes(CAPACITY);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&host_path)
            .with_context(|| format!("cannot create {}", host_path.display()))?;
        file.set_len(len as u64)?;
        if let Some((uid, gid)) = owner(pid) {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                .with_context(|| format!("cannot give {} to uid {uid}", host_path.display()))?;
        }
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
            return Err(std::io::Error::last_os_error()).context("cannot map the marker ring");
        }
        let r = AppRing {
            pid,
            path: binary.to_path_buf(),
            control,
            dir,
            leaf,
            map: map as *mut u8,
            len,
            sites,
            stuck_since: None,
            skipped: 0,
        };
        // SAFETY: the mapping is large enough and page aligned.
        unsafe { std::ptr::write(r.map as *mut Header, Header::new(CAPACITY)) };
        // Path and generation first, the switch last: a marker that sees
        // state = 1 finds the path of this ring.
        let mut path = [0u8; ring::PATH_BYTES];
        path[..name.len()].copy_from_slice(name.as_bytes());
        let mut generation = [0u8; 4];
        let gen_at = control + std::mem::offset_of!(Control, generation) as u64;
        read_mem(pid, gen_at, &mut generation)?;
        let generation = u32::from_ne_bytes(generation).wrapping_add(1);
        write_mem(
            pid,
            control + std::mem::offset_of!(Control, path) as u64,
            &path,
        )?;
        write_mem(pid, gen_at, &generation.to_ne_bytes())?;
        write_mem(pid, control + state_offset(), &1u32.to_ne_bytes())?;
        Ok(r)
    }

    /// Markers of the process stop writing (if it still runs).
    fn switch_off(&self) {
        if crate::targets::alive(self.pid) {
            let _ = write_mem(self.pid, self.control + state_offset(), &0u32.to_ne_bytes());
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: written in create, lives as long as the mapping.
        unsafe { &*(self.map as *const Header) }
    }

    fn drain(&mut self, take: &mut impl FnMut(&xlap_stamp)) {
        // SAFETY: written in create, lives as long as the mapping (not
        // borrowed from self: the loop updates self's counters).
        let h: &Header = unsafe { &*(self.map as *const Header) };
        let cap = h.capacity;
        let mut tail = h.tail.load(Ordering::Relaxed);
        let mut skipped = 0;
        loop {
            let head = h.head.load(Ordering::Acquire);
            if tail == head {
                self.stuck_since = None;
                break;
            }
            // SAFETY: slot index masked into the mapped records.
            let rec = unsafe {
                &*((self.map.add(ring::RECORDS_OFFSET) as *const Record)
                    .add((tail & (cap - 1)) as usize))
            };
            if rec.commit.load(Ordering::Acquire) != tail + 1 {
                // Reserved, not written yet: wait, unless for too long.
                let since = *self.stuck_since.get_or_insert_with(Instant::now);
                if since.elapsed() < STUCK_AFTER {
                    break;
                }
                skipped += 1;
            } else {
                self.stuck_since = None;
                match self.sites.get(&rec.site) {
                    Some(site) => take(&stamp_of(rec, site)),
                    None => skipped += 1,
                }
            }
            tail += 1;
            h.tail.store(tail, Ordering::Release);
        }
        self.skipped += skipped;
    }
}

fn stamp_of(rec: &Record, site: &SiteInfo) -> xlap_stamp {
    let mut flags = (XLAP_FLAG_SEQ_VALID | XLAP_FLAG_FROM_USER) as u8;
    if site.has_kind {
        flags |= XLAP_FLAG_KIND as u8;
    }
    xlap_stamp {
        ts_ns: rec.ts_ns,
        seq: rec.seq as u64,
        pid: rec.pid,
        tid: rec.tid,
        point: site.point,
        cpu: rec.cpu as u16,
        flags,
        kind: rec.kind as u32,
        ..Default::default()
    }
}

impl Drop for AppRing {
    fn drop(&mut self) {
        self.switch_off();
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.len) };
        // SAFETY: unlinkat on our directory fd and a NUL-terminated name.
        unsafe {
            libc::unlinkat(
                std::os::fd::AsRawFd::as_raw_fd(&self.dir),
                self.leaf.as_ptr(),
                0,
            )
        };
    }
}
