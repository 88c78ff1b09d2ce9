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

mod addresses;
mod build;
mod guest;
mod host;
mod link;
mod napi;
mod sweep;
mod tap;

use addresses::{add_addresses, mac_of, underlay_v4, underlay_v6};
pub use guest::GUEST_MAC;
pub use host::Host;
pub use link::Link;
pub use napi::Napi;
use sweep::sweep_and_note;
pub use sweep::{list_namespaces, sweep_orphans, take_noted_leaks};
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
        assert_eq!(crate::sweep::owner_pid("xlt1234n7-a"), Some(1234));
        assert_eq!(crate::sweep::owner_pid("xlt1234n7-sw"), Some(1234));
        assert_eq!(crate::sweep::owner_pid("other"), None);
        assert_eq!(crate::sweep::owner_pid("xltn-a"), None);
    }
}
