//! `probe rtt`: one probe at a time to a responder, each RTT timed on
//! CLOCK_MONOTONIC from before the sender's delay to after the receiver's.

use super::{
    decode, encode, spin_us, RttFile, RttOptions, RttSettings, FORMAT, FORMAT_VERSION, KIND_ECHO,
    KIND_PROBE, MIN_SIZE,
};
use anyhow::{Context, Result};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use xlap_exit::{failure, Code};

pub fn run(a: &RttOptions) -> Result<RttFile> {
    check(a)?;
    let local: SocketAddr = a.bind.unwrap_or_else(|| match a.to {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("addr"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("addr"),
    });
    let sock = UdpSocket::bind(local).with_context(|| format!("cannot bind {local}"))?;
    sock.connect(a.to)
        .with_context(|| format!("cannot connect to {}", a.to))?;
    if let Some(start) = &a.start_file {
        while !start.exists() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let timeout = Duration::from_millis(a.timeout_ms);
    let interval = Duration::from_micros(a.interval_us);
    let mut out = RttFile {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        from: a.name_from.clone(),
        to: a.name_to.clone(),
        samples_ns: Vec::with_capacity(a.count as usize),
        seqs: Vec::with_capacity(a.count as usize),
        lost: 0,
        late: 0,
        delay_spent_ns: None,
        settings: RttSettings {
            to: a.to.to_string(),
            local: sock.local_addr()?.to_string(),
            count: a.count,
            interval_us: a.interval_us,
            delay_us: a.delay_us,
            timeout_ms: a.timeout_ms,
            warmup: a.warmup,
            first_seq: a.first_seq,
            size: a.size,
            clock: "CLOCK_MONOTONIC".into(),
        },
    };
    let mut tx = vec![0u8; a.size];
    let mut rx = vec![0u8; 65_536];
    let mut last: Option<Instant> = None;
    let mut spent = Duration::ZERO;
    let mut rcv_timeout: Option<Duration> = None;
    for i in 0..a.warmup + a.count {
        // One interval after the last probe's start, or at once when its
        // echo came later (no burst to catch up).
        if let Some(due) = last.map(|l| l + interval) {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let seq = a.first_seq + i;
        encode(&mut tx, KIND_PROBE, seq);
        let t0 = Instant::now();
        last = Some(t0);
        xlap_marker::mark!(send_start, seq, KIND_PROBE);
        let send_wait = spin_us(a.delay_us);
        match sock.send(&tx) {
            Ok(_) => {}
            // An earlier echo's ICMP error, or no responder (yet): lost.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(e).with_context(|| format!("send to {}", a.to)),
        }
        let got = await_echo(
            &sock,
            &mut rx,
            seq,
            t0,
            timeout,
            &mut rcv_timeout,
            &mut out.late,
        )
        .with_context(|| format!("receive from {}", a.to))?;
        if !got {
            if i >= a.warmup {
                out.lost += 1;
            }
            continue;
        }
        let receive_wait = spin_us(a.delay_us);
        xlap_marker::mark!(deliver, seq, KIND_ECHO);
        let rtt = t0.elapsed();
        if i >= a.warmup {
            spent += send_wait + receive_wait;
            out.samples_ns.push(rtt.as_nanos() as u64);
            out.seqs.push(seq);
        }
    }
    if a.delay_us > 0 {
        out.delay_spent_ns = Some(spent.as_nanos() as u64);
    }
    Ok(out)
}

/// The options' values a probe can run with.
fn check(a: &RttOptions) -> Result<()> {
    if a.size < MIN_SIZE || a.size > 65_000 {
        return Err(failure(
            Code::Usage,
            format!("--size must lie in {MIN_SIZE}..=65000 bytes"),
        ));
    }
    if a.count == 0 || a.timeout_ms == 0 {
        return Err(failure(
            Code::Usage,
            "--count and --timeout-ms must be positive",
        ));
    }
    if a.name_from == a.name_to {
        return Err(failure(
            Code::Usage,
            "--name-from and --name-to must name two different hosts",
        ));
    }
    Ok(())
}

/// Waits for the echo of probe `seq` sent at `t0`, at most `timeout` from
/// then: true when it came. Echoes of earlier probes are counted `late`.
/// The socket's receive timeout is the whole timeout unless a stray
/// datagram or a timeout shortened it: no system call between the send
/// and the receive of a probe for it.
fn await_echo(
    sock: &UdpSocket,
    rx: &mut [u8],
    seq: u64,
    t0: Instant,
    timeout: Duration,
    rcv_timeout: &mut Option<Duration>,
    late: &mut u64,
) -> std::io::Result<bool> {
    let mut left = timeout;
    loop {
        if *rcv_timeout != Some(left) {
            sock.set_read_timeout(Some(left))?;
            *rcv_timeout = Some(left);
        }
        match sock.recv(rx) {
            Ok(n) => match decode(&rx[..n]) {
                Some((KIND_ECHO, s)) if s == seq => return Ok(true),
                Some((KIND_ECHO, s)) if s < seq => *late += 1,
                _ => {}
            },
            // An earlier echo's ICMP error: no echo either.
            Err(e)
                if super::no_datagram(&e) || e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            Err(e) => return Err(e),
        }
        left = (t0 + timeout).saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
    }
}

/// Writes the file (temp file + rename) and prints a one-line account.
pub fn write(a: &RttOptions, f: &RttFile) -> Result<()> {
    let tmp = a.out.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(f)?)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &a.out).with_context(|| format!("cannot write {}", a.out.display()))?;
    let mut sorted = f.samples_ns.clone();
    sorted.sort_unstable();
    let q = |p: f64| {
        sorted
            .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
            .map_or(f64::NAN, |v| *v as f64 / 1e3)
    };
    println!(
        "{} -> {}: {} RTTs, {} lost, min {:.1} us, p50 {:.1} us, p99 {:.1} us; wrote {}",
        f.from,
        f.to,
        f.samples_ns.len(),
        f.lost,
        q(0.0),
        q(0.5),
        q(0.99),
        a.out.display()
    );
    Ok(())
}
