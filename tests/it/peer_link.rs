//! Privileged: two recorders that meet over the network (`record --to`,
//! `record --collect`), on the example protocol across the stage, the
//! recorders talking over 127.0.0.1. Checked against the protocol's own
//! logs and against `correlate` of the two local run directories; a wrong
//! token, garbage from a raw client, and a peer killed mid-run each leave
//! the collector's run complete.

use crate::live_view::scrape;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};
use xlap_stage::Stage;
use xlap_tests::example::{events, kind_code, ExampleOptions, ProtocolRun};
use xlap_tests::trace::{analyze_rows, run_meta, Recorder};
use xlap_tests::{bin, privileged, Scratch};

/// A port free on 127.0.0.1 now (the collector binds it next).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn token_file(scratch: &Scratch, name: &str, text: &str) -> PathBuf {
    let p = scratch.path(name);
    std::fs::write(&p, format!("{text}\n")).unwrap();
    p
}

/// The recorder's whole output, whatever its status.
fn finish(rec: Recorder) -> Output {
    rec.child.wait_with_output().expect("wait xlap-trace")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn seqs(conn: &duckdb::Connection, sql: &str) -> BTreeSet<u64> {
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, i64>(0)).unwrap();
    rows.map(|r| r.unwrap() as u64).collect()
}

fn sent_data(sent: &[serde_json::Value]) -> BTreeSet<u64> {
    events(sent, "sent")
        .filter(|e| e["kind"] == "data")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

/// The peer directories the collector made in `dir`.
fn peer_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut d: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("peer-")
        })
        .collect();
    d.sort();
    d
}

/// The `_ns` columns both packets tables have.
fn common_ns_columns(conn: &duckdb::Connection, a: &Path, b: &Path) -> Vec<String> {
    let cols = |p: &Path| -> BTreeSet<String> {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT column_name FROM (DESCRIBE SELECT * FROM '{}')",
                p.display()
            ))
            .unwrap();
        let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
        rows.map(|r| r.unwrap())
            .filter(|c| c.ends_with("_ns"))
            .collect()
    };
    cols(a).intersection(&cols(b)).cloned().collect()
}

/// The collector's own run: every data packet its receiver's log
/// delivered has its receive point.
fn assert_receiver_packets(b_dir: &Path, received: &[serde_json::Value]) {
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let delivered: BTreeSet<u64> = events(received, "delivered")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    let sql = format!(
        "SELECT seq FROM '{}' WHERE kind = {} AND sock_recv_exit_ns IS NOT NULL",
        b_dir.join("packets.parquet").display(),
        kind_code("data")
    );
    assert_eq!(seqs(&conn, &sql), delivered);
}

/// The collector's packets table equals what `correlate` makes of the two
/// local run directories: the same rows, every point column alike.
fn assert_same_as_correlate(scratch: &Scratch, a_dir: &Path, b_dir: &Path) {
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let packets = b_dir.join("packets.parquet");
    let offline = scratch.path("offline.parquet");
    let o = std::process::Command::new(bin("xlap-trace"))
        .arg("correlate")
        .arg(a_dir)
        .arg(b_dir)
        .arg("-o")
        .arg(&offline)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let cols = common_ns_columns(&conn, &packets, &offline).join(", ");
    let count = |sql: String| -> i64 { conn.query_row(&sql, [], |r| r.get(0)).unwrap() };
    let (q, r) = (offline.display(), packets.display());
    assert_eq!(
        count(format!("SELECT count(*) FROM '{q}'")),
        count(format!("SELECT count(*) FROM '{r}'"))
    );
    for (x, y) in [(&q, &r), (&r, &q)] {
        assert_eq!(
            count(format!("SELECT count(*) FROM (SELECT kind, seq, {cols} FROM '{x}' EXCEPT ALL SELECT kind, seq, {cols} FROM '{y}')")),
            0,
            "rows of {x} not in {y}"
        );
    }
}

/// The example protocol (gated, `count` packets every `period_us`) across
/// the stage, its receiver recorded by a collector listening on a free
/// loopback port with the token in `token` and `--peer-wait peer_wait`.
struct Collecting {
    run: ProtocolRun,
    sender: u32,
    listen: String,
    a_dir: PathBuf,
    b_dir: PathBuf,
    collector: Recorder,
}

fn collecting(
    stage: &Stage,
    scratch: &Scratch,
    (count, period_us): (u32, u64),
    token: &Path,
    peer_wait: &str,
    extra: &[&str],
) -> Collecting {
    let opts = ExampleOptions {
        count,
        period_us,
        gated: true,
        ..Default::default()
    };
    let run = ProtocolRun::spawn(stage, scratch, &opts);
    let (sender, receiver) = run.pids();
    let listen = format!("127.0.0.1:{}", free_port());
    let b_dir = scratch.path("b");
    let mut args = vec![
        "--collect",
        &listen,
        "--token-file",
        token.to_str().unwrap(),
        "--peer-wait",
        peer_wait,
    ];
    args.extend_from_slice(extra);
    let collector = Recorder::start(&[receiver], &b_dir, &args);
    Collecting {
        run,
        sender,
        listen,
        a_dir: scratch.path("a"),
        b_dir,
        collector,
    }
}

/// Kills (SIGKILL) the streaming recorder `peer` once the collector in
/// `b_dir` holds `bytes` of its stream (a condition, not a time), and
/// reaps it.
fn kill_once_streamed(peer: Recorder, b_dir: &Path, bytes: u64) {
    let start = Instant::now();
    let stream = || {
        peer_dirs(b_dir)
            .first()
            .and_then(|d| std::fs::metadata(d.join("stamps.arrows")).ok())
            .map_or(0, |m| m.len())
    };
    while stream() < bytes {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no stream arrived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a signal to the recorder this test started.
    unsafe { libc::kill(peer.child.id() as libc::pid_t, libc::SIGKILL) };
    let _ = finish(peer);
}

#[test]
fn a_streamed_peer_run_is_correlated_as_the_two_local_runs_are() {
    let Some(_guard) = privileged("peer_link") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("peer_link_stream");
    let token = token_file(&scratch, "token", "a shared secret of the test");
    let t = token.to_str().unwrap();
    let Collecting {
        run,
        sender,
        listen,
        a_dir,
        b_dir,
        collector,
    } = collecting(&stage, &scratch, (3000, 200), &token, "60", &[]);
    let peer = Recorder::start(&[sender], &a_dir, &["--to", &listen, "--token-file", t]);
    run.start();
    let (sent, received) = run.wait();
    let peer_out = finish(peer);
    let coll_out = finish(collector);
    assert!(peer_out.status.success(), "peer: {}", stderr(&peer_out));
    assert!(
        coll_out.status.success(),
        "collector: {}",
        stderr(&coll_out)
    );
    eprintln!(
        "--- peer:\n{}--- collector:\n{}",
        stderr(&peer_out),
        stderr(&coll_out)
    );

    // Both sides' accounts of the link.
    let link = run_meta(&a_dir).peer_link.expect("the peer notes its link");
    assert_eq!(link.state, "delivered", "{link:?}");
    assert_eq!(link.bytes_not_delivered, 0);
    let collected = run_meta(&b_dir)
        .peers
        .expect("the collector notes its peers");
    assert_eq!(collected.peers.len(), 1, "{collected:?}");
    let arrival = &collected.peers[0];
    assert!(arrival.complete, "{arrival:?}");
    let peer_dir = b_dir.join(&arrival.dir);
    assert_eq!(peer_dirs(&b_dir), vec![peer_dir.clone()]);
    // The stream arrived byte for byte, and the final Parquet file as it
    // is (run.json here has the link's note since).
    for f in ["stamps.arrows", "stamps.parquet"] {
        assert_eq!(
            std::fs::read(a_dir.join(f)).unwrap(),
            std::fs::read(peer_dir.join(f)).unwrap(),
            "{f} differs"
        );
    }
    eprintln!(
        "peer link: {} stream bytes, {} sent, collector waited {:.2} s",
        link.stream_bytes, link.bytes_sent, collected.waited_s
    );

    // One directory's packets table holds both hosts' packets: every data
    // packet the sender's log sent, with its points from both ends.
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let packets = b_dir.join("packets.parquet");
    let p = packets.display();
    let data = kind_code("data");
    let sent = sent_data(&sent);
    assert_eq!(
        seqs(
            &conn,
            &format!(
                "SELECT seq FROM '{p}' WHERE kind = {data} AND sock_send_enter_ns IS NOT NULL"
            )
        ),
        sent,
        "the sender's points: every data packet its log sent"
    );
    let delivered: BTreeSet<u64> = events(&received, "delivered")
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs(&conn, &format!("SELECT seq FROM '{p}' WHERE kind = {data} AND sock_send_enter_ns IS NOT NULL AND sock_recv_exit_ns IS NOT NULL")),
        delivered,
        "both ends' points: every packet the receiver's log delivered"
    );

    // The directory reads as one run of both ends.
    let summary = analyze_rows(&b_dir, "summary", &[]);
    assert!(
        summary.iter().any(|r| r["section"] == "total"
            && r["name"] == "e2e"
            && r["packets"].as_u64() > Some(0)),
        "an end-to-end latency: {summary:?}"
    );

    // The same table as `correlate` makes of the two local run directories.
    assert_same_as_correlate(&scratch, &a_dir, &b_dir);
}

#[test]
fn a_wrong_token_is_said_on_both_sides_and_the_collector_records_on() {
    let Some(_guard) = privileged("peer_link") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("peer_link_token");
    let right = token_file(&scratch, "right", "the collector's token");
    let wrong = token_file(&scratch, "wrong", "not the collector's token");
    let Collecting {
        run,
        sender,
        listen,
        a_dir,
        b_dir,
        collector,
    } = collecting(&stage, &scratch, (500, 100), &right, "2", &[]);
    let peer = Recorder::start(
        &[sender],
        &a_dir,
        &[
            "--to",
            &listen,
            "--token-file",
            wrong.to_str().unwrap(),
            "--peer-wait",
            "2",
        ],
    );
    run.start();
    let (_sent, received) = run.wait();
    let peer_out = finish(peer);
    let coll_out = finish(collector);
    let (pe, ce) = (stderr(&peer_out), stderr(&coll_out));
    eprintln!("--- peer:\n{pe}--- collector:\n{ce}");
    assert_eq!(
        peer_out.status.code(),
        Some(1),
        "the peer's run did not reach the collector: {pe}"
    );
    assert!(
        pe.contains("the collector refused this recorder: wrong token"),
        "{pe}"
    );
    assert!(ce.contains("wrong token"), "{ce}");
    assert!(coll_out.status.success(), "{ce}");
    // The peer's own run is whole; the link says why it is not elsewhere.
    let a = run_meta(&a_dir);
    assert_eq!(a.state, xlap_records::run_meta::RunState::Complete);
    assert_eq!(a.peer_link.unwrap().state, "refused");
    // The collector's run: complete, its receiver's packets all there, no
    // peer directory, the refusal listed.
    let b = run_meta(&b_dir);
    assert_eq!(b.state, xlap_records::run_meta::RunState::Complete);
    let peers = b.peers.unwrap();
    assert!(
        peers.peers.is_empty() && peers.refused_total >= 1,
        "{peers:?}"
    );
    assert!(peers.refused[0].reason.contains("wrong token"));
    assert!(peer_dirs(&b_dir).is_empty());
    assert_receiver_packets(&b_dir, &received);
}

/// Connects, takes the collector's first frame, sends `bytes`, and reads
/// until the collector drops the connection.
fn send_raw(addr: &str, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let local = c.local_addr().unwrap().to_string();
    let mut first = [0u8; 41];
    c.read_exact(&mut first).unwrap();
    assert_eq!(&first[..3], b"XLP", "the collector speaks first");
    let _ = c.write_all(bytes);
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    local
}

#[test]
fn garbage_from_the_network_is_named_and_dropped() {
    let Some(_guard) = privileged("peer_link") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("peer_link_garbage");
    let token = token_file(&scratch, "token", "a shared secret of the test");
    let Collecting {
        run,
        listen,
        b_dir,
        collector,
        ..
    } = collecting(&stage, &scratch, (500, 100), &token, "1", &[]);
    // Random bytes, then a well-formed header announcing 4 GiB.
    let mut random = vec![0u8; 4096];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut random)
        .unwrap();
    random[0] = b'G';
    let garbler = send_raw(&listen, &random);
    let mut oversize = b"XLP\x01\x02".to_vec();
    oversize.extend_from_slice(&u32::MAX.to_be_bytes());
    let oversizer = send_raw(&listen, &oversize);
    run.start();
    let (_sent, received) = run.wait();
    let out = finish(collector);
    let e = stderr(&out);
    assert!(out.status.success(), "{e}");
    assert!(
        e.contains(&format!(
            "peer {garbler}: not an xlap-trace peer (bad magic"
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "peer {oversizer}: a Hello frame of 4294967295 bytes"
        )),
        "{e}"
    );
    let b = run_meta(&b_dir);
    assert_eq!(b.state, xlap_records::run_meta::RunState::Complete);
    assert_eq!(b.peers.unwrap().refused_total, 2);
    assert!(peer_dirs(&b_dir).is_empty());
    assert_receiver_packets(&b_dir, &received);
}

#[test]
fn a_peer_killed_mid_run_leaves_what_arrived_to_the_analysis() {
    let Some(_guard) = privileged("peer_link") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("peer_link_killed");
    let token = token_file(&scratch, "token", "a shared secret of the test");
    let t = token.to_str().unwrap();
    let Collecting {
        run,
        sender,
        listen,
        a_dir,
        b_dir,
        collector,
    } = collecting(&stage, &scratch, (20_000, 250), &token, "2", &[]);
    let peer = Recorder::start(&[sender], &a_dir, &["--to", &listen, "--token-file", t]);
    run.start();
    // Killed once some batches have reached the collector (a condition,
    // not a time: the protocol runs ~5 s).
    kill_once_streamed(peer, &b_dir, 64 << 10);
    let (sent, _received) = run.wait();
    let out = finish(collector);
    let e = stderr(&out);
    eprintln!("--- collector:\n{e}");
    assert!(out.status.success(), "{e}");
    assert!(e.contains("its run is incomplete in peer-1-"), "{e}");
    let collected = run_meta(&b_dir).peers.unwrap();
    let arrival = &collected.peers[0];
    assert!(
        !arrival.complete && arrival.stream_bytes_sent_total.is_none(),
        "{arrival:?}"
    );
    let peer_dir = b_dir.join(&arrival.dir);
    // The peer's run, made whole from what arrived (as after a crash).
    let pm = run_meta(&peer_dir);
    assert_eq!(pm.state, xlap_records::run_meta::RunState::Recovered);
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let held = seqs(
        &conn,
        &format!(
            "SELECT seq FROM '{}' WHERE kind = {} AND sock_send_enter_ns IS NOT NULL",
            b_dir.join("packets.parquet").display(),
            kind_code("data")
        ),
    );
    let sent = sent_data(&sent);
    assert!(!held.is_empty(), "complete batches that arrived are kept");
    assert!(held.is_subset(&sent), "only packets the sender sent");
    assert!(held.len() < sent.len(), "the peer died before the end");
    // Prefix-ish: from the first packet on, nothing after the kill.
    assert_eq!(held.first(), sent.first());
    let before_last: usize = sent.range(..=*held.last().unwrap()).count();
    eprintln!(
        "peer killed: {} of {} data packets arrived ({} sent up to the last that did), {} stream bytes",
        held.len(),
        sent.len(),
        before_last,
        arrival.stream_bytes
    );
}

/// The recorder's stdout read line by line as it comes, each line with
/// the instant it was read.
fn read_lines(rec: &mut Recorder) -> std::thread::JoinHandle<Vec<(Instant, String)>> {
    let out = rec.child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .map(|l| (Instant::now(), l))
            .collect()
    })
}

/// /proc/PID/status of the collector's `peer-decode` child, once it runs.
fn decoder_status(collector: u32) -> String {
    let start = Instant::now();
    loop {
        for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
            let p = e.path();
            let (Ok(stat), Ok(cmd)) = (
                std::fs::read_to_string(p.join("stat")),
                std::fs::read(p.join("cmdline")),
            ) else {
                continue;
            };
            // pid (comm) state ppid ...
            let ppid = stat
                .rsplit(") ")
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|n| n.parse::<u32>().ok());
            let decoding = cmd.split(|b| *b == 0).any(|a| a == b"peer-decode");
            if ppid == Some(collector) && decoding {
                if let Ok(status) = std::fs::read_to_string(p.join("status")) {
                    return status;
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no peer-decode child of the collector"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of `family`'s sample for the collector's first peer whose
/// labels end with `labels_end`.
fn peer_series(text: &str, family: &str, labels_end: &str) -> Option<f64> {
    let start = format!("{family}{{peer=\"peer-1-");
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        (series.starts_with(&start) && series.ends_with(labels_end))
            .then(|| value.parse().ok())
            .flatten()
    })
}

/// A number after `prefix` in `line`.
fn number_after(line: &str, prefix: &str) -> Option<f64> {
    line.split(prefix)
        .nth(1)?
        .split_whitespace()
        .next()?
        .trim_end_matches(',')
        .parse()
        .ok()
}

/// `--live` on the collector: while the run goes on, its view shows the
/// peer's data packets end to end (the peer's sock.send_enter to this
/// host's sock.recv_exit), clock-corrected by an online offset. Both
/// namespaces share one kernel clock, so the true offset is 0: the
/// online estimate must hold it within its bound. The live count and
/// median agree with the packets table the run ends with.
#[test]
fn the_live_view_shows_the_cross_host_latency_the_packets_table_confirms() {
    let Some(_guard) = privileged("peer_link") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("peer_link_live");
    let metrics = format!("127.0.0.1:{}", free_port());
    let cross_series = format!(
        "kind=\"{}\",direction=\"in\",corrected=\"true\"}}",
        kind_code("data")
    );
    let token = token_file(&scratch, "token", "a shared secret of the test");
    let t = token.to_str().unwrap();
    // 8000 packets (within the view's 8192 kept per series), ~8 s: longer
    // than the join's wait, so lines come while the protocol runs.
    let Collecting {
        run,
        sender,
        listen,
        a_dir: _,
        b_dir,
        mut collector,
    } = collecting(
        &stage,
        &scratch,
        (8000, 1000),
        &token,
        "60",
        &["--live", "--metrics", &metrics],
    );
    let lines = read_lines(&mut collector);
    // Scrapes until the cross-host series are there (the run lasts ~8 s).
    let scraper = {
        let (addr, series) = (metrics.clone(), cross_series.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(60) {
                if let Some(text) = scrape(&addr) {
                    if peer_series(&text, "xlap_cross_host_e2e_seconds_count", &series)
                        .is_some_and(|n| n > 0.0)
                        && text.contains("xlap_peer_clock_offset_seconds{")
                    {
                        return Some(text);
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            None
        })
    };
    let a_dir = scratch.path("a");
    let peer = Recorder::start(&[sender], &a_dir, &["--to", &listen, "--token-file", t]);
    run.start();
    // The peer's decoder, by the kernel's account: a child of the
    // collector, no capability, no_new_privs.
    let decoder = decoder_status(collector.child.id());
    for field in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "NoNewPrivs:\t1",
    ] {
        assert!(decoder.contains(field), "{field}: {decoder}");
    }
    let _ = run.wait();
    let protocol_ended = Instant::now();
    let peer_out = finish(peer);
    let coll_out = finish(collector);
    assert!(peer_out.status.success(), "peer: {}", stderr(&peer_out));
    assert!(coll_out.status.success(), "{}", stderr(&coll_out));
    let lines = lines.join().unwrap();
    let data = kind_code("data");
    // The same while it ran, as OpenMetrics: the offset within its bound.
    let scraped = scraper
        .join()
        .unwrap()
        .expect("no cross-host series in the metrics while the run went on");
    assert!(scraped.ends_with("# EOF\n"), "{scraped}");
    let gauge = |name: &str| {
        peer_series(&scraped, name, "\"}").unwrap_or_else(|| panic!("{name}: {scraped}"))
    };
    let (theta, u) = (
        gauge("xlap_peer_clock_offset_seconds"),
        gauge("xlap_peer_clock_uncertainty_seconds"),
    );
    eprintln!("scraped: offset {theta:e} s ± {u:e} s");
    // The text with the peers' families is still well-formed (promtool,
    // where it is installed, as the Prometheus scrape test has it).
    let promtool = Path::new("/usr/bin/promtool");
    if promtool.exists() {
        let body = scraped.split_once("\r\n\r\n").map_or(&*scraped, |b| b.1);
        let said = crate::prometheus_scrape::promtool_says(promtool, body);
        assert!(said.is_empty(), "promtool: {said:?}\n{body}");
    }
    assert!(
        theta.abs() <= u,
        "scraped offset {theta} s ± {u} s, the truth 0"
    );
    let cross = format!("cross-host kind {data} peer-1-");
    let inbound: Vec<&(Instant, String)> = lines
        .iter()
        .filter(|(_, l)| l.starts_with(&cross) && l.contains("->here:"))
        .collect();
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    let (first_at, first) = inbound
        .iter()
        .find(|(_, l)| number_after(l, ": ").is_some_and(|n| n > 0.0))
        .unwrap_or_else(|| panic!("no cross-host line in the live view:\n{text}"));
    assert!(
        *first_at < protocol_ended,
        "the first cross-host line came after the protocol ended: {first}"
    );
    // The view's last block: the whole run.
    let last = &inbound.last().unwrap().1;
    eprintln!("first: {first}\nlast: {last}");
    let packets = number_after(last, ": ").unwrap() as i64;
    let p50 = number_after(last, "e2e p50 ").unwrap_or_else(|| panic!("{last}"));
    let bound = number_after(last, "± ").unwrap_or_else(|| panic!("not corrected: {last}"));
    assert!(
        last.contains("(sock.send_enter -> sock.recv_exit)"),
        "{last}"
    );
    let clock = lines
        .iter()
        .rev()
        .find(|(_, l)| l.starts_with("peer peer-1-") && l.contains(": clock offset "))
        .map(|(_, l)| l.clone())
        .unwrap_or_else(|| panic!("no clock line:\n{text}"));
    let offset = number_after(&clock, "clock offset ").unwrap();
    let offset_bound = number_after(&clock, "± ").unwrap();
    eprintln!("{clock}");
    // One kernel clock: the truth is 0, and it lies within the bound.
    assert!(
        offset.abs() <= offset_bound + 0.1,
        "online offset {offset} µs ± {offset_bound} µs, the truth 0: {clock}"
    );
    assert!((bound - offset_bound).abs() < 0.2, "{last} / {clock}");

    // The packets table the run ended with (correlate's mapping: the same
    // boot id, the identity).
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let p = b_dir.join("packets.parquet");
    let (n, median_us): (i64, f64) = conn
        .query_row(
            &format!(
                "SELECT count(*), median(sock_recv_exit_ns - sock_send_enter_ns) / 1e3 FROM '{}' \
                 WHERE kind = {data} AND sock_send_enter_ns IS NOT NULL AND sock_recv_exit_ns IS NOT NULL",
                p.display()
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    eprintln!(
        "live: {packets} packets, p50 {p50} µs ± {bound} µs; packets table: {n} packets, median {median_us:.1} µs; offset {offset} µs ± {offset_bound} µs"
    );
    assert_eq!(packets, n, "every packet of the table joined live: {last}");
    assert!(
        (p50 - median_us).abs() <= bound + 0.2,
        "live p50 {p50} µs ± {bound} µs, the packets table's median {median_us} µs"
    );
    let status = lines
        .iter()
        .rev()
        .find(|(_, l)| l.starts_with("peer peer-1-") && l.contains("stamps arrived"))
        .unwrap();
    eprintln!("{}", status.1);
}

/// The peer killed mid-run: the collector's live view says it is gone,
/// and the collector records on to its run's end.
#[test]
fn a_peer_killed_mid_run_is_said_gone_in_the_live_view() {
    let Some(_guard) = privileged("peer_link") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("peer_link_live_killed");
    let token = token_file(&scratch, "token", "a shared secret of the test");
    let t = token.to_str().unwrap();
    let Collecting {
        run,
        sender,
        listen,
        a_dir,
        b_dir,
        mut collector,
    } = collecting(&stage, &scratch, (6000, 1000), &token, "2", &["--live"]);
    let lines = read_lines(&mut collector);
    let peer = Recorder::start(&[sender], &a_dir, &["--to", &listen, "--token-file", t]);
    run.start();
    kill_once_streamed(peer, &b_dir, 16 << 10);
    let (_sent, received) = run.wait();
    let out = finish(collector);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = lines.join().unwrap();
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    let gone = lines
        .iter()
        .find(|(_, l)| l.starts_with("peer peer-1-") && l.contains(": gone (connection dropped"))
        .unwrap_or_else(|| panic!("the live view never said the peer is gone:\n{text}"));
    eprintln!("{}", gone.1);
    // The view went on after it (the capture did not wait on the peer).
    let later = lines
        .iter()
        .filter(|(at, l)| *at > gone.0 && l.starts_with("xlap-trace live "))
        .count();
    assert!(later > 0, "no view after the peer went:\n{text}");
    // The collector recorded on: its receiver's packets all there.
    assert_receiver_packets(&b_dir, &received);
}

/// A peer that holds the token and streams garbage (an Arrow message of
/// 64 bytes of random metadata, then random bytes): its decoder ends, said
/// on the peer's line of the live view; the collector records on, its run
/// complete.
#[test]
fn garbage_from_an_authenticated_peer_ends_only_its_live_decoder() {
    use xlap_capture::peer::auth::Token;
    use xlap_capture::peer::frame::{self, Kind};
    let Some(_guard) = privileged("peer_link") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("peer_link_live_garbage");
    let text = "a shared secret of the test";
    let token = token_file(&scratch, "token", text);
    let Collecting {
        run,
        listen,
        b_dir,
        mut collector,
        ..
    } = collecting(&stage, &scratch, (3000, 1000), &token, "1", &["--live"]);
    let lines = read_lines(&mut collector);
    // The handshake as a peer makes it (sender.rs), then the garbage.
    let token = Token::from_text(text).unwrap();
    let mut conn = TcpStream::connect(&listen).unwrap();
    let (kind, theirs) = frame::read(&mut conn).unwrap();
    assert_eq!(kind, Kind::Nonce);
    let ours = xlap_capture::peer::auth::nonce().unwrap();
    let hello = r#"{"run_id":"garbage-run","host":"evil"}"#;
    let tag = token.hello_tag(&theirs, &ours, hello.as_bytes());
    frame::write(&mut conn, Kind::Hello, &[&ours, &tag, hello.as_bytes()]).unwrap();
    let (kind, _) = frame::read(&mut conn).unwrap();
    assert_eq!(kind, Kind::Accept);
    let mut garbage = vec![0xff, 0xff, 0xff, 0xff];
    garbage.extend_from_slice(&64u32.to_le_bytes());
    let mut random = vec![0u8; 64 << 10];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut random)
        .unwrap();
    garbage.extend_from_slice(&random);
    frame::write(&mut conn, Kind::Stream, &[&0u64.to_be_bytes(), &garbage]).unwrap();
    run.start();
    let (_sent, received) = run.wait();
    let out = finish(collector);
    drop(conn);
    let e = stderr(&out);
    assert!(out.status.success(), "{e}");
    let lines = lines.join().unwrap();
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    let said = lines
        .iter()
        .find(|(_, l)| {
            l.starts_with("peer peer-1-evil: ") && l.contains("its live decoding ended: ")
        })
        .unwrap_or_else(|| panic!("the decoder's end is not said:\n{text}\n{e}"));
    eprintln!("{}", said.1);
    // The view went on after it.
    assert!(lines
        .iter()
        .any(|(at, l)| *at > said.0 && l.starts_with("xlap-trace live ")));
    assert_eq!(
        run_meta(&b_dir).state,
        xlap_records::run_meta::RunState::Complete
    );
    assert_receiver_packets(&b_dir, &received);
}
