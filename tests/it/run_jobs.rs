//! Privileged: `xlap-trace run` on jobs shaped like CI jobs, hundreds of
//! short processes without markers around the traced protocol. The markers
//! of a program a job starts late are all there (against the program's
//! log); processes of known code are not held (against the job's own count
//! of what it started); `run` ends soon after its job however many
//! processes it started, and leaves no uprobe behind; a job that execs in
//! a tight loop does not stall the recorder.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use xlap_tests::c_programs::{udp_loop, udp_loop_log};
use xlap_tests::trace::{read_stamps, run_meta, SEQ_U64_LE};
use xlap_tests::{bin, privileged, Scratch};

/// `run` of a job script (not quiet: the closer's pid is said on stderr);
/// returns its output and when it exited.
fn run_job(run_dir: &Path, script: &Path, extra: &[&str]) -> (Output, Instant) {
    let out = Command::new(bin("xlap-trace"))
        .args(["run", "--no-correlate", "-o"])
        .arg(run_dir)
        .args(SEQ_U64_LE)
        .args(extra)
        .arg("--")
        .arg("bash")
        .arg(script)
        .output()
        .expect("xlap-trace run");
    (out, Instant::now())
}

fn write_script(path: &Path, body: &str) {
    std::fs::write(path, format!("set -e\n{body}")).unwrap();
}

/// Every datagram the program logged has its markers and socket points.
fn missing_points(run_dir: &Path, log: &Path, count: usize) -> Vec<String> {
    let logged = udp_loop_log(log);
    assert_eq!(logged.len(), count, "the program's log");
    let mut stamped: std::collections::BTreeMap<u64, std::collections::BTreeSet<String>> =
        Default::default();
    for row in read_stamps(&run_dir.join("stamps.parquet")) {
        if let Some(seq) = row.seq {
            stamped.entry(seq).or_default().insert(row.point);
        }
    }
    let mut missing = Vec::new();
    for (seq, _) in &logged {
        for point in [
            "app.send_start",
            "app.deliver",
            "sock.send_enter",
            "sock.recv_exit",
        ] {
            if !stamped.get(seq).is_some_and(|p| p.contains(point)) {
                missing.push(format!("seq {seq}: {point}"));
            }
        }
    }
    missing
}

#[test]
fn markers_of_a_program_started_after_200_processes_without_markers_are_all_there() {
    let Some(_guard) = privileged("run_jobs") else {
        return;
    };
    let scratch = Scratch::new("run-jobs-late");
    let exe = udp_loop(&scratch);
    let log = scratch.path("late.log");
    let script = scratch.path("job.sh");
    write_script(
        &script,
        &format!(
            "for i in $(seq 200); do /bin/true; done\n{} 47611 300 0 {}\n",
            exe.display(),
            log.display()
        ),
    );
    let dir = scratch.path("run");
    let (out, _) = run_job(&dir, &script, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let missing = missing_points(&dir, &log, 300);
    assert!(
        missing.is_empty(),
        "{} missing: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    // The job started 201 programs (200 /bin/true, then udp_loop): each exec
    // is either held or counted as known code, and /bin/true, read once,
    // is not held again.
    let holds = run_meta(&dir).holds.expect("holds");
    assert!(
        holds.at_exec + holds.skipped_at_exec >= 201,
        "the job exec'd 201 programs: {holds:?}"
    );
    assert!(
        holds.skipped_at_exec >= 195,
        "known code was held again: {holds:?}"
    );
    assert_eq!(holds.not_stopped, 0, "{holds:?}");
}

#[test]
fn run_of_a_500_process_job_ends_soon_after_it_and_leaves_no_uprobe() {
    let Some(_guard) = privileged("run_jobs") else {
        return;
    };
    let scratch = Scratch::new("run-jobs-500");
    let exe = udp_loop(&scratch);
    let times = scratch.path("times");
    let script = scratch.path("job.sh");
    // 490 processes without markers and 10 protocol runs with them, their
    // markers on uprobes (one uprobe per site and process, each closed by
    // the kernel in tens of milliseconds).
    let mut body = format!("date +%s%N > {}\n", times.display());
    body.push_str("for i in $(seq 490); do /bin/true; done\n");
    for i in 0..10 {
        body.push_str(&format!(
            "{} {} 30 0 {}\n",
            exe.display(),
            47620 + i,
            scratch.path(&format!("p{i}.log")).display()
        ));
    }
    body.push_str(&format!("date +%s%N >> {}\n", times.display()));
    write_script(&script, &body);
    let dir = scratch.path("run");
    let (out, exited) = run_job(&dir, &script, &["--marker-path", "uprobe"]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let job_end_ns: u128 = std::fs::read_to_string(&times)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .parse()
        .unwrap();
    let stamps: Vec<u128> = std::fs::read_to_string(&times)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let job_ns = stamps[1] - stamps[0];
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let after_job_ns = now_ns - exited.elapsed().as_nanos() - job_end_ns;
    // Relative, not a timing threshold: before, `run` took minutes after a
    // job of seconds (one uprobe close after another).
    assert!(
        after_job_ns < job_ns,
        "run exited {:.1} s after its job, which took {:.1} s",
        after_job_ns as f64 / 1e9,
        job_ns as f64 / 1e9
    );
    for i in 0..10 {
        let log = scratch.path(&format!("p{i}.log"));
        assert_eq!(udp_loop_log(&log).len(), 30, "protocol run {i}'s log");
    }
    let meta = run_meta(&dir);
    let holds = meta.holds.expect("holds");
    assert!(
        holds.at_exec + holds.skipped_at_exec >= 500,
        "the job exec'd 500 programs: {holds:?}"
    );
    // The uprobes left at the end went to a child that closes them after
    // `run` exited; once it is gone, no link of the capture's uprobe
    // programs is left in the kernel.
    if let Some(pid) = stderr.lines().find_map(|l| {
        l.split(" by pid ")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse::<u32>()
            .ok()
    }) {
        let deadline = Instant::now() + Duration::from_secs(180);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the closer {pid} still runs"
        );
    }
    let links = Command::new("bpftool")
        .args(["-j", "link", "show"])
        .output()
        .expect("bpftool (./run.sh setup installs it)");
    let links: serde_json::Value = serde_json::from_slice(&links.stdout).expect("bpftool JSON");
    let progs = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .expect("bpftool");
    let progs: serde_json::Value = serde_json::from_slice(&progs.stdout).expect("bpftool JSON");
    let ours: Vec<u64> = progs
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == "on_usdt" || p["name"] == "on_loader_hook")
        .filter_map(|p| p["id"].as_u64())
        .collect();
    let left: Vec<&serde_json::Value> = links
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["prog_id"].as_u64().is_some_and(|id| ours.contains(&id)))
        .collect();
    assert!(left.is_empty(), "uprobe links left: {left:?}");
}

#[test]
fn a_job_that_execs_in_a_tight_loop_does_not_stall_the_recorder() {
    let Some(_guard) = privileged("run_jobs") else {
        return;
    };
    let scratch = Scratch::new("run-jobs-loop");
    let count = scratch.path("count");
    let script = scratch.path("job.sh");
    // Three seconds of back-to-back execs, counted by the job itself.
    write_script(
        &script,
        &format!(
            "n=0; end=$((SECONDS + 3))\nwhile [ $SECONDS -lt $end ]; do /bin/true; n=$((n + 1)); done\necho $n > {}\n",
            count.display()
        ),
    );
    let dir = scratch.path("run");
    let (out, _) = run_job(&dir, &script, &["--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let execs: u64 = std::fs::read_to_string(&count)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let meta = run_meta(&dir);
    // Every process the job forked was followed; run.json lists at most
    // a thousand that held no UDP socket and counts the rest (the
    // recorder's memory follows the processes alive, not all it saw).
    assert!(
        meta.followed.len() as u64 + meta.followed_unlisted >= execs,
        "{execs} execs, {} followed listed, {} unlisted",
        meta.followed.len(),
        meta.followed_unlisted
    );
    assert!(meta.followed.len() <= 1000, "{}", meta.followed.len());
    let holds = meta.holds.expect("holds");
    assert!(execs > 100, "the job exec'd only {execs} times in 3 s");
    assert!(
        holds.at_exec + holds.skipped_at_exec >= execs,
        "{execs} execs: {holds:?}"
    );
    // Held once per file, not once per exec: the recorder is not what the
    // job waits for.
    assert!(
        holds.at_exec + holds.at_loader < 20,
        "{execs} execs: {holds:?}"
    );
}
