//! Exit codes of `xlap-trace`, and errors that carry one.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | runtime failure (I/O, BPF load/attach error, ...) |
//! | 2 | bad command line (unknown option, bad value, unknown query/parameter/kind, SQL error, a layout that keyed none of the datagrams a run traced) |
//! | 3 | missing privileges: a capability `record` needs (each one named; README: Privileges and privacy) |
//! | 4 | the kernel lacks something needed (BTF, a tracepoint) |
//! | 5 | a target process does not exist |
//! | 6 | a bad input file or run directory (not a run or packets table, wrong schema version, no packets, one end only, a run still being recorded, a live stream that cannot be recovered, a file of a run that is a link, a FIFO, corrupt or beyond the limits of docs/usage.md); for `estimate`, not an RTT file of `probe rtt`, a pair without samples, or pairs that do not determine every host (the message names the pairs to add) |
//! | 7 | nothing to key: the targets held only TCP sockets (or none) and never opened a UDP socket during the run (its files are still written) |
//! | 8 | out of memory: the command reached its memory ceiling (`XLAP_MAX_MEMORY`) or the engine's limit (`XLAP_MEMORY_LIMIT`); the message names the step ([`memory`]) |
//!
//! `xlap-trace run -- CMD` exits with the command's status instead (128 +
//! the signal that ended it) once tracing worked; with the codes above when
//! it did not.

pub mod memory;

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Runtime = 1,
    Usage = 2,
    Privileges = 3,
    Kernel = 4,
    NoSuchProcess = 5,
    BadInput = 6,
    NotUdp = 7,
    OutOfMemory = 8,
}

/// An error with its exit code; anywhere in an `anyhow` chain.
#[derive(Debug)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

pub fn failure(code: Code, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Failure {
        code,
        message: message.into(),
    })
}

/// The exit code of an error: the first [`Failure`] in its chain, else 1.
pub fn code_of(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(|c| c.downcast_ref::<Failure>())
        .map_or(Code::Runtime as u8, |f| f.code as u8)
}
