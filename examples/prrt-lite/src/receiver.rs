//! The receiving end: a receive thread that handles packets, rebuilds losses
//! from parity and sends feedback, and an application thread that delivers
//! data in order.
//!
//! With `udp_gro` the socket asks the kernel to coalesce datagrams (UDP GRO);
//! one `recvmsg` may then bring several, which are split at the reported
//! segment size and handled one by one exactly as single receives are.

use crate::clock::now_ns;
use crate::fec;
use crate::inject::{Injections, Stage};
use crate::log::EventLog;
use crate::sender::payload_pattern;
use crate::udp;
use crate::wire::{Feedback, Header, Kind, FEEDBACK_LEN, HEADER_LEN};
use crate::Markers;
use anyhow::{Context, Result};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    pub bind: SocketAddr,
    /// A data packet must be delivered within this time after it was sent;
    /// a missing packet is given up once later data has waited this long.
    pub deadline_ns: u64,
    pub feedback_interval_ns: u64,
    /// Number of data packets the sender will send, when known.
    pub expect: Option<u32>,
    pub idle_exit: Duration,
    pub first_packet_timeout: Duration,
    pub inject: Injections,
    pub ready_file: Option<PathBuf>,
    /// Enable UDP GRO on the socket and split coalesced receives.
    pub udp_gro: bool,
    /// How the socket is read.
    pub recv_mode: udp::RecvMode,
    /// Bind into an SO_REUSEPORT group.
    pub reuseport: bool,
    /// Fork after binding; the child receives.
    pub fork: bool,
    /// A second socket, for the second path of a redundant sender.
    pub bind2: Option<SocketAddr>,
}

/// Room for any single UDP datagram (at most 65 527 bytes of payload).
const DATAGRAM_BUFFER_BYTES: usize = 65_536;

/// Room per datagram of a recvmmsg (the example's datagrams are small; a
/// longer one is truncated, and malformed).
const MMSG_SLOT_BYTES: usize = 2048;

/// Room for one GRO receive: the kernel coalesces up to 64 segments into at
/// most the device's gro_max_size (64 KiB unless raised for BIG TCP, which
/// allows up to 512 KiB). A receive that still does not fit is reported as
/// truncated (malformed), never split wrongly.
const GRO_BUFFER_BYTES: usize = 512 << 10;

/// A real-time receiver keeps a burst of a few hundred milliseconds in its
/// socket rather than dropping it while its thread is descheduled.
const RECEIVE_BUFFER_BYTES: i32 = 4 << 20;

/// Asks for a larger socket receive buffer: SO_RCVBUFFORCE (root) ignores
/// net.core.rmem_max; SO_RCVBUF is capped by it.
fn enlarge_receive_buffer(socket: &UdpSocket, bytes: i32) {
    use std::os::fd::AsRawFd;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with an i32 option value on our own socket.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&bytes as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
}

/// A data packet ready for the application.
struct Ready {
    seq: u32,
    send_time_ns: u64,
    recovered: bool,
    /// The path whose copy was kept (two paths only; none when rebuilt).
    path: Option<u8>,
}

#[derive(Default)]
struct Block {
    data: BTreeMap<u8, (u64, Vec<u8>)>,
    /// (data packets covered, parity)
    parity: Option<(u8, Vec<u8>)>,
}

#[derive(Default)]
struct Counters {
    received_data: u64,
    received_parity: u64,
    duplicates: u64,
    recovered: u64,
    lost: u64,
    malformed: u64,
    feedback_sent: u64,
}

/// In-order delivery with FEC and a deadline.
struct Reassembly {
    k: u32,
    next: u32,
    pending: BTreeMap<u32, Ready>,
    blocks: HashMap<u32, Block>,
    gap_since_ns: Option<u64>,
    highest_seq: Option<u32>,
}

impl Reassembly {
    fn block_mut(&mut self, block: u32) -> &mut Block {
        self.blocks.entry(block).or_default()
    }

    /// Rebuilds the block's single missing data packet when possible.
    fn try_recover(&mut self, block_no: u32, log: &EventLog, counters: &mut Counters) {
        let k = self.k;
        let Some(block) = self.blocks.get(&block_no) else {
            return;
        };
        let Some((covered, parity)) = &block.parity else {
            return;
        };
        if block.data.len() + 1 != *covered as usize {
            return;
        }
        let missing = (0..*covered)
            .find(|i| !block.data.contains_key(i))
            .expect("one index is missing");
        let seq = block_no * k + missing as u32;
        let (send_time_ns, payload) =
            fec::recover(parity, block.data.values().map(|(t, p)| (*t, p.as_slice())));
        if seq < self.next {
            // Already given up at its deadline: the parity came too late.
            log.record(json!({"event": "recovered_too_late", "seq": seq}));
            return;
        }
        let intact = payload == payload_pattern(seq, payload.len());
        counters.recovered += 1;
        log.record(json!({"event": "recovered", "seq": seq, "intact": intact}));
        let block = self.blocks.get_mut(&block_no).expect("block exists");
        block.data.insert(missing, (send_time_ns, payload));
        self.pending.insert(
            seq,
            Ready {
                seq,
                send_time_ns,
                recovered: true,
                path: None,
            },
        );
    }

    /// Hands every deliverable packet to `deliver`; gives up a missing packet
    /// once later data has waited for it longer than the deadline.
    fn drain(
        &mut self,
        now: u64,
        deadline_ns: u64,
        give_up_all_before: Option<u32>,
        mut deliver: impl FnMut(Ready),
        mut lose: impl FnMut(u32),
    ) {
        loop {
            if let Some(ready) = self.pending.remove(&self.next) {
                deliver(ready);
                self.advance();
                continue;
            }
            let behind = give_up_all_before.is_some_and(|end| self.next < end);
            if self.pending.is_empty() && !behind {
                self.gap_since_ns = None;
                return;
            }
            let since = *self.gap_since_ns.get_or_insert(now);
            if behind || self.unrecoverable(self.next) || now.saturating_sub(since) > deadline_ns {
                lose(self.next);
                self.advance();
                continue;
            }
            return;
        }
    }

    /// The block's parity is here but two or more of its data packets are
    /// missing: waiting for the deadline cannot help (unless reordered
    /// packets are still in flight, which this protocol does not wait for).
    fn unrecoverable(&self, seq: u32) -> bool {
        self.blocks.get(&(seq / self.k)).is_some_and(|b| {
            b.parity
                .as_ref()
                .is_some_and(|(covered, _)| b.data.len() + 1 < *covered as usize)
        })
    }

    fn advance(&mut self) {
        self.next += 1;
        self.gap_since_ns = None;
        // Forget blocks wholly behind the delivery point (bounded memory).
        let k = self.k;
        let next = self.next;
        if next.is_multiple_of(k) {
            self.blocks.retain(|b, _| (b + 1) * k > next);
        }
    }
}

pub fn run<M: Markers>(cfg: &ReceiverConfig, log: &EventLog) -> Result<()> {
    let socket = if cfg.reuseport {
        udp::reuseport_socket(cfg.bind)
    } else {
        UdpSocket::bind(cfg.bind)
    }
    .with_context(|| format!("cannot bind the receiver to {}", cfg.bind))?;
    socket.set_read_timeout(Some(Duration::from_millis(5)))?;
    log.record(json!({
        "event": "socket", "local": socket.local_addr()?.to_string(),
        "cookie": udp::cookie(&socket)?, "pid": std::process::id(),
    }));
    enlarge_receive_buffer(&socket, RECEIVE_BUFFER_BYTES);
    let second = match cfg.bind2 {
        None => None,
        Some(addr) => {
            anyhow::ensure!(
                cfg.recv_mode == udp::RecvMode::Recvfrom,
                "--bind2 works with the default --recv-mode only"
            );
            let second = UdpSocket::bind(addr)
                .with_context(|| format!("cannot bind the second path's socket to {addr}"))?;
            log.record(json!({
                "event": "socket", "local": second.local_addr()?.to_string(), "path": 2,
                "cookie": udp::cookie(&second)?, "pid": std::process::id(),
            }));
            enlarge_receive_buffer(&second, RECEIVE_BUFFER_BYTES);
            Some(second)
        }
    };
    if cfg.udp_gro {
        udp::enable_gro(&socket).context("cannot enable UDP_GRO on the receiver's socket")?;
    }
    if let Some(ready) = &cfg.ready_file {
        std::fs::write(ready, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write ready file {}", ready.display()))?;
    }
    if cfg.fork {
        fork_worker(log)?;
    }
    let (tx, rx) = mpsc::channel::<Ready>();
    std::thread::scope(|scope| {
        let app = scope.spawn(|| deliver_all::<M>(rx, cfg, log));
        let result = receive::<M>(&socket, second.as_ref(), &tx, cfg, log);
        drop(tx);
        let delivered = app.join().expect("application thread panicked");
        result.map(|counters| {
            log.record(json!({
                "event": "summary", "role": "receiver",
                "received_data": counters.received_data,
                "received_parity": counters.received_parity,
                "duplicates": counters.duplicates,
                "recovered": counters.recovered,
                "lost": counters.lost,
                "malformed": counters.malformed,
                "feedback_sent": counters.feedback_sent,
                "delivered": delivered.delivered,
                "deadline_missed": delivered.deadline_missed,
            }));
        })
    })
}

struct Delivered {
    delivered: u64,
    deadline_missed: u64,
}

/// The application thread: takes delivered data off the receive thread.
fn deliver_all<M: Markers>(
    rx: mpsc::Receiver<Ready>,
    cfg: &ReceiverConfig,
    log: &EventLog,
) -> Delivered {
    let mut stats = Delivered {
        delivered: 0,
        deadline_missed: 0,
    };
    for ready in rx {
        cfg.inject.apply(Stage::Deliver, ready.seq);
        M::deliver(ready.seq, Kind::Data as u8);
        let now = now_ns();
        let latency_ns = now.saturating_sub(ready.send_time_ns);
        let missed = latency_ns > cfg.deadline_ns;
        stats.delivered += 1;
        stats.deadline_missed += missed as u64;
        let mut event = json!({
            "event": "delivered", "seq": ready.seq, "t_ns": now,
            "recovered": ready.recovered, "latency_ns": latency_ns,
            "deadline_missed": missed,
        });
        if let Some(path) = ready.path {
            event["path"] = path.into();
        }
        log.record(event);
    }
    stats
}

/// What one receive call brought: each datagram's (offset, length) in the
/// buffer, the sender, the GRO segment size, whether it was truncated.
type Received = (Vec<(usize, usize)>, SocketAddr, Option<usize>, bool);

fn receive<M: Markers>(
    socket: &UdpSocket,
    second: Option<&UdpSocket>,
    tx: &mpsc::Sender<Ready>,
    cfg: &ReceiverConfig,
    log: &EventLog,
) -> Result<Counters> {
    let mut counters = Counters::default();
    let mut state: Option<Reassembly> = None;
    let mut peer: Option<SocketAddr> = None;
    let mut buf = vec![
        0u8;
        if cfg.udp_gro {
            GRO_BUFFER_BYTES
        } else {
            DATAGRAM_BUFFER_BYTES
        }
    ];
    let mut receives = 0u64;
    let started = now_ns();
    let mut last_packet_ns: Option<u64> = None;
    let mut feedback = FeedbackState::default();
    let mut copies = FirstCopies::default();

    loop {
        let now = now_ns();
        let idle_limit = match last_packet_ns {
            Some(t) => t + cfg.idle_exit.as_nanos() as u64,
            None => started + cfg.first_packet_timeout.as_nanos() as u64,
        };
        if now > idle_limit {
            if last_packet_ns.is_none() {
                anyhow::bail!(
                    "no packet arrived on {} within {:?}",
                    cfg.bind,
                    cfg.first_packet_timeout
                );
            }
            break;
        }
        if let (Some(st), Some(to)) = (&mut state, peer) {
            feedback.maybe_send::<M>(socket, to, st, cfg, now, log, &mut counters);
        }
        // The path the datagram came on (1 without a second socket).
        let mut path = 1u8;
        let received: std::io::Result<Received> = if let Some(second) = second {
            udp::wait_readable([socket, second], 5).and_then(|i| {
                path = i as u8 + 1;
                [socket, second][i]
                    .recv_from(&mut buf)
                    .map(|(n, from)| (vec![(0, n)], from, None, false))
            })
        } else if cfg.udp_gro {
            udp::recv_coalesced(socket, &mut buf)
                .map(|c| (vec![(0, c.len)], c.from, c.segment_size, c.truncated))
        } else {
            match cfg.recv_mode {
                udp::RecvMode::Recvfrom => socket
                    .recv_from(&mut buf)
                    .map(|(n, from)| (vec![(0, n)], from, None, false)),
                udp::RecvMode::Peek => socket.peek_from(&mut buf).and_then(|_| {
                    socket
                        .recv_from(&mut buf)
                        .map(|(n, from)| (vec![(0, n)], from, None, false))
                }),
                udp::RecvMode::IovSplit(first) => udp::recv_split(socket, &mut buf, first)
                    .map(|(n, from)| (vec![(0, n)], from, None, false)),
                udp::RecvMode::Recvmmsg(count) => {
                    udp::recv_many(socket, &mut buf, MMSG_SLOT_BYTES, count)
                        .map(|(parts, from)| (parts, from, None, false))
                }
            }
        };
        let (parts, from, segment_size, truncated) = match received {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if let Some(st) = &mut state {
                    st.drain(
                        now_ns(),
                        cfg.deadline_ns,
                        None,
                        |r| {
                            let _ = tx.send(r);
                        },
                        |s| {
                            counters.lost += 1;
                            log.record(json!({"event": "lost", "seq": s}));
                        },
                    );
                }
                continue;
            }
            Err(e) => return Err(e).context("receive failed"),
        };
        let arrival = now_ns();
        last_packet_ns = Some(arrival);
        let receive_no = receives;
        receives += 1;
        if truncated {
            counters.malformed += 1;
            let n = parts.first().map_or(0, |p| p.1);
            log.record(json!({"event": "malformed", "bytes": n, "truncated": true, "gro_batch": receive_no}));
            continue;
        }
        let datagrams: Vec<&[u8]> = parts
            .iter()
            .flat_map(|&(at, n)| udp::split_coalesced(&buf[at..at + n], segment_size))
            .collect();
        // With --udp-gro every received line says which recvmsg brought it
        // and how many datagrams that one carried; with another receive
        // mode, which call and how many it returned.
        let gro = cfg.udp_gro.then_some((receive_no, datagrams.len()));
        let call = (!cfg.udp_gro && cfg.recv_mode != udp::RecvMode::Recvfrom)
            .then_some((receive_no, datagrams.len()));
        let mut done = false;
        for datagram in datagrams {
            let Ok((header, payload)) = Header::decode(datagram) else {
                counters.malformed += 1;
                let mut event = json!({"event": "malformed", "bytes": datagram.len()});
                add_gro_fields(&mut event, gro);
                log.record(event);
                continue;
            };
            let mut event = json!({"event": "received", "kind": header.kind, "seq": header.seq, "t_ns": arrival, "from": from.to_string()});
            add_gro_fields(&mut event, gro);
            if let Some((no, count)) = call {
                event["recv_call"] = json!(no);
                event["recv_datagrams"] = json!(count);
            }
            if done {
                // Read in the same call as the last expected packet: logged
                // (the call did take it from the socket), not handled.
                event["after_end"] = json!(true);
                log.record(event);
                continue;
            }
            let kind = header.kind as u8;
            M::link_receive(header.seq, kind);
            M::handle_start(header.seq, kind);
            cfg.inject.apply(Stage::Handle, header.seq);
            if second.is_some() {
                event["path"] = path.into();
                copies.note(kind, header.seq, path, arrival, log);
            }
            // Feedback goes back on the first path (the sender reads it there).
            if path == 1 {
                peer = Some(from);
            }
            log.record(event);
            let st = state.get_or_insert_with(|| Reassembly {
                k: header.k.max(1) as u32,
                next: 0,
                pending: BTreeMap::new(),
                blocks: HashMap::new(),
                gap_since_ns: None,
                highest_seq: None,
            });
            match header.kind {
                Kind::Data => {
                    counters.received_data += 1;
                    feedback.note_data(header.send_time_ns, arrival);
                    st.highest_seq = Some(st.highest_seq.map_or(header.seq, |h| h.max(header.seq)));
                    if header.seq < st.next || st.pending.contains_key(&header.seq) {
                        counters.duplicates += 1;
                    } else {
                        st.pending.insert(
                            header.seq,
                            Ready {
                                seq: header.seq,
                                send_time_ns: header.send_time_ns,
                                recovered: false,
                                path: second.is_some().then_some(path),
                            },
                        );
                        st.block_mut(header.block)
                            .data
                            .insert(header.index, (header.send_time_ns, payload.to_vec()));
                    }
                }
                Kind::Parity => {
                    counters.received_parity += 1;
                    st.block_mut(header.block).parity = Some((header.index, payload.to_vec()));
                }
                Kind::Feedback => {}
            }
            M::decode_start(header.seq, kind);
            cfg.inject.apply(Stage::Decode, header.seq);
            if header.kind != Kind::Feedback {
                st.try_recover(header.block, log, &mut counters);
            }
            M::decode_end(header.seq, kind);
            st.drain(
                now_ns(),
                cfg.deadline_ns,
                None,
                |r| {
                    let _ = tx.send(r);
                },
                |s| {
                    counters.lost += 1;
                    log.record(json!({"event": "lost", "seq": s}));
                },
            );
            M::handle_end(header.seq, kind);
            if cfg.expect.is_some_and(|expect| st.next >= expect) {
                done = true;
            }
        }
        if done {
            break;
        }
    }

    // End of the run: whatever is still missing will not come.
    if let Some(st) = &mut state {
        let end = cfg
            .expect
            .unwrap_or_else(|| st.highest_seq.map_or(0, |h| h + 1));
        st.drain(
            now_ns(),
            cfg.deadline_ns,
            Some(end),
            |r| {
                let _ = tx.send(r);
            },
            |s| {
                counters.lost += 1;
                log.record(json!({"event": "lost", "seq": s}));
            },
        );
        if let Some(to) = peer {
            feedback.send::<M>(socket, to, st, now_ns(), log, &mut counters);
        }
    }
    Ok(counters)
}

/// When the first copy of each packet arrived, and on which path (two paths
/// only), to log a later copy's skew.
#[derive(Default)]
struct FirstCopies(HashMap<(u8, u32), (u64, u8)>);

/// Copies further apart than this are not matched (bounded memory).
const COPY_WINDOW_NS: u64 = 1_000_000_000;

impl FirstCopies {
    fn note(&mut self, kind: u8, seq: u32, path: u8, arrival: u64, log: &EventLog) {
        match self.0.get(&(kind, seq)) {
            Some(&(first, first_path)) => log.record(json!({
                "event": "duplicate", "kind": Kind::from_u8(kind), "seq": seq, "path": path,
                "first_path": first_path, "skew_ns": arrival.saturating_sub(first), "t_ns": arrival,
            })),
            None => {
                if self.0.len() >= 65_536 {
                    self.0
                        .retain(|_, (t, _)| arrival.saturating_sub(*t) < COPY_WINDOW_NS);
                }
                self.0.insert((kind, seq), (arrival, path));
            }
        }
    }
}

/// Adds `gro_batch` and `gro_segments` to an event (with `--udp-gro`).
fn add_gro_fields(event: &mut serde_json::Value, gro: Option<(u64, usize)>) {
    if let Some((batch, segments)) = gro {
        event["gro_batch"] = batch.into();
        event["gro_segments"] = segments.into();
    }
}

#[derive(Default)]
struct FeedbackState {
    seq: u32,
    last_sent_ns: u64,
    delay_sum_ns: u64,
    delay_count: u64,
    newest_send_time_ns: u64,
    newest_arrival_ns: u64,
}

impl FeedbackState {
    fn note_data(&mut self, send_time_ns: u64, arrival_ns: u64) {
        self.delay_sum_ns += arrival_ns.saturating_sub(send_time_ns);
        self.delay_count += 1;
        self.newest_send_time_ns = send_time_ns;
        self.newest_arrival_ns = arrival_ns;
    }

    #[allow(clippy::too_many_arguments)]
    fn maybe_send<M: Markers>(
        &mut self,
        socket: &UdpSocket,
        to: SocketAddr,
        st: &Reassembly,
        cfg: &ReceiverConfig,
        now: u64,
        log: &EventLog,
        counters: &mut Counters,
    ) {
        if self.delay_count > 0 && now.saturating_sub(self.last_sent_ns) >= cfg.feedback_interval_ns
        {
            self.send::<M>(socket, to, st, now, log, counters);
        }
    }

    fn send<M: Markers>(
        &mut self,
        socket: &UdpSocket,
        to: SocketAddr,
        st: &Reassembly,
        now: u64,
        log: &EventLog,
        counters: &mut Counters,
    ) {
        let seq = self.seq;
        self.seq += 1;
        let fb = Feedback {
            received: (counters.received_data + counters.received_parity) as u32,
            lost: counters.lost as u32,
            recovered: counters.recovered as u32,
            highest_seq: st.highest_seq.unwrap_or(0),
            mean_delay_ns: self.delay_sum_ns.checked_div(self.delay_count).unwrap_or(0),
            echo_send_time_ns: self.newest_send_time_ns,
            echo_hold_ns: now.saturating_sub(self.newest_arrival_ns),
        };
        let mut bytes = Vec::with_capacity(HEADER_LEN + FEEDBACK_LEN);
        Header {
            kind: Kind::Feedback,
            payload_len: FEEDBACK_LEN as u16,
            seq,
            send_time_ns: now,
            block: 0,
            index: 0,
            k: 0,
        }
        .encode(&mut bytes);
        fb.encode(&mut bytes);
        M::feedback_send(seq, Kind::Feedback as u8);
        if let Err(e) = socket.send_to(&bytes, to) {
            log.record(json!({"event": "send_error", "kind": "feedback", "seq": seq, "error": e.to_string()}));
        }
        counters.feedback_sent += 1;
        log.record(json!({"event": "feedback_sent", "seq": seq, "t_ns": now, "lost": fb.lost, "recovered": fb.recovered}));
        self.last_sent_ns = now;
        self.delay_sum_ns = 0;
        self.delay_count = 0;
    }
}

/// Forks (before any thread exists): the child goes on as the receiver,
/// the parent waits for it and exits with its status (a pre-forking
/// server's shape: the worker reads the socket its parent bound).
fn fork_worker(log: &EventLog) -> Result<()> {
    log.flush()?;
    // SAFETY: called before this process starts any thread; the child only
    // goes on with ordinary Rust code, the parent only waits and exits.
    let pid = unsafe { libc::fork() };
    anyhow::ensure!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        log.record(json!({"event": "forked", "pid": std::process::id()}));
        log.flush()?;
        return Ok(());
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        1
    };
    std::process::exit(code);
}
