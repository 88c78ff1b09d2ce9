//! The two ends of the link in one process, without BPF: a run directory
//! whose stream grows, sent through a proxy that cuts the first connection
//! mid-frame. The collector ends up with the sender's bytes exactly, the
//! second connection resuming where the first left off.

use super::auth::Token;
use super::collector::{CollectOptions, Collector};
use super::sender::{SendOptions, Sender};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;
use xlap_records::run_meta::RunMeta;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xlap-peer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Forwards connections to `to`; the first one's client bytes only up to
/// `cut`, then both sides are closed (a network that failed mid-frame).
fn proxy(to: SocketAddr, cut: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for (n, c) in l.incoming().enumerate() {
            let client = c.unwrap();
            let server = TcpStream::connect(to).unwrap();
            let limit = if n == 0 { cut } else { usize::MAX };
            pump(
                client.try_clone().unwrap(),
                server.try_clone().unwrap(),
                limit,
            );
            pump(server, client, usize::MAX);
        }
    });
    addr
}

fn pump(mut from: TcpStream, mut to: TcpStream, limit: usize) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut sent = 0;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n.min(limit - sent),
            };
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            sent += n;
            if sent >= limit {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}

/// A run directory as the recorder leaves it while running (run.json
/// naming this process as its recorder).
fn fake_run(dir: &Path) {
    let meta = RunMeta {
        recorder: Some(crate::runmeta::this_recorder()),
        run_id: "unit-run".into(),
        host: "unit-host".into(),
        boot_id: "b".into(),
        ..RunMeta::default()
    };
    meta.write(&dir.join("run.json")).unwrap();
    std::fs::write(dir.join("stamps.arrows"), b"").unwrap();
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_cut_connection_resumes_where_the_collector_was() {
    let (src, dst) = (tmp("src"), tmp("dst"));
    fake_run(&src);
    let token = Token::from_text("a token for the unit test").unwrap();
    let collector = Collector::start(CollectOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        token: token.clone(),
        dir: dst.clone(),
        max_bytes_per_peer: 1 << 30,
        quiet: true,
        live: None,
    })
    .unwrap();
    let via = proxy(collector.local_addr(), 700_000);
    let sender = Sender::start(SendOptions {
        to: via.to_string(),
        token,
        dir: src.clone(),
        quiet: true,
    })
    .unwrap();
    // The stream grows as a recorder's does, in pieces.
    let stream = bytes(3 << 20, 7);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(src.join("stamps.arrows"))
        .unwrap();
    for piece in stream.chunks(256 << 10) {
        f.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    let parquet = bytes(1_500_000, 3);
    std::fs::write(src.join("stamps.parquet"), &parquet).unwrap();
    let link = sender.finish(Duration::from_secs(30));
    let (collected, dirs) = collector.finish(Duration::from_secs(5));
    assert_eq!(link.state, "delivered", "{link:?}");
    assert_eq!(link.connections, 2, "{link:?}");
    assert_eq!(link.bytes_delivered, stream.len() as u64);
    let arrival = &collected.peers[0];
    assert!(arrival.complete && arrival.connections == 2, "{arrival:?}");
    assert_eq!(arrival.dir, "peer-1-unit-host");
    assert_eq!(dirs, vec![dst.join("peer-1-unit-host")]);
    assert_eq!(
        std::fs::read(dirs[0].join("stamps.arrows")).unwrap(),
        stream
    );
    assert_eq!(
        std::fs::read(dirs[0].join("stamps.parquet")).unwrap(),
        parquet
    );
    assert!(!dirs[0].join("stamps.parquet.part").exists());
    for d in [src, dst] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn a_collector_that_is_not_there_is_counted_not_waited_for() {
    let src = tmp("nowhere");
    fake_run(&src);
    std::fs::write(src.join("stamps.arrows"), bytes(5000, 1)).unwrap();
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sender = Sender::start(SendOptions {
        to: format!("127.0.0.1:{port}"),
        token: Token::from_text("a token for the unit test").unwrap(),
        dir: src.clone(),
        quiet: true,
    })
    .unwrap();
    let link = sender.finish(Duration::from_millis(300));
    assert_eq!(link.state, "never-connected", "{link:?}");
    assert_eq!(link.stream_bytes, 5000);
    assert_eq!(link.bytes_not_delivered, 5000);
    assert!(link.error.is_some());
    std::fs::remove_dir_all(src).unwrap();
}
