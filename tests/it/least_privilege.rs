//! Privileged: `xlap-trace record` under `capsh` with exactly the
//! capabilities its table says it needs traces both ends of the example
//! protocol whole (checked against the protocol's own logs: the receiver's
//! ports found, every datagram at the receive points); without any one of
//! the required capabilities it refuses to start (exit 3) and names it;
//! what it writes is private to its owner unless `--umask` says otherwise.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use xlap_capture::capabilities::{KEPT_AFTER_ATTACH, NEEDS};
use xlap_records::run_meta::RunMeta;
use xlap_stage::Stage;
use xlap_tests::example::{ExampleOptions, ProtocolRun};
use xlap_tests::multiset::{assert_same, logged, stamped};
use xlap_tests::trace::{read_stamps, run_meta, traced, Recorder, SEQ_U64_LE};
use xlap_tests::{bin, privileged, KillOnDrop, Scratch};

/// linux/capability.h, 0..=40.
const ALL: [&str; 41] = [
    "cap_chown",
    "cap_dac_override",
    "cap_dac_read_search",
    "cap_fowner",
    "cap_fsetid",
    "cap_kill",
    "cap_setgid",
    "cap_setuid",
    "cap_setpcap",
    "cap_linux_immutable",
    "cap_net_bind_service",
    "cap_net_broadcast",
    "cap_net_admin",
    "cap_net_raw",
    "cap_ipc_lock",
    "cap_ipc_owner",
    "cap_sys_module",
    "cap_sys_rawio",
    "cap_sys_chroot",
    "cap_sys_ptrace",
    "cap_sys_pacct",
    "cap_sys_admin",
    "cap_sys_boot",
    "cap_sys_nice",
    "cap_sys_resource",
    "cap_sys_time",
    "cap_sys_tty_config",
    "cap_mknod",
    "cap_lease",
    "cap_audit_write",
    "cap_audit_control",
    "cap_setfcap",
    "cap_mac_override",
    "cap_mac_admin",
    "cap_syslog",
    "cap_wake_alarm",
    "cap_block_suspend",
    "cap_audit_read",
    "cap_perfmon",
    "cap_bpf",
    "cap_checkpoint_restore",
];

/// A script that runs xlap-trace with only the capabilities `keep` (their
/// bits) in its bounding set, hence in its effective set as root.
fn with_only(scratch: &Scratch, name: &str, keep: &[u32]) -> PathBuf {
    let last: usize = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .map_or(40, |s| s.trim().parse().unwrap_or(40));
    let drop: Vec<&str> = ALL
        .iter()
        .enumerate()
        .filter(|(bit, _)| *bit <= last && !keep.contains(&(*bit as u32)))
        .map(|(_, n)| *n)
        .collect();
    let script = scratch.path(name);
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec capsh --drop={} -- -c 'exec \"$0\" \"$@\"' {} \"$@\"\n",
            drop.join(","),
            bin("xlap-trace").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Whether a short run of the example under `script` past the capability
/// check is whole: exit 0, the receiver's port found, and every datagram
/// it read stamped at the socket.
fn whole_without(stage: &Stage, scratch: &Scratch, script: &Path, cap: &str) -> bool {
    let run = ProtocolRun::spawn(
        stage,
        scratch,
        &ExampleOptions {
            count: 100,
            period_us: 1000,
            gated: true,
            ..Default::default()
        },
    );
    let pids = run.pids();
    let dir = scratch.path(&format!("unchecked-{cap}"));
    let ready = dir.with_extension("ready");
    let mut rec = KillOnDrop(
        Command::new(script)
            .args(["record", "--skip-capability-check", "--no-correlate", "-o"])
            .arg(&dir)
            .arg("--ready-file")
            .arg(&ready)
            .args(["--pid", &pids.0.to_string(), "--pid", &pids.1.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let start = std::time::Instant::now();
    while !ready.exists() && start.elapsed().as_secs() < 30 {
        if let Ok(Some(_)) = rec.0.try_wait() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    run.start();
    let (_, received) = run.wait();
    let status = rec.0.wait().unwrap();
    if !status.success() {
        return false;
    }
    let meta = run_meta(&dir);
    let receiver_ports = meta.targets.get(1).map_or(0, |t| t.udp_ports.len());
    let rows = read_stamps(&dir.join("stamps.parquet"));
    let at_socket = stamped(&rows, "sock.recv_exit", pids.1);
    let read = logged(&received, "received");
    receiver_ports > 0 && read.keys().all(|k| at_socket.contains_key(k))
}

fn required() -> Vec<u32> {
    NEEDS.iter().filter(|n| n.required).map(|n| n.bit).collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn the_required_capabilities_trace_everything_and_each_is_needed() {
    let Some(_guard) = privileged("least_privilege") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("least-privilege");
    let only_required = with_only(&scratch, "xlap-required", &required());

    // Exactly the required set: both ends whole.
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: 400,
            period_us: 500,
            gated: true,
            markers: true,
            ..Default::default()
        },
    );
    let pids = run.pids();
    let dir = scratch.path("run");
    let rec = Recorder::start_binary(
        &only_required,
        &[pids.0, pids.1],
        &dir,
        &["--metrics", "127.0.0.1:0"],
    );
    // Attached: every thread of the recorder holds at most what the rest
    // of the run needs.
    let kept: u64 = KEPT_AFTER_ATTACH.iter().map(|b| 1u64 << b).sum();
    let tasks = std::fs::read_dir(format!("/proc/{}/task", rec.child.id())).unwrap();
    let mut threads = 0;
    for task in tasks {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap();
        assert_eq!(eff & !kept, 0, "a recorder thread holds {eff:#x}");
        threads += 1;
    }
    assert!(threads >= 2, "the metrics thread too");
    run.start();
    let (sent, received) = run.wait();
    let out = rec.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let meta = run_meta(&dir);
    let ports: Vec<u64> = meta
        .targets
        .iter()
        .flat_map(|t| t.udp_ports.iter().map(|&p| u64::from(p)))
        .collect();
    assert!(
        ports.contains(&9000) && ports.contains(&9001),
        "ports found: {ports:?} ({stderr})"
    );
    let rows = read_stamps(&dir.join("stamps.parquet"));
    let received_log = logged(&received, "received");
    assert!(received_log.len() >= 400);
    for point in traced(&meta, &["sock.recv_exit", "sock.queue", "dev.receive_skb"]) {
        let at = stamped(&rows, point, pids.1);
        let missing: Vec<_> = received_log
            .keys()
            .filter(|k| !at.contains_key(k))
            .take(10)
            .collect();
        assert!(
            missing.is_empty(),
            "{point}: received, not stamped: {missing:?}"
        );
    }
    assert_same(
        &stamped(&rows, "sock.send_enter", pids.0),
        &logged(&sent, "sent"),
        "sock.send_enter",
    );
    assert!(
        rows.iter().any(|r| r.point.starts_with("app.")),
        "marker stamps under the required set"
    );
    // Private by default.
    assert_eq!(mode(&dir), 0o700, "run directory");
    for file in [
        "stamps.parquet",
        "stamps.arrows",
        "run.json",
        "packets.parquet",
    ] {
        assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
    }

    // Without any one required capability: refused at the start, named;
    // and the kernel's refusal behind the check: past it
    // (--skip-capability-check) the run fails, or misses the receiver's
    // port or its datagrams at the socket.
    // A target with a UDP socket: one with none would end its run with
    // exit 7 (nothing to key), which is not what these runs check.
    let target = KillOnDrop(
        Command::new("python3")
            .args([
                "-c",
                "import socket, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1', 0)); time.sleep(30)",
            ])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Until its socket is bound (python starts in tens of ms).
    let bound = std::time::Instant::now();
    let has_socket = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .any(|l| l.to_string_lossy().starts_with("socket:"))
        })
    };
    while !has_socket(target.0.id()) {
        assert!(
            bound.elapsed().as_secs() < 20,
            "the target did not open its socket"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for need in NEEDS.iter().filter(|n| n.required) {
        let keep: Vec<u32> = required().into_iter().filter(|b| *b != need.bit).collect();
        let script = with_only(&scratch, &format!("xlap-without-{}", need.bit), &keep);
        let out = Command::new(&script)
            .args([
                "record",
                "--pid",
                &target.0.id().to_string(),
                "--duration",
                "1",
                "-o",
            ])
            .arg(scratch.path(&format!("refused-{}", need.bit)))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(3),
            "without {}: {stderr}",
            need.name
        );
        assert!(stderr.contains(need.name), "names {}: {stderr}", need.name);
        assert!(
            !whole_without(&stage, &scratch, &script, need.name),
            "{} is in the table, yet a run without it past the check was whole",
            need.name
        );
    }

    // --umask 022 shares the run read-only.
    let shared = scratch.path("shared");
    let out = Command::new(bin("xlap-trace"))
        .args([
            "record",
            "--pid",
            &target.0.id().to_string(),
            "--duration",
            "0.5",
        ])
        .args(["--umask", "022", "--no-correlate", "-o"])
        .arg(&shared)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&shared), 0o755);
    assert_eq!(mode(&shared.join("run.json")), 0o644);
}

/// Every file a run writes, Parquet decoded to text by DuckDB: none holds
/// payload bytes beyond the sequence number (a marker string sent in every
/// datagram of a third-party-style program never appears).
#[test]
fn payload_bytes_beyond_seq_and_kind_are_never_stored() {
    let Some(_guard) = privileged("payload_privacy") else {
        return;
    };
    const MARKER: &str = "XLAP-PRIVATE-PAYLOAD-7f3a";
    let scratch = Scratch::new("payload-privacy");
    let gate = scratch.path("gate");
    let script = format!(
        r#"
import os, socket, struct, sys, time
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); tx.connect(rx.getsockname())
while not os.path.exists(sys.argv[1]): time.sleep(0.005)
for seq in range(200):
    tx.send(struct.pack("<Q", seq) + b"{MARKER}" * 4)
    assert b"{MARKER}" in rx.recv(256)
    time.sleep(0.001)
"#
    );
    let sender = Command::new("python3")
        .args(["-c", &script])
        .arg(&gate)
        .stdin(Stdio::null())
        .spawn()
        .expect("python3");
    let dir = scratch.path("run");
    let rec = Recorder::start(&[sender.id()], &dir, SEQ_U64_LE);
    std::fs::write(&gate, "go").unwrap();
    let mut sender = KillOnDrop(sender);
    assert!(sender.0.wait().unwrap().success(), "the sender failed");
    rec.wait();
    let rows = read_stamps(&dir.join("stamps.parquet"));
    assert!(
        rows.iter().filter(|r| r.point == "sock.send_enter").count() >= 200,
        "the datagrams were stamped"
    );
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = if path.extension().is_some_and(|e| e == "parquet") {
            let csv = scratch.path("decoded.csv");
            conn.execute_batch(&format!(
                "COPY (SELECT * FROM read_parquet('{}')) TO '{}' (HEADER)",
                path.display(),
                csv.display()
            ))
            .unwrap();
            std::fs::read(&csv).unwrap()
        } else {
            std::fs::read(&path).unwrap()
        };
        assert!(!bytes.is_empty() || path.extension().is_some_and(|e| e == "ready"));
        let found = bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes());
        assert!(!found, "{} holds payload bytes", path.display());
        checked += 1;
    }
    assert!(
        checked >= 4,
        "stamps.arrows, stamps.parquet, run.json, packets.parquet"
    );
}

/// A target's sockets the recorder cannot see are counted and said, never
/// an empty run that looks whole: without CAP_SYS_PTRACE over a target
/// (past the check with --skip-capability-check), the UDP sockets the
/// target reports holding (one unbound, one bound) are counted as not
/// traced in run.json, and with it the same target's bound port is traced
/// and nothing is counted.
#[test]
fn sockets_the_recorder_cannot_see_are_counted() {
    let Some(_guard) = privileged("sockets_not_traced") else {
        return;
    };
    let scratch = Scratch::new("sockets-not-traced");
    let holder = |name: &str| {
        let log = scratch.path(&format!("{name}.log"));
        let child = KillOnDrop(
            Command::new("python3")
                .args([
                    "-c",
                    "import socket, sys, time\n\
                     a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                     b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); b.bind(('127.0.0.1', 0))\n\
                     open(sys.argv[1], 'w').write('%d %d %d' % (a.fileno(), b.fileno(), b.getsockname()[1]))\n\
                     time.sleep(30)",
                ])
                .arg(&log)
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let start = std::time::Instant::now();
        let account = loop {
            if let Ok(text) = std::fs::read_to_string(&log) {
                let fields: Vec<u32> = text.split(' ').filter_map(|f| f.parse().ok()).collect();
                if fields.len() == 3 {
                    break fields;
                }
            }
            assert!(start.elapsed().as_secs() < 20, "the target did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        (child, account[2] as u64)
    };
    let record = |script: &Path, pid: u32, name: &str| {
        let dir = scratch.path(name);
        let out = Command::new(script)
            .args(["record", "--skip-capability-check", "--no-usdt"])
            .args(["--no-correlate", "--duration", "0.5", "--pid"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{name}: {stderr}");
        (run_meta(&dir), stderr)
    };
    let ports = |meta: &RunMeta| -> Vec<u64> {
        meta.targets[0]
            .udp_ports
            .iter()
            .map(|&p| u64::from(p))
            .collect()
    };

    let without: Vec<u32> = required().into_iter().filter(|b| *b != 19).collect();
    let (target, port) = holder("unseen");
    let (meta, stderr) = record(
        &with_only(&scratch, "xlap-no-ptrace", &without),
        target.0.id(),
        "unseen",
    );
    assert!(
        !ports(&meta).contains(&port),
        "traced without ptrace access? {stderr}"
    );
    assert_eq!(meta.sockets_not_traced.processes_unreadable, 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the sockets pid {} holds cannot be listed",
            target.0.id()
        )),
        "{stderr}"
    );

    let (target, port) = holder("seen");
    let (meta, stderr) = record(
        &with_only(&scratch, "xlap-required-only", &required()),
        target.0.id(),
        "seen",
    );
    assert!(ports(&meta).contains(&port), "{stderr}");
    let counted = &meta.sockets_not_traced;
    for (reason, n) in [
        ("processes_unreadable", counted.processes_unreadable),
        ("not_inspectable", counted.not_inspectable),
        ("duplicate_refused", counted.duplicate_refused),
        ("mark_refused", counted.mark_refused),
    ] {
        assert_eq!(n, 0, "{reason}: {stderr}");
    }
}
