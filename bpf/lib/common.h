/* common.h: what every hook family of the capture shares: the settings,
 * the maps that carry identity between points, and the stamp path (per-CPU
 * batches into one ring buffer, losses counted per point). */
#ifndef XLAP_CAPTURE_COMMON_H
#define XLAP_CAPTURE_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "xlap_abi.h"

/* Set by userspace before load. */
const volatile struct xlap_config CFG = {};

/* Set by userspace while the programs run (its own section: a map of its
 * own, written whole without touching the other globals). Until the
 * recorder opens it, every instant is inside. */
struct xlap_stamp_window STAMP_WINDOW SEC(".data.window") = {.from_ns = 0,
                                                             .until_ns = ~0ULL};

#define AF_INET_ 2
#define AF_INET6_ 10
#define IPPROTO_UDP_ 17
#define LOSS_ROWS (XLAP_POINT_KERNEL_COUNT + 1) /* last row: app points */

/* Identity of one datagram. */
struct xl_ident {
  __u64 seq;
  __u64 flow;
  __u32 pid;
  __u32 len;
  __u32 kind;
  __u8 flags; /* XLAP_FLAG_* of the stamp */
  __u8 _pad[3];
};

/* The seq and kind of every datagram of a multi-datagram skb (GSO/GRO) or
 * syscall, datagram 0 first. */
struct xl_segs {
  __u64 seq[XLAP_MAX_SEGS];
  __u32 kind[XLAP_MAX_SEGS];
};

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 22); /* overridden by userspace */
} STAMPS SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xlap_batch);
} BATCH SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32); /* tgid */
  __type(value, __u32);
} TARGET_PIDS SEC(".maps");

/* The target cgroups (struct xlap_target_cgroup), set by userspace before
 * attaching; looked up only at rare events (socket creation, fork, exec),
 * never on a datagram's path. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, XLAP_MAX_TARGET_CGROUPS);
  __type(key, __u32);
  __type(value, struct xlap_target_cgroup);
} TARGET_CGROUPS SEC(".maps");

/* Slot i of TARGET_CGROUPS: 1 when the current task is in that cgroup or
 * below it, 0 when not, -1 when the slot is unused (the list's end). */
static __always_inline int target_cgroup_slot(__u32 i) {
  struct xlap_target_cgroup *c = bpf_map_lookup_elem(&TARGET_CGROUPS, &i);
  if (!c || !c->id)
    return -1;
  return bpf_get_current_ancestor_cgroup_id(c->level) == c->id;
}

/* Whether the current task is in a target cgroup or below one: a process
 * moved in after the run began (cgroup.procs, as docker exec or
 * systemd-run --scope do) is traced from its next socket, fork or exec.
 * Written out slot by slot: as a loop, the verifier lost the index's
 * bounds through the map key and called the loop infinite, and clang
 * would not unroll it. */
_Static_assert(XLAP_MAX_TARGET_CGROUPS == 8, "one line per slot below");
#define XL_TRY_SLOT(i)                                                         \
  if ((r = target_cgroup_slot(i)) != 0)                                        \
    return r > 0;
static __always_inline int in_target_cgroup(void) {
  int r;
  XL_TRY_SLOT(0)
  XL_TRY_SLOT(1)
  XL_TRY_SLOT(2)
  XL_TRY_SLOT(3)
  XL_TRY_SLOT(4)
  XL_TRY_SLOT(5)
  XL_TRY_SLOT(6)
  XL_TRY_SLOT(7)
  return 0;
}
#undef XL_TRY_SLOT

/* Traces process `tgid` (the current task's, or its child's) as a member of
 * a target cgroup; userspace learns of it from TARGET_PIDS. */
static __always_inline void adopt(__u32 tgid) {
  __u32 root = XLAP_ROOT_CGROUP;
  bpf_map_update_elem(&TARGET_PIDS, &tgid, &root, BPF_NOEXIST);
}

/* UDP ports of traced sockets per network namespace: the receive path's
 * device points run before the socket is known and decide by port. Set
 * when a traced socket's bind succeeds (cgroup post_bind), when one is
 * autobound (its first datagram out), and by userspace for the sockets
 * the targets held at attach. A datagram for the port that reaches
 * another socket is marked at the socket (XLAP_POINT_SOCK_FOREIGN). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 16384);
  __type(key, struct xlap_port_key);
  __type(value, __u32); /* owning tgid */
} TARGET_PORTS SEC(".maps");

/* The ports in TARGET_PORTS, whatever the namespace (1 = some traced
 * socket has or had it; set before TARGET_PORTS): the socket-ingress hook,
 * which cannot tell the namespace, looks here before marking a datagram
 * foreign, and the device points before their hash lookup. An array
 * lookup: no cost worth counting for other traffic. */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 65536);
  __type(key, __u32);
  __type(value, __u8);
} PORTS_ANY SEC(".maps");

/* The traced sockets themselves: socket local storage, set by userspace for
 * the sockets a target already has and by sockets.h for those it creates.
 * Every point that knows its socket decides by it, not by port. */
struct {
  __uint(type, BPF_MAP_TYPE_SK_STORAGE);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, int);
  __type(value, struct xlap_sock);
} SOCKS SEC(".maps");

/* Devices device and qdisc points are restricted to (CFG.iface_filter). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 256);
  __type(key, struct xlap_iface_key);
  __type(value, __u8);
} IFACES SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, LOSS_ROWS *XLAP_LOSS_COUNT);
  __type(key, __u32);
  __type(value, __u64);
} LOSSES SEC(".maps");

static __always_inline void count_losses(__u32 point, __u32 reason, __u64 n) {
  __u32 row = point < XLAP_POINT_KERNEL_COUNT ? point : XLAP_POINT_KERNEL_COUNT;
  __u32 idx = row * XLAP_LOSS_COUNT + reason;
  __u64 *v = bpf_map_lookup_elem(&LOSSES, &idx);
  if (v)
    *v += n;
}

static __always_inline void count_loss(__u32 point, __u32 reason) {
  count_losses(point, reason, 1);
}

/* The low 32 bits of an skb's address as a number to hash. The verifier
 * refuses arithmetic on a pointer, but a 32-bit move of one gives a plain
 * unknown number to a tracer allowed to see addresses (CAP_PERFMON): the
 * move is written out as its instruction (w1 = w1), which clang would
 * otherwise fold away. */
static __always_inline __u32 addr_bits(__u64 p) {
  __u64 out;
  asm volatile("r1 = %[p]\n"
               ".byte 0xbc, 0x11, 0x00, 0x00\n"
               ".long 0\n"
               "%[out] = r1\n"
               : [out] "=r"(out)
               : [p] "r"(p)
               : "r1");
  return (__u32)out;
}

/* Slots of the skb -> identity tables (TX: dev_tx.h, RX: rx_slots.h). */
#define SKB_SLOTS 16384 /* a power of two */

/* The slot of skb `key` in those tables: skbs come from a slab of 256-byte
 * objects, and a multiplicative hash spreads their addresses over the
 * slots. */
static __always_inline __u32 skb_slot_index(__u64 key) {
  return ((addr_bits(key) * 0x9E3779B1U) >> 18) & (SKB_SLOTS - 1);
}

/* Flags of a receive call: MSG_PEEK leaves the datagram queued (the read
 * that takes it is stamped), MSG_ERRQUEUE reads no datagram. */
#define MSG_PEEK_ 0x2
#define MSG_ERRQUEUE_ 0x2000

/* A field of `size` (1..8) bytes at `off` of bytes already read (packet or
 * user memory), in the given byte order. The index is masked with `mask`
 * (the buffer's length - 1, a power of two), so that the verifier knows
 * every byte read lies in the buffer. */
static __always_inline __u64 field_at(const __u8 *b, __u32 off, __u32 mask,
                                      __u32 size, __u8 big_endian) {
  __u64 v = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    if (i >= size)
      break;
    __u64 byte = b[(off + i) & mask];
    if (big_endian)
      v = (v << 8) | byte;
    else
      v |= byte << (8 * i);
  }
  return v;
}

/* The traced-socket record of `sk`, if it is a socket of a traced process. */
static __always_inline struct xlap_sock *traced_sock(struct sock *sk) {
  if (!sk)
    return 0;
  return bpf_sk_storage_get(&SOCKS, sk, 0, 0);
}

/* Registers the local port of traced socket `s` (in network namespace
 * `netns`) for the receive path's device points, once per port change. */
static __always_inline void register_port(struct xlap_sock *s, __u32 netns,
                                          __u16 port) {
  if (!port || s->port == port)
    return;
  struct xlap_port_key k = {.netns = netns, .port = port};
  /* PORTS_ANY before TARGET_PORTS: the device points look there first. */
  __u32 p = port;
  __u8 one = 1;
  bpf_map_update_elem(&PORTS_ANY, &p, &one, BPF_ANY);
  /* A full table: tried again at the socket's next datagram out; the
   * recorder's /proc scan meets the same full table and reports the port
   * (run.json ports_not_traced). */
  if (bpf_map_update_elem(&TARGET_PORTS, &k, &s->tgid, BPF_ANY))
    return;
  s->port = port;
}

/* Whether device and qdisc points may fire on `dev` (--iface). */
static __always_inline int iface_allowed(struct net_device *dev) {
  if (!CFG.iface_filter)
    return 1;
  if (!dev)
    return 0;
  struct xlap_iface_key k = {.netns = dev->nd_net.net->ns.inum,
                             .ifindex = dev->ifindex};
  return bpf_map_lookup_elem(&IFACES, &k) != 0;
}

/* ---- the stamp path --------------------------------------------------- */

/* xlap_stamp.scope of a point taken in the name of task `p`: its cgroup v2
 * id (the cgroup directory's inode number), as bpf_get_current_cgroup_id()
 * gives it for the current task. For a task other than the current one
 * (the woken reader, the thread switched in). */
static __always_inline __u64 task_scope(struct task_struct *p) {
  /* Direct loads, not BPF_CORE_READ: `p` is a tracing argument (BTF), and
   * each load is an instruction the JIT guards, where BPF_CORE_READ makes
   * one probe-read helper call per pointer (four here). */
  struct css_set *cset = p->cgroups;
  if (!cset)
    return 0;
  struct cgroup *cg = cset->dfl_cgrp;
  if (!cg)
    return 0;
  struct kernfs_node *kn = cg->kn;
  return kn ? kn->id : 0;
}

/* xlap_stamp.scope at a device point: the inode number of the device's
 * network namespace (as `stat -L /proc/PID/ns/net` gives it). */
static __always_inline __u64 dev_scope(struct net_device *dev) {
  if (!dev)
    return 0;
  struct net *net = dev->nd_net.net;
  return net ? net->ns.inum : 0;
}

/* Where a stamp of several datagrams was taken: everything but the
 * datagrams' own seq and kind. The stamp's scope (xlap_stamp.scope) has no
 * room of its own: the stamp path's frames are at the 512-byte combined
 * stack limit of Linux 6.1/6.12 (build.rs checks it), so it rides in a
 * field the point has no use for: a receive device point's in rx_netns
 * (those points carry no priority), every other point's in scope (no
 * hardware timestamp there). fill() takes them apart. */
struct xl_at {
  __u64 ts;
  union {
    __u64 hw_ts; /* receive device points */
    __u64 scope; /* every other point: task_scope() or dev_scope() */
  };
  __u32 tid;
  __u32 ifindex;
  union {
    __u32 priority; /* transmit device points */
    __u32 rx_netns; /* receive device points: dev_scope() */
  };
  __u16 point;
  __u16 queue;
};

/* Whether a record of `bytes` wakes the reader: only when it carries the
 * waiting data across a multiple of CFG.wakeup_bytes. A wake-up is an
 * irq_work, a self-IPI: under KVM a VM exit of microseconds on the traced
 * protocol's CPU. Waking at every record past the threshold, as before,
 * sent one per batch until the reader had drained the buffer (1.2 % of the
 * pinned ping-pong's CPU). A step two CPUs cross at once may go without
 * one; the next step wakes the reader, and it polls every 20 ms anyway. */
static __always_inline __u64 wakeup_flag(__u64 bytes) {
  __u64 step = CFG.wakeup_bytes;
  if (!step)
    return BPF_RB_NO_WAKEUP;
  __u64 waiting = bpf_ringbuf_query(&STAMPS, BPF_RB_AVAIL_DATA);
  return waiting / step != (waiting + bytes) / step ? BPF_RB_FORCE_WAKEUP
                                                    : BPF_RB_NO_WAKEUP;
}

/* Whether `point` is a receive device point (the one kind of point whose
 * scope rides in xl_at.rx_netns). */
static __always_inline int rx_device_point(__u16 point) {
  return point >= XLAP_POINT_DEV_NETIF_RX &&
         point <= XLAP_POINT_DEV_RECEIVE_SKB;
}

static __always_inline void fill(struct xlap_stamp *s, const struct xl_at *at,
                                 __u64 ts, const struct xl_ident *id) {
  __u16 point = at->point;
  __u64 hw_ts = 0, scope = at->scope;
  __u32 priority = at->priority;
  if (rx_device_point(point)) {
    hw_ts = at->hw_ts;
    scope = at->rx_netns;
    priority = 0;
  }
  __u32 tid = at->tid, ifindex = at->ifindex;
  __u16 queue = at->queue;
  s->ts_ns = ts;
  s->flow = id->flow;
  s->seq = id->seq;
  s->hw_ts_ns = hw_ts;
  s->pid = id->pid;
  s->tid = tid;
  s->len = id->len;
  s->ifindex = ifindex;
  s->point = point;
  s->cpu = bpf_get_smp_processor_id();
  s->queue = queue;
  s->kind = id->kind;
  s->_pad = 0;
  s->priority = priority;
  s->scope = scope;
  s->flags = id->flags | (hw_ts ? XLAP_FLAG_HW_TS : 0);
}

/* Exports the stamps waiting in a batch as one record; if the ring buffer
 * has no room, every one of them is counted lost at its point. Only called
 * with b->depth held (or with interrupts off and depth 0). */
static __always_inline void flush(struct xlap_batch *b) {
  __u32 n = b->n;
  if (n == 0 || n > XLAP_BATCH_STAMPS) {
    b->n = 0;
    return;
  }
  __u64 bytes = n * sizeof(struct xlap_stamp);
  if (bpf_ringbuf_output(&STAMPS, b->stamps, bytes, wakeup_flag(bytes))) {
    for (__u32 i = 0; i < XLAP_BATCH_STAMPS; i++) {
      if (i >= n)
        break;
      count_loss(b->stamps[i].point, XLAP_LOSS_RINGBUF_FULL);
    }
  }
  b->n = 0;
}

/* Nesting guard of the per-CPU batch: programs on one CPU nest strictly
 * (an interrupt, or a preemption of a uprobe program, runs to completion
 * before the interrupted program goes on), so a plain increment that is
 * undone before returning is enough; only the outermost append uses the
 * batch. */
static __always_inline __u32 batch_enter(struct xlap_batch *b) {
  volatile __u32 *d = &b->depth;
  __u32 old = *d;
  *d = old + 1;
  asm volatile("" ::: "memory");
  return old;
}

static __always_inline void batch_leave(struct xlap_batch *b) {
  volatile __u32 *d = &b->depth;
  asm volatile("" ::: "memory");
  *d = *d - 1;
}

/* Returns v, as a value the verifier knows nothing about. The paths
 * through the packet parser end with many different known ranges of the
 * offsets it found; passed through here, they meet again in one state
 * before the per-datagram loops, instead of each path walking every loop
 * on its own (which exceeds the verifier's budget). */
__attribute__((noinline)) __u32 xl_opaque(__u32 v) {
  asm volatile("" : "+r"(v)); /* nor does the compiler: the call stays */
  return v;
}

/* First statement of every program on a datagram's path: under
 * --empty-programs the program returns `verdict` before anything else.
 * CFG is read-only and known at load, so the verifier drops the rest of
 * the program: what runs is the hook's dispatch and one load. */
#define RETURN_IF_EMPTY(verdict)                                               \
  do {                                                                         \
    if (CFG.empty_programs)                                                    \
      return (verdict);                                                        \
  } while (0)

/* Whether the run writes kernel point `point` (--points): a point left out
 * costs no clock read either. */
static __always_inline int point_on(__u32 point) {
  return !(point < 32 && (CFG.points_off >> point) & 1);
}

/* Whether the run stamps datagram `id` (--sample): every stamp of a
 * datagram outside the sample is left out, whatever the point, so both
 * hosts' recorders keep the same datagrams whole. A stamp without a seq
 * (a foreign-flow marker) is always kept. */
static __always_inline int sample_keeps(const struct xl_ident *id) {
  __u32 below = CFG.sample_below;
  if (!below || !(id->flags & XLAP_FLAG_SEQ_VALID))
    return 1;
  __u64 kinds = CFG.sample_kinds;
  if (kinds && (id->kind >= 64 || !((kinds >> id->kind) & 1)))
    return 1; /* a kind the sample leaves whole */
  return XLAP_SAMPLE_HASH(id->seq) < below;
}

/* Appends one stamp. A global function: the verifier checks it once, not
 * at each of the places (and loop iterations) that stamp. */
__attribute__((noinline)) int xl_emit(const struct xl_at *at,
                                      const struct xl_ident *id) {
  if (!at || !id)
    return 0;
  /* A point the run leaves out (--points): its program may still run for
   * what later points need. */
  if (!point_on(at->point))
    return 0;
  if (!sample_keeps(id))
    return 0;
  __u64 ts = at->ts;
  /* Outside the run's window: a point still attached after the end (or
   * stamping a call begun before the start) makes no stamp. */
  if (ts < STAMP_WINDOW.from_ns || ts > STAMP_WINDOW.until_ns)
    return 0;
  if (!CFG.per_stamp) {
    __u32 zero = 0;
    struct xlap_batch *b = bpf_map_lookup_elem(&BATCH, &zero);
    if (b) {
      if (batch_enter(b) == 0) {
        __u32 n = b->n;
        if (n >= XLAP_BATCH_STAMPS) { /* never: full batches leave at once */
          flush(b);
          n = 0;
        }
        if (n == 0)
          b->oldest_ns = ts;
        fill(&b->stamps[n & (XLAP_BATCH_STAMPS - 1)], at, ts, id);
        b->n = n + 1;
        if (n + 1 >= XLAP_BATCH_STAMPS ||
            (__s64)(ts - b->oldest_ns) > (__s64)XLAP_BATCH_MAX_AGE_NS)
          flush(b);
        batch_leave(b);
        return 0;
      }
      batch_leave(b); /* nested: a record of its own */
    }
  }
  struct xlap_stamp *s = bpf_ringbuf_reserve(&STAMPS, sizeof(*s), 0);
  if (!s) {
    count_loss(at->point, XLAP_LOSS_RINGBUF_FULL);
    return 0;
  }
  fill(s, at, ts, id);
  bpf_ringbuf_submit(s, wakeup_flag(sizeof(*s)));
  return 0;
}

static __always_inline void emit(__u16 point, __u64 ts,
                                 const struct xl_ident *id, __u32 tid,
                                 __u32 ifindex, __u16 queue, __u64 scope) {
  struct xl_at at = {.ts = ts,
                     .scope = scope,
                     .tid = tid,
                     .ifindex = ifindex,
                     .point = point,
                     .queue = queue};
  xl_emit(&at, id);
}

/* Pointers only: the datagram's identity is built in emit_seg's frame, so
 * that the loop's frames (xl_emit_rest, emit_seg, xl_emit) stay small. */
struct xl_emit_loop {
  const struct xl_at *at;
  const struct xl_ident *first;
  const struct xl_segs *segs;
  __u32 n;
};

static long emit_seg(__u32 idx, void *ctx) {
  struct xl_emit_loop *c = ctx;
  __u32 i = idx + 1;
  if (i >= c->n || i >= XLAP_MAX_SEGS)
    return 1;
  /* The comparison may bound a copy of i the compiler does not index
   * with: hide i from the optimiser, then bound it by a mask
   * (XLAP_MAX_SEGS is a power of two) the verifier sees. */
  asm volatile("" : "+r"(i));
  i &= XLAP_MAX_SEGS - 1;
  struct xl_ident id = *c->first;
  id.seq = c->segs->seq[i];
  id.kind = c->segs->kind[i];
  xl_emit(c->at, &id);
  return 0;
}

/* The stamps of datagrams 1..n-1 of a multi-datagram skb or call. A global
 * function: checked once, and its loop state lives in its own frame, not
 * in the callers' (the first device points' frames are near the stack
 * limit). bpf_loop (Linux >= 5.17): the verifier checks the body once
 * instead of once per iteration and state, which kept load times in
 * seconds. */
__attribute__((noinline)) int xl_emit_rest(const struct xl_at *at,
                                           const struct xl_ident *first,
                                           const struct xl_segs *segs,
                                           __u32 n) {
  if (!at || !first || !segs)
    return 0;
  struct xl_emit_loop c = {.at = at, .first = first, .segs = segs, .n = n};
  bpf_loop(XLAP_MAX_SEGS - 1, emit_seg, &c, 0);
  return 0;
}

/* One stamp per datagram: datagram 0 is `first`; datagrams 1..n-1 take
 * their seq and kind from `segs` (all of the same flow and process). */
static __always_inline void emit_all(const struct xl_at *at,
                                     const struct xl_ident *first,
                                     const struct xl_segs *segs, __u32 n) {
  xl_emit(at, first);
  if (n > 1 && segs)
    xl_emit_rest(at, first, segs, n);
}

#endif
