//! The stages of a packet's path, defined once for the packets table
//! (`correlate`), `analyze` and `report` (which read its stage columns) and
//! the live view of `record --live` / OpenMetrics.
//!
//! - **Path order**, per packet kind and side: inferred from pairwise
//!   precedence counts over the packets that have both points (not from
//!   mean or median offsets: a point present only in some packets, or a
//!   heavy tail, moved a mean-ordered point past its neighbour and made that
//!   stage negative). The order is the one no packet contradicts when there
//!   is one; otherwise the one fewest packets contradict, and the
//!   contradictions are reported ([`PathOrder::conflicts`]).
//! - **Stages**: between consecutive points *present in the packet* along
//!   the order of its side. A point that did not fire for a packet (no
//!   wake-up: the reader was busy, not asleep) leaves no gap: the stage
//!   spans from the point before it to the next point present
//!   (`sock_queue__sock_recv_exit`), so one side's stages add up to its
//!   span, per packet. Stages never pair points of the two ends.
//! - **Part**: a sender's stages up to the wire point (`TX_WIRE`) and a
//!   receiver's from its wire point (`RX_WIRE`) on partition X-LAP's
//!   end-to-end with the channel between them; a sender's points after the
//!   wire (the driver's return, the send call's return) run alongside the
//!   channel and the receiver, and are reported as such, outside the sum.

use crate::points::{Side, RX_WIRE, TX_WIRE};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::Hash;

/// Pairwise precedence counts of points: how many packets with both had
/// one strictly before the other.
#[derive(Clone, Debug)]
pub struct Precedence<P> {
    points: Vec<P>,
    /// Each point's index in `points`.
    index: HashMap<P, usize>,
    /// `before[i][j]`: packets in which point i came strictly before j.
    before: Vec<Vec<u64>>,
}

impl<P> Default for Precedence<P> {
    fn default() -> Self {
        Precedence {
            points: Vec::new(),
            index: HashMap::new(),
            before: Vec::new(),
        }
    }
}

/// A pair of the order that some packets contradict: `first` is placed
/// before `then`, as `agreeing` packets had them, but `against` packets
/// had `then` strictly first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict<P> {
    pub first: P,
    pub then: P,
    pub agreeing: u64,
    pub against: u64,
}

/// The inferred order of one kind's points on one side.
#[derive(Clone, Debug)]
pub struct PathOrder<P> {
    pub order: Vec<P>,
    /// Empty when every packet agrees with the order.
    pub conflicts: Vec<Conflict<P>>,
}

impl<P: Clone + Eq + Hash> Precedence<P> {
    /// The points seen so far (by [`Precedence::point`] or a count).
    pub fn points(&self) -> &[P] {
        &self.points
    }

    /// The index of `p`, added when new.
    pub fn point(&mut self, p: &P) -> usize {
        if let Some(&i) = self.index.get(p) {
            return i;
        }
        self.index.insert(p.clone(), self.points.len());
        self.points.push(p.clone());
        for row in &mut self.before {
            row.push(0);
        }
        self.before.push(vec![0; self.points.len()]);
        self.points.len() - 1
    }

    /// `a` came strictly before `b` in `n` packets.
    pub fn count(&mut self, a: &P, b: &P, n: u64) {
        let (i, j) = (self.point(a), self.point(b));
        if i != j {
            self.before[i][j] += n;
        }
    }

    /// One packet's points with their times (one per point).
    pub fn add_packet(&mut self, stamps: &[(P, i64)]) {
        let idx: Vec<usize> = stamps.iter().map(|(p, _)| self.point(p)).collect();
        for (x, (_, tx)) in stamps.iter().enumerate() {
            for (y, (_, ty)) in stamps.iter().enumerate() {
                if tx < ty && idx[x] != idx[y] {
                    self.before[idx[x]][idx[y]] += 1;
                }
            }
        }
    }

    /// Packets that had `a` strictly before `b`.
    pub fn before(&self, a: &P, b: &P) -> u64 {
        match (self.index.get(a), self.index.get(b)) {
            (Some(&i), Some(&j)) => self.before[i][j],
            _ => 0,
        }
    }

    /// The order: repeatedly the point that the fewest packets have after
    /// one of the points left (none, when an order fits every packet: such
    /// a point always exists then, and taking it keeps the rest fitting);
    /// among those, the one that most packets have first, then `hint`
    /// (for points that never met in a packet).
    pub fn order(&self, hint: impl Fn(&P, &P) -> Ordering) -> PathOrder<P> {
        let n = self.points.len();
        let mut left: Vec<usize> = (0..n).collect();
        let mut order = Vec::with_capacity(n);
        // Each point's counts against and ahead of the points left, kept
        // as points are taken: n² in all, where summing them afresh at
        // every step was n³ (256 points of a run from elsewhere: seconds
        // per kind).
        let mut against: Vec<u64> = (0..n)
            .map(|i| (0..n).map(|q| self.before[q][i]).sum())
            .collect();
        let mut ahead: Vec<u64> = (0..n).map(|i| self.before[i].iter().sum()).collect();
        while !left.is_empty() {
            let score = |i: usize| (against[i], std::cmp::Reverse(ahead[i]));
            let best = (0..left.len())
                .min_by(|&x, &y| {
                    let (a, b) = (left[x], left[y]);
                    score(a)
                        .cmp(&score(b))
                        .then_with(|| hint(&self.points[a], &self.points[b]))
                })
                .expect("points left");
            let taken = left.remove(best);
            for &i in &left {
                against[i] -= self.before[taken][i];
                ahead[i] -= self.before[i][taken];
            }
            order.push(taken);
        }
        let mut conflicts = Vec::new();
        for (x, &i) in order.iter().enumerate() {
            for &j in &order[x + 1..] {
                if self.before[j][i] > 0 {
                    conflicts.push(Conflict {
                        first: self.points[i].clone(),
                        then: self.points[j].clone(),
                        agreeing: self.before[i][j],
                        against: self.before[j][i],
                    });
                }
            }
        }
        PathOrder {
            order: order.into_iter().map(|i| self.points[i].clone()).collect(),
            conflicts,
        }
    }
}

/// The stages of one packet on one side: consecutive points of `order`
/// that are `present` in it.
pub fn stages<P>(order: &[P], present: impl Fn(&P) -> bool) -> Vec<(&P, &P)> {
    let here: Vec<&P> = order.iter().filter(|p| present(p)).collect();
    here.windows(2).map(|w| (w[0], w[1])).collect()
}

/// Where a stage lies relative to X-LAP's partition of the end-to-end
/// (sender total + channel + receiver total).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// On the path: the sender's stages sum to its total, the receiver's
    /// to its.
    Path,
    /// A sender's stage after its wire point (concurrent with the channel).
    AfterWire,
    /// A receiver's stage before its wire point.
    BeforeWire,
}

impl Part {
    /// The side as `stage_columns` names it: `tx`, `rx`, `tx_after_wire`,
    /// `rx_before_wire`.
    pub fn label(self, side: Side) -> &'static str {
        match (self, side) {
            (Part::Path, Side::Tx) => "tx",
            (Part::Path, Side::Rx) => "rx",
            (Part::AfterWire, _) => "tx_after_wire",
            (Part::BeforeWire, _) => "rx_before_wire",
        }
    }
}

/// The wire preference of a packets-table point column (`dev_xmit_ns`):
/// its rank in `TX_WIRE` or `RX_WIRE` for its side.
pub fn wire_rank(side: Side, column: &str) -> Option<usize> {
    let stem = column.strip_suffix("_ns").unwrap_or(column);
    let list = match side {
        Side::Tx => TX_WIRE,
        Side::Rx => RX_WIRE,
    };
    list.iter().position(|w| *w == stem)
}

/// The part of the stage `a`→`b` of `side` along `order`, `wire` giving
/// each point's rank among the wire points (best first). The packets table
/// takes as a packet's wire point the best one it has, so a stage starting
/// at or after the best wire point of the order lies after the sender's
/// wire (one the packet has: a stage skips only absent points), and one
/// ending at or before the receiver's before its wire.
pub fn part<P: PartialEq>(
    side: Side,
    order: &[P],
    wire: impl Fn(&P) -> Option<usize>,
    a: &P,
    b: &P,
) -> Part {
    let pos = |p: &P| order.iter().position(|q| q == p);
    let best = order
        .iter()
        .filter_map(|p| wire(p).map(|r| (r, p)))
        .min_by_key(|(r, _)| *r)
        .and_then(|(_, p)| pos(p));
    match (side, best) {
        (Side::Tx, Some(w)) if pos(a).is_some_and(|i| i >= w) => Part::AfterWire,
        (Side::Rx, Some(w)) if pos(b).is_some_and(|i| i <= w) => Part::BeforeWire,
        _ => Part::Path,
    }
}

/// The stage name of two point stems or columns: `<a>__<b>` (without
/// `_ns`).
pub fn stage_name(a: &str, b: &str) -> String {
    format!(
        "{}__{}",
        a.strip_suffix("_ns").unwrap_or(a),
        b.strip_suffix("_ns").unwrap_or(b)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_name(a: &&str, b: &&str) -> Ordering {
        a.cmp(b)
    }

    #[test]
    fn the_order_fits_every_packet_when_one_does() {
        // wakeup and switch_in only in some packets; their offsets from
        // the queue are long, yet they always precede recv_exit.
        let mut p = Precedence::default();
        for i in 0..100i64 {
            if i % 10 == 0 {
                p.add_packet(&[("queue", 0), ("wakeup", 5), ("switch", 900), ("recv", 950)]);
            } else {
                p.add_packet(&[("queue", 0), ("recv", 3)]);
            }
        }
        let o = p.order(by_name);
        assert_eq!(o.order, ["queue", "wakeup", "switch", "recv"]);
        assert!(o.conflicts.is_empty());
        let present = ["queue", "recv"];
        assert_eq!(
            stages(&o.order, |x| present.contains(x)),
            [(&"queue", &"recv")]
        );
    }

    #[test]
    fn a_run_no_order_fits_says_so() {
        let mut p = Precedence::default();
        for _ in 0..9 {
            p.add_packet(&[("a", 0), ("b", 1)]);
        }
        p.add_packet(&[("a", 1), ("b", 0)]);
        let o = p.order(by_name);
        assert_eq!(o.order, ["a", "b"]);
        assert_eq!(
            o.conflicts,
            [Conflict {
                first: "a",
                then: "b",
                agreeing: 9,
                against: 1
            }]
        );
    }

    #[test]
    fn stages_after_the_senders_wire_are_apart() {
        let tx = [
            "sock_send_enter_ns",
            "dev_queue_ns",
            "dev_start_xmit_ns",
            "dev_xmit_ns",
            "sock_send_exit_ns",
        ];
        let w = |c: &&str| wire_rank(Side::Tx, c);
        let part_of = |a, b| part(Side::Tx, &tx, w, &a, &b);
        assert_eq!(part_of(tx[0], tx[1]), Part::Path);
        assert_eq!(part_of(tx[1], tx[2]), Part::Path);
        assert_eq!(part_of(tx[2], tx[3]), Part::AfterWire);
        assert_eq!(part_of(tx[3], tx[4]), Part::AfterWire);
        let rx = ["dev_netif_rx_ns", "dev_receive_skb_ns", "sock_queue_ns"];
        let part_rx = |a, b| part(Side::Rx, &rx, |c: &&str| wire_rank(Side::Rx, c), &a, &b);
        assert_eq!(part_rx(rx[0], rx[1]), Part::Path);
        assert_eq!(
            stage_name("dev_queue_ns", "dev_xmit_ns"),
            "dev_queue__dev_xmit"
        );
    }
}
