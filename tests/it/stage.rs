//! Privileged: the stage comes up and goes down, packets cross it, qdiscs
//! attach, and nothing is left behind (not even after a panic or a kill).

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use xlap_stage::{list_namespaces, Link, Qdisc, Stage, StageConfig};
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
        ..Default::default()
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
        ..Default::default()
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

/// Runs `program args` in host `i`'s namespace and returns its stdout.
fn in_host(stage: &Stage, i: usize, program: &str, args: &[&str]) -> String {
    let out = stage.host(i).command(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} in {}: {}",
        stage.host(i).netns,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether one ping from host `from` to host `to` is answered.
fn ping(stage: &Stage, from: usize, to: usize, v6: bool) -> bool {
    let dest = stage.host(to).addr(v6).to_string();
    stage
        .host(from)
        .command("ping")
        .args(["-c", "1", "-W", "2", &dest])
        .output()
        .unwrap()
        .status
        .success()
}

/// Sends `count` datagrams of `size` bytes from host `from` to host `to`
/// and returns how many arrived intact.
fn udp_burst(stage: &Stage, from: usize, to: usize, v6: bool, count: usize, size: usize) -> usize {
    let dest = SocketAddr::new(stage.host(to).addr(v6), 7788);
    let src = SocketAddr::new(stage.host(from).addr(v6), 0);
    let receiver = stage
        .host(to)
        .in_netns(move || {
            let s = UdpSocket::bind(dest).expect("bind receiver");
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            // A burst of reassembled datagrams built from page fragments
            // (the TAP link) has a large truesize: the default receive
            // buffer (208 KiB) overflows before the test reads.
            let size: libc::c_int = 8 << 20;
            // SAFETY: a valid int option on an open socket.
            let rc = unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "SO_RCVBUFFORCE");
            s
        })
        .expect("enter receiver netns");
    let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let sent = payload.clone();
    stage
        .host(from)
        .in_netns(move || {
            let s = UdpSocket::bind(src).expect("bind sender");
            for _ in 0..count {
                s.send_to(&sent, dest).expect("send");
                std::thread::sleep(Duration::from_micros(200));
            }
        })
        .expect("enter sender netns");
    let mut buf = vec![0u8; 65536];
    let mut arrived = 0;
    while arrived < count {
        match receiver.recv_from(&mut buf) {
            Ok((n, peer)) => {
                assert_eq!(peer.ip(), stage.host(from).addr(v6));
                assert_eq!(&buf[..n], &payload[..], "datagram corrupted");
                arrived += 1;
            }
            Err(_) => break,
        }
    }
    arrived
}

/// A counter of device `dev` in host `i` (`/sys/class/net/DEV/statistics/NAME`).
fn dev_stat(stage: &Stage, i: usize, dev: &str, name: &str) -> u64 {
    in_host(
        stage,
        i,
        "cat",
        &[&format!("/sys/class/net/{dev}/statistics/{name}")],
    )
    .trim()
    .parse()
    .unwrap()
}

/// One counter of `ethtool -S DEV` in host `i` (0 when absent).
fn ethtool_stat(stage: &Stage, i: usize, dev: &str, name: &str) -> u64 {
    in_host(stage, i, "ethtool", &["-S", dev])
        .lines()
        .filter_map(|l| l.trim().split_once(": "))
        .find(|(k, _)| *k == name)
        .map_or(0, |(_, v)| v.trim().parse().unwrap())
}

const BURST: usize = 20;

/// Builds a stage with `link`, then: ping both ways over IPv4 and IPv6 and
/// a UDP burst each way and family must all arrive.
fn link_stage(link: Link, qdiscs: Vec<Option<Qdisc>>) -> Stage {
    let stage = Stage::build(&StageConfig {
        link,
        qdiscs,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("build {link:?} stage: {e}"));
    assert_eq!(stage.link, link);
    for v6 in [false, true] {
        for (from, to) in [(0, 1), (1, 0)] {
            assert!(
                ping(&stage, from, to, v6),
                "{link:?}: ping {from}->{to} v6={v6}"
            );
            assert_eq!(
                udp_burst(&stage, from, to, v6, BURST, 100),
                BURST,
                "{link:?}: UDP {from}->{to} v6={v6}"
            );
        }
    }
    stage
}

#[test]
fn config_default_is_two_hosts_on_plain_veth() {
    let c = StageConfig::default();
    assert_eq!((c.hosts, c.link, c.mtu), (2, Link::Veth, None));
    assert!(c.qdiscs.is_empty());
    for link in Link::ALL {
        assert_eq!(Link::parse(link.name()), Ok(link));
    }
    assert!(Link::parse("vlan").is_err());
}

#[test]
fn link_veth_carries_ping_and_udp_without_napi() {
    let Some(_guard) = privileged("link_veth") else {
        return;
    };
    let stage = link_stage(Link::Veth, vec![]);
    let h = stage.host(0);
    assert_eq!((h.ifname.as_str(), h.wire_ifname.as_str()), ("xl0", "xl0"));
    // No NAPI on plain veth: the per-queue NAPI counter stays at zero and
    // no NAPI thread exists.
    assert_eq!(ethtool_stat(&stage, 1, "xl0", "rx_queue_0_xdp_packets"), 0);
    assert!(h.napi_threads().unwrap().is_empty());
    assert_eq!(stage.wire_counts(), None);
}

#[test]
fn link_veth_gro_takes_the_napi_path_in_pinnable_threads() {
    let Some(_guard) = privileged("link_veth_gro") else {
        return;
    };
    let stage = link_stage(Link::VethGro, vec![]);
    for i in 0..2 {
        let k = in_host(&stage, i, "ethtool", &["-k", "xl0"]);
        assert!(k.contains("generic-receive-offload: on"), "{k}");
        assert!(k.contains("tcp-segmentation-offload: off"), "{k}");
        assert_eq!(
            in_host(&stage, i, "cat", &["/sys/class/net/xl0/threaded"]).trim(),
            "1"
        );
    }
    // Each host's own NAPI threads, pinned to CPU 0; traffic still flows
    // and goes through the receiver's NAPI poll (veth counts the packets
    // its poll consumed as rx_queue_0_xdp_packets, XDP program or not).
    let mut all = Vec::new();
    for i in 0..2 {
        let threads = stage.host(i).napi_threads().unwrap();
        assert!(!threads.is_empty(), "host {i} has no NAPI thread");
        for (pid, name) in &threads {
            assert!(name.starts_with("napi/xl0-"), "{name}");
            // SAFETY: a zeroed cpu_set_t with CPU 0 set, for a kernel thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(*pid, std::mem::size_of_val(&set), &set),
                    0,
                    "pin {name}: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
        all.extend(threads);
    }
    all.sort();
    all.dedup_by_key(|t| t.0);
    assert!(all.len() >= 2, "hosts share NAPI threads: {all:?}");
    let before = ethtool_stat(&stage, 1, "xl0", "rx_queue_0_xdp_packets");
    assert_eq!(udp_burst(&stage, 0, 1, false, BURST, 1000), BURST);
    let after = ethtool_stat(&stage, 1, "xl0", "rx_queue_0_xdp_packets");
    assert!(
        after >= before + BURST as u64,
        "NAPI polled {before} -> {after}"
    );
    stage.host(1).set_udp_gro_forwarding(true).unwrap();
    let k = in_host(&stage, 1, "ethtool", &["-k", "xl0"]);
    assert!(k.contains("rx-udp-gro-forwarding: on"), "{k}");
    assert_eq!(udp_burst(&stage, 0, 1, true, BURST, 1000), BURST);
}

#[test]
fn link_tap_goes_through_the_userspace_wire() {
    let Some(_guard) = privileged("link_tap") else {
        return;
    };
    let stage = link_stage(Link::Tap, vec![]);
    assert_eq!(
        stage.tap_napi_frags(),
        Some(true),
        "the kernel refused IFF_NAPI_FRAGS"
    );
    let before = stage.wire_counts().unwrap();
    assert!(before.a_to_b >= 2 * BURST as u64, "{before:?}");
    assert!(before.b_to_a >= 2 * BURST as u64, "{before:?}");
    // Full-size frames and IP fragments: the linear head plus page
    // fragments.
    assert_eq!(udp_burst(&stage, 0, 1, false, BURST, 1472), BURST);
    assert_eq!(
        udp_burst(&stage, 1, 0, true, BURST, 6000),
        BURST,
        "wire {:?}; receiver: {}",
        stage.wire_counts(),
        in_host(&stage, 0, "sh", &["-c", "ip -s link show xl0; nstat -az Ip6ReasmFails Ip6ReasmOKs Udp6InErrors Udp6RcvbufErrors"])
    );
    let after = stage.wire_counts().unwrap();
    assert!(after.a_to_b >= before.a_to_b + BURST as u64, "{after:?}");
    assert!(
        after.b_to_a >= before.b_to_a + 5 * BURST as u64,
        "{after:?}"
    );
    assert_eq!(after.dropped, 0);
    // What the wire wrote is what the receiving TAP received.
    let rx = dev_stat(&stage, 1, "xl0", "rx_packets");
    assert!(rx >= after.a_to_b, "rx {rx} < wire {}", after.a_to_b);
    let link = in_host(&stage, 0, "ip", &["-d", "link", "show", "xl0"]);
    assert!(link.contains("tun type tap"), "{link}");
    assert!(link.contains("02:78:6c:00:00:01"), "{link}");
}

#[test]
fn link_macvlan_stacks_on_the_veth_with_the_qdisc_below() {
    let Some(_guard) = privileged("link_macvlan") else {
        return;
    };
    let stage = link_stage(
        Link::Macvlan,
        vec![Some(Qdisc::parse("tbf").unwrap()), None],
    );
    let h = stage.host(0);
    assert_eq!((h.ifname.as_str(), h.wire_ifname.as_str()), ("mv0", "xl0"));
    let mv = in_host(&stage, 0, "ip", &["-d", "link", "show", "mv0"]);
    assert!(mv.contains("macvlan mode bridge"), "{mv}");
    assert!(mv.contains("mv0@xl0"), "{mv}");
    // The addresses live on mv0, none on the lower device.
    let lower = in_host(&stage, 0, "ip", &["-o", "addr", "show", "dev", "xl0"]);
    assert!(
        !lower.contains("10.77.0.1") && !lower.contains("fd77::1"),
        "{lower}"
    );
    let sent = |stage: &Stage| {
        let q = in_host(stage, 0, "tc", &["-s", "qdisc", "show", "dev", "xl0"]);
        assert!(q.contains("qdisc tbf"), "{q}");
        let pkts = q
            .split_whitespace()
            .skip_while(|w| *w != "bytes")
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap();
        pkts
    };
    let before = sent(&stage);
    assert_eq!(udp_burst(&stage, 0, 1, false, BURST, 100), BURST);
    let after = sent(&stage);
    assert!(
        after >= before + BURST as u64,
        "tbf on xl0 sent {before} -> {after}"
    );
}

#[test]
fn link_vxlan_tunnels_over_the_underlay() {
    let Some(_guard) = privileged("link_vxlan") else {
        return;
    };
    let stage = link_stage(Link::Vxlan, vec![]);
    let h = stage.host(0);
    assert_eq!((h.ifname.as_str(), h.wire_ifname.as_str()), ("vx0", "xl0"));
    let vx = in_host(&stage, 0, "ip", &["-d", "link", "show", "vx0"]);
    assert!(vx.contains("vxlan id 42"), "{vx}");
    assert!(vx.contains("dstport 4789"), "{vx}");
    assert!(vx.contains("mtu 1450"), "{vx}");
    for v6 in [false, true] {
        let tx = dev_stat(&stage, 0, "xl0", "tx_packets");
        let rx = dev_stat(&stage, 1, "xl0", "rx_packets");
        assert_eq!(udp_burst(&stage, 0, 1, v6, BURST, 1000), BURST);
        let tx_after = dev_stat(&stage, 0, "xl0", "tx_packets");
        let rx_after = dev_stat(&stage, 1, "xl0", "rx_packets");
        assert!(
            tx_after >= tx + BURST as u64,
            "underlay tx {tx} -> {tx_after}"
        );
        assert!(
            rx_after >= rx + BURST as u64,
            "underlay rx {rx} -> {rx_after}"
        );
    }
    // The overlay addresses are not on the underlay.
    let under = in_host(&stage, 0, "ip", &["-o", "addr", "show", "dev", "xl0"]);
    assert!(
        under.contains("10.76.0.1") && !under.contains("10.77.0.1"),
        "{under}"
    );
}

#[test]
fn mtu_applies_to_the_link_and_big_datagrams_fragment() {
    let Some(_guard) = privileged("link_mtu") else {
        return;
    };
    // IPv6 needs 1280 on the inner device: vx0 runs 50 bytes below xl0.
    for (link, mtu) in [(Link::Veth, 1280), (Link::Vxlan, 1330)] {
        let stage = Stage::build(&StageConfig {
            link,
            mtu: Some(mtu),
            ..Default::default()
        })
        .expect("build stage");
        let xl0 = in_host(&stage, 0, "ip", &["link", "show", "xl0"]);
        assert!(xl0.contains(&format!("mtu {mtu}")), "{xl0}");
        if link == Link::Vxlan {
            let vx = in_host(&stage, 0, "ip", &["link", "show", "vx0"]);
            assert!(vx.contains("mtu 1280"), "{vx}");
        }
        let frags = dev_stat(&stage, 0, "xl0", "tx_packets");
        assert_eq!(udp_burst(&stage, 0, 1, false, 5, 4000), 5, "{link:?}");
        assert_eq!(udp_burst(&stage, 0, 1, true, 5, 4000), 5, "{link:?}");
        // 4000 bytes at MTU 1280: at least 4 fragments each.
        let after = dev_stat(&stage, 0, "xl0", "tx_packets");
        assert!(after >= frags + 40, "{link:?}: {frags} -> {after}");
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
