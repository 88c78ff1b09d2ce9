/* sockets.h: the sockets of the traced processes, marked in socket local
 * storage (SOCKS) as they are created; userspace marks those that existed
 * before tracing began. */
#ifndef XLAP_CAPTURE_SOCKETS_H
#define XLAP_CAPTURE_SOCKETS_H

#include "common.h"

SEC("cgroup/sock_create")
int on_sock_create(struct bpf_sock *sk) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!bpf_map_lookup_elem(&TARGET_PIDS, &tgid))
    return 1;
  struct xlap_sock *s =
      bpf_sk_storage_get(&SOCKS, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
  if (s)
    s->tgid = tgid;
  return 1; /* never refuses a socket */
}

#endif
