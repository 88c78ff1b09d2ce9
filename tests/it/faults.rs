//! Privileged: faults a recording meets where users run it. SIGTERM twice
//! ends the run cleanly (the second one changes nothing); traced processes
//! killed mid-run end it with their data; a disk that fills up stops it
//! with an error that says what to do, and what was written is recovered
//! elsewhere: each time checked against the protocol's own log.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;
use xlap_records::run_meta::RunState;
use xlap_stage::Stage;
use xlap_tests::example::{ExampleOptions, ProtocolRun};
use xlap_tests::multiset::logged;
use xlap_tests::trace::{read_stamps, run_meta, Recorder};
use xlap_tests::{bin, privileged, Scratch};

fn send_stamps(dir: &std::path::Path, pid: u32) -> BTreeSet<(u64, u32)> {
    read_stamps(&dir.join("stamps.parquet"))
        .iter()
        .filter(|r| r.point == "sock.send_enter" && r.pid == pid)
        .filter_map(|r| Some((r.seq?, r.kind?)))
        .collect()
}

fn options() -> ExampleOptions {
    ExampleOptions {
        count: 3000,
        period_us: 1000,
        gated: true,
        ..Default::default()
    }
}

#[test]
fn sigterm_twice_ends_the_run_cleanly() {
    let Some(_guard) = privileged("faults_sigterm") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("fault-sigterm");
    let run = ProtocolRun::spawn(&stage, &scratch, &options());
    let pids = run.pids();
    let dir = scratch.path("run");
    let rec = Recorder::start(&[pids.0, pids.1], &dir, &["--no-correlate"]);
    run.start();
    std::thread::sleep(Duration::from_millis(1000));
    let pid = rec.child.id() as libc::pid_t;
    // SAFETY: signals to the recorder this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(5));
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let out = rec.wait();
    let meta = run_meta(&dir);
    assert_eq!(meta.state, RunState::Complete);
    assert_eq!(meta.stop_reason, "signal");
    let (sent, _) = run.wait();
    let stamped = send_stamps(&dir, pids.0);
    let logged_before: Vec<_> = logged(&sent, "sent")
        .into_keys()
        .filter(|k| stamped.contains(k))
        .collect();
    assert_eq!(
        logged_before.len(),
        stamped.len(),
        "every send stamp is a datagram the sender logged ({})",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stamped.len() > 500, "stamped {}", stamped.len());
    // Stamped up to the end: the datagrams sent in the run's first second
    // and a half are all there.
    let first = sent
        .iter()
        .filter_map(|e| e["t_ns"].as_i64())
        .min()
        .unwrap();
    let early: Vec<_> = sent
        .iter()
        .filter(|e| e["t_ns"].as_i64().is_some_and(|t| t < first + 800_000_000))
        .cloned()
        .collect();
    let missing: Vec<_> = logged(&early, "sent")
        .into_keys()
        .filter(|k| !stamped.contains(k))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "sent early, not stamped: {missing:?}");
}

#[test]
fn traced_processes_killed_mid_run_end_it_with_their_data() {
    let Some(_guard) = privileged("faults_target_killed") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("fault-target-killed");
    let mut run = ProtocolRun::spawn(&stage, &scratch, &options());
    let pids = run.pids();
    let dir = scratch.path("run");
    let rec = Recorder::start(&[pids.0, pids.1], &dir, &[]);
    run.start();
    std::thread::sleep(Duration::from_millis(1200));
    run.sender.kill().unwrap();
    run.receiver.kill().unwrap();
    let _ = run.sender.wait();
    let _ = run.receiver.wait();
    let out = rec.wait();
    let meta = run_meta(&dir);
    assert_eq!(meta.state, RunState::Complete);
    assert_eq!(meta.stop_reason, "targets exited");
    // The sender's log up to its death (the lines it managed to write; a
    // buffered log killed mid-write ends in a partial line): each stamped.
    let sent: Vec<serde_json::Value> = std::fs::read_to_string(&run.sender_log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let logged = logged(&sent, "sent");
    assert!(logged.len() > 300, "logged {}", logged.len());
    let stamped = send_stamps(&dir, pids.0);
    let missing: Vec<_> = logged
        .keys()
        .filter(|k| !stamped.contains(k))
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "logged, not stamped: {missing:?} ({})",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A small tmpfs (`size`: "2m"), unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(scratch: &Scratch, size: &str) -> SmallDisk {
        let disk = scratch.path("small-disk");
        std::fs::create_dir_all(&disk).unwrap();
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "xlap-test-full",
            ])
            .arg(&disk)
            .status()
            .expect("mount");
        assert!(mounted.success(), "cannot mount a tmpfs");
        SmallDisk(disk)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The example protocol (`count` datagrams, one per 100 µs) traced onto a
/// disk that fills up, `record_args` added: returns the protocol run (finished), the run directory and what
/// the recorder said, after checking it stopped with exit 1 saying what
/// to do.
fn record_until_full(
    stage: &Stage,
    scratch: &Scratch,
    disk: &SmallDisk,
    count: u32,
    record_args: &[&str],
) -> (
    Vec<serde_json::Value>,
    (u32, u32),
    std::path::PathBuf,
    String,
) {
    let run = ProtocolRun::spawn(
        stage,
        scratch,
        &ExampleOptions {
            count,
            period_us: 100,
            gated: true,
            ..Default::default()
        },
    );
    let pids = run.pids();
    let dir = disk.0.join("run");
    let rec = Recorder::start(&[pids.0, pids.1], &dir, record_args);
    run.start();
    let out = rec.child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(
        stderr.contains(&format!("xlap-trace recover {}`", dir.display())),
        "says what to do, for the recording: {stderr}"
    );
    let (sent, _) = run.wait();
    (sent, pids, dir, stderr)
}

/// A tmpfs of 2 MiB as the output disk: the live stream fills it.
#[test]
fn a_full_disk_stops_the_run_with_what_to_do_and_keeps_what_was_written() {
    let Some(_guard) = privileged("faults_disk_full") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("fault-disk-full");
    let disk = SmallDisk::mount(&scratch, "2m");
    let (sent, pids, dir, _) = record_until_full(&stage, &scratch, &disk, 20_000, &[]);
    // Moved to a disk with room, the run is recovered whole up to where
    // the disk filled.
    let moved = scratch.path("moved");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(&dir)
        .arg(&moved)
        .status()
        .unwrap();
    assert!(cp.success());
    let out = Command::new(bin("xlap-trace"))
        .arg("recover")
        .arg(&moved)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stamped = send_stamps(&moved, pids.0);
    assert!(stamped.len() > 100, "recovered {}", stamped.len());
    let logged = logged(&sent, "sent");
    let invented: Vec<_> = stamped
        .iter()
        .filter(|k| !logged.contains_key(k))
        .take(10)
        .collect();
    assert!(invented.is_empty(), "stamped, never sent: {invented:?}");
    // What was recovered is the beginning of the run, without gaps.
    let sent_in_order: Vec<(u64, u32)> = sent
        .iter()
        .filter(|e| e["event"] == "sent" && e["dropped"] != true)
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                xlap_tests::example::kind_code(e["kind"].as_str().unwrap()),
            )
        })
        .collect();
    let last = sent_in_order
        .iter()
        .rposition(|k| stamped.contains(k))
        .unwrap();
    let early_missing: Vec<_> = sent_in_order[..last.saturating_sub(100)]
        .iter()
        .filter(|k| !stamped.contains(k))
        .take(10)
        .collect();
    assert!(
        early_missing.is_empty(),
        "gaps before the disk filled: {early_missing:?}"
    );
}

/// Steps the realtime clock by `ns` (the test puts it back).
fn step_realtime(ns: i64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and timespec; root may set the clock.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let t = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128 + ns as i128;
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
    assert_eq!(rc, 0, "clock_settime: {}", std::io::Error::last_os_error());
}

/// The realtime clock stepped +2 s, then back 1.5 s later, during a run:
/// both steps recorded in run.json (sizes within 50 ms) and warned about;
/// the stamps, on the monotonic clock, are untouched (every datagram the
/// sender logged is stamped).
#[test]
fn a_realtime_clock_step_during_a_run_is_recorded_and_warned() {
    let Some(_guard) = privileged("faults_clock_step") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("fault-clock-step");
    let run = ProtocolRun::spawn(&stage, &scratch, &options());
    let pids = run.pids();
    let dir = scratch.path("run");
    let rec = Recorder::start(&[pids.0, pids.1], &dir, &["--no-correlate"]);
    run.start();
    std::thread::sleep(Duration::from_millis(600));
    step_realtime(2_000_000_000);
    std::thread::sleep(Duration::from_millis(1500));
    step_realtime(-2_000_000_000);
    let (sent, _) = run.wait();
    let out = rec.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("realtime clock stepped"), "{stderr}");
    let meta = run_meta(&dir);
    let steps: Vec<i64> = meta.clock_steps.iter().map(|s| s.step_ns).collect();
    assert_eq!(steps.len(), 2, "steps: {steps:?}");
    assert!((steps[0] - 2_000_000_000).abs() < 50_000_000, "{steps:?}");
    assert!((steps[1] + 2_000_000_000).abs() < 50_000_000, "{steps:?}");
    let stamped = send_stamps(&dir, pids.0);
    let missing: Vec<_> = logged(&sent, "sent")
        .into_keys()
        .filter(|k| !stamped.contains(k))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "logged, not stamped: {missing:?}");
}

/// The same under `--rotate`: the disk fills in a later segment; the
/// recorder names that segment's stream and the recording to recover,
/// and `recover` of the recording takes up the segment left running.
/// (Segments are finished into Parquet, a fifth of the stream, as the run
/// goes: 1 MiB holds about half of 40 000 datagrams' stamps.)
#[test]
fn a_full_disk_under_rotation_names_the_segment_and_the_recording() {
    let Some(_guard) = privileged("faults_disk_full_rotated") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("fault-disk-full-rotated");
    let disk = SmallDisk::mount(&scratch, "1m");
    let (_, _, dir, stderr) =
        record_until_full(&stage, &scratch, &disk, 40_000, &["--rotate", "64KiB"]);
    let segment = stderr
        .split(&format!("the recording stopped ({}/", dir.display()))
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("names no segment: {stderr}"));
    assert!(
        segment.starts_with("seg-") && segment != "seg-000001",
        "the disk filled in a later segment, and it is named: {stderr}"
    );
    let moved = scratch.path("moved");
    assert!(Command::new("cp")
        .arg("-r")
        .arg(&dir)
        .arg(&moved)
        .status()
        .unwrap()
        .success());
    let out = Command::new(bin("xlap-trace"))
        .arg("recover")
        .arg(&moved)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let listing = |d: &std::path::Path| {
        std::fs::read_dir(d)
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    assert!(
        moved.join(segment).join("run.json").is_file(),
        "{segment}: {:?} of {:?}; recorder: {stderr}; recover: {said}",
        listing(&moved.join(segment)),
        listing(&moved)
    );
    let meta = run_meta(&moved.join(segment));
    assert_eq!(meta.state, RunState::Recovered, "{said}");
}
