//! A peer's stamps decoded while its run streams in (`record --collect
//! --live`): its Arrow stream (stamps.arrows, as it grows on the
//! collector) read by a confined child, each kernel stamp of a packet
//! passed to the recorder as one fixed-size record on a pipe. The record is
//! all the recorder reads of what a peer sent: [`PeerStamp::decode`] takes
//! exactly [`RECORD`] bytes and checks the point id, so no length, name or
//! count of the peer's reaches the privileged process.

use crate::points::{kernel_point, Side};
use arrow_array::{Array, BooleanArray, Int64Array, StringArray, UInt32Array, UInt64Array};
use arrow_ipc::reader::StreamReader;
use std::io::{Read, Write};

/// Bytes of one record on the pipe.
pub const RECORD: usize = 24;

/// One kernel point a packet passed on the peer, on the peer's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerStamp {
    pub ts_ns: i64,
    pub seq: u64,
    pub kind: Option<u32>,
    /// A kernel point id (`xlap_records::points`), checked on decoding.
    pub point: u16,
}

impl PeerStamp {
    pub fn encode(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[0..8].copy_from_slice(&self.ts_ns.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.kind.unwrap_or(0).to_le_bytes());
        b[20..22].copy_from_slice(&self.point.to_le_bytes());
        b[22] = self.kind.is_some() as u8;
        b
    }

    /// `None` for a record that is not one (an unknown point, a flag
    /// byte other than 0 or 1): the sender of the pipe is not trusted.
    pub fn decode(b: &[u8; RECORD]) -> Option<PeerStamp> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let point = u16::from_le_bytes([b[20], b[21]]);
        kernel_point(point as u32)?;
        let kind = match (b[22], b[23]) {
            (0, 0) => None,
            (1, 0) => Some(u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"))),
            _ => return None,
        };
        Some(PeerStamp {
            ts_ns: u64_at(0) as i64,
            seq: u64_at(8),
            kind,
            point,
        })
    }

    /// The side of the path its point is on.
    pub fn side(&self) -> Side {
        kernel_point(self.point as u32)
            .expect("checked on decoding")
            .side
    }
}

/// Reads an Arrow stream of stamps (the recorder's stamps.arrows schema)
/// from `input` and writes a record per kernel stamp of a packet (a seq,
/// not a later fragment) to `out`, until the stream ends, is not one, or
/// `out` closes. App points are left out (their names are the peer's).
/// Returns the stamps written.
pub fn decode_stream(input: impl Read, mut out: impl Write) -> Result<u64, String> {
    let reader =
        StreamReader::try_new(input, None).map_err(|e| format!("not a stamps stream: {e}"))?;
    let points: std::collections::HashMap<&str, u16> = crate::points::kernel_points()
        .map(|p| (p.name, p.id))
        .collect();
    let mut written = 0u64;
    for batch in reader {
        let batch = batch.map_err(|e| format!("a batch that does not read: {e}"))?;
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| format!("a batch without its {name} column"))
        };
        let wrong = |name: &str| format!("a batch whose {name} column has another type");
        let ts = col("ts_ns")?
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| wrong("ts_ns"))?;
        let seq = col("seq")?
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or_else(|| wrong("seq"))?;
        let kind = col("kind")?
            .as_any()
            .downcast_ref::<UInt32Array>()
            .ok_or_else(|| wrong("kind"))?;
        let point = col("point")?
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| wrong("point"))?;
        let fragment = col("fragment")?
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| wrong("fragment"))?;
        let mut buf = Vec::with_capacity(batch.num_rows() * RECORD);
        for i in 0..batch.num_rows() {
            if seq.is_null(i) || ts.is_null(i) || point.is_null(i) || fragment.value(i) {
                continue;
            }
            let Some(&id) = points.get(point.value(i)) else {
                continue;
            };
            let s = PeerStamp {
                ts_ns: ts.value(i),
                seq: seq.value(i),
                kind: (!kind.is_null(i)).then(|| kind.value(i)),
                point: id,
            };
            buf.extend_from_slice(&s.encode());
            written += 1;
        }
        out.write_all(&buf)
            .and_then(|_| out.flush())
            .map_err(|e| format!("the recorder stopped reading: {e}"))?;
    }
    Ok(written)
}

/// A file that grows while it is read (the peer's stream as it arrives):
/// at its end, waits and reads again, until `done` says no more will come.
pub struct Tail<R, F> {
    pub inner: R,
    pub done: F,
    pub poll: std::time::Duration,
}

impl<R: Read, F: FnMut() -> bool> Read for Tail<R, F> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.inner.read(buf)?;
            if n > 0 || buf.is_empty() || (self.done)() {
                return Ok(n);
            }
            std::thread::sleep(self.poll);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_wrong_one_is_refused() {
        let s = PeerStamp {
            ts_ns: 123_456_789,
            seq: 42,
            kind: Some(1),
            point: crate::points::kernel_points().next().unwrap().id,
        };
        assert_eq!(PeerStamp::decode(&s.encode()), Some(s));
        let none = PeerStamp { kind: None, ..s };
        assert_eq!(PeerStamp::decode(&none.encode()), Some(none));
        let mut bad = s.encode();
        bad[20..22].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(PeerStamp::decode(&bad), None, "an unknown point");
        let mut bad = s.encode();
        bad[22] = 7;
        assert_eq!(PeerStamp::decode(&bad), None, "a flag byte");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        assert!(decode_stream(&b"not arrow at all, not at all"[..], &mut out).is_err());
        // A continuation marker and a huge metadata length.
        let mut huge = vec![0xff, 0xff, 0xff, 0xff];
        huge.extend_from_slice(&0x7fff_fff0u32.to_le_bytes());
        assert!(decode_stream(&huge[..], &mut out).is_err());
        assert!(out.is_empty());
    }
}
