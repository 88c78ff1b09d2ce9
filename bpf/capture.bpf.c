// SPDX-License-Identifier: GPL-2.0
/* capture.bpf.c: kernel stamp points of xlap-trace.
 *
 * Tracepoints only (no kprobes/fentry on our kernels), plus cgroup hooks:
 * tp_btf for the socket-call (or, opt-in, syscall), net, qdisc and sched
 * points, cgroup_skb ingress for the socket queue, cgroup sendmsg4/6 for
 * the start of a send that names its destination, cgroup sock_create and
 * post_bind to follow the traced processes' sockets. Every stamp carries the
 * protocol's own sequence number and kind, read from the UDP payload (CFG) in
 * the skb or the syscall's user buffer. Traffic of other processes costs one
 * map lookup.
 *
 * Libraries apart from programs. lib/ holds no program: common.h identity
 * and the stamp path, packet.h the packet reader, layout.h where a
 * datagram keeps its seq and kind, flows.h its addresses, task.h per-thread
 * call state. hooks/ has one file per hook family, in the order a datagram
 * meets them (a hook that shares another's state includes it: qdisc.h the
 * transmit slots of dev_tx.h, uring.h the call state of syscall.h); the
 * recorder's hook table (userspace/xlap-capture/src/hooks.rs) names each
 * program, and a test checks it against the SEC() lines here:
 *
 *   syscall.h   app/socket boundary: send and receive syscalls (default)
 *   calls.h     the same at the socket calls (--boundary socket-calls)
 *   uring.h     the same for io_uring send and receive requests
 *   sockets.h   the traced processes' sockets
 *   dev_tx.h    device transmit (queue, driver entry and return)
 *   qdisc.h     qdisc enqueue and dequeue
 *   dev_rx.h    driver hand-off on receive (netif_rx, GRO, receive_skb)
 *   sock_rx.h   the datagram handed to its socket
 *   sched.h     the reader's wake-up and switch-in
 *   usdt.h      application markers
 *   holds.h     processes held at exec and library loads for their markers
 *   flush.h     the per-CPU batches exported on a timer
 */
#include "lib/common.h"
#include "lib/packet.h"
#include "lib/task.h"

#include "hooks/calls.h"
#include "hooks/dev_rx.h"
#include "hooks/dev_tx.h"
#include "hooks/flush.h"
#include "hooks/holds.h"
#include "hooks/qdisc.h"
#include "hooks/sched.h"
#include "hooks/sock_rx.h"
#include "hooks/sockets.h"
#include "hooks/syscall.h"
#include "hooks/uring.h"
#include "hooks/usdt.h"

char LICENSE[] SEC("license") = "GPL";
