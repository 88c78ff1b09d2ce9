/* sock_rx.h: the datagram handed to a traced socket (sock.queue).
 *
 * A cgroup socket filter (cgroup_skb/ingress, attached at the cgroup2 root)
 * runs in the socket's receive path with the skb itself, just before it
 * is queued: the identity is the skb's own, its device point's note of
 * this very skb (rx_slots.h: same address, length and IP header bytes) or
 * read from the datagram here, never paired by order from an earlier
 * point, so GRO batches, list receive and a datagram queued by another CPU
 * keep their own seq. A UDP GRO socket receives a GRO
 * super-packet: one stamp per datagram. */
#ifndef XLAP_CAPTURE_SOCK_RX_H
#define XLAP_CAPTURE_SOCK_RX_H

#include "lib/common.h"
#include "lib/flows.h"
#include "lib/packet.h"
#include "lib/rx_slots.h"
#include "lib/task.h"

/* The flow this CPU last marked foreign: a marker per flow change. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} FOREIGN_LAST SEC(".maps");

/* This program's frame is near the combined stack limit (with the stamp
 * path's frames): the stamp's place and the skb's address wait here, off
 * the stack and out of registers live across the whole program. Softirq
 * work: never nested on a CPU. */
struct xl_queue_scratch {
  struct xl_at at;
  __u64 skb;
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_queue_scratch);
} QUEUE_SCRATCH SEC(".maps");

/* The XLAP_SOCK_* bits `f`, or-ed into a traced socket's flags at once:
 * BPF has no atomic on a byte, so on the 64-bit word the flags share with
 * tgid and port (two CPUs noting two new flows must not undo each
 * other's bit). */
static __always_inline void or_sock_flags(struct xlap_sock *ts, __u8 f) {
  _Static_assert(__builtin_offsetof(struct xlap_sock, flows) == 6,
                 "flows is byte 6 of the socket's first word");
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  __sync_fetch_and_or((__u64 *)ts, (__u64)f << 48);
#else
  __sync_fetch_and_or((__u64 *)ts, (__u64)f << 8);
#endif
}

/* Keeps the flow of the datagrams a traced socket receives, for its
 * receive calls (syscall.h): written only when it changes, the flags
 * before the flow (note_recv_flow reads them in the other order). The
 * first flow is installed by compare-and-swap: two flows' first datagrams
 * noted at once on two CPUs would otherwise both find no flow, both skip
 * the flags, and leave the socket one flow that every read takes. */
static __always_inline void note_flow(struct xlap_sock *ts, __u64 flow) {
  __u64 last = ts->flow;
  if (last == flow)
    return;
  if (!last) {
    last = __sync_val_compare_and_swap(&ts->flow, 0, flow);
    if (!last || last == flow)
      return;
  }
  __u8 f = XLAP_SOCK_MULTI_FLOW;
  if ((last ^ flow) & XLAP_FLOW_LOCAL_MASK)
    f |= XLAP_SOCK_MULTI_LOCAL;
  if ((ts->flows & f) != f)
    or_sock_flags(ts, f);
  asm volatile("" ::: "memory");
  *(volatile __u64 *)&ts->flow = flow;
}

/* Whether the device note `s` is of the datagram at this socket filter's
 * network header: 8 bytes of its IP header (IPv4: id, fragment word, TTL,
 * protocol, checksum), read in place. */
static __always_inline int noted_here(struct __sk_buff *ctx,
                                      const struct xl_rx_slot *s) {
  void *data = (void *)(long)ctx->data;
  void *end = (void *)(long)ctx->data_end;
  if (data + 12 > end)
    return 0;
  __u64 ip8;
  __builtin_memcpy(&ip8, data + 4, 8);
  return ip8 == s->ip8;
}

/* The socket-queue point of a datagram its device point read (rx_slots.h):
 * no second reading. Inlined, on locals whose lifetimes end before the
 * reading path's begin (the program's frame is near the combined stack
 * limit): the stamp is taken from the slot itself. */
static __always_inline void
queue_noted(struct xlap_sock *ts, struct xl_rx_slot *s, __u64 key, __u64 now) {
  s->id.pid = ts->tgid; /* the socket's owner, as the queued note keeps */
  note_flow(ts, s->id.flow);
  __u32 got = s->nseg;
  struct xl_segs *segs = rx_segs(key, &got, XLAP_POINT_SOCK_QUEUE);
  __u32 zero = 0;
  int keep = !s->unsampled;
  struct xl_queue_scratch *q = bpf_map_lookup_elem(&QUEUE_SCRATCH, &zero);
  if (q && keep) {
    q->at.point = XLAP_POINT_SOCK_QUEUE;
    q->at.ts = now;
    emit_all(&q->at, &s->id, segs, got);
  }
  struct xl_rx_last *last = bpf_map_lookup_elem(&RX_LAST, &zero);
  if (last && !keep)
    last->valid = 0;
  else if (last) {
    last->id = s->id;
    if (got > 1 && segs) {
      last->id.seq = segs->seq[(got - 1) & (XLAP_MAX_SEGS - 1)];
      last->id.kind = segs->kind[(got - 1) & (XLAP_MAX_SEGS - 1)];
    }
    last->ts = now;
    last->task = bpf_get_current_task();
    last->valid = 1;
  }
  if (CFG.syscall_hooks) {
    /* The reader's syscall reads its own buffer: the note is spent. */
    if (s->nseg > 1)
      bpf_map_delete_elem(&RX_SEGS, &key);
    rx_free(s, key);
    return;
  }
  /* Queued, for the reader's copy (hooks/calls.h). */
  s->born = now;
  s->owner = (__u64)ts;
  s->state = RX_QUEUED;
  if (!ts->rx_first)
    __sync_val_compare_and_swap(&ts->rx_first, 0, key);
  ts->rx_last2 = ts->rx_last;
  ts->rx_last = key;
}

/* The socket-queue point's parse and stamps, with the parse view `r`
 * taken (ts: the traced socket, or 0 for another socket on a traced
 * port). */
static __always_inline int sock_ingress_at(struct xl_rd *r,
                                           struct __sk_buff *ctx,
                                           struct xlap_sock *ts, __u16 point,
                                           __u64 now) {
  struct xl_dgram d = {};
  rd_init_ctx(r, ctx);
  rd_fill_ctx(r, ctx);
  int ret = parse_ip(r, 0, &d);
  if (ret == XL_FOREIGN)
    return 1;
  if (ret != XL_OK) {
    if (ts)
      count_loss(point,
                 ret == XL_UNREADABLE ? XLAP_LOSS_FRAG : XLAP_LOSS_PARSE);
    return 1;
  }
  /* One identity for both paths below: the socket-queue program's frame
   * is near the combined stack limit (with the stamp path's frames). */
  struct xl_ident id = {};
  if (!ts) {
    /* The recorder drops by flow: one marker per flow is enough, not one
     * per datagram (an untraced server on a traced port may be busy). */
    __u32 zero = 0;
    __u64 *last = bpf_map_lookup_elem(&FOREIGN_LAST, &zero);
    if (last && *last != d.flow) {
      *last = d.flow;
      id.flow = d.flow;
      emit(point, now, &id, 0, 0, 0, 0);
    }
    return 1;
  }
  id.pid = ts->tgid;
  {
    /* The reader's copy finds the datagrams by skb: the context is the
     * kernel's skb. */
    __u32 zero = 0;
    struct xl_queue_scratch *q = bpf_map_lookup_elem(&QUEUE_SCRATCH, &zero);
    if (q && !CFG.syscall_hooks)
      q->skb = (__u64)(long)ctx;
  }
  struct xl_segs *segs;
  __u32 loss = XLAP_LOSS_PARSE, beyond = 0;
  __u32 got = read_datagrams(ctx->gso_size, r, &d, &id, &segs, &loss, &beyond);
  note_flow(ts, d.flow);
  note_tuple(r, &d, ts->cookie, 1);
  if (beyond)
    count_losses(point, loss, beyond);
  if (!got) {
    count_loss(point, loss);
    return 1;
  }
  __u32 zero = 0;
  struct xl_queue_scratch *q = bpf_map_lookup_elem(&QUEUE_SCRATCH, &zero);
  if (!q)
    return 1;
  /* Outside the run's sample (--sample): no stamp, and no wake-up to
   * follow; the reader's copy still finds it by its place in the queue. */
  int keep = got > 1 || sample_keeps(&id);
  q->at.point = point;
  q->at.ts = now;
  if (keep)
    emit_all(&q->at, &id, segs, got);
  /* The reader's wake-up follows for the last of them. */
  struct xl_rx_last *last = bpf_map_lookup_elem(&RX_LAST, &zero);
  if (last && !keep)
    last->valid = 0;
  else if (last) {
    last->id = id;
    if (got > 1 && segs) {
      last->id.seq = segs->seq[(got - 1) & (XLAP_MAX_SEGS - 1)];
      last->id.kind = segs->kind[(got - 1) & (XLAP_MAX_SEGS - 1)];
    }
    last->ts = now;
    last->task = bpf_get_current_task();
    last->valid = 1;
  }
  /* The reader's copy finds them by skb (hooks/calls.h): its stamp needs
   * no second reading. */
  q = bpf_map_lookup_elem(&QUEUE_SCRATCH, &zero);
  if (q && !CFG.syscall_hooks) {
    /* No room (its slot held by a live skb): not counted here, as its
     * read may still be told from the reader's buffer; a read told
     * neither way is counted then (calls_recv_return). */
    if (!rx_put(q->skb, now, &id, segs, got)) {
      rx_own(q->skb, ts);
      /* The first since the last read left the queue empty, and the last
       * (calls.h socket_recv_take). */
      if (!ts->rx_first)
        __sync_val_compare_and_swap(&ts->rx_first, 0, q->skb);
      ts->rx_last2 = ts->rx_last;
      ts->rx_last = q->skb;
    } else if (got > 1) {
      /* A UDP GRO skb: its read, told by nothing else (the reader's buffer
       * is not read for a UDP GRO socket), counts one datagram lost; the
       * others are counted here. */
      count_losses(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_UNMATCHED, got - 1);
    }
  }
  return 1;
}

SEC("cgroup_skb/ingress")
int on_sock_ingress(struct __sk_buff *ctx) {
  RETURN_IF_EMPTY(1);
  struct bpf_sock *sk = ctx->sk;
  if (!sk)
    return 1;
  sk = bpf_sk_fullsock(sk);
  if (!sk || sk->protocol != IPPROTO_UDP_)
    return 1;
  __u16 point = XLAP_POINT_SOCK_QUEUE;
  struct xlap_sock *ts = bpf_sk_storage_get(&SOCKS, sk, 0, 0);
  if (!ts) {
    /* Another socket on a traced port: mark the datagram, so that the
     * device stamps taken for it by port are dropped. */
    __u32 port = sk->src_port;
    __u8 *any = bpf_map_lookup_elem(&PORTS_ANY, &port);
    if (!any || !*any)
      return 1;
    point = XLAP_POINT_SOCK_FOREIGN;
  }
  __u64 now = bpf_ktime_get_ns();
  if (ts) {
    /* The context is the kernel's skb: its device point may have read it. */
    __u64 key = (__u64)(long)ctx;
    struct xl_rx_slot *noted = rx_device_note(key, now, ctx->len);
    if (noted && noted_here(ctx, noted) &&
        flow_noted(noted->id.flow, noted->addr_sig, 1)) {
      queue_noted(ts, noted, key, now);
      return 1;
    }
  }
  struct xl_rd r;
  if (rd_enter(&r)) {
    if (ts)
      count_loss(point, XLAP_LOSS_PARSE);
    return 1;
  }
  sock_ingress_at(&r, ctx, ts, point, now);
  rd_leave(&r);
  return 1;
}

#endif
