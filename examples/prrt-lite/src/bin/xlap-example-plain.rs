//! The example protocol without markers: the kernel-only tracing path.

use prrt_lite::Markers;

/// Every hook is empty, so the binary carries no `.note.stapsdt`.
struct NoMarkers;

macro_rules! no_markers {
    ($($name:ident),* $(,)?) => {
        impl Markers for NoMarkers {
            $(#[inline(always)] fn $name(_seq: u32, _kind: u8) {})*
        }
    };
}
prrt_lite::for_each_marker!(no_markers);

fn main() -> std::process::ExitCode {
    prrt_lite::cli::main::<NoMarkers>()
}
