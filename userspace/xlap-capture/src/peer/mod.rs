//! Recorders on two hosts that meet over the network (`record --to`,
//! `record --collect`): a peer streams its run to a collector, which
//! writes it into a run directory of the peer's inside its own and, at
//! its end, correlates both (the confined `finish` child does: nothing a
//! peer sent is decoded by the root recorder). Frames (frame.rs), the
//! token's handshake (auth.rs), the peer's files on the collector
//! (files.rs), the two ends (sender.rs, collector.rs).

pub mod auth;
pub mod collector;
pub mod files;
pub mod frame;
pub mod live;
pub mod sender;
#[cfg(test)]
mod tests;

/// Peers one collector takes (each a run directory, a thread while
/// connected, and a place in the correlation).
pub const MAX_PEERS: usize = 8;
/// Connections open at once, authenticated or not: a client that connects
/// and says nothing holds one for the handshake's 5 s at most.
pub const MAX_CONNECTIONS: usize = 16;
/// Bytes one peer may send when `--max-size` does not say: 16 GiB.
pub const DEFAULT_MAX_BYTES_PER_PEER: u64 = 16 << 30;
