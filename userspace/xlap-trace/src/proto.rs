//! Where a protocol keeps its sequence number and packet kind in the UDP
//! payload: named presets and the explicit `--seq-*`/`--kind-*` options.

use crate::exit::{failure, Code};
use anyhow::Result;
use xlap_abi::xlap_layout;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    pub seq_offset: u32,
    pub seq_size: u8,
    pub kind_offset: u32,
    /// 0: the protocol has no kind field.
    pub kind_size: u8,
    /// Bits of the kind field that make the kind (RTP: the payload type,
    /// 0x7f, without the marker bit); 0 keeps all.
    pub kind_mask: u32,
    pub big_endian: bool,
    /// Names of the kind values (run.json carries them; the analyses accept
    /// `--kind data`).
    pub kind_names: &'static [(u64, &'static str)],
}

/// The preset of a run without --proto.
pub const DEFAULT_PRESET: &str = "xlap-example";

/// `(name, layout, what it is)` of every preset.
pub const PRESETS: &[(&str, Layout, &str)] = &[
    (
        "xlap-example",
        Layout {
            seq_offset: 4,
            seq_size: 4,
            kind_offset: 0,
            kind_size: 1,
            kind_mask: 0,
            big_endian: true,
            kind_names: &[(1, "data"), (2, "parity"), (3, "feedback")],
        },
        "examples/prrt-lite: kind u8 at 0, seq u32 big-endian at 4",
    ),
    (
        "iperf3",
        Layout {
            seq_offset: 8,
            seq_size: 4,
            kind_offset: 0,
            kind_size: 0,
            kind_mask: 0,
            big_endian: true,
            kind_names: &[],
        },
        "iperf3 -u (32-bit counters): packet count u32 big-endian at 8",
    ),
    (
        "iperf3-64",
        Layout {
            seq_offset: 8,
            seq_size: 8,
            kind_offset: 0,
            kind_size: 0,
            kind_mask: 0,
            big_endian: true,
            kind_names: &[],
        },
        "iperf3 -u --udp-counters-64bit: packet count u64 big-endian at 8",
    ),
    (
        "sockperf",
        Layout {
            seq_offset: 0,
            seq_size: 8,
            kind_offset: 8,
            kind_size: 2,
            kind_mask: 0,
            big_endian: true,
            kind_names: &[],
        },
        "sockperf 3.x: sequence number u64 big-endian at 0, message flags u16 big-endian at 8 as kind",
    ),
    (
        "rtp",
        Layout {
            seq_offset: 2,
            seq_size: 2,
            kind_offset: 1,
            kind_size: 1,
            kind_mask: 0x7f,
            big_endian: true,
            kind_names: &[
                (0, "PCMU"),
                (8, "PCMA"),
                (9, "G722"),
                (26, "JPEG"),
                (31, "H261"),
                (32, "MPV"),
                (33, "MP2T"),
                (34, "H263"),
            ],
        },
        "RTP (RFC 3550): sequence number u16 big-endian at 2 (wraps: unwrapped per flow), payload type (byte 1 without the marker bit) as kind",
    ),
    (
        "rtcp",
        Layout {
            seq_offset: 10,
            seq_size: 4,
            kind_offset: 1,
            kind_size: 1,
            kind_mask: 0,
            big_endian: true,
            kind_names: &[
                (200, "SR"),
                (201, "RR"),
                (202, "SDES"),
                (203, "BYE"),
                (204, "APP"),
            ],
        },
        "RTCP (RFC 3550): packet type as kind; as seq the middle 32 bits of a sender report's NTP timestamp (what receivers echo as LSR)",
    ),
];

pub fn preset(name: &str) -> Result<Layout> {
    PRESETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, l, _)| *l)
        .ok_or_else(|| {
            let names: Vec<_> = PRESETS.iter().map(|(n, _, _)| *n).collect();
            failure(
                Code::Usage,
                format!("unknown --proto {name:?}; presets: {}", names.join(", ")),
            )
        })
}

impl Layout {
    pub fn validate(&self) -> Result<()> {
        if ![1, 2, 4, 8].contains(&self.seq_size) {
            return Err(failure(
                Code::Usage,
                format!("--seq-size must be 1, 2, 4 or 8, not {}", self.seq_size),
            ));
        }
        if ![0, 1, 2, 4].contains(&self.kind_size) {
            return Err(failure(
                Code::Usage,
                format!("--kind-size must be 0, 1, 2 or 4, not {}", self.kind_size),
            ));
        }
        if self.seq_offset > 65_000 || self.kind_offset > 65_000 {
            return Err(failure(
                Code::Usage,
                "field offsets must lie within a UDP datagram (< 65000)",
            ));
        }
        Ok(())
    }

    pub fn to_abi(self) -> xlap_layout {
        xlap_layout {
            seq_offset: self.seq_offset,
            kind_offset: self.kind_offset,
            kind_mask: self.kind_mask,
            seq_size: self.seq_size,
            kind_size: self.kind_size,
            big_endian: self.big_endian as u8,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_unknown_names_list_them() {
        for (name, layout, _) in PRESETS {
            layout.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let e = preset("nope").unwrap_err().to_string();
        assert!(e.contains("xlap-example") && e.contains("iperf3"), "{e}");
    }

    #[test]
    fn bad_sizes_are_usage_errors() {
        let mut l = preset("xlap-example").unwrap();
        l.seq_size = 3;
        assert_eq!(
            crate::exit::code_of(&l.validate().unwrap_err()),
            Code::Usage as u8
        );
    }
}
