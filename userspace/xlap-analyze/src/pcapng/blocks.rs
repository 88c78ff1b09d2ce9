//! The pcapng blocks the export writes (draft-ietf-opsawg-pcapng): a
//! Section Header Block, Interface Description Blocks and Enhanced Packet
//! Blocks, each with its options, little-endian (the byte-order magic
//! tells readers so).

use std::io::{self, Write};

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 0x0000_0001;
const EPB: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;

/// Option codes: `opt_comment` is valid in every block; the others are
/// the block's own (the same numbers mean different things per block).
const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_DESCRIPTION: u16 = 3;
const IF_TSRESOL: u16 = 9;

/// LINKTYPE_ETHERNET: the frames are synthesized Ethernet frames.
pub const LINKTYPE_ETHERNET: u16 = 1;

/// An option's value is at most 65 535 bytes (its length is 16 bits); a
/// longer text is cut at a character boundary.
fn clipped(text: &str) -> &str {
    let mut end = text.len().min(u16::MAX as usize);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Options of one block, encoded as they are added.
#[derive(Default)]
pub struct Options(Vec<u8>);

impl Options {
    pub fn add(mut self, code: u16, value: &[u8]) -> Self {
        self.0.extend_from_slice(&code.to_le_bytes());
        self.0
            .extend_from_slice(&(value.len() as u16).to_le_bytes());
        self.0.extend_from_slice(value);
        pad(&mut self.0);
        self
    }

    pub fn text(self, code: u16, text: &str) -> Self {
        self.add(code, clipped(text).as_bytes())
    }

    pub fn comment(self, text: &str) -> Self {
        self.text(OPT_COMMENT, text)
    }

    /// The options and their end marker (none at all when empty, which
    /// the format allows).
    fn finish(mut self) -> Vec<u8> {
        if !self.0.is_empty() {
            self.0.extend_from_slice(&OPT_END.to_le_bytes());
            self.0.extend_from_slice(&0u16.to_le_bytes());
        }
        self.0
    }
}

/// Pads to a multiple of 4 bytes with zeros, as every block field must be.
fn pad(buf: &mut Vec<u8>) {
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// Writes one block: type, total length, body, options, total length
/// again (readers walk the file backwards by the trailing length).
fn block(w: &mut impl Write, kind: u32, mut body: Vec<u8>, options: Options) -> io::Result<()> {
    pad(&mut body);
    body.extend(options.finish());
    let total = (body.len() + 12) as u32;
    w.write_all(&kind.to_le_bytes())?;
    w.write_all(&total.to_le_bytes())?;
    w.write_all(&body)?;
    w.write_all(&total.to_le_bytes())
}

/// The Section Header Block: version 1.0, section length unknown (-1: the
/// file is written in one pass).
pub fn section_header(w: &mut impl Write, application: &str, comment: &str) -> io::Result<()> {
    let mut body = Vec::with_capacity(16);
    body.extend_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
    body.extend_from_slice(&1u16.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&(-1i64).to_le_bytes());
    let options = Options::default()
        .comment(comment)
        .text(SHB_USERAPPL, application);
    block(w, SHB, body, options)
}

/// An Interface Description Block for Ethernet frames with timestamps in
/// nanoseconds (`if_tsresol` = 9: 10^-9 s); snap length 0 (no limit).
pub fn interface(w: &mut impl Write, name: &str, description: &str) -> io::Result<()> {
    let mut body = Vec::with_capacity(8);
    body.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    let options = Options::default()
        .text(IF_NAME, name)
        .text(IF_DESCRIPTION, description)
        .add(IF_TSRESOL, &[9]);
    block(w, IDB, body, options)
}

/// An Enhanced Packet Block: `frame` captured of a packet `original_len`
/// long, at `ts_ns` (ns since the epoch, the interface's resolution).
pub fn packet(
    w: &mut impl Write,
    interface: u32,
    ts_ns: u64,
    frame: &[u8],
    original_len: u32,
    comment: &str,
) -> io::Result<()> {
    let mut body = Vec::with_capacity(20 + frame.len() + 3);
    body.extend_from_slice(&interface.to_le_bytes());
    body.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
    body.extend_from_slice(&(ts_ns as u32).to_le_bytes());
    body.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    body.extend_from_slice(&original_len.max(frame.len() as u32).to_le_bytes());
    body.extend_from_slice(frame);
    block(w, EPB, body, Options::default().comment(comment))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn blocks_are_padded_and_carry_their_length_at_both_ends() {
        let mut out = Vec::new();
        section_header(&mut out, "xlap-trace", "a comment").unwrap();
        interface(&mut out, "tx", "sender").unwrap();
        packet(&mut out, 0, 1 << 40, &[1, 2, 3, 4, 5], 100, "seq=1").unwrap();
        let mut at = 0;
        let mut kinds = Vec::new();
        while at < out.len() {
            let len = u32_at(&out, at + 4) as usize;
            assert!(len.is_multiple_of(4));
            assert_eq!(u32_at(&out, at + len - 4) as usize, len);
            kinds.push(u32_at(&out, at));
            at += len;
        }
        assert_eq!(at, out.len());
        assert_eq!(kinds, [SHB, IDB, EPB]);
        // The EPB: interface 0, timestamp split high/low, lengths 5 and 100.
        let epb = out.len() - u32_at(&out, out.len() - 4) as usize;
        assert_eq!(u32_at(&out, epb + 12), 1 << 8);
        assert_eq!(u32_at(&out, epb + 16), 0);
        assert_eq!(u32_at(&out, epb + 20), 5);
        assert_eq!(u32_at(&out, epb + 24), 100);
    }

    #[test]
    fn a_comment_longer_than_an_option_is_cut_at_a_character() {
        let long = "é".repeat(40_000);
        let cut = clipped(&long);
        assert!(cut.len() <= u16::MAX as usize && cut.len().is_multiple_of(2));
    }
}
