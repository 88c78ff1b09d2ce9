//! Running `xlap-trace record` from tests and reading what it wrote.

use crate::{bin, KillOnDrop};
use arrow_array::{
    Array, BooleanArray, Int64Array, StringArray, UInt16Array, UInt32Array, UInt64Array,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use xlap_records::run_meta::{RunMeta, SitePath};

/// `record`'s layout options for datagrams that start with a u64
/// little-endian seq (the C programs' and the Python senders' format).
pub const SEQ_U64_LE: &[&str] = &[
    "--seq-offset",
    "0",
    "--seq-size",
    "8",
    "--seq-endian",
    "little",
];

/// One row of `stamps.parquet`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub point: String,
    pub ts_ns: i64,
    pub seq: Option<u64>,
    pub kind: Option<u32>,
    pub flow: u64,
    /// The flow's addresses as the capture noted them (text).
    pub src_addr: Option<String>,
    pub dst_addr: Option<String>,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    /// The traced socket on the stamp's side.
    pub socket_cookie: Option<u64>,
    pub pid: u32,
    /// The thread that ran the point (0 in softirq).
    pub tid: u32,
    pub cpu: u16,
    pub ifindex: Option<u32>,
    /// skb->priority at the transmit device points.
    pub priority: Option<u32>,
    /// The process's cgroup v2 id at the points taken in its name (absent
    /// in runs recorded before the column).
    pub cgroup_id: Option<u64>,
    /// The device's network namespace inode at device points.
    pub netns: Option<u32>,
    /// A later IP fragment's extra stamp.
    pub fragment: bool,
}

impl Row {
    pub fn sport(&self) -> u16 {
        (self.flow >> 16) as u16
    }
    pub fn dport(&self) -> u16 {
        self.flow as u16
    }
}

/// A process that only outlives the protocol: traced with it, a run does
/// not end when the protocol's processes exit but when the test says
/// ([`Recorder::interrupt`]), so that what comes after the protocol's end
/// (a queue draining, a last poll of the recorder) still falls in the run.
pub fn run_holder() -> KillOnDrop {
    KillOnDrop(Command::new("sleep").arg("60").spawn().expect("sleep"))
}

/// A running `xlap-trace record`.
pub struct Recorder {
    pub child: Child,
    pub dir: PathBuf,
}

impl Recorder {
    /// Starts recording `pids` into `dir` and waits until the probes are
    /// attached.
    pub fn start(pids: &[u32], dir: &Path, extra: &[&str]) -> Recorder {
        Recorder::start_binary(&bin("xlap-trace"), pids, dir, extra)
    }

    /// [`Recorder::start`] with another `xlap-trace` binary (the benchmark's
    /// baseline build).
    pub fn start_binary(binary: &Path, pids: &[u32], dir: &Path, extra: &[&str]) -> Recorder {
        Recorder::start_env(binary, pids, dir, extra, &[])
    }

    /// [`Recorder::start_binary`] with variables set in the recorder's
    /// environment.
    pub fn start_env(
        binary: &Path,
        pids: &[u32],
        dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Recorder {
        let ready = dir.with_extension("ready");
        let _ = std::fs::remove_file(&ready);
        let mut cmd = Command::new(binary);
        cmd.envs(env.iter().copied());
        cmd.arg("record")
            .arg("-o")
            .arg(dir)
            .arg("--ready-file")
            .arg(&ready)
            .args(extra);
        for pid in pids {
            cmd.args(["--pid", &pid.to_string()]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn xlap-trace");
        let mut rec = Recorder {
            child,
            dir: dir.to_path_buf(),
        };
        let start = std::time::Instant::now();
        let limit = crate::start_secs();
        while !ready.exists() {
            if let Ok(Some(status)) = rec.child.try_wait() {
                let mut err = String::new();
                if let Some(e) = rec.child.stderr.as_mut() {
                    let _ = std::io::Read::read_to_string(e, &mut err);
                }
                panic!("xlap-trace exited ({status}) before it was ready: {err}");
            }
            assert!(
                start.elapsed().as_secs() < limit,
                "xlap-trace not ready after {limit} s (XLAP_TEST_START_SECS)"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        rec
    }

    /// Ends the recording as a user's Ctrl-C does (SIGINT); [`Recorder::wait`]
    /// then waits for what it writes.
    pub fn interrupt(&self) {
        // SAFETY: a signal to the recorder this test started.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
    }

    /// Waits for the recorder to end on its own (the targets exited).
    pub fn wait(self) -> Output {
        let out = self.child.wait_with_output().expect("wait xlap-trace");
        assert!(
            out.status.success(),
            "xlap-trace failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Waits for the recorder to end and returns its `run.json`.
    pub fn meta_after_wait(self) -> RunMeta {
        let dir = self.dir.clone();
        self.wait();
        run_meta(&dir)
    }
}

/// A run's `run.json`, read through the recorder's own declaration of it
/// (a key misspelt in a test does not compile, rather than reading null).
pub fn run_meta(dir: &Path) -> RunMeta {
    let path = dir.join("run.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    RunMeta::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The segment directories of a rotated recording on disk, oldest first.
pub fn segment_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// A `--marker-path` value (`ring`, `uprobe`) as run.json records it.
pub fn site_path(name: &str) -> SitePath {
    serde_json::from_value(Value::from(name))
        .unwrap_or_else(|e| panic!("--marker-path {name}: {e}"))
}

/// Those of `points` the run could stamp on this kernel: run.json's
/// `unavailable_points` names the others (a point needing a later kernel, a
/// tracepoint that changed), and each left out is said. Tests check a
/// point's stamps only where the run says it took them; the
/// `kernel_features` test holds this kernel to docs/stamp-points.md's minimums, so
/// on a kernel that has them nothing is left out.
pub fn traced<'a>(meta: &RunMeta, points: &[&'a str]) -> Vec<&'a str> {
    points
        .iter()
        .copied()
        .filter(|point| match meta.unavailable_points.get(*point) {
            Some(why) => {
                eprintln!("{point} is not traced on this kernel ({why}): its checks are left out");
                false
            }
            None => true,
        })
        .collect()
}

/// Whether run.json's `degraded_points` says `point` lacks something this
/// kernel cannot give it (`what`: a phrase of the reason, e.g. "no flow");
/// said when it does, so the test can leave that check out.
pub fn degraded(meta: &RunMeta, point: &str, what: &str) -> bool {
    match meta.degraded_points.get(point) {
        Some(why) if why.contains(what) => {
            eprintln!("{point} on this kernel: {why}: that check is left out");
            true
        }
        _ => false,
    }
}

/// Whether the run could stamp `point` on this kernel (see [`traced`]).
pub fn is_traced(meta: &RunMeta, point: &str) -> bool {
    !traced(meta, &[point]).is_empty()
}

/// Every row of a stamps Parquet file.
pub fn read_stamps(path: &Path) -> Vec<Row> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .expect("parquet")
        .build()
        .expect("reader");
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.expect("batch");
        let col = |n: &str| {
            batch
                .column_by_name(n)
                .unwrap_or_else(|| panic!("column {n}"))
                .clone()
        };
        let point = col("point");
        let point = point.as_any().downcast_ref::<StringArray>().unwrap();
        let ts = col("ts_ns");
        let ts = ts.as_any().downcast_ref::<Int64Array>().unwrap();
        let seq = col("seq");
        let seq = seq.as_any().downcast_ref::<UInt64Array>().unwrap();
        let kind = col("kind");
        let kind = kind.as_any().downcast_ref::<UInt32Array>().unwrap();
        let src_addr = col("src_addr");
        let src_addr = src_addr.as_any().downcast_ref::<StringArray>().unwrap();
        let dst_addr = col("dst_addr");
        let dst_addr = dst_addr.as_any().downcast_ref::<StringArray>().unwrap();
        let src_port = col("src_port");
        let src_port = src_port.as_any().downcast_ref::<UInt16Array>().unwrap();
        let dst_port = col("dst_port");
        let dst_port = dst_port.as_any().downcast_ref::<UInt16Array>().unwrap();
        let cookie = col("socket_cookie");
        let cookie = cookie.as_any().downcast_ref::<UInt64Array>().unwrap();
        let flow = col("flow");
        let flow = flow.as_any().downcast_ref::<UInt64Array>().unwrap();
        let pid = col("pid");
        let pid = pid.as_any().downcast_ref::<UInt32Array>().unwrap();
        let tid = col("tid");
        let tid = tid.as_any().downcast_ref::<UInt32Array>().unwrap();
        let cpu = col("cpu");
        let cpu = cpu.as_any().downcast_ref::<UInt16Array>().unwrap();
        let ifindex = col("ifindex");
        let ifindex = ifindex.as_any().downcast_ref::<UInt32Array>().unwrap();
        let priority = col("priority");
        let priority = priority.as_any().downcast_ref::<UInt32Array>().unwrap();
        // Columns added later: read as absent from older runs.
        let cgroup_id = batch.column_by_name("cgroup_id").cloned();
        let cgroup_id = cgroup_id
            .as_ref()
            .map(|c| c.as_any().downcast_ref::<UInt64Array>().unwrap());
        let netns = batch.column_by_name("netns").cloned();
        let netns = netns
            .as_ref()
            .map(|c| c.as_any().downcast_ref::<UInt32Array>().unwrap());
        let fragment = col("fragment");
        let fragment = fragment.as_any().downcast_ref::<BooleanArray>().unwrap();
        for i in 0..batch.num_rows() {
            rows.push(Row {
                point: point.value(i).to_string(),
                ts_ns: ts.value(i),
                seq: (!seq.is_null(i)).then(|| seq.value(i)),
                kind: (!kind.is_null(i)).then(|| kind.value(i)),
                flow: flow.value(i),
                src_addr: (!src_addr.is_null(i)).then(|| src_addr.value(i).to_string()),
                dst_addr: (!dst_addr.is_null(i)).then(|| dst_addr.value(i).to_string()),
                src_port: (!src_port.is_null(i)).then(|| src_port.value(i)),
                dst_port: (!dst_port.is_null(i)).then(|| dst_port.value(i)),
                socket_cookie: (!cookie.is_null(i)).then(|| cookie.value(i)),
                pid: pid.value(i),
                tid: tid.value(i),
                cpu: cpu.value(i),
                ifindex: (!ifindex.is_null(i)).then(|| ifindex.value(i)),
                priority: (!priority.is_null(i)).then(|| priority.value(i)),
                cgroup_id: cgroup_id.filter(|c| !c.is_null(i)).map(|c| c.value(i)),
                netns: netns.filter(|c| !c.is_null(i)).map(|c| c.value(i)),
                fragment: fragment.value(i),
            });
        }
    }
    rows
}

/// The example protocol across `stage`, traced from before its first packet
/// to its end: the protocol's logs and the run's metadata.
pub struct Traced {
    pub scratch: crate::Scratch,
    pub pids: (u32, u32),
    pub sent: Vec<Value>,
    pub received: Vec<Value>,
    pub meta: RunMeta,
    pub stdout: String,
    pub stderr: String,
}

impl Traced {
    pub fn run_dir(&self) -> PathBuf {
        self.scratch.path("run")
    }

    pub fn stamps(&self) -> Vec<Row> {
        read_stamps(&self.run_dir().join("stamps.parquet"))
    }
}

/// Starts the protocol (gated), attaches `xlap-trace record` with `args` to
/// both ends, lets the protocol run and waits for all three to end.
pub fn trace_example(
    stage: &xlap_stage::Stage,
    name: &str,
    opts: &crate::example::ExampleOptions,
    args: &[&str],
) -> Traced {
    let scratch = crate::Scratch::new(name);
    let opts = crate::example::ExampleOptions {
        gated: true,
        ..opts.clone()
    };
    let run = crate::example::ProtocolRun::spawn(stage, &scratch, &opts);
    let pids = run.pids();
    let rec = Recorder::start(&[pids.0, pids.1], &scratch.path("run"), args);
    run.start();
    let (sent, received) = run.wait();
    let dir = rec.dir.clone();
    let out = rec.wait();
    Traced {
        pids,
        sent,
        received,
        meta: run_meta(&dir),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        scratch,
    }
}

/// The rows of one bundled query (`xlap-trace analyze DIR -q NAME -f json`)
/// with extra arguments (`--kind data`, `-p name=value`); the command must
/// succeed.
pub fn analyze_rows(dir: &Path, name: &str, args: &[&str]) -> Vec<Value> {
    let out = Command::new(bin("xlap-trace"))
        .arg("analyze")
        .arg(dir)
        .args(["-q", name, "-f", "json", "--quiet"])
        .args(args)
        .output()
        .expect("xlap-trace analyze");
    assert!(
        out.status.success(),
        "xlap-trace analyze -q {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v[name].as_array().expect("rows").clone()
}
