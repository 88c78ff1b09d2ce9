/* lib/recv_queue.h: which datagram a read of a traced UDP socket took,
 * by its place in the socket's queue (calls.h, syscall.h: the return of
 * the socket calls' reads, for both boundaries), and its stamp. */
#ifndef XLAP_LIB_RECV_QUEUE_H
#define XLAP_LIB_RECV_QUEUE_H

#include "lib/common.h"
#include "lib/rx_slots.h"
#include "lib/task.h"

/* The skb at the head of a UDP socket's receive queues, 0 if both are
 * empty: the reader takes from reader_queue, which UDP refills from
 * sk_receive_queue when it runs dry. */
static __always_inline __u64 queue_head(struct sock *sk) {
  /* The reader queue's head in one read (its next and qlen together); the
   * socket's own queue is a field of the traced sock, loaded directly. */
  struct sk_buff_head q;
  struct udp_sock *up = (struct udp_sock *)sk;
  __u64 head = 0;
  if (!bpf_probe_read_kernel(&q, sizeof(q), &up->reader_queue) && q.qlen) {
    head = (__u64)q.next;
    /* Kept apart from the load below: one instruction may not load from
     * the stack and from the sock (the verifier refuses it). */
    asm volatile("" : "+r"(head));
  } else if (sk->sk_receive_queue.qlen) {
    head = (__u64)sk->sk_receive_queue.next;
    asm volatile("" : "+r"(head));
  }
  return head;
}

/* The stamp of the datagrams of skb `key` (its slot `slot`) that a read
 * took (several for a UDP GRO read). */
static __always_inline void stamp_read(__u64 key, struct xl_rx_slot *slot,
                                       __u64 pid_tgid, __u64 now,
                                       struct xl_task *t) {
  struct xl_ident id = slot->id;
  id.pid = pid_tgid >> 32; /* the reader: a forked child reads its parent's
                              socket */
  __u32 n = slot->nseg;
  struct xl_segs *segs = rx_segs(key, &n, XLAP_POINT_SOCK_RECV_EXIT);
  rx_free(slot, key);
  struct xl_at at = {.point = XLAP_POINT_SOCK_RECV_EXIT,
                     .ts = now,
                     .tid = (__u32)pid_tgid,
                     .scope = bpf_get_current_cgroup_id()};
  emit_all(&at, &id, segs, n);
  if (segs && n > 1)
    note_read(t, segs->seq[(n - 1) & (XLAP_MAX_SEGS - 1)],
              segs->kind[(n - 1) & (XLAP_MAX_SEGS - 1)], id.flags);
  else
    note_read(t, id.seq, id.kind, id.flags);
  if (segs)
    bpf_map_delete_elem(&RX_SEGS, &key);
}

/* Longer than a datagram takes from the socket-queue point to the queue
 * (the same softirq, microseconds). */
#define IN_FLIGHT_NS 50000ULL

/* Whether skb `key` passed the socket-queue point just now and is not yet
 * read (nor the one just read). */
static __always_inline int in_flight(__u64 key, __u64 taken, __u64 now) {
  if (!key || key == taken)
    return 0;
  struct xl_rx_slot *l = rx_find(key);
  return l && now - l->born < IN_FLIGHT_NS;
}

/* A read of traced socket `sk` returned (sock_recv_length; called from
 * syscall.h, which attaches it for both boundaries). No hook of the kernel
 * sees the skb a UDP read takes (skb_copy_datagram_iovec misses linear
 * skbs, consume_skb misses skbs freed through the per-CPU caches), but the
 * queue is first in, first out: the read took the skb the last read left
 * at the head, or, when that read left the queue empty, the first datagram
 * queued since (sock_rx.h notes it). Checked: that skb must have left the
 * head. Returns 0 for a call that read no datagram (a peek, the error
 * queue, an error); else 1, with *taken the skb the queue says the read
 * took and *slot its note, 0 when the queue cannot tell (queued before
 * tracing, two datagrams queued at once on two CPUs into an empty queue,
 * several threads reading one socket at once: syscall.h then reads the
 * reader's buffer where it can), and *now the call's time. */
static __always_inline int
socket_recv_take(struct sock *sk, struct xlap_sock *s, int ret, int flags,
                 __u64 *taken_out, struct xl_rx_slot **slot_out, __u64 *now_out,
                 struct xl_task **t_out) {
  /* A reader woken while still on its CPU is never switched in for that
   * wake-up: once its receive returns, the wake-up is spent. A reader of a
   * traced process gets its call state here: its next wake-up by a
   * datagram is stamped (sched.h looks for it). Only for a run that
   * stamps wake-ups. */
  *t_out = 0;
  if (point_on(XLAP_POINT_SCHED_WAKEUP) ||
      point_on(XLAP_POINT_SCHED_SWITCH_IN)) {
    struct task_struct *task = bpf_get_current_task_btf();
    struct xl_task *t = task_ctx(task);
    if (t) {
      forget_woken(t);
    } else {
      __u32 tgid = bpf_get_current_pid_tgid() >> 32;
      if (bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
        t = bpf_task_storage_get(&TASK_CTX, task, 0,
                                 BPF_LOCAL_STORAGE_GET_F_CREATE);
    }
    *t_out = t; /* for note_read: one storage lookup per read */
  }
  if (flags & (MSG_PEEK_ | MSG_ERRQUEUE_))
    return 0;
  if (ret < 0) {
    /* Nothing read; or a datagram taken and dropped (a bad checksum): the
     * head moved on. */
    __u64 head = queue_head(sk);
    if (head)
      s->rx_next = head;
    return 0;
  }
  /* Taken (and cleared) before the head is read: a datagram whose
   * socket-queue point runs from here on finds rx_first empty and notes
   * itself, so the next read finds it even when the head and the in-flight
   * check below both miss it. Cleared after the head instead, such a
   * datagram could find the old first still there, not note itself, and
   * then lose it to the clearing: that read counted unmatched. */
  __u64 first = __sync_lock_test_and_set(&s->rx_first, 0);
  __u64 taken = s->rx_next ? s->rx_next : first;
  __u64 head = queue_head(sk);
  /* Queues empty: datagrams past their socket-queue point may still be on
   * their way in (another CPU, between the point and the enqueue that
   * follows it; a burst of two, such as a data packet and its parity):
   * the older of the last two that is not the one just read, not read
   * before (its read frees its slot) and passed the point just now. Three
   * on their way at once: the check below finds the wrong one at the
   * head. */
  /* One clock read for the whole call (the stamp's time too). */
  __u64 now = bpf_ktime_get_ns();
  if (!head) {
    __u64 last2 = s->rx_last2, last = s->rx_last;
    if (in_flight(last2, taken, now))
      head = last2;
    else if (in_flight(last, taken, now))
      head = last;
  }
  s->rx_next = head;
  struct xl_rx_slot *slot = taken && taken != head ? rx_find_of(taken, s) : 0;
  /* A read never returns more than its datagrams (it may return less: a
   * short buffer truncates). */
  if (slot && (__u64)ret > (__u64)slot->id.len * slot->nseg)
    slot = 0;
  *taken_out = taken;
  *slot_out = slot;
  *now_out = now;
  return 1;
}

#endif
