//! A small async UDP echo on tokio's multi-threaded runtime: the server's
//! reads happen on runtime worker threads that wait in epoll, as in most
//! Rust network services. Datagrams use the example protocol's layout
//! (kind u8 at 0, seq u32 big-endian at 4), so `xlap-trace` keys them with
//! its default preset. Both ends log JSON lines (their own account).
//!
//! ```text
//! xlap-tokio-echo server BIND COUNT LOG READY_FILE
//! xlap-tokio-echo client BIND DEST COUNT PERIOD_US LOG START_FILE
//! ```
//! The server echoes COUNT datagrams (or stops 3 s after the last one);
//! the client sends COUNT, one every PERIOD_US, each awaited (1 s) before
//! the next. Exit codes: 0 done, 1 failure, 2 usage.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::net::UdpSocket;

const LEN: usize = 64;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("server") if args.len() == 5 => server(&args[1..]).await,
        Some("client") if args.len() == 7 => client(&args[1..]).await,
        _ => {
            eprintln!("usage: xlap-tokio-echo server BIND COUNT LOG READY_FILE | client BIND DEST COUNT PERIOD_US LOG START_FILE");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xlap-tokio-echo: {e:#}");
        std::process::exit(1);
    }
}

fn seq_of(buf: &[u8]) -> Result<u32> {
    if buf.len() < 8 {
        bail!("a datagram of {} bytes", buf.len());
    }
    Ok(u32::from_be_bytes(buf[4..8].try_into()?))
}

async fn server(a: &[String]) -> Result<()> {
    let socket = UdpSocket::bind(a[0].parse::<SocketAddr>()?).await?;
    let count: u32 = a[1].parse()?;
    let mut log = std::fs::File::create(&a[2])?;
    std::fs::write(&a[3], format!("{}\n", std::process::id()))?;
    let mut buf = [0u8; 2048];
    for i in 0..count {
        // The first datagram may be a while coming (the client waits for a
        // tracer to attach, seconds on a loaded machine); then 3 s of
        // silence mean the client is done.
        let wait = Duration::from_secs(if i == 0 { 60 } else { 3 });
        let Ok(got) = tokio::time::timeout(wait, socket.recv_from(&mut buf)).await else {
            break;
        };
        let (n, from) = got?;
        let seq = seq_of(&buf[..n])?;
        writeln!(log, r#"{{"event":"received","kind":"data","seq":{seq}}}"#)?;
        socket.send_to(&buf[..n], from).await?;
    }
    Ok(())
}

async fn client(a: &[String]) -> Result<()> {
    let socket = UdpSocket::bind(a[0].parse::<SocketAddr>()?).await?;
    socket.connect(a[1].parse::<SocketAddr>()?).await?;
    let count: u32 = a[2].parse()?;
    let period = Duration::from_micros(a[3].parse()?);
    let mut log = std::fs::File::create(&a[4])?;
    while !Path::new(&a[5]).exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut buf = [0u8; 2048];
    for seq in 0..count {
        let mut out = [0u8; LEN];
        out[0] = 1;
        out[4..8].copy_from_slice(&seq.to_be_bytes());
        socket.send(&out).await?;
        writeln!(log, r#"{{"event":"sent","kind":"data","seq":{seq}}}"#)?;
        let n = tokio::time::timeout(Duration::from_secs(1), socket.recv(&mut buf))
            .await
            .with_context(|| format!("no echo of seq {seq} within 1 s"))??;
        let echoed = seq_of(&buf[..n])?;
        writeln!(log, r#"{{"event":"echoed","kind":"data","seq":{echoed}}}"#)?;
        tokio::time::sleep(period).await;
    }
    Ok(())
}
