//! The ring-buffer reader's CPU priority: background by default, raised
//! when it falls behind (by itself or by a watchdog), and its CPU time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The reader's CPU priority. It runs as a background task (SCHED_BATCH,
/// nice 19): on a busy machine the traced protocol keeps the CPU and the
/// reader catches up in its gaps, the ring buffer absorbing the wait. When
/// the traced processes leave it no gaps it takes normal priority (nice 0)
/// until it has kept up for a second, rather than let the buffer overflow:
/// raised by itself when one drain finds a quarter of the buffer full, or
/// by a watchdog thread (normal priority) when the reader has not emptied
/// the buffer for 50 ms, which a starved reader cannot notice itself. The
/// watchdog sleeps until that moment, 50 ms after the reader last caught
/// up (at least 10 ms at a time), so a reader that keeps up wakes it about
/// every 50 ms, not every 10. Whatever the buffer cannot hold is counted
/// as lost, never silently dropped.
pub struct ReaderPriority {
    ring_bytes: usize,
    shared: Arc<PriorityShared>,
    calm_since: Instant,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

struct PriorityShared {
    tid: libc::pid_t,
    epoch: Instant,
    background: AtomicBool,
    /// Milliseconds since `epoch` when the reader last emptied the buffer.
    caught_up_ms: std::sync::atomic::AtomicU64,
    stop: AtomicBool,
}

impl PriorityShared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// The watchdog's shortest sleep.
const WATCHDOG_AT_LEAST: Duration = Duration::from_millis(10);
const STARVED_AFTER_MS: u64 = 50;

impl ReaderPriority {
    pub fn background(ring_bytes: u32) -> ReaderPriority {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
        let shared = Arc::new(PriorityShared {
            tid,
            epoch: Instant::now(),
            background: AtomicBool::new(true),
            caught_up_ms: Default::default(),
            stop: AtomicBool::new(false),
        });
        let watched = shared.clone();
        let watchdog = std::thread::Builder::new()
            .name("reader-watchdog".into())
            .spawn(move || {
                while !watched.stop.load(Ordering::Relaxed) {
                    let starved_at =
                        watched.caught_up_ms.load(Ordering::Relaxed) + STARVED_AFTER_MS;
                    let now = watched.now_ms();
                    if now <= starved_at {
                        let until = Duration::from_millis(starved_at - now + 1);
                        std::thread::sleep(until.max(WATCHDOG_AT_LEAST));
                        continue;
                    }
                    if watched.background.swap(false, Ordering::Relaxed) {
                        set_priority(watched.tid, false);
                    }
                    std::thread::sleep(WATCHDOG_AT_LEAST);
                }
            })
            .ok();
        set_priority(tid, true);
        ReaderPriority {
            ring_bytes: ring_bytes as usize,
            shared,
            calm_since: Instant::now(),
            watchdog,
        }
    }

    /// The reader found the buffer empty.
    pub fn caught_up(&self) {
        self.shared
            .caught_up_ms
            .store(self.shared.now_ms(), Ordering::Relaxed);
    }

    /// After a drain of `drained` bytes.
    pub fn adjust(&mut self, drained: usize) {
        let background = self.shared.background.load(Ordering::Relaxed);
        if drained >= self.ring_bytes / 4 {
            self.calm_since = Instant::now();
            if self.shared.background.swap(false, Ordering::Relaxed) {
                set_priority(self.shared.tid, false);
            }
        } else if drained >= self.ring_bytes / 16 {
            self.calm_since = Instant::now();
        } else if !background && self.calm_since.elapsed() >= Duration::from_secs(1) {
            self.shared.background.store(true, Ordering::Relaxed);
            set_priority(self.shared.tid, true);
            self.calm_since = Instant::now();
        } else if background {
            self.calm_since = Instant::now();
        }
    }
}

impl Drop for ReaderPriority {
    /// The capture is over: the reader's last work (the final drain, the
    /// Parquet files, the packets) runs at normal priority, or a busy
    /// machine would hold the end of the run for as long as it stays busy
    /// (seen: the qdisc_classes test took 45 s, the time two CPU hogs
    /// beside it ran, instead of 5.5 s).
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
        if self.shared.background.swap(false, Ordering::Relaxed) {
            set_priority(self.shared.tid, false);
        }
    }
}

/// CPU seconds (user + system) of the calling thread.
pub fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The calling thread runs only on a CPU nothing else wants (SCHED_IDLE):
/// work that may wait for the reader and the traced processes.
pub fn idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain syscall on this thread; failure leaves its priority.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
}

/// The calling thread back at normal priority (SCHED_OTHER, nice 0; from
/// SCHED_IDLE this needs CAP_SYS_NICE, which the recorder keeps).
pub fn normal_priority() {
    // SAFETY: gettid has no preconditions.
    set_priority(unsafe { libc::gettid() }, false);
}

/// Background (SCHED_BATCH, nice 19) or normal priority for thread `tid`.
fn set_priority(tid: libc::pid_t, background: bool) {
    let param = libc::sched_param { sched_priority: 0 };
    let (policy, nice) = if background {
        (libc::SCHED_BATCH, 19)
    } else {
        (libc::SCHED_OTHER, 0)
    };
    // SAFETY: plain syscalls on this thread with valid arguments; failure
    // leaves the previous priority, which is harmless.
    unsafe {
        libc::sched_setscheduler(tid, policy, &param);
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (policy, nice) of the calling thread.
    fn own_priority() -> (i32, i32) {
        // SAFETY: plain queries of the calling thread (0); getpriority's -1
        // is a valid nice here, errno is not needed.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            (
                libc::sched_getscheduler(0),
                libc::getpriority(libc::PRIO_PROCESS, tid),
            )
        }
    }

    #[test]
    fn the_reader_runs_in_the_background_and_ends_at_normal_priority() {
        // A thread of its own: priorities are per thread.
        std::thread::spawn(|| {
            let p = ReaderPriority::background(1 << 20);
            assert_eq!(own_priority(), (libc::SCHED_BATCH, 19));
            drop(p);
            // Back from nice 19 needs CAP_SYS_NICE (root here and in CI).
            // SAFETY: geteuid cannot fail.
            if unsafe { libc::geteuid() } == 0 {
                assert_eq!(own_priority(), (libc::SCHED_OTHER, 0));
            }
        })
        .join()
        .unwrap();
    }
}
