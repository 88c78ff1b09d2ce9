/* dev_rx.h: the driver hand-off points of the receive path (netif_rx,
 * napi_gro_receive_entry / napi_gro_frags_entry, netif_receive_skb).
 *
 * They run before any socket is known: a datagram is ours when its
 * destination port belongs to a traced socket in the device's network
 * namespace (TARGET_PORTS). Each point reads the packet where that point
 * finds it (packet.h), so a driver's fresh skb, a GRO super-packet (one
 * stamp per datagram) and a UDP tunnel (the inner datagram) are all keyed
 * by their own datagram. */
#ifndef XLAP_CAPTURE_DEV_RX_H
#define XLAP_CAPTURE_DEV_RX_H

#include "lib/common.h"
#include "lib/packet.h"

/* First fragments of traced datagrams, for their later fragments (which
 * carry no UDP header): fragment key -> identity. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32);
  __type(value, struct xl_ident);
} FRAG_RX SEC(".maps");

static __always_inline void stamp_rx_dev(__u16 point, struct sk_buff *skb) {
  struct net_device *dev = skb->dev;
  if (!dev || !iface_allowed(dev))
    return;
  struct xl_rd r;
  struct xl_dgram d = {};
  int ret = parse_rx(skb, &r, &d);
  if (ret == XL_FOREIGN)
    return;
  __u64 now = bpf_ktime_get_ns();
  if (ret == XL_LATER_FRAGMENT) {
    struct xl_ident *f = bpf_map_lookup_elem(&FRAG_RX, &d.frag_key);
    if (!f)
      return; /* not ours (or its first fragment was not seen) */
    struct xl_ident id = *f;
    id.flags |= XLAP_FLAG_FRAGMENT;
    emit(point, now, &id, 0, dev->ifindex, skb->queue_mapping, 0);
    return;
  }
  struct xlap_port_key pk = {.netns = dev->nd_net.net->ns.inum,
                             .port = d.dport};
  __u32 *owner = bpf_map_lookup_elem(&TARGET_PORTS, &pk);
  if (!owner)
    return;
  if (ret != XL_OK) {
    count_loss(point, ret == XL_UNREADABLE ? XLAP_LOSS_FRAG : XLAP_LOSS_PARSE);
    return;
  }
  struct xl_ident id = {.pid = *owner};
  struct xl_segs *segs;
  __u32 loss = XLAP_LOSS_PARSE, beyond = 0;
  struct xl_shinfo sh;
  skb_shinfo_read(skb, &sh);
  __u32 got = read_datagrams(sh.gso_size, &r, &d, &id, &segs, &loss, &beyond);
  if (beyond)
    count_losses(point, loss, beyond);
  if (!got) {
    count_loss(point, loss);
    return;
  }
  if (d.frag == 1)
    bpf_map_update_elem(&FRAG_RX, &d.frag_key, &id, BPF_ANY);
  if (got == 1 && !sample_keeps(&id))
    return; /* outside the run's sample (--sample) */
  struct xl_at at = {.point = point,
                     .ts = now,
                     .hw_ts = sh.hw_ts,
                     .ifindex = dev->ifindex,
                     .queue = skb->queue_mapping};
  emit_all(&at, &id, segs, got);
}

SEC("tp_btf/netif_rx")
int BPF_PROG(on_netif_rx, struct sk_buff *skb) {
  stamp_rx_dev(XLAP_POINT_DEV_NETIF_RX, skb);
  return 0;
}

SEC("tp_btf/napi_gro_receive_entry")
int BPF_PROG(on_napi_gro_receive_entry, struct sk_buff *skb) {
  stamp_rx_dev(XLAP_POINT_DEV_GRO_RECEIVE, skb);
  return 0;
}

/* A driver that hands over page fragments (napi_gro_frags): napi_frags_skb
 * has pulled the Ethernet header into the (possibly empty) linear area and
 * set skb->protocol before the tracepoint, so the network header is at
 * skb->data, as for the other points; the headers may sit in page
 * fragments, which the dynptr reader follows. */
SEC("tp_btf/napi_gro_frags_entry")
int BPF_PROG(on_napi_gro_frags_entry, struct sk_buff *skb) {
  stamp_rx_dev(XLAP_POINT_DEV_GRO_RECEIVE, skb);
  return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(on_netif_receive_skb, struct sk_buff *skb) {
  stamp_rx_dev(XLAP_POINT_DEV_RECEIVE_SKB, skb);
  return 0;
}

#endif
