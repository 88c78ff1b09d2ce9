//! The kernel's own accounts of what happened to datagrams in a test: the
//! drops before the stack and at a socket's buffer, and what still waits
//! in a socket's queue. Outside accounts a test checks the recorder
//! against, never the recorder's own counts.

use std::time::{Duration, Instant};
use xlap_stage::Host;

/// Datagrams dropped: by the receiving CPUs' backlogs before the stack
/// (`/proc/net/softnet_stat`, every namespace), by a host's sockets for
/// want of buffer (its namespace's `Udp: RcvbufErrors`), and for want of
/// any socket on their port (`Udp: NoPorts`: a peer that already closed).
#[derive(Debug, Default)]
pub struct Drops {
    pub backlog: u64,
    pub socket_buffer: u64,
    pub no_port: u64,
}

impl Drops {
    /// The counters now, `host` the receiving namespace.
    pub fn now(host: &Host) -> Drops {
        let softnet = std::fs::read_to_string("/proc/net/softnet_stat").expect("softnet_stat");
        // One line per CPU; the second column counts its backlog's drops.
        let backlog = softnet
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .map(|hex| u64::from_str_radix(hex, 16).expect("a softnet_stat column"))
            .sum();
        let snmp = host
            .command("cat")
            .arg("/proc/net/snmp")
            .output()
            .expect("snmp");
        let snmp = String::from_utf8_lossy(&snmp.stdout).into_owned();
        let udp: Vec<Vec<&str>> = snmp
            .lines()
            .filter(|l| l.starts_with("Udp: "))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(udp.len(), 2, "/proc/net/snmp's Udp lines: {snmp}");
        let counter = |name: &str| -> u64 {
            let column = udp[0].iter().position(|c| *c == name).expect(name);
            udp[1][column].parse().expect(name)
        };
        Drops {
            backlog,
            socket_buffer: counter("RcvbufErrors"),
            no_port: counter("NoPorts"),
        }
    }

    /// What was dropped between `before` and `self`.
    pub fn since(&self, before: &Drops) -> Drops {
        Drops {
            backlog: self.backlog - before.backlog,
            socket_buffer: self.socket_buffer - before.socket_buffer,
            no_port: self.no_port - before.no_port,
        }
    }
}

/// The bytes waiting in the receive queue of process `pid`'s UDP socket
/// bound to `port` (`/proc/PID/net/udp`, its namespace's table), None when
/// no such socket is listed.
pub fn udp_rx_queue(pid: u32, port: u16) -> Option<u64> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/udp")).ok()?;
    let local = format!(":{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields.get(1)?.ends_with(&local) {
            return None;
        }
        // "tx_queue:rx_queue", both hexadecimal.
        let rx = fields.get(4)?.split(':').nth(1)?;
        u64::from_str_radix(rx, 16).ok()
    })
}

/// Waits up to `limit` for a slow reader (a loaded machine, an emulated
/// guest) to drain its UDP socket on `port`; true once it is empty.
pub fn wait_udp_drained(pid: u32, port: u16, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    loop {
        match udp_rx_queue(pid, port) {
            Some(0) | None => return true,
            Some(_) if Instant::now() >= until => return false,
            Some(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
