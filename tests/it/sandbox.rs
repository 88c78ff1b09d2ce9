//! Privileged: the confinement of what parses untrusted data (issue 53).
//! The recorder's end of run (`finish`, a child of the root recorder)
//! reads what traced programs sent; it runs without capabilities, with
//! no_new_privs, and with a Landlock ruleset over its run directory.
//! Checked against the kernel's own accounts: `/proc/self/status` of the
//! confined process, the errors of its opens, strace's record of its
//! system calls, and the files outside the run left as they were.

use serde_json::Value;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use xlap_stage::Stage;
use xlap_tests::example::ExampleOptions;
use xlap_tests::trace::trace_example;
use xlap_tests::{bin, privileged, Scratch};

/// A run directory beside files it must not reach: a root-only secret
/// and a victim file, each named by a link inside the run.
struct Crafted {
    run: PathBuf,
    secret: PathBuf,
    victim: PathBuf,
}

const SECRET: &str = "root only: not for the analysis";
const VICTIM: &str = "left as it was";

fn crafted(scratch: &Scratch) -> Crafted {
    let run = scratch.path("run");
    let outside = scratch.path("outside");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let secret = outside.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let victim = outside.join("victim");
    std::fs::write(&victim, VICTIM).unwrap();
    std::fs::write(run.join("own"), "the run's own file").unwrap();
    symlink(&secret, run.join("to-secret")).unwrap();
    symlink(&victim, run.join("to-victim")).unwrap();
    Crafted {
        run,
        secret,
        victim,
    }
}

/// The probe's report: what the process is, and each open's outcome.
fn probe(args: &[String]) -> Value {
    let out = Command::new(bin("xlap-sandbox-probe"))
        .args(args)
        .output()
        .expect("xlap-sandbox-probe");
    assert!(
        out.status.success(),
        "xlap-sandbox-probe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the probe's JSON")
}

fn opened(report: &Value, open: &str) -> bool {
    let row = report["opens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["open"] == open)
        .unwrap_or_else(|| panic!("no {open} in {report}"));
    if row["ok"] == false {
        let error = row["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("Permission denied"),
            "{open} failed for another reason than the confinement: {error}"
        );
    }
    row["ok"] == true
}

#[test]
fn the_confinement_keeps_the_process_to_its_run_and_drops_every_capability() {
    let Some(_guard) = privileged("sandbox_probe") else {
        return;
    };
    let scratch = Scratch::new("sandbox-probe");
    let c = crafted(&scratch);
    let p = |path: &Path| path.display().to_string();
    let run = |name: &str| p(&c.run.join(name));
    let tries = [
        format!("r:{}", run("own")),
        format!("w:{}", run("made-here")),
        "r:/etc/passwd".to_string(),
        "w:/etc/passwd".to_string(),
        "r:/etc/shadow".to_string(),
        format!("r:{}", p(&c.secret)),
        format!("r:{}", run("to-secret")),
        format!("w:{}", run("to-victim")),
    ];
    let allowed =
        |report: &Value| -> Vec<bool> { tries.iter().map(|t| opened(report, t)).collect() };

    // The control: root, unconfined, opens every one of them.
    let mut args: Vec<String> = vec!["--none".into()];
    args.extend(tries.iter().cloned());
    let free = probe(&args);
    assert_eq!(
        allowed(&free),
        vec![true; tries.len()],
        "unconfined root: {free}"
    );
    assert_ne!(free["cap_eff"], "0000000000000000", "{free}");

    // Confined to the run: only the run's own files, and the system's
    // public ones to read. Links in the run are judged by their target.
    let mut args: Vec<String> = vec!["--write".into(), p(&c.run)];
    args.extend(tries.iter().cloned());
    let confined = probe(&args);
    assert_eq!(
        allowed(&confined),
        vec![true, true, true, false, false, false, false, false],
        "{tries:?}: {confined}"
    );
    for field in ["cap_eff", "cap_prm", "cap_bnd"] {
        assert_eq!(confined[field], "0000000000000000", "{field}: {confined}");
    }
    assert_eq!(confined["no_new_privs"], "1", "{confined}");
    assert!(
        confined["confined"]["landlock"]
            .as_u64()
            .is_some_and(|abi| abi >= 1),
        "Landlock is enabled on this kernel (CONFIG_LSM): {confined}"
    );
    assert_eq!(std::fs::read_to_string(&c.victim).unwrap(), VICTIM);
}

/// `finish`, the step the recorder runs at the end of every run (and per
/// segment), on a run whose outputs are links to files outside it.
#[test]
fn finish_writes_nothing_outside_a_crafted_run_and_runs_confined() {
    let Some(_guard) = privileged("sandbox_finish") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "sandbox-finish",
        &ExampleOptions {
            count: 300,
            period_us: 1000,
            ..Default::default()
        },
        &["--no-correlate"],
    );
    let run = t.run_dir();
    let outside = t.scratch.path("outside");
    std::fs::create_dir_all(&outside).unwrap();
    // Files finish writes, and the temporary files it renames, left as
    // links to a file of root's outside the run (summary.json refuses a
    // link: foreign_runs::).
    let victims: Vec<(PathBuf, PathBuf)> = [
        "packets.json",
        "packets.parquet.tmp",
        "packets.stage_counts.parquet.tmp",
        "packets.stage_counts.parquet.rows",
    ]
    .iter()
    .map(|name| {
        let victim = outside.join(name);
        std::fs::write(&victim, VICTIM).unwrap();
        let link = run.join(name);
        let _ = std::fs::remove_file(&link);
        symlink(&victim, &link).unwrap();
        (link, victim)
    })
    .collect();
    let trace = t.scratch.path("strace.log");
    let out = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=capset,prctl,landlock_restrict_self",
            "-o",
        ])
        .arg(&trace)
        .arg(bin("xlap-trace"))
        .arg("finish")
        .arg(&run)
        .arg("--print")
        .output()
        .expect("strace (./run.sh setup installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "finish: {stderr}");
    for (link, victim) in &victims {
        assert_eq!(
            std::fs::read_to_string(victim).unwrap(),
            VICTIM,
            "{} was written through {}",
            victim.display(),
            link.display()
        );
    }
    // The run still got its packets table and summary, as regular files.
    assert!(stdout.contains("== summary"), "{stdout}\n{stderr}");
    for name in [
        "packets.parquet",
        "packets.json",
        "packets.stage_counts.parquet",
        "summary.json",
    ] {
        let meta = std::fs::symlink_metadata(run.join(name)).unwrap();
        assert!(meta.is_file(), "{name}: {meta:?}");
    }
    // strace: the capabilities gone, no_new_privs, the ruleset enforced,
    // each as the kernel answered it.
    let log = std::fs::read_to_string(&trace).unwrap();
    for call in [
        "capset(",
        "prctl(PR_SET_NO_NEW_PRIVS, 1",
        "landlock_restrict_self(",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains(call) && l.trim_end().ends_with("= 0")),
            "no successful {call} in strace's log:\n{log}"
        );
    }
}

/// One command under `strace -ff` (a log per process and thread): its
/// output, and the logs of the privileged parent, of the confined child
/// and of the child's threads.
struct Straced {
    out: std::process::Output,
    parent: String,
    child: String,
    threads: Vec<String>,
}

fn straced(scratch: &Scratch, name: &str, args: &[&Path]) -> Straced {
    let dir = scratch.path(&format!("strace-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("strace")
        .args([
            "-ff",
            "-qq",
            "-e",
            "trace=execve,openat,capset,prctl,landlock_restrict_self",
            "-o",
        ])
        .arg(dir.join("log"))
        .arg(bin("xlap-trace"))
        .args(args)
        .output()
        .expect("strace (./run.sh setup installs it)");
    let logs: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    let execs = |log: &String, exe: &str| {
        log.lines()
            .any(|l| l.starts_with(&format!("execve(\"{exe}\"")))
    };
    let xlap = bin("xlap-trace").display().to_string();
    let parent = logs.iter().find(|l| execs(l, &xlap)).cloned();
    let child = logs.iter().find(|l| execs(l, "/proc/self/exe")).cloned();
    let (Some(parent), Some(child)) = (parent, child) else {
        panic!(
            "xlap-trace {args:?} as root started no confined child of itself: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            logs.join("\n---\n")
        );
    };
    let threads = logs
        .into_iter()
        .filter(|l| *l != parent && *l != child)
        .collect();
    Straced {
        out,
        parent,
        child,
        threads,
    }
}

/// Lines of `log` where an open of a path beneath `under` succeeded (not
/// counting `O_PATH`, which names a file for a Landlock rule and reads
/// nothing).
fn opens_beneath<'a>(log: &'a str, under: &Path) -> Vec<&'a str> {
    let prefix = format!("\"{}", under.display());
    log.lines()
        .filter(|l| l.starts_with("openat(") && l.contains(&prefix) && !l.contains("O_PATH"))
        .filter(|l| {
            l.rsplit("= ")
                .next()
                .and_then(|r| r.split_whitespace().next())
                .and_then(|fd| fd.parse::<i64>().ok())
                .is_some_and(|fd| fd >= 0)
        })
        .collect()
}

/// The confined child's log: capabilities gone, no_new_privs and the
/// ruleset enforced (each as the kernel answered), all before it opened
/// anything beneath `run`.
fn assert_confined_before_reading(s: &Straced, run: &Path) {
    let line_of = |call: &str| {
        s.child
            .lines()
            .position(|l| l.starts_with(call) && l.trim_end().ends_with("= 0"))
            .unwrap_or_else(|| panic!("no successful {call} in the child:\n{}", s.child))
    };
    let confined_at = [
        line_of("capset("),
        line_of("prctl(PR_SET_NO_NEW_PRIVS, 1"),
        line_of("landlock_restrict_self("),
    ]
    .into_iter()
    .max()
    .unwrap();
    let first_read = opens_beneath(&s.child, run)
        .first()
        .and_then(|first| s.child.lines().position(|l| l == *first));
    if let Some(first_read) = first_read {
        assert!(
            first_read > confined_at,
            "the child read the run before its confinement:\n{}",
            s.child
        );
    }
    assert_eq!(
        opens_beneath(&s.parent, run),
        Vec::<&str>::new(),
        "the privileged parent opened files of the run"
    );
}

/// `report`, `compare` and `correlate` started as root on runs: the
/// privileged process opens nothing of the run; a child of it without
/// capabilities, with no_new_privs and Landlock does the reading; a run
/// whose packets table is a link to a root-only file outside it is
/// refused (exit 6) and that file is opened by no process; each output
/// lands where the user asked, and nothing is left of a failed one.
#[test]
fn analysis_commands_started_as_root_parse_runs_only_in_a_confined_child() {
    let Some(_guard) = privileged("sandbox_analysis") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "sandbox-analysis",
        &ExampleOptions {
            count: 300,
            period_us: 1000,
            ..Default::default()
        },
        &["--quiet"],
    );
    let run = t.run_dir();
    let out = t.scratch.path("out");
    std::fs::create_dir_all(&out).unwrap();

    // The real run: each command works confined, its output in place.
    let html = out.join("report.html");
    let s = straced(
        &t.scratch,
        "report",
        &[Path::new("report"), &run, Path::new("-o"), &html],
    );
    assert!(
        s.out.status.success(),
        "{}",
        String::from_utf8_lossy(&s.out.stderr)
    );
    assert_confined_before_reading(&s, &run);
    assert!(std::fs::read_to_string(&html).unwrap().contains("<html"));
    let junit = out.join("junit.xml");
    let s = straced(
        &t.scratch,
        "compare",
        &[
            Path::new("compare"),
            &run,
            &run,
            Path::new("--junit"),
            &junit,
        ],
    );
    assert_eq!(
        s.out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&s.out.stderr)
    );
    assert_confined_before_reading(&s, &run);
    assert!(std::fs::read_to_string(&junit)
        .unwrap()
        .contains("<testsuite"));
    let packets = out.join("pk.parquet");
    let s = straced(
        &t.scratch,
        "correlate",
        &[Path::new("correlate"), &run, Path::new("-o"), &packets],
    );
    assert!(
        s.out.status.success(),
        "{}",
        String::from_utf8_lossy(&s.out.stderr)
    );
    assert_confined_before_reading(&s, &run);
    let stdout = String::from_utf8_lossy(&s.out.stdout);
    assert!(
        stdout.contains(&packets.display().to_string()),
        "the path given is named: {stdout}"
    );
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "junit.xml",
            "pk.json",
            "pk.parquet",
            "pk.send_schedule.parquet",
            "pk.stage_counts.parquet",
            "pk.stage_moments.parquet",
            "report.html"
        ],
        "outputs in place, no staging directory left"
    );
    assert_eq!(
        Command::new(bin("xlap-trace"))
            .args(["sql"])
            .arg(&packets)
            .arg("SELECT count(*) FROM packets")
            .output()
            .unwrap()
            .status
            .code(),
        Some(0)
    );

    // The crafted copy: its packets table a link to a root-only copy of
    // the real one, outside the run (root reads it unconfined: checked).
    let crafted = t.scratch.path("crafted");
    std::fs::create_dir_all(&crafted).unwrap();
    let outside = t.scratch.path("outside");
    std::fs::create_dir_all(&outside).unwrap();
    for entry in std::fs::read_dir(&run).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), crafted.join(entry.file_name())).unwrap();
        }
    }
    let secret = outside.join("secret.parquet");
    std::fs::rename(crafted.join("packets.parquet"), &secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(std::fs::read(&secret).is_ok());
    symlink(&secret, crafted.join("packets.parquet")).unwrap();
    for name in ["stage_counts", "stage_moments", "send_schedule"] {
        let _ = std::fs::remove_file(crafted.join(format!("packets.{name}.parquet")));
    }
    let _ = std::fs::remove_file(crafted.join("summary.json"));
    let refused = out.join("refused.html");
    for (name, args) in [
        (
            "crafted-report",
            vec![Path::new("report"), &crafted, Path::new("-o"), &refused],
        ),
        (
            "crafted-compare",
            vec![Path::new("compare"), &run, &crafted],
        ),
    ] {
        let s = straced(&t.scratch, name, &args);
        let stderr = String::from_utf8_lossy(&s.out.stderr);
        assert_eq!(s.out.status.code(), Some(6), "{name}: {stderr}");
        assert!(stderr.contains("packets.parquet"), "{name}: {stderr}");
        assert_confined_before_reading(&s, &crafted);
        for log in [&s.parent, &s.child].into_iter().chain(&s.threads) {
            assert_eq!(
                opens_beneath(log, &outside),
                Vec::<&str>::new(),
                "{name}: the root-only file was opened"
            );
        }
    }
    assert!(!refused.exists(), "a failed report leaves no empty file");
}
