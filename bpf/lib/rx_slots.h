/* rx_slots.h: a received datagram's identity, from the socket queue to the
 * reader. The socket-queue point (hooks/sock_rx.h) reads the headers once;
 * the receive call that takes the skb (hooks/calls.h) finds the identity
 * again by the skb's address instead of reading the datagram a second
 * time (from the skb or from the reader's buffer).
 *
 * A direct-mapped table indexed by a hash of the address, as on the
 * transmit side (dev_tx.h TX_SLOT): an array lookup the JIT inlines, a slot
 * claimed and freed by compare-and-swap. The datagrams of a UDP GRO skb
 * (several per skb) wait in RX_SEGS. An skb that never reaches a reader
 * (dropped at a full receive buffer, its socket closed) leaves its slot,
 * which the next skb hashing there takes over after RX_SLOT_STALE_NS; a
 * datagram whose slot was taken is counted lost ('map_full') at
 * sock.recv_exit, never stamped with another's identity (the address is
 * compared whole). */
#ifndef XLAP_CAPTURE_RX_SLOTS_H
#define XLAP_CAPTURE_RX_SLOTS_H

#include "common.h"

#define RX_SLOT_STALE_NS 1000000000ULL

struct xl_rx_slot {
  __u64 key;          /* struct sk_buff *, 0 when free */
  __u64 born;         /* when claimed (also tells a reused address apart) */
  struct xl_ident id; /* datagram 0; pid: the socket's owner */
  __u32 nseg;         /* datagrams (a GRO skb: several, in RX_SEGS) */
  __u32 _pad;
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, SKB_SLOTS);
  __type(key, __u32);
  __type(value, struct xl_rx_slot);
} RX_SLOT SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1024);
  __type(key, __u64); /* struct sk_buff * */
  __type(value, struct xl_segs);
} RX_SEGS SEC(".maps");

static __always_inline struct xl_rx_slot *rx_slot(__u64 key) {
  __u32 i = skb_slot_index(key);
  return bpf_map_lookup_elem(&RX_SLOT, &i);
}

/* Notes the identity of the datagrams of skb `key` (`got` of them, 1..n;
 * datagrams 1.. in `segs`). Returns 0, or -1 when its slot is held by a
 * live skb (the reader's stamp is then counted lost). A function of its
 * own (a static BPF subprogram): inlined, it grew the socket-queue
 * program's frame past the combined stack limit. */
static __attribute__((noinline)) int rx_put(__u64 key, __u64 now,
                                            const struct xl_ident *id,
                                            const struct xl_segs *segs,
                                            __u32 got) {
  struct xl_rx_slot *s = rx_slot(key);
  if (!s)
    return -1;
  __u64 old = s->key;
  if (old && old != key && now - s->born < RX_SLOT_STALE_NS)
    return -1;
  if (__sync_val_compare_and_swap(&s->key, old, key) != old)
    return -1;
  if (old && old != key)
    bpf_map_delete_elem(&RX_SEGS, &old); /* a stale GRO skb's datagrams */
  s->born = now;
  s->id = *id;
  s->nseg = 1;
  if (got > 1 && segs &&
      bpf_map_update_elem(&RX_SEGS, &key, segs, BPF_ANY) == 0)
    s->nseg = got;
  return 0;
}

/* The slot of skb `key`, if the socket-queue point noted it. */
static __always_inline struct xl_rx_slot *rx_find(__u64 key) {
  struct xl_rx_slot *s = rx_slot(key);
  return s && s->key == key ? s : 0;
}

/* Frees slot `s` of skb `key` (its RX_SEGS entry stays: the reader's stamp
 * takes it). */
static __always_inline void rx_free(struct xl_rx_slot *s, __u64 key) {
  __sync_val_compare_and_swap(&s->key, key, 0);
}

#endif
