//! USDT markers for X-LAP stamp points in Rust protocols.
//!
//! ```ignore
//! xlap_marker::mark!(send_start, seq, xlap_marker::KIND_DATA);
//! ```
//!
//! Each `mark!` is a SystemTap SDT probe in provider `xlap` with two 8-byte
//! arguments, the sequence number and the packet kind: a note in
//! `.note.stapsdt` (the layout `<sys/sdt.h>` writes, so every USDT tool reads
//! it) and, in the code, the 5-byte nop `0f 1f 44 00 00` instead of the usual
//! 1-byte `nop`. Untraced the nop costs nothing measurable; traced, Linux 6.18
//! and later rewrite a uprobe on a 5-byte nop into a call to a per-process
//! trampoline after its first hit (`arch_uprobe_optimize`), which is cheaper
//! than the trap a 1-byte nop takes (about 0.83 against 1.0 µs per hit on our
//! machines). Older kernels treat both alike. `xlap-trace --pid PID` attaches
//! to every `xlap:*` marker and records it as the stamp point `app.<name>`.
//!
//! Faster still, the in-process path ([`ring`]): `xlap-trace` switches the
//! markers of a process to write their stamps into a shared-memory ring it
//! reads, with no trap at all; the uprobe path stays for `--marker-path
//! uprobe` and for every other USDT tool. The C header
//! `examples/markers/c/xlap_markers.h` emits the same notes and the same
//! nop (uprobe path only).

pub mod ring;

/// Data packet kind of the example protocol.
pub const KIND_DATA: u8 = 1;
/// Redundancy (FEC parity) packet kind of the example protocol.
pub const KIND_REDUNDANCY: u8 = 2;
/// Feedback packet kind of the example protocol.
pub const KIND_FEEDBACK: u8 = 3;

/// Fire the marker `xlap:<point>` with the packet's `seq` and `kind`.
///
/// The note records where the two values are at the nop (a register each:
/// `-8@%reg`, a signed 8-byte value). The asm block is a compiler barrier
/// (it may read and write memory), so the marker stays where it is written
/// relative to the code around it: the stamp's time is that place's time.
/// After the nop, the site's address is taken (one `lea`, for the ring
/// path's records) and the ring switch tested (one load and a branch).
#[cfg(target_arch = "x86_64")]
#[macro_export]
macro_rules! mark {
    ($point:ident, $seq:expr, $kind:expr) => {{
        let seq: i64 = ($seq) as i64;
        let kind: i64 = ($kind) as i64;
        let site: usize;
        // SAFETY: a nop and a lea; the rest are assembler directives into
        // other sections (the notes and the weak `_.stapsdt.base` anchor).
        unsafe {
            ::core::arch::asm!(
                "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
                "lea 990b(%rip), {site}",
                ".pushsection .note.stapsdt, \"\", \"note\"",
                ".balign 4",
                ".4byte 992f-991f, 994f-993f, 3",
                "991: .asciz \"stapsdt\"",
                "992: .balign 4",
                "993: .8byte 990b",
                ".8byte _.stapsdt.base",
                ".8byte 0",
                ".asciz \"xlap\"",
                concat!(".asciz \"", stringify!($point), "\""),
                ".asciz \"-8@{seq} -8@{kind}\"",
                "994: .balign 4",
                ".popsection",
                // Where the ring switch of this process is (ring.rs).
                ".pushsection .note.stapsdt, \"\", \"note\"",
                ".balign 4",
                ".4byte 996f-995f, 998f-997f, 3",
                "995: .asciz \"stapsdt\"",
                "996: .balign 4",
                "997: .8byte 990b",
                ".8byte _.stapsdt.base",
                ".8byte {control}",
                ".asciz \"xlap_ring\"",
                ".asciz \"control\"",
                ".asciz \"\"",
                "998: .balign 4",
                ".popsection",
                ".ifndef _.stapsdt.base",
                ".pushsection .stapsdt.base, \"aG\", \"progbits\", .stapsdt.base, comdat",
                ".weak _.stapsdt.base",
                ".hidden _.stapsdt.base",
                "_.stapsdt.base: .space 1",
                ".size _.stapsdt.base, 1",
                ".popsection",
                ".endif",
                seq = in(reg) seq,
                kind = in(reg) kind,
                site = out(reg) site,
                control = sym $crate::ring::CONTROL,
                options(att_syntax, nostack, preserves_flags),
            );
        }
        if $crate::ring::CONTROL
            .state
            .load(::core::sync::atomic::Ordering::Relaxed)
            != 0
        {
            $crate::ring::stamp(site, seq, kind);
        }
    }};
}

/// Elsewhere the markers compile to nothing (the arguments are still
/// evaluated, so a build for another architecture behaves the same).
#[cfg(not(target_arch = "x86_64"))]
#[macro_export]
macro_rules! mark {
    ($point:ident, $seq:expr, $kind:expr) => {{
        let _ = (($seq) as i64, ($kind) as i64);
    }};
}
