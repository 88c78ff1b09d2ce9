// SPDX-License-Identifier: GPL-2.0
/* capture.bpf.c: kernel stamp points of xlap-trace.
 *
 * Tracepoints only (no kprobes/fentry on our kernels), plus two cgroup
 * hooks: tp_btf for the syscall, net, qdisc and sched points, cgroup_skb
 * ingress for the socket queue, cgroup sock_create to follow the traced
 * processes' sockets. Every stamp carries the protocol's own sequence
 * number and kind, read from the UDP payload (CFG) in the skb or the
 * syscall's user buffer. Traffic of other processes costs one map lookup.
 *
 * One file per hook family, in the order a datagram meets them; common.h
 * holds identity and the stamp path, packet.h the packet reader, layout.h
 * where a datagram keeps its seq and kind, flows.h its addresses:
 *
 *   syscall.h   app/socket boundary: send and receive syscalls
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
#include "capture/common.h"
#include "capture/packet.h"
#include "capture/task.h"

#include "capture/dev_rx.h"
#include "capture/dev_tx.h"
#include "capture/flush.h"
#include "capture/holds.h"
#include "capture/qdisc.h"
#include "capture/sched.h"
#include "capture/sock_rx.h"
#include "capture/sockets.h"
#include "capture/syscall.h"
#include "capture/uring.h"
#include "capture/usdt.h"

char LICENSE[] SEC("license") = "GPL";
