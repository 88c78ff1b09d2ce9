//! What std's `UdpSocket` lacks: UDP GSO sends (one `sendmsg`, several
//! datagrams), GRO receives (one `recvmsg`, several datagrams), sticky IPv6
//! extension headers and the send buffer size.
//!
//! The pure parts (control messages, splitting a coalesced buffer, the
//! extension header) stand apart from the syscalls so they can be tested
//! without a network.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

/// The most bytes one GSO send carries (all its datagrams together), and
/// the largest data packet (`--payload` up to this less the 24-byte header):
/// under IP's 65 535-byte limit with room for the IP, extension and UDP
/// headers. A parity packet is 8 bytes longer than its data packets (it also
/// covers their send times), 65 008 bytes at most, still within IPv4's
/// 65 507 and IPv6's 65 527 (65 519 with an 8-byte extension header).
pub const MAX_SEND_BYTES: usize = 65_000;

/// Room for the one control message either direction carries (a header and
/// an int, aligned), with slack for one unexpected message.
const CONTROL_CAPACITY: usize = 64;

/// A control-message buffer aligned like `cmsghdr`, as `CMSG_*` require.
#[repr(C, align(8))]
pub struct ControlBuffer {
    bytes: [u8; CONTROL_CAPACITY],
    len: usize,
}

impl ControlBuffer {
    fn empty() -> ControlBuffer {
        ControlBuffer {
            bytes: [0; CONTROL_CAPACITY],
            len: 0,
        }
    }

    /// A buffer holding one control message.
    pub fn with_message(level: i32, kind: i32, data: &[u8]) -> ControlBuffer {
        let mut control = ControlBuffer::empty();
        // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic on a length.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(data.len() as u32) as usize,
                libc::CMSG_LEN(data.len() as u32) as usize,
            )
        };
        assert!(space <= CONTROL_CAPACITY, "control message too large");
        let msg = control.header_over(space);
        // SAFETY: the msghdr describes `space` bytes of our aligned buffer,
        // enough for one cmsghdr and `data` (checked above).
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = level;
            (*cmsg).cmsg_type = kind;
            (*cmsg).cmsg_len = len as _;
            std::ptr::copy_nonoverlapping(data.as_ptr(), libc::CMSG_DATA(cmsg), data.len());
        }
        control.len = space;
        control
    }

    /// The UDP GSO request: the kernel cuts the send into datagrams of
    /// `segment_size` bytes (a u16, as `UDP_SEGMENT` wants).
    pub fn udp_segment(segment_size: u16) -> ControlBuffer {
        ControlBuffer::with_message(
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            &segment_size.to_ne_bytes(),
        )
    }

    /// A msghdr that describes only `len` bytes of this buffer.
    fn header_over(&mut self, len: usize) -> libc::msghdr {
        // SAFETY: an all-zero msghdr is a valid empty one.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_control = self.bytes.as_mut_ptr().cast();
        msg.msg_controllen = len as _;
        msg
    }

    /// Every control message as (level, type, data).
    pub fn messages(&self) -> Vec<(i32, i32, Vec<u8>)> {
        let mut out = Vec::new();
        // SAFETY: an all-zero msghdr is a valid empty one; CMSG_FIRSTHDR and
        // CMSG_NXTHDR only read within msg_controllen bytes of our buffer
        // and return null at its end.
        unsafe {
            let mut msg: libc::msghdr = zeroed();
            msg.msg_control = self.bytes.as_ptr() as *mut libc::c_void;
            msg.msg_controllen = self.len as _;
            let header_len = libc::CMSG_LEN(0) as usize;
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                let data_len = ((*cmsg).cmsg_len as usize).saturating_sub(header_len);
                let data = std::slice::from_raw_parts(libc::CMSG_DATA(cmsg), data_len);
                out.push(((*cmsg).cmsg_level, (*cmsg).cmsg_type, data.to_vec()));
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        out
    }

    /// The segment size of a GRO-coalesced receive (`UDP_GRO`, an int), if
    /// the kernel reported one.
    pub fn gro_segment_size(&self) -> Option<usize> {
        self.messages()
            .into_iter()
            .find(|(level, kind, _)| *level == libc::SOL_UDP && *kind == libc::UDP_GRO)
            .and_then(|(_, _, data)| Some(i32::from_ne_bytes(data.get(..4)?.try_into().ok()?)))
            .and_then(|size| usize::try_from(size).ok())
            .filter(|&size| size > 0)
    }
}

/// Sends `datagrams` as one UDP GSO send: the kernel puts each on the wire
/// as its own datagram. All but the last must be `segment_size` bytes long;
/// the last may be shorter.
pub fn send_segments(
    socket: &UdpSocket,
    datagrams: &[&[u8]],
    segment_size: u16,
) -> io::Result<usize> {
    let mut iov = iovecs(datagrams);
    let mut control = ControlBuffer::udp_segment(segment_size);
    let control_len = control.len;
    let mut msg = control.header_over(control_len);
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: the msghdr points at live iovecs over borrowed datagrams and at
    // our control buffer; the socket is connected, so no address is needed.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}

/// An iovec over each datagram (borrowed: they must outlive the call).
fn iovecs(datagrams: &[&[u8]]) -> Vec<libc::iovec> {
    datagrams
        .iter()
        .map(|d| libc::iovec {
            iov_base: d.as_ptr() as *mut libc::c_void,
            iov_len: d.len(),
        })
        .collect()
}

/// One `sendmmsg` on a connected socket: a message per datagram. Returns
/// the number of messages sent.
pub fn send_messages(socket: &UdpSocket, datagrams: &[&[u8]]) -> io::Result<usize> {
    let mut iov = iovecs(datagrams);
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: a zeroed mmsghdr is valid; it points at one iovec.
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    // SAFETY: every message points at a live iovec over a borrowed datagram;
    // the socket is connected, so no address is needed.
    let sent =
        unsafe { libc::sendmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as u32, 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}

/// One `recvmsg`: the bytes read, where from, and the GRO segment size when
/// the kernel coalesced several datagrams into the buffer.
pub struct Coalesced {
    pub len: usize,
    pub from: SocketAddr,
    pub segment_size: Option<usize>,
    /// The buffer was too small: the kernel dropped the rest (MSG_TRUNC).
    pub truncated: bool,
}

/// Receives into `buf` with room for the `UDP_GRO` control message.
pub fn recv_coalesced(socket: &UdpSocket, buf: &mut [u8]) -> io::Result<Coalesced> {
    let (len, from, control, flags) = recv_with_control(socket, buf)?;
    Ok(Coalesced {
        len,
        from,
        segment_size: control.gro_segment_size(),
        truncated: flags & libc::MSG_TRUNC != 0,
    })
}

/// One `recvmsg`: the bytes read, the sender, the control messages and the
/// message flags.
fn recv_with_control(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, ControlBuffer, i32)> {
    let mut control = ControlBuffer::empty();
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut from: libc::sockaddr_storage = unsafe { zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut msg = control.header_over(CONTROL_CAPACITY);
    msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: every pointer in the msghdr refers to a live, writable local
    // of the size given next to it.
    let len = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    control.len = msg.msg_controllen as _;
    let from = socket_addr(&from).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "datagram from an unknown address family",
        )
    })?;
    Ok((len as usize, from, control, msg.msg_flags))
}

/// The datagrams of one receive: cut at the GRO segment size (the last
/// may be shorter), or the whole buffer when the kernel coalesced nothing.
pub fn split_coalesced(buf: &[u8], segment_size: Option<usize>) -> Vec<&[u8]> {
    match segment_size {
        // An empty datagram is still one datagram (chunks would yield none).
        Some(size) if size > 0 && !buf.is_empty() => buf.chunks(size).collect(),
        _ => vec![buf],
    }
}

/// The call that sends a single datagram (`send --send-call`), to exercise
/// the send-call shapes of real programs. The socket is connected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SendCall {
    /// `send` (sendto without an address).
    #[default]
    Send,
    /// `writev` of two iovecs: the 8-byte header, then the rest.
    Writev,
    /// `sendfile` from a memory file the datagram was written to.
    Sendfile,
    /// `sendto` with the destination address, as a sender whose socket is
    /// not connected calls it (the kernel then takes its unconnected path).
    Sendto,
}

impl std::str::FromStr for SendCall {
    type Err = String;
    fn from_str(s: &str) -> Result<SendCall, String> {
        match s {
            "send" => Ok(SendCall::Send),
            "writev" => Ok(SendCall::Writev),
            "sendfile" => Ok(SendCall::Sendfile),
            "sendto" => Ok(SendCall::Sendto),
            _ => Err(format!(
                "unknown send call {s:?}: send, writev, sendfile or sendto"
            )),
        }
    }
}

/// The memory file `sendfile` sends from, and where its next datagram
/// goes: each datagram at a fresh offset, never over an earlier one (the
/// kernel may send the file's pages without copying them, so bytes
/// rewritten while a datagram is in flight would change it on the wire).
#[derive(Default)]
pub struct SendFile {
    file: Option<std::fs::File>,
    /// The destinations `sendto` names: each socket's connected peer,
    /// asked once (by descriptor: the second path has its own).
    peers: Vec<(i32, std::net::SocketAddr)>,
    end: u64,
}

impl SendFile {
    fn peer(&mut self, socket: &UdpSocket) -> io::Result<std::net::SocketAddr> {
        let fd = socket.as_raw_fd();
        if let Some((_, peer)) = self.peers.iter().find(|(f, _)| *f == fd) {
            return Ok(*peer);
        }
        let peer = socket.peer_addr()?;
        self.peers.push((fd, peer));
        Ok(peer)
    }
}

/// Sends one datagram on a connected socket with `call`; `file` keeps what
/// the calls reuse: the memory file sendfile sends from (created on first
/// use) and the peers sendto names.
pub fn send_with(
    socket: &UdpSocket,
    call: SendCall,
    file: &mut SendFile,
    data: &[u8],
) -> io::Result<usize> {
    match call {
        SendCall::Send => socket.send(data),
        SendCall::Sendto => socket.send_to(data, file.peer(socket)?),
        SendCall::Writev => {
            let split = data.len().min(8);
            let iov = [
                libc::iovec {
                    iov_base: data.as_ptr() as *mut _,
                    iov_len: split,
                },
                libc::iovec {
                    iov_base: data[split..].as_ptr() as *mut _,
                    iov_len: data.len() - split,
                },
            ];
            // SAFETY: both iovecs point into `data`, which outlives the call;
            // writev only reads them.
            let n = unsafe { libc::writev(socket.as_raw_fd(), iov.as_ptr(), 2) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(n as usize)
        }
        SendCall::Sendfile => {
            use std::os::unix::fs::FileExt;
            if file.file.is_none() {
                // SAFETY: a NUL-terminated name and no flags.
                let fd = unsafe { libc::memfd_create(c"prrt-lite-sendfile".as_ptr(), 0) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: fd is a new descriptor that nothing else owns.
                file.file = Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) });
            }
            let at = file.end;
            let f = file.file.as_ref().expect("just created");
            f.write_all_at(data, at)?;
            file.end += data.len() as u64;
            let mut offset = at as libc::off_t;
            // SAFETY: both descriptors are open; offset is a valid pointer.
            let n = unsafe {
                libc::sendfile(socket.as_raw_fd(), f.as_raw_fd(), &mut offset, data.len())
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(n as usize)
        }
    }
}

/// How the receiver reads its socket (`recv --recv-mode`), to exercise the
/// receive-call shapes of real programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecvMode {
    /// One `recvfrom` per datagram.
    #[default]
    Recvfrom,
    /// `recvfrom(MSG_PEEK)` first, then the `recvfrom` that takes it.
    Peek,
    /// `recvmsg` into two iovecs, the first of this many bytes.
    IovSplit(usize),
    /// `recvmmsg` of up to this many datagrams (MSG_WAITFORONE).
    Recvmmsg(usize),
}

impl std::str::FromStr for RecvMode {
    type Err = String;
    fn from_str(s: &str) -> Result<RecvMode, String> {
        let (name, n) = s.split_once(':').unwrap_or((s, ""));
        let num = || {
            n.parse::<usize>()
                .ok()
                .filter(|v| (1..=1024).contains(v))
                .ok_or_else(|| format!("{name} needs a count 1..=1024, e.g. {name}:8"))
        };
        match name {
            "recvfrom" if n.is_empty() => Ok(RecvMode::Recvfrom),
            "peek" if n.is_empty() => Ok(RecvMode::Peek),
            "iov-split" => num().map(RecvMode::IovSplit),
            "recvmmsg" => num().map(RecvMode::Recvmmsg),
            _ => Err(format!(
                "unknown receive mode {s:?}: recvfrom, peek, iov-split:BYTES or recvmmsg:N"
            )),
        }
    }
}

/// `recvmsg` with the datagram scattered over two iovecs in separate
/// memory (its first `first` bytes in a header buffer of their own, the
/// rest in `buf` after them), then made contiguous in `buf`.
pub fn recv_split(
    socket: &UdpSocket,
    buf: &mut [u8],
    first: usize,
) -> io::Result<(usize, SocketAddr)> {
    let first = first.min(buf.len());
    let mut head = vec![0u8; first];
    let rest = &mut buf[first..];
    let mut iov = [
        libc::iovec {
            iov_base: head.as_mut_ptr().cast(),
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        },
    ];
    // SAFETY: an all-zero sockaddr_storage and msghdr are valid.
    let mut from: libc::sockaddr_storage = unsafe { zeroed() };
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = 2;
    // SAFETY: every pointer in the msghdr refers to live, writable memory of
    // the size given next to it.
    let len = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, 0) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    let from = socket_addr(&from)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown address family"))?;
    let len = len as usize;
    buf[..first.min(len)].copy_from_slice(&head[..first.min(len)]);
    Ok((len, from))
}

/// `recvmmsg` of up to `count` datagrams into `slot`-byte slots of `buf`
/// (MSG_WAITFORONE: returns once at least one arrived). Returns each
/// datagram's (offset, length) in `buf` and the first one's sender.
pub fn recv_many(
    socket: &UdpSocket,
    buf: &mut [u8],
    slot: usize,
    count: usize,
) -> io::Result<(Vec<(usize, usize)>, SocketAddr)> {
    let count = count.min(buf.len() / slot).max(1);
    let mut iovs: Vec<libc::iovec> = buf
        .chunks_mut(slot)
        .take(count)
        .map(|c| libc::iovec {
            iov_base: c.as_mut_ptr().cast(),
            iov_len: c.len(),
        })
        .collect();
    // SAFETY: all-zero sockaddr_storage and mmsghdr are valid.
    let mut froms: Vec<libc::sockaddr_storage> = vec![unsafe { zeroed() }; count];
    let mut msgs: Vec<libc::mmsghdr> = (0..count)
        .map(|i| {
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            m.msg_hdr.msg_name = (&mut froms[i] as *mut libc::sockaddr_storage).cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_iov = &mut iovs[i];
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    // SAFETY: msgs holds `count` headers whose pointers refer to live,
    // writable locals (iovs, froms, buf) of the sizes given.
    let n = unsafe {
        libc::recvmmsg(
            socket.as_raw_fd(),
            msgs.as_mut_ptr(),
            count as u32,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let from = socket_addr(&froms[0])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown address family"))?;
    Ok((
        (0..n as usize)
            .map(|i| (i * slot, msgs[i].msg_len as usize))
            .collect(),
        from,
    ))
}

fn socket_addr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Asks the kernel to coalesce arriving datagrams for this socket (GRO).
/// The socket address in C form, with its length.
fn raw_addr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all zeroes is valid.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// A new UDP socket of `like`'s family, not bound.
fn new_socket(like: SocketAddr) -> io::Result<UdpSocket> {
    let family = if like.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2); the fd is owned by the UdpSocket below.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    Ok(unsafe { <UdpSocket as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// A UDP socket for sending to `dest` that is never bound: the kernel
/// gives it a port when it is connected (autobind).
pub fn unbound_socket(dest: SocketAddr) -> io::Result<UdpSocket> {
    new_socket(dest)
}

/// A UDP socket bound to `addr` in an SO_REUSEPORT group.
pub fn reuseport_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = new_socket(addr)?;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with an int option on a valid socket.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let (storage, len) = raw_addr(addr);
    // SAFETY: storage holds a valid sockaddr of `len` bytes.
    let rc = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// The socket's cookie (SO_COOKIE): the kernel's identity of the socket,
/// logged so that a tracer's per-socket attribution can be checked.
pub fn cookie(socket: &UdpSocket) -> io::Result<u64> {
    let mut value: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut value as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

pub fn enable_gro(socket: &UdpSocket) -> io::Result<()> {
    set_option(socket, libc::SOL_UDP, libc::UDP_GRO, &1i32.to_ne_bytes())
}

/// The IPv6 extension header `--ipv6-ext` puts before UDP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Ipv6Ext {
    /// Hop-by-hop options (IPV6_HOPOPTS).
    Hbh,
    /// Destination options (IPV6_DSTOPTS).
    Dst,
}

impl Ipv6Ext {
    fn socket_option(self) -> i32 {
        match self {
            Ipv6Ext::Hbh => libc::IPV6_HOPOPTS,
            Ipv6Ext::Dst => libc::IPV6_DSTOPTS,
        }
    }

    pub fn option_name(self) -> &'static str {
        match self {
            Ipv6Ext::Hbh => "IPV6_HOPOPTS",
            Ipv6Ext::Dst => "IPV6_DSTOPTS",
        }
    }
}

/// An extension header that carries nothing but padding, the smallest
/// valid one (8 bytes): next header 0 (the kernel fills it in), length 0
/// (in 8-byte units beyond the first 8), then a PadN option (type 1) with
/// four zero bytes.
pub const PADDING_EXTENSION_HEADER: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];

/// Makes every datagram of this (IPv6) socket carry `ext` before UDP.
pub fn set_ipv6_extension(socket: &UdpSocket, ext: Ipv6Ext) -> io::Result<()> {
    set_option(
        socket,
        libc::IPPROTO_IPV6,
        ext.socket_option(),
        &PADDING_EXTENSION_HEADER,
    )
}

/// The send buffer size as the kernel reports it (twice what was asked for:
/// the kernel counts its bookkeeping too).
fn send_buffer(socket: &UdpSocket) -> io::Result<usize> {
    let mut value = 0i32;
    let mut len = size_of::<i32>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into our i32.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&mut value as *mut i32).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value.max(0) as usize)
}

/// Grows the send buffer to at least `bytes` when it is smaller:
/// SO_SNDBUFFORCE (root) ignores net.core.wmem_max, SO_SNDBUF is capped by it.
/// Best effort: a small buffer only makes sends wait.
pub fn ensure_send_buffer(socket: &UdpSocket, bytes: usize) {
    if send_buffer(socket).is_ok_and(|current| current >= bytes) {
        return;
    }
    let value = i32::try_from(bytes).unwrap_or(i32::MAX).to_ne_bytes();
    for option in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
        if set_option(socket, libc::SOL_SOCKET, option, &value).is_ok() {
            return;
        }
    }
}

fn set_option(socket: &UdpSocket, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: setsockopt reads `value.len()` bytes of a live slice.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Parses a socket priority as `tc` writes a class (`MAJOR:MINOR`, hex, as
/// `1:20`) or as a plain decimal number. An htb or prio qdisc takes an skb
/// whose priority equals one of its class ids straight into that class.
pub fn parse_priority(s: &str) -> Result<u32, String> {
    match s.split_once(':') {
        Some((major, minor)) => {
            let hex = |v: &str| u16::from_str_radix(v, 16).map_err(|e| format!("{s:?}: {e}"));
            Ok(((hex(major)? as u32) << 16) | hex(minor)? as u32)
        }
        None => s.parse().map_err(|e| format!("{s:?}: {e}")),
    }
}

/// Sets SO_PRIORITY (values above 6 take CAP_NET_ADMIN).
pub fn set_priority(socket: &UdpSocket, priority: u32) -> io::Result<()> {
    let value = priority as libc::c_int;
    // SAFETY: setsockopt with an int option value on our own socket.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PRIORITY,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Waits up to `timeout_ms` for a datagram on any of `sockets`; the index of
/// the first readable one (in the order given), or `WouldBlock` when none
/// became readable in time.
pub fn wait_readable<const N: usize>(
    sockets: [&UdpSocket; N],
    timeout_ms: i32,
) -> io::Result<usize> {
    // On the stack: this runs once per received datagram.
    let mut fds = sockets.map(|s| libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: fds is a valid array of pollfd of the given length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return Err(if e.kind() == io::ErrorKind::Interrupted {
            io::ErrorKind::WouldBlock.into()
        } else {
            e
        });
    }
    fds.iter()
        .position(|f| f.revents & (libc::POLLIN | libc::POLLERR) != 0)
        .ok_or_else(|| io::ErrorKind::WouldBlock.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gso_control_message_carries_the_segment_size_as_u16() {
        let control = ControlBuffer::udp_segment(1224);
        assert_eq!(
            control.messages(),
            vec![(
                libc::SOL_UDP,
                libc::UDP_SEGMENT,
                1224u16.to_ne_bytes().to_vec()
            )]
        );
        // One header plus two bytes, padded to the header's alignment.
        assert_eq!(control.len, unsafe { libc::CMSG_SPACE(2) } as usize);
    }

    #[test]
    fn gro_segment_size_is_read_from_its_control_message_only() {
        let gro = ControlBuffer::with_message(libc::SOL_UDP, libc::UDP_GRO, &1400i32.to_ne_bytes());
        assert_eq!(gro.gro_segment_size(), Some(1400));
        let other =
            ControlBuffer::with_message(libc::SOL_SOCKET, libc::UDP_GRO, &1400i32.to_ne_bytes());
        assert_eq!(other.gro_segment_size(), None);
        assert_eq!(ControlBuffer::empty().gro_segment_size(), None);
        let zero = ControlBuffer::with_message(libc::SOL_UDP, libc::UDP_GRO, &0i32.to_ne_bytes());
        assert_eq!(zero.gro_segment_size(), None);
    }

    #[test]
    fn a_coalesced_buffer_splits_at_the_segment_size_last_shorter() {
        let buf: Vec<u8> = (0..10).collect();
        let parts = split_coalesced(&buf, Some(4));
        assert_eq!(parts, vec![&buf[0..4], &buf[4..8], &buf[8..10]]);
        assert_eq!(split_coalesced(&buf, Some(5)).len(), 2);
        assert_eq!(split_coalesced(&buf, None), vec![&buf[..]]);
        assert_eq!(split_coalesced(&buf, Some(64)), vec![&buf[..]]);
        assert_eq!(split_coalesced(&[], Some(4)), vec![&[] as &[u8]]);
    }

    #[test]
    fn the_extension_header_is_eight_bytes_of_padn() {
        let h = PADDING_EXTENSION_HEADER;
        assert_eq!(h.len(), 8 * (h[1] as usize + 1));
        assert_eq!((h[2], h[3] as usize), (1, h.len() - 4));
        assert!(h[4..].iter().all(|&b| b == 0));
    }

    #[test]
    fn socket_addresses_come_back_from_storage() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let local = socket.local_addr().unwrap();
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockname(
                socket.as_raw_fd(),
                (&mut storage as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(socket_addr(&storage), Some(local));
    }

    #[test]
    fn one_gso_send_arrives_as_separate_datagrams_on_loopback() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.connect(receiver.local_addr().unwrap()).unwrap();
        let (a, b, c) = ([1u8; 100], [2u8; 100], [3u8; 40]);
        match send_segments(&sender, &[&a, &b, &c], 100) {
            Ok(n) => assert_eq!(n, 240),
            // Kernels without UDP GSO: nothing to check here.
            Err(e) => return eprintln!("UDP GSO unavailable: {e}"),
        }
        receiver
            .set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let mut buf = [0u8; 512];
        let lens: Vec<usize> = (0..3).map(|_| receiver.recv(&mut buf).unwrap()).collect();
        assert_eq!(lens, vec![100, 100, 40]);
    }

    #[test]
    fn a_gro_socket_gets_one_gso_send_whole_with_its_segment_size() {
        for (any, local) in [("127.0.0.1:0", "127.0.0.1"), ("[::1]:0", "::1")] {
            let receiver = UdpSocket::bind(any).unwrap();
            enable_gro(&receiver).unwrap();
            let sender = UdpSocket::bind(any).unwrap();
            sender.connect(receiver.local_addr().unwrap()).unwrap();
            receiver
                .set_read_timeout(Some(std::time::Duration::from_secs(2)))
                .unwrap();
            let (a, b, c) = ([1u8; 300], [2u8; 300], [3u8; 7]);
            send_segments(&sender, &[&a, &b, &c], 300).unwrap();
            // A datagram sent on its own comes without a segment size.
            sender.send(&[4u8; 300]).unwrap();

            let mut buf = vec![0u8; 4096];
            let got = recv_coalesced(&receiver, &mut buf).unwrap();
            assert_eq!(got.from, sender.local_addr().unwrap(), "{local}");
            assert!(!got.truncated);
            // Loopback keeps the GSO packet whole for a GRO socket.
            assert_eq!((got.len, got.segment_size), (607, Some(300)), "{local}");
            let parts = split_coalesced(&buf[..got.len], got.segment_size);
            assert_eq!(parts, vec![&a[..], &b[..], &c[..]]);

            let got = recv_coalesced(&receiver, &mut buf).unwrap();
            assert_eq!((got.len, got.segment_size), (300, None), "{local}");
        }
    }

    #[test]
    fn a_short_buffer_reports_truncation() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender
            .send_to(&[9u8; 100], receiver.local_addr().unwrap())
            .unwrap();
        receiver
            .set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let mut buf = [0u8; 10];
        let got = recv_coalesced(&receiver, &mut buf).unwrap();
        assert_eq!(got.len, 10);
        assert!(got.truncated);
    }

    #[test]
    fn sticky_extension_headers_arrive_before_udp() {
        // IPV6_RECVHOPOPTS / IPV6_RECVDSTOPTS (linux/in6.h).
        for (ext, recv_option) in [(Ipv6Ext::Hbh, 53), (Ipv6Ext::Dst, 58)] {
            let receiver = UdpSocket::bind("[::1]:0").unwrap();
            set_option(
                &receiver,
                libc::IPPROTO_IPV6,
                recv_option,
                &1i32.to_ne_bytes(),
            )
            .unwrap();
            receiver
                .set_read_timeout(Some(std::time::Duration::from_secs(2)))
                .unwrap();
            let sender = UdpSocket::bind("[::1]:0").unwrap();
            sender.connect(receiver.local_addr().unwrap()).unwrap();
            match set_ipv6_extension(&sender, ext) {
                Ok(()) => {}
                // Setting them takes CAP_NET_RAW; without it: EPERM.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    return eprintln!("no CAP_NET_RAW: {e}");
                }
                Err(e) => panic!("{}: {e}", ext.option_name()),
            }
            sender.send(b"x").unwrap();
            let mut buf = [0u8; 16];
            let (len, _, control, _) = recv_with_control(&receiver, &mut buf).unwrap();
            assert_eq!(len, 1);
            let header: Vec<Vec<u8>> = control
                .messages()
                .into_iter()
                .filter(|(level, kind, _)| {
                    *level == libc::IPPROTO_IPV6 && *kind == ext.socket_option()
                })
                .map(|(_, _, data)| data)
                .collect();
            // The kernel filled in the next header: UDP (17).
            let mut expected = PADDING_EXTENSION_HEADER.to_vec();
            expected[0] = libc::IPPROTO_UDP as u8;
            assert_eq!(header, vec![expected], "{}", ext.option_name());
        }
    }

    #[test]
    fn extension_headers_are_refused_on_ipv4_sockets() {
        let v4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(set_ipv6_extension(&v4, Ipv6Ext::Dst).is_err());
    }

    #[test]
    fn the_send_buffer_grows_on_request() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = send_buffer(&socket).unwrap();
        ensure_send_buffer(&socket, before * 4);
        // Best effort: never smaller, and larger when root or wmem_max allow.
        assert!(send_buffer(&socket).unwrap() >= before);
    }
}
