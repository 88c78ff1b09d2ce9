//! The run's packets as a pcapng file for Wireshark and tshark: each
//! packet once per side it was stamped on, timed at that side's wire
//! point on the wall clock, its headers synthesized from its flow (no
//! payload is recorded) and X-LAP's breakdown of it in the frame's
//! comment. One interface per side and host.

mod blocks;
mod frames;
mod rows;

use crate::{AnalyzeError, Result};
use duckdb::Connection;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

pub use rows::comment;

/// What the section's and each interface's comment says of the frames.
pub const SYNTHESIZED: &str = "headers synthesized by xlap-trace; payload not recorded";

pub struct PcapngOptions {
    /// At most this many packets, the first sent (0: all).
    pub max_packets: u64,
    pub kind: Option<u64>,
    /// (monotonic, realtime) ns of the clock the packets table is on (the
    /// first run's clock pair): a stamp t is at wall time t - mono + real.
    pub clock_pair: (i64, i64),
    /// Say how far the export is on stderr every so often.
    pub progress: bool,
    /// The runs' devices: (host, ifindex, name), from their run.json.
    pub devices: Vec<(String, u32, String)>,
}

/// Loopback's index in every network namespace: it is the first device
/// made, and run.json's device list leaves it out.
const LOOPBACK_IFINDEX: u32 = 1;

/// The name of device `ifindex` of `host`: the one the runs list, when
/// exactly one name goes by that index there (two traced namespaces of
/// one host may each have a device of that index), else `if<N>`.
fn device_name(devices: &[(String, u32, String)], host: &str, ifindex: u32) -> String {
    let mut names: Vec<&str> = devices
        .iter()
        // A device name is at most 15 bytes (IFNAMSIZ): anything else in
        // a run.json from elsewhere is not one.
        .filter(|(h, i, n)| {
            h == host
                && *i == ifindex
                && (1..16).contains(&n.len())
                && n.bytes().all(|b| b.is_ascii_graphic())
        })
        .map(|(_, _, n)| n.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    match names.as_slice() {
        [one] => (*one).to_string(),
        [] if ifindex == LOOPBACK_IFINDEX => "lo".to_string(),
        _ => format!("if{ifindex}"),
    }
}

pub struct Exported {
    pub packets: u64,
    pub frames: u64,
    pub interfaces: usize,
    /// Packets left out by `max_packets`.
    pub left_out: u64,
    pub bytes: u64,
}

/// Writes the pcapng file `out` whole or not at all: through a temporary
/// file beside it (made anew, never through a link) renamed over it.
pub fn export(conn: &Connection, out: &Path, opts: &PcapngOptions) -> Result<Exported> {
    let total = rows::select(conn, opts.max_packets, opts.kind)?;
    let failed =
        |e: std::io::Error| AnalyzeError::Other(format!("cannot write {}: {e}", out.display()));
    let tmp = xlap_records::run_file::engine_target(out).map_err(failed)?;
    let written = write(conn, &tmp, opts).and_then(|done| {
        std::fs::rename(&tmp, out).map_err(failed)?;
        Ok(done)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let (frames, interfaces, bytes) = written?;
    let exported = if opts.max_packets == 0 {
        total
    } else {
        total.min(opts.max_packets)
    };
    Ok(Exported {
        packets: exported,
        frames,
        interfaces,
        left_out: total.saturating_sub(exported),
        bytes,
    })
}

/// Writes the blocks to `path`: (frames, interfaces, bytes).
fn write(conn: &Connection, path: &Path, opts: &PcapngOptions) -> Result<(u64, usize, u64)> {
    let io =
        |e: std::io::Error| AnalyzeError::Other(format!("cannot write {}: {e}", path.display()));
    let file = xlap_records::run_file::create(path)
        .map_err(|e| AnalyzeError::Other(format!("cannot write {}: {e}", path.display())))?;
    let mut w = std::io::BufWriter::new(file);
    blocks::section_header(
        &mut w,
        &format!("xlap-trace {}", env!("CARGO_PKG_VERSION")),
        &format!(
            "{SYNTHESIZED}. Each packet once per side it was stamped on: the sender's frame at its \
             transmit device point (dev_start_xmit, else dev_xmit, else dev_queue), the receiver's at \
             its first receive device point; where a side has none, at its socket point (the frame's \
             comment says so). Times are the stamps' on the run's clock, mapped to wall time with \
             the run's clock pair."
        ),
    )
    .map_err(io)?;
    let interfaces = rows::interfaces(conn)?;
    for (side, host, ifindex) in &interfaces {
        let (role, name) = if *side == 0 {
            ("sender", "tx")
        } else {
            ("receiver", "rx")
        };
        let (name, device) = match ifindex {
            Some(i) => {
                let device = device_name(&opts.devices, host, *i);
                (
                    format!("{device}@{host}"),
                    format!("device {device} (ifindex {i})"),
                )
            }
            None => (
                format!("{name}@{host}"),
                "its socket point (no device point)".to_string(),
            ),
        };
        blocks::interface(
            &mut w,
            &name,
            &format!("{role} side on host {host:?}, at {device}, as xlap-trace stamped it ({SYNTHESIZED})"),
        )
        .map_err(io)?;
    }
    let all: i64 = conn.query_row(&format!("SELECT count(*) FROM {}", rows::TABLE), [], |r| {
        r.get(0)
    })?;
    let (mono, real) = opts.clock_pair;
    let started = Instant::now();
    let mut said = started;
    let mut frames: u64 = 0;
    rows::for_each(conn, |row| {
        let wall = row.t_ns.checked_sub(mono).and_then(|t| t.checked_add(real));
        let Some(wall) = wall.filter(|t| *t >= 0) else {
            return Err(AnalyzeError::Other(format!(
                "seq {} at {}: {} ns is before 1970 on the wall clock (clock pair {mono} ↔ {real})",
                row.seq, row.at, row.t_ns
            )));
        };
        let interface = interfaces
            .iter()
            .position(|(s, h, i)| *s == row.side && *h == row.host && *i == row.ifindex)
            .unwrap_or(0) as u32;
        let payload = row.payload.unwrap_or(0);
        let frame = frames::frame(
            &frames::Flow {
                src_addr: row.src_addr.as_deref(),
                dst_addr: row.dst_addr.as_deref(),
                src_port: row.src_port,
                dst_port: row.dst_port,
            },
            payload,
        );
        // The datagram's length on the wire; the file holds its headers
        // (the snap length), as a capture cut short does.
        let len = (frame.len() as u32).saturating_add(payload);
        blocks::packet(&mut w, interface, wall as u64, &frame, len, &comment(&row)).map_err(io)?;
        frames += 1;
        if opts.progress && said.elapsed() >= Duration::from_secs(2) {
            said = Instant::now();
            eprintln!("xlap-trace: pcapng: {frames} of {all} frames");
        }
        Ok(())
    })?;
    w.flush().map_err(io)?;
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    let bytes = file.metadata().map_err(io)?.len();
    Ok((frames, interfaces.len(), bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_named_only_when_its_index_names_one_device() {
        let devices = vec![
            ("h".to_string(), 2, "xl0".to_string()),
            ("h".to_string(), 2, "xl0".to_string()),
            ("h".to_string(), 3, "eth0".to_string()),
            ("h".to_string(), 3, "veth9".to_string()),
            ("h".to_string(), 4, "a\nforged".to_string()),
            ("h".to_string(), 5, "x".repeat(16)),
            ("other".to_string(), 6, "eth1".to_string()),
        ];
        assert_eq!(device_name(&devices, "h", 2), "xl0");
        assert_eq!(device_name(&devices, "h", 3), "if3");
        assert_eq!(device_name(&devices, "h", 4), "if4");
        assert_eq!(device_name(&devices, "h", 5), "if5");
        assert_eq!(device_name(&devices, "h", 6), "if6");
        assert_eq!(device_name(&devices, "h", 1), "lo");
    }
}
