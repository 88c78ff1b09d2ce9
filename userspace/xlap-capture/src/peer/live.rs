//! `record --collect --live`: each peer's stamps as they arrive, for the
//! live view's cross-host latency. The peer's stream is decoded by a child
//! of this recorder (`xlap-trace peer-decode`, confined: no capability,
//! no_new_privs, no file it may open, a memory ceiling) that tails the
//! peer's stamps.arrows on its stdin and writes fixed-size records
//! (xlap_records::peer_stamps) on its stdout; a thread here reads them,
//! checks each, and queues them for the view, at most [`QUEUE`] per peer
//! (beyond, counted). The capture never waits on any of it: a slow decoder
//! falls behind in the file, a dead one is said in the view.

use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use xlap_records::peer_stamps::{PeerStamp, RECORD};

/// The hidden command the decoder runs as.
pub const DECODE_COMMAND: &str = "peer-decode";
/// Stamps waiting for the view per peer (the view takes them every
/// second): beyond, the newest are dropped and counted. 32 bytes each:
/// 8 MiB per peer at most, 64 MiB for the 8 peers a collector takes.
pub const QUEUE: usize = 1 << 18;
/// The decoder's memory ceiling (xlap_exit::memory): an Arrow message
/// claiming more ends the decoder, not the recorder.
const DECODER_MEMORY: &str = "256MiB";

/// What the view reads of one peer.
#[derive(Default)]
pub struct PeerState {
    pub queue: VecDeque<PeerStamp>,
    /// Records read from the decoder, and those refused (not a record)
    /// or dropped (the queue full).
    pub arrived: u64,
    pub invalid: u64,
    pub queue_dropped: u64,
    pub connected: bool,
    /// Why the peer is not connected (its end, or its connection's error).
    pub gone: Option<String>,
    /// Why its live decoding stopped.
    pub decoder: Option<String>,
}

pub struct PeerLive {
    /// Its directory's name (`peer-N-HOST`).
    pub name: String,
    pub state: Mutex<PeerState>,
    child: Mutex<Option<Child>>,
}

/// The peers' live state, shared by the collector and the view.
#[derive(Default)]
pub struct PeerFeed {
    pub peers: Mutex<Vec<Arc<PeerLive>>>,
}

impl std::fmt::Debug for PeerFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerFeed")
    }
}

impl PartialEq for PeerFeed {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl PeerFeed {
    /// A new peer whose stream grows in `dir`: its decoder started. A
    /// decoder that cannot start is said in the view; the peer's run is
    /// still written.
    pub fn add(&self, dir: &Path) -> Arc<PeerLive> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let live = Arc::new(PeerLive {
            name,
            state: Mutex::new(PeerState {
                connected: true,
                ..Default::default()
            }),
            child: Mutex::new(None),
        });
        if let Err(e) = start_decoder(&live, dir) {
            live.state.lock().unwrap().decoder = Some(format!("cannot decode it live: {e}"));
        }
        self.peers.lock().unwrap().push(live.clone());
        live
    }

    /// A peer without a decoder, its stamps queued by the caller.
    #[cfg(test)]
    pub(crate) fn add_fed(&self, name: &str) -> Arc<PeerLive> {
        let live = Arc::new(PeerLive {
            name: name.into(),
            state: Mutex::new(PeerState {
                connected: true,
                ..Default::default()
            }),
            child: Mutex::new(None),
        });
        self.peers.lock().unwrap().push(live.clone());
        live
    }

    /// At the collector's end: the decoders stopped.
    pub fn stop(&self) {
        for p in self.peers.lock().unwrap().iter() {
            if let Some(mut c) = p.child.lock().unwrap().take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn start_decoder(live: &Arc<PeerLive>, dir: &Path) -> std::io::Result<()> {
    let stream = std::fs::File::open(dir.join(xlap_records::run_dir::STAMPS_STREAM))?;
    let mut child = Command::new("/proc/self/exe")
        .arg(DECODE_COMMAND)
        .env(xlap_exit::memory::CEILING_VAR, DECODER_MEMORY)
        .stdin(stream)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    *live.child.lock().unwrap() = Some(child);
    let l = live.clone();
    std::thread::Builder::new()
        .name("xlap-peer-live".into())
        .spawn(move || {
            let _ = crate::capabilities::keep_only(&[]);
            read_records(&l, &mut out);
            // Its first line says why it ended (bounded: the child is not
            // trusted either).
            let mut why = Vec::new();
            let _ = (&mut err).take(512).read_to_end(&mut why);
            let why = String::from_utf8_lossy(&why);
            let why = why.lines().next().unwrap_or("").trim();
            // A stream that ended (the peer's run complete) is no news;
            // the collector's stop (a kill) is not said either: the view
            // has ended by then.
            let status = l.child.lock().unwrap().as_mut().and_then(|c| c.wait().ok());
            if status.is_some_and(|s| s.success()) {
                return;
            }
            let mut s = l.state.lock().unwrap();
            if s.decoder.is_none() {
                s.decoder = Some(if why.is_empty() {
                    "its live decoding ended".into()
                } else {
                    format!("its live decoding ended: {}", why.escape_debug())
                });
            }
        })?;
    Ok(())
}

fn read_records(live: &PeerLive, out: &mut impl Read) {
    let mut buf = vec![0u8; RECORD * 4096];
    let mut have = 0;
    loop {
        let n = match out.read(&mut buf[have..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        have += n;
        let whole = have / RECORD * RECORD;
        let mut s = live.state.lock().unwrap();
        for r in buf[..whole].chunks_exact(RECORD) {
            match PeerStamp::decode(r.try_into().expect("RECORD bytes")) {
                None => s.invalid += 1,
                Some(_) if s.queue.len() >= QUEUE => {
                    s.arrived += 1;
                    s.queue_dropped += 1;
                }
                Some(p) => {
                    s.arrived += 1;
                    s.queue.push_back(p);
                }
            }
        }
        drop(s);
        buf.copy_within(whole..have, 0);
        have -= whole;
    }
}

impl PeerLive {
    pub fn connected(&self) {
        let mut s = self.state.lock().unwrap();
        s.connected = true;
        s.gone = None;
    }

    pub fn gone(&self, why: String) {
        let mut s = self.state.lock().unwrap();
        s.connected = false;
        s.gone = Some(why);
    }
}
