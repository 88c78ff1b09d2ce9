//! Building a stage (namespaces, links, addresses, qdiscs) and tearing
//! it down.

use crate::*;

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
        let mut stage = Stage::empty(config.link);
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

    /// A stage with no namespace yet, named after this process (`xlt<pid>n<k>`).
    pub(crate) fn empty(link: Link) -> Stage {
        Stage {
            prefix: format!(
                "{NAME_TAG}{}n{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ),
            hosts: Vec::new(),
            link,
            namespaces: Vec::new(),
            wire: None,
            torn_down: false,
        }
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
