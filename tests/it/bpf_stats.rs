//! Privileged: the kernel's BPF run-time statistics, which cost every BPF
//! program of the machine two clock reads per run, are on only as long as
//! `--bpf-stats` says, checked against the kernel's own account (whether
//! the recorder holds a `BPF_ENABLE_STATS` descriptor, `anon_inode:bpf-stats`
//! in its fd table, polled while the example protocol runs traced; the
//! sysctl only shows its own setting): sampled (the default) turns them on
//! and off again, full keeps them on, off never turns them on; run.json
//! says how they were taken and reports the cost per stamp only when they
//! were on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use xlap_records::run_meta::{RunMeta, StatsMode};
use xlap_stage::Stage;
use xlap_tests::example::{ExampleOptions, ProtocolRun};
use xlap_tests::trace::{run_holder, Recorder};
use xlap_tests::{privileged, Scratch};

/// Whether process `pid` holds the kernel's statistics on.
fn holds_stats(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| target.to_string_lossy() == "anon_inode:bpf-stats")
    })
}

/// Traces the example for about two seconds with `--bpf-stats mode`;
/// returns run.json and the states of the kernel's switch seen while the
/// recorder was live and the protocol ran.
fn run(stage: &Stage, mode: &str) -> (RunMeta, (bool, bool)) {
    let scratch = Scratch::new(&format!("bpf-stats-{mode}"));
    let proto = ProtocolRun::spawn(
        stage,
        &scratch,
        &ExampleOptions {
            count: 2_000,
            period_us: 1_000,
            gated: true,
            ..Default::default()
        },
    );
    let pids = proto.pids();
    // A traced process that outlives the protocol keeps the run going until
    // the poller has stopped, so that the end of the run (the switch turned
    // off when the targets have exited) cannot fall inside the polling.
    let holder = run_holder();
    let rec = Recorder::start(
        &[pids.0, pids.1, holder.0.id()],
        &scratch.path("run"),
        &["--bpf-stats", mode],
    );
    let recorder = rec.child.id();
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut on, mut off) = (false, false);
            while !done.load(Ordering::Relaxed) {
                if holds_stats(recorder) {
                    on = true;
                } else {
                    off = true;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (on, off)
        })
    };
    proto.start();
    proto.wait();
    done.store(true, Ordering::Relaxed);
    let seen = poller.join().unwrap();
    rec.interrupt();
    (rec.meta_after_wait(), seen)
}

#[test]
fn statistics_are_on_only_as_long_as_the_mode_says() {
    let Some(_guard) = privileged("bpf_stats") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");

    let (meta, (on, off)) = run(&stage, "sampled");
    assert!(on && off, "sampled: the switch was on {on}, off {off}");
    let s = meta.bpf_stats.as_ref().expect("sampled: bpf_stats");
    assert_eq!(s.mode, StatsMode::Sampled);
    let windows = s.windows;
    assert!(windows >= 2, "sampled: {s:?}");
    let stamps = meta.stamps;
    let timed = s.stamps;
    assert!(
        timed > 0 && timed < stamps,
        "sampled: {timed} of {stamps} stamps timed"
    );
    assert!(meta.bpf_ns_per_stamp.unwrap() > 0.0);

    let (meta, (_, off)) = run(&stage, "full");
    assert!(!off, "full: the switch went off during the run");
    let s = meta.bpf_stats.as_ref().expect("full: bpf_stats");
    assert_eq!(s.windows, 1);
    assert_eq!(s.stamps, meta.stamps);

    let (meta, (on, _)) = run(&stage, "off");
    assert!(!on, "off: the switch went on");
    assert!(
        meta.bpf_ns_per_stamp.is_none(),
        "off: a cost without statistics"
    );
    assert_eq!(meta.bpf_stats.as_ref().expect("off: bpf_stats").windows, 0);
}
