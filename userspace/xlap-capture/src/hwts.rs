//! Which devices of the traced processes can timestamp packets, and how:
//! the ethtool timestamping capabilities (`ETHTOOL_GET_TS_INFO`, what
//! `ethtool -T DEV` prints) and whether hardware timestamping is switched on
//! (`SIOCGHWTSTAMP`). The device points stamp with the kernel's clock
//! always; a device's hardware time (`skb_hwtstamps`) reaches the stamps'
//! `hw_ts_ns` only where the NIC has it and timestamping is on. xlap-trace
//! does not switch it on (that reconfigures a device other programs share,
//! e.g. a PTP daemon): it says what it found, once, and records it in
//! run.json.

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;

/// One device in one traced network namespace (as run.json lists it).
pub use xlap_records::run_meta::DeviceTimestamping;

const ETHTOOL_GDRVINFO: u32 = 0x3;
const ETHTOOL_GET_TS_INFO: u32 = 0x41;
const SIOCETHTOOL: libc::c_ulong = 0x8946;
const SIOCGHWTSTAMP: libc::c_ulong = 0x89b1;
const SOF_TIMESTAMPING_TX_HARDWARE: u32 = 1 << 0;
const SOF_TIMESTAMPING_TX_SOFTWARE: u32 = 1 << 1;
const SOF_TIMESTAMPING_RX_HARDWARE: u32 = 1 << 2;
const SOF_TIMESTAMPING_RX_SOFTWARE: u32 = 1 << 3;

/// `struct ethtool_ts_info` (uapi/linux/ethtool.h).
#[repr(C)]
#[derive(Default)]
struct TsInfo {
    cmd: u32,
    so_timestamping: u32,
    phc_index: i32,
    tx_types: u32,
    tx_reserved: [u32; 3],
    rx_filters: u32,
    rx_reserved: [u32; 3],
}

/// `struct ethtool_drvinfo`.
#[repr(C)]
#[derive(Default)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// `struct hwtstamp_config`.
#[repr(C)]
#[derive(Default)]
struct HwtstampConfig {
    flags: i32,
    tx_type: i32,
    rx_filter: i32,
}

/// `struct ifreq` with a pointer payload.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ioctl<T>(fd: i32, req: libc::c_ulong, ifname: &str, data: &mut T) -> bool {
    let mut ifr = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: data as *mut T as *mut libc::c_void,
        _pad: [0; 16],
    };
    let n = ifname.len().min(libc::IFNAMSIZ - 1);
    ifr.name[..n].copy_from_slice(&ifname.as_bytes()[..n]);
    // SAFETY: a valid socket, an ifreq whose data points at a live struct
    // of the layout the request expects.
    unsafe { libc::ioctl(fd, req, &mut ifr) == 0 }
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Every device but loopback of the calling thread's network namespace.
fn devices_here(netns: u32) -> Vec<DeviceTimestamping> {
    // SAFETY: a plain datagram socket for ioctls, closed by OwnedFd.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if raw < 0 {
        return Vec::new();
    }
    // SAFETY: a fresh fd we own.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let fd = sock.as_raw_fd();
    let mut names = Vec::new();
    // SAFETY: if_nameindex returns an array ended by a zero entry, freed
    // with if_freenameindex.
    unsafe {
        let list = libc::if_nameindex();
        if !list.is_null() {
            let mut i = 0;
            while (*list.add(i)).if_index != 0 {
                let name = std::ffi::CStr::from_ptr((*list.add(i)).if_name);
                names.push(((*list.add(i)).if_index, name.to_string_lossy().into_owned()));
                i += 1;
            }
            libc::if_freenameindex(list);
        }
    }
    let mut out = Vec::new();
    for (ifindex, ifname) in names.into_iter().filter(|(_, n)| n != "lo") {
        let mut ts = TsInfo {
            cmd: ETHTOOL_GET_TS_INFO,
            ..Default::default()
        };
        if !ioctl(fd, SIOCETHTOOL, &ifname, &mut ts) {
            continue;
        }
        let mut drv = DrvInfo {
            cmd: ETHTOOL_GDRVINFO,
            ..Default::default()
        };
        let driver = if ioctl(fd, SIOCETHTOOL, &ifname, &mut drv) {
            c_string(&drv.driver)
        } else {
            String::new()
        };
        let mut cfg = HwtstampConfig::default();
        let hardware_rx_on = ioctl(fd, SIOCGHWTSTAMP, &ifname, &mut cfg) && cfg.rx_filter != 0;
        let bit = |b: u32| ts.so_timestamping & b != 0;
        out.push(DeviceTimestamping {
            netns,
            ifindex,
            ifname,
            driver,
            hardware_tx: bit(SOF_TIMESTAMPING_TX_HARDWARE),
            hardware_rx: bit(SOF_TIMESTAMPING_RX_HARDWARE),
            software_tx: bit(SOF_TIMESTAMPING_TX_SOFTWARE),
            software_rx: bit(SOF_TIMESTAMPING_RX_SOFTWARE),
            phc_index: (ts.phc_index >= 0).then_some(ts.phc_index),
            hardware_rx_on,
        });
    }
    out
}

/// The devices of the traced processes' network namespaces (each
/// namespace once), surveyed from a thread that joins each.
pub fn survey(pids: &[u32]) -> Vec<DeviceTimestamping> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for &pid in pids {
        let Some(netns) = crate::targets::netns_inode(pid) else {
            continue;
        };
        if !seen.insert(netns) {
            continue;
        }
        let Ok(ns) = std::fs::File::open(format!("/proc/{pid}/ns/net")) else {
            continue;
        };
        let found = std::thread::spawn(move || {
            // SAFETY: an fd of a network namespace; only this thread
            // changes namespace, and it ends right after.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Vec::new();
            }
            devices_here(netns)
        })
        .join()
        .unwrap_or_default();
        out.extend(found);
    }
    out
}

/// What to say about the survey, once: devices that could give wire times
/// but do not, and that none can.
pub fn message(devices: &[DeviceTimestamping]) -> Option<String> {
    if devices.is_empty() {
        return None;
    }
    let off: Vec<String> = devices
        .iter()
        .filter(|d| d.hardware_rx && !d.hardware_rx_on)
        .map(|d| format!("{} ({})", d.ifname, d.driver))
        .collect();
    if devices.iter().any(|d| d.hardware_rx && d.hardware_rx_on) {
        return None;
    }
    if !off.is_empty() {
        return Some(format!(
            "{} can timestamp received packets in hardware but timestamping is off: device points use the kernel clock; to record wire times (hw_ts_ns) switch it on, e.g. `hwstamp_ctl -i DEV -r 1` (linuxptp), if no other program relies on its setting",
            off.join(", ")
        ));
    }
    let names: Vec<String> = devices
        .iter()
        .map(|d| format!("{} ({})", d.ifname, d.driver))
        .collect();
    Some(format!(
        "no hardware timestamps on {}: device points use the kernel clock (software timestamps), there is no wire time",
        names.join(", ")
    ))
}
