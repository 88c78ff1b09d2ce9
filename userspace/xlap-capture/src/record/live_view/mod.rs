//! `record --live` and `--metrics ADDR:PORT`: what the run sees while it
//! records, once a second, in the terminal and as OpenMetrics.
//!
//! The recording keeps every stamp for the exact analysis afterwards; this
//! view is a streaming approximation of it, cheap enough for the poll loop:
//! stamps are grouped per packet by (kind, seq) on the one clock of this
//! host, a packet is complete when none of its stamps came for
//! [`QUIET_NS`]. Its stages are those of the packets table, by the same
//! definition ([`xlap_records::stages`]): per side, consecutive points
//! present along the kind's path order, inferred from the pairwise
//! precedence of the points in the packets so far (`a__b`, never a stage
//! between the two ends' points), and the `channel` from the sender's wire
//! point to the receiver's. Its end-to-end is the sender's first point to
//! the receiver's last (first to last when one end is not traced here). Durations go into log-bucketed histograms (~4 % resolution):
//! the terminal shows the last 10–20 s, the metrics count since the start
//! (Prometheus computes rates and windows from cumulative histograms).

use super::tally::FastHasher;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::hash::BuildHasherDefault;
use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xlap_records::points::{column_stem, point_info, Side};
use xlap_records::stages::{self, Part, Precedence};

/// Maps on the per-stamp path hash with [`FastHasher`] (SipHash would be
/// most of a stamp's cost here).
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
use xlap_records::Stamp;

mod cross;
mod draw;
mod hist;
mod metrics;

use hist::Hist;
use metrics::{openmetrics, serve};

/// A packet is complete when its newest stamp is this much older than the
/// newest stamp of the run.
const QUIET_NS: u64 = 200_000_000;
/// Packets waiting for completion at most; beyond, the oldest complete
/// early (a burst of millions of packets stays bounded).
const MAX_PENDING: usize = 200_000;
/// The terminal's window: the current one and the one before.
const WINDOW: Duration = Duration::from_secs(10);
/// Stages shown per kind in the terminal.
const SHOWN_STAGES: usize = 20;

/// Per kind: the end-to-end and every stage seen.
#[derive(Clone, Default)]
struct KindStats {
    /// Packets stamped at both ends.
    e2e: Option<Hist>,
    /// Packets stamped at one end only (a receiver traced alone): their
    /// span, which is not an end-to-end latency and is not called one.
    one_end: Option<Hist>,
    stages: FastMap<StageKey, Hist>,
    /// Per stage, the sum of its start's offset into the packet (ns): the
    /// mean puts the stages in path order.
    offsets: FastMap<StageKey, f64>,
    /// Stages above their fence in end-to-end outliers.
    causes: FastMap<StageKey, u64>,
    outliers: u64,
}

/// A stage by its side and its two points' ids (named only when shown: a
/// packet of 28 stamps would otherwise format 27 names). The channel is
/// [`CHANNEL`].
type StageKey = (StageSide, u16, u16);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum StageSide {
    Tx,
    Channel,
    Rx,
}

const CHANNEL: StageKey = (StageSide::Channel, 0, 0);

fn side_index(side: Side) -> usize {
    match side {
        Side::Tx => 0,
        Side::Rx => 1,
    }
}

impl KindStats {
    fn e2e(&mut self) -> &mut Hist {
        self.e2e.get_or_insert_with(Hist::new)
    }

    fn one_end(&mut self) -> &mut Hist {
        self.one_end.get_or_insert_with(Hist::new)
    }

    /// The packets' whole latency: end to end, or else one end's span.
    fn whole(&self) -> Option<(&'static str, &Hist)> {
        match (&self.e2e, &self.one_end) {
            (Some(h), _) => Some(("e2e", h)),
            (None, Some(h)) => Some(("one-end span", h)),
            (None, None) => None,
        }
    }

    fn merge(&mut self, other: &KindStats) {
        if let Some(h) = &other.e2e {
            self.e2e().merge(h);
        }
        if let Some(h) = &other.one_end {
            self.one_end().merge(h);
        }
        for (s, h) in &other.stages {
            self.stages.entry(*s).or_insert_with(Hist::new).merge(h);
        }
        for (s, n) in &other.causes {
            *self.causes.entry(*s).or_default() += n;
        }
        for (s, o) in &other.offsets {
            *self.offsets.entry(*s).or_default() += o;
        }
        self.outliers += other.outliers;
    }
}

type Stats = BTreeMap<u64, KindStats>;

struct Pending {
    newest_ns: u64,
    /// (time, point, pid): the pid gives an app point its side.
    stamps: Vec<(u64, u16, u32)>,
}

/// A complete packet's first pass of each point, by side, in time order.
struct Complete {
    kind: u64,
    sides: [Vec<(u16, i64)>; 2],
}

pub struct LiveView {
    app_names: Vec<String>,
    pending: FastMap<(u64, u64), Pending>,
    newest_ns: u64,
    /// Stamps of packets (with a seq) noted, and that count at the last
    /// tick: equal when the traffic stopped for a whole tick.
    packet_stamps: u64,
    packet_stamps_at_tick: u64,
    total: Stats,
    current: Stats,
    previous: Stats,
    window_start: Instant,
    started: Instant,
    stamps: u64,
    packets: u64,
    last_stamps: u64,
    last_packets: u64,
    last_tick: Instant,
    terminal: bool,
    /// Print the view (else only serve the metrics).
    print: bool,
    metrics: Option<Arc<Mutex<String>>>,
    /// Pairwise precedence of the points per (kind, side) since the start,
    /// and the path order inferred from it.
    precedence: FastMap<(u64, usize), Precedence<u16>>,
    orders: FastMap<(u64, usize), Vec<u16>>,
    /// App points seen on both sides: named `<point>_tx` / `_rx`, as the
    /// packets table names them.
    app_both: Vec<u16>,
    app_side: FastMap<u16, usize>,
    /// `--sample 1/N`: "1/16", said in the view and the metrics.
    sample: Option<(u32, String)>,
    /// `wire_rank` per (point, on the sender's side), known once asked:
    /// naming a point allocates, and each packet asks for every point of
    /// each of its stages (under `--metrics --sample 1/64`, 2.4 → 2.0 % of a
    /// core for the recorder).
    wire_ranks: std::cell::RefCell<FastMap<(u16, bool), Option<usize>>>,
    /// `--collect`: the peers' stamps joined with ours (cross.rs).
    cross: Option<cross::Cross>,
}

impl LiveView {
    /// The run's sample (`--sample`): the view and the metrics say it.
    pub fn set_sample(&mut self, sample: Option<&xlap_records::sample::Sample>) {
        self.sample = sample.map(|s| (s.one_in, s.describe()));
    }

    /// `--collect`: the peers' stamps, joined with this host's.
    pub fn set_peers(&mut self, feed: Arc<crate::peer::live::PeerFeed>) {
        self.cross = Some(cross::Cross::new(feed));
    }

    /// The app point names when points were added during the run.
    pub fn set_app_names(&mut self, app_names: Vec<String>) {
        self.app_names = app_names;
        self.wire_ranks.borrow_mut().clear();
    }

    /// `print`: the terminal view on stdout; `metrics`: serve OpenMetrics
    /// on that address (bound now: a taken port fails the run at start).
    pub fn new(
        app_names: Vec<String>,
        print: bool,
        metrics: Option<SocketAddr>,
    ) -> anyhow::Result<LiveView> {
        let metrics = match metrics {
            Some(addr) => Some(serve(addr)?),
            None => None,
        };
        let now = Instant::now();
        Ok(LiveView {
            app_names,
            pending: FastMap::default(),
            newest_ns: 0,
            packet_stamps: 0,
            packet_stamps_at_tick: 0,
            total: Stats::new(),
            current: Stats::new(),
            previous: Stats::new(),
            window_start: now,
            started: now,
            stamps: 0,
            packets: 0,
            last_stamps: 0,
            last_packets: 0,
            last_tick: now,
            terminal: std::io::stdout().is_terminal(),
            print,
            metrics,
            precedence: FastMap::default(),
            orders: FastMap::default(),
            app_both: Vec::new(),
            app_side: FastMap::default(),
            sample: None,
            wire_ranks: Default::default(),
            cross: None,
        })
    }

    pub fn note(&mut self, stamp: &Stamp) {
        self.stamps += 1;
        let Some(seq) = stamp.seq.filter(|_| !stamp.fragment) else {
            return;
        };
        // A layout without a kind field: one kind, `all`, as in the analyses.
        let kind = stamp.kind.map_or(xlap_records::kinds::KIND_ALL, u64::from);
        self.newest_ns = self.newest_ns.max(stamp.ts_ns);
        self.packet_stamps += 1;
        let p = self.pending.entry((kind, seq)).or_insert(Pending {
            newest_ns: 0,
            stamps: Vec::new(),
        });
        p.newest_ns = p.newest_ns.max(stamp.ts_ns);
        p.stamps.push((stamp.ts_ns, stamp.point, stamp.pid));
        if let Some(c) = self.cross.as_mut() {
            c.note_local(kind, seq, stamp.point, stamp.ts_ns as i64);
        }
    }

    /// A second has passed since the last render.
    pub fn due(&self) -> bool {
        self.last_tick.elapsed() >= Duration::from_secs(1)
    }

    /// Completes the quiet packets; every second, renders the view and the
    /// metrics. `losses`: the tracer's losses so far, by reason.
    pub fn tick(&mut self, losses: &[(&str, u64)]) {
        if !self.due() {
            return;
        }
        // No packet's stamp for a whole tick (a second, five times
        // QUIET_NS): the traffic stopped, and every pending packet is as
        // complete as it will get. The stamps' own clock does not advance
        // without stamps, so the last packets before a pause would wait
        // for the next one (or the run's end) and a scrape in the pause
        // would not count them.
        let idle = self.packet_stamps == self.packet_stamps_at_tick;
        self.packet_stamps_at_tick = self.packet_stamps;
        self.complete(idle);
        if let Some(c) = self.cross.as_mut() {
            c.tick();
        }
        self.render(losses);
    }

    /// At the end: every packet still pending completes, and the view and
    /// metrics show the whole run.
    pub fn finish(&mut self, losses: &[(&str, u64)]) {
        self.complete(true);
        if let Some(c) = self.cross.as_mut() {
            c.tick();
            c.complete(true);
        }
        self.render(losses);
    }

    fn complete(&mut self, all: bool) {
        let cutoff = self.newest_ns.saturating_sub(QUIET_NS);
        let mut done: Vec<(u64, u64)> = self
            .pending
            .iter()
            .filter(|(_, p)| all || p.newest_ns < cutoff)
            .map(|(k, _)| *k)
            .collect();
        if !all && self.pending.len() - done.len() > MAX_PENDING {
            let mut rest: Vec<(u64, (u64, u64))> = self
                .pending
                .iter()
                .filter(|(_, p)| p.newest_ns >= cutoff)
                .map(|(k, p)| (p.newest_ns, *k))
                .collect();
            rest.sort_unstable();
            let over = self.pending.len() - done.len() - MAX_PENDING;
            done.extend(rest.into_iter().take(over).map(|(_, k)| k));
        }
        // The batch's packets join the precedence counts first, so the
        // order they are staged by has seen them (the first packets too).
        let batch: Vec<Complete> = done
            .into_iter()
            .filter_map(|key| self.pending.remove(&key).map(|p| self.prepare(key.0, p)))
            .collect();
        let mut touched = Vec::new();
        for c in &batch {
            for (i, side) in c.sides.iter().enumerate() {
                if side.len() > 1 {
                    self.precedence
                        .entry((c.kind, i))
                        .or_default()
                        .add_packet(side);
                } else if let Some((p, _)) = side.first() {
                    self.precedence.entry((c.kind, i)).or_default().point(p);
                }
                if !side.is_empty() && !touched.contains(&(c.kind, i)) {
                    touched.push((c.kind, i));
                }
            }
        }
        for key in touched {
            let order = self.precedence[&key].order(|a, b| a.cmp(b)).order;
            self.orders.insert(key, order);
        }
        for c in batch {
            self.account(c);
        }
    }

    /// A packet's points by side, first pass of each, in time order. An
    /// app point takes the side of the kernel points of its process.
    fn prepare(&mut self, kind: u64, mut p: Pending) -> Complete {
        p.stamps.sort_unstable();
        let mut pids: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        for (_, pt, pid) in &p.stamps {
            if let Some((_, _, Some(side))) = point_info(*pt, &self.app_names) {
                pids[side_index(side)].push(*pid);
            }
        }
        let mut sides: [Vec<(u16, i64)>; 2] = [Vec::new(), Vec::new()];
        for (ts, pt, pid) in &p.stamps {
            let side = match point_info(*pt, &self.app_names) {
                Some((_, _, Some(side))) => side_index(side),
                // The sender's process, else the receiver's; an app point
                // of a packet no kernel point saw: one side, the sender's.
                _ if pids[1].contains(pid) && !pids[0].contains(pid) => 1,
                _ => 0,
            };
            if point_info(*pt, &self.app_names).is_some_and(|i| i.2.is_none()) {
                match self.app_side.get(pt) {
                    Some(s) if *s != side && !self.app_both.contains(pt) => self.app_both.push(*pt),
                    Some(_) => {}
                    None => {
                        self.app_side.insert(*pt, side);
                    }
                }
            }
            // A point passed twice (a retransmission, a copy): its first pass.
            if !sides[side].iter().any(|(q, _)| q == pt) {
                sides[side].push((*pt, *ts as i64));
            }
        }
        Complete { kind, sides }
    }

    fn point_name(&self, id: u16) -> String {
        point_info(id, &self.app_names).map_or(format!("unknown.{id}"), |p| p.0)
    }

    /// The packets table's column stem of a point on a side.
    fn column(&self, id: u16, side: StageSide) -> String {
        let stem = column_stem(&self.point_name(id));
        match side {
            StageSide::Tx if self.app_both.contains(&id) => stem + "_tx",
            StageSide::Rx if self.app_both.contains(&id) => stem + "_rx",
            _ => stem,
        }
    }

    /// `a__b`, as the packets table names stages, or `channel`.
    fn stage_name(&self, (side, a, b): StageKey) -> String {
        if side == StageSide::Channel {
            return "channel".into();
        }
        stages::stage_name(&self.column(a, side), &self.column(b, side))
    }

    /// A point's rank among the wire points of its side (best first).
    fn wire_rank(&self, side: Side, id: u16) -> Option<usize> {
        *self
            .wire_ranks
            .borrow_mut()
            .entry((id, side == Side::Tx))
            .or_insert_with(|| {
                point_info(id, &self.app_names)
                    .filter(|i| i.2 == Some(side))
                    .and_then(|i| stages::wire_rank(side, &column_stem(&i.0)))
            })
    }

    /// One complete packet into the histograms.
    fn account(&mut self, c: Complete) {
        let kind = c.kind;
        let n: usize = c.sides.iter().map(|s| s.len()).sum();
        if n < 2 {
            return;
        }
        self.packets += 1;
        let all = || c.sides.iter().flatten().map(|(_, t)| *t);
        let first = all().min().unwrap_or(0);
        let [tx, rx] = &c.sides;
        let both_ends = !tx.is_empty() && !rx.is_empty();
        let e2e = if both_ends {
            rx.iter().map(|(_, t)| *t).max().unwrap_or(0)
                - tx.iter().map(|(_, t)| *t).min().unwrap_or(0)
        } else {
            all().max().unwrap_or(0) - first
        }
        .max(0) as u64;
        // (stage, ns, offset of its start into the packet, on the path)
        let mut stages: Vec<(StageKey, u64, u64, bool)> = Vec::new();
        let mut wires = [None, None];
        for (i, (side, ss)) in [(Side::Tx, StageSide::Tx), (Side::Rx, StageSide::Rx)]
            .into_iter()
            .enumerate()
        {
            let points = &c.sides[i];
            let Some(order) = self.orders.get(&(kind, i)) else {
                continue;
            };
            let time = |p: &u16| points.iter().find(|(q, _)| q == p).map(|(_, t)| *t);
            let wire = |p: &u16| self.wire_rank(side, *p);
            wires[i] = points
                .iter()
                .filter_map(|(p, t)| wire(p).map(|r| (r, *t)))
                .min()
                .map(|(_, t)| t);
            for (a, b) in stages::stages(order, |p| time(p).is_some()) {
                let (ta, tb) = (time(a).unwrap_or(0), time(b).unwrap_or(0));
                let on_path = stages::part(side, order, wire, a, b) == Part::Path;
                // A packet that contradicts the order (the run says so in
                // its packets table) counts as 0 here: the histogram has no
                // negative buckets.
                stages.push((
                    (ss, *a, *b),
                    (tb - ta).max(0) as u64,
                    (ta - first).max(0) as u64,
                    on_path,
                ));
            }
        }
        if let [Some(t), Some(r)] = wires {
            stages.push((
                CHANNEL,
                (r - t).max(0) as u64,
                (t - first).max(0) as u64,
                true,
            ));
        }
        // Causes against the window's fences before this packet joins it.
        let window = self.current.entry(kind).or_default();
        let outlier = if both_ends {
            &window.e2e
        } else {
            &window.one_end
        }
        .as_ref()
        .and_then(|h| h.fence())
        .is_some_and(|f| Hist::middle(e2e) > f);
        let mut causes = Vec::new();
        if outlier {
            // Only stages on the path cause: one after the sender's wire runs
            // alongside the channel, whose time it already is.
            for (s, ns, _, _) in stages.iter().filter(|s| s.3) {
                if window
                    .stages
                    .get(s)
                    .and_then(|h| h.fence())
                    .is_some_and(|f| Hist::middle(*ns) > f)
                {
                    causes.push(*s);
                }
            }
        }
        for stats in [&mut self.total, &mut self.current] {
            let k = stats.entry(kind).or_default();
            if both_ends {
                k.e2e().add(e2e);
            } else {
                k.one_end().add(e2e);
            }
            for (s, ns, offset, _) in &stages {
                k.stages.entry(*s).or_insert_with(Hist::new).add(*ns);
                *k.offsets.entry(*s).or_default() += *offset as f64;
            }
            if outlier {
                k.outliers += 1;
                for c in &causes {
                    *k.causes.entry(*c).or_default() += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::hist::{half_edge, BUCKETS, SUB};
    use super::metrics::{spawn_server, BOUNDS_S};
    use super::*;

    /// Clients that send nothing, garbage, or far too much, and one that
    /// never reads: the server still answers a plain request after them.
    #[test]
    fn hostile_clients_do_not_stop_the_metrics_server() {
        use std::io::Write as _;
        use std::net::TcpStream;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let body = "x".repeat(8 << 20) + "\n# EOF\n";
        spawn_server(listener, Arc::new(Mutex::new(body.clone()))).unwrap();
        let silent = TcpStream::connect(addr).unwrap();
        let mut garbage = TcpStream::connect(addr).unwrap();
        garbage.write_all(&[0xff; 300]).unwrap();
        let mut huge = TcpStream::connect(addr).unwrap();
        let _ = huge.write_all(&vec![b'G'; 1 << 20]);
        // Asks, then never reads an 8 MiB answer.
        let mut stalled = TcpStream::connect(addr).unwrap();
        stalled.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut ok = TcpStream::connect(addr).unwrap();
        // Only a guard against hanging the suite, not a timing claim.
        ok.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        ok.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = Vec::new();
        ok.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK"),
            "{}",
            &answer[..answer.len().min(200)]
        );
        assert!(answer.ends_with("# EOF\n"), "the whole body");
        drop((silent, garbage, huge, stalled));
    }

    #[test]
    fn histogram_quantiles_are_within_a_bucket() {
        let mut h = Hist::new();
        for ns in 1..=10_000u64 {
            h.add(ns * 100);
        }
        for (p, want) in [(0.5, 500_000.0), (0.99, 990_000.0)] {
            let got = h.quantile(p).unwrap();
            assert!((got / want - 1.0).abs() < 0.05, "p{p}: {got} vs {want}");
        }
        // Cumulative counts grow with the bound and end at the total.
        let counts: Vec<u64> = BOUNDS_S.iter().map(|b| h.at_or_below(b * 1e9)).collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]));
        assert!(h.at_or_below(1e12) == h.n);
        // The edges computed once are the powers computed each time before.
        for i in [0usize, 17, 300, BUCKETS - 1] {
            assert_eq!(half_edge(2 * (i + 1)), 2f64.powf((i + 1) as f64 / SUB));
            assert_eq!(half_edge(2 * i + 1), 2f64.powf((i as f64 + 0.5) / SUB));
        }
    }

    /// splitmix64, for the odd runs below.
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// OpenMetrics text as Prometheus reads it: comments (`# TYPE`, `#
    /// HELP`, `# UNIT`) or `name{labels} value` samples with escaped label
    /// values and a finite or +Inf value, a histogram's buckets
    /// non-decreasing up to its count, `# EOF` last and only there.
    pub(super) fn check_openmetrics(text: &str) -> Result<(), String> {
        let body = text
            .strip_suffix("# EOF\n")
            .ok_or("does not end with # EOF")?;
        let mut last_bucket: Option<(String, u64)> = None;
        for line in body.lines() {
            if line.starts_with('#') {
                let ok = ["# TYPE ", "# HELP ", "# UNIT "]
                    .iter()
                    .any(|p| line.starts_with(p));
                if !ok {
                    return Err(format!("a comment OpenMetrics does not have: {line:?}"));
                }
                continue;
            }
            let name_end = line
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .ok_or(format!("no value: {line:?}"))?;
            let (name, mut rest) = line.split_at(name_end);
            if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(format!("not a metric name: {line:?}"));
            }
            let mut labels = String::new();
            if let Some(r) = rest.strip_prefix('{') {
                // key="value",... with \\, \" and \n the only escapes.
                let mut chars = r.char_indices();
                let mut in_value = false;
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match (in_value, c) {
                        (true, '\\') => match chars.next() {
                            Some((_, '\\' | '"' | 'n')) => {}
                            e => return Err(format!("bad escape {e:?}: {line:?}")),
                        },
                        (true, '"') => in_value = false,
                        (true, '\n') => return Err(format!("a raw newline: {line:?}")),
                        (false, '"') => in_value = true,
                        (false, '}') => {
                            end = Some(i);
                            break;
                        }
                        (false, c) if c.is_ascii_alphanumeric() || "_=,".contains(c) => {}
                        (false, c) => return Err(format!("{c:?} outside a label value: {line:?}")),
                        _ => {}
                    }
                }
                let end = end.ok_or(format!("unclosed labels: {line:?}"))?;
                labels = r[..end].to_string();
                rest = &r[end + 1..];
            }
            let value = rest
                .strip_prefix(' ')
                .ok_or(format!("no space before the value: {line:?}"))?;
            let v: f64 = if value == "+Inf" {
                f64::INFINITY
            } else {
                value
                    .parse()
                    .map_err(|e| format!("value {value:?}: {e}: {line:?}"))?
            };
            if !(v.is_finite() || value == "+Inf") {
                return Err(format!("a value that is not finite: {line:?}"));
            }
            // Buckets of one histogram (same labels but le) never decrease.
            if name.ends_with("_bucket") {
                let series = labels.split(",le=").next().unwrap_or("").to_string();
                let n = v as u64;
                if let Some((s, before)) = &last_bucket {
                    if *s == series && n < *before {
                        return Err(format!("a bucket below the one before: {line:?}"));
                    }
                }
                last_bucket = Some((series, n));
            } else if name.ends_with("_count") {
                if let Some((s, before)) = last_bucket.take() {
                    if labels != s {
                        return Err(format!("a count after another series' buckets: {line:?}"));
                    }
                    if v as u64 != before {
                        return Err(format!("count {v} but +Inf bucket {before}: {line:?}"));
                    }
                }
            }
        }
        if body.contains("# EOF") {
            return Err("# EOF before the end".into());
        }
        Ok(())
    }

    /// Runs a live view can see and nobody designed: no stamp, one, one
    /// packet, stamps without a seq, every stamp at one instant or at 0,
    /// a later point stamped earlier, stages of 1 ns and of hours, seqs up
    /// to 2^64 − 1, kinds up to 2^32 − 1 and none, the longest marker
    /// names (with a `--usdt` point's dots), a marker on both sides, a
    /// point id nobody named. The terminal view says no NaN or inf and the
    /// OpenMetrics text is well formed (the view's half of the renderers'
    /// fuzz target, tests/fuzz/fuzz_render.rs, which cannot reach this
    /// private module).
    #[test]
    fn odd_runs_render_a_view_and_well_formed_metrics() {
        use xlap_abi::xlap_point as xp;
        let app = xp::XLAP_POINT_APP_BASE as u16;
        let tx = [
            xp::XLAP_POINT_SOCK_SEND_ENTER,
            xp::XLAP_POINT_DEV_QUEUE,
            xp::XLAP_POINT_DEV_START_XMIT,
            xp::XLAP_POINT_SOCK_SEND_EXIT,
        ]
        .map(|p| p as u16);
        let rx = [
            xp::XLAP_POINT_DEV_NETIF_RX,
            xp::XLAP_POINT_SOCK_QUEUE,
            xp::XLAP_POINT_SOCK_RECV_EXIT,
        ]
        .map(|p| p as u16);
        let names = vec![
            "send".to_string(),
            "deliver".to_string(),
            format!("{}.x", "L".repeat(62)),
            "a.b.c".to_string(),
        ];
        for case in 0..300u64 {
            let mut state = case;
            let r = next(&mut state);
            let packets = match case % 5 {
                0 => 0,
                1 => 1,
                _ => r % 200,
            };
            let step = |state: &mut u64| -> i64 {
                let r = next(state);
                match case % 7 {
                    0 => 0,
                    1 => 1_000,
                    2 => 3_600_000_000_000,
                    _ => {
                        let d = 1i64 << (r % 43);
                        if (r >> 40).is_multiple_of(4) {
                            -d
                        } else {
                            d
                        }
                    }
                }
            };
            let kind = |state: &mut u64| match next(state) % 4 {
                _ if case % 3 == 0 => None,
                0 => Some(0),
                1 => Some(u32::MAX),
                _ => Some(7),
            };
            let seq0 = match case % 4 {
                0 => u64::MAX - 10,
                _ => next(&mut state) >> (next(&mut state) % 64),
            };
            let mut v = LiveView::new(names.clone(), false, None).unwrap();
            let t0: i64 = if case % 11 == 0 { 0 } else { 1 << 50 };
            for i in 0..packets {
                let seq = seq0.wrapping_add(i);
                let kind = kind(&mut state);
                let mut t = t0 + i as i64 * 1_000;
                let mask = next(&mut state);
                let mut points: Vec<(u16, u32)> = Vec::new();
                if mask & 1 != 0 {
                    points.push((app, 1));
                }
                points.extend(
                    tx.iter()
                        .enumerate()
                        .filter(|(j, _)| mask >> (1 + j) & 1 != 0)
                        .map(|(_, p)| (*p, 1)),
                );
                points.extend(
                    rx.iter()
                        .enumerate()
                        .filter(|(j, _)| mask >> (5 + j) & 1 != 0)
                        .map(|(_, p)| (*p, 2)),
                );
                for (j, id) in [app + 1, app + 2, app + 3, app + 9].into_iter().enumerate() {
                    if mask >> (8 + j) & 1 != 0 {
                        points.push((id, 2));
                    }
                }
                if mask >> 12 & 1 != 0 {
                    // The sender's marker on the receiver too.
                    points.push((app, 2));
                }
                for (point, pid) in points {
                    let mut s = Stamp {
                        ts_ns: t.max(0) as u64,
                        point,
                        seq: (mask >> 13 & 7 != 0).then_some(seq),
                        kind,
                        flow: 1,
                        pid,
                        tid: pid,
                        cpu: 0,
                        len: 0,
                        ifindex: None,
                        queue: None,
                        hw_ts_ns: None,
                        priority: None,
                        cgroup_id: None,
                        netns: None,
                        from_user: point >= app,
                        fragment: mask >> 16 & 15 == 0,
                    };
                    if s.fragment && mask >> 20 & 1 == 0 {
                        s.fragment = false;
                    }
                    v.note(&s);
                    t += step(&mut state);
                }
            }
            let losses = [("ringbuf_full", case), ("parse", 0)];
            v.finish(&losses);
            let view = v.view(&v.total, 0.0, f64::from(case as u32), &losses);
            let bad = view
                .split(|c: char| !c.is_ascii_alphanumeric())
                .find(|w| matches!(*w, "NaN" | "inf"));
            assert!(bad.is_none(), "case {case}: the view says {bad:?}:\n{view}");
            let text = openmetrics(&v.total, v.stamps, v.packets, 1, &losses, &|k| {
                v.stage_name(k)
            });
            if let Err(e) = check_openmetrics(&text) {
                panic!("case {case}: {e}\n{text}");
            }
        }
    }

    /// A marker stamp of kind 1 by pid 1 (no flow, no device).
    fn marker_stamp(ts_ns: u64, point: u16, seq: u64) -> Stamp {
        Stamp {
            ts_ns,
            point,
            seq: Some(seq),
            kind: Some(1),
            flow: 0,
            pid: 1,
            tid: 1,
            cpu: 0,
            len: 0,
            ifindex: None,
            queue: None,
            hw_ts_ns: None,
            priority: None,
            cgroup_id: None,
            netns: None,
            from_user: false,
            fragment: false,
        }
    }

    #[test]
    fn packets_complete_into_stages_in_time_order() {
        let mut v = LiveView::new(vec!["send".into(), "deliver".into()], false, None).unwrap();
        let app = xlap_abi::xlap_point::XLAP_POINT_APP_BASE as u16;
        for seq in 0..100u64 {
            let t0 = seq * 1_000_000;
            // Out of order on purpose: the view sorts by time.
            v.note(&marker_stamp(t0 + 30_000, app + 1, seq));
            v.note(&marker_stamp(t0, app, seq));
        }
        v.finish(&[]);
        let k = &v.total[&1];
        assert_eq!(v.packets, 100);
        // Both markers on one side: a span of one end, not an end-to-end
        // latency (the analyses have no e2e for such packets either).
        assert!(k.e2e.is_none());
        let span = k.one_end.as_ref().unwrap();
        assert!((span.quantile(0.5).unwrap() / 30_000.0 - 1.0).abs() < 0.05);
        let view = v.view(&v.total, 0.0, 1.0, &[]);
        assert!(view.contains("one-end span p50 "), "{view}");
        // One latency throughout: no packet lies above its fence.
        assert_eq!(k.outliers, 0, "{view}");
        assert!(!view.contains("e2e"), "{view}");
        let key = (StageSide::Tx, app, app + 1);
        assert_eq!(k.stages[&key].n, 100);
        assert_eq!(v.stage_name(key), "app_send__app_deliver");
        let text = openmetrics(
            &v.total,
            v.stamps,
            v.packets,
            16,
            &[("ringbuf_full", 0)],
            &|k| v.stage_name(k),
        );
        assert!(
            text.contains("xlap_latency_seconds_count{kind=\"1\",stage=\"span\"} 100")
                && !text.contains("stage=\"e2e\""),
            "{text}"
        );
        assert!(text.contains("\nxlap_sample_one_in 16\n"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    /// A packet whose stamps stopped, with no stamp after it, completes at
    /// the first tick that saw no stamp at all (not only at the run's end):
    /// a scrape while the traffic pauses counts it.
    #[test]
    fn the_last_packets_complete_when_the_traffic_stops() {
        let mut v = LiveView::new(vec!["send".into(), "deliver".into()], false, None).unwrap();
        let app = xlap_abi::xlap_point::XLAP_POINT_APP_BASE as u16;
        for (ts, point) in [(1_000_000, app), (1_030_000, app + 1)] {
            v.note(&marker_stamp(ts, point, 7));
        }
        let a_second_ago = || Instant::now().checked_sub(Duration::from_secs(2)).unwrap();
        // The tick that saw the stamps: the packet is the newest, not quiet.
        v.last_tick = a_second_ago();
        v.tick(&[]);
        assert_eq!(v.packets, 0);
        // A tick with no stamp since: the traffic stopped.
        v.last_tick = a_second_ago();
        v.tick(&[]);
        assert_eq!(v.packets, 1);
        assert!(v.pending.is_empty());
    }
}
