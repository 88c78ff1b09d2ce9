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
