//! `record --to HOST:PORT`: this run streamed to a collector while it is
//! recorded. A thread of its own (no capability, lowest priority) tails
//! the run's stamps.arrows on disk and sends what the recorder has
//! written; the recorder never waits for it, so a slow or dead collector
//! costs the capture nothing: the sender falls behind in the file, and
//! what did not arrive by the end is counted (run.json `peer_link`). A
//! broken connection is made again, resuming at the byte count the
//! collector holds for this run.

use super::auth::{self, Token};
use super::frame::{self, Kind, MAX_CHUNK};
use std::io::{Read, Seek, SeekFrom};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use xlap_records::run_meta::{PeerLink, RunMeta};
use xlap_records::RunDir;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const IO_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Well within the collector's idle timeout (collector.rs).
const PING_EVERY: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

pub struct SendOptions {
    pub to: String,
    pub token: Token,
    pub dir: PathBuf,
    pub quiet: bool,
}

struct Shared {
    opts: SendOptions,
    /// The recorder's run is complete: send the rest and end.
    finishing: AtomicBool,
    deadline: Mutex<Option<Instant>>,
    link: Mutex<PeerLink>,
    done: (Mutex<bool>, Condvar),
}

pub struct Sender {
    shared: Arc<Shared>,
}

/// Why a connection ended before the run did.
enum Broken {
    /// Worth trying again (the collector away, a timeout).
    Retry(String),
    /// Not (the token refused).
    Fatal(String),
}

impl From<std::io::Error> for Broken {
    fn from(e: std::io::Error) -> Self {
        Broken::Retry(e.to_string())
    }
}

impl Sender {
    pub fn start(opts: SendOptions) -> std::io::Result<Sender> {
        let shared = Arc::new(Shared {
            link: Mutex::new(PeerLink {
                to: opts.to.clone(),
                state: "never-connected".into(),
                ..PeerLink::default()
            }),
            opts,
            finishing: AtomicBool::new(false),
            deadline: Mutex::new(None),
            done: (Mutex::new(false), Condvar::new()),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("xlap-send".into())
            .spawn(move || {
                run(&s);
                *s.done.0.lock().unwrap() = true;
                s.done.1.notify_all();
            })?;
        Ok(Sender { shared })
    }

    /// After the run is complete on disk: lets the thread send the rest
    /// for at most `wait`, then says what arrived.
    pub fn finish(self, wait: Duration) -> PeerLink {
        let deadline = Instant::now() + wait;
        *self.shared.deadline.lock().unwrap() = Some(deadline);
        self.shared.finishing.store(true, Ordering::SeqCst);
        let (lock, cv) = &self.shared.done;
        let mut done = lock.lock().unwrap();
        // A little beyond the deadline: the thread's own checks end it.
        while !*done && Instant::now() < deadline + Duration::from_secs(1) {
            done = cv.wait_timeout(done, POLL).unwrap().0;
        }
        drop(done);
        let mut link = self.shared.link.lock().unwrap().clone();
        link.stream_bytes = std::fs::metadata(RunDir::new(&self.shared.opts.dir).stamps_stream())
            .map(|m| m.len())
            .unwrap_or(0);
        link.bytes_not_delivered = link.stream_bytes.saturating_sub(link.bytes_delivered);
        if link.state != "refused" && link.connections > 0 {
            link.state = if link.final_delivered && link.bytes_not_delivered == 0 {
                "delivered".into()
            } else {
                "incomplete".into()
            };
        }
        link
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        // A run that failed: the thread stops at its next check.
        self.shared.finishing.store(true, Ordering::SeqCst);
        let mut d = self.shared.deadline.lock().unwrap();
        d.get_or_insert_with(Instant::now);
    }
}

impl Shared {
    fn past_deadline(&self) -> bool {
        self.deadline
            .lock()
            .unwrap()
            .is_some_and(|d| Instant::now() >= d)
    }

    fn say(&self, text: &str) {
        if !self.opts.quiet {
            eprintln!("xlap-trace: {text}");
        }
    }
}

/// The thread: waits for this run's run.json, then connects (again) until
/// the run's end is delivered, refused, or out of time.
fn run(s: &Shared) {
    let _ = crate::capabilities::keep_only(&[]);
    // SAFETY: lowers this thread's own priority only.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    let dir = RunDir::new(&s.opts.dir);
    let Some(meta) = wait_for_run(s, &dir) else {
        s.link.lock().unwrap().error = Some("the run never started".into());
        return;
    };
    let mut last_error = None;
    while !s.past_deadline() {
        match connect_and_send(s, &dir, &meta) {
            Ok(()) => return,
            Err(Broken::Fatal(e)) => {
                eprintln!(
                    "xlap-trace: warning: {}: {e}; this run is recorded here only",
                    s.opts.to
                );
                let mut l = s.link.lock().unwrap();
                l.state = "refused".into();
                l.error = Some(e);
                return;
            }
            Err(Broken::Retry(e)) => {
                if last_error.as_ref() != Some(&e) {
                    eprintln!("xlap-trace: warning: peer link to {}: {e}; trying again every {} s (the recording goes on)", s.opts.to, RETRY_EVERY.as_secs());
                }
                s.link.lock().unwrap().error = Some(e.clone());
                last_error = Some(e);
            }
        }
        let until = Instant::now() + RETRY_EVERY;
        while Instant::now() < until && !s.past_deadline() {
            std::thread::sleep(POLL);
        }
    }
}

/// This recorder's run.json, once it says the run is ours (an old run in
/// the directory is not).
fn wait_for_run(s: &Shared, dir: &RunDir) -> Option<RunMeta> {
    loop {
        let ours = xlap_records::run_file::read_json_text(&dir.meta())
            .ok()
            .and_then(|t| RunMeta::from_json(&t).ok())
            .filter(|m| {
                m.recorder
                    .as_ref()
                    .is_some_and(|r| r.pid == std::process::id())
            });
        if ours.is_some() {
            return ours;
        }
        if s.finishing.load(Ordering::SeqCst) {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// One connection: handshake, run.json, the stream as it grows, and at
/// the end the rest, the final run.json and stamps.parquet.
fn connect_and_send(s: &Shared, dir: &RunDir, meta: &RunMeta) -> Result<(), Broken> {
    let mut conn = connect(&s.opts.to)?;
    let held = handshake(s, &mut conn, meta)?;
    {
        let mut l = s.link.lock().unwrap();
        l.connections += 1;
        l.bytes_delivered = l.bytes_delivered.max(held);
        l.error = None;
    }
    s.say(&format!(
        "streaming this run to {}{}",
        s.opts.to,
        if held > 0 {
            format!(" (resuming at {held} bytes)")
        } else {
            String::new()
        }
    ));
    frame::write(&mut conn, Kind::Meta, &[&read_file(&dir.meta())?])?;
    let mut stream = std::fs::File::open(dir.stamps_stream())?;
    let mut offset = held;
    let mut last_sent = Instant::now();
    let mut buf = vec![0u8; MAX_CHUNK];
    loop {
        if s.past_deadline() {
            return Err(Broken::Retry("out of time (--peer-wait)".into()));
        }
        let finishing = s.finishing.load(Ordering::SeqCst);
        stream.seek(SeekFrom::Start(offset))?;
        let n = stream.read(&mut buf)?;
        if n > 0 {
            frame::write(&mut conn, Kind::Stream, &[&offset.to_be_bytes(), &buf[..n]])?;
            offset += n as u64;
            s.link.lock().unwrap().bytes_sent += n as u64;
            last_sent = Instant::now();
        } else if finishing {
            // The recorder had finished before this read found the end:
            // the stream is whole.
            return send_end(s, &mut conn, dir, offset);
        } else {
            if last_sent.elapsed() >= PING_EVERY {
                frame::write(&mut conn, Kind::Ping, &[])?;
                last_sent = Instant::now();
            }
            std::thread::sleep(POLL);
        }
    }
}

fn connect(to: &str) -> Result<TcpStream, Broken> {
    let addrs: Vec<_> = to
        .to_socket_addrs()
        .map_err(|e| Broken::Retry(format!("cannot resolve {to}: {e}")))?
        .collect();
    let mut last = Broken::Retry(format!("{to} resolves to no address"));
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(c) => {
                c.set_read_timeout(Some(IO_TIMEOUT))?;
                c.set_write_timeout(Some(IO_TIMEOUT))?;
                let _ = c.set_nodelay(true);
                return Ok(c);
            }
            Err(e) => last = Broken::Retry(format!("cannot connect to {a}: {e}")),
        }
    }
    Err(last)
}

/// Answers the collector's nonce; returns the stream bytes it holds.
fn handshake(s: &Shared, conn: &mut TcpStream, meta: &RunMeta) -> Result<u64, Broken> {
    let garbled = |e: frame::FrameError| Broken::Fatal(format!("not an xlap-trace collector: {e}"));
    let (kind, theirs) = frame::read(conn).map_err(garbled)?;
    if kind != Kind::Nonce || theirs.len() != auth::NONCE {
        return Err(Broken::Fatal(format!(
            "not an xlap-trace collector (a {kind:?} frame first)"
        )));
    }
    let ours = auth::nonce()?;
    let hello = serde_json::json!({ "run_id": meta.run_id, "host": meta.host }).to_string();
    let tag = s.opts.token.hello_tag(&theirs, &ours, hello.as_bytes());
    frame::write(conn, Kind::Hello, &[&ours, &tag, hello.as_bytes()])?;
    match frame::read(conn).map_err(|e| Broken::Retry(e.to_string()))? {
        (Kind::Accept, p) if p.len() == auth::TAG + 8 => {
            let (proof, held) = p.split_at(auth::TAG);
            if !s.opts.token.accept_ok(&ours, &theirs, proof) {
                return Err(Broken::Fatal(
                    "the collector does not prove it holds our token (--token-file differs?)"
                        .into(),
                ));
            }
            Ok(u64::from_be_bytes(held.try_into().expect("8 bytes")))
        }
        (Kind::Refuse, p) if !p.is_empty() => {
            let why = format!(
                "the collector refused this recorder: {}",
                String::from_utf8_lossy(&p[1..])
            );
            // Its first byte: whether trying again may succeed.
            Err(if p[0] == 1 {
                Broken::Retry(why)
            } else {
                Broken::Fatal(why)
            })
        }
        (other, _) => Err(Broken::Fatal(format!(
            "not an xlap-trace collector (a {other:?} frame)"
        ))),
    }
}

fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let bytes = std::fs::read(path)?;
    if bytes.len() > frame::MAX_META {
        return Err(std::io::Error::other(format!(
            "{} is larger than {} bytes",
            path.display(),
            frame::MAX_META
        )));
    }
    Ok(bytes)
}

/// The final run.json, stamps.parquet, the sizes; then the collector's
/// count of what it holds.
fn send_end(
    s: &Shared,
    conn: &mut TcpStream,
    dir: &RunDir,
    stream_bytes: u64,
) -> Result<(), Broken> {
    frame::write(conn, Kind::Meta, &[&read_file(&dir.meta())?])?;
    let mut parquet = std::fs::File::open(dir.stamps())?;
    let mut buf = vec![0u8; MAX_CHUNK];
    let mut offset = 0u64;
    loop {
        if s.past_deadline() {
            return Err(Broken::Retry(
                "out of time sending stamps.parquet (--peer-wait)".into(),
            ));
        }
        let n = parquet.read(&mut buf)?;
        if n == 0 {
            break;
        }
        frame::write(conn, Kind::Parquet, &[&offset.to_be_bytes(), &buf[..n]])?;
        offset += n as u64;
    }
    frame::write(
        conn,
        Kind::End,
        &[&stream_bytes.to_be_bytes(), &offset.to_be_bytes()],
    )?;
    match frame::read(conn).map_err(|e| Broken::Retry(format!("no answer to the end: {e}")))? {
        (Kind::Done, p) if p.len() == 9 => {
            let held = u64::from_be_bytes(p[..8].try_into().expect("8 bytes"));
            let mut l = s.link.lock().unwrap();
            l.bytes_delivered = held;
            l.final_delivered = p[8] == 1;
            Ok(())
        }
        (other, _) => Err(Broken::Retry(format!(
            "a {other:?} frame instead of the collector's count"
        ))),
    }
}
