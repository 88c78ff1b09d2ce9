//! Shared mappings a traced process can shrink under us.
//!
//! A marker ring is a file the traced process may write, so it may also
//! `ftruncate` it: the recorder's next read of a page past the new end
//! raises SIGBUS, which would kill the recorder (and lose every other
//! process's stamps with it). This guard is how compositors survive their
//! clients' shared-memory pools: a SIGBUS inside a registered region
//! replaces the whole region with anonymous zero pages (`MAP_FIXED`) and
//! marks it faulted, and the faulting read is retried on the zeros. The
//! owner sees `faulted()` and switches the ring off. A SIGBUS anywhere else
//! goes to the handler that was there before (Rust's stack-overflow guard,
//! or the default: the process dies as it would have).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Regions at once: one per marker ring (a process and binary).
const SLOTS: usize = 256;

struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};
static SLOTS_TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
/// The SIGBUS action before ours (read only after `INSTALL`).
static mut PREVIOUS: Option<libc::sigaction> = None;

/// A registered region; unregisters on drop (the mapping stays the
/// owner's to unmap).
pub struct Guarded {
    slot: usize,
}

impl Guarded {
    /// Whether a SIGBUS replaced the region with zeros.
    pub fn faulted(&self) -> bool {
        SLOTS_TABLE[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let s = &SLOTS_TABLE[self.slot];
        s.len.store(0, Ordering::Release);
        s.start.store(0, Ordering::Release);
        s.faulted.store(false, Ordering::Release);
    }
}

/// Registers `[start, start + len)`, a shared mapping of ours; `None` when
/// every slot is taken (the caller then does not use the mapping).
pub fn register(start: *mut u8, len: usize) -> Option<Guarded> {
    INSTALL.call_once(install);
    for (i, s) in SLOTS_TABLE.iter().enumerate() {
        if s.start
            .compare_exchange(0, start as usize, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.faulted.store(false, Ordering::Release);
            s.len.store(len, Ordering::Release);
            return Some(Guarded { slot: i });
        }
    }
    None
}

fn install() {
    // SAFETY: a zeroed sigaction filled as sigaction(2) expects; PREVIOUS
    // is written once, here, before the handler can run.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        libc::sigemptyset(&mut action.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, &action, &mut old) == 0 {
            PREVIOUS = Some(old);
        }
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &SLOTS_TABLE {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Acquire);
        if start != 0 && addr >= start && addr < start + len {
            // SAFETY: replaces our own registered mapping, whole, with
            // anonymous memory (mmap is a plain system call, safe here).
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                s.faulted.store(true, Ordering::Release);
                return;
            }
        }
    }
    // Not ours: what was there before.
    // SAFETY: PREVIOUS was set before this handler was installed.
    let previous = unsafe { *std::ptr::addr_of!(PREVIOUS) };
    match previous {
        Some(old) if old.sa_sigaction == libc::SIG_IGN => {}
        Some(old) if old.sa_sigaction != libc::SIG_DFL && old.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous SA_SIGINFO handler, called as installed.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(old.sa_sigaction) };
            f(sig, info, ctx);
        }
        Some(old) if old.sa_sigaction != libc::SIG_DFL => {
            // SAFETY: the previous plain handler, called as installed.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(old.sa_sigaction) };
            f(sig);
        }
        _ => {
            // The default: die of the same fault, on return.
            // SAFETY: resets SIGBUS to its default action.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A shared mapping of a file truncated under it: the read that would
    /// have killed the process reads zeros, and the region says it faulted.
    #[test]
    fn a_truncated_mapping_reads_zeros_instead_of_killing() {
        let dir = std::env::temp_dir().join(format!("xlap-shm-guard-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dir)
            .unwrap();
        std::fs::remove_file(&dir).unwrap();
        let len = 4 * 4096;
        file.set_len(len as u64).unwrap();
        // SAFETY: a fresh shared mapping of our file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        // SAFETY: inside the mapping, the file still long enough.
        unsafe { p.add(3 * 4096).write_volatile(7) };
        let guard = register(p, len).expect("a slot");
        assert!(!guard.faulted());
        file.set_len(0).unwrap();
        // SAFETY: inside the mapping; past the file's end now (SIGBUS).
        let v = unsafe { p.add(3 * 4096).read_volatile() };
        assert_eq!(v, 0);
        assert!(guard.faulted());
        drop(guard);
        // SAFETY: our mapping.
        unsafe { libc::munmap(p as *mut libc::c_void, len) };
    }
}
