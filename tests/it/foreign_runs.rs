//! Unprivileged: a run directory from elsewhere (a CI artifact, the run a
//! pull request recorded) is untrusted input (docs/threat-model.md). Cases
//! of issue 50 as regression tests: a genuine synthetic run, one file
//! tampered with, each command a child under a timeout; it must refuse with
//! exit 6 naming the file, never panic, hang, read a file outside the run
//! or write through a link.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use xlap_tests::{bin, Scratch};

/// A marker that only the file outside the run holds.
const OUTSIDE: &str = "OUTSIDE-THE-RUN-7f3a";

/// `xlap-trace ARGS`, ended after 60 s (a hang is a failure, not a wait).
fn xlap(args: &[&str]) -> Output {
    let mut child = Command::new(bin("xlap-trace"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xlap-trace runs");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "xlap-trace {args:?} still running after 60 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A genuine run with its summary.json.
fn genuine(dir: &Path) {
    let d = dir.to_str().unwrap();
    for args in [
        &["synth", "-o", d, "--packets", "2000", "--seed", "3"][..],
        &["summary", d],
    ] {
        let out = xlap(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The command ended with exit 6, naming `file`, with no panic and no byte
/// of the outside file in what it printed.
fn refused(out: &Output, file: &str, why: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains(file) && stderr.contains(why), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !stderr.contains(OUTSIDE) && !stdout.contains(OUTSIDE),
        "{stdout}{stderr}"
    );
}

/// A change to a summary.json's JSON.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

fn edit_summary(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

#[test]
fn a_summary_with_edited_grids_or_counts_is_refused_where_compare_once_panicked() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-summary");
    let base = scratch.path("base");
    genuine(&base);
    let cases: [(&str, Edit, &str); 5] = [
        // Once: index out of bounds: the len is 0 but the index is 49.
        (
            "empty grid",
            Box::new(|v| v["levels"] = serde_json::json!([])),
            "quantile levels",
        ),
        // Once: the len is 1 but the index is 5.
        (
            "one block level",
            Box::new(|v| v["block_levels"] = serde_json::json!([0.5])),
            "block levels",
        ),
        // Once: attempt to add with overflow, pooled.
        (
            "2^64-1 packets",
            Box::new(|v| v["stages"][0]["packets"] = serde_json::json!(u64::MAX)),
            "packets",
        ),
        (
            "a grid short of its levels",
            Box::new(|v| v["stages"][0]["quantiles_ns"] = serde_json::json!([1.0, 2.0])),
            "grid",
        ),
        (
            "a run id of 2 MB",
            Box::new(|v| v["runs"][0] = serde_json::json!("x".repeat(2 << 20))),
            "bytes",
        ),
    ];
    for (i, (what, edit, why)) in cases.iter().enumerate() {
        let cand = scratch.path(&format!("cand{i}"));
        std::fs::create_dir_all(&cand).unwrap();
        let summary = cand.join("summary.json");
        std::fs::copy(base.join("summary.json"), &summary).unwrap();
        edit_summary(&summary, edit);
        let s = summary.to_str().unwrap();
        let b = base.to_str().unwrap();
        for args in [
            vec!["compare", b, s, "--markdown"],
            vec!["compare", s, b, "--markdown"],
        ] {
            let out = xlap(&args);
            refused(&out, "summary.json", why);
            assert!(out.stdout.is_empty(), "{what}: a verdict was printed");
        }
    }
}

#[test]
fn links_fifos_and_devices_in_a_run_are_refused_and_nothing_is_written_through_a_link() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-links");
    let base = scratch.path("base");
    genuine(&base);
    let outside: PathBuf = scratch.path("outside-file");
    std::fs::write(&outside, format!("{{\"secret\": \"{OUTSIDE}\"}}")).unwrap();
    let b = base.to_str().unwrap();

    // summary.json a link to a file outside the run, to /dev/zero, a FIFO.
    for name in ["link", "zero", "fifo"] {
        let cand = scratch.path(&format!("cand-{name}"));
        std::fs::create_dir_all(&cand).unwrap();
        let s = cand.join("summary.json");
        match name {
            "link" => std::os::unix::fs::symlink(&outside, &s).unwrap(),
            "zero" => std::os::unix::fs::symlink("/dev/zero", &s).unwrap(),
            _ => {
                let c = std::ffi::CString::new(s.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a NUL-terminated path in this test's scratch.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }
        }
        let out = xlap(&["compare", b, s.to_str().unwrap(), "--markdown"]);
        let why = if name == "fifo" {
            "FIFO"
        } else {
            "symbolic link"
        };
        refused(&out, "summary.json", why);
    }

    // run.json a link out of the run: analyze refuses it.
    let run = scratch.path("run-link");
    genuine(&run);
    std::fs::remove_file(run.join("run.json")).unwrap();
    std::os::unix::fs::symlink(&outside, run.join("run.json")).unwrap();
    let out = xlap(&["analyze", run.to_str().unwrap()]);
    refused(&out, "run.json", "symbolic link");

    // A dangling summary.json link: `summary` creates nothing through it.
    let dangling = scratch.path("dangling");
    genuine(&dangling);
    std::fs::remove_file(dangling.join("summary.json")).unwrap();
    let target = scratch.path("created-through-the-link");
    std::os::unix::fs::symlink(&target, dangling.join("summary.json")).unwrap();
    let out = xlap(&["summary", dangling.to_str().unwrap()]);
    refused(&out, "summary.json", "symbolic link");
    assert!(!target.exists(), "summary wrote through the link");
}

/// A loopback run of `packets` packets of one flow, each through the
/// sender's and receiver's socket points and `per_packet` of `points`
/// distinct app markers, of `kinds` kinds. The markers of a packet are
/// consecutive ones in one steady order, or, `scrambled`, any in any order.
fn many_names(
    dir: &Path,
    packets: u64,
    points: usize,
    per_packet: usize,
    kinds: u32,
    scrambled: bool,
) {
    use xlap_abi::xlap_point as xp;
    let names: Vec<String> = (0..points).map(|i| format!("m{i}")).collect();
    let mut stamps = Vec::new();
    let kind = |seq: u64| Some((seq as u32).wrapping_mul(2_654_435_761) % kinds.max(1));
    let stamp = |ts: u64, point: u32, seq: u64, flow: u64| {
        xlap_tests::run_files::stamp(ts, point, seq, kind(seq), flow, 10)
    };
    for seq in 0..packets {
        let t = 1_000_000_000 + seq * 100_000;
        stamps.push(stamp(t, xp::XLAP_POINT_SOCK_SEND_ENTER, seq, 7));
        for j in 0..per_packet {
            // Points in a scrambled order: every pair meets, either way round.
            let (app, at) = if scrambled {
                let h = (seq * 64 + j as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                (((h ^ (h >> 29)) % points.max(1) as u64) as usize, j)
            } else {
                let app = (seq as usize * per_packet + j) % points.max(1);
                (app, app)
            };
            stamps.push(stamp(
                t + 10 + at as u64,
                xp::XLAP_POINT_APP_BASE + app as u32,
                seq,
                0,
            ));
        }
        stamps.push(stamp(t + 5000, xp::XLAP_POINT_SOCK_RECV_EXIT, seq, 7));
    }
    let run = xlap_tests::run_files::one_host("many", &names);
    xlap_tests::run_files::write_run(dir, &run, &stamps);
}

#[test]
fn stamps_of_more_names_kinds_or_stages_than_the_caps_are_refused_and_at_the_caps_correlate() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-many");
    // (points, markers per packet, kinds, refused for): 40 points once ran
    // out of memory; 300 stands for the 57 008 that died of SIGFPE.
    let cases: [(usize, usize, u32, bool, Option<&str>); 6] = [
        (40, 3, 1, true, None),
        (120, 3, 8, false, None),
        (20, 12, 64, true, None),
        (300, 3, 1, false, Some("distinct point names")),
        (10, 3, 300, false, Some("distinct packet kinds")),
        (120, 20, 1, true, Some("distinct stages")),
    ];
    for (i, (points, per_packet, kinds, scrambled, refused_for)) in cases.into_iter().enumerate() {
        let dir = scratch.path(&format!("run{i}"));
        many_names(&dir, 2000, points, per_packet, kinds, scrambled);
        let d = dir.to_str().unwrap();
        let packets = dir.join("packets.parquet");
        let p = packets.to_str().unwrap();
        let commands: Vec<Vec<&str>> = match refused_for {
            None => vec![vec!["correlate", d, "-o", p]],
            Some(_) => vec![
                vec!["correlate", d, "-o", p],
                vec!["analyze", d],
                vec!["summary", d],
            ],
        };
        for args in commands {
            let out = xlap(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            match refused_for {
                None => assert!(out.status.success(), "{points} points: {stderr}"),
                Some(why) => refused(&out, "stamps.parquet", why),
            }
        }
    }
}

#[test]
fn a_run_json_with_a_key_twice_or_a_name_of_megabytes_is_refused() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-meta");
    type TextEdit = Box<dyn Fn(&str) -> String>;
    let cases: [(&str, TextEdit, &str); 4] = [
        (
            "a key twice",
            Box::new(|t: &str| t.replacen("{", "{\"run_id\": \"forged\", ", 1)),
            "\"run_id\" twice",
        ),
        (
            "a host of 2 MB",
            Box::new(|t: &str| {
                let mut v: serde_json::Value = serde_json::from_str(t).unwrap();
                v["host"] = "h".repeat(2 << 20).into();
                v.to_string()
            }),
            "a string of 2097152 bytes",
        ),
        (
            "a run id of 2 KB",
            Box::new(|t: &str| {
                let mut v: serde_json::Value = serde_json::from_str(t).unwrap();
                v["run_id"] = "r".repeat(2048).into();
                v.to_string()
            }),
            "a run id of 2048 bytes",
        ),
        // Once summed by the engine: Overflow in addition of UINT64, exit 1.
        (
            "counts of 2^64-1",
            Box::new(|t: &str| {
                let mut v: serde_json::Value = serde_json::from_str(t).unwrap();
                v["stamps"] = u64::MAX.into();
                v["lost"] = u64::MAX.into();
                v.to_string()
            }),
            "a count of 18446744073709551615",
        ),
    ];
    for (i, (what, edit, why)) in cases.iter().enumerate() {
        let run = scratch.path(&format!("run{i}"));
        genuine(&run);
        let meta = run.join("run.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        std::fs::write(&meta, edit(&text)).unwrap();
        // (`summary` of a run with its summary.json reads only that.)
        for cmd in ["analyze", "report"] {
            let out = xlap(&[cmd, run.to_str().unwrap()]);
            assert_eq!(
                out.status.code(),
                Some(6),
                "{what}, {cmd}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            refused(&out, "run.json", why);
        }
    }
}

/// Rewrites the Parquet file `path` with `edit` applied to each batch and
/// `kv` as its key-value metadata (the file's own when `None`).
fn rewrite_parquet(
    path: &Path,
    edit: impl Fn(arrow_array::RecordBatch) -> arrow_array::RecordBatch,
    kv: Option<Vec<(String, String)>>,
) {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::metadata::KeyValue;
    let file = std::fs::File::open(path).unwrap();
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let own: Vec<KeyValue> = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|k| k.key != "ARROW:schema")
        .collect();
    let batches: Vec<_> = builder.build().unwrap().map(|b| edit(b.unwrap())).collect();
    let kv = kv.map_or(own, |kv| {
        kv.into_iter().map(|(k, v)| KeyValue::new(k, v)).collect()
    });
    let props = parquet::file::properties::WriterProperties::builder()
        .set_key_value_metadata(Some(kv))
        .build();
    let tmp = path.with_extension("rewritten");
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&tmp).unwrap(),
        batches[0].schema(),
        Some(props),
    )
    .unwrap();
    for b in &batches {
        w.write(b).unwrap();
    }
    w.close().unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn stamps_of_other_column_types_and_packets_of_a_version_that_is_no_number_are_refused() {
    use arrow_array::{Array, Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-types");
    // run_id as a number: once exit 1 from the middle of a correlation.
    let run = scratch.path("int-run-id");
    many_names(&run, 200, 4, 2, 1, false);
    rewrite_parquet(
        &run.join("stamps.parquet"),
        |b| {
            let i = b.schema().index_of("run_id").unwrap();
            let mut fields: Vec<Field> = b
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields[i] = Field::new("run_id", DataType::Int64, false);
            let mut cols: Vec<Arc<dyn Array>> = b.columns().to_vec();
            cols[i] = Arc::new(Int64Array::from(vec![7i64; b.num_rows()]));
            RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
        },
        None,
    );
    let packets = scratch.path("packets.parquet");
    for args in [
        vec![
            "correlate",
            run.to_str().unwrap(),
            "-o",
            packets.to_str().unwrap(),
        ],
        vec!["analyze", run.to_str().unwrap()],
    ] {
        let out = xlap(&args);
        refused(&out, "stamps.parquet", "column \"run_id\" is Int64");
    }
    // A packets table whose schema version is -1: once "newer than this
    // xlap-trace reads".
    let run = scratch.path("version");
    genuine(&run);
    let packets = run.join("packets.parquet");
    let file = std::fs::File::open(&packets).unwrap();
    let kv: Vec<(String, String)> = parquet::file::reader::FileReader::metadata(
        &parquet::file::reader::SerializedFileReader::new(file).unwrap(),
    )
    .file_metadata()
    .key_value_metadata()
    .unwrap()
    .iter()
    .filter(|k| k.key != "ARROW:schema")
    .map(|k| {
        let v = k.value.clone().unwrap_or_default();
        let v = if k.key == "xlap_packets_schema_version" {
            "-1".to_string()
        } else {
            v
        };
        (k.key.clone(), v)
    })
    .collect();
    rewrite_parquet(&packets, |b| b, Some(kv));
    let out = xlap(&["analyze", packets.to_str().unwrap()]);
    refused(&out, "packets.parquet", "\"-1\" is not a version number");
}

#[test]
fn a_stored_table_edited_with_its_keys_kept_is_left_aside_and_the_packets_counted() {
    use arrow_array::{Array, Int64Array, RecordBatch};
    use std::sync::Arc;
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-stored");
    let run = scratch.path("run");
    genuine(&run);
    let summary = |dir: &Path| {
        let out = xlap(&[
            "analyze",
            dir.to_str().unwrap(),
            "-q",
            "summary",
            "-f",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (before, _) = summary(&run);
    // Every value count times 1000, the file's keys as they were: once
    // trusted (1 740 000 packets for 1 740).
    rewrite_parquet(
        &run.join("packets.stage_counts.parquet"),
        |b| {
            let i = b.schema().index_of("n").unwrap();
            let n = b
                .column(i)
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("n is BIGINT");
            let mut cols: Vec<Arc<dyn Array>> = b.columns().to_vec();
            cols[i] = Arc::new(
                n.iter()
                    .map(|v| v.map(|v| v * 1000))
                    .collect::<Int64Array>(),
            );
            RecordBatch::try_new(b.schema(), cols).unwrap()
        },
        None,
    );
    let (after, progress) = summary(&run);
    assert!(
        progress.contains("stage_counts computed from the packets")
            && progress.contains("its rows are not those its key names"),
        "{progress}"
    );
    assert_eq!(after, before, "the edited counts were read");
}

#[test]
fn recover_reads_no_stamps_stream_through_a_link() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("foreign-recover");
    let run = scratch.path("run");
    many_names(&run, 200, 4, 2, 1, false);
    // A run whose recorder died: state running, no stamps.parquet, and its
    // stream a link to a file outside the run. Its first bytes ("SECR")
    // were once printed as a length: "expected 1380140371 metadata bytes".
    let meta = run.join("run.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
    v["state"] = "running".into();
    std::fs::write(&meta, v.to_string()).unwrap();
    std::fs::remove_file(run.join("stamps.parquet")).unwrap();
    let outside = scratch.path("outside");
    std::fs::write(&outside, format!("SECRET {OUTSIDE}")).unwrap();
    std::fs::remove_file(run.join("stamps.arrows")).unwrap();
    std::os::unix::fs::symlink(&outside, run.join("stamps.arrows")).unwrap();
    for cmd in ["recover", "analyze"] {
        let out = xlap(&[cmd, run.to_str().unwrap()]);
        refused(&out, "stamps.arrows", "symbolic link");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!text.contains("1380140371"), "{text}");
    }
    assert!(!run.join("stamps.parquet").exists());
}
