//! Privileged: stages that partition the path, for every packet. sockperf
//! ping-pong (a program we did not write) across the two-host stage, both
//! ends traced with `--proto sockperf` and `--live`: its pings and pongs
//! are two kinds, each with its own sender and receiver. Per kind: no
//! stage is negative in any packet (the path order fits every packet, and
//! the run says where it does not); a packet without an optional point
//! (no wake-up: the reader was busy) has a stage spanning it, so the
//! sender's stages on the path sum to `sender_total_ns` and the receiver's
//! to `receiver_total_ns` in every packet, and the variance shares of the
//! path's stages (with the channel) sum to 1; the live view names only
//! stages `analyze` has for that kind. Counts are checked against
//! sockperf's own ("SentMessages", "ReceivedMessages").

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;
use xlap_stage::Stage;
use xlap_tests::trace::{analyze_rows, Recorder};
use xlap_tests::{privileged, KillOnDrop, Scratch};

const PORT: u16 = 11311;

/// `Name=N` from sockperf's "[Total Run]" summary line.
fn total_run(report: &str, name: &str) -> u64 {
    report
        .lines()
        .filter(|l| l.contains("[Total Run]"))
        .find_map(|l| {
            let rest = l.split(&format!("{name}=")).nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no [Total Run] {name}= in sockperf's output:\n{report}"))
}

/// The live view's last render: stage names per kind.
fn live_stages(stdout: &str) -> BTreeMap<i64, BTreeSet<String>> {
    let last = stdout
        .rfind("xlap-trace live")
        .map_or(stdout, |i| &stdout[i..]);
    let mut out: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    let mut kind = None;
    for line in last.lines() {
        if let Some(rest) = line.strip_prefix("kind ") {
            kind = rest.split(':').next().and_then(|k| k.trim().parse().ok());
        } else if let (Some(k), Some(rest)) = (kind, line.strip_prefix("  ")) {
            if let Some(name) = rest.split_whitespace().next() {
                out.entry(k).or_default().insert(name.to_string());
            }
        }
    }
    out
}

#[test]
fn sockperf_ping_pong_stages_partition_each_kinds_path() {
    let Some(_guard) = privileged("stage_partition") else {
        return;
    };
    assert!(
        std::process::Command::new("sockperf")
            .arg("--version")
            .output()
            .is_ok(),
        "sockperf is missing: ./run.sh setup installs it"
    );
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("stage-partition");
    let (a, b) = (stage.host(0), stage.host(1));
    let server_addr = b.ipv4.to_string();
    let server = KillOnDrop(
        b.command("sockperf")
            .args(["server", "-i", &server_addr, "-p", &PORT.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sockperf server"),
    );
    let server_pid = server.0.id();
    xlap_tests::wait_for_udp_port(server_pid, PORT);
    // The client waits for the start file, so its first ping is traced.
    let start = scratch.path("start");
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; exec sockperf ping-pong -i {server_addr} -p {PORT} -m 64 --mps 4000 -t 2",
        start.display()
    );
    let client = KillOnDrop(
        a.command("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("sockperf client"),
    );
    let client_pid = client.0.id();
    let run = scratch.path("run");
    let rec = Recorder::start(
        &[client_pid, server_pid],
        &run,
        &["--proto", "sockperf", "--live"],
    );
    std::fs::write(&start, "go").unwrap();
    let mut client = client;
    let mut report = String::new();
    if let Some(mut o) = client.0.stdout.take() {
        std::io::Read::read_to_string(&mut o, &mut report).expect("sockperf's output");
    }
    let status = client.0.wait().expect("sockperf client");
    assert!(status.success(), "sockperf ping-pong failed: {report}");
    // The server never exits on its own; the recorder ends with its targets.
    std::thread::sleep(Duration::from_millis(300));
    drop(server);
    let rec_out = rec.wait();
    let live = live_stages(&String::from_utf8_lossy(&rec_out.stdout));
    let (sent, received) = (
        total_run(&report, "SentMessages"),
        total_run(&report, "ReceivedMessages"),
    );

    let conn = duckdb::Connection::open_in_memory().unwrap();
    conn.execute_batch(&format!(
        "CREATE VIEW packets AS FROM read_parquet('{}');",
        run.join("packets.parquet").display()
    ))
    .unwrap();
    // The stages and their sides as analyze has them, per kind.
    let corr = analyze_rows(&run, "correlation", &[]);
    let mut sides: BTreeMap<i64, BTreeMap<String, String>> = BTreeMap::new();
    for r in &corr {
        sides
            .entry(r["kind"].as_i64().unwrap())
            .or_default()
            .insert(
                r["stage"].as_str().unwrap().to_string(),
                r["side"].as_str().unwrap().to_string(),
            );
    }
    // The pings go from the client, the pongs from the server.
    let kind_of = |pid: u32| -> i64 {
        conn.query_row(
            "SELECT mode(kind)::BIGINT FROM packets WHERE tx_pid = ?",
            [pid],
            |r| r.get(0),
        )
        .unwrap()
    };
    let (ping, pong) = (kind_of(client_pid), kind_of(server_pid));
    assert_ne!(ping, pong, "pings and pongs are two kinds");
    let count =
        |sql: &str| -> u64 { conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap() as u64 };
    // sockperf's own account: every ping it sent was sent and received
    // here, every pong it received was sent by the server and received.
    let pings = count(&format!(
        "SELECT count(*) FROM packets WHERE kind = {ping} AND tx_pid = {client_pid} AND rx_pid = {server_pid} AND NOT lost"
    ));
    let pongs = count(&format!(
        "SELECT count(*) FROM packets WHERE kind = {pong} AND sock_recv_exit_ns IS NOT NULL AND tx_pid = {server_pid} AND rx_pid = {client_pid}"
    ));
    println!(
        "sockperf: sent {sent}, received {received}; packets: {pings} pings, {pongs} pongs read"
    );
    assert_eq!(pings, sent, "pings delivered vs sockperf's SentMessages");
    // A pong that comes back as the run's time ends is read but not
    // counted by sockperf (seen: one, now and then).
    assert!(
        received <= pongs && pongs <= sent,
        "pongs read ({pongs}) vs sockperf's ReceivedMessages ({received}) and SentMessages ({sent})"
    );

    for kind in [ping, pong] {
        let of_kind = &sides[&kind];
        let cols = |want: &[&str]| -> Vec<String> {
            of_kind
                .iter()
                .filter(|(s, side)| s.contains("__") && want.contains(&side.as_str()))
                .map(|(s, _)| format!("\"{s}_ns\""))
                .collect()
        };
        let sum = |cs: &[String]| {
            if cs.is_empty() {
                "0".to_string()
            } else {
                cs.iter()
                    .map(|c| format!("coalesce({c}, 0)"))
                    .collect::<Vec<_>>()
                    .join(" + ")
            }
        };
        let all = cols(&["tx", "rx", "tx_after_wire", "rx_before_wire"]);
        let (tx, rx) = (cols(&["tx"]), cols(&["rx"]));
        let delivered = count(&format!(
            "SELECT count(*) FROM packets WHERE kind = {kind} AND e2e_ns IS NOT NULL"
        ));
        let negative = count(&format!(
            "SELECT count(*) FROM packets WHERE kind = {kind} AND least({}) < 0",
            all.join(", ")
        ));
        let tx_off = count(&format!(
            "SELECT count(*) FROM packets WHERE kind = {kind} AND sender_total_ns IS NOT NULL AND {} <> sender_total_ns",
            sum(&tx)
        ));
        let rx_off = count(&format!(
            "SELECT count(*) FROM packets WHERE kind = {kind} AND receiver_total_ns IS NOT NULL AND {} <> receiver_total_ns",
            sum(&rx)
        ));
        let e2e_off = count(&format!(
            "SELECT count(*) FROM packets WHERE kind = {kind} AND e2e_ns IS NOT NULL AND {} + channel_ns <> e2e_ns",
            sum(&[tx.clone(), rx.clone()].concat())
        ));
        let share: f64 = corr
            .iter()
            .filter(|r| r["kind"].as_i64() == Some(kind))
            .filter(|r| matches!(r["side"].as_str(), Some("tx" | "channel" | "rx")))
            .filter_map(|r| r["variance_share"].as_f64())
            .sum();
        let spanning = count(&format!(
            "SELECT count(*) FROM packets WHERE kind = {kind} AND e2e_ns IS NOT NULL AND sched_switch_in_ns IS NULL AND sock_recv_exit_ns IS NOT NULL"
        ));
        println!(
            "kind {kind}: {delivered} delivered, {spanning} without a wake-up; negative stages in {negative} packets; \
             tx sum off in {tx_off}, rx sum off in {rx_off}, e2e off in {e2e_off}; variance shares sum to {share:.4}; stages {:?}",
            of_kind.keys().collect::<Vec<_>>()
        );
        assert!(delivered > 0, "kind {kind}: no packet delivered");
        assert_eq!(negative, 0, "kind {kind}: packets with a negative stage");
        assert_eq!(tx_off, 0, "kind {kind}: sender stages vs sender_total_ns");
        assert_eq!(
            rx_off, 0,
            "kind {kind}: receiver stages vs receiver_total_ns"
        );
        assert_eq!(e2e_off, 0, "kind {kind}: stages + channel vs e2e_ns");
        // Shares are rounded to 4 digits per stage.
        assert!(
            (share - 1.0).abs() < 0.001 * of_kind.len() as f64,
            "kind {kind}: variance shares sum to {share}"
        );
        let live_names = live.get(&kind).cloned().unwrap_or_default();
        assert!(
            !live_names.is_empty(),
            "kind {kind}: no stage in the live view: {live:?}"
        );
        let extra: Vec<&String> = live_names
            .iter()
            .filter(|n| !of_kind.contains_key(*n))
            .collect();
        assert!(
            extra.is_empty(),
            "kind {kind}: live stages analyze does not have: {extra:?} (analyze: {:?})",
            of_kind.keys().collect::<Vec<_>>()
        );
    }
    // The five slowest packets of each kind have a cause among their stages
    // (their time is in some stage), or the run says none was above its
    // fence only when every one of their stages lay within it.
    let causes = analyze_rows(&run, "outlier_causes", &[]);
    for r in &causes {
        println!(
            "cause kind {} {}: {} ({})",
            r["kind"], r["cause"], r["packets"], r["share_of_outliers"]
        );
    }
}
