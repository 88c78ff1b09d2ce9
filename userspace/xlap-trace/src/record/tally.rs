//! Running counts of what the ring buffer delivered, and the datagrams of
//! traced ports that turned out to be another socket's.

use std::collections::HashSet;
use xlap_abi::xlap_point;
use xlap_records::Stamp;

/// Running counts of what the ring buffer delivered (for every stamp: kept
/// cheap).
#[derive(Default)]
pub struct Tally {
    /// Stamps per point id (kernel and app ids are small).
    per_point: Vec<u64>,
    /// Distinct (flow, kind, seq) of stamps that know their flow.
    pub packets: HashSet<(u64, u32, u64), std::hash::BuildHasherDefault<FastHasher>>,
    /// The packet added last: a batch carries a packet's stamps together.
    last_packet: Option<(u64, u32, u64)>,
    pub stamps: u64,
}

impl Tally {
    pub fn add(&mut self, stamp: &Stamp) {
        let idx = stamp.point as usize;
        if idx >= self.per_point.len() {
            self.per_point.resize(idx + 1, 0);
        }
        self.per_point[idx] += 1;
        if let (Some(seq), true) = (stamp.seq, stamp.flow != 0) {
            let key = (stamp.flow, stamp.kind.unwrap_or(0), seq);
            if self.last_packet != Some(key) {
                self.packets.insert(key);
                self.last_packet = Some(key);
            }
        }
        self.stamps += 1;
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
pub const BY_PORT_POINTS: &[&str] = &["dev.netif_rx", "dev.gro_receive", "dev.receive_skb"];

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
