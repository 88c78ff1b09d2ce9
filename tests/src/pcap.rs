//! The outside account of a link: tcpdump capturing a stage's device into a
//! pcap file, and the UDP datagrams read back from it (classic pcap, as
//! `tcpdump -w` writes it; Ethernet frames, IPv4 or IPv6).

use crate::KillOnDrop;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// One UDP datagram on the wire.
#[derive(Clone, Debug)]
pub struct Datagram {
    /// When tcpdump saw it, CLOCK_REALTIME ns.
    pub realtime_ns: u64,
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: Vec<u8>,
}

/// tcpdump writing every UDP datagram of device `ifname` in network
/// namespace `netns` to `file`, with nanosecond times, until stopped.
pub struct Capture {
    process: Option<KillOnDrop>,
    /// tcpdump's stderr, line by line: it says when it listens, and at
    /// its end what it captured and what the kernel dropped.
    said: Receiver<String>,
    pub file: PathBuf,
}

impl Capture {
    /// Starts tcpdump and waits until it listens.
    pub fn start(netns: &str, ifname: &str, file: &Path) -> Capture {
        let _ = std::fs::remove_file(file);
        // Buffered output (no -U): a write per packet made tcpdump fall
        // behind a busy two-core machine and the kernel dropped for it.
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns, "tcpdump", "-i", ifname, "-n"])
            .args(["--time-stamp-precision", "nano", "-B", "32768"])
            // Packets handed over as they come: stopped, tcpdump would
            // leave out those still waiting in the kernel's ring.
            .args(["--immediate-mode", "-w"])
            .arg(file)
            .arg("udp")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump (./run.sh setup installs it)");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, said) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let process = KillOnDrop(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match said.recv_timeout(left) {
                Ok(line) if line.contains("listening on") => break,
                Ok(_) => {}
                Err(_) => panic!("tcpdump did not start listening on {ifname} in {netns}"),
            }
        }
        Capture {
            process: Some(process),
            said,
            file: file.to_path_buf(),
        }
    }

    /// Stops tcpdump as Ctrl-C does (it writes out what it holds) and
    /// reads the datagrams it captured; a capture the kernel dropped
    /// packets of is no account of the link, and fails.
    pub fn stop(mut self) -> Vec<Datagram> {
        if let Some(mut p) = self.process.take() {
            // The last datagrams reach tcpdump a moment after the link.
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: a signal to the tcpdump this test started.
            unsafe { libc::kill(p.0.id() as libc::pid_t, libc::SIGINT) };
            let status = p.0.wait().expect("wait for tcpdump");
            assert!(status.success(), "tcpdump: {status}");
        }
        let said: Vec<String> = self.said.try_iter().collect();
        let dropped: u64 = said
            .iter()
            .find_map(|l| l.strip_suffix(" packets dropped by kernel"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("tcpdump did not say what it dropped: {said:?}"));
        assert_eq!(dropped, 0, "tcpdump's kernel dropped packets: {said:?}");
        read(&self.file)
    }
}

/// The UDP datagrams of a pcap file.
pub fn read(path: &Path) -> Vec<Datagram> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.len() >= 24, "{}: no pcap header", path.display());
    let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let nano = match magic {
        0xa1b2_3c4d => true,
        0xa1b2_c3d4 => false,
        other => panic!(
            "{}: not a little-endian pcap file ({other:#x})",
            path.display()
        ),
    };
    let link = u32::from_le_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!(link, 1, "{}: not Ethernet frames", path.display());
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let word = |o: usize| u32::from_le_bytes(bytes[at + o..at + o + 4].try_into().unwrap());
        let (secs, frac, caplen) = (word(0) as u64, word(4) as u64, word(8) as usize);
        let frame = &bytes[at + 16..(at + 16 + caplen).min(bytes.len())];
        at += 16 + caplen;
        let realtime_ns = secs * 1_000_000_000 + if nano { frac } else { frac * 1000 };
        if let Some((src_port, dst_port, payload)) = udp_of(frame) {
            out.push(Datagram {
                realtime_ns,
                src_port,
                dst_port,
                payload: payload.to_vec(),
            });
        }
    }
    out
}

/// The UDP ports and payload of an Ethernet frame, if it carries an
/// unfragmented UDP datagram (or the first fragment of one).
fn udp_of(frame: &[u8]) -> Option<(u16, u16, &[u8])> {
    let ethertype = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
    let ip = frame.get(14..)?;
    let udp = match ethertype {
        0x0800 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let fragment_offset = u16::from_be_bytes(ip.get(6..8)?.try_into().ok()?) & 0x1fff;
            if *ip.get(9)? != 17 || fragment_offset != 0 {
                return None;
            }
            ip.get(ihl..)?
        }
        0x86dd => {
            if *ip.get(6)? != 17 {
                return None;
            }
            ip.get(40..)?
        }
        _ => return None,
    };
    let port = |o: usize| u16::from_be_bytes(udp[o..o + 2].try_into().unwrap());
    if udp.len() < 8 {
        return None;
    }
    Some((port(0), port(2), &udp[8..]))
}
