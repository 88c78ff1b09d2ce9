/* lib/tx.h: the skb -> identity map of the transmit side (dev_tx.h,
 * qdisc.h): where an skb's identity waits between its device points,
 * and the stamp of a device point for the datagrams it carries. */
#ifndef XLAP_LIB_TX_H
#define XLAP_LIB_TX_H

#include "lib/common.h"
#include "lib/flows.h"
#include "lib/packet.h"
#include "lib/task.h"

#define NETDEV_TX_BUSY_ 0x10
/* Devices one skb may be stacked through before we stop counting. */
#define TX_DEPTH_MAX 8

struct xl_tx {
  struct xl_ident id; /* datagram 0 */
  __u64 sk;           /* skb->sk when queued */
  __u16 nseg;       /* datagrams with stamps (GSO: several, in SKB_SEGS); 0: the
                     first device point could not read it (unread_loss) */
  __u16 beyond;     /* datagrams over XLAP_MAX_SEGS (or unread): counted per
                       point */
  __u8 depth : 4;   /* devices it is queued on and not yet sent by */
  __u8 started : 4; /* of those, the ones in their driver (start_xmit seen,
                       xmit not yet): one fewer than depth, or the same
                       while the lowest is in its driver */
  __u8 unread_loss; /* why an skb of nseg 0 was not read (xlap_loss) */
  __u8 unsampled;   /* one datagram, outside the run's sample (--sample):
                       its later points look it up and return */
  __u8 first_fragment; /* the first fragment of a datagram */
};

/* Where an skb's identity waits between its device points: first a
 * direct-mapped table indexed by a hash of the skb's address, a slot
 * claimed by one compare-and-swap and freed by another (an array lookup
 * the JIT inlines: no helper call, no bucket lock); an skb whose slot is
 * taken goes to the SKB_TX hash below. The hash update was the largest
 * single cost of the transmit path (perf on the pinned sockperf
 * ping-pong: 5 % of the CPU, more than the program itself). A slot whose
 * skb never reached a last point (freed on a path without a tracepoint)
 * is taken over after TX_SLOT_STALE_JIFFIES. The receive side has its own
 * table (lib/rx_slots.h). */
#define TX_SLOT_STALE_JIFFIES 1000 /* 1 s at HZ=1000, 10 s at HZ=100 */

struct xl_tx_slot {
  __u64 key;  /* struct sk_buff *, 0 when free */
  __u64 born; /* when claimed, in jiffies */
  struct xl_tx e;
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, SKB_SLOTS);
  __type(key, __u32);
  __type(value, struct xl_tx_slot);
} TX_SLOT SEC(".maps");

/* Entries in SKB_TX (an upper bound): while it is zero, a miss in the
 * slot table is a miss, with no hash lookup (the foreign skbs every
 * device point sees). */
__u64 TX_HASHED = 0;

/* A plain preallocated hash with explicit deletes (at the last transmit, on
 * a drop, or when the address shows up for a foreign packet): an LRU update
 * costs several times more. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 65536);
  __type(key, __u64); /* struct sk_buff * */
  __type(value, struct xl_tx);
} SKB_TX SEC(".maps");

/* The datagrams of GSO skbs in SKB_TX. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64); /* struct sk_buff * */
  __type(value, struct xl_segs);
} SKB_SEGS SEC(".maps");

/* GSO entries alive (an upper bound): consume_skb, which fires for every
 * freed skb of the machine, only looks further while it is non-zero. */
__u64 GSO_PENDING = 0;

/* The skb each CPU's driver entry last took (0 once it returned): a
 * stacked device queues its skb on the lower device from inside its own
 * driver, on the same CPU, with nothing transmitted in between. An entry
 * found at a queue point is that skb's only if this is it; otherwise it
 * is an earlier skb's at the same address, whose last points missed it
 * (detached at a run's end, or freed on a path without a tracepoint). */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} TX_IN_DRIVER SEC(".maps");

static __always_inline void tx_note_driver(__u64 key) {
  __u32 zero = 0;
  __u64 *k = bpf_map_lookup_elem(&TX_IN_DRIVER, &zero);
  if (k)
    *k = key;
}

/* Whether skb `key`, found with entry `e` at a queue point, is being
 * queued on a lower device from inside the upper one's driver. */
static __always_inline int tx_requeued_below(__u64 key, struct sk_buff *skb,
                                             const struct xl_tx *e) {
  if (!e->depth || e->sk != (__u64)skb->sk || e->started != e->depth)
    return 0;
  __u32 zero = 0;
  __u64 *k = bpf_map_lookup_elem(&TX_IN_DRIVER, &zero);
  return k && *k == key;
}

static __always_inline struct xl_tx_slot *tx_slot(__u64 key) {
  __u32 i = skb_slot_index(key);
  return bpf_map_lookup_elem(&TX_SLOT, &i);
}

/* The identity waiting for skb `key`, if any. */
static __always_inline struct xl_tx *tx_find(__u64 key) {
  struct xl_tx_slot *s = tx_slot(key);
  if (s && s->key == key)
    return &s->e;
  if (!TX_HASHED)
    return 0;
  return bpf_map_lookup_elem(&SKB_TX, &key);
}

/* Stores the identity of skb `key` (at its first device). Returns 0, or
 * non-zero when neither the slot nor the hash had room. */
static __always_inline long tx_put(__u64 key, const struct xl_tx *e) {
  struct xl_tx_slot *s = tx_slot(key);
  if (s) {
    /* Jiffies: staleness needs no precision, and the clock costs a
     * stamp's worth (tracing programs may not read the coarse one). */
    __u64 old = s->key, now = bpf_jiffies64();
    if ((old == 0 || old == key || now - s->born > TX_SLOT_STALE_JIFFIES) &&
        __sync_val_compare_and_swap(&s->key, old, key) == old) {
      s->born = now;
      s->e = *e;
      return 0;
    }
  }
  long err = bpf_map_update_elem(&SKB_TX, &key, e, BPF_ANY);
  if (!err)
    __sync_fetch_and_add(&TX_HASHED, 1);
  return err;
}

static __always_inline void tx_forget(__u64 key, const struct xl_tx *e) {
  if (e->nseg > 1 && bpf_map_delete_elem(&SKB_SEGS, &key) == 0)
    __sync_fetch_and_add(&GSO_PENDING, -1);
  struct xl_tx_slot *s = tx_slot(key);
  if (s && s->key == key) {
    __sync_val_compare_and_swap(&s->key, key, 0);
    return;
  }
  if (TX_HASHED && bpf_map_delete_elem(&SKB_TX, &key) == 0)
    __sync_fetch_and_add(&TX_HASHED, -1);
}

/* One stamp per datagram of a known skb. */
static __always_inline void stamp_tx(__u16 point, __u64 key,
                                     const struct xl_tx *e,
                                     struct net_device *dev, __u16 queue,
                                     __u32 priority) {
  if (e->unsampled || !point_on(point))
    return; /* before the clock read: a lookup and a return */
  struct xl_at at = {.point = point,
                     .ts = bpf_ktime_get_ns(),
                     .tid = (__u32)bpf_get_current_pid_tgid(),
                     .ifindex = dev->ifindex,
                     .priority = priority,
                     .queue = queue,
                     .scope = dev_scope(dev)};
  if (!e->nseg) {
    count_losses(point, e->unread_loss, e->beyond);
    return;
  }
  struct xl_segs *segs = 0;
  __u32 n = 1;
  if (e->nseg > 1) {
    segs = bpf_map_lookup_elem(&SKB_SEGS, &key);
    if (segs)
      n = e->nseg;
    else
      count_losses(point, XLAP_LOSS_MAP_FULL, e->nseg - 1);
  }
  emit_all(&at, &e->id, segs, n);
  if (e->beyond)
    count_losses(point, XLAP_LOSS_GSO, e->beyond);
}

#endif
