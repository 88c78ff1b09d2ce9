//! Run directories written as the recorder leaves them (`stamps.parquet`
//! via the live Arrow stream, `run.json`), from stamps a test made: the
//! correlator's and the renderers' fuzz targets and the synthetic
//! correlation tests share this one writer.

use std::path::Path;
use xlap_records::writer::{stream_to_parquet, StampBatcher, StampStream};
use xlap_records::Stamp;

/// What a run directory says of itself: the names in its stamps and
/// `run.json`, its layout's sequence width and its clocks at the start.
#[derive(Clone, Debug)]
pub struct RunFiles<'a> {
    pub run_id: &'a str,
    pub host: &'a str,
    pub boot_id: &'a str,
    /// `app_names[i]` names app point `XLAP_POINT_APP_BASE + i` (without
    /// `app.`).
    pub app_names: &'a [String],
    /// The layout's sequence field, bytes.
    pub seq_size: u8,
    /// `clock_start`: CLOCK_MONOTONIC and CLOCK_REALTIME at the start, ns.
    pub monotonic_ns: i64,
    pub realtime_ns: i64,
}

/// Writes `stamps` as the run directory `dir` (created if missing).
pub fn write_run(dir: &Path, run: &RunFiles, stamps: &[Stamp]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut batcher = StampBatcher::new(run.run_id, run.host, run.app_names.to_vec());
    let stream = dir.join("stamps.arrows");
    let mut out = StampStream::create(&stream).unwrap();
    for s in stamps {
        batcher.push(s);
    }
    out.write(&batcher.finish()).unwrap();
    out.finish().unwrap();
    stream_to_parquet(&stream, &dir.join("stamps.parquet")).unwrap();
    let meta = serde_json::json!({
        "schema_version": "2", "run_id": run.run_id, "host": run.host, "boot_id": run.boot_id,
        "options": {"layout": {"seq_size": run.seq_size}},
        "clock_start": {"monotonic_ns": run.monotonic_ns, "realtime_ns": run.realtime_ns},
    });
    std::fs::write(dir.join("run.json"), meta.to_string()).unwrap();
}

/// A stamp of a test's making: what tests vary given, the rest as a
/// 100-byte datagram on a device of index 1 has it (from the user's
/// buffer when `flow` is 0: an app marker's).
pub fn stamp(ts_ns: u64, point: u32, seq: u64, kind: Option<u32>, flow: u64, pid: u32) -> Stamp {
    Stamp {
        ts_ns,
        point: point as u16,
        seq: Some(seq),
        kind,
        flow,
        pid,
        tid: pid,
        cpu: 0,
        len: 100,
        ifindex: Some(1),
        queue: None,
        hw_ts_ns: None,
        priority: None,
        cgroup_id: None,
        netns: None,
        from_user: flow == 0,
        fragment: false,
    }
}

/// A run of one host (`h`, boot `b`) whose layout has a 4-byte sequence
/// number, started at monotonic 1 s.
pub fn one_host<'a>(run_id: &'a str, app_names: &'a [String]) -> RunFiles<'a> {
    RunFiles {
        run_id,
        host: "h",
        boot_id: "b",
        app_names,
        seq_size: 4,
        monotonic_ns: 1_000_000_000,
        realtime_ns: 1_700_000_000_000_000_000,
    }
}
