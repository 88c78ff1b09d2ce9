/* sockets.h: the sockets and processes of the traced programs. Sockets are
 * marked in socket local storage (SOCKS) as they are created (userspace
 * marks those that existed before tracing began); their ports are
 * registered once a bind succeeds; children a traced process forks are
 * traced too (their sockets then get marked as they are created), and so is
 * a process found in a target cgroup (TARGET_CGROUPS) when it creates a
 * socket or forks. */
#ifndef XLAP_CAPTURE_SOCKETS_H
#define XLAP_CAPTURE_SOCKETS_H

#include "lib/common.h"

SEC("cgroup/sock_create")
int on_sock_create(struct bpf_sock *sk) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!bpf_map_lookup_elem(&TARGET_PIDS, &tgid)) {
    /* A process that entered a target cgroup after the run began. */
    if (!in_target_cgroup())
      return 1;
    adopt(tgid);
  }
  struct xlap_sock *s =
      bpf_sk_storage_get(&SOCKS, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
  if (s) {
    s->tgid = tgid;
    s->cookie = bpf_get_socket_cookie(sk);
  }
  return 1; /* never refuses a socket */
}

/* A bind of a traced UDP socket that succeeded (the kernel runs post_bind
 * after the port is taken, ephemeral ones included): its port is ours from
 * the first datagram on. A bind that fails claims nothing; TCP sockets are
 * not registered. */
static __always_inline int post_bind(struct bpf_sock *sk) {
  if (sk->protocol != IPPROTO_UDP_)
    return 1;
  struct xlap_sock *s = bpf_sk_storage_get(&SOCKS, sk, 0, 0);
  if (!s)
    return 1;
  struct task_struct *task = bpf_get_current_task_btf();
  register_port(s, task->nsproxy->net_ns->ns.inum, (__u16)sk->src_port);
  return 1;
}

SEC("cgroup/post_bind4")
int on_post_bind4(struct bpf_sock *sk) { return post_bind(sk); }

SEC("cgroup/post_bind6")
int on_post_bind6(struct bpf_sock *sk) { return post_bind(sk); }

/* A traced process forking: the child is traced too (a pre-forking server,
 * a shell script starting the protocol). Threads need nothing: they share
 * the tgid. The value is the target the child descends from. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_sched_process_fork, struct task_struct *parent,
             struct task_struct *child) {
  if (child->pid != child->tgid)
    return 0; /* a new thread */
  __u32 ptgid = parent->tgid;
  __u32 ctgid = child->tgid;
  __u32 *root = bpf_map_lookup_elem(&TARGET_PIDS, &ptgid);
  if (!root) {
    /* A parent that entered a target cgroup after the run began (the
     * child is where the parent is: a fork into another cgroup,
     * CLONE_INTO_CGROUP, is left to the child's own socket or exec). */
    if (in_target_cgroup()) {
      adopt(ptgid);
      adopt(ctgid);
    }
    return 0;
  }
  __u32 r = *root;
  bpf_map_update_elem(&TARGET_PIDS, &ctgid, &r, BPF_ANY);
  return 0;
}

#endif
