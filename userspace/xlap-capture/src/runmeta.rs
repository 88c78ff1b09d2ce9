//! `run.json`'s content read from this host: clocks, the kernel, the
//! recorder's own process. The file's declaration is
//! `xlap_records::run_meta`, shared with the readers.

pub use xlap_records::run_meta::*;

/// One clock's time now, ns.
pub fn read_clock(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The tightest of a few simultaneous readings of the clocks.
pub fn sample_clocks() -> ClockPair {
    (0..5)
        .map(|_| {
            let r0 = read_clock(libc::CLOCK_REALTIME);
            let t0 = read_clock(libc::CLOCK_TAI);
            let m = read_clock(libc::CLOCK_MONOTONIC);
            let t1 = read_clock(libc::CLOCK_TAI);
            let r1 = read_clock(libc::CLOCK_REALTIME);
            ClockPair {
                monotonic_ns: m,
                realtime_ns: r0 / 2 + r1 / 2,
                tai_ns: t0 / 2 + t1 / 2,
                spread_ns: r1 - r0,
            }
        })
        .min_by_key(|p| p.spread_ns)
        .expect("five samples")
}

/// This process, as run.json's `recorder`.
pub fn this_recorder() -> Recorder {
    let pid = std::process::id();
    Recorder {
        pid,
        start_ticks: process_start_ticks(pid).unwrap_or(0),
    }
}

/// Field 22 of /proc/PID/stat (after the parenthesised command, which may
/// itself hold spaces and parentheses).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    start_ticks_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn start_ticks_of(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the command: state is field 3, start time 22.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The kernel's clock discipline state (adjtimex).
pub fn clock_sync() -> ClockSync {
    // SAFETY: modes = 0 only reads the kernel's clock state into `tx`.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut tx) };
    ClockSync {
        synchronized: state >= 0 && state != libc::TIME_ERROR && tx.status & libc::STA_UNSYNC == 0,
        maxerror_us: tx.maxerror,
        esterror_us: tx.esterror,
    }
}

pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    /// A command may hold spaces and parentheses: fields count from the
    /// last ')'.
    #[test]
    fn start_time_is_field_22_after_any_command() {
        let stat =
            "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(super::start_ticks_of(stat), Some(987654));
        assert_eq!(super::start_ticks_of("4242 (x) S 1"), None);
        let own = super::process_start_ticks(std::process::id()).expect("own stat");
        // SAFETY: sysconf reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (own as f64) / hz <= uptime + 1.0,
            "started {own} ticks after boot, uptime {uptime} s"
        );
    }
}
