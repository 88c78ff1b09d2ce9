//! Loading and attaching the kernel capture programs (`bpf/capture.bpf.c`).

use crate::proto::Layouts;
use anyhow::{Context, Result};
use aya::maps::SkStorage;
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::links::CgroupAttachMode;
use aya::programs::uprobe::{
    UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope,
};
use aya::programs::{BtfTracePoint, CgroupSkbAttachType, CgroupSockAddr, UProbe};
use aya::{include_bytes_aligned, Btf, Ebpf, EbpfLoader};
use aya_obj::btf::BtfKind;
use std::os::fd::AsFd;
use xlap_abi::{xlap_loss, xlap_point};
use xlap_exit::{failure, Code};

static CAPTURE_OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/capture.bpf.o"));

/// The capture object as built (kfunc placeholders not yet resolved).
pub fn capture_object() -> &'static [u8] {
    CAPTURE_OBJECT
}
/// Cost-floor programs for the benchmark (`bpf/calibrate.bpf.c`).
pub static CALIBRATE_OBJECT: &[u8] =
    include_bytes_aligned!(concat!(env!("OUT_DIR"), "/calibrate.bpf.o"));

/// bpf_map_update_elem flag: only create, never overwrite.
const BPF_NOEXIST: u64 = 1;

/// A traced-socket key as a map key.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct PortKey(xlap_abi::xlap_port_key);

// SAFETY: plain C struct of integers, padding zeroed (Default).
unsafe impl aya::Pod for PortKey {}

/// A target cgroup as a map value.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct TargetCgroup(xlap_abi::xlap_target_cgroup);

// SAFETY: plain C struct of integers, padding zeroed (Default).
unsafe impl aya::Pod for TargetCgroup {}

/// A traced socket's storage value.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct SockMark(xlap_abi::xlap_sock);

// SAFETY: plain C struct of integers, padding zeroed (Default).
unsafe impl aya::Pod for SockMark {}

/// A FLOWS value: the addresses and sockets behind a flow.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct FlowTuple(xlap_abi::xlap_flow_tuple);

// SAFETY: plain C struct of integers and byte arrays.
unsafe impl aya::Pod for FlowTuple {}

/// A --iface device as a map key.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct IfaceKey(xlap_abi::xlap_iface_key);

// SAFETY: plain C struct of integers.
unsafe impl aya::Pod for IfaceKey {}

/// A USDT spec as a map value.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Spec(xlap_abi::xlap_usdt_spec);

// SAFETY: a plain C struct of integers generated from the ABI header; every
// bit pattern is valid and padding is zero-initialised (Default).
unsafe impl aya::Pod for Spec {}

/// A per-CPU batch of stamps as a map value.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Batch(pub xlap_abi::xlap_batch);

// SAFETY: a plain C struct of integers generated from the ABI header; every
// bit pattern is valid.
unsafe impl aya::Pod for Batch {}

/// The run's stamp window as the BPF side holds it (`STAMP_WINDOW`).
#[derive(Clone, Copy)]
#[repr(transparent)]
struct StampWindow(xlap_abi::xlap_stamp_window);

// SAFETY: a plain C struct of two integers generated from the ABI header.
unsafe impl aya::Pod for StampWindow {}

/// A file's kernel identity in KNOWN_CODE.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct CodeKey(xlap_abi::xlap_code_key);

// SAFETY: a plain C struct of integers generated from the ABI header, its
// padding zeroed by the caller (Default).
unsafe impl aya::Pod for CodeKey {}

/// A file's version in KNOWN_CODE.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct CodeVersion(xlap_abi::xlap_code_version);

// SAFETY: as CodeKey.
unsafe impl aya::Pod for CodeVersion {}

/// Loaded and attached capture programs; dropping it detaches everything.
pub struct Capture {
    pub bpf: Ebpf,
    /// Where the send/receive boundary is stamped.
    pub boundary: BoundaryChoice,
    /// Optional programs that could not be attached, with the reason.
    pub unattached: Vec<Unattached>,
    /// The kernel points the run writes (`--points`).
    pub points: crate::point_sets::PointSet,
    /// Whether skb bytes in page fragments are readable (else why not).
    pub dynptr: Result<(), String>,
    /// The timer export of per-CPU batches (else why not).
    pub batch_export: Result<crate::batch_export::BatchExport, String>,
    /// The uprobes attached per process (its markers' sites), detached
    /// when it exits or the run ends (`take_uprobes`).
    uprobes_by_pid: std::collections::HashMap<u32, Vec<UProbeLinkId>>,
    /// The loader hooks, one per loader file, for every process.
    loader_links: Vec<UProbeLinkId>,
    /// `--boundary auto`: the send syscalls' hook, attached once a traced
    /// UDP socket is connected.
    send_syscalls: SendSyscalls,
}

/// The send syscalls' hook of `--boundary auto` (`on_send_syscall`): it
/// costs every syscall of the machine the kernel's slow path, so it is
/// attached only once a traced UDP socket is connected (whose sends only
/// their syscall's entry shows begin).
#[derive(Clone, Debug, PartialEq)]
pub enum SendSyscalls {
    /// Not this run's (`--boundary syscalls` or `socket-calls`).
    Off,
    /// Loaded, not attached: no traced UDP socket was connected yet.
    Waiting,
    /// Attached: when (CLOCK_MONOTONIC ns), and why.
    Attached { at_ns: u64, why: String },
    /// This kernel refused it: connected sockets' sends lack send_enter.
    Refused(String),
}

/// An optional program this kernel refused.
#[derive(Clone, Debug)]
pub struct Unattached {
    pub program: &'static str,
    /// What it attaches to: the tracepoint, or the cgroup hook.
    pub hook: &'static str,
    pub why: String,
}

/// Why a socket a traced process held before tracing is not traced.
#[derive(Debug)]
pub enum NotMarked {
    /// pidfd_getfd refused.
    Duplicate(String),
    /// The socket storage refused the mark.
    Mark(String),
}

impl std::fmt::Display for NotMarked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotMarked::Duplicate(why) | NotMarked::Mark(why) => f.write_str(why),
        }
    }
}

impl Capture {
    /// The refused hooks, with the reason (run.json's `unavailable_hooks`).
    pub fn unavailable_hooks(&self) -> std::collections::BTreeMap<String, String> {
        self.unattached
            .iter()
            .map(|u| (u.hook.to_string(), u.why.clone()))
            .collect()
    }

    /// The points this run lacks for them.
    pub fn lacking(&self) -> crate::point_sets::Lacking {
        let unattached: Vec<(&str, &str)> = self
            .unattached
            .iter()
            .map(|u| (u.program, u.why.as_str()))
            .chain(
                self.dynptr
                    .as_ref()
                    .err()
                    .map(|why| (crate::hooks::SKB_DYNPTR, why.as_str())),
            )
            .collect();
        let mut lacking = self.points.lacking(&unattached);
        let send_enter = xlap_point::XLAP_POINT_SOCK_SEND_ENTER;
        let without_syscalls = match (&self.boundary, &self.send_syscalls) {
            (BoundaryChoice::SocketCalls, _) => Some(
                "sends that do not name their destination (a connected socket's send, write) have no send_enter at the socket calls: only the syscall hooks see them begin (--boundary auto or syscalls, which slow every syscall of the machine while attached)".to_string(),
            ),
            (BoundaryChoice::Auto, SendSyscalls::Refused(why)) => Some(format!(
                "sends that do not name their destination (a connected socket's send, write) have no send_enter: the send syscalls' hook was refused ({why}); --boundary syscalls stamps them"
            )),
            _ => None,
        };
        if let Some(what) = without_syscalls {
            if self.points.contains(send_enter) && !lacking.missing.contains_key("sock.send_enter")
            {
                lacking.degraded.insert("sock.send_enter".into(), what);
            }
        }
        lacking
    }
}

/// The boundary a run asks for (`--boundary`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BoundaryRequest {
    /// The socket calls, and the send syscalls' entry once a traced UDP
    /// socket is connected: the machine pays only while a traced socket
    /// needs it (the default).
    #[default]
    Auto,
    /// The socket calls alone: connected sockets' sends lack send_enter.
    SocketCalls,
    /// The send and receive syscalls: every point, at the machine's cost.
    Syscalls,
}

/// Where this run stamps the application/socket boundary, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundaryChoice {
    /// At the socket calls, and a connected socket's sends at their
    /// syscall's entry once one is connected (`--boundary auto`).
    Auto,
    /// At the socket calls (`--boundary socket-calls`): nothing else on the
    /// machine pays.
    SocketCalls,
    /// At the syscalls: asked for, or (said here) what the kernel lacks
    /// for the socket calls.
    Syscalls(Option<String>),
}

impl BoundaryChoice {
    pub fn hooks(&self) -> crate::hooks::Boundary {
        match self {
            BoundaryChoice::Auto | BoundaryChoice::SocketCalls => {
                crate::hooks::Boundary::SocketCalls
            }
            BoundaryChoice::Syscalls(_) => crate::hooks::Boundary::Syscalls,
        }
    }

    /// run.json's `boundary` at the start: "auto", "socket-calls",
    /// "syscalls", or "syscalls (why not the socket calls)"; for `auto`,
    /// [`Capture::describe_boundary`] says what happened since.
    pub fn describe(&self) -> String {
        match self {
            BoundaryChoice::Auto => {
                "auto (socket calls; no traced UDP socket connected yet)".into()
            }
            BoundaryChoice::SocketCalls => "socket-calls".into(),
            BoundaryChoice::Syscalls(None) => "syscalls".into(),
            BoundaryChoice::Syscalls(Some(why)) => format!("syscalls ({why})"),
        }
    }
}

/// The socket-call boundary needs the socket calls' tracepoints (Linux
/// 6.3) and the socket-queue point, which reads datagrams through skb
/// dynptrs (6.12): without either, the syscalls.
fn choose_boundary(
    request: BoundaryRequest,
    dynptr: &Result<u32, String>,
    btf: &Btf,
) -> BoundaryChoice {
    if request == BoundaryRequest::Syscalls {
        return BoundaryChoice::Syscalls(None);
    }
    if let Err(why) = dynptr {
        return BoundaryChoice::Syscalls(Some(format!(
            "the socket calls need the socket-queue point, which cannot load: {why}"
        )));
    }
    for tp in [
        "sock_send_length",
        "sock_recv_length",
        "udp_fail_queue_rcv_skb",
    ] {
        if btf
            .id_by_type_name_kind(&format!("btf_trace_{tp}"), aya_obj::btf::BtfKind::Typedef)
            .is_err()
        {
            return BoundaryChoice::Syscalls(Some(format!(
                "the kernel has no {tp} tracepoint (Linux >= 6.3 has)"
            )));
        }
    }
    if request == BoundaryRequest::Auto {
        BoundaryChoice::Auto
    } else {
        BoundaryChoice::SocketCalls
    }
}

pub struct Settings {
    pub layouts: Layouts,
    /// The kernel points written; programs only they need are not attached.
    pub points: crate::point_sets::PointSet,
    pub ringbuf_bytes: u32,
    /// One ring-buffer record per stamp instead of per-CPU batches.
    pub per_stamp: bool,
    /// Every program on a datagram's path returns at once (CFG.empty_programs).
    pub empty_programs: bool,
    /// UDP ports whose payload is an Ethernet frame (VXLAN-like tunnels):
    /// datagrams inside are keyed by the inner datagram (Geneve's 6081 is
    /// always known).
    pub tunnel_ports: Vec<u16>,
    /// Device and qdisc points only on the devices set with `set_ifaces`.
    pub iface_filter: bool,
    /// Hold a traced process at its exec until its markers are attached
    /// (bpf/hooks/holds.h): markers are traced.
    pub hold_at_exec: bool,
    /// Where the send/receive boundary is stamped (`--boundary`).
    pub boundary: BoundaryRequest,
    /// `--boundary auto`: a traced process connecting a UDP socket may be
    /// held until the send syscalls' hook is attached (the recorder can
    /// resume it); otherwise the hook is attached from the start.
    pub hold_connect: bool,
    /// Stamp only the datagrams of this sample (`--sample`).
    pub sample: Option<xlap_records::sample::Sample>,
    /// Some device of the targets can timestamp received packets in
    /// hardware (switched on or not): the receive device points read the
    /// device's time of every skb, not only of paged (GRO) ones.
    pub device_rx_times: bool,
}

/// VXLAN's IANA port and the Linux kernel's historic default.
pub const DEFAULT_TUNNEL_PORTS: [u16; 2] = [4789, 8472];

impl Capture {
    pub fn load(settings: &Settings) -> Result<Capture> {
        // The user's mistakes are said before what this kernel lacks.
        let mut config = config_of(settings)?;
        let btf = Btf::from_sys_fs()
            .map_err(|e| failure(Code::Kernel, format!("cannot read the kernel BTF: {e}")))?;
        let (object, dynptr) = crate::kfunc::resolve_dynptr(CAPTURE_OBJECT, &btf);
        let boundary = choose_boundary(settings.boundary, &dynptr, &btf);
        fit_to_kernel(&mut config, settings, &btf, dynptr.is_ok(), &boundary);
        let mut bpf = load_object(object.bytes(), &config, settings.ringbuf_bytes)?;
        let mut unattached = Vec::new();
        attach_tracepoints(
            &mut bpf,
            &btf,
            object.bytes(),
            settings,
            boundary.hooks(),
            &mut unattached,
        )?;
        let dynptr = dynptr.map(|_| ());
        attach_socket_hooks(&mut bpf, &dynptr, boundary.hooks(), &mut unattached)?;
        let (send_syscalls, connects_held) = if boundary == BoundaryChoice::Auto {
            load_send_syscalls(&mut bpf, &btf, settings.hold_connect)
        } else {
            (SendSyscalls::Off, Ok(()))
        };
        // Per-stamp records never wait in a batch.
        let batch_export = if settings.per_stamp {
            Err("one record per stamp (--per-stamp-records)".to_string())
        } else {
            crate::batch_export::BatchExport::load(&mut bpf)
        };
        let mut capture = Capture {
            bpf,
            boundary,
            unattached,
            points: settings.points.clone(),
            dynptr,
            batch_export,
            uprobes_by_pid: std::collections::HashMap::new(),
            loader_links: Vec::new(),
            send_syscalls,
        };
        // Without holds at the connect, from the start.
        if let Err(why) = connects_held {
            capture.hook_send_syscalls(&format!("from the start: {why}"))?;
        }
        Ok(capture)
    }

    /// `--boundary auto`: the send syscalls' hook, attached (once) because
    /// of `why`; returns whether it was attached now. A refused attach is
    /// said in run.json (connected sockets' sends lack send_enter).
    pub fn hook_send_syscalls(&mut self, why: &str) -> Result<bool> {
        if self.send_syscalls != SendSyscalls::Waiting {
            return Ok(false);
        }
        let program: &mut BtfTracePoint = self
            .bpf
            .program_mut(crate::hooks::SEND_SYSCALL)
            .context("program on_send_syscall is missing from the object")?
            .try_into()?;
        if let Err(e) = program.attach() {
            self.send_syscalls = SendSyscalls::Refused(format!("{:#}", anyhow::Error::from(e)));
            return Ok(false);
        }
        // No connect is held from now on.
        let map = self
            .bpf
            .map_mut(".data.send_syscalls")
            .context("the capture object has no .data.send_syscalls")?;
        let mut on: Array<&mut MapData, u32> = Array::try_from(map)?;
        on.set(0, 1, 0)
            .context("cannot note the send syscalls' hook")?;
        self.send_syscalls = SendSyscalls::Attached {
            at_ns: crate::runmeta::read_clock(libc::CLOCK_MONOTONIC),
            why: why.to_string(),
        };
        Ok(true)
    }

    /// The send syscalls' hook of `--boundary auto`.
    pub fn send_syscalls(&self) -> &SendSyscalls {
        &self.send_syscalls
    }

    /// What the user is told once the send syscalls are hooked: the whole
    /// machine pays from then on.
    pub fn send_syscalls_note(&self) -> Option<String> {
        match &self.send_syscalls {
            SendSyscalls::Attached { why, .. } => Some(format!("the send syscalls are hooked ({why}): a connected socket's sends begin there; every syscall of the machine takes the slow path while the run goes on")),
            _ => None,
        }
    }

    /// run.json's `boundary`, with what `--boundary auto` did since the
    /// run's start (`start_ns`, CLOCK_MONOTONIC).
    pub fn describe_boundary(&self, start_ns: u64) -> String {
        match (&self.boundary, &self.send_syscalls) {
            (BoundaryChoice::Auto, SendSyscalls::Attached { at_ns, why }) => format!(
                "auto (socket calls; the send syscalls' entry from {:.3} s: {why})",
                at_ns.saturating_sub(start_ns) as f64 / 1e9
            ),
            (BoundaryChoice::Auto, SendSyscalls::Refused(why)) => format!(
                "auto (socket calls; the send syscalls' hook was refused: {why})"
            ),
            (BoundaryChoice::Auto, _) => {
                "auto (socket calls; no traced UDP socket was connected: the syscalls were left alone)".into()
            }
            (other, _) => other.describe(),
        }
    }

    /// Exports every CPU's waiting batch to the ring buffer now. Only the
    /// CPUs whose batch holds stamps are asked: each run interrupts its
    /// CPU (an IPI, a VM exit under KVM) whatever runs there, often the
    /// traced protocol, while reading the batches' lengths (`batches`, the
    /// map `take_batches` gave) costs only this thread a map read.
    pub fn export_batches(&mut self, batches: &PerCpuArray<MapData, Batch>) {
        let Ok(export) = &mut self.batch_export else {
            return;
        };
        let lengths: Option<Vec<u32>> = batches
            .get(&0, 0)
            .ok()
            .map(|per_cpu| per_cpu.iter().map(|b| b.0.n).collect());
        // Unreadable: every CPU, whatever it holds.
        export.run(|cpu| {
            lengths
                .as_ref()
                .is_none_or(|n| n.get(cpu as usize).is_none_or(|&n| n > 0))
        });
    }

    /// Marks sockets the traced processes already held as traced (new ones
    /// are marked by the BPF side as they are created). Returns the sockets
    /// that could not be marked, with the reason.
    pub fn mark_sockets(
        &mut self,
        sockets: &[crate::sockets::SocketRef],
    ) -> Result<Vec<(crate::sockets::SocketRef, NotMarked)>> {
        let mut map: SkStorage<&mut MapData, SockMark> =
            SkStorage::try_from(self.bpf.map_mut("SOCKS").context("SOCKS map")?)?;
        let mut failed = Vec::new();
        // A socket connected before the recorder saw it (--boundary auto:
        // its sends begin only at their syscall); a resolver's (port 53)
        // does not count, as at the connect (bpf/hooks/calls.h).
        let mut connected: Option<crate::sockets::SocketRef> = None;
        for s in sockets {
            let result = crate::sockets::duplicate(s.pid, s.fd)
                .map_err(|e| {
                    NotMarked::Duplicate(format!("cannot duplicate it (pidfd_getfd): {e}"))
                })
                .and_then(|fd| {
                    if connected.is_none()
                        && crate::sockets::peer_port(&fd).is_some_and(|port| port != 53)
                    {
                        connected = Some(*s);
                    }
                    let mark = SockMark(xlap_abi::xlap_sock {
                        tgid: s.pid,
                        cookie: crate::sockets::cookie(&fd).unwrap_or(0),
                        ..Default::default()
                    });
                    // BPF_NOEXIST: a socket the BPF side marked already (at
                    // creation) keeps its record; overwriting it would reset
                    // the flow and port it holds while datagrams flow.
                    match map.insert(&std::os::fd::AsRawFd::as_raw_fd(&fd), mark, BPF_NOEXIST) {
                        Ok(()) => Ok(()),
                        Err(aya::maps::MapError::SyscallError(e))
                            if e.io_error.raw_os_error() == Some(libc::EEXIST) =>
                        {
                            Ok(())
                        }
                        Err(e) => Err(NotMarked::Mark(format!("cannot mark it: {e}"))),
                    }
                });
            if let Err(e) = result {
                failed.push((*s, e));
            }
        }
        if let Some(s) = connected {
            self.hook_send_syscalls(&format!(
                "fd {} of pid {} ({}) was connected before it was traced",
                s.fd,
                s.pid,
                crate::targets::comm(s.pid)
            ))?;
        }
        Ok(failed)
    }

    /// Sets the instants (CLOCK_MONOTONIC ns) every program stamps between:
    /// written while they run, read by each stamp (`xl_emit`), so that a
    /// run begins and ends at one instant for all points.
    pub fn set_stamp_window(&mut self, from_ns: u64, until_ns: u64) -> Result<()> {
        let map = self
            .bpf
            .map_mut(".data.window")
            .context("the capture object has no stamp window (.data.window)")?;
        let mut window: Array<&mut MapData, StampWindow> = Array::try_from(map)?;
        window
            .set(
                0,
                StampWindow(xlap_abi::xlap_stamp_window { from_ns, until_ns }),
                0,
            )
            .context("cannot set the stamp window")?;
        Ok(())
    }

    /// Detaches the tracepoint programs one at a time, `pause` apart; the
    /// others go when the capture is dropped. Only for tests of a run's
    /// end (`XLAP_TEST_DETACH_PAUSE_MS`): they widen on purpose the time in
    /// which some hooks are gone and others still fire.
    pub fn detach_one_by_one(&mut self, pause: std::time::Duration) {
        let names: Vec<String> = self.bpf.programs().map(|(n, _)| n.to_string()).collect();
        for name in names {
            if let Some(aya::programs::Program::BtfTracePoint(p)) = self.bpf.program_mut(&name) {
                // A program that will not go now goes with the capture.
                let _ = p.unload();
                std::thread::sleep(pause);
            }
        }
    }

    /// The devices (network namespace inode, ifindex) device and qdisc
    /// points are restricted to (with `Settings::iface_filter`).
    pub fn set_ifaces(&mut self, devices: &[(u32, u32)]) -> Result<()> {
        let mut map: BpfHashMap<&mut MapData, IfaceKey, u8> =
            BpfHashMap::try_from(self.bpf.map_mut("IFACES").context("IFACES map")?)?;
        for &(netns, ifindex) in devices {
            map.insert(IfaceKey(xlap_abi::xlap_iface_key { netns, ifindex }), 1, 0)
                .context("cannot add an --iface device")?;
        }
        Ok(())
    }

    /// Attaches the planned USDT sites; a site that fails to attach is an
    /// error (the user asked for it), naming the probe and the process.
    pub fn attach_usdt(&mut self, sites: &[crate::usdt::Site]) -> Result<()> {
        if sites.is_empty() {
            return Ok(());
        }
        {
            let mut specs: Array<&mut MapData, Spec> =
                Array::try_from(self.bpf.map_mut("USDT_SPECS").context("USDT_SPECS map")?)?;
            for site in sites {
                specs
                    .set(site.spec_id, Spec(site.spec), 0)
                    .context("cannot store a USDT spec")?;
            }
        }
        let program = self.loaded_uprobe(crate::hooks::USDT)?;
        let mut attached = Vec::with_capacity(sites.len());
        for site in sites {
            let pid = std::num::NonZeroU32::new(site.pid).context("pid 0")?;
            let link = program
                .attach(
                    UProbeAttachPoint {
                        location: UProbeAttachLocation::AbsoluteOffset(site.probe.file_offset),
                        cookie: Some(site.spec_id as u64),
                    },
                    crate::usdt::fd_path(&site.file),
                    UProbeScope::OneProcess(pid),
                )
                .map_err(|e| {
                    failure(
                        Code::Kernel,
                        format!(
                            "cannot attach to USDT probe {}:{} of pid {} ({}): {e}",
                            site.probe.provider,
                            site.probe.name,
                            site.pid,
                            site.path.display()
                        ),
                    )
                });
            match link {
                Ok(link) => attached.push((site.pid, link)),
                Err(e) => {
                    self.note_uprobes(attached);
                    return Err(e);
                }
            }
        }
        self.note_uprobes(attached);
        Ok(())
    }

    fn note_uprobes(&mut self, links: Vec<(u32, UProbeLinkId)>) {
        for (pid, link) in links {
            self.uprobes_by_pid.entry(pid).or_default().push(link);
        }
    }

    /// Takes the uprobes of `pid` (it exited), or of every process and the
    /// loader hooks (`None`: the run ends), for the caller to close: each
    /// close waits for an RCU grace period of its own, so they are closed
    /// together, off the run's path (`record/uprobe_closer.rs`).
    pub fn take_uprobes(&mut self, pid: Option<u32>) -> Vec<UProbeLink> {
        let (usdt, loader): (Vec<UProbeLinkId>, Vec<UProbeLinkId>) = match pid {
            Some(pid) => (
                self.uprobes_by_pid.remove(&pid).unwrap_or_default(),
                Vec::new(),
            ),
            None => (
                self.uprobes_by_pid.drain().flat_map(|(_, l)| l).collect(),
                std::mem::take(&mut self.loader_links),
            ),
        };
        let mut taken = Vec::with_capacity(usdt.len() + loader.len());
        for (name, ids) in [
            (crate::hooks::USDT, usdt),
            (crate::hooks::LOADER_HOOK, loader),
        ] {
            if ids.is_empty() {
                continue;
            }
            let Some(Ok(program)) = self.bpf.program_mut(name).map(<&mut UProbe>::try_from) else {
                continue;
            };
            taken.extend(ids.into_iter().filter_map(|id| program.take_link(id).ok()));
        }
        taken
    }

    /// The uprobe program `name`, loaded on first use: its sites come in
    /// as processes exec and map libraries, attached to the one program.
    fn loaded_uprobe(&mut self, name: &str) -> Result<&mut UProbe> {
        let program: &mut UProbe = self
            .bpf
            .program_mut(name)
            .with_context(|| format!("program {name} is missing from the object"))?
            .try_into()?;
        if program.fd().is_err() {
            program.load()?;
        }
        Ok(program)
    }

    /// Hooks a dynamic loader, for every traced process that maps it: the
    /// process is held each time the loader has mapped objects (at
    /// `offset` in `loader`, its `_dl_debug_state`) that are not known
    /// code, so that the markers of libraries it loads are attached before
    /// they run. `to_r_debug`: from `_dl_debug_state` to the loader's list
    /// of objects (`r_debug`), 0 if not found (every such event holds).
    pub fn hook_loader(
        &mut self,
        loader: &std::os::fd::OwnedFd,
        offset: u64,
        to_r_debug: i64,
    ) -> Result<()> {
        let program = self.loaded_uprobe(crate::hooks::LOADER_HOOK)?;
        let link = program.attach(
            UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(to_r_debug as u64),
            },
            crate::usdt::fd_path(loader),
            UProbeScope::AllProcesses,
        )?;
        self.loader_links.push(link);
        Ok(())
    }

    /// Tells the BPF side that these files (kernel identity, version) have
    /// no traced marker: a process whose new code is only such files is
    /// not held. Returns how many did not fit in the map (those stay
    /// unknown: their processes are held, as before).
    pub fn know_code(
        &mut self,
        files: &[(xlap_abi::xlap_code_key, xlap_abi::xlap_code_version)],
    ) -> Result<usize> {
        let mut map: BpfHashMap<&mut MapData, CodeKey, CodeVersion> =
            BpfHashMap::try_from(self.bpf.map_mut("KNOWN_CODE").context("KNOWN_CODE map")?)?;
        let mut refused = 0;
        for (key, version) in files {
            if map.insert(CodeKey(*key), CodeVersion(*version), 0).is_err() {
                refused += 1;
            }
        }
        Ok(refused)
    }

    /// Whether `pid` is held at each exec whatever it execs: the recorder
    /// attached markers to its image, which a new image needs again.
    pub fn set_marked(&mut self, pid: u32, marked: bool) -> Result<()> {
        let mut map: BpfHashMap<&mut MapData, u32, u8> =
            BpfHashMap::try_from(self.bpf.map_mut("MARKED_PIDS").context("MARKED_PIDS map")?)?;
        if marked {
            map.insert(pid, 1, 0)
                .context("cannot note a process with markers (MARKED_PIDS is full)")?;
        } else {
            let _ = map.remove(&pid);
        }
        Ok(())
    }

    /// Events of traced processes not held, all their new code known:
    /// (at exec, at the loader).
    pub fn hold_skips(&self) -> (u64, u64) {
        let sum = |i: u32| -> Option<u64> {
            let map: PerCpuArray<&MapData, u64> =
                PerCpuArray::try_from(self.bpf.map("HOLD_SKIPS")?).ok()?;
            Some(map.get(&i, 0).ok()?.iter().sum())
        };
        (
            sum(xlap_abi::xlap_hold_skip::XLAP_SKIP_EXEC).unwrap_or(0),
            sum(xlap_abi::xlap_hold_skip::XLAP_SKIP_LOADER).unwrap_or(0),
        )
    }

    /// The ring buffer of held processes (bpf/hooks/holds.h).
    pub fn take_holds(&mut self) -> Result<RingBuf<MapData>> {
        let map = self.bpf.take_map("HOLDS").context("HOLDS map")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Traces `pids` (each the root of the processes it forks).
    pub fn set_targets(&mut self, pids: &[u32]) -> Result<()> {
        let mut map: BpfHashMap<&mut MapData, u32, u32> =
            BpfHashMap::try_from(self.bpf.map_mut("TARGET_PIDS").context("TARGET_PIDS map")?)?;
        for pid in pids {
            map.insert(pid, pid, 0).context("cannot add a target pid")?;
        }
        Ok(())
    }

    /// Traces every process in each of `cgroups` (cgroup v2 id, depth
    /// below the cgroup2 root) or below it that creates a socket, forks or
    /// execs from now on (bpf/lib/common.h TARGET_CGROUPS).
    pub fn set_target_cgroups(&mut self, cgroups: &[(u64, u32)]) -> Result<()> {
        let max = xlap_abi::XLAP_MAX_TARGET_CGROUPS as usize;
        if cgroups.len() > max {
            anyhow::bail!(
                "{} cgroups named with --cgroup/--container; at most {max} can be traced at once (name a common parent cgroup instead)",
                cgroups.len()
            );
        }
        let mut map: Array<&mut MapData, TargetCgroup> = Array::try_from(
            self.bpf
                .map_mut("TARGET_CGROUPS")
                .context("TARGET_CGROUPS map")?,
        )?;
        for (i, &(id, level)) in cgroups.iter().enumerate() {
            let value = TargetCgroup(xlap_abi::xlap_target_cgroup {
                id,
                level,
                ..Default::default()
            });
            map.set(i as u32, value, 0)
                .context("cannot name a target cgroup to the kernel side")?;
        }
        Ok(())
    }

    /// Every traced process: (pid, the target it descends from); a target
    /// is its own root, its forked children (followed by the BPF side) are
    /// not.
    pub fn traced_processes(&self) -> Result<Vec<(u32, u32)>> {
        let map: BpfHashMap<&MapData, u32, u32> =
            BpfHashMap::try_from(self.bpf.map("TARGET_PIDS").context("TARGET_PIDS map")?)?;
        Ok(map.iter().filter_map(|e| e.ok()).collect())
    }

    /// Follows `pid` as a descendant of target `root` (a child that existed
    /// before tracing began; later ones the BPF side follows at fork).
    pub fn follow_process(&mut self, pid: u32, root: u32) -> Result<()> {
        let mut map: BpfHashMap<&mut MapData, u32, u32> =
            BpfHashMap::try_from(self.bpf.map_mut("TARGET_PIDS").context("TARGET_PIDS map")?)?;
        map.insert(pid, root, 0)
            .context("cannot follow a target's child")?;
        Ok(())
    }

    /// Stops following `pid` (a followed child that exited: its pid may be
    /// reused by an unrelated process).
    pub fn forget_process(&mut self, pid: u32) -> Result<()> {
        let mut map: BpfHashMap<&mut MapData, u32, u32> =
            BpfHashMap::try_from(self.bpf.map_mut("TARGET_PIDS").context("TARGET_PIDS map")?)?;
        let _ = map.remove(&pid);
        Ok(())
    }

    /// Updates the kernel's port table: adds the sockets in `now`, removes
    /// those that were in `before` and are gone. Entries the BPF side added
    /// itself (at bind, at autobind) and /proc does not show yet are left
    /// alone. Returns the ports the table had no room for (their receive
    /// device points are missing; the run goes on).
    pub fn sync_ports(
        &mut self,
        before: &crate::targets::PortOwners,
        now: &crate::targets::PortOwners,
    ) -> Result<Vec<(u32, u16)>> {
        // PORTS_ANY first: the device points look there before TARGET_PORTS
        // (a port only in TARGET_PORTS would not be stamped).
        {
            let mut any: Array<&mut MapData, u8> =
                Array::try_from(self.bpf.map_mut("PORTS_ANY").context("PORTS_ANY map")?)?;
            for (_, port) in now.keys() {
                any.set(*port as u32, 1, 0)
                    .context("cannot note a traced port")?;
            }
        }
        let mut full = Vec::new();
        {
            let mut map: BpfHashMap<&mut MapData, PortKey, u32> = BpfHashMap::try_from(
                self.bpf
                    .map_mut("TARGET_PORTS")
                    .context("TARGET_PORTS map")?,
            )?;
            let key = |(netns, port): (u32, u16)| {
                PortKey(xlap_abi::xlap_port_key {
                    netns,
                    port,
                    ..Default::default()
                })
            };
            for gone in before.keys().filter(|k| !now.contains_key(k)) {
                let _ = map.remove(&key(*gone));
            }
            for (sock, pid) in now {
                if map.insert(key(*sock), pid, 0).is_err() {
                    full.push(*sock);
                }
            }
        }
        Ok(full)
    }

    /// The ring of processes held at a traced UDP socket's connect
    /// (`--boundary auto`), when connects are held.
    pub fn take_connects(&mut self) -> Result<Option<RingBuf<MapData>>> {
        if self.send_syscalls != SendSyscalls::Waiting {
            return Ok(None);
        }
        let map = self
            .bpf
            .take_map("CONNECTS")
            .context("CONNECTS ring buffer")?;
        Ok(Some(RingBuf::try_from(map)?))
    }

    pub fn take_ring(&mut self) -> Result<RingBuf<MapData>> {
        let map = self.bpf.take_map("STAMPS").context("STAMPS ring buffer")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// The per-CPU stamp batches, to read what is still waiting in them once
    /// the programs are detached (`drain_batches`).
    pub fn take_batches(&mut self) -> Result<PerCpuArray<MapData, Batch>> {
        let map = self.bpf.take_map("BATCH").context("BATCH map")?;
        Ok(PerCpuArray::try_from(map)?)
    }

    /// The loss counters, to read once the programs are detached (`losses`):
    /// nothing counts any more then.
    pub fn take_losses(&mut self) -> Result<PerCpuArray<MapData, u64>> {
        let map = self.bpf.take_map("LOSSES").context("LOSSES map")?;
        Ok(PerCpuArray::try_from(map)?)
    }

    /// The flow table's maps, to be read once the programs are gone.
    pub fn take_flows(&mut self) -> Result<FlowMaps> {
        let tuples = self.bpf.take_map("FLOWS").context("FLOWS map")?;
        let full = self.bpf.take_map("FLOWS_FULL").context("FLOWS_FULL map")?;
        Ok(FlowMaps {
            tuples: BpfHashMap::try_from(tuples)?,
            full: PerCpuArray::try_from(full)?,
        })
    }
}

/// The maps behind [`flows`].
pub struct FlowMaps {
    tuples: BpfHashMap<MapData, u64, FlowTuple>,
    full: PerCpuArray<MapData, u64>,
}

/// The addresses and sockets behind the run's flows.
#[derive(Debug, Default)]
pub struct Flows {
    pub table: xlap_records::writer::FlowTable,
    /// Flow keys two address pairs shared (their stamps get no addresses).
    pub collided: u64,
    /// Times a flow found the table full (its stamps get no addresses).
    pub not_noted: u64,
}

pub fn flows(maps: &FlowMaps) -> Result<Flows> {
    use std::net::{Ipv4Addr, Ipv6Addr};
    let mut out = Flows {
        not_noted: maps.full.get(&0, 0)?.iter().sum(),
        ..Default::default()
    };
    for entry in maps.tuples.iter() {
        let (flow, FlowTuple(t)) = entry?;
        if t.collided != 0 {
            out.collided += 1;
            continue;
        }
        let addr = |b: [u8; 16]| -> String {
            if t.family == 6 {
                Ipv6Addr::from(b).to_string()
            } else {
                Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string()
            }
        };
        out.table.insert(
            flow,
            xlap_records::writer::FlowInfo {
                src_addr: addr(t.saddr),
                dst_addr: addr(t.daddr),
                tx_cookie: (t.tx_cookie != 0).then_some(t.tx_cookie),
                rx_cookie: (t.rx_cookie != 0).then_some(t.rx_cookie),
            },
        );
    }
    Ok(out)
}

/// Loss counters summed over CPUs: `[point row][reason]`; the last row
/// counts app points.
pub fn losses(
    map: &PerCpuArray<MapData, u64>,
) -> Result<Vec<[u64; xlap_loss::XLAP_LOSS_COUNT as usize]>> {
    let reasons = xlap_loss::XLAP_LOSS_COUNT as usize;
    let rows = xlap_point::XLAP_POINT_KERNEL_COUNT as usize + 1;
    let mut out = vec![[0u64; xlap_loss::XLAP_LOSS_COUNT as usize]; rows];
    for (row, counts) in out.iter_mut().enumerate() {
        for (reason, slot) in counts.iter_mut().enumerate() {
            let idx = (row * reasons + reason) as u32;
            *slot = map.get(&idx, 0)?.iter().sum();
        }
    }
    Ok(out)
}

impl Capture {
    /// (program, run count, run time ns) of every program, from the kernel's
    /// BPF statistics (non-zero only while stats are enabled).
    /// And the runs the kernel skipped because the program was already
    /// running on that CPU (`recursion_misses`: a tracepoint hit inside one
    /// of our own programs); their stamps are missing.
    pub fn program_stats(&self) -> Vec<(String, crate::runmeta::ProgramStats)> {
        self.bpf
            .programs()
            .filter_map(|(name, prog)| {
                let info = prog.info().ok()?;
                let recursion_misses = prog.fd().ok().and_then(|fd| recursion_misses(fd.as_fd()));
                Some((
                    name.to_string(),
                    crate::runmeta::ProgramStats {
                        run_count: info.run_count(),
                        run_time_ns: info.run_time().as_nanos() as u64,
                        recursion_misses,
                        verified_insns: info.verified_instruction_count(),
                    },
                ))
            })
            .collect()
    }
}

/// A program's `recursion_misses` (Linux >= 5.12), which aya's program info
/// does not expose: BPF_OBJ_GET_INFO_BY_FD on its fd.
fn recursion_misses(fd: std::os::fd::BorrowedFd) -> Option<u64> {
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    // SAFETY: bpf_prog_info is plain old data; all zeroes is valid.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    let attr = InfoAttr {
        bpf_fd: std::os::fd::AsRawFd::as_raw_fd(&fd) as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: &mut info as *mut _ as u64,
    };
    // SAFETY: the kernel writes at most info_len bytes into `info`, which
    // outlives the call; `attr` is read only.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &attr as *const InfoAttr,
            std::mem::size_of::<InfoAttr>() as u32,
        )
    };
    (rc == 0).then_some(info.recursion_misses)
}

/// The BPF side's configuration (`CFG`) for a run of `settings`, before
/// the kernel is known (usage errors only).
fn config_of(settings: &Settings) -> Result<xlap_abi::xlap_config> {
    let (layouts, win_start, win_len) = settings.layouts.to_abi()?;
    let mut config = xlap_abi::xlap_config {
        layouts,
        win_start,
        win_len,
        ..Default::default()
    };
    config.wakeup_bytes = settings.ringbuf_bytes / 8;
    config.per_stamp = settings.per_stamp as u8;
    config.empty_programs = settings.empty_programs as u8;
    config.iface_filter = settings.iface_filter as u8;
    config.points_off = settings.points.off_mask();
    // Nothing takes the receive notes without the socket-queue point.
    config.rx_notes = settings.points.needs_program(crate::hooks::SOCK_INGRESS) as u8;
    config.device_rx_times = settings.device_rx_times as u8;
    if let Some(sample) = &settings.sample {
        config.sample_below = sample.below();
        config.sample_kinds = sample.kind_bits();
    }
    if settings.tunnel_ports.len() > config.tunnel_ports.len() {
        return Err(failure(
            Code::Usage,
            format!(
                "at most {} tunnel ports (VXLAN's 4789 and 8472 count among them)",
                config.tunnel_ports.len()
            ),
        ));
    }
    for (slot, port) in config.tunnel_ports.iter_mut().zip(&settings.tunnel_ports) {
        *slot = *port;
    }
    Ok(config)
}

/// What `CFG` takes from this kernel and the boundary chosen on it.
fn fit_to_kernel(
    config: &mut xlap_abi::xlap_config,
    settings: &Settings,
    btf: &Btf,
    dynptr: bool,
    boundary: &BoundaryChoice,
) {
    config.have_dynptr = dynptr as u8;
    config.syscall_hooks = matches!(boundary, BoundaryChoice::Syscalls(_)) as u8;
    config.send_syscalls = (*boundary == BoundaryChoice::Auto) as u8;
    config.hold_connect = (*boundary == BoundaryChoice::Auto && settings.hold_connect) as u8;
    config.send_calls = settings
        .points
        .needs_program(crate::hooks::SOCK_SEND_LENGTH) as u8;
    // Without sock_recv_length (Linux < 6.3), a receive syscall finds its
    // socket from its file descriptor (bpf/hooks/syscall.h).
    config.recv_by_fd = (config.syscall_hooks == 1
        && (btf
            .id_by_type_name_kind("btf_trace_sock_recv_length", BtfKind::Typedef)
            .is_err()
            || emulated_absent(crate::hooks::SOCK_RECV_LENGTH).is_some()))
        as u8;
}

/// The capture object loaded (its maps made, no program yet) with
/// `config` as `CFG`.
fn load_object(object: &[u8], config: &xlap_abi::xlap_config, ringbuf_bytes: u32) -> Result<Ebpf> {
    // SAFETY: xlap_config is a plain C struct of integers (no padding
    // holes with undefined contents: it is zero-initialised by Default).
    let config_bytes: &[u8] = unsafe {
        std::slice::from_raw_parts(
            (config as *const xlap_abi::xlap_config).cast::<u8>(),
            std::mem::size_of::<xlap_abi::xlap_config>(),
        )
    };
    EbpfLoader::new()
        // TASK_CTX is task local storage: only the BPF side uses it.
        .allow_unsupported_maps()
        .override_global("CFG", config_bytes, true)
        .map_max_entries("STAMPS", ringbuf_bytes)
        .load(object)
        .map_err(|e| {
            let text = e.to_string();
            if text.contains("EPERM") || text.contains("Operation not permitted") {
                failure(
                    Code::Privileges,
                    format!("the kernel refused to load BPF ({text}): run as root"),
                )
            } else {
                anyhow::Error::new(e).context("loading the capture BPF object failed")
            }
        })
}

/// The tracepoints of the table the run needs (`hooks::tracepoints` of
/// `boundary` whose points are written, then the holds', never required),
/// loaded side by side and attached; a program the kernel is emulated to
/// lack is said, not loaded. A required one that fails ends the run.
fn attach_tracepoints(
    bpf: &mut Ebpf,
    btf: &Btf,
    object: &[u8],
    settings: &Settings,
    boundary: crate::hooks::Boundary,
    unattached: &mut Vec<Unattached>,
) -> Result<()> {
    let mut planned: Vec<(&'static str, &'static str, bool)> = Vec::new();
    for (prog, target, required) in crate::hooks::tracepoints(boundary) {
        if !settings.points.needs_program(prog) {
            continue;
        }
        match emulated_absent(prog) {
            Some(why) => unattached.push(Unattached {
                program: prog,
                hook: target,
                why,
            }),
            None => planned.push((prog, target, required)),
        }
    }
    if settings.hold_at_exec {
        planned.extend(
            crate::hooks::HOOKS
                .iter()
                .filter_map(|hook| match hook.attach {
                    crate::hooks::Attach::TpBtfForHolds(tp) => Some((hook.program, tp, false)),
                    _ => None,
                }),
        );
    }
    let wanted: Vec<(&'static str, &'static str)> = planned
        .iter()
        .map(|&(prog, target, _)| (prog, target))
        .collect();
    let mut refused = crate::preload::load_tracing(bpf, btf, object, &wanted);
    for (prog, target, required) in planned {
        let result = match refused.remove(prog) {
            Some(e) => Err(e),
            None => attach_tp_btf(bpf, btf, prog, target),
        };
        if let Err(e) = result {
            if required {
                return Err(required_refused(prog, target, &e));
            }
            unattached.push(Unattached {
                program: prog,
                hook: target,
                why: refusal(prog, &e).unwrap_or_else(|| format!("{e:#}")),
            });
        }
    }
    Ok(())
}

/// The cgroup hooks of the table (`hooks::cgroup_hooks`), at the cgroup2
/// root: the traced processes' sockets (creation, bind), the start of a
/// send at the socket calls, and the socket-queue point (which reads the
/// datagram through a dynptr: not on kernels without). A required one
/// that fails ends the run; an optional one is said in `unattached`.
fn attach_socket_hooks(
    bpf: &mut Ebpf,
    dynptr: &Result<(), String>,
    boundary: crate::hooks::Boundary,
    unattached: &mut Vec<Unattached>,
) -> Result<()> {
    let root = crate::cgroup::open_root().map_err(|e| {
        failure(
            Code::Kernel,
            format!("cannot attach the socket hooks: {e:#}"),
        )
    })?;
    for (hook, section) in crate::hooks::cgroup_hooks(boundary) {
        let program = hook.program;
        if let (Err(why), Some(crate::kfunc::DYNPTR_TRACING_KERNEL)) = (dynptr, hook.min_kernel) {
            unattached.push(Unattached {
                program,
                hook: section,
                why: format!("it reads datagrams through skb dynptrs: {why}"),
            });
            continue;
        }
        let failed = match attach_cgroup(bpf, &root, program, section) {
            Ok(()) => continue,
            Err(failed) => failed,
        };
        let hint = if hook.boundary == Some(crate::hooks::Boundary::SocketCalls) {
            "; --boundary syscalls stamps the send at the syscall instead"
        } else {
            ""
        };
        match (failed, hook.required) {
            (CgroupFailure::Load(e), true) => return Err(required_refused(program, section, &e)),
            (CgroupFailure::Attach(e), true) => {
                return Err(failure(
                    Code::Kernel,
                    format!("cannot attach {program} to {section}: {e:#}{hint}"),
                ))
            }
            (CgroupFailure::Load(e) | CgroupFailure::Attach(e), false) => {
                unattached.push(Unattached {
                    program,
                    hook: section,
                    why: refusal(program, &e).unwrap_or_else(|| format!("{e:#}")),
                })
            }
        }
    }
    Ok(())
}

/// Where a cgroup hook failed.
enum CgroupFailure {
    /// Its program was refused (the verifier, or missing from the object).
    Load(anyhow::Error),
    /// The kernel did not attach it.
    Attach(anyhow::Error),
}

/// Loads cgroup program `program` and attaches it to cgroup `root`, as the
/// type of its section (`SEC()`) says.
fn attach_cgroup(
    bpf: &mut Ebpf,
    root: &std::fs::File,
    program: &str,
    section: &str,
) -> std::result::Result<(), CgroupFailure> {
    use aya::programs::Program;
    // Attach mode `Single`: aya attaches through a BPF link (Linux >= 5.7),
    // which coexists with every other program on the cgroup anyway, and
    // passes the mode on as link flags, where the kernel refuses
    // BPF_F_ALLOW_MULTI with EINVAL.
    let mode = CgroupAttachMode::Single;
    let load = |e: aya::programs::ProgramError| CgroupFailure::Load(e.into());
    let attach = |e: aya::programs::ProgramError| CgroupFailure::Attach(e.into());
    match bpf.program_mut(program) {
        Some(Program::CgroupSock(p)) => {
            p.load().map_err(load)?;
            p.attach(root, mode).map(drop).map_err(attach)
        }
        Some(Program::CgroupSockAddr(p)) => {
            p.load().map_err(load)?;
            p.attach(root, mode).map(drop).map_err(attach)
        }
        Some(Program::CgroupSkb(p)) => {
            let direction = if section.ends_with("egress") {
                CgroupSkbAttachType::Egress
            } else {
                CgroupSkbAttachType::Ingress
            };
            p.load().map_err(load)?;
            p.attach(root, direction, mode).map(drop).map_err(attach)
        }
        Some(_) => Err(CgroupFailure::Load(anyhow::anyhow!(
            "{program} ({section}) is not a cgroup program of a type the recorder attaches"
        ))),
        None => Err(CgroupFailure::Load(anyhow::anyhow!(
            "program {program} is missing from the object"
        ))),
    }
}

/// Why `program` is left out when the run behaves as an older kernel
/// (`XLAP_KERNEL_AS`) than its hook's minimum (`hooks::HOOKS`), as that
/// kernel would leave it out.
fn emulated_absent(program: &str) -> Option<String> {
    let (major, minor) = crate::preflight::kernel_as()?;
    let (min_major, min_minor) = crate::hooks::HOOKS
        .iter()
        .find(|h| h.program == program)?
        .min_kernel?;
    ((major, minor) < (min_major, min_minor)).then(|| {
        format!("behaving as Linux {major}.{minor} (XLAP_KERNEL_AS), which lacks it: it needs Linux {min_major}.{min_minor}")
    })
}

/// The combined stack per program as the build counted it
/// (`build_stack.rs`: frames rounded to 32 as Linux 6.1 counts).
pub const STACK_TABLE: &str = include_str!(concat!(env!("OUT_DIR"), "/capture.stack.txt"));

/// The combined stack of `program`'s worst call chain, as built.
pub fn built_stack(program: &str) -> Option<u32> {
    STACK_TABLE
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (_, name, bytes) = (f.next()?, f.next()?, f.next()?);
            (name == program).then(|| bytes.parse().ok()).flatten()
        })
}

/// When the kernel's verifier refused `program`: what it said (its
/// decisive line, not the log) and which of its limits that is.
pub fn refusal(program: &str, err: &anyhow::Error) -> Option<String> {
    let log = err.chain().find_map(|c| match c.downcast_ref() {
        Some(aya::programs::ProgramError::LoadError { verifier_log, .. }) => {
            Some(verifier_log.to_string())
        }
        _ => None,
    })?;
    let noise = |l: &&str| {
        let l = l.trim();
        l.is_empty()
            || l.starts_with("processed ")
            || l.starts_with("verification time")
            || l.starts_with("stack depth")
            || l.starts_with("-- END")
    };
    let line = log
        .lines()
        .rev()
        .find(|l| !noise(l))
        .unwrap_or("(no verifier output)")
        .trim();
    let limit = if line.contains("combined stack size") {
        let built = built_stack(program)
            .map(|b| format!("; built: {b} bytes counted as Linux 6.1 counts"))
            .unwrap_or_default();
        format!("its limit of 512 bytes of stack for a chain of BPF-to-BPF calls, which this kernel applies to tracing programs{built}")
    } else if line.contains("too large") || line.contains("too complex") {
        "its limit on the instructions or states it explores (1M)".to_string()
    } else if line.contains("-th argument") || line.contains("invalid mem access") {
        "a tracepoint whose arguments or types differ on this kernel from those the program was written for".to_string()
    } else {
        "a check the program does not pass on this kernel".to_string()
    };
    Some(format!(
        "the kernel's verifier refused {program}: \"{line}\" ({limit})"
    ))
}

/// Which option leaves `program` out of a run.
fn leave_out(program: &str) -> String {
    let hook = crate::hooks::HOOKS.iter().find(|h| h.program == program);
    match hook.and_then(|h| h.boundary) {
        Some(crate::hooks::Boundary::Syscalls) => {
            return "--boundary socket-calls or auto (the default) leaves it out (on Linux 6.12 and later)".into()
        }
        Some(crate::hooks::Boundary::SocketCalls) => {
            return "--boundary syscalls leaves it out".into()
        }
        None => {}
    }
    for set in ["standard", "minimal"] {
        if crate::point_sets::PointSet::parse(set).is_ok_and(|s| !s.needs_program(program)) {
            return format!("--points {set} leaves it out");
        }
    }
    "no option leaves it out (every run needs it): please report this kernel (uname -r) and this message".into()
}

/// A required program the kernel refused: exit 4 (the kernel lacks
/// something needed), with the program, the verifier's limit and the option
/// that leaves it out; other errors as they are.
fn required_refused(program: &str, target: &str, err: &anyhow::Error) -> anyhow::Error {
    match refusal(program, err) {
        Some(why) => failure(
            Code::Kernel,
            format!(
                "{why}; the run needs it for {target}: {} (docs/stamp-points.md, minimum kernel per feature)",
                leave_out(program)
            ),
        ),
        None => failure(
            Code::Kernel,
            format!("cannot attach {program} to {target}: {err:#}"),
        ),
    }
}

/// Loads (unless preloaded) and attaches tracepoint program `prog` at
/// `target`.
fn attach_tp_btf(bpf: &mut Ebpf, btf: &Btf, prog: &str, target: &str) -> Result<()> {
    let program = bpf
        .program_mut(prog)
        .with_context(|| format!("program {prog} is missing from the object"))?;
    let p: &mut BtfTracePoint = program.try_into()?;
    // Most are loaded already, side by side (preload.rs).
    if p.fd().is_err() {
        p.load(target, btf)?;
    }
    p.attach()?;
    Ok(())
}

/// `--boundary auto`: loads the send syscalls' hook (attached later, once a
/// traced UDP socket is connected) and attaches the connect hooks that hold
/// a process connecting one until then. Returns the hook's state, and
/// whether connects are held (else why not: the hook must then be
/// attached from the start).
fn load_send_syscalls(
    bpf: &mut Ebpf,
    btf: &Btf,
    hold_connect: bool,
) -> (SendSyscalls, Result<(), String>) {
    let loaded = bpf
        .program_mut(crate::hooks::SEND_SYSCALL)
        .context("program on_send_syscall is missing from the object")
        .and_then(|p| -> Result<()> {
            let p: &mut BtfTracePoint = p.try_into()?;
            p.load("sys_enter", btf)?;
            Ok(())
        });
    if let Err(e) = loaded {
        let why = refusal(crate::hooks::SEND_SYSCALL, &e).unwrap_or_else(|| format!("{e:#}"));
        return (SendSyscalls::Refused(why), Ok(()));
    }
    if !hold_connect {
        return (
            SendSyscalls::Waiting,
            Err("the recorder cannot resume a held process (CAP_KILL)".into()),
        );
    }
    let root = match crate::cgroup::open_root() {
        Ok(root) => root,
        Err(e) => return (SendSyscalls::Waiting, Err(format!("{e:#}"))),
    };
    for (prog, section) in crate::hooks::auto_cgroup_hooks() {
        let attached = bpf
            .program_mut(prog)
            .with_context(|| format!("program {prog} is missing from the object"))
            .and_then(|p| -> Result<()> {
                let hook: &mut CgroupSockAddr = p.try_into()?;
                hook.load()?;
                hook.attach(&root, CgroupAttachMode::Single)?;
                Ok(())
            });
        if let Err(e) = attached {
            let why = refusal(prog, &e).unwrap_or_else(|| format!("{e:#}"));
            return (
                SendSyscalls::Waiting,
                Err(format!("this kernel refused {section} ({why})")),
            );
        }
    }
    for (prog, tp) in crate::hooks::auto_tracepoints() {
        if let Err(e) = attach_tp_btf(bpf, btf, prog, tp) {
            let why = refusal(prog, &e).unwrap_or_else(|| format!("{e:#}"));
            return (
                SendSyscalls::Waiting,
                Err(format!("this kernel refused the {tp} tracepoint ({why})")),
            );
        }
    }
    (SendSyscalls::Waiting, Ok(()))
}

/// Keeps the kernel's BPF run-time statistics on while alive
/// (`BPF_ENABLE_STATS`); the kernel turns them off when the fd closes.
pub struct StatsGuard(#[allow(dead_code)] std::os::fd::OwnedFd);

pub fn enable_stats() -> Option<StatsGuard> {
    const BPF_ENABLE_STATS: libc::c_long = 32;
    const BPF_STATS_RUN_TIME: u32 = 0;
    let attr = [BPF_STATS_RUN_TIME, 0, 0, 0];
    // SAFETY: BPF_ENABLE_STATS reads a u32 stats type from `attr`, which
    // outlives the call; the returned fd is owned by us.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_ENABLE_STATS,
            attr.as_ptr(),
            std::mem::size_of_val(&attr) as u32,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this fd to us.
    Some(StatsGuard(unsafe {
        std::os::fd::FromRawFd::from_raw_fd(fd as i32)
    }))
}

/// The stamps left in the per-CPU batches (call after detaching: nothing
/// appends any more). An unreadable map is an error: those stamps would be
/// lost without a count.
pub fn drain_batches(batches: &PerCpuArray<MapData, Batch>) -> Result<Vec<xlap_abi::xlap_stamp>> {
    let per_cpu = batches
        .get(&0, 0)
        .context("cannot read the stamps left in the per-CPU batches")?;
    let mut out = Vec::new();
    for batch in per_cpu.iter() {
        out.extend_from_slice(batch.0.pending());
    }
    Ok(out)
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    fn refused(log: &str) -> anyhow::Error {
        anyhow::Error::from(aya::programs::ProgramError::LoadError {
            io_error: std::io::Error::from_raw_os_error(libc::EACCES),
            verifier_log: aya_obj::VerifierLog::new(log.to_string()),
        })
    }

    /// What Debian 12's 6.1 said of the program before issue 49's fix:
    /// the program, the decisive line, the limit and the option, not the log.
    #[test]
    fn a_verifier_refusal_names_the_program_the_limit_and_the_option() {
        let log = "0: (bf) r6 = r1\n...\ncombined stack size of 3 calls is 544. Too large\nverification time 1 usec\nstack depth 272+48+56+0+192+48+96\nprocessed 900 insns (limit 1000000)\n";
        let e = required_refused("on_sys_exit", "sys_exit", &refused(log));
        let text = e.to_string();
        assert_eq!(xlap_exit::code_of(&e), 4, "{text}");
        assert!(text.contains("on_sys_exit"), "{text}");
        assert!(
            text.contains("combined stack size of 3 calls is 544"),
            "{text}"
        );
        assert!(text.contains("512 bytes"), "{text}");
        assert!(text.contains("--boundary socket-calls"), "{text}");
        assert!(!text.contains("r6 = r1"), "the log itself: {text}");
        // An optional program: one line for run.json.
        let why = refusal(
            "on_io_uring_complete",
            &refused("23: (61) r6 = *(u32 *)(r7 +8)\nR7 invalid mem access 'scalar'\n"),
        )
        .unwrap();
        assert!(why.contains("R7 invalid mem access"), "{why}");
        assert!(why.contains("arguments or types differ"), "{why}");
        // Not a verifier refusal: none.
        assert!(refusal("on_sys_exit", &anyhow::anyhow!("ENOENT")).is_none());
    }

    #[test]
    fn the_build_counted_every_programs_stack_within_the_limit() {
        assert!(STACK_TABLE.lines().filter(|l| !l.starts_with('#')).count() >= 30);
        for h in crate::hooks::HOOKS {
            if h.program == crate::hooks::SKB_DYNPTR {
                continue;
            }
            let bytes = built_stack(h.program)
                .unwrap_or_else(|| panic!("{} is not in the stack table", h.program));
            assert!(bytes <= 512, "{}: {bytes}", h.program);
        }
    }
}
