//! The wire format. Every packet starts with a 24-byte header, big-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | kind: 1 data, 2 parity, 3 feedback |
//! | 1 | 1 | flags (reserved, 0) |
//! | 2 | 2 | payload length |
//! | 4 | 4 | sequence number (own space per kind) |
//! | 8 | 8 | send time, sender's `CLOCK_MONOTONIC` ns |
//! | 16 | 4 | FEC block number |
//! | 20 | 1 | index in block (data) / data packets covered (parity) |
//! | 21 | 1 | k, data packets per block |
//! | 22 | 2 | reserved |
//!
//! xlap-trace's `--proto xlap-example` preset reads seq at offset 4 (4 bytes,
//! big-endian) and kind at offset 0 (1 byte).

use anyhow::{bail, Result};

pub const HEADER_LEN: usize = 24;
pub const SEQ_OFFSET: usize = 4;
pub const KIND_OFFSET: usize = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Kind {
    Data = 1,
    Parity = 2,
    Feedback = 3,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Data, Kind::Parity, Kind::Feedback];

    /// The name the logs give it (and xlap-trace's `xlap-example` preset:
    /// a test holds the two to this one list).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Data => "data",
            Kind::Parity => "parity",
            Kind::Feedback => "feedback",
        }
    }

    pub fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Data),
            2 => Some(Kind::Parity),
            3 => Some(Kind::Feedback),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub payload_len: u16,
    pub seq: u32,
    pub send_time_ns: u64,
    pub block: u32,
    pub index: u8,
    pub k: u8,
}

impl Header {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        out.push(0);
        out.extend_from_slice(&self.payload_len.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.send_time_ns.to_be_bytes());
        out.extend_from_slice(&self.block.to_be_bytes());
        out.push(self.index);
        out.push(self.k);
        out.extend_from_slice(&[0, 0]);
    }

    /// Parses a packet into its header and payload.
    pub fn decode(packet: &[u8]) -> Result<(Header, &[u8])> {
        if packet.len() < HEADER_LEN {
            bail!(
                "packet of {} bytes is shorter than the header",
                packet.len()
            );
        }
        let Some(kind) = Kind::from_u8(packet[0]) else {
            bail!("unknown packet kind {}", packet[0]);
        };
        let be32 = |o: usize| u32::from_be_bytes(packet[o..o + 4].try_into().unwrap());
        let payload_len = u16::from_be_bytes([packet[2], packet[3]]);
        let payload = &packet[HEADER_LEN..];
        if payload.len() != payload_len as usize {
            bail!(
                "payload length field says {payload_len}, packet carries {}",
                payload.len()
            );
        }
        let header = Header {
            kind,
            payload_len,
            seq: be32(4),
            send_time_ns: u64::from_be_bytes(packet[8..16].try_into().unwrap()),
            block: be32(16),
            index: packet[20],
            k: packet[21],
        };
        Ok((header, payload))
    }
}

/// Feedback payload (receiver → sender), big-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Feedback {
    /// Data and parity packets received so far.
    pub received: u32,
    /// Data packets given up (not recoverable within the deadline).
    pub lost: u32,
    /// Data packets rebuilt from parity.
    pub recovered: u32,
    /// Highest data seq received.
    pub highest_seq: u32,
    /// Mean one-way delay of the data since the last feedback (receive time
    /// minus the sender's send time; meaningful when both ends share a clock).
    pub mean_delay_ns: u64,
    /// Send time of the newest data packet, echoed for the sender's RTT.
    pub echo_send_time_ns: u64,
    /// Time between receiving that packet and sending this feedback.
    pub echo_hold_ns: u64,
}

pub const FEEDBACK_LEN: usize = 40;

impl Feedback {
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.received, self.lost, self.recovered, self.highest_seq] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        for v in [
            self.mean_delay_ns,
            self.echo_send_time_ns,
            self.echo_hold_ns,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn decode(payload: &[u8]) -> Result<Feedback> {
        if payload.len() != FEEDBACK_LEN {
            bail!(
                "feedback payload of {} bytes, expected {FEEDBACK_LEN}",
                payload.len()
            );
        }
        let be32 = |o: usize| u32::from_be_bytes(payload[o..o + 4].try_into().unwrap());
        let be64 = |o: usize| u64::from_be_bytes(payload[o..o + 8].try_into().unwrap());
        Ok(Feedback {
            received: be32(0),
            lost: be32(4),
            recovered: be32(8),
            highest_seq: be32(12),
            mean_delay_ns: be64(16),
            echo_send_time_ns: be64(24),
            echo_hold_ns: be64(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_seq_sits_at_the_documented_offset() {
        let h = Header {
            kind: Kind::Parity,
            payload_len: 3,
            seq: 0x0102_0304,
            send_time_ns: 99,
            block: 7,
            index: 4,
            k: 4,
        };
        let mut buf = Vec::new();
        h.encode(&mut buf);
        assert_eq!(buf.len(), HEADER_LEN);
        assert_eq!(&buf[SEQ_OFFSET..SEQ_OFFSET + 4], &[1, 2, 3, 4]);
        assert_eq!(buf[KIND_OFFSET], 2);
        buf.extend_from_slice(b"abc");
        let (back, payload) = Header::decode(&buf).unwrap();
        assert_eq!(back, h);
        assert_eq!(payload, b"abc");
    }

    #[test]
    fn short_or_foreign_packets_are_rejected() {
        assert!(Header::decode(&[1; 10]).is_err());
        let mut buf = vec![9u8; HEADER_LEN];
        buf[2] = 0;
        buf[3] = 0;
        assert!(Header::decode(&buf).is_err());
    }

    #[test]
    fn feedback_round_trips() {
        let f = Feedback {
            received: 1,
            lost: 2,
            recovered: 3,
            highest_seq: 4,
            mean_delay_ns: 5,
            echo_send_time_ns: 6,
            echo_hold_ns: 7,
        };
        let mut buf = Vec::new();
        f.encode(&mut buf);
        assert_eq!(Feedback::decode(&buf).unwrap(), f);
    }
}
