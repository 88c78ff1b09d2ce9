//! An RTP sender and receiver that carry RTCP on the next port up (RFC 3550),
//! one process per end, for the per-port layout tests; its JSON-lines log is
//! their ground truth. RTP: version 2, payload type 96, the marker bit on
//! every 25th packet, a sequence number that starts 100 below the 16-bit
//! wrap; every 10th RTP packet is followed by an RTCP sender report whose
//! NTP timestamp comes from the realtime clock.
//!
//! ```text
//! xlap-rtp-peer send LOCAL_IP DEST_IP PORT COUNT PERIOD_US LOG START_FILE
//! xlap-rtp-peer recv LOCAL_IP PORT COUNT LOG READY_FILE
//! ```
//! `recv` stops after COUNT RTP packets or 3 s without a datagram. Exit
//! codes: 0 done, 1 failure, 2 usage.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PAYLOAD_TYPE: u8 = 96;
const FIRST_SEQ: u16 = 65_436;
const SSRC: u32 = 0x5eed_cafe;
/// Seconds from 1900 (NTP's epoch) to 1970.
const NTP_UNIX_OFFSET: u64 = 2_208_988_800;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("send") if args.len() == 8 => send(&args[1..]),
        Some("recv") if args.len() == 6 => recv(&args[1..]),
        _ => {
            eprintln!("usage: xlap-rtp-peer send LOCAL_IP DEST_IP PORT COUNT PERIOD_US LOG START_FILE | recv LOCAL_IP PORT COUNT LOG READY_FILE");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xlap-rtp-peer: {e:#}");
        std::process::exit(1);
    }
}

struct Log(std::fs::File);

impl Log {
    fn create(path: &str) -> Result<Log> {
        Ok(Log(
            std::fs::File::create(path).with_context(|| path.to_string())?
        ))
    }
    fn line(&mut self, v: serde_json::Value) -> Result<()> {
        writeln!(self.0, "{v}")?;
        Ok(())
    }
}

fn rtp_packet(seq: u16, marker: bool, timestamp: u32) -> Vec<u8> {
    let mut p = vec![0x80, PAYLOAD_TYPE | if marker { 0x80 } else { 0 }];
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&timestamp.to_be_bytes());
    p.extend_from_slice(&SSRC.to_be_bytes());
    p.resize(12 + 160, 0xd5); // 20 ms of G.711 silence
    p
}

/// A sender report without report blocks: its NTP timestamp's middle 32
/// bits (what receivers echo as LSR) identify it.
fn sender_report(ntp: u64, rtp_ts: u32, packets: u32, octets: u32) -> Vec<u8> {
    let mut p = vec![0x80, 200, 0, 6];
    p.extend_from_slice(&SSRC.to_be_bytes());
    p.extend_from_slice(&ntp.to_be_bytes());
    p.extend_from_slice(&rtp_ts.to_be_bytes());
    p.extend_from_slice(&packets.to_be_bytes());
    p.extend_from_slice(&octets.to_be_bytes());
    p
}

fn ntp_now() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let frac = ((d.subsec_nanos() as u64) << 32) / 1_000_000_000;
    ((d.as_secs() + NTP_UNIX_OFFSET) << 32) | frac
}

fn send(a: &[String]) -> Result<()> {
    let local: IpAddr = a[0].parse().context("LOCAL_IP")?;
    let dest: IpAddr = a[1].parse().context("DEST_IP")?;
    let port: u16 = a[2].parse().context("PORT")?;
    let count: u32 = a[3].parse().context("COUNT")?;
    let period = Duration::from_micros(a[4].parse().context("PERIOD_US")?);
    let mut log = Log::create(&a[5])?;
    let rtp = UdpSocket::bind(SocketAddr::new(local, port))?;
    let rtcp = UdpSocket::bind(SocketAddr::new(local, port + 1))?;
    rtp.connect(SocketAddr::new(dest, port))?;
    rtcp.connect(SocketAddr::new(dest, port + 1))?;
    // Sockets first, then wait: the tracer attaches in between.
    let start = Path::new(&a[6]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !start.exists() {
        if Instant::now() > deadline {
            bail!("{} never appeared", start.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut next = Instant::now();
    let mut octets = 0u32;
    for i in 0..count {
        let seq = FIRST_SEQ.wrapping_add(i as u16);
        let marker = i % 25 == 0;
        let ts = i.wrapping_mul(160);
        let p = rtp_packet(seq, marker, ts);
        rtp.send(&p).context("RTP send")?;
        octets += (p.len() - 12) as u32;
        log.line(
            serde_json::json!({"event": "rtp", "seq": seq, "pt": PAYLOAD_TYPE, "marker": marker}),
        )?;
        if i % 10 == 9 {
            let ntp = ntp_now();
            rtcp.send(&sender_report(ntp, ts, i + 1, octets))
                .context("RTCP send")?;
            log.line(
                serde_json::json!({"event": "rtcp", "pt": 200, "ntp_mid": (ntp >> 16) as u32}),
            )?;
        }
        next += period;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    Ok(())
}

fn recv(a: &[String]) -> Result<()> {
    let local: IpAddr = a[0].parse().context("LOCAL_IP")?;
    let port: u16 = a[1].parse().context("PORT")?;
    let count: u32 = a[2].parse().context("COUNT")?;
    let mut log = Log::create(&a[3])?;
    let rtp = UdpSocket::bind(SocketAddr::new(local, port))?;
    let rtcp = UdpSocket::bind(SocketAddr::new(local, port + 1))?;
    rtp.set_nonblocking(true)?;
    rtcp.set_nonblocking(true)?;
    std::fs::write(&a[4], format!("{}\n", std::process::id()))?;
    let mut fds = [
        libc::pollfd {
            fd: rtp.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: rtcp.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let mut got = 0u32;
    let mut buf = [0u8; 2048];
    while got < count {
        // The first datagram comes once the recorder is attached, which
        // takes seconds on a loaded machine (7.7 s seen); later, 3 s idle
        // means the sender is done.
        let idle_ms = if got == 0 { 60_000 } else { 3_000 };
        // SAFETY: fds is a valid array of two pollfd for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, idle_ms) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("poll");
        }
        if n == 0 {
            break; // 3 s without a datagram: the sender is done
        }
        while let Ok(len) = rtp.recv(&mut buf) {
            if len < 12 {
                bail!("short RTP packet ({len} bytes)");
            }
            got += 1;
            let seq = u16::from_be_bytes([buf[2], buf[3]]);
            log.line(serde_json::json!({"event": "rtp", "seq": seq, "pt": buf[1] & 0x7f, "marker": buf[1] & 0x80 != 0}))?;
        }
        while let Ok(len) = rtcp.recv(&mut buf) {
            if len < 16 {
                bail!("short RTCP packet ({len} bytes)");
            }
            let mid = u32::from_be_bytes([buf[10], buf[11], buf[12], buf[13]]);
            log.line(serde_json::json!({"event": "rtcp", "pt": buf[1], "ntp_mid": mid}))?;
        }
    }
    Ok(())
}
