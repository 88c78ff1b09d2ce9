//! prrt-lite: a small PRRT-like real-time transport over UDP, written as the
//! example protocol of xlap-trace.
//!
//! The sender paces data packets, adds one XOR parity (redundancy) packet
//! after every block of `k` data packets and hands each packet to a transmit
//! thread. The receiver recovers a single loss per block from the parity,
//! delivers data in order within a deadline through an application thread and
//! sends feedback (received/lost/delay) back to the sender. Both ends write
//! what they did as JSON lines, which the tests use as ground truth.
//!
//! # Offload and packet-shape options
//!
//! All off by default (the defaults send and log exactly as before):
//!
//! - `send --burst N`: data packets leave in bursts of N back to back, one
//!   burst every N × `--period-us` (same mean rate).
//! - `send --gso N` (1..=64): UDP GSO. The consecutive equal-length datagrams
//!   of a burst go out in one `sendmsg` with a `UDP_SEGMENT` control message
//!   (gso_size = the datagram length), up to N per send and 65 000 bytes in
//!   all; a length change (a parity packet is 8 bytes longer than data)
//!   starts a new send, and a send never spans two bursts. `--burst`
//!   defaults to N, so one full send leaves every N × `--period-us`. A send
//!   the path refuses (EINVAL: a segment above the path MTU) is logged as
//!   `gso_fallback` and its datagrams are sent one by one.
//! - `send --payload` up to 64 976 bytes (65 000 − 24-byte header): datagrams
//!   above the path MTU are IP-fragmented by the kernel.
//! - `send --ipv6-ext hbh|dst`: a sticky 8-byte hop-by-hop
//!   (`IPV6_HOPOPTS`) or destination-options (`IPV6_DSTOPTS`) header, PadN
//!   only, on every datagram; IPv6 destinations only, needs CAP_NET_RAW.
//! - `recv --udp-gro`: `UDP_GRO` on the socket; a coalesced receive is split
//!   at its segment size and each datagram handled as a single one.
//!
//! Log fields they add (ground truth per datagram, see [`udp`], [`batch`]):
//!
//! - with `--gso`, each not-dropped `sent` line: `gso_batch` (index of the
//!   send call, from 0), `gso_segments` (datagrams in that send, 1 for a
//!   plain send) and `gso_size` (its segment size = datagram bytes). Lines
//!   are written after their send, so a dropped datagram's line (without
//!   these fields) may come before the send it would have joined.
//! - with `--udp-gro`, each `received` (and `malformed`) line: `gro_batch`
//!   (index of the recvmsg, from 0) and `gro_segments` (datagrams it
//!   brought).
//!
//! The protocol fires a marker at each of X-LAP's stamp points through the
//! [`Markers`] trait; the `xlap-example` binary maps them to USDT probes, the
//! `xlap-example-plain` binary to nothing.

pub mod batch;
pub mod cli;
pub mod clock;
pub mod fec;
pub mod inject;
pub mod log;
pub mod receiver;
pub mod sender;
pub mod udp;
pub mod wire;

/// Calls `$callback!` with the names of every marker, sender side first.
///
/// The list is the protocol's documented marker set; the binaries build their
/// [`Markers`] implementations from it and the tests check the notes against
/// [`MARKER_NAMES`].
#[macro_export]
macro_rules! for_each_marker {
    ($callback:ident) => {
        $callback!(
            send_start,
            encode_start,
            encode_end,
            submit,
            link_transmit_start,
            link_transmit_end,
            link_receive,
            handle_start,
            handle_end,
            decode_start,
            decode_end,
            feedback_send,
            deliver,
        );
    };
}

macro_rules! declare_markers {
    ($($name:ident),* $(,)?) => {
        /// The protocol's stamp points. Each hook receives the packet's
        /// sequence number and kind (see [`wire::Kind`]).
        pub trait Markers: Send + Sync + 'static {
            $(fn $name(seq: u32, kind: u8);)*
        }

        /// Names of every marker, in [`for_each_marker!`] order.
        pub const MARKER_NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}
for_each_marker!(declare_markers);
