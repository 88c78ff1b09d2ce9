/* dev_tx.h: the device transmit points (net_dev_queue, net_dev_start_xmit,
 * net_dev_xmit) and the skb -> identity map that carries a datagram's
 * identity from the socket down to the device that puts it on the wire.
 *
 * Identity is taken once, at the first device the skb is queued on; a
 * stacked device (macvlan, VLAN, a tunnel) queues the same skb on its lower
 * device, which only deepens the entry, so the lower device's qdisc and
 * transmit points stamp the same datagram. The entry ends when the last
 * device has transmitted it (or the skb is dropped). */
#ifndef XLAP_CAPTURE_DEV_TX_H
#define XLAP_CAPTURE_DEV_TX_H

#include "lib/common.h"
#include "lib/flows.h"
#include "lib/packet.h"
#include "lib/task.h"
#include "lib/tx.h"

/* Appends the datagrams of an skb to the send call's list. */
static __always_inline void send_append(struct xl_send_ctx *sc,
                                        const struct xl_ident *id,
                                        const struct xl_segs *segs, __u32 n,
                                        __u32 beyond) {
  sc->beyond += beyond;
  for (__u32 i = 0; i < XLAP_MAX_SEGS; i++) {
    if (i >= n)
      break;
    __u32 at = sc->n;
    if (at >= XLAP_MAX_SEGS) {
      sc->beyond += n - i;
      break;
    }
    __u64 seq = i == 0 || !segs ? id->seq : segs->seq[i];
    __u32 kind = i == 0 || !segs ? id->kind : segs->kind[i];
    if (at == 0)
      sc->id = *id;
    sc->n = at + 1;
    at &= XLAP_MAX_SEGS - 1;
    asm volatile("" : "+r"(at)); /* index the masked value */
    sc->segs.seq[at] = seq;
    sc->segs.kind[at] = kind;
  }
  if (sc->n)
    sc->id.seq = sc->segs.seq[0], sc->id.kind = sc->segs.kind[0];
}

/* Datagrams of the send call `sc` (if any) its device point could not
 * read: the send points lose them too (counted at the call's exit). */
static __always_inline void send_unread(struct xl_send_ctx *sc, __u32 loss,
                                        __u32 n) {
  if (!sc)
    return;
  sc->unread += n;
  sc->unread_loss = loss;
}

/* An skb of a traced process whose datagrams its first device point could
 * not read: its later points count them lost for the same reason, instead
 * of passing them by unseen. */
static __always_inline void tx_put_unread(struct sk_buff *skb, __u64 key,
                                          __u32 loss, __u32 n) {
  struct xl_tx e = {
      .sk = (__u64)skb->sk, .beyond = n, .depth = 1, .unread_loss = loss};
  tx_put(key, &e);
}

/* This CPU's send start record (task.h), for a send without call state by
 * thread `*tid`; 0 in a run with call state, or outside a thread (softirq
 * work on an idle CPU: no send call). */
static __always_inline struct xl_send_start *send_start_record(__u32 *tid) {
  if (CFG.syscall_hooks || CFG.send_calls)
    return 0;
  *tid = (__u32)bpf_get_current_pid_tgid();
  if (!*tid)
    return 0;
  __u32 zero = 0;
  return bpf_map_lookup_elem(&SEND_START, &zero);
}

/* Without sock_send_length (CFG.send_calls = 0, at the socket calls) a
 * send keeps no call state: its first device point takes the start that
 * cgroup sendmsg4/6 noted for this thread and socket on this CPU, and
 * stamps sock.send_enter itself (the moment is the same; a send without
 * a destination has none, as at the socket calls, but under --boundary
 * auto the entry of its send syscall). Returns the start, or 0 (none; or
 * an io_uring request issued inline, which uring.h stamps). `unknown`:
 * the datagrams to count lost (unmatched) when --boundary auto finds no
 * start for them (0: counted elsewhere). */
static __always_inline __u64 send_start_take(__u64 cookie, __u32 unknown) {
  __u32 tid;
  struct xl_send_start *st = send_start_record(&tid);
  if (!st)
    return 0;
  int noted = st->tid == tid && st->cookie == cookie;
  if (!noted && !CFG.send_syscalls)
    return 0;
  __u64 ts = 0;
  if (noted) {
    ts = st->ts;
    st->tid = 0;
  }
  if (!URING_SENDS_SEEN && !CFG.send_syscalls)
    return ts;
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  if (URING_SENDS_SEEN && t && t->in_uring) {
    /* Cleared when taken: a request punted to a worker leaves it set, and
     * costs at most the thread's next send_enter. */
    if (noted)
      t->in_uring = 0;
    return 0;
  }
  /* A start noted before the syscall's entry is not this call's. */
  __u64 sys_enter = send_syscall_entry(task, t);
  if (sys_enter > ts)
    ts = sys_enter;
  if (!ts && unknown && point_on(XLAP_POINT_SOCK_SEND_ENTER))
    count_losses(XLAP_POINT_SOCK_SEND_ENTER, XLAP_LOSS_UNMATCHED, unknown);
  return ts;
}

/* The first fragment of a send without call state (its identity `e`),
 * kept for its later fragments (which carry no UDP header). A function of
 * its own, called once the first device point's frame is gone: inlined
 * there, it pushed that frame past the stack limit. */
static __attribute__((noinline)) int send_note_fragment(__u64 cookie,
                                                        const struct xl_tx *e) {
  __u32 tid;
  struct xl_send_start *st = send_start_record(&tid);
  if (!st || !e)
    return 0;
  st->frag = e->id;
  st->frag_cookie = cookie;
  st->frag_tid = tid;
  return 0;
}

/* The datagram a later fragment belongs to: the last one this send call
 * fragmented (its call state, or without one the first fragment noted on
 * this CPU by this thread for this socket). Returns 0 if unknown. */
static __always_inline int
later_fragment_of(struct xl_send_ctx *sc, __u64 cookie, struct xl_ident *id) {
  if (sc) {
    if (!sc->n)
      return 0;
    *id = sc->id;
    __u32 last = (sc->n - 1) & (XLAP_MAX_SEGS - 1);
    id->seq = sc->segs.seq[last];
    id->kind = sc->segs.kind[last];
    return 1;
  }
  __u32 tid;
  struct xl_send_start *st = send_start_record(&tid);
  if (!st || st->frag_tid != tid || st->frag_cookie != cookie)
    return 0;
  *id = st->frag;
  return 1;
}

/* tx_first_queue with the parse view `r` taken. */
static __always_inline void
tx_first_queue_at(struct xl_rd *r, struct sk_buff *skb, __u64 key, __u32 tgid,
                  __u64 cookie, struct xl_send_ctx *sc, __u16 point) {
  struct xl_dgram d = {};
  int ret = parse_tx(skb, r, &d);
  if (ret == XL_FOREIGN)
    return;
  struct xl_ident id = {.pid = tgid};
  if (ret == XL_LATER_FRAGMENT) {
    /* A later fragment carries no UDP header: it belongs to the datagram
     * this send call fragmented just before (not counted: not a datagram). */
    if (!later_fragment_of(sc, cookie, &id))
      return;
    id.flags |= XLAP_FLAG_FRAGMENT;
    struct xl_tx e = {.id = id, .sk = (__u64)skb->sk, .nseg = 1, .depth = 1};
    if (tx_put(key, &e) == 0 && iface_allowed(skb->dev))
      stamp_tx(point, key, &e, skb->dev, skb->queue_mapping, skb->priority);
    return;
  }
  if (ret != XL_OK) {
    __u32 reason = ret == XL_UNREADABLE ? XLAP_LOSS_FRAG : XLAP_LOSS_PARSE;
    count_loss(point, reason);
    send_unread(sc, reason, 1);
    if (!sc && send_start_take(cookie, 0))
      count_loss(XLAP_POINT_SOCK_SEND_ENTER, reason);
    tx_put_unread(skb, key, reason, 1);
    return;
  }
  struct xl_segs *segs;
  __u32 loss = XLAP_LOSS_PARSE, beyond = 0;
  /* A UDP GSO skb always has its payload in page fragments (the stack
   * builds it paged): a linear skb is one datagram, without reading its
   * shared info (a probe read that cost a tenth of this point). */
  __u32 gso = skb->data_len ? skb_gso_size(skb) : 0;
  __u32 got = read_datagrams(gso, r, &d, &id, &segs, &loss, &beyond);
  if (!got) {
    count_losses(point, loss, 1 + beyond);
    send_unread(sc, loss, 1 + beyond);
    if (!sc && send_start_take(cookie, 0))
      count_losses(XLAP_POINT_SOCK_SEND_ENTER, loss, 1 + beyond);
    tx_put_unread(skb, key, loss, 1 + beyond);
    return;
  }
  note_tuple(r, &d, cookie, 0);
  struct xl_tx e = {.id = id,
                    .sk = (__u64)skb->sk,
                    .nseg = got,
                    .beyond = beyond,
                    .depth = 1,
                    .unsampled = got == 1 && !beyond && !sample_keeps(&id),
                    .first_fragment = d.frag == 1};
  if (got > 1 && segs) {
    if (bpf_map_update_elem(&SKB_SEGS, &key, segs, BPF_ANY) == 0)
      __sync_fetch_and_add(&GSO_PENDING, 1);
    else
      e.nseg = 1, e.beyond += got - 1;
  }
  if (tx_put(key, &e))
    count_losses(point, XLAP_LOSS_MAP_FULL, got + beyond);
  __u64 enter = 0;
  if (sc)
    send_append(sc, &id, segs, e.nseg, e.beyond);
  else if ((enter = send_start_take(cookie, e.nseg + e.beyond)) && e.beyond)
    count_losses(XLAP_POINT_SOCK_SEND_ENTER, XLAP_LOSS_GSO, e.beyond);
  /* One stamp place for send_enter and this point: the frame is near the
   * stack limit. */
  struct xl_at at = {.point = XLAP_POINT_SOCK_SEND_ENTER,
                     .ts = enter,
                     .tid = (__u32)bpf_get_current_pid_tgid()};
  if (enter) {
    /* The sender's cgroup: a helper call only for that stamp (the device
     * point's scope is its network namespace). */
    at.scope = bpf_get_current_cgroup_id();
    emit_all(&at, &id, segs, e.nseg);
  }
  if (!e.unsampled && point_on(point) && iface_allowed(skb->dev)) {
    at.point = point;
    at.ts = bpf_ktime_get_ns();
    at.ifindex = skb->dev->ifindex;
    at.priority = skb->priority;
    at.queue = skb->queue_mapping;
    at.scope = dev_scope(skb->dev);
    emit_all(&at, &id, segs, e.nseg);
    if (e.beyond)
      count_losses(point, loss, e.beyond);
  }
}

/* Takes the identity of an skb of a traced process at its first device. */
static __always_inline void tx_first_queue(struct sk_buff *skb, __u64 key,
                                           __u32 tgid, __u64 cookie,
                                           struct xl_send_ctx *sc,
                                           __u16 point) {
  struct xl_rd r;
  if (rd_enter(&r)) {
    count_loss(point, XLAP_LOSS_PARSE);
    return;
  }
  tx_first_queue_at(&r, skb, key, tgid, cookie, sc, point);
  rd_leave(&r);
}

/* Whether the skb comes from a traced socket, and the process that sent
 * it: the thread in its send call (a forked child sending on an inherited
 * socket is itself), else the socket's owner (sent later, from softirq).
 * Decided by the socket, not the thread: other traffic the stack forwards
 * while a traced thread sends (bridge, NAT) is not ours. A socket that got
 * its port only now (autobound by this send or a connect) is registered
 * for the replies. */
static __always_inline __u32 tx_owner(struct sk_buff *skb,
                                      struct xl_send_ctx **sc, __u64 *cookie) {
  *sc = 0;
  struct sock *sk = skb->sk;
  struct xlap_sock *s = traced_sock(sk);
  if (!s)
    return 0;
  *cookie = s->cookie;
  __u16 port = sk->__sk_common.skc_num;
  if (port != s->port)
    register_port(s, sk->__sk_common.skc_net.net->ns.inum, port);
  if (!CFG.syscall_hooks && !CFG.send_calls) {
    /* No call state (send_start_take): the sending thread's process if it
     * is traced, else the socket's owner. The thread's start, which it may
     * have noted on another CPU, is noted on this one for
     * send_start_take. */
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    __u32 tid = (__u32)pid_tgid, zero = 0;
    __u64 start = tid ? send_start_of(s, tid) : 0;
    struct xl_send_start *st =
        start ? bpf_map_lookup_elem(&SEND_START, &zero) : 0;
    if (st) {
      st->ts = start;
      st->tid = tid;
      st->cookie = s->cookie;
    }
    __u32 tgid = pid_tgid >> 32;
    if (tgid == s->tgid || bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
      return tgid;
    return s->tgid;
  }
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  if (t && t->in_send) {
    *sc = &t->send;
    return bpf_get_current_pid_tgid() >> 32;
  }
  if (!CFG.syscall_hooks && (t = socket_send_begin(task, t, s->tgid))) {
    *sc = &t->send;
    return task->tgid;
  }
  return s->tgid;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(on_net_dev_queue, struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  __u64 key = (__u64)skb;
  struct xl_tx *e = tx_find(key);
  if (e && tx_requeued_below(key, skb, e)) {
    /* Queued again while an upper device has not finished with it: the
     * lower device of a stacked or tunnel device. */
    if (e->depth < TX_DEPTH_MAX)
      e->depth++;
    if (iface_allowed(skb->dev))
      stamp_tx(XLAP_POINT_DEV_QUEUE, key, e, skb->dev, skb->queue_mapping,
               skb->priority);
    return 0;
  }
  if (e)
    tx_forget(key, e); /* an earlier skb's identity at this address */
  struct xl_send_ctx *sc;
  __u64 cookie = 0;
  __u32 tgid = tx_owner(skb, &sc, &cookie);
  if (!tgid)
    return 0;
  tx_first_queue(skb, key, tgid, cookie, sc, XLAP_POINT_DEV_QUEUE);
  if (!sc && !CFG.syscall_hooks && !CFG.send_calls) {
    e = tx_find(key); /* what tx_first_queue stored */
    if (e && e->first_fragment)
      send_note_fragment(cookie, e);
  }
  return 0;
}

SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(on_net_dev_start_xmit, struct sk_buff *skb,
             struct net_device *dev) {
  RETURN_IF_EMPTY(0);
  __u64 key = (__u64)skb;
  struct xl_tx *e = tx_find(key);
  if (e && e->started < e->depth) {
    e->started++;
    tx_note_driver(key);
    if (iface_allowed(dev))
      stamp_tx(XLAP_POINT_DEV_START_XMIT, key, e, dev, skb->queue_mapping,
               skb->priority);
    return 0;
  }
  /* Every device that queued this entry's skb is already in its driver:
   * it is an earlier skb's at this address (its transmit point missed
   * it), never to be stamped under this one's seq. */
  if (e)
    tx_forget(key, e);
  /* An skb the stack made after the queue point (a segment of a GSO skb
   * the device cannot send whole, segmented in software on the way from
   * the qdisc to the driver), or one whose queue point missed it: its own
   * headers say which datagram it is. */
  if (!skb->sk)
    return 0;
  struct xl_send_ctx *sc;
  __u64 cookie = 0;
  __u32 tgid = tx_owner(skb, &sc, &cookie);
  if (tgid)
    tx_first_queue(skb, key, tgid, cookie, 0, XLAP_POINT_DEV_START_XMIT);
  return 0;
}

SEC("tp_btf/net_dev_xmit")
int BPF_PROG(on_net_dev_xmit, struct sk_buff *skb, int rc,
             struct net_device *dev, unsigned int skb_len) {
  RETURN_IF_EMPTY(0);
  /* Only the map is consulted: the driver may have freed or forwarded the
   * skb already, so its contents are not read here. */
  __u64 key = (__u64)skb;
  struct xl_tx *e = tx_find(key);
  if (!e)
    return 0;
  if (e->started)
    e->started--;
  tx_note_driver(0);
  if (rc == NETDEV_TX_BUSY_)
    return 0; /* requeued: it comes back through the qdisc */
  /* rc 0: sent. Otherwise dropped or congested on a lower device (an
   * upper device returns its lower queue's verdict): no stamp. */
  if (rc == 0 && iface_allowed(dev))
    stamp_tx(XLAP_POINT_DEV_XMIT, key, e, dev, 0, 0);
  if (e->depth > 1)
    e->depth--;
  else
    tx_forget(key, e); /* the skb may be freed and its address reused */
  return 0;
}

/* A dropped skb: its identity must not pass to the next skb at its
 * address. */
SEC("tp_btf/kfree_skb")
int BPF_PROG(on_kfree_skb, struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  __u64 key = (__u64)skb;
  struct xl_tx *e = tx_find(key);
  if (e)
    tx_forget(key, e);
  return 0;
}

/* A GSO skb freed after software segmentation (its segments went on). */
SEC("tp_btf/consume_skb")
int BPF_PROG(on_consume_skb, struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  if (!GSO_PENDING)
    return 0;
  __u64 key = (__u64)skb;
  struct xl_tx *e = tx_find(key);
  if (e && e->nseg > 1)
    tx_forget(key, e);
  return 0;
}

#endif
