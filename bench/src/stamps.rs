//! A synthetic recording for `correlate` to read: `xlap-trace synth` writes
//! a packets table, not the stamps a recorder leaves, so the stamps are
//! written here, made once per size and kept in `bench-results/`.
//!
//! One run directory (`stamps.parquet`, `run.json`) with a sender and a
//! receiver process of one host, as a recorder tracing both ends leaves
//! it: 8 points per packet (the application's send and delivery markers,
//! the send call, `dev.queue`, `dev.start_xmit`, `dev.netif_rx`,
//! `sock.queue`, the receive call's exit), every 8th packet of kind 1, the
//! rest kind 0, one in 1000 lost (no receiver stamps), 100 000 packets/s
//! with a few µs of deterministic jitter per point.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;
use xlap_records::writer::{stream_to_parquet, StampBatcher, StampStream};
use xlap_records::Stamp;

const SENDER: u32 = 10;
const RECEIVER: u32 = 20;
/// Ports 9001 -> 9000 (`XLAP_FLOW_*`).
const FLOW: u64 = 0x1111_2222_2329_2328;
/// Stamps per record batch.
const BATCH: usize = 1 << 20;
/// Bumped when the stamps change: kept recordings of another version are
/// made again.
const VERSION: u32 = 1;

/// Stamps per packet that is not lost.
pub const POINTS_PER_PACKET: u64 = 8;

/// The directory of the recording of `packets` packets.
pub fn run_dir(packets: u64) -> PathBuf {
    PathBuf::from(format!("bench-results/stamps-{packets}"))
}

/// A few µs of jitter, a pure function of (packet, point).
fn jitter(i: u64, point: u64) -> u64 {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ point.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    x % 2_000
}

fn lost(i: u64) -> bool {
    i % 1000 == 7
}

/// The point ids of the stamps, by their names (`xlap_abi`'s numbers).
struct Ids {
    app_base: u16,
    send_enter: u16,
    dev_queue: u16,
    start_xmit: u16,
    netif_rx: u16,
    sock_queue: u16,
    recv_exit: u16,
}

impl Ids {
    fn new() -> Result<Ids> {
        let id = |name: &str| {
            xlap_records::points::kernel_points()
                .find(|p| p.name == name)
                .map(|p| p.id)
                .with_context(|| format!("no kernel point {name}"))
        };
        // The first id past the kernel points that names an app point.
        let names = ["x".to_string()];
        let app_base = (1..u16::MAX)
            .find(|&i| {
                xlap_records::points::point_info(i, &names)
                    .is_some_and(|(n, ..)| n.starts_with("app."))
            })
            .context("no app point id")?;
        Ok(Ids {
            app_base,
            send_enter: id("sock.send_enter")?,
            dev_queue: id("dev.queue")?,
            start_xmit: id("dev.start_xmit")?,
            netif_rx: id("dev.netif_rx")?,
            sock_queue: id("sock.queue")?,
            recv_exit: id("sock.recv_exit")?,
        })
    }
}

/// The stamps of packet `i`, in the order they happen.
fn packet(ids: &Ids, i: u64, out: &mut Vec<Stamp>) {
    let stamp = |point: u16, ts: u64, flow: u64, pid: u32| Stamp {
        ts_ns: ts,
        point,
        seq: Some(i),
        kind: Some(u32::from(i % 8 == 7)),
        flow,
        pid,
        tid: pid,
        cpu: (pid == RECEIVER) as u16,
        len: 224,
        ifindex: (flow != 0).then_some(2),
        queue: None,
        hw_ts_ns: None,
        priority: None,
        cgroup_id: None,
        netns: None,
        from_user: flow == 0,
        fragment: false,
    };
    let t = 1_000_000_000 + i * 10_000;
    let send = [
        (ids.app_base, 0),
        (ids.send_enter, 1_000),
        (ids.dev_queue, 3_000),
        (ids.start_xmit, 5_000),
    ];
    for (k, (point, at)) in send.into_iter().enumerate() {
        let flow = if point == ids.app_base { 0 } else { FLOW };
        out.push(stamp(point, t + at + jitter(i, k as u64), flow, SENDER));
    }
    if lost(i) {
        return;
    }
    let rx = t + 9_000 + jitter(i, 4);
    let receive = [
        (ids.netif_rx, 0, FLOW),
        (ids.sock_queue, 2_000, FLOW),
        (ids.recv_exit, 4_000, 0),
        (ids.app_base + 1, 6_000, 0),
    ];
    for (k, (point, at, flow)) in receive.into_iter().enumerate() {
        out.push(stamp(
            point,
            rx + at + jitter(i, 5 + k as u64),
            flow,
            RECEIVER,
        ));
    }
}

/// The recording of `packets` packets, written when missing (or of another
/// version) and kept; the seconds writing it took when it ran now.
pub fn recording(packets: u64) -> Result<(PathBuf, Option<f64>)> {
    let dir = run_dir(packets);
    let done = dir.join("bench-complete");
    let want = format!("{VERSION} {packets}\n");
    if std::fs::read_to_string(&done).is_ok_and(|t| t == want) {
        return Ok((dir, None));
    }
    eprintln!(
        "writing the stamps of {packets} synthetic packets into {}",
        dir.display()
    );
    let t0 = Instant::now();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    write_stamps(&dir, packets)?;
    let meta = serde_json::json!({
        "schema_version": "1", "run_id": "bench-stamps", "host": "bench", "boot_id": "bench",
        "options": {"layout": {"seq_size": 4}},
        "clock_start": {"monotonic_ns": 0, "realtime_ns": 0},
    });
    std::fs::write(dir.join("run.json"), meta.to_string())?;
    std::fs::write(&done, want)?;
    let s = t0.elapsed().as_secs_f64();
    eprintln!("  {s:.1} s");
    Ok((dir, Some(s)))
}

/// The stamps as the recorder writes them: record batches to a zstd IPC
/// stream, converted to Parquet at the end (`stream_to_parquet`).
fn write_stamps(dir: &Path, packets: u64) -> Result<()> {
    let ids = Ids::new()?;
    let mut batcher = StampBatcher::new(
        "bench-stamps",
        "bench",
        vec!["send_start".into(), "deliver".into()],
    );
    let stream = dir.join("stamps.arrows");
    let mut out = StampStream::create(&stream)?;
    let mut stamps = Vec::with_capacity(BATCH + POINTS_PER_PACKET as usize);
    for i in 0..packets {
        packet(&ids, i, &mut stamps);
        if stamps.len() >= BATCH || i + 1 == packets {
            for s in &stamps {
                batcher.push(s);
            }
            stamps.clear();
            out.write(&batcher.finish())?;
        }
    }
    out.finish()?;
    stream_to_parquet(&stream, &dir.join("stamps.parquet"))?;
    std::fs::remove_file(&stream)?;
    Ok(())
}
