//! Privileged: traced processes that attack the recorder
//! (docs/threat-model.md). The targets run as `nobody` and do what a hostile process can:
//! scribble its marker ring's header and records, truncate or remove the
//! ring file, declare a marker whose name is SQL, bind-mount a directory it
//! cannot write over its `/dev/shm`. Each test checks the recorder against
//! the programs' own logs: it survives, the other processes' stamps are all
//! there, what the hostile one corrupted is counted, and nothing is written
//! outside the files the recorder makes.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use xlap_records::run_meta::{MarkerRing, RunMeta};
use xlap_tests::c_programs::{hostile_target, udp_loop, udp_loop_log};
use xlap_tests::trace::{read_stamps, run_meta, Recorder, Row, SEQ_U64_LE};
use xlap_tests::{bin, privileged, KillOnDrop, Scratch};

const COUNT: u64 = 600;
const NOBODY: u32 = 65534;
/// Where the SQL in the hostile marker's name would write.
const PWN: &str = "/tmp/xlap-pwn.csv";
const APP_POINTS: [&str; 3] = ["app.send_start", "app.submit", "app.deliver"];

/// A directory `nobody` can reach (the scratch directory is root's), for
/// the hostile program, its log and its gate; removed on drop.
struct World(PathBuf);

impl World {
    fn new(name: &str) -> World {
        let dir = std::env::temp_dir().join(format!("xlap-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        World(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The hostile program as `nobody`, optionally in a user and mount
/// namespace of its own with `shm` bind-mounted over its /dev/shm.
fn spawn_hostile(world: &World, port: u16, mode: &str, shm: Option<&Path>) -> KillOnDrop {
    let exe = world.path("hostile_target");
    if !exe.exists() {
        hostile_target(&exe);
    }
    let args = [
        port.to_string(),
        COUNT.to_string(),
        "500".into(),
        world.path(&format!("{mode}.log")).display().to_string(),
        world.path("gate").display().to_string(),
        mode.into(),
    ];
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid",
        &NOBODY.to_string(),
        "--regid",
        &NOBODY.to_string(),
        "--clear-groups",
        "--",
    ]);
    match shm {
        None => cmd.arg(&exe),
        Some(dir) => cmd
            .args(["unshare", "-Urm", "sh", "-c"])
            .arg(format!(
                "mount --bind {} /dev/shm && exec \"$0\" \"$@\"",
                dir.display()
            ))
            .arg(&exe),
    };
    // Killed if the test fails first: it would hold its port.
    KillOnDrop(
        cmd.args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("setpriv (util-linux)"),
    )
}

/// The program's own log, once it is written (the process runs the main
/// loop only after the gate, so the log exists early).
fn wait_for_log(path: &Path) {
    for _ in 0..500 {
        if path.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{} never appeared", path.display());
}

/// seq -> app points stamped for `pid`.
fn app_stamps(rows: &[Row], pid: u32) -> BTreeMap<u64, BTreeSet<String>> {
    let mut by_seq: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.pid == pid && r.point.starts_with("app."))
    {
        if let Some(seq) = r.seq {
            by_seq.entry(seq).or_default().insert(r.point.clone());
        }
    }
    by_seq
}

/// Every datagram the log names has all three app points.
fn assert_all_marked(rows: &[Row], pid: u32, log: &Path, what: &str) {
    let logged = udp_loop_log(log);
    assert_eq!(logged.len() as u64, COUNT, "{what}: its log");
    let stamps = app_stamps(rows, pid);
    for (seq, _) in logged {
        let have = stamps.get(&seq).cloned().unwrap_or_default();
        for p in APP_POINTS {
            assert!(have.contains(p), "{what}: seq {seq} has no {p}: {have:?}");
        }
    }
}

fn marker_ring(meta: &RunMeta, pid: u32) -> &MarkerRing {
    meta.marker_rings
        .iter()
        .find(|r| r.pid == pid)
        .unwrap_or_else(|| panic!("no marker ring of pid {pid}: {:#?}", meta.marker_rings))
}

/// No ring file of the recorder `pid` is left in /dev/shm.
fn assert_no_rings_of(pid: u32) {
    let prefix = format!("xlap-trace.{pid}.");
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "ring files left behind: {left:?}");
}

#[test]
fn a_scribbling_target_spoils_only_its_own_stamps() {
    let Some(_guard) = privileged("hostile_targets") else {
        return;
    };
    let _ = std::fs::remove_file(PWN);
    let scratch = Scratch::new("hostile-scribble");
    let world = World::new("hostile-scribble");
    let mut hostile = spawn_hostile(&world, 47321, "scribble", None);
    // A well-behaved neighbour, traced in the same recording.
    let good_log = scratch.path("good.log");
    let good_gate = scratch.path("good.gate");
    let mut good = KillOnDrop(
        Command::new(udp_loop(&scratch))
            .args(["47322", &COUNT.to_string(), "500"])
            .arg(&good_log)
            .arg(&good_gate)
            .stdout(Stdio::null())
            .spawn()
            .expect("udp_loop"),
    );
    wait_for_log(&world.path("scribble.log"));
    wait_for_log(&good_log);
    let dir = scratch.path("run");
    let rec = Recorder::start(&[hostile.0.id(), good.0.id()], &dir, SEQ_U64_LE);
    let recorder = rec.child.id();
    std::fs::write(world.path("gate"), "go").unwrap();
    std::fs::write(&good_gate, "go").unwrap();
    assert!(hostile.0.wait().unwrap().success(), "the hostile program");
    assert!(good.0.wait().unwrap().success(), "udp_loop");
    let out = rec.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);

    // The SQL-named marker was refused, and its SQL never ran.
    assert!(
        stderr.contains("is not traced: a point name"),
        "no note of the refused marker: {stderr}"
    );
    assert!(!Path::new(PWN).exists(), "the marker's SQL ran");
    let meta = run_meta(&dir);
    let rows = read_stamps(&dir.join("stamps.parquet"));
    assert!(
        rows.iter().all(|r| !r.point.contains('\'')),
        "refused point stamped"
    );

    // The neighbour is whole, against its own log, and its ring clean.
    assert_all_marked(&rows, good.0.id(), &good_log, "udp_loop");
    let clean = marker_ring(&meta, good.0.id());
    assert_eq!(clean.corrupt, 0, "{clean:#?}");
    assert_eq!(clean.header_faults, 0, "{clean:#?}");
    assert!(clean.switched_off.is_none(), "{clean:#?}");

    // The hostile ring's forgeries are counted, none became a stamp of
    // another process (pid 1) or a kind beyond 32 bits.
    let spoiled = marker_ring(&meta, hostile.0.id());
    let faults = spoiled.corrupt + spoiled.header_faults;
    assert!(faults > 0, "nothing counted corrupt: {spoiled:#?}");
    // Its claims (the dropped count in its header) are not the run's.
    let lost = meta.lost;
    assert!(lost < COUNT * 10, "losses the hostile ring claimed: {lost}");
    let pids: BTreeSet<u32> = rows
        .iter()
        .filter(|r| r.point.starts_with("app."))
        .map(|r| r.pid)
        .collect();
    assert!(
        pids.is_subset(&[hostile.0.id(), good.0.id()].into()),
        "app stamps of other processes: {pids:?}"
    );
    assert!(rows
        .iter()
        .all(|r| r.kind.is_none_or(|k| k == 1 || r.pid != hostile.0.id())));
    assert_no_rings_of(recorder);

    // The run analyses (the packets table was built from these names).
    assert!(
        dir.join("packets.parquet").exists(),
        "no packets table: {stderr}"
    );
    let analyze = Command::new(bin("xlap-trace"))
        .arg("analyze")
        .arg(&dir)
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(
        analyze.status.success(),
        "analyze: {}",
        String::from_utf8_lossy(&analyze.stderr)
    );
    assert!(!Path::new(PWN).exists(), "the marker's SQL ran in analyze");
}

#[test]
fn a_ring_truncated_or_removed_under_the_recorder_does_not_stop_it() {
    let Some(_guard) = privileged("hostile_targets") else {
        return;
    };
    let scratch = Scratch::new("hostile-truncate");
    let world = World::new("hostile-truncate");
    let mut truncating = spawn_hostile(&world, 47323, "truncate", None);
    let mut unlinking = spawn_hostile(&world, 47324, "unlink", None);
    wait_for_log(&world.path("truncate.log"));
    wait_for_log(&world.path("unlink.log"));
    let dir = scratch.path("run");
    let rec = Recorder::start(&[truncating.0.id(), unlinking.0.id()], &dir, SEQ_U64_LE);
    let recorder = rec.child.id();
    std::fs::write(world.path("gate"), "go").unwrap();
    assert!(
        truncating.0.wait().unwrap().success(),
        "the truncating program"
    );
    assert!(
        unlinking.0.wait().unwrap().success(),
        "the unlinking program"
    );
    let out = rec.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let meta = run_meta(&dir);
    let rows = read_stamps(&dir.join("stamps.parquet"));

    // Shrunk: the recorder read zeros instead of dying, and said so.
    let shrunk = marker_ring(&meta, truncating.0.id());
    assert!(
        shrunk
            .switched_off
            .as_ref()
            .is_some_and(|s| s.contains("shrunk")),
        "{shrunk:#?}"
    );
    assert!(stderr.contains("switched off"), "{stderr}");
    // Its honest stamps before the attack are kept.
    assert!(!app_stamps(&rows, truncating.0.id()).is_empty());
    // Removed: the file lives on in both mappings; every stamp is there.
    assert_all_marked(
        &rows,
        unlinking.0.id(),
        &world.path("unlink.log"),
        "unlinked ring",
    );
    assert_eq!(marker_ring(&meta, unlinking.0.id()).corrupt, 0);
    assert_no_rings_of(recorder);
}

#[test]
fn a_directory_the_target_cannot_write_gets_no_ring() {
    let Some(_guard) = privileged("hostile_targets") else {
        return;
    };
    let scratch = Scratch::new("hostile-bind");
    let world = World::new("hostile-bind");
    // Root's directory, which nobody may read but not write.
    let shm = world.path("roots-dir");
    std::fs::create_dir(&shm).unwrap();
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(std::fs::metadata(&shm).unwrap().uid(), 0);
    let mut target = spawn_hostile(&world, 47325, "none", Some(&shm));
    wait_for_log(&world.path("none.log"));
    let dir = scratch.path("run");
    let rec = Recorder::start(&[target.0.id()], &dir, SEQ_U64_LE);
    std::fs::write(world.path("gate"), "go").unwrap();
    assert!(target.0.wait().unwrap().success(), "the target");
    let out = rec.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let left: Vec<_> = std::fs::read_dir(&shm).unwrap().collect();
    assert!(left.is_empty(), "created in root's directory: {left:?}");
    assert!(
        stderr.contains("the in-process ring failed"),
        "no note of the refused ring: {stderr}"
    );
    // Its markers went to uprobes instead: every datagram is marked.
    let meta = run_meta(&dir);
    assert!(meta.marker_rings.is_empty(), "{:#?}", meta.marker_rings);
    let rows = read_stamps(&dir.join("stamps.parquet"));
    assert_all_marked(&rows, target.0.id(), &world.path("none.log"), "uprobes");
}
