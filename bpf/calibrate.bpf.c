// SPDX-License-Identifier: GPL-2.0
/* calibrate.bpf.c: the cost floor of this machine's BPF, for the benchmark
 * (`just bench`): an empty program, one hash lookup, and one ring-buffer
 * record of a stamp's size, all on sched_switch, measured with the kernel's
 * BPF run-time statistics like the capture programs. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "xlap_abi.h"

char LICENSE[] SEC("license") = "GPL";

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32);
  __type(value, __u64);
} CAL_HASH SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 24);
} CAL_RING SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(cal_empty, bool preempt, struct task_struct *prev,
             struct task_struct *next) {
  return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(cal_lookup, bool preempt, struct task_struct *prev,
             struct task_struct *next) {
  __u32 key = next->pid;
  return bpf_map_lookup_elem(&CAL_HASH, &key) != 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(cal_emit, bool preempt, struct task_struct *prev,
             struct task_struct *next) {
  struct xlap_stamp *s = bpf_ringbuf_reserve(&CAL_RING, sizeof(*s), 0);
  if (!s)
    return 0;
  s->ts_ns = bpf_ktime_get_ns();
  s->tid = next->pid;
  bpf_ringbuf_submit(s, BPF_RB_NO_WAKEUP);
  return 0;
}
