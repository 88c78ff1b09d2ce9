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
//! The protocol fires a marker at each of X-LAP's stamp points through the
//! [`Markers`] trait; the `xlap-example` binary maps them to USDT probes, the
//! `xlap-example-plain` binary to nothing.

pub mod cli;
pub mod clock;
pub mod fec;
pub mod inject;
pub mod log;
pub mod receiver;
pub mod sender;
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
