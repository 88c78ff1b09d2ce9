/* calls.h: the application/socket boundary at the socket calls
 * (--boundary socket-calls, and --boundary auto below; CFG.syscall_hooks
 * = 0; syscall.h is --boundary syscalls, the default).
 *
 * Why not the syscalls: while any program is attached to sys_enter or
 * sys_exit, the kernel sends every syscall of every task of the machine
 * down its slow path (an untraced getppid loop here: 118 -> 272 ns). The
 * socket calls have tracepoints and hooks of their own, which other work
 * never reaches:
 *
 *   sock.send_enter  cgroup sendmsg4/6, at the start of udp_sendmsg: only
 *                    for a send that names its destination (sendto, or
 *                    sendmsg with msg_name); a connected socket's sends
 *                    have no hook before their datagram exists, so they
 *                    get no send_enter at the socket calls. Stamped as
 *                    the socket call returns, or, in a run without
 *                    sock.send_exit, by the datagram's first device point
 *                    (dev_tx.h send_start_take).
 *   sock.send_exit   sock_send_length, as the socket call returns: the
 *                    datagrams its first device point read in this thread
 *                    (dev_tx.h socket_send_begin).
 *   sock.recv_exit   sock_recv_length, as the read returns: the datagram
 *                    it took, by its place in the socket's queue (see
 *                    socket_recv_take), its identity by its skb
 *                    (rx_slots.h: the socket-queue point read it), or
 *                    from the reader's buffer where the queue cannot tell
 *                    (syscall.h calls_recv_return).
 *
 * --boundary auto (CFG.send_syscalls) adds what the socket
 * calls lack: a connected socket's send_enter is the entry of its send
 * syscall, noted by on_send_syscall (sys_enter). That hook costs the whole
 * machine the slow syscall path, so it is attached only once a traced UDP
 * socket is connected: at attach (the recorder sees it), or at the connect
 * (noted by on_connect4/6, the process held at the connect's route lookup
 * until the recorder attached it; a connect no hook saw, at its first
 * send).
 *
 * Per call, not per syscall: each message of sendmmsg/recvmmsg is its own
 * socket call. Needs Linux >= 6.3 (sock_send_length, sock_recv_length) and
 * the socket-queue point (skb dynptrs for tracing, 6.12): the recorder
 * falls back to the syscall hooks on older kernels. */
#ifndef XLAP_CAPTURE_CALLS_H
#define XLAP_CAPTURE_CALLS_H

#include "lib/common.h"
#include "lib/recv_queue.h"
#include "lib/rx_slots.h"
#include "lib/syscall_nr.h"
#include "lib/task.h"

#define SOCK_DGRAM_ 2
#define SIGSTOP_ 19
#define DNS_PORT_ 53
#define TCP_ESTABLISHED_ 1 /* a connected UDP socket's state */

/* --boundary auto: traced processes held at the connect of a UDP socket
 * until on_send_syscall is attached (struct xlap_hold, why
 * XLAP_HOLD_CONNECT), read by record/send_syscalls.rs. */
struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 12);
} CONNECTS SEC(".maps");

/* Set by the recorder once on_send_syscall is attached (its own section:
 * a map of its own, written while the programs run): no connect is held
 * from then on. */
__u32 SEND_SYSCALLS_ON SEC(".data.send_syscalls") = 0;

/* --boundary auto, once a traced UDP socket is connected: the entry of
 * every send syscall of a traced thread (which socket it sends on is
 * known only later, at its socket call). */
SEC("tp_btf/sys_enter")
int BPF_PROG(on_send_syscall, struct pt_regs *regs, long id) {
  RETURN_IF_EMPTY(0);
  __u32 nr = (__u32)id;
  if (!is_send(nr))
    return 0;
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  if (!t) {
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
      return 0;
    t = bpf_task_storage_get(&TASK_CTX, task, 0,
                             BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!t) {
      count_loss(XLAP_POINT_SOCK_SEND_ENTER, XLAP_LOSS_MAP_FULL);
      return 0;
    }
  }
  t->sys_send_ts = bpf_ktime_get_ns();
  t->sys_send_nr = nr;
  return 0;
}

/* Threads connecting a traced UDP socket (--boundary auto), noted at the
 * connect's cgroup hook (which may not send signals before Linux 6.18) and
 * held where the same connect looks its route up (a tracing program). */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32); /* tid */
  __type(value, __u8);
} CONNECTING SEC(".maps");

/* Holds the current process (SIGSTOP, taken before it returns to user
 * mode) until the recorder attached on_send_syscall and resumed it. */
static __always_inline void hold_for_send_syscalls(void) {
  struct xlap_hold *h = bpf_ringbuf_reserve(&CONNECTS, sizeof(*h), 0);
  if (!h)
    return; /* not held: the recorder is not reading */
  h->ts_ns = bpf_ktime_get_ns();
  h->pid = bpf_get_current_pid_tgid() >> 32;
  h->why = XLAP_HOLD_CONNECT;
  h->stop = bpf_send_signal(SIGSTOP_);
  h->_pad = 0;
  bpf_ringbuf_submit(h, 0); /* wakes the reader at once */
}

static __always_inline int waiting_for_send_syscalls(void) {
  return CFG.send_syscalls && CFG.hold_connect && !SEND_SYSCALLS_ON;
}

/* A traced UDP socket connects (--boundary auto): its sends will not name
 * their destination, so only their syscall's entry shows them begin. The
 * first time, the process is held until the recorder attached
 * on_send_syscall. A resolver's socket (port 53) does not ask for it: its
 * queries lack send_enter (counted), and a job's name lookups do not slow
 * the machine. */
static __always_inline int connect_start(struct bpf_sock_addr *ctx) {
  if (!waiting_for_send_syscalls())
    return 1;
  if (ctx->type != SOCK_DGRAM_ || ctx->protocol != IPPROTO_UDP_ ||
      ctx->user_port == bpf_htons(DNS_PORT_))
    return 1;
  struct bpf_sock *sk = ctx->sk;
  if (!sk || !bpf_sk_storage_get(&SOCKS, sk, 0, 0))
    return 1;
  __u32 tid = (__u32)bpf_get_current_pid_tgid();
  __u8 one = 1;
  bpf_map_update_elem(&CONNECTING, &tid, &one, BPF_ANY);
  return 1; /* never changes nor refuses the connect */
}

SEC("cgroup/connect4")
int on_connect4(struct bpf_sock_addr *ctx) { return connect_start(ctx); }

SEC("cgroup/connect6")
int on_connect6(struct bpf_sock_addr *ctx) { return connect_start(ctx); }

/* The route lookup of a connect noted above (or of any other call of the
 * machine: one hash lookup, while waiting only). A connect that looks no
 * route up (a multicast group on a given device) is held at its first
 * send instead (on_sock_send_length). */
static __always_inline int route_lookup(void) {
  if (!waiting_for_send_syscalls())
    return 0;
  __u32 tid = (__u32)bpf_get_current_pid_tgid();
  if (!tid || !bpf_map_lookup_elem(&CONNECTING, &tid))
    return 0;
  bpf_map_delete_elem(&CONNECTING, &tid);
  hold_for_send_syscalls();
  return 0;
}

SEC("tp_btf/fib_table_lookup")
int BPF_PROG(on_fib_table_lookup, __u32 tb_id) { return route_lookup(); }

SEC("tp_btf/fib6_table_lookup")
int BPF_PROG(on_fib6_table_lookup, const struct net *net) {
  return route_lookup();
}

static __always_inline int send_start(struct bpf_sock_addr *ctx) {
  RETURN_IF_EMPTY(1);
  if (CFG.syscall_hooks || !point_on(XLAP_POINT_SOCK_SEND_ENTER))
    return 1;
  struct bpf_sock *sk = ctx->sk;
  if (!sk)
    return 1;
  struct xlap_sock *ts = bpf_sk_storage_get(&SOCKS, sk, 0, 0);
  if (!ts)
    return 1;
  __u32 zero = 0;
  struct xl_send_start *s = bpf_map_lookup_elem(&SEND_START, &zero);
  __u64 now = bpf_ktime_get_ns();
  __u32 tid = (__u32)bpf_get_current_pid_tgid();
  if (s) {
    s->ts = now;
    s->tid = tid;
    s->cookie = ts->cookie;
  }
  /* Also on the socket: udp_sendmsg may be preempted, or sleep for send
   * buffer, and go on on another CPU, where the note above is not. */
  ts->send_start_ts = now;
  ts->send_start_tid = tid;
  return 1; /* never changes the destination nor refuses the send */
}

SEC("cgroup/sendmsg4")
int on_sendmsg4(struct bpf_sock_addr *ctx) { return send_start(ctx); }

SEC("cgroup/sendmsg6")
int on_sendmsg6(struct bpf_sock_addr *ctx) { return send_start(ctx); }

/* The send points of the datagrams a socket call put on a device. */
SEC("tp_btf/sock_send_length")
int BPF_PROG(on_sock_send_length, struct sock *sk, int ret, int flags) {
  RETURN_IF_EMPTY(0);
  if (CFG.syscall_hooks)
    return 0;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tid = (__u32)pid_tgid;
  /* The start this thread noted, taken whatever the call did: the next
   * call must not find it. */
  struct xlap_sock *ts = bpf_sk_storage_get(&SOCKS, sk, 0, 0);
  __u64 ts_enter = ts ? send_start_of(ts, tid) : 0;
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  if (!t)
    return 0;
  if (t->in_uring) {
    t->in_uring = 0; /* an io_uring send request, issued inline */
    return 0;
  }
  if (!t->in_send)
    return 0;
  t->in_send = 0;
  /* A send that did not name its destination (a connected socket's) has
   * only its syscall's entry; a start noted before that entry is not this
   * call's (left on this CPU by a thread that moved). */
  __u64 sys_enter = send_syscall_entry(task, t);
  if (sys_enter > ts_enter)
    ts_enter = sys_enter;
  struct xl_send_ctx *sc = &t->send;
  struct xl_at at = {.tid = tid, .scope = bpf_get_current_cgroup_id()};
  struct xl_ident id = sc->id;
  id.pid = pid_tgid >> 32;
  __u32 n = sc->n;
  if (n) {
    if (ts_enter) {
      at.point = XLAP_POINT_SOCK_SEND_ENTER;
      at.ts = ts_enter;
      emit_all(&at, &id, &sc->segs, n);
    } else if (CFG.send_syscalls && point_on(XLAP_POINT_SOCK_SEND_ENTER)) {
      /* Its start is not known: a resolver's socket, a socket connected
       * where no hook saw it, or marked late (said in run.json). Unless it
       * is a resolver's, its process is held until the send syscalls are
       * hooked: only this send lacks it. */
      count_losses(XLAP_POINT_SOCK_SEND_ENTER, XLAP_LOSS_UNMATCHED, n);
      if (waiting_for_send_syscalls() &&
          sk->__sk_common.skc_state == TCP_ESTABLISHED_ &&
          sk->__sk_common.skc_dport != bpf_htons(DNS_PORT_))
        hold_for_send_syscalls();
    }
    /* One datagram outside the sample (--sample): no clock read. */
    if (point_on(XLAP_POINT_SOCK_SEND_EXIT) && (n > 1 || sample_keeps(&id))) {
      at.point = XLAP_POINT_SOCK_SEND_EXIT;
      at.ts = bpf_ktime_get_ns();
      emit_all(&at, &id, &sc->segs, n);
    }
  }
  if (sc->beyond) {
    if (ts_enter)
      count_losses(XLAP_POINT_SOCK_SEND_ENTER, XLAP_LOSS_GSO, sc->beyond);
    count_losses(XLAP_POINT_SOCK_SEND_EXIT, XLAP_LOSS_GSO, sc->beyond);
  }
  if (sc->unread) {
    if (ts_enter)
      count_losses(XLAP_POINT_SOCK_SEND_ENTER, sc->unread_loss, sc->unread);
    count_losses(XLAP_POINT_SOCK_SEND_EXIT, sc->unread_loss, sc->unread);
  }
  return 0;
}

/* A datagram past the socket-queue point that the socket then dropped (its
 * receive buffer full): it will not be read, nor be the first to be. */
SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(on_udp_fail_queue_rcv_skb, int rc, struct sock *sk,
             struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  if (CFG.syscall_hooks || !skb)
    return 0;
  struct xlap_sock *s = traced_sock(sk);
  if (!s)
    return 0;
  __u64 key = (__u64)skb;
  __sync_val_compare_and_swap(&s->rx_first, key, 0);
  __sync_val_compare_and_swap(&s->rx_last, key, 0);
  __sync_val_compare_and_swap(&s->rx_last2, key, 0);
  struct xl_rx_slot *slot = rx_find(key);
  if (slot) {
    if (slot->nseg > 1)
      bpf_map_delete_elem(&RX_SEGS, &key);
    rx_free(slot, key);
  }
  return 0;
}

#endif
