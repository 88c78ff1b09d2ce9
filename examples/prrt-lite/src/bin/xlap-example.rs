//! The example protocol with its X-LAP USDT markers compiled in.

use prrt_lite::Markers;
use xlap_marker::mark;

/// Every hook fires the USDT marker `xlap:<name>(seq, kind)`.
struct Usdt;

macro_rules! usdt_markers {
    ($($name:ident),* $(,)?) => {
        impl Markers for Usdt {
            $(#[inline(always)] fn $name(seq: u32, kind: u8) { mark!($name, seq, kind) })*
        }
    };
}
prrt_lite::for_each_marker!(usdt_markers);

fn main() -> std::process::ExitCode {
    prrt_lite::cli::main::<Usdt>()
}
