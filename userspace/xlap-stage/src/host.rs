//! One host of the stage: its namespace, device and addresses, and running
//! programs in it.

use crate::*;

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
    pub(crate) fn run_in(
        &self,
        program: &'static str,
        args: &[&str],
    ) -> Result<Output, StageError> {
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
