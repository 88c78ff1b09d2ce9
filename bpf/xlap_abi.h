/* xlap_abi.h: the one definition of everything that crosses the BPF/user
 * boundary. The BPF programs include it; userspace/xlap-abi generates its
 * Rust types from it with bindgen at build time, so the layouts cannot drift.
 */
#ifndef XLAP_ABI_H
#define XLAP_ABI_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* Kernel stamp points. Names (`layer.point`) live in xlap-records; app (USDT)
 * points are XLAP_POINT_APP_BASE + the marker's attach index. */
enum xlap_point {
  XLAP_POINT_NONE = 0,
  XLAP_POINT_SOCK_SEND_ENTER = 1,  /* raw_tp sys_enter: sendto/sendmsg/... */
  XLAP_POINT_SOCK_SEND_EXIT = 2,   /* raw_tp sys_exit of the same call */
  XLAP_POINT_DEV_QUEUE = 3,        /* net:net_dev_queue */
  XLAP_POINT_QDISC_ENQUEUE = 4,    /* qdisc:qdisc_enqueue */
  XLAP_POINT_QDISC_DEQUEUE = 5,    /* qdisc:qdisc_dequeue */
  XLAP_POINT_DEV_START_XMIT = 6,   /* net:net_dev_start_xmit (driver entry) */
  XLAP_POINT_DEV_XMIT = 7,         /* net:net_dev_xmit (driver return) */
  XLAP_POINT_DEV_NETIF_RX = 8,     /* net:netif_rx */
  XLAP_POINT_DEV_GRO_RECEIVE = 9,  /* net:napi_gro_{receive,frags}_entry */
  XLAP_POINT_DEV_RECEIVE_SKB = 10, /* net:netif_receive_skb */
  XLAP_POINT_SOCK_QUEUE = 11,      /* handed to the socket (cgroup ingress) */
  XLAP_POINT_SCHED_WAKEUP = 12,    /* sched:sched_wakeup of the reader */
  XLAP_POINT_SCHED_SWITCH_IN = 13, /* sched:sched_switch to the reader */
  /* A flow of a traced port whose datagrams reach a socket we do not
   * trace (an SO_REUSEPORT group, a more specific bind on the same port):
   * a marker (flow only, sent when a CPU sees the flow change), never
   * written out; the recorder drops that flow's receive-device stamps,
   * which were taken before any socket was known. */
  XLAP_POINT_SOCK_FOREIGN = 14,
  XLAP_POINT_SOCK_RECV_EXIT = 15, /* raw_tp sys_exit: recvfrom/recvmsg/... */
  /* Device (NIC) hardware timestamps are not points of their own: they ride
   * in hw_ts_ns of the dev.* stamps (XLAP_FLAG_HW_TS). */
  XLAP_POINT_KERNEL_COUNT = 16,
  XLAP_POINT_APP_BASE = 256,
};

/* Why a stamp was not recorded; counted per point (per datagram), never
 * silent. */
enum xlap_loss {
  XLAP_LOSS_RINGBUF_FULL = 0, /* bpf_ringbuf_reserve failed */
  XLAP_LOSS_MAP_FULL = 1,     /* a per-packet or per-thread map had no room */
  XLAP_LOSS_PARSE = 2,        /* seq/kind beyond the datagram */
  XLAP_LOSS_UNMATCHED = 3,    /* fired for a traced packet, identity unknown */
  XLAP_LOSS_GSO = 4,  /* datagram of a GSO/GRO skb beyond XLAP_MAX_SEGS */
  XLAP_LOSS_FRAG = 5, /* payload not readable (page fragments on a kernel
                       * without skb dynptrs), or an IP fragment whose first
                       * fragment was not seen */
  XLAP_LOSS_COUNT = 6,
};

/* Stamp flags. */
#define XLAP_FLAG_SEQ_VALID 0x1 /* seq and kind were read */
#define XLAP_FLAG_FROM_USER 0x2 /* read from the syscall's user buffer */
#define XLAP_FLAG_HW_TS 0x4     /* hw_ts_ns holds a device timestamp */
#define XLAP_FLAG_FRAGMENT 0x8  /* a later IP fragment of the datagram */
#define XLAP_FLAG_KIND 0x10     /* the datagram's layout has a kind field */

/* Datagrams one skb (a GSO or GRO super-packet) or one syscall can carry
 * that get stamps of their own; the rest are counted as XLAP_LOSS_GSO. The
 * kernel's own limit is UDP_MAX_SEGMENTS (128 since 6.9, 64 before). */
#define XLAP_MAX_SEGS 64

/* UDP ports that carry tunnels (VXLAN, Geneve, ...) in xlap_config. */
#define XLAP_TUNNEL_PORTS 4

/* bpf_dynptr_from_skb is a kfunc, which aya 0.14 cannot relocate: the BPF
 * side emits the call with this placeholder BTF id, the loader patches in
 * the running kernel's id (or, where the kfunc is missing, a constant
 * failure). The full instruction is 85 20 00 00 <imm, little endian>. */
#define XLAP_KFUNC_DYNPTR_FROM_SKB 0x7eadbeef

/* One stamp. A ring-buffer record holds one or more of them back to back
 * (a batch, see struct xlap_batch): its length is a multiple of the stamp
 * size. */
struct xlap_stamp {
  __u64 ts_ns;    /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
  __u64 flow;     /* the datagram's addresses and ports (XLAP_FLOW_*) */
  __u64 seq;      /* the protocol's sequence number */
  __u64 hw_ts_ns; /* device timestamp (skb hwtstamps), 0 if none */
  __u32 pid;      /* owning process (tgid) of the socket */
  __u32 tid;      /* thread that ran the point (0 in softirq) */
  __u32 len;      /* bytes: datagram/skb length */
  __u32 ifindex;  /* device, 0 where none */
  __u16 point;    /* enum xlap_point */
  __u16 cpu;
  __u16 queue; /* TX/RX queue where known */
  __u8 flags;  /* XLAP_FLAG_* */
  __u8 _pad;
  __u32 kind;     /* the protocol's packet kind, full width (XLAP_FLAG_KIND) */
  __u32 priority; /* skb->priority at transmit device points (the class an
                   * htb/prio qdisc reads from SO_PRIORITY), else 0 */
  /* Where the point ran, for container attribution: the cgroup v2 id of
   * the process at the points taken in a process's name (system and
   * socket calls, markers, the woken reader's sched points), the inode of
   * the device's network namespace at the device and qdisc points, 0 at
   * the socket queue and where unknown. Which one a point carries is the
   * point vocabulary's (xlap-records points.rs). */
  __u64 scope;
};

/* The instants (CLOCK_MONOTONIC ns) a run's stamps lie between, written by
 * the recorder while the programs run: a stamp taken before `from_ns` or
 * after `until_ns` is not made, whichever point takes it and whenever it
 * is emitted. The run's end is then one instant for every point, not the
 * order in which the hooks happen to be detached. */
struct xlap_stamp_window {
  __u64 from_ns;
  __u64 until_ns;
};

/* xlap_stamp.flow: the source address folded to 16 bits (bits 63..48),
 * the destination address folded (47..32), the source port (31..16) and
 * the destination port (15..0), ports in host order. An address folds as
 * the XOR of its 32-bit words as they lie in the header, then of the two
 * halves of that. The same datagram has the same flow at every point, on
 * both hosts. On the receive side the local half is the destination. */
#define XLAP_FLOW_LOCAL_MASK 0x0000ffff0000ffffULL

/* Where a protocol keeps seq and kind in the UDP payload. */
struct xlap_layout {
  __u32 seq_offset;
  __u32 kind_offset;
  __u32 kind_mask; /* bits of the kind field kept (RTP: 0x7f), 0 = all */
  __u8 seq_size;   /* 1, 2, 4 or 8 */
  __u8 kind_size;  /* 0 (none), 1, 2 or 4 */
  __u8 big_endian; /* byte order of both fields */
  __u8 _pad;
  /* layouts[1..]: the UDP port whose datagrams (either port) use it, 0 =
   * unused; layouts[0], the default, has 0. */
  __u16 port;
  __u16 _pad1;
};

/* Layouts of one run: the default and up to three per port. */
#define XLAP_LAYOUTS 4
/* Bytes of payload read for seq and kind: the fields of every layout lie
 * within this window (from xlap_config.win_start). */
#define XLAP_WINDOW 64

/* Settings, set by userspace in .rodata before load. */
struct xlap_config {
  struct xlap_layout layouts[XLAP_LAYOUTS];
  /* Payload offset of the window every layout's fields lie in, and the
   * bytes of it that hold fields (<= XLAP_WINDOW). */
  __u32 win_start;
  __u32 win_len;
  __u8 per_stamp; /* 1: one ring-buffer record per stamp (no batching) */
  /* 1: the send/receive boundary is stamped at the syscalls (sys_enter,
   * sys_exit: every task of the machine then takes the slow syscall path;
   * the default); 0: at the socket calls (hooks/calls.h), which cost
   * nothing elsewhere. */
  __u8 syscall_hooks;
  /* 1: the socket-queue point is attached: netif_receive_skb notes what it
   * read of each datagram for it (bpf/lib/rx_slots.h). */
  __u8 rx_notes;
  /* 1: sock_send_length is attached (at the socket calls, with
   * sock.send_exit): it ends each send call's state. 0: a send has no
   * call state, and its first device point stamps sock.send_enter
   * (bpf/hooks/dev_tx.h). */
  __u8 send_calls;
  /* Wake the reader only once this many bytes wait in the ring buffer: a
   * wake-up per record costs microseconds (an IPI, a VM exit under KVM);
   * the reader also polls on a short timeout. */
  __u32 wakeup_bytes;
  /* 1: the kernel lets tracing programs read skbs through dynptrs (page
   * fragments included); 0: only the linear area is read. */
  __u8 have_dynptr;
  /* 1: device and qdisc points only fire on the devices in IFACES. */
  __u8 iface_filter;
  /* 1: some device of the targets can timestamp received packets in
   * hardware: the receive device points read every skb's device time
   * (skb_shared_info); 0: only a paged skb's, for its GRO segment size. */
  __u8 device_rx_times;
  /* 1: every hook on a datagram's path returns at once (--empty-programs):
   * the run attaches the same hooks and stamps nothing, which measures
   * what their dispatch alone costs the traced protocol. */
  __u8 empty_programs;
  /* 1: the kernel has no sock_recv_length tracepoint (Linux < 6.3): a
   * receive syscall finds its socket at exit from its file descriptor
   * (hooks/syscall.h, recv_sock_by_fd) and stamps it when the socket's
   * port is a traced one. */
  __u8 recv_by_fd;
  __u16 tunnel_ports[XLAP_TUNNEL_PORTS]; /* host order, 0 = unused */
  /* Kernel points not written (bit = point id; --points): 0 writes all. */
  __u32 points_off;
  /* --sample 1/N: a datagram is stamped when XLAP_SAMPLE_HASH(seq) <
   * sample_below (2^32 / N); 0 stamps every datagram. */
  __u32 sample_below;
  /* --sample-kinds: bit k set = datagrams of kind k are sampled, the
   * others all stamped; 0 = every kind is sampled. */
  __u64 sample_kinds;
  /* 1: --boundary auto, at the socket calls: a send's sock.send_enter is
   * the start cgroup sendmsg4/6 noted (a send naming its destination),
   * else the entry of its send syscall, noted by on_send_syscall once the
   * recorder attached it (a traced UDP socket is connected); a send with
   * neither is counted lost (unmatched). */
  __u8 send_syscalls;
  /* 1: a traced process that connects a UDP socket while on_send_syscall
   * is not attached is held (SIGSTOP) until the recorder attached it and
   * resumed it; 0: the recorder attached it from the start. */
  __u8 hold_connect;
  __u8 _pad_end[6];
};

/* The sample a datagram belongs to, from its seq alone (Fibonacci hashing:
 * consecutive seqs spread evenly over the range), so that recorders on two
 * hosts keep the same datagrams without talking to each other. The
 * recorder computes the same (xlap_records::sample) for the markers it
 * reads from shared memory. */
#define XLAP_SAMPLE_HASH_MUL 0x9E3779B97F4A7C15ULL
#define XLAP_SAMPLE_HASH(seq)                                                  \
  ((__u32)(((__u64)(seq)*XLAP_SAMPLE_HASH_MUL) >> 32))

/* Value of the traced-socket storage (socket local storage): the socket
 * belongs to a traced process. */
struct xlap_sock {
  __u32 tgid; /* the process that created it (or held it at attach) */
  __u16 port; /* local port registered in TARGET_PORTS, 0 none yet */
  __u8 flows; /* XLAP_SOCK_* of the datagrams queued to it */
  __u8 _pad;
  __u64 flow;   /* flow of the last datagram queued to it */
  __u64 cookie; /* the socket's cookie (SO_COOKIE), 0 if unknown */
  /* The socket-call boundary (bpf/hooks/calls.h): the skb the next read
   * takes, as the last read left the queue (its head), or, when it left it
   * empty, the first datagram queued since (0: not known). */
  __u64 rx_next;
  __u64 rx_first;
  __u64 rx_last;  /* the datagram queued last */
  __u64 rx_last2; /* and the one before it */
  /* The start of the last send on it that named its destination (cgroup
   * sendmsg4/6): when, and by which thread (0: taken); beside the per-CPU
   * note (task.h SEND_START), for a thread moved to another CPU inside the
   * send. `send_moved_*`: the last start taken here that the CPU where it
   * began still notes (task.h send_start_of). */
  __u64 send_start_ts;
  __u64 send_moved_ts;
  __u32 send_start_tid;
  __u32 send_moved_tid;
};

/* The addresses behind a flow (value of the FLOWS map, keyed by the
 * flow): noted the first time a CPU sees the flow at the first transmit
 * device point or at the socket queue of a traced socket. Flows folded
 * from different addresses collide: then `collided` is set and the
 * addresses are those seen first. */
struct xlap_flow_tuple {
  __u8 saddr[16]; /* network order; IPv4: the first 4 bytes */
  __u8 daddr[16];
  __u64 tx_cookie; /* cookie of the traced socket that sent it, 0 none */
  __u64 rx_cookie; /* cookie of the traced socket that received it */
  __u32 addr_sig;  /* a hash of both addresses (collision check) */
  __u8 family;     /* 4 or 6 */
  __u8 collided;
  __u8 _pad[2];
};

/* xlap_sock.flows: datagrams of more than one flow were queued (an
 * unconnected server); of more than one local address and port. A
 * receive's flow is the socket's while neither is set, is completed from
 * the sender address the call returns while only the first is. */
#define XLAP_SOCK_MULTI_FLOW 0x1
#define XLAP_SOCK_MULTI_LOCAL 0x2

/* A device the user restricted device and qdisc points to (--iface). */
struct xlap_iface_key {
  __u32 netns;   /* inode number of the network namespace */
  __u32 ifindex; /* device index in that namespace */
};

/* Stamps waiting on one CPU to be exported together: one ring-buffer record
 * (bpf_ringbuf_output of stamps[0..n]) carries up to XLAP_BATCH_STAMPS of
 * them, which amortises the record's cost (reserve, commit, the reader's
 * work) over the batch. A batch is exported when it is full, when its oldest
 * stamp is older than XLAP_BATCH_MAX_AGE_NS at the next stamp, when the
 * CPU goes idle, and every XLAP_FLUSH_INTERVAL_MS (a timer in userspace); what
 * is left when tracing stops is read from the map by userspace. `depth` guards
 * against nesting: a program that interrupts (or preempts) another one in the
 * middle of an append finds depth > 0 and writes its stamp as a record of its
 * own. If a batch cannot be exported, each of its stamps is counted as lost at
 * its own point. */
/* 64, not 32: the record's fixed cost (ring lock, header, wake-up check)
 * was ~11 ns per stamp at 32 on the pinned ping-pong (issue 56). A power of
 * two: the append masks its index with it. */
#define XLAP_BATCH_STAMPS 64
#define XLAP_BATCH_MAX_AGE_NS 2000000ULL
/* Userspace also exports every CPU's batch this often (bpf/hooks/flush.h),
 * so a batch never waits longer for the reader, whatever the CPU does. */
#define XLAP_FLUSH_INTERVAL_MS 100

struct xlap_batch {
  __u32 n;     /* stamps waiting in stamps[] */
  __u32 depth; /* programs inside an append on this CPU */
  __u64 oldest_ns;
  struct xlap_stamp stamps[XLAP_BATCH_STAMPS];
};

/* Key of the traced-socket table: a UDP port in a network namespace (ports
 * repeat across namespaces, e.g. the same protocol on two stages). */
struct xlap_port_key {
  __u32 netns; /* inode number of the network namespace */
  __u16 port;  /* local UDP port, host order */
  __u16 _pad;
};

/* A cgroup whose processes are traced, present and future (record
 * --cgroup/--container): its cgroup v2 id (the directory's inode number)
 * and its depth below the cgroup2 root (the root is 0), so a task is in it
 * or below it when its ancestor at that level has that id. Slots from the
 * first with id 0 on are unused. */
#define XLAP_MAX_TARGET_CGROUPS 8

struct xlap_target_cgroup {
  __u64 id;
  __u32 level;
  __u32 _pad;
};

/* TARGET_PIDS' value for a process traced because it is in a target
 * cgroup (it descends from no target pid; tgid 0 is never a process). */
#define XLAP_ROOT_CGROUP 0

/* ---- USDT markers -------------------------------------------------------
 * One spec per attached probe site, indexed by the uprobe's BPF cookie. The
 * layout is ours (not libbpf's usdt.bpf.h, which differs between versions and
 * does not load under aya). */
#define XLAP_USDT_MAX_SPECS 1024
#define XLAP_USDT_NO_REG 0xffff

enum xlap_arg_kind {
  XLAP_ARG_NONE = 0,
  XLAP_ARG_CONST = 1,  /* value */
  XLAP_ARG_REG = 2,    /* register at reg_off in struct pt_regs */
  XLAP_ARG_MEM = 3,    /* [reg + idx * scale + value] in user memory */
  XLAP_ARG_GLOBAL = 4, /* [value + load bias]: value is a link-time address */
};

struct xlap_usdt_arg {
  __s64 value;       /* constant, memory displacement or global address */
  __u16 reg_off;     /* pt_regs offset of the (base) register */
  __u16 idx_reg_off; /* pt_regs offset of the index, or XLAP_USDT_NO_REG */
  __u8 kind;         /* enum xlap_arg_kind */
  __u8 size;         /* 1, 2, 4 or 8 bytes */
  __u8 is_signed;
  __u8 scale; /* 1, 2, 4 or 8 */
};

struct xlap_usdt_spec {
  struct xlap_usdt_arg seq;
  struct xlap_usdt_arg kind; /* kind == XLAP_ARG_NONE: no kind argument */
  __u64 probe_addr;          /* link-time address of the probe's nop */
  __u16 point;               /* XLAP_POINT_APP_BASE + app point index */
  __u8 _pad[6];
};

/* ---- Holds ----------------------------------------------------------------
 * A traced process whose mappings changed (it exec'd a program, or the
 * dynamic loader mapped libraries: at start-up or by dlopen) is stopped
 * (SIGSTOP) before it runs any code of them; userspace reads one of these
 * from the HOLDS ring buffer, attaches the markers the new mappings have,
 * then resumes it (SIGCONT). */
enum xlap_hold_why {
  XLAP_HOLD_EXEC = 1,    /* sched_process_exec */
  XLAP_HOLD_LOADER = 2,  /* the loader's debugger hook (_dl_debug_state) */
  XLAP_HOLD_CONNECT = 3, /* a traced UDP socket's connect (--boundary auto:
                            the CONNECTS ring, bpf/hooks/calls.h) */
};

struct xlap_hold {
  __u64 ts_ns; /* CLOCK_MONOTONIC when held */
  __u32 pid;   /* the process (tgid) */
  __u32 why;   /* enum xlap_hold_why */
  __s32 stop;  /* bpf_send_signal's result: 0 = stopped */
  __u32 _pad;
};

/* Code the recorder has read and found without a traced marker (the
 * KNOWN_CODE map): a process whose new code is all such files is not held.
 * The identity is the kernel's (the superblock's dev_t, MAJOR << 20 |
 * MINOR, as /proc/PID/maps prints it, and the inode number); the version is
 * the inode's ctime, which a file's owner cannot set back: a file written
 * since it was read is not known. */
struct xlap_code_key {
  __u32 dev;
  __u32 _pad;
  __u64 ino;
};

struct xlap_code_version {
  __s64 ctime_sec;
  __u32 ctime_nsec;
  __u32 _pad;
};

/* Entries of the per-CPU HOLD_SKIPS counters: events of traced processes
 * not held, as everything they mapped was known code. */
enum xlap_hold_skip {
  XLAP_SKIP_EXEC = 0,
  XLAP_SKIP_LOADER = 1,
  XLAP_SKIP_COUNT = 2,
};

/* Objects the loader hook walks in the loader's list (glibc's r_debug
 * link_map) before it holds the process without looking further. */
#define XLAP_LOADER_MAX_OBJECTS 512

#endif
