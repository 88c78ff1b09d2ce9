/* task.h: per-thread call state of the traced processes, and the hand-off
 * from the socket-queue point to the reader's wake-up. */
#ifndef XLAP_CAPTURE_TASK_H
#define XLAP_CAPTURE_TASK_H

#include "common.h"

/* A send syscall of a traced process, until it returns: the datagrams it
 * put on a device (several: GSO, sendmmsg, fragments). */
struct xl_send_ctx {
  __u64 ts_enter;
  struct xl_ident id; /* datagram 0 */
  struct xl_segs segs;
  __u32 n;      /* datagrams recorded in segs */
  __u32 beyond; /* datagrams over XLAP_MAX_SEGS (counted as gso losses) */
  /* Datagrams its first device point could not read (in page fragments
   * without a dynptr, or not parsed): lost at the send points too, for
   * the device point's reason (the last one seen). */
  __u32 unread;
  __u32 unread_loss;
};

/* The call state of a thread of a traced process, in the thread's own
 * storage (task local storage: no hash lookups, freed with the thread). */
struct xl_task {
  struct xl_send_ctx send; /* valid while in_send */
  __u8 in_send;            /* in a send syscall */
  __u8 in_recv;            /* in a receive syscall */
  __u8 in_wait;            /* in poll/select/epoll_wait/io_uring_enter */
  __u8 on_sock; /* sock_recv_length saw a UDP socket in this receive */
  /* The receive's flow, from the socket (sock_recv_length): whole, or its
   * local half when the sender address the call returns completes it
   * (rx_remote), or 0 when the socket cannot tell. */
  __u8 rx_remote;
  __u16 rx_port; /* the socket's local port (picks the payload layout) */
  __u64 rx_flow;
  /* The datagram whose arrival woke this thread (sched.h), stamped when it
   * is switched in; valid while woken_pending (claimed by compare-and-swap:
   * the waking CPU, the thread's switch-in and its syscall exit race). */
  struct xl_ident woken;
  __u64 woken_pending;
  /* An io_uring send request is being issued (uring.h stamps it). */
  __u8 in_uring;
  /* The last datagram this thread's receive call read (its first, for a
   * UDP GRO read), valid while read_valid: a later waking of the thread
   * is not that datagram's (sched.h), which it has in hand already. */
  __u8 read_valid;
  __u32 read_kind;
  __u64 read_seq;
  /* --boundary auto: when this thread entered its latest send syscall, and
   * which (hooks/calls.h on_send_syscall); valid while the thread is still
   * in a syscall of that number. */
  __u64 sys_send_ts;
  __u32 sys_send_nr;
};

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

#define PF_IO_WORKER_ 0x10
#define PF_KTHREAD_ 0x00200000

/* The entry of the send syscall the current thread is in, 0 if none (or
 * not --boundary auto). A note is taken only inside a syscall of its
 * number: a write to a file leaves a note no later socket call outside
 * such a syscall can take, and the next send syscall replaces it. */
static __always_inline __u64 send_syscall_entry(struct task_struct *task,
                                                struct xl_task *t) {
  if (!CFG.send_syscalls || !t || !t->sys_send_ts)
    return 0;
  struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
  if (!regs || regs->orig_ax != t->sys_send_nr)
    return 0;
  return t->sys_send_ts;
}

/* Without syscall hooks (hooks/calls.h), a send call's state begins at its
 * first datagram on a device (dev_tx.h), which the stack queues in the
 * sending thread, and ends when the socket call returns
 * (sock_send_length; only attached with sock.send_exit, CFG.send_calls:
 * without it a send keeps no state, dev_tx.h send_start_take). `owner`: the
 * process of the socket the datagram came from; the thread must belong to it or
 * to another traced process (a forked child sending on an inherited socket).
 * io_uring's requests are uring.h's: issued inline (in_uring) or by its worker
 * threads. Returns the thread's state, or 0 when this is not a traced thread's
 * send. */
static __always_inline struct xl_task *
socket_send_begin(struct task_struct *task, struct xl_task *t, __u32 owner) {
  if (task->flags & PF_IO_WORKER_)
    return 0;
  if (t && t->in_uring)
    return 0;
  __u32 tgid = task->tgid;
  if (tgid != owner && !bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return 0;
  if (!t)
    t = bpf_task_storage_get(&TASK_CTX, task, 0,
                             BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!t)
    return 0;
  t->in_send = 1;
  t->send.ts_enter = 0;
  t->send.n = 0;
  t->send.beyond = 0;
  t->send.unread = 0;
  return t;
}

/* A send that named its destination, begun on this CPU (cgroup sendmsg4/6,
 * hooks/calls.h): the thread, the socket and when. The socket notes it
 * too (struct xlap_sock send_start_*), for a thread that sleeps or is
 * preempted inside the call and goes on on another CPU: send_start_of
 * below takes it from either. Without
 * sock_send_length (CFG.send_calls = 0), the first device point also
 * keeps here the first fragment it read, for the later fragments of the
 * same send. */
struct xl_send_start {
  __u64 ts;
  __u64 cookie; /* the traced socket's */
  __u32 tid;
  __u32 frag_tid; /* the first fragment's thread (0: none) */
  __u64 frag_cookie;
  struct xl_ident frag; /* the first fragment's datagram */
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_send_start);
} SEND_START SEC(".maps");

/* The start of thread `tid`'s send on traced socket `s`, taken (0: none
 * noted): the later of this CPU's note and the socket's that are the
 * thread's. A thread's calls follow one another, so its latest start is
 * this call's; the socket's is the newest unless another thread's send on
 * it overwrote it. This CPU's note is not the thread's when it is of
 * another socket, or when it is a start already taken from the socket on
 * the CPU the thread had moved to (`send_moved_*`): left behind here, it
 * would be taken by a later send of the thread that noted none (a
 * connected socket's). */
static __always_inline __u64 send_start_of(struct xlap_sock *s, __u32 tid) {
  __u64 ts = 0;
  __u32 zero = 0;
  struct xl_send_start *st = bpf_map_lookup_elem(&SEND_START, &zero);
  if (st && st->tid == tid) {
    if (st->cookie == s->cookie &&
        !(s->send_moved_tid == tid && st->ts <= s->send_moved_ts))
      ts = st->ts;
    st->tid = 0;
  }
  if (s->send_start_tid == tid) {
    __u64 on_sock = s->send_start_ts;
    s->send_start_tid = 0;
    if (on_sock > ts) {
      s->send_moved_ts = on_sock;
      s->send_moved_tid = tid;
      ts = on_sock;
    }
  }
  return ts;
}

/* Some traced thread issued an io_uring send request (uring.h): only then
 * does a send's device point look at the thread's state for it. */
__u64 URING_SENDS_SEEN = 0;

/* The last datagram handed to a traced socket on this CPU: the wake-up it
 * triggers follows within the same softirq, in the context of the same
 * task (`task`: the one current at the hand-over). */
struct xl_rx_last {
  struct xl_ident id;
  __u64 ts;
  __u64 task;
  __u8 valid;
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_rx_last);
} RX_LAST SEC(".maps");

/* Threads with a pending wake-up (xl_task.woken_pending): while it is 0,
 * sched_switch, the most frequent of our events, looks no further. Kept in
 * the thread's own storage, not a hash: a hash update and delete per
 * datagram cost more than the rest of the wake-up points. */
__u64 WOKEN_PENDING = 0;

/* Notes the datagram that woke thread `t`. */
static __always_inline void note_woken(struct xl_task *t,
                                       const struct xl_ident *id) {
  t->woken = *id;
  if (__sync_val_compare_and_swap(&t->woken_pending, 0, 1) == 0)
    __sync_fetch_and_add(&WOKEN_PENDING, 1);
}

/* Takes thread `t`'s pending wake-up (once: 1), or finds none (0). */
static __always_inline int take_woken(struct xl_task *t) {
  if (!t->woken_pending ||
      __sync_val_compare_and_swap(&t->woken_pending, 1, 0) != 1)
    return 0;
  __sync_fetch_and_add(&WOKEN_PENDING, -1);
  return 1;
}

/* The current thread's receive call read datagram `id` (the last of a UDP
 * GRO read's, as RX_LAST names it): a later waking of the thread is not
 * that datagram's (sched.h). The syscall hooks note it at the call's exit
 * (user_view.h emit_recv); the socket calls here, creating the thread's
 * storage, as a thread that never slept has none yet. */
static __always_inline void note_read(struct xl_task *t, __u64 seq, __u32 kind,
                                      __u32 flags) {
  if (!(flags & XLAP_FLAG_SEQ_VALID))
    return;
  /* `t`: the thread's storage when the caller has it already. */
  if (!t)
    t = bpf_task_storage_get(&TASK_CTX, bpf_get_current_task_btf(), 0,
                             BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!t)
    return;
  t->read_seq = seq;
  t->read_kind = kind;
  t->read_valid = 1;
}

/* A thread's pending wake-up is spent (it ran, or its receive returned). */
static __always_inline void forget_woken(struct xl_task *t) {
  if (WOKEN_PENDING)
    take_woken(t);
}

#endif
