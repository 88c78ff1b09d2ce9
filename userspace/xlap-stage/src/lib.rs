//! The stage: two (or three) "hosts" as network namespaces joined by veth,
//! with IPv4 and IPv6 addresses and optional queueing disciplines, for tests
//! and demos that need packets to cross a real link.
//!
//! Names carry the creating process's pid (`xlt<pid>n<k>-a`), so parallel
//! stages never collide, and a stage left behind by a killed process is
//! removed by the next stage built on this machine. Dropping a [`Stage`]
//! (also during a panic) deletes its namespaces and with them its links.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("the stage needs root (network namespaces, veth, tc); run as root or with CAP_NET_ADMIN + CAP_SYS_ADMIN")]
    NotRoot,
    #[error("`{0}` was not found; install iproute2 (run ./run.sh setup)")]
    MissingTool(&'static str),
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
    /// A plain FIFO (bypassed while empty: dequeue stamps only).
    Pfifo,
}

impl Qdisc {
    /// Parses `tbf[:RATE[:BURST[:LATENCY]]]`, `htb[:RATE]` or `pfifo`.
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
            "pfifo" => Ok(Qdisc::Pfifo),
            other => Err(format!(
                "unknown qdisc {other:?}: use tbf[:RATE[:BURST[:LATENCY]]], htb[:RATE] or pfifo (netem is not in this kernel)"
            )),
        }
    }
}

/// One host of the stage.
#[derive(Clone, Debug)]
pub struct Host {
    /// Network namespace name.
    pub netns: String,
    /// The host's link interface inside its namespace.
    pub ifname: String,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
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

    pub fn addr(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.ipv6)
        } else {
            IpAddr::V4(self.ipv4)
        }
    }

    /// Sets (replaces) the root qdisc of the host's link.
    pub fn set_qdisc(&self, qdisc: &Qdisc) -> Result<(), StageError> {
        let dev = ["dev", self.ifname.as_str()];
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
            Qdisc::Pfifo => run(
                "tc",
                &[&ns[..], &["qdisc", "replace"], &dev[..], &["root", "pfifo"]].concat(),
            ),
        }
    }
}

/// What to build.
#[derive(Clone, Debug, Default)]
pub struct StageConfig {
    /// 2: a veth pair between the hosts; 3: each host on a bridge in a
    /// fourth, "switch" namespace.
    pub hosts: usize,
    /// Qdisc per host, in host order (missing entries: the default noqueue).
    pub qdiscs: Vec<Option<Qdisc>>,
}

/// Network namespaces that exist until dropped.
#[derive(Debug)]
pub struct Stage {
    pub prefix: String,
    pub hosts: Vec<Host>,
    /// Namespaces to delete on teardown (hosts and switch).
    namespaces: Vec<String>,
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

impl Stage {
    /// Two hosts `a` (10.77.0.1, fd77::1) and `b` (10.77.0.2, fd77::2) on a
    /// veth pair.
    pub fn two_hosts() -> Result<Stage, StageError> {
        Stage::build(&StageConfig {
            hosts: 2,
            qdiscs: vec![],
        })
    }

    pub fn build(config: &StageConfig) -> Result<Stage, StageError> {
        check_privileges()?;
        let _ = sweep_orphans();
        let n = config.hosts;
        assert!((2..=3).contains(&n), "a stage has 2 or 3 hosts");
        let prefix = format!(
            "{NAME_TAG}{}n{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut stage = Stage {
            prefix: prefix.clone(),
            hosts: Vec::new(),
            namespaces: Vec::new(),
            torn_down: false,
        };
        // From here on, an error drops `stage`, which removes what exists.
        for i in 0..n {
            let letter = (b'a' + i as u8) as char;
            let netns = format!("{prefix}-{letter}");
            run("ip", &["netns", "add", &netns])?;
            stage.namespaces.push(netns.clone());
            run("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
            stage.hosts.push(Host {
                netns,
                ifname: "xl0".to_string(),
                ipv4: Ipv4Addr::new(10, 77, 0, i as u8 + 1),
                ipv6: Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, i as u16 + 1),
            });
        }
        if n == 2 {
            let (a, b) = (&stage.hosts[0], &stage.hosts[1]);
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
            stage.namespaces.push(switch.clone());
            run(
                "ip",
                &["-n", &switch, "link", "add", "br0", "type", "bridge"],
            )?;
            run("ip", &["-n", &switch, "link", "set", "br0", "up"])?;
            for (i, host) in stage.hosts.iter().enumerate() {
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
                run(
                    "ip",
                    &["-n", &switch, "link", "set", &port, "master", "br0"],
                )?;
                run("ip", &["-n", &switch, "link", "set", &port, "up"])?;
            }
        }
        for host in &stage.hosts {
            let ns = host.netns.as_str();
            run(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{}/24", host.ipv4),
                    "dev",
                    "xl0",
                ],
            )?;
            // nodad: the address is usable at once, not after ~2 s of DAD.
            run(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{}/64", host.ipv6),
                    "dev",
                    "xl0",
                    "nodad",
                ],
            )?;
            run("ip", &["-n", ns, "link", "set", "xl0", "up"])?;
        }
        stage.wait_until_up()?;
        stage.pin_neighbours()?;
        for (host, qdisc) in stage.hosts.iter().zip(&config.qdiscs) {
            if let Some(q) = qdisc {
                host.set_qdisc(q)?;
            }
        }
        Ok(stage)
    }

    /// Waits until every host's link reports carrier (operstate UP): packets
    /// sent earlier are dropped by the not-yet-running veth.
    fn wait_until_up(&self) -> Result<(), StageError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for host in &self.hosts {
            loop {
                let out = output("ip", &["-n", &host.netns, "-o", "link", "show", "xl0"])?;
                if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err(StageError::Command {
                        command: format!("wait for xl0 in {} to come up", host.netns),
                        stderr: String::from_utf8_lossy(&out.stdout).into_owned(),
                    });
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Installs permanent neighbour entries between all hosts, so no packet
    /// ever waits for ARP/NDP: a stalled or retried resolution (1 s) would
    /// otherwise show up as latency and loss of the first packets.
    fn pin_neighbours(&self) -> Result<(), StageError> {
        let macs: Vec<String> = self
            .hosts
            .iter()
            .map(|h| {
                let out = output("ip", &["-n", &h.netns, "-o", "link", "show", "xl0"])?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                text.split_whitespace()
                    .skip_while(|w| *w != "link/ether")
                    .nth(1)
                    .map(str::to_string)
                    .ok_or(StageError::Command {
                        command: format!("read the MAC of xl0 in {}", h.netns),
                        stderr: text.clone(),
                    })
            })
            .collect::<Result<_, _>>()?;
        for host in &self.hosts {
            for (peer, mac) in self.hosts.iter().zip(&macs) {
                if peer.netns == host.netns {
                    continue;
                }
                for addr in [peer.ipv4.to_string(), peer.ipv6.to_string()] {
                    run(
                        "ip",
                        &[
                            "-n",
                            &host.netns,
                            "neigh",
                            "replace",
                            &addr,
                            "lladdr",
                            mac,
                            "dev",
                            "xl0",
                            "nud",
                            "permanent",
                        ],
                    )?;
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
