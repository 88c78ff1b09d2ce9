//! `record --collect ADDR:PORT`: peers' runs received while this recorder
//! records its own. One thread accepts, one thread per connection reads
//! its frames and writes the peer's files (files.rs); none of them holds a
//! capability, and none of them decodes what a peer sent beyond the frame
//! headers and the authenticated hello. Garbage, a wrong token, or a peer
//! beyond the limits ends that connection, said naming its address; the
//! recording and the other peers go on.

use super::auth::{self, Token};
use super::files::{sane_host, PeerFiles};
use super::frame::{self, FrameError, Kind};
use super::live::{PeerFeed, PeerLive};
use super::{MAX_CONNECTIONS, MAX_PEERS};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use xlap_records::run_meta::{PeerArrival, PeerRefusal, PeersCollected};

/// How long a client may take to authenticate, and a peer may stay silent
/// (it pings every few seconds when it has nothing to send).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Refusals listed in run.json (the rest counted).
const REFUSALS_LISTED: usize = 32;

pub struct CollectOptions {
    pub listen: SocketAddr,
    pub token: Token,
    /// The collector's own run directory: peers' directories go inside.
    pub dir: std::path::PathBuf,
    /// Bytes one peer may send in all (run.json, stream, Parquet).
    pub max_bytes_per_peer: u64,
    pub quiet: bool,
    /// `--live`: each peer's stamps decoded as they arrive (live.rs).
    pub live: Option<Arc<PeerFeed>>,
}

/// One peer recorder, by its run id, across its connections.
struct Peer {
    run_id: String,
    host: Option<String>,
    address: String,
    files: PeerFiles,
    said_total: Option<u64>,
    complete: bool,
    connected: bool,
    connections: u32,
    /// Set when the collector stopped: nothing more is written.
    closed: bool,
    error: Option<String>,
    /// To end a connection still open when the collector stops.
    socket: Option<TcpStream>,
    /// Its state in the live view (`--live`).
    live: Option<Arc<PeerLive>>,
}

struct Shared {
    opts: CollectOptions,
    stop: AtomicBool,
    open: AtomicUsize,
    peers: Mutex<Vec<Arc<Mutex<Peer>>>>,
    refused: Mutex<(Vec<PeerRefusal>, u64)>,
    /// Signalled when a peer ends (finish waits on it).
    ended: Condvar,
}

pub struct Collector {
    shared: Arc<Shared>,
    local: SocketAddr,
}

impl Collector {
    /// Listens on `opts.listen` (a usage error when it cannot) and accepts
    /// peers from a thread.
    pub fn start(opts: CollectOptions) -> anyhow::Result<Collector> {
        let listener = TcpListener::bind(opts.listen).map_err(|e| {
            xlap_exit::failure(
                xlap_exit::Code::Usage,
                format!(
                    "--collect {}: cannot listen there ({e}); give a free ADDR:PORT",
                    opts.listen
                ),
            )
        })?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        if !opts.quiet {
            eprintln!("xlap-trace: collecting peer recorders on {}", opts.listen);
        }
        let shared = Arc::new(Shared {
            opts,
            stop: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            peers: Mutex::new(Vec::new()),
            refused: Mutex::new((Vec::new(), 0)),
            ended: Condvar::new(),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("xlap-collect".into())
            .spawn(move || accept_loop(s, listener))?;
        Ok(Collector { shared, local })
    }

    /// The peers' live state, when `--live` asked for it.
    pub fn feed(&self) -> Option<Arc<PeerFeed>> {
        self.shared.opts.live.clone()
    }

    /// Where it listens (the port chosen when 0 was given).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// At the end of this recorder's run: waits up to `wait` for every
    /// peer that connected to send its end, then stops (what arrives later
    /// is not written) and says what each peer's directory holds.
    pub fn finish(self, wait: Duration) -> (PeersCollected, Vec<std::path::PathBuf>) {
        let started = Instant::now();
        let deadline = started + wait;
        let mut peers = self.shared.peers.lock().unwrap();
        while !peers.is_empty()
            && peers.iter().any(|p| !p.lock().unwrap().complete)
            && Instant::now() < deadline
        {
            let left = deadline.saturating_duration_since(Instant::now());
            let step = left.min(Duration::from_millis(200));
            peers = self.shared.ended.wait_timeout(peers, step).unwrap().0;
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(f) = &self.shared.opts.live {
            f.stop();
        }
        let waited_s = started.elapsed().as_secs_f64();
        let mut arrivals = Vec::new();
        let mut dirs = Vec::new();
        for p in peers.iter() {
            let mut p = p.lock().unwrap();
            p.closed = true;
            if let Some(s) = p.socket.take() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            if p.files.has_meta() {
                dirs.push(p.files.dir().to_path_buf());
            }
            arrivals.push(arrival(&p));
        }
        let (refused, refused_total) = self.shared.refused.lock().unwrap().clone();
        let collected = PeersCollected {
            listen: self.shared.opts.listen.to_string(),
            waited_s,
            peers: arrivals,
            refused,
            refused_total,
        };
        (collected, dirs)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(f) = &self.shared.opts.live {
            f.stop();
        }
    }
}

fn arrival(p: &Peer) -> PeerArrival {
    PeerArrival {
        dir: p
            .files
            .dir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        address: p.address.clone(),
        host: p.host.clone(),
        stream_bytes: p.files.held,
        stream_bytes_sent_total: p.said_total,
        complete: p.complete,
        connections: p.connections,
        error: p.error.clone(),
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    // Reading the network needs no capability.
    let _ = crate::capabilities::keep_only(&[]);
    while !shared.stop.load(Ordering::SeqCst) {
        let (conn, addr) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(_) => continue,
        };
        if shared.open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            refuse(&shared, addr, "too many connections at once");
            continue;
        }
        shared.open.fetch_add(1, Ordering::SeqCst);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("xlap-peer".into())
            .spawn(move || {
                serve(&s, conn, addr);
                s.open.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            shared.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Notes a refused connection and says so (the first ones: a flood of
/// connections is counted, not printed).
fn refuse(shared: &Shared, addr: SocketAddr, reason: &str) {
    let mut r = shared.refused.lock().unwrap();
    r.1 += 1;
    if r.0.len() < REFUSALS_LISTED {
        eprintln!("xlap-trace: warning: peer {addr}: {reason}; connection dropped (the recording goes on)");
        r.0.push(PeerRefusal {
            address: addr.to_string(),
            reason: reason.to_string(),
        });
    } else if r.1 == REFUSALS_LISTED as u64 + 1 {
        eprintln!("xlap-trace: warning: more connections refused: counted only (run.json: peers.refused_total)");
    }
}

fn serve(shared: &Shared, mut conn: TcpStream, addr: SocketAddr) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
    let _ = conn.set_write_timeout(Some(HANDSHAKE_TIMEOUT));
    let peer = match handshake(shared, &mut conn, addr) {
        Ok(p) => p,
        Err(Refusal { reason, retry }) => {
            let text = truncate(&reason, 1000).as_bytes();
            let _ = frame::write(&mut conn, Kind::Refuse, &[&[retry as u8], text]);
            refuse(shared, addr, &reason);
            return;
        }
    };
    let _ = conn.set_read_timeout(Some(IDLE_TIMEOUT));
    let result = receive(shared, &peer, &mut conn);
    let mut p = peer.lock().unwrap();
    p.connected = false;
    p.socket = None;
    let name = p.files.dir().display().to_string();
    if let Some(l) = &p.live {
        l.gone(match &result {
            Ok(()) => "its run ended".to_string(),
            Err(e) => format!("connection dropped: {e}"),
        });
    }
    // A run that ended is said once, at the collector's end.
    match result {
        Ok(()) => {}
        Err(e) if !p.closed => {
            eprintln!(
                "xlap-trace: warning: peer {addr} ({name}): {e}; connection dropped, the {} stream bytes that arrived are kept",
                p.files.held
            );
            p.error = Some(e);
        }
        Err(_) => {}
    }
    drop(p);
    shared.ended.notify_all();
}

fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Why a connection is refused, and whether the peer may try again (its
/// run's earlier connection is still open here).
struct Refusal {
    reason: String,
    retry: bool,
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Refusal {
            reason,
            retry: false,
        }
    }
}

impl From<&str> for Refusal {
    fn from(reason: &str) -> Self {
        Refusal::from(reason.to_string())
    }
}

/// What the peer says about itself, once its MAC is checked.
#[derive(serde::Deserialize)]
struct Hello {
    run_id: String,
    host: String,
}

/// A run id may key a peer only as the datasets allow it in a name.
fn sane_run_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:+-".contains(&b))
}

/// Nonce out, hello in, MAC checked, the peer found or made, accepted.
fn handshake(
    shared: &Shared,
    conn: &mut TcpStream,
    addr: SocketAddr,
) -> Result<Arc<Mutex<Peer>>, Refusal> {
    let token = &shared.opts.token;
    let ours = auth::nonce().map_err(|e| format!("no random nonce: {e}"))?;
    frame::write(conn, Kind::Nonce, &[&ours]).map_err(|e| e.to_string())?;
    let (kind, payload) = frame::read(conn).map_err(|e: FrameError| e.to_string())?;
    if kind != Kind::Hello || payload.len() < auth::NONCE + auth::TAG {
        return Err(format!("expected a hello, got a {kind:?} frame").into());
    }
    let (theirs, rest) = payload.split_at(auth::NONCE);
    let (tag, hello_bytes) = rest.split_at(auth::TAG);
    if !token.hello_ok(&ours, theirs, hello_bytes, tag) {
        return Err(
            "wrong token: the MAC does not match the collector's token (the --token-file differs)"
                .into(),
        );
    }
    let hello: Hello = serde_json::from_slice(hello_bytes)
        .map_err(|e| format!("a hello that does not read: {e}"))?;
    if !sane_run_id(&hello.run_id) {
        return Err("a run id that is not 1 to 128 of [A-Za-z0-9._:+-]".into());
    }
    // Marked connected there, under the peers' lock: a second connection
    // of the same run is refused from then on.
    let peer = find_or_add(shared, &hello, addr)?;
    let held = peer.lock().unwrap().files.held;
    let proof = token.accept_tag(theirs, &ours);
    if let Err(e) = frame::write(conn, Kind::Accept, &[&proof, &held.to_be_bytes()]) {
        peer.lock().unwrap().connected = false;
        return Err(e.to_string().into());
    }
    let mut p = peer.lock().unwrap();
    p.connections += 1;
    p.address = addr.to_string();
    p.socket = conn.try_clone().ok();
    if let Some(l) = &p.live {
        l.connected();
    }
    if !shared.opts.quiet {
        eprintln!(
            "xlap-trace: peer {addr} ({}) connected: its run goes to {}{}",
            hello.host.escape_debug(),
            p.files.dir().display(),
            if held > 0 {
                format!(", resuming at {held} bytes")
            } else {
                String::new()
            }
        );
    }
    drop(p);
    Ok(peer)
}

/// The peer of this run id (a reconnection), or a new one within the cap.
fn find_or_add(
    shared: &Shared,
    hello: &Hello,
    addr: SocketAddr,
) -> Result<Arc<Mutex<Peer>>, Refusal> {
    let mut peers = shared.peers.lock().unwrap();
    if let Some(p) = peers
        .iter()
        .find(|p| p.lock().unwrap().run_id == hello.run_id)
    {
        let mut g = p.lock().unwrap();
        if g.connected {
            // The same run again (it holds the token): its connection here
            // is one the network lost without telling us. Closed now; the
            // peer's next attempt resumes.
            if let Some(old) = g.socket.take() {
                let _ = old.shutdown(std::net::Shutdown::Both);
            }
            return Err(Refusal {
                reason: format!(
                    "run {} is still connected here: that connection is closed now, try again",
                    hello.run_id
                ),
                retry: true,
            });
        }
        if g.closed || g.complete {
            return Err(format!("run {} has ended here", hello.run_id).into());
        }
        g.connected = true;
        drop(g);
        return Ok(p.clone());
    }
    if peers.len() >= MAX_PEERS {
        return Err(format!("more than {MAX_PEERS} peers").into());
    }
    if shared.stop.load(Ordering::SeqCst) {
        return Err("the collector has ended its run".into());
    }
    let host = sane_host(&hello.host).map(String::from);
    let files =
        PeerFiles::create(&shared.opts.dir, peers.len() + 1, host.as_deref()).map_err(|e| {
            format!(
                "cannot make its run directory in {}: {e}",
                shared.opts.dir.display()
            )
        })?;
    let peer = Arc::new(Mutex::new(Peer {
        run_id: hello.run_id.clone(),
        host,
        address: addr.to_string(),
        files,
        said_total: None,
        complete: false,
        connected: true,
        connections: 0,
        closed: false,
        error: None,
        socket: None,
        live: None,
    }));
    // Its decoder tails the stream file made above.
    if let Some(feed) = &shared.opts.live {
        let live = feed.add(peer.lock().unwrap().files.dir());
        peer.lock().unwrap().live = Some(live);
    }
    peers.push(peer.clone());
    Ok(peer)
}

/// The peer's frames until its end (Ok) or an error (the connection ends).
fn receive(shared: &Shared, peer: &Mutex<Peer>, conn: &mut TcpStream) -> Result<(), String> {
    let cap = shared.opts.max_bytes_per_peer;
    loop {
        let (kind, payload) = frame::read(conn).map_err(|e| e.to_string())?;
        let mut p = peer.lock().unwrap();
        if p.closed {
            return Err("the collector has ended its run".into());
        }
        if p.files.total + payload.len() as u64 > cap {
            return Err(format!(
                "beyond the {cap} bytes a peer may send (--max-size)"
            ));
        }
        match kind {
            Kind::Ping => {}
            Kind::Meta => p
                .files
                .write_meta(&payload)
                .map_err(|e| format!("cannot write its run.json: {e}"))?,
            Kind::Stream | Kind::Parquet => {
                let (offset, bytes) =
                    frame::split_u64(&payload).ok_or("a data frame without its offset")?;
                if kind == Kind::Stream {
                    p.files.append_stream(offset, bytes)?;
                } else {
                    p.files.append_parquet(offset, bytes)?;
                }
            }
            Kind::End => {
                let (stream, rest) = frame::split_u64(&payload).ok_or("an end without sizes")?;
                let (parquet, _) = frame::split_u64(rest).ok_or("an end without sizes")?;
                let parquet_ok = p.files.end_parquet(parquet);
                p.said_total = Some(stream);
                p.complete = parquet_ok && p.files.held == stream && p.files.has_meta();
                if p.complete {
                    // What an earlier connection of it met is mended.
                    p.error = None;
                }
                let done = [&p.files.held.to_be_bytes()[..], &[p.complete as u8]];
                let _ = frame::write(conn, Kind::Done, &done);
                return Ok(());
            }
            other => return Err(format!("a {other:?} frame a peer does not send")),
        }
    }
}
