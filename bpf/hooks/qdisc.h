/* qdisc.h: the queueing discipline's enqueue and dequeue of a datagram
 * already identified at the device queue point. */
#ifndef XLAP_CAPTURE_QDISC_H
#define XLAP_CAPTURE_QDISC_H

#include "lib/common.h"
#include "lib/tx.h"

static __always_inline void stamp_qdisc(__u16 point, struct sk_buff *skb) {
  if (!skb)
    return;
  __u64 key = (__u64)skb;
  struct xl_tx *e = tx_find(key);
  if (!e || !iface_allowed(skb->dev))
    return;
  stamp_tx(point, key, e, skb->dev, skb->queue_mapping, skb->priority);
}

SEC("tp_btf/qdisc_enqueue")
int BPF_PROG(on_qdisc_enqueue, struct Qdisc *q, const struct netdev_queue *txq,
             struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  stamp_qdisc(XLAP_POINT_QDISC_ENQUEUE, skb);
  return 0;
}

SEC("tp_btf/qdisc_dequeue")
int BPF_PROG(on_qdisc_dequeue, struct Qdisc *q, const struct netdev_queue *txq,
             int packets, struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  stamp_qdisc(XLAP_POINT_QDISC_DEQUEUE, skb); /* NULL when queue empty */
  return 0;
}

#endif
