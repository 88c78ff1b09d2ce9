//! The kinds of link between the hosts.

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
