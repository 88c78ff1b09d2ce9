//! Both ends of the example protocol on loopback (127.0.0.1 and ::1), with
//! the UDP GSO/GRO, burst, large-payload and IPv6 extension-header options:
//! the two logs must agree datagram by datagram. No timing is asserted.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PLAIN: &str = env!("CARGO_BIN_EXE_xlap-example-plain");
const USDT: &str = env!("CARGO_BIN_EXE_xlap-example");
const V4: &str = "127.0.0.1";
const V6: &str = "::1";

/// A fresh directory per test for logs and the ready file.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prrt-lite-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A port the kernel just handed out, free again.
fn free_port(ip: IpAddr) -> u16 {
    UdpSocket::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills a child left running by a failed assertion.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

struct Logs {
    sender: Vec<Value>,
    receiver: Vec<Value>,
}

/// Runs a receiver expecting `count` data packets and a sender of them on
/// `ip`; returns both logs once both ended successfully.
fn run_pair(
    name: &str,
    program: &str,
    ip: &str,
    count: u32,
    send_args: &[&str],
    recv_args: &[&str],
) -> Logs {
    let dir = scratch(name);
    let ip: IpAddr = ip.parse().unwrap();
    let (ready, rlog, slog) = (
        dir.join("ready"),
        dir.join("receiver.jsonl"),
        dir.join("sender.jsonl"),
    );
    // A free port can be taken by a test running beside this one between
    // our look and the receiver's bind: then the receiver ends at once, and
    // another port is tried.
    let mut attempts = 0;
    let (dest, mut receiver) = loop {
        attempts += 1;
        let dest = SocketAddr::new(ip, free_port(ip)).to_string();
        let mut receiver = Running(
            Command::new(program)
                .args(["recv", "--bind", &dest, "--expect", &count.to_string()])
                .args(["--idle-exit-ms", "3000", "--first-packet-timeout-s", "20"])
                .arg("--ready-file")
                .arg(&ready)
                .arg("--log")
                .arg(&rlog)
                .args(recv_args)
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let start = Instant::now();
        let mut ended = false;
        while !ready.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "receiver not ready"
            );
            if receiver.0.try_wait().unwrap().is_some() {
                ended = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if !ended {
            break (dest, receiver);
        }
        assert!(attempts < 3, "receiver ended early {attempts} times");
        receiver.0.wait().unwrap();
    };
    let mut sender = Running(
        Command::new(program)
            .args(["send", "--dest", &dest, "--count", &count.to_string()])
            .args(["--bind", &SocketAddr::new(ip, 0).to_string()])
            .args(["--period-us", "200", "--linger-ms", "50"])
            .arg("--log")
            .arg(&slog)
            .args(send_args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let s = sender.0.wait().unwrap();
    let r = receiver.0.wait().unwrap();
    assert!(s.success(), "sender failed: {s}");
    assert!(r.success(), "receiver failed: {r}");
    let logs = Logs {
        sender: read_jsonl(&slog),
        receiver: read_jsonl(&rlog),
    };
    let _ = std::fs::remove_dir_all(&dir);
    logs
}

fn events<'a>(log: &'a [Value], event: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    log.iter().filter(move |e| e["event"] == event)
}

fn summary(log: &[Value]) -> &Value {
    events(log, "summary").next().expect("a summary line")
}

type Id = (String, u64);

fn id(e: &Value) -> Id {
    (
        e["kind"].as_str().unwrap().to_owned(),
        e["seq"].as_u64().unwrap(),
    )
}

/// The datagrams of each send (`gso_batch`) or receive (`gro_batch`), in log
/// order, checked against the count the lines themselves claim.
fn batches(lines: &[&Value], batch: &str, segments: &str) -> BTreeMap<u64, Vec<Id>> {
    let mut out: BTreeMap<u64, Vec<Id>> = BTreeMap::new();
    for e in lines {
        let b = e[batch]
            .as_u64()
            .unwrap_or_else(|| panic!("no {batch}: {e}"));
        out.entry(b).or_default().push(id(e));
    }
    for (b, ids) in &out {
        for e in lines.iter().filter(|e| e[batch] == *b) {
            assert_eq!(e[segments], ids.len() as u64, "{batch} {b}: {e}");
        }
    }
    out
}

/// Every data packet arrived once, nothing arrived that was not sent, and
/// nothing was malformed or lost.
fn check_complete(logs: &Logs, count: u32) {
    let sent: Vec<Id> = events(&logs.sender, "sent").map(id).collect();
    let received: Vec<Id> = events(&logs.receiver, "received").map(id).collect();
    let mut once = HashMap::new();
    for r in &received {
        *once.entry(r.clone()).or_insert(0) += 1;
        assert!(sent.contains(r), "received {r:?} was never sent");
    }
    assert!(once.values().all(|&n| n == 1), "a datagram arrived twice");
    for seq in 0..count as u64 {
        assert!(
            once.contains_key(&("data".to_owned(), seq)),
            "data {seq} not received"
        );
    }
    let r = summary(&logs.receiver);
    assert_eq!(r["received_data"], count, "{r}");
    assert_eq!(r["malformed"], 0, "{r}");
    assert_eq!(r["lost"], 0, "{r}");
    assert_eq!(r["delivered"], count, "{r}");
    assert_eq!(events(&logs.sender, "send_error").count(), 0);
}

/// How a GRO receiver gets GSO sends on loopback.
#[derive(PartialEq)]
enum Arrival {
    /// Each send as one receive: the receives are exactly the sends.
    Whole,
    /// The kernel may segment the sends on the way (Linux 6.18 does on
    /// loopback for IPv6 with an extension header: one datagram per
    /// receive): each receive lies within one send, in order.
    WithinSends,
}

/// GSO sends and GRO receives agree: every send is whole, of one segment
/// size and at most `gso` datagrams, and the receives are as `arrival` says.
fn check_gso_gro(logs: &Logs, gso: u64, payload: u64, arrival: Arrival) {
    let sent: Vec<&Value> = events(&logs.sender, "sent").collect();
    let sends = batches(&sent, "gso_batch", "gso_segments");
    for e in &sent {
        let len = match e["kind"].as_str().unwrap() {
            "data" => 24 + payload,
            _ => 24 + 8 + payload,
        };
        assert_eq!(e["gso_size"], len, "{e}");
    }
    assert!(sends.values().all(|ids| ids.len() as u64 <= gso));
    assert!(
        sends.values().any(|ids| ids.len() > 1),
        "no send carried several datagrams"
    );
    // Batch indices count the sends from 0 without gaps.
    assert!(sends.keys().copied().eq(0..sends.len() as u64));

    let received: Vec<&Value> = events(&logs.receiver, "received").collect();
    let receives = batches(&received, "gro_batch", "gro_segments");
    if arrival == Arrival::WithinSends {
        for ids in receives.values() {
            assert!(
                sends
                    .values()
                    .any(|s| s.windows(ids.len()).any(|w| w == &ids[..])),
                "receive {ids:?} is not within one send"
            );
        }
        return;
    }
    assert!(
        receives.values().any(|ids| ids.len() > 1),
        "GRO coalesced nothing"
    );
    let whole_sends: Vec<&Vec<Id>> = sends.values().collect();
    for ids in receives.values() {
        assert!(
            whole_sends.contains(&ids),
            "receive {ids:?} is not one of the sends"
        );
    }
}

#[test]
fn gso_sends_arrive_as_gro_receives_datagram_by_datagram() {
    for (ip, program) in [(V4, PLAIN), (V6, USDT)] {
        let count = 64;
        let logs = run_pair(
            &format!("gso-{ip}"),
            program,
            ip,
            count,
            &["--gso", "4"],
            &["--udp-gro"],
        );
        check_complete(&logs, count);
        check_gso_gro(&logs, 4, 200, Arrival::Whole);
    }
}

#[test]
fn gso_with_fec_blocks_across_sends_and_a_partial_last_burst() {
    // k = 3 and bursts of 4: parity packets fall inside bursts, and 30 data
    // packets end in a burst of two.
    let count = 30;
    let logs = run_pair(
        "gso-k3",
        PLAIN,
        V4,
        count,
        &["--gso", "4", "--fec-k", "3", "--payload", "100"],
        &["--udp-gro"],
    );
    check_complete(&logs, count);
    check_gso_gro(&logs, 4, 100, Arrival::Whole);
    // No send mixes data and parity (their lengths differ).
    let sent: Vec<&Value> = events(&logs.sender, "sent").collect();
    for ids in batches(&sent, "gso_batch", "gso_segments").values() {
        assert!(ids.iter().all(|(kind, _)| *kind == ids[0].0), "{ids:?}");
    }
}

#[test]
fn gso_sends_are_split_for_a_receiver_without_gro() {
    let count = 40;
    let logs = run_pair("gso-nogro", PLAIN, V6, count, &["--gso", "8"], &[]);
    check_complete(&logs, count);
    assert!(events(&logs.receiver, "received").all(|e| e.get("gro_segments").is_none()));
}

#[test]
fn bursts_arrive_whole_with_or_without_gro() {
    let count = 48;
    let logs = run_pair("burst", PLAIN, V4, count, &["--burst", "8"], &[]);
    check_complete(&logs, count);
    assert!(events(&logs.sender, "sent").all(|e| e.get("gso_batch").is_none()));

    let logs = run_pair(
        "burst-gro",
        PLAIN,
        V6,
        count,
        &["--burst", "8"],
        &["--udp-gro"],
    );
    check_complete(&logs, count);
    let received: Vec<&Value> = events(&logs.receiver, "received").collect();
    // Separate sends: each receive is whole and self-consistent.
    batches(&received, "gro_batch", "gro_segments");
}

#[test]
fn large_payloads_travel_over_both_families() {
    for ip in [V4, V6] {
        let count = 12;
        let logs = run_pair(
            &format!("large-{ip}"),
            PLAIN,
            ip,
            count,
            &["--payload", "20000"],
            &[],
        );
        check_complete(&logs, count);

        // Three 20 024-byte datagrams fit one 65 000-byte GSO send; a fourth
        // does not.
        let logs = run_pair(
            &format!("large-gso-{ip}"),
            PLAIN,
            ip,
            count,
            &["--payload", "20000", "--gso", "4"],
            &["--udp-gro"],
        );
        check_complete(&logs, count);
        check_gso_gro(&logs, 3, 20000, Arrival::Whole);
    }
}

#[test]
fn the_largest_payload_travels() {
    let count = 8;
    let logs = run_pair("max", PLAIN, V6, count, &["--payload", "64976"], &[]);
    check_complete(&logs, count);
}

#[test]
fn default_logs_carry_no_new_fields() {
    let count = 16;
    let logs = run_pair("default", PLAIN, V4, count, &[], &[]);
    check_complete(&logs, count);
    for e in events(&logs.sender, "sent") {
        let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["dropped", "event", "kind", "seq", "t_ns", "t_start_ns"],
            "{e}"
        );
    }
    for e in events(&logs.receiver, "received") {
        let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["event", "from", "kind", "seq", "t_ns"], "{e}");
    }
}

#[test]
fn artificial_drops_stay_out_of_gso_sends() {
    let count = 64;
    let dir = scratch("drop-gso");
    let ip: IpAddr = V4.parse().unwrap();
    // No receiver needed: the sender's log alone says what it sent.
    let dest = SocketAddr::new(ip, free_port(ip)).to_string();
    let log = dir.join("sender.jsonl");
    let status = Command::new(PLAIN)
        .args(["send", "--dest", &dest, "--bind", "127.0.0.1:0"])
        .args(["--count", &count.to_string(), "--period-us", "50"])
        .args(["--drop", "0.3", "--gso", "4", "--linger-ms", "0"])
        .arg("--log")
        .arg(&log)
        .status()
        .unwrap();
    assert!(status.success());
    let log = read_jsonl(&log);
    let sent: Vec<&Value> = events(&log, "sent").collect();
    let (dropped, passed): (Vec<&Value>, Vec<&Value>) =
        sent.iter().partition(|e| e["dropped"] == true);
    assert!(!dropped.is_empty());
    assert!(dropped.iter().all(|e| e.get("gso_batch").is_none()));
    batches(&passed, "gso_batch", "gso_segments");
    let s = summary(&log);
    assert_eq!(s["dropped"], dropped.len() as u64);
    assert_eq!(s["sent"], passed.len() as u64);
}

/// Setting a sticky extension header takes CAP_NET_RAW.
fn can_set_extension_headers() -> bool {
    let socket = UdpSocket::bind("[::1]:0").unwrap();
    prrt_lite::udp::set_ipv6_extension(&socket, prrt_lite::udp::Ipv6Ext::Dst).is_ok()
}

#[test]
fn ipv6_extension_headers_do_not_disturb_the_protocol() {
    if !can_set_extension_headers() {
        return eprintln!("skipped: no CAP_NET_RAW for IPV6_DSTOPTS");
    }
    for ext in ["hbh", "dst"] {
        let count = 16;
        let logs = run_pair(
            &format!("ext-{ext}"),
            PLAIN,
            V6,
            count,
            &["--ipv6-ext", ext, "--gso", "4"],
            &["--udp-gro"],
        );
        check_complete(&logs, count);
        check_gso_gro(&logs, 4, 200, Arrival::WithinSends);
    }
}

#[test]
fn an_extension_header_for_an_ipv4_destination_is_a_usage_error() {
    for program in [PLAIN, USDT] {
        let out = Command::new(program)
            .args(["send", "--dest", "127.0.0.1:9", "--ipv6-ext", "hbh"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("needs an IPv6 --dest"), "{stderr}");
    }
}

#[test]
fn both_binaries_offer_the_new_options() {
    for program in [PLAIN, USDT] {
        let help = |role: &str| {
            let out = Command::new(program)
                .args([role, "--help"])
                .output()
                .unwrap();
            assert!(out.status.success());
            String::from_utf8(out.stdout).unwrap()
        };
        let send = help("send");
        for flag in ["--gso <N>", "--burst <N>", "--ipv6-ext <KIND>", "--payload"] {
            assert!(send.contains(flag), "{program}: {flag} missing");
        }
        assert!(help("recv").contains("--udp-gro"), "{program}");
    }
}

#[test]
fn every_receive_mode_delivers_everything_once() {
    let count = 48;
    for (name, mode, ip) in [
        ("recv-peek", "peek", V4),
        ("recv-iov", "iov-split:2", V6),
        ("recv-iov-long-head", "iov-split:100", V4),
        ("recv-mmsg", "recvmmsg:16", V6),
    ] {
        let logs = run_pair(
            name,
            PLAIN,
            ip,
            count,
            &["--burst", "8"],
            &["--recv-mode", mode],
        );
        check_complete(&logs, count);
        let received: Vec<&Value> = events(&logs.receiver, "received").collect();
        // Each call's lines agree on how many datagrams it returned.
        batches(&received, "recv_call", "recv_datagrams");
    }
}

#[test]
fn bad_receive_modes_are_refused() {
    for mode in ["recvmmsg", "recvmmsg:0", "iov-split:x", "select"] {
        let out = Command::new(PLAIN)
            .args(["recv", "--bind", "127.0.0.1:9", "--recv-mode", mode])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{mode}");
    }
}
