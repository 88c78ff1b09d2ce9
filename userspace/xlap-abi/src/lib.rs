//! Raw BPF/user wire types, generated from `bpf/xlap_abi.h` at build time.
//!
//! Nothing here is written by hand: the C header is the one definition of the
//! event layout. Decoding into safe records happens in `xlap-records`.

#![no_std]
#![allow(non_camel_case_types, non_upper_case_globals, dead_code)]

include!(concat!(env!("OUT_DIR"), "/abi.rs"));

/// Size of one stamp; a ring-buffer record holds one or more of them.
pub const STAMP_SIZE: usize = core::mem::size_of::<xlap_stamp>();

impl xlap_stamp {
    /// Reads a stamp from a ring-buffer record; `None` when the record is
    /// shorter than a stamp (a layout mismatch, never expected).
    pub fn from_bytes(bytes: &[u8]) -> Option<xlap_stamp> {
        if bytes.len() < STAMP_SIZE {
            return None;
        }
        // SAFETY: the record holds at least STAMP_SIZE bytes and xlap_stamp is
        // a plain C struct of integers, valid for any bit pattern;
        // read_unaligned copes with the ring buffer's 8-byte alignment.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr() as *const xlap_stamp) })
    }

    /// The stamps of one ring-buffer record: a single stamp or a batch of
    /// them back to back (see `struct xlap_batch`). A trailing partial stamp
    /// (a layout mismatch, never expected) is ignored.
    pub fn all_from_bytes(bytes: &[u8]) -> impl Iterator<Item = xlap_stamp> + '_ {
        bytes
            .chunks_exact(STAMP_SIZE)
            .filter_map(xlap_stamp::from_bytes)
    }
}

impl xlap_batch {
    /// The stamps still waiting in a batch read back from the kernel's map.
    pub fn pending(&self) -> &[xlap_stamp] {
        &self.stamps[..(self.n as usize).min(self.stamps.len())]
    }
}

/// The names of the loss reasons (`enum xlap_loss`), by value: run.json's
/// per-point `lost_<name>` counters, the `tracer_points` table's columns.
/// Its length is the C enum's count, so a new reason without a name does
/// not compile.
pub const LOSS_REASONS: [&str; xlap_loss::XLAP_LOSS_COUNT as usize] = [
    "ringbuf_full",
    "map_full",
    "parse",
    "unmatched",
    "gso",
    "frag",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_names_follow_the_c_enum() {
        use xlap_loss::*;
        let named = [
            (XLAP_LOSS_RINGBUF_FULL, "ringbuf_full"),
            (XLAP_LOSS_MAP_FULL, "map_full"),
            (XLAP_LOSS_PARSE, "parse"),
            (XLAP_LOSS_UNMATCHED, "unmatched"),
            (XLAP_LOSS_GSO, "gso"),
            (XLAP_LOSS_FRAG, "frag"),
        ];
        assert_eq!(named.len(), LOSS_REASONS.len());
        for (value, name) in named {
            assert_eq!(LOSS_REASONS[value as usize], name);
        }
    }
}
