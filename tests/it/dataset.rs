//! The partitioned dataset (`xlap-trace dataset add`): a run in it gives
//! the results of the run itself, the dataset as a whole is every run's
//! packets with its run id, and Spark (a real engine, from PyPI) reads the
//! same files and computes the same quantiles.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use xlap_stage::Stage;
use xlap_tests::example::{events, ExampleOptions};
use xlap_tests::trace::trace_example;
use xlap_tests::{json_agree, may_skip, privileged, xlap_trace, Scratch};

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Every query's rows over `run`, as JSON.
fn all_queries(run: &Path) -> Value {
    let text = ok(
        xlap_trace(&["analyze", path(run), "-q", "all", "-f", "json", "--quiet"]),
        "analyze -q all",
    );
    serde_json::from_str(&text).expect("JSON")
}

/// One column of `sql` output over `run` as a set of integers.
fn ints(run: &Path, statement: &str) -> BTreeSet<i64> {
    let text = ok(
        xlap_trace(&["sql", path(run), statement, "-f", "csv"]),
        statement,
    );
    text.lines()
        .skip(1)
        .map(|l| l.trim().parse().expect("an integer"))
        .collect()
}

/// A synthetic run of `packets` packets at `run`, added to dataset `ds`.
fn synth_into_dataset(run: &Path, ds: &Path, packets: &str, seed: &str) {
    ok(
        xlap_trace(&[
            "synth",
            "-o",
            path(run),
            "--packets",
            packets,
            "--seed",
            seed,
        ]),
        "synth",
    );
    ok(
        xlap_trace(&["dataset", "add", path(run), "-o", path(ds)]),
        "dataset add",
    );
}

fn added(out: Output) -> Vec<Value> {
    serde_json::from_str(&ok(out, "dataset add")).expect("JSON")
}

/// A traced run of the example protocol, added as it is and as its
/// recording alone (correlated by `dataset add`): each partition gives the
/// analyses of the run itself, and the dataset's packets are the
/// protocol's own account of what it delivered.
#[test]
fn a_traced_run_in_a_dataset_gives_its_own_results() {
    let Some(_guard) = privileged("dataset") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "dataset",
        &ExampleOptions {
            count: 1500,
            period_us: 100,
            drop: 0.01,
            markers: true,
            ..Default::default()
        },
        &[],
    );
    let run = t.run_dir();
    assert!(run.join("packets.parquet").is_file(), "{}", t.stderr);
    let id = t.meta.run_id.clone();
    let scratch = Scratch::new("dataset-out");

    // The run as recorded (its packets correlated at the end).
    let ds = scratch.path("ds");
    let a = added(xlap_trace(&[
        "dataset",
        "add",
        path(&run),
        "-o",
        path(&ds),
        "--json",
    ]));
    assert_eq!(a[0]["run_id"], id.as_str());
    let part = ds.join(format!("run_id={id}"));
    for file in [
        "packets.parquet",
        "runs.parquet",
        "summary.json",
        "packets.stage_counts.parquet",
    ] {
        assert!(part.join(file).is_file(), "{file} in {}", part.display());
    }
    assert!(part
        .join(format!("recorder={id}"))
        .join("stamps.parquet")
        .is_file());

    // What the protocol says it delivered, from the dataset as a whole.
    let logged: BTreeSet<i64> = events(&t.received, "delivered")
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert!(logged.len() > 1000, "{} delivered", logged.len());
    let delivered = ints(
        &ds,
        &format!("SELECT seq FROM packets WHERE run_id = '{id}' AND kind = 1 AND app_deliver_ns IS NOT NULL"),
    );
    assert_eq!(delivered, logged);

    // The partition is the run: every analysis the same.
    let own = all_queries(&run);
    assert!(json_agree(&all_queries(&part), &own), "the partition");
    // Its stamps too, with the run's id from the partition.
    let stamps = |dir: &Path| ints(dir, "SELECT count(*) FROM stamps");
    assert_eq!(stamps(&ds), stamps(&run));
    assert_eq!(
        ints(
            &ds,
            &format!("SELECT count(*) FROM stamps WHERE run_id <> '{id}'")
        ),
        BTreeSet::from([0])
    );

    // The recording alone: `dataset add` correlates it.
    let hosts = scratch.path("hosts");
    let rec = hosts.join("a");
    std::fs::create_dir_all(&rec).unwrap();
    for f in ["run.json", "stamps.parquet"] {
        std::fs::copy(run.join(f), rec.join(f)).unwrap();
    }
    let ds2 = scratch.path("ds2");
    ok(
        xlap_trace(&["dataset", "add", path(&hosts), "-o", path(&ds2)]),
        "dataset add (correlating)",
    );
    let part2 = ds2.join(format!("run_id={id}"));
    assert!(
        json_agree(&all_queries(&part2), &own),
        "correlated by dataset add"
    );

    // A run already there is refused unless replaced.
    let again = xlap_trace(&["dataset", "add", path(&run), "-o", path(&ds2)]);
    assert_eq!(again.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&again.stderr).contains("--replace"));
    let r = added(xlap_trace(&[
        "dataset",
        "add",
        path(&run),
        "-o",
        path(&ds2),
        "--replace",
        "--json",
    ]));
    assert_eq!(r[0]["replaced"], true);
    assert!(json_agree(&all_queries(&part2), &own), "replaced");

    // `history` reads the dataset's runs.
    let h: Value = serde_json::from_str(&ok(
        xlap_trace(&["history", path(&ds), "--json"]),
        "history",
    ))
    .unwrap();
    assert!(h.as_array().is_some_and(|s| !s.is_empty()));
}

/// The Python with pyspark (and a JVM) that `./run.sh test` installs.
fn spark_python() -> Option<PathBuf> {
    let python = PathBuf::from(std::env::var_os("XLAP_PYTHON").unwrap_or("python3".into()));
    let has = |cmd: &mut Command| cmd.output().is_ok_and(|o| o.status.success());
    (has(Command::new(&python).args(["-c", "import pyspark"]))
        && has(Command::new("java").arg("-version")))
    .then_some(python)
}

/// Spark reads the dataset's partitions (run_id from the paths) and its
/// exact quantiles of every stage are ours, for one run and for the
/// dataset as a whole; a run id that could name a path outside the
/// dataset is refused.
#[test]
fn spark_reads_the_dataset_and_computes_our_quantiles() {
    let _guard = xlap_tests::unprivileged();
    let Some(python) = spark_python() else {
        may_skip(
            "dataset::spark",
            "no pyspark or no java (./run.sh test installs them)",
        );
        return;
    };
    let scratch = Scratch::new("dataset-spark");
    let ds = scratch.path("ds");
    for seed in ["3", "4"] {
        synth_into_dataset(&scratch.path(&format!("synth-{seed}")), &ds, "4000", seed);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/spark_quantiles.py");
    for (target, run_id) in [
        (ds.join("run_id=synth-3"), Some("synth-3")),
        (ds.clone(), None),
    ] {
        let ours = xlap_tests::trace::analyze_rows(&target, "jitter", &[]);
        for kind in [0u64, 1] {
            let mut args = vec![
                path(&script).to_string(),
                path(&ds).to_string(),
                kind.to_string(),
            ];
            args.extend(run_id.map(str::to_string));
            let out = Command::new(&python).args(&args).output().expect("python");
            let spark: Value = serde_json::from_str(&ok(out, "spark_quantiles.py")).expect("JSON");
            let rows: Vec<&Value> = ours.iter().filter(|r| r["kind"] == kind).collect();
            assert!(!rows.is_empty(), "kind {kind}");
            for r in rows {
                let stage = r["stage"].as_str().unwrap();
                let s = &spark[stage];
                let what = format!("{stage}, kind {kind}, run {run_id:?}: spark {s}, ours {r}");
                assert_eq!(s[2], r["packets"], "{what}");
                for (i, ours) in [r["median_ns"].as_f64(), r["p99_ns"].as_f64()]
                    .into_iter()
                    .enumerate()
                {
                    let theirs = s[i].as_f64().expect("a number");
                    let ours = ours.expect("a number");
                    assert!(
                        (theirs - ours).abs() <= 1e-6 * ours.abs().max(1.0),
                        "{what}"
                    );
                }
            }
        }
    }

    // A run id is a directory name: one that leaves the dataset is refused
    // and nothing is written outside it.
    let bad = scratch.path("bad");
    ok(
        xlap_trace(&["synth", "-o", path(&bad), "--packets", "500", "--seed", "5"]),
        "synth",
    );
    let meta = bad.join("run.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("\"synth-5\"", "\"../../escaped\"")).unwrap();
    let out = xlap_trace(&["dataset", "add", path(&bad), "-o", path(&ds)]);
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(!scratch.path("escaped").exists() && !ds.join("../escaped").exists());
    let left: Vec<_> = std::fs::read_dir(&ds)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left.len(), 2, "only the two runs: {left:?}");
}

/// Loss islands (runs of consecutive lost seqs) per kind, as a reader of
/// the packets counts them: (islands, longest).
fn islands(lost_seqs: &BTreeSet<i64>) -> (u64, u64) {
    let (mut count, mut longest, mut len, mut prev) = (0, 0, 0, None);
    for &s in lost_seqs {
        if prev == Some(s - 1) {
            len += 1;
        } else {
            count += 1;
            len = 1;
        }
        longest = longest.max(len);
        prev = Some(s);
    }
    (count, longest)
}

/// Runs of one setup repeat each other's flows and seqs (40 000 packets:
/// enough that some runs lose neighbouring seqs, which one island across
/// runs would join). In a dataset a
/// packet stays its run's: loss islands do not run across runs, a traced
/// packet's waterfall holds that packet alone, and the value counts summed
/// from the runs' stored tables (and their send schedules) give what the
/// packets themselves give, also for runs added with stale or missing
/// stored tables (computed again in the dataset, the runs left as they
/// were).
#[test]
fn runs_that_share_seqs_stay_apart_in_a_dataset() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("dataset-shared-seqs");
    let ds = scratch.path("ds");
    let run = scratch.path("synth-11");
    synth_into_dataset(&run, &ds, "40000", "11");
    let mut runs = vec![run];
    // The other two runs' stored tables as runs of an older release may
    // have them: one made from other packets, one missing. `dataset add`
    // computes them again in the dataset and leaves the runs as they were.
    let other = scratch.path("other");
    for (dir, seed) in [
        (scratch.path("synth-12"), "12"),
        (scratch.path("synth-13"), "13"),
        (other.clone(), "14"),
    ] {
        ok(
            xlap_trace(&[
                "synth",
                "-o",
                path(&dir),
                "--packets",
                "40000",
                "--seed",
                seed,
            ]),
            "synth",
        );
        if dir != other {
            runs.push(dir);
        }
    }
    let counts = |dir: &Path| dir.join("packets.stage_counts.parquet");
    let schedule = |dir: &Path| dir.join("packets.send_schedule.parquet");
    std::fs::copy(counts(&other), counts(&runs[1])).unwrap();
    std::fs::remove_file(schedule(&runs[2])).unwrap();
    for run in &runs[1..] {
        ok(
            xlap_trace(&["dataset", "add", path(run), "-o", path(&ds)]),
            "dataset add",
        );
    }
    assert_eq!(
        std::fs::read(counts(&runs[1])).unwrap(),
        std::fs::read(counts(&other)).unwrap(),
        "dataset add wrote into the run it added"
    );
    assert!(!schedule(&runs[2]).exists());

    // Loss islands, counted here from each run's own lost seqs.
    let loss = xlap_tests::trace::analyze_rows(&ds, "loss", &[]);
    for kind in [0, 1] {
        let (mut gaps, mut longest) = (0, 0);
        for run in &runs {
            let lost = ints(
                run,
                &format!("SELECT seq FROM packets WHERE lost AND kind = {kind}"),
            );
            let (g, l) = islands(&lost);
            gaps += g;
            longest = longest.max(l);
        }
        assert!(gaps > 0, "the generator plants loss");
        let measure = |m: &str| {
            loss.iter()
                .find(|r| {
                    r["scope"] == "protocol"
                        && r["what"].as_str().and_then(|w| w.parse().ok()) == Some(kind)
                        && r["measure"] == m
                })
                .unwrap_or_else(|| panic!("{m} of kind {kind}: {loss:?}"))["value"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(measure("gaps"), gaps, "kind {kind}");
        assert_eq!(measure("longest_gap"), longest, "kind {kind}");
    }

    // The tracer's own losses, each run's under its run id: as the run
    // alone reports them.
    let tracer = |rows: &[Value], prefix: &str| -> BTreeSet<(String, String, u64)> {
        rows.iter()
            .filter(|r| r["scope"] == "tracer")
            .map(|r| {
                (
                    format!("{prefix}{}", r["what"].as_str().unwrap()),
                    r["measure"].as_str().unwrap().to_string(),
                    r["value"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let mut each_run = BTreeSet::new();
    for (run, seed) in runs.iter().zip(["11", "12", "13"]) {
        let alone = xlap_tests::trace::analyze_rows(run, "loss", &[]);
        each_run.extend(tracer(&alone, &format!("synth-{seed} ")));
    }
    assert_eq!(each_run.len(), 3, "the generator plants one loss per run");
    assert_eq!(tracer(&loss, ""), each_run);

    // The slowest packets' waterfalls: each holds one packet's points once,
    // and its end to end is that packet's in one run.
    let trace = xlap_tests::trace::analyze_rows(&ds, "trace", &["--param", "top=5"]);
    let mut seen = BTreeSet::new();
    for r in &trace {
        let key = (
            r["rank"].as_u64().unwrap(),
            r["point"].as_str().unwrap().to_string(),
        );
        assert!(seen.insert(key.clone()), "{key:?} twice in the trace");
    }
    for rank in 1..=5u64 {
        let row = trace.iter().find(|r| r["rank"] == rank).expect("5 packets");
        let e2e = row["e2e_ns"].as_i64().unwrap();
        let seq = row["seq"].as_i64().unwrap();
        let owners = runs
            .iter()
            .filter(|run| {
                ints(
                    run,
                    &format!("SELECT e2e_ns FROM packets WHERE seq = {seq}"),
                )
                .contains(&e2e)
            })
            .count();
        assert_eq!(owners, 1, "rank {rank}: seq {seq}, e2e {e2e}");
    }

    // The runs' stored value counts, summed, are the dataset's; their send
    // schedules, each under its run id, are the dataset's schedule.
    let analyzed = xlap_trace(&["analyze", path(&ds), "-q", "jitter", "-f", "json"]);
    let said = String::from_utf8_lossy(&analyzed.stderr).to_string();
    assert!(said.contains("read stage_value_counts"), "{said}");
    assert!(said.contains("read send_schedule"), "{said}");
    let bare = scratch.path("bare");
    std::fs::create_dir(&bare).unwrap();
    for entry in std::fs::read_dir(&ds).unwrap() {
        let part = entry.unwrap().path();
        let to = bare.join(part.file_name().unwrap());
        ok(
            Command::new("cp")
                .arg("-r")
                .arg(&part)
                .arg(&to)
                .output()
                .unwrap(),
            "cp",
        );
        for stored in std::fs::read_dir(&to).unwrap() {
            let p = stored.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap();
            if name.starts_with("packets.")
                && name != "packets.parquet"
                && name.ends_with(".parquet")
            {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    let (merged, computed) = (all_queries(&ds), all_queries(&bare));
    assert!(json_agree(&merged, &computed), "{merged}\n{computed}");
}
