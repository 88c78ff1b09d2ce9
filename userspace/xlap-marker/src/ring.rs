//! The in-process path of the markers: when `xlap-trace` switches it on, a
//! marker writes its stamp into a shared-memory ring that the tracer created
//! and reads, instead of trapping into a uprobe (X-LAP's own approach: a
//! stamp costs a clock read and a few stores, not a kernel entry).
//!
//! How the tracer finds the switch: every `mark!` also writes a USDT note
//! `xlap_ring:control` whose semaphore field is the address of [`CONTROL`]
//! (another provider than `xlap`, so no tool takes it for a marker). The
//! tracer creates the ring file, writes its path and a new generation into
//! the control block through `/proc/PID/mem`, then sets `state`. The next
//! marker maps the file (once per generation) and writes records; the tracer
//! clears `state` at its end. Untraced, a marker costs one load and one
//! predictable branch.
//!
//! This module is the one definition of the ring's layout: `xlap-trace`
//! reads the ring with these types.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// `Header::magic`: "XLAPRNG1".
pub const MAGIC: u64 = u64::from_le_bytes(*b"XLAPRNG1");
/// Bytes of the control block's path field (NUL-terminated).
pub const PATH_BYTES: usize = 112;
/// Where the records start in the ring file.
pub const RECORDS_OFFSET: usize = 256;

/// The switch the tracer sets in the traced process.
#[repr(C)]
pub struct Control {
    /// Non-zero while a tracer reads the ring at `path`.
    pub state: AtomicU32,
    /// Changed by each tracer that sets `path` (a marker remaps on change).
    pub generation: AtomicU32,
    /// The ring file, as the traced process sees it.
    pub path: UnsafeCell<[u8; PATH_BYTES]>,
}

// SAFETY: `path` is written only by the tracer (from outside, while `state`
// is 0) and read under MAP_LOCK by markers.
unsafe impl Sync for Control {}

/// The control block of this process (its address is in every marker's
/// `xlap_ring:control` note).
pub static CONTROL: Control = Control {
    state: AtomicU32::new(0),
    generation: AtomicU32::new(0),
    path: UnsafeCell::new([0; PATH_BYTES]),
};

/// The start of the ring file. Producers (the markers of every thread)
/// reserve slots by compare-and-swap on `head`; the tracer consumes in order
/// and publishes `tail`; a record is complete when its `commit` is its
/// sequence number plus one.
#[repr(C)]
pub struct Header {
    pub magic: u64,
    /// Slots (a power of two).
    pub capacity: u64,
    _pad0: [u64; 6],
    /// The next slot to reserve.
    pub head: AtomicU64,
    _pad1: [u64; 7],
    /// The next slot the tracer reads.
    pub tail: AtomicU64,
    _pad2: [u64; 7],
    /// Stamps not written because the ring was full.
    pub dropped: AtomicU64,
    _pad3: [u64; 7],
}

impl Header {
    /// A header for a ring of `capacity` slots (a power of two).
    pub fn new(capacity: u64) -> Header {
        Header {
            magic: MAGIC,
            capacity,
            _pad0: [0; 6],
            head: AtomicU64::new(0),
            _pad1: [0; 7],
            tail: AtomicU64::new(0),
            _pad2: [0; 7],
            dropped: AtomicU64::new(0),
            _pad3: [0; 7],
        }
    }
}

/// One stamp: the same facts a uprobe stamp has (the clock is
/// CLOCK_MONOTONIC, the BPF clock).
#[repr(C)]
pub struct Record {
    /// Sequence number of the slot plus one once the record is written.
    pub commit: AtomicU64,
    pub ts_ns: u64,
    /// Run-time address of the marker's nop: the tracer maps it to the
    /// marker's note, hence its point.
    pub site: u64,
    pub seq: i64,
    pub kind: i64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    _pad: [u32; 3],
}

/// Bytes of a ring file of `capacity` slots.
pub const fn file_bytes(capacity: u64) -> usize {
    RECORDS_OFFSET + capacity as usize * core::mem::size_of::<Record>()
}

const _: () = assert!(core::mem::size_of::<Header>() <= RECORDS_OFFSET);
const _: () = assert!(core::mem::size_of::<Record>() == 64);

/// The mapped ring and the generation it belongs to.
static MAPPED: AtomicPtr<Header> = AtomicPtr::new(core::ptr::null_mut());
static MAPPED_GENERATION: AtomicU32 = AtomicU32::new(0);
static MAP_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// Bumped in a child after fork, so that threads refresh their ids.
static FORKS: AtomicU32 = AtomicU32::new(0);

std::thread_local! {
    /// (fork count, pid, tid) of this thread.
    static IDS: core::cell::Cell<(u32, u32, u32)> = const { core::cell::Cell::new((u32::MAX, 0, 0)) };
}

extern "C" fn after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

fn ids() -> (u32, u32) {
    let forks = FORKS.load(Ordering::Relaxed);
    IDS.with(|c| {
        let (seen, pid, tid) = c.get();
        if seen == forks {
            return (pid, tid);
        }
        // SAFETY: plain syscalls without arguments.
        let (pid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
        c.set((forks, pid, tid));
        (pid, tid)
    })
}

/// The ring of the current generation, mapped on first use.
fn ring() -> Option<&'static Header> {
    let generation = CONTROL.generation.load(Ordering::Acquire);
    let mapped = MAPPED.load(Ordering::Acquire);
    if !mapped.is_null() && MAPPED_GENERATION.load(Ordering::Acquire) == generation {
        // SAFETY: mappings are never unmapped (a thread may still use an
        // old one), so the pointer stays valid.
        return Some(unsafe { &*mapped });
    }
    let _guard = MAP_LOCK.lock().ok()?;
    if MAPPED_GENERATION.load(Ordering::Acquire) == generation
        && !MAPPED.load(Ordering::Acquire).is_null()
    {
        // SAFETY: as above.
        return Some(unsafe { &*MAPPED.load(Ordering::Acquire) });
    }
    // SAFETY: the tracer wrote the path before raising state; copied out.
    let path = unsafe { *CONTROL.path.get() };
    let header = map(&path)?;
    if MAPPED.load(Ordering::Relaxed).is_null() {
        // SAFETY: registers a plain function.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
    MAPPED.store(header as *const Header as *mut Header, Ordering::Release);
    MAPPED_GENERATION.store(generation, Ordering::Release);
    Some(header)
}

fn map(path: &[u8; PATH_BYTES]) -> Option<&'static Header> {
    if !path.contains(&0) {
        return None;
    }
    // SAFETY: open/fstat/mmap/close on a NUL-terminated path; the mapping
    // is checked for size and magic before use.
    unsafe {
        let fd = libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_RDWR | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        let mut st: libc::stat = core::mem::zeroed();
        let size = if libc::fstat(fd, &mut st) == 0 {
            st.st_size as usize
        } else {
            0
        };
        let p = if size >= RECORDS_OFFSET {
            libc::mmap(
                core::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        libc::close(fd);
        if p == libc::MAP_FAILED {
            return None;
        }
        let header = &*(p as *const Header);
        let cap = header.capacity;
        if header.magic != MAGIC || !cap.is_power_of_two() || file_bytes(cap) > size {
            libc::munmap(p, size);
            return None;
        }
        Some(header)
    }
}

/// Writes one stamp (the marker's slow path, only while traced).
#[cold]
#[inline(never)]
pub fn stamp(site: usize, seq: i64, kind: i64) {
    let mut now: libc::timespec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the vDSO clock into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let ts_ns = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
    let Some(h) = ring() else { return };
    let (pid, tid) = ids();
    // SAFETY: the vDSO getcpu.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as u32;
    let mut at = h.head.load(Ordering::Relaxed);
    loop {
        if at.wrapping_sub(h.tail.load(Ordering::Acquire)) >= h.capacity {
            h.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match h
            .head
            .compare_exchange_weak(at, at + 1, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => break,
            Err(now_at) => at = now_at,
        }
    }
    let slot = (at & (h.capacity - 1)) as usize;
    // SAFETY: the slot lies inside the mapping (checked against the file
    // size at map time) and is ours until we publish `commit`.
    unsafe {
        let base = (h as *const Header as *const u8).add(RECORDS_OFFSET) as *mut Record;
        let r = base.add(slot);
        core::ptr::addr_of_mut!((*r).ts_ns).write(ts_ns);
        core::ptr::addr_of_mut!((*r).site).write(site as u64);
        core::ptr::addr_of_mut!((*r).seq).write(seq);
        core::ptr::addr_of_mut!((*r).kind).write(kind);
        core::ptr::addr_of_mut!((*r).pid).write(pid);
        core::ptr::addr_of_mut!((*r).tid).write(tid);
        core::ptr::addr_of_mut!((*r).cpu).write(cpu);
        (*r).commit.store(at + 1, Ordering::Release);
    }
}
