//! `xlap-trace probe` and `xlap-trace estimate`: per-host software latency
//! from RTTs, without synchronised clocks.
//!
//! Privileged: on the three-host stage, a responder on every host and the
//! RTTs of every pair, without and with the delay knob on host b (rounds
//! alternating between the two, so a change of the machine's load between
//! them falls on both alike); b's estimate must rise by the delay (what
//! its busy waits took, as its probe processes report it) and the others
//! stay. Then one round traced with `xlap-trace record --proto
//! xlap-probe`: every host's software time from its own stamps (sender and
//! receiver totals of the packets it sent and received) must agree with
//! the estimate from the same round's RTTs.
//!
//! Unprivileged: the estimate of RTT files with a known answer through the
//! command line, its refusals and exit codes, and the delay knob over
//! loopback.

use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use xlap_stage::{Stage, StageConfig};
use xlap_tests::trace::Recorder;
use xlap_tests::{bin, privileged, wait_for_file, KillOnDrop, Scratch};

const NAMES: [&str; 3] = ["a", "b", "c"];
/// Prober → responder: every pair from both ends, so that every host is
/// prober and responder alike (its latency differs between the roles: a
/// responder waits longer between datagrams and wakes up slower).
const PAIRS: [(usize, usize); 6] = [(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2)];
const PORT: u16 = 7400;
const DELAYED: usize = 1;
const DELAY_US: u64 = 200;
const ROUNDS: usize = 6;
const COUNT: u64 = 200;
const WARMUP: u64 = 10;
/// What the bootstrap cannot know: a host's latency is not quite
/// independent of its peers. While b spins for the delay, a and c wait
/// 400 us instead of 20 for its answers and their CPUs go idle, so their
/// wake-ups change (idle vCPUs halt on this VM), and the RTTs put that on
/// b. Measured on the stage with the probes real-time (what b's processes
/// spent: 200.2-200.3 us): b's estimate rose by 192-194 us on an idle
/// machine, 199-202 us with one or two CPU hogs beside the test; the others
/// moved by less than 6 us.
const DELAYED_SLACK_US: f64 = 15.0;
const OTHERS_SLACK_US: f64 = 5.0;
/// The 95 % intervals widened for three hosts checked at once.
const FAMILY: f64 = 1.5;
/// Between the estimate and the stamps of one traced round, besides the
/// error and the channel time (half of which the estimate holds per host):
/// the same effect of the peers (seen: up to 7 us on an idle machine). On a
/// loaded one the effect grows, and the round's own fit shows it: its
/// largest pair residual is added (seen: the mean RTTs of a round beside
/// the test suite missed by up to 16.5 us, and a's estimate was 37 us off
/// its stamps' t, within error + channel + 5 + 16.5).
const AGREE_SLACK_US: f64 = 5.0;

fn xlap(args: &[&str]) -> Output {
    Command::new(bin("xlap-trace"))
        .args(args)
        .output()
        .expect("run xlap-trace")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `estimate -f json` over `files`.
fn estimate(files: &[PathBuf]) -> Value {
    let mut args = vec!["estimate", "-f", "json"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let out = xlap(&args);
    assert!(out.status.success(), "estimate failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("estimate JSON")
}

fn table(files: &[PathBuf]) -> String {
    let mut args = vec!["estimate"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let out = xlap(&args);
    assert!(out.status.success(), "estimate failed: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// (estimate, error) of a host's statistic, microseconds.
fn stat(e: &Value, host: usize, name: &str) -> (f64, f64) {
    let s = &e["estimates"][host]["stats"][name];
    (s["us"].as_f64().unwrap(), s["err_us"].as_f64().unwrap())
}

fn addr(stage: &Stage, host: usize) -> String {
    format!("{}:{PORT}", stage.host(host).ipv4)
}

/// `xlap-trace` on host `h` as a real-time task (SCHED_FIFO 10), as the
/// latency-critical protocols the probes stand for run: under CFS a busy
/// host's wake-ups wait behind other tasks in proportion to the CPU it used
/// (with two CPU hogs beside the test, b's estimate rose by 300-330 us for
/// 200 spent, and that was b's real latency), which is the scheduler's
/// policy, not the model's error.
fn probe_command(stage: &Stage, h: usize) -> Command {
    let mut c = stage.host(h).command("chrt");
    c.args(["--fifo", "10"]).arg(bin("xlap-trace"));
    c
}

/// A responder on every host; `delay_us` on `delayed`.
fn serve(stage: &Stage, dir: &Path, delayed: Option<usize>) -> Vec<KillOnDrop> {
    (0..3)
        .map(|h| {
            let ready = dir.join(format!("serve-{}.ready", NAMES[h]));
            let delay = if delayed == Some(h) { DELAY_US } else { 0 };
            let child = probe_command(stage, h)
                .args(["probe", "serve", "--bind", &addr(stage, h)])
                .args(["--delay-us", &delay.to_string()])
                .arg("--ready-file")
                .arg(&ready)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn probe serve");
            let child = KillOnDrop(child);
            wait_for_file(&ready, 20);
            child
        })
        .collect()
}

/// Ends the responders with SIGTERM; they must end cleanly, having echoed
/// `echoed` probes each. Per responder: the delay it spent per direction on
/// average, microseconds, as it says (none without a delay).
fn stop(servers: Vec<KillOnDrop>, echoed: u64) -> Vec<Option<f64>> {
    let mut spent = Vec::new();
    for mut s in servers {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(s.0.id() as i32, libc::SIGTERM) };
        let (mut out, mut err) = (String::new(), String::new());
        s.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        s.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = s.0.wait().expect("wait probe serve");
        assert!(status.success(), "probe serve: {status} {err}");
        assert!(
            out.contains(&format!("echoed {echoed} probes")),
            "{out}{err}"
        );
        spent.push(out.split("delay spent ").nth(1).map(|rest| {
            rest.split(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("delay spent in {out}"))
        }));
    }
    spent
}

/// `probe rtt` from `from` to `to` (not started).
fn prober(
    stage: &Stage,
    (from, to): (usize, usize),
    delayed: Option<usize>,
    first_seq: u64,
    out: &Path,
) -> Command {
    let delay = if delayed == Some(from) { DELAY_US } else { 0 };
    let mut c = probe_command(stage, from);
    c.args(["probe", "rtt", "--to", &addr(stage, to)])
        .args(["--name-from", NAMES[from], "--name-to", NAMES[to]])
        .args(["--count", &COUNT.to_string()])
        .args(["--warmup", &WARMUP.to_string()])
        .args(["--interval-us", "500"])
        .args(["--delay-us", &delay.to_string()])
        .args(["--first-seq", &first_seq.to_string()])
        .arg("--out")
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn read_rtt(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("rtt file")).expect("rtt JSON")
}

/// The delay host `h` spent per direction on average in a round, by its
/// own account: the mean of its responder's (`served`) and its probers'
/// (their RTT files), microseconds.
fn delay_spent(h: usize, served: &[Option<f64>], files: &[PathBuf]) -> f64 {
    let probing: Vec<f64> = files
        .iter()
        .map(|f| read_rtt(f))
        .filter(|r| r["from"] == NAMES[h])
        .map(|r| {
            let ns = r["delay_spent_ns"].as_f64().expect("delay_spent_ns");
            ns / 1e3 / (2 * COUNT) as f64
        })
        .collect();
    assert!(!probing.is_empty(), "no prober on {}", NAMES[h]);
    let probing = probing.iter().sum::<f64>() / probing.len() as f64;
    let serving = served[h].unwrap_or_else(|| panic!("{}: no delay spent", NAMES[h]));
    (probing + serving) / 2.0
}

/// One round of every pair, one after the other: the files written and,
/// with a delay, what the delayed host spent of it ([`delay_spent`]).
fn round(stage: &Stage, dir: &Path, delayed: Option<usize>) -> (Vec<PathBuf>, Option<f64>) {
    std::fs::create_dir_all(dir).unwrap();
    let servers = serve(stage, dir, delayed);
    let files: Vec<PathBuf> = PAIRS
        .iter()
        .map(|&(f, t)| {
            let out = dir.join(format!("{}-{}.json", NAMES[f], NAMES[t]));
            let o = prober(stage, (f, t), delayed, 1, &out)
                .output()
                .expect("run probe rtt");
            assert!(o.status.success(), "probe rtt: {}", stderr(&o));
            let r = read_rtt(&out);
            assert_eq!(r["lost"], 0, "{}", out.display());
            assert_eq!(r["samples_ns"].as_array().unwrap().len() as u64, COUNT);
            out
        })
        .collect();
    // Each responder answered two probers: their warm-ups and counts.
    let served = stop(servers, 2 * (COUNT + WARMUP));
    let spent = delayed.map(|h| delay_spent(h, &served, &files));
    (files, spent)
}

#[test]
fn a_delay_on_one_host_shows_in_its_estimate_alone_and_agrees_with_its_stamps() {
    let Some(_guard) = privileged("estimate_delay") else {
        return;
    };
    let stage = Stage::build(&StageConfig {
        hosts: 3,
        ..Default::default()
    })
    .expect("stage");
    let scratch = Scratch::new("estimate");

    let (mut plain, mut delayed, mut spent) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..ROUNDS {
        let order = if r % 2 == 0 {
            [None, Some(DELAYED)]
        } else {
            [Some(DELAYED), None]
        };
        for d in order {
            let tag = if d.is_some() { "delayed" } else { "plain" };
            let (files, round_spent) = round(&stage, &scratch.path(&format!("{tag}-{r}")), d);
            spent.extend(round_spent);
            if d.is_some() {
                &mut delayed
            } else {
                &mut plain
            }
            .extend(files);
        }
    }
    // The delay the knob really added, by b's own clock: a busy wait
    // preempted at its end takes longer than asked. The estimate must find
    // that, not the nominal value.
    let spent = spent.iter().sum::<f64>() / spent.len() as f64;
    assert!(spent >= DELAY_US as f64, "spent {spent} us of {DELAY_US}");
    let (e0, e1) = (estimate(&plain), estimate(&delayed));
    eprintln!("without the delay:\n{}", table(&plain));
    eprintln!(
        "with {DELAY_US} us on {}:\n{}",
        NAMES[DELAYED],
        table(&delayed)
    );
    assert_eq!(e0["hosts"], serde_json::json!(NAMES));
    assert_eq!(e0["determined"], "over", "{ROUNDS} files per pair");
    for (h, name) in NAMES.iter().enumerate() {
        let ((m0, err0), (m1, err1)) = (stat(&e0, h, "mean"), stat(&e1, h, "mean"));
        let rise = m1 - m0;
        let err = err0.hypot(err1);
        let (want, slack) = if h == DELAYED {
            (spent, DELAYED_SLACK_US)
        } else {
            (0.0, OTHERS_SLACK_US)
        };
        eprintln!(
            "{}: mean {m0:.1} ± {err0:.1} -> {m1:.1} ± {err1:.1} us: rise {rise:.1} ± {err:.1} (expected {want:.1})",
            name
        );
        // `err` is each side's 95 % interval; three hosts are checked, so
        // at 95 % each one in seven runs of an unchanged system would fail
        // one (CI once: c rose 46.5 us against 31.7 + 5). 1.5 times it is
        // about 99.7 % each, 99 % for the three; the delay (200 us) stays
        // far outside.
        assert!(
            (rise - want).abs() <= FAMILY * err + slack,
            "{}: the mean rose by {rise:.1} us, expected {want:.1} ± {FAMILY} × {err:.1} (+ {slack} slack)",
            name
        );
    }

    // One round traced: the stamps' account of every host against the
    // estimate from the same RTTs.
    let dir = scratch.path("traced");
    std::fs::create_dir_all(&dir).unwrap();
    let servers = serve(&stage, &dir, Some(DELAYED));
    let start: Vec<PathBuf> = (0..PAIRS.len())
        .map(|i| dir.join(format!("start-{i}")))
        .collect();
    let files: Vec<PathBuf> = PAIRS
        .iter()
        .map(|&(f, t)| dir.join(format!("{}-{}.json", NAMES[f], NAMES[t])))
        .collect();
    // Distinct seq ranges: seq = 1e6·k + 1 + i.
    let probers: Vec<KillOnDrop> = PAIRS
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let mut c = prober(
                &stage,
                p,
                Some(DELAYED),
                1_000_000 * k as u64 + 1,
                &files[k],
            );
            KillOnDrop(c.arg("--start-file").arg(&start[k]).spawn().unwrap())
        })
        .collect();
    // Host of every traced process.
    let mut host_of: Vec<(u32, usize)> = servers
        .iter()
        .enumerate()
        .map(|(h, s)| (s.0.id(), h))
        .collect();
    host_of.extend(probers.iter().zip(PAIRS).map(|(p, (f, _))| (p.0.id(), f)));
    let pids: Vec<u32> = host_of.iter().map(|(p, _)| *p).collect();
    let rec = Recorder::start(&pids, &scratch.path("run"), &["--proto", "xlap-probe"]);
    for (k, mut p) in probers.into_iter().enumerate() {
        std::fs::write(&start[k], b"go\n").unwrap();
        let st = p.0.wait().unwrap();
        assert!(st.success(), "probe rtt {k}: {st}");
    }
    let _ = stop(servers, 2 * (COUNT + WARMUP));
    let out = rec.wait();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    let e2 = estimate(&files);
    eprintln!("traced round:\n{}", table(&files));

    // Per sending and receiving process: the packets' sender and receiver
    // totals and channel time, the warm-up left out.
    let sql = "SELECT tx_pid, rx_pid, kind, count(*) AS n, avg(sender_total_ns) AS s,
            avg(receiver_total_ns) AS r, avg(channel_ns) AS ch
        FROM packets WHERE NOT lost AND (seq - 1) % 1000000 >= 10
        GROUP BY ALL ORDER BY ALL";
    let run = scratch.path("run");
    let out = xlap(&["sql", run.to_str().unwrap(), sql, "-f", "json"]);
    assert!(out.status.success(), "sql: {}", stderr(&out));
    let rows: Value = serde_json::from_slice(&out.stdout).expect("sql JSON");
    let host = |pid: &Value| -> usize {
        let pid = pid.as_u64().unwrap() as u32;
        host_of
            .iter()
            .find(|(p, _)| *p == pid)
            .unwrap_or_else(|| panic!("a packet of the untraced pid {pid}"))
            .1
    };
    // Per host: sum and count of the sender totals of what it sent, the
    // receiver totals of what it received, and their channel times.
    let mut sent = [(0.0f64, 0u64); 3];
    let mut received = [(0.0f64, 0u64); 3];
    let mut channel = [(0.0f64, 0u64); 3];
    for r in rows.as_array().expect("rows") {
        let (tx, rx) = (host(&r["tx_pid"]), host(&r["rx_pid"]));
        let n = r["n"].as_u64().unwrap();
        let v = |k: &str| r[k].as_f64().unwrap() * n as f64;
        let kind = if r["kind"] == 1 { "probes" } else { "echoes" };
        eprintln!(
            "{} -> {} {kind}: {n}, sender_total {:.1}, channel {:.1}, receiver_total {:.1} us",
            NAMES[tx],
            NAMES[rx],
            v("s") / n as f64 / 1e3,
            v("ch") / n as f64 / 1e3,
            v("r") / n as f64 / 1e3
        );
        sent[tx] = (sent[tx].0 + v("s"), sent[tx].1 + n);
        received[rx] = (received[rx].0 + v("r"), received[rx].1 + n);
        for h in [tx, rx] {
            channel[h] = (channel[h].0 + v("ch"), channel[h].1 + n);
        }
    }
    let mean = |(s, n): (f64, u64)| s / n as f64 / 1e3;
    // How far the per-host model misses this round's mean RTTs.
    let misfit = e2["pairs"]
        .as_array()
        .expect("pairs")
        .iter()
        .map(|p| {
            p["residual_us"]["mean"]
                .as_f64()
                .expect("a mean residual")
                .abs()
        })
        .fold(0.0, f64::max);
    for h in 0..3 {
        // Every recorded probe and echo: two probers and two responders
        // per host.
        assert_eq!(sent[h].1, 4 * COUNT, "{}: packets sent", NAMES[h]);
        assert_eq!(received[h].1, 4 * COUNT, "{}: received", NAMES[h]);
        let traced = (mean(sent[h]) + mean(received[h])) / 2.0;
        let (est, err) = stat(&e2, h, "mean");
        let ch = mean(channel[h]);
        eprintln!(
            "{}: estimate {est:.1} ± {err:.1} us; stamps: sender_total {:.1}, receiver_total {:.1}, t {traced:.1} us, channel {ch:.1} us",
            NAMES[h],
            mean(sent[h]),
            mean(received[h])
        );
        // The estimate holds half a pair's channel time per host (no
        // --hardware-us), and what the model cannot separate (see
        // AGREE_SLACK_US).
        assert!(
            (est - traced).abs() <= err + ch + AGREE_SLACK_US + misfit,
            "{}: estimate {est:.1} ± {err:.1} us, the stamps say {traced:.1} (channel {ch:.1}, the fit's largest residual {misfit:.1})",
            NAMES[h]
        );
    }
}

/// An RTT file as `probe rtt` writes it.
fn rtt_file(dir: &Path, from: &str, to: &str, samples_ns: &[u64]) -> PathBuf {
    let path = dir.join(format!("{from}-{to}.json"));
    let f = serde_json::json!({
        "format": "xlap-probe-rtt", "format_version": 1, "from": from, "to": to,
        "samples_ns": samples_ns, "seqs": (0..samples_ns.len()).collect::<Vec<_>>(),
        "lost": 0, "late": 0,
        "settings": {"to": "10.0.0.2:7400", "local": "10.0.0.1:40000", "count": samples_ns.len(),
            "interval_us": 1000, "delay_us": 0, "timeout_ms": 1000, "warmup": 0,
            "first_seq": 0, "size": 64, "clock": "CLOCK_MONOTONIC"}
    });
    std::fs::write(&path, f.to_string()).unwrap();
    path
}

#[test]
fn the_command_line_solves_known_rtts_and_refuses_what_it_cannot() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("estimate_cli");
    // t = 10, 20, 40 us: RTT_ij = 2 t_i + 2 t_j, ±1 us alternating.
    let t = [10_000u64, 20_000, 40_000];
    let rtts = |i: usize, j: usize| -> Vec<u64> {
        (0..100)
            .map(|k| 2 * t[i] + 2 * t[j] + if k % 2 == 0 { 1000 } else { 0 } - 500)
            .collect()
    };
    let files: Vec<PathBuf> = [(0, 1), (1, 2), (2, 0)]
        .iter()
        .map(|&(i, j)| rtt_file(&scratch.0, NAMES[i], NAMES[j], &rtts(i, j)))
        .collect();
    let e = estimate(&files);
    assert_eq!(e["determined"], "exactly");
    for h in 0..3 {
        let (m, err) = stat(&e, h, "mean");
        assert!((m - t[h] as f64 / 1e3).abs() < 1e-6, "{}: {m}", NAMES[h]);
        assert!(err < 0.5, "{err}");
        let (p50, _) = stat(&e, h, "p50");
        assert!((p50 - t[h] as f64 / 1e3).abs() < 0.3, "{}: {p50}", NAMES[h]);
    }
    let text = table(&files);
    assert!(text.contains("condition number 2.00"), "{text}");

    // Two pairs of three hosts: exit 6, and which pair to add.
    let out = xlap(&[
        "estimate",
        files[0].to_str().unwrap(),
        files[1].to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("also measure a-c"),
        "{}",
        stderr(&out)
    );
    // Not an RTT file: 6; a bad option: 2.
    let bogus = scratch.path("bogus.json");
    std::fs::write(&bogus, "{}").unwrap();
    let out = xlap(&["estimate", bogus.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let mut args = vec!["estimate", "--hardware-us", "a-z=3"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let out = xlap(&args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = xlap(&[
        "probe",
        "rtt",
        "--to",
        "127.0.0.1:9",
        "--name-from",
        "a",
        "--name-to",
        "b",
        "--size",
        "8",
        "-o",
        "x.json",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn the_delay_knob_adds_twice_its_time_to_every_rtt_over_loopback() {
    let _guard = xlap_tests::unprivileged();
    let scratch = Scratch::new("probe_loopback");
    // A free port on loopback.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bind = format!("127.0.0.1:{port}");
    let ready = scratch.path("ready");
    let server = KillOnDrop(
        Command::new(bin("xlap-trace"))
            .args(["probe", "serve", "--bind", &bind, "--delay-us", "100"])
            .args(["--duration", "30"])
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_file(&ready, 20);
    let out = scratch.path("rtt.json");
    let o = Command::new(bin("xlap-trace"))
        .args(["probe", "rtt", "--to", &bind, "--name-from", "x"])
        .args(["--name-to", "y", "--count", "50", "--interval-us", "0"])
        .args(["--delay-us", "50", "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    drop(server);
    let r = read_rtt(&out);
    assert_eq!(
        (r["from"].as_str(), r["to"].as_str()),
        (Some("x"), Some("y"))
    );
    assert_eq!(r["settings"]["delay_us"], 50);
    let samples: Vec<u64> = r["samples_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(samples.len() as u64 + r["lost"].as_u64().unwrap(), 50);
    assert!(samples.len() >= 45, "{} of 50 echoed", samples.len());
    // 2 × 100 us on the responder, 2 × 50 us on the prober.
    assert!(
        samples.iter().all(|s| *s >= 300_000),
        "an RTT under the 300 us of delay: {samples:?}"
    );
    // The prober's account of its own waits: two per recorded RTT, each at
    // least the delay, and within the RTTs.
    let spent = r["delay_spent_ns"].as_u64().expect("delay_spent_ns");
    let n = samples.len() as u64;
    assert!(spent >= n * 2 * 50_000, "{spent} ns spent");
    assert!(
        spent < samples.iter().sum::<u64>(),
        "{spent} ns spent, longer than the RTTs"
    );
    let seqs = r["seqs"].as_array().unwrap();
    assert_eq!(seqs.len(), samples.len());
    assert!(
        seqs[0].as_u64().unwrap() > 10,
        "the warm-up is not recorded"
    );
}
