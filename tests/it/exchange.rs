//! Privileged: request/response round trips, against the program's own
//! account of each one. sockperf ping-pong (a program we did not write)
//! across the two-host stage, both ends traced with `--proto sockperf`;
//! its `--full-log` has the client's send and receive time of every
//! measured ping. The `exchanges` view's round trips lie inside them (our
//! first request point comes after sockperf's send time, our last
//! response point before its receive time), by a few µs of the calls'
//! own user-space work, and the `exchange` query's stages sum to each
//! round trip.

use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;
use xlap_stage::Stage;
use xlap_tests::trace::Recorder;
use xlap_tests::{bin, privileged, KillOnDrop, Scratch};

const PORT: u16 = 11411;
/// sockperf's message flags as the preset's kind (tests/it/conformance.rs).
const PING: u64 = 3;
const PONG: u64 = 2;

/// sockperf's `--full-log`: (send, receive) time of each measured ping, ns.
fn full_log(path: &std::path::Path) -> Vec<(f64, f64)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .skip_while(|l| !l.starts_with("packet, txTime"))
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f.len() == 4).then(|| {
                (
                    f[1].parse::<f64>().unwrap() * 1e9,
                    f[2].parse::<f64>().unwrap() * 1e9,
                )
            })
        })
        .collect()
}

fn xlap_json(args: &[&str]) -> Value {
    let o = std::process::Command::new(bin("xlap-trace"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "xlap-trace {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The offset into `ours` where sockperf's measured round trips
/// (`theirs`: a contiguous run of its pings, after its warm-up) fit: the
/// one where most of ours lie within 100 µs under theirs. Send times alone
/// do not tell (sockperf paces its pings evenly).
fn align(ours: &[f64], theirs: &[f64]) -> usize {
    let fits = |k: usize| {
        theirs
            .iter()
            .zip(&ours[k..])
            .filter(|(t, o)| (0.0..100_000.0).contains(&(*t - *o)))
            .count()
    };
    (0..=ours.len() - theirs.len())
        .max_by_key(|&k| (fits(k), std::cmp::Reverse(k)))
        .unwrap()
}

fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A server already started on host b and a client command on host a,
/// which waits for a start file so that its first datagram is traced; both
/// recorded with `--proto proto` until the client exits (the server is
/// then ended). The run directory, the client's stdout and its pid.
fn record_client_server(
    stage: &Stage,
    scratch: &Scratch,
    server: KillOnDrop,
    port: u16,
    client: &str,
    proto: &str,
) -> (std::path::PathBuf, String, u32) {
    let server_pid = server.0.id();
    xlap_tests::wait_for_udp_port(server_pid, port);
    let start = scratch.path("start");
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; exec {client}",
        start.display()
    );
    let mut child = KillOnDrop(
        stage
            .host(0)
            .command("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the client"),
    );
    let run = scratch.path("run");
    let client_pid = child.0.id();
    let rec = Recorder::start(&[client_pid, server_pid], &run, &["--proto", proto]);
    std::fs::write(&start, "go").unwrap();
    let mut out = String::new();
    if let Some(mut o) = child.0.stdout.take() {
        std::io::Read::read_to_string(&mut o, &mut out).unwrap();
    }
    assert!(child.0.wait().unwrap().success(), "{client}: {out}");
    // The server never exits on its own; the recorder ends with its targets.
    std::thread::sleep(Duration::from_millis(300));
    drop(server);
    rec.wait();
    (run, out, client_pid)
}

#[test]
fn sockperf_round_trips_contain_the_exchanges_and_their_stages_sum_to_them() {
    let Some(_guard) = privileged("exchange") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("exchange");
    let b = stage.host(1);
    let server_addr = b.ipv4.to_string();
    let server = KillOnDrop(
        b.command("sockperf")
            .args(["server", "-i", &server_addr, "-p", &PORT.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sockperf server (./run.sh setup installs it)"),
    );
    let log = scratch.path("sockperf.log");
    let client = format!(
        "sockperf ping-pong -i {server_addr} -p {PORT} -m 64 --mps 2000 -t 2 --full-log '{}'",
        log.display()
    );
    let (run, _, client_pid) =
        record_client_server(&stage, &scratch, server, PORT, &client, "sockperf");
    let run_arg = run.to_str().unwrap();

    // The pair the data shows is sockperf's: ping, then pong.
    let inferred = xlap_json(&[
        "analyze", run_arg, "-q", "exchange", "-f", "json", "--quiet",
    ]);
    let declared = xlap_json(&[
        "analyze",
        run_arg,
        "--exchange",
        &format!("{PING}:{PONG}"),
        "-f",
        "json",
        "--quiet",
    ]);
    assert_eq!(inferred, declared, "the inferred pair is ping → pong");
    let rows = declared["exchange"].as_array().unwrap().clone();
    let stages: Vec<&str> = rows.iter().map(|r| r["stage"].as_str().unwrap()).collect();
    assert_eq!(
        stages,
        [
            "client_send",
            "request_wire",
            "server_receive",
            "server_residence",
            "server_send",
            "response_wire",
            "client_receive",
            "rtt"
        ]
    );
    let shares: f64 = rows[..7]
        .iter()
        .map(|r| r["share_of_rtt"].as_f64().unwrap())
        .sum();
    assert!(
        (shares - 1.0).abs() < 0.001,
        "the stages' means sum to the round trip's: {shares}"
    );

    // Each exchange, from the view.
    let view = xlap_json(&[
        "sql",
        run_arg,
        "SELECT rtt_ns::DOUBLE AS rtt, (client_send_ns + request_wire_ns + server_receive_ns + server_residence_ns + server_send_ns + response_wire_ns + client_receive_ns - rtt_ns)::BIGINT AS off, request_kind, client_pid FROM exchanges ORDER BY seq",
        "-f",
        "json",
    ]);
    let view = view.as_array().unwrap();
    assert!(view.iter().all(|r| r["off"].as_i64() == Some(0)));
    assert!(view.iter().all(|r| r["request_kind"].as_u64() == Some(PING)
        && r["client_pid"].as_u64() == Some(client_pid as u64)));
    let ours_rtt: Vec<f64> = view.iter().map(|r| r["rtt"].as_f64().unwrap()).collect();

    // sockperf's account of the same round trips.
    let theirs = full_log(&log);
    assert!(
        theirs.len() > 100 && theirs.len() <= ours_rtt.len(),
        "sockperf measured {} round trips, the table has {}",
        theirs.len(),
        ours_rtt.len()
    );
    let theirs_rtts: Vec<f64> = theirs.iter().map(|(tx, rx)| rx - tx).collect();
    let k = align(&ours_rtt, &theirs_rtts);
    let mut gaps: Vec<f64> = theirs
        .iter()
        .enumerate()
        .map(|(i, (tx, rx))| (rx - tx) - ours_rtt[k + i])
        .collect();
    let inside = gaps.iter().filter(|g| **g >= 0.0).count();
    let mut theirs_rtt: Vec<f64> = theirs.iter().map(|(tx, rx)| rx - tx).collect();
    let mut ours_aligned = ours_rtt[k..k + theirs.len()].to_vec();
    let report = format!(
        "{} round trips; sockperf p50 {:.1} µs p99 {:.1} µs, ours p50 {:.1} µs p99 {:.1} µs; sockperf − ours: min {:.2} µs, p50 {:.2}, p99 {:.2}, max {:.2}",
        theirs.len(),
        quantile(&mut theirs_rtt, 0.5) / 1e3,
        quantile(&mut theirs_rtt, 0.99) / 1e3,
        quantile(&mut ours_aligned, 0.5) / 1e3,
        quantile(&mut ours_aligned, 0.99) / 1e3,
        quantile(&mut gaps, 0.0) / 1e3,
        quantile(&mut gaps, 0.5) / 1e3,
        quantile(&mut gaps, 0.99) / 1e3,
        quantile(&mut gaps, 1.0) / 1e3,
    );
    eprintln!("exchange: {report}");
    // Every round trip sockperf timed holds ours: the calls' own
    // user-space work lies between its clock reads and our stamps.
    assert_eq!(
        inside,
        theirs.len(),
        "round trips ours exceeds sockperf's: {report}"
    );
    // And by little: the calls' entry and return (a few µs on this VM).
    assert!(quantile(&mut gaps, 0.5) < 20_000.0, "{report}");
}

/// Passes of dnsperf through its three queries.
const ROUNDS: usize = 200;

/// dnsperf's `-v` lines: the latency of each query, in completion order
/// (with one query outstanding, the order it sent them), in ns.
fn dnsperf_latencies(out: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.strip_prefix("> NOERROR "))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() * 1e9)
        .collect()
}

/// A second request/response program we did not write: dnsmasq answering
/// dnsperf's queries across the stage, both traced with `--proto dns` (the
/// message ID as seq, the QR bit as kind). dnsperf times each query from
/// its send to its answer's receipt (µs resolution): each holds ours.
#[test]
fn dnsperf_queries_to_dnsmasq_contain_the_exchanges() {
    let Some(_guard) = privileged("exchange_dns") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("exchange-dns");
    let b = stage.host(1);
    let server_addr = b.ipv4.to_string();
    let port: u16 = 15353;
    // Answers from its own table only: no upstream, no files of the host.
    let server = KillOnDrop(
        b.command("dnsmasq")
            .args([
                "-k",
                "--no-resolv",
                "--no-hosts",
                "-C",
                "/dev/null",
                "--bind-interfaces",
            ])
            .args([
                "--port",
                &port.to_string(),
                "--listen-address",
                &server_addr,
            ])
            .args(["--address=/xlap.test/10.9.9.9", "--pid-file="])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq (./run.sh setup installs dnsmasq-base)"),
    );
    let queries = scratch.path("queries.txt");
    std::fs::write(&queries, "a.xlap.test A\nb.xlap.test A\nc.xlap.test A\n").unwrap();
    let client = format!(
        "dnsperf -s {server_addr} -p {port} -d '{}' -q 1 -Q 1000 -n {ROUNDS} -v",
        queries.display()
    );
    let (run, out, _) = record_client_server(&stage, &scratch, server, port, &client, "dns");
    let run_arg = run.to_str().unwrap();

    let declared = xlap_json(&[
        "analyze",
        run_arg,
        "--exchange",
        "query:response",
        "-f",
        "json",
        "--quiet",
    ]);
    let inferred = xlap_json(&[
        "analyze", run_arg, "-q", "exchange", "-f", "json", "--quiet",
    ]);
    assert_eq!(inferred, declared, "the inferred pair is query → response");
    let view = xlap_json(&[
        "sql",
        run_arg,
        "SELECT rtt_ns::DOUBLE AS rtt FROM exchanges ORDER BY request_sent_ns",
        "-f",
        "json",
    ]);
    let ours: Vec<f64> = view
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rtt"].as_f64().unwrap())
        .collect();
    let theirs = dnsperf_latencies(&out);
    // A count, not a time: dnsperf's rate with one query outstanding went
    // from 88 to 570 queries/s between two CI runs on this machine.
    assert_eq!(
        theirs.len(),
        3 * ROUNDS,
        "dnsperf answered every query: {out}"
    );
    assert_eq!(
        ours.len(),
        theirs.len(),
        "every query dnsperf had answered is an exchange"
    );
    // dnsperf prints µs: ours may round up past it by less than one.
    let mut gaps: Vec<f64> = theirs.iter().zip(&ours).map(|(t, o)| t - o).collect();
    let report = format!(
        "{} queries; dnsperf − ours: min {:.2} µs, p50 {:.2}, p99 {:.2}, max {:.2}",
        gaps.len(),
        quantile(&mut gaps, 0.0) / 1e3,
        quantile(&mut gaps, 0.5) / 1e3,
        quantile(&mut gaps, 0.99) / 1e3,
        quantile(&mut gaps, 1.0) / 1e3
    );
    eprintln!("exchange (dns): {report}");
    assert!(quantile(&mut gaps, 0.0) > -1000.0, "{report}");
    assert!(quantile(&mut gaps, 0.5) < 50_000.0, "{report}");
}
