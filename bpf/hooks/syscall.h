/* syscall.h: the application/socket boundary at the send and receive
 * syscalls of the traced processes (tp_btf on sys_enter/sys_exit;
 * --boundary syscalls, the default, CFG.syscall_hooks, and the fallback of
 * calls.h before Linux 6.12), and the return of the socket calls' reads
 * (sock_recv_length), which both share: the socket hint of a receive
 * syscall, or the read itself at the socket calls. */
#ifndef XLAP_CAPTURE_SYSCALL_H
#define XLAP_CAPTURE_SYSCALL_H

#include "lib/common.h"
#include "lib/packet.h"
#include "lib/recv_queue.h"
#include "lib/syscall_nr.h"
#include "lib/task.h"
#include "lib/user_view.h"

/* tp_btf (not raw_tp) on the syscall tracepoints: the syscall number and
 * the saved user registers are plain loads, and the number is tested before
 * any map lookup, so the other syscalls of the machine cost almost nothing. */
SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id) {
  RETURN_IF_EMPTY(0);
  __u32 nr = (__u32)id;
  int send = is_send(nr), recv = is_recv(nr), wait = is_wait(nr);
  if (!send && !recv && !wait)
    return 0;
  /* A thread with call state belongs to a traced process: no need to look
   * its process up (task storage is cheaper than the hash). */
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!t && !bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return 0;
  if (!t)
    t = bpf_task_storage_get(&TASK_CTX, task, 0,
                             BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!t) {
    count_loss(send   ? XLAP_POINT_SOCK_SEND_ENTER
               : wait ? XLAP_POINT_SCHED_WAKEUP
                      : XLAP_POINT_SOCK_RECV_EXIT,
               XLAP_LOSS_MAP_FULL);
    return 0;
  }
  if (wait) {
    /* An event loop waiting: a datagram that makes one of its sockets
     * readable wakes it (sched.h). */
    t->in_wait = 1;
    return 0;
  }
  t->in_send = send;
  t->in_recv = recv;
  t->on_sock = 0;
  t->rx_flow = 0;
  t->rx_remote = 0;
  if (send) {
    t->send.ts_enter = bpf_ktime_get_ns();
    t->send.n = 0;
    t->send.beyond = 0;
    t->send.unread = 0;
  }
  return 0;
}

/* The send points of every datagram the call put on a device. */
static __always_inline void stamp_send(struct xl_send_ctx *sc, __u32 tgid,
                                       __u32 tid) {
  struct xl_at at = {.tid = tid, .scope = bpf_get_current_cgroup_id()};
  struct xl_ident id = sc->id;
  id.pid = tgid;
  at.point = XLAP_POINT_SOCK_SEND_ENTER;
  at.ts = sc->ts_enter;
  emit_all(&at, &id, &sc->segs, sc->n);
  at.point = XLAP_POINT_SOCK_SEND_EXIT;
  at.ts = bpf_ktime_get_ns();
  emit_all(&at, &id, &sc->segs, sc->n);
  if (sc->beyond) {
    count_losses(XLAP_POINT_SOCK_SEND_ENTER, XLAP_LOSS_GSO, sc->beyond);
    count_losses(XLAP_POINT_SOCK_SEND_EXIT, XLAP_LOSS_GSO, sc->beyond);
  }
}

/* Segments 1.. of a UDP GRO read (a bpf_loop body). */
struct xl_recv_loop {
  const struct xl_uview *v;
  __u64 len, ts, flow;
  __u32 gso, n, tgid, tid;
  __u16 port;
};

static long stamp_recv_seg(__u32 idx, void *ctx) {
  struct xl_recv_loop *c = ctx;
  __u32 i = idx + 1;
  if (i >= c->n)
    return 1;
  __u64 at = (__u64)i * c->gso;
  emit_recv(c->v, at, i == c->n - 1 ? c->len - at : c->gso, c->ts, c->tgid,
            c->tid, c->flow, c->port, 0);
  return 0;
}

/* The receive point of every datagram a receive call returned: one, or
 * several of gso bytes each (a UDP GRO socket). The first inline (the
 * common case costs no bpf_loop call); the others through bpf_loop: one
 * check of the body whatever the field offsets (an open loop over 64
 * segments made the verifier give up for some layouts). */
static __always_inline void stamp_recv(const struct xl_uview *v, __u64 len,
                                       __u32 gso, __u32 tgid, __u32 tid,
                                       __u64 ts, __u64 flow, __u16 port,
                                       struct xl_task *t) {
  __u32 n = gso && len > gso ? (len + gso - 1) / gso : 1;
  emit_recv(v, 0, n > 1 ? gso : len, ts, tgid, tid, flow, port, t);
  if (n == 1)
    return;
  struct xl_recv_loop c = {.v = v,
                           .len = len,
                           .ts = ts,
                           .flow = flow,
                           .port = port,
                           .gso = gso,
                           .n = n > XLAP_MAX_SEGS ? XLAP_MAX_SEGS : n,
                           .tgid = tgid,
                           .tid = tid};
  bpf_loop(XLAP_MAX_SEGS - 1, stamp_recv_seg, &c, 0);
  if (n > XLAP_MAX_SEGS)
    count_losses(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_GSO, n - XLAP_MAX_SEGS);
}

/* The flow of a datagram read from a socket that receives several: the
 * socket's local half completed by the sender address the call returned
 * (`name`, `namelen` bytes), 0 without one. An IPv4 sender on a dual-stack
 * socket comes as a mapped IPv6 address: folded as the IPv4 one. */
static __attribute__((noinline)) __u64 with_sender(__u64 local, __u64 name,
                                                   __u32 namelen) {
  __u8 a[24] = {};
  if (!name || namelen < 8 ||
      bpf_probe_read_user(a, namelen >= 24 ? 24 : 8, (void *)name))
    return 0;
  __u16 family = a[0] | (__u16)a[1] << 8;
  __u16 port = (__u16)a[2] << 8 | a[3];
  __u32 w[4];
  __builtin_memcpy(w, a + 8, 16);
  __u32 fold;
  if (family == AF_INET_)
    __builtin_memcpy(&fold, a + 4, 4), fold = fold16(&fold, 1);
  else if (family == AF_INET6_ && namelen >= 24) {
    int mapped = !w[0] && !w[1] && w[2] == bpf_htonl(0xffff);
    fold = mapped ? fold16(&w[3], 1) : fold16(w, 4);
  } else
    return 0;
  return local | make_flow(fold, 0, port, 0);
}

/* with_sender for recvfrom: src_addr and the length the kernel wrote to
 * *addrlen. */
static __always_inline __u64 sender_of_recvfrom(__u64 local,
                                                struct pt_regs *regs) {
  __u32 len = 0;
  if (!regs->r8 || !regs->r9 ||
      bpf_probe_read_user(&len, sizeof(len), (void *)regs->r9))
    return 0;
  return with_sender(local, regs->r8, len);
}

/* The first fields of struct user_msghdr, as laid out there. */
struct xl_msg_head {
  void *msg_name;
  int msg_namelen;
  struct iovec *msg_iov;
  __kernel_size_t msg_iovlen;
};

_Static_assert(__builtin_offsetof(struct xl_msg_head, msg_iovlen) ==
                   __builtin_offsetof(struct user_msghdr, msg_iovlen),
               "xl_msg_head is the head of user_msghdr");

/* One message of a recvmmsg (a bpf_loop body). */
struct xl_mmsg_loop {
  __u64 vec; /* struct mmsghdr[] in user memory */
  __u64 ts;
  __u64 flow; /* the socket's flow, or its local half (remote) */
  __u32 n, tgid, tid;
  __u16 port; /* the socket's local port */
  __u8 remote;
  /* Room for the message being read: in the caller's frame, whose deepest
   * point is elsewhere, rather than in the loop body's, which is on a call
   * chain with the stamp path's frames (512 bytes in all). */
  struct xl_msg_head msg;
  __u32 mlen;
};

/* struct mmsghdr: a msghdr, then the message's length. */
#define MMSGHDR_SIZE 64

static long stamp_mmsg(__u32 i, void *ctx) {
  struct xl_mmsg_loop *c = ctx;
  if (i >= c->n)
    return 1;
  /* Only the head of the msghdr (name and iovecs), not all of it. */
  struct xl_msg_head *msg = &c->msg;
  __u64 at = c->vec + (__u64)i * MMSGHDR_SIZE;
  struct xl_uview v = {};
  if (bpf_probe_read_user(msg, sizeof(*msg), (void *)at) ||
      bpf_probe_read_user(&c->mlen, sizeof(c->mlen),
                          (void *)at + sizeof(struct user_msghdr)) ||
      iov_view(msg->msg_iov, msg->msg_iovlen, &v)) {
    count_loss(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_PARSE);
    return 0;
  }
  __u64 flow =
      c->remote ? with_sender(c->flow, (__u64)msg->msg_name, msg->msg_namelen)
                : c->flow;
  emit_recv(&v, 0, c->mlen, c->ts, c->tgid, c->tid, flow, c->port, 0);
  return 0;
}

/* A receive call's socket without sock_recv_length (Linux < 6.3, where
 * CFG.recv_by_fd is set): the socket behind file descriptor `fd` of the
 * current task (a traced process), taken when it is a UDP socket on a
 * traced port: whichever traced process registered the port, as a
 * preforked worker reads the socket its parent bound. No socket storage
 * here (the pointer is read, not trusted), so no flow either: the reads
 * carry the port only. */
static __attribute__((noinline)) int recv_sock_by_fd(struct xl_task *t,
                                                     __u64 fd) {
  struct task_struct *task = bpf_get_current_task_btf();
  struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
  if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
    return 0;
  struct file **fds = BPF_CORE_READ(fdt, fd);
  struct file *f = 0;
  if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
    return 0;
  if ((BPF_CORE_READ(f, f_inode, i_mode) & 0170000) != 0140000)
    return 0; /* not a socket */
  struct socket *sock = BPF_CORE_READ(f, private_data);
  struct sock *sk = BPF_CORE_READ(sock, sk);
  if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_UDP_)
    return 0;
  struct xlap_port_key pk = {
      .netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum),
      .port = BPF_CORE_READ(sk, __sk_common.skc_num)};
  if (!bpf_map_lookup_elem(&TARGET_PORTS, &pk))
    return 0;
  t->on_sock = 1;
  t->rx_port = pk.port;
  t->rx_remote = 0;
  t->rx_flow = 0;
  return 0;
}

/* The context of a receive call of a traced process that began before
 * tracing (`t` its thread's context, if any); 0 for other processes. */
static __always_inline struct xl_task *
recv_begun_before(struct task_struct *task, struct xl_task *t) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return t;
  if (!t)
    t = bpf_task_storage_get(&TASK_CTX, task, 0,
                             BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (t) {
    t->in_send = 0;
    t->in_recv = 1;
    t->on_sock = 0;
  }
  return t;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret) {
  RETURN_IF_EMPTY(0);
  __u32 nr = (__u32)regs->orig_ax;
  int send = is_send(nr), wait = is_wait(nr);
  if (!send && !wait && !is_recv(nr))
    return 0;
  /* Only threads of traced processes have call contexts. */
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  /* Without sock_recv_length (CFG.recv_by_fd), a receive call that began
   * before tracing did has no entry context: it gets one here, as that
   * tracepoint gives it on newer kernels (the arguments are in regs). */
  if (CFG.recv_by_fd && ret > 0 && !send && !wait && (!t || !t->in_recv))
    t = recv_begun_before(task, t);
  if (!t)
    return 0;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
  if (wait) {
    if (t->in_wait) {
      t->in_wait = 0;
      /* Woken but never switched out (it was still running): spent. */
      forget_woken(t);
    }
    return 0;
  }
  if (send) {
    if (!t->in_send)
      return 0;
    t->in_send = 0;
    /* Only a call that put a UDP datagram on a device is a send. */
    if (t->send.n)
      stamp_send(&t->send, tgid, tid);
    if (t->send.unread) {
      count_losses(XLAP_POINT_SOCK_SEND_ENTER, t->send.unread_loss,
                   t->send.unread);
      count_losses(XLAP_POINT_SOCK_SEND_EXIT, t->send.unread_loss,
                   t->send.unread);
    }
    return 0;
  }
  if (!t->in_recv)
    return 0;
  t->in_recv = 0;
  /* A reader woken while still on its CPU is never switched in for that
   * wake-up: once its receive returns, the wake-up is spent. */
  forget_woken(t);
  if (CFG.recv_by_fd && !t->on_sock && ret > 0)
    recv_sock_by_fd(t, regs->di);
  if (!t->on_sock || ret <= 0)
    return 0;
  /* Peeked datagrams stay queued (the read that takes them is stamped);
   * the error queue holds no datagram. */
  if (recv_flags(nr, regs) & (MSG_PEEK_ | MSG_ERRQUEUE_))
    return 0;
  /* The user's argument registers are intact at exit: the buffer is found
   * here, also for a call that was already blocked when tracing started (no
   * entry context; sock_recv_length made one). */
  __u64 ts = bpf_ktime_get_ns();
  if (nr == NR_RECVMMSG) {
    /* ret: the number of messages; each has its own buffer and length. */
    struct xl_mmsg_loop c = {.vec = regs->si,
                             .ts = ts,
                             .flow = t->rx_flow,
                             .n = ret > MMSG_MAX ? MMSG_MAX : (__u32)ret,
                             .tgid = tgid,
                             .tid = tid,
                             .port = t->rx_port,
                             .remote = t->rx_remote};
    bpf_loop(MMSG_MAX, stamp_mmsg, &c, 0);
    if (ret > MMSG_MAX)
      count_losses(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_GSO, ret - MMSG_MAX);
    return 0;
  }
  struct user_msghdr msg = {};
  struct xl_uview v = {};
  if (user_view(nr, regs, &msg, &v)) {
    count_loss(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_PARSE);
    return 0;
  }
  __u32 gso = nr == NR_RECVMSG ? udp_gro_size(&msg) : 0;
  __u64 flow = t->rx_flow;
  if (t->rx_remote)
    flow = nr == NR_RECVFROM ? sender_of_recvfrom(flow, regs)
           : nr == NR_RECVMSG
               ? with_sender(flow, (__u64)msg.msg_name, msg.msg_namelen)
               : 0;
  stamp_recv(&v, (__u64)ret, gso, tgid, tid, ts, flow, t->rx_port, t);
  return 0;
}

/* A traced socket's flow (*flow) and its flags (returned), in that order:
 * another CPU noting a second flow (sock_rx.h note_flow) writes the flags
 * first, so a reader that sees the new flow also sees that the socket now
 * has several (and takes the flow from the sender address, or none). Read
 * the other way round, a datagram of the first flow could take the second
 * one's flow. */
static __always_inline __u8 sock_flow_flags(const struct xlap_sock *s,
                                            __u64 *flow) {
  *flow = *(volatile const __u64 *)&s->flow;
  asm volatile("" ::: "memory");
  return *(volatile const __u8 *)&s->flows;
}

/* A receive call's flow, as far as its socket knows it. */
static __always_inline void note_recv_flow(struct xl_task *t, struct sock *sk,
                                           const struct xlap_sock *s) {
  __u64 flow;
  __u8 f = sock_flow_flags(s, &flow);
  t->on_sock = 1;
  t->rx_port = sk->__sk_common.skc_num;
  t->rx_remote = (f & XLAP_SOCK_MULTI_FLOW) && !(f & XLAP_SOCK_MULTI_LOCAL);
  t->rx_flow = !(f & XLAP_SOCK_MULTI_FLOW) ? flow
               : t->rx_remote              ? flow & XLAP_FLOW_LOCAL_MASK
                                           : 0;
}

/* Whether the datagrams of UDP socket `sk` may reach its reader several
 * to an skb (UDP GRO, enabled by the reader: UDP_FLAGS_GRO_ENABLED, bit 3
 * of udp_flags since Linux 6.7; the socket calls need 6.12). */
static __always_inline int udp_gro_on(struct sock *sk) {
  struct udp_sock *up = (struct udp_sock *)sk;
  if (!bpf_core_field_exists(up->udp_flags))
    return 1;
  return (BPF_CORE_READ(up, udp_flags) >> UDP_FLAGS_GRO_ENABLED) & 1;
}

/* The reader's buffer at the socket calls (no syscall hook): read where
 * the call's own saved registers say, as on_sys_exit does, when the
 * syscall around this socket call reads one datagram (recvfrom, recvmsg,
 * read; recvmmsg and io_uring make several socket calls per syscall, and
 * keep the queue's account alone). Returns 0 and the datagram's seq and
 * kind in *q when it could be read, 1 when the buffer holds no readable
 * seq (too short, a field split across iovecs), -1 when there is no
 * buffer to read. The sender address is written to the caller only after
 * the socket call: a socket receiving several flows gets none here
 * (q->ports: the socket's own port). */
static __always_inline int read_call_buffer(struct task_struct *task,
                                            struct sock *sk, int ret,
                                            __u64 flow, struct xl_idq *q) {
  if (task->flags & (PF_IO_WORKER_ | PF_KTHREAD_))
    return -1;
  struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
  if (!regs)
    return -1;
  __u32 nr = (__u32)regs->orig_ax;
  if (nr != NR_RECVFROM && nr != NR_RECVMSG && nr != NR_READ)
    return -1;
  struct user_msghdr msg = {};
  struct xl_uview v = {};
  if (user_view(nr, regs, &msg, &v))
    return -1;
  q->ports = (__u32)flow;
  if (!(q->ports & 0xffff))
    q->ports = sk->__sk_common.skc_num;
  q->avail = (__u32)ret;
  return xl_user_ident(&v, 0, q) ? 1 : 0;
}

/* A read of traced socket `sk` at the socket calls returned. Which
 * datagram it took: the one the socket's queue says (socket_recv_take),
 * its identity and flow as the socket-queue point read them, when the
 * reader's buffer agrees or cannot be read (a field split across iovecs,
 * recvmmsg, io_uring); the reader's buffer alone when the queue cannot
 * tell or tells another datagram (queued before tracing, two datagrams
 * entering an empty queue at once on two CPUs, threads reading one
 * socket at once), as at the syscalls. A read neither tells is counted
 * lost ('unmatched'), never given another datagram's identity. */
static __always_inline void
calls_recv_return(struct sock *sk, struct xlap_sock *s, int ret, int flags) {
  __u64 taken = 0, now = 0;
  struct xl_rx_slot *slot = 0;
  struct xl_task *t = 0;
  if (!socket_recv_take(sk, s, ret, flags, &taken, &slot, &now, &t))
    return;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  /* A UDP GRO read may hold several datagrams, which only the queue's note
   * counts (the reader's control message is written after this point).
   * A note outside the run's sample is checked against the buffer too: the
   * queue may name an unsampled neighbour of a sampled datagram. */
  if (slot && slot->nseg > 1) {
    stamp_read(taken, slot, pid_tgid, now, t);
    return;
  }
  __u64 flow;
  if (sock_flow_flags(s, &flow) & XLAP_SOCK_MULTI_FLOW)
    flow = 0;
  struct xl_idq q = {};
  struct task_struct *task = bpf_get_current_task_btf();
  int buffer =
      slot || !udp_gro_on(sk) ? read_call_buffer(task, sk, ret, flow, &q) : -1;
  if (slot &&
      (buffer ||
       ((slot->id.flags & XLAP_FLAG_SEQ_VALID) && slot->id.seq == q.seq &&
        (!(q.flags & XLAP_FLAG_KIND) || slot->id.kind == q.kind)))) {
    stamp_read(taken, slot, pid_tgid, now, t);
    return;
  }
  if (buffer) {
    /* A buffer without a readable seq is a parse loss, as at the
     * syscalls (a 4-byte handshake read); no buffer, unmatched. */
    count_loss(XLAP_POINT_SOCK_RECV_EXIT,
               buffer > 0 ? XLAP_LOSS_PARSE : XLAP_LOSS_UNMATCHED);
    return;
  }
  struct xl_ident id = {.seq = q.seq,
                        .flow = flow,
                        .pid = pid_tgid >> 32,
                        .len = (__u32)ret,
                        .kind = q.kind,
                        .flags = XLAP_FLAG_FROM_USER | q.flags};
  emit(XLAP_POINT_SOCK_RECV_EXIT, now, &id, (__u32)pid_tgid, 0, 0,
       bpf_get_current_cgroup_id());
  note_read(t, id.seq, id.kind, id.flags);
}

/* The socket a receive call reads (after it read): only traced sockets'
 * datagrams are stamped at the call's exit. */
SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_sock_recv_length, struct sock *sk, int ret, int flags) {
  RETURN_IF_EMPTY(0);
  if (sk->sk_protocol != IPPROTO_UDP_)
    return 0;
  struct xlap_sock *s = traced_sock(sk);
  if (!s)
    return 0;
  if (!CFG.syscall_hooks) {
    calls_recv_return(sk, s, ret, flags);
    return 0;
  }
  struct task_struct *task = bpf_get_current_task_btf();
  struct xl_task *t = task_ctx(task);
  if (t && t->in_recv) {
    note_recv_flow(t, sk, s);
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
  note_recv_flow(t, sk, s);
  return 0;
}

#endif
