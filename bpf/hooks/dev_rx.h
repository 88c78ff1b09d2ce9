/* dev_rx.h: the driver hand-off points of the receive path (netif_rx,
 * napi_gro_receive_entry / napi_gro_frags_entry, netif_receive_skb).
 *
 * They run before any socket is known: a datagram is ours when its
 * destination port belongs to a traced socket in the device's network
 * namespace (TARGET_PORTS). Each point reads the packet where that point
 * finds it (packet.h), so a driver's fresh skb, a GRO super-packet (one
 * stamp per datagram) and a UDP tunnel (the inner datagram) are all keyed
 * by their own datagram; each notes what it read for the points after it
 * (rx_slots.h), so that netif_receive_skb and the socket point need not
 * read it again. */
#ifndef XLAP_CAPTURE_DEV_RX_H
#define XLAP_CAPTURE_DEV_RX_H

#include "lib/common.h"
#include "lib/flows.h"
#include "lib/packet.h"
#include "lib/rx_slots.h"

/* First fragments of traced datagrams, for their later fragments (which
 * carry no UDP header): fragment key -> identity. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32);
  __type(value, struct xl_ident);
} FRAG_RX SEC(".maps");

/* What the socket point of skb `skb` (read by `r`, datagram `d`) checks a
 * device note against, and the signature of its addresses: 0 when its IP
 * header is not at the start of the parse cache (a tunnel's inner
 * datagram, a short read), whose socket point reads it itself. */
static __always_inline int rx_note_of(struct sk_buff *skb, struct xl_rd *r,
                                      const struct xl_dgram *d,
                                      struct xl_rx_note *n) {
  if (d->tunnel || d->l3 || r->c_off || r->c_len < XL_CACHE)
    return 0;
  int v6 = r->c[0] >> 4 == 6;
  n->addr_sig = addr_sig((const __u32 *)(r->c + (v6 ? 8 : 12)), v6);
  __builtin_memcpy(&n->ip8, r->c + 4, 8);
  n->skb_len = skb->len;
  return 1;
}

/* `notes`: the point notes what it read for the points after it (every
 * device point of a run with the socket-queue point): the first device
 * point an skb meets overwrites or forgets whatever an earlier skb at the
 * same address left, netif_receive_skb (which every received skb passes)
 * takes a note of this very skb instead of reading it again
 * (stamp_rx_noted) or reads and notes it itself, and the socket-queue
 * point takes the note in turn (sock_rx.h). A note an skb left at a device
 * and never took further (dropped in a backlog, merged by GRO) is told
 * from the skb now at that address by its length, its first bytes (64
 * from the IP header at netif_receive_skb, 8 of the IP header at the
 * socket) and its age. */
static __always_inline void stamp_rx_dev_at(struct xl_rd *r, __u16 point,
                                            struct sk_buff *skb,
                                            struct net_device *dev, int notes) {
  __u64 key = (__u64)skb;
  struct xl_dgram d = {};
  int ret = parse_rx(skb, r, &d);
  if (ret == XL_FOREIGN) {
    if (notes)
      rx_forget_at_device(key);
    return;
  }
  __u64 now = bpf_ktime_get_ns();
  if (ret == XL_LATER_FRAGMENT) {
    if (notes)
      rx_forget_at_device(key);
    struct xl_ident *f = bpf_map_lookup_elem(&FRAG_RX, &d.frag_key);
    if (!f)
      return; /* not ours (or its first fragment was not seen) */
    struct xl_ident id = *f;
    id.flags |= XLAP_FLAG_FRAGMENT;
    struct xl_at at = {.point = point,
                       .ts = now,
                       .ifindex = dev->ifindex,
                       .queue = skb->queue_mapping,
                       .rx_netns = dev->nd_net.net->ns.inum};
    xl_emit(&at, &id);
    return;
  }
  struct xlap_port_key pk = {.netns = dev->nd_net.net->ns.inum,
                             .port = d.dport};
  /* PORTS_ANY first (an array load): another process's datagram, the
   * common case on a busy host, costs no hash lookup. */
  __u32 port = d.dport;
  __u8 *any = bpf_map_lookup_elem(&PORTS_ANY, &port);
  __u32 *owner =
      any && *any ? bpf_map_lookup_elem(&TARGET_PORTS, &pk) : (__u32 *)0;
  if (notes && (!owner || ret != XL_OK))
    rx_forget_at_device(key);
  if (!owner)
    return;
  if (ret != XL_OK) {
    count_loss(point, ret == XL_UNREADABLE ? XLAP_LOSS_FRAG : XLAP_LOSS_PARSE);
    return;
  }
  struct xl_ident id = {.pid = *owner};
  struct xl_segs *segs;
  __u32 loss = XLAP_LOSS_PARSE, beyond = 0;
  /* A linear skb is one datagram (GRO builds paged skbs): its shared info
   * holds nothing for us unless a device may have timed it. */
  struct xl_shinfo sh = {};
  if (CFG.device_rx_times || skb->data_len)
    skb_shinfo_read(skb, r->h, &sh);
  __u32 got = read_datagrams(sh.gso_size, r, &d, &id, &segs, &loss, &beyond);
  if (beyond)
    count_losses(point, loss, beyond);
  if (!got) {
    if (notes)
      rx_forget_at_device(key);
    count_loss(point, loss);
    return;
  }
  if (d.frag == 1)
    bpf_map_update_elem(&FRAG_RX, &d.frag_key, &id, BPF_ANY);
  int keep = got > 1 || sample_keeps(&id);
  /* For the points after this one (a whole datagram, not a fragment:
   * reassembly hands its socket another skb). */
  if (notes) {
    /* An entry point's note of one datagram whose seq and kind lie in
     * the first 64 bytes (the parse cache) may spare netif_receive_skb
     * its parse. */
    struct xl_rx_note n = {
        .now = now,
        .unsampled = !keep,
        .reusable = point != XLAP_POINT_DEV_RECEIVE_SKB && got == 1 &&
                    d.pay + CFG.win_start + CFG.win_len <= XL_CACHE,
        .head = (const __u64 *)r->c};
    if (!d.frag && !beyond && rx_note_of(skb, r, &d, &n))
      rx_note_at_device(key, &n, &id, segs, got);
    else
      rx_forget_at_device(key);
  }
  if (!keep)
    return; /* outside the run's sample (--sample) */
  struct xl_at at = {.point = point,
                     .ts = now,
                     .hw_ts = sh.hw_ts,
                     .ifindex = dev->ifindex,
                     .queue = skb->queue_mapping,
                     .rx_netns = pk.netns};
  emit_all(&at, &id, segs, got);
}

/* The stamp of an skb an entry point of this host noted (netif_rx or a GRO
 * entry, before netif_receive_skb), taken from the note without parsing
 * again (the parse and the port lookup were half of this point's cost):
 * when the note is fresh, of one datagram, of an skb at the same address
 * with the same length, and the skb's first 64 bytes from its IP header,
 * which hold its addresses, ports, seq and kind, are the very bytes the
 * note was read from (one read instead of the parse). Anything else (a
 * note an skb dropped in a backlog or merged by GRO left behind, and an skb
 * now at its address that met no entry point, such as a TAP's) is read
 * as before. The note is then this point's own, for the socket point.
 * Returns 1 when the note was this skb's. */
static __always_inline int stamp_rx_noted(struct xl_rd *r, __u16 point,
                                          struct sk_buff *skb,
                                          struct net_device *dev) {
  __u64 key = (__u64)skb;
  __u64 now = bpf_ktime_get_ns();
  struct xl_rx_slot *s = rx_device_note(key, now, skb->len);
  if (!s || !s->reusable || s->nseg != 1)
    return 0;
  rd_init(r, skb);
  rd_fill(r, 0);
  if (r->c_len != XL_CACHE || !rx_head_matches(s, (const __u64 *)r->c))
    return 0;
  s->born = now;
  s->reusable = 0;
  if (s->unsampled)
    return 1;
  struct xl_at at = {.point = point,
                     .ts = now,
                     .ifindex = dev->ifindex,
                     .queue = skb->queue_mapping,
                     .rx_netns = dev->nd_net.net->ns.inum};
  xl_emit(&at, &s->id);
  return 1;
}

static __always_inline void stamp_rx_dev(__u16 point, struct sk_buff *skb,
                                         int notes) {
  struct net_device *dev = skb->dev;
  struct xl_rd r;
  if (!dev || !iface_allowed(dev) || rd_enter(&r)) {
    /* No room (deeper nesting than XL_ROOM_LEVELS): whose the skb is is
     * not known before parsing; left out, as a foreign one. */
    if (notes)
      rx_forget_at_device((__u64)skb);
    return;
  }
  if (!(notes && point == XLAP_POINT_DEV_RECEIVE_SKB && !CFG.device_rx_times &&
        stamp_rx_noted(&r, point, skb, dev)))
    stamp_rx_dev_at(&r, point, skb, dev, notes);
  rd_leave(&r);
}

SEC("tp_btf/netif_rx")
int BPF_PROG(on_netif_rx, struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  stamp_rx_dev(XLAP_POINT_DEV_NETIF_RX, skb, CFG.rx_notes);
  return 0;
}

SEC("tp_btf/napi_gro_receive_entry")
int BPF_PROG(on_napi_gro_receive_entry, struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  stamp_rx_dev(XLAP_POINT_DEV_GRO_RECEIVE, skb, CFG.rx_notes);
  return 0;
}

/* A driver that hands over page fragments (napi_gro_frags): napi_frags_skb
 * has pulled the Ethernet header into the (possibly empty) linear area and
 * set skb->protocol before the tracepoint, so the network header is at
 * skb->data, as for the other points; the headers may sit in page
 * fragments, which the dynptr reader follows. */
SEC("tp_btf/napi_gro_frags_entry")
int BPF_PROG(on_napi_gro_frags_entry, struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  stamp_rx_dev(XLAP_POINT_DEV_GRO_RECEIVE, skb, CFG.rx_notes);
  return 0;
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(on_netif_receive_skb, struct sk_buff *skb) {
  RETURN_IF_EMPTY(0);
  stamp_rx_dev(XLAP_POINT_DEV_RECEIVE_SKB, skb, CFG.rx_notes);
  return 0;
}

#endif
