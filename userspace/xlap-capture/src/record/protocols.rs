//! Targets that speak only TCP: xlap-trace keys UDP datagrams.

use crate::targets;
use anyhow::Result;
use std::collections::HashSet;
use xlap_exit::{failure, Code};

/// xlap-trace keys datagrams: a target with TCP sockets and no UDP socket
/// has nothing to trace (refused, naming the sockets); TCP next to UDP is
/// ignored, with a note.
/// Targets that hold only TCP sockets at attach, with those sockets named
/// (e.g. iperf3's server before a test, with its control connection): they
/// may open UDP sockets later, so the run goes on, but a run in which they
/// never do ends with [`Code::NotUdp`] instead of an empty success.
pub fn check(pids: &[u32], quiet: bool) -> Vec<(u32, String)> {
    let mut tcp_only = Vec::new();
    for &pid in pids {
        let scan = crate::sockets::scan_udp(pid);
        if scan.fd_table_unreadable {
            // What it holds is unknown, not none (said and counted where
            // its sockets are marked).
            continue;
        }
        let tcp = crate::sockets::tcp_sockets(pid);
        if tcp.is_empty() {
            // No socket at all yet: said now, not discovered at the end
            // as an empty run that exits 0.
            if scan.udp.is_empty() {
                if !quiet {
                    eprintln!("xlap-trace: note: pid {pid} ({}) holds no UDP socket yet; it is traced from the UDP sockets it opens (a run in which it never opens one ends with exit 7)", targets::comm(pid));
                }
                tcp_only.push((
                    pid,
                    format!("pid {pid} ({}): no socket", targets::comm(pid)),
                ));
            }
            continue;
        }
        let names = tcp
            .iter()
            .map(|s| format!("{} port {}", s.protocol, s.local_port))
            .collect::<Vec<_>>()
            .join(", ");
        let only = scan.udp.is_empty();
        if !quiet {
            if only {
                eprintln!("xlap-trace: note: pid {pid} holds only TCP sockets so far ({names}); xlap-trace traces UDP datagrams, from the UDP sockets it opens");
            } else {
                eprintln!("xlap-trace: note: pid {pid} also holds TCP sockets ({names}); their traffic is not traced");
            }
        }
        if only {
            tcp_only.push((pid, format!("pid {pid} ({}): {names}", targets::comm(pid))));
        }
    }
    tcp_only
}

/// The end of a run whose TCP-only targets never opened a UDP socket and
/// which stamped nothing: an error naming the sockets, not an empty run.
pub fn refuse_tcp_only(
    tcp_only: &[(u32, String)],
    udp_pids: &HashSet<u32>,
    packets: u64,
) -> Result<()> {
    let never: Vec<&str> = tcp_only
        .iter()
        .filter(|(pid, _)| !udp_pids.contains(pid))
        .map(|(_, names)| names.as_str())
        .collect();
    if packets > 0 || never.is_empty() || never.len() < tcp_only.len() {
        return Ok(());
    }
    Err(failure(
        Code::NotUdp,
        format!(
            "the targets used no UDP socket ({}): xlap-trace traces UDP datagrams by their sequence numbers, so there was nothing to trace (the run's files are written)",
            never.join("; ")
        ),
    ))
}

/// The end of a run in which datagrams came and the layout keyed none of
/// them: a bad layout (exit 2), not an empty success.
pub fn refuse_unkeyed(meta: &xlap_records::run_meta::RunMeta) -> Result<()> {
    let unparsed = meta
        .points
        .values()
        .map(|p| p.lost("parse"))
        .max()
        .unwrap_or(0);
    if meta.packets > 0 || unparsed == 0 {
        return Ok(());
    }
    Err(failure(
        Code::Usage,
        format!(
            "{unparsed} datagrams were traced and the layout keyed none of them (no sequence number where --proto or --seq-offset/--seq-size says): run.json and stamps.parquet are written, with the datagrams counted under `parse`"
        ),
    ))
}
