//! The built-in RTT prober: `xlap-trace probe serve` (a UDP echo responder)
//! and `xlap-trace probe rtt` (timed probes to one responder, every RTT
//! written as JSON for `xlap-trace estimate`).
//!
//! A probe datagram (`--proto xlap-probe` for `record`): byte 0 the kind
//! ([`KIND_PROBE`] from the prober, [`KIND_ECHO`] back from the responder),
//! bytes 1..4 the magic `XLP`, bytes 8..16 the sequence number (u64
//! big-endian), the rest padding up to `--size`.
//!
//! The delay knob `--delay-us D` emulates D of extra software latency per
//! direction on the host that runs it: a busy wait of D before every send
//! and after every receive, in both roles, so every RTT through that host
//! grows by 2·D and the host's t (estimate's model) by D. Both roles fire
//! the markers `xlap:send_start` (before the wait and the send) and
//! `xlap:deliver` (after the receive and the wait), so a traced run's
//! `sender_total_ns` and `receiver_total_ns` include the delay as the RTT
//! does.

pub mod rtt;
pub mod serve;

use std::time::{Duration, Instant};

/// Kind byte of a probe (prober → responder).
pub const KIND_PROBE: u8 = 1;
/// Kind byte of an echo (responder → prober).
pub const KIND_ECHO: u8 = 2;
/// Bytes 1..4 of every probe datagram.
pub const MAGIC: &[u8; 3] = b"XLP";
/// Where the sequence number is (u64 big-endian).
pub const SEQ_OFFSET: usize = 8;
/// The smallest datagram: kind, magic, padding, seq.
pub const MIN_SIZE: usize = SEQ_OFFSET + 8;
/// `format` of the JSON `probe rtt` writes.
pub const FORMAT: &str = "xlap-probe-rtt";
/// Its version.
pub const FORMAT_VERSION: u32 = 1;

/// How `probe serve` answers.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address and UDP port to answer on.
    pub bind: std::net::SocketAddr,
    /// Emulated extra software latency of this host per direction: a busy
    /// wait of this many microseconds after every receive and before every
    /// send.
    pub delay_us: u64,
    /// Stop after this many seconds.
    pub duration: Option<f64>,
    /// Write this file (with our pid) once the socket is bound.
    pub ready_file: Option<std::path::PathBuf>,
}

/// How `probe rtt` probes.
#[derive(Debug, Clone)]
pub struct RttOptions {
    /// The responder (`probe serve --bind`).
    pub to: std::net::SocketAddr,
    /// Local address to send from (default: any, port chosen by the kernel).
    pub bind: Option<std::net::SocketAddr>,
    /// Name of this host in the estimate.
    pub name_from: String,
    /// Name of the responder's host in the estimate.
    pub name_to: String,
    /// Probes to record (after the warm-up).
    pub count: u64,
    /// Interval between the starts of consecutive probes, microseconds (a
    /// probe whose echo comes later starts the next one at once).
    pub interval_us: u64,
    /// Emulated extra software latency of this host per direction (see
    /// `probe serve --delay-us`).
    pub delay_us: u64,
    /// An echo later than this counts the probe as lost.
    pub timeout_ms: u64,
    /// Probes sent first and not recorded (neighbour resolution, cold
    /// caches).
    pub warmup: u64,
    /// Sequence number of the first probe (the warm-up's included): give
    /// concurrent probers of one traced run distinct ranges.
    pub first_seq: u64,
    /// Datagram size in bytes (at least 16).
    pub size: usize,
    /// Wait for this file to exist before the first probe (a tracer can
    /// attach first).
    pub start_file: Option<std::path::PathBuf>,
    /// The JSON file to write.
    pub out: std::path::PathBuf,
}

/// What `probe rtt` writes: one pair's RTTs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RttFile {
    pub format: String,
    pub format_version: u32,
    /// The prober's host name.
    pub from: String,
    /// The responder's host name.
    pub to: String,
    /// Every recorded RTT in nanoseconds, in the order sent.
    pub samples_ns: Vec<u64>,
    /// The sequence number of each sample.
    pub seqs: Vec<u64>,
    /// Recorded probes without an echo within the timeout.
    pub lost: u64,
    /// Echoes that came after their probe's timeout (ignored).
    pub late: u64,
    /// What the delay knob's busy waits took, summed over the recorded
    /// probes (two per RTT on this host): at least 2·count·delay_us, more
    /// when the host was preempted at a wait's end. Absent without a delay
    /// (and in files of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_spent_ns: Option<u64>,
    pub settings: RttSettings,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RttSettings {
    pub to: String,
    pub local: String,
    pub count: u64,
    pub interval_us: u64,
    pub delay_us: u64,
    pub timeout_ms: u64,
    pub warmup: u64,
    pub first_seq: u64,
    pub size: usize,
    /// The clock of the samples.
    pub clock: String,
}

/// Spins until `until`: a delay that keeps the thread on its CPU, as
/// software doing work would (a sleep would add a wake-up instead).
pub fn spin_until(until: Instant) {
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// [`spin_until`] `now + us`; the time it took (zero for no delay), so a
/// run can say what its delay really was.
pub fn spin_us(us: u64) -> Duration {
    if us == 0 {
        return Duration::ZERO;
    }
    let start = Instant::now();
    spin_until(start + Duration::from_micros(us));
    start.elapsed()
}

/// Writes a probe datagram of `kind` and `seq` into `buf` (its whole
/// length).
pub fn encode(buf: &mut [u8], kind: u8, seq: u64) {
    buf.fill(0);
    buf[0] = kind;
    buf[1..4].copy_from_slice(MAGIC);
    buf[SEQ_OFFSET..SEQ_OFFSET + 8].copy_from_slice(&seq.to_be_bytes());
}

/// The kind and seq of a probe datagram; `None` for anything else.
pub fn decode(buf: &[u8]) -> Option<(u8, u64)> {
    if buf.len() < MIN_SIZE || &buf[1..4] != MAGIC {
        return None;
    }
    let seq = u64::from_be_bytes(buf[SEQ_OFFSET..SEQ_OFFSET + 8].try_into().ok()?);
    Some((buf[0], seq))
}

/// An error of a receive that only says no datagram came (yet): its
/// timeout ran out, or a signal interrupted it.
pub(crate) fn no_datagram(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_round_trip_and_strangers_are_refused() {
        let mut buf = [0xffu8; 64];
        encode(&mut buf, KIND_PROBE, 0x0102_0304_0506_0708);
        assert_eq!(decode(&buf), Some((KIND_PROBE, 0x0102_0304_0506_0708)));
        assert_eq!(&buf[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(buf[16..].iter().all(|b| *b == 0));
        assert_eq!(decode(&buf[..15]), None);
        buf[2] = b'?';
        assert_eq!(decode(&buf), None);
        // The preset reads what we write.
        let l = xlap_capture::proto::preset("xlap-probe").unwrap();
        assert_eq!((l.seq_offset as usize, l.seq_size), (SEQ_OFFSET, 8));
        assert_eq!((l.kind_offset, l.kind_size, l.big_endian), (0, 1, true));
    }

    #[test]
    fn the_delay_knob_waits_at_least_its_time() {
        let t = Instant::now();
        let spent = spin_us(300);
        assert!(spent >= Duration::from_micros(300));
        assert!(t.elapsed() >= spent);
        assert_eq!(spin_us(0), Duration::ZERO);
    }
}
