//! [`Link::Tap`](crate::Link::Tap): one TAP device per host and a userspace
//! "wire" between them.
//!
//! Each host's `xl0` is a TAP device created with `IFF_TAP | IFF_NO_PI |
//! IFF_NAPI | IFF_NAPI_FRAGS` from a `/dev/net/tun` fd opened inside the
//! host's namespace. Two wire threads read the frames one host transmits
//! (`tun_net_xmit` → the fd's queue → `read`) and write them to the other
//! host's fd. With `IFF_NAPI_FRAGS` the receive side is the NIC driver path:
//! `tun_get_user` → `tun_napi_alloc_frags` (first iovec linear, the rest page
//! fragments) → `napi_gro_frags`, a freshly built skb entering GRO and
//! `netif_receive_skb` like one from a NIC's RX ring. The wire writes each
//! frame with `writev`: the first [`LINEAR`] bytes (all headers: the kernel
//! checks that `eth_get_headlen` fits the linear part) and the rest in
//! page-sized fragments, the layout of a NIC with header split. Should the
//! kernel refuse `IFF_NAPI_FRAGS` (it needs `CAP_NET_ADMIN`), the device is
//! created with `IFF_NAPI` alone: `tun_get_user` then builds a linear skb
//! and queues it for the device's NAPI poll (`napi_gro_receive`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

const IFF_TAP: i16 = 0x0002;
const IFF_NAPI: i16 = 0x0010;
const IFF_NAPI_FRAGS: i16 = 0x0020;
const IFF_NO_PI: i16 = 0x1000;
/// `_IOW('T', 202, int)`
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// Bytes of each frame written as the skb's linear part (headers).
pub const LINEAR: usize = 256;
const PAGE: usize = 4096;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: i16,
    _pad: [u8; 22],
}

/// Creates TAP device `name` in the calling thread's network namespace.
/// Returns its fd and whether `IFF_NAPI_FRAGS` was accepted.
pub(crate) fn open_tap(name: &str) -> io::Result<(OwnedFd, bool)> {
    // SAFETY: open(2) on a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned only here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut last = io::Error::other("no TUNSETIFF attempt");
    for (flags, frags) in [
        (IFF_TAP | IFF_NO_PI | IFF_NAPI | IFF_NAPI_FRAGS, true),
        (IFF_TAP | IFF_NO_PI | IFF_NAPI, false),
    ] {
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes a struct ifreq, which IfReq mirrors.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req) } == 0 {
            return Ok((fd, frags));
        }
        last = io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EINVAL) {
            break;
        }
    }
    Err(last)
}

/// Frame counters of the wire (see [`crate::Stage::wire_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireCounts {
    /// Frames host a transmitted that the wire delivered to host b.
    pub a_to_b: u64,
    /// Frames host b transmitted that the wire delivered to host a.
    pub b_to_a: u64,
    /// Frames the receiving TAP refused (a failed `writev`/`write`).
    pub dropped: u64,
}

#[derive(Debug, Default)]
struct Counters {
    delivered: AtomicU64,
    dropped: AtomicU64,
}

/// The two copying threads between the TAP fds; stopped by [`Wire::stop`]
/// (the stage's teardown) or on drop.
#[derive(Debug)]
pub(crate) struct Wire {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counters: [Arc<Counters>; 2],
    pub napi_frags: bool,
}

impl Wire {
    /// Starts copying frames between the TAP fds of hosts a and b, each
    /// with whether its device accepted `IFF_NAPI_FRAGS` (then frames to it
    /// are written as fragments).
    pub fn start(a: (OwnedFd, bool), b: (OwnedFd, bool)) -> Wire {
        let stop = Arc::new(AtomicBool::new(false));
        let napi_frags = a.1 && b.1;
        let frags = [b.1, a.1];
        let fds = [Arc::new(a.0), Arc::new(b.0)];
        let counters = [Arc::new(Counters::default()), Arc::new(Counters::default())];
        let threads = (0..2)
            .map(|i| {
                let (from, to) = (fds[i].clone(), fds[1 - i].clone());
                let (stop, counters, frags) = (stop.clone(), counters[i].clone(), frags[i]);
                std::thread::Builder::new()
                    .name(format!("xlap-wire-{}", ["ab", "ba"][i]))
                    .spawn(move || copy_frames(&from, &to, frags, &stop, &counters))
                    .expect("spawn wire thread")
            })
            .collect();
        Wire {
            stop,
            threads,
            counters,
            napi_frags,
        }
    }

    pub fn counts(&self) -> WireCounts {
        let [ab, ba] = &self.counters;
        WireCounts {
            a_to_b: ab.delivered.load(Ordering::Relaxed),
            b_to_a: ba.delivered.load(Ordering::Relaxed),
            dropped: ab.dropped.load(Ordering::Relaxed) + ba.dropped.load(Ordering::Relaxed),
        }
    }

    /// Stops and joins the threads; the TAP fds close with the last of them,
    /// which deletes the (non-persistent) devices.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop();
    }
}

fn copy_frames(from: &OwnedFd, to: &OwnedFd, frags: bool, stop: &AtomicBool, c: &Counters) {
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: from.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
            continue;
        }
        // SAFETY: buf is writable for its length; the fd is non-blocking.
        let n = unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            continue;
        }
        let frame = &buf[..n as usize];
        let written = if frags {
            let mut iov = vec![libc::iovec {
                iov_base: frame.as_ptr() as *mut _,
                iov_len: frame.len().min(LINEAR),
            }];
            for chunk in frame[frame.len().min(LINEAR)..].chunks(PAGE) {
                iov.push(libc::iovec {
                    iov_base: chunk.as_ptr() as *mut _,
                    iov_len: chunk.len(),
                });
            }
            // SAFETY: every iovec points into `frame`, alive for the call.
            unsafe { libc::writev(to.as_raw_fd(), iov.as_ptr(), iov.len() as i32) }
        } else {
            // SAFETY: frame is readable for its length.
            unsafe { libc::write(to.as_raw_fd(), frame.as_ptr().cast(), frame.len()) }
        };
        if written == n {
            c.delivered.fetch_add(1, Ordering::Relaxed);
        } else {
            c.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
