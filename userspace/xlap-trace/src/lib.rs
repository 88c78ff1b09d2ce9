//! xlap-trace as a library: the pieces the CLI and the benchmark share.

pub mod analyze_cmd;
pub mod batch_export;
pub mod capabilities;
pub mod capture;
pub mod cgroup;
pub mod ci;
pub mod cli;
pub mod correlate_cmd;
pub mod demo;
pub mod estimate;
pub mod exit;
pub mod hwts;
pub mod ifaces;
pub mod kfunc;
pub mod point_sets;
pub mod preflight;
pub mod probe;
pub mod proto;
pub mod reader_priority;
pub mod record;
pub mod recover;
pub mod report_cmd;
pub mod runmeta;
pub mod sockets;
pub mod targets;
pub mod usdt;
