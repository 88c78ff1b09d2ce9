//! Privileged, and run by the kernel matrix only (`just vm-matrix`,
//! tests/vm/matrix.sh: it boots a QEMU guest, which takes a core for
//! minutes): two kernels, two clocks, one stage. Host a is a namespace of
//! this kernel; host b a guest booted with Debian's own kernel, its NIC
//! backed by a TAP device in a's namespace (`Stage::for_guest`). Each side
//! runs the example protocol under its own `xlap-trace record` on its own
//! kernel; `correlate` joins the two runs, once with the host sending and
//! once with the guest sending. The clock mapping is checked against an
//! oracle the test measures itself over the same link (tests/vm/clock_echo.py:
//! NTP-style exchanges between the host's and the guest's CLOCK_MONOTONIC,
//! whose intervals bound the true offset by causality alone), the packets
//! against the protocol's own logs.

use serde_json::Value;
use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use xlap_stage::Stage;
use xlap_tests::trace::{run_meta, Recorder};
use xlap_tests::{bin, privileged, read_jsonl, Scratch};

/// Datagrams of each direction, one per `PERIOD_US`: a few seconds of
/// traffic, long enough for the oracle's probes to fall inside it.
const COUNT: u32 = 3000;
const PERIOD_US: u64 = 1000;
const ORACLE_PORT: u16 = 9123;
const GUEST: &str = "10.77.0.2";
/// The kernel the guest boots (tests/vm/setup.sh unpacks it).
fn suite() -> String {
    std::env::var("XLAP_VM_TWO_KERNELS").unwrap_or_else(|_| "bookworm-backports".into())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The booted guest; its QEMU (a process group of its own) ends with it.
struct Guest(Child);

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill(2) on the process group this test created.
            unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
}

/// Waits for `path` (written by the guest on the shared file system), or
/// for the guest to say it failed.
fn await_guest(guest: &mut Guest, out: &Path, path: &Path, secs: u64) {
    let start = Instant::now();
    while !path.exists() {
        let log = std::fs::read_to_string(out.join("guest.log")).unwrap_or_default();
        assert!(
            !out.join("failed").exists(),
            "the guest failed before {}: {log}",
            path.display()
        );
        if let Ok(Some(status)) = guest.0.try_wait() {
            panic!(
                "the guest ended ({status}) before {}: {log}\nconsole:\n{}",
                path.display(),
                std::fs::read_to_string(out.join("console.log")).unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "no {} after {secs} s: {log}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One oracle measurement: the guest's clock minus the host's at `host_ns`,
/// within ± `half_width_ns` (the narrowest of the probes' intervals).
#[derive(Clone, Debug)]
struct Oracle {
    host_ns: f64,
    theta_ns: f64,
    half_width_ns: f64,
}

fn clock_echo(stage: &Stage, args: &[&str]) -> Command {
    let mut c = stage.host(0).command("python3");
    c.arg(repo().join("tests/vm/clock_echo.py")).args(args);
    c
}

fn oracle(stage: &Stage) -> Oracle {
    let out = clock_echo(stage, &["probe", GUEST, &ORACLE_PORT.to_string(), "300"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    Oracle {
        host_ns: v["host_ns"].as_f64().unwrap(),
        theta_ns: v["theta_ns"].as_f64().unwrap(),
        half_width_ns: v["half_width_ns"].as_f64().unwrap(),
    }
}

/// Asks the guest to start its side of `step`.
fn go(stage: &Stage, step: &str) {
    let st = clock_echo(stage, &["go", GUEST, &ORACLE_PORT.to_string(), step])
        .status()
        .unwrap();
    assert!(st.success(), "the guest did not take step {step}");
}

/// The example protocol's end on host a in `step`: the child, its log and
/// its gate (the sender's start file, the receiver's ready file).
fn host_end(stage: &Stage, scratch: &Scratch, step: &str, role: &str) -> (Child, PathBuf, PathBuf) {
    let log = scratch.path(&format!("{step}-{role}.jsonl"));
    let gate = scratch.path(&format!("{step}-{role}.gate"));
    let mut c = stage.host(0).command(bin("xlap-example-plain"));
    match role {
        "sender" => c.args([
            "send",
            "--dest",
            "10.77.0.2:9000",
            "--bind",
            "10.77.0.1:9001",
            "--count",
            &COUNT.to_string(),
            "--period-us",
            &PERIOD_US.to_string(),
            "--start-timeout-s",
            "300",
            "--start-file",
        ]),
        _ => c.args([
            "recv",
            "--bind",
            "10.77.0.1:9000",
            "--expect",
            &COUNT.to_string(),
            "--first-packet-timeout-s",
            "300",
            "--ready-file",
        ]),
    };
    c.arg(&gate).arg("--log").arg(&log);
    (c.stdin(Stdio::null()).spawn().unwrap(), log, gate)
}

/// What one direction left: both runs, both logs, the oracle inside it.
struct Direction {
    name: &'static str,
    /// The file name of its packets table.
    slug: &'static str,
    host_run: PathBuf,
    guest_run: PathBuf,
    /// The host's recorder collected the guest's run over the network
    /// (`record --collect`): the table is in `host_run`, no correlate.
    collected: bool,
    sent: Vec<Value>,
    received: Vec<Value>,
    during: Oracle,
}

/// The host sends, the guest receives.
fn host_sends(stage: &Stage, guest: &mut Guest, out: &Path, scratch: &Scratch) -> Direction {
    go(stage, "recv");
    await_guest(guest, out, &out.join("recv/ready"), 600);
    let (mut sender, log, gate) = host_end(stage, scratch, "recv", "sender");
    let rec = Recorder::start(&[sender.id()], &scratch.path("host-sends"), &[]);
    std::fs::write(gate, b"go").unwrap();
    let during = oracle(stage);
    assert!(sender.wait().unwrap().success(), "the host's sender failed");
    rec.wait();
    await_guest(guest, out, &out.join("recv/done"), 600);
    Direction {
        name: "host → guest",
        slug: "host-to-guest",
        host_run: scratch.path("host-sends"),
        guest_run: out.join("recv/run"),
        collected: false,
        sent: read_jsonl(&log),
        received: read_jsonl(&out.join("recv/receiver.jsonl")),
        during,
    }
}

/// The guest sends, the host receives.
fn guest_sends(stage: &Stage, guest: &mut Guest, out: &Path, scratch: &Scratch) -> Direction {
    let (mut receiver, log, gate) = host_end(stage, scratch, "send", "receiver");
    xlap_tests::wait_for_file(&gate, 20);
    let rec = Recorder::start(&[receiver.id()], &scratch.path("guest-sends"), &[]);
    go(stage, "send");
    await_guest(guest, out, &out.join("send/ready"), 600);
    let during = oracle(stage);
    assert!(
        receiver.wait().unwrap().success(),
        "the host's receiver failed"
    );
    rec.wait();
    await_guest(guest, out, &out.join("send/done"), 600);
    Direction {
        name: "guest → host",
        slug: "guest-to-host",
        host_run: scratch.path("guest-sends"),
        guest_run: out.join("send/run"),
        collected: false,
        sent: read_jsonl(&out.join("send/sender.jsonl")),
        received: read_jsonl(&log),
        during,
    }
}

/// What a collecting recorder on host a left while the guest ran a step.
struct Collected {
    run: PathBuf,
    meta: Value,
    received: Vec<Value>,
    during: Option<Oracle>,
}

/// Host a's receiver, recorded by a recorder that collects the guest's run
/// over the link (`record --collect`, in host a's namespace: the guest
/// reaches it at 10.77.0.1), while the guest runs `step`; with `probe`, the
/// oracle is measured during the traffic.
fn collect(
    stage: &Stage,
    guest: &mut Guest,
    out: &Path,
    scratch: &Scratch,
    step: &str,
    probe: bool,
) -> Collected {
    let (mut receiver, log, gate) = host_end(stage, scratch, step, "receiver");
    xlap_tests::wait_for_file(&gate, 20);
    let run = scratch.path(&format!("{step}-collected"));
    let ready = run.with_extension("ready");
    let mut collector = stage.host(0).command(bin("xlap-trace"));
    collector
        .arg("record")
        .arg("-o")
        .arg(&run)
        .arg("--ready-file")
        .arg(&ready)
        .args(["--pid", &receiver.id().to_string()])
        .args(["--collect", "10.77.0.1:7700", "--peer-wait", "120"])
        .arg("--token-file")
        .arg(out.join("token"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let collector = collector.spawn().unwrap();
    xlap_tests::wait_for_file(&ready, xlap_tests::start_secs());
    go(stage, step);
    await_guest(guest, out, &out.join(format!("{step}/ready")), 600);
    let during = probe.then(|| oracle(stage));
    assert!(
        receiver.wait().unwrap().success(),
        "the host's receiver failed"
    );
    let o = collector.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "the collecting recorder: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    await_guest(guest, out, &out.join(format!("{step}/done")), 600);
    let meta = serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    Collected {
        run,
        meta,
        received: read_jsonl(&log),
        during,
    }
}

/// The guest sends and its recorder streams its run to the host's, which
/// collects it: the host's run directory ends with both runs joined. Before
/// it, the guest sent garbage to the collector from its address.
fn guest_streams(stage: &Stage, guest: &mut Guest, out: &Path, scratch: &Scratch) -> Direction {
    let c = collect(stage, guest, out, scratch, "stream", true);
    let exit = std::fs::read_to_string(out.join("stream/record.exit")).unwrap();
    assert_eq!(
        exit.trim(),
        "0",
        "the guest's streaming recorder: {}",
        std::fs::read_to_string(out.join("stream/record.stderr")).unwrap_or_default()
    );
    let peers = &c.meta["peers"];
    assert_eq!(peers["peers"][0]["complete"], true, "{peers}");
    let refused = peers["refused"].as_array().unwrap();
    assert!(
        refused
            .iter()
            .any(|r| r["address"].as_str().unwrap().starts_with(GUEST)),
        "the guest's garbage is named: {peers}"
    );
    Direction {
        name: "guest → host, streamed",
        slug: "streamed",
        host_run: c.run,
        guest_run: out.join("stream/run"),
        collected: true,
        sent: read_jsonl(&out.join("stream/sender.jsonl")),
        received: c.received,
        during: c.during.unwrap(),
    }
}

/// The guest's streaming recorder killed halfway: the collector says so,
/// keeps what arrived, and its table has the host's end of every packet
/// and the guest's end of those whose stamps arrived, none the sender did
/// not log.
fn guest_recorder_killed(
    stage: &Stage,
    guest: &mut Guest,
    out: &Path,
    scratch: &Scratch,
) -> String {
    let c = collect(stage, guest, out, scratch, "killed", false);
    let exit = std::fs::read_to_string(out.join("killed/record.exit")).unwrap();
    assert_eq!(exit.trim(), "137", "the guest's recorder was killed");
    let peer = &c.meta["peers"]["peers"][0];
    assert_eq!(peer["complete"], false, "{peer}");
    let sent = logged(&read_jsonl(&out.join("killed/sender.jsonl")), "sent");
    let delivered = logged(&c.received, "delivered");
    assert_eq!(delivered.len(), COUNT as usize, "the protocol went on");
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let p = c.run.join("packets.parquet");
    let p = p.display();
    let arrived = seqs(
        &conn,
        &format!("SELECT seq FROM '{p}' WHERE kind = 1 AND sock_send_enter_ns IS NOT NULL"),
    );
    let read = seqs(
        &conn,
        &format!("SELECT seq FROM '{p}' WHERE kind = 1 AND sock_recv_exit_ns IS NOT NULL"),
    );
    assert!(
        !arrived.is_empty() && arrived.len() < COUNT as usize,
        "{} of {COUNT} packets have the guest's stamps: {peer}",
        arrived.len()
    );
    assert!(arrived.is_subset(&sent), "stamps of packets never sent");
    assert_eq!(read, delivered, "the host's own end of every packet");
    format!(
        "guest's recorder killed halfway: the collector holds {} stream bytes, the guest's end of {} of {COUNT} packets, the host's of {}; {}\n",
        peer["stream_bytes"],
        arrived.len(),
        read.len(),
        peer["error"].as_str().unwrap_or("no error said")
    )
}

/// The direction's packets table and its clock mapping of the guest: made
/// by correlate from the two runs, or by the collecting recorder.
fn joined(d: &Direction, scratch: &Scratch) -> (PathBuf, Value) {
    if d.collected {
        let packets = d.host_run.join("packets.parquet");
        let json: Value = serde_json::from_slice(
            &std::fs::read(d.host_run.join("packets.json")).expect("the collector's packets.json"),
        )
        .unwrap();
        return (packets, json);
    }
    let packets = scratch.path(&format!("{}.parquet", d.slug));
    let c = correlate(d, &packets);
    (packets, c)
}

fn correlate(d: &Direction, out: &Path) -> Value {
    let o = Command::new(bin("xlap-trace"))
        .arg("correlate")
        .arg(&d.host_run)
        .arg(&d.guest_run)
        .arg("-o")
        .arg(out)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}: correlate: {}",
        d.name,
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The mapping's offset of the guest's clock at host time `t`.
fn theta_at(m: &Value, t: f64) -> f64 {
    m["offset_ns"].as_f64().unwrap()
        + m["drift_ppm"].as_f64().unwrap() * 1e-6 * (t - m["t0_ns"].as_f64().unwrap())
}

fn seqs(conn: &duckdb::Connection, sql: &str) -> BTreeSet<u64> {
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, i64>(0)).unwrap();
    rows.map(|r| r.unwrap() as u64).collect()
}

fn logged(log: &[Value], event: &str) -> BTreeSet<u64> {
    xlap_tests::example::events(log, event)
        .filter(|e| e["kind"].as_str().is_none_or(|k| k == "data"))
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

/// Every data packet the receiver delivered is in the table, with each of
/// both ends' points that the path has (the points most delivered packets
/// carry; a point the kernel does not offer is absent from all).
fn check_packets(d: &Direction, packets: &Path) -> String {
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let p = packets.display();
    let delivered = logged(&d.received, "delivered");
    let sent = logged(&d.sent, "sent");
    assert_eq!(
        delivered.len(),
        COUNT as usize,
        "{}: the receiver's log",
        d.name
    );
    assert!(delivered.is_subset(&sent), "{}: the logs disagree", d.name);
    // Every kernel point's column the table has (a point this kernel or
    // path does not offer has none, or an empty one).
    let present: BTreeSet<String> = {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT column_name FROM (DESCRIBE SELECT * FROM '{p}')"
            ))
            .unwrap();
        let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
        rows.map(|r| r.unwrap()).collect()
    };
    let cols: Vec<String> = xlap_records::points::kernel_points()
        .map(|p| format!("{}_ns", xlap_records::points::column_stem(p.name)))
        .filter(|c| present.contains(c))
        // The scheduler's points come only with a reader that slept.
        .filter(|c| !c.starts_with("sched_"))
        .collect();
    let n = delivered.len() as f64;
    let on_path: Vec<&str> = cols
        .iter()
        .map(String::as_str)
        .filter(|c| {
            let have: i64 = conn
                .query_row(
                    &format!("SELECT count({c}) FROM '{p}' WHERE kind = 1"),
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            have as f64 >= n / 2.0
        })
        .collect();
    for side in ["sock_send_enter_ns", "sock_recv_exit_ns"] {
        assert!(
            on_path.contains(&side),
            "{}: {side} is on every path, but the table has it for fewer than half the packets",
            d.name
        );
    }
    let complete = seqs(
        &conn,
        &format!(
            "SELECT seq FROM '{p}' WHERE kind = 1 AND NOT lost AND {}",
            on_path
                .iter()
                .map(|c| format!("{c} IS NOT NULL"))
                .collect::<Vec<_>>()
                .join(" AND ")
        ),
    );
    let missing: Vec<&u64> = delivered.difference(&complete).collect();
    assert!(
        missing.is_empty(),
        "{}: {} of {} delivered packets lack a point of {on_path:?}: {:?}",
        d.name,
        missing.len(),
        delivered.len(),
        &missing[..missing.len().min(20)]
    );
    on_path.join(", ")
}

/// The table's channel (sender's last wire point → receiver's first) is a
/// duration on the mapped clock: never below zero by more than the
/// mapping's uncertainty.
fn min_channel(packets: &Path) -> f64 {
    let conn = duckdb::Connection::open_in_memory().unwrap();
    conn.query_row(
        &format!(
            "SELECT min(channel_ns)::DOUBLE FROM '{}' WHERE channel_ns IS NOT NULL",
            packets.display()
        ),
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
#[ignore = "boots a QEMU guest (minutes of one core): run by `just vm-matrix` alone"]
fn host_and_guest_clocks_mapped_within_an_ntp_oracle_and_every_packet_joined() {
    let Some(_guard) = privileged("two_kernels") else {
        return;
    };
    let stage = Stage::for_guest().expect("stage");
    let scratch = Scratch::new("two_kernels");
    let out = scratch.path("guest");
    std::fs::create_dir_all(&out).unwrap();
    let console = std::fs::File::create(out.join("console.log")).unwrap();
    let mut boot = stage.host(0).command(repo().join("tests/vm/boot.sh"));
    boot.arg(suite())
        .arg("--rwdir")
        .arg(&out)
        .arg("--")
        .arg(repo().join("tests/vm/two_kernels.sh"))
        .arg(&out)
        .arg(bin("xlap-trace"))
        .arg(bin("xlap-example-plain"))
        .arg(xlap_stage::GUEST_MAC)
        .arg(COUNT.to_string())
        .arg(PERIOD_US.to_string())
        .env(
            "XLAP_VM_QEMU_OPTS",
            format!("-accel tcg,thread=single {}", stage.guest_qemu_opts()),
        )
        .stdin(Stdio::null())
        .stdout(console.try_clone().unwrap())
        .stderr(console)
        .process_group(0);
    let mut guest = Guest(boot.spawn().expect("boot the guest"));
    await_guest(&mut guest, &out, &out.join("net.ready"), 600);

    // The peer link's shared token, for both recorders.
    let mut random = [0u8; 24];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut random,
    )
    .unwrap();
    let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(out.join("token"), token).unwrap();
    let before = oracle(&stage);
    let forward = host_sends(&stage, &mut guest, &out, &scratch);
    let backward = guest_sends(&stage, &mut guest, &out, &scratch);
    let streamed = guest_streams(&stage, &mut guest, &out, &scratch);
    let killed = guest_recorder_killed(&stage, &mut guest, &out, &scratch);
    let after = oracle(&stage);
    go(&stage, "end");
    let guest_meta = run_meta(&forward.guest_run);
    let host_meta = run_meta(&forward.host_run);
    assert_ne!(
        guest_meta.boot_id, host_meta.boot_id,
        "the guest is another kernel"
    );

    // The guest's clock against the host's over the whole session, from the
    // oracle alone: its drift within the two probes' bounds.
    let span = after.host_ns - before.host_ns;
    let oracle_drift = (after.theta_ns - before.theta_ns) / span * 1e6;
    let oracle_drift_bound = (after.half_width_ns + before.half_width_ns) / span * 1e6;
    let mut report = format!(
        "oracle: θ {:.0} ± {:.0} ns before, {:.0} ± {:.0} ns after ({:.1} s later): drift {oracle_drift:.2} ± {oracle_drift_bound:.2} ppm\n",
        before.theta_ns,
        before.half_width_ns,
        after.theta_ns,
        after.half_width_ns,
        span / 1e9
    );
    for d in [&forward, &backward, &streamed] {
        let (packets, c) = joined(d, &scratch);
        let m = &c["clocks"][1];
        assert_eq!(
            m["domain"].as_str(),
            Some(guest_meta.boot_id.as_str()),
            "{c}"
        );
        assert!(
            m["method"].as_str().unwrap().starts_with("two-way"),
            "{}: {m}",
            d.name
        );
        let u = m["uncertainty_ns"].as_f64().unwrap();
        // Both intervals hold the true offset: they must overlap.
        let predicted = theta_at(m, d.during.host_ns);
        let off = (predicted - d.during.theta_ns).abs();
        assert!(
            off <= u + d.during.half_width_ns,
            "{}: the mapping says θ = {predicted:.0} ± {u:.0} ns at the oracle's probe, the oracle {:.0} ± {:.0} ns: {m}",
            d.name,
            d.during.theta_ns,
            d.during.half_width_ns
        );
        // The drift: both bounds hold the truth, so they overlap.
        let drift = m["drift_ppm"].as_f64().unwrap();
        let du = m["drift_uncertainty_ppm"].as_f64().unwrap();
        assert!(
            (drift - oracle_drift).abs() <= du + oracle_drift_bound,
            "{}: drift {drift:.2} ± {du:.2} ppm, the oracle's {oracle_drift:.2} ± {oracle_drift_bound:.2}: {m}",
            d.name
        );
        let channel = min_channel(&packets);
        assert!(
            channel >= -u,
            "{}: a channel of {channel} ns, below zero by more than the uncertainty {u:.0}",
            d.name
        );
        let points = check_packets(d, &packets);
        report += &format!(
            "{}: mapping θ {:.0} ns (t0) ± {u:.0} ns, drift {drift:.2} ± {du:.2} ppm, {} windows; at the oracle's probe {predicted:.0} vs {:.0} ± {:.0} (off {off:.0}); min channel {channel:.0} ns; {COUNT} packets complete at {points}\n",
            d.name,
            m["offset_ns"].as_f64().unwrap(),
            m["windows"],
            d.during.theta_ns,
            d.during.half_width_ns
        );
    }
    report += &killed;
    // The numbers the closing note quotes.
    eprintln!("{report}");
    std::fs::write(scratch.0.with_extension("report"), &report).unwrap();
    let _ = guest.0.wait();
}
