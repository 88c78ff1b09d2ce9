//! One table of the capture's hooks. For each program of
//! `bpf/capture.bpf.c` (and the one kfunc the skb readers depend on): how
//! it attaches, whether a run needs it, the kernel it needs where later
//! than the capture's, the points it stamps and what a run loses without
//! it. The tracepoint attach loop, `--points` (which programs a point set
//! needs), what a run lacks (run.json `missing`/`degraded`) and the
//! minimum-kernel list of docs/stamp-points.md all read it; a test checks
//! it against the `SEC()` lines of `bpf/hooks/`. Which fields a point's
//! stamps carry (skb priority) is the point vocabulary's
//! (`xlap_records::points`): the decoder reads it there.

use crate::kfunc::DYNPTR_TRACING_KERNEL;
use xlap_abi::xlap_point as p;

/// How a hook attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A BTF-typed tracepoint (`SEC("tp_btf/NAME")`), attached at load.
    TpBtf(&'static str),
    /// The same, only while processes are held for their markers.
    TpBtfForHolds(&'static str),
    /// The same, under `--boundary auto`, once a traced UDP socket is
    /// connected (`Capture::hook_send_syscalls`).
    TpBtfOnConnect(&'static str),
    /// The same, under `--boundary auto` from the start (where a connect
    /// is held).
    TpBtfForAuto(&'static str),
    /// A cgroup hook on the root cgroup (`SEC("SECTION")`), attached by
    /// the socket hooks' own step.
    Cgroup(&'static str),
    /// The same, under `--boundary auto` only (the connect hooks).
    CgroupForAuto(&'static str),
    /// A uprobe, per traced file: at its USDT sites, or at its loader's
    /// `_dl_debug_state`.
    Uprobe,
    /// Run by the recorder on a timer (`SEC("raw_tp")`, test-run).
    Timer,
    /// Not a program: a kfunc the skb-reading programs call.
    Kfunc,
}

impl Attach {
    /// The `SEC()` of the program in the C source; `None` for a kfunc.
    pub fn section(self) -> Option<String> {
        match self {
            Attach::TpBtf(tp)
            | Attach::TpBtfForHolds(tp)
            | Attach::TpBtfOnConnect(tp)
            | Attach::TpBtfForAuto(tp) => Some(format!("tp_btf/{tp}")),
            Attach::Cgroup(section) | Attach::CgroupForAuto(section) => Some(section.to_string()),
            Attach::Uprobe => Some("uprobe".into()),
            Attach::Timer => Some("raw_tp".into()),
            Attach::Kfunc => None,
        }
    }
}

/// Where the application/socket boundary is stamped (`bpf/hooks/calls.h`,
/// `bpf/hooks/syscall.h`): the hooks of one are attached, not the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    /// At the socket calls (`--boundary socket-calls`): nothing else on the
    /// machine pays.
    SocketCalls,
    /// At the send and receive syscalls (the default): while they are
    /// attached, every syscall of every task of the machine takes the
    /// kernel's slow path.
    Syscalls,
}

/// What a run loses without a program (it is left out, or could not be
/// attached on this kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Without {
    /// Its points are not stamped at all.
    Missing,
    /// Its points lose some of their stamps (another program stamps the
    /// rest: what is lost, said here).
    Degraded(&'static str),
    /// One of several programs that stamp a point (what it stamps, said
    /// here): the point is missing when all of them are absent, degraded
    /// when some are.
    OneOf(&'static str),
    /// Its points keep their stamps but lose what it adds to them (a
    /// filter, a field: said here); it stamps none of them itself.
    Weakened(&'static str),
}

/// One part of a hook's job: the points it concerns and what a run
/// without the hook loses of them.
#[derive(Clone, Copy, Debug)]
pub struct Effect {
    pub points: &'static [u32],
    /// Nothing else reads what it does: the hook is left unattached when
    /// none of its points is wanted.
    pub stamp_only: bool,
    pub without: Without,
}

/// A hook of the capture.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub program: &'static str,
    pub attach: Attach,
    /// The run fails when it cannot attach; otherwise the run goes on and
    /// says what it lacks.
    pub required: bool,
    /// The oldest kernel it attaches on, where later than the capture's
    /// (`preflight::MIN_KERNEL`).
    pub min_kernel: Option<(u32, u32)>,
    pub effects: &'static [Effect],
    /// Attached only with this boundary (`None`: with either).
    pub boundary: Option<Boundary>,
}

const fn effect(points: &'static [u32], stamp_only: bool, without: Without) -> Effect {
    Effect {
        points,
        stamp_only,
        without,
    }
}

/// A required tracepoint: the run fails without it.
const fn required(program: &'static str, tp: &'static str, effects: &'static [Effect]) -> Hook {
    Hook {
        program,
        attach: Attach::TpBtf(tp),
        required: true,
        min_kernel: None,
        effects,
        boundary: None,
    }
}

/// An optional tracepoint.
const fn optional(program: &'static str, tp: &'static str, effects: &'static [Effect]) -> Hook {
    Hook {
        program,
        attach: Attach::TpBtf(tp),
        required: false,
        min_kernel: None,
        effects,
        boundary: None,
    }
}

/// An optional tracepoint that older kernels lack (or lay out otherwise).
const fn since(
    program: &'static str,
    tp: &'static str,
    effects: &'static [Effect],
    min_kernel: (u32, u32),
) -> Hook {
    Hook {
        program,
        attach: Attach::TpBtf(tp),
        required: false,
        min_kernel: Some(min_kernel),
        effects,
        boundary: None,
    }
}

/// A required program of one boundary.
const fn at_boundary(
    program: &'static str,
    attach: Attach,
    boundary: Boundary,
    effects: &'static [Effect],
) -> Hook {
    Hook {
        program,
        attach,
        required: true,
        min_kernel: None,
        effects,
        boundary: Some(boundary),
    }
}

/// A program that stamps nothing itself (it keeps state others read).
const fn helper(program: &'static str, attach: Attach, required: bool) -> Hook {
    Hook {
        program,
        attach,
        required,
        min_kernel: None,
        effects: &[],
        boundary: None,
    }
}

/// The name [`Capture::lacking`](crate::capture::Capture::lacking) gives
/// the skb dynptr kfunc when the kernel lacks it for tracing programs.
pub const SKB_DYNPTR: &str = "bpf_dynptr_from_skb";

/// Programs the recorder also names outside this table (the uprobes it
/// attaches per traced file, the send syscalls' hook it attaches once a
/// traced socket connects): one name each, here.
pub const USDT: &str = "on_usdt";
pub const LOADER_HOOK: &str = "on_loader_hook";
pub const SEND_SYSCALL: &str = "on_send_syscall";
/// The socket-queue point, whose presence the configuration tells the
/// receive points.
pub const SOCK_INGRESS: &str = "on_sock_ingress";
/// The socket calls' send and receive returns, which the configuration
/// tells the device points about.
pub const SOCK_SEND_LENGTH: &str = "on_sock_send_length";
pub const SOCK_RECV_LENGTH: &str = "on_sock_recv_length";

/// Every hook, in the order a datagram meets them.
pub const HOOKS: &[Hook] = &[
    // The app/socket boundary (required stamps: a run cannot do without):
    // at the socket calls (bpf/hooks/calls.h)...
    at_boundary(
        "on_sendmsg4",
        Attach::Cgroup("cgroup/sendmsg4"),
        Boundary::SocketCalls,
        &[effect(&[p::XLAP_POINT_SOCK_SEND_ENTER], false, Without::Missing)],
    ),
    at_boundary(
        "on_sendmsg6",
        Attach::Cgroup("cgroup/sendmsg6"),
        Boundary::SocketCalls,
        &[effect(&[p::XLAP_POINT_SOCK_SEND_ENTER], false, Without::Missing)],
    ),
    // Only with sock.send_exit: without it, a send's first device point
    // stamps its send_enter (CFG.send_calls, bpf/hooks/dev_tx.h), and the
    // hook's run on every send call is saved.
    at_boundary(
        SOCK_SEND_LENGTH,
        Attach::TpBtf("sock_send_length"),
        Boundary::SocketCalls,
        &[effect(&[p::XLAP_POINT_SOCK_SEND_EXIT], true, Without::Missing)],
    ),
    // (A datagram the socket drops after its queue point is never read:
    // the reads' matching by queue position forgets it.)
    at_boundary(
        "on_udp_fail_queue_rcv_skb",
        Attach::TpBtf("udp_fail_queue_rcv_skb"),
        Boundary::SocketCalls,
        &[effect(&[p::XLAP_POINT_SOCK_RECV_EXIT], false, Without::Missing)],
    ),
    // Under --boundary auto, a connected socket's sends begin at their
    // syscall's entry: hooked once a traced UDP socket is connected (the
    // connect holds the process until then), not before, since the hook
    // costs every syscall of the machine.
    helper(SEND_SYSCALL, Attach::TpBtfOnConnect("sys_enter"), false),
    helper("on_connect4", Attach::CgroupForAuto("cgroup/connect4"), false),
    helper("on_connect6", Attach::CgroupForAuto("cgroup/connect6"), false),
    // The connect noted above is held where it looks its route up: a
    // cgroup hook may not stop a process before Linux 6.18.
    helper(
        "on_fib_table_lookup",
        Attach::TpBtfForAuto("fib_table_lookup"),
        false,
    ),
    helper(
        "on_fib6_table_lookup",
        Attach::TpBtfForAuto("fib6_table_lookup"),
        false,
    ),
    // ...or, asked for, at the syscalls (bpf/hooks/syscall.h).
    at_boundary(
        "on_sys_enter",
        Attach::TpBtf("sys_enter"),
        Boundary::Syscalls,
        &[effect(&[p::XLAP_POINT_SOCK_SEND_ENTER], false, Without::Missing)],
    ),
    at_boundary(
        "on_sys_exit",
        Attach::TpBtf("sys_exit"),
        Boundary::Syscalls,
        &[effect(
            &[
                p::XLAP_POINT_SOCK_SEND_ENTER,
                p::XLAP_POINT_SOCK_SEND_EXIT,
                p::XLAP_POINT_SOCK_RECV_EXIT,
            ],
            false,
            Without::Missing,
        )],
    ),
    // Measured (tests/vm): absent on Debian 12's 6.1, present on 6.12.
    since(
        SOCK_RECV_LENGTH,
        "sock_recv_length",
        &[effect(
            &[p::XLAP_POINT_SOCK_RECV_EXIT],
            false,
            Without::Degraded(
                "at the syscalls: reads carry no flow (their socket found from its file descriptor: its port only); at the socket calls: no receive is stamped",
            ),
        )],
        (6, 3),
    ),
    // Measured (tests/vm): absent under this name on 6.1, attaches on 6.12.
    since(
        "on_io_uring_submit_req",
        "io_uring_submit_req",
        &[effect(
            &[
                p::XLAP_POINT_SOCK_SEND_ENTER,
                p::XLAP_POINT_SOCK_SEND_EXIT,
                p::XLAP_POINT_SOCK_RECV_EXIT,
            ],
            false,
            Without::Degraded("io_uring requests are not stamped"),
        )],
        (6, 12),
    ),
    // Measured (tests/vm): on 6.1 and 6.12 its third argument is no cqe (the verifier refuses the read); 6.18 attaches.
    since(
        "on_io_uring_complete",
        "io_uring_complete",
        &[effect(
            &[
                p::XLAP_POINT_SOCK_SEND_ENTER,
                p::XLAP_POINT_SOCK_SEND_EXIT,
                p::XLAP_POINT_SOCK_RECV_EXIT,
            ],
            false,
            Without::Degraded("io_uring requests are not stamped"),
        )],
        (6, 18),
    ),
    // The traced processes' sockets and children.
    helper("on_sock_create", Attach::Cgroup("cgroup/sock_create"), true),
    helper("on_post_bind4", Attach::Cgroup("cgroup/post_bind4"), true),
    helper("on_post_bind6", Attach::Cgroup("cgroup/post_bind6"), true),
    helper(
        "on_sched_process_fork",
        Attach::TpBtf("sched_process_fork"),
        true,
    ),
    // Device transmit and the qdisc.
    required(
        "on_net_dev_queue",
        "net_dev_queue",
        &[effect(&[p::XLAP_POINT_DEV_QUEUE], false, Without::Missing)],
    ),
    optional(
        "on_qdisc_enqueue",
        "qdisc_enqueue",
        &[effect(&[p::XLAP_POINT_QDISC_ENQUEUE], true, Without::Missing)],
    ),
    optional(
        "on_qdisc_dequeue",
        "qdisc_dequeue",
        &[effect(&[p::XLAP_POINT_QDISC_DEQUEUE], true, Without::Missing)],
    ),
    optional(
        "on_net_dev_start_xmit",
        "net_dev_start_xmit",
        &[effect(&[p::XLAP_POINT_DEV_START_XMIT], true, Without::Missing)],
    ),
    optional(
        "on_net_dev_xmit",
        "net_dev_xmit",
        &[effect(&[p::XLAP_POINT_DEV_XMIT], false, Without::Missing)],
    ),
    // The transmit slots of freed skbs (no stamp of their own).
    helper("on_kfree_skb", Attach::TpBtf("kfree_skb"), false),
    helper("on_consume_skb", Attach::TpBtf("consume_skb"), false),
    // Driver hand-off on receive.
    optional(
        "on_netif_rx",
        "netif_rx",
        &[effect(&[p::XLAP_POINT_DEV_NETIF_RX], true, Without::Missing)],
    ),
    optional(
        "on_napi_gro_receive_entry",
        "napi_gro_receive_entry",
        &[effect(
            &[p::XLAP_POINT_DEV_GRO_RECEIVE],
            true,
            Without::OneOf("skbs built by napi_gro_receive are not stamped"),
        )],
    ),
    optional(
        "on_napi_gro_frags_entry",
        "napi_gro_frags_entry",
        &[effect(
            &[p::XLAP_POINT_DEV_GRO_RECEIVE],
            true,
            Without::OneOf("skbs built by napi_gro_frags are not stamped"),
        )],
    ),
    optional(
        "on_netif_receive_skb",
        "netif_receive_skb",
        &[effect(&[p::XLAP_POINT_DEV_RECEIVE_SKB], true, Without::Missing)],
    ),
    // The datagram handed to its socket.
    Hook {
        program: SOCK_INGRESS,
        attach: Attach::Cgroup("cgroup_skb/ingress"),
        required: false,
        min_kernel: Some(DYNPTR_TRACING_KERNEL),
        boundary: None,
        effects: &[
            // The socket queue point is also what tells the wake-up which
            // datagram woke the reader (RX_LAST in bpf/hooks/sched.h).
            effect(
                &[
                    p::XLAP_POINT_SOCK_QUEUE,
                    p::XLAP_POINT_SCHED_WAKEUP,
                    p::XLAP_POINT_SCHED_SWITCH_IN,
                ],
                false,
                Without::Missing,
            ),
            // It also marks datagrams to untraced sockets on a traced
            // port, whose device stamps (taken by port, before any socket
            // is known) the recorder then drops.
            effect(
                &[
                    p::XLAP_POINT_DEV_NETIF_RX,
                    p::XLAP_POINT_DEV_GRO_RECEIVE,
                    p::XLAP_POINT_DEV_RECEIVE_SKB,
                ],
                false,
                Without::Weakened(
                    "stamps of datagrams to untraced sockets sharing a traced port are kept",
                ),
            ),
            // And it notes the flow of what a socket receives, which its
            // reads take (bpf/hooks/sock_rx.h, note_flow).
            effect(
                &[p::XLAP_POINT_SOCK_RECV_EXIT],
                false,
                Without::Weakened("reads carry no flow (no addresses or ports)"),
            ),
        ],
    },
    // The reader's wake-up (the switch-in stamp needs the wake-up's
    // record).
    optional(
        "on_sched_waking",
        "sched_waking",
        &[effect(&[p::XLAP_POINT_SCHED_WAKEUP, p::XLAP_POINT_SCHED_SWITCH_IN], true, Without::Missing)],
    ),
    optional(
        "on_sched_switch",
        "sched_switch",
        &[effect(&[p::XLAP_POINT_SCHED_SWITCH_IN], true, Without::Missing)],
    ),
    // Application markers, and the processes held for them.
    helper(USDT, Attach::Uprobe, false),
    helper(
        "on_sched_process_exec",
        Attach::TpBtfForHolds("sched_process_exec"),
        false,
    ),
    helper(LOADER_HOOK, Attach::Uprobe, false),
    // The per-CPU batches exported on a timer.
    helper(crate::batch_export::PROGRAM, Attach::Timer, false),
    // Not a program: the kfunc the skb-reading programs call for bytes in
    // page fragments (`kfunc.rs`). The send points take the device's
    // reading of the datagrams a call sent.
    Hook {
        program: SKB_DYNPTR,
        attach: Attach::Kfunc,
        required: false,
        min_kernel: Some(DYNPTR_TRACING_KERNEL),
        boundary: None,
        effects: &[effect(
            &[
                p::XLAP_POINT_SOCK_SEND_ENTER,
                p::XLAP_POINT_SOCK_SEND_EXIT,
                p::XLAP_POINT_DEV_QUEUE,
                p::XLAP_POINT_QDISC_ENQUEUE,
                p::XLAP_POINT_QDISC_DEQUEUE,
                p::XLAP_POINT_DEV_START_XMIT,
                p::XLAP_POINT_DEV_XMIT,
                p::XLAP_POINT_DEV_NETIF_RX,
                p::XLAP_POINT_DEV_GRO_RECEIVE,
                p::XLAP_POINT_DEV_RECEIVE_SKB,
            ],
            false,
            Without::Degraded(
                "datagrams in page fragments (GSO and GRO skbs, zero-copy sends, NIC drivers) are not stamped but counted lost ('frag') at every point",
            ),
        )],
    },
];

/// A part of an optional hook's job: what a run can lack.
#[derive(Clone, Copy, Debug)]
pub struct ProgramPoints {
    pub program: &'static str,
    pub points: &'static [u32],
    pub stamp_only: bool,
    pub without: Without,
    pub min_kernel: Option<(u32, u32)>,
}

impl ProgramPoints {
    /// What a run without it loses ("" for missing points: the points).
    pub fn what(&self) -> &'static str {
        match self.without {
            Without::Missing => "",
            Without::Degraded(what) | Without::OneOf(what) | Without::Weakened(what) => what,
        }
    }
}

/// Every part of every optional hook's job (the required ones fail the
/// run when they do not attach, so a run never lacks them).
pub fn program_points() -> impl Iterator<Item = ProgramPoints> {
    HOOKS.iter().filter(|h| !h.required).flat_map(|h| {
        h.effects.iter().map(move |e| ProgramPoints {
            program: h.program,
            points: e.points,
            stamp_only: e.stamp_only,
            without: e.without,
            min_kernel: h.min_kernel,
        })
    })
}

/// The tracepoints attached when the capture loads with `boundary`:
/// (program, tracepoint, required).
pub fn tracepoints(boundary: Boundary) -> impl Iterator<Item = (&'static str, &'static str, bool)> {
    HOOKS.iter().filter_map(move |h| match h.attach {
        Attach::TpBtf(tp) if h.boundary.is_none_or(|b| b == boundary) => {
            Some((h.program, tp, h.required))
        }
        _ => None,
    })
}

/// The connect hooks of `--boundary auto` (program, section).
pub fn auto_cgroup_hooks() -> impl Iterator<Item = (&'static str, &'static str)> {
    HOOKS.iter().filter_map(|h| match h.attach {
        Attach::CgroupForAuto(section) => Some((h.program, section)),
        _ => None,
    })
}

/// The tracepoints of `--boundary auto` that hold a connect (program,
/// tracepoint).
pub fn auto_tracepoints() -> impl Iterator<Item = (&'static str, &'static str)> {
    HOOKS.iter().filter_map(|h| match h.attach {
        Attach::TpBtfForAuto(tp) => Some((h.program, tp)),
        _ => None,
    })
}

/// The cgroup hooks attached when the capture loads with `boundary` (the
/// connect hooks of `--boundary auto` come later, `auto_cgroup_hooks`):
/// (hook, section), in the table's order.
pub fn cgroup_hooks(boundary: Boundary) -> impl Iterator<Item = (&'static Hook, &'static str)> {
    HOOKS.iter().filter_map(move |h| match h.attach {
        Attach::Cgroup(section) if h.boundary.is_none_or(|b| b == boundary) => Some((h, section)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SEC("...")` followed by the program it places, from a C source.
    fn sections(c: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut lines = c.lines();
        while let Some(line) = lines.next() {
            let Some(rest) = line.trim().strip_prefix("SEC(\"") else {
                continue;
            };
            let section = rest.split('"').next().unwrap_or_default().to_string();
            if section == ".maps" || section == "license" || !line.trim().ends_with(')') {
                continue;
            }
            let Some(decl) = lines.next() else { break };
            // `int BPF_PROG(name, ...` or `int name(...`.
            let decl = decl.trim().trim_start_matches("int ");
            let decl = decl.strip_prefix("BPF_PROG(").unwrap_or(decl);
            let name: String = decl
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push((name, section));
        }
        out
    }

    #[test]
    fn the_table_names_every_program_of_the_c_sources_with_its_section() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bpf/hooks");
        let mut in_c = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            in_c.extend(sections(&std::fs::read_to_string(&path).unwrap()));
        }
        in_c.sort();
        let mut in_table: Vec<(String, String)> = HOOKS
            .iter()
            .filter_map(|h| Some((h.program.to_string(), h.attach.section()?)))
            .collect();
        in_table.sort();
        assert_eq!(in_table, in_c, "hooks.rs vs the SEC() lines of bpf/hooks/");
    }

    #[test]
    fn each_program_is_in_the_table_once() {
        let mut names: Vec<&str> = HOOKS.iter().map(|h| h.program).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before);
    }

    /// A stamp-only hook is left out with its points; one that is required
    /// when wanted belongs to a boundary, whose BPF side is told from the
    /// point set whether it runs (`sock_send_length`: `CFG.send_calls`), so
    /// the run must fail rather than go on without it.
    #[test]
    fn stamp_only_hooks_are_optional_or_of_a_boundary() {
        let points = crate::point_sets::PointSet::parse("minimal").unwrap();
        for h in HOOKS {
            if h.effects.iter().any(|e| e.stamp_only) && h.required {
                assert!(
                    h.boundary.is_some(),
                    "{} is stamp-only and required everywhere",
                    h.program
                );
                assert!(
                    !points.needs_program(h.program),
                    "{} is left out with its points",
                    h.program
                );
            }
        }
    }
}
