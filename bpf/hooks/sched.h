/* sched.h: the reader's wake-up (sched_waking; a thread blocked in a
 * receive call or an event loop's wait) and its switch-in
 * (sched_switch) after a datagram reached its socket (sock_rx.h sets
 * RX_LAST); sched_switch to idle also exports the CPU's batch. */
#ifndef XLAP_CAPTURE_SCHED_H
#define XLAP_CAPTURE_SCHED_H

#include "lib/common.h"
#include "lib/syscall_nr.h"
#include "lib/task.h"

/* The socket's sk_data_ready wakes the reader synchronously: on the CPU
 * that handed the datagram over, in the context of the task current then
 * (the sender's own, ksoftirqd's), with no switch between. So a waking is
 * the reader's wake-up by that datagram when it comes from that same task
 * within this bound. The task, not the time, tells them apart: the bound
 * only keeps a datagram that woke nothing (its reader was running) from
 * being credited with that task's wake-ups of the reader long after. A
 * few microseconds natively, but 64-512 us under QEMU's TCG (Debian's
 * 6.12 in tests/vm, measured with bpftrace): a 20 us bound lost most
 * wake-ups there, all of them in some runs. */
#define WAKE_WINDOW_NS 2000000

/* Whether two traced processes descend from the same target (a forked
 * worker reading a socket its parent created). */
static __always_inline int same_target(__u32 a, __u32 b) {
  __u32 *ra = bpf_map_lookup_elem(&TARGET_PIDS, &a);
  __u32 *rb = bpf_map_lookup_elem(&TARGET_PIDS, &b);
  return ra && rb && *ra == *rb;
}

SEC("tp_btf/sched_waking")
int BPF_PROG(on_sched_waking, struct task_struct *p) {
  RETURN_IF_EMPTY(0);
  __u32 zero = 0;
  struct xl_rx_last *last = bpf_map_lookup_elem(&RX_LAST, &zero);
  if (!last || !last->valid)
    return 0;
  __u64 now = bpf_ktime_get_ns();
  if (now - last->ts > WAKE_WINDOW_NS) {
    last->valid = 0;
    return 0;
  }
  if (bpf_get_current_task() != last->task)
    return 0;
  __u32 tgid = p->tgid;
  if (tgid != last->id.pid && !same_target(tgid, last->id.pid))
    return 0;
  /* Only a thread blocked in a receive call or waiting for readiness
   * (poll, select, epoll, io_uring) is woken by the datagram (not, say, a
   * worker thread its reader wakes through a futex): with syscall hooks,
   * as they noted it; without them, by the woken thread's own saved
   * syscall number (its call state made here the first time: an event
   * loop's thread may wait long before its first read). */
  __u32 tid = p->pid;
  struct xl_task *t = task_ctx(p);
  if (CFG.syscall_hooks) {
    if (!t || !(t->in_recv || t->in_wait))
      return 0;
  } else {
    if (p->flags & (PF_IO_WORKER_ | PF_KTHREAD_))
      return 0;
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(p);
    if (!regs)
      return 0;
    __u32 nr = (__u32)regs->orig_ax;
    if (!is_recv(nr) && !is_wait(nr))
      return 0;
    if (!t)
      t = bpf_task_storage_get(&TASK_CTX, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!t)
      return 0;
  }
  /* The thread read that datagram already (it was running when the
   * datagram came, so nothing was woken then): something else wakes it
   * now, within the window. */
  if (t->read_valid && t->read_seq == last->id.seq &&
      t->read_kind == last->id.kind && (last->id.flags & XLAP_FLAG_SEQ_VALID)) {
    last->valid = 0;
    return 0;
  }
  last->valid = 0;
  struct xl_ident id = last->id;
  id.pid = tgid; /* the reader: a forked child reads its parent's socket */
  emit(XLAP_POINT_SCHED_WAKEUP, now, &id, tid, 0, 0, task_scope(p));
  /* A thread still on its CPU (it had not slept yet) is not switched in
   * for this wake-up; the syscall hooks forget it at the call's exit. */
  if (CFG.syscall_hooks || !p->on_cpu)
    note_woken(t, &id);
  return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_sched_switch, bool preempt, struct task_struct *prev,
             struct task_struct *next) {
  RETURN_IF_EMPTY(0);
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
  struct xl_task *t = task_ctx(next);
  if (!t || !t->woken_pending)
    return 0;
  struct xl_ident copy = t->woken;
  if (take_woken(t))
    emit(XLAP_POINT_SCHED_SWITCH_IN, bpf_ktime_get_ns(), &copy, tid, 0, 0,
         task_scope(next));
  return 0;
}

#endif
