//! Command line of the example binaries (`xlap-example`, `xlap-example-plain`).

use crate::inject::{Injection, Injections};
use crate::log::EventLog;
use crate::receiver::{self, ReceiverConfig};
use crate::sender::{self, SenderConfig};
use crate::Markers;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// A small PRRT-like real-time transport over UDP: paced data, XOR parity per
/// block, in-order delivery within a deadline, feedback.
///
/// Exit codes: 0 success, 1 runtime failure (bind, timeout), 2 bad arguments.
#[derive(Parser, Debug)]
#[command(version)]
pub struct Cli {
    #[command(subcommand)]
    pub role: Role,
}

#[derive(Subcommand, Debug)]
pub enum Role {
    /// Send `--count` data packets to `--dest`.
    Send {
        /// Receiver address (IPv4 or [IPv6]:port).
        #[arg(long)]
        dest: SocketAddr,
        /// Local address to send from.
        #[arg(long, default_value = "0.0.0.0:0")]
        bind: SocketAddr,
        /// Number of data packets.
        #[arg(long, default_value_t = 1000)]
        count: u32,
        /// Interval between data packets, microseconds.
        #[arg(long, default_value_t = 100)]
        period_us: u64,
        /// Payload bytes per data packet (header: 24 bytes).
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u16).range(1..=1400))]
        payload: u16,
        /// Data packets per FEC block (one parity packet each).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=64))]
        fec_k: u8,
        /// Probability that the artificial channel drops a packet (0..1).
        #[arg(long, default_value_t = 0.0)]
        drop: f64,
        /// Seed of the drop decisions.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Wait until this file exists before sending (scripts start tracing first).
        #[arg(long)]
        start_file: Option<PathBuf>,
        /// Give up waiting for --start-file after this many seconds.
        #[arg(long, default_value_t = 60)]
        start_timeout_s: u64,
        /// Keep reading feedback this long after the last packet, ms.
        #[arg(long, default_value_t = 300)]
        linger_ms: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Receive, recover, deliver and send feedback.
    Recv {
        /// Address to listen on.
        #[arg(long)]
        bind: SocketAddr,
        /// Per-packet delivery deadline after its send time, ms.
        #[arg(long, default_value_t = 20)]
        deadline_ms: u64,
        /// Interval between feedback packets, ms.
        #[arg(long, default_value_t = 10)]
        feedback_interval_ms: u64,
        /// Number of data packets the sender sends (ends the run when all are
        /// delivered or lost).
        #[arg(long)]
        expect: Option<u32>,
        /// End the run after this long without a packet, ms.
        #[arg(long, default_value_t = 1000)]
        idle_exit_ms: u64,
        /// Fail when no packet arrives within this time, s.
        #[arg(long, default_value_t = 60)]
        first_packet_timeout_s: u64,
        /// Write this file (with the pid) once the socket is bound.
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(clap::Args, Debug)]
pub struct Common {
    /// Write what happened as JSON lines to this file.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Busy-wait in a stage: STAGE=MICROS[@FROM-TO] (stages: encode, submit,
    /// transmit, handle, decode, deliver). Repeatable.
    #[arg(long)]
    inject: Vec<Injection>,
}

pub fn main<M: Markers>() -> ExitCode {
    let cli = Cli::parse();
    match run::<M>(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlap-example: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run<M: Markers>(cli: Cli) -> anyhow::Result<()> {
    match cli.role {
        Role::Send {
            dest,
            bind,
            count,
            period_us,
            payload,
            fec_k,
            drop,
            seed,
            start_file,
            start_timeout_s,
            linger_ms,
            common,
        } => {
            anyhow::ensure!(
                (0.0..=1.0).contains(&drop),
                "--drop must lie in 0..1, got {drop}"
            );
            let log = EventLog::open(common.log.as_deref())?;
            let cfg = SenderConfig {
                dest,
                bind,
                count,
                period_ns: period_us * 1000,
                payload_len: payload as usize,
                k: fec_k,
                drop_probability: drop,
                seed,
                inject: Injections(common.inject),
                linger: Duration::from_millis(linger_ms),
                start_file,
                start_timeout: Duration::from_secs(start_timeout_s),
            };
            let result = sender::run::<M>(&cfg, &log);
            log.flush()?;
            result
        }
        Role::Recv {
            bind,
            deadline_ms,
            feedback_interval_ms,
            expect,
            idle_exit_ms,
            first_packet_timeout_s,
            ready_file,
            common,
        } => {
            let log = EventLog::open(common.log.as_deref())?;
            let cfg = ReceiverConfig {
                bind,
                deadline_ns: deadline_ms * 1_000_000,
                feedback_interval_ns: feedback_interval_ms * 1_000_000,
                expect,
                idle_exit: Duration::from_millis(idle_exit_ms),
                first_packet_timeout: Duration::from_secs(first_packet_timeout_s),
                inject: Injections(common.inject),
                ready_file,
            };
            let result = receiver::run::<M>(&cfg, &log);
            log.flush()?;
            result
        }
    }
}
