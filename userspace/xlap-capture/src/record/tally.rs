//! Running counts of what the ring buffer delivered, and the datagrams of
//! traced ports that turned out to be another socket's.

use std::collections::{HashMap, HashSet};
use xlap_abi::xlap_point;
use xlap_records::Stamp;

/// Running counts of what the ring buffer delivered (for every stamp: kept
/// cheap, and bounded in memory however long the run).
#[derive(Default)]
pub struct Tally {
    /// Stamps per point id (kernel and app ids are small).
    per_point: Vec<u64>,
    pub packets: PacketCounter,
    pub stamps: u64,
    /// The cgroup ids the stamps carried (run.json names them at the end);
    /// the last one apart, since a batch's stamps mostly share theirs.
    cgroups: FastSet<u64>,
    last_cgroup: u64,
}

impl Tally {
    pub fn add(&mut self, stamp: &Stamp) {
        let idx = stamp.point as usize;
        if idx >= self.per_point.len() {
            self.per_point.resize(idx + 1, 0);
        }
        self.per_point[idx] += 1;
        if let Some(id) = stamp.cgroup_id.filter(|id| *id != self.last_cgroup) {
            self.cgroups.insert(id);
            self.last_cgroup = id;
        }
        if let (Some(seq), true) = (stamp.seq, stamp.flow != 0) {
            self.packets
                .add((stamp.flow, stamp.kind.unwrap_or(0), seq), stamp.ts_ns);
        }
        self.stamps += 1;
    }

    /// A tally for the next segment of a rotated run: counts from zero,
    /// but a packet already counted in this one is not counted again.
    pub fn next_segment(&mut self) -> Tally {
        Tally {
            per_point: Vec::new(),
            packets: self.packets.next_segment(),
            stamps: 0,
            cgroups: FastSet::default(),
            last_cgroup: 0,
        }
    }

    /// The cgroup ids the stamps carried.
    pub fn cgroup_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.cgroups.iter().copied()
    }

    /// (point id, stamps) of the points seen.
    pub fn points(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.per_point
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(id, n)| (id as u16, *n))
    }
}

type PacketKey = (u64, u32, u64);
type FastSet<K> = HashSet<K, std::hash::BuildHasherDefault<FastHasher>>;

/// Distinct packets, (flow, kind, seq), counted per flow in bounded memory:
/// a packet is remembered for one to two generations of
/// [`PacketCounter::GENERATION_NS`] of stamp time, so the reader holds
/// about two generations of packets (~40 bytes each: 100 k packets/s cost
/// ~16 MB) instead of every packet of the run. A packet whose stamps lie
/// further apart than a generation (held in a queue for seconds) is
/// counted twice; a seq that wrapped and came back after a generation is a
/// new packet, as it is.
#[derive(Default)]
pub struct PacketCounter {
    current: FastSet<PacketKey>,
    previous: FastSet<PacketKey>,
    /// Stamp time the current generation began.
    generation_start_ns: u64,
    /// The packet added last: a batch carries a packet's stamps together.
    last: Option<PacketKey>,
    /// Distinct packets per flow.
    per_flow: HashMap<u64, u64, std::hash::BuildHasherDefault<FastHasher>>,
    total: u64,
}

impl PacketCounter {
    pub const GENERATION_NS: u64 = 2_000_000_000;

    /// Notes a packet's stamp; returns whether the packet is new.
    pub fn add(&mut self, key: PacketKey, ts_ns: u64) -> bool {
        if self.last == Some(key) {
            return false;
        }
        self.last = Some(key);
        if ts_ns >= self.generation_start_ns + Self::GENERATION_NS {
            self.previous = std::mem::take(&mut self.current);
            self.generation_start_ns = ts_ns;
        }
        if self.previous.contains(&key) || !self.current.insert(key) {
            return false;
        }
        *self.per_flow.entry(key.0).or_default() += 1;
        self.total += 1;
        true
    }

    pub fn len(&self) -> u64 {
        self.total
    }

    /// Packets counted, less those of `flows`.
    pub fn len_without(&self, flows: &HashSet<u64>) -> u64 {
        self.total
            - flows
                .iter()
                .filter_map(|f| self.per_flow.get(f))
                .sum::<u64>()
    }

    /// Packets remembered now (the memory bound's measure).
    #[cfg(test)]
    pub fn remembered(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    fn next_segment(&mut self) -> PacketCounter {
        PacketCounter {
            current: std::mem::take(&mut self.current),
            previous: std::mem::take(&mut self.previous),
            generation_start_ns: self.generation_start_ns,
            last: self.last,
            per_flow: Default::default(),
            total: 0,
        }
    }
}

/// A multiplicative hasher for the packet set (its keys are not chosen by
/// an adversary; SipHash costs more than the rest of a stamp's decoding).
#[derive(Default)]
pub struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The receive-device points, which stamp by port before any socket is
/// known: a flow marked foreign loses its stamps there.
pub const BY_PORT_POINTS: &[&str] = xlap_records::points::RX_DEVICE_POINTS;

/// Flows the socket-ingress hook saw go to a socket we do not trace, and
/// flows it saw reach ours (a multicast datagram may do both: then its
/// stamps stay). Per flow: a flow's datagrams all go to one socket of an
/// SO_REUSEPORT group or of a more specific bind.
#[derive(Default)]
pub struct ForeignFlows {
    foreign: HashSet<u64, std::hash::BuildHasherDefault<FastHasher>>,
    ours: HashSet<u64, std::hash::BuildHasherDefault<FastHasher>>,
    last_ours: u64,
}

impl ForeignFlows {
    /// Takes note of a stamp; returns whether it is a foreign marker (never
    /// written out).
    pub fn note(&mut self, stamp: &Stamp) -> bool {
        if stamp.point == xlap_point::XLAP_POINT_SOCK_FOREIGN as u16 {
            self.foreign.insert(stamp.flow);
            return true;
        }
        if stamp.point == xlap_point::XLAP_POINT_SOCK_QUEUE as u16 && stamp.flow != self.last_ours {
            self.ours.insert(stamp.flow);
            self.last_ours = stamp.flow;
        }
        false
    }

    /// The flows whose by-port stamps are to go.
    pub fn to_drop(&self) -> HashSet<u64> {
        self.foreign.difference(&self.ours).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::PacketCounter;
    use std::collections::HashSet;

    const SEC: u64 = 1_000_000_000;

    /// Each packet once however its stamps interleave; the memory holds two
    /// generations, not the run; a 16-bit seq that came back after a
    /// generation is a new packet; a flow's packets can be left out.
    #[test]
    fn packets_are_counted_once_in_bounded_memory() {
        let mut c = PacketCounter::default();
        let rate = 10_000u64; // packets per second, 60 s of them
        let mut most = 0;
        for i in 0..60 * rate {
            let ts = i * SEC / rate;
            let seq = i % 65_536;
            let flow = 1 + i % 3;
            // Three stamps per packet, the second after the next packet's first.
            assert!(c.add((flow, 0, seq), ts));
            if i > 0 {
                let prev = i - 1;
                assert!(!c.add((1 + prev % 3, 0, prev % 65_536), ts));
            }
            assert!(!c.add((flow, 0, seq), ts + 1000));
            most = most.max(c.remembered());
        }
        assert_eq!(c.len(), 60 * rate);
        let generation = (PacketCounter::GENERATION_NS / SEC * rate) as usize;
        assert!(most <= 2 * generation + 1, "remembered up to {most}");
        let without: HashSet<u64> = [2].into();
        assert_eq!(c.len_without(&without), 40 * rate);
    }

    #[test]
    fn the_next_segment_counts_afresh_but_not_a_packet_already_counted() {
        let mut c = PacketCounter::default();
        assert!(c.add((1, 0, 7), SEC));
        let mut next = c.next_segment();
        assert!(!next.add((1, 0, 7), SEC + 5));
        assert!(next.add((1, 0, 8), SEC + 10));
        assert_eq!((c.len(), next.len()), (1, 1));
    }
}
