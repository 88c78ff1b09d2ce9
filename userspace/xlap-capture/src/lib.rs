//! The recorder of xlap-trace: the BPF programs (built from `bpf/` by
//! build.rs) loaded and attached to the kernel's tracepoints and to the
//! targets' USDT markers, the targets' sockets found and marked, stamps
//! read from the ring buffers and streamed to Arrow, rotation into
//! segments, the live view. It takes a [`record::RecordOptions`], never
//! the command line.

pub mod batch_export;
pub mod capabilities;
pub mod capture;
pub mod cgroup;
pub mod cgroup_names;
pub mod hooks;
pub mod hwts;
pub mod ifaces;
pub mod kfunc;
pub mod peer;
pub mod point_sets;
pub mod preflight;
pub mod preload;
pub mod proc_root;
pub mod proto;
pub mod reader_priority;
pub mod record;
pub mod recover;
pub mod runmeta;
pub mod sockets;
pub mod targets;
pub mod usdt;
