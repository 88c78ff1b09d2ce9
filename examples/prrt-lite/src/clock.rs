//! The protocol's clock: `CLOCK_MONOTONIC` in nanoseconds, the same clock the
//! kernel's `bpf_ktime_get_ns` reads, so protocol times and tracer stamps of
//! one host compare directly.

use std::time::Duration;

/// Nanoseconds of `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Shrinks this thread's timer slack to 1 ns, so sleeps end within a few
/// microseconds of their deadline instead of the default 50 µs.
pub fn tighten_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Sleeps until the monotonic clock reaches `deadline_ns`, spinning only for
/// the last few microseconds so a periodic sender keeps its schedule without
/// burning a core (call [`tighten_timer_slack`] first).
pub fn sleep_until(deadline_ns: u64) {
    const SPIN_NS: u64 = 15_000;
    loop {
        let now = now_ns();
        if now >= deadline_ns {
            return;
        }
        let left = deadline_ns - now;
        if left > SPIN_NS {
            std::thread::sleep(Duration::from_nanos(left - SPIN_NS));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Busy-waits for `ns` nanoseconds: an injected delay that keeps the thread
/// on its CPU, like real processing would.
pub fn spin_for(ns: u64) {
    let end = now_ns() + ns;
    while now_ns() < end {
        std::hint::spin_loop();
    }
}
