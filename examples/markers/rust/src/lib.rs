//! USDT markers for X-LAP stamp points in Rust protocols.
//!
//! ```ignore
//! xlap_marker::mark!(send_start, seq, xlap_marker::KIND_DATA);
//! ```
//!
//! Each `mark!` is a SystemTap SDT probe in provider `xlap` with two 8-byte
//! arguments, the sequence number and the packet kind. Untraced it costs one
//! `nop`; `xlap-trace --pid PID` attaches to every `xlap:*` marker and records
//! it as the stamp point `app.<name>`. The C header
//! `examples/markers/c/xlap_markers.h` emits the same note layout.

#![no_std]

#[doc(hidden)]
pub use probe as __probe;

/// Data packet kind of the example protocol.
pub const KIND_DATA: u8 = 1;
/// Redundancy (FEC parity) packet kind of the example protocol.
pub const KIND_REDUNDANCY: u8 = 2;
/// Feedback packet kind of the example protocol.
pub const KIND_FEEDBACK: u8 = 3;

/// Fire the marker `xlap:<point>` with the packet's `seq` and `kind`.
#[macro_export]
macro_rules! mark {
    ($point:ident, $seq:expr, $kind:expr) => {
        $crate::__probe::probe!(xlap, $point, ($seq) as i64, ($kind) as i64)
    };
}
