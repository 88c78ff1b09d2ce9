/* uring.h: datagrams sent and received through io_uring, where no send or
 * receive syscall frames them (io_uring_enter submits and reaps many).
 *
 * A send request (IORING_OP_SEND, IORING_OP_SENDMSG, their zero-copy forms)
 * of a traced process
 * gets sock.send_enter at the time it was submitted (io_uring_submit_req:
 * the request is prepared, its buffers known; both stamps are written at
 * completion, when its file is known to be a UDP socket whose ports pick
 * the payload layout, read then from the buffers noted at submission:
 * data buffers stay the application's until it reaps the completion) and
 * sock.send_exit when it completes; its datagram's device points follow from
 * its socket as for any other send. A receive request (IORING_OP_RECV,
 * IORING_OP_RECVMSG) gets sock.recv_exit when it completes (io_uring_complete),
 * read from the request's buffer. The flow comes from the request's socket when
 * it is connected (else 0: matched by pid, kind and seq). Requests that select
 * a provided buffer (IOSQE_BUFFER_SELECT, multishot) are counted as
 * `unmatched`: their buffer is not in the request. */
#ifndef XLAP_CAPTURE_URING_H
#define XLAP_CAPTURE_URING_H

#include "lib/common.h"
#include "lib/packet.h"
#include "lib/task.h"
#include "lib/user_view.h"

/* A send request between submission and completion. Its file is only
 * assigned when it is issued, so whether it is a UDP socket (and its
 * flow) is decided at completion. */
struct xl_uring_send {
  struct xl_ident id;
  struct xl_uview v; /* the data buffers */
  __u64 ts_submit;
  __u8 viewed; /* 0: no buffers found (a parse loss if UDP) */
};

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64); /* struct io_kiocb * */
  __type(value, struct xl_uring_send);
} URING_SENDS SEC(".maps");

#define IORING_CQE_F_BUFFER_ 1

/* The zero-copy sends keep their request in the same io_sr_msg; their
 * second completion (the buffer notification) is another request. */
static __always_inline int uring_op_send(__u8 op) {
  return op == IORING_OP_SEND || op == IORING_OP_SENDMSG ||
         op == IORING_OP_SEND_ZC || op == IORING_OP_SENDMSG_ZC;
}

static __always_inline int uring_op_recv(__u8 op) {
  return op == IORING_OP_RECV || op == IORING_OP_RECVMSG;
}

/* The UDP socket behind a request's file, 0 if it is another kind. */
static __always_inline struct sock *uring_udp_sock(struct file *f) {
  struct socket *so = (struct socket *)BPF_CORE_READ(f, private_data);
  struct sock *sk = BPF_CORE_READ(so, sk);
  if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_UDP_)
    return 0;
  return sk;
}

/* The flow of a connected socket's datagrams, as seen leaving (`out`) or
 * arriving; 0 for a socket that is not connected. */
static __always_inline __u64 uring_sock_flow(struct sock *sk, int out) {
  __u16 remote = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
  __u16 local = BPF_CORE_READ(sk, __sk_common.skc_num);
  if (!remote)
    return 0;
  __u32 l[4] = {}, r[4] = {};
  int words = 1;
  if (BPF_CORE_READ(sk, __sk_common.skc_family) == AF_INET6_) {
    BPF_CORE_READ_INTO(&l, sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32);
    BPF_CORE_READ_INTO(&r, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr32);
    words = 4;
  } else {
    l[0] = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
    r[0] = BPF_CORE_READ(sk, __sk_common.skc_daddr);
  }
  __u16 fl = fold16(l, words), fr = fold16(r, words);
  return out ? make_flow(fl, fr, local, remote)
             : make_flow(fr, fl, remote, local);
}

/* What a send/receive request points to (struct io_sr_msg in the
 * request's command area, read field by field: CO-RE relocates them). */
struct xl_sr {
  __u64 buf; /* buffer, or user msghdr for SENDMSG/RECVMSG */
  __s32 len;
};

static __always_inline void uring_sr(struct io_kiocb *req, struct xl_sr *o) {
  struct io_sr_msg *sr = (struct io_sr_msg *)&req->cmd;
  o->buf = (__u64)BPF_CORE_READ(sr, buf);
  o->len = BPF_CORE_READ(sr, len);
}

/* The user view of a send/receive request's buffer: `len` bytes at buf
 * (SEND, RECV) or the first two iovecs of the user msghdr (SENDMSG,
 * RECVMSG). */
static __always_inline int uring_view(__u8 op, const struct xl_sr *sr,
                                      __u64 len, struct xl_uview *v) {
  if (!sr->buf)
    return -1;
  if (op == IORING_OP_SEND || op == IORING_OP_SEND_ZC || op == IORING_OP_RECV) {
    v->base[0] = sr->buf;
    v->len[0] = len;
    v->base[1] = 0;
    v->len[1] = 0;
    return 0;
  }
  struct user_msghdr msg = {};
  if (bpf_probe_read_user(&msg, sizeof(msg), (void *)sr->buf))
    return -1;
  return msg_view(&msg, v);
}

SEC("tp_btf/io_uring_submit_req")
int BPF_PROG(on_io_uring_submit_req, struct io_kiocb *req) {
  RETURN_IF_EMPTY(0);
  __u8 op = req->opcode;
  if (!uring_op_send(op))
    return 0;
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return 0;
  struct xl_sr sr;
  uring_sr(req, &sr);
  __u64 len = sr.len > 0 ? sr.len : 0;
  struct xl_uring_send e = {.ts_submit = bpf_ktime_get_ns()};
  /* SENDMSG's msghdr and iovec array may be gone after submission: the
   * buffers they point to are noted now. */
  e.viewed = !uring_view(op, &sr, len, &e.v);
  e.id.pid = tgid;
  e.id.len = len;
  e.id.flags = XLAP_FLAG_FROM_USER;
  __u64 key = (__u64)req;
  if (bpf_map_update_elem(&URING_SENDS, &key, &e, BPF_ANY))
    count_loss(XLAP_POINT_SOCK_SEND_ENTER, XLAP_LOSS_MAP_FULL);
  /* Issued inline by this thread, its socket call is this request's, not
   * a send of the thread's own (calls.h). */
  if (!CFG.syscall_hooks) {
    struct task_struct *task = bpf_get_current_task_btf();
    struct xl_task *t = bpf_task_storage_get(&TASK_CTX, task, 0,
                                             BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (t)
      t->in_uring = 1;
    if (!URING_SENDS_SEEN)
      URING_SENDS_SEEN = 1;
  }
  return 0;
}

SEC("tp_btf/io_uring_complete")
int BPF_PROG(on_io_uring_complete, struct io_ring_ctx *ring, void *req,
             struct io_uring_cqe *cqe) {
  RETURN_IF_EMPTY(0);
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return 0;
  struct io_kiocb *r = req;
  __u8 op = BPF_CORE_READ(r, opcode);
  __s32 res = cqe->res;
  __u64 ts = bpf_ktime_get_ns();
  __u32 tid = (__u32)bpf_get_current_pid_tgid();
  if (uring_op_send(op)) {
    if (!CFG.syscall_hooks) {
      struct xl_task *t = task_ctx(bpf_get_current_task_btf());
      if (t)
        t->in_uring = 0;
    }
    __u64 key = (__u64)req;
    struct xl_uring_send *e = bpf_map_lookup_elem(&URING_SENDS, &key);
    if (!e)
      return 0;
    struct xl_uring_send s = *e;
    bpf_map_delete_elem(&URING_SENDS, &key);
    struct sock *sk = uring_udp_sock(BPF_CORE_READ(r, file));
    if (!sk)
      return 0; /* not a UDP socket */
    s.id.flow = uring_sock_flow(sk, 1);
    /* The layout by the connection's ports, else by the local port. */
    struct xl_idq q = {.ports = (__u32)s.id.flow, .avail = s.id.len};
    if (!q.ports)
      q.ports = (__u32)BPF_CORE_READ(sk, __sk_common.skc_num) << 16;
    if (!s.viewed || xl_user_ident(&s.v, 0, &q)) {
      count_loss(XLAP_POINT_SOCK_SEND_ENTER, XLAP_LOSS_PARSE);
      count_loss(XLAP_POINT_SOCK_SEND_EXIT, XLAP_LOSS_PARSE);
      return 0;
    }
    s.id.seq = q.seq;
    s.id.kind = q.kind;
    s.id.flags |= q.flags;
    emit(XLAP_POINT_SOCK_SEND_ENTER, s.ts_submit, &s.id, tid, 0, 0,
         bpf_get_current_cgroup_id());
    if (res >= 0)
      emit(XLAP_POINT_SOCK_SEND_EXIT, ts, &s.id, tid, 0, 0,
           bpf_get_current_cgroup_id());
    return 0;
  }
  /* Without syscall hooks, a receive request's socket call stamps it
   * (calls.h), whichever thread issues it. */
  if (!uring_op_recv(op) || res <= 0 || !CFG.syscall_hooks)
    return 0;
  if (cqe->flags & IORING_CQE_F_BUFFER_) {
    count_loss(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_UNMATCHED);
    return 0;
  }
  struct xl_sr sr;
  uring_sr(r, &sr);
  struct sock *sk = uring_udp_sock(BPF_CORE_READ(r, file));
  if (!sk)
    return 0;
  __u64 flow = uring_sock_flow(sk, 0);
  struct xl_uview v = {};
  if (uring_view(op, &sr, (__u64)res, &v)) {
    count_loss(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_PARSE);
    return 0;
  }
  emit_recv(&v, 0, (__u64)res, ts, tgid, tid, flow,
            BPF_CORE_READ(sk, __sk_common.skc_num), 0);
  return 0;
}

#endif
