//! Privileged: container attribution (issue 55). The example's sender and
//! receiver run in two real cgroups the test makes under the cgroup2 root;
//! every stamp taken in a process's name carries the cgroup id that
//! `/proc/PID/cgroup` (and the cgroup directory's inode) gave for that
//! process, every device stamp the network namespace inode that the
//! stage's `ip netns` name (`/var/run/netns/NAME`) of the socket owner's
//! host has, and run.json names both cgroups by their paths.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use xlap_records::points::{RX_DEVICE_POINTS, TX_DEVICE_POINTS};
use xlap_stage::Stage;
use xlap_tests::example::{ExampleOptions, ProtocolRun};
use xlap_tests::privileged;
use xlap_tests::trace::{read_stamps, run_meta, Recorder};
use xlap_tests::Scratch;

/// The cgroup2 mount point, from /proc/self/mountinfo (`/sys/fs/cgroup` on
/// a pure v2 host, `/sys/fs/cgroup/unified` on a hybrid one).
fn cgroup2_root() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(left.split_whitespace().nth(4)?))
    })
}

/// A cgroup the test made; removed when dropped, also after a failed
/// assertion (its processes moved back to the root first).
struct TestCgroup {
    root: PathBuf,
    dir: PathBuf,
}

impl TestCgroup {
    fn new(root: &Path, name: &str) -> TestCgroup {
        TestCgroup::exact(root, &format!("xlap-test-{}-{name}", std::process::id()))
    }

    /// A cgroup of exactly that name below the root (a runtime's shape).
    fn exact(root: &Path, name: &str) -> TestCgroup {
        let dir = root.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        TestCgroup {
            root: root.to_path_buf(),
            dir,
        }
    }

    /// Moves process `pid` (all its threads) here.
    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} to {}: {e}", self.dir.display()));
    }

    /// Its path below the root, as /proc/PID/cgroup writes it.
    fn path(&self) -> String {
        format!("/{}", self.dir.strip_prefix(&self.root).unwrap().display())
    }

    /// Its cgroup v2 id: its directory's inode number.
    fn id(&self) -> u64 {
        std::fs::metadata(&self.dir).unwrap().ino()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove the test cgroup {}", self.dir.display());
    }
}

/// The cgroup path `/proc/PID/cgroup` gives for `pid` (its `0::` line).
fn proc_cgroup(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    xlap_records::cgroups::unified_path(&text)
        .unwrap_or_else(|| panic!("no cgroup v2 line for {pid}: {text}"))
        .to_string()
}

#[test]
fn stamps_carry_each_process_cgroup_and_each_device_netns() {
    let Some(_guard) = privileged("cgroups") else {
        return;
    };
    let Some(root) = cgroup2_root() else {
        xlap_tests::may_skip("cgroups", "no cgroup2 hierarchy is mounted");
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    // The receiver's cgroup has the path Docker's systemd driver gives a
    // container's (`docker-<64 hex>.scope`): its container is named by it.
    let container_id = format!("5a1e{:060x}", std::process::id());
    let (cg_a, cg_b) = (
        TestCgroup::new(&root, "a"),
        TestCgroup::exact(&root, &format!("docker-{container_id}.scope")),
    );
    let scratch = Scratch::new("cgroups");
    let opts = ExampleOptions {
        count: 300,
        markers: true,
        gated: true,
        ..Default::default()
    };
    let run = ProtocolRun::spawn(&stage, &scratch, &opts);
    let (sender, receiver) = run.pids();
    cg_a.enter(sender);
    cg_b.enter(receiver);
    // The outside account: what the kernel says of each process.
    assert_eq!(proc_cgroup(sender), cg_a.path());
    assert_eq!(proc_cgroup(receiver), cg_b.path());
    let cgroup_of = |pid: u32| {
        if pid == sender {
            Some(cg_a.id())
        } else if pid == receiver {
            Some(cg_b.id())
        } else {
            None
        }
    };
    let netns_of = |host: usize| {
        std::fs::metadata(format!("/var/run/netns/{}", stage.host(host).netns))
            .unwrap()
            .ino() as u32
    };
    let (netns_a, netns_b) = (netns_of(0), netns_of(1));
    assert_ne!(netns_a, netns_b);

    let rec = Recorder::start(&[sender, receiver], &scratch.path("run"), &[]);
    run.start();
    let (sent, received) = run.wait();
    let dir = rec.dir.clone();
    rec.wait();
    assert!(!sent.is_empty(), "the sender's log");
    assert!(!received.is_empty(), "the receiver's log");
    let stamps = read_stamps(&dir.join("stamps.parquet"));

    let mut checked = std::collections::BTreeMap::<&str, usize>::new();
    for s in &stamps {
        let point = s.point.as_str();
        let process_point = point.starts_with("app.")
            || matches!(
                point,
                "sock.send_enter"
                    | "sock.send_exit"
                    | "sock.recv_exit"
                    | "sched.wakeup"
                    | "sched.switch_in"
            );
        if process_point {
            assert_eq!(
                s.cgroup_id,
                cgroup_of(s.pid),
                "{point} of pid {} (seq {:?}): /proc/{}/cgroup said {}",
                s.pid,
                s.seq,
                s.pid,
                proc_cgroup_or_gone(s.pid)
            );
            assert_eq!(s.netns, None, "{point}");
        } else if TX_DEVICE_POINTS.contains(&point) || RX_DEVICE_POINTS.contains(&point) {
            // The device of the socket owner's host, both ways (the
            // receiver sends feedback back).
            let netns = if s.pid == sender { netns_a } else { netns_b };
            assert_eq!(
                (s.netns, s.cgroup_id),
                (Some(netns), None),
                "{point} of pid {}",
                s.pid
            );
        } else {
            assert_eq!((s.netns, s.cgroup_id), (None, None), "{point}");
        }
        *checked.entry(point_kind(point)).or_default() += 1;
    }
    eprintln!("stamps checked: {checked:?}");
    for kind in [
        "app",
        "sock.send",
        "sock.recv_exit",
        "sched",
        "dev tx",
        "dev rx",
    ] {
        assert!(
            checked.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} stamps: {checked:?}"
        );
    }

    // run.json names both cgroups by the paths /proc gave.
    let meta = run_meta(&dir);
    for cg in [&cg_a, &cg_b] {
        let listed = meta
            .cgroups
            .iter()
            .find(|c| c.id == cg.id())
            .unwrap_or_else(|| panic!("{} not in run.json: {:?}", cg.path(), meta.cgroups));
        assert_eq!(listed.path.as_deref(), Some(cg.path().as_str()));
        let container = listed
            .container
            .as_ref()
            .map(|c| (c.runtime.as_str(), c.id.as_str()));
        let want = (cg.id() == cg_b.id()).then_some(("docker", container_id.as_str()));
        assert_eq!((container, &listed.pod_uid), (want, &None), "{}", cg.path());
    }

    // The packets table: each packet's sender and receiver cgroup, as the
    // processes at its two ends had them.
    let out = std::process::Command::new(xlap_tests::bin("xlap-trace"))
        .arg("sql")
        .arg(&dir)
        .arg(
            "SELECT tx_pid, rx_pid, tx_cgroup, rx_cgroup, count(*) AS n FROM packets \
             WHERE rx_pid IS NOT NULL GROUP BY ALL ORDER BY ALL",
        )
        .args(["-f", "json"])
        .output()
        .expect("xlap-trace sql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let groups: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON rows");
    let groups = groups.as_array().expect("rows");
    eprintln!("packets by end: {groups:?}");
    assert!(!groups.is_empty());
    let of = |v: &serde_json::Value| v.as_u64().map(|p| p as u32);
    for g in groups {
        let (tx, rx) = (of(&g["tx_pid"]).unwrap(), of(&g["rx_pid"]).unwrap());
        assert_eq!(g["tx_cgroup"].as_u64(), cgroup_of(tx), "{g}");
        // Null where the receiver took no stamp in its own name for the
        // packet (it reached the device and the socket, never the read).
        if !g["rx_cgroup"].is_null() {
            assert_eq!(g["rx_cgroup"].as_u64(), cgroup_of(rx), "{g}");
        }
    }
    let read_by_receiver: u64 = groups
        .iter()
        .filter(|g| of(&g["tx_pid"]) == Some(sender) && !g["rx_cgroup"].is_null())
        .map(|g| g["n"].as_u64().unwrap())
        .sum();
    assert!(read_by_receiver > 0, "{groups:?}");

    // The bundled split (`analyze -q cgroups`, `--by`): the stages of the
    // packets the sender sent and the receiver read stand under their two
    // cgroups' paths, or their containers (the sender's in none), and
    // nowhere else.
    for (by, a_name, b_name) in [
        ("cgroup", cg_a.path(), cg_b.path()),
        (
            "container",
            "-".to_string(),
            format!("docker:{container_id}"),
        ),
    ] {
        let rows = xlap_tests::trace::analyze_rows(&dir, "cgroups", &["--by", by]);
        let pair = |r: &serde_json::Value| {
            (
                r["tx"].as_str().map(str::to_string),
                r["rx"].as_str().map(str::to_string),
            )
        };
        assert!(
            rows.iter()
                .any(|r| pair(r) == (Some(a_name.clone()), Some(b_name.clone()))
                    && r["stage"] == "e2e"
                    && r["packets"].as_u64() > Some(0)),
            "--by {by}: no end-to-end row from {a_name} to {b_name}: {rows:?}"
        );
        let known = [None, Some(a_name.clone()), Some(b_name.clone())];
        for r in &rows {
            let (tx, rx) = pair(r);
            assert!(known.contains(&tx) && known.contains(&rx), "--by {by}: {r}");
        }
    }
    drop((cg_a, cg_b));
}

fn proc_cgroup_or_gone(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|t| xlap_records::cgroups::unified_path(&t).map(str::to_string))
        .unwrap_or_else(|| "(gone)".into())
}

fn point_kind(point: &str) -> &'static str {
    if point.starts_with("app.") {
        "app"
    } else if point.starts_with("sock.send") {
        "sock.send"
    } else if point == "sock.recv_exit" {
        "sock.recv_exit"
    } else if point.starts_with("sched.") {
        "sched"
    } else if TX_DEVICE_POINTS.contains(&point) {
        "dev tx"
    } else if RX_DEVICE_POINTS.contains(&point) {
        "dev rx"
    } else {
        "other"
    }
}

/// `record --cgroup PATH` traces the processes in the cgroup and none
/// outside it: two example pairs run side by side, one in the cgroup.
#[test]
fn record_cgroup_traces_the_cgroup_processes_only() {
    let Some(_guard) = privileged("cgroups") else {
        return;
    };
    let Some(root) = cgroup2_root() else {
        xlap_tests::may_skip("cgroups", "no cgroup2 hierarchy is mounted");
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let cg = TestCgroup::new(&root, "traced");
    let scratch = Scratch::new("record-cgroup");
    let opts = ExampleOptions {
        count: 200,
        gated: true,
        ..Default::default()
    };
    let inside = ProtocolRun::spawn(&stage, &scratch, &opts);
    let outside_scratch = Scratch::new("record-cgroup-outside");
    let outside = ProtocolRun::spawn(
        &stage,
        &outside_scratch,
        &ExampleOptions {
            port_offset: 10,
            ..opts.clone()
        },
    );
    let (s_in, r_in) = inside.pids();
    let (s_out, r_out) = outside.pids();
    cg.enter(s_in);
    cg.enter(r_in);
    assert_eq!(proc_cgroup(s_in), cg.path());
    assert_ne!(proc_cgroup(s_out), cg.path());
    let rec = Recorder::start(&[], &scratch.path("run"), &["--cgroup", &cg.path()]);
    inside.start();
    outside.start();
    let (_, received_in) = inside.wait();
    let (_, received_out) = outside.wait();
    assert!(!received_in.is_empty() && !received_out.is_empty());
    let dir = rec.dir.clone();
    // A traced cgroup keeps the run going (a process may enter it later).
    rec.interrupt();
    rec.wait();
    let stamps = read_stamps(&dir.join("stamps.parquet"));
    let by_pid = stamps.iter().fold(
        std::collections::BTreeMap::<u32, usize>::new(),
        |mut m, s| {
            *m.entry(s.pid).or_default() += 1;
            m
        },
    );
    eprintln!("stamps by pid: {by_pid:?} (inside {s_in}, {r_in}; outside {s_out}, {r_out})");
    assert!(by_pid.get(&s_in).copied().unwrap_or(0) > 0, "{by_pid:?}");
    assert!(by_pid.get(&r_in).copied().unwrap_or(0) > 0, "{by_pid:?}");
    for pid in by_pid.keys() {
        assert!(
            [s_in, r_in].contains(pid),
            "a stamp of pid {pid}, outside the cgroup"
        );
    }
    let meta = run_meta(&dir);
    let targets: Vec<u32> = meta.targets.iter().map(|t| t.pid).collect();
    assert_eq!(targets.len(), 2, "{targets:?}");
    assert!(targets.contains(&s_in) && targets.contains(&r_in));
}

/// `record --cgroup PATH` on an empty cgroup traces the processes that
/// enter it after the run began: the example pair starts outside and each
/// program moves itself in before its exec (as `systemd-run --scope` and
/// `docker exec` do), before it opens its socket; a pair outside stays
/// untraced.
#[test]
fn record_cgroup_traces_processes_that_enter_later() {
    let Some(_guard) = privileged("cgroups") else {
        return;
    };
    let Some(root) = cgroup2_root() else {
        xlap_tests::may_skip("cgroups", "no cgroup2 hierarchy is mounted");
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let cg = TestCgroup::new(&root, "future");
    assert_eq!(
        std::fs::read_to_string(cg.dir.join("cgroup.procs")).unwrap(),
        "",
        "a fresh cgroup is empty"
    );
    let scratch = Scratch::new("record-cgroup-future");
    let rec = Recorder::start(&[], &scratch.path("run"), &["--cgroup", &cg.path()]);
    let opts = ExampleOptions {
        count: 200,
        gated: true,
        enter_cgroup: Some(cg.dir.join("cgroup.procs")),
        ..Default::default()
    };
    let inside = ProtocolRun::spawn(&stage, &scratch, &opts);
    let outside_scratch = Scratch::new("record-cgroup-future-outside");
    let outside = ProtocolRun::spawn(
        &stage,
        &outside_scratch,
        &ExampleOptions {
            port_offset: 10,
            enter_cgroup: None,
            ..opts.clone()
        },
    );
    let (s_in, r_in) = inside.pids();
    let (s_out, r_out) = outside.pids();
    // The outside account: where the kernel says each process is. The
    // receiver is past its exec (its socket is bound: ProtocolRun waited
    // for its ready file); the sender may still be the wrapper shell.
    assert_eq!(proc_cgroup(r_in), cg.path());
    for _ in 0..100 {
        if proc_cgroup(s_in) == cg.path() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(proc_cgroup(s_in), cg.path());
    assert_ne!(proc_cgroup(s_out), cg.path());
    assert_ne!(proc_cgroup(r_out), cg.path());
    inside.start();
    outside.start();
    let (sent_in, received_in) = inside.wait();
    let (_, received_out) = outside.wait();
    assert!(!received_out.is_empty(), "the outside pair's log");
    let dir = rec.dir.clone();
    rec.interrupt();
    rec.wait();
    let stamps = read_stamps(&dir.join("stamps.parquet"));
    let by_pid = stamps.iter().fold(
        std::collections::BTreeMap::<u32, usize>::new(),
        |mut m, s| {
            *m.entry(s.pid).or_default() += 1;
            m
        },
    );
    eprintln!("stamps by pid: {by_pid:?} (inside {s_in}, {r_in}; outside {s_out}, {r_out})");
    for pid in by_pid.keys() {
        assert!(
            [s_in, r_in].contains(pid),
            "a stamp of pid {pid}, outside the cgroup"
        );
    }
    assert_logs_stamped(&stamps, (s_in, &sent_in), (r_in, &received_in), 200);
}

/// Against the protocol's own logs: every data datagram the sender
/// (`pid`, its log) logged as sent (`count` of them) is stamped at its
/// send under its pid, every one the receiver logged at its read.
fn assert_logs_stamped(
    stamps: &[xlap_tests::trace::Row],
    (sender, sent_log): (u32, &[serde_json::Value]),
    (receiver, received_log): (u32, &[serde_json::Value]),
    count: usize,
) {
    let data = xlap_tests::example::kind_code("data");
    let logged = |log: &[serde_json::Value], event: &str| {
        xlap_tests::example::events(log, event)
            .filter(|e| e["kind"] == "data")
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<std::collections::BTreeSet<u64>>()
    };
    let stamped = |point: &str, pid: u32| {
        stamps
            .iter()
            .filter(|s| s.point == point && s.pid == pid && s.kind == Some(data) && !s.fragment)
            .filter_map(|s| s.seq)
            .collect::<std::collections::BTreeSet<u64>>()
    };
    let sent = logged(sent_log, "sent");
    let received = logged(received_log, "received");
    assert_eq!(sent.len(), count, "the sender's log");
    assert!(!received.is_empty(), "the receiver's log");
    assert_eq!(stamped("sock.send_enter", sender), sent);
    assert_eq!(stamped("sock.recv_exit", receiver), received);
}

/// Whether some `TARGET_PORTS` map of a loaded recorder has an entry owned
/// by `pid` (`bpftool`: the kernel's own account; the recorder registers a
/// process's ports after it has marked its sockets).
fn kernel_port_owner(pid: u32) -> bool {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "dump", "name", "TARGET_PORTS"])
        .output()
        .expect("bpftool");
    let Ok(dump) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return false;
    };
    // One map: a list of entries; several (other recorders): a list of
    // lists. A value as BTF gives it, or as its bytes.
    let mut entries = Vec::new();
    for e in dump.as_array().into_iter().flatten() {
        match e.as_array() {
            Some(inner) => entries.extend(inner.iter().cloned()),
            None => entries.push(e.clone()),
        }
    }
    entries.iter().any(|e| {
        e["formatted"]["value"].as_u64() == Some(pid as u64)
            || e["value"].as_array().is_some_and(|bytes| {
                let b: Vec<u8> = bytes
                    .iter()
                    .filter_map(|x| {
                        u8::from_str_radix(x.as_str()?.trim_start_matches("0x"), 16).ok()
                    })
                    .collect();
                b.len() == 4 && u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == pid
            })
    })
}

/// A process moved into the traced cgroup with its socket already open
/// (created before the run began, so neither a socket creation nor a fork
/// or exec tells the kernel side) is found by the recorder's rescan of
/// `cgroup.procs`, and its datagrams are stamped from then on.
#[test]
fn record_cgroup_adopts_processes_moved_in_with_open_sockets() {
    if std::process::Command::new("bpftool")
        .arg("version")
        .output()
        .is_err()
    {
        xlap_tests::may_skip("cgroups", "no bpftool to see the recorder's port table");
        return;
    }
    let Some(_guard) = privileged("cgroups") else {
        return;
    };
    let Some(root) = cgroup2_root() else {
        xlap_tests::may_skip("cgroups", "no cgroup2 hierarchy is mounted");
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let cg = TestCgroup::new(&root, "moved");
    let scratch = Scratch::new("record-cgroup-moved");
    // Sockets open (the receiver bound and ready, the sender bound and
    // waiting at its gate) before the recorder starts.
    let run = ProtocolRun::spawn(
        &stage,
        &scratch,
        &ExampleOptions {
            count: 200,
            gated: true,
            ..Default::default()
        },
    );
    let (sender, receiver) = run.pids();
    let rec = Recorder::start(&[], &scratch.path("run"), &["--cgroup", &cg.path()]);
    cg.enter(sender);
    cg.enter(receiver);
    assert_eq!(proc_cgroup(sender), cg.path());
    assert_eq!(proc_cgroup(receiver), cg.path());
    // A handshake, as the ready file is: traffic starts once the kernel
    // has both processes' ports.
    let start = std::time::Instant::now();
    while !(kernel_port_owner(sender) && kernel_port_owner(receiver)) {
        assert!(
            start.elapsed().as_secs() < xlap_tests::start_secs(),
            "the recorder did not take the moved processes' ports"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    run.start();
    let (sent_log, received_log) = run.wait();
    let dir = rec.dir.clone();
    rec.interrupt();
    rec.wait();
    let stamps = read_stamps(&dir.join("stamps.parquet"));
    assert_logs_stamped(&stamps, (sender, &sent_log), (receiver, &received_log), 200);
}
