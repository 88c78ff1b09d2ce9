//! Running the example protocol (examples/prrt-lite) across a stage.

use crate::{bin, read_jsonl, wait_for_file, Scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use xlap_stage::Stage;

pub const RECEIVER_PORT: u16 = 9000;
pub const SENDER_PORT: u16 = 9001;

/// The kind byte the example protocol puts on the wire for a kind its logs
/// name (the xlap-example preset reads it as the packet's kind).
pub fn kind_code(name: &str) -> u32 {
    prrt_lite::wire::Kind::ALL
        .into_iter()
        .find(|k| k.name() == name)
        .unwrap_or_else(|| panic!("unexpected kind {name} in the protocol's log")) as u32
}

#[derive(Clone, Debug)]
pub struct ExampleOptions {
    pub count: u32,
    pub period_us: u64,
    pub drop: f64,
    /// The binary with USDT markers (`xlap-example`) or without.
    pub markers: bool,
    /// The sender waits for `start()` before sending.
    pub gated: bool,
    pub ipv6: bool,
    pub send_args: Vec<String>,
    pub recv_args: Vec<String>,
    /// Added to both ports: several pairs side by side on one stage.
    pub port_offset: u16,
    /// A cgroup's `cgroup.procs`: each program enters that cgroup before
    /// it execs (a wrapper shell writes its own pid there and execs the
    /// program, as `systemd-run --scope` and `docker exec` place theirs).
    pub enter_cgroup: Option<PathBuf>,
}

impl Default for ExampleOptions {
    fn default() -> Self {
        ExampleOptions {
            count: 1000,
            period_us: 100,
            drop: 0.0,
            markers: false,
            gated: false,
            ipv6: false,
            send_args: Vec::new(),
            recv_args: Vec::new(),
            port_offset: 0,
            enter_cgroup: None,
        }
    }
}

/// A sender on host a and a receiver on host b, running.
pub struct ProtocolRun {
    pub sender: Child,
    pub receiver: Child,
    pub sender_log: PathBuf,
    pub receiver_log: PathBuf,
    start_file: PathBuf,
}

/// `program` on `host`, in `opts.enter_cgroup` from its exec on when set
/// (the shell and `ip netns exec` exec in place: the pid stays the same).
/// The shell moves first: `ip netns exec` mounts the namespace's own
/// /sys, where the cgroup2 tree is not.
fn program_in(host: &xlap_stage::Host, program: &Path, opts: &ExampleOptions) -> Command {
    match &opts.enter_cgroup {
        None => host.command(program),
        Some(procs) => {
            let mut c = Command::new("/bin/sh");
            c.args(["-c", r#"echo $$ > "$0" && exec "$@""#])
                .arg(procs)
                .args(["ip", "netns", "exec", &host.netns])
                .arg(program);
            c
        }
    }
}

fn sock(addr: std::net::IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(addr, port).to_string()
}

impl ProtocolRun {
    pub fn spawn(stage: &Stage, scratch: &Scratch, opts: &ExampleOptions) -> ProtocolRun {
        let program = bin(if opts.markers {
            "xlap-example"
        } else {
            "xlap-example-plain"
        });
        let (a, b) = (stage.host(0), stage.host(1));
        let receiver_log = scratch.path("receiver.jsonl");
        let sender_log = scratch.path("sender.jsonl");
        let ready = scratch.path("receiver.ready");
        let start_file = scratch.path("start");
        let _ = std::fs::remove_file(&ready);
        let _ = std::fs::remove_file(&start_file);
        let receiver = program_in(b, &program, opts)
            .args([
                "recv",
                "--bind",
                &sock(b.addr(opts.ipv6), RECEIVER_PORT + opts.port_offset),
            ])
            .args(["--expect", &opts.count.to_string()])
            .args(["--first-packet-timeout-s", &crate::start_secs().to_string()])
            .arg("--ready-file")
            .arg(&ready)
            .arg("--log")
            .arg(&receiver_log)
            .args(&opts.recv_args)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn receiver");
        wait_for_file(&ready, 20);
        let mut send = program_in(a, &program, opts);
        send.args([
            "send",
            "--dest",
            &sock(b.addr(opts.ipv6), RECEIVER_PORT + opts.port_offset),
        ])
        .args([
            "--bind",
            &sock(a.addr(opts.ipv6), SENDER_PORT + opts.port_offset),
        ])
        .args(["--count", &opts.count.to_string()])
        .args(["--period-us", &opts.period_us.to_string()])
        .args(["--drop", &opts.drop.to_string()])
        .arg("--log")
        .arg(&sender_log)
        .args(&opts.send_args)
        .stdin(Stdio::null());
        if opts.gated {
            send.arg("--start-file").arg(&start_file);
            send.args(["--start-timeout-s", &crate::start_secs().to_string()]);
        }
        let sender = send.spawn().expect("spawn sender");
        ProtocolRun {
            sender,
            receiver,
            sender_log,
            receiver_log,
            start_file,
        }
    }

    /// Lets a gated sender start.
    pub fn start(&self) {
        std::fs::write(&self.start_file, b"go\n").expect("write start file");
    }

    pub fn pids(&self) -> (u32, u32) {
        (self.sender.id(), self.receiver.id())
    }

    /// Waits for both ends; returns (sender log, receiver log).
    pub fn wait(mut self) -> (Vec<Value>, Vec<Value>) {
        let s = self.sender.wait().expect("wait sender");
        let r = self.receiver.wait().expect("wait receiver");
        assert!(s.success(), "sender failed: {s}");
        assert!(r.success(), "receiver failed: {r}");
        (read_jsonl(&self.sender_log), read_jsonl(&self.receiver_log))
    }
}

impl Drop for ProtocolRun {
    fn drop(&mut self) {
        // Only on an early return (a failed assertion): never leave the
        // protocol running behind a failed test.
        for child in [&mut self.sender, &mut self.receiver] {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Events of one kind from a log.
pub fn events<'a>(log: &'a [Value], event: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    log.iter().filter(move |e| e["event"] == event)
}

/// The summary line of a log.
pub fn summary(log: &[Value]) -> &Value {
    events(log, "summary").next().expect("log has a summary")
}
