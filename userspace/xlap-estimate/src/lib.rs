//! Latency without synchronised clocks: the built-in RTT prober (`probe
//! serve`, `probe rtt`) and the estimate of every host's software latency
//! from the RTTs between pairs of hosts (`estimate`).

pub mod estimate;
pub mod probe;
