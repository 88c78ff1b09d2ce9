//! The sockets a traced process already holds when tracing starts: found in
//! /proc, duplicated into our process (pidfd_getfd) so that the BPF side's
//! socket storage can be set for them. Sockets created later are marked by
//! the BPF side itself (cgroup/sock_create).

use std::collections::HashSet;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

/// A socket of a traced process: its fd there and its inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SocketRef {
    pub pid: u32,
    pub fd: i32,
    pub inode: u64,
}

/// A socket of a protocol we do not trace, to name it to the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignSocket {
    pub pid: u32,
    pub protocol: &'static str,
    pub local_port: u16,
}

/// (fd, socket inode) of every socket fd of `pid`, and whether some fd
/// could not be read (no ptrace access to the process: its links are
/// refused although the directory lists).
fn socket_fds(pid: u32) -> (Vec<(i32, u64)>, bool) {
    let refused = |e: &io::Error| e.kind() == io::ErrorKind::PermissionDenied;
    let dir = match std::fs::read_dir(format!("/proc/{pid}/fd")) {
        Ok(dir) => dir,
        Err(e) => return (Vec::new(), refused(&e)),
    };
    let mut unreadable = false;
    let fds = dir
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let link = match std::fs::read_link(e.path()) {
                Ok(link) => link,
                Err(err) => {
                    unreadable |= refused(&err);
                    return None;
                }
            };
            let s = link.to_string_lossy().into_owned();
            let inode = s
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()?;
            Some((fd, inode))
        })
        .collect();
    (fds, unreadable)
}

/// (local port, inode) of the sockets in a /proc/PID/net table.
pub fn proc_net_table(path: &Path) -> Vec<(u16, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local = cols.get(1)?;
            let port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            let inode = cols.get(9)?.parse().ok()?;
            Some((port, inode))
        })
        .collect()
}

fn inodes_of(pid: u32, tables: &[&str]) -> Vec<(u16, u64)> {
    tables
        .iter()
        .flat_map(|t| proc_net_table(Path::new(&format!("/proc/{pid}/net/{t}"))))
        .collect()
}

/// The UDP sockets `pid` holds, whatever their state. A bound or connected
/// one is in /proc/PID/net/udp; one not bound yet (created at start-up, bound
/// by its first send) is in no table, so every socket fd in none of the
/// tables below is asked directly (a duplicate, SO_PROTOCOL): missing it
/// lost a client's first thousand datagrams until its port showed up.
pub fn udp_sockets(pid: u32) -> Vec<SocketRef> {
    scan_udp(pid).udp
}

/// The UDP sockets of a process, and what of its sockets could not be
/// looked at (each may be a UDP socket that is then not traced).
#[derive(Debug, Default)]
pub struct UdpScan {
    pub udp: Vec<SocketRef>,
    /// Its fd table could not be read: no socket it holds is seen.
    pub fd_table_unreadable: bool,
    /// Sockets in no /proc/net table whose duplicate was refused: their
    /// protocol could not be asked.
    pub uninspectable: Vec<SocketRef>,
    /// The local ports of its UDP sockets that have one (bound, or
    /// autobound by a first send), sorted, each once.
    pub ports: Vec<u16>,
}

/// One look at `pid`'s fd table and UDP tables: its UDP sockets and their
/// ports (the recorder does this for every traced process every 200 ms:
/// one read of each serves both).
pub fn scan_udp(pid: u32) -> UdpScan {
    let table = inodes_of(pid, &["udp", "udp6"]);
    let udp: HashSet<u64> = table.iter().map(|(_, inode)| *inode).collect();
    let (fds, fd_table_unreadable) = socket_fds(pid);
    let held: HashSet<u64> = fds.iter().map(|(_, inode)| *inode).collect();
    let mut ports: Vec<u16> = table
        .iter()
        .filter(|(_, inode)| held.contains(inode))
        .map(|(port, _)| *port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    let mut scan = UdpScan {
        fd_table_unreadable,
        ports,
        ..UdpScan::default()
    };
    if fds.iter().all(|(_, inode)| udp.contains(inode)) {
        scan.udp = fds
            .into_iter()
            .map(|(fd, inode)| SocketRef { pid, fd, inode })
            .collect();
        return scan;
    }
    // Sockets another table names are not UDP: no syscall for them.
    let mut other: HashSet<u64> = inodes_of(pid, &["tcp", "tcp6", "raw", "raw6"])
        .into_iter()
        .map(|(_, inode)| inode)
        .collect();
    other.extend(unix_inodes(pid));
    for (fd, inode) in fds {
        let socket = SocketRef { pid, fd, inode };
        if udp.contains(&inode) {
            scan.udp.push(socket);
        } else if !other.contains(&inode) {
            match is_udp(pid, fd, inode) {
                Ok(true) => scan.udp.push(socket),
                Ok(false) => {}
                Err(_) => scan.uninspectable.push(socket),
            }
        }
    }
    scan
}

/// The inodes of the Unix sockets in `pid`'s network namespace.
fn unix_inodes(pid: u32) -> Vec<u64> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/unix")) else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(6)?.parse().ok())
        .collect()
}

/// Whether `fd` of `pid` is an IPv4/IPv6 UDP socket, asked of a duplicate
/// (checked to be the same inode: the fd may have been reused meanwhile);
/// an error when the duplicate is refused.
fn is_udp(pid: u32, fd: i32, inode: u64) -> io::Result<bool> {
    let dup = match duplicate(pid, fd) {
        Ok(dup) => dup,
        // Closed meanwhile, or the process is gone: nothing missed.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::ESRCH)) => return Ok(false),
        Err(e) => return Err(e),
    };
    let same = {
        // SAFETY: fstat fills the zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&dup), &mut st) };
        rc == 0 && st.st_ino == inode
    };
    Ok(same
        && int_opt(&dup, libc::SO_PROTOCOL) == Some(libc::IPPROTO_UDP)
        && matches!(
            int_opt(&dup, libc::SO_DOMAIN),
            Some(libc::AF_INET | libc::AF_INET6)
        ))
}

fn int_opt(fd: &OwnedFd, name: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            libc::SOL_SOCKET,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(value)
}

/// The TCP sockets `pid` holds (xlap-trace keys datagrams, not streams).
pub fn tcp_sockets(pid: u32) -> Vec<ForeignSocket> {
    let held: HashSet<u64> = socket_fds(pid).0.into_iter().map(|(_, i)| i).collect();
    let mut out: Vec<ForeignSocket> = inodes_of(pid, &["tcp", "tcp6"])
        .into_iter()
        .filter(|(_, inode)| held.contains(inode))
        .map(|(local_port, _)| ForeignSocket {
            pid,
            protocol: "tcp",
            local_port,
        })
        .collect();
    out.dedup();
    out
}

/// A duplicate, in our process, of file descriptor `fd` of process `pid`
/// (pidfd_getfd: Linux 5.6, needs ptrace access to the process).
pub fn duplicate(pid: u32, fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscalls with integer arguments; the returned fds are
    // new and owned here.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0);
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let dup = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        );
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(dup as i32))
    }
}

/// The socket's cookie (SO_COOKIE): the kernel's identity of the socket,
/// the one the capture records for the sockets it sees created.
/// The port of the peer a socket is connected to (network order undone),
/// `None` when it is not connected (`getpeername`: ENOTCONN).
pub fn peer_port(fd: &OwnedFd) -> Option<u16> {
    // SAFETY: a zeroed sockaddr_storage is a valid value to fill.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getpeername writes at most `len` bytes into `addr`.
    let rc = unsafe {
        libc::getpeername(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            (&mut addr as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    // sockaddr_in and sockaddr_in6 both keep the port right after the
    // family, in network order.
    match i32::from(addr.ss_family) {
        libc::AF_INET | libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in
            // (or _in6, whose port sits at the same offset).
            let sin =
                unsafe { &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(u16::from_be(sin.sin_port))
        }
        _ => None,
    }
}

pub fn cookie(fd: &OwnedFd) -> io::Result<u64> {
    let mut value: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(fd),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn finds_and_duplicates_this_process_udp_socket() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let me = std::process::id();
        let found = udp_sockets(me);
        let ours = found
            .iter()
            .find(|s| s.fd == sock.as_raw_fd())
            .expect("our UDP socket");
        let dup = duplicate(me, ours.fd).expect("pidfd_getfd on ourselves");
        // The duplicate is the same socket: same local address.
        let same = std::net::UdpSocket::from(dup);
        assert_eq!(same.local_addr().unwrap(), sock.local_addr().unwrap());
    }

    /// A socket created but not bound is in no /proc table yet: it is
    /// found all the same (its first send binds it while traced).
    #[test]
    fn finds_an_unbound_udp_socket() {
        // SAFETY: a plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        assert!(fd >= 0);
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let found = udp_sockets(std::process::id());
        assert!(found.iter().any(|s| s.fd == sock.as_raw_fd()), "{found:?}");
        let unix = std::os::unix::net::UnixDatagram::unbound().unwrap();
        assert!(found.iter().all(|s| s.fd != unix.as_raw_fd()));
    }

    #[test]
    fn finds_this_process_udp_socket_port() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        // A socket in the table that this process does not hold (another
        // process's, seen through the shared network namespace) is left out.
        let held_elsewhere = std::process::Command::new("python3")
            .args(["-c", "import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1], flush=True); sys.stdin.read()"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn();
        let mut child = held_elsewhere.expect("python3");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let other: u16 = line.trim().parse().expect("the child's port");
        let scan = scan_udp(std::process::id());
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(scan.ports.contains(&port), "{:?}", scan.ports);
        assert!(!scan.ports.contains(&other), "{other} in {:?}", scan.ports);
        drop(sock);
        assert!(!scan_udp(std::process::id()).ports.contains(&port));
    }

    #[test]
    fn names_this_process_tcp_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let tcp = tcp_sockets(std::process::id());
        assert!(tcp
            .iter()
            .any(|s| s.local_port == port && s.protocol == "tcp"));
        assert!(udp_sockets(std::process::id())
            .iter()
            .all(|s| s.fd != l.as_raw_fd()));
    }
}
