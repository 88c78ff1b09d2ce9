//! Closing uprobes without making the run, or the job, wait for them.
//!
//! Closing a uprobe's perf event waits for RCU grace periods under the
//! kernel's `event_mutex` (`perf_uprobe_destroy`): about 60 ms each here,
//! one after another machine-wide, whatever thread closes them. A job that
//! started 300 processes kept `run` closing for three minutes after it
//! ended. So the uprobes of processes that exit are closed one at a time
//! by a thread while the run goes on, and what is left when the run
//! directory is written is handed to a child process that closes it after
//! the recorder has exited: the recorder's own close of each is then only
//! a reference dropped. The loader hooks are one per loader file, not per
//! process (markers.rs), so a job without markers leaves next to nothing.

use aya::programs::uprobe::UProbeLink;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The name the background closer shows in `ps`.
const CLOSER_NAME: &[u8] = b"xlap-closer\0";

#[derive(Default)]
pub struct UprobeCloser {
    queue: Arc<Mutex<VecDeque<UProbeLink>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UprobeCloser {
    /// Queues `links` to be closed by the run's closing thread.
    pub fn close(&mut self, links: Vec<UProbeLink>) {
        if links.is_empty() {
            return;
        }
        lock(&self.queue).extend(links);
        if self.thread.is_none() {
            let (queue, stop) = (self.queue.clone(), self.stop.clone());
            self.thread = std::thread::Builder::new()
                .name("uprobe-close".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let next = lock(&queue).pop_front();
                        match next {
                            Some(link) => drop(link),
                            None => std::thread::sleep(std::time::Duration::from_millis(50)),
                        }
                    }
                })
                .ok();
        }
    }

    /// The run directory is written: the closing thread stops after the
    /// close it is in, and every uprobe left goes to a child that closes
    /// them once this process has exited. Returns how many it took and
    /// the child's pid.
    pub fn hand_over(&mut self) -> Option<(usize, u32)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let links: Vec<UProbeLink> = lock(&self.queue).drain(..).collect();
        if links.is_empty() {
            return None;
        }
        let count = links.len();
        // Without a child they were closed here, the slow way.
        background_close(links).map(|pid| (count, pid))
    }
}

impl Drop for UprobeCloser {
    fn drop(&mut self) {
        self.hand_over();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forks a child that keeps this process's uprobe links (every BPF link
/// and perf event descriptor open now: the capture's other programs are
/// detached by then) and nothing else, waits for this process to exit (the
/// end of a pipe it holds), and then exits itself, closing them. Returns
/// its pid; `None`, with `links` closed, when it cannot.
fn background_close(links: Vec<UProbeLink>) -> Option<u32> {
    let keep = uprobe_fds();
    if keep.is_empty() {
        return None;
    }
    let mut pipe = [0i32; 2];
    // SAFETY: a two-int array for pipe2 to fill.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let [read_end, write_end] = pipe;
    let max_fd = keep.iter().copied().max().unwrap_or(0).max(read_end);
    // SAFETY: the child only makes system calls (close, setsid, prctl,
    // read, _exit), all async-signal-safe, and allocates nothing: safe in
    // the child of a process with threads.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe {
            close_all_but(&keep, read_end, max_fd);
            libc::setsid();
            libc::prctl(libc::PR_SET_NAME, CLOSER_NAME.as_ptr());
            let mut byte = 0u8;
            // Returns once every write end is closed: the recorder exited.
            while libc::read(read_end, (&mut byte as *mut u8).cast(), 1) != 0 {
                if *libc::__errno_location() != libc::EINTR {
                    break;
                }
            }
            libc::_exit(0);
        }
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(read_end) };
    if pid < 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(write_end) };
        return None;
    }
    // The child holds them now: this drops a reference, it does not wait.
    drop(links);
    // The write end stays open until this process exits (it is close-on-
    // exec, and `run` does not exec).
    Some(pid as u32)
}

/// The descriptors of this process that are BPF links or perf events.
fn uprobe_fds() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut fds: Vec<i32> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            let target = target.to_string_lossy();
            (target == "anon_inode:bpf_link" || target == "anon_inode:[perf_event]").then_some(fd)
        })
        .collect();
    fds.sort_unstable();
    fds
}

/// Closes every descriptor up to `max_fd` but `keep` and `also`, and every
/// one above it.
///
/// # Safety
/// Closes descriptors this process may use: only in the forked child.
unsafe fn close_all_but(keep: &[i32], also: i32, max_fd: i32) {
    for fd in 0..=max_fd {
        if fd != also && keep.binary_search(&fd).is_err() {
            libc::close(fd);
        }
    }
    libc::syscall(libc::SYS_close_range, (max_fd + 1) as u32, u32::MAX, 0u32);
}
