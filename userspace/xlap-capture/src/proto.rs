//! Where a protocol keeps its sequence number and packet kind in the UDP
//! payload: named presets and the explicit `--seq-*`/`--kind-*` options.

use anyhow::Result;
use xlap_abi::xlap_layout;
use xlap_exit::{failure, Code};

/// Layouts the capture programs hold: the default and three per port.
pub const MAX_LAYOUTS: usize = xlap_abi::XLAP_LAYOUTS as usize;
/// Payload bytes that must hold the fields of every layout of a run.
pub const WINDOW: u32 = xlap_abi::XLAP_WINDOW;

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

impl From<Layout> for xlap_records::run_meta::SeqLayout {
    fn from(l: Layout) -> Self {
        Self {
            seq_offset: l.seq_offset,
            seq_size: l.seq_size,
            kind_offset: l.kind_offset,
            kind_size: l.kind_size,
            kind_mask: l.kind_mask,
            big_endian: l.big_endian,
            kind_names: l
                .kind_names
                .iter()
                .map(|&(kind, name)| (kind, name.to_string()))
                .collect(),
        }
    }
}

impl From<&PortLayout> for xlap_records::run_meta::PortSeqLayout {
    fn from(l: &PortLayout) -> Self {
        Self {
            port: l.port,
            layout: l.layout.into(),
        }
    }
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
    (
        "dns",
        Layout {
            seq_offset: 0,
            seq_size: 2,
            kind_offset: 2,
            kind_size: 1,
            kind_mask: 0x80,
            big_endian: true,
            kind_names: &[(0, "query"), (128, "response")],
        },
        "DNS over UDP (RFC 1035): the message ID u16 big-endian at 0 as seq (a response carries its query's; wraps: unwrapped per flow), the QR bit (byte 2 & 0x80) as kind",
    ),
    (
        "xlap-probe",
        Layout {
            seq_offset: 8,
            seq_size: 8,
            kind_offset: 0,
            kind_size: 1,
            kind_mask: 0,
            big_endian: true,
            kind_names: &[(1, "probe"), (2, "echo")],
        },
        "xlap-trace probe (rtt, serve): kind u8 at 0, seq u64 big-endian at 8",
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

/// Layouts of a run: the default, and those of datagrams to or from given
/// ports (`--layout PORT=SPEC`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Layouts {
    pub default: Layout,
    pub ports: Vec<PortLayout>,
}

/// `--layout PORT=SPEC`: datagrams whose destination (or else source) port
/// is `port` keep their seq and kind as `layout` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PortLayout {
    pub port: u16,
    #[serde(flatten)]
    pub layout: Layout,
}

impl std::str::FromStr for PortLayout {
    type Err = String;

    /// `PORT=PRESET` or `PORT=seq:OFFSET:SIZE[,kind:OFFSET:SIZE[:MASK]][,le]`.
    fn from_str(text: &str) -> std::result::Result<PortLayout, String> {
        let usage = "expected PORT=PRESET or PORT=seq:OFFSET:SIZE[,kind:OFFSET:SIZE[:MASK]][,le]";
        let (port, spec) = text.split_once('=').ok_or(usage)?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{port:?} is not a UDP port (1..65535); {usage}"))?;
        let layout = if let Some((_, l, _)) = PRESETS.iter().find(|(n, _, _)| *n == spec) {
            *l
        } else {
            parse_spec(spec).map_err(|e| format!("{e}; {usage}"))?
        };
        layout.validate().map_err(|e| e.to_string())?;
        Ok(PortLayout { port, layout })
    }
}

fn parse_spec(spec: &str) -> std::result::Result<Layout, String> {
    let mut l = Layout {
        seq_offset: 0,
        seq_size: 0,
        kind_offset: 0,
        kind_size: 0,
        kind_mask: 0,
        big_endian: true,
        kind_names: &[],
    };
    let num = |v: &str| -> std::result::Result<u32, String> {
        let parsed = match v.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => v.parse(),
        };
        parsed.map_err(|_| format!("{v:?} is not a number"))
    };
    for part in spec.split(',') {
        let fields: Vec<&str> = part.split(':').collect();
        match fields.as_slice() {
            ["seq", off, size] => {
                l.seq_offset = num(off)?;
                l.seq_size = num(size)? as u8;
            }
            ["kind", off, size] => {
                l.kind_offset = num(off)?;
                l.kind_size = num(size)? as u8;
            }
            ["kind", off, size, mask] => {
                l.kind_offset = num(off)?;
                l.kind_size = num(size)? as u8;
                l.kind_mask = num(mask)?;
            }
            ["le"] => l.big_endian = false,
            ["be"] => l.big_endian = true,
            _ => {
                let names: Vec<_> = PRESETS.iter().map(|(n, _, _)| *n).collect();
                return Err(format!(
                    "{part:?} is neither a preset ({}) nor a field",
                    names.join(", ")
                ));
            }
        }
    }
    if l.seq_size == 0 {
        return Err(format!("{spec:?} has no seq:OFFSET:SIZE"));
    }
    Ok(l)
}

impl Layouts {
    /// The layouts as the capture programs take them, with the payload
    /// window that holds every layout's fields (read once per datagram).
    pub fn to_abi(&self) -> Result<([xlap_layout; MAX_LAYOUTS], u32, u32)> {
        if self.ports.len() > MAX_LAYOUTS - 1 {
            return Err(failure(
                Code::Usage,
                format!("at most {} --layout options", MAX_LAYOUTS - 1),
            ));
        }
        for (i, a) in self.ports.iter().enumerate() {
            if self.ports[..i].iter().any(|b| b.port == a.port) {
                return Err(failure(
                    Code::Usage,
                    format!("--layout names port {} twice", a.port),
                ));
            }
        }
        let all: Vec<Layout> = std::iter::once(self.default)
            .chain(self.ports.iter().map(|p| p.layout))
            .collect();
        let start = all.iter().map(|l| l.first_byte()).min().unwrap_or(0);
        let end = all.iter().map(|l| l.end_byte()).max().unwrap_or(0);
        if end - start > WINDOW {
            return Err(failure(
                Code::Usage,
                format!(
                    "the seq and kind fields of all layouts must lie within {WINDOW} bytes of each other (these span payload bytes {start}..{end})"
                ),
            ));
        }
        let mut out = [xlap_layout::default(); MAX_LAYOUTS];
        out[0] = self.default.to_abi();
        for (slot, p) in out[1..].iter_mut().zip(&self.ports) {
            *slot = p.layout.to_abi();
            slot.port = p.port;
        }
        Ok((out, start, end - start))
    }

    /// Names of the kinds of every layout (the default's first).
    pub fn kind_names(&self) -> Vec<(u64, &'static str)> {
        let mut names: Vec<(u64, &'static str)> = Vec::new();
        for l in std::iter::once(&self.default).chain(self.ports.iter().map(|p| &p.layout)) {
            for (kind, name) in l.kind_names {
                if !names.iter().any(|(k, _)| k == kind) {
                    names.push((*kind, name));
                }
            }
        }
        names
    }
}

impl Layout {
    /// First payload byte of its fields.
    fn first_byte(&self) -> u32 {
        if self.kind_size > 0 {
            self.seq_offset.min(self.kind_offset)
        } else {
            self.seq_offset
        }
    }

    /// One past the last payload byte of its fields.
    fn end_byte(&self) -> u32 {
        let seq = self.seq_offset + self.seq_size as u32;
        if self.kind_size > 0 {
            seq.max(self.kind_offset + self.kind_size as u32)
        } else {
            seq
        }
    }

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
    fn port_layouts_parse_presets_and_fields() {
        let rtcp: PortLayout = "5005=rtcp".parse().unwrap();
        assert_eq!((rtcp.port, rtcp.layout), (5005, preset("rtcp").unwrap()));
        let own: PortLayout = "7000=seq:8:4,kind:0:2:0x7f,le".parse().unwrap();
        assert_eq!(own.port, 7000);
        let l = own.layout;
        assert_eq!(
            (l.seq_offset, l.seq_size, l.kind_offset, l.kind_size),
            (8, 4, 0, 2)
        );
        assert_eq!((l.kind_mask, l.big_endian), (0x7f, false));
        for bad in [
            "rtcp",
            "0=rtcp",
            "70000=rtcp",
            "5005=nope",
            "5005=kind:0:1",
            "5005=seq:0:3",
            "5005=seq:x:4",
        ] {
            assert!(bad.parse::<PortLayout>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn one_window_holds_every_layout_or_the_run_is_refused() {
        let rtp = preset("rtp").unwrap();
        let layouts = Layouts {
            default: rtp,
            ports: vec!["5005=rtcp".parse().unwrap()],
        };
        let (abi, start, len) = layouts.to_abi().unwrap();
        // RTP's kind at 1 .. RTCP's seq ending at 14.
        assert_eq!((start, len), (1, 13));
        assert_eq!((abi[0].port, abi[1].port, abi[2].port), (0, 5005, 0));
        assert_eq!(abi[1].seq_offset, 10);
        let far = Layouts {
            default: rtp,
            ports: vec!["6000=seq:100:4".parse().unwrap()],
        };
        let e = far.to_abi().unwrap_err();
        assert_eq!(xlap_exit::code_of(&e), Code::Usage as u8);
        assert!(e.to_string().contains("within 64 bytes"), "{e}");
        let twice = Layouts {
            default: rtp,
            ports: vec!["6000=rtcp".parse().unwrap(), "6000=rtp".parse().unwrap()],
        };
        assert!(twice.to_abi().is_err());
        let many = Layouts {
            default: rtp,
            ports: (1..=4)
                .map(|p| format!("{p}=rtp").parse().unwrap())
                .collect(),
        };
        assert!(many.to_abi().is_err());
        // A single layout far into the payload is fine: its own window.
        let deep = Layouts {
            default: "1=seq:1000:8".parse::<PortLayout>().unwrap().layout,
            ports: vec![],
        };
        assert_eq!(deep.to_abi().unwrap().1, 1000);
    }

    #[test]
    fn bad_sizes_are_usage_errors() {
        let mut l = preset("xlap-example").unwrap();
        l.seq_size = 3;
        assert_eq!(
            xlap_exit::code_of(&l.validate().unwrap_err()),
            Code::Usage as u8
        );
    }
}
