/* holds.h: a traced process is held where its code changes, so that its
 * markers are attached before they can fire: at its exec (a shell script
 * starting the protocol, `env`, `timeout`), and where the dynamic loader
 * tells debuggers that it mapped libraries (at start-up and at dlopen).
 * The process is stopped with SIGSTOP, taken before it returns to user
 * mode, and userspace resumes it with SIGCONT once the markers of what was
 * mapped are attached (record/markers.rs). Userspace attaches these only
 * when markers are traced. */
#ifndef XLAP_CAPTURE_HOLDS_H
#define XLAP_CAPTURE_HOLDS_H

#include "lib/common.h"

#define SIGSTOP_ 19

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 14);
} HOLDS SEC(".maps");

static __always_inline void hold(__u32 why) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return;
  struct xlap_hold *h = bpf_ringbuf_reserve(&HOLDS, sizeof(*h), 0);
  if (!h)
    return; /* not held: a full ring means userspace is not reading */
  h->ts_ns = bpf_ktime_get_ns();
  h->pid = tgid;
  h->why = why;
  h->stop = bpf_send_signal(SIGSTOP_);
  h->_pad = 0;
  bpf_ringbuf_submit(h, 0); /* wakes the reader at once */
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_sched_process_exec, struct task_struct *p, pid_t old_pid,
             struct linux_binprm *bprm) {
  hold(XLAP_HOLD_EXEC);
  return 0;
}

/* Attached per process to its loader's _dl_debug_state, which glibc and
 * musl call after mapping objects and before running any of their code. */
SEC("uprobe")
int on_loader_hook(struct pt_regs *ctx) {
  hold(XLAP_HOLD_LOADER);
  return 0;
}

#endif
