/* rx_slots.h: a received datagram's identity, from its first device point
 * to the reader. The device points note what they read (RX_AT_DEVICE):
 * netif_receive_skb, which every received skb passes, finds the note of
 * an earlier device point (netif_rx, a GRO entry) by the skb's address
 * instead of reading the headers again, or reads and notes them itself;
 * the socket-queue point (hooks/sock_rx.h) finds the note the same way,
 * and marks it queued (RX_QUEUED) for the receive call that takes the skb
 * (hooks/calls.h), which then reads nothing either.
 *
 * A direct-mapped table indexed by a hash of the address, as on the
 * transmit side (dev_tx.h TX_SLOT): an array lookup the JIT inlines, a slot
 * claimed and freed by compare-and-swap. The datagrams of a UDP GRO skb
 * (several per skb) wait in RX_SEGS. Nothing frees a note when its skb is
 * dropped before its socket, but the next skb at that address passes
 * a device point too, which overwrites or forgets the note; the later
 * points also check that the note is fresh and that the skb's length and
 * its first bytes still match (netif_receive_skb: 64 bytes from the IP
 * header; the socket point: 8 bytes of the IP header), else they read the
 * headers themselves.
 * An skb that never reaches a reader leaves its slot, which the next skb
 * hashing there takes over (after RX_DEVICE_FRESH_NS for a device note,
 * RX_SLOT_STALE_NS for a queued one); the read of a datagram that found
 * no slot, or whose slot was taken, is told from the reader's buffer where
 * its call has one (hooks/syscall.h calls_recv_return), else counted lost
 * ('unmatched') at sock.recv_exit, never stamped with another's identity
 * (the address is compared whole). */
#ifndef XLAP_CAPTURE_RX_SLOTS_H
#define XLAP_CAPTURE_RX_SLOTS_H

#include "common.h"

#define RX_SLOT_STALE_NS 1000000000ULL
/* Longer than an skb takes from netif_receive_skb to its socket (the same
 * softirq, microseconds; past it, the socket point reads the headers
 * itself). */
#define RX_DEVICE_FRESH_NS 2000000ULL

enum {
  RX_AT_DEVICE = 1, /* noted by a device point */
  RX_QUEUED = 2,    /* handed to its socket, not yet read */
};

struct xl_rx_slot {
  __u64 key;          /* struct sk_buff *, 0 when free */
  __u64 born;         /* when noted or queued */
  struct xl_ident id; /* datagram 0; pid: the port's (then socket's) owner */
  __u64 ip8;          /* bytes 4..11 of its IP header (RX_AT_DEVICE) */
  __u32 nseg;         /* datagrams (a GRO skb: several, in RX_SEGS) */
  __u32 skb_len;      /* skb->len from the IP header (RX_AT_DEVICE) */
  __u32 addr_sig;     /* flows.h signature of its addresses */
  __u64 owner;        /* RX_QUEUED: the traced socket's note (xlap_sock) */
  __u8 state;         /* RX_AT_DEVICE, RX_QUEUED */
  __u8 unsampled;     /* one datagram outside the run's sample */
  /* RX_AT_DEVICE by an entry point (netif_rx, GRO), one datagram whose
   * identity lies in `head`: netif_receive_skb may take the note when the
   * skb there has the same 64 first bytes (rx_head_matches). */
  __u8 reusable;
  __u8 _pad;
  __u64 head[8]; /* the skb's first 64 bytes from its IP header */
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

/* Whether slot `s`, which holds skb `old`, may be taken by another skb at
 * `now`. */
static __always_inline int rx_slot_free(const struct xl_rx_slot *s, __u64 old,
                                        __u64 now) {
  if (!old)
    return 1;
  __u64 age = now - s->born;
  return age >= RX_SLOT_STALE_NS ||
         (s->state == RX_AT_DEVICE && age >= RX_DEVICE_FRESH_NS);
}

/* Whether slot `s` holds the queued note of an earlier skb at address
 * `key` that its socket's next read is yet to take. A point meeting a new
 * skb at that address means the queued one was freed: its reader copied
 * and freed it, and the read's return (calls.h), which takes the note, is
 * yet to run; an allocation on another CPU (or on this one, the reader
 * preempted) got the address in between. Overwritten, that read would
 * find the newer skb's note (another datagram's identity) or none: it
 * keeps its note, and the newer skb goes without (its later points read
 * the headers themselves; its read is told from the reader's buffer or
 * counted lost). A queued note no read will take (its read was told
 * otherwise) is not held: the socket's next read takes `key` only when the
 * last read left it at the head (rx_next), or left the queue empty and it
 * came first (rx_first); both are read from the socket's note, which
 * lives as long as its socket (a closed one's reads as anything). */
static __always_inline int rx_queued_read_pending(const struct xl_rx_slot *s,
                                                  __u64 key, __u64 now) {
  if (s->key != key || s->state != RX_QUEUED ||
      now - s->born >= RX_SLOT_STALE_NS || !s->owner)
    return 0;
  const struct xlap_sock *o = (const struct xlap_sock *)s->owner;
  __u64 next = 0;
  if (bpf_probe_read_kernel(&next, sizeof(next), &o->rx_next))
    return 0;
  if (next)
    return next == key;
  __u64 first = 0;
  return !bpf_probe_read_kernel(&first, sizeof(first), &o->rx_first) &&
         first == key;
}

/* Claims slot `s` for skb `key` (`got` datagrams) at `now`, and keeps
 * datagrams 1.. of a GRO skb in RX_SEGS. Returns 0, or -1 when the slot is
 * held by a live skb, or by the pending read of a freed one at `key`. */
static __always_inline int rx_claim(struct xl_rx_slot *s, __u64 key, __u64 now,
                                    const struct xl_segs *segs, __u32 got) {
  __u64 old = s->key;
  if ((old != key && !rx_slot_free(s, old, now)) ||
      rx_queued_read_pending(s, key, now))
    return -1;
  if (__sync_val_compare_and_swap(&s->key, old, key) != old)
    return -1;
  if (old && (old != key || (s->nseg > 1 && got <= 1)))
    bpf_map_delete_elem(&RX_SEGS, &old); /* a stale GRO skb's datagrams */
  s->born = now;
  s->nseg = 1;
  if (got > 1 && segs &&
      bpf_map_update_elem(&RX_SEGS, &key, segs, BPF_ANY) == 0)
    s->nseg = got;
  return 0;
}

/* Datagrams 1.. of the slot of skb `key` (`*n` of them in all), or 0 for
 * one datagram; when they are gone, they are counted lost at `point` and
 * `*n` becomes 1. */
static __always_inline struct xl_segs *rx_segs(__u64 key, __u32 *n,
                                               __u16 point) {
  if (*n <= 1)
    return 0;
  struct xl_segs *segs = bpf_map_lookup_elem(&RX_SEGS, &key);
  if (!segs) {
    count_losses(point, XLAP_LOSS_MAP_FULL, *n - 1);
    *n = 1;
  }
  return segs;
}

/* Notes the identity of the datagrams of skb `key` as queued to its socket
 * (`got` of them, 1..n; datagrams 1.. in `segs`). Returns 0, or -1 when
 * its slot is held by a live skb or a pending read (rx_claim: the reader's
 * stamp is then told from its buffer or counted lost). A function of its own (a
 * static BPF subprogram): inlined, it grew the socket-queue program's frame
 * past the combined stack limit. */
static __attribute__((noinline)) int rx_put(__u64 key, __u64 now,
                                            const struct xl_ident *id,
                                            const struct xl_segs *segs,
                                            __u32 got) {
  struct xl_rx_slot *s = rx_slot(key);
  if (!s || rx_claim(s, key, now, segs, got))
    return -1;
  s->id = *id;
  s->state = RX_QUEUED;
  s->unsampled = 0;
  return 0;
}

/* What a device point read of an skb, for the points after it. */
struct xl_rx_note {
  __u64 now;
  __u64 ip8;
  __u32 skb_len;
  __u32 addr_sig;
  __u8 unsampled;
  __u8 reusable; /* see xl_rx_slot; head then holds the 64 bytes */
  const __u64 *head;
};

/* Notes the identity of skb `key` at its last device point (RX_AT_DEVICE):
 * as rx_put, for the socket-queue point. Returns 0, or -1 when the slot is
 * held by a live skb (the socket point then reads the headers itself). */
static __attribute__((noinline)) int
rx_note_at_device(__u64 key, const struct xl_rx_note *n,
                  const struct xl_ident *id, const struct xl_segs *segs,
                  __u32 got) {
  struct xl_rx_slot *s = rx_slot(key);
  if (!s || !n || rx_claim(s, key, n->now, segs, got))
    return -1;
  s->id = *id;
  s->ip8 = n->ip8;
  s->skb_len = n->skb_len;
  s->addr_sig = n->addr_sig;
  s->unsampled = n->unsampled;
  s->reusable = 0;
  if (n->reusable && n->head) {
#pragma unroll
    for (int i = 0; i < 8; i++)
      s->head[i] = n->head[i];
    s->reusable = 1;
  }
  s->state = RX_AT_DEVICE;
  return 0;
}

/* Whether the 64 bytes `c` (an skb's first bytes from its IP header) are
 * those its note `s` keeps. */
static __always_inline int rx_head_matches(const struct xl_rx_slot *s,
                                           const __u64 *c) {
  __u64 diff = 0;
#pragma unroll
  for (int i = 0; i < 8; i++)
    diff |= c[i] ^ s->head[i];
  return diff == 0;
}

/* The device note of skb `key` if it is fresh at `now` and its skb is
 * still `skb_len` bytes long from the IP header. */
static __always_inline struct xl_rx_slot *rx_device_note(__u64 key, __u64 now,
                                                         __u32 skb_len) {
  struct xl_rx_slot *s = rx_slot(key);
  if (!s || s->key != key || s->state != RX_AT_DEVICE ||
      s->skb_len != skb_len || now - s->born >= RX_DEVICE_FRESH_NS)
    return 0;
  return s;
}

/* Forgets a device note held for skb `key`: the skb now at that address is
 * not a datagram the device point noted (the note is an earlier skb's). */
static __always_inline void rx_forget_at_device(__u64 key) {
  struct xl_rx_slot *s = rx_slot(key);
  if (s && s->key == key && s->state == RX_AT_DEVICE)
    __sync_val_compare_and_swap(&s->key, key, 0);
}

/* The slot of skb `key`, if the socket-queue point queued it. */
static __always_inline struct xl_rx_slot *rx_find(__u64 key) {
  struct xl_rx_slot *s = rx_slot(key);
  return s && s->key == key && s->state == RX_QUEUED ? s : 0;
}

/* The slot of skb `key`, if the socket-queue point queued it to the socket
 * whose note is `owner`: a read never takes another socket's datagram (an
 * skb's address is reused once it is freed, and sockets of one port carry
 * datagrams of one seq at once). */
static __always_inline struct xl_rx_slot *rx_find_of(__u64 key,
                                                     const void *owner) {
  struct xl_rx_slot *s = rx_find(key);
  return s && s->owner == (__u64)owner ? s : 0;
}

/* Names the socket skb `key`'s queued slot belongs to (after rx_put, whose
 * five arguments are BPF's most). */
static __always_inline void rx_own(__u64 key, const void *owner) {
  struct xl_rx_slot *s = rx_find(key);
  if (s)
    s->owner = (__u64)owner;
}

/* Frees slot `s` of skb `key` (its RX_SEGS entry stays: the reader's stamp
 * takes it). */
static __always_inline void rx_free(struct xl_rx_slot *s, __u64 key) {
  __sync_val_compare_and_swap(&s->key, key, 0);
}

#endif
