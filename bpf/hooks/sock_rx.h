/* sock_rx.h: the datagram handed to a traced socket (sock.queue).
 *
 * A cgroup socket filter (cgroup_skb/ingress, attached at the cgroup2 root)
 * runs in the socket's receive path with the skb itself, just before it
 * is queued: the identity is read from the datagram, never paired from an
 * earlier point, so GRO batches, list receive and a datagram queued by
 * another CPU keep their own seq. A UDP GRO socket receives a GRO
 * super-packet: one stamp per datagram. */
#ifndef XLAP_CAPTURE_SOCK_RX_H
#define XLAP_CAPTURE_SOCK_RX_H

#include "lib/common.h"
#include "lib/flows.h"
#include "lib/packet.h"
#include "lib/task.h"

/* The flow this CPU last marked foreign: a marker per flow change. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} FOREIGN_LAST SEC(".maps");

/* Keeps the flow of the datagrams a traced socket receives, for its
 * receive calls (syscall.h): written only when it changes, the flags
 * before the flow (note_recv_flow reads them in the other order). */
static __always_inline void note_flow(struct xlap_sock *ts, __u64 flow) {
  __u64 last = ts->flow;
  if (last == flow)
    return;
  if (last) {
    __u8 f = ts->flows | XLAP_SOCK_MULTI_FLOW;
    if ((last ^ flow) & XLAP_FLOW_LOCAL_MASK)
      f |= XLAP_SOCK_MULTI_LOCAL;
    *(volatile __u8 *)&ts->flows = f;
  }
  asm volatile("" ::: "memory");
  *(volatile __u64 *)&ts->flow = flow;
}

SEC("cgroup_skb/ingress")
int on_sock_ingress(struct __sk_buff *ctx) {
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
  struct xl_rd r;
  struct xl_dgram d = {};
  rd_init_ctx(&r, ctx);
  rd_fill_ctx(&r, ctx);
  int ret = parse_ip(&r, 0, &d);
  if (ret == XL_FOREIGN)
    return 1;
  if (ret != XL_OK) {
    if (ts)
      count_loss(point,
                 ret == XL_UNREADABLE ? XLAP_LOSS_FRAG : XLAP_LOSS_PARSE);
    return 1;
  }
  if (!ts) {
    /* The recorder drops by flow: one marker per flow is enough, not one
     * per datagram (an untraced server on a traced port may be busy). */
    __u32 zero = 0;
    __u64 *last = bpf_map_lookup_elem(&FOREIGN_LAST, &zero);
    if (last && *last != d.flow) {
      *last = d.flow;
      struct xl_ident id = {.flow = d.flow};
      emit(point, now, &id, 0, 0, 0, 0);
    }
    return 1;
  }
  struct xl_ident id = {.pid = ts->tgid};
  struct xl_segs *segs;
  __u32 loss = XLAP_LOSS_PARSE, beyond = 0;
  __u32 got = read_datagrams(ctx->gso_size, &r, &d, &id, &segs, &loss, &beyond);
  note_flow(ts, d.flow);
  note_tuple(&r, &d, ts->cookie, 1);
  if (beyond)
    count_losses(point, loss, beyond);
  if (!got) {
    count_loss(point, loss);
    return 1;
  }
  struct xl_at at = {.point = point, .ts = now};
  emit_all(&at, &id, segs, got);
  /* The reader's wake-up follows for the last of them. */
  __u32 zero = 0;
  struct xl_rx_last *last = bpf_map_lookup_elem(&RX_LAST, &zero);
  if (last) {
    last->id = id;
    if (got > 1 && segs) {
      last->id.seq = segs->seq[(got - 1) & (XLAP_MAX_SEGS - 1)];
      last->id.kind = segs->kind[(got - 1) & (XLAP_MAX_SEGS - 1)];
    }
    last->ts = now;
    last->valid = 1;
  }
  return 1;
}

#endif
