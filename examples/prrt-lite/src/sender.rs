//! The sending end: an application thread that paces and encodes packets, a
//! transmit thread that sends them, and a thread that reads feedback.
//!
//! Pacing: data packets leave in bursts of `burst` (1 by default), one burst
//! every `burst × period`, the packets of a burst back to back. With
//! `gso = Some(n)` the transmit thread groups each burst's consecutive
//! equal-length packets into UDP GSO sends of up to `n` datagrams (see
//! [`crate::batch`]); a send never spans two bursts, so nothing waits in the
//! batcher for the next burst.

use crate::batch::GsoBatcher;
use crate::clock::{now_ns, sleep_until};
use crate::fec::ParityBuilder;
use crate::inject::{Injections, Stage};
use crate::log::EventLog;
use crate::udp::{self, Ipv6Ext, MAX_SEND_BYTES};
use crate::wire::{Feedback, Header, Kind, HEADER_LEN};
use crate::Markers;
use anyhow::{Context, Result};
use serde_json::json;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct SenderConfig {
    pub dest: SocketAddr,
    pub bind: SocketAddr,
    pub count: u32,
    pub period_ns: u64,
    pub payload_len: usize,
    pub k: u8,
    pub drop_probability: f64,
    pub seed: u64,
    pub inject: Injections,
    pub linger: Duration,
    pub start_file: Option<PathBuf>,
    pub start_timeout: Duration,
    /// Open the socket after the start file, unbound (autobind at connect).
    pub late_socket: bool,
    /// Data packets per burst (sent back to back, one burst per
    /// `burst × period_ns`); 1 paces every packet.
    pub burst: u32,
    /// Datagrams per UDP GSO send at most; `None` sends one per syscall.
    pub gso: Option<u8>,
    /// Batches of up to N datagrams per sendmmsg call.
    pub sendmmsg: Option<u8>,
    /// A sticky IPv6 extension header on every datagram (IPv6 only).
    pub ipv6_ext: Option<Ipv6Ext>,
    /// The call that sends a datagram when neither gso nor sendmmsg batch.
    pub send_call: crate::udp::SendCall,
    /// (destination, local address) of a second path: every datagram is
    /// sent on both.
    pub second_path: Option<(SocketAddr, SocketAddr)>,
    /// SO_PRIORITY of the sockets.
    pub priority: Option<u32>,
}

/// The largest `--payload`: a data packet of [`MAX_SEND_BYTES`].
pub const MAX_PAYLOAD: usize = MAX_SEND_BYTES - HEADER_LEN;

/// When the data packet `seq` is released, relative to the first: bursts of
/// `burst` packets leave together, one burst every `burst × period_ns`.
pub fn release_offset_ns(seq: u32, burst: u32, period_ns: u64) -> u64 {
    let burst = burst.max(1);
    (seq / burst) as u64 * burst as u64 * period_ns
}

/// Deterministic payload of a data packet, so the receiver can check rebuilt
/// packets byte for byte.
pub fn payload_pattern(seq: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq.wrapping_mul(31).wrapping_add(i as u32)) as u8)
        .collect()
}

/// Whether the artificial channel drops this packet: a hash of (seed, kind,
/// seq), so a run is reproducible whatever the thread timing.
pub fn dropped(seed: u64, kind: Kind, seq: u32, probability: f64) -> bool {
    if probability <= 0.0 {
        return false;
    }
    let mut x = seed ^ ((kind as u64) << 40) ^ seq as u64;
    // splitmix64 finaliser
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64 <= probability
}

struct Outgoing {
    kind: Kind,
    seq: u32,
    bytes: Vec<u8>,
}

impl AsRef<[u8]> for Outgoing {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// What the application thread hands the transmit thread.
enum Submitted {
    Packet(Outgoing),
    /// A burst is complete: send what is batched (GSO) now.
    EndOfBurst,
}

pub fn run<M: Markers>(cfg: &SenderConfig, log: &EventLog) -> Result<()> {
    if cfg.late_socket {
        if let Some(start) = &cfg.start_file {
            wait_for_file(start, cfg.start_timeout)?;
        }
    }
    let socket = if cfg.late_socket {
        udp::unbound_socket(cfg.dest).context("cannot open the sender's socket")?
    } else {
        UdpSocket::bind(cfg.bind)
            .with_context(|| format!("cannot bind the sender to {}", cfg.bind))?
    };
    socket
        .connect(cfg.dest)
        .with_context(|| format!("cannot connect the sender to {}", cfg.dest))?;
    // The socket as the kernel knows it: its address and cookie.
    log.record(serde_json::json!({
        "event": "socket", "local": socket.local_addr()?.to_string(),
        "peer": cfg.dest.to_string(), "cookie": udp::cookie(&socket)?, "pid": std::process::id(),
    }));
    let second = match cfg.second_path {
        None => None,
        Some((dest, bind)) => {
            let second = UdpSocket::bind(bind)
                .with_context(|| format!("cannot bind the second path's socket to {bind}"))?;
            second
                .connect(dest)
                .with_context(|| format!("cannot connect the second path's socket to {dest}"))?;
            log.record(serde_json::json!({
                "event": "socket", "local": second.local_addr()?.to_string(), "path": 2,
                "peer": dest.to_string(), "cookie": udp::cookie(&second)?, "pid": std::process::id(),
            }));
            Some(second)
        }
    };
    if let Some(priority) = cfg.priority {
        for s in std::iter::once(&socket).chain(&second) {
            udp::set_priority(s, priority).with_context(|| {
                format!("cannot set SO_PRIORITY {priority:#x} (above 6 it takes CAP_NET_ADMIN)")
            })?;
        }
    }
    if let Some(ext) = cfg.ipv6_ext {
        anyhow::ensure!(
            is_ipv6_destination(cfg.dest),
            "--ipv6-ext needs an IPv6 --dest, got {}",
            cfg.dest
        );
        udp::set_ipv6_extension(&socket, ext).with_context(|| {
            format!(
                "cannot set {} on the sender's socket (it takes CAP_NET_RAW)",
                ext.option_name()
            )
        })?;
    }
    if cfg.gso.is_some() || cfg.burst > 1 || cfg.payload_len > 1400 {
        // Room for a few bursts of the largest datagrams; a smaller buffer
        // only makes sends wait.
        let datagram = HEADER_LEN + 8 + cfg.payload_len;
        udp::ensure_send_buffer(&socket, (4 * cfg.burst as usize * datagram).max(1 << 20));
    }
    if let (Some(start), false) = (&cfg.start_file, cfg.late_socket) {
        wait_for_file(start, cfg.start_timeout)?;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let feedbacks = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel::<Submitted>();

    std::thread::scope(|scope| -> Result<()> {
        let transmit_socket = socket.try_clone()?;
        let transmitter = scope.spawn(|| transmit::<M>(transmit_socket, second, rx, cfg, log));
        let feedback_socket = socket.try_clone()?;
        let (stop_fb, count_fb) = (stop.clone(), feedbacks.clone());
        scope.spawn(move || read_feedback(feedback_socket, &stop_fb, &count_fb, log));

        produce::<M>(cfg, &tx);
        drop(tx);
        let transmitted = transmitter.join().expect("transmit thread panicked")?;
        std::thread::sleep(cfg.linger);
        stop.store(true, Ordering::Relaxed);
        log.record(json!({
            "event": "summary", "role": "sender",
            "data": cfg.count, "parity": transmitted.parity,
            "sent": transmitted.sent, "dropped": transmitted.dropped,
            "feedback_received": feedbacks.load(Ordering::Relaxed),
        }));
        Ok(())
    })
}

/// Whether datagrams to `dest` go out over IPv6 (a v4-mapped address is
/// IPv4 on the wire).
pub fn is_ipv6_destination(dest: SocketAddr) -> bool {
    match dest {
        SocketAddr::V4(_) => false,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_none(),
    }
}

fn wait_for_file(path: &std::path::Path, timeout: Duration) -> Result<()> {
    let start = std::time::Instant::now();
    while !path.exists() {
        if start.elapsed() > timeout {
            anyhow::bail!(
                "start file {} did not appear within {:?}",
                path.display(),
                timeout
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The application thread: paces data, encodes, folds parity, submits.
fn produce<M: Markers>(cfg: &SenderConfig, tx: &mpsc::Sender<Submitted>) {
    crate::clock::tighten_timer_slack();
    let mut parity = ParityBuilder::new(cfg.payload_len);
    let mut block = 0u32;
    let start = now_ns() + 1_000_000;
    for seq in 0..cfg.count {
        sleep_until(start + release_offset_ns(seq, cfg.burst, cfg.period_ns));
        cfg.inject.apply(Stage::Activate, seq);
        let data = Kind::Data as u8;
        M::send_start(seq, data);
        M::encode_start(seq, data);
        let send_time_ns = now_ns();
        let payload = payload_pattern(seq, cfg.payload_len);
        let header = Header {
            kind: Kind::Data,
            payload_len: cfg.payload_len as u16,
            seq,
            send_time_ns,
            block,
            index: parity.covered(),
            k: cfg.k,
        };
        let mut bytes = Vec::with_capacity(HEADER_LEN + cfg.payload_len);
        header.encode(&mut bytes);
        bytes.extend_from_slice(&payload);
        parity.add(send_time_ns, &payload);
        cfg.inject.apply(Stage::Encode, seq);
        M::encode_end(seq, data);
        cfg.inject.apply(Stage::Submit, seq);
        M::submit(seq, data);
        let _ = tx.send(Submitted::Packet(Outgoing {
            kind: Kind::Data,
            seq,
            bytes,
        }));
        if parity.covered() == cfg.k || seq + 1 == cfg.count {
            submit_parity::<M>(cfg, tx, &mut parity, block);
            block += 1;
        }
        if (seq + 1).is_multiple_of(cfg.burst.max(1)) {
            let _ = tx.send(Submitted::EndOfBurst);
        }
    }
}

fn submit_parity<M: Markers>(
    cfg: &SenderConfig,
    tx: &mpsc::Sender<Submitted>,
    parity: &mut ParityBuilder,
    block: u32,
) {
    let kind = Kind::Parity as u8;
    M::send_start(block, kind);
    M::encode_start(block, kind);
    let covered = parity.covered();
    let payload = parity.finish();
    let header = Header {
        kind: Kind::Parity,
        payload_len: payload.len() as u16,
        seq: block,
        send_time_ns: now_ns(),
        block,
        index: covered,
        k: cfg.k,
    };
    let mut bytes = Vec::with_capacity(HEADER_LEN + payload.len());
    header.encode(&mut bytes);
    bytes.extend_from_slice(&payload);
    M::encode_end(block, kind);
    M::submit(block, kind);
    let _ = tx.send(Submitted::Packet(Outgoing {
        kind: Kind::Parity,
        seq: block,
        bytes,
    }));
}

struct Transmitted {
    sent: u64,
    dropped: u64,
    parity: u64,
}

/// The transmit thread: one send syscall per packet (or per GSO batch with
/// `--gso`), unless the artificial channel drops it.
fn transmit<M: Markers>(
    socket: UdpSocket,
    second: Option<UdpSocket>,
    rx: mpsc::Receiver<Submitted>,
    cfg: &SenderConfig,
    log: &EventLog,
) -> Result<Transmitted> {
    let mut stats = Transmitted {
        sent: 0,
        dropped: 0,
        parity: 0,
    };
    let mut gso = cfg.gso.or(cfg.sendmmsg).map(|n| GsoSender {
        batcher: GsoBatcher::new(n as usize, MAX_SEND_BYTES),
        sends: 0,
        mmsg: cfg.sendmmsg.is_some(),
    });
    // sendfile's source (--send-call sendfile).
    let mut file = crate::udp::SendFile::default();
    for submitted in rx {
        let out = match submitted {
            Submitted::Packet(out) => out,
            Submitted::EndOfBurst => {
                if let Some(gso) = &mut gso {
                    gso.flush::<M>(&socket, log);
                }
                continue;
            }
        };
        let kind = out.kind as u8;
        if out.kind == Kind::Parity {
            stats.parity += 1;
        }
        cfg.inject.apply(Stage::Transmit, out.seq);
        let drop_it = dropped(cfg.seed, out.kind, out.seq, cfg.drop_probability);
        // With `t_ns` (after the send) it brackets the datagram's time on the
        // wire: a reader can tell a gap the sender made from one the
        // scheduler made between the send and the log.
        let t_start_ns = now_ns();
        if drop_it {
            stats.dropped += 1;
        } else if let Some(gso) = &mut gso {
            stats.sent += 1;
            for batch in gso.batcher.push(out) {
                gso.send::<M>(&socket, batch, log);
            }
            continue;
        } else if let Some(second) = &second {
            stats.sent += 1;
            send_on_both::<M>([&socket, second], &out, cfg, &mut file, log);
            continue;
        } else {
            M::link_transmit_start(out.seq, kind);
            // A refused datagram (no receiver yet: ECONNREFUSED from an ICMP
            // error) is the channel's loss, not the sender's failure.
            if let Err(e) = crate::udp::send_with(&socket, cfg.send_call, &mut file, &out.bytes) {
                log.record(json!({"event": "send_error", "kind": out.kind, "seq": out.seq, "error": e.to_string()}));
            }
            M::link_transmit_end(out.seq, kind);
            stats.sent += 1;
        }
        log.record(json!({
            "event": "sent", "kind": out.kind, "seq": out.seq,
            "t_start_ns": t_start_ns, "t_ns": now_ns(), "dropped": drop_it,
        }));
    }
    if let Some(gso) = &mut gso {
        gso.flush::<M>(&socket, log);
    }
    Ok(stats)
}

/// Sends a datagram on both paths, path 1 first unless an injected `path1`
/// delay makes path 1's copy leave that long after path 2's. One `sent` line
/// per copy, with its path and the times before and after its send call.
fn send_on_both<M: Markers>(
    sockets: [&UdpSocket; 2],
    out: &Outgoing,
    cfg: &SenderConfig,
    file: &mut crate::udp::SendFile,
    log: &EventLog,
) {
    let late_path1 = cfg.inject.covers(Stage::Path1, out.seq);
    let order = if late_path1 { [2, 1] } else { [1, 2] };
    M::link_transmit_start(out.seq, out.kind as u8);
    for (i, path) in order.into_iter().enumerate() {
        if i == 1 {
            cfg.inject.apply(Stage::Path1, out.seq);
        }
        let t_start_ns = now_ns();
        if let Err(e) = crate::udp::send_with(sockets[path - 1], cfg.send_call, file, &out.bytes) {
            log.record(json!({"event": "send_error", "kind": out.kind, "seq": out.seq, "path": path, "error": e.to_string()}));
        }
        log.record(json!({
            "event": "sent", "kind": out.kind, "seq": out.seq,
            "t_start_ns": t_start_ns, "t_ns": now_ns(), "dropped": false, "path": path,
        }));
    }
    M::link_transmit_end(out.seq, out.kind as u8);
}

/// The transmit thread's UDP GSO state: the batch being filled and the
/// number of sends so far (a send's index is its `gso_batch`).
struct GsoSender {
    batcher: GsoBatcher<Outgoing>,
    sends: u64,
    /// One sendmmsg per batch (a message per datagram) instead of GSO.
    mmsg: bool,
}

impl GsoSender {
    fn flush<M: Markers>(&mut self, socket: &UdpSocket, log: &EventLog) {
        if let Some(batch) = self.batcher.take() {
            self.send::<M>(socket, batch, log);
        }
    }

    /// One send of equal-length datagrams: a `sendmsg` with `UDP_SEGMENT`
    /// for two or more, a plain send for one. Every datagram gets its `sent`
    /// line with the send's index, datagram count and segment size.
    fn send<M: Markers>(&mut self, socket: &UdpSocket, batch: Vec<Outgoing>, log: &EventLog) {
        for out in &batch {
            M::link_transmit_start(out.seq, out.kind as u8);
        }
        let segment_size = batch[0].bytes.len();
        let result = if batch.len() == 1 {
            socket.send(&batch[0].bytes).map(|_| ())
        } else if self.mmsg {
            let datagrams: Vec<&[u8]> = batch.iter().map(|o| o.bytes.as_slice()).collect();
            udp::send_messages(socket, &datagrams).and_then(|n| {
                if n == datagrams.len() {
                    Ok(())
                } else {
                    Err(std::io::Error::other(format!(
                        "sendmmsg sent {n} of {} messages",
                        datagrams.len()
                    )))
                }
            })
        } else {
            let datagrams: Vec<&[u8]> = batch.iter().map(|o| o.bytes.as_slice()).collect();
            udp::send_segments(socket, &datagrams, segment_size as u16).map(|_| ())
        };
        match result {
            Err(e)
                if batch.len() > 1
                    && !self.mmsg
                    && e.kind() != std::io::ErrorKind::ConnectionRefused =>
            {
                // The path cannot take this GSO send (a segment above the
                // path MTU: EINVAL; no checksum offload: EIO): send the
                // datagrams one by one, each its own send in the log.
                log.record(json!({
                    "event": "gso_fallback", "gso_batch": self.sends,
                    "gso_segments": batch.len(), "gso_size": segment_size,
                    "error": e.to_string(),
                }));
                self.sends += 1;
                for out in batch {
                    let result = socket.send(&out.bytes).map(|_| ());
                    self.log_sent(std::slice::from_ref(&out), segment_size, result, log);
                    M::link_transmit_end(out.seq, out.kind as u8);
                }
            }
            result => {
                for out in &batch {
                    M::link_transmit_end(out.seq, out.kind as u8);
                }
                self.log_sent(&batch, segment_size, result, log);
            }
        }
    }

    fn log_sent(
        &mut self,
        batch: &[Outgoing],
        segment_size: usize,
        result: std::io::Result<()>,
        log: &EventLog,
    ) {
        let gso_batch = self.sends;
        self.sends += 1;
        let t_ns = now_ns();
        for out in batch {
            // As without GSO, a refused send is the channel's loss.
            if let Err(e) = &result {
                log.record(json!({"event": "send_error", "kind": out.kind, "seq": out.seq, "error": e.to_string(), "gso_batch": gso_batch}));
            }
            log.record(if self.mmsg {
                json!({
                    "event": "sent", "kind": out.kind, "seq": out.seq,
                    "t_ns": t_ns, "dropped": false,
                    "mmsg_batch": gso_batch, "mmsg_messages": batch.len(),
                })
            } else {
                json!({
                    "event": "sent", "kind": out.kind, "seq": out.seq,
                    "t_ns": t_ns, "dropped": false,
                    "gso_batch": gso_batch, "gso_segments": batch.len(),
                    "gso_size": segment_size,
                })
            });
        }
    }
}

/// Reads feedback until told to stop; the RTT comes from the echoed send time.
fn read_feedback(socket: UdpSocket, stop: &AtomicBool, count: &AtomicU64, log: &EventLog) {
    let _ = socket.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        let now = now_ns();
        let Ok((header, payload)) = Header::decode(&buf[..n]) else {
            log.record(json!({"event": "malformed", "bytes": n}));
            continue;
        };
        if header.kind != Kind::Feedback {
            continue;
        }
        let Ok(fb) = Feedback::decode(payload) else {
            log.record(json!({"event": "malformed", "bytes": n}));
            continue;
        };
        count.fetch_add(1, Ordering::Relaxed);
        let rtt_ns = (fb.echo_send_time_ns != 0)
            .then(|| now.saturating_sub(fb.echo_send_time_ns + fb.echo_hold_ns));
        log.record(json!({
            "event": "feedback", "seq": header.seq, "t_ns": now,
            "received": fb.received, "lost": fb.lost, "recovered": fb.recovered,
            "highest_seq": fb.highest_seq, "mean_delay_ns": fb.mean_delay_ns,
            "rtt_ns": rtt_ns,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_leave_together_at_the_same_mean_rate() {
        let at = |burst| {
            (0..9)
                .map(|s| release_offset_ns(s, burst, 100))
                .collect::<Vec<_>>()
        };
        assert_eq!(at(1), vec![0, 100, 200, 300, 400, 500, 600, 700, 800]);
        assert_eq!(at(4), vec![0, 0, 0, 0, 400, 400, 400, 400, 800]);
        assert_eq!(at(0), at(1));
    }

    #[test]
    fn only_real_ipv6_destinations_take_extension_headers() {
        assert!(is_ipv6_destination("[::1]:9".parse().unwrap()));
        assert!(is_ipv6_destination("[fe80::1%1]:9".parse().unwrap()));
        assert!(!is_ipv6_destination("127.0.0.1:9".parse().unwrap()));
        assert!(!is_ipv6_destination("[::ffff:10.0.0.1]:9".parse().unwrap()));
    }

    #[test]
    fn drop_decision_is_reproducible_and_near_the_probability() {
        let n = 100_000u32;
        let drops = (0..n).filter(|&s| dropped(7, Kind::Data, s, 0.01)).count();
        assert!((800..1200).contains(&drops), "{drops} drops of {n}");
        assert_eq!(
            drops,
            (0..n).filter(|&s| dropped(7, Kind::Data, s, 0.01)).count()
        );
        assert!(!(0..n).any(|s| dropped(7, Kind::Data, s, 0.0)));
    }
}
