//! Privileged: the conformance matrix (issue 29, item 8). Programs we did
//! not write (iperf3, sockperf) and programs written the way others write
//! them (Go's `net.UDPConn`, tokio, C on `sendmmsg`/`recvmmsg`, a client
//! whose socket exists unbound before tracing starts, Python asyncio),
//! traced on the two-host stage and each checked against its own account
//! (its log, its report), never against the tool's own counts:
//!
//! - **record**: the program ran, and `xlap-trace record` exited 0;
//! - **a**: every datagram the program says it received carries every core
//!   point of the veth path (docs/stamp-points.md: real paths): the
//!   sender's `sock.send_enter`/`send_exit`, `dev.queue`/`start_xmit`/
//!   `xmit`, the receiver's `dev.netif_rx`/`receive_skb`, `sock.queue`,
//!   `sock.recv_exit` (those the run says it could take on this kernel), or
//!   the run counted a loss at that point in run.json;
//! - **b**: `xlap-trace analyze RUN`'s packet count (the summary's `run`
//!   row, of the program's kind, or without `--kind` for a kind-less
//!   layout) equals the datagrams the program says it sent;
//! - **c**: `xlap-trace report RUN` renders an HTML file with its plots;
//! - **d**: `record` wrote `summary.json`, with an end-to-end entry for
//!   each of the program's kinds;
//! - **e**: `xlap-trace compare` of two unchanged runs finds no regression
//!   (exit 0).
//!
//! Each program runs twice (a, b and d are checked on both runs, c on the
//! first). The test prints the matrix as Markdown (program × check, the
//! failures below it with expected and got), writes it to
//! `target/conformance.md`, and fails if any cell failed. `just
//! conformance` runs it; `XLAP_CONFORMANCE=go,iperf3` runs some rows.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use xlap_records::run_meta::RunMeta;
use xlap_stage::{Host, Stage};
use xlap_tests::trace::{read_stamps, run_meta, traced, Recorder, Row};
use xlap_tests::{bin, privileged, target_dir, Scratch};

/// The points every datagram carries on the stage's veth path, by side
/// (docs/stamp-points.md: "Real paths", veth row).
const TX_POINTS: [&str; 5] = [
    "sock.send_enter",
    "sock.send_exit",
    "dev.queue",
    "dev.start_xmit",
    "dev.xmit",
];
const RX_POINTS: [&str; 4] = [
    "dev.netif_rx",
    "dev.receive_skb",
    "sock.queue",
    "sock.recv_exit",
];

/// Ports of this test (no other test uses 48xxx).
const IPERF3_PORT: u16 = 48201;
const IPERF3_64_PORT: u16 = 48202;
const SOCKPERF_PP_PORT: u16 = 48301;
const SOCKPERF_TP_PORT: u16 = 48302;
const GO_PORTS: (u16, u16) = (48401, 48402);
const TOKIO_PORTS: (u16, u16) = (48501, 48502);
const MMSG_PORT: u16 = 48601;
const PRESOCKET_PORT: u16 = 48602;
const ASYNCIO_PORT: u16 = 48701;

/// sockperf's message flags (its header: seq u64 at 0, flags u16 at 8),
/// the `sockperf` preset's kind: a ping-pong request (client | pong
/// request), its reply (pong request), a throughput message (client).
const SOCKPERF_PING: u32 = 3;
const SOCKPERF_PONG: u32 = 2;
const SOCKPERF_TP: u32 = 1;

// ---------------------------------------------------------------------------
// What a program says it did.

/// A program's own account of one side of its datagrams.
#[derive(Clone, Debug)]
enum Account {
    /// The sequence numbers it names, one per datagram (its log).
    Seqs(BTreeSet<u64>),
    /// How many, without which (a report's count).
    Count(u64),
}

impl Account {
    fn len(&self) -> u64 {
        match self {
            Account::Seqs(s) => s.len() as u64,
            Account::Count(n) => *n,
        }
    }
}

/// One direction of a program's datagrams, by its own account.
#[derive(Clone, Debug)]
struct Direction {
    what: &'static str,
    tx_pid: u32,
    rx_pid: u32,
    /// The kind its datagrams carry in the layout; `None` for a kind-less
    /// layout (no `--kind-*`).
    kind: Option<u32>,
    /// What the sender says it sent, and from which account.
    sent: Account,
    sent_from: &'static str,
    /// What the receiver says it received, and from which account.
    received: Account,
    received_from: &'static str,
}

/// One traced run of a program.
struct Run {
    dir: PathBuf,
    /// `record`'s exit: its status and the end of its stderr when it failed.
    record: Result<(), String>,
    /// What `record` said on stderr (its warnings name what it could not
    /// write).
    record_stderr: String,
    directions: Vec<Direction>,
}

/// A row of the matrix.
struct Program {
    name: &'static str,
    /// How it is traced: `record`'s layout options.
    layout: &'static [&'static str],
    /// Starts it, traces it into `work/run` and returns its account.
    run: fn(&Stage, &Path, &[&str]) -> Result<Run, String>,
}

// ---------------------------------------------------------------------------
// Processes.

/// A program the test started: killed if the test leaves early, its output
/// collected on threads (a full pipe never blocks it).
struct Proc {
    child: Child,
    name: String,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<String>> {
    pipe.map(|mut p| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = p.read_to_string(&mut s);
            s
        })
    })
}

impl Proc {
    fn spawn(name: &str, cmd: &mut Command) -> Result<Proc, String> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{name} does not start: {e}"))?;
        let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
        Ok(Proc {
            child,
            name: name.to_string(),
            out,
            err,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGINT, as a user's Ctrl-C (sockperf's server prints its totals).
    fn interrupt(&self) {
        // SAFETY: a signal to a process this test started.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
    }

    /// Waits up to `secs` for it to exit 0; its stdout.
    fn wait(mut self, secs: u64) -> Result<String, String> {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                break Some(status);
            }
            if start.elapsed() > Duration::from_secs(secs) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = self
            .out
            .take()
            .map(|h| h.join().unwrap())
            .unwrap_or_default();
        let err = self
            .err
            .take()
            .map(|h| h.join().unwrap())
            .unwrap_or_default();
        match status {
            Some(s) if s.success() => Ok(out),
            Some(s) => Err(format!("{} failed ({s}): {}", self.name, tail(&err, 5))),
            None => Err(format!(
                "{} did not end within {secs} s (killed): {}",
                self.name,
                tail(&err, 5)
            )),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" / ")
}

/// A third-party program on `host` that waits for `start` to exist, then
/// execs `cmdline` (same pid: traced from before its first datagram).
fn gated(host: &Host, name: &str, start: &Path, cmdline: &str) -> Result<Proc, String> {
    Proc::spawn(
        name,
        host.command("sh").arg("-c").arg(format!(
            "while [ ! -e {} ]; do sleep 0.01; done; exec {cmdline}",
            start.display()
        )),
    )
}

/// Waits until `pid` holds a socket on `port` (`proto`: udp or tcp).
fn wait_bound(pid: u32, port: u16, proto: &str) -> Result<(), String> {
    let needle = format!(":{port:04X} ");
    for _ in 0..500 {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/{proto}")).unwrap_or_default();
        if table.lines().skip(1).any(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|local| format!("{local} ").ends_with(&needle))
        }) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!(
        "pid {pid} did not bind {proto} port {port} within 5 s"
    ))
}

fn wait_file(path: &Path, what: &str) -> Result<(), String> {
    for _ in 0..2000 {
        if path.exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!(
        "{what}: {} did not appear within 20 s",
        path.display()
    ))
}

fn touch(path: &Path) {
    std::fs::write(path, "go\n").expect("start file");
}

/// Starts `record` for `pids` into `work/run` (ready: every probe attached).
fn record(work: &Path, pids: &[u32], layout: &[&str]) -> Recorder {
    Recorder::start(pids, &work.join("run"), layout)
}

/// Waits for `record` to end on its own (its targets exited; SIGINT after
/// 60 s).
fn finish(mut rec: Recorder) -> (Result<(), String>, String) {
    let start = Instant::now();
    while let Ok(None) = rec.child.try_wait() {
        if start.elapsed() > Duration::from_secs(60) {
            rec.interrupt();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = rec.child.wait_with_output().expect("wait xlap-trace");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let status = if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "xlap-trace record exited {}: {}",
            out.status,
            tail(&stderr, 3)
        ))
    };
    (status, stderr)
}

/// The "EVENT SEQ" lines of a program's log, by event.
fn log_events(path: &Path) -> Result<BTreeMap<String, Vec<u64>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in text.lines() {
        let (event, seq) = line
            .split_once(' ')
            .ok_or_else(|| format!("{}: bad line {line:?}", path.display()))?;
        let seq = seq
            .trim()
            .parse()
            .map_err(|_| format!("{}: bad line {line:?}", path.display()))?;
        out.entry(event.to_string()).or_default().push(seq);
    }
    Ok(out)
}

fn seqs(events: &BTreeMap<String, Vec<u64>>, event: &str) -> Account {
    Account::Seqs(
        events
            .get(event)
            .map(|v| v.iter().copied().collect())
            .unwrap_or_default(),
    )
}

// ---------------------------------------------------------------------------
// The programs.

/// iperf3 -u between the hosts (`--udp-counters-64bit` for the 64-bit
/// preset), against its `--json` report: the client's packets sent
/// (numbered 1..=N by its counter) and the server's own count of what it
/// received (`--get-server-output`: packets − lost).
fn iperf3(stage: &Stage, work: &Path, layout: &[&str], bits64: bool) -> Result<Run, String> {
    let (a, b) = (stage.host(0), stage.host(1));
    let port = if bits64 { IPERF3_64_PORT } else { IPERF3_PORT };
    let server = Proc::spawn(
        "iperf3 -s",
        b.command("iperf3")
            .args(["-s", "-1", "-J", "-p", &port.to_string()])
            .args(["-B", &b.ipv4.to_string()]),
    )?;
    wait_bound(server.pid(), port, "tcp")?;
    let start = work.join("start");
    let counters = if bits64 { " --udp-counters-64bit" } else { "" };
    let client = gated(
        a,
        "iperf3 -c",
        &start,
        &format!(
            "iperf3 -c {} -p {port} -u -b 4M -l 200 -t 1 --json --get-server-output{counters}",
            b.ipv4
        ),
    )?;
    let (client_pid, server_pid) = (client.pid(), server.pid());
    let rec = record(work, &[client_pid, server_pid], layout);
    touch(&start);
    let report = client.wait(30)?;
    server.wait(10)?;
    let (record, record_stderr) = finish(rec);
    let report: Value =
        serde_json::from_str(&report).map_err(|e| format!("iperf3's --json report: {e}"))?;
    let sent = report["end"]["sum_sent"]["packets"]
        .as_u64()
        .ok_or_else(|| format!("no end.sum_sent.packets in {}", report["end"]))?;
    let server_end = &report["server_output_json"]["end"]["sum_received"];
    let (packets, lost) = (
        server_end["packets"].as_i64(),
        server_end["lost_packets"].as_i64(),
    );
    let (Some(packets), Some(lost)) = (packets, lost) else {
        return Err(format!("no server sum_received in {server_end}"));
    };
    Ok(Run {
        dir: work.join("run"),
        record,
        record_stderr,
        directions: vec![Direction {
            what: "client → server",
            tx_pid: client_pid,
            rx_pid: server_pid,
            kind: None,
            sent: Account::Seqs((1..=sent).collect()),
            sent_from: "the client's report (end.sum_sent.packets)",
            received: Account::Count((packets - lost).max(0) as u64),
            received_from: "the server's report (sum_received: packets − lost)",
        }],
    })
}

fn iperf3_32(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    iperf3(stage, work, layout, false)
}

fn iperf3_64(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    iperf3(stage, work, layout, true)
}

/// The number after `key` in sockperf's output (`SentMessages=N`,
/// `Total of N`, `Total N messages received`).
fn sockperf_number(output: &str, line_has: &str, key: &str) -> Result<u64, String> {
    output
        .lines()
        .filter(|l| l.contains(line_has))
        .find_map(|l| {
            let rest = l.split(key).nth(1)?;
            let digits: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            digits.parse().ok()
        })
        .ok_or_else(|| format!("no '{key}N' in sockperf's output: {}", tail(output, 8)))
}

/// A sockperf server on host b, bound, its pid.
fn sockperf_server(b: &Host, port: u16) -> Result<Proc, String> {
    let server = Proc::spawn(
        "sockperf sr",
        b.command("sockperf")
            .args(["sr", "-i", &b.ipv4.to_string(), "-p", &port.to_string()]),
    )?;
    wait_bound(server.pid(), port, "udp")?;
    Ok(server)
}

/// sockperf ping-pong, against the client's `[Total Run]` line
/// (SentMessages, ReceivedMessages) and the server's "Total N messages
/// received and handled" (each one answered).
fn sockperf_pp(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    let (a, b) = (stage.host(0), stage.host(1));
    let server = sockperf_server(b, SOCKPERF_PP_PORT)?;
    let start = work.join("start");
    let client = gated(
        a,
        "sockperf pp",
        &start,
        &format!(
            "sockperf pp -i {} -p {SOCKPERF_PP_PORT} -t 1 --mps 1000 -m 64",
            b.ipv4
        ),
    )?;
    let (client_pid, server_pid) = (client.pid(), server.pid());
    let rec = record(work, &[client_pid, server_pid], layout);
    touch(&start);
    let client_out = client.wait(30)?;
    std::thread::sleep(Duration::from_millis(200));
    server.interrupt();
    let server_out = server.wait(10)?;
    let (record, record_stderr) = finish(rec);
    let sent = sockperf_number(&client_out, "[Total Run]", "SentMessages=")?;
    let echoed = sockperf_number(&client_out, "[Total Run]", "ReceivedMessages=")?;
    let handled = sockperf_number(&server_out, "received and handled", "Total ")?;
    Ok(Run {
        dir: work.join("run"),
        record,
        record_stderr,
        directions: vec![
            Direction {
                what: "ping (client → server)",
                tx_pid: client_pid,
                rx_pid: server_pid,
                kind: Some(SOCKPERF_PING),
                sent: Account::Count(sent),
                sent_from: "the client's [Total Run] SentMessages",
                received: Account::Count(handled),
                received_from: "the server's 'Total N messages received and handled'",
            },
            Direction {
                what: "pong (server → client)",
                tx_pid: server_pid,
                rx_pid: client_pid,
                kind: Some(SOCKPERF_PONG),
                sent: Account::Count(handled),
                sent_from: "the server's 'Total N messages received and handled' (each answered)",
                received: Account::Count(echoed),
                received_from: "the client's [Total Run] ReceivedMessages",
            },
        ],
    })
}

/// sockperf throughput, against the client's "Total of N messages sent"
/// and the server's "Total N messages received and handled".
fn sockperf_tp(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    let (a, b) = (stage.host(0), stage.host(1));
    let server = sockperf_server(b, SOCKPERF_TP_PORT)?;
    let start = work.join("start");
    let client = gated(
        a,
        "sockperf tp",
        &start,
        &format!(
            "sockperf tp -i {} -p {SOCKPERF_TP_PORT} -t 1 --mps 2000 -m 64",
            b.ipv4
        ),
    )?;
    let (client_pid, server_pid) = (client.pid(), server.pid());
    let rec = record(work, &[client_pid, server_pid], layout);
    touch(&start);
    let client_out = client.wait(30)?;
    std::thread::sleep(Duration::from_millis(200));
    server.interrupt();
    let server_out = server.wait(10)?;
    let (record, record_stderr) = finish(rec);
    let sent = sockperf_number(&client_out, "Total of", "Total of ")?;
    let handled = sockperf_number(&server_out, "received and handled", "Total ")?;
    Ok(Run {
        dir: work.join("run"),
        record,
        record_stderr,
        directions: vec![Direction {
            what: "client → server",
            tx_pid: client_pid,
            rx_pid: server_pid,
            kind: Some(SOCKPERF_TP),
            sent: Account::Count(sent),
            sent_from: "the client's 'Total of N messages sent'",
            received: Account::Count(handled),
            received_from: "the server's 'Total N messages received and handled'",
        }],
    })
}

/// A Go sender and receiver on `net.UDPConn` (tests/go/udpconn), built
/// now with the system's Go, against their logs.
fn go_udpconn(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    static EXE: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let exe = EXE
        .get_or_init(|| {
            let dir = target_dir().join("conformance-go");
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            xlap_tests::go_programs::build("udpconn", &dir.join("udpconn"))
        })
        .clone()?;
    let (a, b) = (stage.host(0), stage.host(1));
    let (rlog, slog) = (work.join("recv.log"), work.join("send.log"));
    let (rready, sready, start) = (
        work.join("recv.ready"),
        work.join("send.ready"),
        work.join("start"),
    );
    let dest = format!("{}:{}", b.ipv4, GO_PORTS.0);
    let receiver = Proc::spawn(
        "udpconn recv",
        b.command(&exe)
            .args(["recv", &dest, "1000"])
            .arg(&rlog)
            .arg(&rready),
    )?;
    wait_file(&rready, "the Go receiver")?;
    let sender = Proc::spawn(
        "udpconn send",
        a.command(&exe)
            .args(["send", &format!("{}:{}", a.ipv4, GO_PORTS.1), &dest])
            .args(["1000", "500"])
            .arg(&slog)
            .arg(&sready)
            .arg(&start),
    )?;
    wait_file(&sready, "the Go sender")?;
    let pids = (sender.pid(), receiver.pid());
    let rec = record(work, &[pids.0, pids.1], layout);
    touch(&start);
    sender.wait(60)?;
    receiver.wait(60)?;
    let (record, record_stderr) = finish(rec);
    let (sent, received) = (log_events(&slog)?, log_events(&rlog)?);
    Ok(Run {
        dir: work.join("run"),
        record,
        record_stderr,
        directions: vec![Direction {
            what: "sender → receiver",
            tx_pid: pids.0,
            rx_pid: pids.1,
            kind: None,
            sent: seqs(&sent, "sent"),
            sent_from: "the sender's log",
            received: seqs(&received, "received"),
            received_from: "the receiver's log",
        }],
    })
}

/// examples/tokio-echo (tokio's multi-threaded runtime, reads on workers
/// waiting in epoll), with its layout given as explicit options, against
/// both ends' logs. The server gives up 3 s after its last datagram, so it
/// starts (same pid, exec'd) once tracing has started; the client's socket
/// exists before.
fn tokio_echo(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    let (a, b) = (stage.host(0), stage.host(1));
    let echo = bin("xlap-tokio-echo");
    let (ready, server_start, start) = (
        work.join("ready"),
        work.join("server-start"),
        work.join("start"),
    );
    let (slog, clog) = (work.join("server.jsonl"), work.join("client.jsonl"));
    let server_addr = format!("{}:{}", b.ipv4, TOKIO_PORTS.0);
    let server = gated(
        b,
        "tokio-echo server",
        &server_start,
        &format!(
            "{} server {server_addr} 500 {} {}",
            echo.display(),
            slog.display(),
            ready.display()
        ),
    )?;
    let client = Proc::spawn(
        "tokio-echo client",
        a.command(&echo)
            .args(["client", &format!("{}:{}", a.ipv4, TOKIO_PORTS.1)])
            .args([&server_addr, "500", "200"])
            .arg(&clog)
            .arg(&start),
    )?;
    wait_bound(client.pid(), TOKIO_PORTS.1, "udp")?;
    let pids = (client.pid(), server.pid());
    let rec = record(work, &[pids.0, pids.1], layout);
    touch(&server_start);
    wait_file(&ready, "the tokio server")?;
    touch(&start);
    client.wait(60)?;
    server.wait(60)?;
    let (record, record_stderr) = finish(rec);
    let events = |log: &Path, event: &str| -> Account {
        Account::Seqs(
            xlap_tests::read_jsonl(log)
                .iter()
                .filter(|e| e["event"] == event)
                .filter_map(|e| e["seq"].as_u64())
                .collect(),
        )
    };
    let received = events(&slog, "received");
    Ok(Run {
        dir: work.join("run"),
        record,
        record_stderr,
        directions: vec![
            Direction {
                what: "client → server",
                tx_pid: pids.0,
                rx_pid: pids.1,
                kind: Some(1),
                sent: events(&clog, "sent"),
                sent_from: "the client's log (sent)",
                received: received.clone(),
                received_from: "the server's log (received)",
            },
            Direction {
                what: "echo (server → client)",
                tx_pid: pids.1,
                rx_pid: pids.0,
                kind: Some(1),
                sent: received,
                sent_from: "the server's log (received, each echoed)",
                received: events(&clog, "echoed"),
                received_from: "the client's log (echoed)",
            },
        ],
    })
}

/// tests/c/mmsg_peer on host a and b: the receiver echoes; `unbound`: the
/// client's socket exists, with no port, before tracing starts, and sends
/// one datagram per sendto later; else bursts of 8 per sendmmsg, read with
/// recvmmsg at both ends.
fn mmsg(stage: &Stage, work: &Path, layout: &[&str], unbound: bool) -> Result<Run, String> {
    let exe = xlap_tests::c_programs::mmsg_peer(&work.join("mmsg_peer"));
    let (a, b) = (stage.host(0), stage.host(1));
    let (port, count, burst, period) = if unbound {
        (PRESOCKET_PORT, "300", "1", "1000")
    } else {
        (MMSG_PORT, "1000", "8", "1000")
    };
    let (rlog, slog) = (work.join("recv.log"), work.join("send.log"));
    let (rready, sready, start) = (
        work.join("recv.ready"),
        work.join("send.ready"),
        work.join("start"),
    );
    let receiver = Proc::spawn(
        "mmsg_peer recv",
        b.command(&exe)
            .args(["recv", &b.ipv4.to_string(), &port.to_string(), count])
            .arg(&rlog)
            .arg(&rready)
            .arg("echo"),
    )?;
    wait_file(&rready, "the C receiver")?;
    let mut send = a.command(&exe);
    send.args(["send", &b.ipv4.to_string(), &port.to_string(), count])
        .args([burst, period])
        .arg(&slog)
        .arg(&sready)
        .arg(&start)
        .arg("echo");
    if unbound {
        send.arg("unbound");
    }
    let sender = Proc::spawn("mmsg_peer send", &mut send)?;
    // Its socket exists (unbound: with no port) before tracing starts.
    wait_file(&sready, "the C sender")?;
    let pids = (sender.pid(), receiver.pid());
    let rec = record(work, &[pids.0, pids.1], layout);
    touch(&start);
    sender.wait(60)?;
    receiver.wait(60)?;
    let (record, record_stderr) = finish(rec);
    let (sent, received) = (log_events(&slog)?, log_events(&rlog)?);
    let kind = (!unbound).then_some(7);
    Ok(Run {
        dir: work.join("run"),
        record,
        record_stderr,
        directions: vec![
            Direction {
                what: "client → server",
                tx_pid: pids.0,
                rx_pid: pids.1,
                kind,
                sent: seqs(&sent, "sent"),
                sent_from: "the client's log (sent)",
                received: seqs(&received, "received"),
                received_from: "the server's log (received)",
            },
            Direction {
                what: "echo (server → client)",
                tx_pid: pids.1,
                rx_pid: pids.0,
                kind,
                sent: seqs(&received, "echoed"),
                sent_from: "the server's log (echoed)",
                received: seqs(&sent, "echoed"),
                received_from: "the client's log (echoed)",
            },
        ],
    })
}

fn c_mmsg(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    mmsg(stage, work, layout, false)
}

fn c_presocket(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    mmsg(stage, work, layout, true)
}

/// A Python asyncio sender and receiver (tests/python/asyncio_pair.py),
/// against their logs.
fn python_asyncio(stage: &Stage, work: &Path, layout: &[&str]) -> Result<Run, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/asyncio_pair.py");
    // Debian's (what ./run.sh setup installs), else the first on PATH.
    let python = if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let (a, b) = (stage.host(0), stage.host(1));
    let (rlog, slog) = (work.join("recv.log"), work.join("send.log"));
    let (rready, sready, start) = (
        work.join("recv.ready"),
        work.join("send.ready"),
        work.join("start"),
    );
    let port = ASYNCIO_PORT.to_string();
    let receiver = Proc::spawn(
        "asyncio recv",
        b.command(python)
            .arg(&script)
            .args(["recv", &b.ipv4.to_string(), &port, "1000"])
            .arg(&rlog)
            .arg(&rready),
    )?;
    wait_file(&rready, "the asyncio receiver")?;
    let sender = Proc::spawn(
        "asyncio send",
        a.command(python)
            .arg(&script)
            .args(["send", &b.ipv4.to_string(), &port, "1000", "500"])
            .arg(&slog)
            .arg(&sready)
            .arg(&start),
    )?;
    wait_file(&sready, "the asyncio sender")?;
    let pids = (sender.pid(), receiver.pid());
    let rec = record(work, &[pids.0, pids.1], layout);
    touch(&start);
    sender.wait(60)?;
    receiver.wait(60)?;
    let (record, record_stderr) = finish(rec);
    let (sent, received) = (log_events(&slog)?, log_events(&rlog)?);
    Ok(Run {
        dir: work.join("run"),
        record,
        record_stderr,
        directions: vec![Direction {
            what: "sender → receiver",
            tx_pid: pids.0,
            rx_pid: pids.1,
            kind: Some(5),
            sent: seqs(&sent, "sent"),
            sent_from: "the sender's log",
            received: seqs(&received, "received"),
            received_from: "the receiver's log",
        }],
    })
}

/// The rows of the matrix. Layouts: the presets for the programs we did
/// not write; for ours, explicit options, some without any kind field.
fn programs() -> Vec<Program> {
    vec![
        Program {
            name: "iperf3 -u (32-bit counters)",
            layout: &["--proto", "iperf3"],
            run: iperf3_32,
        },
        Program {
            name: "iperf3 -u --udp-counters-64bit",
            layout: &["--proto", "iperf3-64"],
            run: iperf3_64,
        },
        Program {
            name: "sockperf ping-pong",
            layout: &["--proto", "sockperf"],
            run: sockperf_pp,
        },
        Program {
            name: "sockperf throughput",
            layout: &["--proto", "sockperf"],
            run: sockperf_tp,
        },
        Program {
            name: "Go net.UDPConn (kind-less)",
            layout: &[
                "--seq-offset",
                "4",
                "--seq-size",
                "4",
                "--seq-endian",
                "little",
            ],
            run: go_udpconn,
        },
        Program {
            name: "tokio echo",
            layout: &[
                "--seq-offset",
                "4",
                "--seq-size",
                "4",
                "--seq-endian",
                "big",
                "--kind-offset",
                "0",
                "--kind-size",
                "1",
            ],
            run: tokio_echo,
        },
        Program {
            name: "C sendmmsg/recvmmsg echo",
            layout: &[
                "--seq-offset",
                "8",
                "--seq-size",
                "8",
                "--seq-endian",
                "little",
                "--kind-offset",
                "0",
                "--kind-size",
                "1",
            ],
            run: c_mmsg,
        },
        Program {
            name: "C client, socket unbound before tracing (kind-less)",
            layout: &[
                "--seq-offset",
                "8",
                "--seq-size",
                "8",
                "--seq-endian",
                "little",
            ],
            run: c_presocket,
        },
        Program {
            name: "Python asyncio",
            layout: &[
                "--seq-offset",
                "0",
                "--seq-size",
                "4",
                "--seq-endian",
                "big",
                "--kind-offset",
                "4",
                "--kind-size",
                "1",
            ],
            run: python_asyncio,
        },
    ]
}

// ---------------------------------------------------------------------------
// The checks.

/// Losses run.json counts at `point` (every reason).
fn lost_at(meta: &RunMeta, point: &str) -> u64 {
    meta.points
        .get(point)
        .map(|p| {
            p.lost
                .iter()
                .filter(|(k, _)| k.starts_with("lost_"))
                .map(|(_, n)| n)
                .sum()
        })
        .unwrap_or(0)
}

/// `0–9, 15, 20–299`, the first few ranges.
fn ranges(seqs: &BTreeSet<u64>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = seqs.iter().copied().peekable();
    while let Some(first) = iter.next() {
        let mut last = first;
        while iter.peek() == Some(&(last + 1)) {
            last = iter.next().unwrap();
        }
        out.push(if first == last {
            first.to_string()
        } else {
            format!("{first}–{last}")
        });
        if out.len() == 6 {
            if iter.peek().is_some() {
                out.push("…".into());
            }
            break;
        }
    }
    out.join(", ")
}

fn kind_name(kind: Option<u32>) -> String {
    kind.map_or("no kind".into(), |k| format!("kind {k}"))
}

/// The seqs stamped at a point by a process, per kind.
type ByKind = BTreeMap<Option<u32>, BTreeSet<u64>>;

/// (a): every received datagram carries every core point, or run.json
/// counts a loss there.
fn check_points(run: &Run, meta: &RunMeta, rows: &[Row]) -> Vec<String> {
    // (pid, point) -> kind -> seqs
    let mut stamped: HashMap<(u32, &str), ByKind> = HashMap::new();
    for r in rows.iter().filter(|r| !r.fragment) {
        let Some(seq) = r.seq else { continue };
        stamped
            .entry((r.pid, r.point.as_str()))
            .or_default()
            .entry(r.kind)
            .or_default()
            .insert(seq);
    }
    let empty = BTreeSet::new();
    let mut failures = Vec::new();
    for d in &run.directions {
        let sides = TX_POINTS
            .iter()
            .map(|p| (*p, d.tx_pid, "sender"))
            .chain(RX_POINTS.iter().map(|p| (*p, d.rx_pid, "receiver")));
        for (point, pid, side) in sides {
            if traced(meta, &[point]).is_empty() {
                continue;
            }
            let kinds = stamped.get(&(pid, point));
            let got = kinds.and_then(|k| k.get(&d.kind)).unwrap_or(&empty);
            let lost = lost_at(meta, point);
            let (missing, detail) = match (&d.received, &d.sent) {
                (Account::Seqs(want), _) => {
                    let missing: BTreeSet<u64> = want.difference(got).copied().collect();
                    let n = missing.len() as u64;
                    (n, format!("seqs {}", ranges(&missing)))
                }
                (Account::Count(n), sent) => {
                    let have = match sent {
                        Account::Seqs(s) => got.intersection(s).count() as u64,
                        Account::Count(_) => got.len() as u64,
                    };
                    (
                        n.saturating_sub(have),
                        format!("{have} distinct seqs stamped"),
                    )
                }
            };
            if missing > lost {
                let elsewhere: Vec<String> = kinds
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| **k != d.kind)
                    .map(|(k, s)| format!("{} under {}", s.len(), kind_name(*k)))
                    .collect();
                failures.push(format!(
                    "{}, {point} ({side}, pid {pid}, {}): {missing} of {} datagrams received \
                     ({}) not stamped ({detail}); run.json counts {lost} lost there{}",
                    d.what,
                    kind_name(d.kind),
                    d.received.len(),
                    d.received_from,
                    if elsewhere.is_empty() {
                        String::new()
                    } else {
                        format!("; stamped there {}", elsewhere.join(", "))
                    }
                ));
            }
        }
    }
    failures
}

/// (b): the analysis' packet count per kind equals what the program sent.
fn check_analyze(run: &Run) -> Vec<String> {
    let mut expected: BTreeMap<Option<u32>, (u64, Vec<String>)> = BTreeMap::new();
    for d in &run.directions {
        let e = expected.entry(d.kind).or_default();
        e.0 += d.sent.len();
        e.1.push(format!("{} {} by {}", d.sent.len(), d.what, d.sent_from));
    }
    let mut failures = Vec::new();
    for (kind, (want, from)) in expected {
        let mut cmd = Command::new(bin("xlap-trace"));
        cmd.arg("analyze")
            .arg(&run.dir)
            .args(["-q", "summary", "-f", "json", "--quiet"]);
        let flag = kind.map(|k| format!(" --kind {k}")).unwrap_or_default();
        if let Some(k) = kind {
            cmd.args(["--kind", &k.to_string()]);
        }
        let out = cmd.output().expect("xlap-trace analyze");
        if !out.status.success() {
            failures.push(format!(
                "`analyze -q summary{flag}` failed ({}): {}; expected {want} packets",
                out.status,
                tail(&String::from_utf8_lossy(&out.stderr), 3)
            ));
            continue;
        }
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let head = v["summary"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["section"] == "run"));
        let got = head.and_then(|r| r["packets"].as_u64());
        if got != Some(want) {
            failures.push(format!(
                "`analyze -q summary{flag}`: {} packets{}, expected {want} ({})",
                got.map_or("no".to_string(), |n| n.to_string()),
                head.map(|r| format!(" (row {})", r["name"]))
                    .unwrap_or_else(|| " (no `run` row)".into()),
                from.join(" + ")
            ));
        }
    }
    failures
}

/// (c): `report` renders an HTML file with plots.
fn check_report(run: &Run, html: &Path) -> Vec<String> {
    let out = Command::new(bin("xlap-trace"))
        .arg("report")
        .arg(&run.dir)
        .arg("-o")
        .arg(html)
        .output()
        .expect("xlap-trace report");
    if !out.status.success() {
        return vec![format!(
            "`report` failed ({}): {}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 3)
        )];
    }
    match std::fs::read_to_string(html) {
        Ok(text) if text.contains("<svg") && text.trim_end().ends_with("</html>") => Vec::new(),
        Ok(text) => vec![format!(
            "`report` wrote {} bytes without a plot or an end (<svg: {}, </html>: {})",
            text.len(),
            text.contains("<svg"),
            text.trim_end().ends_with("</html>")
        )],
        Err(e) => vec![format!("`report` exited 0 but {}: {e}", html.display())],
    }
}

/// (d): `record` wrote summary.json, with an end-to-end entry per kind.
fn check_summary(run: &Run) -> Vec<String> {
    let path = run.dir.join("summary.json");
    let said = run
        .record_stderr
        .lines()
        .filter(|l| l.contains("summary"))
        .collect::<Vec<_>>()
        .join(" / ");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            return vec![format!(
                "no summary.json ({e}); record said: {}",
                if said.is_empty() { "nothing" } else { &said }
            )]
        }
    };
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return vec![format!("summary.json is not JSON: {e}")],
    };
    let totals: Vec<&Value> = v["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["side"] == "total" && s["packets"].as_u64().unwrap_or(0) > 0)
        .collect();
    let kinds: BTreeSet<Option<u32>> = run.directions.iter().map(|d| d.kind).collect();
    let mut failures = Vec::new();
    for kind in kinds {
        let found = match kind {
            Some(k) => totals.iter().any(|s| s["kind"].as_u64() == Some(k as u64)),
            None => !totals.is_empty(),
        };
        if !found {
            failures.push(format!(
                "summary.json has no end-to-end entry with packets for {} (entries: {})",
                kind_name(kind),
                totals
                    .iter()
                    .map(|s| format!("{} kind {} {} packets", s["stage"], s["kind"], s["packets"]))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    failures
}

/// (e): two unchanged runs compare without a regression.
fn check_compare(first: &Run, second: &Run) -> Vec<String> {
    let out = Command::new(bin("xlap-trace"))
        .arg("compare")
        .arg(&first.dir)
        .arg(&second.dir)
        .arg("--json")
        .output()
        .expect("xlap-trace compare");
    if out.status.success() {
        return Vec::new();
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let regressions: Vec<String> = v["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["verdict"] == "regression")
        .map(|r| {
            format!(
                "{} kind {}: {:.1} → {:.1} µs",
                r["metric"].as_str().unwrap_or("?"),
                r["kind"],
                r["baseline_us"].as_f64().unwrap_or(f64::NAN),
                r["candidate_us"].as_f64().unwrap_or(f64::NAN)
            )
        })
        .collect();
    vec![format!(
        "`compare run1 run2` exited {} (0 expected), verdict {}{}",
        out.status
            .code()
            .map_or("by a signal".into(), |c| c.to_string()),
        v["verdict"],
        if regressions.is_empty() {
            format!(": {}", tail(&String::from_utf8_lossy(&out.stderr), 3))
        } else {
            format!(": {}", regressions.join("; "))
        }
    )]
}

// ---------------------------------------------------------------------------
// The matrix.

const CHECKS: [&str; 6] = ["record", "a", "b", "c", "d", "e"];
const CHECK_TITLES: [&str; 6] = [
    "record",
    "a: core points",
    "b: analyze count",
    "c: report",
    "d: summary.json",
    "e: compare",
];

#[derive(Default)]
enum Cell {
    #[default]
    NotChecked,
    Pass,
    Fail(Vec<String>),
}

impl Cell {
    fn add(&mut self, run: usize, failures: Vec<String>) {
        let failures: Vec<String> = failures
            .into_iter()
            .map(|f| {
                if run > 0 {
                    format!("run {run}: {f}")
                } else {
                    f
                }
            })
            .collect();
        *self = match std::mem::take(self) {
            Cell::Fail(mut old) => {
                old.extend(failures);
                Cell::Fail(old)
            }
            _ if failures.is_empty() => Cell::Pass,
            _ => Cell::Fail(failures),
        };
    }
}

/// A program's row: every check's cell.
fn run_program(stage: &Stage, scratch: &Scratch, program: &Program) -> [Cell; 6] {
    let mut cells: [Cell; 6] = Default::default();
    let slug: String = program
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut runs = Vec::new();
    for i in 1..=2 {
        let work = scratch.0.join(&slug).join(format!("run{i}"));
        std::fs::create_dir_all(&work).expect("work dir");
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            (program.run)(stage, &work, program.layout)
        }))
        .unwrap_or_else(|panic| {
            Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into()))
        });
        let run = match outcome {
            Ok(run) => run,
            Err(e) => {
                cells[0].add(i, vec![e]);
                return cells;
            }
        };
        eprintln!(
            "conformance: {} run {i}: {:.1} s",
            program.name,
            started.elapsed().as_secs_f64()
        );
        cells[0].add(i, run.record.clone().err().into_iter().collect());
        if !run.dir.join("run.json").exists() {
            cells[0].add(i, vec!["no run.json".into()]);
            return cells;
        }
        let meta = run_meta(&run.dir);
        let stamps = run.dir.join("stamps.parquet");
        if stamps.exists() {
            let rows = read_stamps(&stamps);
            cells[1].add(i, check_points(&run, &meta, &rows));
        } else {
            cells[1].add(i, vec!["no stamps.parquet".into()]);
        }
        cells[2].add(i, check_analyze(&run));
        if i == 1 {
            cells[3].add(0, check_report(&run, &work.join("report.html")));
        }
        cells[4].add(i, check_summary(&run));
        runs.push(run);
    }
    cells[5].add(0, check_compare(&runs[0], &runs[1]));
    cells
}

/// The matrix as Markdown: the table, then each failure.
fn markdown(rows: &[(&Program, [Cell; 6])]) -> String {
    let mut table = format!("| program | layout | {} |\n", CHECK_TITLES.join(" | "));
    table += &format!("|---|---|{}\n", "---|".repeat(CHECKS.len()));
    let mut notes = String::new();
    for (program, cells) in rows {
        let marks: Vec<String> = cells
            .iter()
            .zip(CHECKS)
            .map(|(cell, check)| match cell {
                Cell::NotChecked => "—".into(),
                Cell::Pass => "pass".into(),
                Cell::Fail(failures) => {
                    for f in failures {
                        notes += &format!("- **{}**, {check}: {f}\n", program.name);
                    }
                    "**FAIL**".into()
                }
            })
            .collect();
        table += &format!(
            "| {} | `{}` | {} |\n",
            program.name,
            program.layout.join(" "),
            marks.join(" | ")
        );
    }
    if notes.is_empty() {
        table
    } else {
        format!("{table}\nFailures (expected: the program's own account):\n\n{notes}")
    }
}

#[test]
fn conformance_matrix_of_programs_we_did_not_write() {
    let Some(_guard) = privileged("conformance") else {
        return;
    };
    let only: Option<Vec<String>> = std::env::var("XLAP_CONFORMANCE")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.split(',').map(|w| w.trim().to_lowercase()).collect());
    let programs: Vec<Program> = programs()
        .into_iter()
        .filter(|p| {
            only.as_ref().is_none_or(|words| {
                words
                    .iter()
                    .any(|w| p.name.to_lowercase().contains(w.as_str()))
            })
        })
        .collect();
    assert!(!programs.is_empty(), "XLAP_CONFORMANCE selects no program");
    let stage = Stage::two_hosts().expect("stage");
    let scratch = Scratch::new("conformance");
    let started = Instant::now();
    let rows: Vec<(&Program, [Cell; 6])> = programs
        .iter()
        .map(|p| (p, run_program(&stage, &scratch, p)))
        .collect();
    let matrix = markdown(&rows);
    eprintln!(
        "\nconformance matrix ({:.0} s):\n\n{matrix}",
        started.elapsed().as_secs_f64()
    );
    let file = target_dir().join("conformance.md");
    std::fs::write(&file, &matrix).expect("write the matrix");
    eprintln!("(written to {})", file.display());
    let failed: Vec<String> = rows
        .iter()
        .flat_map(|(p, cells)| {
            cells
                .iter()
                .zip(CHECKS)
                .filter(|(c, _)| matches!(c, Cell::Fail(_)))
                .map(move |(_, check)| format!("{} {check}", p.name))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of the matrix's cells failed: {} (details above and in {})",
        failed.len(),
        failed.join("; "),
        file.display()
    );
}
