//! `probe serve`: answer every probe with an echo of the same seq.

use super::{decode, spin_us, ServeOptions, KIND_ECHO, KIND_PROBE};
use anyhow::{Context, Result};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xlap_exit::{failure, Code};

/// How often a blocked receive looks at the stop flag and the duration.
const POLL: Duration = Duration::from_millis(100);

/// What a responder did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub echoed: u64,
    /// Datagrams that were not probes.
    pub ignored: u64,
    /// What the delay knob's busy waits took (two per echo).
    pub delay_spent: Duration,
}

pub fn run(a: &ServeOptions) -> Result<Served> {
    if a.duration.is_some_and(|d| d.is_nan() || d <= 0.0) {
        return Err(failure(Code::Usage, "--duration must be positive"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let sock = UdpSocket::bind(a.bind).with_context(|| format!("cannot bind {}", a.bind))?;
    sock.set_read_timeout(Some(POLL))?;
    if let Some(ready) = &a.ready_file {
        std::fs::write(ready, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write {}", ready.display()))?;
    }
    let end = a
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    let mut served = Served::default();
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) && end.is_none_or(|e| Instant::now() < e) {
        let (n, peer) = match sock.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if super::no_datagram(&e) => continue,
            Err(e) => return Err(e).context("receive"),
        };
        let Some((KIND_PROBE, seq)) = decode(&buf[..n]) else {
            served.ignored += 1;
            continue;
        };
        served.delay_spent += spin_us(a.delay_us);
        xlap_marker::mark!(deliver, seq, KIND_PROBE);
        xlap_marker::mark!(send_start, seq, KIND_ECHO);
        served.delay_spent += spin_us(a.delay_us);
        buf[0] = KIND_ECHO;
        match sock.send_to(&buf[..n], peer) {
            Ok(_) => served.echoed += 1,
            // A prober that went away (ICMP unreachable from an earlier
            // echo): not the responder's failure.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(e).with_context(|| format!("echo to {peer}")),
        }
    }
    Ok(served)
}
