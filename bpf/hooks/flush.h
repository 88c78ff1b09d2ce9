/* flush.h: the per-CPU batches exported on a timer. A batch otherwise
 * leaves when it is full, when its next stamp finds it older than
 * XLAP_BATCH_MAX_AGE_NS, or when its CPU goes idle; on a CPU that stays
 * busy with other work after the traced protocol's last stamp, it would
 * wait until the run ends, and a recorder that dies before then loses it.
 * Userspace runs this program on every CPU every XLAP_FLUSH_INTERVAL_MS
 * (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU, Linux 5.10+): it is never
 * attached to a tracepoint. On another CPU it runs in the IPI that
 * carries it, so it can interrupt an append on that CPU: the nesting
 * guard makes it leave that batch alone (the next tick takes it). */
#ifndef XLAP_CAPTURE_FLUSH_H
#define XLAP_CAPTURE_FLUSH_H

#include "lib/common.h"

SEC("raw_tp")
int on_flush_timer(void *ctx) {
  __u32 zero = 0;
  struct xlap_batch *b = bpf_map_lookup_elem(&BATCH, &zero);
  if (!b || !b->n)
    return 0;
  if (batch_enter(b) == 0)
    flush(b);
  batch_leave(b);
  return 0;
}

#endif
