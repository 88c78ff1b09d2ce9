//! The NAPI instances of a device and their kernel threads, read over the
//! `netdev` generic-netlink family (`NETDEV_CMD_NAPI_GET`, Linux ≥ 6.8 for the
//! thread pid). Both hosts of a stage name their link `xl0`, so the thread
//! names (`napi/xl0-<id>`) alone cannot tell the hosts apart; the netlink
//! dump, run inside the host's namespace and filtered by ifindex, can.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NETLINK_GENERIC: i32 = 16;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_NAPI_GET: u8 = 11;
const NETDEV_A_NAPI_IFINDEX: u16 = 1;
const NETDEV_A_NAPI_ID: u16 = 2;
const NETDEV_A_NAPI_PID: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;

/// One NAPI instance of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Napi {
    pub id: u32,
    /// The pid of its kernel thread (`napi/<dev>-<id>`), when threaded.
    pub pid: Option<i32>,
}

struct Genl {
    fd: OwnedFd,
    seq: u32,
}

fn attr(buf: &mut Vec<u8>, kind: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(data);
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

/// The attributes of a generic-netlink message body (after the genl header).
fn attrs(mut body: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while body.len() >= 4 {
        let len = u16::from_ne_bytes([body[0], body[1]]) as usize;
        let kind = u16::from_ne_bytes([body[2], body[3]]) & 0x3fff;
        if len < 4 || len > body.len() {
            break;
        }
        out.push((kind, &body[4..len]));
        let next = (len + 3) & !3;
        body = &body[next.min(body.len())..];
    }
    out
}

fn u32_of(data: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(..4)?.try_into().ok()?))
}

impl Genl {
    fn open() -> io::Result<Genl> {
        // SAFETY: plain socket(2); the fd is owned from here on.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_GENERIC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket(2) and is not owned elsewhere.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: a valid timeval of the size passed.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        Ok(Genl { fd, seq: 1 })
    }

    /// Sends one request and returns the attribute blocks of every reply
    /// message (one for a plain request, many for a dump).
    fn request(
        &mut self,
        family: u16,
        flags: u16,
        cmd: u8,
        payload: &[u8],
    ) -> io::Result<Vec<Vec<u8>>> {
        self.seq += 1;
        let mut msg = Vec::with_capacity(20 + payload.len());
        msg.extend_from_slice(&((20 + payload.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&family.to_ne_bytes());
        msg.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&[cmd, 1, 0, 0]);
        msg.extend_from_slice(payload);
        // SAFETY: msg is a valid buffer of msg.len() bytes; the kernel is the
        // default destination of an unbound netlink socket's send.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut replies = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: buf is writable for buf.len() bytes.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= 16 {
                let len = u32::from_ne_bytes(rest[..4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                if len < 16 || len > rest.len() {
                    break;
                }
                let body = &rest[16..len];
                match kind {
                    NLMSG_DONE => return Ok(replies),
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(body[..4].try_into().unwrap());
                        if errno != 0 {
                            return Err(io::Error::from_raw_os_error(-errno));
                        }
                        return Ok(replies);
                    }
                    _ => replies.push(body.get(4..).unwrap_or_default().to_vec()),
                }
                rest = &rest[((len + 3) & !3).min(rest.len())..];
            }
            if flags & NLM_F_DUMP == 0 && !replies.is_empty() {
                return Ok(replies);
            }
        }
    }

    fn family(&mut self, name: &str) -> io::Result<u16> {
        let mut payload = Vec::new();
        let mut cname = name.as_bytes().to_vec();
        cname.push(0);
        attr(&mut payload, CTRL_ATTR_FAMILY_NAME, &cname);
        let replies = self.request(GENL_ID_CTRL, 0, CTRL_CMD_GETFAMILY, &payload)?;
        replies
            .iter()
            .flat_map(|r| attrs(r))
            .find(|(k, d)| *k == CTRL_ATTR_FAMILY_ID && d.len() >= 2)
            .map(|(_, d)| u16::from_ne_bytes([d[0], d[1]]))
            .ok_or_else(|| io::Error::other(format!("no generic-netlink family {name}")))
    }
}

/// The NAPI instances of device `ifindex` in the calling thread's network
/// namespace.
pub(crate) fn napis_of(ifindex: u32) -> io::Result<Vec<Napi>> {
    let mut genl = Genl::open()?;
    let family = genl.family("netdev")?;
    let mut payload = Vec::new();
    attr(&mut payload, NETDEV_A_NAPI_IFINDEX, &ifindex.to_ne_bytes());
    let replies = genl.request(family, NLM_F_DUMP, NETDEV_CMD_NAPI_GET, &payload)?;
    Ok(replies
        .iter()
        .filter_map(|r| {
            let a = attrs(r);
            let get = |k| {
                a.iter()
                    .find(|(kind, _)| *kind == k)
                    .and_then(|(_, d)| u32_of(d))
            };
            Some(Napi {
                id: get(NETDEV_A_NAPI_ID)?,
                pid: get(NETDEV_A_NAPI_PID).map(|p| p as i32),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_with_padding() {
        let mut buf = Vec::new();
        attr(&mut buf, 2, b"netdev\0");
        attr(&mut buf, 1, &7u32.to_ne_bytes());
        assert_eq!(buf.len(), 12 + 8);
        let parsed = attrs(&buf);
        assert_eq!(parsed[0], (2, &b"netdev\0"[..]));
        assert_eq!(u32_of(parsed[1].1), Some(7));
    }
}
