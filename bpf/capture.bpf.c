// SPDX-License-Identifier: GPL-2.0
/* capture.bpf.c: kernel stamp points of xlap-trace.
 *
 * Tracepoints only (no kprobes/fentry on our kernels): raw_tp sys_enter/exit
 * for the send and receive syscalls, tp_btf for the net, qdisc, sock and
 * sched points. Every stamp carries the protocol's own sequence number and
 * kind, read from the UDP payload (CFG) in the skb or the syscall's user
 * buffer; the skb -> identity map carries it to points where the headers are
 * no longer at hand. Traffic of other processes costs one map lookup.
 *
 * Export: stamps are batched per CPU (struct xlap_batch in xlap_abi.h) and
 * leave in one ring-buffer record per batch; CFG.per_stamp selects the old
 * one-record-per-stamp mode (for benchmarks).
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "xlap_abi.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by userspace before load. */
const volatile struct xlap_config CFG = {};

/* Syscall numbers (x86-64). */
#define NR_READ 0
#define NR_WRITE 1
#define NR_SENDTO 44
#define NR_RECVFROM 45
#define NR_SENDMSG 46
#define NR_RECVMSG 47
#define NR_RECVMMSG 299
#define NR_SENDMMSG 307
#define NR_BIND 49
#define AF_INET_ 2
#define AF_INET6_ 10

#define IPPROTO_UDP_ 17
#define LOSS_ROWS (XLAP_POINT_KERNEL_COUNT + 1) /* last row: app points */

/* Identity of a packet, remembered per skb. */
struct xl_ident {
  __u64 seq;
  __u64 flow;
  __u32 pid;
  __u32 len;
  __u8 kind;
  __u8 flags; /* XLAP_FLAG_* of the stamp */
  __u8 _pad[6];
};

/* A send syscall of a traced process, until it returns. */
struct xl_send_ctx {
  __u64 ts_enter;
  struct xl_ident id; /* from the skb seen at dev.queue in this syscall */
  __u8 seen_skb;
};

/* The call state of a thread of a traced process, in the thread's own
 * storage (task local storage: no hash lookups, freed with the thread). */
struct xl_task {
  struct xl_send_ctx send; /* valid while in_send */
  __u8 in_send;            /* in a send syscall */
  __u8 in_recv;            /* in a receive syscall */
  __u8 on_sock; /* sock_recv_length saw a UDP socket in this receive */
};

/* The last datagram queued on a traced socket on this CPU: the wake-up it
 * triggers follows within the same call. */
struct xl_rx_last {
  struct xl_ident id;
  __u64 ts;
  __u8 valid;
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

/* Entries in WOKEN (an upper bound): while it is 0, sched_switch, the most
 * frequent of our events, needs no hash lookup. */
__u64 WOKEN_PENDING = 0;

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32); /* tgid */
  __type(value, __u32);
} TARGET_PIDS SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, struct xlap_port_key); /* a traced socket: netns + port */
  __type(value, __u32);              /* owning tgid */
} TARGET_PORTS SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, int);
  __type(value, struct xl_task);
} TASK_CTX SEC(".maps");

/* The call state of `task` if it has one (never creates it). */
static __always_inline struct xl_task *task_ctx(struct task_struct *task) {
  return bpf_task_storage_get(&TASK_CTX, task, 0, 0);
}

/* skb -> identity on the TX path, for the points after dev.queue (they may
 * run in another context: qdisc, softirq). A plain preallocated hash with
 * explicit deletes (at dev.xmit, or when the address shows up again for a
 * foreign packet): an LRU update costs several times more. The RX path needs
 * no map: its points re-read the headers, and the socket-side point pairs
 * with the per-CPU RX_CUR (below). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 65536);
  __type(key, __u64); /* struct sk_buff * */
  __type(value, struct xl_ident);
} SKB_TX SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, __u32); /* tid woken for a datagram */
  __type(value, struct xl_ident);
} WOKEN SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_rx_last);
} RX_LAST SEC(".maps");

/* A datagram for a traced socket that the receive path on this CPU carried
 * up from the driver. */
struct xl_rx_slot {
  struct xl_ident id;
  __u64 ts;
  __u32 gen;      /* bumped before and after a write: odd while writing */
  __u32 used_gen; /* == gen once sk_data_ready paired the slot */
  __u32 read_gen; /* == gen: the reader had it first (see forget_received) */
  __u16 dport;
  __u8 at_socket_path; /* from receive_skb/gro (not netif_rx: backlog) */
  __u8 _pad;
};

/* The last RX_SLOTS of them on this CPU, head the newest. */
#define RX_SLOTS 4
struct xl_rx_cur {
  struct xl_rx_slot slot[RX_SLOTS];
  __u32 head;
};
#define RX_CUR_MAX_AGE_NS 1000000
/* CPUs searched for a datagram another CPU queued (see on_sk_data_ready):
 * the verifier's time grows fast with it (8: ~0.4 s at load, 64: ~20 s).
 * On bigger machines a datagram carried up by a CPU beyond these and
 * queued by another one counts as unmatched. */
#define RX_MAX_CPUS 8

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_rx_cur);
} RX_CUR SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, LOSS_ROWS *XLAP_LOSS_COUNT);
  __type(key, __u32);
  __type(value, __u64);
} LOSSES SEC(".maps");

static __always_inline void count_loss(__u32 point, __u32 reason) {
  __u32 row = point < XLAP_POINT_KERNEL_COUNT ? point : XLAP_POINT_KERNEL_COUNT;
  __u32 idx = row * XLAP_LOSS_COUNT + reason;
  __u64 *v = bpf_map_lookup_elem(&LOSSES, &idx);
  if (v)
    *v += 1;
}

static __always_inline __u64 wakeup_flag(void) {
  __u64 waiting = bpf_ringbuf_query(&STAMPS, BPF_RB_AVAIL_DATA);
  return waiting >= CFG.wakeup_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

static __always_inline void fill(struct xlap_stamp *s, __u16 point, __u64 ts,
                                 const struct xl_ident *id, __u32 tid,
                                 __u32 ifindex, __u16 queue, __u64 hw_ts) {
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
  if (bpf_ringbuf_output(&STAMPS, b->stamps, n * sizeof(struct xlap_stamp),
                         wakeup_flag())) {
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

static __always_inline void emit(__u16 point, __u64 ts,
                                 const struct xl_ident *id, __u32 tid,
                                 __u32 ifindex, __u16 queue, __u64 hw_ts) {
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
        fill(&b->stamps[n & (XLAP_BATCH_STAMPS - 1)], point, ts, id, tid,
             ifindex, queue, hw_ts);
        b->n = n + 1;
        if (n + 1 >= XLAP_BATCH_STAMPS ||
            (__s64)(ts - b->oldest_ns) > (__s64)XLAP_BATCH_MAX_AGE_NS)
          flush(b);
        batch_leave(b);
        return;
      }
      batch_leave(b); /* nested: a record of its own */
    }
  }
  struct xlap_stamp *s = bpf_ringbuf_reserve(&STAMPS, sizeof(*s), 0);
  if (!s) {
    count_loss(point, XLAP_LOSS_RINGBUF_FULL);
    return;
  }
  fill(s, point, ts, id, tid, ifindex, queue, hw_ts);
  bpf_ringbuf_submit(s, wakeup_flag());
}

/* Reads an unsigned field of 1, 2, 4 or 8 bytes at `src` (kernel or user
 * memory) in the configured byte order. Returns 0 on success. */
static __always_inline int read_field(const void *src, __u8 size, int user,
                                      __u64 *out) {
  __u8 b[8] = {};
  int err;
  if (size == 0 || size > 8)
    return -1;
  if (user)
    err = bpf_probe_read_user(b, size & 0xf, src);
  else
    err = bpf_probe_read_kernel(b, size & 0xf, src);
  if (err)
    return err;
  __u64 v = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    if (i >= size)
      break;
    if (CFG.big_endian)
      v = (v << 8) | b[i];
    else
      v |= (__u64)b[i] << (8 * i);
  }
  *out = v;
  return 0;
}

/* Reads seq and kind from a UDP payload at `payload` of `avail` bytes. */
static __always_inline int read_ident(const void *payload, __u64 avail,
                                      int user, struct xl_ident *id) {
  __u64 seq = 0, kind = 0;
  if ((__u64)CFG.seq_offset + CFG.seq_size > avail)
    return -1;
  if (read_field(payload + CFG.seq_offset, CFG.seq_size, user, &seq))
    return -1;
  if (CFG.kind_size) {
    if ((__u64)CFG.kind_offset + CFG.kind_size > avail)
      return -1;
    if (read_field(payload + CFG.kind_offset, CFG.kind_size, user, &kind))
      return -1;
  }
  id->seq = seq;
  id->kind = kind;
  id->flags |= XLAP_FLAG_SEQ_VALID;
  return 0;
}

static __always_inline __u16 fold16(const __u32 *words, int n) {
  __u32 x = 0;
#pragma unroll
  for (int i = 0; i < 4; i++)
    if (i < n)
      x ^= words[i];
  return (__u16)(x ^ (x >> 16));
}

/* Bytes read in one go from the network header: an IPv6 header or an IPv4
 * header without options, the UDP header, and the first 16 (IPv6) or 36
 * (IPv4) bytes of the payload, where the protocols we know keep seq and
 * kind: one probe read per point instead of three. A power of two (index
 * masks). If the read fails (the packet's buffer ends in an unmapped page),
 * NET_HDR_MIN bytes are read and the fields are read apart. */
#define NET_HDR_READ 64
#define NET_HDR_MIN 48

/* A field of `size` bytes at `at` in the header bytes `h` (all of it
 * within NET_HDR_READ), in the configured byte order. */
static __always_inline __u64 field_in(const __u8 *h, __u32 at, __u8 size) {
  __u64 v = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    if (i >= size)
      break;
    __u8 b = h[(at + i) & (NET_HDR_READ - 1)];
    if (CFG.big_endian)
      v = (v << 8) | b;
    else
      v |= (__u64)b << (8 * i);
  }
  return v;
}

/* Seq and kind from the header bytes already read, the payload starting at
 * `off` in them with `avail` bytes, `have` bytes read. Returns 0 on
 * success, -1 when the fields lie beyond the datagram (a parse failure), 1
 * when they lie beyond what was read (read them apart). */
static __always_inline int ident_in(const __u8 *h, __u32 off, __u32 have,
                                    __u64 avail, struct xl_ident *id) {
  __u32 so = CFG.seq_offset, ss = CFG.seq_size;
  __u32 ko = CFG.kind_offset, ks = CFG.kind_size;
  if (ss == 0 || ss > 8 || ks > 8)
    return 1;
  if ((__u64)so + ss > avail || (ks && (__u64)ko + ks > avail))
    return -1;
  if ((__u64)off + so + ss > have || (ks && (__u64)off + ko + ks > have))
    return 1;
  id->seq = field_in(h, off + so, ss);
  id->kind = ks ? field_in(h, off + ko, ks) : 0;
  id->flags |= XLAP_FLAG_SEQ_VALID;
  return 0;
}

/* Parses the IP/UDP headers of an skb. On success fills the packet's flow
 * (addresses folded to 16 bits, ports), its UDP destination port and, when
 * the payload is in the linear area, seq and kind. Returns:
 * -1 not IPv4/IPv6 UDP (or not the first fragment), 0 parsed,
 * 1 UDP but seq/kind unreadable (nonlinear or beyond the datagram).
 * `skb` comes from tp_btf arguments: its fields are plain loads; only the
 * packet bytes need probe reads (usually one for headers and fields). */
static __always_inline int parse_skb(struct sk_buff *skb, struct xl_ident *id,
                                     __u16 *dport) {
  unsigned char *head = skb->head;
  __u16 nh = skb->network_header;
  __u32 tail = skb->tail;
  if (!head || nh == (__u16)~0U)
    return -1;
  unsigned char *ip = head + nh;
  __u8 h[NET_HDR_READ] = {};
  __u32 have = NET_HDR_READ;
  if (bpf_probe_read_kernel(h, NET_HDR_READ, ip)) {
    have = NET_HDR_MIN;
    if (bpf_probe_read_kernel(h, NET_HDR_MIN, ip))
      return -1;
  }
  __u32 saddr[4] = {}, daddr[4] = {};
  struct udphdr uh;
  unsigned char *udp;
  __u32 pay_off = 0; /* payload offset in h, 0: not in h (IP options) */
  int words;
  if ((h[0] >> 4) == 4) {
    struct iphdr *iph = (struct iphdr *)h;
    if (iph->protocol != IPPROTO_UDP_ ||
        (bpf_ntohs(iph->frag_off) & 0x1fff) != 0)
      return -1;
    saddr[0] = iph->saddr;
    daddr[0] = iph->daddr;
    words = 1;
    __u32 ihl = (h[0] & 0xf) * 4;
    udp = ip + ihl;
    if (ihl == sizeof(struct iphdr)) {
      __builtin_memcpy(&uh, h + sizeof(struct iphdr), sizeof(uh));
      pay_off = sizeof(struct iphdr) + 8;
    } else if (bpf_probe_read_kernel(&uh, sizeof(uh), udp)) /* IP options */
      return -1;
  } else if ((h[0] >> 4) == 6) {
    struct ipv6hdr *ip6 = (struct ipv6hdr *)h;
    if (ip6->nexthdr != IPPROTO_UDP_)
      return -1;
    __builtin_memcpy(saddr, &ip6->saddr, 16);
    __builtin_memcpy(daddr, &ip6->daddr, 16);
    words = 4;
    udp = ip + sizeof(struct ipv6hdr);
    __builtin_memcpy(&uh, h + sizeof(struct ipv6hdr), sizeof(uh));
    pay_off = sizeof(struct ipv6hdr) + 8;
  } else {
    return -1;
  }
  __u16 sport = bpf_ntohs(uh.source);
  *dport = bpf_ntohs(uh.dest);
  id->flow = ((__u64)fold16(saddr, words) << 48) |
             ((__u64)fold16(daddr, words) << 32) | ((__u64)sport << 16) |
             *dport;
  __u64 udp_len = bpf_ntohs(uh.len);
  id->len = udp_len;
  if (udp_len < 8)
    return 1;
  unsigned char *payload = udp + 8;
  /* Only the linear area is readable through head: head + tail ends it. */
  if (payload > head + tail)
    return 1;
  __u64 linear = (head + tail) - payload;
  __u64 avail = udp_len - 8 < linear ? udp_len - 8 : linear;
  if (pay_off) {
    int r = ident_in(h, pay_off, have, avail, id);
    if (r <= 0)
      return r < 0 ? 1 : 0;
  }
  return read_ident(payload, avail, 0, id) ? 1 : 0;
}

static __always_inline __u64 skb_hw_ts(struct sk_buff *skb) {
  struct skb_shared_info *sh = (struct skb_shared_info *)(skb->head + skb->end);
  return (__u64)BPF_CORE_READ(sh, hwtstamps.hwtstamp);
}

/* ---- TX: syscalls ---------------------------------------------------- */

/* The user buffer of the first datagram of a send/recv call. */
static __always_inline __u64 user_buf(__u32 nr, struct pt_regs *regs) {
  __u64 a1 = BPF_CORE_READ(regs, si);
  if (nr == NR_SENDTO || nr == NR_RECVFROM || nr == NR_WRITE || nr == NR_READ)
    return a1;
  /* msghdr (sendmsg/recvmsg) or mmsghdr[0] (msg_hdr first): iov[0].base */
  struct user_msghdr msg;
  struct iovec iov;
  if (bpf_probe_read_user(&msg, sizeof(msg), (void *)a1))
    return 0;
  if (!msg.msg_iov || bpf_probe_read_user(&iov, sizeof(iov), msg.msg_iov))
    return 0;
  return (__u64)iov.iov_base;
}

/* A traced process binding a socket to a port: traced from its first
 * datagram on, before userspace's /proc scan (every 200 ms) would see it.
 * Binding to port 0 (ephemeral) leaves it to that scan. */
static __always_inline void register_bound_port(__u32 tgid,
                                                struct pt_regs *regs) {
  const void *addr = (const void *)BPF_CORE_READ(regs, si);
  __u16 family = 0, port = 0;
  if (bpf_probe_read_user(&family, sizeof(family), addr) ||
      (family != AF_INET_ && family != AF_INET6_) ||
      bpf_probe_read_user(&port, sizeof(port), addr + 2) || port == 0)
    return;
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  struct xlap_port_key key = {.netns =
                                  BPF_CORE_READ(task, nsproxy, net_ns, ns.inum),
                              .port = bpf_ntohs(port)};
  bpf_map_update_elem(&TARGET_PORTS, &key, &tgid, BPF_ANY);
}

static __always_inline int is_send(__u32 nr) {
  return nr == NR_SENDTO || nr == NR_SENDMSG || nr == NR_SENDMMSG ||
         nr == NR_WRITE;
}

static __always_inline int is_recv(__u32 nr) {
  return nr == NR_RECVFROM || nr == NR_RECVMSG || nr == NR_RECVMMSG ||
         nr == NR_READ;
}

/* tp_btf (not raw_tp) on the syscall tracepoints: the syscall number and
 * the saved user registers are plain loads, and the number is tested before
 * any map lookup, so the other syscalls of the machine cost almost nothing. */
SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id) {
  __u32 nr = (__u32)id;
  int send = is_send(nr), recv = is_recv(nr);
  if (!send && !recv && nr != NR_BIND)
    return 0;
  /* A thread with call state belongs to a traced process: no need to look
   * its process up (task storage is cheaper than the hash). */
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!t && !bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return 0;
  if (!send && !recv) {
    register_bound_port(tgid, regs);
    return 0;
  }
  if (!t)
    t = bpf_task_storage_get(&TASK_CTX, task, 0,
                             BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!t) {
    count_loss(send ? XLAP_POINT_SOCK_SEND_ENTER : XLAP_POINT_SOCK_RECV_EXIT,
               XLAP_LOSS_MAP_FULL);
    return 0;
  }
  t->in_send = send;
  t->in_recv = recv;
  t->on_sock = 0;
  if (send) {
    t->send.ts_enter = bpf_ktime_get_ns();
    t->send.seen_skb = 0;
  }
  return 0;
}

/* The reader has the datagram. UDP signals (sk_data_ready) a batch of
 * datagrams only after queueing all of them, one call each, so a reader
 * already awake can take one before its signal: if a CPU still holds it
 * unpaired, stamp sock.queue now (it was queued before this, its signal has
 * not come) and mark the slot, so that the late signal is paired with it
 * without a second stamp. */
static __always_inline void queued_before_read(const struct xl_ident *rid,
                                               __u64 now) {
  __u32 zero = 0;
  for (__u32 cpu = 0; cpu < RX_MAX_CPUS; cpu++) {
    struct xl_rx_cur *c = bpf_map_lookup_percpu_elem(&RX_CUR, &zero, cpu);
    if (!c)
      break;
    for (__u32 j = 0; j < RX_SLOTS; j++) {
      struct xl_rx_slot *s = &c->slot[j];
      __u32 g = s->gen;
      if ((g & 1) || s->used_gen == g || s->read_gen == g ||
          !s->at_socket_path || s->id.seq != rid->seq ||
          s->id.kind != rid->kind || s->id.pid != rid->pid ||
          now - s->ts >= RX_CUR_MAX_AGE_NS)
        continue;
      asm volatile("" ::: "memory");
      struct xl_ident id = s->id;
      asm volatile("" ::: "memory");
      if (*(volatile __u32 *)&s->gen != g)
        continue; /* rewritten meanwhile */
      s->read_gen = g;
      emit(XLAP_POINT_SOCK_QUEUE, now, &id, 0, 0, 0, 0);
      return;
    }
  }
}

/* A thread's pending wake-up is spent (it ran, or its receive returned). */
static __always_inline void forget_woken(__u32 tid) {
  if (WOKEN_PENDING && bpf_map_delete_elem(&WOKEN, &tid) == 0)
    __sync_fetch_and_add(&WOKEN_PENDING, -1);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret) {
  __u32 nr = (__u32)regs->orig_ax;
  int send = is_send(nr);
  if (!send && !is_recv(nr))
    return 0;
  /* Only threads of traced processes have call contexts. */
  struct xl_task *t = task_ctx(bpf_get_current_task_btf());
  if (!t)
    return 0;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
  if (send) {
    if (!t->in_send)
      return 0;
    t->in_send = 0;
    struct xl_send_ctx *sc = &t->send;
    /* Only a call that put a UDP datagram on a device is a send. */
    if (sc->seen_skb) {
      __u64 now = bpf_ktime_get_ns();
      struct xl_ident id = sc->id;
      id.pid = tgid;
      emit(XLAP_POINT_SOCK_SEND_ENTER, sc->ts_enter, &id, tid, 0, 0, 0);
      emit(XLAP_POINT_SOCK_SEND_EXIT, now, &id, tid, 0, 0, 0);
    }
    return 0;
  }
  if (!t->in_recv)
    return 0;
  t->in_recv = 0;
  /* A reader woken while still on its CPU is never switched in for that
   * wake-up: once its receive returns, the wake-up is spent. */
  forget_woken(tid);
  if (t->on_sock && ret > 0) {
    __u64 now = bpf_ktime_get_ns();
    /* The user's argument registers are intact at exit: the buffer is
     * found here, also for a call that was already blocked when tracing
     * started (no entry context; sock_recv_length made one). */
    __u64 buf = regs->si;
    if (nr == NR_RECVMSG || nr == NR_RECVMMSG)
      buf = user_buf(nr, regs);
    __u64 avail = nr == NR_RECVMMSG ? 65535 : (__u64)ret;
    struct xl_ident id = {};
    id.pid = tgid;
    id.len = nr == NR_RECVMMSG ? 0 : ret;
    id.flags = XLAP_FLAG_FROM_USER;
    if (buf && read_ident((void *)buf, avail, 1, &id) == 0) {
      emit(XLAP_POINT_SOCK_RECV_EXIT, now, &id, tid, 0, 0, 0);
      queued_before_read(&id, now);
    } else
      count_loss(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_PARSE);
  }
  return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_sock_recv_length, struct sock *sk, int ret, int flags) {
  if (sk->sk_protocol != IPPROTO_UDP_)
    return 0;
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  if (t && t->in_recv) {
    t->on_sock = 1;
    return 0;
  }
  /* A receive call of a traced process that began before tracing did. */
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return 0;
  t = bpf_task_storage_get(&TASK_CTX, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!t) {
    count_loss(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_MAP_FULL);
    return 0;
  }
  t->in_send = 0;
  t->in_recv = 1;
  t->on_sock = 1;
  return 0;
}

/* ---- TX: device and qdisc -------------------------------------------- */

SEC("tp_btf/net_dev_queue")
int BPF_PROG(on_net_dev_queue, struct sk_buff *skb) {
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tid = (__u32)pid_tgid;
  __u64 key = (__u64)skb;
  struct xl_task *t = task_ctx(bpf_get_current_task_btf());
  struct xl_send_ctx *sc = t && t->in_send ? &t->send : 0;
  if (!sc) {
    /* Not a traced send: forget any identity a freed skb at this address
     * had, so later TX points do not stamp this packet as ours. */
    bpf_map_delete_elem(&SKB_TX, &key);
    return 0;
  }
  __u64 now = bpf_ktime_get_ns();
  struct xl_ident id = {};
  __u16 dport;
  int r = parse_skb(skb, &id, &dport);
  if (r < 0)
    return 0; /* not UDP: not ours */
  if (r > 0) {
    count_loss(XLAP_POINT_DEV_QUEUE, XLAP_LOSS_PARSE);
    return 0;
  }
  id.pid = pid_tgid >> 32;
  if (!sc->seen_skb) {
    sc->id = id;
    sc->seen_skb = 1;
  }
  if (bpf_map_update_elem(&SKB_TX, &key, &id, BPF_ANY))
    count_loss(XLAP_POINT_DEV_QUEUE, XLAP_LOSS_MAP_FULL);
  emit(XLAP_POINT_DEV_QUEUE, now, &id, tid, skb->dev->ifindex,
       skb->queue_mapping, 0);
  return 0;
}

/* A point of a packet already identified on this host's TX path. */
static __always_inline void stamp_known_tx(__u16 point, struct sk_buff *skb) {
  if (!skb)
    return;
  __u64 key = (__u64)skb;
  struct xl_ident *id = bpf_map_lookup_elem(&SKB_TX, &key);
  if (!id)
    return;
  __u32 tid = (__u32)bpf_get_current_pid_tgid();
  emit(point, bpf_ktime_get_ns(), id, tid, skb->dev->ifindex,
       skb->queue_mapping, 0);
}

SEC("tp_btf/qdisc_enqueue")
int BPF_PROG(on_qdisc_enqueue, struct Qdisc *q, const struct netdev_queue *txq,
             struct sk_buff *skb) {
  stamp_known_tx(XLAP_POINT_QDISC_ENQUEUE, skb);
  return 0;
}

SEC("tp_btf/qdisc_dequeue")
int BPF_PROG(on_qdisc_dequeue, struct Qdisc *q, const struct netdev_queue *txq,
             int packets, struct sk_buff *skb) {
  stamp_known_tx(XLAP_POINT_QDISC_DEQUEUE, skb); /* NULL when queue empty */
  return 0;
}

SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(on_net_dev_start_xmit, struct sk_buff *skb,
             struct net_device *dev) {
  stamp_known_tx(XLAP_POINT_DEV_START_XMIT, skb);
  return 0;
}

SEC("tp_btf/net_dev_xmit")
int BPF_PROG(on_net_dev_xmit, struct sk_buff *skb, int rc,
             struct net_device *dev, unsigned int skb_len) {
  /* Only the map is consulted: the driver may have freed or forwarded the
   * skb already, so its contents are not read here. */
  __u64 key = (__u64)skb;
  struct xl_ident *id = bpf_map_lookup_elem(&SKB_TX, &key);
  if (!id)
    return 0;
  __u32 tid = (__u32)bpf_get_current_pid_tgid();
  emit(XLAP_POINT_DEV_XMIT, bpf_ktime_get_ns(), id, tid, dev->ifindex, 0, 0);
  /* The last TX point: the skb may be freed and its address reused. */
  bpf_map_delete_elem(&SKB_TX, &key);
  return 0;
}

/* ---- RX -------------------------------------------------------------- */

/* A driver hand-off point: parse, keep packets for traced sockets. */
static __always_inline void stamp_rx_dev(__u16 point, struct sk_buff *skb) {
  __u64 now = bpf_ktime_get_ns();
  struct xl_ident id = {};
  __u16 dport;
  int r = parse_skb(skb, &id, &dport);
  struct xlap_port_key pk = {.netns = skb->dev->nd_net.net->ns.inum,
                             .port = dport};
  __u32 *owner = r < 0 ? 0 : bpf_map_lookup_elem(&TARGET_PORTS, &pk);
  if (!owner)
    return;
  if (r > 0) {
    count_loss(point, XLAP_LOSS_PARSE);
    return;
  }
  id.pid = *owner;
  /* The receive softirq carries this skb up to the socket on this CPU
   * before it takes the next one: sk_data_ready pairs with it. */
  __u32 zero = 0;
  struct xl_rx_cur *cur = bpf_map_lookup_elem(&RX_CUR, &zero);
  if (cur) {
    __u32 i = (cur->head + 1) & (RX_SLOTS - 1);
    struct xl_rx_slot *s = &cur->slot[i];
    volatile __u32 *gen = &s->gen;
    *gen = *gen + 1;
    asm volatile("" ::: "memory");
    s->id = id;
    s->dport = dport;
    s->ts = now;
    s->at_socket_path = point != XLAP_POINT_DEV_NETIF_RX;
    asm volatile("" ::: "memory");
    *gen = *gen + 1;
    cur->head = i;
  }
  emit(point, now, &id, 0, skb->dev->ifindex, skb->queue_mapping,
       skb_hw_ts(skb));
}

SEC("tp_btf/netif_rx")
int BPF_PROG(on_netif_rx, struct sk_buff *skb) {
  stamp_rx_dev(XLAP_POINT_DEV_NETIF_RX, skb);
  return 0;
}

SEC("tp_btf/napi_gro_receive_entry")
int BPF_PROG(on_napi_gro_receive_entry, struct sk_buff *skb) {
  stamp_rx_dev(XLAP_POINT_DEV_GRO_RECEIVE, skb);
  return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(on_netif_receive_skb, struct sk_buff *skb) {
  stamp_rx_dev(XLAP_POINT_DEV_RECEIVE_SKB, skb);
  return 0;
}

/* UDP (since 6.18) lets the CPU that finds the socket's producer list
 * empty move the datagrams other CPUs add meanwhile to the receive queue
 * and call sk_data_ready for each of them, oldest first: a datagram can
 * reach its socket on a CPU other than the one that carried it up. Its
 * identity then waits, unpaired, in that CPU's slots: take the oldest
 * unpaired one for the port (a seqcount-like generation guards against
 * reading a slot while its CPU rewrites it). */
static __always_inline int
rx_cur_elsewhere(__u16 port, __u64 now, struct xl_ident *out, int *stamped) {
  __u32 zero = 0, self = bpf_get_smp_processor_id();
  /* The best slot is kept as numbers, not a pointer: the verifier can then
   * prune the paths of the search. */
  __u32 best_cpu = ~0U, best_j = 0, best_gen = 0;
  __u64 best_ts = ~0ULL;
  for (__u32 cpu = 0; cpu < RX_MAX_CPUS; cpu++) {
    if (cpu == self)
      continue;
    struct xl_rx_cur *c = bpf_map_lookup_percpu_elem(&RX_CUR, &zero, cpu);
    if (!c)
      break;
    for (__u32 j = 0; j < RX_SLOTS; j++) {
      struct xl_rx_slot *s = &c->slot[j];
      volatile __u32 *gen = &s->gen;
      __u32 g = *gen;
      if ((g & 1) || s->used_gen == g || s->dport != port || !s->at_socket_path)
        continue;
      __u64 ts = s->ts;
      if (now - ts >= RX_CUR_MAX_AGE_NS || ts >= best_ts)
        continue;
      best_cpu = cpu;
      best_j = j;
      best_gen = g;
      best_ts = ts;
    }
  }
  if (best_cpu == ~0U)
    return 0;
  struct xl_rx_cur *c = bpf_map_lookup_percpu_elem(&RX_CUR, &zero, best_cpu);
  if (!c)
    return 0;
  struct xl_rx_slot *s = &c->slot[best_j & (RX_SLOTS - 1)];
  volatile __u32 *gen = &s->gen;
  if (*gen != best_gen)
    return 0; /* rewritten meanwhile */
  asm volatile("" ::: "memory");
  struct xl_ident id = s->id;
  asm volatile("" ::: "memory");
  if (*gen != best_gen)
    return 0;
  s->used_gen = best_gen;
  *stamped = s->read_gen == best_gen;
  *out = id;
  return 1;
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(on_sk_data_ready, const struct sock *sk) {
  __u16 port = sk->__sk_common.skc_num;
  struct xlap_port_key pk = {.netns = sk->__sk_common.skc_net.net->ns.inum,
                             .port = port};
  if (!bpf_map_lookup_elem(&TARGET_PORTS, &pk))
    return 0;
  __u64 now = bpf_ktime_get_ns();
  /* The datagram this softirq carried up from the driver on this CPU: the
   * receive path runs from netif_receive_skb to the socket without taking
   * another packet on the way. */
  __u32 zero = 0;
  struct xl_rx_cur *cur = bpf_map_lookup_elem(&RX_CUR, &zero);
  struct xl_rx_slot *s = cur ? &cur->slot[cur->head & (RX_SLOTS - 1)] : 0;
  struct xl_ident id;
  int stamped = 0;
  if (s && s->dport == port && s->used_gen != s->gen &&
      now - s->ts < RX_CUR_MAX_AGE_NS) {
    id = s->id;
    s->used_gen = s->gen; /* never pair it twice */
    stamped = s->read_gen == s->gen;
  } else if (!rx_cur_elsewhere(port, now, &id, &stamped)) {
    count_loss(XLAP_POINT_SOCK_QUEUE, XLAP_LOSS_UNMATCHED);
    return 0;
  }
  if (stamped)
    return 0; /* read (and stamped) before this signal came */
  emit(XLAP_POINT_SOCK_QUEUE, now, &id, 0, 0, 0, 0);
  struct xl_rx_last *last = bpf_map_lookup_elem(&RX_LAST, &zero);
  if (last) {
    last->id = id;
    last->ts = now;
    last->valid = 1;
  }
  return 0;
}

/* A waking within this window after sk_data_ready on the same CPU is the
 * wake-up of the reader by that datagram (sock_def_readable wakes it
 * synchronously, well under a microsecond later). */
#define WAKE_WINDOW_NS 20000

SEC("tp_btf/sched_waking")
int BPF_PROG(on_sched_waking, struct task_struct *p) {
  __u32 zero = 0;
  struct xl_rx_last *last = bpf_map_lookup_elem(&RX_LAST, &zero);
  if (!last || !last->valid)
    return 0;
  __u64 now = bpf_ktime_get_ns();
  if (now - last->ts > WAKE_WINDOW_NS) {
    last->valid = 0;
    return 0;
  }
  if ((__u32)p->tgid != last->id.pid)
    return 0;
  /* Only a thread blocked in a receive call is woken by the datagram (not,
   * say, a worker thread its reader wakes through a futex). */
  __u32 tid = p->pid;
  struct xl_task *t = task_ctx(p);
  if (!t || !t->in_recv)
    return 0;
  last->valid = 0;
  emit(XLAP_POINT_SCHED_WAKEUP, now, &last->id, tid, 0, 0, 0);
  if (bpf_map_update_elem(&WOKEN, &tid, &last->id, BPF_NOEXIST) == 0)
    __sync_fetch_and_add(&WOKEN_PENDING, 1);
  else if (bpf_map_update_elem(&WOKEN, &tid, &last->id, BPF_EXIST))
    count_loss(XLAP_POINT_SCHED_SWITCH_IN, XLAP_LOSS_MAP_FULL);
  return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_sched_switch, bool preempt, struct task_struct *prev,
             struct task_struct *next) {
  __u32 tid = next->pid;
  if (tid == 0) {
    /* This CPU goes idle: export what waits in its batch, so stamps never
     * wait long for the reader. Interrupts are off here: no program can
     * nest, and depth is only non-zero under a preempted uprobe append. */
    __u32 zero = 0;
    struct xlap_batch *b = bpf_map_lookup_elem(&BATCH, &zero);
    if (b && b->n) {
      if (batch_enter(b) == 0)
        flush(b);
      batch_leave(b);
    }
    return 0;
  }
  if (!WOKEN_PENDING)
    return 0;
  struct xl_ident *id = bpf_map_lookup_elem(&WOKEN, &tid);
  if (!id)
    return 0;
  struct xl_ident copy = *id;
  if (bpf_map_delete_elem(&WOKEN, &tid) == 0)
    __sync_fetch_and_add(&WOKEN_PENDING, -1);
  emit(XLAP_POINT_SCHED_SWITCH_IN, bpf_ktime_get_ns(), &copy, tid, 0, 0, 0);
  return 0;
}

/* ---- App points: USDT markers --------------------------------------- */

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, XLAP_USDT_MAX_SPECS);
  __type(key, __u32); /* the uprobe's cookie */
  __type(value, struct xlap_usdt_spec);
} USDT_SPECS SEC(".maps");

static __always_inline __u64 reg_at(struct pt_regs *ctx, __u16 off) {
  __u64 v = 0;
  bpf_probe_read_kernel(&v, sizeof(v), (void *)ctx + (off & 0xff8));
  return v;
}

/* Reads one USDT argument; returns 0 on success. */
static __always_inline int usdt_arg(struct pt_regs *ctx,
                                    const struct xlap_usdt_arg *a,
                                    __u64 probe_addr, __u64 *out) {
  __u64 v = 0;
  __u64 addr;
  switch (a->kind) {
  case XLAP_ARG_CONST:
    *out = a->value;
    return 0;
  case XLAP_ARG_REG:
    v = reg_at(ctx, a->reg_off);
    break;
  case XLAP_ARG_MEM:
    addr = reg_at(ctx, a->reg_off) + a->value;
    if (a->idx_reg_off != XLAP_USDT_NO_REG)
      addr += reg_at(ctx, a->idx_reg_off) * a->scale;
    if (bpf_probe_read_user(&v, a->size & 0xf, (void *)addr))
      return -1;
    break;
  case XLAP_ARG_GLOBAL:
    /* The load bias is page aligned: mask off the breakpoint's ip skew. */
    addr = a->value + ((PT_REGS_IP(ctx) - probe_addr) & ~0xfffULL);
    if (bpf_probe_read_user(&v, a->size & 0xf, (void *)addr))
      return -1;
    break;
  default:
    return -1;
  }
  /* Keep the argument's own width, sign-extended if signed. */
  if (a->size < 8) {
    int shift = 64 - 8 * (a->size & 0xf);
    if (a->is_signed)
      v = (__u64)(((__s64)(v << shift)) >> shift);
    else
      v = (v << shift) >> shift;
  }
  *out = v;
  return 0;
}

SEC("uprobe")
int on_usdt(struct pt_regs *ctx) {
  __u64 now = bpf_ktime_get_ns();
  __u32 spec_id = (__u32)bpf_get_attach_cookie(ctx);
  struct xlap_usdt_spec *spec = bpf_map_lookup_elem(&USDT_SPECS, &spec_id);
  if (!spec)
    return 0;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  struct xl_ident id = {};
  id.pid = pid_tgid >> 32;
  __u64 seq = 0, kind = 0;
  if (usdt_arg(ctx, &spec->seq, spec->probe_addr, &seq) ||
      (spec->kind.kind != XLAP_ARG_NONE &&
       usdt_arg(ctx, &spec->kind, spec->probe_addr, &kind))) {
    count_loss(spec->point, XLAP_LOSS_PARSE);
    return 0;
  }
  id.seq = seq;
  id.kind = kind;
  id.flags = XLAP_FLAG_SEQ_VALID | XLAP_FLAG_FROM_USER;
  emit(spec->point, now, &id, (__u32)pid_tgid, 0, 0, 0);
  return 0;
}
