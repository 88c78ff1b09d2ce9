/* lib/user_view.h: a view of a system call's user buffers (a plain
 * buffer, an iovec, a msghdr) and the fields read from it in the
 * layout's byte order; the receive stamp of a datagram read from it
 * (syscall.h, uring.h). */
#ifndef XLAP_LIB_USER_VIEW_H
#define XLAP_LIB_USER_VIEW_H

#include "lib/common.h"
#include "lib/packet.h"
#include "lib/syscall_nr.h"
#include "lib/task.h"

#define SOL_UDP_ 17
#define UDP_GRO_ 104
/* Control messages looked at for UDP_GRO in one recvmsg. */
#define CMSG_MAX 4

/* Reads a field of 1..8 bytes from user memory in the given byte order. */
static __always_inline int user_field(const void *src, __u32 size, __u8 be,
                                      __u64 *out) {
  __u8 b[8] = {};
  if (size == 0 || size > 8)
    return -1;
  size = ((size - 1) & 7) + 1; /* 1..8 in a form the verifier keeps */
  if (bpf_probe_read_user(b, size, src))
    return -1;
  *out = field_at(b, 0, 7, size, be);
  return 0;
}

/* Where a receive call put the bytes: up to two iovecs (recvmsg,
 * recvmmsg; a header in a small first iovec is a common scatter layout),
 * or one plain buffer. Offsets below are into their concatenation. */
struct xl_uview {
  __u64 base[2];
  __u64 len[2];
};

/* Messages of one recvmmsg stamped (the rest counted as gso losses). */
#define MMSG_MAX 64

/* Reads a field at offset `off` of the view; a field across the two
 * iovecs or beyond them is unreadable. */
static __always_inline int view_field(const struct xl_uview *v, __u64 off,
                                      __u32 size, __u8 be, __u64 *out) {
  if (off + size <= v->len[0])
    return user_field((void *)(v->base[0] + off), size, be, out);
  if (off >= v->len[0] && off - v->len[0] + size <= v->len[1])
    return user_field((void *)(v->base[1] + off - v->len[0]), size, be, out);
  return -1;
}

/* Seq and kind (at offsets so and ko of the datagram at `at`, of ss and ks
 * bytes) in one user read, when both lie within 16 bytes of the first
 * iovec: a user read is a helper call that cost as much as the rest of
 * the datagram's identity (perf on the ping-pong: 1.1 % of its CPU for
 * two reads per datagram). Returns 0, or -1 to read them one by one. */
static __always_inline int pair_field(const struct xl_uview *v, __u64 at,
                                      __u64 so, __u32 ss, __u64 ko, __u32 ks,
                                      __u8 be, struct xl_idq *q) {
  __u64 lo = so < ko ? so : ko;
  __u64 hi = so + ss > ko + ks ? so + ss : ko + ks;
  if (hi - lo > 16 || at + hi > v->len[0] || !ss || ss > 8 || ks > 8)
    return -1;
  __u8 b[16] = {};
  __u32 n = (((__u32)(hi - lo) - 1) & 15) + 1;
  if (bpf_probe_read_user(b, n, (void *)(v->base[0] + at + lo)))
    return -1;
  q->seq = field_at(b, (__u32)(so - lo), 15, ss, be);
  q->kind = field_at(b, (__u32)(ko - lo), 15, ks, be);
  return 0;
}

/* Seq and kind of the datagram of q->avail bytes at offset `at` of the
 * view, by the layout of its ports (q->ports; layout.h). A global
 * function, for the reason layout.h gives. Returns 0 or -1. */
__attribute__((noinline)) int xl_user_ident(const struct xl_uview *v, __u64 at,
                                            struct xl_idq *q) {
  if (!v || !q)
    return -1;
  __u32 li = layout_of(q->ports) & (XLAP_LAYOUTS - 1);
  __u64 so = CFG.layouts[li].seq_offset, ko = CFG.layouts[li].kind_offset;
  __u32 ss = CFG.layouts[li].seq_size, ks = CFG.layouts[li].kind_size;
  __u8 be = CFG.layouts[li].big_endian;
  if (so + ss > q->avail || (ks && ko + ks > q->avail))
    return -1;
  q->kind = 0;
  q->flags = XLAP_FLAG_SEQ_VALID;
  if (ks && !pair_field(v, at, so, ss, ko, ks, be, q)) {
    /* Both in one read. */
  } else if (view_field(v, at + so, ss, be, &q->seq)) {
    return -1;
  } else if (ks && view_field(v, at + ko, ks, be, &q->kind)) {
    return -1;
  }
  if (ks) {
    if (CFG.layouts[li].kind_mask)
      q->kind &= CFG.layouts[li].kind_mask;
    q->flags |= XLAP_FLAG_KIND;
  }
  return 0;
}

/* The view of the first two iovecs of the `iovlen` at `iov` (user memory). */
static __always_inline int iov_view(const void *iov, __u64 iovlen,
                                    struct xl_uview *v) {
  /* The iovecs (base, len pairs) are read into v itself and put in its
   * order after: no copy on the stack. */
  __u64 *w = (__u64 *)v;
  __u64 n = iovlen > 2 ? 2 : iovlen;
  if (!iov || !n || bpf_probe_read_user(w, n * 16, iov))
    return -1;
  __u64 base0 = w[0], len0 = w[1];
  __u64 base1 = n == 2 ? w[2] : 0, len1 = n == 2 ? w[3] : 0;
  v->base[0] = base0;
  v->base[1] = base1;
  v->len[0] = len0;
  v->len[1] = len1;
  return 0;
}

_Static_assert(sizeof(struct xl_uview) == 2 * sizeof(struct iovec),
               "an xl_uview holds two iovecs");

/* The view of a msghdr's first two iovecs. */
static __always_inline int msg_view(const struct user_msghdr *msg,
                                    struct xl_uview *v) {
  return iov_view(msg->msg_iov, msg->msg_iovlen, v);
}

/* The view of a receive call's buffer (the first message of recvmmsg). */
static __always_inline int user_view(__u32 nr, struct pt_regs *regs,
                                     struct user_msghdr *msg,
                                     struct xl_uview *v) {
  __u64 a1 = regs->si;
  if (nr == NR_RECVFROM || nr == NR_READ) {
    v->base[0] = a1;
    v->len[0] = regs->dx;
    v->base[1] = 0;
    v->len[1] = 0;
    return 0;
  }
  if (bpf_probe_read_user(msg, sizeof(*msg), (void *)a1))
    return -1;
  return msg_view(msg, v);
}

/* The receive call's flags: MSG_PEEK leaves the datagram queued (the read
 * that takes it is stamped), MSG_ERRQUEUE reads no datagram. */
static __always_inline __u64 recv_flags(__u32 nr, struct pt_regs *regs) {
  if (nr == NR_RECVFROM || nr == NR_RECVMMSG)
    return regs->r10;
  if (nr == NR_RECVMSG)
    return regs->dx;
  return 0;
}

/* The segment size of a UDP GRO receive (the UDP_GRO control message the
 * kernel wrote into msg), 0 if none. */
static __always_inline __u32 udp_gro_size(const struct user_msghdr *msg) {
  __u64 at = (__u64)msg->msg_control;
  __u64 end = at + msg->msg_controllen; /* the length the kernel used */
  if (!at)
    return 0;
  for (int i = 0; i < CMSG_MAX; i++) {
    struct cmsghdr c;
    if (at + sizeof(c) > end || bpf_probe_read_user(&c, sizeof(c), (void *)at))
      return 0;
    if (c.cmsg_level == SOL_UDP_ && c.cmsg_type == UDP_GRO_) {
      int size = 0;
      if (bpf_probe_read_user(&size, sizeof(size), (void *)at + sizeof(c)))
        return 0;
      return size > 0 ? size : 0;
    }
    if (c.cmsg_len < sizeof(c))
      return 0;
    at += (c.cmsg_len + 7) & ~7ULL;
  }
  return 0;
}

/* The receive stamp of the datagram of `len` bytes at offset `at` of the
 * view (or its counted parse loss); `read`, when given, gets its seq and
 * kind. */
static __always_inline void emit_recv(const struct xl_uview *v, __u64 at,
                                      __u64 len, __u64 ts, __u32 tgid,
                                      __u32 tid, __u64 flow, __u16 port,
                                      struct xl_task *read) {
  struct xl_ident id = {
      .pid = tgid, .flow = flow, .flags = XLAP_FLAG_FROM_USER, .len = len};
  /* The layout by the flow's ports; by the socket's own (local) port when
   * the flow is not known. */
  struct xl_idq q = {.ports = (__u32)flow, .avail = (__u32)len};
  if (!(q.ports & 0xffff))
    q.ports = port;
  if (xl_user_ident(v, at, &q)) {
    count_loss(XLAP_POINT_SOCK_RECV_EXIT, XLAP_LOSS_PARSE);
    return;
  }
  id.seq = q.seq;
  id.kind = q.kind;
  id.flags |= q.flags;
  emit(XLAP_POINT_SOCK_RECV_EXIT, ts, &id, tid, 0, 0,
       bpf_get_current_cgroup_id());
  if (read && (id.flags & XLAP_FLAG_SEQ_VALID)) {
    read->read_seq = id.seq;
    read->read_kind = id.kind;
    read->read_valid = 1;
  }
}

#endif
