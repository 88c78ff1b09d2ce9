//! The live view's cross-host latency (`record --collect --live`): the
//! peers' stamps (peer/live.rs) joined with this host's by (kind, seq)
//! within [`JOIN_WAIT`], a packet's end-to-end from the sender's
//! `sock.send_enter` to the receiver's `sock.recv_exit` (the sender's first
//! and the receiver's last point when those are missing), and the clocks'
//! offset estimated online as `correlate` does it (clock.rs in
//! xlap-analyze): a packet A→B gives rx_B − tx_A = delay + θ, one B→A
//! gives delay − θ, at the wire points; the minima over the last
//! [`CLOCK_WINDOW_S`] seconds bound θ to ±(min_ab + min_ba)/2. Packets one
//! way only do not identify θ: their delay is shown uncorrected, and said
//! so. (No drift: over a window of seconds it is within the bound for
//! clocks a few ppm apart.)
//!
//! Bounded: at most [`MAX_JOIN`] packets wait for their other end (beyond,
//! a peer's stamps are dropped and counted), the latest [`KEPT`] latencies
//! per series give the quantiles.

use super::FastMap;
use crate::peer::live::PeerFeed;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xlap_records::peer_stamps::PeerStamp;
use xlap_records::points::{kernel_points, Side};
use xlap_records::stages::wire_rank;

/// How long a packet waits for its other host's stamps (the peer's come
/// after its recorder's flush, its sender's tail and the decoder).
pub const JOIN_WAIT: Duration = Duration::from_secs(3);
/// Packets waiting at most: 224 bytes each with its key (~26 MB with the
/// map's slack, at most).
pub const MAX_JOIN: usize = 100_000;
/// Latencies kept per (peer, kind, direction) for the quantiles.
pub const KEPT: usize = 8192;
/// The clock estimate's window, in one-second slots.
pub const CLOCK_WINDOW_S: usize = 30;

/// One host's points of a packet: the ends and the best wire point of
/// each side (rank, ns).
#[derive(Clone, Copy, Default)]
struct Ends {
    tx_start: Option<i64>,
    tx_named: bool,
    tx_wire: Option<(usize, i64)>,
    rx_end: Option<i64>,
    rx_named: bool,
    rx_wire: Option<(usize, i64)>,
}

impl Ends {
    fn add(&mut self, point: u16, ts: i64, points: &Points) {
        let Some(Some((side, rank))) = points.info.get(point as usize).copied() else {
            return;
        };
        let (send_enter, recv_exit) = (points.send_enter, points.recv_exit);
        match side {
            Side::Tx => {
                if point == send_enter {
                    self.tx_start = Some(
                        self.tx_start
                            .filter(|_| self.tx_named)
                            .map_or(ts, |t| t.min(ts)),
                    );
                    self.tx_named = true;
                } else if !self.tx_named {
                    self.tx_start = Some(self.tx_start.map_or(ts, |t| t.min(ts)));
                }
                if let Some(r) = rank {
                    if self.tx_wire.is_none_or(|(q, _)| r < q) {
                        self.tx_wire = Some((r, ts));
                    }
                }
            }
            Side::Rx => {
                if point == recv_exit {
                    self.rx_end = Some(
                        self.rx_end
                            .filter(|_| self.rx_named)
                            .map_or(ts, |t| t.max(ts)),
                    );
                    self.rx_named = true;
                } else if !self.rx_named {
                    self.rx_end = Some(self.rx_end.map_or(ts, |t| t.max(ts)));
                }
                if let Some(r) = rank {
                    if self.rx_wire.is_none_or(|(q, _)| r < q) {
                        self.rx_wire = Some((r, ts));
                    }
                }
            }
        }
    }
}

/// Per kernel point id its side and wire rank (asked once: naming a point
/// allocates, and every stamp of this host passes here), and the two
/// named ends.
struct Points {
    info: Vec<Option<(Side, Option<usize>)>>,
    send_enter: u16,
    recv_exit: u16,
}

impl Points {
    fn new() -> Points {
        let mut info = Vec::new();
        for p in kernel_points() {
            let i = p.id as usize;
            if info.len() <= i {
                info.resize(i + 1, None);
            }
            let rank = wire_rank(p.side, &xlap_records::points::column_stem(p.name));
            info[i] = Some((p.side, rank));
        }
        Points {
            info,
            send_enter: point_id("sock.send_enter"),
            recv_exit: point_id("sock.recv_exit"),
        }
    }
}

struct Waiting {
    since: Instant,
    peer: usize,
    peer_stamps: u32,
    theirs: Ends,
    ours: Ends,
}

/// Direction of a packet: from the peer to here, or from here to it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Dir {
    In,
    Out,
}

impl Dir {
    fn label(self, peer: &str) -> String {
        match self {
            Dir::In => format!("{peer}->here"),
            Dir::Out => format!("here->{peer}"),
        }
    }
}

/// The latest raw latencies of a series (ns, mixed clocks: + θ inbound,
/// − θ outbound) and their count.
#[derive(Default)]
struct Series {
    raw: VecDeque<i64>,
    n: u64,
    /// Ends named (send_enter → recv_exit) in every packet so far.
    named: bool,
}

#[derive(Default)]
struct PeerCounts {
    joined: u64,
    window_dropped: u64,
}

/// The minimum wire delay each way per one-second slot.
#[derive(Clone, Copy)]
struct Slot {
    at: Instant,
    min_in: Option<i64>,
    min_out: Option<i64>,
}

/// θ (local − peer, ns) and the half-width of the interval it lies in.
#[derive(Clone, Copy, Debug)]
pub struct Offset {
    pub theta_ns: f64,
    pub bound_ns: f64,
}

pub struct Cross {
    feed: Arc<PeerFeed>,
    waiting: FastMap<(u64, u64), Waiting>,
    points: Points,
    series: FastMap<(usize, u64, Dir), Series>,
    counts: Vec<PeerCounts>,
    clock: Vec<VecDeque<Slot>>,
    /// Local stamps not joined because the window was full.
    pub local_dropped: u64,
}

fn point_id(name: &str) -> u16 {
    kernel_points().find(|p| p.name == name).map_or(0, |p| p.id)
}

impl Cross {
    pub fn new(feed: Arc<PeerFeed>) -> Cross {
        Cross {
            feed,
            waiting: FastMap::default(),
            points: Points::new(),
            series: FastMap::default(),
            counts: Vec::new(),
            clock: Vec::new(),
            local_dropped: 0,
        }
    }

    /// A stamp of this host (kernel points of a packet only).
    pub fn note_local(&mut self, kind: u64, seq: u64, point: u16, ts: i64) {
        if !matches!(self.points.info.get(point as usize), Some(Some(_))) {
            return;
        }
        let full = self.waiting.len() >= MAX_JOIN;
        match self.waiting.get_mut(&(kind, seq)) {
            Some(w) => w.ours.add(point, ts, &self.points),
            None if full => self.local_dropped += 1,
            None => {
                let mut w = Waiting {
                    since: Instant::now(),
                    peer: usize::MAX,
                    peer_stamps: 0,
                    theirs: Ends::default(),
                    ours: Ends::default(),
                };
                w.ours.add(point, ts, &self.points);
                self.waiting.insert((kind, seq), w);
            }
        }
    }

    /// Takes the peers' queued stamps, completes the packets whose wait is
    /// over.
    pub fn tick(&mut self) {
        let peers: Vec<_> = self.feed.peers.lock().unwrap().clone();
        for (i, p) in peers.iter().enumerate() {
            let stamps: Vec<PeerStamp> = p.state.lock().unwrap().queue.drain(..).collect();
            while self.counts.len() <= i {
                self.counts.push(PeerCounts::default());
                self.clock.push(VecDeque::new());
            }
            for s in stamps {
                let kind = s.kind.map_or(xlap_records::kinds::KIND_ALL, u64::from);
                let full = self.waiting.len() >= MAX_JOIN;
                match self.waiting.get_mut(&(kind, s.seq)) {
                    Some(w) if w.peer == usize::MAX || w.peer == i => {
                        w.peer = i;
                        w.peer_stamps += 1;
                        w.theirs.add(s.point, s.ts_ns, &self.points);
                    }
                    // Another peer's packet of the same seq, or the window
                    // full: not joined.
                    Some(_) => self.counts[i].window_dropped += 1,
                    None if full => self.counts[i].window_dropped += 1,
                    None => {
                        let mut w = Waiting {
                            since: Instant::now(),
                            peer: i,
                            peer_stamps: 1,
                            theirs: Ends::default(),
                            ours: Ends::default(),
                        };
                        w.theirs.add(s.point, s.ts_ns, &self.points);
                        self.waiting.insert((kind, s.seq), w);
                    }
                }
            }
        }
        self.complete(false);
    }

    /// Completes the packets that waited [`JOIN_WAIT`] (all: at the end).
    pub fn complete(&mut self, all: bool) {
        let now = Instant::now();
        let done: Vec<(u64, u64)> = self
            .waiting
            .iter()
            .filter(|(_, w)| all || now.duration_since(w.since) >= JOIN_WAIT)
            .map(|(k, _)| *k)
            .collect();
        for key in done {
            let w = self.waiting.remove(&key).expect("listed");
            if w.peer == usize::MAX {
                continue;
            }
            let mut joined = false;
            // In: the peer sent, this host received; Out: the other way.
            for (dir, tx, rx) in [
                (Dir::In, &w.theirs, &w.ours),
                (Dir::Out, &w.ours, &w.theirs),
            ] {
                let (Some(t), Some(r)) = (tx.tx_start, rx.rx_end) else {
                    continue;
                };
                joined = true;
                let s = self.series.entry((w.peer, key.0, dir)).or_default();
                let named = tx.tx_named && rx.rx_named;
                s.named = if s.n == 0 { named } else { s.named && named };
                s.n += 1;
                s.raw.push_back(r - t);
                if s.raw.len() > KEPT {
                    s.raw.pop_front();
                }
                if let (Some((_, tw)), Some((_, rw))) = (tx.tx_wire, rx.rx_wire) {
                    self.clock_sample(w.peer, dir, rw - tw, now);
                }
            }
            let c = &mut self.counts[w.peer];
            if joined {
                c.joined += w.peer_stamps as u64;
            } else {
                c.window_dropped += w.peer_stamps as u64;
            }
        }
    }

    fn clock_sample(&mut self, peer: usize, dir: Dir, delay: i64, now: Instant) {
        let slots = &mut self.clock[peer];
        if slots
            .back()
            .is_none_or(|s| now.duration_since(s.at) >= Duration::from_secs(1))
        {
            slots.push_back(Slot {
                at: now,
                min_in: None,
                min_out: None,
            });
            if slots.len() > CLOCK_WINDOW_S {
                slots.pop_front();
            }
        }
        let s = slots.back_mut().expect("pushed");
        let m = match dir {
            Dir::In => &mut s.min_in,
            Dir::Out => &mut s.min_out,
        };
        *m = Some(m.map_or(delay, |x| x.min(delay)));
    }

    /// θ for a peer (local clock − peer clock), when packets went both
    /// ways in the window.
    pub fn offset(&self, peer: usize) -> Option<Offset> {
        let slots = self.clock.get(peer)?;
        let min_in = slots.iter().filter_map(|s| s.min_in).min()?;
        let min_out = slots.iter().filter_map(|s| s.min_out).min()?;
        Some(Offset {
            theta_ns: (min_in - min_out) as f64 / 2.0,
            bound_ns: (min_in + min_out) as f64 / 2.0,
        })
    }

    /// Lines for the terminal view, and OpenMetrics text.
    pub fn render(&self) -> (String, String) {
        let peers: Vec<_> = self.feed.peers.lock().unwrap().clone();
        let (mut view, mut om) = (String::new(), String::new());
        let us = |ns: f64| format!("{:.1}", ns / 1e3);
        let _ = writeln!(om, "# TYPE xlap_peer_stamps counter\n# HELP xlap_peer_stamps A peer's stamps (record --collect): arrived here, joined with this host's, dropped (queue: the view fell behind; window: no match within the join window or the window full; invalid: not a record).");
        let (mut gauges, mut offsets, mut bounds) = (String::new(), String::new(), String::new());
        let mut summaries = String::new();
        for (i, p) in peers.iter().enumerate() {
            let st = p.state.lock().unwrap();
            let c = self.counts.get(i);
            let (joined, window) = c.map_or((0, 0), |c| (c.joined, c.window_dropped));
            let name = &p.name;
            let status = match (&st.gone, st.connected) {
                (Some(why), _) => format!("gone ({why})"),
                (None, true) => "connected".into(),
                (None, false) => "not connected".into(),
            };
            let _ = writeln!(
                view,
                "peer {name}: {status}  stamps arrived {}  joined {joined}  dropped {} (window {window}, queue {}){}",
                st.arrived,
                window + st.queue_dropped + st.invalid,
                st.queue_dropped,
                st.decoder.as_ref().map_or(String::new(), |d| format!("  {d}"))
            );
            for (outcome, n) in [
                ("arrived", st.arrived),
                ("joined", joined),
                ("dropped_window", window),
                ("dropped_queue", st.queue_dropped),
                ("invalid", st.invalid),
            ] {
                let _ = writeln!(
                    om,
                    "xlap_peer_stamps_total{{peer=\"{name}\",outcome=\"{outcome}\"}} {n}"
                );
            }
            let _ = writeln!(
                gauges,
                "xlap_peer_connected{{peer=\"{name}\"}} {}",
                st.connected as u8
            );
            drop(st);
            let offset = self.offset(i);
            match offset {
                Some(o) => {
                    let _ = writeln!(
                        view,
                        "peer {name}: clock offset {:+.1} µs ± {} µs (minimum delays both ways, last {CLOCK_WINDOW_S} s)",
                        o.theta_ns / 1e3,
                        us(o.bound_ns)
                    );
                    let _ = writeln!(
                        offsets,
                        "xlap_peer_clock_offset_seconds{{peer=\"{name}\"}} {:e}",
                        o.theta_ns / 1e9
                    );
                    let _ = writeln!(
                        bounds,
                        "xlap_peer_clock_uncertainty_seconds{{peer=\"{name}\"}} {:e}",
                        o.bound_ns / 1e9
                    );
                }
                None => {
                    let _ = writeln!(
                        view,
                        "peer {name}: clock offset not identifiable (no packets both ways yet): cross-host latencies uncorrected"
                    );
                }
            }
            let mut keys: Vec<_> = self.series.keys().filter(|k| k.0 == i).copied().collect();
            keys.sort();
            for key in keys {
                let s = &self.series[&key];
                let mut v: Vec<i64> = s.raw.iter().copied().collect();
                v.sort_unstable();
                let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize] as f64;
                let (shift, tail, corrected) = match (offset, key.2) {
                    (Some(o), Dir::In) => (-o.theta_ns, format!(" ± {} µs", us(o.bound_ns)), true),
                    (Some(o), Dir::Out) => (o.theta_ns, format!(" ± {} µs", us(o.bound_ns)), true),
                    (None, _) => (
                        0.0,
                        " (uncorrected: includes the clock offset)".into(),
                        false,
                    ),
                };
                let ends = if s.named {
                    "sock.send_enter -> sock.recv_exit"
                } else {
                    "first -> last point"
                };
                let _ = writeln!(
                    view,
                    "cross-host kind {} {}: {} packets ({ends}), e2e p50 {} µs{tail}  p99 {} µs",
                    key.1,
                    key.2.label(name),
                    s.n,
                    us(q(0.5) + shift),
                    us(q(0.99) + shift),
                );
                let labels = format!(
                    "peer=\"{name}\",kind=\"{}\",direction=\"{}\",corrected=\"{corrected}\"",
                    key.1,
                    match key.2 {
                        Dir::In => "in",
                        Dir::Out => "out",
                    }
                );
                for p in [0.5, 0.99] {
                    let _ = writeln!(
                        summaries,
                        "xlap_cross_host_e2e_seconds{{{labels},quantile=\"{p}\"}} {:e}",
                        (q(p) + shift) / 1e9
                    );
                }
                let _ = writeln!(
                    summaries,
                    "xlap_cross_host_e2e_seconds_count{{{labels}}} {}",
                    s.n
                );
            }
        }
        let _ = write!(om, "# TYPE xlap_peer_connected gauge\n# HELP xlap_peer_connected A peer recorder is connected now (1) or gone (0).\n{gauges}# TYPE xlap_peer_clock_offset_seconds gauge\n# HELP xlap_peer_clock_offset_seconds This host's clock minus the peer's, from the minimum wire delays both ways (absent when packets went one way only).\n# UNIT xlap_peer_clock_offset_seconds seconds\n{offsets}# TYPE xlap_peer_clock_uncertainty_seconds gauge\n# HELP xlap_peer_clock_uncertainty_seconds Half-width of the interval the true offset lies in.\n# UNIT xlap_peer_clock_uncertainty_seconds seconds\n{bounds}# TYPE xlap_cross_host_e2e_seconds summary\n# HELP xlap_cross_host_e2e_seconds Cross-host end to end (sender's sock.send_enter to receiver's sock.recv_exit) of the latest {KEPT} packets per peer, kind and direction, clock-corrected by the online offset (xlap_peer_clock_offset_seconds, within xlap_peer_clock_uncertainty_seconds) where corrected=\"true\".\n# UNIT xlap_cross_host_e2e_seconds seconds\n{summaries}");
        (view, om)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> u16 {
        point_id(name)
    }

    /// Packets both ways between clocks `theta` apart (local − peer), with
    /// known delays: the estimate holds θ within its bound, and the
    /// corrected end to end is the true one within it.
    #[test]
    fn the_offset_comes_back_within_its_bound_and_one_way_is_not_identified() {
        let feed = Arc::new(PeerFeed::default());
        let peer = feed.add_fed("peer-1-a");
        let mut c = Cross::new(feed.clone());
        let theta: i64 = 3_700_000;
        let (send, wire_tx, wire_rx, recv) = (
            id("sock.send_enter"),
            id("dev.xmit"),
            id("dev.netif_rx"),
            id("sock.recv_exit"),
        );
        assert!(send != 0 && wire_tx != 0 && wire_rx != 0 && recv != 0);
        let push = |c: &mut Cross, seq: u64, kind: u32, ours: bool, pts: &[(u16, i64)]| {
            for (p, t) in pts {
                if ours {
                    c.note_local(kind as u64, seq, *p, *t);
                } else {
                    peer.state.lock().unwrap().queue.push_back(PeerStamp {
                        ts_ns: *t - theta,
                        seq,
                        kind: Some(kind),
                        point: *p,
                    });
                }
            }
        };
        // In one direction only first: not identifiable.
        for seq in 0..100u64 {
            let t = 1_000_000_000 + seq as i64 * 1_000_000;
            // The peer sends (its clock), this host receives.
            push(&mut c, seq, 1, false, &[(send, t), (wire_tx, t + 5_000)]);
            push(
                &mut c,
                seq,
                1,
                true,
                &[(wire_rx, t + 15_000), (recv, t + 40_000)],
            );
        }
        c.tick();
        c.complete(true);
        assert!(c.offset(0).is_none());
        let (view, _) = c.render();
        assert!(view.contains("not identifiable"), "{view}");
        assert!(view.contains("uncorrected"), "{view}");
        // Then feedback the other way: wire delay 12 µs.
        for seq in 0..100u64 {
            let t = 2_000_000_000 + seq as i64 * 1_000_000;
            push(&mut c, seq, 3, true, &[(send, t), (wire_tx, t + 5_000)]);
            push(
                &mut c,
                seq,
                3,
                false,
                &[(wire_rx, t + 17_000), (recv, t + 30_000)],
            );
        }
        c.tick();
        c.complete(true);
        let o = c.offset(0).expect("both ways");
        assert!((o.theta_ns - theta as f64).abs() <= o.bound_ns, "{o:?}");
        assert_eq!(o.bound_ns, 11_000.0, "(10 + 12 µs)/2");
        let (view, om) = c.render();
        // 40 µs end to end, within ±11 µs.
        let line = view
            .lines()
            .find(|l| l.contains("kind 1 peer-1-a->here"))
            .unwrap();
        assert!(line.contains("100 packets"), "{line}");
        let p50: f64 = line
            .split("p50 ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((p50 - 40.0).abs() <= 11.0, "{line}");
        assert!(
            om.contains("xlap_peer_stamps_total{peer=\"peer-1-a\",outcome=\"joined\"} 400"),
            "{om}"
        );
        assert!(
            om.contains("xlap_peer_clock_uncertainty_seconds{peer=\"peer-1-a\"} 1.1"),
            "{om}"
        );
    }

    /// A peer's stamps with no local match are counted dropped once their
    /// wait is over; beyond MAX_JOIN waiting packets, at once.
    #[test]
    fn what_does_not_join_is_counted_and_the_window_is_bounded() {
        let feed = Arc::new(PeerFeed::default());
        let peer = feed.add_fed("peer-1-a");
        let mut c = Cross::new(feed);
        let send = id("sock.send_enter");
        for seq in 0..(MAX_JOIN as u64 + 10) {
            c.note_local(1, seq, send, 1);
        }
        assert_eq!(c.waiting.len(), MAX_JOIN);
        assert_eq!(c.local_dropped, 10);
        peer.state.lock().unwrap().queue.push_back(PeerStamp {
            ts_ns: 5,
            seq: u64::MAX,
            kind: Some(1),
            point: send,
        });
        c.tick();
        c.complete(true);
        assert!(c.waiting.is_empty());
        assert_eq!(c.counts[0].window_dropped, 1);
        assert_eq!(c.counts[0].joined, 0);
    }
}
