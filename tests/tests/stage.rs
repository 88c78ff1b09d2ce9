//! Privileged: the stage comes up and goes down, packets cross it, qdiscs
//! attach, and nothing is left behind (not even after a panic or a kill).

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use xlap_stage::{list_namespaces, Qdisc, Stage, StageConfig};
use xlap_tests::privileged;

/// Sends one datagram from host `from` to host `to` and returns what arrived.
fn udp_crosses(stage: &Stage, from: usize, to: usize, v6: bool) -> Vec<u8> {
    let dest = SocketAddr::new(stage.host(to).addr(v6), 7777);
    let src = SocketAddr::new(stage.host(from).addr(v6), 0);
    let receiver = stage
        .host(to)
        .in_netns(move || {
            let s = UdpSocket::bind(dest).expect("bind receiver");
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s
        })
        .expect("enter receiver netns");
    let payload = format!("hello {from}->{to} v6={v6}").into_bytes();
    let sent = payload.clone();
    stage
        .host(from)
        .in_netns(move || {
            let s = UdpSocket::bind(src).expect("bind sender");
            s.send_to(&sent, dest).expect("send");
        })
        .expect("enter sender netns");
    let mut buf = [0u8; 256];
    let (n, peer) = receiver
        .recv_from(&mut buf)
        .expect("datagram crossed the stage");
    assert_eq!(peer.ip(), stage.host(from).addr(v6));
    buf[..n].to_vec()
}

#[test]
fn two_hosts_come_up_carry_udp_over_ipv4_and_ipv6_and_go_away() {
    let Some(_guard) = privileged("two_hosts") else {
        return;
    };
    let mut stage = Stage::two_hosts().expect("build stage");
    let names: Vec<String> = stage.hosts.iter().map(|h| h.netns.clone()).collect();
    let present = list_namespaces().unwrap();
    for n in &names {
        assert!(present.contains(n), "{n} missing from {present:?}");
    }
    assert_eq!(udp_crosses(&stage, 0, 1, false), b"hello 0->1 v6=false");
    assert_eq!(udp_crosses(&stage, 1, 0, true), b"hello 1->0 v6=true");
    stage.teardown().unwrap();
    let after = list_namespaces().unwrap();
    for n in &names {
        assert!(!after.contains(n), "{n} left behind");
    }
}

#[test]
fn three_hosts_on_a_bridge_reach_each_other() {
    let Some(_guard) = privileged("three_hosts") else {
        return;
    };
    let stage = Stage::build(&StageConfig {
        hosts: 3,
        qdiscs: vec![],
    })
    .expect("build stage");
    for (from, to) in [(0, 1), (1, 2), (2, 0)] {
        assert_eq!(
            udp_crosses(&stage, from, to, false),
            format!("hello {from}->{to} v6=false").as_bytes()
        );
    }
}

#[test]
fn queueing_disciplines_attach_to_the_links() {
    let Some(_guard) = privileged("qdiscs") else {
        return;
    };
    let stage = Stage::build(&StageConfig {
        hosts: 2,
        qdiscs: vec![
            Some(Qdisc::parse("tbf:100mbit").unwrap()),
            Some(Qdisc::parse("htb").unwrap()),
        ],
    })
    .expect("build stage");
    let show = |i: usize| {
        let out = std::process::Command::new("tc")
            .args(["-n", &stage.host(i).netns, "qdisc", "show", "dev", "xl0"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(show(0).contains("qdisc tbf"), "{}", show(0));
    assert!(show(1).contains("qdisc htb"), "{}", show(1));
    assert_eq!(udp_crosses(&stage, 0, 1, false), b"hello 0->1 v6=false");
}

#[test]
fn a_panicking_test_still_tears_its_stage_down() {
    let Some(_guard) = privileged("panic_teardown") else {
        return;
    };
    let names = std::sync::Mutex::new(Vec::new());
    let result = std::panic::catch_unwind(|| {
        let stage = Stage::two_hosts().expect("build stage");
        names
            .lock()
            .unwrap()
            .extend(stage.hosts.iter().map(|h| h.netns.clone()));
        panic!("deliberate");
    });
    assert!(result.is_err());
    let after = list_namespaces().unwrap();
    for n in names.lock().unwrap().iter() {
        assert!(!after.contains(n), "{n} survived the panic");
    }
}

#[test]
fn stages_of_killed_processes_are_swept() {
    let Some(_guard) = privileged("sweep") else {
        return;
    };
    // A child process builds a stage and is killed before it can tear down.
    let mut child = std::process::Command::new(xlap_tests::bin("xlap-trace"))
        .args(["stage", "up"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn stage up");
    let pid = child.id();
    let prefix = format!("xlt{pid}n");
    let start = std::time::Instant::now();
    while !list_namespaces()
        .unwrap()
        .iter()
        .any(|n| n.starts_with(&prefix))
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "stage never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        list_namespaces()
            .unwrap()
            .iter()
            .any(|n| n.starts_with(&prefix)),
        "SIGKILL cannot tear down"
    );
    let removed = xlap_stage::sweep_orphans().unwrap();
    assert!(
        removed.iter().any(|n| n.starts_with(&prefix)),
        "{removed:?}"
    );
    assert!(!list_namespaces()
        .unwrap()
        .iter()
        .any(|n| n.starts_with(&prefix)));
}

#[test]
fn ctrl_c_removes_a_stage_built_from_the_cli() {
    let Some(_guard) = privileged("ctrl_c") else {
        return;
    };
    let child = std::process::Command::new(xlap_tests::bin("xlap-trace"))
        .args(["stage", "up", "--hosts", "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn stage up");
    let pid = child.id();
    let prefix = format!("xlt{pid}n");
    let start = std::time::Instant::now();
    while list_namespaces()
        .unwrap()
        .iter()
        .filter(|n| n.starts_with(&prefix))
        .count()
        < 4
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "stage never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child.
    unsafe { libc_kill(pid as i32, 2) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("stage removed"));
    assert!(!list_namespaces()
        .unwrap()
        .iter()
        .any(|n| n.starts_with(&prefix)));
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
