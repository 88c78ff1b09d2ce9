//! Addresses of the hosts and their devices.

use crate::*;

/// Underlay IPv4 address of host `i` of a [`Link::Vxlan`] stage.
pub(crate) fn underlay_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 76, 0, i as u8 + 1)
}

/// Underlay IPv6 address of host `i` of a [`Link::Vxlan`] stage.
pub(crate) fn underlay_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd76, 0, 0, 0, 0, 0, 0, i as u16 + 1)
}

/// Adds `v4`/24 and `v6`/64 to `dev` in namespace `ns`.
pub(crate) fn add_addresses(
    ns: &str,
    dev: &str,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
) -> Result<(), StageError> {
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
pub(crate) fn mac_of(ns: &str, dev: &str) -> Result<String, StageError> {
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
