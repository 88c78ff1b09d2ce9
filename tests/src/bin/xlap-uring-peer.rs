//! A UDP peer that sends and receives only through io_uring (no send or
//! receive syscall per datagram), for the capture tests; its JSON-lines log
//! is their ground truth. Datagrams use the example protocol's layout
//! (kind u8 at 0, seq u32 big-endian at 4), 64 bytes.
//!
//! ```text
//! xlap-uring-peer send LOCAL DEST COUNT PERIOD_US LOG START_FILE send|send_zc
//! xlap-uring-peer recv LOCAL PEER|- COUNT LOG READY_FILE recv|recvmsg
//! ```
//! `send` uses IORING_OP_SEND or IORING_OP_SEND_ZC (zero copy: a second
//! completion says when the buffer is free again). `recv` connects to PEER
//! unless it is `-`, and stops after COUNT datagrams or 3 s without one. Exit codes: 0 done, 1 failure, 2 usage.

use anyhow::{bail, Context, Result};
use io_uring::{opcode, types, IoUring};
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

const LEN: usize = 64;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("send") if args.len() == 8 => send(&args[1..]),
        Some("recv") if args.len() == 7 => recv(&args[1..]),
        _ => {
            eprintln!("usage: xlap-uring-peer send LOCAL DEST COUNT PERIOD_US LOG START_FILE send|send_zc | recv LOCAL PEER|- COUNT LOG READY_FILE recv|recvmsg");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xlap-uring-peer: {e:#}");
        std::process::exit(1);
    }
}

/// How long a receiver waits for its first datagram.
const FIRST_WAIT_S: u64 = 60;

/// Submits one entry and waits for its completion (`timeout`: at most
/// that long); returns its result.
fn one(
    ring: &mut IoUring,
    entry: io_uring::squeue::Entry,
    timeout: Option<Duration>,
) -> Result<Option<i32>> {
    // SAFETY: the buffers the entry points to outlive the wait below.
    unsafe {
        ring.submission()
            .push(&entry)
            .context("submission queue full")?
    };
    match timeout {
        None => {
            ring.submit_and_wait(1)?;
        }
        Some(t) => {
            let ts = types::Timespec::from(t);
            let args = types::SubmitArgs::new().timespec(&ts);
            match ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(ring.completion().next().map(|c| c.result()))
}

fn send(a: &[String]) -> Result<()> {
    let local: SocketAddr = a[0].parse()?;
    let dest: SocketAddr = a[1].parse()?;
    let count: u32 = a[2].parse()?;
    let period = Duration::from_micros(a[3].parse()?);
    let mut log = std::fs::File::create(&a[4])?;
    let zero_copy = match a[6].as_str() {
        "send" => false,
        "send_zc" => true,
        other => bail!("send mode {other:?}: send or send_zc"),
    };
    let socket = UdpSocket::bind(local)?;
    socket.connect(dest)?;
    let start = Path::new(&a[5]);
    while !start.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut ring = IoUring::new(8)?;
    let fd = types::Fd(socket.as_raw_fd());
    for seq in 0..count {
        let mut buf = [0u8; LEN];
        buf[0] = 1;
        buf[4..8].copy_from_slice(&seq.to_be_bytes());
        let entry = if zero_copy {
            opcode::SendZc::new(fd, buf.as_ptr(), LEN as u32).build()
        } else {
            opcode::Send::new(fd, buf.as_ptr(), LEN as u32).build()
        };
        match one(&mut ring, entry, None)? {
            Some(n) if n == LEN as i32 => {}
            other => bail!("send of seq {seq} completed with {other:?}"),
        }
        if zero_copy {
            // The notification that the kernel let go of the buffer.
            ring.submit_and_wait(1)?;
            let notif = ring
                .completion()
                .next()
                .context("no zero-copy notification")?;
            anyhow::ensure!(
                io_uring::cqueue::notif(notif.flags()),
                "seq {seq}: expected the zero-copy notification, got flags {:#x}",
                notif.flags()
            );
        }
        writeln!(log, r#"{{"event":"sent","kind":"data","seq":{seq}}}"#)?;
        std::thread::sleep(period);
    }
    Ok(())
}

fn recv(a: &[String]) -> Result<()> {
    let local: SocketAddr = a[0].parse()?;
    let count: u32 = a[2].parse()?;
    let mut log = std::fs::File::create(&a[3])?;
    let socket = UdpSocket::bind(local)?;
    if a[1] != "-" {
        socket.connect(a[1].parse::<SocketAddr>()?)?;
    }
    let with_msg = match a[5].as_str() {
        "recv" => false,
        "recvmsg" => true,
        other => bail!("receive mode {other:?}: recv or recvmsg"),
    };
    std::fs::write(&a[4], format!("{}\n", std::process::id()))?;
    // Declared before the ring, so that they outlive it (and a receive
    // still pending when the run goes idle).
    let mut buf = [0u8; 2048];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid; it points at iov.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    let mut ring = IoUring::new(8)?;
    let fd = types::Fd(socket.as_raw_fd());
    let mut got = 0;
    while got < count {
        let entry = if with_msg {
            opcode::RecvMsg::new(fd, &mut msg).build()
        } else {
            opcode::Recv::new(fd, buf.as_mut_ptr(), buf.len() as u32).build()
        };
        // The first datagram comes once the recorder is attached, which
        // takes seconds on a loaded machine (7.7 s seen); later, 3 s idle
        // means the sender is done.
        let idle = Duration::from_secs(if got == 0 { FIRST_WAIT_S } else { 3 });
        let Some(n) = one(&mut ring, entry, Some(idle))? else {
            break; // idle: the sender is done
        };
        if n < 8 {
            bail!("receive completed with {n}");
        }
        let seq = u32::from_be_bytes(buf[4..8].try_into().unwrap());
        writeln!(log, r#"{{"event":"received","kind":"data","seq":{seq}}}"#)?;
        got += 1;
    }
    Ok(())
}
