//! The command line of `probe` and `estimate`, turned into the estimate
//! crate's options.

use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use xlap_estimate::estimate::{self, EstimateOptions};
use xlap_estimate::probe::{RttOptions, ServeOptions};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EstimateFormat {
    /// Aligned columns for a terminal.
    Table,
    /// One object: hosts, estimates per host and statistic, pairs with
    /// their RTT statistics and residuals, condition number, notes.
    Json,
}

#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// RTT files written by `xlap-trace probe rtt`, one per measured pair
    /// (more than one per pair: each is an equation).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// One-way hardware latency of a pair (wire, switch) in microseconds:
    /// A-B=US (repeatable; default 0: it is counted in the hosts' t).
    #[arg(long = "hardware-us", value_name = "A-B=US")]
    pub hardware: Vec<String>,
    #[arg(short, long, value_enum, default_value = "table")]
    pub format: EstimateFormat,
    /// Bootstrap resamples for the intervals (0: none).
    #[arg(long, default_value_t = 200)]
    pub bootstrap: usize,
    /// Confidence of the intervals.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// Seed of the resampling (the same seed, the same intervals).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Subcommand, Debug)]
pub enum ProbeCommand {
    /// A UDP echo responder for `probe rtt`, until SIGINT/SIGTERM or
    /// --duration.
    Serve(ServeArgs),
    /// Send probes to a responder, one at a time, and write every RTT
    /// (CLOCK_MONOTONIC) as JSON for `xlap-trace estimate`.
    Rtt(RttArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address and UDP port to answer on.
    #[arg(long, value_name = "ADDR:PORT")]
    pub bind: std::net::SocketAddr,
    /// Emulated extra software latency of this host per direction: a busy
    /// wait of this many microseconds after every receive and before every
    /// send.
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub delay_us: u64,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Write this file (with our pid) once the socket is bound.
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<std::path::PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct RttArgs {
    /// The responder (`probe serve --bind`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub to: std::net::SocketAddr,
    /// Local address to send from (default: any, port chosen by the kernel).
    #[arg(long, value_name = "ADDR:PORT")]
    pub bind: Option<std::net::SocketAddr>,
    /// Name of this host in the estimate.
    #[arg(long, value_name = "NAME")]
    pub name_from: String,
    /// Name of the responder's host in the estimate.
    #[arg(long, value_name = "NAME")]
    pub name_to: String,
    /// Probes to record (after the warm-up).
    #[arg(long, default_value_t = 1000)]
    pub count: u64,
    /// Interval between the starts of consecutive probes, microseconds (a
    /// probe whose echo comes later starts the next one at once).
    #[arg(long, value_name = "US", default_value_t = 1000)]
    pub interval_us: u64,
    /// Emulated extra software latency of this host per direction (see
    /// `probe serve --delay-us`).
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub delay_us: u64,
    /// An echo later than this counts the probe as lost.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Probes sent first and not recorded (neighbour resolution, cold
    /// caches).
    #[arg(long, default_value_t = 10)]
    pub warmup: u64,
    /// Sequence number of the first probe (the warm-up's included): give
    /// concurrent probers of one traced run distinct ranges.
    #[arg(long, default_value_t = 1)]
    pub first_seq: u64,
    /// Datagram size in bytes (at least 16).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Wait for this file to exist before the first probe (a tracer can
    /// attach first).
    #[arg(long, value_name = "FILE")]
    pub start_file: Option<std::path::PathBuf>,
    /// The JSON file to write.
    #[arg(short, long, value_name = "FILE")]
    pub out: std::path::PathBuf,
}

impl From<&EstimateArgs> for EstimateOptions {
    fn from(a: &EstimateArgs) -> Self {
        EstimateOptions {
            files: a.files.clone(),
            hardware: a.hardware.clone(),
            format: match a.format {
                EstimateFormat::Table => estimate::Format::Table,
                EstimateFormat::Json => estimate::Format::Json,
            },
            bootstrap: a.bootstrap,
            confidence: a.confidence,
            seed: a.seed,
        }
    }
}

impl From<&ServeArgs> for ServeOptions {
    fn from(a: &ServeArgs) -> Self {
        ServeOptions {
            bind: a.bind,
            delay_us: a.delay_us,
            duration: a.duration,
            ready_file: a.ready_file.clone(),
        }
    }
}

impl From<&RttArgs> for RttOptions {
    fn from(a: &RttArgs) -> Self {
        RttOptions {
            to: a.to,
            bind: a.bind,
            name_from: a.name_from.clone(),
            name_to: a.name_to.clone(),
            count: a.count,
            interval_us: a.interval_us,
            delay_us: a.delay_us,
            timeout_ms: a.timeout_ms,
            warmup: a.warmup,
            first_seq: a.first_seq,
            size: a.size,
            start_file: a.start_file.clone(),
            out: a.out.clone(),
        }
    }
}
