//! `--boundary auto`: the processes held at the connect of a traced UDP
//! socket (bpf/hooks/calls.h, the CONNECTS ring) until the send syscalls'
//! hook is attached. A connected socket's sends name no destination, so
//! only their syscall's entry shows them begin; that hook slows every
//! syscall of the machine, so it waits for the first such socket. How long
//! each process was held is counted in run.json (`holds.at_connect`).

use crate::capture::Capture;
use aya::maps::{MapData, RingBuf};
use xlap_abi::{xlap_hold, xlap_hold_why};
use xlap_records::run_meta::Holds;

/// The ring of held connects; dropped (the run ended, or failed), it
/// resumes every process still waiting in it: none stays stopped.
pub struct ConnectHolds {
    ring: Option<RingBuf<MapData>>,
}

impl ConnectHolds {
    /// Takes the ring when the capture holds connects.
    pub fn start(capture: &mut Capture) -> anyhow::Result<ConnectHolds> {
        Ok(ConnectHolds {
            ring: capture.take_connects()?,
        })
    }

    /// The fd to poll for held processes (none when not holding).
    pub fn fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.ring.as_ref().map(|r| r.as_raw_fd())
    }

    /// Attaches the send syscalls' hook for the processes held since the
    /// last call, and resumes them; counts them in `holds` (a hold the
    /// kernel would not stop ran on: its first sends may lack send_enter,
    /// counted lost). Returns how many were held.
    pub fn serve(&mut self, capture: &mut Capture, holds: &mut Holds) -> anyhow::Result<u64> {
        let mut served = 0;
        for hold in self.take() {
            if hold.why != xlap_hold_why::XLAP_HOLD_CONNECT {
                continue;
            }
            let pid = hold.pid;
            capture.hook_send_syscalls(&format!(
                "pid {pid} ({}) connected a traced UDP socket",
                crate::targets::comm(pid)
            ))?;
            served += 1;
            holds.at_connect += 1;
            if hold.stop != 0 {
                holds.not_stopped += 1;
                continue;
            }
            // SAFETY: SIGCONT to the process the BPF side stopped (a pid
            // that exited since may name another process: SIGCONT ends
            // nothing, and one not stopped ignores it).
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            let now = crate::runmeta::read_clock(libc::CLOCK_MONOTONIC);
            let held_us = now.saturating_sub(hold.ts_ns) as f64 / 1e3;
            holds.held_us_total += held_us;
            holds.held_us_max = holds.held_us_max.max(held_us);
        }
        Ok(served)
    }

    fn take(&mut self) -> Vec<xlap_hold> {
        let mut held = Vec::new();
        let Some(ring) = self.ring.as_mut() else {
            return held;
        };
        while let Some(item) = ring.next() {
            if item.len() >= std::mem::size_of::<xlap_hold>() {
                // SAFETY: a plain C struct of integers, length checked;
                // read unaligned whatever the record's alignment.
                held.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<xlap_hold>()) });
            }
        }
        held
    }
}

impl Drop for ConnectHolds {
    fn drop(&mut self) {
        for hold in self.take() {
            if hold.stop == 0 {
                // SAFETY: SIGCONT to a process the BPF side stopped.
                unsafe { libc::kill(hold.pid as i32, libc::SIGCONT) };
            }
        }
    }
}
