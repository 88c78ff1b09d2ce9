//! USDT (SystemTap SDT) probes of an ELF file: where they are, which
//! semaphore gates them, and where their arguments live.
//!
//! The address arithmetic follows the SDT note format: a note records the
//! probe's link-time address and the link-time address of `.stapsdt.base`;
//! when prelinking moved the file, the difference to the section's current
//! address is added. The attach point is the probe's *file offset*, which
//! uprobes need.

mod args;
mod notes;

pub use args::{parse_args, Arg, ArgLocation, Register};
pub use notes::{parse_probes, read_probes, Probe};

#[derive(Debug, thiserror::Error)]
pub enum UsdtError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not an ELF file this tool can read: {source}")]
    Elf {
        path: String,
        source: object::read::Error,
    },
    #[error("malformed .note.stapsdt in {path}: {what}")]
    Note { path: String, what: String },
    #[error("cannot parse USDT argument spec {spec:?}: {what}")]
    Arg { spec: String, what: String },
}
