//! A stage whose second host is a virtual machine: host `a` is a namespace
//! of this kernel, host `b` a guest with its own kernel and clock (booted
//! by the caller, e.g. tests/vm/boot.sh under QEMU) whose NIC is backed by
//! the TAP device `xl0` in `a`'s namespace. QEMU, started inside that
//! namespace with `-netdev tap,ifname=xl0,script=no,downscript=no`, attaches
//! to the device this builds; the guest gives its NIC 10.77.0.2/24 itself.

use crate::*;

/// The guest NIC's MAC address (QEMU's `-device virtio-net-pci,mac=…`):
/// pinned as host `b`'s neighbour entry, so no packet waits for ARP.
pub const GUEST_MAC: &str = "02:78:6c:00:01:02";

impl Stage {
    /// Host `a` (10.77.0.1/24 on the TAP `xl0`, up) for a guest at
    /// 10.77.0.2 with [`GUEST_MAC`]. `hosts` holds `a` only: the guest is
    /// not a namespace of this kernel. [`Stage::guest_qemu_opts`] are the
    /// QEMU options that connect a guest to it.
    pub fn for_guest() -> Result<Stage, StageError> {
        check_privileges()?;
        sweep_and_note();
        let mut stage = Stage::empty(Link::Tap);
        let netns = format!("{}-a", stage.prefix);
        // From here on, an error drops `stage`, which removes the namespace.
        run("ip", &["netns", "add", &netns])?;
        stage.namespaces.push(netns.clone());
        let ip = |args: &[&str]| run("ip", &[&["-n", netns.as_str()], args].concat());
        ip(&["link", "set", "lo", "up"])?;
        // Persistent (no process holds it open yet): QEMU attaches by name.
        ip(&["tuntap", "add", "dev", "xl0", "mode", "tap"])?;
        ip(&["addr", "add", "10.77.0.1/24", "dev", "xl0"])?;
        ip(&["link", "set", "xl0", "up"])?;
        ip(&[
            "neigh",
            "replace",
            "10.77.0.2",
            "lladdr",
            GUEST_MAC,
            "dev",
            "xl0",
            "nud",
            "permanent",
        ])?;
        stage.hosts.push(Host {
            netns,
            ifname: "xl0".to_string(),
            wire_ifname: "xl0".to_string(),
            ipv4: Ipv4Addr::new(10, 77, 0, 1),
            ipv6: Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1),
            second: None,
        });
        Ok(stage)
    }

    /// The QEMU options that give a guest its NIC on this stage's TAP (run
    /// QEMU inside host `a`'s namespace: `ip netns exec NETNS …`).
    pub fn guest_qemu_opts(&self) -> String {
        format!(
            "-netdev tap,id=xl0,ifname=xl0,script=no,downscript=no \
             -device virtio-net-pci,netdev=xl0,mac={GUEST_MAC}"
        )
    }
}
