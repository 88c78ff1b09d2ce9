//! The stage: two (or three) "hosts" as network namespaces joined by a link,
//! with IPv4 and IPv6 addresses and optional queueing disciplines, for tests
//! and demos that need packets to cross a real link.
//!
//! The link between two hosts is one of several [`Link`] kinds, each
//! exercising a different kernel receive/transmit path: a plain veth pair
//! (the default), veth in NAPI/GRO mode, TAP devices fed by a userspace wire
//! (the NIC driver path: a fresh skb built in `napi_gro_frags`), a macvlan
//! stacked on veth, or a VXLAN tunnel over a veth underlay.
//!
//! Names carry the creating process's pid (`xlt<pid>n<k>-a`), so parallel
//! stages never collide, and a stage left behind by a killed process is
//! removed by the next stage built on this machine. Dropping a [`Stage`]
//! (also during a panic) deletes its namespaces and with them its links.

mod napi;
mod tap;

pub use napi::Napi;
pub use tap::WireCounts;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("the stage needs root (network namespaces, veth, tc); run as root or with CAP_NET_ADMIN + CAP_SYS_ADMIN")]
    NotRoot,
    #[error("`{0}` was not found; install it (ip and tc: iproute2, run ./run.sh setup; ethtool: apt-get install ethtool)")]
    MissingTool(&'static str),
    #[error("unsupported stage: {0}")]
    Unsupported(String),
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
}

/// A queueing discipline for a host's link. veth defaults to `noqueue`,
/// which has no qdisc stamps at all; `tbf` and `htb` queue every packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Qdisc {
    /// Token bucket: `rate` like "1gbit", `burst` like "64kb", `latency` like "50ms".
    Tbf {
        rate: String,
        burst: String,
        latency: String,
    },
    /// One HTB class as the default class, at `rate`.
    Htb { rate: String },
    /// HTB with several classes `1:<minor>` at their rates (ceil = rate),
    /// the first the default; a socket picks one with SO_PRIORITY
    /// 0x1<minor> (tc's `1:<minor>`, minor in hex).
    HtbClasses { classes: Vec<(u16, String)> },
    /// A plain FIFO (bypassed while empty: dequeue stamps only).
    Pfifo,
}

impl Qdisc {
    /// Parses `tbf[:RATE[:BURST[:LATENCY]]]`, `htb[:RATE]`,
    /// `htb-classes:MINOR=RATE,MINOR=RATE...` (minors in hex, as tc) or `pfifo`.
    pub fn parse(spec: &str) -> Result<Qdisc, String> {
        let mut parts = spec.split(':');
        let kind = parts.next().unwrap_or_default();
        let mut next = |default: &str| parts.next().unwrap_or(default).to_string();
        match kind {
            "tbf" => Ok(Qdisc::Tbf {
                rate: next("1gbit"),
                burst: next("64kb"),
                latency: next("50ms"),
            }),
            "htb" => Ok(Qdisc::Htb { rate: next("1gbit") }),
            "htb-classes" => {
                let list = next("");
                let classes = list
                    .split(',')
                    .map(|c| {
                        let (minor, rate) = c.split_once('=')?;
                        Some((u16::from_str_radix(minor, 16).ok()?, rate.to_string()))
                    })
                    .collect::<Option<Vec<_>>>()
                    .filter(|c| !c.is_empty() && c.iter().all(|(m, r)| *m > 0 && !r.is_empty()))
                    .ok_or_else(|| {
                        format!("htb-classes:{list}: expected MINOR=RATE,... (minor in hex, above 0), e.g. htb-classes:10=1gbit,20=4mbit")
                    })?;
                Ok(Qdisc::HtbClasses { classes })
            }
            "pfifo" => Ok(Qdisc::Pfifo),
            other => Err(format!(
                "unknown qdisc {other:?}: use tbf[:RATE[:BURST[:LATENCY]]], htb[:RATE], htb-classes:MINOR=RATE,... or pfifo (netem is not in this kernel)"
            )),
        }
    }
}

/// One host of the stage.
#[derive(Clone, Debug)]
pub struct Host {
    /// Network namespace name.
    pub netns: String,
    /// The interface inside its namespace that carries the host's addresses
    /// ([`Host::ipv4`], [`Host::ipv6`]): `xl0`, or `mv0` ([`Link::Macvlan`]),
    /// or `vx0` ([`Link::Vxlan`]).
    pub ifname: String,
    /// The interface on which frames leave the host (the veth or TAP
    /// device, `xl0`); the stage's qdiscs go here. The same as
    /// [`Host::ifname`] for [`Link::Veth`], [`Link::VethGro`] and
    /// [`Link::Tap`]; the lower device for [`Link::Macvlan`]; the underlay
    /// for [`Link::Vxlan`].
    pub wire_ifname: String,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
    /// The host's addresses on the second path ([`StageConfig::second_path`]:
    /// `xl1`, 10.78.0.x/24 and fd78::x/64), if the stage has one.
    pub second: Option<(Ipv4Addr, Ipv6Addr)>,
}

impl Host {
    /// A command that runs inside this host's namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns]).arg(program);
        c
    }

    /// Runs `f` on a new thread that has joined this host's network
    /// namespace (namespaces are per thread), e.g. to open sockets there.
    pub fn in_netns<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, StageError> {
        let path = format!("/var/run/netns/{}", self.netns);
        let handle = std::thread::spawn(move || -> Result<T, StageError> {
            let file = std::fs::File::open(&path).map_err(|source| StageError::Spawn {
                command: format!("open {path}"),
                source,
            })?;
            // SAFETY: setns on a valid namespace fd affects only this thread.
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(StageError::Spawn {
                    command: format!("setns {path}"),
                    source: std::io::Error::last_os_error(),
                });
            }
            Ok(f())
        });
        handle.join().expect("netns thread panicked")
    }

    /// The host's address on the second path, if the stage has one.
    pub fn second_addr(&self, v6: bool) -> Option<IpAddr> {
        self.second.map(|(v4, v6addr)| {
            if v6 {
                IpAddr::V6(v6addr)
            } else {
                IpAddr::V4(v4)
            }
        })
    }

    pub fn addr(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.ipv6)
        } else {
            IpAddr::V4(self.ipv4)
        }
    }

    /// Runs `program args` inside this host's namespace.
    fn run_in(&self, program: &'static str, args: &[&str]) -> Result<Output, StageError> {
        output(
            "ip",
            &[&["netns", "exec", self.netns.as_str(), program], args].concat(),
        )
        .map_err(|e| match e {
            StageError::Command { stderr, .. } if stderr.contains("No such file") => {
                StageError::MissingTool(program)
            }
            other => other,
        })
    }

    /// Turns `rx-udp-gro-forwarding` of the wire device on or off (`ethtool
    /// -K`). On veth, a peer with this feature (or `rx-gro-list`) takes
    /// even TSO packets from a socket through NAPI/GRO.
    pub fn set_udp_gro_forwarding(&self, on: bool) -> Result<(), StageError> {
        let state = if on { "on" } else { "off" };
        self.run_in(
            "ethtool",
            &["-K", &self.wire_ifname, "rx-udp-gro-forwarding", state],
        )
        .map(|_| ())
    }

    /// The NAPI instances of the wire device with their kernel threads, as
    /// (pid, thread name) pairs: the `napi/<dev>-<napi id>` threads that
    /// exist in threaded NAPI mode ([`Link::VethGro`] turns it on), e.g. to
    /// pin them with `sched_setaffinity`. Empty when the device has no
    /// threaded NAPI. Read over the `netdev` generic-netlink family inside
    /// the host's namespace, so the two hosts' equally named devices are not
    /// confused.
    pub fn napi_threads(&self) -> Result<Vec<(i32, String)>, StageError> {
        let dev = self.wire_ifname.clone();
        let napis = self.in_netns(move || -> std::io::Result<Vec<Napi>> {
            let cname = std::ffi::CString::new(dev).map_err(std::io::Error::other)?;
            // SAFETY: a NUL-terminated name; the lookup runs in this
            // thread's namespace.
            let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
            if ifindex == 0 {
                return Err(std::io::Error::last_os_error());
            }
            napi::napis_of(ifindex)
        })?;
        let napis = napis.map_err(|source| StageError::Spawn {
            command: format!("netdev NAPI_GET for {} in {}", self.wire_ifname, self.netns),
            source,
        })?;
        Ok(napis
            .into_iter()
            .filter_map(|n| {
                let pid = n.pid?;
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|c| c.trim().to_string())
                    .unwrap_or_else(|_| format!("napi/{}-{}", self.wire_ifname, n.id));
                Some((pid, name))
            })
            .collect())
    }

    /// Sets (replaces) the root qdisc of the host's wire device
    /// ([`Host::wire_ifname`]).
    pub fn set_qdisc(&self, qdisc: &Qdisc) -> Result<(), StageError> {
        let dev = ["dev", self.wire_ifname.as_str()];
        let ns = ["-n", self.netns.as_str()];
        match qdisc {
            Qdisc::Tbf {
                rate,
                burst,
                latency,
            } => run(
                "tc",
                &[
                    &ns[..],
                    &["qdisc", "replace"],
                    &dev[..],
                    &[
                        "root", "tbf", "rate", rate, "burst", burst, "latency", latency,
                    ],
                ]
                .concat(),
            ),
            Qdisc::Htb { rate } => {
                run(
                    "tc",
                    &[
                        &ns[..],
                        &["qdisc", "replace"],
                        &dev[..],
                        &["root", "handle", "1:", "htb", "default", "10"],
                    ]
                    .concat(),
                )?;
                run(
                    "tc",
                    &[
                        &ns[..],
                        &["class", "replace"],
                        &dev[..],
                        &["parent", "1:", "classid", "1:10", "htb", "rate", rate],
                    ]
                    .concat(),
                )
            }
            Qdisc::HtbClasses { classes } => {
                let default = format!("{:x}", classes[0].0);
                run(
                    "tc",
                    &[
                        &ns[..],
                        &["qdisc", "replace"],
                        &dev[..],
                        &["root", "handle", "1:", "htb", "default", &default],
                    ]
                    .concat(),
                )?;
                for (minor, rate) in classes {
                    let classid = format!("1:{minor:x}");
                    run(
                        "tc",
                        &[
                            &ns[..],
                            &["class", "replace"],
                            &dev[..],
                            &["parent", "1:", "classid", &classid, "htb", "rate", rate],
                            &["ceil", rate],
                        ]
                        .concat(),
                    )?;
                }
                Ok(())
            }
            Qdisc::Pfifo => run(
                "tc",
                &[&ns[..], &["qdisc", "replace"], &dev[..], &["root", "pfifo"]].concat(),
            ),
        }
    }
}

/// The kind of link between the two hosts of a stage. Every kind gives
/// each host the same addresses (10.77.0.x/24, fd77::x/64) on
/// [`Host::ifname`] and pinned neighbour entries, so callers can switch kinds
/// without other changes. Three-host stages support only [`Link::Veth`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Link {
    /// A veth pair `xl0`–`xl0` (NAPI off, GRO off): `veth_xmit` hands the
    /// sender's skb straight to the peer's `__netif_rx` (backlog, the
    /// receiving CPU's `process_backlog`), no skb is rebuilt.
    #[default]
    Veth,
    /// The veth pair in NAPI/GRO mode: `ethtool -K xl0 gro on tso off` on
    /// both hosts (veth takes the NAPI path only when the receiver has GRO
    /// and the sender no TSO, or the receiver has `rx-udp-gro-forwarding`,
    /// see [`Host::set_udp_gro_forwarding`]) and threaded NAPI (`threaded`
    /// = 1): `veth_xmit` → `veth_forward_skb` into the peer's ptr_ring →
    /// `veth_poll` in the `napi/xl0-<id>` kernel thread
    /// ([`Host::napi_threads`]) → `napi_gro_receive`.
    VethGro,
    /// A TAP device `xl0` per host (`IFF_TAP | IFF_NO_PI | IFF_NAPI |
    /// IFF_NAPI_FRAGS`, fixed MACs 02:78:6c:00:00:0x) and a userspace wire
    /// of two threads copying frames between the TAP fds: the NIC-driver
    /// receive path, `tun_get_user` → `tun_napi_alloc_frags` (a fresh skb,
    /// headers linear, payload in page fragments) → `napi_gro_frags` →
    /// `netif_receive_skb`; transmit is `tun_net_xmit`. Counted by
    /// [`Stage::wire_counts`]; [`Stage::tap_napi_frags`] says whether the
    /// kernel accepted `IFF_NAPI_FRAGS` (else plain `IFF_NAPI`:
    /// `tun_get_user` → NAPI poll → `napi_gro_receive`).
    Tap,
    /// A stacked device: the veth pair as the lower device `xl0` (no
    /// addresses; the qdiscs go here) and a macvlan `mv0` (mode bridge) over
    /// it carrying the addresses. Transmit: `macvlan_start_xmit` →
    /// `dev_queue_xmit` on `xl0`; receive: `xl0`'s rx_handler
    /// `macvlan_handle_frame` retargets the skb to `mv0` (`RX_HANDLER_ANOTHER`).
    Macvlan,
    /// A UDP tunnel: the veth pair `xl0` as underlay (10.76.0.x/24,
    /// fd76::x/64) and `vx0` (VXLAN id 42, dstport 4789, local/remote the
    /// underlay IPv4 addresses, MTU 1450) carrying the addresses as overlay.
    /// Transmit: `vxlan_xmit` → `udp_tunnel_xmit_skb` (outer IPv4/UDP) →
    /// `xl0`; receive: `udp_rcv` on 4789 → `vxlan_rcv` (encap_rcv) →
    /// `gro_cells_receive` on `vx0`. Both IPv4 and IPv6 overlay traffic
    /// goes over the IPv4 underlay.
    Vxlan,
}

impl Link {
    /// All kinds, `Veth` first.
    pub const ALL: [Link; 5] = [
        Link::Veth,
        Link::VethGro,
        Link::Tap,
        Link::Macvlan,
        Link::Vxlan,
    ];

    /// Parses `veth`, `veth-gro`, `tap`, `macvlan` or `vxlan`.
    pub fn parse(name: &str) -> Result<Link, String> {
        Link::ALL
            .into_iter()
            .find(|l| l.name() == name)
            .ok_or_else(|| {
                format!("unknown link {name:?}: use veth, veth-gro, tap, macvlan or vxlan")
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            Link::Veth => "veth",
            Link::VethGro => "veth-gro",
            Link::Tap => "tap",
            Link::Macvlan => "macvlan",
            Link::Vxlan => "vxlan",
        }
    }
}

/// The VXLAN overhead over an IPv4 underlay (outer IPv4 + UDP + VXLAN +
/// inner Ethernet).
pub const VXLAN_OVERHEAD: u32 = 50;

/// What to build. `StageConfig::default()` is two hosts on a plain veth
/// pair without qdiscs.
#[derive(Clone, Debug)]
pub struct StageConfig {
    /// 2: a link between the hosts; 3: each host on a bridge in a fourth,
    /// "switch" namespace (veth only).
    pub hosts: usize,
    /// Qdisc per host, in host order (missing entries: the default noqueue),
    /// on the host's wire device ([`Host::wire_ifname`]).
    pub qdiscs: Vec<Option<Qdisc>>,
    /// The kind of link.
    pub link: Link,
    /// MTU of the wire device (`xl0`, and the bridge ports of a three-host
    /// stage) and of a macvlan over it; a VXLAN device gets this minus
    /// [`VXLAN_OVERHEAD`]. `None`: the kernel's default (1500; vx0 1450).
    pub mtu: Option<u32>,
    /// A second, independent link between the two hosts of a veth stage:
    /// the veth pair `xl1` (no qdisc, the same MTU) with 10.78.0.x/24 and
    /// fd78::x/64 ([`Host::second`]), for redundant transmission over two
    /// paths (AFDX's networks A and B).
    pub second_path: bool,
}

impl Default for StageConfig {
    fn default() -> StageConfig {
        StageConfig {
            hosts: 2,
            qdiscs: Vec::new(),
            link: Link::Veth,
            mtu: None,
            second_path: false,
        }
    }
}

/// Network namespaces that exist until dropped.
#[derive(Debug)]
pub struct Stage {
    pub prefix: String,
    pub hosts: Vec<Host>,
    /// The kind of link between the hosts.
    pub link: Link,
    /// Namespaces to delete on teardown (hosts and switch).
    namespaces: Vec<String>,
    /// The userspace wire of a [`Link::Tap`] stage.
    wire: Option<tap::Wire>,
    torn_down: bool,
}

const NAME_TAG: &str = "xlt";
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Why this process cannot build a stage, if it cannot.
pub fn check_privileges() -> Result<(), StageError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(StageError::NotRoot);
    }
    for tool in ["ip", "tc"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Err(StageError::MissingTool(tool));
        }
    }
    Ok(())
}

fn run(program: &'static str, args: &[&str]) -> Result<(), StageError> {
    output(program, args).map(|_| ())
}

fn output(program: &'static str, args: &[&str]) -> Result<Output, StageError> {
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                StageError::MissingTool(program)
            } else {
                StageError::Spawn {
                    command: command.clone(),
                    source,
                }
            }
        })?;
    if !out.status.success() {
        return Err(StageError::Command {
            command,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

/// Every namespace name on this machine.
pub fn list_namespaces() -> Result<Vec<String>, StageError> {
    let out = output("ip", &["netns", "list"])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The pid encoded in a stage namespace name (`xlt<pid>n<k>-…`).
fn owner_pid(netns: &str) -> Option<i32> {
    let rest = netns.strip_prefix(NAME_TAG)?;
    rest.split('n').next()?.parse().ok()
}

/// Deletes stage namespaces whose creating process is gone (killed before it
/// could tear down). Returns the names removed.
pub fn sweep_orphans() -> Result<Vec<String>, StageError> {
    let mut removed = Vec::new();
    for ns in list_namespaces()? {
        if let Some(pid) = owner_pid(&ns) {
            // SAFETY: kill with signal 0 only checks for existence.
            let alive = unsafe { libc::kill(pid, 0) } == 0
                || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
            if !alive && run("ip", &["netns", "delete", &ns]).is_ok() {
                removed.push(ns);
            }
        }
    }
    Ok(removed)
}

/// Where stages note the orphans they swept: a later `sweep --check` must
/// still see a leak another stage cleaned up on its way.
fn leak_ledger() -> std::path::PathBuf {
    std::env::temp_dir().join("xlap-stage-leaks")
}

/// Sweeps orphans before a new stage, warns about them and notes them for
/// [`take_noted_leaks`].
fn sweep_and_note() {
    let Ok(removed) = sweep_orphans() else { return };
    if removed.is_empty() {
        return;
    }
    eprintln!(
        "xlap-stage: warning: removed {} namespaces left by exited processes: {}",
        removed.len(),
        removed.join(" ")
    );
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(leak_ledger())
    {
        let _ = writeln!(f, "{}", removed.join("\n"));
    }
}

/// The leaks stages swept since the last call (the ledger is emptied).
pub fn take_noted_leaks() -> Vec<String> {
    let path = leak_ledger();
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Underlay IPv4 address of host `i` of a [`Link::Vxlan`] stage.
fn underlay_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 76, 0, i as u8 + 1)
}

/// Underlay IPv6 address of host `i` of a [`Link::Vxlan`] stage.
fn underlay_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd76, 0, 0, 0, 0, 0, 0, i as u16 + 1)
}

/// Adds `v4`/24 and `v6`/64 to `dev` in namespace `ns`.
fn add_addresses(ns: &str, dev: &str, v4: Ipv4Addr, v6: Ipv6Addr) -> Result<(), StageError> {
    run(
        "ip",
        &["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", dev],
    )?;
    // nodad: the address is usable at once, not after ~2 s of DAD.
    run(
        "ip",
        &[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            dev,
            "nodad",
        ],
    )
}

/// The MAC address of `dev` in namespace `ns`.
fn mac_of(ns: &str, dev: &str) -> Result<String, StageError> {
    let out = output("ip", &["-n", ns, "-o", "link", "show", dev])?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(str::to_string)
        .ok_or(StageError::Command {
            command: format!("read the MAC of {dev} in {ns}"),
            stderr: text.clone(),
        })
}

impl Stage {
    /// Two hosts `a` (10.77.0.1, fd77::1) and `b` (10.77.0.2, fd77::2) on a
    /// veth pair.
    pub fn two_hosts() -> Result<Stage, StageError> {
        Stage::build(&StageConfig::default())
    }

    pub fn build(config: &StageConfig) -> Result<Stage, StageError> {
        check_privileges()?;
        sweep_and_note();
        check_config(config)?;
        let prefix = format!(
            "{NAME_TAG}{}n{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut stage = Stage {
            prefix: prefix.clone(),
            hosts: Vec::new(),
            link: config.link,
            namespaces: Vec::new(),
            wire: None,
            torn_down: false,
        };
        // From here on, an error drops `stage`, which removes what exists.
        stage.add_hosts(config)?;
        let mtu = config.mtu.map(|m| m.to_string());
        let mut taps = stage.connect_hosts(config, mtu.as_deref())?;
        stage.set_up_links(config, mtu.as_deref())?;
        if config.second_path {
            stage.add_second_path(mtu.as_deref())?;
        }
        stage.wait_until_up()?;
        if let (Some(b), Some(a)) = (taps.pop(), taps.pop()) {
            // Started once both devices are up: a TAP that is down refuses
            // writes (EIO), while frames sent earlier wait in the sender's
            // TAP queue.
            stage.wire = Some(tap::Wire::start(a, b));
        }
        if config.link == Link::VethGro {
            for host in &stage.hosts {
                host.run_in("ethtool", &["-K", "xl0", "gro", "on", "tso", "off"])?;
                host.run_in("sh", &["-c", "echo 1 > /sys/class/net/xl0/threaded"])?;
            }
        }
        stage.pin_neighbours()?;
        for (host, qdisc) in stage.hosts.iter().zip(&config.qdiscs) {
            if let Some(q) = qdisc {
                host.set_qdisc(q)?;
            }
        }
        Ok(stage)
    }

    /// One network namespace per host, with its addresses planned.
    fn add_hosts(&mut self, config: &StageConfig) -> Result<(), StageError> {
        let n = config.hosts;
        let prefix = self.prefix.clone();
        let ifname = match config.link {
            Link::Veth | Link::VethGro | Link::Tap => "xl0",
            Link::Macvlan => "mv0",
            Link::Vxlan => "vx0",
        };
        for i in 0..n {
            let letter = (b'a' + i as u8) as char;
            let netns = format!("{prefix}-{letter}");
            run("ip", &["netns", "add", &netns])?;
            self.namespaces.push(netns.clone());
            run("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
            self.hosts.push(Host {
                netns,
                ifname: ifname.to_string(),
                wire_ifname: "xl0".to_string(),
                ipv4: Ipv4Addr::new(10, 77, 0, i as u8 + 1),
                ipv6: Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, i as u16 + 1),
                second: config.second_path.then(|| {
                    (
                        Ipv4Addr::new(10, 78, 0, i as u8 + 1),
                        Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, i as u16 + 1),
                    )
                }),
            });
        }
        Ok(())
    }

    /// The hosts' wire: a veth pair, a TAP pair, or veths on a bridge in a
    /// switch namespace (three hosts); returns the TAP pair's files.
    fn connect_hosts(
        &mut self,
        config: &StageConfig,
        mtu: Option<&str>,
    ) -> Result<Vec<(std::os::fd::OwnedFd, bool)>, StageError> {
        let n = config.hosts;
        let prefix = self.prefix.clone();
        let mut taps = Vec::new();
        if n == 2 && config.link == Link::Tap {
            taps = self.open_taps()?;
        } else if n == 2 {
            let (a, b) = (&self.hosts[0], &self.hosts[1]);
            run(
                "ip",
                &[
                    "link", "add", "name", "xl0", "netns", &a.netns, "type", "veth", "peer",
                    "name", "xl0", "netns", &b.netns,
                ],
            )?;
        } else {
            let switch = format!("{prefix}-sw");
            run("ip", &["netns", "add", &switch])?;
            self.namespaces.push(switch.clone());
            run(
                "ip",
                &["-n", &switch, "link", "add", "br0", "type", "bridge"],
            )?;
            run("ip", &["-n", &switch, "link", "set", "br0", "up"])?;
            for (i, host) in self.hosts.iter().enumerate() {
                let port = format!("p{i}");
                run(
                    "ip",
                    &[
                        "link",
                        "add",
                        "name",
                        "xl0",
                        "netns",
                        &host.netns,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        &port,
                        "netns",
                        &switch,
                    ],
                )?;
                if let Some(mtu) = mtu {
                    run("ip", &["-n", &switch, "link", "set", &port, "mtu", mtu])?;
                }
                run(
                    "ip",
                    &["-n", &switch, "link", "set", &port, "master", "br0"],
                )?;
                run("ip", &["-n", &switch, "link", "set", &port, "up"])?;
            }
        }
        Ok(taps)
    }

    /// Each host's link device on its wire (macvlan, VXLAN or the wire
    /// itself), its MTU, addresses, up.
    fn set_up_links(&self, config: &StageConfig, mtu: Option<&str>) -> Result<(), StageError> {
        for (i, host) in self.hosts.iter().enumerate() {
            let ns = host.netns.as_str();
            if let Some(mtu) = mtu {
                run("ip", &["-n", ns, "link", "set", "xl0", "mtu", mtu])?;
            }
            match config.link {
                Link::Veth | Link::VethGro | Link::Tap => {}
                Link::Macvlan => {
                    run("ip", &["-n", ns, "link", "set", "xl0", "up"])?;
                    run(
                        "ip",
                        &[
                            "-n", ns, "link", "add", "mv0", "link", "xl0", "type", "macvlan",
                            "mode", "bridge",
                        ],
                    )?;
                    if let Some(mtu) = mtu {
                        run("ip", &["-n", ns, "link", "set", "mv0", "mtu", mtu])?;
                    }
                }
                Link::Vxlan => {
                    let (local, remote) = (underlay_v4(i), underlay_v4(1 - i));
                    add_addresses(ns, "xl0", local, underlay_v6(i))?;
                    run("ip", &["-n", ns, "link", "set", "xl0", "up"])?;
                    let vx_mtu = config
                        .mtu
                        .unwrap_or(1500)
                        .saturating_sub(VXLAN_OVERHEAD)
                        .to_string();
                    run(
                        "ip",
                        &[
                            "-n",
                            ns,
                            "link",
                            "add",
                            "vx0",
                            "type",
                            "vxlan",
                            "id",
                            "42",
                            "dstport",
                            "4789",
                            "local",
                            &local.to_string(),
                            "remote",
                            &remote.to_string(),
                            "dev",
                            "xl0",
                        ],
                    )?;
                    run("ip", &["-n", ns, "link", "set", "vx0", "mtu", &vx_mtu])?;
                }
            }
            add_addresses(ns, &host.ifname, host.ipv4, host.ipv6)?;
            run("ip", &["-n", ns, "link", "set", "xl0", "up"])?;
            run("ip", &["-n", ns, "link", "set", &host.ifname, "up"])?;
        }
        Ok(())
    }

    /// The veth pair `xl1` between the two hosts, with their second
    /// addresses, up.
    fn add_second_path(&self, mtu: Option<&str>) -> Result<(), StageError> {
        let (a, b) = (&self.hosts[0], &self.hosts[1]);
        run(
            "ip",
            &[
                "link", "add", "name", "xl1", "netns", &a.netns, "type", "veth", "peer", "name",
                "xl1", "netns", &b.netns,
            ],
        )?;
        for host in [a, b] {
            let ns = host.netns.as_str();
            if let Some(mtu) = mtu {
                run("ip", &["-n", ns, "link", "set", "xl1", "mtu", mtu])?;
            }
            let (v4, v6) = host
                .second
                .expect("hosts of a second-path stage have addresses");
            add_addresses(ns, "xl1", v4, v6)?;
            run("ip", &["-n", ns, "link", "set", "xl1", "up"])?;
        }
        Ok(())
    }

    /// [`Link::Tap`]: a TAP device `xl0` in each host, opened from inside
    /// its namespace, with fixed MACs; returns their fds for the wire.
    fn open_taps(&self) -> Result<Vec<(std::os::fd::OwnedFd, bool)>, StageError> {
        let mut fds = Vec::new();
        for (i, host) in self.hosts.iter().enumerate() {
            let (fd, frags) =
                host.in_netns(|| tap::open_tap("xl0"))?
                    .map_err(|source| StageError::Spawn {
                        command: format!("TUNSETIFF xl0 (IFF_TAP|IFF_NAPI) in {}", host.netns),
                        source,
                    })?;
            run(
                "ip",
                &[
                    "-n",
                    &host.netns,
                    "link",
                    "set",
                    "xl0",
                    "address",
                    &format!("02:78:6c:00:00:{:02x}", i + 1),
                ],
            )?;
            fds.push((fd, frags));
        }
        Ok(fds)
    }

    /// Frames the userspace wire of a [`Link::Tap`] stage has carried
    /// (`None` for other links).
    pub fn wire_counts(&self) -> Option<WireCounts> {
        self.wire.as_ref().map(tap::Wire::counts)
    }

    /// For a [`Link::Tap`] stage: whether both TAP devices run with
    /// `IFF_NAPI_FRAGS` (receive through `napi_gro_frags`) rather than the
    /// `IFF_NAPI` fallback.
    pub fn tap_napi_frags(&self) -> Option<bool> {
        self.wire.as_ref().map(|w| w.napi_frags)
    }

    /// Waits until every host's devices report carrier (operstate UP, or
    /// UNKNOWN for devices without carrier reporting): packets sent earlier
    /// are dropped by the not-yet-running veth.
    fn wait_until_up(&self) -> Result<(), StageError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for host in &self.hosts {
            let mut devs = vec![host.wire_ifname.as_str()];
            if host.ifname != host.wire_ifname {
                devs.push(&host.ifname);
            }
            if host.second.is_some() {
                devs.push("xl1");
            }
            for dev in devs {
                loop {
                    let out = output("ip", &["-n", &host.netns, "-o", "link", "show", dev])?;
                    let text = String::from_utf8_lossy(&out.stdout);
                    if text.contains("state UP") || text.contains("state UNKNOWN") {
                        break;
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(StageError::Command {
                            command: format!("wait for {dev} in {} to come up", host.netns),
                            stderr: text.into_owned(),
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
        Ok(())
    }

    /// Installs permanent neighbour entries between all hosts, so no packet
    /// ever waits for ARP/NDP: a stalled or retried resolution (1 s) would
    /// otherwise show up as latency and loss of the first packets. For
    /// [`Link::Vxlan`] also on the underlay.
    fn pin_neighbours(&self) -> Result<(), StageError> {
        let mut layers: Vec<(&str, Vec<[String; 2]>)> = vec![(
            self.hosts[0].ifname.as_str(),
            self.hosts
                .iter()
                .map(|h| [h.ipv4.to_string(), h.ipv6.to_string()])
                .collect(),
        )];
        if let Some(second) = self
            .hosts
            .iter()
            .map(|h| h.second.map(|(v4, v6)| [v4.to_string(), v6.to_string()]))
            .collect::<Option<Vec<_>>>()
        {
            layers.push(("xl1", second));
        }
        if self.link == Link::Vxlan {
            layers.push((
                "xl0",
                (0..self.hosts.len())
                    .map(|i| [underlay_v4(i).to_string(), underlay_v6(i).to_string()])
                    .collect(),
            ));
        }
        for (dev, addrs) in layers {
            let macs: Vec<String> = self
                .hosts
                .iter()
                .map(|h| mac_of(&h.netns, dev))
                .collect::<Result<_, _>>()?;
            for (i, host) in self.hosts.iter().enumerate() {
                for (j, mac) in macs.iter().enumerate() {
                    if i == j {
                        continue;
                    }
                    for addr in &addrs[j] {
                        run(
                            "ip",
                            &[
                                "-n",
                                &host.netns,
                                "neigh",
                                "replace",
                                addr,
                                "lladdr",
                                mac,
                                "dev",
                                dev,
                                "nud",
                                "permanent",
                            ],
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Deletes the namespaces (and so every link in them).
    pub fn teardown(&mut self) -> Result<(), StageError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        // The wire first: its threads hold the TAP fds, whose closing
        // deletes the devices.
        if let Some(mut wire) = self.wire.take() {
            wire.stop();
        }
        let mut first_error = None;
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = run("ip", &["netns", "delete", &ns]) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("xlap-stage: teardown of {} incomplete: {e}", self.prefix);
        }
    }
}

/// A stage the links cannot make, refused before anything is made.
fn check_config(config: &StageConfig) -> Result<(), StageError> {
    let n = config.hosts;
    assert!((2..=3).contains(&n), "a stage has 2 or 3 hosts");
    if n == 3 && config.link != Link::Veth {
        return Err(StageError::Unsupported(format!(
            "link {} needs a two-host stage (three hosts use veth on a bridge)",
            config.link.name()
        )));
    }
    if config.second_path && (n != 2 || config.link != Link::Veth) {
        return Err(StageError::Unsupported(
            "a second path needs a two-host veth stage".into(),
        ));
    }
    if let (Link::Vxlan, Some(mtu)) = (config.link, config.mtu) {
        if mtu < 1280 + VXLAN_OVERHEAD {
            return Err(StageError::Unsupported(format!(
                "MTU {mtu} leaves the VXLAN device {} bytes, below IPv6's minimum of 1280: \
                 use at least {}",
                mtu.saturating_sub(VXLAN_OVERHEAD),
                1280 + VXLAN_OVERHEAD
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qdisc_specs_parse_with_defaults() {
        assert_eq!(
            Qdisc::parse("tbf").unwrap(),
            Qdisc::Tbf {
                rate: "1gbit".into(),
                burst: "64kb".into(),
                latency: "50ms".into()
            }
        );
        assert_eq!(
            Qdisc::parse("htb:100mbit").unwrap(),
            Qdisc::Htb {
                rate: "100mbit".into()
            }
        );
        assert!(Qdisc::parse("netem").unwrap_err().contains("netem"));
    }

    #[test]
    fn owner_pid_is_read_back_from_names() {
        assert_eq!(owner_pid("xlt1234n7-a"), Some(1234));
        assert_eq!(owner_pid("xlt1234n7-sw"), Some(1234));
        assert_eq!(owner_pid("other"), None);
        assert_eq!(owner_pid("xltn-a"), None);
    }
}
