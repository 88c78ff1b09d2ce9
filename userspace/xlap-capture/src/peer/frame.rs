//! The peer link's frames: a fixed header (magic, type, length) and a
//! payload whose length is checked against its type's own bound before a
//! byte of it is read. The collector runs as root and the network is not
//! trusted: nothing here allocates more than a frame's bound, and a header
//! that does not begin with the magic is garbage at once.

use std::io::{Read, Write};

/// Every frame begins with these bytes (and the link's version).
pub const MAGIC: [u8; 3] = *b"XLP";
pub const VERSION: u8 = 1;
/// Magic, version, type, length (u32, big-endian).
const HEADER: usize = 9;

/// One MiB of stream or Parquet per frame.
pub const MAX_CHUNK: usize = 1 << 20;
/// run.json is read by the analyses up to 16 MiB (xlap_records::strict_json).
pub const MAX_META: usize = 16 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// collector → peer: its nonce.
    Nonce = 1,
    /// peer → collector: its nonce, its MAC, who it is.
    Hello = 2,
    /// collector → peer: its proof of the token, the stream bytes it holds.
    Accept = 3,
    /// collector → peer: why not (text).
    Refuse = 4,
    /// peer → collector: run.json as it is now.
    Meta = 5,
    /// peer → collector: offset (u64) and bytes of stamps.arrows.
    Stream = 6,
    /// peer → collector: offset (u64) and bytes of stamps.parquet.
    Parquet = 7,
    /// peer → collector: the stream's and the Parquet file's sizes.
    End = 8,
    /// collector → peer: the stream bytes held, whether all arrived.
    Done = 9,
    /// peer → collector: nothing new, still there.
    Ping = 10,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        use Kind::*;
        [
            Nonce, Hello, Accept, Refuse, Meta, Stream, Parquet, End, Done, Ping,
        ]
        .into_iter()
        .find(|k| *k as u8 == b)
    }

    /// The largest payload a frame of this kind may have.
    fn max_len(self) -> usize {
        match self {
            Kind::Nonce => 32,
            Kind::Hello => 64 + 4096,
            Kind::Accept => 32 + 8,
            Kind::Refuse => 1024,
            Kind::Meta => MAX_META,
            Kind::Stream | Kind::Parquet => 8 + MAX_CHUNK,
            Kind::End => 16,
            Kind::Done => 9,
            Kind::Ping => 0,
        }
    }
}

/// What can be wrong with a frame, named for the message that says so.
#[derive(Debug)]
pub enum FrameError {
    Io(std::io::Error),
    /// The connection closed between frames.
    Closed,
    BadMagic([u8; 4]),
    UnknownKind(u8),
    TooLong {
        kind: Kind,
        len: u64,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Io(e) => write!(f, "{e}"),
            FrameError::Closed => write!(f, "the connection closed"),
            FrameError::BadMagic(b) => write!(
                f,
                "not an xlap-trace peer (bad magic {:02x}{:02x}{:02x}{:02x})",
                b[0], b[1], b[2], b[3]
            ),
            FrameError::UnknownKind(k) => write!(f, "unknown frame type {k}"),
            FrameError::TooLong { kind, len } => write!(
                f,
                "a {kind:?} frame of {len} bytes (at most {})",
                kind.max_len()
            ),
        }
    }
}

impl From<std::io::Error> for FrameError {
    fn from(e: std::io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// Writes one frame: header and payload (the parts, concatenated) in one
/// write, so a frame is whole on the wire or the connection failed.
pub fn write(w: &mut impl Write, kind: Kind, parts: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(len <= kind.max_len());
    let mut frame = Vec::with_capacity(HEADER + len);
    frame.extend_from_slice(&MAGIC);
    frame.push(VERSION);
    frame.push(kind as u8);
    frame.extend_from_slice(&(len as u32).to_be_bytes());
    for p in parts {
        frame.extend_from_slice(p);
    }
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one frame: its kind and payload (at most the kind's bound).
pub fn read(r: &mut impl Read) -> Result<(Kind, Vec<u8>), FrameError> {
    let mut head = [0u8; HEADER];
    match r.read(&mut head[..1])? {
        0 => return Err(FrameError::Closed),
        _ => r.read_exact(&mut head[1..])?,
    }
    if head[..3] != MAGIC || head[3] != VERSION {
        return Err(FrameError::BadMagic([head[0], head[1], head[2], head[3]]));
    }
    let kind = Kind::from_u8(head[4]).ok_or(FrameError::UnknownKind(head[4]))?;
    let len = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) as u64;
    if len > kind.max_len() as u64 {
        return Err(FrameError::TooLong { kind, len });
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok((kind, payload))
}

/// A u64 at the start of a payload, and the rest.
pub fn split_u64(payload: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = payload.split_at_checked(8)?;
    Some((u64::from_be_bytes(head.try_into().ok()?), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back_and_garbage_is_named() {
        let mut buf = Vec::new();
        write(&mut buf, Kind::Stream, &[&7u64.to_be_bytes(), b"abc"]).unwrap();
        let (k, p) = read(&mut buf.as_slice()).unwrap();
        assert_eq!(k, Kind::Stream);
        assert_eq!(split_u64(&p), Some((7, &b"abc"[..])));
        let garbage = b"GET / HTTP/1.1\r\n";
        assert!(matches!(
            read(&mut garbage.as_slice()),
            Err(FrameError::BadMagic(_))
        ));
        // A length beyond the kind's bound is refused before any payload
        // is read or allocated.
        let mut huge = Vec::from(&MAGIC[..]);
        huge.extend_from_slice(&[VERSION, Kind::Ping as u8]);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            read(&mut huge.as_slice()),
            Err(FrameError::TooLong { .. })
        ));
        assert!(matches!(read(&mut &b""[..]), Err(FrameError::Closed)));
    }
}
