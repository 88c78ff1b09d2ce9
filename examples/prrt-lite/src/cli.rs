//! Command line of the example binaries (`xlap-example`, `xlap-example-plain`).

use crate::inject::{Injection, Injections};
use crate::log::EventLog;
use crate::receiver::{self, ReceiverConfig};
use crate::sender::{self, SenderConfig, MAX_PAYLOAD};
use crate::udp::Ipv6Ext;
use crate::Markers;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
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
        /// Payload bytes per data packet (header: 24 bytes), up to 64976
        /// (65000 - 24). Datagrams above the path MTU are IP-fragmented by
        /// the kernel; a parity packet is 8 bytes longer than the data.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u16).range(1..=MAX_PAYLOAD as i64))]
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
        /// Send data packets in bursts of N, back to back, one burst every
        /// N x --period-us (same mean rate). Default 1, or N of --gso N.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        burst: Option<u32>,
        /// UDP GSO: send up to N consecutive equal-length datagrams of a burst
        /// in one sendmsg with a UDP_SEGMENT control message (a length change,
        /// e.g. a parity packet, starts a new send). Implies --burst N unless
        /// given, so one send leaves every N x --period-us. The log keeps one
        /// `sent` line per datagram, with gso_batch/gso_segments/gso_size.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=64))]
        gso: Option<u8>,
        /// Send up to N consecutive equal-length datagrams of a burst in
        /// one sendmmsg call (one message each), as --gso groups them.
        /// Implies --burst N unless given. `sent` lines carry mmsg_batch
        /// (the call's index) and mmsg_messages.
        #[arg(long, value_name = "N", conflicts_with = "gso", value_parser = clap::value_parser!(u8).range(1..=64))]
        sendmmsg: Option<u8>,
        /// The call that sends each datagram (without --gso/--sendmmsg):
        /// send (default), writev (two iovecs: the header, the rest),
        /// sendfile (from a memory file) or sendto (naming the destination,
        /// as an unconnected sender does).
        #[arg(long, default_value = "send", conflicts_with_all = ["gso", "sendmmsg"])]
        send_call: crate::udp::SendCall,
        /// Put an 8-byte IPv6 extension header (PadN only) before UDP in every
        /// datagram: hop-by-hop (IPV6_HOPOPTS) or destination options
        /// (IPV6_DSTOPTS). IPv6 --dest only; needs CAP_NET_RAW.
        #[arg(long, value_enum, value_name = "KIND")]
        ipv6_ext: Option<Ipv6Ext>,
        /// Open the socket only after --start-file appears, and do not bind
        /// it: the kernel picks the local port at connect (autobind), as a
        /// client that starts while a tracer already runs. --bind is
        /// ignored.
        #[arg(long)]
        late_socket: bool,
        /// Send every datagram twice: also on a second socket to this
        /// address, over a second, independent path (AFDX's network B); the
        /// receiver keeps the first copy. `sent` lines then carry `path` (1
        /// or 2), one line per copy. Not with --gso, --sendmmsg or
        /// --late-socket.
        #[arg(long, conflicts_with_all = ["gso", "sendmmsg", "late_socket"])]
        dest2: Option<SocketAddr>,
        /// Local address of the second path's socket.
        #[arg(long, default_value = "0.0.0.0:0", requires = "dest2")]
        bind2: SocketAddr,
        /// SO_PRIORITY of the sender's sockets: a tc class id (`1:20`, hex
        /// as tc writes it: an htb or prio qdisc puts the packets straight
        /// into that class) or a decimal number.
        #[arg(long, value_parser = crate::udp::parse_priority)]
        priority: Option<u32>,
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
        /// UDP GRO: let the kernel hand over several datagrams in one recvmsg
        /// (setsockopt UDP_GRO); they are split at the reported segment size
        /// and handled one by one as usual. `received` lines then carry
        /// gro_batch (the recvmsg's index) and gro_segments (its datagrams).
        #[arg(long)]
        udp_gro: bool,
        /// How the socket is read: recvfrom (default), peek (MSG_PEEK, then
        /// recvfrom), iov-split:BYTES (recvmsg into two iovecs, the first of
        /// BYTES), recvmmsg:N (up to N datagrams per call). `received` lines
        /// then carry recv_call (the call's index) and recv_datagrams.
        #[arg(long, default_value = "recvfrom", conflicts_with = "udp_gro")]
        recv_mode: crate::udp::RecvMode,
        /// Join an SO_REUSEPORT group on --bind (the kernel spreads the
        /// senders' flows over the group's sockets).
        #[arg(long)]
        reuseport: bool,
        /// Fork once the socket is bound (and --ready-file written): the
        /// child receives and logs (a `forked` line with its pid), the
        /// parent waits for it and exits with its status.
        #[arg(long)]
        fork: bool,
        /// Also listen on this address, the second path of a sender with
        /// --dest2: both sockets are polled, the first copy of a packet is
        /// kept and a later one is logged as a `duplicate` with its skew.
        /// `received` and `delivered` lines carry `path` (1 or 2). Only with
        /// the default --recv-mode.
        #[arg(long, conflicts_with_all = ["udp_gro", "reuseport", "fork"])]
        bind2: Option<SocketAddr>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(clap::Args, Debug)]
pub struct Common {
    /// Write what happened as JSON lines to this file.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Only these events in the log (comma-separated, e.g. summary for a
    /// long run); default every event.
    #[arg(long, value_delimiter = ',', value_name = "EVENT")]
    log_events: Vec<String>,
    /// Busy-wait in a stage: STAGE=MICROS[@FROM-TO] (stages: activate, encode, submit,
    /// transmit, path1, handle, decode, deliver). Repeatable.
    #[arg(long)]
    inject: Vec<Injection>,
}

pub fn main<M: Markers>() -> ExitCode {
    let cli = Cli::parse();
    if let Err(message) = cli.check() {
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit();
    }
    match run::<M>(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlap-example: {e:#}");
            ExitCode::from(1)
        }
    }
}

impl Cli {
    /// What clap cannot check alone: combinations of arguments.
    pub fn check(&self) -> Result<(), String> {
        if let Role::Send {
            dest,
            ipv6_ext: Some(ext),
            ..
        } = &self.role
        {
            if !sender::is_ipv6_destination(*dest) {
                return Err(format!(
                    "--ipv6-ext {} needs an IPv6 --dest (IPv4 has no extension headers), got {dest}",
                    ext.to_possible_value()
                        .map(|v| v.get_name().to_owned())
                        .unwrap_or_default()
                ));
            }
        }
        Ok(())
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
            burst,
            gso,
            sendmmsg,
            send_call,
            ipv6_ext,
            late_socket,
            dest2,
            bind2,
            priority,
            common,
        } => {
            anyhow::ensure!(
                (0.0..=1.0).contains(&drop),
                "--drop must lie in 0..1, got {drop}"
            );
            let log = EventLog::open_only(common.log.as_deref(), &common.log_events)?;
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
                second_path: dest2.map(|dest| (dest, bind2)),
                priority,
                burst: burst.unwrap_or(gso.or(sendmmsg).map_or(1, u32::from)),
                gso,
                sendmmsg,
                ipv6_ext,
                late_socket,
                send_call,
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
            udp_gro,
            recv_mode,
            reuseport,
            fork,
            bind2,
            common,
        } => {
            let log = EventLog::open_only(common.log.as_deref(), &common.log_events)?;
            let cfg = ReceiverConfig {
                bind,
                deadline_ns: deadline_ms * 1_000_000,
                feedback_interval_ns: feedback_interval_ms * 1_000_000,
                expect,
                idle_exit: Duration::from_millis(idle_exit_ms),
                first_packet_timeout: Duration::from_secs(first_packet_timeout_s),
                inject: Injections(common.inject),
                ready_file,
                udp_gro,
                recv_mode,
                reuseport,
                fork,
                bind2,
            };
            let result = receiver::run::<M>(&cfg, &log);
            log.flush()?;
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("xlap-example").chain(args.split_whitespace()))
    }

    fn send(args: &str) -> Role {
        parse(&format!("send --dest [::1]:9000 {args}"))
            .unwrap()
            .role
    }

    #[test]
    fn new_send_options_default_to_off() {
        let Role::Send {
            payload,
            burst,
            gso,
            ipv6_ext,
            ..
        } = send("")
        else {
            panic!("not a send")
        };
        assert_eq!((payload, burst, gso, ipv6_ext), (200, None, None, None));
        let Role::Recv { udp_gro, .. } = parse("recv --bind [::1]:9000").unwrap().role else {
            panic!("not a recv")
        };
        assert!(!udp_gro);
    }

    #[test]
    fn send_option_ranges() {
        assert!(matches!(send("--gso 64"), Role::Send { gso: Some(64), .. }));
        assert!(parse("send --dest [::1]:9 --gso 0").is_err());
        assert!(parse("send --dest [::1]:9 --gso 65").is_err());
        assert!(matches!(
            send("--burst 16"),
            Role::Send {
                burst: Some(16),
                ..
            }
        ));
        assert!(parse("send --dest [::1]:9 --burst 0").is_err());
        assert!(matches!(
            send("--payload 64976"),
            Role::Send { payload: 64976, .. }
        ));
        assert!(parse("send --dest [::1]:9 --payload 64977").is_err());
        assert!(matches!(
            send("--ipv6-ext hbh"),
            Role::Send {
                ipv6_ext: Some(Ipv6Ext::Hbh),
                ..
            }
        ));
        assert!(matches!(
            send("--ipv6-ext dst"),
            Role::Send {
                ipv6_ext: Some(Ipv6Ext::Dst),
                ..
            }
        ));
        assert!(parse("send --dest [::1]:9 --ipv6-ext rthdr").is_err());
    }

    #[test]
    fn an_extension_header_needs_an_ipv6_destination() {
        assert_eq!(
            parse("send --dest [::1]:9 --ipv6-ext dst").unwrap().check(),
            Ok(())
        );
        for dest in ["127.0.0.1:9", "[::ffff:127.0.0.1]:9"] {
            let err = parse(&format!("send --dest {dest} --ipv6-ext hbh"))
                .unwrap()
                .check()
                .unwrap_err();
            assert!(err.contains("--ipv6-ext hbh needs an IPv6 --dest"), "{err}");
        }
    }
}
