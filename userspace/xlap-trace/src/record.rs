//! `xlap-trace record`: attach, stream stamps to Arrow while the target runs,
//! stop, write Parquet and `run.json`, print a summary.

use crate::capture::{self, Capture, Settings};
use crate::cli::RecordArgs;
use crate::exit::{failure, Code};
use crate::reader_priority::{thread_cpu_s, ReaderPriority};
use crate::runmeta::{self, ClockPair, PointStats, ProgramStats, RunMeta, Target};
use crate::{preflight, targets};
use anyhow::{Context, Result};
use std::collections::{BTreeMap, HashSet};
use std::io::IsTerminal;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xlap_abi::{xlap_loss, xlap_point, xlap_stamp};
use xlap_records::points::point_info;
use xlap_records::writer::{stream_to_parquet, StampBatcher, StampStream};
use xlap_records::Stamp;

/// Rows per Arrow batch; a batch is also cut every `FLUSH_EVERY`.
const BATCH_ROWS: usize = 16 * 1024;
const FLUSH_EVERY: Duration = Duration::from_millis(500);
const PORT_REFRESH: Duration = Duration::from_millis(200);
const POLL_MS: i32 = 20;

/// Files of a run directory.
pub struct RunFiles {
    pub dir: PathBuf,
    pub stream: PathBuf,
    pub parquet: PathBuf,
    pub meta: PathBuf,
}

impl RunFiles {
    pub fn in_dir(dir: PathBuf) -> RunFiles {
        RunFiles {
            stream: dir.join("stamps.arrows"),
            parquet: dir.join("stamps.parquet"),
            meta: dir.join("run.json"),
            dir,
        }
    }
}

pub fn run(args: &RecordArgs) -> Result<RunMeta> {
    if args.pids.is_empty() {
        return Err(failure(
            Code::Usage,
            "name the process to trace with --pid PID (repeatable)",
        ));
    }
    let layout = args.layout()?;
    let ringbuf_bytes = args
        .ringbuf_kib
        .checked_mul(1024)
        .filter(|b| b.is_power_of_two() && *b >= 4096)
        .ok_or_else(|| {
            failure(
                Code::Usage,
                format!(
                    "--ringbuf-kib must be a power of two of at least 4, not {}",
                    args.ringbuf_kib
                ),
            )
        })?;
    preflight::check_privileges()?;
    preflight::check_btf()?;
    preflight::check_pids(&args.pids)?;

    let files = RunFiles::in_dir(args.output.clone());
    std::fs::create_dir_all(&files.dir)
        .with_context(|| format!("cannot create the output directory {}", files.dir.display()))?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }

    let stats_guard = (!args.no_bpf_stats).then(capture::enable_stats).flatten();
    let tcp_only = check_protocols(&args.pids, args.quiet);
    let mut tunnel_ports = capture::DEFAULT_TUNNEL_PORTS.to_vec();
    for port in &args.tunnel_ports {
        if !tunnel_ports.contains(port) {
            tunnel_ports.push(*port);
        }
    }
    let mut capture = Capture::load(&Settings {
        layout,
        ringbuf_bytes,
        per_stamp: args.per_stamp_records,
        tunnel_ports,
        iface_filter: !args.ifaces.is_empty(),
    })?;
    if !args.ifaces.is_empty() {
        let devices = crate::ifaces::resolve(&args.pids, &args.ifaces)?;
        capture.set_ifaces(&devices)?;
    }
    if let Err(why) = &capture.dynptr {
        if !args.quiet {
            eprintln!("xlap-trace: note: datagrams in page fragments (GSO, GRO, NIC drivers) are counted as 'frag' losses, not stamped: {why}");
        }
    }
    for (point, why) in &capture.unavailable {
        if !args.quiet {
            eprintln!(
                "xlap-trace: note: {point} not traced here ({}; run.json has the whole reason)",
                brief_reason(why)
            );
        }
    }
    let usdt_plan = if args.no_usdt {
        crate::usdt::Plan::default()
    } else {
        crate::usdt::plan(&args.pids, &args.usdt)?
    };
    for (pid, comm) in &usdt_plan.without_markers {
        if !args.quiet {
            eprintln!(
                "xlap-trace: note: pid {pid} ({comm}) has no {} USDT markers; tracing its kernel points only",
                if args.usdt.is_empty() { "xlap:*" } else { "selected" }
            );
        }
    }
    capture.attach_usdt(&usdt_plan)?;
    let semaphores = Semaphores::raise(&usdt_plan)?;
    capture.set_targets(&args.pids)?;
    let mut marked = HashSet::new();
    let mut udp_pids = HashSet::new();
    mark_new_sockets(
        &mut capture,
        &args.pids,
        &mut marked,
        &mut udp_pids,
        args.quiet,
    )?;
    let mut owners = targets::port_owners(&args.pids);
    capture.sync_ports(&Default::default(), &owners)?;
    let mut ring = capture.take_ring()?;
    let batches = capture.take_batches()?;

    let run_id = format!(
        "{}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        std::process::id()
    );
    let host = args.host.clone().unwrap_or_else(runmeta::hostname);
    let comms: Vec<String> = args.pids.iter().map(|&p| targets::comm(p)).collect();
    let mut batcher = StampBatcher::new(&run_id, &host, usdt_plan.app_names.clone());
    let mut stream = StampStream::create(&files.stream)?;
    let clock_start = ClockPair::sample();

    if let Some(ready) = &args.ready_file {
        std::fs::write(ready, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write the ready file {}", ready.display()))?;
    }
    if !args.quiet {
        eprintln!(
            "xlap-trace: tracing pid {} (UDP ports {:?}); Ctrl-C to stop",
            args.pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            owners.keys().map(|(_, port)| port).collect::<Vec<_>>()
        );
    }

    let mut priority = (!args.full_priority).then(|| ReaderPriority::background(ringbuf_bytes));
    let started = Instant::now();
    let cpu_start = thread_cpu_s();
    let mut last_flush = Instant::now();
    let mut last_ports = Instant::now();
    let mut last_progress = Instant::now();
    let mut tally = Tally::default();
    let mut exited: Vec<(u32, f64)> = Vec::new();
    let mut known_ports = owners.clone();
    let progress = !args.quiet && std::io::stderr().is_terminal();
    let ring_fd = ring.as_raw_fd();

    let stop_reason = loop {
        let mut pfd = libc::pollfd {
            fd: ring_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // The kernel side wakes us only when the buffer is an eighth full;
        // the timeout bounds how stale the output files get.
        // SAFETY: one valid pollfd; a signal interrupting poll is fine.
        unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
        let mut drained = 0usize;
        while let Some(item) = ring.next() {
            drained += item.len();
            if drained >= ringbuf_bytes as usize / 4 {
                // Behind by a quarter of the buffer in this one drain.
                if let Some(p) = priority.as_mut() {
                    p.adjust(drained);
                }
                drained = 0;
            }
            // One record: a stamp or a per-CPU batch of them.
            for raw in xlap_stamp::all_from_bytes(&item) {
                let stamp = Stamp::decode(&raw);
                tally.add(&stamp);
                batcher.push(&stamp);
            }
            if batcher.len() >= BATCH_ROWS {
                stream.write(&batcher.finish())?;
                last_flush = Instant::now();
            }
        }
        if let Some(p) = priority.as_mut() {
            p.adjust(drained);
            p.caught_up();
        }
        if !batcher.is_empty() && last_flush.elapsed() >= FLUSH_EVERY {
            stream.write(&batcher.finish())?;
            last_flush = Instant::now();
        }
        if progress && last_progress.elapsed() >= Duration::from_secs(1) {
            eprint!(
                "\rxlap-trace: {} stamps, {} packets, {:.0} s   ",
                tally.stamps,
                tally.packets.len(),
                started.elapsed().as_secs_f64()
            );
            last_progress = Instant::now();
        }
        if stop.load(Ordering::Relaxed) {
            break "signal".to_string();
        }
        if args
            .duration
            .is_some_and(|d| started.elapsed().as_secs_f64() >= d)
        {
            break "duration".to_string();
        }
        if args.count.is_some_and(|c| tally.packets.len() as u64 >= c) {
            break "count".to_string();
        }
        if last_ports.elapsed() >= PORT_REFRESH {
            last_ports = Instant::now();
            for &pid in &args.pids {
                if !targets::alive(pid) && !exited.iter().any(|(p, _)| *p == pid) {
                    // Its probes went with it: a restarted process has a new
                    // pid and needs a new run (we do not guess which it is).
                    if !args.quiet {
                        eprintln!(
                            "xlap-trace: note: pid {pid} exited after {:.1} s; its stamps so far are kept, a restart is not traced (trace the new pid)",
                            started.elapsed().as_secs_f64()
                        );
                    }
                    exited.push((pid, started.elapsed().as_secs_f64()));
                }
            }
            if exited.len() == args.pids.len() {
                break "targets exited".to_string();
            }
            mark_new_sockets(
                &mut capture,
                &args.pids,
                &mut marked,
                &mut udp_pids,
                args.quiet,
            )?;
            let now = targets::port_owners(&args.pids);
            if now != owners {
                capture.sync_ports(&owners, &now)?;
                known_ports.extend(now.iter().map(|(k, v)| (*k, *v)));
                owners = now;
            }
        }
    };
    if progress {
        eprintln!();
    }

    // Detach first, then take what the ring buffer and the per-CPU batches
    // still hold.
    let losses = capture.losses()?;
    let unavailable: BTreeMap<String, String> = capture.unavailable.iter().cloned().collect();
    let program_stats = capture.program_stats();
    drop(stats_guard);
    drop(capture);
    drop(semaphores);
    // Detaching does not wait for a program already running on another
    // CPU; let it finish (it may still flush a batch) before the last
    // drains.
    std::thread::sleep(Duration::from_millis(20));
    while let Some(item) = ring.next() {
        for raw in xlap_stamp::all_from_bytes(&item) {
            let stamp = Stamp::decode(&raw);
            tally.add(&stamp);
            batcher.push(&stamp);
        }
    }
    for raw in capture::drain_batches(&batches)? {
        let stamp = Stamp::decode(&raw);
        tally.add(&stamp);
        batcher.push(&stamp);
    }
    drop(batches);
    if !batcher.is_empty() {
        stream.write(&batcher.finish())?;
    }
    stream.finish()?;
    let reader_cpu_s = thread_cpu_s() - cpu_start;
    let clock_end = ClockPair::sample();
    stream_to_parquet(&files.stream, &files.parquet)?;

    let mut points: BTreeMap<String, PointStats> = BTreeMap::new();
    for (id, n) in tally.points() {
        let name = point_info(id, &usdt_plan.app_names).map_or(format!("unknown.{id}"), |p| p.0);
        points.entry(name).or_default().stamps += n;
    }
    let mut lost = 0;
    for (row, counts) in losses.iter().enumerate() {
        if counts.iter().all(|c| *c == 0) {
            continue;
        }
        let name = if row == xlap_point::XLAP_POINT_KERNEL_COUNT as usize {
            "app.*".to_string()
        } else {
            point_info(row as u16, &[]).map_or(format!("unknown.{row}"), |p| p.0)
        };
        points.entry(name).or_default().add_losses(counts);
        lost += counts.iter().sum::<u64>();
    }
    for p in points.values_mut() {
        p.add_losses(&[0; xlap_loss::XLAP_LOSS_COUNT as usize]); // every reason listed
    }
    let bpf_programs: BTreeMap<String, ProgramStats> = program_stats
        .into_iter()
        .map(|(name, run_count, run_time_ns)| {
            (
                name,
                ProgramStats {
                    run_count,
                    run_time_ns,
                },
            )
        })
        .collect();
    let bpf_time: u64 = bpf_programs.values().map(|p| p.run_time_ns).sum();
    let meta = RunMeta {
        schema_version: xlap_records::schema::SCHEMA_VERSION,
        software_version: env!("CARGO_PKG_VERSION"),
        run_id,
        host,
        kernel: runmeta::kernel_release(),
        boot_id: runmeta::boot_id(),
        clock_sync: runmeta::ClockSync::read(),
        clock_start,
        clock_end,
        options: serde_json::json!({
            "pids": args.pids,
            "layout": layout,
            "ringbuf_bytes": ringbuf_bytes,
            "per_stamp_records": args.per_stamp_records,
            "duration_s": args.duration,
            "count": args.count,
            "exited": exited.iter().map(|(pid, s)| serde_json::json!({"pid": pid, "after_s": s})).collect::<Vec<_>>(),
            "usdt_sites": usdt_plan.sites.iter().map(|s| serde_json::json!({
                "pid": s.pid, "provider": s.probe.provider, "name": s.probe.name,
                "point": format!("app.{}", usdt_plan.app_names[(s.spec.point - xlap_point::XLAP_POINT_APP_BASE as u16) as usize]),
                "file": s.path, "args": s.probe.args_spec,
            })).collect::<Vec<_>>(),
        }),
        targets: args
            .pids
            .iter()
            .zip(comms)
            .map(|(&pid, comm)| Target {
                pid,
                comm,
                udp_ports: known_ports
                    .iter()
                    .filter(|(_, p)| **p == pid)
                    .map(|((_, port), _)| *port)
                    .collect(),
            })
            .collect(),
        points,
        unavailable_points: unavailable,
        packets: tally.packets.len() as u64,
        stamps: tally.stamps,
        lost,
        bpf_ns_per_stamp: (bpf_time > 0 && tally.stamps > 0)
            .then(|| bpf_time as f64 / tally.stamps as f64),
        bpf_programs,
        reader_cpu_s,
        stop_reason,
    };
    let json = serde_json::to_string_pretty(&meta)?;
    std::fs::write(&files.meta, json + "\n")
        .with_context(|| format!("cannot write {}", files.meta.display()))?;
    if lost > 0 && !args.quiet {
        eprintln!("xlap-trace: warning: {lost} stamps were lost (see the loss columns below and run.json)");
    }
    refuse_tcp_only(&tcp_only, &udp_pids, meta.packets)?;
    Ok(meta)
}

/// Raised USDT semaphores, lowered again on drop (for processes still alive).
struct Semaphores(Vec<(u32, u64)>);

impl Semaphores {
    fn raise(plan: &crate::usdt::Plan) -> Result<Semaphores> {
        let mut raised = Semaphores(Vec::new());
        for site in &plan.sites {
            if let Some(addr) = site.semaphore_addr {
                crate::usdt::adjust_semaphore(site.pid, addr, 1)?;
                raised.0.push((site.pid, addr));
            }
        }
        Ok(raised)
    }
}

impl Drop for Semaphores {
    fn drop(&mut self) {
        for (pid, addr) in &self.0 {
            if targets::alive(*pid) {
                let _ = crate::usdt::adjust_semaphore(*pid, *addr, -1);
            }
        }
    }
}

/// Running counts of what the ring buffer delivered (for every stamp: kept
/// cheap).
#[derive(Default)]
struct Tally {
    /// Stamps per point id (kernel and app ids are small).
    per_point: Vec<u64>,
    /// Distinct (flow, kind, seq) of stamps that know their flow.
    packets: HashSet<(u64, u8, u64), std::hash::BuildHasherDefault<FastHasher>>,
    /// The packet added last: a batch carries a packet's stamps together.
    last_packet: Option<(u64, u8, u64)>,
    stamps: u64,
}

impl Tally {
    fn add(&mut self, stamp: &Stamp) {
        let idx = stamp.point as usize;
        if idx >= self.per_point.len() {
            self.per_point.resize(idx + 1, 0);
        }
        self.per_point[idx] += 1;
        if let (Some(seq), true) = (stamp.seq, stamp.flow != 0) {
            let key = (stamp.flow, stamp.kind.unwrap_or(0), seq);
            if self.last_packet != Some(key) {
                self.packets.insert(key);
                self.last_packet = Some(key);
            }
        }
        self.stamps += 1;
    }

    /// (point id, stamps) of the points seen.
    fn points(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.per_point
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(id, n)| (id as u16, *n))
    }
}

/// A multiplicative hasher for the packet set (its keys are not chosen by
/// an adversary; SipHash costs more than the rest of a stamp's decoding).
#[derive(Default)]
struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The live correlation of a run whose ends were both traced here: the
/// packets table next to the stamps. A failure is reported, never fatal: the
/// stamps are already safe on disk.
pub fn correlate_run(args: &RecordArgs) {
    let out = args.output.join("packets.parquet");
    match crate::correlate_cmd::correlate(&[args.output.as_path()], &out, args.deadline_ms) {
        Ok(c) => {
            if !args.quiet {
                crate::correlate_cmd::print(&c, &out);
            }
            print_analysis_summary(&args.output);
        }
        Err(e) => eprintln!(
            "xlap-trace: warning: no packets table ({e:#}); run `xlap-trace correlate {}` to retry",
            args.output.display()
        ),
    }
}

/// The bundled `summary` query over the run just recorded; a run that
/// cannot have one (one side only) says why instead.
fn print_analysis_summary(dir: &std::path::Path) {
    let result = crate::analyze_cmd::open(dir, xlap_analyze::dataset::Shared::Materialized, false)
        .and_then(|(conn, _)| {
            let q = xlap_analyze::queries::find("summary")?;
            crate::analyze_cmd::run_queries(&conn, &[q], &[], false)
        });
    match result {
        Ok(results) => {
            println!(
                "\n== summary (more: xlap-trace analyze {}; xlap-trace report {}) ==",
                dir.display(),
                dir.display()
            );
            if let Err(e) =
                crate::analyze_cmd::print_results(&results, xlap_analyze::format::Format::Table)
            {
                eprintln!("xlap-trace: warning: {e:#}");
            }
        }
        Err(e) => println!("(no latency summary: {e:#})"),
    }
}

/// xlap-trace keys datagrams: a target with TCP sockets and no UDP socket
/// has nothing to trace (refused, naming the sockets); TCP next to UDP is
/// ignored, with a note.
/// Targets that hold only TCP sockets at attach, with those sockets named
/// (e.g. iperf3's server before a test, with its control connection): they
/// may open UDP sockets later, so the run goes on, but a run in which they
/// never do ends with [`Code::NotUdp`] instead of an empty success.
fn check_protocols(pids: &[u32], quiet: bool) -> Vec<(u32, String)> {
    let mut tcp_only = Vec::new();
    for &pid in pids {
        let tcp = crate::sockets::tcp_sockets(pid);
        if tcp.is_empty() {
            continue;
        }
        let names = tcp
            .iter()
            .map(|s| format!("{} port {}", s.protocol, s.local_port))
            .collect::<Vec<_>>()
            .join(", ");
        let only = crate::sockets::udp_sockets(pid).is_empty();
        if !quiet {
            if only {
                eprintln!("xlap-trace: note: pid {pid} holds only TCP sockets so far ({names}); xlap-trace traces UDP datagrams, from the UDP sockets it opens");
            } else {
                eprintln!("xlap-trace: note: pid {pid} also holds TCP sockets ({names}); their traffic is not traced");
            }
        }
        if only {
            tcp_only.push((pid, format!("pid {pid} ({}): {names}", targets::comm(pid))));
        }
    }
    tcp_only
}

/// The end of a run whose TCP-only targets never opened a UDP socket and
/// which stamped nothing: an error naming the sockets, not an empty run.
fn refuse_tcp_only(
    tcp_only: &[(u32, String)],
    udp_pids: &HashSet<u32>,
    packets: u64,
) -> Result<()> {
    let never: Vec<&str> = tcp_only
        .iter()
        .filter(|(pid, _)| !udp_pids.contains(pid))
        .map(|(_, names)| names.as_str())
        .collect();
    if packets > 0 || never.is_empty() || never.len() < tcp_only.len() {
        return Ok(());
    }
    Err(failure(
        Code::NotUdp,
        format!(
            "the targets used only TCP ({}): xlap-trace traces UDP datagrams by their sequence numbers, so there was nothing to trace (the run's files are written)",
            never.join("; ")
        ),
    ))
}

/// Marks the targets' UDP sockets not marked yet as traced (sockets created
/// after attaching are marked by the BPF side).
fn mark_new_sockets(
    capture: &mut Capture,
    pids: &[u32],
    marked: &mut HashSet<u64>,
    udp_pids: &mut HashSet<u32>,
    quiet: bool,
) -> Result<()> {
    let new: Vec<_> = pids
        .iter()
        .flat_map(|&pid| crate::sockets::udp_sockets(pid))
        .filter(|s| !marked.contains(&s.inode))
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let failed = capture.mark_sockets(&new)?;
    for s in &new {
        marked.insert(s.inode);
        udp_pids.insert(s.pid);
    }
    for (s, why) in failed {
        if !quiet {
            eprintln!(
                "xlap-trace: warning: socket fd {} of pid {}: {why}; its sock.queue stamps are missing",
                s.fd, s.pid
            );
        }
    }
    Ok(())
}

/// The end-of-run summary: stamps and losses per point.
pub fn print_summary(meta: &RunMeta, dir: &std::path::Path) {
    println!(
        "run {} on {} ({}), stopped by {}",
        meta.run_id, meta.host, meta.kernel, meta.stop_reason
    );
    let mut header = format!("{:<18} {:>10}", "point", "stamps");
    for reason in xlap_abi::LOSS_REASONS {
        header += &format!(" {reason:>12}");
    }
    println!("{header}");
    for (name, p) in &meta.points {
        let mut line = format!("{:<18} {:>10}", name, p.stamps);
        for reason in xlap_abi::LOSS_REASONS {
            line += &format!(" {:>12}", p.lost(reason));
        }
        println!("{line}");
    }
    println!(
        "packets: {}  stamps: {}  lost: {}",
        meta.packets, meta.stamps, meta.lost
    );
    if let Some(ns) = meta.bpf_ns_per_stamp {
        println!("BPF run time per stamp: {ns:.0} ns (all programs, filtered calls included)");
    }
    println!(
        "wrote {}/{{stamps.parquet, stamps.arrows, run.json}}",
        dir.display()
    );
}

/// A one-line form of a program's load or attach error: a verifier failure
/// carries the whole verifier log (thousands of lines), of which the first
/// line and the verifier's own last words say what happened.
fn brief_reason(why: &str) -> String {
    let mut lines = why.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or_default().to_string();
    let rest: Vec<&str> = lines.collect();
    let mut tail: Vec<&str> = rest
        .iter()
        .rev()
        .filter(|l| !l.starts_with("verification time") && !l.starts_with("stack depth"))
        .take(2)
        .copied()
        .collect();
    tail.reverse();
    if tail.is_empty() {
        first
    } else {
        format!("{first} ... {}", tail.join(" / "))
    }
}

#[cfg(test)]
mod brief_reason_tests {
    use super::brief_reason;

    #[test]
    fn a_verifier_log_shrinks_to_its_first_and_last_lines() {
        let log = "load failed. Verifier output: 0: R1=ctx()\n1: (79) r9 = *(u64 *)(r1 +0)\n\
                   R5 unbounded memory access\nprocessed 867 insns (limit 1000000)\n\
                   verification time 30 usec\nstack depth 8\n";
        assert_eq!(
            brief_reason(log),
            "load failed. Verifier output: 0: R1=ctx() ... R5 unbounded memory access / processed 867 insns (limit 1000000)"
        );
        assert_eq!(brief_reason("no such tracepoint"), "no such tracepoint");
    }
}
